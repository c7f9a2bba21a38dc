//! Ring header words written by a hostile peer: every index the host reads
//! is validated, so fetch/complete return an error instead of reading out
//! of bounds or panicking.
#![no_main]
use libfuzzer_sys::fuzz_target;
use wd_ring::{RingLayout, RingView};

fuzz_target!(|data: &[u8]| {
    let word = |i: usize| -> u32 {
        let mut w = [0u8; 4];
        for (k, b) in w.iter_mut().enumerate() {
            *b = data.get(i * 4 + k).copied().unwrap_or(0);
        }
        u32::from_le_bytes(w)
    };
    let depth = 1u32 << (word(0) % 6 + 1);
    let layout = RingLayout::new(depth).expect("power of two in range");
    let mut mem = vec![0u64; layout.total_bytes() / 8 + 8];
    let base = ((mem.as_mut_ptr() as usize + 63) & !63) as *mut u8;
    // SAFETY: `mem` has total_bytes + 64 bytes from a 64-aligned base and
    // outlives both views.
    let mut host = unsafe { RingView::create(base, layout.total_bytes(), layout) }.unwrap();
    // SAFETY: as above.
    let peer = unsafe { RingView::attach(base, layout.total_bytes(), depth) }.unwrap();
    let mut out = Vec::new();
    for step in 0..8 {
        peer.poke_index("sq_tail", word(1 + step * 2));
        peer.poke_index("cq_head", word(2 + step * 2));
        out.clear();
        if host.fetch(64, &mut out).is_ok() {
            assert!(out.len() <= depth as usize);
            let _ = host.complete(&out);
        }
        let _ = host.host_prepare_sleep();
        let _ = host.cq_space();
    }
});
