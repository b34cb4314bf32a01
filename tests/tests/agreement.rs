//! The agreement between ranks (issue 9, `docs/agreement.md`), in separate processes as in a
//! real job: four `harness-rank agree` ranks of one communicator, connected in a ring through
//! the plugin, each deciding through the tuner before each ring step. Records travel as control
//! frames on those connections; every rank must make the identical decision at every sequence
//! number, however skewed the ranks are, and never hang.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const RANK_BIN: &str = env!("CARGO_BIN_EXE_harness-rank");

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ncclbpf-agree-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn shipped(rel: &str) -> PathBuf {
    ncclbpf_policies::object(rel).unwrap_or_else(|e| panic!("{e}"))
}

struct Rank {
    policy: PathBuf,
    opts: Vec<String>,
    env: Vec<(String, String)>,
}

fn rank(policy: &str, opts: &[&str]) -> Rank {
    Rank {
        policy: shipped(policy),
        opts: opts.iter().map(|s| s.to_string()).collect(),
        env: vec![],
    }
}

/// Runs the ranks to the end (bounded) and returns each one's output.
fn run(
    dir: &Path,
    ranks: &[Rank],
    calls: usize,
    bytes: usize,
    env: &[(&str, &str)],
) -> Vec<String> {
    let n = ranks.len();
    let kids: Vec<Child> = ranks
        .iter()
        .enumerate()
        .map(|(i, r)| {
            Command::new(RANK_BIN)
                .args([
                    "agree",
                    &i.to_string(),
                    &n.to_string(),
                    dir.to_str().unwrap(),
                ])
                .args([calls.to_string(), bytes.to_string()])
                .args(&r.opts)
                .env("NCCL_BPF_POLICY", &r.policy)
                .env("NCCL_BPF_SHM_DIR", dir)
                .env("NCCL_BPF_CONTROL", "0")
                .envs(env.iter().copied())
                .envs(r.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut outs = Vec::new();
    for mut k in kids {
        loop {
            if k.try_wait().unwrap().is_some() {
                break;
            }
            if Instant::now() > deadline {
                let _ = k.kill();
                panic!("a rank hung");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let o = k.wait_with_output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(o.status.success(), "a rank failed: {text}");
        outs.push(text);
    }
    outs
}

fn decisions(dir: &Path, rank: usize) -> Vec<String> {
    std::fs::read_to_string(dir.join(format!("decisions.{rank}")))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The `decision digest of comm …: seq N, digest D` line of a rank's log.
fn digest_line(log: &str) -> String {
    log.lines()
        .find_map(|l| l.split("decision digest of comm ").nth(1))
        .unwrap_or_else(|| panic!("no digest line: {log}"))
        .to_string()
}

const EPOCH: &str = "32";
const DELAY: &str = "4";

/// The case: one rank decides far ahead of its traffic (64 collectives, as NCCL's
/// enqueue runs ahead of the network), one is slowed by a pause per collective, one sees about
/// 10x the loopback latency on its link; net_autotune explores candidates from agreed data.
#[test]
fn four_skewed_ranks_running_net_autotune_decide_alike_at_every_collective() {
    let dir = scratch("skew");
    let ranks = [
        rank("src/net_autotune.o", &["ahead=64"]),
        rank("src/net_autotune.o", &["slow=400"]),
        rank("src/net_autotune.o", &["lat=300"]),
        rank("src/net_autotune.o", &[]),
    ];
    // 125 epochs: the first agreement at epoch D + D, exploration (D + 3 epochs a candidate,
    // D for one skipped) and a duel of at most 2 * 16 + D epochs where two candidates came
    // close (on this harness they measure alike, so a duel can go the full 16 pairs) before the
    // third choice.
    let calls = 4000;
    let outs = run(
        &dir,
        &ranks,
        calls,
        64 << 10,
        &[
            ("NCCL_BPF_AGREEMENT_EPOCH", EPOCH),
            ("NCCL_BPF_AGREEMENT_DELAY", DELAY),
            ("NCCL_BPF_AGREEMENT_TIMEOUT", "60"),
            // Over the ring connections only, not through the node's relay.
            ("NCCL_BPF_AGREEMENT_LOCAL", "0"),
        ],
    );
    let first = decisions(&dir, 0);
    assert_eq!(first.len(), calls);
    for r in 1..4 {
        let d = decisions(&dir, r);
        if let Some(i) = (0..calls).find(|&i| d.get(i) != first.get(i)) {
            panic!(
                "rank {r} differs from rank 0 at call {}: {:?} vs {:?}",
                i + 1,
                d.get(i),
                first.get(i)
            );
        }
    }
    for o in &outs {
        // Epoch 0 fixes each rank's members; opinions start with the first epoch whose records
        // all name them, epoch D = 4, applied at seq (4 + 4) * 32 + 1.
        assert!(
            o.contains("first agreement (epoch 4, 4 ranks alike) at seq 257"),
            "{o}"
        );
        assert_eq!(digest_line(o), digest_line(&outs[0]));
    }
    // No opinion before the first agreement; then the policy explores: several distinct
    // choices, from collective 257 on only.
    let choice = |l: &String| l.split_once(' ').unwrap().1.to_string();
    let before: std::collections::BTreeSet<String> = first[..256].iter().map(choice).collect();
    let after: std::collections::BTreeSet<String> = first[256..].iter().map(choice).collect();
    assert_eq!(
        before.len(),
        1,
        "no opinion before the first agreement: {before:?}"
    );
    assert!(after.len() >= 3, "net_autotune explored: {after:?}");
    let summary = outs[0]
        .lines()
        .find(|l| l.contains("agreement of comm"))
        .unwrap_or_else(|| panic!("no agreement summary: {}", outs[0]));
    assert!(summary.contains("deciding from epoch"), "{summary}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Ranks that loaded different policies: the first agreement finds it, names both sides, and
/// every rank stays without opinion from the same collective on.
#[test]
fn ranks_with_different_policies_all_drop_their_opinion_at_the_same_collective() {
    let dir = scratch("config");
    let ranks = [
        rank("src/net_autotune.o", &[]),
        rank("src/slo_enforcer.o", &[]),
    ];
    let calls = 600;
    let outs = run(
        &dir,
        &ranks,
        calls,
        4096,
        &[
            ("NCCL_BPF_AGREEMENT_EPOCH", EPOCH),
            ("NCCL_BPF_AGREEMENT_DELAY", DELAY),
        ],
    );
    for o in &outs {
        assert!(o.contains("epoch 0: configuration"), "{o}");
        assert!(o.contains("differs"), "{o}");
        assert!(
            o.contains("the tuner has no opinion from seq 129 on"),
            "{o}"
        );
    }
    assert_eq!(decisions(&dir, 0), decisions(&dir, 1));
    let _ = std::fs::remove_dir_all(dir);
}

/// A rank whose peers never send their records (here: it has none) waits at the first
/// collective that needs them, at most NCCL_BPF_AGREEMENT_TIMEOUT, then fails that collective
/// and every later one with an NCCL error and a line naming what it heard, instead of guessing.
#[test]
fn a_rank_that_never_hears_from_the_others_fails_its_collective_after_the_timeout() {
    let dir = scratch("alone");
    let ranks = [rank("src/net_autotune.o", &["alone=1", "nranks=2"])];
    let started = Instant::now();
    let outs = run(
        &dir,
        &ranks,
        400,
        4096,
        &[
            ("NCCL_BPF_AGREEMENT_EPOCH", EPOCH),
            ("NCCL_BPF_AGREEMENT_DELAY", DELAY),
            ("NCCL_BPF_AGREEMENT_TIMEOUT", "2"),
        ],
    );
    let took = started.elapsed();
    let o = &outs[0];
    // Epoch 0's records are needed at seq (0 + 4) * 32 + 1.
    assert!(o.contains("failed at call 129: "), "{o}");
    assert!(o.contains("1 of 2 records of epoch 0"), "{o}");
    assert!(
        o.contains("every later collective of the communicator fails"),
        "{o}"
    );
    assert_eq!(
        decisions(&dir, 0).len(),
        128,
        "every call before it decided"
    );
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(60),
        "{took:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Two ranks on one host whose NCCL connections are all P2P/SHM (here: none at all through the
/// plugin) agree through the node-local relay in the registry directory: the first agreement
/// at seq 257 on both, identical decisions.
#[test]
fn ranks_of_one_host_agree_through_the_node_relay_without_net_connections() {
    let dir = scratch("node");
    let ranks = [
        rank("src/net_autotune.o", &["alone=1", "nranks=2", "slow=200"]),
        rank("src/net_autotune.o", &["alone=1", "nranks=2"]),
    ];
    let outs = run(
        &dir,
        &ranks,
        600,
        4096,
        &[
            ("NCCL_BPF_AGREEMENT_EPOCH", EPOCH),
            ("NCCL_BPF_AGREEMENT_DELAY", DELAY),
            ("NCCL_BPF_AGREEMENT_TIMEOUT", "30"),
        ],
    );
    for o in &outs {
        assert!(!o.contains("failed at call"), "{o}");
        assert!(
            o.contains("first agreement (epoch 4, 2 ranks alike) at seq 257"),
            "{o}"
        );
        assert_eq!(digest_line(o), digest_line(&outs[0]));
    }
    assert_eq!(decisions(&dir, 0), decisions(&dir, 1));
    assert_eq!(decisions(&dir, 0).len(), 600);
    let _ = std::fs::remove_dir_all(dir);
}

/// While a rank waits for records, `ncclbpf status` says so from outside: which epoch, for how
/// long, and whose records arrived (here: only its own, the other rank never comes).
#[test]
fn status_shows_a_rank_waiting_for_the_others_records() {
    let dir = scratch("status");
    // The control socket lives only in a directory no one else may enter.
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let mut child = Command::new(RANK_BIN)
        .args(["agree", "0", "1", dir.to_str().unwrap(), "400", "4096"])
        .args(["alone=1", "nranks=2"])
        .env("NCCL_BPF_POLICY", shipped("src/net_autotune.o"))
        .env("NCCL_BPF_SHM_DIR", &dir)
        .env("NCCL_BPF_AGREEMENT_EPOCH", EPOCH)
        .env("NCCL_BPF_AGREEMENT_DELAY", DELAY)
        .env("NCCL_BPF_AGREEMENT_TIMEOUT", "60")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    let line = loop {
        let out = Command::new(ncclbpf_harness::cli_path())
            .args(["status", &pid])
            .env("NCCL_BPF_SHM_DIR", &dir)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if let Some(l) = text
            .lines()
            .find(|l| l.contains("agreement comm") && l.contains("waiting"))
        {
            break l.to_string();
        }
        assert!(Instant::now() < deadline, "no waiting line: {text}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        line.contains("agreement comm 0x000000000000a9ee: waiting"),
        "{line}"
    );
    assert!(
        line.contains("for epoch 0: 1 of 2 records (from "),
        "{line}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
