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

/// Domain 1 of `iommu` in deferred mode, its flush queue due after 1 ms,
/// looked after by the IOMMU's timers (`Iommu::housekeeping`).
fn timed_deferred_domain(iommu: &Arc<Iommu>) -> Arc<Domain> {
    let d = Arc::new(
        Domain::new(
            iommu,
            1,
            DomainConfig {
                mode: wd_iommu::InvalidationMode::Deferred,
                fq_timeout: std::time::Duration::from_millis(1),
                ..DomainConfig::default()
            },
        )
        .unwrap(),
    );
    iommu.track(&d);
    d
}

/// docs/iommu.md and DESIGN.md promise a deferred unmap is flushed
/// once the oldest one is `fq_timeout` old (the host's timer thread calls
/// `Iommu::housekeeping` every 5 ms). `flush_if_due` now skips a domain
/// whenever an engine's pin covers it, and a pin whose domains are not
/// known (`pin_tags` None: what an NVMe controller's register-driven
/// transfers publish, tag 0) covers every domain. Another client's engine
/// that keeps some transfer in flight, each briefly (its pin moves on every
/// half millisecond, so a flush's sync would complete at once), stopped
/// every domain's time-bound flush: the unmapped page stayed reachable
/// through an IOTLB and its memory held, for as long as that traffic went on.
#[test]
fn a_moving_pin_of_another_engine_does_not_stop_deferred_flushes() {
    use std::time::{Duration, Instant};
    let iommu = Iommu::new();
    let d = timed_deferred_domain(&iommu);
    d.map(0x10000, 0x100000, P, Prot::RW).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let other = {
        let (iommu, stop) = (iommu.clone(), stop.clone());
        std::thread::spawn(move || {
            // Another client's engine: a transfer always in flight, each
            // done within half a millisecond; domains not known.
            let mut e = EngineTlb::new(&iommu);
            while !stop.load(Ordering::Relaxed) {
                let mut s = e.enter();
                let seq = s.seq();
                s.pin(Some(seq));
                drop(s);
                std::thread::sleep(Duration::from_micros(500));
            }
            e.pin(None);
        })
    };
    std::thread::sleep(Duration::from_millis(10));
    let c0 = d.flush_counter();
    d.unmap(0x10000, P).unwrap();
    let t = Instant::now();
    while d.flush_counter() == c0 && t.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(5));
        iommu.housekeeping(Instant::now());
    }
    let waited = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    other.join().unwrap();
    assert!(
        d.flush_counter() > c0 && d.stats().fq_pending == 0,
        "a deferred unmap (fq_timeout 1 ms) was still unflushed after {waited:?} of the timers, behind another engine's briefly held transfers"
    );
}

/// The timers serve every domain from one thread (flush-queue and
/// stall timeouts), so `flush_if_due` must never wait for a client's held
/// requests. It skipped a domain an engine's pin covered when it looked,
/// but an engine in a section then, not pinned yet, which ends the
/// section holding requests (a batch of copies an asynchronous device
/// keeps, translated before the flush's sync), held the timer thread in
/// the flush's sync until the client let those requests go: meanwhile no
/// other domain's flush queue was flushed and no stall timed out (another
/// client's stalled request stood still, its queue behind it).
#[test]
fn the_timers_never_wait_for_a_pin_taken_during_their_flush() {
    use std::sync::mpsc;
    use std::time::{Duration, Instant};
    let iommu = Iommu::new();
    let a = timed_deferred_domain(&iommu);
    a.map(0x10000, 0x100000, 2 * P, Prot::RW).unwrap();
    // Another client's domain, with a request stalled (timeout 1 ms).
    let b = Arc::new(
        Domain::new(
            &iommu,
            2,
            DomainConfig {
                fault_policy: wd_iommu::FaultPolicy::Stall,
                stall_timeout: Duration::from_millis(1),
                ..DomainConfig::default()
            },
        )
        .unwrap(),
    );
    iommu.track(&b);
    let fault = wd_iommu::Fault {
        iova: 0x9000,
        pasid: 2,
        access: Access::Read,
        reason: FaultReason::Unmapped,
    };
    let wd_iommu::FaultOutcome::Stalled { stag } = b.report_fault(fault, true) else {
        panic!("not stalled");
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (entered_tx, entered_rx) = mpsc::channel();
    let engine = {
        let (iommu, a, stop) = (iommu.clone(), a.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut e = EngineTlb::new(&iommu);
            let mut s = e.enter();
            s.translate(&a, 1, 0x11000, Access::Read).unwrap();
            let seq = s.seq();
            s.pin_tags(Some(vec![a.tag()]));
            entered_tx.send(()).unwrap();
            // The section goes on a while, then ends holding a request
            // (translated before the flush), held until the client lets go.
            std::thread::sleep(Duration::from_millis(100));
            s.pin(Some(seq));
            drop(s);
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(1));
            }
            e.pin(None);
        })
    };
    entered_rx.recv().unwrap();
    let c0 = a.flush_counter();
    a.unmap(0x10000, P).unwrap();
    let (done_tx, done_rx) = mpsc::channel();
    let timers = {
        let iommu = iommu.clone();
        std::thread::spawn(move || {
            let t = Instant::now();
            iommu.housekeeping(Instant::now() + Duration::from_secs(1));
            done_tx.send(t.elapsed()).unwrap();
        })
    };
    let took = done_rx.recv_timeout(Duration::from_secs(2));
    // Taken while the request is still held.
    let b_resolved = b.take_resolution(stag);
    stop.store(true, Ordering::Relaxed);
    engine.join().unwrap();
    timers.join().unwrap();
    assert!(
        took.is_ok(),
        "the IOMMU timers waited more than 2 s in one domain's flush, for a request an engine held"
    );
    assert_eq!(
        b_resolved,
        Some(wd_iommu::Resolution::Abort),
        "another domain's stall (timeout 1 ms) was not timed out meanwhile"
    );
    // Once the held request is let go, the flush completes.
    let t = Instant::now();
    while a.flush_counter() == c0 && t.elapsed() < Duration::from_secs(2) {
        iommu.housekeeping(Instant::now() + Duration::from_secs(1));
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(a.flush_counter() > c0 && a.stats().fq_pending == 0);
}
