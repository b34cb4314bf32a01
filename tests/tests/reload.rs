//! NCCL >= 2.28 dlcloses the net library when its last communicator goes and dlopens it again
//! for the next one. The library is linked `-z nodelete` and joins its threads on close, so a
//! close/reopen cycle must keep working.

use ncclbpf_harness::{Net, pattern, plugin_path};
use std::ffi::CString;

#[test]
fn library_survives_dlclose_and_reopen() {
    let elf = std::fs::read(plugin_path()).unwrap();
    // DT_FLAGS_1 with DF_1_NODELETE (0x8) must be present: check with readelf when available.
    if let Ok(out) = std::process::Command::new("readelf")
        .arg("-d")
        .arg(plugin_path())
        .output()
    {
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("NODELETE"),
            "library not linked -z nodelete:\n{text}"
        );
    }
    assert!(!elf.is_empty());
    for round in 0..3 {
        let mut n = Net::ready(Some(11));
        let (s, r) = n.connect_pair(0).unwrap();
        let data = pattern(3 << 20, round);
        assert!(n.transfer(s, r, &data, data.len()).unwrap() == data);
        n.close_send(s).unwrap();
        n.close_recv(r).unwrap();
        n.finalize().unwrap();
        // Drop every reference the harness holds, as NCCL does.
        let path = CString::new(plugin_path().to_string_lossy().as_bytes()).unwrap();
        // SAFETY: RTLD_NOLOAD returns the existing handle (or NULL); each dlclose undoes one
        // dlopen, including the one Net::open made.
        unsafe {
            let h = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
            assert!(!h.is_null());
            libc::dlclose(h);
            libc::dlclose(h);
        }
    }
}
