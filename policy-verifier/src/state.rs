//! The abstract machine state: typed registers, per-byte stack initialization with spilled
//! registers, call frames.

use crate::frames::{Frames, Stack};
use crate::liveness::FrameMask;
use crate::platform::{Hook, MapInfo, Scope};
use crate::scalar::Scalar;
use std::fmt::Write;
use std::num::NonZeroU16;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RegType {
    NotInit,
    Scalar,
    Ctx,
    /// A pointer into the stack of call frame `frame`.
    Stack {
        frame: u8,
    },
    MapValue {
        map: u16,
    },
    MapValueOrNull {
        map: u16,
    },
    MapPtr {
        map: u16,
    },
}

impl RegType {
    pub fn is_pointer(self) -> bool {
        !matches!(self, RegType::NotInit | RegType::Scalar)
    }
}

/// Where a rank-local value came from: what makes it possibly different on another rank of
/// the communicator (see [`crate::check`]'s locality rule).
///
/// Two bytes (a kind and an index, [`Source`]), so that per-byte taints of the stack stay small:
/// states are cloned at every pruning point. Indices past 16382 (maps no object has) share the
/// last one: the value is still tainted, the message may name another map.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Taint(NonZeroU16);

/// What a [`Taint`] stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Read from (or found or not found in) a rank-local map.
    Map(u16),
    /// Read from (or found or not found in) a map whose contents are per communicator
    /// ([`MapInfo::per_comm`]), in a hook that runs without the communicator's views of them
    /// ([`Hook::views`]): what it reads is whichever communicator's contents were installed
    /// last.
    NoView(u16),
    /// Returned by a helper whose result is this rank's own (a clock, a CPU id).
    Helper(i32),
    /// A context field whose value is this rank's own: its index in `Hook::local_fields`.
    Field(usize),
}

impl Taint {
    const INDEX_BITS: u16 = 14;
    const INDEX_MAX: usize = (1 << Self::INDEX_BITS) - 2;

    fn pack(kind: u16, index: usize) -> Taint {
        let i = index.min(Self::INDEX_MAX) as u16 + 1;
        Taint(NonZeroU16::new((kind << Self::INDEX_BITS) | i).unwrap_or(NonZeroU16::MIN))
    }

    pub fn new(s: Source) -> Taint {
        match s {
            Source::Map(m) => Self::pack(0, m.into()),
            Source::NoView(m) => Self::pack(1, m.into()),
            Source::Helper(id) => Self::pack(2, usize::try_from(id).unwrap_or(0)),
            Source::Field(k) => Self::pack(3, k),
        }
    }

    pub fn source(self) -> Source {
        let v = self.0.get();
        let i = (v & ((1 << Self::INDEX_BITS) - 1)) - 1;
        match v >> Self::INDEX_BITS {
            0 => Source::Map(i),
            1 => Source::NoView(i),
            2 => Source::Helper(i.into()),
            _ => Source::Field(i.into()),
        }
    }

    fn field(k: usize, hook: &Hook) -> (&'static str, &'static str) {
        hook.local_fields.get(k).copied().unwrap_or(("?", "?"))
    }

    pub fn describe(self, maps: &[MapInfo], hook: &Hook) -> String {
        match self.source() {
            Source::Map(m) | Source::NoView(m) => format!(
                "map '{}'",
                maps.get(m as usize).map_or("?", |m| m.name.as_str())
            ),
            Source::Helper(id) => format!(
                "helper {}",
                crate::platform::helper(id).map_or("?", |h| h.name)
            ),
            Source::Field(k) => {
                let (name, why) = Self::field(k, hook);
                format!("context field '{name}' ({why})")
            }
        }
    }

    /// The name alone, for register states.
    pub fn short(self, maps: &[MapInfo], hook: &Hook) -> String {
        match self.source() {
            Source::Map(m) => maps
                .get(m as usize)
                .map_or("?", |m| m.name.as_str())
                .to_string(),
            Source::Helper(id) => crate::platform::helper(id)
                .map_or("?", |h| h.name)
                .to_string(),
            Source::NoView(m) => format!(
                "{} (no view)",
                maps.get(m as usize).map_or("?", |m| m.name.as_str())
            ),
            Source::Field(k) => format!("ctx.{}", Self::field(k, hook).0),
        }
    }

    /// Why a decision may not depend on it in `hook` (after [`describe`](Self::describe)).
    pub fn why(self, maps: &[MapInfo], hook: &Hook) -> String {
        let disagree =
            "ranks may decide differently, and a communicator whose ranks disagree hangs";
        let sec = hook.section;
        let only = format!("'{sec}' programs decide from the context, constants and .rodata only");
        match self.source() {
            Source::NoView(m) => {
                let what = match maps.get(m as usize).map(|m| m.scope) {
                    Some(Scope::Agreed) => {
                        "agreed: its contents are per communicator (each communicator's agreement fills its own)"
                    }
                    _ => {
                        "config: its contents are per communicator (staged updates take effect at each communicator's own collective)"
                    }
                };
                format!(
                    "which is {what}, and '{sec}' programs run without the communicator's view of them (they read whichever communicator's contents were installed last): {disagree} ({only})"
                )
            }
            _ if hook.views => format!(
                "which is rank-local: {disagree} (tuner programs decide from the context and from agreed or config maps: NCCLBPF_AGREED, NCCLBPF_CONFIG)"
            ),
            _ => format!(
                "which is rank-local: {disagree} ({only}: agreed and config maps are per communicator, and '{sec}' programs run without the communicator's view of them)"
            ),
        }
    }
}

/// The first taint of two.
pub fn join(a: Option<Taint>, b: Option<Taint>) -> Option<Taint> {
    a.or(b)
}

/// A register: its type, a fixed offset (pointers) and a scalar that is the value (scalars)
/// or the variable part of the offset (pointers). `id` links copies: scalars copied from one
/// another share bounds learnt from branches; the copies of one lookup result become non-NULL
/// together. `taint` is set (in tuner hooks) when the value may differ between ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Reg {
    pub ty: RegType,
    pub off: i64,
    pub v: Scalar,
    pub id: u32,
    pub taint: Option<Taint>,
}

impl Reg {
    pub const NOT_INIT: Reg = Reg {
        ty: RegType::NotInit,
        off: 0,
        v: Scalar::UNKNOWN,
        id: 0,
        taint: None,
    };

    pub fn scalar(v: Scalar) -> Reg {
        Reg {
            ty: RegType::Scalar,
            off: 0,
            v,
            id: 0,
            taint: None,
        }
    }

    pub fn konst(v: u64) -> Reg {
        Reg::scalar(Scalar::konst(v))
    }

    pub fn pointer(ty: RegType, off: i64) -> Reg {
        Reg {
            ty,
            off,
            v: Scalar::konst(0),
            id: 0,
            taint: None,
        }
    }

    pub fn describe(&self, maps: &[MapInfo], hook: &Hook) -> String {
        let map = |m: u16| {
            maps.get(m as usize)
                .map_or("?", |m| m.name.as_str())
                .to_string()
        };
        let var = |v: &Scalar| {
            if v.const_value() == Some(0) {
                String::new()
            } else {
                format!(",var={}", scalar_text(v))
            }
        };
        let text: String = match self.ty {
            RegType::NotInit => "!init".into(),
            RegType::Scalar => scalar_text(&self.v),
            RegType::Ctx => format!("ctx(off={}{})", self.off, var(&self.v)),
            RegType::Stack { frame } => {
                let f = if frame > 0 {
                    format!("[frame {frame}]")
                } else {
                    String::new()
                };
                format!("fp{}{}{f}", self.off, var(&self.v))
            }
            RegType::MapValue { map: m } => {
                format!("map_value({},off={}{})", map(m), self.off, var(&self.v))
            }
            RegType::MapValueOrNull { map: m } => {
                format!("map_value_or_null({},off={})", map(m), self.off)
            }
            RegType::MapPtr { map: m } => format!("map_ptr({})", map(m)),
        };
        match self.taint {
            Some(t) => format!("{text}[rank-local: {}]", t.short(maps, hook)),
            None => text,
        }
    }

    /// The kernel's name of the type.
    pub fn type_name(&self) -> &'static str {
        match self.ty {
            RegType::NotInit => "!init",
            RegType::Scalar => "scalar",
            RegType::Ctx => "ctx",
            RegType::Stack { .. } => "fp",
            RegType::MapValue { .. } => "map_value",
            RegType::MapValueOrNull { .. } => "map_value_or_null",
            RegType::MapPtr { .. } => "map_ptr",
        }
    }
}

pub fn scalar_text(v: &Scalar) -> String {
    if let Some(c) = v.const_value() {
        return format!("{}", c as i64);
    }
    let mut s = String::from("scalar(");
    let mut parts = vec![];
    if v.umin != 0 {
        parts.push(format!("umin={}", v.umin));
    }
    if v.umax != u64::MAX {
        parts.push(format!("umax={}", v.umax));
    }
    if v.smin != i64::MIN && v.smin != v.umin as i64 {
        parts.push(format!("smin={}", v.smin));
    }
    if v.smax != i64::MAX && v.smax != v.umax as i64 {
        parts.push(format!("smax={}", v.smax));
    }
    s.push_str(&parts.join(","));
    s.push(')');
    s
}

/// A scalar spilled in 1, 2 or 4 naturally aligned bytes (a narrow spill): where, and the
/// unsigned bounds of the stored bytes' value (zero-extended). Compact (a slot may hold two),
/// and without an id or known bits: what a loop counter needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Narrow {
    /// Byte offset in the slot.
    pub at: u8,
    pub size: u8,
    pub min: u32,
    pub max: u32,
}

impl Narrow {
    pub fn mask(&self) -> u8 {
        ((((1u16 << self.size.min(8)) - 1) as u8) as u16).wrapping_shl(self.at.into()) as u8
    }

    pub fn contains(&self, o: &Narrow) -> bool {
        (self.at, self.size) == (o.at, o.size) && self.min <= o.min && o.max <= self.max
    }

    pub fn value(&self) -> Scalar {
        Scalar::urange(self.min.into(), self.max.into())
    }
}

/// Eight stack bytes: which are initialized (bit k for byte k), the register spilled there if
/// any, narrow spills, and each byte's taint.
///
/// `spill` is a whole-slot spill (`init == 0xff`): an aligned 8-byte store of a pointer through
/// any stack pointer, or of a scalar through `r10`. `narrow[h]` is a scalar stored through
/// `r10` in 1, 2 or 4 naturally aligned bytes of the slot's half `h` (bytes `4h..4h + 4`): a
/// fill of those bytes gets the bounds back (a loop counter whose address is taken lives in
/// such a slot, often beside another 4-byte variable). A store that overlaps a spill ends it;
/// one beside it keeps it.
///
/// `taint[k]`: byte k holds a value that may differ between ranks (tuner hooks; a spill keeps
/// its own too). Per byte, so that a store of an agreed value over part of a slot does not keep
/// the rank-local taint of the bytes it replaced, and a load takes the taint of exactly the
/// bytes it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Slot {
    pub init: u8,
    pub spill: Option<Reg>,
    pub narrow: [Option<Narrow>; 2],
    pub taint: [Option<Taint>; 8],
}

impl Slot {
    pub const EMPTY: Slot = Slot {
        init: 0,
        spill: None,
        narrow: [None; 2],
        taint: [None; 8],
    };

    /// The bytes the whole-slot spill covers, as a mask (bit k for byte k).
    pub fn spill_mask(&self) -> u8 {
        if self.spill.is_some() { 0xff } else { 0 }
    }

    /// Makes `v` the slot's whole spill (the taints are the locality rule's to set).
    pub fn set_spill(&mut self, v: Reg) {
        self.init = 0xff;
        self.spill = Some(v);
        self.narrow = [None; 2];
    }

    /// Ends the spills that overlap bytes `mask`.
    pub fn clobber(&mut self, mask: u8) {
        if mask & self.spill_mask() != 0 {
            self.spill = None;
        }
        for n in &mut self.narrow {
            if n.is_some_and(|n| n.mask() & mask != 0) {
                *n = None;
            }
        }
    }

    /// Stores the narrow spill `n` (its bytes become initialized; a spill they overlap ends).
    pub fn set_narrow(&mut self, n: Narrow) {
        self.clobber(n.mask());
        self.init |= n.mask();
        self.narrow[usize::from(n.at / 4) & 1] = Some(n);
    }

    /// The taint of what a read of bytes `mask` of this slot returns.
    pub fn taint_of(&self, mask: u8) -> Option<Taint> {
        let mut t = None;
        for k in 0..8 {
            if mask & (1 << k) != 0 {
                t = join(t, self.taint[k]);
            }
        }
        if mask & self.spill_mask() != 0 {
            t = join(t, self.spill.and_then(|r| r.taint));
        }
        t
    }

    /// The taint of what a read of the whole slot returns.
    pub fn read_taint(&self) -> Option<Taint> {
        self.taint_of(0xff)
    }

    /// Whether every byte untainted in `self` is untainted in `new` (more taint is less
    /// general).
    fn taints_cover(&self, new: &Slot) -> bool {
        (0..8).all(|k| self.taint[k].is_some() || new.taint[k].is_none())
    }
}

/// Code that runs only because of a branch on a rank-local value: from the branch at `branch`
/// (in call frame `frame`) until its immediate post-dominator `end` in the same frame
/// (`usize::MAX`: until the function returns). Every register or stack byte written there
/// may differ between ranks, and a tuner decision written there is rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Region {
    pub frame: u8,
    pub end: usize,
    pub branch: usize,
    pub taint: Taint,
}

pub const SLOTS: usize = 64;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    pub regs: [Reg; 11],
    /// Shared with the states stored before it was last written ([`crate::frames`]).
    pub stack: Stack,
    /// Where `exit` returns to in the caller (unused in frame 0).
    pub ret_pc: usize,
}

impl Frame {
    pub fn new(ret_pc: usize) -> Frame {
        let mut regs = [Reg::NOT_INIT; 11];
        regs[10] = Reg::pointer(RegType::Stack { frame: 0 }, 0);
        Frame {
            regs,
            stack: Stack::new(),
            ret_pc,
        }
    }
}

#[derive(Clone, Debug)]
pub struct State {
    /// Outermost first; each shared with the states stored before it was last written
    /// ([`crate::frames`]).
    pub frames: Frames,
    /// Open regions of code that depends on rank-local branches (tuner hooks only).
    pub regions: Vec<Region>,
    /// Branches taken so far (bounded), for messages.
    pub path: Vec<(usize, usize)>,
}

impl State {
    pub fn cur(&self) -> &Frame {
        self.frames.last().expect("at least one frame")
    }
    pub fn cur_mut(&mut self) -> &mut Frame {
        self.frames.last_mut().expect("at least one frame")
    }
    pub fn frame_no(&self) -> u8 {
        (self.frames.len() - 1) as u8
    }

    pub fn note_branch(&mut self, from: usize, to: usize) {
        if self.path.len() >= 24 {
            self.path.remove(0);
        }
        self.path.push((from, to));
    }

    /// Same machine state (ignoring the path).
    pub fn same_as(&self, o: &State) -> bool {
        self.frames == o.frames && self.regions == o.regions
    }

    /// The taint every value written now carries: that of the outermost open region.
    pub fn control(&self) -> Option<Taint> {
        self.regions.first().map(|r| r.taint)
    }

    /// Whether every region open in `new` is open in `self` too (more taint is more general).
    fn regions_cover(&self, new: &State) -> bool {
        new.regions.iter().all(|n| {
            self.regions
                .iter()
                .any(|o| (o.frame, o.end) == (n.frame, n.end))
        })
    }

    /// Whether `self`'s verified continuation covers `new`: on what `masks` (one per frame,
    /// from [`crate::liveness`]) say may still matter, every concrete state of `new` is one
    /// of `self`'s. Dead registers and slots are not compared; live scalars that are not
    /// precise only need to be scalars.
    pub fn subsumes(&self, new: &State, masks: &[FrameMask]) -> bool {
        if self.frames.len() != new.frames.len()
            || masks.len() != self.frames.len()
            || !self.regions_cover(new)
        {
            return false;
        }
        // Values first; ids (which link copies: bounds learnt on one apply to all, a NULL
        // check converts all) are checked after, for the ids that two compared positions of
        // the old state share.
        let mut pairs: Vec<(u32, u32)> = Vec::new();
        let mut reg_ok = |o: &Reg, n: &Reg, precise: bool| -> bool {
            if o.ty == RegType::NotInit {
                return true;
            }
            // A rank-local value where the proven state had an agreed one is not covered.
            if o.ty != n.ty || (o.taint.is_none() && n.taint.is_some()) {
                return false;
            }
            if o.ty == RegType::Scalar && !precise {
                return true;
            }
            if o.off != n.off || !o.v.contains(&n.v) {
                return false;
            }
            if o.id != 0 {
                pairs.push((o.id, n.id));
            }
            true
        };
        // Innermost frame first: that is where states at one point usually differ, so a
        // state that does not cover `new` is found out soonest there.
        for ((fo, fnew), m) in self.frames.iter().zip(new.frames.iter()).zip(masks).rev() {
            if fo.ret_pc != fnew.ret_pc {
                return false;
            }
            let mut live = m.live;
            while live != 0 {
                let r = live.trailing_zeros() as usize;
                live &= live - 1;
                if r < fo.regs.len() && !reg_ok(&fo.regs[r], &fnew.regs[r], m.prec & (1 << r) != 0)
                {
                    return false;
                }
            }
            let mut live = m.slots_live;
            while live != 0 {
                let k = live.trailing_zeros() as usize;
                live &= live - 1;
                let (o, n) = (&fo.stack[k], &fnew.stack[k]);
                // Per 4-byte half; a whole spill's value matters where either half's does.
                let half_prec = [
                    m.slots_prec & (1 << (2 * k)) != 0,
                    m.slots_prec & (1 << (2 * k + 1)) != 0,
                ];
                let precise = half_prec[0] || half_prec[1];
                if !o.taints_cover(n) {
                    return false;
                }
                for ((on, nn), &hp) in o.narrow.iter().zip(&n.narrow).zip(&half_prec) {
                    match (on, nn) {
                        (Some(a), Some(b)) if hp && !a.contains(b) => return false,
                        // A narrow spill whose value does not matter is plain bytes.
                        (Some(_), None) if hp => return false,
                        _ => {}
                    }
                }
                match (o.spill, n.spill) {
                    (Some(os), Some(ns)) => {
                        if !reg_ok(&os, &ns, precise) {
                            return false;
                        }
                    }
                    (Some(os), None) => {
                        // A spilled scalar whose value does not matter is eight plain bytes.
                        if os.ty != RegType::Scalar || precise || n.init != 0xff {
                            return false;
                        }
                    }
                    (None, ns) => {
                        if n.init & o.init != o.init {
                            return false;
                        }
                        if let Some(ns) = ns
                            && o.init != 0
                            && ns.ty != RegType::Scalar
                        {
                            return false;
                        }
                        if ns.is_some_and(|r| r.taint.is_some()) && o.read_taint().is_none() {
                            return false;
                        }
                    }
                }
            }
        }
        // An old id held by one compared position links nothing that matters; one held by
        // several must map to one new id everywhere.
        for (k, &(oid, nid)) in pairs.iter().enumerate() {
            let shared = pairs.iter().enumerate().any(|(j, p)| j != k && p.0 == oid);
            if !shared {
                continue;
            }
            if nid == 0 || pairs.iter().any(|p| p.0 == oid && p.1 != nid) {
                return false;
            }
        }
        true
    }

    /// One state standing exactly for both `self` and `o`, when they differ in a single
    /// scalar (register or spilled) whose two value sets are unsigned ranges that touch or
    /// overlap: their union is again such a range, so nothing is lost. (The join of two
    /// values that differ in more than one place would lose which combinations occur.)
    pub fn merge_exact(&self, o: &State) -> Option<State> {
        if self.frames.len() != o.frames.len() || self.regions != o.regions {
            return None;
        }
        let exact = |r: &Reg| {
            r.ty == RegType::Scalar && r.id == 0 && r.v == Scalar::urange(r.v.umin, r.v.umax)
        };
        let union = |a: &Reg, b: &Reg| -> Option<Reg> {
            if !exact(a) || !exact(b) || a.taint != b.taint {
                return None;
            }
            let (lo, hi) = if a.v.umin <= b.v.umin { (a, b) } else { (b, a) };
            if hi.v.umin > lo.v.umax.saturating_add(1) {
                return None;
            }
            Some(Reg {
                taint: a.taint,
                ..Reg::scalar(Scalar::urange(lo.v.umin, lo.v.umax.max(hi.v.umax)))
            })
        };
        let mut out = self.clone();
        let mut differs = false;
        for (k, (fa, fb)) in self.frames.iter().zip(&o.frames).enumerate() {
            if fa.ret_pc != fb.ret_pc {
                return None;
            }
            for r in 0..fa.regs.len() {
                if fa.regs[r] != fb.regs[r] {
                    if differs {
                        return None;
                    }
                    differs = true;
                    out.frames[k].regs[r] = union(&fa.regs[r], &fb.regs[r])?;
                }
            }
            for j in 0..SLOTS {
                let (sa, sb) = (fa.stack[j], fb.stack[j]);
                if sa != sb {
                    if differs {
                        return None;
                    }
                    differs = true;
                    let (Some(ra), Some(rb)) = (sa.spill, sb.spill) else {
                        return None;
                    };
                    if (sa.taint, sa.init, sa.narrow) != (sb.taint, sb.init, sb.narrow) {
                        return None;
                    }
                    out.frames[k].stack[j].spill = Some(union(&ra, &rb)?);
                }
            }
        }
        Some(out)
    }

    pub fn describe(&self, maps: &[MapInfo], hook: &Hook) -> String {
        let mut s = String::new();
        let f = self.cur();
        for (i, r) in f.regs.iter().enumerate() {
            if r.ty != RegType::NotInit && i != 10 {
                let _ = write!(s, "R{i}={} ", r.describe(maps, hook));
            }
        }
        let inited: Vec<String> = (0..SLOTS)
            .filter(|&k| f.stack[k].init != 0)
            .map(|k| {
                let off = -(SLOTS as i64 - k as i64) * 8;
                let slot = &f.stack[k];
                let mut text = match (slot.spill, slot.read_taint()) {
                    (Some(r), _) => format!("fp{off}={}", r.describe(maps, hook)),
                    (None, Some(t)) => {
                        format!("fp{off}=misc[rank-local: {}]", t.short(maps, hook))
                    }
                    (None, None) => format!("fp{off}=misc"),
                };
                for n in slot.narrow.iter().flatten() {
                    let _ = write!(
                        text,
                        " fp{}(u{})={}",
                        off + i64::from(n.at),
                        8 * u32::from(n.size),
                        scalar_text(&n.value())
                    );
                }
                text
            })
            .collect();
        if !inited.is_empty() {
            let _ = write!(s, "stack: {} ", inited.join(" "));
        }
        for r in &self.regions {
            let _ = write!(
                s,
                "under the rank-local branch at insn {} ({}) ",
                r.branch,
                r.taint.short(maps, hook)
            );
        }
        s.trim_end().to_string()
    }
}
