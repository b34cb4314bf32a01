//! The settings file (`NCCL_BPF_ENV_FILE`): read once at init, parsed strictly.
//!
//! The format, one setting per line:
//!
//! * `NAME=value`. `NAME` matches `[A-Za-z_][A-Za-z0-9_]*` (case matters). No whitespace on
//!   either side of `=`; indentation before `NAME` is allowed.
//! * The value is the rest of the line. Without quotes it may contain spaces inside, but not
//!   at its end, and no `#` after whitespace (there are no inline comments). A value in double
//!   quotes (`NAME="a b "`) keeps every character between them; there are no escapes, so a
//!   quoted value cannot contain `"`. Single quotes are refused rather than kept as text.
//!   `NAME=` and `NAME=""` set an empty value.
//! * Blank lines, and lines whose first non-blank character is `#`, are ignored.
//! * Lines end with LF; a CR right before the LF (CRLF files) is dropped. Any other control
//!   character in a setting (a stray CR included) is an error; tabs are allowed.
//! * A name given twice, a line without `=`, bytes that are not UTF-8, NUL bytes and a byte
//!   order mark are errors, as is a file over [`MAX_BYTES`] or one that is not a regular file.
//!
//! Every error is reported with the file and line (`/etc/x.env:7: name "1FOO": must start with a
//! letter or '_'`), all of them, not just the first; any error makes the whole file ignored.

use std::collections::HashMap;
use std::fmt;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Largest file read: 1 MiB.
pub const MAX_BYTES: u64 = 1 << 20;

/// Names that mean nothing in the file: refused so the mistake is seen.
const NOT_IN_FILE: [(&str, &str); 2] = [
    (
        "NCCL_BPF_ENV_FILE",
        "is read from the process environment only, it cannot be set in the file",
    ),
    (
        "NCCL_ENV_PLUGIN",
        "is read by NCCL before it loads the plugin, set it in the process environment",
    ),
];

/// One `NAME=value` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setting {
    pub name: String,
    pub value: String,
    /// 1-based.
    pub line: usize,
}

/// What is wrong, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    /// The path as given.
    pub path: String,
    /// 1-based; `None` for the file as a whole (cannot open, too large).
    pub line: Option<usize>,
    pub what: String,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(n) => write!(f, "{}:{n}: {}", self.path, self.what),
            None => write!(f, "{}: {}", self.path, self.what),
        }
    }
}

/// Reads and parses the file at `path`. Opening never blocks (a FIFO is refused, not waited
/// on) and at most [`MAX_BYTES`] + 1 bytes are read.
pub fn load(path: &Path) -> Result<Vec<Setting>, Vec<Error>> {
    let shown = path.display().to_string();
    let whole = |what: String| {
        vec![Error {
            path: shown.clone(),
            line: None,
            what,
        }]
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| whole(format!("cannot open: {e}")))?;
    let meta = file
        .metadata()
        .map_err(|e| whole(format!("cannot stat: {e}")))?;
    if meta.is_dir() {
        return Err(whole("is a directory, not a settings file".into()));
    }
    if !meta.is_file() {
        return Err(whole(
            "is not a regular file (a FIFO, socket or device is not read)".into(),
        ));
    }
    let too_big = |n: u64| {
        whole(format!(
            "is {n} bytes, over the limit of {MAX_BYTES} (1 MiB)"
        ))
    };
    if meta.len() > MAX_BYTES {
        return Err(too_big(meta.len()));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    (&file)
        .take(MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| whole(format!("cannot read: {e}")))?;
    if bytes.len() as u64 > MAX_BYTES {
        // It grew while being read.
        return Err(too_big(bytes.len() as u64));
    }
    parse(&shown, &bytes)
}

/// Parses a whole file's bytes; `path` is only for the messages.
pub fn parse(path: &str, bytes: &[u8]) -> Result<Vec<Setting>, Vec<Error>> {
    let mut settings = Vec::new();
    let mut errors = Vec::new();
    let mut first_line: HashMap<String, usize> = HashMap::new();
    let mut body = bytes;
    if let Some(rest) = body.strip_prefix(b"\xEF\xBB\xBF") {
        errors.push(Error {
            path: path.into(),
            line: Some(1),
            what: "starts with a UTF-8 byte order mark (save the file without it)".into(),
        });
        body = rest;
    }
    if body.is_empty() {
        return if errors.is_empty() {
            Ok(settings)
        } else {
            Err(errors)
        };
    }
    // A final LF ends the last line; it does not start another.
    let body = body.strip_suffix(b"\n").unwrap_or(body);
    for (i, raw) in body.split(|&b| b == b'\n').enumerate() {
        let line = i + 1;
        match parse_line(raw) {
            Ok(None) => {}
            Ok(Some((name, value))) => {
                if let Some(&first) = first_line.get(name) {
                    errors.push(Error {
                        path: path.into(),
                        line: Some(line),
                        what: format!("name \"{name}\" given twice (first on line {first})"),
                    });
                    continue;
                }
                first_line.insert(name.to_string(), line);
                settings.push(Setting {
                    name: name.into(),
                    value: value.into(),
                    line,
                });
            }
            Err(what) => errors.push(Error {
                path: path.into(),
                line: Some(line),
                what,
            }),
        }
    }
    if errors.is_empty() {
        Ok(settings)
    } else {
        Err(errors)
    }
}

/// One line without its LF: `Ok(None)` for a blank line or a comment.
fn parse_line(raw: &[u8]) -> Result<Option<(&str, &str)>, String> {
    let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
    if let Some(at) = raw.iter().position(|&b| b == 0) {
        return Err(format!("NUL byte at column {}", at + 1));
    }
    let text = std::str::from_utf8(raw).map_err(|e| {
        format!(
            "not valid UTF-8 (bad byte at column {})",
            e.valid_up_to() + 1
        )
    })?;
    let rest = text.trim_start_matches([' ', '\t']);
    if rest.is_empty() || rest.starts_with('#') {
        return Ok(None);
    }
    if let Some((at, c)) = text
        .char_indices()
        .find(|&(_, c)| c.is_control() && c != '\t')
    {
        let col = text[..at].chars().count() + 1;
        return Err(if c == '\r' {
            format!(
                "carriage return at column {col} (only a CR right before the line's LF is dropped)"
            )
        } else {
            format!("control character U+{:04X} at column {col}", c as u32)
        });
    }
    let Some((name, value)) = rest.split_once('=') else {
        return Err(format!(
            "no '=' in \"{}\" (expected NAME=value)",
            clip(rest, 60)
        ));
    };
    check_name(name)?;
    if let Some((_, why)) = NOT_IN_FILE.iter().find(|(n, _)| *n == name) {
        return Err(format!("{name} {why}"));
    }
    Ok(Some((name, parse_value(value)?)))
}

fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("missing name before '='".into());
    }
    if let Some(after) = name.strip_prefix("export")
        && after.starts_with([' ', '\t'])
    {
        return Err("'export' is not supported (write NAME=value)".into());
    }
    if name.ends_with([' ', '\t']) {
        return Err(format!(
            "whitespace before '=' after \"{}\" (write NAME=value, no spaces around '=')",
            name.trim_end()
        ));
    }
    let first = name.chars().next().unwrap_or('_');
    if !(first.is_ascii_alphabetic() || first == '_') {
        return Err(format!("name \"{name}\": must start with a letter or '_'"));
    }
    if let Some(bad) = name
        .chars()
        .find(|&c| !(c.is_ascii_alphanumeric() || c == '_'))
    {
        return Err(format!(
            "name \"{name}\": {bad:?} is not allowed (only letters, digits and '_')"
        ));
    }
    Ok(())
}

fn parse_value(value: &str) -> Result<&str, String> {
    if value.starts_with([' ', '\t']) {
        return Err(
            "whitespace after '=' (no spaces around '='; to keep leading spaces, quote the \
             value: NAME=\" value\")"
                .into(),
        );
    }
    if let Some(inner) = value.strip_prefix('"') {
        let Some((quoted, after)) = inner.split_once('"') else {
            return Err(
                "unterminated quote (a quoted value ends with '\"' on the same line)".into(),
            );
        };
        if !after.is_empty() {
            return Err(format!(
                "text after the closing quote: \"{}\" (quoted values have no escapes, so they \
                 cannot contain '\"')",
                clip(after, 40)
            ));
        }
        return Ok(quoted);
    }
    if value.starts_with('\'') {
        return Err("single quotes are not supported (use double quotes, or none)".into());
    }
    if value.ends_with([' ', '\t']) {
        return Err("trailing whitespace after the value (quote the value to keep it)".into());
    }
    if value.contains(" #") || value.contains("\t#") {
        return Err(
            "'#' after whitespace: there are no inline comments (put the comment on a line of \
             its own, or quote the value)"
                .into(),
        );
    }
    Ok(value)
}

/// At most `max` characters of `s`, marked when cut.
fn clip(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((at, _)) => format!("{}...", &s[..at]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: &str = "/etc/x.env";

    fn ok(text: &str) -> Vec<(String, String, usize)> {
        parse(P, text.as_bytes())
            .unwrap_or_else(|e| panic!("unexpected errors: {e:?}"))
            .into_iter()
            .map(|s| (s.name, s.value, s.line))
            .collect()
    }

    fn errs(bytes: &[u8]) -> Vec<String> {
        match parse(P, bytes) {
            Ok(s) => panic!("parsed, expected errors: {s:?}"),
            Err(e) => e.iter().map(|e| e.to_string()).collect(),
        }
    }

    /// The single error of a one-setting file whose setting is on line 3.
    fn err3(line: &str) -> String {
        let text = format!("# header\n\n{line}\nNCCL_OK=1\n");
        let e = errs(text.as_bytes());
        assert_eq!(e.len(), 1, "{e:?}");
        e.into_iter().next().unwrap()
    }

    fn s(n: &str, v: &str, l: usize) -> (String, String, usize) {
        (n.into(), v.into(), l)
    }

    #[test]
    fn a_good_file() {
        let text = "\
# NCCL settings for the job
NCCL_SOCKET_IFNAME=eth0

   # indented comment
  NCCL_IB_HCA=mlx5_0:1,mlx5_1:1
NCCL_DEBUG_TIMESTAMP_FORMAT=[%F %T] x
_private=1
NCCL_EMPTY=
NCCL_QUOTED=\"  spaced # kept  \"
NCCL_QUOTED_EMPTY=\"\"
NCCL_EQ=a=b==c
NCCL_TAB=a\tb
NCCL_QUOTE_INSIDE=a\"b
NCCL_UTF8=héllo
";
        assert_eq!(
            ok(text),
            vec![
                s("NCCL_SOCKET_IFNAME", "eth0", 2),
                s("NCCL_IB_HCA", "mlx5_0:1,mlx5_1:1", 5),
                s("NCCL_DEBUG_TIMESTAMP_FORMAT", "[%F %T] x", 6),
                s("_private", "1", 7),
                s("NCCL_EMPTY", "", 8),
                s("NCCL_QUOTED", "  spaced # kept  ", 9),
                s("NCCL_QUOTED_EMPTY", "", 10),
                s("NCCL_EQ", "a=b==c", 11),
                s("NCCL_TAB", "a\tb", 12),
                s("NCCL_QUOTE_INSIDE", "a\"b", 13),
                s("NCCL_UTF8", "héllo", 14),
            ]
        );
    }

    #[test]
    fn empty_and_comment_only_files_have_no_settings() {
        assert!(ok("").is_empty());
        assert!(ok("\n\n").is_empty());
        assert!(ok("# only\n  # comments\n\t\n").is_empty());
    }

    #[test]
    fn last_line_without_newline() {
        assert_eq!(ok("A=1\nB=2"), vec![s("A", "1", 1), s("B", "2", 2)]);
    }

    #[test]
    fn crlf_line_endings_are_accepted() {
        assert_eq!(
            ok("# c\r\nA=1\r\n\r\nB=\"x \"\r\nC=3\n"),
            vec![s("A", "1", 2), s("B", "x ", 4), s("C", "3", 5)]
        );
    }

    #[test]
    fn a_stray_carriage_return_is_an_error() {
        assert_eq!(
            err3("NCCL_A=x\ry"),
            "/etc/x.env:3: carriage return at column 9 (only a CR right before the line's LF is dropped)"
        );
        // Two CRs before the LF: one is a line ending, the other is not.
        assert_eq!(
            err3("NCCL_A=x\r\r"),
            "/etc/x.env:3: carriage return at column 9 (only a CR right before the line's LF is dropped)"
        );
    }

    #[test]
    fn other_control_characters_are_errors() {
        assert_eq!(
            err3("NCCL_A=é\u{1}"),
            "/etc/x.env:3: control character U+0001 at column 9"
        );
        assert_eq!(
            err3("NCCL_A=\u{7f}"),
            "/etc/x.env:3: control character U+007F at column 8"
        );
    }

    #[test]
    fn duplicates_name_both_lines() {
        let e = errs(b"A=1\nB=2\n# c\nA=3\nA=1\n");
        assert_eq!(
            e,
            vec![
                "/etc/x.env:4: name \"A\" given twice (first on line 1)",
                "/etc/x.env:5: name \"A\" given twice (first on line 1)",
            ]
        );
        // Names are case-sensitive, as in the environment.
        assert_eq!(ok("a=1\nA=2\n").len(), 2);
    }

    #[test]
    fn bad_names() {
        assert_eq!(
            err3("1FOO=x"),
            "/etc/x.env:3: name \"1FOO\": must start with a letter or '_'"
        );
        assert_eq!(
            err3("FO-O=x"),
            "/etc/x.env:3: name \"FO-O\": '-' is not allowed (only letters, digits and '_')"
        );
        assert_eq!(
            err3("FOO BAR=x"),
            "/etc/x.env:3: name \"FOO BAR\": ' ' is not allowed (only letters, digits and '_')"
        );
        assert_eq!(
            err3("NCCLé=x"),
            "/etc/x.env:3: name \"NCCLé\": 'é' is not allowed (only letters, digits and '_')"
        );
        assert_eq!(err3("=x"), "/etc/x.env:3: missing name before '='");
        assert_eq!(
            err3("export NCCL_A=1"),
            "/etc/x.env:3: 'export' is not supported (write NAME=value)"
        );
        // "exported" is a name like any other.
        assert_eq!(ok("exported=1\n"), vec![s("exported", "1", 1)]);
    }

    #[test]
    fn no_whitespace_around_the_equals_sign() {
        assert_eq!(
            err3("NCCL_A =1"),
            "/etc/x.env:3: whitespace before '=' after \"NCCL_A\" (write NAME=value, no spaces around '=')"
        );
        assert_eq!(
            err3("NCCL_A= 1"),
            "/etc/x.env:3: whitespace after '=' (no spaces around '='; to keep leading spaces, quote the value: NAME=\" value\")"
        );
        assert_eq!(
            err3("NCCL_A=1 "),
            "/etc/x.env:3: trailing whitespace after the value (quote the value to keep it)"
        );
        assert_eq!(
            err3("NCCL_A=1\t"),
            "/etc/x.env:3: trailing whitespace after the value (quote the value to keep it)"
        );
    }

    #[test]
    fn a_line_without_equals() {
        assert_eq!(
            err3("NCCL_A"),
            "/etc/x.env:3: no '=' in \"NCCL_A\" (expected NAME=value)"
        );
        let long = "x".repeat(100);
        assert_eq!(
            err3(&long),
            format!(
                "/etc/x.env:3: no '=' in \"{}...\" (expected NAME=value)",
                "x".repeat(60)
            )
        );
    }

    #[test]
    fn quoting() {
        assert_eq!(
            err3("NCCL_A=\"abc"),
            "/etc/x.env:3: unterminated quote (a quoted value ends with '\"' on the same line)"
        );
        assert_eq!(
            err3("NCCL_A=\"a\"b\""),
            "/etc/x.env:3: text after the closing quote: \"b\"\" (quoted values have no escapes, so they cannot contain '\"')"
        );
        assert_eq!(
            err3("NCCL_A=\"a\" "),
            "/etc/x.env:3: text after the closing quote: \" \" (quoted values have no escapes, so they cannot contain '\"')"
        );
        assert_eq!(
            err3("NCCL_A='a b'"),
            "/etc/x.env:3: single quotes are not supported (use double quotes, or none)"
        );
        assert_eq!(
            err3("NCCL_A=1 # comment"),
            "/etc/x.env:3: '#' after whitespace: there are no inline comments (put the comment on a line of its own, or quote the value)"
        );
        // A '#' not after whitespace is text.
        assert_eq!(ok("NCCL_A=a#b\n"), vec![s("NCCL_A", "a#b", 1)]);
    }

    #[test]
    fn nul_bytes() {
        assert_eq!(
            errs(b"A=1\n\nB=x\0y\nC=3\n"),
            vec!["/etc/x.env:3: NUL byte at column 4"]
        );
        // Also in a comment: the file is not text.
        assert_eq!(
            errs(b"# a\0\nA=1\n"),
            vec!["/etc/x.env:1: NUL byte at column 4"]
        );
    }

    #[test]
    fn invalid_utf8() {
        assert_eq!(
            errs(b"A=1\nB=caf\xe9\n"),
            vec!["/etc/x.env:2: not valid UTF-8 (bad byte at column 6)"]
        );
        assert_eq!(
            errs(b"# \xff\xfe\n"),
            vec!["/etc/x.env:1: not valid UTF-8 (bad byte at column 3)"]
        );
    }

    #[test]
    fn byte_order_mark() {
        assert_eq!(
            errs(b"\xEF\xBB\xBFA=1\n"),
            vec!["/etc/x.env:1: starts with a UTF-8 byte order mark (save the file without it)"]
        );
    }

    #[test]
    fn names_that_cannot_be_set_in_the_file() {
        assert_eq!(
            err3("NCCL_BPF_ENV_FILE=/x"),
            "/etc/x.env:3: NCCL_BPF_ENV_FILE is read from the process environment only, it cannot be set in the file"
        );
        assert_eq!(
            err3("NCCL_ENV_PLUGIN=bpf"),
            "/etc/x.env:3: NCCL_ENV_PLUGIN is read by NCCL before it loads the plugin, set it in the process environment"
        );
    }

    #[test]
    fn every_error_is_reported_with_its_line() {
        let text = b"A=1\nbad line\n2X=1\nB = 2\nA=2\nC=\"x\nD=ok\nE=\xff\n";
        assert_eq!(
            errs(text),
            vec![
                "/etc/x.env:2: no '=' in \"bad line\" (expected NAME=value)",
                "/etc/x.env:3: name \"2X\": must start with a letter or '_'",
                "/etc/x.env:4: whitespace before '=' after \"B\" (write NAME=value, no spaces around '=')",
                "/etc/x.env:5: name \"A\" given twice (first on line 1)",
                "/etc/x.env:6: unterminated quote (a quoted value ends with '\"' on the same line)",
                "/etc/x.env:8: not valid UTF-8 (bad byte at column 3)",
            ]
        );
    }

    fn tmp(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("ncclbpf-env-file-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn load_reads_a_file() {
        let d = tmp("read");
        let p = d.join("x.env");
        std::fs::write(&p, "A=1\nB=\"two\"\n").unwrap();
        let got = load(&p).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!((got[1].name.as_str(), got[1].value.as_str()), ("B", "two"));
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn size_limit() {
        let d = tmp("size");
        let p = d.join("x.env");
        // Exactly the limit is read...
        let mut text = "A=1\n".to_string();
        text.push_str(&"#".repeat(MAX_BYTES as usize - text.len() - 1));
        text.push('\n');
        assert_eq!(text.len() as u64, MAX_BYTES);
        std::fs::write(&p, &text).unwrap();
        assert_eq!(load(&p).unwrap().len(), 1);
        // ...one byte more is not.
        text.push('\n');
        std::fs::write(&p, &text).unwrap();
        let e = load(&p).unwrap_err();
        assert_eq!(
            e.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
            vec![format!(
                "{}: is 1048577 bytes, over the limit of 1048576 (1 MiB)",
                p.display()
            )]
        );
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn missing_file_names_the_os_error() {
        let e = load(Path::new("/nonexistent/ncclbpf/x.env")).unwrap_err();
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].line, None);
        assert_eq!(
            e[0].to_string(),
            "/nonexistent/ncclbpf/x.env: cannot open: No such file or directory (os error 2)"
        );
    }

    #[test]
    fn directories_and_fifos_are_refused_without_blocking() {
        let d = tmp("kinds");
        let e = load(&d).unwrap_err();
        assert_eq!(e[0].what, "is a directory, not a settings file");
        let fifo = d.join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // A blocking open of a FIFO without a writer would hang here.
        let e = load(&fifo).unwrap_err();
        assert_eq!(
            e[0].what,
            "is not a regular file (a FIFO, socket or device is not read)"
        );
        let _ = std::fs::remove_dir_all(d);
    }
}
