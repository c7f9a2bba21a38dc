//! A host that takes the connection and never answers (stopped, hung, or
//! a socket nobody accepts on) is `HostGone` after the Hello's deadline,
//! never a caller held for good; so is one whose backlog is full (the
//! clients that gave up on a stopped host stay in its accept queue). Its
//! own test binary: it sets `WD_CONNECT_TIMEOUT_MS` for the process.

use std::os::unix::net::UnixListener;
use std::time::{Duration, Instant};

use wrapdrive::{HostConn, Status};

fn quick_deadline() {
    std::env::set_var("WD_CONNECT_TIMEOUT_MS", "300");
}

#[test]
fn a_host_that_never_answers_is_host_gone_after_the_deadline() {
    quick_deadline();
    let dir = wd_testutil::tempdir("wd-connect-timeout");
    let path = dir.join("mute.sock");
    // Listens, never accepts: connect succeeds, the Hello goes into the
    // socket's buffer, and nothing comes back.
    let _listener = UnixListener::bind(&path).unwrap();
    let t = Instant::now();
    let e = match HostConn::connect(&path) {
        Ok(_) => panic!("connected to a host that never answered"),
        Err(e) => e,
    };
    let took = t.elapsed();
    assert_eq!(e.status(), Status::HostGone, "{e}");
    assert!(e.to_string().contains("did not answer"), "{e}");
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[test]
fn a_host_with_a_full_backlog_is_host_gone_after_the_deadline() {
    quick_deadline();
    let dir = wd_testutil::tempdir("wd-connect-backlog");
    let path = dir.join("full.sock");
    let (_listener, _held) = wd_testutil::full_listener(&path);
    let t = Instant::now();
    let e = match HostConn::connect(&path) {
        Ok(_) => panic!("connected through a full backlog"),
        Err(e) => e,
    };
    assert_eq!(e.status(), Status::HostGone, "{e}");
    assert!(e.to_string().contains("did not answer"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}
