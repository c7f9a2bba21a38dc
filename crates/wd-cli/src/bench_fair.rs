//! `wd bench fairness`: how long a small request waits when other clients
//! keep the same engine busy with huge requests. Each flooder is a client
//! with its own connection and queue, keeping its ring full of large
//! copies (or, with `--device zip`, compressing large blocks at a slow
//! level one after another, or with `--zip-decompress` decompressing a
//! long stream again and again); the measured client sends 64-byte requests
//! of the same device one at a time and records each round trip. Rows: 0
//! flooders (the baseline of the same run) and more.

use crate::report::outln;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::report::{median_by, percentile, print_json, Progress, Target};
use crate::units::{exact_size, size_arg};
use wd_dummy_msg::CopyMsg;
use wrapdrive::{Capability, HostConn, SharedBuf};

/// The device the flooders and the measured client use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum Device {
    /// The dummy device: copies.
    Memcpy,
    /// The zip device: compressions (the measured client's at zstd 3).
    Zip,
}

/// Options of `wd bench fairness`.
#[derive(clap::Args)]
pub struct FairArgs {
    /// The device to flood and measure.
    #[arg(long, value_enum, default_value = "memcpy")]
    device: Device,
    /// The flooders' compression with `--device zip`, ALG:LEVEL.
    #[arg(long, default_value = "zstd:19")]
    zip_flood: String,
    /// With `--device zip`, the flooders decompress (a stream of
    /// `--flood-bytes` they compressed once with `--zip-flood`) instead of
    /// compressing.
    #[arg(long)]
    zip_decompress: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Seconds the small client measures per repetition.
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,
    /// Repetitions per row (the median row by p99 is reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Numbers of flooding clients, one row each.
    #[arg(long, value_delimiter = ',', default_values_t = vec![0usize, 1, 2, 4])]
    flooders: Vec<usize>,
    /// Bytes of each flooding request (e.g. 64M; default 64M of copies,
    /// 4M of compression, seconds of work at zstd 19).
    #[arg(long, value_parser = size_arg)]
    flood_bytes: Option<u64>,
    /// Copies each flooder keeps in flight.
    #[arg(long, default_value_t = 4)]
    flood_depth: usize,
    /// Bytes of each measured request (e.g. 64, 4k).
    #[arg(long, value_parser = size_arg, default_value_t = 64)]
    size: u64,
}

#[derive(Debug, Serialize)]
struct Row {
    flooders: usize,
    requests: usize,
    p50_ns: u64,
    p99_ns: u64,
    max_ns: u64,
    /// Flooders' throughput meanwhile (bytes copied or compressed), per
    /// second.
    flood_bytes_per_sec: f64,
    /// p99 over the row without flooders' (the table's "p99 / no flood").
    p99_vs_no_flood: Option<f64>,
}

/// What one flooder keeps doing.
#[derive(Clone, Copy)]
struct Flood {
    device: Device,
    bytes: u64,
    depth: usize,
    zip: (wd_comp::Algorithm, i8),
    decompress: bool,
}

/// A compressor on `host` sending everything to the zip device.
fn offloading(host: &str, depth: usize) -> Result<wd_comp::Compressor, String> {
    let h = HostConn::connect(host).map_err(|e| e.to_string())?;
    let mut c = wd_comp::Compressor::new(
        Some(h),
        wd_comp::Config {
            policy: wd_comp::Policy::Offload,
            threshold: 0,
            fallback: false,
            depth,
            ..wd_comp::Config::default()
        },
    );
    // The queue is asked for on first use.
    c.compress(wd_comp::Algorithm::Zstd, 1, b"warm", &mut [0u8; 64])
        .map_err(|e| e.to_string())?;
    Ok(c)
}

/// A client that compresses a block of `f.bytes` (text with some noise)
/// again and again until stopped, one request in flight.
fn zip_flooder(
    host: &str,
    f: Flood,
    stop: Arc<AtomicBool>,
    moved: Arc<AtomicU64>,
    ready: std::sync::mpsc::Sender<Result<(), String>>,
) {
    let mut c = match offloading(host, 1) {
        Ok(c) => c,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let (alg, level) = f.zip;
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let words: [&[u8]; 4] = [b"queue ", b"engine ", b"domain ", b"IOVA\n"];
    let mut input = Vec::with_capacity(f.bytes as usize + 8);
    while (input.len() as u64) < f.bytes {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        match x % 4 {
            0 => input.extend_from_slice(&x.to_le_bytes()),
            i => input.extend_from_slice(words[i as usize]),
        }
    }
    input.truncate(f.bytes as usize);
    let mut out = vec![0u8; wd_comp::compress_bound(alg, input.len())];
    let mut back = Vec::new();
    if f.decompress {
        match c.compress(alg, level, &input, &mut out) {
            Ok(n) => out.truncate(n),
            Err(e) => {
                let _ = ready.send(Err(format!("flooder's compression: {e}")));
                return;
            }
        }
        back = vec![0u8; input.len()];
    }
    let _ = ready.send(Ok(()));
    while !stop.load(Ordering::Relaxed) {
        let r = if f.decompress {
            match c.decompress(alg, &out, &mut back, 0) {
                Ok(d) if d.produced == input.len() => Ok(()),
                Ok(d) => Err(format!("{} bytes back of {}", d.produced, input.len())),
                Err(e) => Err(e.to_string()),
            }
        } else {
            c.compress(alg, level, &input, &mut out)
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        if let Err(e) = r {
            // The row must not be measured without this flooder.
            let what = if f.decompress {
                "decompression"
            } else {
                "compression"
            };
            let _ = ready.send(Err(format!("flooder's {what}: {e}")));
            return;
        }
        moved.fetch_add(f.bytes, Ordering::Relaxed);
    }
}

/// A client that keeps `depth` copies of `bytes` in flight until stopped.
fn flooder(
    host: &str,
    bytes: u64,
    depth: usize,
    stop: Arc<AtomicBool>,
    moved: Arc<AtomicU64>,
    ready: std::sync::mpsc::Sender<Result<(), String>>,
) {
    let setup = || -> Result<_, String> {
        let h = HostConn::connect(host).map_err(|e| e.to_string())?;
        let mut q = h
            .request_queue(&Capability::new("memcpy").depth(depth.max(1) as u32))
            .map_err(|e| e.to_string())?;
        let a = SharedBuf::new(bytes as usize).map_err(|e| e.to_string())?;
        let b = SharedBuf::new(bytes as usize).map_err(|e| e.to_string())?;
        q.share(a.addr(), bytes).map_err(|e| e.to_string())?;
        q.share(b.addr(), bytes).map_err(|e| e.to_string())?;
        Ok((h, q, a, b))
    };
    let (_h, mut q, a, b) = match setup() {
        Ok(x) => {
            let _ = ready.send(Ok(()));
            x
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let d = CopyMsg {
        src: a.addr(),
        dst: b.addr(),
        len: bytes,
    }
    .to_desc(0);
    let reqs: Vec<_> = (0..depth as u64).map(|i| (d, i)).collect();
    // The row must not be measured without this flooder.
    let failed = |e: String| {
        let _ = ready.send(Err(format!("flooder's copy: {e}")));
    };
    if let Err(e) = q.send_batch(&reqs) {
        return failed(e.to_string());
    }
    while !stop.load(Ordering::Relaxed) {
        // Blocks on the completion line: a flooder burns no CPU of its
        // own, only the engine's.
        if let Ok(c) = q.recv_sync(Some(Duration::from_millis(100))) {
            if c.desc.status == 0 {
                moved.fetch_add(c.desc.result, Ordering::Relaxed);
            }
            if let Err(e) = q.send(d, c.cookie) {
                return failed(e.to_string());
            }
        }
    }
    // Drain what is in flight before the buffers go.
    let t = Instant::now();
    while q.in_flight() > 0 && t.elapsed() < Duration::from_secs(30) {
        let _ = q.recv_sync(Some(Duration::from_millis(100)));
    }
}

fn one_rep(args: &FairArgs, f: Flood, host: &str, n: usize) -> Result<Row, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let moved = Arc::new(AtomicU64::new(0));
    let (tx, rx) = std::sync::mpsc::channel();
    let mut threads = Vec::new();
    for _ in 0..n {
        let (h, s, m, tx) = (host.to_string(), stop.clone(), moved.clone(), tx.clone());
        threads.push(std::thread::spawn(move || match f.device {
            Device::Memcpy => flooder(&h, f.bytes, f.depth, s, m, tx),
            Device::Zip => zip_flooder(&h, f, s, m, tx),
        }));
    }
    let mut setup = Ok(());
    for _ in 0..n {
        match rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => setup = Err(format!("flooder: {e}")),
            Err(_) => setup = Err("flooder died".into()),
        }
    }
    let measured = setup.and_then(|()| {
        let mut request = measured_client(args, f, host)?;
        match f.device {
            // Measure in steady state: every flooder has finished a copy
            // (its pages are faulted in and its ring is full).
            Device::Memcpy => {
                let warm = Instant::now();
                while moved.load(Ordering::Relaxed) < n as u64 * f.bytes
                    && warm.elapsed() < Duration::from_secs(30)
                {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            // Every flooder has its first compression running.
            Device::Zip => std::thread::sleep(Duration::from_millis(300)),
        }
        let m0 = moved.load(Ordering::Relaxed);
        let mut lat = Vec::new();
        let t0 = Instant::now();
        while t0.elapsed().as_secs_f64() < args.seconds {
            let t = Instant::now();
            request()?;
            lat.push(t.elapsed().as_nanos() as u64);
        }
        let el = t0.elapsed().as_secs_f64();
        let flood = (moved.load(Ordering::Relaxed) - m0) as f64 / el;
        lat.sort_unstable();
        Ok(Row {
            flooders: n,
            requests: lat.len(),
            p50_ns: percentile(&lat, 0.5),
            p99_ns: percentile(&lat, 0.99),
            max_ns: lat.last().copied().unwrap_or(0),
            flood_bytes_per_sec: flood,
            p99_vs_no_flood: None,
        })
    });
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    // A flooder that failed while the row was measured (its sender is
    // dropped when it returns).
    drop(tx);
    if let Some(Err(e)) = rx.iter().find(Result::is_err) {
        return Err(format!("flooder: {e}"));
    }
    measured
}

/// The measured client: one request of `args.size` bytes per call.
fn measured_client(
    args: &FairArgs,
    f: Flood,
    host: &str,
) -> Result<Box<dyn FnMut() -> Result<(), String>>, String> {
    let size = args.size;
    match f.device {
        Device::Memcpy => {
            let h = HostConn::connect(host).map_err(|e| e.to_string())?;
            let mut q = h
                .request_queue(&Capability::new("memcpy"))
                .map_err(|e| e.to_string())?;
            let buf = SharedBuf::new((2 * size).max(4096) as usize).map_err(|e| e.to_string())?;
            q.share(buf.addr(), buf.len()).map_err(|e| e.to_string())?;
            let d = CopyMsg {
                src: buf.addr(),
                dst: buf.addr() + size,
                len: size,
            }
            .to_desc(1);
            Ok(Box::new(move || {
                let _keep = (&h, &buf);
                let r = q.call(d).map_err(|e| e.to_string())?;
                match r.status {
                    0 => Ok(()),
                    st => Err(format!("measured request failed: {st}")),
                }
            }))
        }
        Device::Zip => {
            let mut c = offloading(host, 1)?;
            let input: Vec<u8> = (0..size)
                .map(|i| b"the queue's engine "[i as usize % 19])
                .collect();
            let mut out = vec![0u8; wd_comp::compress_bound(wd_comp::Algorithm::Zstd, input.len())];
            Ok(Box::new(move || {
                c.compress(wd_comp::Algorithm::Zstd, 3, &input, &mut out)
                    .map(|_| ())
                    .map_err(|e| format!("measured request failed: {e}"))
            }))
        }
    }
}

/// `ALG:LEVEL` of a zip flood.
fn zip_flood(spec: &str) -> Result<(wd_comp::Algorithm, i8), String> {
    let bad = || format!("--zip-flood {spec:?}: want ALG:LEVEL, e.g. zstd:19 or gzip:12");
    let (a, l) = spec.split_once(':').ok_or_else(bad)?;
    let alg = wd_comp::Algorithm::ALL
        .into_iter()
        .find(|x| x.to_string() == a)
        .ok_or_else(bad)?;
    let level: i8 = l.parse().map_err(|_| bad())?;
    wd_zip_msg::check_level(alg, level).map_err(|_| {
        format!(
            "--zip-flood {spec:?}: {a} takes no level {level} (levels {:?})",
            alg.levels()
        )
    })?;
    Ok((alg, level))
}

/// Run `wd bench fairness` against `host`.
pub fn run(args: FairArgs, host: &str) -> Result<(), String> {
    let flood = Flood {
        device: args.device,
        bytes: args.flood_bytes.unwrap_or(match args.device {
            Device::Memcpy => 64 << 20,
            Device::Zip => 4 << 20,
        }),
        depth: args.flood_depth,
        zip: zip_flood(&args.zip_flood)?,
        decompress: args.zip_decompress,
    };
    let checks = [
        (args.reps >= 1, "--reps must be at least 1"),
        (
            (0.05..=60.0).contains(&args.seconds),
            "--seconds must be from 0.05 to 60",
        ),
        (
            !args.flooders.is_empty() && args.flooders.iter().all(|&n| n <= 64),
            "--flooders takes counts from 0 to 64",
        ),
        (
            (4096..=(1 << 30)).contains(&flood.bytes)
                && (args.device != Device::Zip || flood.bytes <= wd_zip_msg::MAX_DATA),
            "--flood-bytes must be from 4096 to 1 GiB (64 MiB for zip)",
        ),
        (
            !args.zip_decompress || args.device == Device::Zip,
            "--zip-decompress needs --device zip",
        ),
        (
            (1..=256).contains(&args.flood_depth),
            "--flood-depth must be from 1 to 256",
        ),
        (
            (1..=(1 << 20)).contains(&args.size),
            "--size must be from 1 byte to 1 MiB",
        ),
    ];
    if let Some((_, why)) = checks.iter().find(|(ok, _)| !ok) {
        return Err((*why).into());
    }
    let mut prog = Progress::new(args.flooders.len() * args.reps);
    let mut rows = Vec::new();
    for &n in &args.flooders {
        let mut reps = Vec::new();
        for r in 0..args.reps {
            prog.step(&format!("{n} flooders, rep {}", r + 1));
            reps.push(one_rep(&args, flood, host, n)?);
        }
        rows.push(median_by(reps, |a, b| a.p99_ns.cmp(&b.p99_ns)));
    }
    prog.finish();
    let base = rows.iter().find(|r| r.flooders == 0).map(|r| r.p99_ns);
    for r in &mut rows {
        r.p99_vs_no_flood = base.filter(|&b| b > 0).map(|b| r.p99_ns as f64 / b as f64);
    }
    let mut targets = Vec::new();
    // The 2 ms target is the copy engine's: a compression part is tens of
    // milliseconds at the slow levels (docs/compression.md).
    if let Some(r) = rows
        .iter()
        .filter(|r| r.flooders >= 4 && args.device == Device::Memcpy)
        .min_by_key(|r| r.flooders)
    {
        targets.push(Target::at_most(
            format!(
                "p99 latency of a {} request with {} flooding clients (ms)",
                exact_size(args.size),
                r.flooders
            ),
            r.p99_ns as f64 / 1e6,
            2.0,
        ));
    }
    if args.json {
        let v = serde_json::json!({
            "benchmark": "fairness",
            "seconds": args.seconds,
            "reps": args.reps,
            "device": args.device,
            "zip_flood": (args.device == Device::Zip).then_some(&args.zip_flood),
            "zip_decompress": args.device == Device::Zip && args.zip_decompress,
            "flood_bytes": flood.bytes,
            "flood_depth": args.flood_depth,
            "size": args.size,
            "rows": rows,
            "targets": targets,
        });
        print_json(&v);
        return Ok(());
    }
    outln!("| flooders | requests | p50 | p99 | max | p99 / no flood | flood MB/s |");
    outln!("|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        outln!(
            "| {} | {} | {:.1} us | {:.1} us | {:.2} ms | {} | {:.2} |",
            r.flooders,
            r.requests,
            r.p50_ns as f64 / 1e3,
            r.p99_ns as f64 / 1e3,
            r.max_ns as f64 / 1e6,
            r.p99_vs_no_flood.map_or("-".into(), |v| format!("{v:.1}")),
            r.flood_bytes_per_sec / 1e6
        );
    }
    outln!();
    for t in &targets {
        outln!("{}", t.line());
    }
    let what = match args.device {
        Device::Memcpy => format!(
            "keeps {} copies of {} in flight",
            args.flood_depth,
            exact_size(flood.bytes)
        ),
        Device::Zip => format!(
            "{} {} at {} again and again (the measured client: {} at zstd:3)",
            if flood.decompress {
                "decompresses a stream of"
            } else {
                "compresses"
            },
            exact_size(flood.bytes),
            args.zip_flood,
            exact_size(args.size)
        ),
    };
    outln!(
        "\nEach flooder {what} on its own connection; rows are the median of {} repetitions by p99, {} s each.",
        args.reps, args.seconds
    );
    Ok(())
}
