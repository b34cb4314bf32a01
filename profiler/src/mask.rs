//! Which events NCCL reports to us: the activation mask `init` returns.
//!
//! * `NCCL_PROFILE_EVENT_MASK` (the variable NCCL's example profiler reads), when set, is used
//!   as given: a decimal or `0x` hexadecimal number of `ncclProfile*` bits. A value that is not
//!   one is reported and ours is used instead. Without KernelCh (`0x40`) collectives are counted
//!   but not timed.
//! * `NCCL_BPF_PROFILER=0` (or `off`) asks for no events at all: NCCL then calls nothing but
//!   `init` and `finalize`.
//! * Otherwise: collectives and p2p operations with their kernel channels (what the
//!   per-collective metrics need), and what the loaded `profiler/*` programs need.
//!
//! NCCL keeps one mask per process (the last `init`'s), so every context returns the same.

use ncclnet_headers::profiler::event;

/// What the metrics need.
pub const DEFAULT: u64 = event::COLL | event::P2P | event::KERNEL_CH;

pub const MASK_VAR: &str = "NCCL_PROFILE_EVENT_MASK";
pub const SAMPLE_VAR: &str = "NCCL_BPF_PROFILER_SAMPLE";

/// `NCCL_BPF_PROFILER_SAMPLE=N`: time one collective in N (1, the default: every one; at most
/// 1,000,000). The second value is a problem to report.
pub fn sample_every(get: &dyn Fn(&str) -> Option<String>) -> (u64, Option<String>) {
    match get(SAMPLE_VAR) {
        None => (1, None),
        Some(v) => match v.trim().parse::<u64>() {
            Ok(n) if (1..=1_000_000).contains(&n) => (n, None),
            _ => (
                1,
                Some(format!(
                    "{SAMPLE_VAR}={v}: expected a number from 1 to 1000000; every collective is timed"
                )),
            ),
        },
    }
}
pub const SWITCH_VAR: &str = "NCCL_BPF_PROFILER";

/// The mask from the settings (read through `get`) and the programs' needs; the second value
/// is a problem to report.
pub fn choose(get: &dyn Fn(&str) -> Option<String>, programs: u64) -> (u64, Option<String>) {
    if let Some(v) = get(SWITCH_VAR) {
        match v.trim().to_ascii_lowercase().as_str() {
            "0" | "off" | "false" | "no" => return (0, None),
            "1" | "on" | "true" | "yes" | "" => {}
            other => {
                return (
                    DEFAULT | programs,
                    Some(format!(
                        "{SWITCH_VAR}={other}: expected 0/off or 1/on; profiler on"
                    )),
                );
            }
        }
    }
    if let Some(v) = get(MASK_VAR) {
        let t = v.trim();
        let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
            Some(h) => u64::from_str_radix(h, 16),
            None => t.parse::<u64>(),
        };
        return match parsed {
            Ok(m) if m <= i32::MAX as u64 => (m, None),
            _ => (
                DEFAULT | programs,
                Some(format!(
                    "{MASK_VAR}={v}: not a mask of event bits (decimal or 0x hexadecimal, at most 0x{:x}); using 0x{:x}",
                    event::ALL,
                    DEFAULT | programs
                )),
            ),
        };
    }
    (DEFAULT | programs, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let v: Vec<(String, String)> = vars
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        move |k| v.iter().find(|(a, _)| a == k).map(|(_, b)| b.clone())
    }

    #[test]
    fn the_mask_comes_from_the_setting_or_from_what_is_needed() {
        assert_eq!(choose(&with(&[]), 0), (DEFAULT, None));
        assert_eq!(
            choose(&with(&[]), event::PROXY_OP),
            (DEFAULT | event::PROXY_OP, None)
        );
        assert_eq!(
            choose(&with(&[(MASK_VAR, "0x2")]), event::PROXY_OP),
            (2, None)
        );
        assert_eq!(choose(&with(&[(MASK_VAR, "4095")]), 0), (4095, None));
        let (m, why) = choose(&with(&[(MASK_VAR, "lots")]), 0);
        assert_eq!(m, DEFAULT);
        assert!(why.unwrap().contains("NCCL_PROFILE_EVENT_MASK=lots"));
        assert_eq!(
            choose(&with(&[(SWITCH_VAR, "off"), (MASK_VAR, "0xff")]), 0),
            (0, None)
        );
        assert!(choose(&with(&[(SWITCH_VAR, "maybe")]), 0).1.is_some());
    }

    #[test]
    fn sampling_is_one_in_n() {
        assert_eq!(sample_every(&with(&[])), (1, None));
        assert_eq!(sample_every(&with(&[(SAMPLE_VAR, "16")])), (16, None));
        for bad in ["0", "-1", "x", "1000001"] {
            let (n, why) = sample_every(&with(&[(SAMPLE_VAR, bad)]));
            assert_eq!(n, 1);
            assert!(why.unwrap().contains(bad));
        }
    }
}
