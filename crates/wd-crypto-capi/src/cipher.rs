//! Block cipher sessions, jobs started without waiting, and the event-loop
//! support of `wd_cipher_start`.

use std::ffi::{c_char, c_int, c_void};
use std::os::fd::RawFd;

use crate::*;
use wrapdrive::Status;

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
        crate::arenas::install();
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
        if iv.is_null() || iv_len < cur.len() || wraps(iv, cur.len()) {
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
            with_buffers(
                if offload {
                    "wd_cipher_offload"
                } else {
                    "wd_cipher_update"
                },
                inp,
                out,
                len,
                |i, o| {
                    if offload {
                        c.c.update_offload(i, o)
                    } else {
                        c.c.update(i, o)
                    }
                },
            )
        };
        match r {
            Err(rc) => rc,
            Ok(Ok(_)) => 0,
            Ok(Err(e)) => err(e),
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
            Some(b) if offload => Ok(c.c.start_in_place_offload(b)),
            Some(b) => Ok(c.c.start_in_place(b)),
            // SAFETY: caller contract.
            None => unsafe {
                with_buffers(
                    if offload {
                        "wd_cipher_start_offload"
                    } else {
                        "wd_cipher_start"
                    },
                    inp,
                    out,
                    len,
                    |i, o| {
                        if offload {
                            c.c.start_offload(i, o)
                        } else {
                            c.c.start(i, o)
                        }
                    },
                )
            },
        };
        match started {
            Err(rc) => rc,
            Ok(Err(e)) => err(e),
            Ok(Ok(j)) if j.is_done() => {
                // SAFETY: job is non-null.
                unsafe { job.write(std::ptr::null_mut()) };
                0
            }
            // SAFETY: job is non-null (checked above).
            Ok(Ok(j)) => unsafe {
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
    if w.job.as_ref().is_some_and(|j| !j.on_this_thread()) {
        // Its slots are on the starting thread's queue: that thread
        // finishes it (the job stays).
        return err(CryptoError::Device {
            status: Status::BadState,
            message: "wd_job: finish a job on the thread that started it".into(),
        });
    }
    let Some(job) = w.job.take() else {
        return invalid("wd_job: already finished");
    };
    // A job of no bytes may have been given NULL, which no slice may hold.
    let out: &mut [u8] = if w.len == 0 {
        &mut []
    } else {
        // SAFETY: the output stays valid until the job finishes (header).
        unsafe { std::slice::from_raw_parts_mut(w.out, w.len) }
    };
    let r = if block {
        c.c.finish(job, out).map(|_| 0).map_err(Some)
    } else {
        match c.c.poll(job, out) {
            Ok(_) => Ok(0),
            Err((job, None)) => {
                w.job = Some(job);
                return -Status::Again.errno();
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
    guard_with(
        || match crypto::lane::with_lane(crypto::lane::Kind::Cipher, |l| l.wait_fd()) {
            Ok(Ok(fd)) => fd as RawFd,
            Ok(Err(e)) => err(e),
            Err(_) => fail(Status::HostGone.errno(), "no queue on this thread"),
        },
    )
}

/// Arm the wait descriptor.
#[no_mangle]
pub extern "C" fn wd_crypto_arm() -> c_int {
    guard_with(|| {
        match crypto::lane::with_open_lane(crypto::lane::Kind::Cipher, |l| l.arm_or_kick()) {
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
        match crypto::lane::with_open_lane(crypto::lane::Kind::Cipher, |l| l.after_inline()) {
            Ok(Ok(ready)) => ready as c_int,
            _ => 0,
        }
    })
}

/// Hold the wait descriptor readable, or give a hold back (see the
/// header).
#[no_mangle]
pub extern "C" fn wd_crypto_hold_readable(on: c_int) -> c_int {
    guard_with(|| {
        match crypto::lane::with_open_lane(crypto::lane::Kind::Cipher, |l| l.hold_readable(on != 0))
        {
            Ok(Ok(())) => 0,
            Ok(Err(e)) => err(e),
            Err(_) => fail(Status::HostGone.errno(), "no queue on this thread"),
        }
    })
}

/// Disarm the wait descriptor.
#[no_mangle]
pub extern "C" fn wd_crypto_disarm() {
    guard_with(|| {
        let _ = crypto::lane::with_open_lane(crypto::lane::Kind::Cipher, |l| {
            l.disarm();
            Ok(())
        });
        0
    });
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
