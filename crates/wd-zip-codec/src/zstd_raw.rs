//! libzstd's one-shot calls on [`Input`]/[`Output`] memory (zstd-safe
//! takes only slices): the zip device compresses in place.
#![allow(unsafe_code)]

use std::ptr::NonNull;

use zstd_safe::zstd_sys as sys;

use crate::mem::{Input, Output};
use crate::stream::ZSTD_WINDOW_LOG;
use crate::CodecError;

fn check(code: usize) -> Result<usize, CodecError> {
    // SAFETY: a pure function of the code.
    if unsafe { sys::ZSTD_isError(code) } == 0 {
        Ok(code)
    } else {
        Err(crate::zstd_error(code))
    }
}

/// Largest match-finder tables (4 bytes an entry): 16 MiB of hash table
/// and 32 MiB of chain table, zstd's own for levels 17 and 18. Higher
/// levels (and 12, 14, 15's hash table) would take up to 640 MiB for
/// input of unknown size, which a client could make the host allocate
/// per session; capped, they compress a little less well.
const HASH_LOG: u32 = 22;
const CHAIN_LOG: u32 = 23;

/// zstd's own parameters for `level` on an input of `size` bytes (`None`:
/// unknown, a stream's case), the window and tables capped.
pub(crate) fn params(level: i32, size: Option<u64>) -> sys::ZSTD_compressionParameters {
    // zstd reads a size of 0 as unknown: an empty input counts as 1 byte.
    let src = size.map_or(0, |n| n.max(1));
    // SAFETY: a pure function of its arguments.
    let mut p = unsafe { sys::ZSTD_getCParams(level, src, 0) };
    p.windowLog = p.windowLog.min(ZSTD_WINDOW_LOG);
    p.hashLog = p.hashLog.min(HASH_LOG);
    p.chainLog = p.chainLog.min(CHAIN_LOG);
    p
}

/// The largest block zstd makes at `level`, where it is not its own
/// 128 KiB: from level 16 (a few MB/s), 64 KiB, so that a compression cut
/// in parts ([`crate::Parts`], one block a part) holds the zip device's
/// engine half as long per part. Measured on 8 MiB of this project's
/// sources: at level 19, 44 ms a block against 94, the stream 0.1% larger
/// (32 KiB blocks: 25 ms, 0.4% larger); on 8 MiB of programs and
/// documents the same size and speed.
pub(crate) fn max_block(level: i32) -> Option<u32> {
    (level >= 16).then_some(64 << 10)
}

/// Bytes a compression stream with parameters `p` may allocate.
pub(crate) fn cstream_size(p: sys::ZSTD_compressionParameters) -> usize {
    // SAFETY: a pure function of the parameters.
    unsafe { sys::ZSTD_estimateCStreamSize_usingCParams(p) }
}

/// Bytes a decompression stream accepting windows up to
/// [`ZSTD_WINDOW_LOG`] may allocate.
pub(crate) fn dstream_size() -> usize {
    // SAFETY: a pure function of the window.
    unsafe { sys::ZSTD_estimateDStreamSize(1 << ZSTD_WINDOW_LOG) }
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
        self.begin(level, input.len() as u64)?;
        // SAFETY: the Input/Output contracts make both ranges valid for
        // the call; zstd reads at most input.len() and writes at most room.
        check(unsafe {
            sys::ZSTD_compress2(
                self.0.as_ptr(),
                out.ptr().cast(),
                room,
                input.ptr().cast(),
                input.len(),
            )
        })
    }

    /// Start a frame of `size` bytes with the parameters zstd picks for
    /// that size at `level` (capped): the one-shot's, and a frame made a
    /// part at a time ([`Cctx::part`]), whose size is pledged so that its
    /// header records it as the one-shot's does.
    pub(crate) fn begin(&mut self, level: i32, size: u64) -> Result<(), CodecError> {
        let p = params(level, Some(size));
        let c = self.0.as_ptr();
        // SAFETY: `c` is this context; parameters are plain values.
        unsafe {
            check(sys::ZSTD_CCtx_reset(
                c,
                sys::ZSTD_ResetDirective::ZSTD_reset_session_and_parameters,
            ))?;
            for (param, value) in [
                (sys::ZSTD_cParameter::ZSTD_c_compressionLevel, level),
                (sys::ZSTD_cParameter::ZSTD_c_windowLog, p.windowLog as i32),
                (sys::ZSTD_cParameter::ZSTD_c_hashLog, p.hashLog as i32),
                (sys::ZSTD_cParameter::ZSTD_c_chainLog, p.chainLog as i32),
            ] {
                check(sys::ZSTD_CCtx_setParameter(c, param, value))?;
            }
            if let Some(block) = max_block(level) {
                check(sys::ZSTD_CCtx_setParameter(
                    c,
                    sys::ZSTD_cParameter::ZSTD_c_experimentalParam18,
                    block as i32,
                ))?;
            }
            check(sys::ZSTD_CCtx_setPledgedSrcSize(c, size))?;
        }
        Ok(())
    }

    /// Compress all of `input`, the next part of the frame [`Cctx::begin`]
    /// started, into `out`, ending the frame when `end`: the bytes
    /// written. Output that does not fit is [`CodecError::NoSpace`] (the
    /// frame is then lost: begin again).
    pub(crate) fn part(
        &mut self,
        input: &[u8],
        out: &mut [u8],
        end: bool,
    ) -> Result<usize, CodecError> {
        let mut inb = sys::ZSTD_inBuffer {
            src: input.as_ptr().cast(),
            size: input.len(),
            pos: 0,
        };
        let mut outb = sys::ZSTD_outBuffer {
            dst: out.as_mut_ptr().cast(),
            size: out.len(),
            pos: 0,
        };
        let directive = match end {
            true => sys::ZSTD_EndDirective::ZSTD_e_end,
            false => sys::ZSTD_EndDirective::ZSTD_e_continue,
        };
        loop {
            let before = (inb.pos, outb.pos);
            // SAFETY: both buffers describe the borrowed slices, which
            // outlive the call; zstd keeps pos within size.
            let left = check(unsafe {
                sys::ZSTD_compressStream2(self.0.as_ptr(), &mut outb, &mut inb, directive)
            })?;
            if inb.pos == inb.size && (!end || left == 0) {
                return Ok(outb.pos);
            }
            if outb.pos == outb.size || before == (inb.pos, outb.pos) {
                return Err(CodecError::NoSpace);
            }
        }
    }

    /// Bytes the context holds (its tables stay allocated between calls).
    pub(crate) fn size(&self) -> usize {
        // SAFETY: `self.0` is a live context.
        unsafe { sys::ZSTD_sizeof_CCtx(self.0.as_ptr()) }
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

    /// A context for a decompression streamed into one output that stays
    /// in place between calls (zstd's stable output buffer): the output
    /// is the decoder's window, so it keeps none of its own and takes
    /// any window size, as the one-shot call does.
    pub(crate) fn stable() -> Option<Dctx> {
        let d = Dctx::new()?;
        let c = d.0.as_ptr();
        // SAFETY: `c` is this context; parameters are plain values.
        let set = |param, value| check(unsafe { sys::ZSTD_DCtx_setParameter(c, param, value) });
        // ZSTD_d_experimentalParam2 is ZSTD_d_stableOutBuffer.
        set(sys::ZSTD_dParameter::ZSTD_d_experimentalParam2, 1).ok()?;
        set(sys::ZSTD_dParameter::ZSTD_d_windowLogMax, 31).ok()?;
        Some(d)
    }

    /// Decode what of `input` the decoder takes into `out` from `pos`, on
    /// a [`Dctx::stable`] context (`out` the same memory, of the same
    /// length, on every call: zstd refuses another): the input taken, the
    /// output position after, and the input the decoder's next unit
    /// needs (0: a frame ended).
    pub(crate) fn stream(
        &mut self,
        input: &[u8],
        out: &mut (impl Output + ?Sized),
        pos: usize,
    ) -> Result<(usize, usize, usize), CodecError> {
        if pos > out.len() {
            return Err(CodecError::Param);
        }
        let mut inb = sys::ZSTD_inBuffer {
            src: input.as_ptr().cast(),
            size: input.len(),
            pos: 0,
        };
        let mut outb = sys::ZSTD_outBuffer {
            dst: out.ptr().cast(),
            size: out.len(),
            pos,
        };
        // SAFETY: the input is the borrowed slice; the output is valid
        // for its length by the Output contract, for the call; zstd keeps
        // each pos within its size, and reads the window only from the
        // output it wrote earlier (the same memory: it checks).
        let hint =
            check(unsafe { sys::ZSTD_decompressStream(self.0.as_ptr(), &mut outb, &mut inb) })?;
        Ok((inb.pos, outb.pos, hint))
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
