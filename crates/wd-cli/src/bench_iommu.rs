//! `wd bench iommu`: what the software IOMMU costs, in one run.
//!
//! 1. Map/unmap with batched TLB maintenance: map and unmap of 128 KiB,
//!    4 MiB and ~18 MiB scatter lists, one call and one synchronous
//!    invalidation per leaf ("before") against one call and one gathered
//!    range invalidation ("after"), for 4 KiB pages and for 2 MiB blocks
//!    where the memory is contiguous. An engine thread keeps translating and
//!    copying through the same domain meanwhile, as a device serving other
//!    requests does, so every sync waits for a real acknowledgement.
//! 2. A DMA stream through the dummy device where every request's buffers
//!    are mapped before and unmapped after, as % of the throughput without
//!    per-request mapping: strict against deferred invalidation, through the
//!    host's DMA API (emulated IOMMU) and through virtio-iommu requests
//!    (para-virtual IOMMU).
//! 3. The hot path: translating a request's range with IOTLB hits, next to
//!    a memcpy of the same size.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::report::{median, print_json, Progress, Target};
use crate::units::{exact_size, size_arg};
use wd_iommu::{
    Access, Domain, DomainConfig, EngineTlb, Iommu, IotlbGather, Prot, BLOCK_2M, PAGE_SIZE,
};

/// Options of `wd bench iommu`.
#[derive(clap::Args)]
pub struct IommuArgs {
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// Repetitions per measurement (the median is reported).
    #[arg(long, default_value_t = 7)]
    reps: usize,
    /// Engine threads kept busy translating during the map/unmap runs
    /// (0: every sync finds the engines idle).
    #[arg(long, default_value_t = 1)]
    engines: usize,
    /// Seconds per DMA-stream measurement.
    #[arg(long, default_value_t = 0.25)]
    seconds: f64,
    /// Bytes per request of the DMA stream (e.g. 64k).
    #[arg(long, value_parser = size_arg, default_value_t = 65536)]
    request_size: u64,
    /// Requests of the DMA stream in flight (each with its own buffers).
    #[arg(long, default_value_t = IN_FLIGHT)]
    in_flight: usize,
    /// Requests of the DMA stream mapped and sent per batch.
    #[arg(long, default_value_t = STREAM_BATCH)]
    batch: usize,
    /// Rows of the DMA-stream table (no-iommu, the baseline, is always run).
    #[arg(long, value_delimiter = ',', default_values_t = STREAM_PATHS.iter().map(|p| p.to_string()).collect::<Vec<_>>())]
    paths: Vec<String>,
    /// Only these parts (comma separated: map, stream, translate).
    #[arg(long, value_delimiter = ',', default_values_t = vec!["map".to_string(), "stream".to_string(), "translate".to_string()])]
    parts: Vec<String>,
}

/// Run `wd bench iommu`. It measures a host it starts in this process (the
/// strict and deferred rows drive the host's DMA API directly, as a kernel
/// driver would), so `host` must be "embedded".
pub fn run(args: IommuArgs, host: &str) -> Result<(), String> {
    if host != "embedded" {
        return Err(format!(
            "wd bench iommu measures a host inside this process; --host {host} is not supported"
        ));
    }
    run_iommu(args)
}

// ------------------------------------------------------------ map/unmap

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
struct MapRow {
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

fn map_table(args: &IommuArgs, prog: &mut Progress) -> Result<Vec<MapRow>, String> {
    let iommu = Iommu::new();
    let dom = Arc::new(Domain::new(&iommu, 1, DomainConfig::default()));
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

// ------------------------------------------------------------ hot path

#[derive(Clone, Debug, Serialize)]
struct TranslateRow {
    /// "4k-pages" or "2m-block".
    layout: &'static str,
    size: u64,
    /// One IOTLB-hit translation of the range, ns.
    translate_ns: f64,
    /// memcpy of the same size, ns.
    memcpy_ns: f64,
    /// translate / memcpy.
    ratio: f64,
}

fn time_per_iter(mut f: impl FnMut(), iters: u64) -> f64 {
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    t.elapsed().as_nanos() as f64 / iters as f64
}

fn translate_table(args: &IommuArgs, prog: &mut Progress) -> Result<Vec<TranslateRow>, String> {
    let iommu = Iommu::new();
    let pages = Domain::new(
        &iommu,
        1,
        DomainConfig {
            blocks: false,
            ..DomainConfig::default()
        },
    );
    let blocks = Domain::new(&iommu, 2, DomainConfig::default());
    let src = vec![7u8; 2 << 20];
    let mut dst = vec![0u8; 2 << 20];
    for d in [&pages, &blocks] {
        d.map(BLOCK_2M, 1 << 40, BLOCK_2M, Prot::RW)
            .map_err(|e| e.to_string())?;
    }
    let mut e = EngineTlb::new(&iommu);
    let mut runs = Vec::with_capacity(512);
    let mut rows = Vec::new();
    for (layout, d) in [("4k-pages", &pages), ("2m-block", &blocks)] {
        for size in [64u64, 4096, 65536, 2 << 20] {
            prog.step(&format!("translate {layout} {}", exact_size(size)));
            let iters = ((64 << 20) / size.max(4096)).clamp(256, 200_000);
            let mut tv = Vec::new();
            let mut mv = Vec::new();
            for _ in 0..args.reps {
                let mut s = e.enter();
                // Warm the IOTLB.
                s.translate_range(d, 1, BLOCK_2M, size, Access::Read, &mut runs)
                    .map_err(|f| f.to_string())?;
                tv.push(time_per_iter(
                    || {
                        let r = s.translate_range(
                            d,
                            1,
                            std::hint::black_box(BLOCK_2M),
                            size,
                            Access::Read,
                            &mut runs,
                        );
                        std::hint::black_box(&r);
                    },
                    iters,
                ));
                drop(s);
                let n = size as usize;
                mv.push(time_per_iter(
                    || {
                        dst[..n].copy_from_slice(&src[..n]);
                        std::hint::black_box(&mut dst);
                    },
                    iters,
                ));
            }
            let (t, m) = (median(&tv), median(&mv));
            rows.push(TranslateRow {
                layout,
                size,
                translate_ns: t,
                memcpy_ns: m,
                ratio: t / m,
            });
        }
    }
    Ok(rows)
}

// ------------------------------------------------------------ the run

fn run_iommu(args: IommuArgs) -> Result<(), String> {
    if args.reps == 0 || !(0.01..=60.0).contains(&args.seconds) {
        return Err("need --reps >= 1 and --seconds in 0.01..60".into());
    }
    if args.engines > 8 {
        return Err("--engines: at most 8".into());
    }
    for p in &args.parts {
        if !matches!(p.as_str(), "map" | "stream" | "translate") {
            return Err(format!("unknown part '{p}' (map, stream, translate)"));
        }
    }
    if let Some(p) = args
        .paths
        .iter()
        .find(|p| !STREAM_PATHS.contains(&p.as_str()))
    {
        return Err(format!(
            "unknown stream path '{p}' ({})",
            STREAM_PATHS.join(", ")
        ));
    }
    let want = |p: &str| args.parts.iter().any(|x| x == p);
    let mut prog = Progress::new(
        want("map") as usize * 6
            + want("stream") as usize * (1 + args.paths.len()).min(STREAM_ROWS) * args.reps
            + want("translate") as usize * 8,
        !args.json,
    );
    let map_rows = if want("map") {
        map_table(&args, &mut prog)?
    } else {
        vec![]
    };
    let stream = if want("stream") {
        Some(stream_table(&args, &mut prog)?)
    } else {
        None
    };
    let tr_rows = if want("translate") {
        translate_table(&args, &mut prog)?
    } else {
        vec![]
    };
    prog.finish();

    let mut targets = Vec::new();
    for r in map_rows
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
    if let Some(s) = &stream {
        targets.extend(stream_targets(s));
    }

    if args.json {
        let v = serde_json::json!({
            "benchmark": "iommu",
            "reps": args.reps,
            "engines": args.engines,
            "map_unmap": map_rows,
            "stream": stream,
            "translate": tr_rows,
            "targets": targets,
        });
        print_json(&v);
        return Ok(());
    }
    if !map_rows.is_empty() {
        let sizes: Vec<String> = MAP_SIZES.iter().map(|&s| exact_size(s)).collect();
        println!(
            "Map/unmap, {}; 4 KiB pages (scattered) and 2 MiB blocks (contiguous): one call + one sync per leaf (before) vs one call + one gathered sync (after); {} busy engine(s); medians of {} reps",
            sizes.join(", "),
            args.engines,
            args.reps
        );
        println!();
        println!("| layout | size | leaves | map before | map after | x | unmap before | unmap after | x | syncs before/after | syncs that waited | sync wait |");
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for r in &map_rows {
            println!(
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
        println!();
    }
    if let Some(s) = &stream {
        print_stream(s, &args);
    }
    if !tr_rows.is_empty() {
        println!("Hot path: translating a request's range with IOTLB hits, next to a memcpy of the same size (medians of {} reps)", args.reps);
        println!();
        println!("| layout | size | translate | memcpy | translate / memcpy |");
        println!("|---|---:|---:|---:|---:|");
        for r in &tr_rows {
            println!(
                "| {} | {} | {:.1} ns | {:.1} ns | {:.3} |",
                r.layout,
                exact_size(r.size),
                r.translate_ns,
                r.memcpy_ns,
                r.ratio
            );
        }
        println!();
    }
    for t in &targets {
        println!("{}", t.line());
    }
    Ok(())
}

// ------------------------------------------------------------ DMA stream

/// The rows of the stream table, in order.
const STREAM_PATHS: [&str; 5] = [
    "no-iommu",
    "strict",
    "deferred",
    "virtio-strict",
    "virtio-deferred",
];
/// Rows of the stream table (for the progress bar).
const STREAM_ROWS: usize = STREAM_PATHS.len();
/// Requests in flight at most (default): a NIC-like ring of 256 buffers.
const IN_FLIGHT: usize = 256;
/// Requests mapped and sent per batch (default): a NAPI-like budget of 64.
const STREAM_BATCH: usize = 64;
/// First IOVA of the per-request mappings: above every user address, so
/// never one of the identity mappings of shared memory.
const STREAM_IOVA: u64 = 1 << 47;
/// IOVA slots the per-request mappings rotate through (an IOVA is reused
/// only long after its unmap, as an IOVA allocator does).
const STREAM_SLOTS: u64 = 4096;
/// Requests one kick may carry (the protocol's limit).
const KICK_MAX: usize = wd_proto::limits::MAX_VIRTIO_REQS;
/// virtio-iommu domain the virtio rows attach their queue to.
const VIRTIO_DOMAIN: u32 = 1;

#[derive(Clone, Debug, Serialize)]
struct StreamRow {
    path: &'static str,
    /// What one request's mapping costs on this path.
    model: &'static str,
    ops_per_sec: f64,
    gbytes_per_sec: f64,
    /// Throughput / the no-iommu row's (median over the rounds of the ratio
    /// within a round).
    vs_no_iommu: f64,
    /// CPU per request of no-iommu / this row's: the throughput ratio a
    /// CPU-bound machine would see.
    cpu_efficiency: f64,
    /// IOMMU syncs per request (invalidations waited for).
    syncs_per_req: f64,
    /// Mean wait of a sync that found an engine busy.
    sync_wait_us: f64,
    /// Socket round trips per request (virtio-iommu kicks).
    kicks_per_req: f64,
    /// CPU time of the whole process (client, host threads, engine) per
    /// request: what the path costs, whatever else the machine runs.
    cpu_us_per_req: f64,
}

#[derive(Debug, Serialize)]
struct StreamTable {
    request_size: u64,
    in_flight: usize,
    batch: usize,
    rows: Vec<StreamRow>,
}

/// How a row maps a request's buffers before it is sent and unmaps them
/// after it completed.
enum Mapper {
    /// Buffers mapped once (their identity mappings); nothing per request.
    Static,
    /// The host's DMA API called directly (as a kernel driver would): one
    /// map per buffer before, one unmap per buffer after, in the queue's own
    /// domain (strict: each unmap waits for its invalidation; deferred: a
    /// flush queue).
    HostDma { dom: Arc<Domain>, next: u64 },
    /// virtio-iommu, unoptimised: one kick with the request's MAPs before,
    /// one kick with its UNMAPs after (strict domain).
    VirtioEach {
        h: Arc<wrapdrive::HostConn>,
        next: u64,
        kicks: u64,
    },
    /// virtio-iommu, batched and deferred: one kick per batch carrying the
    /// MAPs of the batch and the UNMAPs queued since the last kick (deferred
    /// domain: its flush queue completes them).
    VirtioBatched {
        h: Arc<wrapdrive::HostConn>,
        next: u64,
        kicks: u64,
        pending: Vec<wrapdrive::virtio::Request>,
    },
}

/// A request's buffers: (src, dst) in the client (guest-physical) and host
/// address spaces.
#[derive(Clone, Copy)]
struct Pair {
    gpa: (u64, u64),
    host: (u64, u64),
}

fn vstatus_ok(st: &[Option<wrapdrive::virtio::Status>]) -> Result<(), String> {
    match st
        .iter()
        .find(|s| **s != Some(wrapdrive::virtio::Status::Ok))
    {
        None => Ok(()),
        Some(s) => Err(format!("virtio-iommu request failed: {s:?}")),
    }
}

/// Send virtio-iommu requests in kicks of at most KICK_MAX; returns the
/// kicks made.
fn kick_all(h: &wrapdrive::HostConn, reqs: &[wrapdrive::virtio::Request]) -> Result<u64, String> {
    let mut kicks = 0;
    for chunk in reqs.chunks(KICK_MAX) {
        let st = h.virtio_requests(chunk).map_err(|e| e.to_string())?;
        vstatus_ok(&st)?;
        kicks += 1;
    }
    Ok(kicks)
}

impl Mapper {
    fn slot(next: &mut u64, size: u64) -> (u64, u64) {
        let k = *next % STREAM_SLOTS;
        *next += 1;
        let base = STREAM_IOVA + k * 2 * size;
        (base, base + size)
    }

    fn kicks(&self) -> u64 {
        match self {
            Mapper::VirtioEach { kicks, .. } | Mapper::VirtioBatched { kicks, .. } => *kicks,
            _ => 0,
        }
    }

    /// Map the buffers of a batch; returns the (src, dst) device addresses.
    fn map(&mut self, pairs: &[Pair], size: u64, out: &mut Vec<(u64, u64)>) -> Result<(), String> {
        use wrapdrive::virtio::{Request, VIRTIO_IOMMU_MAP_F_READ, VIRTIO_IOMMU_MAP_F_WRITE};
        out.clear();
        let map = |iova: u64, gpa: u64, flags: u32| Request::Map {
            domain: VIRTIO_DOMAIN,
            virt_start: iova,
            virt_end: iova + size - 1,
            phys_start: gpa,
            flags,
        };
        match self {
            Mapper::Static => out.extend(pairs.iter().map(|p| p.gpa)),
            Mapper::HostDma { dom, next } => {
                for p in pairs {
                    let (s, d) = Mapper::slot(next, size);
                    dom.map(s, p.host.0, size, Prot::READ)
                        .and_then(|_| dom.map(d, p.host.1, size, Prot::WRITE))
                        .map_err(|e| e.to_string())?;
                    out.push((s, d));
                }
            }
            Mapper::VirtioEach { h, next, kicks } => {
                for p in pairs {
                    let (s, d) = Mapper::slot(next, size);
                    let st = h
                        .virtio_requests(&[
                            map(s, p.gpa.0, VIRTIO_IOMMU_MAP_F_READ),
                            map(d, p.gpa.1, VIRTIO_IOMMU_MAP_F_WRITE),
                        ])
                        .map_err(|e| e.to_string())?;
                    *kicks += 1;
                    vstatus_ok(&st)?;
                    out.push((s, d));
                }
            }
            Mapper::VirtioBatched {
                h,
                next,
                kicks,
                pending,
            } => {
                // The queued UNMAPs go first, in the same kick when they fit.
                let mut reqs = std::mem::take(pending);
                for p in pairs {
                    let (s, d) = Mapper::slot(next, size);
                    reqs.push(map(s, p.gpa.0, VIRTIO_IOMMU_MAP_F_READ));
                    reqs.push(map(d, p.gpa.1, VIRTIO_IOMMU_MAP_F_WRITE));
                    out.push((s, d));
                }
                *kicks += kick_all(h, &reqs)?;
            }
        }
        Ok(())
    }

    /// Unmap the buffers of completed requests.
    fn unmap(&mut self, done: &[(u64, u64)], size: u64) -> Result<(), String> {
        use wrapdrive::virtio::Request;
        let unmap = |iova: u64| Request::Unmap {
            domain: VIRTIO_DOMAIN,
            virt_start: iova,
            virt_end: iova + size - 1,
            reserved: [0; 4],
        };
        match self {
            Mapper::Static => {}
            Mapper::HostDma { dom, .. } => {
                for &(s, d) in done {
                    dom.unmap(s, size).map_err(|e| e.to_string())?;
                    dom.unmap(d, size).map_err(|e| e.to_string())?;
                }
            }
            Mapper::VirtioEach { h, kicks, .. } => {
                for &(s, d) in done {
                    let st = h
                        .virtio_requests(&[unmap(s), unmap(d)])
                        .map_err(|e| e.to_string())?;
                    *kicks += 1;
                    vstatus_ok(&st)?;
                }
            }
            Mapper::VirtioBatched {
                h, kicks, pending, ..
            } => {
                for &(s, d) in done {
                    pending.push(unmap(s));
                    pending.push(unmap(d));
                }
                // Bounded: a long run of completions is sent on its own.
                if pending.len() >= KICK_MAX {
                    *kicks += kick_all(h, &std::mem::take(pending))?;
                }
            }
        }
        Ok(())
    }

    /// Send what is still queued (end of a measurement).
    fn drain(&mut self) -> Result<(), String> {
        if let Mapper::VirtioBatched {
            h, kicks, pending, ..
        } = self
        {
            if !pending.is_empty() {
                *kicks += kick_all(h, &std::mem::take(pending))?;
            }
        }
        Ok(())
    }
}

struct StreamPath {
    name: &'static str,
    q: wrapdrive::Queue,
    mapper: Mapper,
}

/// Keep one request per buffer pair going for `secs`, mapping each batch
/// before it is sent and unmapping each completion: returns requests/s and
/// the requests done.
fn stream_run(
    p: &mut StreamPath,
    pairs: &[Pair],
    size: u64,
    secs: f64,
    batch: usize,
) -> Result<(f64, u64, f64), String> {
    let in_flight = pairs.len();
    use wd_dummy_msg::CopyMsg;
    let mut free: Vec<usize> = (0..in_flight).collect();
    let mut inflight: Vec<(u64, u64)> = vec![(0, 0); in_flight];
    let mut iovas = Vec::with_capacity(batch);
    let mut batch_pairs = Vec::with_capacity(batch);
    let mut reqs = Vec::with_capacity(batch);
    let mut done = Vec::with_capacity(in_flight);
    let mut unmaps = Vec::with_capacity(in_flight);
    let mut count = 0u64;
    let warm = Duration::from_millis(30);
    let total = Duration::from_secs_f64(secs) + warm;
    let t0 = Instant::now();
    let mut measured_from: Option<(Instant, u64, Duration)> = None;
    loop {
        let el = t0.elapsed();
        if measured_from.is_none() && el >= warm {
            measured_from = Some((Instant::now(), count, wd_sys::process_cpu_time()));
        }
        if el >= total {
            break;
        }
        if free.len() >= batch {
            let slots: Vec<usize> = (0..batch).map(|_| free.pop().expect("counted")).collect();
            batch_pairs.clear();
            batch_pairs.extend(slots.iter().map(|&k| pairs[k]));
            p.mapper.map(&batch_pairs, size, &mut iovas)?;
            reqs.clear();
            for (k, &(s, d)) in slots.iter().zip(iovas.iter()) {
                inflight[*k] = (s, d);
                reqs.push((
                    CopyMsg {
                        src: s,
                        dst: d,
                        len: size,
                    }
                    .to_desc(0),
                    *k as u64,
                ));
            }
            let n = p.q.send_batch(&reqs).map_err(|e| e.to_string())?;
            if n != reqs.len() {
                return Err(format!("queue accepted {n} of {}", reqs.len()));
            }
        }
        done.clear();
        if free.len() < batch {
            // Not enough room for the next batch: wait for a completion
            // (as an interrupt-driven driver does) rather than poll hot,
            // which would steal the engine's CPU on a small machine.
            done.push(
                p.q.recv_sync(Some(Duration::from_secs(10)))
                    .map_err(|e| e.to_string())?,
            );
        }
        p.q.recv_batch(&mut done, in_flight)
            .map_err(|e| e.to_string())?;
        unmaps.clear();
        for c in &done {
            if c.desc.status != 0 {
                return Err(format!(
                    "{}: request failed with status {}",
                    p.name, c.desc.status
                ));
            }
            let k = c.cookie as usize;
            unmaps.push(inflight[k]);
            free.push(k);
        }
        count += done.len() as u64;
        p.mapper.unmap(&unmaps, size)?;
    }
    let (from, c0, cpu0) = measured_from.unwrap_or((t0, 0, Duration::ZERO));
    let rate = (count - c0) as f64 / from.elapsed().as_secs_f64();
    let cpu_us =
        (wd_sys::process_cpu_time() - cpu0).as_secs_f64() * 1e6 / (count - c0).max(1) as f64;
    // Let what is in flight finish, so the next run starts empty.
    while free.len() < in_flight {
        let c =
            p.q.recv_sync(Some(Duration::from_secs(10)))
                .map_err(|e| e.to_string())?;
        free.push(c.cookie as usize);
        let k = c.cookie as usize;
        p.mapper.unmap(&[inflight[k]], size)?;
    }
    p.mapper.drain()?;
    Ok((rate, count, cpu_us))
}

fn stream_table(args: &IommuArgs, prog: &mut Progress) -> Result<StreamTable, String> {
    use wrapdrive::virtio::Request;
    use wrapdrive::{Capability, FaultPolicy, InvalidationMode, SharedBuf};
    let size = args.request_size;
    if size == 0 || size % PAGE_SIZE != 0 || size > (16 << 20) {
        return Err("--request-size must be a multiple of 4096, at most 16 MiB".into());
    }
    let in_flight = args.in_flight;
    if !(1..=4096).contains(&in_flight) || !(1..=in_flight).contains(&args.batch) {
        return Err("need --in-flight in 1..=4096 and --batch in 1..=in-flight".into());
    }
    if in_flight as u64 * 2 * size > (1 << 30) {
        return Err("--in-flight x --request-size x 2 buffers exceeds 1 GiB".into());
    }
    let host = Arc::new(
        wd_host::Host::embedded(vec![wd_host::DeviceConfig::new("dummy")])
            .map_err(|e| e.to_string())?,
    );
    let conn = wd_embedded::connect_to(&host).map_err(|e| e.to_string())?;
    let bufs: Vec<(SharedBuf, SharedBuf)> = (0..in_flight)
        .map(|_| {
            let s = SharedBuf::new(size as usize)?;
            let d = SharedBuf::new(size as usize)?;
            s.write(0, &vec![0x5a; size as usize]);
            Ok((s, d))
        })
        .collect::<Result<_, wrapdrive::ClientError>>()
        .map_err(|e| e.to_string())?;
    let mut paths = Vec::new();
    let mut pairs: Vec<Pair> = Vec::new();
    for name in STREAM_PATHS {
        if name != "no-iommu" && !args.paths.iter().any(|p| p == name) {
            continue;
        }
        // A virtio row's queue has a connection of its own, hence its own
        // virtio-iommu device, domain and guest memory.
        let c = if name.starts_with("virtio") {
            wd_embedded::connect_to(&host).map_err(|e| e.to_string())?
        } else {
            conn.clone()
        };
        let mut q = c
            .request_queue(&Capability::new("memcpy").depth(in_flight.next_power_of_two() as u32))
            .map_err(|e| e.to_string())?;
        // Registration: the buffers become the queue's memory (and the
        // connection's guest-physical memory for virtio-iommu).
        for (s, d) in &bufs {
            q.share(s.addr(), s.len()).map_err(|e| e.to_string())?;
            q.share(d.addr(), d.len()).map_err(|e| e.to_string())?;
        }
        let hq = host
            .inner()
            .queues
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&q.id())
            .cloned()
            .ok_or("the host does not know the queue")?;
        let dom = hq.domain().clone();
        if pairs.is_empty() {
            for (s, d) in &bufs {
                let host_of = |a: u64| dom.iova_to_phys(a).ok_or("shared memory not mapped");
                pairs.push(Pair {
                    gpa: (s.addr(), d.addr()),
                    host: (host_of(s.addr())?, host_of(d.addr())?),
                });
            }
        }
        let deferred = name.ends_with("deferred");
        let mode = if deferred {
            InvalidationMode::Deferred
        } else {
            InvalidationMode::Strict
        };
        q.set_iommu_policy(mode, FaultPolicy::Abort)
            .map_err(|e| e.to_string())?;
        let mapper = match name {
            "no-iommu" => Mapper::Static,
            "strict" | "deferred" => Mapper::HostDma { dom, next: 0 },
            _ => {
                let h = q.host().clone();
                let st = h
                    .virtio_requests(&[Request::Attach {
                        domain: VIRTIO_DOMAIN,
                        endpoint: q.id(),
                        flags: 0,
                        reserved: [0; 4],
                    }])
                    .map_err(|e| e.to_string())?;
                vstatus_ok(&st)?;
                if deferred {
                    Mapper::VirtioBatched {
                        h,
                        next: 0,
                        kicks: 0,
                        pending: Vec::new(),
                    }
                } else {
                    Mapper::VirtioEach {
                        h,
                        next: 0,
                        kicks: 0,
                    }
                }
            }
        };
        paths.push(StreamPath { name, q, mapper });
    }
    let iommu = host.inner().iommu.clone();
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); paths.len()];
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); paths.len()];
    let mut syncs = vec![0u64; paths.len()];
    let mut waited = vec![0u64; paths.len()];
    let mut wait_ns = vec![0u64; paths.len()];
    let mut reqs = vec![0u64; paths.len()];
    let mut kicks = vec![0u64; paths.len()];
    // Repetitions interleave the rows, so drift on a shared machine hits
    // them alike.
    for _ in 0..args.reps {
        for (i, p) in paths.iter_mut().enumerate() {
            prog.step(&format!("stream {}", p.name));
            let s0 = iommu.stats();
            let k0 = p.mapper.kicks();
            let (rate, n, c) = stream_run(p, &pairs, size, args.seconds, args.batch)?;
            let s1 = iommu.stats();
            rates[i].push(rate);
            cpu[i].push(c);
            syncs[i] += s1.syncs - s0.syncs;
            waited[i] += s1.waited_syncs - s0.waited_syncs;
            wait_ns[i] += s1.wait_ns - s0.wait_ns;
            kicks[i] += p.mapper.kicks() - k0;
            reqs[i] += n;
        }
    }
    // Each row against the baseline measured in the same round, a moment
    // earlier: the median of those ratios cancels the machine's drift.
    let ratios: Vec<f64> = (0..paths.len())
        .map(|i| {
            let r: Vec<f64> = rates[i].iter().zip(&rates[0]).map(|(r, b)| r / b).collect();
            median(&r)
        })
        .collect();
    let medians: Vec<f64> = rates.iter().map(|r| median(r)).collect();
    let cpu: Vec<f64> = cpu.iter().map(|c| median(c)).collect();
    let rows = paths
        .iter()
        .enumerate()
        .map(|(i, p)| StreamRow {
            path: p.name,
            model: match p.name {
                "no-iommu" => "buffers mapped once; no per-request map/unmap",
                "strict" => "host DMA API: map each buffer, unmap each after; every unmap waits for its invalidation",
                "deferred" => "host DMA API: map each buffer, unmap each after; unmaps flushed in batches (flush queue)",
                "virtio-strict" => "virtio-iommu: one kick of MAPs before each request, one kick of UNMAPs after; strict domain",
                _ => "virtio-iommu: one kick per batch (its MAPs + UNMAPs queued since); deferred domain",
            },
            ops_per_sec: medians[i],
            gbytes_per_sec: medians[i] * size as f64 / 1e9,
            vs_no_iommu: ratios[i],
            cpu_efficiency: cpu[0] / cpu[i],
            syncs_per_req: syncs[i] as f64 / reqs[i].max(1) as f64,
            // Host-wide counters: the timer's flushes of other rows' flush
            // queues land in whichever row runs; only a row that syncs
            // itself gets a figure.
            sync_wait_us: if waited[i] > 0 && syncs[i] * 100 >= reqs[i] {
                wait_ns[i] as f64 / 1e3 / waited[i] as f64
            } else {
                0.0
            },
            kicks_per_req: kicks[i] as f64 / reqs[i].max(1) as f64,
            cpu_us_per_req: cpu[i],
        })
        .collect();
    drop(paths);
    drop(bufs);
    Ok(StreamTable {
        request_size: size,
        in_flight,
        batch: args.batch,
        rows,
    })
}

fn stream_targets(s: &StreamTable) -> Vec<Target> {
    let row = |p: &str| s.rows.iter().find(|r| r.path == p).map(|r| r.vs_no_iommu);
    let mut t = Vec::new();
    if let Some(v) = row("deferred") {
        t.push(Target::at_least(
            "deferred stream throughput / no-iommu",
            v,
            0.9,
        ));
    }
    if let Some(v) = row("virtio-deferred") {
        t.push(Target::at_least(
            "virtio-iommu deferred stream throughput / no-iommu",
            v,
            0.8,
        ));
    }
    t
}

fn print_stream(s: &StreamTable, args: &IommuArgs) {
    println!(
        "DMA stream, strict vs deferred invalidation, host DMA API vs virtio-iommu: memcpy requests of {} through the dummy device, {} in flight, batches of {}, every request's buffers mapped before and unmapped after; medians of {} reps x {} s",
        exact_size(s.request_size),
        s.in_flight,
        s.batch,
        args.reps,
        args.seconds
    );
    println!();
    println!("| path | req/s | GB/s | % of no-iommu | CPU us/req | CPU efficiency | syncs/req | sync wait | kicks/req |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &s.rows {
        println!(
            "| {} | {:.0} | {:.2} | {:.1}% | {:.2} | {:.1}% | {:.2} | {:.1} us | {:.3} |",
            r.path,
            r.ops_per_sec,
            r.gbytes_per_sec,
            r.vs_no_iommu * 100.0,
            r.cpu_us_per_req,
            r.cpu_efficiency * 100.0,
            r.syncs_per_req,
            r.sync_wait_us,
            r.kicks_per_req
        );
    }
    println!();
    for r in &s.rows {
        println!("  {}: {}", r.path, r.model);
    }
    println!();
}
