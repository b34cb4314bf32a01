//! The graveyard: every value string `getEnv` ever returned, kept for the process's life.
//!
//! NCCL only needs an address to stay valid until its next `getEnv` of the same name, but
//! with several threads asking, "the next call" of one thread can free what another is still
//! reading. So no returned string is ever freed: a value read from the environment is copied
//! once per distinct `(name, value)` and the same address is returned while the value stays
//! the same (also when it comes back after a change). Memory grows only with the number of
//! distinct values the environment has shown for a name.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::sync::Mutex;

pub struct Interner {
    /// name -> every distinct value returned for it.
    values: Mutex<BTreeMap<Box<[u8]>, Vec<&'static CStr>>>,
}

impl Interner {
    pub const fn new() -> Interner {
        Interner {
            values: Mutex::new(BTreeMap::new()),
        }
    }

    /// The kept copy of `value` for `name`, made on first sight. `None` only if `value` holds
    /// a NUL byte (an environment value cannot).
    pub fn intern(&self, name: &[u8], value: &[u8]) -> Option<&'static CStr> {
        let mut map = self.values.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(kept) = map.get(name)
            && let Some(v) = kept.iter().find(|v| v.to_bytes() == value)
        {
            return Some(v);
        }
        let fresh: &'static CStr = Box::leak(CString::new(value).ok()?.into_boxed_c_str());
        map.entry(name.into()).or_default().push(fresh);
        Some(fresh)
    }

    /// How many strings are kept, over all names.
    pub fn kept(&self) -> usize {
        let map = self.values.lock().unwrap_or_else(|e| e.into_inner());
        map.values().map(Vec::len).sum()
    }
}

impl Default for Interner {
    fn default() -> Interner {
        Interner::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_value_same_address_changed_value_keeps_the_old() {
        let i = Interner::new();
        let a = i.intern(b"N", b"one").unwrap();
        assert_eq!(a.to_bytes(), b"one");
        assert_eq!(i.intern(b"N", b"one").unwrap().as_ptr(), a.as_ptr());
        let b = i.intern(b"N", b"two").unwrap();
        assert_ne!(a.as_ptr(), b.as_ptr());
        // The first string is still there, unchanged.
        assert_eq!(a.to_bytes(), b"one");
        // A value coming back reuses its first copy: toggling does not grow memory.
        assert_eq!(i.intern(b"N", b"one").unwrap().as_ptr(), a.as_ptr());
        assert_eq!(i.kept(), 2);
        // Same value under another name: its own copy.
        let c = i.intern(b"M", b"one").unwrap();
        assert_ne!(c.as_ptr(), a.as_ptr());
        assert_eq!(i.kept(), 3);
        assert_eq!(i.intern(b"N", b""), i.intern(b"N", b""));
        assert_eq!(i.intern(b"N", b"a\0b"), None);
    }
}
