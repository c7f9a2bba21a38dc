//! Device memory as bounded slices: the one place where an address the
//! framework computed as an integer (an IOMMU translation's result, a host
//! mapping's base plus an offset) becomes a pointer.
//!
//! Memory a device reaches is shared with a client that may write it at
//! any moment, so no Rust reference into it may exist (that would promise
//! the compiler nothing else changes it). A [`DeviceSlice`] is a pointer
//! and a length, bounded by the lifetime of what keeps the memory mapped
//! (an engine's translation section), with copy, fill and compare helpers
//! that touch it only through `ptr::copy` and volatile accesses, the way
//! rust-vmm's `VolatileSlice` does.

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;

/// `len` bytes of device memory, valid for `'a`.
#[derive(Clone, Copy, Debug)]
pub struct DeviceSlice<'a> {
    ptr: NonNull<u8>,
    len: usize,
    _mem: PhantomData<&'a std::cell::UnsafeCell<[u8]>>,
}

impl<'a> DeviceSlice<'a> {
    /// Device memory at host address `addr`.
    ///
    /// # Safety
    /// `addr..addr + len` must be mapped, readable and (if the slice is
    /// written) writable host memory, and stay mapped for `'a`.
    pub unsafe fn from_host_addr(addr: u64, len: usize) -> DeviceSlice<'a> {
        DeviceSlice {
            ptr: NonNull::new(addr as usize as *mut u8).unwrap_or(NonNull::dangling()),
            len,
            _mem: PhantomData,
        }
    }

    /// Device memory at `ptr`.
    ///
    /// # Safety
    /// As [`DeviceSlice::from_host_addr`].
    pub unsafe fn from_raw(ptr: *mut u8, len: usize) -> DeviceSlice<'a> {
        DeviceSlice {
            ptr: NonNull::new(ptr).unwrap_or(NonNull::dangling()),
            len,
            _mem: PhantomData,
        }
    }

    /// Local memory seen as device memory (bounce buffers, tests).
    pub fn from_mut(buf: &'a mut [u8]) -> DeviceSlice<'a> {
        DeviceSlice {
            ptr: NonNull::new(buf.as_mut_ptr()).unwrap_or(NonNull::dangling()),
            len: buf.len(),
            _mem: PhantomData,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// First byte, for a foreign function that takes a buffer (libcrypto):
    /// using it is the caller's `unsafe`, within `len()` bytes and `'a`.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// `len` bytes at `off`.
    ///
    /// # Panics
    /// When the range leaves the slice.
    pub fn subslice(&self, off: usize, len: usize) -> DeviceSlice<'a> {
        let end = off.checked_add(len).expect("subslice overflows");
        assert!(end <= self.len, "subslice {off}+{len} outside {}", self.len);
        DeviceSlice {
            // SAFETY: off <= len, inside the slice.
            ptr: unsafe { NonNull::new_unchecked(self.ptr.as_ptr().add(off)) },
            len,
            _mem: PhantomData,
        }
    }

    /// Copy `out.len()` bytes at `off` out.
    pub fn read_into(&self, off: usize, out: &mut [u8]) {
        let s = self.subslice(off, out.len());
        // SAFETY: s is live device memory of out.len() bytes; out is local;
        // ptr::copy reads the shared bytes without forming a reference.
        unsafe { std::ptr::copy(s.as_ptr(), out.as_mut_ptr(), out.len()) };
    }

    /// Copy `len` bytes at `off` out into a new vector (not zeroed first:
    /// every byte is written by the copy).
    pub fn read_to_vec(&self, off: usize, len: usize) -> Vec<u8> {
        let s = self.subslice(off, len);
        let mut v = Vec::with_capacity(len);
        // SAFETY: s is live device memory of len bytes and v has room for
        // len bytes; after the copy all len bytes are initialised.
        unsafe {
            std::ptr::copy(s.as_ptr(), v.as_mut_ptr(), len);
            v.set_len(len);
        }
        v
    }

    /// Copy `data` in at `off`.
    pub fn write_from(&self, off: usize, data: &[u8]) {
        let d = self.subslice(off, data.len());
        // SAFETY: d is live, writable device memory of data.len() bytes.
        unsafe { std::ptr::copy(data.as_ptr(), d.as_ptr(), data.len()) };
    }

    /// Copy this slice's bytes to `dst` (of at least this length); the two
    /// may overlap (a client may ask for that), as with `memmove`.
    pub fn copy_to(&self, dst: &DeviceSlice<'_>) {
        let d = dst.subslice(0, self.len);
        // SAFETY: both are live device memory of self.len bytes; ptr::copy
        // tolerates overlap.
        unsafe { std::ptr::copy(self.as_ptr(), d.as_ptr(), self.len) };
    }

    /// Set every byte to `b`.
    pub fn fill(&self, b: u8) {
        // SAFETY: live, writable device memory of len bytes.
        unsafe { std::ptr::write_bytes(self.as_ptr(), b, self.len) };
    }

    /// Whether the bytes equal `data` (a snapshot: the client may change
    /// them right after).
    pub fn equals(&self, data: &[u8]) -> bool {
        self.len == data.len()
            && (0..self.len).all(|i| {
                // SAFETY: i < len, inside live device memory; volatile
                // because another process may write it.
                unsafe { self.as_ptr().add(i).read_volatile() == data[i] }
            })
    }
}

impl DeviceSlice<'_> {
    /// The 32-bit word at `off` (4-aligned), read atomically with Acquire:
    /// a flag or index a peer publishes with a Release store after the
    /// bytes it guards.
    ///
    /// # Panics
    /// When the word leaves the slice or is not aligned.
    pub fn load_u32(&self, off: usize) -> u32 {
        let w = self.word32(off);
        // SAFETY: w is an aligned word of live device memory; atomics may
        // be shared with another process.
        unsafe { std::sync::atomic::AtomicU32::from_ptr(w) }.load(Ordering::Acquire)
    }

    /// Store the 32-bit word at `off` (4-aligned) atomically with Release:
    /// the bytes written before it are visible to a peer that sees it
    /// (a completion entry's phase word, say).
    ///
    /// # Panics
    /// When the word leaves the slice or is not aligned.
    pub fn store_u32(&self, off: usize, v: u32) {
        let w = self.word32(off);
        // SAFETY: as in load_u32.
        unsafe { std::sync::atomic::AtomicU32::from_ptr(w) }.store(v, Ordering::Release);
    }

    fn word32(&self, off: usize) -> *mut u32 {
        let s = self.subslice(off, 4);
        assert!(s.as_ptr() as usize % 4 == 0, "word at {off} is not aligned");
        s.as_ptr().cast()
    }
}

/// A device's register block: memory the host created, shared with one
/// client, that both sides read and write as 32- and 64-bit registers
/// (an NVMe controller's properties and doorbells, say). It owns a share
/// of the mapping, so it stays valid as long as either side keeps it.
/// Every access is atomic (the peer may write any word at any time);
/// offsets are checked, so a wrong one panics instead of reaching past the
/// block.
#[derive(Clone, Debug)]
pub struct Registers {
    map: std::sync::Arc<crate::Mapping>,
    off: usize,
    len: usize,
}

impl Registers {
    /// The `len` bytes at `off` of `map` (8-aligned, inside the mapping).
    pub fn new(map: std::sync::Arc<crate::Mapping>, off: usize, len: usize) -> Option<Registers> {
        let end = off.checked_add(len)?;
        (end <= map.len() && off % 8 == 0 && len > 0).then_some(Registers { map, off, len })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether empty (never, by construction).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn at(&self, off: usize, size: usize) -> *mut u8 {
        let end = off.checked_add(size).expect("register offset overflows");
        assert!(
            end <= self.len && off % size == 0,
            "register {off:#x} (size {size}) outside a {:#x}-byte block or unaligned",
            self.len
        );
        // SAFETY: off + size <= len, and off.. is inside the mapping (new).
        unsafe { self.map.as_ptr().add(self.off + off) }
    }

    /// Read the 32-bit register at `off` (Acquire: what the peer wrote
    /// before storing it is visible).
    pub fn load32(&self, off: usize) -> u32 {
        // SAFETY: an aligned word inside the live mapping this block owns;
        // atomics may be shared with another process.
        unsafe { std::sync::atomic::AtomicU32::from_ptr(self.at(off, 4).cast()) }
            .load(Ordering::Acquire)
    }

    /// Write the 32-bit register at `off` (Release).
    pub fn store32(&self, off: usize, v: u32) {
        // SAFETY: as in load32.
        unsafe { std::sync::atomic::AtomicU32::from_ptr(self.at(off, 4).cast()) }
            .store(v, Ordering::Release)
    }

    /// Read the 64-bit register at `off` (Acquire).
    pub fn load64(&self, off: usize) -> u64 {
        // SAFETY: as in load32, for an aligned 64-bit word.
        unsafe { std::sync::atomic::AtomicU64::from_ptr(self.at(off, 8).cast()) }
            .load(Ordering::Acquire)
    }

    /// Write the 64-bit register at `off` (Release).
    pub fn store64(&self, off: usize, v: u64) {
        // SAFETY: as in load64.
        unsafe { std::sync::atomic::AtomicU64::from_ptr(self.at(off, 8).cast()) }
            .store(v, Ordering::Release)
    }
}

/// Device memory a device keeps past the call that translated it, for a
/// request it completes later (an asynchronous device handing the buffer
/// to the kernel, say). The engine keeps the translation pinned until the
/// device reports the request complete; after that the device must not use
/// it. It has no lifetime, so using it is the device's `unsafe`: only the
/// pointer and length are offered.
#[derive(Debug)]
pub struct HeldSlice {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a pointer and a length; the memory's validity is the engine's
// pin, not a thread's.
unsafe impl Send for HeldSlice {}

impl HeldSlice {
    /// Held device memory.
    ///
    /// # Safety
    /// As [`DeviceSlice::from_host_addr`], for as long as the request that
    /// holds it is in flight.
    pub unsafe fn from_host_addr(addr: u64, len: usize) -> HeldSlice {
        HeldSlice {
            ptr: NonNull::new(addr as usize as *mut u8).unwrap_or(NonNull::dangling()),
            len,
        }
    }

    /// First byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The memory as a slice for the duration of a borrow.
    ///
    /// # Safety
    /// The request holding it must still be in flight (not reported
    /// complete).
    pub unsafe fn slice(&self) -> DeviceSlice<'_> {
        // SAFETY: the caller's contract keeps the memory mapped.
        unsafe { DeviceSlice::from_raw(self.ptr.as_ptr(), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_fill_and_bounds() {
        let mut a = [1u8, 2, 3, 4, 5, 6, 7, 8];
        let s = DeviceSlice::from_mut(&mut a);
        let mut out = [0u8; 3];
        s.read_into(2, &mut out);
        assert_eq!(out, [3, 4, 5]);
        s.write_from(0, &[9, 9]);
        assert!(s.subslice(0, 3).equals(&[9, 9, 3]));
        // Overlapping copy moves like memmove.
        s.subslice(0, 4).copy_to(&s.subslice(2, 6));
        assert!(s.equals(&[9, 9, 9, 9, 3, 4, 7, 8]));
        s.subslice(6, 2).fill(0);
        assert!(s.subslice(4, 4).equals(&[3, 4, 0, 0]));
        let p = std::panic::AssertUnwindSafe(s);
        assert!(std::panic::catch_unwind(|| p.subslice(7, 2)).is_err());
        assert!(std::panic::catch_unwind(|| p.subslice(usize::MAX, 2)).is_err());
    }
}
