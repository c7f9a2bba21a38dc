//! Memory a client shares with a device without copies.
//!
//! The client side ([`Allocator`]) carves page-granular buffers out of
//! arenas, each one heap buffer (`wd_heap`, the one way the project makes
//! shareable memory: a memfd on normal pages, counted against the process's
//! heap limits) sealed against shrinking and growing, so the host can map
//! the same pages without them being cut short (a hole punched in them is
//! another matter: engines touch them inside `wd_sys::guard` sections).
//! The host side ([`ImportedRegion`])
//! checks those seals and the size before it maps anything a client sent.
#![deny(unsafe_code)]

use std::collections::{BTreeMap, HashMap};
use std::os::fd::BorrowedFd;
use std::sync::{Arc, Mutex, Weak};

use wd_sys::window::{FileWindow, WindowMapping};
use wd_sys::{Mapping, SysError};

/// Allocation granule: buffers never share a page, so sharing one buffer
/// with a queue never exposes a neighbour.
pub const GRANULE: usize = 4096;
/// Default size of an arena (one memfd).
pub const DEFAULT_ARENA: usize = 64 << 20;
/// Default cap on the bytes one process's allocator may hold.
pub const DEFAULT_LIMIT: usize = 16 << 30;

/// Errors of shared-memory handling.
#[derive(Debug, thiserror::Error)]
pub enum MemError {
    /// Size zero or too large.
    #[error("invalid size {0}")]
    BadSize(usize),
    /// The allocator's byte limit would be exceeded.
    #[error("allocation of {want} bytes exceeds the limit of {limit} bytes of arenas ({reserved} reserved)")]
    Limit {
        /// Bytes requested.
        want: usize,
        /// Bytes of arenas held (what the limit counts).
        reserved: usize,
        /// Configured limit.
        limit: usize,
    },
    /// The pointer was not returned by this allocator.
    #[error("address {0:#x} is not a buffer of this allocator")]
    NotOurs(usize),
    /// An imported file is not sealed against shrinking.
    #[error("shared memory is not sealed against shrinking (F_SEAL_SHRINK missing)")]
    NotSealed,
    /// An imported file is sealed against writes: the device's mapping
    /// is writable.
    #[error("shared memory is sealed against writes (F_SEAL_WRITE or F_SEAL_FUTURE_WRITE): the device maps it writable")]
    WriteSealed,
    /// An imported range is outside the file.
    #[error("range {offset:#x}+{len:#x} lies outside the {size}-byte file")]
    OutOfFile {
        /// Offset asked.
        offset: u64,
        /// Length asked.
        len: u64,
        /// File size.
        size: u64,
    },
    /// A range of a file of huge pages that is not made of whole pages:
    /// the kernel maps (and unmaps) only whole huge pages.
    #[error("range {offset:#x}+{len:#x} of a file of {page_bytes}-byte pages is not whole pages")]
    PartPage {
        /// Offset asked.
        offset: u64,
        /// Length asked.
        len: u64,
        /// The file's page size.
        page_bytes: u64,
    },
    /// A system call failed.
    #[error(transparent)]
    Sys(#[from] SysError),
    /// The heap refused an arena (limits, memory).
    #[error("arena: {0}")]
    Heap(#[from] wd_heap::HeapError),
}

impl MemError {
    /// Positive errno for the C and protocol boundaries.
    pub fn errno(&self) -> i32 {
        match self {
            MemError::BadSize(_)
            | MemError::NotOurs(_)
            | MemError::OutOfFile { .. }
            | MemError::PartPage { .. } => 22,
            MemError::Limit { .. } => 12,
            MemError::NotSealed | MemError::WriteSealed => 1,
            MemError::Sys(e) => e.errno(),
            MemError::Heap(e) => e.errno(),
        }
    }
}

fn round_up(v: usize, to: usize) -> Option<usize> {
    v.checked_add(to - 1).map(|x| x & !(to - 1))
}

/// One heap buffer that buffers are carved from, mapped in this process.
#[derive(Debug)]
pub struct Arena {
    buf: wd_heap::Buffer,
    node: Option<u32>,
}

impl Arena {
    /// Create a sealed arena of `size` bytes (page multiple), optionally bound
    /// to a NUMA node (memory in the device's NUMA zone). Its pages are
    /// allocated as they are first touched.
    pub fn new(size: usize, node: Option<u32>) -> Result<Arena, MemError> {
        let size = round_up(size, GRANULE).ok_or(MemError::BadSize(size))?;
        if size == 0 {
            return Err(MemError::BadSize(0));
        }
        let opts = wd_heap::AllocOptions {
            pages: wd_heap::PagePolicy::Normal,
            populate: false,
            seal: true,
            node: None,
        };
        let buf = wd_heap::Heap::process().alloc(size as u64, &opts)?;
        // Binding is advice: a kernel without NUMA (or without that node)
        // refuses it and the memory still works. The arena serves the node
        // asked for either way: one that did not bind must not make every
        // later request for the node make an arena of its own.
        if let Some(n) = node {
            let _ = buf.bind_node(n);
        }
        Ok(Arena { buf, node })
    }

    /// Base address in this process.
    pub fn base(&self) -> usize {
        self.buf.addr() as usize
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.buf.capacity() as usize
    }

    /// Whether empty (never).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The memfd, to pass to the host.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.buf.fd()
    }

    /// The NUMA node asked for (the pages are bound to it where the
    /// kernel allows).
    pub fn node(&self) -> Option<u32> {
        self.node
    }
}

/// Where a client address lives: which arena, at which offset.
#[derive(Clone, Debug)]
pub struct Location {
    /// The arena holding the address.
    pub arena: Arc<Arena>,
    /// Offset of the address inside the arena's file.
    pub offset: u64,
}

#[derive(Debug)]
struct ArenaState {
    arena: Arc<Arena>,
    /// Free page ranges: offset -> length.
    free: BTreeMap<usize, usize>,
}

/// Page-granular allocator of shareable buffers.
#[derive(Debug)]
pub struct Allocator {
    arenas: Vec<ArenaState>,
    /// Live allocations: address -> (arena index, length).
    live: BTreeMap<usize, (usize, usize)>,
    /// Allocations a device may reach (shared with a queue, by a range
    /// inside them): address -> how many shares.
    pins: BTreeMap<usize, u32>,
    /// Pinned allocations their owner freed: freed when the last pin goes.
    freed_pinned: std::collections::BTreeSet<usize>,
    used: usize,
    reserved: usize,
    limit: usize,
    arena_size: usize,
}

impl Default for Allocator {
    fn default() -> Self {
        Allocator::new(DEFAULT_ARENA, DEFAULT_LIMIT)
    }
}

impl Allocator {
    /// An allocator growing by `arena_size` arenas up to `limit` bytes of arenas.
    pub fn new(arena_size: usize, limit: usize) -> Allocator {
        Allocator {
            arenas: Vec::new(),
            live: BTreeMap::new(),
            pins: BTreeMap::new(),
            freed_pinned: std::collections::BTreeSet::new(),
            used: 0,
            reserved: 0,
            limit,
            arena_size: round_up(arena_size.max(GRANULE), GRANULE).unwrap_or(DEFAULT_ARENA),
        }
    }

    /// Allocate `size` bytes (rounded up to whole pages), zeroed on first
    /// use, from an arena on `node` (any node if `None`).
    pub fn alloc(&mut self, size: usize, node: Option<u32>) -> Result<usize, MemError> {
        if size == 0 {
            return Err(MemError::BadSize(0));
        }
        let len = round_up(size, GRANULE).ok_or(MemError::BadSize(size))?;
        let found = self.arenas.iter_mut().enumerate().find_map(|(i, a)| {
            if node.is_some() && a.arena.node() != node {
                return None;
            }
            let (&off, &flen) = a.free.iter().find(|(_, &l)| l >= len)?;
            a.free.remove(&off);
            if flen > len {
                a.free.insert(off + len, flen - len);
            }
            Some((i, a.arena.base() + off))
        });
        let (idx, addr) = match found {
            Some(f) => f,
            None => {
                let asize = len.max(self.arena_size);
                if self
                    .reserved
                    .checked_add(asize)
                    .is_none_or(|r| r > self.limit)
                {
                    return Err(MemError::Limit {
                        want: len,
                        reserved: self.reserved,
                        limit: self.limit,
                    });
                }
                let arena = Arc::new(Arena::new(asize, node)?);
                self.reserved += arena.len();
                let mut free = BTreeMap::new();
                if arena.len() > len {
                    free.insert(len, arena.len() - len);
                }
                let base = arena.base();
                self.arenas.push(ArenaState { arena, free });
                (self.arenas.len() - 1, base)
            }
        };
        self.live.insert(addr, (idx, len));
        self.used += len;
        Ok(addr)
    }

    /// Return a buffer; its pages go back to the arena's free list
    /// (merged). A pinned buffer (see [`Allocator::pin`]) goes back when
    /// its last pin does: a device may still write it, so it must not be
    /// handed out again before.
    pub fn free(&mut self, addr: usize) -> Result<(), MemError> {
        if !self.live.contains_key(&addr) || self.freed_pinned.contains(&addr) {
            return Err(MemError::NotOurs(addr));
        }
        if self.pins.contains_key(&addr) {
            self.freed_pinned.insert(addr);
            return Ok(());
        }
        self.release(addr);
        Ok(())
    }

    /// The live buffer holding the whole of `[addr, addr+len)`.
    fn holding(&self, addr: usize, len: usize) -> Option<usize> {
        let end = addr.checked_add(len)?;
        let (&start, &(_, blen)) = self.live.range(..=addr).next_back()?;
        (end <= start + blen && !self.freed_pinned.contains(&start)).then_some(start)
    }

    /// A device may reach `[addr, addr+len)` from now on: when the range
    /// lies inside one live buffer, that buffer is pinned (a free waits
    /// for [`Allocator::unpin`]) and true is returned. A range across
    /// buffers (a whole arena shared at once) pins nothing: its sharer
    /// names the buffers it hands the device one request at a time.
    pub fn pin(&mut self, addr: usize, len: usize) -> bool {
        let Some(start) = self.holding(addr, len) else {
            return false;
        };
        *self.pins.entry(start).or_default() += 1;
        true
    }

    /// Undo one [`Allocator::pin`] of a range inside the buffer at or
    /// before `addr`; a buffer freed while pinned goes back with its last
    /// pin.
    pub fn unpin(&mut self, addr: usize) {
        let Some((&start, _)) = self.live.range(..=addr).next_back() else {
            return;
        };
        let Some(n) = self.pins.get_mut(&start) else {
            return;
        };
        *n -= 1;
        if *n == 0 {
            self.pins.remove(&start);
            if self.freed_pinned.remove(&start) {
                self.release(start);
            }
        }
    }

    fn release(&mut self, addr: usize) {
        let Some((idx, len)) = self.live.remove(&addr) else {
            return;
        };
        let a = &mut self.arenas[idx];
        let mut off = addr - a.arena.base();
        let mut flen = len;
        if let Some((&poff, &plen)) = a.free.range(..off).next_back() {
            if poff + plen == off {
                a.free.remove(&poff);
                off = poff;
                flen += plen;
            }
        }
        if let Some(&nlen) = a.free.get(&(off + flen)) {
            a.free.remove(&(off + flen));
            flen += nlen;
        }
        a.free.insert(off, flen);
        self.used -= len;
    }

    /// Size of the live buffer starting at `addr`.
    pub fn size_of(&self, addr: usize) -> Option<usize> {
        self.live.get(&addr).map(|&(_, l)| l)
    }

    /// Which arena holds `[addr, addr+len)`; `None` unless the whole range
    /// is inside one arena.
    pub fn locate(&self, addr: usize, len: usize) -> Option<Location> {
        let end = addr.checked_add(len)?;
        self.arenas.iter().find_map(|a| {
            let base = a.arena.base();
            (addr >= base && end <= base + a.arena.len()).then(|| Location {
                arena: a.arena.clone(),
                offset: (addr - base) as u64,
            })
        })
    }

    /// Bytes in live buffers.
    pub fn used(&self) -> usize {
        self.used
    }
}

/// Host side: a client's memory, checked and mapped into the host.
#[derive(Debug)]
pub struct ImportedRegion {
    map: Backing,
}

#[derive(Debug)]
enum Backing {
    /// At the range's file offset in its file's window (merges with the
    /// ranges it touches).
    Window(WindowMapping),
    /// Wherever the kernel chose.
    Own(Mapping),
}

/// Largest file given a window: bigger ones are mapped range by range.
const MAX_WINDOW: u64 = 4 << 30;
/// Address space all windows together may reserve.
const WINDOW_SPACE: u64 = 8 << 40;

/// The window of each client file the host maps ranges of, by (device,
/// inode); held weakly, so a window goes with its file's last range.
type Windows = HashMap<((u32, u32), u64), Weak<FileWindow>>;
static WINDOWS: Mutex<Option<Windows>> = Mutex::new(None);

/// The window of the file behind `fd`, made on first use; None when the
/// file is too large or the window budget is spent.
fn window_of(fd: BorrowedFd<'_>, size: u64) -> Result<Option<Arc<FileWindow>>, MemError> {
    let info = wd_sys::file::file_info(fd)?;
    let key = (info.dev, info.ino);
    let mut g = WINDOWS.lock().unwrap_or_else(|e| e.into_inner());
    let all = g.get_or_insert_with(HashMap::new);
    if let Some(w) = all.get(&key).and_then(Weak::upgrade) {
        return Ok(Some(w));
    }
    let page = wd_sys::page_size() as u64;
    let len = size.div_ceil(page) * page;
    all.retain(|_, w| w.strong_count() > 0);
    let used: u64 = all
        .values()
        .filter_map(Weak::upgrade)
        .map(|w| w.len())
        .sum();
    if len == 0 || len > MAX_WINDOW || used + len > WINDOW_SPACE {
        return Ok(None);
    }
    let w = FileWindow::reserve(len)?;
    all.insert(key, Arc::downgrade(&w));
    Ok(Some(w))
}

impl ImportedRegion {
    /// Map `len` bytes at `offset` of a client memfd, after checking that it
    /// cannot shrink under us and that the range is inside the file.
    pub fn import(fd: BorrowedFd<'_>, offset: u64, len: u64) -> Result<ImportedRegion, MemError> {
        if len == 0 || len > (1u64 << 40) {
            return Err(MemError::BadSize(len as usize));
        }
        let seals = wd_sys::get_seals(fd)?;
        if seals & wd_sys::SEAL_SHRINK == 0 {
            return Err(MemError::NotSealed);
        }
        if seals & (wd_sys::pages::SEAL_FUTURE_WRITE | wd_sys::SEAL_WRITE) != 0 {
            return Err(MemError::WriteSealed);
        }
        let size = wd_sys::file_size(fd)?;
        if offset.checked_add(len).is_none_or(|e| e > size) || offset % GRANULE as u64 != 0 {
            return Err(MemError::OutOfFile { offset, len, size });
        }
        // Huge pages are mapped on their own (they need aligned addresses),
        // and whole: a mapping of part of one would be rounded up by the
        // kernel, and the unmap of the part asked for refused (the huge
        // page stayed mapped for good).
        let page_bytes = wd_sys::file::fs_of(fd)?.1;
        if page_bytes > wd_sys::page_size() as u64 {
            if offset % page_bytes != 0 || len % page_bytes != 0 {
                return Err(MemError::PartPage {
                    offset,
                    len,
                    page_bytes,
                });
            }
        } else if let Some(w) = window_of(fd, size)? {
            // In the file's window where it fits (touching ranges merge
            // into one kernel mapping), else on its own.
            if let Ok(Some(m)) = w.map(fd, offset, len) {
                return Ok(ImportedRegion {
                    map: Backing::Window(m),
                });
            }
        }
        let map = Mapping::map_shared(fd, offset, len as usize)?;
        Ok(ImportedRegion {
            map: Backing::Own(map),
        })
    }

    /// Host address of the first byte.
    pub fn host_addr(&self) -> u64 {
        match &self.map {
            Backing::Window(m) => m.as_ptr() as u64,
            Backing::Own(m) => m.as_ptr() as u64,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        match &self.map {
            Backing::Window(m) => m.len(),
            Backing::Own(m) => m.len() as u64,
        }
    }

    /// Whether empty (never).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
#[allow(unsafe_code)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    /// A node the kernel cannot bind to (none here has node 63): its
    /// requests share arenas as any node's do. Each made an arena of its
    /// own (64 MiB by default), the limit spent after a few hundred pages.
    #[test]
    fn requests_for_a_node_that_does_not_bind_share_arenas() {
        let mut a = Allocator::new(64 << 10, 1 << 20);
        for i in 0..64 {
            if let Err(e) = a.alloc(4096, Some(63)) {
                panic!("allocation {i} of a page: {e}");
            }
        }
        assert_eq!(a.arenas.len(), 4);
    }

    /// A request near the address space's size is the limit's error (the
    /// sum of reserved bytes overflowed: a panic in a debug build).
    #[test]
    fn a_huge_request_is_over_the_limit() {
        let mut a = Allocator::new(64 << 10, 1 << 20);
        a.alloc(4096, None).unwrap();
        match a.alloc(usize::MAX - 8191, None) {
            Err(MemError::Limit {
                reserved, limit, ..
            }) => {
                assert_eq!((reserved, limit), (64 << 10, 1 << 20));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn alloc_free_merge_and_locate() {
        let mut a = Allocator::new(64 << 10, 1 << 20);
        let x = a.alloc(100, None).unwrap();
        let y = a.alloc(5000, None).unwrap();
        assert_eq!(a.size_of(x), Some(4096));
        assert_eq!(a.size_of(y), Some(8192));
        assert_eq!(y, x + 4096);
        let loc = a.locate(y, 8192).unwrap();
        assert_eq!(loc.offset, 4096);
        a.free(x).unwrap();
        a.free(y).unwrap();
        assert!(a.free(y).is_err());
        assert_eq!(a.used(), 0);
        // Everything merged back: a whole-arena allocation fits again.
        let z = a.alloc(64 << 10, None).unwrap();
        assert_eq!(z, x);
        assert!(a.locate(z + (64 << 10), 1).is_none());
    }

    #[test]
    fn a_pinned_buffer_freed_goes_back_with_its_last_pin() {
        let mut a = Allocator::new(64 << 10, 1 << 20);
        let x = a.alloc(8192, None).unwrap();
        let y = a.alloc(4096, None).unwrap();
        // A range inside one buffer pins it; one across buffers pins none.
        assert!(a.pin(x + 100, 200) && a.pin(x, 8192));
        assert!(!a.pin(x, 8192 + 4096));
        a.free(x).unwrap();
        assert!(a.free(x).is_err(), "a second free is still refused");
        assert!(!a.pin(x, 1), "a freed buffer is not pinned again");
        // Not handed out again while pinned.
        let z = a.alloc(8192, None).unwrap();
        assert_ne!(z, x);
        a.unpin(x + 100);
        assert_eq!(a.used(), 8192 + 4096 + 8192);
        a.unpin(x);
        assert_eq!(a.used(), 4096 + 8192, "gone with its last pin");
        // Unpinning what is not pinned changes nothing.
        a.unpin(y);
        a.free(y).unwrap();
        a.free(z).unwrap();
        assert_eq!(a.used(), 0);
    }

    #[test]
    fn limit_is_enforced() {
        let mut a = Allocator::new(64 << 10, 128 << 10);
        a.alloc(64 << 10, None).unwrap();
        a.alloc(64 << 10, None).unwrap();
        assert!(matches!(a.alloc(1, None), Err(MemError::Limit { .. })));
    }

    #[test]
    fn page_by_page_imports_coalesce() {
        let name = format!("wd-coalesce-{}", std::process::id());
        let vmas = || {
            std::fs::read_to_string("/proc/self/maps")
                .unwrap()
                .lines()
                .filter(|l| l.contains(&format!("/memfd:{name} ")))
                .count()
        };
        let fd = wd_sys::memfd_create(&name, false).unwrap();
        wd_sys::ftruncate(fd.as_fd(), 256 * 4096).unwrap();
        wd_sys::add_seals(fd.as_fd(), wd_sys::SEAL_SHRINK).unwrap();
        let mut regions: Vec<ImportedRegion> = (0..256)
            .map(|i| ImportedRegion::import(fd.as_fd(), i * 4096, 4096).unwrap())
            .collect();
        assert_eq!(vmas(), 1, "256 touching shares, one host mapping");
        // The same page shared twice (two queues) is mapped apart.
        let twice = ImportedRegion::import(fd.as_fd(), 0, 4096).unwrap();
        assert_ne!(twice.host_addr(), regions[0].host_addr());
        assert_eq!(vmas(), 2);
        regions.swap_remove(100);
        drop(twice);
        drop(regions);
        assert_eq!(vmas(), 0);
    }

    #[test]
    fn import_checks_seals_and_bounds() {
        let mut a = Allocator::new(64 << 10, 1 << 20);
        let x = a.alloc(4096, None).unwrap();
        let loc = a.locate(x, 4096).unwrap();
        let r = ImportedRegion::import(loc.arena.fd(), loc.offset, 4096).unwrap();
        // SAFETY: both addresses are live 4096-byte mappings of the same page.
        unsafe {
            (x as *mut u8).write_volatile(42);
            assert_eq!((r.host_addr() as *const u8).read_volatile(), 42);
        }
        assert!(matches!(
            ImportedRegion::import(loc.arena.fd(), 0, 1 << 20),
            Err(MemError::OutOfFile { .. })
        ));
        let unsealed = wd_sys::memfd_create("x", false).unwrap();
        wd_sys::ftruncate(unsealed.as_fd(), 4096).unwrap();
        assert!(matches!(
            ImportedRegion::import(unsealed.as_fd(), 0, 4096),
            Err(MemError::NotSealed)
        ));
        // Sealed against writes (a buffer shared read-only between
        // processes): named, not "mmap: operation not permitted".
        wd_sys::add_seals(
            unsealed.as_fd(),
            wd_sys::SEAL_SHRINK | wd_sys::pages::SEAL_FUTURE_WRITE,
        )
        .unwrap();
        assert!(matches!(
            ImportedRegion::import(unsealed.as_fd(), 0, 4096),
            Err(MemError::WriteSealed)
        ));
    }

    #[test]
    fn numa_arena() {
        let a = Arena::new(4096, Some(0)).unwrap();
        // Node 0 exists everywhere; binding may still be refused without NUMA.
        assert!(a.node().is_none() || a.node() == Some(0));
    }
}
