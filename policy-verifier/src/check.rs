//! The verifier proper: a structural pass, then depth-first exploration of every path over
//! abstract states, with pruning against states already proven safe.

use crate::error::{Reject, VerifyError};
use crate::platform::{self, Arg, Hook, Limits, MapInfo, Perm, Ret, STACK_SIZE};
use crate::scalar::Scalar;
use crate::state::{Frame, Reg, RegType, State};
use policy_object::insn::{self as op, Insn};
use std::collections::HashMap;

/// What verification measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub insns: usize,
    pub processed: usize,
    pub states: usize,
    pub pruned: usize,
    pub max_depth: usize,
}

type R<T> = Result<T, Reject>;

struct Node {
    parent: Option<usize>,
    branches: u32,
}

struct Explored {
    state: State,
    node: usize,
}

pub struct Checker<'a> {
    insns: &'a [Insn],
    hook: &'a Hook,
    maps: &'a [MapInfo],
    limits: Limits,
    prune_point: Vec<bool>,
    explored: HashMap<usize, Vec<Explored>>,
    nodes: Vec<Node>,
    next_id: u32,
    stats: Stats,
    /// Loop heads (back-edge targets), for classifying a budget overrun.
    loop_head: Vec<bool>,
}

enum Next {
    /// Continue at this instruction with the (updated) current state.
    Go(usize),
    /// Continue at this instruction with a refined state.
    GoWith(usize, State),
    /// Continue with `cont`; queue `other` for later.
    Branch {
        cont: (usize, State),
        other: (usize, State),
    },
    Done,
}

impl<'a> Checker<'a> {
    pub fn new(
        insns: &'a [Insn],
        hook: &'a Hook,
        maps: &'a [MapInfo],
        limits: Limits,
    ) -> Checker<'a> {
        Checker {
            insns,
            hook,
            maps,
            limits,
            prune_point: vec![false; insns.len() + 1],
            explored: HashMap::new(),
            nodes: Vec::new(),
            next_id: 1,
            stats: Stats {
                insns: insns.len(),
                ..Stats::default()
            },
            loop_head: vec![false; insns.len() + 1],
        }
    }

    fn err(&self, pc: usize, st: Option<&State>, reject: Reject) -> VerifyError {
        VerifyError {
            insn: pc,
            disasm: op::disasm(self.insns, pc),
            state: st.map(|s| s.describe(self.maps)).unwrap_or_default(),
            source: None,
            path: st.map(|s| s.path.clone()).unwrap_or_default(),
            processed: self.stats.processed,
            reject,
        }
    }

    // ------------------------------------------------------------ pass 1: structure

    fn structure(&mut self) -> Result<(), VerifyError> {
        let n = self.insns.len();
        if n == 0 {
            return Err(self.err(
                0,
                None,
                Reject::BadInsn {
                    what: "empty program".into(),
                },
            ));
        }
        if n > self.limits.max_insns {
            return Err(self.err(
                0,
                None,
                Reject::TooLarge {
                    insns: n,
                    limit: self.limits.max_insns,
                },
            ));
        }
        let mut second_half = vec![false; n];
        let mut pc = 0;
        while pc < n {
            let i = self.insns[pc];
            let bad = |what: &str| Reject::BadInsn {
                what: what.to_string(),
            };
            if i.dst > 10 || i.src > 10 {
                return Err(self.err(pc, None, bad("register number above r10")));
            }
            let v4 = || Reject::BadInsn {
                what:
                    "BPF v4 instruction (sign extension, gotol, bswap, sdiv): build with -mcpu=v3"
                        .into(),
            };
            match i.class() {
                op::ALU | op::ALU64 => {
                    let o = i.op();
                    if o > op::END || (o == op::END && i.class() == op::ALU64) {
                        return Err(self.err(
                            pc,
                            None,
                            if o == op::END {
                                v4()
                            } else {
                                bad("unknown ALU operation")
                            },
                        ));
                    }
                    if i.off != 0 {
                        return Err(self.err(pc, None, v4()));
                    }
                    if i.dst == 10 {
                        return Err(self.err(pc, None, bad("frame pointer r10 is read only")));
                    }
                    if o == op::END && ![16, 32, 64].contains(&i.imm) {
                        return Err(self.err(
                            pc,
                            None,
                            bad("byte swap width must be 16, 32 or 64"),
                        ));
                    }
                    if matches!(o, op::DIV | op::MOD) && !i.is_reg_src() && i.imm == 0 {
                        return Err(self.err(pc, None, Reject::DivByZero { reg: None }));
                    }
                    let bits = if i.class() == op::ALU64 { 64 } else { 32 };
                    if matches!(o, op::LSH | op::RSH | op::ARSH)
                        && !i.is_reg_src()
                        && !(0..bits).contains(&i.imm)
                    {
                        return Err(self.err(pc, None, bad("shift by an immediate out of range")));
                    }
                }
                op::LDX => {
                    if i.mode() != op::MEM {
                        return Err(self.err(
                            pc,
                            None,
                            if i.mode() == 0x80 {
                                v4()
                            } else {
                                bad("unsupported load mode")
                            },
                        ));
                    }
                    if i.dst == 10 {
                        return Err(self.err(pc, None, bad("frame pointer r10 is read only")));
                    }
                }
                op::ST => {
                    if i.mode() != op::MEM {
                        return Err(self.err(pc, None, bad("unsupported store mode")));
                    }
                }
                op::STX => match i.mode() {
                    op::MEM => {}
                    op::ATOMIC => {
                        if !matches!(i.size_bits(), op::W | op::DW) {
                            return Err(self.err(
                                pc,
                                None,
                                bad("atomic operations are 4 or 8 bytes"),
                            ));
                        }
                        let ok = [
                            op::ATOMIC_ADD,
                            op::ATOMIC_ADD | op::FETCH,
                            op::ATOMIC_OR,
                            op::ATOMIC_AND,
                            op::ATOMIC_XOR,
                            op::ATOMIC_XCHG,
                            op::ATOMIC_CMPXCHG,
                        ];
                        if !ok.contains(&i.imm) {
                            return Err(self.err(pc, None, bad("atomic operation not supported (fetch_and/or/xor: use the non-fetch form)")));
                        }
                    }
                    _ => return Err(self.err(pc, None, bad("unsupported store mode"))),
                },
                op::LD => {
                    if !i.is_lddw() {
                        return Err(self.err(
                            pc,
                            None,
                            bad("legacy packet loads are not supported"),
                        ));
                    }
                    if pc + 1 >= n
                        || self.insns[pc + 1].code != 0
                        || self.insns[pc + 1].dst != 0
                        || self.insns[pc + 1].src != 0
                    {
                        return Err(self.err(pc, None, bad("incomplete 64-bit immediate load")));
                    }
                    if i.dst == 10 {
                        return Err(self.err(pc, None, bad("frame pointer r10 is read only")));
                    }
                    match i.src {
                        0 => {}
                        op::PSEUDO_MAP_FD | op::PSEUDO_MAP_VALUE => {
                            let m = i64::from(i.imm);
                            if m < 0 || m as usize >= self.maps.len() {
                                return Err(self.err(pc, None, Reject::BadMapRef { index: m }));
                            }
                            if i.src == op::PSEUDO_MAP_VALUE && !self.maps[m as usize].global_data {
                                return Err(self.err(pc, None, bad("direct map value reference (lddw src 2) to a map that is not global data")));
                            }
                            if i.src == op::PSEUDO_MAP_VALUE {
                                let off = i64::from(self.insns[pc + 1].imm);
                                let vs = i64::from(self.maps[m as usize].value_size);
                                if !(0..vs).contains(&off) {
                                    return Err(self.err(
                                        pc,
                                        None,
                                        bad("map value offset outside the value"),
                                    ));
                                }
                            }
                        }
                        _ => {
                            return Err(self.err(
                                pc,
                                None,
                                bad("unsupported pseudo source in lddw"),
                            ));
                        }
                    }
                    second_half[pc + 1] = true;
                    pc += 2;
                    continue;
                }
                op::JMP | op::JMP32 => {
                    let o = i.op();
                    let jmp32 = i.class() == op::JMP32;
                    match o {
                        op::EXIT | op::CALL if jmp32 => {
                            return Err(self.err(pc, None, bad("call/exit in the JMP32 class")));
                        }
                        op::JA if jmp32 => return Err(self.err(pc, None, v4())),
                        op::EXIT => {}
                        op::CALL => {
                            if i.src == op::PSEUDO_CALL {
                                let t = pc as i64 + 1 + i64::from(i.imm);
                                self.check_target(pc, t)?;
                                self.prune_point[t as usize] = true;
                            } else if i.src != 0 {
                                return Err(self.err(pc, None, bad("unsupported call kind")));
                            }
                        }
                        op::JA
                        | op::JEQ
                        | op::JGT
                        | op::JGE
                        | op::JSET
                        | op::JNE
                        | op::JSGT
                        | op::JSGE
                        | op::JLT
                        | op::JLE
                        | op::JSLT
                        | op::JSLE => {
                            let t = pc as i64 + 1 + i64::from(i.off);
                            self.check_target(pc, t)?;
                            self.prune_point[t as usize] = true;
                            if t as usize <= pc {
                                self.loop_head[t as usize] = true;
                            }
                        }
                        _ => return Err(self.err(pc, None, bad("unknown jump operation"))),
                    }
                }
                _ => unreachable!("3-bit class"),
            }
            pc += 1;
        }
        for (pc, i) in self.insns.iter().enumerate() {
            let target = match (i.class(), i.op()) {
                (op::JMP, op::CALL) if i.src == op::PSEUDO_CALL => {
                    Some(pc as i64 + 1 + i64::from(i.imm))
                }
                (op::JMP | op::JMP32, o) if o != op::CALL && o != op::EXIT && !second_half[pc] => {
                    Some(pc as i64 + 1 + i64::from(i.off))
                }
                _ => None,
            };
            if let Some(t) = target
                && second_half[t as usize]
            {
                return Err(self.err(
                    pc,
                    None,
                    Reject::JumpIntoLddw {
                        target: t as usize - 1,
                    },
                ));
            }
        }
        Ok(())
    }

    fn check_target(&self, pc: usize, t: i64) -> Result<(), VerifyError> {
        if t < 0 || t as usize >= self.insns.len() {
            return Err(self.err(pc, None, Reject::JumpOutOfRange { target: t }));
        }
        Ok(())
    }

    // ------------------------------------------------------------ pass 2: exploration

    pub fn run(mut self) -> Result<Stats, VerifyError> {
        self.structure()?;
        let mut init = State {
            frames: vec![Frame::new(0)],
            path: vec![],
        };
        init.frames[0].regs[1] = Reg::pointer(RegType::Ctx, 0);
        self.nodes.push(Node {
            parent: None,
            branches: 1,
        });
        let mut work: Vec<(usize, State, usize)> = vec![(0, init, 0)];
        while let Some((mut pc, mut st, mut node)) = work.pop() {
            loop {
                if self.prune_point[pc] {
                    match self.visit(pc, &st, node) {
                        Visit::Prune => {
                            self.stats.pruned += 1;
                            self.finish(node);
                            break;
                        }
                        Visit::Infinite => {
                            return Err(self.err(
                                pc,
                                Some(&st),
                                Reject::UnboundedLoop {
                                    head: pc,
                                    processed: self.stats.processed,
                                },
                            ));
                        }
                        Visit::Continue(n) => node = n,
                    }
                }
                self.stats.processed += 1;
                if self.stats.processed > self.limits.max_processed {
                    let head = st.path.iter().rev().find(|(a, b)| b <= a).map(|(_, b)| *b);
                    return Err(match head {
                        Some(head) => self.err(
                            head,
                            Some(&st),
                            Reject::UnboundedLoop {
                                head,
                                processed: self.stats.processed,
                            },
                        ),
                        None => self.err(
                            pc,
                            Some(&st),
                            Reject::TooComplex {
                                processed: self.stats.processed,
                            },
                        ),
                    });
                }
                self.stats.max_depth = self.stats.max_depth.max(st.frames.len());
                match self.step(pc, &mut st) {
                    Ok(Next::Go(n)) => {
                        if n >= self.insns.len() {
                            return Err(self.err(pc, Some(&st), Reject::FallOffEnd));
                        }
                        pc = n;
                    }
                    Ok(Next::GoWith(n, s)) => {
                        st = s;
                        pc = n;
                    }
                    Ok(Next::Branch { cont, other }) => {
                        self.nodes[node].branches += 1;
                        work.push((other.0, other.1, node));
                        (pc, st) = cont;
                    }
                    Ok(Next::Done) => {
                        self.finish(node);
                        break;
                    }
                    Err(reject) => return Err(self.err(pc, Some(&st), reject)),
                }
            }
        }
        Ok(self.stats)
    }

    /// A path ended (exit or pruned): release its hold on the nodes above it.
    fn finish(&mut self, mut node: usize) {
        loop {
            let n = &mut self.nodes[node];
            n.branches -= 1;
            if n.branches > 0 {
                return;
            }
            match n.parent {
                Some(p) => node = p,
                None => return,
            }
        }
    }

    fn visit(&mut self, pc: usize, st: &State, node: usize) -> Visit {
        if let Some(list) = self.explored.get(&pc) {
            for e in list {
                let done = self.nodes[e.node].branches == 0;
                if done && e.state.subsumes(st) {
                    return Visit::Prune;
                }
                if !done && e.state.same_as(st) {
                    // The same state again on the current path: the loop never ends.
                    return Visit::Infinite;
                }
            }
        }
        // The path continues under a new node; the parent stays open until it finishes.
        let id = self.nodes.len();
        self.nodes.push(Node {
            parent: Some(node),
            branches: 1,
        });
        let list = self.explored.entry(pc).or_default();
        if list.len() >= self.limits.max_states_per_insn {
            list.remove(0);
        }
        list.push(Explored {
            state: st.clone(),
            node: id,
        });
        self.stats.states += 1;
        Visit::Continue(id)
    }

    // ------------------------------------------------------------ one instruction

    fn reg(&self, st: &State, r: u8) -> R<Reg> {
        let v = st.cur().regs[r as usize];
        if v.ty == RegType::NotInit {
            return Err(Reject::UninitRegister { reg: r });
        }
        Ok(v)
    }

    fn set(st: &mut State, r: u8, v: Reg) {
        st.cur_mut().regs[r as usize] = v;
    }

    fn fresh_id(&mut self) -> u32 {
        self.next_id += 1;
        self.next_id
    }

    fn step(&mut self, pc: usize, st: &mut State) -> R<Next> {
        let i = self.insns[pc];
        match i.class() {
            op::ALU | op::ALU64 => {
                self.alu(st, &i)?;
                Ok(Next::Go(pc + 1))
            }
            op::LD => {
                let r = match i.src {
                    op::PSEUDO_MAP_FD => Reg::pointer(RegType::MapPtr { map: i.imm as u16 }, 0),
                    op::PSEUDO_MAP_VALUE => Reg::pointer(
                        RegType::MapValue { map: i.imm as u16 },
                        i64::from(self.insns[pc + 1].imm),
                    ),
                    _ => {
                        let v = (u64::from(self.insns[pc + 1].imm as u32) << 32)
                            | u64::from(i.imm as u32);
                        Reg::konst(v)
                    }
                };
                Self::set(st, i.dst, r);
                Ok(Next::Go(pc + 2))
            }
            op::LDX => {
                let base = self.reg(st, i.src)?;
                let v = self.access(
                    st,
                    i.src,
                    base,
                    i64::from(i.off),
                    i.access_size() as u32,
                    Access::Read,
                )?;
                Self::set(st, i.dst, v);
                Ok(Next::Go(pc + 1))
            }
            op::ST => {
                let base = self.reg(st, i.dst)?;
                self.access(
                    st,
                    i.dst,
                    base,
                    i64::from(i.off),
                    i.access_size() as u32,
                    Access::Write(Reg::konst(i.imm as i64 as u64)),
                )?;
                Ok(Next::Go(pc + 1))
            }
            op::STX if i.mode() == op::MEM => {
                let base = self.reg(st, i.dst)?;
                let v = self.reg(st, i.src)?;
                if v.ty.is_pointer() && i.access_size() != 8 {
                    return Err(Reject::PointerLeak {
                        reg: i.src,
                        what: "partial store of a pointer".into(),
                    });
                }
                self.access(
                    st,
                    i.dst,
                    base,
                    i64::from(i.off),
                    i.access_size() as u32,
                    Access::Write(v),
                )?;
                Ok(Next::Go(pc + 1))
            }
            op::STX => {
                self.atomic(st, &i)?;
                Ok(Next::Go(pc + 1))
            }
            _ => self.jump(pc, st, &i),
        }
    }

    fn alu(&mut self, st: &mut State, i: &Insn) -> R<()> {
        let is64 = i.class() == op::ALU64;
        let o = i.op();
        let dst_reg = i.dst;
        let src = if i.is_reg_src() {
            self.reg(st, i.src)?
        } else if is64 {
            Reg::konst(i.imm as i64 as u64)
        } else {
            Reg::konst(u64::from(i.imm as u32))
        };
        if o == op::MOV {
            let mut v = src;
            if !is64 {
                if v.ty.is_pointer() {
                    return Err(Reject::PointerLeak {
                        reg: i.src,
                        what: "32-bit move of a pointer".into(),
                    });
                }
                v = Reg::scalar(v.v.trunc32());
            } else if i.is_reg_src() && v.ty == RegType::Scalar && v.v.const_value().is_none() {
                // Link the copies so that bounds learnt on one apply to the other.
                if v.id == 0 {
                    v.id = self.fresh_id();
                    Self::set(st, i.src, v);
                }
            }
            Self::set(st, dst_reg, v);
            return Ok(());
        }
        let dst = self.reg(st, dst_reg)?;
        if dst.ty.is_pointer() || src.ty.is_pointer() {
            let r = self.pointer_alu(i, dst, src, is64)?;
            Self::set(st, dst_reg, r);
            return Ok(());
        }
        // Byte swaps sit in the ALU class but read and write the whole register.
        let wide = is64 || o == op::END;
        let (a, b) = if wide {
            (dst.v, src.v)
        } else {
            (dst.v.trunc32(), src.v.trunc32())
        };
        let bits = if is64 { 64 } else { 32 };
        let shift = |b: &Scalar| b.const_value().map(|s| (s % bits) as u32);
        let r = match o {
            op::ADD => a.add(&b),
            op::SUB => a.sub(&b),
            op::MUL => a.mul(&b),
            op::AND => a.and(&b),
            op::OR => a.or(&b),
            op::XOR => a.xor(&b),
            op::DIV | op::MOD => {
                if b.may_be_zero() {
                    return Err(Reject::DivByZero {
                        reg: i.is_reg_src().then_some(i.src),
                    });
                }
                if o == op::DIV { a.udiv(&b) } else { a.umod(&b) }
            }
            op::LSH => shift(&b).map_or(Scalar::UNKNOWN, |s| a.lsh(s)),
            op::RSH => shift(&b).map_or(Scalar::UNKNOWN, |s| a.rsh(s)),
            op::ARSH => {
                if is64 {
                    shift(&b).map_or(Scalar::UNKNOWN, |s| a.arsh(s))
                } else {
                    match (a.const_value(), shift(&b)) {
                        (Some(x), Some(s)) => {
                            Scalar::konst(u64::from(((x as u32 as i32) >> s) as u32))
                        }
                        _ => Scalar::unknown32(),
                    }
                }
            }
            op::NEG => Scalar::konst(0).sub(&a),
            op::END => match (a.const_value(), i.is_reg_src()) {
                (Some(x), true) => Scalar::konst(match i.imm {
                    16 => u64::from((x as u16).swap_bytes()),
                    32 => u64::from((x as u32).swap_bytes()),
                    _ => x.swap_bytes(),
                }),
                (Some(x), false) => Scalar::konst(match i.imm {
                    16 => x & 0xffff,
                    32 => x & 0xffff_ffff,
                    _ => x,
                }),
                (None, _) => match i.imm {
                    16 => Scalar::urange(0, 0xffff),
                    32 => Scalar::unknown32(),
                    _ => Scalar::UNKNOWN,
                },
            },
            _ => {
                return Err(Reject::BadInsn {
                    what: "unknown ALU operation".into(),
                });
            }
        };
        let r = if wide { r } else { r.trunc32() };
        Self::set(st, dst_reg, Reg::scalar(r));
        Ok(())
    }

    fn pointer_alu(&self, i: &Insn, dst: Reg, src: Reg, is64: bool) -> R<Reg> {
        let o = i.op();
        let name = |r: &Reg| r.type_name();
        if !is64 {
            return Err(Reject::PointerArithmetic {
                reg: i.dst,
                what: "32-bit arithmetic on a pointer".into(),
            });
        }
        match (dst.ty.is_pointer(), src.ty.is_pointer()) {
            (true, true) => {
                if o == op::SUB
                    && dst.ty == src.ty
                    && matches!(dst.ty, RegType::Stack { .. } | RegType::MapValue { .. })
                {
                    // Distance between two pointers into the same region: a scalar.
                    let d = Scalar::konst((dst.off - src.off) as u64)
                        .add(&dst.v)
                        .sub(&src.v);
                    return Ok(Reg::scalar(d));
                }
                Err(Reject::PointerArithmetic {
                    reg: i.dst,
                    what: format!("{} {} {}", name(&dst), op_name(o), name(&src)),
                })
            }
            (false, true) => Err(Reject::PointerArithmetic {
                reg: i.src,
                what: format!(
                    "scalar {} {} (only pointer += scalar is allowed)",
                    op_name(o),
                    name(&src)
                ),
            }),
            (true, false) => {
                match dst.ty {
                    RegType::MapValueOrNull { .. } => {
                        return Err(Reject::PointerArithmetic {
                            reg: i.dst,
                            what: "on map_value_or_null: null-check it first".into(),
                        });
                    }
                    RegType::MapPtr { .. } => {
                        return Err(Reject::PointerArithmetic {
                            reg: i.dst,
                            what: "on a map pointer".into(),
                        });
                    }
                    _ => {}
                }
                if o != op::ADD && o != op::SUB {
                    return Err(Reject::PointerArithmetic {
                        reg: i.dst,
                        what: format!("{} on {}", op_name(o), name(&dst)),
                    });
                }
                let mut r = dst;
                if let Some(c) = src.v.const_value() {
                    let c = c as i64;
                    r.off = if o == op::ADD {
                        dst.off.checked_add(c)
                    } else {
                        dst.off.checked_sub(c)
                    }
                    .filter(|v| v.abs() < 1 << 29)
                    .ok_or(Reject::PointerArithmetic {
                        reg: i.dst,
                        what: "offset out of range".into(),
                    })?;
                } else {
                    if src.v.smin < -(1 << 29) || src.v.smax > 1 << 29 {
                        // An index with no proven bound: the access it feeds cannot be checked.
                        return Err(Reject::UnboundedAccess { reg: i.src });
                    }
                    r.v = if o == op::ADD {
                        dst.v.add(&src.v)
                    } else {
                        dst.v.sub(&src.v)
                    };
                }
                Ok(r)
            }
            (false, false) => unreachable!("checked by the caller"),
        }
    }

    /// Checks a load or store through `base` and returns the loaded value.
    fn access(
        &self,
        st: &mut State,
        breg: u8,
        base: Reg,
        off: i64,
        size: u32,
        acc: Access,
    ) -> R<Reg> {
        let write_val = match acc {
            Access::Write(v) => Some(v),
            Access::Read => None,
        };
        match base.ty {
            RegType::Ctx => {
                let Some(c) = base.v.const_value() else {
                    return Err(Reject::CtxVariableOffset { reg: breg });
                };
                let start = base.off + off + c as i64;
                let oob = Reject::CtxOutOfBounds {
                    reg: breg,
                    off: start,
                    size,
                    ctx_size: self.hook.ctx_size,
                };
                if start < 0 || start + i64::from(size) > i64::from(self.hook.ctx_size) {
                    return Err(oob);
                }
                let mut b = start as u32;
                while b < start as u32 + size {
                    let f = self.hook.field_at(b).ok_or(oob.clone())?;
                    if write_val.is_some() && f.perm == Perm::Read {
                        return Err(Reject::CtxReadOnly {
                            reg: breg,
                            field: f.name,
                            off: start,
                            size,
                        });
                    }
                    b = f.offset + f.size;
                }
                if let Some(v) = write_val {
                    if v.ty.is_pointer() {
                        return Err(Reject::PointerLeak {
                            reg: breg,
                            what: "pointer stored into the context".into(),
                        });
                    }
                    return Ok(Reg::NOT_INIT);
                }
                Ok(Reg::scalar(loaded(size)))
            }
            RegType::Stack { frame } => {
                self.stack_access(st, breg, frame, base, off, size, write_val)
            }
            RegType::MapValue { map } => {
                let m = &self.maps[map as usize];
                self.value_bounds(breg, m, base, off, size)?;
                if let Some(v) = write_val {
                    if m.read_only {
                        return Err(Reject::MapReadOnly {
                            reg: breg,
                            map: m.name.clone(),
                        });
                    }
                    if v.ty.is_pointer() {
                        return Err(Reject::PointerLeak {
                            reg: breg,
                            what: format!(
                                "pointer stored into map '{}' (maps are shared with other processes)",
                                m.name
                            ),
                        });
                    }
                    return Ok(Reg::NOT_INIT);
                }
                Ok(Reg::scalar(loaded(size)))
            }
            RegType::MapValueOrNull { .. } => Err(Reject::NullDeref { reg: breg }),
            // A lookup result on the path where it was found to be NULL.
            RegType::Scalar if base.v.const_value() == Some(0) => {
                Err(Reject::NullDeref { reg: breg })
            }
            _ => Err(Reject::InvalidMemAccess {
                reg: breg,
                ty: base.type_name().into(),
            }),
        }
    }

    fn value_bounds(&self, breg: u8, m: &MapInfo, base: Reg, off: i64, size: u32) -> R<()> {
        if base.v.smin < -(1 << 29) || base.v.umax > 1 << 29 {
            return Err(Reject::UnboundedAccess { reg: breg });
        }
        let lo = base.off + off + base.v.smin;
        let hi = base.off + off + base.v.umax as i64;
        if lo < 0 || hi + i64::from(size) > i64::from(m.value_size) {
            return Err(Reject::MapOutOfBounds {
                reg: breg,
                map: m.name.clone(),
                min_off: lo,
                max_off: hi,
                size,
                value_size: m.value_size,
            });
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn stack_access(
        &self,
        st: &mut State,
        breg: u8,
        frame: u8,
        base: Reg,
        off: i64,
        size: u32,
        write: Option<Reg>,
    ) -> R<Reg> {
        if base.v.smin < -(1 << 29) || base.v.smax > 1 << 29 {
            return Err(Reject::UnboundedAccess { reg: breg });
        }
        let lo = base.off + off + base.v.smin;
        let hi = base.off + off + base.v.smax;
        if lo < -STACK_SIZE || hi + i64::from(size) > 0 {
            return Err(Reject::StackOutOfBounds {
                reg: breg,
                min_off: lo,
                max_off: hi,
                size,
            });
        }
        if let Some(v) = write {
            if lo != hi {
                return Err(Reject::BadInsn {
                    what: "stack write at a variable offset is not supported".into(),
                });
            }
            if let RegType::Stack { frame: f } = v.ty
                && f > frame
            {
                return Err(Reject::PointerLeak {
                    reg: breg,
                    what: "pointer to a callee's stack stored in a caller's frame".into(),
                });
            }
            let stack = &mut st.frames[frame as usize].stack;
            let first = ((lo + STACK_SIZE) / 8) as usize;
            let last = ((lo + STACK_SIZE + i64::from(size) - 1) / 8) as usize;
            if size == 8 && (lo + STACK_SIZE) % 8 == 0 {
                stack[first] = crate::state::Slot {
                    init: 0xff,
                    spill: Some(v),
                };
            } else {
                for (k, slot) in stack.iter_mut().enumerate().take(last + 1).skip(first) {
                    let mut mask = 0u8;
                    for b in 0..8 {
                        let byte = k as i64 * 8 + b - STACK_SIZE;
                        if byte >= lo && byte < lo + i64::from(size) {
                            mask |= 1 << b;
                        }
                    }
                    // A partial overwrite turns a spilled register into plain bytes.
                    slot.spill = None;
                    slot.init |= mask;
                }
            }
            return Ok(Reg::NOT_INIT);
        }
        // Read: every byte of every possible offset must be initialized.
        let stack = &st.frames[frame as usize].stack;
        if lo == hi && size == 8 && (lo + STACK_SIZE) % 8 == 0 {
            let slot = stack[((lo + STACK_SIZE) / 8) as usize];
            if let Some(r) = slot.spill {
                return Ok(r);
            }
        }
        for byte in lo..hi + i64::from(size) {
            let k = ((byte + STACK_SIZE) / 8) as usize;
            let b = (byte + STACK_SIZE) % 8;
            let slot = &stack[k];
            if slot.init & (1 << b) == 0 {
                return Err(Reject::UninitStack {
                    reg: breg,
                    off: lo,
                    size,
                });
            }
            if let Some(r) = slot.spill
                && r.ty.is_pointer()
            {
                return Err(Reject::PointerLeak {
                    reg: breg,
                    what: "partial read of a spilled pointer".into(),
                });
            }
        }
        Ok(Reg::scalar(loaded(size)))
    }

    fn atomic(&mut self, st: &mut State, i: &Insn) -> R<()> {
        let base = self.reg(st, i.dst)?;
        let src = self.reg(st, i.src)?;
        let size = i.access_size() as u32;
        if src.ty.is_pointer() {
            return Err(Reject::PointerLeak {
                reg: i.src,
                what: "pointer used in an atomic operation".into(),
            });
        }
        if i.imm == op::ATOMIC_CMPXCHG {
            let r0 = self.reg(st, 0)?;
            if r0.ty.is_pointer() {
                return Err(Reject::PointerLeak {
                    reg: 0,
                    what: "pointer used in cmpxchg".into(),
                });
            }
        }
        // Atomics need natural alignment (map values and stack slots are 8-aligned).
        let fixed = base.off + i64::from(i.off);
        let var_bits = base.v.tn.value | base.v.tn.mask;
        if fixed % i64::from(size) != 0 || var_bits & (u64::from(size) - 1) != 0 {
            return Err(Reject::BadInsn {
                what: format!("misaligned {size}-byte atomic access (offset {fixed})"),
            });
        }
        match base.ty {
            RegType::MapValue { map } => {
                let m = &self.maps[map as usize];
                self.value_bounds(i.dst, m, base, i64::from(i.off), size)?;
                if m.read_only {
                    return Err(Reject::MapReadOnly {
                        reg: i.dst,
                        map: m.name.clone(),
                    });
                }
            }
            RegType::Stack { frame } => {
                self.stack_access(st, i.dst, frame, base, i64::from(i.off), size, None)?;
            }
            RegType::MapValueOrNull { .. } => return Err(Reject::NullDeref { reg: i.dst }),
            _ => {
                return Err(Reject::InvalidMemAccess {
                    reg: i.dst,
                    ty: format!(
                        "{} (atomics work on map values and the stack)",
                        base.type_name()
                    ),
                });
            }
        }
        let old = Reg::scalar(if size == 4 {
            Scalar::unknown32()
        } else {
            Scalar::UNKNOWN
        });
        if i.imm == op::ATOMIC_CMPXCHG {
            Self::set(st, 0, old);
        } else if i.imm & op::FETCH != 0 {
            Self::set(st, i.src, old);
        }
        Ok(())
    }

    fn jump(&mut self, pc: usize, st: &mut State, i: &Insn) -> R<Next> {
        match i.op() {
            op::JA => {
                let t = (pc as i64 + 1 + i64::from(i.off)) as usize;
                if t <= pc {
                    st.note_branch(pc, t);
                }
                Ok(Next::Go(t))
            }
            op::EXIT => {
                let r0 = self.reg(st, 0)?;
                if r0.ty.is_pointer() {
                    return Err(Reject::PointerLeak {
                        reg: 0,
                        what: format!("returning {}", r0.type_name()),
                    });
                }
                if st.frames.len() == 1 {
                    return Ok(Next::Done);
                }
                let f = st.frames.pop().expect("callee frame");
                let caller = st.cur_mut();
                for r in 1..=5 {
                    caller.regs[r] = Reg::NOT_INIT;
                }
                caller.regs[0] = r0;
                Ok(Next::Go(f.ret_pc))
            }
            op::CALL if i.src == op::PSEUDO_CALL => {
                if st.frames.len() >= self.limits.max_call_depth {
                    return Err(Reject::CallTooDeep {
                        depth: self.limits.max_call_depth,
                    });
                }
                let mut f = Frame::new(pc + 1);
                let frame_no = st.frames.len() as u8;
                f.regs[10] = Reg::pointer(RegType::Stack { frame: frame_no }, 0);
                for r in 1..=5 {
                    f.regs[r] = st.cur().regs[r];
                }
                st.frames.push(f);
                Ok(Next::Go((pc as i64 + 1 + i64::from(i.imm)) as usize))
            }
            op::CALL => {
                self.helper_call(st, i.imm)?;
                Ok(Next::Go(pc + 1))
            }
            _ => self.cond_jump(pc, st, i),
        }
    }

    fn helper_call(&mut self, st: &mut State, id: i32) -> R<()> {
        let h = platform::helper(id).ok_or(Reject::UnknownHelper { id })?;
        if !self.hook.helpers.contains(&id) {
            return Err(Reject::HelperNotAllowed {
                id,
                name: h.name,
                hook: self.hook.section.into(),
                note: self.hook.helper_note,
            });
        }
        let mut map: Option<u16> = None;
        for (k, arg) in h.args.iter().enumerate() {
            let r = (k + 1) as u8;
            let v = self.reg(st, r)?;
            let bad = |expected: &str| Reject::BadHelperArg {
                reg: r,
                helper: h.name,
                expected: expected.into(),
                got: v.type_name().into(),
            };
            match arg {
                Arg::Scalar => {
                    if v.ty != RegType::Scalar {
                        return Err(bad("scalar"));
                    }
                }
                Arg::MapPtr => match v.ty {
                    RegType::MapPtr { map: m } => map = Some(m),
                    _ => return Err(bad("map_ptr")),
                },
                Arg::MapKey | Arg::MapValue => {
                    let m = &self.maps[map.expect("map argument comes first") as usize];
                    let need = if *arg == Arg::MapKey {
                        m.key_size
                    } else {
                        m.value_size
                    };
                    match v.ty {
                        RegType::Stack { frame } => {
                            self.stack_access(st, r, frame, v, 0, need, None)?;
                        }
                        RegType::MapValue { map: vm } => {
                            let vmi = &self.maps[vm as usize];
                            self.value_bounds(r, vmi, v, 0, need)?;
                        }
                        RegType::MapValueOrNull { .. } => return Err(Reject::NullDeref { reg: r }),
                        _ => return Err(bad("fp or map_value")),
                    }
                }
            }
        }
        let ret = match h.ret {
            Ret::Scalar => Reg::scalar(Scalar::UNKNOWN),
            Ret::MapValueOrNull => Reg {
                ty: RegType::MapValueOrNull {
                    map: map.expect("lookup takes a map"),
                },
                off: 0,
                v: Scalar::konst(0),
                id: self.fresh_id(),
            },
        };
        let f = st.cur_mut();
        for r in 1..=5 {
            f.regs[r] = Reg::NOT_INIT;
        }
        f.regs[0] = ret;
        Ok(())
    }

    fn cond_jump(&mut self, pc: usize, st: &mut State, i: &Insn) -> R<Next> {
        let is32 = i.class() == op::JMP32;
        let target = (pc as i64 + 1 + i64::from(i.off)) as usize;
        let a = self.reg(st, i.dst)?;
        let b = if i.is_reg_src() {
            self.reg(st, i.src)?
        } else if is32 {
            Reg::konst(u64::from(i.imm as u32))
        } else {
            Reg::konst(i.imm as i64 as u64)
        };
        let o = i.op();
        // Pointer comparisons: NULL checks, and comparisons of pointers of one kind.
        if a.ty.is_pointer() || b.ty.is_pointer() {
            let zero = |r: &Reg| r.ty == RegType::Scalar && r.v.const_value() == Some(0);
            let (ptr, preg) = if a.ty.is_pointer() {
                (a, i.dst)
            } else {
                (b, i.src)
            };
            let other = if a.ty.is_pointer() { b } else { a };
            if is32 {
                return Err(Reject::PointerArithmetic {
                    reg: preg,
                    what: "32-bit comparison of a pointer".into(),
                });
            }
            if zero(&other) && matches!(o, op::JEQ | op::JNE) {
                if let RegType::MapValueOrNull { map } = ptr.ty {
                    let mut null = st.clone();
                    let mut nonnull = st.clone();
                    mark_ptr(&mut null, ptr.id, None);
                    mark_ptr(&mut nonnull, ptr.id, Some(map));
                    let (taken, fall) = if o == op::JEQ {
                        (null, nonnull)
                    } else {
                        (nonnull, null)
                    };
                    return Ok(self.both(pc, target, taken, fall));
                }
                // A pointer that is never NULL.
                let t = o == op::JNE;
                return Ok(self.decided(pc, st, target, t));
            }
            if a.ty.is_pointer() && b.ty.is_pointer() && a.ty == b.ty {
                return Ok(self.both(pc, target, st.clone(), st.clone()));
            }
            return Err(Reject::PointerArithmetic {
                reg: preg,
                what: format!("comparison of {} with {}", a.type_name(), b.type_name()),
            });
        }
        let (av, bv) = if is32 {
            (a.v.trunc32(), b.v.trunc32())
        } else {
            (a.v, b.v)
        };
        let exact32 = !is32 || (a.v.umax <= u32::MAX as u64 && b.v.umax <= u32::MAX as u64);
        if let Some(t) = decide(o, &av, &bv, is32) {
            return Ok(self.decided(pc, st, target, t));
        }
        let mut taken = st.clone();
        let mut fall = st.clone();
        if exact32 {
            let signed_ok = !is32 || (av.umax <= i32::MAX as u64 && bv.umax <= i32::MAX as u64);
            let refine_ok = signed_ok || !matches!(o, op::JSGT | op::JSGE | op::JSLT | op::JSLE);
            if refine_ok {
                let (ta, tb) = refine(o, &av, &bv, true);
                let (fa, fb) = refine(o, &av, &bv, false);
                let src_reg = i.is_reg_src().then_some(i.src);
                let t_ok = apply(&mut taken, i.dst, a, ta, src_reg, b, tb);
                let f_ok = apply(&mut fall, i.dst, a, fa, src_reg, b, fb);
                return Ok(match (t_ok, f_ok) {
                    (true, true) => self.both(pc, target, taken, fall),
                    (true, false) => self.decided_with(pc, taken, target, true),
                    (false, true) => self.decided_with(pc, fall, target, false),
                    (false, false) => Next::Done,
                });
            }
        }
        Ok(self.both(pc, target, taken, fall))
    }

    fn decided(&self, pc: usize, st: &mut State, target: usize, taken: bool) -> Next {
        if taken {
            st.note_branch(pc, target);
            Next::Go(target)
        } else {
            Next::Go(pc + 1)
        }
    }

    fn decided_with(&self, pc: usize, mut st: State, target: usize, taken: bool) -> Next {
        if taken {
            st.note_branch(pc, target);
            Next::GoWith(target, st)
        } else {
            Next::GoWith(pc + 1, st)
        }
    }

    /// Both edges are feasible: follow the fall-through now, the jump later.
    fn both(&self, pc: usize, target: usize, mut taken: State, fall: State) -> Next {
        taken.note_branch(pc, target);
        Next::Branch {
            cont: (pc + 1, fall),
            other: (target, taken),
        }
    }
}

enum Visit {
    Prune,
    Infinite,
    Continue(usize),
}

enum Access {
    Read,
    Write(Reg),
}

fn op_name(o: u8) -> &'static str {
    match o {
        op::ADD => "+",
        op::SUB => "-",
        op::MUL => "*",
        op::DIV => "/",
        op::OR => "|",
        op::AND => "&",
        op::LSH => "<<",
        op::RSH => ">>",
        op::NEG => "neg",
        op::MOD => "%",
        op::XOR => "^",
        op::ARSH => "s>>",
        op::END => "bswap",
        _ => "?",
    }
}

/// The value a load of `size` bytes produces.
fn loaded(size: u32) -> Scalar {
    match size {
        1 => Scalar::urange(0, 0xff),
        2 => Scalar::urange(0, 0xffff),
        4 => Scalar::unknown32(),
        _ => Scalar::UNKNOWN,
    }
}

/// Turns every copy of lookup result `id` into a map value (`Some(map)`) or the scalar 0.
fn mark_ptr(st: &mut State, id: u32, map: Option<u16>) {
    let conv = |r: &mut Reg| {
        if matches!(r.ty, RegType::MapValueOrNull { .. }) && r.id == id {
            *r = match map {
                Some(m) => Reg {
                    ty: RegType::MapValue { map: m },
                    off: r.off,
                    v: r.v,
                    id: 0,
                },
                None => Reg::konst(0),
            };
        }
    };
    for f in st.frames.iter_mut() {
        f.regs.iter_mut().for_each(conv);
        for s in f.stack.iter_mut() {
            if let Some(r) = s.spill.as_mut() {
                conv(r);
            }
        }
    }
}

/// Whether a comparison is decided by the abstract values: `Some(taken)`.
fn decide(o: u8, a: &Scalar, b: &Scalar, is32: bool) -> Option<bool> {
    let (asmin, asmax, bsmin, bsmax) = if is32 {
        // Signed 32-bit views are only known when the values fit.
        let fit = |s: &Scalar| s.umax <= i32::MAX as u64;
        if fit(a) && fit(b) {
            (a.umin as i64, a.umax as i64, b.umin as i64, b.umax as i64)
        } else if let (Some(x), Some(y)) = (a.const_value(), b.const_value()) {
            let (x, y) = (i64::from(x as u32 as i32), i64::from(y as u32 as i32));
            (x, x, y, y)
        } else {
            (i64::MIN, i64::MAX, i64::MIN, i64::MAX)
        }
    } else {
        (a.smin, a.smax, b.smin, b.smax)
    };
    let unknown_signed = is32 && asmin == i64::MIN && asmax == i64::MAX;
    match o {
        op::JEQ | op::JNE => {
            let eq = if let (Some(x), Some(y)) = (a.const_value(), b.const_value()) {
                Some(x == y)
            } else if a.umax < b.umin
                || b.umax < a.umin
                || a.smax < b.smin
                || b.smax < a.smin
                || (a.tn.value ^ b.tn.value) & !(a.tn.mask | b.tn.mask) != 0
            {
                // Disjoint ranges, or a known bit that differs.
                Some(false)
            } else {
                None
            };
            eq.map(|e| if o == op::JEQ { e } else { !e })
        }
        op::JGT => cmp(a.umin > b.umax, a.umax <= b.umin),
        op::JGE => cmp(a.umin >= b.umax, a.umax < b.umin),
        op::JLT => cmp(a.umax < b.umin, a.umin >= b.umax),
        op::JLE => cmp(a.umax <= b.umin, a.umin > b.umax),
        op::JSGT if !unknown_signed => cmp(asmin > bsmax, asmax <= bsmin),
        op::JSGE if !unknown_signed => cmp(asmin >= bsmax, asmax < bsmin),
        op::JSLT if !unknown_signed => cmp(asmax < bsmin, asmin >= bsmax),
        op::JSLE if !unknown_signed => cmp(asmax <= bsmin, asmin > bsmax),
        op::JSET => {
            let b = b.const_value()?;
            if a.tn.value & b != 0 {
                Some(true)
            } else if (a.tn.value | a.tn.mask) & b == 0 {
                Some(false)
            } else {
                None
            }
        }
        _ => None,
    }
}

fn cmp(always: bool, never: bool) -> Option<bool> {
    if always {
        Some(true)
    } else if never {
        Some(false)
    } else {
        None
    }
}

/// The operands' values on one edge of a comparison (`taken` or not).
fn refine(o: u8, a: &Scalar, b: &Scalar, taken: bool) -> (Scalar, Scalar) {
    let (mut a, mut b) = (*a, *b);
    // Normalize to one of: eq, ne, ugt, uge, sgt, sge, set, nset, with swapped operands.
    let (kind, swap) = match (o, taken) {
        (op::JEQ, true) | (op::JNE, false) => ("eq", false),
        (op::JEQ, false) | (op::JNE, true) => ("ne", false),
        (op::JGT, true) | (op::JLE, false) => ("ugt", false),
        (op::JGE, true) | (op::JLT, false) => ("uge", false),
        (op::JLT, true) | (op::JGE, false) => ("ugt", true),
        (op::JLE, true) | (op::JGT, false) => ("uge", true),
        (op::JSGT, true) | (op::JSLE, false) => ("sgt", false),
        (op::JSGE, true) | (op::JSLT, false) => ("sge", false),
        (op::JSLT, true) | (op::JSGE, false) => ("sgt", true),
        (op::JSLE, true) | (op::JSGT, false) => ("sge", true),
        (op::JSET, true) => ("set", false),
        (op::JSET, false) => ("nset", false),
        _ => return (a, b),
    };
    let (x, y) = if swap {
        (&mut b, &mut a)
    } else {
        (&mut a, &mut b)
    };
    match kind {
        "eq" => {
            let tn = x.tn.intersect(y.tn);
            let m = Scalar {
                tn,
                umin: x.umin.max(y.umin),
                umax: x.umax.min(y.umax),
                smin: x.smin.max(y.smin),
                smax: x.smax.min(y.smax),
            };
            let m = if (x.tn.value ^ y.tn.value) & !(x.tn.mask | y.tn.mask) != 0 {
                invalid()
            } else {
                m.synced()
            };
            *x = m;
            *y = m;
        }
        "ne" => {
            let (xv, yv) = (*x, *y);
            *x = exclude(xv, yv.const_value());
            *y = exclude(yv, xv.const_value());
        }
        "ugt" => {
            // x > y
            if y.umin == u64::MAX {
                *x = invalid();
            } else {
                x.umin = x.umin.max(y.umin + 1);
            }
            if x.umax == 0 {
                *y = invalid();
            } else {
                y.umax = y.umax.min(x.umax - 1);
            }
        }
        "uge" => {
            x.umin = x.umin.max(y.umin);
            y.umax = y.umax.min(x.umax);
        }
        "sgt" => {
            if y.smin == i64::MAX {
                *x = invalid();
            } else {
                x.smin = x.smin.max(y.smin + 1);
            }
            if x.smax == i64::MIN {
                *y = invalid();
            } else {
                y.smax = y.smax.min(x.smax - 1);
            }
        }
        "sge" => {
            x.smin = x.smin.max(y.smin);
            y.smax = y.smax.min(x.smax);
        }
        "set" => {
            if let Some(c) = y.const_value()
                && c.is_power_of_two()
            {
                x.tn.value |= c;
                x.tn.mask &= !c;
            }
        }
        "nset" => {
            if let Some(c) = y.const_value() {
                x.tn.value &= !c;
                x.tn.mask &= !c;
            }
        }
        _ => {}
    }
    let fix = |s: &Scalar| if s.is_valid() { s.synced() } else { *s };
    (fix(&a), fix(&b))
}

/// `p` without the value `c` (only its ends can move).
fn exclude(mut p: Scalar, c: Option<u64>) -> Scalar {
    let Some(c) = c else { return p };
    if p.umin == c {
        if c == u64::MAX {
            return invalid();
        }
        p.umin = c + 1;
    }
    if p.umax == c {
        if c == 0 {
            return invalid();
        }
        p.umax = c - 1;
    }
    if p.smin == c as i64 && p.smin < i64::MAX {
        p.smin += 1;
    }
    if p.smax == c as i64 && p.smax > i64::MIN {
        p.smax -= 1;
    }
    if p.is_valid() { p.synced() } else { p }
}

fn invalid() -> Scalar {
    Scalar {
        umin: 1,
        umax: 0,
        ..Scalar::UNKNOWN
    }
}

/// Writes refined values into the state (and into every linked copy). False if infeasible.
fn apply(
    st: &mut State,
    dreg: u8,
    a: Reg,
    av: Scalar,
    sreg: Option<u8>,
    b: Reg,
    bv: Scalar,
) -> bool {
    if !av.is_valid() || !bv.is_valid() {
        return false;
    }
    let mut set = |reg: u8, old: Reg, v: Scalar| {
        let f = st.cur_mut();
        let new = Reg { v, ..old };
        f.regs[reg as usize] = new;
        if old.id != 0 {
            for fr in st.frames.iter_mut() {
                for r in fr.regs.iter_mut() {
                    if r.ty == RegType::Scalar && r.id == old.id {
                        r.v = v;
                    }
                }
                for s in fr.stack.iter_mut() {
                    if let Some(r) = s.spill.as_mut()
                        && r.ty == RegType::Scalar
                        && r.id == old.id
                    {
                        r.v = v;
                    }
                }
            }
        }
    };
    // 32-bit comparisons refine only when values fit (checked by the caller), so the refined
    // 32-bit value is the 64-bit value.
    set(dreg, a, av);
    if let Some(s) = sreg {
        set(s, b, bv);
    }
    true
}
