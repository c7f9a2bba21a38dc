//! Asynchronous requests: [`Compressor::start`] hands a block to the
//! device and returns at once; [`Compressor::poll`] (non-blocking) or
//! [`Compressor::finish`] (waiting) copy its result out.
//!
//! They travel on a queue of their own with its own staging area, so a
//! synchronous batch or a stream run meanwhile neither reaps their
//! completions nor moves the memory they are in. A block that finds every
//! slot busy (or does not fit one while others are in flight) is computed
//! at once in the calling thread: the engine and the caller both work.
//! The input stays in its slot until the request completes, so a request
//! whose host died is computed here from that copy.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use wd_route::{Queue as QueueState, Route, Why};
use wd_zip_codec::{CodecError, Inflated};
use wd_zip_msg::{Algorithm, Done, OneShot, MAX_DATA};
use wrapdrive::{Capability, ClientError, HostConn, Queue, SharedBuf};

use crate::{device_status, op_index, CompError, Compressor, Policy, Result, POLL_BEFORE_SLEEP};

/// What a request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Compress the input into one stream at this level.
    Compress(i8),
    /// Decompress the stream at the start of the input, refusing output
    /// beyond this many times the input (0: no limit).
    Decompress(u16),
}

/// A request started by [`Compressor::start`]: finish it with
/// [`Compressor::poll`] or [`Compressor::finish`] and the same output
/// buffer. One dropped unfinished is abandoned: its result is never
/// written, and its device slot is free again once the device is done
/// with it (the compressor looks when it next needs a slot).
#[derive(Debug)]
#[must_use = "a started request's result is written only when it is finished"]
pub struct Pending {
    /// The compressor that started it.
    owner: u64,
    state: State,
    /// Where an unfinished request leaves its slot when dropped: its
    /// lane's list of abandoned slots.
    abandoned: Option<Abandoned>,
}

/// Slots of a lane whose requests were dropped unfinished.
type Abandoned = Arc<Mutex<Vec<usize>>>;

impl Drop for Pending {
    fn drop(&mut self) {
        if let (State::InFlight { slot, .. }, Some(a)) = (&self.state, &self.abandoned) {
            a.lock().unwrap_or_else(PoisonError::into_inner).push(*slot);
        }
    }
}

#[derive(Debug)]
enum State {
    /// Computed at once (the output is written).
    Done(Inflated),
    /// On the device, in this slot of the asynchronous lane `lane`.
    InFlight {
        lane: u64,
        slot: usize,
        op: Op,
        alg: Algorithm,
        input: usize,
        room: usize,
        sent: Option<Instant>,
    },
    /// Finished already: polling again is a caller error.
    Taken,
}

impl Pending {
    /// Whether the result is ready without asking the device (computed
    /// here at start).
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done(_))
    }
}

/// The asynchronous lane: a queue and `depth` slots of `slot` bytes
/// (input, then output room), each free or holding one request.
pub(crate) struct AsyncLane {
    /// Unique, so a request never finishes on a lane opened after its own.
    id: u64,
    q: Queue,
    stage: Option<SharedBuf>,
    slot: usize,
    busy: Vec<bool>,
    /// Busy slots whose requests were dropped unfinished.
    abandoned: Abandoned,
    /// The queue failed: no new requests; the ones in flight are computed
    /// here from their slots as they are finished, then the lane goes.
    dead: bool,
}

impl AsyncLane {
    pub(crate) fn open(
        host: &Arc<HostConn>,
        depth: usize,
    ) -> std::result::Result<Self, ClientError> {
        let mut q =
            host.request_queue(&Capability::new(wd_zip_msg::QUEUE_ALG).depth(depth as u32 * 2))?;
        q.set_redo_policy(wd_zip_msg::redo_safe);
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Ok(AsyncLane {
            id: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            dead: false,
            q,
            stage: None,
            slot: 0,
            busy: vec![false; depth],
            abandoned: Arc::default(),
        })
    }

    fn in_flight(&self) -> bool {
        self.busy.iter().any(|&b| b)
    }

    /// Free the slots of abandoned requests the device is done with (or
    /// will never answer: the queue failed, the host restarted).
    fn reap_abandoned(&mut self) {
        let AsyncLane {
            q, busy, abandoned, ..
        } = self;
        abandoned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|&slot| match q.recv_cookie(slot as u64) {
                Ok(None) => true,
                Ok(Some(_)) | Err(_) => {
                    busy[slot] = false;
                    false
                }
            });
    }

    /// A free slot of at least `need` bytes: the staging area is made (or
    /// made larger) only while nothing is in flight.
    fn take(&mut self, need: usize) -> std::result::Result<Option<usize>, ClientError> {
        self.reap_abandoned();
        if need > self.slot {
            if self.in_flight() {
                return Ok(None);
            }
            let slot = need.next_power_of_two().max(64 << 10);
            if let Some(old) = self.stage.take() {
                self.q.unshare(old.addr(), old.len())?;
            }
            self.slot = 0;
            let stage = SharedBuf::new(slot * self.busy.len())?;
            self.q.share(stage.addr(), stage.len())?;
            self.stage = Some(stage);
            self.slot = slot;
        }
        let Some(s) = self.busy.iter().position(|&b| !b) else {
            return Ok(None);
        };
        self.busy[s] = true;
        Ok(Some(s))
    }
}

impl Compressor {
    /// Start `op` on `input`, its output going to `out`: computed at once
    /// here (below the threshold, policy `cpu`, no queue, every slot
    /// busy) or sent to the device, returning without waiting. `out`
    /// receives a result computed here now, a device result when the
    /// request is finished ([`Compressor::poll`], [`Compressor::finish`]
    /// with the same `out`).
    pub fn start(
        &mut self,
        op: Op,
        alg: Algorithm,
        input: &[u8],
        out: &mut [u8],
    ) -> Result<Pending> {
        let compress = matches!(op, Op::Compress(_));
        if let Op::Compress(level) = op {
            wd_zip_msg::check_level(alg, level).map_err(|_| CodecError::Param)?;
        }
        let done = |c: &Compressor, r: Inflated| Pending {
            owner: c.id,
            state: State::Done(r),
            abandoned: None,
        };
        let settings = wd_route::Settings {
            policy: self.cfg.policy,
            threshold: self.cfg.threshold,
            fallback: self.cfg.fallback,
        };
        let big = input.len() as u64 > MAX_DATA || out.len() as u64 > MAX_DATA;
        let route = if big {
            Route::Cpu(Why::Policy)
        } else {
            let may_offload = self.cfg.policy != Policy::Cpu && input.len() >= self.cfg.threshold;
            let queue = if may_offload && self.async_lane().is_none() {
                QueueState::Missing(Why::NoQueue)
            } else {
                QueueState::Ready
            };
            let r = wd_route::Request {
                op: op_index(alg, compress),
                bytes: input.len(),
                // The caller works meanwhile: any block above the threshold.
                overlapped: true,
                overlap_min: Some(0),
            };
            wd_route::decide(&settings, || queue, &mut self.costs, r).route
        };
        if let Route::Cpu(why) = route {
            let r = self.here(op, alg, input, out, why)?;
            return Ok(done(self, r));
        }
        // Without fallback the router sends everything here, queue or not.
        if self.async_lane().is_none() {
            return Err(CompError::NoQueue(self.no_lane.clone().unwrap_or_default()));
        }
        let lane = self.alane.as_mut().expect("looked for above");
        let slot = match lane.take(input.len() + out.len()) {
            Ok(Some(s)) => s,
            // Every slot busy: this thread works too.
            Ok(None) => {
                self.stats.cpu_assist += 1;
                let r = self.on_cpu_now(op, alg, input, out)?;
                return Ok(done(self, r));
            }
            // (Only while nothing is in flight: nothing is lost with it.)
            Err(e) => {
                self.alane = None;
                self.async_lost(e.to_string());
                if !self.cfg.fallback {
                    return Err(CompError::NoQueue(e.to_string()));
                }
                let r = self.here(op, alg, input, out, Why::HostGone)?;
                return Ok(done(self, r));
            }
        };
        let stage = lane.stage.as_ref().expect("taken a slot");
        let at = slot * lane.slot;
        stage.write(at as u64, input);
        let base = stage.addr() + at as u64;
        let (level, max_ratio) = match op {
            Op::Compress(l) => (l, 0),
            Op::Decompress(r) => (0, r),
        };
        let d = OneShot {
            compress,
            alg,
            level,
            max_ratio,
            src: base,
            src_len: input.len() as u64,
            dst: base + input.len() as u64,
            dst_len: out.len() as u64,
            piece: false,
        }
        .to_desc(0);
        if let Err(e) = lane.q.send_sync(d, slot as u64) {
            lane.busy[slot] = false;
            lane.dead = true;
            self.async_lost(e.to_string());
            if !self.cfg.fallback {
                return Err(CompError::NoQueue(e.to_string()));
            }
            let r = self.here(op, alg, input, out, Why::HostGone)?;
            return Ok(done(self, r));
        }
        Ok(Pending {
            owner: self.id,
            abandoned: Some(lane.abandoned.clone()),
            state: State::InFlight {
                lane: lane.id,
                slot,
                op,
                alg,
                input: input.len(),
                room: out.len(),
                sent: Some(Instant::now()),
            },
        })
    }

    /// The result of `p` if it is ready (`Ok(None)`: still on the device;
    /// call again), written into `out` (the buffer given to
    /// [`Compressor::start`]). A finished request's next poll is an error.
    pub fn poll(&mut self, p: &mut Pending, out: &mut [u8]) -> Result<Option<Inflated>> {
        self.complete(p, out, false)
    }

    /// Wait for `p` and write its result into `out` (the buffer given to
    /// [`Compressor::start`]).
    pub fn finish(&mut self, mut p: Pending, out: &mut [u8]) -> Result<Inflated> {
        Ok(self
            .complete(&mut p, out, true)?
            .expect("a blocking finish completes"))
    }

    fn complete(
        &mut self,
        p: &mut Pending,
        out: &mut [u8],
        block: bool,
    ) -> Result<Option<Inflated>> {
        if p.owner != self.id {
            return Err(CodecError::Param.into());
        }
        let State::InFlight {
            lane: lane_id,
            slot,
            op,
            alg,
            input,
            room,
            sent,
        } = p.state
        else {
            return match std::mem::replace(&mut p.state, State::Taken) {
                State::Done(r) => Ok(Some(r)),
                _ => Err(CodecError::Param.into()),
            };
        };
        if out.len() < room {
            return Err(CodecError::Param.into());
        }
        let Some(lane) = self.alane.as_mut().filter(|l| l.id == lane_id) else {
            // Not this compressor's lane (a lane goes only once nothing
            // is in flight on it).
            p.state = State::Taken;
            return Err(CodecError::Param.into());
        };
        let mut polled = false;
        let got = loop {
            match lane.q.recv_cookie(slot as u64) {
                Ok(Some(c)) => break Ok(c.desc),
                Ok(None) if !block => return Ok(None),
                // Poll a while before sleeping, as a batch does: a sleeper
                // costs the engine a wake-up call per completion.
                Ok(None) if !polled => {
                    polled = true;
                    let t = Instant::now();
                    while !lane.q.ring_ready() && t.elapsed() < POLL_BEFORE_SLEEP {
                        std::hint::spin_loop();
                    }
                }
                Ok(None) => {
                    polled = false;
                    if let Err(e) = lane.q.wait_completion(None) {
                        break Err(e);
                    }
                }
                Err(e) => break Err(e),
            }
        };
        p.state = State::Taken;
        let d = match got {
            Ok(d) if d.status != wrapdrive::STATUS_RESTARTED => d,
            failed => {
                // The host went away with the request (or the queue broke):
                // the input is still in its slot; compute it here.
                let stage = lane.stage.as_ref().expect("a slot in flight");
                let data = stage.read_vec((slot * lane.slot) as u64, input);
                lane.busy[slot] = false;
                lane.dead = true;
                self.async_lost(match failed {
                    Err(e) => e.to_string(),
                    Ok(_) => "the host restarted".into(),
                });
                if !self.cfg.fallback {
                    return Err(CompError::NoQueue(self.no_lane.clone().unwrap_or_default()));
                }
                return self
                    .here(op, alg, &data, &mut out[..room], Why::HostGone)
                    .map(Some);
            }
        };
        lane.busy[slot] = false;
        if let Some(t) = sent {
            self.costs.record(
                op_index(alg, matches!(op, Op::Compress(_))),
                input,
                false,
                t.elapsed(),
            );
        }
        self.stats.offloaded += 1;
        device_status(d.status)?;
        let r = Done::from_result(d.result);
        let produced = (r.produced as usize).min(room);
        let stage = lane.stage.as_ref().expect("a slot in flight");
        stage.read((slot * lane.slot + input) as u64, &mut out[..produced]);
        self.stats.bytes_in += input as u64;
        self.stats.bytes_out += produced as u64;
        Ok(Some(Inflated {
            consumed: r.consumed as usize,
            produced,
        }))
    }

    /// Compute a request here for `why`, counted.
    fn here(
        &mut self,
        op: Op,
        alg: Algorithm,
        input: &[u8],
        out: &mut [u8],
        why: Why,
    ) -> Result<Inflated> {
        self.stats.count_cpu(why);
        self.on_cpu_now(op, alg, input, out)
    }

    fn on_cpu_now(
        &mut self,
        op: Op,
        alg: Algorithm,
        input: &[u8],
        out: &mut [u8],
    ) -> Result<Inflated> {
        let r = match op {
            Op::Compress(level) => Inflated {
                consumed: input.len(),
                produced: self.cpu.compress(alg, level, input, out)?,
            },
            Op::Decompress(ratio) => self.cpu.decompress(alg, input, out, ratio)?,
        };
        self.stats.bytes_in += input.len() as u64;
        self.stats.bytes_out += r.produced as u64;
        Ok(r)
    }

    /// The asynchronous lane, opened on first use (None without a queue,
    /// or while a failed one still holds requests).
    fn async_lane(&mut self) -> Option<&mut AsyncLane> {
        if let Some(l) = self.alane.as_mut().filter(|l| l.dead) {
            l.reap_abandoned();
        }
        if self.alane.as_ref().is_some_and(|l| l.dead) {
            if self.alane.as_ref().is_some_and(AsyncLane::in_flight) {
                return None;
            }
            self.alane = None;
        }
        let waiting = self
            .no_alane_at
            .is_some_and(|t| t.elapsed() < crate::RETRY_AFTER);
        if self.alane.is_none() && !waiting && self.lane().is_some() {
            let host = self.host.clone()?;
            match AsyncLane::open(&host, self.cfg.depth.max(1)) {
                Ok(l) => {
                    self.alane = Some(l);
                    self.no_alane_at = None;
                }
                Err(e) => self.async_lost(e.to_string()),
            }
        }
        self.alane.as_mut()
    }

    /// The asynchronous lane failed (`why`): asked for again after
    /// [`crate::RETRY_AFTER`]. The synchronous lane stays: its stream sessions
    /// live on its queue, which makes itself again after a host restart.
    fn async_lost(&mut self, why: String) {
        self.no_lane = Some(why);
        self.no_alane_at = Some(Instant::now());
    }
}
