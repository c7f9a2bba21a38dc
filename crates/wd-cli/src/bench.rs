//! `wd bench`: the queue data path, measured in one run against the
//! machine's own limit (a raw shared-memory round trip between two threads)
//! and against the legacy one-system-call-per-request path.

use crate::report::outln;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::report::{median_by, percentile, print_json, Progress, Target};
use crate::units::{exact_size, size_arg};
use wd_dummy_msg::CopyMsg;
use wrapdrive::{Capability, HostConn, Queue, SharedBuf, CAPA_ALLOW_LEGACY};

/// Every path `wd bench` measures, in table order.
const PATHS: [&str; 6] = ["raw", "sync", "async-b1", "async-b8", "async-b32", "legacy"];

/// `wd bench [WHAT]`: the queue benchmark by default, or another one.
#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchCmd {
    #[command(subcommand)]
    which: Option<Which>,
    #[command(flatten)]
    queue: BenchArgs,
}

/// The benchmarks `wd bench` knows.
#[derive(clap::Subcommand)]
enum Which {
    /// The queue data path against the raw shared-memory limit and the legacy path (default).
    Queue(BenchArgs),
    /// The software IOMMU: map/unmap invalidation cost, strict/deferred/virtio-iommu DMA streams, translation cost.
    Iommu(crate::bench_iommu::IommuArgs),
    /// Loading files into shareable buffers (`wd load`) against buffered read(), O_DIRECT reads and the storage's own limit.
    Load(crate::bench_load::BenchLoadArgs),
    /// Latency of small requests while other clients flood the engine with huge copies or slow compressions.
    Fairness(crate::bench_fair::FairArgs),
    /// The mediated NVMe controller against io_uring on the same store (disk and memory).
    Nvme(crate::bench_nvme::BenchNvmeArgs),
    /// Compression on real data: the zip device (sync, async, auto) against the same engines in process and stock zlib, and programs through the drop-in zlib.
    Zip(crate::bench_zip::BenchZipArgs),
}

impl BenchCmd {
    /// Run the chosen benchmark against `host` (`wd --host`; default: an
    /// embedded host started for the run, so nothing else is needed).
    pub fn run(self, host: Option<&str>) -> Result<(), String> {
        if let (Some(h), Some(Which::Load(_) | Which::Nvme(_) | Which::Zip(_))) =
            (host, &self.which)
        {
            return Err(format!(
                "--host {h}: this benchmark runs its own host (or none)"
            ));
        }
        let host = host.unwrap_or("embedded");
        match self.which {
            None => run(self.queue, host),
            Some(Which::Queue(a)) => run(a, host),
            Some(Which::Iommu(a)) => crate::bench_iommu::run(a, host),
            Some(Which::Load(a)) => crate::bench_load::run(a),
            Some(Which::Fairness(a)) => crate::bench_fair::run(a, host),
            Some(Which::Nvme(a)) => crate::bench_nvme::run(a),
            Some(Which::Zip(a)) => crate::bench_zip::run(a),
        }
    }
}

/// Options of `wd bench queue`.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 0.25)]
    seconds: f64,
    /// Repetitions per measurement (the median is reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Request sizes in bytes (e.g. 64,4k,64k).
    #[arg(long, value_delimiter = ',', value_parser = size_arg, default_values_t = vec![64u64, 4096, 65536])]
    sizes: Vec<u64>,
    /// Paths to measure (raw and legacy are always measured: every ratio
    /// is against them).
    #[arg(long, value_delimiter = ',', default_values_t = PATHS.iter().map(|p| p.to_string()).collect::<Vec<_>>())]
    paths: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
struct Row {
    path: String,
    size: u64,
    ops_per_sec: f64,
    p50_ns: u64,
    p99_ns: u64,
    /// System calls issued by the client thread per request (wd-sys counter).
    syscalls_per_req: f64,
    /// Voluntary context switches of the client thread per request.
    csw_per_req: f64,
    /// Throughput divided by the raw limit's.
    vs_limit: f64,
    /// Throughput divided by the legacy path's.
    vs_legacy: f64,
}

struct Sample {
    ops: f64,
    lat: Vec<u64>,
    syscalls: f64,
    csw: f64,
}

/// Run `f` repeatedly for `secs`; `f` does some requests and returns their
/// latencies (ns) appended to the vector.
fn measure(secs: f64, mut f: impl FnMut(&mut Vec<u64>)) -> Sample {
    let mut lat = Vec::with_capacity(1 << 16);
    // Warm-up: caches, page faults, engine out of its sleep.
    let warm = Instant::now();
    while warm.elapsed() < Duration::from_millis(20) {
        f(&mut lat);
    }
    lat.clear();
    let sc0 = wd_sys::syscalls_on_this_thread();
    let (cs0, _) = wd_sys::thread_context_switches();
    let t0 = Instant::now();
    let limit = Duration::from_secs_f64(secs);
    while t0.elapsed() < limit {
        f(&mut lat);
    }
    let el = t0.elapsed().as_secs_f64();
    let n = lat.len().max(1) as f64;
    let (cs1, _) = wd_sys::thread_context_switches();
    Sample {
        ops: lat.len() as f64 / el,
        syscalls: (wd_sys::syscalls_on_this_thread() - sc0) as f64 / n,
        csw: (cs1 - cs0) as f64 / n,
        lat,
    }
}

/// The repetition of median throughput, its latencies sorted for
/// [`percentile`].
fn median_sample(s: Vec<Sample>) -> Sample {
    let mut m = median_by(s, |a, b| a.ops.total_cmp(&b.ops));
    m.lat.sort_unstable();
    m
}

/// The physical limit: one thread hands a request to another through
/// shared memory, the other copies `size` bytes and answers.
fn raw_round_trip(size: u64, secs: f64, reps: usize, cpu: Option<usize>) -> Vec<Sample> {
    let req = Arc::new(AtomicU64::new(0));
    let resp = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (r2, p2, s2) = (req.clone(), resp.clone(), stop.clone());
    let worker = std::thread::spawn(move || {
        if let Some(c) = cpu {
            let _ = wd_sys::pin_thread(c);
        }
        // Page-aligned source and destination, as the queue's shared
        // buffers are: two heap vectors a few bytes past a multiple of 4 KiB
        // apart make the CPU's string copy up to 30 times slower (4 KiB
        // aliasing), which would measure the allocator, not the machine.
        let page = 4096usize;
        let span = (size as usize).next_multiple_of(page);
        let mut mem = vec![0u8; 2 * span + page];
        let base = mem.as_ptr().align_offset(page);
        let (src, dst) = mem[base..base + 2 * span].split_at_mut(span);
        let (src, dst) = (&mut src[..size as usize], &mut dst[..size as usize]);
        src.fill(7);
        let mut last = 0;
        while !s2.load(Ordering::Relaxed) {
            let v = r2.load(Ordering::Acquire);
            if v == last {
                std::hint::spin_loop();
                continue;
            }
            dst.copy_from_slice(src);
            std::hint::black_box(&mut *dst);
            last = v;
            p2.store(v, Ordering::Release);
        }
    });
    let mut seq = 0u64;
    let out = (0..reps)
        .map(|_| {
            measure(secs, |lat| {
                for _ in 0..64 {
                    let t = Instant::now();
                    seq += 1;
                    req.store(seq, Ordering::Release);
                    while resp.load(Ordering::Acquire) != seq {
                        std::hint::spin_loop();
                    }
                    lat.push(t.elapsed().as_nanos() as u64);
                }
            })
        })
        .collect();
    stop.store(true, Ordering::Relaxed);
    let _ = worker.join();
    out
}

struct Bufs {
    src: SharedBuf,
    dst: SharedBuf,
}

impl Bufs {
    /// The request every path sends: copy `size` bytes from src to dst.
    fn copy_desc(&self, size: u64) -> wrapdrive::Desc {
        CopyMsg {
            src: self.src.addr(),
            dst: self.dst.addr(),
            len: size,
        }
        .to_desc(0)
    }
}

fn bufs(q: &mut Queue, size: u64) -> Result<Bufs, String> {
    let src = SharedBuf::new(size as usize).map_err(|e| e.to_string())?;
    let dst = SharedBuf::new(size as usize).map_err(|e| e.to_string())?;
    src.write(0, &vec![0xa5; size as usize]);
    if q.flags() & CAPA_ALLOW_LEGACY == 0 {
        q.share(src.addr(), src.len()).map_err(|e| e.to_string())?;
        q.share(dst.addr(), dst.len()).map_err(|e| e.to_string())?;
    }
    Ok(Bufs { src, dst })
}

fn sync_round_trip(
    q: &mut Queue,
    b: &Bufs,
    size: u64,
    secs: f64,
    reps: usize,
) -> Result<Vec<Sample>, String> {
    let desc = b.copy_desc(size);
    let mut err = None;
    let out = (0..reps)
        .map(|_| {
            measure(secs, |lat| {
                for _ in 0..16 {
                    let t = Instant::now();
                    match q.call(desc) {
                        Ok(d) if d.status == 0 => lat.push(t.elapsed().as_nanos() as u64),
                        Ok(d) => err = Some(format!("request failed with status {}", d.status)),
                        Err(e) => err = Some(e.to_string()),
                    }
                    if err.is_some() {
                        return;
                    }
                }
            })
        })
        .collect();
    match err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

fn async_stream(
    q: &mut Queue,
    b: &Bufs,
    size: u64,
    batch: usize,
    secs: f64,
    reps: usize,
) -> Result<Vec<Sample>, String> {
    let desc = b.copy_desc(size);
    let depth = q.depth() as usize;
    let mut sent_at: Vec<Instant> = vec![Instant::now(); depth];
    let mut free: Vec<u64> = (0..depth as u64).collect();
    let mut done = Vec::with_capacity(depth);
    let mut reqs = Vec::with_capacity(batch);
    let mut err: Option<String> = None;
    let out = (0..reps)
        .map(|_| {
            measure(secs, |lat| {
                for _ in 0..8 {
                    if free.len() >= batch {
                        reqs.clear();
                        let now = Instant::now();
                        for _ in 0..batch {
                            let c = free.pop().expect("counted");
                            sent_at[c as usize] = now;
                            reqs.push((desc, c));
                        }
                        match q.send_batch(&reqs) {
                            Ok(n) if n == batch => {}
                            Ok(n) => {
                                err = Some(format!("queue accepted {n} of {batch}"));
                                return;
                            }
                            Err(e) => {
                                err = Some(e.to_string());
                                return;
                            }
                        }
                    }
                    done.clear();
                    if let Err(e) = q.recv_batch(&mut done, depth) {
                        err = Some(e.to_string());
                        return;
                    }
                    let now = Instant::now();
                    for c in &done {
                        if c.desc.status != 0 {
                            err = Some(format!("request failed with status {}", c.desc.status));
                        }
                        lat.push(now.duration_since(sent_at[c.cookie as usize]).as_nanos() as u64);
                        free.push(c.cookie);
                    }
                }
            })
        })
        .collect();
    // Drain what is still in flight so the next measurement starts empty.
    while q.in_flight() > 0 {
        match q.recv_sync(Some(Duration::from_secs(5))) {
            Ok(_) => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    match err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// Run the benchmark.
fn run(mut args: BenchArgs, host: &str) -> Result<(), String> {
    // A size named twice is measured once (its rows and targets were
    // repeated).
    args.sizes.sort_unstable();
    args.sizes.dedup();
    if args.reps == 0 || !(0.01..=60.0).contains(&args.seconds) || args.sizes.is_empty() {
        return Err("need --reps >= 1, --seconds in 0.01..60 and at least one size".into());
    }
    if let Some(&s) = args.sizes.iter().find(|&&s| s == 0 || s > (1 << 20)) {
        return Err(format!(
            "size {s} out of range 1..=1048576 (the legacy path carries at most 1 MiB)"
        ));
    }
    let mut pinning = pin_ends(host);
    let host = HostConn::connect(host).map_err(|e| e.to_string())?;
    // After the embedded host started, so its other threads keep the
    // process's affinity.
    if pinning.responder.is_some() && wd_sys::pin_thread(pinning.client).is_err() {
        pinning = Pinning {
            client: 0,
            responder: None,
            text: "not pinned (sched_setaffinity refused)".into(),
        };
    }
    let mut q = host
        .request_queue(&Capability::new("memcpy").depth(256))
        .map_err(|e| e.to_string())?;
    let mut legacy = host
        .request_queue(
            &Capability::new("memcpy")
                .flags(CAPA_ALLOW_LEGACY)
                .depth(256),
        )
        .map_err(|e| e.to_string())?;
    legacy.set_legacy_planner(wd_dummy_msg::legacy_plan);
    if let Some(p) = args.paths.iter().find(|p| !PATHS.contains(&p.as_str())) {
        return Err(format!("unknown path '{p}' (known: {})", PATHS.join(", ")));
    }
    let paths: Vec<&str> = PATHS
        .iter()
        .copied()
        .filter(|p| matches!(*p, "raw" | "legacy") || args.paths.iter().any(|a| a == p))
        .collect();
    let mut prog = Progress::new(paths.len() * args.sizes.len() * args.reps);
    let mut rows: Vec<Row> = Vec::new();
    for &size in &args.sizes {
        let b = bufs(&mut q, size)?;
        let lb = bufs(&mut legacy, size)?;
        // Repetitions interleave the paths, so slow and fast moments of a
        // shared machine fall on every path alike.
        let mut per: Vec<Vec<Sample>> = paths.iter().map(|_| Vec::new()).collect();
        for rep in 0..args.reps {
            for (i, &p) in paths.iter().enumerate() {
                prog.step(&format!(
                    "{p} {} ({}/{})",
                    exact_size(size),
                    rep + 1,
                    args.reps
                ));
                let mut s = match p {
                    "raw" => raw_round_trip(size, args.seconds, 1, pinning.responder),
                    "sync" => sync_round_trip(&mut q, &b, size, args.seconds, 1)?,
                    "async-b1" => async_stream(&mut q, &b, size, 1, args.seconds, 1)?,
                    "async-b8" => async_stream(&mut q, &b, size, 8, args.seconds, 1)?,
                    "async-b32" => async_stream(&mut q, &b, size, 32, args.seconds, 1)?,
                    _ => sync_round_trip(&mut legacy, &lb, size, args.seconds, 1)?,
                };
                per[i].append(&mut s);
            }
        }
        let samples: Vec<(&str, Sample)> = paths
            .iter()
            .zip(per)
            .map(|(&p, s)| (p, median_sample(s)))
            .collect();
        q.unshare(b.src.addr(), b.src.len())
            .map_err(|e| e.to_string())?;
        q.unshare(b.dst.addr(), b.dst.len())
            .map_err(|e| e.to_string())?;
        let raw = samples[0].1.ops;
        let leg = samples.last().expect("legacy row").1.ops;
        for (p, s) in samples {
            rows.push(Row {
                path: p.to_string(),
                size,
                ops_per_sec: s.ops,
                p50_ns: percentile(&s.lat, 0.5),
                p99_ns: percentile(&s.lat, 0.99),
                syscalls_per_req: if p == "raw" { 0.0 } else { s.syscalls },
                csw_per_req: s.csw,
                vs_limit: s.ops / raw,
                vs_legacy: s.ops / leg,
            });
        }
    }
    prog.finish();
    let targets = targets(&rows);
    if args.json {
        let v = serde_json::json!({
            "benchmark": "queue",
            "seconds": args.seconds,
            "reps": args.reps,
            "rows": rows,
            "targets": targets,
            "syscall_counting": METHOD,
            "pinning": pinning.text,
        });
        print_json(&v);
        return Ok(());
    }
    outln!("| path | size | ops/s | p50 | p99 | syscalls/req | csw/req | x limit | x legacy |");
    outln!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        outln!(
            "| {} | {} | {:.0} | {:.2} us | {:.2} us | {:.3} | {:.3} | {:.2} | {:.1} |",
            r.path,
            exact_size(r.size),
            r.ops_per_sec,
            r.p50_ns as f64 / 1000.0,
            r.p99_ns as f64 / 1000.0,
            r.syscalls_per_req,
            r.csw_per_req,
            r.vs_limit,
            r.vs_legacy
        );
    }
    outln!();
    for t in &targets {
        outln!("{}", t.line());
    }
    outln!("\nSystem calls: {METHOD}");
    outln!("CPUs: {}", pinning.text);
    outln!(
        "Medians of {} repetitions x {} s each.",
        args.reps,
        args.seconds
    );
    Ok(())
}

/// Where the two ends of every measurement run.
struct Pinning {
    /// CPU of this (client) thread, when `responder` is some.
    client: usize,
    /// CPU of the raw measurement's responder (the engine's stand-in).
    responder: Option<usize>,
    text: String,
}

/// Plan the pinning: this (client) thread on the first CPU the process
/// may use (pinned by the caller once connected), the engine of an
/// embedded host and the raw responder on the second, so the raw limit
/// and the queue paths are measured between the same two CPUs (under
/// `taskset` or a cpuset too: a host refuses a CPU it may not use).
fn pin_ends(host: &str) -> Pinning {
    let cpus =
        wd_host::config::allowed_cpus().unwrap_or_else(|| (0..wd_sys::usable_cpus()).collect());
    let [client, other, ..] = cpus[..] else {
        return Pinning {
            client: 0,
            responder: None,
            text: "not pinned (fewer than two usable CPUs)".into(),
        };
    };
    let engine = if host != "embedded" {
        "the external host's engine where that host put it".to_string()
    } else if std::env::var_os("WD_EMBEDDED_DEVICES").is_some() {
        "the engine where WD_EMBEDDED_DEVICES put it".to_string()
    } else {
        // Read when the embedded host starts (the connection below).
        std::env::set_var("WD_EMBEDDED_DEVICES", format!("dummy:cpu={other}"));
        format!("the engine on CPU {other}")
    };
    Pinning {
        client,
        responder: Some(other),
        text: format!("client thread on CPU {client}, raw responder on CPU {other}, {engine}"),
    }
}

const METHOD: &str = "every system call the client library makes goes through the wd-sys layer, which counts them per thread; syscalls/req is that counter's delta over the measured loop divided by the requests completed, and csw/req the thread's voluntary context switches (getrusage RUSAGE_THREAD), which any blocking call would raise";

fn targets(rows: &[Row]) -> Vec<Target> {
    let find = |p: &str, s: u64| rows.iter().find(|r| r.path == p && r.size == s);
    let mut t = Vec::new();
    let sizes: Vec<u64> = {
        let mut v: Vec<u64> = rows.iter().map(|r| r.size).collect();
        v.dedup();
        v
    };
    for &s in &sizes {
        if let (Some(raw), Some(sync)) = (find("raw", s), find("sync", s)) {
            // A time ratio: how many raw round trips one queue round trip
            // takes (the ring's cost over the cache-line limit).
            let v = raw.ops_per_sec / sync.ops_per_sec;
            t.push(Target::at_most(
                format!("sync round trip / raw round trip at {}", exact_size(s)),
                v,
                1.5,
            ));
        }
    }
    if let Some(a) = find("async-b32", 64).or_else(|| find("async-b32", sizes[0])) {
        t.push(Target::at_least(
            format!(
                "async batch-32 throughput / raw round-trip rate at {}",
                exact_size(a.size)
            ),
            a.vs_limit,
            4.0,
        ));
        t.push(Target::at_least(
            format!(
                "async batch-32 throughput / legacy at {}",
                exact_size(a.size)
            ),
            a.vs_legacy,
            20.0,
        ));
    }
    // (Only when those paths ran: none measured is no pass.)
    let steady = rows
        .iter()
        .filter(|r| r.path.starts_with("async") || r.path == "sync")
        .map(|r| r.syscalls_per_req)
        .reduce(f64::max);
    if let Some(steady) = steady {
        t.push(Target::at_most(
            "system calls per request, sync and async paths (worst row)",
            steady,
            0.01,
        ));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(path: &str, size: u64, ops_per_sec: f64) -> Row {
        Row {
            path: path.into(),
            size,
            ops_per_sec,
            p50_ns: 1,
            p99_ns: 1,
            syscalls_per_req: 0.0,
            csw_per_req: 0.0,
            vs_limit: 1.0,
            vs_legacy: 1.0,
        }
    }

    /// A target is judged only on rows measured: with the raw path alone
    /// the system-call target passed on a worst row of 0 nobody measured.
    #[test]
    fn targets_come_from_measured_rows_only() {
        assert!(targets(&[row("raw", 64, 1e6)]).is_empty());
        let t = targets(&[row("raw", 64, 1e6), row("sync", 64, 5e5)]);
        assert_eq!(t.len(), 2, "the round-trip ratio and the system calls");
    }
}
