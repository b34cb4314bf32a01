//! What the verifier accepts since issue 38 (parts 4-6), run on both engines and checked
//! against what the C means: a map entry updated from its own value keeps it
//! (policies/safe/map_self_update.c), `&buf[i]` compiled to `ptr |= i` addresses `buf + i`
//! (policies/safe/stack_or_index.c: the frame pointer is 8-aligned in both engines), and a copy
//! of the net context carries every field (policies/safe/net_ctx_copy.c).

mod common;
use common::*;
use policy_runtime::{LoadOptions, LoadedProgram, NetCtx, Tier, TunerCtx};
use shared_maps::Map;
use std::sync::Arc;

const TIERS: [Tier; 2] = [Tier::Jit, Tier::Interpreter];

fn load(rel: &str, prog: &str, tier: Tier) -> LoadedProgram {
    let (_, obj) = object(rel);
    let opts = LoadOptions {
        tier,
        ..LoadOptions::default()
    };
    let p = LoadedProgram::load(&obj, Some(prog), &registry(), &opts)
        .unwrap_or_else(|e| panic!("{rel}/{prog}: {e}"));
    assert_eq!(p.tier(), tier);
    p
}

fn map<'a>(p: &'a LoadedProgram, name: &str) -> &'a Arc<Map> {
    p.maps().iter().find(|m| m.spec().name == name).unwrap()
}

fn pair(v: &[u8]) -> (u64, u64) {
    (
        u64::from_le_bytes(v[..8].try_into().unwrap()),
        u64::from_le_bytes(v[8..16].try_into().unwrap()),
    )
}

fn pair_bytes(a: u64, b: u64) -> Vec<u8> {
    [a.to_le_bytes(), b.to_le_bytes()].concat()
}

#[test]
fn an_entry_updated_from_its_own_value_keeps_it() {
    for tier in TIERS {
        let p = load("safe/map_self_update.o", "self_update", tier);
        let (arr, pcpu, hash) = (map(&p, "arr"), map(&p, "pcpu"), map(&p, "hash"));
        for k in 0..4u32 {
            arr.update(&k.to_le_bytes(), &pair_bytes(100 * u64::from(k), 0), 0)
                .unwrap();
        }
        // conn_id 5 and bytes 9: the last update's key (the value's first word, 9) is another
        // entry; conn_id 9 and bytes 9: the same entry, keyed by its own value.
        for (conn_id, bytes, latency) in [(5u64, 9u64, 70u64), (9, 9, 30)] {
            for op in 0..8u32 {
                let k = op & 3;
                let (a0, _) = pair(&arr.get(&k.to_le_bytes()).unwrap());
                let pc0 = pcpu.get(&k.to_le_bytes()).map_or(0, |v| pair(&v).0);
                hash.delete(&conn_id.to_le_bytes()).ok();
                hash.delete(&bytes.to_le_bytes()).ok();
                let mut c = NetCtx {
                    conn_id,
                    bytes,
                    op,
                    latency_ns: latency,
                    ..NetCtx::default()
                };
                assert_eq!(p.run(&mut c), 0);
                let a = a0 + bytes;
                assert_eq!(
                    pair(&arr.get(&k.to_le_bytes()).unwrap()),
                    (a, a ^ 0x5555),
                    "{tier:?}: array entry {k} updated from itself"
                );
                assert_eq!(
                    pair(&pcpu.get(&k.to_le_bytes()).unwrap()).0,
                    pc0 + 1,
                    "{tier:?}: per-CPU entry {k} updated from itself"
                );
                for key in [conn_id, bytes] {
                    assert_eq!(
                        pair(&hash.get(&key.to_le_bytes()).unwrap()),
                        (bytes, latency + 1),
                        "{tier:?}: hash entry {key} (conn_id {conn_id})"
                    );
                }
            }
        }
    }
}

/// The net context with `dev`, `op` and `nstreams` set to `i` and the rest from `seed`.
fn net_ctx(seed: u64, i: u32) -> NetCtx {
    NetCtx {
        conn_id: seed.wrapping_mul(0x9e37_79b9_7f4a_7c15),
        bytes: seed ^ 0x0123_4567_89ab_cdef,
        comm_id: seed.rotate_left(17),
        op: i,
        peer_port: (seed >> 7) as u32,
        dev: i,
        nstreams: i,
        latency_ns: seed.rotate_left(40) ^ 0xfedc_ba98,
        status: -(i as i32),
        reserved: 0,
    }
}

#[test]
fn or_of_an_aligned_stack_pointer_and_an_index_addresses_the_element() {
    let obj = "safe/stack_or_index.o";
    for tier in TIERS {
        let bytes = load(obj, "bytes", tier);
        let halves = load(obj, "halves", tier);
        let tuner = load(obj, "tuner_bytes", tier);
        for seed in [1u64, 0xdead_beef_f00d, u64::MAX / 3] {
            for i in 0..8u32 {
                let iu = i as usize;
                // buf = bytes; buf[i] = 1; return buf[i ^ 1] + *(u64 *)buf (as int)
                let mut c = net_ctx(seed, i);
                let mut b = c.bytes.to_le_bytes();
                b[iu] = 1;
                let want = u32::from(b[iu ^ 1]).wrapping_add(u64::from_le_bytes(b) as u32);
                assert_eq!(bytes.run(&mut c), u64::from(want), "{tier:?} bytes i={i}");
                // h = latency_ns as u16[4]; w = conn_id as u32[2]; w[dev & 1] = 9;
                // return (h[(op & 3) ^ 2] + w[0]) & 1
                let mut c = net_ctx(seed, i);
                let h = c.latency_ns.to_le_bytes();
                let hi = ((iu & 3) ^ 2) * 2;
                let h = u32::from(u16::from_le_bytes([h[hi], h[hi + 1]]));
                let mut w = [c.conn_id as u32, (c.conn_id >> 32) as u32];
                w[iu & 1] = 9;
                let want = h.wrapping_add(w[0]) & 1;
                assert_eq!(halves.run(&mut c), u64::from(want), "{tier:?} halves i={i}");
                // nchannels = ((u8 *)&msg_size)[coll_type & 7] & 1 ? 2 : 4; return
                // ((u8 *)&comm_id)[nranks & 7] & 1 (in a subprogram's frame)
                let mut t = TunerCtx {
                    msg_size: seed ^ 0x5a5a_a5a5_0f0f_f0f0,
                    comm_id: seed.rotate_left(9),
                    coll_type: i,
                    nranks: 7 - i,
                    algo: -1,
                    proto: -1,
                    ..TunerCtx::default()
                };
                let m = t.msg_size.to_le_bytes()[iu];
                let cm = t.comm_id.to_le_bytes()[7 - iu];
                assert_eq!(tuner.run(&mut t), u64::from(cm & 1), "{tier:?} tuner i={i}");
                assert_eq!(t.nchannels, if m & 1 != 0 { 2 } else { 4 });
            }
        }
    }
}

#[test]
fn a_copy_of_the_net_context_carries_every_field() {
    for tier in TIERS {
        let p = load("safe/net_ctx_copy.o", "copy_whole", tier);
        let mut c = net_ctx(77, 5);
        assert_eq!(p.run(&mut c), 0);
        let v = map(&p, "last").get(&5u32.to_le_bytes()).unwrap();
        let raw = [
            &c.conn_id.to_le_bytes()[..],
            &c.bytes.to_le_bytes(),
            &c.comm_id.to_le_bytes(),
            &c.op.to_le_bytes(),
            &c.peer_port.to_le_bytes(),
            &c.dev.to_le_bytes(),
            &c.nstreams.to_le_bytes(),
            &c.latency_ns.to_le_bytes(),
            &c.status.to_le_bytes(),
            &c.reserved.to_le_bytes(),
        ]
        .concat();
        assert_eq!(v, raw, "{tier:?}");
        let p = load("safe/net_ctx_copy.o", "status_and_reserved", tier);
        assert_eq!(p.run(&mut net_ctx(3, 0)), 1, "{tier:?}: reserved reads 0");
    }
}
