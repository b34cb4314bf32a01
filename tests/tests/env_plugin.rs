//! The env plugin (`ncclEnvPlugin_v1`, `v2`) loaded and called as NCCL does: from C
//! (`csrc/env_caller.c`, NCCL's own struct definitions), after `dlopen(RTLD_NOW | RTLD_LOCAL)`
//! of the built library. The plugin reads its settings once per process, so every case runs
//! in a child process of its own, with the environment it needs.

use ncclbpf_harness::{log_text, plugin_path};
use ncclnet_headers::DebugLogger;
use std::ffi::{CStr, CString, OsStr, c_char, c_int, c_ulong, c_void};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

unsafe extern "C" {
    fn env_caller_load(path: *const c_char, nccl_minor: c_int) -> c_int;
    fn env_caller_handle() -> *mut c_void;
    fn env_caller_name() -> *const c_char;
    fn env_caller_slots() -> c_int;
    fn env_caller_init(
        major: u8,
        minor: u8,
        patch: u8,
        suffix: *const c_char,
        logger: DebugLogger,
    ) -> c_int;
    fn env_caller_atexit();
    fn env_caller_finalize() -> c_int;
    fn env_caller_get(name: *const c_char) -> *const c_char;
    fn env_caller_nccl_like_logger(
        level: c_int,
        flags: c_ulong,
        file: *const c_char,
        line: c_int,
        fmt: *const c_char,
        ...
    );
    fn env_caller_plugin_ready();
    fn env_caller_reset_debug();
    fn env_caller_logger_recursed() -> c_int;
    fn env_caller_logger_state(seen: *mut c_char, cap: usize) -> c_int;
    // The harness's stand-in for ncclDebugLog (csrc/logger.c); `log_text` reads what it got.
    fn harness_logger(
        level: c_int,
        flags: c_ulong,
        file: *const c_char,
        line: c_int,
        fmt: *const c_char,
        ...
    );
}

/// Whatever the tests' own environment holds of these must not reach a child.
const CLEARED: [&str; 5] = [
    "NCCL_BPF_ENV_FILE",
    "NCCL_BPF_ENV_DEFAULTS",
    "NCCL_NET_PLUGIN",
    "NCCL_BPF_LOG_STDERR",
    "NCCL_ENV_PLUGIN",
];

/// [`ncclbpf_harness::child::in_child`] with [`CLEARED`] removed.
fn in_child(name: &str, env: &[(&str, &OsStr)], body: fn()) -> Option<String> {
    ncclbpf_harness::child::in_child(name, env, &CLEARED, body)
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ncclbpf-envplugin-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A settings file for a child; it lives in the temp dir until the parent's test ends.
struct File(PathBuf);

impl File {
    fn new(tag: &str, text: &str) -> File {
        let p = std::env::temp_dir().join(format!(
            "ncclbpf-envplugin-{tag}-{}.env",
            std::process::id()
        ));
        std::fs::write(&p, text).unwrap();
        File(p)
    }

    fn os(&self) -> &OsStr {
        self.0.as_os_str()
    }
}

impl Drop for File {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

// --- the child's side: one plugin per process, called through the C loader ---------------

/// Loads the library at `path` as NCCL 2.`minor` would; returns the env ABI version picked.
fn load_from(path: &Path, minor: c_int) -> c_int {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C path; the C loader keeps the handle for the process's life.
    unsafe { env_caller_load(c.as_ptr(), minor) }
}

fn load(minor: c_int) -> c_int {
    load_from(&plugin_path(), minor)
}

fn init(major: u8, minor: u8, patch: u8, logger: DebugLogger) -> c_int {
    // SAFETY: a table was loaded (the callers assert it); the suffix is a C string literal.
    unsafe { env_caller_init(major, minor, patch, c"".as_ptr(), logger) }
}

fn logger() -> DebugLogger {
    Some(harness_logger)
}

/// `getEnv(name)` through the table: the raw pointer, as NCCL gets it.
fn get_raw(name: Option<&CStr>) -> *const c_char {
    // SAFETY: a table was loaded and initialised; `name` is a C string or NULL.
    unsafe { env_caller_get(name.map_or(std::ptr::null(), CStr::as_ptr)) }
}

fn read(p: *const c_char) -> Option<String> {
    // SAFETY: getEnv returns NULL or a NUL-terminated string the plugin keeps alive.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_string())
}

fn get(name: &str) -> Option<String> {
    let c = CString::new(name).unwrap();
    read(get_raw(Some(&c)))
}

fn finalize() -> c_int {
    // SAFETY: a table was loaded.
    unsafe { env_caller_finalize() }
}

fn expected_net_plugin() -> String {
    format!(
        "{},libnccl-net.so",
        plugin_path().canonicalize().unwrap().display()
    )
}

/// Waits (up to 10 s) until NCCL's log (the harness logger) holds `needle`.
fn wait_for_log(needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = log_text();
        if log.contains(needle) {
            return log;
        }
        assert!(
            Instant::now() < deadline,
            "no {needle:?} in the log:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn minor_from_env() -> c_int {
    std::env::var("NCCLBPF_ENV_T_MINOR")
        .unwrap()
        .parse()
        .unwrap()
}

// --- the cases --------------------------------------------------------------------------

/// NCCL 2.28 takes v1 even though v2 is there; the table is whole from C's point of view;
/// environment beats file beats default; NULL in, NULL out; finalize is registered with atexit
/// and runs at the child's exit (which must then succeed), and answers continue after it.
#[test]
fn v1_as_nccl_2_28_calls_it() {
    let f = File::new(
        "v1",
        "# for v1\nNCCLBPF_ENV_T_ENV=file loses\nNCCLBPF_ENV_T_FILE=from file\n",
    );
    in_child(
        "v1_as_nccl_2_28_calls_it",
        &[
            ("NCCL_BPF_ENV_FILE", f.os()),
            ("NCCLBPF_ENV_T_ENV", OsStr::new("from env")),
        ],
        || {
            assert_eq!(load(28), 1, "NCCL 2.28 looks up ncclEnvPlugin_v1");
            // SAFETY: loaded; the name is a static C string of the library.
            let name = unsafe { CStr::from_ptr(env_caller_name()) };
            assert_eq!(name.to_str().unwrap(), "BPF");
            // SAFETY: loaded.
            assert_eq!(unsafe { env_caller_slots() }, 0b111, "a NULL slot");
            assert_eq!(init(2, 28, 9, None), 0);
            // SAFETY: as NCCL does after init succeeded.
            unsafe { env_caller_atexit() };
            assert_eq!(get("NCCLBPF_ENV_T_ENV").as_deref(), Some("from env"));
            assert_eq!(get("NCCLBPF_ENV_T_FILE").as_deref(), Some("from file"));
            assert_eq!(get("NCCLBPF_ENV_T_NOWHERE"), None);
            assert!(get_raw(None).is_null());
            assert_eq!(get("NCCL_NET_PLUGIN"), Some(expected_net_plugin()));
            // 2.28 forgets an unloaded net plugin's name (NVIDIA/nccl#1978): kept loaded.
            assert_eq!(get("NCCL_NET_PLUGIN_REF_COUNT").as_deref(), Some("1"));
            assert_eq!(finalize(), 0);
            assert_eq!(get("NCCLBPF_ENV_T_FILE").as_deref(), Some("from file"));
        },
    );
}

/// NCCL 2.30 takes v2, which gets NCCL's logger: one INFO line at init, one the first time
/// the file or a default answers a name (and never again for it), a summary at finalize.
#[test]
fn v2_as_nccl_2_30_calls_it_and_it_logs_once_what_it_supplied() {
    let f = File::new(
        "v2",
        "NCCLBPF_ENV_T_OTHER=x\nNCCLBPF_ENV_T_FILE=from file\n",
    );
    let path = f.0.display().to_string();
    in_child(
        "v2_as_nccl_2_30_calls_it_and_it_logs_once_what_it_supplied",
        &[
            ("NCCL_BPF_ENV_FILE", f.os()),
            ("NCCLBPF_ENV_T_PATH", OsStr::new(&path)),
        ],
        || {
            let path = std::env::var("NCCLBPF_ENV_T_PATH").unwrap();
            assert_eq!(load(30), 2, "NCCL 2.30 looks up ncclEnvPlugin_v2 first");
            // SAFETY: loaded; the name is a static C string of the library.
            let name = unsafe { CStr::from_ptr(env_caller_name()) };
            assert_eq!(name.to_str().unwrap(), "BPF");
            // SAFETY: loaded.
            assert_eq!(unsafe { env_caller_slots() }, 0b111, "a NULL slot");
            assert_eq!(init(2, 30, 7, logger()), 0);
            // Level 3 (INFO), subsystem 0x80 (ENV).
            let log = log_text();
            let banner = format!(
                "ENV/BPF init (NCCL 2.30.7, env v2): settings file {path}: 2 settings; defaults: NCCL_NET_PLUGIN"
            );
            let line = log.lines().find(|l| l.ends_with(&banner));
            assert!(line.is_some_and(|l| l.starts_with("3 0x80 ")), "{log}");
            for _ in 0..50 {
                assert_eq!(get("NCCLBPF_ENV_T_FILE").as_deref(), Some("from file"));
                assert_eq!(get("NCCL_NET_PLUGIN"), Some(expected_net_plugin()));
            }
            // 2.30 reloads a net plugin by its name: nothing to work around.
            assert_eq!(get("NCCL_NET_PLUGIN_REF_COUNT"), None);
            let from_file = format!("ENV/BPF NCCLBPF_ENV_T_FILE=from file (from {path}:2)\n");
            let default = format!(
                "ENV/BPF NCCL_NET_PLUGIN={} (default)\n",
                expected_net_plugin()
            );
            wait_for_log(&from_file);
            wait_for_log(&default);
            assert_eq!(finalize(), 0);
            let log = wait_for_log("ENV/BPF finalize: ");
            assert_eq!(log.matches(&from_file).count(), 1, "{log}");
            assert_eq!(log.matches(&default).count(), 1, "{log}");
            assert!(
                !log.contains("NCCLBPF_ENV_T_OTHER"),
                "never asked, never said:\n{log}"
            );
            let line = log.lines().find(|l| l.contains(&from_file[..40])).unwrap();
            assert!(line.starts_with("3 0x80 "), "INFO, ENV: {line}");
            assert!(log.contains("from the file, "), "{log}");
        },
    );
}

/// A file with errors: init still returns 0, every error is a WARN with its line, nothing of
/// the file is answered (not even its good lines), environment and defaults still are. Through
/// v1 (NCCL 2.28: no logger, so the library's stderr fallback) and v2 (NCCL's logger).
#[test]
fn a_bad_settings_file_is_ignored_and_init_still_succeeds() {
    let f = File::new(
        "bad",
        "NCCLBPF_ENV_T_GOOD=1\n1BAD=x\nNCCLBPF_ENV_T_GOOD=2\n",
    );
    let path = f.0.display().to_string();
    for minor in ["28", "30"] {
        let Some(text) = in_child(
            "a_bad_settings_file_is_ignored_and_init_still_succeeds",
            &[
                ("NCCL_BPF_ENV_FILE", f.os()),
                ("NCCL_BPF_LOG_STDERR", OsStr::new("1")),
                ("NCCLBPF_ENV_T_MINOR", OsStr::new(minor)),
                ("NCCLBPF_ENV_T_ENV", OsStr::new("env")),
            ],
            || {
                let minor = minor_from_env();
                assert_eq!(load(minor), if minor >= 30 { 2 } else { 1 });
                assert_eq!(init(2, minor as u8, 0, logger()), 0, "init must not fail");
                assert_eq!(get("NCCLBPF_ENV_T_GOOD"), None, "half-applied");
                assert_eq!(get("NCCLBPF_ENV_T_ENV").as_deref(), Some("env"));
                assert_eq!(get("NCCL_NET_PLUGIN"), Some(expected_net_plugin()));
                if minor >= 30 {
                    let log = log_text();
                    for l in [
                        "2 0x80 ",
                        ":2: name \"1BAD\": must start with a letter or '_'\n",
                        ":3: name \"NCCLBPF_ENV_T_GOOD\" given twice (first on line 1)\n",
                        "ignored (2 errors, see the warnings above); defaults: NCCL_NET_PLUGIN\n",
                    ] {
                        assert!(log.contains(l), "no {l:?} in:\n{log}");
                    }
                }
            },
        ) else {
            return; // the child's part is done
        };
        if minor == "28" {
            // v1 has no logger: with NCCL_BPF_LOG_STDERR=1 the lines go to stderr.
            for l in [
                format!(
                    "NCCL_BPF ENV/BPF settings file ignored: {path}:2: name \"1BAD\": must start with a letter or '_'"
                ),
                format!(
                    "NCCL_BPF ENV/BPF settings file ignored: {path}:3: name \"NCCLBPF_ENV_T_GOOD\" given twice (first on line 1)"
                ),
                format!(
                    "NCCL_BPF ENV/BPF init (NCCL 2.28.0, env v1): settings file {path} ignored"
                ),
            ] {
                assert!(text.contains(&l), "no {l:?} in:\n{text}");
            }
        }
    }
}

#[test]
fn a_missing_settings_file_is_logged_with_the_os_error() {
    in_child(
        "a_missing_settings_file_is_logged_with_the_os_error",
        &[(
            "NCCL_BPF_ENV_FILE",
            OsStr::new("/nonexistent/ncclbpf/settings.env"),
        )],
        || {
            assert_eq!(load(30), 2);
            assert_eq!(init(2, 30, 7, logger()), 0);
            let log = log_text();
            assert!(
                log.contains(
                    "ENV/BPF settings file ignored: /nonexistent/ncclbpf/settings.env: cannot open: No such file or directory (os error 2)\n"
                ),
                "{log}"
            );
            assert!(log.starts_with("2 0x80 "), "a WARN: {log}");
            assert_eq!(get("NCCL_NET_PLUGIN"), Some(expected_net_plugin()));
        },
    );
}

/// `NCCL_BPF_ENV_DEFAULTS=0`: no default; an `NCCL_NET_PLUGIN` of the environment always wins.
#[test]
fn defaults_can_be_switched_off_and_the_environment_wins() {
    in_child(
        "defaults_can_be_switched_off_and_the_environment_wins",
        &[
            ("NCCL_BPF_ENV_DEFAULTS", OsStr::new("0")),
            ("NCCLBPF_ENV_T_MINOR", OsStr::new("off")),
        ],
        body,
    );
    in_child(
        "defaults_can_be_switched_off_and_the_environment_wins",
        &[
            ("NCCL_NET_PLUGIN", OsStr::new("ib-only")),
            ("NCCLBPF_ENV_T_MINOR", OsStr::new("env")),
        ],
        body,
    );
    fn body() {
        assert_eq!(load(30), 2);
        assert_eq!(init(2, 30, 7, logger()), 0);
        match std::env::var("NCCLBPF_ENV_T_MINOR").unwrap().as_str() {
            "off" => {
                assert_eq!(get("NCCL_NET_PLUGIN"), None);
                let log = log_text();
                assert!(
                    log.contains(
                        "no settings file (NCCL_BPF_ENV_FILE unset); defaults off (NCCL_BPF_ENV_DEFAULTS=0)\n"
                    ),
                    "{log}"
                );
            }
            _ => assert_eq!(get("NCCL_NET_PLUGIN").as_deref(), Some("ib-only")),
        }
    }
}

/// Loaded through a `libnccl-env-bpf.so` link (what `NCCL_ENV_PLUGIN=bpf` opens), the default
/// `NCCL_NET_PLUGIN` names the real library, and NCCL's dlopen of its first entry gets the
/// very object already loaded, with its net plugin: setting `NCCL_ENV_PLUGIN` alone suffices.
#[test]
fn the_default_net_plugin_is_this_very_library() {
    let dir = scratch("link");
    let link = dir.join("libnccl-env-bpf.so");
    std::os::unix::fs::symlink(plugin_path().canonicalize().unwrap(), &link).unwrap();
    in_child(
        "the_default_net_plugin_is_this_very_library",
        &[("NCCLBPF_ENV_T_LINK", link.as_os_str())],
        || {
            let link = PathBuf::from(std::env::var_os("NCCLBPF_ENV_T_LINK").unwrap());
            assert_eq!(load_from(&link, 28), 1);
            assert_eq!(init(2, 28, 9, None), 0);
            let value = get("NCCL_NET_PLUGIN").unwrap();
            assert_eq!(value, expected_net_plugin());
            let first = value.split(',').next().unwrap();
            let c = CString::new(first).unwrap();
            // SAFETY: dlopen with a valid C path, as NCCL opens NCCL_NET_PLUGIN's entries.
            let net = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            assert!(!net.is_null());
            // SAFETY: reads the C loader's handle.
            assert_eq!(
                net,
                // SAFETY: as above.
                unsafe { env_caller_handle() },
                "another copy was loaded"
            );
            // SAFETY: dlsym on a live handle.
            let sym = unsafe { libc::dlsym(net, c"ncclNetPlugin_v11".as_ptr()) };
            assert!(!sym.is_null());
        },
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// The environment is read at every call; an address returned before a change still reads
/// the old value afterwards (NCCL may still hold it); a value coming back gets its old address.
#[test]
fn the_environment_is_read_at_each_call_and_old_answers_stay_valid() {
    in_child(
        "the_environment_is_read_at_each_call_and_old_answers_stay_valid",
        &[],
        || {
            assert_eq!(load(28), 1);
            assert_eq!(init(2, 28, 9, None), 0);
            const N: &CStr = c"NCCLBPF_ENV_T_CHANGES";
            assert!(get_raw(Some(N)).is_null());
            // SAFETY: single-threaded here; the variable is this test's own.
            unsafe { std::env::set_var("NCCLBPF_ENV_T_CHANGES", "a") };
            let a = get_raw(Some(N));
            assert_eq!(read(a).as_deref(), Some("a"));
            // SAFETY: as above.
            unsafe { std::env::set_var("NCCLBPF_ENV_T_CHANGES", "a much longer value") };
            assert_eq!(
                read(get_raw(Some(N))).as_deref(),
                Some("a much longer value")
            );
            assert_eq!(read(a).as_deref(), Some("a"), "an earlier answer changed");
            // SAFETY: as above.
            unsafe { std::env::remove_var("NCCLBPF_ENV_T_CHANGES") };
            assert!(get_raw(Some(N)).is_null());
            // SAFETY: as above.
            unsafe { std::env::set_var("NCCLBPF_ENV_T_CHANGES", "a") };
            assert_eq!(get_raw(Some(N)), a);
        },
    );
}

/// Threads calling getEnv on the same and on different names while the value of one keeps
/// changing and finalize runs: no crash, every answer one of the values set, every address
/// still readable at the end.
#[test]
fn concurrent_getenv_while_the_value_changes_and_finalize_runs() {
    let f = File::new("threads", "NCCLBPF_ENV_T_FILE=from file\n");
    in_child(
        "concurrent_getenv_while_the_value_changes_and_finalize_runs",
        &[
            ("NCCL_BPF_ENV_FILE", f.os()),
            ("NCCLBPF_ENV_T_SPIN", OsStr::new("v0")),
        ],
        || {
            assert_eq!(load(30), 2);
            assert_eq!(init(2, 30, 7, logger()), 0);
            let values: Vec<String> = (0..6)
                .map(|i| format!("v{i}{}", "-".repeat(i * 13)))
                .collect();
            let done = std::sync::atomic::AtomicBool::new(false);
            let kept: Vec<Vec<usize>> = std::thread::scope(|s| {
                let readers: Vec<_> = (0..8)
                    .map(|t| {
                        let (values, done) = (&values, &done);
                        s.spawn(move || {
                            let mut kept = Vec::new();
                            let own = CString::new(format!("NCCLBPF_ENV_T_NONE_{t}")).unwrap();
                            while !done.load(std::sync::atomic::Ordering::Acquire) {
                                let p = get_raw(Some(c"NCCLBPF_ENV_T_SPIN"));
                                let v = read(p).expect("the variable is always set");
                                assert!(values.contains(&v), "answer {v:?} was never set");
                                kept.push(p as usize);
                                assert_eq!(get("NCCLBPF_ENV_T_FILE").as_deref(), Some("from file"));
                                assert!(get_raw(Some(&own)).is_null());
                            }
                            kept
                        })
                    })
                    .collect();
                for r in 0..3000 {
                    // The variable exists from the start, so glibc's setenv only swaps its
                    // string pointer and never moves the environment under a reader.
                    // SAFETY: see above; readers only read it.
                    unsafe { std::env::set_var("NCCLBPF_ENV_T_SPIN", &values[r % values.len()]) };
                    if r == 1500 {
                        assert_eq!(finalize(), 0);
                    }
                }
                done.store(true, std::sync::atomic::Ordering::Release);
                readers.into_iter().map(|r| r.join().unwrap()).collect()
            });
            let mut distinct = std::collections::HashSet::new();
            for p in kept.into_iter().flatten() {
                let v = read(p as *const c_char).unwrap();
                assert!(values.contains(&v), "a kept address now reads {v:?}");
                distinct.insert(p);
            }
            assert!(
                distinct.len() <= values.len(),
                "one copy per distinct value"
            );
        },
    );
}

/// NCCL's logger holds a non-recursive mutex while its ncclDebugInit reads `NCCL_DEBUG` through
/// getEnv. Here `NCCL_DEBUG` comes from the file, so its first answer is one the plugin logs:
/// were that line logged from inside getEnv, the logger would be re-entered under its own lock
/// (a deadlock in NCCL; recorded by the C logger here). The line must still reach the log.
#[test]
fn getenv_never_reenters_nccls_logger() {
    let f = File::new(
        "reenter",
        "NCCL_DEBUG=INFO\nNCCL_DEBUG_SUBSYS=ENV\nNCCLBPF_ENV_T_FILE=x\n",
    );
    in_child(
        "getenv_never_reenters_nccls_logger",
        &[("NCCL_BPF_ENV_FILE", f.os())],
        || {
            assert_eq!(load(30), 2);
            assert_eq!(init(2, 30, 7, Some(env_caller_nccl_like_logger)), 0);
            let state = || {
                let mut seen = [0 as c_char; 64];
                // SAFETY: the buffer and its size; the C side writes a NUL-terminated string.
                let n = unsafe { env_caller_logger_state(seen.as_mut_ptr(), seen.len()) };
                // SAFETY: NUL-terminated by the call above.
                let s = unsafe { CStr::from_ptr(seen.as_ptr()) };
                (n, s.to_str().unwrap().to_string())
            };
            // Before NCCL marks the plugin initialised, its logger reads the environment.
            assert_eq!(state(), (1, "(unset)".to_string()), "the init line");
            // SAFETY: as NCCL does after init, then as ncclResetDebugInit does.
            unsafe {
                env_caller_plugin_ready();
                env_caller_reset_debug();
            }
            // NCCL's own thread logs: ncclDebugInit runs with the lock held and asks getEnv.
            // SAFETY: the logger's variadic contract: "%s" and one C string.
            unsafe {
                env_caller_nccl_like_logger(
                    3,
                    0x80,
                    c"t".as_ptr(),
                    1,
                    c"%s".as_ptr(),
                    c"x".as_ptr(),
                )
            };
            // Its own line is the second; the log thread may already have delivered the
            // NCCL_DEBUG and NCCL_DEBUG_SUBSYS lines queued by that getEnv (up to two more).
            let (n, seen) = state();
            assert_eq!(seen, "INFO", "what ncclDebugInit read through getEnv");
            assert!((2..=4).contains(&n), "{n} lines after NCCL's own");
            // Another name from the file: its line goes through the log thread.
            assert_eq!(get("NCCLBPF_ENV_T_FILE").as_deref(), Some("x"));
            // The NCCL_DEBUG, NCCL_DEBUG_SUBSYS and NCCLBPF_ENV_T_FILE lines.
            let deadline = Instant::now() + Duration::from_secs(10);
            while state().0 < 5 {
                // SAFETY: reads an int.
                assert_eq!(
                    // SAFETY: as above.
                    unsafe { env_caller_logger_recursed() },
                    0,
                    "logger re-entered"
                );
                assert!(Instant::now() < deadline, "lines missing: {:?}", state());
                std::thread::sleep(Duration::from_millis(5));
            }
            // SAFETY: reads an int.
            assert_eq!(
                // SAFETY: as above.
                unsafe { env_caller_logger_recursed() },
                0,
                "logger re-entered"
            );
            // Once more through the log thread: a reset, then a line to log.
            // SAFETY: as above.
            unsafe { env_caller_reset_debug() };
            assert!(get_raw(None).is_null());
            while state().0 < 6 {
                // SAFETY: reads an int.
                assert_eq!(
                    // SAFETY: as above.
                    unsafe { env_caller_logger_recursed() },
                    0,
                    "logger re-entered"
                );
                assert!(Instant::now() < deadline, "lines missing: {:?}", state());
                std::thread::sleep(Duration::from_millis(5));
            }
            // SAFETY: reads an int.
            assert_eq!(
                // SAFETY: as above.
                unsafe { env_caller_logger_recursed() },
                0,
                "logger re-entered"
            );
            assert_eq!(finalize(), 0);
            // SAFETY: reads an int.
            assert_eq!(
                // SAFETY: as above.
                unsafe { env_caller_logger_recursed() },
                0,
                "logger re-entered"
            );
        },
    );
}

/// What the parent itself can check: both symbols are there for dlsym, with NCCL's layout.
#[test]
fn both_symbols_are_exported_as_data_tables() {
    let c = CString::new(plugin_path().as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: dlopen with a valid path; the handle stays open for the test process.
    let lib = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!lib.is_null());
    for sym in [c"ncclEnvPlugin_v1", c"ncclEnvPlugin_v2"] {
        // SAFETY: dlsym on a live handle.
        let p = unsafe { libc::dlsym(lib, sym.as_ptr()) };
        assert!(!p.is_null(), "{sym:?} missing");
        // SAFETY: both tables start with `const char* name`, then three function pointers
        // (the layout the C loader asserts); only read.
        let words = unsafe { std::slice::from_raw_parts(p as *const *const c_void, 4) };
        assert!(
            words.iter().all(|w| !w.is_null()),
            "{sym:?} has a NULL field"
        );
        // SAFETY: the name field points to a NUL-terminated static string.
        let name = unsafe { CStr::from_ptr(words[0].cast()) };
        assert_eq!(name.to_str().unwrap(), "BPF");
    }
}

/// NCCL gives a v1 env plugin no logger, and loads it before the net plugin that gets one: its
/// init line and its first "supplied" lines wait for that logger instead of being lost.
#[test]
fn v1_lines_wait_for_the_net_plugins_logger() {
    let f = File::new("v1-wait", "NCCLBPF_ENV_T_FILE=from file\n");
    in_child(
        "v1_lines_wait_for_the_net_plugins_logger",
        &[("NCCL_BPF_ENV_FILE", f.os())],
        || {
            assert_eq!(load(28), 1);
            assert_eq!(init(2, 28, 9, None), 0);
            assert_eq!(get("NCCLBPF_ENV_T_FILE").as_deref(), Some("from file"));
            std::thread::sleep(Duration::from_millis(200));
            assert!(
                !log_text().contains("ENV/BPF"),
                "no logger yet: {}",
                log_text()
            );
            // NCCL then initialises the net plugin of the same library with its logger.
            let mut net = ncclbpf_harness::Net::open(Some(11)).unwrap();
            let _ = net.init(0x1234);
            wait_for_log("ENV/BPF init (NCCL 2.28.9, env v1)");
            wait_for_log("ENV/BPF NCCLBPF_ENV_T_FILE=from file (from ");
        },
    );
}
