//! What makes two declarations of one map name the same map.
//!
//! Programs of several objects (the objects `NCCL_BPF_POLICY` lists, a reload, a staged tuner
//! swap) that declare a map of the same name share it ([`crate::Registry::declare`]). Each
//! program was verified against its own object's declaration, so sharing is sound only if
//! every property the verifier, the locality rule and the agreement relied on is the same in
//! both: the shape ([`MapSpec`]: kind, key and value size, entries), who changes the contents
//! ([`MapScope`]: a tuner program may decide from a config or agreed map because no program
//! writes it), the epoch source and the reduction (what the agreement records and how it
//! combines the ranks' words into an agreed map), and whether it is read-only global data. A
//! [`MapIdentity`] holds all of them and [`MapIdentity::difference`] compares them, property by
//! property, in one place; the registry joins two declarations only when it finds none.
//!
//! `map_flags` is not part of it: nothing in the runtime or the verifier reads it.

use crate::map::MapSpec;
use std::fmt;

/// Who changes a map's contents (`policy_object::Scope`, which the loader maps onto this).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MapScope {
    /// Programs write it (net hooks count into it): its contents are this rank's own.
    Local,
    /// Filled by the agreement between the ranks of a communicator; no program writes it.
    Agreed,
    /// Configuration: changed only by staged updates taking effect at one collective on every
    /// rank, never by a program.
    Config,
}

impl MapScope {
    pub fn name(self) -> &'static str {
        match self {
            MapScope::Local => "rank-local",
            MapScope::Agreed => "agreed",
            MapScope::Config => "config",
        }
    }
}

/// How the ranks' words of an agreed map's epoch source are combined
/// (`policy_object::Reduce`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MapReduce {
    #[default]
    Sum,
    Max,
    Min,
}

impl MapReduce {
    pub fn name(self) -> &'static str {
        match self {
            MapReduce::Sum => "sum",
            MapReduce::Max => "max",
            MapReduce::Min => "min",
        }
    }
}

/// Everything that must agree for two declarations to be one map.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MapIdentity {
    pub spec: MapSpec,
    pub scope: MapScope,
    /// `ncclbpf_source`: the epoch source a rank-local map is, or the one an agreed map is
    /// filled from (255: the epoch program's state).
    pub source: Option<u32>,
    /// `ncclbpf_reduce` (the loader sets [`MapReduce::Sum`] where none is declared).
    pub reduce: MapReduce,
    /// Programs may not write it (`.rodata`).
    pub read_only: bool,
    /// Global data (`.rodata`, `.data`, `.bss`): private to its program, never joined.
    pub global_data: bool,
}

/// One property in which two declarations differ: its name and each side's value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Difference {
    pub property: &'static str,
    pub this: String,
    pub other: String,
}

impl MapIdentity {
    /// A rank-local map with no epoch source: what a program declares without
    /// `NCCLBPF_AGREED`, `NCCLBPF_CONFIG` or `NCCLBPF_EPOCH_SOURCE`.
    pub fn plain(spec: MapSpec) -> MapIdentity {
        MapIdentity {
            spec,
            scope: MapScope::Local,
            source: None,
            reduce: MapReduce::Sum,
            read_only: false,
            global_data: false,
        }
    }

    /// The first property in which `self` and `other` differ, `None` when they are the same map
    /// (exactly when `self == other`). The one comparison the registry makes.
    pub fn difference(&self, other: &MapIdentity) -> Option<Difference> {
        // Destructured, so that a new property cannot be left out of the comparison.
        let MapIdentity {
            spec,
            scope,
            source,
            reduce,
            read_only,
            global_data,
        } = self;
        let MapSpec {
            name,
            kind,
            key_size,
            value_size,
            max_entries,
        } = spec;
        let o = other;
        let d = |property, this: String, other: String| {
            (this != other).then_some(Difference {
                property,
                this,
                other,
            })
        };
        let src = |s: &Option<u32>| s.map_or_else(|| "none".to_string(), |n| n.to_string());
        d("name", name.clone(), o.spec.name.clone())
            .or_else(|| d("kind", kind.name().into(), o.spec.kind.name().into()))
            .or_else(|| {
                d(
                    "key_size",
                    key_size.to_string(),
                    o.spec.key_size.to_string(),
                )
            })
            .or_else(|| {
                d(
                    "value_size",
                    value_size.to_string(),
                    o.spec.value_size.to_string(),
                )
            })
            .or_else(|| {
                d(
                    "max_entries",
                    max_entries.to_string(),
                    o.spec.max_entries.to_string(),
                )
            })
            .or_else(|| d("scope", scope.name().into(), o.scope.name().into()))
            .or_else(|| d("epoch source", src(source), src(&o.source)))
            .or_else(|| d("reduction", reduce.name().into(), o.reduce.name().into()))
            .or_else(|| d("read_only", read_only.to_string(), o.read_only.to_string()))
            .or_else(|| {
                d(
                    "global_data",
                    global_data.to_string(),
                    o.global_data.to_string(),
                )
            })
    }
}

impl fmt::Display for MapIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.scope.name(), self.spec)?;
        if let Some(s) = self.source {
            write!(f, ", epoch source {s}")?;
            if self.scope == MapScope::Agreed {
                write!(f, " ({})", self.reduce.name())?;
            }
        }
        if self.read_only {
            write!(f, ", read-only")?;
        }
        if self.global_data {
            write!(f, ", global data")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::map::MapType;

    fn base() -> MapIdentity {
        MapIdentity {
            scope: MapScope::Agreed,
            source: Some(1),
            reduce: MapReduce::Max,
            ..MapIdentity::plain(MapSpec {
                name: "m".into(),
                kind: MapType::Array,
                key_size: 4,
                value_size: 8,
                max_entries: 4,
            })
        }
    }

    /// Each property alone makes two declarations different maps, named in the difference;
    /// nothing else does.
    #[test]
    fn every_property_is_compared() {
        let b = base();
        assert_eq!(b.difference(&b.clone()), None);
        type Change = fn(&mut MapIdentity);
        let changed: [(&str, Change); 10] = [
            ("name", |m| m.spec.name = "n".into()),
            ("kind", |m| m.spec.kind = MapType::PercpuArray),
            ("key_size", |m| m.spec.key_size = 8),
            ("value_size", |m| m.spec.value_size = 16),
            ("max_entries", |m| m.spec.max_entries = 5),
            ("scope", |m| m.scope = MapScope::Config),
            ("epoch source", |m| m.source = None),
            ("reduction", |m| m.reduce = MapReduce::Min),
            ("read_only", |m| m.read_only = true),
            ("global_data", |m| m.global_data = true),
        ];
        for (property, change) in changed {
            let mut o = base();
            change(&mut o);
            assert_ne!(o, b);
            let d = o
                .difference(&b)
                .unwrap_or_else(|| panic!("{property} not compared"));
            assert_eq!(d.property, property);
            assert_ne!(d.this, d.other);
            assert_eq!(b.difference(&o).unwrap().property, property, "both ways");
        }
        assert_eq!(
            base().to_string(),
            "agreed array (key 4 B, value 8 B, 4 entries), epoch source 1 (max)"
        );
    }
}
