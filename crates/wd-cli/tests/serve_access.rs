//! `wd serve`'s access flags end to end: `--mode` holds for an abstract
//! socket, `--allow-uid` admits one more user, and a second host on a held
//! name is told who holds it. The other-uid client is this binary re-run
//! as uid 65534; without root those parts are skipped.

use std::os::unix::process::CommandExt;
use std::process::Command;

use wd_testutil::{report, Role};
use wrapdrive::HostConn;

mod common;
use common::HostProc;

/// Connect to `addr` as uid 65534 and return "ok" or the error.
fn connect_as_nobody(addr: &str) -> String {
    let mut c = Role::command("connect");
    c.env("WD_ACCESS_TEST_ADDR", addr).uid(65534).gid(65534);
    Role::spawn(c).read_report()
}

/// Entry point of the other-uid client; does nothing in a normal run.
#[test]
fn child_entry() {
    if wd_testutil::role().is_none() {
        return;
    }
    let addr = std::env::var("WD_ACCESS_TEST_ADDR").unwrap();
    let r = match HostConn::connect(&addr) {
        Ok(_) => "ok".to_string(),
        Err(e) => format!("{:?} {e}", e.status()),
    };
    report(&r);
}

#[test]
fn serve_mode_and_allow_uid_hold_for_abstract_sockets() {
    if !wd_testutil::root_or_skip(
        "serve_mode_and_allow_uid_hold_for_abstract_sockets",
        "to run a client as uid 65534",
    ) {
        return;
    }
    let addr = format!("@wd-serve-access-{}", std::process::id());
    let host = HostProc::serve(&addr, &["--device", "dummy", "--mode", "600"]);
    let r = connect_as_nobody(&addr);
    assert!(
        r.starts_with("Permission uid 65534 is not allowed by this host's access policy"),
        "{r}"
    );
    drop(host);
    let addr = format!("@wd-serve-allow-{}", std::process::id());
    let _host = HostProc::serve(
        &addr,
        &["--device", "dummy", "--mode", "600", "--allow-uid", "65534"],
    );
    assert_eq!(connect_as_nobody(&addr), "ok");
}

#[test]
fn second_serve_on_a_held_name_names_the_holder() {
    let addr = format!("@wd-serve-held-{}", std::process::id());
    let first = HostProc::serve(&addr, &["--device", "dummy", "--mode", "600"]);
    let out = Command::new(env!("CARGO_BIN_EXE_wd"))
        .args(["serve", "--socket", &addr, "--device", "dummy"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let want = format!(
        "{addr} is already served by uid {} (pid {})",
        wd_sys::geteuid(),
        first.pid()
    );
    assert!(err.contains(&want), "{err}");
}
