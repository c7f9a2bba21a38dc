//! What a caller asks of a load: modes, sizes and their limits, and the
//! check that turns them into the shape the readers use.

use std::time::Duration;

use crate::heap::PagePolicy;
use crate::units::format_size;

use super::{round_up, LoadError};

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

/// Checked, normalised options.
#[derive(Clone, Copy, Debug)]
pub(super) struct Shape {
    pub(super) chunk: u64,
    pub(super) gather: u64,
    pub(super) depth: u32,
}

pub(super) fn shape(
    opts: &LoadOptions,
    direct: bool,
    align: u64,
    page: u64,
) -> Result<Shape, LoadError> {
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
