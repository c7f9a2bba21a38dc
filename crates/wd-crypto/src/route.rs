//! Where a crypto request runs: the library's side of the offload router
//! (`wd-route`, shared with the compression library). It describes each
//! request to the router (operation, bytes, whether the caller overlaps
//! it) and keeps this thread's measured costs.
//!
//! An asynchronous caller's thread is free while the device works, so its
//! cipher requests are offloaded from `ASYNC_MIN` up (below it the staging
//! copies and the wake-up cost the caller more than the work itself).
//! Digests are decided by measurement either way (no multi-buffer engine
//! makes a device digest cheaper than the CPU's). A synchronous caller
//! waits either way, so the device only takes its requests when its
//! measured round trip beats computing here.

use std::cell::RefCell;
use std::time::{Duration, Instant};

pub use wd_route::Route;
use wd_route::{Costs, Queue, Request, Settings};

use crate::config;
pub use crate::lane::Kind;
use crate::stats::Why;

/// Smallest asynchronous request the `auto` policy offloads.
pub const ASYNC_MIN: usize = 4096;

fn op(kind: Kind) -> usize {
    match kind {
        Kind::Cipher => 0,
        Kind::Digest => 1,
    }
}

thread_local! {
    /// This thread's measured costs, per operation and size class.
    static COSTS: RefCell<Costs> = RefCell::new(Costs::new(2));
}

/// Where a request of `n` bytes runs, and whether to time it (a sample
/// for the cost estimate: report it with [`record`] or a [`Stopwatch`]).
pub fn choose_timed(kind: Kind, n: usize, asynchronous: bool) -> (Route, bool) {
    let settings = Settings {
        policy: config::policy(),
        threshold: config::threshold(),
        fallback: config::fallback(),
    };
    let queue = || match crate::lane::known_unavailable(kind, n) {
        Some(crate::lane::NoLane::NoQueue) => Queue::Missing(Why::NoQueue),
        Some(crate::lane::NoLane::HostGone) => Queue::Missing(Why::HostGone),
        None => Queue::Ready,
    };
    let request = Request {
        op: op(kind),
        bytes: n,
        overlapped: asynchronous,
        overlap_min: (kind == Kind::Cipher).then_some(ASYNC_MIN),
    };
    COSTS
        .try_with(|c| {
            let d = wd_route::decide(&settings, queue, &mut c.borrow_mut(), request);
            (d.route, d.timed)
        })
        .unwrap_or((Route::Cpu(Why::Policy), false))
}

/// [`choose_timed`] without the timing flag.
pub fn choose(kind: Kind, n: usize, asynchronous: bool) -> Route {
    choose_timed(kind, n, asynchronous).0
}

/// Report how long a timed request took on a path.
pub fn record(kind: Kind, n: usize, on_cpu: bool, took: Duration) {
    let _ = COSTS.try_with(|c| c.borrow_mut().record(op(kind), n, on_cpu, took));
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
