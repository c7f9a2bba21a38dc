//! A whole mediated NVMe controller driven by a hostile client: register
//! writes (CC, AQA, ASQ/ACQ, doorbells), writes into its memory (queues,
//! PRP lists, data), well-formed admin and I/O commands with fuzzed
//! fields (so the input reaches the I/O path without building every entry
//! itself), engine passes and sleep checks, in any order, with the memory
//! reached in place or through copies. The controller must never panic,
//! never reach outside the client's memory (the flat memory faults there)
//! and keep answering.
#![no_main]
use std::os::fd::AsFd;
use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use wd_device::{DeviceQueue, Driver, Registers};
use wd_fuzz::Input;
use wd_nvme::msg::cmd::CreateQueue;
use wd_nvme::msg::regs;
use wd_nvme::msg::{AdminOp, IoOp, Sqe, SQE_SIZE};
use wd_nvme::{IoEngine, NvmeDriver};
use wd_testutil::dma::FlatMemory;

const BASE: u64 = 0x10_0000;
const MEM: usize = 64 * 1024;
/// Admin queues of the well-formed enable (16 entries each).
const ASQ: u64 = BASE;
const ACQ: u64 = BASE + 0x1000;
const ADMIN_ENTRIES: u32 = 16;
/// I/O queue pairs the command templates use: SQ `qid` at
/// `BASE + 0x2000 * qid`, its CQ a page further, 16 entries each.
const IO_PAIRS: u16 = 3;
const IO_ENTRIES: u32 = 16;
/// Data, PRP lists and the like: the rest of the memory.
const DATA: u64 = BASE + 0x8000;

/// The device, made once: two 1 MiB namespaces (4 KiB and 512-byte
/// blocks) on a small store in the temporary directory, unlinked once
/// open.
fn driver() -> &'static NvmeDriver {
    static D: OnceLock<NvmeDriver> = OnceLock::new();
    D.get_or_init(|| {
        let store = std::env::temp_dir().join(format!("wd-fuzz-nvme-{}.img", std::process::id()));
        let _ = std::fs::write(&store, b"");
        let s = store.display();
        let d = NvmeDriver::new(
            &[format!("{s}:0:1M"), format!("{s}:1M:1M:512")],
            IoEngine::Sync,
        )
        .expect("namespaces");
        // The namespaces hold the store open: its name can go now, so
        // no run leaves a file behind.
        let _ = std::fs::remove_file(&store);
        d
    })
}

/// What this target reads beyond plain fields.
trait ControllerInput {
    fn index(&mut self) -> u32;
    fn addr(&mut self) -> u64;
}

impl ControllerInput for Input<'_> {
    /// A doorbell or queue index: small most of the time, anything now
    /// and then (invalid values are events, not crashes).
    fn index(&mut self) -> u32 {
        self.mostly_small(0x20, 3)
    }

    /// An address in (or, now and then, just outside) the memory.
    fn addr(&mut self) -> u64 {
        let v = self.take(2);
        if v & 1 != 0 {
            BASE + MEM as u64 - 0x800 + (v & 0xff8)
        } else {
            DATA + (v & 0x7ffc) % (MEM as u64 - 0x8000)
        }
    }
}

/// The driver side this input plays: the tails it rang.
struct Client {
    ctl: Box<dyn DeviceQueue>,
    regs: Registers,
    mem: FlatMemory,
    admin_tail: u32,
    io_tails: [u32; IO_PAIRS as usize + 1],
}

impl Client {
    fn pass(&mut self) {
        let _ = self.ctl.service(&mut self.mem);
    }

    fn admin(&mut self, s: &Sqe) {
        self.mem.put(
            ASQ + self.admin_tail as u64 * SQE_SIZE as u64,
            &s.to_bytes(),
        );
        self.admin_tail = (self.admin_tail + 1) % ADMIN_ENTRIES;
        self.regs
            .store32(regs::sq_tail_doorbell(0), self.admin_tail);
    }

    /// Enable with the well-formed admin queues, ask Identify Controller
    /// for this controller's id (what Namespace Attachment must name),
    /// then reset and forget everything: the input starts from a
    /// controller that is off, with zeroed memory and registers.
    fn learn_cntlid(&mut self) -> u16 {
        self.enable();
        self.pass();
        self.admin(&Sqe {
            opcode: AdminOp::Identify as u8,
            prp1: DATA,
            cdw: [1, 0, 0, 0, 0, 0],
            ..Sqe::default()
        });
        self.pass();
        let id = self.mem.get(DATA + 78, 2);
        self.regs.store32(regs::CC, 0);
        self.pass();
        for reg in [
            regs::AQA,
            regs::ASQ,
            regs::ASQ + 4,
            regs::ACQ,
            regs::ACQ + 4,
        ] {
            self.regs.store32(reg, 0);
        }
        self.mem = FlatMemory::new(BASE, MEM);
        self.admin_tail = 0;
        u16::from_le_bytes([id[0], id[1]])
    }

    /// Reset, then enable with the well-formed admin queues.
    fn enable(&mut self) {
        self.regs.store32(regs::CC, 0);
        self.pass();
        self.admin_tail = 0;
        self.io_tails = [0; IO_PAIRS as usize + 1];
        self.regs
            .store32(regs::AQA, regs::aqa_encode(ADMIN_ENTRIES, ADMIN_ENTRIES));
        self.regs.store64(regs::ASQ, ASQ);
        self.regs.store64(regs::ACQ, ACQ);
        self.regs.store32(regs::CC, 1 | 6 << 16 | 4 << 20);
    }

    fn io(&mut self, qid: u16, s: &Sqe) {
        let t = &mut self.io_tails[qid as usize];
        let at = BASE + 0x2000 * qid as u64 + *t as u64 * SQE_SIZE as u64;
        *t = (*t + 1) % IO_ENTRIES;
        let tail = *t;
        self.mem.put(at, &s.to_bytes());
        self.regs.store32(regs::sq_tail_doorbell(qid), tail);
    }
}

fuzz_target!(|data: &[u8]| {
    let ctl = driver().open_queue(0);
    let fd = wd_sys::memfd_create("regs", false).unwrap();
    wd_sys::ftruncate(fd.as_fd(), regs::BLOCK_BYTES as u64).unwrap();
    let map = Arc::new(wd_sys::Mapping::map_shared(fd.as_fd(), 0, regs::BLOCK_BYTES).unwrap());
    let r = Registers::new(map, 0, regs::BLOCK_BYTES).unwrap();
    let mut c = Client {
        ctl,
        regs: r.clone(),
        mem: FlatMemory::new(BASE, MEM),
        admin_tail: 0,
        io_tails: [0; IO_PAIRS as usize + 1],
    };
    c.ctl.attach_registers(r.clone());
    let cntlid = c.learn_cntlid();
    let mut inp = Input::new(data);
    while !inp.done() {
        let op = inp.take(1);
        match op % 10 {
            // A register: CC, AQA, ASQ, ACQ or a doorbell.
            0 => {
                let which = inp.take(1) as usize % 5;
                match which {
                    0 => r.store32(regs::CC, inp.take(4) as u32),
                    1 => r.store32(regs::AQA, inp.take(4) as u32),
                    2 => r.store64(regs::ASQ, BASE + inp.take(2) % MEM as u64),
                    3 => r.store64(regs::ACQ, BASE + inp.take(2) % MEM as u64),
                    _ => {
                        let db = inp.take(1) as usize % (2 * (regs::MAX_IO_QUEUES as usize + 1));
                        r.store32(regs::DOORBELLS + 4 * db, inp.index());
                    }
                }
            }
            // Bytes into the client's memory (entries, lists, data).
            1 | 2 => {
                let at = inp.take(2) % MEM as u64;
                let want = inp.take(1) as usize;
                c.mem.put(BASE + at, inp.raw(want.min(MEM - at as usize)));
            }
            // A well-formed enable, so the rest of the input reaches the
            // command loop.
            3 => c.enable(),
            // A well-formed admin command with fuzzed fields.
            4 => {
                let kind = inp.take(1);
                let qid = (kind >> 4) as u16 % (IO_PAIRS + 1);
                let mut s = Sqe {
                    cid: inp.take(2) as u16,
                    ..Sqe::default()
                };
                match kind % 7 {
                    0 | 1 => {
                        let cq = kind.is_multiple_of(7);
                        let base = BASE + 0x2000 * qid as u64 + if cq { 0x1000 } else { 0 };
                        s.opcode = if cq {
                            AdminOp::CreateCq
                        } else {
                            AdminOp::CreateSq
                        } as u8;
                        CreateQueue {
                            qid,
                            entries: IO_ENTRIES,
                            contiguous: true,
                            other: if cq { 0 } else { qid },
                            base,
                        }
                        .encode(&mut s);
                        if !cq {
                            c.io_tails[qid as usize] = 0;
                        }
                    }
                    2 | 3 => {
                        s.opcode = if kind % 7 == 2 {
                            AdminOp::DeleteSq
                        } else {
                            AdminOp::DeleteCq
                        } as u8;
                        s.cdw[0] = qid as u32;
                    }
                    4 => {
                        // Attach (or detach) namespace 1 or 2: the list
                        // names this controller, mostly.
                        s.opcode = AdminOp::NsAttach as u8;
                        s.nsid = 1 + (kind >> 4) as u32 % 2;
                        s.cdw[0] = (kind >> 6) as u32 & 1;
                        let list = DATA;
                        let id = match inp.take(1) {
                            0 => 0,
                            1 => cntlid ^ 1,
                            _ => cntlid,
                        };
                        let mut l = [0u8; 4];
                        l[0] = 1;
                        l[2..4].copy_from_slice(&id.to_le_bytes());
                        c.mem.put(list, &l);
                        s.prp1 = list;
                    }
                    5 => {
                        s.opcode = AdminOp::DoorbellBuffer as u8;
                        s.prp1 = BASE + 0x7000;
                        s.prp2 = BASE + 0x7000 + (inp.take(1) & 1) * 0x800 + 0x800;
                    }
                    _ => {
                        s.opcode = inp.take(1) as u8;
                        s.nsid = inp.take(4) as u32;
                        s.prp1 = inp.addr();
                        s.prp2 = inp.addr();
                        s.cdw[0] = inp.take(4) as u32;
                        s.cdw[1] = inp.take(4) as u32;
                    }
                }
                c.admin(&s);
            }
            // A well-formed I/O command with fuzzed fields.
            5 => {
                let kind = inp.take(1);
                let qid = 1 + (kind >> 4) as u16 % IO_PAIRS;
                let op = [
                    IoOp::Read,
                    IoOp::Write,
                    IoOp::Compare,
                    IoOp::Flush,
                    IoOp::WriteZeroes,
                    IoOp::Dsm,
                ][kind as usize % 6];
                let mut s = Sqe {
                    opcode: op as u8,
                    cid: inp.take(2) as u16,
                    nsid: 1 + inp.take(1) as u32 % 3,
                    prp1: inp.addr(),
                    prp2: inp.addr(),
                    ..Sqe::default()
                };
                let slba = inp.take(2);
                s.cdw[0] = slba as u32;
                s.cdw[2] = inp.take(1) as u32 | (inp.take(1) as u32) << 24;
                s.cdw[1] = inp.take(1) as u32;
                c.io(qid, &s);
            }
            6 => {
                let _ = c.ctl.prepare_sleep();
            }
            7 => {
                let on = inp.take(1) & 1 == 0;
                c.mem.set_slices(on);
            }
            _ => c.pass(),
        }
        c.pass();
    }
    c.ctl.quiesce();
});
