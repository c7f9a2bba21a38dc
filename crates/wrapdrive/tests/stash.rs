//! The client's one completion stash: a caller waits for its own request
//! (`recv_cookie`) while other requests complete first, those wait in the
//! stash for their own callers, and a forgotten request's completion is
//! dropped wherever it is met.

use std::time::{Duration, Instant};

use wd_dummy_msg::CopyMsg;
use wrapdrive::{Capability, SharedBuf};

#[test]
fn each_caller_gets_its_own_completion_and_forgotten_ones_vanish() {
    let h = wd_embedded::connect().unwrap();
    let mut q = h.request_queue(&Capability::new("memcpy")).unwrap();
    let src = SharedBuf::new(4096).unwrap();
    let dst = SharedBuf::new(4096).unwrap();
    src.write(0, &[9u8; 4096]);
    q.share(src.addr(), 4096).unwrap();
    q.share(dst.addr(), 4096).unwrap();
    let copy = |off: u64, len: u64| {
        CopyMsg {
            src: src.addr() + off,
            dst: dst.addr() + off,
            len,
        }
        .to_desc(0)
    };
    // Four requests; the ring completes them in order.
    for (cookie, off) in [(10u64, 0u64), (11, 1024), (12, 2048), (13, 3072)] {
        q.send(copy(off, 1024), cookie).unwrap();
    }
    q.forget(11);
    // Waiting for the last one reaps the others into the stash.
    let deadline = Instant::now() + Duration::from_secs(10);
    let last = loop {
        if let Some(c) = q.recv_cookie(13).unwrap() {
            break c;
        }
        assert!(Instant::now() < deadline, "request 13 never completed");
        q.wait_completion(Some(Duration::from_millis(100))).unwrap();
    };
    assert_eq!(
        (last.cookie, last.desc.status, last.desc.result),
        (13, 0, 1024)
    );
    assert_eq!(q.stashed(), 2, "10 and 12 wait; 11 was forgotten");
    assert_eq!(q.recv_cookie(12).unwrap().map(|c| c.cookie), Some(12));
    assert_eq!(q.recv_cookie(11).unwrap(), None, "forgotten");
    assert_eq!(q.recv().unwrap().map(|c| c.cookie), Some(10));
    assert_eq!(q.recv().unwrap(), None);
    assert_eq!(q.in_flight(), 0);
    assert_eq!(dst.to_vec(), vec![9u8; 4096]);
    // A forgotten request whose completion already waits in the stash.
    q.send(copy(0, 8), 20).unwrap();
    q.send(copy(8, 8), 21).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while q.recv_cookie(21).unwrap().is_none() {
        assert!(Instant::now() < deadline, "request 21 never completed");
        q.wait_completion(Some(Duration::from_millis(100))).unwrap();
    }
    assert_eq!(q.stashed(), 1);
    q.forget(20);
    assert_eq!(q.stashed(), 0);
    assert_eq!(q.recv().unwrap(), None);
    // Forgetting a cookie received already does nothing: a later request
    // of the same cookie is handed out (its completion was dropped).
    q.forget(21);
    q.send(copy(0, 8), 21).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while q.recv_cookie(21).unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the later request 21 was dropped"
        );
        q.wait_completion(Some(Duration::from_millis(100))).unwrap();
    }
}
