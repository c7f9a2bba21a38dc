//! Property test: the shared-memory ring behaves like two bounded FIFOs,
//! with the host never taking more than it can complete.
#![allow(unsafe_code)]

use proptest::prelude::*;
use std::collections::VecDeque;
use wd_ring::{Desc, RingLayout, RingView};

#[derive(Clone, Debug)]
enum Op {
    Submit(u8),
    Fetch(u8),
    Reap(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..10).prop_map(Op::Submit),
        (0u8..10).prop_map(Op::Fetch),
        (0u8..10).prop_map(Op::Reap),
    ]
}

proptest! {
    #[test]
    fn ring_matches_fifo_model(depth_log in 1u32..5, ops in proptest::collection::vec(op(), 1..200)) {
        let depth = 1u32 << depth_log;
        let l = RingLayout::new(depth).unwrap();
        let mut mem = vec![0u64; l.total_bytes() / 8 + 8];
        let p = ((mem.as_mut_ptr() as usize + 63) & !63) as *mut u8;
        // SAFETY: `mem` has total_bytes + 64 bytes, p is 64-aligned, mem outlives both views.
        let mut host = unsafe { RingView::create(p, l.total_bytes(), l) }.unwrap();
        // SAFETY: as above.
        let mut client = unsafe { RingView::attach(p, l.total_bytes(), depth) }.unwrap();
        let mut sq: VecDeque<u64> = VecDeque::new();
        let mut cq: VecDeque<u64> = VecDeque::new();
        let mut next = 0u64;
        for op in ops {
            match op {
                Op::Submit(n) => {
                    let descs: Vec<Desc> = (0..n as u64).map(|i| Desc { tag: next + i, ..Desc::default() }).collect();
                    let room = depth as usize - sq.len();
                    let took = client.submit(&descs).unwrap();
                    prop_assert_eq!(took, (n as usize).min(room));
                    for d in &descs[..took] { sq.push_back(d.tag); }
                    next += took as u64;
                }
                Op::Fetch(n) => {
                    let mut got = Vec::new();
                    let took = host.fetch(n as usize, &mut got).unwrap();
                    let room = depth as usize - cq.len();
                    prop_assert_eq!(took, (n as usize).min(sq.len()).min(room));
                    for g in &got {
                        prop_assert_eq!(Some(g.tag), sq.pop_front());
                        cq.push_back(g.tag);
                    }
                    host.complete(&got).unwrap();
                }
                Op::Reap(n) => {
                    let mut out = vec![Desc::default(); n as usize];
                    let took = client.reap(&mut out);
                    prop_assert_eq!(took, (n as usize).min(cq.len()));
                    for o in &out[..took] { prop_assert_eq!(Some(o.tag), cq.pop_front()); }
                }
            }
        }
    }
}

/// Two threads, as a client and an engine would run: every request comes
/// back once, in order, with its whole message (inline or continued in the
/// extension line), across many laps of a small ring. Catches an entry
/// read before its sequence word says it is written.
#[test]
fn concurrent_sides_see_whole_entries_in_order() {
    const N: u64 = 200_000;
    let depth = 8u32;
    let l = RingLayout::new(depth).unwrap();
    let mut mem = vec![0u64; l.total_bytes() / 8 + 8];
    let p = ((mem.as_mut_ptr() as usize + 63) & !63) as *mut u8;
    // SAFETY: `mem` has total_bytes + 64 bytes, p is 64-aligned, and mem
    // outlives both views (the engine thread is joined below).
    let mut host = unsafe { RingView::create(p, l.total_bytes(), l) }.unwrap();
    // SAFETY: as above.
    let mut client = unsafe { RingView::attach(p, l.total_bytes(), depth) }.unwrap();
    let message = |i: u64| {
        let mut d = Desc {
            tag: i & 0xffff_ffff,
            opcode: i as u16,
            ..Desc::default()
        };
        d.set_payload_u64(0, i);
        d.set_payload_u64(40, !i);
        if i % 3 == 0 {
            // Continued in the extension line.
            d.set_payload_u64(88, i.wrapping_mul(0x9e37_79b9));
        }
        d
    };
    let engine = std::thread::spawn(move || {
        let mut next = 0u64;
        let mut got = Vec::new();
        while next < N {
            got.clear();
            let n = host.fetch(4, &mut got).unwrap();
            for d in &got[..n] {
                assert_eq!(*d, message(next), "request {next}");
                next += 1;
            }
            let mut done = got.clone();
            for d in &mut done {
                d.result = d.payload_u64(0) + 1;
            }
            host.complete(&done).unwrap();
        }
    });
    let (mut sent, mut received) = (0u64, 0u64);
    let mut out = [Desc::default(); 8];
    while received < N {
        if sent < N {
            let batch: Vec<Desc> = (sent..N.min(sent + 3)).map(message).collect();
            sent += client.submit(&batch).unwrap() as u64;
        }
        let n = client.reap(&mut out);
        for d in &out[..n] {
            assert_eq!(d.tag, received & 0xffff_ffff);
            assert_eq!(d.result, received + 1, "completion {received}");
            assert_eq!(d.payload_u64(0), received);
            received += 1;
        }
    }
    engine.join().unwrap();
}
