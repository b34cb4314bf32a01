//! Buffers NCCL lends the plugin for the life of one request.
//!
//! NCCL owns the memory behind `isend`/`irecv` and guarantees it stays valid until `test`
//! reports the request done. A [`Buf`] carries such a pointer to the control-stream progress
//! code and to the helper threads; the request cannot complete (so NCCL cannot reuse the
//! memory) until every piece has been written or read.

use std::ptr::NonNull;

#[derive(Clone, Copy, Debug)]
pub struct Buf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a Buf is a borrowed view of host memory that NCCL keeps alive and does not touch
// until the request completes; disjoint pieces of it are handed to one thread each.
unsafe impl Send for Buf {}
// SAFETY: as above; shared references never create overlapping mutable slices.
unsafe impl Sync for Buf {}

impl Buf {
    pub const EMPTY: Buf = Buf {
        ptr: NonNull::dangling(),
        len: 0,
    };

    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes until the request that owns
    /// this buffer completes, and nothing else may access it meanwhile.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> Buf {
        match NonNull::new(ptr) {
            Some(ptr) if len > 0 => Buf { ptr, len },
            _ => Buf::EMPTY,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The piece `[off, off + len)`; panics if it is out of range (a bug, caught at the ABI).
    pub fn sub(&self, off: usize, len: usize) -> Buf {
        assert!(
            off.checked_add(len).is_some_and(|end| end <= self.len),
            "piece out of range"
        );
        if len == 0 {
            return Buf::EMPTY;
        }
        Buf {
            // SAFETY: off + len <= self.len, so the result stays inside the lent buffer.
            ptr: unsafe { NonNull::new_unchecked(self.ptr.as_ptr().add(off)) },
            len,
        }
    }

    /// # Safety
    /// No mutable view of these bytes may be alive while the result is used.
    pub unsafe fn bytes<'a>(self) -> &'a [u8] {
        // SAFETY: valid for len bytes per `Buf::new`'s contract.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// # Safety
    /// No other view of these bytes may be alive.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes_mut<'a>(self) -> &'a mut [u8] {
        // SAFETY: valid and exclusive for len bytes per the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}
