//! The ring protocol applied to mapped shared memory.
//!
//! Ordering contract (see docs/rings.md):
//! * a producer writes slots, then publishes its tail with a Release store;
//!   the consumer loads that tail with Acquire before reading those slots;
//! * a consumer publishes its head with a Release store after it has copied
//!   the slots out; the producer loads that head with Acquire before it
//!   overwrites them;
//! * sleeping uses the store-buffer pattern: the sleeper sets its flag and
//!   then re-reads the index, the waker publishes the index and then reads
//!   the flag, each side with a SeqCst fence between its store and its load,
//!   so at least one of them sees the other's store.
//!
//! Only atomics are ever referenced in shared memory; descriptors are moved
//! with volatile copies, never borrowed.
#![allow(unsafe_code)]

use std::sync::atomic::{fence, AtomicU32, Ordering};

use crate::layout::{off, Desc, RingLayout, CLIENT_STATS, DESC_SIZE, RING_MAGIC, RING_VERSION};
use crate::RingError;
use std::sync::atomic::AtomicU64;

/// `sq_flags` bit: the engine sleeps; ring its doorbell after submitting.
pub const SQ_NEED_WAKEUP: u32 = 1;
/// `cq_flags` bit: the client sleeps; signal its completion eventfd.
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
/// indices, which are validated on every load.
#[derive(Debug)]
pub struct RingView {
    base: *mut u8,
    layout: RingLayout,
    /// Next submission index to write (client) or read (host).
    sq_index: u32,
    /// Next completion index to read (client) or write (host).
    cq_index: u32,
    /// Last validated value of the peer's consumer index of the ring this
    /// side produces into (client: `sq_head`; host: `cq_head`). Re-read only
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
        v.word(off::DESC_SIZE)
            .store(DESC_SIZE as u32, Ordering::Relaxed);
        for o in [
            off::SQ_TAIL,
            off::SQ_HEAD,
            off::SQ_FLAGS,
            off::CQ_TAIL,
            off::CQ_HEAD,
            off::CQ_FLAGS,
        ] {
            v.word(o).store(0, Ordering::Relaxed);
        }
        // Release: pairs with the Acquire load of HOST_STATE in `attach`, so a
        // client that sees Alive also sees the header above.
        v.word(off::HOST_STATE)
            .store(HostState::Alive as u32, Ordering::Release);
        Ok(v)
    }

    /// Attach to ring memory the host formatted (client side), checking the
    /// header against what the host announced.
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
        if v.word(off::VERSION).load(Ordering::Relaxed) != RING_VERSION {
            return Err(RingError::BadHeader("version"));
        }
        if v.word(off::DEPTH).load(Ordering::Relaxed) != depth {
            return Err(RingError::BadHeader("depth differs from the grant"));
        }
        if v.word(off::DESC_SIZE).load(Ordering::Relaxed) != DESC_SIZE as u32 {
            return Err(RingError::BadHeader("descriptor size"));
        }
        // Start from wherever the host is (a fresh ring: zero).
        let sq_index = v.word(off::SQ_TAIL).load(Ordering::Relaxed);
        let v = RingView {
            sq_index,
            cq_index: v.word(off::CQ_HEAD).load(Ordering::Relaxed),
            peer_head: v.word(off::SQ_HEAD).load(Ordering::Relaxed),
            ..v
        };
        v.layout.pending(v.peer_head, sq_index)?;
        Ok(v)
    }

    /// The ring's layout.
    pub fn layout(&self) -> RingLayout {
        self.layout
    }

    fn word(&self, offset: usize) -> &AtomicU32 {
        // SAFETY: offset is one of the header offsets, 4-byte aligned and
        // inside the mapping (checked at construction); atomics may be shared
        // with another process, and the mapping outlives `self`.
        unsafe { AtomicU32::from_ptr(self.base.add(offset).cast()) }
    }

    fn write_slot(&self, offset: usize, d: &Desc) {
        // SAFETY: slot offsets come from RingLayout and lie within the mapping;
        // they are 128-byte aligned as Desc requires. A volatile write: the
        // peer may read concurrently, and we never form a reference.
        unsafe { std::ptr::write_volatile(self.base.add(offset).cast::<Desc>(), *d) }
    }

    fn read_slot(&self, offset: usize) -> Desc {
        // SAFETY: as in write_slot; every bit pattern is a valid Desc.
        unsafe { std::ptr::read_volatile(self.base.add(offset).cast::<Desc>()) }
    }

    // ------------------------------------------------------------ client

    /// Client: write as many of `descs` as fit, publish them with one tail
    /// store, and return how many were queued.
    pub fn submit(&mut self, descs: &[Desc]) -> Result<usize, RingError> {
        let mut free = self.layout.depth() - self.layout.pending(self.peer_head, self.sq_index)?;
        if (free as usize) < descs.len() {
            // Acquire: pairs with the host's Release store of SQ_HEAD in
            // `fetch`; the host has finished copying slots we overwrite.
            let head = self.word(off::SQ_HEAD).load(Ordering::Acquire);
            free = self.layout.depth() - self.layout.pending(head, self.sq_index)?;
            self.peer_head = head;
        }
        let n = descs.len().min(free as usize);
        for (i, d) in descs[..n].iter().enumerate() {
            self.write_slot(self.layout.sq_slot(self.sq_index.wrapping_add(i as u32)), d);
        }
        if n > 0 {
            self.sq_index = self.sq_index.wrapping_add(n as u32);
            // Release: pairs with the host's Acquire load of SQ_TAIL in
            // `fetch`, publishing the slot writes above.
            self.word(off::SQ_TAIL)
                .store(self.sq_index, Ordering::Release);
        }
        Ok(n)
    }

    /// Client, after `submit`: whether the engine sleeps and needs its doorbell.
    pub fn engine_needs_wakeup(&self) -> bool {
        // SeqCst fence: pairs with the fence in `host_prepare_sleep`; orders our
        // SQ_TAIL store before the SQ_FLAGS load (store-buffer pattern).
        fence(Ordering::SeqCst);
        self.word(off::SQ_FLAGS).load(Ordering::Relaxed) & SQ_NEED_WAKEUP != 0
    }

    /// Client: copy up to `out.len()` completions out and free their slots.
    pub fn reap(&mut self, out: &mut [Desc]) -> Result<usize, RingError> {
        // Acquire: pairs with the host's Release store of CQ_TAIL in `complete`.
        let tail = self.word(off::CQ_TAIL).load(Ordering::Acquire);
        let ready = self.layout.pending(self.cq_index, tail)?;
        let n = out.len().min(ready as usize);
        for (i, o) in out[..n].iter_mut().enumerate() {
            *o = self.read_slot(self.layout.cq_slot(self.cq_index.wrapping_add(i as u32)));
        }
        if n > 0 {
            self.cq_index = self.cq_index.wrapping_add(n as u32);
            // Release: pairs with the host's Acquire load of CQ_HEAD in
            // `cq_space_for`; our copies are done before the host reuses slots.
            self.word(off::CQ_HEAD)
                .store(self.cq_index, Ordering::Release);
        }
        Ok(n)
    }

    /// Client: completions waiting to be reaped.
    pub fn completions_ready(&self) -> Result<u32, RingError> {
        // Acquire: as in `reap`.
        let tail = self.word(off::CQ_TAIL).load(Ordering::Acquire);
        self.layout.pending(self.cq_index, tail)
    }

    /// Client: requests submitted and not yet taken by the host.
    pub fn submissions_pending(&self) -> Result<u32, RingError> {
        let head = self.word(off::SQ_HEAD).load(Ordering::Acquire);
        self.layout.pending(head, self.sq_index)
    }

    /// Client, before sleeping: announce the wait; returns true when a
    /// completion arrived meanwhile (then do not sleep).
    pub fn client_prepare_wait(&self) -> Result<bool, RingError> {
        self.word(off::CQ_FLAGS)
            .fetch_or(CQ_WAITING, Ordering::SeqCst);
        // SeqCst fence: pairs with the fence in `complete`; our flag store is
        // ordered before our CQ_TAIL load.
        fence(Ordering::SeqCst);
        Ok(self.completions_ready()? > 0)
    }

    /// Client, after waking: withdraw the wait announcement.
    pub fn client_end_wait(&self) {
        self.word(off::CQ_FLAGS)
            .fetch_and(!CQ_WAITING, Ordering::Relaxed);
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

    /// Either side: what the host says about this ring.
    pub fn host_state(&self) -> HostState {
        HostState::from_u32(self.word(off::HOST_STATE).load(Ordering::Acquire))
    }

    // ------------------------------------------------------------ host

    /// Host: free completion slots (validated against the client's head).
    pub fn cq_space(&mut self) -> Result<u32, RingError> {
        // More than can ever be free: always re-read the client's head.
        self.cq_space_for(self.layout.depth() + 1)
    }

    /// Host: free completion slots, re-reading the client's head only when
    /// the cached one leaves fewer than `want`.
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

    /// Host: take up to `max` submissions, never more than there is room to
    /// complete, appending copies to `out`. Returns how many were taken.
    pub fn fetch(&mut self, max: usize, out: &mut Vec<Desc>) -> Result<usize, RingError> {
        // Acquire: pairs with the client's Release store of SQ_TAIL in `submit`.
        let tail = self.word(off::SQ_TAIL).load(Ordering::Acquire);
        let avail = self.layout.pending(self.sq_index, tail)?;
        if avail == 0 || max == 0 {
            return Ok(0);
        }
        let want = avail.min(max.min(u32::MAX as usize) as u32);
        let n = (want as usize).min(self.cq_space_for(want)? as usize);
        for i in 0..n {
            out.push(self.read_slot(self.layout.sq_slot(self.sq_index.wrapping_add(i as u32))));
        }
        if n > 0 {
            self.sq_index = self.sq_index.wrapping_add(n as u32);
            // Release: pairs with the client's Acquire load of SQ_HEAD in
            // `submit`; the copies above are complete.
            self.word(off::SQ_HEAD)
                .store(self.sq_index, Ordering::Release);
        }
        Ok(n)
    }

    /// Host: whether submissions are waiting (validated).
    pub fn submissions_ready(&self) -> Result<u32, RingError> {
        let tail = self.word(off::SQ_TAIL).load(Ordering::Acquire);
        self.layout.pending(self.sq_index, tail)
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
        for (i, d) in descs.iter().enumerate() {
            self.write_slot(self.layout.cq_slot(self.cq_index.wrapping_add(i as u32)), d);
        }
        self.cq_index = self.cq_index.wrapping_add(descs.len() as u32);
        // Release: pairs with the client's Acquire load of CQ_TAIL in `reap`.
        self.word(off::CQ_TAIL)
            .store(self.cq_index, Ordering::Release);
        // SeqCst fence: pairs with the fence in `client_prepare_wait`.
        fence(Ordering::SeqCst);
        let flags = self.word(off::CQ_FLAGS).load(Ordering::Relaxed);
        if flags & CQ_WAITING != 0 {
            self.word(off::CQ_FLAGS)
                .fetch_and(!CQ_WAITING, Ordering::Relaxed);
            return Ok(true);
        }
        Ok(false)
    }

    /// Host, before sleeping: set NEED_WAKEUP; returns true when work arrived
    /// meanwhile (then do not sleep).
    pub fn host_prepare_sleep(&self) -> Result<bool, RingError> {
        self.word(off::SQ_FLAGS)
            .fetch_or(SQ_NEED_WAKEUP, Ordering::SeqCst);
        // SeqCst fence: pairs with the fence in `engine_needs_wakeup`.
        fence(Ordering::SeqCst);
        Ok(self.submissions_ready()? > 0)
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

    /// Test support: write a raw header word as a hostile peer would.
    #[doc(hidden)]
    pub fn poke_index(&self, which: &str, v: u32) {
        let o = match which {
            "sq_tail" => off::SQ_TAIL,
            "sq_head" => off::SQ_HEAD,
            "cq_tail" => off::CQ_TAIL,
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
        assert_eq!(client.reap(&mut out).unwrap(), 4);
        assert_eq!(
            out[..4].iter().map(|x| x.tag).collect::<Vec<_>>(),
            [1, 2, 3, 4]
        );
        assert_eq!(host.fetch(16, &mut more).unwrap(), 2);
    }

    #[test]
    fn wakeup_flags() {
        let mut mem = Mem::new(RingLayout::new(4).unwrap().total_bytes());
        let (host, mut client) = pair(4, &mut mem);
        assert!(!host.host_prepare_sleep().unwrap());
        client.submit(&[d(1)]).unwrap();
        assert!(client.engine_needs_wakeup());
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
        assert!(!client.client_prepare_wait().unwrap());
        assert!(
            host.complete(&got).unwrap(),
            "waiting client must be signalled"
        );
        assert!(!host.complete(&[]).unwrap());
    }

    #[test]
    fn hostile_indices_are_detected() {
        let mut mem = Mem::new(RingLayout::new(4).unwrap().total_bytes());
        let (mut host, client) = pair(4, &mut mem);
        client.poke_index("sq_tail", 1000);
        let mut got = Vec::new();
        assert!(matches!(
            host.fetch(4, &mut got),
            Err(RingError::Corrupt(_))
        ));
        client.poke_index("sq_tail", 0);
        client.poke_index("cq_head", 77);
        assert!(matches!(host.cq_space(), Err(RingError::Corrupt(_))));
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
        let _h = unsafe { RingView::create(p, l.total_bytes(), l) }.unwrap();
        // SAFETY: as above.
        let r = unsafe { RingView::attach(p, l.total_bytes(), 16) };
        assert!(r.is_err());
    }
}
