//! Shared-memory segments: a sealed memfd per map, mapped read/write by its owner and
//! read-only by outside readers through `/proc/<pid>/fd/<n>`.
//!
//! A memfd has no name in any filesystem, so it disappears with its last user: when the owning
//! process is gone, so is the segment. Sealing (`F_SEAL_SHRINK | F_SEAL_GROW`) keeps any other
//! process from truncating it under us, which would turn our loads into SIGBUS.

use memmap2::{Mmap, MmapMut, MmapOptions};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};

/// A segment owned by this process.
pub struct Region {
    file: File,
    map: MmapMut,
}

impl Region {
    /// Creates a zeroed, sealed, owner-only segment of `len` bytes.
    pub fn create(name: &str, len: usize) -> io::Result<Region> {
        let cname = std::ffi::CString::new(format!("ncclbpf:{name}")).map_err(io::Error::other)?;
        // SAFETY: memfd_create with a valid C string; the returned fd is owned by `file`.
        let fd = unsafe {
            libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor we own.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(len as u64)?;
        // SAFETY: fcntl on our own descriptor.
        if unsafe {
            libc::fcntl(
                fd,
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
            )
        } < 0
        {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the file is ours, sealed against resizing, and outlives the mapping.
        let map = unsafe { MmapOptions::new().len(len).map_mut(&file)? };
        Ok(Region { file, map })
    }

    pub fn fd(&self) -> i32 {
        self.file.as_raw_fd()
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn base(&self) -> *mut u8 {
        self.map.as_ptr() as *mut u8
    }
}

/// A read-only mapping of another process's segment.
pub struct ReadOnlyRegion {
    map: Mmap,
}

impl ReadOnlyRegion {
    /// Maps `/proc/<pid>/fd/<fd>` read-only; fails unless it is at least `min_len` bytes.
    pub fn open(pid: u32, fd: i32, min_len: usize) -> io::Result<ReadOnlyRegion> {
        let file = File::open(format!("/proc/{pid}/fd/{fd}"))?;
        let len = file.metadata()?.len() as usize;
        if len < min_len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("segment is {len} bytes, expected {min_len}"),
            ));
        }
        // SAFETY: the segment is sealed against shrinking by its owner, so the mapping stays
        // backed; we only read through it.
        let map = unsafe { MmapOptions::new().len(len).map(&file)? };
        Ok(ReadOnlyRegion { map })
    }

    pub fn bytes(&self) -> &[u8] {
        &self.map
    }
}
