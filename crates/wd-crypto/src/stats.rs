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
pub(crate) enum Why {
    Threshold,
    NoQueue,
    HostGone,
    Policy,
}

struct Counters([AtomicU64; 8]);

static C: Counters = Counters([const { AtomicU64::new(0) }; 8]);

pub(crate) fn offloaded(bytes: usize) {
    C.0[0].fetch_add(1, Ordering::Relaxed);
    C.0[1].fetch_add(bytes as u64, Ordering::Relaxed);
}

pub(crate) fn on_cpu(bytes: usize, why: Why) {
    C.0[2].fetch_add(1, Ordering::Relaxed);
    C.0[3].fetch_add(bytes as u64, Ordering::Relaxed);
    let i = match why {
        Why::Threshold => 4,
        Why::NoQueue => 5,
        Why::HostGone => 6,
        Why::Policy => 7,
    };
    C.0[i].fetch_add(1, Ordering::Relaxed);
}

/// A snapshot of the counters.
pub fn stats() -> Stats {
    let g = |i: usize| C.0[i].load(Ordering::Relaxed);
    Stats {
        offload_requests: g(0),
        offload_bytes: g(1),
        cpu_requests: g(2),
        cpu_bytes: g(3),
        cpu_below_threshold: g(4),
        cpu_no_queue: g(5),
        cpu_host_gone: g(6),
        cpu_policy: g(7),
    }
}
