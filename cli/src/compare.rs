//! `ncclbpf decisions --compare PID...`: whether the ranks of each communicator decided alike,
//! read from outside while the job runs (or hangs).
//!
//! Each process's tuner publishes, per communicator, the sequence number of its last decision,
//! the digest of all its decisions so far and the digest at every 256th (the last 16 kept), in
//! its `ncclbpf_decisions` map (`ncclbpf_tuner::sequence`). Ranks sampled at different moments
//! are compared at every sequence number they all have a digest for: the checkpoints they
//! share, and the current one when they all stand at the same `seq`. Once two ranks' decisions
//! differ their digests differ from there on (`ncclbpf_tuner::digest`), so the first common
//! point where they differ bounds where they diverged.

use crate::exit::{Failure, Outcome, Verdict};
use crate::out::{Out, outln};
use ncclbpf_tuner::sequence::{self, MAP_NAME, Snapshot};
use serde_json::{Value, json};
use shared_maps::{MapType, MapView, pid_alive};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;

/// What was found in one process.
struct Process {
    pid: u32,
    /// Why its decisions cannot be read (it is still listed).
    problem: Option<String>,
    records: usize,
}

/// One context of a communicator, in one process.
struct Member {
    pid: u32,
    snap: Snapshot,
}

/// What the comparison of one communicator found.
#[derive(Debug, PartialEq, Eq)]
enum Finding {
    /// Only one context has it.
    Alone,
    /// None of its contexts has a tuner policy: NCCL decided alone everywhere.
    NoPolicy,
    /// Some contexts have a tuner policy and some do not: they do not decide alike.
    PolicyOnSome,
    /// No sequence number that all have a digest for.
    NoCommonPoint,
    /// Equal digests at every common point; `at` the highest.
    Agree { at: u64 },
    /// Digests differ from `first` (the lowest common point where they do); equal at
    /// `last_agreement` (the highest common point below it), if one was kept.
    Differ {
        first: u64,
        last_agreement: Option<u64>,
    },
}

impl Finding {
    fn name(&self) -> &'static str {
        match self {
            Finding::Alone => "alone",
            Finding::NoPolicy => "no_policy",
            Finding::PolicyOnSome => "differ",
            Finding::NoCommonPoint => "no_common_point",
            Finding::Agree { .. } => "agree",
            Finding::Differ { .. } => "differ",
        }
    }

    fn differs(&self) -> bool {
        matches!(self, Finding::PolicyOnSome | Finding::Differ { .. })
    }
}

/// The digests a member has, by `seq`: its checkpoints and, when read consistently, its
/// current one.
fn points(s: &Snapshot) -> BTreeMap<u64, u64> {
    let mut p: BTreeMap<u64, u64> = s.checkpoints.iter().copied().collect();
    if let Some(d) = s.digest
        && s.seq > 0
    {
        p.insert(s.seq, d);
    }
    p
}

fn compare(members: &[Member]) -> Finding {
    if members.len() < 2 {
        return Finding::Alone;
    }
    match members.iter().filter(|m| m.snap.policy).count() {
        0 => return Finding::NoPolicy,
        n if n < members.len() => return Finding::PolicyOnSome,
        _ => {}
    }
    let all: Vec<BTreeMap<u64, u64>> = members.iter().map(|m| points(&m.snap)).collect();
    let common: BTreeSet<u64> = all[0]
        .keys()
        .copied()
        .filter(|s| all[1..].iter().all(|p| p.contains_key(s)))
        .collect();
    let Some(&highest) = common.last() else {
        return Finding::NoCommonPoint;
    };
    let mut last_agreement = None;
    for &s in &common {
        let d = all[0][&s];
        if all[1..].iter().any(|p| p[&s] != d) {
            return Finding::Differ {
                first: s,
                last_agreement,
            };
        }
        last_agreement = Some(s);
    }
    Finding::Agree { at: highest }
}

/// Every record of `view`, each from two reads (see `Snapshot::from_reads`); read again, a few
/// times, while a current (seq, digest) pair was changing under the reads.
fn records(view: &MapView) -> Result<Vec<Snapshot>, String> {
    let s = &view.spec;
    if s.kind != MapType::Hash
        || s.key_size != sequence::KEY_SIZE
        || s.value_size != sequence::RECORD_SIZE
    {
        return Err(format!(
            "{MAP_NAME} is a {} map with {} B keys and {} B values, not this ncclbpf's records \
             (a different ncclbpf version?)",
            s.kind.name(),
            s.key_size,
            s.value_size
        ));
    }
    let mut last = Vec::new();
    for _ in 0..8 {
        let (a, b) = (view.entries(), view.entries());
        let second: HashMap<&[u8], &[u8]> = b.iter().map(|(k, v)| (&k[..], &v[0][..])).collect();
        last = a
            .iter()
            .filter_map(|(k, v)| second.get(&k[..]).map(|w| (k, &v[0], *w)))
            .map(|(k, v, w)| Snapshot::from_reads(k, v, w))
            .collect::<Result<Vec<_>, _>>()?;
        if last.iter().all(|r| r.digest.is_some()) {
            break;
        }
    }
    Ok(last)
}

/// Reads process `pid`'s records: a process that is gone or unreadable is an error; one
/// without the map is listed with the reason.
fn read(pid: u32) -> Result<(Process, Vec<Snapshot>), Failure> {
    if !pid_alive(pid) {
        return Err(Failure::Usage(format!("process {pid} is gone")));
    }
    let problem = |p: String| {
        Ok((
            Process {
                pid,
                problem: Some(p),
                records: 0,
            },
            vec![],
        ))
    };
    let views = match MapView::open_all(pid) {
        Ok(v) => v,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return problem(
                "no ncclbpf maps (it has not loaded the plugin's tuner, or not yet made a \
                 communicator)"
                    .into(),
            );
        }
        Err(e) => return Err(Failure::Usage(format!("process {pid}: {e}"))),
    };
    let Some(view) = views.iter().find(|v| v.name == MAP_NAME) else {
        return problem(format!(
            "no {MAP_NAME} map (the tuner has not made a communicator in it, or it runs an \
             ncclbpf without decision records)"
        ));
    };
    match records(view) {
        Ok(r) => Ok((
            Process {
                pid,
                problem: None,
                records: r.len(),
            },
            r,
        )),
        Err(e) => problem(e),
    }
}

fn hex(v: u64) -> String {
    format!("{v:#018x}")
}

/// `pid 12` or, where one process holds several contexts of the communicator, `pid 12
/// context 3`.
fn who(m: &Member, members: &[Member]) -> String {
    if members.iter().filter(|o| o.pid == m.pid).count() > 1 {
        format!("pid {} context {}", m.pid, m.snap.context)
    } else {
        format!("pid {}", m.pid)
    }
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// One line about a communicator.
fn headline(comm: u64, f: &Finding, members: &[Member]) -> String {
    let pids: BTreeSet<u32> = members.iter().map(|m| m.pid).collect();
    let n = plural(members.len(), "context", "contexts");
    let procs = plural(pids.len(), "process", "processes");
    let kind = |s: u64| {
        if members
            .iter()
            .all(|m| m.snap.checkpoints.iter().any(|c| c.0 == s))
        {
            "checkpoint"
        } else {
            "all stand there"
        }
    };
    let c = hex(comm);
    match f {
        Finding::Alone => format!(
            "comm {c}: only in pid {} (seq {}): nothing to compare it with",
            members[0].pid, members[0].snap.seq
        ),
        Finding::NoPolicy => format!(
            "comm {c}: no tuner policy in any of its {n}: NCCL decided alone, nothing to compare"
        ),
        Finding::PolicyOnSome => {
            let without: Vec<String> = members
                .iter()
                .filter(|m| !m.snap.policy)
                .map(|m| who(m, members))
                .collect();
            format!(
                "comm {c}: DIFFER: {} without a tuner policy, the others with one, so they do not \
                 decide alike",
                without.join(", ")
            )
        }
        Finding::NoCommonPoint => format!(
            "comm {c}: no common checkpoint yet among its {n} in {procs} (a checkpoint every {} \
             decisions, the last {} kept): nothing compared",
            members[0].snap.interval,
            sequence::KEPT
        ),
        Finding::Agree { at } => {
            format!(
                "comm {c}: agree at seq {at} ({}), {n} in {procs}",
                kind(*at)
            )
        }
        Finding::Differ {
            first,
            last_agreement,
        } => format!(
            "comm {c}: DIFFER from seq {first} ({}){}, {n} in {procs}",
            kind(*first),
            match last_agreement {
                Some(s) => format!("; they agreed at seq {s}"),
                None => "; no earlier common point kept".into(),
            }
        ),
    }
}

/// At a differing point: which contexts have which digest, the largest group first (`0x… in
/// pids 1, 3; 0x… in pid 2`).
fn groups_line(at: u64, members: &[Member]) -> String {
    let mut groups: Vec<(u64, Vec<String>)> = Vec::new();
    for m in members {
        let Some(&d) = points(&m.snap).get(&at) else {
            continue;
        };
        match groups.iter_mut().find(|g| g.0 == d) {
            Some(g) => g.1.push(who(m, members)),
            None => groups.push((d, vec![who(m, members)])),
        }
    }
    groups.sort_by_key(|g| std::cmp::Reverse(g.1.len()));
    let parts: Vec<String> = groups
        .iter()
        .map(|(d, w)| format!("{} in {}", hex(*d), w.join(", ")))
        .collect();
    format!("  at seq {at}: {}", parts.join("; "))
}

/// One line per member under the headline.
fn member_line(m: &Member, members: &[Member], f: &Finding) -> String {
    let s = &m.snap;
    let mut l = format!("  {}: seq {}", who(m, members), s.seq);
    match s.digest {
        Some(d) => l.push_str(&format!(", digest {}", hex(d))),
        None => l.push_str(", digest changing"),
    }
    if let Finding::Differ { first, .. } = f
        && let Some(d) = points(s).get(first)
    {
        l.push_str(&format!("; at seq {first}: {}", hex(*d)));
    }
    if !s.policy {
        l.push_str("; no tuner policy");
    }
    if s.finalized {
        l.push_str("; finalized");
    }
    if s.unsequenced > 0 {
        l.push_str(&format!(
            "; {} call(s) outside the sequence (two threads on one communicator at once: the \
             order is not defined, so its digest can differ where every decision agreed)",
            s.unsequenced
        ));
    }
    l
}

fn member_json(m: &Member) -> Value {
    let s = &m.snap;
    json!({
        "pid": m.pid,
        "context": s.context,
        "seq": s.seq,
        "digest": s.digest.map(hex),
        "policy": s.policy,
        "finalized": s.finalized,
        "unsequenced": s.unsequenced,
        "decisions": s.counts.iter().map(|(_, n)| n).sum::<u64>(),
        "nranks": s.nranks,
        "nnodes": s.nnodes,
        "interval": s.interval,
        "checkpoints": s.checkpoints.iter().map(|&(q, d)| json!({"seq": q, "digest": hex(d)})).collect::<Vec<_>>(),
    })
}

fn comm_json(comm: u64, f: &Finding, members: &[Member]) -> Value {
    let (at, first, last) = match f {
        Finding::Agree { at } => (Some(*at), None, None),
        Finding::Differ {
            first,
            last_agreement,
        } => (None, Some(*first), *last_agreement),
        _ => (None, None, None),
    };
    json!({
        "comm_id": hex(comm),
        "verdict": f.name(),
        "message": headline(comm, f, members),
        "agreed_at": at,
        "first_difference": first.map(|s| json!({
            "seq": s,
            "last_agreement": last,
            "digests": members.iter().map(|m| json!({
                "pid": m.pid,
                "context": m.snap.context,
                "digest": points(&m.snap).get(&s).copied().map(hex),
            })).collect::<Vec<_>>(),
        })),
        "contexts": members.iter().map(member_json).collect::<Vec<_>>(),
    })
}

pub fn run(out: &mut Out, pids: &[u32], as_json: bool) -> Outcome {
    let mut seen = BTreeSet::new();
    let pids: Vec<u32> = pids.iter().copied().filter(|p| seen.insert(*p)).collect();
    let mut procs = Vec::new();
    let mut comms: BTreeMap<u64, Vec<Member>> = BTreeMap::new();
    for &pid in &pids {
        let (p, snaps) = read(pid)?;
        procs.push(p);
        for snap in snaps {
            comms
                .entry(snap.comm_id)
                .or_default()
                .push(Member { pid, snap });
        }
    }
    for m in comms.values_mut() {
        m.sort_by_key(|m| (m.pid, m.snap.context));
    }
    let findings: Vec<(u64, Finding, &Vec<Member>)> =
        comms.iter().map(|(&c, m)| (c, compare(m), m)).collect();
    let differ: Vec<&(u64, Finding, &Vec<Member>)> =
        findings.iter().filter(|f| f.1.differs()).collect();
    let compared = findings
        .iter()
        .filter(|f| matches!(f.1, Finding::Agree { .. }) || f.1.differs())
        .count();
    let unchecked: Vec<&Process> = procs.iter().filter(|p| p.problem.is_some()).collect();

    if as_json {
        out.json(&json!({
            "processes": procs.iter().map(|p| json!({
                "pid": p.pid,
                "records": p.records,
                "problem": p.problem,
            })).collect::<Vec<_>>(),
            "communicators": findings.iter().map(|(c, f, m)| comm_json(*c, f, m)).collect::<Vec<_>>(),
            "compared": compared,
            "agree": differ.is_empty() && compared > 0 && unchecked.is_empty(),
        }))?;
    } else {
        for p in &unchecked {
            outln!(
                out,
                "pid {}: {}",
                p.pid,
                p.problem.as_deref().unwrap_or_default()
            );
        }
        for (c, f, m) in &findings {
            outln!(out, "{}", headline(*c, f, m));
            if let Finding::Differ { first, .. } = f {
                outln!(out, "{}", groups_line(*first, m));
            }
            if *c == 0 && m.len() > 1 {
                outln!(
                    out,
                    "  (comm 0: tuner ABI v2-v4 pass no communicator id, so every context they \
                     made is here, whatever its communicator; compare processes with one \
                     communicator each)"
                );
            }
            if !matches!(f, Finding::Alone) {
                for x in m.iter() {
                    outln!(out, "{}", member_line(x, m, f));
                }
            }
        }
        let agreeing = compared - differ.len();
        outln!(
            out,
            "{}: {} agree{}",
            plural(compared, "communicator compared", "communicators compared"),
            agreeing,
            if differ.is_empty() {
                String::new()
            } else {
                let names: Vec<String> = differ
                    .iter()
                    .map(|(c, f, m)| {
                        let pids: BTreeSet<u32> = m.iter().map(|x| x.pid).collect();
                        let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
                        match f {
                            Finding::Differ { first, .. } => {
                                format!("{} (pids {}) from seq {first}", hex(*c), pids.join(", "))
                            }
                            _ => format!("{} (pids {}): tuner policy", hex(*c), pids.join(", ")),
                        }
                    })
                    .collect();
                format!(", {} differ: {}", differ.len(), names.join("; "))
            }
        );
    }
    if !differ.is_empty() {
        return Ok(Verdict::Bad);
    }
    if !unchecked.is_empty() {
        let list: Vec<String> = unchecked.iter().map(|p| p.pid.to_string()).collect();
        return Err(Failure::Usage(format!(
            "could not check process{} {}: no decision records (see above)",
            if list.len() == 1 { "" } else { "es" },
            list.join(", ")
        )));
    }
    if compared == 0 {
        return Err(Failure::Usage(if comms.is_empty() {
            "nothing compared: these processes have no communicators".into()
        } else {
            "nothing compared: no communicator with a tuner policy has a common checkpoint in two \
             or more of these processes"
                .into()
        }));
    }
    Ok(Verdict::Good)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(pid: u32, seq: u64, digest: Option<u64>, cps: &[(u64, u64)]) -> Member {
        Member {
            pid,
            snap: Snapshot {
                comm_id: 9,
                context: 0,
                seq,
                digest,
                unsequenced: 0,
                interval: 256,
                nranks: 2,
                nnodes: 1,
                policy: true,
                finalized: false,
                checkpoints: cps.to_vec(),
                agreement: None,
                counts: vec![],
            },
        }
    }

    #[test]
    fn findings() {
        let cps = |n: u64, bad_from: u64| -> Vec<(u64, u64)> {
            (1..=n)
                .map(|i| (i * 256, if i * 256 >= bad_from { i + 100 } else { i }))
                .collect()
        };
        let same = [
            member(1, 2000, Some(7), &cps(7, u64::MAX)),
            member(2, 2300, Some(8), &cps(8, u64::MAX)),
        ];
        assert_eq!(compare(&same), Finding::Agree { at: 1792 });
        // Both at the same seq: compared there, past the last checkpoint.
        let still = [
            member(1, 2000, Some(7), &cps(7, u64::MAX)),
            member(2, 2000, Some(7), &cps(7, u64::MAX)),
        ];
        assert_eq!(compare(&still), Finding::Agree { at: 2000 });
        let differ = [
            member(1, 2000, Some(7), &cps(7, u64::MAX)),
            member(2, 2000, Some(9), &cps(7, 1024)),
        ];
        assert_eq!(
            compare(&differ),
            Finding::Differ {
                first: 1024,
                last_agreement: Some(768)
            }
        );
        // Only past the last checkpoint: found at the current seq.
        let late = [
            member(1, 2000, Some(7), &cps(7, u64::MAX)),
            member(2, 2000, Some(9), &cps(7, u64::MAX)),
        ];
        assert_eq!(
            compare(&late),
            Finding::Differ {
                first: 2000,
                last_agreement: Some(1792)
            }
        );
        // Far apart: no common point; a changing pair is no point.
        let apart = [
            member(1, 300, Some(1), &[(256, 1)]),
            member(2, 9000, None, &cps(35, u64::MAX)[19..]),
        ];
        assert_eq!(compare(&apart), Finding::NoCommonPoint);
        assert_eq!(compare(&same[..1]), Finding::Alone);
        let mut none = [member(1, 0, Some(0), &[]), member(2, 0, Some(0), &[])];
        for m in &mut none {
            m.snap.policy = false;
        }
        assert_eq!(compare(&none), Finding::NoPolicy);
        none[0].snap.policy = true;
        assert_eq!(compare(&none), Finding::PolicyOnSome);
        assert!(Finding::PolicyOnSome.differs());
    }
}
