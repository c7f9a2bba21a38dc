//! More of the specification, on one controller driven directly (register
//! block, `service` passes, client memory in a [`FlatMemory`]) by a tiny
//! driver written here. `controller_spec.rs` covers enable/reset/shutdown,
//! queue rules, statuses, PRP lists, shadow doorbells and events; this
//! file covers what it leaves out: Identify, fatal admin queue
//! attributes, queues re-created with stale doorbells, many laps of phase
//! tags against a model, back-pressure released through a shadow head,
//! invalid completion head doorbells, the event limit and event masking,
//! a reset with submissions pending, data placed at a namespace's offset
//! in the store, namespace attachment between two controllers, and a
//! detach with writes on the I/O ring.

use std::os::unix::fs::FileExt;

use wd_nvme::msg::cmd::{feature, GetLogPage};
use wd_nvme::msg::identify::{self, cns, ControllerInfo, NamespaceInfo, IDENTIFY_BYTES};
use wd_nvme::msg::regs::{self, Cc};
use wd_nvme::msg::{AdminOp, Cqe, IoOp, Sqe, Status, CQE_SIZE};

mod common;
use common::*;

#[test]
fn identify_describes_the_controller_and_its_namespaces() {
    let mut r = Rig::new(&["0:4M", "4M:2M:512", "6M:1M"]);
    let c = ControllerInfo::from_bytes(&r.identify(cns::CONTROLLER, 0).unwrap());
    assert_eq!(c.version, regs::VERSION_1_4);
    assert_eq!(c.nn, 3, "NN is the largest namespace id");
    assert_eq!(c.mdts, 6, "256 KiB transfers, as the I/O path enforces");
    assert_ne!(c.oacs & identify::OACS_DOORBELL_BUFFER, 0);
    assert_eq!(
        c.oncs,
        identify::ONCS_COMPARE | identify::ONCS_DSM | identify::ONCS_WRITE_ZEROES | ONCS_SSFS
    );
    assert_eq!(c.aerl, 3);
    assert!(c.subnqn.starts_with("nqn."));
    let raw = r.identify(cns::CONTROLLER, 0).unwrap();
    // SQES / CQES: 64- and 16-byte entries, required and maximum.
    assert_eq!((raw[512], raw[513]), (0x66, 0x44));
    // An attached namespace: its size and block size.
    let n1 = NamespaceInfo::from_bytes(&r.identify(cns::NAMESPACE, 1).unwrap());
    assert_eq!((n1.nsze, n1.ncap, n1.block_size()), (1024, 1024, 4096));
    // A namespace that exists but is not attached here: all zeroes.
    assert!(r
        .identify(cns::NAMESPACE, 2)
        .unwrap()
        .iter()
        .all(|&b| b == 0));
    assert_eq!(r.attach(2), Status::SUCCESS);
    let n2 = NamespaceInfo::from_bytes(&r.identify(cns::NAMESPACE, 2).unwrap());
    assert_eq!((n2.nsze, n2.block_size()), (4096, 512));
    assert_ne!(n1.nguid, n2.nguid, "namespace ids are unique");
    // One that does not exist, and the broadcast id.
    assert_eq!(
        r.identify(cns::NAMESPACE, 9).unwrap_err(),
        Status::INVALID_NAMESPACE
    );
    assert_eq!(
        r.identify(cns::NAMESPACE, 0).unwrap_err(),
        Status::INVALID_NAMESPACE
    );
    // Active namespaces here, after an NSID; allocated ones.
    let list = |b: Box<[u8; IDENTIFY_BYTES]>| identify::parse_nsid_list(&b);
    assert_eq!(list(r.identify(cns::ACTIVE_NAMESPACES, 0).unwrap()), [1, 2]);
    assert_eq!(list(r.identify(cns::ACTIVE_NAMESPACES, 1).unwrap()), [2]);
    assert_eq!(
        list(r.identify(cns::ALLOCATED_NAMESPACES, 0).unwrap()),
        [1, 2, 3]
    );
    assert_eq!(
        r.identify(cns::ACTIVE_NAMESPACES, 0xffff_fffe).unwrap_err(),
        Status::INVALID_NAMESPACE
    );
    // Descriptors: EUI-64 then NGUID, as Identify Namespace has them.
    let d = r.identify(cns::NS_DESCRIPTORS, 2).unwrap();
    assert_eq!((d[0], d[1], d[12], d[13]), (1, 8, 2, 16));
    assert_eq!(&d[4..12], &n2.eui64);
    assert_eq!(&d[16..32], &n2.nguid);
    assert_eq!(
        r.identify(cns::NS_DESCRIPTORS, 3).unwrap_err(),
        Status::INVALID_NAMESPACE,
        "not attached"
    );
    assert_eq!(r.identify(0x7f, 0).unwrap_err(), Status::INVALID_FIELD);
    // A structure that starts mid-page continues in PRP2's page.
    let whole = r.identify(cns::CONTROLLER, 0).unwrap();
    r.mem.put(DATA, &[0; 3 * 4096]);
    let c = r.admin(Sqe {
        opcode: AdminOp::Identify as u8,
        prp1: DATA + 0x800,
        prp2: DATA + 0x2000,
        cdw: [cns::CONTROLLER as u32, 0, 0, 0, 0, 0],
        ..Sqe::default()
    });
    assert_eq!(c.status, Status::SUCCESS);
    assert_eq!(r.mem.get(DATA + 0x800, 0x800), whole[..0x800]);
    assert_eq!(r.mem.get(DATA + 0x2000, 0x800), whole[0x800..]);
    assert!(
        r.mem.get(DATA + 0x1000, 0x1000).iter().all(|&b| b == 0),
        "the rest of PRP1's page is not written"
    );
}

#[test]
fn admin_queue_attributes_and_command_sets_it_cannot_run_are_fatal() {
    let mut r = Rig::bare(&["0:4M"]);
    let fatal = |r: &mut Rig, aqa: u32, cc: u32, what: &str| {
        r.regs.store32(regs::CC, 0);
        r.pass();
        assert_eq!(r.csts(), 0, "{what}: reset clears everything");
        r.regs.store32(regs::AQA, aqa);
        r.regs.store64(regs::ASQ, ASQ);
        r.regs.store64(regs::ACQ, ACQ);
        r.regs.store32(regs::CC, cc);
        r.pass();
        assert_eq!(
            r.csts() & (regs::CSTS_CFS | regs::CSTS_RDY),
            regs::CSTS_CFS,
            "{what}: fatal, not ready"
        );
        // Nothing runs: an admin command stays unanswered.
        r.mem.put(ASQ, &sqe(AdminOp::Identify as u8).to_bytes());
        r.regs.store32(regs::sq_tail_doorbell(0), 1);
        r.pass();
        assert!(
            r.mem.get(ACQ, CQE_SIZE).iter().all(|&b| b == 0),
            "{what}: no completion"
        );
        r.regs.store32(regs::sq_tail_doorbell(0), 0);
    };
    // One-entry admin queues (ASQS or ACQS of 0): the minimum is two.
    fatal(&mut r, regs::aqa_encode(1, 8), cc_enabled(), "ASQS 0");
    fatal(&mut r, regs::aqa_encode(8, 1), cc_enabled(), "ACQS 0");
    // A command set other than NVM.
    let css = Cc {
        css: 1,
        ..Cc::from_u32(cc_enabled())
    };
    fatal(&mut r, regs::aqa_encode(8, 8), css.to_u32(), "CSS 1");
    // And after all that, a good configuration runs.
    r.enable();
    assert!(r.identify(cns::CONTROLLER, 0).is_ok());
}

/// Regression: a queue created again with the id of a deleted one
/// started at the doorbell values the old queue left behind, so the
/// controller replayed entries the driver never submitted. NVMe Base 1.4
/// §4.1: a queue's head and tail entry pointers are 0h when it is
/// created; a driver writes a doorbell only to move it, never 0.
#[test]
fn a_recreated_queue_starts_at_zero_whatever_its_doorbells_hold() {
    let mut r = Rig::new(&["0:4M"]);
    r.io_queues(8, 8);
    // Three writes of a pattern at LBA 0..3, completed and consumed; the
    // doorbells hold tail 3 and head 3 afterwards, as the driver left them.
    r.mem.put(DATA, &[0xab; 4096]);
    for i in 0..3u32 {
        let mut s = rw(IoOp::Write, 1, i as u64, 1, DATA, 0);
        s.cid = 10 + i as u16;
        r.io_put(i, &s);
    }
    r.regs.store32(regs::sq_tail_doorbell(1), 3);
    r.pass();
    assert!((0..3).all(|i| r.io_cqe(i).status.is_success()));
    r.regs.store32(regs::cq_head_doorbell(1), 3);
    r.pass();
    assert_eq!(r.delete(AdminOp::DeleteSq, 1), Status::SUCCESS);
    assert_eq!(r.delete(AdminOp::DeleteCq, 1), Status::SUCCESS);
    // The store is rewritten behind the controller's back; the old
    // entries are still in the (reused) submission queue memory.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&r.store)
        .unwrap();
    f.write_all_at(&[0u8; 3 * 4096], 0).unwrap();
    // Created again (the passes that run these admin commands also look
    // at SQ 1), then one more pass.
    r.io_queues(8, 8);
    r.pass();
    let mut back = vec![0u8; 3 * 4096];
    f.read_exact_at(&mut back, 0).unwrap();
    assert!(
        back.iter().all(|&b| b == 0),
        "old writes were replayed into the store"
    );
    assert!(!r.io_cqe(0).phase, "a completion for nothing submitted");
    // The driver's first command goes to slot 0 and it rings tail 1.
    r.io_put(0, &flush(42));
    r.regs.store32(regs::sq_tail_doorbell(1), 1);
    r.pass();
    let c = r.io_cqe(0);
    assert_eq!((c.cid, c.phase, c.sq_head), (42, true, 1));
}

#[test]
fn phase_tags_stay_right_over_many_laps_against_a_model() {
    // An 8-entry SQ posting to a 4-entry CQ (3 usable slots): the driver
    // submits and consumes in random batches; every completion is checked
    // against the order of submission, its phase against the lap, and no
    // slot is ever written while the driver has not consumed it.
    let mut r = Rig::new(&["0:4M"]);
    let (sqn, cqn) = (8u32, 4u32);
    r.io_queues(sqn, cqn);
    let mut rng = wd_testutil::Rng::new(0x9e37_79b9_7f4a_7c15);
    // Submitted and not consumed; posted and not consumed.
    let (mut tail, mut submitted, mut posted) = (0u32, 0u32, 0u32);
    let (mut head, mut phase) = (0u32, true);
    let mut next = 0u16;
    let mut expect = std::collections::VecDeque::new();
    let mut done = 0;
    while done < 500 {
        // Submit up to the room the SQ has (one entry stays empty).
        for _ in 0..rng.below((sqn - 1 - submitted) as u64 + 1) {
            r.io_put(tail, &flush(next));
            expect.push_back(next);
            next = next.wrapping_add(1);
            tail = (tail + 1) % sqn;
            submitted += 1;
        }
        r.regs.store32(regs::sq_tail_doorbell(1), tail);
        // In place or through copies, pass by pass.
        r.mem.set_slices(rng.below(2) == 0);
        let slot = |k: u32| (head + k) % cqn;
        let unconsumed: Vec<Cqe> = (0..posted).map(|k| r.io_cqe(slot(k))).collect();
        let s = r.pass();
        for (k, c) in unconsumed.iter().enumerate() {
            assert_eq!(
                r.io_cqe(slot(k as u32)),
                *c,
                "an unconsumed entry was overwritten"
            );
        }
        // New entries carry the phase of their lap.
        let mut now = posted;
        while now < cqn && r.io_cqe(slot(now)).phase == (phase ^ (head + now >= cqn)) {
            now += 1;
        }
        assert!(
            now < cqn,
            "the controller filled every slot: a full queue would look empty"
        );
        assert_eq!(s.requests as u32, now - posted);
        // Commands that wait for room wait for the driver: the engine may
        // sleep, and only the head moving wakes it.
        assert!(!s.busy, "waiting for room is not work");
        let waiting = submitted > now;
        if waiting {
            assert!(!r.ctl.prepare_sleep(), "no news before the head moves");
        }
        posted = now;
        // Consume some, in order, and move the head.
        for _ in 0..rng.below(posted as u64 + 1) {
            let c = r.io_cqe(head);
            let want = expect.pop_front().unwrap();
            assert_eq!((c.cid, c.phase, c.sq_id), (want, phase, 1));
            assert!(c.status.is_success());
            head = (head + 1) % cqn;
            if head == 0 {
                phase = !phase;
            }
            submitted -= 1;
            posted -= 1;
            done += 1;
        }
        let moved = r.regs.load32(regs::cq_head_doorbell(1)) != head;
        r.regs.store32(regs::cq_head_doorbell(1), head);
        if waiting && moved {
            assert!(r.ctl.prepare_sleep(), "a moved head wakes the engine");
        }
    }
    assert!(next >= 500);
}

#[test]
fn a_shadow_completion_head_releases_back_pressure() {
    let mut r = Rig::new(&["0:4M"]);
    r.io_queues(8, 4);
    r.shadow_doorbells();
    for i in 0..6u32 {
        r.io_put(i, &flush(i as u16));
    }
    // Tail 6 in the shadow page only: the register stays 0.
    r.mem.put(SHADOW + 8, &6u32.to_le_bytes());
    let s = r.pass();
    assert_eq!((s.requests, s.busy), (3, false));
    assert!(!r.io_cqe(3).phase, "a full queue takes no more");
    // The driver consumes two and says so in the shadow head only.
    r.mem.put(SHADOW + 12, &2u32.to_le_bytes());
    let s = r.pass();
    assert_eq!((s.requests, s.busy), (2, false));
    assert_eq!((r.io_cqe(3).cid, r.io_cqe(0).cid), (3, 4));
    assert!(
        r.io_cqe(0).phase != r.io_cqe(3).phase,
        "lap 2 flips the phase"
    );
    assert_eq!(r.regs.load32(regs::cq_head_doorbell(1)), 0);
    r.mem.put(SHADOW + 12, &1u32.to_le_bytes());
    let s = r.pass();
    assert_eq!((s.requests, s.busy), (1, false));
    assert_eq!((r.io_cqe(1).cid, r.io_cqe(1).sq_head), (5, 6));
}

/// Fill CQ 1 (4 entries: 3 completions) with flushes and a fourth
/// waiting, then write a completion head beyond the queue.
fn full_queue_and_a_bad_head(r: &mut Rig) {
    for i in 0..4u32 {
        r.io_put(i, &flush(i as u16));
    }
    r.regs.store32(regs::sq_tail_doorbell(1), 4);
    r.pass();
    r.regs.store32(regs::cq_head_doorbell(1), 4);
}

#[test]
fn an_invalid_completion_head_doorbell_is_an_event_and_events_are_limited() {
    let mut r = Rig::new(&["0:4M"]);
    r.io_queues(8, 4);
    // Four event requests may be outstanding (AERL 3); a fifth is refused.
    let held: Vec<u16> = (0..4).map(|_| r.aer()).collect();
    assert_eq!(
        r.admin(sqe(AdminOp::AsyncEvent as u8)).status,
        Status::AER_LIMIT_EXCEEDED
    );
    // The controller reads the head when the queue is full, finds it
    // beyond the queue, and reports it.
    full_queue_and_a_bad_head(&mut r);
    r.pass();
    let ev = r.admin_cqe().expect("an event");
    assert!(held.contains(&ev.cid));
    assert_eq!(ev.status, Status::SUCCESS);
    // Error status (type 0), invalid doorbell write value, error log.
    assert_eq!(
        (ev.result & 7, ev.result >> 8 & 0xff, ev.result >> 16 & 0xff),
        (0, 1, 1)
    );
    assert!(!r.io_cqe(3).phase, "nothing posted over the full queue");
    // A good head lets the fourth command complete.
    r.regs.store32(regs::cq_head_doorbell(1), 3);
    r.pass();
    assert_eq!((r.io_cqe(3).cid, r.io_cqe(3).phase), (3, true));
}

/// NVMe Base, Asynchronous Event Information 01h, Invalid Doorbell Write
/// Value: among its causes "the value was out of range of the
/// corresponding queue's base address" and "a host attempts to remove a
/// completion queue entry from an empty Completion Queue". The head was
/// read, and so judged, only when its queue looked full: a bad head
/// written to a queue with room went unreported.
#[test]
fn an_invalid_completion_head_is_an_event_though_its_queue_has_room() {
    let mut r = Rig::new(&["0:4M"]);
    r.io_queues(8, 8);
    for _ in 0..4 {
        r.aer();
    }
    let invalid_value = |r: &mut Rig, what: &str| {
        r.pass();
        let ev = r
            .admin_cqe()
            .unwrap_or_else(|| panic!("no event for {what}"));
        assert_eq!(
            (ev.result & 7, ev.result >> 8 & 0xff, ev.result >> 16 & 0xff),
            (0, 1, 1),
            "error status, invalid doorbell write value, error log: {what}"
        );
        get_log(r, GetLogPage::ERROR, 64);
    };
    // One completion posted and consumed: a valid head, no event.
    r.io_put(0, &flush(0));
    r.regs.store32(regs::sq_tail_doorbell(1), 1);
    r.pass();
    assert!(r.io_cqe(0).phase);
    r.regs.store32(regs::cq_head_doorbell(1), 1);
    r.pass();
    r.pass();
    assert!(r.admin_cqe().is_none(), "a valid head is no event");
    // Past the one entry posted: consuming entries of an empty queue.
    r.regs.store32(regs::cq_head_doorbell(1), 3);
    invalid_value(&mut r, "a head past the tail");
    // Valid again, then beyond the queue's 8 entries.
    r.regs.store32(regs::cq_head_doorbell(1), 1);
    r.pass();
    r.regs.store32(regs::cq_head_doorbell(1), 8);
    invalid_value(&mut r, "a head beyond the queue");
    // Back to a valid head: commands complete as before.
    r.regs.store32(regs::cq_head_doorbell(1), 1);
    r.io_put(1, &flush(1));
    r.regs.store32(regs::sq_tail_doorbell(1), 2);
    r.pass();
    assert_eq!((r.io_cqe(1).cid, r.io_cqe(1).phase), (1, true));
    r.pass();
    assert!(r.admin_cqe().is_none(), "no event for valid heads");
}

/// Regression: while a completion head doorbell stayed invalid, every
/// pass queued the same error event again as soon as the previous one was
/// delivered, so each outstanding Asynchronous Event Request completed
/// with it. Like an invalid tail, an invalid head is reported once, until
/// the driver writes a valid one.
#[test]
fn a_stuck_invalid_head_doorbell_is_reported_once_until_the_log_is_read() {
    let mut r = Rig::new(&["0:4M"]);
    r.io_queues(8, 4);
    for _ in 0..4 {
        r.aer();
    }
    full_queue_and_a_bad_head(&mut r);
    for _ in 0..5 {
        r.pass();
    }
    assert!(r.admin_cqe().is_some(), "the event");
    assert!(
        r.admin_cqe().is_none(),
        "one event, not one per pass: the type is masked until the log is read"
    );
}

/// NVMe Base, Asynchronous Event Information for Error Status 00h: "Write
/// to Invalid Doorbell Register", a doorbell of a queue that was not
/// created. It went unreported; what a deleted queue's doorbell still
/// holds is not such a write.
#[test]
fn a_doorbell_of_a_queue_that_does_not_exist_is_an_event() {
    let mut r = Rig::new(&["0:4M"]);
    r.io_queues(8, 8);
    for _ in 0..4 {
        r.aer();
    }
    // Queue 1 used, then deleted: its doorbells keep their values.
    r.io_put(0, &flush(0));
    r.regs.store32(regs::sq_tail_doorbell(1), 1);
    r.pass();
    assert!(r.io_cqe(0).phase);
    r.regs.store32(regs::cq_head_doorbell(1), 1);
    r.pass();
    assert_eq!(r.delete(AdminOp::DeleteSq, 1), Status::SUCCESS);
    assert_eq!(r.delete(AdminOp::DeleteCq, 1), Status::SUCCESS);
    for _ in 0..3 {
        r.pass();
    }
    assert!(
        r.admin_cqe().is_none(),
        "a deleted queue's doorbells are no write"
    );
    r.regs.store32(regs::sq_tail_doorbell(5), 2);
    r.pass();
    let ev = r.admin_cqe().expect("an event for queue 5's doorbell");
    assert_eq!(ev.status, Status::SUCCESS);
    // Error status (type 0), write to invalid doorbell register (00h),
    // error log.
    assert_eq!(
        (ev.result & 7, ev.result >> 8 & 0xff, ev.result >> 16 & 0xff),
        (0, 0, 1)
    );
}

/// The same for the doorbells of queue ids past those offered (16 I/O
/// queue pairs) but inside the 8 KiB register block, up to its last pair
/// (queue 511): such a queue can never be created, and a write to its
/// doorbell went unreported.
#[test]
fn a_doorbell_past_the_queues_offered_is_an_event() {
    let mut r = Rig::new(&["0:4M"]);
    r.io_queues(8, 8);
    for _ in 0..4 {
        r.aer();
    }
    let last = ((regs::BLOCK_BYTES - regs::DOORBELLS) / 8 - 1) as u16;
    for (qid, bell) in [
        (17, regs::sq_tail_doorbell(17)),
        (last, regs::cq_head_doorbell(last)),
    ] {
        r.regs.store32(bell, 1);
        r.pass();
        let ev = r
            .admin_cqe()
            .unwrap_or_else(|| panic!("no event for queue {qid}'s doorbell"));
        assert_eq!(
            (ev.result & 7, ev.result >> 8 & 0xff, ev.result >> 16 & 0xff),
            (0, 0, 1),
            "write to invalid doorbell register, queue {qid}"
        );
        get_log(&mut r, GetLogPage::ERROR, 64);
    }
    for _ in 0..3 {
        r.pass();
    }
    assert!(r.admin_cqe().is_none(), "one event per write");
}

/// NVMe Base 5.3.4, Delete I/O Submission Queue: "The successful
/// completion of the Delete I/O Submission Queue command indicates an
/// implicit completion status of Command Aborted due to SQ Deletion for
/// any previously submitted I/O commands that did not have a completion
/// queue entry posted by the controller", and after it "the controller
/// shall not post completion status for any I/O commands that were
/// submitted to the deleted I/O Submission Queue". Commands rung but not
/// yet fetched are therefore neither run nor posted, then or later.
#[test]
fn commands_not_fetched_before_their_queue_is_deleted_are_implicitly_aborted() {
    let mut r = Rig::new(&["0:4M"]);
    r.io_queues(8, 8);
    for i in 0..3u32 {
        r.io_put(i, &flush(i as u16));
    }
    r.regs.store32(regs::sq_tail_doorbell(1), 3);
    // The admin queue is served first in a pass: the delete wins.
    let cid = r.admin_submit(Sqe {
        opcode: AdminOp::DeleteSq as u8,
        cdw: [1, 0, 0, 0, 0, 0],
        ..Sqe::default()
    });
    r.pass();
    let c = r.admin_cqe().expect("the delete's completion");
    assert_eq!((c.cid, c.status), (cid, Status::SUCCESS));
    for _ in 0..3 {
        r.pass();
    }
    assert!(
        (0..3).all(|i| !r.io_cqe(i).phase),
        "a completion posted for a command of a deleted queue"
    );
}

/// Create I/O Completion Queue, PRP1: "the PRP Entry shall have an offset
/// of 0h", which address 0 has, so it is not PRP Offset Invalid (QEMU
/// once refused it with Invalid Field, and since checks only the offset);
/// here it is memory outside the controller's domain, like any other
/// queue there: Data Transfer Error.
#[test]
fn a_queue_at_address_zero_is_memory_the_controller_cannot_reach() {
    let mut r = Rig::new(&["0:4M"]);
    assert_eq!(
        r.create(AdminOp::CreateCq, 1, 8, 0, 0),
        Status::DATA_TRANSFER_ERROR
    );
    assert!(r.create(AdminOp::CreateCq, 1, 8, 0, IOCQ).is_success());
    assert_eq!(
        r.create(AdminOp::CreateSq, 1, 8, 1, 0),
        Status::DATA_TRANSFER_ERROR
    );
}

#[test]
fn a_reset_with_submissions_pending_runs_none_of_them() {
    let mut r = Rig::new(&["0:4M"]);
    r.io_queues(8, 8);
    r.mem.put(DATA, &[0x5c; 4096]);
    for i in 0..4u32 {
        r.io_put(i, &rw(IoOp::Write, 1, i as u64, 1, DATA, 0));
    }
    // The driver rings, then resets before the controller looked: the
    // reset wins (CC is read first in a pass).
    r.regs.store32(regs::sq_tail_doorbell(1), 4);
    r.regs.store32(regs::CC, 0);
    let s = r.pass();
    assert_eq!(s.requests, 0);
    assert_eq!(r.csts() & regs::CSTS_RDY, 0);
    assert_eq!(
        r.regs.load32(regs::sq_tail_doorbell(1)),
        0,
        "doorbells start over"
    );
    r.enable();
    assert_eq!(r.pass().requests, 0);
    let mut back = vec![0u8; 4 * 4096];
    std::fs::File::open(&r.store)
        .unwrap()
        .read_exact_at(&mut back, 0)
        .unwrap();
    assert!(back.iter().all(|&b| b == 0), "no write reached the store");
    // Namespace attachment outlived the reset.
    r.io_queues(8, 8);
    r.io_put(0, &flush(1));
    r.regs.store32(regs::sq_tail_doorbell(1), 1);
    r.pass();
    assert_eq!(r.io_cqe(0).status, Status::SUCCESS);
}

#[test]
fn data_lands_at_the_namespace_offset_and_reads_back_in_place() {
    data_at_the_namespace_offset(true);
}

#[test]
fn data_lands_at_the_namespace_offset_and_reads_back_through_copies() {
    data_at_the_namespace_offset(false);
}

/// Namespace 2 starts 1 MiB into the store, with 512-byte blocks; the
/// device reaches memory in place (`slices`) or through copies.
fn data_at_the_namespace_offset(slices: bool) {
    let mut r = Rig::new(&["0:1M", "1M:1M:512"]);
    r.mem.set_slices(slices);
    assert_eq!(r.attach(2), Status::SUCCESS);
    let store = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&r.store)
        .unwrap();
    store.write_all_at(&[0x11; MIB as usize], 0).unwrap();
    r.io_queues(16, 16);
    let (mut tail, mut head) = (0u32, 0u32);
    let mut io = |r: &mut Rig, s: Sqe| {
        r.io_put(tail, &s);
        tail = (tail + 1) % 16;
        r.regs.store32(regs::sq_tail_doorbell(1), tail);
        r.pass();
        let c = r.io_cqe(head);
        head = (head + 1) % 16;
        r.regs.store32(regs::cq_head_doorbell(1), head);
        c.status
    };
    // 6 KiB starting mid-page: PRP1 at +0x400 (3 KiB), PRP2 a page.
    let data: Vec<u8> = (0..6144u32).map(|i| (i * 31 % 253) as u8).collect();
    r.mem.put(DATA + 0x400, &data[..3072]);
    r.mem.put(DATA + 0x3000, &data[3072..]);
    assert_eq!(
        io(
            &mut r,
            rw(IoOp::Write, 2, 5, 12, DATA + 0x400, DATA + 0x3000)
        ),
        Status::SUCCESS
    );
    let mut back = vec![0u8; 6144];
    store.read_exact_at(&mut back, MIB + 5 * 512).unwrap();
    assert!(back == data, "the store holds the data at 1 MiB + 5 blocks");
    // Its neighbours in the store are untouched: namespace 1 entirely and
    // the blocks of namespace 2 around the write.
    let mut ns1 = vec![0u8; MIB as usize];
    store.read_exact_at(&mut ns1, 0).unwrap();
    assert!(ns1.iter().all(|&b| b == 0x11));
    let mut around = vec![0u8; 512];
    store.read_exact_at(&mut around, MIB + 4 * 512).unwrap();
    assert!(around.iter().all(|&b| b == 0));
    store.read_exact_at(&mut around, MIB + 17 * 512).unwrap();
    assert!(around.iter().all(|&b| b == 0));
    // Read back elsewhere (a page-aligned PRP1 and PRP2), and compared.
    r.mem.put(DATA + 0x8000, &[0; 0x2000]);
    assert_eq!(
        io(
            &mut r,
            rw(IoOp::Read, 2, 5, 12, DATA + 0x8000, DATA + 0x9000)
        ),
        Status::SUCCESS
    );
    assert!(r.mem.get(DATA + 0x8000, 6144) == data);
    assert!(r
        .mem
        .get(DATA + 0x8000 + 6144, 0x800)
        .iter()
        .all(|&b| b == 0));
    // The last block of namespace 2 is the store's 2 MiB - 512, and one
    // past it is out of range, not namespace 3's (or the file's) bytes.
    store.write_all_at(&[0x77; 512], 2 * MIB - 512).unwrap();
    assert_eq!(
        io(&mut r, rw(IoOp::Read, 2, 2047, 1, DATA, 0)),
        Status::SUCCESS
    );
    assert!(r.mem.get(DATA, 512).iter().all(|&b| b == 0x77));
    assert_eq!(
        io(&mut r, rw(IoOp::Read, 2, 2047, 2, DATA, 0)),
        Status::LBA_OUT_OF_RANGE
    );
}

/// A full completion queue whose head doorbell holds a value beyond the
/// queue: commands wait, nothing can be done until a valid head comes, so
/// the engine must be allowed to sleep.
#[test]
fn an_invalid_head_doorbell_on_a_full_queue_lets_the_engine_sleep() {
    let mut r = Rig::new(&["0:4M"]);
    r.io_queues(8, 4);
    for i in 0..4u32 {
        r.io_put(i, &flush(i as u16));
    }
    r.regs.store32(regs::sq_tail_doorbell(1), 4);
    r.pass();
    r.pass();
    assert!(
        !r.ctl.prepare_sleep(),
        "a full queue is waiting for the driver, not work"
    );
    r.regs.store32(regs::cq_head_doorbell(1), 4);
    for _ in 0..3 {
        r.pass();
    }
    assert!(
        !r.ctl.prepare_sleep(),
        "an invalid head doorbell is no work: the engine must be allowed to sleep"
    );
}

/// NVMe Base 5.2.2: "subsequent events of that event type are
/// automatically masked by the controller until the host clears that
/// event ... an event is cleared by reading the log page associated with
/// that event". Two submission queues with invalid tails: one error
/// event, the second only after the Error Information log is read.
#[test]
fn error_events_stay_masked_until_the_error_log_is_read() {
    let mut r = Rig::new(&["0:4M"]);
    r.io_queues(8, 8);
    assert_eq!(
        r.create(AdminOp::CreateSq, 2, 8, 1, BASE + 0x6000),
        Status::SUCCESS
    );
    for _ in 0..4 {
        r.aer();
    }
    r.regs.store32(regs::sq_tail_doorbell(1), 100);
    r.pass();
    let ev = r.admin_cqe().expect("the first error event");
    assert_eq!(ev.result >> 16 & 0xff, 1, "error information log");
    // Another invalid doorbell, the log not read: masked.
    r.regs.store32(regs::sq_tail_doorbell(2), 100);
    for _ in 0..3 {
        r.pass();
    }
    assert!(
        r.admin_cqe().is_none(),
        "an error event was reported while that type was masked (log not read)"
    );
    // Read with Retain Asynchronous Event: still masked. Then without:
    // the event waiting comes.
    let read_log = |r: &mut Rig, retain: bool| {
        let mut s = sqe(AdminOp::GetLogPage as u8);
        s.prp1 = DATA;
        GetLogPage {
            lid: GetLogPage::ERROR,
            len: 64,
            offset: 0,
        }
        .encode(&mut s);
        s.cdw[0] |= u32::from(retain) << 15;
        assert!(r.admin(s).status.is_success());
    };
    read_log(&mut r, true);
    assert!(r.admin_cqe().is_none(), "RAE set: the event stays");
    read_log(&mut r, false);
    let ev = r
        .admin_cqe()
        .expect("the second error event, once the log was read");
    assert_eq!(ev.result >> 16 & 0xff, 1, "error information log");
}

/// NVMe Base 8.1.16: a controller that supports Namespace Attachment
/// without the Namespace Management command "shall not set the Namespace
/// Management Supported (NMS) bit to '1' in the OACS field".
#[test]
fn oacs_claims_namespace_management_only_with_the_command() {
    let mut r = Rig::new(&["0:4M"]);
    let info = ControllerInfo::from_bytes(&r.identify(cns::CONTROLLER, 0).unwrap());
    let nms = info.oacs & identify::OACS_NS_MANAGEMENT != 0;
    // Namespace Management (opcode 0Dh), SEL 0 (create) with no data.
    let c = r.admin(sqe(0x0d));
    assert!(
        !(nms && c.status == Status::INVALID_OPCODE),
        "OACS.NMS set but Namespace Management is an invalid opcode"
    );
}

/// ONCS bit 4, Save and Select Feature Support (SSFS).
const ONCS_SSFS: u16 = 1 << 4;

/// NVMe Base 4.4: "If the Save and Select Feature Support (SSFS) bit is
/// set to '1' in the Optional NVM Command Support (ONCS) field ... then
/// for each Feature, there are three settings: default, saved, and
/// current", and the supported capabilities are discovered with SEL 011b.
/// The controller answers every SEL value and refuses SV with Feature
/// Identifier Not Saveable, yet left SSFS clear, so a driver that checks
/// it never asked.
#[test]
fn oncs_claims_save_and_select_which_features_honour() {
    let mut r = Rig::new(&["0:4M"]);
    let info = ControllerInfo::from_bytes(&r.identify(cns::CONTROLLER, 0).unwrap());
    assert_ne!(info.oncs & ONCS_SSFS, 0, "ONCS.SSFS clear");
    let sel = |r: &mut Rig, sel: u32| {
        let mut s = get_features(feature::ARBITRATION, 0);
        s.cdw[0] |= sel << 8;
        r.admin(s)
    };
    assert!(r
        .admin(set_features(feature::ARBITRATION, 3))
        .status
        .is_success());
    assert_eq!(sel(&mut r, 0).result, 3, "current");
    assert_eq!(sel(&mut r, 1).result, 0, "default");
    assert_eq!(sel(&mut r, 2).result, 0, "saved: none, so the default");
    let caps = sel(&mut r, 3);
    assert!(caps.status.is_success());
    assert_eq!(caps.result & 1, 0, "not saveable");
    let mut save = set_features(feature::ARBITRATION, 3);
    save.cdw[0] |= 1 << 31;
    assert_eq!(r.admin(save).status, Status::FEATURE_NOT_SAVEABLE);
}

/// NVMe Base 3.2.1.2/3.2.1.5: an NSID from 1 to NN is valid; one whose
/// namespace does not exist (unallocated) is inactive. Identify Namespace
/// (CNS 00h) of an inactive NSID and Identify Namespace for an Allocated
/// NSID (CNS 11h, 5.2.13.2.10: "If the value in the NSID field specifies
/// an unallocated NSID, then the controller returns a zero filled data
/// structure") return zeroes, not Invalid Namespace or Format.
#[test]
fn identify_of_an_unallocated_valid_nsid_is_zero_filled() {
    let (mut r, sub) = rig_with_subsystem(&["0:4M", "4M:4M", "8M:4M"]);
    sub.remove(2).unwrap();
    let info = ControllerInfo::from_bytes(&r.identify(cns::CONTROLLER, 0).unwrap());
    assert_eq!(info.nn, 3, "NSID 2 is valid (<= NN)");
    let ns = r.identify(cns::NAMESPACE, 2);
    assert!(
        ns.as_ref().is_ok_and(|b| b.iter().all(|&x| x == 0)),
        "CNS 00h of unallocated NSID 2: {:?}",
        ns.err()
    );
    let ns = r.identify(cns::ALLOCATED_NAMESPACE, 2);
    assert!(
        ns.as_ref().is_ok_and(|b| b.iter().all(|&x| x == 0)),
        "CNS 11h of unallocated NSID 2: {:?}",
        ns.err()
    );
}

/// NVMe Base 1.4, Identify Controller byte 111 (CNTRLTYPE):
/// "Implementations compliant with NVM Express Base Specification,
/// Revision 1.4 or later shall report a controller type (i.e., the value
/// 0h is reserved and shall not be used)." VS says 1.4.0.
#[test]
fn a_version_1_4_controller_reports_its_controller_type() {
    let mut r = Rig::new(&["0:4M"]);
    assert_eq!(r.regs.load32(regs::VS), regs::VERSION_1_4);
    let id = r.identify(cns::CONTROLLER, 0).unwrap();
    assert_eq!(id[111], 1, "CNTRLTYPE: 1h (I/O controller)");
}

/// NVMe Base, Namespace Attachment status codes: 18h Namespace Already
/// Attached is "The specified namespace is already attached to the
/// controller"; 19h Namespace Is Private is "...could not be completed
/// because the namespace is private and is already attached to one
/// controller". Attaching a namespace another controller holds is the
/// latter.
#[test]
fn attaching_a_namespace_another_controller_holds_is_namespace_is_private() {
    let (driver, dir, store) = device_on(&std::env::temp_dir(), &["0:4M"]);
    let mut a = Rig::ready(Rig::of(&driver, dir, store.clone()));
    let dir_b = wd_testutil::tempdir_in(&std::env::temp_dir(), "wd-nvme-spec-b", 0o755);
    let mut b = Rig::of(&driver, dir_b, store);
    b.enable();
    b.cntlid = ControllerInfo::from_bytes(&b.identify(cns::CONTROLLER, 0).unwrap()).cntlid;
    assert_ne!(a.cntlid, b.cntlid);
    assert_eq!(
        a.attach(1),
        Status::NS_ALREADY_ATTACHED,
        "attached here already"
    );
    let st = b.attach(1);
    assert_eq!(
        (st.sct, st.sc),
        (1, 0x19),
        "another controller's private namespace: Namespace Is Private, got {st:?}"
    );
    assert_eq!(st, Status::NS_IS_PRIVATE);
}

/// A rig whose controller has a write of 0x5a bytes to block 3 of
/// namespace 1 in flight on its I/O ring (command 0 of queue 1); `None`
/// (the test skipped, and counted) where the write does not go to a ring.
/// A write the kernel finished within the pass (seen in one run of many)
/// is tried again on a fresh rig.
fn a_write_on_the_ring(test: &str) -> Option<Rig> {
    const TRIES: usize = 20;
    for _ in 0..TRIES {
        let (mut r, at) = ring_rig(&["0:4M:512"]);
        r.io_queues(8, 8);
        r.mem.put(at, &[0x5a; 512]);
        r.io_put(0, &rw(IoOp::Write, 1, 3, 1, at, 0));
        r.regs.store32(regs::sq_tail_doorbell(1), 1);
        if r.pass().holds_from.is_some() {
            return Some(r);
        }
    }
    wd_testutil::skip(
        test,
        &format!(
            "the write was not in flight on an I/O ring after the pass in {TRIES} tries \
             (no io_uring or O_DIRECT here, or the kernel finished it each time)"
        ),
    );
    None
}

/// A detach completes after the controller's writes of that namespace on
/// its I/O ring: one landing later could reach the data of the next
/// controller to attach the namespace. Whether the write is still in
/// flight when the detach runs is up to the kernel (it was in most runs
/// before the detach waited); after, the test holds in every run.
#[test]
fn a_detach_waits_for_the_namespaces_writes_on_the_ring() {
    let Some(mut r) = a_write_on_the_ring("a_detach_waits_for_the_namespaces_writes_on_the_ring")
    else {
        return;
    };
    assert_eq!(r.attachment(1, true), Status::SUCCESS);
    let c = r.io_cqe(0);
    assert!(c.phase, "the detach completed before the write");
    assert_eq!((c.cid, c.status), (0, Status::SUCCESS));
    let mut back = [0u8; 512];
    std::fs::File::open(&r.store)
        .unwrap()
        .read_exact_at(&mut back, 3 * 512)
        .unwrap();
    assert_eq!(back, [0x5a; 512]);
}

/// NVMe Base 3.6.1: the controller reports shutdown processing complete
/// (CSTS.SHST 10b), and while it is in progress "may abort any command
/// with a status code of Commands Aborted due to Power Loss
/// Notification"; a command is completed either way. A shutdown waited
/// for the writes on the I/O ring and dropped their completions: the
/// driver, told the shutdown was complete, never heard of them.
#[test]
fn a_shutdown_completes_the_commands_on_the_ring_first() {
    let Some(mut r) = a_write_on_the_ring("a_shutdown_completes_the_commands_on_the_ring_first")
    else {
        return;
    };
    let mut cc = Cc::from_u32(cc_enabled());
    cc.shn = 1;
    r.regs.store32(regs::CC, cc.to_u32());
    let s = r.pass();
    assert_eq!(r.csts() & regs::CSTS_SHST_MASK, regs::CSTS_SHST_COMPLETE);
    let c = r.io_cqe(0);
    assert!(
        c.phase,
        "shutdown complete, the write on the ring never posted"
    );
    assert_eq!((c.cid, c.sq_id, c.status), (0, 1, Status::SUCCESS));
    assert_eq!(s.holds_from, None, "nothing held past the shutdown");
    let mut back = [0u8; 512];
    std::fs::File::open(&r.store)
        .unwrap()
        .read_exact_at(&mut back, 3 * 512)
        .unwrap();
    assert_eq!(back, [0x5a; 512]);
}

/// Log page `lid`, `len` bytes of it, read into DATA.
fn get_log(r: &mut Rig, lid: u8, len: u64) -> (Status, Vec<u8>) {
    r.mem.put(DATA, &vec![0xee; len as usize]);
    let mut s = sqe(AdminOp::GetLogPage as u8);
    s.prp1 = DATA;
    s.nsid = 0xffff_ffff;
    GetLogPage {
        lid,
        len,
        offset: 0,
    }
    .encode(&mut s);
    let c = r.admin(s);
    (c.status, r.mem.get(DATA, len as usize).to_vec())
}

/// Identify Controller OAES bit 8 claims Namespace Attribute Notices, with
/// the Changed Namespace List log page (04h): the bit was set, the log
/// page Invalid Log Page, and the event never sent. No notices claimed.
#[test]
fn no_namespace_notices_are_claimed_without_their_log_page() {
    let mut r = Rig::new(&["0:4M"]);
    let id = r.identify(cns::CONTROLLER, 0).unwrap();
    let oaes = u32::from_le_bytes(id[92..96].try_into().unwrap());
    let (st, _) = get_log(&mut r, 0x04, 4096);
    assert!(
        oaes & 1 << 8 == 0 || st.is_success(),
        "OAES {oaes:#x}, log 04h {st:?}"
    );
}

/// Number of Queues is a Command Sequence Error after an I/O queue was
/// created (NVMe Base, Number of Queues); set again before, it is the same
/// allocation (it was a Sequence Error, and a driver that retries reads
/// its queue count as 0).
#[test]
fn number_of_queues_set_again_before_any_queue_is_the_same_allocation() {
    let mut r = Rig::new(&["0:4M"]);
    let a = r.admin(set_features(feature::NUMBER_OF_QUEUES, 3 | 3 << 16));
    let b = r.admin(set_features(feature::NUMBER_OF_QUEUES, 3 | 3 << 16));
    assert_eq!((a.status, b.status), (Status::SUCCESS, Status::SUCCESS));
    assert_eq!(b.result, a.result);
    r.io_queues(16, 16);
    let c = r.admin(set_features(feature::NUMBER_OF_QUEUES, 3 | 3 << 16));
    assert_eq!(c.status, Status::SEQUENCE_ERROR);
}

/// The composite temperature at or past a threshold the driver set sets
/// the SMART log's Critical Warning bit 1 (the thresholds were kept and
/// never compared).
#[test]
fn a_temperature_past_its_threshold_sets_the_critical_warning() {
    let mut r = Rig::new(&["0:4M"]);
    let warning = |r: &mut Rig| {
        let (st, log) = get_log(r, GetLogPage::SMART, 512);
        assert!(st.is_success());
        (log[0] & 2 != 0, u16::from_le_bytes([log[1], log[2]]))
    };
    let (warned, temp) = warning(&mut r);
    assert!(!warned, "no warning at the default thresholds");
    let over = |k: u16| set_features(feature::TEMPERATURE_THRESHOLD, k as u32);
    let under = |k: u16| set_features(feature::TEMPERATURE_THRESHOLD, k as u32 | 1 << 20);
    for (s, warn) in [
        (over(temp - 10), true),
        (over(temp + 10), false),
        (under(temp), true),
    ] {
        assert!(r.admin(s).status.is_success());
        assert_eq!(warning(&mut r).0, warn, "{s:?}");
    }
}

/// The system calls the controller makes for one I/O command.
fn calls_for(r: &mut Rig, tail: &mut u32, s: Sqe) -> u64 {
    let mut s = s;
    s.cid = *tail as u16 + 1;
    r.io_put(*tail, &s);
    *tail += 1;
    r.regs.store32(regs::sq_tail_doorbell(1), *tail);
    let before = wd_sys::syscalls_on_this_thread();
    r.pass();
    let calls = wd_sys::syscalls_on_this_thread() - before;
    let c = r.io_cqe(*tail - 1);
    assert!(c.status.is_success(), "{:?}", c.status);
    r.regs.store32(regs::cq_head_doorbell(1), *tail);
    calls
}

/// A Write or Write Zeroes with Force Unit Access (CDW12 bit 30), and with
/// the volatile write cache off any command that writes (Write Zeroes and
/// a deallocating Dataset Management too), is on stable media when it
/// completes: one more system call, the sync. FUA was ignored, and Write
/// Zeroes and Dataset Management completed unsynced with the cache off.
/// Turning the cache off left what completed before it unsynced.
#[test]
fn writes_with_force_unit_access_or_without_the_cache_are_synced() {
    let mut r = Rig::new(&["0:1M"]);
    r.io_queues(16, 16);
    r.mem.put(DATA, &[0x5a; 4096]);
    r.mem.put(DATA + 4096, &[0; 16]);
    let tail = &mut 0u32;
    let fua = |mut s: Sqe| {
        s.cdw[2] |= 1 << 30;
        s
    };
    let write = || rw(IoOp::Write, 1, 3, 1, DATA, 0);
    let zeroes = || rw(IoOp::WriteZeroes, 1, 8, 16, 0, 0);
    let dsm = || {
        // One range (context 0, 16 blocks at block 32), deallocate.
        let mut s = rw(IoOp::Dsm, 1, 0, 1, DATA + 4096, 0);
        s.cdw = [0, 4, 0, 0, 0, 0];
        s
    };
    r.mem.put(DATA + 4096 + 4, &16u32.to_le_bytes());
    r.mem.put(DATA + 4096 + 8, &32u64.to_le_bytes());
    let plain = [write(), zeroes(), dsm()].map(|s| calls_for(&mut r, tail, s));
    let forced = [fua(write()), fua(zeroes())].map(|s| calls_for(&mut r, tail, s));
    assert_eq!(
        (forced[0], forced[1]),
        (plain[0] + 1, plain[1] + 1),
        "FUA: {forced:?} against {plain:?}"
    );
    // Turning the cache off syncs what completed while it was on (each
    // namespace attached: one more system call); off again, nothing.
    let mut cache_off = || {
        let before = wd_sys::syscalls_on_this_thread();
        let st = r
            .admin(set_features(feature::VOLATILE_WRITE_CACHE, 0))
            .status;
        assert!(st.is_success(), "{st:?}");
        wd_sys::syscalls_on_this_thread() - before
    };
    let (first, again) = (cache_off(), cache_off());
    assert_eq!(
        first,
        again + 1,
        "turning the cache off syncs the namespace once"
    );
    let through = [write(), zeroes(), dsm()].map(|s| calls_for(&mut r, tail, s));
    assert_eq!(through, plain.map(|n| n + 1), "write cache off");
}

/// NVMe Base 5.16.1.2: an Error Information log entry names the command's
/// namespace and its first LBA. A read that failed on the I/O ring was
/// logged with NSID 0 and LBA 0 (only the synchronous path kept them).
#[test]
fn a_command_failed_on_the_ring_is_logged_with_its_namespace_and_lba() {
    let (mut r, at) = ring_rig(&["0:4M:512"]);
    r.io_queues(8, 8);
    // The store shrinks under the namespace: reading it transfers short.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&r.store)
        .unwrap()
        .set_len(0)
        .unwrap();
    r.io_put(0, &rw(IoOp::Read, 1, 7, 1, at, 0));
    r.regs.store32(regs::sq_tail_doorbell(1), 1);
    r.pass();
    let mut c = r.io_cqe(0);
    for _ in 0..1000 {
        if c.phase {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
        r.pass();
        c = r.io_cqe(0);
    }
    assert!(c.phase, "the read completed");
    assert_eq!(c.status, Status::UNRECOVERED_READ_ERROR);
    let (st, log) = get_log(&mut r, GetLogPage::ERROR, 64);
    assert!(st.is_success());
    let u16_at = |o: usize| u16::from_le_bytes(log[o..o + 2].try_into().unwrap());
    assert_eq!((u16_at(8), u16_at(10)), (1, 0), "SQID, CID");
    assert_eq!(
        u64::from_le_bytes(log[16..24].try_into().unwrap()),
        7,
        "the command's first LBA"
    );
    assert_eq!(
        u32::from_le_bytes(log[24..28].try_into().unwrap()),
        1,
        "the command's namespace"
    );
}

/// A detach makes the namespace's completed writes durable with the
/// write cache on (one more system call than with it off, when every
/// write already was): after it, neither a Flush nor this controller's
/// shutdown reaches the namespace, and its writes stayed unsynced.
#[test]
fn a_detach_syncs_the_namespaces_completed_writes() {
    let mut r = Rig::new(&["0:1M"]);
    r.io_queues(8, 8);
    let tail = &mut 0u32;
    r.mem.put(DATA, &[0x5a; 512]);
    let detach = |r: &mut Rig, tail: &mut u32| {
        calls_for(r, tail, rw(IoOp::Write, 1, 3, 1, DATA, 0));
        let before = wd_sys::syscalls_on_this_thread();
        assert_eq!(r.attachment(1, true), Status::SUCCESS);
        let calls = wd_sys::syscalls_on_this_thread() - before;
        assert_eq!(r.attachment(1, false), Status::SUCCESS);
        calls
    };
    let cached = detach(&mut r, tail);
    assert!(r
        .admin(set_features(feature::VOLATILE_WRITE_CACHE, 0))
        .status
        .is_success());
    let through = detach(&mut r, tail);
    assert_eq!(cached, through + 1, "the detach synced the namespace");
}
