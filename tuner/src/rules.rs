//! NCCL's tuner rules: the CSV file of NCCL's example tuner plugin (`nccl_tuner.conf`; NCCL's
//! `plugins/tuner/example`, `ext-tuner/example` in older releases), read strictly and applied
//! by the `rules` policy (`policies/src/rules.c`).
//!
//! # Where the file is
//!
//! `NCCL_TUNER_CONFIG_FILE`, else `nccl_tuner.conf` in the working directory, as NCCL's example
//! tuner looks for it. It is read once, when the tuner policy loads, if the policy object has an
//! ARRAY map named `tuner_rules` ([`install`]); the rules are written into that map before the
//! first decision.
//!
//! # Format
//!
//! One rule per line, 8, 9 or 10 comma-separated fields:
//!
//! ```text
//! collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks[,numPipeOps[,regBuff]]
//! ```
//!
//! | # | field | accepted |
//! |---|---|---|
//! | 1 | collective | `broadcast`, `reduce`, `allgather`, `reducescatter`, `allreduce` |
//! | 2 | min_bytes | a decimal byte count (`0` … 2^64 − 1) |
//! | 3 | max_bytes | a decimal byte count ≥ min_bytes, or `-1`: no upper limit |
//! | 4 | algorithm | `tree`, `ring`, `collnet_direct`, `collnet_chain`, `nvls`, `nvls_tree`, `pat` |
//! | 5 | protocol | `ll`, `ll128`, `simple` |
//! | 6 | channels | `1` … `64`, or `-1`: NCCL's channel count |
//! | 7 | nNodes | a count ≥ 1, or `-1`: any |
//! | 8 | nRanks | a count ≥ 1 (and ≥ nNodes), or `-1`: any |
//! | 9 | numPipeOps | a count ≥ 1, or `-1`: any (the default when the field is left out) |
//! | 10 | regBuff | `-1`: any (the default); `0` (buffers not registered) or `1` (registered) parse, but such a rule is skipped (below) |
//!
//! Names are lower case, as NCCL's example tuner compares them. Spaces and tabs around a field
//! are ignored, and so are empty fields at the end of a line (a spreadsheet's export of a short
//! row, `…,-1,,`); lines may end in CRLF. Lines starting with `#` are comments, blank lines are
//! skipped. The column header NCCL's README suggests for spreadsheets
//! (`collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks[,numPipeOps[,regBuff]]`,
//! any case) is skipped when it is the first line that is not a comment. At most [`MAX_RULES`]
//! rules.
//!
//! # Matching
//!
//! Rules are tried in file order; the first one whose collective is the call's, with
//! `min_bytes <= size <= max_bytes` and nNodes, nRanks and numPipeOps each `-1` or equal to the
//! call's, decides: its algorithm and protocol are chosen (where NCCL can use them: the
//! combination's cost is set to 0), and its channel count unless it is `-1`. No rule matches:
//! NCCL's own choice.
//!
//! A rule with regBuff `0` or `1` is skipped (never installed, never matched; logged at load,
//! and a warning of [`check_file`]): NCCL computes regBuff from each rank's own registration
//! cache (registration can take effect on one rank and not on another, and buffers of a CUDA
//! graph capture count as registered), so a rule on it can make the ranks of a communicator
//! choose differently, which hangs the job. The verifier holds tuner programs to the same rule
//! (`reg_buff` is a rank-local context field).
//!
//! # Strict where NCCL's example is lax
//!
//! NCCL's example tuner reads every line it can and quietly makes something of the rest: an
//! unknown collective becomes `allreduce`, an unknown algorithm `ring`, an unknown protocol
//! `simple` (so do `-1`, `Ring`, `LL128`); numbers go through `atoi`/`strtoull` (`64K` is 64,
//! `abc` is 0, `-1` as min_bytes is 2^64 − 1); empty fields inside a line vanish and shift the
//! ones after them; an eleventh field is dropped; lines with fewer than 8 fields are skipped and
//! lines longer than 255 characters cut in two; a `#` after leading spaces starts no comment, so
//! an indented commented-out rule is a rule. Here each of those is an error naming the file, the
//! line and the field ([`RuleError`]); every error of the file is reported, and a file with any
//! error installs no rule at all (the policy is not used and NCCL keeps its own choices: a
//! partial table would make ranks decide differently). Also refused: rules that can never match
//! (min_bytes > max_bytes, nNodes > nRanks, nNodes, nRanks or numPipeOps 0, regBuff other than
//! 0, 1 or -1), channels 0 or over 64, and a UTF-8 byte order mark before a rule (NCCL's example
//! tuner would take it as part of the collective's name).
//!
//! So a file that loads here means what it means to NCCL's example tuner, with two exceptions.
//! That tuner sets `nChannels = 1` for every collective before it looks at the rules, which
//! pins channels to 1 for `-1` rules and unmatched collectives alike, against its own README;
//! here `-1` and no match leave NCCL's channel count. And when the first matching rule names a
//! combination NCCL cannot use for the call (cost -1), that tuner goes on to the next matching
//! rule; the policy does not see the cost table, so here the call keeps NCCL's algorithm and
//! protocol (the rule's channel count, if it has one, is still applied: the tuner applies a
//! policy's channel count on its own). [`check_file`] warns about rules an earlier rule hides.

use policy_runtime::{LoadedProgram, TunerCtx};
use shared_maps::{BPF_ANY, Map, MapType};
use std::fmt;
use std::path::{Path, PathBuf};

/// Rules a table holds: `NCCLBPF_TUNER_RULES_MAX` in `ncclbpf.h`, `tuner_rules`'s size.
pub const MAX_RULES: usize = 512;
/// The map the rules go into.
pub const MAP_NAME: &str = "tuner_rules";
/// The variable that names the rules file.
pub const CONFIG_ENV: &str = "NCCL_TUNER_CONFIG_FILE";
/// The file read without [`CONFIG_ENV`], in the working directory.
pub const DEFAULT_FILE: &str = "nccl_tuner.conf";
/// The most channels a rule may ask for (NCCL's `MAXCHANNELS`).
pub const MAX_CHANNELS: u32 = 64;
/// The longest line NCCL's example tuner reads whole (`fgets` into 256 bytes).
pub const MAX_LINE: usize = 255;

/// Field names, in order, as errors name them.
pub const FIELDS: [&str; 10] = [
    "collective",
    "min_bytes",
    "max_bytes",
    "algorithm",
    "protocol",
    "channels",
    "nNodes",
    "nRanks",
    "numPipeOps",
    "regBuff",
];
/// The column header NCCL's README suggests; skipped as the first line that is not a comment.
const HEADER: [&str; 10] = [
    "collective_type",
    "min_bytes",
    "max_bytes",
    "algorithm",
    "protocol",
    "channels",
    "nNodes",
    "nRanks",
    "numPipeOps",
    "regBuff",
];
/// Collective names; the index is `ncclFunc_t` (`NCCL_FUNC_*`).
pub const COLLECTIVES: [&str; 5] = [
    "broadcast",
    "reduce",
    "allgather",
    "reducescatter",
    "allreduce",
];
/// Algorithm names; the index is `NCCL_ALGO_*`.
pub const ALGORITHMS: [&str; 7] = [
    "tree",
    "ring",
    "collnet_direct",
    "collnet_chain",
    "nvls",
    "nvls_tree",
    "pat",
];
/// Protocol names; the index is `NCCL_PROTO_*`.
pub const PROTOCOLS: [&str; 3] = ["ll", "ll128", "simple"];

/// One rule as read from the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// Its line in the file (from 1).
    pub line: usize,
    /// `NCCL_FUNC_*`: an index into [`COLLECTIVES`].
    pub coll: u32,
    pub min_bytes: u64,
    /// `u64::MAX` for `-1`.
    pub max_bytes: u64,
    /// `NCCL_ALGO_*`: an index into [`ALGORITHMS`].
    pub algo: u32,
    /// `NCCL_PROTO_*`: an index into [`PROTOCOLS`].
    pub proto: u32,
    /// `None`: NCCL's channel count.
    pub channels: Option<u32>,
    /// `None`: any.
    pub nnodes: Option<u32>,
    pub nranks: Option<u32>,
    pub num_pipe_ops: Option<u32>,
    /// `Some(0)` or `Some(1)`; `None`: any. A rule that names one is skipped
    /// ([`Rule::skipped`]).
    pub reg_buff: Option<u32>,
}

/// Why rules on regBuff are skipped.
pub const REG_BUFF_SKIPPED: &str = "regBuff is rank-local (NCCL looks each buffer up in the \
     rank's own registration cache, so ranks can see different values and choose differently, \
     which hangs the job); use -1";

impl Rule {
    /// Whether the rule applies to the collective the policy sees in `ctx` (a skipped rule
    /// never does).
    pub fn matches(&self, ctx: &TunerCtx) -> bool {
        let field = |want: Option<u32>, have: u32| want.is_none_or(|w| w == have);
        self.skipped().is_none()
            && self.coll == ctx.coll_type
            && (self.min_bytes..=self.max_bytes).contains(&ctx.msg_size)
            && field(self.nnodes, ctx.nnodes)
            && field(self.nranks, ctx.nranks)
            && field(self.num_pipe_ops, ctx.num_pipe_ops)
    }

    /// Why the rule is not installed, if it is not.
    pub fn skipped(&self) -> Option<&'static str> {
        self.reg_buff.is_some().then_some(REG_BUFF_SKIPPED)
    }

    /// Whether every collective this rule matches is matched by `earlier` too.
    fn hidden_by(&self, earlier: &Rule) -> bool {
        let covers = |e: Option<u32>, s: Option<u32>| e.is_none() || e == s;
        earlier.skipped().is_none()
            && earlier.coll == self.coll
            && earlier.min_bytes <= self.min_bytes
            && earlier.max_bytes >= self.max_bytes
            && covers(earlier.nnodes, self.nnodes)
            && covers(earlier.nranks, self.nranks)
            && covers(earlier.num_pipe_ops, self.num_pipe_ops)
            && covers(earlier.reg_buff, self.reg_buff)
    }

    /// The rule as the policy reads it.
    pub fn entry(&self) -> RuleEntry {
        let any = |v: Option<u32>| v.map_or(-1, |v| v as i32);
        RuleEntry {
            min_bytes: self.min_bytes,
            max_bytes: self.max_bytes,
            valid: 1,
            coll: self.coll,
            algo: self.algo as i32,
            proto: self.proto as i32,
            channels: any(self.channels),
            nnodes: any(self.nnodes),
            nranks: any(self.nranks),
            num_pipe_ops: any(self.num_pipe_ops),
            reg_buff: any(self.reg_buff),
            reserved: 0,
        }
    }
}

/// The rule in the file's format, all ten fields (`-1` where the file said so or left it out).
impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = |v: Option<u32>| v.map_or("-1".to_string(), |v| v.to_string());
        let max = if self.max_bytes == u64::MAX {
            "-1".to_string()
        } else {
            self.max_bytes.to_string()
        };
        write!(
            f,
            "{},{},{max},{},{},{},{},{},{},{}",
            COLLECTIVES[self.coll as usize],
            self.min_bytes,
            ALGORITHMS[self.algo as usize],
            PROTOCOLS[self.proto as usize],
            n(self.channels),
            n(self.nnodes),
            n(self.nranks),
            n(self.num_pipe_ops),
            n(self.reg_buff),
        )
    }
}

/// The first rule that applies to `ctx`, as the policy picks it.
pub fn first_match<'a>(rules: &'a [Rule], ctx: &TunerCtx) -> Option<&'a Rule> {
    rules.iter().find(|r| r.matches(ctx))
}

/// `struct ncclbpf_tuner_rule` (`policies/include/ncclbpf.h`): one entry of `tuner_rules`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuleEntry {
    pub min_bytes: u64,
    pub max_bytes: u64,
    /// 1: a rule; 0: the end of the table.
    pub valid: u32,
    pub coll: u32,
    pub algo: i32,
    pub proto: i32,
    /// 1..=64, or -1: NCCL's.
    pub channels: i32,
    /// -1: any (also for the three below).
    pub nnodes: i32,
    pub nranks: i32,
    pub num_pipe_ops: i32,
    pub reg_buff: i32,
    pub reserved: u32,
}

impl RuleEntry {
    /// Size of the C struct.
    pub const SIZE: usize = 56;

    /// The entry's bytes as the map holds them (little-endian, the C layout).
    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        b[0..8].copy_from_slice(&self.min_bytes.to_le_bytes());
        b[8..16].copy_from_slice(&self.max_bytes.to_le_bytes());
        let words = [
            self.valid,
            self.coll,
            self.algo as u32,
            self.proto as u32,
            self.channels as u32,
            self.nnodes as u32,
            self.nranks as u32,
            self.num_pipe_ops as u32,
            self.reg_buff as u32,
            self.reserved,
        ];
        for (i, w) in words.iter().enumerate() {
            b[16 + 4 * i..20 + 4 * i].copy_from_slice(&w.to_le_bytes());
        }
        b
    }

    /// The inverse of [`RuleEntry::to_bytes`]; `None` for a slice of another size.
    pub fn from_bytes(b: &[u8]) -> Option<RuleEntry> {
        if b.len() != Self::SIZE {
            return None;
        }
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        Some(RuleEntry {
            min_bytes: u64_at(0),
            max_bytes: u64_at(8),
            valid: u32_at(16),
            coll: u32_at(20),
            algo: u32_at(24) as i32,
            proto: u32_at(28) as i32,
            channels: u32_at(32) as i32,
            nnodes: u32_at(36) as i32,
            nranks: u32_at(40) as i32,
            num_pipe_ops: u32_at(44) as i32,
            reg_buff: u32_at(48) as i32,
            reserved: u32_at(52),
        })
    }
}

/// What is wrong with a rules file. Its `Display` is the line users see:
/// `nccl_tuner.conf:7: field 4 (algorithm): "rng" is not one of tree, ring, …`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleError {
    /// The file as it was named.
    pub file: String,
    /// The line (from 1); `None` for the file as a whole (it cannot be read).
    pub line: Option<usize>,
    /// The field (from 1) and its name, when one field is at fault.
    pub field: Option<(usize, &'static str)>,
    pub message: String,
}

impl fmt::Display for RuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(l) = self.line {
            write!(f, ":{l}")?;
        }
        if let Some((n, name)) = self.field {
            write!(f, ": field {n} ({name})")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for RuleError {}

/// A file that loads: what `ncclbpf rules check FILE` reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    pub file: String,
    pub rules: Vec<Rule>,
    /// How many rules the table holds.
    pub capacity: usize,
    /// Rules that can never decide anything, because an earlier rule matches every collective
    /// they match: `file:line: warning: …` lines.
    pub warnings: Vec<String>,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} rule{} (the table holds {})",
            self.file,
            self.rules.len(),
            if self.rules.len() == 1 { "" } else { "s" },
            self.capacity
        )?;
        for w in &self.warnings {
            write!(f, "\n{w}")?;
        }
        Ok(())
    }
}

/// Parses a rules file's text; `file` names it in errors. Every error of the file is
/// returned, in line order.
pub fn parse(text: &str, file: &str) -> Result<Vec<Rule>, Vec<RuleError>> {
    parse_bytes(text.as_bytes(), file, MAX_RULES)
}

/// Reads and parses the rules file at `path`.
pub fn load_file(path: impl AsRef<Path>) -> Result<Vec<Rule>, Vec<RuleError>> {
    load_with_capacity(path.as_ref(), MAX_RULES)
}

/// Reads and parses `path` as [`load_file`] does, and looks for rules that can never apply.
pub fn check_file(path: impl AsRef<Path>) -> Result<Summary, Vec<RuleError>> {
    let path = path.as_ref();
    let rules = load_file(path)?;
    let file = path.display().to_string();
    let warnings = rules
        .iter()
        .enumerate()
        .filter_map(|(i, r)| {
            if let Some(why) = r.skipped() {
                return Some(format!("{file}:{}: warning: skipped: {why}", r.line));
            }
            let by = rules[..i].iter().find(|e| r.hidden_by(e))?;
            Some(format!(
                "{file}:{}: warning: never applies: the rule on line {} comes first and matches \
                 every collective this one matches",
                r.line, by.line
            ))
        })
        .collect();
    Ok(Summary {
        file,
        rules,
        capacity: MAX_RULES,
        warnings,
    })
}

fn load_with_capacity(path: &Path, capacity: usize) -> Result<Vec<Rule>, Vec<RuleError>> {
    let file = path.display().to_string();
    match std::fs::read(path) {
        Ok(bytes) => parse_bytes(&bytes, &file, capacity),
        Err(e) => Err(vec![RuleError {
            file,
            line: None,
            field: None,
            message: format!("cannot read it: {e}"),
        }]),
    }
}

/// Parses file bytes (not necessarily UTF-8: comments may be in any encoding) into at most
/// `capacity` rules.
pub fn parse_bytes(bytes: &[u8], file: &str, capacity: usize) -> Result<Vec<Rule>, Vec<RuleError>> {
    let mut p = Parser {
        file,
        rules: vec![],
        errors: vec![],
        rule_lines: 0,
        over_at: None,
        capacity,
        seen_content: false,
    };
    let mut lines: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
    if bytes.ends_with(b"\n") {
        lines.pop();
    }
    for (i, raw) in lines.into_iter().enumerate() {
        p.line(i + 1, raw);
    }
    if p.rule_lines > capacity {
        p.errors.push(RuleError {
            file: file.to_string(),
            line: p.over_at,
            field: None,
            message: format!(
                "too many rules: this is rule {} of {}, and the rules table holds {capacity}",
                capacity + 1,
                p.rule_lines
            ),
        });
        p.errors.sort_by_key(|e| e.line);
    }
    if p.errors.is_empty() {
        Ok(p.rules)
    } else {
        Err(p.errors)
    }
}

struct Parser<'a> {
    file: &'a str,
    rules: Vec<Rule>,
    errors: Vec<RuleError>,
    /// Lines that are rules, well-formed or not (the header excluded).
    rule_lines: usize,
    /// The line of the first rule past the capacity.
    over_at: Option<usize>,
    capacity: usize,
    /// Whether a line other than comments and blanks came before.
    seen_content: bool,
}

/// A UTF-8 byte order mark, as spreadsheets' "CSV UTF-8" exports start.
const BOM: &[u8] = b"\xef\xbb\xbf";

/// Spaces and tabs, which NCCL's example tuner trims around each field.
fn blank(c: char) -> bool {
    c == ' ' || c == '\t'
}

impl Parser<'_> {
    fn error(&mut self, line: usize, field: Option<usize>, message: String) {
        self.errors.push(RuleError {
            file: self.file.to_string(),
            line: Some(line),
            field: field.map(|i| (i + 1, FIELDS[i])),
            message,
        });
    }

    fn line(&mut self, no: usize, raw: &[u8]) {
        let mut content = raw.strip_suffix(b"\r").unwrap_or(raw);
        let bom = no == 1 && content.starts_with(BOM);
        if bom {
            content = &content[BOM.len()..];
        }
        let start = content.iter().position(|&b| b != b' ' && b != b'\t');
        match start.map(|s| content[s]) {
            None => return, // blank
            Some(b'#') => {
                // NCCL's example tuner skips a line as a comment only when its first byte is
                // '#'; otherwise it parses it, and with 8 or more fields it is a rule there.
                let tokens = content.split(|&b| b == b',').filter(|t| !t.is_empty());
                if (start != Some(0) || bom) && tokens.count() >= 8 {
                    let before = if bom {
                        "the file's UTF-8 byte order mark"
                    } else {
                        "a space or tab"
                    };
                    self.error(
                        no,
                        None,
                        format!(
                            "NCCL's example tuner would parse this comment as a rule: it takes '#' \
                             as a comment only as the first character of a line, and here \
                             {before} comes before it; start the line with '#'"
                        ),
                    );
                }
                return;
            }
            Some(_) => {}
        }
        let Ok(text) = std::str::from_utf8(content) else {
            self.error(no, None, "the line is not UTF-8 text".into());
            self.count_rule(no);
            return;
        };
        let mut fields: Vec<&str> = text.split(',').map(|f| f.trim_matches(blank)).collect();
        // Empty fields at the end are not there for NCCL's example tuner (strtok): a
        // spreadsheet's "…,-1,," is an 8-field rule, as it is there.
        while fields.len() > 1 && fields.last() == Some(&"") {
            fields.pop();
        }
        let first_content = !self.seen_content;
        self.seen_content = true;
        if first_content && is_header(&fields) {
            return;
        }
        self.count_rule(no);
        if bom {
            self.error(
                no,
                None,
                "the file starts with a UTF-8 byte order mark, which NCCL's example tuner would \
                 read as part of the first field; save the file without one (plain CSV)"
                    .into(),
            );
        }
        if raw.len() > MAX_LINE {
            self.error(
                no,
                None,
                format!(
                    "the line is {} characters long; NCCL's example tuner reads lines of at most \
                     {MAX_LINE} and would cut this one",
                    raw.len()
                ),
            );
        }
        if !(8..=10).contains(&fields.len()) {
            let what = if fields.len() > 10 {
                "; NCCL's example tuner would silently drop the fields after the tenth"
            } else {
                "; NCCL's example tuner would silently skip the line"
            };
            self.error(
                no,
                None,
                format!(
                    "{} comma-separated field{}, expected 8, 9 or 10: \
                     collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks\
                     [,numPipeOps[,regBuff]]{what}",
                    fields.len(),
                    if fields.len() == 1 { "" } else { "s" }
                ),
            );
            return;
        }
        if let Some(rule) = self.rule(no, &fields) {
            self.rules.push(rule);
        }
    }

    fn count_rule(&mut self, no: usize) {
        self.rule_lines += 1;
        if self.rule_lines == self.capacity + 1 {
            self.over_at = Some(no);
        }
    }

    /// Field `i` of a line, parsed by `parse`; an empty field or a parse error is recorded.
    fn field<T>(
        &mut self,
        no: usize,
        f: &[&str],
        i: usize,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Option<T> {
        let r = if f[i].is_empty() {
            Err(EMPTY.to_string())
        } else {
            parse(f[i])
        };
        r.map_err(|m| self.error(no, Some(i), m)).ok()
    }

    /// An optional field: `-1` (any) when the line stops before it.
    fn optional(
        &mut self,
        no: usize,
        f: &[&str],
        i: usize,
        parse: impl Fn(&str) -> Result<Option<u32>, String>,
    ) -> Option<Option<u32>> {
        if i < f.len() {
            self.field(no, f, i, parse)
        } else {
            Some(None)
        }
    }

    /// The rule of a line with 8 to 10 fields, recording every error in it.
    fn rule(&mut self, no: usize, f: &[&str]) -> Option<Rule> {
        let before = self.errors.len();
        let coll = self.field(no, f, 0, |v| name(v, &COLLECTIVES, "allreduce"));
        let min = self.field(no, f, 1, |v| size(v, false));
        let max = self.field(no, f, 2, |v| size(v, true));
        let algo = self.field(no, f, 3, |v| name(v, &ALGORITHMS, "ring"));
        let proto = self.field(no, f, 4, |v| name(v, &PROTOCOLS, "simple"));
        let channels = self.field(no, f, 5, channel_count);
        let nnodes = self.field(no, f, 6, |v| count(v, "node"));
        let nranks = self.field(no, f, 7, |v| count(v, "rank"));
        let num_pipe_ops = self.optional(no, f, 8, |v| count(v, "pipelined operation"));
        let reg_buff = self.optional(no, f, 9, registered);
        if let (Some(min), Some(max)) = (min, max)
            && min > max
        {
            self.error(
                no,
                Some(1),
                format!("{min} is larger than max_bytes {max}: the rule would never match"),
            );
        }
        if let (Some(Some(n)), Some(Some(r))) = (nnodes, nranks)
            && n > r
        {
            self.error(
                no,
                Some(6),
                format!(
                    "{n} nodes with {r} ranks: a communicator has at least one rank per node, so \
                     the rule would never match"
                ),
            );
        }
        if self.errors.len() > before {
            return None;
        }
        Some(Rule {
            line: no,
            coll: coll?,
            min_bytes: min?,
            max_bytes: max?,
            algo: algo?,
            proto: proto?,
            channels: channels?,
            nnodes: nnodes?,
            nranks: nranks?,
            num_pipe_ops: num_pipe_ops?,
            reg_buff: reg_buff?,
        })
    }
}

const EMPTY: &str = "is empty (NCCL's example tuner would skip it and read the next field in its \
                     place)";

fn is_header(fields: &[&str]) -> bool {
    (8..=10).contains(&fields.len())
        && fields
            .iter()
            .zip(HEADER)
            .all(|(f, h)| f.eq_ignore_ascii_case(h))
}

/// The index of `v` in `names`; `fallback` is what NCCL's example tuner makes of other names.
fn name(v: &str, names: &[&str], fallback: &str) -> Result<u32, String> {
    if let Some(i) = names.iter().position(|n| *n == v) {
        return Ok(i as u32);
    }
    let mut m = format!("\"{v}\" is not one of {}", names.join(", "));
    if let Some(n) = names.iter().find(|n| n.eq_ignore_ascii_case(v)) {
        m += &format!(" (names are lower case: \"{n}\")");
    } else if v.starts_with(['"', '\'']) {
        m += " (fields are not quoted)";
    } else if v == "-1" {
        m += " (a rule names one; -1 means \"any\" only in the numeric fields)";
    }
    m += &format!("; NCCL's example tuner would silently take it as {fallback}");
    Err(m)
}

/// `-1` or a decimal number, nothing else (no `+`, no suffixes, no spaces inside).
fn integer(v: &str) -> Option<i128> {
    let digits = v.strip_prefix('-').unwrap_or(v);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || digits.len() > 30 {
        return None;
    }
    v.parse().ok()
}

fn size(v: &str, is_max: bool) -> Result<u64, String> {
    match integer(v) {
        Some(-1) if is_max => Ok(u64::MAX),
        Some(-1) => Err(
            "-1 is not a size here: NCCL's example tuner reads it as 18446744073709551615, so \
             the rule would never match; 0 is the smallest size"
                .into(),
        ),
        Some(n) if n < 0 => Err(format!(
            "{v} is negative; sizes are byte counts{}",
            if is_max { " (-1: no upper limit)" } else { "" }
        )),
        Some(n) => u64::try_from(n).map_err(|_| format!("{v} is larger than 2^64 - 1")),
        None => Err(format!(
            "\"{v}\" is not a byte count: decimal digits only, e.g. 65536{}",
            if is_max { ", or -1" } else { "" }
        )),
    }
}

fn channel_count(v: &str) -> Result<Option<u32>, String> {
    match integer(v) {
        Some(-1) => Ok(None),
        Some(n) if (1..=MAX_CHANNELS as i128).contains(&n) => Ok(Some(n as u32)),
        Some(0) => Err("0 channels: -1 keeps NCCL's channel count, 1 to 64 sets it".into()),
        Some(_) => Err(format!(
            "{v} is out of range: 1 to {MAX_CHANNELS} (NCCL's MAXCHANNELS), or -1 for NCCL's count"
        )),
        None => Err(format!(
            "\"{v}\" is not a channel count: 1 to {MAX_CHANNELS}, or -1 for NCCL's count"
        )),
    }
}

/// nNodes, nRanks, numPipeOps: `-1` (any) or at least 1.
fn count(v: &str, what: &str) -> Result<Option<u32>, String> {
    match integer(v) {
        Some(-1) => Ok(None),
        Some(n) if (1..=i32::MAX as i128).contains(&n) => Ok(Some(n as u32)),
        Some(0) => Err(format!(
            "0 never matches: NCCL always has at least one {what}; -1 matches any number"
        )),
        Some(n) if n < 0 => Err(format!(
            "{v} never matches: -1 matches any number, otherwise at least 1"
        )),
        Some(_) => Err(format!("{v} is larger than {}", i32::MAX)),
        None => Err(format!(
            "\"{v}\" is not a number: at least 1, or -1 for any"
        )),
    }
}

fn registered(v: &str) -> Result<Option<u32>, String> {
    match integer(v) {
        Some(-1) => Ok(None),
        Some(n @ (0 | 1)) => Ok(Some(n as u32)),
        _ => Err(format!(
            "\"{v}\" is not 0 (buffers not registered), 1 (registered) or -1 (either)"
        )),
    }
}

// ---------------------------------------------------------------- filling the map

/// `NCCL_TUNER_CONFIG_FILE`, else `nccl_tuner.conf` (in the working directory).
pub fn config_path() -> PathBuf {
    std::env::var_os(CONFIG_ENV).map_or_else(|| PathBuf::from(DEFAULT_FILE), PathBuf::from)
}

/// After a tuner policy loaded: if its object has a `tuner_rules` map, reads the rules file
/// ([`config_path`]) and writes the rules into the map. `Ok(None)`: no such map, nothing done.
/// `Ok(Some(n))`: `n` rules installed (0 when there is no file, logged). `Err`: the map has
/// the wrong shape, or the file cannot be read or has errors (each logged through the tuner
/// logger); the policy must then not be used.
pub fn install(prog: &LoadedProgram) -> Result<Option<usize>, String> {
    let Some(map) = prog.maps().iter().find(|m| m.spec().name == MAP_NAME) else {
        return Ok(None);
    };
    install_file(map, &config_path()).map(Some)
}

/// Fills `map` (a `tuner_rules` table) from the rules file at `path`, as [`install`] does.
pub fn install_file(map: &Map, path: &Path) -> Result<usize, String> {
    let spec = map.spec();
    if spec.kind != MapType::Array
        || spec.key_size != 4
        || spec.value_size as usize != RuleEntry::SIZE
    {
        return Err(format!(
            "map '{MAP_NAME}' is {spec}; a rules table is an array of struct ncclbpf_tuner_rule \
             ({} B values)",
            RuleEntry::SIZE
        ));
    }
    let capacity = spec.max_entries as usize;
    let file = path.display().to_string();
    let missing = if path.as_os_str().is_empty() {
        Some(format!("{CONFIG_ENV} is set but empty"))
    } else if !path.try_exists().unwrap_or(true) {
        Some(format!(
            "{file} not found ({CONFIG_ENV} names the rules file; without it, {DEFAULT_FILE} in \
             the working directory)"
        ))
    } else {
        None
    };
    if let Some(why) = missing {
        crate::tlog!(
            WARN,
            TUNING,
            "no tuner rules: {why}; the rules table is empty and NCCL keeps its own choices"
        );
        write_table(map, &[])?;
        return Ok(0);
    }
    match load_with_capacity(path, capacity) {
        Ok(all) => {
            let (rules, skipped): (Vec<Rule>, Vec<Rule>) =
                all.into_iter().partition(|r| r.skipped().is_none());
            if !skipped.is_empty() {
                let lines: Vec<String> = skipped.iter().map(|r| r.line.to_string()).collect();
                crate::tlog!(
                    WARN,
                    TUNING,
                    "{file}: rule{} on line{} {} skipped: {REG_BUFF_SKIPPED}",
                    if skipped.len() == 1 { "" } else { "s" },
                    if skipped.len() == 1 { "" } else { "s" },
                    lines.join(", ")
                );
            }
            write_table(map, &rules)?;
            crate::tlog!(
                INFO,
                TUNING,
                "{} tuner rule{} from {file} (the table holds {capacity})",
                rules.len(),
                if rules.len() == 1 { "" } else { "s" }
            );
            for r in &rules {
                crate::tlog!(INFO, TUNING, "{file}:{}: {r}", r.line);
            }
            Ok(rules.len())
        }
        Err(errors) => {
            for e in &errors {
                crate::tlog!(WARN, TUNING, "{e}");
            }
            Err(format!(
                "{file}: {} error{} in the tuner rules (each logged above); no rule is used",
                errors.len(),
                if errors.len() == 1 { "" } else { "s" }
            ))
        }
    }
}

/// Writes `rules` into entries 0.. of the table and ends it after them. Entry 0 is ended first
/// and written last, so a program that runs meanwhile (none does: the tuner fills the table
/// before its policy slot exists) would find no rules rather than a mix of two tables.
fn write_table(map: &Map, rules: &[Rule]) -> Result<(), String> {
    let put = |i: u32, e: RuleEntry| {
        map.update(&i.to_le_bytes(), &e.to_bytes(), BPF_ANY)
            .map_err(|err| format!("map '{MAP_NAME}' entry {i}: {err:?}"))
    };
    let entry = |i: u32| rules.get(i as usize).map(Rule::entry).unwrap_or_default();
    put(0, RuleEntry::default())?;
    for i in 1..map.spec().max_entries {
        put(i, entry(i))?;
    }
    put(0, entry(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(text: &str) -> Vec<Rule> {
        parse(text, "t.conf").unwrap_or_else(|e| {
            panic!(
                "{}",
                e.iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("\n")
            )
        })
    }

    fn errors(text: &str) -> Vec<String> {
        parse(text, "t.conf")
            .expect_err("the text has errors")
            .iter()
            .map(|e| e.to_string())
            .collect()
    }

    /// The one error of a one-line file.
    fn error(line: &str) -> String {
        let e = errors(line);
        assert_eq!(e.len(), 1, "{line:?}: {e:#?}");
        e.into_iter().next().unwrap()
    }

    const GOOD: &str = "allreduce,0,65536,tree,simple,2,1,-1,-1,-1";

    #[test]
    fn the_format_of_nccls_example_file_loads() {
        let text = include_str!("../../tests/fixtures/nccl_tuner_example.conf");
        let rules = ok(text);
        let shown: Vec<String> = rules.iter().map(|r| format!("{}: {r}", r.line)).collect();
        assert_eq!(
            shown,
            [
                "9: allreduce,0,65536,tree,simple,2,1,-1,-1,1",
                "12: allreduce,65537,1048576,ring,simple,4,4,32,1,0",
                "15: allreduce,1048577,4294967295,ring,ll128,-1,-1,-1,4,-1",
                "18: broadcast,0,32768,tree,simple,-1,1,-1,-1,1",
                "21: broadcast,32769,4294967295,ring,simple,2,-1,-1,1,-1",
                "24: allgather,0,4294967295,ring,simple,4,2,-1,-1,-1",
                "28: reducescatter,0,131072,tree,simple,2,1,-1,1,1",
                "30: reducescatter,131073,4294967295,ring,simple,-1,-1,-1,2,0",
                "33: reduce,0,4294967295,tree,simple,-1,-1,-1,-1,-1",
                "36: allreduce,0,-1,nvls,simple,16,-1,8,-1,-1",
                "37: allgather,0,-1,pat,ll,1,-1,-1,-1,-1",
                "38: broadcast,0,-1,collnet_direct,ll128,64,-1,-1,-1,-1",
                "39: reduce,0,-1,collnet_chain,simple,-1,-1,-1,-1,-1",
                "40: reducescatter,0,-1,nvls_tree,simple,-1,-1,-1,-1,-1",
            ]
        );
        let r = &rules[0];
        assert_eq!(
            (r.coll, r.min_bytes, r.max_bytes, r.algo, r.proto),
            (4, 0, 65536, 0, 2)
        );
        assert_eq!(
            (r.channels, r.nnodes, r.nranks, r.num_pipe_ops, r.reg_buff),
            (Some(2), Some(1), None, None, Some(1))
        );
        // 8 fields: numPipeOps and regBuff match anything; 9 fields: regBuff does.
        assert_eq!((rules[5].num_pipe_ops, rules[5].reg_buff), (None, None));
        assert_eq!((rules[4].num_pipe_ops, rules[4].reg_buff), (Some(1), None));
        assert_eq!(rules[9].max_bytes, u64::MAX);
    }

    #[test]
    fn every_name_maps_to_nccls_number() {
        let line = |c: &str, a: &str, p: &str| format!("{c},0,1,{a},{p},-1,-1,-1");
        for (i, c) in COLLECTIVES.iter().enumerate() {
            assert_eq!(ok(&line(c, "ring", "ll"))[0].coll, i as u32, "{c}");
        }
        for (i, a) in ALGORITHMS.iter().enumerate() {
            assert_eq!(ok(&line("reduce", a, "ll"))[0].algo, i as u32, "{a}");
        }
        for (i, p) in PROTOCOLS.iter().enumerate() {
            assert_eq!(ok(&line("reduce", "ring", p))[0].proto, i as u32, "{p}");
        }
        // ncclbpf.h's NCCL_FUNC_*, NCCL_ALGO_*, NCCL_PROTO_* (and NCCL's own numbering).
        assert_eq!(COLLECTIVES[4], "allreduce");
        assert_eq!((ALGORITHMS[1], ALGORITHMS[6]), ("ring", "pat"));
        assert_eq!(PROTOCOLS[2], "simple");
    }

    #[test]
    fn comments_blank_lines_whitespace_and_crlf() {
        let text = "# a comment\n\n   \n\t# indented comment, with, commas\n \
                    allreduce , 0 ,\t65536\t, tree , simple , 2 , 1 , -1 \r\n\r\n\
                    reduce,1,2,ring,ll,-1,-1,-1,-1,-1\r\n# the end, no newline\n\
                    broadcast,0,0,ring,ll,-1,-1,-1";
        let rules = ok(text);
        assert_eq!(rules.len(), 3);
        assert_eq!(rules[0].line, 5);
        assert_eq!(
            rules[0].to_string(),
            "allreduce,0,65536,tree,simple,2,1,-1,-1,-1"
        );
        assert_eq!((rules[1].line, rules[2].line), (7, 9));
        // Empty fields at the end are left out (a spreadsheet's export of an 8-field row).
        let r = &ok("allgather,0,-1,ring,simple,4,2,-1,,\nreduce,0,1,ring,ll,-1,-1,-1,3, ,,")[..];
        assert_eq!(r[0].to_string(), "allgather,0,-1,ring,simple,4,2,-1,-1,-1");
        assert_eq!(r[1].num_pipe_ops, Some(3));
        assert!(ok("").is_empty());
        assert!(ok("# only comments\n\n").is_empty());
    }

    #[test]
    fn the_spreadsheet_header_is_skipped_only_first() {
        let h10 = "collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff";
        let h8 =
            "Collective_Type, min_bytes, max_bytes, algorithm, protocol, channels, nnodes, nranks";
        for h in [h10, h8] {
            let rules = ok(&format!("# generated\n{h}\n{GOOD}\n"));
            assert_eq!(rules.len(), 1);
            assert_eq!(rules[0].line, 3);
        }
        let e = errors(&format!("{GOOD}\n{h10}\n"));
        assert!(
            e[0].starts_with("t.conf:2: field 1 (collective): \"collective_type\" is not one of"),
            "{e:?}"
        );
    }

    #[test]
    fn every_malformed_line_is_named() {
        let cases: &[(&str, &str)] = &[
            // field count
            (
                "allreduce,0,65536,tree,simple,2,1",
                "t.conf:1: 7 comma-separated fields, expected 8, 9 or 10",
            ),
            (
                "allreduce,0,65536,tree,simple,2,1,-1,-1,1,0",
                "t.conf:1: 11 comma-separated fields, expected 8, 9 or 10",
            ),
            (
                "allreduce,0,65536,tree,simple,2,1,-1,-1,1,x",
                "would silently drop the fields after the tenth",
            ),
            (
                "allreduce,0,65536,tree,simple,2,1,,",
                "7 comma-separated fields, expected 8, 9 or 10",
            ),
            ("allreduce", "t.conf:1: 1 comma-separated field, expected"),
            (
                "allreduce 0 65536 tree simple 2 1 -1",
                "1 comma-separated field, expected 8, 9 or 10",
            ),
            // empty fields (NCCL's strtok would shift the rest)
            (
                "allreduce,,65536,tree,simple,2,1,-1,-1",
                "t.conf:1: field 2 (min_bytes): is empty",
            ),
            (
                "allreduce,0,65536,tree,simple,2,1,-1,,1",
                "t.conf:1: field 9 (numPipeOps): is empty (NCCL's example tuner would skip it and read the next field in its place)",
            ),
            (
                "allreduce,0,65536,tree,simple,,1,-1",
                "t.conf:1: field 6 (channels): is empty",
            ),
            (
                ",0,65536,tree,simple,2,1,-1",
                "t.conf:1: field 1 (collective): is empty",
            ),
            // names
            (
                "allreduce,0,65536,rng,simple,2,1,-1",
                "t.conf:1: field 4 (algorithm): \"rng\" is not one of tree, ring, collnet_direct, collnet_chain, nvls, nvls_tree, pat; NCCL's example tuner would silently take it as ring",
            ),
            (
                "AllReduce,0,65536,tree,simple,2,1,-1",
                "field 1 (collective): \"AllReduce\" is not one of broadcast, reduce, allgather, reducescatter, allreduce (names are lower case: \"allreduce\")",
            ),
            (
                "alltoall,0,65536,tree,simple,2,1,-1",
                "field 1 (collective): \"alltoall\" is not one of broadcast, reduce, allgather, reducescatter, allreduce; NCCL's example tuner would silently take it as allreduce",
            ),
            (
                "allreduce,0,65536,Tree,simple,2,1,-1",
                "(names are lower case: \"tree\"); NCCL's example tuner would silently take it as ring",
            ),
            (
                "allreduce,0,65536,tree,LL128,2,1,-1",
                "field 5 (protocol): \"LL128\" is not one of ll, ll128, simple (names are lower case: \"ll128\"); NCCL's example tuner would silently take it as simple",
            ),
            (
                "allreduce,0,65536,tree,-1,2,1,-1",
                "field 5 (protocol): \"-1\" is not one of ll, ll128, simple (a rule names one; -1 means \"any\" only in the numeric fields)",
            ),
            (
                "allreduce,0,65536,-1,simple,2,1,-1",
                "field 4 (algorithm): \"-1\" is not one of",
            ),
            (
                "allreduce,0,65536,\"tree\",simple,2,1,-1",
                "(fields are not quoted)",
            ),
            // sizes
            (
                "allreduce,64K,65536,tree,simple,2,1,-1",
                "field 2 (min_bytes): \"64K\" is not a byte count: decimal digits only, e.g. 65536",
            ),
            (
                "allreduce,0,1e6,tree,simple,2,1,-1",
                "field 3 (max_bytes): \"1e6\" is not a byte count: decimal digits only, e.g. 65536, or -1",
            ),
            (
                "allreduce,+5,65536,tree,simple,2,1,-1",
                "field 2 (min_bytes): \"+5\" is not a byte count",
            ),
            (
                "allreduce,0x10,65536,tree,simple,2,1,-1",
                "field 2 (min_bytes): \"0x10\" is not a byte count",
            ),
            (
                "allreduce,1 024,65536,tree,simple,2,1,-1",
                "field 2 (min_bytes): \"1 024\" is not a byte count",
            ),
            (
                "allreduce,-1,65536,tree,simple,2,1,-1",
                "field 2 (min_bytes): -1 is not a size here: NCCL's example tuner reads it as 18446744073709551615",
            ),
            (
                "allreduce,-5,65536,tree,simple,2,1,-1",
                "field 2 (min_bytes): -5 is negative",
            ),
            (
                "allreduce,0,-2,tree,simple,2,1,-1",
                "field 3 (max_bytes): -2 is negative; sizes are byte counts (-1: no upper limit)",
            ),
            (
                "allreduce,0,18446744073709551616,tree,simple,2,1,-1",
                "field 3 (max_bytes): 18446744073709551616 is larger than 2^64 - 1",
            ),
            (
                "allreduce,65536,1024,tree,simple,2,1,-1",
                "t.conf:1: field 2 (min_bytes): 65536 is larger than max_bytes 1024: the rule would never match",
            ),
            // channels
            (
                "allreduce,0,65536,tree,simple,0,1,-1",
                "field 6 (channels): 0 channels: -1 keeps NCCL's channel count, 1 to 64 sets it",
            ),
            (
                "allreduce,0,65536,tree,simple,65,1,-1",
                "field 6 (channels): 65 is out of range: 1 to 64 (NCCL's MAXCHANNELS), or -1 for NCCL's count",
            ),
            (
                "allreduce,0,65536,tree,simple,-2,1,-1",
                "field 6 (channels): -2 is out of range",
            ),
            (
                "allreduce,0,65536,tree,simple,two,1,-1",
                "field 6 (channels): \"two\" is not a channel count",
            ),
            (
                "allreduce,0,65536,tree,simple,2.5,1,-1",
                "field 6 (channels): \"2.5\" is not a channel count",
            ),
            // nNodes, nRanks
            (
                "allreduce,0,65536,tree,simple,2,0,-1",
                "field 7 (nNodes): 0 never matches: NCCL always has at least one node; -1 matches any number",
            ),
            (
                "allreduce,0,65536,tree,simple,2,1,0",
                "field 8 (nRanks): 0 never matches: NCCL always has at least one rank",
            ),
            (
                "allreduce,0,65536,tree,simple,2,-2,-1",
                "field 7 (nNodes): -2 never matches: -1 matches any number, otherwise at least 1",
            ),
            (
                "allreduce,0,65536,tree,simple,2,1,-7",
                "field 8 (nRanks): -7 never matches",
            ),
            (
                "allreduce,0,65536,tree,simple,2,x,-1",
                "field 7 (nNodes): \"x\" is not a number: at least 1, or -1 for any",
            ),
            (
                "allreduce,0,65536,tree,simple,2,1,4294967296",
                "field 8 (nRanks): 4294967296 is larger than 2147483647",
            ),
            (
                "allreduce,0,65536,tree,simple,2,4,2",
                "field 7 (nNodes): 4 nodes with 2 ranks: a communicator has at least one rank per node, so the rule would never match",
            ),
            // numPipeOps, regBuff
            (
                "allreduce,0,65536,tree,simple,2,1,-1,0",
                "field 9 (numPipeOps): 0 never matches: NCCL always has at least one pipelined operation",
            ),
            (
                "allreduce,0,65536,tree,simple,2,1,-1,-3",
                "field 9 (numPipeOps): -3 never matches",
            ),
            (
                "allreduce,0,65536,tree,simple,2,1,-1,many",
                "field 9 (numPipeOps): \"many\" is not a number",
            ),
            (
                "allreduce,0,65536,tree,simple,2,1,-1,-1,2",
                "field 10 (regBuff): \"2\" is not 0 (buffers not registered), 1 (registered) or -1 (either)",
            ),
            (
                "allreduce,0,65536,tree,simple,2,1,-1,-1,yes",
                "field 10 (regBuff): \"yes\" is not 0",
            ),
            // trailing comments are not part of the format
            (
                "allreduce,0,65536,tree,simple,2,1,-1 # small",
                "field 8 (nRanks): \"-1 # small\" is not a number",
            ),
        ];
        for (line, want) in cases {
            let e = error(line);
            assert!(e.contains(want), "{line:?}\n  got:  {e}\n  want: {want}");
        }
    }

    #[test]
    fn every_error_of_a_line_and_of_the_file_is_reported() {
        let text = format!(
            "# header comment\n{GOOD}\nallreduce,x,65536,rng,simple,99,0,-1\n\nreduce,0,1,ring\n{GOOD}\nbroadcast,0,1,ring,ll,-1,-1,-1,-1,5\n"
        );
        let e = errors(&text);
        assert_eq!(
            e,
            [
                "t.conf:3: field 2 (min_bytes): \"x\" is not a byte count: decimal digits only, e.g. 65536",
                "t.conf:3: field 4 (algorithm): \"rng\" is not one of tree, ring, collnet_direct, collnet_chain, nvls, nvls_tree, pat; NCCL's example tuner would silently take it as ring",
                "t.conf:3: field 6 (channels): 99 is out of range: 1 to 64 (NCCL's MAXCHANNELS), or -1 for NCCL's count",
                "t.conf:3: field 7 (nNodes): 0 never matches: NCCL always has at least one node; -1 matches any number",
                "t.conf:5: 4 comma-separated fields, expected 8, 9 or 10: collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks[,numPipeOps[,regBuff]]; NCCL's example tuner would silently skip the line",
                "t.conf:7: field 10 (regBuff): \"5\" is not 0 (buffers not registered), 1 (registered) or -1 (either)",
            ]
        );
    }

    #[test]
    fn too_many_rules_for_the_table() {
        let line = |i: usize| format!("allreduce,{i},{i},ring,simple,-1,-1,-1\n");
        let fits: String = (0..MAX_RULES).map(line).collect();
        assert_eq!(ok(&fits).len(), MAX_RULES);
        let text = format!("# {} rules\n{fits}{}{}", MAX_RULES + 2, line(1), line(2));
        let e = errors(&text);
        assert_eq!(
            e,
            [format!(
                "t.conf:{}: too many rules: this is rule {} of {}, and the rules table holds {MAX_RULES}",
                MAX_RULES + 2,
                MAX_RULES + 1,
                MAX_RULES + 2
            )]
        );
        // A smaller table (a policy of one's own) is checked against its own size.
        let e = parse_bytes(fits.as_bytes(), "t.conf", 3).unwrap_err();
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].line, Some(4));
    }

    #[test]
    fn what_nccls_example_would_misread_is_refused() {
        let bom = format!("\u{feff}{GOOD}\n");
        assert_eq!(
            error(&bom),
            "t.conf:1: the file starts with a UTF-8 byte order mark, which NCCL's example tuner \
             would read as part of the first field; save the file without one (plain CSV)"
        );
        // Before a comment, a blank line or the header it is harmless there, and here.
        assert_eq!(ok(&format!("\u{feff}# rules\n{GOOD}\n")).len(), 1);
        assert_eq!(ok(&format!("\u{feff}\n{GOOD}\n")).len(), 1);
        let header =
            "collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks";
        assert_eq!(ok(&format!("\u{feff}{header}\n{GOOD}\n")).len(), 1);
        // An indented '#' is not a comment there: with 8 fields, the line is a rule.
        let commented = format!("{GOOD}\n  # {GOOD}\n\t# a, b, c\n");
        assert_eq!(
            error(&commented),
            "t.conf:2: NCCL's example tuner would parse this comment as a rule: it takes '#' as a \
             comment only as the first character of a line, and here a space or tab comes \
             before it; start the line with '#'"
        );
        assert!(
            error(&format!("\u{feff}# {GOOD}\n"))
                .contains("and here the file's UTF-8 byte order mark comes before it"),
        );
        assert_eq!(ok(&format!("# {GOOD}\n")).len(), 0);
        let long = format!("allreduce,0,65536,tree,simple,2,1,{}-1", " ".repeat(230));
        assert_eq!(
            error(&long),
            format!(
                "t.conf:1: the line is {} characters long; NCCL's example tuner reads lines of at \
                 most {MAX_LINE} and would cut this one",
                long.len()
            )
        );
        let at_limit = format!(
            "allreduce,0,65536,tree,simple,2,1,{}-1",
            " ".repeat(MAX_LINE - 36)
        );
        assert_eq!(at_limit.len(), MAX_LINE);
        assert_eq!(ok(&at_limit).len(), 1);
        let e = parse_bytes(
            b"allreduce,0,1,tree,simple,2,1,-1\nreduce,0,1,tr\xe9e,ll,2,1,-1\n# caf\xe9\n",
            "t.conf",
            8,
        )
        .unwrap_err();
        assert_eq!(e.len(), 1, "{e:?}");
        assert_eq!(e[0].to_string(), "t.conf:2: the line is not UTF-8 text");
    }

    #[test]
    fn matching_follows_nccls_example() {
        let rules = ok("allreduce,0,65536,tree,simple,2,1,-1,-1,-1\n\
                        allreduce,0,65536,ring,ll,-1,-1,8,2,-1\n\
                        allreduce,65537,-1,ring,simple,-1,-1,-1\n\
                        broadcast,100,100,tree,ll128,4,-1,-1\n\
                        allgather,0,-1,ring,ll,-1,-1,-1,-1,1\n\
                        allgather,0,-1,ring,ll,-1,-1,-1,-1,0\n");
        let ctx = |coll: u32, bytes: u64, nnodes: u32, nranks: u32, pipe: u32, reg: u32| TunerCtx {
            coll_type: coll,
            msg_size: bytes,
            nnodes,
            nranks,
            num_pipe_ops: pipe,
            reg_buff: reg,
            ..Default::default()
        };
        let line = |c: TunerCtx| first_match(&rules, &c).map(|r| r.line);
        assert_eq!(line(ctx(4, 0, 1, 8, 1, 1)), Some(1));
        assert_eq!(
            line(ctx(4, 65536, 1, 8, 1, 1)),
            Some(1),
            "max_bytes is inclusive"
        );
        assert_eq!(
            line(ctx(4, 65536, 1, 8, 2, 0)),
            Some(1),
            "regBuff is never matched on"
        );
        assert_eq!(
            line(ctx(4, 1024, 2, 8, 2, 1)),
            Some(2),
            "2 nodes skip rule 1"
        );
        assert_eq!(
            line(ctx(4, 1024, 2, 8, 1, 0)),
            None,
            "numPipeOps 1 skips rule 2"
        );
        assert_eq!(
            line(ctx(4, 65537, 2, 8, 1, 0)),
            Some(3),
            "min_bytes is inclusive"
        );
        assert_eq!(
            line(ctx(4, u64::MAX, 9, 99, 7, 1)),
            Some(3),
            "-1: no upper limit"
        );
        assert_eq!(line(ctx(0, 100, 3, 3, 1, 0)), Some(4));
        assert_eq!(line(ctx(0, 101, 3, 3, 1, 0)), None);
        for reg in [0, 1] {
            assert_eq!(
                line(ctx(2, 100, 3, 3, 1, reg)),
                None,
                "the allgather rules are on regBuff: skipped"
            );
        }
    }

    #[test]
    fn entries_carry_the_rule() {
        let r = &ok("reducescatter,7,-1,nvls_tree,ll128,-1,2,16,-1,0")[0];
        let e = r.entry();
        assert_eq!(
            e,
            RuleEntry {
                min_bytes: 7,
                max_bytes: u64::MAX,
                valid: 1,
                coll: 3,
                algo: 5,
                proto: 1,
                channels: -1,
                nnodes: 2,
                nranks: 16,
                num_pipe_ops: -1,
                reg_buff: 0,
                reserved: 0,
            }
        );
        assert_eq!(RuleEntry::from_bytes(&e.to_bytes()), Some(e));
        assert_eq!(RuleEntry::from_bytes(&[0; 55]), None);
    }

    #[test]
    fn entry_layout_is_the_c_struct() {
        use std::mem::{align_of, offset_of, size_of};
        // struct ncclbpf_tuner_rule in ncclbpf.h (its comment lists the same offsets).
        assert_eq!(size_of::<RuleEntry>(), RuleEntry::SIZE);
        assert_eq!(align_of::<RuleEntry>(), 8);
        let offsets = [
            offset_of!(RuleEntry, min_bytes),
            offset_of!(RuleEntry, max_bytes),
            offset_of!(RuleEntry, valid),
            offset_of!(RuleEntry, coll),
            offset_of!(RuleEntry, algo),
            offset_of!(RuleEntry, proto),
            offset_of!(RuleEntry, channels),
            offset_of!(RuleEntry, nnodes),
            offset_of!(RuleEntry, nranks),
            offset_of!(RuleEntry, num_pipe_ops),
            offset_of!(RuleEntry, reg_buff),
            offset_of!(RuleEntry, reserved),
        ];
        assert_eq!(offsets, [0, 8, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52]);
        // to_bytes writes each field at its offset.
        let e = RuleEntry {
            min_bytes: 0x0102_0304_0506_0708,
            max_bytes: 0x1112_1314_1516_1718,
            valid: 0x21,
            coll: 0x22,
            algo: 0x23,
            proto: 0x24,
            channels: 0x25,
            nnodes: 0x26,
            nranks: 0x27,
            num_pipe_ops: 0x28,
            reg_buff: 0x29,
            reserved: 0x2a,
        };
        let b = e.to_bytes();
        assert_eq!(b[0], 0x08);
        assert_eq!(b[8], 0x18);
        for (k, off) in offsets[2..].iter().enumerate() {
            assert_eq!(b[*off], 0x21 + k as u8, "offset {off}");
        }
        let header = include_str!("../../policies/include/ncclbpf.h");
        assert!(
            header.contains(&format!("#define NCCLBPF_TUNER_RULES_MAX {MAX_RULES}\n")),
            "MAX_RULES is NCCLBPF_TUNER_RULES_MAX"
        );
    }

    #[test]
    fn check_file_warns_about_rules_that_never_apply() {
        let dir = std::env::temp_dir().join(format!("ncclbpf-rules-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("check.conf");
        std::fs::write(
            &p,
            "allreduce,0,-1,ring,simple,-1,-1,-1\nallreduce,10,20,tree,ll,-1,2,-1,1,0\n\
             allgather,0,100,ring,ll,-1,2,-1\nallgather,0,100,tree,ll,-1,-1,-1\n\
             allgather,50,60,tree,ll,-1,2,16\n",
        )
        .unwrap();
        let s = check_file(&p).unwrap();
        let f = p.display().to_string();
        assert_eq!(s.rules.len(), 5);
        assert_eq!(
            s.warnings,
            [
                format!("{f}:2: warning: skipped: {REG_BUFF_SKIPPED}"),
                format!(
                    "{f}:5: warning: never applies: the rule on line 3 comes first and matches every collective this one matches"
                ),
            ]
        );
        assert!(
            s.to_string()
                .starts_with(&format!("{f}: 5 rules (the table holds {MAX_RULES})\n"))
        );

        let missing = dir.join("missing.conf");
        let e = check_file(&missing).unwrap_err();
        assert_eq!(e.len(), 1);
        assert!(
            e[0].to_string()
                .starts_with(&format!("{}: cannot read it: ", missing.display())),
            "{}",
            e[0]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn install_fills_the_table_and_ends_it() {
        let spec = shared_maps::MapSpec {
            name: MAP_NAME.into(),
            kind: MapType::Array,
            key_size: 4,
            value_size: RuleEntry::SIZE as u32,
            max_entries: 8,
        };
        let map = Map::create(spec.clone()).unwrap();
        let dir = std::env::temp_dir().join(format!("ncclbpf-install-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let entry = |i: u32| RuleEntry::from_bytes(&map.get(&i.to_le_bytes()).unwrap()).unwrap();

        let p = dir.join("a.conf");
        std::fs::write(
            &p,
            format!("{GOOD}\nreduce,0,1,ring,ll,-1,-1,-1\nbroadcast,0,1,ring,ll,-1,-1,-1\n"),
        )
        .unwrap();
        assert_eq!(install_file(&map, &p), Ok(3));
        assert_eq!(
            (entry(0).valid, entry(0).coll, entry(0).channels),
            (1, 4, 2)
        );
        assert_eq!((entry(2).valid, entry(2).coll), (1, 0));
        assert_eq!(
            entry(3),
            RuleEntry::default(),
            "the table ends after the rules"
        );

        // Rules on regBuff are left out of the table.
        std::fs::write(
            &p,
            format!(
                "reduce,0,1,ring,ll,-1,-1,-1,-1,1\n{GOOD}\nbroadcast,0,1,ring,ll,-1,-1,-1,-1,0\n"
            ),
        )
        .unwrap();
        assert_eq!(install_file(&map, &p), Ok(1));
        assert_eq!((entry(0).valid, entry(0).coll), (1, 4));
        assert_eq!(entry(1), RuleEntry::default());

        // A shorter file ends the table earlier; a missing file empties it.
        std::fs::write(&p, format!("{GOOD}\n")).unwrap();
        assert_eq!(install_file(&map, &p), Ok(1));
        assert_eq!(entry(1), RuleEntry::default());
        assert_eq!(install_file(&map, &dir.join("none.conf")), Ok(0));
        assert!((0..8).all(|i| entry(i) == RuleEntry::default()));
        assert_eq!(install_file(&map, Path::new("")), Ok(0));

        // Errors install nothing: the table is left as it was.
        std::fs::write(&p, format!("{GOOD}\n")).unwrap();
        install_file(&map, &p).unwrap();
        std::fs::write(&p, format!("{GOOD}\n{GOOD}x\n")).unwrap();
        let e = install_file(&map, &p).unwrap_err();
        assert!(e.contains("1 error in the tuner rules"), "{e}");
        assert_eq!(entry(0).valid, 1);
        assert_eq!(entry(1), RuleEntry::default());

        // More rules than this table holds.
        let nine: String = (0..9).map(|_| format!("{GOOD}\n")).collect();
        std::fs::write(&p, nine).unwrap();
        assert!(install_file(&map, &p).is_err());

        // A map of another shape is refused.
        let other = Map::create(shared_maps::MapSpec {
            value_size: 8,
            ..spec
        })
        .unwrap();
        let e = install_file(&other, &p).unwrap_err();
        assert!(
            e.contains("a rules table is an array of struct ncclbpf_tuner_rule"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
