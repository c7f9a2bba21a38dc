//! The buffer heap: shareable buffers on memfds, their export and import,
//! seals, and the per-process limits that keep one program from taking the
//! machine.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex, OnceLock};

use wd_sys::pages::{MemfdPages, SEAL_FUTURE_WRITE};
use wd_sys::{Mapping, SysError};

use crate::system;
use crate::units::format_size;

/// Default cap on buffers one heap holds at once.
pub const DEFAULT_MAX_BUFFERS: usize = 4096;
/// Largest single buffer (1 TiB): far beyond any machine here, and keeps
/// every size computation far from overflow.
pub const MAX_BUFFER: u64 = 1 << 40;
/// Environment variable overriding the process heap's byte limit ("16G").
pub const LIMIT_ENV: &str = "WD_HEAP_LIMIT";
/// Memory left to the rest of the machine when checking availability.
pub const MEMORY_MARGIN: u64 = 64 << 20;

/// Errors of the heap.
#[derive(Debug, thiserror::Error)]
pub enum HeapError {
    /// The heap's byte limit would be exceeded.
    #[error("a buffer of {} exceeds this process's heap limit of {} ({} in use; raise it with {LIMIT_ENV} or HeapLimits)", format_size(*want), format_size(*limit), format_size(*used))]
    Limit {
        /// Bytes asked for (rounded to pages).
        want: u64,
        /// Bytes held.
        used: u64,
        /// The limit.
        limit: u64,
    },
    /// The heap holds as many buffers as it may.
    #[error("this process already holds {0} heap buffers, the most it may")]
    TooManyBuffers(usize),
    /// The machine (or this cgroup) does not have the memory.
    #[error("out of memory: a buffer of {} needs more than the {} available", format_size(*want), format_size(*available))]
    NoMemory {
        /// Bytes asked for.
        want: u64,
        /// Bytes available.
        available: u64,
    },
    /// Hugetlb pages were required and the pool does not have enough.
    #[error("not enough {} hugetlb pages: need {need}, {available} available (reserve more: echo N > /sys/kernel/mm/hugepages/hugepages-{}kB/nr_hugepages)", pages_name(*pages), pages.page_bytes() >> 10)]
    NoHugePages {
        /// Page size asked for.
        pages: MemfdPages,
        /// Pages needed.
        need: u64,
        /// Pages available.
        available: u64,
    },
    /// A size of zero or beyond [`MAX_BUFFER`].
    #[error("invalid buffer size {0}")]
    BadSize(u64),
    /// An offset/length outside the buffer.
    #[error("range {offset}+{len} lies outside the {size}-byte buffer")]
    OutOfRange {
        /// Offset.
        offset: u64,
        /// Length.
        len: u64,
        /// Buffer length.
        size: u64,
    },
    /// An imported descriptor is not a buffer that can be shared safely.
    #[error("cannot import: {0}")]
    BadImport(String),
    /// The buffer is mapped read-only here (it was sealed against writes).
    #[error("the buffer is read-only in this process (sealed against writes)")]
    ReadOnly,
    /// A system call failed.
    #[error(transparent)]
    Sys(#[from] SysError),
}

impl HeapError {
    /// Positive errno for protocol and C boundaries.
    pub fn errno(&self) -> i32 {
        match self {
            HeapError::Limit { .. }
            | HeapError::NoMemory { .. }
            | HeapError::NoHugePages { .. } => libc::ENOMEM,
            HeapError::TooManyBuffers(_) => libc::EMFILE,
            HeapError::BadSize(_) | HeapError::OutOfRange { .. } | HeapError::BadImport(_) => {
                libc::EINVAL
            }
            HeapError::ReadOnly => libc::EPERM,
            HeapError::Sys(e) => e.errno(),
        }
    }
}

fn pages_name(p: MemfdPages) -> &'static str {
    match p {
        MemfdPages::Normal => "4 KiB",
        MemfdPages::Huge2M => "2 MiB",
        MemfdPages::Huge1G => "1 GiB",
    }
}

/// Which pages to back a buffer with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PagePolicy {
    /// Hugetlb pages when the pool has enough free (1 GiB pages for buffers
    /// of at least 1 GiB, else 2 MiB), normal pages otherwise.
    #[default]
    Auto,
    /// Normal pages.
    Normal,
    /// 2 MiB hugetlb pages, or an error.
    Huge2M,
    /// 1 GiB hugetlb pages, or an error.
    Huge1G,
}

/// The pages a buffer ended up on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageKind {
    /// Normal pages.
    Normal,
    /// 2 MiB hugetlb pages.
    Huge2M,
    /// 1 GiB hugetlb pages.
    Huge1G,
}

impl PageKind {
    /// Bytes per page.
    pub fn page_bytes(self) -> u64 {
        self.memfd().page_bytes() as u64
    }

    /// How people name it.
    pub fn name(self) -> &'static str {
        match self {
            PageKind::Normal => "normal 4 KiB pages",
            PageKind::Huge2M => "2 MiB hugetlb pages",
            PageKind::Huge1G => "1 GiB hugetlb pages",
        }
    }

    /// Short name for tables and JSON ("4k", "2m", "1g").
    pub fn short(self) -> &'static str {
        match self {
            PageKind::Normal => "4k",
            PageKind::Huge2M => "2m",
            PageKind::Huge1G => "1g",
        }
    }

    pub(crate) fn memfd(self) -> MemfdPages {
        match self {
            PageKind::Normal => MemfdPages::Normal,
            PageKind::Huge2M => MemfdPages::Huge2M,
            PageKind::Huge1G => MemfdPages::Huge1G,
        }
    }
}

/// How to allocate a buffer.
#[derive(Clone, Debug)]
pub struct AllocOptions {
    /// Page size policy.
    pub pages: PagePolicy,
    /// Allocate every page now (fallocate), so running out of memory is an
    /// error here rather than a fault later.
    pub populate: bool,
    /// Seal against shrinking and growing (needed to share it with a queue
    /// or another process safely).
    pub seal: bool,
    /// NUMA node to bind the pages to (advice: ignored without NUMA).
    pub node: Option<u32>,
}

impl Default for AllocOptions {
    fn default() -> Self {
        AllocOptions {
            pages: PagePolicy::Auto,
            populate: true,
            seal: true,
            node: None,
        }
    }
}

/// Limits of one heap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapLimits {
    /// Bytes of buffers (page-rounded) held at once.
    pub max_bytes: u64,
    /// Buffers held at once.
    pub max_buffers: usize,
}

impl HeapLimits {
    /// The process heap's limits: `WD_HEAP_LIMIT` if set and valid, else
    /// three quarters of the machine's memory.
    pub fn from_env() -> HeapLimits {
        let max_bytes = std::env::var(LIMIT_ENV)
            .ok()
            .and_then(|v| crate::units::parse_size(&v).ok())
            .unwrap_or_else(|| system::mem_total().map_or(8 << 30, |t| t / 4 * 3));
        HeapLimits {
            max_bytes,
            max_buffers: DEFAULT_MAX_BUFFERS,
        }
    }
}

#[derive(Debug, Default)]
struct Usage {
    bytes: u64,
    buffers: usize,
}

#[derive(Debug)]
struct HeapInner {
    limits: Mutex<HeapLimits>,
    usage: Mutex<Usage>,
}

/// What a heap holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapUsage {
    /// Bytes held (page-rounded).
    pub bytes: u64,
    /// Buffers held.
    pub buffers: usize,
    /// Limits in force.
    pub limits: HeapLimits,
}

/// A heap of shareable buffers with its own limits; [`Heap::process`] is
/// the one a program normally uses.
#[derive(Clone, Debug)]
pub struct Heap {
    inner: Arc<HeapInner>,
}

/// Bytes of a buffer counted against its heap, given back on drop.
#[derive(Debug)]
struct Charge {
    heap: Arc<HeapInner>,
    bytes: u64,
}

impl Drop for Charge {
    fn drop(&mut self) {
        let mut u = self.heap.usage.lock().unwrap_or_else(|e| e.into_inner());
        u.bytes -= self.bytes;
        u.buffers -= 1;
    }
}

fn round_up(v: u64, to: u64) -> Option<u64> {
    v.checked_add(to - 1).map(|x| x / to * to)
}

/// Which pages to use for `len` bytes under `policy`, and why (a note when
/// Auto fell back to normal pages with hugetlb pages asked for nowhere).
pub(crate) fn choose_pages(
    len: u64,
    policy: PagePolicy,
) -> Result<(PageKind, Option<String>), HeapError> {
    // Past the largest buffer the rounding below would overflow.
    if len > MAX_BUFFER {
        return Err(HeapError::BadSize(len));
    }
    let need = |k: PageKind| len.div_ceil(k.page_bytes()).max(1);
    let required = |k: PageKind| -> Result<(PageKind, Option<String>), HeapError> {
        let pool = system::huge_pool(k.memfd());
        let available = pool.map_or(0, |p| p.available);
        if available < need(k) {
            return Err(HeapError::NoHugePages {
                pages: k.memfd(),
                need: need(k),
                available,
            });
        }
        Ok((k, None))
    };
    match policy {
        PagePolicy::Normal => Ok((PageKind::Normal, None)),
        PagePolicy::Huge2M => required(PageKind::Huge2M),
        PagePolicy::Huge1G => required(PageKind::Huge1G),
        PagePolicy::Auto => {
            // Rounding to a huge page may waste at most an eighth.
            for k in [PageKind::Huge1G, PageKind::Huge2M] {
                let pages = need(k);
                let waste = pages * k.page_bytes() - len;
                let fits = system::huge_pool(k.memfd()).is_some_and(|p| p.available >= pages);
                if len >= k.page_bytes() / 2 && waste <= len / 8 && fits {
                    return Ok((k, None));
                }
            }
            let why = match system::huge_pool(MemfdPages::Huge2M) {
                Some(p) if p.total == 0 => "no hugetlb pages are reserved on this machine",
                Some(_) => "the hugetlb pools have too few free pages (or the buffer is too small)",
                None => "this kernel has no hugetlb pool",
            };
            Ok((PageKind::Normal, Some(why.into())))
        }
    }
}

impl Heap {
    /// A heap with its own limits (the process heap is usually what you
    /// want; separate heaps are for budgets inside a program, and tests).
    pub fn new(limits: HeapLimits) -> Heap {
        Heap {
            inner: Arc::new(HeapInner {
                limits: Mutex::new(limits),
                usage: Mutex::new(Usage::default()),
            }),
        }
    }

    /// The process-wide heap, limited by [`HeapLimits::from_env`].
    pub fn process() -> &'static Heap {
        static HEAP: OnceLock<Heap> = OnceLock::new();
        HEAP.get_or_init(|| Heap::new(HeapLimits::from_env()))
    }

    /// Change the limits (buffers already held stay).
    pub fn set_limits(&self, limits: HeapLimits) {
        *self.inner.limits.lock().unwrap_or_else(|e| e.into_inner()) = limits;
    }

    /// What the heap holds now.
    pub fn usage(&self) -> HeapUsage {
        let u = self.inner.usage.lock().unwrap_or_else(|e| e.into_inner());
        HeapUsage {
            bytes: u.bytes,
            buffers: u.buffers,
            limits: *self.inner.limits.lock().unwrap_or_else(|e| e.into_inner()),
        }
    }

    fn charge(&self, bytes: u64) -> Result<Charge, HeapError> {
        let limits = *self.inner.limits.lock().unwrap_or_else(|e| e.into_inner());
        let mut u = self.inner.usage.lock().unwrap_or_else(|e| e.into_inner());
        if u.buffers >= limits.max_buffers {
            return Err(HeapError::TooManyBuffers(limits.max_buffers));
        }
        if u.bytes.saturating_add(bytes) > limits.max_bytes {
            return Err(HeapError::Limit {
                want: bytes,
                used: u.bytes,
                limit: limits.max_bytes,
            });
        }
        u.bytes += bytes;
        u.buffers += 1;
        Ok(Charge {
            heap: self.inner.clone(),
            bytes,
        })
    }

    /// Allocate a buffer of `len` bytes (rounded up to whole pages; at least
    /// one page, so even an empty buffer can be shared), zero-filled.
    pub fn alloc(&self, len: u64, opts: &AllocOptions) -> Result<Buffer, HeapError> {
        let (kind, _) = choose_pages(len, opts.pages)?;
        match self.alloc_on(len, kind, opts) {
            // Auto picked hugetlb pages but someone else took them first.
            Err(e @ HeapError::NoHugePages { .. }) if opts.pages == PagePolicy::Auto => {
                let _ = e;
                self.alloc_on(len, PageKind::Normal, opts)
            }
            r => r,
        }
    }

    /// Allocate on exactly `kind` pages.
    pub(crate) fn alloc_on(
        &self,
        len: u64,
        kind: PageKind,
        opts: &AllocOptions,
    ) -> Result<Buffer, HeapError> {
        if len > MAX_BUFFER {
            return Err(HeapError::BadSize(len));
        }
        let capacity = round_up(len.max(1), kind.page_bytes()).ok_or(HeapError::BadSize(len))?;
        if kind == PageKind::Normal {
            if let Some(avail) = system::mem_available() {
                if capacity > avail.saturating_sub(MEMORY_MARGIN) {
                    return Err(HeapError::NoMemory {
                        want: capacity,
                        available: avail.saturating_sub(MEMORY_MARGIN),
                    });
                }
            }
        }
        let charge = self.charge(capacity)?;
        let no_huge = |need: u64| HeapError::NoHugePages {
            pages: kind.memfd(),
            need,
            available: system::huge_pool(kind.memfd()).map_or(0, |p| p.available),
        };
        let fd = wd_sys::pages::memfd_create_sealable("wd-buffer", kind.memfd())?;
        wd_sys::ftruncate(fd.as_fd(), capacity)?;
        if opts.seal {
            wd_sys::add_seals(fd.as_fd(), wd_sys::SEAL_SHRINK | wd_sys::SEAL_GROW)?;
        }
        let pages = capacity / kind.page_bytes();
        // hugetlb reserves the pool's pages at mmap: ENOMEM means "not enough".
        let map = Mapping::map_shared(fd.as_fd(), 0, capacity as usize).map_err(|e| {
            if kind != PageKind::Normal && e.errno() == libc::ENOMEM {
                no_huge(pages)
            } else {
                HeapError::Sys(e)
            }
        })?;
        if let Some(n) = opts.node {
            // Advice: a kernel without NUMA refuses it and the memory works.
            let _ = map.bind_node(n);
        }
        if opts.populate {
            wd_sys::pages::fallocate(fd.as_fd(), 0, capacity).map_err(|e| match e.errno() {
                libc::ENOSPC | libc::ENOMEM if kind != PageKind::Normal => no_huge(pages),
                libc::ENOSPC | libc::ENOMEM => HeapError::NoMemory {
                    want: capacity,
                    available: system::mem_available().unwrap_or(0),
                },
                _ => HeapError::Sys(e),
            })?;
        }
        Ok(Buffer {
            fd,
            map,
            len,
            pages: kind,
            _charge: charge,
        })
    }

    /// Import a buffer another process exported (the dma-buf role: the same
    /// pages, no copy). The descriptor must be a memfd sealed against
    /// shrinking, so it cannot vanish under this process's mapping. `len`:
    /// the bytes that matter (default: the whole file). A buffer sealed
    /// against writes is mapped read-only.
    pub fn import(&self, fd: OwnedFd, len: Option<u64>) -> Result<Buffer, HeapError> {
        let seals = wd_sys::get_seals(fd.as_fd()).map_err(|e| {
            HeapError::BadImport(format!(
                "the descriptor is not a sealable memory file (memfd): {e}"
            ))
        })?;
        if seals & wd_sys::SEAL_SHRINK == 0 {
            return Err(HeapError::BadImport(
                "the buffer is not sealed against shrinking (F_SEAL_SHRINK), so it could vanish under the mapping".into(),
            ));
        }
        let size = wd_sys::file_size(fd.as_fd())?;
        if size == 0 || size > MAX_BUFFER {
            return Err(HeapError::BadImport(format!(
                "the buffer's size ({size} bytes) is out of range"
            )));
        }
        let len = len.unwrap_or(size);
        if len > size {
            return Err(HeapError::OutOfRange {
                offset: 0,
                len,
                size,
            });
        }
        let (magic, bsize) = wd_sys::file::fs_of(fd.as_fd())?;
        let kind = if magic == wd_sys::file::HUGETLBFS_MAGIC {
            match bsize {
                b if b == 1 << 30 => PageKind::Huge1G,
                b if b == 2 << 20 => PageKind::Huge2M,
                b => {
                    return Err(HeapError::BadImport(format!(
                        "unsupported hugetlb page size {b}"
                    )))
                }
            }
        } else {
            PageKind::Normal
        };
        if size % kind.page_bytes() != 0 {
            return Err(HeapError::BadImport(format!(
                "size {size} is not a whole number of pages"
            )));
        }
        let charge = self.charge(size)?;
        let write_sealed = seals & (wd_sys::pages::SEAL_FUTURE_WRITE | libc::F_SEAL_WRITE) != 0;
        let map = if write_sealed {
            Mapping::map_shared_readonly(fd.as_fd(), 0, size as usize)?
        } else {
            Mapping::map_shared(fd.as_fd(), 0, size as usize)?
        };
        Ok(Buffer {
            fd,
            map,
            len,
            pages: kind,
            _charge: charge,
        })
    }
}

/// Seals a buffer carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seals {
    /// Cannot shrink.
    pub shrink: bool,
    /// Cannot grow.
    pub grow: bool,
    /// No new writable mappings or writes.
    pub writes: bool,
    /// Seals cannot change any more.
    pub sealed: bool,
}

/// A shareable buffer: a memfd and its mapping in this process.
///
/// Devices and other processes may write it concurrently, so it hands out
/// no slices: copy in and out, or give its address to a queue.
#[derive(Debug)]
pub struct Buffer {
    fd: OwnedFd,
    map: Mapping,
    len: u64,
    pages: PageKind,
    _charge: Charge,
}

impl Buffer {
    /// Address of the first byte in this process (the IOVA when shared
    /// with a queue).
    pub fn addr(&self) -> u64 {
        self.map.as_ptr() as u64
    }

    /// Bytes that matter (a loaded file's size).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes mapped (whole pages; what a queue is given).
    pub fn capacity(&self) -> u64 {
        self.map.len() as u64
    }

    /// Pages backing it.
    pub fn pages(&self) -> PageKind {
        self.pages
    }

    /// Whether this process may write it.
    pub fn is_writable(&self) -> bool {
        self.map.is_writable()
    }

    /// The memfd (to pass with SCM_RIGHTS or in a queue's MemShare).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Bind the pages to NUMA node `node` (advice: an error where the
    /// kernel has no NUMA, and the memory works all the same), for callers
    /// that must know whether it took.
    pub fn bind_node(&self, node: u32) -> Result<(), HeapError> {
        Ok(self.map.bind_node(node)?)
    }

    /// A new descriptor for the same pages, close-on-exec, for another
    /// process to [`Heap::import`].
    pub fn export(&self) -> Result<OwnedFd, HeapError> {
        self.fd.try_clone().map_err(|e| {
            HeapError::Sys(SysError::Call {
                call: "dup",
                source: e,
            })
        })
    }

    /// A descriptor inherited by commands this process runs.
    pub fn export_inheritable(&self) -> Result<OwnedFd, HeapError> {
        Ok(wd_sys::pages::dup_inheritable(self.fd.as_fd())?)
    }

    /// The seals in force.
    pub fn seals(&self) -> Result<Seals, HeapError> {
        let s = wd_sys::get_seals(self.fd.as_fd())?;
        Ok(Seals {
            shrink: s & wd_sys::SEAL_SHRINK != 0,
            grow: s & wd_sys::SEAL_GROW != 0,
            writes: s & (SEAL_FUTURE_WRITE | libc::F_SEAL_WRITE) != 0,
            sealed: s & wd_sys::SEAL_SEAL != 0,
        })
    }

    /// Seal against resizing (shrink and grow): required before sharing.
    pub fn seal_resize(&self) -> Result<(), HeapError> {
        Ok(wd_sys::add_seals(
            self.fd.as_fd(),
            wd_sys::SEAL_SHRINK | wd_sys::SEAL_GROW,
        )?)
    }

    /// Seal against writes from anyone who maps it from now on (this
    /// process's mapping stays writable): a model loaded once, read-only
    /// for every importer.
    pub fn seal_writes(&self) -> Result<(), HeapError> {
        Ok(wd_sys::add_seals(self.fd.as_fd(), SEAL_FUTURE_WRITE)?)
    }

    /// Forbid any further seal change.
    pub fn seal_seals(&self) -> Result<(), HeapError> {
        Ok(wd_sys::add_seals(self.fd.as_fd(), wd_sys::SEAL_SEAL)?)
    }

    fn check(&self, offset: u64, len: u64) -> Result<(), HeapError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.capacity() => Ok(()),
            _ => Err(HeapError::OutOfRange {
                offset,
                len,
                size: self.capacity(),
            }),
        }
    }

    /// Copy out `out.len()` bytes at `offset` (anywhere in the capacity).
    pub fn read_at(&self, offset: u64, out: &mut [u8]) -> Result<(), HeapError> {
        self.check(offset, out.len() as u64)?;
        Ok(self.map.copy_out(offset as usize, out)?)
    }

    /// Copy `data` in at `offset`.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), HeapError> {
        self.check(offset, data.len() as u64)?;
        if !self.map.is_writable() {
            return Err(HeapError::ReadOnly);
        }
        Ok(self.map.copy_in(offset as usize, data)?)
    }

    /// The first [`Buffer::len`] bytes, copied.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len as usize];
        // In range by construction: len <= capacity.
        let _ = self.map.copy_out(0, &mut v);
        v
    }

    /// One pread of up to `len` bytes at `file_off` of `file` into the
    /// buffer at `offset`; returns the bytes read (0 at end of file). The
    /// building block for readers other than [`crate::alloc_and_read`].
    pub fn read_file_at(
        &self,
        file: BorrowedFd<'_>,
        file_off: u64,
        offset: u64,
        len: u64,
    ) -> Result<usize, HeapError> {
        self.check(offset, len)?;
        if !self.map.is_writable() {
            return Err(HeapError::ReadOnly);
        }
        let len = len.min(wd_sys::uring::MAX_READ as u64) as usize;
        Ok(wd_sys::file::pread_into(
            file,
            &self.map,
            offset as usize,
            len,
            file_off,
        )?)
    }

    /// The mapping, for the loader's reads.
    pub(crate) fn mapping(&self) -> &Mapping {
        &self.map
    }

    /// Set the bytes that matter (the loader, once the file is in).
    pub(crate) fn set_len(&mut self, len: u64) {
        debug_assert!(len <= self.capacity());
        self.len = len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small_heap(bytes: u64, buffers: usize) -> Heap {
        Heap::new(HeapLimits {
            max_bytes: bytes,
            max_buffers: buffers,
        })
    }

    #[test]
    fn alloc_rounds_seals_and_accounts() {
        let h = small_heap(1 << 20, 8);
        let b = h.alloc(5000, &AllocOptions::default()).unwrap();
        assert_eq!(b.len(), 5000);
        assert_eq!(b.pages(), PageKind::Normal);
        assert_eq!(b.capacity() % 4096, 0);
        assert!(b.capacity() >= 5000);
        let s = b.seals().unwrap();
        assert!(s.shrink && s.grow && !s.writes && !s.sealed);
        assert_eq!(h.usage().bytes, b.capacity());
        assert_eq!(h.usage().buffers, 1);
        b.write_at(4090, b"hello world").unwrap();
        let mut out = [0u8; 11];
        b.read_at(4090, &mut out).unwrap();
        assert_eq!(&out, b"hello world");
        assert!(matches!(
            b.write_at(b.capacity() - 1, b"xy"),
            Err(HeapError::OutOfRange { .. })
        ));
        assert!(b.read_at(u64::MAX, &mut out).is_err());
        drop(b);
        assert_eq!(h.usage().bytes, 0);
        assert_eq!(h.usage().buffers, 0);
    }

    #[test]
    fn empty_buffers_still_have_a_page() {
        let h = small_heap(1 << 20, 8);
        let b = h.alloc(0, &AllocOptions::default()).unwrap();
        assert!(b.is_empty());
        assert_eq!(b.capacity(), 4096);
        assert!(b.to_vec().is_empty());
    }

    #[test]
    fn limits_are_enforced_with_clear_errors() {
        let h = small_heap(64 << 10, 2);
        let a = h.alloc(32 << 10, &AllocOptions::default()).unwrap();
        let e = h.alloc(40 << 10, &AllocOptions::default()).unwrap_err();
        assert!(matches!(e, HeapError::Limit { .. }), "{e}");
        assert!(e.to_string().contains("heap limit"), "{e}");
        assert_eq!(e.errno(), libc::ENOMEM);
        let _b = h.alloc(4096, &AllocOptions::default()).unwrap();
        let e = h.alloc(4096, &AllocOptions::default()).unwrap_err();
        assert!(matches!(e, HeapError::TooManyBuffers(2)), "{e}");
        drop(a);
        h.alloc(4096, &AllocOptions::default()).unwrap();
        for len in [MAX_BUFFER + 1, u64::MAX - 4095, u64::MAX] {
            assert!(matches!(
                h.alloc(len, &AllocOptions::default()),
                Err(HeapError::BadSize(_))
            ));
        }
    }

    #[test]
    fn more_than_the_machine_has_is_refused_before_allocating() {
        let h = small_heap(MAX_BUFFER, 8);
        let e = h
            .alloc(MAX_BUFFER - (1 << 20), &AllocOptions::default())
            .unwrap_err();
        assert!(matches!(e, HeapError::NoMemory { .. }), "{e}");
        assert!(e.to_string().starts_with("out of memory"), "{e}");
        assert_eq!(h.usage().buffers, 0);
    }

    #[test]
    fn missing_hugepages_are_a_clear_error_or_work() {
        let h = small_heap(8 << 30, 8);
        let pool = system::huge_pool(MemfdPages::Huge2M);
        let want = 4u64 << 20;
        let r = h.alloc(
            want,
            &AllocOptions {
                pages: PagePolicy::Huge2M,
                ..AllocOptions::default()
            },
        );
        match pool {
            Some(p) if p.available >= 2 => {
                let b = r.unwrap();
                assert_eq!(b.pages(), PageKind::Huge2M);
                b.write_at(want - 1, &[7]).unwrap();
            }
            _ => {
                let e = r.unwrap_err();
                assert!(matches!(e, HeapError::NoHugePages { .. }), "{e}");
                assert!(e.to_string().contains("nr_hugepages"), "{e}");
            }
        }
        // Auto never fails for lack of hugepages.
        let b = h.alloc(want, &AllocOptions::default()).unwrap();
        assert!(b.capacity() >= want);
    }

    #[test]
    fn export_import_same_pages() {
        let h = small_heap(1 << 20, 8);
        let a = h.alloc(8192, &AllocOptions::default()).unwrap();
        a.write_at(100, b"shared").unwrap();
        let b = h.import(a.export().unwrap(), Some(8000)).unwrap();
        assert_eq!(b.len(), 8000);
        assert_ne!(a.addr(), b.addr());
        let mut out = [0u8; 6];
        b.read_at(100, &mut out).unwrap();
        assert_eq!(&out, b"shared");
        b.write_at(200, b"back").unwrap();
        let mut out = [0u8; 4];
        a.read_at(200, &mut out).unwrap();
        assert_eq!(&out, b"back");
        assert_eq!(h.usage().buffers, 2);
        assert!(matches!(
            h.import(a.export().unwrap(), Some(1 << 20)),
            Err(HeapError::OutOfRange { .. })
        ));
    }

    #[test]
    fn import_refuses_unsafe_descriptors() {
        let h = small_heap(1 << 20, 8);
        let unsealed = h
            .alloc(
                4096,
                &AllocOptions {
                    seal: false,
                    ..AllocOptions::default()
                },
            )
            .unwrap();
        let e = h.import(unsealed.export().unwrap(), None).unwrap_err();
        assert!(e.to_string().contains("not sealed"), "{e}");
        unsealed.seal_resize().unwrap();
        h.import(unsealed.export().unwrap(), None).unwrap();
        let file = std::fs::File::open("/proc/self/status").unwrap();
        let e = h.import(file.into(), None).unwrap_err();
        assert!(e.to_string().contains("memfd"), "{e}");
    }

    #[test]
    fn write_sealed_buffers_import_read_only() {
        let h = small_heap(1 << 20, 8);
        let a = h.alloc(4096, &AllocOptions::default()).unwrap();
        a.write_at(0, b"model").unwrap();
        a.seal_writes().unwrap();
        a.seal_seals().unwrap();
        // The owner still writes through its mapping.
        a.write_at(5, b"!").unwrap();
        let b = h.import(a.export().unwrap(), None).unwrap();
        assert!(!b.is_writable());
        assert!(matches!(b.write_at(0, b"x"), Err(HeapError::ReadOnly)));
        let mut out = [0u8; 6];
        b.read_at(0, &mut out).unwrap();
        assert_eq!(&out, b"model!");
        assert!(a.seal_resize().is_err(), "F_SEAL_SEAL forbids new seals");
    }
}
