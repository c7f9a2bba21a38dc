//! Engines translate and read while another thread unmaps and remaps:
//! nothing is ever read through a stale translation once the memory was
//! released (after the sync in strict mode, after the flush in deferred
//! mode). Memory here is simulated: one word per physical page, holding the
//! IOVA page it belongs to; a released page is poisoned, then reused for
//! another IOVA.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use wd_iommu::{
    Access, Domain, DomainConfig, EngineTlb, InvalidationMode, Iommu, IotlbGather, Prot, BLOCK_2M,
    PAGE_SIZE,
};

const P: u64 = PAGE_SIZE;
const PHYS_PAGES: u64 = 8192;
const IOVA_PAGES: u64 = 64;
/// IOVA of the 2 MiB block region (mapped and unmapped as a whole).
const BLOCK_IOVA: u64 = 1 << 30;
/// Physical pages below this form two 2 MiB groups for the block region.
const BLOCK_POOL: u64 = 2 * BLOCK_2M;
const POISON: u64 = u64::MAX;

struct World {
    mem: Vec<AtomicU64>,
    /// Free single pages (physical addresses).
    free: Mutex<Vec<u64>>,
}

impl World {
    fn word(&self, phys: u64) -> &AtomicU64 {
        &self.mem[(phys / P) as usize]
    }
}

/// Poisons its physical pages (and returns single pages to the pool) when
/// released: the memory is reused from then on.
struct Reuse {
    w: Arc<World>,
    pages: Vec<u64>,
}

impl Drop for Reuse {
    fn drop(&mut self) {
        let mut free = self.w.free.lock().unwrap();
        for &p in &self.pages {
            self.w.word(p).store(POISON, Ordering::SeqCst);
            if p >= BLOCK_POOL {
                free.push(p);
            }
        }
    }
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

fn run(mode: InvalidationMode, ops: usize) {
    run_with(mode, ops, false);
}

/// `timers`: engines also keep one translation past each section (pinned,
/// as for a request a device holds) and read through it after the
/// section, while a thread runs the IOMMU's timers (flush-queue timeout
/// 1 ms) beside the unmaps.
fn run_with(mode: InvalidationMode, ops: usize, timers: bool) {
    let iommu = Iommu::new();
    let dom = Arc::new(
        Domain::new(
            &iommu,
            1,
            DomainConfig {
                mode,
                // With the timers, theirs are most of the flushes.
                fq_size: if timers { 256 } else { 16 },
                fq_timeout: if timers {
                    std::time::Duration::from_millis(1)
                } else {
                    wd_iommu::DEFAULT_FQ_TIMEOUT
                },
                ..DomainConfig::default()
            },
        )
        .unwrap(),
    );
    iommu.track(&dom);
    let w = Arc::new(World {
        mem: (0..PHYS_PAGES).map(|_| AtomicU64::new(POISON)).collect(),
        free: Mutex::new((BLOCK_POOL / P..PHYS_PAGES).map(|p| p * P).collect()),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let mut engines = Vec::new();
    for k in 0..2u64 {
        let (dom, w, stop, reads, iommu) = (
            dom.clone(),
            w.clone(),
            stop.clone(),
            reads.clone(),
            iommu.clone(),
        );
        engines.push(std::thread::spawn(move || {
            let mut e = EngineTlb::new(&iommu);
            let mut seed = 0x1234_5678 + k;
            let mut n = 0u64;
            let mut sections = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let mut s = e.enter();
                let mut held = None;
                for _ in 0..16 {
                    let r = xorshift(&mut seed);
                    let (iova, owner) = if r % 8 == 0 {
                        let off = (r >> 8) % (BLOCK_2M / P) * P;
                        (BLOCK_IOVA + off, BLOCK_IOVA / P)
                    } else {
                        let page = (r >> 8) % IOVA_PAGES;
                        (page * P, page)
                    };
                    if let Ok(phys) = s.translate(&dom, 1, iova + 8, Access::Read) {
                        // Widen the window between translation and access.
                        for _ in 0..32 {
                            std::hint::spin_loop();
                        }
                        let v = w.word(phys).load(Ordering::SeqCst);
                        assert_ne!(v, POISON, "read released memory through IOVA {iova:#x}");
                        assert_eq!(v & 0xffff_ffff, owner, "read another IOVA's memory");
                        n += 1;
                        if timers && held.is_none() {
                            held = Some((phys, owner, iova));
                        }
                    }
                }
                if held.is_some() {
                    let seq = s.seq();
                    s.pin(Some(seq));
                }
                drop(s);
                if let Some((phys, owner, iova)) = held {
                    // A device still using it after the section.
                    for _ in 0..64 {
                        std::hint::spin_loop();
                    }
                    let v = w.word(phys).load(Ordering::SeqCst);
                    assert_ne!(
                        v, POISON,
                        "a held request read released memory at {iova:#x}"
                    );
                    assert_eq!(
                        v & 0xffff_ffff,
                        owner,
                        "a held request read another IOVA's memory"
                    );
                    e.pin(None);
                }
                sections += 1;
                if sections % 8 == 0 {
                    // Two cores for three threads: let the unmapper run.
                    std::thread::yield_now();
                }
            }
            reads.fetch_add(n, Ordering::Relaxed);
        }));
    }
    let timer = timers.then(|| {
        let (iommu, stop) = (iommu.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut flushed = 0;
            while !stop.load(Ordering::Relaxed) {
                flushed += iommu.housekeeping(std::time::Instant::now()).0;
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            flushed
        })
    });
    let mut seed = 99u64;
    let mut generation = 0u64;
    let mut mapped = vec![None::<u64>; IOVA_PAGES as usize];
    let mut block: Option<u64> = None;
    let mut blocks_mapped = 0;
    for i in 0..ops {
        let r = xorshift(&mut seed);
        generation += 1;
        if r % 16 == 0 {
            match block.take() {
                Some(base) => {
                    let mut g = IotlbGather::new();
                    assert_eq!(dom.unmap_fast(BLOCK_IOVA, BLOCK_2M, &mut g), Ok(BLOCK_2M));
                    let pages = (0..BLOCK_2M / P).map(|k| base + k * P).collect();
                    g.defer_release(Box::new(Reuse {
                        w: w.clone(),
                        pages,
                    }));
                    dom.iotlb_sync(&mut g);
                }
                None => {
                    // A 2 MiB group whose previous use was released.
                    let base = ((r >> 8) % 2) * BLOCK_2M;
                    let released = (0..BLOCK_2M / P)
                        .all(|k| w.word(base + k * P).load(Ordering::SeqCst) == POISON);
                    if released {
                        for k in 0..BLOCK_2M / P {
                            w.word(base + k * P)
                                .store((generation << 32) | (BLOCK_IOVA / P), Ordering::SeqCst);
                        }
                        dom.map(BLOCK_IOVA, base, BLOCK_2M, Prot::RW).unwrap();
                        assert_eq!(dom.leaf_counts().1, 1, "a block");
                        block = Some(base);
                        blocks_mapped += 1;
                    }
                }
            }
            continue;
        }
        let page = (r >> 8) % IOVA_PAGES;
        match mapped[page as usize].take() {
            Some(phys) => {
                let mut g = IotlbGather::new();
                assert_eq!(dom.unmap_fast(page * P, P, &mut g), Ok(P));
                g.defer_release(Box::new(Reuse {
                    w: w.clone(),
                    pages: vec![phys],
                }));
                dom.iotlb_sync(&mut g);
            }
            None => {
                let Some(phys) = w.free.lock().unwrap().pop() else {
                    dom.flush_iotlb_all();
                    continue;
                };
                w.word(phys)
                    .store((generation << 32) | page, Ordering::SeqCst);
                dom.map(page * P, phys, P, Prot::READ).unwrap();
                mapped[page as usize] = Some(phys);
            }
        }
        if i % 64 == 0 {
            std::thread::yield_now();
        }
        if timers && i % 8 == 0 {
            // Slow enough for unmaps to time out in the flush queue.
            std::thread::sleep(std::time::Duration::from_micros(1500));
        }
    }
    stop.store(true, Ordering::Relaxed);
    for e in engines {
        e.join().expect("no engine saw stale memory");
    }
    if let Some(t) = timer {
        assert!(t.join().unwrap() > 0, "the timers flushed");
    }
    assert!(reads.load(Ordering::Relaxed) > 0, "engines did translate");
    assert!(blocks_mapped > 0);
    assert!(iommu.stats().syncs > 0);
}

#[test]
fn strict_unmaps_never_leave_a_stale_read() {
    run(InvalidationMode::Strict, 20000);
}

#[test]
fn deferred_unmaps_never_leave_a_stale_read_after_the_flush() {
    run(InvalidationMode::Deferred, 20000);
}

/// Deferred unmaps flushed by the timers (flush-queue timeout),
/// while engines keep translations past their sections (held requests),
/// never leave a read of released memory.
#[test]
fn deferred_unmaps_flushed_by_the_timers_never_leave_a_stale_read() {
    run_with(InvalidationMode::Deferred, 4000, true);
}
