//! Who holds the host, and starting and stopping it.
//!
//! Every plugin type holds the host while NCCL has one of its contexts open: the tuner and the
//! profiler from each context's `init` to its `finalize`, the net plugin v11+ likewise per
//! context, net v7-v10 (no `finalize`) from its `init` to the process's exit. The first hold
//! starts the control socket (once per process, unless `NCCL_BPF_CONTROL=0`) and the metrics
//! endpoint (with `NCCL_BPF_METRICS_ADDR`); the last release stops the endpoint, its thread
//! joined and its port file removed, so nothing of it runs when NCCL could unload the library.
//! A later hold starts it again. The control socket stays for the process's life: its thread
//! pins the library (`ncclbpf_control::server`), and `ncclbpf status` of a process between
//! communicators should still answer.
//!
//! Every hold also retries what failed to start: an endpoint whose address could not be bound
//! is tried again (and warned about once per value).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;

/// The plugin types that hold the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Net = 0,
    Tuner = 1,
    Profiler = 2,
}

impl Part {
    pub fn name(self) -> &'static str {
        match self {
            Part::Net => "net plugin",
            Part::Tuner => "tuner",
            Part::Profiler => "profiler",
        }
    }
}

static HOLDS: Mutex<[usize; 3]> = Mutex::new([0; 3]);

fn holds() -> std::sync::MutexGuard<'static, [usize; 3]> {
    HOLDS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The holds of each part now (net, tuner, profiler).
pub fn held() -> [usize; 3] {
    *holds()
}

/// `part` opened a context (or, net v7-v10, was initialised): starts the host if it is the
/// first hold, retries what did not start before. Never panics.
pub fn acquire(part: Part) {
    let r = catch_unwind(AssertUnwindSafe(|| {
        let first = {
            let mut h = holds();
            let first = h.iter().all(|&n| n == 0);
            h[part as usize] += 1;
            first
        };
        if first {
            crate::hlog!(INFO, INIT, "host started by the {}", part.name());
        }
        crate::control::start();
        crate::metrics_endpoint::on_init();
    }));
    if r.is_err() {
        crate::hlog!(
            WARN,
            INIT,
            "starting the host for the {} panicked (caught)",
            part.name()
        );
    }
}

/// `part` closed a context: the last release of every part stops the metrics endpoint.
/// One release more than holds is ignored. Never panics.
pub fn release(part: Part) {
    let r = catch_unwind(AssertUnwindSafe(|| {
        let last = {
            let mut h = holds();
            if h[part as usize] == 0 {
                return;
            }
            h[part as usize] -= 1;
            h.iter().all(|&n| n == 0)
        };
        if last {
            crate::metrics_endpoint::stop(part.name());
        }
    }));
    if r.is_err() {
        crate::hlog!(
            WARN,
            INIT,
            "stopping the host for the {} panicked (caught)",
            part.name()
        );
    }
}
