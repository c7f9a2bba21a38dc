//! A queue: the rings shared with an engine, and the calls on them.
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use wd_proto::{FaultEvent, Message, Status};
use wd_ring::{Desc, HostState, RingView};
use wd_sys::process_mem::ProcessMemory;
use wd_sys::Mapping;

use crate::{fork_generation, forked_error, unexpected, Capability, ClientError, HostConn, Result};
use wd_iommu::{FaultPolicy, InvalidationMode};

/// Descriptors moved per ring operation.
const SCRATCH: usize = 32;
/// Spin iterations between two reads of the clock while waiting.
const SPIN_CLOCK_EVERY: u32 = 32;
/// How long a waiter polls the ring before it sleeps.
const SPIN: Duration = Duration::from_micros(50);
/// How often an idle non-blocking `recv` checks that the host lives.
const LIVENESS_INTERVAL: Duration = Duration::from_millis(10);
/// Slice of a blocking wait between liveness checks.
const WAIT_SLICE: Duration = Duration::from_millis(200);
/// One request in about this many has its latency measured for the ring's
/// histogram (`wd top`): two clock reads per sample, not per request.
const LATENCY_SAMPLE_EVERY: u32 = 64;

/// A completed request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The cookie given to `send`.
    pub cookie: u64,
    /// The completed descriptor (status, result, device fields).
    pub desc: Desc,
}

/// What the client did on a queue (for benchmarks and tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Requests sent.
    pub sent: u64,
    /// Completions received.
    pub received: u64,
    /// Doorbell system calls (engine was asleep).
    pub doorbells: u64,
    /// Times the client slept waiting for a completion.
    pub sleeps: u64,
}

/// Faults the host recorded on a queue.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultReport {
    /// Faults ever recorded.
    pub total: u64,
    /// Faults dropped because the log was full.
    pub lost: u64,
    /// The oldest unread events.
    pub events: Vec<FaultEvent>,
}

/// Cookies [`Queue::call`] keeps for itself: the top 2^32 (above any
/// user-space address, which C callers give as cookies). A call's cookie
/// comes back only after 2^32 more calls, so the completion of one
/// abandoned in flight is never taken for a later call's (with 2^16 it
/// could be, after 65,536 calls).
pub const CALL_COOKIES: u64 = 1 << 32;

/// How a queue lived through restarts of its host.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecoveryStats {
    /// Times the queue was made again on a restarted host.
    pub reconnects: u64,
    /// Requests in flight at a restart that were sent again.
    pub redone: u64,
    /// Requests in flight at a restart that completed with
    /// [`crate::STATUS_RESTARTED`] (not safe to send again).
    pub failed: u64,
}

/// A share made with [`Queue::share`] or [`Queue::share_buffer`], with
/// what it takes to make it again on a restarted host.
#[derive(Debug)]
struct Share {
    iova: u64,
    size: u64,
    /// The memory's descriptor for a heap buffer (allocator memory is found
    /// again by address).
    fd: Option<(OwnedFd, u64)>,
    /// It pinned its allocation (see `crate::buf::pin`): unpinned when the
    /// device can no longer reach it.
    pinned: bool,
}

/// A queue to a device engine.
pub struct Queue {
    host: Arc<HostConn>,
    /// The connection epoch the queue was made under (a newer one means
    /// its host is gone).
    epoch: u64,
    /// What was asked for, to ask again after a restart.
    capa: crate::Capability,
    id: u32,
    device: String,
    device_api: u32,
    alg: String,
    flags: u32,
    generation: u64,
    view: RingView,
    /// Shared with the register block of a register-driven device
    /// ([`Queue::registers`]), which keeps it mapped while it lives.
    ring: Option<Arc<Mapping>>,
    /// The host's wake lines (`wd_sys::wake_line`): the doorbell rings
    /// the engine, the completion line wakes this queue's waiter.
    doorbell: OwnedFd,
    cq_event: OwnedFd,
    socket: OwnedFd,
    /// Readable when [`Queue::kick_wait`] made the wait descriptor
    /// readable itself (nothing can be sent to this end of the completion
    /// line from here). Made with the wait set; `kicked` while it may be.
    kick: Option<OwnedFd>,
    kicked: bool,
    /// Waiters with no request of their own holding the wait descriptor
    /// readable ([`Queue::hold_wait_readable`]): the kick is not drained
    /// while there are any.
    kick_held: u32,
    /// Readable when a completion is signalled or the host hangs up
    /// (made on first use of [`Queue::wait_fd`]).
    wait_set: Option<OwnedFd>,
    /// Cookie per in-flight tag slot.
    slots: Vec<Option<u64>>,
    /// The descriptor sent in each slot (to send again after a restart).
    sent: Vec<Desc>,
    /// Which in-flight requests may be sent again after a restart.
    redo: Option<fn(&Desc) -> bool>,
    recovery: RecoveryStats,
    /// The IOMMU policy set, to set again after a restart.
    iommu_policy: Option<(InvalidationMode, FaultPolicy)>,
    free_slots: Vec<u32>,
    /// Completions taken off the ring and not yet handed out: legacy
    /// replies, other requests' completions met by `call` or
    /// `recv_cookie`. The one stash of the client side.
    stash: VecDeque<Completion>,
    /// Cookies whose completions nobody waits for: dropped when reaped.
    forgotten: std::collections::HashSet<u64>,
    /// Descriptors being submitted or reaped (allocated once, so the hot
    /// path neither allocates nor clears memory).
    scratch: Vec<Desc>,
    shares: Vec<Share>,
    stats: QueueStats,
    last_liveness: Instant,
    /// The request whose latency is being measured: its tag slot and when
    /// it was sent (one at a time).
    latency_sample: Option<(u32, Instant)>,
    /// Requests to send before the next one is measured.
    latency_countdown: u32,
    /// When the histogram last aged (halved per second since).
    latency_aged: Instant,
    /// Empty non-blocking receives (the liveness check reads the clock
    /// only every `SPIN_CLOCK_EVERY` of them).
    empty_polls: u32,
    /// Whether an event loop's wait announcement (`arm_wait`) is up.
    wait_armed: bool,
    /// An event loop relies on the wait descriptor: it announced a wait
    /// or was kicked, and has not withdrawn (`disarm_wait`).
    loop_waiting: bool,
    /// A wait for one request took the loop's announcement over (and
    /// drained the signal): handed back once that request's completion is
    /// found (see `hand_back_wait`).
    arm_taken: bool,
    /// Whether the completion line (or the kick) may hold a signal (the
    /// host took an announcement, or `kick_wait` wrote): only then is it read, and only
    /// when it holds none is it written, so an event loop that resumes
    /// many waiters after one wake-up pays one system call, not one each.
    wait_signalled: bool,
    released: bool,
    /// The restarted host refused part of this queue's memory or its
    /// IOMMU policy: nothing more is sent through it (requests would
    /// fault or run under another policy), and this says why.
    unrestored: Option<String>,
    /// Calls made ([`Queue::call`]): each has a cookie of its own.
    calls: u64,
    /// How this queue's requests travel through the socket (legacy path):
    /// given by whoever speaks the device's message format.
    legacy_planner: Option<wd_msg::LegacyPlanner>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("id", &self.id)
            .field("device", &self.device)
            .field("alg", &self.alg)
            .finish()
    }
}

impl Queue {
    pub(crate) fn request(host: Arc<HostConn>, capa: &Capability) -> Result<Queue> {
        if capa.numa_node < -1 {
            return Err(ClientError::new(
                Status::Invalid,
                format!(
                    "numa_node {} is neither a node nor -1 (any)",
                    capa.numa_node
                ),
            ));
        }
        let (mut probe_addr, mut probe_value) = (0u64, 0u64);
        let mut mem_fd = None;
        // Probe word for SHARE_ALL: the host proves the memory descriptor
        // we send is ours by reading it there. One per request (a word
        // shared by the process was overwritten by another thread's
        // request before the host read it: refused).
        let probe = std::sync::atomic::AtomicU64::new(0);
        if capa.flags & crate::CAPA_SHARE_ALL != 0 {
            // The host reaches our memory only through a descriptor we
            // open ourselves: the kernel checks our right, not the host's,
            // and the descriptor dies with this image (an exec ends it).
            mem_fd = Some(wd_sys::process_mem::open_self_mem().map_err(|e| {
                ClientError::new(
                    Status::Unsupported,
                    format!("WD_CAPA_SHARE_ALL needs /proc/self/mem: {e}"),
                )
            })?);
            probe_addr = &probe as *const _ as u64;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            probe_value = 0x5744_5052_4f42_4500
                ^ (wd_sys::getpid() as u64)
                ^ now
                ^ probe_addr.rotate_left(17);
            probe.store(probe_value, std::sync::atomic::Ordering::SeqCst);
        }
        let fds: Vec<_> = mem_fd.iter().map(|f| f.as_fd()).collect();
        let granted = host.call_stamped(
            &Message::RequestQueue {
                alg: capa.alg.clone(),
                flags: capa.flags,
                depth: capa.depth,
                numa_node: capa.numa_node,
                probe_addr,
                probe_value,
            },
            &fds,
        );
        // Read by the host during the call: alive (and its store kept)
        // until the answer came.
        std::hint::black_box(&probe);
        let (reply, mut fds, epoch) = granted?;
        let Message::QueueGranted {
            queue_id,
            device,
            device_api,
            depth,
            ring_bytes,
            flags,
            ..
        } = reply
        else {
            return Err(unexpected(&reply));
        };
        if fds.len() != 3 {
            return Err(ClientError::new(
                Status::Protocol,
                "queue grant without its three descriptors",
            ));
        }
        let cq_event = fds.pop().expect("three fds");
        let doorbell = fds.pop().expect("three fds");
        let ring_fd = fds.pop().expect("three fds");
        // A ring the host could shrink under us would kill this process
        // (SIGBUS) at its next touch: sealed, and as long as granted.
        let sealed = wd_sys::get_seals(ring_fd.as_fd()).is_ok_and(|s| s & wd_sys::SEAL_SHRINK != 0);
        let size = wd_sys::file_size(ring_fd.as_fd()).unwrap_or(0);
        if !sealed || size < ring_bytes {
            return Err(ClientError::new(
                Status::Protocol,
                format!(
                    "the ring from the host is not sealed against shrinking or is short ({size} of {ring_bytes} bytes)"
                ),
            ));
        }
        let ring = Mapping::map_shared(ring_fd.as_fd(), 0, ring_bytes as usize)?;
        // The ring is this process's: a forked child does not get it.
        ring.dont_fork()?;
        // SAFETY: `ring` is a live page-aligned mapping of ring_bytes, kept in
        // the Queue next to the view and dropped after it (see Drop).
        let view = unsafe { RingView::attach(ring.as_ptr(), ring.len(), depth) }.map_err(|e| {
            ClientError::new(Status::Protocol, format!("ring from host is invalid: {e}"))
        })?;
        let socket = host.socket_dup()?;
        Ok(Queue {
            epoch,
            capa: crate::Capability {
                depth,
                ..capa.clone()
            },
            host,
            id: queue_id,
            device,
            device_api,
            alg: capa.alg.clone(),
            flags,
            generation: fork_generation(),
            view,
            ring: Some(Arc::new(ring)),
            doorbell,
            cq_event,
            socket,
            kick: None,
            kicked: false,
            kick_held: 0,
            wait_set: None,
            slots: vec![None; depth as usize],
            sent: vec![Desc::default(); depth as usize],
            redo: None,
            recovery: RecoveryStats::default(),
            iommu_policy: None,
            free_slots: (0..depth).rev().collect(),
            stash: VecDeque::new(),
            forgotten: std::collections::HashSet::new(),
            scratch: vec![Desc::default(); SCRATCH],
            shares: Vec::new(),
            stats: QueueStats::default(),
            last_liveness: Instant::now(),
            empty_polls: 0,
            wait_armed: false,
            loop_waiting: false,
            arm_taken: false,
            wait_signalled: false,
            released: false,
            unrestored: None,
            calls: 0,
            latency_sample: None,
            latency_countdown: LATENCY_SAMPLE_EVERY,
            latency_aged: Instant::now(),
            legacy_planner: None,
        })
    }

    /// Host-wide queue id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Device serving the queue (`dev<N>`).
    pub fn device(&self) -> &str {
        &self.device
    }

    /// Message-format version of the device.
    pub fn device_api(&self) -> u32 {
        self.device_api
    }

    /// Algorithm.
    pub fn alg(&self) -> &str {
        &self.alg
    }

    /// Granted capability flags.
    pub fn flags(&self) -> u32 {
        self.flags
    }

    /// Say how requests on this queue travel through the socket (a
    /// `WD_CAPA_ALLOW_LEGACY` queue): which client ranges a request reads
    /// and writes is the message format's knowledge, so the code that
    /// speaks the format (e.g. `wd_dummy_msg::legacy_plan`) hands it over.
    /// A legacy queue without one refuses sends.
    pub fn set_legacy_planner(&mut self, planner: wd_msg::LegacyPlanner) {
        self.legacy_planner = Some(planner);
    }

    /// Ring depth (most requests in flight).
    pub fn depth(&self) -> u32 {
        self.slots.len() as u32
    }

    /// Requests sent and not yet received.
    pub fn in_flight(&self) -> u32 {
        self.depth() - self.free_slots.len() as u32
    }

    /// Client-side counters.
    pub fn stats(&self) -> QueueStats {
        self.stats
    }

    fn check(&self) -> Result<()> {
        if self.generation != fork_generation() {
            return Err(forked_error());
        }
        if self.released {
            return Err(ClientError::new(Status::BadState, "queue was released"));
        }
        Ok(())
    }

    /// [`Queue::check`], and that the queue still has what it was given:
    /// for what sends requests or adds memory.
    fn check_usable(&self) -> Result<()> {
        self.check()?;
        // Made under an older connection (another caller connected again:
        // the host restarted, or stopped answering): its id means nothing
        // on the new one, so it is gone, and made again by `retry`.
        if self.host.epoch() != self.epoch {
            return Err(ClientError::new(
                Status::HostGone,
                "the connection this queue was made on is gone",
            ));
        }
        match &self.unrestored {
            // Gone again: made again on the next host, which may take it
            // all (`retry` remakes it on HostGone).
            Some(_) if self.host_lost() => Err(ClientError::new(
                Status::HostGone,
                "the host serving this queue is gone",
            )),
            Some(why) => Err(ClientError::new(
                Status::BadState,
                format!("this queue was made again on a restarted host that refused {why}: release it and ask for another"),
            )),
            None => Ok(()),
        }
    }

    fn ring_state_error(&self) -> Option<ClientError> {
        match self.view.host_state() {
            HostState::Alive => None,
            HostState::Stopped => Some(ClientError::new(
                Status::HostGone,
                "the host stopped serving this queue",
            )),
            HostState::Broken => Some(ClientError::new(
                Status::BadState,
                "the host stopped serving this queue: its ring was corrupt, or memory it shared vanished (see its faults)",
            )),
        }
    }

    fn legacy(&self) -> bool {
        self.flags & crate::CAPA_ALLOW_LEGACY != 0
    }

    /// Send up to `reqs.len()` requests (descriptor, cookie) without
    /// blocking; returns how many were queued (0 when the queue is full).
    /// The descriptors' tags are the library's; the cookie comes back.
    pub fn send_batch(&mut self, reqs: &[(Desc, u64)]) -> Result<usize> {
        match self.send_batch_once(reqs) {
            Err(e) if e.status() == Status::HostGone => {
                self.recover(e)?;
                if self.redo.is_none() {
                    // The requests may name state the old host held (a
                    // session): the caller decides what to send now.
                    return Err(ClientError::new(
                        Status::HostGone,
                        "the host restarted and this queue was made again; the requests were not sent (host-side state such as sessions is gone)",
                    ));
                }
                self.retry(|q| q.send_batch_once(reqs))
            }
            r => r,
        }
    }

    fn send_batch_once(&mut self, reqs: &[(Desc, u64)]) -> Result<usize> {
        self.check_usable()?;
        if let Some(e) = self.ring_state_error() {
            return Err(e);
        }
        if self.legacy() {
            for (i, (d, c)) in reqs.iter().enumerate() {
                if let Err(e) = self.send_legacy(*d, *c) {
                    // Those before it ran (their completions are stashed):
                    // the count says so, the error comes on its own.
                    return if i == 0 { Err(e) } else { Ok(i) };
                }
            }
            return Ok(reqs.len());
        }
        let n = reqs.len().min(self.free_slots.len());
        let measure =
            n > 0 && self.latency_sample.is_none() && self.latency_countdown as usize <= n;
        let t0 = measure.then(Instant::now);
        let mut first_slot = None;
        let (free_slots, slots, sent) = (&mut self.free_slots, &mut self.slots, &mut self.sent);
        // Each request gets a free tag slot as it is written (the ring
        // writes no more than the host's head allows, and takes no slot for
        // what it did not write).
        let n = self
            .view
            .submit_with(&reqs[..n], |(req, cookie)| {
                let slot = free_slots.pop().expect("counted free slots");
                slots[slot as usize] = Some(*cookie);
                sent[slot as usize] = *req;
                first_slot.get_or_insert(slot);
                (req, u64::from(slot))
            })
            .map_err(|e| ClientError::new(Status::BadState, e.to_string()))?;
        self.stats.sent += n as u64;
        match (t0, first_slot) {
            (Some(t0), Some(slot)) => {
                self.latency_sample = Some((slot, t0));
                self.latency_countdown = LATENCY_SAMPLE_EVERY;
            }
            _ if self.latency_sample.is_none() => {
                self.latency_countdown = self.latency_countdown.saturating_sub(n as u32);
            }
            _ => {}
        }
        if n > 0 && self.view.engine_needs_wakeup() {
            match self.ring_doorbell() {
                Ok(()) => {}
                // The requests are in the ring, in flight: the queue made
                // again sends them again or fails them, never twice. They
                // were sent even when no host is back yet (the next call
                // tries again): that error here had the caller send them
                // once more. A host back that refuses the queue is the
                // caller's to hear.
                Err(e) if e.status() == Status::HostGone => match self.recover(e) {
                    Err(r) if r.status() != Status::HostGone => return Err(r),
                    _ => {}
                },
                Err(e) => return Err(e),
            }
        }
        Ok(n)
    }

    fn ring_doorbell(&mut self) -> Result<()> {
        self.stats.doorbells += 1;
        if self.host_lost() {
            return Err(ClientError::new(
                Status::HostGone,
                "the WrapDrive host is gone",
            ));
        }
        wd_sys::wake(self.doorbell.as_fd())?;
        Ok(())
    }

    /// The register block of a device driven through registers (an NVMe
    /// controller): the memory after the ring, which the host shares with
    /// this queue only. None for ring-driven devices.
    pub fn registers(&self) -> Option<wd_sys::devmem::Registers> {
        if self.generation != fork_generation() {
            // A forked child has no ring mapped (the parent's queue).
            return None;
        }
        let ring = self.ring.as_ref()?;
        let at = self
            .view
            .layout()
            .total_bytes()
            .next_multiple_of(wd_sys::page_size());
        let len = ring.len().checked_sub(at).filter(|&n| n > 0)?;
        wd_sys::devmem::Registers::new(ring.clone(), at, len)
    }

    /// After writing a register a device polls (a doorbell): wake the
    /// engine if it sleeps. One fenced load when it does not; returns
    /// whether a wake-up was sent.
    pub fn wake_engine(&mut self) -> Result<bool> {
        self.check()?;
        if self.view.engine_needs_wakeup() {
            self.ring_doorbell()?;
            return Ok(true);
        }
        Ok(false)
    }

    /// A handle that wakes this queue's engine after a register write,
    /// usable from any thread while the queue lives (each I/O queue of a
    /// register-driven device keeps one).
    pub fn waker(&self) -> Result<Waker> {
        self.check()?;
        let ring = self
            .ring
            .clone()
            .ok_or_else(|| ClientError::new(Status::BadState, "queue has no ring"))?;
        Ok(Waker {
            ring,
            doorbell: Arc::new(self.doorbell.try_clone().map_err(|e| {
                ClientError::new(
                    Status::from_errno(e.raw_os_error().unwrap_or(5)),
                    format!("duplicating the engine doorbell: {e}"),
                )
            })?),
            host: self.host.clone(),
            epoch: self.epoch,
            generation: self.generation,
        })
    }

    /// Send one request without blocking; `Status::Again` when the queue is full.
    pub fn send(&mut self, desc: Desc, cookie: u64) -> Result<()> {
        match self.send_batch(&[(desc, cookie)])? {
            1 => Ok(()),
            _ => Err(ClientError::new(
                Status::Again,
                "queue full: receive completions first",
            )),
        }
    }

    /// Send one request, waiting for room when the queue is full.
    pub fn send_sync(&mut self, desc: Desc, cookie: u64) -> Result<()> {
        loop {
            match self.send(desc, cookie) {
                Err(e) if e.status() == Status::Again => {
                    // Room appears only as completions are received by the
                    // caller; wait for one to be posted meanwhile.
                    self.wait_or_recover(None)?;
                    if self.free_slots.is_empty() {
                        // What ended the wait is nobody's here: an event
                        // loop whose announcement it took must hear of it.
                        self.hand_back_wait();
                        return Err(ClientError::new(
                            Status::Busy,
                            "queue full of completed requests: call recv before sending more",
                        ));
                    }
                }
                r => return r,
            }
        }
    }

    /// Receive up to `max` completions without blocking.
    pub fn recv_batch(&mut self, out: &mut Vec<Completion>, max: usize) -> Result<usize> {
        self.retry(|q| q.recv_batch_once(out, max))
    }

    fn recv_batch_once(&mut self, out: &mut Vec<Completion>, max: usize) -> Result<usize> {
        self.check()?;
        // Completions already taken off the ring (legacy replies, or those
        // `call` set aside) come first.
        let stashed = max.min(self.stash.len());
        if stashed > 0 {
            out.extend(self.stash.drain(..stashed));
        }
        if self.legacy() {
            self.stats.received += stashed as u64;
            return Ok(stashed);
        }
        let mut total = stashed;
        let mut descs = std::mem::take(&mut self.scratch);
        let r = self.reap_into(&mut descs, out, max - stashed);
        self.scratch = descs;
        total += r?;
        self.stats.received += total as u64;
        if total == 0 {
            self.idle_checks()?;
        }
        Ok(total)
    }

    /// After a receive found nothing: report a stopped or broken ring, and
    /// now and then whether the host still lives.
    fn idle_checks(&mut self) -> Result<()> {
        if let Some(e) = self.ring_state_error() {
            return Err(e);
        }
        // Reading the clock costs as much as a poll of the ring: look at it
        // only every few empty polls.
        self.empty_polls = self.empty_polls.wrapping_add(1);
        if self.in_flight() > 0
            && self.empty_polls % SPIN_CLOCK_EVERY == 0
            && self.last_liveness.elapsed() > LIVENESS_INTERVAL
        {
            self.last_liveness = Instant::now();
            if self.host_lost() {
                return Err(ClientError::new(
                    Status::HostGone,
                    "the WrapDrive host is gone",
                ));
            }
        }
        Ok(())
    }

    /// Reap up to `max` completions from the ring into `out`, turning
    /// tags back into cookies.
    fn reap_into(
        &mut self,
        descs: &mut [Desc],
        out: &mut Vec<Completion>,
        max: usize,
    ) -> Result<usize> {
        let mut total = 0;
        let start = out.len();
        let mut bad = None;
        while total < max && bad.is_none() {
            let k = (max - total).min(descs.len());
            let n = self.view.reap(&mut descs[..k]);
            // The whole batch left the ring: a bogus entry among them must
            // not lose the good ones after it.
            for d in &descs[..n] {
                match self.completion_of(d) {
                    Ok(c) if self.wanted(&c) => {
                        out.push(c);
                        total += 1;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        bad.get_or_insert(e);
                    }
                }
            }
            if n < k {
                break;
            }
        }
        match bad {
            None => Ok(total),
            Some(e) => {
                // The error now; the good completions wait in the stash
                // for the next receive.
                self.stash.extend(out.drain(start..));
                Err(e)
            }
        }
    }

    /// Receive one completion without blocking (`None` if none is ready).
    pub fn recv(&mut self) -> Result<Option<Completion>> {
        self.retry(Queue::recv_once)
    }

    fn recv_once(&mut self) -> Result<Option<Completion>> {
        self.check()?;
        if let Some(c) = self.stash.pop_front() {
            self.stats.received += 1;
            self.hand_back_wait();
            return Ok(Some(c));
        }
        if self.legacy() {
            return Ok(None);
        }
        let mut d = [Desc::default()];
        while self.view.reap(&mut d) == 1 {
            let c = self.completion_of(&d[0])?;
            if self.wanted(&c) {
                self.stats.received += 1;
                self.hand_back_wait();
                return Ok(Some(c));
            }
        }
        self.idle_checks()?;
        Ok(None)
    }

    /// The completion of a reaped descriptor: its tag back to the cookie
    /// (a tag that is not in flight is the host's lie).
    fn completion_of(&mut self, d: &Desc) -> Result<Completion> {
        let slot = d.tag as usize;
        let Some(cookie) = self.slots.get_mut(slot).and_then(|s| s.take()) else {
            return Err(ClientError::new(
                Status::Protocol,
                format!("host completed tag {} that is not in flight", d.tag),
            ));
        };
        self.free_slots.push(slot as u32);
        if let Some((s, t0)) = self.latency_sample {
            if s as usize == slot {
                self.latency_sample = None;
                self.record_latency(t0);
            }
        }
        Ok(Completion { cookie, desc: *d })
    }

    /// Count the latency of a request sent at `sent` in the ring's
    /// histogram, which halves every second so that `wd top` shows the
    /// last seconds rather than the queue's whole life.
    fn record_latency(&mut self, sent: Instant) {
        let now = Instant::now();
        let secs = now.saturating_duration_since(self.latency_aged).as_secs();
        if secs > 0 {
            self.view.age_latency(secs.min(64) as u32);
            self.latency_aged = now;
        }
        let ns = now.saturating_duration_since(sent).as_nanos();
        self.view
            .record_latency(u64::try_from(ns).unwrap_or(u64::MAX));
    }

    /// Whether a reaped completion is handed out (not one nobody waits for).
    fn wanted(&mut self, c: &Completion) -> bool {
        self.forgotten.is_empty() || !self.forgotten.remove(&c.cookie)
    }

    /// Drop the completion of `cookie` (a request in flight) when it comes,
    /// instead of handing it out: for requests nobody waits for. A cookie
    /// with nothing in flight is left alone (kept, it dropped the completion of
    /// a later request sent with the same cookie).
    pub fn forget(&mut self, cookie: u64) {
        if let Some(i) = self.stash.iter().position(|c| c.cookie == cookie) {
            self.stash.remove(i);
        } else if self.slots.contains(&Some(cookie)) {
            self.forgotten.insert(cookie);
        }
    }

    /// The completion of the request sent with `cookie`, if it has come
    /// (non-blocking). Other completions reaped meanwhile wait in the stash
    /// for their own `recv_cookie` or `recv`: one caller can wait for its
    /// request while others' are in flight on the same queue.
    pub fn recv_cookie(&mut self, cookie: u64) -> Result<Option<Completion>> {
        self.retry(|q| q.recv_cookie_once(cookie))
    }

    fn recv_cookie_once(&mut self, cookie: u64) -> Result<Option<Completion>> {
        self.check()?;
        if let Some(c) = self.take_stashed(cookie) {
            self.hand_back_wait();
            return Ok(Some(c));
        }
        if self.legacy() {
            return Ok(None);
        }
        // One entry at a time, stopping at ours: reading past it would pull
        // in the line the engine writes next.
        let mut d = [Desc::default()];
        while self.view.reap(&mut d) == 1 {
            let c = self.completion_of(&d[0])?;
            if !self.wanted(&c) {
                continue;
            }
            if c.cookie == cookie {
                self.stats.received += 1;
                self.hand_back_wait();
                return Ok(Some(c));
            }
            self.stash.push_back(c);
        }
        self.idle_checks()?;
        Ok(None)
    }

    /// After a wait for one request took an event loop's announcement
    /// over and that request's completion came: the loop's waiters still
    /// wait for theirs, which the wait may have reaped into the stash (or
    /// which may be in the ring) while it drained their signal. Make the
    /// descriptor readable for them, or announce again.
    fn hand_back_wait(&mut self) {
        if !std::mem::take(&mut self.arm_taken) {
            return;
        }
        if !self.stash.is_empty() || self.view.completions_ready() {
            let _ = self.kick_wait();
        } else if self.in_flight() > 0 && self.arm_wait().unwrap_or(false) {
            // A completion came between the look and the announcement.
            let _ = self.kick_wait();
        }
    }

    fn take_stashed(&mut self, cookie: u64) -> Option<Completion> {
        let i = self.stash.iter().position(|c| c.cookie == cookie)?;
        self.stats.received += 1;
        self.stash.remove(i)
    }

    /// Completions reaped and waiting in the stash.
    pub fn stashed(&self) -> usize {
        self.stash.len()
    }

    /// Receive one completion, waiting up to `timeout` (`None`: until one
    /// comes, the host goes away, or nothing is in flight).
    pub fn recv_sync(&mut self, timeout: Option<Duration>) -> Result<Completion> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(c) = self.recv()? {
                return Ok(c);
            }
            if self.in_flight() == 0 {
                return Err(ClientError::new(
                    Status::Again,
                    "nothing in flight to receive",
                ));
            }
            let left = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(l) => Some(l),
                    None => {
                        return Err(ClientError::new(
                            Status::Again,
                            "timed out waiting for a completion",
                        ))
                    }
                },
                None => None,
            };
            self.wait_or_recover(left)?;
        }
    }

    /// Send one request and wait for its completion (one in flight). The
    /// top [`CALL_COOKIES`] cookies are its own: each call has one, so a
    /// call that failed (its host went away) leaves no completion that a
    /// later call takes for its own.
    pub fn call(&mut self, desc: Desc) -> Result<Desc> {
        const FIRST: u64 = u64::MAX - (CALL_COOKIES - 1);
        let cookie = FIRST + self.calls % CALL_COOKIES;
        self.calls += 1;
        // Completions of earlier calls that gave up on them.
        self.stash.retain(|c| c.cookie < FIRST);
        self.send_sync(desc, cookie)?;
        // Other requests' completions met meanwhile stay in the stash for
        // the caller's next recv (a legacy reply is already there).
        loop {
            if let Some(c) = self.recv_cookie(cookie)? {
                return Ok(c.desc);
            }
            if self.legacy() {
                return Err(ClientError::new(Status::Protocol, "legacy reply missing"));
            }
            self.wait_or_recover(None)?;
        }
    }

    /// Publish counters in the ring, shown by `wd ls` under
    /// `queues/q<ID>/client/` (names: `wd_ring::CLIENT_STAT_NAMES`).
    pub fn publish_stats(&self, v: &[u64; wd_ring::CLIENT_STATS]) {
        if self.generation == fork_generation() {
            self.view.publish_client_stats(v);
        }
    }

    /// Whether completions are waiting to be received (never in a forked
    /// child: the parent's queue, its ring not mapped there).
    pub fn completions_ready(&self) -> bool {
        self.generation == fork_generation()
            && (!self.stash.is_empty() || self.view.completions_ready())
    }

    /// Whether the ring holds completions not yet reaped: what a caller
    /// spinning for its own request looks at (the stash holds other
    /// callers' completions, which would end its spin at once, every time).
    pub fn ring_ready(&self) -> bool {
        self.generation == fork_generation() && self.view.completions_ready()
    }

    /// One descriptor for event loops: readable after [`Queue::arm_wait`]
    /// once a completion is posted, or when the host goes away.
    pub fn wait_fd(&mut self) -> Result<std::os::fd::BorrowedFd<'_>> {
        if self.wait_set.is_none() {
            let kick = wd_sys::eventfd()?;
            let set =
                wd_sys::epoll_of(&[self.cq_event.as_fd(), self.socket.as_fd(), kick.as_fd()])?;
            // A new kick (the set made again after a reconnect could not
            // keep it): `kicked` spoke of the old one, and a hold must
            // make this one readable.
            self.kicked = false;
            self.kick = Some(kick);
            self.wait_set = Some(set);
            if self.kick_held > 0 {
                self.signal_kick()?;
                self.wait_signalled = true;
            }
        }
        Ok(self.wait_set.as_ref().expect("made above").as_fd())
    }

    /// Ask the host to signal [`Queue::wait_fd`] at the next completion.
    /// Returns true when a completion is already there (then do not wait:
    /// the signal may never come). Undo with [`Queue::disarm_wait`].
    pub fn arm_wait(&mut self) -> Result<bool> {
        self.check()?;
        if !self.stash.is_empty() {
            return Ok(true);
        }
        if self.wait_armed && self.view.client_end_wait() {
            self.wait_signalled = true;
        }
        self.wait_armed = true;
        self.loop_waiting = true;
        self.arm_taken = false;
        Ok(self.view.client_prepare_wait())
    }

    /// Make [`Queue::wait_fd`] readable now (a waiter found work already
    /// there but must still go through its event loop). Nothing to do when
    /// it may be readable already.
    pub fn kick_wait(&mut self) -> Result<()> {
        self.check()?;
        self.loop_waiting = true;
        if !self.wait_signalled {
            self.wait_fd()?;
            self.signal_kick()?;
            self.wait_signalled = true;
        }
        Ok(())
    }

    /// Make the wait set's own eventfd readable, once: `kicked` says it
    /// holds a signal, which `drain_signal` (or a reconnect) takes.
    fn signal_kick(&mut self) -> Result<()> {
        if !self.kicked {
            let kick = self.kick.as_ref().expect("made with the wait set");
            wd_sys::eventfd_signal(kick.as_fd())?;
            self.kicked = true;
        }
        Ok(())
    }

    /// Keep [`Queue::wait_fd`] readable until as many
    /// [`Queue::release_wait_readable`]: for an event loop's waiter with no
    /// request of its own (a job that yielded to others), which no
    /// completion would wake, and whose wake-up no other wait may take
    /// (another waiter's, or a synchronous request's, drains the signal).
    pub fn hold_wait_readable(&mut self) -> Result<()> {
        self.check()?;
        self.wait_fd()?;
        self.signal_kick()?;
        self.wait_signalled = true;
        self.loop_waiting = true;
        self.kick_held = self.kick_held.saturating_add(1);
        Ok(())
    }

    /// Give back one [`Queue::hold_wait_readable`]; the next drain then
    /// takes the kick.
    pub fn release_wait_readable(&mut self) {
        self.kick_held = self.kick_held.saturating_sub(1);
    }

    /// After waking: withdraw the request to be signalled, and consume the
    /// signal once nothing is left to receive: while completions wait, the
    /// descriptor stays readable for the event loop's other waiters.
    pub fn disarm_wait(&mut self) {
        self.loop_waiting = false;
        self.arm_taken = false;
        if std::mem::take(&mut self.wait_armed) && self.view.client_end_wait() {
            self.wait_signalled = true;
        }
        if !self.completions_ready() {
            self.drain_signal();
        }
    }

    /// Take the completion line's wake-ups (and a kick) when it may hold a
    /// signal. A signal the
    /// host announced but has not written yet keeps the flag, so a later
    /// call reads it.
    fn drain_signal(&mut self) {
        if !self.wait_signalled {
            return;
        }
        let mut taken = false;
        if self.kicked && self.kick_held == 0 {
            self.kicked = false;
            let k = self.kick.as_ref().expect("kicked through it");
            taken |= wd_sys::eventfd_drain(k.as_fd()).map_or(true, |n| n > 0);
        }
        taken |= wd_sys::wake_drain(self.cq_event.as_fd()).map_or(true, |n| n > 0);
        // A held kick keeps the descriptor readable.
        if taken && !self.kicked {
            self.wait_signalled = false;
        }
    }

    /// Block until a completion is posted in the ring (spin briefly, then
    /// sleep), the timeout passes, or the host goes away (an error).
    /// Completions already in the stash do not end the wait: they are other
    /// callers' (`recv` hands them out without waiting), and a caller
    /// waiting for its own request (`recv_cookie`) must sleep, not spin, while
    /// they sit there.
    pub fn wait_completion(&mut self, timeout: Option<Duration>) -> Result<()> {
        self.wait_or_recover(timeout)
    }

    /// [`Queue::wait`], and when the host went away meanwhile, the queue
    /// made again on the restarted host (then the caller polls again:
    /// what was in flight was sent again or completed with
    /// [`crate::STATUS_RESTARTED`]).
    fn wait_or_recover(&mut self, timeout: Option<Duration>) -> Result<()> {
        match self.wait(timeout) {
            Err(e) if e.status() == Status::HostGone => self.recover(e),
            r => r,
        }
    }

    /// Wait until a completion is posted: spin briefly, then sleep on the
    /// completion doorbell and the control socket (which hangs up if the
    /// host dies).
    fn wait(&mut self, timeout: Option<Duration>) -> Result<()> {
        // The clock is read only once the completion did not come within
        // the first few polls: a round trip is shorter than a clock read.
        let mut start = None;
        let mut spins = 0u32;
        loop {
            if self.view.completions_ready() {
                return Ok(());
            }
            spins += 1;
            if spins % SPIN_CLOCK_EVERY == 0 {
                let t0 = *start.get_or_insert_with(Instant::now);
                if t0.elapsed() >= SPIN {
                    break;
                }
            }
            std::hint::spin_loop();
        }
        let start = start.unwrap_or_else(Instant::now);
        // This wait takes over an event loop's announcement (it ends it,
        // and drains the signal, a kick included): handed back by
        // `hand_back_wait`.
        self.wait_armed = false;
        self.arm_taken |= self.loop_waiting;
        loop {
            let ready = self.view.client_prepare_wait();
            if ready {
                self.end_own_wait();
                return Ok(());
            }
            if let Some(e) = self.ring_state_error() {
                self.end_own_wait();
                return Err(e);
            }
            self.stats.sleeps += 1;
            let slice = timeout.map_or(WAIT_SLICE, |t| {
                t.saturating_sub(start.elapsed()).min(WAIT_SLICE)
            });
            let r = wd_sys::poll(&[self.cq_event.as_fd(), self.socket.as_fd()], Some(slice))?;
            self.end_own_wait();
            self.drain_signal();
            if r[1].hangup {
                return Err(ClientError::new(
                    Status::HostGone,
                    "the WrapDrive host is gone",
                ));
            }
            if self.view.completions_ready() {
                return Ok(());
            }
            if let Some(t) = timeout {
                if start.elapsed() >= t {
                    // Nothing came for the caller, who may give up now:
                    // the loop's announcement goes back to it.
                    self.hand_back_wait();
                    return Ok(());
                }
            }
        }
    }

    /// Withdraw a wait announcement of `wait`, noting a signal it caused.
    fn end_own_wait(&mut self) {
        if self.view.client_end_wait() {
            self.wait_signalled = true;
        }
    }

    fn send_legacy(&mut self, desc: Desc, cookie: u64) -> Result<()> {
        let Some(planner) = self.legacy_planner else {
            return Err(ClientError::new(
                Status::Unsupported,
                format!(
                    "queue {} ({}) sends through the socket (WD_CAPA_ALLOW_LEGACY) but knows no legacy plan for its message format: call Queue::set_legacy_planner with the format's planner",
                    self.id, self.alg
                ),
            ));
        };
        let plan = match planner(&desc) {
            Ok(p) => p,
            Err(st) => {
                // Malformed for this device: complete it with the status, as
                // the device would.
                let mut d = desc;
                d.status = st;
                d.result = 0;
                self.stash.push_back(Completion { cookie, desc: d });
                self.stats.sent += 1;
                return Ok(());
            }
        };
        let total: u64 = plan.inputs.iter().map(|r| r.1).sum();
        if total > wd_proto::limits::MAX_PAYLOAD as u64 {
            return Err(ClientError::new(
                Status::TooBig,
                "legacy requests carry at most 1 MiB",
            ));
        }
        let mut payload = vec![0u8; total as usize];
        let mut off = 0usize;
        // Through the kernel: a bad address is EFAULT, not a crash.
        let me = ProcessMemory::own()?;
        for &(a, l) in &plan.inputs {
            me.read(a, &mut payload[off..off + l as usize])
                .map_err(|_| {
                    ClientError::new(
                        Status::Fault,
                        format!("cannot read request memory at {a:#x}"),
                    )
                })?;
            off += l as usize;
        }
        let (reply, _) = self.host.call_on(
            self.epoch,
            &Message::Legacy {
                queue_id: self.id,
                desc: plan.desc.to_bytes().to_vec(),
                payload,
            },
            &[],
        )?;
        let Message::LegacyReply {
            desc: rd,
            payload: out,
        } = reply
        else {
            return Err(unexpected(&reply));
        };
        let mut done = Desc::from_bytes(&rd)
            .ok_or_else(|| ClientError::new(Status::Protocol, "bad reply descriptor"))?;
        if done.status == 0 {
            let mut off = 0usize;
            let last = plan.outputs.len().saturating_sub(1);
            for (i, &(a, l)) in plan.outputs.iter().enumerate() {
                // The last range takes what the reply holds (a digest's
                // length is known only once it is produced).
                let l = if i == last {
                    l.min(out.len().saturating_sub(off) as u64)
                } else {
                    l
                };
                let end = off + l as usize;
                if end > out.len() {
                    return Err(ClientError::new(
                        Status::Protocol,
                        "reply payload too short",
                    ));
                }
                me.write(a, &out[off..end]).map_err(|_| {
                    ClientError::new(
                        Status::Fault,
                        format!("cannot write result memory at {a:#x}"),
                    )
                })?;
                off = end;
            }
        }
        // The device saw the rewritten descriptor; give back the caller's.
        let mut back = desc;
        back.status = done.status;
        back.result = done.result;
        done = back;
        self.stash.push_back(Completion { cookie, desc: done });
        self.stats.sent += 1;
        Ok(())
    }

    /// Share `[addr, addr+len)` (memory from [`crate::alloc`]) with the
    /// device, read-write; the range is widened to whole pages.
    pub fn share(&mut self, addr: u64, len: u64) -> Result<()> {
        self.retry(|q| q.share_once(addr, len))
    }

    fn share_once(&mut self, addr: u64, len: u64) -> Result<()> {
        self.check_usable()?;
        let page = wd_mem::GRANULE as u64;
        let start = addr & !(page - 1);
        let end = addr
            .checked_add(len)
            .and_then(|e| e.checked_add(page - 1))
            .map(|e| e & !(page - 1))
            .ok_or_else(|| ClientError::new(Status::Invalid, "range overflows"))?;
        if len == 0 {
            return Err(ClientError::new(
                Status::Invalid,
                "cannot share an empty range",
            ));
        }
        let loc = crate::buf::locate(start, end - start).ok_or_else(|| {
            ClientError::new(
                Status::Invalid,
                format!(
                    "{addr:#x}+{len:#x} is not memory from the WrapDrive allocator (use wd_alloc, or a queue with WD_CAPA_SHARE_ALL)"
                ),
            )
        })?;
        self.share_fd(start, end - start, loc.fd(), loc.offset_of(start), false)?;
        if matches!(loc, crate::buf::Found::Own(_)) {
            let pinned = crate::buf::pin(start, end - start);
            if let Some(s) = self.shares.last_mut() {
                s.pinned = pinned;
            }
        }
        Ok(())
    }

    /// The one share path: map `size` bytes of `fd` from `fd_offset` at
    /// `iova`, read-write, and remember it for `unshare` (and, keeping a
    /// copy of the descriptor when `keep_fd`, for sharing it again on a
    /// restarted host).
    fn share_fd(
        &mut self,
        iova: u64,
        size: u64,
        fd: BorrowedFd<'_>,
        fd_offset: u64,
        keep_fd: bool,
    ) -> Result<()> {
        self.map_on_host(iova, size, fd, fd_offset)?;
        let fd = match keep_fd {
            true => Some((
                fd.try_clone_to_owned().map_err(|e| {
                    ClientError::new(
                        Status::TooManyFiles,
                        format!("keeping the shared memory's descriptor: {e}"),
                    )
                })?,
                fd_offset,
            )),
            false => None,
        };
        self.shares.push(Share {
            iova,
            size,
            fd,
            pinned: false,
        });
        Ok(())
    }

    fn map_on_host(&self, iova: u64, size: u64, fd: BorrowedFd<'_>, fd_offset: u64) -> Result<()> {
        let (reply, _) = self.host.call_on(
            self.epoch,
            &Message::MemShare {
                queue_id: self.id,
                iova,
                size,
                fd_offset,
                prot: wd_proto::Prot::RW,
            },
            &[fd],
        )?;
        match reply {
            Message::Ok => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    /// Share a heap buffer (e.g. a file loaded by
    /// [`wd_heap::alloc_and_read`]) with the device, read-write and in
    /// place: the host maps the buffer's memfd (after checking its seals)
    /// at IOVA = [`wd_heap::Buffer::addr`], for its whole capacity. The
    /// buffer must be sealed against shrinking (heap buffers are, unless
    /// allocated with `seal: false`) and writable (not sealed against
    /// writes).
    pub fn share_buffer(&mut self, buf: &wd_heap::Buffer) -> Result<()> {
        self.retry(|q| q.share_buffer_once(buf))
    }

    fn share_buffer_once(&mut self, buf: &wd_heap::Buffer) -> Result<()> {
        self.check_usable()?;
        if !buf.is_writable() {
            return Err(ClientError::new(
                Status::Invalid,
                "cannot share a buffer that is read-only in this process",
            ));
        }
        // Writable here, the owner's mapping, and still refused to every
        // new writable mapping: the host's included.
        if buf.seals().is_ok_and(|s| s.writes) {
            return Err(ClientError::new(
                Status::Invalid,
                "cannot share a buffer sealed against writes (the device maps it writable)",
            ));
        }
        self.share_fd(buf.addr(), buf.capacity(), buf.fd(), 0, true)
    }

    /// Undo [`Queue::share_buffer`]; returns once no engine can reach the
    /// buffer any more (then it may be dropped or reused freely).
    pub fn unshare_buffer(&mut self, buf: &wd_heap::Buffer) -> Result<()> {
        self.unshare(buf.addr(), buf.capacity())
    }

    /// Undo [`Queue::share`] for the same range; returns once no engine can
    /// reach it any more.
    pub fn unshare(&mut self, addr: u64, len: u64) -> Result<()> {
        self.retry(|q| q.unshare_once(addr, len))
    }

    fn unshare_once(&mut self, addr: u64, len: u64) -> Result<()> {
        self.check()?;
        let page = wd_mem::GRANULE as u64;
        let start = addr & !(page - 1);
        let end = addr.saturating_add(len).saturating_add(page - 1) & !(page - 1);
        let pos = self
            .shares
            .iter()
            .position(|s| s.iova == start && s.size == end - start)
            .ok_or_else(|| {
                ClientError::new(
                    Status::NotFound,
                    format!("{addr:#x}+{len:#x} was not shared"),
                )
            })?;
        let r = self.host.call_on(
            self.epoch,
            &Message::MemUnshare {
                queue_id: self.id,
                iova: start,
                size: end - start,
            },
            &[],
        );
        match r {
            Ok(_) => {}
            // A host that did not answer in time may be hung, not gone:
            // it may resume and reach the range. Not unshared, then; the
            // queue is made again when a host answers (`retry`), and the
            // unshare goes to it.
            Err(e) if self.host.may_still_act(self.epoch) => {
                return Err(ClientError::new(
                    Status::HostGone,
                    format!(
                        "{e} (the host may still reach {start:#x}+{:#x}: not unshared)",
                        end - start
                    ),
                ))
            }
            // A host that is gone reaches nothing: the range is unshared
            // (and must not be shared again on a restarted host).
            Err(e) if e.status() == Status::HostGone || self.host_lost() => {}
            // Perhaps never shared on the restarted host.
            Err(_) if self.unrestored.is_some() => {}
            Err(e) => return Err(e),
        }
        let s = self.shares.swap_remove(pos);
        if s.pinned {
            crate::buf::unpin(s.iova);
        }
        Ok(())
    }

    /// Read (and consume) up to `max` fault events.
    pub fn faults(&mut self, max: u32) -> Result<FaultReport> {
        self.retry(|q| q.faults_once(max))
    }

    fn faults_once(&mut self, max: u32) -> Result<FaultReport> {
        self.check()?;
        match self
            .host
            .call_on(
                self.epoch,
                &Message::ReadFaults {
                    queue_id: self.id,
                    max,
                },
                &[],
            )?
            .0
        {
            Message::Faults {
                total,
                lost,
                events,
            } => Ok(FaultReport {
                total,
                lost,
                events,
            }),
            other => Err(unexpected(&other)),
        }
    }

    /// Choose how the queue's IOMMU domain invalidates (strict: an unshare
    /// returns once no engine can reach the range; deferred: unshares are
    /// invalidated in batches, the memory staying mapped in the host until
    /// then) and what a translation fault does (abort the request, or stall
    /// it until [`Queue::resume_fault`]).
    pub fn set_iommu_policy(&mut self, mode: InvalidationMode, faults: FaultPolicy) -> Result<()> {
        self.retry(|q| {
            q.check()?;
            q.apply_iommu_policy(mode, faults)?;
            q.iommu_policy = Some((mode, faults));
            Ok(())
        })
    }

    fn apply_iommu_policy(&self, mode: InvalidationMode, faults: FaultPolicy) -> Result<()> {
        let msg = Message::IommuPolicy {
            queue_id: self.id,
            mode,
            fault_policy: faults,
        };
        match self.host.call_on(self.epoch, &msg, &[])?.0 {
            Message::Ok => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    /// Resolve the request stalled by fault `seq` (a [`FaultEvent::seq`] of
    /// this queue): run it again (after mapping what it needs) or fail it
    /// with -EFAULT. `Status::NotFound` if no request waits on that fault.
    pub fn resume_fault(&mut self, seq: u64, retry: bool) -> Result<()> {
        self.check()?;
        let msg = Message::FaultResume {
            queue_id: self.id,
            stag: seq,
            retry,
        };
        match self.host.call_on(self.epoch, &msg, &[])?.0 {
            Message::Ok => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    /// The connection this queue belongs to (its virtio-iommu device).
    pub fn host(&self) -> &Arc<HostConn> {
        &self.host
    }

    /// Say which requests in flight may be sent again, unchanged, to a
    /// restarted host (a copy may; a request naming host-side state, such
    /// as a session, may not): the message format's knowledge, like the
    /// legacy plan. Without one, nothing is sent again: every request in
    /// flight at a restart completes with [`crate::STATUS_RESTARTED`].
    pub fn set_redo_policy(&mut self, safe: fn(&Desc) -> bool) {
        self.redo = Some(safe);
    }

    /// How the queue lived through restarts of its host.
    pub fn recovery_stats(&self) -> RecoveryStats {
        self.recovery
    }

    /// The connection epoch the queue belongs to; it changes when the
    /// queue is made again on a restarted host (session handles and other
    /// host-side state of the old one are gone).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Whether this queue's host is gone: the connection hung up, or was
    /// made again since the queue was (its engine died with the old host).
    fn host_lost(&self) -> bool {
        self.host.epoch() != self.epoch || self.host.host_gone()
    }

    /// Run `op`; when it finds the host gone, make the queue again on the
    /// restarted host and run it again (at most three times).
    fn retry<T>(&mut self, mut op: impl FnMut(&mut Queue) -> Result<T>) -> Result<T> {
        let mut tries = 0;
        loop {
            match op(self) {
                Err(e) if e.status() == Status::HostGone && tries < 3 => {
                    tries += 1;
                    self.recover(e)?;
                }
                r => return r,
            }
        }
    }

    /// After the host went away (`cause`): reconnect, ask for the same
    /// queue again, share the same memory again, set the same IOMMU
    /// policy, and send again what was in flight where the redo policy
    /// allows (the rest completes with [`crate::STATUS_RESTARTED`]). A
    /// queue driven through device registers is left to its driver (its
    /// device state is the driver's): `cause` comes back.
    fn recover(&mut self, cause: ClientError) -> Result<()> {
        if self.released || self.generation != fork_generation() || self.registers().is_some() {
            return Err(cause);
        }
        self.remake()
    }

    /// For a driver of a register-driven device (which the library does
    /// not remake by itself): after the host went away, make this queue
    /// again on the restarted host with the same parameters and the same
    /// memory shared; the device behind it starts from reset (its
    /// register block is a new one: [`Queue::registers`] again). Nothing
    /// to do when the queue's host lives.
    pub fn reconnect(&mut self) -> Result<()> {
        self.check()?;
        if !self.host_lost() {
            return Ok(());
        }
        self.remake()
    }

    fn remake(&mut self) -> Result<()> {
        self.host.reconnect(self.epoch)?;
        // What the dead engine completed before it died stays valid.
        if !self.legacy() {
            let mut descs = std::mem::take(&mut self.scratch);
            let mut done = Vec::new();
            let r = self.reap_into(&mut descs, &mut done, usize::MAX);
            self.scratch = descs;
            r?;
            self.stash.extend(done);
        }
        let mut fresh = Queue::request(self.host.clone(), &self.capa)?;
        if fresh.depth() != self.depth() {
            return Err(ClientError::new(
                Status::BadState,
                format!(
                    "the restarted host granted depth {} instead of {}",
                    fresh.depth(),
                    self.depth()
                ),
            ));
        }
        std::mem::swap(&mut self.id, &mut fresh.id);
        std::mem::swap(&mut self.device, &mut fresh.device);
        std::mem::swap(&mut self.device_api, &mut fresh.device_api);
        std::mem::swap(&mut self.flags, &mut fresh.flags);
        std::mem::swap(&mut self.epoch, &mut fresh.epoch);
        std::mem::swap(&mut self.view, &mut fresh.view);
        std::mem::swap(&mut self.ring, &mut fresh.ring);
        std::mem::swap(&mut self.doorbell, &mut fresh.doorbell);
        if let Some(set) = &self.wait_set {
            // (A closed descriptor leaves the set only with its last
            // duplicate: taken out now.)
            wd_sys::epoll_del(set.as_fd(), self.cq_event.as_fd());
            wd_sys::epoll_del(set.as_fd(), self.socket.as_fd());
        }
        std::mem::swap(&mut self.cq_event, &mut fresh.cq_event);
        std::mem::swap(&mut self.socket, &mut fresh.socket);
        // `fresh` now holds the dead host's ring: nothing to release there.
        fresh.released = true;
        drop(fresh);
        if let Some(set) = &self.wait_set {
            // The same descriptor for event loops that registered it, now
            // on the new queue's doorbell and socket.
            let fds = [self.cq_event.as_fd(), self.socket.as_fd()];
            if wd_sys::epoll_add(set.as_fd(), &fds).is_err() {
                self.wait_set = None;
            }
        }
        // The new ring starts a new histogram; a request failed below frees
        // its slot for another.
        self.latency_sample = None;
        self.wait_armed = false;
        self.loop_waiting = false;
        self.arm_taken = false;
        self.wait_signalled = false;
        // The kick stays in the wait set across the reconnect: a signal
        // it holds would no longer be read (wait_signalled is false), and
        // the descriptor would stay readable for ever.
        // A held one stays (its waiter still needs it), and then so does
        // the signal.
        if self.kick_held == 0 && std::mem::take(&mut self.kicked) {
            if let Some(k) = &self.kick {
                let _ = wd_sys::eventfd_drain(k.as_fd());
            }
        }
        self.wait_signalled = self.kicked;
        self.last_liveness = Instant::now();
        let restored: Result<()> = (|| {
            for s in &self.shares {
                match &s.fd {
                    Some((fd, off)) => self.map_on_host(s.iova, s.size, fd.as_fd(), *off)?,
                    None => {
                        let loc = crate::buf::locate(s.iova, s.size).ok_or_else(|| {
                            ClientError::new(
                                Status::BadState,
                                format!("shared memory at {:#x} was freed while shared", s.iova),
                            )
                        })?;
                        self.map_on_host(s.iova, s.size, loc.fd(), loc.offset_of(s.iova))?
                    }
                }
            }
            if let Some((mode, faults)) = self.iommu_policy {
                self.apply_iommu_policy(mode, faults)?;
            }
            Ok(())
        })();
        // Without its memory or policy on the new host nothing is sent
        // again: every request in flight completes as restarted (a waiter
        // would otherwise wait on the new ring for ever).
        let redo = self.redo.filter(|_| restored.is_ok());
        self.unrestored = restored
            .as_ref()
            .err()
            .map(|e| format!("its memory or IOMMU policy ({e})"));
        let mut again = Vec::new();
        for slot in 0..self.slots.len() {
            let Some(cookie) = self.slots[slot] else {
                continue;
            };
            if redo.is_some_and(|safe| safe(&self.sent[slot])) {
                again.push((self.sent[slot], slot as u64));
                continue;
            }
            self.slots[slot] = None;
            self.free_slots.push(slot as u32);
            let mut desc = self.sent[slot];
            desc.status = crate::STATUS_RESTARTED;
            desc.result = 0;
            let c = Completion { cookie, desc };
            if self.wanted(&c) {
                self.stash.push_back(c);
            }
            self.recovery.failed += 1;
        }
        restored?;
        let n = self
            .view
            .submit_with(&again, |(d, slot)| (d, *slot))
            .map_err(|e| ClientError::new(Status::BadState, e.to_string()))?;
        self.recovery.redone += n as u64;
        self.recovery.reconnects += 1;
        let r = self.recovery;
        self.view
            .publish_queue_stats(&[r.reconnects, r.redone, r.failed]);
        if n > 0 && self.view.engine_needs_wakeup() {
            self.ring_doorbell()?;
        }
        Ok(())
    }

    /// Give the queue back (also done on drop).
    pub fn release(mut self) -> Result<()> {
        self.release_inner()
    }

    fn release_inner(&mut self) -> Result<()> {
        if self.released || self.generation != fork_generation() {
            return Ok(());
        }
        self.released = true;
        let r = self
            .host
            .call_on(
                self.epoch,
                &Message::ReleaseQueue { queue_id: self.id },
                &[],
            )
            .map(|_| ());
        // Released, or its host gone: no engine reaches the queue's
        // memory any more. A host that did not answer and lives may still:
        // its memory stays out of the allocator.
        if !self.host.may_still_act(self.epoch) {
            for s in self.shares.drain(..).filter(|s| s.pinned) {
                crate::buf::unpin(s.iova);
            }
        }
        r
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        if self.generation != fork_generation() {
            // In a forked child the ring is not mapped (MADV_DONTFORK) and the
            // queue is the parent's: neither unmap nor release anything.
            std::mem::forget(self.ring.take());
            return;
        }
        let _ = self.release_inner();
    }
}

/// Wakes a queue's engine when it sleeps ([`Queue::waker`]).
#[derive(Clone, Debug)]
pub struct Waker {
    ring: Arc<Mapping>,
    doorbell: Arc<OwnedFd>,
    host: Arc<HostConn>,
    /// The connection epoch of its queue (a newer one: that engine is gone).
    epoch: u64,
    /// The fork generation it was made in: a forked child's copy has no
    /// ring mapped (`MADV_DONTFORK`).
    generation: u64,
}

impl Waker {
    /// After a register write the engine polls: signal its doorbell if it
    /// sleeps. One fenced load when it does not; returns whether a wake-up
    /// was sent.
    pub fn wake(&self) -> Result<bool> {
        if self.generation != fork_generation() {
            return Err(forked_error());
        }
        // SAFETY: `ring` is the queue's live ring mapping (kept by this
        // handle, and mapped in this process: checked above), page
        // aligned, at least a header long.
        if !unsafe { wd_ring::engine_needs_wakeup_at(self.ring.as_ptr()) } {
            return Ok(false);
        }
        if self.host.host_gone() {
            return Err(ClientError::new(
                Status::HostGone,
                "the WrapDrive host is gone",
            ));
        }
        wd_sys::wake(self.doorbell.as_fd())?;
        Ok(true)
    }

    /// `Status::HostGone` once the host closed the connection (one
    /// system call): for a driver polling device registers, which would
    /// otherwise wait for a dead host until its timeout.
    pub fn check_host(&self) -> Result<()> {
        if self.generation != fork_generation() {
            return Err(forked_error());
        }
        if self.host.epoch() != self.epoch || self.host.host_gone() {
            return Err(ClientError::new(
                Status::HostGone,
                "the WrapDrive host is gone",
            ));
        }
        Ok(())
    }
}
