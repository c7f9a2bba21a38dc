//! `wd serve` under socket activation: the listening socket comes from the
//! service manager (here `systemd-socket-activate`, which passes it as
//! systemd does), is served, and is left in place when the host exits (it
//! is the manager's: packaging/systemd/wrapdrive.socket).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use wrapdrive::HostConn;

fn wait_connect(addr: &str) -> std::sync::Arc<HostConn> {
    let t = Instant::now();
    loop {
        match HostConn::connect(addr) {
            Ok(h) => return h,
            Err(e) if t.elapsed() > Duration::from_secs(10) => panic!("connect {addr}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

#[test]
fn serve_takes_the_passed_socket() {
    let Ok(tool) = which("systemd-socket-activate") else {
        wd_testutil::skip(
            "serve_takes_the_passed_socket",
            "systemd-socket-activate is not installed (package systemd)",
        );
        return;
    };
    let dir = wd_testutil::tempdir("wd-activation");
    let sock = dir.join("wd.sock");
    let mut child = Command::new(tool)
        .args([
            "-l",
            &sock,
            env!("CARGO_BIN_EXE_wd"),
            "serve",
            "--device",
            "dummy",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start systemd-socket-activate");
    let h = wait_connect(&sock);
    let pid = h.get_attr("host/pid").expect("host/pid");
    // The host is the activated program itself (the tool execs it), and it
    // did not bind a socket of its own: the address is the passed one.
    assert_eq!(pid, child.id().to_string());
    assert_eq!(h.get_attr("dev0/driver").unwrap(), "dummy");
    drop(h);
    let _ = child.kill();
    let out = child.wait_with_output().expect("wait");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("socket-activated"), "{log}");
    // The socket file stays the manager's: a host that exits leaves it.
    assert!(std::path::Path::new(&sock).exists());
}

fn which(name: &str) -> Result<String, ()> {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|d| format!("{d}/{name}"))
        .find(|p| std::path::Path::new(p).exists())
        .ok_or(())
}

/// A descriptor 3 that is not a socket (a unit file pointing elsewhere, a
/// shell redirection): refused with a message that says what is wrong.
#[test]
fn serve_refuses_a_passed_descriptor_that_is_no_socket() {
    // `exec` keeps the shell's pid, which LISTEN_PID must name.
    let out = Command::new("sh")
        .args([
            "-c",
            "LISTEN_PID=$$ LISTEN_FDS=1 exec \"$0\" serve --device dummy 3</dev/null",
            env!("CARGO_BIN_EXE_wd"),
        ])
        .output()
        .expect("run sh");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("socket passed as descriptor 3 (socket activation, LISTEN_FDS): cannot read its address"),
        "{err}"
    );
    assert!(
        !err.contains("socket socket") && !err.contains("cannot reading"),
        "{err}"
    );
}
