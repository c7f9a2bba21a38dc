//! A client the kernel refuses at connect(2) because of
//! the socket file's mode (EACCES) was told the host is gone (ENOTCONN,
//! "start one with `wd serve`") instead of Permission, the status
//! docs/protocol.md gives to connection admission.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;

use wd_host::{DeviceConfig, HostConfig};
use wd_testutil::{report, tempdir_in, Role};
use wrapdrive::HostConn;

const NOBODY: u32 = 65534;

/// Entry point of the roles; does nothing in a normal run.
#[test]
fn child_entry() {
    let Some(role) = wd_testutil::role() else {
        return;
    };
    assert_eq!(role, "connect");
    let addr = std::env::var("WD_TEST_ADDR").unwrap();
    let r = match HostConn::connect(&addr) {
        Ok(h) => format!("ok {}", h.host_pid()),
        Err(e) => format!("err {:?} {e}", e.status()),
    };
    report(&r);
}

#[test]
fn a_client_the_socket_mode_refuses_hears_permission() {
    if !wd_testutil::root_or_skip(
        "a_client_the_socket_mode_refuses_hears_permission",
        "to run a client as uid 65534",
    ) {
        return;
    }
    let dir = tempdir_in(Path::new(env!("CARGO_TARGET_TMPDIR")), "wd-perm", 0o755);
    let socket = dir.join("wd.sock");
    let cfg = HostConfig {
        socket: socket.clone(),
        socket_mode: 0o600,
        devices: vec![DeviceConfig::new("dummy")],
        ..HostConfig::default()
    };
    let _host = wd_host::Host::start(&cfg).unwrap();
    let mut c = Role::command("connect");
    c.env("WD_TEST_ADDR", &socket)
        .env("WD_RECONNECT_MS", "0")
        .stdin(Stdio::null())
        .uid(NOBODY)
        .gid(NOBODY);
    let r = Role::spawn(c).read_report();
    assert!(r.starts_with("err Permission"), "{r}");
}
