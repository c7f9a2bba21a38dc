//! A queue as the host keeps it: its ring, its IOMMU domain, the memory the
//! client shared with it, its faults and counters.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Mutex, RwLock};

use wd_iommu::{Domain, Fault, FaultQueue, Prot};
use wd_mem::ImportedRegion;
use wd_proto::Status;
use wd_sys::{Mapping, PeerCred};

use crate::config::MAX_SHARES_PER_QUEUE;
use crate::HostError;

/// Client capability flag: any memory of the process may be named.
pub const CAPA_SHARE_ALL: u32 = 1;
/// Client capability flag: data may travel through the socket.
pub const CAPA_ALLOW_LEGACY: u32 = 2;
/// All flags a client may ask for.
pub const CAPA_KNOWN: u32 = CAPA_SHARE_ALL | CAPA_ALLOW_LEGACY;

/// How the engine reaches the memory a request names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemModel {
    /// Only ranges shared with wd_mem_share (memfd, zero copy).
    Shared,
    /// Shared ranges first, then the whole process through process_vm_*.
    ShareAll {
        /// The verified peer's pid.
        pid: u32,
    },
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
    /// The queue's address space; engines translate under the read lock, so
    /// unshare (write lock) returns only when no engine uses the range.
    pub domain: RwLock<Domain>,
    shares: Mutex<BTreeMap<u64, (u64, ImportedRegion)>>,
    /// Fault log the client reads.
    pub faults: Mutex<FaultQueue>,
    /// Requests completed.
    pub requests: AtomicU64,
    /// Bytes processed.
    pub bytes: AtomicU64,
    /// Faults seen.
    pub fault_count: AtomicU64,
    /// Signalled when the client sleeps on completions.
    pub cq_event: OwnedFd,
    /// The ring memory (its fd went to the client).
    pub ring: Mapping,
    state: AtomicU8,
}

impl Queue {
    /// Assemble a queue (the host has already set up ring and engine).
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
        cq_event: OwnedFd,
        ring: Mapping,
    ) -> Queue {
        Queue {
            id,
            device,
            alg,
            alg_name,
            owner,
            depth,
            flags,
            model,
            engine,
            domain: RwLock::new(Domain::new(id)),
            shares: Mutex::new(BTreeMap::new()),
            faults: Mutex::new(FaultQueue::new(FaultQueue::DEFAULT_CAPACITY)),
            requests: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            fault_count: AtomicU64::new(0),
            cq_event,
            ring,
            state: AtomicU8::new(QueueState::Active as u8),
        }
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

    /// Record a translation fault.
    pub fn record_fault(&self, f: Fault) {
        self.fault_count.fetch_add(1, Ordering::Relaxed);
        self.faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(f);
    }

    /// Map client memory (already imported) at `iova` into the domain.
    pub fn share(&self, iova: u64, region: ImportedRegion, prot: Prot) -> Result<(), HostError> {
        let mut shares = self.shares.lock().unwrap_or_else(|e| e.into_inner());
        if shares.len() >= MAX_SHARES_PER_QUEUE {
            return Err(HostError::Status(
                Status::NoMemory,
                format!("queue already holds {MAX_SHARES_PER_QUEUE} shared ranges"),
            ));
        }
        let size = region.len();
        self.domain
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .map(iova, region.host_addr(), size, prot)
            .map_err(|e| {
                HostError::Status(
                    Status::Invalid,
                    format!("cannot share {iova:#x}+{size:#x}: {e}"),
                )
            })?;
        shares.insert(iova, (size, region));
        Ok(())
    }

    /// Undo a share made at exactly `iova` with exactly `size`.
    pub fn unshare(&self, iova: u64, size: u64) -> Result<(), HostError> {
        let mut shares = self.shares.lock().unwrap_or_else(|e| e.into_inner());
        match shares.get(&iova) {
            Some((s, _)) if *s == size => {}
            _ => {
                return Err(HostError::Status(
                    Status::NotFound,
                    format!("no shared range {iova:#x}+{size:#x} on this queue"),
                ))
            }
        }
        // The write lock waits for any engine translating under the read
        // lock: after this, no request can reach the region.
        self.domain
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .unmap(iova, size)
            .map_err(|e| HostError::Status(Status::Invalid, e.to_string()))?;
        shares.remove(&iova);
        Ok(())
    }

    /// Drop every mapping and every imported region.
    pub fn unshare_all(&self) {
        let mut shares = self.shares.lock().unwrap_or_else(|e| e.into_inner());
        let mut dom = self.domain.write().unwrap_or_else(|e| e.into_inner());
        for (iova, (size, _)) in shares.iter() {
            let _ = dom.unmap(*iova, *size);
        }
        shares.clear();
    }

    /// Number of shared ranges.
    pub fn share_count(&self) -> usize {
        self.shares.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// Create, seal and format the ring memory of a new queue: the fd for the
/// client, the host's mapping, and the host's view of it.
#[allow(unsafe_code)]
pub(crate) fn new_ring(
    layout: wd_ring::RingLayout,
) -> Result<(OwnedFd, Mapping, wd_ring::RingView), HostError> {
    use std::os::fd::AsFd;
    let sys = |e: wd_sys::SysError| HostError::Status(Status::from_errno(e.errno()), e.to_string());
    let fd = wd_sys::memfd_create("wd-ring", false).map_err(sys)?;
    wd_sys::ftruncate(fd.as_fd(), layout.total_bytes() as u64).map_err(sys)?;
    // The client cannot shrink the ring under the host (no SIGBUS here).
    wd_sys::add_seals(
        fd.as_fd(),
        wd_sys::SEAL_SHRINK | wd_sys::SEAL_GROW | wd_sys::SEAL_SEAL,
    )
    .map_err(sys)?;
    let map = Mapping::map_shared(fd.as_fd(), 0, layout.total_bytes()).map_err(sys)?;
    // SAFETY: `map` is a fresh page-aligned mapping of total_bytes; the view
    // is stored in the engine next to an Arc of the Queue that owns `map`,
    // so the memory outlives it.
    let view = unsafe { wd_ring::RingView::create(map.as_ptr(), map.len(), layout) }
        .map_err(|e| HostError::Status(Status::Invalid, e.to_string()))?;
    Ok((fd, map, view))
}

impl Queue {
    /// The counters the client publishes in its ring (informational).
    #[allow(unsafe_code)]
    pub fn client_stats(&self) -> [u64; wd_ring::CLIENT_STATS] {
        // SAFETY: `ring` is this queue's live, page-aligned ring mapping,
        // at least one header page long.
        unsafe { wd_ring::read_client_stats(self.ring.as_ptr()) }
    }
}

/// Read 8 bytes of a peer process (the SHARE_ALL probe).
#[allow(unsafe_code)]
pub(crate) fn read_peer(pid: u32, addr: u64, out: &mut [u8; 8]) -> Result<(), wd_sys::SysError> {
    // SAFETY: `out` is 8 writable bytes.
    unsafe { wd_sys::process_vm_read(pid, addr, out.as_mut_ptr(), 8) }
}
