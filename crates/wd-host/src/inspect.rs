//! What a program that runs a [`Host`] in its own process may see of it
//! (benchmarks, tests, `wd bench iommu`), without reaching into the host's
//! tables: the IOMMU's counters, per queue and host-wide, and a queue's DMA
//! API for a driver living in the same process.
//!
//! Everything here is read through the same locks the connection threads
//! use, so a caller sees a consistent snapshot and cannot hold a table
//! locked across its own work.

use std::sync::Arc;

use wd_iommu::{Domain, DomainStats, InvalidationStats};

use crate::queue::Queue;
use crate::Host;

/// One queue's IOMMU state at one moment.
#[derive(Clone, Debug)]
pub struct QueueIommuStats {
    /// The queue's own domain: bytes mapped, table pages, unmaps waiting in
    /// its flush queue, flushes completed, requests stalled.
    pub domain: DomainStats,
    /// Translation faults recorded on the domain the queue translates
    /// through (its own, or the virtio-iommu domain it is attached to).
    pub faults: u64,
    /// Fault records dropped because the domain's record buffer was full.
    pub faults_lost: u64,
}

impl Host {
    fn queue(&self, id: u32) -> Option<Arc<Queue>> {
        self.inner
            .queues
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned()
    }

    /// Invalidation counters of the host's software IOMMU, across every
    /// domain and engine (commands, syncs, syncs that waited for a busy
    /// engine and the time they waited). Monotonic: compare two readings.
    pub fn iommu_stats(&self) -> InvalidationStats {
        self.inner.iommu.stats()
    }

    /// IOMMU state of live queue `id`; `None` if the host has no such
    /// queue (never created, or already torn down with its connection).
    pub fn queue_iommu_stats(&self, id: u32) -> Option<QueueIommuStats> {
        let q = self.queue(id)?;
        let (_, faults, faults_lost) = q.peek_faults(0);
        Some(QueueIommuStats {
            domain: q.domain().stats(),
            faults,
            faults_lost,
        })
    }

    /// The DMA API of live queue `id`: its own domain, in which a driver in
    /// this process maps and unmaps device addresses as a kernel driver
    /// calls `dma_map_*` (IOVAs it picks, physical addresses from
    /// [`Domain::iova_to_phys`] of what the client shared). The domain stays
    /// valid while the caller holds it, but once the queue is torn down no
    /// engine translates through it any more.
    pub fn queue_dma(&self, id: u32) -> Option<Arc<Domain>> {
        self.queue(id).map(|q| q.domain().clone())
    }
}
