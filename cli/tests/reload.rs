//! `cli/src/reload.rs` against a control server in this process (a stand-in handler with canned
//! replies): verdicts, exit statuses, `--all`, unreachable processes, JSON; staged tuner
//! programs and config updates, all or nothing (two stand-in processes, one of which refuses).
//! The module is compiled here on its own, as the command line will use it.

#[path = "../src/reload.rs"]
mod reload;

use ncclbpf_control::server::{self, Handler, Peer};
use ncclbpf_control::{Item, ProgramInfo, Reply, Request, Swap};
use reload::{ACCEPTED, FAILED, REJECTED, Targets};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

struct Canned;

impl Handler for Canned {
    fn handle(&self, req: &Request, _peer: Peer) -> Reply {
        match req {
            Request::Status => Reply::ok(vec![
                Item::Process {
                    pid: std::process::id(),
                    generation: 2,
                    live_programs: 1,
                },
                Item::Hook {
                    section: "net/isend".into(),
                    program: None,
                },
                Item::Hook {
                    section: "net/complete".into(),
                    program: Some(ProgramInfo {
                        name: "on_complete".into(),
                        generation: 2,
                        insns: 97,
                        tag: "c2d64456c65cd92b".into(),
                        tier: "jit".into(),
                        source: "/p/net_stats.o".into(),
                    }),
                },
            ]),
            Request::Reload(p) if p.ends_with("good.o") => Reply::ok(vec![
                Item::Swapped(Swap {
                    section: "net/complete".into(),
                    old: Some(("on_complete".into(), 1)),
                    new: "on_complete_v2".into(),
                    generation: 2,
                    insns: 86,
                    verify: Duration::from_micros(245),
                    compile: Duration::from_micros(70),
                    swap: Duration::from_nanos(40),
                }),
                Item::Refused {
                    section: "tuner".into(),
                    name: "t".into(),
                    reason: "tuner \"reload\" refused".into(),
                },
            ]),
            Request::Stage { at, path } if path.ends_with("good.o") => Reply::ok(vec![
                Item::Staged {
                    section: "tuner".into(),
                    name: "t".into(),
                    at: *at,
                },
                Item::Comm {
                    id: 0xc0ffee,
                    seq: 700,
                    switch_at: Some(*at),
                },
            ]),
            Request::Stage { at, .. } => Reply::error(
                vec![Item::Rejected {
                    what: "tuner".into(),
                    name: "t".into(),
                    message: format!("'t' not staged: too late for seq {at}"),
                }],
                "no tuner program staged; nothing was changed",
            ),
            Request::Unstage => {
                Reply::ok(vec![Item::Other("unstaged the switch at seq 1000".into())])
            }
            Request::StageConfig { at, map, values } if map == "limit" => Reply::ok(vec![
                Item::StagedConfig {
                    map: map.clone(),
                    values: values.clone(),
                    at: *at,
                },
                Item::Comm {
                    id: 0xc0ffee,
                    seq: 700,
                    switch_at: Some(*at),
                },
            ]),
            Request::StageConfig { map, .. } => {
                let e = format!("the tuner program 'decide' has no map '{map}'");
                Reply::error(
                    vec![Item::Rejected {
                        what: "config".into(),
                        name: map.clone(),
                        message: e.clone(),
                    }],
                    format!("no config update staged: {e}; nothing was changed"),
                )
            }
            Request::Reload(p) => Reply::error(
                vec![Item::Rejected {
                    what: "net/complete".into(),
                    name: "prog".into(),
                    message: format!(
                        "program 'prog' rejected by the verifier:\ninsn 1: bad\n  at {}:4",
                        p.display()
                    ),
                }],
                "the net program was rejected; nothing was changed",
            ),
        }
    }
    fn log(&self, _warn: bool, _msg: &str) {}
}

/// A registry dir with this process's control socket, started once.
fn dir() -> &'static Path {
    static D: OnceLock<PathBuf> = OnceLock::new();
    D.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("ncclbpf-cli-reload-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        server::start_in(&d, Arc::new(Canned)).unwrap();
        d
    })
}

fn me() -> Targets {
    Targets::Pids(vec![std::process::id()])
}

fn reload(t: &Targets, obj: &str, json: bool) -> (u8, String) {
    let mut out = vec![];
    let code = reload::run_in(dir(), t, Path::new(obj), json, &mut out);
    (code, String::from_utf8(out).unwrap())
}

#[test]
fn targets_from_the_command_line() {
    assert_eq!(Targets::new(vec![], true), Ok(Targets::All));
    assert_eq!(
        Targets::new(vec![3, 4], false),
        Ok(Targets::Pids(vec![3, 4]))
    );
    assert!(Targets::new(vec![3], true).is_err());
    assert!(Targets::new(vec![], false).is_err());
}

#[test]
fn verdicts_and_exit_statuses() {
    let (code, out) = reload(&me(), "/x/good.o", false);
    assert_eq!(code, ACCEPTED, "{out}");
    let pid = std::process::id();
    assert!(
        out.starts_with(&format!("pid {pid}: accepted (net generation 2)\n")),
        "{out}"
    );
    assert!(
        out.contains("  net/complete: on_complete (gen 1) -> on_complete_v2 (gen 2), 86 insns; verify 245.0 µs, compile 70.0 µs, swap 0.040 µs"),
        "{out}"
    );
    assert!(out.contains("  tuner t: refused: tuner"), "{out}");

    let (code, out) = reload(&me(), "/x/bad.o", false);
    assert_eq!(code, REJECTED, "{out}");
    assert!(out.contains("rejected: the net program was rejected; nothing was changed"));
    assert!(
        out.contains("    insn 1: bad\n      at /x/bad.o:4\n"),
        "the whole log, indented:\n{out}"
    );

    // --all finds this process; a process that is not there makes it 2, over a rejection.
    let (code, out) = reload(&Targets::All, "/x/good.o", false);
    assert_eq!(code, ACCEPTED, "{out}");
    let t = Targets::Pids(vec![std::process::id(), 999_999_999]);
    let (code, out) = reload(&t, "/x/bad.o", false);
    assert_eq!(code, FAILED, "{out}");
    assert!(out.contains("pid 999999999: not asked: process 999999999 does not exist"));
    assert!(out.ends_with("0 of 2 processes accepted\n"), "{out}");
    // A relative path goes out absolute.
    let (_, out) = reload(&me(), "rel/bad.o", false);
    let abs = std::env::current_dir().unwrap().join("rel/bad.o");
    assert!(out.contains(&format!("at {}:4", abs.display())), "{out}");
}

#[test]
fn json_output() {
    let (code, out) = reload(&me(), "/x/good.o", true);
    assert_eq!(code, ACCEPTED);
    let pid = std::process::id();
    assert!(
        out.starts_with("{\"object\":\"/x/good.o\",\"processes\":[{"),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "{{\"pid\":{pid},\"verdict\":\"accepted\",\"error\":null,"
        )),
        "{out}"
    );
    assert!(out.contains("\"kind\":\"swapped\",\"section\":\"net/complete\",\"old\":\"on_complete\",\"old_generation\":1,\"new\":\"on_complete_v2\",\"generation\":2,\"insns\":86,\"verify_us\":245.000,\"compile_us\":70.000,\"swap_us\":0.040"), "{out}");
    assert!(
        out.contains("\"reason\":\"tuner \\\"reload\\\" refused\""),
        "{out}"
    );
    let (code, out) = reload(&me(), "/x/bad.o", true);
    assert_eq!(code, REJECTED);
    assert!(out.contains("\"verdict\":\"rejected\""), "{out}");
    assert!(
        out.contains("verifier:\\ninsn 1: bad\\n  at /x/bad.o:4\""),
        "{out}"
    );
    // Balanced braces and brackets outside strings: one document.
    let mut depth = 0i32;
    let mut in_str = false;
    let mut esc = false;
    for c in out.trim_end().chars() {
        match (in_str, esc, c) {
            (true, true, _) => esc = false,
            (true, false, '\\') => esc = true,
            (true, false, '"') => in_str = false,
            (false, _, '"') => in_str = true,
            (false, _, '{' | '[') => depth += 1,
            (false, _, '}' | ']') => depth -= 1,
            _ => {}
        }
        assert!(depth >= 0);
    }
    assert_eq!((depth, in_str), (0, false), "{out}");
}

#[test]
fn status_lists_hooks() {
    let pid = std::process::id();
    let answers = reload::status_answers(dir(), &[pid], Duration::from_secs(10));
    assert_eq!(answers.len(), 1);
    let (p, a) = &answers[0];
    assert_eq!(*p, pid);
    let out = reload::status_text(*p, a);
    assert!(
        out.starts_with(&format!(
            "pid {pid}: net generation 2, 1 program(s) alive\n"
        )),
        "{out}"
    );
    assert!(out.contains("  net/isend     -\n"), "{out}");
    assert!(
        out.contains("  net/complete  on_complete  gen 2  97 insns  tag c2d64456c65cd92b  jit  /p/net_stats.o"),
        "{out}"
    );
    let out = reload::status_json(*p, a);
    assert!(
        out.contains("{\"kind\":\"hook\",\"section\":\"net/isend\",\"program\":null}"),
        "{out}"
    );
    assert!(out.contains("\"verdict\":\"ok\""), "{out}");
    let gone = reload::status_answers(dir(), &[999_999_999], Duration::from_secs(1));
    let out = reload::status_text(999_999_999, &gone[0].1);
    assert!(
        out.starts_with("pid 999999999: not asked: process 999999999 does not exist"),
        "{out}"
    );
    assert!(reload::status_json(999_999_999, &gone[0].1).contains("\"verdict\":\"not_asked\""));
}

#[test]
fn staging_is_all_or_nothing() {
    let me = std::process::id();
    let run = |pids: Vec<u32>, obj: &str, at: &str, json: bool| {
        let mut out = vec![];
        let code = reload::stage_in(
            dir(),
            &Targets::Pids(pids),
            Path::new(obj),
            at.parse().unwrap(),
            json,
            &mut out,
        );
        (code, String::from_utf8(out).unwrap())
    };
    let (code, out) = run(vec![me], "/p/good.o", "5000", false);
    assert_eq!(code, ACCEPTED, "{out}");
    assert!(
        out.starts_with("tuner switch at seq 5000 of every communicator\n"),
        "{out}"
    );
    assert!(
        out.contains("tuner t: staged: makes every communicator's decisions from seq 5000 on")
            && out.contains("comm 0x0000000000c0ffee: seq 700, switches at seq 5000"),
        "{out}"
    );
    // Refused: exit 1, nothing to withdraw.
    let (code, out) = run(vec![me], "/p/late.o", "5000", false);
    assert_eq!(code, REJECTED, "{out}");
    assert!(
        out.contains("too late for seq 5000") && !out.contains("withdrawn"),
        "{out}"
    );
    // One process not reachable: the one that accepted has its stage withdrawn.
    let (code, out) = run(vec![me, 999_999_999], "/p/good.o", "5000", false);
    assert_eq!(code, FAILED, "{out}");
    assert!(
        out.contains(&format!(
            "pid {me}: stage withdrawn (another process refused)"
        )),
        "{out}"
    );
    let (_, out) = run(vec![me, 999_999_999], "/p/good.o", "5000", true);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["at_seq"], 5000);
    assert_eq!(v["withdrawn"][0]["verdict"], "withdrawn");
    assert_eq!(v["reload"]["processes"][1]["verdict"], "not_asked");
    // +M: after the highest count the processes report now (the canned status has none: 0).
    let (code, out) = run(vec![me], "/p/good.o", "+1000", false);
    assert_eq!(code, ACCEPTED, "{out}");
    assert!(out.starts_with("tuner switch at seq 1000 "), "{out}");
    assert!("+0".parse::<reload::AtSeq>().is_err() && "x".parse::<reload::AtSeq>().is_err());
}

fn config(pids: Vec<u32>, map: &str, values: &[(u32, u64)], at: &str, json: bool) -> (u8, String) {
    let mut out = vec![];
    let code = reload::config_in(
        dir(),
        &Targets::Pids(pids),
        map,
        values,
        at.parse().unwrap(),
        json,
        &mut out,
    );
    (code, String::from_utf8(out).unwrap())
}

#[test]
fn config_arguments() {
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        reload::config_args(
            &args(&["12", "34", "slo_budget_ns", "3=200000", "5=0x1e8480"]),
            false
        ),
        Ok(reload::ConfigArgs {
            targets: Targets::Pids(vec![12, 34]),
            map: "slo_budget_ns".into(),
            values: vec![(3, 200_000), (5, 2_000_000)]
        })
    );
    // A map named like a number is still the map: the one before the values.
    assert_eq!(
        reload::config_args(&args(&["7", "0=1"]), true),
        Ok(reload::ConfigArgs {
            targets: Targets::All,
            map: "7".into(),
            values: vec![(0, 1)]
        })
    );
    for (a, all, why) in [
        (&["limit", "0=1"][..], false, "give the process ids"),
        (&["12", "limit", "0=1"], true, "not both"),
        (&["limit"], true, "no values after config map 'limit'"),
        (
            &["limit", "0=1", "12"],
            false,
            "no values after config map '12'",
        ),
        (&["0=1"], true, "give the config map"),
        (&["x", "limit", "0=1"], false, "\"x\" is not a process id"),
        (
            &["limit", "0=1", "0=2"],
            true,
            "entry 0 of config map 'limit' is given twice",
        ),
        (&["limit", "0=-1"], true, "not a u64 value"),
        (&["limit", "a=1"], true, "not an entry number"),
        (&["li-mit", "0=1"], true, "is not one of"),
    ] {
        let e = reload::config_args(&args(a), all).unwrap_err();
        assert!(e.contains(why), "{a:?}: {e}");
    }
}

#[test]
fn config_updates_are_all_or_nothing() {
    let me = std::process::id();
    let (code, out) = config(vec![me], "limit", &[(0, 100)], "5000", false);
    assert_eq!(code, ACCEPTED, "{out}");
    assert!(
        out.starts_with("config limit 0=100 from seq 5000 of every communicator\n"),
        "{out}"
    );
    assert!(
        out.contains(&format!("pid {me}: accepted\n"))
            && out.contains("  config limit 0=100: staged: every communicator's decisions see it from seq 5000 on\n")
            && out.contains("comm 0x0000000000c0ffee: seq 700, switches at seq 5000"),
        "{out}"
    );
    // Refused: exit 1, nothing to withdraw.
    let (code, out) = config(vec![me], "nope", &[(0, 1)], "5000", false);
    assert_eq!(code, REJECTED, "{out}");
    assert!(
        out.contains(&format!("pid {me}: rejected: no config update staged: the tuner program 'decide' has no map 'nope'"))
            && !out.contains("withdrawn"),
        "{out}"
    );
    // One process not reachable: the one that accepted has its update withdrawn; 2 wins.
    let (code, out) = config(vec![me, 999_999_999], "limit", &[(0, 100)], "5000", false);
    assert_eq!(code, FAILED, "{out}");
    assert!(
        out.contains("pid 999999999: not asked: process 999999999 does not exist")
            && out.contains(&format!(
                "pid {me}: stage withdrawn (another process refused)"
            )),
        "{out}"
    );
    let (code, out) = config(
        vec![me, 999_999_999],
        "limit",
        &[(0, 100), (2, 7)],
        "100",
        true,
    );
    assert_eq!(code, FAILED, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["at_seq"], 100);
    assert_eq!(v["config"]["map"], "limit");
    assert_eq!(v["config"]["values"][1]["key"], 2);
    assert_eq!(v["config"]["values"][1]["value"], 7);
    assert_eq!(v["config"]["processes"][0]["verdict"], "accepted");
    let staged = &v["config"]["processes"][0]["items"][0];
    assert_eq!(
        (
            &staged["kind"],
            &staged["section"],
            &staged["name"],
            &staged["at"]
        ),
        (
            &"staged".into(),
            &"config".into(),
            &"limit".into(),
            &100.into()
        ),
        "{out}"
    );
    assert_eq!(v["config"]["processes"][1]["verdict"], "not_asked");
    assert_eq!(v["withdrawn"][0]["verdict"], "withdrawn");
    // +M needs every process's count first: one that cannot be asked stages nothing anywhere.
    let (code, out) = config(vec![me, 999_999_999], "limit", &[(0, 1)], "+100", false);
    assert_eq!((code, out.as_str()), (FAILED, ""));
    // +M: after the highest count now (the canned status lists no communicator: 0).
    let (code, out) = config(vec![me], "limit", &[(0, 1)], "+100", false);
    assert_eq!(code, ACCEPTED, "{out}");
    assert!(out.starts_with("config limit 0=1 from seq 100 "), "{out}");
    // Bad updates are not sent.
    let (code, out) = config(vec![me], "limit", &[(1, 1), (1, 2)], "5000", false);
    assert_eq!((code, out.as_str()), (FAILED, ""));
}

/// A stand-in process for the two-process test: at seq `seq` of communicator 0x77, it accepts
/// (or refuses) staged config updates, and keeps every request it got.
struct Rank {
    refuse: bool,
    seq: u64,
    got: Mutex<Vec<Request>>,
}

impl Handler for Rank {
    fn handle(&self, req: &Request, _peer: Peer) -> Reply {
        self.got.lock().unwrap().push(req.clone());
        let comm = |switch_at| Item::Comm {
            id: 0x77,
            seq: self.seq,
            switch_at,
        };
        match req {
            Request::Status => Reply::ok(vec![comm(None)]),
            Request::StageConfig { at, map, values } if !self.refuse => Reply::ok(vec![
                Item::StagedConfig {
                    map: map.clone(),
                    values: values.clone(),
                    at: *at,
                },
                comm(Some(*at)),
            ]),
            Request::StageConfig { map, .. } => {
                let e = "communicator(s) 0x0000000000000077 read the process-wide config maps \
                         (start the job with NCCL_BPF_AGREEMENT=on)";
                Reply::error(
                    vec![Item::Rejected {
                        what: "config".into(),
                        name: map.clone(),
                        message: e.into(),
                    }],
                    format!("no config update staged: {e}; nothing was changed"),
                )
            }
            Request::Unstage => Reply::ok(vec![Item::Other(
                "unstaged the config update at seq 1900".into(),
            )]),
            _ => Reply::error(vec![], "not in this test"),
        }
    }
    fn log(&self, _warn: bool, _msg: &str) {}
}

/// Kills the stand-in's process at the end.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Two processes of one job in one registry dir: this one (accepts, at seq 700) and a child
/// whose socket leads to a server of this process that refuses (at seq 900).
#[test]
fn a_refusing_process_withdraws_the_config_update_from_the_others() {
    let base = std::env::temp_dir().join(format!("ncclbpf-cli-config-{}", std::process::id()));
    let (job, other) = (base.join("job"), base.join("other"));
    let _ = std::fs::remove_dir_all(&base);
    let rank = |refuse, seq| {
        Arc::new(Rank {
            refuse,
            seq,
            got: Mutex::new(vec![]),
        })
    };
    let (good, bad) = (rank(false, 700), rank(true, 900));
    server::start_in(&job, good.clone()).unwrap();
    let bad_socket = server::start_in(&other, bad.clone()).unwrap();
    let child = Child(
        std::process::Command::new("sleep")
            .arg("300")
            .spawn()
            .unwrap(),
    );
    let (me, them) = (std::process::id(), child.0.id());
    std::os::unix::fs::symlink(&bad_socket, ncclbpf_control::socket_path_in(&job, them)).unwrap();

    let mut out = vec![];
    let values = [(0, 100)];
    let at = "+1000".parse().unwrap();
    let code = reload::config_in(&job, &Targets::All, "limit", &values, at, false, &mut out);
    let out = String::from_utf8(out).unwrap();
    assert_eq!(code, REJECTED, "{out}");
    // +1000 after the higher count (900): seq 1900 asked of both.
    assert!(
        out.starts_with("config limit 0=100 from seq 1900 of every communicator\n"),
        "{out}"
    );
    assert!(
        out.contains(&format!("pid {them}: rejected: no config update staged: communicator(s) 0x0000000000000077 read the process-wide config maps"))
            && out.contains("NCCL_BPF_AGREEMENT=on")
            && out.contains(&format!("pid {me}: accepted\n"))
            && out.contains("1 of 2 processes accepted\n")
            && out.ends_with(&format!("pid {me}: stage withdrawn (another process refused)\n")),
        "{out}"
    );
    let asked = |r: &Rank| r.got.lock().unwrap().clone();
    let staged = Request::StageConfig {
        at: 1900,
        map: "limit".into(),
        values: values.to_vec(),
    };
    assert_eq!(
        asked(&good),
        [Request::Status, staged.clone(), Request::Unstage]
    );
    assert_eq!(
        asked(&bad),
        [Request::Status, staged],
        "nothing to withdraw there"
    );

    // The same in JSON, at a stated seq: no status asked first.
    good.got.lock().unwrap().clear();
    let mut out = vec![];
    let code = reload::config_in(
        &job,
        &Targets::Pids(vec![me, them]),
        "limit",
        &values,
        reload::AtSeq::At(5000),
        true,
        &mut out,
    );
    assert_eq!(code, REJECTED);
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["at_seq"], 5000);
    assert_eq!(v["config"]["processes"][0]["verdict"], "accepted");
    assert_eq!(v["config"]["processes"][1]["verdict"], "rejected");
    assert_eq!(v["withdrawn"][0]["pid"], me);
    assert_eq!(v["withdrawn"][0]["verdict"], "withdrawn");
    assert_eq!(asked(&good).len(), 2, "stage-config and unstage");
    drop(child);
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn entry_points_for_the_command_line() {
    let _config: fn(&reload::ConfigArgs, reload::AtSeq, bool) -> std::process::ExitCode =
        reload::config;
    // What main.rs wires: stdout and the user's registry dir.
    let _run: fn(&Targets, &Path, Option<reload::AtSeq>, bool) -> std::process::ExitCode =
        reload::run;
}
