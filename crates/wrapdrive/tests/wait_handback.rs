//! A synchronous wait that takes an event loop's announcement
//! (`arm_wait`) over hands it back on every way out, not only when a
//! `recv_cookie` finds its own completion: otherwise the loop's wait
//! descriptor stays unreadable although its request completed (a lost
//! wake-up).
#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::Arc;
use std::time::Duration;

use wd_dummy_msg::CopyMsg;
use wd_host::DeviceConfig;
use wrapdrive::{Capability, HostConn, SharedBuf, Status};

fn host() -> (Arc<wd_host::Host>, Arc<HostConn>) {
    let h = Arc::new(wd_host::Host::embedded(vec![DeviceConfig::new("dummy-async")]).unwrap());
    let c = wd_embedded::connect_to(&h).unwrap();
    (h, c)
}

fn readable(fd: i32, ms: u64) -> bool {
    // SAFETY: the queue's wait descriptor, open for the whole test.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    wd_sys::poll(&[fd], Some(Duration::from_millis(ms)))
        .unwrap()
        .iter()
        .any(|r| r.readable)
}

/// A synchronous caller waits (with a timeout) for its own request and
/// gives up before it comes; meanwhile the event loop's request completes.
/// The loop armed the descriptor before: it must become readable.
#[test]
fn a_timed_out_synchronous_wait_hands_the_loops_wait_back() {
    let (_h, c) = host();
    let mut q = c
        .request_queue(&Capability::new("memcpy-async").depth(16))
        .unwrap();
    let src = SharedBuf::new(2 * 4096).unwrap();
    let dst = SharedBuf::new(2 * 4096).unwrap();
    q.share(src.addr(), src.len()).unwrap();
    q.share(dst.addr(), dst.len()).unwrap();
    let copy = |i: u64| {
        CopyMsg {
            src: src.addr() + i * 4096,
            dst: dst.addr() + i * 4096,
            len: 4096,
        }
        .to_desc(0)
    };
    let fd = q.wait_fd().unwrap().as_raw_fd();
    // The event loop's job, then its announcement.
    q.send(copy(0), 1).unwrap();
    assert!(!q.arm_wait().unwrap(), "held for HOLD: not done yet");
    // A synchronous request of the same thread, waited for briefly (well
    // under the device's HOLD), then given up on.
    q.send(copy(1), 2).unwrap();
    q.wait_completion(Some(Duration::from_millis(2))).unwrap();
    let _ = q.recv_cookie(2).unwrap();
    // The loop now sleeps on its descriptor: its job completes within
    // HOLD (20 ms).
    assert!(
        readable(fd, 2000),
        "the loop's armed wait descriptor never became readable although its request completed"
    );
}

/// `send_sync` on a full queue waits for a completion to be posted; when
/// that completion is the event loop's, the loop must still be woken.
#[test]
fn send_sync_on_a_full_queue_hands_the_loops_wait_back() {
    let (_h, c) = host();
    let mut q = c
        .request_queue(&Capability::new("memcpy-async").depth(4))
        .unwrap();
    let depth = q.depth() as u64;
    let src = SharedBuf::new((depth as usize + 1) * 4096).unwrap();
    let dst = SharedBuf::new((depth as usize + 1) * 4096).unwrap();
    q.share(src.addr(), src.len()).unwrap();
    q.share(dst.addr(), dst.len()).unwrap();
    let copy = |i: u64| {
        CopyMsg {
            src: src.addr() + i * 4096,
            dst: dst.addr() + i * 4096,
            len: 4096,
        }
        .to_desc(0)
    };
    let fd = q.wait_fd().unwrap().as_raw_fd();
    q.send(copy(0), 1).unwrap();
    assert!(!q.arm_wait().unwrap());
    for i in 1..depth {
        q.send(copy(i), 1 + i).unwrap();
    }
    // Full: waits for a completion to be posted, then says Busy.
    let e = q.send_sync(copy(depth), 100).unwrap_err();
    assert_eq!(e.status(), Status::Busy, "{e}");
    assert!(q.completions_ready());
    assert!(
        readable(fd, 2000),
        "completions are ready, the loop armed, yet its wait descriptor is not readable"
    );
}
