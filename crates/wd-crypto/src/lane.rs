//! Lanes: a thread's queues to the sec device, each with a staging area of
//! shared memory the device works in, and the table of completions that
//! arrived for requests other than the one being waited for.
//!
//! The scheduler is per thread: each thread gets its own queues (chosen by
//! the host from device priority and the thread's NUMA node), so sending
//! never takes a lock shared with another thread.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use wd_sec_msg::{SessionClone, SessionFree, SessionNew};
use wrapdrive::{Capability, Desc, HostConn, Queue, SharedBuf, SharedSpan, Status};

use crate::{config, CryptoError, Result};

/// Bytes of one staging slot: requests are cut into pieces of this size.
pub const SLOT: usize = 64 << 10;
/// Slots of a lane's staging area (twice that is its ring depth).
pub const SLOTS: usize = 64;
/// Bytes of a unit of the large staging area. An asynchronous request
/// longer than a slot is staged there whole, in a run of units, and sent
/// as one request: the engine's lanes then take long messages side by
/// side (of a message cut into chained pieces, a burst takes one piece at
/// a time), and 32 jobs of 1 MiB are in flight, not the 4 that the slots
/// hold.
pub const LARGE_SLOT: usize = 1 << 20;
/// Units of a large staging area. One is made the first time a thread
/// sends such a request, a second when the first is full (each kept for
/// the lane's life): a thread that never does has none. Their pages are
/// touched only as requests use them.
pub const LARGE_SLOTS: usize = 32;
/// Large staging areas a lane may make: 64 jobs of 1 MiB, or 32 of 2 MiB,
/// in flight at once (the ring's depth, 128, holds them with the slots).
const LARGE_AREAS: usize = 2;

/// Which units of the large staging area are taken, in runs.
#[derive(Debug)]
struct Runs {
    /// Bit `i` set: unit `i` is free.
    free: u32,
    /// At the first unit of each run taken, its length in units.
    len: [u8; LARGE_SLOTS],
}

impl Runs {
    fn new() -> Runs {
        Runs {
            free: u32::MAX >> (32 - LARGE_SLOTS),
            len: [0; LARGE_SLOTS],
        }
    }

    /// Take the first run of `n` free units; its first unit.
    fn take(&mut self, n: usize) -> Option<usize> {
        if n == 0 || n > LARGE_SLOTS {
            return None;
        }
        let run = u32::MAX >> (32 - n);
        let i = (0..=LARGE_SLOTS - n).find(|&i| self.free & (run << i) == run << i)?;
        self.free &= !(run << i);
        self.len[i] = n as u8;
        Some(i)
    }

    /// Give back the run taken from unit `i`.
    fn put(&mut self, i: usize) {
        let n = std::mem::take(&mut self.len[i]) as u32;
        if n > 0 {
            self.free |= (u32::MAX >> (32 - n)) << i;
        }
    }
}

/// Former ids a lane remembers (see `Lane::former`): a job in flight
/// across more restarts than this keeps its slots.
const FORMER_IDS: usize = 8;

/// How long a thread computes on the CPU after failing to get a queue
/// before it asks the host again.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// Which queue type a lane serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `cipher` queues (AES in every mode).
    Cipher,
    /// `digest` queues (SHA and HMAC).
    Digest,
}

impl Kind {
    fn alg(self) -> &'static str {
        match self {
            Kind::Cipher => "cipher",
            Kind::Digest => "digest",
        }
    }
}

/// Unique id of a lane, so a session never uses a handle of another
/// (possibly re-created) lane.
pub type LaneId = u64;

/// A request found on another lane than its own: another thread's (a
/// session, job or message moved between threads), not a host that went
/// away, so this thread's lane stays.
pub fn elsewhere(what: &str) -> CryptoError {
    CryptoError::Device {
        status: wrapdrive::Status::BadState,
        message: format!(
            "{what} belongs to another thread's queue: finish it on the thread that started it"
        ),
    }
}

/// Where a message, stream or job met the device: the process (by fork
/// generation) and the thread whose lane it used. Met anywhere else, it
/// is an error naming which (never a host gone: this thread's lane
/// stays), told apart from a lane of this thread made again after a
/// restart.
///
/// One word (a job carries it): the fork generation in the top 16 bits (a
/// 65536th nested fork would be needed to meet one's own again), this
/// process's thread number below.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark(u64);

const THREAD_BITS: u32 = 48;

impl Mark {
    /// This thread's mark.
    pub fn here() -> Mark {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        thread_local!(static THREAD: u64 = NEXT.fetch_add(1, Ordering::Relaxed));
        let thread = THREAD.with(|t| *t) & ((1 << THREAD_BITS) - 1);
        Mark(wrapdrive::fork_generation() << THREAD_BITS | thread)
    }

    /// Whether this process is a child forked since.
    pub fn forked(self) -> bool {
        self.0 >> THREAD_BITS != wrapdrive::fork_generation() & (u64::MAX >> THREAD_BITS)
    }

    /// `Ok` when this is where `what` met the device.
    pub fn check(self, what: &str) -> Result<()> {
        if self.forked() {
            return Err(CryptoError::Device {
                status: wrapdrive::Status::BadState,
                message: format!(
                    "{what} went to the device before fork: its state stays with the parent process"
                ),
            });
        }
        if self != Mark::here() {
            return Err(elsewhere(what));
        }
        Ok(())
    }
}

fn next_lane_id() -> LaneId {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Sessions of a lane whose objects were dropped on another thread (a
/// cipher is `Send`): only the lane's own thread may submit on it, so it
/// frees them at its next calls on the lane. Without this they stayed on
/// the device until the thread ended (a thread pool's, never). Each
/// session keeps a weak reference to its lane's inbox: no registry, so
/// no lock shared by every thread (one held at a fork would hang the
/// child).
#[derive(Debug)]
pub struct Inbox {
    /// The fork generation it was made in: a forked child posts nothing
    /// to its parent's lanes (nor takes their locks).
    generation: u64,
    posted: AtomicBool,
    /// With the lane id each was opened on: one posted before the lane
    /// took a new id (a restarted host) names a session that is gone.
    handles: Mutex<Vec<(LaneId, u64)>>,
}

/// A device session: its handle on a lane, and where to leave it when
/// the object is dropped on another thread.
#[derive(Clone, Debug)]
pub struct Session {
    /// The lane it was opened on.
    pub lane: LaneId,
    /// Its handle there.
    pub handle: u64,
    inbox: Weak<Inbox>,
}

/// Posted sessions freed before waiting for their completions: the queue
/// keeps room for the caller's own request.
const FREES_PER_CALL: usize = 8;

/// Free device sessions: now, those of this thread's lane; the others by
/// their lane's thread (sessions of a lane gone went with its queue).
pub fn release_sessions(kind: Kind, sessions: &[Session]) {
    if sessions.is_empty() {
        return;
    }
    let here = with_open_lane(kind, |lane| {
        let id = lane.id;
        for s in sessions.iter().filter(|s| s.lane == id) {
            lane.free_session(s.handle);
        }
        Ok(id)
    });
    let here = match here {
        Ok(Ok(id)) => Some(id),
        _ => None,
    };
    let generation = wrapdrive::fork_generation();
    for s in sessions.iter().filter(|s| Some(s.lane) != here) {
        let Some(inbox) = s.inbox.upgrade() else {
            continue;
        };
        if inbox.generation != generation {
            continue;
        }
        lock(&inbox.handles).push((s.lane, s.handle));
        // Release: pairs with the Acquire swap of `free_posted` (the
        // handle pushed before it is in the list).
        inbox.posted.store(true, Ordering::Release);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding it leaves the list whole (pushes and drains).
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A queue with its staging area.
pub struct Lane {
    /// Unique id.
    pub id: LaneId,
    /// Ids it had before its queue was made again on a restarted host
    /// (the last few): requests sent under them still hold their slots.
    former: Vec<LaneId>,
    /// Sessions other threads left to free (see [`release_sessions`]).
    inbox: Arc<Inbox>,
    /// The queue's connection epoch when `id` was given: the queue makes
    /// itself again on a restarted host, whose sessions are new.
    epoch: u64,
    q: Queue,
    /// Opened on the legacy path (the setting may change since): it
    /// reaches its staging area only.
    legacy: bool,
    stage: SharedBuf,
    /// Allocator arenas (base addresses) shared with the queue, so that
    /// callers' buffers inside them go to the device in place.
    arenas: Vec<u64>,
    /// Arenas the host refused to map (limits): staged without asking
    /// again.
    refused: Vec<u64>,
    free_slots: Vec<u16>,
    /// The large staging areas made, with their units taken; slot number
    /// `SLOTS + a * LARGE_SLOTS + i` is the run from unit `i` of area `a`.
    large: Vec<(SharedBuf, Runs)>,
    /// One could not be made, or the host refused to map it: no more
    /// tried.
    no_large: bool,
    /// Requests whose jobs were dropped unfinished, with their staging
    /// slots: each slot comes back when its completion does.
    orphans: Vec<(u64, u16)>,
    next_token: u64,
}

impl Lane {
    fn open(host: &Arc<HostConn>, kind: Kind) -> Result<Lane> {
        let legacy = config::legacy();
        let mut capa = Capability::new(kind.alg()).depth(SLOTS as u32 * 2);
        if legacy {
            capa = capa.flags(wrapdrive::CAPA_ALLOW_LEGACY);
        }
        capa.numa_node = current_node();
        let mut q = host.request_queue(&capa)?;
        q.set_legacy_planner(wd_sec_msg::LEGACY_PLANNER);
        let stage = SharedBuf::new(SLOT * SLOTS)?;
        let mut arenas = Vec::new();
        if !legacy {
            // The staging area's whole arena: the device then also reaches
            // the caller's buffers in it (this process's memory, touched
            // only by this library's requests) in place.
            // A host that refuses that much gets the staging area alone.
            let (base, len) = SharedSpan::of(&stage).arena();
            match q.share(base, len) {
                Ok(()) => arenas.push(base),
                Err(_) => q.share(stage.addr(), stage.len())?,
            }
        }
        Ok(Lane {
            id: next_lane_id(),
            former: Vec::new(),
            inbox: Arc::new(Inbox {
                generation: wrapdrive::fork_generation(),
                posted: AtomicBool::new(false),
                handles: Mutex::new(Vec::new()),
            }),
            epoch: q.epoch(),
            q,
            legacy,
            stage,
            arenas,
            refused: Vec::new(),
            free_slots: (0..SLOTS as u16).rev().collect(),
            large: Vec::new(),
            no_large: false,
            orphans: Vec::new(),
            next_token: 1,
        })
    }

    /// The buffer holding slot `s` (of the staging area, or a run of the
    /// large one) and the slot's offset in it.
    fn slot_buf(&self, s: u16) -> (&SharedBuf, u64) {
        match (s as usize).checked_sub(SLOTS) {
            None => (&self.stage, s as u64 * SLOT as u64),
            Some(i) => (
                &self.large[i / LARGE_SLOTS].0,
                ((i % LARGE_SLOTS) * LARGE_SLOT) as u64,
            ),
        }
    }

    /// Whether a request sent under `id` is on this lane's queue: sent
    /// under its id, or under one it had before a restart (then the queue
    /// sent it again or failed it, and its completion comes all the same).
    pub fn holds(&self, id: LaneId) -> bool {
        id == self.id || self.former.contains(&id)
    }

    /// Device address of slot `s`.
    pub fn slot_addr(&self, s: u16) -> u64 {
        let (buf, off) = self.slot_buf(s);
        buf.addr() + off
    }

    /// Make `span` reachable by the device at its own address: its arena
    /// is shared with the queue the first time (for the life of the lane:
    /// an arena is never unmapped, and the queue shares it again with a
    /// restarted host).
    pub fn reach(&mut self, span: &SharedSpan) -> Result<()> {
        let (base, len) = span.arena();
        if self.legacy {
            // A legacy queue reaches no shared memory but its own staging.
            return Err(CryptoError::invalid(
                "a legacy queue works in its staging area only",
            ));
        }
        if self.arenas.contains(&base) {
            return Ok(());
        }
        if self.refused.contains(&base) {
            return Err(CryptoError::invalid("the host refused to map this arena"));
        }
        match self.q.share(base, len) {
            Ok(()) => {
                self.arenas.push(base);
                Ok(())
            }
            Err(e) => {
                self.refused.push(base);
                Err(e.into())
            }
        }
    }

    /// Where the device can read `data` in place: its address, when in
    /// place is configured and it lies in WrapDrive shared memory this lane
    /// reaches (None: stage it).
    pub fn place(&mut self, data: &[u8]) -> Option<u64> {
        if !config::in_place() {
            return None;
        }
        let span = SharedSpan::locate(data.as_ptr() as u64, data.len() as u64)?;
        self.reach(&span).ok().map(|()| span.addr())
    }

    /// Copy `data` into slot `s` at `offset`.
    pub fn put(&self, s: u16, offset: usize, data: &[u8]) {
        let (buf, off) = self.slot_buf(s);
        buf.write(off + offset as u64, data);
    }

    /// Copy out of slot `s` at `offset`.
    pub fn get(&self, s: u16, offset: usize, out: &mut [u8]) {
        let (buf, off) = self.slot_buf(s);
        buf.read(off + offset as u64, out);
    }

    /// Whether this lane has a large staging area (see
    /// [`Lane::take_large`]).
    pub fn has_large(&self) -> bool {
        !self.large.is_empty()
    }

    /// Take a run of large units for `len` bytes (see [`LARGE_SLOT`]),
    /// making a large area if none has one free (up to [`LARGE_AREAS`]);
    /// its slot number, or None (the caller then uses the slots).
    pub fn take_large(&mut self, len: usize) -> Option<u16> {
        let n = len.div_ceil(LARGE_SLOT);
        if self.legacy || n > LARGE_SLOTS {
            // A legacy queue reaches its staging area only.
            return None;
        }
        let take = |large: &mut Vec<(SharedBuf, Runs)>| {
            large
                .iter_mut()
                .enumerate()
                .find_map(|(a, (_, runs))| runs.take(n).map(|i| a * LARGE_SLOTS + i))
        };
        let mut at = take(&mut self.large);
        if at.is_none() && !self.orphans.is_empty() {
            self.reap_orphans();
            at = take(&mut self.large);
        }
        if at.is_none() && !self.no_large && self.large.len() < LARGE_AREAS {
            // In the staging area's arena as a rule (already shared); a
            // host that refuses another arena leaves the lane without.
            let made = SharedBuf::new(LARGE_SLOT * LARGE_SLOTS)
                .ok()
                .filter(|buf| self.reach(&SharedSpan::of(buf)).is_ok());
            self.no_large = made.is_none();
            self.large.push((made?, Runs::new()));
            at = take(&mut self.large);
        }
        at.map(|i| (SLOTS + i) as u16)
    }

    /// Take a staging slot (None when all are in flight).
    pub fn take_slot(&mut self) -> Option<u16> {
        if self.free_slots.is_empty() {
            self.reclaim(1);
        }
        self.free_slots.pop()
    }

    /// Nobody waits for request `token` any more: its slot comes back
    /// with its completion (see [`Lane::reclaim`]).
    pub fn orphan(&mut self, token: u64, slot: u16) {
        self.orphans.push((token, slot));
    }

    /// Make room for `want` free slots out of orphaned requests: those
    /// that completed give theirs back, and while still short, the
    /// oldest of the others are waited for (the device is at work on
    /// them, and nobody else will).
    pub fn reclaim(&mut self, want: usize) {
        if self.orphans.is_empty() {
            return;
        }
        self.reap_orphans();
        // Only orphans holding a slot help: one holding a run of the
        // large area would be waited for for nothing.
        while self.free_slots.len() < want {
            let Some(k) = self.orphans.iter().position(|&(_, s)| (s as usize) < SLOTS) else {
                break;
            };
            let (token, slot) = self.orphans.remove(k);
            // A queue that fails gives nothing to wait for.
            let _ = self.wait(token);
            self.put_slot(slot);
        }
    }

    /// Give back the slots of orphaned requests that completed (a queue
    /// that fails gives all of them back).
    fn reap_orphans(&mut self) {
        let mut i = 0;
        while i < self.orphans.len() {
            match self.poll(self.orphans[i].0) {
                Ok(None) => i += 1,
                Ok(Some(_)) | Err(_) => {
                    let (_, slot) = self.orphans.swap_remove(i);
                    self.put_slot(slot);
                }
            }
        }
    }

    /// Staging slots free now (those of orphaned requests that completed
    /// included).
    pub fn free_slots(&mut self) -> usize {
        if !self.orphans.is_empty() {
            self.reap_orphans();
        }
        self.free_slots.len()
    }

    /// Give a slot (or a run of large units) back.
    pub fn put_slot(&mut self, s: u16) {
        match (s as usize).checked_sub(SLOTS) {
            None => self.free_slots.push(s),
            Some(i) => self.large[i / LARGE_SLOTS].1.put(i % LARGE_SLOTS),
        }
    }

    /// Requests in flight on this lane.
    pub fn in_flight(&self) -> usize {
        self.q.in_flight() as usize
    }

    /// Send without waiting; the token names the request in `poll`/`wait`.
    pub fn submit(&mut self, d: Desc) -> Result<u64> {
        let token = self.next_token;
        self.next_token += 1;
        if token % 256 == 1 {
            // Now and then, show the host (wd ls) where this process's
            // requests went.
            self.q.publish_stats(&crate::stats().to_array());
        }
        self.q.send(d, token)?;
        Ok(token)
    }

    /// The completion of `token` if it has arrived (non-blocking).
    pub fn poll(&mut self, token: u64) -> Result<Option<Desc>> {
        // The queue keeps other requests' completions for their own polls.
        Ok(self.q.recv_cookie(token)?.map(|c| c.desc))
    }

    /// Wait for the completion of `token`.
    pub fn wait(&mut self, token: u64) -> Result<Desc> {
        loop {
            if let Some(d) = self.poll(token)? {
                return Ok(d);
            }
            self.q.wait_completion(None)?;
        }
    }

    /// Send and wait: one request in flight from this caller.
    pub fn call(&mut self, d: Desc) -> Result<Desc> {
        let t = self.submit(d)?;
        self.wait(t)
    }

    /// Readable when a completion is signalled (after `arm`) or the host
    /// goes away: the fd an event loop waits on.
    pub fn wait_fd(&mut self) -> Result<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        Ok(self.q.wait_fd()?.as_raw_fd())
    }

    /// Ask to be signalled at the next completion; true when one is already
    /// there (then do not sleep).
    pub fn arm(&mut self) -> Result<bool> {
        Ok(self.q.arm_wait()?)
    }

    /// As [`Lane::arm`], and when a completion is already there, make the
    /// wait fd readable so an event loop that waits anyway wakes at once.
    pub fn arm_or_kick(&mut self) -> Result<bool> {
        let ready = self.arm()?;
        if ready {
            self.q.kick_wait()?;
        }
        Ok(ready)
    }

    /// After computing a request on the CPU inside an event loop, while
    /// other requests of this thread are on the device: when completions
    /// are waiting, make the wait fd readable and return true (the caller
    /// may yield to their owners); otherwise arm the fd for them. Nothing
    /// at all when no request is out.
    pub fn after_inline(&mut self) -> Result<bool> {
        if self.q.stashed() == 0 && self.in_flight() == 0 {
            return Ok(false);
        }
        let ready = self.q.completions_ready();
        if ready {
            self.q.kick_wait()?;
            return Ok(true);
        }
        self.q.arm_wait()?;
        Ok(false)
    }

    /// Hold the wait fd readable (`on`), or give a hold back: for an event
    /// loop's waiter that has no request of its own to be woken by (see
    /// `Queue::hold_wait_readable`).
    pub fn hold_readable(&mut self, on: bool) -> Result<()> {
        if on {
            self.q.hold_wait_readable()?;
        } else {
            self.q.release_wait_readable();
        }
        Ok(())
    }

    /// Withdraw `arm` and consume the signal.
    pub fn disarm(&mut self) {
        self.q.disarm_wait();
    }

    /// Create a device session; returns its handle.
    pub fn new_session(&mut self, alg: wd_sec_msg::Alg, key: &[u8]) -> Result<u64> {
        let key_addr = if key.len() > wd_sec_msg::INLINE_KEY {
            if key.len() > SLOT {
                return Err(CryptoError::Invalid("key too long".into()));
            }
            let s = self.take_slot().ok_or(CryptoError::Busy)?;
            self.put(s, 0, key);
            Some(s)
        } else {
            None
        };
        let addr = key_addr.map_or(0, |s| self.slot_addr(s));
        let r = self.call(SessionNew::new(alg, key, addr).encode());
        if let Some(s) = key_addr {
            // The key is in the host now; do not leave a copy behind.
            self.put(s, 0, &vec![0u8; key.len()]);
            self.put_slot(s);
        }
        let d = r?;
        device_status(d.status, "session creation")?;
        Ok(d.result)
    }

    /// A new device session holding a copy of digest session `handle`'s
    /// state: its handle.
    pub fn clone_session(&mut self, handle: u64) -> Result<u64> {
        let d = self.call(SessionClone { session: handle }.encode())?;
        device_status(d.status, "session copy")?;
        Ok(d.result)
    }

    /// Destroy a device session (best effort: the queue's teardown frees
    /// whatever is left).
    pub fn free_session(&mut self, handle: u64) {
        if let Ok(t) = self.submit(SessionFree { session: handle }.encode()) {
            // Nobody waits: drop the completion when it comes.
            self.q.forget(t);
        }
    }

    /// The record of session `handle`, opened on this lane.
    pub fn session(&self, handle: u64) -> Session {
        Session {
            lane: self.id,
            handle,
            inbox: Arc::downgrade(&self.inbox),
        }
    }

    /// Free the sessions other threads left in the inbox (those of an
    /// earlier id of this lane are gone with their host): a few at a time,
    /// waiting for each few, so the queue keeps room for the caller's own
    /// request whatever the number.
    fn free_posted(&mut self) {
        // Acquire: pairs with the Release store of `release_sessions`
        // (the handles pushed before it are in the list).
        if !self.inbox.posted.swap(false, Ordering::Acquire) {
            return;
        }
        let id = self.id;
        let handles: Vec<u64> = std::mem::take(&mut *lock(&self.inbox.handles))
            .into_iter()
            .filter_map(|(l, h)| (l == id).then_some(h))
            .collect();
        let mut sent = 0;
        for (i, &h) in handles.iter().enumerate() {
            let Ok(t) = self.submit(SessionFree { session: h }.encode()) else {
                break;
            };
            sent = i + 1;
            if sent % FREES_PER_CALL == 0 || sent == handles.len() {
                // The last of each few is waited for: the queue has room
                // again.
                if self.wait(t).is_err() {
                    break;
                }
            } else {
                // Nobody waits: dropped when it comes.
                self.q.forget(t);
            }
        }
        if sent < handles.len() {
            // The queue failed (the caller's request meets it too): what
            // is left waits for a later call.
            lock(&self.inbox.handles).extend(handles[sent..].iter().map(|&h| (id, h)));
            self.inbox.posted.store(true, Ordering::Relaxed);
        }
    }
}

/// Map a device completion status to an error.
pub fn device_status(status: i32, what: &str) -> Result<()> {
    match status {
        0 => Ok(()),
        -74 => Err(CryptoError::Auth),
        // In flight when the host restarted: its session is gone with the
        // old host, so the lane goes too (see `lane_call`).
        wrapdrive::STATUS_RESTARTED => Err(CryptoError::Device {
            status: Status::HostGone,
            message: format!("{what}: the host restarted with the request in flight"),
        }),
        s => Err(CryptoError::Device {
            status: Status::from_errno(-s),
            message: format!("{what} failed on the device: errno {}", -s),
        }),
    }
}

fn current_node() -> i32 {
    // The host places memory and queues by NUMA node; without a way to
    // tell ours, any node will do.
    -1
}

/// A thread's connection and lanes.
struct Channel {
    host: Option<Arc<HostConn>>,
    lanes: [Option<Lane>; 2],
    /// After a failure, when to try the host again.
    retry_at: [Option<Instant>; 2],
    /// Why the lane is missing during `retry_at`.
    lost: [NoLane; 2],
    /// Calls of `known_unavailable` since the clock was last read.
    clock_skips: u32,
}

thread_local! {
    static CHANNEL: RefCell<Channel> = const {
        RefCell::new(Channel {
            host: None,
            lanes: [None, None],
            retry_at: [None, None],
            lost: [NoLane::NoQueue, NoLane::NoQueue],
            clock_skips: 0,
        })
    };
}

fn slot_of(kind: Kind) -> usize {
    match kind {
        Kind::Cipher => 0,
        Kind::Digest => 1,
    }
}

/// Whether this thread has a lane of `kind`, may try to get one, or knows
/// it has none for now (it failed to get one, or lost it, and waits
/// before asking again: the router then sends requests straight to the
/// CPU, or with fallback off to their clear failure).
pub fn availability(kind: Kind, n: usize) -> Availability {
    CHANNEL
        .try_with(|c| {
            let Ok(mut c) = c.try_borrow_mut() else {
                return Availability::Open;
            };
            let i = slot_of(kind);
            if c.lanes[i].is_some() {
                return Availability::Open;
            }
            let Some(until) = c.retry_at[i] else {
                return Availability::Untried;
            };
            // Reading the clock costs as much as a small request: for small
            // ones look at it once in a while only.
            c.clock_skips = c.clock_skips.wrapping_add(1);
            if (n >= 4096 || c.clock_skips % 64 == 0) && Instant::now() >= until {
                return Availability::Untried;
            }
            Availability::Unavailable(c.lost[i])
        })
        .unwrap_or(Availability::Open)
}

/// See [`availability`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Availability {
    /// A lane is open (or this thread's lanes are busy in a call that
    /// routes from inside: it is then being used).
    Open,
    /// None yet; the next request may try to get one.
    Untried,
    /// None for now.
    Unavailable(NoLane),
}

/// Why a lane is not available: the CPU computes instead, and the reason
/// is counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoLane {
    /// No host, no device, or every queue in use.
    NoQueue,
    /// The host went away.
    HostGone,
}

/// Run `f` with this thread's lane of `kind`, opening it on first use.
/// `Err(NoLane)` when there is none (the caller computes on the CPU).
pub fn with_lane<T>(
    kind: Kind,
    f: impl FnOnce(&mut Lane) -> Result<T>,
) -> std::result::Result<Result<T>, NoLane> {
    lane_call(kind, true, f)
}

/// As [`with_lane`], but never opens a lane (for finishing and freeing).
pub fn with_open_lane<T>(
    kind: Kind,
    f: impl FnOnce(&mut Lane) -> Result<T>,
) -> std::result::Result<Result<T>, NoLane> {
    lane_call(kind, false, f)
}

fn lane_call<T>(
    kind: Kind,
    open: bool,
    f: impl FnOnce(&mut Lane) -> Result<T>,
) -> std::result::Result<Result<T>, NoLane> {
    // try_with: objects dropped during thread exit find no lane.
    let r = CHANNEL.try_with(|c| {
        let Ok(mut c) = c.try_borrow_mut() else {
            return Err(NoLane::NoQueue);
        };
        let i = slot_of(kind);
        let stale = c.host.as_ref().is_some_and(|h| h.is_stale());
        if stale {
            // A forked child: the parent's queues are not ours (dropping
            // them releases nothing of the parent's).
            c.lanes = [None, None];
            c.host = None;
        }
        if c.lanes[i].is_none() {
            if !open {
                return Err(NoLane::NoQueue);
            }
            if c.retry_at[i].is_some_and(|t| Instant::now() < t) {
                return Err(NoLane::NoQueue);
            }
            let attempt = Instant::now();
            let opened = (|| {
                if c.host.is_none() {
                    c.host = Some(config::connect()?);
                }
                Lane::open(c.host.as_ref().expect("set above"), kind)
            })();
            match opened {
                Ok(l) => c.lanes[i] = Some(l),
                Err(_) => {
                    let wait = wrapdrive::retry_after(RETRY_AFTER, attempt.elapsed());
                    c.retry_at[i] = Some(Instant::now() + wait);
                    c.lost[i] = NoLane::NoQueue;
                    return Err(NoLane::NoQueue);
                }
            }
        }
        let lane = c.lanes[i].as_mut().expect("opened above");
        if lane.q.epoch() != lane.epoch {
            // The queue was made again on a restarted host: the sessions
            // streams hold for this lane are gone with the old host, so
            // the lane takes a new id and streams open new sessions (those
            // with a request in flight at the restart have failed).
            if lane.former.len() == FORMER_IDS {
                lane.former.remove(0);
            }
            lane.former.push(lane.id);
            lane.id = next_lane_id();
            lane.epoch = lane.q.epoch();
        }
        lane.free_posted();
        let r = f(lane);
        if let Err(e) = &r {
            if e.host_gone() {
                // Drop the lane (and the connection): the next request
                // computes on the CPU until a host answers again.
                c.lanes[i] = None;
                c.host = None;
                c.retry_at[i] = Some(Instant::now() + RETRY_AFTER);
                c.lost[i] = NoLane::HostGone;
                return Err(NoLane::HostGone);
            }
        }
        Ok(r)
    });
    r.unwrap_or(Err(NoLane::NoQueue))
}

#[cfg(test)]
mod tests {
    use super::{Runs, LARGE_SLOTS};
    use proptest::prelude::*;

    proptest! {
        /// Runs against a model that marks units one by one: each run
        /// taken is the first free stretch long enough, never shares a
        /// unit with another, and comes back whole.
        #[test]
        fn runs_match_a_unit_model(ops in prop::collection::vec((0usize..40, any::<bool>()), 1..200)) {
            let mut runs = Runs::new();
            let mut taken = [false; LARGE_SLOTS];
            let mut held: Vec<(usize, usize)> = Vec::new();
            for (n, give_back) in ops {
                if give_back && !held.is_empty() {
                    let (i, len) = held.remove(n % held.len());
                    runs.put(i);
                    taken[i..i + len].iter_mut().for_each(|t| *t = false);
                    continue;
                }
                let want = (n > 0 && n <= LARGE_SLOTS)
                    .then(|| (0..=LARGE_SLOTS - n).find(|&i| taken[i..i + n].iter().all(|t| !t)))
                    .flatten();
                let got = runs.take(n);
                prop_assert_eq!(got, want);
                if let Some(i) = got {
                    taken[i..i + n].iter_mut().for_each(|t| *t = true);
                    held.push((i, n));
                }
            }
        }
    }

    #[test]
    fn empty_and_too_long_runs_are_refused() {
        let mut runs = Runs::new();
        assert_eq!(runs.take(0), None);
        assert_eq!(runs.take(LARGE_SLOTS + 1), None);
        assert_eq!(runs.take(LARGE_SLOTS), Some(0));
        assert_eq!(runs.take(1), None);
        runs.put(0);
        assert_eq!(runs.take(1), Some(0));
    }
}
