//! The verifier's budget: how much work and memory one verification may take.
//!
//! Every rank of a node verifies its policies when its plugin starts, so one object must not
//! be able to run a node out of memory or hold up its start. Exploration stops, and the
//! program is rejected as `too_complex` naming the limit ([`Exceeded`]), at the first of
//! ([`crate::Limits`], defaults in brackets):
//!
//! * **processed** \[1,000,000\]: instructions processed over all paths (the kernel's limit);
//! * **states** \[65,536\]: abstract states held at once, stored at pruning points or waiting
//!   on the stack of unexplored branches; each pruning point keeps its 64 latest;
//! * **memory** \[64 MiB\]: the bytes of those states ([`Ledger`]: a frame or a piece of a
//!   stack that several states share is counted once), with the exploration's own
//!   bookkeeping. The largest shipped policy holds 14 MiB at its peak (`rules`, clang-19
//!   build; `net_autotune_epoch`, 1,359 instructions, 13 MiB); the generator's programs stop
//!   with at most 70 MiB resident above what the process held before;
//! * **work** \[500,000,000\]: a deterministic measure of time: one unit per processed
//!   instruction, and per comparison of a state against a stored one, 64 (its fixed cost: the
//!   stored state is a cache miss away) plus the registers and slots the comparison may have
//!   to look at. The programs of the state-explosion generator (tests/explode) take 0.4 to
//!   4.4 ns a unit on the machine of BENCHMARKS.md (release build): 500M units is 0.2 to
//!   2.2 s of CPU. A smaller budget would come close to the largest shipped policy, which
//!   takes 182M units (`rules`, clang-19 build) in 0.12 s: its comparisons hit
//!   the cache, an adversary's miss it, which no count of work sees;
//! * **time** \[5 s\]: wall-clock, checked every 256 processed instructions: only a backstop.
//!   A verdict that depends on time may differ between two ranks (one loaded, one not), and
//!   ranks that disagree about a policy may disagree about a decision; the work budget is
//!   set so that every program stops on it well before.

use crate::frames::{CHUNK, Frames, Held};
use crate::state::{Frame, Region, Slot, State};
use std::fmt;

/// Which limit of the budget a program ran into, with the figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exceeded {
    Processed { limit: usize },
    States { held: usize, limit: usize },
    Memory { bytes: usize, limit: usize },
    Work { limit: u64 },
    Time { ms: u64, limit_ms: u64 },
}

impl Exceeded {
    /// The limit's short name (`ncclbpf verify --json` reports it).
    pub fn name(&self) -> &'static str {
        match self {
            Exceeded::Processed { .. } => "processed",
            Exceeded::States { .. } => "states",
            Exceeded::Memory { .. } => "memory",
            Exceeded::Work { .. } => "work",
            Exceeded::Time { .. } => "time",
        }
    }
}

fn mib(b: usize) -> String {
    format!("{:.1} MiB", b as f64 / f64::from(1 << 20))
}

impl fmt::Display for Exceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Exceeded::Processed { limit } => {
                write!(f, "more than {limit} instructions processed over all paths")
            }
            Exceeded::States { held, limit } => {
                write!(f, "{held} verifier states held at once (limit {limit})")
            }
            Exceeded::Memory { bytes, limit } => write!(
                f,
                "{} of verifier states held at once (limit {})",
                mib(bytes),
                mib(limit)
            ),
            Exceeded::Work { limit } => write!(
                f,
                "more than {limit} units of verification work (instructions processed and states compared)"
            ),
            Exceeded::Time { ms, limit_ms } => {
                write!(f, "verification ran {ms} ms (limit {limit_ms} ms)")
            }
        }
    }
}

/// The bytes of the states exploration holds: stored at pruning points, or waiting to be
/// explored. A frame, or a piece of a stack, shared by several held states is counted once,
/// while some held state refers to it ([`Held`] keeps the count). Held states never change
/// ([`crate::frames`]: the path that goes on copies what it writes), so a frame's pieces
/// when it is released are those it had when first held.
#[derive(Default)]
pub struct Ledger {
    /// States held.
    pub states: usize,
    bytes: usize,
}

/// An allocation behind an `Rc`: the value and the two counts.
const FRAME_BYTES: usize = size_of::<Held<Frame>>() + 2 * size_of::<usize>();
const PIECE_BYTES: usize = size_of::<Held<[Slot; CHUNK]>>() + 2 * size_of::<usize>();

impl Ledger {
    /// Counts `st`, held in a container whose element takes `slot` bytes.
    pub fn hold(&mut self, st: &State, slot: usize) {
        self.states += 1;
        self.bytes += slot + Self::own_bytes(st);
        for f in st.frames.shared() {
            if f.hold() {
                self.bytes += FRAME_BYTES;
                for p in f.stack.pieces() {
                    if p.hold() {
                        self.bytes += PIECE_BYTES;
                    }
                }
            }
        }
    }

    /// Stops counting `st` (held before with the same `slot`).
    pub fn release(&mut self, st: &State, slot: usize) {
        self.states -= 1;
        self.bytes -= slot + Self::own_bytes(st);
        for f in st.frames.shared() {
            if f.release() {
                self.bytes -= FRAME_BYTES;
                for p in f.stack.pieces() {
                    if p.release() {
                        self.bytes -= PIECE_BYTES;
                    }
                }
            }
        }
    }

    /// The bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// A state's bytes outside its frames.
    fn own_bytes(st: &State) -> usize {
        Frames::list_bytes(&st.frames)
            + st.regions.capacity() * size_of::<Region>()
            + st.path.capacity() * size_of::<(usize, usize)>()
    }
}
