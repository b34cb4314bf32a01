//! The host's lifecycle across plugin types: the metrics endpoint runs while any of the net
//! plugin, the tuner and the profiler holds the host, and stops at the last release, whichever
//! part that is; a release without a hold changes nothing; a later hold starts it again.

use std::net::TcpStream;
use std::path::{Path, PathBuf};

use ncclbpf_host::{Part, acquire, life, release};

fn port_file(dir: &Path) -> PathBuf {
    dir.join(format!("{}.metrics", std::process::id()))
}

fn serving(dir: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(port_file(dir)) else {
        return false;
    };
    TcpStream::connect(text.trim()).is_ok()
}

#[test]
fn the_endpoint_runs_while_any_part_holds_the_host() {
    let dir = std::env::temp_dir().join(format!("ncclbpf-host-life-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // SAFETY: the only test of this binary, set before the host (or any thread of ours) reads
    // the environment.
    unsafe {
        std::env::set_var("NCCL_BPF_SHM_DIR", &dir);
        std::env::set_var("NCCL_BPF_METRICS_ADDR", "127.0.0.1:0");
        std::env::set_var("NCCL_BPF_CONTROL", "0");
        std::env::remove_var("LOCAL_RANK");
    }
    assert!(!serving(&dir));
    acquire(Part::Tuner);
    assert!(serving(&dir), "the first hold starts the endpoint");
    acquire(Part::Profiler);
    acquire(Part::Profiler);
    release(Part::Tuner);
    assert_eq!(life::held(), [0, 0, 2]);
    assert!(serving(&dir), "the profiler still holds it");
    release(Part::Net);
    assert_eq!(
        life::held(),
        [0, 0, 2],
        "a release without a hold is ignored"
    );
    release(Part::Profiler);
    assert!(serving(&dir));
    release(Part::Profiler);
    assert!(!serving(&dir), "the last release stops it");
    assert!(!port_file(&dir).exists(), "and removes its port file");
    acquire(Part::Net);
    assert!(serving(&dir), "a later hold starts it again");
    release(Part::Net);
    assert!(!serving(&dir));
    let _ = std::fs::remove_dir_all(&dir);
}
