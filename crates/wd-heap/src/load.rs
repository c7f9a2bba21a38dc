//! `alloc_and_read`: a file's bytes in a shareable buffer, with allocation
//! overlapped with I/O.
//!
//! The buffer is allocated (populated) in gathers by one thread while the
//! calling thread reads: each gather's reads start as soon as its pages
//! exist, several reads in flight through io_uring (or, where io_uring is
//! unavailable, a few reader threads). The total then approaches
//! T(first gather) + max(T(alloc), T(I/O)) instead of T(alloc) + T(I/O).
//!
//! Reads bypass the page cache (O_DIRECT) unless the file is mostly cached
//! already or its filesystem cannot do direct I/O. The unaligned tail of a
//! direct read is read as one aligned block past the end of the file (the
//! kernel returns only the bytes that exist), and whatever lies beyond the
//! file's end in the buffer is zeroed. A file that changes size or is
//! modified while being read is an error, never a short buffer.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use wd_sys::file::{FileInfo, FileKind};
use wd_sys::uring::Uring;
use wd_sys::{Mapping, SysError};

use crate::heap::{choose_pages, AllocOptions, Buffer, Heap, HeapError, PageKind, PagePolicy};
use crate::units::format_size;

/// Default gather: bytes allocated before their reads may start.
pub const DEFAULT_GATHER: u64 = 128 << 20;
/// Default size of one read.
pub const DEFAULT_CHUNK: u64 = 4 << 20;
/// Reads in flight for direct I/O unless told otherwise.
pub const DEFAULT_DEPTH: u32 = 8;
/// Reads in flight for buffered I/O unless told otherwise: a buffered read
/// of cached data is a CPU copy, and more of them in flight only adds
/// io_uring worker threads fighting over the same page tables.
pub const BUFFERED_DEPTH: u32 = 1;
/// Most reads in flight.
pub const MAX_DEPTH: u32 = 256;
/// Smallest read.
pub const MIN_CHUNK: u64 = 4096;
/// Largest read.
pub const MAX_CHUNK: u64 = 256 << 20;
/// Largest gather.
pub const MAX_GATHER: u64 = 64 << 30;
/// Most reader threads when io_uring is unavailable.
pub const MAX_THREADS: u32 = 16;
/// Share of a file in the page cache from which Auto reads it buffered
/// (copying from the cache beats reading the device again).
pub const CACHED_THRESHOLD: f64 = 0.5;
/// How often the threads engine reports progress.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(50);

/// How the file is read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IoMode {
    /// Direct I/O, unless the file is mostly in the page cache already or
    /// its filesystem cannot do it (then buffered, and the report says so).
    #[default]
    Auto,
    /// Direct I/O (O_DIRECT) or an error.
    Direct,
    /// Through the page cache.
    Buffered,
}

/// What issues the reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Engine {
    /// io_uring, or reader threads where io_uring is unavailable.
    #[default]
    Auto,
    /// io_uring or an error.
    Uring,
    /// `depth` threads (at most [`MAX_THREADS`]) doing blocking reads.
    Threads,
}

/// Where a load stands, given to the progress callback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    /// File bytes in the buffer.
    pub read: u64,
    /// Buffer bytes allocated so far.
    pub allocated: u64,
    /// File bytes to read.
    pub total: u64,
    /// Time since the load started.
    pub elapsed: Duration,
}

/// A progress callback; called from the thread that called the loader.
pub type ProgressFn = Box<dyn FnMut(&Progress) + Send>;

/// How to load a file.
pub struct LoadOptions {
    /// Direct or buffered reads.
    pub io: IoMode,
    /// io_uring or threads.
    pub engine: Engine,
    /// Bytes allocated per gather (rounded to a multiple of `chunk` and of
    /// the page size).
    pub gather: u64,
    /// Bytes per read.
    pub chunk: u64,
    /// Reads in flight (0: [`DEFAULT_DEPTH`] for direct I/O,
    /// [`BUFFERED_DEPTH`] for buffered).
    pub depth: u32,
    /// Allocate the pages ahead of the reads (in gathers); off, the reads
    /// fault them in themselves.
    pub populate: bool,
    /// Allocate in a separate thread while reading (off: allocate
    /// everything first, then read; for comparisons).
    pub overlap: bool,
    /// Page size of the buffer.
    pub pages: PagePolicy,
    /// NUMA node for the buffer (advice).
    pub node: Option<u32>,
    /// Called as reads complete.
    pub progress: Option<ProgressFn>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            io: IoMode::Auto,
            engine: Engine::Auto,
            gather: DEFAULT_GATHER,
            chunk: DEFAULT_CHUNK,
            depth: 0,
            populate: true,
            overlap: true,
            pages: PagePolicy::Auto,
            node: None,
            progress: None,
        }
    }
}

impl std::fmt::Debug for LoadOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadOptions")
            .field("io", &self.io)
            .field("engine", &self.engine)
            .field("gather", &self.gather)
            .field("chunk", &self.chunk)
            .field("depth", &self.depth)
            .field("populate", &self.populate)
            .field("overlap", &self.overlap)
            .field("pages", &self.pages)
            .field("node", &self.node)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

impl LoadOptions {
    /// Set the I/O mode.
    pub fn io(mut self, io: IoMode) -> Self {
        self.io = io;
        self
    }
    /// Set the engine.
    pub fn engine(mut self, e: Engine) -> Self {
        self.engine = e;
        self
    }
    /// Set the gather size.
    pub fn gather(mut self, bytes: u64) -> Self {
        self.gather = bytes;
        self
    }
    /// Set the read size.
    pub fn chunk(mut self, bytes: u64) -> Self {
        self.chunk = bytes;
        self
    }
    /// Set the reads in flight.
    pub fn depth(mut self, depth: u32) -> Self {
        self.depth = depth;
        self
    }
    /// Populate ahead of the reads or not.
    pub fn populate(mut self, on: bool) -> Self {
        self.populate = on;
        self
    }
    /// Overlap allocation with reading or not.
    pub fn overlap(mut self, on: bool) -> Self {
        self.overlap = on;
        self
    }
    /// Set the page policy.
    pub fn pages(mut self, p: PagePolicy) -> Self {
        self.pages = p;
        self
    }
    /// Call `f` as reads complete.
    pub fn progress(mut self, f: impl FnMut(&Progress) + Send + 'static) -> Self {
        self.progress = Some(Box::new(f));
        self
    }
}

/// How a load was done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoUsed {
    /// O_DIRECT reads.
    Direct,
    /// Page-cache reads.
    Buffered,
}

/// What issued the reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineUsed {
    /// io_uring.
    Uring,
    /// This many reader threads.
    Threads(u32),
}

/// What a load did, for people and benchmarks.
#[derive(Clone, Debug)]
pub struct LoadReport {
    /// File bytes loaded.
    pub bytes: u64,
    /// Wall time of the whole load (open to verified buffer).
    pub elapsed: Duration,
    /// Direct or buffered.
    pub io: IoUsed,
    /// io_uring or threads.
    pub engine: EngineUsed,
    /// Pages of the buffer.
    pub pages: PageKind,
    /// Gather size used.
    pub gather: u64,
    /// Read size used.
    pub chunk: u64,
    /// Reads in flight.
    pub depth: u32,
    /// Whether pages were populated ahead of the reads.
    pub populate: bool,
    /// Whether allocation overlapped the reads.
    pub overlap: bool,
    /// When the first gather was allocated (since the start).
    pub first_gather: Option<Duration>,
    /// When the whole buffer was allocated.
    pub alloc_done: Option<Duration>,
    /// Read operations issued (short reads resumed count again).
    pub reads: u64,
    /// Share of the file in the page cache before the load (Auto, where
    /// direct I/O is possible: that is when it decides).
    pub cached_before: Option<f64>,
    /// Fallbacks and choices worth telling (io_uring, O_DIRECT, hugepages).
    pub notes: Vec<String>,
}

impl LoadReport {
    /// One line naming the mode, e.g. "direct I/O via io_uring (depth 8,
    /// 4.00 MiB reads, 128 MiB gathers, overlapped), normal 4 KiB pages".
    pub fn mode(&self) -> String {
        let io = match self.io {
            IoUsed::Direct => "direct I/O",
            IoUsed::Buffered => "buffered I/O",
        };
        let engine = match self.engine {
            EngineUsed::Uring => format!("io_uring (depth {}", self.depth),
            EngineUsed::Threads(n) => format!("{n} reader threads ("),
        };
        let sep = if matches!(self.engine, EngineUsed::Uring) {
            ", "
        } else {
            ""
        };
        let alloc = match (self.populate, self.overlap) {
            (false, _) => "pages faulted in by the reads".to_string(),
            (true, true) => format!("{} gathers, overlapped", format_size(self.gather)),
            (true, false) => "allocated before reading".to_string(),
        };
        format!(
            "{io} via {engine}{sep}{} reads, {alloc}), {}",
            format_size(self.chunk),
            self.pages.name()
        )
    }

    /// Throughput in bytes per second.
    pub fn rate(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// A loaded file: the buffer and how it was filled.
#[derive(Debug)]
pub struct Loaded {
    /// The file's bytes (`len()` is the file size; the rest of the
    /// capacity is zero).
    pub buffer: Buffer,
    /// What was done.
    pub report: LoadReport,
}

/// Errors of loading.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file cannot be opened.
    #[error("cannot open {}: {}", path.display(), source.source_text())]
    Open {
        /// The file.
        path: PathBuf,
        /// Why.
        source: SysError,
    },
    /// Not a regular file.
    #[error("{} is a {kind}, not a regular file", path.display())]
    NotRegular {
        /// The path.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// Direct I/O was required and the filesystem cannot do it.
    #[error("{}: {fs} does not support direct I/O (O_DIRECT); load it with buffered or auto I/O", path.display())]
    DirectUnsupported {
        /// The file.
        path: PathBuf,
        /// Filesystem name.
        fs: String,
    },
    /// io_uring was required and is unavailable.
    #[error("io_uring is unavailable here ({0}); use the threads engine or auto")]
    UringUnavailable(String),
    /// A read failed.
    #[error("reading {} at offset {offset} failed: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Offset of the failed read.
        offset: u64,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file changed size or contents while being read.
    #[error("{} changed while being read: {what}", path.display())]
    Changed {
        /// The file.
        path: PathBuf,
        /// What changed.
        what: String,
    },
    /// Options out of range.
    #[error("invalid load options: {0}")]
    BadOptions(String),
    /// The buffer could not be had.
    #[error("{}: {source}", path.display())]
    Heap {
        /// The file.
        path: PathBuf,
        /// Why.
        source: HeapError,
    },
    /// A system call failed.
    #[error(transparent)]
    Sys(#[from] SysError),
}

trait SourceText {
    fn source_text(&self) -> String;
}

impl SourceText for SysError {
    fn source_text(&self) -> String {
        match self {
            SysError::Call { source, .. } => source.to_string(),
            other => other.to_string(),
        }
    }
}

impl LoadError {
    /// Positive errno for C and protocol boundaries.
    pub fn errno(&self) -> i32 {
        match self {
            LoadError::Open { source, .. } => source.errno(),
            LoadError::NotRegular { .. } | LoadError::BadOptions(_) => libc::EINVAL,
            LoadError::DirectUnsupported { .. } => libc::EINVAL,
            LoadError::UringUnavailable(_) => libc::ENOSYS,
            LoadError::Read { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            LoadError::Changed { .. } => libc::ESTALE,
            LoadError::Heap { source, .. } => source.errno(),
            LoadError::Sys(e) => e.errno(),
        }
    }
}

/// Load `path` into a new buffer of the process heap.
pub fn alloc_and_read(path: impl AsRef<Path>, opts: LoadOptions) -> Result<Loaded, LoadError> {
    Heap::process().load(path, opts)
}

fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to) * to
}

/// Checked, normalised options.
#[derive(Clone, Copy, Debug)]
struct Shape {
    chunk: u64,
    gather: u64,
    depth: u32,
}

fn shape(opts: &LoadOptions, direct: bool, align: u64, page: u64) -> Result<Shape, LoadError> {
    if !(MIN_CHUNK..=MAX_CHUNK).contains(&opts.chunk) {
        return Err(LoadError::BadOptions(format!(
            "chunk {} is outside {}..={}",
            opts.chunk,
            format_size(MIN_CHUNK),
            format_size(MAX_CHUNK)
        )));
    }
    let depth = match opts.depth {
        0 if direct => DEFAULT_DEPTH,
        0 => BUFFERED_DEPTH,
        d => d,
    };
    if depth > MAX_DEPTH {
        return Err(LoadError::BadOptions(format!(
            "depth {depth} is outside 1..={MAX_DEPTH}"
        )));
    }
    if opts.gather == 0 || opts.gather > MAX_GATHER {
        return Err(LoadError::BadOptions(format!(
            "gather {} is outside 1..={}",
            opts.gather,
            format_size(MAX_GATHER)
        )));
    }
    // Reads start aligned (direct I/O) and never straddle a gather.
    let chunk = round_up(opts.chunk, align.max(4096));
    let gather = round_up(round_up(opts.gather.max(chunk), chunk), page);
    let gather = round_up(gather, chunk);
    Ok(Shape {
        chunk,
        gather,
        depth,
    })
}

/// The allocation side's progress, shared with the readers.
struct Gathers {
    /// Buffer bytes allocated, from offset 0 (Release by the allocator,
    /// Acquire by readers: a read may only target allocated pages).
    ready: AtomicU64,
    failed: Mutex<Option<HeapError>>,
    stop: AtomicBool,
    lock: Mutex<()>,
    cv: Condvar,
    first_ns: AtomicU64,
    done_ns: AtomicU64,
}

impl Gathers {
    fn new(ready: u64) -> Gathers {
        Gathers {
            ready: AtomicU64::new(ready),
            failed: Mutex::new(None),
            stop: AtomicBool::new(false),
            lock: Mutex::new(()),
            cv: Condvar::new(),
            first_ns: AtomicU64::new(0),
            done_ns: AtomicU64::new(0),
        }
    }

    fn ready(&self) -> u64 {
        // Pairs with the Release store in `publish`.
        self.ready.load(Ordering::Acquire)
    }

    fn publish(&self, upto: u64) {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        // Pairs with the Acquire load in `ready`.
        self.ready.store(upto, Ordering::Release);
        self.cv.notify_all();
    }

    fn fail(&self, e: HeapError) {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        *self.failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
        self.cv.notify_all();
    }

    fn halt(&self) {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.stop.store(true, Ordering::Relaxed);
        self.cv.notify_all();
    }

    fn take_failure(&self) -> Option<HeapError> {
        self.failed.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Block until at least `want` bytes are allocated. Err(None): the load
    /// is stopping; Err(Some): allocation failed.
    fn wait_for(&self, want: u64) -> Result<(), Option<HeapError>> {
        let mut g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if self.ready() >= want {
                return Ok(());
            }
            if let Some(e) = self.take_failure() {
                return Err(Some(e));
            }
            if self.stop.load(Ordering::Relaxed) {
                return Err(None);
            }
            g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// The allocation side of a load.
#[derive(Clone, Copy)]
struct Allocation<'a> {
    map: &'a Mapping,
    fd: BorrowedFd<'a>,
    kind: PageKind,
    capacity: u64,
    /// Steady-state gather.
    gather: u64,
    /// First gather (then doubling up to `gather`).
    first: u64,
}

/// Allocate `[0, capacity)` gather by gather, publishing each.
fn populate(a: &Allocation<'_>, g: &Gathers, t0: Instant) {
    let Allocation {
        map,
        fd,
        kind,
        capacity,
        gather,
        first,
    } = *a;
    let mut off = 0u64;
    let mut step = first.min(gather);
    while off < capacity {
        if g.stop.load(Ordering::Relaxed) {
            return;
        }
        // Ramp up: the first gathers are one chunk, then twice the last,
        // up to the gather size, so the first read starts after one chunk's
        // allocation rather than a whole gather's.
        let len = step.min(capacity - off);
        step = (step * 2).min(gather);
        // Allocate the gather's pages in the file: one call, no page fault
        // (several times faster than faulting them in through the mapping
        // on a VM); the reads map them as they pin them.
        let r = wd_sys::pages::fallocate(fd, off, len).or_else(|e| {
            // A filesystem without fallocate (none we create): fault them in.
            if e.errno() == libc::EOPNOTSUPP {
                map.populate_write(off as usize, len as usize)
            } else {
                Err(e)
            }
        });
        if let Err(e) = r {
            let err = match e.errno() {
                libc::ENOMEM | libc::ENOSPC | libc::EFAULT if kind != PageKind::Normal => {
                    HeapError::NoHugePages {
                        pages: kind.memfd(),
                        need: capacity.div_ceil(kind.page_bytes()),
                        available: crate::system::huge_pool(kind.memfd())
                            .map_or(0, |p| p.available),
                    }
                }
                libc::ENOMEM | libc::ENOSPC | libc::EFAULT => HeapError::NoMemory {
                    want: capacity,
                    available: crate::system::mem_available().unwrap_or(0),
                },
                _ => HeapError::Sys(e),
            };
            g.fail(err);
            return;
        }
        off += len;
        let ns = t0.elapsed().as_nanos() as u64;
        if g.first_ns.load(Ordering::Relaxed) == 0 {
            g.first_ns.store(ns.max(1), Ordering::Relaxed);
        }
        g.done_ns.store(ns.max(1), Ordering::Relaxed);
        g.publish(off);
    }
}

/// What the readers need to know about the file and the buffer.
struct Plan<'a> {
    path: &'a Path,
    fd: BorrowedFd<'a>,
    map: &'a Mapping,
    /// File size when the load started.
    size: u64,
    /// End of the last read: `size` rounded up to the direct-I/O alignment.
    read_end: u64,
    chunk: u64,
    align: u64,
    direct: bool,
}

enum Outcome {
    Done(u64),
    Partial(u64, (u64, u64)),
    Retry,
}

impl Plan<'_> {
    fn changed(&self, what: String) -> LoadError {
        LoadError::Changed {
            path: self.path.to_path_buf(),
            what,
        }
    }

    /// Judge one read of `[off, off+len)` that returned `res` (bytes, or
    /// -errno).
    fn judge(&self, off: u64, len: u64, res: i64) -> Result<Outcome, LoadError> {
        let expect = (off + len).min(self.size).saturating_sub(off);
        if res < 0 {
            let errno = (-res) as i32;
            if errno == libc::EINTR || errno == libc::EAGAIN {
                return Ok(Outcome::Retry);
            }
            return Err(LoadError::Read {
                path: self.path.to_path_buf(),
                offset: off,
                source: std::io::Error::from_raw_os_error(errno),
            });
        }
        let n = res as u64;
        if n == expect {
            return Ok(Outcome::Done(n));
        }
        if n > expect {
            return Err(self.changed(format!(
                "it grew beyond the {} bytes it had when loading started",
                self.size
            )));
        }
        let end = off + n;
        if n == 0 || (self.direct && end % self.align != 0) {
            return Err(self.changed(format!(
                "it ended at byte {end}, but had {} bytes when loading started",
                self.size
            )));
        }
        Ok(Outcome::Partial(n, (end, len - n)))
    }

    fn read_error(&self, off: u64, e: SysError) -> LoadError {
        LoadError::Read {
            path: self.path.to_path_buf(),
            offset: off,
            source: match e {
                SysError::Call { source, .. } => source,
                other => std::io::Error::other(other.to_string()),
            },
        }
    }
}

fn heap_err(path: &Path, e: HeapError) -> LoadError {
    LoadError::Heap {
        path: path.to_path_buf(),
        source: e,
    }
}

/// Wait for allocation up to `want`, turning its failure into the load's.
fn wait_alloc(plan: &Plan<'_>, g: &Gathers, want: u64) -> Result<(), LoadError> {
    match g.wait_for(want) {
        Ok(()) => Ok(()),
        Err(Some(e)) => Err(heap_err(plan.path, e)),
        Err(None) => Err(LoadError::BadOptions("load stopped".into())),
    }
}

/// The io_uring reader: up to `depth` reads in flight, each gather's reads
/// issued as soon as it is allocated. Returns the reads issued.
fn read_uring<'m>(
    plan: &Plan<'m>,
    mut ring: Uring<'m>,
    depth: u32,
    g: &Gathers,
    report: &mut dyn FnMut(u64),
) -> Result<u64, LoadError> {
    let depth = depth as usize;
    let mut slots: Vec<(u64, u64)> = vec![(0, 0); depth];
    let mut free: Vec<usize> = (0..depth).rev().collect();
    let mut retry: Vec<(u64, u64)> = Vec::new();
    let mut next = 0u64;
    let mut done = 0u64;
    let mut reads = 0u64;
    let mut cqes = Vec::with_capacity(depth);
    loop {
        let ready = g.ready();
        while ring.in_flight() < depth {
            let (off, len) = if let Some(r) = retry.pop() {
                r
            } else if next < plan.read_end {
                let len = plan.chunk.min(plan.read_end - next);
                if next + len > ready {
                    break;
                }
                next += len;
                (next - len, len)
            } else {
                break;
            };
            let slot = free.pop().expect("one free slot per read not in flight");
            slots[slot] = (off, len);
            ring.push_read(
                plan.fd,
                plan.map,
                off as usize,
                len as usize,
                off,
                slot as u64,
            )
            .map_err(|e| plan.read_error(off, e))?;
            reads += 1;
        }
        if ring.in_flight() == 0 {
            if next >= plan.read_end {
                break;
            }
            let want = next + plan.chunk.min(plan.read_end - next);
            wait_alloc(plan, g, want)?;
            continue;
        }
        cqes.clear();
        ring.submit_and_wait(1, &mut cqes)
            .map_err(|e| plan.read_error(next, e))?;
        for c in &cqes {
            let slot = c.user_data as usize;
            let (off, len) = slots[slot];
            free.push(slot);
            match plan.judge(off, len, c.result as i64)? {
                Outcome::Done(n) => done += n,
                Outcome::Partial(n, rest) => {
                    done += n;
                    retry.push(rest);
                }
                Outcome::Retry => retry.push((off, len)),
            }
        }
        report(done);
    }
    Ok(reads)
}

/// The fallback reader: `threads` threads, each claiming the next chunk,
/// waiting for its gather, and reading it with blocking preads.
fn read_threads(
    plan: &Plan<'_>,
    threads: u32,
    g: &Gathers,
    report: &mut dyn FnMut(u64),
) -> Result<u64, LoadError> {
    let next = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    let reads = AtomicU64::new(0);
    let finished = AtomicUsize::new(0);
    let error: Mutex<Option<LoadError>> = Mutex::new(None);
    let wake = (Mutex::new(()), Condvar::new());
    let worker = || -> Result<(), LoadError> {
        loop {
            if g.stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            let off = next.fetch_add(plan.chunk, Ordering::Relaxed);
            if off >= plan.read_end {
                return Ok(());
            }
            let len = plan.chunk.min(plan.read_end - off);
            match g.wait_for(off + len) {
                Ok(()) => {}
                Err(Some(e)) => return Err(heap_err(plan.path, e)),
                Err(None) => return Ok(()),
            }
            let (mut o, mut l) = (off, len);
            loop {
                reads.fetch_add(1, Ordering::Relaxed);
                let res =
                    match wd_sys::file::pread_into(plan.fd, plan.map, o as usize, l as usize, o) {
                        Ok(n) => n as i64,
                        Err(e) => -(e.errno() as i64),
                    };
                match plan.judge(o, l, res)? {
                    Outcome::Done(n) => {
                        done.fetch_add(n, Ordering::Relaxed);
                        // Let the calling thread report progress now.
                        wake.1.notify_all();
                        break;
                    }
                    Outcome::Partial(n, (no, nl)) => {
                        done.fetch_add(n, Ordering::Relaxed);
                        (o, l) = (no, nl);
                    }
                    Outcome::Retry => {}
                }
            }
        }
    };
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                if let Err(e) = worker() {
                    let mut slot = error.lock().unwrap_or_else(|e| e.into_inner());
                    slot.get_or_insert(e);
                    g.halt();
                }
                let _l = wake.0.lock().unwrap_or_else(|e| e.into_inner());
                finished.fetch_add(1, Ordering::Relaxed);
                wake.1.notify_all();
            });
        }
        let mut l = wake.0.lock().unwrap_or_else(|e| e.into_inner());
        while finished.load(Ordering::Relaxed) < threads as usize {
            l = wake
                .1
                .wait_timeout(l, PROGRESS_INTERVAL)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            report(done.load(Ordering::Relaxed));
        }
    });
    if let Some(e) = error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e);
    }
    Ok(reads.load(Ordering::Relaxed))
}

fn kind_name(k: FileKind) -> &'static str {
    match k {
        FileKind::Regular => "regular file",
        FileKind::Directory => "directory",
        FileKind::Block => "block device",
        FileKind::Other => "special file (device, FIFO or socket)",
    }
}

impl Heap {
    /// Load `path` into a new buffer of this heap; see [`alloc_and_read`].
    pub fn load(&self, path: impl AsRef<Path>, mut opts: LoadOptions) -> Result<Loaded, LoadError> {
        let t0 = Instant::now();
        let path = path.as_ref();
        let open_err = |source: SysError| LoadError::Open {
            path: path.to_path_buf(),
            source,
        };
        // Options are checked before anything is opened or allocated.
        shape(&opts, true, 1, 4096)?;
        let mut notes = Vec::new();
        let plain = wd_sys::file::open_read(path, false).map_err(open_err)?;
        let info = wd_sys::file::file_info(plain.as_fd())?;
        if info.kind != FileKind::Regular {
            return Err(LoadError::NotRegular {
                path: path.to_path_buf(),
                kind: kind_name(info.kind),
            });
        }
        let size = info.size;
        let fs = || {
            wd_sys::file::fs_of(plain.as_fd())
                .map(|(m, _)| wd_sys::file::fs_name(m))
                .unwrap_or_else(|_| "this filesystem".into())
        };

        // Direct or buffered: first whether the filesystem can do direct
        // I/O at all, then (Auto) whether the page cache already holds the
        // file.
        let mut cached_before = None;
        let mut direct_fd: Option<OwnedFd> = None;
        let mut direct_info: Option<FileInfo> = None;
        if opts.io != IoMode::Buffered && size > 0 {
            match wd_sys::file::open_read(path, true) {
                Ok(fd) => {
                    let di = wd_sys::file::file_info(fd.as_fd())?;
                    if (di.dev, di.ino) != (info.dev, info.ino) {
                        return Err(LoadError::Changed {
                            path: path.to_path_buf(),
                            what: "the path was replaced by another file while it was being opened"
                                .into(),
                        });
                    }
                    direct_info = Some(di);
                    direct_fd = Some(fd);
                }
                Err(e) if e.errno() == libc::EINVAL => {
                    if opts.io == IoMode::Direct {
                        return Err(LoadError::DirectUnsupported {
                            path: path.to_path_buf(),
                            fs: fs(),
                        });
                    }
                    notes.push(format!(
                        "{} does not support direct I/O (O_DIRECT): reading buffered",
                        fs()
                    ));
                }
                Err(e) => return Err(open_err(e)),
            }
        }
        if opts.io == IoMode::Auto && direct_fd.is_some() {
            // Files that cannot be mapped (some special filesystems) count
            // as not cached.
            let frac = wd_sys::file::resident_share(plain.as_fd(), size).unwrap_or(0.0);
            cached_before = Some(frac);
            if frac >= CACHED_THRESHOLD {
                notes.push(format!(
                    "{:.0}% of the file is in the page cache: reading it buffered (copying from the cache beats reading the device again)",
                    frac * 100.0
                ));
                direct_fd = None;
                direct_info = None;
            }
        }
        let direct = direct_fd.is_some();
        let align = match direct_info {
            Some(di) => {
                let a = di.dio_offset_align.max(di.dio_mem_align) as u64;
                if a.is_power_of_two() {
                    a
                } else {
                    // The kernel did not say: the block size, at least a page.
                    let b = di.blksize as u64;
                    if b.is_power_of_two() && b <= MAX_CHUNK {
                        b.max(4096)
                    } else {
                        4096
                    }
                }
            }
            None => 1,
        };
        if !direct {
            // Larger readahead for a sequential pass.
            let _ = wd_sys::file::fadvise(plain.as_fd(), 0, 0, wd_sys::file::Advice::Sequential);
        }
        let fd = direct_fd.as_ref().map_or(plain.as_fd(), |f| f.as_fd());

        // The buffer: room for the aligned tail of a direct read.
        let read_end = round_up(size, align);
        let (mut kind, page_note) =
            choose_pages(read_end, opts.pages).map_err(|e| heap_err(path, e))?;
        // Pages are allocated below, in gathers, while the reads run.
        let buffer_opts = AllocOptions {
            pages: opts.pages,
            populate: false,
            seal: true,
            node: opts.node,
        };
        let mut buffer = match self.alloc_on(read_end, kind, &buffer_opts) {
            Err(HeapError::NoHugePages { .. }) if opts.pages == PagePolicy::Auto => {
                notes.push("the hugetlb pool ran short while allocating: normal pages".into());
                kind = PageKind::Normal;
                self.alloc_on(read_end, kind, &buffer_opts)
            }
            r => r,
        }
        .map_err(|e| heap_err(path, e))?;
        if let (Some(n), PageKind::Normal) = (page_note, kind) {
            if opts.pages == PagePolicy::Auto {
                notes.push(format!("normal pages: {n}"));
            }
        }
        let capacity = buffer.capacity();
        let sh = shape(&opts, direct, align, kind.page_bytes())?;

        // Engine.
        let ring = match opts.engine {
            Engine::Threads => None,
            Engine::Uring | Engine::Auto if size == 0 => None,
            Engine::Uring => {
                Some(Uring::new(sh.depth).map_err(|e| LoadError::UringUnavailable(e.to_string()))?)
            }
            Engine::Auto => match Uring::new(sh.depth) {
                Ok(r) => Some(r),
                Err(e) => {
                    notes.push(format!(
                        "io_uring unavailable ({e}): using {} reader threads",
                        sh.depth.min(MAX_THREADS)
                    ));
                    None
                }
            },
        };
        let engine = if ring.is_some() || (size == 0 && opts.engine != Engine::Threads) {
            EngineUsed::Uring
        } else {
            EngineUsed::Threads(sh.depth.min(MAX_THREADS))
        };

        let map = buffer.mapping();
        let plan = Plan {
            path,
            fd,
            map,
            size,
            read_end,
            chunk: sh.chunk,
            align,
            direct,
        };
        // The first gather: one read's worth (whole pages).
        let first = round_up(sh.chunk, kind.page_bytes()).min(sh.gather);
        let threaded_alloc = opts.populate && opts.overlap && capacity > first;
        let g = Gathers::new(if opts.populate { 0 } else { capacity });
        let alloc = Allocation {
            map,
            fd: buffer.fd(),
            kind,
            capacity,
            gather: sh.gather,
            first,
        };
        if opts.populate && !threaded_alloc {
            let all = Allocation {
                gather: capacity,
                first: capacity,
                ..alloc
            };
            populate(&all, &g, t0);
            if let Some(e) = g.take_failure() {
                return Err(heap_err(path, e));
            }
        }
        let mut progress = opts.progress.take();
        let mut report = |read: u64| {
            if let Some(p) = progress.as_mut() {
                p(&Progress {
                    read,
                    allocated: g.ready(),
                    total: size,
                    elapsed: t0.elapsed(),
                });
            }
        };
        let result = std::thread::scope(|s| {
            if threaded_alloc {
                s.spawn(|| populate(&alloc, &g, t0));
            }
            let r = match ring {
                Some(ring) => read_uring(&plan, ring, sh.depth, &g, &mut report),
                None if size == 0 => Ok(0),
                None => read_threads(&plan, sh.depth.min(MAX_THREADS), &g, &mut report),
            };
            // Stop the allocator early on failure (it checks between gathers).
            g.halt();
            r
        });
        let reads = result?;
        if let Some(e) = g.take_failure() {
            return Err(heap_err(path, e));
        }
        report(size);

        // The file must be what it was when we started.
        let after = wd_sys::file::file_info(fd)?;
        if after.size != size {
            return Err(LoadError::Changed {
                path: path.to_path_buf(),
                what: format!("its size went from {size} to {} bytes", after.size),
            });
        }
        if after.mtime_ns != info.mtime_ns {
            return Err(LoadError::Changed {
                path: path.to_path_buf(),
                what: "it was modified (its mtime changed)".into(),
            });
        }
        if read_end > size {
            // A direct read of the last block may bring bytes past the end
            // of the file: the buffer holds the file and zeros.
            map.zero(size as usize, (read_end - size) as usize)?;
        }
        let first_ns = g.first_ns.load(Ordering::Relaxed);
        let done_ns = g.done_ns.load(Ordering::Relaxed);
        buffer.set_len(size);
        let report = LoadReport {
            bytes: size,
            elapsed: t0.elapsed(),
            io: if direct {
                IoUsed::Direct
            } else {
                IoUsed::Buffered
            },
            engine,
            pages: kind,
            gather: sh.gather,
            chunk: sh.chunk,
            depth: sh.depth,
            populate: opts.populate,
            overlap: opts.overlap,
            first_gather: (first_ns > 0).then(|| Duration::from_nanos(first_ns)),
            alloc_done: (done_ns > 0).then(|| Duration::from_nanos(done_ns)),
            reads,
            cached_before,
            notes,
        };
        Ok(Loaded { buffer, report })
    }
}
