//! A fixed-capacity table of per-connection counters.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

/// Which end of a unidirectional NCCL connection a slot describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnDirection {
    Send,
    Recv,
}

impl ConnDirection {
    fn code(self) -> u32 {
        match self {
            ConnDirection::Send => 1,
            ConnDirection::Recv => 2,
        }
    }
    fn from_code(c: u32) -> Option<Self> {
        match c {
            1 => Some(ConnDirection::Send),
            2 => Some(ConnDirection::Recv),
            _ => None,
        }
    }
}

#[derive(Default)]
struct Slot {
    /// 0 when free, else a [`ConnDirection`] code.
    direction: AtomicU32,
    conn_id: AtomicU64,
    /// IPv4/IPv6 peer port, for labels.
    peer_port: AtomicU32,
    bytes: AtomicU64,
    messages: AtomicU64,
    errors: AtomicU64,
    inflight: AtomicU64,
}

/// One record read out of the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnSnapshot {
    pub slot: usize,
    pub direction: ConnDirection,
    pub conn_id: u64,
    pub peer_port: u32,
    pub bytes: u64,
    pub messages: u64,
    pub errors: u64,
    pub inflight: u64,
}

/// Per-connection counters with a fixed number of slots.
pub struct ConnTable {
    slots: Box<[Slot]>,
    free: Mutex<Vec<usize>>,
}

impl ConnTable {
    pub fn new(capacity: usize) -> Self {
        let slots: Box<[Slot]> = (0..capacity).map(|_| Slot::default()).collect();
        let free = (0..capacity).rev().collect();
        ConnTable {
            slots,
            free: Mutex::new(free),
        }
    }

    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Claims a slot for a new connection; `None` when the table is full (the connection
    /// still works, it is just not counted).
    pub fn register(
        &self,
        direction: ConnDirection,
        conn_id: u64,
        peer_port: u16,
    ) -> Option<ConnSlotGuard<'_>> {
        let idx = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop()?;
        let s = &self.slots[idx];
        s.conn_id.store(conn_id, Relaxed);
        s.peer_port.store(u32::from(peer_port), Relaxed);
        for c in [&s.bytes, &s.messages, &s.errors, &s.inflight] {
            c.store(0, Relaxed);
        }
        s.direction.store(direction.code(), Relaxed);
        Some(ConnSlotGuard { table: self, idx })
    }

    /// Every live connection's counters.
    pub fn snapshot(&self) -> Vec<ConnSnapshot> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(slot, s)| {
                Some(ConnSnapshot {
                    slot,
                    direction: ConnDirection::from_code(s.direction.load(Relaxed))?,
                    conn_id: s.conn_id.load(Relaxed),
                    peer_port: s.peer_port.load(Relaxed),
                    bytes: s.bytes.load(Relaxed),
                    messages: s.messages.load(Relaxed),
                    errors: s.errors.load(Relaxed),
                    inflight: s.inflight.load(Relaxed),
                })
            })
            .collect()
    }
}

/// A claimed slot; the slot is released when the guard drops.
pub struct ConnSlotGuard<'a> {
    table: &'a ConnTable,
    idx: usize,
}

impl ConnSlotGuard<'_> {
    fn slot(&self) -> &Slot {
        &self.table.slots[self.idx]
    }
    pub fn index(&self) -> usize {
        self.idx
    }
    /// This connection's counters now.
    pub fn snapshot(&self) -> ConnSnapshot {
        let s = self.slot();
        ConnSnapshot {
            slot: self.idx,
            direction: ConnDirection::from_code(s.direction.load(Relaxed))
                .unwrap_or(ConnDirection::Send),
            conn_id: s.conn_id.load(Relaxed),
            peer_port: s.peer_port.load(Relaxed),
            bytes: s.bytes.load(Relaxed),
            messages: s.messages.load(Relaxed),
            errors: s.errors.load(Relaxed),
            inflight: s.inflight.load(Relaxed),
        }
    }
    /// An operation was posted.
    pub fn posted(&self) {
        self.slot().inflight.fetch_add(1, Relaxed);
    }
    /// An operation completed with `bytes` moved.
    pub fn completed(&self, bytes: u64) {
        let s = self.slot();
        s.inflight.fetch_sub(1, Relaxed);
        s.messages.fetch_add(1, Relaxed);
        s.bytes.fetch_add(bytes, Relaxed);
    }
    /// An operation failed.
    pub fn failed(&self) {
        let s = self.slot();
        s.inflight.fetch_sub(1, Relaxed);
        s.errors.fetch_add(1, Relaxed);
    }
}

impl Drop for ConnSlotGuard<'_> {
    fn drop(&mut self) {
        self.slot().direction.store(0, Relaxed);
        self.table
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(self.idx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_releases() {
        let t = ConnTable::new(2);
        let a = t.register(ConnDirection::Send, 7, 1234).unwrap();
        let b = t.register(ConnDirection::Recv, 8, 99).unwrap();
        assert!(
            t.register(ConnDirection::Send, 9, 0).is_none(),
            "table is full"
        );
        a.posted();
        a.posted();
        a.completed(100);
        a.failed();
        b.posted();
        let snap = t.snapshot();
        assert_eq!(snap.len(), 2);
        let sa = snap.iter().find(|s| s.conn_id == 7).unwrap();
        assert_eq!(
            (sa.bytes, sa.messages, sa.errors, sa.inflight),
            (100, 1, 1, 0)
        );
        assert_eq!(sa.direction, ConnDirection::Send);
        let sb = snap.iter().find(|s| s.conn_id == 8).unwrap();
        assert_eq!(sb.inflight, 1);
        drop(a);
        assert_eq!(t.snapshot().len(), 1);
        let c = t.register(ConnDirection::Send, 10, 0).unwrap();
        assert_eq!(
            t.snapshot().iter().find(|s| s.conn_id == 10).unwrap().bytes,
            0,
            "reused slot is reset"
        );
        drop(c);
        drop(b);
        assert!(t.snapshot().is_empty());
    }
}
