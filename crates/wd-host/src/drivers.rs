//! The drivers this host can own, by name: the one place that knows every
//! device crate.

use wd_device::Driver;

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
