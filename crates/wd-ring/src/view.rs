//! The ring protocol applied to mapped shared memory.
//!
//! Ordering contract (see docs/rings.md):
//! * a producer writes an entry's body, then its sequence word with a
//!   Release store; the consumer polls that word with Acquire loads and
//!   reads the body once it holds the index it waits for;
//! * a consumer publishes how far it got (its head) with a Release store
//!   after it has copied entries out; the producer loads that head with
//!   Acquire, and only when its cached copy says the ring is full, before
//!   it overwrites them;
//! * sleeping uses the store-buffer pattern: the sleeper sets its flag and
//!   then re-reads the entry it waits for, the waker publishes an entry and
//!   then reads the flag, each side with a SeqCst fence between its store
//!   and its load, so at least one of them sees the other's store.
//!
//! Only atomics are ever referenced in shared memory; entry bodies are moved
//! with volatile copies, never borrowed.
#![allow(unsafe_code)]

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use crate::layout::{
    decode_cqe, decode_sqe, encode_cqe, encode_sqe, off, sqe_continued, Desc, EntryBody, Extension,
    RingLayout, CLIENT_STATS, ENTRY_SIZE, LATENCY_BUCKETS, QUEUE_STATS, RING_MAGIC, RING_VERSION,
};
use crate::RingError;

/// `sq_flags` bit: the engine sleeps; ring its doorbell after submitting.
pub const SQ_NEED_WAKEUP: u32 = 1;
/// `cq_flags` bit: the client sleeps; wake its completion line.
pub const CQ_WAITING: u32 = 1;

/// Liveness of the serving side, as the client sees it in the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum HostState {
    /// Requests are being served.
    Alive = 1,
    /// The queue was released or the host shut down.
    Stopped = 2,
    /// The host found the ring corrupt and stopped serving it.
    Broken = 3,
}

impl HostState {
    fn from_u32(v: u32) -> HostState {
        match v {
            1 => HostState::Alive,
            3 => HostState::Broken,
            _ => HostState::Stopped,
        }
    }
}

/// A ring in shared memory, seen from one side.
///
/// Local copies of the indices this side owns are kept here and never read
/// back from shared memory, so a hostile peer can only lie about its own
/// head, which is validated on every load, or write entries that are
/// decoded as untrusted data.
#[derive(Debug)]
pub struct RingView {
    base: *mut u8,
    layout: RingLayout,
    /// Next submission index to write (client) or read (host).
    sq_index: u32,
    /// Next completion index to read (client) or write (host).
    cq_index: u32,
    /// Last validated value of the peer's head of the ring this side
    /// produces into (client: `sq_head`; host: `cq_head`). Re-read only
    /// when it says the ring is full, so the hot path does not pull a cache
    /// line the peer just wrote.
    peer_head: u32,
}

// SAFETY: the view only touches shared memory through atomics and volatile
// copies, which are valid from any thread; the local indices move with it.
unsafe impl Send for RingView {}

impl RingView {
    /// Format fresh ring memory (host side) and return the host's view.
    ///
    /// # Safety
    /// `base` must be 64-byte aligned, valid for reads and writes of `len`
    /// bytes, and stay mapped for the lifetime of the returned view.
    pub unsafe fn create(
        base: *mut u8,
        len: usize,
        layout: RingLayout,
    ) -> Result<RingView, RingError> {
        if len < layout.total_bytes() {
            return Err(RingError::TooSmall {
                have: len,
                need: layout.total_bytes(),
            });
        }
        let v = RingView {
            base,
            layout,
            sq_index: 0,
            cq_index: 0,
            peer_head: 0,
        };
        v.word(off::MAGIC).store(RING_MAGIC, Ordering::Relaxed);
        v.word(off::VERSION).store(RING_VERSION, Ordering::Relaxed);
        v.word(off::DEPTH).store(layout.depth(), Ordering::Relaxed);
        v.word(off::ENTRY_SIZE)
            .store(ENTRY_SIZE as u32, Ordering::Relaxed);
        for o in [off::SQ_HEAD, off::SQ_FLAGS, off::CQ_HEAD, off::CQ_FLAGS] {
            v.word(o).store(0, Ordering::Relaxed);
        }
        // No entry may look full before it is written.
        for i in 0..layout.depth() {
            v.word(layout.sq_slot(i)).store(0, Ordering::Relaxed);
            v.word(layout.cq_slot(i)).store(0, Ordering::Relaxed);
        }
        // Release: pairs with the Acquire load of HOST_STATE in `attach`, so a
        // client that sees Alive also sees the header and entries above.
        v.word(off::HOST_STATE)
            .store(HostState::Alive as u32, Ordering::Release);
        Ok(v)
    }

    /// Attach to ring memory the host formatted (client side), checking the
    /// header against what the host announced. The view starts at the
    /// heads published in the ring (a fresh ring: zero).
    ///
    /// # Safety
    /// As for [`RingView::create`].
    pub unsafe fn attach(base: *mut u8, len: usize, depth: u32) -> Result<RingView, RingError> {
        let layout = RingLayout::new(depth)?;
        if len < layout.total_bytes() {
            return Err(RingError::TooSmall {
                have: len,
                need: layout.total_bytes(),
            });
        }
        let v = RingView {
            base,
            layout,
            sq_index: 0,
            cq_index: 0,
            peer_head: 0,
        };
        // Acquire: pairs with the Release store of HOST_STATE in `create`.
        let _ = v.word(off::HOST_STATE).load(Ordering::Acquire);
        if v.word(off::MAGIC).load(Ordering::Relaxed) != RING_MAGIC {
            return Err(RingError::BadHeader("magic"));
        }
        let version = v.word(off::VERSION).load(Ordering::Relaxed);
        if version != RING_VERSION {
            return Err(RingError::Version(version));
        }
        if v.word(off::DEPTH).load(Ordering::Relaxed) != depth {
            return Err(RingError::BadHeader("depth differs from the grant"));
        }
        if v.word(off::ENTRY_SIZE).load(Ordering::Relaxed) != ENTRY_SIZE as u32 {
            return Err(RingError::BadHeader("entry size"));
        }
        let sq_index = v.word(off::SQ_HEAD).load(Ordering::Relaxed);
        Ok(RingView {
            sq_index,
            cq_index: v.word(off::CQ_HEAD).load(Ordering::Relaxed),
            peer_head: sq_index,
            ..v
        })
    }

    /// The ring's layout.
    pub fn layout(&self) -> RingLayout {
        self.layout
    }

    /// The 32-bit word at `offset`: a header field, or an entry's sequence
    /// word (the entry's first four bytes).
    #[inline]
    fn word(&self, offset: usize) -> &AtomicU32 {
        // SAFETY: offset is a header offset or an entry offset from
        // RingLayout, 4-byte aligned and inside the mapping (its length was
        // checked at construction); atomics may be shared with another
        // process, and the mapping outlives `self`.
        unsafe { AtomicU32::from_ptr(self.base.add(offset).cast()) }
    }

    /// Write an entry's body (everything but its sequence word).
    #[inline]
    fn write_body(&self, offset: usize, b: &EntryBody, old_seq: u32) {
        // The whole line in four 16-byte stores, its sequence word rewritten
        // with the value it already holds (the previous lap's: the consumer
        // is not waiting for that one), so the line costs four store-buffer
        // entries instead of nine; the new sequence word follows.
        let line: [u64; 8] = [
            u64::from(old_seq) | (u64::from(b.word) << 32),
            b.rest[0],
            b.rest[1],
            b.rest[2],
            b.rest[3],
            b.rest[4],
            b.rest[5],
            b.rest[6],
        ];
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::__m128i;
            let p = self.base.wrapping_add(offset).cast::<__m128i>();
            for k in 0..4 {
                // SAFETY: two u64 and an SSE2 vector (part of x86_64) have
                // the same size, and every bit pattern is valid for both.
                let v: __m128i = unsafe { std::mem::transmute([line[2 * k], line[2 * k + 1]]) };
                // SAFETY: entry offsets come from RingLayout: 64-byte
                // aligned (so 16-byte aligned), the whole entry inside the
                // mapping. Volatile writes: the peer may read concurrently,
                // and no reference into shared memory is formed.
                unsafe { std::ptr::write_volatile(p.add(k), v) };
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let p = self.base.wrapping_add(offset).cast::<u64>();
            for (k, w) in line.iter().enumerate() {
                // SAFETY: as above, in 8-byte stores.
                unsafe { std::ptr::write_volatile(p.add(k), *w) };
            }
        }
    }

    /// Read an entry's body; any bits are a valid body.
    #[inline]
    fn read_body(&self, offset: usize) -> EntryBody {
        // SAFETY: as in write_body.
        unsafe {
            EntryBody {
                word: std::ptr::read_volatile(self.base.add(offset + 4).cast::<u32>()),
                rest: std::ptr::read_volatile(self.base.add(offset + 8).cast::<[u64; 7]>()),
            }
        }
    }

    fn write_ext(&self, offset: usize, e: &Extension) {
        // SAFETY: extension offsets come from RingLayout: 64-byte aligned,
        // inside the mapping; volatile as in write_body.
        unsafe { std::ptr::write_volatile(self.base.add(offset).cast::<Extension>(), *e) }
    }

    fn read_ext(&self, offset: usize) -> Extension {
        // SAFETY: as in write_ext; any bits are valid.
        unsafe { std::ptr::read_volatile(self.base.add(offset).cast::<Extension>()) }
    }

    /// Whether the entry at `offset` holds free-running index `i`.
    #[inline]
    fn holds(&self, offset: usize, i: u32) -> bool {
        // Acquire: pairs with the producer's Release store of the sequence
        // word (`put_sqe` for submissions, `complete` for completions), so
        // the body read after this sees what was written before it.
        self.word(offset).load(Ordering::Acquire) == self.layout.seq(i)
    }

    // ------------------------------------------------------------ client

    /// Client: free submission entries, re-reading the host's head only
    /// when the cached one leaves fewer than `want`.
    #[inline]
    fn sq_free(&mut self, want: usize) -> Result<usize, RingError> {
        let free = self.layout.depth() - self.layout.pending(self.peer_head, self.sq_index)?;
        if free as usize >= want {
            return Ok(free as usize);
        }
        // Acquire: pairs with the host's Release store of SQ_HEAD in
        // `fetch`; the host has finished copying entries we overwrite.
        let head = self.word(off::SQ_HEAD).load(Ordering::Acquire);
        let used = self.layout.pending(head, self.sq_index)?;
        self.peer_head = head;
        Ok((self.layout.depth() - used) as usize)
    }

    #[inline]
    fn put_sqe(&self, i: u32, d: &Desc, tag: u64) {
        let (body, ext) = encode_sqe(d, tag);
        if let Some(e) = ext {
            self.write_ext(self.layout.ext_slot(i), &e);
        }
        let o = self.layout.sq_slot(i);
        self.write_body(
            o,
            &body,
            self.layout.seq(i.wrapping_sub(self.layout.depth())),
        );
        // Release: pairs with the host's Acquire load of this sequence word
        // in `fetch` (`holds`), publishing the body and extension above.
        self.word(o).store(self.layout.seq(i), Ordering::Release);
    }

    /// Client: write as many of `descs` as fit (each entry published by its
    /// own sequence word, no shared index) and return how many were queued.
    /// Then call [`RingView::engine_needs_wakeup`] once for the batch.
    pub fn submit(&mut self, descs: &[Desc]) -> Result<usize, RingError> {
        self.submit_with(descs, |d| (d, d.tag))
    }

    /// Client: as [`RingView::submit`], each item giving its descriptor and
    /// the tag to send in place of the descriptor's own, so a library that
    /// tags requests itself needs no copy of them. `entry` is called once
    /// for each item queued, in order, and for no other.
    #[inline]
    pub fn submit_with<T>(
        &mut self,
        items: &[T],
        mut entry: impl FnMut(&T) -> (&Desc, u64),
    ) -> Result<usize, RingError> {
        let n = items.len().min(self.sq_free(items.len())?);
        for (k, it) in items[..n].iter().enumerate() {
            let (d, tag) = entry(it);
            self.put_sqe(self.sq_index.wrapping_add(k as u32), d, tag);
        }
        self.sq_index = self.sq_index.wrapping_add(n as u32);
        Ok(n)
    }

    /// Client, after a batch of `submit`s: whether the engine sleeps and
    /// needs its doorbell.
    #[inline]
    pub fn engine_needs_wakeup(&self) -> bool {
        // SeqCst fence: pairs with the fence in `host_prepare_sleep`; orders
        // our sequence-word stores before the SQ_FLAGS load (store-buffer
        // pattern).
        fence(Ordering::SeqCst);
        self.word(off::SQ_FLAGS).load(Ordering::Relaxed) & SQ_NEED_WAKEUP != 0
    }

    /// Client: copy up to `out.len()` completions out and free their
    /// entries (one head store for the batch).
    #[inline]
    pub fn reap(&mut self, out: &mut [Desc]) -> usize {
        let mut n = 0;
        while n < out.len() {
            let i = self.cq_index.wrapping_add(n as u32);
            let o = self.layout.cq_slot(i);
            if !self.holds(o, i) {
                break;
            }
            out[n] = decode_cqe(&self.read_body(o));
            n += 1;
        }
        if n > 0 {
            self.cq_index = self.cq_index.wrapping_add(n as u32);
            // Release: pairs with the host's Acquire load of CQ_HEAD in
            // `cq_space_for`; our copies are done before the host reuses
            // the entries.
            self.word(off::CQ_HEAD)
                .store(self.cq_index, Ordering::Release);
        }
        n
    }

    /// Client: whether a completion waits to be reaped (one load of the
    /// entry it would come in).
    #[inline]
    pub fn completions_ready(&self) -> bool {
        self.holds(self.layout.cq_slot(self.cq_index), self.cq_index)
    }

    /// Client, before sleeping: announce the wait; returns true when a
    /// completion arrived meanwhile (then do not sleep).
    pub fn client_prepare_wait(&self) -> bool {
        self.word(off::CQ_FLAGS)
            .fetch_or(CQ_WAITING, Ordering::SeqCst);
        // SeqCst fence: pairs with the fence in `complete`; our flag store is
        // ordered before our load of the completion entry.
        fence(Ordering::SeqCst);
        self.completions_ready()
    }

    /// Client, after waking: withdraw the wait announcement. Returns true
    /// when the host had taken it already, which means it signals (or has
    /// signalled) the completion line: exactly one side clears the flag.
    pub fn client_end_wait(&self) -> bool {
        self.word(off::CQ_FLAGS)
            .fetch_and(!CQ_WAITING, Ordering::Relaxed)
            & CQ_WAITING
            == 0
    }

    /// Client: publish counters for the host's attribute tree.
    pub fn publish_client_stats(&self, v: &[u64; CLIENT_STATS]) {
        for (i, x) in v.iter().enumerate() {
            // SAFETY: CLIENT_STATS words at an 8-aligned header offset inside
            // the mapping (the header page is 4096 bytes); atomics may be
            // shared with another process.
            let w = unsafe { AtomicU64::from_ptr(self.base.add(off::CLIENT_STATS + 8 * i).cast()) };
            w.store(*x, Ordering::Relaxed);
        }
    }

    /// Client: publish the client library's own queue counters
    /// ([`crate::QUEUE_STAT_NAMES`]).
    pub fn publish_queue_stats(&self, v: &[u64; QUEUE_STATS]) {
        for (i, x) in v.iter().enumerate() {
            // SAFETY: QUEUE_STATS words at an 8-aligned header offset
            // inside the mapping (the header page is 4096 bytes); atomics
            // may be shared with another process.
            let w = unsafe { AtomicU64::from_ptr(self.base.add(off::QUEUE_STATS + 8 * i).cast()) };
            w.store(*x, Ordering::Relaxed);
        }
    }

    /// Client: count one sampled request latency of `ns` nanoseconds in
    /// the ring's histogram ([`crate::latency_bucket`]). The client is the
    /// only writer, so a load and a store suffice.
    pub fn record_latency(&self, ns: u64) {
        let w = self.latency_word(crate::latency_bucket(ns));
        w.store(w.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
    }

    /// Client: divide every count of the latency histogram by 2^`shift`,
    /// so that it weighs the last seconds (a reader sees a mix of old and
    /// new counts meanwhile: they are only displayed).
    pub fn age_latency(&self, shift: u32) {
        for i in 0..LATENCY_BUCKETS {
            let w = self.latency_word(i);
            w.store(
                w.load(Ordering::Relaxed).checked_shr(shift).unwrap_or(0),
                Ordering::Relaxed,
            );
        }
    }

    fn latency_word(&self, i: usize) -> &AtomicU64 {
        assert!(i < LATENCY_BUCKETS, "latency bucket {i} out of range");
        // SAFETY: LATENCY_BUCKETS words at an 8-aligned header offset
        // inside the mapping (512 + 8 x 128 <= 4096), living as long as
        // the view; atomics may be shared with another process.
        unsafe { AtomicU64::from_ptr(self.base.add(off::LATENCY + 8 * i).cast()) }
    }

    /// Either side: what the host says about this ring.
    #[inline]
    pub fn host_state(&self) -> HostState {
        HostState::from_u32(self.word(off::HOST_STATE).load(Ordering::Acquire))
    }

    // ------------------------------------------------------------ host

    /// Host: free completion entries (validated against the client's head).
    pub fn cq_space(&mut self) -> Result<u32, RingError> {
        // More than can ever be free: always re-read the client's head.
        self.cq_space_for(self.layout.depth() + 1)
    }

    /// Host: free completion entries, re-reading the client's head only
    /// when the cached one leaves fewer than `want`.
    #[inline]
    fn cq_space_for(&mut self, want: u32) -> Result<u32, RingError> {
        let free = self.layout.depth() - self.layout.pending(self.peer_head, self.cq_index)?;
        if free >= want {
            return Ok(free);
        }
        // Acquire: pairs with the client's Release store of CQ_HEAD in `reap`.
        let head = self.word(off::CQ_HEAD).load(Ordering::Acquire);
        let used = self.layout.pending(head, self.cq_index)?;
        self.peer_head = head;
        Ok(self.layout.depth() - used)
    }

    /// Host: take up to `max` submissions, never more than there are free
    /// completion entries, appending copies to `out`. Returns how many were
    /// taken. Requests taken earlier and not yet completed are not counted:
    /// a caller that holds some passes a `max` less them (the engine does).
    pub fn fetch(&mut self, max: usize, out: &mut Vec<Desc>) -> Result<usize, RingError> {
        // An idle poll touches only the entry it waits for.
        if max == 0 || !self.submissions_ready() {
            return Ok(0);
        }
        let want = max.min(self.layout.depth() as usize) as u32;
        let room = want.min(self.cq_space_for(want)?);
        let mut n = 0;
        while n < room {
            let i = self.sq_index.wrapping_add(n);
            let o = self.layout.sq_slot(i);
            if !self.holds(o, i) {
                break;
            }
            let body = self.read_body(o);
            let ext = sqe_continued(&body).then(|| self.read_ext(self.layout.ext_slot(i)));
            out.push(decode_sqe(&body, ext.as_ref()));
            n += 1;
        }
        if n > 0 {
            self.sq_index = self.sq_index.wrapping_add(n);
            // Release: pairs with the client's Acquire load of SQ_HEAD in
            // `sq_free`; the copies above are complete.
            self.word(off::SQ_HEAD)
                .store(self.sq_index, Ordering::Release);
        }
        Ok(n as usize)
    }

    /// Host: whether a submission waits (one load of the entry it would
    /// come in).
    #[inline]
    pub fn submissions_ready(&self) -> bool {
        self.holds(self.layout.sq_slot(self.sq_index), self.sq_index)
    }

    /// Host: post completions (the caller took them with `fetch`, so there
    /// is room). Returns true when the client sleeps and must be signalled.
    pub fn complete(&mut self, descs: &[Desc]) -> Result<bool, RingError> {
        if descs.is_empty() {
            return Ok(false);
        }
        let want = descs.len().min(u32::MAX as usize) as u32;
        if (self.cq_space_for(want)? as usize) < descs.len() {
            return Err(RingError::Full);
        }
        for (k, d) in descs.iter().enumerate() {
            let i = self.cq_index.wrapping_add(k as u32);
            let o = self.layout.cq_slot(i);
            let old = self.layout.seq(i.wrapping_sub(self.layout.depth()));
            self.write_body(o, &encode_cqe(d), old);
            // Release: pairs with the client's Acquire load of this sequence
            // word in `reap` (`holds`), publishing the body above.
            self.word(o).store(self.layout.seq(i), Ordering::Release);
        }
        self.cq_index = self.cq_index.wrapping_add(descs.len() as u32);
        // SeqCst fence: pairs with the fence in `client_prepare_wait`; our
        // sequence-word stores are ordered before the CQ_FLAGS load.
        fence(Ordering::SeqCst);
        let flags = self.word(off::CQ_FLAGS).load(Ordering::Relaxed);
        // The read-modify-write decides: a client withdrawing its wait at
        // the same moment (`client_end_wait`) clears the flag first or
        // learns that the signal comes.
        Ok(flags & CQ_WAITING != 0
            && self
                .word(off::CQ_FLAGS)
                .fetch_and(!CQ_WAITING, Ordering::Relaxed)
                & CQ_WAITING
                != 0)
    }

    /// Host, before sleeping: set NEED_WAKEUP; returns true when work arrived
    /// meanwhile (then do not sleep).
    pub fn host_prepare_sleep(&self) -> bool {
        self.word(off::SQ_FLAGS)
            .fetch_or(SQ_NEED_WAKEUP, Ordering::SeqCst);
        // SeqCst fence: pairs with the fence in `engine_needs_wakeup`.
        fence(Ordering::SeqCst);
        self.submissions_ready()
    }

    /// Host, awake again: the client need not ring the doorbell.
    pub fn host_end_sleep(&self) {
        self.word(off::SQ_FLAGS)
            .fetch_and(!SQ_NEED_WAKEUP, Ordering::Relaxed);
    }

    /// Host: announce a state change to the client.
    pub fn set_host_state(&self, s: HostState) {
        // Release: pairs with the Acquire load in `host_state`.
        self.word(off::HOST_STATE)
            .store(s as u32, Ordering::Release);
    }

    /// Test support: write a raw header word as a hostile peer would
    /// ("sq_head", "cq_head"; anything else writes the magic).
    #[doc(hidden)]
    pub fn poke_index(&self, which: &str, v: u32) {
        let o = match which {
            "sq_head" => off::SQ_HEAD,
            "cq_head" => off::CQ_HEAD,
            _ => off::MAGIC,
        };
        self.word(o).store(v, Ordering::Release);
    }
}

/// Host: the counters a client published in its ring (any values: they are
/// only displayed).
///
/// # Safety
/// `base` must be the start of a live ring mapping (at least its 4096-byte
/// header), 8-byte aligned.
pub unsafe fn read_client_stats(base: *const u8) -> [u64; CLIENT_STATS] {
    let mut v = [0u64; CLIENT_STATS];
    for (i, x) in v.iter_mut().enumerate() {
        // SAFETY: per the contract, the header holds these words; atomics
        // tolerate a concurrent writer in another process.
        let w = unsafe { AtomicU64::from_ptr(base.add(off::CLIENT_STATS + 8 * i) as *mut u64) };
        *x = w.load(Ordering::Relaxed);
    }
    v
}

/// Host: the queue counters a client published in its ring (any values:
/// they are only displayed).
///
/// # Safety
/// As [`read_client_stats`].
pub unsafe fn read_queue_stats(base: *const u8) -> [u64; QUEUE_STATS] {
    let mut v = [0u64; QUEUE_STATS];
    for (i, x) in v.iter_mut().enumerate() {
        // SAFETY: per the contract, the header holds these words; atomics
        // tolerate a concurrent writer in another process.
        let w = unsafe { AtomicU64::from_ptr(base.add(off::QUEUE_STATS + 8 * i) as *mut u64) };
        *x = w.load(Ordering::Relaxed);
    }
    v
}

/// Host: the latency histogram a client keeps in its ring (any values:
/// they are only displayed).
///
/// # Safety
/// As [`read_client_stats`].
pub unsafe fn read_latency(base: *const u8) -> [u64; LATENCY_BUCKETS] {
    let mut v = [0u64; LATENCY_BUCKETS];
    for (i, x) in v.iter_mut().enumerate() {
        // SAFETY: per the contract, the header holds these words; atomics
        // tolerate a concurrent writer in another process.
        let w = unsafe { AtomicU64::from_ptr(base.add(off::LATENCY + 8 * i) as *mut u64) };
        *x = w.load(Ordering::Relaxed);
    }
    v
}

/// Client: whether the engine of the ring at `base` sleeps and must be
/// woken, for a client that changed something else the engine polls (a
/// device's register block): [`RingView::engine_needs_wakeup`] without a
/// view, so a handle that outlives no mapping can ask.
///
/// # Safety
/// `base` must be the start of a live ring mapping (at least its 4096-byte
/// header), 8-byte aligned.
pub unsafe fn engine_needs_wakeup_at(base: *const u8) -> bool {
    // SeqCst fence: pairs with the fence in `host_prepare_sleep`; orders
    // the caller's register stores before the SQ_FLAGS load.
    fence(Ordering::SeqCst);
    // SAFETY: per the contract, the header holds this word; atomics
    // tolerate a concurrent writer in another process.
    let w = unsafe { AtomicU32::from_ptr(base.add(off::SQ_FLAGS) as *mut u32) };
    w.load(Ordering::Relaxed) & SQ_NEED_WAKEUP != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Page-aligned test memory.
    pub(crate) struct Mem(Vec<u64>);
    impl Mem {
        pub(crate) fn new(bytes: usize) -> Mem {
            Mem(vec![0u64; bytes / 8 + 8])
        }
        pub(crate) fn ptr(&mut self) -> *mut u8 {
            let p = self.0.as_mut_ptr() as usize;
            ((p + 63) & !63) as *mut u8
        }
    }

    fn pair(depth: u32, mem: &mut Mem) -> (RingView, RingView) {
        let l = RingLayout::new(depth).unwrap();
        let p = mem.ptr();
        // SAFETY: mem holds total_bytes + 64 bytes, p is 64-aligned, and mem outlives the views in each test.
        let host = unsafe { RingView::create(p, l.total_bytes(), l) }.unwrap();
        // SAFETY: as above.
        let client = unsafe { RingView::attach(p, l.total_bytes(), depth) }.unwrap();
        (host, client)
    }

    fn d(tag: u64) -> Desc {
        Desc {
            tag,
            ..Desc::default()
        }
    }

    #[test]
    fn round_trip_and_backpressure() {
        let mut mem = Mem::new(RingLayout::new(4).unwrap().total_bytes());
        let (mut host, mut client) = pair(4, &mut mem);
        assert_eq!(client.submit(&[d(1), d(2), d(3), d(4), d(5)]).unwrap(), 4);
        let mut got = Vec::new();
        assert_eq!(host.fetch(16, &mut got).unwrap(), 4);
        assert!(!host.complete(&got).unwrap());
        // CQ full: further submissions are accepted but not fetched.
        assert_eq!(client.submit(&[d(5), d(6)]).unwrap(), 2);
        let mut more = Vec::new();
        assert_eq!(host.fetch(16, &mut more).unwrap(), 0);
        let mut out = [Desc::default(); 8];
        assert_eq!(client.reap(&mut out), 4);
        assert_eq!(
            out[..4].iter().map(|x| x.tag).collect::<Vec<_>>(),
            [1, 2, 3, 4]
        );
        assert_eq!(host.fetch(16, &mut more).unwrap(), 2);
    }

    #[test]
    fn indices_wrap_around_u32() {
        let l = RingLayout::new(4).unwrap();
        let mut mem = Mem::new(l.total_bytes());
        let (mut host, mut client) = pair(4, &mut mem);
        // Both sides just before the wrap, as after 2^32 - 3 requests.
        let start = u32::MAX - 2;
        host.sq_index = start;
        host.cq_index = start;
        host.peer_head = start;
        client.sq_index = start;
        client.cq_index = start;
        client.peer_head = start;
        client.poke_index("sq_head", start);
        client.poke_index("cq_head", start);
        for round in 0..6u64 {
            assert_eq!(client.submit(&[d(round), d(round + 100)]).unwrap(), 2);
            let mut got = Vec::new();
            assert_eq!(host.fetch(8, &mut got).unwrap(), 2);
            host.complete(&got).unwrap();
            let mut out = [Desc::default(); 4];
            assert_eq!(client.reap(&mut out), 2);
            assert_eq!((out[0].tag, out[1].tag), (round, round + 100));
        }
    }

    #[test]
    fn long_messages_use_the_extension_line() {
        let mut mem = Mem::new(RingLayout::new(4).unwrap().total_bytes());
        let (mut host, mut client) = pair(4, &mut mem);
        let mut long = d(7);
        long.payload[95] = 0x5a;
        long.payload[0] = 1;
        client.submit(&[long, d(8)]).unwrap();
        let mut got = Vec::new();
        host.fetch(4, &mut got).unwrap();
        assert_eq!(got, [long, d(8)]);
    }

    #[test]
    fn wakeup_flags() {
        let mut mem = Mem::new(RingLayout::new(4).unwrap().total_bytes());
        let (host, mut client) = pair(4, &mut mem);
        assert!(!host.host_prepare_sleep());
        client.submit(&[d(1)]).unwrap();
        assert!(client.engine_needs_wakeup());
        assert!(
            host.host_prepare_sleep(),
            "the entry is seen before sleeping"
        );
        host.host_end_sleep();
        assert!(!client.engine_needs_wakeup());
    }

    #[test]
    fn client_wait_flag_requests_signal() {
        let mut mem = Mem::new(RingLayout::new(4).unwrap().total_bytes());
        let (mut host, mut client) = pair(4, &mut mem);
        client.submit(&[d(1)]).unwrap();
        let mut got = Vec::new();
        host.fetch(4, &mut got).unwrap();
        assert!(!client.client_prepare_wait());
        assert!(
            host.complete(&got).unwrap(),
            "waiting client must be signalled"
        );
        assert!(!host.complete(&[]).unwrap());
        assert!(client.completions_ready());
    }

    #[test]
    fn hostile_heads_are_detected() {
        let mut mem = Mem::new(RingLayout::new(4).unwrap().total_bytes());
        let (mut host, mut client) = pair(4, &mut mem);
        // A client head ahead of what the host posted.
        client.poke_index("cq_head", 77);
        assert!(matches!(host.cq_space(), Err(RingError::Corrupt(_))));
        client.poke_index("cq_head", 0);
        // A host head ahead of what the client submitted, seen when the
        // client's cached head says the ring is full.
        host.poke_index("sq_head", 1000);
        assert_eq!(client.submit(&[d(1); 4]).unwrap(), 4);
        assert!(matches!(client.submit(&[d(1)]), Err(RingError::Corrupt(_))));
    }

    #[test]
    fn stale_entries_are_not_taken_again() {
        let mut mem = Mem::new(RingLayout::new(2).unwrap().total_bytes());
        let (mut host, mut client) = pair(2, &mut mem);
        client.submit(&[d(1), d(2)]).unwrap();
        let mut got = Vec::new();
        assert_eq!(host.fetch(2, &mut got).unwrap(), 2);
        // The entries still hold the previous lap: nothing new.
        assert!(!host.submissions_ready());
        assert_eq!(host.fetch(2, &mut got).unwrap(), 0);
    }

    #[test]
    fn attach_checks_header() {
        let l = RingLayout::new(8).unwrap();
        let mut mem = Mem::new(l.total_bytes());
        let p = mem.ptr();
        // SAFETY: p is valid for total_bytes and mem outlives the view.
        let r = unsafe { RingView::attach(p, l.total_bytes(), 8) };
        assert_eq!(r.unwrap_err(), RingError::BadHeader("magic"));
        // SAFETY: as above.
        let h = unsafe { RingView::create(p, l.total_bytes(), l) }.unwrap();
        // SAFETY: as above.
        let r = unsafe { RingView::attach(p, l.total_bytes(), 16) };
        assert!(r.is_err());
        // A version-1 ring is refused by name.
        h.word(off::VERSION).store(1, Ordering::Relaxed);
        // SAFETY: as above.
        let r = unsafe { RingView::attach(p, l.total_bytes(), 8) };
        assert_eq!(r.unwrap_err(), RingError::Version(1));
        assert!(RingError::Version(1).to_string().contains("version 2"));
    }
}
