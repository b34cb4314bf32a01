//! Process-wide plugin state: devices and settings, set up by the first successful `init`.

use crate::config::Config;
use crate::devices::{self, Device};
use crate::error::{NetError, NetResult};
use crate::wire::Shape;
use ncclnet_headers::net::NetAttr;
use std::sync::{Mutex, OnceLock};

/// The name NCCL matches against `NCCL_NET`.
pub const NET_NAME: &std::ffi::CStr = c"BPF";

pub struct Plugin {
    pub devices: Vec<Device>,
    pub config: Config,
}

impl Plugin {
    pub fn device(&self, dev: i32) -> NetResult<&Device> {
        usize::try_from(dev)
            .ok()
            .and_then(|d| self.devices.get(d))
            .ok_or_else(|| {
                NetError::Misuse(format!(
                    "device {dev} does not exist ({} devices)",
                    self.devices.len()
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
    let (config, bad) = Config::from_env();
    for b in &bad {
        crate::nlog!(WARN, ENV, "{b}; using the default");
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
    crate::hooks::init_policies();
    crate::control::start(&config);
    Ok(PLUGIN.get_or_init(|| Plugin { devices, config }))
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
}
