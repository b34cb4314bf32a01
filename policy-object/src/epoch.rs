//! Epoch sources and agreed maps (`ncclbpf_source`, `ncclbpf_reduce` in a BTF map definition):
//! which rank-local maps go into a rank's epoch record, which agreed maps are filled from the
//! combined records, and how the ranks' values are combined.
//!
//! * A rank-local array with `ncclbpf_source = n` (1..=254) is *epoch source* `n`.
//! * An agreed array with `ncclbpf_source = n` (1..=254) is filled from source `n` of the same
//!   object, combined over the ranks word by word with its `ncclbpf_reduce` (default sum).
//! * An agreed array with `ncclbpf_source = 255` ([`SOURCE_STATE`]) receives the epoch
//!   program's state vector.
//!
//! [`attributes`] checks one definition, [`check_links`] the links between the maps of an
//! object; both name the map in their errors.

use crate::elf::{MapDef, MapKind, ObjectError, Scope};

/// `ncclbpf_source` of the agreed map that receives the `tuner/epoch` program's `state[]`
/// (`NCCLBPF_SOURCE_STATE` in `ncclbpf.h`).
pub const SOURCE_STATE: u32 = 255;

/// Words of the `tuner/epoch` program's state vector (`state[32]` in its context).
pub const STATE_WORDS: u32 = 32;

/// Bytes of the state vector: the most a state map may hold.
pub const STATE_BYTES: u32 = STATE_WORDS * 8;

/// How the ranks' values of an agreed map's source are combined, per `u64` word (unsigned).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Reduce {
    /// Wrapping sum (`NCCLBPF_REDUCE_SUM`, the default).
    #[default]
    Sum,
    /// Largest value (`NCCLBPF_REDUCE_MAX`).
    Max,
    /// Smallest value (`NCCLBPF_REDUCE_MIN`).
    Min,
}

impl Reduce {
    /// The value of `ncclbpf_reduce` (`NCCLBPF_REDUCE_*` in `ncclbpf.h`).
    pub fn from_value(v: u32) -> Option<Reduce> {
        match v {
            1 => Some(Reduce::Sum),
            2 => Some(Reduce::Max),
            3 => Some(Reduce::Min),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Reduce::Sum => "sum",
            Reduce::Max => "max",
            Reduce::Min => "min",
        }
    }

    /// Combines two words. Commutative and associative, so any order of the ranks gives the
    /// same result (the agreement still combines in one fixed order).
    pub fn combine(self, a: u64, b: u64) -> u64 {
        match self {
            Reduce::Sum => a.wrapping_add(b),
            Reduce::Max => a.max(b),
            Reduce::Min => a.min(b),
        }
    }
}

/// Checks `ncclbpf_source` / `ncclbpf_reduce` of one definition against its kind, scope and
/// shape; returns the map's source and reduction. The message is about the map itself (the
/// caller names it).
pub fn attributes(
    kind: MapKind,
    scope: Scope,
    value_size: u32,
    max_entries: u32,
    source: Option<u32>,
    reduce: Option<u32>,
) -> Result<(Option<u32>, Reduce), String> {
    let op = match reduce {
        None => Reduce::Sum,
        Some(v) => Reduce::from_value(v).ok_or_else(|| {
            format!(
                "ncclbpf_reduce {v} is not a reduction (NCCLBPF_REDUCE_SUM 1, \
                 NCCLBPF_REDUCE_MAX 2, NCCLBPF_REDUCE_MIN 3)"
            )
        })?,
    };
    let Some(n) = source else {
        return match reduce {
            Some(_) => Err(no_reduce()),
            None => Ok((None, op)),
        };
    };
    if !(1..=SOURCE_STATE).contains(&n) {
        return Err(format!(
            "ncclbpf_source {n} is not an epoch source (1..=254, or NCCLBPF_SOURCE_STATE 255 \
             on an agreed map)"
        ));
    }
    if scope == Scope::Config {
        return Err(
            "a config map cannot have an ncclbpf_source: it is the same on every rank \
                    and changes only by staged updates, never by an epoch"
                .into(),
        );
    }
    if n == SOURCE_STATE && scope != Scope::Agreed {
        return Err(format!(
            "ncclbpf_source {SOURCE_STATE} (NCCLBPF_SOURCE_STATE) is only for the agreed map \
             that receives the epoch program's state: declare it NCCLBPF_AGREED_STATE"
        ));
    }
    if kind != MapKind::Array {
        return Err(format!(
            "a map with an ncclbpf_source must be an array, not {} (its words are \
             recorded and combined by index)",
            kind.name()
        ));
    }
    if !value_size.is_multiple_of(8) {
        return Err(format!(
            "a map with an ncclbpf_source is recorded and combined as u64 words: value_size \
             {value_size} is not a multiple of 8"
        ));
    }
    if n == SOURCE_STATE {
        if reduce.is_some() {
            return Err(no_reduce());
        }
        let bytes = u64::from(value_size) * u64::from(max_entries);
        if bytes > u64::from(STATE_BYTES) {
            return Err(format!(
                "the state map receives the epoch program's state[] ({STATE_WORDS} u64 words, \
                 {STATE_BYTES} bytes): value_size x max_entries is {bytes} bytes"
            ));
        }
    } else if scope == Scope::Local && reduce.is_some() {
        return Err(no_reduce());
    }
    Ok((Some(n), op))
}

fn no_reduce() -> String {
    "ncclbpf_reduce applies only to an agreed map filled from an epoch source 1..=254 \
     (NCCLBPF_AGREED_FROM(n, op))"
        .into()
}

/// Checks the links between maps: each epoch source number names one rank-local map; each
/// agreed map filled from source `n` has that source in the same object, with the same
/// `value_size` and `max_entries`; at most one state map.
pub fn check_links(maps: &[MapDef]) -> Result<(), ObjectError> {
    let bad = |m: &MapDef, reason: String| ObjectError::BadMap {
        map: m.name.clone(),
        reason,
    };
    let local = |n: u32| {
        maps.iter()
            .find(|m| m.scope == Scope::Local && m.source == Some(n))
    };
    for (k, m) in maps.iter().enumerate() {
        let Some(n) = m.source else { continue };
        let earlier = maps[..k].iter().filter(|o| o.source == Some(n));
        match m.scope {
            Scope::Local => {
                if let Some(o) = earlier.clone().find(|o| o.scope == Scope::Local) {
                    return Err(bad(
                        m,
                        format!("epoch source {n} is already map '{}'", o.name),
                    ));
                }
            }
            Scope::Agreed if n == SOURCE_STATE => {
                if let Some(o) = earlier.clone().find(|o| o.scope == Scope::Agreed) {
                    return Err(bad(
                        m,
                        format!(
                            "a second state map (NCCLBPF_AGREED_STATE): '{}' is one",
                            o.name
                        ),
                    ));
                }
            }
            Scope::Agreed => {
                let Some(src) = local(n) else {
                    return Err(bad(
                        m,
                        format!(
                            "filled from epoch source {n}, but no rank-local map of this object \
                             is source {n} (declare one with NCCLBPF_EPOCH_SOURCE({n}))"
                        ),
                    ));
                };
                if (src.value_size, src.max_entries) != (m.value_size, m.max_entries) {
                    return Err(bad(
                        m,
                        format!(
                            "filled from epoch source {n} ('{}'), which has value_size {} and \
                             max_entries {}; this map has value_size {} and max_entries {}",
                            src.name, src.value_size, src.max_entries, m.value_size, m.max_entries
                        ),
                    ));
                }
            }
            Scope::Config => {} // refused by `attributes`
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reductions() {
        assert_eq!(Reduce::from_value(0), None);
        assert_eq!(Reduce::from_value(4), None);
        for (v, r, name) in [
            (1, Reduce::Sum, "sum"),
            (2, Reduce::Max, "max"),
            (3, Reduce::Min, "min"),
        ] {
            assert_eq!(Reduce::from_value(v), Some(r));
            assert_eq!(r.name(), name);
        }
        assert_eq!(Reduce::default(), Reduce::Sum);
        assert_eq!(Reduce::Sum.combine(u64::MAX, 2), 1, "wrapping");
        assert_eq!(Reduce::Max.combine(3, 9), 9);
        assert_eq!(Reduce::Min.combine(3, 9), 3);
    }

    fn attr(
        kind: MapKind,
        scope: Scope,
        vs: u32,
        n: u32,
        s: Option<u32>,
        r: Option<u32>,
    ) -> Result<(Option<u32>, Reduce), String> {
        attributes(kind, scope, vs, n, s, r)
    }

    #[test]
    fn one_definition() {
        use MapKind::*;
        use Scope::*;
        assert_eq!(attr(Hash, Local, 4, 1, None, None), Ok((None, Reduce::Sum)));
        assert_eq!(
            attr(Array, Local, 24, 8, Some(1), None),
            Ok((Some(1), Reduce::Sum))
        );
        assert_eq!(
            attr(Array, Agreed, 24, 8, Some(1), Some(2)),
            Ok((Some(1), Reduce::Max))
        );
        assert_eq!(
            attr(Array, Agreed, 8, 32, Some(255), None),
            Ok((Some(255), Reduce::Sum))
        );
        let err = |r: Result<_, String>, want: &str| {
            let e = r.unwrap_err();
            assert!(e.contains(want), "{e}");
        };
        err(
            attr(Array, Local, 8, 1, Some(0), None),
            "not an epoch source",
        );
        err(
            attr(Array, Local, 8, 1, Some(256), None),
            "not an epoch source",
        );
        err(
            attr(Array, Agreed, 8, 1, Some(1), Some(4)),
            "not a reduction",
        );
        err(attr(Hash, Local, 8, 1, Some(1), None), "not hash");
        err(attr(PercpuArray, Local, 8, 1, Some(1), None), "not percpu");
        err(attr(Array, Local, 12, 1, Some(1), None), "multiple of 8");
        err(attr(Array, Agreed, 12, 1, Some(1), None), "multiple of 8");
        err(attr(Array, Agreed, 4, 2, Some(255), None), "multiple of 8");
        err(
            attr(Array, Local, 8, 1, Some(1), Some(1)),
            "ncclbpf_reduce applies",
        );
        err(
            attr(Array, Agreed, 8, 1, None, Some(1)),
            "ncclbpf_reduce applies",
        );
        err(
            attr(Array, Agreed, 8, 1, Some(255), Some(1)),
            "ncclbpf_reduce applies",
        );
        err(
            attr(Array, Local, 8, 1, Some(255), None),
            "NCCLBPF_AGREED_STATE",
        );
        err(attr(Array, Config, 8, 1, Some(1), None), "config map");
        err(attr(Array, Config, 8, 1, Some(255), None), "config map");
        err(attr(Array, Agreed, 8, 33, Some(255), None), "264 bytes");
        assert!(attr(Array, Agreed, 256, 1, Some(255), None).is_ok());
    }
}
