//! `wd bench zip`: compression on real data, in one run.
//!
//! The corpus is assembled from what any Debian machine has (documentation
//! and licences, programs, and this project's sources when run from its
//! checkout) and cut into blocks. Per algorithm and level it measures
//! compression and decompression speed and the ratio on five paths: the
//! engines called directly in this thread into buffers made beforehand
//! (`cpu`: the best one thread does alone), the system zlib (`stock`,
//! zlib rows only, each output a new buffer as the library's are), the zip device one block at a time (`sync`), many in flight
//! through the asynchronous API, a window of `depth` in flight (`async`),
//! and the library's `auto` policy (in flight, the caller
//! computing while the device is full). Then unmodified programs with and
//! without the drop-in zlib (libwdz.so): python's zlib module on whole
//! blocks and on small requests, and pigz.

use crate::report::outln;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use wd_comp::{Algorithm, Compressor, Config, Op, Pending, Policy};
use wd_zip_codec::stock::StockZlib;
use wd_zip_codec::{compress_bound, Engine};
use wrapdrive::HostConn;

use crate::chart::{log_lines, Series};
use crate::report::{median, print_json, Progress, Target};
use crate::units::{exact_size, size_arg};

/// Options of `wd bench zip`.
#[derive(clap::Args)]
pub struct BenchZipArgs {
    /// Bytes of corpus (a third each of text, programs and sources).
    #[arg(long, default_value = "24M", value_parser = size_arg)]
    corpus: u64,
    /// Block size: each block is one request (and one stream).
    #[arg(long, default_value = "64K", value_parser = size_arg)]
    block: u64,
    /// Repetitions (medians are reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Algorithms and levels, e.g. "zlib:1,zlib:6,gzip:6,zstd:1,zstd:3,lz4:1".
    #[arg(long, default_value = "zlib:1,zlib:6,zstd:1,zstd:3,lz4:1")]
    configs: String,
    /// Small block sizes python's zlib is measured on too, with and
    /// without the drop-in zlib (the issue's "small requests" target).
    #[arg(long, default_value = "16,64,128,256,512", value_delimiter = ',', value_parser = size_arg)]
    small: Vec<u64>,
    /// Requests in flight for the async and auto paths.
    #[arg(long, default_value_t = 16)]
    depth: usize,
    /// The drop-in zlib (default: libwdz.so beside this program).
    #[arg(long)]
    shim: Option<PathBuf>,
    /// Measure only the library paths, not programs through the drop-in
    /// zlib.
    #[arg(long)]
    no_programs: bool,
    /// Directory of this project's sources for the corpus (default: the
    /// current directory when it is a checkout).
    #[arg(long)]
    sources: Option<PathBuf>,
    /// Where to write the SVG chart.
    #[arg(long, default_value = "wd-bench-zip.svg")]
    svg: PathBuf,
    /// Do not write the chart.
    #[arg(long)]
    no_svg: bool,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

/// What the corpus is made of.
#[derive(Debug, Serialize)]
struct Part {
    kind: &'static str,
    files: usize,
    bytes: usize,
    from: String,
}

/// One measured path of one configuration.
#[derive(Clone, Debug, Serialize)]
struct Row {
    alg: String,
    level: i8,
    path: &'static str,
    compress_mb_s: f64,
    decompress_mb_s: f64,
    ratio: f64,
}

/// A program run with and without the shim.
#[derive(Clone, Debug, Serialize)]
struct ShimRow {
    what: String,
    stock_s: f64,
    shim_s: f64,
    speedup: f64,
    stock_bytes: Option<u64>,
    shim_bytes: Option<u64>,
}

const SKIP_EXT: &[&str] = &[
    "gz", "bz2", "xz", "zst", "lz4", "zip", "png", "jpg", "gif", "svgz",
];

/// Files under `dir` (depth-first, sorted, regular files only) until
/// `want` bytes, each taken up to `cap` bytes.
fn gather(
    dirs: &[&Path],
    want: usize,
    cap: usize,
    pick: &dyn Fn(&Path) -> bool,
    out: &mut Vec<u8>,
) -> usize {
    let mut files = 0;
    let start = out.len();
    let mut stack: Vec<PathBuf> = dirs.iter().rev().map(|d| d.to_path_buf()).collect();
    while let Some(p) = stack.pop() {
        if out.len() - start >= want {
            break;
        }
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if meta.is_dir() {
            let Ok(rd) = std::fs::read_dir(&p) else {
                continue;
            };
            let mut kids: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
            kids.sort();
            stack.extend(kids.into_iter().rev());
        } else if meta.is_file() && meta.len() > 0 && pick(&p) {
            let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("");
            if SKIP_EXT.contains(&ext) {
                continue;
            }
            if let Ok(bytes) = std::fs::read(&p) {
                let n = bytes.len().min(cap).min(want - (out.len() - start));
                out.extend_from_slice(&bytes[..n]);
                files += 1;
            }
        }
    }
    files
}

fn corpus(size: usize, sources: Option<&Path>) -> (Vec<u8>, Vec<Part>) {
    let third = size / 3;
    let mut data = Vec::with_capacity(size);
    let mut parts = Vec::new();
    let any = |_: &Path| true;
    let text_dirs = [
        Path::new("/usr/share/doc"),
        Path::new("/usr/share/common-licenses"),
    ];
    let before = data.len();
    let files = gather(&text_dirs, third, 1 << 20, &any, &mut data);
    parts.push(Part {
        kind: "text",
        files,
        bytes: data.len() - before,
        from: "/usr/share/doc, /usr/share/common-licenses".into(),
    });
    let before = data.len();
    let files = gather(&[Path::new("/usr/bin")], third, 1 << 20, &any, &mut data);
    parts.push(Part {
        kind: "programs",
        files,
        bytes: data.len() - before,
        from: "/usr/bin".into(),
    });
    let src = sources
        .map(Path::to_path_buf)
        .or_else(|| Path::new("crates").is_dir().then(|| PathBuf::from(".")));
    if let Some(src) = src {
        let before = data.len();
        let is_source = |p: &Path| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("rs" | "c" | "h" | "md" | "toml" | "sh")
            ) && !p.components().any(|c| c.as_os_str() == "target")
        };
        let files = gather(&[&src], size - data.len(), 1 << 20, &is_source, &mut data);
        parts.push(Part {
            kind: "sources",
            files,
            bytes: data.len() - before,
            from: src.display().to_string(),
        });
    }
    // Short of sources (or of anything): more documentation.
    if data.len() < size {
        let before = data.len();
        let files = gather(
            &[Path::new("/usr/share")],
            size - data.len(),
            1 << 20,
            &any,
            &mut data,
        );
        parts.push(Part {
            kind: "more text",
            files,
            bytes: data.len() - before,
            from: "/usr/share".into(),
        });
    }
    (data, parts)
}

/// Seconds one run of `f` takes.
fn timed(mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64()
}

type Blocks<'a> = Vec<&'a [u8]>;

/// One repetition of one path: (compress seconds, decompress seconds,
/// compressed bytes).
type Measured = (f64, f64, usize);

/// Measure one path.
fn measure_path(
    path: &str,
    alg: Algorithm,
    level: i8,
    blocks: &Blocks<'_>,
    conn: &Arc<HostConn>,
    depth: usize,
    stock: Option<&StockZlib>,
) -> Result<Measured, String> {
    let rooms: Vec<usize> = blocks.iter().map(|b| b.len()).collect();
    let fail = |e: &dyn std::fmt::Display| format!("{path} {alg}:{level}: {e}");
    match path {
        "cpu" => {
            // The engines called directly into buffers made beforehand:
            // the best this thread can do alone.
            let mut e = Engine::new();
            let mut outs: Vec<Vec<u8>> = blocks
                .iter()
                .map(|b| vec![0; compress_bound(alg, b.len())])
                .collect();
            let mut lens = vec![0; blocks.len()];
            let mut err = None;
            let c = timed(|| {
                for (i, b) in blocks.iter().enumerate() {
                    match e.compress(alg, level, *b, &mut outs[i][..]) {
                        Ok(n) => lens[i] = n,
                        Err(x) => err = Some(x),
                    }
                }
            });
            let mut back = vec![0u8; rooms.iter().copied().max().unwrap_or(0)];
            let d = timed(|| {
                for (i, o) in outs.iter().enumerate() {
                    if e.decompress(alg, &o[..lens[i]], &mut back[..], 0)
                        .map(|g| g.produced)
                        != Ok(rooms[i])
                    {
                        err = Some(wd_zip_codec::CodecError::Corrupt);
                    }
                }
            });
            if let Some(x) = err {
                return Err(fail(&x));
            }
            Ok((c, d, lens.iter().sum()))
        }
        "stock" => {
            let z = stock.ok_or_else(|| fail(&"no system zlib"))?;
            let mut outs: Vec<Vec<u8>> = Vec::with_capacity(blocks.len());
            let mut err = None;
            let c = timed(|| {
                for b in blocks {
                    let mut o = vec![0; compress_bound(alg, b.len()) + 64];
                    match z.compress(level as i32, b, &mut o) {
                        Ok(n) => o.truncate(n),
                        Err(x) => err = Some(x),
                    }
                    outs.push(o);
                }
            });
            if let Some(x) = err {
                return Err(fail(&x));
            }
            let d = timed(|| {
                for (i, o) in outs.iter().enumerate() {
                    let mut back = vec![0; rooms[i]];
                    if z.decompress(o, &mut back).map(|x| x.1) != Ok(rooms[i]) {
                        err = Some(wd_zip_codec::CodecError::Corrupt);
                    }
                }
            });
            if let Some(x) = err {
                return Err(fail(&x));
            }
            Ok((c, d, outs.iter().map(Vec::len).sum()))
        }
        _ => {
            let cfg = match path {
                "sync" => Config {
                    policy: Policy::Offload,
                    threshold: 0,
                    fallback: false,
                    depth: 1,
                    ..Config::default()
                },
                "async" => Config {
                    policy: Policy::Offload,
                    threshold: 0,
                    fallback: false,
                    depth,
                    ..Config::default()
                },
                _ => Config {
                    depth,
                    ..Config::default()
                },
            };
            let mut comp = Compressor::new(Some(conn.clone()), cfg);
            if path == "async" {
                return windowed(&mut comp, alg, level, blocks, &rooms, depth)
                    .map_err(|e| fail(&e));
            }
            let mut outs = Vec::new();
            let mut err = None;
            let c = if path == "sync" {
                timed(|| {
                    for b in blocks {
                        match comp.compress_blocks(alg, level, &[b]) {
                            Ok(mut o) => outs.push(o.remove(0)),
                            Err(e) => err = Some(e.to_string()),
                        }
                    }
                })
            } else {
                timed(|| match comp.compress_blocks(alg, level, blocks) {
                    Ok(o) => outs = o,
                    Err(e) => err = Some(e.to_string()),
                })
            };
            if let Some(e) = err {
                return Err(fail(&e));
            }
            let crefs: Vec<&[u8]> = outs.iter().map(|o| &o[..]).collect();
            let mut backs = Vec::with_capacity(blocks.len());
            let d = if path == "sync" {
                timed(|| {
                    for (i, c) in crefs.iter().enumerate() {
                        match comp.decompress_blocks(alg, &[c], &rooms[i..=i], 0) {
                            Ok(mut b) => backs.push(b.remove(0)),
                            Err(e) => err = Some(e.to_string()),
                        }
                    }
                })
            } else {
                timed(|| match comp.decompress_blocks(alg, &crefs, &rooms, 0) {
                    Ok(b) => backs = b,
                    Err(e) => err = Some(e.to_string()),
                })
            };
            if let Some(e) = err {
                return Err(fail(&e));
            }
            // Checked outside the timing, as the async path checks its own.
            if backs.len() != blocks.len() || backs.iter().zip(blocks).any(|(a, b)| a != b) {
                return Err(fail(&"the round trip gave other bytes back"));
            }
            Ok((c, d, outs.iter().map(Vec::len).sum()))
        }
    }
}

/// The `async` path: the asynchronous API with a window of `depth`
/// requests in flight (start the next, finish the oldest), into buffers
/// made beforehand; compress then decompress seconds and compressed bytes.
fn windowed(
    comp: &mut Compressor,
    alg: Algorithm,
    level: i8,
    blocks: &[&[u8]],
    rooms: &[usize],
    depth: usize,
) -> Result<(f64, f64, usize), wd_comp::CompError> {
    let depth = depth.max(1);
    let run = |comp: &mut Compressor,
               op: Op,
               inputs: &[&[u8]],
               outs: &mut [Vec<u8>],
               lens: &mut [usize]|
     -> Result<(), wd_comp::CompError> {
        let mut window = std::collections::VecDeque::with_capacity(depth);
        for (i, input) in inputs.iter().enumerate() {
            if window.len() == depth {
                let (j, p): (usize, Pending) = window.pop_front().expect("a full window");
                lens[j] = comp.finish(p, &mut outs[j])?.produced;
            }
            window.push_back((i, comp.start(op, alg, input, &mut outs[i])?));
        }
        for (j, p) in window {
            lens[j] = comp.finish(p, &mut outs[j])?.produced;
        }
        Ok(())
    };
    let mut zs: Vec<Vec<u8>> = blocks
        .iter()
        .map(|b| vec![0; compress_bound(alg, b.len())])
        .collect();
    let mut zlens = vec![0; blocks.len()];
    let mut result = Ok(());
    let c = timed(|| result = run(comp, Op::Compress(level), blocks, &mut zs, &mut zlens));
    std::mem::replace(&mut result, Ok(()))?;
    let zrefs: Vec<&[u8]> = zs.iter().zip(&zlens).map(|(z, &n)| &z[..n]).collect();
    let mut backs: Vec<Vec<u8>> = rooms.iter().map(|&r| vec![0; r]).collect();
    let mut blens = vec![0; blocks.len()];
    let d = timed(|| result = run(comp, Op::Decompress(0), &zrefs, &mut backs, &mut blens));
    result?;
    if blens.iter().zip(rooms).any(|(a, b)| a != b) || backs.iter().zip(blocks).any(|(a, b)| a != b)
    {
        return Err(wd_zip_codec::CodecError::Corrupt.into());
    }
    Ok((c, d, zlens.iter().sum()))
}

/// The python program the shim rows run: compress each block at `level`;
/// decompress the blocks stock zlib made (the same bytes with and without
/// the shim: the run without it writes them to `argv[4]`, the run with it
/// reads them), then the blocks this run made (its own output: the shim's
/// blocks cut in two decode slower than whole ones), each the fastest of
/// a few passes; then the whole file
/// as one gzip stream fed in 64 KiB pieces (as the gzip module writes) and
/// that stream decoded in 64 KiB pieces (as the gzip module reads); print
/// seconds and bytes as JSON.
const PY: &str = r#"
import json, pickle, sys, time, zlib
data = open(sys.argv[1], "rb").read()
block, level = int(sys.argv[2]), int(sys.argv[3])
blocks = [data[i:i + block] for i in range(0, len(data), block)]
t = time.perf_counter()
comp = [zlib.compress(b, level) for b in blocks]
c = time.perf_counter() - t
if sys.argv[5] == "write":
    with open(sys.argv[4], "wb") as f:
        pickle.dump(comp, f)
with open(sys.argv[4], "rb") as f:
    stock = pickle.load(f)
def decompress_all(zs):
    t = time.perf_counter()
    for z in zs:
        zlib.decompress(z)
    return time.perf_counter() - t
# The fastest of at least 3 passes and 0.3 s: a pass over blocks of a few
# bytes takes tens of milliseconds, within this machine's noise.
def fastest(zs):
    times = []
    while len(times) < 3 or sum(times) < 0.3:
        times.append(decompress_all(zs))
    return min(times)
d = fastest(stock)
o = fastest(comp)
# Checked apart, off the clock: a comparison is no part of decompressing
# (and keeping every result would time the heap's growth instead).
for zs in (stock, comp):
    for z, b in zip(zs, blocks):
        if zlib.decompress(z) != b:
            raise SystemExit("round trip differs")
t = time.perf_counter()
z = zlib.compressobj(level, zlib.DEFLATED, 31)
parts = [z.compress(data[i:i + 65536]) for i in range(0, len(data), 65536)]
parts.append(z.flush())
s = time.perf_counter() - t
stream = b"".join(parts)
t = time.perf_counter()
z = zlib.decompressobj(31)
back = [z.decompress(stream[i:i + 65536]) for i in range(0, len(stream), 65536)]
i = time.perf_counter() - t
if b"".join(back) != data:
    raise SystemExit("stream round trip differs")
print(json.dumps({"c": c, "d": d, "o": o, "bytes": sum(map(len, comp)), "s": s, "sbytes": len(stream), "i": i}))
"#;

/// What one run of the python program measured.
struct PyRun {
    compress_s: f64,
    /// Decompressing stock zlib's blocks.
    decompress_s: f64,
    /// Decompressing this run's own blocks.
    own_s: f64,
    bytes: u64,
    stream_s: f64,
    stream_bytes: u64,
    /// Decoding that stream in 64 KiB pieces.
    inflate_s: f64,
}

/// Timings of one program row, without and with the shim.
struct Samples {
    what: String,
    stock: Vec<f64>,
    shim: Vec<f64>,
    stock_bytes: u64,
    shim_bytes: u64,
}

impl Samples {
    fn new(what: String) -> Samples {
        Samples {
            what,
            stock: Vec::new(),
            shim: Vec::new(),
            stock_bytes: 0,
            shim_bytes: 0,
        }
    }

    fn push(&mut self, with_shim: bool, seconds: f64, bytes: u64) {
        if with_shim {
            self.shim.push(seconds);
            self.shim_bytes = bytes;
        } else {
            self.stock.push(seconds);
            self.stock_bytes = bytes;
        }
    }

    fn row(self) -> ShimRow {
        let (s, w) = (median(&self.stock), median(&self.shim));
        ShimRow {
            speedup: s / w,
            what: self.what,
            stock_s: s,
            shim_s: w,
            stock_bytes: (self.stock_bytes > 0).then_some(self.stock_bytes),
            shim_bytes: (self.shim_bytes > 0).then_some(self.shim_bytes),
        }
    }
}

/// `stock`: where the run without the shim leaves stock zlib's blocks for
/// the run with it.
fn run_py(
    corpus: &Path,
    block: usize,
    level: i32,
    stock: &Path,
    shim: Option<&Path>,
) -> Result<PyRun, String> {
    let mut cmd = Command::new("python3");
    cmd.arg("-c")
        .arg(PY)
        .arg(corpus)
        .arg(block.to_string())
        .arg(level.to_string())
        .arg(stock)
        .arg(if shim.is_some() { "read" } else { "write" });
    cmd.env_remove("LD_PRELOAD");
    if let Some(s) = shim {
        cmd.env("LD_PRELOAD", s);
    }
    let out = cmd.output().map_err(|e| format!("python3: {e}"))?;
    if !out.status.success() {
        return Err(format!("python3: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("python3 output: {e}"))?;
    let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    Ok(PyRun {
        compress_s: f("c"),
        decompress_s: f("d"),
        own_s: f("o"),
        bytes: v["bytes"].as_u64().unwrap_or(0),
        stream_s: f("s"),
        stream_bytes: v["sbytes"].as_u64().unwrap_or(0),
        inflate_s: f("i"),
    })
}

fn run_pigz(corpus: &Path, shim: Option<&Path>, decompress: bool) -> Result<f64, String> {
    let mut cmd = Command::new("pigz");
    if decompress {
        cmd.arg("-dc");
        cmd.arg(corpus.with_extension("gz"));
    } else {
        cmd.args(["-c", "-1", "-p", "2"]).arg(corpus);
    }
    cmd.env_remove("LD_PRELOAD");
    if let Some(s) = shim {
        cmd.env("LD_PRELOAD", s);
    }
    cmd.stdout(std::process::Stdio::null());
    let t = Instant::now();
    let st = cmd.status().map_err(|e| format!("pigz: {e}"))?;
    if !st.success() {
        return Err(format!("pigz failed: {st}"));
    }
    Ok(t.elapsed().as_secs_f64())
}

/// Run the benchmark (its own host, in this process, with a zip device).
pub fn run(a: BenchZipArgs) -> Result<(), String> {
    if a.reps == 0 || a.block == 0 || a.corpus < a.block {
        return Err("need --reps >= 1 and --corpus >= --block > 0".into());
    }
    // The queue holds twice the window, a ring depth of at most 4096.
    if !(1..=2048).contains(&a.depth) || !a.depth.is_power_of_two() {
        return Err(format!(
            "--depth {}: need a power of two from 1 to 2048",
            a.depth
        ));
    }
    if let Some(b) = a.small.iter().find(|&&b| b == 0 || b > a.corpus) {
        return Err(format!("--small {b}: need 0 < size <= --corpus"));
    }
    let mut configs = Vec::new();
    for c in a.configs.split(',').filter(|s| !s.is_empty()) {
        let (alg, level) = c.split_once(':').unwrap_or((c, "-1"));
        let alg: Algorithm = alg.parse()?;
        let level: i8 = level.parse().map_err(|_| format!("bad level in '{c}'"))?;
        wd_zip_msg::check_level(alg, level).map_err(|_| format!("{alg} takes no level {level}"))?;
        if configs.contains(&(alg, level)) {
            return Err(format!("--configs names {c} twice"));
        }
        configs.push((alg, level));
    }
    if configs.is_empty() {
        return Err("--configs names no algorithm".into());
    }
    if let Some(s) = a.shim.as_ref().filter(|s| !s.exists()) {
        return Err(format!("--shim {}: no such file", s.display()));
    }
    if !a.no_svg {
        crate::chart::check_writable(&a.svg)?;
    }
    let (data, parts) = corpus(a.corpus as usize, a.sources.as_deref());
    let block = a.block as usize;
    let blocks: Blocks<'_> = data.chunks(block).collect();
    if !a.json {
        eprintln!(
            "wd bench zip: corpus {} in {} blocks of {}:",
            exact_size(data.len() as u64),
            blocks.len(),
            exact_size(a.block)
        );
        for p in &parts {
            eprintln!(
                "  {:<10} {:>10}  {:>5} files from {}",
                p.kind,
                exact_size(p.bytes as u64),
                p.files,
                p.from
            );
        }
    }
    let dir = std::env::temp_dir().join(format!("wd-bench-zip-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let mut _cleanup = crate::temp::Removed::default();
    _cleanup.add(dir.clone());
    let socket = dir.join("wd.sock").display().to_string();
    let cfg = wd_host::HostConfig {
        socket: socket.clone(),
        socket_mode: 0o600,
        devices: vec![wd_host::DeviceConfig::new("zip")],
        ..wd_host::HostConfig::default()
    };
    let _host = wd_host::Host::start(&cfg).map_err(|e| e.to_string())?;
    let conn = HostConn::connect(&socket).map_err(|e| e.to_string())?;
    let engine = conn.get_attr("dev0/engine").unwrap_or_else(|_| "?".into());
    let stock = StockZlib::load();

    let paths = ["cpu", "stock", "sync", "async", "auto"];
    // Per configuration index and path: each repetition's measurement.
    let mut samples: Vec<(usize, &'static str, Vec<Measured>)> = Vec::new();
    let per_rep = configs.len() * paths.len();
    let mut progress = Progress::new(a.reps * per_rep);
    for rep in 0..a.reps {
        for (ci, &(alg, level)) in configs.iter().enumerate() {
            for &path in &paths {
                progress.step(&format!("rep {}/{} {alg}:{level} {path}", rep + 1, a.reps));
                let z = match path {
                    "stock" if alg == Algorithm::Zlib && level <= 9 => match &stock {
                        Some(z) => Some(z),
                        None => continue,
                    },
                    "stock" => continue,
                    _ => None,
                };
                let m = measure_path(path, alg, level, &blocks, &conn, a.depth, z)?;
                match samples.iter_mut().find(|s| s.0 == ci && s.1 == path) {
                    Some(s) => s.2.push(m),
                    None => samples.push((ci, path, vec![m])),
                }
            }
        }
    }
    progress.finish();
    let mb = data.len() as f64 / 1e6;
    let rows: Vec<Row> = samples
        .iter()
        .map(|(ci, path, ms)| {
            let (alg, level) = configs[*ci];
            let c: Vec<f64> = ms.iter().map(|m| mb / m.0).collect();
            let d: Vec<f64> = ms.iter().map(|m| mb / m.1).collect();
            Row {
                alg: alg.to_string(),
                level,
                path,
                compress_mb_s: median(&c),
                decompress_mb_s: median(&d),
                ratio: data.len() as f64 / ms[0].2 as f64,
            }
        })
        .collect();
    let find = |alg: &str, level: i8, path: &str| {
        rows.iter()
            .find(|r| r.alg == alg && r.level == level && r.path == path)
    };
    let mut targets = Vec::new();
    for &(alg, level) in &configs {
        let (Some(cpu), Some(asy), Some(auto)) = (
            find(alg.name(), level, "cpu"),
            find(alg.name(), level, "async"),
            find(alg.name(), level, "auto"),
        ) else {
            continue;
        };
        targets.push(Target::at_least(
            format!(
                "{alg}:{level} async offload / in-process, compress ({} blocks)",
                exact_size(a.block)
            ),
            asy.compress_mb_s / cpu.compress_mb_s,
            0.95,
        ));
        targets.push(Target::at_least(
            format!("{alg}:{level} auto (engine and caller) / in-process, compress"),
            auto.compress_mb_s / cpu.compress_mb_s,
            1.0,
        ));
    }

    // Unmodified programs with and without the drop-in zlib.
    let shim = a.shim.clone().or_else(|| {
        let beside = std::env::current_exe().ok()?.parent()?.join("libwdz.so");
        beside.exists().then_some(beside)
    });
    let mut shim_rows = Vec::new();
    let mut notes = Vec::new();
    let corpus_file = dir.join("corpus");
    std::fs::write(&corpus_file, &data).map_err(|e| e.to_string())?;
    match (&shim, Command::new("python3").arg("-c").arg("import zlib").output()) {
        _ if a.no_programs => notes.push("programs not measured (--no-programs)".to_string()),
        (None, _) => notes.push("drop-in zlib rows skipped: no libwdz.so (scripts/build-wdz.sh builds it; --shim names it)".to_string()),
        (_, Err(_)) => notes.push("python rows skipped: no python3".to_string()),
        (Some(shim), Ok(_)) => {
            // The host of this run serves the shim's device requests.
            std::env::set_var("WD_HOST", &socket);
            let mut runs: Vec<Samples> = Vec::new();
            // Each small size on 64 Ki blocks of the corpus (at most 4 MiB).
            let mut files = vec![(corpus_file.clone(), block)];
            for &blk in &a.small {
                let f = dir.join(format!("small-{blk}"));
                let len = data.len().min(4 << 20).min(blk as usize * 65536);
                std::fs::write(&f, &data[..len]).map_err(|e| e.to_string())?;
                files.push((f, blk as usize));
            }
            let mut prog = Progress::new(a.reps * files.len());
            for (k, (file, blk)) in files.iter().enumerate() {
                let blk = *blk;
                let size = exact_size(blk as u64);
                let mut comp = Samples::new(format!("python zlib.compress level 1, {size} blocks"));
                let mut decomp = Samples::new(format!("python zlib.decompress, {size} blocks stock zlib made"));
                let mut own = Samples::new(format!("python zlib.decompress, {size} blocks, each its own output"));
                let stock = dir.join(format!("stock-{blk}.pickle"));
                let mut stream = Samples::new(
                    "python zlib.compressobj level 1, gzip stream fed in 64 KiB pieces".to_string(),
                );
                let mut pieces = Samples::new(
                    "python zlib.decompressobj, that stream fed in 64 KiB pieces".to_string(),
                );
                for rep in 0..a.reps {
                    prog.step(&format!("rep {}/{} python zlib level 1, {size} blocks", rep + 1, a.reps));
                    // Without and with the shim, alternating.
                    for (with, preload) in [(false, None), (true, Some(shim.as_path()))] {
                        let r = run_py(file, blk, 1, &stock, preload)?;
                        comp.push(with, r.compress_s, r.bytes);
                        decomp.push(with, r.decompress_s, 0);
                        own.push(with, r.own_s, r.bytes);
                        stream.push(with, r.stream_s, r.stream_bytes);
                        pieces.push(with, r.inflate_s, 0);
                    }
                }
                runs.push(comp);
                runs.push(decomp);
                runs.push(own);
                if k == 0 {
                    runs.push(stream);
                    runs.push(pieces);
                }
            }
            prog.finish();
            if Command::new("pigz").arg("--version").output().is_ok() {
                let gz = corpus_file.with_extension("gz");
                let st = Command::new("pigz").args(["-c", "-6"]).arg(&corpus_file).output().map_err(|e| e.to_string())?;
                std::fs::write(&gz, st.stdout).map_err(|e| e.to_string())?;
                let mut comp = Samples::new("pigz -1 -p 2 (compress)".into());
                let mut decomp = Samples::new("pigz -d".into());
                for _ in 0..a.reps {
                    for (with, preload) in [(false, None), (true, Some(shim.as_path()))] {
                        comp.push(with, run_pigz(&corpus_file, preload, false)?, 0);
                        decomp.push(with, run_pigz(&corpus_file, preload, true)?, 0);
                    }
                }
                runs.push(comp);
                runs.push(decomp);
            } else {
                notes.push("pigz rows skipped: pigz not installed".to_string());
            }
            std::env::remove_var("WD_HOST");
            shim_rows.extend(runs.into_iter().map(Samples::row));
            let row = |prefix: &str| shim_rows.iter().find(|r| r.what.starts_with(prefix)).cloned();
            if let Some(r) = row(&format!("python zlib.compress level 1, {}", exact_size(a.block))) {
                targets.push(Target::at_least("shim deflate level 1 compress / stock zlib", r.speedup, 2.0));
                if let (Some(s), Some(w)) = (r.stock_bytes, r.shim_bytes) {
                    targets.push(Target::at_most("shim level 1 output / stock zlib's", w as f64 / s as f64, 1.1));
                }
            }
            if let Some(r) = row(&format!("python zlib.decompress, {} blocks stock", exact_size(a.block))) {
                targets.push(Target::at_least("shim decompress / stock zlib (the blocks stock zlib made)", r.speedup, 2.5));
            }
            for &blk in a.small.iter().filter(|&&b| b < 1024) {
                let size = exact_size(blk);
                for prefix in [format!("python zlib.compress level 1, {size} "), format!("python zlib.decompress, {size} blocks stock ")] {
                    if let Some(r) = row(&prefix) {
                        targets.push(Target::at_least(format!("{} through the shim / stock", r.what), r.speedup, 0.95));
                    }
                }
            }
        }
    }

    // The chart: compression speed per configuration, one line per path.
    let labels: Vec<String> = configs.iter().map(|(a, l)| format!("{a}:{l}")).collect();
    let series: Vec<Series> = paths
        .iter()
        .map(|p| Series {
            name: format!("{p} compress"),
            values: configs
                .iter()
                .map(|(a, l)| find(a.name(), *l, p).map(|r| r.compress_mb_s))
                .collect(),
        })
        .chain(paths.iter().map(|p| {
            Series {
                name: format!("{p} decompress"),
                values: configs
                    .iter()
                    .map(|(a, l)| find(a.name(), *l, p).map(|r| r.decompress_mb_s))
                    .collect(),
            }
        }))
        .filter(|s| s.values.iter().any(Option::is_some))
        .collect();
    let svg = log_lines(
        &format!(
            "wd bench zip: {} corpus, {} blocks",
            exact_size(data.len() as u64),
            exact_size(a.block)
        ),
        &labels,
        "MB/s (uncompressed)",
        &series,
    );
    if !a.no_svg {
        std::fs::write(&a.svg, svg)
            .map_err(|e| format!("cannot write {}: {e}", a.svg.display()))?;
    }

    if a.json {
        print_json(&serde_json::json!({
            "corpus": {"bytes": data.len(), "block": block, "parts": parts},
            "engine": engine,
            "stock_zlib": stock.as_ref().map(|z| z.version().to_string()),
            "reps": a.reps,
            "depth": a.depth,
            "rows": rows,
            "programs": shim_rows,
            "targets": targets,
            "notes": notes,
            "svg": (!a.no_svg).then(|| a.svg.display().to_string()),
        }));
        return Ok(());
    }
    outln!("engine: {engine}");
    if let Some(z) = &stock {
        outln!("stock zlib: {}", z.version());
    }
    outln!(
        "medians of {} repetitions; MB/s of uncompressed data; depth {} for async and auto",
        a.reps,
        a.depth
    );
    outln!(
        "{:<10} {:<6} {:>12} {:>14} {:>7}",
        "algorithm",
        "path",
        "compress",
        "decompress",
        "ratio"
    );
    for (alg, level) in &configs {
        for p in paths {
            if let Some(r) = find(alg.name(), *level, p) {
                outln!(
                    "{:<10} {:<6} {:>12.1} {:>14.1} {:>7.3}",
                    format!("{alg}:{level}"),
                    p,
                    r.compress_mb_s,
                    r.decompress_mb_s,
                    r.ratio
                );
            }
        }
    }
    if !shim_rows.is_empty() {
        outln!("\nunmodified programs, without and with LD_PRELOAD=libwdz.so (seconds, medians):");
        let w = shim_rows.iter().map(|r| r.what.len()).max().unwrap_or(0);
        outln!("  {:<w$} {:>8} {:>8}  speed-up", "program", "stock", "shim");
        for r in &shim_rows {
            let bytes = match (r.stock_bytes, r.shim_bytes) {
                (Some(s), Some(w)) => format!("  output {s} / {w} bytes"),
                _ => String::new(),
            };
            outln!(
                "  {:<w$} {:>8.3} {:>8.3}  x{:.2}{bytes}",
                r.what,
                r.stock_s,
                r.shim_s,
                r.speedup
            );
        }
    }
    for n in &notes {
        outln!("note: {n}");
    }
    outln!();
    for t in &targets {
        outln!("{}", t.line());
    }
    if !a.no_svg {
        outln!("chart: {}", a.svg.display());
    }
    Ok(())
}
