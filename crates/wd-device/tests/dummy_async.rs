//! The asynchronous memcpy device on its own: a long copy (or many due at
//! once) goes on over several polls, so one poll never holds the engine
//! for all of it, and the bytes arrive whole.

use wd_device::dummy::CopyMsg;
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
