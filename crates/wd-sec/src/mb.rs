//! The multi-buffer path: AES-CBC encryptions gathered over a batch of
//! requests (at most one per session, since a message's next part needs
//! the IV its previous part leaves) and encrypted side by side by
//! intel-ipsec-mb. A gathered request's memory is held: the engine keeps
//! it mapped until the request is reported, which is what lets a burst
//! run after the request's own translation section has ended.
#![allow(unsafe_code)]

use std::time::{Duration, Instant};

use wd_device::{cancelled, status, Access, Dma, HeldSlice};
use wd_evp::CipherCtx;
use wd_ipsecmb::{CbcJob, Engine, Schedule};
use wd_ring::Desc;

use crate::device::{complete, Key, SecQueue, Session, Work};
use crate::dma;
use crate::msg::{self, CipherOp, Mode, Request, F_ENCRYPT, F_FINAL, F_IV};

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

/// A CBC encryption waiting for the next multi-buffer burst: its memory
/// is held (the engine keeps it mapped) until it is reported.
pub(crate) struct Pending {
    token: u64,
    desc: Desc,
    session: u64,
    /// `None`: continue the chain in the session's context.
    iv: Option<[u8; 16]>,
    src: HeldSlice,
    dst: HeldSlice,
}

/// Requests that make a burst worth running at once: the widest engines
/// interleave 16 messages.
const FULL: usize = 16;

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
}

impl Gathering {
    /// Gathering on (a caller that gives no pass sizes gets bursts).
    pub(crate) fn new() -> Gathering {
        Gathering {
            on: true,
            streaming: 0,
            since: None,
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

    /// Whether what was gathered should run now.
    pub(crate) fn due(&self, pending: usize) -> bool {
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

    fn ran(&mut self, requests: usize) {
        self.since = None;
        if requests > 1 {
            self.streaming = STREAMING;
        } else {
            self.streaming = self.streaming.saturating_sub(1);
        }
    }
}

/// Bytes a multi-buffer request may have: a longer one would keep the
/// other requests of its burst (and the engine's other queues) waiting, so
/// it runs alone, now.
const MB_MAX: u64 = 1 << 20;

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
    key: &Key,
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

impl SecQueue {
    /// Gather `desc` for the next burst when it is a CBC encryption the
    /// multi-buffer engine can run with others: its memory held, where it
    /// starts known. `Err` hands the request back, to be run now.
    pub(crate) fn gather(
        &mut self,
        token: u64,
        desc: &Desc,
        dma: &mut dyn Dma<'_>,
    ) -> Result<(), ()> {
        // Only a queue with the engine bursts what it gathers.
        if self.mb.is_none() {
            return Err(());
        }
        let Ok(Request::Cipher(op)) = msg::decode(desc) else {
            return Err(());
        };
        if op.flags & F_ENCRYPT == 0 || op.len == 0 || op.len > MB_MAX {
            return Err(());
        }
        if self.pending.iter().any(|p| p.session == op.session) {
            // The message's previous part must finish first.
            self.burst();
        }
        let Ok(s) = self.sessions.get(op.session) else {
            return Err(());
        };
        let Work::Cipher {
            mode: Mode::Cbc,
            chain,
            ..
        } = &s.work
        else {
            return Err(());
        };
        let iv = cbc_start(&op, *chain)?;
        let src = dma.hold(op.src, op.len, Access::Read).ok_or(())?;
        let dst = dma.hold(op.dst, op.len, Access::Write).ok_or(())?;
        // Where a burst's request continues is read back from its output:
        // no other request of the burst may write there (nor read what it
        // writes), so one whose memory meets a gathered one's waits for
        // the next burst.
        let meets = |a: &HeldSlice, b: &HeldSlice| {
            let (a0, b0) = (a.as_ptr() as usize, b.as_ptr() as usize);
            a0 < b0 + b.len() && b0 < a0 + a.len()
        };
        if self
            .pending
            .iter()
            .any(|p| meets(&dst, &p.dst) || meets(&dst, &p.src) || meets(&src, &p.dst))
        {
            // (Other sessions' requests: this one's start stays right.)
            self.burst();
        }
        self.gathering.gathered();
        self.pending.push(Pending {
            token,
            desc: *desc,
            session: op.session,
            iv,
            src,
            dst,
        });
        Ok(())
    }

    /// Teardown: hand back what was gathered, untouched (cancelled).
    pub(crate) fn stop_gathered(&mut self, stopped: &mut Vec<(u64, Desc)>) {
        stopped.extend(self.pending.drain(..).map(|p| (p.token, cancelled(p.desc))));
    }

    /// Encrypt everything gathered, side by side (one request alone goes
    /// to libcrypto), and file the outcomes for the next `poll`.
    pub(crate) fn burst(&mut self) {
        let Some(e) = self.mb else {
            return;
        };
        let mut pending = std::mem::take(&mut self.pending);
        self.gathering.ran(pending.len());
        let mut outcome: Vec<Result<u64, i32>> = Vec::with_capacity(pending.len());
        if let [p] = &pending[..] {
            outcome.push(self.sessions.get(p.session).and_then(|s| {
                // SAFETY: the request is held (not reported yet), so the
                // engine keeps its memory mapped; the slices live only
                // for this call.
                let (src, dst) = unsafe { (p.src.slice(), p.dst.slice()) };
                cbc_alone(s, p.iv, |ctx| {
                    ctx.update_device(&dst, &src)
                        .map(|_| ())
                        .map_err(|_| status::EIO)
                })?;
                Ok(p.src.len() as u64)
            }));
        } else {
            self.burst_many(e, &mut pending, &mut outcome);
        }
        for (p, r) in pending.drain(..).zip(outcome) {
            let mut d = p.desc;
            complete(&mut d, r);
            self.finished.push((p.token, d));
        }
        self.pending = pending;
    }

    /// Several requests (of distinct sessions) through the engine.
    fn burst_many(
        &mut self,
        e: &Engine,
        pending: &mut [Pending],
        outcome: &mut Vec<Result<u64, i32>>,
    ) {
        // Where each starts, and round keys, first: the jobs borrow them.
        for p in pending.iter_mut() {
            let r = self.sessions.get(p.session).and_then(|s| {
                if let (None, Work::Cipher { ctx, chain, .. }) = (p.iv, &mut s.work) {
                    let (iv, _) = ctx.chain_state().map_err(|_| status::EIO)?;
                    p.iv = Some(iv);
                    *chain = Chain::None;
                }
                schedule(e, &mut s.schedule, &s.key).map(|_| 0)
            });
            outcome.push(r);
        }
        let mut jobs = Vec::with_capacity(pending.len());
        let mut which = Vec::with_capacity(pending.len());
        for (i, p) in pending.iter().enumerate() {
            let keys = self
                .sessions
                .peek(p.session)
                .and_then(|s| s.schedule.as_ref());
            let (Ok(_), Some(keys), Some(iv)) = (&outcome[i], keys, p.iv) else {
                continue;
            };
            // SAFETY: the request is held (not reported yet), so the
            // engine keeps its memory mapped; the slices live only until
            // the burst below returns.
            let (src, dst) = unsafe { (p.src.slice(), p.dst.slice()) };
            match CbcJob::new(keys, iv, src, dst) {
                Ok(j) => {
                    jobs.push(j);
                    which.push(i);
                }
                Err(_) => outcome[i] = Err(status::EINVAL),
            }
        }
        let ran = e.cbc_encrypt(&mut jobs);
        let next: Vec<[u8; 16]> = jobs.iter().map(|j| j.iv).collect();
        drop(jobs);
        for (k, &i) in which.iter().enumerate() {
            let p = &pending[i];
            outcome[i] = match &ran {
                Ok(()) => {
                    if let Ok(s) = self.sessions.get(p.session) {
                        set_chain(s, Chain::Iv(next[k]));
                    }
                    Ok(p.src.len() as u64)
                }
                Err(_) => Err(status::EIO),
            };
        }
        // A request that did not run ended its message.
        for (p, r) in pending.iter().zip(outcome.iter()) {
            if r.is_err() {
                if let Ok(s) = self.sessions.get(p.session) {
                    set_chain(s, Chain::None);
                }
            }
        }
    }
}
