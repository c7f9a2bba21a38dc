//! Ring memory written by a hostile peer: entries with any bits (sequence
//! words, bodies, extension lines) and any head words. The host decodes
//! whatever it takes without panicking and never takes more than the depth
//! or than it can complete; a client reaping a hostile host's completions
//! and submitting against its head does the same.
#![no_main]
use libfuzzer_sys::fuzz_target;
use wd_ring::{Desc, RingLayout, RingView};

fuzz_target!(|data: &[u8]| {
    let byte = |i: usize| data.get(i).copied().unwrap_or(0);
    let word = |i: usize| u32::from_le_bytes([byte(i), byte(i + 1), byte(i + 2), byte(i + 3)]);
    let depth = 1u32 << (byte(0) % 6 + 1);
    let layout = RingLayout::new(depth).expect("power of two in range");
    let mut mem = vec![0u64; layout.total_bytes() / 8 + 8];
    let base = ((mem.as_mut_ptr() as usize + 63) & !63) as *mut u8;
    // SAFETY: `mem` has total_bytes + 64 bytes from a 64-aligned base and
    // outlives both views.
    let mut host = unsafe { RingView::create(base, layout.total_bytes(), layout) }.unwrap();
    // SAFETY: as above.
    let mut client = unsafe { RingView::attach(base, layout.total_bytes(), depth) }.unwrap();
    // The entries and extensions as the peer wrote them.
    let entries = layout.sq_offset()..layout.total_bytes();
    for (k, off) in entries.enumerate() {
        if k + 8 >= data.len() {
            break;
        }
        // SAFETY: off is inside the mapping; nothing else touches it now.
        unsafe { base.add(off).write(data[8 + k]) };
    }
    let mut out = Vec::new();
    for step in 0..4 {
        client.poke_index("cq_head", word(1 + step * 8));
        host.poke_index("sq_head", word(5 + step * 8));
        out.clear();
        if let Ok(n) = host.fetch(64, &mut out) {
            assert!(n <= depth as usize && out.len() == n);
            let _ = host.complete(&out);
        }
        let _ = host.host_prepare_sleep();
        let _ = host.cq_space();
        let mut got = [Desc::default(); 8];
        assert!(client.reap(&mut got) <= got.len());
        let _ = client.submit(&got);
    }
});
