//! One client connection: its requests and the queues bound to it.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use wd_device::DeviceQueue;
use wd_iommu::{FaultQueue, Prot};
use wd_ipc::{Channel, Frame, IpcError};
use wd_proto::{limits, FaultEvent, Message, Status};
use wd_ring::{Desc, RingLayout};
use wd_sys::PeerCred;

use crate::config::MAX_QUEUES_PER_CONNECTION;
use crate::engine::LegacyDma;
use crate::queue::{
    self, MemModel, Queue, QueueState, CAPA_ALLOW_LEGACY, CAPA_KNOWN, CAPA_SHARE_ALL,
};
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
}

type Reply = (Message, Vec<OwnedFd>);

fn err(status: Status, msg: impl Into<String>) -> HostError {
    HostError::Status(status, msg.into())
}

/// Serve one connection until the peer closes it or its process exits.
pub(crate) fn serve(host: &Arc<HostInner>, sock: UnixStream) {
    let Ok(cred) = wd_sys::peer_cred(&sock) else {
        return;
    };
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
    };
    loop {
        if !conn.ch.has_buffered() {
            let mut fds: Vec<BorrowedFd<'_>> = vec![conn.ch.socket().as_fd()];
            if let Some(p) = &pidfd {
                fds.push(p.as_fd());
            }
            match wd_sys::poll(&fds, None) {
                Ok(r) if r.len() > 1 && (r[1].readable || r[1].hangup) => break,
                Ok(r) if r[0].readable || r[0].hangup => {}
                Ok(_) => continue,
                Err(_) => break,
            }
        }
        let frame = match conn.ch.recv() {
            Ok(f) => f,
            Err(IpcError::Closed) | Err(IpcError::Sys(_)) => break,
            Err(e) => {
                // Malformed input: say why, then drop the connection (its
                // framing can no longer be trusted).
                let _ = conn
                    .ch
                    .send(&Message::error(Status::Protocol, e.to_string()), 0, &[]);
                break;
            }
        };
        let id = frame.request_id;
        let (reply, fds) = match conn.handle(frame) {
            Ok(r) => r,
            Err(e) => (Message::error(e.status(), e.to_string()), Vec::new()),
        };
        let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
        if conn.ch.send(&reply, id, &borrowed).is_err() {
            break;
        }
        if !conn.hello {
            break;
        }
    }
    let ids: Vec<u32> = conn.queues.keys().copied().collect();
    for id in ids {
        conn.release(id);
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
        let mut fds = f.fds;
        match f.msg {
            Message::ListAttrs { prefix } => Ok((
                Message::Attrs {
                    entries: attrs::list(self.host, &prefix),
                },
                none,
            )),
            Message::GetAttr { path } => Ok((
                Message::AttrValue {
                    value: attrs::get(self.host, &path)?,
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
            } => self.request_queue(&alg, flags, depth, numa_node, probe_addr, probe_value),
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
                let prot = Prot::from_bits(prot)
                    .ok_or_else(|| err(Status::Invalid, "bad protection bits"))?;
                let fd = fds
                    .pop()
                    .ok_or_else(|| err(Status::Protocol, "MemShare without a descriptor"))?;
                let region =
                    wd_mem::ImportedRegion::import(fd.as_fd(), fd_offset, size).map_err(|e| {
                        err(
                            Status::from_errno(e.errno()),
                            format!("cannot import shared memory: {e}"),
                        )
                    })?;
                q.share(iova, region, prot)?;
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
                let mut fq = q.faults.lock().unwrap_or_else(|e| e.into_inner());
                let events = drain_faults(&mut fq, max);
                Ok((
                    Message::Faults {
                        total: fq.total(),
                        lost: fq.lost(),
                        events,
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
        probe_addr: u64,
        probe_value: u64,
    ) -> Result<Reply, HostError> {
        if self.queues.len() >= MAX_QUEUES_PER_CONNECTION {
            return Err(err(
                Status::Busy,
                format!("a connection may hold at most {MAX_QUEUES_PER_CONNECTION} queues"),
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
        let claimed = cands.iter().copied().find(|&(n, t)| {
            devs[n].types[t]
                .available
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |a| a.checked_sub(1))
                .is_ok()
        });
        let Some((dev_n, type_n)) = claimed else {
            return Err(err(
                Status::Busy,
                format!("every queue of '{alg}' is in use; try again later"),
            ));
        };
        let give_back = || {
            devs[dev_n].types[type_n]
                .available
                .fetch_add(1, Ordering::AcqRel);
        };

        let mut model = MemModel::Shared;
        if flags & CAPA_SHARE_ALL != 0 {
            if let Err(e) = self.verify_share_all(probe_addr, probe_value) {
                give_back();
                return Err(e);
            }
            model = MemModel::ShareAll { pid: self.cred.pid };
        }

        let built = queue::new_ring(layout).and_then(|ring| {
            let cq =
                wd_sys::eventfd().map_err(|e| err(Status::from_errno(e.errno()), e.to_string()))?;
            Ok((ring, cq))
        });
        let ((ring_fd, ring_map, view), cq) = match built {
            Ok(b) => b,
            Err(e) => {
                give_back();
                return Err(e);
            }
        };
        let dev = &devs[dev_n];
        let engine_n = (0..dev.engines.len())
            .min_by_key(|&e| dev.engines[e].load.load(Ordering::Relaxed))
            .unwrap_or(0);
        let engine = &dev.engines[engine_n];
        let id = self.host.new_queue_id();
        let info = &dev.types[type_n].info;
        let cq_dup = cq.try_clone().map_err(|e| {
            err(
                Status::from_errno(e.raw_os_error().unwrap_or(5)),
                e.to_string(),
            )
        });
        let cq_dup = match cq_dup {
            Ok(c) => c,
            Err(e) => {
                give_back();
                return Err(e);
            }
        };
        let doorbell = match engine.doorbell.try_clone() {
            Ok(d) => d,
            Err(e) => {
                give_back();
                return Err(e.into());
            }
        };
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
            cq,
            ring_map,
        ));
        self.host
            .queues
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, q.clone());
        self.queues.insert(id, q.clone());
        engine.attach(q, view, dev.driver.open_queue(type_n as u32));
        Ok((
            Message::QueueGranted {
                queue_id: id,
                device: format!("dev{dev_n}"),
                device_api: info.device_api,
                depth,
                desc_size: wd_ring::DESC_SIZE as u32,
                ring_bytes: layout.total_bytes() as u64,
                flags,
            },
            vec![ring_fd, doorbell, cq_dup],
        ))
    }

    /// SHARE_ALL needs the kernel to let us read the peer: prove it by
    /// reading the probe word the client put in its own memory.
    fn verify_share_all(&self, addr: u64, want: u64) -> Result<(), HostError> {
        let mut got = [0u8; 8];
        let r = queue::read_peer(self.cred.pid, addr, &mut got);
        match r {
            Err(e) => Err(err(
                Status::Unsupported,
                format!(
                    "WD_CAPA_SHARE_ALL unavailable: the kernel refused to let the host read process {} ({e})",
                    self.cred.pid
                ),
            )),
            Ok(()) if u64::from_ne_bytes(got) != want => Err(err(
                Status::Permission,
                "WD_CAPA_SHARE_ALL probe mismatch: the peer is not the process that asked",
            )),
            Ok(()) => Ok(()),
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
        q.unshare_all();
        self.host
            .queues
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        dev.types[q.alg as usize]
            .available
            .fetch_add(1, Ordering::AcqRel);
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
            q.bytes.fetch_add(d.result, Ordering::Relaxed);
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

fn drain_faults(fq: &mut FaultQueue, max: u32) -> Vec<FaultEvent> {
    fq.drain((max as usize).min(limits::MAX_FAULTS))
        .into_iter()
        .map(|r| FaultEvent {
            seq: r.seq,
            iova: r.fault.iova,
            pasid: r.fault.pasid,
            access: match r.fault.access {
                wd_iommu::Access::Read => 0,
                wd_iommu::Access::Write => 1,
            },
            reason: r.fault.reason as u8,
        })
        .collect()
}
