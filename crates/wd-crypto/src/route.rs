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
//! measured round trip beats computing here. Ciphers, AEAD messages and
//! digests are measured apart: GCM on the CPU runs several times faster
//! than a CBC encryption, so a cipher's costs say nothing of it.

use std::cell::RefCell;
use std::time::{Duration, Instant};

pub use wd_route::Route;
use wd_route::{Costs, Queue, Request, Settings};

use crate::config;
use crate::lane::Kind;
use crate::stats::Why;

/// Smallest asynchronous request the `auto` policy offloads.
pub const ASYNC_MIN: usize = 4096;

/// What a request does, as the router tells costs apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// A cipher (ECB, CBC, CTR, XTS) request.
    Cipher,
    /// An AEAD (GCM) message's data.
    Aead,
    /// A digest or MAC.
    Digest,
}

impl Op {
    fn index(self) -> usize {
        self as usize
    }

    /// The lanes its device requests go through.
    fn lane(self) -> Kind {
        match self {
            Op::Cipher | Op::Aead => Kind::Cipher,
            Op::Digest => Kind::Digest,
        }
    }
}

thread_local! {
    /// This thread's measured costs, per operation and size class.
    static COSTS: RefCell<Costs> = RefCell::new(Costs::new(3));
}

/// Where a request of `n` bytes runs, and whether to time it (a sample
/// for the cost estimate: report it with [`record`] or a [`Stopwatch`]).
pub fn choose_timed(op: Op, n: usize, asynchronous: bool) -> (Route, bool) {
    let settings = Settings {
        policy: config::policy(),
        threshold: config::threshold(),
        fallback: config::fallback(),
    };
    let queue = || {
        use crate::lane::{Availability, NoLane};
        match crate::lane::availability(op.lane(), n) {
            Availability::Unavailable(NoLane::NoQueue) => Queue::Missing(Why::NoQueue),
            Availability::Unavailable(NoLane::HostGone) => Queue::Missing(Why::HostGone),
            Availability::Untried => Queue::Untried,
            Availability::Open => Queue::Ready,
        }
    };
    let request = Request {
        op: op.index(),
        bytes: n,
        overlapped: asynchronous,
        overlap_min: (op == Op::Cipher).then_some(ASYNC_MIN),
    };
    COSTS
        .try_with(|c| {
            let d = wd_route::decide(&settings, queue, &mut c.borrow_mut(), request);
            (d.route, d.timed)
        })
        .unwrap_or((Route::Cpu(Why::Policy), false))
}

/// [`choose_timed`] without the timing flag.
pub fn choose(op: Op, n: usize, asynchronous: bool) -> Route {
    choose_timed(op, n, asynchronous).0
}

/// Report how long a timed request took on a path.
pub fn record(op: Op, n: usize, on_cpu: bool, took: Duration) {
    let _ = COSTS.try_with(|c| c.borrow_mut().record(op.index(), n, on_cpu, took));
}

/// This thread's estimates for `op` at `n` bytes: nanoseconds per byte on
/// the CPU and on the device, as far as measured.
pub fn estimate(op: Op, n: usize) -> (Option<f64>, Option<f64>) {
    COSTS
        .try_with(|c| c.borrow().estimate(op.index(), n))
        .unwrap_or((None, None))
}

/// A stopwatch that only runs for timed requests.
pub struct Stopwatch(Option<Instant>);

impl Stopwatch {
    /// Start when `timed`.
    pub fn start(timed: bool) -> Stopwatch {
        Stopwatch(timed.then(Instant::now))
    }

    /// Report the elapsed time (if running).
    pub fn stop(self, op: Op, n: usize, on_cpu: bool) {
        if let Some(t) = self.0 {
            record(op, n, on_cpu, t.elapsed());
        }
    }
}
