//! NCCL's env plugin (`ncclEnvPlugin_v1`, `v2`): NCCL asks it for every setting it reads.
//!
//! Each name is answered from the process environment at the time of the call, then from the
//! settings file named by `NCCL_BPF_ENV_FILE` (read once at init, strictly parsed, ignored as
//! a whole if anything in it is wrong), then from the few defaults the transport needs, else
//! NULL. The first time the file or a default answers a name, one INFO line says so.
//!
//! * [`file`]: the file format and its parser.
//! * [`defaults`]: the defaults (`NCCL_NET_PLUGIN`) and their switch.
//! * [`settings`]: the file's settings and the defaults, fixed at init.
//! * [`lookup`]: the order of sources.
//! * [`intern`]: the graveyard that keeps every returned string alive.
//! * [`report`]: log lines, and the thread that logs `getEnv`'s.
//!
//! This module holds the process's one instance of it all, for the adapters of the plugin
//! library (`plugin/src/env.rs`). Nothing here ever fails NCCL: `init` always succeeds.

pub mod defaults;
pub mod file;
pub mod intern;
pub mod lookup;
pub mod report;
pub mod settings;

use intern::Interner;
use lookup::Source;
use ncclnet_headers::{LogLevel, LogSubsys};
use report::{Deferred, Level};
use settings::Settings;
use std::ffi::{CStr, c_char};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The prefix of every line in NCCL's log.
pub const PREFIX: &str = "ENV/BPF";

/// The file's settings and the defaults, from the first `init` on.
static SETTINGS: OnceLock<Settings> = OnceLock::new();
/// Before `init`: the environment only.
static NOTHING: OnceLock<Settings> = OnceLock::new();
static KEPT: Interner = Interner::new();
static LOG: Deferred = Deferred::waiting_for(emit, ncclnet_headers::log::has_logger);
static STATS: Stats = Stats::new();

/// Counts for the summary at finalize.
struct Stats {
    env: AtomicU64,
    file: AtomicU64,
    default: AtomicU64,
    unset: AtomicU64,
    null_names: AtomicU64,
    null_reported: AtomicBool,
}

impl Stats {
    const fn new() -> Stats {
        Stats {
            env: AtomicU64::new(0),
            file: AtomicU64::new(0),
            default: AtomicU64::new(0),
            unset: AtomicU64::new(0),
            null_names: AtomicU64::new(0),
            null_reported: AtomicBool::new(false),
        }
    }

    fn count(&self, s: Source) {
        let c = match s {
            Source::Env => &self.env,
            Source::File => &self.file,
            Source::Default => &self.default,
            Source::Unset => &self.unset,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// Sends a line to NCCL's logger (the one `init` v2 gave, or the library's; see
/// [`ncclnet_headers::log`]).
fn emit(level: Level, msg: &str) {
    let level = match level {
        Level::Info => LogLevel::INFO,
        Level::Warn => LogLevel::WARN,
    };
    ncclnet_headers::log::log(PREFIX, level, LogSubsys::ENV, file!(), line!(), msg);
}

/// What NCCL says about itself in `init`.
pub struct Caller<'a> {
    pub major: u8,
    pub minor: u8,
    pub patch: u8,
    pub suffix: &'a str,
    /// The env ABI version the call came through (1 or 2).
    pub abi: u8,
}

/// `init`: loads the settings (once per process; a second `init` keeps the first's) and logs
/// what it found, on the calling thread.
pub fn init(caller: &Caller) {
    let banner = format!(
        "init (NCCL {}.{}.{}{}, env v{})",
        caller.major, caller.minor, caller.patch, caller.suffix, caller.abi
    );
    // The lines are logged after the settings are published, not while `SETTINGS` is being
    // initialised: a logger that asked getEnv back would get the settings, not wait for them.
    let mut lines = None;
    SETTINGS.get_or_init(|| {
        let loaded = settings::load(
            &|name| std::env::var_os(name),
            defaults::own_library,
            &banner,
            (caller.major, caller.minor),
        );
        lines = Some(loaded.lines);
        loaded.settings
    });
    // NCCL gives a v1 env plugin no logger and loads it before the net plugin that gets one:
    // without a logger yet, the lines wait in the log queue for it.
    let say = |level: Level, msg: String| {
        if ncclnet_headers::log::has_logger() {
            emit(level, &msg)
        } else {
            LOG.push(level, msg)
        }
    };
    match lines {
        Some(lines) => lines.into_iter().for_each(|(level, msg)| say(level, msg)),
        None => say(
            Level::Info,
            format!("{banner}: already initialised, keeping the settings read first"),
        ),
    }
    LOG.flush();
}

/// `getEnv`: the value for `name` (NULL for `None`), valid for the rest of the process.
/// Never calls NCCL's logger (see [`report`]).
pub fn get_env(name: Option<&CStr>) -> *const c_char {
    let Some(name) = name else {
        STATS.null_names.fetch_add(1, Ordering::Relaxed);
        if !STATS.null_reported.swap(true, Ordering::AcqRel) {
            LOG.push(
                Level::Warn,
                "getEnv called with a NULL name: answered NULL (said once, counted at finalize)"
                    .into(),
            );
        }
        return std::ptr::null();
    };
    let settings = SETTINGS
        .get()
        .unwrap_or_else(|| NOTHING.get_or_init(Settings::none));
    let answer = lookup::lookup(name, settings, &KEPT, lookup::process_env);
    STATS.count(answer.source);
    if let Some(line) = answer.supplied {
        LOG.push(Level::Info, line);
    }
    answer.value.map_or(std::ptr::null(), CStr::as_ptr)
}

/// Queues a line for NCCL's log from a place where the logger must not be called (the
/// adapters' panic handlers in `getEnv`).
pub fn later(level: Level, msg: String) {
    LOG.push(level, msg);
}

/// `finalize`: logs what is still queued and a summary. Frees nothing (every returned string
/// stays valid) and holds no lock another call waits on; `getEnv` keeps answering afterwards.
pub fn finalize() {
    LOG.flush();
    let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let s = &STATS;
    let nulls = n(&s.null_names);
    emit(
        Level::Info,
        &format!(
            "finalize: {} lookups: {} from the environment, {} from the file, {} defaults, {} unset{}; {} values kept",
            n(&s.env) + n(&s.file) + n(&s.default) + n(&s.unset),
            n(&s.env),
            n(&s.file),
            n(&s.default),
            n(&s.unset),
            if nulls > 0 {
                format!(", {nulls} NULL names")
            } else {
                String::new()
            },
            KEPT.kept(),
        ),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::Barrier;
    use std::sync::atomic::AtomicUsize;

    fn read(p: *const c_char) -> Option<String> {
        // SAFETY: get_env returns NULL or a kept NUL-terminated string.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_string())
    }

    #[test]
    fn null_name_is_null() {
        assert!(get_env(None).is_null());
        assert!(get_env(None).is_null());
        assert!(STATS.null_names.load(Ordering::Relaxed) >= 2);
        assert!(STATS.null_reported.load(Ordering::Relaxed));
    }

    /// Many threads ask for the same and different names while one of them keeps changing:
    /// every answer is one of the values it was set to (or unset), every value set is seen,
    /// and every address returned still reads its value after all the changes.
    #[test]
    fn concurrent_lookups_while_the_environment_changes() {
        const CHANGING: &str = "NCCLBPF_ENV_TEST_CONCURRENT";
        const STEADY: &str = "NCCLBPF_ENV_TEST_STEADY";
        let values: Vec<String> = (0..8)
            .map(|i| format!("value-{i}-{}", "x".repeat(i * 7)))
            .collect();
        // SAFETY: this test's own variables; every reader goes through std's environment lock.
        unsafe { std::env::set_var(STEADY, "steady") };
        let threads = 8;
        let reads = AtomicUsize::new(0);
        let done = AtomicBool::new(false);
        let start = Barrier::new(threads + 1);
        let answers: Vec<Vec<(usize, String)>> = std::thread::scope(|s| {
            let readers: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| {
                        start.wait();
                        let mut kept = Vec::new();
                        while !done.load(Ordering::Acquire) {
                            let p = get_env(Some(c"NCCLBPF_ENV_TEST_CONCURRENT"));
                            kept.push(p as usize);
                            assert_eq!(
                                read(get_env(Some(c"NCCLBPF_ENV_TEST_STEADY"))).as_deref(),
                                Some("steady")
                            );
                            assert!(get_env(Some(c"NCCLBPF_ENV_TEST_NEVER_SET")).is_null());
                            reads.fetch_add(1, Ordering::AcqRel);
                        }
                        // Read every address back after all the changes.
                        kept.into_iter()
                            .filter(|&p| p != 0)
                            .map(|p| (p, read(p as *const c_char).unwrap()))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            start.wait();
            for r in 0..200 {
                match r % 9 {
                    // SAFETY: as above.
                    8 => unsafe { std::env::remove_var(CHANGING) },
                    // SAFETY: as above.
                    i => unsafe { std::env::set_var(CHANGING, &values[i]) },
                }
                // Two more reads than threads: some reader made a whole lookup after the change.
                let from = reads.load(Ordering::Acquire);
                while reads.load(Ordering::Acquire) < from + 2 * threads + 1 {
                    std::thread::yield_now();
                }
            }
            done.store(true, Ordering::Release);
            readers.into_iter().map(|r| r.join().unwrap()).collect()
        });
        let allowed: HashSet<&str> = values.iter().map(String::as_str).collect();
        let mut seen = HashSet::new();
        for (p, v) in answers.iter().flatten() {
            assert!(allowed.contains(v.as_str()), "answer {v:?} was never set");
            seen.insert((*p, v.clone()));
        }
        let distinct: HashSet<&str> = seen.iter().map(|(_, v)| v.as_str()).collect();
        assert_eq!(distinct, allowed, "every value set was answered");
        // One address per distinct value: the graveyard holds one copy of each.
        let addrs: HashSet<usize> = seen.iter().map(|(p, _)| *p).collect();
        assert_eq!(addrs.len(), values.len());
        assert_eq!(seen.len(), values.len());
        // SAFETY: as above.
        unsafe {
            std::env::remove_var(CHANGING);
            std::env::remove_var(STEADY);
        }
    }

    #[test]
    fn finalize_while_others_ask_then_answers_continue() {
        // SAFETY: this test's own variable; readers go through std's environment lock.
        unsafe { std::env::set_var("NCCLBPF_ENV_TEST_FINALIZE", "on") };
        let before = get_env(Some(c"NCCLBPF_ENV_TEST_FINALIZE"));
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..5000 {
                        let v = read(get_env(Some(c"NCCLBPF_ENV_TEST_FINALIZE")));
                        assert_eq!(v.as_deref(), Some("on"));
                    }
                });
            }
            for _ in 0..20 {
                finalize();
            }
        });
        // Still answered, at the same address, and the old pointer still reads.
        assert_eq!(get_env(Some(c"NCCLBPF_ENV_TEST_FINALIZE")), before);
        assert_eq!(read(before).as_deref(), Some("on"));
        // SAFETY: as above.
        unsafe { std::env::remove_var("NCCLBPF_ENV_TEST_FINALIZE") };
    }
}
