//! What a load tells its caller afterwards: the buffer and how it was
//! filled.

use std::time::Duration;

use crate::heap::{Buffer, PageKind};
use crate::units::format_size;

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
