//! One chaos client (`wd chaos-client`, started by `wd chaos`): a process
//! that works one device through one memory model and checks every byte
//! the device returns, until its standard input closes (or it is killed,
//! which is the point).
//!
//! Besides plain requests it churns what a kill should find half done:
//! shares made and undone, requests that fault, sessions opened and
//! closed, NVMe queues deleted and created.
//!
//! Standard output carries, one per line: `ready` once set up, `stat OPS
//! P50_NS P99_NS` every half second, `done OPS FAULTS FALLBACKS` at the
//! end. The exit code says how it ended ([`EXIT_DATA`] is the one that
//! must never happen).

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use wd_dummy_msg::CopyMsg;
use wd_nvme_driver::{Controller, NvmeError, Options};
use wrapdrive::{Capability, ClientError, HostConn, Queue, SharedBuf, Status, CAPA_SHARE_ALL};

use crate::report::percentile;

/// Exit: stopped when asked, every check passed.
pub const EXIT_OK: u8 = 0;
/// Exit: something failed that is not the host's absence.
pub const EXIT_FAILED: u8 = 1;
/// Exit: a device returned wrong data.
pub const EXIT_DATA: u8 = 2;
/// Exit: the host went away (killed) and the client cannot go on.
pub const EXIT_HOST_GONE: u8 = 3;
/// Exit: the resource this client needs is taken (every namespace).
pub const EXIT_BUSY: u8 = 4;

/// What a client works with.
pub const KINDS: [&str; 6] = [
    "copy-shared",
    "copy-heap",
    "copy-share-all",
    "cipher",
    "nvme",
    "zip",
];

/// Options of `wd chaos-client`.
#[derive(clap::Args, Debug)]
pub struct ClientArgs {
    /// copy-shared, copy-heap, copy-share-all, cipher, nvme or zip.
    #[arg(long)]
    kind: String,
    /// Seed of the client's data and choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// SplitMix64: small, seedable, good enough to pick sizes and patterns.
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

/// How a client run ended.
enum End {
    Stopped,
    HostGone(String),
    Busy(String),
    Data(String),
    Failed(String),
}

impl From<ClientError> for End {
    fn from(e: ClientError) -> End {
        if e.status() == Status::HostGone {
            End::HostGone(e.to_string())
        } else {
            End::Failed(e.to_string())
        }
    }
}

impl From<NvmeError> for End {
    fn from(e: NvmeError) -> End {
        match e {
            NvmeError::Client(c) => c.into(),
            e => End::Failed(e.to_string()),
        }
    }
}

impl From<wd_crypto::CryptoError> for End {
    fn from(e: wd_crypto::CryptoError) -> End {
        match e {
            wd_crypto::CryptoError::Device {
                status: Status::HostGone,
                message,
            } => End::HostGone(message),
            e => End::Failed(e.to_string()),
        }
    }
}

/// Counts and latencies of a run, reported on standard output.
struct Report {
    ops: u64,
    faults: u64,
    /// Requests lost to a host restart (the documented unsafe cases: a
    /// cipher stream in flight, an NVMe command in flight), after which
    /// the client carried on.
    restarts: u64,
    /// Compression streams rebuilt from their journal after a restart.
    rebuilt: u64,
    period: Vec<u64>,
    last: Instant,
    stop: Arc<AtomicBool>,
}

impl Report {
    fn new(stop: Arc<AtomicBool>) -> Report {
        Report {
            ops: 0,
            faults: 0,
            restarts: 0,
            rebuilt: 0,
            period: Vec::new(),
            last: Instant::now(),
            stop,
        }
    }

    /// One request checked, `t` after it started. Prints the period's
    /// figures every half second.
    fn op(&mut self, t: Instant) {
        self.ops += 1;
        self.period.push(t.elapsed().as_nanos() as u64);
        if self.last.elapsed() >= Duration::from_millis(500) {
            self.period.sort_unstable();
            line(&format!(
                "stat {} {} {}",
                self.period.len(),
                percentile(&self.period, 0.5),
                percentile(&self.period, 0.99)
            ));
            self.period.clear();
            self.last = Instant::now();
        }
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// One line to the orchestrator; when it is gone, so is this client.
fn line(s: &str) {
    let mut o = std::io::stdout().lock();
    if writeln!(o, "{s}").and_then(|()| o.flush()).is_err() {
        std::process::exit(EXIT_FAILED as i32);
    }
}

/// Run a client; returns its exit code.
pub fn run(args: ClientArgs) -> u8 {
    let stop = Arc::new(AtomicBool::new(false));
    {
        // Standard input closing is the order to stop.
        let stop = stop.clone();
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
            stop.store(true, Ordering::Relaxed);
        });
    }
    let mut rng = Rng::new(args.seed);
    let mut report = Report::new(stop);
    let end = match args.kind.as_str() {
        "copy-shared" | "copy-heap" | "copy-share-all" => {
            copy(&args.kind, &mut rng, &mut report).unwrap_or_else(|e| e)
        }
        "cipher" => cipher(&mut rng, &mut report).unwrap_or_else(|e| e),
        "nvme" => nvme(&mut rng, &mut report).unwrap_or_else(|e| e),
        "zip" => zip(&mut rng, &mut report).unwrap_or_else(|e| e),
        k => End::Failed(format!("unknown kind '{k}' (known: {})", KINDS.join(", "))),
    };
    let fallbacks = wd_crypto::stats().cpu_requests;
    line(&format!(
        "done {} {} {fallbacks} {} {}",
        report.ops, report.faults, report.restarts, report.rebuilt
    ));
    let (code, why) = match end {
        End::Stopped => (EXIT_OK, None),
        End::HostGone(m) => (EXIT_HOST_GONE, Some(m)),
        End::Busy(m) => (EXIT_BUSY, Some(m)),
        End::Data(m) => (EXIT_DATA, Some(format!("DATA ERROR: {m}"))),
        End::Failed(m) => (EXIT_FAILED, Some(m)),
    };
    if let Some(w) = why {
        eprintln!("chaos-client {} (seed {}): {w}", args.kind, args.seed);
    }
    code
}

/// Connect, waiting up to 2 s for a host that is restarting (a client
/// started in the gap).
fn host() -> Result<Arc<HostConn>, End> {
    let t = Instant::now();
    loop {
        match HostConn::from_env() {
            Ok(h) => return Ok(h),
            Err(e) if e.status() == Status::HostGone && t.elapsed() < Duration::from_secs(2) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => return Err(End::HostGone(format!("connect: {e}"))),
        }
    }
}

/// Client memory a copy works in, in one of the three models.
enum Mem {
    Shared(SharedBuf),
    Heap(wd_heap::Buffer),
    /// Plain process memory, reached by the host through the queue's
    /// SHARE_ALL descriptor.
    Own(Box<[u8]>),
}

impl Mem {
    fn new(model: &str, len: usize, q: &mut Queue) -> Result<Mem, End> {
        let m = match model {
            "copy-shared" => Mem::Shared(SharedBuf::new(len)?),
            "copy-heap" => Mem::Heap(
                wd_heap::Heap::process()
                    .alloc(len as u64, &wd_heap::AllocOptions::default())
                    .map_err(|e| End::Failed(e.to_string()))?,
            ),
            _ => Mem::Own(vec![0u8; len].into_boxed_slice()),
        };
        m.share(q)?;
        Ok(m)
    }

    fn addr(&self) -> u64 {
        match self {
            Mem::Shared(b) => b.addr(),
            Mem::Heap(b) => b.addr(),
            Mem::Own(b) => b.as_ptr() as u64,
        }
    }

    fn share(&self, q: &mut Queue) -> Result<(), End> {
        match self {
            Mem::Shared(b) => q.share(b.addr(), b.len())?,
            Mem::Heap(b) => q.share_buffer(b)?,
            Mem::Own(_) => {}
        }
        Ok(())
    }

    fn unshare(&self, q: &mut Queue) -> Result<(), End> {
        match self {
            Mem::Shared(b) => q.unshare(b.addr(), b.len())?,
            Mem::Heap(b) => q.unshare_buffer(b)?,
            Mem::Own(_) => {}
        }
        Ok(())
    }

    fn write(&mut self, data: &[u8]) {
        match self {
            Mem::Shared(b) => b.write(0, data),
            Mem::Heap(b) => b.write_at(0, data).expect("inside the buffer"),
            Mem::Own(b) => b[..data.len()].copy_from_slice(data),
        }
    }

    fn read(&mut self, out: &mut [u8]) {
        match self {
            Mem::Shared(b) => b.read(0, out),
            Mem::Heap(b) => b.read_at(0, out).expect("inside the buffer"),
            // The host wrote here through the process's memory file: the
            // compiler must not assume these bytes unchanged.
            Mem::Own(b) => out.copy_from_slice(&std::hint::black_box(&mut **b)[..out.len()]),
        }
    }
}

const COPY_MAX: usize = 64 << 10;

/// Dummy copies of random sizes and contents, each checked; shares made
/// and undone; requests that fault, and the queue still working after.
fn copy(model: &str, rng: &mut Rng, report: &mut Report) -> Result<End, End> {
    let h = host()?;
    let mut capa = Capability::new("memcpy").depth(16);
    if model == "copy-share-all" {
        capa = capa.flags(CAPA_SHARE_ALL);
    }
    let mut q = h.request_queue(&capa)?;
    // Copies may run again on a restarted host: the queue makes itself
    // again and sends what was in flight.
    q.set_redo_policy(wd_dummy_msg::redo_safe);
    let mut src = Mem::new(model, COPY_MAX, &mut q)?;
    let mut dst = Mem::new(model, COPY_MAX, &mut q)?;
    line("ready");
    let mut data = vec![0u8; COPY_MAX];
    let mut back = vec![0u8; COPY_MAX];
    let mut n = 0u64;
    while !report.stopped() {
        n += 1;
        if n % 16 == 0 && model != "copy-share-all" {
            // A share made and undone: a kill lands mid-share now and then.
            let extra = Mem::new(model, 8192, &mut q)?;
            extra.unshare(&mut q)?;
        }
        if n % 32 == 0 {
            fault(model, &mut q, &dst)?;
            report.faults += 1;
        }
        let len = rng.range(1, COPY_MAX as u64) as usize;
        rng.fill(&mut data[..len]);
        // The destination holds the inverse first: a copy that did
        // nothing is caught.
        let inverse: Vec<u8> = data[..len].iter().map(|b| !b).collect();
        dst.write(&inverse);
        src.write(&data[..len]);
        let t = Instant::now();
        let d = q.call(
            CopyMsg {
                src: src.addr(),
                dst: dst.addr(),
                len: len as u64,
            }
            .to_desc(0),
        )?;
        if d.status != 0 {
            return Err(End::Failed(format!(
                "copy of {len} bytes: status {}",
                d.status
            )));
        }
        dst.read(&mut back[..len]);
        if back[..len] != data[..len] {
            let at = back
                .iter()
                .zip(&data)
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            return Err(End::Data(format!(
                "copy of {len} bytes differs from byte {at} on"
            )));
        }
        report.op(t);
    }
    Ok(End::Stopped)
}

/// A copy from memory the device may not reach must fail with a status
/// (an IOMMU fault), and leave the destination alone.
fn fault(model: &str, q: &mut Queue, dst: &Mem) -> Result<(), End> {
    // Memory the client has but never shared (or, with SHARE_ALL, an
    // address no process maps: page 1).
    let unshared = SharedBuf::new(4096)?;
    let src = if model == "copy-share-all" {
        0x1000
    } else {
        unshared.addr()
    };
    let d = q.call(
        CopyMsg {
            src,
            dst: dst.addr(),
            len: 4096,
        }
        .to_desc(0),
    )?;
    if d.status == 0 {
        return Err(End::Data(format!(
            "a copy from unshared memory at {src:#x} succeeded"
        )));
    }
    Ok(())
}

/// Whether a compression call failed on a host restart: a request in
/// flight lost to it is counted; without a queue (its host died; one is
/// asked for again after `RETRY_AFTER`) nothing was in flight, and the
/// client waits a little rather than spin through failures.
fn met_restart(report: &mut Report, e: &wd_comp::CompError) -> bool {
    match e {
        wd_comp::CompError::Device(c) if c.status() == Status::HostGone => {
            report.restarts += 1;
            true
        }
        wd_comp::CompError::NoQueue(_) => {
            std::thread::sleep(Duration::from_millis(20));
            true
        }
        _ => false,
    }
}

/// Compression through the library, forced onto the zip device (no
/// fallback): batches (or asynchronous requests) of random blocks in
/// random formats, each stream compared byte for byte with the same engine
/// on the CPU (decoded on the CPU instead where the engine's output is not
/// reproducible) and decompressed back on the device; now and then a
/// stream session, and a long block at a slow level, which the device
/// cuts in parts.
fn zip(rng: &mut Rng, report: &mut Report) -> Result<End, End> {
    use wd_comp::{Algorithm, CompError, Compressor, Config, Policy};
    let mut dev = Compressor::new(
        Some(host()?),
        Config {
            policy: Policy::Offload,
            threshold: 0,
            fallback: false,
            depth: 8,
            journal_limit: wd_comp::DEFAULT_JOURNAL_LIMIT,
            split_min: 0,
        },
    );
    // Large blocks alone under the auto policy, fallback on: cut between
    // the device and this thread.
    let mut auto = Compressor::new(Some(host()?), Config::default());
    let mut cpu = wd_zip_codec::Engine::new();
    let reproducible = wd_zip_codec::reproducible();
    let words: [&[u8]; 6] = [
        b"queue ",
        b"domain ",
        b"IOVA ",
        b"engine ",
        b"session\n",
        b"PASID ",
    ];
    line("ready");
    // A batch that meets a host restart fails with the host gone (its
    // queue could not say what became of its requests) or runs again on
    // the new host; either way nothing wrong may come back.
    let gone = |e: &CompError| match e {
        CompError::Device(c) => c.status() == Status::HostGone,
        CompError::NoQueue(_) => true,
        _ => false,
    };
    while !report.stopped() {
        let alg = Algorithm::ALL[rng.range(0, Algorithm::ALL.len() as u64 - 1) as usize];
        let blocks: Vec<Vec<u8>> = (0..rng.range(1, 8))
            .map(|_| {
                let len = rng.range(1, 64 << 10) as usize;
                let mut b = Vec::with_capacity(len + 16);
                while b.len() < len {
                    if rng.next() % 5 == 0 {
                        b.push(rng.next() as u8);
                    } else {
                        b.extend_from_slice(words[rng.range(0, 5) as usize]);
                    }
                }
                b.truncate(len);
                b
            })
            .collect();
        let refs: Vec<&[u8]> = blocks.iter().map(|b| &b[..]).collect();
        let t = Instant::now();
        // Half the time as a batch, half through the asynchronous API
        // (all started, then finished newest first).
        let streams = match if rng.next() % 2 == 0 {
            dev.compress_blocks(alg, 1, &refs)
        } else {
            compress_async(&mut dev, alg, &refs)
        } {
            Ok(z) => z,
            Err(e) if met_restart(report, &e) => continue,
            Err(e) => return Err(End::Failed(e.to_string())),
        };
        for (b, z) in blocks.iter().zip(&streams) {
            if !reproducible {
                let mut back = vec![0u8; b.len()];
                let ok = cpu
                    .decompress(alg, &z[..], &mut back[..], 0)
                    .is_ok_and(|g| g.consumed == z.len() && g.produced == b.len());
                if !ok || back != *b {
                    return Err(End::Data(format!(
                        "{alg} stream of {} bytes does not decode to its block on the CPU",
                        b.len()
                    )));
                }
                continue;
            }
            let mut want = vec![0u8; wd_zip_codec::compress_bound(alg, b.len())];
            let n = cpu
                .compress(alg, 1, &b[..], &mut want[..])
                .map_err(|e| End::Failed(e.to_string()))?;
            if want[..n] != z[..] {
                return Err(End::Data(format!(
                    "{alg} stream of {} bytes differs from the CPU engine's",
                    b.len()
                )));
            }
        }
        let zrefs: Vec<&[u8]> = streams.iter().map(|z| &z[..]).collect();
        let rooms: Vec<usize> = blocks.iter().map(Vec::len).collect();
        match dev.decompress_blocks(alg, &zrefs, &rooms, 0) {
            Ok(back) if back == blocks => {}
            Ok(_) => {
                return Err(End::Data(format!("{alg} blocks came back different")));
            }
            Err(e) if met_restart(report, &e) => continue,
            Err(e) => return Err(End::Failed(e.to_string())),
        }
        if alg != Algorithm::Lz4 && rng.next() % 8 == 0 {
            // A long block at a slow level: the device serves it a part
            // per engine pass (a host may die between parts), and its
            // stream is the CPU engine's, which cuts it the same way.
            let len = rng.range(1 << 20, 2 << 20) as usize;
            let mut long = Vec::with_capacity(len + 16);
            while long.len() < len {
                long.extend_from_slice(words[rng.range(0, 5) as usize]);
                long.push(rng.next() as u8);
            }
            long.truncate(len);
            let mut z = vec![0u8; wd_zip_codec::compress_bound(alg, len)];
            let n = match dev.compress(alg, 9, &long, &mut z) {
                Ok(n) => n,
                Err(e) if met_restart(report, &e) => continue,
                Err(e) => return Err(End::Failed(format!("a long block: {e}"))),
            };
            let mut want = vec![0u8; z.len()];
            let m = cpu
                .compress(alg, 9, &long, &mut want)
                .map_err(|e| End::Failed(e.to_string()))?;
            if want[..m] != z[..n] {
                return Err(End::Data(format!(
                    "{alg} stream of a long block ({len} bytes, level 9) differs from the CPU engine's"
                )));
            }
        }
        let whole = blocks.concat();
        if alg.is_deflate() && whole.len() >= wd_comp::DEFAULT_SPLIT_MIN && rng.next() % 2 == 0 {
            // A host killed while the device has its piece sends the block
            // the usual way (here, or on the new host): never an error.
            let mut z = vec![0u8; wd_zip_codec::compress_bound(alg, whole.len())];
            let n = auto
                .compress(alg, 1, &whole, &mut z)
                .map_err(|e| End::Failed(format!("a block cut in two: {e}")))?;
            let mut back = vec![0u8; whole.len()];
            let ok = cpu
                .decompress(alg, &z[..n], &mut back[..], 0)
                .is_ok_and(|g| g.consumed == n && g.produced == whole.len());
            if !ok || back != whole {
                return Err(End::Data(format!(
                    "{alg} block of {} bytes cut in two does not decode to itself",
                    whole.len()
                )));
            }
        }
        if alg.streams() && rng.next() % 4 == 0 {
            // A stream session: rebuilt on the new host from its journal
            // when its host restarts; lost (counted) when no host is back
            // yet, as fallback is off here.
            let p = wd_comp::StreamParams {
                alg,
                compress: true,
                level: 1,
                window_bits: 0,
                dict: &[],
            };
            let mut s = match dev.open_stream(&p) {
                Ok(s) => s,
                Err(e) if met_restart(report, &e) => continue,
                Err(e) => return Err(End::Failed(e.to_string())),
            };
            let mut out = Vec::new();
            let mut buf = vec![0u8; 128 << 10];
            let mut failed = false;
            for (i, b) in blocks.iter().enumerate() {
                let flush = if i + 1 == blocks.len() {
                    wd_comp::Flush::Finish
                } else {
                    wd_comp::Flush::None
                };
                let mut at = 0;
                loop {
                    match dev.stream_run(&mut s, &b[at..], &mut buf, flush) {
                        Ok(st) => {
                            at += st.consumed;
                            out.extend_from_slice(&buf[..st.produced]);
                            if st.end || (flush != wd_comp::Flush::Finish && at == b.len()) {
                                break;
                            }
                        }
                        Err(e) if gone(&e) => {
                            failed = true;
                            break;
                        }
                        Err(e) => return Err(End::Failed(e.to_string())),
                    }
                }
                if failed {
                    break;
                }
            }
            dev.close_stream(s);
            report.rebuilt = dev.stats().streams_rebuilt;
            if failed {
                report.restarts += 1;
                continue;
            }
            let whole: Vec<u8> = blocks.concat();
            let mut back = vec![0u8; whole.len()];
            let got = cpu
                .decompress(alg, &out, &mut back[..], 0)
                .map_err(|e| End::Data(format!("{alg} stream does not decode: {e}")))?;
            if got.produced != whole.len() || back != whole {
                return Err(End::Data(format!("{alg} stream decodes to other data")));
            }
        }
        report.op(t);
    }
    Ok(End::Stopped)
}

/// Each block started on its own, then finished newest first: the
/// streams, in order.
fn compress_async(
    dev: &mut wd_comp::Compressor,
    alg: wd_comp::Algorithm,
    blocks: &[&[u8]],
) -> wd_comp::Result<Vec<Vec<u8>>> {
    let mut outs: Vec<Vec<u8>> = blocks
        .iter()
        .map(|b| vec![0u8; wd_zip_codec::compress_bound(alg, b.len())])
        .collect();
    let mut started = Vec::with_capacity(blocks.len());
    let mut first_err = None;
    for (b, o) in blocks.iter().zip(outs.iter_mut()) {
        match dev.start(wd_comp::Op::Compress(1), alg, b, o) {
            Ok(p) => started.push(p),
            Err(e) => {
                first_err = Some(e);
                break;
            }
        }
    }
    // Every started request is finished, even after an error.
    let mut lens = vec![0; started.len()];
    for (i, p) in started.into_iter().enumerate().rev() {
        match dev.finish(p, &mut outs[i]) {
            Ok(r) => lens[i] = r.produced,
            Err(e) => first_err = Some(e),
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    for (o, n) in outs.iter_mut().zip(lens) {
        o.truncate(n);
    }
    Ok(outs)
}

/// AES-128-CBC through the library, forced onto the device, in random
/// pieces, against libcrypto on the CPU; a session per message.
fn cipher(rng: &mut Rng, report: &mut Report) -> Result<End, End> {
    use wd_crypto::{config, Cipher, Direction};
    config::set_policy(wd_crypto::Policy::Offload);
    config::set_threshold(0);
    let alg = wd_crypto::Alg::by_name("aes-128-cbc").expect("a known algorithm");
    line("ready");
    let mut pt = vec![0u8; 32 << 10];
    let mut out = vec![0u8; 32 << 10];
    let mut want = vec![0u8; 32 << 10];
    while !report.stopped() {
        let (mut key, mut iv) = ([0u8; 16], [0u8; 16]);
        rng.fill(&mut key);
        rng.fill(&mut iv);
        let len = 16 * rng.range(1, 2048) as usize;
        rng.fill(&mut pt[..len]);
        let encrypt = rng.next() % 2 == 0;
        let dir = if encrypt {
            Direction::Encrypt
        } else {
            Direction::Decrypt
        };
        let t = Instant::now();
        let run = |rng: &mut Rng, out: &mut [u8]| -> Result<(), wd_crypto::CryptoError> {
            let mut c = Cipher::new("aes-128-cbc", &key, dir)?;
            c.set_iv(&iv)?;
            // Cut at random block boundaries.
            let mut at = 0;
            while at < len {
                let rest = (len - at) / 16;
                let n = 16
                    * if rest > 1 {
                        rng.range(1, rest as u64) as usize
                    } else {
                        1
                    };
                c.update(&pt[at..at + n], &mut out[at..at + n])?;
                at += n;
            }
            Ok(())
        };
        match run(rng, &mut out) {
            Ok(()) => {}
            // A stream in flight when the host restarted fails (its
            // session died with the host): the documented unsafe case.
            Err(e) if e.host_gone() => {
                report.restarts += 1;
                continue;
            }
            Err(e) => return Err(e.into()),
        }
        let mut r = wd_evp::CipherCtx::new(alg).map_err(|e| End::Failed(e.to_string()))?;
        r.init(Some(&key), Some(&iv), encrypt)
            .and_then(|()| r.update(&mut want[..len], &pt[..len]))
            .map_err(|e| End::Failed(e.to_string()))?;
        if out[..len] != want[..len] {
            return Err(End::Data(format!(
                "aes-128-cbc {} of {len} bytes differs from libcrypto",
                if encrypt { "encryption" } else { "decryption" }
            )));
        }
        report.op(t);
    }
    Ok(End::Stopped)
}

/// Namespaces a chaos host offers; a client takes the first free one.
pub const NAMESPACES: u32 = 8;

/// Random writes and reads on a namespace of its own, every block read
/// checked against what this process wrote there; I/O queues deleted and
/// created again now and then.
fn nvme(rng: &mut Rng, report: &mut Report) -> Result<End, End> {
    let mut s = NvmeSession::open(rng)?;
    line("ready");
    let fill = |tag: u64, out: &mut [u8]| {
        for (i, w) in out.chunks_mut(8).enumerate() {
            w.copy_from_slice(
                &(tag ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)).to_le_bytes(),
            );
        }
    };
    // Block -> tag of what this process wrote there last.
    let mut written: HashMap<u64, u64> = HashMap::new();
    let block = s.ns.block;
    let most = (64 << 10) / block;
    let mut data = vec![0u8; (most * block) as usize];
    let mut want = vec![0u8; block as usize];
    while !report.stopped() {
        let n = rng.range(1, most);
        let lba = rng.range(0, s.ns.blocks - n);
        let bytes = (n * block) as usize;
        let t = Instant::now();
        let op = rng.next() % 10;
        let r: Result<(), End> = (|| {
            match op {
                0..=4 => {
                    for i in 0..n {
                        let tag = rng.next();
                        let at = (i * block) as usize;
                        fill(tag, &mut data[at..at + block as usize]);
                        written.insert(lba + i, tag);
                    }
                    s.buf.write(0, &data[..bytes]);
                    s.q.write(&s.ns, lba, &s.buf, 0, bytes as u64)?;
                }
                5..=8 => {
                    s.q.read(&s.ns, lba, &s.buf, 0, bytes as u64)?;
                    s.buf.read(0, &mut data[..bytes]);
                    for i in 0..n {
                        let Some(&tag) = written.get(&(lba + i)) else {
                            continue;
                        };
                        fill(tag, &mut want);
                        let at = (i * block) as usize;
                        if data[at..at + block as usize] != want[..] {
                            return Err(End::Data(format!(
                                "namespace {} block {} does not hold what was written",
                                s.ns.nsid,
                                lba + i
                            )));
                        }
                    }
                }
                _ => s.recreate_queue()?,
            }
            Ok(())
        })();
        match r {
            Ok(()) => report.op(t),
            // The host went away with the command in flight: bring the
            // controller up again on the restarted host (same namespace,
            // same queue) and write the same data again, which is safe.
            // A host restarted every second may go away again during the
            // recovery or the write after it: recover again, a few times.
            Err(End::HostGone(_)) => {
                let mut tries = 0;
                loop {
                    let again = s.recover().and_then(|()| {
                        if op <= 4 {
                            s.q.write(&s.ns, lba, &s.buf, 0, bytes as u64)?;
                        }
                        Ok(())
                    });
                    match again {
                        Ok(()) => break,
                        Err(End::HostGone(_)) if tries < 5 => tries += 1,
                        // Another client took the namespace meanwhile:
                        // start over on a namespace of our own, knowing
                        // nothing of it.
                        Err(End::Failed(_)) => {
                            report.restarts += 1;
                            drop(s);
                            s = NvmeSession::open(rng)?;
                            written.clear();
                            break;
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(End::Stopped)
}

/// A controller brought up, a namespace attached, an I/O queue and a
/// buffer shared with it.
struct NvmeSession {
    c: Controller,
    ns: wd_nvme_driver::Namespace,
    q: wd_nvme_driver::IoQueue,
    buf: SharedBuf,
}

impl NvmeSession {
    /// Open a controller and attach the first free namespace (in a
    /// random order); a host that dies meanwhile is waited for (3 s), as
    /// after the controller is up.
    fn open(rng: &mut Rng) -> Result<NvmeSession, End> {
        let t = Instant::now();
        loop {
            match NvmeSession::try_open(rng) {
                Err(End::HostGone(_)) if t.elapsed() < Duration::from_secs(3) => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                r => return r,
            }
        }
    }

    fn try_open(rng: &mut Rng) -> Result<NvmeSession, End> {
        let h = host()?;
        let mut c = Controller::open(&h, &Options::default())?;
        let mut order: Vec<u32> = (1..=NAMESPACES).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.range(0, i as u64) as usize);
        }
        let mut ns = None;
        for nsid in order {
            match c.open_namespace(nsid) {
                Ok(n) => {
                    ns = Some(n);
                    break;
                }
                // Attached to another controller: try the next.
                Err(NvmeError::Command { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        let ns = ns.ok_or_else(|| End::Busy("every namespace is attached elsewhere".into()))?;
        let q = c.create_io_queue(16)?;
        let buf = SharedBuf::new((64 << 10) / ns.block as usize * ns.block as usize)?;
        c.share(&buf)?;
        Ok(NvmeSession { c, ns, q, buf })
    }

    /// After the host went away: the controller brought up again there,
    /// waiting up to 3 s for the host to come back.
    fn recover(&mut self) -> Result<(), End> {
        let t = Instant::now();
        loop {
            match self.c.reconnect() {
                Ok(()) => break,
                Err(e) if e.host_gone() && t.elapsed() < Duration::from_secs(3) => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => return Err(e.into()),
            }
        }
        self.c.restore_io_queue(&mut self.q)?;
        Ok(())
    }

    /// Delete the I/O queue and create another (a kill lands mid-admin).
    fn recreate_queue(&mut self) -> Result<(), End> {
        let fresh = self.c.create_io_queue(16)?;
        let old = std::mem::replace(&mut self.q, fresh);
        self.c.delete_io_queue(old)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_seeded_and_ranges_hold() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        assert_eq!(a.next(), b.next());
        assert_ne!(Rng::new(8).next(), Rng::new(7).next());
        for _ in 0..1000 {
            let v = a.range(3, 9);
            assert!((3..=9).contains(&v));
        }
        let mut buf = [0u8; 13];
        a.fill(&mut buf);
        assert!(buf.iter().any(|&x| x != 0));
    }
}
