//! libwd_crypto.so: the C API of `include/wd_crypto.h` over `wd-crypto`,
//! its own library so that only programs that use the crypto libraries
//! link libcrypto (`libwd.so` does not).
//!
//! Sessions are boxed objects with a magic word, so a NULL or foreign
//! pointer is -EINVAL rather than a crash; a freed one is undefined, as in
//! any C library. Input and output may alias: aliased input is copied to
//! a per-thread scratch buffer first (Rust slices may not alias), kept
//! between calls up to `SCRATCH_KEEP`.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr};

use crypto::{Aead, Cipher, CryptoError, Digest, Direction, Job};

mod aead;
mod arenas;
mod cipher;
mod digest;
mod errors;
mod settings;

pub(crate) use errors::{fail, guard_with, EINVAL, ENOMEM};

pub(crate) const CIPHER_MAGIC: u64 = 0x5744_4349_5048_4552; // "WDCIPHER"
pub(crate) const AEAD_MAGIC: u64 = 0x5744_4145_4144_0000;
pub(crate) const DIGEST_MAGIC: u64 = 0x5744_4449_4745_5354;
pub(crate) const JOB_MAGIC: u64 = 0x5744_4a4f_4200_0000;

/// `struct wd_cipher`.
pub struct WdCipher {
    pub(crate) magic: u64,
    pub(crate) c: Cipher,
}

/// `struct wd_aead`.
pub struct WdAead {
    pub(crate) magic: u64,
    pub(crate) a: Aead,
}

/// `struct wd_digest`.
pub struct WdDigest {
    pub(crate) magic: u64,
    pub(crate) d: Digest,
}

/// `struct wd_job`.
pub struct WdJob {
    pub(crate) magic: u64,
    pub(crate) cipher: *mut WdCipher,
    pub(crate) job: Option<Job>,
    pub(crate) out: *mut u8,
    pub(crate) len: usize,
}

/// Hand a new object to the caller through `out`; returns 0.
///
/// # Safety
/// `out` must be non-null and writable.
pub(crate) unsafe fn give<T>(out: *mut *mut T, v: T) -> c_int {
    // SAFETY: caller contract.
    unsafe { out.write(Box::into_raw(Box::new(v))) };
    0
}

pub(crate) fn err(e: CryptoError) -> c_int {
    fail(e.errno(), &e.to_string())
}

pub(crate) fn invalid(msg: &str) -> c_int {
    fail(EINVAL, msg)
}

thread_local! {
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Most scratch capacity a thread keeps between calls, as libwdz's
/// `SCRATCH_KEEP`: enough that small overlapping calls allocate nothing,
/// while one huge call does not leave the thread holding its copy for
/// good.
pub(crate) const SCRATCH_KEEP: usize = 2 << 20;

/// A scratch buffer holding a copy of `src`: the thread's kept one when
/// it is there (none from a thread-key destructor, the locals gone).
/// `None` when the memory cannot be had: the caller's length is theirs
/// to choose, and an allocation failure must be an errno, not an abort.
fn scratch_copy(src: &[u8]) -> Option<Vec<u8>> {
    let mut s = SCRATCH
        .try_with(|s| std::mem::take(&mut *s.borrow_mut()))
        .unwrap_or_default();
    s.clear();
    if s.try_reserve_exact(src.len()).is_err() {
        // What the thread kept is still worth keeping.
        scratch_return(s);
        return None;
    }
    s.extend_from_slice(src);
    Some(s)
}

/// Give a scratch buffer back to the thread, unless it is too large to
/// keep.
fn scratch_return(s: Vec<u8>) {
    if s.capacity() <= SCRATCH_KEEP {
        let _ = SCRATCH.try_with(|k| *k.borrow_mut() = s);
    }
}

/// The errno for memory that cannot be had for `len` bytes of `what`.
fn no_memory(call: &str, what: &str, len: usize) -> c_int {
    fail(
        ENOMEM,
        &format!("{call}: cannot allocate {len} bytes for {what}"),
    )
}

/// Whether `[p, p + len)` wraps around the address space, or is longer
/// than any object can be: no buffer can be there (the ABI's rule: ptr +
/// len is checked, -EINVAL).
pub(crate) fn wraps<T>(p: *const T, len: usize) -> bool {
    len > isize::MAX as usize || (p as usize).checked_add(len).is_none()
}

/// The buffer of an exactly in-place request (`inp == out`).
///
/// # Safety
/// `out` writable for `len` bytes when non-null.
pub(crate) unsafe fn in_place<'a>(
    inp: *const c_void,
    out: *mut c_void,
    len: usize,
) -> Option<&'a mut [u8]> {
    if len == 0 || out.is_null() || wraps(out, len) || !std::ptr::eq(inp, out.cast_const()) {
        return None;
    }
    // SAFETY: caller contract.
    Some(unsafe { std::slice::from_raw_parts_mut(out as *mut u8, len) })
}

/// Run `f(input, output)` over C buffers that may alias. `Err` is the
/// negative errno, its message recorded (naming `call`): -EINVAL for a
/// NULL or wrapping buffer, -ENOMEM when overlapping input cannot be
/// copied.
///
/// # Safety
/// `inp` readable and `out` writable for `len` bytes (or `len == 0`).
pub(crate) unsafe fn with_buffers<T>(
    call: &str,
    inp: *const c_void,
    out: *mut c_void,
    len: usize,
    f: impl FnOnce(&[u8], &mut [u8]) -> T,
) -> Result<T, c_int> {
    if len == 0 {
        return Ok(f(&[], &mut []));
    }
    if inp.is_null() || out.is_null() || wraps(inp, len) || wraps(out, len) {
        return Err(invalid(&format!(
            "{call}: NULL buffer, or one whose range wraps"
        )));
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
        return Ok(f(src, dst));
    }
    // SAFETY: caller contract; the input is copied before the output
    // slice exists, and its slice is gone by then.
    let copied = scratch_copy(unsafe { std::slice::from_raw_parts(inp as *const u8, len) });
    let Some(s) = copied else {
        return Err(no_memory(call, "the copy of overlapping input", len));
    };
    // SAFETY: caller contract.
    let dst = unsafe { std::slice::from_raw_parts_mut(out as *mut u8, len) };
    let r = f(&s, dst);
    scratch_return(s);
    Ok(r)
}

/// # Safety
/// `p` readable for `len` bytes when non-null.
pub(crate) unsafe fn bytes<'a>(p: *const c_void, len: usize) -> Option<&'a [u8]> {
    if len == 0 {
        return Some(&[]);
    }
    if p.is_null() || wraps(p, len) {
        return None;
    }
    // SAFETY: caller contract.
    Some(unsafe { std::slice::from_raw_parts(p as *const u8, len) })
}

/// # Safety
/// `p` a NUL-terminated string when non-null.
pub(crate) unsafe fn name<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: caller contract.
    unsafe { CStr::from_ptr(p) }.to_str().ok()
}

/// # Safety
/// `c` NULL or a pointer from `wd_cipher_new`.
pub(crate) unsafe fn cipher<'a>(c: *mut WdCipher) -> Option<&'a mut WdCipher> {
    // SAFETY: checked for NULL; the magic word rejects foreign pointers.
    unsafe { c.as_mut() }.filter(|c| c.magic == CIPHER_MAGIC)
}

/// # Safety
/// `a` NULL or a pointer from `wd_aead_new`.
pub(crate) unsafe fn aead<'a>(a: *mut WdAead) -> Option<&'a mut WdAead> {
    // SAFETY: as for cipher.
    unsafe { a.as_mut() }.filter(|a| a.magic == AEAD_MAGIC)
}

/// # Safety
/// `d` NULL or a pointer from `wd_digest_new`.
pub(crate) unsafe fn digest<'a>(d: *mut WdDigest) -> Option<&'a mut WdDigest> {
    // SAFETY: as for cipher.
    unsafe { d.as_mut() }.filter(|d| d.magic == DIGEST_MAGIC)
}

pub(crate) fn dir(encrypt: c_int) -> Direction {
    if encrypt != 0 {
        Direction::Encrypt
    } else {
        Direction::Decrypt
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept() -> usize {
        SCRATCH.with(|s| s.borrow().capacity())
    }

    /// Copy `len` bytes of `buf` 16 bytes down, through `with_buffers`
    /// (the input and output overlap).
    fn shift_down(buf: &mut [u8], len: usize) -> Result<(), c_int> {
        assert!(buf.len() >= len + 16);
        let base = buf.as_mut_ptr();
        // SAFETY: buf holds len + 16 bytes; in and out overlap inside it.
        unsafe {
            with_buffers(
                "test",
                base.add(16).cast_const().cast(),
                base.cast(),
                len,
                |i, o| o.copy_from_slice(i),
            )
        }
    }

    /// An overlapping call of a length no allocation can serve (2^62
    /// bytes, within `buf` only in name): its result, and whether the
    /// callback ran.
    fn refused_copy(buf: &mut [u8]) -> (Result<(), c_int>, bool) {
        let base = buf.as_mut_ptr();
        let mut ran = false;
        // SAFETY: the copy is refused before any byte is read.
        let r = unsafe {
            with_buffers(
                "test",
                base.add(16).cast_const().cast(),
                base.cast(),
                1 << 62,
                |_, _| ran = true,
            )
        };
        (r, ran)
    }

    /// A length no allocation can serve, with overlapping buffers: an
    /// errno, and the callback never runs (before, the copy aborted the
    /// process).
    #[test]
    fn an_overlapping_copy_that_cannot_be_allocated_is_enomem() {
        let mut buf = vec![7u8; 64];
        assert_eq!(refused_copy(&mut buf), (Err(-ENOMEM), false));
    }

    /// A large overlapping call leaves the thread at most `SCRATCH_KEEP`
    /// of scratch (before, it kept the whole copy for its lifetime); a
    /// small one keeps its buffer for the next.
    #[test]
    fn a_large_scratch_is_released_a_small_one_kept() {
        let len = 4 * SCRATCH_KEEP;
        let mut buf: Vec<u8> = (0..len + 16).map(|i| i as u8).collect();
        assert_eq!(shift_down(&mut buf, len), Ok(()));
        assert_eq!(buf[0], 16);
        assert_eq!(buf[len - 1], (len + 15) as u8);
        assert!(kept() <= SCRATCH_KEEP, "kept {} bytes", kept());
        assert_eq!(shift_down(&mut buf, 1024), Ok(()));
        assert!(kept() >= 1024, "kept {} bytes", kept());
        // A refused copy leaves what was kept.
        assert_eq!(refused_copy(&mut buf), (Err(-ENOMEM), false));
        assert!(kept() >= 1024, "kept {} bytes", kept());
    }
}
