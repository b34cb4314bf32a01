//! What the subcommands share: child processes (one per arm, so that each gets its own plugin
//! settings), figures over rounds, the machine line of a table.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The prefix of a result line a child prints: `@result <key> <value>`.
pub const RESULT: &str = "@result";

/// Prints one result for the parent.
pub fn emit(key: &str, value: impl std::fmt::Display) {
    println!("{RESULT} {key} {value}");
}

/// A child's results, by key.
pub type Results = BTreeMap<String, String>;

/// Runs this binary again as `args`, with `env` set (`None`: removed), and collects its
/// `@result` lines. A child that fails, or runs past `timeout` (then killed), is an `Err`
/// naming its exit and its last stderr lines.
pub fn child(
    args: &[String],
    env: &[(&str, Option<String>)],
    timeout: Duration,
) -> Result<Results, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let mut ch = cmd.spawn().map_err(|e| format!("spawn {args:?}: {e}"))?;
    // Drained on threads so that a child writing much never blocks on a full pipe.
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut r) = r {
                let _ = r.read_to_string(&mut s);
            }
            s
        })
    };
    let out = drain(
        ch.stdout
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let err = drain(
        ch.stderr
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + timeout;
    let mut timed_out = false;
    let status = loop {
        match ch.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) if Instant::now() > deadline => {
                // Ours: spawned above and not yet reaped.
                let _ = ch.kill();
                timed_out = true;
                break ch.wait().ok();
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(format!("wait {args:?}: {e}")),
        }
    };
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    let mut res = Results::new();
    for line in stdout.lines() {
        if let Some(rest) = line.strip_prefix(RESULT) {
            let mut it = rest.trim().splitn(2, ' ');
            if let (Some(k), Some(v)) = (it.next(), it.next()) {
                res.insert(k.to_string(), v.to_string());
            }
        }
    }
    if timed_out || !status.is_some_and(|s| s.success()) {
        let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        let how = if timed_out {
            format!("killed after {timeout:?}")
        } else {
            status.map_or("?".into(), |s| s.to_string())
        };
        return Err(format!("{} ({how}): {}", args.join(" "), tail.join(" / ")));
    }
    Ok(res)
}

/// Median, minimum and maximum of `v` (not empty).
pub fn spread(v: &[f64]) -> (f64, f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let med = if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    };
    (med, s[0], s[n - 1])
}

/// `median (min–max)` with `prec` decimals; one value alone when there is one round.
pub fn cell(v: &[f64], prec: usize) -> String {
    cell_unit(v, prec, "")
}

/// [`cell`] with `unit` after the median: `0.92× (0.85–0.97)`.
pub fn cell_unit(v: &[f64], prec: usize, unit: &str) -> String {
    if v.is_empty() {
        return "–".into();
    }
    let (m, lo, hi) = spread(v);
    if v.len() == 1 {
        format!("{m:.prec$}{unit}")
    } else {
        format!("{m:.prec$}{unit} ({lo:.prec$}–{hi:.prec$})")
    }
}

/// The value of `ncclbpf_policies::object("src/<name>.o")`, or `NCCLBPF_BENCH_POLICY`.
pub fn policy(name: &str) -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("NCCLBPF_BENCH_POLICY") {
        return Ok(p.into());
    }
    let p = ncclbpf_policies::object(&format!("src/{name}.o"))?;
    Ok(p.canonicalize().unwrap_or(p))
}

/// The settings every plugin arm of one run gets: those of this environment, and
/// `NCCL_BPF_NSTREAMS` from `--streams` when the environment has none.
pub fn plugin_env(streams: Option<u32>) -> Vec<(&'static str, Option<String>)> {
    let mut env = vec![];
    if std::env::var_os("NCCL_SOCKET_IFNAME").is_none() {
        env.push(("NCCL_SOCKET_IFNAME", Some("lo".into())));
    }
    if std::env::var_os("NCCL_BPF_NSTREAMS").is_none()
        && let Some(s) = streams
    {
        env.push(("NCCL_BPF_NSTREAMS", Some(s.to_string())));
    }
    env
}

/// The settings the children read (the plugin's own parser, so that the raw TCP arms use the
/// same shape as the plugin does), after `plugin_env`.
pub fn shape(streams: Option<u32>) -> ncclbpf_netplugin::config::Config {
    let extra = plugin_env(streams);
    let get = |k: &str| {
        extra
            .iter()
            .find(|(e, _)| *e == k)
            .and_then(|(_, v)| v.clone())
            .or_else(|| std::env::var(k).ok())
    };
    ncclbpf_netplugin::config::Config::from_lookup(&get).0
}

/// `nproc`, the kernel and today's date (UTC), for the line above a table.
pub fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into());
    let days = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 86400) as i64;
    let (y, m, d) = civil(days);
    // TCP's congestion control decides whether loopback sockets are paced (BBR paces each
    // socket with its own timer where the device has no fq qdisc, as `lo` has none), which moved
    // throughput by 2× in bench/results/perf-loopback-2026-12-01.md: say it with every table.
    let cc = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into());
    format!(
        "{cores} cores (nproc), kernel {kernel}, TCP congestion control {cc}, {y:04}-{m:02}-{d:02}"
    )
}

/// A progress line on stderr, rewritten in place; only when stderr is a terminal. `None` ends
/// it (clears the line).
pub fn progress(msg: Option<std::fmt::Arguments>) {
    use std::io::{IsTerminal, Write};
    let mut e = std::io::stderr();
    if !e.is_terminal() {
        return;
    }
    let _ = match msg {
        Some(m) => write!(e, "\r\x1b[K{m}"),
        None => write!(e, "\r\x1b[K"),
    };
    let _ = e.flush();
}

/// The 1-minute load average (`/proc/loadavg`), to tell a quiet machine from a busy one.
pub fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Days since 1970-01-01 to a (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// `size` in B, KiB or MiB.
pub fn human(size: usize) -> String {
    if size >= 1 << 20 && size.is_multiple_of(1 << 20) {
        format!("{} MiB", size >> 20)
    } else if size >= 1024 && size.is_multiple_of(1024) {
        format!("{} KiB", size >> 10)
    } else {
        format!("{size} B")
    }
}

/// `64K`, `64KiB`, `1M`, `1MiB` or a number of bytes (not 0).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (num, shift) = if let Some(n) = t.strip_suffix("KiB").or_else(|| t.strip_suffix('K')) {
        (n, 10)
    } else if let Some(n) = t.strip_suffix("MiB").or_else(|| t.strip_suffix('M')) {
        (n, 20)
    } else {
        (t, 0)
    };
    let n: usize = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?}: not a size (bytes, or with K/KiB or M/MiB)"))?;
    match n.checked_shl(shift) {
        Some(v) if v > 0 && v >> shift == n => Ok(v),
        _ => Err(format!("{s:?}: size out of range")),
    }
}

/// A subcommand's end: lists the measurements that failed, if any, and fails with their count.
pub fn failures(errors: &[String]) -> Result<(), String> {
    if errors.is_empty() {
        return Ok(());
    }
    println!("\nfailed measurements ({}):", errors.len());
    for e in errors {
        println!("- {e}");
    }
    Err(format!("{} measurement(s) failed", errors.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_spread() {
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(19_723), (2024, 1, 1));
        assert_eq!(civil(20_513), (2026, 3, 1));
        assert_eq!(spread(&[3.0, 1.0, 2.0]), (2.0, 1.0, 3.0));
        assert_eq!(spread(&[4.0, 1.0]), (2.5, 1.0, 4.0));
        assert_eq!(cell(&[1.0], 1), "1.0");
        assert_eq!(cell(&[1.0, 3.0, 2.0], 1), "2.0 (1.0–3.0)");
        assert_eq!(human(8), "8 B");
        assert_eq!(human(128 << 10), "128 KiB");
        assert_eq!(human(256 << 20), "256 MiB");
    }
}
