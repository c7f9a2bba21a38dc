//! A thread's cipher lane as an event loop uses it (`Lane::wait_fd`,
//! `arm_or_kick`, as `wd_crypto_wait_fd` / `wd_crypto_arm` give them to
//! C), against synchronous requests of the same thread.

#![allow(unsafe_code)]

use std::os::fd::BorrowedFd;
use std::time::Duration;

use wd_crypto::lane::{self, Kind};
use wd_crypto::{config, Cipher, Direction, Policy};

fn setup() {
    std::env::set_var("WD_CRYPTO_HOST", "embedded");
    wd_embedded::install();
    config::set_policy(Policy::Offload);
    config::set_threshold(0);
}

/// Whether `fd` becomes readable within `ms` milliseconds.
fn readable(fd: i32, ms: u64) -> bool {
    // SAFETY: fd is the lane's wait descriptor, open for the lane's life
    // (this thread's lane stays for the whole test).
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    wd_sys::poll(&[fd], Some(Duration::from_millis(ms)))
        .unwrap()
        .iter()
        .any(|r| r.readable)
}

/// An event loop starts a job, arms the wait descriptor, then makes a
/// synchronous request of its own before it sleeps. The synchronous wait
/// takes the announcement over, reaps the job's completion into the stash
/// and drains the signal: the descriptor must still become readable (it
/// never did, and the loop slept for ever).
#[test]
fn a_synchronous_request_keeps_the_armed_wait_fd() {
    setup();
    let key = [7u8; 16];
    let iv = [9u8; 16];
    let input = vec![0x5au8; 64 << 10];
    let mut out = vec![0u8; input.len()];
    let sin = vec![0xa5u8; 256 << 10];
    let mut sout = vec![0u8; sin.len()];
    let mut stuck = 0;
    for _ in 0..10 {
        let mut a = Cipher::new("aes-128-cbc", &key, Direction::Encrypt).unwrap();
        let mut b = Cipher::new("aes-128-cbc", &key, Direction::Encrypt).unwrap();
        a.set_iv(&iv).unwrap();
        b.set_iv(&iv).unwrap();
        let job = a.start_offload(&input, &mut out).unwrap();
        assert!(!job.is_done(), "the job went to the device");
        let fd = lane::with_lane(Kind::Cipher, |l| l.wait_fd())
            .unwrap()
            .unwrap();
        let ready = lane::with_lane(Kind::Cipher, |l| l.arm_or_kick())
            .unwrap()
            .unwrap();
        b.update_offload(&sin, &mut sout).unwrap();
        if !ready && !readable(fd, 3000) {
            stuck += 1;
        }
        lane::with_open_lane(Kind::Cipher, |l| {
            l.disarm();
            Ok(())
        })
        .unwrap()
        .unwrap();
        a.finish(job, &mut out).unwrap();
    }
    assert_eq!(
        stuck, 0,
        "the armed wait descriptor stayed unreadable after a synchronous request \
         although the job's completion had come"
    );
}
