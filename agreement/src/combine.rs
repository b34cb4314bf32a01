//! Combining every rank's record of one epoch into the agreed values, identically everywhere.
//!
//! The input is the epoch's records sorted by origin (every rank holds the same set, so the
//! same sorted list); the output depends on nothing else. Before combining, the records must
//! agree on what every rank must have in common: the configuration digest, the decision
//! digest (the ranks' collective sequences and decisions so far), the epoch length and the
//! record's shape. If they do not, the verdict names the makers on each side.

use crate::record::Record;
use std::collections::BTreeMap;

/// How the ranks' values of one word are combined.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reduce {
    Sum,
    Max,
    Min,
}

impl Reduce {
    fn apply(self, a: u64, b: u64) -> u64 {
        match self {
            Reduce::Sum => a.wrapping_add(b),
            Reduce::Max => a.max(b),
            Reduce::Min => a.min(b),
        }
    }
}

/// The agreed values of one epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Combined {
    pub epoch: u64,
    pub ranks: u32,
    pub duration_max_ns: u64,
    pub duration_min_ns: u64,
    /// The ranks' net busy time for the epoch (`Record::net_busy_ns`): the most and the least.
    pub net_busy_max_ns: u64,
    pub net_busy_min_ns: u64,
    pub bytes: u64,
    /// One per word of the records, reduced as the layout says.
    pub words: Vec<u64>,
}

/// What the records of an epoch say together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Agreed(Combined),
    /// The ranks differ in something they must share; the text says what and who.
    Differs(String),
}

/// What a check compares, as text.
type Key = fn(&Record) -> String;

/// Combines `records` (one per rank, sorted by origin) with `layout[i]` for word `i`.
pub fn combine(records: &[Record], layout: &[Reduce]) -> Verdict {
    let Some(first) = records.first() else {
        return Verdict::Differs("no records".into());
    };
    let checks: [(&str, Key); 6] = [
        (
            "configuration (tuner programs, map shapes, config maps, agreement settings)",
            |r| format!("{:#018x}", r.config),
        ),
        (
            "decision digest (their collective sequences or decisions diverged)",
            |r| format!("{:#018x}", r.decisions),
        ),
        ("epoch length", |r| r.colls.to_string()),
        ("communicator size", |r| r.nranks.to_string()),
        (
            "members (the origins each rank combines epochs with)",
            |r| format!("{:#018x}", r.members),
        ),
        ("record shape (words per record)", |r| {
            r.words.len().to_string()
        }),
    ];
    for (what, key) in checks {
        if let Some(text) = differ(records, what, key) {
            return Verdict::Differs(text);
        }
    }
    if first.words.len() != layout.len() {
        return Verdict::Differs(format!(
            "record shape: {} words per record, this rank's maps expect {}",
            first.words.len(),
            layout.len()
        ));
    }
    let mut words = first.words.clone();
    for r in &records[1..] {
        for ((acc, &w), &how) in words.iter_mut().zip(&r.words).zip(layout) {
            *acc = how.apply(*acc, w);
        }
    }
    Verdict::Agreed(Combined {
        epoch: first.epoch,
        ranks: records.len() as u32,
        duration_max_ns: records.iter().map(|r| r.duration_ns).max().unwrap_or(0),
        duration_min_ns: records.iter().map(|r| r.duration_ns).min().unwrap_or(0),
        net_busy_max_ns: records.iter().map(|r| r.net_busy_ns).max().unwrap_or(0),
        net_busy_min_ns: records.iter().map(|r| r.net_busy_ns).min().unwrap_or(0),
        bytes: first.bytes,
        words,
    })
}

/// `None` if every record has the same `key`; else "… differs: A, B have x; C has y".
fn differ(records: &[Record], what: &str, key: Key) -> Option<String> {
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in records {
        groups.entry(key(r)).or_default().push(r.maker());
    }
    if groups.len() < 2 {
        return None;
    }
    let sides: Vec<String> = groups
        .into_iter()
        .map(|(v, makers)| {
            let n = makers.len();
            let mut shown = makers.into_iter().take(8).collect::<Vec<_>>().join(", ");
            if n > 8 {
                shown.push_str(&format!(" and {} more", n - 8));
            }
            format!("{shown} {} {v}", if n == 1 { "has" } else { "have" })
        })
        .collect();
    Some(format!("{what} differs: {}", sides.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(origin: u64, pid: u32, words: Vec<u64>, duration_ns: u64) -> Record {
        Record {
            comm_id: 1,
            origin,
            epoch: 5,
            nranks: 3,
            colls: 64,
            pid,
            host: "h".into(),
            config: 7,
            decisions: 9,
            duration_ns,
            net_busy_ns: duration_ns / 2,
            bytes: 100,
            members: 0,
            words,
        }
    }

    #[test]
    fn words_reduce_as_the_layout_says() {
        let rs = [
            rec(1, 11, vec![1, 5, 9], 30),
            rec(2, 12, vec![2, 7, 3], 10),
            rec(3, 13, vec![3, 6, 4], 20),
        ];
        let v = combine(&rs, &[Reduce::Sum, Reduce::Max, Reduce::Min]);
        assert_eq!(
            v,
            Verdict::Agreed(Combined {
                epoch: 5,
                ranks: 3,
                duration_max_ns: 30,
                duration_min_ns: 10,
                net_busy_max_ns: 15,
                net_busy_min_ns: 5,
                bytes: 100,
                words: vec![6, 7, 3],
            })
        );
    }

    #[test]
    fn a_different_configuration_names_both_sides() {
        let mut rs = vec![
            rec(1, 11, vec![], 1),
            rec(2, 12, vec![], 1),
            rec(3, 13, vec![], 1),
        ];
        rs[2].config = 8;
        let Verdict::Differs(t) = combine(&rs, &[]) else {
            panic!("agreed")
        };
        assert!(t.starts_with("configuration"), "{t}");
        assert!(t.contains("h:11, h:12 have 0x0000000000000007"), "{t}");
        assert!(t.contains("h:13 has 0x0000000000000008"), "{t}");
    }

    #[test]
    fn diverged_decisions_epoch_lengths_and_shapes_are_refused() {
        let base = || vec![rec(1, 11, vec![1], 1), rec(2, 12, vec![1], 1)];
        let mut rs = base();
        rs[1].decisions = 1;
        assert!(
            matches!(combine(&rs, &[Reduce::Sum]), Verdict::Differs(t) if t.starts_with("decision digest"))
        );
        let mut rs = base();
        rs[1].nranks = 5;
        assert!(
            matches!(combine(&rs, &[Reduce::Sum]), Verdict::Differs(t) if t.starts_with("communicator size"))
        );
        let mut rs = base();
        rs[1].members = 9;
        assert!(
            matches!(combine(&rs, &[Reduce::Sum]), Verdict::Differs(t) if t.starts_with("members"))
        );
        let mut rs = base();
        rs[1].colls = 32;
        assert!(
            matches!(combine(&rs, &[Reduce::Sum]), Verdict::Differs(t) if t.starts_with("epoch length"))
        );
        let mut rs = base();
        rs[1].words.push(2);
        assert!(
            matches!(combine(&rs, &[Reduce::Sum]), Verdict::Differs(t) if t.starts_with("record shape"))
        );
        assert!(matches!(combine(&base(), &[]), Verdict::Differs(t) if t.contains("expect 0")));
    }

    #[test]
    fn the_result_does_not_depend_on_who_combines() {
        // Every rank holds the same records; sorted by origin they give the same bytes, and a
        // wrapping sum does not depend on the order anyway.
        let a = [rec(1, 11, vec![u64::MAX, 4], 5), rec(2, 12, vec![3, 2], 6)];
        let b = [a[1].clone(), a[0].clone()];
        let la = combine(&a, &[Reduce::Sum, Reduce::Min]);
        let lb = combine(&b, &[Reduce::Sum, Reduce::Min]);
        assert_eq!(la, lb);
    }
}
