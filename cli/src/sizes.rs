//! Message sizes on the command line: `64K`, `4MiB`, `8B..4GiB`.

use std::fmt;
use std::str::FromStr;

const UNITS: [(&str, u32); 5] = [("B", 0), ("KiB", 10), ("MiB", 20), ("GiB", 30), ("TiB", 40)];

/// A size in bytes: a number with an optional suffix B, K/KiB, M/MiB, G/GiB, T/TiB (powers of
/// 1024; case does not matter), e.g. `8`, `8B`, `64K`, `4MiB`.
pub fn parse(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim();
    if num.is_empty() {
        return Err(format!(
            "{s:?}: expected a number of bytes, e.g. 8, 64K, 4MiB"
        ));
    }
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        "t" | "tib" => 40,
        _ => {
            return Err(format!(
                "{s:?}: unknown unit {unit:?} (use B, K or KiB, M or MiB, G or GiB, T or TiB; all powers of 1024)"
            ));
        }
    };
    let n: u64 = num.parse().map_err(|_| format!("{s:?}: too large"))?;
    n.checked_mul(1u64 << shift)
        .filter(|&v| v <= MAX)
        .ok_or_else(|| format!("{s:?}: too large (at most 2^62 bytes)"))
}

/// The largest size accepted.
pub const MAX: u64 = 1 << 62;

/// `n` bytes in the largest unit that divides it: `8 B`, `64 KiB`, `4 GiB`, `1536 KiB`.
pub fn show(n: u64) -> String {
    let (name, shift) = UNITS
        .iter()
        .rev()
        .find(|(_, sh)| n != 0 && n.trailing_zeros() >= *sh)
        .copied()
        .unwrap_or(("B", 0));
    format!("{} {name}", n >> shift)
}

/// An inclusive range of sizes: `LO..HI`, or one size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    pub lo: u64,
    pub hi: u64,
}

impl FromStr for Range {
    type Err = String;
    fn from_str(s: &str) -> Result<Range, String> {
        let (lo, hi) = match s.split_once("..") {
            Some((a, b)) => (parse(a)?, parse(b.strip_prefix('=').unwrap_or(b))?),
            None => {
                let v = parse(s)?;
                (v, v)
            }
        };
        if lo > hi {
            return Err(format!("{s:?}: the range ends below its start"));
        }
        let r = Range { lo, hi };
        if r.powers_of_two().is_empty() {
            return Err(format!("{s:?}: no power of two in the range"));
        }
        Ok(r)
    }
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.lo == self.hi {
            write!(f, "{}", show(self.lo))
        } else {
            write!(f, "{} to {}", show(self.lo), show(self.hi))
        }
    }
}

impl Range {
    /// Every power of two in the range, ascending.
    pub fn powers_of_two(&self) -> Vec<u64> {
        (0..63)
            .map(|k| 1u64 << k)
            .filter(|v| (self.lo..=self.hi).contains(v))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes() {
        assert_eq!(parse("8"), Ok(8));
        assert_eq!(parse("8B"), Ok(8));
        assert_eq!(parse("64K"), Ok(64 << 10));
        assert_eq!(parse("64k"), Ok(64 << 10));
        assert_eq!(parse("64KiB"), Ok(64 << 10));
        assert_eq!(parse("4M"), Ok(4 << 20));
        assert_eq!(parse("4 MiB"), Ok(4 << 20));
        assert_eq!(parse("4GiB"), Ok(4 << 30));
        assert_eq!(parse("1T"), Ok(1 << 40));
        assert!(parse("4KB").is_err());
        assert!(parse("M").is_err());
        assert!(parse("-1").is_err());
        assert!(parse("1.5M").is_err());
        assert!(parse("99999999999999999999").is_err());
        assert!(parse("8388608T").is_err());
    }

    #[test]
    fn ranges_and_powers() {
        let r: Range = "8B..4GiB".parse().unwrap();
        assert_eq!(r, Range { lo: 8, hi: 4 << 30 });
        let p = r.powers_of_two();
        assert_eq!(p.len(), 30);
        assert_eq!((p[0], p[29]), (8, 4 << 30));
        assert_eq!(
            "100..1000".parse::<Range>().unwrap().powers_of_two(),
            [128, 256, 512]
        );
        assert_eq!("1M".parse::<Range>().unwrap().powers_of_two(), [1 << 20]);
        assert_eq!("0..2".parse::<Range>().unwrap().powers_of_two(), [1, 2]);
        assert!("4G..8".parse::<Range>().is_err());
        assert!("100..120".parse::<Range>().is_err());
        assert!("8..x".parse::<Range>().is_err());
    }

    #[test]
    fn shown_in_the_largest_unit() {
        assert_eq!(show(8), "8 B");
        assert_eq!(show(0), "0 B");
        assert_eq!(show(64 << 10), "64 KiB");
        assert_eq!(show(1536 << 10), "1536 KiB");
        assert_eq!(show(4 << 30), "4 GiB");
        assert_eq!(show(1000), "1000 B");
    }
}
