//! A client checks who runs the host before sending it anything: whoever
//! binds an abstract name first could otherwise collect other users' keys
//! and data. Root's, our own and `WD_HOST_UIDS`' hosts are trusted.
//!
//! The impostor is this binary re-run as uid 65534 serving a real host;
//! the clients are re-runs too, so each gets its own `WD_HOST_UIDS`.
//! Without root the test is skipped.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};

use wd_host::{DeviceConfig, HostConfig};
use wrapdrive::HostConn;

const NOBODY: u32 = 65534;

/// This test binary re-run in a role, killed on drop.
struct Role {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Role {
    fn start(role: &str, addr: &str, setup: impl FnOnce(&mut Command)) -> Role {
        let mut c = Command::new(std::env::current_exe().unwrap());
        c.args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
            .env("WD_IDENTITY_TEST_ROLE", role)
            .env("WD_IDENTITY_TEST_ADDR", addr)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        setup(&mut c);
        let mut child = c.spawn().expect("run a child");
        let out = BufReader::new(child.stdout.take().unwrap());
        Role { child, out }
    }

    /// The rest of the child's first "WD:" line.
    fn report(&mut self) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                self.out.read_line(&mut line).unwrap() > 0,
                "child exited without reporting"
            );
            if let Some((_, rest)) = line.trim_end().split_once("WD:") {
                return rest.to_string();
            }
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Entry point of the roles; does nothing in a normal run.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var("WD_IDENTITY_TEST_ROLE") else {
        return;
    };
    let addr = std::env::var("WD_IDENTITY_TEST_ADDR").unwrap();
    let out = std::io::stdout();
    match role.as_str() {
        // Serve a host anyone may use until stdin closes.
        "host" => {
            let cfg = HostConfig {
                socket: addr,
                socket_mode: 0o666,
                devices: vec![DeviceConfig::new("dummy")],
                ..HostConfig::default()
            };
            let _h = wd_host::Host::start(&cfg).expect("host starts");
            writeln!(out.lock(), "WD:ready").unwrap();
            let mut sink = Vec::new();
            let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
        }
        "connect" => {
            let r = match HostConn::connect(&addr) {
                Ok(h) => format!("ok {}", h.host_pid()),
                Err(e) => format!("err {:?} {e}", e.status()),
            };
            writeln!(out.lock(), "WD:{r}").unwrap();
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
    let mut host = Role::start("host", &addr, |c| {
        c.uid(NOBODY).gid(NOBODY);
    });
    assert_eq!(host.report(), "ready");
    let connect = |uids: Option<&str>| {
        Role::start("connect", &addr, |c| {
            match uids {
                Some(u) => c.env("WD_HOST_UIDS", u),
                None => c.env_remove("WD_HOST_UIDS"),
            };
        })
        .report()
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
