//! Zip device descriptors and the memory they name, from a hostile
//! client: a sequence of descriptors (each request's bytes, then the
//! client memory's contents) run through one device queue over flat
//! memory, as the engine runs them: a part per call where the device cuts
//! a long one. Every request completes with a status, never a panic, in a
//! bounded number of parts; what the decoder accepts re-encodes to the
//! same request; an output never grows past the room the request gave;
//! sessions stay within the table's bound and end with the queue.
#![no_main]
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use wd_device::{DeviceQueue, Progress};
use wd_ring::{Desc, DESC_SIZE};
use wd_testutil::dma::FlatMemory;
use wd_zip::msg::{self, Done, Request};

const BASE: u64 = 0x1_0000;
const MEM: usize = 512 << 10;
/// The bound on most requests' lengths.
const SMALL: usize = 16 << 10;

fuzz_target!(|data: &[u8]| {
    let live = Arc::new(AtomicU64::new(0));
    let mut q = wd_zip::ZipQueue::new(live.clone());
    let mut mem = FlatMemory::new(BASE, MEM);
    // The first part of the input fills client memory (compressed data
    // to decode, text to compress); descriptors follow.
    let split = data
        .len()
        .min(MEM)
        .min(data.first().map_or(0, |&b| b as usize * 512));
    mem.put(BASE, &data[..split]);
    mem.set_slices(data.len().is_multiple_of(2));
    let mut large = 0;
    for chunk in data[split..].chunks(DESC_SIZE) {
        let mut b = [0u8; DESC_SIZE];
        b[..chunk.len()].copy_from_slice(chunk);
        let mut d = Desc::from_bytes(&b).expect("one descriptor");
        // Most addresses inside the memory, so requests get past translation.
        if chunk.len() > 2 && chunk[1] & 1 == 0 {
            for off in [0usize, 16] {
                let v = d.payload_u64(off);
                d.set_payload_u64(off, BASE + v % MEM as u64);
            }
            // Large requests (past a window, many blocks, two zstd parts)
            // two per input at most: compressing 256 KiB takes most of an
            // execution,
            // and the corpus fills with them when every request may be
            // that big.
            let most = if (chunk[1] >> 1) & 3 == 0 && large < 2 {
                large += 1;
                MEM / 2
            } else {
                SMALL
            };
            let len = d.payload_u64(8);
            d.set_payload_u64(8, len % most as u64);
            let room = d.payload_u64(24);
            d.set_payload_u64(24, room % most as u64);
        }
        let decoded = msg::decode(&d);
        if let Ok(r) = decoded {
            let again = match r {
                Request::Nop => Desc::default(),
                Request::SessionNew(s) => s.to_desc(d.tag),
                Request::SessionFree(f) => f.to_desc(d.tag),
                Request::OneShot(o) => o.to_desc(d.tag),
                Request::Stream(s) => s.to_desc(d.tag),
            };
            assert_eq!(msg::decode(&again), Ok(r));
        }
        let before = d;
        let mut done = 0;
        for parts in 0.. {
            let mut x = before;
            match q.process_part(&mut x, &mut mem, done, 1) {
                Progress::More(n) => {
                    assert!(n > 0 && n >= done && parts < 10_000);
                    done = n;
                }
                Progress::Done => {
                    d = x;
                    break;
                }
            }
        }
        assert!(d.status <= 0);
        if d.status == 0 {
            if let Ok(Request::OneShot(o)) = decoded {
                let done = Done::from_result(d.result);
                assert!(done.produced <= o.dst_len && done.consumed <= o.src_len);
            }
            if let Ok(Request::Stream(o)) = decoded {
                let done = Done::from_result(d.result);
                assert!(done.produced <= o.dst_len && done.consumed <= o.src_len);
            }
        }
        assert_eq!(d.tag, before.tag);
        assert!(q.session_count() <= msg::MAX_SESSIONS);
    }
    drop(q);
    assert_eq!(
        live.load(Ordering::Relaxed),
        0,
        "sessions outlived their queue"
    );
});
