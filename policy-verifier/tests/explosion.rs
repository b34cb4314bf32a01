//! The verifier's budget against state-explosion programs (tests/explode: deep call chains of
//! full stacks, loops whose every iteration stores new states, paths that double).
//!
//! Each program is verified in a child process (this test binary, run again for the ignored
//! test `child`), which reports its verdict, its time (the CPU time of the verifying thread,
//! from /proc/thread-self/schedstat, which other load on the machine does not inflate, and the
//! wall-clock time) and its peak resident memory (`VmHWM` of /proc/self/status, less the
//! figure before verification). A watchdog in the child ends it
//! past `NCCLBPF_EXPLODE_CAP_MB` of resident memory (default 1024) or `NCCLBPF_EXPLODE_MAX_S`
//! seconds (default 120), so a regression
//! fails the test instead of taking the machine's memory.
//!
//! In CI: the worst shapes found so far and a few seeds. The long run, outside CI:
//!
//! ```text
//! NCCLBPF_EXPLODE_SECS=600 NCCLBPF_EXPLODE_SEED=1 \
//!   cargo test --release -p policy-verifier --test explosion -- --ignored --nocapture long_run
//! ```
//!
//! runs the worst shapes, then random shapes from the seed on, until the time is up, and
//! prints every result and the worst by memory and by time.

mod explode;

use explode::Shape;
use policy_verifier::platform::hook;
use policy_verifier::{Limits, verify_insns};
use std::process::Command;
use std::time::{Duration, Instant};

/// The budget the verifier documents (crate::budget): peak memory (above what the process
/// held before) and CPU time of one verification.
const BUDGET_BYTES: u64 = 64 << 20;
const BUDGET_TIME: Duration = Duration::from_millis(2500);
/// Memory outside the states the budget counts (the live path's state, the program's tables,
/// the allocator's slack), and time for what the work units do not see.
const SLACK_BYTES: u64 = 16 << 20;
const SLACK_TIME: Duration = Duration::from_millis(1000);

/// The time one verification may take: the budget's 2.5 s of CPU in a release build; in a
/// debug build (several times slower, the work units the same) the wall-clock backstop.
fn time_budget_ms() -> f64 {
    let t = if cfg!(debug_assertions) {
        Limits::default().max_time
    } else {
        BUDGET_TIME
    };
    (t + SLACK_TIME).as_secs_f64() * 1e3
}

/// What one verification in a child measured.
#[derive(Debug)]
struct Outcome {
    shape: Shape,
    verdict: String,
    insns: usize,
    processed: usize,
    ms: f64,
    cpu_ms: f64,
    peak_bytes: u64,
}

/// CPU time of the calling thread, in ms.
fn cpu_ms() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0.0, |ns| ns as f64 / 1e6)
}

fn vm_hwm_kb() -> u64 {
    field_kb("VmHWM:")
}

fn field_kb(name: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Runs in the child: verifies the shape named by `NCCLBPF_EXPLODE_CHILD`, prints one line.
#[test]
#[ignore = "run by the tests of this file in a child process"]
fn child() {
    let Some(shape) = std::env::var("NCCLBPF_EXPLODE_CHILD")
        .ok()
        .and_then(|s| Shape::parse(&s))
    else {
        return;
    };
    let cap_kb: u64 = std::env::var("NCCLBPF_EXPLODE_CAP_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024)
        * 1024;
    let max = Duration::from_secs(
        std::env::var("NCCLBPF_EXPLODE_MAX_S")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(120),
    );
    let start = Instant::now();
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(Duration::from_millis(5));
            let rss = field_kb("VmRSS:");
            if rss > cap_kb || start.elapsed() > max {
                println!(
                    "EXPLODE verdict=killed rss_kb={rss} after_ms={}",
                    start.elapsed().as_millis()
                );
                std::process::exit(3);
            }
        }
    });
    let prog = shape.program();
    let h = hook(shape.hook).expect("a hook");
    let maps = [];
    let base = vm_hwm_kb();
    let (t, cpu) = (Instant::now(), cpu_ms());
    let r = verify_insns(&prog, h, &maps, Limits::default());
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let cpu = cpu_ms() - cpu;
    let peak = vm_hwm_kb().saturating_sub(base);
    let (verdict, processed) = match &r {
        Ok(s) => (
            format!(
                "accepted ({} states at most, {} KiB; {} work)",
                s.peak_states,
                s.peak_bytes / 1024,
                s.work
            ),
            s.processed,
        ),
        Err(e) => {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or_default().to_string();
            (format!("{}: {first}", e.kind()), e.processed)
        }
    };
    println!(
        "EXPLODE insns={} processed={processed} ms={ms:.1} cpu_ms={cpu:.1} peak_kb={peak} verdict={verdict}",
        prog.len()
    );
}

/// Verifies `shape` in a child process.
fn measure(shape: &Shape) -> Outcome {
    let out = Command::new(std::env::current_exe().expect("the test binary"))
        .args([
            "--exact",
            "child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("NCCLBPF_EXPLODE_CHILD", shape.to_string())
        .output()
        .expect("the child runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find_map(|l| l.split_once("EXPLODE ").map(|(_, r)| r))
        .unwrap_or_else(|| {
            panic!(
                "{shape}: no result from the child ({}):\n{text}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let get = |k: &str| {
        line.split(' ')
            .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
            .unwrap_or("")
    };
    let verdict = line
        .split_once("verdict=")
        .map_or("", |(_, v)| v)
        .to_string();
    if verdict.starts_with("killed") {
        return Outcome {
            shape: shape.clone(),
            verdict: line.to_string(),
            insns: 0,
            processed: 0,
            ms: get("after_ms").parse().unwrap_or(f64::MAX),
            cpu_ms: f64::MAX,
            peak_bytes: get("rss_kb").parse::<u64>().unwrap_or(u64::MAX / 1024) * 1024,
        };
    }
    Outcome {
        shape: shape.clone(),
        verdict,
        insns: get("insns").parse().unwrap_or(0),
        processed: get("processed").parse().unwrap_or(0),
        ms: get("ms").parse().unwrap_or(f64::MAX),
        cpu_ms: get("cpu_ms").parse().unwrap_or(f64::MAX),
        peak_bytes: get("peak_kb").parse::<u64>().unwrap_or(u64::MAX / 1024) * 1024,
    }
}

fn show(o: &Outcome) -> String {
    let verdict: String = o.verdict.chars().take(160).collect();
    format!(
        "{}: {} insns, {} processed, {:.0} ms CPU ({:.0} ms wall), {:.1} MiB: {verdict}",
        o.shape,
        o.insns,
        o.processed,
        o.cpu_ms,
        o.ms,
        o.peak_bytes as f64 / f64::from(1 << 20),
    )
}

/// The budget's breaches among `outcomes`.
fn over_budget(outcomes: &[Outcome]) -> Vec<String> {
    outcomes
        .iter()
        .filter(|o| {
            o.verdict.starts_with("killed")
                || o.peak_bytes > BUDGET_BYTES + SLACK_BYTES
                || o.cpu_ms.min(o.ms) > time_budget_ms()
        })
        .map(show)
        .collect()
}

/// Every worst shape found so far, and a few random ones, stays within the budget.
#[test]
fn state_explosions_stay_within_the_budget() {
    let mut shapes = explode::worst_known();
    shapes.extend((1..=4).map(Shape::from_seed));
    let outcomes: Vec<Outcome> = shapes.iter().map(measure).collect();
    for o in &outcomes {
        println!("{}", show(o));
    }
    let bad = over_budget(&outcomes);
    assert!(bad.is_empty(), "over the budget:\n{}", bad.join("\n"));
}

/// The long run (see the module's documentation).
#[test]
#[ignore = "minutes: NCCLBPF_EXPLODE_SECS, NCCLBPF_EXPLODE_SEED"]
fn long_run() {
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let secs = env("NCCLBPF_EXPLODE_SECS", 60);
    let mut seed = env("NCCLBPF_EXPLODE_SEED", 1);
    let start = Instant::now();
    let mut outcomes = vec![];
    let mut shapes = explode::worst_known().into_iter();
    while start.elapsed() < Duration::from_secs(secs) {
        let shape = shapes.next().unwrap_or_else(|| {
            seed += 1;
            Shape::from_seed(seed - 1)
        });
        let o = measure(&shape);
        println!("{}", show(&o));
        outcomes.push(o);
    }
    let by_mem = outcomes.iter().max_by_key(|o| o.peak_bytes);
    let by_time = outcomes.iter().max_by(|a, b| a.cpu_ms.total_cmp(&b.cpu_ms));
    println!(
        "\n{} programs in {:.0} s",
        outcomes.len(),
        start.elapsed().as_secs_f64()
    );
    if let (Some(m), Some(t)) = (by_mem, by_time) {
        println!("worst by memory: {}\nworst by time: {}", show(m), show(t));
    }
    let bad = over_budget(&outcomes);
    assert!(bad.is_empty(), "over the budget:\n{}", bad.join("\n"));
}
