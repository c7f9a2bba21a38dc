//! The legacy (socket) path needs the message format's planner: the client
//! library knows no device, so a legacy queue that was not given one
//! refuses to send, and one that was carries the request's memory itself.

use wd_dummy_msg::CopyMsg;
use wrapdrive::{alloc, free, Capability, Status, CAPA_ALLOW_LEGACY};

#[test]
fn legacy_queue_without_a_planner_refuses_and_with_one_copies() {
    let host = wd_embedded::connect().unwrap();
    let capa = Capability::new("memcpy").flags(CAPA_ALLOW_LEGACY);
    let mut q = host.request_queue(&capa).unwrap();
    assert_ne!(q.flags() & CAPA_ALLOW_LEGACY, 0);

    // Legacy requests travel through the socket: no share needed.
    let src = alloc(4096, None).unwrap();
    let dst = alloc(4096, None).unwrap();
    let me = wd_sys::process_mem::ProcessMemory::own().unwrap();
    me.write(src, &[0x5a; 4096]).unwrap();
    let req = CopyMsg {
        src,
        dst,
        len: 4096,
    }
    .to_desc(0);

    let e = q.send(req, 1).unwrap_err();
    assert_eq!(e.status(), Status::Unsupported);
    assert!(e.to_string().contains("set_legacy_planner"), "{e}");

    q.set_legacy_planner(wd_dummy_msg::legacy_plan);
    let done = q.call(req).unwrap();
    assert_eq!((done.status, done.result), (0, 4096));
    let mut back = [0u8; 4096];
    me.read(dst, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0x5a));
    free(src).unwrap();
    free(dst).unwrap();
}

/// A legacy batch whose second request fails counts the first, which ran
/// (it returned the second's error, the first's completion coming out of
/// `recv` after it); the failing one alone is the error.
#[test]
fn a_legacy_batch_that_fails_part_way_counts_what_was_sent() {
    let host = wd_embedded::connect().unwrap();
    let mut q = host
        .request_queue(&Capability::new("memcpy").flags(CAPA_ALLOW_LEGACY))
        .unwrap();
    q.set_legacy_planner(wd_dummy_msg::legacy_plan);
    let src = alloc(4096, None).unwrap();
    let dst = alloc(4096, None).unwrap();
    let good = CopyMsg {
        src,
        dst,
        len: 4096,
    }
    .to_desc(0);
    // A source the process cannot read: the client fails it.
    let bad = CopyMsg {
        src: 0x10,
        dst,
        len: 4096,
    }
    .to_desc(0);
    assert_eq!(q.send_batch(&[(good, 1), (bad, 2)]).unwrap(), 1);
    let mut got = Vec::new();
    while let Some(c) = q.recv().unwrap() {
        got.push(c.cookie);
    }
    assert_eq!(got, [1]);
    assert!(q.send_batch(&[(bad, 3)]).is_err());
    free(src).unwrap();
    free(dst).unwrap();
}
