//! Domains: an address space (page table), its invalidation mode (strict or
//! deferred through a flush queue), its fault log and fault policy.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{fence, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::faults::{FaultQueue, FaultRecord};
use crate::gather::{IotlbGather, Release};
use crate::table::{Leaf, PageTable, TableAlloc};
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
    range: Option<(u64, u64)>,
    tables: Vec<u32>,
    releases: Vec<Release>,
    at: Instant,
}

struct Ctl {
    alloc: TableAlloc,
    pages: u64,
    fq: VecDeque<FqEntry>,
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
    pub fn new(iommu: &Arc<Iommu>, pasid: Pasid, cfg: DomainConfig) -> Domain {
        let (table, alloc) = PageTable::new(cfg.max_table_pages);
        Domain {
            tag: iommu.new_tag(),
            pasid,
            iommu: iommu.clone(),
            table,
            ctl: Mutex::new(Ctl {
                alloc,
                pages: 0,
                fq: VecDeque::new(),
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
        }
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
        if let Some(a) = self.table.first_mapped(iova, end) {
            return Err(IommuError::Overlap { iova: a });
        }
        // An IOVA waiting in the flush queue may still be cached by an
        // engine with its old translation: flush before reusing it.
        if c.fq
            .iter()
            .any(|e| matches!(e.range, Some((s, x)) if s < end && iova < x))
        {
            self.flush_fq(&mut c);
        }
        let mut retried = false;
        loop {
            match self.map_runs(&mut c, iova, sg, prot) {
                Ok(()) => break,
                Err(mapped_to) => {
                    // Out of table pages: undo what was mapped (engines may
                    // have cached it, so invalidate), then retry once after
                    // releasing the pages the flush queue holds.
                    self.rollback(&mut c, iova, mapped_to);
                    if retried || c.fq.is_empty() {
                        return Err(IommuError::TableLimit {
                            limit_pages: self.cfg.max_table_pages,
                        });
                    }
                    self.flush_fq(&mut c);
                    retried = true;
                }
            }
        }
        c.pages += npages;
        drop(c);
        self.iotlb_sync_map(iova, total);
        Ok(total)
    }

    /// Map each run; on running out of table pages returns the end of what
    /// was mapped.
    fn map_runs(&self, c: &mut Ctl, iova: u64, sg: &[(u64, u64)], prot: Prot) -> Result<(), u64> {
        let mut at = iova;
        for &(phys, len) in sg {
            if self
                .table
                .map(&mut c.alloc, at, at + len, phys, prot, self.cfg.blocks)
                .is_err()
            {
                return Err(at + len);
            }
            at += len;
        }
        Ok(())
    }

    fn rollback(&self, c: &mut Ctl, iova: u64, end: u64) {
        let mut g = IotlbGather::new();
        self.table.unmap(&mut c.alloc, iova, end, &mut g);
        let parts = g.take();
        if let Some((s, e)) = parts.range {
            self.iommu.invalidate_range_sync(self.tag, s, e);
        } else {
            self.iommu.sync();
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
        if let Some(l) = self.table.split_block(iova, end) {
            return Err(IommuError::WouldSplitBlock {
                iova: l.iova,
                size: l.size(),
            });
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
        match self.mode() {
            InvalidationMode::Strict => {
                match parts.range {
                    Some((s, e)) => self.iommu.invalidate_range_sync(self.tag, s, e),
                    None => self.iommu.sync(),
                }
                self.table.free_pages(&mut self.ctl().alloc, &parts.tables);
                drop(parts.releases);
            }
            InvalidationMode::Deferred => {
                let mut c = self.ctl();
                let now = Instant::now();
                c.fq.push_back(FqEntry {
                    counter: self.flushes.load(Ordering::Relaxed),
                    range: parts.range,
                    tables: parts.tables,
                    releases: parts.releases,
                    at: now,
                });
                let due = c.fq.len() >= self.cfg.fq_size.max(1)
                    || c.fq
                        .front()
                        .is_some_and(|e| now.duration_since(e.at) >= self.cfg.fq_timeout);
                if due {
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
        self.flushes.store(done + 1, Ordering::Release);
        drop(releases);
    }

    /// Flush the flush queue if its oldest entry has waited its timeout;
    /// returns whether it flushed. The host calls this periodically so a
    /// deferred unmap is never held longer than the timeout.
    pub fn flush_if_due(&self, now: Instant) -> bool {
        let mut c = self.ctl();
        let due =
            c.fq.front()
                .is_some_and(|e| now.saturating_duration_since(e.at) >= self.cfg.fq_timeout);
        if due {
            self.flush_fq(&mut c);
        }
        due
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
        let end = match iova.checked_add(len) {
            Some(e) if e <= IOVA_LIMIT => e,
            _ => return Err(fault(iova.min(IOVA_LIMIT), FaultReason::OutOfRange)),
        };
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
    }
}
