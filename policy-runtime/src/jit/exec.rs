//! Executable memory for JIT code: mapped writable, filled, then switched to read+execute
//! (never both writable and executable), unmapped on drop.

use std::io;

pub struct ExecBuf {
    ptr: *mut u8,
    len: usize,
    code_len: usize,
}

// SAFETY: the mapping is immutable (read+execute) once built and owned by this value.
unsafe impl Send for ExecBuf {}
// SAFETY: as above; running the code concurrently is allowed (it keeps no state of its own).
unsafe impl Sync for ExecBuf {}

/// The code's signature: r1 and r2 arrive in rdi and rsi.
type Entry = unsafe extern "C" fn(u64, u64) -> u64;

impl ExecBuf {
    pub fn new(code: &[u8]) -> io::Result<ExecBuf> {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let len = code.len().max(1).div_ceil(page) * page;
        // SAFETY: a fresh private anonymous mapping; checked for MAP_FAILED below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = ptr as *mut u8;
        // SAFETY: the mapping is len >= code.len() bytes and writable.
        unsafe { std::ptr::copy_nonoverlapping(code.as_ptr(), ptr, code.len()) };
        // SAFETY: ptr/len describe our mapping.
        if unsafe { libc::mprotect(ptr.cast(), len, libc::PROT_READ | libc::PROT_EXEC) } != 0 {
            let e = io::Error::last_os_error();
            // SAFETY: unmapping what we mapped.
            unsafe { libc::munmap(ptr.cast(), len) };
            return Err(e);
        }
        Ok(ExecBuf {
            ptr,
            len,
            code_len: code.len(),
        })
    }

    pub fn code_len(&self) -> usize {
        self.code_len
    }

    /// Runs the program on `ctx`.
    ///
    /// # Safety
    /// The code must come from the JIT translating a program the verifier accepted for a
    /// context of the size `ctx` points to, with its maps alive.
    #[inline]
    pub unsafe fn call(&self, ctx: *mut u8) -> u64 {
        // SAFETY: per the caller's contract (r2 is 0; verified programs do not read it).
        unsafe { self.call_with(ctx as u64, 0) }
    }

    /// Runs the program with r1 and r2 as given.
    ///
    /// # Safety
    /// As for [`ExecBuf::call`]: the code must only touch memory that is valid for it given
    /// these arguments.
    #[inline]
    pub unsafe fn call_with(&self, r1: u64, r2: u64) -> u64 {
        // SAFETY: the buffer holds a function with the System V signature
        // `u64 (*)(u64, u64)`.
        let f: Entry = unsafe { std::mem::transmute::<*mut u8, Entry>(self.ptr) };
        // SAFETY: per the caller's contract.
        unsafe { f(r1, r2) }
    }
}

impl Drop for ExecBuf {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_is_executable_but_not_writable() {
        let e = ExecBuf::new(&[0xc3]).unwrap();
        let addr = e.ptr as usize;
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let line = maps
            .lines()
            .find(|l| {
                let r: Vec<usize> = l
                    .split_whitespace()
                    .next()
                    .unwrap()
                    .split('-')
                    .map(|x| usize::from_str_radix(x, 16).unwrap())
                    .collect();
                (r[0]..r[1]).contains(&addr)
            })
            .expect("mapping listed");
        let perms = line.split_whitespace().nth(1).unwrap();
        assert_eq!(&perms[..3], "r-x", "{line}");
    }
}
