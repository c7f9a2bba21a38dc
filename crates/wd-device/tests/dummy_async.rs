//! The asynchronous memcpy device on its own: a long copy (or many due at
//! once) goes on over several polls, so one poll never holds the engine
//! for all of it, and the bytes arrive whole.

use wd_device::dummy::{CopyMsg, DummyDriver};
use wd_device::dummy_async::{DummyAsyncDriver, HOLD, POLL_BYTES};
use wd_device::{Driver, Started};
use wd_testutil::dma::FlatMemory;

const BASE: u64 = 0x10_0000;

#[test]
fn a_long_copy_is_done_over_several_polls() {
    let len = 8 * POLL_BYTES as usize;
    let mut mem = FlatMemory::new(BASE, 2 * len);
    mem.set_holds(true);
    let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
    mem.put(BASE, &data);
    let mut q = DummyAsyncDriver.open_queue(0);
    let mut d = CopyMsg {
        src: BASE,
        dst: BASE + len as u64,
        len: len as u64,
    }
    .to_desc(1);
    assert_eq!(q.start(7, &mut d, &mut mem), Started::Held);
    std::thread::sleep(HOLD);
    let mut done = Vec::new();
    let mut polls = 0;
    while done.is_empty() {
        q.poll(&mut done);
        polls += 1;
        assert!(polls <= 8, "a poll copied less than its share");
    }
    assert_eq!(polls, 8, "a poll copied more than {POLL_BYTES} bytes");
    assert_eq!(
        (done[0].0, done[0].1.status, done[0].1.result),
        (7, 0, len as u64)
    );
    assert_eq!(q.in_flight(), 0);
    assert_eq!(mem.get(BASE + len as u64, len), data);
}

/// A copy half done goes on before newer ones: a steady stream of new
/// copies (each due, newest first) would otherwise keep it from ever
/// finishing.
#[test]
fn a_half_done_copy_is_not_starved_by_newer_ones() {
    let long = 4 * POLL_BYTES as usize;
    let short = POLL_BYTES as usize;
    let mut mem = FlatMemory::new(BASE, 2 * long + 8 * short);
    mem.set_holds(true);
    let mut q = DummyAsyncDriver.open_queue(0);
    let copy = |src: usize, dst: usize, len: usize| {
        CopyMsg {
            src: BASE + src as u64,
            dst: BASE + dst as u64,
            len: len as u64,
        }
        .to_desc(1)
    };
    let mut d = copy(0, long, long);
    assert_eq!(q.start(0, &mut d, &mut mem), Started::Held);
    std::thread::sleep(HOLD);
    let mut done = Vec::new();
    // Every poll, a new short copy that is due by the next one.
    for token in 1..=4u64 {
        q.poll(&mut done);
        let mut d = copy(0, 2 * long + token as usize * short, short);
        assert_eq!(q.start(token, &mut d, &mut mem), Started::Held);
        std::thread::sleep(HOLD);
    }
    assert!(
        done.iter().any(|(t, _)| *t == 0),
        "the long copy is still not done after four polls of its size: {:?}",
        done.iter().map(|(t, _)| t).collect::<Vec<_>>()
    );
}

/// A held copy whose destination overlaps its source from above runs its
/// pieces back to front, as the synchronous device does: front to back, a
/// later piece read bytes an earlier one had overwritten.
#[test]
fn an_overlapping_held_copy_moves_bytes_as_memmove_does() {
    let len = 2 * POLL_BYTES as usize;
    let shift = 16usize;
    let total = len + shift;
    let init: Vec<u8> = (0..total).map(|i| (i * 7 % 251) as u8).collect();
    let d = CopyMsg {
        src: BASE,
        dst: BASE + shift as u64,
        len: len as u64,
    }
    .to_desc(1);

    // Reference: memmove.
    let mut want = init.clone();
    want.copy_within(0..len, shift);

    // The synchronous dummy agrees with memmove.
    let mut sync_mem = FlatMemory::new(BASE, total);
    sync_mem.put(BASE, &init);
    let mut sq = DummyDriver.open_queue(0);
    let mut sd = d;
    sq.process(&mut sd, &mut sync_mem);
    assert_eq!(sd.status, 0);
    assert!(
        sync_mem.get(BASE, total) == want,
        "sync dummy differs from memmove"
    );

    // The asynchronous one, holding the request.
    let mut mem = FlatMemory::new(BASE, total);
    mem.set_holds(true);
    mem.put(BASE, &init);
    let mut q = DummyAsyncDriver.open_queue(0);
    let mut ad = d;
    assert_eq!(q.start(1, &mut ad, &mut mem), Started::Held);
    std::thread::sleep(HOLD);
    let mut done = Vec::new();
    for _ in 0..16 {
        q.poll(&mut done);
        if !done.is_empty() {
            break;
        }
    }
    assert_eq!(done.len(), 1);
    assert_eq!((done[0].1.status, done[0].1.result), (0, len as u64));
    let got = mem.get(BASE, total);
    let first_bad = got.iter().zip(&want).position(|(a, b)| a != b);
    assert!(
        first_bad.is_none(),
        "async dummy's overlapping copy differs from memmove at byte {:?} (of {total})",
        first_bad
    );
}

/// A due copy not yet started is not starved by newer due copies (only a
/// half-done one was protected): with one more copy due per poll, the
/// oldest never completed.
#[test]
fn an_old_due_copy_is_not_starved_by_newer_ones() {
    let n = POLL_BYTES as usize;
    let mut mem = FlatMemory::new(BASE, 16 * n);
    mem.set_holds(true);
    let mut q = DummyAsyncDriver.open_queue(0);
    let copy = |src: usize, dst: usize| {
        CopyMsg {
            src: BASE + src as u64,
            dst: BASE + dst as u64,
            len: n as u64,
        }
        .to_desc(1)
    };
    // Token 0 (the oldest) and token 1, both due at the first poll.
    let mut a = copy(0, n);
    assert_eq!(q.start(0, &mut a, &mut mem), Started::Held);
    let mut b = copy(0, 2 * n);
    assert_eq!(q.start(1, &mut b, &mut mem), Started::Held);
    std::thread::sleep(HOLD);
    let mut done = Vec::new();
    for token in 2..=8u64 {
        q.poll(&mut done);
        // The client keeps its queue busy: a new copy, due by the next poll.
        let mut d = copy(0, (3 + (token as usize % 8)) * n);
        assert_eq!(q.start(token, &mut d, &mut mem), Started::Held);
        std::thread::sleep(HOLD);
    }
    let tokens: Vec<u64> = done.iter().map(|(t, _)| *t).collect();
    assert!(
        tokens.contains(&0),
        "the oldest copy is still held after 7 polls while newer ones completed: {tokens:?}"
    );
}
