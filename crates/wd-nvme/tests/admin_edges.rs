//! Admin commands at the edges of the specification (NVMe Base 1.4):
//! Doorbell Buffer Config with I/O queues live, SMART / Health events,
//! Interrupt Vector Configuration, the subsystem's identity across its
//! controllers, and a controller that goes fatal with transfers on its
//! ring.

use wd_nvme::msg::cmd::feature;
use wd_nvme::msg::identify::{cns, ControllerInfo};
use wd_nvme::msg::regs;
use wd_nvme::msg::{AdminOp, IoOp, Sqe, Status};

mod common;
use common::*;

fn dbbuf() -> Sqe {
    Sqe {
        opcode: AdminOp::DoorbellBuffer as u8,
        prp1: SHADOW,
        prp2: EVENTS,
        ..Sqe::default()
    }
}

/// Two flushes are submitted (tail register 2) and, before the engine's
/// next pass, the driver turns shadow doorbells on. The controller writes
/// the shadow tail as its own head (0), so the two commands are never run.
#[test]
fn dbbuf_config_keeps_submissions_already_rung() {
    let mut r = Rig::new(&["0:4M"]);
    r.io_queues(8, 8);
    r.io_put(0, &flush(11));
    r.io_put(1, &flush(12));
    r.regs.store32(regs::sq_tail_doorbell(1), 2);
    let cid = r.admin_submit(dbbuf());
    for _ in 0..4 {
        r.pass();
    }
    let c = r.admin_cqe().expect("doorbell buffer config completes");
    assert_eq!((c.cid, c.status.is_success()), (cid, true));
    // The shadow tail the controller initialised is what the host rang.
    let shadow_tail = u32::from_le_bytes(r.mem.get(SHADOW + 8, 4).try_into().unwrap());
    let done: Vec<_> = (0..2).map(|i| r.io_cqe(i)).collect();
    assert!(
        done.iter().all(|c| c.phase),
        "the two flushes rung before Doorbell Buffer Config never complete \
         (shadow tail initialised to {shadow_tail}, host rang 2): {done:?}"
    );
}

/// The driver consumed three completions (head register 3) of a 4-entry
/// completion queue, then turns shadow doorbells on and submits three
/// more commands. The shadow completion head was never initialised (0),
/// the controller reads it when the queue looks full, and the queue stays
/// "full": the commands never complete although the host consumed all.
#[test]
fn dbbuf_config_keeps_the_completion_head_already_rung() {
    let mut r = Rig::new(&["0:4M"]);
    r.io_queues(8, 4);
    for i in 0..3u32 {
        r.io_put(i, &flush(20 + i as u16));
    }
    r.regs.store32(regs::sq_tail_doorbell(1), 3);
    r.pass();
    assert!((0..3).all(|i| r.io_cqe(i).phase), "three completions");
    // Consumed: head 3, by the register (no shadow doorbells yet).
    r.regs.store32(regs::cq_head_doorbell(1), 3);
    r.pass();
    r.shadow_doorbells();
    // Three more, through the shadow tail (and the register, to be sure
    // the controller looks).
    for i in 3..6u32 {
        r.io_put(i, &flush(20 + i as u16));
    }
    r.mem.put(SHADOW + 8, &6u32.to_le_bytes());
    r.regs.store32(regs::sq_tail_doorbell(1), 6);
    for _ in 0..4 {
        r.pass();
    }
    // Slot 3, then slots 0 and 1 with the phase inverted.
    let c3 = r.io_cqe(3);
    assert!(
        c3.phase && c3.cid == 23,
        "the fourth command never completes: the controller took the \
         uninitialised shadow head (0) for the driver's head (3): {c3:?}"
    );
}

/// Guard for the fix (passes before and after it): Doorbell Buffer
/// Config given again while shadow doorbells are in use must not take
/// the stale tail register for the tail (the driver rang the shadow only):
/// nothing already run runs again.
#[test]
fn dbbuf_config_again_replays_nothing() {
    let mut r = Rig::new(&["0:4M"]);
    r.io_queues(8, 8);
    r.shadow_doorbells();
    // Register tail 1, then the shadow alone moves on to 3.
    r.io_put(0, &flush(30));
    r.mem.put(SHADOW + 8, &1u32.to_le_bytes());
    r.regs.store32(regs::sq_tail_doorbell(1), 1);
    r.pass();
    r.io_put(1, &flush(31));
    r.io_put(2, &flush(32));
    r.mem.put(SHADOW + 8, &3u32.to_le_bytes());
    r.pass();
    assert!((0..3).all(|i| r.io_cqe(i).phase), "three completions");
    r.mem.put(SHADOW + 12, &3u32.to_le_bytes());
    r.shadow_doorbells();
    for _ in 0..3 {
        r.pass();
    }
    let c = r.io_cqe(3);
    assert!(!c.phase, "a command already run ran again: {c:?}");
}

#[test]
fn a_temperature_past_its_threshold_sends_the_enabled_smart_event() {
    let mut r = Rig::new(&["0:4M"]);
    let aer = r.aer();
    // Critical warning bit 1 (temperature) enabled for events.
    let c = r.admin(set_features(feature::ASYNC_EVENT_CONFIG, 1 << 1));
    assert_eq!(c.status, Status::SUCCESS);
    // Over-temperature threshold 300 K: the composite temperature (308 K)
    // is past it.
    let c = r.admin(set_features(feature::TEMPERATURE_THRESHOLD, 300));
    assert_eq!(c.status, Status::SUCCESS);
    // The SMART log's Critical Warning bit 1 is set now (see
    // `a_temperature_past_its_threshold_sets_the_critical_warning`): the
    // event enabled for it is sent.
    for _ in 0..3 {
        r.pass();
    }
    let ev = r.admin_cqe();
    assert!(
        ev.is_some_and(|c| c.cid == aer && c.result == (0x02 << 16 | 0x01 << 8 | 0x1)),
        "expected the Asynchronous Event Request {aer} to complete with a SMART / \
         Health event (type 1, Temperature Threshold 01h, log page 02h); got {ev:?}"
    );
}

#[test]
fn a_fatal_controller_keeps_reporting_the_memory_its_ring_holds() {
    // A write the kernel finished within the pass is tried again.
    const TRIES: usize = 20;
    let Some(mut r) = (0..TRIES).find_map(|_| {
        let (mut r, at) = ring_rig(&["0:4M:512"]);
        // A completion queue of 512 entries (8 KiB) whose first and last
        // bytes are reachable but not slot 1 onwards in its first page (two
        // shares around memory the client never shared, or unshared): the
        // controller's creation check probes the two ends only.
        r.mem.put(IOCQ, &[0; 0x2000]);
        r.mem.set_hole(Some((IOCQ + 0x10, IOCQ + 0x1000)));
        assert_eq!(
            r.create(AdminOp::CreateCq, 1, 512, 0, IOCQ),
            Status::SUCCESS
        );
        assert_eq!(r.create(AdminOp::CreateSq, 1, 8, 1, IOSQ), Status::SUCCESS);
        // A flush (completion in slot 0) and a write that goes to the ring.
        r.io_put(0, &flush(1));
        r.mem.put(at, &[0x5a; 512]);
        let mut write = rw(IoOp::Write, 1, 3, 1, at, 0);
        write.cid = 2;
        r.io_put(1, &write);
        r.regs.store32(regs::sq_tail_doorbell(1), 2);
        r.pass().holds_from.is_some().then_some(r)
    }) else {
        wd_testutil::skip(
            "a_fatal_controller_keeps_reporting_the_memory_its_ring_holds",
            &format!("the write was not in flight on an I/O ring after the pass in {TRIES} tries"),
        );
        return;
    };
    // A flush whose completion (slot 1) cannot be written: fatal.
    r.io_put(2, &flush(3));
    r.regs.store32(regs::sq_tail_doorbell(1), 3);
    let fatal = r.pass();
    assert_ne!(
        r.csts() & regs::CSTS_CFS,
        0,
        "fatal: a completion could not be posted"
    );
    if fatal.holds_from.is_some() {
        // The controller still holds the write's memory (not reaped, not
        // waited for). Its next pass must say so, or the engine unpins
        // memory the kernel may still be writing from.
        let next = r.pass();
        assert!(
            next.holds_from.is_some(),
            "the pass after the controller went fatal reports no held memory \
             while the write it put on its ring is neither reaped nor drained"
        );
    }
}

const INTERRUPT_VECTOR_CONFIG: u8 = 0x09;

#[test]
fn get_features_interrupt_vector_configuration() {
    let mut r = Rig::new(&["0:4M"]);
    // Vector 0 (the one an admin queue uses).
    let c = r.admin(get_features(INTERRUPT_VECTOR_CONFIG, 0));
    assert_eq!(
        c.status,
        Status::SUCCESS,
        "Get Features Interrupt Vector Configuration (mandatory) refused"
    );
    assert_eq!(
        c.result & 0xffff,
        0,
        "DW0 bits 15:0 name the vector asked for"
    );
}

fn two_controllers() -> (Rig, Rig) {
    let (driver, dir, store) = device_on(&std::env::temp_dir(), &["0:4M"]);
    let mut a = Rig::of(&driver, dir, store.clone());
    a.enable();
    let dir_b = wd_testutil::tempdir_in(&std::env::temp_dir(), "wd-nvme-subsystem-b", 0o755);
    let mut b = Rig::of(&driver, dir_b, store);
    b.enable();
    (a, b)
}

#[test]
fn controllers_of_one_subsystem_report_cmic_multi_controller() {
    let (mut a, mut b) = two_controllers();
    let ra = a.identify(cns::CONTROLLER, 0).unwrap();
    let rb = b.identify(cns::CONTROLLER, 0).unwrap();
    let (ia, ib) = (
        ControllerInfo::from_bytes(&ra),
        ControllerInfo::from_bytes(&rb),
    );
    assert_eq!(ia.subnqn, ib.subnqn, "one NVM subsystem");
    assert_ne!(ia.cntlid, ib.cntlid, "two controllers");
    // CMIC is byte 76; bit 1: the NVM subsystem may contain two or more
    // controllers.
    assert_eq!(
        (ra[76] & 2, rb[76] & 2),
        (2, 2),
        "CMIC bit 1 clear on controllers {} and {} of the same subsystem {}",
        ia.cntlid,
        ib.cntlid,
        ia.subnqn
    );
}

#[test]
fn controllers_of_one_subsystem_report_its_serial_number() {
    let (mut a, mut b) = two_controllers();
    let ia = ControllerInfo::from_bytes(&a.identify(cns::CONTROLLER, 0).unwrap());
    let ib = ControllerInfo::from_bytes(&b.identify(cns::CONTROLLER, 0).unwrap());
    assert_eq!(ia.subnqn, ib.subnqn, "one NVM subsystem");
    assert_eq!(
        ia.serial, ib.serial,
        "SN is the NVM subsystem's serial number, not the controller's"
    );
}

/// The serial number (SN) is the NVM subsystem's too, and two devices of
/// one host are two subsystems: it was made from the host's process id,
/// so every device of a host reported the same one (udev names disks by
/// model and serial). At most 20 ASCII characters, padded with spaces.
#[test]
fn each_device_has_its_own_serial_number() {
    let serial =
        |r: &mut Rig| ControllerInfo::from_bytes(&r.identify(cns::CONTROLLER, 0).unwrap()).serial;
    let mut a = Rig::new(&["0:4M"]);
    let mut b = Rig::new(&["0:4M"]);
    let (sa, sb) = (serial(&mut a), serial(&mut b));
    assert_ne!(sa, sb, "two devices of one host, two serial numbers");
    for s in [&sa, &sb] {
        let s = s.trim_end();
        assert!(
            !s.is_empty() && s.len() <= 20 && s.chars().all(|c| c.is_ascii_graphic()),
            "'{s}'"
        );
    }
}

/// A queue created before the driver set CC's I/O entry sizes is Invalid
/// Queue Size (NVMe Base, Create I/O Completion and Submission Queue:
/// "before initializing the CC.IOCQES/IOSQES field"); an entry size this
/// controller does not offer stays Invalid Field.
#[test]
fn queues_created_before_the_entry_sizes_are_set_are_refused() {
    let mut r = Rig::new(&["0:4M"]);
    r.enable();
    let cc = |iosqes, iocqes| {
        regs::Cc {
            en: true,
            iosqes,
            iocqes,
            ..regs::Cc::default()
        }
        .to_u32()
    };
    r.regs.store32(regs::CC, cc(0, 0));
    r.pass();
    assert_eq!(
        r.create(AdminOp::CreateCq, 1, 8, 0, IOCQ),
        Status::INVALID_QUEUE_SIZE
    );
    r.regs.store32(regs::CC, cc(0, 4));
    r.pass();
    assert_eq!(r.create(AdminOp::CreateCq, 1, 8, 0, IOCQ), Status::SUCCESS);
    assert_eq!(
        r.create(AdminOp::CreateSq, 1, 8, 1, IOSQ),
        Status::INVALID_QUEUE_SIZE
    );
    r.regs.store32(regs::CC, cc(7, 4));
    r.pass();
    assert_eq!(
        r.create(AdminOp::CreateSq, 1, 8, 1, IOSQ),
        Status::INVALID_FIELD
    );
    r.regs.store32(regs::CC, cc(6, 4));
    r.pass();
    assert_eq!(r.create(AdminOp::CreateSq, 1, 8, 1, IOSQ), Status::SUCCESS);
}

/// NVMe Base 4.7: NQNs "uniquely describe a host or NVM subsystem", and
/// 4.7.1.2: the SUBNQN "should be used (e.g., by a host) as the unique
/// identifier for the NVM subsystem". Every device of every host reported
/// one fixed name, so a host saw all of them as one subsystem. Each device
/// (an NVM subsystem: its controllers share it) now has its own, in the
/// UUID-based format: "nqn.2014-08.org.nvmexpress:uuid:" and a UUID
/// written "11111111-2222-3333-4444-555555555555".
#[test]
fn each_device_is_an_nvm_subsystem_with_its_own_nqn() {
    let subnqn =
        |r: &mut Rig| ControllerInfo::from_bytes(&r.identify(cns::CONTROLLER, 0).unwrap()).subnqn;
    let mut a = Rig::new(&["0:4M"]);
    let mut b = Rig::new(&["0:4M"]);
    let (na, nb) = (subnqn(&mut a), subnqn(&mut b));
    assert_ne!(na, nb, "two devices, two NVM subsystems");
    for n in [&na, &nb] {
        let uuid = n
            .strip_prefix("nqn.2014-08.org.nvmexpress:uuid:")
            .unwrap_or_else(|| panic!("'{n}' is not a UUID-based NQN"));
        let groups: Vec<&str> = uuid.split('-').collect();
        assert_eq!(
            groups.iter().map(|g| g.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12],
            "'{uuid}'"
        );
        assert!(uuid
            .chars()
            .all(|c| c == '-' || c.is_ascii_digit() || ('a'..='f').contains(&c)));
        assert!(n.len() <= 223, "NQNs are at most 223 bytes");
    }
    // The same name on every controller of one subsystem.
    let (mut c, mut d) = two_controllers();
    assert_eq!(subnqn(&mut c), subnqn(&mut d));
}
