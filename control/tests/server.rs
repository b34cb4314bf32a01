//! The server loop with a stand-in handler: socket and directory modes, stale sockets, bad
//! requests, and a panicking handler that must not stop the thread.

use ncclbpf_control::server::{self, Handler, Peer};
use ncclbpf_control::{Item, Reply, Request, request_at, socket_path_in};
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

struct Stub {
    logs: Mutex<Vec<String>>,
}

impl Handler for Stub {
    fn handle(&self, req: &Request, peer: Peer) -> Reply {
        match req {
            Request::Status => Reply::ok(vec![Item::Process {
                pid: peer.pid as u32,
                generation: 1,
                live_programs: 0,
            }]),
            Request::Reload(p) if p.ends_with("panic.o") => panic!("stub panics on {p:?}"),
            Request::Reload(p) | Request::Stage { path: p, .. } => {
                Reply::error(vec![], format!("cannot read {}", p.display()))
            }
            Request::Unstage => Reply::ok(vec![]),
            Request::StageConfig { map, .. } => {
                Reply::error(vec![], format!("no config map '{map}'"))
            }
        }
    }
    fn log(&self, _warn: bool, msg: &str) {
        self.logs.lock().unwrap().push(msg.to_string());
    }
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ncclbpf-ctl-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

const T: Duration = Duration::from_secs(10);

#[test]
fn serves_requests_and_survives_panics() {
    let dir = scratch("serve");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    // A stale socket of a pid that cannot exist is removed at start.
    let stale = socket_path_in(&dir, 999_999_999);
    std::fs::write(&stale, "").unwrap();
    let stub = Arc::new(Stub {
        logs: Mutex::new(vec![]),
    });
    let path = server::start_in(&dir, stub.clone()).unwrap();
    assert_eq!(path, socket_path_in(&dir, std::process::id()));
    assert!(!stale.exists(), "stale socket left");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "socket mode {mode:o}");

    let r = request_at(&path, &Request::Status, T).unwrap();
    assert_eq!(r.result, Ok(()));
    assert!(
        matches!(r.items[..], [Item::Process { pid, .. }] if pid == std::process::id()),
        "{r:?}"
    );
    // A panicking request is answered and logged; the thread keeps serving.
    let r = request_at(&path, &Request::Reload("/x/panic.o".into()), T).unwrap();
    let e = r.result.unwrap_err();
    assert!(e.contains("internal error: stub panics"), "{e}");
    assert!(
        stub.logs
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("still serving")),
        "{:?}",
        stub.logs.lock().unwrap()
    );
    let r = request_at(&path, &Request::Reload("/x/y.o".into()), T).unwrap();
    assert_eq!(r.result, Err("cannot read /x/y.o".into()));
    // Garbage and oversized requests get an error line, not a hang.
    for junk in [b"frobnicate\n".to_vec(), vec![b'a'; 10_000]] {
        let mut s = UnixStream::connect(&path).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        let _ = s.write_all(&junk);
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("error: "), "{out}");
    }
    // Still alive after all that.
    assert_eq!(
        request_at(&path, &Request::Status, T).unwrap().result,
        Ok(())
    );
}

#[test]
fn refuses_a_directory_others_can_reach() {
    let dir = scratch("loose");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let stub = Arc::new(Stub {
        logs: Mutex::new(vec![]),
    });
    let e = server::start_in(&dir, stub).unwrap_err();
    assert!(e.contains("is mode 755") && e.contains("chmod 700"), "{e}");
    assert!(!socket_path_in(&dir, std::process::id()).exists());
}

#[test]
fn live_processes_skip_and_remove_dead_ones() {
    let dir = scratch("live");
    std::fs::create_dir_all(&dir).unwrap();
    let me = std::process::id();
    std::fs::write(socket_path_in(&dir, me), "").unwrap();
    std::fs::write(socket_path_in(&dir, 999_999_998), "").unwrap();
    std::fs::write(dir.join("notes.txt"), "").unwrap();
    assert_eq!(ncclbpf_control::live_processes_in(&dir).unwrap(), [me]);
    assert!(!socket_path_in(&dir, 999_999_998).exists());
    let e = ncclbpf_control::request_in(&dir, 999_999_997, &Request::Status, T).unwrap_err();
    assert!(e.to_string().contains("does not exist"), "{e}");
}
