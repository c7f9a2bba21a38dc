//! Compression through WrapDrive: one-shot deflate, zlib, gzip, zstd and
//! LZ4 on the zip device, with the device's own engines (`wd-zip-codec`)
//! in the caller's thread when offloading does not pay or cannot be done.
//!
//! A [`Compressor`] belongs to one thread. It sends blocks to the device
//! through a staging area of shared memory, several in flight at once
//! ([`Compressor::compress_blocks`]), and while every slot is busy the
//! calling thread compresses the next block itself: the engine and the
//! caller both work, and a batch finishes sooner than either alone.
//! [`Compressor::start`] sends one block without waiting (finished by
//! [`Compressor::poll`] or [`Compressor::finish`]); scatter lists
//! ([`Compressor::compress_sg`]) and streams ([`Compressor::open_stream`])
//! complete the set.
//!
//! Where each block runs is decided by the [`Policy`] and the threshold
//! (blocks smaller than it stay on the CPU: a round trip costs more than
//! compressing them), and without a queue (no host, no zip device, the
//! host went away) blocks run on the CPU unless fallback is off. Every
//! decision is counted ([`Compressor::stats`]). Both paths produce the
//! same bytes, and a data error (corrupt input, too little room, a ratio
//! limit) is the same error on both. The one exception is a large deflate
//! block compressed alone, which the auto policy cuts between the device
//! and the caller ([`Config::split_min`]): a valid stream, slightly
//! larger, not the bytes of the block compressed whole.
#![deny(unsafe_code)]

mod pending;
mod pieces;
mod stream;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use pending::{Op, Pending};
pub use pieces::Pieces;
pub use stream::{Step, Stream};
pub use wd_zip_codec::{compress_bound, Inflated, StreamParams};
use wd_zip_codec::{CodecError, Engine};
pub use wd_zip_msg::Flush;
pub use wd_zip_msg::{Algorithm, DEFAULT_LEVEL};
use wd_zip_msg::{Done, OneShot, MAX_DATA};
use wrapdrive::{Capability, ClientError, Desc, HostConn, Queue, SharedBuf, Status};

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum CompError {
    /// The data or the room for it: the same on the device and the CPU.
    #[error(transparent)]
    Data(#[from] CodecError),
    /// The device failed the request for a reason of its own.
    #[error("zip device: {0}")]
    Device(#[from] ClientError),
    /// Offloading was required (policy `offload`, no fallback) and no
    /// queue could be had.
    #[error("no compression queue: {0}")]
    NoQueue(String),
}

/// Result of this crate.
pub type Result<T> = std::result::Result<T, CompError>;

pub use wd_route::Policy;
use wd_route::{Costs, Decision, Queue as QueueState, Route, Why};

/// How a [`Compressor`] routes its blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Policy.
    pub policy: Policy,
    /// Blocks smaller than this many bytes run on the CPU.
    pub threshold: usize,
    /// Without a queue, run on the CPU (else fail with
    /// [`CompError::NoQueue`]).
    pub fallback: bool,
    /// Requests in flight on the device.
    pub depth: usize,
    /// Input bytes a device stream keeps (with the requests it sent) so
    /// that it can be rebuilt when its host goes away; a stream that has
    /// sent more cannot be (0: none can).
    pub journal_limit: usize,
    /// Deflate blocks of at least this many bytes, compressed one at a
    /// time under the auto policy (and pieces of streams as large), are
    /// cut in two compressed at once, on the device and here (0: never).
    pub split_min: usize,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            policy: Policy::Auto,
            threshold: DEFAULT_THRESHOLD,
            fallback: true,
            depth: 16,
            journal_limit: DEFAULT_JOURNAL_LIMIT,
            split_min: DEFAULT_SPLIT_MIN,
        }
    }
}

/// Enough for a stream of a few MiB (a file, a message, a response) to
/// survive its host's restart, without holding much per stream.
pub const DEFAULT_JOURNAL_LIMIT: usize = 4 << 20;

/// Below this a round trip to the engine costs more than the work.
pub const DEFAULT_THRESHOLD: usize = 4096;

/// From this a block compressed alone is cut in two pieces, one for the
/// device and one for the caller (see [`Config::split_min`]).
pub const DEFAULT_SPLIT_MIN: usize = 16 << 10;

/// How long a caller with nothing else to do polls for a completion
/// before it sleeps.
const POLL_BEFORE_SLEEP: std::time::Duration = std::time::Duration::from_micros(500);

/// How long a compressor that could not get a queue computes here before
/// it asks again.
pub const RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

impl Config {
    /// The defaults, changed by `WD_COMP_POLICY` (auto, offload, cpu),
    /// `WD_COMP_THRESHOLD` (bytes), `WD_COMP_FALLBACK` (0/no/off/false,
    /// 1/yes/on/true) and
    /// `WD_COMP_JOURNAL` (bytes), `WD_COMP_SPLIT` (bytes, 0: never). A
    /// value that does not parse is an error naming it.
    pub fn from_env() -> std::result::Result<Config, String> {
        let mut c = Config::default();
        if let Ok(p) = std::env::var("WD_COMP_POLICY") {
            c.policy = p.parse().map_err(|e| format!("WD_COMP_POLICY: {e}"))?;
        }
        if let Ok(t) = std::env::var("WD_COMP_THRESHOLD") {
            c.threshold = t
                .trim()
                .parse()
                .map_err(|_| format!("WD_COMP_THRESHOLD: '{t}' is not a byte count"))?;
        }
        if let Ok(t) = std::env::var("WD_COMP_JOURNAL") {
            c.journal_limit = t
                .trim()
                .parse()
                .map_err(|_| format!("WD_COMP_JOURNAL: '{t}' is not a byte count"))?;
        }
        if let Ok(t) = std::env::var("WD_COMP_SPLIT") {
            c.split_min = t
                .trim()
                .parse()
                .map_err(|_| format!("WD_COMP_SPLIT: '{t}' is not a byte count"))?;
        }
        if let Ok(v) = std::env::var("WD_COMP_FALLBACK") {
            c.fallback =
                wd_route::parse_switch(&v).map_err(|e| format!("WD_COMP_FALLBACK: {e}"))?;
        }
        Ok(c)
    }
}

/// Where a [`Compressor`]'s blocks went, and why.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Blocks the device ran, whatever their outcome (as a block run here
    /// is counted by why it ran here, whatever its outcome).
    pub offloaded: u64,
    /// Blocks run here because they were under the threshold.
    pub cpu_threshold: u64,
    /// Blocks run here because of the policy, because they are larger
    /// than one request carries, or because cut in two they did not fit
    /// their room.
    pub cpu_policy: u64,
    /// Blocks run here while every device slot was busy.
    pub cpu_assist: u64,
    /// Blocks run here because no queue could be had.
    pub cpu_fallback: u64,
    /// Blocks, and pieces of streams ([`Compressor::compress_piece`]), cut
    /// in two compressed at once, one on the device and one here (counted
    /// here only).
    pub split: u64,
    /// Input bytes.
    pub bytes_in: u64,
    /// Output bytes.
    pub bytes_out: u64,
    /// Device streams rebuilt from their journal after their host went
    /// away (on the new host, or here).
    pub streams_rebuilt: u64,
    /// Device streams lost with their host (past the journal limit, the
    /// replay answered otherwise, or nowhere to rebuild them).
    pub streams_lost: u64,
}

impl Stats {
    /// Count a block the router kept on the CPU, by its reason.
    fn count_cpu(&mut self, why: Why) {
        *match why {
            Why::Threshold => &mut self.cpu_threshold,
            Why::NoQueue | Why::HostGone => &mut self.cpu_fallback,
            Why::Policy => &mut self.cpu_policy,
        } += 1;
    }

    /// Count a finished block's bytes, in and out.
    fn count_bytes(&mut self, input: usize, produced: usize) {
        self.bytes_in += input as u64;
        self.bytes_out += produced as u64;
    }
}

/// A compression level `alg` does not take is refused before anything
/// runs, the same error on the single-block and the batch path.
fn check_level(compress: bool, alg: Algorithm, level: i8) -> Result<()> {
    if compress {
        wd_zip_msg::check_level(alg, level).map_err(|_| CodecError::Param)?;
    }
    Ok(())
}

/// The device side of a compressor: a queue and its staging area,
/// `slots` areas of `slot` bytes (input, then output room).
struct Lane {
    q: Queue,
    stage: Option<SharedBuf>,
    slot: usize,
    slots: usize,
    /// Unique to this lane: a session handle means something on its own
    /// lane's queue only, and another lane's queue on the same connection
    /// (same epoch) hands out the same handles.
    id: u64,
}

/// Where a device session lives: its lane, and the connection epoch its
/// queue was made under (a queue made again on a restarted host keeps its
/// lane but loses its sessions).
pub(crate) type LaneKey = (u64, u64);

impl Lane {
    fn open(host: &Arc<HostConn>, depth: usize) -> std::result::Result<Lane, ClientError> {
        let mut q =
            host.request_queue(&Capability::new(wd_zip_msg::QUEUE_ALG).depth(depth as u32 * 2))?;
        q.set_redo_policy(wd_zip_msg::redo_safe);
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Ok(Lane {
            q,
            stage: None,
            slot: 0,
            slots: 0,
            id: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        })
    }

    fn key(&self) -> LaneKey {
        (self.id, self.q.epoch())
    }

    /// A staging area of at least `slots` slots of `slot` bytes.
    fn ensure(&mut self, slot: usize, slots: usize) -> std::result::Result<(), ClientError> {
        if self.stage.is_some() && self.slot >= slot && self.slots >= slots {
            return Ok(());
        }
        let slot = slot.max(self.slot).next_power_of_two().max(64 << 10);
        let slots = slots.max(self.slots);
        if let Some(old) = self.stage.take() {
            self.q.unshare(old.addr(), old.len())?;
        }
        let stage = SharedBuf::new(slot * slots)?;
        self.q.share(stage.addr(), stage.len())?;
        self.stage = Some(stage);
        self.slot = slot;
        self.slots = slots;
        Ok(())
    }

    /// A staging area of at least `bytes` in all (a stream request's
    /// input and room side by side), keeping the slots a batch asked for:
    /// asking `ensure` for one slot of `bytes` would make every slot that
    /// large.
    fn ensure_area(&mut self, bytes: usize) -> std::result::Result<(), ClientError> {
        if self.stage.as_ref().is_some_and(|s| s.len() >= bytes as u64) {
            return Ok(());
        }
        let slots = self.slots.max(1);
        self.ensure(bytes.div_ceil(slots), slots)
    }

    /// Wait until a completion is ready: poll a while first (a block takes
    /// tens to hundreds of microseconds; sleeping costs a wake-up of about
    /// as much), then sleep.
    fn wait(&mut self) -> std::result::Result<(), ClientError> {
        let t = Instant::now();
        while !self.q.ring_ready() {
            if t.elapsed() >= POLL_BEFORE_SLEEP {
                return self.q.wait_completion(None);
            }
            std::hint::spin_loop();
        }
        Ok(())
    }
}

/// One block of a batch: its input (one piece, or the pieces of a
/// scatter list, in order) and the room for its output.
struct Job<'a> {
    input: &'a [&'a [u8]],
    len: usize,
    room: usize,
}

impl Job<'_> {
    /// The input in one piece: borrowed, or gathered when scattered.
    fn contiguous(&self) -> std::borrow::Cow<'_, [u8]> {
        match self.input {
            [one] => std::borrow::Cow::Borrowed(one),
            pieces => std::borrow::Cow::Owned(pieces.concat()),
        }
    }
}

/// Copy `data` across `pieces`, in order (they hold at least as much).
fn scatter(pieces: &mut [&mut [u8]], mut data: &[u8]) {
    for p in pieces.iter_mut() {
        let n = p.len().min(data.len());
        p[..n].copy_from_slice(&data[..n]);
        data = &data[n..];
    }
}

/// Where a batch's output goes: the caller's buffers, new vectors (made
/// to measure, never zeroed) of at most the given room each, or the
/// pieces of one block's scatter list, filled in order.
enum Outs<'a, 'b> {
    Slices(&'a mut [&'b mut [u8]]),
    Vecs(Vec<Vec<u8>>, &'a [usize]),
    Scatter(&'a mut [&'b mut [u8]]),
}

impl Outs<'_, '_> {
    fn room(&self, i: usize) -> usize {
        match self {
            Outs::Slices(s) => s[i].len(),
            Outs::Vecs(_, rooms) => rooms[i],
            Outs::Scatter(p) => p.iter().map(|p| p.len()).sum(),
        }
    }

    /// The device's `n` bytes at `at` of the staging area, for block `i`.
    fn take_from(&mut self, i: usize, stage: &SharedBuf, mut at: u64, n: usize) {
        match self {
            Outs::Slices(s) => stage.read(at, &mut s[i][..n]),
            Outs::Vecs(v, _) => v[i] = stage.read_vec(at, n),
            Outs::Scatter(pieces) => {
                let mut left = n;
                for p in pieces.iter_mut() {
                    let k = p.len().min(left);
                    stage.read(at, &mut p[..k]);
                    at += k as u64;
                    left -= k;
                }
            }
        }
    }

    fn into_vecs(self) -> Vec<Vec<u8>> {
        match self {
            Outs::Vecs(v, _) => v,
            Outs::Slices(_) | Outs::Scatter(_) => Vec::new(),
        }
    }
}

/// A thread's compressor: its queue (when it has one) and its CPU engine.
pub struct Compressor {
    /// Unique: a stream belongs to the compressor that opened it.
    id: u64,
    cfg: Config,
    host: Option<Arc<HostConn>>,
    lane: Option<Lane>,
    /// The queue of asynchronous requests ([`Compressor::start`]).
    alane: Option<pending::AsyncLane>,
    /// Why there is no lane (for `NoQueue`), and until when: a queue is
    /// asked for again after [`RETRY_AFTER`], or longer after an attempt
    /// that took long ([`wrapdrive::retry_after`]).
    no_lane: Option<String>,
    no_lane_until: Option<Instant>,
    /// Since when the asynchronous lane failed (its own retry: the
    /// synchronous lane, and the stream sessions on it, stay).
    no_alane_at: Option<Instant>,
    /// The host's address, to connect again after it went away.
    addr: Option<String>,
    cpu: Engine,
    /// The caller's piece of a block cut in two.
    piece: Vec<u8>,
    /// Measured cost of each path, per algorithm and direction.
    costs: Costs,
    stats: Stats,
    /// Blocks may be cut in two as `cfg.split_min` says (see
    /// [`Compressor::set_cutting`]).
    cutting: bool,
}

impl std::fmt::Debug for Compressor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compressor")
            .field("cfg", &self.cfg)
            .field("offloading", &self.lane.is_some())
            .field("stats", &self.stats)
            .finish()
    }
}

/// The router's operation number of an algorithm and direction.
fn op_index(alg: Algorithm, compress: bool) -> usize {
    2 * (alg as usize - 1) + usize::from(!compress)
}

/// Map a device completion to this crate's errors: the data errors the
/// CPU path would give, else the device's status.
fn device_status(status: i32) -> Result<()> {
    use wd_msg::status as st;
    match status {
        0 => Ok(()),
        st::ENOBUFS => Err(CodecError::NoSpace.into()),
        st::EBADMSG => Err(CodecError::Corrupt.into()),
        st::EOVERFLOW => Err(CodecError::Ratio.into()),
        st::EINVAL => Err(CodecError::Param.into()),
        s => Err(ClientError::new(
            Status::from_errno(-s),
            format!("request failed on the device: errno {}", -s),
        )
        .into()),
    }
}

impl Compressor {
    /// A compressor offloading to `host` as `cfg` says. A host without a
    /// zip device (or one that refuses a queue) leaves it on the CPU, or
    /// failing every block when fallback is off.
    pub fn new(host: Option<Arc<HostConn>>, cfg: Config) -> Compressor {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Compressor {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            cfg,
            host,
            lane: None,
            alane: None,
            no_lane: None,
            no_lane_until: None,
            no_alane_at: None,
            addr: None,
            cpu: Engine::new(),
            piece: Vec::new(),
            costs: Costs::new(2 * Algorithm::ALL.len()),
            stats: Stats::default(),
            cutting: true,
        }
    }

    /// A compressor on the host `WD_COMP_HOST`, else `WD_HOST`, else the
    /// default socket, configured from the environment
    /// ([`Config::from_env`]); no host is not an error (blocks run on the
    /// CPU, counted as fallbacks).
    pub fn from_env() -> std::result::Result<Compressor, String> {
        let cfg = Config::from_env()?;
        let addr = std::env::var("WD_COMP_HOST")
            .or_else(|_| std::env::var("WD_HOST"))
            .unwrap_or_else(|_| wrapdrive::DEFAULT_HOST.to_string());
        let mut c = Compressor::new(None, cfg);
        match HostConn::connect(&addr) {
            Ok(h) => c.host = Some(h),
            Err(e) => c.lost(format!("host {addr}: {e}")),
        }
        c.addr = Some(addr);
        Ok(c)
    }

    /// Whether blocks and pieces of `split_min` bytes or more may be cut
    /// between the device and this thread (the default), or not at all.
    /// A cut pays when the engine's CPU would otherwise idle: a program
    /// whose own threads already keep every CPU busy (pigz) does better
    /// without, since the engine would take a CPU from one of them.
    pub fn set_cutting(&mut self, on: bool) {
        self.cutting = on;
    }

    /// Where blocks went so far.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Whether blocks can go to the device now (a queue is open or can
    /// be opened).
    pub fn offloading(&mut self) -> bool {
        self.lane().is_some()
    }

    /// No queue now, for this reason: blocks run here (or fail) until
    /// [`RETRY_AFTER`] has passed.
    fn lost(&mut self, why: String) {
        self.lost_after(why, Duration::ZERO);
    }

    /// [`Compressor::lost`] after an attempt that took `attempt`: the
    /// wait is [`wrapdrive::retry_after`].
    fn lost_after(&mut self, why: String, attempt: Duration) {
        self.lane = None;
        self.no_lane = Some(why);
        self.no_lane_until = Some(Instant::now() + wrapdrive::retry_after(RETRY_AFTER, attempt));
    }

    fn lane(&mut self) -> Option<&mut Lane> {
        let waiting = self.no_lane_until.is_some_and(|t| Instant::now() < t);
        if self.lane.is_none() && !waiting && self.cfg.policy != Policy::Cpu {
            let attempt = Instant::now();
            if self.host.is_none() {
                // A host that was not there (or went away) may be now.
                if let Some(addr) = &self.addr {
                    self.host = HostConn::connect(addr).ok();
                }
            }
            match &self.host {
                None => self.lost_after("no host".into(), attempt.elapsed()),
                Some(h) => match Lane::open(h, self.cfg.depth.max(1)) {
                    Ok(l) => {
                        self.lane = Some(l);
                        self.no_lane = None;
                        self.no_lane_until = None;
                    }
                    // (A connection whose host restarted connects again by
                    // itself when asked for a queue.)
                    Err(e) => self.lost_after(e.to_string(), attempt.elapsed()),
                },
            }
        }
        self.lane.as_mut()
    }

    /// Compress `input` into one stream of `alg` in `out`: the bytes
    /// written. Room of [`compress_bound`] always suffices.
    pub fn compress(
        &mut self,
        alg: Algorithm,
        level: i8,
        input: &[u8],
        out: &mut [u8],
    ) -> Result<usize> {
        if let Some(n) = self.compress_split(alg, level, input, out)? {
            return Ok(n);
        }
        Ok(self.one(true, alg, level, 0, input, out)?.produced)
    }

    /// Decompress the stream(s) at the start of `input` into `out`,
    /// refusing output beyond `max_ratio` times the input (0: no limit).
    pub fn decompress(
        &mut self,
        alg: Algorithm,
        input: &[u8],
        out: &mut [u8],
        max_ratio: u16,
    ) -> Result<Inflated> {
        self.one(false, alg, 0, max_ratio, input, out)
    }

    /// One block. When the settings alone send it to the CPU (policy,
    /// threshold) it runs here at once: the batch engine's vectors and
    /// route table cost more than the work on a block of a few dozen
    /// bytes (the drop-in zlib's small streams).
    fn one(
        &mut self,
        compress: bool,
        alg: Algorithm,
        level: i8,
        max_ratio: u16,
        input: &[u8],
        out: &mut [u8],
    ) -> Result<Inflated> {
        let fits = input.len() as u64 <= MAX_DATA && out.len() as u64 <= MAX_DATA;
        let settled = wd_route::by_settings(&self.settings(), input.len());
        let mut outs = Outs::Slices(&mut [out]);
        let (true, Some(Route::Cpu(why))) = (fits, settled) else {
            return Ok(self.run(compress, alg, level, max_ratio, &[input], &mut outs)?[0]);
        };
        check_level(compress, alg, level)?;
        self.stats.count_cpu(why);
        let d = self.on_cpu(compress, alg, level, max_ratio, input, &mut outs, 0)?;
        self.stats.count_bytes(input.len(), d.produced);
        Ok(d)
    }

    fn settings(&self) -> wd_route::Settings {
        wd_route::Settings {
            policy: self.cfg.policy,
            threshold: self.cfg.threshold,
            fallback: self.cfg.fallback,
        }
    }

    /// Compress each input into its own stream in the output beside it,
    /// several in flight: what each took and wrote. The first error ends
    /// the batch.
    pub fn compress_into(
        &mut self,
        alg: Algorithm,
        level: i8,
        inputs: &[&[u8]],
        outs: &mut [&mut [u8]],
    ) -> Result<Vec<Inflated>> {
        if inputs.len() != outs.len() {
            return Err(CodecError::Param.into());
        }
        self.run(true, alg, level, 0, inputs, &mut Outs::Slices(outs))
    }

    /// Decompress the stream at the start of each input into the output
    /// beside it, several in flight.
    pub fn decompress_into(
        &mut self,
        alg: Algorithm,
        inputs: &[&[u8]],
        outs: &mut [&mut [u8]],
        max_ratio: u16,
    ) -> Result<Vec<Inflated>> {
        if inputs.len() != outs.len() {
            return Err(CodecError::Param.into());
        }
        self.run(false, alg, 0, max_ratio, inputs, &mut Outs::Slices(outs))
    }

    /// Compress a message given as a scatter list (`input`, in order)
    /// into one stream written across the pieces of `out`, in order: the
    /// bytes written. On the device the pieces are gathered into and
    /// scattered from the staging area the request uses anyway (no copy
    /// more than a contiguous buffer costs); on the CPU a list of several
    /// pieces is gathered first.
    pub fn compress_sg(
        &mut self,
        alg: Algorithm,
        level: i8,
        input: &[&[u8]],
        out: &mut [&mut [u8]],
    ) -> Result<usize> {
        // A block the auto policy cuts in two (see `compress`), gathered
        // and scattered: the same stream as from one contiguous buffer.
        let len: usize = input.iter().map(|p| p.len()).sum();
        if alg.is_deflate() && self.cuts(len) {
            let whole = input.concat();
            let room: usize = out.iter().map(|p| p.len()).sum();
            let mut z = vec![0u8; room.min(compress_bound(alg, len) + 20)];
            if let Some(n) = self.compress_split(alg, level, &whole, &mut z)? {
                scatter(out, &z[..n]);
                return Ok(n);
            }
        }
        let mut outs = Outs::Scatter(out);
        Ok(self.run_jobs(true, alg, level, 0, &[input], &mut outs)?[0].produced)
    }

    /// Decompress the stream at the start of the scatter list `input`
    /// into the pieces of `out`, in order (see [`Compressor::compress_sg`]).
    pub fn decompress_sg(
        &mut self,
        alg: Algorithm,
        input: &[&[u8]],
        out: &mut [&mut [u8]],
        max_ratio: u16,
    ) -> Result<Inflated> {
        let mut outs = Outs::Scatter(out);
        Ok(self.run_jobs(false, alg, 0, max_ratio, &[input], &mut outs)?[0])
    }

    /// Compress each block into its own stream, several in flight: the
    /// streams, in order. The first error ends the batch.
    pub fn compress_blocks(
        &mut self,
        alg: Algorithm,
        level: i8,
        blocks: &[&[u8]],
    ) -> Result<Vec<Vec<u8>>> {
        let rooms: Vec<usize> = blocks
            .iter()
            .map(|b| compress_bound(alg, b.len()))
            .collect();
        let mut outs = Outs::Vecs(vec![Vec::new(); blocks.len()], &rooms);
        self.run(true, alg, level, 0, blocks, &mut outs)?;
        Ok(outs.into_vecs())
    }

    /// Decompress each block (one stream each) into at most its `room`
    /// bytes, several in flight: the data, in order.
    pub fn decompress_blocks(
        &mut self,
        alg: Algorithm,
        blocks: &[&[u8]],
        rooms: &[usize],
        max_ratio: u16,
    ) -> Result<Vec<Vec<u8>>> {
        if rooms.len() != blocks.len() {
            return Err(CodecError::Param.into());
        }
        let mut outs = Outs::Vecs(vec![Vec::new(); blocks.len()], rooms);
        self.run(false, alg, 0, max_ratio, blocks, &mut outs)?;
        Ok(outs.into_vecs())
    }

    #[allow(clippy::too_many_arguments)]
    fn on_cpu(
        &mut self,
        compress: bool,
        alg: Algorithm,
        level: i8,
        max_ratio: u16,
        input: &[u8],
        outs: &mut Outs<'_, '_>,
        i: usize,
    ) -> Result<Inflated> {
        let e = &mut self.cpu;
        let room = outs.room(i);
        let got = match (outs, compress) {
            (Outs::Slices(s), true) => e
                .compress(alg, level, input, &mut *s[i])
                .map(|n| (input.len(), n)),
            (Outs::Slices(s), false) => e
                .decompress(alg, input, &mut *s[i], max_ratio)
                .map(|g| (g.consumed, g.produced)),
            (Outs::Vecs(v, _), true) => e
                .compress_vec(alg, level, input, &mut v[i])
                .map(|n| (input.len(), n)),
            (Outs::Vecs(v, _), false) => e
                .decompress_vec(alg, input, &mut v[i], room, max_ratio)
                .map(|g| (g.consumed, g.produced)),
            (Outs::Scatter(pieces), true) => {
                let mut v = Vec::new();
                let n = e.compress_vec(alg, level, input, &mut v)?;
                if n > room {
                    return Err(CodecError::NoSpace.into());
                }
                scatter(pieces, &v);
                Ok((input.len(), n))
            }
            (Outs::Scatter(pieces), false) => {
                let mut v = Vec::new();
                let g = e.decompress_vec(alg, input, &mut v, room, max_ratio)?;
                scatter(pieces, &v);
                Ok((g.consumed, g.produced))
            }
        }?;
        Ok(Inflated {
            consumed: got.0,
            produced: got.1,
        })
    }

    /// [`Compressor::run_jobs`] with one piece per block.
    fn run(
        &mut self,
        compress: bool,
        alg: Algorithm,
        level: i8,
        max_ratio: u16,
        inputs: &[&[u8]],
        outs: &mut Outs<'_, '_>,
    ) -> Result<Vec<Inflated>> {
        let pieces: Vec<&[&[u8]]> = inputs.iter().map(std::slice::from_ref).collect();
        self.run_jobs(compress, alg, level, max_ratio, &pieces, outs)
    }

    /// The batch engine: each block (a list of input pieces) to the device
    /// or the CPU, output into its place in `outs`.
    fn run_jobs(
        &mut self,
        compress: bool,
        alg: Algorithm,
        level: i8,
        max_ratio: u16,
        inputs: &[&[&[u8]]],
        outs: &mut Outs<'_, '_>,
    ) -> Result<Vec<Inflated>> {
        check_level(compress, alg, level)?;
        let jobs: Vec<Job<'_>> = inputs
            .iter()
            .enumerate()
            .map(|(k, i)| Job {
                input: i,
                len: i.iter().map(|p| p.len()).sum(),
                room: outs.room(k),
            })
            .collect();
        let mut done = vec![
            Inflated {
                consumed: 0,
                produced: 0
            };
            jobs.len()
        ];
        let mut next = 0;
        let policy = self.cfg.policy;
        let threshold = self.cfg.threshold;
        // Each block's route. The queue is looked for only when a block
        // may go to the device.
        let settings = self.settings();
        let maybe_device = policy != Policy::Cpu && jobs.iter().any(|j| j.len >= threshold);
        let queue = if maybe_device && self.lane().is_none() {
            QueueState::Missing(Why::NoQueue)
        } else {
            QueueState::Ready
        };
        let op = op_index(alg, compress);
        let overlapped = jobs.len() > 1;
        let routes: Vec<Decision> = jobs
            .iter()
            .map(|j| {
                // One request carries at most MAX_DATA each way.
                if j.len as u64 > MAX_DATA || j.room as u64 > MAX_DATA {
                    return Decision {
                        route: Route::Cpu(Why::Policy),
                        timed: false,
                    };
                }
                let r = wd_route::Request {
                    op,
                    bytes: j.len,
                    overlapped,
                    // A batch keeps the device busy while the caller
                    // copies and helps: any block above the threshold.
                    overlap_min: Some(0),
                };
                wd_route::decide(&settings, || queue, &mut self.costs, r)
            })
            .collect();
        let device_wanted = routes.iter().any(|d| d.route == Route::Device);
        let have_lane = device_wanted && self.lane.is_some();
        if device_wanted && !have_lane {
            return Err(CompError::NoQueue(self.no_lane.clone().unwrap_or_default()));
        }
        let largest = jobs
            .iter()
            .zip(&routes)
            .filter(|(_, d)| d.route == Route::Device)
            .map(|(j, _)| j.len + j.room)
            .max()
            .unwrap_or(0);
        let slots = self.cfg.depth.max(1).min(jobs.len());
        let mut staged = false;
        if have_lane {
            let lane = self.lane.as_mut().expect("have_lane");
            staged = lane.ensure(largest, slots).is_ok();
        }
        let mut free: Vec<usize> = if staged {
            (0..slots).rev().collect()
        } else {
            Vec::new()
        };
        // slot -> job in it
        let mut in_slot: Vec<Option<usize>> = vec![None; slots];
        // When a timed block's request was sent, per slot.
        let mut sent_at: Vec<Option<Instant>> = vec![None; slots];
        let mut comps = Vec::new();
        let mut lost_device = false;
        // The first error; the batch stops handing out blocks and only
        // collects what is in flight, so no completion of this batch is
        // left for the next one to mistake for its own.
        let mut failed: Option<CompError> = None;
        loop {
            // Hand the next blocks out.
            while failed.is_none() && next < jobs.len() {
                let j = &jobs[next];
                let decision = routes[next];
                let on_cpu = match decision.route {
                    Route::Cpu(why) => Some(why),
                    Route::Device if !staged || lost_device => {
                        if !self.cfg.fallback {
                            let why = self
                                .no_lane
                                .clone()
                                .unwrap_or_else(|| "the queue failed".into());
                            failed = Some(CompError::NoQueue(why));
                            break;
                        }
                        Some(Why::HostGone)
                    }
                    Route::Device => None,
                };
                if let Some(why) = on_cpu {
                    self.stats.count_cpu(why);
                    let i = next;
                    next += 1;
                    let t = decision.timed.then(Instant::now);
                    match self.on_cpu(
                        compress,
                        alg,
                        level,
                        max_ratio,
                        &jobs[i].contiguous(),
                        outs,
                        i,
                    ) {
                        Ok(d) => done[i] = d,
                        Err(e) => failed = Some(e),
                    }
                    if let Some(t) = t {
                        self.costs.record(op, jobs[i].len, true, t.elapsed());
                    }
                    continue;
                }
                let Some(s) = free.pop() else {
                    break;
                };
                // A timed request's cost includes the staging copies, in
                // and out: the CPU path's timing includes writing its output.
                let started = decision.timed.then(Instant::now);
                let lane = self.lane.as_mut().expect("staged");
                let stage = lane.stage.as_ref().expect("staged");
                let base = stage.addr() + (s * lane.slot) as u64;
                let mut at = (s * lane.slot) as u64;
                for piece in j.input {
                    stage.write(at, piece);
                    at += piece.len() as u64;
                }
                let d: Desc = OneShot {
                    compress,
                    alg,
                    level: if compress { level } else { 0 },
                    max_ratio,
                    src: base,
                    src_len: j.len as u64,
                    dst: base + j.len as u64,
                    dst_len: j.room as u64,
                    piece: false,
                }
                .to_desc(0);
                match lane.q.send(d, s as u64) {
                    Ok(()) => {
                        in_slot[s] = Some(next);
                        sent_at[s] = started;
                        next += 1;
                    }
                    Err(_) => {
                        // The host is gone for good (the queue makes
                        // itself again when it can): the rest runs here.
                        free.push(s);
                        lost_device = true;
                    }
                }
            }
            if in_slot.iter().all(Option::is_none) {
                if failed.is_some() || next == jobs.len() {
                    break;
                }
                continue;
            }
            let lane = self.lane.as_mut().expect("staged");
            comps.clear();
            let got = lane.q.recv_batch(&mut comps, slots);
            let got = match got {
                // Slots full: compute a block here while the device works.
                Ok(0)
                    if failed.is_none()
                        && policy == Policy::Auto
                        && next < jobs.len()
                        && routes[next].route == Route::Device =>
                {
                    let i = next;
                    next += 1;
                    self.stats.cpu_assist += 1;
                    match self.on_cpu(
                        compress,
                        alg,
                        level,
                        max_ratio,
                        &jobs[i].contiguous(),
                        outs,
                        i,
                    ) {
                        Ok(d) => done[i] = d,
                        Err(e) => failed = Some(e),
                    }
                    continue;
                }
                // Nothing to do here but wait.
                Ok(0) => lane.wait().map(|_| 0),
                other => other,
            };
            if let Err(e) = got {
                // The queue cannot say what became of its requests: drop
                // it (with its staging area) rather than read a late
                // completion into a later batch.
                self.lost(e.to_string());
                return Err(e.into());
            }
            for c in comps.drain(..) {
                let s = c.cookie as usize;
                let Some(i) = in_slot.get_mut(s).and_then(Option::take) else {
                    continue;
                };
                free.push(s);
                let started = sent_at[s].take();
                // (Counted whatever its outcome, as a block that fails
                // here is.)
                self.stats.offloaded += 1;
                if let Err(e) = device_status(c.desc.status) {
                    // (Timed like a failed request on the CPU.)
                    if let Some(t) = started {
                        self.costs.record(op, jobs[i].len, false, t.elapsed());
                    }
                    failed.get_or_insert(e);
                    continue;
                }
                let r = Done::from_result(c.desc.result);
                let produced = (r.produced as usize).min(jobs[i].room);
                let stage = lane.stage.as_ref().expect("staged");
                let at = (s * lane.slot + jobs[i].len) as u64;
                outs.take_from(i, stage, at, produced);
                if let Some(t) = started {
                    self.costs.record(op, jobs[i].len, false, t.elapsed());
                }
                done[i] = Inflated {
                    consumed: r.consumed as usize,
                    produced,
                };
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        for (d, j) in done.iter().zip(&jobs) {
            self.stats.count_bytes(j.len, d.produced);
        }
        Ok(done)
    }
}
