//! The wrapper in front of another net plugin (`NCCL_BPF_NET_INNER`), driven as NCCL drives
//! it. The plugin reads its settings once per process, so each case runs in a child process
//! with its own environment.
//!
//! The inner plugin here is another copy of this very library (a file of its own, so the
//! loader maps it apart: nothing shared with the wrapper but the process), which the wrapper
//! makes a plain backend; `inner_ref.rs` drives the reference C plugin, which checks what
//! reaches it.

use ncclbpf_harness::child::in_child;
use ncclbpf_harness::{Net, VERSIONS, log_text, pattern, plugin_path, read_conn_stats};
use serde_json::Value;
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::process::Command;

/// Settings of the tests' own environment that must not reach a child.
const CLEARED: [&str; 6] = [
    "NCCL_BPF_NET_INNER",
    "NCCL_BPF_POLICY",
    "NCCL_BPF_NET_POLICY",
    "NCCL_BPF_TUNER_POLICY",
    "NCCL_BPF_METRICS_ADDR",
    "NCCL_BPF_ENV_FILE",
];

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ncclbpf-interposer-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A copy of the library under test, at a path of its own.
fn copy_of_the_library(tag: &str) -> OsString {
    let p = scratch(tag).join("libnccl-net-copy.so");
    std::fs::copy(plugin_path(), &p).unwrap();
    p.into_os_string()
}

/// `init` fails (NCCL then moves on to its next network) and NCCL's log says why.
fn init_fails_saying(inner: &OsStr, name: &str, body: fn()) {
    in_child(
        name,
        &[
            ("NCCL_BPF_NET_INNER", inner),
            ("NCCL_SOCKET_IFNAME", OsStr::new("lo")),
        ],
        &CLEARED,
        body,
    );
}

fn expect_init_failure(want: &[&str]) {
    for v in VERSIONS {
        let mut n = Net::open(Some(v)).unwrap();
        assert!(n.init(1).is_err(), "v{v}: init must fail");
    }
    let log = log_text();
    for w in want {
        assert!(log.contains(w), "the log lacks {w:?}:\n{log}");
    }
}

#[test]
fn a_missing_inner_plugin_fails_init_with_every_name_tried() {
    init_fails_saying(
        OsStr::new("surely-absent"),
        "a_missing_inner_plugin_fails_init_with_every_name_tried",
        || {
            expect_init_failure(&[
                "NCCL_BPF_NET_INNER: no library could be opened",
                "libnccl-net-surely-absent.so:",
                "surely-absent:",
            ])
        },
    );
}

#[test]
fn a_library_that_is_not_a_net_plugin_is_refused() {
    init_fails_saying(
        OsStr::new("libc.so.6"),
        "a_library_that_is_not_a_net_plugin_is_refused",
        || expect_init_failure(&["libc.so.6 is not an NCCL net plugin"]),
    );
}

#[test]
fn the_wrapper_never_wraps_itself() {
    let me = plugin_path().into_os_string();
    init_fails_saying(&me, "the_wrapper_never_wraps_itself", || {
        expect_init_failure(&["names this library itself"])
    });
}

/// Every exported version, over a copy of the library as the inner plugin: data intact, and
/// the wrapper's `net/*` programs (`net_stats`) count every byte once, on the wrapper's own
/// connection records: the copy, a plain backend, counts nothing.
#[test]
fn over_another_copy_every_version_moves_data_and_the_wrapper_counts_it() {
    let inner = copy_of_the_library("count");
    let policy = ncclbpf_harness::shipped_policy("net_stats").expect("policies built");
    let shm = scratch("count-shm");
    let out = in_child(
        "over_another_copy_every_version_moves_data_and_the_wrapper_counts_it",
        &[
            ("NCCL_BPF_NET_INNER", &inner),
            ("NCCL_BPF_POLICY", policy.as_os_str()),
            ("NCCL_BPF_SHM_DIR", shm.as_os_str()),
            ("NCCL_SOCKET_IFNAME", OsStr::new("lo")),
        ],
        &CLEARED,
        || {
            let sizes = [0usize, 1, 4095, 65_536, 1 << 20, (3 << 20) + 7];
            let mut sent = 0u64;
            // Connections stay open until the counts are read: net_stats drops a
            // connection's record when it closes.
            let mut open = Vec::new();
            for v in VERSIONS {
                let n = Net::ready(Some(v));
                let (s, r) = n.connect_pair(0).unwrap();
                for (k, &len) in sizes.iter().enumerate() {
                    let data = pattern(len, (v as u64) << 8 | k as u64);
                    let got = n.transfer(s, r, &data, len + 64).unwrap();
                    assert!(got == data, "v{v}: {len} bytes arrived changed");
                    sent += len as u64;
                }
                open.push((n, s, r));
            }
            let log = log_text();
            assert!(
                log.contains("traffic carried by inner net plugin 'BPF' (ncclNetPlugin_v12")
                    && log.contains("another copy of ncclbpf as a plain backend"),
                "{log}"
            );
            // net_stats' own per-connection map: one record per connection end of the
            // wrapper, every byte counted once in each direction.
            let stats = read_conn_stats(std::process::id()).unwrap();
            let per_version = VERSIONS.len() as u64;
            let sends: u64 = stats.iter().map(|s| s.sends).sum();
            let recvs: u64 = stats.iter().map(|s| s.recvs).sum();
            assert_eq!(sends, per_version * sizes.len() as u64, "{stats:?}");
            assert_eq!(recvs, sends, "{stats:?}");
            assert_eq!(stats.iter().map(|s| s.send_bytes).sum::<u64>(), sent);
            assert_eq!(stats.iter().map(|s| s.recv_bytes).sum::<u64>(), sent);
            for (n, s, r) in open {
                n.close_send(s).unwrap();
                n.close_recv(r).unwrap();
            }
            println!("SENT {sent}");
        },
    );
    // The connection table as `ncclbpf status` reads it is checked in
    // `status_shows_the_wrapper_s_connections_over_an_inner_plugin`.
    if let Some(text) = out {
        assert!(text.contains("SENT "), "{text}");
    }
}

/// `ncclbpf status` reads the wrapper's connection table while traffic goes over an inner
/// plugin: exactly the wrapper's two connection ends (the copy registered none), with the
/// bytes and messages that moved.
#[test]
fn status_shows_the_wrapper_s_connections_over_an_inner_plugin() {
    let inner = copy_of_the_library("status");
    let shm = scratch("status-shm");
    in_child(
        "status_shows_the_wrapper_s_connections_over_an_inner_plugin",
        &[
            ("NCCL_BPF_NET_INNER", &inner),
            ("NCCL_BPF_SHM_DIR", shm.as_os_str()),
            ("NCCL_SOCKET_IFNAME", OsStr::new("lo")),
        ],
        &CLEARED,
        || {
            let n = Net::ready(Some(11));
            let (s, r) = n.connect_pair(0).unwrap();
            let sizes = [10usize, 70_000, 1 << 20];
            for (k, &len) in sizes.iter().enumerate() {
                let data = pattern(len, k as u64);
                assert!(n.transfer(s, r, &data, len).unwrap() == data);
            }
            let out = Command::new(ncclbpf_harness::cli_path())
                .args(["status", "--json", &std::process::id().to_string()])
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
            let conns = v["processes"][0]["connections"]
                .as_array()
                .unwrap_or_else(|| panic!("no connections: {text}"))
                .clone();
            assert_eq!(conns.len(), 2, "the wrapper's two ends only: {text}");
            let total: u64 = sizes.iter().map(|&s| s as u64).sum();
            for c in &conns {
                assert_eq!(c["bytes"], total, "{c}");
                assert_eq!(c["messages"], sizes.len() as u64, "{c}");
                assert_eq!(c["pending"], 0, "{c}");
                assert_eq!(c["comm_id"], "0x0000000000001234", "{c}");
            }
            let dirs: Vec<&str> = conns
                .iter()
                .map(|c| c["direction"].as_str().unwrap())
                .collect();
            assert!(dirs.contains(&"send") && dirs.contains(&"recv"), "{text}");
            n.close_send(s).unwrap();
            n.close_recv(r).unwrap();
        },
    );
}
