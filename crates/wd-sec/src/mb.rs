//! The multi-buffer path: AES-CBC encryptions gathered over a batch of
//! requests (at most one per session, since a message's next part needs
//! the IV its previous part leaves) and encrypted side by side by
//! intel-ipsec-mb. A gathered request's memory is held: the engine keeps
//! it mapped until the request is reported, which is what lets a burst
//! run after the request's own translation section has ended.
//!
//! A burst runs in rounds, one per `poll`, each encrypting a bounded share
//! of each request ([`LANE`], at most [`ROUND`] in all) and carrying each
//! one's chaining value to the next: the engine's pass budget does not
//! reach work a device holds, and 16 requests of 1 MiB side by side held
//! the engine's other queues for milliseconds. Requests up to [`LANE`]
//! finish in the round they start, as they did before rounds.
#![allow(unsafe_code)]

use std::time::{Duration, Instant};

use wd_device::{cancelled, status, Access, Dma, HeldSlice, Started};
use wd_evp::CipherCtx;
use wd_ipsecmb::{CbcJob, Engine, Schedule};
use wd_ring::Desc;

use crate::device::{complete, SecQueue, Secret, Session, Work, MIN_PIECE};
use crate::dma;
use crate::long::{session_of, PIECE};
use crate::msg::{
    self, CipherOp, Mode, Request, F_DIGEST_FINAL, F_ENCRYPT, F_FINAL, F_IV, INLINE_KEY,
};

/// Where a CBC encryption under way keeps the IV that continues it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Chain {
    /// None under way: the next request must bring an IV.
    #[default]
    None,
    /// Left by a burst (the multi-buffer engine keeps no state).
    Iv([u8; 16]),
    /// In the session's libcrypto context, which ran the last part alone
    /// (asked for only when a burst needs it: that costs a parameter
    /// lookup in libcrypto, too much to pay per request).
    InCtx,
}

/// A CBC encryption gathered for a multi-buffer burst, or in one that
/// goes on over rounds: its memory is held (the engine keeps it mapped)
/// until it is reported.
pub(crate) struct Pending {
    token: u64,
    desc: Desc,
    session: u64,
    /// Where it continues: from this IV, or (`None`) the chain in the
    /// session's context. After a round, where that round left it.
    iv: Option<[u8; 16]>,
    src: HeldSlice,
    dst: HeldSlice,
    /// Where the client names them (`src`, `dst`): a request that is not
    /// gathered meets a burst's memory there.
    at: (u64, u64),
    /// Bytes encrypted by earlier rounds.
    done: u64,
}

/// Requests that make a burst worth running at once: the widest engines
/// interleave 16 messages.
const FULL: usize = 16;

/// Bytes of each request a round encrypts side by side with others: the
/// smallest piece a long request is cut into, whose reasoning holds here
/// (smaller shares cost more library calls than the fairness they buy).
/// The crypto library's requests (its staging slots are 64 KiB) still
/// finish in one round.
const LANE: u64 = MIN_PIECE;

/// Bytes a round encrypts in all: a full burst's lanes. At the rate the
/// multi-buffer engine reached on many buffers here (about 8 GB/s, issue
/// 11's measurement; not timed per round), about 130 us, under the
/// 256 KiB of a long request's piece ([`PIECE`]) on libcrypto's single
/// stream (about 1.4 GB/s: 190 us). More requests than [`FULL`] share it.
const ROUND: u64 = FULL as u64 * LANE;

/// A client that keeps many requests in flight submits them one by one as
/// its completions come in: gathered requests wait for more while they
/// keep coming (no gap longer than `GAP`), at most `LINGER`, which turns
/// that trickle into bursts where each request alone would run serially.
const GAP: Duration = Duration::from_nanos(1500);
/// See [`GAP`].
const LINGER: Duration = Duration::from_micros(8);

/// Lone bursts after which a queue stops gathering: a client that sends
/// one request at a time pays no wait at all.
const STREAMING: u32 = 256;

/// When to gather requests, and when to run what was gathered.
#[derive(Debug)]
pub(crate) struct Gathering {
    /// Whether this pass's requests are gathered.
    on: bool,
    /// Bursts left before gathering stops, unless one shows concurrency.
    streaming: u32,
    /// When the oldest and the newest gathered requests came.
    since: Option<(Instant, Instant)>,
    /// A round left requests to the next one: the burst goes on a round
    /// per poll, and nothing but a poll runs a round until it ends.
    under_way: bool,
    /// A round ran since the last poll (started in `start`): the poll
    /// leaves the next one to the next pass.
    round_ran: bool,
}

impl Gathering {
    /// Gathering on (a caller that gives no pass sizes gets bursts).
    pub(crate) fn new() -> Gathering {
        Gathering {
            on: true,
            streaming: 0,
            since: None,
            under_way: false,
            round_ran: false,
        }
    }

    /// A pass brings `requests`: gather when there are several, or the
    /// queue has shown it keeps several in flight.
    pub(crate) fn pass(&mut self, requests: usize, pending: usize) {
        if requests > 1 {
            self.streaming = STREAMING;
        }
        self.on = requests > 1 || self.streaming > 0 || pending > 0;
    }

    pub(crate) fn on(&self) -> bool {
        self.on
    }

    /// Whether a burst goes on over rounds.
    pub(crate) fn under_way(&self) -> bool {
        self.under_way
    }

    /// Whether what was gathered should run now (a round of it).
    pub(crate) fn due(&self, pending: usize) -> bool {
        if self.under_way {
            return !self.round_ran;
        }
        if pending >= FULL || self.streaming == 0 {
            return true;
        }
        let Some((first, last)) = self.since else {
            return true;
        };
        let now = Instant::now();
        now.duration_since(last) >= GAP || now.duration_since(first) >= LINGER
    }

    fn gathered(&mut self) {
        let now = Instant::now();
        let first = self.since.map_or(now, |(f, _)| f);
        self.since = Some((first, now));
    }

    /// A round of `requests` ran; `left`: some are left to the next.
    fn ran(&mut self, requests: usize, left: bool) {
        self.since = None;
        // A burst counts once, whatever its rounds.
        if !self.under_way {
            if requests > 1 {
                self.streaming = STREAMING;
            } else {
                self.streaming = self.streaming.saturating_sub(1);
            }
        }
        self.under_way = left;
        self.round_ran = true;
    }

    /// The queue was polled.
    pub(crate) fn polled(&mut self) {
        self.round_ran = false;
    }

    /// Nothing is gathered any more (teardown).
    fn stopped(&mut self) {
        self.since = None;
        self.under_way = false;
    }
}

/// How a CBC encryption starts: from an IV (its own, or one a burst
/// left), or (`None`) continuing the session's context. `Err` when it is
/// malformed or continues nothing.
fn cbc_start(op: &CipherOp, chain: Chain) -> Result<Option<[u8; 16]>, ()> {
    if op.len % 16 != 0 || op.flags & F_FINAL != 0 || op.aad_len != 0 || op.tag_len != 0 {
        return Err(());
    }
    if op.flags & F_IV != 0 {
        return match op.iv[..16].try_into() {
            Ok(iv) if op.iv_len == 16 => Ok(Some(iv)),
            _ => Err(()),
        };
    }
    match chain {
        Chain::None => Err(()),
        Chain::Iv(iv) => Ok(Some(iv)),
        Chain::InCtx => Ok(None),
    }
}

/// A session's round keys for the multi-buffer engine, made on first use.
fn schedule<'s>(
    e: &Engine,
    schedule: &'s mut Option<Schedule>,
    key: &Secret,
) -> Result<&'s Schedule, i32> {
    if schedule.is_none() {
        *schedule = Some(e.schedule(&key.0).map_err(|_| status::EINVAL)?);
    }
    Ok(schedule.as_ref().expect("set above"))
}

/// Where the session's CBC encryption goes on after a burst. The
/// burst's encryption also ended any message under way in the context (a
/// decryption): it does not go on after it.
fn set_chain(s: &mut Session, to: Chain) {
    if let Work::Cipher { chain, started, .. } = &mut s.work {
        *chain = to;
        *started = false;
    }
}

/// Encrypt with libcrypto, from `iv` or continuing its context: a
/// request alone gains nothing from a burst, and libcrypto's single
/// stream is the faster one. The chain stays in the context.
fn cbc_alone(
    s: &mut Session,
    iv: Option<[u8; 16]>,
    run: impl FnOnce(&mut CipherCtx) -> Result<(), i32>,
) -> Result<(), i32> {
    let Session { key, work, .. } = s;
    let Work::Cipher {
        ctx,
        keyed_for,
        started,
        chain,
        ..
    } = work
    else {
        return Err(status::EINVAL);
    };
    // Whatever happens, the old chain is used up.
    *chain = Chain::None;
    if let Some(iv) = iv {
        let key = (*keyed_for != Some(true)).then_some(&key.0[..]);
        ctx.init(key, Some(&iv), true).map_err(|_| status::EINVAL)?;
        *keyed_for = Some(true);
        // The context's message flag is for the other modes: `chain` is
        // the state here.
        *started = false;
    }
    run(ctx)?;
    *chain = Chain::InCtx;
    Ok(())
}

/// Encrypt one CBC request now, alone (see [`cbc_alone`]), on a queue
/// whose CBC encryptions may also run in bursts.
pub(crate) fn cbc_now(
    s: &mut Session,
    op: CipherOp,
    dma: &mut dyn Dma<'_>,
    bounce: &mut Vec<u8>,
) -> Result<u64, i32> {
    let Work::Cipher { chain, .. } = &s.work else {
        return Err(status::EINVAL);
    };
    let iv = cbc_start(&op, *chain).map_err(|_| status::EINVAL)?;
    // `cbc_alone` uses the chain up: a fault must come before it does.
    dma::reach(dma, op.src, op.len, Access::Read)?;
    dma::reach(dma, op.dst, op.len, Access::Write)?;
    let restarts = op.flags & F_IV != 0;
    cbc_alone(s, iv, |ctx| {
        // The chain is used up whatever happened: a fault here (memory
        // reached only as it is used, SHARE_ALL) is one to stall and run
        // again only for a request that starts its message; any other
        // lost it (-EIO, as the libcrypto path says).
        dma::cipher_dma(ctx, op.dst, op.src, op.len as usize, dma, bounce, false).map_err(|f| {
            match restarts {
                true => f.status,
                false => status::EIO,
            }
        })
    })?;
    Ok(op.len)
}

/// Whether `[a, a + a_len)` and `[b, b + b_len)` share a byte.
fn meets(a: u64, a_len: u64, b: u64, b_len: u64) -> bool {
    a_len > 0 && b_len > 0 && a < b.saturating_add(b_len) && b < a.saturating_add(a_len)
}

/// The memory a request reaches, as the client names it: `(address,
/// length, written)`.
fn reaches(desc: &Desc) -> [(u64, u64, bool); 4] {
    let mut r = [(0, 0, false); 4];
    match msg::decode(desc) {
        Ok(Request::Cipher(op)) => {
            r[0] = (op.src, op.len, false);
            r[1] = (op.dst, op.len, true);
            r[2] = (op.aad, op.aad_len.into(), false);
            let encrypt = op.flags & F_ENCRYPT != 0;
            r[3] = (op.tag, op.tag_len.into(), encrypt);
        }
        Ok(Request::Digest(op)) => {
            r[0] = (op.src, op.len, false);
            // (At most a SHA-512 digest.)
            let out = if op.flags & F_DIGEST_FINAL != 0 {
                64
            } else {
                0
            };
            r[1] = (op.out, out, true);
        }
        Ok(Request::SessionNew(s)) if s.key_len as usize > INLINE_KEY => {
            r[0] = (s.key_addr, s.key_len.into(), false);
        }
        _ => {}
    }
    r
}

impl SecQueue {
    /// Gather `desc` for a burst when it is a CBC encryption the
    /// multi-buffer engine can run with others: its memory held, where it
    /// starts known (`Held`); `Later` when it must wait for a request of a
    /// burst under way (of its session, or whose memory it meets); `None`
    /// hands it back, to be run now.
    pub(crate) fn gather(
        &mut self,
        token: u64,
        desc: &Desc,
        dma: &mut dyn Dma<'_>,
    ) -> Option<Started> {
        // Only a queue with the engine bursts what it gathers.
        self.mb?;
        let Ok(Request::Cipher(op)) = msg::decode(desc) else {
            return None;
        };
        // Of any length: rounds bound what one runs per poll, as a long
        // request's pieces do (`long.rs`), and side by side with others it
        // goes at the engine's rate on many buffers, not libcrypto's on one.
        if op.flags & F_ENCRYPT == 0 || op.len == 0 {
            return None;
        }
        if self.pending.iter().any(|p| p.session == op.session) {
            // The message's previous part must finish first: at once when
            // its burst has not started (one round finishes short ones),
            // never by running a burst under way on past its round.
            if !self.gathering.under_way() {
                self.burst();
            }
            if self.pending.iter().any(|p| p.session == op.session) {
                return Some(Started::Later);
            }
        }
        let s = self.sessions.get(op.session).ok()?;
        let Work::Cipher {
            mode: Mode::Cbc,
            chain,
            ..
        } = &s.work
        else {
            return None;
        };
        let iv = cbc_start(&op, *chain).ok()?;
        let src = dma.hold(op.src, op.len, Access::Read)?;
        let dst = dma.hold(op.dst, op.len, Access::Write)?;
        // Where a burst's request continues is read back from its output:
        // no other request of the burst may write there (nor read what it
        // writes), so one whose memory meets a gathered one's waits for
        // the next burst.
        let meets = |a: &HeldSlice, b: &HeldSlice| {
            let (a0, b0) = (a.as_ptr() as usize, b.as_ptr() as usize);
            a0 < b0 + b.len() && b0 < a0 + a.len()
        };
        let meets_one = |pending: &[Pending]| {
            pending
                .iter()
                .any(|p| meets(&dst, &p.dst) || meets(&dst, &p.src) || meets(&src, &p.dst))
        };
        if meets_one(&self.pending) {
            // (Other sessions' requests: this one's start stays right.)
            if !self.gathering.under_way() {
                self.burst();
            }
            if meets_one(&self.pending) {
                return Some(Started::Later);
            }
        }
        self.gathering.gathered();
        self.pending.push(Pending {
            token,
            desc: *desc,
            session: op.session,
            iv,
            src,
            dst,
            at: (op.src, op.dst),
            done: 0,
        });
        Some(Started::Held)
    }

    /// Whether `desc`, not gathered, must wait for the burst under way:
    /// requests of a session run in order, and one whose memory meets a
    /// burst request's runs after it, as it would have had the burst run
    /// whole.
    ///
    /// Memory is compared as the client names it and as the host maps it:
    /// two IOVAs may reach the same memory. A range the host cannot show
    /// as one mapping is taken to meet the burst (it waits).
    pub(crate) fn behind_burst(&self, desc: &Desc, dma: &mut dyn Dma<'_>) -> bool {
        let session = session_of(desc);
        let reaches = reaches(desc);
        // Host addresses of what it reaches (`None`: not known).
        let host: Vec<Option<(u64, u64, bool)>> = reaches
            .iter()
            .map(|&(at, n, written)| {
                if n == 0 {
                    return Some((0, 0, written));
                }
                let access = if written { Access::Write } else { Access::Read };
                dma.slice(at, n, access)
                    .or_else(|| dma.slice(at, n, Access::Read))
                    .map(|s| (s.as_ptr() as u64, n, written))
            })
            .collect();
        self.pending.iter().any(|p| {
            let len = p.src.len() as u64;
            let (hs, hd) = (p.src.as_ptr() as u64, p.dst.as_ptr() as u64);
            Some(p.session) == session
                || reaches.iter().any(|&(at, n, written)| {
                    meets(at, n, p.at.1, len) || (written && meets(at, n, p.at.0, len))
                })
                || host.iter().any(|h| match *h {
                    Some((at, n, written)) => {
                        meets(at, n, hd, len) || (written && meets(at, n, hs, len))
                    }
                    None => true,
                })
        })
    }

    /// Teardown: hand back what was gathered, cancelled: untouched, or
    /// (a request a round of its burst ran) unfinished, as a long request
    /// is; its output may be partly written, and its session's chain was
    /// left at no message when its first round ran.
    pub(crate) fn stop_gathered(&mut self, stopped: &mut Vec<(u64, Desc)>) {
        stopped.extend(self.pending.drain(..).map(|p| (p.token, cancelled(p.desc))));
        self.gathering.stopped();
    }

    /// Run a round of what was gathered: up to [`LANE`] bytes of each
    /// request side by side ([`PIECE`] of one alone, on libcrypto), at
    /// most [`ROUND`] in all; file the requests that finished (or failed)
    /// for the next `poll` and keep the others, with where their chain
    /// goes on, for the next round.
    pub(crate) fn burst(&mut self) {
        let Some(e) = self.mb.filter(|_| !self.pending.is_empty()) else {
            return;
        };
        let mut pending = std::mem::take(&mut self.pending);
        // Every request goes on in every round (a short one that joined a
        // burst under way finishes in its first), more of them each
        // taking less.
        let share = match pending.len() {
            1 => PIECE,
            n => (ROUND / n as u64).min(LANE) & !15,
        };
        // Each request's bytes in this round, and its outcome.
        let mut round: Vec<(usize, Result<(), i32>)> = pending
            .iter()
            .map(|p| {
                let len = p.src.len() as u64;
                // A request up to a lane runs whole in its first round
                // (as before rounds), however many share the burst.
                let n = match len <= LANE {
                    true => len - p.done,
                    false => (len - p.done).min(share),
                };
                (n as usize, Ok(()))
            })
            .collect();
        if let ([p], [(n, r)]) = (&mut pending[..], &mut round[..]) {
            *r = self.sessions.get(p.session).and_then(|s| {
                // SAFETY: the request is held (not reported yet), so the
                // engine keeps its memory mapped; the slices live only
                // for this call.
                let (src, dst) = unsafe { (p.src.slice(), p.dst.slice()) };
                let at = p.done as usize;
                let (src, dst) = (src.subslice(at, *n), dst.subslice(at, *n));
                cbc_alone(s, p.iv, |ctx| {
                    ctx.update_device(&dst, &src)
                        .map(|_| ())
                        .map_err(|_| status::EIO)
                })
            });
            // The chain went on in the session's context.
            p.iv = None;
        } else {
            self.burst_many(e, &mut pending, &mut round);
        }
        let ran = round.len();
        let (sessions, finished) = (&mut self.sessions, &mut self.finished);
        let mut shares = round.into_iter();
        pending.retain_mut(|p| {
            let Some((n, r)) = shares.next() else {
                return true;
            };
            let len = p.src.len() as u64;
            let outcome = match r {
                Ok(()) if p.done + (n as u64) < len => {
                    p.done += n as u64;
                    // Until it finishes, the message is the burst's (`iv`
                    // or the context): the session has none of its own.
                    if let Ok(s) = sessions.get(p.session) {
                        set_chain(s, Chain::None);
                    }
                    return true;
                }
                Ok(()) => {
                    // (One that ran alone keeps its chain in the context.)
                    if let (Some(iv), Ok(s)) = (p.iv, sessions.get(p.session)) {
                        set_chain(s, Chain::Iv(iv));
                    }
                    Ok(len)
                }
                Err(st) => {
                    // It ended its message; one whose output is partly
                    // written is no fault to retry either.
                    if let Ok(s) = sessions.get(p.session) {
                        set_chain(s, Chain::None);
                    }
                    Err(if p.done > 0 { status::EIO } else { st })
                }
            };
            let mut d = p.desc;
            complete(&mut d, outcome);
            finished.push((p.token, d));
            false
        });
        self.gathering.ran(ran, !pending.is_empty());
        self.pending = pending;
    }

    /// A round of several requests (of distinct sessions) through the
    /// engine: each its share of `round`, from where it got to.
    fn burst_many(
        &mut self,
        e: &Engine,
        pending: &mut [Pending],
        round: &mut [(usize, Result<(), i32>)],
    ) {
        // Where each starts, and round keys, first: the jobs borrow them.
        for (p, (_, r)) in pending.iter_mut().zip(round.iter_mut()) {
            *r = self.sessions.get(p.session).and_then(|s| {
                if let (None, Work::Cipher { ctx, chain, .. }) = (p.iv, &mut s.work) {
                    let (iv, _) = ctx.chain_state().map_err(|_| status::EIO)?;
                    p.iv = Some(iv);
                    *chain = Chain::None;
                }
                schedule(e, &mut s.schedule, &s.key).map(|_| ())
            });
        }
        let mut jobs = Vec::with_capacity(pending.len());
        let mut which = Vec::with_capacity(pending.len());
        for (i, p) in pending.iter().enumerate() {
            let (n, Ok(())) = round[i] else {
                continue;
            };
            let keys = self
                .sessions
                .peek(p.session)
                .and_then(|s| s.schedule.as_ref());
            let (Some(keys), Some(iv)) = (keys, p.iv) else {
                round[i].1 = Err(status::EIO);
                continue;
            };
            // SAFETY: the request is held (not reported yet), so the
            // engine keeps its memory mapped; the slices live only until
            // the burst below returns.
            let (src, dst) = unsafe { (p.src.slice(), p.dst.slice()) };
            let at = p.done as usize;
            match CbcJob::new(keys, iv, src.subslice(at, n), dst.subslice(at, n)) {
                Ok(j) => {
                    jobs.push(j);
                    which.push(i);
                }
                Err(_) => round[i].1 = Err(status::EINVAL),
            }
        }
        let ran = e.cbc_encrypt(&mut jobs);
        let next: Vec<[u8; 16]> = jobs.iter().map(|j| j.iv).collect();
        drop(jobs);
        for (k, &i) in which.iter().enumerate() {
            match ran {
                Ok(()) => pending[i].iv = Some(next[k]),
                Err(_) => round[i].1 = Err(status::EIO),
            }
        }
    }
}
