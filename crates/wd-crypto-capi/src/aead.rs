//! AES-GCM sessions.

use std::ffi::{c_char, c_int, c_void};

use crate::*;

/// New AEAD session.
///
/// # Safety
/// Pointers as `include/wd_crypto.h` documents.
#[no_mangle]
pub unsafe extern "C" fn wd_aead_new(
    out: *mut *mut WdAead,
    alg: *const c_char,
    key: *const c_void,
    key_len: usize,
) -> c_int {
    guard_with(|| {
        // SAFETY: caller contract.
        let (Some(alg), Some(key)) = (unsafe { name(alg) }, unsafe { bytes(key, key_len) }) else {
            return invalid("wd_aead_new: NULL algorithm or key");
        };
        if out.is_null() {
            return invalid("wd_aead_new: NULL out-pointer");
        }
        match Aead::new(alg, key) {
            Ok(a) => {
                // SAFETY: out was checked non-null.
                unsafe {
                    give(
                        out,
                        WdAead {
                            magic: AEAD_MAGIC,
                            a,
                        },
                    )
                }
            }
            Err(e) => err(e),
        }
    })
}

/// One-shot encryption.
///
/// # Safety
/// Pointers as `include/wd_crypto.h` documents.
#[no_mangle]
pub unsafe extern "C" fn wd_aead_seal(
    a: *mut WdAead,
    iv: *const c_void,
    iv_len: usize,
    aad: *const c_void,
    aad_len: usize,
    pt: *const c_void,
    ct: *mut c_void,
    len: usize,
    tag: *mut c_void,
    tag_len: usize,
) -> c_int {
    guard_with(|| {
        // SAFETY: caller contract.
        let (Some(a), Some(iv), Some(aad)) =
            (unsafe { aead(a) }, unsafe { bytes(iv, iv_len) }, unsafe {
                bytes(aad, aad_len)
            })
        else {
            return invalid("wd_aead_seal: bad session or NULL buffer");
        };
        if tag.is_null() || wraps(tag, tag_len) {
            return invalid("wd_aead_seal: NULL tag, or its range wraps");
        }
        // SAFETY: tag writable for tag_len bytes (header).
        let tag = unsafe { std::slice::from_raw_parts_mut(tag as *mut u8, tag_len) };
        // SAFETY: caller contract.
        match unsafe {
            with_buffers("wd_aead_seal", pt, ct, len, |p, c| {
                a.a.seal(iv, aad, p, c, tag)
            })
        } {
            Err(rc) => rc,
            Ok(Ok(())) => 0,
            Ok(Err(e)) => err(e),
        }
    })
}

/// One-shot decryption.
///
/// # Safety
/// Pointers as `include/wd_crypto.h` documents.
#[no_mangle]
pub unsafe extern "C" fn wd_aead_open(
    a: *mut WdAead,
    iv: *const c_void,
    iv_len: usize,
    aad: *const c_void,
    aad_len: usize,
    ct: *const c_void,
    pt: *mut c_void,
    len: usize,
    tag: *const c_void,
    tag_len: usize,
) -> c_int {
    guard_with(|| {
        // SAFETY: caller contract.
        let (Some(a), Some(iv), Some(aad), Some(tag)) = (
            unsafe { aead(a) },
            unsafe { bytes(iv, iv_len) },
            unsafe { bytes(aad, aad_len) },
            unsafe { bytes(tag, tag_len) },
        ) else {
            return invalid("wd_aead_open: bad session or NULL buffer");
        };
        // SAFETY: caller contract.
        match unsafe {
            with_buffers("wd_aead_open", ct, pt, len, |c, p| {
                a.a.open(iv, aad, c, tag, p)
            })
        } {
            Err(rc) => rc,
            Ok(Ok(())) => 0,
            Ok(Err(e)) => err(e),
        }
    })
}

/// Start an AEAD message.
///
/// # Safety
/// Pointers as `include/wd_crypto.h` documents.
#[no_mangle]
pub unsafe extern "C" fn wd_aead_begin(
    a: *mut WdAead,
    encrypt: c_int,
    iv: *const c_void,
    iv_len: usize,
) -> c_int {
    guard_with(|| {
        // SAFETY: caller contract.
        let (Some(a), Some(iv)) = (unsafe { aead(a) }, unsafe { bytes(iv, iv_len) }) else {
            return invalid("wd_aead_begin: bad session or NULL IV");
        };
        a.a.begin(dir(encrypt), iv).map_or_else(err, |_| 0)
    })
}

/// AEAD additional data.
///
/// # Safety
/// Pointers as `include/wd_crypto.h` documents.
#[no_mangle]
pub unsafe extern "C" fn wd_aead_aad(a: *mut WdAead, aad: *const c_void, len: usize) -> c_int {
    guard_with(|| {
        // SAFETY: caller contract.
        let (Some(a), Some(aad)) = (unsafe { aead(a) }, unsafe { bytes(aad, len) }) else {
            return invalid("wd_aead_aad: bad session or NULL data");
        };
        a.a.aad(aad).map_or_else(err, |_| 0)
    })
}

/// AEAD data.
///
/// # Safety
/// Pointers as `include/wd_crypto.h` documents.
#[no_mangle]
pub unsafe extern "C" fn wd_aead_update(
    a: *mut WdAead,
    inp: *const c_void,
    out: *mut c_void,
    len: usize,
) -> c_int {
    guard_with(|| {
        // SAFETY: caller contract.
        let Some(a) = (unsafe { aead(a) }) else {
            return invalid("wd_aead_update: bad session");
        };
        // SAFETY: caller contract.
        match unsafe { with_buffers("wd_aead_update", inp, out, len, |i, o| a.a.update(i, o)) } {
            Err(rc) => rc,
            Ok(Ok(_)) => 0,
            Ok(Err(e)) => err(e),
        }
    })
}

/// Finish an AEAD message.
///
/// # Safety
/// Pointers as `include/wd_crypto.h` documents.
#[no_mangle]
pub unsafe extern "C" fn wd_aead_finish(a: *mut WdAead, tag: *mut c_void, tag_len: usize) -> c_int {
    guard_with(|| {
        // SAFETY: caller contract.
        let Some(a) = (unsafe { aead(a) }) else {
            return invalid("wd_aead_finish: bad session");
        };
        if tag.is_null() || wraps(tag, tag_len) {
            return invalid("wd_aead_finish: NULL tag, or its range wraps");
        }
        // SAFETY: tag valid for tag_len bytes (header).
        let t = unsafe { std::slice::from_raw_parts_mut(tag as *mut u8, tag_len) };
        let r = match a.a.direction() {
            Direction::Encrypt => a.a.finish_seal(t),
            Direction::Decrypt => a.a.finish_open(t),
        };
        r.map_or_else(err, |_| 0)
    })
}

/// Free an AEAD session.
///
/// # Safety
/// Pointers as `include/wd_crypto.h` documents.
#[no_mangle]
pub unsafe extern "C" fn wd_aead_free(a: *mut WdAead) {
    guard_with(|| {
        // SAFETY: caller contract.
        if let Some(w) = unsafe { aead(a) } {
            w.magic = 0;
            // SAFETY: allocated by wd_aead_new; freed once.
            drop(unsafe { Box::from_raw(a) });
        }
        0
    });
}
