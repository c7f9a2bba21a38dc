//! Digest and HMAC sessions.

use std::ffi::{c_char, c_int, c_void};

use crate::*;

/// New digest.
///
/// # Safety
/// Pointers as `include/wd_crypto.h` documents.
#[no_mangle]
pub unsafe extern "C" fn wd_digest_new(
    out: *mut *mut WdDigest,
    alg: *const c_char,
    key: *const c_void,
    key_len: usize,
) -> c_int {
    guard_with(|| {
        // SAFETY: caller contract.
        let (Some(alg), Some(key)) = (unsafe { name(alg) }, unsafe { bytes(key, key_len) }) else {
            return invalid("wd_digest_new: NULL algorithm, or NULL key with a length");
        };
        if out.is_null() {
            return invalid("wd_digest_new: NULL out-pointer");
        }
        crate::arenas::install();
        match Digest::new(alg, key) {
            Ok(d) => {
                // SAFETY: out was checked non-null.
                unsafe {
                    give(
                        out,
                        WdDigest {
                            magic: DIGEST_MAGIC,
                            d,
                        },
                    )
                }
            }
            Err(e) => err(e),
        }
    })
}

/// Digest data.
///
/// # Safety
/// Pointers as `include/wd_crypto.h` documents.
#[no_mangle]
pub unsafe extern "C" fn wd_digest_update(
    d: *mut WdDigest,
    data: *const c_void,
    len: usize,
) -> c_int {
    guard_with(|| {
        // SAFETY: caller contract.
        let (Some(d), Some(data)) = (unsafe { digest(d) }, unsafe { bytes(data, len) }) else {
            return invalid("wd_digest_update: bad session or NULL data");
        };
        d.d.update(data).map_or_else(err, |_| 0)
    })
}

/// Finish a digest.
///
/// # Safety
/// Pointers as `include/wd_crypto.h` documents.
#[no_mangle]
pub unsafe extern "C" fn wd_digest_final(
    d: *mut WdDigest,
    out: *mut c_void,
    out_len: usize,
) -> c_int {
    guard_with(|| {
        // SAFETY: caller contract.
        let Some(d) = (unsafe { digest(d) }) else {
            return invalid("wd_digest_final: bad session");
        };
        if out.is_null() || out_len < d.d.len() || wraps(out, d.d.len()) {
            return invalid("wd_digest_final: NULL or short output");
        }
        match d.d.finish() {
            Ok(v) => {
                // SAFETY: out has room for out_len >= v.len() bytes.
                unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), out as *mut u8, v.len()) };
                v.len() as c_int
            }
            Err(e) => err(e),
        }
    })
}

/// Digest size.
///
/// # Safety
/// Pointers as `include/wd_crypto.h` documents.
#[no_mangle]
pub unsafe extern "C" fn wd_digest_size(d: *mut WdDigest) -> c_int {
    guard_with(|| {
        // SAFETY: caller contract.
        match unsafe { digest(d) } {
            Some(d) => d.d.len() as c_int,
            None => invalid("wd_digest_size: bad session"),
        }
    })
}

/// Copy a digest.
///
/// # Safety
/// Pointers as `include/wd_crypto.h` documents.
#[no_mangle]
pub unsafe extern "C" fn wd_digest_dup(d: *mut WdDigest, out: *mut *mut WdDigest) -> c_int {
    guard_with(|| {
        // SAFETY: caller contract.
        let Some(d) = (unsafe { digest(d) }) else {
            return invalid("wd_digest_dup: bad session");
        };
        if out.is_null() {
            return invalid("wd_digest_dup: NULL out-pointer");
        }
        match d.d.try_clone() {
            Ok(c) => {
                // SAFETY: out was checked non-null.
                unsafe {
                    give(
                        out,
                        WdDigest {
                            magic: DIGEST_MAGIC,
                            d: c,
                        },
                    )
                }
            }
            Err(e) => err(e),
        }
    })
}

/// Free a digest.
///
/// # Safety
/// Pointers as `include/wd_crypto.h` documents.
#[no_mangle]
pub unsafe extern "C" fn wd_digest_free(d: *mut WdDigest) {
    guard_with(|| {
        // SAFETY: caller contract.
        if let Some(w) = unsafe { digest(d) } {
            w.magic = 0;
            // SAFETY: allocated by wd_digest_new; freed once.
            drop(unsafe { Box::from_raw(d) });
        }
        0
    });
}
