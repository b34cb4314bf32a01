//! The line protocol.
//!
//! ```text
//! request = "status" LF
//!         | "reload " PATH LF              ; PATH: the rest of the line, absolute (the server
//!                                          ; resolves a relative one against its own cwd)
//!         | "stage " SEQ " " PATH LF       ; reload, with the tuner programs switched at the
//!                                          ; SEQ-th call of every communicator
//!         | "unstage" LF                   ; drop the last staged change (a tuner switch or a
//!                                          ; config update) if no communicator reached it
//!         | "stage-config " SEQ " " MAP " " PAIRS LF  ; new values for entries of config map
//!                                          ; MAP, seen from the SEQ-th call of every communicator
//! MAP     = 1*64 ( ALPHA / DIGIT / "_" / "." )
//! PAIRS   = KEY "=" VALUE *( "," KEY "=" VALUE )   ; 1 to 256 pairs, no KEY twice
//! KEY     = 1*DIGIT                        ; a u32
//! VALUE   = 1*DIGIT / "0x" 1*HEXDIG        ; a u64
//! reply   = *item final
//! final   = "ok" LF                        ; the request did what the items say
//!         | "error: " TEXT LF              ; nothing was changed
//! item    = "process pid=" N " generation=" N " live_programs=" N LF
//!         | "hook " SECTION " -" LF        ; status: nothing attached
//!         | "hook " SECTION " " NAME " gen=" N " insns=" N " tag=" HEX16 " tier=" TIER
//!           " source=" PATH LF             ; status: what runs there
//!         | "swapped " SECTION " " OLD " -> " NEW " gen=" N "->" N TIMES LF
//!         | "attached " SECTION " " NEW " gen=" N TIMES LF     ; the hook had no program
//!         | "refused " SECTION " " NAME ": " TEXT LF           ; not swapped, on purpose
//!         | "ignored " SECTION " " NAME ": " TEXT LF           ; attaches to no hook
//!         | "rejected " WHAT " " NAME ": " TEXT LF             ; why the request failed
//!         | "staged " SECTION " " NAME " at=" N LF              ; switched at call N
//!         | "staged config " MAP " " PAIRS " at=" N LF          ; config values from call N
//!         | "comm " HEX " seq=" N [" switch_at=" N] LF          ; a tuner context: calls so far,
//!                                          ; and the call of the next staged change, if any
//!         | "| " TEXT LF                   ; one more line of the item above (a verifier log)
//! TIMES   = " insns=" N " verify_us=" F " compile_us=" F " swap_us=" F
//! ```
//!
//! `WHAT` is a section (`net/complete`) or `map`. A reload that fails for any reason (the file,
//! its parsing, a program the verifier rejects, a map whose shape or scope changed) answers `error:`
//! after its `rejected` items, and every hook keeps the program it had. Unknown item lines
//! are kept as [`Item::Other`] so older clients read newer servers (and an older client reads
//! `staged config` as an [`Item::Staged`] of section `config`, named after the map).

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::Duration;

/// The longest request line the server reads.
pub const MAX_REQUEST: usize = 8192;

/// What the refusal of a tuner program says.
pub const TUNER_REFUSAL: &str = "a tuner swap must take effect at the same collective on every rank of a communicator, \
     so a plain reload leaves the tuner as it is: stage it with `ncclbpf reload --at-seq N`, which switches every \
     communicator at its N-th collective";

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// What is attached where.
    Status,
    /// Load, verify and compile an object and swap its `net/*` programs in.
    Reload(PathBuf),
    /// As `Reload`, and the object's tuner programs take over at call `at` of every
    /// communicator (the same collective on every rank).
    Stage { at: u64, path: PathBuf },
    /// Drop the last staged change (a tuner switch or a config update) that no communicator has
    /// reached.
    Unstage,
    /// New values for entries of the tuner program's config map `map`, seen from call `at` of
    /// every communicator (the same collective on every rank): (entry, value) pairs, checked by
    /// [`check_config`].
    StageConfig {
        at: u64,
        map: String,
        values: Vec<(u32, u64)>,
    },
}

/// The most (entry, value) pairs one staged config update carries.
pub const MAX_CONFIG_PAIRS: usize = 256;
/// The longest config map name.
pub const MAX_MAP_NAME: usize = 64;

/// A config update as it may travel: a map name of 1 to [`MAX_MAP_NAME`] characters of
/// `[A-Za-z0-9_.]`, 1 to [`MAX_CONFIG_PAIRS`] pairs, no entry twice. Whether the map is one
/// the running program can take new values for is the server's to say.
pub fn check_config(map: &str, values: &[(u32, u64)]) -> Result<(), String> {
    if map.is_empty() || map.len() > MAX_MAP_NAME {
        return Err(format!(
            "config map name {map:?}: 1 to {MAX_MAP_NAME} characters"
        ));
    }
    if let Some(c) = map
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '.'))
    {
        return Err(format!(
            "config map name {map:?}: {c:?} is not one of A-Z a-z 0-9 _ ."
        ));
    }
    if values.is_empty() {
        return Err(format!("no values for config map '{map}'"));
    }
    if values.len() > MAX_CONFIG_PAIRS {
        return Err(format!(
            "{} values for config map '{map}': at most {MAX_CONFIG_PAIRS} in one update",
            values.len()
        ));
    }
    let mut keys: Vec<u32> = values.iter().map(|(k, _)| *k).collect();
    keys.sort_unstable();
    if let Some(w) = keys.windows(2).find(|w| w[0] == w[1]) {
        return Err(format!(
            "entry {} of config map '{map}' is given twice",
            w[0]
        ));
    }
    Ok(())
}

/// A decimal number: digits only (no sign, no spaces).
fn decimal(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// One `KEY=VALUE` pair: the entry in decimal (a u32), the value in decimal or `0x` hex (a u64).
pub fn parse_config_pair(s: &str) -> Result<(u32, u64), String> {
    let Some((k, v)) = s.split_once('=') else {
        return Err(format!("{s:?} is not KEY=VALUE"));
    };
    let key = decimal(k)
        .and_then(|k| u32::try_from(k).ok())
        .ok_or_else(|| format!("{s:?}: {k:?} is not an entry number (0 to {})", u32::MAX))?;
    let value = match v.strip_prefix("0x") {
        Some(h) if !h.is_empty() && h.bytes().all(|b| b.is_ascii_hexdigit()) => {
            u64::from_str_radix(h, 16).ok()
        }
        Some(_) => None,
        None => decimal(v),
    }
    .ok_or_else(|| format!("{s:?}: {v:?} is not a u64 value (decimal, or hex after 0x)"))?;
    Ok((key, value))
}

/// `KEY=VALUE[,KEY=VALUE...]` (not yet checked by [`check_config`]).
fn parse_pairs(s: &str) -> Result<Vec<(u32, u64)>, String> {
    s.split(',').map(parse_config_pair).collect()
}

/// `k=v,k=v` (as [`parse_config_pair`] reads each): values in decimal, or with `shortest` in hex
/// where that is shorter (so that the most pairs fit in a request line).
pub fn config_pairs_text(values: &[(u32, u64)], shortest: bool) -> String {
    let kv: Vec<String> = values
        .iter()
        .map(|(k, v)| {
            let d = v.to_string();
            let h = format!("{v:#x}");
            if shortest && h.len() < d.len() {
                format!("{k}={h}")
            } else {
                format!("{k}={d}")
            }
        })
        .collect();
    kv.join(",")
}

/// `stage-config` after its verb: `SEQ MAP PAIRS`.
fn parse_stage_config(rest: &[u8]) -> Result<Request, String> {
    let usage = "stage-config needs a sequence number, a config map and KEY=VALUE[,KEY=VALUE...]";
    let rest = std::str::from_utf8(rest).map_err(|_| format!("{usage} (in ASCII)"))?;
    let w: Vec<&str> = rest.split(' ').collect();
    let [n, map, pairs] = w[..] else {
        return Err(format!("{usage}, separated by one space"));
    };
    let at = decimal(n).ok_or_else(|| format!("stage-config: {n:?} is not a sequence number"))?;
    let values = parse_pairs(pairs).map_err(|e| format!("stage-config: {e}"))?;
    check_config(map, &values).map_err(|e| format!("stage-config: {e}"))?;
    Ok(Request::StageConfig {
        at,
        map: map.to_string(),
        values,
    })
}

impl Request {
    /// Parses one request line (with or without its line feed).
    pub fn parse(line: &[u8]) -> Result<Request, String> {
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line == b"status" {
            return Ok(Request::Status);
        }
        if line == b"unstage" {
            return Ok(Request::Unstage);
        }
        if let Some(rest) = line.strip_prefix(b"stage-config ") {
            return parse_stage_config(rest);
        }
        if let Some(rest) = line.strip_prefix(b"stage ") {
            let (n, p) = match rest.iter().position(|&b| b == b' ') {
                Some(i) => (&rest[..i], &rest[i + 1..]),
                None => {
                    return Err("stage needs a sequence number and the path of an object".into());
                }
            };
            let at = std::str::from_utf8(n)
                .ok()
                .and_then(|n| n.parse::<u64>().ok())
                .ok_or_else(|| {
                    format!(
                        "stage: {:?} is not a sequence number",
                        String::from_utf8_lossy(n)
                    )
                })?;
            if p.is_empty() || p.contains(&0) {
                return Err("stage needs the path of an object".into());
            }
            return Ok(Request::Stage {
                at,
                path: PathBuf::from(OsStr::from_bytes(p)),
            });
        }
        if let Some(p) = line.strip_prefix(b"reload ") {
            if p.is_empty() || p.contains(&0) {
                return Err("reload needs the path of an object".into());
            }
            return Ok(Request::Reload(PathBuf::from(OsStr::from_bytes(p))));
        }
        Err(format!(
            "unknown request {:?}: expected 'status', 'reload <path>', 'stage <seq> <path>', \
             'stage-config <seq> <map> <key>=<value>[,...]' or 'unstage'",
            String::from_utf8_lossy(line)
        ))
    }

    /// The request as sent, line feed included.
    pub fn to_line(&self) -> Result<Vec<u8>, String> {
        let (head, p) = match self {
            Request::Status => return Ok(b"status\n".to_vec()),
            Request::Unstage => return Ok(b"unstage\n".to_vec()),
            Request::Reload(p) => ("reload ".to_string(), p),
            Request::Stage { at, path } => (format!("stage {at} "), path),
            Request::StageConfig { at, map, values } => {
                check_config(map, values)?;
                let line = format!(
                    "stage-config {at} {map} {}\n",
                    config_pairs_text(values, true)
                );
                // Never longer (at most 256 pairs of 30 characters), but say so if it were.
                if line.len() > MAX_REQUEST {
                    return Err(format!("the update of '{map}' is too long for one request"));
                }
                return Ok(line.into_bytes());
            }
        };
        let b = p.as_os_str().as_bytes();
        if b.is_empty() || b.contains(&b'\n') || b.contains(&0) {
            return Err(format!("path {p:?} cannot be sent on one line"));
        }
        let mut out = head.into_bytes();
        out.extend_from_slice(b);
        out.push(b'\n');
        if out.len() > MAX_REQUEST {
            return Err(format!("path {p:?} is too long"));
        }
        Ok(out)
    }
}

/// A program attached to a hook (`status`).
#[derive(Clone, Debug, PartialEq)]
pub struct ProgramInfo {
    pub name: String,
    /// The process's net generation when it was attached (1: at start).
    pub generation: u64,
    pub insns: u64,
    /// 16 hex digits of a hash of the program's instructions and section: the same program
    /// has the same tag.
    pub tag: String,
    /// `jit` or `interpreter`.
    pub tier: String,
    /// The object it came from.
    pub source: String,
}

/// A hook whose program a reload replaced (or attached, when it had none).
#[derive(Clone, Debug, PartialEq)]
pub struct Swap {
    pub section: String,
    /// The program it had and the generation that attached it.
    pub old: Option<(String, u64)>,
    pub new: String,
    pub generation: u64,
    pub insns: u64,
    pub verify: Duration,
    pub compile: Duration,
    /// The swap itself (every hook of one reload changes in the same store).
    pub swap: Duration,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Item {
    Process {
        pid: u32,
        generation: u64,
        live_programs: u64,
    },
    Hook {
        section: String,
        program: Option<ProgramInfo>,
    },
    Swapped(Swap),
    Refused {
        section: String,
        name: String,
        reason: String,
    },
    Ignored {
        section: String,
        name: String,
        reason: String,
    },
    Rejected {
        what: String,
        name: String,
        message: String,
    },
    /// A tuner program staged to take over at call `at` of every communicator.
    Staged {
        section: String,
        name: String,
        at: u64,
    },
    /// New values for entries of config map `map`, seen from call `at` of every communicator.
    StagedConfig {
        map: String,
        values: Vec<(u32, u64)>,
        at: u64,
    },
    /// A tuner context (one communicator): calls so far, and the call at which a staged
    /// program takes over, if any.
    Comm {
        id: u64,
        seq: u64,
        switch_at: Option<u64>,
    },
    /// A line this version does not know.
    Other(String),
}

/// A whole answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    pub items: Vec<Item>,
    /// `Ok`: `ok`; `Err(text)`: `error: text`.
    pub result: Result<(), String>,
}

impl Reply {
    pub fn ok(items: Vec<Item>) -> Reply {
        Reply {
            items,
            result: Ok(()),
        }
    }

    pub fn error(items: Vec<Item>, text: impl Into<String>) -> Reply {
        Reply {
            items,
            result: Err(text.into()),
        }
    }

    /// The reply as sent.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        for i in &self.items {
            i.write(&mut s);
        }
        match &self.result {
            Ok(()) => s.push_str("ok\n"),
            Err(e) => {
                let one: Vec<&str> = e.lines().filter(|l| !l.trim().is_empty()).collect();
                let _ = writeln!(s, "error: {}", one.join("; "));
            }
        }
        s
    }

    /// Parses a reply from its lines (up to and including the final line).
    pub fn parse<I, S>(lines: I) -> Result<Reply, String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut items: Vec<Item> = vec![];
        for line in lines {
            let line = line.as_ref();
            let line = line.strip_suffix('\n').unwrap_or(line);
            if line == "ok" {
                return Ok(Reply::ok(items));
            }
            if let Some(e) = line.strip_prefix("error: ") {
                return Ok(Reply::error(items, e));
            }
            if let Some(more) =
                line.strip_prefix("| ")
                    .or(if line == "|" { Some("") } else { None })
            {
                match items.last_mut() {
                    Some(
                        Item::Rejected { message: t, .. }
                        | Item::Refused { reason: t, .. }
                        | Item::Ignored { reason: t, .. },
                    ) => {
                        t.push('\n');
                        t.push_str(more);
                    }
                    _ => items.push(Item::Other(line.to_string())),
                }
                continue;
            }
            items.push(Item::parse(line));
        }
        Err("the reply ended without a final 'ok' or 'error:' line".into())
    }
}

/// A token: no spaces (section and program names never have any; replaced if they do).
fn tok(s: &str) -> String {
    if s.is_empty() {
        return "?".into();
    }
    s.chars()
        .map(|c| if c.is_whitespace() { '_' } else { c })
        .collect()
}

/// Microseconds: one decimal, three below 10 µs (a swap takes well under one).
fn us(d: Duration) -> String {
    let v = d.as_secs_f64() * 1e6;
    if v < 10.0 {
        format!("{v:.3}")
    } else {
        format!("{v:.1}")
    }
}

/// `text` after `head`, continuation lines prefixed `| `.
fn with_text(out: &mut String, head: &str, text: &str) {
    let mut lines = text.lines();
    let _ = writeln!(out, "{head}: {}", lines.next().unwrap_or(""));
    for l in lines {
        if l.is_empty() {
            out.push_str("|\n");
        } else {
            let _ = writeln!(out, "| {l}");
        }
    }
}

/// `key=value` fields after the positional words.
fn fields(rest: &str) -> Vec<(&str, &str)> {
    rest.split(' ').filter_map(|w| w.split_once('=')).collect()
}

fn field<'a>(f: &[(&'a str, &'a str)], k: &str) -> Option<&'a str> {
    f.iter().find(|(key, _)| *key == k).map(|(_, v)| *v)
}

fn num(f: &[(&str, &str)], k: &str) -> Option<u64> {
    field(f, k)?.parse().ok()
}

fn dur(f: &[(&str, &str)], k: &str) -> Option<Duration> {
    let v: f64 = field(f, k)?.parse().ok()?;
    (v.is_finite() && v >= 0.0).then(|| Duration::from_secs_f64(v / 1e6))
}

impl Item {
    fn write(&self, out: &mut String) {
        match self {
            Item::Process {
                pid,
                generation,
                live_programs,
            } => {
                let _ = writeln!(
                    out,
                    "process pid={pid} generation={generation} live_programs={live_programs}"
                );
            }
            Item::Hook {
                section,
                program: None,
            } => {
                let _ = writeln!(out, "hook {} -", tok(section));
            }
            Item::Hook {
                section,
                program: Some(p),
            } => {
                let source: String = p.source.chars().filter(|c| *c != '\n').collect();
                let _ = writeln!(
                    out,
                    "hook {} {} gen={} insns={} tag={} tier={} source={source}",
                    tok(section),
                    tok(&p.name),
                    p.generation,
                    p.insns,
                    tok(&p.tag),
                    tok(&p.tier)
                );
            }
            Item::Swapped(s) => {
                let times = format!(
                    "insns={} verify_us={} compile_us={} swap_us={}",
                    s.insns,
                    us(s.verify),
                    us(s.compile),
                    us(s.swap)
                );
                let _ = match &s.old {
                    Some((old, og)) => writeln!(
                        out,
                        "swapped {} {} -> {} gen={og}->{} {times}",
                        tok(&s.section),
                        tok(old),
                        tok(&s.new),
                        s.generation
                    ),
                    None => writeln!(
                        out,
                        "attached {} {} gen={} {times}",
                        tok(&s.section),
                        tok(&s.new),
                        s.generation
                    ),
                };
            }
            Item::Refused {
                section,
                name,
                reason,
            } => with_text(
                out,
                &format!("refused {} {}", tok(section), tok(name)),
                reason,
            ),
            Item::Ignored {
                section,
                name,
                reason,
            } => with_text(
                out,
                &format!("ignored {} {}", tok(section), tok(name)),
                reason,
            ),
            Item::Rejected {
                what,
                name,
                message,
            } => with_text(
                out,
                &format!("rejected {} {}", tok(what), tok(name)),
                message,
            ),
            Item::Staged { section, name, at } => {
                let _ = writeln!(out, "staged {} {} at={at}", tok(section), tok(name));
            }
            Item::StagedConfig { map, values, at } => {
                let _ = writeln!(
                    out,
                    "staged config {} {} at={at}",
                    tok(map),
                    config_pairs_text(values, false)
                );
            }
            Item::Comm { id, seq, switch_at } => {
                let _ = write!(out, "comm {id:#018x} seq={seq}");
                if let Some(a) = switch_at {
                    let _ = write!(out, " switch_at={a}");
                }
                out.push('\n');
            }
            Item::Other(l) => {
                out.push_str(l);
                out.push('\n');
            }
        }
    }

    /// One item line (not a continuation).
    fn parse(line: &str) -> Item {
        Item::try_parse(line).unwrap_or_else(|| Item::Other(line.to_string()))
    }

    fn try_parse(line: &str) -> Option<Item> {
        let (verb, rest) = line.split_once(' ')?;
        match verb {
            "staged" => {
                let w: Vec<&str> = rest.split(' ').collect();
                if let ["config", map, pairs, _at] = w[..] {
                    return Some(Item::StagedConfig {
                        map: map.to_string(),
                        values: parse_pairs(pairs).ok()?,
                        at: num(&fields(rest), "at")?,
                    });
                }
                Some(Item::Staged {
                    section: (*w.first()?).to_string(),
                    name: (*w.get(1)?).to_string(),
                    at: num(&fields(rest), "at")?,
                })
            }
            "comm" => {
                let id = rest.split(' ').next()?.strip_prefix("0x")?;
                let f = fields(rest);
                Some(Item::Comm {
                    id: u64::from_str_radix(id, 16).ok()?,
                    seq: num(&f, "seq")?,
                    switch_at: num(&f, "switch_at"),
                })
            }
            "process" => {
                let f = fields(rest);
                Some(Item::Process {
                    pid: num(&f, "pid")? as u32,
                    generation: num(&f, "generation")?,
                    live_programs: num(&f, "live_programs")?,
                })
            }
            "hook" => {
                let mut w = rest.splitn(3, ' ');
                let section = w.next()?.to_string();
                let name = w.next()?;
                if name == "-" {
                    return Some(Item::Hook {
                        section,
                        program: None,
                    });
                }
                let more = w.next()?;
                let (kv, source) = more.split_once(" source=")?;
                let f = fields(kv);
                Some(Item::Hook {
                    section,
                    program: Some(ProgramInfo {
                        name: name.to_string(),
                        generation: num(&f, "gen")?,
                        insns: num(&f, "insns")?,
                        tag: field(&f, "tag")?.to_string(),
                        tier: field(&f, "tier")?.to_string(),
                        source: source.to_string(),
                    }),
                })
            }
            "swapped" | "attached" => {
                let w: Vec<&str> = rest.split(' ').collect();
                let section = (*w.first()?).to_string();
                let f = fields(rest);
                let (old, new, generation) = if verb == "swapped" {
                    if w.get(2) != Some(&"->") {
                        return None;
                    }
                    let (og, ng) = field(&f, "gen")?.split_once("->")?;
                    (
                        Some((w.get(1)?.to_string(), og.parse().ok()?)),
                        w.get(3)?.to_string(),
                        ng.parse().ok()?,
                    )
                } else {
                    (None, w.get(1)?.to_string(), num(&f, "gen")?)
                };
                Some(Item::Swapped(Swap {
                    section,
                    old,
                    new,
                    generation,
                    insns: num(&f, "insns")?,
                    verify: dur(&f, "verify_us")?,
                    compile: dur(&f, "compile_us")?,
                    swap: dur(&f, "swap_us")?,
                }))
            }
            "refused" | "ignored" | "rejected" => {
                let (head, text) = rest.split_once(": ")?;
                let (a, b) = head.split_once(' ')?;
                let (a, b, text) = (a.to_string(), b.to_string(), text.to_string());
                Some(match verb {
                    "refused" => Item::Refused {
                        section: a,
                        name: b,
                        reason: text,
                    },
                    "ignored" => Item::Ignored {
                        section: a,
                        name: b,
                        reason: text,
                    },
                    _ => Item::Rejected {
                        what: a,
                        name: b,
                        message: text,
                    },
                })
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(r: &Reply) {
        let text = r.to_text();
        let back = Reply::parse(text.lines()).unwrap();
        // Durations go through microseconds with one decimal.
        assert_eq!(back.to_text(), text);
        assert_eq!(back.result, r.result);
        assert_eq!(back.items.len(), r.items.len(), "{text}");
    }

    #[test]
    fn requests() {
        assert_eq!(Request::parse(b"status\n").unwrap(), Request::Status);
        assert_eq!(Request::parse(b"status\r\n").unwrap(), Request::Status);
        assert_eq!(
            Request::parse(b"reload /a b/c.o\n").unwrap(),
            Request::Reload("/a b/c.o".into())
        );
        assert!(Request::parse(b"reload \n").is_err());
        assert!(Request::parse(b"rm -rf /\n").is_err());
        let r = Request::Reload("/x/y.o".into());
        assert_eq!(Request::parse(&r.to_line().unwrap()).unwrap(), r);
        assert!(Request::Reload("/x\n/y.o".into()).to_line().is_err());
        assert_eq!(Request::parse(b"unstage\n").unwrap(), Request::Unstage);
        assert_eq!(
            Request::parse(b"stage 4096 /a b/t.o\n").unwrap(),
            Request::Stage {
                at: 4096,
                path: "/a b/t.o".into()
            }
        );
        for bad in [
            &b"stage\n"[..],
            b"stage 12\n",
            b"stage 12 \n",
            b"stage -1 /t.o\n",
            b"stage x /t.o\n",
        ] {
            assert!(
                Request::parse(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let r = Request::Stage {
            at: u64::MAX,
            path: "/x/t.o".into(),
        };
        assert_eq!(Request::parse(&r.to_line().unwrap()).unwrap(), r);
        assert_eq!(
            Request::parse(&Request::Unstage.to_line().unwrap()).unwrap(),
            Request::Unstage
        );
    }

    fn stage_config(at: u64, map: &str, values: &[(u32, u64)]) -> Request {
        Request::StageConfig {
            at,
            map: map.into(),
            values: values.to_vec(),
        }
    }

    #[test]
    fn config_requests_round_trip() {
        assert_eq!(
            Request::parse(b"stage-config 4096 slo_budget_ns 3=200000,5=0x1e8480\n").unwrap(),
            stage_config(4096, "slo_budget_ns", &[(3, 200_000), (5, 2_000_000)])
        );
        assert_eq!(
            Request::parse(b"stage-config 7 a.B_9 0=0\r\n").unwrap(),
            stage_config(7, "a.B_9", &[(0, 0)])
        );
        for r in [
            stage_config(1, "limit", &[(0, 100)]),
            stage_config(u64::MAX, &"m".repeat(MAX_MAP_NAME), &[(u32::MAX, u64::MAX)]),
            stage_config(500, "x", &[(2, 1), (0, 0x10), (1, 1 << 40)]),
        ] {
            let line = r.to_line().unwrap();
            assert_eq!(Request::parse(&line).unwrap(), r, "{line:?}");
        }
        // Values go out in hex where that is shorter, in decimal otherwise.
        assert_eq!(
            stage_config(9, "limit", &[(0, 100), (1, u64::MAX)])
                .to_line()
                .unwrap(),
            b"stage-config 9 limit 0=100,1=0xffffffffffffffff\n"
        );
        // The longest update there can be fits in one request.
        let most: Vec<(u32, u64)> = (0..MAX_CONFIG_PAIRS as u32)
            .map(|i| (u32::MAX - i, u64::MAX - i as u64))
            .collect();
        let r = stage_config(u64::MAX, &"m".repeat(MAX_MAP_NAME), &most);
        let line = r.to_line().unwrap();
        assert!(line.len() <= MAX_REQUEST, "{}", line.len());
        assert_eq!(Request::parse(&line).unwrap(), r);
    }

    #[test]
    fn config_requests_are_parsed_strictly() {
        let pairs = |n: u32| {
            (0..n)
                .map(|i| format!("{i}=1"))
                .collect::<Vec<_>>()
                .join(",")
        };
        let long = format!("stage-config 5 {} 0=1\n", "m".repeat(MAX_MAP_NAME + 1));
        let many = format!("stage-config 5 m {}\n", pairs(MAX_CONFIG_PAIRS as u32 + 1));
        let ok = format!("stage-config 5 m {}\n", pairs(MAX_CONFIG_PAIRS as u32));
        assert!(Request::parse(ok.as_bytes()).is_ok());
        for (bad, why) in [
            (&b"stage-config\n"[..], "unknown request"),
            (b"stage-config \n", "needs a sequence number"),
            (b"stage-config 5\n", "needs a sequence number"),
            (b"stage-config 5 limit\n", "needs a sequence number"),
            (b"stage-config 5 limit 0=1 1=2\n", "one space"),
            (b"stage-config 5  limit 0=1\n", "one space"),
            (b"stage-config 5 limit 0=1 \n", "one space"),
            (b"stage-config +5 limit 0=1\n", "not a sequence number"),
            (b"stage-config -1 limit 0=1\n", "not a sequence number"),
            (b"stage-config 0x5 limit 0=1\n", "not a sequence number"),
            (
                b"stage-config 18446744073709551616 limit 0=1\n",
                "not a sequence number",
            ),
            (b"stage-config 5 li-mit 0=1\n", "is not one of"),
            (b"stage-config 5 li/mit 0=1\n", "is not one of"),
            (long.as_bytes(), "1 to 64 characters"),
            (b"stage-config 5 limit 0\n", "is not KEY=VALUE"),
            (b"stage-config 5 limit =1\n", "not an entry number"),
            (b"stage-config 5 limit 0x1=1\n", "not an entry number"),
            (b"stage-config 5 limit +1=1\n", "not an entry number"),
            (
                b"stage-config 5 limit 4294967296=1\n",
                "not an entry number",
            ),
            (b"stage-config 5 limit 0=\n", "not a u64 value"),
            (b"stage-config 5 limit 0=-1\n", "not a u64 value"),
            (b"stage-config 5 limit 0=+1\n", "not a u64 value"),
            (b"stage-config 5 limit 0=0x\n", "not a u64 value"),
            (b"stage-config 5 limit 0=0xg\n", "not a u64 value"),
            (b"stage-config 5 limit 0=0X10\n", "not a u64 value"),
            (b"stage-config 5 limit 0=1e3\n", "not a u64 value"),
            (
                b"stage-config 5 limit 0=18446744073709551616\n",
                "not a u64 value",
            ),
            (
                b"stage-config 5 limit 0=0x10000000000000000\n",
                "not a u64 value",
            ),
            (b"stage-config 5 limit 0=1=2\n", "not a u64 value"),
            (b"stage-config 5 limit 0=1,\n", "is not KEY=VALUE"),
            (b"stage-config 5 limit ,0=1\n", "is not KEY=VALUE"),
            (b"stage-config 5 limit 0=1,,1=2\n", "is not KEY=VALUE"),
            (
                b"stage-config 5 limit 3=1,0=2,3=4\n",
                "entry 3 of config map 'limit' is given twice",
            ),
            (many.as_bytes(), "at most 256"),
            (b"stage-config 5 lim\xffit 0=1\n", "ASCII"),
        ] {
            let e = Request::parse(bad).unwrap_err();
            assert!(
                e.contains(why),
                "{:?}: {e} (expected {why:?})",
                String::from_utf8_lossy(bad)
            );
        }
        // What cannot be parsed is not sent either.
        for (map, values) in [
            ("", vec![(0, 1)]),
            ("a b", vec![(0, 1)]),
            ("a\nb", vec![(0, 1)]),
            ("limit", vec![]),
            ("limit", vec![(1, 1), (1, 2)]),
        ] {
            assert!(stage_config(5, map, &values).to_line().is_err(), "{map:?}");
        }
        assert!(parse_config_pair("7=0x0a").unwrap() == (7, 10));
    }

    #[test]
    fn staged_config_items_round_trip() {
        let r = Reply::ok(vec![
            Item::StagedConfig {
                map: "slo_budget_ns".into(),
                values: vec![(3, 200_000), (5, u64::MAX)],
                at: 9000,
            },
            Item::Staged {
                section: "tuner".into(),
                name: "size_aware".into(),
                at: 100_000,
            },
        ]);
        assert_eq!(
            r.to_text(),
            "staged config slo_budget_ns 3=200000,5=18446744073709551615 at=9000\nstaged tuner size_aware at=100000\nok\n"
        );
        assert_eq!(Reply::parse(r.to_text().lines()).unwrap(), r);
        // A line this version cannot read is kept as it is.
        let odd = Reply::parse(["staged config limit 0=x at=5", "ok"]).unwrap();
        assert_eq!(
            odd.items,
            [Item::Other("staged config limit 0=x at=5".into())]
        );
    }

    #[test]
    fn staging_items_round_trip() {
        let r = Reply::ok(vec![
            Item::Staged {
                section: "tuner".into(),
                name: "size_aware".into(),
                at: 100_000,
            },
            Item::Comm {
                id: 0xc0ffee,
                seq: 42,
                switch_at: Some(100_000),
            },
            Item::Comm {
                id: u64::MAX,
                seq: 0,
                switch_at: None,
            },
        ]);
        assert_eq!(
            r.to_text(),
            "staged tuner size_aware at=100000\ncomm 0x0000000000c0ffee seq=42 switch_at=100000\ncomm 0xffffffffffffffff seq=0\nok\n"
        );
        assert_eq!(Reply::parse(r.to_text().lines()).unwrap(), r);
    }

    #[test]
    fn replies_round_trip() {
        let d = Duration::from_micros;
        let r = Reply::ok(vec![
            Item::Process {
                pid: 7,
                generation: 2,
                live_programs: 3,
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
                    insns: 57,
                    tag: "0123456789abcdef".into(),
                    tier: "jit".into(),
                    source: "/a dir/net stats.o".into(),
                }),
            },
            Item::Swapped(Swap {
                section: "net/complete".into(),
                old: Some(("on_complete".into(), 1)),
                new: "on_complete_v2".into(),
                generation: 2,
                insns: 60,
                verify: d(312),
                compile: d(45),
                swap: d(1),
            }),
            Item::Swapped(Swap {
                section: "net/isend".into(),
                old: None,
                new: "on_isend".into(),
                generation: 2,
                insns: 6,
                verify: d(3),
                compile: d(4),
                swap: d(1),
            }),
            Item::Refused {
                section: "tuner".into(),
                name: "size_aware".into(),
                reason: TUNER_REFUSAL.into(),
            },
        ]);
        roundtrip(&r);
        let back = Reply::parse(r.to_text().lines()).unwrap();
        assert_eq!(back.items[..3], r.items[..3]);
        let Item::Swapped(s) = &back.items[3] else {
            panic!()
        };
        assert_eq!(
            (s.old.clone(), s.new.as_str(), s.generation, s.verify),
            (Some(("on_complete".into(), 1)), "on_complete_v2", 2, d(312))
        );
        assert_eq!(back.items[5], r.items[5]);
    }

    #[test]
    fn multi_line_messages_and_errors() {
        let log = "program 'prog' rejected by the verifier:\ninsn 1: bad\n\n  at x.c:3";
        let r = Reply::error(
            vec![Item::Rejected {
                what: "net/complete".into(),
                name: "prog".into(),
                message: log.into(),
            }],
            "1 program rejected\nnothing was changed",
        );
        let text = r.to_text();
        assert!(text.ends_with("error: 1 program rejected; nothing was changed\n"));
        assert!(
            text.contains("\n| insn 1: bad\n|\n|   at x.c:3\n"),
            "{text}"
        );
        let back = Reply::parse(text.lines()).unwrap();
        assert_eq!(back.items, r.items);
        assert_eq!(
            back.result,
            Err("1 program rejected; nothing was changed".into())
        );
        assert!(Reply::parse(["hook net/isend -"]).is_err(), "no final line");
        let odd = Reply::parse(["frobnicated 3 things", "ok"]).unwrap();
        assert_eq!(odd.items, [Item::Other("frobnicated 3 things".into())]);
    }
}
