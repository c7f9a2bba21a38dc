//! A controller driven directly by the tests (register block, `service`
//! passes, client memory in a [`FlatMemory`]) through a tiny driver
//! written here: what both controller test files share.

// Each test binary uses a part of it.
#![allow(dead_code)]

use std::os::fd::AsFd;
use std::sync::Arc;

use wd_device::{DeviceQueue, Driver, Registers};
use wd_nvme::msg::cmd::CreateQueue;
use wd_nvme::msg::identify::{cns, ControllerInfo, IDENTIFY_BYTES};
use wd_nvme::msg::regs::{self, Cc};
use wd_nvme::msg::{AdminOp, Cqe, IoOp, Sqe, Status, CQE_SIZE, SQE_SIZE};
use wd_nvme::{IoEngine, NvmeDriver};
use wd_testutil::dma::FlatMemory;

/// Client memory (IOVA): queues, shadow doorbells, then data.
pub const BASE: u64 = 0x10_0000;
pub const ASQ: u64 = BASE;
pub const ACQ: u64 = BASE + 0x1000;
pub const IOSQ: u64 = BASE + 0x2000;
pub const IOCQ: u64 = BASE + 0x3000;
pub const SHADOW: u64 = BASE + 0x4000;
pub const EVENTS: u64 = BASE + 0x5000;
pub const DATA: u64 = BASE + 0x10_0000;
pub const MEM: usize = 2 << 20;
pub const ADMIN_ENTRIES: u32 = 8;
pub const MIB: u64 = 1 << 20;

/// A controller, its registers, the client's memory and the driver's
/// admin queue state.
pub struct Rig {
    pub ctl: Box<dyn DeviceQueue>,
    pub regs: Registers,
    pub mem: FlatMemory,
    pub store: std::path::PathBuf,
    pub _dir: wd_testutil::TempDir,
    pub asq_tail: u32,
    pub acq_head: u32,
    pub acq_phase: bool,
    pub next_cid: u16,
    pub cntlid: u16,
}

pub fn sqe(opcode: u8) -> Sqe {
    Sqe {
        opcode,
        ..Sqe::default()
    }
}

/// A Flush of namespace 1 with command id `cid`.
pub fn flush(cid: u16) -> Sqe {
    let mut s = sqe(IoOp::Flush as u8);
    s.nsid = 1;
    s.cid = cid;
    s
}

pub fn rw(op: IoOp, nsid: u32, slba: u64, nlb: u32, prp1: u64, prp2: u64) -> Sqe {
    let mut s = sqe(op as u8);
    s.nsid = nsid;
    s.cdw[0] = slba as u32;
    s.cdw[1] = (slba >> 32) as u32;
    s.cdw[2] = nlb - 1;
    s.prp1 = prp1;
    s.prp2 = prp2;
    s
}

/// Set Features `fid` to `v` (CDW11).
pub fn set_features(fid: u8, v: u32) -> Sqe {
    Sqe {
        opcode: AdminOp::SetFeatures as u8,
        cdw: [fid as u32, v, 0, 0, 0, 0],
        ..Sqe::default()
    }
}

/// Get Features `fid`, CDW11 `v`.
pub fn get_features(fid: u8, v: u32) -> Sqe {
    Sqe {
        opcode: AdminOp::GetFeatures as u8,
        cdw: [fid as u32, v, 0, 0, 0, 0],
        ..Sqe::default()
    }
}

pub fn cc_enabled() -> u32 {
    Cc {
        en: true,
        iosqes: 6,
        iocqes: 4,
        ..Cc::default()
    }
    .to_u32()
}

/// A device (synchronous I/O) on namespaces `specs` (`OFFSET:SIZE[:BLOCK]`)
/// of a fresh store in a new directory under `base`: the driver, the
/// directory and the store's path.
pub fn device_on(
    base: &std::path::Path,
    specs: &[&str],
) -> (NvmeDriver, wd_testutil::TempDir, std::path::PathBuf) {
    device_with(base, specs, IoEngine::Sync)
}

fn device_with(
    base: &std::path::Path,
    specs: &[&str],
    engine: IoEngine,
) -> (NvmeDriver, wd_testutil::TempDir, std::path::PathBuf) {
    let dir = wd_testutil::tempdir_in(base, "wd-nvme-spec", 0o755);
    let store = dir.path().join("store.img");
    let specs: Vec<String> = specs
        .iter()
        .map(|s| format!("{}:{s}", store.display()))
        .collect();
    let driver = NvmeDriver::new(&specs, engine).unwrap();
    (driver, dir, store)
}

/// A controller whose reads and writes go on its io_uring where they can
/// (`IoEngine::Ring`), on namespaces `specs` of a fresh store under the
/// temporary directory, enabled with namespace 1 attached and its memory
/// holdable; with an IOVA in the data area whose memory meets any
/// O_DIRECT alignment (512 bytes; page-aligned IOVAs need not be).
pub fn ring_rig(specs: &[&str]) -> (Rig, u64) {
    let (driver, dir, store) = device_with(&std::env::temp_dir(), specs, IoEngine::Ring);
    let mut r = Rig::ready(Rig::of(&driver, dir, store));
    r.mem.set_holds(true);
    let ptr = wd_device::Dma::slice(&mut r.mem, DATA, 4096, wd_device::Access::Read)
        .unwrap()
        .as_ptr() as u64;
    (r, DATA + (512 - ptr % 512) % 512)
}

/// A controller on namespaces `specs` whose subsystem the test keeps (to
/// add and remove namespaces), enabled with namespace 1 attached.
pub fn rig_with_subsystem(specs: &[&str]) -> (Rig, Arc<wd_nvme::Subsystem>) {
    let (driver, dir, store) = device_on(&std::env::temp_dir(), specs);
    let sub = driver.subsystem().clone();
    (Rig::ready(Rig::of(&driver, dir, store)), sub)
}

impl Rig {
    /// A controller on a fresh store with namespaces `specs`
    /// (`OFFSET:SIZE[:BLOCK]`), not yet enabled.
    pub fn bare(specs: &[&str]) -> Rig {
        Rig::bare_on(&std::env::temp_dir(), specs)
    }

    /// As [`Rig::bare`], the store in a new directory under `base` (a
    /// file system of its own kind, such as tmpfs).
    pub fn bare_on(base: &std::path::Path, specs: &[&str]) -> Rig {
        let (driver, dir, store) = device_on(base, specs);
        Rig::of(&driver, dir, store)
    }

    /// A new controller of `driver` (registers attached, not enabled); it
    /// keeps `dir` (its store's, or one of its own) for as long as it lives.
    pub fn of(driver: &NvmeDriver, dir: wd_testutil::TempDir, store: std::path::PathBuf) -> Rig {
        let mut ctl = driver.open_queue(0);
        let fd = wd_sys::memfd_create("regs", false).unwrap();
        wd_sys::ftruncate(fd.as_fd(), regs::BLOCK_BYTES as u64).unwrap();
        let map = Arc::new(wd_sys::Mapping::map_shared(fd.as_fd(), 0, regs::BLOCK_BYTES).unwrap());
        let r = Registers::new(map, 0, regs::BLOCK_BYTES).unwrap();
        ctl.attach_registers(r.clone());
        Rig {
            ctl,
            regs: r,
            mem: FlatMemory::new(BASE, MEM),
            store,
            _dir: dir,
            asq_tail: 0,
            acq_head: 0,
            acq_phase: true,
            next_cid: 1,
            cntlid: 0,
        }
    }

    /// Enabled, its controller id learnt, namespace 1 attached.
    pub fn new(specs: &[&str]) -> Rig {
        Rig::ready(Rig::bare(specs))
    }

    /// `r` enabled, its controller id learnt, namespace 1 attached.
    pub fn ready(mut r: Rig) -> Rig {
        r.enable();
        let info = ControllerInfo::from_bytes(&r.identify(cns::CONTROLLER, 0).unwrap());
        r.cntlid = info.cntlid;
        assert_eq!(r.attach(1), Status::SUCCESS);
        r
    }

    pub fn pass(&mut self) -> wd_device::Service {
        self.ctl.service(&mut self.mem)
    }

    pub fn csts(&self) -> u32 {
        self.regs.load32(regs::CSTS)
    }

    /// Disable, configure the admin queue, enable: ready.
    pub fn enable(&mut self) {
        self.regs.store32(regs::CC, 0);
        self.pass();
        assert_eq!(self.csts() & regs::CSTS_RDY, 0);
        self.mem.put(ACQ, &[0; 0x1000]);
        self.asq_tail = 0;
        self.acq_head = 0;
        self.acq_phase = true;
        self.regs
            .store32(regs::AQA, regs::aqa_encode(ADMIN_ENTRIES, ADMIN_ENTRIES));
        self.regs.store64(regs::ASQ, ASQ);
        self.regs.store64(regs::ACQ, ACQ);
        self.regs.store32(regs::CC, cc_enabled());
        self.pass();
        assert_eq!(self.csts(), regs::CSTS_RDY, "ready, nothing else");
    }

    /// The admin completion at the head, if its phase says it is new.
    pub fn admin_cqe(&mut self) -> Option<Cqe> {
        let at = ACQ + self.acq_head as u64 * CQE_SIZE as u64;
        let c = Cqe::from_bytes(&self.mem.get(at, CQE_SIZE).try_into().unwrap());
        if c.phase != self.acq_phase {
            return None;
        }
        self.acq_head = (self.acq_head + 1) % ADMIN_ENTRIES;
        if self.acq_head == 0 {
            self.acq_phase = !self.acq_phase;
        }
        self.regs.store32(regs::cq_head_doorbell(0), self.acq_head);
        Some(c)
    }

    /// Put an admin command in the queue and ring; its command id.
    pub fn admin_submit(&mut self, mut s: Sqe) -> u16 {
        s.cid = self.next_cid;
        self.next_cid += 1;
        self.mem
            .put(ASQ + self.asq_tail as u64 * SQE_SIZE as u64, &s.to_bytes());
        self.asq_tail = (self.asq_tail + 1) % ADMIN_ENTRIES;
        self.regs.store32(regs::sq_tail_doorbell(0), self.asq_tail);
        s.cid
    }

    /// Run one admin command; its completion.
    pub fn admin(&mut self, s: Sqe) -> Cqe {
        let cid = self.admin_submit(s);
        self.pass();
        let c = self.admin_cqe().expect("admin completion");
        assert_eq!((c.cid, c.sq_id, c.sq_head as u32), (cid, 0, self.asq_tail));
        c
    }

    /// Identify with CNS `cns` for `nsid`, into DATA: the structure, or
    /// the failed status.
    pub fn identify(&mut self, cns: u8, nsid: u32) -> Result<Box<[u8; IDENTIFY_BYTES]>, Status> {
        self.mem.put(DATA, &[0xee; IDENTIFY_BYTES]);
        let c = self.admin(Sqe {
            opcode: AdminOp::Identify as u8,
            nsid,
            prp1: DATA,
            cdw: [cns as u32, 0, 0, 0, 0, 0],
            ..Sqe::default()
        });
        if !c.status.is_success() {
            return Err(c.status);
        }
        Ok(Box::new(
            self.mem.get(DATA, IDENTIFY_BYTES).try_into().unwrap(),
        ))
    }

    pub fn attach(&mut self, nsid: u32) -> Status {
        self.attachment(nsid, false)
    }

    /// Namespace Attachment of `nsid` to (or from) this controller.
    pub fn attachment(&mut self, nsid: u32, detach: bool) -> Status {
        let list = DATA + 0x8_0000;
        let mut l = vec![0u8; 4096];
        l[0..2].copy_from_slice(&1u16.to_le_bytes());
        l[2..4].copy_from_slice(&self.cntlid.to_le_bytes());
        self.mem.put(list, &l);
        self.admin(Sqe {
            opcode: AdminOp::NsAttach as u8,
            nsid,
            prp1: list,
            cdw: [detach as u32, 0, 0, 0, 0, 0],
            ..Sqe::default()
        })
        .status
    }

    pub fn create(&mut self, op: AdminOp, qid: u16, entries: u32, other: u16, base: u64) -> Status {
        let mut s = sqe(op as u8);
        CreateQueue {
            qid,
            entries,
            contiguous: true,
            other,
            base,
        }
        .encode(&mut s);
        self.admin(s).status
    }

    pub fn delete(&mut self, op: AdminOp, qid: u16) -> Status {
        self.admin(Sqe {
            opcode: op as u8,
            cdw: [qid as u32, 0, 0, 0, 0, 0],
            ..Sqe::default()
        })
        .status
    }

    /// I/O queue pair 1 (SQ of `sq` entries, CQ of `cq`), CQ memory
    /// zeroed first.
    pub fn io_queues(&mut self, sq: u32, cq: u32) {
        self.mem.put(IOCQ, &[0; 0x1000]);
        assert_eq!(
            self.create(AdminOp::CreateCq, 1, cq, 0, IOCQ),
            Status::SUCCESS
        );
        assert_eq!(
            self.create(AdminOp::CreateSq, 1, sq, 1, IOSQ),
            Status::SUCCESS
        );
    }

    /// Doorbell Buffer Config: shadow doorbells at `SHADOW`, EventIdx at
    /// `EVENTS` (SQ 1's tail at offset 8 of each, CQ 1's head at 12).
    pub fn shadow_doorbells(&mut self) {
        let c = self.admin(Sqe {
            opcode: AdminOp::DoorbellBuffer as u8,
            prp1: SHADOW,
            prp2: EVENTS,
            ..Sqe::default()
        });
        assert!(c.status.is_success());
    }

    pub fn io_put(&mut self, slot: u32, s: &Sqe) {
        self.mem
            .put(IOSQ + slot as u64 * SQE_SIZE as u64, &s.to_bytes());
    }

    pub fn io_cqe(&self, slot: u32) -> Cqe {
        let at = IOCQ + slot as u64 * CQE_SIZE as u64;
        Cqe::from_bytes(&self.mem.get(at, CQE_SIZE).try_into().unwrap())
    }

    /// Pending events: submit an Asynchronous Event Request; it must be
    /// held (no completion yet). Its command id.
    pub fn aer(&mut self) -> u16 {
        let cid = self.admin_submit(sqe(AdminOp::AsyncEvent as u8));
        self.pass();
        assert!(self.admin_cqe().is_none(), "an event request waits");
        cid
    }
}
