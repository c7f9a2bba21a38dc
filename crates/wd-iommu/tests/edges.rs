//! wd-iommu at its edges: a map refused for table pages, a range past the
//! IOVA space, a gather synced on another domain.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use wd_iommu::{
    Access, Domain, DomainConfig, EngineTlb, FaultReason, Iommu, IotlbGather, Prot, BLOCK_1G,
    BLOCK_2M, IOVA_LIMIT, PAGE_SIZE,
};

const P: u64 = PAGE_SIZE;

/// A map refused for want of table pages (the domain's limit, or its
/// owner's budget) is atomic for leaves, but the tables it linked on its
/// way down to the refused allocation stay linked, empty: they count in
/// the domain's table pages (and its limit) until an unmap happens to
/// cover them, and a later 2 MiB map there gets 512 pages instead of a
/// block.
#[test]
fn a_map_refused_for_table_pages_leaves_no_empty_tables() {
    let iommu = Iommu::new();
    let d = Domain::new(
        &iommu,
        1,
        DomainConfig {
            max_table_pages: 3,
            ..DomainConfig::default()
        },
    )
    .unwrap();
    assert!(d.map(0, 0, P, Prot::RW).is_err(), "needs a fourth page");
    assert!(d.mappings().is_empty());
    assert_eq!(d.table_pages(), 1, "only the root is left");
    // The same through a map whose first part fits.
    let d = Domain::new(
        &iommu,
        2,
        DomainConfig {
            max_table_pages: 5,
            ..DomainConfig::default()
        },
    )
    .unwrap();
    // Root, L2, L1 and a leaf table for the first page; the second page
    // (across a 1 GiB line) needs a new L1 and a leaf table: refused.
    assert!(d
        .map_sg(
            BLOCK_1G - P,
            &[(0x1000_0000, P), (0x2000_0000, P)],
            Prot::RW
        )
        .is_err());
    assert_eq!(d.table_pages(), 1, "only the root is left");
    // A 2 MiB-aligned map where the empty tables were is a block.
    let d = Domain::new(
        &iommu,
        3,
        DomainConfig {
            max_table_pages: 3,
            ..DomainConfig::default()
        },
    )
    .unwrap();
    assert!(d.map(0, 0, P, Prot::RW).is_err());
    d.map(0, 0, BLOCK_2M, Prot::RW).unwrap();
    assert_eq!(d.leaf_counts(), (0, 1, 0));
}

/// A range that runs past the top of the IOVA space faults at its first
/// byte out of the space (or its first unmapped byte below), as every
/// other fault names "the first faulting byte": it was reported at the
/// range's first byte, a mapped one, so a client resolving a stalled
/// request from the fault looks at the wrong address.
#[test]
fn a_range_past_the_iova_space_faults_at_its_first_bad_byte() {
    let iommu = Iommu::new();
    let d = Domain::new(&iommu, 1, DomainConfig::default()).unwrap();
    let mut e = EngineTlb::new(&iommu);
    d.map(IOVA_LIMIT - P, 0x10_0000, P, Prot::RW).unwrap();
    let mut runs = Vec::new();
    let f = e
        .enter()
        .translate_range(&d, 1, IOVA_LIMIT - P, 2 * P, Access::Read, &mut runs)
        .unwrap_err();
    assert_eq!((f.iova, f.reason), (IOVA_LIMIT, FaultReason::OutOfRange));
    let f = d
        .translate_range(IOVA_LIMIT - P, 2 * P, Access::Read, &mut runs)
        .unwrap_err();
    assert_eq!((f.iova, f.reason), (IOVA_LIMIT, FaultReason::OutOfRange));
    // Unmapped below the top: that byte, Unmapped.
    let f = d
        .translate_range(IOVA_LIMIT - 2 * P, 4 * P, Access::Read, &mut runs)
        .unwrap_err();
    assert_eq!(
        (f.iova, f.reason),
        (IOVA_LIMIT - 2 * P, FaultReason::Unmapped)
    );
}

/// `unmap_fast` refuses a gather bound to another domain, but
/// `iotlb_sync` takes any gather: synced on the wrong domain, the unmaps'
/// range is invalidated under the wrong tag (an engine keeps translating
/// the unmapped IOVA), their releases are dropped all the same (the memory
/// goes while the engine can still reach it), and their table pages are
/// freed into the wrong domain's allocator (pages that domain still uses:
/// its next map links one of them a second time).
#[test]
fn a_gather_synced_on_another_domain_neither_releases_early_nor_corrupts_it() {
    struct Flag(Arc<AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let iommu = Iommu::new();
    let a = Domain::new(&iommu, 1, DomainConfig::default()).unwrap();
    let b = Domain::new(&iommu, 2, DomainConfig::default()).unwrap();
    let mut e = EngineTlb::new(&iommu);
    a.map(0, 0x10_0000, P, Prot::RW).unwrap();
    b.map(0, 0x20_0000, 8 * P, Prot::RW).unwrap();
    assert!(e.enter().translate(&a, 1, 8, Access::Read).is_ok());
    let released = Arc::new(AtomicBool::new(false));
    let mut g = IotlbGather::new();
    a.unmap_fast(0, P, &mut g).unwrap();
    g.defer_release(Box::new(Flag(released.clone())));
    let synced = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| b.iotlb_sync(&mut g)));
    assert!(
        synced.is_ok(),
        "iotlb_sync panicked (table pages of A freed into B)"
    );
    if released.load(Ordering::SeqCst) {
        assert!(
            e.enter().translate(&a, 1, 8, Access::Read).is_err(),
            "A's memory was released while an engine still translates to it"
        );
    }
    for k in 0..8 {
        assert_eq!(b.iova_to_phys(k * P), Some(0x20_0000 + k * P));
    }
    b.map(BLOCK_1G, 0x30_0000, P, Prot::RW).unwrap();
    for k in 0..8 {
        assert_eq!(b.iova_to_phys(k * P), Some(0x20_0000 + k * P), "B intact");
    }
}
