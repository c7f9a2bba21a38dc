//! The library's side of process lifetime, against a host in another
//! process (this test binary re-run in the "host" role): a host that dies
//! while a client waits is an error at once, never a hang; a forked child
//! cannot use its parent's queue and connection, but may ask for its own.
#![allow(unsafe_code)]

mod common;

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wd_testutil::{tempdir, wait_until, Role, TempDir};
use wrapdrive::{Capability, HostConn, Status};

/// A host in a process of its own (killed on drop, before its directory
/// goes).
struct HostProc {
    role: Role,
    socket: String,
    _dir: TempDir,
}

impl HostProc {
    fn conn(&self) -> Arc<HostConn> {
        HostConn::connect(&self.socket).expect("connect")
    }

    fn pid(&self) -> i32 {
        self.role.pid()
    }
}

/// Start the host process, returned once it serves.
fn start_host() -> HostProc {
    let dir = tempdir("wd-test-host");
    let socket = dir.join("wd.sock");
    let mut c = Role::command("host");
    c.env("WD_TEST_SOCKET", &socket).stdin(Stdio::piped());
    let mut role = Role::spawn(c);
    assert_eq!(role.read_report(), "ready");
    HostProc {
        role,
        socket,
        _dir: dir,
    }
}

/// Entry point of the host process; does nothing in a normal test run.
#[test]
fn child_entry() {
    let Some(role) = wd_testutil::role() else {
        return;
    };
    match role.as_str() {
        // Serve until killed or stdin closes.
        "host" => common::serve_until_stdin_closes(&common::dummy_host(
            std::env::var("WD_TEST_SOCKET").unwrap(),
            0o600,
        )),
        other => panic!("unknown role {other}"),
    }
}

fn queues(h: &HostConn) -> usize {
    h.attrs("dev0/queues/")
        .unwrap()
        .into_iter()
        .filter(|e| e.path.ends_with("/pid"))
        .count()
}

#[test]
fn host_killed_while_client_waits_is_an_error_not_a_hang() {
    let host = start_host();
    let h = host.conn();
    let mut q = h.request_queue(&Capability::new("memcpy")).unwrap();
    // Freeze the host so the request stays in flight, then kill it.
    // SAFETY: plain kill(2) of our own child.
    unsafe { libc::kill(host.pid(), libc::SIGSTOP) };
    wd_testutil::wait_stopped(host.pid());
    q.send(wrapdrive::Desc::default(), 1).unwrap();
    let pid = host.pid();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: plain kill(2) of our own child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    });
    let t = Instant::now();
    let e = q.recv_sync(None).unwrap_err();
    killer.join().unwrap();
    assert_eq!(e.status(), Status::HostGone, "{e}");
    assert!(t.elapsed() < Duration::from_secs(5));
    // Next calls fail clearly too.
    assert!(h.attrs("").is_err());
    drop(q);
}

#[test]
fn fork_child_cannot_use_the_parents_queue_but_can_ask_again() {
    let host = start_host();
    let h = host.conn();
    let mut q = h.request_queue(&Capability::new("memcpy")).unwrap();
    assert_eq!(q.call(wrapdrive::Desc::default()).unwrap().status, 0);
    let socket = host.socket.clone();
    let waker = q.waker().unwrap();
    // SAFETY: the child only uses the library (which checks its fork
    // generation before touching any lock or ring) and then _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = (|| {
            // The parent's queue and connection are refused, clearly.
            match q.call(wrapdrive::Desc::default()) {
                Err(e) if e.status() == Status::BadState => {}
                _ => return 10,
            }
            // Also by the calls that read the ring without a result to
            // refuse with (they read the unmapped ring: SIGSEGV).
            if q.completions_ready() || q.ring_ready() || q.registers().is_some() {
                return 15;
            }
            match (q.arm_wait(), q.kick_wait(), waker.wake()) {
                (Err(a), Err(b), Err(c))
                    if [a.status(), b.status(), c.status()] == [Status::BadState; 3] => {}
                _ => return 16,
            }
            if h.get_attr("dev0/driver").is_ok() {
                return 11;
            }
            // A new connection gets a queue of the child's own.
            let Ok(h2) = HostConn::connect(&socket) else {
                return 12;
            };
            let Ok(mut q2) = h2.request_queue(&Capability::new("memcpy")) else {
                return 13;
            };
            match q2.call(wrapdrive::Desc::default()) {
                Ok(d) if d.status == 0 => 0,
                _ => 14,
            }
        })();
        // SAFETY: _exit in the forked child, skipping the parent's atexit state.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status), "child crashed: {status:#x}");
    assert_eq!(libc::WEXITSTATUS(status), 0, "child check failed");
    // The parent's queue still works, and the child's queue is gone.
    assert_eq!(q.call(wrapdrive::Desc::default()).unwrap().status, 0);
    wait_until("child's queue teardown", || queues(&h) == 1);
}
