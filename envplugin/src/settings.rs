//! What the plugin can answer besides the environment: the file's settings and the defaults,
//! fixed at `init` (the file is read once) and never freed.

use crate::defaults::{self, Switch};
use crate::file::{self, Setting};
use crate::report::{Level, show_value};
use std::collections::BTreeMap;
use std::ffi::{CStr, CString, OsString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

pub const FILE_VAR: &str = "NCCL_BPF_ENV_FILE";
/// At most this many file errors are logged one by one; the rest are counted.
pub const MAX_LOGGED_ERRORS: usize = 50;

/// Where an answer other than the environment's comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    File { path: String, line: usize },
    Default,
}

/// One value the plugin can supply.
#[derive(Debug)]
pub struct Entry {
    pub value: &'static CStr,
    pub origin: Origin,
    reported: AtomicBool,
}

impl Entry {
    fn new(value: &str, origin: Origin) -> Option<Entry> {
        Some(Entry {
            value: Box::leak(CString::new(value).ok()?.into_boxed_c_str()),
            origin,
            reported: AtomicBool::new(false),
        })
    }

    /// True exactly once: the first time this entry answers.
    pub fn first_use(&self) -> bool {
        !self.reported.swap(true, Ordering::AcqRel)
    }

    /// The INFO line for its first use: `NAME=value (from /etc/x.env:3)` or `(default)`.
    pub fn supplied_line(&self, name: &str) -> String {
        let value = show_value(&self.value.to_string_lossy());
        match &self.origin {
            Origin::File { path, line } => format!("{name}={value} (from {path}:{line})"),
            Origin::Default => format!("{name}={value} (default)"),
        }
    }
}

/// The file's settings and the defaults.
#[derive(Debug, Default)]
pub struct Settings {
    file: BTreeMap<String, Entry>,
    defaults: BTreeMap<String, Entry>,
}

impl Settings {
    /// Nothing besides the environment (before `init`, or when loading failed).
    pub fn none() -> Settings {
        Settings::default()
    }

    pub fn new(file: Option<(&str, Vec<Setting>)>, defaults: Vec<(String, String)>) -> Settings {
        let mut s = Settings::none();
        if let Some((path, settings)) = file {
            for set in settings {
                let origin = Origin::File {
                    path: path.to_string(),
                    line: set.line,
                };
                if let Some(e) = Entry::new(&set.value, origin) {
                    s.file.insert(set.name, e);
                }
            }
        }
        for (name, value) in defaults {
            if let Some(e) = Entry::new(&value, Origin::Default) {
                s.defaults.insert(name, e);
            }
        }
        s
    }

    pub fn from_file(&self, name: &str) -> Option<&Entry> {
        self.file.get(name)
    }

    pub fn default_for(&self, name: &str) -> Option<&Entry> {
        self.defaults.get(name)
    }

    pub fn file_len(&self) -> usize {
        self.file.len()
    }

    pub fn default_names(&self) -> impl Iterator<Item = &str> {
        self.defaults.keys().map(String::as_str)
    }
}

/// The settings and what `init` logs about them, in order.
pub struct Loaded {
    pub settings: Settings,
    pub lines: Vec<(Level, String)>,
}

/// Reads `NCCL_BPF_ENV_FILE` and `NCCL_BPF_ENV_DEFAULTS` through `env` (the process
/// environment at init), the file, and works out the defaults (`own`: this library's path).
/// Never fails: whatever goes wrong is a warning, and the plugin carries on without it.
/// `banner` starts the one INFO line, e.g. `init (NCCL 2.28.9, env v1)`.
pub fn load(
    env: &dyn Fn(&str) -> Option<OsString>,
    own: impl FnOnce() -> Result<PathBuf, String>,
    banner: &str,
    nccl: (u8, u8),
) -> Loaded {
    let mut lines = Vec::new();
    let mut settings_file = None;
    let file_phrase = match env(FILE_VAR).filter(|p| !p.is_empty()) {
        None => format!("no settings file ({FILE_VAR} unset)"),
        Some(p) => {
            let path = Path::new(&p);
            let shown = path.display().to_string();
            match file::load(path) {
                Ok(s) => {
                    let n = s.len();
                    settings_file = Some((shown.clone(), s));
                    format!(
                        "settings file {shown}: {n} setting{}",
                        if n == 1 { "" } else { "s" }
                    )
                }
                Err(errors) => {
                    for e in errors.iter().take(MAX_LOGGED_ERRORS) {
                        lines.push((Level::Warn, format!("settings file ignored: {e}")));
                    }
                    if errors.len() > MAX_LOGGED_ERRORS {
                        lines.push((
                            Level::Warn,
                            format!(
                                "settings file ignored: {shown}: {} more errors not shown",
                                errors.len() - MAX_LOGGED_ERRORS
                            ),
                        ));
                    }
                    format!(
                        "settings file {shown} ignored ({} error{}, see the warning{} above)",
                        errors.len(),
                        if errors.len() == 1 { "" } else { "s" },
                        if errors.len() == 1 { "" } else { "s" },
                    )
                }
            }
        }
    };
    let from_file = |name: &str| {
        settings_file
            .as_ref()
            .and_then(|(_, s)| s.iter().find(|s| s.name == name))
            .map(|s| s.value.clone())
    };
    let switch_value = env(defaults::SWITCH)
        .map(|v| v.to_string_lossy().into_owned())
        .or_else(|| from_file(defaults::SWITCH));
    let switch = Switch::parse(switch_value.as_deref());
    if let Switch::Invalid(v) = &switch {
        lines.push((
            Level::Warn,
            format!(
                "{}=\"{}\": expected 0 or 1; defaults stay on",
                defaults::SWITCH,
                show_value(v)
            ),
        ));
    }
    let (defaults, defaults_phrase) = defaults::compute(&switch, own, nccl);
    lines.push((
        Level::Info,
        format!("{banner}: {file_phrase}; {defaults_phrase}"),
    ));
    let settings = Settings::new(
        settings_file.as_ref().map(|(p, s)| (p.as_str(), s.clone())),
        defaults,
    );
    Loaded { settings, lines }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let m: HashMap<String, OsString> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        move |k| m.get(k).cloned()
    }

    fn lib() -> Result<PathBuf, String> {
        Ok(PathBuf::from("/l/libnccl-net-bpf.so"))
    }

    fn tmp_file(tag: &str, text: &[u8]) -> PathBuf {
        let p = std::env::temp_dir().join(format!(
            "ncclbpf-env-settings-{tag}-{}.env",
            std::process::id()
        ));
        std::fs::write(&p, text).unwrap();
        p
    }

    fn texts(l: &Loaded) -> Vec<(Level, &str)> {
        l.lines.iter().map(|(lv, s)| (*lv, s.as_str())).collect()
    }

    #[test]
    fn no_file_defaults_on() {
        let l = load(&env_of(&[]), lib, "init (NCCL 2.28.9, env v1)", (2, 28));
        assert_eq!(
            texts(&l),
            vec![(
                Level::Info,
                "init (NCCL 2.28.9, env v1): no settings file (NCCL_BPF_ENV_FILE unset); defaults: NCCL_NET_PLUGIN, NCCL_NET_PLUGIN_REF_COUNT"
            )]
        );
        assert_eq!(
            l.settings
                .default_for("NCCL_NET_PLUGIN_REF_COUNT")
                .unwrap()
                .value
                .to_str()
                .unwrap(),
            "1"
        );
        assert_eq!(l.settings.file_len(), 0);
        let d = l.settings.default_for("NCCL_NET_PLUGIN").unwrap();
        assert_eq!(
            d.value.to_str().unwrap(),
            "/l/libnccl-net-bpf.so,libnccl-net.so"
        );
        assert_eq!(
            d.supplied_line("NCCL_NET_PLUGIN"),
            "NCCL_NET_PLUGIN=/l/libnccl-net-bpf.so,libnccl-net.so (default)"
        );
        // An empty NCCL_BPF_ENV_FILE is no file.
        let l = load(&env_of(&[("NCCL_BPF_ENV_FILE", "")]), lib, "b", (2, 30));
        assert!(l.lines[0].1.contains("no settings file"));
    }

    #[test]
    fn a_good_file_is_loaded_and_counted() {
        let p = tmp_file("good", b"NCCL_A=1\n# c\nNCCL_B=\"two words\"\n");
        let ps = p.to_str().unwrap();
        let l = load(&env_of(&[("NCCL_BPF_ENV_FILE", ps)]), lib, "b", (2, 30));
        assert_eq!(
            texts(&l),
            vec![(
                Level::Info,
                format!("b: settings file {ps}: 2 settings; defaults: NCCL_NET_PLUGIN").as_str()
            )]
        );
        let b = l.settings.from_file("NCCL_B").unwrap();
        assert_eq!(b.value.to_str().unwrap(), "two words");
        assert_eq!(
            b.origin,
            Origin::File {
                path: ps.into(),
                line: 3
            }
        );
        assert_eq!(
            b.supplied_line("NCCL_B"),
            format!("NCCL_B=two words (from {ps}:3)")
        );
        assert!(b.first_use());
        assert!(!b.first_use());
        let _ = std::fs::remove_file(p);
    }

    #[test]
    fn a_bad_file_is_ignored_whole_and_every_error_is_a_warning() {
        let p = tmp_file("bad", b"NCCL_A=1\n1X=2\nNCCL_C=3\nNCCL_A=4\n");
        let ps = p.to_str().unwrap();
        let l = load(&env_of(&[("NCCL_BPF_ENV_FILE", ps)]), lib, "b", (2, 30));
        assert_eq!(
            texts(&l),
            vec![
                (
                    Level::Warn,
                    format!(
                        "settings file ignored: {ps}:2: name \"1X\": must start with a letter or '_'"
                    )
                    .as_str()
                ),
                (
                    Level::Warn,
                    format!(
                        "settings file ignored: {ps}:4: name \"NCCL_A\" given twice (first on line 1)"
                    )
                    .as_str()
                ),
                (
                    Level::Info,
                    format!(
                        "b: settings file {ps} ignored (2 errors, see the warnings above); defaults: NCCL_NET_PLUGIN"
                    )
                    .as_str()
                ),
            ]
        );
        // Not half-applied: the good lines are not answered either.
        assert!(l.settings.from_file("NCCL_A").is_none());
        assert!(l.settings.from_file("NCCL_C").is_none());
        assert_eq!(l.settings.file_len(), 0);
        // Defaults still work.
        assert!(l.settings.default_for("NCCL_NET_PLUGIN").is_some());
        let _ = std::fs::remove_file(p);
    }

    #[test]
    fn a_missing_file_is_a_warning_with_the_os_error() {
        let l = load(
            &env_of(&[("NCCL_BPF_ENV_FILE", "/nonexistent/x.env")]),
            lib,
            "b",
            (2, 30),
        );
        assert_eq!(
            texts(&l),
            vec![
                (
                    Level::Warn,
                    "settings file ignored: /nonexistent/x.env: cannot open: No such file or directory (os error 2)"
                ),
                (
                    Level::Info,
                    "b: settings file /nonexistent/x.env ignored (1 error, see the warning above); defaults: NCCL_NET_PLUGIN"
                ),
            ]
        );
    }

    #[test]
    fn errors_beyond_the_cap_are_counted() {
        let text = "x\n".repeat(MAX_LOGGED_ERRORS + 7);
        let p = tmp_file("many", text.as_bytes());
        let ps = p.to_str().unwrap();
        let l = load(&env_of(&[("NCCL_BPF_ENV_FILE", ps)]), lib, "b", (2, 30));
        let warns: Vec<_> = l.lines.iter().filter(|l| l.0 == Level::Warn).collect();
        assert_eq!(warns.len(), MAX_LOGGED_ERRORS + 1);
        assert_eq!(
            warns.last().unwrap().1,
            format!("settings file ignored: {ps}: 7 more errors not shown")
        );
        assert!(
            warns[MAX_LOGGED_ERRORS - 1]
                .1
                .contains(&format!("{ps}:{MAX_LOGGED_ERRORS}:"))
        );
        let _ = std::fs::remove_file(p);
    }

    #[test]
    fn defaults_switch_from_the_environment_or_the_file() {
        let l = load(
            &env_of(&[("NCCL_BPF_ENV_DEFAULTS", "0")]),
            lib,
            "b",
            (2, 30),
        );
        assert!(l.settings.default_for("NCCL_NET_PLUGIN").is_none());
        assert!(
            l.lines[0]
                .1
                .ends_with("defaults off (NCCL_BPF_ENV_DEFAULTS=0)")
        );

        let p = tmp_file("switch", b"NCCL_BPF_ENV_DEFAULTS=0\n");
        let ps = p.to_str().unwrap();
        let l = load(&env_of(&[("NCCL_BPF_ENV_FILE", ps)]), lib, "b", (2, 30));
        assert!(l.settings.default_for("NCCL_NET_PLUGIN").is_none());
        // The environment beats the file here too.
        let l = load(
            &env_of(&[("NCCL_BPF_ENV_FILE", ps), ("NCCL_BPF_ENV_DEFAULTS", "1")]),
            lib,
            "b",
            (2, 30),
        );
        assert!(l.settings.default_for("NCCL_NET_PLUGIN").is_some());
        let _ = std::fs::remove_file(p);

        let l = load(
            &env_of(&[("NCCL_BPF_ENV_DEFAULTS", "off")]),
            lib,
            "b",
            (2, 30),
        );
        assert_eq!(
            texts(&l)[0],
            (
                Level::Warn,
                "NCCL_BPF_ENV_DEFAULTS=\"off\": expected 0 or 1; defaults stay on"
            )
        );
        assert!(l.settings.default_for("NCCL_NET_PLUGIN").is_some());
    }

    #[test]
    fn no_library_path_no_default() {
        let l = load(&env_of(&[]), || Err("why".into()), "b", (2, 30));
        assert!(l.settings.default_for("NCCL_NET_PLUGIN").is_none());
        assert!(l.lines[0].1.ends_with("no default NCCL_NET_PLUGIN: why"));
    }

    #[test]
    fn long_values_are_cut_in_the_supplied_line() {
        let s = Settings::new(
            Some((
                "/f",
                vec![Setting {
                    name: "N".into(),
                    value: "v".repeat(300),
                    line: 9,
                }],
            )),
            vec![],
        );
        let e = s.from_file("N").unwrap();
        assert_eq!(e.value.to_bytes().len(), 300);
        assert_eq!(
            e.supplied_line("N"),
            format!("N={}... (300 bytes) (from /f:9)", "v".repeat(200))
        );
    }
}
