//! `wd bench iommu`: what the software IOMMU costs, in one run.
//!
//! 1. Seed 003 (batched TLB maintenance): map and unmap of 128 KiB, 4 MiB
//!    and ~18 MiB scatter lists, one call and one synchronous invalidation
//!    per leaf ("before") against one call and one gathered range
//!    invalidation ("after"), for 4 KiB pages and for 2 MiB blocks where the
//!    memory is contiguous. An engine thread keeps translating and copying
//!    through the same domain meanwhile, as a device serving other requests
//!    does, so every sync waits for a real acknowledgement.
//! 2. Seed 001 (strict against deferred invalidation, emulated against
//!    para-virtual IOMMU): a DMA stream through the dummy device where every
//!    request's buffers are mapped before and unmapped after, as % of the
//!    throughput without per-request mapping.
//! 3. The hot path: translating a request's range with IOTLB hits, next to
//!    a memcpy of the same size.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
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
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Engine threads kept busy translating during the map/unmap runs
    /// (0: every sync finds the engines idle).
    #[arg(long, default_value_t = 1)]
    engines: usize,
    /// Seconds per DMA-stream measurement.
    #[arg(long, default_value_t = 0.3)]
    seconds: f64,
    /// Bytes per request of the DMA stream.
    #[arg(long, default_value_t = 65536)]
    request_size: u64,
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

// ------------------------------------------------------------ progress

struct Progress {
    total: usize,
    done: usize,
    tty: bool,
}

impl Progress {
    fn step(&mut self, what: &str) {
        self.done += 1;
        if self.tty {
            let w = 30;
            let fill = w * self.done.min(self.total) / self.total.max(1);
            eprint!(
                "\r[{}{}] {}/{} {what:<36}",
                "#".repeat(fill),
                " ".repeat(w - fill),
                self.done,
                self.total
            );
            let _ = std::io::stderr().flush();
        }
    }
    fn finish(&self) {
        if self.tty {
            eprintln!();
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return 0.0;
    }
    v[v.len() / 2]
}

fn human(n: u64) -> String {
    match n {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 20 => format!("~{} MiB", (n + (1 << 19)) >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}

#[derive(Debug, Serialize)]
struct Target {
    name: String,
    value: f64,
    op: &'static str,
    target: f64,
    met: bool,
}

fn at_least(name: String, value: f64, target: f64) -> Target {
    Target {
        name,
        value,
        op: ">=",
        target,
        met: value >= target,
    }
}

// ------------------------------------------------------------ seed 003

/// Sizes of the seed's table: 128 KiB, 4 MiB and ~18 MiB (18 MiB + 340 KiB,
/// "around 17-19M" in the seed).
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
}

/// A busy engine: sections translating 64 KiB of its window and copying
/// 64 KiB, back to back, until stopped.
fn busy_engine(
    iommu: Arc<Iommu>,
    dom: Arc<Domain>,
    stop: Arc<AtomicBool>,
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
    let engines: Vec<_> = (0..args.engines)
        .map(|_| busy_engine(iommu.clone(), dom.clone(), stop.clone()))
        .collect();
    // Let the engines get going before the first measurement.
    std::thread::sleep(std::time::Duration::from_millis(30));
    let mut rows = Vec::new();
    let mut result = Ok(());
    'outer: for layout in ["4k-scatter", "2m-contiguous"] {
        for &size in &MAP_SIZES {
            prog.step(&format!("map/unmap {layout} {}", human(size)));
            let leaves = layout_leaves(layout, size);
            let (mut mb, mut ma, mut ub, mut ua) = (vec![], vec![], vec![], vec![]);
            let (mut sb, mut sa, mut wb) = (0u64, 0u64, 0u64);
            let mut wait_ns = 0u64;
            for _ in 0..args.reps {
                // Before: one call and one sync per leaf.
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
                let t = Instant::now();
                if let Err(e) = dom.map_sg(MAP_IOVA, &leaves, Prot::RW) {
                    result = Err(e.to_string());
                    break 'outer;
                }
                ma.push(t.elapsed().as_secs_f64() * 1e6);
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
            let (mb, ma, ub, ua) = (median(mb), median(ma), median(ub), median(ua));
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
                    wait_ns as f64 / 1e3 / sb as f64
                } else {
                    0.0
                },
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
            prog.step(&format!("translate {layout} {}", human(size)));
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
            let (t, m) = (median(tv), median(mv));
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
    let want = |p: &str| args.parts.iter().any(|x| x == p);
    let mut prog = Progress {
        total: want("map") as usize * 6
            + want("stream") as usize * crate::bench_iommu::STREAM_ROWS
            + want("translate") as usize * 8,
        done: 0,
        tty: std::io::stderr().is_terminal() && !args.json,
    };
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
        targets.push(at_least(
            format!(
                "unmap of {} (4 KiB pages): per-page / gathered",
                human(r.size)
            ),
            r.unmap_ratio,
            27.0,
        ));
        targets.push(at_least(
            format!("map of {} (4 KiB pages): per-page / map_sg", human(r.size)),
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
        println!("{}", serde_json::to_string_pretty(&v).expect("json"));
        return Ok(());
    }
    if !map_rows.is_empty() {
        println!(
            "Map/unmap (seed 003): one call + one sync per leaf (before) vs one call + one gathered sync (after); {} busy engine(s); medians of {} reps",
            args.engines, args.reps
        );
        println!();
        println!("| layout | size | leaves | map before | map after | x | unmap before | unmap after | x | syncs before/after | sync wait |");
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for r in &map_rows {
            println!(
                "| {} | {} | {} | {:.1} us | {:.1} us | {:.1} | {:.1} us | {:.1} us | {:.1} | {:.0} / {:.0} | {:.2} us |",
                r.layout,
                human(r.size),
                r.leaves,
                r.map_before_us,
                r.map_after_us,
                r.map_ratio,
                r.unmap_before_us,
                r.unmap_after_us,
                r.unmap_ratio,
                r.unmap_syncs_before,
                r.unmap_syncs_after,
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
                human(r.size),
                r.translate_ns,
                r.memcpy_ns,
                r.ratio
            );
        }
        println!();
    }
    for t in &targets {
        println!(
            "{} {}: {:.2} (target {} {})",
            if t.met { "PASS" } else { "MISS" },
            t.name,
            t.value,
            t.op,
            t.target
        );
    }
    Ok(())
}

// ------------------------------------------------------------ seed 001

/// Rows of the stream table (for the progress bar).
const STREAM_ROWS: usize = 0;

#[derive(Debug, Serialize)]
struct StreamTable {}

fn stream_table(_args: &IommuArgs, _prog: &mut Progress) -> Result<StreamTable, String> {
    Err("the DMA-stream benchmark needs the host wiring (not built yet)".into())
}

fn stream_targets(_s: &StreamTable) -> Vec<Target> {
    Vec::new()
}

fn print_stream(_s: &StreamTable, _args: &IommuArgs) {}
