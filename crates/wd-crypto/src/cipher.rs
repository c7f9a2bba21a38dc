//! Block cipher sessions (AES-ECB, CBC, CTR, XTS): chained streams across
//! requests, on the device or the CPU, switching between them without
//! breaking the chain.
//!
//! The chaining value (CBC IV, CTR counter and position) is tracked here
//! for every request, so a stream can move from the device to the CPU
//! (host gone, small request) and back: the device continues its own chain
//! while it holds it, and is given the tracked IV when it takes over.

use wd_sec::evp::CipherCtx;
use wd_sec::msg::{CipherOp, F_ENCRYPT, F_IV};
use wd_sec::{Alg, Mode};

use crate::lane::{self, device_status, Kind, Lane, LaneId, NoLane, SLOT};
use crate::route::{self, Route, Stopwatch};
use crate::stats::{self, Why};
use crate::{CryptoError, Result};

/// Encrypt or decrypt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Plaintext in, ciphertext out.
    Encrypt,
    /// Ciphertext in, plaintext out.
    Decrypt,
}

/// Where the chain of a stream currently lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Chain {
    /// Nowhere yet: the next request starts from the tracked IV.
    Fresh,
    /// The device session on this lane holds it.
    Device(LaneId),
    /// The CPU context holds it.
    Cpu,
}

/// Key bytes, wiped when dropped.
struct Key(Vec<u8>);

impl Drop for Key {
    fn drop(&mut self) {
        self.0.fill(0);
        std::hint::black_box(&self.0);
    }
}

/// A request in flight (see [`Cipher::start`]).
#[derive(Debug)]
#[must_use = "a started request must be finished to get its output and free its slots"]
pub struct Job {
    parts: Vec<Part>,
    len: usize,
    /// Bytes already in the output (computed on the CPU at start).
    done_on_cpu: bool,
}

#[derive(Debug)]
struct Part {
    lane: LaneId,
    token: u64,
    slot: u16,
    offset: usize,
    len: usize,
    /// CBC encryption: the chaining value comes from this part's output.
    last_of_cbc_encrypt: bool,
}

impl Job {
    /// Bytes this request produces.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it produces nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the request was computed at once (on the CPU).
    pub fn is_done(&self) -> bool {
        self.done_on_cpu
    }
}

/// A cipher session.
pub struct Cipher {
    alg: Alg,
    mode: Mode,
    key: Key,
    dir: Direction,
    iv: [u8; 16],
    iv_set: bool,
    /// CTR: bytes already used of the current keystream block.
    ctr_used: usize,
    chain: Chain,
    /// Device sessions of this key, per lane.
    dev: Vec<(LaneId, u64)>,
    cpu: Option<CipherCtx>,
    /// Device requests of this stream not yet finished.
    in_flight: usize,
}

impl std::fmt::Debug for Cipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cipher")
            .field("alg", &self.alg.name())
            .field("dir", &self.dir)
            .finish()
    }
}

impl Cipher {
    /// A session for `name` (e.g. `aes-128-cbc`) with `key`.
    pub fn new(name: &str, key: &[u8], dir: Direction) -> Result<Cipher> {
        let alg = Alg::by_name(name)
            .filter(|a| a.is_cipher())
            .ok_or_else(|| CryptoError::invalid(format!("unknown cipher '{name}'")))?;
        let Alg::Aes { mode, .. } = alg else {
            unreachable!("ciphers are AES")
        };
        if mode == Mode::Gcm {
            return Err(CryptoError::invalid(format!("{name} is an AEAD: use Aead")));
        }
        if key.len() != alg.key_len() {
            return Err(CryptoError::invalid(format!(
                "{name} needs a {}-byte key, got {}",
                alg.key_len(),
                key.len()
            )));
        }
        if mode == Mode::Xts && key[..key.len() / 2] == key[key.len() / 2..] {
            return Err(CryptoError::invalid("XTS needs two different key halves"));
        }
        Ok(Cipher {
            alg,
            mode,
            key: Key(key.to_vec()),
            dir,
            iv: [0; 16],
            iv_set: mode == Mode::Ecb,
            ctr_used: 0,
            chain: Chain::Fresh,
            dev: Vec::new(),
            cpu: None,
            in_flight: 0,
        })
    }

    /// The algorithm.
    pub fn alg(&self) -> Alg {
        self.alg
    }

    /// The direction.
    pub fn direction(&self) -> Direction {
        self.dir
    }

    /// Change direction (keeps the key; a new IV is needed, except ECB).
    pub fn set_direction(&mut self, dir: Direction) -> Result<()> {
        self.idle()?;
        if dir != self.dir {
            self.dir = dir;
            self.chain = Chain::Fresh;
            self.iv_set = self.mode == Mode::Ecb;
        }
        Ok(())
    }

    /// Start a new message with `iv` (CBC IV, CTR counter block, XTS tweak).
    pub fn set_iv(&mut self, iv: &[u8]) -> Result<()> {
        self.idle()?;
        if iv.len() != self.alg.iv_len() {
            return Err(CryptoError::invalid(format!(
                "{} needs a {}-byte IV, got {}",
                self.alg.name(),
                self.alg.iv_len(),
                iv.len()
            )));
        }
        self.iv[..iv.len()].copy_from_slice(iv);
        self.iv_set = true;
        self.ctr_used = 0;
        self.chain = Chain::Fresh;
        Ok(())
    }

    /// The current chaining value (CBC: the next IV; CTR: the counter).
    pub fn iv(&self) -> &[u8] {
        &self.iv[..self.alg.iv_len()]
    }

    fn idle(&self) -> Result<()> {
        if self.in_flight > 0 {
            return Err(CryptoError::invalid(
                "requests of this session are still in flight",
            ));
        }
        Ok(())
    }

    fn check(&self, input: &[u8], output: &[u8]) -> Result<()> {
        if output.len() < input.len() {
            return Err(CryptoError::invalid("output shorter than input"));
        }
        if !self.iv_set {
            return Err(CryptoError::invalid(match self.mode {
                Mode::Xts => "XTS needs set_iv (the tweak) before every data unit",
                _ => "set_iv first",
            }));
        }
        if input.len() as u64 % self.alg.granule() != 0 {
            return Err(CryptoError::invalid(format!(
                "{} works on whole 16-byte blocks; buffer partial blocks",
                self.alg.name()
            )));
        }
        if self.mode == Mode::Xts && input.len() < 16 {
            return Err(CryptoError::invalid(
                "an XTS data unit is at least 16 bytes",
            ));
        }
        Ok(())
    }

    /// Encrypt or decrypt `input` into `output` (at least as long),
    /// continuing the stream. Waits for the result.
    pub fn update(&mut self, input: &[u8], output: &mut [u8]) -> Result<usize> {
        let saved = self.chain_state();
        let alone = self.in_flight == 0;
        let (job, watch) = self.start_routed(input, output, false)?;
        let (n, on_cpu) = (job.len, job.done_on_cpu);
        match self.finish(job, output) {
            Ok(n) => {
                watch.stop(Kind::Cipher, n, on_cpu);
                Ok(n)
            }
            Err(e) if e.host_gone() && alone => {
                // The host died with this request: nothing of the stream is
                // lost (the input is here and the chain is tracked), so
                // redo it on the CPU.
                self.restore(saved);
                self.cpu_update(input, output)?;
                stats::on_cpu(n, Why::HostGone);
                Ok(n)
            }
            Err(e) => Err(e),
        }
    }

    fn chain_state(&self) -> ([u8; 16], usize, bool) {
        (self.iv, self.ctr_used, self.iv_set)
    }

    fn restore(&mut self, (iv, ctr_used, iv_set): ([u8; 16], usize, bool)) {
        self.iv = iv;
        self.ctr_used = ctr_used;
        self.iv_set = iv_set;
        self.chain = Chain::Fresh;
    }

    /// One message given as several pieces (a scatter list): the pieces
    /// go to the device as one batch of chained requests.
    pub fn update_sg(&mut self, inputs: &[&[u8]], outputs: &mut [&mut [u8]]) -> Result<usize> {
        if inputs.len() != outputs.len() {
            return Err(CryptoError::invalid("as many outputs as inputs are needed"));
        }
        let mut jobs = Vec::with_capacity(inputs.len());
        for (i, o) in inputs.iter().zip(outputs.iter_mut()) {
            match self.start_routed(i, o, true) {
                Ok((j, _)) => jobs.push(j),
                Err(e) => {
                    for (j, o) in jobs.into_iter().zip(outputs.iter_mut()) {
                        let _ = self.finish(j, o);
                    }
                    return Err(e);
                }
            }
        }
        let mut total = 0;
        let mut first_err = None;
        for (j, o) in jobs.into_iter().zip(outputs.iter_mut()) {
            match self.finish(j, o) {
                Ok(n) => total += n,
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(total), Err)
    }

    /// Start a request without waiting (asynchronous use): computed at once
    /// on the CPU when small, else sent to the device. `output` receives
    /// the CPU result now; a device result is copied into the buffer given
    /// to [`Cipher::finish`] or [`Cipher::poll`].
    pub fn start(&mut self, input: &[u8], output: &mut [u8]) -> Result<Job> {
        self.start_routed(input, output, true).map(|(j, _)| j)
    }

    fn start_routed(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        asynchronous: bool,
    ) -> Result<(Job, Stopwatch)> {
        self.check(input, output)?;
        let n = input.len();
        let cpu_job = Job {
            parts: Vec::new(),
            len: n,
            done_on_cpu: true,
        };
        if n == 0 {
            return Ok((cpu_job, Stopwatch::start(false)));
        }
        // A stream with requests on the device stays there (order).
        let (route, timed) = if self.in_flight > 0 {
            (Route::Device, false)
        } else {
            route::choose_timed(Kind::Cipher, n, asynchronous)
        };
        let watch = Stopwatch::start(timed);
        if let Route::Cpu(why) = route {
            self.cpu_update(input, output)?;
            stats::on_cpu(n, why);
            return Ok((cpu_job, watch));
        }
        // CTR in the middle of a keystream block: the device can only start
        // on a block boundary, so finish the block here.
        let mut head = 0;
        if self.mode == Mode::Ctr && self.ctr_used != 0 && !self.device_holds_chain() {
            head = (16 - self.ctr_used).min(n);
            self.cpu_update(&input[..head], &mut output[..head])?;
            stats::on_cpu(head, Why::Policy);
        }
        let saved = self.chain_state();
        let chain = self.chain;
        let r = lane::with_lane(Kind::Cipher, |lane| {
            self.device_submit(lane, &input[head..], head)
        });
        match r {
            Ok(Ok(parts)) => {
                self.in_flight += parts.len();
                let job = Job {
                    parts,
                    len: n,
                    done_on_cpu: false,
                };
                Ok((job, watch))
            }
            Ok(Err(e)) => Err(e),
            Err(no) => {
                if self.in_flight > 0 {
                    return Err(CryptoError::Device {
                        status: wrapdrive::Status::HostGone,
                        message: "the host went away with requests of this stream".into(),
                    });
                }
                // Parts sent before the host went away will never complete:
                // start over from the chain as it was.
                self.restore(saved);
                self.chain = if chain == Chain::Cpu {
                    Chain::Cpu
                } else {
                    Chain::Fresh
                };
                self.cpu_update(&input[head..], &mut output[head..])?;
                stats::on_cpu(
                    n - head,
                    if no == NoLane::HostGone {
                        Why::HostGone
                    } else {
                        Why::NoQueue
                    },
                );
                Ok((cpu_job, Stopwatch::start(false)))
            }
        }
    }

    fn device_holds_chain(&self) -> bool {
        matches!(self.chain, Chain::Device(_))
    }

    fn handle_for(&mut self, lane: &mut Lane) -> Result<u64> {
        if let Some(&(_, h)) = self.dev.iter().find(|(l, _)| *l == lane.id) {
            return Ok(h);
        }
        let h = lane.new_session(self.alg, &self.key.0)?;
        self.dev.push((lane.id, h));
        Ok(h)
    }

    /// Stage and submit `input` (cut into slots) as chained requests.
    fn device_submit(&mut self, lane: &mut Lane, input: &[u8], base: usize) -> Result<Vec<Part>> {
        let handle = self.handle_for(lane)?;
        let mut parts = Vec::with_capacity(input.len().div_ceil(SLOT));
        let mut off = 0;
        while off < input.len() {
            let len = (input.len() - off).min(SLOT);
            let Some(slot) = lane.take_slot() else {
                // Give back what is staged but unsent? Everything staged is
                // sent; the caller finishes those parts.
                return if parts.is_empty() {
                    Err(CryptoError::Busy)
                } else {
                    Err(CryptoError::invalid(
                        "request larger than the free staging area",
                    ))
                };
            };
            let piece = &input[off..off + len];
            lane.put(slot, 0, piece);
            let mut flags = if self.dir == Direction::Encrypt {
                F_ENCRYPT
            } else {
                0
            };
            let mut iv = [0u8; 16];
            let mut iv_len = 0;
            let continues = self.chain == Chain::Device(lane.id) && self.mode != Mode::Xts;
            if !continues && self.mode != Mode::Ecb {
                flags |= F_IV;
                iv = self.iv;
                iv_len = 16;
            } else if !continues {
                flags |= F_IV;
            }
            let addr = lane.slot_addr(slot);
            let desc = CipherOp {
                session: handle,
                flags,
                src: addr,
                dst: addr,
                len: len as u64,
                iv,
                iv_len,
                aad: 0,
                aad_len: 0,
                tag: 0,
                tag_len: 0,
            }
            .encode();
            let token = match lane.submit(desc) {
                Ok(t) => t,
                Err(e) => {
                    lane.put_slot(slot);
                    return Err(e);
                }
            };
            self.chain = Chain::Device(lane.id);
            let cbc_encrypt = self.mode == Mode::Cbc && self.dir == Direction::Encrypt;
            self.advance_chain(piece, None);
            parts.push(Part {
                lane: lane.id,
                token,
                slot,
                offset: base + off,
                len,
                last_of_cbc_encrypt: cbc_encrypt && off + len == input.len(),
            });
            off += len;
        }
        Ok(parts)
    }

    /// Wait for a started request and copy its result into `output`.
    pub fn finish(&mut self, job: Job, output: &mut [u8]) -> Result<usize> {
        self.complete(job, output, true).map(|r| r.expect("waited"))
    }

    /// Non-blocking [`Cipher::finish`]: `Ok(None)` (and the job back) while
    /// the device works.
    pub fn poll(
        &mut self,
        job: Job,
        output: &mut [u8],
    ) -> std::result::Result<usize, (Job, Option<CryptoError>)> {
        match self.complete(job, output, false) {
            Ok(Ok(n)) => Ok(n),
            Ok(Err(job)) => Err((job, None)),
            Err(e) => Err((
                Job {
                    parts: Vec::new(),
                    len: 0,
                    done_on_cpu: true,
                },
                Some(e),
            )),
        }
    }

    fn complete(
        &mut self,
        mut job: Job,
        output: &mut [u8],
        block: bool,
    ) -> Result<std::result::Result<usize, Job>> {
        if job.done_on_cpu {
            return Ok(Ok(job.len));
        }
        let mut first_err: Option<CryptoError> = None;
        let r = lane::with_open_lane(Kind::Cipher, |lane| {
            while let Some(p) = job.parts.first() {
                if p.lane != lane.id {
                    return Err(CryptoError::Device {
                        status: wrapdrive::Status::HostGone,
                        message: "the queue of this request is gone".into(),
                    });
                }
                let d = if block {
                    lane.wait(p.token)?
                } else {
                    match lane.poll(p.token)? {
                        Some(d) => d,
                        None => return Ok(false),
                    }
                };
                let p = job.parts.remove(0);
                self.in_flight -= 1;
                match device_status(d.status, "cipher") {
                    Ok(()) => {
                        let out = &mut output[p.offset..p.offset + p.len];
                        lane.get(p.slot, 0, out);
                        if p.last_of_cbc_encrypt {
                            self.iv.copy_from_slice(&out[out.len() - 16..]);
                        }
                        stats::offloaded(p.len);
                    }
                    Err(e) => {
                        // The device's chain is now unknown: restart it from
                        // the tracked IV next time.
                        self.chain = Chain::Fresh;
                        first_err.get_or_insert(e);
                    }
                }
                lane.put_slot(p.slot);
            }
            Ok(true)
        });
        match r {
            Ok(Ok(true)) => match first_err {
                Some(e) => Err(e),
                None => Ok(Ok(job.len)),
            },
            Ok(Ok(false)) => Ok(Err(job)),
            Ok(Err(e)) => {
                self.abandon(&job);
                Err(e)
            }
            Err(_) => {
                self.abandon(&job);
                Err(CryptoError::Device {
                    status: wrapdrive::Status::HostGone,
                    message: "the host went away before the request completed".into(),
                })
            }
        }
    }

    /// Forget the device parts of a job that can no longer complete.
    fn abandon(&mut self, job: &Job) {
        self.in_flight -= job.parts.len();
        self.chain = Chain::Fresh;
        self.dev
            .retain(|(l, _)| job.parts.iter().all(|p| p.lane != *l));
    }

    /// Compute on the CPU, continuing the chain.
    fn cpu_update(&mut self, input: &[u8], output: &mut [u8]) -> Result<()> {
        if self.cpu.is_none() {
            self.cpu = Some(CipherCtx::new(self.alg)?);
        }
        let ctx = self.cpu.as_mut().expect("made above");
        if self.chain != Chain::Cpu || self.mode == Mode::Xts {
            let iv = (self.mode != Mode::Ecb).then_some(&self.iv[..16]);
            ctx.init(Some(&self.key.0), iv, self.dir == Direction::Encrypt)?;
            if self.mode == Mode::Ctr && self.ctr_used > 0 {
                // Burn the used part of the current keystream block.
                let mut skip = [0u8; 16];
                ctx.update_in_place(&mut skip[..self.ctr_used])?;
            }
            self.chain = Chain::Cpu;
        }
        let n = input.len();
        ctx.update(&mut output[..n], input)?;
        self.advance_chain(input, Some(&output[..n]));
        Ok(())
    }

    /// Track the chaining value after `input` was processed (`output` when
    /// known; CBC encryption on the device learns it at completion).
    fn advance_chain(&mut self, input: &[u8], output: Option<&[u8]>) {
        let n = input.len();
        match (self.mode, self.dir) {
            (Mode::Cbc, Direction::Decrypt) => self.iv.copy_from_slice(&input[n - 16..]),
            (Mode::Cbc, Direction::Encrypt) => {
                if let Some(o) = output {
                    self.iv.copy_from_slice(&o[n - 16..]);
                }
            }
            (Mode::Ctr, _) => {
                let total = self.ctr_used + n;
                let blocks = (total / 16) as u128;
                let ctr = u128::from_be_bytes(self.iv).wrapping_add(blocks);
                self.iv = ctr.to_be_bytes();
                self.ctr_used = total % 16;
            }
            (Mode::Xts, _) => {
                // One data unit per tweak.
                self.iv_set = false;
            }
            _ => {}
        }
    }
}

impl Drop for Cipher {
    fn drop(&mut self) {
        let dev = std::mem::take(&mut self.dev);
        if dev.is_empty() {
            return;
        }
        let _ = lane::with_open_lane(Kind::Cipher, |lane| {
            for (l, h) in &dev {
                if *l == lane.id {
                    lane.free_session(*h);
                }
            }
            Ok(())
        });
    }
}
