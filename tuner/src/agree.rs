//! The agreement, tuner side (design: `docs/design/agreement.md` §3, §5): what a tuner context does
//! at the end of each epoch and before each decision.
//!
//! A context of a policy that uses agreed data (an agreed map, or a `tuner/epoch` program)
//! ends an epoch every K decisions (its own sequence numbers, the same on every rank). At the
//! first decision after epoch b's end it
//!
//! 1. posts its record of epoch b: the change of every epoch-source map over the epoch, its
//!    wall time, the bytes of the epoch's collectives, its configuration digest and its decision
//!    digest (through [`ncclbpf_agreement`], which the net plugin carries to the other ranks);
//! 2. if b ≥ D, applies epoch e = b + 1 − D: waits (bounded) until it holds every rank's record
//!    of e, checks that the ranks agree on configuration and decisions, combines the records
//!    into its own view of the agreed maps, runs the `tuner/epoch` program on them (which
//!    updates the communicator's agreed state), and decides from then on with that view.
//!
//! Until the first epoch is applied, and for good once the ranks were found to differ, the
//! context has no opinion: NCCL's own choice, the same everywhere. A wait that reaches
//! `NCCL_BPF_AGREEMENT_TIMEOUT` fails the collective (an NCCL error with a log line naming the
//! epoch and who was heard from), and every later one: a guess could differ from what the
//! other ranks use.
//!
//! Agreed maps are process-wide, while each communicator has its own agreed contents: each
//! context keeps its view and writes it into the maps before its program runs, when another
//! view (or an older one of its own) is there ([`View`]); programs with agreed maps run one at
//! a time in the process for that reason.

use crate::sequence::{AgreementWords, NO_EPOCH, Sequence};
use ncclbpf_agreement::{self as agreement, Combined, Params, Reduce, Verdict};
use policy_object::{MapDef, MapKind, Scope};
use policy_runtime::{LoadedProgram, TunerEpochCtx};
use shared_maps::Map;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// `NCCL_BPF_AGREEMENT`: `auto` (the default: on for policies that use agreed data), `on`
/// (also for the others: their configuration is then checked at the first agreement), `off`.
pub const MODE_ENV: &str = "NCCL_BPF_AGREEMENT";

/// Words of the `tuner/epoch` program's state.
pub const STATE_WORDS: usize = 32;
/// `ncclbpf_source` of the map that shows the epoch program's state.
pub const SOURCE_STATE: u32 = 255;

/// What a program's maps mean to the agreement.
struct Layout {
    /// Epoch sources, by source id: (id, map, words).
    sources: Vec<(u32, Arc<Map>, usize)>,
    /// Agreed maps: the map and where its contents come from.
    agreed: Vec<(Arc<Map>, Fill)>,
    /// How each word of a record combines (the consuming agreed map's reduction; sum if none).
    reduces: Vec<Reduce>,
    /// Config maps that staged updates may change (named arrays of u64 values): each context
    /// keeps its own contents of them.
    configs: Vec<(String, Arc<Map>)>,
}

/// Whether staged updates may change this config map: a named array of u64 values (not the
/// object's `.rodata`, which is the program's own).
fn stageable(d: &MapDef) -> bool {
    d.scope == Scope::Config && d.kind == MapKind::Array && d.value_size == 8 && d.initial.is_none()
}

#[derive(Clone, Copy)]
enum Fill {
    /// From the record words `[at, at + n)`.
    Source { at: usize, n: usize },
    /// The epoch program's state.
    State,
    /// Nothing fills it: zero everywhere.
    Zero,
}

fn words_of(m: &Map) -> usize {
    let s = m.spec();
    (s.value_size as usize / 8) * s.max_entries as usize
}

fn reduce_of(d: &MapDef) -> Reduce {
    match d.reduce {
        policy_object::Reduce::Sum => Reduce::Sum,
        policy_object::Reduce::Max => Reduce::Max,
        policy_object::Reduce::Min => Reduce::Min,
    }
}

impl Layout {
    fn of(prog: &LoadedProgram) -> Result<Layout, String> {
        let pairs: Vec<(&MapDef, &Arc<Map>)> = prog.map_defs().iter().zip(prog.maps()).collect();
        let mut sources: Vec<(u32, Arc<Map>, usize)> = pairs
            .iter()
            .filter(|(d, _)| d.scope == Scope::Local && d.source.is_some())
            .map(|(d, m)| (d.source.unwrap_or(0), Arc::clone(m), words_of(m)))
            .collect();
        sources.sort_by_key(|s| s.0);
        let mut at = 0;
        let mut starts = Vec::new();
        for (id, _, n) in &sources {
            starts.push((*id, at, *n));
            at += n;
        }
        let mut reduces = vec![Reduce::Sum; at];
        let mut agreed = Vec::new();
        for (d, m) in pairs.iter().filter(|(d, _)| d.scope == Scope::Agreed) {
            if d.kind != MapKind::Array || d.value_size % 8 != 0 {
                return Err(format!(
                    "agreed map '{}' is not an array of 8-byte words",
                    d.name
                ));
            }
            let fill = match d.source {
                None => Fill::Zero,
                Some(SOURCE_STATE) => {
                    if words_of(m) > STATE_WORDS {
                        return Err(format!(
                            "agreed map '{}' shows the epoch state: at most {} words",
                            d.name, STATE_WORDS
                        ));
                    }
                    Fill::State
                }
                Some(id) => {
                    let Some(&(_, at, n)) = starts.iter().find(|s| s.0 == id) else {
                        return Err(format!("agreed map '{}': no epoch source {id}", d.name));
                    };
                    if n != words_of(m) {
                        return Err(format!(
                            "agreed map '{}' has {} words, its source {id} {n}",
                            d.name,
                            words_of(m)
                        ));
                    }
                    for r in &mut reduces[at..at + n] {
                        *r = reduce_of(d);
                    }
                    Fill::Source { at, n }
                }
            };
            agreed.push((Arc::clone(m), fill));
        }
        let configs = pairs
            .iter()
            .filter(|(d, _)| stageable(d))
            .map(|(d, m)| (d.name.clone(), Arc::clone(m)))
            .collect();
        Ok(Layout {
            sources,
            agreed,
            reduces,
            configs,
        })
    }

    fn snapshot(&self) -> Vec<u64> {
        let mut out = Vec::with_capacity(self.reduces.len());
        for (_, m, _) in &self.sources {
            out.extend(
                array_bytes(m)
                    .chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))),
            );
        }
        out
    }
}

/// An array map's values, entry after entry (zeros for an entry that cannot be read).
fn array_bytes(m: &Map) -> Vec<u8> {
    let vs = m.spec().value_size as usize;
    (0..m.spec().max_entries)
        .flat_map(|i| m.get(&i.to_le_bytes()).unwrap_or_else(|| vec![0; vs]))
        .collect()
}

/// Whether this program needs the agreement (`auto`).
pub fn uses_agreed(prog: &LoadedProgram, epoch: Option<&LoadedProgram>) -> bool {
    epoch.is_some() || prog.map_defs().iter().any(|d| d.scope == Scope::Agreed)
}

/// 64-bit FNV-1a, over bytes every rank computes alike.
#[derive(Clone, Copy)]
struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.0 = (self.0 ^ x as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
    fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
}

/// The digest of what every rank must run alike: the programs (their instructions, without
/// the map addresses the loader patched in, which differ per process), their maps' shapes and
/// roles, the contents of config maps, and the agreement's settings.
pub fn config_digest(progs: &[&LoadedProgram], params: &Params) -> u64 {
    let mut h = Fnv::new();
    h.u64(params.epoch);
    h.u64(params.delay);
    for p in progs {
        h.bytes(p.section.as_bytes());
        let insns = p.insns();
        let mut pc = 0;
        while pc < insns.len() {
            let i = &insns[pc];
            h.bytes(&[i.code, i.dst, i.src]);
            h.bytes(&i.off.to_le_bytes());
            if i.is_lddw() {
                pc += 2;
                continue;
            }
            h.bytes(&i.imm.to_le_bytes());
            pc += 1;
        }
        for (d, m) in p.map_defs().iter().zip(p.maps()) {
            h.bytes(d.name.as_bytes());
            for v in [
                d.key_size,
                d.value_size,
                d.max_entries,
                d.source.unwrap_or(0),
            ] {
                h.u64(v as u64);
            }
            h.bytes(d.scope.name().as_bytes());
            h.bytes(format!("{:?}", d.reduce).as_bytes());
            // Stageable config maps are digested from the context's own view (Agreement::config).
            if d.scope == Scope::Config && !stageable(d) {
                for (k, vs) in m.entries() {
                    h.bytes(&k);
                    for v in vs {
                        h.bytes(&v);
                    }
                }
            }
        }
    }
    h.0
}

/// The configuration digest with the view's config contents.
fn with_configs(base: u64, layout: &Layout, view: &View) -> u64 {
    let mut h = Fnv(base);
    for ((name, _), bytes) in layout.configs.iter().zip(&view.configs) {
        h.bytes(name.as_bytes());
        h.bytes(bytes);
    }
    h.0
}

/// Checks a config update against `prog`'s maps (before it is staged).
pub fn check_config(prog: &LoadedProgram, up: &crate::stage::ConfigUpdate) -> Result<(), String> {
    let Some(d) = prog.map_defs().iter().find(|d| d.name == up.map) else {
        return Err(format!(
            "the tuner program '{}' has no map '{}'",
            prog.name, up.map
        ));
    };
    if !stageable(d) {
        return Err(format!(
            "map '{}' is not a config map staged updates can change (an NCCLBPF_CONFIG array of \
             8-byte values, not .rodata); it is {} {}",
            up.map,
            d.scope.name(),
            d.kind.name()
        ));
    }
    if up.values.is_empty() {
        return Err("no values given".into());
    }
    let mut keys: Vec<u32> = up.values.iter().map(|(k, _)| *k).collect();
    keys.sort_unstable();
    if let Some(w) = keys.windows(2).find(|w| w[0] == w[1]) {
        return Err(format!("entry {} given twice", w[0]));
    }
    if let Some((k, _)) = up.values.iter().find(|(k, _)| *k >= d.max_entries) {
        return Err(format!(
            "map '{}' has {} entries: no entry {k}",
            up.map, d.max_entries
        ));
    }
    Ok(())
}

/// What `ncclbpf status` shows of a context's agreement: updated by the context at each
/// change (the cold path), read by the control thread at any time.
pub struct Shown {
    comm_id: u64,
    nranks: u32,
    state: std::sync::Mutex<ShownState>,
}

#[derive(Clone)]
enum ShownState {
    Starting,
    Deciding(u64),
    Waiting { epoch: u64, since: Instant },
    Stopped(String),
}

impl Shown {
    fn set(&self, s: ShownState) {
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = s;
    }

    /// One line, e.g. `waiting 12.3 s for epoch 7: 3 of 4 records (from h:1, h:2, h:3)`.
    pub fn describe(&self) -> String {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner()).clone();
        match s {
            ShownState::Starting => "no opinion yet (before the first verified agreement)".into(),
            ShownState::Deciding(e) => format!("deciding from epoch {e}"),
            ShownState::Waiting { epoch, since } => {
                let have = agreement::held(self.comm_id, epoch);
                format!(
                    "waiting {:.1} s for epoch {epoch}: {} of {} records (from {})",
                    since.elapsed().as_secs_f64(),
                    have.len(),
                    self.nranks,
                    if have.is_empty() {
                        "none".into()
                    } else {
                        have.join(", ")
                    }
                )
            }
            ShownState::Stopped(why) => why,
        }
    }
}

/// Where the context stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// No epoch applied yet: no opinion.
    Waiting,
    /// Deciding from agreed data (the epoch last applied).
    Agreed(u64),
    /// The ranks differ (configuration or decisions): no opinion from then on.
    Differs(String),
    /// A wait timed out: every decision from then on fails.
    Failed(String),
}

/// Serialises programs with agreed maps and remembers whose view the maps hold.
static VIEW_LOCK: AtomicBool = AtomicBool::new(false);
static VIEW_OWNER: AtomicU64 = AtomicU64::new(0);
static VIEW_SERIAL: AtomicU64 = AtomicU64::new(1);

/// Holds [`VIEW_LOCK`] until dropped.
pub struct ViewGuard(());

impl Drop for ViewGuard {
    fn drop(&mut self) {
        VIEW_LOCK.store(false, Ordering::Release);
    }
}

fn lock_views() -> ViewGuard {
    crate::owner::spin_until(|| {
        VIEW_LOCK
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()
    });
    ViewGuard(())
}

/// One context's agreed contents (a value per entry of each agreed map) and its config maps'.
struct View {
    maps: Vec<Vec<u8>>,
    configs: Vec<Vec<u8>>,
    /// Unique per (context, version) in the process.
    key: u64,
}

/// A tuner context's agreement (owned by the holder of its try-lock).
pub struct Agreement {
    params: Params,
    comm_id: u64,
    nranks: u32,
    origin: u64,
    host: String,
    /// The digest of everything but the views' config contents, and with them.
    config_base: u64,
    config: u64,
    /// Staged config updates applied (or passed over) so far.
    configs_seen: usize,
    layout: Layout,
    epoch_prog: Option<&'static LoadedProgram>,
    /// Source words at the end of the last epoch.
    last: Vec<u64>,
    started: Instant,
    /// The communicator's net busy clock (shared with the net plugin's connections of it), and
    /// its reading at the last epoch's end.
    busy: Option<Arc<ncclbpf_agreement::net_busy::BusyClock>>,
    busy_last: u64,
    bytes: u64,
    /// Epochs whose record was posted.
    posted: u64,
    state: [u64; STATE_WORDS],
    view: View,
    status: Status,
    /// The origins of this communicator's ranks, fixed by the first combination: later
    /// epochs combine exactly their records.
    members: Option<Vec<u64>>,
    shown: Arc<Shown>,
    /// The context's record, where the agreement's words are published for outside readers
    /// (`ncclbpf_agreement_epoch` and the others); `None`: shown only to `ncclbpf status`.
    out: Option<Arc<Sequence>>,
    _user: agreement::User,
}

impl Drop for Agreement {
    fn drop(&mut self) {
        agreement::leave(self.comm_id, self.origin);
    }
}

/// The contents of config map `name` as the object loaded them, the same for every context of
/// the process: taken when the first context of the process reads it, before any context
/// installed a view (views hold staged updates each context applies at its own decisions, so a
/// new communicator must not start from another's).
fn base_config(m: &Arc<Map>) -> Vec<u8> {
    // By the map itself (a process has one of each name; tests make several registries).
    static BASE: std::sync::Mutex<Vec<(usize, Vec<u8>)>> = std::sync::Mutex::new(Vec::new());
    let id = Arc::as_ptr(m) as usize;
    let mut base = BASE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, b)) = base.iter().find(|(k, _)| *k == id) {
        return b.clone();
    }
    let bytes = array_bytes(m);
    base.push((id, bytes.clone()));
    bytes
}

/// The result of an epoch boundary.
pub enum Boundary {
    Nothing,
    /// The log line to write (a change of status).
    Note(String),
}

impl Agreement {
    /// For a context of `prog` (and `epoch_prog`), or the reason it cannot run.
    pub fn new(
        comm_id: u64,
        nranks: u32,
        prog: &LoadedProgram,
        epoch_prog: Option<&'static LoadedProgram>,
        params: Params,
        out: Option<Arc<Sequence>>,
    ) -> Result<Agreement, String> {
        let layout = Layout::of(prog)?;
        let busy = ncclbpf_agreement::net_busy::clock(comm_id);
        let mut progs = vec![prog];
        progs.extend(epoch_prog);
        let config_base = config_digest(&progs, &params);
        let view = View {
            maps: layout
                .agreed
                .iter()
                .map(|(m, _)| {
                    vec![0u8; m.spec().value_size as usize * m.spec().max_entries as usize]
                })
                .collect(),
            configs: layout.configs.iter().map(|(_, m)| base_config(m)).collect(),
            key: VIEW_SERIAL.fetch_add(1, Ordering::Relaxed),
        };
        let config = with_configs(config_base, &layout, &view);
        let last = layout.snapshot();
        let origin = agreement::new_origin();
        agreement::arrive(comm_id, origin);
        Ok(Agreement {
            params,
            comm_id,
            nranks: nranks.max(1),
            origin,
            members: None,
            shown: Arc::new(Shown {
                comm_id,
                nranks: nranks.max(1),
                state: std::sync::Mutex::new(ShownState::Starting),
            }),
            host: agreement::host_name(),
            config_base,
            config,
            configs_seen: 0,
            layout,
            epoch_prog,
            last,
            started: Instant::now(),
            busy_last: busy.as_ref().map_or(0, |b| b.busy_ns()),
            busy,
            bytes: 0,
            posted: 0,
            state: [0; STATE_WORDS],
            view,
            status: Status::Waiting,
            out,
            _user: agreement::join(),
        })
        .inspect(|a| a.publish(&ShownState::Starting))
    }

    /// Shows `s` to `ncclbpf status` and publishes it with the other agreement words.
    fn show(&self, s: ShownState) {
        self.publish(&s);
        self.shown.set(s);
    }

    /// Writes the agreement words of the context's record (state `s`, the epoch in use, the
    /// current one, K and D).
    fn publish(&self, s: &ShownState) {
        let Some(out) = &self.out else { return };
        use crate::sequence::agreement_state as st;
        let (state, waiting_for, since) = match s {
            ShownState::Starting => (st::STARTING, NO_EPOCH, 0),
            ShownState::Deciding(_) => (st::DECIDING, NO_EPOCH, 0),
            ShownState::Waiting { epoch, since } => {
                // Unix time of `since`: now less what has passed since (a few ns here).
                let unix = std::time::SystemTime::now()
                    .checked_sub(since.elapsed())
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(1, |d| d.as_nanos().min(u64::MAX as u128) as u64);
                (st::WAITING, *epoch, unix.max(1))
            }
            ShownState::Stopped(_) => (st::STOPPED, NO_EPOCH, 0),
        };
        out.publish_agreement(&AgreementWords {
            state,
            used: match self.status {
                Status::Agreed(e) => e,
                _ => NO_EPOCH,
            },
            current: self.posted,
            waiting_for,
            waiting_since_ns: since,
            epoch: self.params.epoch,
            delay: self.params.delay,
        });
    }

    /// The state `ncclbpf status` shows now.
    fn shown_state(&self) -> ShownState {
        self.shown
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// What status shows of this agreement.
    pub fn shown(&self) -> Arc<Shown> {
        Arc::clone(&self.shown)
    }

    pub fn params(&self) -> &Params {
        &self.params
    }

    pub fn status(&self) -> &Status {
        &self.status
    }

    pub fn config(&self) -> u64 {
        self.config
    }

    /// The digest of the members' origins (0 before the first combination).
    fn members_digest(&self) -> u64 {
        let Some(m) = &self.members else { return 0 };
        let mut sorted = m.clone();
        sorted.sort_unstable();
        let mut h = Fnv::new();
        for o in sorted {
            h.u64(o);
        }
        h.0.max(1)
    }

    /// Staged config updates this context has applied or passed over.
    pub fn configs_seen(&self) -> usize {
        self.configs_seen
    }

    /// Applies staged config update `index` (the next one) to this context's view; the
    /// configuration digest of its next records changes with it.
    pub fn apply_config(
        &mut self,
        index: usize,
        up: &crate::stage::ConfigUpdate,
    ) -> Result<(), String> {
        self.configs_seen = self.configs_seen.max(index + 1);
        let i = self
            .layout
            .configs
            .iter()
            .position(|(n, _)| *n == up.map)
            .ok_or_else(|| format!("the policy has no stageable config map '{}'", up.map))?;
        let bytes = &mut self.view.configs[i];
        for &(k, v) in &up.values {
            let at = k as usize * 8;
            let slot = bytes
                .get_mut(at..at + 8)
                .ok_or_else(|| format!("'{}' has no entry {k}", up.map))?;
            slot.copy_from_slice(&v.to_le_bytes());
        }
        self.view.key = VIEW_SERIAL.fetch_add(1, Ordering::Relaxed);
        self.config = with_configs(self.config_base, &self.layout, &self.view);
        Ok(())
    }

    /// Whether the policy may decide now (an epoch applied, the ranks alike).
    #[inline(always)]
    pub fn opinion(&self) -> bool {
        matches!(self.status, Status::Agreed(_))
    }

    #[inline(always)]
    pub fn failed(&self) -> bool {
        matches!(self.status, Status::Failed(_))
    }

    /// Counts a sequenced collective's bytes into the epoch.
    #[inline(always)]
    pub fn count(&mut self, bytes: u64) {
        self.bytes = self.bytes.wrapping_add(bytes);
    }

    /// The decision number at which the next epoch boundary falls, after `next`.
    pub fn next_boundary(&self, next: u64) -> u64 {
        let k = self.params.epoch;
        // Boundaries are at b·K + 1 (b ≥ 1): the first decision after epoch b − 1.
        let b = next.saturating_sub(1) / k + 1;
        b.saturating_mul(k).saturating_add(1)
    }

    /// Runs what is due before decision `next` (see the module doc); `digest` is the context's
    /// decision digest so far.
    pub fn boundary(&mut self, next: u64, digest: u64) -> Boundary {
        let k = self.params.epoch;
        if next < 2 || !(next - 1).is_multiple_of(k) {
            return Boundary::Nothing;
        }
        let b = (next - 1) / k; // epochs 0..b are over
        if b <= self.posted || matches!(self.status, Status::Failed(_)) {
            return Boundary::Nothing;
        }
        self.post(b - 1, digest);
        self.posted = b;
        if b < self.params.delay || matches!(self.status, Status::Differs(_)) {
            // The current epoch moved on; the state did not.
            self.publish(&self.shown_state());
            return Boundary::Nothing;
        }
        let e = b - self.params.delay;
        self.show(ShownState::Waiting {
            epoch: e,
            since: Instant::now(),
        });
        let records = match agreement::wait_for(
            self.comm_id,
            self.origin,
            e,
            self.nranks,
            self.members.as_deref(),
            self.params.timeout,
        ) {
            Ok(r) => r,
            Err(m) => {
                let why = format!(
                    "{m}; this and every later collective of the communicator fails (a guess \
                     could differ from the other ranks' choice)"
                );
                self.status = Status::Failed(why.clone());
                self.show(ShownState::Stopped(format!("failed: {why}")));
                return Boundary::Note(why);
            }
        };
        let verdict = if records.len() != self.nranks as usize {
            // More records than ranks at the first combination: another communicator with the
            // same hash, or a peer's mistake. Which ones each rank saw depends on timing, so
            // nothing decided from them could be trusted to agree.
            Verdict::Differs(format!(
                "{} records for {} ranks (from {}): another communicator shares this one's hash?",
                records.len(),
                self.nranks,
                records
                    .iter()
                    .map(agreement::Record::maker)
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        } else {
            agreement::combine(&records, &self.layout.reduces)
        };
        if self.members.is_none() {
            self.members = Some(records.iter().map(|r| r.origin).collect());
        }
        // Opinions start only with an epoch whose records all name the same members (each
        // rank's digest of the origins it combines with, fixed at its first combination, so
        // from epoch D on): then every rank combined the same records for every epoch, the
        // first one included, and the epoch program's state is the same everywhere.
        let verified = records.iter().all(|r| r.members != 0);
        match verdict {
            Verdict::Agreed(c) => {
                let first = self.status == Status::Waiting && verified;
                let before = log_epochs().then_some(self.state);
                self.apply(&c);
                if let Some(before) = before {
                    let line = epoch_line(self.comm_id, &records, &before, &self.state);
                    crate::tlog!(INFO, TUNING, "{line}");
                }
                if !verified {
                    self.show(ShownState::Starting);
                    return Boundary::Nothing;
                }
                self.status = Status::Agreed(e);
                self.show(ShownState::Deciding(e));
                if first {
                    Boundary::Note(format!(
                        "comm {:#018x}: first agreement (epoch {e}, {} ranks alike) at seq \
                         {next}: the policy decides from agreed data from here on",
                        self.comm_id, c.ranks
                    ))
                } else {
                    Boundary::Nothing
                }
            }
            Verdict::Differs(why) => {
                let line = format!(
                    "comm {:#018x}: epoch {e}: {why}; the tuner has no opinion from seq {next} on \
                     (NCCL's choice, on every rank alike)",
                    self.comm_id
                );
                self.status = Status::Differs(line.clone());
                self.show(ShownState::Stopped(format!("no opinion: {line}")));
                Boundary::Note(line)
            }
        }
    }

    fn post(&mut self, epoch: u64, digest: u64) {
        let now = Instant::now();
        let busy = self.busy.as_ref().map_or(0, |b| b.busy_ns());
        let net_busy_ns = busy.saturating_sub(self.busy_last);
        self.busy_last = busy;
        let snap = self.layout.snapshot();
        let words = snap
            .iter()
            .zip(self.last.iter().chain(std::iter::repeat(&0)))
            .map(|(n, o)| n.wrapping_sub(*o))
            .collect();
        self.last = snap;
        let r = agreement::Record {
            comm_id: self.comm_id,
            origin: self.origin,
            epoch,
            nranks: self.nranks,
            colls: self.params.epoch.min(u32::MAX as u64) as u32,
            pid: std::process::id(),
            host: self.host.clone(),
            config: self.config,
            decisions: digest,
            duration_ns: now.saturating_duration_since(self.started).as_nanos() as u64,
            net_busy_ns,
            bytes: self.bytes,
            members: self.members_digest(),
            words,
        };
        self.started = now;
        self.bytes = 0;
        agreement::post(&r);
    }

    /// Fills this context's view from epoch `c`, runs the epoch program on it.
    fn apply(&mut self, c: &Combined) {
        for ((m, fill), bytes) in self.layout.agreed.iter().zip(self.view.maps.iter_mut()) {
            if let Fill::Source { at, n } = *fill {
                for (dst, w) in bytes.chunks_exact_mut(8).zip(&c.words[at..at + n]) {
                    dst.copy_from_slice(&w.to_le_bytes());
                }
            }
            let _ = m;
        }
        self.view.key = VIEW_SERIAL.fetch_add(1, Ordering::Relaxed);
        if let Some(p) = self.epoch_prog {
            let _g = self.install();
            let mut ctx = TunerEpochCtx {
                comm_id: self.comm_id,
                epoch: c.epoch,
                nranks: c.ranks,
                colls: self.params.epoch.min(u32::MAX as u64) as u32,
                duration_max_ns: c.duration_max_ns,
                duration_min_ns: c.duration_min_ns,
                net_busy_max_ns: c.net_busy_max_ns,
                net_busy_min_ns: c.net_busy_min_ns,
                bytes: c.bytes,
                state: self.state,
            };
            p.run(&mut ctx);
            self.state = ctx.state;
        }
        for ((_, fill), bytes) in self.layout.agreed.iter().zip(self.view.maps.iter_mut()) {
            if let Fill::State = fill {
                for (dst, w) in bytes.chunks_exact_mut(8).zip(&self.state) {
                    dst.copy_from_slice(&w.to_le_bytes());
                }
            }
        }
        self.view.key = VIEW_SERIAL.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes the process's view lock and puts this context's view into the agreed maps (if
    /// they hold another); the program runs while the guard lives.
    #[inline]
    pub fn install(&self) -> ViewGuard {
        let g = lock_views();
        if VIEW_OWNER.load(Ordering::Relaxed) != self.view.key {
            let agreed = self
                .layout
                .agreed
                .iter()
                .map(|(m, _)| m)
                .zip(&self.view.maps);
            let configs = self
                .layout
                .configs
                .iter()
                .map(|(_, m)| m)
                .zip(&self.view.configs);
            for (m, bytes) in agreed.chain(configs) {
                let vs = m.spec().value_size as usize;
                for (i, v) in bytes.chunks_exact(vs.max(1)).enumerate() {
                    let _ = m.update(&(i as u32).to_le_bytes(), v, shared_maps::BPF_ANY);
                }
            }
            VIEW_OWNER.store(self.view.key, Ordering::Relaxed);
        }
        g
    }

    /// The summary at finalize.
    pub fn summary(&self) -> String {
        let s = agreement::stats();
        let status = match &self.status {
            Status::Waiting => "no epoch applied yet".to_string(),
            Status::Agreed(e) => format!("deciding from epoch {e}"),
            Status::Differs(_) => "ranks differ, no opinion".to_string(),
            Status::Failed(_) => "failed (timeout)".to_string(),
        };
        format!(
            "agreement of comm {:#018x}: {status}; K {} D {}, {} records posted; process: {} \
             epochs combined, latency {} us mean / {} us max, {} frames ({} B) sent, {} B \
             received ({} new records, {} repeats)",
            self.comm_id,
            self.params.epoch,
            self.params.delay,
            self.posted,
            s.combined,
            s.latency_sum_us.checked_div(s.timed).unwrap_or(0),
            s.latency_max_us,
            s.frames_sent,
            s.bytes_sent,
            s.bytes_received,
            s.received_new,
            s.received_old
        )
    }
}

/// `NCCL_BPF_AGREEMENT_LOG`: `1` logs one line per applied epoch (INFO, TUNING): every rank's
/// wall time for it and the state words the epoch program changed; for studying a policy on a
/// real job. Unset or `0`: nothing.
pub const LOG_ENV: &str = "NCCL_BPF_AGREEMENT_LOG";

/// Whether `NCCL_BPF_AGREEMENT_LOG` asks for a line per applied epoch (read once).
fn log_epochs() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(
        || match std::env::var(LOG_ENV).ok().as_deref().map(str::trim) {
            None | Some("") | Some("0") => false,
            Some("1") => true,
            Some(v) => {
                crate::tlog!(
                    WARN,
                    TUNING,
                    "{LOG_ENV}={v:?}: expected 0 or 1; no epoch lines"
                );
                false
            }
        },
    )
}

/// `NCCL_BPF_AGREEMENT_LOG=1`'s line for an applied epoch: each rank's wall time for it and its
/// net busy time (in the records' order, by origin), and the words of the epoch program's state
/// it changed.
fn epoch_line(
    comm_id: u64,
    records: &[agreement::Record],
    before: &[u64],
    after: &[u64],
) -> String {
    let us = |ns: u64| format!("{:.1}", ns as f64 / 1e3);
    let times: Vec<String> = records.iter().map(|r| us(r.duration_ns)).collect();
    let busy: Vec<String> = records.iter().map(|r| us(r.net_busy_ns)).collect();
    let changed: Vec<String> = after
        .iter()
        .zip(before)
        .enumerate()
        .filter(|(_, (a, b))| a != b)
        .map(|(i, (a, _))| format!("[{i}]={a:#x}"))
        .collect();
    format!(
        "comm {comm_id:#018x}: epoch {} applied: rank times (us) {}; net busy (us) {}; state {}",
        records.first().map_or(0, |r| r.epoch),
        times.join(" "),
        busy.join(" "),
        if changed.is_empty() {
            "unchanged".to_string()
        } else {
            changed.join(" ")
        }
    )
}

/// `NCCL_BPF_AGREEMENT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Auto,
    On,
    Off,
}

/// How the contexts of this process run the agreement.
#[derive(Clone, Copy, Debug)]
pub struct Setting {
    pub mode: Mode,
    pub params: Params,
    /// The `tuner/epoch` program, if one loaded.
    pub epoch: Option<&'static LoadedProgram>,
    /// Whether records can reach ranks on other nodes: they travel over our net plugin's
    /// connections, so only where NCCL initialised it in this process (the host has its peer).
    /// Between the processes of one node the node-local relay carries them either way.
    pub between_nodes: bool,
}

impl Setting {
    pub const OFF: Setting = Setting {
        mode: Mode::Off,
        params: Params {
            epoch: 64,
            delay: 2,
            timeout: std::time::Duration::from_secs(60),
        },
        epoch: None,
        between_nodes: true,
    };

    /// From the environment, read once per process; a bad value is logged and turns the
    /// agreement off (policies with agreed maps then have no opinion: they need it).
    pub fn from_env() -> Setting {
        static S: std::sync::OnceLock<(Mode, Result<Params, String>)> = std::sync::OnceLock::new();
        let (mode, params) = S.get_or_init(|| {
            let mode = match std::env::var(MODE_ENV).ok().as_deref().map(str::trim) {
                None | Some("") | Some("auto") => Mode::Auto,
                Some("on") | Some("1") => Mode::On,
                Some("off") | Some("0") => Mode::Off,
                Some(v) => {
                    crate::tlog!(
                        WARN,
                        TUNING,
                        "{MODE_ENV}={v:?}: expected auto, on or off; the agreement is off"
                    );
                    Mode::Off
                }
            };
            let params = Params::from_env();
            if let Err(e) = &params {
                crate::tlog!(WARN, TUNING, "{e}; the agreement is off");
            }
            (mode, params)
        });
        match params {
            Ok(p) => Setting {
                mode: *mode,
                params: *p,
                epoch: crate::policy::epoch_program(),
                between_nodes: ncclbpf_host::peers::net().is_some(),
            },
            Err(_) => Setting {
                epoch: crate::policy::epoch_program(),
                ..Setting::OFF
            },
        }
    }

    /// Whether contexts of `prog` made under this setting keep per-communicator views of config
    /// maps (they run the agreement).
    pub fn keeps_views(&self, prog: &LoadedProgram) -> bool {
        match self.mode {
            Mode::Off => false,
            Mode::On => true,
            Mode::Auto => uses_agreed(prog, self.epoch),
        }
    }

    pub fn mode_name(&self) -> &'static str {
        match self.mode {
            Mode::Auto => "auto",
            Mode::On => "on",
            Mode::Off => "off",
        }
    }

    /// The agreement of a context of `prog` on a communicator of `nranks` ranks over `nnodes`
    /// nodes, if it runs one: `Ok(None)` when not needed. `Err` when the policy needs one and
    /// cannot have it (then it has no opinion): the agreement is off, or the communicator spans
    /// nodes and no net plugin of ours carries records between them (a tuner-only deployment:
    /// the same on every rank of such a job, so every rank keeps NCCL's choices alike). A policy
    /// that does not need it runs without one there, even with `NCCL_BPF_AGREEMENT=on`.
    pub fn agreement_for(
        &self,
        comm_id: u64,
        nranks: u32,
        nnodes: u32,
        prog: &LoadedProgram,
        out: Option<&Arc<Sequence>>,
    ) -> Result<Option<Agreement>, String> {
        let needs = uses_agreed(prog, self.epoch);
        if nnodes > 1 && !self.between_nodes && self.mode != Mode::Off {
            return if needs {
                Err(format!(
                    "policy '{}' decides from agreed data, which needs the records of every rank, \
                     and records cross nodes only over our net plugin's connections: NCCL did \
                     not initialise it in this process (its own transport carries the data), so \
                     on this communicator of {nnodes} nodes the policy has no opinion, like every \
                     rank of it",
                    prog.name
                ))
            } else {
                Ok(None)
            };
        }
        match self.mode {
            Mode::Off if needs => Err(format!(
                "policy '{}' decides from agreed data, and the agreement is off ({MODE_ENV}=off \
                 or a bad NCCL_BPF_AGREEMENT_* setting): it has no opinion",
                prog.name
            )),
            Mode::Off => Ok(None),
            Mode::Auto if !needs => Ok(None),
            _ => Agreement::new(comm_id, nranks, prog, self.epoch, self.params, out.cloned())
                .map(Some),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_epoch_line_names_each_ranks_time_and_the_changed_state_words() {
        let rec = |origin: u64, duration_ns: u64| agreement::Record {
            comm_id: 1,
            origin,
            epoch: 41,
            nranks: 2,
            colls: 32,
            pid: 7,
            host: "h".into(),
            config: 0,
            decisions: 0,
            duration_ns,
            net_busy_ns: duration_ns / 2,
            bytes: 0,
            members: 0,
            words: vec![],
        };
        let records = [rec(1, 1_234_500), rec(2, 987_000)];
        let line = epoch_line(0xab, &records, &[1, 2, 3], &[1, 5, 3]);
        assert_eq!(
            line,
            "comm 0x00000000000000ab: epoch 41 applied: rank times (us) 1234.5 987.0; net busy (us) 617.2 493.5; state [1]=0x5"
        );
        let same = epoch_line(0xab, &records[..1], &[1, 2], &[1, 2]);
        assert!(
            same.ends_with("rank times (us) 1234.5; net busy (us) 617.2; state unchanged"),
            "{same}"
        );
    }
}
