//! What the C engines read and write by address: the caller's own
//! slices, or device memory ([`DeviceSlice`]) that the zip device works
//! on in place, so a request's bytes are not copied through the host.
//!
//! Device memory may be written by its client while an engine runs:
//! compression then produces a stream of whatever bytes it read, and
//! every access stays inside the ranges given (the engines bound each
//! read and write by the buffer lengths, never by the data). A device
//! decompresses only input it has copied first, so a decoder never sees
//! its input change under it.
#![allow(unsafe_code)]

use wd_sys::devmem::DeviceSlice;

/// Memory an engine reads.
///
/// # Safety
/// `ptr()..ptr() + len()` must be readable while the value is borrowed.
pub unsafe trait Input {
    /// First byte.
    fn ptr(&self) -> *const u8;
    /// Bytes.
    fn len(&self) -> usize;
    /// Whether empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// As a slice, for engines that take only slices (LZ4): `None` for
    /// memory another process may write.
    fn as_slice(&self) -> Option<&[u8]>;
}

/// Memory an engine writes.
///
/// # Safety
/// `ptr()..ptr() + len()` must be writable while the value is borrowed.
pub unsafe trait Output {
    /// First byte.
    fn ptr(&mut self) -> *mut u8;
    /// Bytes.
    fn len(&self) -> usize;
    /// Whether empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// As a slice, as [`Input::as_slice`].
    fn as_mut_slice(&mut self) -> Option<&mut [u8]>;
}

// SAFETY: a shared slice is readable for its length while borrowed.
unsafe impl Input for [u8] {
    fn ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
    fn as_slice(&self) -> Option<&[u8]> {
        Some(self)
    }
}

// SAFETY: a mutable slice is writable for its length while borrowed.
unsafe impl Output for [u8] {
    fn ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
    fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        Some(self)
    }
}

// SAFETY: a DeviceSlice is live device memory of its length for its
// lifetime, which outlives any borrow of it (its contract).
unsafe impl Input for DeviceSlice<'_> {
    fn ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn len(&self) -> usize {
        DeviceSlice::len(self)
    }
    fn as_slice(&self) -> Option<&[u8]> {
        None
    }
}

// SAFETY: as for Input; the zip device asks for slices with write access.
unsafe impl Output for DeviceSlice<'_> {
    fn ptr(&mut self) -> *mut u8 {
        self.as_ptr()
    }
    fn len(&self) -> usize {
        DeviceSlice::len(self)
    }
    fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        None
    }
}

/// The first `cap` bytes of an output (a decompression's ratio limit).
pub(crate) struct Capped<'a, O: Output + ?Sized> {
    out: &'a mut O,
    cap: usize,
}

impl<'a, O: Output + ?Sized> Capped<'a, O> {
    pub(crate) fn new(out: &'a mut O, cap: usize) -> Capped<'a, O> {
        Capped { out, cap }
    }
}

// SAFETY: a prefix of a valid output is valid (`len` is at most the
// output's length).
unsafe impl<O: Output + ?Sized> Output for Capped<'_, O> {
    fn ptr(&mut self) -> *mut u8 {
        self.out.ptr()
    }
    fn len(&self) -> usize {
        self.cap.min(self.out.len())
    }
    fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        let cap = self.len();
        self.out.as_mut_slice().map(|s| &mut s[..cap])
    }
}

// SAFETY: as for [u8]: the vector's initialised bytes.
unsafe impl Input for Vec<u8> {
    fn ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn len(&self) -> usize {
        Vec::len(self)
    }
    fn as_slice(&self) -> Option<&[u8]> {
        Some(self)
    }
}

// SAFETY: as for [u8].
unsafe impl Output for Vec<u8> {
    fn ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn len(&self) -> usize {
        Vec::len(self)
    }
    fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        Some(self)
    }
}

/// The spare capacity of a vector, as output: an engine writes there and
/// [`Spare::commit`] makes the bytes it reports written part of the
/// vector, so output buffers are not zeroed first.
pub(crate) struct Spare<'a> {
    vec: &'a mut Vec<u8>,
    room: usize,
}

impl<'a> Spare<'a> {
    /// Room for `room` bytes after the vector's contents.
    pub(crate) fn new(vec: &'a mut Vec<u8>, room: usize) -> Spare<'a> {
        vec.reserve(room);
        Spare { vec, room }
    }

    /// The engine wrote `n` bytes (at most the room; an engine's own count
    /// of what it wrote).
    pub(crate) fn commit(self, n: usize) {
        let n = n.min(self.room);
        // SAFETY: the engine initialised the first n bytes of the spare
        // capacity (its contract: it reports exactly what it wrote), and
        // reserve made room for them.
        unsafe { self.vec.set_len(self.vec.len() + n) };
    }
}

// SAFETY: `reserve` made `room` bytes of capacity after the contents,
// writable while the vector is borrowed.
unsafe impl Output for Spare<'_> {
    fn ptr(&mut self) -> *mut u8 {
        self.vec.spare_capacity_mut().as_mut_ptr().cast()
    }
    fn len(&self) -> usize {
        self.room
    }
    fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        None
    }
}

/// A copy of `input`'s bytes, for engines that take only slices. Device
/// memory its client may write is copied as bytes the way the engines
/// read it (no reference into it is made).
pub(crate) fn copy_in(input: &(impl Input + ?Sized)) -> Vec<u8> {
    if let Some(s) = input.as_slice() {
        return s.to_vec();
    }
    let mut v = vec![0u8; input.len()];
    // SAFETY: the Input contract makes ptr()..ptr() + len() readable while
    // borrowed; `v` is a distinct allocation of that length.
    unsafe { std::ptr::copy_nonoverlapping(input.ptr(), v.as_mut_ptr(), v.len()) };
    v
}

/// Write `data` at the start of `out`, which must have room for it.
pub(crate) fn copy_out(out: &mut (impl Output + ?Sized), data: &[u8]) {
    assert!(data.len() <= out.len(), "output larger than its room");
    // SAFETY: the Output contract makes ptr()..ptr() + len() writable while
    // borrowed, and data fits (checked above); `data` is host memory of
    // its own, not the output.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), out.ptr(), data.len()) };
}
