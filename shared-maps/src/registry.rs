//! The per-process registry of maps, and read-only views of another process's maps.
//!
//! Maps with the same name declared by several programs in one process are one map when the
//! declarations agree in every property of their [`MapIdentity`] (shape, scope, epoch source,
//! reduction, read-only, global data: what each program was verified against); the same name
//! with any property different is an error naming both declarations and the property
//! ([`RegistryError::Conflict`]). Every program's maps are bound through
//! [`declare`](Registry::declare) (or checked first by [`check`](Registry::check)): the net
//! plugin's, the tuner's and the profiler's at start (`NCCL_BPF_POLICY`), a reload's and a staged
//! tuner swap's. A map stays in the registry for the process's life, with the identity of its
//! first declaration, also once no program uses it: its contents were written under that
//! identity. Global-data maps
//! (`.rodata`, `.data`, `.bss`) are private to their program. Names starting with
//! [`RUNTIME_PREFIX`] (`ncclbpf_`) belong to the plugin itself ([`Registry::runtime`], e.g. the
//! tuner's `ncclbpf_decisions`): a program cannot declare one, so no policy can bind, read or
//! write the plugin's own records.
//!
//! For outside readers the registry writes `<dir>/<pid>.maps` (directory
//! `$NCCL_BPF_SHM_DIR`, default `/dev/shm/ncclbpf-<uid>`, mode 0700; file mode 0600), one line
//! per map: `fd kind key_size value_size max_entries ncpus name`. A reader maps
//! `/proc/<pid>/fd/<fd>` read-only and checks the segment header against the line. Segments
//! vanish with their process; a registry file whose process is gone is removed by the next
//! process that publishes or by a reader that finds it.

use crate::identity::{Difference, MapIdentity};
use crate::map::{HEADER, MAGIC, Map, MapSpec, MapType, VERSION, hash_slots, key_stride, stride};
use crate::region::ReadOnlyRegion;
use std::collections::HashMap;
use std::fmt;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// Two declarations of one map name that differ in a property of their [`MapIdentity`].
#[derive(Debug)]
pub struct Conflict {
    pub name: String,
    pub existing: MapIdentity,
    pub existing_owner: String,
    pub new: MapIdentity,
    pub new_owner: String,
    /// The first property that differs (`this`: the new declaration's value).
    pub differs: Difference,
}

/// Map names starting with this belong to the plugin ([`Registry::runtime`]); programs cannot
/// declare them.
pub const RUNTIME_PREFIX: &str = "ncclbpf_";

#[derive(Debug)]
pub enum RegistryError {
    /// Same name, a different identity (shape, scope, epoch source, reduction, ...).
    Conflict(Box<Conflict>),
    /// A program declared a name reserved for the plugin's own maps.
    Reserved {
        name: String,
        owner: String,
    },
    Create {
        name: String,
        source: io::Error,
    },
}

impl fmt::Display for RegistryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegistryError::Conflict(c) => write!(
                f,
                "map '{}' declared as {} by '{}' but already exists as {} (declared by '{}'): \
                 its {} differs ({} here, {} there); two declarations are one map only if shape, \
                 scope, epoch source and reduction all agree: declare it alike or rename one",
                c.name,
                c.new,
                c.new_owner,
                c.existing,
                c.existing_owner,
                c.differs.property,
                c.differs.this,
                c.differs.other
            ),
            RegistryError::Create { name, source } => {
                write!(f, "map '{name}': cannot create shared memory: {source}")
            }
            RegistryError::Reserved { name, owner } => write!(
                f,
                "map '{name}' declared by '{owner}': names starting with '{RUNTIME_PREFIX}' are \
                 reserved for the plugin's own maps; rename the map"
            ),
        }
    }
}

impl std::error::Error for RegistryError {}

struct Entry {
    map: Arc<Map>,
    /// The first declaration's identity, which every later one must match.
    identity: MapIdentity,
    owner: String,
}

#[derive(Default)]
struct Inner {
    shared: HashMap<String, Entry>,
    private: Vec<(String, Weak<Map>)>,
    /// The plugin's own maps ([`Registry::runtime`]), kept for the process's life.
    runtime: HashMap<String, Arc<Map>>,
}

/// Programs may not declare the plugin's names, and global data is private to its program.
fn not_shared(id: &MapIdentity, owner: &str) -> Result<(), RegistryError> {
    let name = &id.spec.name;
    if name.starts_with(RUNTIME_PREFIX) {
        return Err(RegistryError::Reserved {
            name: name.clone(),
            owner: owner.to_string(),
        });
    }
    if id.global_data {
        return Err(RegistryError::Create {
            name: name.clone(),
            source: io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("global data of '{owner}' is private to its program, never shared"),
            ),
        });
    }
    Ok(())
}

pub struct Registry {
    inner: Mutex<Inner>,
    dir: PathBuf,
}

/// Where registry files live.
pub fn registry_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("NCCL_BPF_SHM_DIR") {
        return PathBuf::from(d);
    }
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    PathBuf::from(format!("/dev/shm/ncclbpf-{uid}"))
}

/// Whether process `pid` exists (it may belong to another user).
pub fn pid_alive(pid: u32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

impl Registry {
    pub fn new(dir: PathBuf) -> Registry {
        Registry {
            inner: Mutex::new(Inner::default()),
            dir,
        }
    }

    /// The process-wide registry.
    pub fn global() -> &'static Registry {
        static R: OnceLock<Registry> = OnceLock::new();
        R.get_or_init(|| Registry::new(registry_dir()))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The shared map `id` declares (by its name), created on first use; a map of that name
    /// that exists must have the same identity ([`MapIdentity::difference`]), or this is a
    /// [`RegistryError::Conflict`] naming `owner` and the existing map's first declarer.
    /// Global data is never shared ([`private`](Self::private)).
    pub fn declare(&self, id: &MapIdentity, owner: &str) -> Result<Arc<Map>, RegistryError> {
        let spec = &id.spec;
        not_shared(id, owner)?;
        let mut inner = self.lock();
        if let Some(e) = inner.shared.get(&spec.name) {
            conflict(e, id, owner)?;
            return Ok(e.map.clone());
        }
        let map = Arc::new(
            Map::create(spec.clone()).map_err(|source| RegistryError::Create {
                name: spec.name.clone(),
                source,
            })?,
        );
        inner.shared.insert(
            spec.name.clone(),
            Entry {
                map: map.clone(),
                identity: id.clone(),
                owner: owner.to_string(),
            },
        );
        self.publish(&inner);
        Ok(map)
    }

    /// Whether [`declare`](Self::declare) would succeed (the same error if not), without
    /// creating anything.
    pub fn check(&self, id: &MapIdentity, owner: &str) -> Result<(), RegistryError> {
        not_shared(id, owner)?;
        match self.lock().shared.get(&id.spec.name) {
            Some(e) => conflict(e, id, owner),
            None => Ok(()),
        }
    }

    /// [`declare`](Self::declare) of a plain map ([`MapIdentity::plain`]: rank-local, no epoch
    /// source).
    pub fn shared(&self, spec: &MapSpec, owner: &str) -> Result<Arc<Map>, RegistryError> {
        self.declare(&MapIdentity::plain(spec.clone()), owner)
    }

    /// [`check`](Self::check) of a plain map.
    pub fn check_shared(&self, spec: &MapSpec, owner: &str) -> Result<(), RegistryError> {
        self.check(&MapIdentity::plain(spec.clone()), owner)
    }

    /// The identity the shared map `name` was first declared with, and by whom.
    pub fn identity(&self, name: &str) -> Option<(MapIdentity, String)> {
        self.lock()
            .shared
            .get(name)
            .map(|e| (e.identity.clone(), e.owner.clone()))
    }

    /// A map private to one program (global data); listed for readers while it lives.
    pub fn private(&self, spec: &MapSpec, owner: &str) -> Result<Arc<Map>, RegistryError> {
        let map = Arc::new(
            Map::create(spec.clone()).map_err(|source| RegistryError::Create {
                name: spec.name.clone(),
                source,
            })?,
        );
        let mut inner = self.lock();
        inner.private.retain(|(_, w)| w.strong_count() > 0);
        inner
            .private
            .push((format!("{owner}:{}", spec.name), Arc::downgrade(&map)));
        self.publish(&inner);
        Ok(map)
    }

    /// One of the plugin's own maps (its name starts with [`RUNTIME_PREFIX`]), created on first
    /// use and listed for outside readers under its name like a shared map; programs never see
    /// it. The same name with another shape is a [`RegistryError::Conflict`].
    pub fn runtime(&self, spec: &MapSpec) -> Result<Arc<Map>, RegistryError> {
        const OWNER: &str = "ncclbpf";
        let mut inner = self.lock();
        if let Some(m) = inner.runtime.get(&spec.name) {
            let (old, new) = (
                MapIdentity::plain(m.spec().clone()),
                MapIdentity::plain(spec.clone()),
            );
            return match new.difference(&old) {
                None => Ok(m.clone()),
                Some(differs) => Err(RegistryError::Conflict(Box::new(Conflict {
                    name: spec.name.clone(),
                    existing: old,
                    existing_owner: OWNER.into(),
                    new,
                    new_owner: OWNER.into(),
                    differs,
                }))),
            };
        }
        if !spec.name.starts_with(RUNTIME_PREFIX) {
            return Err(RegistryError::Create {
                name: spec.name.clone(),
                source: io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("the plugin's maps are named {RUNTIME_PREFIX}*"),
                ),
            });
        }
        let map = Arc::new(
            Map::create(spec.clone()).map_err(|source| RegistryError::Create {
                name: spec.name.clone(),
                source,
            })?,
        );
        inner.runtime.insert(spec.name.clone(), map.clone());
        self.publish(&inner);
        Ok(map)
    }

    /// Every shared map, by name.
    pub fn shared_maps(&self) -> Vec<Arc<Map>> {
        self.lock().shared.values().map(|e| e.map.clone()).collect()
    }

    fn publish(&self, inner: &Inner) {
        // Best effort: a registry that cannot be written only hides maps from outside readers.
        let _ = self.try_publish(inner);
    }

    fn try_publish(&self, inner: &Inner) -> io::Result<()> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)?;
        cleanup_stale(&self.dir);
        let pid = std::process::id();
        let mut text = String::new();
        let mut line = |name: &str, m: &Map| {
            let s = m.spec();
            text.push_str(&format!(
                "{} {} {} {} {} {} {}\n",
                m.fd(),
                s.kind.code(),
                s.key_size,
                s.value_size,
                s.max_entries,
                m.ncpus(),
                name
            ));
        };
        for (name, e) in &inner.shared {
            line(name, &e.map);
        }
        for (name, m) in &inner.runtime {
            line(name, m);
        }
        for (name, w) in &inner.private {
            if let Some(m) = w.upgrade() {
                line(name, &m);
            }
        }
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let tmp = self.dir.join(format!(
            ".{pid}.{}.tmp",
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        std::fs::rename(&tmp, self.dir.join(format!("{pid}.maps")))
    }
}

fn conflict(e: &Entry, id: &MapIdentity, owner: &str) -> Result<(), RegistryError> {
    compare(&e.identity, &e.owner, id, owner)
}

/// The one comparison of a declaration (`new`, by `new_owner`) with an existing one of the same
/// name: a [`RegistryError::Conflict`] naming both and the first property that differs, unless
/// they are the same map. The registry makes it for every binding; loaders make it between the
/// objects listed together before loading any (`policy_runtime::setting::declaration_conflicts`).
pub fn compare(
    existing: &MapIdentity,
    existing_owner: &str,
    new: &MapIdentity,
    new_owner: &str,
) -> Result<(), RegistryError> {
    let Some(differs) = new.difference(existing) else {
        return Ok(());
    };
    Err(RegistryError::Conflict(Box::new(Conflict {
        name: new.spec.name.clone(),
        existing: existing.clone(),
        existing_owner: existing_owner.to_string(),
        new: new.clone(),
        new_owner: new_owner.to_string(),
        differs,
    })))
}

fn cleanup_stale(dir: &std::path::Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(pid) = name
            .strip_suffix(".maps")
            .and_then(|p| p.parse::<u32>().ok())
            && !pid_alive(pid)
        {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// A read-only view of one map of another process.
pub struct MapView {
    pub name: String,
    pub spec: MapSpec,
    pub ncpus: usize,
    region: ReadOnlyRegion,
}

impl MapView {
    /// Opens every map process `pid` registered.
    pub fn open_all(pid: u32) -> io::Result<Vec<MapView>> {
        MapView::open_all_in(&registry_dir(), pid)
    }

    pub fn open_all_in(dir: &std::path::Path, pid: u32) -> io::Result<Vec<MapView>> {
        let path = dir.join(format!("{pid}.maps"));
        if !pid_alive(pid) {
            let _ = std::fs::remove_file(&path);
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("process {pid} is gone"),
            ));
        }
        let text = std::fs::read_to_string(&path)?;
        let mut out = Vec::new();
        for line in text.lines() {
            let f: Vec<&str> = line.splitn(7, ' ').collect();
            let bad = || {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("bad registry line {line:?}"),
                )
            };
            if f.len() != 7 {
                return Err(bad());
            }
            let num = |i: usize| f[i].parse::<u64>().map_err(|_| bad());
            let kind = MapType::from_code(num(1)? as u32).ok_or_else(bad)?;
            let spec = MapSpec {
                name: f[6].to_string(),
                kind,
                key_size: num(2)? as u32,
                value_size: num(3)? as u32,
                max_entries: num(4)? as u32,
            };
            let ncpus = (num(5)? as usize).clamp(1, 256);
            // The line is not trusted: a size that overflows is refused, not wrapped.
            let need = Map::checked_segment_len(&spec, ncpus).ok_or_else(bad)?;
            let region = ReadOnlyRegion::open(pid, num(0)? as i32, need)?;
            let v = MapView {
                name: spec.name.clone(),
                spec,
                ncpus,
                region,
            };
            v.check_header()?;
            out.push(v);
        }
        Ok(out)
    }

    fn word(&self, off: usize) -> u64 {
        let b = self.region.bytes();
        let p = b[off..off + 8].as_ptr() as *mut u64;
        // SAFETY: off is 8-aligned inside the mapping; the owner writes these words
        // concurrently, so read them atomically.
        unsafe { AtomicU64::from_ptr(p) }.load(Ordering::Acquire)
    }

    /// Word `w` (little-endian `u64` at byte `8 * w`) of entry `index` of an array map, read
    /// atomically; `None` for another kind of map or outside the entry.
    pub fn array_word(&self, index: u32, w: usize) -> Option<u64> {
        let s = &self.spec;
        if s.kind != MapType::Array || index >= s.max_entries || (w + 1) * 8 > stride(s.value_size)
        {
            return None;
        }
        Some(self.word(HEADER + index as usize * stride(s.value_size) + w * 8))
    }

    fn check_header(&self) -> io::Result<()> {
        let s = &self.spec;
        let ok = self.word(0) == MAGIC
            && self.word(8) == (u64::from(s.kind.code()) << 32) | u64::from(VERSION)
            && self.word(16) == (u64::from(s.value_size) << 32) | u64::from(s.key_size);
        if ok {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "map '{}': segment header does not match the registry",
                    self.name
                ),
            ))
        }
    }

    fn copy(&self, off: usize, len: usize) -> Vec<u8> {
        // Word-wise atomic copy (the owner may be writing), then trim.
        let words = len.div_ceil(8);
        let mut out = Vec::with_capacity(words * 8);
        for w in 0..words {
            out.extend_from_slice(&self.word(off + w * 8).to_le_bytes());
        }
        out.truncate(len);
        out
    }

    /// Every entry: key and values (one per CPU for per-CPU maps).
    pub fn entries(&self) -> Vec<(Vec<u8>, Vec<Vec<u8>>)> {
        let s = &self.spec;
        let st = stride(s.value_size);
        let vs = s.value_size as usize;
        match s.kind {
            MapType::Array => (0..s.max_entries as usize)
                .map(|k| {
                    (
                        (k as u32).to_le_bytes().to_vec(),
                        vec![self.copy(HEADER + k * st, vs)],
                    )
                })
                .collect(),
            MapType::PercpuArray => (0..s.max_entries as usize)
                .map(|k| {
                    let per = (0..self.ncpus)
                        .map(|c| self.copy(HEADER + (c * s.max_entries as usize + k) * st, vs))
                        .collect();
                    ((k as u32).to_le_bytes().to_vec(), per)
                })
                .collect(),
            MapType::Hash => {
                let ks = key_stride(s.key_size);
                (0..hash_slots(s.max_entries))
                    .filter_map(|slot| {
                        let off = HEADER + slot * (8 + ks + st);
                        ((self.word(off) & 0xffff_ffff) as u32 == 2).then(|| {
                            (
                                self.copy(off + 8, s.key_size as usize),
                                vec![self.copy(off + 8 + ks, vs)],
                            )
                        })
                    })
                    .collect()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, kind: MapType, v: u32) -> MapSpec {
        MapSpec {
            name: name.into(),
            kind,
            key_size: 4,
            value_size: v,
            max_entries: 8,
        }
    }

    fn scratch() -> PathBuf {
        static N: AtomicU64 = AtomicU64::new(0);
        let d = std::env::temp_dir().join(format!(
            "ncclbpf-reg-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn same_shape_shares_different_shape_fails() {
        let r = Registry::new(scratch());
        let a = r
            .shared(&spec("counts", MapType::Array, 8), "policy_a")
            .unwrap();
        let b = r
            .shared(&spec("counts", MapType::Array, 8), "policy_b")
            .unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        let checked = r
            .check_shared(&spec("counts", MapType::Hash, 16), "policy_c")
            .unwrap_err()
            .to_string();
        r.check_shared(&spec("counts", MapType::Array, 8), "policy_c")
            .unwrap();
        r.check_shared(&spec("fresh", MapType::Array, 8), "policy_c")
            .unwrap();
        assert_eq!(r.shared_maps().len(), 1, "a check creates nothing");
        let e = r
            .shared(&spec("counts", MapType::Hash, 16), "policy_c")
            .unwrap_err();
        let msg = e.to_string();
        assert_eq!(checked, msg, "a check fails as binding would");
        assert!(
            msg.contains("policy_a") && msg.contains("policy_c") && msg.contains("counts"),
            "{msg}"
        );
    }

    /// Scope is part of a map's identity: a config map and a plain map of the same shape are
    /// not one map (before, the shape alone decided).
    #[test]
    fn scope_and_source_are_part_of_identity() {
        use crate::identity::{MapReduce, MapScope};
        let r = Registry::new(scratch());
        let config = MapIdentity {
            scope: MapScope::Config,
            ..MapIdentity::plain(spec("thresholds", MapType::Array, 8))
        };
        let a = r.declare(&config, "a.o (tuner program 'pick')").unwrap();
        assert!(Arc::ptr_eq(&a, &r.declare(&config, "c.o").unwrap()));
        let plain = spec("thresholds", MapType::Array, 8);
        for e in [
            r.shared(&plain, "b.o (net/isend program 'count')")
                .unwrap_err(),
            r.check_shared(&plain, "b.o (net/isend program 'count')")
                .unwrap_err(),
        ] {
            let msg = e.to_string();
            let RegistryError::Conflict(c) = e else {
                panic!("{msg}")
            };
            assert_eq!(c.differs.property, "scope");
            assert!(
                msg.contains("a.o (tuner program 'pick')")
                    && msg.contains("b.o (net/isend program 'count')")
                    && msg.contains("scope differs (rank-local here, config there)"),
                "{msg}"
            );
        }
        let agreed = |source, reduce| MapIdentity {
            scope: MapScope::Agreed,
            source,
            reduce,
            ..MapIdentity::plain(spec("calls", MapType::Array, 8))
        };
        r.declare(&agreed(Some(1), MapReduce::Max), "a.o").unwrap();
        for (other, property) in [
            (agreed(Some(1), MapReduce::Sum), "reduction"),
            (agreed(Some(2), MapReduce::Max), "epoch source"),
            (agreed(None, MapReduce::Max), "epoch source"),
        ] {
            match r.declare(&other, "b.o") {
                Err(RegistryError::Conflict(c)) => assert_eq!(c.differs.property, property),
                other => panic!("{property}: {other:?}"),
            }
        }
        // Global data is private to its program: never declared shared.
        let g = MapIdentity {
            global_data: true,
            ..MapIdentity::plain(spec(".data", MapType::Array, 8))
        };
        assert!(r.declare(&g, "a.o").is_err() && r.check(&g, "a.o").is_err());
        assert_eq!(r.shared_maps().len(), 2, "nothing was created by a refusal");
    }

    #[test]
    fn outside_view_reads_values_and_validates() {
        let dir = scratch();
        let r = Registry::new(dir.clone());
        let a = r.shared(&spec("arr", MapType::Array, 8), "p").unwrap();
        let h = r
            .shared(
                &MapSpec {
                    name: "h".into(),
                    kind: MapType::Hash,
                    key_size: 4,
                    value_size: 12,
                    max_entries: 4,
                },
                "p",
            )
            .unwrap();
        a.update(&3u32.to_le_bytes(), &42u64.to_le_bytes(), 0)
            .unwrap();
        h.update(&7u32.to_le_bytes(), &[9u8; 12], 0).unwrap();
        let ro = r
            .private(
                &MapSpec {
                    name: ".rodata".into(),
                    kind: MapType::Array,
                    key_size: 4,
                    value_size: 16,
                    max_entries: 1,
                },
                "p",
            )
            .unwrap();
        let views = MapView::open_all_in(&dir, std::process::id()).unwrap();
        assert_eq!(views.len(), 3);
        let av = views.iter().find(|v| v.name == "arr").unwrap();
        assert_eq!(av.entries()[3].1[0], 42u64.to_le_bytes());
        let hv = views.iter().find(|v| v.name == "h").unwrap();
        assert_eq!(
            hv.entries(),
            vec![(7u32.to_le_bytes().to_vec(), vec![vec![9u8; 12]])]
        );
        assert!(views.iter().any(|v| v.name == "p:.rodata"));
        drop(ro);
        let _ = r.shared(&spec("other", MapType::Array, 8), "p").unwrap();
        let views = MapView::open_all_in(&dir, std::process::id()).unwrap();
        assert!(
            !views.iter().any(|v| v.name == "p:.rodata"),
            "dropped private maps leave the registry"
        );
        let mode = std::fs::metadata(dir.join(format!("{}.maps", std::process::id()))).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(mode.permissions().mode() & 0o777, 0o600, "owner-only");
    }

    #[test]
    fn the_plugins_names_are_its_own() {
        let dir = scratch();
        let r = Registry::new(dir.clone());
        let mine = spec("ncclbpf_records", MapType::Hash, 8);
        for e in [
            r.shared(&mine, "policy_a").unwrap_err(),
            r.check_shared(&mine, "policy_a").unwrap_err(),
        ] {
            let msg = e.to_string();
            assert!(matches!(e, RegistryError::Reserved { .. }), "{msg}");
            assert!(
                msg.contains("ncclbpf_records")
                    && msg.contains("policy_a")
                    && msg.contains("reserved"),
                "{msg}"
            );
        }
        let a = r.runtime(&mine).unwrap();
        assert!(Arc::ptr_eq(&a, &r.runtime(&mine).unwrap()), "one map");
        let other = spec("ncclbpf_records", MapType::Hash, 16);
        assert!(matches!(r.runtime(&other), Err(RegistryError::Conflict(_))));
        assert!(
            r.runtime(&spec("records", MapType::Hash, 8)).is_err(),
            "the plugin's maps carry the prefix"
        );
        // Still refused to programs once the plugin has it; listed for readers like any map.
        assert!(r.shared(&mine, "policy_b").is_err());
        assert!(r.shared_maps().is_empty(), "not among the programs' maps");
        a.update(&[1; 4], &[2; 8], 0).unwrap();
        let views = MapView::open_all_in(&dir, std::process::id()).unwrap();
        let v = views.iter().find(|v| v.name == "ncclbpf_records").unwrap();
        assert_eq!(v.entries(), vec![(vec![1; 4], vec![vec![2; 8]])]);
    }

    /// A registry line is read, not trusted: sizes whose segment would not fit in memory are
    /// an error (before, the length wrapped and the view indexed past its mapping).
    #[test]
    fn an_overflowing_registry_line_is_refused() {
        let dir = scratch();
        let r = Registry::new(dir.clone());
        let m = r.shared(&spec("arr", MapType::Array, 8), "p").unwrap();
        let file = dir.join(format!("{}.maps", std::process::id()));
        for line in [
            format!("{} 2 4 4294967295 4294967295 1 arr\n", m.fd()),
            format!("{} 6 4 4294967295 4294967295 256 arr\n", m.fd()),
            format!("{} 1 4294967295 4294967295 4294967295 1 arr\n", m.fd()),
        ] {
            std::fs::write(&file, line).unwrap();
            let e = MapView::open_all_in(&dir, std::process::id())
                .err()
                .expect("refused");
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        }
    }

    #[test]
    fn stale_registry_files_are_removed() {
        let dir = scratch();
        std::fs::create_dir_all(&dir).unwrap();
        // A pid far above pid_max is never alive.
        let stale = dir.join("999999999.maps");
        std::fs::write(&stale, "").unwrap();
        let r = Registry::new(dir.clone());
        r.shared(&spec("x", MapType::Array, 8), "p").unwrap();
        assert!(!stale.exists());
        assert!(MapView::open_all_in(&dir, 999_999_999).is_err());
    }
}
