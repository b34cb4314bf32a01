//! Live reload through the control socket of a running process (`harness-serve`, which keeps
//! moving checked messages over a loopback pair with `net_stats` attached):
//!
//! * a compatible object (same maps) swaps in while traffic flows: the generation moves, the
//!   maps keep counting from where they were, the old program is freed, no message is lost or
//!   corrupted; a hook with no program gets one;
//! * a program the verifier rejects, an object half good and half rejected, a map whose shape
//!   changed, a missing or broken file: rejected with the reason (the verifier's log, the
//!   registry's message), every hook keeps its program, no map of the rejected object appears;
//! * a tuner program is refused with the reason while the object's net programs swap;
//! * a tuner program staged at a sequence number takes over at that collective in every process;
//!   so do new config-map values staged with `ncclbpf config --at-seq`, all processes or none;
//! * a client of another uid is refused (`SO_PEERCRED`), and logged once;
//! * `NCCL_BPF_CONTROL=0` makes no socket; a stale socket is removed by the next process; the
//!   socket goes at exit.

use ncclbpf_control::{Item, ProgramInfo, Reply, Request};
use shared_maps::MapView;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

const SERVE: &str = env!("CARGO_BIN_EXE_harness-serve");
const WAIT: Duration = Duration::from_secs(30);

fn scratch(name: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let d = std::env::temp_dir().join(format!(
        "ncclbpf-live-{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Compiles `tests/policies/<name>.c` into `out`.
fn fixture(name: &str, out: &Path) -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("policies").join(format!("{name}.c"));
    let obj = out.join(format!("{name}.o"));
    std::fs::create_dir_all(out).unwrap();
    let st = Command::new("clang")
        .args(["-O2", "-g", "-target", "bpf", "-mcpu=v3", "-Wall", "-I"])
        .arg(root.join("../policies/include"))
        .arg("-c")
        .arg(&src)
        .arg("-o")
        .arg(&obj)
        .status()
        .unwrap_or_else(|e| panic!("clang (needed for {}): {e}", src.display()));
    assert!(st.success(), "clang failed on {}", src.display());
    obj
}

fn shipped(rel: &str) -> PathBuf {
    ncclbpf_policies::object(rel).unwrap_or_else(|e| panic!("{e}"))
}

/// A `harness-serve serve` child with its registry in `dir`.
struct Server {
    child: Child,
    pid: u32,
    dir: PathBuf,
    lines: Receiver<String>,
}

impl Server {
    fn start(dir: &Path, env: &[(&str, &str)]) -> Server {
        Server::start_mode(&["serve"], dir, env)
    }

    /// `harness-serve <mode...>` with its registry in `dir`.
    fn start_mode(mode: &[&str], dir: &Path, env: &[(&str, &str)]) -> Server {
        let mut cmd = Command::new(SERVE);
        cmd.args(mode)
            .env("NCCL_BPF_SHM_DIR", dir)
            .env("NCCL_SOCKET_IFNAME", "lo")
            .env("NCCL_BPF_POLICY", shipped("src/net_stats.o"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let pid = child.id();
        let s = Server {
            child,
            pid,
            dir: dir.to_path_buf(),
            lines,
        };
        let ready = s.line(WAIT).expect("harness-serve never got ready");
        assert_eq!(ready, format!("ready {pid}"));
        s
    }

    fn line(&self, t: Duration) -> Option<String> {
        self.lines.recv_timeout(t).ok()
    }

    fn socket(&self) -> PathBuf {
        ncclbpf_control::socket_path_in(&self.dir, self.pid)
    }

    fn ask(&self, req: Request) -> Reply {
        ncclbpf_control::request_in(&self.dir, self.pid, &req, Duration::from_secs(120))
            .unwrap_or_else(|e| panic!("{req:?}: {e}"))
    }

    fn reload(&self, obj: &Path) -> Reply {
        self.ask(Request::Reload(obj.to_path_buf()))
    }

    fn hook(&self, section: &str) -> Option<ProgramInfo> {
        let r = self.ask(Request::Status);
        assert_eq!(r.result, Ok(()), "{r:?}");
        r.items
            .into_iter()
            .find_map(|i| match i {
                Item::Hook {
                    section: s,
                    program,
                } if s == section => Some(program),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no hook {section} in the status"))
    }

    fn process(&self) -> (u64, u64) {
        let r = self.ask(Request::Status);
        r.items
            .iter()
            .find_map(|i| match i {
                Item::Process {
                    generation,
                    live_programs,
                    ..
                } => Some((*generation, *live_programs)),
                _ => None,
            })
            .expect("a process line")
    }

    fn maps(&self) -> Vec<MapView> {
        MapView::open_all_in(&self.dir, self.pid).unwrap()
    }

    /// Sends plus receives net_stats counted on every connection.
    fn counted(&self) -> u64 {
        let maps = self.maps();
        let v = maps
            .iter()
            .find(|v| v.name == "net_conn_stats")
            .expect("net_conn_stats");
        v.entries()
            .iter()
            .map(|(_, vals)| word(&vals[0], 2) + word(&vals[0], 3))
            .sum()
    }

    /// Entry `key` of a map, summed over CPUs, as a u64.
    fn value(&self, map: &str, key: u32) -> Option<u64> {
        let maps = self.maps();
        let v = maps.iter().find(|v| v.name == map)?;
        let (_, vals) = v
            .entries()
            .into_iter()
            .find(|(k, _)| k[..4] == key.to_le_bytes())?;
        Some(vals.iter().map(|c| word(c, 0)).sum())
    }

    fn has_map(&self, map: &str) -> bool {
        self.maps().iter().any(|v| v.name == map)
    }

    /// Stops the traffic and the process; returns the message count and the rest of its output.
    fn stop(mut self) -> (u64, String) {
        let _ = self.child.stdin.as_mut().unwrap().write_all(b"stop\n");
        let deadline = Instant::now() + WAIT;
        let st = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            assert!(Instant::now() < deadline, "harness-serve did not stop");
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut rest = vec![];
        while let Some(l) = self.line(Duration::from_secs(5)) {
            rest.push(l);
        }
        let text = rest.join("\n");
        assert!(st.success(), "harness-serve failed ({st}):\n{text}");
        let moved = rest
            .iter()
            .find_map(|l| l.strip_prefix("stopped "))
            .and_then(|l| l.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no 'stopped' line:\n{text}"));
        (moved, text)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn word(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap())
}

/// Waits until `f` holds.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The counts go on growing (traffic flows and the attached complete program counts it).
fn grows(s: &Server, what: &str) -> u64 {
    let c = s.counted();
    eventually(what, || s.counted() > c + 10);
    s.counted()
}

fn swapped<'a>(r: &'a Reply, section: &str) -> &'a ncclbpf_control::Swap {
    r.items
        .iter()
        .find_map(|i| match i {
            Item::Swapped(s) if s.section == section => Some(s),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{section} not swapped: {}", r.to_text()))
}

fn rejected<'a>(r: &'a Reply, what: &str) -> (&'a str, &'a str) {
    r.items
        .iter()
        .find_map(|i| match i {
            Item::Rejected {
                what: w,
                name,
                message,
            } if w == what => Some((name.as_str(), message.as_str())),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no rejection of {what}: {}", r.to_text()))
}

#[test]
fn reload_while_traffic_flows() {
    let dir = scratch("flow");
    // Not inside `dir`: the server wants a directory only its user can reach, and makes it.
    let objs = scratch("flow-objects");
    let v2 = fixture("net_stats_v2", &objs);
    let s = Server::start(&dir, &[]);

    // The socket: owner only, in an owner-only directory.
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&s.socket()), 0o600);
    assert_eq!(mode(&dir), 0o700);

    // At start: net_stats' two programs, generation 1.
    let c = s.hook("net/complete").expect("net_stats attached");
    assert_eq!((c.name.as_str(), c.generation), ("on_complete", 1));
    assert!(c.tag.len() == 16 && c.insns > 10, "{c:?}");
    assert!(s.hook("net/isend").is_none());
    assert_eq!(s.process(), (1, 2));
    grows(&s, "net_stats counts traffic");

    // (a) A compatible object, while traffic flows.
    let before = s.counted();
    let op_complete_before = s.value("net_op_counts", 5).unwrap();
    assert_eq!(s.value("net_op_counts", 0), Some(0), "v1 never counts op 0");
    let r = s.reload(&v2);
    assert_eq!(r.result, Ok(()), "{}", r.to_text());
    let sw = swapped(&r, "net/complete");
    assert_eq!(sw.old, Some(("on_complete".into(), 1)));
    assert_eq!((sw.new.as_str(), sw.generation), ("on_complete_v2", 2));
    assert!(sw.verify > Duration::ZERO && sw.compile > Duration::ZERO);
    let att = swapped(&r, "net/isend");
    assert_eq!((att.old.clone(), att.new.as_str()), (None, "on_isend_v2"));
    let c = s.hook("net/complete").unwrap();
    assert_eq!((c.name.as_str(), c.generation), ("on_complete_v2", 2));
    assert_eq!(s.hook("net/close").unwrap().generation, 1, "close kept");
    // The same maps: counts carry on from where they were, now from the new program.
    let after = s.counted();
    assert!(after >= before, "counts went back from {before} to {after}");
    eventually("the new complete program runs", || {
        s.value("net_op_counts", 0).unwrap() > 0
    });
    eventually("the new isend program runs", || {
        s.value("net_op_counts", 3).unwrap() > 0
    });
    assert!(s.value("net_op_counts", 5).unwrap() >= op_complete_before);
    grows(&s, "counts grow after the reload");
    // The old on_complete is freed once both connection ends moved on: 3 programs live.
    eventually("the old program is freed", || s.process() == (2, 3));

    // (b) The verifier rejects the new program: the old one keeps running.
    let marks = s.value("net_op_counts", 0).unwrap();
    let r = s.reload(&shipped("unsafe/ctx_write_ro_net.o"));
    let e = r.result.clone().unwrap_err();
    assert!(
        e.contains("rejected") && e.contains("nothing was changed"),
        "{e}"
    );
    let (name, log) = rejected(&r, "net/complete");
    assert_eq!(name, "prog");
    assert!(
        log.starts_with("program 'prog' rejected by the verifier:")
            && log.contains("read-only")
            && log.contains("ctx_write_ro_net.c:4")
            && log.lines().count() >= 3,
        "the verifier's whole log:\n{log}"
    );
    assert_eq!(s.hook("net/complete").unwrap().name, "on_complete_v2");
    grows(&s, "counts grow after a rejected reload");
    assert!(
        s.value("net_op_counts", 0).unwrap() > marks,
        "v2 still runs"
    );

    // Half good, half rejected: nothing changes, not even the good half's map.
    let r = s.reload(&fixture("half_bad", &objs));
    assert!(r.result.is_err(), "{}", r.to_text());
    let (name, log) = rejected(&r, "net/close");
    assert!(name == "bad_close" && log.contains("half_bad.c:"), "{log}");
    assert!(
        s.hook("net/irecv").is_none(),
        "the accepted half was not attached"
    );
    assert_eq!(s.hook("net/close").unwrap().name, "on_close");
    assert!(
        !s.has_map("half_bad_seen"),
        "a rejected object created a map"
    );

    // (c) A map whose shape changed rejects the whole object.
    let r = s.reload(&fixture("bad_shape", &objs));
    let e = r.result.clone().unwrap_err();
    assert!(e.contains("map 'net_conn_stats'"), "{e}");
    let (name, msg) = rejected(&r, "map");
    assert_eq!(name, "net_conn_stats");
    assert!(
        msg.contains("map 'net_conn_stats' declared as")
            && msg.contains("but already exists as")
            && msg.contains("on_complete"),
        "the registry's message: {msg}"
    );
    assert!(s.hook("net/irecv").is_none());
    assert_eq!(s.hook("net/complete").unwrap().name, "on_complete_v2");
    assert!(!s.has_map("reload_fresh"));

    // Files that are not there or not objects.
    let r = s.reload(&objs.join("missing.o"));
    assert!(r.result.unwrap_err().starts_with("cannot read"));
    std::fs::write(objs.join("junk.o"), b"not an ELF file").unwrap();
    assert!(s.reload(&objs.join("junk.o")).result.is_err());
    assert_eq!(s.process().0, 2, "no failed reload moved the generation");

    // (e) A tuner program is refused, the net program next to it swaps in.
    let r = s.reload(&fixture("tuner_and_net", &objs));
    assert_eq!(r.result, Ok(()), "{}", r.to_text());
    let refused = r.items.iter().find_map(|i| match i {
        Item::Refused {
            section,
            name,
            reason,
        } => Some((section.as_str(), name.as_str(), reason.as_str())),
        _ => None,
    });
    let (section, name, reason) = refused.expect("the tuner program refused");
    assert_eq!((section, name), ("tuner", "one_channel"));
    assert!(
        reason.contains("same collective on every rank") && reason.contains("--at-seq"),
        "{reason}"
    );
    let sw = swapped(&r, "net/irecv");
    assert_eq!((sw.new.as_str(), sw.generation), ("count_irecv", 3));
    eventually("the new irecv program runs", || {
        s.value("irecv_posted", 0).unwrap_or(0) > 0
    });
    grows(&s, "counts grow after the third reload");

    let socket = s.socket();
    let (moved, log) = s.stop();
    // Traffic flowed the whole time (a debug build of harness-serve moves about 100 messages a
    // second, checking every byte; release builds many more).
    assert!(moved > 20, "only {moved} messages");
    assert!(log.contains("reload ") && log.contains("failed"), "{log}");
    assert!(!socket.exists(), "the socket outlived its process");
}

impl Server {
    /// Every tuner context of the process: (comm id, decisions so far, switch point).
    fn comms(&self) -> Vec<(u64, u64, Option<u64>)> {
        let r = self.ask(Request::Status);
        r.items
            .iter()
            .filter_map(|i| match i {
                Item::Comm { id, seq, switch_at } => Some((*id, *seq, *switch_at)),
                _ => None,
            })
            .collect()
    }

    /// The decision numbers from which the channel count changed, from a stopped `tuner`.
    fn channels(text: &str) -> Vec<(u64, i32)> {
        let l = text
            .lines()
            .find_map(|l| l.strip_prefix("channels "))
            .unwrap_or_else(|| panic!("no channels line:\n{text}"));
        l.split(' ')
            .map(|w| {
                let (s, n) = w.split_once(':').unwrap();
                (s.parse().unwrap(), n.parse().unwrap())
            })
            .collect()
    }
}

/// Two "ranks" of one communicator, in two processes that decide at their own pace: a tuner
/// program staged at one sequence number takes over at exactly that collective in both; a stage
/// too late for a process is refused there and changes nothing; an unstaged switch never
/// happens.
#[test]
fn a_staged_tuner_switches_every_rank_at_the_same_collective() {
    let dir = scratch("stage");
    let objs = scratch("stage-objects");
    let three = fixture("tuner_three", &objs);
    let env = [("NCCL_BPF_POLICY", shipped("src/bad_channels.o"))];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.to_str().unwrap())).collect();
    let comm = 0xabcdu64;
    let ranks = [
        Server::start_mode(&["tuner", &comm.to_string()], &dir, &env),
        Server::start_mode(&["tuner", &comm.to_string()], &dir, &env),
    ];
    eventually("both ranks decide", || {
        ranks
            .iter()
            .all(|r| r.comms().first().is_some_and(|c| c.1 > 100))
    });
    // Too late: a switch point one rank already passed is refused there, nothing changes.
    let now = ranks[0].comms()[0].1;
    let r = ranks[0].ask(Request::Stage {
        at: now,
        path: three.clone(),
    });
    let err = r.result.clone().unwrap_err();
    assert!(err.contains("too late for seq"), "{}", r.to_text());
    assert!(ranks[0].comms()[0].2.is_none(), "nothing staged");

    // Staged and withdrawn: never runs.
    let far = now + 10_000_000;
    for r in &ranks {
        let st = r.ask(Request::Stage {
            at: far,
            path: three.clone(),
        });
        assert_eq!(st.result, Ok(()), "{}", st.to_text());
        assert!(st.items.iter().any(
            |i| matches!(i, Item::Staged { name, at, .. } if name == "three_channels" && *at == far)
        ));
        assert_eq!(r.ask(Request::Unstage).result, Ok(()));
        assert_eq!(r.comms()[0].2, None);
    }

    // Staged on both, 3000 collectives after the higher count.
    let high = ranks.iter().map(|r| r.comms()[0].1).max().unwrap();
    let at = high + 3000;
    for r in &ranks {
        let st = r.ask(Request::Stage {
            at,
            path: three.clone(),
        });
        assert_eq!(st.result, Ok(()), "{}", st.to_text());
        let c = r.comms();
        assert_eq!((c[0].0, c[0].2), (comm, Some(at)), "{c:?}");
    }
    eventually("both ranks pass the switch point", || {
        ranks.iter().all(|r| r.comms()[0].1 > at + 50)
    });
    for r in ranks {
        let (calls, text) = r.stop();
        assert!(calls > at, "{calls}");
        // bad_channels puts every collective on one channel until the switch, then three.
        assert_eq!(Server::channels(&text), [(1, 1), (at, 3)], "{text}");
        assert!(
            text.contains(&format!(
                "tuner program 'three_channels' makes decisions from seq {at} on"
            )),
            "{text}"
        );
    }
}

fn cli() -> PathBuf {
    ncclbpf_harness::cli_path()
}

/// Four ranks of one communicator deciding at four different paces (one every 100, 130, 160 and
/// 200 µs, so their counts drift apart, by thousands over the test, within the 16 checkpoints
/// `--compare` can still line up): a program staged at one sequence number takes over at exactly
/// that collective on all four, and `ncclbpf decisions --compare` finds their digests equal at
/// their highest common checkpoint past the switch.
#[test]
fn four_ranks_at_their_own_pace_switch_at_the_same_collective() {
    let dir = scratch("skew");
    let objs = scratch("skew-objects");
    let three = fixture("tuner_three", &objs);
    let env = [("NCCL_BPF_POLICY", shipped("src/bad_channels.o"))];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.to_str().unwrap())).collect();
    let comm = 0x5e3du64.to_string();
    let ranks: Vec<Server> = ["100", "130", "160", "200"]
        .iter()
        .map(|us| Server::start_mode(&["tuner", &comm, us], &dir, &env))
        .collect();
    eventually("every rank decides", || {
        ranks
            .iter()
            .all(|r| r.comms().first().is_some_and(|c| c.1 > 50))
    });
    let high = ranks.iter().map(|r| r.comms()[0].1).max().unwrap();
    let at = high + 2000;
    for r in &ranks {
        let st = r.ask(Request::Stage {
            at,
            path: three.clone(),
        });
        assert_eq!(st.result, Ok(()), "{}", st.to_text());
    }
    let deadline = Instant::now() + Duration::from_secs(90);
    while ranks.iter().any(|r| r.comms()[0].1 < at + 300) {
        assert!(
            Instant::now() < deadline,
            "the slowest rank did not pass seq {at}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let pids: Vec<String> = ranks.iter().map(|r| r.pid.to_string()).collect();
    let out = Command::new(cli())
        .args(["decisions", "--json", "--compare"])
        .args(&pids)
        .env("NCCL_BPF_SHM_DIR", &dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let c = &v["communicators"][0];
    assert_eq!(c["verdict"], "agree", "{text}");
    assert!(
        c["agreed_at"].as_u64().unwrap() >= at,
        "agreed past the switch: {text}"
    );
    for r in ranks {
        let (_, log) = r.stop();
        assert_eq!(Server::channels(&log), [(1, 1), (at, 3)], "{log}");
    }
}

impl Server {
    /// The staged config updates the process lists (`Item::StagedConfig`).
    fn staged_configs(&self) -> Vec<Item> {
        let r = self.ask(Request::Status);
        r.items
            .into_iter()
            .filter(|i| matches!(i, Item::StagedConfig { .. }))
            .collect()
    }
}

/// `harness-serve tuner` with epoch_state.o on a one-rank communicator `comm`, one decision
/// every 1000 µs, with `env` added: with the agreement (the default for a policy with agreed
/// data) the context completes each agreement on its own record and keeps its own view of the
/// config map `limit`.
fn epoch_state_rank(dir: &Path, comm: u64, env: &[(&str, &str)]) -> Server {
    let obj = shipped("safe/epoch_state.o");
    let mut all = vec![("NCCL_BPF_POLICY", obj.to_str().unwrap())];
    all.extend_from_slice(env);
    Server::start_mode(&["tuner", &comm.to_string(), "1000", "1"], dir, &all)
}

/// `ncclbpf config ARGS...` against the processes of `dir`: exit status and the JSON document.
fn config_cli(dir: &Path, args: &[&str]) -> (Option<i32>, serde_json::Value) {
    let out = Command::new(cli())
        .arg("config")
        .arg("--json")
        .args(args)
        .env("NCCL_BPF_SHM_DIR", dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let v = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{e}: {text}{}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code(), v)
}

/// Two processes, each with a one-rank communicator whose context runs the agreement
/// (epoch_state.o): `ncclbpf config --at-seq +200 --all limit 0=100` stages the new value in
/// both at one sequence number N, which both list, and each communicator takes it at exactly
/// its N-th collective (their logs say so, once).
#[test]
fn a_staged_config_update_takes_effect_at_the_stated_collective_in_every_process() {
    let dir = scratch("config");
    let ranks = [
        epoch_state_rank(&dir, 0xc0f1, &[]),
        epoch_state_rank(&dir, 0xc0f2, &[]),
    ];
    eventually("both processes decide", || {
        ranks
            .iter()
            .all(|r| r.comms().first().is_some_and(|c| c.1 > 10))
    });
    let (code, v) = config_cli(&dir, &["--at-seq", "+200", "--all", "limit", "0=100"]);
    assert_eq!(code, Some(0), "{v}");
    let at = v["at_seq"].as_u64().unwrap();
    for (r, p) in ranks
        .iter()
        .zip(v["config"]["processes"].as_array().unwrap())
    {
        assert_eq!(p["pid"], r.pid, "{v}");
        assert_eq!(p["verdict"], "accepted", "{v}");
    }
    assert_eq!(v["withdrawn"], serde_json::json!([]), "{v}");
    for r in &ranks {
        assert_eq!(
            r.staged_configs(),
            [Item::StagedConfig {
                map: "limit".into(),
                values: vec![(0, 100)],
                at
            }],
            "status lists the staged update"
        );
        assert_eq!(r.comms()[0].2, Some(at), "{:?}", r.comms());
    }
    eventually("both communicators pass the stated collective", || {
        ranks.iter().all(|r| r.comms()[0].1 > at + 20)
    });
    for (r, comm) in ranks.into_iter().zip([0xc0f1u64, 0xc0f2]) {
        let (_, log) = r.stop();
        let line = format!("comm {comm:#018x}: config limit 0=100 from seq {at} on");
        assert_eq!(log.matches(&line).count(), 1, "{line}:\n{log}");
        assert_eq!(
            log.matches("config limit 0=100 from seq").count(),
            1,
            "{log}"
        );
        assert!(
            log.contains("config limit 0=100 at seq") && log.contains("staged from seq"),
            "the control request is logged:\n{log}"
        );
    }
}

/// A process whose context reads the process-wide config maps (NCCL_BPF_AGREEMENT=off: no
/// agreement, so no views) refuses a staged config update and says how to get one; the process
/// that accepted it has it withdrawn and never takes it.
#[test]
fn a_process_without_views_refuses_a_config_update_and_the_others_withdraw_it() {
    let dir = scratch("config-refused");
    let ranks = [
        epoch_state_rank(&dir, 0xc0f3, &[]),
        epoch_state_rank(&dir, 0xc0f4, &[("NCCL_BPF_AGREEMENT", "off")]),
    ];
    eventually("both processes decide", || {
        ranks
            .iter()
            .all(|r| r.comms().first().is_some_and(|c| c.1 > 10))
    });
    let (code, v) = config_cli(&dir, &["--at-seq", "+200", "--all", "limit", "0=100"]);
    assert_eq!(code, Some(1), "{v}");
    let at = v["at_seq"].as_u64().unwrap();
    let procs = v["config"]["processes"].as_array().unwrap();
    let of = |pid: u32| procs.iter().find(|p| p["pid"] == pid).unwrap();
    assert_eq!(of(ranks[0].pid)["verdict"], "accepted", "{v}");
    let refused = of(ranks[1].pid);
    assert_eq!(refused["verdict"], "rejected", "{v}");
    let why = refused["error"].as_str().unwrap();
    assert!(
        why.contains("0x000000000000c0f4") && why.contains("NCCL_BPF_AGREEMENT=on"),
        "{why}"
    );
    assert_eq!(v["withdrawn"][0]["pid"], ranks[0].pid, "{v}");
    assert_eq!(v["withdrawn"][0]["verdict"], "withdrawn", "{v}");
    for r in &ranks {
        assert_eq!(r.staged_configs(), [], "nothing stays staged");
        assert_eq!(r.comms()[0].2, None);
    }
    eventually("both communicators pass the stated collective", || {
        ranks.iter().all(|r| r.comms()[0].1 > at + 20)
    });
    for r in ranks {
        let (_, log) = r.stop();
        assert!(!log.contains("config limit 0=100 from seq"), "{log}");
    }
}

#[test]
fn another_uid_is_refused() {
    let dir = scratch("uid");
    let s = Server::start(&dir, &[]);
    let as_other = || {
        let out = Command::new(SERVE)
            .args(["as-uid", "65534"])
            .arg(s.socket())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // As created, the file modes keep it out.
    let out = as_other();
    assert!(out.contains("Permission denied"), "{out}");
    // Let it reach the socket: the server itself must refuse it.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(s.socket(), std::fs::Permissions::from_mode(0o666)).unwrap();
    for _ in 0..2 {
        let out = as_other();
        assert_eq!(out, "refused: uid 65534 is not the owner\n");
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    // The owner (root here) still gets answers.
    assert!(s.hook("net/complete").is_some());
    let (_, log) = s.stop();
    assert_eq!(
        log.matches("refused a client of uid 65534").count(),
        1,
        "logged once:\n{log}"
    );
}

#[test]
fn control_off_makes_no_socket_and_stale_sockets_go() {
    let dir = scratch("off");
    let s = Server::start(&dir, &[("NCCL_BPF_CONTROL", "0")]);
    assert!(!s.socket().exists());
    let e = ncclbpf_control::request_in(&dir, s.pid, &Request::Status, WAIT).unwrap_err();
    assert!(e.to_string().contains("has no control socket"), "{e}");
    let (_, log) = s.stop();
    assert!(
        log.contains("control socket off (NCCL_BPF_CONTROL=0)"),
        "{log}"
    );

    // A socket left by a process that is gone is removed by the next one.
    let stale = ncclbpf_control::socket_path_in(&dir, 999_999_999);
    std::fs::write(&stale, "").unwrap();
    let s = Server::start(&dir, &[]);
    assert!(s.socket().exists());
    assert!(!stale.exists(), "stale socket left");
    // A process killed by a signal leaves its socket; the next process removes it.
    let killed = s.socket();
    drop(s);
    assert!(killed.exists());
    let s = Server::start(&dir, &[]);
    assert!(!killed.exists());
    s.stop();
}

#[test]
fn many_reloads_under_traffic_free_every_old_version() {
    let dir = scratch("many");
    let objs = scratch("many-objects");
    let v2 = fixture("net_stats_v2", &objs);
    let v1 = shipped("src/net_stats.o");
    let s = Server::start(&dir, &[]);
    let mut last = s.counted();
    for round in 0..40u64 {
        let obj = if round % 2 == 0 { &v2 } else { &v1 };
        let r = s.reload(obj);
        assert_eq!(r.result, Ok(()), "round {round}: {}", r.to_text());
        assert_eq!(swapped(&r, "net/complete").generation, round + 2);
        let now = s.counted();
        assert!(
            now >= last,
            "round {round}: counts went back from {last} to {now}"
        );
        last = now;
    }
    grows(&s, "counts grow after 40 reloads");
    // complete, close and isend (attached by v2, kept since) are all that is left alive.
    eventually("every replaced version is freed", || s.process() == (41, 3));
    let (moved, _) = s.stop();
    assert!(moved > 0);
}
