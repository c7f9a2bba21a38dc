//! Invalidation as a command queue that engines acknowledge (the SMMU
//! command queue + CMD_SYNC model).
//!
//! The control side appends commands (invalidate a range of a domain, a
//! whole domain, everything, or a sync marker) to a ring shared by all
//! engines. Each engine keeps its own IOTLB and consumes the ring at the
//! edges of its *sections* (the stretches in which it translates and
//! touches memory). A sync appends a marker and waits until every engine
//! has either consumed it, or is outside any section: an engine between
//! sections consumes the ring before its next translation, so it can no
//! longer reach memory through what the commands invalidated.
//!
//! Ordering: an engine stores `busy` (non-zero) then loads the ring tail; the
//! control side stores the tail then loads `busy` (all SeqCst), so either the
//! engine sees the command before it translates, or the control side sees
//! the engine busy and waits for its acknowledgement (Dekker).

use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Instant;

use crate::iotlb::Iotlb;
use crate::table::Leaf;
use crate::{Access, Domain, Fault, FaultReason, Pasid, IOVA_LIMIT};

/// Commands the ring holds.
pub const CMDQ_ENTRIES: usize = 4096;

/// An invalidation command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Drop a domain's entries intersecting `[start, end)`.
    InvalidateRange {
        /// Domain tag.
        tag: u64,
        /// First byte.
        start: u64,
        /// One past the last byte.
        end: u64,
    },
    /// Drop every entry of a domain.
    InvalidateDomain {
        /// Domain tag.
        tag: u64,
    },
    /// Drop every entry.
    InvalidateAll,
    /// Completion marker: acknowledged once everything before it was consumed.
    Sync,
}

const K_RANGE: u64 = 1;
const K_DOMAIN: u64 = 2;
const K_ALL: u64 = 3;
const K_SYNC: u64 = 4;

#[derive(Default)]
struct Slot {
    /// Sequence number of the command held; `u64::MAX` while being written.
    seq: AtomicU64,
    kind: AtomicU64,
    tag: AtomicU64,
    start: AtomicU64,
    end: AtomicU64,
}

/// [`EngineState::busy`]: inside a section.
const IN_SECTION: u8 = 1;
/// [`EngineState::busy`]: a pin keeps translations past the section.
const PINNED: u8 = 2;

/// One engine as the command queue sees it.
#[derive(Debug, Default)]
struct EngineState {
    /// Highest sequence number acknowledged: consumed, and none after a
    /// pin.
    acked: AtomicU64,
    /// Highest sequence number consumed (applied to the IOTLB), pin or
    /// not: a sync for a domain the pin does not keep needs no more.
    consumed: AtomicU64,
    /// Busy: inside a section (`IN_SECTION`) and/or keeping translations
    /// for held requests (`PINNED`); 0 when idle. One word, so entering a
    /// section is one store.
    busy: AtomicU8,
    /// The engine is gone (its IOTLB with it).
    gone: AtomicBool,
    /// Tags of the domains a pin keeps translations of (None: any).
    pin_tags: Mutex<Option<Vec<u64>>>,
}

/// Counters of the invalidation machinery (for benchmarks and `wd ls`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InvalidationStats {
    /// Commands appended (syncs included).
    pub commands: u64,
    /// Syncs completed.
    pub syncs: u64,
    /// Syncs that had to wait for at least one busy engine.
    pub waited_syncs: u64,
    /// Nanoseconds spent waiting in syncs.
    pub wait_ns: u64,
}

/// The software IOMMU instance: the command queue shared by every engine and
/// every domain, and the source of domain tags.
pub struct Iommu {
    ring: Box<[Slot]>,
    tail: AtomicU64,
    producer: Mutex<()>,
    engines: RwLock<Vec<Arc<EngineState>>>,
    /// Domains whose flush-queue timeouts and stall timeouts
    /// [`Iommu::housekeeping`] enforces.
    tracked: Mutex<Vec<Weak<Domain>>>,
    commands: AtomicU64,
    syncs: AtomicU64,
    waited_syncs: AtomicU64,
    wait_ns: AtomicU64,
    /// Domains alive on this IOMMU (a leak check: back to its old value
    /// once every client is gone).
    domains: AtomicU64,
}

impl std::fmt::Debug for Iommu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Iommu")
            .field("tail", &self.tail.load(Ordering::Relaxed))
            .field("engines", &self.engines().len())
            .finish()
    }
}

impl Iommu {
    /// A new IOMMU with no engine and no domain.
    pub fn new() -> Arc<Iommu> {
        Arc::new(Iommu {
            ring: (0..CMDQ_ENTRIES).map(|_| Slot::default()).collect(),
            tail: AtomicU64::new(0),
            producer: Mutex::new(()),
            engines: RwLock::new(Vec::new()),
            tracked: Mutex::new(Vec::new()),
            commands: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            waited_syncs: AtomicU64::new(0),
            wait_ns: AtomicU64::new(0),
            domains: AtomicU64::new(0),
        })
    }

    /// A domain tag: unique in the process (not only on this IOMMU), so a
    /// gather or an IOTLB entry can never be confused between domains.
    pub(crate) fn new_tag(&self) -> u64 {
        static NEXT_TAG: AtomicU64 = AtomicU64::new(1);
        NEXT_TAG.fetch_add(1, Ordering::Relaxed)
    }

    /// Count a domain made (`true`) or dropped.
    pub(crate) fn count_domain(&self, made: bool) {
        if made {
            self.domains.fetch_add(1, Ordering::Relaxed);
        } else {
            self.domains.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Domains alive on this IOMMU.
    pub fn live_domains(&self) -> u64 {
        self.domains.load(Ordering::Relaxed)
    }

    fn engines(&self) -> std::sync::RwLockReadGuard<'_, Vec<Arc<EngineState>>> {
        self.engines.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Engines registered.
    pub fn engine_count(&self) -> usize {
        self.engines().len()
    }

    /// Append commands; returns the sequence number of the last one.
    pub fn submit(&self, cmds: &[Command]) -> u64 {
        let _g = self.producer.lock().unwrap_or_else(|e| e.into_inner());
        let mut seq = self.tail.load(Ordering::Relaxed);
        for c in cmds {
            seq += 1;
            let s = &self.ring[(seq % CMDQ_ENTRIES as u64) as usize];
            let (kind, tag, start, end) = match *c {
                Command::InvalidateRange { tag, start, end } => (K_RANGE, tag, start, end),
                Command::InvalidateDomain { tag } => (K_DOMAIN, tag, 0, 0),
                Command::InvalidateAll => (K_ALL, 0, 0, 0),
                Command::Sync => (K_SYNC, 0, 0, 0),
            };
            // Seqlock write: mark the slot busy, then the fields, then the
            // sequence number. Release fence: pairs with the Acquire fence in
            // `EngineTlb::read_slot`, so a reader that sees a field written
            // here also sees the busy mark.
            s.seq.store(u64::MAX, Ordering::Relaxed);
            fence(Ordering::Release);
            s.kind.store(kind, Ordering::Relaxed);
            s.tag.store(tag, Ordering::Relaxed);
            s.start.store(start, Ordering::Relaxed);
            s.end.store(end, Ordering::Relaxed);
            // Release: pairs with the Acquire load of `seq` in `read_slot`.
            s.seq.store(seq, Ordering::Release);
        }
        // SeqCst: pairs with the SeqCst store of `busy` in `EngineTlb::enter`
        // (Dekker with the SeqCst load of `busy` in `wait_for`). Also Release
        // for the page-table stores made before the commands.
        self.tail.store(seq, Ordering::SeqCst);
        self.commands
            .fetch_add(cmds.len() as u64, Ordering::Relaxed);
        seq
    }

    /// Append a sync marker and wait until every engine acknowledged it (or
    /// is outside any section). On return, no engine can use a translation
    /// that an earlier command invalidated.
    pub fn sync(&self) {
        let seq = self.submit(&[Command::Sync]);
        self.wait_for(seq, None);
    }

    /// Append a sync marker and wait until no engine can use a translation
    /// of domain `tag` that an earlier command invalidated: engines in a
    /// section, and engines whose pin keeps translations of that domain
    /// (one that holds only other domains' requests is not waited for).
    pub fn sync_domain(&self, tag: u64) {
        let seq = self.submit(&[Command::Sync]);
        self.wait_for(seq, Some(tag));
    }

    /// Invalidate `[start, end)` of a domain and sync.
    pub fn invalidate_range_sync(&self, tag: u64, start: u64, end: u64) {
        let seq = self.submit(&[Command::InvalidateRange { tag, start, end }, Command::Sync]);
        self.wait_for(seq, Some(tag));
    }

    /// Invalidate a whole domain and sync.
    pub fn invalidate_domain_sync(&self, tag: u64) {
        let seq = self.submit(&[Command::InvalidateDomain { tag }, Command::Sync]);
        self.wait_for(seq, Some(tag));
    }

    /// Invalidate everything and sync.
    pub fn invalidate_all_sync(&self) {
        let seq = self.submit(&[Command::InvalidateAll, Command::Sync]);
        self.wait_for(seq, None);
    }

    /// Whether engine `e` can no longer use what commands up to `seq`
    /// invalidated in domain `tag` (`None`: in any domain).
    fn engine_synced(e: &EngineState, seq: u64, tag: Option<u64>) -> bool {
        // SeqCst: see `submit`; also Acquire, so the engine's memory
        // accesses in its section happen before what we do next.
        let busy = e.busy.load(Ordering::SeqCst);
        if e.gone.load(Ordering::SeqCst) || e.acked.load(Ordering::SeqCst) >= seq || busy == 0 {
            return true;
        }
        // Outside any section and holding only other domains'
        // translations: it consumes the commands before its next
        // translation (as an idle engine does), and what it holds is not
        // ours. Or it consumed the commands (at a section's start or end:
        // a section that began after them translates afresh, one that
        // ended has done its accesses) and holds only other domains'
        // translations. A pinned engine acknowledges nothing past its pin,
        // and one that polls for its held requests is nearly always in a
        // section: another domain's sync waited for the gap between two of
        // its passes. `consumed` is read before the pin's domains: a
        // section that began before the sync and holds this domain's
        // memory says so (`pin_tags`, stored inside it) before it ends and
        // consumes.
        tag.is_some_and(|t| {
            let consumed = e.consumed.load(Ordering::SeqCst) >= seq;
            (busy & IN_SECTION == 0 || consumed)
                && e.pin_tags
                    .lock()
                    .unwrap_or_else(|x| x.into_inner())
                    .as_ref()
                    .is_some_and(|v| !v.contains(&t))
        })
    }

    /// [`Iommu::sync_domain`]'s wait, without waiting: whether every
    /// engine is done with what commands up to `seq` invalidated.
    pub(crate) fn synced(&self, seq: u64, tag: u64) -> bool {
        self.engines()
            .iter()
            .all(|e| Self::engine_synced(e, seq, Some(tag)))
    }

    fn wait_for(&self, seq: u64, tag: Option<u64>) {
        let engines = self.engines();
        let mut t0: Option<Instant> = None;
        for e in engines.iter() {
            let mut spins = 0u32;
            while !Self::engine_synced(e, seq, tag) {
                t0.get_or_insert_with(Instant::now);
                spins += 1;
                if spins < 128 {
                    std::hint::spin_loop();
                } else {
                    // Few cores: let the engine run.
                    std::thread::yield_now();
                }
            }
        }
        self.syncs.fetch_add(1, Ordering::Relaxed);
        if let Some(t) = t0 {
            self.waited_syncs.fetch_add(1, Ordering::Relaxed);
            self.wait_ns
                .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
    }

    /// Have [`Iommu::housekeeping`] look after `d` while it lives.
    pub fn track(&self, d: &Arc<Domain>) {
        let mut t = self.tracked.lock().unwrap_or_else(|e| e.into_inner());
        t.retain(|w| w.strong_count() > 0);
        t.push(Arc::downgrade(d));
    }

    /// The timers of the tracked domains: flush the flush queues whose
    /// oldest entry reached its timeout, abort stalls that waited too long.
    /// Call it periodically (a few times per flush-queue timeout). Returns
    /// (flush queues flushed, stalls aborted).
    pub fn housekeeping(&self, now: Instant) -> (usize, usize) {
        let doms: Vec<Arc<Domain>> = {
            let mut t = self.tracked.lock().unwrap_or_else(|e| e.into_inner());
            t.retain(|w| w.strong_count() > 0);
            t.iter().filter_map(Weak::upgrade).collect()
        };
        let mut flushed = 0;
        let mut expired = 0;
        for d in doms {
            flushed += d.flush_if_due(now) as usize;
            expired += d.expire_stalls(now);
        }
        (flushed, expired)
    }

    /// Counters so far.
    pub fn stats(&self) -> InvalidationStats {
        InvalidationStats {
            commands: self.commands.load(Ordering::Relaxed),
            syncs: self.syncs.load(Ordering::Relaxed),
            waited_syncs: self.waited_syncs.load(Ordering::Relaxed),
            wait_ns: self.wait_ns.load(Ordering::Relaxed),
        }
    }
}

/// Counters of one engine's IOTLB.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TlbStats {
    /// Lookups answered by the IOTLB.
    pub hits: u64,
    /// Lookups that walked the table.
    pub misses: u64,
    /// Commands consumed.
    pub commands: u64,
    /// Times the engine fell a full ring behind and dropped everything.
    pub overruns: u64,
    /// Large ranges given whole from a translation kept since an earlier
    /// section, without a lookup per page.
    pub kept: u64,
}

/// A range at least this long that translates into one run is kept
/// across sections: a device reaching the same large buffer part after
/// part of a long request (a decoder writing its output in place, whose
/// history is there) otherwise pays a lookup for every page of it in
/// every part, more pages than the IOTLB holds.
pub const KEEP_MIN: u64 = 1 << 20;

/// Ranges an engine keeps (a few long requests in parts at once).
const KEPT_RANGES: usize = 8;

/// A range translated whole into one run, kept until a command may have
/// changed it: dropped by exactly the commands that drop IOTLB entries
/// of its pages, so it lives no longer than they would.
#[derive(Clone, Copy, Debug)]
struct KeptRange {
    tag: u64,
    iova: u64,
    len: u64,
    access: Access,
    phys: u64,
}

#[derive(Debug, Default)]
struct KeptRanges {
    r: [Option<KeptRange>; KEPT_RANGES],
    /// Slot the next range replaces when none is free.
    next: usize,
}

impl KeptRanges {
    /// Where `[iova, iova+len)` of `tag` starts in host memory, if a kept
    /// range checked for `access` holds all of it.
    fn find(&self, tag: u64, iova: u64, len: u64, access: Access) -> Option<u64> {
        self.r.iter().flatten().find_map(|k| {
            (k.tag == tag && k.access == access && iova >= k.iova && iova + len <= k.iova + k.len)
                .then(|| k.phys + (iova - k.iova))
        })
    }

    fn keep(&mut self, k: KeptRange) {
        let i = match self.r.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                let i = self.next;
                self.next = (i + 1) % KEPT_RANGES;
                i
            }
        };
        self.r[i] = Some(k);
    }

    /// Drop the ranges `hit` selects.
    fn drop_if(&mut self, hit: impl Fn(&KeptRange) -> bool) {
        for slot in &mut self.r {
            if slot.as_ref().is_some_and(&hit) {
                *slot = None;
            }
        }
    }
}

/// An engine's side of the IOMMU: its IOTLB and its place in the command
/// queue. Owned by the engine thread; translations happen in a [`Section`].
pub struct EngineTlb {
    iommu: Arc<Iommu>,
    state: Arc<EngineState>,
    tlb: Iotlb,
    kept: KeptRanges,
    /// Next sequence number to read.
    cursor: u64,
    /// Commands up to here were applied before the oldest translation a
    /// device still uses outside any section (a request it holds).
    pinned: Option<u64>,
    /// Inside a section now.
    in_section: bool,
    stats: TlbStats,
}

impl std::fmt::Debug for EngineTlb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineTlb")
            .field("tlb", &self.tlb)
            .field("cursor", &self.cursor)
            .field("stats", &self.stats)
            .finish()
    }
}

impl EngineTlb {
    /// Register a new engine with `iommu`.
    pub fn new(iommu: &Arc<Iommu>) -> EngineTlb {
        let mut engines = iommu.engines.write().unwrap_or_else(|e| e.into_inner());
        // Commands before now cannot concern our (empty) IOTLB.
        let tail = iommu.tail.load(Ordering::SeqCst);
        let state = Arc::new(EngineState {
            acked: AtomicU64::new(tail),
            consumed: AtomicU64::new(tail),
            busy: AtomicU8::new(0),
            gone: AtomicBool::new(false),
            pin_tags: Mutex::new(None),
        });
        engines.push(state.clone());
        EngineTlb {
            iommu: iommu.clone(),
            state,
            tlb: Iotlb::new(),
            kept: KeptRanges::default(),
            cursor: tail + 1,
            pinned: None,
            in_section: false,
            stats: TlbStats::default(),
        }
    }

    /// Start translating: consume pending commands first.
    pub fn enter(&mut self) -> Section<'_> {
        // SeqCst: the Dekker pair of the tail store in `Iommu::submit`.
        self.state
            .busy
            .store(IN_SECTION | self.pinned_bit(), Ordering::SeqCst);
        self.in_section = true;
        self.consume();
        Section { e: self }
    }

    /// Keep the translations made at sequence `seq` (a [`Section::seq`])
    /// or later valid outside any section, for requests a device holds
    /// past the section it got them in (asynchronous devices); `None` when
    /// no request is held. While pinned, the engine acknowledges no
    /// command after `seq` and counts as busy, so a sync (an unshare, a
    /// domain's destruction) waits until the held requests complete and
    /// the pin moves on.
    pub fn pin(&mut self, seq: Option<u64>) {
        self.pinned = seq;
        self.consume();
        if !self.in_section {
            // SeqCst: as in Section's drop.
            self.state.busy.store(self.pinned_bit(), Ordering::SeqCst);
        }
    }

    fn pinned_bit(&self) -> u8 {
        if self.pinned.is_some() {
            PINNED
        } else {
            0
        }
    }

    /// The domains whose translations the pin keeps (None: any, or not
    /// known): a sync for another domain does not wait for the pin.
    pub fn pin_tags(&mut self, tags: Option<Vec<u64>>) {
        *self
            .state
            .pin_tags
            .lock()
            .unwrap_or_else(|x| x.into_inner()) = tags;
    }

    /// Consume pending commands outside a section (housekeeping; an idle
    /// engine need not call it).
    pub fn poll(&mut self) {
        self.consume();
    }

    /// Counters so far.
    pub fn stats(&self) -> TlbStats {
        self.stats
    }

    /// Entries cached.
    pub fn cached(&self) -> usize {
        self.tlb.occupied()
    }

    fn read_slot(&self, seq: u64) -> Option<Command> {
        let s = &self.iommu.ring[(seq % CMDQ_ENTRIES as u64) as usize];
        // Acquire: pairs with the Release store of `seq` in `submit`.
        if s.seq.load(Ordering::Acquire) != seq {
            return None;
        }
        let kind = s.kind.load(Ordering::Relaxed);
        let tag = s.tag.load(Ordering::Relaxed);
        let start = s.start.load(Ordering::Relaxed);
        let end = s.end.load(Ordering::Relaxed);
        // Acquire fence: pairs with the Release fence in `submit`; if a
        // producer overwrote the slot meanwhile, we see its busy mark.
        fence(Ordering::Acquire);
        if s.seq.load(Ordering::Relaxed) != seq {
            return None;
        }
        Some(match kind {
            K_RANGE => Command::InvalidateRange { tag, start, end },
            K_DOMAIN => Command::InvalidateDomain { tag },
            K_ALL => Command::InvalidateAll,
            _ => Command::Sync,
        })
    }

    fn consume(&mut self) {
        // SeqCst: the Dekker pair of `busy` (see `enter`).
        let tail = self.iommu.tail.load(Ordering::SeqCst);
        if self.cursor > tail {
            self.publish(tail);
            return;
        }
        if tail - self.cursor >= CMDQ_ENTRIES as u64 {
            self.overrun(tail);
        } else {
            while self.cursor <= tail {
                match self.read_slot(self.cursor) {
                    Some(c) => {
                        self.apply(c);
                        self.cursor += 1;
                    }
                    None => {
                        self.overrun(tail);
                        break;
                    }
                }
            }
        }
        self.publish(tail);
    }

    /// Acknowledge commands up to `tail` (all applied), but none after a
    /// pin: what a held request uses must stay mapped.
    fn publish(&self, tail: u64) {
        let ack = self.pinned.map_or(tail, |p| p.min(tail));
        // Release: our IOTLB no longer holds what the commands dropped.
        // Consumed before acknowledged, and after the pin's domains
        // (`pin_tags`, stored before the section that consumes ends).
        self.state.consumed.store(tail, Ordering::SeqCst);
        self.state.acked.store(ack, Ordering::SeqCst);
    }

    /// We fell a full ring behind: dropping everything covers whatever we
    /// missed.
    fn overrun(&mut self, tail: u64) {
        self.tlb.invalidate_all();
        self.kept.drop_if(|_| true);
        self.stats.overruns += 1;
        self.cursor = tail + 1;
    }

    fn apply(&mut self, c: Command) {
        self.stats.commands += 1;
        match c {
            Command::InvalidateRange { tag, start, end } => {
                self.tlb.invalidate_range(tag, start, end);
                self.kept
                    .drop_if(|k| k.tag == tag && k.iova < end && start < k.iova + k.len);
            }
            Command::InvalidateDomain { tag } => {
                self.tlb.invalidate_domain(tag);
                self.kept.drop_if(|k| k.tag == tag);
            }
            Command::InvalidateAll => {
                self.tlb.invalidate_all();
                self.kept.drop_if(|_| true);
            }
            Command::Sync => {}
        }
    }
}

impl Drop for EngineTlb {
    fn drop(&mut self) {
        self.state.gone.store(true, Ordering::SeqCst);
        let mut engines = self
            .iommu
            .engines
            .write()
            .unwrap_or_else(|e| e.into_inner());
        engines.retain(|e| !Arc::ptr_eq(e, &self.state));
    }
}

/// A stretch in which an engine translates and touches memory. Everything
/// it reaches through a translation must be done before the section ends,
/// and the domains it translates through must be kept alive (an `Arc`) for
/// the whole section.
pub struct Section<'a> {
    e: &'a mut EngineTlb,
}

impl Section<'_> {
    /// The command sequence this section's translations reflect: pass it
    /// to [`EngineTlb::pin`] to keep them valid past the section.
    pub fn seq(&self) -> u64 {
        self.e.cursor - 1
    }

    /// Pin from inside the section (see [`EngineTlb::pin`]): takes effect
    /// as the section ends, so no sync can slip between the section's end
    /// and the pin.
    pub fn pin(&mut self, seq: Option<u64>) {
        self.e.pinned = seq;
    }

    /// [`EngineTlb::pin_tags`] from inside the section (published before
    /// the section ends).
    pub fn pin_tags(&mut self, tags: Option<Vec<u64>>) {
        self.e.pin_tags(tags);
    }

    #[inline]
    fn leaf(&mut self, dom: &Domain, iova: u64) -> Option<Leaf> {
        let tag = dom.tag();
        if let Some(l) = self.e.tlb.lookup(tag, iova) {
            self.e.stats.hits += 1;
            return Some(l);
        }
        self.e.stats.misses += 1;
        let l = dom.walk(iova)?;
        self.e.tlb.insert(tag, &l);
        Some(l)
    }

    /// Translate one byte address through the IOTLB (walking on a miss).
    /// `pasid` names the endpoint in a fault.
    pub fn translate(
        &mut self,
        dom: &Domain,
        pasid: Pasid,
        iova: u64,
        access: Access,
    ) -> Result<u64, Fault> {
        let fault = |reason| Fault {
            iova,
            pasid,
            access,
            reason,
        };
        if iova >= IOVA_LIMIT {
            return Err(fault(FaultReason::OutOfRange));
        }
        let l = self.leaf(dom, iova).ok_or(fault(FaultReason::Unmapped))?;
        if !l.prot.allows(access) {
            return Err(fault(FaultReason::Permission));
        }
        Ok(l.phys + (iova - l.iova))
    }

    /// Translate `[iova, iova+len)` into physically contiguous runs
    /// (cleared first, in IOVA order); the first unmapped or forbidden byte
    /// is the fault. `len == 0` is an empty success. A range of
    /// [`KEEP_MIN`] bytes or more that is one run is kept for later
    /// sections, and a range inside it is answered at once until a
    /// command drops it.
    pub fn translate_range(
        &mut self,
        dom: &Domain,
        pasid: Pasid,
        iova: u64,
        len: u64,
        access: Access,
        runs: &mut Vec<(u64, u64)>,
    ) -> Result<(), Fault> {
        runs.clear();
        if len == 0 {
            return Ok(());
        }
        let fault = |at, reason| Fault {
            iova: at,
            pasid,
            access,
            reason,
        };
        if iova >= IOVA_LIMIT {
            return Err(fault(iova, FaultReason::OutOfRange));
        }
        // A range past the IOVA space faults at its first byte that is
        // unmapped, forbidden, or out of the space, in that order.
        let end = iova.saturating_add(len).min(IOVA_LIMIT);
        let beyond = iova.checked_add(len).is_none_or(|e| e > IOVA_LIMIT);
        let tag = dom.tag();
        let keep = len >= KEEP_MIN && !beyond;
        if keep {
            if let Some(phys) = self.e.kept.find(tag, iova, len, access) {
                self.e.stats.kept += 1;
                runs.push((phys, len));
                return Ok(());
            }
        }
        let mut a = iova;
        while a < end {
            let l = match self.e.tlb.lookup(tag, a) {
                Some(l) => {
                    self.e.stats.hits += 1;
                    l
                }
                None => {
                    // One descent caches the run of pages that follows.
                    self.e.stats.misses += 1;
                    let mut buf = [EMPTY_LEAF; WALK_RUN];
                    let n = dom.walk_run(a, end, &mut buf);
                    if n == 0 {
                        return Err(fault(a, FaultReason::Unmapped));
                    }
                    for l in &buf[..n] {
                        self.e.tlb.insert(tag, l);
                    }
                    buf[0]
                }
            };
            if !l.prot.allows(access) {
                return Err(fault(a, FaultReason::Permission));
            }
            let n = end.min(l.iova + l.size()) - a;
            let phys = l.phys + (a - l.iova);
            match runs.last_mut() {
                Some(last) if last.0 + last.1 == phys => last.1 += n,
                _ => runs.push((phys, n)),
            }
            a += n;
        }
        if beyond {
            runs.clear();
            return Err(fault(IOVA_LIMIT, FaultReason::OutOfRange));
        }
        if keep && runs.len() == 1 {
            self.e.kept.keep(KeptRange {
                tag,
                iova,
                len,
                access,
                phys: runs[0].0,
            });
        }
        Ok(())
    }
}

/// Leaves one IOTLB miss caches at most (a run of consecutive pages).
const WALK_RUN: usize = 16;

const EMPTY_LEAF: Leaf = Leaf {
    iova: 0,
    shift: 0,
    phys: 0,
    prot: crate::Prot::NONE,
};

impl Drop for Section<'_> {
    fn drop(&mut self) {
        // Drop what was invalidated while we worked, then leave: SeqCst
        // store (a Release) so our memory accesses happen before a sync that
        // sees us idle.
        self.e.consume();
        self.e.in_section = false;
        let pinned = self.e.pinned_bit();
        self.e.state.busy.store(pinned, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DomainConfig, Prot, PAGE_SIZE};
    use std::time::Duration;

    #[test]
    fn a_pin_holds_syncs_until_released() {
        let iommu = Iommu::new();
        let mut e = EngineTlb::new(&iommu);
        let seq = {
            let s = e.enter();
            s.seq()
        };
        // A device holds a request translated in that section.
        e.pin(Some(seq));
        let i2 = iommu.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let h = std::thread::spawn(move || {
            i2.sync();
            tx.send(()).unwrap();
        });
        // Sections come and go; the sync still waits for the pin.
        for _ in 0..5 {
            drop(e.enter());
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            rx.try_recv().is_err(),
            "a sync returned while a request was held"
        );
        // The held request completes: the next pin (none) lets it through.
        e.pin(None);
        rx.recv_timeout(Duration::from_secs(5))
            .expect("sync after the pin");
        h.join().unwrap();
        // Unpinned and outside a section: syncs are immediate again.
        let t = Instant::now();
        iommu.sync();
        assert!(t.elapsed() < Duration::from_millis(200));
    }

    /// An engine that keeps requests of domain 1 held polls for them, one
    /// section after another: a sync of domain 2 waited for a gap between
    /// two sections (the pin acknowledges nothing past it), which a busy
    /// engine rarely leaves. A section that began after the sync's
    /// commands translates afresh; with the pin holding only domain 1,
    /// domain 2's sync waits for the section it met, no more. Domain 1's
    /// sync still waits for the pin.
    #[test]
    fn another_domains_sync_does_not_wait_for_a_polling_pinned_engine() {
        let iommu = Iommu::new();
        let mut e = EngineTlb::new(&iommu);
        let seq = {
            let mut s = e.enter();
            s.pin_tags(Some(vec![1]));
            s.pin(Some(s.seq()));
            s.seq()
        };
        assert!(seq < u64::MAX);
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        // The engine: always in a section but for an instant.
        let h = std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                let s = e.enter();
                std::thread::sleep(Duration::from_millis(50));
                drop(s);
            }
            e
        });
        std::thread::sleep(Duration::from_millis(20));
        let t = Instant::now();
        for _ in 0..5 {
            iommu.sync_domain(2);
        }
        let other = t.elapsed();
        let i2 = iommu.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let own = std::thread::spawn(move || {
            i2.sync_domain(1);
            tx.send(()).unwrap();
        });
        std::thread::sleep(Duration::from_millis(200));
        let waited = rx.try_recv().is_err();
        stop.store(true, Ordering::Relaxed);
        let mut e = h.join().unwrap();
        e.pin(None);
        rx.recv_timeout(Duration::from_secs(5))
            .expect("sync after the pin");
        own.join().unwrap();
        assert!(
            waited,
            "domain 1's sync returned while its request was held"
        );
        // Each may wait for the section it met (50 ms), not longer.
        assert!(
            other < Duration::from_millis(1000),
            "five syncs of domain 2 took {other:?}: each waited for a gap between the sections of an engine holding only domain 1"
        );
    }

    #[test]
    fn sync_waits_for_a_busy_engine_only() {
        let iommu = Iommu::new();
        let mut e = EngineTlb::new(&iommu);
        // Idle engine: immediate.
        let t = Instant::now();
        iommu.sync();
        assert!(t.elapsed() < Duration::from_millis(200));
        assert_eq!(iommu.stats().waited_syncs, 0);
        // Busy engine: the sync ends after the section does.
        let (tx, rx) = std::sync::mpsc::channel();
        // (Held long: under Miri the main thread takes tens of
        // milliseconds from the section's start to its sync.)
        let h = std::thread::spawn(move || {
            let s = e.enter();
            tx.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(400));
            let released = Instant::now();
            drop(s);
            (e, released)
        });
        rx.recv().unwrap();
        iommu.sync();
        let returned = Instant::now();
        assert_eq!(iommu.stats().waited_syncs, 1);
        let (e, released) = h.join().unwrap();
        assert!(
            returned >= released,
            "the sync returned before the section ended"
        );
        assert_eq!(e.stats().commands, 2);
        drop(e);
        assert_eq!(iommu.engine_count(), 0);
    }

    #[test]
    fn unmap_reaches_other_engines_iotlb() {
        let iommu = Iommu::new();
        let d = Arc::new(Domain::new(&iommu, 1, DomainConfig::default()).unwrap());
        d.map(0, 0x10_0000, 4 * PAGE_SIZE, Prot::RW).unwrap();
        let mut a = EngineTlb::new(&iommu);
        let mut b = EngineTlb::new(&iommu);
        for e in [&mut a, &mut b] {
            assert!(e.enter().translate(&d, 1, 5, Access::Read).is_ok());
            assert_eq!(e.cached(), 1);
        }
        d.unmap(0, PAGE_SIZE).unwrap();
        for e in [&mut a, &mut b] {
            assert_eq!(
                e.enter()
                    .translate(&d, 1, 5, Access::Read)
                    .unwrap_err()
                    .reason,
                FaultReason::Unmapped
            );
        }
        assert_eq!(a.stats().hits, 0);
        assert_eq!(a.stats().misses, 2);
    }

    #[test]
    fn a_lagging_engine_drops_everything() {
        let iommu = Iommu::new();
        let d = Domain::new(&iommu, 1, DomainConfig::default()).unwrap();
        d.map(0, 0x10_0000, PAGE_SIZE, Prot::RW).unwrap();
        let mut e = EngineTlb::new(&iommu);
        assert!(e.enter().translate(&d, 1, 5, Access::Read).is_ok());
        for _ in 0..CMDQ_ENTRIES + 5 {
            iommu.submit(&[Command::InvalidateDomain { tag: 999 }]);
        }
        drop(e.enter());
        assert_eq!(e.stats().overruns, 1);
        assert_eq!(e.cached(), 0);
        // And keeps going normally afterwards.
        iommu.submit(&[Command::InvalidateAll]);
        e.poll();
        assert_eq!(e.stats().overruns, 1);
    }

    #[test]
    fn a_large_range_is_kept_until_a_command_touches_it() {
        const MIB: u64 = 1 << 20;
        let iommu = Iommu::new();
        let d = Domain::new(&iommu, 1, DomainConfig::default()).unwrap();
        // Host memory not 2 MiB aligned: pages, which an unmap may cut.
        let other = Domain::new(&iommu, 2, DomainConfig::default()).unwrap();
        d.map(0, 0x4000_1000, 4 * MIB, Prot::RW).unwrap();
        other.map(0, 0x8000_0000, MIB, Prot::RW).unwrap();
        let mut e = EngineTlb::new(&iommu);
        let mut runs = Vec::new();
        let tr = |e: &mut EngineTlb, iova, len, access, runs: &mut Vec<(u64, u64)>| {
            e.enter().translate_range(&d, 1, iova, len, access, runs)
        };
        tr(&mut e, 0, 4 * MIB, Access::Write, &mut runs).unwrap();
        assert_eq!(runs, [(0x4000_1000, 4 * MIB)]);
        let walked = e.stats().hits + e.stats().misses;
        // Again in a later section, and a range inside it: no lookups.
        tr(&mut e, 0, 4 * MIB, Access::Write, &mut runs).unwrap();
        assert_eq!(runs, [(0x4000_1000, 4 * MIB)]);
        tr(&mut e, MIB + 5, 2 * MIB, Access::Write, &mut runs).unwrap();
        assert_eq!(runs, [(0x4000_1000 + MIB + 5, 2 * MIB)]);
        assert_eq!(e.stats().kept, 2);
        assert_eq!(e.stats().hits + e.stats().misses, walked);
        // A small range, another access, or a range reaching past it are
        // translated page by page as before.
        tr(&mut e, 8, 4096, Access::Write, &mut runs).unwrap();
        tr(&mut e, 0, 2 * MIB, Access::Read, &mut runs).unwrap();
        assert_eq!(e.stats().kept, 2);
        assert!(tr(&mut e, 3 * MIB, 2 * MIB, Access::Write, &mut runs).is_err());
        // Commands for another domain or elsewhere in this one keep it.
        other.unmap(0, MIB).unwrap();
        iommu.submit(&[Command::InvalidateRange {
            tag: d.tag(),
            start: 8 * MIB,
            end: 9 * MIB,
        }]);
        tr(&mut e, 0, 4 * MIB, Access::Write, &mut runs).unwrap();
        assert_eq!(e.stats().kept, 3);
        // An unmap of one page in it drops it: the page faults, and a
        // page mapped there again elsewhere is found.
        d.unmap(2 * MIB, PAGE_SIZE).unwrap();
        let f = tr(&mut e, 0, 4 * MIB, Access::Write, &mut runs).unwrap_err();
        assert_eq!((f.iova, f.reason), (2 * MIB, FaultReason::Unmapped));
        d.map(2 * MIB, 0x9000_0000, PAGE_SIZE, Prot::RW).unwrap();
        tr(&mut e, 0, 4 * MIB, Access::Write, &mut runs).unwrap();
        assert_eq!(runs.len(), 3);
        assert_eq!(runs[1], (0x9000_0000, PAGE_SIZE));
        assert_eq!(e.stats().kept, 3);
        // Whole-domain and global commands, and an overrun, drop it too.
        d.unmap(2 * MIB, PAGE_SIZE).unwrap();
        d.map(2 * MIB, 0x4000_1000 + 2 * MIB, PAGE_SIZE, Prot::RW)
            .unwrap();
        let lag = || {
            for _ in 0..CMDQ_ENTRIES + 5 {
                iommu.submit(&[Command::InvalidateDomain { tag: 999 }]);
            }
        };
        let all = || {
            iommu.submit(&[Command::InvalidateAll]);
        };
        let dom = || {
            iommu.submit(&[Command::InvalidateDomain { tag: d.tag() }]);
        };
        for (i, drop_it) in [&lag as &dyn Fn(), &all, &dom].into_iter().enumerate() {
            tr(&mut e, 0, 4 * MIB, Access::Write, &mut runs).unwrap();
            tr(&mut e, 0, 4 * MIB, Access::Write, &mut runs).unwrap();
            let kept = e.stats().kept;
            drop_it();
            tr(&mut e, 0, 4 * MIB, Access::Write, &mut runs).unwrap();
            assert_eq!(e.stats().kept, kept, "command {i} kept the range");
        }
        assert_eq!(runs, [(0x4000_1000, 4 * MIB)]);
    }

    #[test]
    fn range_beyond_the_iova_space_faults() {
        let iommu = Iommu::new();
        let d = Domain::new(&iommu, 4, DomainConfig::default()).unwrap();
        let mut e = EngineTlb::new(&iommu);
        let mut s = e.enter();
        let mut runs = Vec::new();
        let f = s
            .translate_range(&d, 4, u64::MAX - 2, 8, Access::Read, &mut runs)
            .unwrap_err();
        assert_eq!((f.reason, f.pasid), (FaultReason::OutOfRange, 4));
        assert!(s
            .translate_range(&d, 4, 7, 0, Access::Read, &mut runs)
            .is_ok());
        assert!(runs.is_empty());
        assert_eq!(
            s.translate(&d, 4, IOVA_LIMIT, Access::Read)
                .unwrap_err()
                .reason,
            FaultReason::OutOfRange
        );
    }
}
