//! The proven implementation behind the sec device and the crypto
//! libraries' CPU path: OpenSSL's libcrypto (the same code the CPU-only
//! baseline runs, so a comparison measures the framework, not the crypto).
//! Its own crate so that only what computes AES/SHA links libcrypto: the
//! device, and the crypto libraries (never the client library).
//!
//! Everything is fetched from a private library context, so the host never
//! routes through a provider the system configuration activates (such as
//! WrapDrive's own): no recursion, the default implementations only.
//!
//! The `*_raw` functions take raw addresses because the device works in
//! place on memory a client shares: no Rust reference is ever formed to it.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_uint, c_void, CString};
use std::ptr;
use std::sync::OnceLock;
use wd_sys::devmem::DeviceSlice;

use openssl_sys as ffi;

use wd_sec_msg::{Alg, Hash, Mode};

/// Errors of the libcrypto layer.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EvpError {
    /// libcrypto refused a call (bad key, tag mismatch, ...).
    #[error("libcrypto: {0} failed")]
    Failed(&'static str),
    /// The algorithm is not available in this libcrypto.
    #[error("libcrypto has no {0}")]
    Unavailable(String),
}

type Result<T> = std::result::Result<T, EvpError>;

extern "C" {
    // libcrypto 3 (not bound by openssl-sys).
    fn EVP_CIPHER_CTX_get_updated_iv(
        ctx: *mut ffi::EVP_CIPHER_CTX,
        buf: *mut c_void,
        len: usize,
    ) -> c_int;
}

fn check(ok: c_int, what: &'static str) -> Result<()> {
    if ok == 1 {
        Ok(())
    } else {
        // SAFETY: clearing this thread's error queue has no preconditions.
        unsafe { ffi::ERR_clear_error() };
        Err(EvpError::Failed(what))
    }
}

struct LibCtx(*mut ffi::OSSL_LIB_CTX);
// SAFETY: an OSSL_LIB_CTX is thread-safe once created (OpenSSL's threading
// rules); it is never freed.
unsafe impl Send for LibCtx {}
// SAFETY: as above.
unsafe impl Sync for LibCtx {}

fn libctx() -> *mut ffi::OSSL_LIB_CTX {
    static CTX: OnceLock<LibCtx> = OnceLock::new();
    CTX.get_or_init(|| {
        // SAFETY: no preconditions; a null result makes every fetch fail
        // cleanly with Unavailable.
        LibCtx(unsafe { ffi::OSSL_LIB_CTX_new() })
    })
    .0
}

struct Fetched<T>(*mut T);
// SAFETY: fetched algorithm objects are immutable and reference counted;
// OpenSSL allows sharing them between threads.
unsafe impl<T> Send for Fetched<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Fetched<T> {}

/// The cipher object for `alg` (fetched once per process).
fn cipher(alg: Alg) -> Result<*mut ffi::EVP_CIPHER> {
    static CIPHERS: OnceLock<Vec<Fetched<ffi::EVP_CIPHER>>> = OnceLock::new();
    let all = CIPHERS.get_or_init(|| {
        wd_sec_msg::ALGS
            .iter()
            .map(|a| {
                if !a.is_cipher() {
                    return Fetched(ptr::null_mut());
                }
                let name = CString::new(a.openssl_name()).expect("no NUL in names");
                // SAFETY: valid C string and library context; the result is
                // owned by this table for the life of the process.
                Fetched(unsafe { ffi::EVP_CIPHER_fetch(libctx(), name.as_ptr(), ptr::null()) })
            })
            .collect()
    });
    let p = all[alg.id() as usize - 1].0;
    if p.is_null() {
        return Err(EvpError::Unavailable(alg.name()));
    }
    Ok(p)
}

/// The digest object for `h` (fetched once per process).
fn digest(h: Hash) -> Result<*mut ffi::EVP_MD> {
    static MDS: OnceLock<Vec<Fetched<ffi::EVP_MD>>> = OnceLock::new();
    const ALL: [Hash; 5] = [
        Hash::Sha1,
        Hash::Sha224,
        Hash::Sha256,
        Hash::Sha384,
        Hash::Sha512,
    ];
    let all = MDS.get_or_init(|| {
        ALL.iter()
            .map(|h| {
                let name = CString::new(h.openssl_name()).expect("no NUL in names");
                // SAFETY: as for EVP_CIPHER_fetch.
                Fetched(unsafe { ffi::EVP_MD_fetch(libctx(), name.as_ptr(), ptr::null()) })
            })
            .collect()
    });
    let p = all[ALL.iter().position(|&x| x == h).expect("listed")].0;
    if p.is_null() {
        return Err(EvpError::Unavailable(h.openssl_name().into()));
    }
    Ok(p)
}

/// A cipher context: one message stream of one key.
pub struct CipherCtx {
    ctx: *mut ffi::EVP_CIPHER_CTX,
    cipher: *mut ffi::EVP_CIPHER,
    mode: Mode,
}

// SAFETY: the context is used by one thread at a time (it moves with its
// queue or session); libcrypto contexts have no thread affinity.
unsafe impl Send for CipherCtx {}

impl CipherCtx {
    /// A context for `alg` (a cipher), not yet keyed.
    pub fn new(alg: Alg) -> Result<CipherCtx> {
        let Alg::Aes { mode, .. } = alg else {
            return Err(EvpError::Unavailable(alg.name()));
        };
        let cipher = cipher(alg)?;
        // SAFETY: no preconditions.
        let ctx = unsafe { ffi::EVP_CIPHER_CTX_new() };
        if ctx.is_null() {
            return Err(EvpError::Failed("EVP_CIPHER_CTX_new"));
        }
        Ok(CipherCtx { ctx, cipher, mode })
    }

    /// (Re)start a message: set the key when given (first use, or a new
    /// direction: decryption needs its own key schedule), the IV when
    /// given, and the direction. Padding is off: the device works on whole
    /// blocks and padding is the client library's business.
    pub fn init(&mut self, key: Option<&[u8]>, iv: Option<&[u8]>, encrypt: bool) -> Result<()> {
        // libcrypto reads as many key and IV bytes as the cipher takes,
        // whatever the slices hold: check them here (this is a safe API).
        // SAFETY: cipher is a live fetched cipher.
        let (klen, ivlen) = unsafe {
            (
                ffi::EVP_CIPHER_get_key_length(self.cipher),
                ffi::EVP_CIPHER_get_iv_length(self.cipher),
            )
        };
        if key.is_some_and(|k| k.len() != klen.max(0) as usize) {
            return Err(EvpError::Failed("EVP_CipherInit_ex (key length)"));
        }
        if self.mode != Mode::Gcm && iv.is_some_and(|v| v.len() < ivlen.max(0) as usize) {
            return Err(EvpError::Failed("EVP_CipherInit_ex (IV length)"));
        }
        if key.is_some() {
            // Select the cipher first (this resets the context), so the GCM
            // IV length can be set before key and IV go in together.
            check(
                // SAFETY: ctx is live; null key and IV only select the cipher.
                unsafe {
                    ffi::EVP_CipherInit_ex(
                        self.ctx,
                        self.cipher,
                        ptr::null_mut(),
                        ptr::null(),
                        ptr::null(),
                        encrypt as c_int,
                    )
                },
                "EVP_CipherInit_ex",
            )?;
        }
        if let (Mode::Gcm, Some(iv)) = (self.mode, iv) {
            check(
                // SAFETY: ctx is live and holds a GCM cipher.
                unsafe {
                    ffi::EVP_CIPHER_CTX_ctrl(
                        self.ctx,
                        ffi::EVP_CTRL_GCM_SET_IVLEN,
                        iv.len() as c_int,
                        ptr::null_mut(),
                    )
                },
                "EVP_CTRL_GCM_SET_IVLEN",
            )?;
        }
        let k = key.map_or(ptr::null(), |k| k.as_ptr());
        let v = iv.map_or(ptr::null(), |v| v.as_ptr());
        check(
            // SAFETY: key and IV, when given, have the lengths the cipher
            // expects (checked by the caller against Alg); ctx is live. A null
            // cipher keeps the one chosen, a null key keeps the key schedule.
            unsafe {
                ffi::EVP_CipherInit_ex(
                    self.ctx,
                    ptr::null(),
                    ptr::null_mut(),
                    k,
                    v,
                    encrypt as c_int,
                )
            },
            "EVP_CipherInit_ex",
        )?;
        // SAFETY: ctx is live.
        unsafe { ffi::EVP_CIPHER_CTX_set_padding(self.ctx, 0) };
        Ok(())
    }

    /// Process device memory: `src` into `dst` (of at least `src`'s
    /// length), which may alias `src` exactly; partial overlap is the
    /// client's own memory and only garbles its own result.
    pub fn update_device(&mut self, dst: &DeviceSlice<'_>, src: &DeviceSlice<'_>) -> Result<usize> {
        let d = dst.subslice(0, src.len());
        // SAFETY: both slices are live device memory of src.len() bytes
        // (DeviceSlice's contract); libcrypto only reads src and writes dst.
        unsafe { self.update_ptrs(d.as_ptr(), src.as_ptr(), src.len()) }
    }

    /// Process `len` bytes from `src` to `dst` (which may be equal).
    ///
    /// # Safety
    /// `src` must be valid for reads and `dst` for writes of `len` bytes for
    /// the duration of the call; they may alias exactly or not at all.
    unsafe fn update_ptrs(&mut self, dst: *mut u8, src: *const u8, len: usize) -> Result<usize> {
        // A block mode given part of a block keeps it in the context, and
        // the next update writes up to a block more than it is given:
        // past `dst`. Whole blocks only, checked before libcrypto sees any.
        if matches!(self.mode, Mode::Ecb | Mode::Cbc) && len % 16 != 0 {
            return Err(EvpError::Failed("EVP_CipherUpdate (partial block)"));
        }
        let mut done = 0usize;
        while done < len {
            let n = (len - done).min(c_int::MAX as usize & !15);
            let mut outl: c_int = 0;
            check(
                // SAFETY: the caller guarantees the ranges; ctx is live.
                unsafe {
                    ffi::EVP_CipherUpdate(
                        self.ctx,
                        dst.add(done),
                        &mut outl,
                        src.add(done),
                        n as c_int,
                    )
                },
                "EVP_CipherUpdate",
            )?;
            done += n;
            if outl as usize != n {
                return Err(EvpError::Failed("EVP_CipherUpdate (partial block)"));
            }
        }
        Ok(len)
    }

    /// Process local buffers (`dst.len() >= src.len()`).
    pub fn update(&mut self, dst: &mut [u8], src: &[u8]) -> Result<usize> {
        assert!(dst.len() >= src.len(), "output shorter than input");
        // SAFETY: both slices are local and valid for src.len() bytes.
        unsafe { self.update_ptrs(dst.as_mut_ptr(), src.as_ptr(), src.len()) }
    }

    /// Process `src` in place.
    pub fn update_in_place(&mut self, buf: &mut [u8]) -> Result<usize> {
        let p = buf.as_mut_ptr();
        // SAFETY: the buffer is local and valid for its length; exact
        // aliasing is allowed.
        unsafe { self.update_ptrs(p, p, buf.len()) }
    }

    /// The chaining state libcrypto holds: the next IV (CBC) or counter
    /// block (CTR), and for CTR the bytes used of the current keystream
    /// block. Lets a stream continue elsewhere.
    pub fn chain_state(&mut self) -> Result<([u8; 16], usize)> {
        let mut iv = [0u8; 16];
        // SAFETY: ctx is live; iv has room for the 16 bytes asked.
        let r = unsafe { EVP_CIPHER_CTX_get_updated_iv(self.ctx, iv.as_mut_ptr().cast(), 16) };
        check(r, "EVP_CIPHER_CTX_get_updated_iv")?;
        // SAFETY: ctx is live.
        let num = unsafe { ffi::EVP_CIPHER_CTX_get_num(self.ctx) };
        Ok((iv, num.max(0) as usize))
    }

    /// AEAD additional data, of any length: EVP takes an `int` length,
    /// so it goes in pieces (GCM takes its additional data in as many
    /// calls as given).
    pub fn aad(&mut self, aad: &[u8]) -> Result<()> {
        for piece in aad.chunks(c_int::MAX as usize) {
            let mut outl: c_int = 0;
            check(
                // SAFETY: a null output pointer is how EVP takes AAD; the
                // piece is local and its length fits an int.
                unsafe {
                    ffi::EVP_CipherUpdate(
                        self.ctx,
                        ptr::null_mut(),
                        &mut outl,
                        piece.as_ptr(),
                        piece.len() as c_int,
                    )
                },
                "EVP_CipherUpdate (AAD)",
            )?;
        }
        Ok(())
    }

    /// Finish the message (AEAD: computes or checks the tag; a mismatch is
    /// an error).
    pub fn finish(&mut self) -> Result<()> {
        let mut out = [0u8; 32];
        let mut outl: c_int = 0;
        check(
            // SAFETY: with padding off, at most one block is written into `out`.
            unsafe { ffi::EVP_CipherFinal(self.ctx, out.as_mut_ptr(), &mut outl) },
            "EVP_CipherFinal",
        )
    }

    /// AEAD: the tag after an encrypting `finish`.
    pub fn tag(&mut self, tag: &mut [u8]) -> Result<()> {
        check(
            // SAFETY: tag is writable for its length (at most 16, checked by the
            // decoder).
            unsafe {
                ffi::EVP_CIPHER_CTX_ctrl(
                    self.ctx,
                    ffi::EVP_CTRL_GCM_GET_TAG,
                    tag.len() as c_int,
                    tag.as_mut_ptr().cast(),
                )
            },
            "EVP_CTRL_GCM_GET_TAG",
        )
    }

    /// AEAD: the expected tag, before a decrypting `finish`.
    pub fn set_tag(&mut self, tag: &[u8]) -> Result<()> {
        check(
            // SAFETY: libcrypto copies the tag; it does not write through it.
            unsafe {
                ffi::EVP_CIPHER_CTX_ctrl(
                    self.ctx,
                    ffi::EVP_CTRL_GCM_SET_TAG,
                    tag.len() as c_int,
                    tag.as_ptr() as *mut c_void,
                )
            },
            "EVP_CTRL_GCM_SET_TAG",
        )
    }
}

impl Drop for CipherCtx {
    fn drop(&mut self) {
        // SAFETY: ctx came from EVP_CIPHER_CTX_new and is freed once; the
        // free wipes key material.
        unsafe { ffi::EVP_CIPHER_CTX_free(self.ctx) };
    }
}

/// A digest or HMAC context.
pub struct DigestCtx {
    md_ctx: *mut ffi::EVP_MD_CTX,
    hmac: *mut ffi::HMAC_CTX,
    md: *mut ffi::EVP_MD,
    hash: Hash,
}

// SAFETY: as for CipherCtx.
unsafe impl Send for DigestCtx {}

impl DigestCtx {
    /// A plain digest context, initialised.
    pub fn new(hash: Hash) -> Result<DigestCtx> {
        let md = digest(hash)?;
        // SAFETY: no preconditions.
        let md_ctx = unsafe { ffi::EVP_MD_CTX_new() };
        if md_ctx.is_null() {
            return Err(EvpError::Failed("EVP_MD_CTX_new"));
        }
        let mut d = DigestCtx {
            md_ctx,
            hmac: ptr::null_mut(),
            md,
            hash,
        };
        d.restart()?;
        Ok(d)
    }

    /// An HMAC context keyed with `key`, initialised.
    pub fn hmac(hash: Hash, key: &[u8]) -> Result<DigestCtx> {
        let md = digest(hash)?;
        // SAFETY: no preconditions.
        let hmac = unsafe { ffi::HMAC_CTX_new() };
        if hmac.is_null() {
            return Err(EvpError::Failed("HMAC_CTX_new"));
        }
        let d = DigestCtx {
            md_ctx: ptr::null_mut(),
            hmac,
            md,
            hash,
        };
        // An empty key still needs a valid pointer.
        let k = if key.is_empty() {
            [0u8; 1].as_ptr()
        } else {
            key.as_ptr()
        };
        check(
            // SAFETY: key is valid for key.len() bytes; hmac and md are live.
            unsafe { ffi::HMAC_Init_ex(d.hmac, k.cast(), key.len() as c_int, md, ptr::null_mut()) },
            "HMAC_Init_ex",
        )?;
        Ok(d)
    }

    /// An independent copy of the state (the key included for HMAC).
    pub fn try_clone(&self) -> Result<DigestCtx> {
        if !self.hmac.is_null() {
            // SAFETY: no preconditions.
            let hmac = unsafe { ffi::HMAC_CTX_new() };
            if hmac.is_null() {
                return Err(EvpError::Failed("HMAC_CTX_new"));
            }
            let copy = DigestCtx {
                md_ctx: ptr::null_mut(),
                hmac,
                md: self.md,
                hash: self.hash,
            };
            // SAFETY: both contexts are live; the source is only read.
            let r = unsafe { ffi::HMAC_CTX_copy(copy.hmac, self.hmac) };
            check(r, "HMAC_CTX_copy")?;
            return Ok(copy);
        }
        // SAFETY: no preconditions.
        let md_ctx = unsafe { ffi::EVP_MD_CTX_new() };
        if md_ctx.is_null() {
            return Err(EvpError::Failed("EVP_MD_CTX_new"));
        }
        let copy = DigestCtx {
            md_ctx,
            hmac: ptr::null_mut(),
            md: self.md,
            hash: self.hash,
        };
        // SAFETY: both contexts are live; the source is only read.
        let r = unsafe { ffi::EVP_MD_CTX_copy_ex(copy.md_ctx, self.md_ctx) };
        check(r, "EVP_MD_CTX_copy_ex")?;
        Ok(copy)
    }

    /// The hash function.
    pub fn hash(&self) -> Hash {
        self.hash
    }

    /// Forget the data so far (HMAC: keep the key).
    pub fn restart(&mut self) -> Result<()> {
        if !self.hmac.is_null() {
            return check(
                // SAFETY: null key and md mean "same key, same md" (HMAC_Init_ex).
                unsafe {
                    ffi::HMAC_Init_ex(self.hmac, ptr::null(), 0, ptr::null(), ptr::null_mut())
                },
                "HMAC_Init_ex",
            );
        }
        check(
            // SAFETY: md_ctx and md are live.
            unsafe { ffi::EVP_DigestInit_ex(self.md_ctx, self.md, ptr::null_mut()) },
            "EVP_DigestInit_ex",
        )
    }

    /// Hash device memory.
    pub fn update_device(&mut self, src: &DeviceSlice<'_>) -> Result<()> {
        // SAFETY: a live device slice of src.len() readable bytes.
        unsafe { self.update_ptr(src.as_ptr(), src.len()) }
    }

    /// Hash `len` bytes at `src`.
    ///
    /// # Safety
    /// `src` must be valid for reads of `len` bytes for the call.
    unsafe fn update_ptr(&mut self, src: *const u8, len: usize) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        if !self.hmac.is_null() {
            return check(
                // SAFETY: the caller guarantees the range; hmac is live.
                unsafe { ffi::HMAC_Update(self.hmac, src, len) },
                "HMAC_Update",
            );
        }
        check(
            // SAFETY: the caller guarantees the range; md_ctx is live.
            unsafe { ffi::EVP_DigestUpdate(self.md_ctx, src.cast::<c_void>(), len) },
            "EVP_DigestUpdate",
        )
    }

    /// Hash a local buffer.
    pub fn update(&mut self, data: &[u8]) -> Result<()> {
        // SAFETY: data is local and valid for its length.
        unsafe { self.update_ptr(data.as_ptr(), data.len()) }
    }

    /// Write the digest into `out` (at least 64 bytes), return its length,
    /// and restart.
    pub fn finish(&mut self, out: &mut [u8; 64]) -> Result<usize> {
        let mut n: c_uint = 0;
        if !self.hmac.is_null() {
            // SAFETY: out has room for any digest (64 bytes).
            let r = unsafe { ffi::HMAC_Final(self.hmac, out.as_mut_ptr(), &mut n) };
            check(r, "HMAC_Final")?;
        } else {
            // SAFETY: as above.
            let r = unsafe { ffi::EVP_DigestFinal_ex(self.md_ctx, out.as_mut_ptr(), &mut n) };
            check(r, "EVP_DigestFinal_ex")?;
        }
        self.restart()?;
        Ok(n as usize)
    }
}

impl Drop for DigestCtx {
    fn drop(&mut self) {
        // SAFETY: each pointer came from its constructor and is freed once;
        // the frees wipe key material.
        unsafe {
            if !self.hmac.is_null() {
                ffi::HMAC_CTX_free(self.hmac);
            }
            if !self.md_ctx.is_null() {
                ffi::EVP_MD_CTX_free(self.md_ctx);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aes_128_cbc_matches_a_known_answer() {
        // NIST SP 800-38A F.2.1, first block.
        let key = hex("2b7e151628aed2a6abf7158809cf4f3c");
        let iv = hex("000102030405060708090a0b0c0d0e0f");
        let pt = hex("6bc1bee22e409f96e93d7e117393172a");
        let mut c = CipherCtx::new(Alg::by_name("aes-128-cbc").unwrap()).unwrap();
        c.init(Some(&key), Some(&iv), true).unwrap();
        let mut out = [0u8; 16];
        assert_eq!(c.update(&mut out, &pt).unwrap(), 16);
        assert_eq!(out.to_vec(), hex("7649abac8119b246cee98e9b12e9197d"));
    }

    #[test]
    fn sha256_and_hmac_known_answers() {
        let mut d = DigestCtx::new(Hash::Sha256).unwrap();
        d.update(b"abc").unwrap();
        let mut out = [0u8; 64];
        let n = d.finish(&mut out).unwrap();
        assert_eq!(
            out[..n].to_vec(),
            hex("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        );
        // RFC 4231 test case 2.
        let mut h = DigestCtx::hmac(Hash::Sha256, b"Jefe").unwrap();
        h.update(b"what do ya want for nothing?").unwrap();
        let n = h.finish(&mut out).unwrap();
        assert_eq!(
            out[..n].to_vec(),
            hex("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
        );
    }

    pub(crate) fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// GCM's tag over `aad`, fed in pieces of at most `piece` bytes.
    fn gcm_tag(aad: &[u8], piece: usize) -> [u8; 16] {
        let mut c = CipherCtx::new(Alg::by_name("aes-128-gcm").unwrap()).unwrap();
        c.init(Some(&[7; 16]), Some(&[9; 12]), true).unwrap();
        for p in aad.chunks(piece) {
            c.aad(p).unwrap();
        }
        c.finish().unwrap();
        let mut tag = [0; 16];
        c.tag(&mut tag).unwrap();
        tag
    }

    #[test]
    fn additional_data_past_an_int_is_authenticated_whole() {
        // Zero pages from the allocator: nothing is committed. 2^32 + 16
        // bytes went to EVP as an int of 16; 2^31 + 16 as a negative one.
        let big = vec![0u8; (1 << 32) + 16];
        let whole = gcm_tag(&big, big.len());
        assert_eq!(
            whole,
            gcm_tag(&big, 1 << 30),
            "4 GiB + 16 bytes in one call"
        );
        assert_ne!(whole, gcm_tag(&big[..16], 16));
        let half = &big[..(1 << 31) + 16];
        assert_eq!(gcm_tag(half, half.len()), gcm_tag(half, 1 << 30));
    }
}
