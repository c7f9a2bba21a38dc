//! Shareable buffers for devices and processes, and a fast way to fill one
//! from a file.
//!
//! A [`Buffer`] is a memfd (on hugetlb pages when the machine has them)
//! mapped into this process: exported as a file descriptor it can be
//! imported by another process (the same pages, no copy: the role dma-buf
//! plays in the kernel), sealed against resizing or writes, and shared with
//! a WrapDrive queue so a device works on it in place. Buffers come from a
//! [`Heap`] with per-process limits and clear errors when memory or
//! hugepages run out.
//!
//! [`alloc_and_read`] loads a file into a new buffer, overlapping the
//! allocation of the buffer with direct I/O into it (see [`load`]):
//!
//! ```no_run
//! use wd_heap::{alloc_and_read, LoadOptions};
//! let loaded = alloc_and_read("model.bin", LoadOptions::default())?;
//! println!("{} bytes, {}", loaded.buffer.len(), loaded.report.mode());
//! let fd = loaded.buffer.export()?; // send it to another process
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(unsafe_code)]

mod heap;
pub mod load;
pub mod system;
pub mod units;

pub use heap::{
    AllocOptions, Buffer, Heap, HeapError, HeapLimits, HeapUsage, PageKind, PagePolicy, Seals,
    DEFAULT_MAX_BUFFERS, LIMIT_ENV, MAX_BUFFER, MEMORY_MARGIN,
};
pub use load::{
    alloc_and_read, Engine, EngineUsed, IoMode, IoUsed, LoadError, LoadOptions, LoadReport, Loaded,
    Progress,
};
