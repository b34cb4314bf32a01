//! `ncclbpf maps`: the maps of a running (or hung) process, read-only from shared memory.

use crate::exit::{Failure, Outcome, Verdict};
use crate::out::{Out, outln};
use serde_json::{Value, json};
use shared_maps::MapView;

/// List the maps of a running process and their non-zero entries (read-only).
#[derive(clap::Args)]
#[command(after_help = concat!(
    "Examples:
  ncclbpf maps 12345                        # every map of process 12345
  ncclbpf maps 12345 --map tuner_decisions --limit 100
  ncclbpf maps --json 12345 | jq '.maps[] | {name, nonzero}'

The process must have loaded the plugin (it lists its maps in /dev/shm/ncclbpf-<uid>/<pid>.maps,
or $NCCL_BPF_SHM_DIR) and belong to the same user. Keys and values are printed as decimal
little-endian words (8 bytes each when the size is a multiple of 8, else 4 bytes when a
multiple of 4), otherwise as hex bytes; per-CPU values are summed word by word.

",
    "Exit status:
  0  the maps were read
  2  usage or I/O error (no such process, no maps registered, no such map, bad arguments)"
))]
pub struct Args {
    /// Process id of a process that loaded the plugin.
    pub pid: u32,
    /// Only the map of this name.
    #[arg(long, value_name = "NAME")]
    pub map: Option<String>,
    /// At most this many entries per map.
    #[arg(long, default_value_t = 32, value_name = "N")]
    pub limit: usize,
    /// Print one JSON document: {pid, maps: [{name, type, key_size, value_size, max_entries,
    /// ncpus, nonzero, entries: [{key, value, key_words, value_words}]}]} (key and value in
    /// hex; words as above, absent when the size is not a multiple of 4).
    #[arg(long)]
    pub json: bool,
}

/// Little-endian words of `bytes`: 8 bytes each when the size allows, else 4.
fn word_size(len: usize) -> Option<usize> {
    if len.is_multiple_of(8) && len > 0 {
        Some(8)
    } else if len.is_multiple_of(4) && len > 0 {
        Some(4)
    } else {
        None
    }
}

fn words(bytes: &[u8]) -> Option<Vec<u64>> {
    let w = word_size(bytes.len())?;
    Some(
        bytes
            .chunks_exact(w)
            .map(|c| {
                let mut b = [0u8; 8];
                b[..w].copy_from_slice(c);
                u64::from_le_bytes(b)
            })
            .collect(),
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Words in decimal (at most 8), else hex.
fn text(bytes: &[u8]) -> String {
    match words(bytes) {
        Some(w) if w.len() <= 8 => w.iter().map(u64::to_string).collect::<Vec<_>>().join(" "),
        _ => hex(bytes),
    }
}

/// One value from the per-CPU copies: summed word by word (wrapping, at the word's width).
fn sum(vals: &[Vec<u8>]) -> Vec<u8> {
    let mut total = vals[0].clone();
    let Some(w) = word_size(total.len()) else {
        return total;
    };
    for v in &vals[1..] {
        for (t, x) in total.chunks_exact_mut(w).zip(v.chunks_exact(w)) {
            let mut a = [0u8; 8];
            let mut b = [0u8; 8];
            a[..w].copy_from_slice(t);
            b[..w].copy_from_slice(x);
            let s = u64::from_le_bytes(a).wrapping_add(u64::from_le_bytes(b));
            t.copy_from_slice(&s.to_le_bytes()[..w]);
        }
    }
    total
}

pub fn run(out: &mut Out, a: &Args) -> Outcome {
    let pid = a.pid;
    let views =
        MapView::open_all(pid).map_err(|e| Failure::Usage(format!("process {pid}: {e}")))?;
    let views: Vec<_> = views
        .iter()
        .filter(|v| a.map.as_ref().is_none_or(|m| &v.name == m))
        .collect();
    if views.is_empty() {
        return Err(Failure::Usage(match &a.map {
            Some(m) => format!("process {pid} has no map {m:?}"),
            None => format!("process {pid} has no maps"),
        }));
    }
    let mut docs = Vec::new();
    for v in views {
        let s = &v.spec;
        let live: Vec<(Vec<u8>, Vec<Vec<u8>>)> = v
            .entries()
            .into_iter()
            .filter(|(_, vals)| vals.iter().any(|x| x.iter().any(|&b| b != 0)))
            .collect();
        if a.json {
            let entries: Vec<Value> = live
                .iter()
                .take(a.limit)
                .map(|(k, vals)| {
                    let total = sum(vals);
                    let mut e = json!({
                        "key": hex(k),
                        "value": hex(&total),
                        "key_words": words(k),
                        "value_words": words(&total),
                    });
                    if vals.len() > 1 {
                        e["per_cpu"] = vals.iter().map(|x| hex(x)).collect();
                    }
                    e
                })
                .collect();
            docs.push(json!({
                "name": v.name,
                "type": s.kind.name(),
                "key_size": s.key_size,
                "value_size": s.value_size,
                "max_entries": s.max_entries,
                "ncpus": v.ncpus,
                "nonzero": live.len(),
                "entries": entries,
            }));
            continue;
        }
        outln!(
            out,
            "{}: {} key {} B, value {} B, {} entries ({} non-zero{})",
            v.name,
            s.kind.name(),
            s.key_size,
            s.value_size,
            s.max_entries,
            live.len(),
            if v.ncpus > 1 {
                format!(", {} CPUs summed", v.ncpus)
            } else {
                String::new()
            }
        );
        for (k, vals) in live.iter().take(a.limit) {
            outln!(out, "  {} => {}", text(k), text(&sum(vals)));
        }
        if live.len() > a.limit {
            outln!(out, "  … {} more (--limit)", live.len() - a.limit);
        }
    }
    if a.json {
        out.json(&json!({ "pid": pid, "maps": docs }))?;
    }
    Ok(Verdict::Good)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_and_sums() {
        assert_eq!(text(&42u64.to_le_bytes()), "42");
        assert_eq!(text(&7u32.to_le_bytes()), "7");
        assert_eq!(text(&[1, 2, 3]), "010203");
        let a = [u64::MAX.to_le_bytes(), 5u64.to_le_bytes()].concat();
        let b = [2u64.to_le_bytes(), 1u64.to_le_bytes()].concat();
        assert_eq!(words(&sum(&[a, b])), Some(vec![1, 6]));
        let a = [
            1u32.to_le_bytes(),
            u32::MAX.to_le_bytes(),
            0u32.to_le_bytes(),
        ]
        .concat();
        let b = [2u32.to_le_bytes(), 1u32.to_le_bytes(), 9u32.to_le_bytes()].concat();
        assert_eq!(words(&sum(&[a, b])), Some(vec![3, 0, 9]));
    }
}
