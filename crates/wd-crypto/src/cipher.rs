//! Block cipher sessions (AES-ECB, CBC, CTR, XTS): chained streams across
//! requests, on the device or the CPU, switching between them without
//! breaking the chain.
//!
//! The chaining value (CBC IV, CTR counter and position) is tracked here
//! for requests sent to the device, and read back from libcrypto when a
//! stream leaves the CPU, so a stream can move from the device to the CPU
//! (host gone, small request) and back: the device continues its own chain
//! while it holds it, and is given the tracked IV when it takes over.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use wd_evp::CipherCtx;
use wd_sec_msg::{Alg, Mode};
use wd_sec_msg::{CipherOp, F_ENCRYPT, F_IV};
use wrapdrive::SharedSpan;

use crate::config;
use crate::lane::{self, device_status, Kind, Lane, LaneId, NoLane, LARGE_SLOT, SLOT, SLOTS};
use crate::route::{self, Op, Route, Stopwatch};
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
    /// The CPU context holds it (the tracked IV is stale until synced).
    Cpu,
}

/// The data of one request: separate input and output, or one buffer
/// transformed in place.
enum Io<'a> {
    Copy(&'a [u8], &'a mut [u8]),
    InPlace(&'a mut [u8]),
}

impl<'a> Io<'a> {
    /// Separate buffers (the output at least as long as the input).
    fn copy(input: &'a [u8], output: &'a mut [u8]) -> Result<Io<'a>> {
        if output.len() < input.len() {
            return Err(CryptoError::invalid("output shorter than input"));
        }
        Ok(Io::Copy(input, &mut output[..input.len()]))
    }

    fn len(&self) -> usize {
        self.input().len()
    }

    fn input(&self) -> &[u8] {
        match self {
            Io::Copy(i, _) => i,
            Io::InPlace(b) => b,
        }
    }

    fn output(&mut self) -> &mut [u8] {
        match self {
            Io::Copy(_, o) => o,
            Io::InPlace(b) => b,
        }
    }

    /// The same request for a shorter borrow (to use it more than once).
    fn reborrow(&mut self) -> Io<'_> {
        match self {
            Io::Copy(i, o) => Io::Copy(i, o),
            Io::InPlace(b) => Io::InPlace(b),
        }
    }

    /// The bytes from `at` on.
    fn tail(self, at: usize) -> Io<'a> {
        match self {
            Io::Copy(i, o) => Io::Copy(&i[at..], &mut o[at..]),
            Io::InPlace(b) => Io::InPlace(&mut b[at..]),
        }
    }

    /// The first `n` bytes.
    fn head(self, n: usize) -> Io<'a> {
        match self {
            Io::Copy(i, o) => Io::Copy(&i[..n], &mut o[..n]),
            Io::InPlace(b) => Io::InPlace(&mut b[..n]),
        }
    }

    fn run(self, ctx: &mut CipherCtx) -> Result<()> {
        match self {
            Io::Copy(i, o) => ctx.update(o, i)?,
            Io::InPlace(b) => ctx.update_in_place(b)?,
        };
        Ok(())
    }
}

/// Where the device reads a request's input and writes its output.
#[derive(Clone, Copy)]
enum Src<'a> {
    /// The caller's bytes, copied into staging slots (the result is copied
    /// out at completion).
    Staged(&'a [u8]),
    /// Shared memory the device reads and writes where it is (the spans do
    /// not overlap, so the input is intact if the request must be redone).
    Shared {
        input: SharedSpan,
        output: SharedSpan,
    },
}

impl Src<'_> {
    fn len(&self) -> usize {
        match self {
            Src::Staged(b) => b.len(),
            Src::Shared { input, .. } => input.len() as usize,
        }
    }
}

/// Key bytes, wiped when dropped.
struct Key(Vec<u8>);

impl Drop for Key {
    fn drop(&mut self) {
        self.0.fill(0);
        std::hint::black_box(&self.0);
    }
}

/// A request in flight (see [`Cipher::start`]). It is finished on the
/// thread that started it: its parts are on that thread's queue, so it
/// cannot be sent to another thread.
///
/// Dropped unfinished, its output is lost: its staging slots come back
/// once the device is done with them, and its stream's message ends (the
/// next request needs an IV, as after a failed request). A job working in
/// place on the caller's shared memory may still be writing it after the
/// drop: finish such a job rather than drop it.
///
/// ```compile_fail
/// fn needs_send<T: Send>(_: T) {}
/// fn job(j: wd_crypto::Job) { needs_send(j) }
/// ```
#[derive(Debug)]
#[must_use = "a started request must be finished to get its output (dropped, it ends its message)"]
pub struct Job {
    parts: Vec<Part>,
    len: usize,
    /// Computed at once on the CPU (the output is already written).
    done_on_cpu: bool,
    /// The device writes the caller's shared memory: nothing to copy out.
    in_place: bool,
    /// Where it started (the C API can carry a job anywhere).
    mark: lane::Mark,
    /// The cipher that started it ([`Cipher::id`]): nothing else may
    /// finish it.
    cipher: u64,
    /// The first of its parts that failed, kept until the job is finished
    /// (a poll may see it before the other parts are done).
    failed: Option<Box<CryptoError>>,
    /// Its cipher's count of parts dropped unfinished.
    dropped: Option<Arc<AtomicUsize>>,
    _on_this_thread: std::marker::PhantomData<*const ()>,
}

#[derive(Debug)]
struct Part {
    lane: LaneId,
    token: u64,
    /// Held while the request is in flight (bounding requests in flight per
    /// lane); it holds the data unless `out` is set.
    slot: u16,
    /// The part's output, when the device writes it in place.
    out: Option<SharedSpan>,
    offset: usize,
    len: usize,
    /// CBC encryption: the chaining value comes from this part's output.
    last_of_cbc_encrypt: bool,
}

impl Job {
    fn cpu(len: usize) -> Job {
        Job {
            parts: Vec::new(),
            len,
            done_on_cpu: true,
            in_place: false,
            mark: lane::Mark::here(),
            cipher: 0,
            failed: None,
            dropped: None,
            _on_this_thread: std::marker::PhantomData,
        }
    }

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

    /// Whether this is the thread that started it (the only one that can
    /// finish it; a C caller may carry a job anywhere).
    pub fn on_this_thread(&self) -> bool {
        self.mark == lane::Mark::here()
    }
}

/// How a staged request is cut into pieces, one request each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    /// Slots: a caller that waits has the device at work on one piece
    /// while it copies the next.
    Slots,
    /// Whole, in a run of a large staging area, when longer than a slot
    /// and a run is free (else slots): a job's caller does not wait, and
    /// the engine's lanes take a long message whole.
    Large,
}

/// Most of a synchronous request in flight at once: half the staging
/// area, so this thread's asynchronous jobs keep room beside it.
const WINDOW: usize = SLOT * SLOTS / 2;
/// The longest job sent whole (in a large staging area): a quarter of
/// one, so that four such jobs are in flight in each.
const LARGE_WINDOW: usize = LARGE_SLOT * lane::LARGE_SLOTS / 4;

/// The tracked part of a stream's state, saved to redo a request.
type Saved = ([u8; 16], usize, bool);

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
    dev: Vec<lane::Session>,
    cpu: Option<CipherCtx>,
    /// Direction the CPU context's key schedule is for.
    cpu_keyed: Option<Direction>,
    /// Device requests of this stream not yet finished.
    in_flight: usize,
    /// CBC encryption: the part whose output is the stream's chaining
    /// value (the last one sent); jobs may finish in any order.
    cbc_tail: Option<(LaneId, u64)>,
    /// Unique per cipher, kept by its jobs.
    id: u64,
    /// Parts of this cipher's jobs dropped unfinished, not yet taken off
    /// `in_flight` (see [`Cipher::settle_dropped`]).
    dropped: Arc<AtomicUsize>,
}

impl std::fmt::Debug for Cipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cipher")
            .field("alg", &self.alg.name())
            .field("dir", &self.dir)
            .finish()
    }
}

/// With the CPU fallback forbidden, the error a request gets without a queue.
pub(crate) fn no_fallback(why: Why) -> Result<()> {
    if config::fallback() {
        return Ok(());
    }
    Err(CryptoError::Device {
        status: if why == Why::HostGone {
            wrapdrive::Status::HostGone
        } else {
            wrapdrive::Status::NoDevice
        },
        message: if why == Why::HostGone {
            "the WrapDrive host went away, and the CPU fallback is off (WD_CRYPTO_FALLBACK=0, or the provider's fallback setting)".into()
        } else {
            format!("no WrapDrive queue (no host answers at '{}', or it has no device for this algorithm: see `wd ls`), and the CPU fallback is off (WD_CRYPTO_FALLBACK=0, or the provider's fallback setting)", config::host_address())
        },
    })
}

/// A request this thread's jobs leave no staging slot for runs on the CPU,
/// unless the fallback is off: then it is `Busy` (try again after
/// finishing jobs), never computed here.
pub(crate) fn no_slot() -> Result<()> {
    if config::fallback() {
        return Ok(());
    }
    Err(CryptoError::Busy)
}

fn host_gone(message: &str) -> CryptoError {
    CryptoError::Device {
        status: wrapdrive::Status::HostGone,
        message: message.into(),
    }
}

impl Cipher {
    /// Whether a `Cipher` serves `alg`: every AES mode but GCM, an AEAD
    /// (see [`crate::Aead`]).
    pub fn serves(alg: Alg) -> bool {
        matches!(alg, Alg::Aes { mode, .. } if mode != Mode::Gcm)
    }

    /// A session for `name` (e.g. `aes-128-cbc`) with `key`.
    pub fn new(name: &str, key: &[u8], dir: Direction) -> Result<Cipher> {
        let alg = Alg::by_name(name)
            .filter(|a| a.is_cipher())
            .ok_or_else(|| CryptoError::invalid(format!("unknown cipher '{name}'")))?;
        if !Cipher::serves(alg) {
            return Err(CryptoError::invalid(format!("{name} is an AEAD: use Aead")));
        }
        let Alg::Aes { mode, .. } = alg else {
            unreachable!("ciphers are AES")
        };
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
            cpu_keyed: None,
            in_flight: 0,
            cbc_tail: None,
            id: {
                static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
                NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            },
            dropped: Arc::default(),
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

    /// The chain as a caller continuing the stream elsewhere needs it: the
    /// IV or counter block and, for CTR, the bytes used of that block.
    /// Refused when no message is under way (none begun, or the last one
    /// ended by a failed request or a finished XTS unit): the old value
    /// would continue a stream the device no longer continues.
    pub fn chain(&mut self) -> Result<([u8; 16], usize)> {
        self.idle()?;
        if !self.iv_set {
            return Err(CryptoError::invalid(
                "no message under way to take the chain of: set_iv starts one",
            ));
        }
        self.sync_from_cpu()?;
        Ok((self.iv, self.ctr_used))
    }

    /// Continue a stream from a chain computed elsewhere (see
    /// [`Cipher::chain`]).
    pub fn set_chain(&mut self, iv: &[u8; 16], ctr_used: usize) -> Result<()> {
        self.idle()?;
        if self.mode == Mode::Ecb || self.mode == Mode::Xts || ctr_used >= 16 {
            return Err(CryptoError::invalid(
                "only CBC and CTR streams carry a chain",
            ));
        }
        if self.mode == Mode::Cbc && ctr_used != 0 {
            return Err(CryptoError::invalid("a CBC chain is a whole block"));
        }
        self.iv = *iv;
        self.ctr_used = ctr_used;
        self.iv_set = true;
        self.chain = Chain::Fresh;
        Ok(())
    }

    /// The current chaining value (CBC: the next IV; CTR: the counter).
    pub fn iv(&mut self) -> &[u8] {
        let _ = self.sync_from_cpu();
        &self.iv[..self.alg.iv_len()]
    }

    /// Take the parts of jobs dropped unfinished off the requests in
    /// flight. Their output is lost, so the message ends there.
    fn settle_dropped(&mut self) {
        // A load first: the hot path pays no read-modify-write.
        if self.dropped.load(Ordering::Relaxed) == 0 {
            return;
        }
        let n = self.dropped.swap(0, Ordering::Relaxed);
        if n > 0 {
            self.in_flight -= n;
            self.end_message();
        }
    }

    fn idle(&mut self) -> Result<()> {
        self.settle_dropped();
        if self.in_flight > 0 {
            return Err(CryptoError::invalid(
                "requests of this session are still in flight",
            ));
        }
        Ok(())
    }

    fn check(&mut self, n: usize) -> Result<()> {
        self.settle_dropped();
        if !self.iv_set {
            return Err(CryptoError::invalid(match self.mode {
                Mode::Xts => "XTS needs set_iv (the tweak) before every data unit",
                _ => "set_iv first",
            }));
        }
        if n as u64 % self.alg.granule() != 0 {
            return Err(CryptoError::invalid(format!(
                "{} works on whole 16-byte blocks; buffer partial blocks",
                self.alg.name()
            )));
        }
        if self.mode == Mode::Xts && n < 16 {
            return Err(CryptoError::invalid(
                "an XTS data unit is at least 16 bytes",
            ));
        }
        Ok(())
    }

    /// Encrypt or decrypt `input` into `output` (at least as long),
    /// continuing the stream. Waits for the result.
    pub fn update(&mut self, input: &[u8], output: &mut [u8]) -> Result<usize> {
        self.update_io(Io::copy(input, output)?, false)
    }

    /// As [`Cipher::update`], sent to the device whatever the policy (for
    /// callers that route themselves); the CPU still takes over when there
    /// is no queue.
    pub fn update_offload(&mut self, input: &[u8], output: &mut [u8]) -> Result<usize> {
        self.update_io(Io::copy(input, output)?, true)
    }

    /// As [`Cipher::update_in_place`], sent to the device (see
    /// [`Cipher::update_offload`]).
    pub fn update_in_place_offload(&mut self, buf: &mut [u8]) -> Result<usize> {
        self.update_io(Io::InPlace(buf), true)
    }

    /// As [`Cipher::update`], transforming `buf` in place.
    pub fn update_in_place(&mut self, buf: &mut [u8]) -> Result<usize> {
        self.update_io(Io::InPlace(buf), false)
    }

    fn update_io(&mut self, io: Io<'_>, offload: bool) -> Result<usize> {
        let n = io.len();
        self.check(n)?;
        let routed = self.route_sync(n, offload);
        self.update_routed(io, routed)
    }

    /// As [`Cipher::update`] for buffers in WrapDrive's shared memory
    /// ([`wrapdrive::alloc`], [`wrapdrive::SharedBuf`]): the device reads
    /// `input` and writes `output` where they are, without the two staging
    /// copies, whatever `config::in_place` says (which governs buffers
    /// given as slices). `output` must be at least as long as `input`.
    /// Requests the CPU computes, and spans that overlap, go through a
    /// local copy (a request redone on the CPU after its host died needs
    /// its input intact).
    pub fn update_shared(&mut self, input: SharedSpan, output: SharedSpan) -> Result<usize> {
        self.update_span(input, output, false)
    }

    /// As [`Cipher::update_shared`], sent to the device whatever the policy
    /// (see [`Cipher::update_offload`]).
    pub fn update_shared_offload(
        &mut self,
        input: SharedSpan,
        output: SharedSpan,
    ) -> Result<usize> {
        self.update_span(input, output, true)
    }

    fn update_span(
        &mut self,
        input: SharedSpan,
        output: SharedSpan,
        offload: bool,
    ) -> Result<usize> {
        if output.len() < input.len() {
            return Err(CryptoError::invalid("output shorter than input"));
        }
        let output = output.sub(0, input.len());
        let n = input.len() as usize;
        self.check(n)?;
        let routed = self.route_sync(n, offload);
        let direct = matches!(routed.0, Route::Device)
            && n <= WINDOW
            && !input.overlaps(&output)
            && self.ctr_head(n) == 0
            && self.reach(&[input, output]);
        if !direct {
            let mut buf = vec![0u8; n];
            input.read(0, &mut buf);
            self.update_routed(Io::InPlace(&mut buf), routed)?;
            output.write(0, &buf);
            return Ok(n);
        }
        let watch = Stopwatch::start(routed.1);
        let saved = self.saved();
        let alone = self.in_flight == 0;
        let r = match self.submit(Src::Shared { input, output }, 0, Cut::Slots) {
            Ok(Ok(mut job)) => {
                job.in_place = true;
                self.complete(job, &mut [], true).map(|_| ())
            }
            Ok(Err(why)) => Err((host_gone("no queue"), Some(why))),
            // No free slot: computed here, as `device_window` does.
            Err(CryptoError::Busy) => Err((CryptoError::Busy, Some(Why::NoQueue))),
            Err(e) => return Err(e),
        };
        self.after_device(r, saved, alone, watch, n, |c| {
            let mut buf = vec![0u8; n];
            input.read(0, &mut buf);
            c.cpu_update(Io::InPlace(&mut buf))?;
            output.write(0, &buf);
            Ok(())
        })
    }

    /// Whether this thread's lane can reach every span in place (sharing
    /// their arenas with its queue if needed).
    fn reach(&self, spans: &[SharedSpan]) -> bool {
        lane::with_lane(Kind::Cipher, |lane| {
            spans.iter().try_for_each(|s| lane.reach(s))
        })
        .is_ok_and(|r| r.is_ok())
    }

    fn route_sync(&self, n: usize, offload: bool) -> (Route, bool) {
        if self.too_long_for_a_slot(n) {
            return (Route::Cpu(Why::Policy), false);
        }
        if offload {
            (Route::Device, false)
        } else {
            self.route(n, false)
        }
    }

    /// An XTS data unit goes to the device in one request, which a
    /// staging slot bounds: a longer one is computed here (cut in slots,
    /// each piece would start again from the tweak).
    fn too_long_for_a_slot(&self, n: usize) -> bool {
        self.mode == Mode::Xts && n > SLOT
    }

    fn update_routed(&mut self, mut io: Io<'_>, routed: (Route, bool)) -> Result<usize> {
        let n = io.len();
        let timed = match routed {
            (Route::Cpu(why), timed) => {
                let watch = Stopwatch::start(timed);
                self.cpu_update(io)?;
                stats::on_cpu(n, why);
                watch.stop(Op::Cipher, n, true);
                return Ok(n);
            }
            (Route::Device, timed) => timed,
        };
        // A window at a time (the staging area bounds what is in flight),
        // each one chained on from the last. A CTR stream inside a block
        // does the rest of the block here first, before every window: one
        // that ran on the CPU may leave it so.
        let mut at = 0;
        while at < n {
            let head = self.ctr_head(n - at);
            if head > 0 {
                self.cpu_update(io.reborrow().tail(at).head(head))?;
                stats::on_cpu(head, Why::Policy);
                at += head;
                continue;
            }
            let w = (n - at).min(WINDOW);
            let watch = Stopwatch::start(timed);
            self.device_window(io.reborrow().tail(at).head(w), watch)?;
            at += w;
        }
        Ok(n)
    }

    /// One window of a synchronous request on the device. Without a free
    /// slot for each of its pieces (this thread's jobs in flight hold
    /// them) it is computed here, the caller waiting either way, unless
    /// requests of this stream are in flight (then the stream's chain is
    /// the device's, and the window fails with Busy, nothing sent).
    fn device_window(&mut self, mut io: Io<'_>, watch: Stopwatch) -> Result<usize> {
        let n = io.len();
        let saved = self.saved();
        let alone = self.in_flight == 0;
        let src = self.source(&io, 0);
        let in_place = matches!(src, Src::Shared { .. });
        let r = match self.submit(src, 0, Cut::Slots) {
            Ok(Ok(mut job)) => {
                job.in_place = in_place;
                self.complete(job, io.output(), true).map(|_| ())
            }
            Ok(Err(why)) => Err((host_gone("no queue"), Some(why))),
            Err(CryptoError::Busy) => Err((CryptoError::Busy, Some(Why::NoQueue))),
            Err(e) => return Err(e),
        };
        self.after_device(r, saved, alone, watch, n, |c| c.cpu_update(io))
    }

    /// Where the device finds the request from `head` on: in place, when
    /// configured (`config::in_place`), if input and output are both in the WrapDrive allocator's arenas
    /// (reachable from this thread's lane) and separate buffers that do not
    /// overlap (the input must stay intact for a redo on the CPU), else
    /// staged.
    fn source<'a>(&self, io: &'a Io<'_>, head: usize) -> Src<'a> {
        if !config::in_place() {
            return Src::Staged(&io.input()[head..]);
        }
        if let Io::Copy(input, output) = io {
            let len = (input.len() - head) as u64;
            let spans = SharedSpan::locate(input[head..].as_ptr() as u64, len)
                .zip(SharedSpan::locate(output[head..].as_ptr() as u64, len));
            if let Some((input, output)) = spans {
                if !input.overlaps(&output) && self.reach(&[input, output]) {
                    return Src::Shared { input, output };
                }
            }
        }
        Src::Staged(&io.input()[head..])
    }

    /// After a device attempt: on success report the time; when the host
    /// died with the request (or there was no queue), redo it on the CPU:
    /// the input is intact (the output is written only at completion) and
    /// the chain was saved.
    fn after_device(
        &mut self,
        r: std::result::Result<(), (CryptoError, Option<Why>)>,
        saved: Saved,
        alone: bool,
        watch: Stopwatch,
        n: usize,
        redo: impl FnOnce(&mut Cipher) -> Result<()>,
    ) -> Result<usize> {
        match r {
            Ok(()) => {
                watch.stop(Op::Cipher, n, false);
                Ok(n)
            }
            Err((e, why)) if (e.host_gone() || why.is_some()) && alone && config::fallback() => {
                self.restore(saved);
                redo(self)?;
                stats::on_cpu(n, why.unwrap_or(Why::HostGone));
                Ok(n)
            }
            // No free slot (this thread's jobs hold them): try again
            // after finishing them.
            Err((CryptoError::Busy, _)) => Err(CryptoError::Busy),
            Err((_, Some(why))) if !config::fallback() => no_fallback(why).map(|_| n),
            Err((e, _)) => Err(e),
        }
    }

    /// One message given as several pieces (a scatter list): the pieces
    /// go to the device as one batch of chained requests.
    pub fn update_sg(&mut self, inputs: &[&[u8]], outputs: &mut [&mut [u8]]) -> Result<usize> {
        if inputs.len() != outputs.len() {
            return Err(CryptoError::invalid("as many outputs as inputs are needed"));
        }
        let alone = self.in_flight == 0;
        if !alone {
            // Jobs of this stream are in flight, so a Busy half-way could
            // not put the stream back where it was: the list goes only if
            // all of it fits in the free slots now (counted as if every
            // piece went to the device; this thread alone takes them).
            let need: usize = inputs.iter().map(|i| i.len().div_ceil(SLOT)).sum();
            let free = lane::with_lane(Kind::Cipher, |lane| Ok(lane.free_slots()));
            if free.is_ok_and(|f| f.is_ok_and(|f| need > f)) {
                return Err(CryptoError::Busy);
            }
        }
        let saved = self.saved();
        let mut jobs: Vec<(Job, usize)> = Vec::with_capacity(inputs.len());
        let mut first_err = None;
        let mut total = 0;
        for k in 0..inputs.len() {
            let mut r = self.start(inputs[k], outputs[k]);
            if matches!(r, Err(CryptoError::Busy)) && !jobs.is_empty() {
                // More pieces than free slots: finish those in flight,
                // then go on (a piece refused sent nothing).
                total += self.finish_all(&mut jobs, outputs, &mut first_err);
                r = self.start(inputs[k], outputs[k]);
            }
            if matches!(r, Err(CryptoError::Busy)) && alone && first_err.is_none() {
                // Still none (other streams' jobs hold them): the piece
                // runs as a synchronous request does (here, or Busy with
                // the fallback off).
                r = self.update(inputs[k], outputs[k]).map(Job::cpu);
            }
            match r {
                Ok(j) => jobs.push((j, k)),
                Err(e) => {
                    first_err = Some(e);
                    break;
                }
            }
        }
        total += self.finish_all(&mut jobs, outputs, &mut first_err);
        if matches!(first_err, Some(CryptoError::Busy)) && alone {
            // Busy means "send it again": the pieces done count for
            // nothing, and the stream is back where the call found it.
            self.restore(saved);
        }
        first_err.map_or(Ok(total), Err)
    }

    /// Finish `jobs` (each with the index of its output), keeping the first
    /// error; the bytes they produced.
    fn finish_all(
        &mut self,
        jobs: &mut Vec<(Job, usize)>,
        outputs: &mut [&mut [u8]],
        first_err: &mut Option<CryptoError>,
    ) -> usize {
        let mut total = 0;
        for (j, k) in jobs.drain(..) {
            match self.finish(j, outputs[k]) {
                Ok(n) => total += n,
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        total
    }

    /// Start a request without waiting (asynchronous use): computed at once
    /// on the CPU when small, else sent to the device. `output` receives a
    /// CPU result now; a device result is copied into the buffer given to
    /// [`Cipher::finish`] or [`Cipher::poll`] (the same `output`). When
    /// both buffers are WrapDrive shared memory (the C API's `wd_alloc`
    /// buffers) the device reads and writes them in place while the job is
    /// in flight: leave them untouched until it is finished.
    pub fn start(&mut self, input: &[u8], output: &mut [u8]) -> Result<Job> {
        self.start_io(Io::copy(input, output)?, false)
    }

    /// As [`Cipher::start`], sent to the device whatever the policy (for
    /// callers that route themselves); the CPU still takes over without a
    /// queue.
    pub fn start_offload(&mut self, input: &[u8], output: &mut [u8]) -> Result<Job> {
        self.start_io(Io::copy(input, output)?, true)
    }

    /// As [`Cipher::start_in_place`], sent to the device (see
    /// [`Cipher::start_offload`]).
    pub fn start_in_place_offload(&mut self, buf: &mut [u8]) -> Result<Job> {
        self.start_io(Io::InPlace(buf), true)
    }

    /// As [`Cipher::start`] in place: finish with the same `buf`.
    pub fn start_in_place(&mut self, buf: &mut [u8]) -> Result<Job> {
        self.start_io(Io::InPlace(buf), false)
    }

    fn start_io(&mut self, mut io: Io<'_>, offload: bool) -> Result<Job> {
        let n = io.len();
        self.check(n)?;
        let routed = self.route_async(n, offload);
        if let (Route::Cpu(why), _) = routed {
            self.cpu_update(io)?;
            stats::on_cpu(n, why);
            return Ok(Job::cpu(n));
        }
        let long = n > WINDOW;
        if long && n > LARGE_WINDOW {
            // More than the staging area holds at once: run now, a window
            // at a time, and hand back a finished job.
            self.update_routed(io, routed)?;
            return Ok(Job::cpu(n));
        }
        // Saved before the head: a request refused (Busy) must leave the
        // stream where it was, so that it can be sent again.
        let saved = self.saved();
        let head = self.ctr_head(n);
        if head > 0 {
            self.cpu_update(io.reborrow().head(head))?;
            stats::on_cpu(head, Why::Policy);
        }
        let src = self.source(&io, head);
        let in_place = matches!(src, Src::Shared { .. });
        match self.submit(src, head, Cut::Large) {
            Ok(Ok(mut job)) => {
                job.len = n;
                job.in_place = in_place;
                Ok(job)
            }
            Ok(Err(why)) => {
                self.restore(saved);
                no_fallback(why)?;
                self.cpu_update(io)?;
                stats::on_cpu(n, why);
                Ok(Job::cpu(n))
            }
            Err(e) => {
                // Refused before anything was sent (Busy): only a head done
                // here moved the stream, and then its chain was not on
                // this lane. A CBC encryption's chain in flight is learnt
                // at completion and must not be reset.
                if head > 0 {
                    self.restore(saved);
                }
                if long && matches!(e, CryptoError::Busy) && self.in_flight == 0 {
                    // More than the slots hold, and the large areas are
                    // held by this thread's other jobs: computed here now
                    // while the device works on those, as a request short
                    // of slots is. A job no large area takes (in
                    // place, or a lane without one: legacy, or refused)
                    // goes a window at a time, as a longer one does (it
                    // would never get more than the 64 slots); so does
                    // every one with the fallback off.
                    let area_held = !in_place
                        && lane::with_open_lane(Kind::Cipher, |l| Ok(l.has_large()))
                            .is_ok_and(|r| r.unwrap_or(false));
                    if config::fallback() && area_held {
                        self.cpu_update(io)?;
                        stats::on_cpu(n, Why::NoQueue);
                    } else {
                        self.update_routed(io, routed)?;
                    }
                    return Ok(Job::cpu(n));
                }
                Err(e)
            }
        }
    }

    /// Where a request of `n` bytes goes; a stream with requests on the
    /// device stays there (order).
    fn route(&self, n: usize, asynchronous: bool) -> (Route, bool) {
        if self.in_flight > 0 {
            return (Route::Device, false);
        }
        route::choose_timed(Op::Cipher, n, asynchronous)
    }

    fn route_async(&self, n: usize, offload: bool) -> (Route, bool) {
        if self.too_long_for_a_slot(n) {
            return (Route::Cpu(Why::Policy), false);
        }
        if offload {
            (Route::Device, false)
        } else {
            self.route(n, true)
        }
    }

    /// CTR in the middle of a keystream block: the device can only start
    /// on a block boundary, so this many bytes are done here first.
    fn ctr_head(&mut self, n: usize) -> usize {
        if self.mode != Mode::Ctr {
            return 0;
        }
        if let Chain::Device(id) = self.chain {
            // On a block boundary any lane starts from the tracked counter
            // (tracked exactly while the device holds the chain), so the
            // lane is looked up only in the middle of a block: the device
            // goes on from there only on the lane that holds the chain;
            // another lane (another thread's, or this thread's made again)
            // needs the rest of the block done here first.
            if self.ctr_used == 0 {
                return 0;
            }
            let here = lane::with_open_lane(Kind::Cipher, |l| Ok(l.id == id));
            if matches!(here, Ok(Ok(true))) {
                return 0;
            }
            self.chain = Chain::Fresh;
        }
        let _ = self.sync_from_cpu();
        if self.ctr_used == 0 {
            0
        } else {
            (16 - self.ctr_used).min(n)
        }
    }

    fn saved(&mut self) -> Saved {
        let _ = self.sync_from_cpu();
        (self.iv, self.ctr_used, self.iv_set)
    }

    fn restore(&mut self, (iv, ctr_used, iv_set): Saved) {
        self.iv = iv;
        self.ctr_used = ctr_used;
        self.iv_set = iv_set;
        self.chain = Chain::Fresh;
    }

    /// When the CPU context holds the chain, copy it into the tracked
    /// fields (so another path can continue from it).
    fn sync_from_cpu(&mut self) -> Result<()> {
        if self.chain != Chain::Cpu || !matches!(self.mode, Mode::Cbc | Mode::Ctr) {
            return Ok(());
        }
        if let Some(ctx) = self.cpu.as_mut() {
            let (iv, num) = ctx.chain_state()?;
            self.iv = iv;
            self.ctr_used = 0;
            if self.mode == Mode::Ctr && num > 0 {
                // libcrypto has already stepped its counter past the block
                // it is using up; ours names that block.
                self.iv = u128::from_be_bytes(iv).wrapping_sub(1).to_be_bytes();
                self.ctr_used = num;
            }
        }
        self.chain = Chain::Fresh;
        Ok(())
    }

    fn handle_for(&mut self, lane: &mut Lane) -> Result<u64> {
        if let Some(s) = self.dev.iter().find(|s| s.lane == lane.id) {
            return Ok(s.handle);
        }
        let h = lane.new_session(self.alg, &self.key.0)?;
        self.dev.push(lane.session(h));
        Ok(h)
    }

    /// Send `src` to the device as chained requests; `Ok(Err(why))`
    /// when there is no queue (the caller computes on the CPU).
    fn submit(
        &mut self,
        src: Src<'_>,
        base: usize,
        cut: Cut,
    ) -> Result<std::result::Result<Job, Why>> {
        self.sync_from_cpu()?;
        let r = lane::with_lane(Kind::Cipher, |lane| {
            self.device_submit(lane, src, base, cut)
        });
        match r {
            Ok(Ok(parts)) => {
                self.in_flight += parts.len();
                Ok(Ok(Job {
                    parts,
                    len: base + src.len(),
                    done_on_cpu: false,
                    in_place: false,
                    mark: lane::Mark::here(),
                    cipher: self.id,
                    failed: None,
                    dropped: Some(self.dropped.clone()),
                    _on_this_thread: std::marker::PhantomData,
                }))
            }
            Ok(Err(e)) => Err(e),
            Err(NoLane::NoQueue) if self.in_flight == 0 => Ok(Err(Why::NoQueue)),
            Err(NoLane::HostGone) if self.in_flight == 0 => Ok(Err(Why::HostGone)),
            Err(_) => Err(host_gone("the host went away with requests of this stream")),
        }
    }

    /// Submit `src` (cut into pieces as `cut` says, staged unless in
    /// place) as chained requests.
    fn device_submit(
        &mut self,
        lane: &mut Lane,
        src: Src<'_>,
        base: usize,
        cut: Cut,
    ) -> Result<Vec<Part>> {
        if self.in_flight > 0 && self.chain != Chain::Device(lane.id) {
            // Its chain is in those requests (a CBC encryption's is learnt
            // at their completion): nothing can go on elsewhere before.
            return Err(lane::elsewhere("this stream, with requests in flight,"));
        }
        let handle = self.handle_for(lane)?;
        let total = src.len();
        // Every piece gets a slot, or none is sent: a request sent in
        // part would leave its pieces on the device, their slots taken
        // and the chain moved on, behind a Busy.
        let large = match (cut, src) {
            (Cut::Large, Src::Staged(_)) if total > SLOT => lane.take_large(total),
            _ => None,
        };
        if large.is_none() {
            if total.div_ceil(SLOT) > SLOTS {
                // More than the slots hold: no orphan waited for helps.
                return Err(CryptoError::Busy);
            }
            lane.reclaim(total.div_ceil(SLOT));
            if total.div_ceil(SLOT) > lane.free_slots() {
                return Err(CryptoError::Busy);
            }
        }
        let piece = if large.is_some() { total } else { SLOT };
        let mut parts = Vec::with_capacity(total.div_ceil(piece));
        let mut off = 0;
        while off < total {
            let len = (total - off).min(piece);
            let slot = match large {
                Some(s) => s,
                None => lane.take_slot().ok_or(CryptoError::Busy)?,
            };
            // The piece's last (up to) 16 input bytes: a CBC decryption's
            // next chaining value.
            let mut tail = [0u8; 16];
            let tail_len = len.min(16);
            let (src_addr, dst_addr, out) = match src {
                Src::Staged(input) => {
                    let piece = &input[off..off + len];
                    lane.put(slot, 0, piece);
                    tail[..tail_len].copy_from_slice(&piece[len - tail_len..]);
                    (lane.slot_addr(slot), lane.slot_addr(slot), None)
                }
                Src::Shared { input, output } => {
                    input.read((off + len - tail_len) as u64, &mut tail[..tail_len]);
                    let out = output.sub(off as u64, len as u64);
                    (input.addr() + off as u64, out.addr(), Some(out))
                }
            };
            let mut flags = if self.dir == Direction::Encrypt {
                F_ENCRYPT
            } else {
                0
            };
            let mut iv = [0u8; 16];
            let mut iv_len = 0;
            let continues = self.chain == Chain::Device(lane.id) && self.mode != Mode::Xts;
            if !continues {
                flags |= F_IV;
                if self.mode != Mode::Ecb {
                    iv = self.iv;
                    iv_len = 16;
                }
            }
            let desc = CipherOp {
                session: handle,
                flags,
                src: src_addr,
                dst: dst_addr,
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
            self.advance_chain(len, &tail[..tail_len]);
            let last_of_cbc_encrypt =
                self.mode == Mode::Cbc && self.dir == Direction::Encrypt && off + len == total;
            if last_of_cbc_encrypt {
                self.cbc_tail = Some((lane.id, token));
            }
            parts.push(Part {
                lane: lane.id,
                token,
                slot,
                out,
                offset: base + off,
                len,
                last_of_cbc_encrypt,
            });
            off += len;
        }
        Ok(parts)
    }

    /// Wait for a started request and copy its result into `output` (the
    /// buffer given to `start`).
    pub fn finish(&mut self, job: Job, output: &mut [u8]) -> Result<usize> {
        self.is_mine(&job)?;
        match self.complete(job, output, true) {
            Ok(Ok(n)) => Ok(n),
            Ok(Err(_)) => unreachable!("a blocking finish completes"),
            Err((e, _)) => Err(e),
        }
    }

    /// Non-blocking [`Cipher::finish`]: `Err((job, None))` while the
    /// device works (call again with the job), `Err((_, Some(e)))` if the
    /// request failed. A job of another cipher, or an output shorter than
    /// the request, is refused with the job handed back (call again
    /// right): giving its slots back would mean waiting for it.
    pub fn poll(
        &mut self,
        job: Job,
        output: &mut [u8],
    ) -> std::result::Result<usize, (Job, Option<CryptoError>)> {
        if let Err(e) = self.is_mine(&job) {
            return Err((job, Some(e)));
        }
        if !job.done_on_cpu && !job.in_place && output.len() < job.len {
            let e = CryptoError::invalid("output shorter than the request: poll again with it");
            return Err((job, Some(e)));
        }
        match self.complete(job, output, false) {
            Ok(Ok(n)) => Ok(n),
            Ok(Err(job)) => Err((job, None)),
            Err((e, _)) => Err((Job::cpu(0), Some(e))),
        }
    }

    /// A job of another cipher is refused, neither stream's state moving
    /// (it stays in its own cipher's count of requests in flight: `poll`
    /// hands it back).
    fn is_mine(&self, job: &Job) -> Result<()> {
        if job.done_on_cpu || job.cipher == self.id {
            return Ok(());
        }
        Err(CryptoError::Device {
            status: wrapdrive::Status::BadState,
            message: "this job was started by another cipher: finish it there".into(),
        })
    }

    /// Finish a job: `Ok(Err(job))` if not done (non-blocking), the error
    /// with "no queue" otherwise.
    #[allow(clippy::type_complexity)]
    fn complete(
        &mut self,
        mut job: Job,
        output: &mut [u8],
        block: bool,
    ) -> std::result::Result<std::result::Result<usize, Job>, (CryptoError, Option<Why>)> {
        if job.done_on_cpu {
            return Ok(Ok(job.len));
        }
        if let Err(e) = job.mark.check("this job") {
            // Its parts are on another thread's (or process's) queue.
            self.abandon(&mut job);
            return Err((e, None));
        }
        if !job.in_place && output.len() < job.len {
            self.drop_job(job);
            return Err((
                CryptoError::invalid("output shorter than the request"),
                None,
            ));
        }
        let mut first_err = job.failed.take().map(|e| *e);
        let mut gone = false;
        let r = lane::with_open_lane(Kind::Cipher, |lane| {
            while let Some(p) = job.parts.first() {
                if p.lane != lane.id {
                    // Its session went with the host (its queue made again
                    // on a restarted one since), or its lane is gone. The
                    // slots this lane still holds come back with their
                    // completions (the queue sent them again or failed
                    // them), as a dropped job's do. Not a host-gone error
                    // from here: that would drop this lane (live, on the
                    // restarted host) and the thread's jobs on it.
                    for p in &job.parts {
                        if lane.holds(p.lane) {
                            lane.orphan(p.token, p.slot);
                        }
                    }
                    gone = true;
                    return Ok(false);
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
                        let last = p.last_of_cbc_encrypt
                            && self.chain == Chain::Device(p.lane)
                            && self.cbc_tail == Some((p.lane, p.token));
                        match p.out {
                            Some(out) => {
                                if last {
                                    out.read(out.len() - 16, &mut self.iv);
                                }
                                stats::offloaded_in_place(p.len);
                            }
                            None => {
                                let out = &mut output[p.offset..p.offset + p.len];
                                lane.get(p.slot, 0, out);
                                if last {
                                    self.iv.copy_from_slice(&out[out.len() - 16..]);
                                }
                                stats::offloaded(p.len);
                            }
                        }
                    }
                    Err(e) => {
                        // The device lost the message (docs/sec-device.md),
                        // and the stream cannot go on from the middle of a
                        // request that failed.
                        self.end_message();
                        first_err.get_or_insert(e);
                    }
                }
                lane.put_slot(p.slot);
            }
            Ok(true)
        });
        if gone {
            self.abandon(&mut job);
            return Err((
                host_gone("the queue of this request is gone"),
                Some(Why::HostGone),
            ));
        }
        match r {
            Ok(Ok(true)) => match first_err {
                Some(e) => Err((e, None)),
                None => Ok(Ok(job.len)),
            },
            Ok(Ok(false)) => {
                job.failed = first_err.map(Box::new);
                Ok(Err(job))
            }
            Ok(Err(e)) => {
                self.abandon(&mut job);
                Err((e, None))
            }
            Err(_) => {
                self.abandon(&mut job);
                Err((
                    host_gone("the host went away before the request completed"),
                    Some(Why::HostGone),
                ))
            }
        }
    }

    /// Forget the device parts of a job that can no longer complete. Its
    /// output is lost, so the stream cannot go on from it: the message
    /// ends, as for a request the device failed (the next needs an IV).
    fn abandon(&mut self, job: &mut Job) {
        self.in_flight -= job.parts.len();
        self.end_message();
        // The sessions on the job's lanes are freed by their threads.
        let (gone, kept) = std::mem::take(&mut self.dev)
            .into_iter()
            .partition(|s| job.parts.iter().any(|p| p.lane == s.lane));
        self.dev = kept;
        lane::release_sessions(Kind::Cipher, &gone);
        job.parts.clear();
    }

    /// A job whose output has nowhere to go: its parts on this thread's
    /// lane are waited for and their staging slots given back (they were
    /// lost for good), and the message ends.
    fn drop_job(&mut self, mut job: Job) {
        let _ = lane::with_open_lane(Kind::Cipher, |lane| {
            for p in &job.parts {
                if lane.holds(p.lane) {
                    let _ = lane.wait(p.token);
                    lane.put_slot(p.slot);
                }
            }
            Ok(())
        });
        self.in_flight -= job.parts.len();
        job.parts.clear();
        self.end_message();
    }

    /// The stream cannot go on from where it was: the next request needs
    /// an IV (ECB none).
    fn end_message(&mut self) {
        self.chain = Chain::Fresh;
        self.iv_set = self.mode == Mode::Ecb;
    }

    /// Compute on the CPU, continuing the chain.
    fn cpu_update(&mut self, io: Io<'_>) -> Result<()> {
        if self.cpu.is_none() {
            self.cpu = Some(CipherCtx::new(self.alg)?);
        }
        let ctx = self.cpu.as_mut().expect("made above");
        if self.chain != Chain::Cpu || self.mode == Mode::Xts {
            let key = (self.cpu_keyed != Some(self.dir)).then_some(&self.key.0[..]);
            let iv = (self.mode != Mode::Ecb).then_some(&self.iv[..16]);
            ctx.init(key, iv, self.dir == Direction::Encrypt)?;
            self.cpu_keyed = Some(self.dir);
            if self.mode == Mode::Ctr && self.ctr_used > 0 {
                // Burn the used part of the current keystream block.
                let mut skip = [0u8; 16];
                ctx.update_in_place(&mut skip[..self.ctr_used])?;
            }
            self.chain = Chain::Cpu;
        }
        io.run(ctx)?;
        if self.mode == Mode::Xts {
            // One data unit per tweak.
            self.iv_set = false;
            self.chain = Chain::Fresh;
        }
        Ok(())
    }

    /// Track the chaining value after `n` bytes ending in `tail` (their last
    /// 16 or fewer) were sent to the device (CBC encryption learns it from
    /// the output at completion).
    fn advance_chain(&mut self, n: usize, tail: &[u8]) {
        match (self.mode, self.dir) {
            (Mode::Cbc, Direction::Decrypt) => self.iv.copy_from_slice(tail),
            (Mode::Ctr, _) => {
                let total = self.ctr_used + n;
                let ctr = u128::from_be_bytes(self.iv).wrapping_add((total / 16) as u128);
                self.iv = ctr.to_be_bytes();
                self.ctr_used = total % 16;
            }
            (Mode::Xts, _) => self.iv_set = false,
            _ => {}
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if self.parts.is_empty() {
            return;
        }
        if let Some(d) = &self.dropped {
            d.fetch_add(self.parts.len(), Ordering::Relaxed);
        }
        if self.mark != lane::Mark::here() {
            // Another thread's (or process's) lane: its slots stay taken.
            return;
        }
        let _ = lane::with_open_lane(Kind::Cipher, |lane| {
            for p in &self.parts {
                if lane.holds(p.lane) {
                    lane.orphan(p.token, p.slot);
                }
            }
            Ok(())
        });
    }
}

impl Drop for Cipher {
    fn drop(&mut self) {
        lane::release_sessions(Kind::Cipher, &self.dev);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serves_the_aes_modes_but_the_aead() {
        let served = |n: &str| Cipher::serves(Alg::by_name(n).expect("known algorithm"));
        for n in ["aes-128-ecb", "aes-256-cbc", "aes-192-ctr", "aes-128-xts"] {
            assert!(served(n), "{n}");
            // Halves that differ: XTS refuses a key whose halves are equal.
            let key: Vec<u8> = (0..Alg::by_name(n).unwrap().key_len() as u8).collect();
            assert!(Cipher::new(n, &key, Direction::Encrypt).is_ok(), "{n}");
        }
        for n in ["aes-128-gcm", "sha256", "hmac-sha256"] {
            assert!(!served(n), "{n}");
        }
        let e = Cipher::new("aes-128-gcm", &[0u8; 16], Direction::Encrypt).unwrap_err();
        assert!(e.to_string().contains("AEAD"), "{e}");
    }
}
