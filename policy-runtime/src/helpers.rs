//! Helpers callable from policies, with the C ABI the JIT calls them with.
//!
//! The verifier proved each argument's type before a program could run: `map` is the address
//! of a live [`Map`] (patched into the program's `lddw` at load), keys and values point to
//! `key_size` / `value_size` readable bytes. Helpers never panic.

use policy_verifier::platform::{
    HELPER_GET_SMP_PROCESSOR_ID, HELPER_KTIME_GET_NS, HELPER_MAP_DELETE, HELPER_MAP_LOOKUP,
    HELPER_MAP_UPDATE,
};
use shared_maps::Map;

pub type HelperFn = extern "C" fn(u64, u64, u64, u64, u64) -> u64;

fn map<'a>(m: u64) -> &'a Map {
    // SAFETY: the verifier only lets a map pointer (the address of an Arc<Map> the program
    // holds) reach argument 1 of map helpers.
    unsafe { &*(m as *const Map) }
}

fn bytes<'a>(p: u64, len: u32) -> &'a [u8] {
    // SAFETY: the verifier proved `p` points to `len` initialized bytes (stack or map value).
    unsafe { std::slice::from_raw_parts(p as *const u8, len as usize) }
}

pub extern "C" fn map_lookup_elem(m: u64, key: u64, _: u64, _: u64, _: u64) -> u64 {
    let m = map(m);
    m.lookup_ptr(bytes(key, m.spec().key_size))
        .map_or(0, |p| p as u64)
}

pub extern "C" fn map_update_elem(m: u64, key: u64, value: u64, flags: u64, _: u64) -> u64 {
    let m = map(m);
    // SAFETY: the verifier proved `key` and `value` point to key_size and value_size
    // initialized bytes (stack or map values). The value may be an entry of this very map
    // (`update(&m, k, lookup(&m, k))`): `update_raw` holds no reference to it while it writes
    // and copies with overlap allowed.
    match unsafe { m.update_raw(key as *const u8, value as *const u8, flags) } {
        Ok(()) => 0,
        Err(e) => e.errno() as u64,
    }
}

pub extern "C" fn map_delete_elem(m: u64, key: u64, _: u64, _: u64, _: u64) -> u64 {
    let m = map(m);
    match m.delete(bytes(key, m.spec().key_size)) {
        Ok(()) => 0,
        Err(e) => e.errno() as u64,
    }
}

pub extern "C" fn ktime_get_ns(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub extern "C" fn get_smp_processor_id(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    // SAFETY: no preconditions.
    let c = unsafe { libc::sched_getcpu() };
    c.max(0) as u64
}

/// The helper with id `id`.
pub fn by_id(id: i32) -> Option<HelperFn> {
    Some(match id {
        HELPER_MAP_LOOKUP => map_lookup_elem,
        HELPER_MAP_UPDATE => map_update_elem,
        HELPER_MAP_DELETE => map_delete_elem,
        HELPER_KTIME_GET_NS => ktime_get_ns,
        HELPER_GET_SMP_PROCESSOR_ID => get_smp_processor_id,
        _ => return None,
    })
}
