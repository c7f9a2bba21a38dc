//! The offload router: for each request of an algorithm library (crypto,
//! compression), whether it runs on a device or on the CPU, and why.
//!
//! The CPU is one backend among the devices, as in SPDK's accel
//! framework: a library describes a request (which of its operations,
//! how many bytes, whether its caller has other work to overlap with the
//! device's), says whether it has a queue, and the router answers with a
//! [`Decision`] that names the path and the reason, which the library
//! counts. The rules, in order:
//!
//! 1. policy [`Policy::Cpu`]: the CPU;
//! 2. below the threshold: the CPU (a round trip costs more than the work);
//! 3. no queue: the CPU when fallback is allowed, else the device (where
//!    the request fails with a clear error); without fallback, a queue
//!    not yet tried is tried first (the device);
//! 4. policy [`Policy::Offload`]: the device;
//! 5. policy [`Policy::Auto`], the caller overlapping, for an operation
//!    with an overlap minimum: the device from that size on (the caller's
//!    thread is free while it works), the CPU below it (the caller gains
//!    nothing from waiting on a request shorter than its round trip);
//! 6. otherwise by measured cost: per operation and size class, the
//!    cheaper path by a running estimate of nanoseconds per byte, timed
//!    on a sample of requests, the dearer path probed now and then so a
//!    change is noticed. Offloading then never makes a caller slower.
//!
//! Pure logic: the caller reads the clock and reports timings.
#![deny(unsafe_code)]

use std::time::Duration;

/// Where requests above the threshold go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Policy {
    /// Offload what overlaps the caller's work, and the rest when a
    /// measured round trip beats computing here.
    #[default]
    Auto,
    /// Offload everything at or above the threshold.
    Offload,
    /// Compute everything on the CPU.
    Cpu,
}

/// Settings are read alike everywhere (the libraries' environment, the
/// provider's parameters): blanks around a value dropped, words matched
/// without regard to case.
impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Policy, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Policy::Auto),
            "offload" => Ok(Policy::Offload),
            "cpu" => Ok(Policy::Cpu),
            _ => Err(format!("unknown policy '{s}' (auto, offload, cpu)")),
        }
    }
}

/// An on/off setting (the CPU fallback): 1/yes/on/true or 0/no/off/false,
/// read as [`Policy`] is.
pub fn parse_switch(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "yes" | "on" | "true" => Ok(true),
        "0" | "no" | "off" | "false" => Ok(false),
        _ => Err(format!("'{s}' is not 1/yes/on/true or 0/no/off/false")),
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Policy::Auto => "auto",
            Policy::Offload => "offload",
            Policy::Cpu => "cpu",
        })
    }
}

/// Why a request runs on the CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Why {
    /// Below the threshold.
    Threshold,
    /// No host, no device, or every queue in use.
    NoQueue,
    /// The host went away.
    HostGone,
    /// The policy chose the CPU (`cpu`, or cheaper here by measurement).
    Policy,
}

/// Where a request runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// On the CPU, for this reason.
    Cpu(Why),
    /// On the device.
    Device,
}

/// The router's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Where.
    pub route: Route,
    /// Time this request and report it ([`Costs::record`]): a sample for
    /// the cost estimate.
    pub timed: bool,
}

impl Decision {
    fn untimed(route: Route) -> Decision {
        Decision {
            route,
            timed: false,
        }
    }
}

/// A library's routing settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Policy.
    pub policy: Policy,
    /// Requests smaller than this many bytes run on the CPU.
    pub threshold: usize,
    /// Without a queue, run on the CPU (else on the device, which fails).
    pub fallback: bool,
}

/// One request, as the router sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// The library's operation, an index below its [`Costs`]' count.
    pub op: usize,
    /// Bytes of work.
    pub bytes: usize,
    /// The caller has other work while the device runs this one (an
    /// asynchronous request, a batch with more in flight).
    pub overlapped: bool,
    /// For this operation, the smallest overlapped request worth
    /// offloading without measuring (`None`: always measure; an operation
    /// no device runs faster than the CPU, whatever the overlap).
    pub overlap_min: Option<usize>,
}

/// Whether the library has a queue for the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queue {
    /// It has one.
    Ready,
    /// It has none yet and may try to get one (never tried, or a retry
    /// is due): whether a device is there is not known.
    Untried,
    /// It has none for now, for this reason.
    Missing(Why),
}

/// Size classes the cost estimate keeps apart (per-request costs differ
/// by orders of magnitude between them).
const CLASSES: usize = 5;
/// One request in this many of a class is timed.
const SAMPLE_EVERY: u32 = 16;
/// The dearer path is probed every this many requests, times how much
/// dearer it looks (up to [`MAX_PROBE_SPREAD`]).
const PROBE_EVERY: u32 = 256;
const MAX_PROBE_SPREAD: f64 = 64.0;

fn class(n: usize) -> usize {
    match n {
        0..1024 => 0,
        1024..4096 => 1,
        4096..16384 => 2,
        16384..65536 => 3,
        _ => 4,
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Estimate {
    cpu: Option<f64>,
    dev: Option<f64>,
    count: u32,
}

/// The measured cost of each path, per operation and size class: one
/// thread's (or one caller's) view, kept by the library.
#[derive(Clone, Debug)]
pub struct Costs {
    est: Vec<[Estimate; CLASSES]>,
}

impl Costs {
    /// Estimates for `ops` operations, none measured yet.
    pub fn new(ops: usize) -> Costs {
        Costs {
            est: vec![[Estimate::default(); CLASSES]; ops],
        }
    }

    fn choose(&mut self, op: usize, n: usize) -> Decision {
        let Some(classes) = self.est.get_mut(op) else {
            return Decision::untimed(Route::Cpu(Why::Policy));
        };
        let est = &mut classes[class(n)];
        est.count = est.count.wrapping_add(1);
        let sample = est.count % SAMPLE_EVERY == 0;
        match (est.cpu, est.dev) {
            // Each path is timed first before any choice.
            (None, _) => Decision {
                route: Route::Cpu(Why::Policy),
                timed: true,
            },
            (_, None) => Decision {
                route: Route::Device,
                timed: true,
            },
            (Some(c), Some(d)) => {
                let dev_better = d < c;
                // The worse path is tried less often the worse it looks: a
                // probe of a path 20 times dearer costs 20 requests.
                let ratio = if dev_better { c / d } else { d / c };
                let every = (f64::from(PROBE_EVERY) * ratio.clamp(1.0, MAX_PROBE_SPREAD)) as u32;
                let probe = est.count % every.max(1) == 0;
                let route = if dev_better != probe {
                    Route::Device
                } else {
                    Route::Cpu(Why::Policy)
                };
                Decision {
                    route,
                    timed: sample || probe,
                }
            }
        }
    }

    /// Report how long a timed request of `n` bytes took on a path.
    pub fn record(&mut self, op: usize, n: usize, on_cpu: bool, took: Duration) {
        let Some(classes) = self.est.get_mut(op) else {
            return;
        };
        if n == 0 {
            return;
        }
        // Never zero (a coarse clock): two zero estimates would make the
        // probe interval NaN, and every request a probe.
        let per_byte = (took.as_nanos() as f64 / n as f64).max(f64::MIN_POSITIVE);
        let est = &mut classes[class(n)];
        let slot = if on_cpu { &mut est.cpu } else { &mut est.dev };
        // A running minimum that drifts up slowly: a path's first timing
        // includes cold caches and set-up and must not make it look dear
        // for long; a path that really got dearer shows within a few
        // dozen samples.
        *slot = Some(match *slot {
            None => per_byte,
            Some(old) => per_byte.min(old * 1.05),
        });
    }

    /// The current estimates of an operation's size class holding `n`
    /// (nanoseconds per byte on the CPU and on the device).
    pub fn estimate(&self, op: usize, n: usize) -> (Option<f64>, Option<f64>) {
        self.est
            .get(op)
            .map_or((None, None), |c| (c[class(n)].cpu, c[class(n)].dev))
    }
}

/// The route the settings alone give a request of `bytes` (the first
/// rules of [`decide`]), else `None`: a caller with one small request can
/// learn that it runs on the CPU without preparing the rest of a decision
/// (the queue's state, a batch's bookkeeping), which costs more than the
/// work on a few dozen bytes.
pub fn by_settings(s: &Settings, bytes: usize) -> Option<Route> {
    if s.policy == Policy::Cpu {
        return Some(Route::Cpu(Why::Policy));
    }
    if bytes < s.threshold {
        return Some(Route::Cpu(Why::Threshold));
    }
    None
}

/// Where `r` runs (the rules of the crate's documentation). `queue` is
/// asked only when the answer depends on it (finding out may cost a
/// clock read).
pub fn decide(
    s: &Settings,
    queue: impl FnOnce() -> Queue,
    costs: &mut Costs,
    r: Request,
) -> Decision {
    if let Some(route) = by_settings(s, r.bytes) {
        return Decision::untimed(route);
    }
    match queue() {
        // Without fallback the request goes to the device anyway, to fail
        // there with a clear error; with a queue, fallback changes
        // nothing (the auto policy's CPU path is a choice, not a
        // fallback).
        Queue::Missing(why) => {
            return Decision::untimed(match s.fallback {
                true => Route::Cpu(why),
                false => Route::Device,
            })
        }
        // Not known yet: without fallback, found out on this request
        // (which fails clearly if there is none), or a first sample on
        // the CPU would hide a missing device from a caller who asked to
        // be told.
        Queue::Untried if !s.fallback => return Decision::untimed(Route::Device),
        Queue::Ready | Queue::Untried => {}
    }
    if s.policy == Policy::Offload {
        return Decision::untimed(Route::Device);
    }
    if r.overlapped {
        if let Some(min) = r.overlap_min {
            return Decision::untimed(if r.bytes >= min {
                Route::Device
            } else {
                Route::Cpu(Why::Policy)
            });
        }
    }
    costs.choose(r.op, r.bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Read alike by both libraries: WD_COMP_FALLBACK took only "0" (so
    /// "off" left the fallback on), and WD_COMP_POLICY=" Auto " failed.
    #[test]
    fn settings_are_read_without_blanks_or_case() {
        for (v, want) in [
            (" Off ", false),
            ("no", false),
            ("0", false),
            ("TRUE", true),
        ] {
            assert_eq!(parse_switch(v), Ok(want), "{v:?}");
        }
        assert!(parse_switch("maybe").unwrap_err().contains("'maybe'"));
        assert_eq!(" Auto ".parse::<Policy>(), Ok(Policy::Auto));
        assert_eq!("CPU".parse::<Policy>(), Ok(Policy::Cpu));
        assert!("fast".parse::<Policy>().is_err());
    }

    const AUTO: Settings = Settings {
        policy: Policy::Auto,
        threshold: 256,
        fallback: true,
    };

    fn req(bytes: usize, overlapped: bool) -> Request {
        Request {
            op: 0,
            bytes,
            overlapped,
            overlap_min: Some(4096),
        }
    }

    #[test]
    fn rules_apply_in_order() {
        let mut c = Costs::new(1);
        let cpu = Settings {
            policy: Policy::Cpu,
            ..AUTO
        };
        assert_eq!(
            decide(&cpu, || Queue::Ready, &mut c, req(1 << 20, true)).route,
            Route::Cpu(Why::Policy)
        );
        assert_eq!(
            decide(&AUTO, || Queue::Ready, &mut c, req(100, true)).route,
            Route::Cpu(Why::Threshold)
        );
        let gone = Queue::Missing(Why::HostGone);
        assert_eq!(
            decide(&AUTO, || gone, &mut c, req(1 << 20, true)).route,
            Route::Cpu(Why::HostGone)
        );
        let strict = Settings {
            fallback: false,
            ..AUTO
        };
        assert_eq!(
            decide(&strict, || gone, &mut c, req(1 << 20, true)).route,
            Route::Device
        );
        let off = Settings {
            policy: Policy::Offload,
            ..AUTO
        };
        assert_eq!(
            decide(&off, || Queue::Ready, &mut c, req(300, false)).route,
            Route::Device
        );
        assert_eq!(
            decide(&AUTO, || Queue::Ready, &mut c, req(8192, true)).route,
            Route::Device
        );
        assert_eq!(
            decide(&AUTO, || Queue::Ready, &mut c, req(1024, true)).route,
            Route::Cpu(Why::Policy)
        );
        assert_eq!("offload".parse::<Policy>(), Ok(Policy::Offload));
        assert!("fast".parse::<Policy>().is_err());
    }

    /// Timings of zero (a coarse clock) still leave the router choosing
    /// and probing now and then, not probing on every request.
    #[test]
    fn zero_timings_do_not_make_every_request_a_probe() {
        let mut c = Costs::new(1);
        let mut probes = 0;
        for _ in 0..10_000 {
            let d = decide(&AUTO, || Queue::Ready, &mut c, req(10_000, false));
            if d.timed {
                c.record(0, 10_000, d.route != Route::Device, Duration::ZERO);
            }
            probes += usize::from(d.route == Route::Device);
        }
        assert!(
            probes < 100,
            "{probes} of 10000 requests went the other way"
        );
    }

    /// Against a model: with each path's cost fixed, the router settles
    /// on the cheaper one and still probes the other rarely.
    #[test]
    fn measurement_finds_the_cheaper_path() {
        for (cpu_ns, dev_ns) in [(1.0, 3.0), (3.0, 1.0)] {
            let mut c = Costs::new(2);
            let (mut on_dev, mut total) = (0, 0);
            // Miri interprets every instruction: a shorter run there.
            let iterations = if cfg!(miri) { 4_000 } else { 100_000 };
            for i in 0..iterations {
                let d = decide(&AUTO, || Queue::Ready, &mut c, req(10_000, false));
                let on_cpu = d.route != Route::Device;
                if d.timed {
                    let ns = if on_cpu { cpu_ns } else { dev_ns } * 10_000.0;
                    c.record(0, 10_000, on_cpu, Duration::from_nanos(ns as u64));
                }
                if i >= 1000 {
                    total += 1;
                    on_dev += usize::from(!on_cpu);
                }
            }
            let share = on_dev as f64 / total as f64;
            if dev_ns < cpu_ns {
                assert!(share > 0.99, "{share}");
            } else {
                assert!(share < 0.01 && share > 0.0, "{share}");
            }
            // The other operation knows nothing yet.
            assert_eq!(c.estimate(1, 10_000), (None, None));
        }
    }

    proptest! {
        /// Any request, any settings: a decision, and a CPU decision
        /// always says why.
        #[test]
        fn decisions_are_total(bytes in 0usize..1 << 30, overlapped: bool, policy in 0u8..3,
                               threshold in 0usize..1 << 20, fallback: bool, missing in 0u8..4, op in 0usize..4) {
            let s = Settings {
                policy: [Policy::Auto, Policy::Offload, Policy::Cpu][policy as usize],
                threshold,
                fallback,
            };
            let q = [Queue::Ready, Queue::Missing(Why::NoQueue), Queue::Missing(Why::HostGone), Queue::Untried][missing as usize];
            let mut c = Costs::new(2);
            let d = decide(&s, || q, &mut c, Request { op, bytes, overlapped, overlap_min: None });
            if s.policy == Policy::Cpu {
                prop_assert_eq!(d.route, Route::Cpu(Why::Policy));
            }
            if bytes < threshold && s.policy != Policy::Cpu {
                prop_assert_eq!(d.route, Route::Cpu(Why::Threshold));
            }
            // What the settings settle, decide answers alike, untimed,
            // whatever the queue.
            if let Some(r) = by_settings(&s, bytes) {
                prop_assert_eq!(d, Decision { route: r, timed: false });
            }
        }
    }
}
