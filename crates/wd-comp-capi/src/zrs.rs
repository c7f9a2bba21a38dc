//! zlib-rs's inflate, for libwdz: an inflate stream fed in pieces cannot
//! wait for its whole input (a protocol parser reads what it needs and no
//! more), so it is not offloaded; zlib-rs decodes it here at about one and
//! a half times the system zlib's speed, with zlib's own API and
//! semantics (return codes, `Z_NEED_DICT`, sync, prime, mark, copy).
//! These entry points are libwdz's only (`wd__` names, not in
//! `wd_comp.h`); each takes a `z_stream` that libwdz owns and keeps in
//! step with the caller's.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_long, c_ulong};

use libz_rs_sys::{z_stream, Bytef};

/// `inflateInit2_`.
///
/// # Safety
/// As zlib's: `strm` a valid stream, `version` a C string or NULL.
#[no_mangle]
pub unsafe extern "C" fn wd__zrs_inflateInit2_(
    strm: *mut z_stream,
    window_bits: c_int,
    version: *const c_char,
    stream_size: c_int,
) -> c_int {
    // SAFETY: the caller's contract is zlib's, which zlib-rs implements.
    unsafe { libz_rs_sys::inflateInit2_(strm, window_bits, version, stream_size) }
}

/// `inflate`.
///
/// # Safety
/// As zlib's.
#[no_mangle]
pub unsafe extern "C" fn wd__zrs_inflate(strm: *mut z_stream, flush: c_int) -> c_int {
    // SAFETY: as above.
    unsafe { libz_rs_sys::inflate(strm, flush) }
}

/// `inflateEnd`.
///
/// # Safety
/// As zlib's.
#[no_mangle]
pub unsafe extern "C" fn wd__zrs_inflateEnd(strm: *mut z_stream) -> c_int {
    // SAFETY: as above.
    unsafe { libz_rs_sys::inflateEnd(strm) }
}

/// `inflateReset`.
///
/// # Safety
/// As zlib's.
#[no_mangle]
pub unsafe extern "C" fn wd__zrs_inflateReset(strm: *mut z_stream) -> c_int {
    // SAFETY: as above.
    unsafe { libz_rs_sys::inflateReset(strm) }
}

/// `inflateReset2`.
///
/// # Safety
/// As zlib's.
#[no_mangle]
pub unsafe extern "C" fn wd__zrs_inflateReset2(strm: *mut z_stream, window_bits: c_int) -> c_int {
    // SAFETY: as above.
    unsafe { libz_rs_sys::inflateReset2(strm, window_bits) }
}

/// `inflateResetKeep`.
///
/// # Safety
/// As zlib's.
#[no_mangle]
pub unsafe extern "C" fn wd__zrs_inflateResetKeep(strm: *mut z_stream) -> c_int {
    // SAFETY: as above.
    unsafe { libz_rs_sys::inflateResetKeep(strm) }
}

/// `inflateCopy`.
///
/// # Safety
/// As zlib's.
#[no_mangle]
pub unsafe extern "C" fn wd__zrs_inflateCopy(
    dest: *mut z_stream,
    source: *const z_stream,
) -> c_int {
    // SAFETY: as above.
    unsafe { libz_rs_sys::inflateCopy(dest, source) }
}

/// `inflateSetDictionary`.
///
/// # Safety
/// As zlib's.
#[no_mangle]
pub unsafe extern "C" fn wd__zrs_inflateSetDictionary(
    strm: *mut z_stream,
    dictionary: *const Bytef,
    dict_length: u32,
) -> c_int {
    // SAFETY: as above.
    unsafe { libz_rs_sys::inflateSetDictionary(strm, dictionary, dict_length) }
}

/// `inflateGetDictionary`.
///
/// # Safety
/// As zlib's.
#[no_mangle]
pub unsafe extern "C" fn wd__zrs_inflateGetDictionary(
    strm: *const z_stream,
    dictionary: *mut Bytef,
    dict_length: *mut u32,
) -> c_int {
    // SAFETY: as above.
    unsafe { libz_rs_sys::inflateGetDictionary(strm, dictionary, dict_length) }
}

/// `inflateSync`.
///
/// # Safety
/// As zlib's.
#[no_mangle]
pub unsafe extern "C" fn wd__zrs_inflateSync(strm: *mut z_stream) -> c_int {
    // SAFETY: as above.
    unsafe { libz_rs_sys::inflateSync(strm) }
}

/// `inflateSyncPoint`.
///
/// # Safety
/// As zlib's.
#[no_mangle]
pub unsafe extern "C" fn wd__zrs_inflateSyncPoint(strm: *mut z_stream) -> c_int {
    // SAFETY: as above.
    unsafe { libz_rs_sys::inflateSyncPoint(strm) }
}

/// `inflatePrime`.
///
/// # Safety
/// As zlib's.
#[no_mangle]
pub unsafe extern "C" fn wd__zrs_inflatePrime(
    strm: *mut z_stream,
    bits: c_int,
    value: c_int,
) -> c_int {
    // SAFETY: as above.
    unsafe { libz_rs_sys::inflatePrime(strm, bits, value) }
}

/// `inflateMark`.
///
/// # Safety
/// As zlib's.
#[no_mangle]
pub unsafe extern "C" fn wd__zrs_inflateMark(strm: *const z_stream) -> c_long {
    // SAFETY: as above.
    unsafe { libz_rs_sys::inflateMark(strm) }
}

/// `inflateUndermine`.
///
/// # Safety
/// As zlib's.
#[no_mangle]
pub unsafe extern "C" fn wd__zrs_inflateUndermine(strm: *mut z_stream, subvert: c_int) -> c_int {
    // SAFETY: as above.
    unsafe { libz_rs_sys::inflateUndermine(strm, subvert) }
}

/// `inflateValidate`.
///
/// # Safety
/// As zlib's.
#[no_mangle]
pub unsafe extern "C" fn wd__zrs_inflateValidate(strm: *mut z_stream, check: c_int) -> c_int {
    // SAFETY: as above.
    unsafe { libz_rs_sys::inflateValidate(strm, check) }
}

/// `inflateCodesUsed`.
///
/// # Safety
/// As zlib's.
#[no_mangle]
pub unsafe extern "C" fn wd__zrs_inflateCodesUsed(strm: *mut z_stream) -> c_ulong {
    // SAFETY: as above.
    unsafe { libz_rs_sys::inflateCodesUsed(strm) }
}
