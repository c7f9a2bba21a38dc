//! A client checks who runs the host before sending it anything: whoever
//! binds an abstract name first could otherwise collect other users' keys
//! and data. Root's, our own and `WD_HOST_UIDS`' hosts are trusted.
//!
//! The impostor is this binary re-run as uid 65534 serving a real host;
//! the clients are re-runs too, so each gets its own `WD_HOST_UIDS`.
//! Without root the test is skipped.

mod common;

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use wd_host::{DeviceConfig, HostConfig};
use wd_testutil::{report, Role};
use wrapdrive::HostConn;

const NOBODY: u32 = 65534;

/// This test binary re-run in `role` with the host's address, stdin held
/// open until it is dropped.
fn start(role: &str, addr: &str, setup: impl FnOnce(&mut Command)) -> Role {
    let mut c = Role::command(role);
    c.env("WD_IDENTITY_TEST_ADDR", addr).stdin(Stdio::piped());
    setup(&mut c);
    Role::spawn(c)
}

/// Entry point of the roles; does nothing in a normal run.
#[test]
fn child_entry() {
    let Some(role) = wd_testutil::role() else {
        return;
    };
    let addr = std::env::var("WD_IDENTITY_TEST_ADDR").unwrap();
    match role.as_str() {
        // Serve a host anyone may use until stdin closes.
        "host" => common::serve_until_stdin_closes(&common::dummy_host(addr, 0o666)),
        "connect" => {
            let r = match HostConn::connect(&addr) {
                Ok(h) => format!("ok {}", h.host_pid()),
                Err(e) => format!("err {:?} {e}", e.status()),
            };
            report(&r);
        }
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn client_refuses_a_host_run_by_another_uid_unless_listed() {
    if !wd_testutil::root_or_skip(
        "client_refuses_a_host_run_by_another_uid_unless_listed",
        "to run a host as uid 65534",
    ) {
        return;
    }
    let addr = format!("@wd-identity-{}", std::process::id());
    let mut host = start("host", &addr, |c| {
        c.uid(NOBODY).gid(NOBODY);
    });
    assert_eq!(host.read_report(), "ready");
    let connect = |uids: Option<&str>| {
        start("connect", &addr, |c| {
            match uids {
                Some(u) => c.env("WD_HOST_UIDS", u),
                None => c.env_remove("WD_HOST_UIDS"),
            };
        })
        .read_report()
    };
    let r = connect(None);
    let want = format!(
        "err Permission the WrapDrive host at '{addr}' runs as uid 65534 (pid {})",
        host.pid()
    );
    assert!(r.starts_with(&want), "{r}");
    assert!(r.contains("add 65534 to WD_HOST_UIDS"), "{r}");
    // Listing another uid does not help; listing this one does.
    assert!(connect(Some("1000")).starts_with(&want));
    assert_eq!(connect(Some("1000, 65534")), format!("ok {}", host.pid()));
    let r = connect(Some("nobody"));
    assert!(
        r.starts_with("err Invalid WD_HOST_UIDS: 'nobody' is not a uid"),
        "{r}"
    );
}

#[test]
fn client_trusts_its_own_and_the_embedded_host() {
    let h = wd_embedded::connect().unwrap();
    assert_eq!(h.host_pid(), std::process::id());
    let cfg = HostConfig {
        socket: format!("@wd-identity-own-{}", std::process::id()),
        socket_mode: 0o600,
        devices: vec![DeviceConfig::new("dummy")],
        ..HostConfig::default()
    };
    let host = std::sync::Arc::new(wd_host::Host::start(&cfg).unwrap());
    let c = wd_embedded::connect_to(&host).unwrap();
    assert_eq!(c.host_pid(), std::process::id());
}
