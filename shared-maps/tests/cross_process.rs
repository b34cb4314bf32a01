//! Another process reads a process's maps by its pid, read-only; when the owner dies, its
//! segments are gone and its registry entry is cleaned up.

use shared_maps::{MapSpec, MapType, MapView, Registry};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

#[test]
#[ignore = "helper: the owner process spawned by another_process_reads_maps_by_pid"]
fn owner_process() {
    let dir = std::env::var("NCCLBPF_MAP_OWNER_DIR").expect("run by the parent test");
    let r = Registry::new(dir.into());
    let arr = r
        .shared(
            &MapSpec {
                name: "xproc_arr".into(),
                kind: MapType::Array,
                key_size: 4,
                value_size: 8,
                max_entries: 4,
            },
            "owner",
        )
        .unwrap();
    let h = r
        .shared(
            &MapSpec {
                name: "xproc_hash".into(),
                kind: MapType::Hash,
                key_size: 8,
                value_size: 16,
                max_entries: 16,
            },
            "owner",
        )
        .unwrap();
    for k in 0..4u32 {
        arr.update(&k.to_le_bytes(), &(u64::from(k) * 100).to_le_bytes(), 0)
            .unwrap();
    }
    h.update(&77u64.to_le_bytes(), &[5u8; 16], 0).unwrap();
    println!("ready {}", std::process::id());
    // Stay alive until the parent kills us.
    std::thread::sleep(std::time::Duration::from_secs(60));
}

#[test]
fn another_process_reads_maps_by_pid() {
    let dir = std::env::temp_dir().join(format!("ncclbpf-xproc-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "owner_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("NCCLBPF_MAP_OWNER_DIR", &dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let pid: u32 = loop {
        let l = lines.next().expect("owner exited early").unwrap();
        if let Some(p) = l.split("ready ").nth(1) {
            break p.trim().parse().unwrap();
        }
    };
    let views = MapView::open_all_in(&dir, pid).unwrap();
    assert_eq!(views.len(), 2);
    let arr = views.iter().find(|v| v.name == "xproc_arr").unwrap();
    let vals: Vec<u64> = arr
        .entries()
        .iter()
        .map(|(_, v)| u64::from_le_bytes(v[0].clone().try_into().unwrap()))
        .collect();
    assert_eq!(vals, [0, 100, 200, 300]);
    let h = views.iter().find(|v| v.name == "xproc_hash").unwrap();
    assert_eq!(
        h.entries(),
        vec![(77u64.to_le_bytes().to_vec(), vec![vec![5u8; 16]])]
    );
    // Owner-only registry file.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.join(format!("{pid}.maps")))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    drop(views);
    child.kill().unwrap();
    child.wait().unwrap();
    // The segments died with the owner; the stale registry entry is removed on first look.
    assert!(MapView::open_all_in(&dir, pid).is_err());
    assert!(!dir.join(format!("{pid}.maps")).exists());
    let _ = std::fs::remove_dir_all(&dir);
}
