//! Engine threads: poll the rings of their queues, process requests through
//! the device driver, post completions, and sleep when idle.
#![allow(unsafe_code)]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::os::fd::{AsFd, OwnedFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use wd_device::{cancelled, status, DeviceQueue, DeviceSlice, Dma, HeldSlice, Progress, Started};
use wd_iommu::{
    Access, Attachment, Domain, Endpoint, EngineTlb, Fault, FaultOutcome, FaultReason, Iommu,
    Resolution, Section,
};
use wd_ring::{Desc, HostState, RingView};
use wd_sys::guard::Guard;
use wd_sys::process_mem::{AccessError, ProcessMemory};

use crate::queue::{MemModel, Queue, QueueState};

/// Bytes of work after which a request's completion is posted at once.
const POST_AT_ONCE: u64 = 2048;
/// Requests taken from one ring per pass (fairness between queues).
const BATCH: usize = 32;
/// Idle passes between two reads of the clock.
const IDLE_CLOCK_EVERY: u32 = 64;
/// Longest an idle engine sleeps before it looks at its commands again.
const SLEEP_TIMEOUT: Duration = Duration::from_millis(500);

/// Commands to an engine thread.
pub enum EngineCmd {
    /// Start serving a queue through this (host-side) ring view, with the
    /// device's side of the queue.
    Attach(Arc<Queue>, RingView, Box<dyn DeviceQueue>),
    /// Stop serving a queue: fail what is left, mark the ring stopped, ack.
    Detach(u32, mpsc::Sender<()>),
    /// Exit the thread.
    Stop,
}

/// How often an engine slept, and how often a doorbell (not its timeout)
/// woke it.
#[derive(Debug, Default)]
pub struct SleepCounts {
    /// Sleeps.
    pub sleeps: std::sync::atomic::AtomicU64,
    /// Sleeps ended by a doorbell.
    pub wakeups: std::sync::atomic::AtomicU64,
}

/// Handle to a running engine thread.
pub struct EngineHandle {
    tx: mpsc::Sender<EngineCmd>,
    /// The ringing end of the engine's own doorbell line (its other end
    /// is the engine's alone): the host's commands and kicks. Clients
    /// ring their queue's own line (`Queue::bell`).
    doorbell: OwnedFd,
    /// Queues attached (for placement).
    pub load: Arc<AtomicUsize>,
    /// Whether the engine is asleep (for `wd ls` and tests).
    pub sleeping: Arc<AtomicBool>,
    /// Sleeps taken and sleeps ended by a doorbell (for `wd ls`).
    pub sleeps: Arc<SleepCounts>,
    /// Set after a command is sent: the engine looks at its channel only
    /// then, not on every pass.
    commands: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EngineHandle {
    /// Start an engine thread for a device; it translates through its own
    /// IOTLB on `iommu`.
    pub fn spawn(
        name: String,
        idle_spin: Duration,
        pass_bytes: u64,
        cpu: Option<usize>,
        iommu: &Arc<Iommu>,
    ) -> std::io::Result<EngineHandle> {
        // Engines touch client memory that may vanish under them.
        wd_sys::guard::install().map_err(std::io::Error::other)?;
        let (tx, rx) = mpsc::channel();
        let (bell, doorbell) =
            wd_sys::wake_line().map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
        let load = Arc::new(AtomicUsize::new(0));
        let sleeping = Arc::new(AtomicBool::new(false));
        let sleeps = Arc::new(SleepCounts::default());
        let commands = Arc::new(AtomicBool::new(false));
        let state = EngineLoop {
            rx,
            commands: commands.clone(),
            bell,
            idle_spin,
            pass_bytes,
            queues: Vec::new(),
            sleeping: sleeping.clone(),
            sleeps: sleeps.clone(),
            runs_a: Vec::new(),
            runs_b: Vec::new(),
            bounce: Vec::new(),
            out: Vec::new(),
            held_seqs: BTreeMap::new(),
            held_tags: BTreeMap::new(),
            pinned: None,
            pinned_tags: Some(Vec::new()),
            next_token: 0,
            reported: Vec::new(),
            tlb: EngineTlb::new(iommu),
        };
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            if let Some(c) = cpu {
                // Best effort: an engine that cannot be pinned still serves.
                let _ = wd_sys::pin_thread(c);
            }
            state.run()
        })?;
        Ok(EngineHandle {
            tx,
            doorbell,
            load,
            sleeping,
            sleeps,
            commands,
            thread: Some(thread),
        })
    }

    fn command(&self, c: EngineCmd) {
        if self.tx.send(c).is_ok() {
            // Release: pairs with the Acquire swap in `EngineLoop::run`; the
            // command is in the channel before the engine looks.
            self.commands.store(true, Ordering::Release);
            let _ = wd_sys::wake(self.doorbell.as_fd());
        }
    }

    /// Hand a queue to this engine.
    pub fn attach(&self, q: Arc<Queue>, view: RingView, dev: Box<dyn DeviceQueue>) {
        self.load.fetch_add(1, Ordering::Relaxed);
        self.command(EngineCmd::Attach(q, view, dev));
    }

    /// Wake the engine (a stalled request was resolved).
    pub fn kick(&self) {
        let _ = wd_sys::wake(self.doorbell.as_fd());
    }

    /// Take a queue away; returns once the engine no longer touches it.
    pub fn detach(&self, id: u32) {
        let (tx, rx) = mpsc::channel();
        self.command(EngineCmd::Detach(id, tx));
        // The engine answers within one pass; if it is gone, it cannot
        // touch the queue either.
        let _ = rx.recv_timeout(Duration::from_secs(10));
        // Never below zero: a queue whose device panicked while it was
        // being opened is released without having been attached.
        let _ = self
            .load
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        self.command(EngineCmd::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A request stalled on a translation fault, waiting for its resolution.
struct Parked {
    stag: u64,
    dom: Arc<Domain>,
    /// The descriptor as the client sent it (a retry starts over).
    desc: Desc,
    /// The domain's resolution generation when last looked at.
    seen: u64,
}

struct Served {
    q: Arc<Queue>,
    view: RingView,
    dev: Box<dyn DeviceQueue>,
    /// `dev.asynchronous()`, asked once.
    asynchronous: bool,
    /// `dev.register_driven()`, asked once.
    register_driven: bool,
    /// The section a register-driven device holds memory from, and the
    /// tag of the domain it was reached through (0: not known, the
    /// attachment changed while memory was held), counted in `held_seqs`
    /// and `held_tags`.
    reg_pin: Option<(u64, u64)>,
    /// The endpoint's attachment and the generation it was taken at
    /// (`Endpoint::generation`): taken again only when that changes.
    att: Option<(u64, Attachment)>,
    parked: Vec<Parked>,
    /// A request cut in pieces: the descriptor as sent and the bytes done.
    partial: Option<(Desc, u64)>,
    /// Requests taken from the ring that the last pass had no budget for,
    /// in ring order.
    backlog: VecDeque<Desc>,
    /// Requests the (asynchronous) device holds: token -> the section
    /// sequence their memory was translated at, and the tag of the domain
    /// it was translated through.
    held: HashMap<u64, (u64, u64)>,
}

impl Served {
    /// Whether a waiting submission can be taken: the completion ring has
    /// room for one more request besides those taken and not yet
    /// completed, and no stalled request holds the queue (its resolution
    /// rings the doorbell; one that times out is met when the sleep does).
    fn room_to_complete(&mut self) -> bool {
        if !self.parked.is_empty() {
            return false;
        }
        let kept = self.held.len()
            + self.parked.len()
            + self.backlog.len()
            + usize::from(self.partial.is_some());
        // A ring the client corrupted: serve it, so the pass finds out.
        self.view
            .cq_space()
            .map_or(true, |free| free as usize > kept)
    }
}

struct EngineLoop {
    rx: mpsc::Receiver<EngineCmd>,
    /// Commands wait in `rx` (see `EngineHandle::commands`).
    commands: Arc<AtomicBool>,
    /// The doorbell line's end the engine sleeps on: no client holds it.
    bell: OwnedFd,
    idle_spin: Duration,
    /// Bytes of work per queue per pass (`Limits::pass_bytes`).
    pass_bytes: u64,
    queues: Vec<Served>,
    sleeping: Arc<AtomicBool>,
    sleeps: Arc<SleepCounts>,
    runs_a: Vec<(u64, u64)>,
    runs_b: Vec<(u64, u64)>,
    bounce: Vec<u8>,
    /// Completions of the pass being served.
    out: Vec<Desc>,
    /// Held requests of every queue by translation sequence (count): the
    /// oldest is what the IOTLB must keep pinned.
    held_seqs: BTreeMap<u64, u32>,
    /// Held requests of every queue by the tag of the domain they were
    /// translated through (count; 0: not known, as a blocked attachment's
    /// or a register-driven device re-attached while it held memory): a
    /// sync for another domain need not wait for them.
    held_tags: BTreeMap<u64, u32>,
    /// The pin last given to the IOTLB.
    pinned: Option<u64>,
    /// The pin's domains last given to the IOTLB.
    pinned_tags: Option<Vec<u64>>,
    next_token: u64,
    /// Completions an asynchronous device reports.
    reported: Vec<(u64, Desc)>,
    tlb: EngineTlb,
}

/// Scratch buffers of the DMA path, and the SIGBUS guard of the pass:
/// one guarded section for every request of a pass, each request asking
/// afterwards whether it met vanished memory.
struct Scratch<'a> {
    runs_a: &'a mut Vec<(u64, u64)>,
    runs_b: &'a mut Vec<(u64, u64)>,
    bounce: &'a mut Vec<u8>,
    guard: Guard,
}

impl EngineLoop {
    fn run(mut self) {
        let mut batch: Vec<Desc> = Vec::with_capacity(BATCH);
        // When the engine found itself idle (read lazily: reading the clock
        // costs as much as a pass, so it is read every few idle passes and
        // never right after work).
        let mut idle_since: Option<Instant> = None;
        let mut idle_passes = 0u32;
        // The last sleep ended by its timeout, not by a doorbell.
        let mut dozing = false;
        loop {
            // Acquire: pairs with the Release store in
            // `EngineHandle::command`.
            if self.commands.load(Ordering::Relaxed)
                && self.commands.swap(false, Ordering::Acquire)
                && !self.commands()
            {
                break;
            }
            let mut worked = false;
            let mut i = 0;
            while i < self.queues.len() {
                match self.serve(i, &mut batch) {
                    Ok(n) => {
                        worked |= n > 0;
                        i += 1;
                    }
                    Err(()) => {
                        // Corrupt ring, or memory that vanished: stop
                        // serving it; the owner's connection tears it down.
                        let mut s = self.queues.swap_remove(i);
                        let stopped = self.drop_holds(&mut s);
                        s.q.set_state(QueueState::Broken);
                        s.view.set_host_state(HostState::Broken);
                        fail_taken(&mut s, stopped);
                        let _ = wd_sys::wake(s.q.cq_event.as_fd());
                    }
                }
            }
            self.update_pin();
            if worked {
                idle_passes = 0;
                idle_since = None;
                dozing = false;
                continue;
            }
            idle_passes = idle_passes.wrapping_add(1);
            // A device that holds requests owes completions: poll, never
            // sleep.
            if !self.held_seqs.is_empty() || idle_passes % IDLE_CLOCK_EVERY != 0 {
                continue;
            }
            std::hint::spin_loop();
            let now = Instant::now();
            // After a sleep that timed out (nothing rang) the engine goes
            // back to sleep at once: spinning `idle_spin` again after every
            // timeout would keep a long-spinning device's thread busy.
            if !dozing && now.duration_since(*idle_since.get_or_insert(now)) < self.idle_spin {
                continue;
            }
            dozing = !self.sleep();
            idle_passes = 0;
            idle_since = None;
        }
        let queues = std::mem::take(&mut self.queues);
        for mut s in queues {
            self.drop_holds(&mut s);
            s.view.set_host_state(HostState::Stopped);
            let _ = wd_sys::wake(s.q.cq_event.as_fd());
        }
        self.update_pin();
    }

    /// Give the IOTLB the oldest translation a held request still uses.
    fn update_pin(&mut self) {
        if !same_tags(&self.held_tags, &self.pinned_tags) {
            let tags = pin_tags(&self.held_tags);
            self.pinned_tags = tags.clone();
            self.tlb.pin_tags(tags);
        }
        let want = self.held_seqs.keys().next().copied();
        if want != self.pinned {
            self.pinned = want;
            self.tlb.pin(want);
        }
    }

    /// Forget a held request's pin.
    fn unhold(held_seqs: &mut BTreeMap<u64, u32>, seq: u64) {
        if let Some(n) = held_seqs.get_mut(&seq) {
            *n -= 1;
            if *n == 0 {
                held_seqs.remove(&seq);
            }
        }
    }

    /// Stop a queue's held requests (teardown): the device lets go of
    /// their memory, they complete (-ECANCELED unless they had finished),
    /// their pins go.
    fn drop_holds(&mut self, s: &mut Served) -> Vec<Desc> {
        let mut stopped = Vec::new();
        if !s.held.is_empty() {
            let _ = catch_unwind(AssertUnwindSafe(|| s.dev.abort(&mut stopped)));
        }
        if s.register_driven {
            let _ = catch_unwind(AssertUnwindSafe(|| s.dev.quiesce()));
            if let Some((seq, tag)) = s.reg_pin.take() {
                Self::unhold(&mut self.held_seqs, seq);
                Self::unhold(&mut self.held_tags, tag);
            }
        }
        for (_, (seq, tag)) in s.held.drain() {
            Self::unhold(&mut self.held_seqs, seq);
            Self::unhold(&mut self.held_tags, tag);
        }
        s.q.in_flight.store(0, Ordering::Relaxed);
        stopped.into_iter().map(|(_, d)| d).collect()
    }

    /// Apply pending commands; false when the engine must exit.
    fn commands(&mut self) -> bool {
        loop {
            match self.rx.try_recv() {
                Ok(EngineCmd::Attach(q, view, dev)) => self.queues.push(Served {
                    q,
                    view,
                    asynchronous: dev.asynchronous(),
                    register_driven: dev.register_driven(),
                    reg_pin: None,
                    att: None,
                    dev,
                    parked: Vec::new(),
                    partial: None,
                    backlog: VecDeque::new(),
                    held: HashMap::new(),
                }),
                Ok(EngineCmd::Detach(id, ack)) => {
                    if let Some(pos) = self.queues.iter().position(|s| s.q.id == id) {
                        let mut s = self.queues.swap_remove(pos);
                        let stopped = self.drop_holds(&mut s);
                        // Before the ack: the teardown's sync must not wait
                        // for requests nobody will complete.
                        self.update_pin();
                        cancel_pending(&mut s, stopped);
                    }
                    let _ = ack.send(());
                }
                Ok(EngineCmd::Stop) => return false,
                Err(mpsc::TryRecvError::Empty) => return true,
                Err(mpsc::TryRecvError::Disconnected) => return false,
            }
        }
    }

    /// Sleep until a doorbell or the timeout; false when it timed out
    /// (or did not sleep because work came) without a doorbell.
    fn sleep(&mut self) -> bool {
        let mut work = false;
        for s in &mut self.queues {
            // host_prepare_sleep sets NEED_WAKEUP then re-checks the ring;
            // a register-driven device arms its own wake-up and re-checks
            // its doorbells after that. A submission the completion ring
            // has no room for is no work: a client that stops reaping
            // must not keep the engine awake. It is taken at the client's
            // next doorbell or the sleep's timeout (the client library
            // never sends more than its ring can complete).
            // A register-driven queue never takes from its ring (its
            // device still reads NEED_WAKEUP): an entry a client wrote
            // there is no work either, it kept the engine spinning.
            let ring = s.view.host_prepare_sleep();
            if s.register_driven {
                work |= catch_unwind(AssertUnwindSafe(|| s.dev.prepare_sleep())).unwrap_or(true);
            } else {
                work |= ring && s.room_to_complete();
            }
        }
        let mut rang = work;
        if !work {
            self.sleeping.store(true, Ordering::Relaxed);
            // The engine's own line (commands, kicks) and each queue's
            // doorbell line.
            let mut fds = Vec::with_capacity(1 + self.queues.len());
            fds.push(self.bell.as_fd());
            fds.extend(self.queues.iter().map(|s| s.q.bell.as_fd()));
            let polled = wd_sys::poll(&fds, Some(SLEEP_TIMEOUT));
            self.sleeping.store(false, Ordering::Relaxed);
            rang = false;
            for (k, fd) in fds.iter().enumerate() {
                // (Every line when poll failed.)
                let ready = polled.as_ref().map_or(true, |r| r[k].readable);
                if ready {
                    rang |= wd_sys::wake_drain(*fd).is_ok_and(|n| n > 0);
                }
            }
            self.sleeps.sleeps.fetch_add(1, Ordering::Relaxed);
            if rang {
                self.sleeps.wakeups.fetch_add(1, Ordering::Relaxed);
            }
        }
        for s in &self.queues {
            s.view.host_end_sleep();
        }
        rang
    }

    /// One pass over queue `i`: Err(()) when its ring is corrupt or its
    /// memory vanished.
    ///
    /// A pass does at most `pass_bytes` of work for the queue (a request
    /// is cut in pieces where its device can, see
    /// `DeviceQueue::process_part`) so every queue of the engine is served
    /// within a bounded time, whatever the others ask for.
    fn serve(&mut self, i: usize, batch: &mut Vec<Desc>) -> Result<usize, ()> {
        batch.clear();
        // An attachment replaced since the last pass that used it goes now,
        // idle or not: a destroyed domain's tables must not live on for as
        // long as its queue sends nothing.
        let s = &mut self.queues[i];
        if matches!(&s.att, Some((g, _)) if *g != s.q.endpoint.generation()) {
            s.att = None;
        }
        if self.queues[i].q.state() != QueueState::Active {
            return Ok(0);
        }
        let mut worked = 0;
        if !self.queues[i].parked.is_empty() {
            worked += self.serve_parked(i, batch)?;
            batch.clear();
            // A stalled request holds its queue: nothing sent after it
            // overtakes it (the next part of its session would run on a
            // chain or hash that lacks it).
            if !self.queues[i].parked.is_empty() {
                return Ok(worked);
            }
        }
        if self.queues[i].register_driven {
            return self.serve_registers(i);
        }
        if self.queues[i].asynchronous {
            return self.serve_async(i, batch).map(|n| n + worked);
        }
        let EngineLoop {
            queues,
            tlb,
            runs_a,
            runs_b,
            bounce,
            out,
            pass_bytes,
            ..
        } = self;
        let budget = *pass_bytes;
        let s = &mut queues[i];
        if !s.backlog.is_empty() {
            batch.extend(s.backlog.drain(..));
        }
        if s.partial.is_none() && batch.len() < BATCH {
            // Requests taken and not yet completed keep their completion
            // slots.
            let held = s.parked.len() + batch.len();
            let max = if held == 0 {
                BATCH
            } else {
                (s.view.cq_space().map_err(|_| ())? as usize)
                    .saturating_sub(held)
                    .min(BATCH - batch.len())
            };
            s.view.fetch(max, batch).map_err(|_| ())?;
        }
        if s.partial.is_none() && batch.is_empty() {
            return Ok(worked);
        }
        let q: &Queue = &s.q;
        // One attachment and one section per pass: what the pass reaches
        // through a translation is done with when the section ends, which
        // is what an invalidation's sync waits for. A request cut in
        // pieces translates again in each pass.
        let mut sec = tlb.enter();
        let att = kept_attachment(&mut s.att, &q.endpoint);
        let mut scratch = Scratch {
            runs_a,
            runs_b,
            bounce,
            guard: Guard::enter(),
        };
        out.clear();
        let (mut spent, mut bytes, mut posted, mut next) = (0u64, 0u64, 0usize, 0usize);
        let mut current = s.partial.take();
        loop {
            let (orig, done) = match current.take() {
                Some(w) => w,
                None if next < batch.len() && spent < budget => {
                    next += 1;
                    (batch[next - 1], 0)
                }
                None => break,
            };
            let mut d = orig;
            worked += 1;
            let (parked, progress) = if q.state() == QueueState::Broken {
                // An earlier request of the pass found the memory gone.
                d = cancelled(d);
                (None, Progress::Done)
            } else {
                // A retry starts a request over: only one that has changed
                // nothing yet may stall, or one whose device says its
                // earlier pieces changed nothing it reads (they may have
                // overwritten its source, or moved a session on); else a
                // later piece's fault fails it.
                let stallable = done == 0
                    || catch_unwind(AssertUnwindSafe(|| s.dev.restartable(&orig))).unwrap_or(false);
                process(
                    &mut sec,
                    q,
                    att,
                    &mut s.dev,
                    &mut d,
                    &mut scratch,
                    stallable,
                    (done, budget - spent),
                )
            };
            let big = match (parked, progress) {
                (Some(p), _) => {
                    // The rest of the pass waits behind it, in order.
                    s.parked.push(Parked { desc: orig, ..p });
                    break;
                }
                (None, Progress::More(upto)) => {
                    s.partial = Some((orig, upto));
                    break;
                }
                (None, Progress::Done) => {
                    // The device's count of the bytes moved, not its
                    // result, which is something else for some devices (a
                    // zip result packs the input taken and the output made).
                    let n = if d.status == 0 { s.dev.bytes_of(&d) } else { 0 };
                    bytes += n;
                    // What it cost (a decompression wrote more than it
                    // read): the budget's measure.
                    let w = if d.status == 0 { s.dev.work_of(&d) } else { 0 };
                    spent += w.saturating_sub(done).max(1);
                    out.push(d);
                    n >= POST_AT_ONCE
                }
            };
            // Post a large request's completion at once (its owner can use
            // the result while the next ones are processed; a strict unshare
            // of its buffers still waits for this section to end); small
            // ones go out together at the end of the pass.
            if big && posted < out.len() {
                if s.view.complete(&out[posted..]).map_err(|_| ())? {
                    let _ = wd_sys::wake(q.cq_event.as_fd());
                }
                posted = out.len();
            }
        }
        // What the budget did not reach waits for the next pass, in order.
        if next < batch.len() {
            s.backlog.extend(batch.drain(next..));
        }
        if posted < out.len() && s.view.complete(&out[posted..]).map_err(|_| ())? {
            let _ = wd_sys::wake(q.cq_event.as_fd());
        }
        drop(sec);
        q.requests.fetch_add(out.len() as u64, Ordering::Relaxed);
        q.bytes.fetch_add(bytes, Ordering::Relaxed);
        if q.state() == QueueState::Broken {
            // A device access found the client's memory gone.
            return Err(());
        }
        Ok(worked)
    }

    /// One pass over a register-driven device (a controller the client
    /// drives through registers and doorbells, not the ring): the device
    /// reaches client memory through the queue's domain inside one
    /// section, as a ring pass does. A fault aborts the command that met it
    /// (the device completes it with its own error status) and is recorded.
    fn serve_registers(&mut self, i: usize) -> Result<usize, ()> {
        let EngineLoop {
            queues,
            tlb,
            runs_a,
            runs_b,
            bounce,
            held_seqs,
            held_tags,
            pinned,
            pinned_tags,
            ..
        } = self;
        let s = &mut queues[i];
        let q: &Queue = &s.q;
        let mut sec = tlb.enter();
        let att = kept_attachment(&mut s.att, &q.endpoint);
        let dom = match att {
            Attachment::Domain(x) => Some(&**x),
            Attachment::Blocked => None,
        };
        let mut fault = None;
        let guard = Guard::enter();
        let mut dma = QueueDma {
            q,
            dom,
            sec: &mut sec,
            runs_a,
            runs_b,
            bounce,
            fault: &mut fault,
        };
        let done = catch_unwind(AssertUnwindSafe(|| s.dev.service(&mut dma)));
        let vanished = guard.take_fault();
        // What the device holds (a transfer under way into client memory)
        // is pinned before the section ends, as `serve_async` does: an
        // unshare's sync that saw this section end unpinned would return
        // while the transfer still writes.
        // The device reaches client memory through this queue's domain
        // only: the pin keeps that domain's translations, and the syncs of
        // other domains (other clients' unshares) need not wait for it. A
        // pin taken through another attachment (an ATTACH meanwhile) may
        // hold either domain's memory: not known (0) until it goes.
        if let Ok(done) = &done {
            let now = match att {
                Attachment::Domain(x) => x.tag(),
                Attachment::Blocked => 0,
            };
            let want = done.holds_from.map(|seq| {
                let tag = match s.reg_pin {
                    Some((_, t)) if t != now => 0,
                    _ => now,
                };
                (seq, tag)
            });
            if want != s.reg_pin {
                if let Some((seq, tag)) = s.reg_pin.take() {
                    Self::unhold(held_seqs, seq);
                    Self::unhold(held_tags, tag);
                }
                if let Some((seq, tag)) = want {
                    *held_seqs.entry(seq).or_default() += 1;
                    *held_tags.entry(tag).or_default() += 1;
                }
                s.reg_pin = want;
            }
        }
        publish_pin(&mut sec, held_seqs, held_tags, (pinned, pinned_tags));
        drop(sec);
        if let Some(f) = fault {
            q.fault_count.fetch_add(1, Ordering::Relaxed);
            let fdom = match att {
                Attachment::Domain(x) => x.clone(),
                Attachment::Blocked => q.domain().clone(),
            };
            let _ = fdom.report_fault(f, false);
        }
        let Ok(done) = done else {
            // A device bug met by this client's input: stop serving it
            // rather than run on with state the panic left half-changed
            // (its holds go with `drop_holds`).
            q.set_state(QueueState::Broken);
            return Err(());
        };
        if vanished.is_some() {
            q.set_state(QueueState::Broken);
        }
        q.requests.fetch_add(done.requests, Ordering::Relaxed);
        q.bytes.fetch_add(done.bytes, Ordering::Relaxed);
        if q.state() == QueueState::Broken {
            return Err(());
        }
        Ok(done.work + usize::from(done.busy))
    }

    /// One pass over a queue whose device may hold requests: collect what
    /// it finished, then hand it what the ring has; it completes each now
    /// or later, in any order. The memory of a held request stays pinned
    /// (an unshare's sync waits) until the device reports it.
    ///
    /// The pass's budget (`pass_bytes`) bounds what it runs here as it
    /// bounds a synchronous queue's pass: requests the device completes at
    /// once count their bytes, what the budget did not reach waits in the
    /// backlog, and a request the device leaves to the engine
    /// ([`Started::Cut`]) runs in pieces over passes, no other request of
    /// the queue starting before it ends.
    fn serve_async(&mut self, i: usize, batch: &mut Vec<Desc>) -> Result<usize, ()> {
        let EngineLoop {
            queues,
            tlb,
            runs_a,
            runs_b,
            bounce,
            out,
            held_seqs,
            held_tags,
            pinned,
            pinned_tags,
            next_token,
            reported,
            pass_bytes,
            ..
        } = self;
        let budget = *pass_bytes;
        let s = &mut queues[i];
        let q = s.q.clone();
        out.clear();
        let mut worked = 0;
        if s.partial.is_none() {
            batch.extend(s.backlog.drain(..));
            // Held and stalled requests keep their completion slots (those
            // finished since the last pass too: they are reported below),
            // as do the ones taken and not yet run.
            let kept = s.held.len() + s.parked.len() + batch.len();
            let max = if kept == 0 {
                BATCH
            } else {
                (s.view.cq_space().map_err(|_| ())? as usize)
                    .saturating_sub(kept)
                    .min(BATCH.saturating_sub(batch.len()))
            };
            s.view.fetch(max, batch).map_err(|_| ())?;
        }
        if s.partial.is_some() || !batch.is_empty() {
            // The attachment is read inside the section, as `serve` reads
            // it: an ATTACH's sync then waits for this pass to end.
            let mut sec = tlb.enter();
            let att = kept_attachment(&mut s.att, &q.endpoint);
            let seq = sec.seq();
            let mut scratch = Scratch {
                runs_a,
                runs_b,
                bounce,
                guard: Guard::enter(),
            };
            let mut spent = 0u64;
            // A request cut in pieces: on with it, in this pass's budget.
            let mut cut = s.partial.take();
            if cut.is_none() && !batch.is_empty() {
                // A panic here is the device's bug; `start` meets it again.
                let n = batch.len();
                let _ = catch_unwind(AssertUnwindSafe(|| s.dev.batch(n)));
            }
            let mut next = 0;
            loop {
                if let Some((orig, done)) = cut.take() {
                    worked += 1;
                    let mut d = orig;
                    // No stall on an asynchronous queue (see `start`).
                    let (_, progress) = process(
                        &mut sec,
                        &q,
                        att,
                        &mut s.dev,
                        &mut d,
                        &mut scratch,
                        false,
                        (done, budget - spent),
                    );
                    match progress {
                        Progress::More(upto) => {
                            s.partial = Some((orig, upto));
                            break;
                        }
                        Progress::Done => {
                            let n = if d.status == 0 { s.dev.work_of(&d) } else { 0 };
                            spent += n.saturating_sub(done).max(1);
                            out.push(d);
                        }
                    }
                }
                // Nothing more starts on memory that vanished: what is left
                // is failed with the queue.
                if next == batch.len() || spent >= budget || q.state() == QueueState::Broken {
                    break;
                }
                let orig = batch[next];
                next += 1;
                worked += 1;
                let token = *next_token;
                *next_token += 1;
                let mut d = orig;
                match start(&mut sec, &q, att, &mut s.dev, token, &mut d, &mut scratch) {
                    Started::Held => {
                        let tag = match att {
                            Attachment::Domain(x) => x.tag(),
                            Attachment::Blocked => 0,
                        };
                        s.held.insert(token, (seq, tag));
                        *held_seqs.entry(seq).or_default() += 1;
                        *held_tags.entry(tag).or_default() += 1;
                    }
                    Started::Done => {
                        let n = if d.status == 0 { s.dev.work_of(&d) } else { 0 };
                        spent += n.max(1);
                        out.push(d);
                    }
                    Started::Cut => cut = Some((orig, 0)),
                    Started::Later => {
                        // It and the rest wait, in order, for a later
                        // pass (the device's polls go on meanwhile).
                        next -= 1;
                        break;
                    }
                }
            }
            // What the budget did not reach waits for the next pass, in
            // order.
            if next < batch.len() {
                s.backlog.extend(batch.drain(next..));
            }
            // Pinned before the section ends: no sync may slip between.
            publish_pin(&mut sec, held_seqs, held_tags, (pinned, pinned_tags));
            drop(sec);
        }
        // Polled after this pass's requests went in, so a device that
        // gathers a batch (to run it side by side) completes it now.
        if !s.held.is_empty() {
            reported.clear();
            let before = out.len();
            let (r, vanished) =
                wd_sys::guard::guarded(|| catch_unwind(AssertUnwindSafe(|| s.dev.poll(reported))));
            if r.is_err() || vanished.is_some() {
                q.set_state(QueueState::Broken);
                // What this pass finished still completes, and what the
                // device reported (handed over: the teardown's abort no
                // longer has it), a fault where memory vanished under it.
                for (token, mut d) in reported.drain(..) {
                    if let Some((seq, tag)) = s.held.remove(&token) {
                        Self::unhold(held_seqs, seq);
                        Self::unhold(held_tags, tag);
                        if vanished.is_some() && d.status == 0 {
                            d.status = status::EFAULT;
                            d.result = 0;
                        }
                        out.push(d);
                    }
                }
                let _ = s.view.complete(out);
                return Err(());
            }
            for (token, d) in reported.drain(..) {
                // An unknown token is a device bug: nothing to complete.
                if let Some((seq, tag)) = s.held.remove(&token) {
                    Self::unhold(held_seqs, seq);
                    Self::unhold(held_tags, tag);
                    out.push(d);
                }
            }
            worked += out.len() - before;
        }
        q.in_flight.store(s.held.len() as u64, Ordering::Relaxed);
        if !out.is_empty() {
            let bytes: u64 = out
                .iter()
                .filter(|d| d.status == 0)
                .map(|d| s.dev.bytes_of(d))
                .sum();
            if s.view.complete(out).map_err(|_| ())? {
                let _ = wd_sys::wake(q.cq_event.as_fd());
            }
            q.requests.fetch_add(out.len() as u64, Ordering::Relaxed);
            q.bytes.fetch_add(bytes, Ordering::Relaxed);
        }
        if q.state() == QueueState::Broken {
            return Err(());
        }
        Ok(worked)
    }

    /// Look at queue `i`'s stalled requests whose domain resolved a stall:
    /// complete the aborted ones; the retried ones go back to the front of
    /// the queue's backlog, in order, to run again the way the rest of the
    /// queue's requests run (within the pass's budget, a long one in
    /// pieces): a retry run whole at once would hold every other queue of
    /// the engine as long as the whole request takes, seconds for a slow
    /// compression.
    ///
    /// A stall left in a domain the queue no longer translates through (it
    /// was attached to another) is one nobody can resolve: the client's
    /// resumes go to the domains of now. Its request, which changed
    /// nothing, runs again in the new attachment. (While the queue is
    /// blocked it waits: attached again to its domain, it may be resumed
    /// there.)
    fn serve_parked(&mut self, i: usize, batch: &mut Vec<Desc>) -> Result<usize, ()> {
        let s = &mut self.queues[i];
        let moved = |p: &Parked, att: &Attachment| matches!(att, Attachment::Domain(d) if !Arc::ptr_eq(d, &p.dom));
        let att = s.q.endpoint.attachment();
        if s.parked
            .iter()
            .all(|p| p.dom.resolution_generation() == p.seen && !moved(p, &att))
        {
            return Ok(0);
        }
        let mut retry = Vec::new();
        let mut j = 0;
        while j < s.parked.len() {
            let p = &mut s.parked[j];
            p.seen = p.dom.resolution_generation();
            match p.dom.take_resolution(p.stag) {
                None if moved(p, &att) => {
                    let p = s.parked.remove(j);
                    p.dom.cancel_stall(p.stag);
                    retry.push(p.desc);
                }
                None => j += 1,
                Some(r) => {
                    let p = s.parked.remove(j);
                    match r {
                        Resolution::Retry => retry.push(p.desc),
                        Resolution::Abort => {
                            let mut d = p.desc;
                            d.status = status::EFAULT;
                            d.result = 0;
                            batch.push(d);
                        }
                    }
                }
            }
        }
        let resolved = batch.len() + retry.len();
        for d in retry.into_iter().rev() {
            s.backlog.push_front(d);
        }
        let q = &s.q;
        q.requests.fetch_add(batch.len() as u64, Ordering::Relaxed);
        if s.view.complete(batch).map_err(|_| ())? {
            let _ = wd_sys::wake(q.cq_event.as_fd());
        }
        if q.state() == QueueState::Broken {
            return Err(());
        }
        Ok(resolved)
    }
}

/// Pin what the held requests use before `sec` ends, so that no sync slips
/// between: the oldest translation sequence, and the domains (given again
/// only when they changed).
fn publish_pin(
    sec: &mut Section<'_>,
    held_seqs: &BTreeMap<u64, u32>,
    held_tags: &BTreeMap<u64, u32>,
    (pinned, pinned_tags): (&mut Option<u64>, &mut Option<Vec<u64>>),
) {
    if !same_tags(held_tags, pinned_tags) {
        let tags = pin_tags(held_tags);
        sec.pin_tags(tags.clone());
        *pinned_tags = tags;
    }
    let oldest = held_seqs.keys().next().copied();
    sec.pin(oldest);
    *pinned = oldest;
}

/// Whether `pinned` is what [`pin_tags`] makes of `held_tags`, without
/// making it (every pass asks; the answer changes rarely).
fn same_tags(held_tags: &BTreeMap<u64, u32>, pinned: &Option<Vec<u64>>) -> bool {
    match pinned {
        None => held_tags.contains_key(&0),
        Some(v) => !held_tags.contains_key(&0) && held_tags.keys().eq(v.iter()),
    }
}

/// The domains the held requests were translated through, for the IOTLB's
/// pin (None: one is not known, any domain may be held).
fn pin_tags(held_tags: &BTreeMap<u64, u32>) -> Option<Vec<u64>> {
    (!held_tags.contains_key(&0)).then(|| held_tags.keys().copied().collect())
}

/// Run a piece of one request, `(done, budget)`, through the device inside
/// `sec`. A request that faulted (completed with -EFAULT) in a domain with
/// the stall policy is not completed: it comes back as a [`Parked`] (its
/// `desc` to be filled in), and a retry starts it over.
#[allow(clippy::too_many_arguments)]
fn process(
    sec: &mut Section<'_>,
    q: &Queue,
    att: &Attachment,
    dev: &mut Box<dyn DeviceQueue>,
    d: &mut Desc,
    scratch: &mut Scratch<'_>,
    stallable: bool,
    (done, budget): (u64, u64),
) -> (Option<Parked>, Progress) {
    let dom = match att {
        Attachment::Domain(x) => Some(&**x),
        Attachment::Blocked => None,
    };
    let mut fault = None;
    let mut dma = QueueDma {
        q,
        dom,
        sec,
        runs_a: scratch.runs_a,
        runs_b: scratch.runs_b,
        bounce: scratch.bounce,
        fault: &mut fault,
    };
    let progress = catch_unwind(AssertUnwindSafe(|| {
        dev.process_part(d, &mut dma, done, budget)
    }));
    let vanished = scratch.guard.take_fault();
    let mut progress = match progress {
        Ok(p) => p,
        Err(_) => {
            d.status = status::EIO;
            d.result = 0;
            Progress::Done
        }
    };
    let mut stallable = stallable;
    if let Some(addr) = vanished {
        // Client memory vanished under the device (a hole punched in a
        // hugetlb memfd the pool cannot fill again): the guard replaced the
        // page with zeros, so the host's mapping is no longer the client's
        // memory and nothing more is served on this queue (`serve` sees the
        // state). SIGBUS does not tell reads from writes.
        d.status = status::EFAULT;
        d.result = 0;
        progress = Progress::Done;
        stallable = false;
        q.set_state(QueueState::Broken);
        if let Some(iova) = q.iova_of_host(addr) {
            fault.get_or_insert(Fault {
                iova,
                pasid: q.id,
                access: Access::Read,
                reason: FaultReason::Unmapped,
            });
        }
    }
    let Some(f) = fault else {
        return (None, progress);
    };
    q.fault_count.fetch_add(1, Ordering::Relaxed);
    let fdom = match att {
        Attachment::Domain(x) => x.clone(),
        Attachment::Blocked => q.domain().clone(),
    };
    let parked = match fdom.report_fault(f, stallable && d.status == status::EFAULT) {
        FaultOutcome::Aborted { .. } => None,
        FaultOutcome::Stalled { stag } => Some(Parked {
            stag,
            seen: fdom.resolution_generation(),
            dom: fdom,
            desc: *d,
        }),
    };
    (parked, progress)
}

/// Start one request on an asynchronous device inside `sec`. Faults are
/// recorded and abort the request (no stall: the device decides at once
/// whether it can hold the memory).
fn start(
    sec: &mut Section<'_>,
    q: &Queue,
    att: &Attachment,
    dev: &mut Box<dyn DeviceQueue>,
    token: u64,
    d: &mut Desc,
    scratch: &mut Scratch<'_>,
) -> Started {
    let dom = match att {
        Attachment::Domain(x) => Some(&**x),
        Attachment::Blocked => None,
    };
    let mut fault = None;
    let mut dma = QueueDma {
        q,
        dom,
        sec,
        runs_a: scratch.runs_a,
        runs_b: scratch.runs_b,
        bounce: scratch.bounce,
        fault: &mut fault,
    };
    let r = catch_unwind(AssertUnwindSafe(|| dev.start(token, d, &mut dma)));
    let vanished = scratch.guard.take_fault();
    let started = r.unwrap_or_else(|_| {
        d.status = status::EIO;
        d.result = 0;
        Started::Done
    });
    if vanished.is_some() {
        // As in `process`: the memory is no longer the client's.
        q.set_state(QueueState::Broken);
        if started == Started::Done {
            d.status = status::EFAULT;
            d.result = 0;
        }
    }
    if let Some(f) = fault {
        q.fault_count.fetch_add(1, Ordering::Relaxed);
        let fdom = match att {
            Attachment::Domain(x) => x.clone(),
            Attachment::Blocked => q.domain().clone(),
        };
        let _ = fdom.report_fault(f, false);
    }
    started
}

/// Fail what a queue the engine stops serving had taken (`stopped`: what
/// its device held), where its ring still takes completions. Its stalls
/// go back to their domain, which other queues may share (a virtio-iommu
/// domain counts them against its limit).
fn fail_taken(s: &mut Served, stopped: Vec<Desc>) {
    // What the device stopped comes with its own status (finished ones
    // with their outcome); the rest never ran to its end.
    let mut left: Vec<Desc> = stopped;
    for p in s.parked.drain(..) {
        p.dom.cancel_stall(p.stag);
        left.push(cancelled(p.desc));
    }
    left.extend(s.partial.take().map(|p| cancelled(p.0)));
    left.extend(s.backlog.drain(..).map(cancelled));
    let _ = s.view.complete(&left);
}

/// Fail whatever is still queued on a ring being torn down (stalled
/// requests included), then mark it stopped.
fn cancel_pending(s: &mut Served, stopped: Vec<Desc>) {
    fail_taken(s, stopped);
    // What the client had queued: one ring's worth at most. A client that
    // keeps submitting (and reaping) on the ring it still has mapped must
    // not keep the engine here, away from its other queues.
    s.view.set_host_state(HostState::Stopped);
    let mut budget = s.view.layout().depth() as usize;
    let mut left = Vec::new();
    while budget > 0 {
        match s.view.fetch(BATCH.min(budget), &mut left) {
            Ok(n) if n > 0 => budget -= n,
            _ => break,
        }
        for d in left.iter_mut() {
            *d = cancelled(*d);
        }
        if s.view.complete(&left).is_err() {
            break;
        }
        left.clear();
    }
    let _ = wd_sys::wake(s.q.cq_event.as_fd());
}

/// Device memory of one request, through the queue's attachment and the
/// engine's IOTLB (and, for SHARE_ALL queues, through the client process
/// for addresses not shared). The first fault is kept for the stall policy.
struct QueueDma<'a, 's> {
    q: &'a Queue,
    /// None: the endpoint is blocked (virtio-iommu, no domain, no bypass).
    dom: Option<&'a Domain>,
    sec: &'a mut Section<'s>,
    runs_a: &'a mut Vec<(u64, u64)>,
    runs_b: &'a mut Vec<(u64, u64)>,
    bounce: &'a mut Vec<u8>,
    fault: &'a mut Option<Fault>,
}

/// Translate through `dom` (blocked: a "no domain" fault).
#[allow(clippy::too_many_arguments)]
fn translate(
    sec: &mut Section<'_>,
    dom: Option<&Domain>,
    pasid: u32,
    iova: u64,
    len: u64,
    access: Access,
    runs: &mut Vec<(u64, u64)>,
) -> Result<(), Fault> {
    match dom {
        Some(d) => sec.translate_range(d, pasid, iova, len, access, runs),
        None => {
            runs.clear();
            if len == 0 {
                return Ok(());
            }
            Err(Fault {
                iova,
                pasid,
                access,
                reason: FaultReason::NoDomain,
            })
        }
    }
}

/// The queue's attachment for a section just entered: the one kept from an
/// earlier pass unless the endpoint's generation moved since (an attach
/// bumps it before its sync, which waits for sections that began earlier).
fn kept_attachment<'s>(kept: &'s mut Option<(u64, Attachment)>, ep: &Endpoint) -> &'s Attachment {
    let g = ep.generation();
    if !matches!(kept, Some((k, _)) if *k == g) {
        *kept = Some((g, ep.attachment()));
    }
    &kept.as_ref().expect("set above").1
}

/// Largest bounce copy through the client's memory descriptor at once.
const BOUNCE_CHUNK: usize = 1 << 20;

impl<'a> QueueDma<'a, '_> {
    fn fault(&mut self, f: Fault) -> Fault {
        self.fault.get_or_insert(f);
        f
    }

    fn pid_fault(&mut self, iova: u64, access: Access) -> Fault {
        self.fault(Fault {
            iova,
            pasid: self.q.id,
            access,
            reason: FaultReason::Unmapped,
        })
    }

    /// The client's own memory (SHARE_ALL), for an access its domain
    /// did not map; never for one the domain refused (mapped without that
    /// permission, a blocked endpoint): the client granted no more.
    fn share_all(&self, f: &Fault) -> Option<&'a ProcessMemory> {
        // Only the queue's own domain names client addresses: a
        // virtio-iommu domain's IOVAs are device addresses, and what it
        // does not map is a fault there.
        let own = self
            .dom
            .is_some_and(|d| std::ptr::eq(d, &**self.q.domain()));
        match &self.q.model {
            MemModel::ShareAll(mem) if own && f.reason == FaultReason::Unmapped => Some(mem),
            _ => None,
        }
    }

    /// The result of an access through the client's own memory
    /// descriptor. Once the image it was bound to is gone (the client
    /// exec'd, perhaps a setuid program), the queue is stopped: no later
    /// request may reach whatever runs there now.
    fn client_access(
        &mut self,
        r: Result<(), AccessError>,
        iova: u64,
        access: Access,
    ) -> Result<(), Fault> {
        match r {
            Ok(()) => Ok(()),
            Err(AccessError::ImageGone) => {
                self.q.set_state(QueueState::Broken);
                Err(self.pid_fault(iova, access))
            }
            Err(AccessError::Fault { .. }) => Err(self.pid_fault(iova, access)),
        }
    }
}

impl QueueDma<'_, '_> {
    /// `[iova, iova + len)` through the queue's domain into `runs_a`.
    fn translate_a(&mut self, iova: u64, len: u64, access: Access) -> Result<(), Fault> {
        translate(
            self.sec,
            self.dom,
            self.q.id,
            iova,
            len,
            access,
            self.runs_a,
        )
    }
}

impl<'a> Dma<'a> for QueueDma<'a, '_> {
    fn section(&self) -> u64 {
        self.sec.seq()
    }

    fn probe(&mut self, iova: u64, len: u64, access: Access) -> Result<(), Fault> {
        if len == 0 {
            return Ok(());
        }
        match self.translate_a(iova, len, access) {
            Ok(()) => Ok(()),
            // SHARE_ALL memory is reached through the client's own memory
            // descriptor, page by page as it is used: nothing to check
            // beforehand.
            Err(f) if self.share_all(&f).is_some() => Ok(()),
            Err(f) => Err(self.fault(f)),
        }
    }

    fn hold(&mut self, iova: u64, len: u64, access: Access) -> Option<HeldSlice> {
        self.translate_a(iova, len, access)
            .ok()
            .filter(|_| self.runs_a.len() == 1)
            // SAFETY: translated just now inside the section; `serve_async`
            // pins this section's translations before it ends and keeps the
            // pin until the device reports the request, so the mapping stays
            // (an unshare's sync waits for the pin).
            .map(|_| unsafe {
                HeldSlice::from_host_addr(self.runs_a[0].0, self.runs_a[0].1 as usize)
            })
    }

    fn slice(&mut self, iova: u64, len: u64, access: Access) -> Option<DeviceSlice<'a>> {
        // A fault here is not recorded: the caller falls back to read/write,
        // which records it.
        self.translate_a(iova, len, access)
            .ok()
            .filter(|_| self.runs_a.len() == 1)
            // SAFETY: translated just now inside the section this QueueDma
            // borrows for 'a (see `run_slice`).
            .map(|_| unsafe { run_slice(self.runs_a[0]) })
    }

    fn copy(&mut self, dst: u64, src: u64, len: u64) -> Result<(), Fault> {
        if len == 0 {
            return Ok(());
        }
        let a = translate(
            self.sec,
            self.dom,
            self.q.id,
            src,
            len,
            Access::Read,
            self.runs_a,
        );
        let b = translate(
            self.sec,
            self.dom,
            self.q.id,
            dst,
            len,
            Access::Write,
            self.runs_b,
        );
        match (a, b) {
            (Ok(()), Ok(())) => {
                // SAFETY: both run lists were translated just now, inside
                // the section this QueueDma borrows.
                unsafe { copy_runs(self.runs_b, self.runs_a) };
                Ok(())
            }
            (a, b) => {
                let refused = [a.err(), b.err()]
                    .into_iter()
                    .flatten()
                    .find(|f| self.share_all(f).is_none());
                if let Some(f) = refused {
                    return Err(self.fault(f));
                }
                // SHARE_ALL: the client's whole address space, reached
                // through its own memory descriptor (the analogue of an
                // I/O page fault).
                // Chunks that together move bytes as one overlapping copy
                // (memmove) would.
                let mut done = 0u64;
                while done < len {
                    let n = (len - done).min(BOUNCE_CHUNK as u64);
                    let at = wd_device::copy_piece_at(src, dst, len, done, n);
                    let mut buf = std::mem::take(self.bounce);
                    buf.resize(n as usize, 0);
                    let r = self
                        .read(src + at, &mut buf)
                        .and_then(|_| self.write(dst + at, &buf));
                    *self.bounce = buf;
                    r?;
                    done += n;
                }
                Ok(())
            }
        }
    }

    fn read(&mut self, src: u64, buf: &mut [u8]) -> Result<(), Fault> {
        let len = buf.len() as u64;
        match translate(
            self.sec,
            self.dom,
            self.q.id,
            src,
            len,
            Access::Read,
            self.runs_a,
        ) {
            Ok(()) => {
                let mut off = 0usize;
                for &run in self.runs_a.iter() {
                    // SAFETY: translated just now inside our section.
                    let m = unsafe { run_slice(run) };
                    m.read_into(0, &mut buf[off..off + m.len()]);
                    off += m.len();
                }
                Ok(())
            }
            Err(f) => match self.share_all(&f) {
                Some(mem) => {
                    let r = mem.read(src, buf);
                    self.client_access(r, src, Access::Read)
                }
                None => Err(self.fault(f)),
            },
        }
    }

    fn write(&mut self, dst: u64, data: &[u8]) -> Result<(), Fault> {
        let len = data.len() as u64;
        match translate(
            self.sec,
            self.dom,
            self.q.id,
            dst,
            len,
            Access::Write,
            self.runs_b,
        ) {
            Ok(()) => {
                let mut off = 0usize;
                for &run in self.runs_b.iter() {
                    // SAFETY: translated just now inside our section, with
                    // write permission checked by the translation.
                    let m = unsafe { run_slice(run) };
                    m.write_from(0, &data[off..off + m.len()]);
                    off += m.len();
                }
                Ok(())
            }
            Err(f) => match self.share_all(&f) {
                Some(mem) => {
                    let r = mem.write(dst, data);
                    self.client_access(r, dst, Access::Write)
                }
                None => Err(self.fault(f)),
            },
        }
    }
}

/// One translated run (host address, length) as device memory.
///
/// # Safety
/// The run must come from a translation made inside an engine section that
/// outlives `'a`: the domain maps only live host mappings of shared memory,
/// and a mapping is released only after an invalidation whose sync waits
/// for that section to end.
unsafe fn run_slice<'a>((addr, len): (u64, u64)) -> DeviceSlice<'a> {
    // SAFETY: the caller's contract is DeviceSlice::from_host_addr's.
    unsafe { DeviceSlice::from_host_addr(addr, len as usize) }
}

/// Copy between two run lists describing equally long byte ranges, as
/// one overlapping copy (memmove) would.
///
/// # Safety
/// As [`run_slice`], for every run of both lists.
unsafe fn copy_runs(dst: &[(u64, u64)], src: &[(u64, u64)]) {
    // (One run each, the common case: `copy_to` moves it as memmove.)
    let span = |runs: &[(u64, u64)]| {
        runs.iter().fold((u64::MAX, 0), |(lo, hi), &(a, n)| {
            (lo.min(a), hi.max(a + n))
        })
    };
    let scattered_overlap = src.len() + dst.len() > 2 && {
        let ((s_lo, s_hi), (d_lo, d_hi)) = (span(src), span(dst));
        d_lo < s_hi && s_lo < d_hi
    };
    if scattered_overlap {
        // Scattered runs that overlap: piece by piece, one piece could
        // overwrite the source of a later one. The bytes go through a
        // buffer (a rare request: a client copying within its memory
        // across separately shared ranges).
        let total: u64 = src.iter().map(|r| r.1).sum();
        let mut tmp = vec![0u8; total as usize];
        let mut at = 0usize;
        for &run in src {
            // SAFETY: the caller's contract.
            unsafe { run_slice(run) }.read_into(0, &mut tmp[at..at + run.1 as usize]);
            at += run.1 as usize;
        }
        at = 0;
        for &run in dst {
            // SAFETY: the caller's contract.
            unsafe { run_slice(run) }.write_from(0, &tmp[at..at + run.1 as usize]);
            at += run.1 as usize;
        }
        return;
    }
    let (mut i, mut j) = (0usize, 0usize);
    let (mut si, mut dj) = (0u64, 0u64);
    while i < src.len() && j < dst.len() {
        let n = (src[i].1 - si).min(dst[j].1 - dj);
        // SAFETY: the caller's contract; copy_to tolerates the overlap a
        // client may ask for.
        let (s, d) = unsafe { (run_slice(src[i]), run_slice(dst[j])) };
        s.subslice(si as usize, n as usize)
            .copy_to(&d.subslice(dj as usize, n as usize));
        si += n;
        dj += n;
        if si == src[i].1 {
            i += 1;
            si = 0;
        }
        if dj == dst[j].1 {
            j += 1;
            dj = 0;
        }
    }
}

/// Device memory of a legacy (socket) request: reads come from the request
/// payload at addresses 0..len, writes go to the reply payload.
pub struct LegacyDma<'a> {
    /// Request payload.
    pub input: &'a [u8],
    /// Reply payload (grows as the device writes, bounded).
    pub output: Vec<u8>,
    /// Queue id, for fault records.
    pub pasid: u32,
}

impl LegacyDma<'_> {
    fn bad(&self, iova: u64, access: Access) -> Fault {
        Fault {
            iova,
            pasid: self.pasid,
            access,
            reason: FaultReason::OutOfRange,
        }
    }
}

impl Dma<'_> for LegacyDma<'_> {
    fn probe(&mut self, iova: u64, len: u64, access: Access) -> Result<(), Fault> {
        let limit = match access {
            Access::Write => wd_proto::limits::MAX_PAYLOAD as u64,
            _ => self.input.len() as u64,
        };
        match iova.checked_add(len) {
            Some(e) if e <= limit => Ok(()),
            _ => Err(self.bad(iova, access)),
        }
    }

    fn copy(&mut self, dst: u64, src: u64, len: u64) -> Result<(), Fault> {
        let end = src
            .checked_add(len)
            .filter(|&e| e <= self.input.len() as u64);
        let Some(end) = end else {
            return Err(self.bad(src, Access::Read));
        };
        let input = self.input;
        self.write(dst, &input[src as usize..end as usize])
    }

    fn read(&mut self, src: u64, buf: &mut [u8]) -> Result<(), Fault> {
        match src.checked_add(buf.len() as u64) {
            Some(e) if e <= self.input.len() as u64 => {
                buf.copy_from_slice(&self.input[src as usize..e as usize]);
                Ok(())
            }
            _ => Err(self.bad(src, Access::Read)),
        }
    }

    fn write(&mut self, dst: u64, data: &[u8]) -> Result<(), Fault> {
        match dst.checked_add(data.len() as u64) {
            Some(e) if e <= wd_proto::limits::MAX_PAYLOAD as u64 => {
                if self.output.len() < e as usize {
                    self.output.resize(e as usize, 0);
                }
                self.output[dst as usize..e as usize].copy_from_slice(data);
                Ok(())
            }
            _ => Err(self.bad(dst, Access::Write)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs that overlap, scattered: the bytes move as one memmove would
    /// (piece by piece, the second piece read what the first overwrote).
    #[test]
    fn copy_runs_moves_overlapping_runs_as_memmove() {
        let mut buf: Vec<u8> = (0..64u8).collect();
        let mut want = buf.clone();
        want.copy_within(0..40, 8);
        let b = buf.as_mut_ptr() as u64;
        // SAFETY: both lists cover the live local buffer.
        unsafe { copy_runs(&[(b + 8, 20), (b + 28, 20)], &[(b, 10), (b + 10, 30)]) };
        assert_eq!(buf, want);
    }

    #[test]
    fn copy_runs_splits_across_pages() {
        let src: Vec<u8> = (0..64u8).collect();
        let mut dst = vec![0u8; 64];
        let s = src.as_ptr() as u64;
        let d = dst.as_mut_ptr() as u64;
        // SAFETY: both lists cover the two live local buffers.
        unsafe { copy_runs(&[(d, 10), (d + 10, 54)], &[(s, 30), (s + 30, 34)]) };
        assert_eq!(src, dst);
    }

    #[test]
    fn legacy_bounds() {
        let input = [1u8, 2, 3, 4];
        let mut l = LegacyDma {
            input: &input,
            output: Vec::new(),
            pasid: 1,
        };
        l.copy(2, 0, 4).unwrap();
        assert_eq!(l.output, [0, 0, 1, 2, 3, 4]);
        assert!(l.copy(0, 1, 4).is_err());
        assert!(l.copy(0, u64::MAX, 2).is_err());
        assert!(l.write(u64::MAX - 1, &[1, 2]).is_err());
    }
}
