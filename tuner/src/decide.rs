//! One decision: the policy's context from NCCL's arguments, and its answer written into
//! NCCL's cost table.
//!
//! NCCL fills `float[numAlgo][numProto]` with estimated times (-1 for combinations it cannot
//! use) and picks the smallest entry that is not negative. The policy names an algorithm, a
//! protocol, or both (-1 for "NCCL's choice"); the chosen combination's cost is set to 0 so
//! NCCL picks it. A choice NCCL cannot use, or any other out-of-range value, changes nothing:
//! the table is never left without a usable entry, and entries NCCL disabled are never revived.

use policy_runtime::{SlotHandle, TunerCtx};

/// What NCCL told us about the collective.
#[derive(Clone, Copy, Debug, Default)]
pub struct Collective {
    pub coll_type: i32,
    pub n_bytes: usize,
    pub num_pipe_ops: i32,
    pub reg_buff: i32,
    pub comm_id: u64,
    pub nranks: u32,
    pub nnodes: u32,
    /// What NCCL passed in `*nChannels` (0 in NCCL 2.28-2.30).
    pub max_channels: u32,
}

/// What the policy decided, and what was applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub algo: i32,
    pub proto: i32,
    pub nchannels: u32,
    /// Whether the (algo, proto) choice was written into the table.
    pub applied: bool,
}

impl Decision {
    /// The channel count to hand NCCL, if any: the policy's, when its algorithm/protocol
    /// choice was applied or it made none (a channel count meant for a combination NCCL
    /// cannot use is not applied to another).
    pub fn channels(&self) -> Option<u32> {
        (self.nchannels > 0 && (self.applied || (self.algo == -1 && self.proto == -1)))
            .then_some(self.nchannels)
    }
}

/// Whether a channel count `n` may be handed to NCCL for a collective NCCL will run with
/// algorithm `algo` (`None`: not known) on `nnodes` nodes.
///
/// NCCL 2.28-2.30 (`topoGetAlgoInfo` / `scheduleCollTasksToPlan`, docs/reference/nccl-collective-facts.md
/// §2.4) clamps a tuner's count to the communicator's channels for Ring, Tree, PAT and NVLS on
/// one node, but uses it unchecked as the channel count for CollNet (Direct, Chain) and for
/// NVLS across nodes, where more than the communicator has is unsafe; the tuner is never told
/// the communicator's count. One channel is always within it.
pub fn channels_allowed(n: u32, algo: Option<i32>, nnodes: u32) -> bool {
    use ncclnet_headers::tuner::Algo;
    n <= 1
        || algo.is_some_and(|a| {
            !(a == Algo::COLLNET_DIRECT.0
                || a == Algo::COLLNET_CHAIN.0
                || (nnodes > 1 && (a == Algo::NVLS.0 || a == Algo::NVLS_TREE.0)))
        })
}

/// The algorithm NCCL picks from a row-major cost table: its first smallest usable entry
/// (NCCL's loop over algorithms, then protocols, keeping a strictly smaller cost).
pub fn nccl_pick(table: &[f32], num_algo: usize, num_proto: usize) -> Option<i32> {
    nccl_entry(table, num_algo, num_proto).map(|i| (i / num_proto) as i32)
}

/// The index of NCCL's pick in a row-major cost table: its first smallest usable entry.
fn nccl_entry(table: &[f32], num_algo: usize, num_proto: usize) -> Option<usize> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in table.iter().enumerate().take(num_algo * num_proto) {
        if v >= 0.0 && best.is_none_or(|(_, b)| v < b) {
            best = Some((i, v));
        }
    }
    best.map(|(i, _)| i)
}

/// The policy's context for `c`: NCCL's arguments, and "NCCL's choice" (-1, -1, 0) as the
/// answer until the program writes one.
#[inline]
pub fn policy_ctx(c: &Collective) -> TunerCtx {
    TunerCtx {
        msg_size: c.n_bytes as u64,
        comm_id: c.comm_id,
        coll_type: c.coll_type as u32,
        nranks: c.nranks,
        nnodes: c.nnodes,
        num_pipe_ops: c.num_pipe_ops.max(0) as u32,
        reg_buff: c.reg_buff.max(0) as u32,
        max_channels: c.max_channels,
        algo: -1,
        proto: -1,
        nchannels: 0,
        usable: 0,
        nccl_algo: -1,
        nccl_proto: -1,
    }
}

/// Fills the policy's view of NCCL's cost table (`usable`, `nccl_algo`, `nccl_proto`): which
/// entries NCCL can use (bit `a * 3 + p`, for the first 32 entries; none unless the table has
/// 3 protocols) and its own pick, the first smallest usable entry (NCCL's loop). Only the pick
/// is the same on every rank (docs/reference/nccl-collective-facts.md §2.5): the verifier treats `usable`
/// as rank-local.
///
/// Kept out of line: the common program reads none of these, and the loop inlined into the
/// decision path cost it about 1.5 ns (scripts/tuner-bench.sh, size_aware).
#[inline(never)]
pub fn fill_table(ctx: &mut TunerCtx, table: &[f32], num_algo: usize, num_proto: usize) {
    // Bit a * 3 + p is what policies test (NCCLBPF_USABLE_BIT): no bits for another shape.
    ctx.usable = if num_proto == 3 {
        (0..num_algo * num_proto)
            .take(32)
            .filter(|&i| usable(table, i))
            .fold(0, |m, i| m | 1 << i)
    } else {
        0
    };
    (ctx.nccl_algo, ctx.nccl_proto) = match nccl_entry(table, num_algo, num_proto) {
        Some(i) => ((i / num_proto) as i32, (i % num_proto) as i32),
        None => (-1, -1),
    };
}

/// Runs the policy for `c`.
pub fn run_policy(handle: &mut SlotHandle, c: &Collective) -> TunerCtx {
    let mut ctx = policy_ctx(c);
    handle.call(&mut ctx);
    ctx
}

/// Applies the policy's answer to a row-major cost table (`table.len() == num_algo * num_proto`).
///
/// A plain loop over the row or column: this runs on every collective, and the first version
/// (closures over a `dyn Iterator`, `min_by`) cost about 22 ns a call where this one costs
/// about 10 (timed in a loop over `bench/c/tuner_bench.c`'s inputs and tables; a branch-free
/// variant was no faster).
#[inline]
pub fn apply(ctx: &TunerCtx, table: &mut [f32], num_algo: usize, num_proto: usize) -> Decision {
    // NCCL 2.23 and later pass 7 x 3: that shape gets its own copy, with the loops unrolled
    // and no bounds checks (1 ns at P50, 3 ns at P99 in scripts/tuner-bench.sh).
    const NA: usize = ncclnet_headers::tuner::NUM_ALGORITHMS;
    const NP: usize = ncclnet_headers::tuner::NUM_PROTOCOLS;
    if (num_algo, num_proto) == (NA, NP) && table.len() == NA * NP {
        apply_shape(ctx, table, NA, NP)
    } else {
        apply_shape(ctx, table, num_algo, num_proto)
    }
}

#[inline(always)]
fn apply_shape(ctx: &TunerCtx, table: &mut [f32], num_algo: usize, num_proto: usize) -> Decision {
    let in_range = |v: i32, n: usize| usize::try_from(v).ok().filter(|&v| v < n);
    let choice = match (in_range(ctx.algo, num_algo), in_range(ctx.proto, num_proto)) {
        (Some(a), Some(p)) => Some(a * num_proto + p).filter(|&i| usable(table, i)),
        (Some(a), None) if ctx.proto == -1 => cheapest(table, a * num_proto, 1, num_proto),
        (None, Some(p)) if ctx.algo == -1 => cheapest(table, p, num_proto, num_algo),
        _ => None,
    };
    if let Some(e) = choice.and_then(|i| table.get_mut(i)) {
        *e = 0.0;
    }
    Decision {
        algo: ctx.algo,
        proto: ctx.proto,
        nchannels: ctx.nchannels,
        applied: choice.is_some(),
    }
}

/// NCCL can use an entry whose cost is not negative (and not NaN).
#[inline]
fn usable(table: &[f32], i: usize) -> bool {
    table.get(i).is_some_and(|&v| v >= 0.0)
}

/// The index of the first smallest usable entry of `table[start + k * step]`, `k < n`.
#[inline]
fn cheapest(table: &[f32], start: usize, step: usize, n: usize) -> Option<usize> {
    let mut best: Option<(usize, f32)> = None;
    for k in 0..n {
        let i = start + k * step;
        let Some(&v) = table.get(i) else { break };
        if v >= 0.0 && best.is_none_or(|(_, b)| v.total_cmp(&b).is_lt()) {
            best = Some((i, v));
        }
    }
    best.map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Vec<f32> {
        // 3 algorithms x 3 protocols; algo 1 proto 0 is disabled.
        vec![5.0, 6.0, 7.0, -1.0, 3.0, 4.0, 9.0, 9.0, 1.0]
    }

    fn ctx(algo: i32, proto: i32) -> TunerCtx {
        TunerCtx {
            algo,
            proto,
            ..Default::default()
        }
    }

    #[test]
    fn channel_counts_are_kept_from_algorithms_that_do_not_clamp_them() {
        use ncclnet_headers::tuner::Algo;
        for a in [Algo::TREE.0, Algo::RING.0, Algo::PAT.0] {
            assert!(channels_allowed(32, Some(a), 4));
        }
        for a in [Algo::COLLNET_DIRECT.0, Algo::COLLNET_CHAIN.0] {
            assert!(!channels_allowed(2, Some(a), 1) && channels_allowed(1, Some(a), 1));
        }
        for a in [Algo::NVLS.0, Algo::NVLS_TREE.0] {
            assert!(channels_allowed(16, Some(a), 1), "one node: clamped");
            assert!(!channels_allowed(16, Some(a), 2), "across nodes: unchecked");
        }
        assert!(!channels_allowed(2, None, 1) && channels_allowed(1, None, 8));
        // NCCL's pick: first smallest usable entry; -1 unusable.
        let t = [5.0, -1.0, 3.0, 3.0, 9.0, 7.0, -1.0, 2.0, 2.0];
        assert_eq!(nccl_pick(&t, 3, 3), Some(2));
        assert_eq!(nccl_pick(&[-1.0; 6], 2, 3), None);
        assert_eq!(
            nccl_pick(&[1.0, 0.0, 0.0, 0.0], 2, 2),
            Some(0),
            "ties: the first"
        );
    }

    #[test]
    fn the_table_fields_say_what_nccl_can_use_and_would_pick() {
        let mut c = policy_ctx(&Collective::default());
        assert_eq!((c.usable, c.nccl_algo, c.nccl_proto), (0, -1, -1));
        // 3 x 3: algo 1 proto 0 disabled; the cheapest, 1.0, is algo 2 proto 2.
        fill_table(&mut c, &table(), 3, 3);
        assert_eq!(c.usable, 0b1_1111_0111);
        assert_eq!((c.nccl_algo, c.nccl_proto), (2, 2));
        // Ties go to the first entry, as in NCCL's loop; NaN and negatives are not usable.
        fill_table(&mut c, &[f32::NAN, 4.0, -1.0, 4.0, 7.0, -0.5], 2, 3);
        assert_eq!((c.usable, c.nccl_algo, c.nccl_proto), (0b1_1010, 0, 1));
        fill_table(&mut c, &[-1.0; 6], 2, 3);
        assert_eq!((c.usable, c.nccl_algo, c.nccl_proto), (0, -1, -1));
        // Entries past the 32nd have no bit but can still be NCCL's pick.
        let mut big = vec![5.0f32; 36];
        big[35] = 1.0;
        fill_table(&mut c, &big, 12, 3);
        assert_eq!(c.usable, u32::MAX);
        assert_eq!((c.nccl_algo, c.nccl_proto), (11, 2));
        // Not 3 protocols: no bits (policies test a * 3 + p), the pick still known.
        let mut four = vec![5.0f32; 8];
        four[6] = 1.0;
        fill_table(&mut c, &four, 2, 4);
        assert_eq!((c.usable, c.nccl_algo, c.nccl_proto), (0, 1, 2));
    }

    #[test]
    fn full_choice_forces_that_entry() {
        let mut t = table();
        let d = apply(&ctx(0, 2), &mut t, 3, 3);
        assert!(d.applied);
        assert_eq!(t[2], 0.0);
        assert_eq!(t.iter().filter(|&&v| v == 0.0).count(), 1);
    }

    #[test]
    fn protocol_only_takes_the_cheapest_usable_algorithm() {
        let mut t = table();
        assert!(apply(&ctx(-1, 0), &mut t, 3, 3).applied);
        assert_eq!(
            t[0], 0.0,
            "algo 0 (5.0) beats algo 2 (9.0); algo 1 is disabled"
        );
        let mut t = table();
        assert!(apply(&ctx(2, -1), &mut t, 3, 3).applied);
        assert_eq!(t[8], 0.0);
    }

    /// `apply` as it was first written (closures over iterators), the reference.
    fn apply_reference(ctx: &TunerCtx, table: &mut [f32], na: usize, np: usize) -> Decision {
        let usable = |a: usize, p: usize| table[a * np + p] >= 0.0;
        let cheapest = |cands: &mut dyn Iterator<Item = (usize, usize)>| {
            cands
                .filter(|&(a, p)| usable(a, p))
                .min_by(|x, y| table[x.0 * np + x.1].total_cmp(&table[y.0 * np + y.1]))
        };
        let in_range = |v: i32, n: usize| usize::try_from(v).ok().filter(|&v| v < n);
        let choice = match (in_range(ctx.algo, na), in_range(ctx.proto, np)) {
            (Some(a), Some(p)) => usable(a, p).then_some((a, p)),
            (Some(a), None) if ctx.proto == -1 => cheapest(&mut (0..np).map(|p| (a, p))),
            (None, Some(p)) if ctx.algo == -1 => cheapest(&mut (0..na).map(|a| (a, p))),
            _ => None,
        };
        if let Some((a, p)) = choice {
            table[a * np + p] = 0.0;
        }
        Decision {
            algo: ctx.algo,
            proto: ctx.proto,
            nchannels: ctx.nchannels,
            applied: choice.is_some(),
        }
    }

    #[test]
    fn apply_matches_the_reference() {
        // Ties, -1, other negatives, -0.0, +0.0, NaN, infinity; shapes up to NCCL's 7 x 3.
        let values = [
            -1.0f32,
            -1.0,
            0.0,
            -0.0,
            2.5,
            2.5,
            7.0,
            f32::NAN,
            f32::INFINITY,
            -3.0,
            1e-30,
            100.0,
        ];
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for n in 0..20_000 {
            // Every other case in NCCL's own shape, which has a copy of its own.
            let (na, np) = match n % 2 {
                0 => (7, 3),
                _ => (1 + next() as usize % 7, 1 + next() as usize % 3),
            };
            let t: Vec<f32> = (0..na * np)
                .map(|_| values[next() as usize % values.len()])
                .collect();
            let pick = |r: u64, n: usize| (r % (n as u64 + 3)) as i32 - 2;
            let c = ctx(pick(next(), na), pick(next(), np));
            let (mut a, mut b) = (t.clone(), t.clone());
            let da = apply(&c, &mut a, na, np);
            let db = apply_reference(&c, &mut b, na, np);
            assert_eq!(da, db, "{c:?} on {t:?}");
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b), "{c:?} on {t:?}");
        }
    }

    #[test]
    fn channels_go_with_an_applied_choice_or_with_none() {
        let d = |algo, proto, applied| Decision {
            algo,
            proto,
            nchannels: 4,
            applied,
        };
        assert_eq!(d(-1, -1, false).channels(), Some(4), "channels only");
        assert_eq!(d(1, 2, true).channels(), Some(4));
        assert_eq!(
            d(1, 0, false).channels(),
            None,
            "meant for a combination NCCL cannot use"
        );
        assert_eq!(
            Decision {
                nchannels: 0,
                ..d(1, 2, true)
            }
            .channels(),
            None
        );
    }

    #[test]
    fn unusable_or_out_of_range_choices_leave_the_table_alone() {
        for (a, p) in [(1, 0), (7, 0), (0, 9), (-1, -1), (-5, 1)] {
            let mut t = table();
            let d = apply(&ctx(a, p), &mut t, 3, 3);
            assert!(!d.applied, "({a}, {p})");
            assert_eq!(t, table(), "({a}, {p})");
        }
        let mut all_off = vec![-1.0f32; 9];
        assert!(!apply(&ctx(-1, 2), &mut all_off, 3, 3).applied);
        assert!(
            all_off.iter().all(|&v| v == -1.0),
            "disabled entries are never revived"
        );
    }
}
