//! Policy runtime benchmark: cost per call of JIT-compiled policies against native Rust twins
//! of the same logic (same run, same maps), the interpreter, verification and compilation time
//! of every shipped policy, and swap time.
//!
//! ```text
//! policies/build.sh && cargo run --release -p ncclbpf-bench --bin policy-bench
//! ```

use ncclbpf_netplugin::hooks::{ConnHooks, ConnInfo};
use policy_object::Object;
use policy_runtime::{LoadOptions, LoadedProgram, NetCtx, ProgramSlot, Tier, TunerCtx};
use shared_maps::{Map, Registry};
use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

const CALLS: u64 = 5_000_000;
const ROUNDS: usize = 7;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn bytes(rel: &str) -> Vec<u8> {
    let p = root().join("target/policies").join(rel);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e} (run policies/build.sh)", p.display()))
}

/// Best-of-rounds nanoseconds per call of `f`.
fn ns_per_call(mut f: impl FnMut(u64)) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..ROUNDS {
        let t = Instant::now();
        for i in 0..CALLS {
            f(i);
        }
        best = best.min(t.elapsed().as_nanos() as f64 / CALLS as f64);
    }
    best
}

fn ctx(i: u64) -> TunerCtx {
    TunerCtx {
        msg_size: (i & 0xff) << 12,
        coll_type: (i & 7) as u32,
        algo: -1,
        proto: -1,
        ..TunerCtx::default()
    }
}

#[inline(never)]
fn native_trivial(c: &mut TunerCtx) -> u64 {
    if c.msg_size > 65536 {
        c.proto = 2;
    }
    0
}

#[inline(never)]
fn native_lookup(m: &Map, c: &mut TunerCtx) -> u64 {
    let k = c.coll_type & 15;
    if let Some(p) = m.lookup_ptr(&k.to_le_bytes()) {
        // SAFETY: an array value of 8 bytes.
        let v = unsafe { (p as *const u64).read() };
        if c.msg_size > v {
            c.proto = 2;
        }
    }
    0
}

#[inline(never)]
fn native_update(m: &Map, c: &mut TunerCtx) -> u64 {
    let k = c.coll_type.to_le_bytes();
    match m.lookup_ptr(&k) {
        // SAFETY: an 8-byte aligned hash value.
        Some(p) => unsafe { std::sync::atomic::AtomicU64::from_ptr(p as *mut u64) }
            .fetch_add(c.msg_size, std::sync::atomic::Ordering::SeqCst),
        None => {
            let _ = m.update(&k, &c.msg_size.to_le_bytes(), 0);
            0
        }
    };
    0
}

fn registry() -> Registry {
    Registry::new(std::env::temp_dir().join(format!("ncclbpf-bench-{}", std::process::id())))
}

fn main() {
    if std::env::args().any(|a| a == "--help" || a == "-h") {
        println!(
            "usage: policy-bench\n  per-call cost of policies (JIT, interpreter) against native Rust twins, load and swap times"
        );
        return;
    }
    let reg = registry();
    let jit = LoadOptions {
        tier: Tier::Jit,
        ..LoadOptions::default()
    };
    let int = LoadOptions {
        tier: Tier::Interpreter,
        ..LoadOptions::default()
    };
    println!("policy runtime, {CALLS} calls per round, best of {ROUNDS} rounds\n");
    println!("| case | native Rust (ns) | JIT (ns) | JIT − native (ns) | interpreter (ns) |");
    println!("|---|---:|---:|---:|---:|");

    let load =
        |rel: &str, o: &LoadOptions| LoadedProgram::from_elf(&bytes(rel), None, &reg, o).unwrap();
    // One row: the native twin, the JIT and the interpreter on the same maps and contexts.
    let row = |label: &str,
               jit_prog: &LoadedProgram,
               int_prog: &LoadedProgram,
               native: &dyn Fn(&mut TunerCtx) -> u64| {
        let n = ns_per_call(|i| {
            let mut c = ctx(i);
            black_box(native(black_box(&mut c)));
        });
        let j = ns_per_call(|i| {
            let mut c = ctx(i);
            black_box(jit_prog.run(black_box(&mut c)));
        });
        let it = ns_per_call(|i| {
            let mut c = ctx(i);
            black_box(int_prog.run(black_box(&mut c)));
        });
        println!("| {label} | {n:.2} | {j:.2} | {:.2} | {it:.1} |", j - n);
    };

    row(
        "trivial decision",
        &load("safe/bench_trivial.o", &jit),
        &load("safe/bench_trivial.o", &int),
        &native_trivial,
    );

    let pj = load("safe/bench_lookup.o", &jit);
    let arr = pj.maps()[0].clone();
    for k in 0..16u32 {
        arr.update(&k.to_le_bytes(), &(u64::from(k) << 14).to_le_bytes(), 0)
            .unwrap();
    }
    row(
        "array map lookup",
        &pj,
        &load("safe/bench_lookup.o", &int),
        &|c| native_lookup(&arr, c),
    );

    let pj = load("safe/bench_update.o", &jit);
    let h = pj.maps()[0].clone();
    row(
        "hash lookup + atomic update",
        &pj,
        &load("safe/bench_update.o", &int),
        &|c| native_update(&h, c),
    );

    // The net hook's per-operation cost: net_stats' completion program (hash lookup, atomic
    // adds, a latency-bucket loop) on one connection, as the plugin runs it in `test`.
    let ns = LoadedProgram::from_elf(&bytes("src/net_stats.o"), Some("on_complete"), &reg, &jit)
        .unwrap();
    let per_op = ns_per_call(|i| {
        let mut c = NetCtx {
            conn_id: 7,
            bytes: 1 << 20,
            op: 5 + (i & 1) as u32,
            latency_ns: 1000 + (i & 0xffff) * 100,
            ..NetCtx::default()
        };
        black_box(ns.run(black_box(&mut c)));
    });
    println!("| net_stats completion hook (per operation) | | {per_op:.2} | | |");

    // The same program as the plugin calls it in `test`: through a connection's hooks (its
    // counters, then the program attached to the hook), and a hook with no program.
    // SAFETY: set before anything reads the environment (the plugin reads it next).
    unsafe {
        std::env::set_var(
            "NCCL_BPF_POLICY",
            root().join("target/policies/src/net_stats.o"),
        )
    };
    ncclbpf_netplugin::hooks::init_policies();
    let mut hooks = ConnHooks::on_open(ConnInfo {
        direction: shared_maps::ConnDirection::Send,
        conn_id: 7,
        peer_port: 1,
        dev: 0,
        comm_id: 0,
        nstreams: 4,
    });
    let posted = Instant::now();
    let through = ns_per_call(|i| hooks.on_complete(1 << 20 | (i & 1) as usize, Some(posted)));
    println!(
        "| net_stats completion through the plugin's hooks (per operation) | | {through:.2} | | |"
    );
    let empty = ns_per_call(|i| hooks.on_post(4096 + (i & 1) as usize));
    println!("| a hook with no program (isend: counters only) | | {empty:.2} | | |");

    // Through a hot-swap handle.
    let slot = ProgramSlot::new(load("safe/bench_trivial.o", &jit));
    let mut handle = slot.handle();
    let s = ns_per_call(|i| {
        let mut c = ctx(i);
        black_box(handle.call(black_box(&mut c)));
    });
    println!("| trivial decision through a swap handle | | {s:.2} | | |");

    println!(
        "\n| shipped policy | program | insns | verify (µs) | JIT compile (µs) | verify + compile (µs) | code bytes |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|");
    let mut names: Vec<_> = std::fs::read_dir(root().join("policies/src"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "c"))
        .collect();
    names.sort();
    for c in names {
        let name = c.file_stem().unwrap().to_string_lossy().into_owned();
        let b = bytes(&format!("src/{name}.o"));
        let obj = Object::parse(&b).unwrap();
        for p in &obj.programs {
            let mut ver = vec![];
            let mut comp = vec![];
            let mut last = None;
            for _ in 0..50 {
                let lp = LoadedProgram::load(&obj, Some(&p.name), &reg, &jit).unwrap();
                ver.push(lp.times.verify);
                comp.push(lp.times.compile);
                last = Some(lp);
            }
            ver.sort();
            comp.sort();
            let (v, k) = (ver[ver.len() / 2], comp[comp.len() / 2]);
            let lp = last.unwrap();
            let us = |d: Duration| d.as_secs_f64() * 1e6;
            println!(
                "| {name} | {} | {} | {:.1} | {:.1} | {:.1} | {} |",
                p.name,
                p.insns.len(),
                us(v),
                us(k),
                us(v + k),
                lp.code_len()
            );
        }
    }

    let slot = ProgramSlot::new(load("src/size_aware.o", &jit));
    let mut swaps = vec![];
    for _ in 0..2000 {
        let p = load("src/size_aware.o", &jit);
        swaps.push(slot.install(p).unwrap());
    }
    swaps.sort();
    println!(
        "\nswap (no concurrent callers): median {} ns, p99 {} ns",
        swaps[swaps.len() / 2].as_nanos(),
        swaps[swaps.len() * 99 / 100].as_nanos()
    );
}
