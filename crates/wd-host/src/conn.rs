//! One client connection: its requests and the queues bound to it.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wd_device::DeviceQueue;
use wd_iommu::virtio::{self, GuestMemory, ResvMem, VirtioIommu};
use wd_iommu::{DomainConfig, FaultRecord, Prot, Release, Resolution};
use wd_ipc::{Channel, Frame, IpcError};
use wd_proto::{limits, FaultEvent, Message, ProtoError, Status};
use wd_ring::{Desc, RingLayout};
use wd_sys::process_mem::ProcessMemory;
use wd_sys::PeerCred;

use crate::config::MAX_QUEUES_PER_CONNECTION;
use crate::engine::LegacyDma;
use crate::queue::{
    self, InstanceClaim, MemModel, Queue, QueueState, CAPA_ALLOW_LEGACY, CAPA_KNOWN, CAPA_SHARE_ALL,
};
use crate::quota::{Charge, Resource};
use crate::{attrs, HostError, HostInner};

/// Depth used when a client asks for 0.
const DEFAULT_DEPTH: u32 = 256;

struct Conn<'a> {
    host: &'a Arc<HostInner>,
    cred: PeerCred,
    ch: Channel,
    hello: bool,
    queues: HashMap<u32, Arc<Queue>>,
    /// The device side of legacy queues, which this thread serves itself.
    legacy: HashMap<u32, Box<dyn DeviceQueue>>,
    /// The connection's virtio-iommu device: its endpoints are the
    /// connection's queues, its guest memory what they shared.
    virtio: VirtioIommu,
}

// Every queue of a connection can be a virtio-iommu endpoint.
const _: () = assert!(MAX_QUEUES_PER_CONNECTION <= virtio::MAX_ENDPOINTS);

/// IOVAs a client can never map through virtio-iommu: below the kernel's
/// default `vm.mmap_min_addr`, no process memory lives there, so a device
/// access there is a bug (a NULL-based address).
const RESV_LOW: ResvMem = ResvMem {
    subtype: virtio::VIRTIO_IOMMU_RESV_MEM_T_RESERVED,
    start: 0,
    end: 0xffff,
};

/// The connection's guest memory for virtio-iommu: what its queues shared.
struct SharedMemory<'a>(&'a HashMap<u32, Arc<Queue>>);

impl GuestMemory for SharedMemory<'_> {
    fn resolve(&self, gpa: u64, size: u64, prot: Prot) -> Option<(Vec<(u64, u64)>, Release)> {
        self.0
            .values()
            .find_map(|q| q.resolve_shared(gpa, size, prot))
    }
}

type Reply = (Message, Vec<OwnedFd>);

fn err(status: Status, msg: impl Into<String>) -> HostError {
    HostError::Status(status, msg.into())
}

/// The settings of a domain made for a client of `uid`: its page tables
/// count against the uid's budget.
fn domain_config(host: &HostInner, uid: u32) -> DomainConfig {
    DomainConfig {
        table_budget: host.quotas.table_budget(uid),
        ..DomainConfig::default()
    }
}

/// Serve one connection until the peer closes it or its process exits.
pub(crate) fn serve(host: &Arc<HostInner>, sock: UnixStream, cred: PeerCred, _charge: Charge) {
    // A pidfd ties the queues to the process, not only to the socket: a
    // socket inherited by a child does not keep a dead parent's queues.
    let pidfd = wd_sys::pidfd_open(cred.pid).ok();
    let mut conn = Conn {
        host,
        cred,
        ch: Channel::new(sock),
        hello: false,
        queues: HashMap::new(),
        legacy: HashMap::new(),
        virtio: VirtioIommu::new(
            &host.iommu,
            virtio::DeviceSettings {
                domain: domain_config(host, cred.uid),
                ..virtio::DeviceSettings::default()
            },
        ),
    };
    // A panic on a client's request is a host bug: the client is told, and
    // what the connection holds is given back all the same.
    let hello_ms = host.quotas.limits().hello_timeout_ms;
    if catch_unwind(AssertUnwindSafe(|| conn.run(pidfd.as_ref(), hello_ms))).is_err() {
        conn.last_word("the host failed on this connection's request (a bug): closing it".into());
    }
    let ids: Vec<u32> = conn.queues.keys().copied().collect();
    for id in ids {
        conn.release(id);
    }
}

impl Conn<'_> {
    /// Requests and replies until the peer closes, its process exits, or
    /// it breaks a rule.
    fn run(&mut self, pidfd: Option<&OwnedFd>, hello_ms: u64) {
        let limit = Duration::from_millis(hello_ms);
        // A connection that does not say Hello in time is closed: idle
        // sockets must not hold connection slots.
        let hello_by = Instant::now() + limit;
        // A reply the client does not read within as long ends the
        // connection: the thread must not sit in send, deaf to the pidfd.
        let _ = self.ch.socket().set_write_timeout(Some(limit));
        loop {
            if !self.ch.has_buffered() {
                let mut fds: Vec<BorrowedFd<'_>> = vec![self.ch.socket().as_fd()];
                if let Some(p) = pidfd {
                    fds.push(p.as_fd());
                }
                let timeout =
                    (!self.hello).then(|| hello_by.saturating_duration_since(Instant::now()));
                match wd_sys::poll(&fds, timeout) {
                    Ok(r) if r.len() > 1 && (r[1].readable || r[1].hangup) => break,
                    Ok(r) if r[0].readable || r[0].hangup => {}
                    Ok(_) if !self.hello && Instant::now() >= hello_by => {
                        self.last_word(format!(
                            "no Hello within {hello_ms} ms (limits.hello_timeout_ms)"
                        ));
                        break;
                    }
                    Ok(_) => continue,
                    Err(_) => break,
                }
            } else if pidfd.is_some_and(|p| wd_sys::pidfd_exited(p.as_fd()).unwrap_or(false)) {
                // Frames keep coming (a socket inherited by another
                // process, written ahead of the answers): the process
                // still ends the connection, not only an empty buffer.
                break;
            }
            // Waiting for a frame is poll's (with the pidfd); a frame once
            // begun must arrive whole in as long as a Hello may take (the
            // Hello by its deadline), or the thread would sit in recv, deaf
            // to the pidfd, for as long as a client likes.
            let by = if self.hello {
                Instant::now() + limit
            } else {
                hello_by
            };
            let frame = match self.ch.recv_by(Some(by)) {
                Ok(f) => f,
                Err(IpcError::TimedOut) => {
                    self.last_word(format!(
                        "a frame begun and not finished within {hello_ms} ms (limits.hello_timeout_ms)"
                    ));
                    break;
                }
                Err(IpcError::Closed) | Err(IpcError::Sys(_)) => break,
                Err(e) => {
                    // Malformed input: say why, then drop the connection (its
                    // framing can no longer be trusted).
                    let status = match &e {
                        IpcError::Header(ProtoError::Version(_)) => Status::Version,
                        IpcError::Header(ProtoError::TooBig(_)) => Status::TooBig,
                        // The host is out of descriptors (the client's
                        // frame went with them).
                        IpcError::FdsLost => Status::TooManyFiles,
                        _ => Status::Protocol,
                    };
                    let why = match e {
                        IpcError::FdsLost => "the host is at its open-file limit: the descriptors sent with a request could not be received".to_string(),
                        e => e.to_string(),
                    };
                    let _ = self.ch.send(&Message::error(status, why), 0, &[]);
                    break;
                }
            };
            let id = frame.request_id;
            let (reply, fds) = match self.handle(frame) {
                Ok(r) => r,
                Err(e) => (Message::error(e.status(), e.to_string()), Vec::new()),
            };
            let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
            // The whole reply within the limit, not each write of it: a
            // client reading a little at a time must not keep the thread
            // in send, deaf to the pidfd, for as long as it likes.
            let reply_by = Some(Instant::now() + limit);
            match self.ch.send_by(&reply, id, &borrowed, reply_by) {
                Ok(()) => {}
                // A reply the protocol cannot carry is this host's fault:
                // the client hears why and keeps its connection.
                Err(IpcError::Proto(e)) => {
                    let why = Message::error(
                        Status::TooBig,
                        format!("the host's reply to {} cannot be sent: {e}", reply.name()),
                    );
                    if self.ch.send_by(&why, id, &[], reply_by).is_err() {
                        break;
                    }
                }
                Err(_) => break,
            }
            if !self.hello {
                break;
            }
        }
    }

    /// The protocol error the host closes the connection for, sent
    /// without waiting long on a client that does not read.
    fn last_word(&mut self, message: String) {
        let _ = self
            .ch
            .socket()
            .set_write_timeout(Some(Duration::from_millis(100)));
        let _ = self
            .ch
            .send(&Message::error(Status::Protocol, message), 0, &[]);
    }
}

impl Conn<'_> {
    fn handle(&mut self, f: Frame) -> Result<Reply, HostError> {
        let none = Vec::new();
        if !self.hello {
            return match f.msg {
                Message::Hello { version, .. } if version == wd_proto::PROTOCOL_VERSION => {
                    self.hello = true;
                    Ok((
                        Message::HelloReply {
                            version: wd_proto::PROTOCOL_VERSION,
                            host_pid: wd_sys::getpid(),
                            features: 0,
                        },
                        none,
                    ))
                }
                Message::Hello { version, .. } => Err(err(
                    Status::Version,
                    format!(
                        "client speaks protocol {version}, host speaks {}",
                        wd_proto::PROTOCOL_VERSION
                    ),
                )),
                other => Err(err(
                    Status::Protocol,
                    format!("expected Hello, got {}", other.name()),
                )),
            };
        }
        #[cfg(test)]
        tests::maybe_panic(f.msg.name());
        let mut fds = f.fds;
        match f.msg {
            Message::ListAttrs { prefix } => Ok((
                Message::Attrs {
                    entries: attrs::list(self.host, self.cred, &prefix),
                },
                none,
            )),
            Message::GetAttr { path } => Ok((
                Message::AttrValue {
                    value: attrs::get(self.host, self.cred, &path)?,
                },
                none,
            )),
            Message::SetAttr { path, value } => {
                attrs::set(self.host, self.cred, &path, &value)?;
                Ok((Message::Ok, none))
            }
            Message::RequestQueue {
                alg,
                flags,
                depth,
                numa_node,
                probe_addr,
                probe_value,
            } => self.request_queue(
                &alg,
                flags,
                depth,
                numa_node,
                (probe_addr, probe_value),
                fds,
            ),
            Message::ReleaseQueue { queue_id } => {
                self.queue(queue_id)?;
                self.release(queue_id);
                Ok((Message::Ok, none))
            }
            Message::MemShare {
                queue_id,
                iova,
                size,
                fd_offset,
                prot,
            } => {
                let q = self.queue(queue_id)?;
                let fd = fds
                    .pop()
                    .ok_or_else(|| err(Status::Protocol, "MemShare without a descriptor"))?;
                let charge = self
                    .host
                    .quotas
                    .charge(self.cred.uid, Resource::Share { bytes: size })?;
                let region =
                    wd_mem::ImportedRegion::import(fd.as_fd(), fd_offset, size).map_err(|e| {
                        err(
                            Status::from_errno(e.errno()),
                            format!("cannot import shared memory: {e}"),
                        )
                    })?;
                q.share(iova, region, prot, charge)?;
                Ok((Message::Ok, none))
            }
            Message::MemUnshare {
                queue_id,
                iova,
                size,
            } => {
                self.queue(queue_id)?.unshare(iova, size)?;
                Ok((Message::Ok, none))
            }
            Message::ReadFaults { queue_id, max } => {
                let q = self.queue(queue_id)?;
                let (recs, total, lost) = q.drain_faults((max as usize).min(limits::MAX_FAULTS));
                Ok((
                    Message::Faults {
                        total,
                        lost,
                        events: fault_events(&recs),
                    },
                    none,
                ))
            }
            Message::PeekFaults { queue_id, max } => {
                let q = self
                    .host
                    .queues
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&queue_id)
                    .cloned()
                    .ok_or_else(|| err(Status::NotFound, format!("no queue {queue_id}")))?;
                if q.owner.uid != self.cred.uid && !attrs::may_write(self.host, self.cred) {
                    return Err(err(
                        Status::Permission,
                        format!(
                            "queue {queue_id} belongs to uid {}: only it, the host's owner or root may read its faults",
                            q.owner.uid
                        ),
                    ));
                }
                let (recs, total, lost) = q.peek_faults((max as usize).min(limits::MAX_FAULTS));
                Ok((
                    Message::Faults {
                        total,
                        lost,
                        events: fault_events(&recs),
                    },
                    none,
                ))
            }
            Message::IommuPolicy {
                queue_id,
                mode,
                fault_policy,
            } => {
                let q = self.queue(queue_id)?;
                q.set_iommu_policy(mode, fault_policy);
                // Requests aborted by leaving Stall complete at once.
                self.host.devices[q.device].engines[q.engine].kick();
                Ok((Message::Ok, none))
            }
            Message::FaultResume {
                queue_id,
                stag,
                retry,
            } => {
                let q = self.queue(queue_id)?;
                let r = if retry {
                    Resolution::Retry
                } else {
                    Resolution::Abort
                };
                let cur = q.endpoint.fault_domain();
                cur.resume(stag, r)
                    .or_else(|_| q.domain().resume(stag, r))
                    .map_err(|e| err(Status::NotFound, e.to_string()))?;
                self.host.devices[q.device].engines[q.engine].kick();
                Ok((Message::Ok, none))
            }
            Message::VirtioKick { requests } => {
                let mut bufs: Vec<virtio::Buffer> = requests
                    .into_iter()
                    .map(|r| virtio::Buffer {
                        readable: r.readable,
                        writable: vec![0; r.writable_len as usize],
                        used: 0,
                    })
                    .collect();
                self.virtio.kick(&mut bufs, &SharedMemory(&self.queues));
                let used = bufs
                    .into_iter()
                    .map(|mut b| {
                        b.writable.truncate(b.used);
                        b.writable
                    })
                    .collect();
                Ok((Message::VirtioUsed { used }, none))
            }
            Message::VirtioConfig { offset, data } => {
                if !data.is_empty() {
                    self.virtio
                        .write_config(offset as usize, &data)
                        .map_err(|e| err(Status::Invalid, e.to_string()))?;
                }
                Ok((
                    Message::VirtioConfigReply {
                        features: self.virtio.features(),
                        config: self.virtio.config_bytes().to_vec(),
                    },
                    none,
                ))
            }
            Message::Legacy {
                queue_id,
                desc,
                payload,
            } => self.legacy(queue_id, &desc, &payload),
            other => Err(err(
                Status::Protocol,
                format!("{} is not a request a client may send", other.name()),
            )),
        }
    }

    fn queue(&self, id: u32) -> Result<Arc<Queue>, HostError> {
        self.queues.get(&id).cloned().ok_or_else(|| {
            err(
                Status::NotFound,
                format!("queue {id} does not belong to this connection"),
            )
        })
    }

    fn request_queue(
        &mut self,
        alg: &str,
        flags: u32,
        depth: u32,
        numa_node: i32,
        (probe_addr, probe_value): (u64, u64),
        fds: Vec<OwnedFd>,
    ) -> Result<Reply, HostError> {
        if self.queues.len() >= MAX_QUEUES_PER_CONNECTION {
            return Err(err(
                Status::Busy,
                format!("a connection may hold at most {MAX_QUEUES_PER_CONNECTION} queues"),
            ));
        }
        if numa_node < -1 {
            return Err(err(
                Status::Invalid,
                format!("numa_node {numa_node} is neither a node nor -1 (any)"),
            ));
        }
        if flags & !CAPA_KNOWN != 0 {
            return Err(err(
                Status::Invalid,
                format!("unknown capability flags {:#x}", flags & !CAPA_KNOWN),
            ));
        }
        let depth = if depth == 0 { DEFAULT_DEPTH } else { depth };
        let layout = RingLayout::new(depth).map_err(|e| err(Status::Invalid, e.to_string()))?;

        // Candidates: devices serving `alg`, best first.
        let mut cands: Vec<(usize, usize)> = Vec::new();
        for (n, d) in self.host.devices.iter().enumerate() {
            if let Some(t) = d.types.iter().position(|t| t.info.name == alg) {
                cands.push((n, t));
            }
        }
        if cands.is_empty() {
            return Err(err(
                Status::NoDevice,
                format!("no device serves algorithm '{alg}'"),
            ));
        }
        let devs = &self.host.devices;
        cands.sort_by_key(|&(n, t)| {
            let d = &devs[n];
            let numa_miss = numa_node >= 0 && d.numa_zone_id.load(Ordering::Relaxed) != numa_node;
            (
                std::cmp::Reverse(d.priority.load(Ordering::Relaxed)),
                numa_miss,
                std::cmp::Reverse(d.types[t].available.load(Ordering::Relaxed)),
            )
        });
        // The first candidate with a free instance that this user's quota
        // allows (a user at the cap of one device's queue type may still
        // take another device's). Both are given back when dropped: on any
        // error below, or with the queue.
        let mut refused = None;
        let mut claimed = None;
        for &(n, t) in &cands {
            let Some(instance) = InstanceClaim::take(&devs[n].types[t].available) else {
                continue;
            };
            let res = Resource::Queue {
                device: n,
                qtype: t,
                instances: devs[n].types[t].instances,
            };
            match self.host.quotas.charge(self.cred.uid, res) {
                Ok(charge) => {
                    claimed = Some((n, t, instance, charge));
                    break;
                }
                Err(e) => refused = Some(e),
            }
        }
        let Some((dev_n, type_n, instance, charge)) = claimed else {
            return Err(refused.unwrap_or_else(|| {
                err(
                    Status::Busy,
                    format!("every queue of '{alg}' is in use; try again later"),
                )
            }));
        };

        let mut model = MemModel::Shared;
        if flags & CAPA_SHARE_ALL != 0 {
            model = MemModel::ShareAll(self.bind_share_all(fds, probe_addr, probe_value)?);
        }

        let dev = &devs[dev_n];
        let built =
            queue::new_ring(layout, dev.driver.register_bytes(type_n as u32)).and_then(|ring| {
                let cq = wd_sys::wake_line()
                    .map_err(|e| err(Status::from_errno(e.errno()), e.to_string()))?;
                let bell = wd_sys::wake_line()
                    .map_err(|e| err(Status::from_errno(e.errno()), e.to_string()))?;
                Ok((ring, cq, bell))
            });
        // The host keeps one end of the completion line; the client gets
        // the other (wd_sys::wake_line: no client can make it block). The
        // doorbell is the queue's own line too: an end shared by every
        // client of the engine would be one socket any of them could shut
        // down or connect elsewhere, for all.
        let (ring, (cq, cq_client), (bell, doorbell)) = built?;
        // The host keeps FD_HEADROOM descriptors free for what any client's
        // request needs for a moment (a MemShare's memory descriptor, a new
        // queue's ring and lines), as it does at connect: a queue whose
        // descriptors land that close to the limit is refused. Without
        // this one client's queues took the last descriptors, and another
        // client's MemShare, whose descriptor could not be installed, cost
        // it its connection and its queues.
        {
            use std::os::fd::AsRawFd;
            let top = [&ring.fd, &cq, &cq_client, &bell, &doorbell]
                .iter()
                .map(|f| f.as_raw_fd() as u64)
                .max()
                .unwrap_or(0);
            if crate::short_of_descriptors(top) {
                return Err(err(
                    Status::TooManyFiles,
                    "host is out of file descriptors; try again later",
                ));
            }
        }
        let queue::NewRing {
            fd: ring_fd,
            map: ring_map,
            view,
            registers,
            total_bytes: ring_bytes,
        } = ring;
        let engine_n = (0..dev.engines.len())
            .min_by_key(|&e| dev.engines[e].load.load(Ordering::Relaxed))
            .unwrap_or(0);
        let engine = &dev.engines[engine_n];
        let id = self.host.new_queue_id();
        let info = &dev.types[type_n].info;
        let q = Arc::new(Queue::new(
            id,
            dev_n,
            type_n as u32,
            alg.to_string(),
            self.cred,
            depth,
            flags,
            model,
            engine_n,
            (cq, bell),
            ring_map,
            (&self.host.iommu, domain_config(self.host, self.cred.uid)),
            (charge, instance),
        )?);
        // Cannot fail: a connection holds at most MAX_ENDPOINTS queues, and
        // ids are unique.
        let _ = self.virtio.add_endpoint(q.endpoint.clone(), vec![RESV_LOW]);
        self.host
            .queues
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, q.clone());
        self.queues.insert(id, q.clone());
        let mut device_queue = dev.driver.open_queue(type_n as u32);
        if let Some(r) = registers {
            device_queue.attach_registers(r);
        }
        engine.attach(q, view, device_queue);
        Ok((
            Message::QueueGranted {
                queue_id: id,
                device: format!("dev{dev_n}"),
                device_api: info.device_api,
                depth,
                desc_size: wd_ring::ENTRY_SIZE as u32,
                ring_bytes: ring_bytes as u64,
                flags,
            },
            vec![ring_fd, doorbell, cq_client],
        ))
    }

    /// SHARE_ALL: the client sends its own `/proc/self/mem` (opened with
    /// its credentials, bound to its current image); the host proves the
    /// descriptor is the asker's by reading the probe word through it.
    fn bind_share_all(
        &self,
        mut fds: Vec<OwnedFd>,
        addr: u64,
        want: u64,
    ) -> Result<ProcessMemory, HostError> {
        let fd = fds.pop().ok_or_else(|| {
            err(
                Status::Protocol,
                "WD_CAPA_SHARE_ALL needs the client's /proc/self/mem descriptor with the request",
            )
        })?;
        let mem = ProcessMemory::bind(fd).map_err(|e| {
            err(
                Status::Invalid,
                format!("WD_CAPA_SHARE_ALL descriptor refused: {e}"),
            )
        })?;
        let mut got = [0u8; 8];
        match mem.read(addr, &mut got) {
            Err(e) => Err(err(
                Status::Permission,
                format!("WD_CAPA_SHARE_ALL probe unreadable: {e}"),
            )),
            Ok(()) if u64::from_ne_bytes(got) != want => Err(err(
                Status::Permission,
                "WD_CAPA_SHARE_ALL probe mismatch: the descriptor is not the asking process's memory",
            )),
            Ok(()) => Ok(mem),
        }
    }

    fn release(&mut self, id: u32) {
        self.legacy.remove(&id);
        let Some(q) = self.queues.remove(&id) else {
            return;
        };
        q.set_state(QueueState::Closing);
        let dev = &self.host.devices[q.device];
        dev.engines[q.engine].detach(id);
        // Its virtio-iommu domain goes if it was the last endpoint.
        self.virtio.remove_endpoint(id);
        q.unshare_all();
        self.host
            .queues
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        // The instance and the quota go back with the last reference (`q`).
    }

    fn legacy(&mut self, id: u32, desc: &[u8], payload: &[u8]) -> Result<Reply, HostError> {
        let q = self.queue(id)?;
        if q.flags & CAPA_ALLOW_LEGACY == 0 {
            return Err(err(
                Status::Permission,
                "queue was not requested with WD_CAPA_ALLOW_LEGACY",
            ));
        }
        let mut d = Desc::from_bytes(desc).ok_or_else(|| {
            err(
                Status::Invalid,
                format!("descriptor must be {} bytes", wd_ring::DESC_SIZE),
            )
        })?;
        let driver = &self.host.devices[q.device].driver;
        let dev = self
            .legacy
            .entry(id)
            .or_insert_with(|| driver.open_queue(q.alg));
        let mut dma = LegacyDma {
            input: payload,
            output: Vec::new(),
            pasid: id,
        };
        if catch_unwind(AssertUnwindSafe(|| dev.process(&mut d, &mut dma))).is_err() {
            d.status = wd_device::status::EIO;
        }
        q.requests.fetch_add(1, Ordering::Relaxed);
        if d.status == 0 {
            q.bytes.fetch_add(dev.bytes_of(&d), Ordering::Relaxed);
        } else if d.status == wd_device::status::EFAULT {
            q.fault_count.fetch_add(1, Ordering::Relaxed);
        }
        Ok((
            Message::LegacyReply {
                desc: d.to_bytes().to_vec(),
                payload: dma.output,
            },
            Vec::new(),
        ))
    }
}

fn fault_events(recs: &[FaultRecord]) -> Vec<FaultEvent> {
    recs.iter()
        .map(|r| FaultEvent {
            seq: r.seq,
            iova: r.fault.iova,
            pasid: r.fault.pasid,
            access: r.fault.access,
            reason: r.fault.reason,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::os::unix::net::UnixStream;
    use std::sync::atomic::Ordering;

    use wd_ipc::Channel;
    use wd_proto::Message;

    use crate::config::DeviceConfig;
    use crate::quota::Resource;

    thread_local! {
        /// The request whose handling panics on this thread (no request
        /// can make a connection thread panic any more, so the guard is
        /// tested through this).
        static PANIC_ON: Cell<Option<&'static str>> = const { Cell::new(None) };
    }

    pub(super) fn maybe_panic(request: &str) {
        if PANIC_ON.with(Cell::get) == Some(request) {
            panic!("a {request} request that panics (test)");
        }
    }

    /// A panic on a request: the client is told, and the connection's
    /// queues, instances and charge are given back.
    #[test]
    fn a_request_that_panics_gives_back_what_its_connection_held() {
        let host = crate::Host::embedded(vec![DeviceConfig::new("dummy")]).unwrap();
        let inner = host.inner.clone();
        let (client, server) = UnixStream::pair().unwrap();
        let cred = wd_sys::peer_cred(&server).unwrap();
        let uid = cred.uid;
        let charge = inner.quotas.charge(uid, Resource::Connection).unwrap();
        let free = || inner.devices[0].types[0].available.load(Ordering::Relaxed);
        let before = free();
        let h = inner.clone();
        let serving = std::thread::spawn(move || {
            PANIC_ON.with(|p| p.set(Some("GetAttr")));
            super::serve(&h, server, cred, charge);
        });
        let mut ch = Channel::new(client);
        let hello = Message::Hello {
            version: wd_proto::PROTOCOL_VERSION,
            client_pid: wd_sys::getpid(),
        };
        ch.call(&hello, 1, &[]).unwrap();
        let request = Message::RequestQueue {
            alg: "memcpy".into(),
            flags: 0,
            depth: 0,
            numa_node: -1,
            probe_addr: 0,
            probe_value: 0,
        };
        let granted = ch.call(&request, 2, &[]).unwrap();
        assert_eq!(granted.msg.name(), "QueueGranted", "{:?}", granted.msg);
        assert_eq!(free(), before - 1);
        ch.send(
            &Message::GetAttr {
                path: "dev0".into(),
            },
            3,
            &[],
        )
        .unwrap();
        let last = ch.recv().unwrap();
        match &last.msg {
            Message::Error { message, .. } => assert!(message.contains("a bug"), "{message}"),
            other => panic!("not an error: {other:?}"),
        }
        serving
            .join()
            .expect("the connection thread caught the panic");
        assert!(inner.queues.lock().unwrap().is_empty());
        assert_eq!(free(), before, "the queue's instance came back");
        let held = inner.quotas.usage(uid);
        assert!(held.is_empty(), "{held:?}");
        drop(ch);
    }
}
