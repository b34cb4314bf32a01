//! Settings read from `NCCL_BPF_*` environment variables.
//!
//! A bad value never stops the job: it is reported through NCCL's logger and the default is
//! used instead. The listening side decides the transport shape (streams, inline limit, chunk
//! size) and ships it in the handle, so both ends of a connection always agree.

use std::fmt;

/// Transport settings, with the defaults documented in the README.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// `NCCL_BPF_NSTREAMS`: data streams (each with its own helper thread) per connection,
    /// besides the control stream. 0 sends everything on the control stream.
    pub nstreams: u32,
    /// `NCCL_BPF_INLINE_BYTES`: messages up to this size travel on the control stream,
    /// progressed by NCCL's proxy thread inside `test`, with no thread hand-off.
    pub inline_bytes: u32,
    /// `NCCL_BPF_MIN_CHUNK`: smallest piece a large message is cut into across data streams.
    pub min_chunk: u32,
    /// `NCCL_BPF_SPEED_MBPS`: overrides the port speed reported to NCCL (0 = read from sysfs).
    pub speed_mbps: u32,
    /// `NCCL_BPF_TIMEOUT`: seconds after which a stream whose peer host or link died fails
    /// (TCP keepalive and `TCP_USER_TIMEOUT`); 0 turns both off. A live peer, however slow
    /// or stopped, keeps acknowledging at the TCP level and never trips it.
    pub timeout_s: u32,
    /// `NCCL_BPF_HANDSHAKE_TIMEOUT`: seconds an accepted stream has to prove it belongs (hello,
    /// then the answer to the listener's challenge), and a connection's streams have to all
    /// arrive; a stream or connection still incomplete after it is dropped.
    pub handshake_timeout_s: u32,
    /// `NCCL_BPF_IO`: who moves the data streams' chunks (`auto`, `uring`, `epoll`,
    /// `threads`; see `engine`).
    pub io: crate::engine::IoMode,
    /// `NCCL_BPF_IO_WORKERS`: workers of the `uring`/`epoll` engine for the whole process;
    /// 0 = min(4, cores).
    pub io_workers: u32,
    /// `NCCL_BPF_IO_SPIN_US`: microseconds an engine worker spins without work before it
    /// parks in the kernel.
    pub io_spin_us: u32,
    /// `NCCL_BPF_TCP_CONGESTION`: the TCP congestion control of every stream (`reno`, `cubic`,
    /// `bbr`, ...); `None` keeps the system's (`net.ipv4.tcp_congestion_control`).
    pub tcp_congestion: Option<String>,
    /// `NCCL_BPF_NET_INNER`: the network plugin that carries the traffic (a path, or a name
    /// resolved as NCCL resolves `NCCL_NET_PLUGIN`); `None`: ncclbpf's own sockets.
    pub inner: Option<String>,
    /// `NCCL_BPF_NET_SIDE`: whether a connection of the inner plugin gets a side channel of
    /// ours (`inner::side`: the agreement between nodes, one connection id, addresses); `0`
    /// turns it off (the agreement then runs on the node-local relay only).
    pub side: bool,
}

pub const MAX_STREAMS: u32 = 16;

impl Default for Config {
    fn default() -> Self {
        Config {
            nstreams: 4,
            inline_bytes: 64 * 1024,
            min_chunk: 64 * 1024,
            speed_mbps: 0,
            timeout_s: 120,
            handshake_timeout_s: 10,
            io: crate::engine::IoMode::Auto,
            io_workers: 0,
            // Chosen on the GPU machine (bench/results/gpu-2026-12-01-io-sweep.md): spinning
            // 50 µs cost 6-18% of all_reduce bandwidth at 4 ranks and gained no decode time.
            io_spin_us: 0,
            tcp_congestion: None,
            inner: None,
            side: true,
        }
    }
}

/// A value of an `NCCL_BPF_*` variable that could not be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadSetting {
    pub var: &'static str,
    pub value: String,
    pub expected: String,
}

impl fmt::Display for BadSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}={:?} ignored: expected {}",
            self.var, self.value, self.expected
        )
    }
}

fn parse_u32(
    get: &dyn Fn(&str) -> Option<String>,
    var: &'static str,
    min: u32,
    max: u32,
    slot: &mut u32,
    bad: &mut Vec<BadSetting>,
) {
    let Some(value) = get(var) else { return };
    let trimmed = value.trim();
    if trimmed.is_empty() {
        return;
    }
    match parse_size(trimmed) {
        Some(v) if (u64::from(min)..=u64::from(max)).contains(&v) => *slot = v as u32,
        _ => bad.push(BadSetting {
            var,
            value,
            expected: format!("an integer from {min} to {max} (suffix K or M allowed)"),
        }),
    }
}

/// Parses `123`, `64K`, `1M`.
fn parse_size(s: &str) -> Option<u64> {
    let (digits, mult) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 1024),
        b'm' | b'M' => (&s[..s.len() - 1], 1024 * 1024),
        _ => (s, 1),
    };
    digits.parse::<u64>().ok()?.checked_mul(mult)
}

impl Config {
    /// Reads the settings through `get` (the environment in production, a map in tests).
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> (Config, Vec<BadSetting>) {
        let mut c = Config::default();
        let mut bad = Vec::new();
        parse_u32(
            get,
            "NCCL_BPF_NSTREAMS",
            0,
            MAX_STREAMS,
            &mut c.nstreams,
            &mut bad,
        );
        parse_u32(
            get,
            "NCCL_BPF_INLINE_BYTES",
            0,
            1 << 30,
            &mut c.inline_bytes,
            &mut bad,
        );
        parse_u32(
            get,
            "NCCL_BPF_MIN_CHUNK",
            4096,
            1 << 30,
            &mut c.min_chunk,
            &mut bad,
        );
        parse_u32(
            get,
            "NCCL_BPF_SPEED_MBPS",
            0,
            10_000_000,
            &mut c.speed_mbps,
            &mut bad,
        );
        parse_u32(
            get,
            "NCCL_BPF_TIMEOUT",
            0,
            86_400,
            &mut c.timeout_s,
            &mut bad,
        );
        parse_u32(
            get,
            "NCCL_BPF_HANDSHAKE_TIMEOUT",
            1,
            3600,
            &mut c.handshake_timeout_s,
            &mut bad,
        );
        c.inner = get("NCCL_BPF_NET_INNER")
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty());
        let mut side = u32::from(c.side);
        parse_u32(get, "NCCL_BPF_NET_SIDE", 0, 1, &mut side, &mut bad);
        c.side = side == 1;
        if let Some(v) = get("NCCL_BPF_IO").filter(|v| !v.trim().is_empty()) {
            match crate::engine::IoMode::parse(&v) {
                Some(m) => c.io = m,
                None => bad.push(BadSetting {
                    var: "NCCL_BPF_IO",
                    value: v,
                    expected: "auto, uring, epoll or threads".into(),
                }),
            }
        }
        parse_u32(
            get,
            "NCCL_BPF_IO_WORKERS",
            0,
            64,
            &mut c.io_workers,
            &mut bad,
        );
        parse_u32(
            get,
            "NCCL_BPF_IO_SPIN_US",
            0,
            1_000_000,
            &mut c.io_spin_us,
            &mut bad,
        );
        // Settings of earlier releases, said once rather than dropped in silence.
        for var in ["NCCL_BPF_DIRECT_BYTES", "NCCL_BPF_DIRECT_IDLE_US"] {
            if let Some(value) = get(var).filter(|v| !v.trim().is_empty()) {
                bad.push(BadSetting {
                    var,
                    value,
                    expected: "nothing: it is no longer used (the engine reads every chunk as it \
                               arrives; medium messages are not moved by NCCL's proxy thread)"
                        .into(),
                });
            }
        }
        if let Some(v) = get("NCCL_BPF_TCP_CONGESTION") {
            let t = v.trim();
            // The kernel's names: at most 15 bytes (TCP_CA_NAME_MAX 16 with the NUL).
            if !t.is_empty()
                && t.len() <= 15
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            {
                c.tcp_congestion = Some(t.to_string());
            } else if !t.is_empty() {
                bad.push(BadSetting {
                    var: "NCCL_BPF_TCP_CONGESTION",
                    value: v.clone(),
                    expected: "a congestion control name of at most 15 letters, digits, '_' or '-' (e.g. reno, cubic, bbr)".into(),
                });
            }
        }
        (c, bad)
    }

    pub fn from_env() -> (Config, Vec<BadSetting>) {
        Config::from_lookup(&|k| std::env::var(k).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(pairs: &[(&str, &str)]) -> (Config, Vec<BadSetting>) {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(&move |k| m.get(k).cloned())
    }

    #[test]
    fn congestion_control_names() {
        assert_eq!(
            with(&[("NCCL_BPF_TCP_CONGESTION", "reno")])
                .0
                .tcp_congestion
                .as_deref(),
            Some("reno")
        );
        assert_eq!(
            with(&[("NCCL_BPF_TCP_CONGESTION", "")]).0.tcp_congestion,
            None
        );
        for bad in ["no such", "a_name_far_too_long", "bbr;rm"] {
            let (c, b) = with(&[("NCCL_BPF_TCP_CONGESTION", bad)]);
            assert_eq!(c.tcp_congestion, None, "{bad}");
            assert_eq!(b.len(), 1, "{bad}");
            assert!(b[0].to_string().contains("NCCL_BPF_TCP_CONGESTION"));
        }
    }

    #[test]
    fn defaults_when_unset() {
        let (c, bad) = with(&[]);
        assert_eq!(c, Config::default());
        assert!(bad.is_empty());
    }

    #[test]
    fn parses_values_and_suffixes() {
        let (c, bad) = with(&[
            ("NCCL_BPF_NSTREAMS", "8"),
            ("NCCL_BPF_INLINE_BYTES", "64K"),
            ("NCCL_BPF_MIN_CHUNK", "1M"),
        ]);
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(
            (c.nstreams, c.inline_bytes, c.min_chunk),
            (8, 65536, 1 << 20)
        );
    }

    #[test]
    fn settings_no_longer_used_are_reported() {
        let (c, bad) = with(&[("NCCL_BPF_DIRECT_BYTES", "1M")]);
        assert_eq!(c, Config::default());
        assert_eq!(bad.len(), 1);
        assert!(bad[0].to_string().contains("no longer used"), "{}", bad[0]);
    }

    #[test]
    fn bad_values_keep_defaults_and_are_reported() {
        let (c, bad) = with(&[
            ("NCCL_BPF_NSTREAMS", "lots"),
            ("NCCL_BPF_MIN_CHUNK", "12"),
            ("NCCL_BPF_INLINE_BYTES", "99999999999999999999"),
        ]);
        assert_eq!(c, Config::default());
        let vars: Vec<_> = bad.iter().map(|b| b.var).collect();
        assert_eq!(
            vars,
            [
                "NCCL_BPF_NSTREAMS",
                "NCCL_BPF_INLINE_BYTES",
                "NCCL_BPF_MIN_CHUNK"
            ]
        );
        assert!(
            bad[0]
                .to_string()
                .contains("NCCL_BPF_NSTREAMS=\"lots\" ignored")
        );
        let (c, bad) = with(&[("NCCL_BPF_NSTREAMS", "17")]);
        assert_eq!(c.nstreams, 4);
        assert_eq!(bad.len(), 1);
        let (c, bad) = with(&[("NCCL_BPF_TIMEOUT", "-1")]);
        assert_eq!((c.timeout_s, bad.len()), (120, 1));
        let (c, bad) = with(&[("NCCL_BPF_TIMEOUT", "0")]);
        assert_eq!((c.timeout_s, bad.len()), (0, 0));
        let (c, bad) = with(&[("NCCL_BPF_HANDSHAKE_TIMEOUT", "0")]);
        assert_eq!((c.handshake_timeout_s, bad.len()), (10, 1));
        let (c, bad) = with(&[("NCCL_BPF_HANDSHAKE_TIMEOUT", "3")]);
        assert_eq!((c.handshake_timeout_s, bad.len()), (3, 0));
    }
}
