//! A queue as the host keeps it: its ring, its IOMMU endpoint (its own
//! domain, or the virtio-iommu domain its client attached it to), the memory
//! the client shared with it, and its counters.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use wd_iommu::{
    Attachment, Domain, DomainConfig, Endpoint, Fault, FaultPolicy, FaultRecord, InvalidationMode,
    Iommu, IotlbGather, Prot, Release,
};
use wd_mem::ImportedRegion;
use wd_proto::Status;
use wd_sys::{Mapping, PeerCred};

use crate::config::MAX_SHARES_PER_QUEUE;
use crate::quota::Charge;
use crate::HostError;

pub use wd_proto::{CAPA_ALLOW_LEGACY, CAPA_SHARE_ALL};
/// All flags a client may ask for.
pub const CAPA_KNOWN: u32 = CAPA_SHARE_ALL | CAPA_ALLOW_LEGACY;

/// How the engine reaches the memory a request names.
#[derive(Debug)]
pub enum MemModel {
    /// Only ranges shared with wd_mem_share (memfd, zero copy).
    Shared,
    /// Shared ranges first, then the rest of the client's address space,
    /// through the `/proc/self/mem` descriptor the client opened: the
    /// kernel checked the client's right at open, and the descriptor reads
    /// nothing once that image execs or exits (no access is ever made with
    /// the host's privileges).
    ShareAll(wd_sys::process_mem::ProcessMemory),
}

/// Lifecycle of a queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum QueueState {
    /// Serving requests.
    Active = 0,
    /// Being torn down.
    Closing = 1,
    /// The client corrupted its ring; no longer served.
    Broken = 2,
}

/// One instance of a queue type, taken from its `available_instances` and
/// given back when dropped (with its queue, whatever the teardown path).
#[derive(Debug)]
pub struct InstanceClaim(Arc<std::sync::atomic::AtomicU32>);

impl InstanceClaim {
    /// Take an instance if one is left.
    pub fn take(available: &Arc<std::sync::atomic::AtomicU32>) -> Option<InstanceClaim> {
        available
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |a| a.checked_sub(1))
            .ok()
            .map(|_| InstanceClaim(available.clone()))
    }
}

impl Drop for InstanceClaim {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }
}

/// A range the client shared.
struct Share {
    size: u64,
    /// The host's mapping of it (kept alive by virtio-iommu mappings and
    /// deferred invalidations too).
    region: Arc<HostMapping>,
    /// The access the client granted.
    prot: Prot,
}

/// A host mapping of client memory and its charge to the client's uid:
/// both end when the last holder (share table, virtio-iommu mapping,
/// deferred invalidation) lets go, so the accounting follows the mapping.
struct HostMapping {
    region: ImportedRegion,
    _charge: Charge,
}

/// A live queue.
pub struct Queue {
    /// Host-wide queue id.
    pub id: u32,
    /// Index of the device serving it.
    pub device: usize,
    /// Index of the algorithm in the device's list.
    pub alg: u32,
    /// Algorithm name.
    pub alg_name: String,
    /// Who asked for it.
    pub owner: PeerCred,
    /// Ring depth.
    pub depth: u32,
    /// Capability flags granted.
    pub flags: u32,
    /// Memory model.
    pub model: MemModel,
    /// Engine serving it.
    pub engine: usize,
    /// What the queue's device accesses translate through: its own domain
    /// (the memory the client shared, identity mapped; virtio-iommu's bypass
    /// view), or a virtio-iommu domain. Engines translate through the IOTLB
    /// and acknowledge invalidations, so an unshare returns (strict mode)
    /// only when no engine can reach the range.
    pub endpoint: Arc<Endpoint>,
    /// Shared ranges by IOVA.
    shares: Mutex<BTreeMap<u64, Share>>,
    /// How many: read without `shares`' lock, which a strict unshare holds
    /// while it waits for engines (an attribute listing, holding the
    /// host's table of queues, must not wait behind it).
    share_count: AtomicUsize,
    /// Requests completed.
    pub requests: AtomicU64,
    /// Bytes processed.
    pub bytes: AtomicU64,
    /// Faults seen.
    pub fault_count: AtomicU64,
    /// Requests its device holds now (asynchronous devices).
    pub in_flight: AtomicU64,
    /// The host's end of the completion line (`wd_sys::wake_line`),
    /// woken when the client sleeps on completions.
    pub cq_event: OwnedFd,
    /// The host's end of the queue's own doorbell line, which its engine
    /// sleeps on as well as on its own: a client's end is a socket of
    /// its own, whose state (shutdown, connect) reaches no other client.
    pub bell: OwnedFd,
    /// The ring memory (its fd went to the client).
    pub ring: Mapping,
    state: AtomicU8,
    /// The queue's charge to its owner's uid.
    _charge: Charge,
    /// The device instance it occupies.
    _instance: InstanceClaim,
}

impl Queue {
    /// Assemble a queue (the host has already set up ring and engine);
    /// refused when its owner's table budget cannot take its domain's
    /// root table.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: u32,
        device: usize,
        alg: u32,
        alg_name: String,
        owner: PeerCred,
        depth: u32,
        flags: u32,
        model: MemModel,
        engine: usize,
        (cq_event, bell): (OwnedFd, OwnedFd),
        ring: Mapping,
        (iommu, domain): (&Arc<Iommu>, DomainConfig),
        (charge, instance): (Charge, InstanceClaim),
    ) -> Result<Queue, HostError> {
        let dom = Domain::new(iommu, id, domain).map_err(|e| {
            HostError::Status(
                Status::Quota,
                format!("cannot make the queue's domain: {e}"),
            )
        })?;
        let dom = Arc::new(dom);
        iommu.track(&dom);
        Ok(Queue {
            id,
            device,
            alg,
            alg_name,
            owner,
            depth,
            flags,
            model,
            engine,
            endpoint: Arc::new(Endpoint::new(id, dom)),
            shares: Mutex::new(BTreeMap::new()),
            share_count: AtomicUsize::new(0),
            requests: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            fault_count: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            cq_event,
            bell,
            ring,
            state: AtomicU8::new(QueueState::Active as u8),
            _charge: charge,
            _instance: instance,
        })
    }

    /// Current state.
    pub fn state(&self) -> QueueState {
        match self.state.load(Ordering::Acquire) {
            0 => QueueState::Active,
            1 => QueueState::Closing,
            _ => QueueState::Broken,
        }
    }

    /// Change state.
    pub fn set_state(&self, s: QueueState) {
        self.state.store(s as u8, Ordering::Release);
    }

    /// The queue's own domain (the memory it shared).
    pub fn domain(&self) -> &Arc<Domain> {
        self.endpoint.default_domain()
    }

    /// Record a translation fault of a request that cannot stall.
    pub fn record_fault(&self, f: Fault) {
        self.fault_count.fetch_add(1, Ordering::Relaxed);
        self.endpoint.fault_domain().report_fault(f, false);
    }

    /// Remove and return up to `max` fault records of the domain the queue
    /// translates through, with its totals (recorded, lost).
    pub fn drain_faults(&self, max: usize) -> (Vec<FaultRecord>, u64, u64) {
        self.endpoint.fault_domain().drain_faults(max)
    }

    /// The newest `max` fault records, not consumed, with the totals.
    pub fn peek_faults(&self, max: usize) -> (Vec<FaultRecord>, u64, u64) {
        self.endpoint.fault_domain().peek_faults(max)
    }

    /// Set the invalidation mode and fault policy of the queue's domain, and
    /// of the virtio-iommu domain it is attached to.
    pub fn set_iommu_policy(&self, mode: InvalidationMode, policy: FaultPolicy) {
        let own = self.domain();
        own.set_mode(mode);
        own.set_fault_policy(policy);
        if let Attachment::Domain(d) = self.endpoint.attachment() {
            if !Arc::ptr_eq(&d, own) {
                d.set_mode(mode);
                d.set_fault_policy(policy);
            }
        }
    }

    /// Map client memory (already imported) at `iova` into the queue's
    /// domain.
    pub fn share(
        &self,
        iova: u64,
        region: ImportedRegion,
        prot: Prot,
        charge: Charge,
    ) -> Result<(), HostError> {
        let mut shares = self.shares.lock().unwrap_or_else(|e| e.into_inner());
        if shares.len() >= MAX_SHARES_PER_QUEUE {
            return Err(HostError::Status(
                Status::NoMemory,
                format!("queue already holds {MAX_SHARES_PER_QUEUE} shared ranges"),
            ));
        }
        let size = region.len();
        self.domain()
            .map(iova, region.host_addr(), size, prot)
            .map_err(|e| {
                let st = match e {
                    wd_iommu::IommuError::TableBudget { .. } => Status::Quota,
                    _ if e.is_resource_limit() => Status::NoMemory,
                    _ => Status::Invalid,
                };
                HostError::Status(st, format!("cannot share {iova:#x}+{size:#x}: {e}"))
            })?;
        shares.insert(
            iova,
            Share {
                size,
                region: Arc::new(HostMapping {
                    region,
                    _charge: charge,
                }),
                prot,
            },
        );
        self.share_count.store(shares.len(), Ordering::Relaxed);
        Ok(())
    }

    /// Undo a share made at exactly `iova` with exactly `size`. In strict
    /// mode it returns once no engine can reach the range; in deferred mode
    /// the host keeps the memory mapped until the flush that invalidates it.
    pub fn unshare(&self, iova: u64, size: u64) -> Result<(), HostError> {
        let mut shares = self.shares.lock().unwrap_or_else(|e| e.into_inner());
        match shares.get(&iova) {
            Some(s) if s.size == size => {}
            _ => {
                return Err(HostError::Status(
                    Status::NotFound,
                    format!("no shared range {iova:#x}+{size:#x} on this queue"),
                ))
            }
        }
        let dom = self.domain();
        let mut g = IotlbGather::new();
        let r = dom.unmap_fast(iova, size, &mut g);
        if r.is_ok() {
            if let Some(s) = shares.remove(&iova) {
                g.defer_release(Box::new(s.region));
            }
            self.share_count.store(shares.len(), Ordering::Relaxed);
        }
        dom.iotlb_sync(&mut g);
        r.map(|_| ())
            .map_err(|e| HostError::Status(Status::Invalid, e.to_string()))
    }

    /// Drop every mapping and every imported region (queue teardown, after
    /// the engine let go of the queue).
    pub fn unshare_all(&self) {
        let shares = std::mem::take(&mut *self.shares.lock().unwrap_or_else(|e| e.into_inner()));
        self.share_count.store(0, Ordering::Relaxed);
        // Invalidates on every engine and waits before the regions go.
        self.domain().clear();
        drop(shares);
    }

    /// The IOVA this queue shared the host address `host` at, to report a
    /// vanished page where the client named it. Engines call this inside
    /// their IOTLB section, while an unshare may hold the lock and wait for
    /// that section to end: so it only tries the lock, and `None` also
    /// means "busy".
    pub fn iova_of_host(&self, host: u64) -> Option<u64> {
        let shares = match self.shares.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        shares.iter().find_map(|(&iova, s)| {
            let off = host.checked_sub(s.region.region.host_addr())?;
            (off < s.size).then_some(iova + off)
        })
    }

    /// Number of shared ranges.
    pub fn share_count(&self) -> usize {
        self.share_count.load(Ordering::Relaxed)
    }

    /// The host's runs for `[gpa, gpa + size)` of memory this queue shared
    /// with at least `prot`, kept alive by the returned release
    /// (virtio-iommu guest memory).
    pub fn resolve_shared(
        &self,
        gpa: u64,
        size: u64,
        prot: Prot,
    ) -> Option<(Vec<(u64, u64)>, Release)> {
        let shares = self.shares.lock().unwrap_or_else(|e| e.into_inner());
        let (&iova, s) = shares.range(..=gpa).next_back()?;
        let end = gpa.checked_add(size)?;
        if end > iova + s.size || !s.prot.contains(prot) {
            return None;
        }
        let host = s.region.region.host_addr() + (gpa - iova);
        Some((vec![(host, size)], Box::new(s.region.clone())))
    }
}

/// Create, seal and format the ring memory of a new queue: the fd for the
/// client, the host's mapping, and the host's view of it. A device with a
/// register block (`register_bytes` > 0) gets it after the ring, page
/// aligned, in its own mapping.
#[allow(unsafe_code)]
pub(crate) fn new_ring(
    layout: wd_ring::RingLayout,
    register_bytes: usize,
) -> Result<NewRing, HostError> {
    use std::os::fd::AsFd;
    let sys = |e: wd_sys::SysError| HostError::Status(Status::from_errno(e.errno()), e.to_string());
    let ring_bytes = layout.total_bytes();
    let regs_at = ring_bytes.next_multiple_of(wd_sys::page_size());
    let total = if register_bytes == 0 {
        ring_bytes
    } else {
        regs_at + register_bytes.next_multiple_of(wd_sys::page_size())
    };
    let fd = wd_sys::memfd_create("wd-ring", false).map_err(sys)?;
    wd_sys::ftruncate(fd.as_fd(), total as u64).map_err(sys)?;
    // The client cannot shrink the ring under the host. It holds the fd
    // and can punch holes, but on normal pages a hole faults in a zero page
    // (no SIGBUS): at worst a corrupt ring, which the engine detects.
    wd_sys::add_seals(
        fd.as_fd(),
        wd_sys::SEAL_SHRINK | wd_sys::SEAL_GROW | wd_sys::SEAL_SEAL,
    )
    .map_err(sys)?;
    let map = Mapping::map_shared(fd.as_fd(), 0, ring_bytes).map_err(sys)?;
    let registers = if register_bytes == 0 {
        None
    } else {
        let m = Mapping::map_shared(fd.as_fd(), regs_at as u64, total - regs_at).map_err(sys)?;
        let len = m.len();
        wd_sys::devmem::Registers::new(Arc::new(m), 0, len)
    };
    // SAFETY: `map` is a fresh page-aligned mapping of total_bytes; the view
    // is stored in the engine next to an Arc of the Queue that owns `map`,
    // so the memory outlives it.
    let view = unsafe { wd_ring::RingView::create(map.as_ptr(), map.len(), layout) }
        .map_err(|e| HostError::Status(Status::Invalid, e.to_string()))?;
    Ok(NewRing {
        fd,
        map,
        view,
        registers,
        total_bytes: total,
    })
}

/// A new queue's ring memory (see [`new_ring`]).
pub(crate) struct NewRing {
    /// The memfd, for the client.
    pub fd: OwnedFd,
    /// The host's mapping of the ring.
    pub map: Mapping,
    /// The host's view of the ring.
    pub view: wd_ring::RingView,
    /// The device's register block, when it has one.
    pub registers: Option<wd_sys::devmem::Registers>,
    /// Bytes of the memfd (ring and register block).
    pub total_bytes: usize,
}

impl Queue {
    /// The counters the client publishes in its ring (informational).
    #[allow(unsafe_code)]
    pub fn client_stats(&self) -> [u64; wd_ring::CLIENT_STATS] {
        // SAFETY: `ring` is this queue's live, page-aligned ring mapping,
        // at least one header page long.
        unsafe { wd_ring::read_client_stats(self.ring.as_ptr()) }
    }

    /// The client library's own counters for this queue (restarts it
    /// lived through; informational).
    #[allow(unsafe_code)]
    pub fn queue_stats(&self) -> [u64; wd_ring::QUEUE_STATS] {
        // SAFETY: as in `client_stats`.
        unsafe { wd_ring::read_queue_stats(self.ring.as_ptr()) }
    }

    /// The client library's sampled request latencies (a histogram,
    /// [`wd_ring::latency_bucket`]; informational).
    #[allow(unsafe_code)]
    pub fn latency(&self) -> [u64; wd_ring::LATENCY_BUCKETS] {
        // SAFETY: as in `client_stats`.
        unsafe { wd_ring::read_latency(self.ring.as_ptr()) }
    }
}
