//! Host configuration files and device specs: an error message, never a
//! panic, and whatever is accepted is within the named limits.
#![no_main]
use libfuzzer_sys::fuzz_target;
use wd_host::config::{DeviceConfig, HostConfig, MAX_DEVICES, MAX_ENGINES};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(c) = HostConfig::from_toml(text) {
        assert!(!c.devices.is_empty() && c.devices.len() <= MAX_DEVICES);
        assert!(c.devices.iter().all(|d| d.engines <= MAX_ENGINES));
    }
    if let Ok(d) = DeviceConfig::parse_spec(text) {
        assert!(d.engines >= 1 && d.engines <= MAX_ENGINES);
    }
});
