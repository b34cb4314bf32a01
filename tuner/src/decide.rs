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

/// Runs the policy for `c`.
pub fn run_policy(handle: &mut SlotHandle, c: &Collective) -> TunerCtx {
    let mut ctx = TunerCtx {
        msg_size: c.n_bytes as u64,
        comm_id: c.comm_id,
        coll_type: c.coll_type as u32,
        nranks: c.nranks,
        nnodes: c.nnodes,
        num_pipe_ops: c.num_pipe_ops.max(0) as u32,
        reg_buff: c.reg_buff.max(0) as u32,
        max_channels: 0,
        algo: -1,
        proto: -1,
        nchannels: 0,
        reserved: 0,
    };
    handle.call(&mut ctx);
    ctx
}

/// Applies the policy's answer to a row-major cost table (`table.len() == num_algo * num_proto`).
pub fn apply(ctx: &TunerCtx, table: &mut [f32], num_algo: usize, num_proto: usize) -> Decision {
    let usable = |a: usize, p: usize| table[a * num_proto + p] >= 0.0;
    let cheapest = |cands: &mut dyn Iterator<Item = (usize, usize)>| {
        cands
            .filter(|&(a, p)| usable(a, p))
            .min_by(|x, y| table[x.0 * num_proto + x.1].total_cmp(&table[y.0 * num_proto + y.1]))
    };
    let in_range = |v: i32, n: usize| usize::try_from(v).ok().filter(|&v| v < n);
    let choice = match (in_range(ctx.algo, num_algo), in_range(ctx.proto, num_proto)) {
        (Some(a), Some(p)) => usable(a, p).then_some((a, p)),
        (Some(a), None) if ctx.proto == -1 => cheapest(&mut (0..num_proto).map(|p| (a, p))),
        (None, Some(p)) if ctx.algo == -1 => cheapest(&mut (0..num_algo).map(|a| (a, p))),
        _ => None,
    };
    if let Some((a, p)) = choice {
        table[a * num_proto + p] = 0.0;
    }
    Decision {
        algo: ctx.algo,
        proto: ctx.proto,
        nchannels: ctx.nchannels,
        applied: choice.is_some(),
    }
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
