//! Sec device descriptors from a hostile client: the decoder gives a
//! request within the named limits or a status, never a panic; what it
//! accepts re-encodes to the same request, and the legacy plan of a valid
//! request never reads more than the request names.
#![no_main]
use libfuzzer_sys::fuzz_target;
use wd_ring::{Desc, DESC_SIZE};
use wd_sec_msg::{self as msg, Request};

fuzz_target!(|data: &[u8]| {
    let mut b = [0u8; DESC_SIZE];
    let n = data.len().min(DESC_SIZE);
    b[..n].copy_from_slice(&data[..n]);
    let d = Desc::from_bytes(&b).expect("exactly one descriptor");
    match msg::decode(&d) {
        Err(e) => assert!(e.status() < 0),
        Ok(r) => {
            let again = match r {
                Request::Nop => return,
                Request::SessionNew(s) => s.encode(),
                Request::SessionFree(f) => f.encode(),
                Request::SessionClone(c) => c.encode(),
                Request::Cipher(c) => {
                    assert!(c.len <= msg::MAX_DATA && c.aad_len <= msg::MAX_AAD);
                    c.encode()
                }
                Request::Digest(g) => {
                    assert!(g.len <= msg::MAX_DATA);
                    g.encode()
                }
            };
            assert_eq!(msg::decode(&again), Ok(r));
            if let Ok(plan) = msg::legacy_plan(&d) {
                let total: u64 = plan.inputs.iter().map(|r| r.1).sum();
                assert!(total <= 2 * msg::MAX_DATA + msg::MAX_AAD as u64 + msg::MAX_KEY as u64);
            }
        }
    }
});
