//! The in-process host, kept out of the client library: a program that
//! wants `WD_HOST=embedded` (examples, tests, benchmarks) links this crate
//! and calls [`install`]; C programs get it from `libwd_embedded.so`,
//! which `libwd.so` loads on first use. Either way the program then
//! carries the host and its devices (and libcrypto), and programs that
//! talk to a real host do not.
//!
//! ```no_run
//! wd_embedded::install();
//! let host = wrapdrive::HostConn::connect("embedded")?;
//! # Ok::<(), wrapdrive::ClientError>(())
//! ```
#![deny(unsafe_code)]

mod c_entry;

use std::sync::Arc;

use wd_host::{DeviceConfig, Host};
use wrapdrive::{ClientError, EmbeddedHost, HostConn};

/// Environment variable naming the devices of the in-process host, e.g.
/// `dummy:engines=2;sec` (default: one device of each default driver).
pub const DEVICES_ENV: &str = "WD_EMBEDDED_DEVICES";

/// Register the in-process host with the client library: from now on
/// `WD_HOST=embedded` and `HostConn::embedded()` start (once) and use it.
pub fn install() {
    wrapdrive::register_embedded_host(start);
}

/// Install, then connect to the process's in-process host.
pub fn connect() -> wrapdrive::Result<Arc<HostConn>> {
    install();
    HostConn::embedded()
}

/// Connect to a host this process started itself (with its own devices);
/// the connection keeps it running.
pub fn connect_to(host: &Arc<Host>) -> wrapdrive::Result<Arc<HostConn>> {
    HostConn::connect_to(&handle(host))
}

/// A host this process started, as the client library holds it.
pub fn handle(host: &Arc<Host>) -> EmbeddedHost {
    EmbeddedHost {
        address: host.address().to_string(),
        keep: host.clone(),
    }
}

/// The devices `WD_EMBEDDED_DEVICES` names, or the defaults.
pub fn devices_from_env() -> wrapdrive::Result<Vec<DeviceConfig>> {
    match std::env::var(DEVICES_ENV) {
        Ok(list) => wd_host::config::parse_spec_list(&list)
            .map_err(|e| ClientError::new(e.status(), format!("{DEVICES_ENV}: {e}"))),
        Err(_) => Ok(wd_host::config::default_devices()),
    }
}

/// Start an in-process host with the devices of the environment.
pub fn start() -> wrapdrive::Result<EmbeddedHost> {
    let devices = devices_from_env()?;
    let h = Host::embedded(devices).map_err(|e| {
        ClientError::new(e.status(), format!("cannot start the embedded host: {e}"))
    })?;
    Ok(handle(&Arc::new(h)))
}
