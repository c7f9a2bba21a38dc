//! The C API of `include/wd_crypto.h` over `wd-crypto`.
//!
//! Sessions are boxed objects with a magic word, so a NULL or foreign
//! pointer is -EINVAL rather than a crash; a freed one is undefined, as in
//! any C library. Input and output may alias: aliased input is copied to
//! a per-thread scratch buffer first (Rust slices may not alias).

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::os::fd::RawFd;

use wd_crypto::route::{self, Kind, Route};
use wd_crypto::{config, Aead, Cipher, CryptoError, Digest, Direction, Job, Policy, Why};

use crate::{fail, guard_with, EINVAL};

const CIPHER_MAGIC: u64 = 0x5744_4349_5048_4552; // "WDCIPHER"
const AEAD_MAGIC: u64 = 0x5744_4145_4144_0000;
const DIGEST_MAGIC: u64 = 0x5744_4449_4745_5354;
const JOB_MAGIC: u64 = 0x5744_4a4f_4200_0000;

/// `struct wd_cipher`.
pub struct WdCipher {
    magic: u64,
    c: Cipher,
}

/// `struct wd_aead`.
pub struct WdAead {
    magic: u64,
    a: Aead,
}

/// `struct wd_digest`.
pub struct WdDigest {
    magic: u64,
    d: Digest,
}

/// `struct wd_job`.
pub struct WdJob {
    magic: u64,
    cipher: *mut WdCipher,
    job: Option<Job>,
    out: *mut u8,
    len: usize,
}

/// Hand a new object to the caller through `out`; returns 0.
///
/// # Safety
/// `out` must be non-null and writable.
unsafe fn give<T>(out: *mut *mut T, v: T) -> c_int {
    // SAFETY: caller contract.
    unsafe { out.write(Box::into_raw(Box::new(v))) };
    0
}

fn err(e: CryptoError) -> c_int {
    fail(e.errno(), &e.to_string())
}

fn invalid(msg: &str) -> c_int {
    fail(EINVAL, msg)
}

thread_local! {
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The buffer of an exactly in-place request (`inp == out`).
///
/// # Safety
/// `out` writable for `len` bytes when non-null.
unsafe fn in_place<'a>(inp: *const c_void, out: *mut c_void, len: usize) -> Option<&'a mut [u8]> {
    if len == 0 || out.is_null() || !std::ptr::eq(inp, out.cast_const()) {
        return None;
    }
    // SAFETY: caller contract.
    Some(unsafe { std::slice::from_raw_parts_mut(out as *mut u8, len) })
}

/// Run `f(input, output)` over C buffers that may alias.
///
/// # Safety
/// `inp` readable and `out` writable for `len` bytes (or `len == 0`).
unsafe fn with_buffers<T>(
    inp: *const c_void,
    out: *mut c_void,
    len: usize,
    f: impl FnOnce(&[u8], &mut [u8]) -> T,
) -> Option<T> {
    if len == 0 {
        return Some(f(&[], &mut []));
    }
    if inp.is_null() || out.is_null() {
        return None;
    }
    let (i, o) = (inp as usize, out as usize);
    let overlap = i < o + len && o < i + len;
    if !overlap {
        // SAFETY: caller contract; the ranges are disjoint.
        let (src, dst) = unsafe {
            (
                std::slice::from_raw_parts(inp as *const u8, len),
                std::slice::from_raw_parts_mut(out as *mut u8, len),
            )
        };
        return Some(f(src, dst));
    }
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        s.clear();
        // SAFETY: caller contract; the input is copied before the output
        // slice exists.
        s.extend_from_slice(unsafe { std::slice::from_raw_parts(inp as *const u8, len) });
        // SAFETY: caller contract.
        let dst = unsafe { std::slice::from_raw_parts_mut(out as *mut u8, len) };
        Some(f(&s, dst))
    })
}

/// # Safety
/// `p` readable for `len` bytes when non-null.
unsafe fn bytes<'a>(p: *const c_void, len: usize) -> Option<&'a [u8]> {
    if len == 0 {
        return Some(&[]);
    }
    if p.is_null() {
        return None;
    }
    // SAFETY: caller contract.
    Some(unsafe { std::slice::from_raw_parts(p as *const u8, len) })
}

/// # Safety
/// `p` a NUL-terminated string when non-null.
unsafe fn name<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: caller contract.
    unsafe { CStr::from_ptr(p) }.to_str().ok()
}

/// # Safety
/// `c` NULL or a pointer from `wd_cipher_new`.
unsafe fn cipher<'a>(c: *mut WdCipher) -> Option<&'a mut WdCipher> {
    // SAFETY: checked for NULL; the magic word rejects foreign pointers.
    unsafe { c.as_mut() }.filter(|c| c.magic == CIPHER_MAGIC)
}

/// # Safety
/// `a` NULL or a pointer from `wd_aead_new`.
unsafe fn aead<'a>(a: *mut WdAead) -> Option<&'a mut WdAead> {
    // SAFETY: as for cipher.
    unsafe { a.as_mut() }.filter(|a| a.magic == AEAD_MAGIC)
}

/// # Safety
/// `d` NULL or a pointer from `wd_digest_new`.
unsafe fn digest<'a>(d: *mut WdDigest) -> Option<&'a mut WdDigest> {
    // SAFETY: as for cipher.
    unsafe { d.as_mut() }.filter(|d| d.magic == DIGEST_MAGIC)
}

fn dir(encrypt: c_int) -> Direction {
    if encrypt != 0 {
        Direction::Encrypt
    } else {
        Direction::Decrypt
    }
}

/// New cipher session.
///
/// # Safety
/// Pointers as `include/wd_crypto.h` documents.
#[no_mangle]
pub unsafe extern "C" fn wd_cipher_new(
    out: *mut *mut WdCipher,
    alg: *const c_char,
    key: *const c_void,
    key_len: usize,
    encrypt: c_int,
) -> c_int {
    guard_with(|| {
        // SAFETY: caller contract (header).
        let (Some(alg), Some(key)) = (unsafe { name(alg) }, unsafe { bytes(key, key_len) }) else {
            return invalid("wd_cipher_new: NULL algorithm or key");
        };
        if out.is_null() {
            return invalid("wd_cipher_new: NULL out-pointer");
        }
        match Cipher::new(alg, key, dir(encrypt)) {
            Ok(c) => {
                // SAFETY: out was checked non-null.
                unsafe {
                    give(
                        out,
                        WdCipher {
                            magic: CIPHER_MAGIC,
                            c,
                        },
                    )
                }
            }
            Err(e) => err(e),
        }
    })
}

/// Set the IV.
///
/// # Safety
/// Pointers as `include/wd_crypto.h` documents.
#[no_mangle]
pub unsafe extern "C" fn wd_cipher_set_iv(
    c: *mut WdCipher,
    iv: *const c_void,
    iv_len: usize,
) -> c_int {
    guard_with(|| {
        // SAFETY: caller contract.
        let (Some(c), Some(iv)) = (unsafe { cipher(c) }, unsafe { bytes(iv, iv_len) }) else {
            return invalid("wd_cipher_set_iv: bad session or NULL IV");
        };
        c.c.set_iv(iv).map_or_else(err, |_| 0)
    })
}

/// Change direction.
///
/// # Safety
/// Pointers as `include/wd_crypto.h` documents.
#[no_mangle]
pub unsafe extern "C" fn wd_cipher_set_encrypt(c: *mut WdCipher, encrypt: c_int) -> c_int {
    guard_with(|| {
        // SAFETY: caller contract.
        let Some(c) = (unsafe { cipher(c) }) else {
            return invalid("wd_cipher_set_encrypt: bad session");
        };
        c.c.set_direction(dir(encrypt)).map_or_else(err, |_| 0)
    })
}

/// Read the chaining value.
///
/// # Safety
/// Pointers as `include/wd_crypto.h` documents.
#[no_mangle]
pub unsafe extern "C" fn wd_cipher_get_iv(
    c: *mut WdCipher,
    iv: *mut c_void,
    iv_len: usize,
) -> c_int {
    guard_with(|| {
        // SAFETY: caller contract.
        let Some(c) = (unsafe { cipher(c) }) else {
            return invalid("wd_cipher_get_iv: bad session");
        };
        let cur = c.c.iv();
        if iv.is_null() || iv_len < cur.len() {
            return invalid("wd_cipher_get_iv: NULL or short buffer");
        }
        // SAFETY: iv has room for iv_len >= cur.len() bytes.
        unsafe { std::ptr::copy_nonoverlapping(cur.as_ptr(), iv as *mut u8, cur.len()) };
        cur.len() as c_int
    })
}

/// Process data, waiting.
///
/// # Safety
/// Pointers as `include/wd_crypto.h` documents.
#[no_mangle]
pub unsafe extern "C" fn wd_cipher_update(
    c: *mut WdCipher,
    inp: *const c_void,
    out: *mut c_void,
    len: usize,
) -> c_int {
    // SAFETY: caller contract.
    unsafe { cipher_update(c, inp, out, len, false) }
}

/// Process data on the device, waiting.
///
/// # Safety
/// Pointers as `include/wd_crypto.h` documents.
#[no_mangle]
pub unsafe extern "C" fn wd_cipher_offload(
    c: *mut WdCipher,
    inp: *const c_void,
    out: *mut c_void,
    len: usize,
) -> c_int {
    // SAFETY: caller contract.
    unsafe { cipher_update(c, inp, out, len, true) }
}

/// # Safety
/// Pointers as `include/wd_crypto.h` documents.
unsafe fn cipher_update(
    c: *mut WdCipher,
    inp: *const c_void,
    out: *mut c_void,
    len: usize,
    offload: bool,
) -> c_int {
    guard_with(|| {
        // SAFETY: caller contract.
        let Some(c) = (unsafe { cipher(c) }) else {
            return invalid("wd_cipher_update: bad session");
        };
        // SAFETY: caller contract.
        if let Some(b) = unsafe { in_place(inp, out, len) } {
            let r = if offload {
                c.c.update_in_place_offload(b)
            } else {
                c.c.update_in_place(b)
            };
            return r.map_or_else(err, |_| 0);
        }
        // SAFETY: caller contract.
        let r = unsafe {
            with_buffers(inp, out, len, |i, o| {
                if offload {
                    c.c.update_offload(i, o)
                } else {
                    c.c.update(i, o)
                }
            })
        };
        match r {
            None => invalid("wd_cipher_update: NULL buffer"),
            Some(Ok(_)) => 0,
            Some(Err(e)) => err(e),
        }
    })
}

/// Start a request.
///
/// # Safety
/// Pointers as `include/wd_crypto.h` documents.
#[no_mangle]
pub unsafe extern "C" fn wd_cipher_start(
    c: *mut WdCipher,
    inp: *const c_void,
    out: *mut c_void,
    len: usize,
    job: *mut *mut WdJob,
) -> c_int {
    // SAFETY: caller contract.
    unsafe { cipher_start(c, inp, out, len, job, false) }
}

/// Start a request on the device.
///
/// # Safety
/// Pointers as `include/wd_crypto.h` documents.
#[no_mangle]
pub unsafe extern "C" fn wd_cipher_start_offload(
    c: *mut WdCipher,
    inp: *const c_void,
    out: *mut c_void,
    len: usize,
    job: *mut *mut WdJob,
) -> c_int {
    // SAFETY: caller contract.
    unsafe { cipher_start(c, inp, out, len, job, true) }
}

/// # Safety
/// Pointers as `include/wd_crypto.h` documents.
unsafe fn cipher_start(
    c: *mut WdCipher,
    inp: *const c_void,
    out: *mut c_void,
    len: usize,
    job: *mut *mut WdJob,
    offload: bool,
) -> c_int {
    guard_with(|| {
        let cp = c;
        // SAFETY: caller contract.
        let Some(c) = (unsafe { cipher(c) }) else {
            return invalid("wd_cipher_start: bad session");
        };
        if job.is_null() {
            return invalid("wd_cipher_start: NULL job pointer");
        }
        // SAFETY: caller contract.
        let started = match unsafe { in_place(inp, out, len) } {
            Some(b) if offload => Some(c.c.start_in_place_offload(b)),
            Some(b) => Some(c.c.start_in_place(b)),
            // SAFETY: caller contract.
            None => unsafe {
                with_buffers(inp, out, len, |i, o| {
                    if offload {
                        c.c.start_offload(i, o)
                    } else {
                        c.c.start(i, o)
                    }
                })
            },
        };
        match started {
            None => invalid("wd_cipher_start: NULL buffer"),
            Some(Err(e)) => err(e),
            Some(Ok(j)) if j.is_done() => {
                // SAFETY: job is non-null.
                unsafe { job.write(std::ptr::null_mut()) };
                0
            }
            // SAFETY: job is non-null (checked above).
            Some(Ok(j)) => unsafe {
                give(
                    job,
                    WdJob {
                        magic: JOB_MAGIC,
                        cipher: cp,
                        job: Some(j),
                        out: out as *mut u8,
                        len,
                    },
                )
            },
        }
    })
}

/// # Safety
/// `j` from wd_cipher_start; its session and output still valid.
unsafe fn job_step(j: *mut WdJob, block: bool) -> c_int {
    // SAFETY: checked for NULL and magic.
    let Some(w) = (unsafe { j.as_mut() }).filter(|w| w.magic == JOB_MAGIC) else {
        return invalid("wd_job: bad job");
    };
    // SAFETY: the session outlives its jobs (header).
    let Some(c) = (unsafe { cipher(w.cipher) }) else {
        return invalid("wd_job: its session was freed");
    };
    let Some(job) = w.job.take() else {
        return invalid("wd_job: already finished");
    };
    // SAFETY: the output stays valid until the job finishes (header).
    let out = unsafe { std::slice::from_raw_parts_mut(w.out, w.len) };
    let r = if block {
        c.c.finish(job, out).map(|_| 0).map_err(Some)
    } else {
        match c.c.poll(job, out) {
            Ok(_) => Ok(0),
            Err((job, None)) => {
                w.job = Some(job);
                return -wrapdrive::Status::Again.errno();
            }
            Err((_, e)) => Err(e),
        }
    };
    w.magic = 0;
    // SAFETY: allocated by wd_cipher_start; freed once (magic cleared).
    drop(unsafe { Box::from_raw(j) });
    match r {
        Ok(v) => v,
        Err(Some(e)) => err(e),
        Err(None) => invalid("wd_job: failed"),
    }
}

/// Poll a job.
///
/// # Safety
/// Pointers as `include/wd_crypto.h` documents.
#[no_mangle]
pub unsafe extern "C" fn wd_job_poll(job: *mut WdJob) -> c_int {
    // SAFETY: caller contract.
    guard_with(|| unsafe { job_step(job, false) })
}

/// Wait for a job.
///
/// # Safety
/// Pointers as `include/wd_crypto.h` documents.
#[no_mangle]
pub unsafe extern "C" fn wd_job_wait(job: *mut WdJob) -> c_int {
    // SAFETY: caller contract.
    guard_with(|| unsafe { job_step(job, true) })
}

/// Free a cipher session.
///
/// # Safety
/// Pointers as `include/wd_crypto.h` documents.
#[no_mangle]
pub unsafe extern "C" fn wd_cipher_free(c: *mut WdCipher) {
    guard_with(|| {
        // SAFETY: caller contract.
        if let Some(w) = unsafe { cipher(c) } {
            w.magic = 0;
            // SAFETY: allocated by wd_cipher_new; freed once.
            drop(unsafe { Box::from_raw(c) });
        }
        0
    });
}

/// The thread's wait descriptor.
#[no_mangle]
pub extern "C" fn wd_crypto_wait_fd() -> c_int {
    guard_with(|| {
        match wd_crypto::lane::with_lane(wd_crypto::lane::Kind::Cipher, |l| l.wait_fd()) {
            Ok(Ok(fd)) => fd as RawFd,
            Ok(Err(e)) => err(e),
            Err(_) => fail(
                wrapdrive::Status::HostGone.errno(),
                "no queue on this thread",
            ),
        }
    })
}

/// Arm the wait descriptor.
#[no_mangle]
pub extern "C" fn wd_crypto_arm() -> c_int {
    guard_with(|| {
        match wd_crypto::lane::with_open_lane(wd_crypto::lane::Kind::Cipher, |l| l.arm_or_kick()) {
            Ok(Ok(ready)) => ready as c_int,
            Ok(Err(e)) => err(e),
            // No queue: nothing to wait for.
            Err(_) => 1,
        }
    })
}

/// After an inline request inside an event loop (see the header).
#[no_mangle]
pub extern "C" fn wd_crypto_after_inline() -> c_int {
    guard_with(|| {
        match wd_crypto::lane::with_open_lane(wd_crypto::lane::Kind::Cipher, |l| l.after_inline()) {
            Ok(Ok(ready)) => ready as c_int,
            _ => 0,
        }
    })
}

/// Disarm the wait descriptor.
#[no_mangle]
pub extern "C" fn wd_crypto_disarm() {
    guard_with(|| {
        let _ = wd_crypto::lane::with_open_lane(wd_crypto::lane::Kind::Cipher, |l| {
            l.disarm();
            Ok(())
        });
        0
    });
}

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
        if tag.is_null() {
            return invalid("wd_aead_seal: NULL tag");
        }
        // SAFETY: tag writable for tag_len bytes (header).
        let tag = unsafe { std::slice::from_raw_parts_mut(tag as *mut u8, tag_len) };
        // SAFETY: caller contract.
        match unsafe { with_buffers(pt, ct, len, |p, c| a.a.seal(iv, aad, p, c, tag)) } {
            None => invalid("wd_aead_seal: NULL buffer"),
            Some(Ok(())) => 0,
            Some(Err(e)) => err(e),
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
        match unsafe { with_buffers(ct, pt, len, |c, p| a.a.open(iv, aad, c, tag, p)) } {
            None => invalid("wd_aead_open: NULL buffer"),
            Some(Ok(())) => 0,
            Some(Err(e)) => err(e),
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
        match unsafe { with_buffers(inp, out, len, |i, o| a.a.update(i, o)) } {
            None => invalid("wd_aead_update: NULL buffer"),
            Some(Ok(_)) => 0,
            Some(Err(e)) => err(e),
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
        if tag.is_null() {
            return invalid("wd_aead_finish: NULL tag");
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
        if out.is_null() || out_len < d.d.len() {
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

/// Set the threshold.
#[no_mangle]
pub extern "C" fn wd_crypto_set_threshold(bytes: usize) -> c_int {
    config::set_threshold(bytes);
    0
}

/// Allow or forbid the CPU fallback without a queue.
#[no_mangle]
pub extern "C" fn wd_crypto_set_fallback(on: c_int) -> c_int {
    config::set_fallback(on != 0);
    0
}

/// Set the policy.
#[no_mangle]
pub extern "C" fn wd_crypto_set_policy(policy: c_int) -> c_int {
    let p = match policy {
        0 => Policy::Auto,
        1 => Policy::Offload,
        2 => Policy::Cpu,
        _ => return invalid("wd_crypto_set_policy: unknown policy"),
    };
    config::set_policy(p);
    0
}

/// `struct wd_crypto_stats`.
#[repr(C)]
pub struct WdCryptoStats {
    offload_requests: u64,
    offload_bytes: u64,
    cpu_requests: u64,
    cpu_bytes: u64,
    cpu_below_threshold: u64,
    cpu_no_queue: u64,
    cpu_host_gone: u64,
    cpu_policy: u64,
}

/// Read the counters.
///
/// # Safety
/// Pointers as `include/wd_crypto.h` documents.
#[no_mangle]
pub unsafe extern "C" fn wd_crypto_get_stats(out: *mut WdCryptoStats) -> c_int {
    if out.is_null() {
        return invalid("wd_crypto_get_stats: NULL out-pointer");
    }
    let s = wd_crypto::stats();
    let v = WdCryptoStats {
        offload_requests: s.offload_requests,
        offload_bytes: s.offload_bytes,
        cpu_requests: s.cpu_requests,
        cpu_bytes: s.cpu_bytes,
        cpu_below_threshold: s.cpu_below_threshold,
        cpu_no_queue: s.cpu_no_queue,
        cpu_host_gone: s.cpu_host_gone,
        cpu_policy: s.cpu_policy,
    };
    // SAFETY: out is non-null and caller-owned.
    unsafe { out.write_unaligned(v) };
    0
}

/// Chain of a stream.
///
/// # Safety
/// Pointers as `include/wd_crypto.h` documents.
#[no_mangle]
pub unsafe extern "C" fn wd_cipher_get_chain(
    c: *mut WdCipher,
    iv: *mut c_void,
    num: *mut usize,
) -> c_int {
    guard_with(|| {
        // SAFETY: caller contract.
        let Some(c) = (unsafe { cipher(c) }) else {
            return invalid("wd_cipher_get_chain: bad session");
        };
        if iv.is_null() || num.is_null() {
            return invalid("wd_cipher_get_chain: NULL out-pointer");
        }
        match c.c.chain() {
            Ok((v, n)) => {
                // SAFETY: iv has room for 16 bytes, num for a size_t (header).
                unsafe {
                    std::ptr::copy_nonoverlapping(v.as_ptr(), iv as *mut u8, 16);
                    num.write(n);
                }
                0
            }
            Err(e) => err(e),
        }
    })
}

/// Continue a stream from a chain.
///
/// # Safety
/// Pointers as `include/wd_crypto.h` documents.
#[no_mangle]
pub unsafe extern "C" fn wd_cipher_set_chain(
    c: *mut WdCipher,
    iv: *const c_void,
    num: usize,
) -> c_int {
    guard_with(|| {
        // SAFETY: caller contract.
        let (Some(c), Some(iv)) = (unsafe { cipher(c) }, unsafe { bytes(iv, 16) }) else {
            return invalid("wd_cipher_set_chain: bad session or NULL IV");
        };
        let iv: &[u8; 16] = iv.try_into().expect("16 bytes");
        c.c.set_chain(iv, num).map_or_else(err, |_| 0)
    })
}

fn kind(k: c_int) -> Option<Kind> {
    match k {
        0 => Some(Kind::Cipher),
        1 => Some(Kind::Digest),
        _ => None,
    }
}

fn why_code(w: Why) -> c_int {
    match w {
        Why::Threshold => 1,
        Why::NoQueue => 2,
        Why::HostGone => 3,
        Why::Policy => 4,
    }
}

/// Route a request.
#[no_mangle]
pub extern "C" fn wd_crypto_route(k: c_int, len: usize, asynchronous: c_int) -> c_int {
    guard_with(|| {
        let Some(k) = kind(k) else {
            return invalid("wd_crypto_route: unknown kind");
        };
        let (r, timed) = route::choose_timed(k, len, asynchronous != 0);
        let t = if timed { 0x200 } else { 0 };
        match r {
            Route::Device => 0x100 | t,
            Route::Cpu(w) => why_code(w) | t,
        }
    })
}

/// Report a timed request.
#[no_mangle]
pub extern "C" fn wd_crypto_record(k: c_int, len: usize, on_cpu: c_int, ns: u64) {
    guard_with(|| {
        if let Some(k) = kind(k) {
            route::record(k, len, on_cpu != 0, std::time::Duration::from_nanos(ns));
        }
        0
    });
}

/// Count requests computed by the caller.
#[no_mangle]
pub extern "C" fn wd_crypto_count_cpu(requests: u64, bytes: u64, reason: c_int) {
    let w = match reason {
        1 => Why::Threshold,
        2 => Why::NoQueue,
        3 => Why::HostGone,
        _ => Why::Policy,
    };
    wd_crypto::count_cpu(requests, bytes, w);
}

/// The threshold.
#[no_mangle]
pub extern "C" fn wd_crypto_get_threshold() -> usize {
    config::threshold()
}

/// The policy.
#[no_mangle]
pub extern "C" fn wd_crypto_get_policy() -> c_int {
    config::policy() as c_int
}
