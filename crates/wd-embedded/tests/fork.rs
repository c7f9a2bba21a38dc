//! "One host per process" across fork. The host's threads are not
//! in a forked child, yet the child's `WD_HOST=embedded` was handed the
//! parent's host (cached in a static): it works only while the parent
//! lives, and the child can never start one of its own (the stale entry
//! stays, and the parent's listening socket, inherited, keeps accepting
//! connections nobody answers once the parent is gone).
#![allow(unsafe_code)]

#[test]
fn a_forked_child_gets_a_host_of_its_own() {
    let parent = wd_embedded::connect().unwrap();
    assert_eq!(parent.host_pid(), std::process::id());
    // SAFETY: the child only connects and exits with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let code = match wd_embedded::connect() {
            Ok(c) if c.host_pid() == std::process::id() => 0,
            Ok(_) => 1,
            Err(_) => 2,
        };
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status), "child status {status:#x}");
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "1: the child was handed its parent's host; 2: it could not connect"
    );
}

/// The failure a program sees: a process with an embedded host forks and
/// exits; its child's `WD_HOST=embedded` is the dead parent's host (whose
/// listening socket the child inherited, so the connect succeeds and the
/// Hello is never answered), for good.
#[test]
fn a_child_outliving_its_parent_still_gets_a_host() {
    let report = std::env::temp_dir().join(format!("wd-embedded-fork-{}", std::process::id()));
    let _ = std::fs::remove_file(&report);
    std::env::set_var("WD_CONNECT_TIMEOUT_MS", "1000");
    // SAFETY: the forked processes only connect, fork and _exit.
    let q = unsafe { libc::fork() };
    assert!(q >= 0);
    if q == 0 {
        // The "parent" process: its own host, then a child, then gone.
        let code = match wd_embedded::connect() {
            Ok(c) if c.host_pid() == std::process::id() => {
                // SAFETY: getpid has no preconditions.
                let parent = unsafe { libc::getpid() };
                // SAFETY: as above.
                if unsafe { libc::fork() } == 0 {
                    // SAFETY: getppid has no preconditions.
                    while unsafe { libc::getppid() } == parent {
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                    let code: u8 = match wd_embedded::connect() {
                        Ok(c) if c.host_pid() == std::process::id() => 0,
                        Ok(_) => 3,
                        Err(_) => 4,
                    };
                    std::fs::write(&report, [code]).unwrap();
                    // SAFETY: as above.
                    unsafe { libc::_exit(0) };
                }
                0
            }
            _ => 1,
        };
        // SAFETY: as above.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(q, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{status:#x}"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let code = loop {
        if let Ok(b) = std::fs::read(&report) {
            if !b.is_empty() {
                break b[0];
            }
        }
        assert!(std::time::Instant::now() < deadline, "no report");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let _ = std::fs::remove_file(&report);
    assert_eq!(
        code, 0,
        "3: the dead parent's host answered?; 4: no host for the orphan"
    );
}
