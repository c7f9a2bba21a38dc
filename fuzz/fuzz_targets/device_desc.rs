//! Ring descriptors from a hostile client, as the dummy device decodes them
//! and as the legacy path plans them: a status, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use wd_ring::{Desc, DESC_SIZE};

fuzz_target!(|data: &[u8]| {
    let mut b = [0u8; DESC_SIZE];
    let n = data.len().min(DESC_SIZE);
    b[..n].copy_from_slice(&data[..n]);
    let d = Desc::from_bytes(&b).expect("exactly one descriptor");
    assert_eq!(Desc::from_bytes(&d.to_bytes()), Some(d));
    if let Ok(Some(m)) = wd_dummy_msg::CopyMsg::decode(&d) {
        assert!(m.len <= wd_dummy_msg::MAX_COPY);
    }
    let _ = wd_dummy_msg::legacy_plan(&d);
});
