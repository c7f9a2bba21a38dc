//! libdeflate, the fastest one-shot deflate here (see `wd bench zip`),
//! through its C API: the one module of this crate that calls C.
#![allow(unsafe_code)]

use std::ptr::NonNull;

use libdeflate_sys as sys;
use wd_zip_msg::Algorithm;

use crate::mem::{Input, Output};

/// A compressor for one level (libdeflate's state is per level).
pub(crate) struct Compressor {
    c: NonNull<sys::libdeflate_compressor>,
    level: i32,
}

// SAFETY: a libdeflate compressor is plain heap state with no thread
// affinity; `&mut self` on every use keeps it to one thread at a time.
unsafe impl Send for Compressor {}

impl Compressor {
    /// `None` when libdeflate refuses the level or memory ran out.
    pub(crate) fn new(level: i32) -> Option<Compressor> {
        // SAFETY: plain allocation call; the result is checked for NULL.
        let c = unsafe { sys::libdeflate_alloc_compressor(level) };
        NonNull::new(c).map(|c| Compressor { c, level })
    }

    pub(crate) fn level(&self) -> i32 {
        self.level
    }

    /// Compress `input` into `out` in `alg`'s framing; `None` when it
    /// does not fit.
    pub(crate) fn compress(
        &mut self,
        alg: Algorithm,
        input: &(impl Input + ?Sized),
        out: &mut (impl Output + ?Sized),
    ) -> Option<usize> {
        let f = match alg {
            Algorithm::Deflate => sys::libdeflate_deflate_compress,
            Algorithm::Zlib => sys::libdeflate_zlib_compress,
            Algorithm::Gzip => sys::libdeflate_gzip_compress,
            _ => return None,
        };
        let room = out.len();
        // SAFETY: the Input/Output contracts make both ranges valid for
        // the call; libdeflate reads `input` and writes at most `room`.
        let n = unsafe {
            f(
                self.c.as_ptr(),
                input.ptr().cast(),
                input.len(),
                out.ptr().cast(),
                room,
            )
        };
        (n != 0).then_some(n)
    }
}

/// The most output `len` input bytes can need in `alg`'s deflate
/// framing, at any level.
pub(crate) fn bound(alg: Algorithm, len: usize) -> usize {
    // SAFETY: a pure size computation; libdeflate documents a NULL
    // compressor as "the bound for any level".
    unsafe {
        match alg {
            Algorithm::Zlib => sys::libdeflate_zlib_compress_bound(std::ptr::null_mut(), len),
            Algorithm::Gzip => sys::libdeflate_gzip_compress_bound(std::ptr::null_mut(), len),
            _ => sys::libdeflate_deflate_compress_bound(std::ptr::null_mut(), len),
        }
    }
}

impl Drop for Compressor {
    fn drop(&mut self) {
        // SAFETY: allocated by libdeflate_alloc_compressor, freed once.
        unsafe { sys::libdeflate_free_compressor(self.c.as_ptr()) }
    }
}

/// Why a decompression stopped.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Inflate {
    /// Corrupt or truncated.
    Bad,
    /// The output did not fit.
    Space,
}

/// A decompressor (stateless between calls).
pub(crate) struct Decompressor(NonNull<sys::libdeflate_decompressor>);

// SAFETY: as for Compressor.
unsafe impl Send for Decompressor {}

impl Decompressor {
    pub(crate) fn new() -> Option<Decompressor> {
        // SAFETY: plain allocation call; the result is checked for NULL.
        NonNull::new(unsafe { sys::libdeflate_alloc_decompressor() }).map(Decompressor)
    }

    /// Decompress one stream of `alg` at the start of `input`:
    /// (input consumed, output written).
    pub(crate) fn decompress(
        &mut self,
        alg: Algorithm,
        input: &[u8],
        out: &mut (impl Output + ?Sized),
    ) -> Result<(usize, usize), Inflate> {
        let f = match alg {
            Algorithm::Deflate => sys::libdeflate_deflate_decompress_ex,
            Algorithm::Zlib => sys::libdeflate_zlib_decompress_ex,
            Algorithm::Gzip => sys::libdeflate_gzip_decompress_ex,
            _ => return Err(Inflate::Bad),
        };
        let (mut used, mut made) = (0usize, 0usize);
        let room = out.len();
        // SAFETY: `input` is a slice and `out` valid for `room` bytes (its
        // contract); libdeflate reads at most `input.len()` bytes and
        // writes at most `room`; the two counts are written through
        // valid pointers.
        let r = unsafe {
            f(
                self.0.as_ptr(),
                input.as_ptr().cast(),
                input.len(),
                out.ptr().cast(),
                room,
                &mut used,
                &mut made,
            )
        };
        match r {
            sys::libdeflate_result_LIBDEFLATE_SUCCESS => Ok((used, made)),
            sys::libdeflate_result_LIBDEFLATE_INSUFFICIENT_SPACE => Err(Inflate::Space),
            _ => Err(Inflate::Bad),
        }
    }
}

impl Drop for Decompressor {
    fn drop(&mut self) {
        // SAFETY: allocated by libdeflate_alloc_decompressor, freed once.
        unsafe { sys::libdeflate_free_decompressor(self.0.as_ptr()) }
    }
}

/// Adler-32 (zlib's trailer) `adler` carried on over `data`.
pub(crate) fn adler32(adler: u32, data: &[u8]) -> u32 {
    // SAFETY: reads `data.len()` bytes of a live slice.
    unsafe { sys::libdeflate_adler32(adler, data.as_ptr().cast(), data.len()) }
}

/// CRC-32 (gzip's trailer) `crc` carried on over `data`.
pub(crate) fn crc32(crc: u32, data: &[u8]) -> u32 {
    // SAFETY: reads `data.len()` bytes of a live slice.
    unsafe { sys::libdeflate_crc32(crc, data.as_ptr().cast(), data.len()) }
}
