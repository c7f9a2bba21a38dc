//! The sec device: two queue types (`cipher`, `digest`), keys held in
//! host-side sessions referenced by handle, and work done in place in the
//! client's shared memory whenever the domain maps it contiguously.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use wd_device::{
    status, Access, AlgInfo, DeviceError, DeviceQueue, Dma, Driver, Progress, SessionTable, Started,
};
use wd_ipsecmb::{Engine, Schedule};
use wd_ring::Desc;

use crate::dma;
use crate::long::Long;
use crate::mb::{cbc_now, Chain, Gathering, Pending};
use crate::msg::{
    self, Alg, CipherOp, DigestOp, Hash, Mode, Request, SessionClone, SessionNew, F_DIGEST_FINAL,
    F_ENCRYPT, F_FINAL, F_INIT, F_IV, INLINE_KEY, MAX_SESSIONS,
};
use crate::open::{OpenBudget, OPEN_MEMORY};
use wd_evp::{CipherCtx, DigestCtx};

/// Queue type index of ciphers (AES in every mode, GCM included).
pub const TYPE_CIPHER: u32 = 0;
/// Queue type index of digests and HMAC.
pub const TYPE_DIGEST: u32 = 1;

/// `flags` bits of the `cipher` queue type: modes served.
pub mod cipher_flags {
    /// ECB.
    pub const ECB: u32 = 1 << 0;
    /// CBC.
    pub const CBC: u32 = 1 << 1;
    /// CTR.
    pub const CTR: u32 = 1 << 2;
    /// XTS.
    pub const XTS: u32 = 1 << 3;
    /// GCM.
    pub const GCM: u32 = 1 << 4;
}

/// `flags` bits of the `digest` queue type: functions served.
pub mod digest_flags {
    /// SHA-1.
    pub const SHA1: u32 = 1 << 0;
    /// SHA-224.
    pub const SHA224: u32 = 1 << 1;
    /// SHA-256.
    pub const SHA256: u32 = 1 << 2;
    /// SHA-384.
    pub const SHA384: u32 = 1 << 3;
    /// SHA-512.
    pub const SHA512: u32 = 1 << 4;
    /// HMAC over each of them.
    pub const HMAC: u32 = 1 << 8;
}

/// Which code computes what a multi-buffer engine can run side by side
/// (AES-CBC encryption): asked for with the device option `engine=`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EngineChoice {
    /// intel-ipsec-mb when it is installed and works on this CPU, else
    /// libcrypto.
    #[default]
    Auto,
    /// Always libcrypto.
    Libcrypto,
    /// intel-ipsec-mb, or the device does not start.
    IpsecMb,
}

impl std::str::FromStr for EngineChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<EngineChoice, String> {
        match s {
            "auto" => Ok(EngineChoice::Auto),
            "libcrypto" => Ok(EngineChoice::Libcrypto),
            "ipsec-mb" => Ok(EngineChoice::IpsecMb),
            _ => Err(format!(
                "engine '{s}' is not one of auto, libcrypto, ipsec-mb"
            )),
        }
    }
}

/// The sec driver.
#[derive(Debug)]
pub struct SecDriver {
    mb: Option<&'static Engine>,
    /// Why the multi-buffer engine is not used, when it is not.
    without_mb: Option<String>,
    /// Sessions alive on its queues.
    sessions: Arc<AtomicU64>,
    /// Plaintext its queues' cut GCM decryptions hold.
    open_budget: Arc<OpenBudget>,
}

impl Default for SecDriver {
    fn default() -> SecDriver {
        SecDriver::new(EngineChoice::Auto).expect("auto always starts")
    }
}

impl SecDriver {
    /// A driver computing with `choice`; an error when intel-ipsec-mb is
    /// demanded and cannot be used (the reason named).
    pub fn new(choice: EngineChoice) -> Result<SecDriver, DeviceError> {
        let (mb, without_mb) = match (choice, Engine::get()) {
            (EngineChoice::Libcrypto, _) => (None, Some("engine=libcrypto".to_string())),
            (_, Ok(e)) => (Some(e), None),
            (EngineChoice::Auto, Err(e)) => (None, Some(e.to_string())),
            (EngineChoice::IpsecMb, Err(e)) => {
                return Err(DeviceError::Config {
                    device: "sec".into(),
                    message: e.to_string(),
                })
            }
        };
        Ok(SecDriver {
            mb,
            without_mb,
            sessions: Arc::default(),
            open_budget: OpenBudget::new(OPEN_MEMORY),
        })
    }

    /// The same driver with `bytes` for the plaintext its queues' cut GCM
    /// decryptions may hold together, in place of [`OPEN_MEMORY`]: for
    /// tests that reach the bound without allocating hundreds of MiB.
    pub fn with_open_memory(mut self, bytes: u64) -> SecDriver {
        self.open_budget = OpenBudget::new(bytes);
        self
    }
}

impl Driver for SecDriver {
    fn name(&self) -> &'static str {
        "sec"
    }

    fn engine(&self) -> Option<String> {
        Some(match (self.mb, &self.without_mb) {
            (Some(e), _) => format!(
                "{} {} (aes-cbc encrypt), libcrypto (the rest)",
                e.name(),
                e.version()
            ),
            (None, Some(why)) => format!("libcrypto (no multi-buffer engine: {why})"),
            (None, None) => "libcrypto".to_string(),
        })
    }

    fn algorithms(&self) -> Vec<AlgInfo> {
        use cipher_flags as c;
        use digest_flags as d;
        vec![
            AlgInfo {
                name: "cipher",
                flags: c::ECB | c::CBC | c::CTR | c::XTS | c::GCM,
                device_api: msg::DEVICE_API,
            },
            AlgInfo {
                name: "digest",
                flags: d::SHA1 | d::SHA224 | d::SHA256 | d::SHA384 | d::SHA512 | d::HMAC,
                device_api: msg::DEVICE_API,
            },
        ]
    }

    fn default_priority(&self) -> u32 {
        1
    }

    fn attributes(&self) -> Vec<(String, String, bool)> {
        vec![
            (
                "sessions".to_string(),
                self.sessions.load(Ordering::Relaxed).to_string(),
                false,
            ),
            (
                "open_bytes".to_string(),
                self.open_budget.held().to_string(),
                false,
            ),
        ]
    }

    fn open_queue(&self, alg: u32) -> Box<dyn DeviceQueue> {
        Box::new(SecQueue::counted(
            alg,
            self.mb,
            self.sessions.clone(),
            self.open_budget.clone(),
        ))
    }
}

/// Bytes wiped when dropped: keys, and plaintext held back until its tag
/// is checked.
pub(crate) struct Secret(pub(crate) Vec<u8>);

impl Drop for Secret {
    fn drop(&mut self) {
        self.0.fill(0);
        // Keeps the compiler from eliding stores to memory about to be freed.
        std::hint::black_box(&self.0);
    }
}

pub(crate) enum Work {
    Cipher {
        ctx: CipherCtx,
        mode: Mode,
        /// Direction the context is keyed for (None: not keyed yet).
        keyed_for: Option<bool>,
        /// Whether a message is under way in `ctx` (an IV was given).
        started: bool,
        /// Where a CBC encryption under way continues, on a queue that
        /// also runs them in multi-buffer bursts.
        chain: Chain,
    },
    Digest {
        ctx: DigestCtx,
        /// A request failed after the hash took part of its data: the
        /// message is lost, and only one that starts again (`F_INIT`)
        /// is taken.
        lost: bool,
    },
}

pub(crate) struct Session {
    pub(crate) alg: Alg,
    pub(crate) key: Secret,
    pub(crate) work: Work,
    /// Round keys for the multi-buffer engine, made on first use.
    pub(crate) schedule: Option<Schedule>,
}

/// Sessions of one queue.
pub(crate) type Sessions = SessionTable<Session>;

/// The device side of one sec queue.
pub struct SecQueue {
    queue_type: u32,
    pub(crate) sessions: Sessions,
    /// Contexts of session-less digests, one per hash, made on first use.
    oneshot: Vec<(Hash, DigestCtx)>,
    bounce: Vec<u8>,
    /// The multi-buffer engine, when the device uses one.
    pub(crate) mb: Option<&'static Engine>,
    /// Requests gathered for the next burst, or in the burst under way
    /// (at most one per session: a message's next part needs the IV its
    /// previous part leaves).
    pub(crate) pending: Vec<Pending>,
    /// Requests finished, not reported yet.
    pub(crate) finished: Vec<(u64, Desc)>,
    /// Long requests running a piece per poll.
    pub(crate) long: Vec<Long>,
    /// A whole GCM decryption cut in pieces.
    pub(crate) opening: Option<crate::open::Opening>,
    /// What the device's cut GCM decryptions may hold.
    pub(crate) open_budget: Arc<OpenBudget>,
    /// When to gather CBC encryptions and when to run them.
    pub(crate) gathering: Gathering,
}

impl SecQueue {
    /// A queue of type `queue_type` ([`TYPE_CIPHER`] or [`TYPE_DIGEST`])
    /// computing with libcrypto only.
    pub fn new(queue_type: u32) -> SecQueue {
        SecQueue::with_engine(queue_type, None)
    }

    /// A queue that runs AES-CBC encryption through the multi-buffer
    /// engine `mb` (when given): gathered over a batch of requests and
    /// encrypted side by side.
    pub fn with_engine(queue_type: u32, mb: Option<&'static Engine>) -> SecQueue {
        SecQueue::counted(queue_type, mb, Arc::default(), OpenBudget::new(OPEN_MEMORY))
    }

    /// A queue counting its sessions in `live` and its cut GCM
    /// decryptions' plaintext in `open_budget` (both shared by the
    /// driver's queues).
    fn counted(
        queue_type: u32,
        mb: Option<&'static Engine>,
        live: Arc<AtomicU64>,
        open_budget: Arc<OpenBudget>,
    ) -> SecQueue {
        SecQueue {
            queue_type,
            sessions: Sessions::new(MAX_SESSIONS, live),
            oneshot: Vec::new(),
            bounce: Vec::new(),
            mb: mb.filter(|_| queue_type == TYPE_CIPHER),
            pending: Vec::new(),
            finished: Vec::new(),
            long: Vec::new(),
            opening: None,
            open_budget,
            gathering: Gathering::new(),
        }
    }

    /// Sessions alive on this queue.
    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    fn serves(&self, alg: Alg) -> bool {
        (self.queue_type == TYPE_CIPHER) == alg.is_cipher()
    }

    fn session_new(&mut self, s: SessionNew, dma: &mut dyn Dma<'_>) -> Result<u64, i32> {
        if !self.serves(s.alg) {
            return Err(status::EOPNOTSUPP);
        }
        let len = s.key_len as usize;
        let key = if len <= INLINE_KEY {
            s.inline_key[..len].to_vec()
        } else {
            let mut k = vec![0u8; len];
            dma.read(s.key_addr, &mut k).map_err(|_| status::EFAULT)?;
            k
        };
        let key = Secret(key);
        let work = match s.alg {
            Alg::Aes { mode, .. } => Work::Cipher {
                ctx: CipherCtx::new(s.alg).map_err(|_| status::EOPNOTSUPP)?,
                mode,
                keyed_for: None,
                started: false,
                chain: Chain::None,
            },
            Alg::Digest(h) => Work::Digest {
                ctx: DigestCtx::new(h).map_err(|_| status::EOPNOTSUPP)?,
                lost: false,
            },
            Alg::Hmac(h) => Work::Digest {
                ctx: DigestCtx::hmac(h, &key.0).map_err(|_| status::EINVAL)?,
                lost: false,
            },
        };
        // ECB needs no IV: a message is always under way.
        let mut work = work;
        if let Work::Cipher { started, mode, .. } = &mut work {
            *started = *mode == Mode::Ecb;
        }
        self.sessions.insert(Session {
            alg: s.alg,
            key,
            work,
            schedule: None,
        })
    }

    /// A new session with a copy of a digest or HMAC session's state: a
    /// message under way goes on in both (or is lost in both). A cipher
    /// session's chain is the client library's to copy (it knows where
    /// the chain is), so only digests are copied here.
    fn session_clone(&mut self, c: SessionClone) -> Result<u64, i32> {
        let s = self.sessions.get(c.session)?;
        let Work::Digest { ctx, lost } = &s.work else {
            return Err(status::EOPNOTSUPP);
        };
        let work = Work::Digest {
            ctx: ctx.try_clone().map_err(|_| status::EIO)?,
            lost: *lost,
        };
        let copy = Session {
            alg: s.alg,
            key: Secret(s.key.0.clone()),
            work,
            schedule: None,
        };
        self.sessions.insert(copy)
    }

    pub(crate) fn cipher(&mut self, op: CipherOp, dma: &mut dyn Dma<'_>) -> Result<u64, i32> {
        let s = self.sessions.get(op.session)?;
        let alg = s.alg;
        let Work::Cipher {
            ctx,
            mode,
            keyed_for,
            started,
            chain,
        } = &mut s.work
        else {
            return Err(status::EINVAL);
        };
        let mode = *mode;
        let encrypt = op.flags & F_ENCRYPT != 0;
        if let (Some(_), Mode::Cbc, true) = (self.mb, mode, encrypt) {
            return cbc_now(s, op, dma, &mut self.bounce);
        }
        let gcm = mode == Mode::Gcm;
        if op.len % alg.granule() != 0 {
            return Err(status::EINVAL);
        }
        if !gcm && (op.flags & F_FINAL != 0 || op.aad_len != 0 || op.tag_len != 0) {
            return Err(status::EINVAL);
        }
        if op.flags & F_IV != 0 {
            let ok = match mode {
                Mode::Ecb => op.iv_len == 0,
                Mode::Gcm => op.iv_len >= 1,
                _ => op.iv_len as usize == alg.iv_len(),
            };
            if !ok {
                return Err(status::EINVAL);
            }
        } else if mode != Mode::Ecb && (!*started || *keyed_for != Some(encrypt)) {
            // Chaining continues a message in the same direction only.
            return Err(status::EINVAL);
        }
        if mode == Mode::Xts && (op.flags & F_IV == 0 || op.len < 16) {
            return Err(status::EINVAL);
        }
        // IEEE 1619-2018 (and libcrypto): a data unit is at most 2^20 blocks.
        if mode == Mode::Xts && op.len > crate::xts::XTS_UNIT {
            return Err(status::EMSGSIZE);
        }
        if gcm && op.flags & F_FINAL != 0 && !(4..=16).contains(&op.tag_len) {
            return Err(status::EINVAL);
        }
        // The tag and AAD are reached after the context has moved on:
        // checked first (see `dma::reach`; the data is checked where it
        // goes through host buffers).
        if gcm && op.flags & F_FINAL != 0 {
            let access = if encrypt { Access::Write } else { Access::Read };
            dma::reach(dma, op.tag, op.tag_len as u64, access)?;
        }
        if gcm {
            dma::reach(dma, op.aad, op.aad_len as u64, Access::Read)?;
            // The additional data goes into the hash before the data
            // moves: a fault on the data must come first, or a retry
            // hashes it twice.
            if op.aad_len > 0 {
                dma::reach(dma, op.src, op.len, Access::Read)?;
                dma::reach(dma, op.dst, op.len, Access::Write)?;
            }
        }
        // A request that starts its message runs again whole after a
        // fault (a stall's retry starts the context again); any other
        // loses its message once the context took something of it.
        // (ECB has no chain: a request in a direction the context is not
        // keyed for keys it, F_IV or not.)
        let restarts = op.flags & F_IV != 0 || (mode == Mode::Ecb && *keyed_for != Some(encrypt));
        if restarts {
            // Starting a message ends the one under way: a request that
            // faults must leave that one as it was, so its data faults
            // first (the GCM case with additional data was checked above).
            dma::reach(dma, op.src, op.len, Access::Read)?;
            dma::reach(dma, op.dst, op.len, Access::Write)?;
            let key = (*keyed_for != Some(encrypt)).then_some(&s.key.0[..]);
            let iv = (op.iv_len > 0).then_some(&op.iv[..op.iv_len as usize]);
            if ctx.init(key, iv, encrypt).is_err() {
                // Selecting the cipher again (a new key) reset the
                // context: whatever it was keyed for is gone.
                *keyed_for = None;
                *started = mode == Mode::Ecb;
                *chain = Chain::None;
                return Err(status::EINVAL);
            }
            *keyed_for = Some(encrypt);
            *started = true;
            *chain = Chain::None;
        }
        if gcm && op.aad_len > 0 {
            let mut aad = vec![0u8; op.aad_len as usize];
            dma.read(op.aad, &mut aad).map_err(|_| status::EFAULT)?;
            ctx.aad(&aad).map_err(|_| status::EIO)?;
        }
        let len = op.len as usize;
        let whole_message = op.flags & (F_IV | F_FINAL) == F_IV | F_FINAL;
        if gcm && !encrypt && whole_message {
            // Release no plaintext unless the tag matches: decrypt into
            // host memory, check, and only then write the result.
            let mut tag = [0u8; 16];
            let tag = &mut tag[..op.tag_len as usize];
            dma.read(op.tag, tag).map_err(|_| status::EFAULT)?;
            let mut buf = std::mem::take(&mut self.bounce);
            buf.resize(len, 0);
            let r = (|| {
                dma.read(op.src, &mut buf).map_err(|_| status::EFAULT)?;
                ctx.update_in_place(&mut buf).map_err(|_| status::EIO)?;
                ctx.set_tag(tag).map_err(|_| status::EINVAL)?;
                ctx.finish().map_err(|_| status::EBADMSG)?;
                dma.write(op.dst, &buf).map_err(|_| status::EFAULT)
            })();
            // (Zeroed: it may hold plaintext whose tag did not match. A
            // whole request's buffer is not kept.)
            buf.fill(0);
            buf.clear();
            if buf.capacity() <= dma::BOUNCE {
                self.bounce = buf;
            }
            if let Work::Cipher { started, .. } = &mut s.work {
                *started = false;
            }
            r?;
            return Ok(op.len);
        }
        let xts = mode == Mode::Xts;
        if let Err(f) = dma::cipher_dma(ctx, op.dst, op.src, len, dma, &mut self.bounce, xts) {
            // (The additional data went into the hash already.)
            if f.taken || (gcm && op.aad_len > 0 && !restarts) {
                // The context moved on part way: the message is lost, and
                // the request is no fault to stall and retry (-EIO).
                *started = mode == Mode::Ecb;
                *chain = Chain::None;
                return Err(status::EIO);
            }
            return Err(f.status);
        }
        if gcm && op.flags & F_FINAL != 0 {
            let mut tag = [0u8; 16];
            let tag = &mut tag[..op.tag_len as usize];
            let verdict = if encrypt {
                ctx.finish()
                    .and_then(|()| ctx.tag(tag))
                    .map_err(|_| status::EIO)
                    .and_then(|()| dma.write(op.tag, tag).map_err(|_| status::EFAULT))
            } else {
                dma.read(op.tag, tag)
                    .map_err(|_| status::EFAULT)
                    .and_then(|()| ctx.set_tag(tag).map_err(|_| status::EINVAL))
                    .and_then(|()| ctx.finish().map_err(|_| status::EBADMSG))
            };
            // The message ends here whatever the outcome: a new one needs
            // an IV. A fault comes after the data went through.
            if let Work::Cipher { started, .. } = &mut s.work {
                *started = false;
            }
            verdict.map_err(|st| match st {
                status::EFAULT if !restarts => status::EIO,
                st => st,
            })?;
        }
        Ok(op.len)
    }

    fn digest(&mut self, op: DigestOp, dma: &mut dyn Dma<'_>) -> Result<u64, i32> {
        if self.queue_type != TYPE_DIGEST {
            return Err(status::EOPNOTSUPP);
        }
        // Written after the hash has taken the data: checked first.
        let out_len = self.digest_out(&op);
        dma::reach(dma, op.out, out_len as u64, Access::Write)?;
        let mut no_session_lost = false;
        let (ctx, lost) = match op.alg {
            Some(Alg::Digest(h)) => {
                let pos = match self.oneshot.iter().position(|(x, _)| *x == h) {
                    Some(p) => p,
                    None => {
                        let c = DigestCtx::new(h).map_err(|_| status::EOPNOTSUPP)?;
                        self.oneshot.push((h, c));
                        self.oneshot.len() - 1
                    }
                };
                (&mut self.oneshot[pos].1, &mut no_session_lost)
            }
            Some(_) => return Err(status::EINVAL),
            None => match &mut self.sessions.get(op.session)?.work {
                Work::Digest { ctx, lost } => (ctx, lost),
                Work::Cipher { .. } => return Err(status::EINVAL),
            },
        };
        if op.flags & F_INIT != 0 {
            // The message under way stays as it was if this one faults.
            dma::reach(dma, op.src, op.len, Access::Read)?;
            ctx.restart().map_err(|_| status::EIO)?;
            *lost = false;
        } else if *lost {
            return Err(status::EINVAL);
        }
        let r = dma::digest_dma(ctx, op.src, op.len as usize, dma, &mut self.bounce);
        // A request that failed half way leaves no half-hashed state
        // behind, and the message is lost. One that failed before the
        // hash took anything (memory reached in place is translated whole
        // first, the rest checked first by `dma::reach`) keeps the state,
        // for a stall's retry.
        if let Err(f) = r {
            if f.taken {
                let _ = ctx.restart();
                *lost = true;
                return Err(status::EIO);
            }
            return Err(f.status);
        }
        if op.flags & F_DIGEST_FINAL == 0 {
            return Ok(0);
        }
        let mut out = [0u8; 64];
        let n = ctx.finish(&mut out).map_err(|_| status::EIO)?;
        if dma.write(op.out, &out[..n]).is_err() {
            // The hash has started again: only a request that starts its
            // message runs again right (a stall's retry); any other lost
            // it (a retry gave the digest of its own data alone).
            if op.flags & F_INIT != 0 {
                return Err(status::EFAULT);
            }
            *lost = true;
            return Err(status::EIO);
        }
        Ok(n as u64)
    }
}

/// Smallest piece a long request is cut into (fewer, larger library calls
/// below this cost more than the fairness they buy).
pub(crate) const MIN_PIECE: u64 = 64 << 10;

impl SecQueue {
    /// Whether a cipher request can run as a chain of shorter ones: the
    /// session chains (not XTS, whose data unit is one call: cut in
    /// calls of their own, `xts.rs`), the request
    /// is well formed, and no plaintext must be held back until a tag is
    /// checked (a whole GCM decryption, cut otherwise: `open.rs`).
    fn cuttable(&mut self, op: &CipherOp) -> bool {
        let Ok(s) = self.sessions.get(op.session) else {
            return false;
        };
        let Work::Cipher { mode, .. } = &s.work else {
            return false;
        };
        let whole_message = op.flags & (F_IV | F_FINAL) == F_IV | F_FINAL;
        let gcm = *mode == Mode::Gcm;
        *mode != Mode::Xts
            && op.len % s.alg.granule() == 0
            && !(gcm && op.flags & F_ENCRYPT == 0 && whole_message)
            && !(gcm && op.flags & F_FINAL != 0 && !(4..=16).contains(&op.tag_len))
    }

    /// A request of `desc`'s session failed after earlier pieces of it
    /// moved the session on: its message is lost, so that nothing goes on
    /// from the middle of it (a retry of the request, or its next part,
    /// would compute from the wrong chain or hash with status 0). Only a
    /// request that starts a message again (`F_IV`, `F_INIT`) is taken.
    pub(crate) fn lose_message(&mut self, desc: &Desc) {
        let session = match msg::decode(desc) {
            Ok(Request::Cipher(c)) => c.session,
            Ok(Request::Digest(d)) if d.alg.is_none() => d.session,
            _ => return,
        };
        let Ok(s) = self.sessions.get(session) else {
            return;
        };
        match &mut s.work {
            Work::Cipher {
                mode,
                started,
                chain,
                ..
            } => {
                *started = *mode == Mode::Ecb;
                *chain = Chain::None;
            }
            Work::Digest { ctx, lost } => {
                let _ = ctx.restart();
                *lost = true;
            }
        }
    }

    /// Fault now, if at all, on any memory a cipher or digest request
    /// reaches: a session's chain or running hash cannot be taken back,
    /// and a request that faults in a domain with the stall policy runs
    /// again from the start once the fault is resolved (see `Dma::probe`).
    pub(crate) fn probe(&mut self, req: &Request, dma: &mut dyn Dma<'_>) -> Result<(), i32> {
        let mut ranges = [(0u64, 0u64, Access::Read); 4];
        match *req {
            Request::Cipher(op) => {
                ranges[0] = (op.src, op.len, Access::Read);
                ranges[1] = (op.dst, op.len, Access::Write);
                ranges[2] = (op.aad, op.aad_len as u64, Access::Read);
                if op.flags & F_FINAL != 0 {
                    let access = if op.flags & F_ENCRYPT != 0 {
                        Access::Write
                    } else {
                        Access::Read
                    };
                    ranges[3] = (op.tag, op.tag_len as u64, access);
                }
            }
            Request::Digest(op) => {
                ranges[0] = (op.src, op.len, Access::Read);
                ranges[1] = (op.out, self.digest_out(&op) as u64, Access::Write);
            }
            _ => {}
        }
        for (iova, len, access) in ranges {
            dma::reach(dma, iova, len, access)?;
        }
        Ok(())
    }

    /// Bytes a digest request writes at `out`: its digest's length with
    /// the final part, else none.
    fn digest_out(&mut self, op: &DigestOp) -> usize {
        if op.flags & F_DIGEST_FINAL == 0 {
            return 0;
        }
        match op.alg {
            Some(a) => a.digest_len(),
            None => self
                .sessions
                .get(op.session)
                .map_or(0, |s| s.alg.digest_len()),
        }
    }

    /// Run bytes `done..` of a request cut in pieces, at most `piece` of
    /// them: each piece is the request's own chained continuation (IV and
    /// additional data with the first, tag and final digest with the
    /// last), so the result is the whole request's.
    pub(crate) fn piece(
        &mut self,
        req: Request,
        dma: &mut dyn Dma<'_>,
        done: u64,
        piece: u64,
    ) -> Option<(Result<u64, i32>, bool)> {
        let cut = match req {
            Request::Cipher(op) => done > 0 || (op.len > piece && self.cuttable(&op)),
            Request::Digest(op) => done > 0 || op.len > piece,
            _ => false,
        };
        if !cut {
            return None;
        }
        // Parts already run cannot be taken back: the whole request faults
        // now, if at all, before its first part.
        if done == 0 {
            if let Err(st) = self.probe(&req, dma) {
                return Some((Err(st), true));
            }
        }
        match req {
            Request::Cipher(op) => {
                let last = op.len - done <= piece;
                let mut p = op;
                p.src = op.src.checked_add(done)?;
                p.dst = op.dst.checked_add(done)?;
                p.len = if last { op.len - done } else { piece };
                if done > 0 {
                    p.flags &= !F_IV;
                    p.aad_len = 0;
                }
                if !last {
                    p.flags &= !F_FINAL;
                }
                Some((self.cipher(p, dma).map(|_| op.len), last))
            }
            Request::Digest(op) => {
                let last = op.len - done <= piece;
                let mut p = op;
                p.src = op.src.checked_add(done)?;
                p.len = if last { op.len - done } else { piece };
                if done > 0 {
                    p.flags &= !F_INIT;
                }
                if !last {
                    p.flags &= !F_DIGEST_FINAL;
                }
                Some((self.digest(p, dma), last))
            }
            _ => None,
        }
    }
}

impl DeviceQueue for SecQueue {
    fn process_part(
        &mut self,
        desc: &mut Desc,
        dma: &mut dyn Dma<'_>,
        done: u64,
        budget: u64,
    ) -> Progress {
        let piece = budget.max(MIN_PIECE) & !15;
        let req = msg::decode(desc);
        if let Ok(r) = &req {
            if let Some(p) = self.open_part(desc, r, dma, done, piece) {
                return p;
            }
            if let Some(p) = self.xts_part(desc, r, dma, done, piece) {
                return p;
            }
        }
        let cut = match req {
            Ok(req) => self.piece(req, dma, done, piece),
            Err(_) => None,
        };
        let r = match cut {
            None => {
                self.process(desc, dma);
                return Progress::Done;
            }
            Some((Ok(_), false)) => return Progress::More(done + piece),
            Some((r, _)) => r,
        };
        if r.is_err() && done > 0 {
            self.lose_message(desc);
        }
        complete(desc, r);
        Progress::Done
    }

    fn restartable(&self, desc: &Desc) -> bool {
        // Only the requests cut in calls that move no session (XTS data
        // units, a whole GCM decryption into host memory); a chain cut in
        // pieces (CBC, CTR, GCM streams, digests) moved its session on.
        self.xts_restartable(desc) || self.open_restartable(desc)
    }

    fn asynchronous(&self) -> bool {
        self.mb.is_some()
    }

    fn batch(&mut self, requests: usize) {
        self.gathering.pass(requests, self.pending.len());
    }

    fn start(&mut self, token: u64, desc: &mut Desc, dma: &mut dyn Dma<'_>) -> Started {
        // Requests of one session run in order: one behind a long request
        // of its session waits for a later pass (the long one goes on a
        // piece per poll; it was finished whole here, holding the engine).
        if !self.long.is_empty() && self.behind_long(desc) {
            return Started::Later;
        }
        if self.gathering.on() {
            if let Some(started) = self.gather(token, desc, dma) {
                return started;
            }
        }
        // What was gathered runs first: at once when its burst has not
        // started (short requests finish in that one round). A burst under
        // way goes on a round per poll; meanwhile this one runs unless it
        // must wait for it, as one behind a long request does.
        if !self.pending.is_empty() {
            if !self.gathering.under_way() {
                self.burst();
            }
            if self.gathering.under_way() && self.behind_burst(desc, dma) {
                return Started::Later;
            }
        }
        if self.hold_long(token, desc, dma) {
            return Started::Held;
        }
        // One long enough to be cut (its memory could not be held) the
        // engine runs as a synchronous queue's, in pieces within its
        // passes' budget (`process_part`).
        if self.bytes_of(desc) > MIN_PIECE {
            return Started::Cut;
        }
        self.process(desc, dma);
        Started::Done
    }

    fn poll(&mut self, done: &mut Vec<(u64, Desc)>) {
        if !self.pending.is_empty() && self.gathering.due(self.pending.len()) {
            self.burst();
        }
        self.gathering.polled();
        self.poll_long();
        done.append(&mut self.finished);
    }

    fn in_flight(&self) -> usize {
        self.pending.len() + self.finished.len() + self.long.len()
    }

    fn abort(&mut self, stopped: &mut Vec<(u64, Desc)>) {
        self.stop_gathered(stopped);
        self.stop_long(stopped);
        stopped.append(&mut self.finished);
    }

    fn bytes_of(&self, done: &Desc) -> u64 {
        // Session requests return a handle, digests their length: count the
        // data each one read instead.
        match msg::decode(done) {
            Ok(Request::Cipher(c)) => c.len,
            Ok(Request::Digest(g)) => g.len,
            _ => 0,
        }
    }

    fn process(&mut self, desc: &mut Desc, dma: &mut dyn Dma<'_>) {
        let r = match msg::decode(desc) {
            Err(e) => Err(e.status()),
            Ok(Request::Nop) => Ok(0),
            Ok(Request::SessionNew(s)) => self.session_new(s, dma),
            Ok(Request::SessionFree(f)) => self.sessions.remove(f.session).map(|_| 0),
            Ok(Request::SessionClone(c)) => self.session_clone(c),
            Ok(Request::Cipher(c)) => self.cipher(c, dma),
            Ok(Request::Digest(g)) => self.digest(g, dma),
        };
        complete(desc, r);
    }
}

/// Set a request's outcome: its result, or a negative errno and no result.
pub(crate) fn complete(desc: &mut Desc, r: Result<u64, i32>) {
    (desc.status, desc.result) = match r {
        Ok(v) => (status::OK, v),
        Err(st) => (st, 0),
    };
}
