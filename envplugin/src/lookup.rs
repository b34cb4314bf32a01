//! The order of sources for one name: the process environment at the time of the call, then
//! the settings file, then the defaults, else unset (NULL).
//!
//! The environment is read on every call (it can change between calls; NCCL's own default
//! plugin is a plain `getenv`). The file and the defaults were fixed at `init`.

use crate::intern::Interner;
use crate::settings::Settings;
use std::ffi::{CStr, OsStr, OsString, c_char};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

/// Which source answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Env,
    File,
    Default,
    Unset,
}

/// One answer: the value (valid for the process's life, see [`crate::intern`]), its source,
/// and, the first time the file or a default answers for this name, the line to log.
#[derive(Debug)]
pub struct Answer {
    pub value: Option<&'static CStr>,
    pub source: Source,
    pub supplied: Option<String>,
}

/// The process environment, through std's lock (so a `std::env::set_var` elsewhere in the
/// process is never read half-done).
pub fn process_env(name: &OsStr) -> Option<OsString> {
    std::env::var_os(name)
}

/// What NCCL's own default env plugin answers: `getenv(name)`, the C library's pointer into
/// the environment (valid until that variable is changed). Only for when [`lookup`] cannot
/// be used (the adapters' panic fallback).
pub fn raw_getenv(name: &CStr) -> *const c_char {
    // SAFETY: `name` is NUL-terminated; getenv only reads it and the environment.
    unsafe { libc::getenv(name.as_ptr()) }
}

/// Answers `name` from `env`, then `settings`; environment values are kept in `kept`.
pub fn lookup(
    name: &CStr,
    settings: &Settings,
    kept: &Interner,
    env: impl Fn(&OsStr) -> Option<OsString>,
) -> Answer {
    let bytes = name.to_bytes();
    let unset = Answer {
        value: None,
        source: Source::Unset,
        supplied: None,
    };
    // No such variable can exist (and getenv would match a prefix of some other entry).
    if bytes.is_empty() || bytes.contains(&b'=') {
        return unset;
    }
    if let Some(v) = env(OsStr::from_bytes(bytes)) {
        return Answer {
            value: kept.intern(bytes, &v.into_vec()),
            source: Source::Env,
            supplied: None,
        };
    }
    let Ok(text) = name.to_str() else {
        return unset;
    };
    for (entry, source) in [
        (settings.from_file(text), Source::File),
        (settings.default_for(text), Source::Default),
    ] {
        if let Some(e) = entry {
            return Answer {
                value: Some(e.value),
                source,
                supplied: e.first_use().then(|| e.supplied_line(text)),
            };
        }
    }
    unset
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file::Setting;

    fn settings() -> Settings {
        let file = vec![
            Setting {
                name: "NCCL_LT_BOTH".into(),
                value: "file".into(),
                line: 1,
            },
            Setting {
                name: "NCCL_LT_FILE".into(),
                value: "file only".into(),
                line: 2,
            },
            Setting {
                name: "NCCL_LT_ENV_FILE".into(),
                value: "file".into(),
                line: 3,
            },
        ];
        let defaults = vec![
            ("NCCL_LT_BOTH".to_string(), "default".to_string()),
            ("NCCL_LT_DEFAULT".to_string(), "default only".to_string()),
        ];
        Settings::new(Some(("/f.env", file)), defaults)
    }

    fn no_env(_: &OsStr) -> Option<OsString> {
        None
    }

    fn val(a: &Answer) -> Option<&str> {
        a.value.map(|v| v.to_str().unwrap())
    }

    #[test]
    fn env_beats_file_beats_default() {
        let s = settings();
        let k = Interner::new();
        let env = |n: &OsStr| {
            (n == "NCCL_LT_BOTH" || n == "NCCL_LT_ENV_FILE").then(|| OsString::from("env"))
        };
        let a = lookup(c"NCCL_LT_BOTH", &s, &k, env);
        assert_eq!((val(&a), a.source), (Some("env"), Source::Env));
        assert_eq!(a.supplied, None, "environment answers are NCCL's to log");
        let a = lookup(c"NCCL_LT_BOTH", &s, &k, no_env);
        assert_eq!((val(&a), a.source), (Some("file"), Source::File));
        let a = lookup(c"NCCL_LT_FILE", &s, &k, env);
        assert_eq!((val(&a), a.source), (Some("file only"), Source::File));
        let a = lookup(c"NCCL_LT_DEFAULT", &s, &k, env);
        assert_eq!((val(&a), a.source), (Some("default only"), Source::Default));
        let a = lookup(c"NCCL_LT_NOWHERE", &s, &k, env);
        assert_eq!((a.value, a.source), (None, Source::Unset));
    }

    #[test]
    fn an_empty_environment_value_is_an_answer() {
        let s = settings();
        let k = Interner::new();
        let a = lookup(c"NCCL_LT_BOTH", &s, &k, |_: &OsStr| Some(OsString::new()));
        assert_eq!((val(&a), a.source), (Some(""), Source::Env));
    }

    #[test]
    fn the_supplied_line_comes_once_per_name_and_source() {
        let s = settings();
        let k = Interner::new();
        let a = lookup(c"NCCL_LT_FILE", &s, &k, no_env);
        assert_eq!(
            a.supplied.as_deref(),
            Some("NCCL_LT_FILE=file only (from /f.env:2)")
        );
        assert_eq!(lookup(c"NCCL_LT_FILE", &s, &k, no_env).supplied, None);
        let a = lookup(c"NCCL_LT_DEFAULT", &s, &k, no_env);
        assert_eq!(
            a.supplied.as_deref(),
            Some("NCCL_LT_DEFAULT=default only (default)")
        );
        assert_eq!(lookup(c"NCCL_LT_DEFAULT", &s, &k, no_env).supplied, None);
        // NCCL_LT_BOTH answered from the file first, later from its default: one line each.
        assert!(lookup(c"NCCL_LT_BOTH", &s, &k, no_env).supplied.is_some());
        assert!(lookup(c"NCCL_LT_BOTH", &s, &k, no_env).supplied.is_none());
    }

    #[test]
    fn names_that_cannot_be_variables_are_unset() {
        let s = settings();
        let k = Interner::new();
        let env = |_: &OsStr| -> Option<OsString> { panic!("not asked") };
        assert_eq!(lookup(c"", &s, &k, env).source, Source::Unset);
        assert_eq!(lookup(c"NCCL_LT_BOTH=x", &s, &k, env).source, Source::Unset);
        assert_eq!(lookup(c"NCCL_\xff", &s, &k, no_env).source, Source::Unset);
    }

    /// Real process environment: the value changes between calls, and the address returned
    /// before the change still reads the old value.
    #[test]
    fn environment_changes_between_calls_and_old_answers_stay_valid() {
        const N: &str = "NCCLBPF_ENV_TEST_LOOKUP_CHANGES";
        let s = settings();
        let k = Interner::new();
        let ask = || lookup(c"NCCLBPF_ENV_TEST_LOOKUP_CHANGES", &s, &k, process_env);
        assert_eq!(ask().source, Source::Unset);
        // SAFETY: this test's own variable; other threads read the environment only through
        // std, whose lock set_var takes.
        unsafe { std::env::set_var(N, "first") };
        let first = ask().value.unwrap();
        assert_eq!(first.to_str().unwrap(), "first");
        let first_ptr = first.as_ptr();
        // SAFETY: as above.
        unsafe { std::env::set_var(N, "second, longer than the first") };
        let second = ask().value.unwrap();
        assert_eq!(second.to_str().unwrap(), "second, longer than the first");
        // Read the first answer back through its raw address, as NCCL would.
        // SAFETY: the interner never frees a returned string.
        let again = unsafe { CStr::from_ptr(first_ptr) };
        assert_eq!(again.to_str().unwrap(), "first");
        // SAFETY: as above.
        unsafe { std::env::remove_var(N) };
        assert_eq!(ask().source, Source::Unset);
        // SAFETY: as above.
        unsafe { std::env::set_var(N, "first") };
        assert_eq!(
            ask().value.unwrap().as_ptr(),
            first_ptr,
            "same value, same copy"
        );
        // SAFETY: as above.
        unsafe { std::env::remove_var(N) };
    }
}
