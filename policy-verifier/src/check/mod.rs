//! The verifier proper: a structural pass ([`structure`]), then depth-first exploration of
//! every path over abstract states, with pruning against states already proven safe. One
//! instruction's effect lives with its concern: [`alu`] (scalar arithmetic and pointer
//! offsets), [`mem`] (context, stack, map values, atomics), [`calls`] (helpers, BPF-to-BPF
//! calls, exit), [`branch`] (conditional jumps and what each edge learns); beside them,
//! [`locality`] keeps tuner decisions free of rank-local values
//! (with [`region`]: what a rank-local region's code may write).

mod alu;
mod branch;
mod calls;
mod locality;
mod mem;
mod region;
pub mod structure;

use crate::budget::{Exceeded, Ledger};
use crate::error::{Reject, VerifyError};
use crate::frames::Frames;
use crate::liveness::Liveness;
use crate::platform::{Hook, Limits, MapInfo};
use crate::state::{Frame, Reg, RegType, State};
use policy_object::insn::{self as op, Insn};
use std::collections::HashMap;
use structure::Layout;

/// What verification measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub insns: usize,
    pub processed: usize,
    pub states: usize,
    pub pruned: usize,
    pub max_depth: usize,
    /// The context bytes some load may read, one bit per 4-byte unit: bit `i` for bytes
    /// `4i..4i + 4` (units from 127 on share bit 127). A runtime may skip filling fields no
    /// program reads ([`Stats::reads_ctx`]).
    pub ctx_read: u128,
    /// The most states held at once (stored at pruning points or waiting to be explored),
    /// and the most bytes they took ([`crate::budget`]).
    pub peak_states: usize,
    pub peak_bytes: usize,
    /// Units of work ([`crate::Limits::max_work`]).
    pub work: u64,
}

impl Stats {
    /// Whether some load of the program may read a byte of `offset..offset + len` of its
    /// context.
    #[inline]
    pub fn reads_ctx(&self, offset: u32, len: u32) -> bool {
        let lo = (offset / 4).min(127);
        let hi = offset.saturating_add(len).div_ceil(4).clamp(lo + 1, 128);
        let mask = (u128::MAX >> (128 - (hi - lo))) << lo;
        len > 0 && self.ctx_read & mask != 0
    }
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
    layout: Layout,
    liveness: Option<Liveness>,
    /// Immediate post-dominators, for the locality rule (hooks that decide only).
    ipdom: Vec<usize>,
    explored: HashMap<usize, Vec<Explored>>,
    nodes: Vec<Node>,
    next_id: u32,
    stats: Stats,
    /// [`Stats::ctx_read`], gathered by the (shared-borrow) memory checks.
    ctx_read: std::cell::Cell<u128>,
    /// The states held and their bytes.
    ledger: Ledger,
    started: std::time::Instant,
}

/// The fixed part of one comparison of a state against a stored one, in work units (one
/// unit: one processed instruction, or one register or slot compared). Calibrated on the
/// state-explosion generator (tests/explode): a comparison that looks at a handful of
/// registers takes about as long as 64 registers' worth.
const COMPARE_UNITS: u64 = 64;

/// What a state takes in the work stack and in a pruning point's list.
const WORK_ITEM: usize = size_of::<(usize, State, usize)>();
const EXPLORED_ITEM: usize = size_of::<Explored>();

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

enum Visit {
    Prune,
    Infinite,
    Continue(usize),
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
            layout: Layout::default(),
            liveness: None,
            ipdom: Vec::new(),
            explored: HashMap::new(),
            nodes: Vec::new(),
            next_id: 1,
            stats: Stats {
                insns: insns.len(),
                ..Stats::default()
            },
            ctx_read: std::cell::Cell::new(0),
            ledger: Ledger::default(),
            started: std::time::Instant::now(),
        }
    }

    fn err(&self, pc: usize, st: Option<&State>, reject: Reject) -> VerifyError {
        VerifyError {
            insn: pc,
            disasm: op::disasm(self.insns, pc),
            state: st
                .map(|s| s.describe(self.maps, self.hook))
                .unwrap_or_default(),
            source: None,
            path: st.map(|s| s.path.clone()).unwrap_or_default(),
            processed: self.stats.processed,
            reject,
        }
    }

    pub fn run(mut self) -> Result<Stats, VerifyError> {
        self.structure()?;
        self.liveness = Some(Liveness::compute(self.insns, &self.layout));
        let decides = self.hook.decides;
        if decides {
            self.ipdom = locality::post_dominators(
                self.insns,
                &self.layout.subprog_of,
                &self.layout.second_half,
            );
        }
        let mut init = State {
            frames: Frames::new(Frame::new(0)),
            regions: vec![],
            path: vec![],
        };
        init.frames[0].regs[1] = Reg::pointer(RegType::Ctx, 0);
        self.nodes.push(Node {
            parent: None,
            branches: 1,
        });
        self.ledger.hold(&init, WORK_ITEM);
        let mut work: Vec<(usize, State, usize)> = vec![(0, init, 0)];
        while let Some((mut pc, mut st, mut node)) = work.pop() {
            self.ledger.release(&st, WORK_ITEM);
            loop {
                if decides {
                    Self::close_regions(pc, &mut st);
                }
                if self.layout.prune_point[pc] {
                    let visit = self.visit(pc, &st, node);
                    // The comparisons are work too, also when they end the path.
                    if let Err(x) = self.spent() {
                        return Err(self.over_budget(pc, &st, x));
                    }
                    match visit {
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
                                    exceeded: None,
                                },
                            ));
                        }
                        Visit::Continue(n) => node = n,
                    }
                    if let Err(x) = self.held() {
                        return Err(self.over_budget(pc, &st, x));
                    }
                }
                self.stats.processed += 1;
                self.stats.work += 1;
                if let Err(x) = self.spent() {
                    return Err(self.over_budget(pc, &st, x));
                }
                if self.stats.processed > self.limits.max_processed {
                    let limit = self.limits.max_processed;
                    return Err(self.over_budget(pc, &st, Exceeded::Processed { limit }));
                }
                self.stats.max_depth = self.stats.max_depth.max(st.frames.len());
                let flow = match decides.then(|| self.flow(pc, &st)).transpose() {
                    Ok(flow) => flow,
                    Err(reject) => return Err(self.err(pc, Some(&st), reject)),
                };
                let depth = st.frames.len();
                let mut next = match self.step(pc, &mut st) {
                    Ok(next) => next,
                    Err(reject) => return Err(self.err(pc, Some(&st), reject)),
                };
                if let Some(flow) = &flow {
                    self.apply_flow(pc, depth, flow, &mut next, &mut st);
                }
                // The structure pass makes every subprogram end in exit or a jump; this is
                // the guard that keeps a mistake there from indexing past the program.
                let in_range = |n: usize| n < self.insns.len();
                match next {
                    Next::Go(n) if in_range(n) => pc = n,
                    Next::GoWith(n, s) if in_range(n) => {
                        st = s;
                        pc = n;
                    }
                    Next::Branch { cont, other } if in_range(cont.0) && in_range(other.0) => {
                        self.nodes[node].branches += 1;
                        self.ledger.hold(&other.1, WORK_ITEM);
                        work.push((other.0, other.1, node));
                        (pc, st) = cont;
                        if let Err(x) = self.held() {
                            return Err(self.over_budget(pc, &st, x));
                        }
                    }
                    Next::Done => {
                        self.finish(node);
                        break;
                    }
                    _ => return Err(self.err(pc, Some(&st), Reject::FallOffEnd)),
                }
            }
        }
        self.stats.ctx_read = self.ctx_read.get();
        Ok(self.stats)
    }

    /// Whether the states held are within the budget (counted at their peak).
    fn held(&mut self) -> Result<(), Exceeded> {
        let held = self.ledger.states;
        let bytes = self.ledger.bytes() + self.nodes.capacity() * size_of::<Node>();
        self.stats.peak_states = self.stats.peak_states.max(held);
        self.stats.peak_bytes = self.stats.peak_bytes.max(bytes);
        let exceeded = if held > self.limits.max_states {
            Exceeded::States {
                held,
                limit: self.limits.max_states,
            }
        } else if bytes > self.limits.max_state_bytes {
            Exceeded::Memory {
                bytes,
                limit: self.limits.max_state_bytes,
            }
        } else {
            return Ok(());
        };
        Err(exceeded)
    }

    /// Whether the work and the time are within the budget (the clock read every 256
    /// processed instructions).
    fn spent(&self) -> Result<(), Exceeded> {
        let exceeded = if self.stats.work > self.limits.max_work {
            Exceeded::Work {
                limit: self.limits.max_work,
            }
        } else if self.stats.processed.is_multiple_of(256)
            && self.started.elapsed() > self.limits.max_time
        {
            Exceeded::Time {
                ms: self.started.elapsed().as_millis() as u64,
                limit_ms: self.limits.max_time.as_millis() as u64,
            }
        } else {
            return Ok(());
        };
        Err(exceeded)
    }

    /// The rejection for a budget that ran out at `pc`: the loop the path was last in is not
    /// provably bounded, or, outside loops, the program is too complex.
    fn over_budget(&self, pc: usize, st: &State, exceeded: Exceeded) -> VerifyError {
        let processed = self.stats.processed;
        match st.path.iter().rev().find(|(a, b)| b <= a).map(|(_, b)| *b) {
            Some(head) => self.err(
                head,
                Some(st),
                Reject::UnboundedLoop {
                    head,
                    processed,
                    exceeded: Some(exceeded),
                },
            ),
            None => self.err(
                pc,
                Some(st),
                Reject::TooComplex {
                    exceeded,
                    processed,
                },
            ),
        }
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
            let masks = self
                .liveness
                .as_ref()
                .expect("computed before exploration")
                .masks(pc, &st.frames);
            // A comparison costs a fixed part and may look at every register and slot the
            // masks name (crate::budget's work units).
            let cost = COMPARE_UNITS
                + masks
                    .iter()
                    .map(|m| u64::from(m.live.count_ones() + m.slots_live.count_ones()))
                    .sum::<u64>();
            for e in list {
                self.stats.work += cost;
                let done = self.nodes[e.node].branches == 0;
                if done && e.state.subsumes(st, &masks) {
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
            let old = list.remove(0);
            self.ledger.release(&old.state, EXPLORED_ITEM);
        }
        let state = st.clone();
        self.ledger.hold(&state, EXPLORED_ITEM);
        list.push(Explored { state, node: id });
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
                self.lddw(st, pc, &i);
                Ok(Next::Go(pc + 2))
            }
            op::LDX => {
                self.load(st, &i)?;
                Ok(Next::Go(pc + 1))
            }
            op::ST | op::STX if i.mode() == op::MEM => {
                self.store(st, &i)?;
                Ok(Next::Go(pc + 1))
            }
            op::STX => {
                self.atomic(st, &i)?;
                Ok(Next::Go(pc + 1))
            }
            _ => self.jump(pc, st, &i),
        }
    }

    fn jump(&mut self, pc: usize, st: &mut State, i: &Insn) -> R<Next> {
        match i.op() {
            op::JA => {
                let t = structure::jump_target(i, pc).expect("ja has a target") as usize;
                if t <= pc {
                    st.note_branch(pc, t);
                }
                Ok(Next::Go(t))
            }
            op::EXIT => self.exit(st),
            op::CALL if structure::is_pseudo_call(i) => self.call(pc, st, i),
            op::CALL => {
                self.helper_call(st, i.imm)?;
                Ok(Next::Go(pc + 1))
            }
            _ => self.cond_jump(pc, st, i),
        }
    }
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
        op::MOV => "mov",
        _ => "?",
    }
}
