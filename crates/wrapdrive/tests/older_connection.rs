//! A queue made on a connection older than the current
//! one could not make the connection again, so a second restart of the
//! host left it failing with HostGone for good.
#![allow(unsafe_code)]

use std::io::Read;
use std::process::Stdio;

use wd_host::{DeviceConfig, HostConfig};
use wd_testutil::{report, tempdir, Role};
use wrapdrive::{Capability, Desc, HostConn};

/// Entry point of the host process; does nothing in a normal test run.
#[test]
fn child_entry() {
    let Some(role) = wd_testutil::role() else {
        return;
    };
    assert_eq!(role, "host");
    let cfg = HostConfig {
        socket: std::env::var("WD_TEST_SOCKET").unwrap(),
        socket_mode: 0o600,
        devices: vec![DeviceConfig::new("dummy")],
        ..HostConfig::default()
    };
    let _h = wd_host::Host::start(&cfg).expect("host starts");
    report("ready");
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
}

fn start_host(socket: &str) -> Role {
    let _ = std::fs::remove_file(socket);
    let mut c = Role::command("host");
    c.env("WD_TEST_SOCKET", socket).stdin(Stdio::piped());
    let mut role = Role::spawn(c);
    assert_eq!(role.read_report(), "ready");
    role
}

fn kill(host: &mut Role) {
    let mut status = 0;
    // SAFETY: plain kill(2) and waitpid(2) of our own child.
    unsafe {
        libc::kill(host.pid(), libc::SIGKILL);
        libc::waitpid(host.pid(), &mut status, 0);
    }
}

/// docs/operations.md / DESIGN.md: after the host went away "the client
/// library connects again to the same address ... asks for each queue
/// again ... as it is next used". Two queues of one connection, two
/// restarts: the second queue, remade on the first restart, moved the
/// connection on; the first, still of the oldest connection, asked
/// `HostConn::reconnect` with its old epoch, was handed the (dead) second
/// connection as "already reconnected", and failed with HostGone on
/// every use although a host served again.
#[test]
fn a_queue_of_an_older_connection_comes_back_after_two_restarts() {
    let dir = tempdir("wd-older-conn");
    let socket = dir.join("wd.sock");
    let mut a = start_host(&socket);
    let conn = HostConn::connect(&socket).unwrap();
    let mut q1 = conn
        .request_queue(&Capability::new("memcpy").depth(8))
        .unwrap();
    let mut q2 = conn
        .request_queue(&Capability::new("memcpy").depth(8))
        .unwrap();
    // Copies may be sent again to a restarted host (no-ops too).
    q1.set_redo_policy(wd_dummy_msg::redo_safe);
    q2.set_redo_policy(wd_dummy_msg::redo_safe);
    let nop = Desc::default();
    assert_eq!(q1.call(nop).unwrap().status, 0);
    assert_eq!(q2.call(nop).unwrap().status, 0);

    // First restart: q2 is used and comes back (connection epoch 1).
    kill(&mut a);
    let mut b = start_host(&socket);
    assert_eq!(q2.call(nop).unwrap().status, 0);
    assert_eq!(q2.epoch(), 1);

    // Second restart: q1, still of epoch 0, is used first.
    kill(&mut b);
    let mut c = start_host(&socket);
    let r = q1.call(nop);
    assert!(
        matches!(&r, Ok(d) if d.status == 0),
        "q1 after the second restart: {r:?} (a host serves again at the same address)"
    );
    assert_eq!(q2.call(nop).unwrap().status, 0);
    kill(&mut c);
}
