//! One collective (or point-to-point operation) from its start on the host to its last
//! channel's end on the GPU, and the figures it yields.
//!
//! NCCL starts a Coll event when it hands the plan to the proxy (`hostStreamPlanTask`) and
//! stops it right after, on the host, long before the GPU ran it. What the GPU did comes in
//! KernelCh events, one per channel the collective runs on (NCCL adds a profiler proxy op per
//! channel, `addProfilerProxyOpIfNeeded`), whose parent is the Coll event and whose start and
//! stop carry the GPU's globaltimer. So a collective is [`Pending`] until the host stopped it
//! and every channel that started has stopped, and at least `nChannels` of them did; its
//! execution time is the first channel's start to the last channel's end, on the GPU's clock.
//! Without KernelCh events (masked out) a collective is counted at its host stop, untimed.

use crate::event::Op;

/// A collective between its start and its retirement.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pending {
    pub op: Op,
    pub p2p: bool,
    pub host_stopped: bool,
    /// KernelCh events started and stopped under it.
    pub started: u16,
    pub stopped: u16,
    /// Earliest channel start and latest channel end (GPU ns; 0: none yet).
    pub first: u64,
    pub last: u64,
}

impl Pending {
    pub fn new(op: Op, p2p: bool) -> Pending {
        Pending {
            op,
            p2p,
            ..Pending::default()
        }
    }

    pub fn channel_started(&mut self, gpu_ns: u64) {
        self.started = self.started.saturating_add(1);
        if gpu_ns != 0 && (self.first == 0 || gpu_ns < self.first) {
            self.first = gpu_ns;
        }
    }

    pub fn channel_stopped(&mut self, gpu_ns: u64) {
        self.stopped = self.stopped.saturating_add(1);
        self.last = self.last.max(gpu_ns);
    }

    /// Whether nothing more is to come: the host stopped it and, when channels are followed,
    /// every one that started stopped and at least as many as it runs on did.
    pub fn done(&self, channels_followed: bool) -> bool {
        self.host_stopped
            && (!channels_followed
                || (self.started > 0
                    && self.stopped == self.started
                    && self.stopped >= u16::from(self.op.nchannels.max(1))))
    }

    /// GPU execution time, when both ends are known and in order.
    pub fn duration_ns(&self) -> Option<u64> {
        (self.first != 0 && self.last > self.first).then(|| self.last - self.first)
    }
}

/// Bytes of the operation as NCCL's tuner and nccl-tests count them: `count × type size`,
/// times the ranks for all_gather and reduce_scatter (whose `count` is per rank). 0 when the
/// element size is unknown.
pub fn op_bytes(op: &Op, nranks: u32) -> u64 {
    let per = op.count.saturating_mul(u64::from(op.type_size));
    match op.func {
        2 | 3 => per.saturating_mul(u64::from(nranks.max(1))),
        _ => per,
    }
}

/// nccl-tests' bus-bandwidth factor: what each rank moves per byte of the operation.
pub fn bus_factor(func: u8, nranks: u32) -> f64 {
    let n = f64::from(nranks.max(1));
    match func {
        4 => 2.0 * (n - 1.0) / n,   // all_reduce
        2 | 3 | 8 => (n - 1.0) / n, // all_gather, reduce_scatter, all_to_all
        _ => 1.0,                   // broadcast, reduce, send, recv
    }
}

pub fn bus_bytes(op: &Op, nranks: u32) -> u64 {
    (op_bytes(op, nranks) as f64 * bus_factor(op.func, nranks)) as u64
}

/// Size buckets: bucket `k` holds sizes in (2^(k-1), 2^k] bytes, 0 holds 0 and 1 byte, the
/// last everything above 1 TiB.
pub const SIZE_BUCKETS: u32 = 41;

pub fn size_bucket(bytes: u64) -> u32 {
    if bytes <= 1 {
        return 0;
    }
    (64 - (bytes - 1).leading_zeros()).min(SIZE_BUCKETS - 1)
}

/// The upper bound of a size bucket, in bytes (a metrics label).
pub fn size_bucket_bound(k: u32) -> u64 {
    1u64 << k.min(SIZE_BUCKETS - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(func: u8, count: u64, size: u8, nch: u8) -> Op {
        Op {
            func,
            count,
            type_size: size,
            nchannels: nch,
            ..Op::default()
        }
    }

    #[test]
    fn a_collective_is_done_when_host_and_every_channel_are() {
        let mut p = Pending::new(op(4, 1 << 20, 4, 2), false);
        p.host_stopped = true;
        assert!(!p.done(true), "no channel yet: more to come");
        p.channel_started(1000);
        p.channel_started(900);
        assert!(!p.done(true));
        p.channel_stopped(5000);
        assert!(!p.done(true), "one of two channels still running");
        p.channel_stopped(4000);
        assert!(p.done(true));
        assert_eq!(p.duration_ns(), Some(4100));
        // Fewer channels than the collective runs on: not done even though all that started stopped.
        let mut q = Pending::new(op(4, 1, 4, 4), false);
        q.host_stopped = true;
        q.channel_started(1);
        q.channel_stopped(2);
        assert!(!q.done(true));
        assert!(q.done(false), "without channels the host stop ends it");
        let mut r = Pending::new(op(4, 1, 4, 1), false);
        r.channel_started(1);
        r.channel_stopped(2);
        assert!(!r.done(true), "the host has not stopped it");
    }

    #[test]
    fn bytes_and_bus_bytes_follow_nccl_tests() {
        // all_reduce of 1 Mi floats on 4 ranks: 4 MiB, bus 2·3/4.
        assert_eq!(op_bytes(&op(4, 1 << 20, 4, 1), 4), 4 << 20);
        assert_eq!(bus_bytes(&op(4, 1 << 20, 4, 1), 4), 6 << 20);
        // all_gather counts per rank.
        assert_eq!(op_bytes(&op(2, 1 << 20, 2, 1), 4), 8 << 20);
        assert_eq!(bus_bytes(&op(2, 1 << 20, 2, 1), 4), 6 << 20);
        assert_eq!(bus_bytes(&op(0, 100, 1, 1), 8), 100);
        assert_eq!(op_bytes(&op(4, 100, 0, 1), 8), 0, "unknown element size");
    }

    #[test]
    fn size_buckets_are_powers_of_two() {
        assert_eq!(size_bucket(0), 0);
        assert_eq!(size_bucket(1), 0);
        assert_eq!(size_bucket(2), 1);
        assert_eq!(size_bucket(3), 2);
        assert_eq!(size_bucket(4), 2);
        assert_eq!(size_bucket(65536), 16);
        assert_eq!(size_bucket(65537), 17);
        assert_eq!(size_bucket(u64::MAX), SIZE_BUCKETS - 1);
        assert_eq!(size_bucket_bound(16), 65536);
    }
}
