//! The drivers this host can own, by name: the one place that knows every
//! device crate.

use wd_device::Driver;

use crate::config::DeviceConfig;

/// Names of all built-in drivers.
pub const NAMES: &[&str] = &["dummy", "sec", "zip", "dummy-async", "nvme"];

/// The drivers a host owns when none are named (the test device that
/// completes later is only there when asked for).
pub const DEFAULTS: &[&str] = &["dummy", "sec", "zip"];

/// Whether `name` is a driver this host knows.
pub fn exists(name: &str) -> bool {
    NAMES.contains(&name)
}

/// The driver a device configuration names, computing with its `engine`
/// where it has a choice (`None` lets it pick), with its namespaces where
/// it has them.
pub fn open(dc: &DeviceConfig) -> Result<Box<dyn Driver>, String> {
    let (name, engine) = (dc.driver.as_str(), dc.engine.as_deref());
    if !dc.namespaces.is_empty() && name != "nvme" {
        return Err(format!("device {name} has no namespaces (ns=)"));
    }
    let no_choice = |name: &str| match engine {
        None => Ok(()),
        Some(e) => Err(format!("device {name} has no engine choice (engine={e})")),
    };
    match name {
        "dummy" => {
            no_choice(name).map(|_| Box::new(wd_device::dummy::DummyDriver) as Box<dyn Driver>)
        }
        "zip" => no_choice(name).map(|_| Box::new(wd_zip::ZipDriver::new()) as Box<dyn Driver>),
        "dummy-async" => no_choice(name)
            .map(|_| Box::new(wd_device::dummy_async::DummyAsyncDriver) as Box<dyn Driver>),
        "sec" => {
            let choice: wd_sec::EngineChoice = engine.unwrap_or("auto").parse()?;
            wd_sec::SecDriver::new(choice)
                .map(|d| Box::new(d) as Box<dyn Driver>)
                .map_err(|e| e.to_string())
        }
        "nvme" => {
            let io: wd_nvme::IoEngine = engine.unwrap_or("auto").parse()?;
            wd_nvme::NvmeDriver::new(&dc.namespaces, io)
                .map(|d| Box::new(d) as Box<dyn Driver>)
                .map_err(|e| e.to_string())
        }
        _ => Err(format!(
            "unknown driver '{name}' (available: {})",
            NAMES.join(", ")
        )),
    }
}
