//! The subset of BTF a policy loader needs: types to read `.maps` definitions, and `.BTF.ext`
//! line info to put C source lines into verifier messages. Every read is bounds-checked.

use std::collections::HashMap;

const BTF_MAGIC: u16 = 0xeb9f;

pub const KIND_INT: u32 = 1;
pub const KIND_PTR: u32 = 2;
pub const KIND_ARRAY: u32 = 3;
pub const KIND_STRUCT: u32 = 4;
pub const KIND_UNION: u32 = 5;
pub const KIND_ENUM: u32 = 6;
pub const KIND_FWD: u32 = 7;
pub const KIND_TYPEDEF: u32 = 8;
pub const KIND_VOLATILE: u32 = 9;
pub const KIND_CONST: u32 = 10;
pub const KIND_RESTRICT: u32 = 11;
pub const KIND_FUNC: u32 = 12;
pub const KIND_FUNC_PROTO: u32 = 13;
pub const KIND_VAR: u32 = 14;
pub const KIND_DATASEC: u32 = 15;
pub const KIND_FLOAT: u32 = 16;
pub const KIND_DECL_TAG: u32 = 17;
pub const KIND_TYPE_TAG: u32 = 18;
pub const KIND_ENUM64: u32 = 19;

#[derive(Clone, Debug)]
pub struct Member {
    pub name: String,
    pub type_id: u32,
    pub offset: u32,
}

#[derive(Clone, Debug)]
pub struct BtfType {
    pub kind: u32,
    pub name: String,
    /// `size` for INT/STRUCT/UNION/ENUM/DATASEC/FLOAT, `type` for PTR/TYPEDEF/modifiers/VAR/FUNC.
    pub size_or_type: u32,
    /// ARRAY: (element type, element count).
    pub array: Option<(u32, u32)>,
    /// STRUCT/UNION members; DATASEC entries (type, offset) with size in `offset` order.
    pub members: Vec<Member>,
}

#[derive(Debug)]
pub struct Btf {
    /// Index = type id; id 0 is `void`.
    pub types: Vec<BtfType>,
    strings: Vec<u8>,
}

fn rd_u32(b: &[u8], off: usize) -> Result<u32, String> {
    b.get(off..off.checked_add(4).ok_or("offset overflow")?)
        .map(|s| u32::from_le_bytes(s.try_into().expect("4 bytes")))
        .ok_or_else(|| format!("BTF truncated at byte {off}"))
}

fn rd_u16(b: &[u8], off: usize) -> Result<u16, String> {
    b.get(off..off + 2)
        .map(|s| u16::from_le_bytes(s.try_into().expect("2 bytes")))
        .ok_or_else(|| format!("BTF truncated at byte {off}"))
}

fn string_at(strings: &[u8], off: u32) -> Result<String, String> {
    let start = off as usize;
    let tail = strings
        .get(start..)
        .ok_or_else(|| format!("BTF string offset {off} out of range"))?;
    let end = tail
        .iter()
        .position(|&c| c == 0)
        .ok_or("BTF string not terminated")?;
    Ok(String::from_utf8_lossy(&tail[..end]).into_owned())
}

impl Btf {
    pub fn parse(data: &[u8]) -> Result<Btf, String> {
        if rd_u16(data, 0)? != BTF_MAGIC {
            return Err("bad BTF magic (big-endian or not BTF)".into());
        }
        let hdr_len = rd_u32(data, 4)? as usize;
        let type_off = rd_u32(data, 8)? as usize;
        let type_len = rd_u32(data, 12)? as usize;
        let str_off = rd_u32(data, 16)? as usize;
        let str_len = rd_u32(data, 20)? as usize;
        let section = |off: usize, len: usize| {
            hdr_len
                .checked_add(off)
                .and_then(|s| Some((s, s.checked_add(len)?)))
                .and_then(|(s, e)| data.get(s..e))
                .ok_or_else(|| "BTF section out of range".to_string())
        };
        let tb = section(type_off, type_len)?;
        let strings = section(str_off, str_len)?.to_vec();
        let mut types = vec![BtfType {
            kind: 0,
            name: "void".into(),
            size_or_type: 0,
            array: None,
            members: vec![],
        }];
        let mut p = 0usize;
        while p < tb.len() {
            if types.len() > 1_000_000 {
                return Err("too many BTF types".into());
            }
            let name = string_at(&strings, rd_u32(tb, p)?)?;
            let info = rd_u32(tb, p + 4)?;
            let size_or_type = rd_u32(tb, p + 8)?;
            let kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            p += 12;
            let mut t = BtfType {
                kind,
                name,
                size_or_type,
                array: None,
                members: vec![],
            };
            match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => p += 4,
                KIND_PTR | KIND_FWD | KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT
                | KIND_FUNC | KIND_FLOAT | KIND_TYPE_TAG => {}
                KIND_ARRAY => {
                    t.array = Some((rd_u32(tb, p)?, rd_u32(tb, p + 8)?));
                    p += 12;
                }
                KIND_STRUCT | KIND_UNION => {
                    for k in 0..vlen {
                        let q = p + k * 12;
                        let raw_off = rd_u32(tb, q + 8)?;
                        // With kind_flag, the low 24 bits are the bit offset.
                        let offset = if info >> 31 != 0 {
                            raw_off & 0xff_ffff
                        } else {
                            raw_off
                        };
                        t.members.push(Member {
                            name: string_at(&strings, rd_u32(tb, q)?)?,
                            type_id: rd_u32(tb, q + 4)?,
                            offset,
                        });
                    }
                    p += vlen * 12;
                }
                KIND_ENUM => p += vlen * 8,
                KIND_ENUM64 => p += vlen * 12,
                KIND_FUNC_PROTO => p += vlen * 8,
                KIND_DATASEC => {
                    for k in 0..vlen {
                        let q = p + k * 12;
                        t.members.push(Member {
                            name: String::new(),
                            type_id: rd_u32(tb, q)?,
                            offset: rd_u32(tb, q + 4)?,
                        });
                    }
                    p += vlen * 12;
                }
                k => return Err(format!("unknown BTF kind {k}")),
            }
            types.push(t);
        }
        Ok(Btf { types, strings })
    }

    pub fn get(&self, id: u32) -> Result<&BtfType, String> {
        self.types
            .get(id as usize)
            .ok_or_else(|| format!("BTF type id {id} does not exist"))
    }

    pub fn string(&self, off: u32) -> Result<String, String> {
        string_at(&self.strings, off)
    }

    /// Follows typedefs, modifiers and type tags.
    pub fn skip_mods(&self, mut id: u32) -> Result<&BtfType, String> {
        for _ in 0..64 {
            let t = self.get(id)?;
            match t.kind {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = t.size_or_type
                }
                _ => return Ok(t),
            }
        }
        Err("BTF modifier chain too long (a cycle?)".into())
    }

    /// The byte size of a type.
    pub fn size_of(&self, id: u32) -> Result<u64, String> {
        self.size_of_depth(id, 0)
    }

    fn size_of_depth(&self, id: u32, depth: u32) -> Result<u64, String> {
        if depth > 64 {
            return Err("BTF type nesting too deep (a cycle?)".into());
        }
        let t = self.skip_mods(id)?;
        match t.kind {
            KIND_INT | KIND_STRUCT | KIND_UNION | KIND_ENUM | KIND_ENUM64 | KIND_FLOAT
            | KIND_DATASEC => Ok(u64::from(t.size_or_type)),
            KIND_PTR => Ok(8),
            KIND_ARRAY => {
                let (elem, n) = t.array.expect("arrays carry dimensions");
                self.size_of_depth(elem, depth + 1)?
                    .checked_mul(u64::from(n))
                    .ok_or_else(|| "BTF array size overflows".into())
            }
            k => Err(format!("BTF type {id} (kind {k}) has no size")),
        }
    }

    pub fn find_datasec(&self, name: &str) -> Option<&BtfType> {
        self.types
            .iter()
            .find(|t| t.kind == KIND_DATASEC && t.name == name)
    }
}

/// A map definition read from BTF (`__uint`/`__type` members).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BtfMapDef {
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub map_flags: u32,
    /// `ncclbpf_scope` (`NCCLBPF_AGREED`, `NCCLBPF_CONFIG`), if declared.
    pub scope: Option<u32>,
    /// `ncclbpf_source` (`NCCLBPF_EPOCH_SOURCE(n)`, `NCCLBPF_AGREED_FROM(n, op)`,
    /// `NCCLBPF_AGREED_STATE`), if declared.
    pub source: Option<u32>,
    /// `ncclbpf_reduce` (`NCCLBPF_REDUCE_*`), if declared.
    pub reduce: Option<u32>,
}

/// Reads the map definitions of the `.maps` DATASEC: (variable name, definition).
pub fn map_defs(btf: &Btf) -> Result<Vec<(String, BtfMapDef)>, String> {
    let Some(sec) = btf.find_datasec(".maps") else {
        return Ok(vec![]);
    };
    let mut out = Vec::new();
    for m in &sec.members {
        let var = btf.get(m.type_id)?;
        if var.kind != KIND_VAR {
            return Err(format!("'.maps' entry {} is not a variable", m.type_id));
        }
        let name = var.name.clone();
        let st = btf.skip_mods(var.size_or_type)?;
        if st.kind != KIND_STRUCT {
            return Err(format!("map '{name}': definition is not a struct"));
        }
        let mut def = BtfMapDef::default();
        for f in &st.members {
            // __uint(x, N) is `int (*x)[N]`; __type(x, T) is `T *x`.
            let ptr = btf.skip_mods(f.type_id)?;
            if ptr.kind != KIND_PTR {
                return Err(format!(
                    "map '{name}': member '{}' is not a pointer (use __uint/__type)",
                    f.name
                ));
            }
            let target = ptr.size_or_type;
            let uint = || -> Result<u32, String> {
                let arr = btf.skip_mods(target)?;
                arr.array
                    .map(|(_, n)| n)
                    .ok_or_else(|| format!("map '{name}': '{}' must use __uint", f.name))
            };
            let size = || -> Result<u32, String> {
                let s = btf.size_of(target)?;
                u32::try_from(s).map_err(|_| format!("map '{name}': '{}' is too large", f.name))
            };
            match f.name.as_str() {
                "type" => def.map_type = uint()?,
                "max_entries" => def.max_entries = uint()?,
                "map_flags" => def.map_flags = uint()?,
                "ncclbpf_scope" => def.scope = Some(uint()?),
                "ncclbpf_source" => def.source = Some(uint()?),
                "ncclbpf_reduce" => def.reduce = Some(uint()?),
                "key_size" => def.key_size = uint()?,
                "value_size" => def.value_size = uint()?,
                "key" => def.key_size = size()?,
                "value" => def.value_size = size()?,
                "pinning" | "numa_node" => {}
                other => return Err(format!("map '{name}': unsupported member '{other}'")),
            }
        }
        out.push((name, def));
    }
    Ok(out)
}

/// A `.BTF.ext` line-info record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineRecord {
    /// Byte offset of the instruction in its section.
    pub insn_off: u32,
    pub file: String,
    pub line: u32,
    pub col: u32,
    pub text: String,
}

/// Reads `.BTF.ext` line info, grouped by section name.
pub fn line_info(btf: &Btf, ext: &[u8]) -> Result<HashMap<String, Vec<LineRecord>>, String> {
    if rd_u16(ext, 0)? != BTF_MAGIC {
        return Err("bad .BTF.ext magic".into());
    }
    let hdr_len = rd_u32(ext, 4)? as usize;
    let line_off = rd_u32(ext, 16)? as usize;
    let line_len = rd_u32(ext, 20)? as usize;
    let start = hdr_len.checked_add(line_off).ok_or("offset overflow")?;
    let sec = ext
        .get(start..start.checked_add(line_len).ok_or("length overflow")?)
        .ok_or(".BTF.ext line info out of range")?;
    let mut out: HashMap<String, Vec<LineRecord>> = HashMap::new();
    if sec.is_empty() {
        return Ok(out);
    }
    let rec_size = rd_u32(sec, 0)? as usize;
    if rec_size < 16 {
        return Err(format!(".BTF.ext line record size {rec_size} < 16"));
    }
    let mut p = 4;
    while p < sec.len() {
        let name = btf.string(rd_u32(sec, p)?)?;
        let n = rd_u32(sec, p + 4)? as usize;
        p += 8;
        if n > sec.len() / rec_size {
            return Err(".BTF.ext line info count out of range".into());
        }
        let v = out.entry(name).or_default();
        for _ in 0..n {
            let line_col = rd_u32(sec, p + 12)?;
            v.push(LineRecord {
                insn_off: rd_u32(sec, p)?,
                file: btf.string(rd_u32(sec, p + 4)?)?,
                text: btf.string(rd_u32(sec, p + 8)?)?,
                line: line_col >> 10,
                col: line_col & 0x3ff,
            });
            p += rec_size;
        }
    }
    Ok(out)
}
