//! Host memory a sec queue keeps after a request: a whole GCM decryption
//! (its plaintext is held back until the tag matches) grew the queue's
//! buffer to the request's length, up to 64 MiB, and kept it for the
//! queue's life (256 queues a connection). Its own test binary: it counts
//! the process's allocations.
#![allow(unsafe_code)]

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use common::{cipher, mem, run, session, BASE};
use wd_sec::msg::{CipherOp, F_ENCRYPT, F_FINAL, F_IV};
use wd_sec::{Alg, SecQueue, TYPE_CIPHER};

/// The system allocator, counting the bytes live.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is passed on to the system allocator unchanged; the
// count beside it allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's layout, as GlobalAlloc::alloc requires.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: `p` came from this allocator (the system's) with `l`.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: as `alloc`.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        // SAFETY: `p` came from the system allocator with `l`.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

#[test]
fn a_whole_gcm_decryption_does_not_keep_its_buffer() {
    let len = 16usize << 20;
    let mut m = mem(2 * len + (1 << 20), true);
    let (src, dst, tag) = (
        BASE + 0x10_0000,
        BASE + 0x10_0000 + len as u64,
        BASE + 0x9000,
    );
    let mut q = SecQueue::new(TYPE_CIPHER);
    let s = session(
        &mut q,
        &mut m,
        Alg::by_name("aes-128-gcm").unwrap(),
        &[7u8; 16],
    );
    let whole = |flags, dst| {
        let mut op: CipherOp = cipher(s, flags | F_IV | F_FINAL, src, dst, len, &[9u8; 12]);
        (op.tag, op.tag_len) = (tag, 16);
        op.encode()
    };
    // A ciphertext and its tag, in place; then a small request, so that
    // what the queue keeps anyway is there before counting.
    assert_eq!(run(&mut q, &mut m, whole(F_ENCRYPT, src)).status, 0);
    let small = cipher(
        s,
        F_ENCRYPT | F_IV,
        BASE + 0x1000,
        BASE + 0x2000,
        64,
        &[1u8; 12],
    );
    assert_eq!(run(&mut q, &mut m, small.encode()).status, 0);
    let before = LIVE.load(Ordering::Relaxed);
    assert_eq!(run(&mut q, &mut m, whole(0, dst)).status, 0);
    let kept = LIVE.load(Ordering::Relaxed) - before;
    assert!(
        kept < 1 << 20,
        "the queue keeps {kept} bytes after a {len}-byte GCM decryption"
    );
}
