//! What the plugin types contribute to the control socket's requests. Each registers once, when
//! NCCL first initialises it; a process where NCCL never initialised one of them answers
//! without it (a tuner-only process has no net hooks; a net-only one stages no tuner program).

use ncclbpf_control::protocol::{Item, Reply};
use policy_runtime::LoadOptions;
use shared_maps::Registry;
use std::path::Path;
use std::sync::OnceLock;

/// The net plugin's part.
pub trait NetPeer: Send + Sync {
    /// The generation of the net programs, and one `Item::Hook` per hook.
    fn hooks(&self) -> (u64, Vec<Item>);
    /// Whether programs of `section` attach to a net hook.
    fn is_net_section(&self, section: &str) -> bool;
    /// `reload PATH`: the object's net programs swapped in, all or nothing; its tuner programs
    /// refused (they must be staged).
    fn reload(&self, path: &Path, registry: &Registry, opts: &LoadOptions) -> Reply;
    /// Counts a reload, done or refused (the connection table's counters).
    fn count_reload(&self, ok: bool);
}

/// The tuner's part: staged swaps and config updates, and its contexts.
pub trait TunerPeer: Send + Sync {
    /// The staged programs and config updates, every tuner context, every agreement.
    fn items(&self) -> Vec<Item>;
    /// Stages the tuner program of `obj` (read from `shown`) at decision `at` of every
    /// communicator: the items to report (what was staged, refused or kept), or the whole reply
    /// of a refusal (nothing changed).
    fn stage(
        &self,
        obj: &policy_object::Object,
        shown: &str,
        at: u64,
        registry: &Registry,
    ) -> Result<Vec<Item>, Reply>;
    /// Withdraws the stage just made (its net part failed): what happened, for the reply.
    fn withdraw(&self) -> String;
    /// `config --at-seq`: new values for config map `map` from decision `at`.
    fn stage_config(&self, at: u64, map: &str, values: &[(u32, u64)], source: &str) -> Reply;
    /// Drops the last staged program or config update if no communicator reached it.
    fn unstage(&self) -> Reply;
}

static NET: OnceLock<&'static dyn NetPeer> = OnceLock::new();
static TUNER: OnceLock<&'static dyn TunerPeer> = OnceLock::new();

/// Registers the net plugin (once; later calls keep the first).
pub fn register_net(p: &'static dyn NetPeer) {
    let _ = NET.set(p);
}

/// Registers the tuner (once; later calls keep the first).
pub fn register_tuner(p: &'static dyn TunerPeer) {
    let _ = TUNER.set(p);
}

/// The net plugin, once NCCL initialised it.
pub fn net() -> Option<&'static dyn NetPeer> {
    NET.get().copied()
}

/// The tuner, once NCCL initialised it.
pub fn tuner() -> Option<&'static dyn TunerPeer> {
    TUNER.get().copied()
}
