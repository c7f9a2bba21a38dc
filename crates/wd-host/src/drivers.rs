//! The drivers this host can own, by name: the one place that knows every
//! device crate.

use wd_device::Driver;

/// Names of all built-in drivers.
pub const NAMES: &[&str] = &["dummy", "sec", "dummy-async"];

/// The drivers a host owns when none are named (the test device that
/// completes later is only there when asked for).
pub const DEFAULTS: &[&str] = &["dummy", "sec"];

/// Whether `name` is a driver this host knows.
pub fn exists(name: &str) -> bool {
    NAMES.contains(&name)
}

/// The driver `name`, computing with `engine` where it has a choice (the
/// device option `engine=`; `None` lets it pick).
pub fn open(name: &str, engine: Option<&str>) -> Result<Box<dyn Driver>, String> {
    let no_choice = |name: &str| match engine {
        None => Ok(()),
        Some(e) => Err(format!("device {name} has no engine choice (engine={e})")),
    };
    match name {
        "dummy" => {
            no_choice(name).map(|_| Box::new(wd_device::dummy::DummyDriver) as Box<dyn Driver>)
        }
        "dummy-async" => no_choice(name)
            .map(|_| Box::new(wd_device::dummy_async::DummyAsyncDriver) as Box<dyn Driver>),
        "sec" => {
            let choice: wd_sec::EngineChoice = engine.unwrap_or("auto").parse()?;
            wd_sec::SecDriver::new(choice)
                .map(|d| Box::new(d) as Box<dyn Driver>)
                .map_err(|e| e.to_string())
        }
        _ => Err(format!(
            "unknown driver '{name}' (available: {})",
            NAMES.join(", ")
        )),
    }
}
