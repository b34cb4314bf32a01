//! BPF maps over a shared segment: array, hash and per-CPU array, with the kernel's helper
//! semantics (lookup returns a pointer into the value; update with `BPF_ANY`, `BPF_NOEXIST`,
//! `BPF_EXIST`; delete).
//!
//! Layout of a segment (no pointers, offsets only; every field 8-byte aligned):
//!
//! ```text
//! header (64 B): magic, version, kind, key_size, value_size, max_entries, slots, ncpus,
//!                count (hash entries), lock (hash writers)
//! array:         max_entries × stride                  (stride = value_size rounded up to 8)
//! percpu_array:  ncpus × max_entries × stride
//! hash:          slots × (8 B state + key rounded to 8 + stride), slots = next_pow2(2 × max)
//! ```
//!
//! Lookups and updates of existing entries are lock-free; hash inserts and deletes take a
//! spin lock in the header (writers only). The owner never trusts the header it wrote: sizes
//! come from its private [`MapSpec`].

use crate::region::Region;
use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

pub const MAGIC: u64 = 0x3150_414d_4650_4250; // "BPFMAP1"
pub const VERSION: u32 = 1;
pub const HEADER: usize = 64;

const EMPTY: u32 = 0;
const FULL: u32 = 2;
const TOMBSTONE: u32 = 3;

/// Kernel helper flags for `map_update_elem`.
pub const BPF_ANY: u64 = 0;
pub const BPF_NOEXIST: u64 = 1;
pub const BPF_EXIST: u64 = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MapType {
    Hash,
    Array,
    PercpuArray,
}

impl MapType {
    pub fn code(self) -> u32 {
        match self {
            MapType::Hash => 1,
            MapType::Array => 2,
            MapType::PercpuArray => 6,
        }
    }
    pub fn from_code(c: u32) -> Option<MapType> {
        match c {
            1 => Some(MapType::Hash),
            2 => Some(MapType::Array),
            6 => Some(MapType::PercpuArray),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            MapType::Hash => "hash",
            MapType::Array => "array",
            MapType::PercpuArray => "percpu_array",
        }
    }
}

/// The shape of a map: two declarations share a map only if their shapes are equal.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MapSpec {
    pub name: String,
    pub kind: MapType,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
}

impl fmt::Display for MapSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (key {} B, value {} B, {} entries)",
            self.kind.name(),
            self.key_size,
            self.value_size,
            self.max_entries
        )
    }
}

/// Errors of map operations, with the kernel's errno for helpers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapError {
    NotFound,
    Exists,
    Full,
    BadKey,
    BadFlags,
}

impl MapError {
    /// The negative errno a helper returns.
    pub fn errno(self) -> i64 {
        -(match self {
            MapError::NotFound => libc::ENOENT,
            MapError::Exists => libc::EEXIST,
            MapError::Full => libc::E2BIG,
            MapError::BadKey | MapError::BadFlags => libc::EINVAL,
        } as i64)
    }
}

pub(crate) fn stride(value_size: u32) -> usize {
    (value_size as usize).div_ceil(8) * 8
}

pub(crate) fn key_stride(key_size: u32) -> usize {
    (key_size as usize).div_ceil(8) * 8
}

pub(crate) fn hash_slots(max_entries: u32) -> usize {
    (max_entries as usize * 2).next_power_of_two().max(8)
}

/// Number of per-CPU copies: the CPUs this process may run on (at most 256).
pub fn ncpus() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 256)
}

/// FNV-style mixing of the key, 8 bytes at a time (a short last word zero-padded). Processes
/// probe one segment together, so the values are part of the layout and must not change.
///
/// 4- and 8-byte keys (every key the shipped policies use) are read as one word: the generic
/// loop copies the key into a padded buffer and reads it back, a store-forwarding stall
/// (about 7 ns of a lookup here, with the comparison below).
#[inline]
fn hash_key(key: &[u8]) -> u64 {
    #[inline(always)]
    fn mix(h: u64, word: u64) -> u64 {
        let h = (h ^ word).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^ (h >> 29)
    }
    let h = 0xcbf2_9ce4_8422_2325 ^ key.len() as u64;
    if let Ok(k) = <[u8; 4]>::try_from(key) {
        return mix(h, u64::from(u32::from_le_bytes(k)));
    }
    if let Ok(k) = <[u8; 8]>::try_from(key) {
        return mix(h, u64::from_le_bytes(k));
    }
    key.chunks(8).fold(h, |h, c| {
        let mut b = [0u8; 8];
        b[..c.len()].copy_from_slice(c);
        mix(h, u64::from_le_bytes(b))
    })
}

/// `a == b` for two keys of one map; 4- and 8-byte keys compared as one word, not through
/// `memcmp`.
#[inline]
fn key_eq(a: &[u8], b: &[u8]) -> bool {
    match (<[u8; 4]>::try_from(a), <[u8; 4]>::try_from(b)) {
        (Ok(x), Ok(y)) => return u32::from_ne_bytes(x) == u32::from_ne_bytes(y),
        (Ok(_), Err(_)) | (Err(_), Ok(_)) => return false,
        _ => {}
    }
    if let (Ok(x), Ok(y)) = (<[u8; 8]>::try_from(a), <[u8; 8]>::try_from(b)) {
        return u64::from_ne_bytes(x) == u64::from_ne_bytes(y);
    }
    a == b
}

/// See [`Map::array_layout`]. The pointer stays valid as long as the map does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArrayLayout {
    pub values: *mut u8,
    pub max_entries: u32,
    pub stride: usize,
}

/// A map owned by this process.
pub struct Map {
    spec: MapSpec,
    region: Region,
    stride: usize,
    key_stride: usize,
    slots: usize,
    ncpus: usize,
}

// SAFETY: all shared state lives in the segment and is accessed through atomics or through
// raw pointers handed to BPF programs, as the kernel's maps are.
unsafe impl Send for Map {}
// SAFETY: as above.
unsafe impl Sync for Map {}

impl Map {
    /// Size in bytes of the segment for `spec`.
    pub fn segment_len(spec: &MapSpec, ncpus: usize) -> usize {
        let s = stride(spec.value_size);
        HEADER
            + match spec.kind {
                MapType::Array => spec.max_entries as usize * s,
                MapType::PercpuArray => ncpus * spec.max_entries as usize * s,
                MapType::Hash => hash_slots(spec.max_entries) * (8 + key_stride(spec.key_size) + s),
            }
    }

    /// [`segment_len`](Self::segment_len), or `None` where it does not fit a `usize` (a shape
    /// read from outside, e.g. a registry line, is not trusted to be one `create` accepted).
    pub fn checked_segment_len(spec: &MapSpec, ncpus: usize) -> Option<usize> {
        let s = stride(spec.value_size);
        let n = spec.max_entries as usize;
        let body = match spec.kind {
            MapType::Array => n.checked_mul(s)?,
            MapType::PercpuArray => ncpus.checked_mul(n)?.checked_mul(s)?,
            MapType::Hash => (n.checked_mul(2)?.checked_next_power_of_two()?.max(8)).checked_mul(
                8usize
                    .checked_add(key_stride(spec.key_size))?
                    .checked_add(s)?,
            )?,
        };
        HEADER.checked_add(body)
    }

    pub fn create(spec: MapSpec) -> std::io::Result<Map> {
        if spec.max_entries == 0 || spec.value_size == 0 || spec.key_size == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("map '{}': empty shape {spec}", spec.name),
            ));
        }
        if spec.kind != MapType::Hash && spec.key_size != 4 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "array maps take 4-byte keys",
            ));
        }
        let ncpus = if spec.kind == MapType::PercpuArray {
            ncpus()
        } else {
            1
        };
        let len = Map::segment_len(&spec, ncpus);
        let region = Region::create(&spec.name, len)?;
        let m = Map {
            stride: stride(spec.value_size),
            key_stride: key_stride(spec.key_size),
            slots: if spec.kind == MapType::Hash {
                hash_slots(spec.max_entries)
            } else {
                0
            },
            ncpus,
            spec,
            region,
        };
        m.write_header();
        Ok(m)
    }

    fn write_header(&self) {
        let w = |off: usize, v: u64| self.atomic_u64(off).store(v, Ordering::Relaxed);
        w(
            8,
            (u64::from(self.spec.kind.code()) << 32) | u64::from(VERSION),
        );
        w(
            16,
            (u64::from(self.spec.value_size) << 32) | u64::from(self.spec.key_size),
        );
        w(
            24,
            ((self.slots as u64) << 32) | u64::from(self.spec.max_entries),
        );
        w(32, self.ncpus as u64);
        self.atomic_u64(0).store(MAGIC, Ordering::Release);
    }

    fn atomic_u64(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off.is_multiple_of(8) && off + 8 <= self.region.len());
        // SAFETY: off is 8-aligned inside the mapping (page-aligned base), which lives as long
        // as self; all accesses to header words are atomic.
        unsafe { AtomicU64::from_ptr(self.region.base().add(off) as *mut u64) }
    }

    #[inline]
    fn atomic_u32(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off.is_multiple_of(4) && off + 4 <= self.region.len());
        // SAFETY: as atomic_u64, 4-aligned.
        unsafe { AtomicU32::from_ptr(self.region.base().add(off) as *mut u32) }
    }

    pub fn spec(&self) -> &MapSpec {
        &self.spec
    }

    pub fn fd(&self) -> i32 {
        self.region.fd()
    }

    pub fn ncpus(&self) -> usize {
        self.ncpus
    }

    fn count(&self) -> &AtomicU32 {
        self.atomic_u32(40)
    }

    fn lock(&self) -> HashLock<'_> {
        let l = self.atomic_u32(44);
        while l
            .compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        HashLock(l)
    }

    #[inline]
    fn ptr(&self, off: usize) -> *mut u8 {
        debug_assert!(off <= self.region.len());
        // SAFETY: callers compute offsets inside the segment from the private spec.
        unsafe { self.region.base().add(off) }
    }

    #[inline]
    fn array_key(&self, key: &[u8]) -> Option<usize> {
        let k = u32::from_le_bytes(key.get(..4)?.try_into().ok()?) as usize;
        (k < self.spec.max_entries as usize).then_some(k)
    }

    #[inline]
    fn slot_off(&self, slot: usize) -> usize {
        HEADER + slot * (8 + self.key_stride + self.stride)
    }

    #[inline]
    fn slot_key(&self, slot: usize) -> &[u8] {
        // SAFETY: the key bytes of a FULL slot are written once, before it is published with
        // Release; readers reach them after an Acquire load of the state.
        unsafe {
            std::slice::from_raw_parts(
                self.ptr(self.slot_off(slot) + 8),
                self.spec.key_size as usize,
            )
        }
    }

    #[inline]
    fn slot_state(&self, slot: usize) -> &AtomicU32 {
        self.atomic_u32(self.slot_off(slot))
    }

    /// Probes for `key`: `Ok(slot)` if present, `Err(first free slot on the probe path)`.
    #[inline]
    fn probe(&self, key: &[u8]) -> Result<usize, Option<usize>> {
        let mask = self.slots - 1;
        let mut i = hash_key(key) as usize & mask;
        let mut free = None;
        for _ in 0..self.slots {
            match self.slot_state(i).load(Ordering::Acquire) {
                EMPTY => return Err(free.or(Some(i))),
                FULL if key_eq(self.slot_key(i), key) => return Ok(i),
                TOMBSTONE if free.is_none() => free = Some(i),
                _ => {}
            }
            i = (i + 1) & mask;
        }
        Err(free)
    }

    /// The value for `key` (this CPU's copy for per-CPU maps), as the program sees it.
    #[inline]
    pub fn lookup_ptr(&self, key: &[u8]) -> Option<*mut u8> {
        if key.len() != self.spec.key_size as usize {
            return None;
        }
        match self.spec.kind {
            MapType::Array => self
                .array_key(key)
                .map(|k| self.ptr(HEADER + k * self.stride)),
            MapType::PercpuArray => {
                let k = self.array_key(key)?;
                Some(self.ptr(
                    HEADER
                        + (current_cpu() % self.ncpus * self.spec.max_entries as usize + k)
                            * self.stride,
                ))
            }
            MapType::Hash => self
                .probe(key)
                .ok()
                .map(|s| self.ptr(self.slot_off(s) + 8 + self.key_stride)),
        }
    }

    /// Where a plain array's values lie, for code that computes [`lookup_ptr`](Self::lookup_ptr)
    /// itself (the JIT's inline lookups): for a key `k` read as a little-endian `u32`, the
    /// value is at `values + k * stride` if `k < max_entries`, and there is none otherwise,
    /// exactly as `lookup_ptr` answers. `None` for hash and per-CPU maps (whose lookups
    /// depend on more than the key), and for a key size other than 4.
    pub fn array_layout(&self) -> Option<ArrayLayout> {
        (self.spec.kind == MapType::Array && self.spec.key_size == 4).then(|| ArrayLayout {
            values: self.ptr(HEADER),
            max_entries: self.spec.max_entries,
            stride: self.stride,
        })
    }

    /// `map_update_elem` with the kernel's flag semantics.
    pub fn update(&self, key: &[u8], value: &[u8], flags: u64) -> Result<(), MapError> {
        if key.len() != self.spec.key_size as usize || value.len() != self.spec.value_size as usize
        {
            return Err(MapError::BadKey);
        }
        // SAFETY: the slices hold key_size and value_size readable bytes (checked above).
        // (Bytes that may be this map's own values come through `update_raw`, as programs'.)
        unsafe { self.update_raw(key.as_ptr(), value.as_ptr(), flags) }
    }

    /// [`update`](Self::update) from raw pointers, which may point into this map's own values:
    /// a program's `bpf_map_update_elem(&m, k, bpf_map_lookup_elem(&m, k), ...)` passes the
    /// entry's own value (the kernel allows it), and the key may be a value of the same map.
    /// No reference to either is held while a value is written, and values are copied with
    /// `ptr::copy`, which allows the source and the destination to overlap (an entry updated
    /// from itself keeps its value).
    ///
    /// # Safety
    /// `key` points to `key_size` readable bytes and `value` to `value_size` readable bytes,
    /// valid for the call (stack, or values of a live map).
    pub unsafe fn update_raw(
        &self,
        key: *const u8,
        value: *const u8,
        flags: u64,
    ) -> Result<(), MapError> {
        if flags > BPF_EXIST {
            return Err(MapError::BadFlags);
        }
        let (ks, vs) = (self.spec.key_size as usize, self.spec.value_size as usize);
        // SAFETY: (each use, a temporary) `key` holds key_size readable bytes (the caller's
        // contract); the slice is gone before anything is written.
        let key_bytes = || unsafe { std::slice::from_raw_parts(key, ks) };
        let write = |dst: *mut u8| {
            // SAFETY: dst points to a value of value_size bytes inside the segment; `value` to
            // value_size readable bytes, which may be those same bytes (an overlapping copy).
            unsafe { std::ptr::copy(value, dst, vs) }
        };
        match self.spec.kind {
            MapType::Array | MapType::PercpuArray => {
                if flags == BPF_NOEXIST {
                    return Err(MapError::Exists);
                }
                let dst = self.lookup_ptr(key_bytes()).ok_or(MapError::BadKey)?;
                write(dst);
                Ok(())
            }
            MapType::Hash => {
                if let Ok(s) = self.probe(key_bytes()) {
                    if flags == BPF_NOEXIST {
                        return Err(MapError::Exists);
                    }
                    write(self.ptr(self.slot_off(s) + 8 + self.key_stride));
                    return Ok(());
                }
                if flags == BPF_EXIST {
                    return Err(MapError::NotFound);
                }
                let _g = self.lock();
                match self.probe(key_bytes()) {
                    Ok(s) => {
                        write(self.ptr(self.slot_off(s) + 8 + self.key_stride));
                        Ok(())
                    }
                    Err(free) => {
                        if self.count().load(Ordering::Relaxed) >= self.spec.max_entries {
                            return Err(MapError::Full);
                        }
                        let s = free.ok_or(MapError::Full)?;
                        let off = self.slot_off(s);
                        // SAFETY: the slot is EMPTY or TOMBSTONE and we hold the writer lock,
                        // so no one else writes it; readers ignore it until FULL is published.
                        // `key` may lie in a value of this map (the freed slot's own, even),
                        // never in a key area: `copy` allows the overlap anyway.
                        unsafe { std::ptr::copy(key, self.ptr(off + 8), ks) };
                        write(self.ptr(off + 8 + self.key_stride));
                        self.count().fetch_add(1, Ordering::Relaxed);
                        self.slot_state(s).store(FULL, Ordering::Release);
                        Ok(())
                    }
                }
            }
        }
    }

    /// `map_delete_elem`: arrays cannot delete (`-EINVAL`), as in the kernel.
    pub fn delete(&self, key: &[u8]) -> Result<(), MapError> {
        if self.spec.kind != MapType::Hash {
            return Err(MapError::BadKey);
        }
        if key.len() != self.spec.key_size as usize {
            return Err(MapError::BadKey);
        }
        let _g = self.lock();
        let s = self.probe(key).map_err(|_| MapError::NotFound)?;
        self.slot_state(s).store(TOMBSTONE, Ordering::Release);
        self.count().fetch_sub(1, Ordering::Relaxed);
        Ok(())
    }

    /// A copy of the value for `key` (per-CPU maps: this CPU's copy).
    pub fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        let p = self.lookup_ptr(key)?;
        let mut v = vec![0u8; self.spec.value_size as usize];
        // SAFETY: p points to value_size bytes in the segment.
        unsafe { std::ptr::copy_nonoverlapping(p, v.as_mut_ptr(), v.len()) };
        Some(v)
    }

    /// Every entry with its values (one per CPU for per-CPU maps), hash entries in slot order.
    pub fn entries(&self) -> Vec<(Vec<u8>, Vec<Vec<u8>>)> {
        let vs = self.spec.value_size as usize;
        let copy = |p: *const u8| {
            let mut v = vec![0u8; vs];
            // SAFETY: p points to a value of value_size bytes inside the segment.
            unsafe { std::ptr::copy_nonoverlapping(p, v.as_mut_ptr(), vs) };
            v
        };
        let n = self.spec.max_entries as usize;
        match self.spec.kind {
            MapType::Array => (0..n)
                .map(|k| {
                    (
                        (k as u32).to_le_bytes().to_vec(),
                        vec![copy(self.ptr(HEADER + k * self.stride))],
                    )
                })
                .collect(),
            MapType::PercpuArray => (0..n)
                .map(|k| {
                    let per = (0..self.ncpus)
                        .map(|c| copy(self.ptr(HEADER + (c * n + k) * self.stride)))
                        .collect();
                    ((k as u32).to_le_bytes().to_vec(), per)
                })
                .collect(),
            MapType::Hash => (0..self.slots)
                .filter(|&s| self.slot_state(s).load(Ordering::Acquire) == FULL)
                .map(|s| {
                    (
                        self.slot_key(s).to_vec(),
                        vec![copy(self.ptr(self.slot_off(s) + 8 + self.key_stride))],
                    )
                })
                .collect(),
        }
    }

    /// Number of live entries (hash), or max_entries (arrays).
    pub fn len(&self) -> usize {
        match self.spec.kind {
            MapType::Hash => self.count().load(Ordering::Relaxed) as usize,
            _ => self.spec.max_entries as usize,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Address range of the segment (for checking interpreters).
    pub fn memory(&self) -> (usize, usize) {
        (self.region.base() as usize, self.region.len())
    }

    /// Copies every value region the program may touch: `(start, len)` pairs.
    pub fn value_ranges(&self) -> Vec<(usize, usize)> {
        let base = self.region.base() as usize;
        let vs = self.spec.value_size as usize;
        match self.spec.kind {
            MapType::Array => (0..self.spec.max_entries as usize)
                .map(|k| (base + HEADER + k * self.stride, vs))
                .collect(),
            MapType::PercpuArray => (0..self.ncpus * self.spec.max_entries as usize)
                .map(|k| (base + HEADER + k * self.stride, vs))
                .collect(),
            MapType::Hash => (0..self.slots)
                .map(|s| (base + self.slot_off(s) + 8 + self.key_stride, vs))
                .collect(),
        }
    }
}

impl fmt::Debug for Map {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Map({} {})", self.spec.name, self.spec)
    }
}

struct HashLock<'a>(&'a AtomicU32);

impl Drop for HashLock<'_> {
    fn drop(&mut self) {
        self.0.store(0, Ordering::Release);
    }
}

fn current_cpu() -> usize {
    // SAFETY: sched_getcpu has no preconditions.
    let c = unsafe { libc::sched_getcpu() };
    if c < 0 { 0 } else { c as usize }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: MapType, k: u32, v: u32, n: u32) -> MapSpec {
        MapSpec {
            name: "t".into(),
            kind,
            key_size: k,
            value_size: v,
            max_entries: n,
        }
    }

    #[test]
    fn array_layout_is_what_lookup_answers() {
        for (vs, n) in [(1, 1), (4, 3), (8, 4), (12, 5), (20, 2), (64, 7)] {
            let m = Map::create(spec(MapType::Array, 4, vs, n)).unwrap();
            let l = m.array_layout().unwrap();
            assert_eq!((l.max_entries, l.stride), (n, stride(vs)));
            for k in (0..n + 3).chain([u32::MAX - 1, u32::MAX, 1 << 31]) {
                let want = m.lookup_ptr(&k.to_le_bytes());
                let got = (k < l.max_entries).then(|| l.values.wrapping_add(k as usize * l.stride));
                assert_eq!(got, want, "value size {vs}, {n} entries, key {k}");
            }
        }
        for kind in [MapType::Hash, MapType::PercpuArray] {
            assert!(
                Map::create(spec(kind, 4, 8, 4))
                    .unwrap()
                    .array_layout()
                    .is_none()
            );
        }
    }

    #[test]
    fn array_semantics() {
        let m = Map::create(spec(MapType::Array, 4, 12, 3)).unwrap();
        assert_eq!(
            m.get(&1u32.to_le_bytes()),
            Some(vec![0; 12]),
            "arrays start zeroed"
        );
        m.update(&2u32.to_le_bytes(), &[7; 12], BPF_ANY).unwrap();
        assert_eq!(m.get(&2u32.to_le_bytes()), Some(vec![7; 12]));
        assert_eq!(
            m.update(&2u32.to_le_bytes(), &[1; 12], BPF_NOEXIST),
            Err(MapError::Exists)
        );
        assert_eq!(
            m.update(&3u32.to_le_bytes(), &[1; 12], BPF_ANY),
            Err(MapError::BadKey),
            "index past the end"
        );
        assert!(m.lookup_ptr(&3u32.to_le_bytes()).is_none());
        assert_eq!(m.delete(&0u32.to_le_bytes()), Err(MapError::BadKey));
        assert_eq!(
            m.update(&0u32.to_le_bytes(), &[1; 11], BPF_ANY),
            Err(MapError::BadKey)
        );
    }

    #[test]
    fn hash_values_are_the_layouts() {
        // The generic loop, as the segment layout defines the hash (other processes probe
        // the same slots).
        fn reference(key: &[u8]) -> u64 {
            let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ key.len() as u64;
            for c in key.chunks(8) {
                let mut b = [0u8; 8];
                b[..c.len()].copy_from_slice(c);
                h = (h ^ u64::from_le_bytes(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                h ^= h >> 29;
            }
            h
        }
        let bytes: Vec<u8> = (0..40u8).map(|i| i.wrapping_mul(151) ^ 0xa5).collect();
        for len in 1..=bytes.len() {
            for start in 0..bytes.len() - len + 1 {
                let k = &bytes[start..start + len];
                assert_eq!(hash_key(k), reference(k), "{k:?}");
                for other in [
                    k.to_vec(),
                    {
                        let mut o = k.to_vec();
                        o[len - 1] ^= 1;
                        o
                    },
                    {
                        let mut o = k.to_vec();
                        o[0] ^= 0x80;
                        o
                    },
                ] {
                    assert_eq!(key_eq(k, &other), k == &other[..]);
                }
                if len < bytes.len() {
                    assert!(
                        !key_eq(k, &bytes[..len + 1]),
                        "keys of other lengths differ"
                    );
                }
            }
        }
        // A value pinned: key 1 of a 4-byte-key map.
        assert_eq!(hash_key(&1u32.to_le_bytes()), 0xe1a6322d6a21f0f3);
    }

    #[test]
    fn hash_semantics() {
        let m = Map::create(spec(MapType::Hash, 6, 8, 4)).unwrap();
        let k = |i: u8| [i, 1, 2, 3, 4, 5];
        assert_eq!(m.update(&k(1), &[1; 8], BPF_EXIST), Err(MapError::NotFound));
        for i in 0..4 {
            m.update(&k(i), &[i; 8], BPF_NOEXIST).unwrap();
        }
        assert_eq!(m.update(&k(9), &[9; 8], BPF_ANY), Err(MapError::Full));
        assert_eq!(m.update(&k(2), &[2; 8], BPF_NOEXIST), Err(MapError::Exists));
        m.update(&k(2), &[22; 8], BPF_EXIST).unwrap();
        assert_eq!(m.get(&k(2)), Some(vec![22; 8]));
        assert_eq!(m.len(), 4);
        m.delete(&k(2)).unwrap();
        assert_eq!(m.delete(&k(2)), Err(MapError::NotFound));
        assert!(m.get(&k(2)).is_none());
        m.update(&k(9), &[9; 8], BPF_ANY).unwrap();
        assert_eq!(m.get(&k(9)), Some(vec![9; 8]));
        for i in [0, 1, 3] {
            assert_eq!(m.get(&k(i)), Some(vec![i; 8]), "survives tombstones");
        }
        assert_eq!(MapError::Full.errno(), -(libc::E2BIG as i64));
    }

    #[test]
    fn hash_against_a_model() {
        use std::collections::HashMap;
        let m = Map::create(spec(MapType::Hash, 4, 8, 64)).unwrap();
        let mut model: HashMap<u32, u64> = HashMap::new();
        let mut x = 12345u64;
        for _ in 0..20_000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            let key = (x >> 40) as u32 % 100;
            let val = x >> 7;
            match (x >> 20) % 4 {
                0 => {
                    let r = m.delete(&key.to_le_bytes());
                    assert_eq!(r.is_ok(), model.remove(&key).is_some());
                }
                1 => {
                    let r = m.update(&key.to_le_bytes(), &val.to_le_bytes(), BPF_NOEXIST);
                    if model.contains_key(&key) {
                        assert_eq!(r, Err(MapError::Exists));
                    } else if model.len() >= 64 {
                        assert_eq!(r, Err(MapError::Full));
                    } else {
                        r.unwrap();
                        model.insert(key, val);
                    }
                }
                _ => {
                    let got = m
                        .get(&key.to_le_bytes())
                        .map(|v| u64::from_le_bytes(v.try_into().unwrap()));
                    assert_eq!(got, model.get(&key).copied());
                }
            }
            assert_eq!(m.len(), model.len());
        }
    }

    #[test]
    fn percpu_has_a_copy_per_cpu() {
        let m = Map::create(spec(MapType::PercpuArray, 4, 8, 2)).unwrap();
        assert_eq!(m.value_ranges().len(), 2 * m.ncpus());
        m.update(&1u32.to_le_bytes(), &5u64.to_le_bytes(), BPF_ANY)
            .unwrap();
    }
}
