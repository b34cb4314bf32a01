//! Loading and running policies: the JIT and the interpreter agree on every shipped and safe
//! program (results, context writes, map effects), hooks get the right contexts, rejected
//! objects explain themselves.

mod common;
use common::*;
use policy_runtime::{LoadOptions, LoadedProgram, NetCtx, Tier, TunerCtx, TunerEpochCtx};

fn opts(tier: Tier) -> LoadOptions {
    LoadOptions {
        tier,
        ..LoadOptions::default()
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn size(&mut self) -> u64 {
        let shift = self.next() % 34;
        self.next() & ((1u64 << shift) - 1)
    }
}

fn tuner_ctx(r: &mut Rng) -> TunerCtx {
    TunerCtx {
        msg_size: r.size(),
        comm_id: r.next(),
        coll_type: (r.next() % 8) as u32,
        nranks: (r.next() % 130) as u32,
        nnodes: (r.next() % 5) as u32,
        num_pipe_ops: 1,
        reg_buff: (r.next() % 2) as u32,
        max_channels: (r.next() % 33) as u32,
        algo: -1,
        proto: -1,
        nchannels: 0,
        usable: 0,
        nccl_algo: -1,
        nccl_proto: -1,
    }
}

fn epoch_ctx(r: &mut Rng) -> TunerEpochCtx {
    let mut c = TunerEpochCtx {
        comm_id: r.next(),
        epoch: r.next() % 1000,
        nranks: (r.next() % 130) as u32,
        colls: (r.next() % 129) as u32,
        duration_max_ns: r.size(),
        duration_min_ns: r.size(),
        bytes: r.size(),
        state: [0; 32],
        net_busy_max_ns: r.size(),
        net_busy_min_ns: r.size(),
    };
    for w in &mut c.state {
        *w = if r.next().is_multiple_of(4) {
            r.next()
        } else {
            r.next() % 8
        };
    }
    c
}

fn net_ctx(r: &mut Rng) -> NetCtx {
    NetCtx {
        conn_id: r.next() % 8,
        bytes: r.size(),
        comm_id: 7,
        op: (r.next() % 8) as u32,
        peer_port: (r.next() % 65536) as u32,
        dev: 0,
        nstreams: 4,
        latency_ns: r.size(),
        status: if r.next().is_multiple_of(10) { 2 } else { 0 },
        reserved: 0,
    }
}

#[test]
fn jit_and_interpreter_agree_on_every_accepted_program() {
    // Every cpu version clang emits (v4 with clang 19: sign extension, sdiv, bswap, gotol).
    let builds: Vec<_> = ["cpu-v1", "cpu-v2", "cpu-v3-clang19", "cpu-v4"]
        .into_iter()
        .map(|b| (b, built_objects(b)))
        .collect();
    for (b, objs) in &builds {
        assert!(objs.len() >= 10, "run policies/build.sh ({b} builds)");
    }
    let all: Vec<_> = ["src", "safe"]
        .into_iter()
        .flat_map(objects)
        .chain(builds.into_iter().flat_map(|(_, o)| o))
        .collect();
    {
        for (name, _, obj) in all {
            for p in &obj.programs {
                let (ra, rb) = (registry(), registry());
                let jit = LoadedProgram::load(&obj, Some(&p.name), &ra, &opts(Tier::Jit))
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
                let int = LoadedProgram::load(&obj, Some(&p.name), &rb, &opts(Tier::Interpreter))
                    .unwrap();
                assert_eq!(jit.tier(), Tier::Jit);
                let mut r = Rng(0x9e37_79b9 ^ name.len() as u64);
                for _ in 0..2000 {
                    if p.section == "tuner/epoch" {
                        let mut a = epoch_ctx(&mut r);
                        let mut b = a;
                        assert_eq!(
                            jit.run(&mut a),
                            int.run(&mut b),
                            "{name}/{}: return value",
                            p.name
                        );
                        assert_eq!(a, b, "{name}/{}: state writes", p.name);
                    } else if p.section == "tuner" {
                        let mut a = tuner_ctx(&mut r);
                        let mut b = a;
                        assert_eq!(
                            jit.run(&mut a),
                            int.run(&mut b),
                            "{name}/{}: return value",
                            p.name
                        );
                        assert_eq!(a, b, "{name}/{}: context writes", p.name);
                    } else {
                        let mut a = net_ctx(&mut r);
                        let mut b = a;
                        assert_eq!(
                            jit.run(&mut a),
                            int.run(&mut b),
                            "{name}/{}: return value",
                            p.name
                        );
                        assert_eq!(a, b);
                    }
                }
                for (ma, mb) in jit.maps().iter().zip(int.maps()) {
                    assert_eq!(
                        dump(ma),
                        dump(mb),
                        "{name}/{}: map '{}' differs",
                        p.name,
                        ma.spec().name
                    );
                }
            }
        }
    }
}

#[test]
fn size_aware_decides_by_size_and_counts() {
    const TREE: i32 = 0;
    const RING: i32 = 1;
    const LL: i32 = 0;
    const SIMPLE: i32 = 2;
    let (_, obj) = object("src/size_aware.o");
    let reg = registry();
    let p = LoadedProgram::load(&obj, None, &reg, &LoadOptions::default()).unwrap();
    let decide = |msg_size: u64, nnodes: u32| {
        let mut c = TunerCtx {
            msg_size,
            nnodes,
            algo: -1,
            proto: -1,
            ..Default::default()
        };
        p.run(&mut c);
        (c.algo, c.proto, c.nchannels)
    };
    // The sweep's defaults: Tree/LL for <= 16 KiB from 4 nodes, Tree/Simple to 4 MiB, then Ring.
    assert_eq!(decide(1024, 2), (TREE, SIMPLE, 0));
    assert_eq!(decide(1024, 4), (TREE, LL, 0));
    assert_eq!(decide(1 << 20, 4), (TREE, SIMPLE, 0));
    assert_eq!(decide(64 << 20, 2), (RING, SIMPLE, 0));
    // Thresholds come from the map, so operators can move them while the job runs.
    let th = p
        .maps()
        .iter()
        .find(|m| m.spec().name == "tuner_thresholds")
        .unwrap();
    th.update(&0u32.to_le_bytes(), &(4u64 << 20).to_le_bytes(), 0)
        .unwrap();
    assert_eq!(decide(1 << 20, 4), (TREE, LL, 0), "new threshold applies");
    let dec = p
        .maps()
        .iter()
        .find(|m| m.spec().name == "tuner_decisions")
        .unwrap();
    let calls: u64 = dec
        .entries()
        .iter()
        .map(|(_, v)| u64::from_le_bytes(v[0][..8].try_into().unwrap()))
        .sum();
    assert_eq!(calls, 5);
}

#[test]
fn net_stats_counts_bytes_per_connection() {
    let (_, obj) = object("src/net_stats.o");
    let reg = registry();
    let p = LoadedProgram::load(&obj, Some("on_complete"), &reg, &LoadOptions::default()).unwrap();
    for i in 0..10u64 {
        let mut c = NetCtx {
            conn_id: 42,
            bytes: 1000 + i,
            op: 5,
            latency_ns: 3000,
            ..Default::default()
        };
        p.run(&mut c);
    }
    let m = p
        .maps()
        .iter()
        .find(|m| m.spec().name == "net_conn_stats")
        .unwrap();
    let v = m.get(&42u64.to_le_bytes()).unwrap();
    let word = |i: usize| u64::from_le_bytes(v[i * 8..i * 8 + 8].try_into().unwrap());
    assert_eq!(
        word(0),
        (0..10).map(|i| 1000 + i).sum::<u64>(),
        "send bytes"
    );
    assert_eq!(word(2), 10, "sends");
    assert_eq!(word(5 + 1), 10, "3 µs latencies land in bucket 1");
    // A second program of the same object shares the map by name.
    let close = LoadedProgram::load(&obj, Some("on_close"), &reg, &LoadOptions::default()).unwrap();
    close.run(&mut NetCtx {
        conn_id: 42,
        ..Default::default()
    });
    assert!(
        m.get(&42u64.to_le_bytes()).is_none(),
        "on_close deleted the connection"
    );
}

#[test]
fn map_defs_follow_maps() {
    let (_, obj) = object("safe/epoch_state.o");
    let reg = registry();
    let p = LoadedProgram::load(&obj, Some("epoch"), &reg, &LoadOptions::default()).unwrap();
    assert_eq!(p.map_defs(), &obj.maps[..]);
    assert_eq!(p.maps().len(), p.map_defs().len());
    for (m, d) in p.maps().iter().zip(p.map_defs()) {
        if d.initial.is_none() {
            assert_eq!(m.spec().name, d.name);
        }
        assert_eq!(m.spec().value_size, d.value_size);
    }
    let d = |n: &str| p.map_defs().iter().find(|d| d.name == n).unwrap();
    assert_eq!(d("lat").source, Some(1));
    assert_eq!(
        (d("lat_max").source, d("lat_max").reduce),
        (Some(1), policy_object::Reduce::Max)
    );
    assert_eq!(d("state").source, Some(policy_object::SOURCE_STATE));
}

#[test]
fn an_epoch_program_runs_on_its_context_only() {
    let (_, obj) = object("safe/epoch_state.o");
    let reg = registry();
    for tier in [Tier::Jit, Tier::Interpreter] {
        let p = LoadedProgram::load(&obj, Some("epoch"), &reg, &opts(tier)).unwrap();
        let mut c = TunerEpochCtx {
            colls: 4,
            duration_max_ns: 4000,
            bytes: 12_000,
            ..Default::default()
        };
        p.run(&mut c);
        p.run(&mut c);
        assert_eq!((c.state[0], c.state[3]), (2, 3), "{tier:?}");
        assert_eq!(p.run(&mut TunerCtx::default()), 0);
        let mut c2 = c;
        assert!(p.run_checked(&mut c2, 10_000).is_ok());
        assert_eq!(c2.state[0], 3);
    }
}

#[test]
fn wrong_context_kind_does_not_run() {
    let (_, obj) = object("src/size_aware.o");
    let p = LoadedProgram::load(&obj, None, &registry(), &LoadOptions::default()).unwrap();
    assert_eq!(p.run(&mut NetCtx::default()), 0);
}

#[test]
fn rejected_objects_explain_why() {
    let (bytes, _) = object("unsafe/null_deref.o");
    let e =
        LoadedProgram::from_elf(&bytes, None, &registry(), &LoadOptions::default()).unwrap_err();
    let msg = e.to_string();
    println!("{msg}");
    assert!(
        msg.contains("map_value_or_null") && msg.contains("null_deref.c:7"),
        "{msg}"
    );
    let e = LoadedProgram::from_elf(
        b"\x7fELF garbage",
        None,
        &registry(),
        &LoadOptions::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("not an ELF"), "{e}");
    let (bytes, _) = object("src/net_stats.o");
    let e = LoadedProgram::from_elf(&bytes, Some("nope"), &registry(), &LoadOptions::default())
        .unwrap_err();
    assert!(e.to_string().contains("on_complete"), "{e}");
}

#[test]
fn map_shape_conflict_names_both() {
    let reg = registry();
    let (_, a) = object("safe/loop_const.o");
    let _p = LoadedProgram::load(&a, None, &reg, &LoadOptions::default()).unwrap();
    // Same name 'thresholds', different shape:
    let mut b = a.clone();
    b.maps
        .iter_mut()
        .find(|m| m.name == "thresholds")
        .unwrap()
        .value_size = 16;
    let e = LoadedProgram::load(&b, None, &reg, &LoadOptions::default()).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("thresholds") && msg.contains("value 16 B") && msg.contains("value 8 B"),
        "{msg}"
    );
}
