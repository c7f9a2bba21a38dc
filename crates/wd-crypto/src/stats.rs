//! Counters of where requests were computed: the proof that the library
//! never falls back to the CPU silently.

use std::sync::atomic::{AtomicU64, Ordering};

/// Where requests went, process-wide, since start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Requests computed by the device.
    pub offload_requests: u64,
    /// Bytes computed by the device.
    pub offload_bytes: u64,
    /// Requests computed on the CPU, for any reason.
    pub cpu_requests: u64,
    /// Bytes computed on the CPU.
    pub cpu_bytes: u64,
    /// CPU requests because they were below the threshold.
    pub cpu_below_threshold: u64,
    /// CPU requests because no queue could be had.
    pub cpu_no_queue: u64,
    /// CPU requests because the host went away.
    pub cpu_host_gone: u64,
    /// CPU requests because the policy chose the CPU (cheaper here).
    pub cpu_policy: u64,
}

/// Why a request ran on the CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// Below the threshold.
    Threshold,
    /// No host, no device, or every queue in use.
    NoQueue,
    /// The host went away.
    HostGone,
    /// The policy chose the CPU (cheaper here, or `cpu`).
    Policy,
}

const N: usize = 8;

/// One thread's counters: written only by that thread (a plain load and
/// store, no locked instruction on the hot path), read by anyone.
struct Counters([AtomicU64; N]);

/// Counters of live threads, and the sums of threads that exited.
struct Registry {
    live: Vec<std::sync::Arc<Counters>>,
    exited: [u64; N],
}

static REGISTRY: std::sync::Mutex<Registry> = std::sync::Mutex::new(Registry {
    live: Vec::new(),
    exited: [0; N],
});

/// Folds a thread's counters into `exited` when the thread ends.
struct Mine(std::sync::Arc<Counters>);

impl Drop for Mine {
    fn drop(&mut self) {
        let mut r = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
        for (e, c) in r.exited.iter_mut().zip(self.0 .0.iter()) {
            *e += c.load(Ordering::Relaxed);
        }
        r.live.retain(|c| !std::sync::Arc::ptr_eq(c, &self.0));
    }
}

thread_local! {
    static MINE: Mine = {
        let c = std::sync::Arc::new(Counters([const { AtomicU64::new(0) }; N]));
        REGISTRY.lock().unwrap_or_else(|e| e.into_inner()).live.push(c.clone());
        Mine(c)
    };
}

fn add(i: usize, j: usize, k: usize, bytes: usize) {
    // try_with: counting during thread exit is dropped, not a panic.
    let _ = MINE.try_with(|m| {
        let c = &m.0 .0;
        for (idx, v) in [(i, 1), (j, bytes as u64), (k, 1)] {
            if idx < N {
                c[idx].store(c[idx].load(Ordering::Relaxed) + v, Ordering::Relaxed);
            }
        }
    });
}

pub(crate) fn offloaded(bytes: usize) {
    add(0, 1, N, bytes);
}

/// Count `requests` computed on the CPU by a caller that routes requests
/// itself (an OpenSSL provider's inline path), `bytes` in all.
pub fn count_cpu(requests: u64, bytes: u64, why: Why) {
    let k = match why {
        Why::Threshold => 4,
        Why::NoQueue => 5,
        Why::HostGone => 6,
        Why::Policy => 7,
    };
    let _ = MINE.try_with(|m| {
        let c = &m.0 .0;
        for (idx, v) in [(2, requests), (3, bytes), (k, requests)] {
            c[idx].store(c[idx].load(Ordering::Relaxed) + v, Ordering::Relaxed);
        }
    });
}

pub(crate) fn on_cpu(bytes: usize, why: Why) {
    let k = match why {
        Why::Threshold => 4,
        Why::NoQueue => 5,
        Why::HostGone => 6,
        Why::Policy => 7,
    };
    add(2, 3, k, bytes);
}

/// A snapshot of the counters, summed over every thread.
pub fn stats() -> Stats {
    let r = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    let mut sum = r.exited;
    for c in &r.live {
        for (s, v) in sum.iter_mut().zip(c.0.iter()) {
            *s += v.load(Ordering::Relaxed);
        }
    }
    Stats {
        offload_requests: sum[0],
        offload_bytes: sum[1],
        cpu_requests: sum[2],
        cpu_bytes: sum[3],
        cpu_below_threshold: sum[4],
        cpu_no_queue: sum[5],
        cpu_host_gone: sum[6],
        cpu_policy: sum[7],
    }
}
