//! A client at its open-file limit: the descriptors a queue's grant
//! carries cannot be received, and the call says so (`TooManyFiles`,
//! naming the limit), where it said the host's frame was malformed
//! ("frame carries 5 file descriptors, expected 4"). The connection is
//! closed (the grant's bytes went with its descriptors), and once the
//! client has descriptors again its next call connects again.

mod common;

use std::os::fd::OwnedFd;
use std::process::Stdio;

use wd_testutil::{report, tempdir, Role};
use wrapdrive::{Capability, HostConn};

/// The client's descriptor limit.
const LIMIT: u64 = 64;

#[test]
fn child_entry() {
    let Some(role) = wd_testutil::role() else {
        return;
    };
    let socket = std::env::var("WD_TEST_SOCKET").unwrap();
    match role.as_str() {
        "host" => common::serve_until_stdin_closes(&common::dummy_host(socket, 0o600)),
        // Ask for a queue with 0, 1, 2 ... descriptors free, and report
        // each outcome.
        "client" => {
            let h = HostConn::connect(&socket).expect("connect");
            for free in 0..6 {
                let mut held: Vec<OwnedFd> = Vec::new();
                while let Ok(f) = std::fs::File::open("/dev/null") {
                    held.push(f.into());
                }
                held.truncate(held.len().saturating_sub(free));
                let outcome = match h.request_queue(&Capability::new("memcpy")) {
                    Ok(_) => "ok".to_string(),
                    Err(e) => format!("{:?} {e}", e.status()),
                };
                drop(held);
                report(&format!("{free} {outcome}"));
            }
            // Descriptors again: the next call connects again.
            let outcome = match h.request_queue(&Capability::new("memcpy")) {
                Ok(_) => "ok".to_string(),
                Err(e) => format!("{:?} {e}", e.status()),
            };
            report(&format!("after {outcome}"));
        }
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn a_client_out_of_descriptors_is_told_so() {
    let dir = tempdir("wd-fd-limit");
    let socket = dir.join("wd.sock");
    let mut c = Role::command("host");
    c.env("WD_TEST_SOCKET", &socket).stdin(Stdio::piped());
    let mut host = Role::spawn(c);
    assert_eq!(host.read_report(), "ready");

    let mut c = Role::command("client");
    c.env("WD_TEST_SOCKET", &socket);
    wd_sys::limit_descriptors_on_exec(&mut c, LIMIT);
    let mut client = Role::spawn(c);
    let mut refused_on_receipt = 0;
    for free in 0..6 {
        let line = client.read_report();
        let (n, outcome) = line.split_once(' ').unwrap();
        assert_eq!(n, free.to_string());
        if outcome == "ok" {
            continue;
        }
        assert!(
            outcome.starts_with("TooManyFiles"),
            "{free} descriptors free: {outcome}"
        );
        if outcome.contains("open-file limit") {
            refused_on_receipt += 1;
        }
    }
    // With some descriptors free but fewer than the grant carries, the
    // grant's own could not be received.
    assert!(refused_on_receipt > 0, "the receipt was never the limit");
    assert_eq!(client.read_report(), "after ok");
}
