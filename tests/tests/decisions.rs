//! Proof from outside: processes that drive the library's tuner through `ncclTunerPlugin_v5`,
//! as NCCL's ranks would (`harness-rank decide`), publish their decisions' sequence numbers and
//! digests, and `ncclbpf decisions --compare PID...` says whether the ranks of each
//! communicator decided alike, and if not, from which checkpoint they differ.
//!
//! The `ncclbpf` command is the workspace's release (or debug) build next to this test's
//! directory (`cargo test --workspace` builds it), or `$NCCLBPF_CLI`.

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

const RANK_BIN: &str = env!("CARGO_BIN_EXE_harness-rank");

fn cli() -> PathBuf {
    ncclbpf_harness::cli_path()
}

fn size_aware() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/policies/src/size_aware.o");
    assert!(p.exists(), "{} missing: run policies/build.sh", p.display());
    p
}

/// A registry directory of this test's own, so the command sees only these processes.
fn shm() -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "ncclbpf-decisions-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// One `harness-rank decide` process, stopped after its calls (its maps stay readable).
struct Rank {
    child: Child,
    out: BufReader<ChildStdout>,
    pid: u32,
}

impl Rank {
    /// `calls` collectives on a context per comm id of `comms` (comma-separated), with
    /// `change` (`<at>:<bytes>`: call `at` of another size); size_aware as the tuner policy
    /// unless `policy` is false.
    fn start(
        shm: &Path,
        calls: usize,
        comms: &str,
        change: Option<&str>,
        env: &[(&str, &str)],
    ) -> Rank {
        Rank::start_with(shm, calls, comms, change, true, env)
    }

    fn start_with(
        shm: &Path,
        calls: usize,
        comms: &str,
        change: Option<&str>,
        policy: bool,
        env: &[(&str, &str)],
    ) -> Rank {
        let mut cmd = Command::new(RANK_BIN);
        cmd.args(["decide", &calls.to_string(), comms])
            .args(change)
            .env("NCCL_BPF_SHM_DIR", shm)
            .env_remove("NCCL_BPF_POLICY")
            .env_remove("NCCL_BPF_TUNER_POLICY")
            .env_remove("NCCL_DEBUG")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        if policy {
            cmd.env("NCCL_BPF_TUNER_POLICY", size_aware());
        }
        let mut child = cmd.spawn().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert!(line.starts_with("ready pid="), "{line:?}");
        let pid = child.id();
        Rank { child, out, pid }
    }

    /// Lets it finalize; its log.
    fn finish(mut self) -> String {
        self.child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        let mut log = String::new();
        self.out.read_to_string(&mut log).unwrap();
        assert!(self.child.wait().unwrap().success(), "{log}");
        log
    }
}

/// `ncclbpf decisions --compare PIDS` (with `--json` if asked): status, stdout, stderr.
fn compare(shm: &Path, pids: &[u32], json: bool) -> (i32, String, String) {
    let mut cmd = Command::new(cli());
    cmd.args(["decisions", "--compare"])
        .args(pids.iter().map(u32::to_string))
        .env("NCCL_BPF_SHM_DIR", shm);
    if json {
        cmd.arg("--json");
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn compare_json(shm: &Path, pids: &[u32]) -> (i32, Value) {
    let (code, out, err) = compare(shm, pids, true);
    let v = serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}{err}"));
    (code, v)
}

/// The finalize lines of one context's log: the summary's call counts added up, and the
/// digest line's `seq` and digest, per comm id, in finalize order.
fn finalize_lines(log: &str) -> Vec<(u64, u64, u64, String)> {
    let mut out = vec![];
    let lines: Vec<&str> = log.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        let Some((_, rest)) = l.split_once("TUNER/BPF comm ") else {
            continue;
        };
        let (comm, counts) = rest.split_once(": ").unwrap();
        let calls: u64 = counts
            .split(", ")
            .map(|p| p.rsplit(": ").next().unwrap().parse::<u64>().unwrap())
            .sum();
        let next = lines[i + 1];
        let (_, d) = next
            .split_once("TUNER/BPF decision digest of comm ")
            .unwrap_or_else(|| panic!("no digest line after the summary:\n{log}"));
        let (dcomm, rest) = d.split_once(": seq ").unwrap();
        assert_eq!(dcomm, comm);
        let (seq, digest) = rest.split_once(", digest ").unwrap();
        out.push((
            u64::from_str_radix(comm.trim_start_matches("0x"), 16).unwrap(),
            calls,
            seq.parse().unwrap(),
            digest.to_string(),
        ));
    }
    out
}

/// Several ranks of one communicator, sampled at different moments (2000 and 2300 calls
/// made), one of them a process holding two ranks: they agree at their highest common
/// checkpoint, 1792; every call is still in the finalize summary, and the digest there is the
/// one the command read.
#[test]
fn ranks_that_decided_alike_agree_from_outside() {
    let dir = shm();
    let a = Rank::start(&dir, 2000, "0xc0ffee", None, &[]);
    let b = Rank::start(&dir, 2300, "0xc0ffee", None, &[]);
    let c = Rank::start(&dir, 2000, "0xc0ffee,0xc0ffee", None, &[]);
    let pids = [a.pid, b.pid, c.pid];
    let (code, out, err) = compare(&dir, &pids, false);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(
            "comm 0x0000000000c0ffee: agree at seq 1792 (checkpoint), 4 contexts in 3 processes"
        ),
        "{out}"
    );
    assert!(
        out.contains(&format!("  pid {}: seq 2300, digest 0x", b.pid)),
        "{out}"
    );
    assert!(out.contains(&format!("  pid {} context ", c.pid)), "{out}");
    assert!(out.contains("1 communicator compared: 1 agree"), "{out}");

    let (code, v) = compare_json(&dir, &pids);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["agree"], true);
    let comm = &v["communicators"][0];
    assert_eq!(comm["comm_id"], "0x0000000000c0ffee");
    assert_eq!(comm["verdict"], "agree");
    assert_eq!(comm["agreed_at"], 1792);
    let contexts = comm["contexts"].as_array().unwrap();
    assert_eq!(contexts.len(), 4);
    let seqs: Vec<u64> = contexts
        .iter()
        .map(|c| c["seq"].as_u64().unwrap())
        .collect();
    let mut sorted = seqs.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, [2000, 2000, 2000, 2300]);
    // The ranks at 2000 stand at the same digest; the checkpoint at 1792 is the same in all.
    let at = |c: &Value, s: u64| {
        c["checkpoints"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["seq"] == s)
            .map(|p| p["digest"].as_str().unwrap().to_string())
    };
    let d1792: Vec<_> = contexts.iter().map(|c| at(c, 1792).unwrap()).collect();
    assert!(d1792.iter().all(|d| *d == d1792[0]), "{d1792:?}");
    let live: Vec<(u32, String)> = contexts
        .iter()
        .map(|c| {
            (
                c["pid"].as_u64().unwrap() as u32,
                c["digest"].as_str().unwrap().to_string(),
            )
        })
        .collect();

    // Finalized: every call counted in the summary, and the same seq and digest logged.
    for (rank, calls, n) in [(a, 2000, 1), (b, 2300, 1), (c, 2000, 2)] {
        let pid = rank.pid;
        let log = rank.finish();
        let lines = finalize_lines(&log);
        assert_eq!(lines.len(), n, "{log}");
        for (comm, counted, seq, digest) in lines {
            assert_eq!(comm, 0xc0ffee);
            assert_eq!((counted, seq), (calls, calls), "{log}");
            assert!(
                live.iter().any(|(p, d)| *p == pid && *d == digest),
                "pid {pid}: {digest} not among {live:?}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// One rank of three saw another size at its 1001st collective: the checkpoints up to 768
/// agree, the one at 1024 is the first that differs, and the command says so (exit 1), naming
/// the communicator, the processes and the odd one out. A communicator only one of them has
/// is listed, not compared.
#[test]
fn a_rank_that_saw_another_size_differs_from_that_checkpoint() {
    let dir = shm();
    let a = Rank::start(&dir, 2000, "0xd1,0xa1", None, &[]);
    let b = Rank::start(&dir, 2000, "0xd1", Some("1000:12345"), &[]);
    let a3 = Rank::start(&dir, 2000, "0xd1", None, &[]);
    let (code, out, err) = compare(&dir, &[a.pid, b.pid, a3.pid], false);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains(
            "comm 0x00000000000000d1: DIFFER from seq 1024 (checkpoint); they agreed at seq 768, \
             3 contexts in 3 processes"
        ),
        "{out}"
    );
    let groups = out
        .lines()
        .find(|l| l.starts_with("  at seq 1024: "))
        .unwrap_or_else(|| panic!("{out}"));
    // "  at seq 1024: 0x… in pid A, pid A3; 0x… in pid B": the two who agree, then the odd one.
    let parts: Vec<&str> = groups.split("; ").collect();
    assert_eq!(parts.len(), 2, "{groups}");
    assert!(
        parts[0].ends_with(&format!(" in pid {}, pid {}", a.pid, a3.pid)),
        "{groups}"
    );
    assert!(
        parts[1].ends_with(&format!(" in pid {}", b.pid)),
        "{groups}"
    );
    assert!(
        out.contains(&format!(
            "comm 0x00000000000000a1: only in pid {} (seq 2000): nothing to compare it with",
            a.pid
        )),
        "{out}"
    );
    let mut pids = [a.pid, b.pid, a3.pid];
    pids.sort_unstable();
    assert!(
        out.contains(&format!(
            "1 communicator compared: 0 agree, 1 differ: 0x00000000000000d1 (pids {}, {}, {}) \
             from seq 1024",
            pids[0], pids[1], pids[2]
        )),
        "{out}"
    );
    let (code, v) = compare_json(&dir, &[a.pid, b.pid]);
    assert_eq!(code, 1);
    assert_eq!(v["agree"], false);
    let comms = v["communicators"].as_array().unwrap();
    let d1 = comms
        .iter()
        .find(|c| c["comm_id"] == "0x00000000000000d1")
        .unwrap();
    assert_eq!(d1["verdict"], "differ");
    assert_eq!(d1["first_difference"]["seq"], 1024);
    assert_eq!(d1["first_difference"]["last_agreement"], 768);
    let ds = d1["first_difference"]["digests"].as_array().unwrap();
    assert_ne!(ds[0]["digest"], ds[1]["digest"]);
    let a1 = comms
        .iter()
        .find(|c| c["comm_id"] == "0x00000000000000a1")
        .unwrap();
    assert_eq!(a1["verdict"], "alone");
    // The same change past the last checkpoint: found at the current seq both stand at.
    let c = Rank::start(&dir, 2000, "0xd1", Some("1900:12345"), &[]);
    let (code, out, _) = compare(&dir, &[a.pid, c.pid], false);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("DIFFER from seq 2000 (all stand there); they agreed at seq 1792"),
        "{out}"
    );
    for r in [a, b, a3, c] {
        r.finish();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// What cannot be compared is said, and is not success: a process without the plugin's maps,
/// processes that share no communicator, ranks without a tuner policy, a process that is gone
/// (exit 2); a rank without a policy beside one with it decides differently (exit 1).
#[test]
fn compare_says_what_it_could_not_check() {
    let dir = shm();
    let a = Rank::start(&dir, 300, "0xb1", None, &[]);
    let b = Rank::start(&dir, 300, "0xb2", None, &[]);
    let (code, out, err) = compare(&dir, &[a.pid, b.pid], false);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        out.contains("comm 0x00000000000000b1: only in pid"),
        "{out}"
    );
    assert!(
        out.contains("comm 0x00000000000000b2: only in pid"),
        "{out}"
    );
    assert!(err.contains("nothing compared"), "{err}");

    // A live process that never loaded the plugin.
    let mut other = Command::new("sleep").arg("60").spawn().unwrap();
    let a2 = Rank::start(&dir, 300, "0xb1", None, &[]);
    let (code, out, err) = compare(&dir, &[a.pid, a2.pid, other.id()], false);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        out.contains(&format!("pid {}: no ncclbpf maps", other.id())),
        "{out}"
    );
    assert!(
        out.contains("comm 0x00000000000000b1: agree at seq 300 (all stand there)"),
        "{out}"
    );
    assert!(
        err.contains(&format!("could not check process {}", other.id())),
        "{err}"
    );
    other.kill().unwrap();
    other.wait().unwrap();
    // Gone: nothing is compared.
    let (code, out, err) = compare(&dir, &[a.pid, other.id()], false);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains(&format!("process {} is gone", other.id())),
        "{err}"
    );

    // No tuner policy anywhere: nothing was decided, nothing compared.
    let n1 = Rank::start_with(&dir, 300, "0xb3", None, false, &[]);
    let n2 = Rank::start_with(&dir, 300, "0xb3", None, false, &[]);
    let (code, out, err) = compare(&dir, &[n1.pid, n2.pid], false);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        out.contains("no tuner policy in any of its 2 contexts"),
        "{out}"
    );
    // A policy on one rank and not on another: they do not decide alike.
    let p = Rank::start(&dir, 300, "0xb3", None, &[]);
    let (code, out, err) = compare(&dir, &[n1.pid, p.pid], false);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains(&format!("DIFFER: pid {} without a tuner policy", n1.pid)),
        "{out}"
    );
    for r in [a, b, a2, n1, n2, p] {
        r.finish();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The digest as README.md defines it, written again here from the definition, over the
/// decisions the plugin logs at TRACE: every logged digest, and the published one, match.
#[test]
fn the_published_digest_is_the_documented_fold_of_the_logged_decisions() {
    fn absorb(h: u64, w: u64) -> u64 {
        let x = (h ^ w).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        x ^ (x >> 32)
    }
    let dir = shm();
    let r = Rank::start(&dir, 600, "0xe1", None, &[("NCCL_DEBUG", "TRACE")]);
    let (code, v) = compare_json(&dir, &[r.pid]);
    assert_eq!(code, 2, "alone: nothing compared");
    let published = v["communicators"][0]["contexts"][0].clone();
    let log = r.finish();
    let mut h = 0u64;
    let mut n = 0u64;
    for l in log.lines() {
        // "seq N: coll C B B: algo A proto P channels N (applied), digest 0x…"
        let Some((_, t)) = l.split_once("TUNER/BPF seq ") else {
            continue;
        };
        let f: Vec<&str> = t
            .split([' ', ':', ',', '(', ')'])
            .filter(|s| !s.is_empty())
            .collect();
        // [seq, "coll", C, B, "B", "algo", A, "proto", P, "channels", N, applied?, "digest", D]
        let num = |i: usize| f[i].parse::<i64>().unwrap_or_else(|e| panic!("{t}: {e}"));
        let (seq, coll, bytes, algo, proto, nch) = (
            num(0) as u64,
            num(2),
            num(3) as u64,
            num(6),
            num(8),
            num(10),
        );
        let applied = match f[11] {
            "applied" => 1,
            "not" => 0,
            x => panic!("{x}: {t}"),
        };
        n += 1;
        assert_eq!(seq, n, "{t}");
        let w1 = bytes ^ seq.rotate_left(40);
        let w2 = (nch as u64 & 0xffff_ffff)
            | ((algo as u64 & 0xff) << 32)
            | ((proto as u64 & 0xff) << 40)
            | ((coll as u64 & 0xff) << 48)
            | (applied << 56);
        h = absorb(absorb(h, w1), w2);
        assert_eq!(format!("{h:#018x}"), *f.last().unwrap(), "{t}");
        if seq % 256 == 0 {
            let cps = published["checkpoints"].as_array().unwrap();
            let cp = cps.iter().find(|c| c["seq"] == seq).unwrap();
            assert_eq!(cp["digest"], format!("{h:#018x}"));
        }
    }
    assert_eq!(n, 600, "{log}");
    assert_eq!(published["seq"], 600);
    assert_eq!(published["decisions"], 600, "counted as sequenced");
    assert_eq!(published["digest"], format!("{h:#018x}"));
    let _ = std::fs::remove_dir_all(&dir);
}
