//! One controller driven directly, the way the engine drives it (register
//! block, `service` passes, client memory behind a `Dma`), by a minimal
//! driver written here from the specification: the enable/reset/shutdown
//! sequence, queue rules, phase tags and back-pressure, statuses, features,
//! PRP lists, shadow doorbells, invalid doorbells and the engine's sleep,
//! and asynchronous events.

use std::os::unix::fs::FileExt;

use wd_nvme::msg::cmd::{feature, GetLogPage};
use wd_nvme::msg::regs::{self, Cc};
use wd_nvme::msg::{AdminOp, Cqe, IoOp, Sqe, Status};

mod common;
use common::*;

impl Rig {
    /// Run one I/O command through SQ 1 (whose tail is `*tail`) and
    /// return its completion, which lands at CQ slot `*head`.
    fn io(&mut self, s: Sqe, tail: &mut u32, head: &mut u32, entries: u32) -> Cqe {
        self.io_put(*tail, &s);
        *tail = (*tail + 1) % entries;
        self.regs.store32(regs::sq_tail_doorbell(1), *tail);
        self.pass();
        let c = self.io_cqe(*head);
        *head = (*head + 1) % entries;
        self.regs.store32(regs::cq_head_doorbell(1), *head);
        c
    }
}

#[test]
fn enable_reset_shutdown_and_bad_configurations() {
    let mut r = Rig::new(&["0:4M"]);
    let cap = regs::Cap::from_u64(r.regs.load64(regs::CAP));
    assert_eq!(
        (cap.mqes, cap.cqr, cap.css & 1, cap.mpsmin),
        (4095, true, 1, 0)
    );
    assert_eq!(r.regs.load32(regs::VS), regs::VERSION_1_4);
    // Reset: ready goes, and with it the I/O queues.
    r.io_queues(8, 8);
    r.regs.store32(regs::CC, 0);
    r.pass();
    assert_eq!(r.csts() & regs::CSTS_RDY, 0);
    r.enable();
    let c = r.create(AdminOp::CreateSq, 1, 8, 1, IOSQ);
    assert_eq!(c, Status::CQ_INVALID, "queues are gone after reset");
    // A page size the controller does not support: fatal status until reset.
    r.regs.store32(regs::CC, 0);
    r.pass();
    let bad = Cc {
        en: true,
        mps: 1,
        iosqes: 6,
        iocqes: 4,
        ..Cc::default()
    };
    r.regs.store32(regs::CC, bad.to_u32());
    r.pass();
    assert_eq!(r.csts() & (regs::CSTS_CFS | regs::CSTS_RDY), regs::CSTS_CFS);
    // An admin queue of zero entries' worth of memory at 0: fatal too.
    r.regs.store32(regs::CC, 0);
    r.pass();
    assert_eq!(r.csts(), 0, "reset clears fatal status");
    r.regs.store64(regs::ASQ, 0);
    r.regs.store32(
        regs::CC,
        Cc {
            en: true,
            ..Cc::default()
        }
        .to_u32(),
    );
    r.pass();
    assert_ne!(r.csts() & regs::CSTS_CFS, 0);
    // Shutdown: SHST complete, then nothing more is processed.
    r.enable();
    let mut cc = Cc::from_u32(r.regs.load32(regs::CC));
    cc.shn = 1;
    r.regs.store32(regs::CC, cc.to_u32());
    r.pass();
    assert_eq!(r.csts() & regs::CSTS_SHST_MASK, regs::CSTS_SHST_COMPLETE);
    let s = Sqe {
        opcode: AdminOp::Identify as u8,
        prp1: DATA,
        cid: 77,
        cdw: [1, 0, 0, 0, 0, 0],
        ..Sqe::default()
    };
    r.mem.put(ASQ + r.asq_tail as u64 * 64, &s.to_bytes());
    r.regs.store32(regs::sq_tail_doorbell(0), r.asq_tail + 1);
    r.pass();
    assert!(
        r.admin_cqe().is_none(),
        "a shut-down controller runs nothing"
    );
}

#[test]
fn phase_tags_wrap_and_a_full_completion_queue_holds_commands_back() {
    let mut r = Rig::new(&["0:4M"]);
    // A completion queue of 4 entries holds 3 completions; 7 flushes wait
    // in an 8-entry submission queue.
    r.io_queues(8, 4);
    for i in 0..7u16 {
        let mut s = sqe(IoOp::Flush as u8);
        s.nsid = 1;
        s.cid = 100 + i;
        r.io_put(i as u32, &s);
    }
    r.regs.store32(regs::sq_tail_doorbell(1), 7);
    r.pass();
    let got: Vec<Cqe> = (0..4).map(|i| r.io_cqe(i)).collect();
    assert!(got[..3].iter().all(|c| c.phase && c.status.is_success()));
    assert!(!got[3].phase, "no completion overwrites an unconsumed slot");
    assert_eq!(got[2].sq_head, 3);
    // Commands wait for the driver, not for the controller: the engine may
    // sleep (a driver that never consumes does not keep a core spinning),
    // until the head doorbell says there is room.
    let blocked = r.pass();
    assert_eq!((blocked.work, blocked.busy), (0, false));
    assert!(!r.ctl.prepare_sleep(), "nothing to do before the driver");
    r.regs.store32(regs::cq_head_doorbell(1), 3);
    assert!(
        r.ctl.prepare_sleep(),
        "consumed completions wake the engine"
    );
    // Consume them: three more, the queue wraps and the phase flips.
    r.pass();
    let c3 = r.io_cqe(3);
    let (c0, c1) = (r.io_cqe(0), r.io_cqe(1));
    assert!(c3.phase && !c0.phase && !c1.phase, "phase flips on wrap");
    assert_eq!((c3.cid, c0.cid, c1.cid), (103, 104, 105));
    r.regs.store32(regs::cq_head_doorbell(1), 2);
    r.pass();
    let c2 = r.io_cqe(2);
    assert_eq!((c2.cid, c2.phase, c2.sq_head), (106, false, 7));
    // A head doorbell beyond the queue is an error event, not a crash.
    let aer = r.next_cid;
    r.next_cid += 1;
    let s = Sqe {
        opcode: AdminOp::AsyncEvent as u8,
        cid: aer,
        ..Sqe::default()
    };
    r.mem.put(ASQ + r.asq_tail as u64 * 64, &s.to_bytes());
    r.asq_tail += 1;
    r.regs.store32(regs::sq_tail_doorbell(0), r.asq_tail);
    r.pass();
    assert!(
        r.admin_cqe().is_none(),
        "an event request waits for an event"
    );
    r.regs.store32(regs::sq_tail_doorbell(1), 99);
    r.pass();
    r.pass();
    let ev = r.admin_cqe().expect("asynchronous event");
    assert_eq!(ev.cid, aer);
    // Error status event, invalid doorbell write value, error log page.
    assert_eq!(ev.result & 7, 0);
    assert_eq!(ev.result >> 8 & 0xff, 1);
    assert_eq!(ev.result >> 16 & 0xff, 1);
}

#[test]
fn commands_complete_with_the_statuses_the_specification_names() {
    let mut r = Rig::new(&["0:4M", "4M:4M:512"]);
    r.io_queues(16, 16);
    let (mut t, mut h) = (0, 0);
    let mut io = |r: &mut Rig, s: Sqe| r.io(s, &mut t, &mut h, 16).status;
    assert_eq!(io(&mut r, sqe(0x7f)), Status::INVALID_OPCODE);
    assert_eq!(
        io(&mut r, rw(IoOp::Read, 2, 0, 1, DATA, 0)),
        Status::INVALID_NAMESPACE,
        "not attached"
    );
    assert_eq!(
        io(&mut r, rw(IoOp::Read, 9, 0, 1, DATA, 0)),
        Status::INVALID_NAMESPACE
    );
    assert_eq!(
        io(&mut r, rw(IoOp::Read, 1, 1023, 2, DATA, DATA + 4096)),
        Status::LBA_OUT_OF_RANGE
    );
    assert_eq!(
        io(&mut r, rw(IoOp::Read, 1, u64::MAX, 1, DATA, 0)),
        Status::LBA_OUT_OF_RANGE
    );
    // Over MDTS (256 KiB).
    assert_eq!(
        io(&mut r, rw(IoOp::Read, 1, 0, 65, DATA, DATA + 0x40000)),
        Status::INVALID_FIELD
    );
    let mut fused = rw(IoOp::Read, 1, 0, 1, DATA, 0);
    fused.fuse = 1;
    assert_eq!(io(&mut r, fused), Status::INVALID_FIELD);
    let mut sgl = rw(IoOp::Read, 1, 0, 1, DATA, 0);
    sgl.psdt = 1;
    assert_eq!(io(&mut r, sgl), Status::INVALID_FIELD);
    // PRP rules: a second page with an offset, a misaligned first entry,
    // memory outside the client's.
    assert_eq!(
        io(&mut r, rw(IoOp::Read, 1, 0, 1, DATA + 0x800, DATA + 0x2010)),
        Status::PRP_OFFSET_INVALID
    );
    assert_eq!(
        io(&mut r, rw(IoOp::Read, 1, 0, 1, DATA + 2, 0)),
        Status::PRP_OFFSET_INVALID
    );
    assert_eq!(
        io(&mut r, rw(IoOp::Read, 1, 0, 1, 0x1000, 0)),
        Status::DATA_TRANSFER_ERROR
    );
    assert_eq!(
        io(&mut r, rw(IoOp::Read, 1, 0, 3, DATA, 0x7000_0000)),
        Status::DATA_TRANSFER_ERROR,
        "list unreadable"
    );
    // A 256 KiB write through a PRP list that starts 16 bytes before the
    // end of its page: two entries there, the second chaining to the next
    // list page.
    let data: Vec<u8> = (0..0x40000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    r.mem.put(DATA, &data);
    let list = DATA + 0x60000;
    let first_list = list + 4096 - 16;
    let pages: Vec<u64> = (1..64).map(|k| DATA + k * 4096).collect();
    r.mem.put(first_list, &pages[0].to_le_bytes());
    let next_list = list + 0x2000;
    r.mem.put(first_list + 8, &next_list.to_le_bytes());
    for (i, p) in pages[1..].iter().enumerate() {
        r.mem.put(next_list + 8 * i as u64, &p.to_le_bytes());
    }
    assert_eq!(
        io(&mut r, rw(IoOp::Write, 1, 8, 64, DATA, first_list)),
        Status::SUCCESS
    );
    let f = std::fs::File::open(&r.store).unwrap();
    let mut back = vec![0u8; data.len()];
    f.read_exact_at(&mut back, 8 * 4096).unwrap();
    assert!(back == data, "the store holds the data the PRP list named");
    r.mem.put(DATA, &vec![0; data.len()]);
    assert_eq!(
        io(&mut r, rw(IoOp::Read, 1, 8, 64, DATA, first_list)),
        Status::SUCCESS
    );
    assert!(r.mem.get(DATA, data.len()) == data);
    assert_eq!(
        io(&mut r, rw(IoOp::Compare, 1, 8, 64, DATA, first_list)),
        Status::SUCCESS
    );
    r.mem.put(DATA + 100, &[!data[100]]);
    assert_eq!(
        io(&mut r, rw(IoOp::Compare, 1, 8, 64, DATA, first_list)),
        Status::COMPARE_FAILURE
    );
    // Write Zeroes with deallocate reads back as zeroes.
    let mut wz = rw(IoOp::WriteZeroes, 1, 8, 2, 0, 0);
    wz.cdw[2] |= 1 << 25;
    assert_eq!(io(&mut r, wz), Status::SUCCESS);
    assert_eq!(
        io(&mut r, rw(IoOp::Read, 1, 8, 2, DATA, DATA + 4096)),
        Status::SUCCESS
    );
    assert!(r.mem.get(DATA, 8192).iter().all(|&b| b == 0));
    // The error log has the failures, newest first, with their command
    // ids and statuses.
    let mut s = sqe(AdminOp::GetLogPage as u8);
    GetLogPage {
        lid: GetLogPage::ERROR,
        len: 128,
        offset: 0,
    }
    .encode(&mut s);
    s.prp1 = DATA + 0x70000;
    assert!(r.admin(s).status.is_success());
    let log = r.mem.get(DATA + 0x70000, 128);
    let count = u64::from_le_bytes(log[0..8].try_into().unwrap());
    let older = u64::from_le_bytes(log[64..72].try_into().unwrap());
    assert_eq!(count, older + 1);
    let st = u16::from_le_bytes(log[12..14].try_into().unwrap()) >> 1;
    assert_eq!(Status::from_field(st), Status::COMPARE_FAILURE);
}

#[test]
fn shadow_doorbells_and_event_index_let_the_engine_sleep() {
    let mut r = Rig::new(&["0:4M"]);
    r.io_queues(8, 8);
    r.shadow_doorbells();
    // The tail now comes from the shadow page, not the register.
    let mut s = sqe(IoOp::Flush as u8);
    s.nsid = 1;
    s.cid = 5;
    r.io_put(0, &s);
    r.mem.put(SHADOW + 8, &1u32.to_le_bytes());
    let done = r.pass();
    assert_eq!(done.requests, 1);
    assert_eq!(r.io_cqe(0).cid, 5);
    r.mem.put(SHADOW + 12, &1u32.to_le_bytes());
    // An idle pass arms EventIdx at the head; then the engine may sleep.
    let idle = r.pass();
    assert_eq!((idle.work, idle.busy), (0, false));
    assert_eq!(r.mem.get(EVENTS + 8, 4), 1u32.to_le_bytes());
    assert!(!r.ctl.prepare_sleep(), "nothing pending");
    // A driver crossing EventIdx writes the register too: the sleeping
    // engine's check sees it.
    r.io_put(1, &s);
    r.mem.put(SHADOW + 8, &2u32.to_le_bytes());
    r.regs.store32(regs::sq_tail_doorbell(1), 2);
    assert!(r.ctl.prepare_sleep(), "a register write wakes the engine");
    assert_eq!(r.pass().requests, 1);
}

/// With shadow doorbells a full completion queue lets the engine sleep
/// too: the idle pass writes the queue's head EventIdx, so the driver's
/// next head also goes to the register, which the wake-up check reads.
#[test]
fn a_full_completion_queue_with_shadow_doorbells_wakes_the_engine() {
    let mut r = Rig::new(&["0:4M"]);
    r.io_queues(8, 4);
    r.shadow_doorbells();
    for i in 0..5u16 {
        r.io_put(i as u32, &flush(10 + i));
    }
    // SQ 1 tail at shadow offset 8, CQ 1 head at 12.
    r.mem.put(SHADOW + 8, &5u32.to_le_bytes());
    assert_eq!(r.pass().requests, 3, "three fit in a queue of four");
    let idle = r.pass();
    assert_eq!((idle.work, idle.busy), (0, false));
    assert_eq!(
        r.mem.get(EVENTS + 12, 4),
        0u32.to_le_bytes(),
        "head EventIdx"
    );
    assert!(!r.ctl.prepare_sleep());
    // A head in the shadow only, before the engine slept: seen there.
    r.mem.put(SHADOW + 12, &1u32.to_le_bytes());
    assert_eq!(r.pass().requests, 1);
    let idle = r.pass();
    assert_eq!((idle.work, idle.busy), (0, false));
    assert_eq!(r.mem.get(EVENTS + 12, 4), 1u32.to_le_bytes());
    assert!(!r.ctl.prepare_sleep());
    // The driver consumes two more, crossing EventIdx: shadow and register.
    r.mem.put(SHADOW + 12, &3u32.to_le_bytes());
    r.regs.store32(regs::cq_head_doorbell(1), 3);
    assert!(r.ctl.prepare_sleep(), "the head register wakes the engine");
    assert_eq!(r.pass().requests, 1, "the last command completes");
    assert_eq!(r.io_cqe(0).cid, 14);
}

/// A completion queue that fills after the idle spell armed EventIdx (a
/// submission woke the engine, and the queue was full by then) is armed
/// too before the engine sleeps again: else its head EventIdx stays where
/// an earlier spell left it, the driver's next head move does not cross
/// it, goes to the shadow only, and the waiting command sleeps with the
/// engine.
#[test]
fn a_queue_that_fills_while_armed_is_armed_too() {
    let mut r = Rig::new(&["0:4M"]);
    r.io_queues(8, 4);
    r.shadow_doorbells();
    for i in 0..5u16 {
        r.io_put(i as u32, &flush(20 + i));
    }
    // SQ 1 tail at shadow offset 8, CQ 1 head at 12 (EventIdx alike).
    let head_event = |r: &Rig| u32::from_le_bytes(r.mem.get(EVENTS + 12, 4).try_into().unwrap());
    // Four submitted, three fit: the idle pass arms the head at 0.
    r.mem.put(SHADOW + 8, &4u32.to_le_bytes());
    assert_eq!(r.pass().requests, 3);
    assert_eq!(r.pass().work, 0);
    assert_eq!(head_event(&r), 0);
    // The driver consumes one (crossing 0: the register too); the fourth
    // completes and the queue is full again with nothing waiting.
    r.mem.put(SHADOW + 12, &1u32.to_le_bytes());
    r.regs.store32(regs::cq_head_doorbell(1), 1);
    assert!(r.ctl.prepare_sleep());
    assert_eq!(r.pass().requests, 1);
    assert_eq!(r.pass().work, 0, "an idle spell, armed");
    assert!(!r.ctl.prepare_sleep());
    // A fifth crosses the tail's EventIdx (register, wake-up) and finds
    // the queue full: this pass must move the head's EventIdx to 1.
    r.mem.put(SHADOW + 8, &5u32.to_le_bytes());
    r.regs.store32(regs::sq_tail_doorbell(1), 5);
    assert!(r.ctl.prepare_sleep());
    let p = r.pass();
    assert_eq!((p.requests, p.busy), (0, false));
    assert!(!r.ctl.prepare_sleep(), "armed: the engine may sleep");
    assert_eq!(head_event(&r), 1, "armed at the head, not left at 0");
    // The driver consumes one more, 1 to 2, crossing 1: the register.
    r.mem.put(SHADOW + 12, &2u32.to_le_bytes());
    r.regs.store32(regs::cq_head_doorbell(1), 2);
    assert!(r.ctl.prepare_sleep(), "the head wakes the engine");
    assert_eq!(r.pass().requests, 1);
}

#[test]
fn queue_creation_is_validated() {
    let mut r = Rig::new(&["0:4M"]);
    assert_eq!(
        r.create(AdminOp::CreateCq, 0, 8, 0, IOCQ),
        Status::INVALID_QUEUE_ID
    );
    assert_eq!(
        r.create(AdminOp::CreateCq, 17, 8, 0, IOCQ),
        Status::INVALID_QUEUE_ID
    );
    assert_eq!(
        r.create(AdminOp::CreateCq, 1, 1, 0, IOCQ),
        Status::INVALID_QUEUE_SIZE
    );
    assert_eq!(
        r.create(AdminOp::CreateCq, 1, 5000, 0, IOCQ),
        Status::INVALID_QUEUE_SIZE
    );
    assert_eq!(
        r.create(AdminOp::CreateCq, 1, 8, 0, IOCQ + 8),
        Status::PRP_OFFSET_INVALID
    );
    assert_eq!(
        r.create(AdminOp::CreateCq, 1, 8, 0, 0x1000),
        Status::DATA_TRANSFER_ERROR
    );
    assert!(r.create(AdminOp::CreateCq, 1, 8, 0, IOCQ).is_success());
    assert_eq!(
        r.create(AdminOp::CreateCq, 1, 8, 0, IOCQ),
        Status::INVALID_QUEUE_ID
    );
    assert_eq!(
        r.create(AdminOp::CreateSq, 1, 8, 2, IOSQ),
        Status::CQ_INVALID
    );
    assert!(r.create(AdminOp::CreateSq, 1, 8, 1, IOSQ).is_success());
    let del = |op: AdminOp, qid: u32| Sqe {
        opcode: op as u8,
        cdw: [qid, 0, 0, 0, 0, 0],
        ..Sqe::default()
    };
    assert_eq!(
        r.admin(del(AdminOp::DeleteCq, 1)).status,
        Status::INVALID_QUEUE_DELETION
    );
    assert!(r.admin(del(AdminOp::DeleteSq, 1)).status.is_success());
    assert_eq!(
        r.admin(del(AdminOp::DeleteSq, 1)).status,
        Status::INVALID_QUEUE_ID
    );
    assert!(r.admin(del(AdminOp::DeleteCq, 1)).status.is_success());
    assert_eq!(
        r.admin(del(AdminOp::DeleteCq, 0)).status,
        Status::INVALID_QUEUE_ID
    );
    // Unknown admin opcodes, and Keep Alive (not advertised).
    assert_eq!(r.admin(sqe(0x55)).status, Status::INVALID_OPCODE);
    assert_eq!(
        r.admin(sqe(AdminOp::KeepAlive as u8)).status,
        Status::INVALID_OPCODE
    );
}

/// A store that cannot zero a range in place (tmpfs refuses
/// FALLOC_FL_ZERO_RANGE) still zeroes by punching the range out: Write
/// Zeroes and a Dataset Management command of 256 whole-namespace ranges
/// cost the polling thread a few system calls, not the zeroes of
/// hundreds of MiB written one chunk at a time.
#[test]
fn zeroing_on_tmpfs_writes_no_zeroes() {
    let shm = std::path::Path::new("/dev/shm");
    if !shm.is_dir() {
        wd_testutil::skip("zeroing_on_tmpfs_writes_no_zeroes", "no /dev/shm");
        return;
    }
    let mut r = Rig::ready(Rig::bare_on(shm, &["0:64M"]));
    r.io_queues(8, 8);
    let (mut tail, mut head) = (0, 0);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&r.store)
        .unwrap();
    let ones = vec![0xa5u8; 1 << 20];
    for at in (0..64u64 << 20).step_by(1 << 20) {
        f.write_all_at(&ones, at).unwrap();
    }
    let zeroed = |r: &Rig, from: u64, len: u64| {
        let f = std::fs::File::open(&r.store).unwrap();
        let mut b = vec![0u8; len as usize];
        f.read_exact_at(&mut b, from).unwrap();
        b.iter().all(|&x| x == 0)
    };
    // Write Zeroes of 16384 blocks (64 MiB), no deallocate asked.
    let before = wd_sys::syscalls_on_this_thread();
    let wz = rw(IoOp::WriteZeroes, 1, 0, 16384, 0, 0);
    assert_eq!(r.io(wz, &mut tail, &mut head, 8).status, Status::SUCCESS);
    let calls = wd_sys::syscalls_on_this_thread() - before;
    assert!(calls < 16, "{calls} system calls to zero 64 MiB");
    assert!(zeroed(&r, 0, 64 << 20));
    // Dataset Management: 256 ranges, each the whole namespace.
    for at in (0..64u64 << 20).step_by(1 << 20) {
        f.write_all_at(&ones, at).unwrap();
    }
    let mut list = Vec::new();
    for _ in 0..256 {
        list.extend_from_slice(&0u32.to_le_bytes());
        list.extend_from_slice(&16384u32.to_le_bytes());
        list.extend_from_slice(&0u64.to_le_bytes());
    }
    r.mem.put(DATA, &list);
    let mut dsm = sqe(IoOp::Dsm as u8);
    dsm.nsid = 1;
    dsm.cdw[0] = 255; // 256 ranges
    dsm.cdw[1] = 1 << 2; // deallocate
    dsm.prp1 = DATA;
    let before = wd_sys::syscalls_on_this_thread();
    assert_eq!(r.io(dsm, &mut tail, &mut head, 8).status, Status::SUCCESS);
    let calls = wd_sys::syscalls_on_this_thread() - before;
    assert!(calls < 16, "{calls} system calls to deallocate 256 ranges");
    assert!(zeroed(&r, 0, 64 << 20));
}

/// An idle, enabled controller lets the engine sleep; then the driver
/// writes an admin tail doorbell beyond the queue. The controller reports
/// it (once) and runs nothing: there is no work, so the engine must be
/// allowed to sleep. A hostile client must not keep a host core polling.
#[test]
fn an_invalid_admin_tail_doorbell_lets_the_engine_sleep() {
    let mut r = Rig::new(&["0:4M"]);
    sleeps_after_tail(&mut r, 0, ADMIN_ENTRIES + 100);
}

/// Write `tail` to queue `qid`'s tail doorbell of an idle controller: after
/// a few passes (that run nothing) the engine may sleep.
fn sleeps_after_tail(r: &mut Rig, qid: u16, tail: u32) {
    r.pass();
    assert!(!r.ctl.prepare_sleep(), "idle controller may sleep");
    r.regs.store32(regs::sq_tail_doorbell(qid), tail);
    for _ in 0..3 {
        let s = r.pass();
        assert_eq!(s.requests, 0);
    }
    assert!(
        !r.ctl.prepare_sleep(),
        "an invalid tail doorbell is no work: the engine must be allowed to sleep"
    );
}

/// The same for an I/O submission queue without shadow doorbells.
#[test]
fn an_invalid_io_tail_doorbell_lets_the_engine_sleep() {
    let mut r = Rig::new(&["0:4M"]);
    r.io_queues(8, 8);
    sleeps_after_tail(&mut r, 1, 0xffff);
}

/// Shadow doorbells: the driver stores the shadow tail, fences, reads
/// EventIdx, writes the register, then checks NEED_WAKEUP (not yet set).
/// A pass may read the shadow tail before the driver's store and the
/// register after it. Regression: it took the register value as seen, the
/// wake-up check compared the register with that value only, and neither
/// side saw the other's store: the engine slept (up to the sleep timeout)
/// with a command waiting. A register the shadow did not show is news.
#[test]
fn a_register_doorbell_seen_before_its_shadow_tail_still_wakes_the_engine() {
    let mut r = Rig::new(&["0:4M"]);
    r.io_queues(8, 8);
    r.shadow_doorbells();
    // An idle spell: EventIdx armed at the head (0).
    for _ in 0..3 {
        r.pass();
    }
    assert!(!r.ctl.prepare_sleep(), "idle: may sleep");
    let ev = u32::from_le_bytes(r.mem.get(EVENTS + 8, 4).try_into().unwrap());
    assert_eq!(ev, 0, "EventIdx of SQ 1 is its head");
    r.io_put(0, &flush(7));
    // The pass reads the shadow tail (still 0) before the driver's
    // shadow store, and the register (already 1) after the driver's
    // register store: the same observations as this order.
    r.regs.store32(regs::sq_tail_doorbell(1), 1);
    let s = r.pass();
    assert_eq!(s.requests, 0, "the shadow tail was read before the store");
    r.mem.put(SHADOW + 8, &1u32.to_le_bytes());
    // The engine sets NEED_WAKEUP, fences and asks whether work came.
    assert!(
        r.ctl.prepare_sleep(),
        "a submission is waiting (shadow tail 1, head 0) but the engine may sleep"
    );
}

/// NVMe Base 5.2.26.2.1: "If a Set Features command is issued for this
/// Feature after creation of any I/O Submission and/or I/O Completion
/// Queues, then the Set Features command shall abort with status code of
/// Command Sequence Error."
#[test]
fn number_of_queues_after_a_completion_queue_is_a_sequence_error() {
    let mut r = Rig::new(&["0:4M"]);
    r.mem.put(IOCQ, &[0; 0x1000]);
    assert_eq!(r.create(AdminOp::CreateCq, 1, 8, 0, IOCQ), Status::SUCCESS);
    let c = r.admin(set_features(feature::NUMBER_OF_QUEUES, 3 | 3 << 16));
    assert_eq!(c.status, Status::SEQUENCE_ERROR);
}

/// NVMe Base 5.3.2 (Create I/O Submission Queue, CQID): "If the value
/// specified: a) is 0h (i.e., the Admin Completion Queue), then the
/// controller shall abort the command with a status code of Invalid Queue
/// Identifier; b) is outside the range supported by the controller, then
/// ... Invalid Queue Identifier".
#[test]
fn create_sq_on_the_admin_or_an_out_of_range_cq_is_an_invalid_queue_id() {
    let mut r = Rig::new(&["0:4M"]);
    assert_eq!(
        r.create(AdminOp::CreateSq, 1, 8, 0, IOSQ),
        Status::INVALID_QUEUE_ID,
        "CQID 0"
    );
    assert_eq!(
        r.create(AdminOp::CreateSq, 1, 8, 300, IOSQ),
        Status::INVALID_QUEUE_ID,
        "CQID beyond the queues offered"
    );
}

/// NVMe Base, Temperature Threshold: THSEL "selects the threshold type
/// that is modified by a Set Features command and whose threshold value is
/// returned by a Get Features command". Setting the under-temperature
/// threshold must not change the over-temperature one.
#[test]
fn temperature_thresholds_are_kept_per_threshold_type() {
    let mut r = Rig::new(&["0:4M"]);
    let over = r
        .admin(get_features(feature::TEMPERATURE_THRESHOLD, 0))
        .result
        & 0xffff;
    assert_eq!(over, 343);
    // THSEL 01b: under-temperature threshold, 200 K.
    let c = r.admin(set_features(feature::TEMPERATURE_THRESHOLD, 200 | 1 << 20));
    assert!(c.status.is_success());
    let over = r
        .admin(get_features(feature::TEMPERATURE_THRESHOLD, 0))
        .result
        & 0xffff;
    assert_eq!(over, 343, "the over-temperature threshold changed");
    let under = r.admin(get_features(feature::TEMPERATURE_THRESHOLD, 1 << 20));
    assert_eq!(under.result, 200, "the threshold alone, in bits 15:0");
    // A temperature sensor (none is reported) and a reserved THSEL.
    for bad in [300 | 1 << 16, 300 | 2 << 20] {
        let c = r.admin(set_features(feature::TEMPERATURE_THRESHOLD, bad));
        assert_eq!(c.status, Status::INVALID_FIELD, "{bad:#x}");
        let c = r.admin(get_features(feature::TEMPERATURE_THRESHOLD, bad));
        assert_eq!(c.status, Status::INVALID_FIELD, "{bad:#x}");
    }
}

/// NVMe Base 3.1.4.5 (CC.SHN): "If the host write to this property that
/// initiates a shutdown also clears the EN bit from '1' to '0', then both
/// a Controller Reset and a controller shutdown occur."
#[test]
fn a_shutdown_written_with_en_cleared_is_a_reset_and_a_shutdown() {
    let mut r = Rig::new(&["0:4M"]);
    let cc = (cc_enabled() & !1) | 1 << 14;
    r.regs.store32(regs::CC, cc);
    r.pass();
    let csts = r.csts();
    assert_eq!(csts & regs::CSTS_RDY, 0, "reset");
    assert_eq!(
        csts & regs::CSTS_SHST_MASK,
        regs::CSTS_SHST_COMPLETE,
        "shutdown never reported complete"
    );
    // Enabling again starts over: ready, no shutdown status.
    r.enable();
}
