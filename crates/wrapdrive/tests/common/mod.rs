//! What the tests that run a host in a process of their own (the test
//! binary re-run in a "host" role) share.

// Each test binary compiles this module and uses a part of it.
#![allow(dead_code)]

use std::io::Read;

use wd_host::{DeviceConfig, HostConfig};

/// A host of the dummy device on `socket`, its socket's mode `mode`.
pub fn dummy_host(socket: String, mode: u32) -> HostConfig {
    HostConfig {
        socket,
        socket_mode: mode,
        devices: vec![DeviceConfig::new("dummy")],
        ..HostConfig::default()
    }
}

/// Serve `cfg` in this process: report "ready" to the test that started
/// it, and return when that test closes this process's stdin (or dies).
pub fn serve_until_stdin_closes(cfg: &HostConfig) {
    let _h = wd_host::Host::start(cfg).expect("host starts");
    wd_testutil::report("ready");
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
}
