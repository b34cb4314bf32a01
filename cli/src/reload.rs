//! `ncclbpf reload PID...|--all OBJECT`, `ncclbpf config --at-seq N PID...|--all MAP K=V...` and
//! the control-socket half of `ncclbpf status`: ask running processes, through their control
//! sockets (`<registry dir>/<pid>.ctl`), to swap in an object's net programs (or stage its tuner
//! program at a sequence number), to stage new values for a config map at a sequence number, or
//! to say what runs at each net hook ([`status_answers`], [`status_text`], [`status_json`];
//! `crate::status` adds the connections it reads from shared memory). Staging is all or nothing
//! over the processes ([`stage_in`], [`config_in`]).
//!
//! One verdict per process. `reload` and `config` exit 0 if every process accepted, 1 if any
//! rejected the object or the update (its programs kept running; a stage is withdrawn from the
//! others), 2 on a usage error or a process that could not be asked (no such process, no socket,
//! refused connection); 2 wins over 1. `--json` prints one JSON document instead.
//!
//! Self-contained (it uses only `ncclbpf_control` and `shared_maps`), to be wired into the
//! command line as, for example:
//!
//! ```text
//! Reload { pids: Vec<u32>, #[arg(long)] all: bool, object: PathBuf, #[arg(long)] json: bool }
//!     => match reload::Targets::new(pids, all) {
//!            Ok(t) => reload::run(&t, &object, json),
//!            Err(e) => { eprintln!("ncclbpf reload: {e}"); ExitCode::from(reload::FAILED) }
//!        }
//! ```

use ncclbpf_control::{ClientError, Item, ProgramInfo, Reply, Request, Swap};
use std::fmt::Write as _;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// Every process accepted (or answered).
pub const ACCEPTED: u8 = 0;
/// A process rejected the object; every hook there kept its program.
pub const REJECTED: u8 = 1;
/// Usage error, or a process that could not be asked.
pub const FAILED: u8 = 2;

/// How long a process may take to answer a reload (it verifies and compiles first).
pub const RELOAD_TIMEOUT: Duration = Duration::from_secs(120);
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(10);

/// Which processes to ask.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Targets {
    Pids(Vec<u32>),
    /// Every process with a control socket in the registry dir that is alive.
    All,
}

impl Targets {
    /// From the command line: some pids, or `--all`; not both, not neither.
    pub fn new(pids: Vec<u32>, all: bool) -> Result<Targets, String> {
        match (pids.is_empty(), all) {
            (true, true) => Ok(Targets::All),
            (false, false) => Ok(Targets::Pids(pids)),
            (false, true) => Err("give process ids or --all, not both".into()),
            (true, false) => Err("give the process ids to ask, or --all".into()),
        }
    }
}

/// Where `--at-seq` puts a tuner switch: at decision N of every communicator, or M decisions
/// after the highest count any communicator of the targets has now (`+M`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtSeq {
    At(u64),
    After(u64),
}

impl std::str::FromStr for AtSeq {
    type Err = String;
    fn from_str(v: &str) -> Result<AtSeq, String> {
        let (rel, n) = match v.strip_prefix('+') {
            Some(n) => (true, n),
            None => (false, v),
        };
        let n: u64 = n.parse().map_err(|_| {
            format!("{v:?} is not a sequence number (N, or +M for M after the highest now)")
        })?;
        if n == 0 {
            return Err("sequence numbers start at 1 (and +0 would be now)".into());
        }
        Ok(if rel { AtSeq::After(n) } else { AtSeq::At(n) })
    }
}

/// `ncclbpf reload`: prints to stdout, usage errors to stderr.
pub fn run(targets: &Targets, object: &Path, at: Option<AtSeq>, json: bool) -> ExitCode {
    let dir = shared_maps::registry_dir();
    let mut out = std::io::stdout().lock();
    ExitCode::from(match at {
        None => run_in(&dir, targets, object, json, &mut out),
        Some(at) => stage_in(&dir, targets, object, at, json, &mut out),
    })
}

/// `ncclbpf reload --at-seq`: stages the object's tuner program in every process (and swaps
/// its net programs there now); if any process refuses, withdraws the stage from those that
/// accepted, so that either every process switches at the same sequence number or none does.
pub fn stage_in(
    dir: &Path,
    targets: &Targets,
    object: &Path,
    at: AtSeq,
    json: bool,
    out: &mut dyn Write,
) -> u8 {
    let Some((pids, object)) = targets_and_object(dir, targets, object) else {
        return FAILED;
    };
    stage_everywhere(dir, &pids, &Change::Program(object), at, json, out)
}

/// `ncclbpf config --at-seq`: prints to stdout, usage errors to stderr.
pub fn config(args: &ConfigArgs, at: AtSeq, json: bool) -> ExitCode {
    let dir = shared_maps::registry_dir();
    let mut out = std::io::stdout().lock();
    let ConfigArgs {
        targets,
        map,
        values,
    } = args;
    ExitCode::from(config_in(&dir, targets, map, values, at, json, &mut out))
}

/// What `ncclbpf config` was asked to do ([`config_args`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigArgs {
    pub targets: Targets,
    pub map: String,
    pub values: Vec<(u32, u64)>,
}

/// The arguments of `ncclbpf config` after its options: `PID... MAP K=V [K=V...]` (`--all`: no
/// pids). The pairs are the trailing arguments with `=`, the map the one before them.
pub fn config_args(args: &[String], all: bool) -> Result<ConfigArgs, String> {
    let first_pair = args
        .iter()
        .rposition(|a| !a.contains('='))
        .map_or(0, |i| i + 1);
    let (head, pairs) = args.split_at(first_pair);
    let Some((map, pids)) = head.split_last() else {
        return Err("give the config map, then its new values as ENTRY=VALUE".into());
    };
    if pairs.is_empty() {
        return Err(format!(
            "no values after config map '{map}': give them last, as ENTRY=VALUE (e.g. 0=100)"
        ));
    }
    let values = pairs
        .iter()
        .map(|p| ncclbpf_control::protocol::parse_config_pair(p))
        .collect::<Result<Vec<_>, _>>()?;
    ncclbpf_control::protocol::check_config(map, &values)?;
    let pids = pids
        .iter()
        .map(|p| p.parse().map_err(|_| format!("{p:?} is not a process id")))
        .collect::<Result<Vec<u32>, String>>()?;
    Ok(ConfigArgs {
        targets: Targets::new(pids, all)?,
        map: map.clone(),
        values,
    })
}

/// [`config`] with the registry dir and the output given (tests): stages new values for a
/// config map in every process, all or none, as [`stage_in`] does a tuner program.
pub fn config_in(
    dir: &Path,
    targets: &Targets,
    map: &str,
    values: &[(u32, u64)],
    at: AtSeq,
    json: bool,
    out: &mut dyn Write,
) -> u8 {
    if let Err(e) = ncclbpf_control::protocol::check_config(map, values) {
        eprintln!("ncclbpf config: {e}");
        return FAILED;
    }
    let pids = match pids_in(dir, targets) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("ncclbpf config: {e}");
            return FAILED;
        }
    };
    let change = Change::Config {
        map: map.to_string(),
        values: values.to_vec(),
    };
    stage_everywhere(dir, &pids, &change, at, json, out)
}

/// What is staged at one sequence number of every communicator, in every process.
enum Change {
    /// An object's tuner program (`reload --at-seq`).
    Program(PathBuf),
    /// New values for entries of a config map (`config --at-seq`).
    Config {
        map: String,
        values: Vec<(u32, u64)>,
    },
}

impl Change {
    /// The command, for messages.
    fn command(&self) -> &'static str {
        match self {
            Change::Program(_) => "reload",
            Change::Config { .. } => "config",
        }
    }

    fn request(&self, at: u64) -> Request {
        match self {
            Change::Program(path) => Request::Stage {
                at,
                path: path.clone(),
            },
            Change::Config { map, values } => Request::StageConfig {
                at,
                map: map.clone(),
                values: values.clone(),
            },
        }
    }

    /// The first line of the text output.
    fn head(&self, at: u64) -> String {
        match self {
            Change::Program(_) => format!("tuner switch at seq {at} of every communicator"),
            Change::Config { map, values } => format!(
                "config {map} {} from seq {at} of every communicator",
                pairs_text(values)
            ),
        }
    }

    /// What a process that kept its stage does alone, and what would make the others do it.
    fn alone(&self, at: u64) -> (String, &'static str) {
        match self {
            Change::Program(_) => (format!("switches at seq {at}"), "stage the same program"),
            Change::Config { map, .. } => (
                format!("takes the new values of '{map}' at seq {at}"),
                "stage the same values",
            ),
        }
    }

    /// The JSON key and document of the processes' answers.
    fn answers_json(
        &self,
        answers: &[(u32, Result<Reply, ClientError>)],
    ) -> (&'static str, String) {
        match self {
            Change::Program(path) => ("reload", reload_json(path, answers)),
            Change::Config { map, values } => {
                let procs: Vec<String> = answers
                    .iter()
                    .map(|(pid, a)| answer_json(*pid, a, ["accepted", "rejected"]))
                    .collect();
                (
                    "config",
                    format!(
                        "{{\"map\":{},\"values\":{},\"processes\":[{}]}}",
                        js(map),
                        values_json(values),
                        procs.join(",")
                    ),
                )
            }
        }
    }
}

/// Stages `change` in every process of `pids` at `at`; if any process refuses (or cannot be
/// asked), withdraws it (`unstage`) from those that accepted, so that either every process
/// makes the change at the same sequence number or none does.
fn stage_everywhere(
    dir: &Path,
    pids: &[u32],
    change: &Change,
    at: AtSeq,
    json: bool,
    out: &mut dyn Write,
) -> u8 {
    let cmd = change.command();
    let n = match at {
        AtSeq::At(n) => n,
        AtSeq::After(m) => {
            let answers = ask_all(dir, pids, &Request::Status, STATUS_TIMEOUT);
            let mut highest = 0u64;
            for (pid, a) in &answers {
                match a {
                    Ok(r) => {
                        for i in &r.items {
                            if let Item::Comm { seq, .. } = i {
                                highest = highest.max(*seq);
                            }
                        }
                    }
                    Err(e) => {
                        eprintln!("ncclbpf {cmd}: pid {pid}: not asked: {e}; nothing was staged");
                        return FAILED;
                    }
                }
            }
            highest.saturating_add(m)
        }
    };
    let answers = ask_all(dir, pids, &change.request(n), RELOAD_TIMEOUT);
    let accepted: Vec<u32> = answers
        .iter()
        .filter(|(_, a)| matches!(a, Ok(r) if r.result.is_ok()))
        .map(|(p, _)| *p)
        .collect();
    let mut code = exit_code(&answers);
    // All or none: withdraw from those that accepted when another did not.
    let withdrawn = if code != ACCEPTED && !accepted.is_empty() {
        let back = ask_all(dir, &accepted, &Request::Unstage, STATUS_TIMEOUT);
        if back
            .iter()
            .any(|(_, a)| !matches!(a, Ok(r) if r.result.is_ok()))
        {
            code = code.max(REJECTED);
        }
        back
    } else {
        vec![]
    };
    let text = if json {
        let w: Vec<String> = withdrawn
            .iter()
            .map(|(pid, a)| answer_json(*pid, a, ["withdrawn", "not_withdrawn"]))
            .collect();
        let (key, body) = change.answers_json(&answers);
        format!(
            "{{\"at_seq\":{n},\"{key}\":{},\"withdrawn\":[{}]}}\n",
            body.trim_end(),
            w.join(",")
        )
    } else {
        let mut s = change.head(n);
        s.push('\n');
        s.push_str(&reload_text(&answers));
        let (alone, fix) = change.alone(n);
        for (pid, a) in &withdrawn {
            let _ = match a {
                Ok(r) if r.result.is_ok() => {
                    writeln!(s, "pid {pid}: stage withdrawn (another process refused)")
                }
                Ok(r) => writeln!(
                    s,
                    "pid {pid}: INCONSISTENT: the stage could not be withdrawn: {}; this process {alone} and the others do not: stop the job or {fix} on the others",
                    r.result.as_ref().err().map_or("", |e| e.as_str())
                ),
                Err(e) => writeln!(
                    s,
                    "pid {pid}: INCONSISTENT: not asked to withdraw the stage ({e}); it {alone} and the others do not"
                ),
            };
        }
        s
    };
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
    code
}

/// `k=v,k=v` (decimal), as the processes log it.
fn pairs_text(values: &[(u32, u64)]) -> String {
    ncclbpf_control::protocol::config_pairs_text(values, false)
}

fn pids_in(dir: &Path, targets: &Targets) -> Result<Vec<u32>, String> {
    match targets {
        Targets::Pids(p) => Ok(p.clone()),
        Targets::All => {
            let p = ncclbpf_control::live_processes_in(dir)
                .map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
            if p.is_empty() {
                return Err(format!(
                    "no process with a control socket in {}",
                    dir.display()
                ));
            }
            Ok(p)
        }
    }
}

/// Asks every process at once (so they swap at nearly the same time), answers in pid order.
fn ask_all(
    dir: &Path,
    pids: &[u32],
    req: &Request,
    timeout: Duration,
) -> Vec<(u32, Result<Reply, ClientError>)> {
    std::thread::scope(|s| {
        let asks: Vec<_> = pids
            .iter()
            .map(|&pid| s.spawn(move || (pid, ncclbpf_control::request_in(dir, pid, req, timeout))))
            .collect();
        asks.into_iter()
            .zip(pids)
            .map(|(h, &pid)| {
                h.join().unwrap_or_else(|_| {
                    (
                        pid,
                        Err(ClientError::Protocol("the request panicked".into())),
                    )
                })
            })
            .collect()
    })
}

/// The exit status over every process's answer: the worst of accepted (0), rejected (1), not
/// asked (2).
fn exit_code(answers: &[(u32, Result<Reply, ClientError>)]) -> u8 {
    answers
        .iter()
        .map(|(_, a)| match a {
            Ok(r) if r.result.is_ok() => ACCEPTED,
            Ok(_) => REJECTED,
            Err(_) => FAILED,
        })
        .max()
        .unwrap_or(ACCEPTED)
}

/// The processes to ask and the object's absolute path (each process resolves a path from its
/// own working directory); `None` after saying why on stderr.
fn targets_and_object(dir: &Path, targets: &Targets, object: &Path) -> Option<(Vec<u32>, PathBuf)> {
    let pids = pids_in(dir, targets)
        .map_err(|e| eprintln!("ncclbpf reload: {e}"))
        .ok()?;
    let object = std::path::absolute(object)
        .map_err(|e| eprintln!("ncclbpf reload: {}: {e}", object.display()))
        .ok()?;
    Some((pids, object))
}

/// [`run`] with the registry dir and the output given (tests).
pub fn run_in(dir: &Path, targets: &Targets, object: &Path, json: bool, out: &mut dyn Write) -> u8 {
    let Some((pids, object)) = targets_and_object(dir, targets, object) else {
        return FAILED;
    };
    let answers = ask_all(dir, &pids, &Request::Reload(object.clone()), RELOAD_TIMEOUT);
    let code = exit_code(&answers);
    let text = if json {
        reload_json(&object, &answers)
    } else {
        reload_text(&answers)
    };
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
    code
}

/// Asks every process of `pids` (sockets in `dir`) what runs at its hooks, each answer within
/// `timeout`; answers in pid order.
pub fn status_answers(
    dir: &Path,
    pids: &[u32],
    timeout: Duration,
) -> Vec<(u32, Result<Reply, ClientError>)> {
    ask_all(dir, pids, &Request::Status, timeout)
}

// ---------------------------------------------------------------- text

fn us(d: Duration) -> String {
    let v = d.as_secs_f64() * 1e6;
    if v < 10.0 {
        format!("{v:.3} µs")
    } else {
        format!("{v:.1} µs")
    }
}

/// `text`, every line indented by `pad`.
fn indent(s: &mut String, pad: &str, text: &str) {
    for l in text.lines() {
        let _ = writeln!(s, "{pad}{l}");
    }
}

fn swap_text(s: &mut String, w: &Swap) {
    let from = match &w.old {
        Some((old, g)) => format!("{old} (gen {g}) -> {} (gen {})", w.new, w.generation),
        None => format!(
            "attached {} (gen {}); it had no program",
            w.new, w.generation
        ),
    };
    let _ = writeln!(
        s,
        "  {}: {from}, {} insns; verify {}, compile {}, swap {}",
        w.section,
        w.insns,
        us(w.verify),
        us(w.compile),
        us(w.swap)
    );
}

fn item_text(s: &mut String, i: &Item) {
    match i {
        Item::Swapped(w) => swap_text(s, w),
        Item::Refused {
            section,
            name,
            reason,
        } => {
            let _ = writeln!(s, "  {section} {name}: refused: {reason}");
        }
        Item::Ignored {
            section,
            name,
            reason,
        } => {
            let _ = writeln!(s, "  {section} {name}: ignored: {reason}");
        }
        Item::Rejected {
            what,
            name,
            message,
        } => {
            let _ = writeln!(s, "  {what} {name}:");
            indent(s, "    ", message);
        }
        Item::Staged { section, name, at } => {
            let _ = writeln!(
                s,
                "  {section} {name}: staged: makes every communicator's decisions from seq {at} on"
            );
        }
        Item::StagedConfig { map, values, at } => {
            let _ = writeln!(
                s,
                "  config {map} {}: staged: every communicator's decisions see it from seq {at} on",
                pairs_text(values)
            );
        }
        Item::Comm { id, seq, switch_at } => {
            let _ = match switch_at {
                Some(a) => writeln!(s, "  comm {id:#018x}: seq {seq}, switches at seq {a}"),
                None => writeln!(s, "  comm {id:#018x}: seq {seq}"),
            };
        }
        Item::Process { .. } | Item::Hook { .. } => {}
        Item::Other(l) => {
            let _ = writeln!(s, "  {l}");
        }
    }
}

fn reload_text(answers: &[(u32, Result<Reply, ClientError>)]) -> String {
    let mut s = String::new();
    for (pid, a) in answers {
        match a {
            Ok(r) => {
                match &r.result {
                    Ok(()) => {
                        let g = r.items.iter().find_map(|i| match i {
                            Item::Swapped(w) => Some(w.generation),
                            _ => None,
                        });
                        let _ = match g {
                            Some(g) => writeln!(s, "pid {pid}: accepted (net generation {g})"),
                            None => writeln!(s, "pid {pid}: accepted"),
                        };
                    }
                    Err(e) => {
                        let _ = writeln!(s, "pid {pid}: rejected: {e}");
                    }
                }
                for i in &r.items {
                    item_text(&mut s, i);
                }
            }
            Err(e) => {
                let _ = writeln!(s, "pid {pid}: not asked: {e}");
            }
        }
    }
    if answers.len() > 1 {
        let ok = answers
            .iter()
            .filter(|(_, a)| matches!(a, Ok(r) if r.result.is_ok()))
            .count();
        let _ = writeln!(s, "{ok} of {} processes accepted", answers.len());
    }
    s
}

/// One process's answer to `status` as text: its head line (`pid N: …`), then its hooks,
/// communicators and staged changes, indented.
pub fn status_text(pid: u32, a: &Result<Reply, ClientError>) -> String {
    let mut s = String::new();
    let r = match a {
        Ok(r) => r,
        Err(e) => {
            let _ = writeln!(s, "pid {pid}: not asked: {e}");
            return s;
        }
    };
    let head = r.items.iter().find_map(|i| match i {
        Item::Process {
            generation,
            live_programs,
            ..
        } => Some(format!(
            "net generation {generation}, {live_programs} program(s) alive"
        )),
        _ => None,
    });
    match &r.result {
        Ok(()) => {
            let _ = writeln!(s, "pid {pid}: {}", head.unwrap_or_default());
        }
        Err(e) => {
            let _ = writeln!(s, "pid {pid}: error: {e}");
        }
    }
    for i in &r.items {
        match i {
            Item::Hook {
                section,
                program: None,
            } => {
                let _ = writeln!(s, "  {section:<13} -");
            }
            Item::Hook {
                section,
                program: Some(p),
            } => {
                let _ = writeln!(
                    s,
                    "  {section:<13} {}  gen {}  {} insns  tag {}  {}  {}",
                    p.name, p.generation, p.insns, p.tag, p.tier, p.source
                );
            }
            other => item_text(&mut s, other),
        }
    }
    s
}

// ---------------------------------------------------------------- JSON

/// A JSON string literal.
fn js(v: &str) -> String {
    let mut s = String::with_capacity(v.len() + 2);
    s.push('"');
    for c in v.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\r' => s.push_str("\\r"),
            '\t' => s.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(s, "\\u{:04x}", c as u32);
            }
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

fn jopt(v: Option<&str>) -> String {
    v.map_or("null".into(), js)
}

fn jus(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e6)
}

fn program_json(p: &ProgramInfo) -> String {
    format!(
        "{{\"name\":{},\"generation\":{},\"insns\":{},\"tag\":{},\"tier\":{},\"source\":{}}}",
        js(&p.name),
        p.generation,
        p.insns,
        js(&p.tag),
        js(&p.tier),
        js(&p.source)
    )
}

fn item_json(i: &Item) -> String {
    match i {
        Item::Process {
            pid,
            generation,
            live_programs,
        } => format!(
            "{{\"kind\":\"process\",\"pid\":{pid},\"generation\":{generation},\"live_programs\":{live_programs}}}"
        ),
        Item::Hook { section, program } => format!(
            "{{\"kind\":\"hook\",\"section\":{},\"program\":{}}}",
            js(section),
            program.as_ref().map_or("null".into(), program_json)
        ),
        Item::Swapped(w) => format!(
            "{{\"kind\":\"swapped\",\"section\":{},\"old\":{},\"old_generation\":{},\"new\":{},\"generation\":{},\"insns\":{},\"verify_us\":{},\"compile_us\":{},\"swap_us\":{}}}",
            js(&w.section),
            jopt(w.old.as_ref().map(|o| o.0.as_str())),
            w.old.as_ref().map_or("null".into(), |o| o.1.to_string()),
            js(&w.new),
            w.generation,
            w.insns,
            jus(w.verify),
            jus(w.compile),
            jus(w.swap)
        ),
        Item::Refused {
            section,
            name,
            reason,
        } => format!(
            "{{\"kind\":\"refused\",\"section\":{},\"name\":{},\"reason\":{}}}",
            js(section),
            js(name),
            js(reason)
        ),
        Item::Ignored {
            section,
            name,
            reason,
        } => format!(
            "{{\"kind\":\"ignored\",\"section\":{},\"name\":{},\"reason\":{}}}",
            js(section),
            js(name),
            js(reason)
        ),
        Item::Rejected {
            what,
            name,
            message,
        } => format!(
            "{{\"kind\":\"rejected\",\"what\":{},\"name\":{},\"message\":{}}}",
            js(what),
            js(name),
            js(message)
        ),
        Item::Staged { section, name, at } => format!(
            "{{\"kind\":\"staged\",\"section\":{},\"name\":{},\"at\":{at}}}",
            js(section),
            js(name)
        ),
        Item::StagedConfig { map, values, at } => format!(
            "{{\"kind\":\"staged\",\"section\":\"config\",\"name\":{},\"values\":{},\"at\":{at}}}",
            js(map),
            values_json(values)
        ),
        Item::Comm { id, seq, switch_at } => format!(
            "{{\"kind\":\"comm\",\"comm_id\":\"{id:#018x}\",\"seq\":{seq},\"switch_at\":{}}}",
            switch_at.map_or("null".into(), |a| a.to_string())
        ),
        Item::Other(l) => format!("{{\"kind\":\"other\",\"line\":{}}}", js(l)),
    }
}

/// `[{"key":K,"value":V},...]`.
fn values_json(values: &[(u32, u64)]) -> String {
    let kv: Vec<String> = values
        .iter()
        .map(|(k, v)| format!("{{\"key\":{k},\"value\":{v}}}"))
        .collect();
    format!("[{}]", kv.join(","))
}

/// One process's answer: verdict, error, items.
fn answer_json(pid: u32, a: &Result<Reply, ClientError>, words: [&str; 2]) -> String {
    let (verdict, error, items) = match a {
        Ok(r) => (
            match &r.result {
                Ok(()) => words[0],
                Err(_) => words[1],
            },
            r.result.as_ref().err().map(|e| js(e)),
            r.items.iter().map(item_json).collect::<Vec<_>>(),
        ),
        Err(e) => ("not_asked", Some(js(&e.to_string())), vec![]),
    };
    format!(
        "{{\"pid\":{pid},\"verdict\":\"{verdict}\",\"error\":{},\"items\":[{}]}}",
        error.unwrap_or_else(|| "null".into()),
        items.join(",")
    )
}

fn reload_json(object: &Path, answers: &[(u32, Result<Reply, ClientError>)]) -> String {
    let procs: Vec<String> = answers
        .iter()
        .map(|(pid, a)| answer_json(*pid, a, ["accepted", "rejected"]))
        .collect();
    format!(
        "{{\"object\":{},\"processes\":[{}]}}\n",
        js(&object.to_string_lossy()),
        procs.join(",")
    )
}

/// One process's answer to `status` as a JSON object: `{"pid", "verdict": "ok" | "error" |
/// "not_asked", "error", "items": [...]}`.
pub fn status_json(pid: u32, a: &Result<Reply, ClientError>) -> String {
    answer_json(pid, a, ["ok", "error"])
}
