//! virtio-iommu conformance: every device rule of the specification's IOMMU
//! device section (virtio v1.2 §5.13) this device implements, the UNMAP
//! examples of §5.13.6.6, and a model test of MAP/UNMAP sequences (UNMAP is
//! all or nothing).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use proptest::prelude::*;
use wd_iommu::virtio::*;
use wd_iommu::{
    Access, Attachment, Domain, DomainConfig, Endpoint, EngineTlb, Fault, FaultReason,
    InvalidationMode, Iommu, Prot, Release, BLOCK_2M, IOVA_LIMIT, PAGE_SIZE,
};

const P: u64 = PAGE_SIZE;
/// Guest memory: [GPA, GPA + GUEST_SIZE) at host GPA + HOST_OFFSET.
const GPA: u64 = 0x10_0000_0000;
const GUEST_SIZE: u64 = 1 << 30;
const HOST_OFFSET: u64 = 0x4000_0000_0000;

/// Identity-plus-offset guest memory; counts live pins.
#[derive(Default)]
struct Mem {
    pins: Arc<AtomicUsize>,
}

struct Pin(Arc<AtomicUsize>);
impl Drop for Pin {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl GuestMemory for Mem {
    fn resolve(&self, gpa: u64, size: u64, prot: Prot) -> Option<(Vec<(u64, u64)>, Release)> {
        if gpa < GPA || gpa.checked_add(size)? > GPA + GUEST_SIZE {
            return None;
        }
        // The last 64 KiB of guest memory is read-only.
        if prot.contains(Prot::WRITE) && gpa + size > GPA + GUEST_SIZE - 0x10000 {
            return None;
        }
        self.pins.fetch_add(1, Ordering::SeqCst);
        // Two runs when the range crosses the middle: a scatter list.
        let mid = GPA + GUEST_SIZE / 2;
        let runs = if gpa < mid && gpa + size > mid {
            vec![
                (gpa + HOST_OFFSET, mid - gpa),
                (mid + HOST_OFFSET, gpa + size - mid),
            ]
        } else {
            vec![(gpa + HOST_OFFSET, size)]
        };
        Some((runs, Box::new(Pin(self.pins.clone()))))
    }
}

struct Dev {
    iommu: Arc<Iommu>,
    dev: VirtioIommu,
    mem: Mem,
    eps: Vec<Arc<Endpoint>>,
}

const RESV_MSI: ResvMem = ResvMem {
    subtype: VIRTIO_IOMMU_RESV_MEM_T_MSI,
    start: 0xfee0_0000,
    end: 0xfeef_ffff,
};
const RESV_LOW: ResvMem = ResvMem {
    subtype: VIRTIO_IOMMU_RESV_MEM_T_RESERVED,
    start: 0,
    end: 0xffff,
};

fn dev_with(s: DeviceSettings) -> Dev {
    let iommu = Iommu::new();
    let mut dev = VirtioIommu::new(&iommu, s);
    let mut eps = Vec::new();
    for id in 1..=3u32 {
        let d = Arc::new(Domain::new(&iommu, id, DomainConfig::default()).unwrap());
        let ep = Arc::new(Endpoint::new(id, d));
        let resv = if id == 2 {
            vec![RESV_LOW, RESV_MSI]
        } else {
            vec![]
        };
        dev.add_endpoint(ep.clone(), resv).unwrap();
        eps.push(ep);
    }
    Dev {
        iommu,
        dev,
        mem: Mem::default(),
        eps,
    }
}

fn dev() -> Dev {
    dev_with(DeviceSettings::default())
}

impl Dev {
    fn raw(&mut self, readable: &[u8], writable_len: usize) -> (usize, Vec<u8>) {
        let mut w = vec![0xaa; writable_len];
        let used = self.dev.handle(readable, &mut w, &self.mem);
        (used, w)
    }

    fn req(&mut self, r: Request) -> Status {
        let (used, w) = self.raw(&r.encode(), r.writable_len(PROBE_SIZE));
        assert!(used >= REQ_TAIL_LEN, "{r:?} answered");
        assert_eq!(&w[used - 3..used], &[0, 0, 0], "tail reserved zeroed");
        parse_tail(&w[..used]).expect("a status")
    }

    fn attach(&mut self, domain: u32, endpoint: u32) -> Status {
        self.req(Request::Attach {
            domain,
            endpoint,
            flags: 0,
            reserved: [0; 4],
        })
    }

    fn map(&mut self, domain: u32, start: u64, end: u64, phys: u64, flags: u32) -> Status {
        self.req(Request::Map {
            domain,
            virt_start: start,
            virt_end: end,
            phys_start: phys,
            flags,
        })
    }

    fn unmap(&mut self, domain: u32, start: u64, end: u64) -> Status {
        self.req(Request::Unmap {
            domain,
            virt_start: start,
            virt_end: end,
            reserved: [0; 4],
        })
    }

    fn pins(&self) -> usize {
        self.mem.pins.load(Ordering::SeqCst)
    }

    /// What endpoint `id` reads at `iova` (through an engine's IOTLB).
    fn read(&self, id: u32, iova: u64) -> Result<u64, FaultReason> {
        let ep = &self.eps[id as usize - 1];
        let mut e = EngineTlb::new(&self.iommu);
        let mut s = e.enter();
        match ep.attachment() {
            Attachment::Blocked => Err(FaultReason::NoDomain),
            Attachment::Domain(d) => s
                .translate(&d, id, iova, Access::Read)
                .map_err(|f| f.reason),
        }
    }
}

const RW: u32 = VIRTIO_IOMMU_MAP_F_READ | VIRTIO_IOMMU_MAP_F_WRITE;

#[test]
fn config_layout_and_features() {
    let d = dev();
    let c = d.dev.config_bytes();
    assert_eq!(c.len(), 40);
    let u64_at = |o: usize| u64::from_le_bytes(c[o..o + 8].try_into().unwrap());
    let u32_at = |o: usize| u32::from_le_bytes(c[o..o + 4].try_into().unwrap());
    assert_eq!(
        u64_at(0),
        0x1000 | 0x20_0000 | 0x4000_0000,
        "page_size_mask"
    );
    assert_eq!((u64_at(8), u64_at(16)), (0, IOVA_LIMIT - 1), "input_range");
    assert_eq!((u32_at(24), u32_at(28)), (0, DOMAIN_ID_MAX), "domain_range");
    assert_eq!(u32_at(32), PROBE_SIZE, "probe_size");
    assert_eq!(c[36], 1, "bypass");
    assert_eq!(&c[37..40], &[0, 0, 0], "reserved");
    let f = d.dev.features();
    for bit in [
        VIRTIO_IOMMU_F_INPUT_RANGE,
        VIRTIO_IOMMU_F_DOMAIN_RANGE,
        VIRTIO_IOMMU_F_MAP_UNMAP,
        VIRTIO_IOMMU_F_PROBE,
        VIRTIO_IOMMU_F_BYPASS_CONFIG,
    ] {
        assert_ne!(f & (1 << bit), 0, "offers bit {bit}");
    }
    // BYPASS is superseded by BYPASS_CONFIG and not offered with it.
    assert_eq!(f & (1 << VIRTIO_IOMMU_F_BYPASS), 0);
    assert_eq!(f & (1 << VIRTIO_IOMMU_F_MMIO), 0);
    assert_eq!(
        (VIRTIO_ID_IOMMU, REQUESTQ, EVENTQ),
        (23, 0, 1),
        "device id, virtqueues"
    );
}

#[test]
fn bypass_config_write() {
    let mut d = dev();
    // Unattached endpoints bypass: they use their default domain.
    assert!(
        matches!(d.eps[0].attachment(), Attachment::Domain(ref x) if Arc::ptr_eq(x, d.eps[0].default_domain()))
    );
    assert!(d.dev.write_config(CONFIG_BYPASS, &[2]).is_err());
    assert!(d.dev.write_config(0, &[0]).is_err());
    assert!(d.dev.write_config(CONFIG_BYPASS, &[0, 0]).is_err());
    d.dev.write_config(CONFIG_BYPASS, &[0]).unwrap();
    assert_eq!(d.dev.config_bytes()[CONFIG_BYPASS], 0);
    assert_eq!(d.read(1, 0x1000), Err(FaultReason::NoDomain));
    d.dev.write_config(CONFIG_BYPASS, &[1]).unwrap();
    assert!(matches!(d.eps[0].attachment(), Attachment::Domain(_)));
    // Without the feature nothing is writable.
    let mut s = DeviceSettings::default();
    s.features &= !(1 << VIRTIO_IOMMU_F_BYPASS_CONFIG);
    let mut d = dev_with(s);
    assert!(d.dev.write_config(CONFIG_BYPASS, &[0]).is_err());
}

#[test]
fn unmap_examples_of_the_specification() {
    // §5.13.6.6, with the example's addresses counted in pages (the page
    // granularity here is 4 KiB): map(a, b) covers pages a..=b.
    let pages = |a: u64, b: u64| (a * P, (b + 1) * P - 1);
    let run = |maps: &[(u64, u64)], unmap: (u64, u64)| -> (Status, Vec<(u64, u64)>) {
        let mut d = dev();
        assert_eq!(d.attach(1, 1), Status::Ok);
        for &(a, b) in maps {
            let (s, e) = pages(a, b);
            assert_eq!(d.map(1, s, e, GPA + s, RW), Status::Ok);
        }
        let (s, e) = pages(unmap.0, unmap.1);
        let st = d.unmap(1, s, e);
        (st, d.dev.mappings(1))
    };
    // (1) unmap(0, 4) on nothing: succeeds, unmaps nothing.
    assert_eq!(run(&[], (0, 4)), (Status::Ok, vec![]));
    // (2) a = map(0, 9); unmap(0, 9): unmaps a.
    assert_eq!(run(&[(0, 9)], (0, 9)), (Status::Ok, vec![]));
    // (3) a = map(0, 4); b = map(5, 9); unmap(0, 9): unmaps a and b.
    assert_eq!(run(&[(0, 4), (5, 9)], (0, 9)), (Status::Ok, vec![]));
    // (4) a = map(0, 9); unmap(0, 4): fails, unmaps nothing.
    assert_eq!(run(&[(0, 9)], (0, 4)), (Status::Range, vec![pages(0, 9)]));
    // (5) a = map(0, 4); b = map(5, 9); unmap(0, 4): unmaps a.
    assert_eq!(
        run(&[(0, 4), (5, 9)], (0, 4)),
        (Status::Ok, vec![pages(5, 9)])
    );
    // (6) a = map(0, 4); unmap(0, 9): unmaps a.
    assert_eq!(run(&[(0, 4)], (0, 9)), (Status::Ok, vec![]));
    // (7) a = map(0, 4); b = map(10, 14); unmap(0, 14): unmaps a and b.
    assert_eq!(run(&[(0, 4), (10, 14)], (0, 14)), (Status::Ok, vec![]));
}

#[test]
fn buffers_the_device_cannot_answer_stay_untouched() {
    let mut d = dev();
    // Unknown request types (§5.13.6.2): not written, used length 0.
    for ty in [0u8, 6, 0x7f, 0xff] {
        let mut r = vec![ty, 0, 0, 0];
        r.extend_from_slice(&[0; 40]);
        let (used, w) = d.raw(&r, 8);
        assert_eq!(used, 0);
        assert_eq!(w, vec![0xaa; 8], "type {ty} left the buffer alone");
    }
    // No head, or no room for the tail.
    assert_eq!(d.raw(&[VIRTIO_IOMMU_T_MAP, 0], 4), (0, vec![0xaa; 4]));
    let map = Request::Map {
        domain: 1,
        virt_start: 0,
        virt_end: P - 1,
        phys_start: GPA,
        flags: RW,
    };
    assert_eq!(d.raw(&map.encode(), 3), (0, vec![0xaa; 3]));
    // Too short for its type, tail findable: a communication error.
    let (used, w) = d.raw(&map.encode()[..20], 4);
    assert_eq!((used, parse_tail(&w[..used])), (4, Some(Status::IoErr)));
    // Head reserved bytes are ignored by the device.
    assert_eq!(d.attach(1, 1), Status::Ok);
    let mut r = map.encode();
    r[1..4].copy_from_slice(&[9, 9, 9]);
    let (used, w) = d.raw(&r, 4);
    assert_eq!(parse_tail(&w[..used]), Some(Status::Ok));
    let s = d.dev.stats();
    assert_eq!((s.unwritten, s.failed), (6, 1));
}

#[test]
fn attach_rules() {
    let mut d = dev();
    let attach = |d: &mut Dev, domain, endpoint, flags, reserved| {
        d.req(Request::Attach {
            domain,
            endpoint,
            flags,
            reserved,
        })
    };
    assert_eq!(
        attach(&mut d, 1, 1, 0, [0, 0, 1, 0]),
        Status::Inval,
        "reserved"
    );
    assert_eq!(
        attach(&mut d, 1, 1, 2, [0; 4]),
        Status::Inval,
        "unknown flag"
    );
    assert_eq!(attach(&mut d, 1, 99, 0, [0; 4]), Status::NoEnt, "endpoint");
    assert_eq!(
        attach(&mut d, DOMAIN_ID_MAX + 1, 1, 0, [0; 4]),
        Status::Range,
        "domain_range"
    );
    assert_eq!(d.dev.domain_count(), 0, "failed ATTACHes create nothing");
    assert_eq!(attach(&mut d, 7, 1, 0, [0; 4]), Status::Ok);
    assert_eq!(attach(&mut d, 7, 1, 0, [0; 4]), Status::Ok, "again: no-op");
    assert_eq!(
        attach(&mut d, 7, 2, VIRTIO_IOMMU_ATTACH_F_BYPASS, [0; 4]),
        Status::Inval,
        "bypass flag inconsistent with the domain"
    );
    // Two endpoints share a domain: both see its mappings.
    assert_eq!(attach(&mut d, 7, 2, 0, [0; 4]), Status::Ok);
    assert_eq!(d.map(7, 0x10_0000, 0x10_ffff, GPA, RW), Status::Ok);
    assert_eq!(d.read(1, 0x10_0008), Ok(GPA + HOST_OFFSET + 8));
    assert_eq!(d.read(2, 0x10_0008), Ok(GPA + HOST_OFFSET + 8));
    assert_eq!(d.read(3, 0x10_0008), Err(FaultReason::Unmapped), "isolated");
    // Attaching an attached endpoint moves it.
    assert_eq!(attach(&mut d, 8, 1, 0, [0; 4]), Status::Ok);
    assert_eq!(d.dev.endpoint_domain(1), Some(8));
    assert_eq!(d.read(1, 0x10_0008), Err(FaultReason::Unmapped));
    assert_eq!(d.read(2, 0x10_0008), Ok(GPA + HOST_OFFSET + 8));
    // Moving the last endpoint away makes the domain disappear, with its
    // mappings and what they pinned.
    assert_eq!(d.pins(), 1);
    assert_eq!(attach(&mut d, 8, 2, 0, [0; 4]), Status::Ok);
    assert_eq!(d.dev.domain(7).map(|_| ()), None);
    assert_eq!(d.pins(), 0);
    assert_eq!(d.map(7, 0, P - 1, GPA, RW), Status::NoEnt);
    // A bypass domain: endpoints translate through their default domain,
    // and MAP/UNMAP on it are invalid.
    assert_eq!(
        attach(&mut d, 9, 3, VIRTIO_IOMMU_ATTACH_F_BYPASS, [0; 4]),
        Status::Ok
    );
    assert!(
        matches!(d.eps[2].attachment(), Attachment::Domain(ref x) if Arc::ptr_eq(x, d.eps[2].default_domain()))
    );
    assert_eq!(d.map(9, 0, P - 1, GPA, RW), Status::Inval);
    assert_eq!(d.unmap(9, 0, P - 1), Status::Inval);
}

#[test]
fn detach_rules() {
    let mut d = dev();
    let detach = |d: &mut Dev, domain, endpoint| d.req(Request::Detach { domain, endpoint });
    assert_eq!(d.attach(4, 1), Status::Ok);
    assert_eq!(d.attach(4, 2), Status::Ok);
    assert_eq!(d.map(4, 0x20_0000, 0x3f_ffff, GPA, RW), Status::Ok);
    assert_eq!(detach(&mut d, 4, 99), Status::NoEnt);
    assert_eq!(detach(&mut d, 5, 1), Status::Inval, "no such domain");
    assert_eq!(detach(&mut d, 4, 3), Status::Inval, "not attached to it");
    // Reserved bytes are ignored on DETACH.
    let mut r = Request::Detach {
        domain: 4,
        endpoint: 1,
    }
    .encode();
    r[12..20].copy_from_slice(&[1; 8]);
    let (used, w) = d.raw(&r, 4);
    assert_eq!(parse_tail(&w[..used]), Some(Status::Ok));
    // Detached with bypass on: back to the default domain.
    assert!(
        matches!(d.eps[0].attachment(), Attachment::Domain(ref x) if Arc::ptr_eq(x, d.eps[0].default_domain()))
    );
    assert_eq!(d.read(1, 0x20_0000), Err(FaultReason::Unmapped));
    assert_eq!(d.dev.domain_count(), 1);
    // The last endpoint leaves: the domain ceases to exist, pins released.
    d.dev.write_config(CONFIG_BYPASS, &[0]).unwrap();
    assert_eq!(detach(&mut d, 4, 2), Status::Ok);
    assert_eq!(d.dev.domain_count(), 0);
    assert_eq!(d.pins(), 0);
    assert_eq!(d.read(2, 0x20_0000), Err(FaultReason::NoDomain), "blocked");
    // Its ID can be reused, for a fresh empty domain.
    assert_eq!(d.attach(4, 2), Status::Ok);
    assert_eq!(d.read(2, 0x20_0000), Err(FaultReason::Unmapped));
}

#[test]
fn map_rules() {
    let mut d = dev();
    assert_eq!(d.attach(1, 1), Status::Ok);
    assert_eq!(d.attach(2, 2), Status::Ok);
    assert_eq!(
        d.map(1, 0, P - 1, GPA, VIRTIO_IOMMU_MAP_F_MMIO),
        Status::Inval,
        "MMIO without the feature is an unknown flag"
    );
    assert_eq!(d.map(1, 0, P - 1, GPA, 1 << 3), Status::Inval);
    assert_eq!(d.map(3, 0, P - 1, GPA, RW), Status::NoEnt);
    assert_eq!(d.map(1, 1, P - 1, GPA, RW), Status::Range, "virt_start");
    assert_eq!(d.map(1, 0, P - 1, GPA + 1, RW), Status::Range, "phys_start");
    assert_eq!(d.map(1, 0, P, GPA, RW), Status::Range, "virt_end + 1");
    assert_eq!(
        d.map(1, 2 * P, P - 1, GPA, RW),
        Status::Inval,
        "end < start"
    );
    assert_eq!(
        d.map(1, IOVA_LIMIT, IOVA_LIMIT + P - 1, GPA, RW),
        Status::Range,
        "input_range"
    );
    assert_eq!(
        d.map(1, 0, u64::MAX, GPA, RW),
        Status::Range,
        "the whole 64-bit space"
    );
    assert_eq!(
        d.map(1, 0, P - 1, u64::MAX - P + 1, RW),
        Status::Fault,
        "not guest memory"
    );
    assert_eq!(d.map(1, 0, P - 1, 0, RW), Status::Fault);
    let ro = GPA + GUEST_SIZE - P;
    assert_eq!(
        d.map(1, 0, P - 1, ro, RW),
        Status::Fault,
        "read-only memory"
    );
    assert_eq!(d.map(1, 0, P - 1, ro, VIRTIO_IOMMU_MAP_F_READ), Status::Ok);
    assert_eq!(d.unmap(1, 0, P - 1), Status::Ok);
    // Endpoint 2 reserves [0, 0xffff] and an MSI doorbell.
    assert_eq!(
        d.map(2, 0xf000, 0x1_ffff, GPA, RW),
        Status::Range,
        "RESV_MEM"
    );
    assert_eq!(
        d.map(2, 0xfee0_0000, 0xfee0_0fff, GPA, RW),
        Status::Range,
        "MSI"
    );
    assert_eq!(d.map(2, 0x1_0000, 0x1_ffff, GPA, RW), Status::Ok);
    // Overlap is INVAL and changes nothing.
    assert_eq!(d.map(1, 0x40_0000, 0x7f_ffff, GPA, RW), Status::Ok);
    assert_eq!(
        d.map(1, 0x3f_f000, 0x40_0fff, GPA + BLOCK_2M, RW),
        Status::Inval
    );
    assert_eq!(d.map(1, 0x7f_f000, 0x80_0fff, GPA, RW), Status::Inval);
    assert_eq!(d.dev.mappings(1), vec![(0x40_0000, 0x7f_ffff)]);
    // Permissions follow the flags; a map with no flag is a mapping that
    // faults on every access.
    assert_eq!(d.read(1, 0x40_0000), Ok(GPA + HOST_OFFSET));
    assert_eq!(
        d.map(1, 0x10_0000, 0x10_0fff, GPA, VIRTIO_IOMMU_MAP_F_WRITE),
        Status::Ok
    );
    assert_eq!(d.read(1, 0x10_0000), Err(FaultReason::Permission));
    assert_eq!(d.map(1, 0x20_0000, 0x20_0fff, GPA, 0), Status::Ok);
    assert_eq!(d.read(1, 0x20_0000), Err(FaultReason::Permission));
    // 2 MiB aligned on both sides: blocks.
    let dom = d.dev.domain(1).unwrap().clone();
    assert_eq!(dom.leaf_counts().1, 2);
    // A scatter list from guest memory (the mock splits at its middle).
    let mid = GPA + GUEST_SIZE / 2;
    assert_eq!(d.map(1, 0x100_0000, 0x100_1fff, mid - P, RW), Status::Ok);
    assert_eq!(d.read(1, 0x100_1000), Ok(mid + HOST_OFFSET));
    // With MMIO offered, the flag is accepted.
    let mut s = DeviceSettings::default();
    s.features |= 1 << VIRTIO_IOMMU_F_MMIO;
    let mut d = dev_with(s);
    assert_eq!(d.attach(1, 1), Status::Ok);
    assert_eq!(
        d.map(1, 0, P - 1, GPA, RW | VIRTIO_IOMMU_MAP_F_MMIO),
        Status::Ok
    );
}

#[test]
fn limits_are_nomem() {
    // Domains: fill the table with single-endpoint domains.
    let iommu = Iommu::new();
    let mut vd = VirtioIommu::new(&iommu, DeviceSettings::default());
    let mem = Mem::default();
    for id in 0..=MAX_DOMAINS as u32 {
        let dom = Arc::new(Domain::new(&iommu, id, DomainConfig::default()).unwrap());
        vd.add_endpoint(Arc::new(Endpoint::new(id, dom)), vec![])
            .unwrap();
    }
    let attach = |dev: &mut VirtioIommu, domain: u32, endpoint: u32| {
        let r = Request::Attach {
            domain,
            endpoint,
            flags: 0,
            reserved: [0; 4],
        };
        let mut w = [0u8; 4];
        dev.handle(&r.encode(), &mut w, &mem);
        Status::from_u8(w[0]).unwrap()
    };
    for id in 0..MAX_DOMAINS as u32 {
        assert_eq!(attach(&mut vd, id, id), Status::Ok);
    }
    assert_eq!(
        attach(&mut vd, MAX_DOMAINS as u32, MAX_DOMAINS as u32),
        Status::NoMem
    );
    // Moving a domain's only endpoint to a new domain frees its slot.
    assert_eq!(attach(&mut vd, 500, 0), Status::Ok);
    assert_eq!(vd.domain_count(), MAX_DOMAINS);
    drop(vd);
    // Mappings per domain.
    let mut d = dev();
    assert_eq!(d.attach(1, 1), Status::Ok);
    for k in 0..MAX_MAPPINGS as u64 {
        assert_eq!(d.map(1, k * P, k * P + P - 1, GPA, RW), Status::Ok);
    }
    let k = MAX_MAPPINGS as u64;
    assert_eq!(d.map(1, k * P, k * P + P - 1, GPA, RW), Status::NoMem);
    assert_eq!(d.pins(), MAX_MAPPINGS);
    assert_eq!(d.unmap(1, 0, u64::MAX), Status::Ok);
    assert_eq!(d.pins(), 0);
    // Pages per domain.
    let mut s = DeviceSettings::default();
    s.domain.max_pages = 16;
    let mut d = dev_with(s);
    assert_eq!(d.attach(1, 1), Status::Ok);
    assert_eq!(d.map(1, 0, 16 * P - 1, GPA, RW), Status::Ok);
    assert_eq!(d.map(1, 16 * P, 17 * P - 1, GPA, RW), Status::NoMem);
    assert_eq!(d.pins(), 1, "a refused MAP pins nothing");
}

#[test]
fn unmap_rules() {
    let mut d = dev();
    assert_eq!(d.attach(1, 1), Status::Ok);
    assert_eq!(d.map(1, 0x10_0000, 0x10_3fff, GPA, RW), Status::Ok);
    assert_eq!(
        d.req(Request::Unmap {
            domain: 1,
            virt_start: 0x10_0000,
            virt_end: 0x10_3fff,
            reserved: [0, 1, 0, 0],
        }),
        Status::Inval
    );
    assert_eq!(d.dev.mappings(1).len(), 1, "reserved: nothing unmapped");
    assert_eq!(d.unmap(2, 0, P - 1), Status::NoEnt);
    assert_eq!(d.unmap(1, 0x10_0001, 0x10_3fff), Status::Range, "start");
    assert_eq!(d.unmap(1, 0x10_0000, 0x10_3ffe), Status::Range, "end + 1");
    assert_eq!(
        d.unmap(1, 0x10_4000, 0x10_0fff),
        Status::Inval,
        "end < start"
    );
    // Splitting is RANGE and atomic.
    assert_eq!(d.unmap(1, 0x10_1000, 0x10_1fff), Status::Range);
    assert_eq!(d.unmap(1, 0, 0x10_1fff), Status::Range);
    assert_eq!(d.unmap(1, 0x10_2000, 0xffff_ffff), Status::Range);
    assert_eq!(d.read(1, 0x10_2000), Ok(GPA + HOST_OFFSET + 0x2000));
    assert_eq!(d.pins(), 1);
    // The whole mapping, spilling over unmapped space.
    assert_eq!(d.unmap(1, 0, 0xffff_ffff), Status::Ok);
    assert_eq!(d.read(1, 0x10_2000), Err(FaultReason::Unmapped));
    assert_eq!(d.pins(), 0, "strict: released before the answer");
    assert_eq!(d.unmap(1, 0, 0xffff_ffff), Status::Ok, "nothing left");
}

#[test]
fn deferred_domains_release_at_the_flush() {
    let mut d = dev();
    d.eps[0]
        .default_domain()
        .set_mode(InvalidationMode::Deferred);
    assert_eq!(d.attach(1, 1), Status::Ok);
    let dom = d.dev.domain(1).unwrap().clone();
    assert_eq!(dom.mode(), InvalidationMode::Deferred, "inherited");
    assert_eq!(d.map(1, 0, P - 1, GPA, RW), Status::Ok);
    let c = dom.flush_counter();
    assert_eq!(d.unmap(1, 0, P - 1), Status::Ok);
    assert_eq!(d.pins(), 1, "held by the flush queue");
    dom.flush_iotlb_all();
    assert!(dom.flush_counter() > c);
    assert_eq!(d.pins(), 0);
}

#[test]
fn probe_rules() {
    let mut d = dev();
    let probe = |d: &mut Dev, endpoint: u32, props: usize| {
        d.raw(&Request::Probe { endpoint }.encode(), props + REQ_TAIL_LEN)
    };
    let (used, w) = probe(&mut d, 2, PROBE_SIZE as usize);
    assert_eq!(used, PROBE_SIZE as usize + 4);
    assert_eq!(parse_tail(&w[..used]), Some(Status::Ok));
    let props = &w[..PROBE_SIZE as usize];
    assert_eq!(parse_probe(props), vec![RESV_LOW, RESV_MSI]);
    // Layout: type 1 with reserved bits 0, length 20, subtype, 3 reserved.
    assert_eq!(&props[0..8], &[1, 0, 20, 0, 0, 0, 0, 0]);
    assert_eq!(&props[24..28], &[1, 0, 20, 0]);
    assert!(props[48..].iter().all(|&b| b == 0), "the rest zeroed");
    // No properties: all zero.
    let (used, w) = probe(&mut d, 1, PROBE_SIZE as usize);
    assert!(w[..used - 4].iter().all(|&b| b == 0));
    // Unknown endpoint.
    let (used, w) = probe(&mut d, 77, PROBE_SIZE as usize);
    assert_eq!(parse_tail(&w[..used]), Some(Status::NoEnt));
    // Too small a properties buffer: INVAL, no property written.
    let (used, w) = probe(&mut d, 2, PROBE_SIZE as usize - 1);
    assert_eq!(parse_tail(&w[..used]), Some(Status::Inval));
    assert!(w[..used - 4].iter().all(|&b| b == 0xaa));
    // Reserved bytes of the request are ignored.
    let mut r = Request::Probe { endpoint: 2 }.encode();
    r[8..72].fill(0x55);
    let (used, w) = d.raw(&r, PROBE_SIZE as usize + 4);
    assert_eq!(parse_tail(&w[..used]), Some(Status::Ok));
    // Without the feature: not written, used length 0.
    let mut s = DeviceSettings::default();
    s.features &= !(1 << VIRTIO_IOMMU_F_PROBE);
    let mut d = dev_with(s);
    let (used, w) = probe(&mut d, 2, PROBE_SIZE as usize);
    assert_eq!(used, 0);
    assert!(w.iter().all(|&b| b == 0xaa));
}

#[test]
fn fault_records() {
    let f = Fault {
        iova: 0xdead_b000,
        pasid: 7,
        access: Access::Write,
        reason: FaultReason::Permission,
    };
    let r = fault_record(&f);
    assert_eq!(r.len(), FAULT_LEN);
    assert_eq!(r[0], VIRTIO_IOMMU_FAULT_R_MAPPING);
    assert_eq!(&r[1..4], &[0, 0, 0]);
    assert_eq!(u32::from_le_bytes(r[4..8].try_into().unwrap()), 0x102);
    assert_eq!(u32::from_le_bytes(r[12..16].try_into().unwrap()), 0);
    assert_eq!(
        FaultEvent::decode(&r),
        Some(FaultEvent {
            reason: VIRTIO_IOMMU_FAULT_R_MAPPING,
            flags: VIRTIO_IOMMU_FAULT_F_WRITE | VIRTIO_IOMMU_FAULT_F_ADDRESS,
            endpoint: 7,
            address: Some(0xdead_b000),
        })
    );
    let blocked = fault_record(&Fault {
        reason: FaultReason::NoDomain,
        access: Access::Read,
        ..f
    });
    assert_eq!(blocked[0], VIRTIO_IOMMU_FAULT_R_DOMAIN);
    assert_eq!(blocked[4], 1);
    let mut bad = r;
    bad[2] = 1;
    assert_eq!(FaultEvent::decode(&bad), None, "reserved set: ignored");
}

#[test]
fn a_kick_gathers_its_unmaps() {
    let mut d = dev();
    assert_eq!(d.attach(1, 1), Status::Ok);
    for k in 0..8u64 {
        assert_eq!(
            d.map(1, k * 0x10000, k * 0x10000 + 0xffff, GPA, RW),
            Status::Ok
        );
    }
    let unmap = |k: u64| Buffer {
        readable: Request::Unmap {
            domain: 1,
            virt_start: k * 0x10000,
            virt_end: k * 0x10000 + 0xffff,
            reserved: [0; 4],
        }
        .encode(),
        writable: vec![0; 4],
        used: 0,
    };
    let mut bufs: Vec<Buffer> = (0..6).map(unmap).collect();
    // A MAP of a just-unmapped range in the same kick sees it gone.
    bufs.push(Buffer {
        readable: Request::Map {
            domain: 1,
            virt_start: 0,
            virt_end: 0xffff,
            phys_start: GPA + BLOCK_2M,
            flags: RW,
        }
        .encode(),
        writable: vec![0; 4],
        used: 0,
    });
    let before = d.iommu.stats();
    d.dev.kick(&mut bufs, &d.mem);
    let after = d.iommu.stats();
    assert!(bufs
        .iter()
        .all(|b| parse_tail(&b.writable[..b.used]) == Some(Status::Ok)));
    assert_eq!(after.syncs - before.syncs, 1, "one sync for six UNMAPs");
    assert_eq!(after.commands - before.commands, 2, "one range + one sync");
    assert_eq!(d.read(1, 0x10), Ok(GPA + BLOCK_2M + HOST_OFFSET + 0x10));
    assert_eq!(d.read(1, 0x1_0010), Err(FaultReason::Unmapped));
    assert_eq!(d.pins(), 3);
}

#[test]
fn removed_endpoints_take_their_domains() {
    let mut d = dev();
    assert_eq!(d.attach(1, 1), Status::Ok);
    assert_eq!(d.map(1, 0, P - 1, GPA, RW), Status::Ok);
    d.dev.remove_endpoint(1);
    assert_eq!(d.dev.domain_count(), 0);
    assert_eq!(d.pins(), 0);
    assert_eq!(d.attach(1, 1), Status::NoEnt);
    assert!(d.dev.add_endpoint(d.eps[1].clone(), vec![]).is_err());
    drop(d.dev);
}

// ---------------------------------------------------------------- model

#[derive(Clone, Debug)]
enum VOp {
    Map { start: u64, pages: u64 },
    Unmap { start: u64, pages: u64 },
}

fn vop() -> impl Strategy<Value = VOp> {
    prop_oneof![
        (0..64u64, 1..8u64).prop_map(|(start, pages)| VOp::Map { start, pages }),
        (0..64u64, 1..16u64).prop_map(|(start, pages)| VOp::Unmap { start, pages }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// MAP/UNMAP against an interval map of mappings: overlapping MAP is
    /// INVAL, UNMAP that would split is RANGE and changes nothing, every
    /// other UNMAP removes exactly the mappings inside, and translation
    /// follows the model page by page.
    #[test]
    fn unmap_is_all_or_nothing(ops in proptest::collection::vec(vop(), 1..40)) {
        let mut d = dev();
        prop_assert_eq!(d.attach(1, 1), Status::Ok);
        let mut m: BTreeMap<u64, u64> = BTreeMap::new(); // first page -> last page
        for op in ops {
            match op {
                VOp::Map { start, pages } => {
                    let end = start + pages - 1;
                    let free = m.iter().all(|(&s, &e)| e < start || s > end);
                    let st = d.map(1, start * P, (end + 1) * P - 1, GPA + start * P, RW);
                    prop_assert_eq!(st, if free { Status::Ok } else { Status::Inval });
                    if free { m.insert(start, end); }
                }
                VOp::Unmap { start, pages } => {
                    let end = start + pages - 1;
                    let split = m.iter().any(|(&s, &e)| s <= end && e >= start && (s < start || e > end));
                    let st = d.unmap(1, start * P, (end + 1) * P - 1);
                    if split {
                        prop_assert_eq!(st, Status::Range);
                    } else {
                        prop_assert_eq!(st, Status::Ok);
                        m.retain(|&s, _| s < start || s > end);
                    }
                }
            }
            let want: Vec<(u64, u64)> = m.iter().map(|(&s, &e)| (s * P, (e + 1) * P - 1)).collect();
            prop_assert_eq!(d.dev.mappings(1), want);
            prop_assert_eq!(d.pins(), m.len());
            for page in 0..72u64 {
                let mapped = m.iter().any(|(&s, &e)| s <= page && page <= e);
                let got = d.read(1, page * P + 8);
                if mapped {
                    prop_assert_eq!(got, Ok(GPA + HOST_OFFSET + page * P + 8));
                } else {
                    prop_assert_eq!(got, Err(FaultReason::Unmapped));
                }
            }
        }
    }
}

/// At the table budget's edge, a move that ends the endpoint's domain
/// frees the root the new one needs; while a device holds the old domain
/// (a translation in flight) its root does not come back, and the move is
/// refused with everything left as it was (the endpoint was left
/// detached and its domain destroyed).
#[test]
fn a_move_at_the_table_budget_edge() {
    // What one domain's root takes.
    let probe = wd_iommu::TableBudget::new(1 << 30);
    let root = {
        let iommu = Iommu::new();
        let cfg = DomainConfig {
            table_budget: Some(probe.clone()),
            ..DomainConfig::default()
        };
        let d = Domain::new(&iommu, 99, cfg).unwrap();
        let pages = probe.used();
        drop(d);
        pages
    };
    let mut s = DeviceSettings::default();
    s.domain.table_budget = Some(wd_iommu::TableBudget::new(root));
    let mut d = dev_with(s);
    assert_eq!(d.attach(1, 1), Status::Ok);
    let held = d.dev.domain(1).unwrap().clone();
    assert_eq!(d.attach(2, 1), Status::NoMem, "the old root is held");
    assert_eq!(d.dev.endpoint_domain(1), Some(1));
    assert!(d.dev.domain(1).is_some());
    drop(held);
    assert_eq!(d.attach(2, 1), Status::Ok, "then the move frees it");
    assert_eq!(d.dev.endpoint_domain(1), Some(2));
    assert!(d.dev.domain(1).is_none());
}
