//! Map/unmap with batched TLB maintenance: one call and one synchronous
//! invalidation per leaf against one scatter-list call and one gathered
//! invalidation, while engine threads keep translating through the domain.

use crate::report::outln;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use wd_iommu::{
    Access, Domain, DomainConfig, EngineTlb, Iommu, IotlbGather, Prot, BLOCK_2M, PAGE_SIZE,
};

use super::IommuArgs;
use crate::report::{median, Progress, Target};
use crate::units::exact_size;

/// Sizes of the map/unmap table: 128 KiB, 4 MiB and ~18 MiB. The last,
/// 18 MiB + 340 KiB, stands for a large buffer of no round size: its
/// contiguous layout is 9 blocks of 2 MiB and a tail of 85 pages of 4 KiB.
const MAP_SIZES: [u64; 3] = [128 << 10, 4 << 20, (18 << 20) + (340 << 10)];
/// IOVA of the measured range.
const MAP_IOVA: u64 = 1 << 32;
/// IOVA window the busy engine translates meanwhile.
const ENGINE_IOVA: u64 = 1 << 31;
const ENGINE_WINDOW: u64 = 1 << 20;

#[derive(Clone, Debug, Serialize)]
pub(super) struct MapRow {
    /// "4k-scatter" or "2m-contiguous".
    layout: &'static str,
    size: u64,
    /// Leaves the range maps to (pages + blocks).
    leaves: u64,
    map_before_us: f64,
    map_after_us: f64,
    unmap_before_us: f64,
    unmap_after_us: f64,
    map_ratio: f64,
    unmap_ratio: f64,
    /// Syncs per unmap, before and after.
    unmap_syncs_before: f64,
    unmap_syncs_after: f64,
    /// Mean time a sync waited for an engine acknowledgement, before.
    sync_wait_us_before: f64,
    /// Share of the per-leaf syncs that found an engine busy (had to wait
    /// for its acknowledgement).
    syncs_waited_before: f64,
}

/// A busy engine: sections translating 64 KiB of its window and copying
/// 64 KiB, back to back, until stopped.
fn busy_engine(
    iommu: Arc<Iommu>,
    dom: Arc<Domain>,
    stop: Arc<AtomicBool>,
    sections: Arc<AtomicU64>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut e = EngineTlb::new(&iommu);
        let src = vec![1u8; 64 << 10];
        let mut dst = vec![0u8; 64 << 10];
        let mut runs = Vec::new();
        let mut n = 0u64;
        let mut at = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let mut s = e.enter();
            let _ = s.translate_range(&dom, 0, ENGINE_IOVA + at, 64 << 10, Access::Read, &mut runs);
            dst.copy_from_slice(&src);
            std::hint::black_box(&mut dst);
            drop(s);
            at = (at + (64 << 10)) % ENGINE_WINDOW;
            n += 1;
            sections.fetch_add(1, Ordering::Relaxed);
        }
        n
    })
}

/// The leaves of a layout: (phys, len) runs a per-leaf driver maps one by one.
fn layout_leaves(layout: &str, size: u64) -> Vec<(u64, u64)> {
    let pages = size / PAGE_SIZE;
    match layout {
        // Physical pages scattered (every other frame, in a shuffled order):
        // nothing coalesces into a block.
        "4k-scatter" => (0..pages)
            .map(|i| {
                let frame = ((i * 7919) % (pages * 2)) | 1;
                ((1 << 40) + frame * PAGE_SIZE, PAGE_SIZE)
            })
            .collect(),
        _ => {
            // Contiguous and 2 MiB aligned: blocks, then pages for the tail.
            let base = 1u64 << 41;
            let mut v = Vec::new();
            let mut at = 0;
            while at < size {
                let step = if size - at >= BLOCK_2M {
                    BLOCK_2M
                } else {
                    PAGE_SIZE
                };
                v.push((base + at, step));
                at += step;
            }
            v
        }
    }
}

pub(super) fn map_table(args: &IommuArgs, prog: &mut Progress) -> Result<Vec<MapRow>, String> {
    let iommu = Iommu::new();
    let dom = Arc::new(
        Domain::new(&iommu, 1, DomainConfig::default()).expect("a domain without a budget"),
    );
    dom.map(ENGINE_IOVA, 1 << 39, ENGINE_WINDOW, Prot::RW)
        .map_err(|e| e.to_string())?;
    let stop = Arc::new(AtomicBool::new(false));
    let sections = Arc::new(AtomicU64::new(0));
    let engines: Vec<_> = (0..args.engines)
        .map(|_| busy_engine(iommu.clone(), dom.clone(), stop.clone(), sections.clone()))
        .collect();
    // A shared machine may not be running the engines right now: start each
    // measurement when they make progress (at most 100 ms later), so the
    // per-page syncs meet an active device, as they do on a busy machine.
    let engines_running = || {
        if args.engines == 0 {
            return;
        }
        let s0 = sections.load(Ordering::Relaxed);
        let t = Instant::now();
        while sections.load(Ordering::Relaxed) < s0 + 2 && t.elapsed() < Duration::from_millis(100)
        {
            std::thread::yield_now();
        }
    };
    // Let the engines get going before the first measurement.
    std::thread::sleep(std::time::Duration::from_millis(30));
    let mut rows = Vec::new();
    let mut result = Ok(());
    'outer: for layout in ["4k-scatter", "2m-contiguous"] {
        for &size in &MAP_SIZES {
            prog.step(&format!("map/unmap {layout} {}", exact_size(size)));
            let leaves = layout_leaves(layout, size);
            let (mut mb, mut ma, mut ub, mut ua) = (vec![], vec![], vec![], vec![]);
            let (mut sb, mut sa, mut wb) = (0u64, 0u64, 0u64);
            let mut wait_ns = 0u64;
            for _ in 0..args.reps {
                // Before: one call and one sync per leaf.
                engines_running();
                let t = Instant::now();
                let mut at = MAP_IOVA;
                for &(p, l) in &leaves {
                    if let Err(e) = dom.map(at, p, l, Prot::RW) {
                        result = Err(e.to_string());
                        break 'outer;
                    }
                    at += l;
                }
                mb.push(t.elapsed().as_secs_f64() * 1e6);
                engines_running();
                let s0 = iommu.stats();
                let t = Instant::now();
                let mut at = MAP_IOVA;
                for &(_, l) in &leaves {
                    if let Err(e) = dom.unmap(at, l) {
                        result = Err(e.to_string());
                        break 'outer;
                    }
                    at += l;
                }
                ub.push(t.elapsed().as_secs_f64() * 1e6);
                let s1 = iommu.stats();
                sb += s1.syncs - s0.syncs;
                wb += s1.waited_syncs - s0.waited_syncs;
                wait_ns += s1.wait_ns - s0.wait_ns;
                // After: one scatter-list call, one gathered invalidation.
                engines_running();
                let t = Instant::now();
                if let Err(e) = dom.map_sg(MAP_IOVA, &leaves, Prot::RW) {
                    result = Err(e.to_string());
                    break 'outer;
                }
                ma.push(t.elapsed().as_secs_f64() * 1e6);
                engines_running();
                let s0 = iommu.stats();
                let t = Instant::now();
                let mut g = IotlbGather::new();
                if let Err(e) = dom.unmap_fast(MAP_IOVA, size, &mut g) {
                    result = Err(e.to_string());
                    break 'outer;
                }
                dom.iotlb_sync(&mut g);
                ua.push(t.elapsed().as_secs_f64() * 1e6);
                sa += iommu.stats().syncs - s0.syncs;
            }
            let reps = args.reps as f64;
            let (mb, ma, ub, ua) = (median(&mb), median(&ma), median(&ub), median(&ua));
            rows.push(MapRow {
                layout,
                size,
                leaves: leaves.len() as u64,
                map_before_us: mb,
                map_after_us: ma,
                unmap_before_us: ub,
                unmap_after_us: ua,
                map_ratio: mb / ma,
                unmap_ratio: ub / ua,
                unmap_syncs_before: sb as f64 / reps,
                unmap_syncs_after: sa as f64 / reps,
                sync_wait_us_before: if wb > 0 {
                    wait_ns as f64 / 1e3 / wb as f64
                } else {
                    0.0
                },
                syncs_waited_before: wb as f64 / sb.max(1) as f64,
            });
        }
    }
    stop.store(true, Ordering::Relaxed);
    for e in engines {
        let _ = e.join();
    }
    result.map(|_| rows)
}

/// The targets the map/unmap table is judged by: the ~18 MiB scatter list,
/// per-page against gathered.
pub(super) fn map_targets(rows: &[MapRow]) -> Vec<Target> {
    let mut targets = Vec::new();
    for r in rows
        .iter()
        .filter(|r| r.layout == "4k-scatter" && r.size == MAP_SIZES[2])
    {
        targets.push(Target::at_least(
            format!(
                "unmap of {} (4 KiB pages): per-page / gathered",
                exact_size(r.size)
            ),
            r.unmap_ratio,
            27.0,
        ));
        targets.push(Target::at_least(
            format!(
                "map of {} (4 KiB pages): per-page / map_sg",
                exact_size(r.size)
            ),
            r.map_ratio,
            4.0,
        ));
    }
    targets
}

pub(super) fn print_map(rows: &[MapRow], args: &IommuArgs) {
    let sizes: Vec<String> = MAP_SIZES.iter().map(|&s| exact_size(s)).collect();
    outln!(
        "Map/unmap, {}; 4 KiB pages (scattered) and 2 MiB blocks (contiguous): one call + one sync per leaf (before) vs one call + one gathered sync (after); {} busy engine(s); medians of {} reps",
        sizes.join(", "),
        args.engines,
        args.reps
    );
    outln!();
    outln!("| layout | size | leaves | map before | map after | x | unmap before | unmap after | x | syncs before/after | syncs that waited | sync wait |");
    outln!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        outln!(
            "| {} | {} | {} | {:.1} us | {:.1} us | {:.1} | {:.1} us | {:.1} us | {:.1} | {:.0} / {:.0} | {:.0}% | {:.2} us |",
            r.layout,
            exact_size(r.size),
            r.leaves,
            r.map_before_us,
            r.map_after_us,
            r.map_ratio,
            r.unmap_before_us,
            r.unmap_after_us,
            r.unmap_ratio,
            r.unmap_syncs_before,
            r.unmap_syncs_after,
            r.syncs_waited_before * 100.0,
            r.sync_wait_us_before
        );
    }
    outln!();
}
