//! libwd_comp.so: the C API of `include/wd_comp.h` over `wd-comp`.
//!
//! A `struct wd_comp` is a boxed compressor with a magic word, so a NULL
//! or foreign pointer is -EINVAL rather than a crash (a freed one is
//! undefined, as in any C library). Buffers are the caller's own memory
//! (the library stages them into shared memory itself), so they are
//! ordinary slices here; a destination that overlaps its source is
//! refused.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use wd_comp::{Algorithm, CompError, Compressor, Flush, Op, Pending, Stream, StreamParams};
use wd_sys::dl::TextSink;
use wd_zip_codec::CodecError;

mod zrs;

const MAGIC: u64 = 0x5744_434f_4d50_0001; // "WDCOMP"
const STREAM_MAGIC: u64 = 0x5744_5a53_5452_4d01; // "WDZSTRM"
const EINVAL: c_int = 22;
const EIO: c_int = 5;

/// `struct wd_comp`.
pub struct WdComp {
    magic: u64,
    c: Compressor,
    /// Requests started by `wd_comp_submit` and not yet finished, by
    /// ticket: each with the caller's output buffer (valid until then,
    /// by the header's contract).
    pending: std::collections::HashMap<u64, (Pending, *mut u8, usize)>,
    next_ticket: u64,
}

/// `struct wd_comp_stream`.
pub struct WdCompStream {
    magic: u64,
    s: Option<Stream>,
}

/// `struct wd_comp_buf`.
#[repr(C)]
pub struct WdCompBuf {
    src: *const c_void,
    src_len: usize,
    dst: *mut c_void,
    dst_len: usize,
    consumed: usize,
}

/// `struct iovec` (sys/uio.h): one piece of a scatter list.
#[repr(C)]
pub struct IoVec {
    base: *mut c_void,
    len: usize,
}

/// Pieces a scatter list may have (as `IOV_MAX`).
const SG_MAX: usize = 1024;
/// Buffers one batch may have: the count is the caller's word, and the
/// library sets aside a few words per buffer before anything else.
const BATCH_MAX: usize = 1 << 16;

/// `struct wd_comp_stats`.
#[repr(C)]
pub struct WdCompStats {
    offloaded: u64,
    cpu_threshold: u64,
    cpu_policy: u64,
    cpu_assist: u64,
    cpu_fallback: u64,
    bytes_in: u64,
    bytes_out: u64,
}

/// Keep `msg` where `wd_last_error` (libwd.so, when loaded) reads it;
/// returns `-errno`.
fn fail(errno: c_int, msg: &str) -> c_int {
    static SINK: OnceLock<Option<TextSink>> = OnceLock::new();
    if let Some(sink) = SINK.get_or_init(|| TextSink::find_loaded("libwd.so", "wd__set_last_error"))
    {
        let c = std::ffi::CString::new(msg.replace('\0', " ")).unwrap_or_default();
        sink.send(&c);
    }
    -errno
}

/// Run an entry point; a panic is -EIO.
fn guard(f: impl FnOnce() -> c_int) -> c_int {
    catch_unwind(AssertUnwindSafe(f))
        .unwrap_or_else(|_| fail(EIO, "internal error in libwd_comp (panic caught)"))
}

/// The errno of an error (the one mapping at this boundary).
fn errno_of(e: &CompError) -> c_int {
    match e {
        CompError::Data(CodecError::NoSpace) => 105, // ENOBUFS
        CompError::Data(CodecError::Corrupt | CodecError::NeedDict) => 74, // EBADMSG
        CompError::Data(CodecError::Ratio) => 75,    // EOVERFLOW
        CompError::Data(CodecError::Param) => EINVAL,
        CompError::Data(CodecError::Memory) => 12, // ENOMEM
        CompError::Data(CodecError::Broken) => EIO,
        CompError::Device(d) => d.errno(),
        CompError::NoQueue(_) => 107, // ENOTCONN
    }
}

fn alg_of(alg: c_int) -> Option<Algorithm> {
    u8::try_from(alg)
        .ok()
        .and_then(|a| Algorithm::try_from(a).ok())
}

/// # Safety
/// `c` must be NULL or a pointer from `wd_comp_new` not yet freed.
unsafe fn comp<'a>(c: *mut WdComp) -> Option<&'a mut WdComp> {
    // SAFETY: caller contract; the magic word catches foreign pointers.
    unsafe { c.as_mut() }.filter(|w| w.magic == MAGIC)
}

/// # Safety
/// Each pointer readable/writable for its length when not NULL.
unsafe fn buffers<'a>(
    src: *const c_void,
    src_len: usize,
    dst: *mut c_void,
    dst_len: usize,
) -> Option<(&'a [u8], &'a mut [u8])> {
    if (src.is_null() && src_len > 0) || (dst.is_null() && dst_len > 0) {
        return None;
    }
    let (s, d) = (src as usize, dst as usize);
    if src_len > 0 && dst_len > 0 && s < d.saturating_add(dst_len) && d < s.saturating_add(src_len)
    {
        return None;
    }
    let src: &[u8] = if src_len == 0 {
        &[]
    } else {
        // SAFETY: caller contract, checked non-null above.
        unsafe { std::slice::from_raw_parts(src.cast(), src_len) }
    };
    let dst: &mut [u8] = if dst_len == 0 {
        &mut []
    } else {
        // SAFETY: caller contract, checked non-null and not overlapping.
        unsafe { std::slice::from_raw_parts_mut(dst.cast(), dst_len) }
    };
    Some((src, dst))
}

/// See wd_comp.h.
///
/// # Safety
/// `out` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn wd_comp_new(out: *mut *mut WdComp) -> c_int {
    guard(|| {
        if out.is_null() {
            return fail(EINVAL, "wd_comp_new: out is NULL");
        }
        match Compressor::from_env() {
            Ok(c) => {
                // SAFETY: checked non-null; caller contract.
                unsafe {
                    out.write(Box::into_raw(Box::new(WdComp {
                        magic: MAGIC,
                        c,
                        pending: Default::default(),
                        next_ticket: 1,
                    })))
                };
                0
            }
            Err(e) => fail(EINVAL, &e),
        }
    })
}

/// See wd_comp.h.
///
/// # Safety
/// `c` must be NULL or from `wd_comp_new`, not yet freed.
#[no_mangle]
pub unsafe extern "C" fn wd_comp_free(c: *mut WdComp) {
    let _ = guard(|| {
        // SAFETY: caller contract.
        if let Some(w) = unsafe { comp(c) } {
            w.magic = 0;
            // SAFETY: made by Box::into_raw in wd_comp_new.
            drop(unsafe { Box::from_raw(c) });
        }
        0
    });
}

/// See wd_comp.h.
#[no_mangle]
pub extern "C" fn wd_comp_bound(alg: c_int, len: usize) -> usize {
    match alg_of(alg).map(|a| wd_comp::compress_bound(a, len)) {
        Some(usize::MAX) | None => 0,
        Some(n) => n,
    }
}

/// See wd_comp.h.
///
/// # Safety
/// Pointers as wd_comp.h says.
#[no_mangle]
pub unsafe extern "C" fn wd_comp_compress(
    c: *mut WdComp,
    alg: c_int,
    level: c_int,
    src: *const c_void,
    src_len: usize,
    dst: *mut c_void,
    dst_len: *mut usize,
) -> c_int {
    guard(|| {
        // SAFETY: caller contract.
        let Some(w) = (unsafe { comp(c) }) else {
            return fail(EINVAL, "wd_comp_compress: not a struct wd_comp");
        };
        let (Some(a), Ok(level)) = (alg_of(alg), i8::try_from(level)) else {
            return fail(EINVAL, "wd_comp_compress: unknown algorithm or level");
        };
        if dst_len.is_null() {
            return fail(EINVAL, "wd_comp_compress: dst_len is NULL");
        }
        // SAFETY: checked non-null.
        let room = unsafe { *dst_len };
        // SAFETY: caller contract.
        let Some((input, out)) = (unsafe { buffers(src, src_len, dst, room) }) else {
            return fail(EINVAL, "wd_comp_compress: NULL or overlapping buffer");
        };
        match w.c.compress(a, level, input, out) {
            Ok(n) => {
                // SAFETY: checked non-null.
                unsafe { *dst_len = n };
                0
            }
            Err(e) => fail(errno_of(&e), &format!("wd_comp_compress: {e}")),
        }
    })
}

/// `struct wd_comp_pieces`.
#[repr(C)]
pub struct WdCompPieces {
    check: u32,
    len: u64,
}

/// `WD_COMP_PIECE_FIRST`, `WD_COMP_PIECE_LAST`.
const PIECE_FIRST: c_int = 1;
const PIECE_LAST: c_int = 2;

/// See wd_comp.h.
///
/// # Safety
/// Pointers as wd_comp.h says.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn wd_comp_compress_piece(
    c: *mut WdComp,
    alg: c_int,
    level: c_int,
    p: *mut WdCompPieces,
    src: *const c_void,
    src_len: usize,
    dst: *mut c_void,
    dst_len: *mut usize,
    flags: c_int,
) -> c_int {
    guard(|| {
        // SAFETY: caller contract.
        let Some(w) = (unsafe { comp(c) }) else {
            return fail(EINVAL, "wd_comp_compress_piece: not a struct wd_comp");
        };
        let (Some(a), Ok(level)) = (alg_of(alg), i8::try_from(level)) else {
            return fail(EINVAL, "wd_comp_compress_piece: unknown algorithm or level");
        };
        if flags & !(PIECE_FIRST | PIECE_LAST) != 0 {
            return fail(EINVAL, "wd_comp_compress_piece: unknown flags");
        }
        if dst_len.is_null() || p.is_null() {
            return fail(EINVAL, "wd_comp_compress_piece: p or dst_len is NULL");
        }
        // SAFETY: both checked non-null; caller contract.
        let (room, mut state) = unsafe {
            (
                *dst_len,
                wd_comp::Pieces {
                    check: (*p).check,
                    len: (*p).len,
                },
            )
        };
        // SAFETY: caller contract.
        let Some((input, out)) = (unsafe { buffers(src, src_len, dst, room) }) else {
            return fail(EINVAL, "wd_comp_compress_piece: NULL or overlapping buffer");
        };
        let (first, last) = (flags & PIECE_FIRST != 0, flags & PIECE_LAST != 0);
        match w
            .c
            .compress_piece(a, level, &mut state, input, out, first, last)
        {
            Ok(n) => {
                // SAFETY: checked non-null.
                unsafe {
                    *dst_len = n;
                    p.write(WdCompPieces {
                        check: state.check,
                        len: state.len,
                    });
                }
                0
            }
            Err(e) => fail(errno_of(&e), &format!("wd_comp_compress_piece: {e}")),
        }
    })
}

/// See wd_comp.h.
///
/// # Safety
/// Pointers as wd_comp.h says.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn wd_comp_decompress(
    c: *mut WdComp,
    alg: c_int,
    src: *const c_void,
    src_len: usize,
    consumed: *mut usize,
    dst: *mut c_void,
    dst_len: *mut usize,
    max_ratio: c_uint,
) -> c_int {
    guard(|| {
        // SAFETY: caller contract.
        let Some(w) = (unsafe { comp(c) }) else {
            return fail(EINVAL, "wd_comp_decompress: not a struct wd_comp");
        };
        let (Some(a), Ok(ratio)) = (alg_of(alg), u16::try_from(max_ratio)) else {
            return fail(
                EINVAL,
                "wd_comp_decompress: unknown algorithm or ratio above 65535",
            );
        };
        if dst_len.is_null() {
            return fail(EINVAL, "wd_comp_decompress: dst_len is NULL");
        }
        // SAFETY: checked non-null.
        let room = unsafe { *dst_len };
        // SAFETY: caller contract.
        let Some((input, out)) = (unsafe { buffers(src, src_len, dst, room) }) else {
            return fail(EINVAL, "wd_comp_decompress: NULL or overlapping buffer");
        };
        match w.c.decompress(a, input, out, ratio) {
            Ok(d) => {
                // SAFETY: checked non-null; `consumed` is optional.
                unsafe {
                    *dst_len = d.produced;
                    if !consumed.is_null() {
                        *consumed = d.consumed;
                    }
                }
                0
            }
            Err(e) => fail(errno_of(&e), &format!("wd_comp_decompress: {e}")),
        }
    })
}

/// See wd_comp.h.
///
/// # Safety
/// `c` as for the other calls; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn wd_comp_stats(c: *mut WdComp, out: *mut WdCompStats) -> c_int {
    guard(|| {
        // SAFETY: caller contract.
        let Some(w) = (unsafe { comp(c) }) else {
            return fail(EINVAL, "wd_comp_stats: not a struct wd_comp");
        };
        if out.is_null() {
            return fail(EINVAL, "wd_comp_stats: out is NULL");
        }
        let s = w.c.stats();
        // SAFETY: checked non-null; caller contract.
        unsafe {
            out.write(WdCompStats {
                offloaded: s.offloaded,
                cpu_threshold: s.cpu_threshold,
                cpu_policy: s.cpu_policy,
                cpu_assist: s.cpu_assist,
                cpu_fallback: s.cpu_fallback,
                bytes_in: s.bytes_in,
                bytes_out: s.bytes_out,
            })
        };
        0
    })
}

/// `wd_comp_stream_stats`.
///
/// # Safety
/// `c` from `wd_comp_new`; `rebuilt` and `lost` writable `uint64_t`s.
#[no_mangle]
pub unsafe extern "C" fn wd_comp_stream_stats(
    c: *mut WdComp,
    rebuilt: *mut u64,
    lost: *mut u64,
) -> c_int {
    guard(|| {
        // SAFETY: caller contract.
        let Some(w) = (unsafe { comp(c) }) else {
            return fail(EINVAL, "wd_comp_stream_stats: not a struct wd_comp");
        };
        if rebuilt.is_null() || lost.is_null() {
            return fail(EINVAL, "wd_comp_stream_stats: an out-parameter is NULL");
        }
        let s = w.c.stats();
        // SAFETY: both checked non-null; caller contract.
        unsafe {
            rebuilt.write(s.streams_rebuilt);
            lost.write(s.streams_lost);
        }
        0
    })
}

/// `wd_comp_split_stats`.
///
/// # Safety
/// `c` from `wd_comp_new`; `split` a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn wd_comp_split_stats(c: *mut WdComp, split: *mut u64) -> c_int {
    guard(|| {
        // SAFETY: caller contract.
        let Some(w) = (unsafe { comp(c) }) else {
            return fail(EINVAL, "wd_comp_split_stats: not a struct wd_comp");
        };
        if split.is_null() {
            return fail(EINVAL, "wd_comp_split_stats: split is NULL");
        }
        // SAFETY: checked non-null; caller contract.
        unsafe { split.write(w.c.stats().split) };
        0
    })
}

/// `wd_comp_set_split`.
///
/// # Safety
/// `c` from `wd_comp_new`.
#[no_mangle]
pub unsafe extern "C" fn wd_comp_set_split(c: *mut WdComp, on: c_int) -> c_int {
    guard(|| {
        // SAFETY: caller contract.
        let Some(w) = (unsafe { comp(c) }) else {
            return fail(EINVAL, "wd_comp_set_split: not a struct wd_comp");
        };
        let on = match on {
            0 => false,
            1 => true,
            _ => return fail(EINVAL, "wd_comp_set_split: on is neither 0 nor 1"),
        };
        w.c.set_cutting(on);
        0
    })
}

/// Whether no output range overlaps another range, input or output
/// (inputs may overlap each other: they are only read). Ranges are
/// (address, length); empty ones overlap nothing.
fn disjoint(inputs: &[(usize, usize)], outputs: &[(usize, usize)]) -> bool {
    let mut outs: Vec<(usize, usize)> = outputs.iter().copied().filter(|r| r.1 > 0).collect();
    outs.sort_unstable();
    let end = |(a, n): (usize, usize)| a.saturating_add(n);
    if outs.windows(2).any(|w| end(w[0]) > w[1].0) {
        return false;
    }
    inputs.iter().filter(|r| r.1 > 0).all(|&r| {
        // The last output starting before this input ends is the only one
        // that can reach into it (outputs do not overlap each other).
        let i = outs.partition_point(|o| o.0 < end(r));
        i == 0 || end(outs[i - 1]) <= r.0
    })
}

/// Inputs and outputs (of a batch, or two scatter lists), as slices.
type Batch<'a> = (Vec<&'a [u8]>, Vec<&'a mut [u8]>);

/// The buffers of a batch as slices (`None`: too many, a NULL or an
/// overlapping one).
///
/// # Safety
/// `bufs` valid for `n` entries, each naming valid memory (wd_comp.h).
unsafe fn batch<'a>(bufs: *mut WdCompBuf, n: usize) -> Option<Batch<'a>> {
    if n > BATCH_MAX || (bufs.is_null() && n > 0) {
        return None;
    }
    // Each entry is read once: what is checked is what is used.
    let entries: Vec<(*const c_void, usize, *mut c_void, usize)> = (0..n)
        .map(|i| {
            // SAFETY: caller contract: n entries.
            let b = unsafe { &*bufs.add(i) };
            (b.src, b.src_len, b.dst, b.dst_len)
        })
        .collect();
    let in_ranges: Vec<(usize, usize)> = entries.iter().map(|e| (e.0 as usize, e.1)).collect();
    let out_ranges: Vec<(usize, usize)> = entries.iter().map(|e| (e.2 as usize, e.3)).collect();
    // One buffer's output must not overlap another's input or output
    // either (a `&mut` slice aliases nothing).
    if !disjoint(&in_ranges, &out_ranges) {
        return None;
    }
    let (mut ins, mut outs) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for (src, src_len, dst, dst_len) in entries {
        // SAFETY: caller contract for each buffer.
        let (input, out) = unsafe { buffers(src, src_len, dst, dst_len) }?;
        ins.push(input);
        outs.push(out);
    }
    Some((ins, outs))
}

/// Run a batch and write each buffer's counts (all or none).
///
/// # Safety
/// As [`batch`].
unsafe fn run_batch(
    what: &str,
    bufs: *mut WdCompBuf,
    n: usize,
    f: impl FnOnce(&[&[u8]], &mut [&mut [u8]]) -> wd_comp::Result<Vec<wd_comp::Inflated>>,
) -> c_int {
    // SAFETY: caller contract.
    let Some((ins, mut outs)) = (unsafe { batch(bufs, n) }) else {
        return fail(
            EINVAL,
            &format!("{what}: more than {BATCH_MAX} buffers, or a NULL or overlapping one"),
        );
    };
    match f(&ins, &mut outs) {
        Ok(done) => {
            drop(outs);
            for (i, d) in done.iter().enumerate() {
                // SAFETY: caller contract: n entries, written only now.
                let b = unsafe { &mut *bufs.add(i) };
                b.dst_len = d.produced;
                b.consumed = d.consumed;
            }
            0
        }
        Err(e) => fail(errno_of(&e), &format!("{what}: {e}")),
    }
}

/// Two scatter lists as slices (`None`: too many pieces, a NULL base
/// with a length, or an output piece overlapping another piece).
///
/// # Safety
/// `src`, `dst` valid for their counts when not NULL, each piece naming
/// valid memory (wd_comp.h).
unsafe fn scatter_lists<'a>(
    src: *const IoVec,
    n_src: usize,
    dst: *const IoVec,
    n_dst: usize,
) -> Option<Batch<'a>> {
    if n_src > SG_MAX
        || n_dst > SG_MAX
        || (src.is_null() && n_src > 0)
        || (dst.is_null() && n_dst > 0)
    {
        return None;
    }
    // Each entry is read once: what is checked is what is used.
    let read = |v: *const IoVec, n: usize| -> Option<Vec<(*mut u8, usize)>> {
        (0..n)
            .map(|i| {
                // SAFETY: caller contract: n entries.
                let e = unsafe { &*v.add(i) };
                (!e.base.is_null() || e.len == 0).then_some((e.base.cast::<u8>(), e.len))
            })
            .collect()
    };
    let (ins, outs) = (read(src, n_src)?, read(dst, n_dst)?);
    let range = |&(p, n): &(*mut u8, usize)| (p as usize, n);
    let in_ranges: Vec<_> = ins.iter().map(range).collect();
    let out_ranges: Vec<_> = outs.iter().map(range).collect();
    if !disjoint(&in_ranges, &out_ranges) {
        return None;
    }
    let ins = ins
        .into_iter()
        .map(|(p, n)| match n {
            0 => &[][..],
            // SAFETY: caller contract; non-null when non-empty (checked).
            _ => unsafe { std::slice::from_raw_parts(p.cast_const(), n) },
        })
        .collect();
    let outs = outs
        .into_iter()
        .map(|(p, n)| match n {
            0 => &mut [][..],
            // SAFETY: caller contract; non-null, and overlapping no other
            // piece (checked above).
            _ => unsafe { std::slice::from_raw_parts_mut(p, n) },
        })
        .collect();
    Some((ins, outs))
}

/// See wd_comp.h.
///
/// # Safety
/// Pointers as wd_comp.h says.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn wd_comp_compress_sg(
    c: *mut WdComp,
    alg: c_int,
    level: c_int,
    src: *const IoVec,
    n_src: usize,
    dst: *const IoVec,
    n_dst: usize,
    produced: *mut usize,
) -> c_int {
    guard(|| {
        // SAFETY: caller contract.
        let Some(w) = (unsafe { comp(c) }) else {
            return fail(EINVAL, "wd_comp_compress_sg: not a struct wd_comp");
        };
        let (Some(a), Ok(level)) = (alg_of(alg), i8::try_from(level)) else {
            return fail(EINVAL, "wd_comp_compress_sg: unknown algorithm or level");
        };
        if produced.is_null() {
            return fail(EINVAL, "wd_comp_compress_sg: produced is NULL");
        }
        // SAFETY: caller contract.
        let Some((ins, mut outs)) = (unsafe { scatter_lists(src, n_src, dst, n_dst) }) else {
            return fail(
                EINVAL,
                "wd_comp_compress_sg: more than 1024 pieces, a NULL piece, or an output piece overlapping another",
            );
        };
        match w.c.compress_sg(a, level, &ins, &mut outs) {
            Ok(n) => {
                // SAFETY: checked non-null.
                unsafe { *produced = n };
                0
            }
            Err(e) => fail(errno_of(&e), &format!("wd_comp_compress_sg: {e}")),
        }
    })
}

/// See wd_comp.h.
///
/// # Safety
/// Pointers as wd_comp.h says.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn wd_comp_decompress_sg(
    c: *mut WdComp,
    alg: c_int,
    src: *const IoVec,
    n_src: usize,
    consumed: *mut usize,
    dst: *const IoVec,
    n_dst: usize,
    produced: *mut usize,
    max_ratio: c_uint,
) -> c_int {
    guard(|| {
        // SAFETY: caller contract.
        let Some(w) = (unsafe { comp(c) }) else {
            return fail(EINVAL, "wd_comp_decompress_sg: not a struct wd_comp");
        };
        let (Some(a), Ok(ratio)) = (alg_of(alg), u16::try_from(max_ratio)) else {
            return fail(
                EINVAL,
                "wd_comp_decompress_sg: unknown algorithm or ratio above 65535",
            );
        };
        if produced.is_null() {
            return fail(EINVAL, "wd_comp_decompress_sg: produced is NULL");
        }
        // SAFETY: caller contract.
        let Some((ins, mut outs)) = (unsafe { scatter_lists(src, n_src, dst, n_dst) }) else {
            return fail(
                EINVAL,
                "wd_comp_decompress_sg: more than 1024 pieces, a NULL piece, or an output piece overlapping another",
            );
        };
        match w.c.decompress_sg(a, &ins, &mut outs, ratio) {
            Ok(d) => {
                // SAFETY: checked non-null; `consumed` is optional.
                unsafe {
                    *produced = d.produced;
                    if !consumed.is_null() {
                        *consumed = d.consumed;
                    }
                }
                0
            }
            Err(e) => fail(errno_of(&e), &format!("wd_comp_decompress_sg: {e}")),
        }
    })
}

/// `enum wd_comp_op`.
const OP_COMPRESS: c_int = 0;
const OP_DECOMPRESS: c_int = 1;
const EAGAIN: c_int = 11;

/// See wd_comp.h.
///
/// # Safety
/// Pointers as wd_comp.h says; `dst` stays valid until the request is
/// finished.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn wd_comp_submit(
    c: *mut WdComp,
    op: c_int,
    alg: c_int,
    level: c_int,
    max_ratio: c_uint,
    src: *const c_void,
    src_len: usize,
    dst: *mut c_void,
    dst_len: usize,
    ticket: *mut u64,
) -> c_int {
    guard(|| {
        // SAFETY: caller contract.
        let Some(w) = (unsafe { comp(c) }) else {
            return fail(EINVAL, "wd_comp_submit: not a struct wd_comp");
        };
        let op = match (op, i8::try_from(level), u16::try_from(max_ratio)) {
            (OP_COMPRESS, Ok(l), _) => Op::Compress(l),
            (OP_DECOMPRESS, _, Ok(r)) => Op::Decompress(r),
            _ => {
                return fail(
                    EINVAL,
                    "wd_comp_submit: unknown operation, level, or ratio above 65535",
                )
            }
        };
        let Some(a) = alg_of(alg) else {
            return fail(EINVAL, "wd_comp_submit: unknown algorithm");
        };
        if ticket.is_null() {
            return fail(EINVAL, "wd_comp_submit: ticket is NULL");
        }
        // SAFETY: caller contract.
        let Some((input, out)) = (unsafe { buffers(src, src_len, dst, dst_len) }) else {
            return fail(EINVAL, "wd_comp_submit: NULL or overlapping buffer");
        };
        match w.c.start(op, a, input, out) {
            Ok(p) => {
                let t = w.next_ticket;
                w.next_ticket += 1;
                w.pending.insert(t, (p, dst.cast(), dst_len));
                // SAFETY: checked non-null.
                unsafe { *ticket = t };
                0
            }
            Err(e) => fail(errno_of(&e), &format!("wd_comp_submit: {e}")),
        }
    })
}

/// Finish (or look at) the request of `ticket`: `wait` blocks.
///
/// # Safety
/// As `wd_comp_poll`.
unsafe fn finish_ticket(
    what: &str,
    c: *mut WdComp,
    ticket: u64,
    consumed: *mut usize,
    produced: *mut usize,
    wait: bool,
) -> c_int {
    // SAFETY: caller contract.
    let Some(w) = (unsafe { comp(c) }) else {
        return fail(EINVAL, &format!("{what}: not a struct wd_comp"));
    };
    let Some((mut p, dst, len)) = w.pending.remove(&ticket) else {
        return fail(EINVAL, &format!("{what}: no request with ticket {ticket}"));
    };
    let out: &mut [u8] = if len == 0 {
        &mut []
    } else {
        // SAFETY: the buffer given to wd_comp_submit, valid until the
        // request is finished (header contract); no other slice of it
        // lives now.
        unsafe { std::slice::from_raw_parts_mut(dst, len) }
    };
    let r = if wait {
        w.c.finish(p, out).map(Some)
    } else {
        match w.c.poll(&mut p, out) {
            Ok(None) => {
                w.pending.insert(ticket, (p, dst, len));
                return -EAGAIN;
            }
            other => other,
        }
    };
    match r {
        Ok(Some(d)) => {
            // SAFETY: each is NULL (not wanted) or valid (caller contract).
            unsafe {
                if !produced.is_null() {
                    *produced = d.produced;
                }
                if !consumed.is_null() {
                    *consumed = d.consumed;
                }
            }
            0
        }
        Ok(None) => unreachable!("a finished request has a result"),
        Err(e) => fail(errno_of(&e), &format!("{what}: {e}")),
    }
}

/// See wd_comp.h.
///
/// # Safety
/// Pointers as wd_comp.h says.
#[no_mangle]
pub unsafe extern "C" fn wd_comp_poll(
    c: *mut WdComp,
    ticket: u64,
    consumed: *mut usize,
    produced: *mut usize,
) -> c_int {
    // SAFETY: caller contract.
    guard(|| unsafe { finish_ticket("wd_comp_poll", c, ticket, consumed, produced, false) })
}

/// See wd_comp.h.
///
/// # Safety
/// Pointers as wd_comp.h says.
#[no_mangle]
pub unsafe extern "C" fn wd_comp_wait(
    c: *mut WdComp,
    ticket: u64,
    consumed: *mut usize,
    produced: *mut usize,
) -> c_int {
    // SAFETY: caller contract.
    guard(|| unsafe { finish_ticket("wd_comp_wait", c, ticket, consumed, produced, true) })
}

/// See wd_comp.h.
///
/// # Safety
/// Pointers as wd_comp.h says.
#[no_mangle]
pub unsafe extern "C" fn wd_comp_compress_batch(
    c: *mut WdComp,
    alg: c_int,
    level: c_int,
    bufs: *mut WdCompBuf,
    n: usize,
) -> c_int {
    guard(|| {
        // SAFETY: caller contract.
        let Some(w) = (unsafe { comp(c) }) else {
            return fail(EINVAL, "wd_comp_compress_batch: not a struct wd_comp");
        };
        let (Some(a), Ok(level)) = (alg_of(alg), i8::try_from(level)) else {
            return fail(EINVAL, "wd_comp_compress_batch: unknown algorithm or level");
        };
        // SAFETY: caller contract.
        unsafe {
            run_batch("wd_comp_compress_batch", bufs, n, |i, o| {
                w.c.compress_into(a, level, i, o)
            })
        }
    })
}

/// See wd_comp.h.
///
/// # Safety
/// Pointers as wd_comp.h says.
#[no_mangle]
pub unsafe extern "C" fn wd_comp_decompress_batch(
    c: *mut WdComp,
    alg: c_int,
    bufs: *mut WdCompBuf,
    n: usize,
    max_ratio: c_uint,
) -> c_int {
    guard(|| {
        // SAFETY: caller contract.
        let Some(w) = (unsafe { comp(c) }) else {
            return fail(EINVAL, "wd_comp_decompress_batch: not a struct wd_comp");
        };
        let (Some(a), Ok(ratio)) = (alg_of(alg), u16::try_from(max_ratio)) else {
            return fail(
                EINVAL,
                "wd_comp_decompress_batch: unknown algorithm or ratio above 65535",
            );
        };
        // SAFETY: caller contract.
        unsafe {
            run_batch("wd_comp_decompress_batch", bufs, n, |i, o| {
                w.c.decompress_into(a, i, o, ratio)
            })
        }
    })
}

/// See wd_comp.h.
///
/// # Safety
/// Pointers as wd_comp.h says.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn wd_comp_stream_new(
    c: *mut WdComp,
    alg: c_int,
    compress: c_int,
    level: c_int,
    window_bits: c_int,
    dict: *const c_void,
    dict_len: usize,
    out: *mut *mut WdCompStream,
) -> c_int {
    guard(|| {
        // SAFETY: caller contract.
        let Some(w) = (unsafe { comp(c) }) else {
            return fail(EINVAL, "wd_comp_stream_new: not a struct wd_comp");
        };
        // (The level is ignored when decompressing, whatever it is.)
        let level = if compress != 0 {
            i8::try_from(level)
        } else {
            Ok(0)
        };
        let (Some(a), Ok(level), Ok(window_bits)) = (alg_of(alg), level, u8::try_from(window_bits))
        else {
            return fail(
                EINVAL,
                "wd_comp_stream_new: unknown algorithm, level or window",
            );
        };
        if out.is_null() || (dict.is_null() && dict_len > 0) {
            return fail(EINVAL, "wd_comp_stream_new: NULL out or dictionary");
        }
        let dict: &[u8] = if dict_len == 0 {
            &[]
        } else {
            // SAFETY: caller contract, checked non-null.
            unsafe { std::slice::from_raw_parts(dict.cast(), dict_len) }
        };
        let p = StreamParams {
            alg: a,
            compress: compress != 0,
            level: if compress != 0 { level } else { 0 },
            window_bits,
            dict,
        };
        match w.c.open_stream(&p) {
            Ok(s) => {
                let b = Box::new(WdCompStream {
                    magic: STREAM_MAGIC,
                    s: Some(s),
                });
                // SAFETY: checked non-null; caller contract.
                unsafe { out.write(Box::into_raw(b)) };
                0
            }
            Err(e) => fail(errno_of(&e), &format!("wd_comp_stream_new: {e}")),
        }
    })
}

/// See wd_comp.h.
///
/// # Safety
/// Pointers as wd_comp.h says.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn wd_comp_stream_run(
    c: *mut WdComp,
    s: *mut WdCompStream,
    src: *const c_void,
    src_len: *mut usize,
    dst: *mut c_void,
    dst_len: *mut usize,
    flush: c_int,
    end: *mut c_int,
) -> c_int {
    guard(|| {
        // SAFETY: caller contract.
        let Some(w) = (unsafe { comp(c) }) else {
            return fail(EINVAL, "wd_comp_stream_run: not a struct wd_comp");
        };
        // SAFETY: caller contract; the magic word catches foreign pointers.
        let Some(ws) = (unsafe { s.as_mut() }).filter(|x| x.magic == STREAM_MAGIC) else {
            return fail(EINVAL, "wd_comp_stream_run: not a struct wd_comp_stream");
        };
        let Ok(flush) = u8::try_from(flush)
            .map_err(|_| ())
            .and_then(|f| Flush::try_from(f).map_err(|_| ()))
        else {
            return fail(EINVAL, "wd_comp_stream_run: unknown flush mode");
        };
        if src_len.is_null() || dst_len.is_null() {
            return fail(EINVAL, "wd_comp_stream_run: NULL length");
        }
        // SAFETY: checked non-null.
        let (avail, room) = unsafe { (*src_len, *dst_len) };
        // SAFETY: caller contract.
        let Some((input, out)) = (unsafe { buffers(src, avail, dst, room) }) else {
            return fail(EINVAL, "wd_comp_stream_run: NULL or overlapping buffer");
        };
        let Some(stream) = ws.s.as_mut() else {
            return fail(EINVAL, "wd_comp_stream_run: a freed stream");
        };
        match w.c.stream_run(stream, input, out, flush) {
            Ok(step) => {
                // SAFETY: checked non-null; `end` is optional.
                unsafe {
                    *src_len = step.consumed;
                    *dst_len = step.produced;
                    if !end.is_null() {
                        *end = c_int::from(step.end);
                    }
                }
                0
            }
            Err(e) => fail(errno_of(&e), &format!("wd_comp_stream_run: {e}")),
        }
    })
}

/// See wd_comp.h.
///
/// # Safety
/// `c` and `s` as for the other calls (NULL `s` is ignored).
#[no_mangle]
pub unsafe extern "C" fn wd_comp_stream_free(c: *mut WdComp, s: *mut WdCompStream) {
    let _ = guard(|| {
        // SAFETY: caller contract.
        let Some(ws) = (unsafe { s.as_mut() }).filter(|x| x.magic == STREAM_MAGIC) else {
            return 0;
        };
        ws.magic = 0;
        // SAFETY: made by Box::into_raw in wd_comp_stream_new.
        let b = unsafe { Box::from_raw(s) };
        // SAFETY: caller contract.
        if let (Some(w), Some(stream)) = (unsafe { comp(c) }, b.s) {
            w.c.close_stream(stream);
        }
        0
    });
}

#[cfg(test)]
mod tests {
    use super::disjoint;

    #[test]
    fn outputs_alias_nothing() {
        // Inputs may share bytes; outputs may touch but not overlap.
        assert!(disjoint(&[(0, 10), (5, 10)], &[(100, 10), (110, 5)]));
        assert!(!disjoint(&[], &[(100, 10), (109, 5)]));
        assert!(!disjoint(&[(105, 1)], &[(100, 10)]));
        assert!(!disjoint(&[(90, 11)], &[(100, 10)]));
        assert!(disjoint(&[(90, 10), (110, 3)], &[(100, 10)]));
        // An input inside the gap between two outputs, and around one.
        assert!(disjoint(&[(20, 5)], &[(0, 20), (25, 5)]));
        assert!(!disjoint(&[(10, 100)], &[(0, 5), (50, 1)]));
        // Empty ranges overlap nothing; ends saturate.
        assert!(disjoint(&[(100, 0)], &[(100, 0), (100, 1)]));
        assert!(!disjoint(&[(usize::MAX - 1, 1)], &[(usize::MAX - 1, 5)]));
    }
}
