//! Shared-memory segments: a sealed memfd per map, mapped read/write by its owner and
//! read-only by outside readers through `/proc/<pid>/fd/<n>`.
//!
//! A memfd has no name in any filesystem, so it disappears with its last user: when the owning
//! process is gone, so is the segment. Sealing (`F_SEAL_SHRINK | F_SEAL_GROW`) keeps any other
//! process from truncating it under us, which would turn our loads into SIGBUS.
//!
//! Once the owner has mapped it, the segment is also sealed against writes by anyone else
//! (`F_SEAL_FUTURE_WRITE`, Linux 5.1): `/proc/<pid>/fd/<n>` lets any process that may read the
//! owner's descriptors (its user, root) open the memfd, and a memfd's mode lets such an opener
//! write. Without the seal a process of the same user that may not trace the job (Yama's
//! `ptrace_scope` 1) could still rewrite what the job's programs were verified against: a config
//! or agreed map that every rank must hold alike, or the hash lock that map updates spin on.
//! With it, `write` and writable shared mappings fail (`EPERM`) for every new opener; the
//! owner's own mapping, made before the seal, keeps writing. A kernel without the seal (EINVAL)
//! leaves the segment writable through `/proc` as before.

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
        let seal = |seals: i32| {
            // SAFETY: fcntl on our own descriptor.
            if unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, seals) } < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(())
            }
        };
        seal(libc::F_SEAL_SHRINK | libc::F_SEAL_GROW)?;
        // SAFETY: the file is ours, sealed against resizing, and outlives the mapping.
        let map = unsafe { MmapOptions::new().len(len).map_mut(&file)? };
        // Our mapping is made: from now on no one else writes (see the module's documentation).
        match seal(libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => seal(libc::F_SEAL_SEAL)?,
            r => r?,
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Another opener of the segment (what `/proc/<pid>/fd/<n>` gives a process of the same
    /// user) can neither write it nor map it writable; the owner still writes.
    #[test]
    fn no_one_else_writes_a_segment() {
        let r = Region::create("sealed", 4096).unwrap();
        let path = format!("/proc/self/fd/{}", r.fd());
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .expect("the memfd opens (the seal is on writes, not opens)");
        let e = f.write(&[1; 8]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM), "write(): {e}");
        // SAFETY: a mapping of a file we opened; it must fail, and is dropped if it does not.
        let m = unsafe { MmapOptions::new().len(4096).map_mut(&f) };
        assert_eq!(
            m.err().and_then(|e| e.raw_os_error()),
            Some(libc::EPERM),
            "a writable shared mapping is refused"
        );
        // SAFETY: the owner's mapping is 4096 bytes long.
        unsafe { r.base().write(7) };
        let ro = ReadOnlyRegion::open(std::process::id(), r.fd(), 4096).unwrap();
        assert_eq!(
            ro.bytes()[0],
            7,
            "the owner's writes go on and readers see them"
        );
    }
}
