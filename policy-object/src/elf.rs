//! Parsing a policy object: programs by section, maps, relocations, BPF-to-BPF call linking.

use crate::btf::{self, Btf};
use crate::epoch::{self, Reduce};
use crate::insn::{self, Insn};
use object::elf;
use object::read::elf::{ElfFile64, FileHeader, SectionHeader};
use object::{
    Endianness, Object as _, ObjectSection, ObjectSymbol, RelocationFlags, RelocationTarget,
    SectionKind, SymbolKind,
};
use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// Instructions per program after linking; larger objects are refused before verification.
pub const MAX_PROGRAM_INSNS: usize = 65_536;

/// What is wrong with an object, precisely enough to fix it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ObjectError {
    NotElf(String),
    NotBpf {
        machine: u16,
    },
    BigEndian,
    BadSection {
        section: String,
        reason: String,
    },
    BadBtf(String),
    BadMap {
        map: String,
        reason: String,
    },
    BadRelocation {
        section: String,
        offset: u64,
        reason: String,
    },
    BadCall {
        program: String,
        insn: usize,
        reason: String,
    },
    TooLarge {
        program: String,
        insns: usize,
    },
    NoPrograms,
}

impl fmt::Display for ObjectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ObjectError::NotElf(e) => write!(f, "not an ELF object: {e}"),
            ObjectError::NotBpf { machine } => write!(
                f,
                "ELF machine {machine} is not BPF (247): build with clang -target bpf"
            ),
            ObjectError::BigEndian => write!(
                f,
                "big-endian BPF object: build with -target bpf (little endian)"
            ),
            ObjectError::BadSection { section, reason } => {
                write!(f, "section '{section}': {reason}")
            }
            ObjectError::BadBtf(e) => write!(f, "BTF: {e}"),
            ObjectError::BadMap { map, reason } => write!(f, "map '{map}': {reason}"),
            ObjectError::BadRelocation {
                section,
                offset,
                reason,
            } => {
                write!(f, "relocation at {section}+{offset:#x}: {reason}")
            }
            ObjectError::BadCall {
                program,
                insn,
                reason,
            } => write!(f, "program '{program}' insn {insn}: {reason}"),
            ObjectError::TooLarge { program, insns } => {
                write!(
                    f,
                    "program '{program}' has {insns} instructions (limit {MAX_PROGRAM_INSNS})"
                )
            }
            ObjectError::NoPrograms => write!(
                f,
                "no programs: put each entry function in a section named for its hook, e.g. SEC(\"tuner\")"
            ),
        }
    }
}

impl std::error::Error for ObjectError {}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapKind {
    Hash,
    Array,
    PercpuArray,
}

impl MapKind {
    pub fn from_type(t: u32) -> Option<MapKind> {
        match t {
            1 => Some(MapKind::Hash),
            2 => Some(MapKind::Array),
            6 => Some(MapKind::PercpuArray),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            MapKind::Hash => "hash",
            MapKind::Array => "array",
            MapKind::PercpuArray => "percpu_array",
        }
    }
}

/// Who may change a map's contents, and so whether every rank of a communicator holds the same
/// (declared with `NCCLBPF_AGREED` / `NCCLBPF_CONFIG` in `ncclbpf.h`, a `ncclbpf_scope` member
/// of the BTF definition).
///
/// Tuner programs must decide the same on every rank: the verifier rejects a tuner program
/// whose decision could depend on a [`Scope::Local`] value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Rank-local (the default): programs write it (net hooks count into it), so its contents
    /// are this rank's own. Per-CPU maps and writable global data (`.data`, `.bss`) are always
    /// local.
    Local,
    /// Filled by the agreement between the ranks of a communicator: every rank holds the same
    /// contents at each collective. No program writes it.
    Agreed,
    /// Configuration (thresholds, rules), the same on every rank: changed only by staged
    /// updates that take effect at one collective on every rank, never by a program.
    /// `.rodata` is configuration too (it comes with the object).
    Config,
}

impl Scope {
    /// The value of `ncclbpf_scope` in a map definition (`NCCLBPF_SCOPE_*` in `ncclbpf.h`).
    pub fn from_value(v: u32) -> Option<Scope> {
        match v {
            1 => Some(Scope::Local),
            2 => Some(Scope::Agreed),
            3 => Some(Scope::Config),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Scope::Local => "rank-local",
            Scope::Agreed => "agreed",
            Scope::Config => "config",
        }
    }

    /// Whether programs may write it.
    pub fn program_writable(self) -> bool {
        self == Scope::Local
    }
}

/// A map the object declares (BTF `.maps`) or a global-data section turned into a one-entry
/// array (`.rodata*`, `.data*`, `.bss*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapDef {
    pub name: String,
    pub kind: MapKind,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub flags: u32,
    /// Initial contents of a global-data map.
    pub initial: Option<Vec<u8>>,
    /// `.rodata`: programs may not write it.
    pub read_only: bool,
    /// Who changes its contents ([`Scope::Config`] for `.rodata`).
    pub scope: Scope,
    /// `ncclbpf_source` ([`crate::epoch`]): on a rank-local array, the epoch source number
    /// (1..=254) whose contents go into the rank's epoch record; on an agreed array, the source
    /// it is filled from (1..=254), or [`SOURCE_STATE`](crate::epoch::SOURCE_STATE) for the map that receives the epoch
    /// program's state. `None` for every other map (global data included).
    pub source: Option<u32>,
    /// How an agreed map filled from a source combines the ranks' words ([`Reduce::Sum`]
    /// unless declared; meaningless without a source).
    pub reduce: Reduce,
}

/// A C source line for an instruction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineInfo {
    pub insn: usize,
    pub file: String,
    pub line: u32,
    pub col: u32,
    pub text: String,
}

/// One program: an entry function with every subprogram it calls linked after it. `lddw`
/// map references carry the map's index in [`Object::maps`] (src 1), or index and offset
/// (src 2); calls carry relative offsets within `insns`.
#[derive(Clone, Debug)]
pub struct Program {
    pub name: String,
    pub section: String,
    pub insns: Vec<Insn>,
    pub lines: Vec<LineInfo>,
}

impl Program {
    /// The source line closest at or before `insn`, if the object has line info.
    pub fn line_for(&self, insn: usize) -> Option<&LineInfo> {
        self.lines
            .iter()
            .filter(|l| l.insn <= insn)
            .max_by_key(|l| l.insn)
    }
}

#[derive(Clone, Debug)]
pub struct Object {
    pub programs: Vec<Program>,
    pub maps: Vec<MapDef>,
}

/// A function inside an executable section.
#[derive(Clone, Debug)]
struct Func {
    name: String,
    section: usize,
    /// Instruction range within the section.
    start: usize,
    len: usize,
    global: bool,
}

/// Where a relocated call goes: (section index, instruction within the section).
type CallTarget = (usize, usize);

struct Section {
    name: String,
    insns: Vec<Insn>,
    calls: HashMap<usize, CallTarget>,
}

fn is_data_section(name: &str) -> bool {
    [".rodata", ".data", ".bss"]
        .iter()
        .any(|p| name == *p || name.starts_with(&format!("{p}.")))
}

impl Object {
    pub fn parse(data: &[u8]) -> Result<Object, ObjectError> {
        let file =
            ElfFile64::<Endianness>::parse(data).map_err(|e| ObjectError::NotElf(e.to_string()))?;
        let hdr = file.elf_header();
        let endian = file.endian();
        if hdr.e_machine(endian) != elf::EM_BPF {
            return Err(ObjectError::NotBpf {
                machine: hdr.e_machine(endian),
            });
        }
        if !file.is_little_endian() {
            return Err(ObjectError::BigEndian);
        }
        let sec_err = |s: &str, r: String| ObjectError::BadSection {
            section: s.into(),
            reason: r,
        };

        // BTF: map definitions and line info.
        let btf = match file.section_by_name(".BTF") {
            Some(s) => Some(
                Btf::parse(s.data().map_err(|e| sec_err(".BTF", e.to_string()))?)
                    .map_err(ObjectError::BadBtf)?,
            ),
            None => None,
        };
        let mut maps = Vec::new();
        let mut map_by_name: HashMap<String, usize> = HashMap::new();
        if let Some(btf) = &btf {
            for (name, d) in btf::map_defs(btf).map_err(ObjectError::BadBtf)? {
                let kind = MapKind::from_type(d.map_type).ok_or_else(|| ObjectError::BadMap {
                    map: name.clone(),
                    reason: format!(
                        "map type {} is not supported (hash 1, array 2, percpu_array 6)",
                        d.map_type
                    ),
                })?;
                let bad = |r: &str| ObjectError::BadMap {
                    map: name.clone(),
                    reason: r.into(),
                };
                if d.max_entries == 0 {
                    return Err(bad("max_entries is 0"));
                }
                if d.value_size == 0 || d.key_size == 0 {
                    return Err(bad(
                        "key and value need a size (__type(key, …), __type(value, …))",
                    ));
                }
                if matches!(kind, MapKind::Array | MapKind::PercpuArray) && d.key_size != 4 {
                    return Err(bad("array maps take a 4-byte key"));
                }
                let scope = match d.scope {
                    None => Scope::Local,
                    Some(v) => Scope::from_value(v).ok_or_else(|| {
                        bad(&format!(
                            "ncclbpf_scope {v} is not a scope (NCCLBPF_SCOPE_LOCAL 1, \
                             NCCLBPF_SCOPE_AGREED 2, NCCLBPF_SCOPE_CONFIG 3)"
                        ))
                    })?,
                };
                if kind == MapKind::PercpuArray && scope != Scope::Local {
                    return Err(bad(&format!(
                        "a per-CPU map is rank-local by nature; it cannot be {}",
                        scope.name()
                    )));
                }
                if u64::from(d.value_size) * u64::from(d.max_entries) > 1 << 30
                    || d.key_size > 512
                    || d.value_size > 65536
                {
                    return Err(bad(
                        "too large (value_size ≤ 64 KiB, key_size ≤ 512, ≤ 1 GiB in all)",
                    ));
                }
                let (source, reduce) =
                    epoch::attributes(kind, scope, d.value_size, d.max_entries, d.source, d.reduce)
                        .map_err(|r| bad(&r))?;
                map_by_name.insert(name.clone(), maps.len());
                maps.push(MapDef {
                    name,
                    kind,
                    key_size: d.key_size,
                    value_size: d.value_size,
                    max_entries: d.max_entries,
                    flags: d.map_flags,
                    initial: None,
                    read_only: false,
                    scope,
                    source,
                    reduce,
                });
            }
            epoch::check_links(&maps)?;
        } else if file.section_by_name(".maps").is_some() {
            return Err(ObjectError::BadBtf(
                "the object has .maps but no .BTF section: build with -g".into(),
            ));
        }

        // Global-data sections become one-entry arrays.
        let mut data_map: HashMap<usize, usize> = HashMap::new();
        for s in file.sections() {
            let name = s.name().unwrap_or("");
            if !is_data_section(name) {
                continue;
            }
            let size = s.size();
            if size == 0 || size > 65536 {
                if size > 65536 {
                    return Err(sec_err(name, "global data larger than 64 KiB".into()));
                }
                continue;
            }
            let initial = if s.kind() == SectionKind::UninitializedData {
                vec![0u8; size as usize]
            } else {
                s.data().map_err(|e| sec_err(name, e.to_string()))?.to_vec()
            };
            data_map.insert(s.index().0, maps.len());
            maps.push(MapDef {
                name: name.to_string(),
                kind: MapKind::Array,
                key_size: 4,
                value_size: size as u32,
                max_entries: 1,
                flags: 0,
                initial: Some(initial),
                read_only: name.starts_with(".rodata"),
                scope: if name.starts_with(".rodata") {
                    Scope::Config
                } else {
                    Scope::Local
                },
                source: None,
                reduce: Reduce::Sum,
            });
        }

        // Executable sections, their functions and relocations.
        let mut sections: BTreeMap<usize, Section> = BTreeMap::new();
        for s in file.sections() {
            let name = s.name().unwrap_or("").to_string();
            let is_exec =
                s.elf_section_header().sh_flags(endian) & u64::from(elf::SHF_EXECINSTR) != 0;
            if !is_exec || s.size() == 0 {
                continue;
            }
            let bytes = s.data().map_err(|e| sec_err(&name, e.to_string()))?;
            let insns = insn::decode_all(bytes).ok_or_else(|| {
                sec_err(
                    &name,
                    format!("size {} is not a multiple of 8", bytes.len()),
                )
            })?;
            sections.insert(
                s.index().0,
                Section {
                    name,
                    insns,
                    calls: HashMap::new(),
                },
            );
        }
        let mut funcs: Vec<Func> = Vec::new();
        for sym in file.symbols() {
            if sym.kind() != SymbolKind::Text {
                continue;
            }
            let Some(idx) = sym.section_index() else {
                continue;
            };
            let Some(sec) = sections.get(&idx.0) else {
                continue;
            };
            let name = sym.name().unwrap_or("").to_string();
            let (start, size) = (sym.address(), sym.size());
            if start % 8 != 0
                || size % 8 != 0
                || (start + size) as usize > sec.insns.len() * 8
                || size == 0
            {
                return Err(sec_err(
                    &sec.name,
                    format!("function '{name}' has a bad extent ({start:#x}, {size:#x})"),
                ));
            }
            funcs.push(Func {
                name,
                section: idx.0,
                start: start as usize / 8,
                len: size as usize / 8,
                global: sym.is_global(),
            });
        }

        for (&sidx, sec) in sections.iter_mut() {
            let Some(elf_sec) = file.section_by_index(object::SectionIndex(sidx)).ok() else {
                continue;
            };
            for (offset, rel) in elf_sec.relocations() {
                let rerr = |r: String| ObjectError::BadRelocation {
                    section: sec.name.clone(),
                    offset,
                    reason: r,
                };
                let pc = (offset / 8) as usize;
                if offset % 8 != 0 || pc >= sec.insns.len() {
                    return Err(rerr("offset outside the section".into()));
                }
                let RelocationTarget::Symbol(si) = rel.target() else {
                    return Err(rerr("relocation without a symbol".into()));
                };
                let sym = file.symbol_by_index(si).map_err(|e| rerr(e.to_string()))?;
                let r_type = match rel.flags() {
                    RelocationFlags::Elf { r_type } => r_type,
                    _ => return Err(rerr("not an ELF relocation".into())),
                };
                let target_sec = sym.section_index().map(|i| i.0);
                match r_type {
                    // R_BPF_64_64: an lddw of a map or of global data.
                    1 => {
                        if !sec.insns[pc].is_lddw() || pc + 1 >= sec.insns.len() {
                            return Err(rerr(
                                "R_BPF_64_64 on an instruction that is not lddw".into(),
                            ));
                        }
                        let sname = sym.name().unwrap_or("");
                        if let Some(&m) = map_by_name.get(sname) {
                            sec.insns[pc].src = insn::PSEUDO_MAP_FD;
                            sec.insns[pc].imm = m as i32;
                            sec.insns[pc + 1].imm = 0;
                        } else if let Some(&m) = target_sec.and_then(|t| data_map.get(&t)) {
                            let off = i64::from(sec.insns[pc].imm) + sym.address() as i64;
                            let size = i64::from(maps[m].value_size);
                            if !(0..size).contains(&off) {
                                return Err(rerr(format!(
                                    "offset {off} outside {} ({size} bytes)",
                                    maps[m].name
                                )));
                            }
                            sec.insns[pc].src = insn::PSEUDO_MAP_VALUE;
                            sec.insns[pc].imm = m as i32;
                            sec.insns[pc + 1].imm = off as i32;
                        } else {
                            return Err(rerr(format!(
                                "'{sname}' is neither a map in .maps nor global data"
                            )));
                        }
                    }
                    // R_BPF_64_32: a call to a function in another (or the same) section.
                    10 => {
                        let i = sec.insns[pc];
                        if i.code != (insn::JMP | insn::CALL) || i.src != insn::PSEUDO_CALL {
                            return Err(rerr(
                                "R_BPF_64_32 on an instruction that is not a BPF-to-BPF call"
                                    .into(),
                            ));
                        }
                        let t = target_sec.ok_or_else(|| {
                            rerr(
                                "call to an undefined function (static inline helpers need a body)"
                                    .into(),
                            )
                        })?;
                        let target = if sym.kind() == SymbolKind::Section {
                            i64::from(i.imm) + 1
                        } else {
                            (sym.address() / 8) as i64
                        };
                        let target = usize::try_from(target)
                            .map_err(|_| rerr("call before section start".into()))?;
                        sec.calls.insert(pc, (t, target));
                    }
                    t => return Err(rerr(format!("unsupported relocation type {t}"))),
                }
            }
        }

        let lines = match (&btf, file.section_by_name(".BTF.ext")) {
            (Some(btf), Some(ext)) => btf::line_info(
                btf,
                ext.data().map_err(|e| sec_err(".BTF.ext", e.to_string()))?,
            )
            .map_err(ObjectError::BadBtf)?,
            _ => HashMap::new(),
        };

        let mut programs = Vec::new();
        for f in funcs
            .iter()
            .filter(|f| f.global && sections.get(&f.section).is_some_and(|s| s.name != ".text"))
        {
            programs.push(link(f, &funcs, &sections, &lines)?);
        }
        if programs.is_empty() {
            return Err(ObjectError::NoPrograms);
        }
        Ok(Object { programs, maps })
    }

    pub fn program(&self, name: &str) -> Option<&Program> {
        self.programs.iter().find(|p| p.name == name)
    }
}

/// Lays out `entry` followed by every function it calls (transitively), fixing call offsets.
fn link(
    entry: &Func,
    funcs: &[Func],
    sections: &BTreeMap<usize, Section>,
    lines: &HashMap<String, Vec<LineRecord>>,
) -> Result<Program, ObjectError> {
    let mut order: Vec<&Func> = vec![entry];
    let mut base: HashMap<(usize, usize), usize> = HashMap::new();
    base.insert((entry.section, entry.start), 0);
    let mut total = entry.len;
    let mut insns: Vec<Insn> = Vec::new();
    let mut out_lines = Vec::new();
    let mut k = 0;
    while k < order.len() {
        let f = order[k];
        let sec = &sections[&f.section];
        let my_base = base[&(f.section, f.start)];
        for pc in f.start..f.start + f.len {
            let mut i = sec.insns[pc];
            if i.code == (insn::JMP | insn::CALL) && i.src == insn::PSEUDO_CALL {
                let (tsec, tpc) = match sec.calls.get(&pc) {
                    Some(&t) => t,
                    None => {
                        let t = pc as i64 + 1 + i64::from(i.imm);
                        (f.section, usize::try_from(t).unwrap_or(usize::MAX))
                    }
                };
                let callee = funcs
                    .iter()
                    .find(|g| g.section == tsec && g.start == tpc)
                    .ok_or_else(|| ObjectError::BadCall {
                        program: entry.name.clone(),
                        insn: my_base + pc - f.start,
                        reason: "call target is not the start of a function".into(),
                    })?;
                let cbase = match base.get(&(callee.section, callee.start)) {
                    Some(&b) => b,
                    None => {
                        let b = total;
                        total += callee.len;
                        base.insert((callee.section, callee.start), b);
                        order.push(callee);
                        b
                    }
                };
                let here = my_base + pc - f.start;
                i.imm = (cbase as i64 - here as i64 - 1) as i32;
            }
            insns.push(i);
            if insns.len() > MAX_PROGRAM_INSNS {
                return Err(ObjectError::TooLarge {
                    program: entry.name.clone(),
                    insns: insns.len(),
                });
            }
        }
        if let Some(recs) = lines.get(&sec.name) {
            for r in recs {
                let idx = r.insn_off as usize / 8;
                if (f.start..f.start + f.len).contains(&idx) {
                    out_lines.push(LineInfo {
                        insn: my_base + idx - f.start,
                        file: r.file.clone(),
                        line: r.line,
                        col: r.col,
                        text: r.text.clone(),
                    });
                }
            }
        }
        k += 1;
    }
    Ok(Program {
        name: entry.name.clone(),
        section: sections[&entry.section].name.clone(),
        insns,
        lines: out_lines,
    })
}

use crate::btf::LineRecord;
