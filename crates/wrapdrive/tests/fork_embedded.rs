//! docs/c-abi.md promises that "a fork while other threads
//! allocate or connect leaves the child nothing held by a thread it does
//! not have". The in-process host's slot is locked for as long as a host
//! starts; a fork then leaves it locked in the child, whose every
//! `WD_HOST=embedded` connect waits for ever.
#![allow(unsafe_code)]

use std::time::{Duration, Instant};

fn slow_starter() -> wrapdrive::Result<wrapdrive::EmbeddedHost> {
    std::thread::sleep(Duration::from_millis(400));
    Err(wrapdrive::ClientError::new(
        wrapdrive::Status::Unsupported,
        "no host in this test",
    ))
}

#[test]
fn a_fork_while_a_host_starts_does_not_hang_the_child() {
    wrapdrive::register_embedded_host(slow_starter);
    let starting = std::thread::spawn(|| {
        let _ = wrapdrive::HostConn::embedded();
    });
    std::thread::sleep(Duration::from_millis(100));
    // SAFETY: the child only asks for the host and _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let _ = wrapdrive::HostConn::embedded();
        // SAFETY: ends the child at once.
        unsafe { libc::_exit(0) };
    }
    starting.join().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut status = 0;
    loop {
        // SAFETY: our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break;
        }
        if Instant::now() > deadline {
            // SAFETY: our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            panic!("the child hangs asking for the in-process host");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
}
