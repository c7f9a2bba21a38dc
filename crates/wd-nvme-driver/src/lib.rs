//! A driver for WrapDrive's mediated NVMe controller, written the way a
//! driver for the hardware is: reset, admin queue, Identify, I/O queue
//! pairs, raw submission entries, doorbells (shadowed through Doorbell
//! Buffer Config when the controller offers it), completions polled by
//! their phase tag. It needs no knowledge of the host: the controller is a
//! queue of type `nvme` whose register block is shared memory.
//!
//! Memory the controller reaches (queues, PRP lists, data) is allocator
//! memory shared with the controller's IOMMU domain; data buffers a caller
//! passes must be shared too ([`Controller::share`]).
#![deny(unsafe_code)]

mod qpair;

use std::sync::Arc;
use std::time::{Duration, Instant};

use wd_nvme_msg::cmd::{feature, CreateQueue};
use wd_nvme_msg::identify::{self, cns, ControllerInfo, NamespaceInfo, IDENTIFY_BYTES};
use wd_nvme_msg::regs::{self, Cap, Cc};
use wd_nvme_msg::{AdminOp, Cqe, Sqe, Status, PAGE};
use wd_sys::devmem::Registers;
use wrapdrive::{Capability, ClientError, HostConn, Queue, SharedBuf, Waker};

pub use qpair::{need_event, IoQueue, Namespace, QueuePair, MAX_TRANSFER};
pub use wd_nvme_msg as msg;

/// Errors of the driver.
#[derive(Debug, thiserror::Error)]
pub enum NvmeError {
    /// The framework refused or failed (no host, no `nvme` device, ...).
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A command completed with an error status.
    #[error("{command}: {status}")]
    Command {
        /// What was asked.
        command: String,
        /// What the controller said.
        status: Status,
    },
    /// The controller did not do something in time.
    #[error("controller timed out: {0}")]
    Timeout(String),
    /// The controller reports fatal status (CSTS.CFS): reset it.
    #[error("controller fatal status (CSTS.CFS): {0}")]
    Fatal(String),
    /// The controller is not what this driver can drive.
    #[error("{0}")]
    Unsupported(String),
    /// A caller's argument cannot work.
    #[error("{0}")]
    Invalid(String),
    /// The controller broke the protocol (a completion for a command
    /// that is not outstanding): its fault, not the caller's.
    #[error("controller error: {0}")]
    Protocol(String),
    /// The queue has no free entry.
    #[error("submission queue full")]
    Full,
}

/// Result of the driver.
pub type Result<T> = std::result::Result<T, NvmeError>;

/// Admin queue entries.
const ADMIN_ENTRIES: u32 = 32;
/// How long a controller may take to run an admin command or to shut
/// down before the driver gives up, at the least.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(5);

/// [`ADMIN_TIMEOUT`], or the controller's own worst case (CAP.TO, in
/// 500 ms units) when longer: a detach that syncs its namespace may take
/// that long, and one given up left the driver's view of the
/// attachments behind the controller's.
fn admin_timeout(cap: &Cap) -> Duration {
    ADMIN_TIMEOUT.max(Duration::from_millis(500 * cap.to as u64))
}

/// Options of [`Controller::open`].
#[derive(Clone, Debug)]
pub struct Options {
    /// Use Doorbell Buffer Config (shadow doorbells and EventIdx), so a
    /// busy controller is told of new commands without a register write.
    pub shadow_doorbells: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            shadow_doorbells: true,
        }
    }
}

/// A mediated NVMe controller, brought up.
pub struct Controller {
    queue: Queue,
    regs: Registers,
    admin: QueuePair,
    /// One page for Identify and log pages.
    scratch: SharedBuf,
    /// A command given up used `scratch` (see `scratch_page`).
    scratch_stale: bool,
    /// Shadow doorbell and EventIdx pages, when in use.
    dbbuf: Option<Arc<(SharedBuf, SharedBuf)>>,
    info: ControllerInfo,
    cap: Cap,
    io_queues_granted: u16,
    used_qids: Vec<bool>,
    /// Namespaces this controller attached (attached again after a host
    /// restart).
    attached: Vec<u32>,
    /// Bumped each time the controller is brought up again on a restarted
    /// host ([`Controller::reconnect`]).
    incarnation: u64,
    /// Unique among this process's controllers: an I/O queue names the one
    /// it belongs to.
    id: u64,
    /// Memory of I/O queues dropped undeleted (see `QueuePair`): after
    /// `queue` among the fields, so it is freed once the controller can
    /// no longer write it.
    graveyard: qpair::Graveyard,
}

/// How an NVMe error reads to a caller deciding what to do.
impl NvmeError {
    /// Whether the host went away: bring the controller up again with
    /// [`Controller::reconnect`] and [`Controller::restore_io_queue`].
    pub fn host_gone(&self) -> bool {
        matches!(self, NvmeError::Client(c) if c.status() == wrapdrive::Status::HostGone)
    }
}

fn status_err(command: impl Into<String>, cqe: &Cqe) -> Result<Cqe> {
    if cqe.status.is_success() {
        Ok(*cqe)
    } else {
        Err(NvmeError::Command {
            command: command.into(),
            status: cqe.status,
        })
    }
}

impl Controller {
    /// Ask `host` for a controller and bring it up: reset, admin queue,
    /// enable, Identify Controller, Number of Queues, and (per `opts`)
    /// Doorbell Buffer Config.
    pub fn open(host: &Arc<HostConn>, opts: &Options) -> Result<Controller> {
        let mut capa = Capability::new(wd_nvme_msg::QUEUE_TYPE);
        // The ring only carries the wake-up flag: keep it small.
        capa.depth = 8;
        let mut queue = host.request_queue(&capa)?;
        let regs = queue.registers().ok_or_else(|| {
            NvmeError::Unsupported(format!(
                "device {} serves '{}' without a register block",
                queue.device(),
                wd_nvme_msg::QUEUE_TYPE
            ))
        })?;
        let cap = Cap::from_u64(regs.load64(regs::CAP));
        if cap.css & 1 == 0 || cap.mpsmin != 0 || cap.dstrd != 0 {
            return Err(NvmeError::Unsupported(format!(
                "controller capabilities {cap:?} (need the NVM command set, 4 KiB pages, doorbell stride 4)"
            )));
        }
        let waker = queue.waker()?;
        let entries = ADMIN_ENTRIES.min(cap.mqes as u32 + 1);
        // (The admin queue's memory goes with the controller, after its
        // queue.)
        let admin = QueuePair::new(
            &mut queue,
            0,
            entries,
            regs.clone(),
            waker.clone(),
            None,
            None,
        )?;
        enable(&regs, &waker, cap, &admin)?;
        let scratch = SharedBuf::new(PAGE as usize)?;
        queue.share(scratch.addr(), scratch.len())?;
        let mut c = Controller {
            queue,
            regs,
            admin,
            scratch,
            scratch_stale: false,
            dbbuf: None,
            info: ControllerInfo::default(),
            cap,
            io_queues_granted: 0,
            used_qids: Vec::new(),
            attached: Vec::new(),
            incarnation: 0,
            id: {
                static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
                NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            },
            graveyard: Default::default(),
        };
        c.configure(opts.shadow_doorbells)?;
        Ok(c)
    }

    /// After enabling: Identify Controller, Number of Queues, and Doorbell
    /// Buffer Config when `shadow` (its pages made once and kept).
    fn configure(&mut self, shadow: bool) -> Result<()> {
        let c = self;
        c.identify_raw(cns::CONTROLLER, 0)?;
        let mut raw = [0u8; IDENTIFY_BYTES];
        c.scratch.read(0, &mut raw);
        c.info = ControllerInfo::from_bytes(&raw);
        let want = (regs::MAX_IO_QUEUES - 1) as u32;
        let got = c.admin_command(
            "set features (number of queues)",
            Sqe {
                opcode: AdminOp::SetFeatures as u8,
                cdw: [
                    feature::NUMBER_OF_QUEUES as u32,
                    want | want << 16,
                    0,
                    0,
                    0,
                    0,
                ],
                ..Sqe::default()
            },
        )?;
        // (No more than asked for, whatever the controller answers: queue
        // ids past it have no doorbell.)
        c.io_queues_granted =
            (((got.result & 0xffff).min(got.result >> 16) + 1).min(want + 1)) as u16;
        // Queue ids in use stay in use (a restarted controller gets the
        // caller's queues back); a smaller grant keeps them reserved.
        let n = (c.io_queues_granted as usize + 1).max(c.used_qids.len());
        c.used_qids.resize(n, false);
        if shadow && c.info.oacs & identify::OACS_DOORBELL_BUFFER != 0 {
            if c.dbbuf.is_none() {
                let shadow = SharedBuf::new(PAGE as usize)?;
                let events = SharedBuf::new(PAGE as usize)?;
                c.queue.share(shadow.addr(), shadow.len())?;
                c.queue.share(events.addr(), events.len())?;
                c.dbbuf = Some(Arc::new((shadow, events)));
            }
            let (prp1, prp2) = c
                .dbbuf
                .as_ref()
                .map(|d| (d.0.addr(), d.1.addr()))
                .expect("made above");
            c.admin_command(
                "doorbell buffer config",
                Sqe {
                    opcode: AdminOp::DoorbellBuffer as u8,
                    prp1,
                    prp2,
                    ..Sqe::default()
                },
            )?;
        }
        Ok(())
    }

    /// After the host went away ([`NvmeError::host_gone`]): connect to the
    /// restarted host, bring a controller up again there on the same
    /// memory (admin queue, shadow doorbells, every buffer shared), and
    /// attach the same namespaces (an error if another controller took
    /// one meanwhile). Then give each I/O queue to
    /// [`Controller::restore_io_queue`], which sends its commands in flight
    /// again.
    pub fn reconnect(&mut self) -> Result<()> {
        self.queue.reconnect()?;
        self.regs = self.queue.registers().ok_or_else(|| {
            NvmeError::Unsupported("the restarted host serves nvme without a register block".into())
        })?;
        self.cap = Cap::from_u64(self.regs.load64(regs::CAP));
        let waker = self.queue.waker()?;
        self.admin.rebind(self.regs.clone(), waker.clone());
        // The new controller's admin queue is empty: nothing of the old
        // one is sent again.
        self.admin.abandon_all();
        enable(&self.regs, &waker, self.cap, &self.admin)?;
        let shadow = self.dbbuf.is_some();
        self.configure(shadow)?;
        for nsid in self.attached.clone() {
            self.ns_attachment(nsid, false)?;
        }
        self.incarnation += 1;
        Ok(())
    }

    /// Create `q` again on a controller brought up again by
    /// [`Controller::reconnect`] (same queue id, same memory) and send its
    /// commands in flight again (reads, and writes of the same data, are
    /// safe to repeat; a caller must not have touched their buffers).
    /// Returns how many were sent again; nothing to do for a queue that
    /// is current.
    pub fn restore_io_queue(&mut self, q: &mut IoQueue) -> Result<usize> {
        self.owns(q)?;
        if q.incarnation == self.incarnation {
            return Ok(0);
        }
        let waker = self.queue.waker()?;
        let qp = q.pair_mut();
        qp.rebind(self.regs.clone(), waker);
        self.create_pair(q.pair_mut())?;
        q.incarnation = self.incarnation;
        q.pair_mut().resubmit()
    }

    /// Identify Controller, as read at bring-up.
    pub fn info(&self) -> &ControllerInfo {
        &self.info
    }

    /// Controller capabilities (CAP).
    pub fn capabilities(&self) -> Cap {
        self.cap
    }

    /// The framework queue the controller is (for sharing memory, faults
    /// and stats).
    pub fn queue(&mut self) -> &mut Queue {
        &mut self.queue
    }

    /// Share a buffer with the controller (data buffers must be shared
    /// before a command names them).
    pub fn share(&mut self, buf: &SharedBuf) -> Result<()> {
        Ok(self.queue.share(buf.addr(), buf.len())?)
    }

    /// The register block (for tests and tools that poke registers as a
    /// driver would).
    pub fn registers(&self) -> &Registers {
        &self.regs
    }

    /// Run one admin command and wait for its completion; an error status
    /// is an error.
    pub fn admin_command(&mut self, what: &str, sqe: Sqe) -> Result<Cqe> {
        let cqe = self.admin_raw(sqe)?;
        status_err(what, &cqe)
    }

    /// Run one admin command and wait for its completion, whatever its
    /// status.
    pub fn admin_raw(&mut self, sqe: Sqe) -> Result<Cqe> {
        let cid = self.admin.push(sqe)?;
        let r = self.admin_wait(cid, sqe.opcode);
        match &r {
            // Admin commands are never sent again, and the admin queue
            // has 31 ids: one cut by its host going gives its id back.
            Err(e) if e.host_gone() => self.admin.abandon(cid),
            // One that timed out gives it back when its late completion
            // comes (which must not complete a later command).
            Err(_) => {
                self.admin.give_up(cid);
                self.scratch_stale |= sqe.prp1 == self.scratch.addr();
            }
            Ok(_) => {}
        }
        r
    }

    /// The scratch page for the next command's data. A command given up
    /// may still move its data through the old page when its controller
    /// gets to it, so after one (`scratch_stale`) the next command's data
    /// (a namespace attachment's controller list, identify data being
    /// read) goes through a fresh page, shared now that the host answers
    /// again. The old page stays shared, and allocated, until the
    /// controller goes.
    fn scratch_page(&mut self) -> Result<u64> {
        if self.scratch_stale {
            let fresh = SharedBuf::new(PAGE as usize)?;
            self.queue.share(fresh.addr(), fresh.len())?;
            let old = std::mem::replace(&mut self.scratch, fresh);
            self.graveyard
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(Arc::new(old));
            self.scratch_stale = false;
        }
        Ok(self.scratch.addr())
    }

    fn admin_wait(&mut self, cid: u16, opcode: u8) -> Result<Cqe> {
        self.admin.ring()?;
        let mut liveness = qpair::Liveness::new(admin_timeout(&self.cap));
        loop {
            if let Some(c) = self.admin.take(cid)? {
                return Ok(c);
            }
            if self.regs.load32(regs::CSTS) & regs::CSTS_CFS != 0 {
                return Err(NvmeError::Fatal(format!("admin opcode {opcode:#x}")));
            }
            if liveness.expired(self.admin.waker())? {
                return Err(NvmeError::Timeout(format!("admin opcode {opcode:#x}")));
            }
            liveness.pause();
        }
    }

    fn identify_raw(&mut self, cns_value: u8, nsid: u32) -> Result<()> {
        let prp1 = self.scratch_page()?;
        self.admin_command(
            &format!("identify (CNS {cns_value:#x}, NSID {nsid})"),
            Sqe {
                opcode: AdminOp::Identify as u8,
                nsid,
                prp1,
                cdw: [cns_value as u32, 0, 0, 0, 0, 0],
                ..Sqe::default()
            },
        )?;
        Ok(())
    }

    /// Identify data (4096 bytes) for `cns` and `nsid`.
    pub fn identify(&mut self, cns_value: u8, nsid: u32) -> Result<Box<[u8; IDENTIFY_BYTES]>> {
        self.identify_raw(cns_value, nsid)?;
        let mut raw = Box::new([0u8; IDENTIFY_BYTES]);
        self.scratch.read(0, &mut raw[..]);
        Ok(raw)
    }

    /// Identify Namespace `nsid` (an active namespace of this controller).
    pub fn namespace(&mut self, nsid: u32) -> Result<NamespaceInfo> {
        Ok(NamespaceInfo::from_bytes(
            &*self.identify(cns::NAMESPACE, nsid)?,
        ))
    }

    /// The namespaces attached to this controller.
    pub fn active_namespaces(&mut self) -> Result<Vec<u32>> {
        Ok(identify::parse_nsid_list(
            &*self.identify(cns::ACTIVE_NAMESPACES, 0)?,
        ))
    }

    /// Every namespace of the device (attached here, elsewhere or free).
    pub fn allocated_namespaces(&mut self) -> Result<Vec<u32>> {
        Ok(identify::parse_nsid_list(
            &*self.identify(cns::ALLOCATED_NAMESPACES, 0)?,
        ))
    }

    fn ns_attachment(&mut self, nsid: u32, detach: bool) -> Result<()> {
        let mut list = [0u8; 4];
        list[0..2].copy_from_slice(&1u16.to_le_bytes());
        list[2..4].copy_from_slice(&self.info.cntlid.to_le_bytes());
        let prp1 = self.scratch_page()?;
        self.scratch.write(0, &[0u8; PAGE as usize]);
        self.scratch.write(0, &list);
        self.admin_command(
            &format!(
                "namespace {} {nsid}",
                if detach { "detach" } else { "attach" }
            ),
            Sqe {
                opcode: AdminOp::NsAttach as u8,
                nsid,
                prp1,
                cdw: [detach as u32, 0, 0, 0, 0, 0],
                ..Sqe::default()
            },
        )?;
        Ok(())
    }

    /// Attach namespace `nsid` to this controller (Namespace Attachment).
    pub fn attach(&mut self, nsid: u32) -> Result<()> {
        self.ns_attachment(nsid, false)?;
        if !self.attached.contains(&nsid) {
            self.attached.push(nsid);
        }
        Ok(())
    }

    /// Detach namespace `nsid` from this controller.
    pub fn detach(&mut self, nsid: u32) -> Result<()> {
        self.ns_attachment(nsid, true)?;
        self.attached.retain(|&n| n != nsid);
        Ok(())
    }

    /// Attach namespace `nsid` here unless it is already, and describe it
    /// for the I/O helpers.
    pub fn open_namespace(&mut self, nsid: u32) -> Result<Namespace> {
        if !self.active_namespaces()?.contains(&nsid) {
            self.attach(nsid)?;
        }
        let info = self.namespace(nsid)?;
        // The controller's word for it: a block size this driver cannot
        // work with (or 2^64 and past) is refused, not shifted.
        if !(9..=16).contains(&info.lbads) {
            return Err(NvmeError::Unsupported(format!(
                "namespace {nsid} has blocks of 2^{} bytes (2^9..=2^16 supported)",
                info.lbads
            )));
        }
        Ok(Namespace {
            nsid,
            block: info.block_size(),
            blocks: info.nsze,
        })
    }

    /// A log page (`len` bytes from offset 0).
    pub fn log_page(&mut self, lid: u8, len: usize) -> Result<Vec<u8>> {
        if len == 0 || len % 4 != 0 || len > PAGE as usize {
            return Err(NvmeError::Invalid(
                "log page length must be a multiple of 4, at most 4096".into(),
            ));
        }
        let mut sqe = Sqe {
            opcode: AdminOp::GetLogPage as u8,
            nsid: 0xffff_ffff,
            prp1: self.scratch_page()?,
            ..Sqe::default()
        };
        wd_nvme_msg::cmd::GetLogPage {
            lid,
            len: len as u64,
            offset: 0,
        }
        .encode(&mut sqe);
        self.admin_command(&format!("get log page {lid:#x}"), sqe)?;
        let mut out = vec![0u8; len];
        self.scratch.read(0, &mut out);
        Ok(out)
    }

    /// Create an I/O queue pair of `entries` entries (completion queue and
    /// submission queue with the same id).
    pub fn create_io_queue(&mut self, entries: u32) -> Result<IoQueue> {
        if entries < 2 || entries > self.cap.mqes as u32 + 1 {
            return Err(NvmeError::Invalid(format!(
                "queue entries must be 2..={}",
                self.cap.mqes as u32 + 1
            )));
        }
        let qid = (1..self.used_qids.len())
            .find(|&q| !self.used_qids[q])
            .ok_or_else(|| {
                NvmeError::Invalid(format!(
                    "all {} I/O queues are in use",
                    self.io_queues_granted
                ))
            })? as u16;
        let waker = self.queue.waker()?;
        let mut qp = QueuePair::new(
            &mut self.queue,
            qid,
            entries,
            self.regs.clone(),
            waker,
            self.dbbuf.clone(),
            Some(self.graveyard.clone()),
        )?;
        if let Err(e) = self.create_pair(&qp) {
            // Refused: whatever the controller kept cannot reach this
            // memory once it is unshared.
            qp.unshare(&mut self.queue)?;
            return Err(e);
        }
        self.used_qids[qid as usize] = true;
        Ok(IoQueue::new(qp, self.id, self.incarnation))
    }

    /// Create the completion queue, then the submission queue, of `qp`
    /// (the completion queue goes again when the submission queue is
    /// refused).
    fn create_pair(&mut self, qp: &QueuePair) -> Result<()> {
        let (qid, entries) = (qp.qid(), qp.entries());
        let mut sqe = Sqe {
            opcode: AdminOp::CreateCq as u8,
            ..Sqe::default()
        };
        CreateQueue {
            qid,
            entries,
            contiguous: true,
            other: 0,
            base: qp.cq_base(),
        }
        .encode(&mut sqe);
        self.admin_command(&format!("create I/O completion queue {qid}"), sqe)?;
        let mut sqe = Sqe {
            opcode: AdminOp::CreateSq as u8,
            ..Sqe::default()
        };
        CreateQueue {
            qid,
            entries,
            contiguous: true,
            other: qid,
            base: qp.sq_base(),
        }
        .encode(&mut sqe);
        if let Err(e) = self.admin_command(&format!("create I/O submission queue {qid}"), sqe) {
            let _ = self.delete_queue(AdminOp::DeleteCq, qid);
            return Err(e);
        }
        Ok(())
    }

    fn delete_queue(&mut self, op: AdminOp, qid: u16) -> Result<()> {
        self.admin_command(
            &format!("delete queue {qid}"),
            Sqe {
                opcode: op as u8,
                cdw: [qid as u32, 0, 0, 0, 0, 0],
                ..Sqe::default()
            },
        )?;
        Ok(())
    }

    /// Delete an I/O queue pair (its submission queue, then its
    /// completion queue).
    ///
    /// The queue's memory leaves the controller's domain whatever the
    /// controller answers: one that failed to delete the queue faults on
    /// its next access instead of writing into reused memory.
    pub fn delete_io_queue(&mut self, q: IoQueue) -> Result<()> {
        self.owns(&q)?;
        let mut qp = q.into_pair();
        let qid = qp.qid();
        let deleted = self
            .delete_queue(AdminOp::DeleteSq, qid)
            .and_then(|()| self.delete_queue(AdminOp::DeleteCq, qid));
        qp.unshare(&mut self.queue)?;
        deleted?;
        if let Some(u) = self.used_qids.get_mut(qid as usize) {
            *u = false;
        }
        Ok(())
    }

    /// `Ok` when `q` is one of this controller's queues (another's queue
    /// id here is another queue).
    fn owns(&self, q: &IoQueue) -> Result<()> {
        match q.owner == self.id {
            true => Ok(()),
            false => Err(NvmeError::Invalid(format!(
                "I/O queue {} belongs to another controller",
                q.qid()
            ))),
        }
    }

    /// Normal shutdown (CC.SHN = 1), waiting for CSTS.SHST = complete.
    pub fn shutdown(&mut self) -> Result<()> {
        let mut cc = Cc::from_u32(self.regs.load32(regs::CC));
        cc.shn = 1;
        self.regs.store32(regs::CC, cc.to_u32());
        self.queue.wake_engine()?;
        wait_for(&self.regs, admin_timeout(&self.cap), "shutdown", |c| {
            c & regs::CSTS_SHST_MASK == regs::CSTS_SHST_COMPLETE
        })
    }
}

/// Poll CSTS until `done` (the engine may be asleep: the caller woke it).
/// Reset the controller, point it at the admin queue `admin`, enable it
/// and wait until it is ready.
fn enable(regs: &Registers, waker: &Waker, cap: Cap, admin: &QueuePair) -> Result<()> {
    regs.store32(regs::CC, 0);
    waker.wake()?;
    let deadline = Duration::from_millis(500 * cap.to.max(1) as u64);
    wait_for(regs, deadline, "reset (CSTS.RDY = 0)", |c| {
        c & regs::CSTS_RDY == 0
    })?;
    let entries = admin.entries();
    regs.store32(regs::AQA, regs::aqa_encode(entries, entries));
    regs.store64(regs::ASQ, admin.sq_base());
    regs.store64(regs::ACQ, admin.cq_base());
    let cc = Cc {
        en: true,
        iosqes: 6,
        iocqes: 4,
        ..Cc::default()
    };
    regs.store32(regs::CC, cc.to_u32());
    waker.wake()?;
    wait_for(regs, deadline, "enable (CSTS.RDY = 1)", |c| {
        c & (regs::CSTS_RDY | regs::CSTS_CFS) != 0
    })?;
    if regs.load32(regs::CSTS) & regs::CSTS_CFS != 0 {
        return Err(NvmeError::Fatal("on enable".into()));
    }
    Ok(())
}

fn wait_for(
    regs: &Registers,
    timeout: Duration,
    what: &str,
    done: impl Fn(u32) -> bool,
) -> Result<()> {
    let t = Instant::now();
    while !done(regs.load32(regs::CSTS)) {
        if t.elapsed() > timeout {
            return Err(NvmeError::Timeout(what.to_string()));
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    Ok(())
}

/// Bytes of a queue of `entries` entries of `size` bytes, whole pages.
pub(crate) fn queue_bytes(entries: u32, size: usize) -> usize {
    (entries as usize * size).next_multiple_of(PAGE as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An admin command waits as long as the controller says its worst
    /// case is (CAP.TO), never less than five seconds: it gave up after 5 s
    /// on this controller's 10 s.
    #[test]
    fn admin_commands_wait_for_the_controllers_worst_case() {
        let cap = |to: u8| Cap {
            to,
            ..Cap::from_u64(0)
        };
        assert_eq!(admin_timeout(&cap(0)), ADMIN_TIMEOUT);
        assert_eq!(admin_timeout(&cap(20)), Duration::from_secs(10));
        assert_eq!(admin_timeout(&cap(255)), Duration::from_millis(127_500));
    }
}
