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
//!
//! Here, [`Heap::load`] chooses the mode, the pages and the engine and runs
//! them; the options and the report, the allocation (`populate` publishing
//! through `gather`) and the two engines (`uring`, `threads`, sharing
//! `plan`) live in their own modules.

mod error;
mod gather;
mod options;
mod plan;
mod populate;
mod report;
mod threads;
mod uring;

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use wd_sys::file::{FileInfo, FileKind};
use wd_sys::uring::Uring;
use wd_sys::SysError;

use crate::heap::{choose_pages, AllocOptions, Heap, HeapError, PageKind, PagePolicy};

pub use error::LoadError;
pub use options::{
    Engine, IoMode, LoadOptions, Progress, ProgressFn, BUFFERED_DEPTH, CACHED_THRESHOLD,
    DEFAULT_CHUNK, DEFAULT_DEPTH, DEFAULT_GATHER, MAX_CHUNK, MAX_DEPTH, MAX_GATHER, MAX_THREADS,
    MIN_CHUNK,
};
pub use report::{EngineUsed, IoUsed, LoadReport, Loaded};

use gather::Gathers;
use options::shape;
use plan::{heap_err, Plan};
use populate::{populate, Allocation};
use threads::read_threads;
use uring::read_uring;

/// Load `path` into a new buffer of the process heap.
pub fn alloc_and_read(path: impl AsRef<Path>, opts: LoadOptions) -> Result<Loaded, LoadError> {
    Heap::process().load(path, opts)
}

pub(super) fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to) * to
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
                Some(mut ring) => ring.reads(|r| read_uring(&plan, r, sh.depth, &g, &mut report)),
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

        // The file must be what it was when we started, and end where
        // its size said.
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
        // A writer may put the mtime back (utimensat: rsync -t, cp -p,
        // tar); the ctime it cannot.
        if after.ctime_ns != info.ctime_ns {
            return Err(LoadError::Changed {
                path: path.to_path_buf(),
                what: "it was modified (its ctime changed)".into(),
            });
        }
        if wd_sys::file::pread(plain.as_fd(), &mut [0u8; 1], size)? > 0 {
            return Err(LoadError::SizeUntold {
                path: path.to_path_buf(),
                size,
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
