//! connect_unix to a listener whose backlog is full: EAGAIN by the
//! deadline, also when signals keep interrupting the wait.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

extern "C" fn nothing(_: libc::c_int) {}

/// A thread that gets a signal more often than its deadline (a
/// profiler's SIGPROF, an interval timer): each EINTR waits only what is
/// left (each started a whole new wait, so the deadline never came).
#[test]
fn connect_to_a_full_backlog_keeps_its_deadline_under_signals() {
    let dir = wd_testutil::tempdir("wd-sys-connect");
    let path = dir.join("full.sock");
    let (_listener, _held) = wd_testutil::full_listener(&path);
    // SAFETY: a handler that does nothing, installed for this process.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = nothing as extern "C" fn(libc::c_int) as usize;
        sa.sa_flags = libc::SA_RESTART;
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
    // SAFETY: pthread_self has no preconditions.
    let me = unsafe { libc::pthread_self() } as usize;
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    // Signals every 100 ms for at most 4 s.
    let kicker = std::thread::spawn(move || {
        let t = Instant::now();
        while !s2.load(Ordering::Relaxed) && t.elapsed() < Duration::from_secs(4) {
            std::thread::sleep(Duration::from_millis(100));
            // SAFETY: the test's thread lives until this thread is joined.
            unsafe { libc::pthread_kill(me as libc::pthread_t, libc::SIGUSR1) };
        }
    });
    let t = Instant::now();
    let r = wd_sys::connect_unix(path.as_bytes(), false, Duration::from_millis(300));
    let took = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    kicker.join().unwrap();
    assert_eq!(r.err().map(|e| e.errno()), Some(libc::EAGAIN));
    assert!(
        took < Duration::from_secs(2),
        "a 300 ms deadline took {took:?}"
    );
}
