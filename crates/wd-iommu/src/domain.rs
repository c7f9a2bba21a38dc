//! Domains: an address space (page table), its invalidation mode (strict or
//! deferred through a flush queue), its fault log and fault policy.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{fence, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::faults::{FaultQueue, FaultRecord};
use crate::gather::{IotlbGather, Release};
use crate::table::{Leaf, PageTable, TableAlloc, TableBudget};
use crate::{
    Access, Fault, FaultReason, Iommu, IommuError, Mapping, Pasid, Prot, IOVA_LIMIT, PAGE_SIZE,
};

/// Default cap on the pages one domain may map (16 GiB).
pub const DEFAULT_MAX_PAGES: u64 = 1 << 22;
/// Default cap on one domain's table pages (64 MiB of tables).
pub const DEFAULT_MAX_TABLE_PAGES: u32 = 1 << 14;
/// Default flush-queue size: a deferred domain flushes after this many
/// queued unmaps (Linux's IOVA_FQ_SIZE).
pub const DEFAULT_FQ_SIZE: usize = 256;
/// Default flush-queue timeout: a deferred unmap waits at most this long for
/// its flush (Linux's IOVA_FQ_TIMEOUT).
pub const DEFAULT_FQ_TIMEOUT: Duration = Duration::from_millis(10);
/// Default cap on requests stalled at once in one domain.
pub const DEFAULT_MAX_STALLED: usize = 64;
/// Default time a stalled request waits for its resolution before it is
/// aborted.
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(5);

/// When an unmap's invalidation happens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum InvalidationMode {
    /// Unmap returns after every engine dropped the entries.
    Strict = 0,
    /// Unmaps queue in a flush queue; a later domain-wide flush (when the
    /// queue is full or its oldest entry times out) invalidates them all and
    /// only then releases their table pages and memory.
    Deferred = 1,
}

/// What a translation fault does to the request that hit it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FaultPolicy {
    /// The request fails with a fault status.
    Abort = 0,
    /// The request waits until the client resolves the fault (maps the page
    /// and retries it, or aborts it).
    Stall = 1,
}

/// How the client resolves a stalled request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Resolution {
    /// Run the request again (its translation is retried).
    Retry,
    /// Fail it with a fault status.
    Abort,
}

/// What became of a reported fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultOutcome {
    /// The request must fail; the fault is record `seq`.
    Aborted {
        /// Fault record number.
        seq: u64,
    },
    /// The request waits; resolve it with [`Domain::resume`] using `stag`
    /// (the fault record number).
    Stalled {
        /// Stall tag.
        stag: u64,
    },
}

/// Settings of a domain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainConfig {
    /// Most pages mapped at once.
    pub max_pages: u64,
    /// Most table pages (root included).
    pub max_table_pages: u32,
    /// Invalidation mode.
    pub mode: InvalidationMode,
    /// Fault policy.
    pub fault_policy: FaultPolicy,
    /// Flush-queue size (deferred mode).
    pub fq_size: usize,
    /// Flush-queue timeout (deferred mode).
    pub fq_timeout: Duration,
    /// Most requests stalled at once.
    pub max_stalled: usize,
    /// How long a stalled request waits.
    pub stall_timeout: Duration,
    /// Fault records kept.
    pub fault_capacity: usize,
    /// Use 2 MiB / 1 GiB blocks when size and alignment allow.
    pub blocks: bool,
    /// Table pages this domain shares with others of its owner (none: only
    /// `max_table_pages` bounds it).
    pub table_budget: Option<Arc<TableBudget>>,
}

impl Default for DomainConfig {
    fn default() -> Self {
        DomainConfig {
            max_pages: DEFAULT_MAX_PAGES,
            max_table_pages: DEFAULT_MAX_TABLE_PAGES,
            mode: InvalidationMode::Strict,
            fault_policy: FaultPolicy::Abort,
            fq_size: DEFAULT_FQ_SIZE,
            fq_timeout: DEFAULT_FQ_TIMEOUT,
            max_stalled: DEFAULT_MAX_STALLED,
            stall_timeout: DEFAULT_STALL_TIMEOUT,
            fault_capacity: FaultQueue::DEFAULT_CAPACITY,
            blocks: true,
            table_budget: None,
        }
    }
}

/// Counters and sizes of a domain.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DomainStats {
    /// Bytes mapped.
    pub mapped_bytes: u64,
    /// Table pages allocated (root and pages awaiting invalidation included).
    pub table_pages: usize,
    /// Unmaps waiting in the flush queue.
    pub fq_pending: usize,
    /// Flushes of the flush queue completed.
    pub flushes: u64,
    /// Requests stalled now.
    pub stalled: usize,
}

struct FqEntry {
    /// Flushes completed when this entry was queued.
    counter: u64,
    tables: Vec<u32>,
    releases: Vec<Release>,
}

struct Ctl {
    alloc: TableAlloc,
    pages: u64,
    fq: VecDeque<FqEntry>,
    /// IOVA ranges waiting in the flush queue (start -> end), and the
    /// longest, to find an overlap in O(log n).
    fq_ranges: BTreeMap<u64, u64>,
    fq_max_len: u64,
    /// When the oldest entry of the flush queue was queued.
    fq_since: Option<Instant>,
    /// A flush the timers began without waiting: the sequence of its
    /// invalidation's sync, how many entries at the front of the queue it
    /// covers, and when it began.
    fq_begun: Option<(u64, usize, Instant)>,
}

impl Ctl {
    fn fq_overlaps(&self, lo: u64, hi: u64) -> bool {
        self.fq_ranges
            .range(lo.saturating_sub(self.fq_max_len)..hi)
            .any(|(&s, &e)| s < hi && e > lo)
    }
}

struct Stall {
    at: Instant,
    resolution: Option<Resolution>,
}

struct FaultState {
    log: FaultQueue,
    stalls: BTreeMap<u64, Stall>,
}

/// One address space: a page table walked lock-free by engines, changed by
/// one control thread at a time.
pub struct Domain {
    tag: u64,
    pasid: Pasid,
    iommu: Arc<Iommu>,
    table: PageTable,
    cfg: DomainConfig,
    ctl: Mutex<Ctl>,
    faults: Mutex<FaultState>,
    resolved: AtomicU64,
    mode: AtomicU8,
    policy: AtomicU8,
    flushes: AtomicU64,
}

impl std::fmt::Debug for Domain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Domain")
            .field("tag", &self.tag)
            .field("pasid", &self.pasid)
            .field("mode", &self.mode())
            .finish()
    }
}

fn check_range(iova: u64, size: u64) -> Result<u64, IommuError> {
    if size == 0 || iova % PAGE_SIZE != 0 || size % PAGE_SIZE != 0 {
        return Err(IommuError::Misaligned { iova, size });
    }
    iova.checked_add(size)
        .filter(|&e| e <= IOVA_LIMIT)
        .ok_or(IommuError::OutOfRange { iova, size })
}

impl Domain {
    /// An empty domain on `iommu`; `pasid` names it in fault records.
    /// Its root table is charged to its budget like any table page:
    /// [`IommuError::TableBudget`] when the budget cannot take it.
    pub fn new(iommu: &Arc<Iommu>, pasid: Pasid, cfg: DomainConfig) -> Result<Domain, IommuError> {
        let budget = cfg.table_budget.clone();
        let (table, alloc) =
            PageTable::new(cfg.max_table_pages, budget.clone()).ok_or_else(|| {
                let b = budget.as_ref().expect("only a budget refuses a root");
                IommuError::TableBudget {
                    used_pages: b.used(),
                    limit_pages: b.limit(),
                }
            })?;
        iommu.count_domain(true);
        Ok(Domain {
            tag: iommu.new_tag(),
            pasid,
            iommu: iommu.clone(),
            table,
            ctl: Mutex::new(Ctl {
                alloc,
                pages: 0,
                fq: VecDeque::new(),
                fq_ranges: BTreeMap::new(),
                fq_max_len: 0,
                fq_since: None,
                fq_begun: None,
            }),
            faults: Mutex::new(FaultState {
                log: FaultQueue::new(cfg.fault_capacity),
                stalls: BTreeMap::new(),
            }),
            resolved: AtomicU64::new(0),
            mode: AtomicU8::new(cfg.mode as u8),
            policy: AtomicU8::new(cfg.fault_policy as u8),
            flushes: AtomicU64::new(0),
            cfg,
        })
    }

    /// The tag its IOTLB entries carry (unique, never reused).
    pub fn tag(&self) -> u64 {
        self.tag
    }

    /// The id its faults carry by default.
    pub fn pasid(&self) -> Pasid {
        self.pasid
    }

    /// Its settings at creation.
    pub fn config(&self) -> &DomainConfig {
        &self.cfg
    }

    /// The IOMMU it invalidates through.
    pub fn iommu(&self) -> &Arc<Iommu> {
        &self.iommu
    }

    fn ctl(&self) -> MutexGuard<'_, Ctl> {
        self.ctl.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn fault_state(&self) -> MutexGuard<'_, FaultState> {
        self.faults.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn walk(&self, iova: u64) -> Option<Leaf> {
        self.table.walk(iova)
    }

    pub(crate) fn walk_run(&self, iova: u64, end: u64, out: &mut [Leaf]) -> usize {
        self.table.walk_run(iova, end, out)
    }

    // ------------------------------------------------------------ mapping

    /// Map `[iova, iova+size)` to `[phys, phys+size)` with blocks where
    /// possible, then [`Domain::iotlb_sync_map`]. All page aligned; the
    /// range must be free. Atomic: on error nothing is mapped.
    pub fn map(&self, iova: u64, phys: u64, size: u64, prot: Prot) -> Result<(), IommuError> {
        self.map_sg(iova, &[(phys, size)], prot).map(|_| ())
    }

    /// Map a scatter list (physical runs, page aligned) at consecutive IOVAs
    /// from `iova` in one call with one map-side sync. Returns the bytes
    /// mapped. Atomic: on error nothing is mapped.
    pub fn map_sg(&self, iova: u64, sg: &[(u64, u64)], prot: Prot) -> Result<u64, IommuError> {
        let mut total = 0u64;
        for &(phys, len) in sg {
            if phys % PAGE_SIZE != 0 || len % PAGE_SIZE != 0 || len == 0 {
                return Err(IommuError::Misaligned {
                    iova: phys,
                    size: len,
                });
            }
            if phys.checked_add(len).is_none() {
                return Err(IommuError::OutOfRange {
                    iova: phys,
                    size: len,
                });
            }
            total = total.checked_add(len).ok_or(IommuError::OutOfRange {
                iova,
                size: u64::MAX,
            })?;
        }
        let end = check_range(iova, total)?;
        let mut c = self.ctl();
        let npages = total / PAGE_SIZE;
        if c.pages.saturating_add(npages) > self.cfg.max_pages {
            return Err(IommuError::LimitExceeded {
                limit_pages: self.cfg.max_pages,
            });
        }
        // An IOVA waiting in the flush queue may still be cached by an
        // engine with its old translation: flush before reusing it.
        if c.fq_overlaps(iova, end) {
            self.flush_fq(&mut c);
        }
        let mut retried = false;
        while let Err(stop) = self
            .table
            .map(&mut c.alloc, iova, end, sg, prot, self.cfg.blocks)
        {
            // Undo what this call mapped (engines may have cached it, so
            // invalidate): the map stays atomic.
            self.rollback(&mut c, iova, stop.at, stop.overlap.is_none());
            if let Some(a) = stop.overlap {
                return Err(IommuError::Overlap { iova: a });
            }
            // Out of table pages: retry once after releasing the pages the
            // flush queue holds.
            if retried || c.fq.is_empty() {
                if std::mem::take(&mut c.alloc.over_budget) {
                    let b = self
                        .cfg
                        .table_budget
                        .as_ref()
                        .expect("only a budget refuses");
                    return Err(IommuError::TableBudget {
                        used_pages: b.used(),
                        limit_pages: b.limit(),
                    });
                }
                return Err(IommuError::TableLimit {
                    limit_pages: self.cfg.max_table_pages,
                });
            }
            c.alloc.over_budget = false;
            self.flush_fq(&mut c);
            retried = true;
        }
        c.pages += npages;
        drop(c);
        self.iotlb_sync_map(iova, total);
        Ok(total)
    }

    fn rollback(&self, c: &mut Ctl, iova: u64, end: u64, out_of_pages: bool) {
        let mut g = IotlbGather::new();
        if end > iova {
            self.table.unmap(&mut c.alloc, iova, end, &mut g);
        }
        // Out of table pages: the tables this call linked on its way down
        // to `end` (where the next one was refused) hold nothing; unlink
        // them too (nothing is mapped at `end`, no leaf goes).
        if out_of_pages && end < IOVA_LIMIT {
            self.table.unmap(&mut c.alloc, end, end + PAGE_SIZE, &mut g);
        }
        if g.is_empty() {
            g.take();
            return;
        }
        let parts = g.take();
        if let Some((s, e)) = parts.range {
            self.iommu.invalidate_range_sync(self.tag, s, e);
        } else {
            // Table pages of ours only: walked in sections through us.
            self.iommu.sync_domain(self.tag);
        }
        self.table.free_pages(&mut c.alloc, &parts.tables);
    }

    /// Make new mappings visible to engines. No IOTLB entry can be stale
    /// after a map (only valid leaves are cached and a map never changes
    /// one), so this is a publication fence, not an invalidation.
    pub fn iotlb_sync_map(&self, _iova: u64, _size: u64) {
        // SeqCst fence: pairs with the SeqCst operations engines start a
        // section with, so a section starting after this sees the entries.
        fence(Ordering::SeqCst);
    }

    /// Unmap `[iova, iova+size)` and invalidate it (strict: before
    /// returning; deferred: through the flush queue). Returns the bytes
    /// unmapped. Unmapping part of a block is refused and changes nothing.
    pub fn unmap(&self, iova: u64, size: u64) -> Result<u64, IommuError> {
        let mut g = IotlbGather::new();
        let r = self.unmap_fast(iova, size, &mut g);
        self.iotlb_sync(&mut g);
        r
    }

    /// Unmap without invalidating: the range and the freed table pages go
    /// into `gather` for a later [`Domain::iotlb_sync`]. Until then engines
    /// may still use the old translations.
    pub fn unmap_fast(
        &self,
        iova: u64,
        size: u64,
        gather: &mut IotlbGather,
    ) -> Result<u64, IommuError> {
        let end = check_range(iova, size)?;
        if !gather.bind(self.tag) {
            return Err(IommuError::GatherMismatch);
        }
        let mut c = self.ctl();
        if c.alloc.blocks > 0 {
            if let Some(l) = self.table.split_block(iova, end) {
                return Err(IommuError::WouldSplitBlock {
                    iova: l.iova,
                    size: l.size(),
                });
            }
        }
        let bytes = self.table.unmap(&mut c.alloc, iova, end, gather);
        c.pages -= bytes / PAGE_SIZE;
        Ok(bytes)
    }

    /// Complete the unmaps gathered in `gather`: strict mode invalidates its
    /// range on every engine and waits, then frees its table pages and drops
    /// its releases; deferred mode queues all that in the flush queue.
    pub fn iotlb_sync(&self, gather: &mut IotlbGather) {
        if gather.is_empty() {
            gather.take();
            return;
        }
        let parts = gather.take();
        if let Some(tag) = parts.domain.filter(|&t| t != self.tag) {
            // Another domain's unmaps: invalidate them under their own tag
            // and wait before the releases go; their table pages belong to
            // that domain's arena and are left unused (never handed to
            // ours, whose walkers they would corrupt).
            match parts.range {
                Some((s, e)) => self.iommu.invalidate_range_sync(tag, s, e),
                // (Only that domain's sections and held requests can use
                // what goes: not every engine that holds requests.)
                None => self.iommu.sync_domain(tag),
            }
            drop(parts.releases);
            return;
        }
        match self.mode() {
            InvalidationMode::Strict => {
                match parts.range {
                    Some((s, e)) => self.iommu.invalidate_range_sync(self.tag, s, e),
                    None => self.iommu.sync_domain(self.tag),
                }
                self.table.free_pages(&mut self.ctl().alloc, &parts.tables);
                drop(parts.releases);
            }
            InvalidationMode::Deferred => {
                let mut c = self.ctl();
                if c.fq.is_empty() {
                    c.fq_since = Some(Instant::now());
                }
                if let Some((s, e)) = parts.range {
                    let end = c.fq_ranges.entry(s).or_insert(e);
                    *end = (*end).max(e);
                    c.fq_max_len = c.fq_max_len.max(e - s);
                }
                c.fq.push_back(FqEntry {
                    counter: self.flushes.load(Ordering::Relaxed),
                    tables: parts.tables,
                    releases: parts.releases,
                });
                // The size bound here; the time bound in `flush_if_due`.
                if c.fq.len() >= self.cfg.fq_size.max(1) {
                    self.flush_fq(&mut c);
                }
            }
        }
    }

    /// Flush the flush queue: invalidate the whole domain on every engine,
    /// wait, then release every queued entry.
    fn flush_fq(&self, c: &mut Ctl) {
        if c.fq.is_empty() {
            return;
        }
        self.iommu.invalidate_domain_sync(self.tag);
        let done = self.flushes.load(Ordering::Relaxed);
        let mut releases = Vec::new();
        while let Some(e) = c.fq.pop_front() {
            debug_assert!(e.counter <= done);
            self.table.free_pages(&mut c.alloc, &e.tables);
            releases.extend(e.releases);
        }
        c.fq_ranges.clear();
        c.fq_max_len = 0;
        c.fq_since = None;
        c.fq_begun = None;
        self.flushes.store(done + 1, Ordering::Release);
        drop(releases);
    }

    /// Flush the flush queue if its oldest entry has waited its timeout;
    /// returns whether it completed a flush. This is the flush queue's time
    /// bound: call it periodically ([`Iommu::housekeeping`] does, for
    /// tracked domains) so a deferred unmap is never held much longer than
    /// the timeout.
    ///
    /// It never waits (the timers serve every domain from one thread, the
    /// stall timeouts too): a domain whose lock is held (a flush or a
    /// teardown waiting for the engines) is left for a later call; a due
    /// flush queue has its invalidation submitted at once (every engine
    /// drops the stale entries before its next translation) and its
    /// entries released as soon as no engine can use them any more: at
    /// once when none is busy, else at a later call, once the sections
    /// have ended and the pins (requests a device holds, for as long as
    /// their client keeps them coming) have moved past the invalidation.
    pub fn flush_if_due(&self, now: Instant) -> bool {
        let mut c = match self.ctl.try_lock() {
            Ok(c) => c,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return false,
        };
        if c.fq_begun.is_none() {
            let due = c
                .fq_since
                .is_some_and(|t| now.saturating_duration_since(t) >= self.cfg.fq_timeout);
            if !due {
                return false;
            }
            let seq = self.iommu.submit(&[
                crate::Command::InvalidateDomain { tag: self.tag },
                crate::Command::Sync,
            ]);
            c.fq_begun = Some((seq, c.fq.len(), now));
        }
        let Some((seq, n, began)) = c.fq_begun else {
            return false;
        };
        if !self.iommu.synced(seq, self.tag) {
            return false;
        }
        c.fq_begun = None;
        let mut releases = Vec::new();
        for _ in 0..n.min(c.fq.len()) {
            let e = c.fq.pop_front().expect("counted");
            self.table.free_pages(&mut c.alloc, &e.tables);
            releases.extend(e.releases);
        }
        if c.fq.is_empty() {
            c.fq_ranges.clear();
            c.fq_max_len = 0;
            c.fq_since = None;
            let done = self.flushes.load(Ordering::Relaxed);
            self.flushes.store(done + 1, Ordering::Release);
        } else {
            // Queued after the invalidation began: theirs is the next
            // flush. Their ranges stay in `fq_ranges` (a superset: a map
            // over one flushes first), and the counter does not move (an
            // entry queued since it was last read is not complete yet).
            c.fq_since = Some(began);
        }
        drop(c);
        drop(releases);
        true
    }

    /// Invalidate the whole domain, wait, and complete the flush queue.
    pub fn flush_iotlb_all(&self) {
        let mut c = self.ctl();
        if c.fq.is_empty() {
            self.iommu.invalidate_domain_sync(self.tag);
        } else {
            self.flush_fq(&mut c);
        }
    }

    /// Flushes of the flush queue completed. A deferred unmap queued when
    /// this read `n` is complete (no engine can reach it, its memory is
    /// released) once it reads more than `n`.
    pub fn flush_counter(&self) -> u64 {
        self.flushes.load(Ordering::Acquire)
    }

    /// Unmap everything and complete every invalidation (queue teardown).
    pub fn clear(&self) -> u64 {
        let mut c = self.ctl();
        let mut g = IotlbGather::new();
        let bytes = self.table.unmap(&mut c.alloc, 0, IOVA_LIMIT, &mut g);
        c.pages = 0;
        let parts = g.take();
        self.iommu.invalidate_domain_sync(self.tag);
        self.table.free_pages(&mut c.alloc, &parts.tables);
        let mut releases = parts.releases;
        if !c.fq.is_empty() {
            while let Some(e) = c.fq.pop_front() {
                self.table.free_pages(&mut c.alloc, &e.tables);
                releases.extend(e.releases);
            }
            c.fq_ranges.clear();
            c.fq_max_len = 0;
            c.fq_since = None;
            c.fq_begun = None;
            self.flushes.fetch_add(1, Ordering::Release);
        }
        drop(c);
        drop(releases);
        bytes
    }

    /// Current invalidation mode.
    pub fn mode(&self) -> InvalidationMode {
        match self.mode.load(Ordering::Relaxed) {
            0 => InvalidationMode::Strict,
            _ => InvalidationMode::Deferred,
        }
    }

    /// Change the invalidation mode (leaving deferred mode flushes first).
    pub fn set_mode(&self, m: InvalidationMode) {
        let mut c = self.ctl();
        self.mode.store(m as u8, Ordering::Relaxed);
        if m == InvalidationMode::Strict {
            self.flush_fq(&mut c);
        }
    }

    // ------------------------------------------------------------ queries

    /// Physical address of `iova`, if mapped (any permission).
    pub fn iova_to_phys(&self, iova: u64) -> Option<u64> {
        if iova >= IOVA_LIMIT {
            return None;
        }
        self.table.walk(iova).map(|l| l.phys + (iova - l.iova))
    }

    /// Translate one byte address by walking the table (no IOTLB).
    pub fn translate(&self, iova: u64, access: Access) -> Result<u64, Fault> {
        let fault = |reason| Fault {
            iova,
            pasid: self.pasid,
            access,
            reason,
        };
        if iova >= IOVA_LIMIT {
            return Err(fault(FaultReason::OutOfRange));
        }
        let l = self.table.walk(iova).ok_or(fault(FaultReason::Unmapped))?;
        if !l.prot.allows(access) {
            return Err(fault(FaultReason::Permission));
        }
        Ok(l.phys + (iova - l.iova))
    }

    /// Translate `[iova, iova+len)` into physically contiguous runs by
    /// walking the table (cleared first, in IOVA order); the first unmapped
    /// or forbidden byte is the fault. `len == 0` is an empty success.
    pub fn translate_range(
        &self,
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
            pasid: self.pasid,
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
        let mut a = iova;
        while a < end {
            let l = self.table.walk(a).ok_or(fault(a, FaultReason::Unmapped))?;
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
        Ok(())
    }

    /// Bytes mapped.
    pub fn mapped_bytes(&self) -> u64 {
        self.ctl().pages * PAGE_SIZE
    }

    /// Current mappings, coalesced where IOVA, physical address and
    /// permissions all continue, sorted by IOVA.
    pub fn mappings(&self) -> Vec<Mapping> {
        let _c = self.ctl();
        self.table.mappings()
    }

    /// Leaf entries by size: (4 KiB pages, 2 MiB blocks, 1 GiB blocks).
    pub fn leaf_counts(&self) -> (u64, u64, u64) {
        let _c = self.ctl();
        self.table.leaf_counts()
    }

    /// Table pages allocated (the root included).
    pub fn table_pages(&self) -> usize {
        PageTable::live_pages(&self.ctl().alloc)
    }

    /// Sizes and counters.
    pub fn stats(&self) -> DomainStats {
        let c = self.ctl();
        let stalled = self.fault_state().stalls.len();
        DomainStats {
            mapped_bytes: c.pages * PAGE_SIZE,
            table_pages: PageTable::live_pages(&c.alloc),
            fq_pending: c.fq.len(),
            flushes: self.flushes.load(Ordering::Relaxed),
            stalled,
        }
    }

    /// [`Domain::stats`], or `None` at once while the domain is busy: a
    /// flush or a teardown holds its lock while it waits for the engines,
    /// and so for as long as a device holds requests translated through
    /// it (a client can keep some held for as long as it likes). For
    /// listings made under locks other clients need.
    pub fn try_stats(&self) -> Option<DomainStats> {
        let c = match self.ctl.try_lock() {
            Ok(c) => c,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        let stalled = self.fault_state().stalls.len();
        Some(DomainStats {
            mapped_bytes: c.pages * PAGE_SIZE,
            table_pages: PageTable::live_pages(&c.alloc),
            fq_pending: c.fq.len(),
            flushes: self.flushes.load(Ordering::Relaxed),
            stalled,
        })
    }

    // ------------------------------------------------------------ faults

    /// Current fault policy.
    pub fn fault_policy(&self) -> FaultPolicy {
        match self.policy.load(Ordering::Relaxed) {
            0 => FaultPolicy::Abort,
            _ => FaultPolicy::Stall,
        }
    }

    /// Change the fault policy; leaving Stall aborts the stalled requests.
    pub fn set_fault_policy(&self, p: FaultPolicy) {
        let mut f = self.fault_state();
        self.policy.store(p as u8, Ordering::Relaxed);
        if p == FaultPolicy::Abort && !f.stalls.is_empty() {
            for s in f.stalls.values_mut() {
                s.resolution.get_or_insert(Resolution::Abort);
            }
            self.resolved.fetch_add(1, Ordering::Release);
        }
    }

    /// Record a fault. Under the Stall policy, and when `stallable` (the
    /// requester can wait), the request stalls unless too many already do.
    pub fn report_fault(&self, fault: Fault, stallable: bool) -> FaultOutcome {
        let mut f = self.fault_state();
        let stall = stallable
            && self.fault_policy() == FaultPolicy::Stall
            && f.stalls.len() < self.cfg.max_stalled;
        let seq = f.log.push(fault, stall);
        if stall {
            f.stalls.insert(
                seq,
                Stall {
                    at: Instant::now(),
                    resolution: None,
                },
            );
            FaultOutcome::Stalled { stag: seq }
        } else {
            FaultOutcome::Aborted { seq }
        }
    }

    /// Resolve stalled request `stag`.
    pub fn resume(&self, stag: u64, r: Resolution) -> Result<(), IommuError> {
        let mut f = self.fault_state();
        match f.stalls.get_mut(&stag) {
            Some(s) if s.resolution.is_none() => {
                s.resolution = Some(r);
                self.resolved.fetch_add(1, Ordering::Release);
                Ok(())
            }
            _ => Err(IommuError::NoSuchStall { stag }),
        }
    }

    /// Bumped whenever a stall is resolved; engines holding stalled requests
    /// look at them again when it changes.
    pub fn resolution_generation(&self) -> u64 {
        self.resolved.load(Ordering::Acquire)
    }

    /// Take the resolution of stall `stag`, if any (the stall is then gone).
    pub fn take_resolution(&self, stag: u64) -> Option<Resolution> {
        let mut f = self.fault_state();
        let r = f.stalls.get(&stag)?.resolution?;
        f.stalls.remove(&stag);
        Some(r)
    }

    /// Abort stalls older than the stall timeout; returns how many.
    pub fn expire_stalls(&self, now: Instant) -> usize {
        let mut f = self.fault_state();
        let mut n = 0;
        for s in f.stalls.values_mut() {
            if s.resolution.is_none()
                && now.saturating_duration_since(s.at) >= self.cfg.stall_timeout
            {
                s.resolution = Some(Resolution::Abort);
                n += 1;
            }
        }
        if n > 0 {
            self.resolved.fetch_add(1, Ordering::Release);
        }
        n
    }

    /// Forget a stall whose request is gone (queue teardown).
    pub fn cancel_stall(&self, stag: u64) {
        self.fault_state().stalls.remove(&stag);
    }

    /// Requests stalled now (resolved or not, until taken).
    pub fn stalled(&self) -> usize {
        self.fault_state().stalls.len()
    }

    /// Remove and return up to `max` fault records, oldest first, with the
    /// totals (recorded ever, lost to overflow).
    pub fn drain_faults(&self, max: usize) -> (Vec<FaultRecord>, u64, u64) {
        let mut f = self.fault_state();
        let v = f.log.drain(max);
        (v, f.log.total(), f.log.lost())
    }

    /// Up to `max` newest fault records without consuming them, with the
    /// totals.
    pub fn peek_faults(&self, max: usize) -> (Vec<FaultRecord>, u64, u64) {
        let f = self.fault_state();
        (f.log.peek(max), f.log.total(), f.log.lost())
    }
}

impl Drop for Domain {
    fn drop(&mut self) {
        // Nothing can translate through us any more (a section keeps its
        // domain alive), and our tag is never reused, so what engines still
        // cache is unreachable: release now, and let them drop the entries
        // whenever they consume the command.
        self.iommu
            .submit(&[crate::Command::InvalidateDomain { tag: self.tag }]);
        self.iommu.count_domain(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EngineTlb, BLOCK_2M};
    use std::sync::atomic::AtomicBool;

    const P: u64 = PAGE_SIZE;

    fn dom(cfg: DomainConfig) -> (Arc<Iommu>, Domain) {
        let iommu = Iommu::new();
        let d = Domain::new(&iommu, 3, cfg).unwrap();
        (iommu, d)
    }

    /// Sets its flag when dropped (released).
    struct Flag(Arc<AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    fn flag() -> (Arc<AtomicBool>, Release) {
        let f = Arc::new(AtomicBool::new(false));
        (f.clone(), Box::new(Flag(f)))
    }

    #[test]
    fn live_domains_are_counted() {
        let (iommu, d) = dom(DomainConfig::default());
        let e = Domain::new(&iommu, 4, DomainConfig::default()).unwrap();
        assert_eq!(iommu.live_domains(), 2);
        drop(d);
        assert_eq!(iommu.live_domains(), 1);
        drop(e);
        assert_eq!(iommu.live_domains(), 0);
    }

    #[test]
    fn map_translate_unmap() {
        let (_i, d) = dom(DomainConfig::default());
        d.map(0x10000, 0x7000_0000, 2 * P, Prot::RW).unwrap();
        assert_eq!(d.translate(0x10010, Access::Read), Ok(0x7000_0010));
        assert_eq!(d.translate(0x11fff, Access::Write), Ok(0x7000_1fff));
        let f = d.translate(0x12000, Access::Read).unwrap_err();
        assert_eq!(
            (f.iova, f.pasid, f.reason),
            (0x12000, 3, FaultReason::Unmapped)
        );
        assert_eq!(d.mapped_bytes(), 2 * P);
        assert_eq!(d.unmap(0x10000, 2 * P), Ok(2 * P));
        assert!(d.translate(0x10010, Access::Read).is_err());
        assert_eq!(d.table_pages(), 1, "empty tables freed");
    }

    #[test]
    fn permissions() {
        let (_i, d) = dom(DomainConfig::default());
        d.map(0, 0x1000, P, Prot::READ).unwrap();
        assert!(d.translate(5, Access::Read).is_ok());
        assert_eq!(
            d.translate(5, Access::Write).unwrap_err().reason,
            FaultReason::Permission
        );
        // A mapping without permission exists (it occupies its IOVAs) but
        // every access to it faults.
        d.map(P, 0, P, Prot::NONE).unwrap();
        assert_eq!(
            d.translate(P, Access::Read).unwrap_err().reason,
            FaultReason::Permission
        );
        assert!(d.map(P, 0, P, Prot::RW).is_err());
        assert_eq!(d.map(2 * P, 0, P, Prot::WRITE), Ok(()));
        assert!(d.translate(2 * P, Access::Read).is_err());
    }

    #[test]
    fn bad_arguments() {
        let (_i, d) = dom(DomainConfig::default());
        let mis = |r: Result<(), IommuError>| matches!(r, Err(IommuError::Misaligned { .. }));
        assert!(mis(d.map(1, 0, P, Prot::RW)));
        assert!(mis(d.map(0, 1, P, Prot::RW)));
        assert!(mis(d.map(0, 0, 0, Prot::RW)));
        assert!(matches!(
            d.map(IOVA_LIMIT - P, 0, 2 * P, Prot::RW),
            Err(IommuError::OutOfRange { .. })
        ));
        assert!(matches!(
            d.map(!(P - 1), 0, P, Prot::RW),
            Err(IommuError::OutOfRange { .. })
        ));
        assert!(matches!(
            d.map(0, !(P - 1), 2 * P, Prot::RW),
            Err(IommuError::OutOfRange { .. })
        ));
        assert!(matches!(d.unmap(0, 3), Err(IommuError::Misaligned { .. })));
        assert_eq!(
            d.translate(IOVA_LIMIT, Access::Read).unwrap_err().reason,
            FaultReason::OutOfRange
        );
        assert_eq!(d.iova_to_phys(u64::MAX), None);
    }

    #[test]
    fn overlap_changes_nothing() {
        let (_i, d) = dom(DomainConfig::default());
        d.map(4 * P, 0x100000, P, Prot::RW).unwrap();
        let before = d.mappings();
        assert_eq!(
            d.map(2 * P, 0x200000, 4 * P, Prot::RW),
            Err(IommuError::Overlap { iova: 4 * P })
        );
        assert_eq!(
            d.map_sg(0, &[(0x300000, P), (0x500000, 8 * P)], Prot::RW),
            Err(IommuError::Overlap { iova: 4 * P })
        );
        assert_eq!(d.mappings(), before);
        assert_eq!(d.mapped_bytes(), P);
    }

    #[test]
    fn partial_unmap_of_pages_is_fine_of_blocks_refused() {
        let (_i, d) = dom(DomainConfig::default());
        d.map(0, 0x100000, P, Prot::RW).unwrap();
        d.map(3 * P, 0x200000, P, Prot::RW).unwrap();
        assert_eq!(d.unmap(0, 8 * P), Ok(2 * P));
        assert_eq!(d.unmap(0, 8 * P), Ok(0));
        d.map(BLOCK_2M, 4 * BLOCK_2M, BLOCK_2M, Prot::RW).unwrap();
        assert_eq!(d.leaf_counts(), (0, 1, 0));
        assert_eq!(
            d.unmap(BLOCK_2M, P),
            Err(IommuError::WouldSplitBlock {
                iova: BLOCK_2M,
                size: BLOCK_2M
            })
        );
        assert_eq!(
            d.unmap(BLOCK_2M + BLOCK_2M / 2, BLOCK_2M),
            Err(IommuError::WouldSplitBlock {
                iova: BLOCK_2M,
                size: BLOCK_2M
            })
        );
        assert_eq!(d.mapped_bytes(), BLOCK_2M, "nothing changed");
        assert_eq!(d.unmap(0, 4 * BLOCK_2M), Ok(BLOCK_2M));
    }

    #[test]
    fn page_and_table_limits() {
        let (_i, d) = dom(DomainConfig {
            max_pages: 2,
            ..DomainConfig::default()
        });
        d.map(0, 0, 2 * P, Prot::RW).unwrap();
        assert_eq!(
            d.map(4 * P, 0, P, Prot::RW),
            Err(IommuError::LimitExceeded { limit_pages: 2 })
        );
        // Four table pages map one leaf table's worth; a second leaf table
        // does not fit, and the first run's mapping is rolled back.
        let (_i, d) = dom(DomainConfig {
            max_table_pages: 4,
            ..DomainConfig::default()
        });
        assert_eq!(
            d.map_sg(
                BLOCK_2M - P,
                &[(0x1000_0000, P), (0x2000_0000, P)],
                Prot::RW
            ),
            Err(IommuError::TableLimit { limit_pages: 4 })
        );
        assert_eq!(d.mapped_bytes(), 0);
        assert!(d.mappings().is_empty());
        assert_eq!(d.table_pages(), 1);
        d.map(0, 0, 512 * P, Prot::RW).unwrap();
    }

    #[test]
    fn domains_share_a_table_budget() {
        let b = TableBudget::new(24);
        let cfg = DomainConfig {
            table_budget: Some(b.clone()),
            ..DomainConfig::default()
        };
        let (i, d) = dom(cfg.clone());
        assert_eq!(b.used(), 8, "the root's chunk");
        // 512 GiB apart, each map takes three table pages below the root:
        // seven fit in the root's chunk and the next (16 pages).
        let mut n = 0;
        let e = loop {
            match d.map(n << 39, 0, P, Prot::RW) {
                Ok(_) => n += 1,
                Err(e) => break e,
            }
        };
        assert_eq!(n, 7);
        assert_eq!(
            e,
            IommuError::TableBudget {
                used_pages: 24,
                limit_pages: 24
            }
        );
        assert_eq!(d.mapped_bytes(), 7 * P, "the refused map left nothing");
        // A new domain's root chunk is charged like any other: refused
        // on a spent budget (it was granted whatever the budget said, so
        // each domain could pass it by 32 KiB).
        assert_eq!(
            Domain::new(&i, 4, cfg.clone()).err(),
            Some(IommuError::TableBudget {
                used_pages: 24,
                limit_pages: 24
            })
        );
        assert_eq!(b.used(), 24, "a refused domain holds nothing");
        drop(d);
        let d2 = Domain::new(&i, 4, cfg).unwrap();
        assert_eq!(b.used(), 8);
        drop(d2);
        assert_eq!(b.used(), 0);
    }

    #[test]
    fn strict_releases_after_the_sync() {
        let (_i, d) = dom(DomainConfig::default());
        d.map(0, 0x4000_0000, 4 * P, Prot::RW).unwrap();
        let (f, r) = flag();
        let mut g = IotlbGather::new();
        assert_eq!(d.unmap_fast(0, 2 * P, &mut g), Ok(2 * P));
        assert_eq!(d.unmap_fast(2 * P, 2 * P, &mut g), Ok(2 * P));
        g.defer_release(r);
        assert_eq!(g.range(), Some((0, 4 * P)));
        assert!(!f.load(Ordering::SeqCst));
        let before = d.iommu().stats();
        d.iotlb_sync(&mut g);
        assert!(f.load(Ordering::SeqCst));
        let after = d.iommu().stats();
        assert_eq!(after.commands - before.commands, 2, "one range + one sync");
        assert_eq!(d.table_pages(), 1);
        // A gather is bound to one domain.
        let (_j, other) = dom(DomainConfig::default());
        other.map(0, 0, P, Prot::RW).unwrap();
        let mut g = IotlbGather::new();
        d.map(0, 0, P, Prot::RW).unwrap();
        d.unmap_fast(0, P, &mut g).unwrap();
        assert_eq!(
            other.unmap_fast(0, P, &mut g),
            Err(IommuError::GatherMismatch)
        );
        d.iotlb_sync(&mut g);
    }

    #[test]
    fn deferred_releases_after_the_flush() {
        let (_i, d) = dom(DomainConfig {
            mode: InvalidationMode::Deferred,
            fq_size: 3,
            fq_timeout: Duration::from_secs(3600),
            ..DomainConfig::default()
        });
        let mut flags = Vec::new();
        for k in 0..3u64 {
            d.map(k * P, 0x4000_0000 + k * P, P, Prot::RW).unwrap();
        }
        let c0 = d.flush_counter();
        for k in 0..2u64 {
            let (f, r) = flag();
            let mut g = IotlbGather::new();
            d.unmap_fast(k * P, P, &mut g).unwrap();
            g.defer_release(r);
            d.iotlb_sync(&mut g);
            flags.push(f);
        }
        assert_eq!(d.stats().fq_pending, 2);
        assert!(flags.iter().all(|f| !f.load(Ordering::SeqCst)));
        assert_eq!(d.flush_counter(), c0);
        assert!(!d.flush_if_due(Instant::now()));
        // Reusing a pending IOVA flushes first.
        d.map(0, 0x5000_0000, P, Prot::RW).unwrap();
        assert!(flags.iter().all(|f| f.load(Ordering::SeqCst)));
        assert_eq!(d.flush_counter(), c0 + 1);
        // A full queue flushes.
        d.unmap(0, P).unwrap();
        d.unmap(2 * P, P).unwrap();
        d.map(8 * P, 0x5000_0000, P, Prot::RW).unwrap();
        assert_eq!((d.stats().fq_pending, d.flush_counter()), (2, c0 + 1));
        d.unmap(8 * P, P).unwrap();
        assert_eq!(d.stats().fq_pending, 0);
        assert_eq!(d.flush_counter(), c0 + 2);
        // Timeout.
        d.map(0, 0x5000_0000, P, Prot::RW).unwrap();
        d.unmap(0, P).unwrap();
        assert!(!d.flush_if_due(Instant::now()));
        assert!(d.flush_if_due(Instant::now() + Duration::from_secs(3601)));
        // Leaving deferred mode flushes.
        d.map(0, 0x5000_0000, P, Prot::RW).unwrap();
        d.unmap(0, P).unwrap();
        assert_eq!(d.stats().fq_pending, 1);
        d.set_mode(InvalidationMode::Strict);
        assert_eq!(d.stats().fq_pending, 0);
        assert_eq!(d.table_pages(), 1);
    }

    #[test]
    fn stale_iotlb_entries_live_until_the_flush_in_deferred_mode() {
        let (iommu, d) = dom(DomainConfig {
            mode: InvalidationMode::Deferred,
            fq_timeout: Duration::from_secs(3600),
            ..DomainConfig::default()
        });
        let mut e = EngineTlb::new(&iommu);
        d.map(0, 0x4000_0000, P, Prot::RW).unwrap();
        assert_eq!(e.enter().translate(&d, 3, 8, Access::Read), Ok(0x4000_0008));
        d.unmap(0, P).unwrap();
        // The walk sees the unmap; the engine's IOTLB may still answer.
        assert!(d.translate(8, Access::Read).is_err());
        assert_eq!(e.enter().translate(&d, 3, 8, Access::Read), Ok(0x4000_0008));
        d.flush_iotlb_all();
        assert!(e.enter().translate(&d, 3, 8, Access::Read).is_err());
        // Strict: gone at once.
        d.set_mode(InvalidationMode::Strict);
        d.map(0, 0x4000_0000, P, Prot::RW).unwrap();
        assert!(e.enter().translate(&d, 3, 8, Access::Read).is_ok());
        d.unmap(0, P).unwrap();
        assert!(e.enter().translate(&d, 3, 8, Access::Read).is_err());
    }

    #[test]
    // Miri runs far slower than the 5 ms timeouts this test sets.
    #[cfg_attr(miri, ignore)]
    fn housekeeping_enforces_the_timeouts() {
        let iommu = Iommu::new();
        let d = Arc::new(
            Domain::new(
                &iommu,
                1,
                DomainConfig {
                    mode: InvalidationMode::Deferred,
                    fault_policy: FaultPolicy::Stall,
                    fq_timeout: Duration::from_millis(5),
                    stall_timeout: Duration::from_millis(5),
                    ..DomainConfig::default()
                },
            )
            .unwrap(),
        );
        iommu.track(&d);
        d.map(0, 0, P, Prot::RW).unwrap();
        d.unmap(0, P).unwrap();
        let FaultOutcome::Stalled { stag } = d.report_fault(fault(0), true) else {
            panic!("stalls")
        };
        assert_eq!(iommu.housekeeping(Instant::now()), (0, 0));
        let later = Instant::now() + Duration::from_millis(10);
        assert_eq!(iommu.housekeeping(later), (1, 1));
        assert_eq!(d.take_resolution(stag), Some(Resolution::Abort));
        drop(d);
        assert_eq!(iommu.housekeeping(later), (0, 0));
    }

    #[test]
    fn clear_releases_everything() {
        let (_i, d) = dom(DomainConfig {
            mode: InvalidationMode::Deferred,
            ..DomainConfig::default()
        });
        d.map(0, 0, 3 * BLOCK_2M, Prot::RW).unwrap();
        let (f, r) = flag();
        let mut g = IotlbGather::new();
        d.unmap_fast(0, BLOCK_2M, &mut g).unwrap();
        g.defer_release(r);
        d.iotlb_sync(&mut g);
        assert!(!f.load(Ordering::SeqCst));
        assert_eq!(d.clear(), 2 * BLOCK_2M);
        assert!(f.load(Ordering::SeqCst));
        assert_eq!((d.mapped_bytes(), d.table_pages()), (0, 1));
    }

    fn fault(iova: u64) -> Fault {
        Fault {
            iova,
            pasid: 3,
            access: Access::Write,
            reason: FaultReason::Unmapped,
        }
    }

    #[test]
    fn abort_and_stall_policies() {
        let (_i, d) = dom(DomainConfig {
            max_stalled: 2,
            stall_timeout: Duration::from_secs(60),
            ..DomainConfig::default()
        });
        assert_eq!(
            d.report_fault(fault(1), true),
            FaultOutcome::Aborted { seq: 0 }
        );
        d.set_fault_policy(FaultPolicy::Stall);
        assert_eq!(
            d.report_fault(fault(2), false),
            FaultOutcome::Aborted { seq: 1 },
            "a requester that cannot wait is aborted"
        );
        assert_eq!(
            d.report_fault(fault(3), true),
            FaultOutcome::Stalled { stag: 2 }
        );
        assert_eq!(
            d.report_fault(fault(4), true),
            FaultOutcome::Stalled { stag: 3 }
        );
        assert_eq!(
            d.report_fault(fault(5), true),
            FaultOutcome::Aborted { seq: 4 },
            "bounded"
        );
        assert_eq!(d.stalled(), 2);
        let g0 = d.resolution_generation();
        assert_eq!(d.take_resolution(2), None);
        d.resume(2, Resolution::Retry).unwrap();
        assert_eq!(
            d.resume(2, Resolution::Abort),
            Err(IommuError::NoSuchStall { stag: 2 })
        );
        assert_eq!(
            d.resume(9, Resolution::Abort),
            Err(IommuError::NoSuchStall { stag: 9 })
        );
        assert!(d.resolution_generation() > g0);
        assert_eq!(d.take_resolution(2), Some(Resolution::Retry));
        assert_eq!(d.take_resolution(2), None);
        assert_eq!(d.expire_stalls(Instant::now()), 0);
        assert_eq!(d.expire_stalls(Instant::now() + Duration::from_secs(61)), 1);
        assert_eq!(d.take_resolution(3), Some(Resolution::Abort));
        assert_eq!(d.stalled(), 0);
        // Leaving Stall aborts what waits.
        let FaultOutcome::Stalled { stag } = d.report_fault(fault(6), true) else {
            panic!("stalls")
        };
        d.set_fault_policy(FaultPolicy::Abort);
        assert_eq!(d.take_resolution(stag), Some(Resolution::Abort));
        let (recs, total, lost) = d.drain_faults(100);
        assert_eq!((recs.len(), total, lost), (6, 6, 0));
        assert_eq!(
            recs.iter().map(|r| r.stalled).collect::<Vec<_>>(),
            [false, false, true, true, false, true]
        );
        assert!(d.peek_faults(5).0.is_empty());
    }
}
