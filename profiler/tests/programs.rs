//! The shipped `coll_timer` policy on the profiler's `profiler/coll` hook, and the rules that
//! keep profiler programs in their place.

use ncclbpf_profiler::event::{Descr, Kind, Op, StateUpdate};
use ncclbpf_profiler::handles::Handle;
use ncclbpf_profiler::programs::Programs;
use ncclbpf_profiler::tracker::Tracker;
use ncclnet_headers::profiler::{event, state};
use policy_runtime::setting::{Scope, Source};
use shared_maps::Registry;

fn source(rel: &str) -> Source {
    Source {
        path: ncclbpf_policies::object(rel)
            .unwrap()
            .to_string_lossy()
            .into_owned(),
        var: "NCCL_BPF_POLICY",
        scope: Scope::All,
    }
}

fn dir(tag: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("ncclbpf-prof-{tag}-{}", std::process::id()))
}

fn registry(tag: &str) -> &'static Registry {
    Box::leak(Box::new(Registry::new(dir(tag))))
}

#[test]
fn coll_timer_counts_what_the_gpu_took() {
    let reg = registry("coll-timer");
    let (p, problems) = Programs::load(&[source("src/coll_timer.o")], reg);
    assert!(problems.is_empty(), "{problems:?}");
    assert!(p.by_hook[0].is_some(), "attached to profiler/coll");
    assert_eq!(
        p.mask(),
        event::COLL | event::KERNEL_CH,
        "it needs collectives and their channels"
    );
    let p: &'static Programs = Box::leak(Box::new(p));
    let t = Tracker::new(event::COLL | event::KERNEL_CH, p, Some(reg));
    let ctx = t.init(0xa11, "", 1, 2, 0).unwrap();
    for dur in [10_000u64, 30_000] {
        let op = Op {
            seq: 1,
            func: 4,
            count: 1 << 16,
            type_size: 4,
            algo: 1,
            proto: 2,
            nchannels: 1,
            root_or_peer: 0,
            ..Op::default()
        };
        let c = t.start(
            ctx,
            &Descr {
                kind: Kind::Coll(op),
                parent: Handle(0),
                rank: 0,
            },
        );
        t.stop(c);
        let k = t.start(
            ctx,
            &Descr {
                kind: Kind::KernelCh {
                    channel: 0,
                    start: 500,
                },
                parent: c,
                rank: 0,
            },
        );
        t.record(
            k,
            StateUpdate {
                state: state::KERNEL_CH_STOP,
                arg: 500 + dur,
            },
        );
        t.stop(k);
    }
    // Its map: key coll 4 << 8 | log2(256 KiB) = 18.
    let views = shared_maps::MapView::open_all_in(&dir("coll-timer"), std::process::id()).unwrap();
    let map = views
        .iter()
        .find(|m| m.name == "coll_times")
        .expect("coll_times is listed");
    let v = map.entries();
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].0, ((4u64 << 8) | 18).to_le_bytes().to_vec());
    let w: Vec<u64> = v[0].1[0]
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(w, vec![2, 40_000, 30_000, 2 << 18]);
    t.finalize(ctx);
}

#[test]
fn a_tuner_program_in_the_same_object_is_not_the_profilers() {
    // rank_local_profiler.o holds a tuner program (refused by the locality rule when the tuner
    // loads it) and a profiler/coll program, which the profiler loads on its own.
    let (p, problems) =
        Programs::load(&[source("unsafe/rank_local_profiler.o")], registry("mixed"));
    assert!(problems.is_empty(), "{problems:?}");
    assert!(p.by_hook[0].is_some());
    assert!(p.by_hook[1..].iter().all(Option::is_none));
}
