//! The profiler through its ABI, as NCCL calls it and as a careless caller would: the built
//! library opened with dlopen, `ncclProfiler_v4` … `v7` looked up by name, every call through
//! the exported tables.

use ncclbpf_harness::{logger, newest_symbol};
use ncclnet_headers::NcclResult;
use ncclnet_headers::profiler::*;
use proptest::prelude::*;
use shared_maps::MapView;
use std::ffi::{CStr, c_int, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// The library's profiler is one per process: tests that count take turns.
static TURN: Mutex<()> = Mutex::new(());

fn table_v5() -> &'static ProfilerV5 {
    let (v, p) = newest_symbol("ncclProfiler_v", &[6, 5]).expect("a profiler table");
    assert_eq!(v, 6, "the newest version is exported");
    // SAFETY: the exported static has ProfilerV6's layout (= ProfilerV5's) for the process.
    unsafe { &*(p as *const ProfilerV5) }
}

fn table_v4() -> &'static ProfilerV4 {
    let (_, p) = newest_symbol("ncclProfiler_v", &[4]).expect("ncclProfiler_v4");
    // SAFETY: as above, ProfilerV4's layout.
    unsafe { &*(p as *const ProfilerV4) }
}

/// The library's counters (`ncclbpf_profiler`), by word.
fn counters() -> Vec<u64> {
    let views = MapView::open_all(std::process::id()).expect("this process's maps");
    let v = views
        .iter()
        .find(|v| v.name == "ncclbpf_profiler")
        .expect("ncclbpf_profiler is published");
    let e = v.entries();
    e[0].1[0]
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

// Word numbers of `profiler/src/counters.rs`.
const EVENTS_FOLLOWED: usize = 3;
const OPS_TIMED: usize = 5;
const UNKNOWN_HANDLE: usize = 8;
const STALE_STOPPED: usize = 9;
const STALE_FINALIZED: usize = 10;
const OPEN_EVENTS: usize = 20;
const OPEN_CONTEXTS: usize = 21;

struct Ctx(*mut c_void);
// SAFETY: a handle number, not a pointer we dereference.
unsafe impl Send for Ctx {}

/// NCCL's `ncclProfilerEventMask`: one process-wide int whose address every `init` gets (the
/// profiler may write it later: pause, resume, sampling).
static NCCL_MASK: AtomicI32 = AtomicI32::new(0);

fn init(t: &ProfilerV5, comm: u64, rank: c_int) -> (*mut c_void, c_int) {
    let mut ctx = std::ptr::null_mut();
    // SAFETY: valid out-pointers and a NUL-terminated name, as NCCL passes them.
    let r = unsafe {
        (t.init.unwrap())(
            &mut ctx,
            comm,
            NCCL_MASK.as_ptr(),
            c"harness".as_ptr(),
            1,
            2,
            rank,
            logger(),
        )
    };
    assert_eq!(r, NcclResult::SUCCESS);
    assert!(!ctx.is_null());
    (ctx, NCCL_MASK.load(Ordering::Relaxed))
}

fn coll_descr(seq: u64, nch: u8) -> EventDescr {
    // SAFETY: an all-zero descriptor is a valid value of the C struct (NCCL zeroes it too).
    let mut d: EventDescr = unsafe { std::mem::zeroed() };
    d.type_ = event::COLL;
    d.u.coll = CollDescr {
        seq_number: seq,
        func: c"AllReduce".as_ptr(),
        send_buff: std::ptr::null(),
        recv_buff: std::ptr::null_mut(),
        count: 1 << 18,
        root: 0,
        datatype: c"ncclFloat32".as_ptr(),
        n_channels: nch,
        n_warps: 8,
        algo: c"RING".as_ptr(),
        proto: c"SIMPLE".as_ptr(),
        parent_group: std::ptr::null_mut(),
    };
    d
}

fn channel_descr(parent: *mut c_void, ch: u8, start: u64) -> EventDescr {
    // SAFETY: as above.
    let mut d: EventDescr = unsafe { std::mem::zeroed() };
    d.type_ = event::KERNEL_CH;
    d.parent_obj = parent;
    d.u.kernel_ch = KernelChDescr {
        channel_id: ch,
        p_timer: start,
    };
    d
}

fn start(t: &ProfilerV5, ctx: *mut c_void, d: &mut EventDescr) -> *mut c_void {
    let mut h = std::ptr::null_mut();
    // SAFETY: as NCCL calls it.
    assert_eq!(
        // SAFETY: as above.
        unsafe { (t.start_event.unwrap())(ctx, &mut h, d) },
        NcclResult::SUCCESS
    );
    h
}

fn channel_end(t: &ProfilerV5, h: *mut c_void, stop: u64) {
    let mut a = StateArgs { p_timer: stop };
    // SAFETY: as NCCL calls it (ncclProfilerStopKernelChEvent).
    unsafe {
        assert_eq!(
            (t.record_event_state.unwrap())(h, state::KERNEL_CH_STOP, &mut a),
            NcclResult::SUCCESS
        );
        assert_eq!((t.stop_event.unwrap())(h), NcclResult::SUCCESS);
    }
}

#[test]
fn every_version_is_a_complete_table_named_bpf() {
    for v in [4, 5, 6, 7] {
        let (_, p) = newest_symbol("ncclProfiler_v", &[v]).unwrap();
        // SAFETY: the v4, v5/v6 and v7 tables share the first slot (name) and have six slots.
        let slots = unsafe { std::slice::from_raw_parts(p as *const *const c_void, 6) };
        assert!(slots.iter().all(|s| !s.is_null()), "v{v}: a NULL slot");
        // SAFETY: slot 0 is the name, a NUL-terminated constant.
        let name = unsafe { CStr::from_ptr(slots[0] as *const std::ffi::c_char) };
        assert_eq!(name.to_str().unwrap(), "BPF");
    }
}

#[test]
fn a_collective_is_timed_from_its_kernel_channels_and_published() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let t = table_v5();
    let comm = 0x5eed_0001;
    let (ctx, mask) = init(t, comm, 1);
    assert_ne!(
        mask as u64 & event::COLL,
        0,
        "collectives asked for: {mask:#x}"
    );
    assert_ne!(
        mask as u64 & event::KERNEL_CH,
        0,
        "kernel channels asked for: {mask:#x}"
    );
    let before = counters();
    let c = start(t, ctx, &mut coll_descr(9, 2));
    assert!(!c.is_null());
    // SAFETY: as NCCL calls it: the host stops the collective right after handing it over.
    assert_eq!(unsafe { (t.stop_event.unwrap())(c) }, NcclResult::SUCCESS);
    let k0 = start(t, ctx, &mut channel_descr(c, 0, 1_000_000));
    let k1 = start(t, ctx, &mut channel_descr(c, 1, 1_002_000));
    channel_end(t, k0, 1_080_000);
    channel_end(t, k1, 1_090_000);
    let after = counters();
    assert_eq!(after[OPS_TIMED] - before[OPS_TIMED], 1);
    // The figures of comm 0x5eed0001, rank 1, in ncclbpf_collectives.
    let views = MapView::open_all(std::process::id()).unwrap();
    let v = views
        .iter()
        .find(|v| v.name == "ncclbpf_collectives")
        .expect("published");
    let mine: Vec<Vec<u64>> = v
        .entries()
        .into_iter()
        .filter(|(k, _)| k[..8] == comm.to_le_bytes() && k[8..12] == 1u32.to_le_bytes())
        .map(|(_, x)| {
            x[0].chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                .collect()
        })
        .collect();
    assert_eq!(mine.len(), 1, "one bucket: all_reduce 1 MiB ring simple");
    assert_eq!(
        &mine[0][1..3],
        &[1, 90_000],
        "one collective of 90 µs (GPU clock)"
    );
    // SAFETY: as NCCL calls it.
    assert_eq!(unsafe { (t.finalize.unwrap())(ctx) }, NcclResult::SUCCESS);
}

#[test]
fn the_v4_table_reads_v4_descriptors() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let t = table_v4();
    let mut ctx = std::ptr::null_mut();
    // SAFETY: v4's init, as NCCL 2.27 calls it.
    let r = unsafe {
        (t.init.unwrap())(
            &mut ctx,
            NCCL_MASK.as_ptr(),
            c"v4".as_ptr(),
            0x44,
            1,
            2,
            0,
            logger(),
        )
    };
    assert_eq!(r, NcclResult::SUCCESS);
    let before = counters();
    // SAFETY: all-zero is valid; then the coll member, as NCCL 2.27 fills it.
    let mut d: EventDescrV4 = unsafe { std::mem::zeroed() };
    d.type_ = event::COLL as u8;
    d.u.coll = CollDescrV4 {
        seq_number: 1,
        func: c"AllGather".as_ptr(),
        send_buff: std::ptr::null(),
        recv_buff: std::ptr::null_mut(),
        count: 1024,
        root: 0,
        datatype: c"ncclBfloat16".as_ptr(),
        n_channels: 1,
        n_warps: 4,
        algo: c"RING".as_ptr(),
        proto: c"LL".as_ptr(),
    };
    let mut h = std::ptr::null_mut();
    // SAFETY: as NCCL 2.27 calls them.
    unsafe {
        assert_eq!(
            (t.start_event.unwrap())(ctx, &mut h, &mut d),
            NcclResult::SUCCESS
        );
        assert!(!h.is_null());
        assert_eq!((t.stop_event.unwrap())(h), NcclResult::SUCCESS);
        (t.finalize.unwrap())(ctx);
    }
    let after = counters();
    assert_eq!(after[EVENTS_FOLLOWED] - before[EVENTS_FOLLOWED], 1);
}

const EVENTS_IGNORED: usize = 4;

/// NCCL 2.31+'s table: a tagged collective gets entries of its own, with its tag, and a
/// KernelPhase event is ignored (no handle, counted).
#[test]
fn the_v7_table_reads_user_tags_and_ignores_kernel_phases() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let (v, p) = newest_symbol("ncclProfiler_v", &[7]).expect("ncclProfiler_v7");
    assert_eq!(v, 7);
    // SAFETY: the exported static has ProfilerV7's layout for the process.
    let t = unsafe { &*(p as *const ProfilerV7) };
    let comm = 0x5eed_0007u64;
    let mut ctx = std::ptr::null_mut();
    // SAFETY: v7's init is v5's, as NCCL 2.31 calls it.
    let r = unsafe {
        (t.init.unwrap())(
            &mut ctx,
            comm,
            NCCL_MASK.as_ptr(),
            c"v7".as_ptr(),
            2,
            2,
            0,
            logger(),
        )
    };
    assert_eq!(r, NcclResult::SUCCESS);
    assert_eq!(
        NCCL_MASK.load(Ordering::Relaxed) as u64 & event::KERNEL_PHASE,
        0,
        "kernel phases are not asked for"
    );
    let start7 = |d: &mut EventDescrV7| {
        let mut h = std::ptr::null_mut();
        // SAFETY: as NCCL calls it.
        let r = unsafe { (t.start_event.unwrap())(ctx, &mut h, d) };
        assert_eq!(r, NcclResult::SUCCESS);
        h
    };
    let stop = |h| {
        // SAFETY: as NCCL calls it.
        assert_eq!(unsafe { (t.stop_event.unwrap())(h) }, NcclResult::SUCCESS)
    };
    let before = counters();
    for (seq, tag) in [(1u64, 0u64), (2, 0xfeed_beef)] {
        // SAFETY: all-zero is valid; then the coll member, as NCCL 2.31 fills it.
        let mut d: EventDescrV7 = unsafe { std::mem::zeroed() };
        d.type_ = event::COLL;
        d.u.coll = CollDescrV7 {
            seq_number: seq,
            func: c"AllReduce".as_ptr(),
            send_buff: std::ptr::null(),
            recv_buff: std::ptr::null_mut(),
            count: 1 << 18,
            root: 0,
            datatype: c"ncclFloat32".as_ptr(),
            n_channels: 1,
            n_warps: 8,
            algo: c"RING".as_ptr(),
            proto: c"SIMPLE".as_ptr(),
            parent_group: std::ptr::null_mut(),
            kernel_variant: std::ptr::null(),
            is_sym_coll: false,
            user_tag: tag,
        };
        let c = start7(&mut d);
        assert!(!c.is_null());
        stop(c);
        // SAFETY: as above, the kernelCh member.
        let mut k: EventDescrV7 = unsafe { std::mem::zeroed() };
        k.type_ = event::KERNEL_CH;
        k.parent_obj = c;
        k.u.kernel_ch = KernelChDescr {
            channel_id: 0,
            p_timer: 5_000,
        };
        let kh = start7(&mut k);
        // A phase under the channel, as NCCL sends it when the mask has bit 15.
        // SAFETY: as above, the kernelPhase member.
        let mut ph: EventDescrV7 = unsafe { std::mem::zeroed() };
        ph.type_ = event::KERNEL_PHASE;
        ph.parent_obj = kh;
        ph.u.kernel_phase = KernelPhaseDescr {
            channel_id: 0,
            phase_id: 1,
            phase_name: c"compute".as_ptr(),
            p_timer: 5_100,
        };
        assert!(start7(&mut ph).is_null(), "no handle for a kernel phase");
        let mut a = StateArgs {
            p_timer: 5_000 + 1_000 * seq,
        };
        // SAFETY: as NCCL calls it (ncclProfilerStopKernelChEvent).
        unsafe {
            (t.record_event_state.unwrap())(kh, state::KERNEL_CH_STOP, &mut a);
        }
        stop(kh);
    }
    let after = counters();
    assert_eq!(after[OPS_TIMED] - before[OPS_TIMED], 2);
    assert_eq!(after[EVENTS_IGNORED] - before[EVENTS_IGNORED], 2);
    let views = MapView::open_all(std::process::id()).unwrap();
    let v = views
        .iter()
        .find(|v| v.name == "ncclbpf_collectives")
        .expect("published");
    let mut mine: Vec<(u32, Vec<u64>)> = v
        .entries()
        .into_iter()
        .filter(|(k, _)| k[..8] == comm.to_le_bytes())
        .map(|(k, x)| {
            (
                u32::from_le_bytes(k[12..16].try_into().unwrap()),
                x[0].chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            )
        })
        .collect();
    mine.sort();
    assert_eq!(mine.len(), 2, "untagged and tagged apart: {mine:?}");
    assert_eq!(mine[0].0 >> 16, 0, "untagged: slot 0");
    assert_ne!(mine[1].0 >> 16, 0, "tagged: a slot");
    assert_eq!(
        mine[0].0 & 0xffff,
        mine[1].0 & 0xffff,
        "same bucket otherwise"
    );
    assert_eq!(mine[0].1[0], 2, "format 2");
    assert_eq!(mine[0].1[36], 0);
    assert_eq!(mine[1].1[36], 0xfeed_beef, "the entry holds its tag");
    assert_eq!(&mine[1].1[1..3], &[1, 2_000], "timed from its channel");
    // What `ncclbpf collectives` and the metrics read.
    let rows = ncclbpf_metrics::profiled::entries(v, usize::MAX);
    let tags: Vec<_> = rows
        .iter()
        .filter(|e| e.comm == comm)
        .map(|e| e.user_tag.clone())
        .collect();
    assert!(tags.contains(&None) && tags.contains(&Some(0xfeed_beefu64.to_string())));
    // SAFETY: as NCCL calls it.
    assert_eq!(unsafe { (t.finalize.unwrap())(ctx) }, NcclResult::SUCCESS);
}

#[test]
fn bad_handles_and_null_pointers_are_ignored_and_counted() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let t = table_v5();
    let (ctx, _) = init(t, 0x5eed_0002, 0);
    let before = counters();
    let c = start(t, ctx, &mut coll_descr(1, 1));
    let k = start(t, ctx, &mut channel_descr(c, 0, 5));
    // SAFETY: every call as NCCL's ABI allows it, with values NCCL should not pass.
    unsafe {
        channel_end(t, k, 10);
        assert_eq!(
            (t.stop_event.unwrap())(k),
            NcclResult::SUCCESS,
            "stopped twice"
        );
        assert_eq!(
            (t.stop_event.unwrap())(0xdead_0000usize as *mut c_void),
            NcclResult::SUCCESS
        );
        assert_eq!(
            (t.record_event_state.unwrap())(k, state::KERNEL_CH_STOP, std::ptr::null_mut()),
            NcclResult::SUCCESS
        );
        assert_eq!(
            (t.start_event.unwrap())(ctx, std::ptr::null_mut(), &mut coll_descr(2, 1)),
            NcclResult::SUCCESS
        );
        let mut h = std::ptr::dangling_mut::<c_void>();
        assert_eq!(
            (t.start_event.unwrap())(ctx, &mut h, std::ptr::null_mut()),
            NcclResult::SUCCESS
        );
        assert!(h.is_null(), "no descriptor, no event");
        assert_eq!((t.finalize.unwrap())(ctx), NcclResult::SUCCESS);
        assert_eq!(
            (t.finalize.unwrap())(ctx),
            NcclResult::SUCCESS,
            "finalized twice"
        );
        assert_eq!(
            (t.stop_event.unwrap())(c),
            NcclResult::SUCCESS,
            "after finalize"
        );
        let mut h2 = std::ptr::null_mut();
        assert_eq!(
            (t.start_event.unwrap())(ctx, &mut h2, &mut coll_descr(3, 1)),
            NcclResult::SUCCESS
        );
        assert!(h2.is_null(), "a finalized context starts nothing");
    }
    let after = counters();
    assert_eq!(
        after[STALE_STOPPED] - before[STALE_STOPPED],
        2,
        "the second stop and the state after it"
    );
    assert_eq!(after[UNKNOWN_HANDLE] - before[UNKNOWN_HANDLE], 1);
    assert!(
        after[STALE_FINALIZED] - before[STALE_FINALIZED] >= 2,
        "finalize twice, stop after"
    );
}

#[test]
fn the_application_can_pause_and_resume_it() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let t = table_v5();
    let (ctx, mask) = init(t, 0x5eed_0003, 0);
    assert_ne!(mask, 0);
    let sym = |name: &std::ffi::CStr| {
        // SAFETY: dlsym on the library the harness opened (RTLD_DEFAULT would not see it:
        // RTLD_LOCAL); the same path gives the same handle.
        let lib = unsafe {
            libc::dlopen(
                std::ffi::CString::new(ncclbpf_harness::plugin_path().to_string_lossy().as_bytes())
                    .unwrap()
                    .as_ptr(),
                libc::RTLD_NOW | libc::RTLD_LOCAL,
            )
        };
        assert!(!lib.is_null());
        // SAFETY: as above.
        let f = unsafe { libc::dlsym(lib, name.as_ptr()) };
        assert!(!f.is_null(), "{name:?} is exported");
        // SAFETY: both are `int (*)(void)`.
        unsafe { std::mem::transmute::<*mut c_void, extern "C" fn() -> c_int>(f) }
    };
    let (pause, resume) = (sym(c"ncclBpfProfilerPause"), sym(c"ncclBpfProfilerResume"));
    assert_eq!(pause(), 0);
    assert_eq!(
        NCCL_MASK.load(Ordering::Relaxed),
        0,
        "NCCL's mask: no events"
    );
    assert_eq!(resume(), 0);
    assert_eq!(
        NCCL_MASK.load(Ordering::Relaxed),
        mask,
        "the mask as before"
    );
    // SAFETY: as NCCL calls it.
    unsafe { (t.finalize.unwrap())(ctx) };
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

    /// Random event sequences from many threads through the ABI: start, stop and record in any
    /// order, with unknown and stale handles, finalize mid-stream, several communicators at
    /// once. No crash, no deadlock (bounded time), and nothing left open once every context
    /// is finalized.
    #[test]
    fn random_sequences_from_many_threads(seed in any::<u64>(), threads in 2usize..8) {
        let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
        let t = table_v5();
        let began = Instant::now();
        let base = counters();
        let workers: Vec<_> = (0..threads as u64)
            .map(|k| {
                std::thread::spawn(move || {
                    let t = table_v5();
                    let mut x = seed ^ (k.wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1;
                    let mut next = move || {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x
                    };
                    let mut ctx = Ctx(init(t, 0x7000 + k % 3, k as c_int).0);
                    let mut mine: Vec<usize> = vec![];
                    for _ in 0..3000 {
                        let pick = |v: &Vec<usize>, r: u64| v[(r as usize) % v.len()] as *mut c_void;
                        match next() % 12 {
                            0..=2 => mine.push(start(t, ctx.0, &mut coll_descr(next() % 100, 1 + (next() % 3) as u8)) as usize),
                            3 | 4 if !mine.is_empty() => {
                                let p = pick(&mine, next());
                                mine.push(start(t, ctx.0, &mut channel_descr(p, 0, next() % 1000 + 1)) as usize);
                            }
                            // SAFETY (below): handles, stale or not, as NCCL might pass them.
                            // SAFETY: as above.
                            5 | 6 if !mine.is_empty() => unsafe { (t.stop_event.unwrap())(pick(&mine, next())); },
                            7 if !mine.is_empty() => channel_end(t, pick(&mine, next()), next() % 5000),
                            // SAFETY: as above.
                            8 => unsafe { (t.stop_event.unwrap())(next() as usize as *mut c_void); },
                            // SAFETY: as above.
                            9 => unsafe {
                                (t.record_event_state.unwrap())(next() as usize as *mut c_void, (next() % 32) as c_int, std::ptr::null_mut());
                            },
                            // SAFETY: as above.
                            10 if next() % 40 == 0 => unsafe {
                                (t.finalize.unwrap())(ctx.0);
                                ctx = Ctx(init(t, 0x7000 + k, k as c_int).0);
                            },
                            _ => {}
                        }
                        if mine.len() > 128 { mine.drain(..64); }
                    }
                    // SAFETY: as NCCL calls it.
                    unsafe { (t.finalize.unwrap())(ctx.0) };
                })
            })
            .collect();
        for w in workers { w.join().expect("no panic escapes the library"); }
        prop_assert!(began.elapsed() < Duration::from_secs(120), "bounded run time");
        let end = counters();
        prop_assert_eq!(end[OPEN_EVENTS], base[OPEN_EVENTS], "nothing left open");
        prop_assert_eq!(end[OPEN_CONTEXTS], base[OPEN_CONTEXTS]);
        prop_assert!(end[EVENTS_FOLLOWED] > base[EVENTS_FOLLOWED]);
        let _ = t;
    }
}
