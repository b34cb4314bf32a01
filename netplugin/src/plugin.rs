//! Process-wide plugin state: devices and settings, set up by the first successful `init`.

use crate::config::Config;
use crate::devices::{self, Device};
use crate::error::{NetError, NetResult};
use crate::inner::Inner;
use crate::wire::Shape;
use ncclnet_headers::net::NetAttr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

/// The name NCCL matches against `NCCL_NET`.
pub const NET_NAME: &std::ffi::CStr = c"BPF";

pub struct Plugin {
    pub backend: Backend,
    pub config: Config,
}

/// Who carries NCCL's traffic.
pub enum Backend {
    /// ncclbpf's own sockets, over these devices.
    Sockets(Vec<Device>),
    /// The network plugin named by `NCCL_BPF_NET_INNER`.
    Inner(Inner),
}

/// Set in a copy of ncclbpf that another copy loaded as its inner plugin: it carries traffic
/// over its sockets and does nothing else (the outer copy runs the hooks, counters, control
/// socket and metrics, once: this copy neither registers with its host nor holds it).
static BACKEND_ONLY: AtomicBool = AtomicBool::new(false);

/// Makes this library a plain backend (see [`BACKEND_ONLY`]); called through the exported
/// `ncclbpf_net_backend_only` before `init`.
pub fn set_backend_only() {
    BACKEND_ONLY.store(true, Ordering::Release);
}

/// Whether this library is another copy's plain backend.
pub fn backend_only() -> bool {
    BACKEND_ONLY.load(Ordering::Acquire)
}

impl Plugin {
    /// The inner plugin, when one carries the traffic.
    pub fn inner(&self) -> Option<&Inner> {
        match &self.backend {
            Backend::Inner(i) => Some(i),
            Backend::Sockets(_) => None,
        }
    }

    fn devices(&self) -> &[Device] {
        match &self.backend {
            Backend::Sockets(d) => d,
            Backend::Inner(_) => &[],
        }
    }

    /// How many devices our sockets use (0 with an inner plugin).
    pub fn socket_devices(&self) -> usize {
        self.devices().len()
    }

    pub fn device(&self, dev: i32) -> NetResult<&Device> {
        let devices = self.devices();
        usize::try_from(dev)
            .ok()
            .and_then(|d| devices.get(d))
            .ok_or_else(|| {
                NetError::Misuse(format!(
                    "device {dev} does not exist ({} devices)",
                    devices.len()
                ))
            })
    }

    pub fn shape(&self) -> Shape {
        Shape {
            nstreams: self.config.nstreams,
            inline_bytes: self.config.inline_bytes,
            min_chunk: self.config.min_chunk,
        }
    }
}

static PLUGIN: OnceLock<Plugin> = OnceLock::new();
static INIT_LOCK: Mutex<()> = Mutex::new(());

/// Discovers devices and reads settings once per process; later calls return the same state.
/// A failure (no usable interface) is not remembered, so a later `init` may succeed.
pub fn init() -> NetResult<&'static Plugin> {
    if let Some(p) = PLUGIN.get() {
        return Ok(p);
    }
    let _guard = INIT_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = PLUGIN.get() {
        return Ok(p);
    }
    let (mut config, bad) = Config::from_env();
    for b in &bad {
        crate::nlog!(WARN, ENV, "{b}; using the default");
    }
    if backend_only() {
        // The outer copy's setting names this library: it must not name it again.
        config.inner = None;
    }
    if let Some(name) = config.inner.clone() {
        let mut inner = Inner::open(&name)?;
        crate::nlog!(INFO, INIT, "{}", inner.describe());
        if config.side {
            match devices::discover(config.speed_mbps) {
                Ok(d) => {
                    inner.side_devices = d
                        .iter()
                        .map(|d| (d.pci_path.clone(), d.bind_addr()))
                        .collect()
                }
                Err(e) => crate::nlog!(
                    WARN,
                    INIT,
                    "no side channel beside the inner plugin's connections ({e}): the \
                     agreement runs on the node-local relay only"
                ),
            }
        }
        crate::hooks::init_policies();
        crate::control::register();
        return Ok(PLUGIN.get_or_init(|| Plugin {
            backend: Backend::Inner(inner),
            config,
        }));
    }
    let devices = devices::discover(config.speed_mbps).map_err(NetError::NoDevice)?;
    for (i, d) in devices.iter().enumerate() {
        crate::nlog!(
            INFO,
            INIT,
            "device {i}: {} {} speed {} Mbps",
            d.name.to_string_lossy(),
            d.addr,
            d.speed_mbps
        );
    }
    crate::nlog!(
        INFO,
        INIT,
        "{} device(s); {} data stream(s) per connection, inline up to {} B, chunks of at least {} B{}",
        devices.len(),
        config.nstreams,
        config.inline_bytes,
        config.min_chunk,
        config
            .tcp_congestion
            .as_ref()
            .map_or(String::new(), |c| format!(", TCP congestion control {c}"))
    );
    if !backend_only() {
        crate::hooks::init_policies();
        crate::control::register();
    }
    Ok(PLUGIN.get_or_init(|| Plugin {
        backend: Backend::Sockets(devices),
        config,
    }))
}

/// The state set up by `init`, or an error if NCCL skipped `init`.
pub fn get() -> NetResult<&'static Plugin> {
    PLUGIN
        .get()
        .ok_or_else(|| NetError::Misuse("called before a successful init".into()))
}

/// Per-communicator context of net v11+ (`init` returns one, `finalize` frees it).
pub struct NetContext {
    pub comm_id: u64,
    pub traffic_class: i32,
    pub attr: Mutex<Option<NetAttr>>,
    /// What the inner plugin's calls for this communicator carry (with an inner plugin).
    pub inner: Option<crate::inner::Ctx>,
}
