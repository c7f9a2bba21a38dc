//! The drivers this host can own, by name: the one place that knows every
//! device crate.

use wd_device::{Driver, LegacyPlan};
use wd_ring::Desc;

/// Names of all built-in drivers.
pub const NAMES: &[&str] = &["dummy", "sec", "dummy-async"];

/// The drivers a host owns when none are named (the test device that
/// completes later is only there when asked for).
pub const DEFAULTS: &[&str] = &["dummy", "sec"];

/// A driver by name.
pub fn by_name(name: &str) -> Option<Box<dyn Driver>> {
    match name {
        "dummy" => Some(Box::new(wd_device::dummy::DummyDriver)),
        "sec" => Some(Box::new(wd_sec::SecDriver)),
        "dummy-async" => Some(Box::new(wd_device::dummy_async::DummyAsyncDriver)),
        _ => None,
    }
}

/// How a request of queue type `alg` travels on the legacy (socket) path:
/// the client ranges it gathers and scatters (each device decodes its own
/// messages). `Err` is the status to complete a malformed request with.
pub fn legacy_plan(alg: &str, d: &Desc) -> Result<LegacyPlan, i32> {
    match alg {
        "memcpy" | "memcpy-async" => wd_device::dummy::legacy_plan(d),
        "cipher" | "digest" => wd_sec::msg::legacy_plan(d).map_err(|e| e.status()),
        _ => Err(wd_device::status::EOPNOTSUPP),
    }
}
