//! A send whose doorbell finds the host gone, the host back only after
//! the first reconnection window: the request, in the old ring, is redone
//! once by the queue made again (it was also sent again by the caller's
//! retry: one send, two completions of its cookie).
#![allow(unsafe_code)]

mod common;

use std::process::Stdio;
use std::time::Duration;

use wd_dummy_msg::CopyMsg;
use wd_testutil::{tempdir, Role};
use wrapdrive::{Capability, HostConn, SharedBuf};

#[test]
fn child_entry() {
    let Some(role) = wd_testutil::role() else {
        return;
    };
    assert_eq!(role, "host");
    common::serve_until_stdin_closes(&common::dummy_host(
        std::env::var("WD_TEST_SOCKET").unwrap(),
        0o600,
    ));
}

fn start_host(socket: &str) -> Role {
    let _ = std::fs::remove_file(socket);
    let mut c = Role::command("host");
    c.env("WD_TEST_SOCKET", socket).stdin(Stdio::piped());
    let mut role = Role::spawn(c);
    assert_eq!(role.read_report(), "ready");
    role
}

#[test]
fn a_send_whose_host_comes_back_late_runs_once() {
    std::env::set_var("WD_RECONNECT_MS", "1000");
    let dir = tempdir("wd-restart-send");
    let socket = dir.join("wd.sock");
    let host = start_host(&socket);
    let conn = HostConn::connect(&socket).unwrap();
    let mut q = conn
        .request_queue(&Capability::new("memcpy").depth(4))
        .unwrap();
    q.set_redo_policy(wd_dummy_msg::redo_safe);
    let src = SharedBuf::new(4096).unwrap();
    let dst = SharedBuf::new(4096).unwrap();
    q.share(src.addr(), 4096).unwrap();
    q.share(dst.addr(), 4096).unwrap();
    let desc = CopyMsg {
        src: src.addr(),
        dst: dst.addr(),
        len: 4096,
    }
    .to_desc(0);
    assert_eq!(q.call(desc).unwrap().status, 0);
    // Let the engine fall asleep (so the next send rings the doorbell).
    std::thread::sleep(Duration::from_millis(500));
    let mut status = 0;
    // SAFETY: kill(2)/waitpid(2) of our own child.
    unsafe {
        libc::kill(host.pid(), libc::SIGKILL);
        libc::waitpid(host.pid(), &mut status, 0);
    }
    let s2 = socket.clone();
    // Back after the first reconnection window, within the second.
    let restarter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1400));
        start_host(&s2)
    });
    let r = q.send(desc, 7);
    let _new_host = restarter.join().unwrap();
    eprintln!(
        "send: {r:?}, recovery {:?}, in flight {}",
        q.recovery_stats(),
        q.in_flight()
    );
    r.unwrap();
    let mut sevens = 0;
    while q.in_flight() > 0 {
        let c = q.recv_sync(Some(Duration::from_secs(5))).unwrap();
        if c.cookie == 7 {
            sevens += 1;
        }
    }
    while let Some(c) = q.recv().unwrap() {
        if c.cookie == 7 {
            sevens += 1;
        }
    }
    assert_eq!(sevens, 1, "one send of cookie 7 gave {sevens} completions");
}
