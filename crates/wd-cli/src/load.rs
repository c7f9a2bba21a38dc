//! `wd load FILE`: a file into a shareable buffer, fast, with a progress
//! bar; then optionally verify it, and hand the buffer to a command.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::report::emit;
use crate::units::{format_rate, format_size, size_arg};
use sha2::{Digest, Sha256};
use wd_heap::{
    alloc_and_read, Buffer, Engine, EngineUsed, IoMode, IoUsed, LoadOptions, PagePolicy,
};

/// I/O mode on the command line.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum IoArg {
    /// Direct I/O unless the file is mostly cached or the filesystem cannot.
    Auto,
    /// O_DIRECT, or fail.
    Direct,
    /// Through the page cache.
    Buffered,
}

/// Engine on the command line.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum EngineArg {
    /// io_uring, else reader threads.
    Auto,
    /// io_uring, or fail.
    Uring,
    /// Reader threads.
    Threads,
}

/// Pages on the command line.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum PagesArg {
    /// Hugetlb pages if the pool has enough, else normal pages.
    Auto,
    /// Normal pages.
    Normal,
    /// 2 MiB hugetlb pages, or fail.
    #[value(name = "2m")]
    Huge2M,
    /// 1 GiB hugetlb pages, or fail.
    #[value(name = "1g")]
    Huge1G,
}

/// Options of `wd load`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "EXAMPLES:\n  wd load model.bin\n  wd load model.bin --sha256 9f86d0...\n  wd load model.bin -- ./infer --weights-fd {fd}\n\nThe command gets the buffer as an inherited descriptor: $WD_BUF_FD (also\nsubstituted for {fd} in its arguments), $WD_BUF_LEN bytes of file data,\n$WD_BUF_SIZE bytes mapped, $WD_BUF_PAGES the page size (4k, 2m, 1g)."
)]
pub struct LoadArgs {
    /// The file to load.
    file: PathBuf,
    /// How to read: auto (direct I/O unless the file is cached or the
    /// filesystem cannot), direct, buffered.
    #[arg(long, value_enum, default_value = "auto")]
    io: IoArg,
    /// What issues the reads: auto (io_uring, else threads), uring, threads.
    #[arg(long, value_enum, default_value = "auto")]
    engine: EngineArg,
    /// Bytes allocated per gather before their reads start (e.g. 128M).
    #[arg(long, default_value = "128M", value_parser = size_arg)]
    gather: u64,
    /// Bytes per read (e.g. 4M).
    #[arg(long, default_value = "4M", value_parser = size_arg)]
    chunk: u64,
    /// Reads in flight (0: 8 for direct I/O, 1 for buffered).
    #[arg(long, default_value_t = 0)]
    depth: u32,
    /// Do not allocate pages ahead of the reads (the reads fault them in).
    #[arg(long)]
    no_populate: bool,
    /// Allocate the whole buffer first, then read (no overlap).
    #[arg(long)]
    no_overlap: bool,
    /// Page size of the buffer: auto, normal, 2m, 1g.
    #[arg(long, value_enum, default_value = "auto")]
    pages: PagesArg,
    /// NUMA node to put the buffer's pages on (advice; ignored without NUMA).
    #[arg(long)]
    node: Option<u32>,
    /// Verify the loaded bytes against this SHA-256 (hex); fail on mismatch.
    #[arg(long, value_name = "HEX")]
    sha256: Option<String>,
    /// Print the SHA-256 of the loaded bytes.
    #[arg(long)]
    print_sha256: bool,
    /// Seal the buffer against writes before handing it to the command.
    #[arg(long)]
    read_only: bool,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
    /// Command to run with the buffer (after `--`).
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

/// Redraws a one-line bar on stderr, at most ten times a second.
struct Bar {
    last: Option<Instant>,
    drawn: bool,
}

impl Bar {
    fn draw(&mut self, p: &wd_heap::Progress) {
        let now = Instant::now();
        let finished = p.read >= p.total;
        if !finished
            && self
                .last
                .is_some_and(|l| now - l < Duration::from_millis(100))
        {
            return;
        }
        self.last = Some(now);
        self.drawn = true;
        let width = 30usize;
        let frac = if p.total == 0 {
            1.0
        } else {
            p.read as f64 / p.total as f64
        };
        let fill = ((frac * width as f64) as usize).min(width);
        let secs = p.elapsed.as_secs_f64();
        let rate = if secs > 0.0 {
            p.read as f64 / secs
        } else {
            0.0
        };
        let eta = if rate > 0.0 && !finished {
            format!("ETA {:.1} s", (p.total - p.read) as f64 / rate)
        } else {
            format!("{secs:.2} s")
        };
        eprint!(
            "\r[{}{}] {} / {}  {}  {eta}   ",
            "#".repeat(fill),
            ".".repeat(width - fill),
            format_size(p.read),
            format_size(p.total),
            format_rate(p.read, secs),
        );
        let _ = std::io::stderr().flush();
    }
}

/// SHA-256 of the buffer's bytes (copied out in slices: the buffer is
/// shared memory, never borrowed as a slice).
pub fn sha256(buf: &Buffer) -> String {
    let mut h = Sha256::new();
    let mut tmp = vec![0u8; (4 << 20).min(buf.len() as usize)];
    let mut off = 0u64;
    while off < buf.len() {
        let n = ((buf.len() - off) as usize).min(tmp.len());
        buf.read_at(off, &mut tmp[..n]).expect("inside the buffer");
        h.update(&tmp[..n]);
        off += n as u64;
    }
    h.finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>()
}

/// Run `wd load`.
pub fn run(args: LoadArgs) -> Result<(), String> {
    let expected = match &args.sha256 {
        Some(h) => {
            let h = h.trim().to_ascii_lowercase();
            if h.len() != 64 || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(format!(
                    "--sha256 wants 64 hex digits, got '{}'",
                    h.chars().take(80).collect::<String>()
                ));
            }
            Some(h)
        }
        None => None,
    };
    let mut opts = LoadOptions::default()
        .io(match args.io {
            IoArg::Auto => IoMode::Auto,
            IoArg::Direct => IoMode::Direct,
            IoArg::Buffered => IoMode::Buffered,
        })
        .engine(match args.engine {
            EngineArg::Auto => Engine::Auto,
            EngineArg::Uring => Engine::Uring,
            EngineArg::Threads => Engine::Threads,
        })
        .gather(args.gather)
        .chunk(args.chunk)
        .depth(args.depth)
        .populate(!args.no_populate)
        .overlap(!args.no_overlap)
        .pages(match args.pages {
            PagesArg::Auto => PagePolicy::Auto,
            PagesArg::Normal => PagePolicy::Normal,
            PagesArg::Huge2M => PagePolicy::Huge2M,
            PagesArg::Huge1G => PagePolicy::Huge1G,
        });
    opts.node = args.node;
    let show_bar = !args.quiet && !args.json && std::io::stderr().is_terminal();
    if show_bar {
        let mut bar = Bar {
            last: None,
            drawn: false,
        };
        opts = opts.progress(move |p| bar.draw(p));
    }
    let result = alloc_and_read(&args.file, opts);
    if show_bar {
        eprintln!();
    }
    let loaded = result.map_err(|e| e.to_string())?;
    let (buf, r) = (loaded.buffer, loaded.report);
    let digest = (expected.is_some() || args.print_sha256).then(|| sha256(&buf));
    let verified = match (&expected, &digest) {
        (Some(want), Some(got)) if want != got => {
            return Err(format!(
                "{}: SHA-256 mismatch: expected {want}, loaded bytes hash to {got}",
                args.file.display()
            ))
        }
        (Some(_), Some(_)) => Some(true),
        _ => None,
    };
    let secs = r.elapsed.as_secs_f64();
    let mut out = String::new();
    if args.json {
        let v = serde_json::json!({
            "file": args.file.display().to_string(),
            "bytes": r.bytes,
            "seconds": secs,
            "bytes_per_second": r.rate(),
            "mode": r.mode(),
            "io": match r.io { IoUsed::Direct => "direct", IoUsed::Buffered => "buffered" },
            "engine": match r.engine { EngineUsed::Uring => "io_uring".to_string(), EngineUsed::Threads(n) => format!("threads:{n}") },
            "pages": r.pages.short(),
            "gather": r.gather,
            "chunk": r.chunk,
            "depth": r.depth,
            "populate": r.populate,
            "overlap": r.overlap,
            "first_gather_seconds": r.first_gather.map(|d| d.as_secs_f64()),
            "allocated_seconds": r.alloc_done.map(|d| d.as_secs_f64()),
            "reads": r.reads,
            "cached_before": r.cached_before,
            "notes": r.notes,
            "sha256": digest,
            "verified": verified,
        });
        let _ = writeln!(out, "{}", serde_json::to_string_pretty(&v).expect("json"));
    } else {
        let _ = writeln!(
            out,
            "loaded {}: {} in {:.3} s ({})",
            args.file.display(),
            format_size(r.bytes),
            secs,
            format_rate(r.bytes, secs)
        );
        let _ = writeln!(out, "mode: {}", r.mode());
        if let (Some(f), Some(a)) = (r.first_gather, r.alloc_done) {
            let _ = writeln!(
                out,
                "allocation: first gather after {:.1} ms, all allocated after {:.1} ms",
                f.as_secs_f64() * 1e3,
                a.as_secs_f64() * 1e3
            );
        }
        for n in &r.notes {
            let _ = writeln!(out, "note: {n}");
        }
        if let Some(d) = &digest {
            let _ = writeln!(
                out,
                "sha256: {d}{}",
                if verified == Some(true) {
                    " (verified)"
                } else {
                    ""
                }
            );
        }
    }
    emit(&out);
    if args.command.is_empty() {
        return Ok(());
    }
    if args.read_only {
        buf.seal_writes().map_err(|e| e.to_string())?;
    }
    let fd = buf.export_inheritable().map_err(|e| e.to_string())?;
    let n = fd.as_raw_fd().to_string();
    let argv: Vec<String> = args.command.iter().map(|a| a.replace("{fd}", &n)).collect();
    let status = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .env("WD_BUF_FD", &n)
        .env("WD_BUF_LEN", buf.len().to_string())
        .env("WD_BUF_SIZE", buf.capacity().to_string())
        .env("WD_BUF_PAGES", buf.pages().short())
        .status()
        .map_err(|e| format!("cannot run {}: {e}", argv[0]))?;
    drop(fd);
    match status.code() {
        Some(0) => Ok(()),
        Some(c) => {
            // The command's verdict is ours; the buffer goes with the process.
            drop(buf);
            std::process::exit(c)
        }
        None => {
            // Ended by a signal: said, and exited as a shell reports
            // such a command (128 + the signal), the verdict still ours.
            use std::os::unix::process::ExitStatusExt;
            let sig = status.signal().unwrap_or(0);
            eprintln!("wd load: {} was ended by signal {sig}", argv[0]);
            drop(buf);
            std::process::exit(128 + sig)
        }
    }
}
