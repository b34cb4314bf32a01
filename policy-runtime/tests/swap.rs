//! Hot swap under load: callers never fail, every call runs one whole version, old programs
//! are freed once no caller can run them, a rejected replacement leaves the old one running.

mod common;
use common::{object, registry};
use policy_object::insn as op;
use policy_object::insn::build::{exit, mov64_imm, mov64_reg, stx};
use policy_object::{Object, Program};
use policy_runtime::program::LIVE_PROGRAMS;
use policy_runtime::{LoadOptions, LoadedProgram, ProgramSlot, TunerCtx};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A tuner program that writes `version` into nchannels and returns it.
fn versioned(version: u32) -> Object {
    let insns = vec![
        mov64_imm(2, version as i32),
        stx(op::W, 1, 48, 2),
        mov64_reg(0, 2),
        exit(),
    ];
    Object {
        programs: vec![Program {
            name: format!("v{version}"),
            section: "tuner".into(),
            insns,
            lines: vec![],
        }],
        maps: vec![],
    }
}

#[test]
fn million_calls_while_swapping_every_millisecond() {
    let reg = registry();
    let opts = LoadOptions::default();
    let slot = Arc::new(ProgramSlot::new(
        LoadedProgram::load(&versioned(1), None, &reg, &opts).unwrap(),
    ));
    let live_before = LIVE_PROGRAMS.load(Ordering::SeqCst);
    let installed = Arc::new(AtomicU64::new(1));
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let callers: Vec<_> = (0..3)
        .map(|_| {
            let (slot, installed, stop, calls) =
                (slot.clone(), installed.clone(), stop.clone(), calls.clone());
            std::thread::spawn(move || {
                let mut h = slot.handle();
                let mut last = 0u64;
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let mut c = TunerCtx::default();
                    let v = h.call(&mut c);
                    // One whole version per call: the return value and the context write agree.
                    assert_eq!(v, u64::from(c.nchannels), "a call mixed two versions");
                    assert!(v >= last, "went back from version {last} to {v}");
                    assert!(
                        v >= 1 && v <= installed.load(Ordering::SeqCst),
                        "version {v} was never installed"
                    );
                    last = v;
                    n += 1;
                    if n.is_multiple_of(1024) {
                        calls.fetch_add(1024, Ordering::Relaxed);
                    }
                }
                calls.fetch_add(n % 1024, Ordering::Relaxed);
                last
            })
        })
        .collect();
    let start = Instant::now();
    let mut version = 1u32;
    let mut swaps = vec![];
    while calls.load(Ordering::Relaxed) < 1_000_000 || swaps.len() < 200 {
        std::thread::sleep(Duration::from_millis(1));
        version += 1;
        let p = LoadedProgram::load(&versioned(version), None, &reg, &opts).unwrap();
        installed.store(u64::from(version), Ordering::SeqCst);
        swaps.push(slot.install(p).unwrap());
        assert!(start.elapsed() < Duration::from_secs(120), "too slow");
    }
    stop.store(true, Ordering::Relaxed);
    let lasts: Vec<u64> = callers.into_iter().map(|t| t.join().unwrap()).collect();
    let total = calls.load(Ordering::Relaxed);
    assert!(total >= 1_000_000, "{total} calls");
    assert!(lasts.iter().all(|&l| l >= 1));
    swaps.sort();
    println!(
        "{total} calls, {} swaps, swap median {:?}, max {:?}",
        swaps.len(),
        swaps[swaps.len() / 2],
        swaps[swaps.len() - 1]
    );
    // Every handle is gone: only the current program is alive (no JIT code leaked).
    assert_eq!(
        LIVE_PROGRAMS.load(Ordering::SeqCst),
        live_before,
        "old programs were not freed"
    );
    let mut h = slot.handle();
    assert_eq!(h.call(&mut TunerCtx::default()), u64::from(version));
}

#[test]
fn rejected_replacement_keeps_the_old_program() {
    let reg = registry();
    let opts = LoadOptions::default();
    let (good, _) = object("src/size_aware.o");
    let (bad, _) = object("unsafe/div_by_zero.o");
    let slot = ProgramSlot::new(LoadedProgram::from_elf(&good, None, &reg, &opts).unwrap());
    let mut h = slot.handle();
    let mut c = TunerCtx {
        msg_size: 64 << 20,
        algo: -1,
        proto: -1,
        ..Default::default()
    };
    h.call(&mut c);
    assert_eq!(c.proto, 2);
    let e = slot.replace(&bad, None, &reg, &opts).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("division or modulo by R1") && msg.contains("div_by_zero.c:4"),
        "{msg}"
    );
    let mut c = TunerCtx {
        msg_size: 64 << 20,
        algo: -1,
        proto: -1,
        ..Default::default()
    };
    h.call(&mut c);
    assert_eq!(c.proto, 2, "the old program still runs");
    assert!(slot.replace(b"junk", None, &reg, &opts).is_err());
    // A program for another hook is refused too.
    let (net, _) = object("src/net_stats.o");
    assert!(
        slot.replace(&net, Some("on_complete"), &reg, &opts)
            .is_err()
    );
    let r = slot.replace(&good, None, &reg, &opts).unwrap();
    println!(
        "reload: verify {:?}, compile {:?}, swap {:?}",
        r.verify, r.compile, r.swap
    );
}
