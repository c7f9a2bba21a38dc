//! zlib-rs's inflate, for libwdz: an inflate stream fed in pieces cannot
//! wait for its whole input (a protocol parser reads what it needs and no
//! more), so it is not offloaded; zlib-rs decodes it here at about one and
//! a half times the system zlib's speed, with zlib's own API and
//! semantics (return codes, `Z_NEED_DICT`, sync, prime, mark, copy).
//! These entry points are libwdz's only (`wd__` names, not in
//! `wd_comp.h`, version node `WD_COMP_PRIVATE`); each takes a `z_stream`
//! that libwdz owns and keeps in step with the caller's.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_long, c_ulong};

use libz_rs_sys::{z_stream, Bytef};

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
}
