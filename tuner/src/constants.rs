//! `tuner/init`: a policy corrects NCCL's cost-model constants once per communicator, at
//! `init` (tuner ABI v5+), before NCCL builds its tuning model from them.
//!
//! The program sees NCCL's `ncclTunerConstants_v5_t` as 144 doubles (their bit patterns; BPF
//! has no floating point) behind a read-only header, and writes whole entries (the verifier
//! allows nothing else). Afterwards every entry the program changed is checked here: a finite
//! number in `[0, MAX_CONSTANT]` is taken, anything else (NaN, infinities, negatives, absurd
//! magnitudes) is refused and NCCL's value stays. NCCL computes these per rank, so whatever a
//! policy writes must come out the same on every rank: the context holds only values that are
//! the same on every rank of the communicator (its id, size, node count, NVL domains), and a
//! policy that writes constants (like `uniform_constants`) is rank-consistent by construction.

use ncclnet_headers::tuner::{NvlDomainInfoV5, TunerConstantsV5};
use policy_runtime::ctx::TUNER_CONSTANTS;
use policy_runtime::{LoadedProgram, TunerInitCtx};
use policy_verifier::platform::TUNER_INIT_TABLES;

/// The largest value a constant may take (µs for latencies, GB/s for bandwidths).
pub const MAX_CONSTANT: f64 = 1e6;

/// What the program did to the constants.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InitOutcome {
    /// Entries changed and taken: (name, old, new).
    pub changed: Vec<(String, f64, f64)>,
    /// Entries the program wrote with a value refused: (name, value written).
    pub refused: Vec<(String, f64)>,
}

impl InitOutcome {
    /// One log line.
    pub fn summary(&self) -> String {
        let mut parts = vec![format!("{} constant(s) changed", self.changed.len())];
        if !self.changed.is_empty() {
            let shown: Vec<String> = self
                .changed
                .iter()
                .take(8)
                .map(|(n, old, new)| format!("{n} {old} -> {new}"))
                .collect();
            let more = self.changed.len().saturating_sub(8);
            parts.push(format!(
                "{}{}",
                shown.join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            ));
        }
        if !self.refused.is_empty() {
            let shown: Vec<String> = self
                .refused
                .iter()
                .map(|(n, v)| format!("{n} = {v}"))
                .collect();
            parts.push(format!(
                "{} refused (not a finite number in [0, {MAX_CONSTANT}]), NCCL's value kept: {}",
                self.refused.len(),
                shown.join(", ")
            ));
        }
        parts.join("; ")
    }
}

/// The name of constant `i`, as the header declares it: `hw_latencies[2][1][0]`.
pub fn entry_name(i: usize) -> String {
    let dims: [&[usize]; 7] = [
        &[7, 3],
        &[3, 7, 3],
        &[4, 3],
        &[4, 3],
        &[4, 3],
        &[4, 3],
        &[4, 3],
    ];
    let mut start = 0;
    for ((name, n), d) in TUNER_INIT_TABLES.iter().zip(dims) {
        let n = *n as usize;
        if i < start + n {
            let mut rest = i - start;
            let mut idx = vec![0; d.len()];
            for k in (0..d.len()).rev() {
                idx[k] = rest % d[k];
                rest /= d[k];
            }
            let idx: String = idx.iter().map(|v| format!("[{v}]")).collect();
            return format!("{name}{idx}");
        }
        start += n;
    }
    format!("constant {i}")
}

fn to_array(c: &TunerConstantsV5) -> [f64; TUNER_CONSTANTS] {
    // SAFETY: TunerConstantsV5 is #[repr(C)] and made only of f64 arrays, 1152 bytes with no
    // padding (pinned by ncclnet-headers' layout test), the same size and alignment as
    // [f64; 144]; transmute checks the sizes at compile time.
    unsafe { std::mem::transmute::<TunerConstantsV5, [f64; TUNER_CONSTANTS]>(*c) }
}

fn from_array(a: [f64; TUNER_CONSTANTS]) -> TunerConstantsV5 {
    // SAFETY: as in to_array; every bit pattern is a valid f64.
    unsafe { std::mem::transmute::<[f64; TUNER_CONSTANTS], TunerConstantsV5>(a) }
}

/// Whether a value written by a policy may replace NCCL's.
pub fn acceptable(v: f64) -> bool {
    v.is_finite() && (0.0..=MAX_CONSTANT).contains(&v)
}

/// The communicator a `tuner/init` program runs for.
#[derive(Clone, Copy, Debug, Default)]
pub struct InitInfo {
    pub comm_id: u64,
    pub nranks: u32,
    pub nnodes: u32,
    pub nvl: Option<(i32, i32, i32)>,
}

impl InitInfo {
    pub fn with_nvl(mut self, nvl: Option<&NvlDomainInfoV5>) -> Self {
        self.nvl = nvl.map(|n| {
            (
                n.n_nvl_domains,
                n.min_ranks_per_nvl_domain,
                n.max_ranks_per_nvl_domain,
            )
        });
        self
    }
}

/// Runs `prog` on `constants` and applies what it wrote that passes [`acceptable`].
pub fn run_init(
    prog: &LoadedProgram,
    info: &InitInfo,
    constants: &mut TunerConstantsV5,
) -> InitOutcome {
    let before = to_array(constants);
    let (d, lo, hi) = info.nvl.unwrap_or_default();
    let mut ctx = TunerInitCtx {
        comm_id: info.comm_id,
        nranks: info.nranks,
        nnodes: info.nnodes,
        nvl_domains: d,
        min_ranks_per_nvl_domain: lo,
        max_ranks_per_nvl_domain: hi,
        reserved: 0,
        constants: before,
    };
    prog.run(&mut ctx);
    let mut out = InitOutcome::default();
    let mut after = before;
    for (i, (&old, &new)) in before.iter().zip(&ctx.constants).enumerate() {
        if old.to_bits() == new.to_bits() {
            continue;
        }
        if acceptable(new) {
            after[i] = new;
            out.changed.push((entry_name(i), old, new));
        } else {
            out.refused.push((entry_name(i), new));
        }
    }
    *constants = from_array(after);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_names_follow_the_header() {
        assert_eq!(entry_name(0), "base_latencies[0][0]");
        assert_eq!(entry_name(20), "base_latencies[6][2]");
        assert_eq!(entry_name(21), "hw_latencies[0][0][0]");
        // hw_latencies[NCCL_HW_PCI][NCCL_ALGO_TREE][NCCL_PROTO_SIMPLE]
        assert_eq!(entry_name(21 + 21 + 2), "hw_latencies[1][0][2]");
        assert_eq!(entry_name(84), "ll_max_bws[0][0]");
        assert_eq!(entry_name(143), "per_ch_max_nvls_tree_bws[3][2]");
    }

    #[test]
    fn values_outside_the_range_are_refused() {
        for v in [0.0, 4.5, MAX_CONSTANT] {
            assert!(acceptable(v), "{v}");
        }
        for v in [f64::NAN, f64::INFINITY, -1.0, -0.0001, 1e7] {
            assert!(!acceptable(v), "{v}");
        }
    }

    #[test]
    fn arrays_round_trip_in_nccls_order() {
        let mut a = [0.0; TUNER_CONSTANTS];
        for (i, v) in a.iter_mut().enumerate() {
            *v = i as f64;
        }
        let c = from_array(a);
        assert_eq!(c.base_latencies[6][2], 20.0);
        assert_eq!(c.hw_latencies[1][0][2], 44.0);
        assert_eq!(c.ll_max_bws[0][0], 84.0);
        assert_eq!(c.per_ch_max_nvls_tree_bws[3][2], 143.0);
        assert_eq!(to_array(&c), a);
    }
}
