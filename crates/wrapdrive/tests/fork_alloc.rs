//! Forking while another thread allocates: the child's first allocation
//! must not wait for a lock the other thread held at the fork (that
//! thread is not in the child). Its own binary: no other test's threads.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[test]
fn a_child_forked_while_another_thread_allocates_can_allocate() {
    let stop = Arc::new(AtomicBool::new(false));
    let busy = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Ok(a) = wrapdrive::alloc(4096, None) {
                    let _ = wrapdrive::free(a);
                }
            }
        })
    };
    let mut hung = 0;
    for _ in 0..200 {
        // SAFETY: the child allocates, frees and _exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let ok = wrapdrive::alloc(4096, None)
                .and_then(wrapdrive::free)
                .is_ok();
            // SAFETY: forked child.
            unsafe { libc::_exit(i32::from(!ok)) };
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut status = 0;
        loop {
            // SAFETY: our own child.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r == pid {
                assert!(
                    libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                    "the child's allocation failed"
                );
                break;
            }
            if Instant::now() > deadline {
                hung += 1;
                // SAFETY: our own child, stuck.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, &mut status, 0);
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        if hung > 0 {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    busy.join().unwrap();
    assert_eq!(hung, 0, "a child waited for ever for the allocator");
}
