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
    /// Of `offload_bytes`, those the device read and wrote where the caller
    /// had them (WrapDrive shared memory), without staging copies. Not part
    /// of the ring's counters (nor of `struct wd_crypto_stats`).
    pub offload_in_place_bytes: u64,
}

/// Bytes offloaded in place, process-wide (rare enough, one per device
/// request, for one shared counter).
static IN_PLACE_BYTES: AtomicU64 = AtomicU64::new(0);

/// Why a request ran on the CPU (the router's reasons).
pub use wd_route::Why;

const N: usize = wd_ring::CLIENT_STATS;

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

pub(crate) fn offloaded_in_place(bytes: usize) {
    offloaded(bytes);
    IN_PLACE_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
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
        offload_in_place_bytes: IN_PLACE_BYTES.load(Ordering::Relaxed),
        ..Stats::from_array(sum)
    }
}

impl Stats {
    /// The counters in the order of `wd_ring::CLIENT_STAT_NAMES` (the ring's
    /// and `struct wd_crypto_stats`'s order).
    pub fn to_array(&self) -> [u64; N] {
        [
            self.offload_requests,
            self.offload_bytes,
            self.cpu_requests,
            self.cpu_bytes,
            self.cpu_below_threshold,
            self.cpu_no_queue,
            self.cpu_host_gone,
            self.cpu_policy,
        ]
    }

    fn from_array(v: [u64; N]) -> Stats {
        let [offload_requests, offload_bytes, cpu_requests, cpu_bytes, cpu_below_threshold, cpu_no_queue, cpu_host_gone, cpu_policy] =
            v;
        Stats {
            offload_requests,
            offload_bytes,
            cpu_requests,
            cpu_bytes,
            cpu_below_threshold,
            cpu_no_queue,
            cpu_host_gone,
            cpu_policy,
            offload_in_place_bytes: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_order_is_the_rings_name_order() {
        let s = Stats::from_array([0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(s.to_array(), [0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(
            (s.offload_requests, s.cpu_bytes, s.cpu_policy),
            (0, 3, 7),
            "{:?}",
            wd_ring::CLIENT_STAT_NAMES
        );
        assert_eq!(wd_ring::CLIENT_STAT_NAMES[3], "cpu_bytes");
        assert_eq!(wd_ring::CLIENT_STAT_NAMES[7], "cpu_policy");
    }
}
