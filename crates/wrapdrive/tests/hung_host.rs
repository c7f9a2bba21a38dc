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

/// The tests stop hosts and set the deadlines in the environment: one at
/// a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn a_stopped_host_is_gone_after_the_deadline_and_its_queues_come_back() {
    let _serial = serial();
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
    wd_testutil::wait_stopped(host.pid());
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

/// A request too large for the socket's buffer, to a stopped host, is
/// gone after the call's deadline too (the deadline covered the reply
/// only: the write blocked for good).
#[test]
fn a_large_request_to_a_stopped_host_is_gone_after_the_deadline() {
    let _serial = serial();
    std::env::set_var("WD_CALL_TIMEOUT_MS", "300");
    std::env::set_var("WD_CONNECT_TIMEOUT_MS", "300");
    let dir = wd_testutil::tempdir("wd-hung-legacy");
    let socket = dir.join("wd.sock");
    let host = wd_testutil::Role::serving("host", &socket);
    let conn = HostConn::connect(&socket).unwrap();
    let mut q = conn
        .request_queue(&Capability::new("memcpy").flags(wrapdrive::CAPA_ALLOW_LEGACY))
        .unwrap();
    q.set_legacy_planner(wd_dummy_msg::legacy_plan);
    let len = 1 << 20;
    let (src, dst) = (SharedBuf::new(len).unwrap(), SharedBuf::new(len).unwrap());
    let desc = wd_dummy_msg::CopyMsg {
        src: src.addr(),
        dst: dst.addr(),
        len: len as u64,
    }
    .to_desc(0);
    // SAFETY: kill(2) of our own child.
    unsafe { libc::kill(host.pid(), libc::SIGSTOP) };
    wd_testutil::wait_stopped(host.pid());
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        let _ = tx.send(q.send(desc, 1).map_err(|e| e.status()));
        (q, src, dst)
    });
    let got = rx.recv_timeout(Duration::from_secs(5));
    // SAFETY: as above (lets a stuck writer finish).
    unsafe { libc::kill(host.pid(), libc::SIGCONT) };
    let _ = t.join();
    assert_eq!(got, Ok(Err(Status::HostGone)), "within 5 s, the host gone");
}

/// An unshare that a stopped host does not answer is not an unshare: the
/// host may resume and reach the range (it returned Ok, the range free to
/// reuse). Once the host answers again the unshare goes through; once it
/// is dead the range is unreachable and the unshare is Ok.
#[test]
fn an_unshare_a_hung_host_does_not_answer_is_not_done() {
    let _serial = serial();
    // Long enough for a loaded machine to answer once the host runs.
    std::env::set_var("WD_CALL_TIMEOUT_MS", "1000");
    std::env::set_var("WD_CONNECT_TIMEOUT_MS", "1000");
    let dir = wd_testutil::tempdir("wd-hung-unshare");
    let socket = dir.join("wd.sock");
    let mut host = wd_testutil::Role::serving("host", &socket);
    let conn = HostConn::connect(&socket).unwrap();
    let mut q = conn
        .request_queue(&Capability::new("memcpy").depth(4))
        .unwrap();
    let (a, b) = (SharedBuf::new(4096).unwrap(), SharedBuf::new(4096).unwrap());
    q.share(a.addr(), a.len()).unwrap();
    q.share(b.addr(), b.len()).unwrap();
    // SAFETY: kill(2) of our own child.
    unsafe { libc::kill(host.pid(), libc::SIGSTOP) };
    wd_testutil::wait_stopped(host.pid());
    let e = q.unshare(a.addr(), a.len()).unwrap_err();
    assert_eq!(e.status(), Status::HostGone, "{e}");
    // SAFETY: as above.
    unsafe { libc::kill(host.pid(), libc::SIGCONT) };
    q.unshare(a.addr(), a.len()).unwrap();
    // Hung again, then dead: nothing can reach the range any more.
    // SAFETY: as above.
    unsafe { libc::kill(host.pid(), libc::SIGSTOP) };
    wd_testutil::wait_stopped(host.pid());
    let e = q.unshare(b.addr(), b.len()).unwrap_err();
    assert_eq!(e.status(), Status::HostGone, "{e}");
    host.child.kill().unwrap();
    host.child.wait().unwrap();
    q.unshare(b.addr(), b.len()).unwrap();
}
