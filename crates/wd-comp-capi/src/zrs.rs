//! zlib-rs's zlib API, for libwdz, on streams the offload path cannot
//! take: an inflate stream fed in pieces cannot wait for its whole input
//! (a protocol parser reads what it needs and no more), nor can one
//! decoded through `inflateBack` (its input comes from a callback as the
//! decoder asks), and a deflate stream past what one request carries
//! cannot be one request. zlib-rs
//! runs them here at about 1.5 to 2 times the system zlib's speed, with
//! zlib's own API and semantics (return codes, flushes, `Z_NEED_DICT`,
//! sync, prime, mark, copy, params, pending).
//! These entry points are libwdz's only (`wd__` names, not in
//! `wd_comp.h`, version node `WD_COMP_PRIVATE`); each takes a `z_stream`
//! that libwdz owns and keeps in step with the caller's.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_long, c_uint, c_ulong};

use libz_rs_sys::{gz_headerp, z_stream, Bytef};

/// One `wd__zrs_<name>` per zlib function, forwarding to zlib-rs's.
macro_rules! forward {
    ($($name:ident => $target:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {$(
        #[doc = concat!("zlib-rs's `", stringify!($target), "`.")]
        ///
        /// # Safety
        /// As zlib's for the same function.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            // SAFETY: the caller's contract is zlib's, which zlib-rs implements.
            unsafe { libz_rs_sys::$target($($arg),*) }
        }
    )*};
}

forward! {
    wd__zrs_inflateInit2_ => inflateInit2_(strm: *mut z_stream, window_bits: c_int, version: *const c_char, stream_size: c_int) -> c_int;
    wd__zrs_inflate => inflate(strm: *mut z_stream, flush: c_int) -> c_int;
    wd__zrs_inflateEnd => inflateEnd(strm: *mut z_stream) -> c_int;
    wd__zrs_inflateReset => inflateReset(strm: *mut z_stream) -> c_int;
    wd__zrs_inflateResetKeep => inflateResetKeep(strm: *mut z_stream) -> c_int;
    wd__zrs_inflateCopy => inflateCopy(dest: *mut z_stream, source: *const z_stream) -> c_int;
    wd__zrs_inflateSetDictionary => inflateSetDictionary(strm: *mut z_stream, dictionary: *const Bytef, dict_length: u32) -> c_int;
    wd__zrs_inflateGetDictionary => inflateGetDictionary(strm: *const z_stream, dictionary: *mut Bytef, dict_length: *mut u32) -> c_int;
    wd__zrs_inflateSync => inflateSync(strm: *mut z_stream) -> c_int;
    wd__zrs_inflateSyncPoint => inflateSyncPoint(strm: *mut z_stream) -> c_int;
    wd__zrs_inflatePrime => inflatePrime(strm: *mut z_stream, bits: c_int, value: c_int) -> c_int;
    wd__zrs_inflateMark => inflateMark(strm: *const z_stream) -> c_long;
    wd__zrs_inflateUndermine => inflateUndermine(strm: *mut z_stream, subvert: c_int) -> c_int;
    wd__zrs_inflateValidate => inflateValidate(strm: *mut z_stream, check: c_int) -> c_int;
    wd__zrs_inflateCodesUsed => inflateCodesUsed(strm: *mut z_stream) -> c_ulong;
    wd__zrs_deflateInit2_ => deflateInit2_(strm: *mut z_stream, level: c_int, method: c_int, window_bits: c_int, mem_level: c_int, strategy: c_int, version: *const c_char, stream_size: c_int) -> c_int;
    wd__zrs_deflate => deflate(strm: *mut z_stream, flush: c_int) -> c_int;
    wd__zrs_deflateEnd => deflateEnd(strm: *mut z_stream) -> c_int;
    wd__zrs_deflateParams => deflateParams(strm: *mut z_stream, level: c_int, strategy: c_int) -> c_int;
    wd__zrs_deflateSetDictionary => deflateSetDictionary(strm: *mut z_stream, dictionary: *const Bytef, dict_length: u32) -> c_int;
    wd__zrs_deflateGetDictionary => deflateGetDictionary(strm: *const z_stream, dictionary: *mut Bytef, dict_length: *mut u32) -> c_int;
    wd__zrs_deflateSetHeader => deflateSetHeader(strm: *mut z_stream, head: gz_headerp) -> c_int;
    wd__zrs_deflatePrime => deflatePrime(strm: *mut z_stream, bits: c_int, value: c_int) -> c_int;
    wd__zrs_deflateTune => deflateTune(strm: *mut z_stream, good_length: c_int, max_lazy: c_int, nice_length: c_int, max_chain: c_int) -> c_int;
    wd__zrs_deflateBound => deflateBound(strm: *mut z_stream, source_len: c_ulong) -> c_ulong;
    wd__zrs_deflatePending => deflatePending(strm: *mut z_stream, pending: *mut c_uint, bits: *mut c_int) -> c_int;
    wd__zrs_deflateCopy => deflateCopy(dest: *mut z_stream, source: *mut z_stream) -> c_int;
}
