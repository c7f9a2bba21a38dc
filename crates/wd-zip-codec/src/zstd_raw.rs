//! libzstd's one-shot calls on [`Input`]/[`Output`] memory (zstd-safe
//! takes only slices): the zip device compresses in place.
#![allow(unsafe_code)]

use std::ptr::NonNull;

use zstd_safe::zstd_sys as sys;

use crate::mem::{Input, Output};
use crate::CodecError;

fn check(code: usize) -> Result<usize, CodecError> {
    // SAFETY: a pure function of the code.
    if unsafe { sys::ZSTD_isError(code) } == 0 {
        Ok(code)
    } else {
        Err(crate::zstd_error(code))
    }
}

/// A compression context (its tables stay warm between requests).
pub(crate) struct Cctx(NonNull<sys::ZSTD_CCtx>);
// SAFETY: a zstd context has no thread affinity; `&mut self` keeps it to
// one thread at a time.
unsafe impl Send for Cctx {}

impl Cctx {
    pub(crate) fn new() -> Option<Cctx> {
        // SAFETY: plain allocation; NULL checked.
        NonNull::new(unsafe { sys::ZSTD_createCCtx() }).map(Cctx)
    }

    pub(crate) fn compress(
        &mut self,
        level: i32,
        input: &(impl Input + ?Sized),
        out: &mut (impl Output + ?Sized),
    ) -> Result<usize, CodecError> {
        let room = out.len();
        // SAFETY: the Input/Output contracts make both ranges valid for
        // the call; zstd reads at most input.len() and writes at most room.
        check(unsafe {
            sys::ZSTD_compressCCtx(
                self.0.as_ptr(),
                out.ptr().cast(),
                room,
                input.ptr().cast(),
                input.len(),
                level,
            )
        })
    }
}

impl Drop for Cctx {
    fn drop(&mut self) {
        // SAFETY: made by ZSTD_createCCtx, freed once.
        unsafe { sys::ZSTD_freeCCtx(self.0.as_ptr()) };
    }
}

/// A decompression context.
pub(crate) struct Dctx(NonNull<sys::ZSTD_DCtx>);
// SAFETY: as for Cctx.
unsafe impl Send for Dctx {}

impl Dctx {
    pub(crate) fn new() -> Option<Dctx> {
        // SAFETY: plain allocation; NULL checked.
        NonNull::new(unsafe { sys::ZSTD_createDCtx() }).map(Dctx)
    }

    /// Every frame of `input` into `out`: the bytes written.
    pub(crate) fn decompress(
        &mut self,
        input: &[u8],
        out: &mut (impl Output + ?Sized),
    ) -> Result<usize, CodecError> {
        let room = out.len();
        // SAFETY: as in Cctx::compress.
        check(unsafe {
            sys::ZSTD_decompressDCtx(
                self.0.as_ptr(),
                out.ptr().cast(),
                room,
                input.as_ptr().cast(),
                input.len(),
            )
        })
    }
}

impl Drop for Dctx {
    fn drop(&mut self) {
        // SAFETY: made by ZSTD_createDCtx, freed once.
        unsafe { sys::ZSTD_freeDCtx(self.0.as_ptr()) };
    }
}
