//! The process-wide allocator of shareable memory, and an owned buffer type.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::os::fd::{BorrowedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use wd_sys::devmem::DeviceSlice;

use wd_mem::{Allocator, Location};
use wd_proto::Status;

use crate::{ClientError, Result};

/// The allocator and the fork generation it belongs to.
static ALLOCATOR: Mutex<Option<(u64, Allocator)>> = Mutex::new(None);

type AllocatorGuard = MutexGuard<'static, Option<(u64, Allocator)>>;

thread_local! {
    /// The allocator's lock, held by the forking thread across a fork.
    static HELD_FOR_FORK: RefCell<Option<AllocatorGuard>> = const { RefCell::new(None) };
}

/// Before a fork (the fork hook, in the forking thread): take the
/// allocator's lock, so that no other thread holds it when the child is
/// made (there it would stay held for ever, by a thread the child does
/// not have).
pub(crate) extern "C" fn before_fork() {
    let _ = HELD_FOR_FORK.try_with(|h| {
        let mut h = h.borrow_mut();
        // (Once: a hook registered twice runs twice.)
        if h.is_none() {
            *h = Some(ALLOCATOR.lock().unwrap_or_else(|e| e.into_inner()));
        }
    });
}

/// After a fork, in the parent and in the child (the same thread): let go
/// of the lock `before_fork` took.
pub(crate) extern "C" fn after_fork() {
    let _ = HELD_FOR_FORK.try_with(|h| h.borrow_mut().take());
}

fn with<T>(f: impl FnOnce(&mut Allocator) -> T) -> T {
    // First, outside the lock: the first call registers the fork hooks,
    // and a fork before they are there must not find the lock held.
    let generation = crate::fork_generation();
    let mut g = ALLOCATOR.lock().unwrap_or_else(|e| e.into_inner());
    if g.as_ref().is_some_and(|(gen, _)| *gen != generation) {
        // A forked child: the arenas are shared mappings it has in common
        // with the parent, so carving more out of them would hand both
        // processes the same pages. Start afresh; the inherited mappings
        // stay mapped (the child may still use what it had).
        if let Some((_, old)) = g.take() {
            std::mem::forget(old);
        }
    }
    let (_, a) = g.get_or_insert_with(|| (generation, Allocator::default()));
    f(a)
}

fn mem_err(e: wd_mem::MemError) -> ClientError {
    ClientError::new(Status::from_errno(e.errno()), e.to_string())
}

/// Allocate `size` bytes of shareable memory (whole pages; zeroed when
/// new, but memory freed earlier in the process comes back as it was
/// left), optionally on a NUMA node; returns its address.
pub fn alloc(size: usize, node: Option<u32>) -> Result<u64> {
    with(|a| {
        let p = a.alloc(size, node)?;
        if let Some(l) = a.locate(p, size) {
            // Under the allocator's lock: whoever is handed this address
            // later learned it after the lock was released, so sees these.
            let base = l.arena.base() as u64;
            ARENAS_LO.fetch_min(base, Ordering::Relaxed);
            ARENAS_HI.fetch_max(base + l.arena.len() as u64, Ordering::Relaxed);
        }
        Ok(p)
    })
    .map(|p| p as u64)
    .map_err(mem_err)
}

/// The lowest arena base and the highest arena end this copy's allocator
/// ever had: a first test without the allocator's lock, so that asking
/// about memory that is not the allocator's (most buffers a library is
/// handed) takes no lock shared with other threads.
static ARENAS_LO: AtomicU64 = AtomicU64::new(u64::MAX);
static ARENAS_HI: AtomicU64 = AtomicU64::new(0);

/// This copy's allocator's arena holding the range, if any.
fn own_location(addr: u64, len: u64) -> Option<Location> {
    let end = addr.checked_add(len)?;
    if addr < ARENAS_LO.load(Ordering::Relaxed) || end > ARENAS_HI.load(Ordering::Relaxed) {
        return None;
    }
    with(|a| a.locate(addr as usize, len as usize))
}

/// Free memory from [`alloc`]. Memory a queue shares (a range inside
/// one allocation) goes back to the allocator once unshared: the device
/// may still write it.
pub fn free(addr: u64) -> Result<()> {
    with(|a| a.free(addr as usize)).map_err(mem_err)
}

/// A queue shares `[addr, addr+len)`: pin the allocation holding it (see
/// [`wd_mem::Allocator::pin`]); whether one was pinned.
pub(crate) fn pin(addr: u64, len: u64) -> bool {
    with(|a| a.pin(addr as usize, len as usize))
}

/// A share made by [`pin`] is gone.
pub(crate) fn unpin(addr: u64) {
    with(|a| a.unpin(addr as usize));
}

/// An arena of the allocator of another copy of this library in the
/// process: each C library (`libwd.so`, `libwd_crypto.so`) links its own,
/// and a buffer from `wd_alloc` must still be reachable in place by the
/// crypto library's queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForeignArena {
    /// Base address.
    pub base: u64,
    /// Size in bytes.
    pub size: u64,
    /// Its memfd, which that library never closes (arenas live as long as
    /// the process).
    pub fd: RawFd,
}

/// How to ask the other copy which of its arenas holds a range.
pub type ForeignLookup = fn(addr: u64, len: u64) -> Option<ForeignArena>;

static FOREIGN: OnceLock<ForeignLookup> = OnceLock::new();

/// Consult `lookup` for ranges this copy's allocator does not hold (set
/// once; later calls are ignored).
///
/// # Safety
/// `lookup` must only name arenas that stay mapped (readable and
/// writable), with their descriptors open, for the life of the process:
/// spans inside them are read and written, and their descriptors
/// borrowed, without further checks.
pub unsafe fn set_foreign_arenas(lookup: ForeignLookup) {
    let _ = FOREIGN.set(lookup);
}

/// The arena of this copy's allocator holding `[addr, addr+len)`, for
/// the C export (`wd__arena_of`) of the library that owns `wd_alloc`.
pub fn own_arena_of(addr: u64, len: u64) -> Option<ForeignArena> {
    use std::os::fd::AsRawFd;
    let loc = own_location(addr, len)?;
    Some(ForeignArena {
        base: loc.arena.base() as u64,
        size: loc.arena.len() as u64,
        fd: loc.arena.fd().as_raw_fd(),
    })
}

/// Where a range of shareable memory lives.
pub(crate) enum Found {
    /// In this copy's allocator.
    Own(Location),
    /// In another copy's (see [`set_foreign_arenas`]).
    Foreign(ForeignArena),
}

impl Found {
    /// Base address and size of the arena.
    pub(crate) fn arena(&self) -> (u64, u64) {
        match self {
            Found::Own(l) => (l.arena.base() as u64, l.arena.len() as u64),
            Found::Foreign(f) => (f.base, f.size),
        }
    }

    /// The arena's memfd.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Found::Own(l) => l.arena.fd(),
            // SAFETY: the other copy never closes an arena's descriptor
            // (`set_foreign_arenas`' contract), so it is open for as long
            // as this borrow.
            Found::Foreign(f) => unsafe { BorrowedFd::borrow_raw(f.fd) },
        }
    }

    /// Offset of `addr` inside the arena's file.
    pub(crate) fn offset_of(&self, addr: u64) -> u64 {
        addr - self.arena().0
    }
}

/// Which arena holds a range (for `share`): this copy's allocator first.
pub(crate) fn locate(addr: u64, len: u64) -> Option<Found> {
    if let Some(l) = own_location(addr, len) {
        return Some(Found::Own(l));
    }
    let f = FOREIGN.get()?(addr, len)?;
    let end = addr.checked_add(len)?;
    (addr >= f.base && end <= f.base.checked_add(f.size)?).then_some(Found::Foreign(f))
}

/// An owned buffer of shareable memory, freed on drop.
///
/// The device may write it while requests are in flight, so the buffer
/// hands out no slices; copy in and out instead.
#[derive(Debug)]
pub struct SharedBuf {
    addr: u64,
    len: u64,
}

impl SharedBuf {
    /// Allocate `len` bytes.
    pub fn new(len: usize) -> Result<SharedBuf> {
        Ok(SharedBuf {
            addr: alloc(len, None)?,
            len: len as u64,
        })
    }

    /// Allocate on a NUMA node.
    pub fn on_node(len: usize, node: u32) -> Result<SharedBuf> {
        Ok(SharedBuf {
            addr: alloc(len, Some(node))?,
            len: len as u64,
        })
    }

    /// Address (the IOVA a request names).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length asked for.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The buffer as device memory (it is shared: the device may write it).
    fn mem(&self) -> DeviceSlice<'_> {
        // SAFETY: addr..addr+len is this live allocation, which stays mapped
        // while `self` is borrowed.
        unsafe { DeviceSlice::from_host_addr(self.addr, self.len as usize) }
    }

    /// Copy `data` in at `offset`.
    pub fn write(&self, offset: u64, data: &[u8]) {
        assert!(
            offset + data.len() as u64 <= self.len,
            "write beyond buffer"
        );
        self.mem().write_from(offset as usize, data);
    }

    /// Copy out `out.len()` bytes at `offset`.
    pub fn read(&self, offset: u64, out: &mut [u8]) {
        assert!(offset + out.len() as u64 <= self.len, "read beyond buffer");
        self.mem().read_into(offset as usize, out);
    }

    /// Copy out `len` bytes at `offset` into a new vector.
    pub fn read_vec(&self, offset: u64, len: usize) -> Vec<u8> {
        assert!(offset + len as u64 <= self.len, "read beyond buffer");
        self.mem().read_to_vec(offset as usize, len)
    }

    /// The 32-bit word at `offset` (4-aligned), loaded atomically with
    /// Acquire: a word the device publishes after the bytes it guards (a
    /// completion's phase tag).
    pub fn load_u32(&self, offset: u64) -> u32 {
        assert!(offset + 4 <= self.len, "load beyond buffer");
        self.mem().load_u32(offset as usize)
    }

    /// Store the 32-bit word at `offset` (4-aligned) atomically with
    /// Release: the bytes written before it are visible to a device that
    /// sees it (a shadow doorbell).
    pub fn store_u32(&self, offset: u64, v: u32) {
        assert!(offset + 4 <= self.len, "store beyond buffer");
        self.mem().store_u32(offset as usize, v);
    }

    /// The whole contents.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len as usize];
        self.read(0, &mut v);
        v
    }
}

/// A range of memory from the WrapDrive allocator ([`alloc`],
/// [`SharedBuf`]) that the caller names by address: what a library needs to
/// let the device read and write a caller's buffer where it is, instead of
/// copying it through a staging area.
///
/// The allocator never unmaps an arena, so the range stays mapped for the
/// life of the process whatever the caller frees: reading and writing it
/// through the span is always memory-safe, though the bytes are whatever
/// the buffer's owner and the device left there. Like [`SharedBuf`], a span
/// hands out no slices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedSpan {
    addr: u64,
    len: u64,
    /// The arena holding it (base address and size): what is shared with a
    /// queue so the device can reach every span inside.
    arena: (u64, u64),
}

impl SharedSpan {
    /// The span `[addr, addr+len)` if it lies inside one arena of this
    /// process's allocator (`None` for any other memory, or an empty range).
    pub fn locate(addr: u64, len: u64) -> Option<SharedSpan> {
        if len == 0 {
            return None;
        }
        let arena = locate(addr, len)?.arena();
        Some(SharedSpan { addr, len, arena })
    }

    /// The whole of a buffer.
    pub fn of(buf: &SharedBuf) -> SharedSpan {
        SharedSpan::locate(buf.addr, buf.len).expect("a SharedBuf is allocator memory")
    }

    /// Address (the IOVA a request names once the arena is shared).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether empty (never: spans are not empty).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Base address and size of the arena holding the span.
    pub fn arena(&self) -> (u64, u64) {
        self.arena
    }

    /// The `len` bytes at `offset` (panics beyond the span, or if empty).
    pub fn sub(&self, offset: u64, len: u64) -> SharedSpan {
        assert!(
            len > 0 && offset.checked_add(len).is_some_and(|e| e <= self.len),
            "span beyond its range"
        );
        SharedSpan {
            addr: self.addr + offset,
            len,
            arena: self.arena,
        }
    }

    /// Whether the two spans have a byte in common.
    pub fn overlaps(&self, other: &SharedSpan) -> bool {
        self.addr < other.addr + other.len && other.addr < self.addr + self.len
    }

    fn mem(&self) -> DeviceSlice<'_> {
        // SAFETY: the range lies inside an arena (checked when the span was
        // made), and arenas stay mapped for the life of the process.
        unsafe { DeviceSlice::from_host_addr(self.addr, self.len as usize) }
    }

    /// Copy out `out.len()` bytes at `offset`.
    pub fn read(&self, offset: u64, out: &mut [u8]) {
        assert!(offset + out.len() as u64 <= self.len, "read beyond span");
        self.mem().read_into(offset as usize, out);
    }

    /// Copy `data` in at `offset`.
    pub fn write(&self, offset: u64, data: &[u8]) {
        assert!(offset + data.len() as u64 <= self.len, "write beyond span");
        self.mem().write_from(offset as usize, data);
    }
}

impl Drop for SharedBuf {
    fn drop(&mut self) {
        let _ = free(self.addr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_name_allocator_memory_only() {
        let b = SharedBuf::new(3 * 4096).unwrap();
        let s = SharedSpan::of(&b);
        assert_eq!((s.addr(), s.len()), (b.addr(), b.len()));
        let (base, size) = s.arena();
        assert!(base <= s.addr() && s.addr() + s.len() <= base + size);
        // Inside, to the arena's end; not across it, not empty.
        assert!(SharedSpan::locate(b.addr() + 5, 100).is_some());
        assert!(SharedSpan::locate(base + size - 1, 1).is_some());
        assert!(SharedSpan::locate(base + size - 1, 2).is_none());
        assert!(SharedSpan::locate(b.addr(), 0).is_none());
        assert!(SharedSpan::locate(u64::MAX - 1, 10).is_none());
        // Ordinary memory is not a span.
        let v = vec![0u8; 4096];
        assert!(SharedSpan::locate(v.as_ptr() as u64, 4096).is_none());
        // Pieces, overlaps, copies through the span.
        let (a, c) = (s.sub(0, 4096), s.sub(4096, 4096));
        assert!(!a.overlaps(&c) && a.overlaps(&s.sub(4095, 2)) && s.overlaps(&c));
        c.write(10, b"span");
        let mut got = [0u8; 4];
        b.read(4096 + 10, &mut got);
        assert_eq!(&got, b"span");
        s.read(4096 + 10, &mut got);
        assert_eq!(&got, b"span");
    }

    #[test]
    #[should_panic(expected = "span beyond its range")]
    fn a_piece_beyond_the_span_panics() {
        let b = SharedBuf::new(4096).unwrap();
        let _ = SharedSpan::of(&b).sub(4000, 200);
    }

    #[test]
    fn own_arenas_are_found_for_other_copies() {
        let b = SharedBuf::new(4096).unwrap();
        let f = own_arena_of(b.addr(), 4096).expect("an arena of this allocator");
        assert_eq!((f.base, f.size), SharedSpan::of(&b).arena());
        assert!(f.fd >= 0);
        let v = [0u8; 64];
        assert!(own_arena_of(v.as_ptr() as u64, 64).is_none());
    }
}
