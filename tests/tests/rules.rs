//! NCCL's tuner rules through the library's tuner ABI: the `rules` policy
//! (`NCCL_BPF_TUNER_POLICY=target/policies/src/rules.o`) with a rules file
//! (`NCCL_TUNER_CONFIG_FILE`, or `nccl_tuner.conf` in the working directory), driven as NCCL's
//! enqueue path drives the tuner. The library reads its policy and rules once per process, so
//! each case re-runs this test binary on itself, with the environment set before the library
//! loads.

use ncclbpf_harness::{Tuner, log_text};
use ncclnet_headers::NcclFunc;
use std::path::{Path, PathBuf};
use std::process::Command;

const CHILD: &str = "NCCLBPF_RULES_CHILD";
const NA: usize = 7;
const NP: usize = 3;
/// NCCL's own choice on the cost table below: tree (0) / simple (2).
const NCCL: (usize, usize) = (0, 2);

fn rules_policy() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/policies/src/rules.o");
    assert!(p.exists(), "{} missing: run policies/build.sh", p.display());
    p
}

/// NCCL's estimated times: every combination usable, tree/simple the cheapest.
fn costs() -> Vec<f32> {
    (0..NA * NP)
        .map(|i| 10.0 + (i / NP) as f32 + (NP - 1 - i % NP) as f32)
        .collect()
}

/// The same table with NVLS (algorithm 4) unusable, as NCCL marks it without NVLink SHARP.
fn costs_without_nvls() -> Vec<f32> {
    let mut c = costs();
    c[4 * NP..5 * NP].fill(-1.0);
    c
}

struct Tmp(PathBuf);

impl Tmp {
    fn new(tag: &str) -> Tmp {
        let d = std::env::temp_dir().join(format!("ncclbpf-rules-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Tmp(d)
    }
}

impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// In the parent: runs test `name` of this binary in a child with `env` (and in `cwd`), and
/// fails with its output if it fails. In the child: runs `body`.
fn in_child(name: &str, env: &[(&str, Option<&Path>)], cwd: Option<&Path>, body: fn()) {
    if std::env::var(CHILD).as_deref() == Ok(name) {
        body();
        return;
    }
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, name)
        .env("NCCL_BPF_TUNER_POLICY", rules_policy());
    for (k, v) in env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    if let Some(d) = cwd {
        cmd.current_dir(d);
    }
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child {name} failed:\n{text}");
    assert!(
        text.contains("1 passed"),
        "child {name} ran no test:\n{text}"
    );
}

const RULES: &str = "\
# rules for a 4-rank, 2-node communicator
allreduce,0,65536,tree,ll,2,-1,-1,-1,-1
allreduce,65537,16777216,ring,ll128,-1,-1,4
  allreduce , 16777217 , -1 , ring , simple , 16 , 2 , -1 , -1 , 1\r
broadcast,0,-1,ring,ll,4,-1,-1,2

allgather,0,1048576,nvls,simple,-1,-1,-1
reducescatter,1024,1024,tree,ll128,-1,-1,-1
allreduce,0,-1,collnet_chain,ll,1,-1,8
";

/// One decision: (collective, bytes, numPipeOps, regBuff, NVLS usable) → what NCCL ends up
/// with: (algorithm, protocol, channels; 0 = NCCL's).
type Case = (NcclFunc, usize, i32, i32, bool, (usize, usize, i32));

fn cases() -> Vec<Case> {
    use NcclFunc as F;
    let (n0, n1) = NCCL;
    vec![
        (F::ALL_REDUCE, 8, 1, 0, true, (0, 0, 2)),
        (F::ALL_REDUCE, 65536, 1, 0, true, (0, 0, 2)),
        (F::ALL_REDUCE, 65537, 1, 0, true, (1, 1, 0)),
        (F::ALL_REDUCE, 16 << 20, 3, 1, true, (1, 1, 0)),
        // The ring/simple rule names regBuff 1, which is rank-local: it is skipped, whatever
        // the call's regBuff; nRanks 4 is not the last rule's 8.
        (F::ALL_REDUCE, (16 << 20) + 1, 1, 1, true, (n0, n1, 0)),
        (F::ALL_REDUCE, (16 << 20) + 1, 1, 0, true, (n0, n1, 0)),
        (F::BROADCAST, 100, 2, 0, true, (1, 0, 4)),
        (F::BROADCAST, 100, 1, 0, true, (n0, n1, 0)),
        (F::ALL_GATHER, 4096, 1, 0, true, (4, 2, 0)),
        // The rule's combination is unusable here: NCCL's choice stands.
        (F::ALL_GATHER, 4096, 1, 0, false, (n0, n1, 0)),
        (F::ALL_GATHER, (1 << 20) + 1, 1, 0, true, (n0, n1, 0)),
        (F::REDUCE_SCATTER, 1024, 1, 1, true, (0, 1, 0)),
        (F::REDUCE_SCATTER, 1023, 1, 1, true, (n0, n1, 0)),
        (F::REDUCE, 1024, 1, 0, true, (n0, n1, 0)),
    ]
}

/// Runs `cases` through tuner `version` and checks what NCCL would do after each call.
fn check(version: u32, cases: &[Case]) {
    let t = Tuner::open(Some(version), 4, 2).unwrap();
    for &(f, bytes, pipe, reg, nvls, want) in cases {
        let table = if nvls { costs() } else { costs_without_nvls() };
        let c = t
            .coll_info_for(f, bytes, pipe, reg, &table, NA, NP)
            .unwrap();
        let (a, p) = c.picked(NP).unwrap();
        assert_eq!(
            (a, p, c.nchannels),
            want,
            "v{version}: coll {} {bytes} B, numPipeOps {pipe}, regBuff {reg}, nvls {nvls}",
            f.0
        );
        let changed = c.table.iter().zip(&table).filter(|(x, y)| x != y).count();
        let nccls = (want.0, want.1) == NCCL && want.2 == 0;
        assert_eq!(
            changed,
            usize::from(!nccls),
            "v{version}: coll {} {bytes} B",
            f.0
        );
    }
}

fn rules_decide() {
    // v5, v6 (NCCL >= 2.25) and v4 pass regBuff, v3 none: no rule looks at it.
    for v in [6, 5, 4, 3] {
        check(v, &cases());
    }
    // v2 takes a full (algorithm, protocol) pair and no table: NCCL forces the pair.
    let t = Tuner::open(Some(2), 4, 2).unwrap();
    let c = t.coll_info(1024, &costs(), NA, NP).unwrap();
    assert_eq!((c.pair, c.nchannels), ((0, 0), 2));
    let c = t.coll_info(1 << 20, &costs(), NA, NP).unwrap();
    assert_eq!((c.pair, c.nchannels), ((1, 1), 0));
    let c = t
        .coll_info_for(NcclFunc::REDUCE, 1024, 1, 0, &costs(), NA, NP)
        .unwrap();
    assert_eq!((c.pair, c.nchannels), ((-1, -1), 0), "no rule: NCCL's own");

    let log = log_text();
    let file = std::env::var("NCCL_TUNER_CONFIG_FILE").unwrap();
    assert!(
        log.contains(&format!("6 tuner rules from {file} (the table holds 512)")),
        "{log}"
    );
    assert!(
        log.contains(&format!(
            "{file}:3: allreduce,65537,16777216,ring,ll128,-1,-1,4,-1,-1"
        )),
        "each rule is logged as read:\n{log}"
    );
    assert!(
        log.contains(&format!(
            "{file}: rule on line 4 skipped: regBuff is rank-local"
        )),
        "the regBuff rule is skipped, with the reason:\n{log}"
    );
    assert!(log.contains("policy 'rules' from"), "{log}");
    assert_eq!(
        log.matches("tuner rules from").count(),
        1,
        "read once:\n{log}"
    );
}

#[test]
fn rules_decide_through_every_tuner_version() {
    let tmp = Tmp::new("decide");
    let file = tmp.0.join("rules.conf");
    std::fs::write(&file, RULES).unwrap();
    in_child(
        "rules_decide_through_every_tuner_version",
        &[("NCCL_TUNER_CONFIG_FILE", Some(&file))],
        None,
        rules_decide,
    );
}

fn default_file() {
    let t = Tuner::open(Some(5), 4, 2).unwrap();
    let c = t.coll_info(8, &costs(), NA, NP).unwrap();
    assert_eq!((c.picked(NP), c.nchannels), (Some((0, 0)), 2));
    let log = log_text();
    assert!(log.contains("6 tuner rules from nccl_tuner.conf"), "{log}");
}

#[test]
fn without_the_variable_nccl_tuner_conf_in_the_working_directory_is_read() {
    let tmp = Tmp::new("default");
    std::fs::write(tmp.0.join("nccl_tuner.conf"), RULES).unwrap();
    in_child(
        "without_the_variable_nccl_tuner_conf_in_the_working_directory_is_read",
        &[("NCCL_TUNER_CONFIG_FILE", None)],
        Some(&tmp.0),
        default_file,
    );
}

const MALFORMED: &str = "\
allreduce,0,65536,tree,ll,2,-1,-1,-1,-1
allreduce,65537,16777216,rng,ll128,-1,-1,4
broadcast,0,-1,ring,LL,4,-1,-1,2,
allgather,0,1048576,nvls,simple,-1,-1
reduce,64K,-1,ring,simple,0,1,-1
";

/// Each line NCCL's log must show, after the file's name.
const MALFORMED_ERRORS: [&str; 5] = [
    ":2: field 4 (algorithm): \"rng\" is not one of tree, ring, collnet_direct, collnet_chain, nvls, nvls_tree, pat; NCCL's example tuner would silently take it as ring",
    ":3: field 5 (protocol): \"LL\" is not one of ll, ll128, simple (names are lower case: \"ll\"); NCCL's example tuner would silently take it as simple",
    ":4: 7 comma-separated fields, expected 8, 9 or 10: collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks[,numPipeOps[,regBuff]]; NCCL's example tuner would silently skip the line",
    ":5: field 2 (min_bytes): \"64K\" is not a byte count: decimal digits only, e.g. 65536",
    ":5: field 6 (channels): 0 channels: -1 keeps NCCL's channel count, 1 to 64 sets it",
];

fn malformed_keeps_nccl() {
    for v in [6, 5, 4, 3] {
        let nccl: Vec<Case> = cases()
            .into_iter()
            .map(|mut c| {
                c.5 = (NCCL.0, NCCL.1, 0);
                c
            })
            .collect();
        check(v, &nccl);
    }
    let t = Tuner::open(Some(2), 4, 2).unwrap();
    let c = t.coll_info(8, &costs(), NA, NP).unwrap();
    assert_eq!((c.pair, c.nchannels), ((-1, -1), 0));
    let log = log_text();
    let file = std::env::var("NCCL_TUNER_CONFIG_FILE").unwrap();
    for e in MALFORMED_ERRORS {
        let line = format!("TUNER/BPF {file}{e}");
        assert_eq!(log.matches(&line).count(), 1, "{line}\nnot once in:\n{log}");
    }
    assert!(
        log.contains(&format!(
            "tuner policy not loaded, NCCL keeps its own choices: {file}: 5 errors in the tuner \
             rules (each logged above); no rule is used"
        )),
        "{log}"
    );
    assert!(!log.contains("tuner rules from"), "{log}");
}

#[test]
fn a_malformed_file_leaves_every_choice_to_nccl_and_logs_each_error() {
    let tmp = Tmp::new("malformed");
    let file = tmp.0.join("bad.conf");
    std::fs::write(&file, MALFORMED).unwrap();
    in_child(
        "a_malformed_file_leaves_every_choice_to_nccl_and_logs_each_error",
        &[("NCCL_TUNER_CONFIG_FILE", Some(&file))],
        None,
        malformed_keeps_nccl,
    );
}

fn missing_file() {
    for v in [6, 5, 4, 3] {
        let nccl: Vec<Case> = cases()
            .into_iter()
            .map(|mut c| {
                c.5 = (NCCL.0, NCCL.1, 0);
                c
            })
            .collect();
        check(v, &nccl);
    }
    let log = log_text();
    let file = std::env::var("NCCL_TUNER_CONFIG_FILE").unwrap();
    let line = format!(
        "no tuner rules: {file} not found (NCCL_TUNER_CONFIG_FILE names the rules file; without \
         it, nccl_tuner.conf in the working directory); the rules table is empty and NCCL keeps \
         its own choices"
    );
    assert_eq!(log.matches(&line).count(), 1, "logged once:\n{log}");
    assert!(
        log.contains("policy 'rules' from"),
        "the policy is loaded:\n{log}"
    );
}

#[test]
fn a_missing_file_is_logged_once_and_nccl_decides() {
    let tmp = Tmp::new("missing");
    let file = tmp.0.join("no-such.conf");
    in_child(
        "a_missing_file_is_logged_once_and_nccl_decides",
        &[("NCCL_TUNER_CONFIG_FILE", Some(&file))],
        None,
        missing_file,
    );
}
