//! Digests and HMAC: small messages are gathered here and sent as one
//! request (a one-shot digest is one round trip, no session needed for a
//! plain hash); long ones stream through a device session.

use wd_evp::DigestCtx;
use wd_sec_msg::Alg;
use wd_sec_msg::{DigestOp, F_DIGEST_FINAL, F_INIT, MAX_DIGEST};

use crate::lane::{self, device_status, Kind, Lane, NoLane, SLOT};
use crate::route::{self, Op, Route, Stopwatch};
use crate::stats::{self, Why};
use crate::{CryptoError, Result};

/// Bytes gathered before a message starts streaming to its path.
const GATHER: usize = SLOT - MAX_DIGEST;

enum State {
    /// Nothing sent anywhere: data waits in `buf`.
    Gathering,
    /// Streaming through a device session.
    Device {
        session: lane::Session,
        /// Where it streams.
        mark: lane::Mark,
    },
    /// Streaming through a CPU context.
    Cpu(DigestCtx),
}

/// A digest or HMAC computation.
pub struct Digest {
    alg: Alg,
    key: Vec<u8>,
    buf: Vec<u8>,
    state: State,
    /// The router asked for this stream's requests to be timed.
    timed: bool,
    /// Why a stream runs on the CPU (what its requests are counted as).
    cpu_why: Why,
}

impl std::fmt::Debug for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Digest")
            .field("alg", &self.alg.name())
            .finish()
    }
}

impl Digest {
    /// A digest (`sha256`) or MAC (`hmac-sha256`, with `key`).
    pub fn new(name: &str, key: &[u8]) -> Result<Digest> {
        let alg = Alg::by_name(name)
            .filter(|a| !a.is_cipher())
            .ok_or_else(|| CryptoError::invalid(format!("unknown digest '{name}'")))?;
        match alg {
            Alg::Digest(_) if !key.is_empty() => {
                return Err(CryptoError::invalid(format!("{name} takes no key")))
            }
            Alg::Hmac(_) if key.len() > wd_sec_msg::MAX_KEY => {
                return Err(CryptoError::invalid(format!(
                    "HMAC keys are at most {} bytes",
                    wd_sec_msg::MAX_KEY
                )))
            }
            _ => {}
        }
        Ok(Digest {
            alg,
            key: key.to_vec(),
            buf: Vec::new(),
            state: State::Gathering,
            timed: false,
            cpu_why: Why::Policy,
        })
    }

    /// The algorithm.
    pub fn alg(&self) -> Alg {
        self.alg
    }

    /// Digest length in bytes.
    pub fn len(&self) -> usize {
        self.alg.digest_len()
    }

    /// Never empty (kept for the `len` convention).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// A copy of the computation so far. A long message streaming through
    /// a device session is copied there (its state lives in the host):
    /// on the thread that feeds it, as its other calls are.
    pub fn try_clone(&self) -> Result<Digest> {
        let state = match &self.state {
            State::Gathering => State::Gathering,
            State::Cpu(c) => State::Cpu(c.try_clone()?),
            State::Device { session, mark } => {
                mark.check("this digest")?;
                let (id, handle) = (session.lane, session.handle);
                let r = lane::with_open_lane(Kind::Digest, |lane| {
                    if lane.id != id {
                        return Err(gone());
                    }
                    let copy = lane.clone_session(handle)?;
                    Ok(lane.session(copy))
                });
                match r {
                    Ok(Ok(session)) => State::Device {
                        session,
                        mark: *mark,
                    },
                    Ok(Err(e)) => return Err(e),
                    Err(_) => return Err(gone()),
                }
            }
        };
        Ok(Digest {
            alg: self.alg,
            key: self.key.clone(),
            buf: self.buf.clone(),
            state,
            timed: self.timed,
            cpu_why: self.cpu_why,
        })
    }

    /// Add data. `Busy` (every staging slot of this thread is held by its
    /// jobs) leaves the message as it was: call again with the same data.
    pub fn update(&mut self, data: &[u8]) -> Result<()> {
        if matches!(self.state, State::Gathering) {
            if self.buf.len() + data.len() <= GATHER {
                self.buf.extend_from_slice(data);
                return Ok(());
            }
            // Too long to gather: start streaming on the path a message of
            // this size deserves.
            self.start_stream(self.buf.len() + data.len())?;
        }
        let pending = std::mem::take(&mut self.buf);
        let r = self.stream(&pending, data, false);
        if matches!(r, Err(CryptoError::Busy)) {
            self.buf = pending;
        }
        r.map(|_| ())
    }

    /// The digest; the object starts over (same key) afterwards, unless
    /// the answer is `Busy` (nothing sent: call again) or the message
    /// belongs to another thread. In a forked child, a message that
    /// streamed on the parent's device session is refused and starts over.
    pub fn finish(&mut self) -> Result<Vec<u8>> {
        if let State::Device { mark, .. } = self.state {
            if let Err(e) = mark.check("this digest") {
                if mark.forked() {
                    self.buf.clear();
                    self.state = State::Gathering;
                }
                return Err(e);
            }
        }
        let r = if matches!(self.state, State::Gathering) {
            self.one_shot()
        } else {
            let pending = std::mem::take(&mut self.buf);
            let r = self.stream(&pending, &[], true);
            if matches!(r, Err(CryptoError::Busy)) {
                self.buf = pending;
                return Err(CryptoError::Busy);
            }
            r.map(|d| d.expect("a final request yields the digest"))
        };
        self.buf.clear();
        self.state = State::Gathering;
        r
    }

    fn cpu_ctx(&self) -> Result<DigestCtx> {
        Ok(match self.alg {
            Alg::Digest(h) => DigestCtx::new(h)?,
            Alg::Hmac(h) => DigestCtx::hmac(h, &self.key)?,
            Alg::Aes { .. } => unreachable!("checked in new"),
        })
    }

    /// The whole message is in `buf`: one request on the chosen path.
    fn one_shot(&mut self) -> Result<Vec<u8>> {
        let n = self.buf.len();
        let (route, timed) = route::choose_timed(Op::Digest, n, false);
        let watch = Stopwatch::start(timed);
        if let Route::Device = route {
            let r = lane::with_lane(Kind::Digest, |lane| {
                // Without a free slot (this thread's jobs hold them all) it
                // is computed here: the caller waits either way.
                let Some(slot) = lane.take_slot() else {
                    return Ok(None);
                };
                let handle = match self.alg {
                    Alg::Hmac(_) => match lane.new_session(self.alg, &self.key) {
                        Ok(h) => h,
                        Err(e) => {
                            lane.put_slot(slot);
                            return Err(e);
                        }
                    },
                    _ => 0,
                };
                let out = request(
                    lane,
                    slot,
                    self.alg,
                    handle,
                    F_INIT | F_DIGEST_FINAL,
                    &self.buf,
                    None,
                );
                lane.put_slot(slot);
                if handle != 0 {
                    lane.free_session(handle);
                }
                out
            });
            match r {
                Ok(Ok(Some(d))) => {
                    stats::offloaded(n);
                    watch.stop(Op::Digest, n, false);
                    return Ok(d);
                }
                Ok(Ok(None)) => {
                    crate::cipher::no_slot()?;
                    stats::on_cpu(n, Why::NoQueue)
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
        let mut ctx = self.cpu_ctx()?;
        ctx.update(&self.buf)?;
        let mut out = [0u8; 64];
        let len = ctx.finish(&mut out)?;
        watch.stop(Op::Digest, n, true);
        Ok(out[..len].to_vec())
    }

    fn start_stream(&mut self, n: usize) -> Result<()> {
        let (route, timed) = route::choose_timed(Op::Digest, n, false);
        self.timed = timed;
        self.cpu_why = match route {
            Route::Cpu(w) => w,
            Route::Device => Why::Policy,
        };
        if let Route::Device = route {
            let r = lane::with_lane(Kind::Digest, |lane| {
                let handle = lane.new_session(self.alg, &self.key)?;
                Ok(lane.session(handle))
            });
            match r {
                Ok(Ok(session)) => {
                    self.state = State::Device {
                        session,
                        mark: lane::Mark::here(),
                    };
                    return Ok(());
                }
                Ok(Err(e)) => return Err(e),
                Err(no) => {
                    crate::cipher::no_fallback(why(no))?;
                    self.cpu_why = why(no);
                }
            }
        }
        self.state = State::Cpu(self.cpu_ctx()?);
        Ok(())
    }

    /// Feed `pending` then `data` to the stream (and finish it when
    /// `last`). `Busy` comes before anything is sent.
    fn stream(&mut self, pending: &[u8], data: &[u8], last: bool) -> Result<Option<Vec<u8>>> {
        // A timed stream's data is a sample for the router: per byte, the
        // cost of the path it took (one sample per decision: a long stream
        // is not timed on every update).
        let n = pending.len() + data.len();
        let watch = Stopwatch::start(self.timed && n > 0);
        self.timed &= n == 0;
        let cpu_why = self.cpu_why;
        match &mut self.state {
            State::Gathering => unreachable!("streams start first"),
            State::Cpu(ctx) => {
                ctx.update(pending)?;
                ctx.update(data)?;
                watch.stop(Op::Digest, n, true);
                stats::on_cpu(n, cpu_why);
                if !last {
                    return Ok(None);
                }
                let mut out = [0u8; 64];
                let len = ctx.finish(&mut out)?;
                Ok(Some(out[..len].to_vec()))
            }
            State::Device { session, mark } => {
                let (id, handle) = (session.lane, session.handle);
                mark.check("this digest")?;
                let alg = self.alg;
                let r = lane::with_open_lane(Kind::Digest, |lane| {
                    if lane.id != id {
                        return Err(gone());
                    }
                    // One slot for the whole call, taken first: a call that
                    // cannot have one sends nothing.
                    let slot = lane.take_slot().ok_or(CryptoError::Busy)?;
                    let r = feed(lane, slot, alg, handle, [pending, data], last);
                    lane.put_slot(slot);
                    // A final request ends the session whatever its outcome
                    // (the object starts over).
                    if last {
                        lane.free_session(handle);
                    }
                    r
                });
                match r {
                    Ok(Ok(d)) => {
                        watch.stop(Op::Digest, n, false);
                        Ok(d)
                    }
                    Ok(Err(e)) => Err(e),
                    Err(_) => Err(gone()),
                }
            }
        }
    }
}

/// Stream `pieces` through `handle` in requests of at most [`GATHER`]
/// bytes, the last one final when `last`.
fn feed(
    lane: &mut Lane,
    slot: u16,
    alg: Alg,
    handle: u64,
    pieces: [&[u8]; 2],
    last: bool,
) -> Result<Option<Vec<u8>>> {
    let mut out = None;
    let mut chunks = pieces.iter().flat_map(|p| p.chunks(GATHER)).peekable();
    if chunks.peek().is_none() && last {
        out = request(lane, slot, alg, handle, F_DIGEST_FINAL, &[], None)?;
    }
    while let Some(c) = chunks.next() {
        let fin = last && chunks.peek().is_none();
        let flags = if fin { F_DIGEST_FINAL } else { 0 };
        // The caller's bytes, in place when they are shared memory the lane
        // reaches.
        let at = lane.place(c);
        out = request(lane, slot, alg, handle, flags, c, at)?;
        match at {
            Some(_) => stats::offloaded_in_place(c.len()),
            None => stats::offloaded(c.len()),
        }
    }
    Ok(out)
}

fn gone() -> CryptoError {
    CryptoError::Device {
        status: wrapdrive::Status::HostGone,
        message: "the host went away in the middle of this digest".into(),
    }
}

fn why(no: NoLane) -> Why {
    match no {
        NoLane::HostGone => Why::HostGone,
        NoLane::NoQueue => Why::NoQueue,
    }
}

/// One digest request: `data` staged in a slot, or read by the device at
/// `at` (where [`Lane::place`] found it); the digest comes back in the
/// slot either way.
fn request(
    lane: &mut Lane,
    slot: u16,
    alg: Alg,
    handle: u64,
    flags: u16,
    data: &[u8],
    at: Option<u64>,
) -> Result<Option<Vec<u8>>> {
    let addr = lane.slot_addr(slot);
    let src = at.unwrap_or_else(|| {
        lane.put(slot, 0, data);
        addr
    });
    let out = addr + (SLOT - MAX_DIGEST) as u64;
    let desc = DigestOp {
        session: handle,
        alg: (handle == 0).then_some(alg),
        flags,
        src,
        len: data.len() as u64,
        out,
    }
    .encode();
    let d = lane.call(desc)?;
    device_status(d.status, "digest")?;
    if flags & F_DIGEST_FINAL == 0 {
        return Ok(None);
    }
    let n = (d.result as usize).min(MAX_DIGEST);
    let mut digest = vec![0u8; n];
    lane.get(slot, SLOT - MAX_DIGEST, &mut digest);
    Ok(Some(digest))
}

impl Drop for Digest {
    fn drop(&mut self) {
        self.key.fill(0);
        if let State::Device { session, .. } = &self.state {
            lane::release_sessions(Kind::Digest, std::slice::from_ref(session));
        }
    }
}
