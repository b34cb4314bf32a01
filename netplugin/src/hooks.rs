//! Per-operation observation points of the data path.
//!
//! Every operation on a comm passes through here: a connection opening or closing, a request
//! posted, completed or failed. Today these update the per-connection counters in
//! [`shared_maps::ConnTable`]; the BPF programs attached to net hooks run at the same points.

use shared_maps::{ConnDirection, ConnSlotGuard, ConnTable};
use std::sync::LazyLock;

/// Connections tracked per process; more still work but are not counted.
pub const MAX_TRACKED_CONNS: usize = 4096;

static CONNS: LazyLock<ConnTable> = LazyLock::new(|| ConnTable::new(MAX_TRACKED_CONNS));

/// The process-wide per-connection table.
pub fn conn_table() -> &'static ConnTable {
    &CONNS
}

/// The hooks of one connection end.
pub struct ConnHooks {
    slot: Option<ConnSlotGuard<'static>>,
}

impl ConnHooks {
    pub fn on_open(direction: ConnDirection, conn_id: u64, peer_port: u16) -> ConnHooks {
        ConnHooks {
            slot: CONNS.register(direction, conn_id, peer_port),
        }
    }
    pub fn on_post(&self) {
        if let Some(s) = &self.slot {
            s.posted();
        }
    }
    pub fn on_complete(&self, bytes: usize) {
        if let Some(s) = &self.slot {
            s.completed(bytes as u64);
        }
    }
    /// The connection closes: its totals go to NCCL's log.
    pub fn on_close(&self) {
        if let Some(s) = &self.slot {
            let c = s.snapshot();
            let dir = if c.direction == ConnDirection::Send {
                "send"
            } else {
                "recv"
            };
            crate::nlog!(
                INFO,
                NET,
                "closed {dir} connection {:#018x} (peer port {}): {} bytes in {} messages, {} errors, {} in flight",
                c.conn_id,
                c.peer_port,
                c.bytes,
                c.messages,
                c.errors,
                c.inflight
            );
        }
    }
    pub fn on_error(&self) {
        if let Some(s) = &self.slot {
            s.failed();
        }
    }
}
