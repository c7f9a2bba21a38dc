//! AES-GCM: one-shot `seal`/`open` (a decryption releases no plaintext
//! unless the tag matches) and a streaming form for callers such as an
//! OpenSSL provider (additional data, then data, then the tag).
//!
//! A message runs entirely on one path (the GHASH state cannot move), the
//! one its first data request is routed to.

use wd_evp::CipherCtx;
use wd_sec_msg::{Alg, Mode};
use wd_sec_msg::{CipherOp, F_ENCRYPT, F_FINAL, F_IV};

use crate::cipher::Direction;
use crate::lane::{self, device_status, Kind, Lane, LaneId, NoLane, SLOT};
use crate::route::{self, Op, Route, Stopwatch};
use crate::stats::{self, Why};
use crate::{config, CryptoError, Result};

enum Path {
    /// Not decided yet (no data request so far).
    Undecided,
    Device {
        lane: LaneId,
        /// Where it streams.
        mark: lane::Mark,
        handle: u64,
        started: bool,
    },
    Cpu(CipherCtx),
}

/// An AES-GCM key.
pub struct Aead {
    alg: Alg,
    key: Vec<u8>,
    dir: Direction,
    iv: Vec<u8>,
    aad: Vec<u8>,
    path: Path,
    /// Device sessions of this key, per lane (kept across messages).
    dev: Vec<lane::Session>,
    active: bool,
    /// The router asked for this message's data to be timed.
    timed: bool,
}

impl std::fmt::Debug for Aead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Aead")
            .field("alg", &self.alg.name())
            .finish()
    }
}

/// Most additional data a message sends with its first device request.
const MAX_DEVICE_AAD: usize = SLOT / 2;

fn gone() -> CryptoError {
    CryptoError::Device {
        status: wrapdrive::Status::HostGone,
        message: "the host went away in the middle of this message".into(),
    }
}

impl Aead {
    /// A key for `aes-128-gcm` or `aes-256-gcm`.
    pub fn new(name: &str, key: &[u8]) -> Result<Aead> {
        let alg = Alg::by_name(name)
            .filter(|a| {
                matches!(
                    a,
                    Alg::Aes {
                        mode: Mode::Gcm,
                        ..
                    }
                )
            })
            .ok_or_else(|| CryptoError::invalid(format!("unknown AEAD '{name}'")))?;
        if key.len() != alg.key_len() {
            return Err(CryptoError::invalid(format!(
                "{name} needs a {}-byte key, got {}",
                alg.key_len(),
                key.len()
            )));
        }
        Ok(Aead {
            alg,
            key: key.to_vec(),
            dir: Direction::Encrypt,
            iv: Vec::new(),
            aad: Vec::new(),
            path: Path::Undecided,
            dev: Vec::new(),
            active: false,
            timed: false,
        })
    }

    /// Encrypt `pt` into `ct` and write the tag (4..=16 bytes).
    pub fn seal(
        &mut self,
        iv: &[u8],
        aad: &[u8],
        pt: &[u8],
        ct: &mut [u8],
        tag: &mut [u8],
    ) -> Result<()> {
        // Before any output: a refusal writes nothing.
        check_tag_len(tag.len())?;
        self.begin(Direction::Encrypt, iv)?;
        self.aad(aad)?;
        self.update(pt, ct)?;
        self.finish_seal(tag)
    }

    /// Check `tag` and decrypt `ct` into `pt`; on a mismatch returns
    /// [`CryptoError::Auth`] and leaves `pt` zeroed.
    pub fn open(
        &mut self,
        iv: &[u8],
        aad: &[u8],
        ct: &[u8],
        tag: &[u8],
        pt: &mut [u8],
    ) -> Result<()> {
        if pt.len() < ct.len() {
            return Err(CryptoError::invalid("output shorter than input"));
        }
        check_tag_len(tag.len())?;
        self.begin(Direction::Decrypt, iv)?;
        self.aad(aad)?;
        // Everything in one staging slot: one request that checks the tag
        // before any plaintext leaves the device.
        if ct.len() + self.aad.len() + 16 <= SLOT {
            let (route, timed) = route::choose_timed(Op::Aead, ct.len(), false);
            if route == Route::Device {
                let watch = Stopwatch::start(timed);
                // Without a free slot (this thread's jobs hold them all) it
                // is computed here: the caller waits either way.
                let r = lane::with_lane(Kind::Cipher, |lane| {
                    if lane.free_slots() == 0 {
                        return Ok(false);
                    }
                    self.device_open_once(lane, ct, tag, pt).map(|()| true)
                });
                match r {
                    Ok(Ok(true)) => {
                        self.active = false;
                        watch.stop(Op::Aead, ct.len(), false);
                        return Ok(());
                    }
                    // Counted here: the message then runs here from its
                    // start, without asking (and counting) again.
                    Ok(Ok(false)) => {
                        crate::cipher::no_slot()?;
                        stats::on_cpu(ct.len(), Why::NoQueue);
                        self.timed = false;
                        self.here()?;
                    }
                    Ok(Err(e)) => {
                        self.active = false;
                        pt[..ct.len()].fill(0);
                        return Err(e);
                    }
                    Err(no) => {
                        crate::cipher::no_fallback(why(no))?;
                        stats::on_cpu(ct.len(), why(no));
                        self.timed = false;
                        self.here()?;
                    }
                }
            }
        }
        let r = self.update(ct, pt).and_then(|_| self.finish_open(tag));
        if r.is_err() {
            pt[..ct.len()].fill(0);
        }
        r
    }

    fn device_open_once(
        &mut self,
        lane: &mut Lane,
        ct: &[u8],
        tag: &[u8],
        pt: &mut [u8],
    ) -> Result<()> {
        let handle = self.handle_for(lane)?;
        let slot = lane.take_slot().ok_or(CryptoError::Busy)?;
        let base = lane.slot_addr(slot);
        lane.put(slot, 0, ct);
        lane.put(slot, ct.len(), &self.aad);
        lane.put(slot, ct.len() + self.aad.len(), tag);
        let d = self.op(
            handle,
            F_IV | F_FINAL,
            base,
            ct.len(),
            base + ct.len() as u64,
            self.aad.len(),
            base + (ct.len() + self.aad.len()) as u64,
            tag.len(),
        );
        let r = lane
            .call(d)
            .and_then(|d| device_status(d.status, "AES-GCM open"));
        if r.is_ok() {
            lane.get(slot, 0, &mut pt[..ct.len()]);
            stats::offloaded(ct.len());
        }
        // Leave no plaintext in shared memory either way.
        lane.put(slot, 0, &vec![0u8; ct.len()]);
        lane.put_slot(slot);
        r
    }

    #[allow(clippy::too_many_arguments)]
    fn op(
        &self,
        handle: u64,
        flags: u16,
        data: u64,
        len: usize,
        aad: u64,
        aad_len: usize,
        tag: u64,
        tag_len: usize,
    ) -> wrapdrive::Desc {
        let mut iv = [0u8; 16];
        let with_iv = flags & F_IV != 0;
        if with_iv {
            iv[..self.iv.len()].copy_from_slice(&self.iv);
        }
        let enc = if self.dir == Direction::Encrypt {
            F_ENCRYPT
        } else {
            0
        };
        CipherOp {
            session: handle,
            flags: flags | enc,
            src: data,
            dst: data,
            len: len as u64,
            iv,
            iv_len: if with_iv { self.iv.len() as u8 } else { 0 },
            aad,
            aad_len: aad_len as u32,
            tag,
            tag_len: tag_len as u8,
        }
        .encode()
    }

    fn handle_for(&mut self, lane: &mut Lane) -> Result<u64> {
        if let Some(s) = self.dev.iter().find(|s| s.lane == lane.id) {
            return Ok(s.handle);
        }
        let h = lane.new_session(self.alg, &self.key)?;
        self.dev.push(lane.session(h));
        Ok(h)
    }

    /// Direction of the current message.
    pub fn direction(&self) -> Direction {
        self.dir
    }

    /// Start a message (streaming form).
    pub fn begin(&mut self, dir: Direction, iv: &[u8]) -> Result<()> {
        if iv.is_empty() || iv.len() > 16 {
            return Err(CryptoError::invalid(
                "a GCM IV is 1 to 16 bytes (12 is standard)",
            ));
        }
        self.dir = dir;
        self.iv = iv.to_vec();
        self.aad.clear();
        self.path = Path::Undecided;
        self.active = true;
        Ok(())
    }

    /// Additional authenticated data (before any data).
    pub fn aad(&mut self, aad: &[u8]) -> Result<()> {
        self.need_active()?;
        if !matches!(self.path, Path::Undecided) {
            return Err(CryptoError::invalid(
                "additional data must come before the data",
            ));
        }
        // Any length: additional data past what a device request carries
        // is hashed here (`decide`). Its length is the caller's: memory
        // that cannot be had is an error, not an abort.
        self.aad
            .try_reserve(aad.len())
            .map_err(|_| CryptoError::Device {
                status: wrapdrive::Status::NoMemory,
                message: format!(
                    "cannot allocate {} bytes for the additional data",
                    aad.len()
                ),
            })?;
        self.aad.extend_from_slice(aad);
        Ok(())
    }

    fn need_active(&self) -> Result<()> {
        if !self.active {
            return Err(CryptoError::invalid("begin a message first"));
        }
        Ok(())
    }

    fn decide(&mut self, n: usize) -> Result<()> {
        if !matches!(self.path, Path::Undecided) {
            return Ok(());
        }
        // The first request carries the additional data, the data and the
        // tag in one staging slot: more than half a slot of additional
        // data is hashed here.
        let (route, timed) = if self.aad.len() <= MAX_DEVICE_AAD {
            route::choose_timed(Op::Aead, n.max(self.aad.len()), false)
        } else {
            (Route::Cpu(Why::Policy), false)
        };
        self.timed = timed;
        if route == Route::Device {
            let r = lane::with_lane(Kind::Cipher, |lane| {
                // No free slot (this thread's jobs hold them): here.
                if lane.free_slots() == 0 {
                    return Ok(None);
                }
                Ok(Some((lane.id, self.handle_for(lane)?)))
            });
            match r {
                Ok(Ok(None)) => {
                    crate::cipher::no_slot()?;
                    stats::on_cpu(n, Why::NoQueue)
                }
                Ok(Ok(Some((lane, handle)))) => {
                    self.path = Path::Device {
                        lane,
                        mark: lane::Mark::here(),
                        handle,
                        started: false,
                    };
                    return Ok(());
                }
                Ok(Err(e)) => return Err(e),
                Err(no) => {
                    crate::cipher::no_fallback(why(no))?;
                    stats::on_cpu(n, why(no));
                }
            }
        } else if let Route::Cpu(w) = route {
            stats::on_cpu(n, w);
        }
        self.here()
    }

    /// The message runs here from its start: key, IV and the additional
    /// data so far.
    fn here(&mut self) -> Result<()> {
        let mut ctx = CipherCtx::new(self.alg)?;
        ctx.init(
            Some(&self.key),
            Some(&self.iv),
            self.dir == Direction::Encrypt,
        )?;
        if !self.aad.is_empty() {
            ctx.aad(&self.aad)?;
        }
        self.path = Path::Cpu(ctx);
        Ok(())
    }

    /// Encrypt or decrypt more of the message.
    pub fn update(&mut self, input: &[u8], output: &mut [u8]) -> Result<usize> {
        self.need_active()?;
        if output.len() < input.len() {
            return Err(CryptoError::invalid("output shorter than input"));
        }
        self.decide(input.len())?;
        // A timed message's data is a sample for the router: per byte, the
        // cost of the path it took (one sample per decision: a long message
        // is not timed on every update).
        let watch = Stopwatch::start(self.timed && !input.is_empty());
        self.timed &= input.is_empty();
        if let Path::Cpu(ctx) = &mut self.path {
            ctx.update(output, input)?;
            watch.stop(Op::Aead, input.len(), true);
            return Ok(input.len());
        }
        let mut off = 0;
        while off < input.len() || (off == 0 && input.is_empty() && self.needs_start()) {
            let room = SLOT
                - 16
                - if self.needs_start() {
                    self.aad.len()
                } else {
                    0
                };
            let n = (input.len() - off).min(room);
            if !self.device_step(&input[off..off + n], Some(&mut output[off..off + n]), None)? {
                // Gone before its first request: all of it here.
                stats::on_cpu(input.len(), Why::HostGone);
                return self.update(input, output);
            }
            off += n;
            if input.is_empty() {
                break;
            }
        }
        watch.stop(Op::Aead, input.len(), false);
        Ok(input.len())
    }

    fn needs_start(&self) -> bool {
        matches!(self.path, Path::Device { started: false, .. })
    }

    /// One device request: data (maybe empty), AAD when starting, tag when
    /// finishing. False when the host was gone before the message's first
    /// request went through and the message now runs here (nothing of it
    /// lived in the host; the fallback is on): the caller does the step
    /// on the CPU path and counts it there.
    fn device_step(
        &mut self,
        data: &[u8],
        out: Option<&mut [u8]>,
        tag: Option<(&mut [u8], bool)>,
    ) -> Result<bool> {
        let Path::Device {
            lane: id,
            mark,
            handle,
            started,
        } = self.path
        else {
            unreachable!("device path")
        };
        mark.check("this message")?;
        let start = !started;
        let r = lane::with_open_lane(Kind::Cipher, |lane| {
            if lane.id != id {
                return Err(gone());
            }
            let slot = lane.take_slot().ok_or(CryptoError::Busy)?;
            let base = lane.slot_addr(slot);
            lane.put(slot, 0, data);
            let mut at = data.len();
            let mut flags = 0;
            let (mut aad, mut aad_len) = (0, 0);
            if start {
                flags |= F_IV;
                lane.put(slot, at, &self.aad);
                aad = base + at as u64;
                aad_len = self.aad.len();
                at += aad_len;
            }
            let (mut tag_at, mut tag_len) = (0, 0);
            if let Some((t, _)) = &tag {
                flags |= F_FINAL;
                if self.dir == Direction::Decrypt {
                    lane.put(slot, at, t);
                }
                tag_at = base + at as u64;
                tag_len = t.len();
            }
            let d = self.op(
                handle,
                flags,
                base,
                data.len(),
                aad,
                aad_len,
                tag_at,
                tag_len,
            );
            let r = lane
                .call(d)
                .and_then(|d| device_status(d.status, "AES-GCM"));
            if r.is_ok() {
                if let Some(o) = out {
                    lane.get(slot, 0, &mut o[..data.len()]);
                }
                if let Some((t, true)) = tag {
                    lane.get(slot, at, t);
                }
                stats::offloaded(data.len());
            }
            lane.put_slot(slot);
            r
        });
        // Started once a request went through: one refused before it was
        // sent (Busy) starts the message again next time.
        if let (Path::Device { started, .. }, Ok(Ok(()))) = (&mut self.path, &r) {
            *started = true;
        }
        match r.unwrap_or_else(|_| Err(gone())) {
            Ok(()) => Ok(true),
            Err(e) if start && e.host_gone() && config::fallback() => {
                self.here()?;
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Finish an encryption: write the tag (4..=16 bytes).
    pub fn finish_seal(&mut self, tag: &mut [u8]) -> Result<()> {
        self.need_active()?;
        check_tag_len(tag.len())?;
        if self.dir != Direction::Encrypt {
            return Err(CryptoError::invalid("this message decrypts"));
        }
        self.decide(0)?;
        if self.finish_on_device(tag, true)? {
            return Ok(());
        }
        self.active = false;
        let Path::Cpu(ctx) = &mut self.path else {
            unreachable!("the CPU path")
        };
        ctx.finish()?;
        ctx.tag(tag)?;
        Ok(())
    }

    /// Finish a decryption: check the tag ([`CryptoError::Auth`] if wrong).
    pub fn finish_open(&mut self, tag: &[u8]) -> Result<()> {
        self.need_active()?;
        check_tag_len(tag.len())?;
        if self.dir != Direction::Decrypt {
            return Err(CryptoError::invalid("this message encrypts"));
        }
        self.decide(0)?;
        if self.finish_on_device(&mut tag.to_vec(), false)? {
            return Ok(());
        }
        self.active = false;
        let Path::Cpu(ctx) = &mut self.path else {
            unreachable!("the CPU path")
        };
        ctx.set_tag(tag)?;
        ctx.finish().map_err(|_| CryptoError::Auth)
    }

    /// The message's last device request (`seal`: the tag written, else
    /// checked), when it runs on the device: true when done there, false
    /// when it runs here now. A finish refused before it was sent (no
    /// free slot; a message of another thread) leaves the message under
    /// way, to be finished again; any other outcome ends it.
    fn finish_on_device(&mut self, tag: &mut [u8], seal: bool) -> Result<bool> {
        if matches!(self.path, Path::Cpu(_)) {
            return Ok(false);
        }
        match self.device_step(&[], None, Some((tag, seal))) {
            Err(
                e @ (CryptoError::Busy
                | CryptoError::Device {
                    status: wrapdrive::Status::BadState,
                    ..
                }),
            ) => Err(e),
            r => {
                self.active = false;
                if let Ok(false) = r {
                    stats::on_cpu(0, Why::HostGone);
                }
                r
            }
        }
    }
}

fn check_tag_len(n: usize) -> Result<()> {
    if !(4..=16).contains(&n) {
        return Err(CryptoError::invalid("a GCM tag is 4 to 16 bytes"));
    }
    Ok(())
}

fn why(no: NoLane) -> Why {
    match no {
        NoLane::HostGone => Why::HostGone,
        NoLane::NoQueue => Why::NoQueue,
    }
}

impl Drop for Aead {
    fn drop(&mut self) {
        self.key.fill(0);
        lane::release_sessions(Kind::Cipher, &self.dev);
    }
}
