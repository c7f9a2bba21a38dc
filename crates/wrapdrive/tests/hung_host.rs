//! A host that stops answering after a client connected (stopped, hung):
//! a control request is `HostGone` after `WD_CALL_TIMEOUT_MS`, never a
//! caller held for good, and once it answers again the queues made on
//! the old connection are made again on a new one. Its own test binary:
//! it sets the process's environment.
#![allow(unsafe_code)]

use std::time::{Duration, Instant};

use wrapdrive::{Capability, HostConn, SharedBuf, Status};

/// The host process: this test binary re-run in the role "host".
#[test]
fn child_entry() {
    if wd_testutil::role().as_deref() != Some("host") {
        return;
    }
    let cfg = wd_host::HostConfig {
        socket: wd_testutil::role_socket(),
        socket_mode: 0o600,
        devices: vec![wd_host::DeviceConfig::new("dummy")],
        ..Default::default()
    };
    let _h = wd_host::Host::start(&cfg).expect("host starts");
    wd_testutil::while_parent_lives();
}

#[test]
fn a_stopped_host_is_gone_after_the_deadline_and_its_queues_come_back() {
    std::env::set_var("WD_CALL_TIMEOUT_MS", "300");
    std::env::set_var("WD_CONNECT_TIMEOUT_MS", "300");
    let dir = wd_testutil::tempdir("wd-hung-host");
    let socket = dir.join("wd.sock");
    let host = wd_testutil::Role::serving("host", &socket);
    let conn = HostConn::connect(&socket).unwrap();
    let mut q = conn
        .request_queue(&Capability::new("memcpy").depth(4))
        .unwrap();
    let mut q2 = conn
        .request_queue(&Capability::new("memcpy").depth(4))
        .unwrap();
    let buf = SharedBuf::new(4096).unwrap();
    // SAFETY: plain kill(2) of our own child.
    unsafe { libc::kill(host.pid(), libc::SIGSTOP) };
    let t = Instant::now();
    let e = q.share(buf.addr(), buf.len()).unwrap_err();
    assert_eq!(e.status(), Status::HostGone, "{e}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // SAFETY: as above.
    unsafe { libc::kill(host.pid(), libc::SIGCONT) };
    // The host answers again: another caller connects again first, and
    // the queues made on the old connection are made again on the new
    // one (their ids meant nothing there: NotFound for good).
    conn.attrs("").unwrap();
    q.share(buf.addr(), buf.len()).unwrap();
    let buf2 = SharedBuf::new(4096).unwrap();
    q2.share(buf2.addr(), buf2.len()).unwrap();
}
