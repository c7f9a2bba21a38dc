//! A multi-buffer AES engine: intel-ipsec-mb, loaded at run time.
//!
//! AES-CBC encryption is serial within one message (each block needs the
//! previous one's output), so one stream keeps the CPU's AES units a
//! fraction busy. A host that sees many independent requests at once can
//! encrypt 8 to 16 of them side by side; intel-ipsec-mb's burst API does
//! exactly that with the widest instructions the CPU has (its own
//! detection). The library is optional: [`Engine::get`] probes for it once
//! per process, and everything built on it falls back to libcrypto when it
//! is absent, too old, or refuses this CPU.
//!
//! The library's scheduler state (a "manager") is per thread, so an engine
//! thread of the host keeps its own and no lock is taken per burst.
#![deny(unsafe_code)]

#[allow(unsafe_code)]
mod ffi;

use std::cell::RefCell;
use std::sync::OnceLock;

use wd_sys::devmem::DeviceSlice;

/// The shared object probed for (Debian: `libipsec-mb1`).
pub const LIBRARY: &str = "libIPSec_MB.so.1";

/// Errors of the multi-buffer engine.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum MbError {
    /// The library could not be loaded.
    #[error("intel-ipsec-mb is not installed ({0})")]
    NotInstalled(String),
    /// The library's layout is not the one this crate was written for.
    #[error("intel-ipsec-mb: unexpected ABI: {0}")]
    Abi(String),
    /// The library refused to set up on this CPU.
    #[error("intel-ipsec-mb: {0}")]
    Init(String),
    /// The library computed a known answer wrongly.
    #[error("intel-ipsec-mb failed its known-answer test")]
    KnownAnswer,
    /// An AES key of a length other than 16, 24 or 32 bytes.
    #[error("an AES key is 16, 24 or 32 bytes, not {0}")]
    KeyLength(usize),
    /// A CBC job whose length is not whole blocks, or whose output is
    /// shorter than its input.
    #[error("CBC job of {len} bytes into {room}: whole 16-byte blocks, output at least as long as input")]
    Length {
        /// Input bytes.
        len: usize,
        /// Output room.
        room: usize,
    },
    /// The library did not complete a burst.
    #[error("intel-ipsec-mb completed {done} of {of} jobs: {reason}")]
    Burst {
        /// Jobs completed.
        done: u32,
        /// Jobs submitted.
        of: u32,
        /// The library's error text.
        reason: String,
    },
}

/// The loaded library (one per process).
pub struct Engine {
    api: &'static ffi::Api,
    name: String,
    features: u64,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("name", &self.name)
            .field("version", &self.api.version)
            .finish()
    }
}

static ENGINE: OnceLock<Result<Engine, MbError>> = OnceLock::new();

thread_local! {
    static MANAGER: RefCell<Option<ffi::Manager>> = const { RefCell::new(None) };
}

impl Engine {
    /// The engine, probed on first use: the library loaded, a manager set
    /// up for this CPU, and a known answer checked. The error says why it
    /// is not available (callers fall back and show the reason).
    pub fn get() -> Result<&'static Engine, MbError> {
        ENGINE
            .get_or_init(Engine::probe)
            .as_ref()
            .map_err(Clone::clone)
    }

    fn probe() -> Result<Engine, MbError> {
        let api: &'static ffi::Api = Box::leak(Box::new(ffi::Api::load(LIBRARY)?));
        let major: u32 = api
            .version
            .split('.')
            .next()
            .and_then(|m| m.parse().ok())
            .unwrap_or(0);
        let minor: u32 = api
            .version
            .split('.')
            .nth(1)
            .and_then(|m| m.parse().ok())
            .unwrap_or(0);
        if major != 1 || minor < 3 {
            return Err(MbError::Abi(format!(
                "version {} (this engine needs 1.3 or a later 1.x)",
                api.version
            )));
        }
        let m = ffi::Manager::new(api)?;
        let engine = Engine {
            api,
            name: format!("ipsec-mb/{}", m.flavour),
            features: m.features,
        };
        MANAGER.with(|c| *c.borrow_mut() = Some(m));
        engine.known_answer()?;
        Ok(engine)
    }

    /// NIST SP 800-38A, F.2.1 (CBC-AES128.Encrypt), all four blocks, run
    /// in place and out of place in one burst.
    fn known_answer(&self) -> Result<(), MbError> {
        let key = hex("2b7e151628aed2a6abf7158809cf4f3c");
        let iv: [u8; 16] = hex("000102030405060708090a0b0c0d0e0f")
            .try_into()
            .expect("16 bytes");
        let plain = hex(concat!(
            "6bc1bee22e409f96e93d7e117393172a",
            "ae2d8a571e03ac9c9eb76fac45af8e51",
            "30c81c46a35ce411e5fbc1191a0a52ef",
            "f69f2445df4f9b17ad2b417be66c3710"
        ));
        let cipher = hex(concat!(
            "7649abac8119b246cee98e9b12e9197d",
            "5086cb9b507219ee95db113a917678b2",
            "73bed6b8e3c1743b7116e69e22229516",
            "3ff1caa1681fac09120eca307586e1a7"
        ));
        let keys = self.schedule(&key)?;
        let mut inplace = plain.clone();
        let mut src = plain.clone();
        let mut out = vec![0u8; plain.len()];
        {
            let a = DeviceSlice::from_mut(&mut inplace);
            let s = DeviceSlice::from_mut(&mut src);
            let d = DeviceSlice::from_mut(&mut out);
            let mut jobs = [CbcJob::new(&keys, iv, a, a)?, CbcJob::new(&keys, iv, s, d)?];
            self.cbc_encrypt(&mut jobs)?;
        }
        if inplace != cipher || out != cipher {
            return Err(MbError::KnownAnswer);
        }
        Ok(())
    }

    /// What serves the requests: `ipsec-mb/avx2-t1` and the like (the
    /// library's code path for this CPU).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The library's version.
    pub fn version(&self) -> &str {
        &self.api.version
    }

    /// The CPU features the library detected (its `IMB_FEATURE_*` bits).
    pub fn features(&self) -> u64 {
        self.features
    }

    fn with_manager<R>(
        &self,
        f: impl FnOnce(&mut ffi::Manager) -> Result<R, MbError>,
    ) -> Result<R, MbError> {
        MANAGER.with(|c| {
            let mut slot = c.borrow_mut();
            if slot.is_none() {
                *slot = Some(ffi::Manager::new(self.api)?);
            }
            f(slot.as_mut().expect("set above"))
        })
    }

    /// An AES key's round keys, for any number of jobs.
    pub fn schedule(&self, key: &[u8]) -> Result<Schedule, MbError> {
        let mut s = Schedule {
            enc: Box::new(RoundKeys([0; 240])),
            dec: Box::new(RoundKeys([0; 240])),
            key_len: key.len(),
        };
        self.with_manager(|m| m.expand(key, &mut s.enc.0, &mut s.dec.0))?;
        Ok(s)
    }

    /// Encrypt every job in AES-CBC, side by side. Jobs may mix key sizes
    /// and alias in place; each job's `iv` becomes the IV that continues
    /// its message (the last ciphertext block) on success.
    pub fn cbc_encrypt(&self, jobs: &mut [CbcJob<'_>]) -> Result<(), MbError> {
        self.with_manager(|m| m.cbc_encrypt(jobs))
    }
}

/// 15 round keys, aligned as the library requires.
#[repr(C, align(16))]
pub(crate) struct RoundKeys(pub(crate) [u8; 240]);

/// An AES key's round keys (encryption and decryption), wiped when dropped.
pub struct Schedule {
    pub(crate) enc: Box<RoundKeys>,
    pub(crate) dec: Box<RoundKeys>,
    pub(crate) key_len: usize,
}

impl Schedule {
    /// The key's length in bytes.
    pub fn key_len(&self) -> usize {
        self.key_len
    }
}

impl std::fmt::Debug for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Schedule(AES-{})", self.key_len * 8)
    }
}

impl Drop for Schedule {
    fn drop(&mut self) {
        self.enc.0.fill(0);
        self.dec.0.fill(0);
        // Keeps the compiler from eliding stores to memory about to be freed.
        std::hint::black_box((&self.enc.0, &self.dec.0));
    }
}

/// One message (or the next part of one) to encrypt in CBC.
#[derive(Debug)]
pub struct CbcJob<'a> {
    pub(crate) key: &'a Schedule,
    /// The IV in; after [`Engine::cbc_encrypt`], the one that continues.
    pub iv: [u8; 16],
    pub(crate) src: DeviceSlice<'a>,
    pub(crate) dst: DeviceSlice<'a>,
}

impl<'a> CbcJob<'a> {
    /// Encrypt `src` into `dst` (which may be the same memory) under `key`
    /// from `iv`: whole blocks, `dst` at least as long as `src`.
    pub fn new(
        key: &'a Schedule,
        iv: [u8; 16],
        src: DeviceSlice<'a>,
        dst: DeviceSlice<'a>,
    ) -> Result<CbcJob<'a>, MbError> {
        if src.len() % 16 != 0 || dst.len() < src.len() {
            return Err(MbError::Length {
                len: src.len(),
                room: dst.len(),
            });
        }
        Ok(CbcJob { key, iv, src, dst })
    }
}

/// The C layout the binding assumes (`(expression, value)` pairs), for the
/// test that checks it against the installed header.
#[doc(hidden)]
pub fn assumed_layout() -> Vec<(&'static str, usize)> {
    ffi::layout()
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex literal"))
        .collect()
}
