//! Where a request runs: the threshold, the policy, and for synchronous
//! requests under the `auto` policy, a per-thread measurement of what each
//! path costs, so that offloading never makes a caller slower.
//!
//! An asynchronous caller's thread is free while the device works, so its
//! cipher requests are offloaded from `ASYNC_MIN` up (below it the staging
//! copies and the wake-up cost the caller more than the work itself).
//! Digests are decided by measurement either way (no multi-buffer engine
//! makes a device digest cheaper than the CPU's).
//!
//! A synchronous caller waits either way, so the device only pays when its
//! round trip beats computing here. The router keeps, per request-size
//! class, a moving average of nanoseconds per request on each path, timed
//! on a sample of requests (timing every request would cost more than a
//! small request itself), and sends each request to the cheaper path,
//! re-measuring the other one now and then so a change is noticed.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use crate::config::{self, Policy};
pub use crate::lane::Kind;
use crate::stats::Why;

/// A routing decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Compute here, counted under this reason.
    Cpu(Why),
    /// Send to the device.
    Device,
}

/// Smallest asynchronous request the `auto` policy offloads.
pub const ASYNC_MIN: usize = 4096;
/// Time one request in this many (per size class).
const SAMPLE_EVERY: u32 = 16;
/// Try the path that looks worse once in this many requests, times how
/// much worse it looks (at most `MAX_PROBE_SPREAD` times).
const PROBE_EVERY: u32 = 256;
/// See [`PROBE_EVERY`]: a path is re-tried at least once in 16384.
const MAX_PROBE_SPREAD: f64 = 64.0;
/// Size classes: < 1 KiB, < 4 KiB, < 16 KiB, < 64 KiB, larger.
const CLASSES: usize = 5;

fn class(n: usize) -> usize {
    match n {
        0..1024 => 0,
        1024..4096 => 1,
        4096..16384 => 2,
        16384..65536 => 3,
        _ => 4,
    }
}

#[derive(Clone, Copy, Default)]
struct Estimate {
    /// Moving averages of ns per byte, CPU and device (None: unmeasured).
    cpu: Option<f64>,
    dev: Option<f64>,
    count: u32,
}

thread_local! {
    static EST: RefCell<[[Estimate; CLASSES]; 2]> = RefCell::new([[Estimate::default(); CLASSES]; 2]);
}

fn kind_index(k: Kind) -> usize {
    match k {
        Kind::Cipher => 0,
        Kind::Digest => 1,
    }
}

/// Decide where a request of `n` bytes goes; the second value says whether
/// to time it (report with [`record`]).
pub fn choose_timed(kind: Kind, n: usize, asynchronous: bool) -> (Route, bool) {
    let policy = config::policy();
    if policy == Policy::Cpu {
        return (Route::Cpu(Why::Policy), false);
    }
    if n < config::threshold() {
        return (Route::Cpu(Why::Threshold), false);
    }
    if !config::fallback() {
        // Every request must reach the device (and fail clearly without one).
        return (Route::Device, false);
    }
    if let Some(no) = crate::lane::known_unavailable(kind, n) {
        let why = match no {
            crate::lane::NoLane::NoQueue => Why::NoQueue,
            crate::lane::NoLane::HostGone => Why::HostGone,
        };
        return (Route::Cpu(why), false);
    }
    if policy == Policy::Offload {
        return (Route::Device, false);
    }
    if asynchronous && kind == Kind::Cipher {
        // An asynchronous request still costs its caller's thread the
        // staging copies and a wake-up: below ASYNC_MIN that is more than
        // computing it here. (Digests have no multi-buffer engine behind
        // them: a device digest is no cheaper than the CPU's, so the
        // measured comparison below decides for them, as when synchronous.)
        if n < ASYNC_MIN {
            return (Route::Cpu(Why::Policy), false);
        }
        return (Route::Device, false);
    }
    EST.with(|e| {
        let mut e = e.borrow_mut();
        let est = &mut e[kind_index(kind)][class(n)];
        est.count = est.count.wrapping_add(1);
        let sample = est.count % SAMPLE_EVERY == 0;
        match (est.cpu, est.dev) {
            (None, _) => (Route::Cpu(Why::Policy), true),
            (_, None) => (Route::Device, true),
            (Some(c), Some(d)) => {
                let dev_better = d < c;
                // The worse path is tried less often the worse it looks:
                // a probe of a path 20 times dearer costs 20 requests.
                let ratio = if dev_better { c / d } else { d / c };
                let every = (f64::from(PROBE_EVERY) * ratio.clamp(1.0, MAX_PROBE_SPREAD)) as u32;
                let probe = est.count % every.max(1) == 0;
                let take_dev = dev_better != probe;
                let r = if take_dev {
                    Route::Device
                } else {
                    Route::Cpu(Why::Policy)
                };
                (r, sample || probe)
            }
        }
    })
}

/// Decide where a request goes (no timing).
pub fn choose(kind: Kind, n: usize, asynchronous: bool) -> Route {
    choose_timed(kind, n, asynchronous).0
}

/// Report how long a timed request of `n` bytes took on its path.
pub fn record(kind: Kind, n: usize, on_cpu: bool, took: Duration) {
    if n == 0 {
        return;
    }
    let per_byte = took.as_nanos() as f64 / n as f64;
    EST.with(|e| {
        let mut e = e.borrow_mut();
        let est = &mut e[kind_index(kind)][class(n)];
        let slot = if on_cpu { &mut est.cpu } else { &mut est.dev };
        // A running minimum that drifts up slowly: the first timing of a
        // path includes cold caches and set-up, and must not make it look
        // dear for long; a path that really got dearer is noticed within a
        // few dozen samples.
        *slot = Some(match *slot {
            None => per_byte,
            Some(old) => per_byte.min(old * 1.05),
        });
    });
}

/// A stopwatch that only runs for timed requests.
pub struct Stopwatch(Option<Instant>);

impl Stopwatch {
    /// Start when `timed`.
    pub fn start(timed: bool) -> Stopwatch {
        Stopwatch(timed.then(Instant::now))
    }

    /// Report the elapsed time (if running).
    pub fn stop(self, kind: Kind, n: usize, on_cpu: bool) {
        if let Some(t) = self.0 {
            record(kind, n, on_cpu, t.elapsed());
        }
    }
}
