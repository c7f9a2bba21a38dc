//! `wd speed`: `openssl speed` throughput per block size on this machine,
//! in one run, with unmodified `openssl speed -elapsed` as the client: the
//! legacy system-call path, WrapDrive synchronous offload, with 32 async
//! jobs, with the default threshold, each against the CPU alone (OpenSSL's
//! default provider, measured in the same run). When the host's sec device
//! has a multi-buffer engine, a second host computing with libcrypto only
//! runs the async row too, so the engine's share of the gain is measured
//! in the same run.

use crate::report::{out, outln};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Serialize;

use crate::chart::{log_lines, Series};
use crate::report::{median, print_json, Progress, Target};

/// Options of `wd speed`.
#[derive(clap::Args)]
pub struct SpeedArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Where to write the SVG chart.
    #[arg(long, default_value = "wd-speed.svg")]
    svg: PathBuf,
    /// Do not write the chart.
    #[arg(long)]
    no_svg: bool,
    /// Cipher to measure (as `openssl speed -evp` names it).
    #[arg(long, default_value = "aes-128-cbc")]
    cipher: String,
    /// Digest to measure instead of a cipher (e.g. sha256).
    #[arg(long, conflicts_with = "cipher")]
    digest: Option<String>,
    /// Seconds per block size and run (`openssl speed -seconds`).
    #[arg(long, default_value_t = 1)]
    seconds: u32,
    /// Runs per row (the median of each cell is reported; this VM's
    /// throughput varies by tens of percent from run to run).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Async jobs of the async rows.
    #[arg(long, default_value_t = 32)]
    async_jobs: u32,
    /// Engine threads of the host started for the run.
    #[arg(long, default_value_t = 1)]
    engines: usize,
    /// Directory holding the provider `wd.so` (default: $WD_PROVIDER_DIR,
    /// else `../provider` next to this program, as scripts/build-provider.sh
    /// leaves it).
    #[arg(long)]
    provider_dir: Option<PathBuf>,
    /// The openssl program.
    #[arg(long, default_value = "openssl")]
    openssl: String,
    /// Block sizes in bytes (e.g. 1k,64k,4m; default `openssl speed`'s own
    /// list, 16 to 16k). Other lists run `openssl speed -bytes` once per
    /// size; targets are checked at the sizes measured.
    #[arg(long, value_delimiter = ',', value_parser = crate::units::size_arg)]
    sizes: Vec<u64>,
}

impl SpeedArgs {
    /// What `openssl speed -evp` measures: the digest when one is named.
    fn algorithm(&self) -> &str {
        self.digest.as_deref().unwrap_or(&self.cipher)
    }
}

/// Block sizes of the table by default (`openssl speed`'s own list).
const SIZES: [u64; 6] = [16, 64, 256, 1024, 8192, 16384];
/// The largest block `--sizes` takes: a request per job in flight is
/// held at once, and openssl allocates each job's buffers.
const MAX_SIZE: u64 = 64 << 20;

struct RowSpec {
    key: &'static str,
    label: &'static str,
    memory: &'static str,
    env: &'static [(&'static str, &'static str)],
    provider: bool,
    async_jobs: bool,
    /// Served by the second host, whose sec device computes with
    /// libcrypto only.
    libcrypto_host: bool,
}

const ROWS: [RowSpec; 8] = [
    RowSpec {
        key: "legacy",
        label: "legacy (syscall per request)",
        memory: "socket: data copied into and out of each message (the AF_ALG-like path)",
        env: &[
            ("WD_CRYPTO_LEGACY", "1"),
            ("WD_PROVIDER_POLICY", "offload"),
            ("WD_PROVIDER_THRESHOLD", "0"),
        ],
        provider: true,
        async_jobs: false,
        libcrypto_host: false,
    },
    RowSpec {
        key: "sync",
        label: "wd sync offload",
        memory:
            "shared staging buffer (memfd): copied in and out by the library, engine works in place",
        env: &[
            ("WD_PROVIDER_POLICY", "offload"),
            ("WD_PROVIDER_THRESHOLD", "0"),
        ],
        provider: true,
        async_jobs: false,
        libcrypto_host: false,
    },
    RowSpec {
        key: "async",
        label: "wd async jobs offload",
        memory: "shared staging buffer, one slot per job in flight (over 64 KiB: a run of a large staging area, one request)",
        env: &[
            ("WD_PROVIDER_POLICY", "offload"),
            ("WD_PROVIDER_THRESHOLD", "0"),
        ],
        provider: true,
        async_jobs: true,
        libcrypto_host: false,
    },
    RowSpec {
        key: "async-libcrypto",
        label: "wd async jobs offload, libcrypto engine",
        memory: "as the async row; the host computes with libcrypto only (engine=libcrypto)",
        env: &[
            ("WD_PROVIDER_POLICY", "offload"),
            ("WD_PROVIDER_THRESHOLD", "0"),
        ],
        provider: true,
        async_jobs: true,
        libcrypto_host: true,
    },
    RowSpec {
        key: "default",
        label: "wd default threshold",
        memory: "CPU below the threshold; above it the measured cheaper path",
        env: &[],
        provider: true,
        async_jobs: false,
        libcrypto_host: false,
    },
    RowSpec {
        key: "default-async",
        label: "wd default, async jobs",
        memory:
            "CPU below the threshold; above it offloaded, or computed here while the engine is busy",
        env: &[],
        provider: true,
        async_jobs: true,
        libcrypto_host: false,
    },
    RowSpec {
        key: "cpu-async",
        label: "CPU only, async jobs",
        memory: "as CPU only, each operation inside an async job: what the job machinery costs",
        env: &[],
        provider: false,
        async_jobs: true,
        libcrypto_host: false,
    },
    RowSpec {
        key: "cpu",
        label: "CPU only",
        memory: "application memory, OpenSSL default provider",
        env: &[],
        provider: false,
        async_jobs: false,
        libcrypto_host: false,
    },
];

#[derive(Debug, Serialize)]
struct Row {
    key: String,
    label: String,
    memory_path: String,
    /// Median throughput per block size, in 1000s of bytes per second.
    kbytes_per_sec: Vec<f64>,
    /// Each cell divided by the CPU-only cell.
    vs_cpu: Vec<f64>,
}

fn provider_dir(args: &SpeedArgs) -> Result<PathBuf, String> {
    let dir = args
        .provider_dir
        .clone()
        .or_else(|| std::env::var_os("WD_PROVIDER_DIR").map(PathBuf::from))
        .or_else(|| {
            std::env::current_exe()
                .ok()
                .and_then(|e| e.parent().map(|p| p.join("../provider")))
        })
        .ok_or("cannot tell where the provider is: give --provider-dir")?;
    if !dir.join("wd.so").is_file() {
        return Err(format!(
            "no provider at {}: build it with ./scripts/build-provider.sh (or give --provider-dir)",
            dir.join("wd.so").display()
        ));
    }
    Ok(dir)
}

/// Parse the result line of `openssl speed`: `NAME  1234.56k  ...`, in
/// thousands of bytes per second (openssl prints a rate of 10000 bytes/s
/// or less in bytes, without the `k`), one per size asked for (`sizes`).
fn parse_speed(out: &str, cipher: &str, sizes: usize) -> Result<Vec<f64>, String> {
    let line = out
        .lines()
        .rev()
        .find(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|w| w.eq_ignore_ascii_case(cipher))
        })
        .ok_or_else(|| format!("openssl speed printed no {cipher} line:\n{out}"))?;
    let vals: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| match v.strip_suffix('k') {
            Some(k) => k.parse::<f64>(),
            None => v.parse::<f64>().map(|b| b / 1000.0),
        })
        .collect::<Result<_, _>>()
        .map_err(|e| format!("cannot read '{line}': {e}"))?;
    if vals.len() != sizes {
        return Err(format!("expected {sizes} sizes in '{line}'"));
    }
    Ok(vals)
}

/// One `openssl speed` run of `row`: every size of openssl's own list, or
/// (`bytes`) that one size.
fn run_openssl(
    args: &SpeedArgs,
    row: &RowSpec,
    dir: &Path,
    socket: &str,
    bytes: Option<u64>,
) -> Result<Vec<f64>, String> {
    let mut c = Command::new(&args.openssl);
    c.args(["speed", "-elapsed", "-seconds", &args.seconds.to_string()]);
    if let Some(n) = bytes {
        c.args(["-bytes", &n.to_string()]);
    }
    if row.provider {
        c.arg("-provider-path").arg(dir);
        c.args([
            "-provider",
            "wd",
            "-provider",
            "default",
            "-propquery",
            "provider=wd",
        ]);
    }
    if row.async_jobs {
        c.args(["-async_jobs", &args.async_jobs.to_string()]);
    }
    c.args(["-evp", args.algorithm()]);
    c.env("WD_HOST", socket);
    for v in [
        "WD_CRYPTO_LEGACY",
        "WD_PROVIDER_POLICY",
        "WD_PROVIDER_THRESHOLD",
        "WD_CRYPTO_HOST",
    ] {
        c.env_remove(v);
    }
    for (k, v) in row.env {
        c.env(k, v);
    }
    let out = c
        .output()
        .map_err(|e| format!("cannot run {}: {e}", args.openssl))?;
    if !out.status.success() {
        return Err(format!(
            "openssl speed ({}) failed: {}",
            row.label,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let sizes = if bytes.is_some() { 1 } else { SIZES.len() };
    parse_speed(
        &String::from_utf8_lossy(&out.stdout),
        args.algorithm(),
        sizes,
    )
}

/// What the provider offers for `--cipher` or `--digest`, checked before
/// anything runs (openssl said only "unknown cipher", after the hosts
/// started).
fn check_algorithm(args: &mut SpeedArgs) -> Result<(), String> {
    use wd_crypto::Alg;
    let digest = args.digest.is_some();
    let offered = |a: &Alg| match a {
        Alg::Aes { .. } => !digest,
        Alg::Digest(_) => digest,
        Alg::Hmac(_) => false,
    };
    if let Some(a) = Alg::by_name(args.algorithm()).filter(offered) {
        // The canonical name from here on (rows, in-place costs, JSON).
        match &mut args.digest {
            Some(d) => *d = a.name(),
            None => args.cipher = a.name(),
        }
        return Ok(());
    }
    let names: Vec<String> = wd_crypto::ALGS
        .iter()
        .filter(|a| offered(a))
        .map(|a| a.name())
        .collect();
    Err(format!(
        "{} {}: the provider offers {}",
        if digest { "--digest" } else { "--cipher" },
        args.algorithm(),
        names.join(", ")
    ))
}

/// Run `wd speed`.
pub fn run(mut args: SpeedArgs, host: Option<&str>) -> Result<(), String> {
    if args.reps == 0 || args.seconds == 0 || args.async_jobs == 0 {
        return Err("--reps, --seconds and --async-jobs must be at least 1".into());
    }
    check_algorithm(&mut args)?;
    args.sizes.sort_unstable();
    args.sizes.dedup();
    if let Some(&n) = args.sizes.iter().find(|&&n| n == 0 || n > MAX_SIZE) {
        return Err(format!("--sizes: {n} is not a block size from 1 to 64m"));
    }
    // openssl's own list in one run per row, or one run per size.
    let per_size = !args.sizes.is_empty() && args.sizes != SIZES;
    if args.sizes.is_empty() {
        args.sizes = SIZES.to_vec();
    }
    let sizes = args.sizes.clone();
    if !args.no_svg {
        crate::chart::check_writable(&args.svg)?;
    }
    let dir = provider_dir(&args)?;
    // Hosts of our own unless one was named: the default one, and one
    // whose sec device computes with libcrypto only (when the default one
    // has another engine), both on sockets in a private directory.
    let tmp = std::env::temp_dir().join(format!("wd-speed-{}", std::process::id()));
    let mut hosts = Vec::new();
    let mut start = |name: &str, engine: Option<&str>| -> Result<String, String> {
        std::fs::create_dir_all(&tmp).map_err(|e| e.to_string())?;
        let sock = tmp.join(name).to_string_lossy().into_owned();
        let mut dev = wd_host::DeviceConfig::new("sec");
        dev.engines = args.engines;
        dev.engine = engine.map(str::to_string);
        let cfg = wd_host::HostConfig {
            socket: sock.clone(),
            socket_mode: 0o600,
            devices: vec![dev],
            ..Default::default()
        };
        hosts.push(wd_host::Host::start(&cfg).map_err(|e| e.to_string())?);
        Ok(sock)
    };
    let engine = match host {
        // The named host's own engine, and a sec device there at all:
        // without one, the offload rows would measure the CPU (the
        // provider falls back) and say nothing until the end.
        Some(h) => named_host_engine(h)?,
        None => wd_host::drivers::open(&wd_host::config::DeviceConfig::new("sec"))?
            .engine()
            .unwrap_or_else(|| "libcrypto".into()),
    };
    let multi_buffer = !engine.starts_with("libcrypto");
    let (socket, lc_socket) = match host {
        Some(h) => (h.to_string(), None),
        None => (
            start("wd.sock", None)?,
            if multi_buffer {
                Some(start("wd-libcrypto.sock", Some("libcrypto"))?)
            } else {
                None
            },
        ),
    };
    let mut _tmp = crate::temp::Removed::default();
    _tmp.add(tmp);
    let rows_run: Vec<&RowSpec> = ROWS
        .iter()
        .filter(|r| !r.libcrypto_host || lc_socket.is_some())
        .collect();
    let runs_per_row = if per_size { sizes.len() } else { 1 };
    let mut prog = Progress::new(rows_run.len() * args.reps * runs_per_row);
    let mut samples: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); sizes.len()]; rows_run.len()];
    // Interleave repetitions so drift of a shared machine hits every row alike.
    for _ in 0..args.reps {
        for (i, row) in rows_run.iter().enumerate() {
            prog.step(row.label);
            let sock = match (&lc_socket, row.libcrypto_host) {
                (Some(lc), true) => lc,
                _ => &socket,
            };
            if per_size {
                for (k, &n) in sizes.iter().enumerate() {
                    if k > 0 {
                        prog.step(row.label);
                    }
                    samples[i][k].extend(run_openssl(&args, row, &dir, sock, Some(n))?);
                }
            } else {
                let v = run_openssl(&args, row, &dir, sock, None)?;
                for (k, x) in v.into_iter().enumerate() {
                    samples[i][k].push(x);
                }
            }
        }
    }
    prog.finish();
    let med: Vec<Vec<f64>> = samples
        .into_iter()
        .map(|r| r.iter().map(|c| median(c)).collect())
        .collect();
    let cpu = med[rows_run.len() - 1].clone();
    if let Some(i) = cpu.iter().position(|&c| c.is_nan() || c <= 0.0) {
        return Err(format!(
            "the CPU-only row measured nothing at {} bytes: no ratio can be given",
            sizes[i]
        ));
    }
    let rows: Vec<Row> = rows_run
        .iter()
        .zip(&med)
        .map(|(spec, vals)| Row {
            key: spec.key.into(),
            label: spec.label.into(),
            memory_path: spec.memory.into(),
            kbytes_per_sec: vals.clone(),
            vs_cpu: vals.iter().zip(&cpu).map(|(v, c)| v / c).collect(),
        })
        .collect();
    let targets = targets(&rows, &sizes, args.algorithm());
    let copies = staging_copies(&rows, &sizes);
    // Only the cipher API works in place: AEAD messages and digests are
    // staged whole (docs/sec-device.md), so there is nothing to compare.
    let in_place_alg =
        wd_crypto::Alg::by_name(args.algorithm()).filter(|&a| wd_crypto::Cipher::serves(a));
    let in_place = match in_place_alg {
        Some(alg) => {
            prog_note(!args.json, "library sync offload, staged and in place");
            in_place_costs(&socket, args.reps, alg)?
        }
        None => Vec::new(),
    };
    let labels: Vec<String> = sizes.iter().map(|s| s.to_string()).collect();
    let svg = log_lines(
        &format!(
            "openssl speed -evp {} (-elapsed), {} engine(s)",
            args.algorithm(),
            args.engines
        ),
        &labels,
        "bytes per second (log)",
        &rows
            .iter()
            .map(|r| Series {
                name: r.label.clone(),
                values: r.kbytes_per_sec.iter().map(|v| Some(v * 1000.0)).collect(),
            })
            .collect::<Vec<_>>(),
    );
    if !args.no_svg {
        std::fs::write(&args.svg, svg)
            .map_err(|e| format!("cannot write {}: {e}", args.svg.display()))?;
    }
    if args.json {
        let v = serde_json::json!({
            "benchmark": "speed",
            "algorithm": args.algorithm(),
            "seconds": args.seconds,
            "reps": args.reps,
            "async_jobs": args.async_jobs,
            "engines": args.engines,
            "engine": engine,
            "block_sizes": sizes,
            "units": "1000s of bytes per second",
            "rows": rows,
            "staging_copies": copies,
            "in_place": in_place,
            "targets": targets,
            "svg": (!args.no_svg).then_some(&args.svg),
        });
        print_json(&v);
        return Ok(());
    }
    outln!("sec engine: {engine}\n");
    out!("| {} (1000s of bytes/s) |", args.algorithm());
    for s in &sizes {
        out!(" {s} |");
    }
    outln!();
    outln!("|---|{}", "---:|".repeat(sizes.len()));
    for r in &rows {
        out!("| {} |", r.label);
        for (v, x) in r.kbytes_per_sec.iter().zip(&r.vs_cpu) {
            out!(" {v:.2}k ({x:.3}) |");
        }
        outln!();
    }
    outln!(
        "\nIn parentheses: ratio to CPU only in the same run. Medians of {} runs of `openssl speed -elapsed -seconds {}{}`.",
        args.reps,
        args.seconds,
        if per_size { " -bytes N" } else { "" }
    );
    outln!("\nMemory path per row:");
    for r in &rows {
        outln!("- {}: {}", r.label, r.memory_path);
    }
    out!("\nThe staging copies (in and out, measured here with memcpy) per request, and their share of a sync offload request's time:");
    for c in &copies {
        out!(
            " {} B {:.0} ns ({:.1}%);",
            c.bytes,
            c.ns,
            c.share_of_sync * 100.0
        );
    }
    outln!();
    if in_place.is_empty() {
        outln!("\nIn place against staged: not measured for {} (only the cipher API works in place; AEAD messages and digests are staged whole).", args.algorithm());
    } else {
        out!("\nThe library itself, sync offload through wd-crypto (one stream, medians of {} runs): staged through the staging area against in place on WrapDrive shared memory (no copies), the caller writing the input and reading the output each time:", args.reps);
        for c in &in_place {
            out!(
                " {} B {:.0} / {:.0} ns ({:.3}x);",
                c.bytes,
                c.staged_ns,
                c.in_place_ns,
                c.speedup
            );
        }
        out!("\nIn place with data the caller does not touch (made and used elsewhere, as by a file load or another device), against staged as above:");
        for c in &in_place {
            out!(
                " {} B {:.0} ns ({:.3}x);",
                c.bytes,
                c.untouched_ns,
                c.untouched_speedup
            );
        }
        outln!();
    }
    for t in &targets {
        outln!("{}", t.line());
    }
    if !args.no_svg {
        outln!("\nChart: {}", args.svg.display());
    }
    Ok(())
}

/// What copying one request into the staging area and its result out
/// costs, against the time of a sync offload request of that size.
#[derive(Debug, Serialize)]
struct CopyCost {
    bytes: u64,
    /// Nanoseconds for both copies.
    ns: f64,
    share_of_sync: f64,
}

fn staging_copies(rows: &[Row], sizes: &[u64]) -> Vec<CopyCost> {
    let sync = rows.iter().find(|r| r.key == "sync");
    let max = sizes.iter().copied().max().unwrap_or(0) as usize;
    let mut src = vec![0x5au8; max];
    let mut stage = vec![0u8; max];
    sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let n = n as usize;
            // Best of 5 timings, each moving 32 MiB in and 32 MiB out (at
            // least one copy of a larger block).
            let reps = ((32 << 20) / n.max(64)).max(1);
            let ns = (0..5)
                .map(|_| {
                    let t = std::time::Instant::now();
                    for _ in 0..reps {
                        stage[..n].copy_from_slice(std::hint::black_box(&src[..n]));
                        src[..n].copy_from_slice(std::hint::black_box(&stage[..n]));
                    }
                    t.elapsed().as_nanos() as f64 / reps as f64
                })
                .fold(f64::INFINITY, f64::min);
            let request_ns = sync.map_or(f64::NAN, |r| n as f64 / r.kbytes_per_sec[i] * 1e6);
            CopyCost {
                bytes: n as u64,
                ns,
                share_of_sync: ns / request_ns,
            }
        })
        .collect()
}

/// A sync offload request through the library from ordinary memory
/// (staged: copied in and out) and from WrapDrive shared memory (in place).
#[derive(Debug, Serialize)]
struct InPlaceCost {
    bytes: u64,
    /// Nanoseconds per request, staged.
    staged_ns: f64,
    /// Nanoseconds per request, in place.
    in_place_ns: f64,
    /// staged / in place.
    speedup: f64,
    /// Nanoseconds per request in place when the caller neither writes
    /// the input nor reads the output (data that another device or a file
    /// load made, passed on to another): only the engine's core touches
    /// the bytes.
    untouched_ns: f64,
    /// staged / untouched.
    untouched_speedup: f64,
}

/// How [`in_place_costs`] sends a request.
#[derive(Clone, Copy, PartialEq)]
enum Way {
    /// From ordinary memory, copied in and out by the library.
    Staged,
    /// From shared memory the caller wrote, into shared memory it reads.
    InPlace,
    /// From shared memory to shared memory the caller does not touch.
    Untouched,
}

fn prog_note(show: bool, what: &str) {
    if show {
        eprintln!("measuring {what}...");
    }
}

/// The engine of the sec device of host `h` (its `devN/engine`), or why
/// the run cannot measure offload there.
fn named_host_engine(h: &str) -> Result<String, String> {
    let attrs = wrapdrive::HostConn::connect(h)
        .and_then(|c| c.attrs(""))
        .map_err(|e| format!("--host {h}: {e}"))?;
    let dev = attrs
        .iter()
        .find(|a| a.path.ends_with("/driver") && a.value == "sec")
        .map(|a| a.path.trim_end_matches("driver").to_string())
        .ok_or_else(|| {
            format!("--host {h} has no sec device (see `wd ls`): the offload rows would measure the CPU")
        })?;
    Ok(attrs
        .iter()
        .find(|a| a.path == format!("{dev}engine"))
        .map_or_else(|| "libcrypto".into(), |a| a.value.clone()))
}

/// Time sync offload requests of the library on the host at `socket`,
/// staged, in place, and in place untouched by the caller, in turn
/// (`reps` rounds of ~0.2 s each way per size), and report the medians.
fn in_place_costs(
    socket: &str,
    reps: usize,
    alg: wd_crypto::Alg,
) -> Result<Vec<InPlaceCost>, String> {
    use wd_crypto::{Cipher, Direction};
    std::env::set_var("WD_CRYPTO_HOST", socket);
    wd_crypto::config::set_fallback(false);
    const SIZES_IN_PLACE: [usize; 4] = [1024, 8192, 16384, 65536];
    let max = SIZES_IN_PLACE[SIZES_IN_PLACE.len() - 1];
    // Two different halves: XTS refuses a key whose halves are equal.
    let key: Vec<u8> = (0..alg.key_len() as u8).collect();
    let mut c = Cipher::new(&alg.name(), &key, Direction::Encrypt).map_err(|e| e.to_string())?;
    if c.iv().len() == 16 {
        c.set_iv(&[1u8; 16]).map_err(|e| e.to_string())?;
    }
    let src = wrapdrive::SharedBuf::new(max).map_err(|e| e.to_string())?;
    let dst = wrapdrive::SharedBuf::new(max).map_err(|e| e.to_string())?;
    let (src, dst) = (
        wrapdrive::SharedSpan::of(&src),
        wrapdrive::SharedSpan::of(&dst),
    );
    let fresh = vec![0x5au8; max];
    let mut input = vec![0u8; max];
    let mut output = vec![0u8; max];
    let mut seen = vec![0u8; max];
    let before = wd_crypto::stats().offload_in_place_bytes;
    let mut in_place_bytes = 0u64;
    let mut rows = Vec::new();
    for n in SIZES_IN_PLACE {
        let (i, o) = (src.sub(0, n as u64), dst.sub(0, n as u64));
        let mut time = |way: Way| -> Result<f64, String> {
            let t = std::time::Instant::now();
            let mut count = 0u64;
            // Staged and in place, each request's input is written and
            // its output read, as an application does: the bytes cross
            // between the caller's core and the engine's either way, only
            // the staging copies differ.
            while t.elapsed().as_secs_f64() < 0.2 {
                let r = match way {
                    Way::InPlace => {
                        i.write(0, &fresh[..n]);
                        let r = c.update_shared_offload(i, o);
                        o.read(0, &mut seen[..n]);
                        r
                    }
                    Way::Untouched => c.update_shared_offload(i, o),
                    Way::Staged => {
                        input[..n].copy_from_slice(&fresh[..n]);
                        let r = c.update_offload(&input[..n], &mut output[..n]);
                        seen[..n].copy_from_slice(&output[..n]);
                        r
                    }
                };
                r.map_err(|e| format!("library offload of {n} bytes: {e}"))?;
                std::hint::black_box(&seen);
                count += 1;
            }
            if way != Way::Staged {
                in_place_bytes += count * n as u64;
            }
            Ok(t.elapsed().as_nanos() as f64 / count as f64)
        };
        let (mut staged, mut shared, mut untouched) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..reps {
            staged.push(time(Way::Staged)?);
            shared.push(time(Way::InPlace)?);
            untouched.push(time(Way::Untouched)?);
        }
        let (staged_ns, in_place_ns) = (median(&staged), median(&shared));
        let untouched_ns = median(&untouched);
        rows.push(InPlaceCost {
            bytes: n as u64,
            staged_ns,
            in_place_ns,
            speedup: staged_ns / in_place_ns,
            untouched_ns,
            untouched_speedup: staged_ns / untouched_ns,
        });
    }
    let moved = wd_crypto::stats().offload_in_place_bytes - before;
    if moved != in_place_bytes {
        return Err(format!(
            "of {in_place_bytes} bytes sent in place only {moved} were worked in place"
        ));
    }
    Ok(rows)
}

/// The targets of the run: for AES-128-CBC (the multi-buffer engine's
/// cipher) the offload targets too; for every algorithm, that the default
/// rows are never below 0.95x CPU only. Each at the sizes measured: one
/// whose size was not measured is left out.
fn targets(rows: &[Row], sizes: &[u64], alg: &str) -> Vec<Target> {
    let get = |key: &str| rows.iter().find(|r| r.key == key).expect("every row");
    let at = |s: u64| sizes.iter().position(|&x| x == s);
    // The worst ratio at `from` bytes and above (NaN: none measured).
    let worst = |key: &str, from: u64| {
        let cells: Vec<f64> = sizes
            .iter()
            .zip(&get(key).vs_cpu)
            .filter(|(&n, _)| n >= from)
            .map(|(_, &x)| x)
            .collect();
        match cells.is_empty() {
            true => f64::NAN,
            false => cells.into_iter().fold(f64::INFINITY, f64::min),
        }
    };
    let mut t = Vec::new();
    let cbc = alg.eq_ignore_ascii_case("aes-128-cbc");
    t.push(Target::at_least(
        "default async / CPU, worst size",
        worst("default-async", 0),
        0.95,
    ));
    t.push(Target::at_least(
        "default / CPU, worst size",
        worst("default", 0),
        0.95,
    ));
    if !cbc {
        return t;
    }
    for size in [1024, 8192, 16384] {
        if let Some(i) = at(size) {
            t.push(Target::at_least(
                format!("async / CPU at {size} B"),
                get("async").vs_cpu[i],
                2.0,
            ));
        }
    }
    if sizes.iter().any(|&n| n >= 1024) {
        t.push(Target::at_least(
            "default async / CPU, worst size >= 1 KiB",
            worst("default-async", 1024),
            1.5,
        ));
    }
    if let Some(i) = at(8192) {
        t.push(Target::at_least(
            "sync / CPU at 8192 B",
            get("sync").vs_cpu[i],
            0.9,
        ));
    }
    if let Some(i) = at(16) {
        let s16 = get("sync").kbytes_per_sec[i] / get("legacy").kbytes_per_sec[i];
        t.push(Target::at_least("sync / legacy at 16 B", s16, 20.0));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_openssl_speed_output() {
        let out = "Doing AES-128-CBC for 1s on 16 size blocks: 1 AES-128-CBC's in 1.00s\n\
                   type             16 bytes     64 bytes    256 bytes   1024 bytes   8192 bytes  16384 bytes\n\
                   AES-128-CBC     148502.99k   518093.31k   944646.91k  1241206.78k  1379811.33k  1379303.42k\n";
        let v = parse_speed(out, "aes-128-cbc", 6).unwrap();
        assert_eq!(v.len(), 6);
        assert_eq!(v[0], 148502.99);
        // Slow rates come in bytes per second, without the k.
        let slow = parse_speed(
            "AES-128-CBC 5000.00 20000.00k 1k 2k 3k 4k\n",
            "aes-128-cbc",
            6,
        );
        assert_eq!(slow.unwrap()[..2], [5.0, 20000.0]);
        assert!(parse_speed("nothing", "aes-128-cbc", 6).is_err());
        assert!(parse_speed("AES-128-CBC 1k 2k\n", "aes-128-cbc", 6).is_err());
        // One size (-bytes N).
        let one = "AES-128-CBC 4194304.00k\n";
        assert_eq!(parse_speed(one, "aes-128-cbc", 1).unwrap(), [4194304.0]);
    }
}
