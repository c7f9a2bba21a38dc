//! virtio-iommu requests from a hostile driver: bytes in, a status (or an
//! untouched buffer) out, never a panic, and the device's invariants hold
//! after any sequence.
#![no_main]
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use wd_iommu::virtio::{
    parse_tail, DeviceSettings, GuestMemory, Request, ResvMem, VirtioIommu, REQ_TAIL_LEN,
};
use wd_iommu::{Domain, DomainConfig, Endpoint, Iommu, Prot, Release};

/// Guest memory: 64 MiB at 0x1000_0000, anything else is not memory.
struct Mem;
impl GuestMemory for Mem {
    fn resolve(&self, gpa: u64, size: u64, _prot: Prot) -> Option<(Vec<(u64, u64)>, Release)> {
        let end = gpa.checked_add(size)?;
        (gpa >= 0x1000_0000 && end <= 0x1400_0000).then(|| {
            (
                vec![(gpa + 0x7000_0000_0000, size)],
                Box::new(()) as Release,
            )
        })
    }
}

fuzz_target!(|data: &[u8]| {
    let iommu = Iommu::new();
    let s = DeviceSettings {
        domain: DomainConfig {
            max_pages: 1 << 16,
            max_table_pages: 256,
            ..DomainConfig::default()
        },
        ..DeviceSettings::default()
    };
    let mut dev = VirtioIommu::new(&iommu, s);
    for id in 0..4u32 {
        let d = Arc::new(
            Domain::new(&iommu, id, DomainConfig::default()).expect("a domain without a budget"),
        );
        let resv = vec![ResvMem {
            subtype: 1,
            start: 0xfee0_0000,
            end: 0xfeef_ffff,
        }];
        dev.add_endpoint(Arc::new(Endpoint::new(id, d)), resv)
            .expect("endpoint");
    }
    // Frames: [kind u8][writable u16le][len u8][readable bytes...].
    let mut at = 0usize;
    while at + 4 <= data.len() {
        let kind = data[at];
        let wlen = u16::from_le_bytes([data[at + 1], data[at + 2]]) as usize % 1024;
        let len = data[at + 3] as usize;
        at += 4;
        let end = (at + len).min(data.len());
        let readable = &data[at..end];
        at = end;
        if kind == 0xc5 {
            // A config write.
            let _ = dev.write_config(wlen % 48, readable);
            continue;
        }
        let mut w = vec![0x5au8; wlen];
        let used = dev.handle(readable, &mut w, &Mem);
        assert!(used <= w.len());
        if used == 0 {
            assert!(w.iter().all(|&b| b == 0x5a), "unwritten buffers untouched");
        } else {
            assert!(used >= REQ_TAIL_LEN);
            assert!(parse_tail(&w[..used]).is_some(), "a valid status");
        }
        // Whatever decodes re-encodes to the same request.
        if let Ok(r) = Request::decode(readable) {
            assert_eq!(Request::decode(&r.encode()), Ok(r));
        }
    }
    assert!(dev.domain_count() <= wd_iommu::virtio::MAX_DOMAINS);
});
