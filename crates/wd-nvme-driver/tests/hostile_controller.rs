//! Completions the driver sets aside, completions a controller gets
//! wrong, and commands left behind by a host restart.
//!
//! A hostile or buggy controller is played by writing completion entries
//! straight into the driver's completion queue (through /proc/self/mem:
//! the controller and the driver share that memory; the queue's address
//! is read from the Create I/O Completion Queue command in the admin
//! submission queue, whose address is register ASQ).

use std::time::{Duration, Instant};

use wd_nvme_driver::msg::identify::{NamespaceInfo, IDENTIFY_BYTES};
use wd_nvme_driver::msg::{Cqe, IoOp, Status, CQE_SIZE};
use wd_nvme_driver::{Controller, NvmeError};
use wrapdrive::SharedBuf;

mod common;
use common::{io_cq_base, peek, plain_controller, poke};

const BLOCK: u64 = 4096;

/// Post a successful completion for command `cid` of queue `qid` in entry
/// `slot` of the completion queue at `cq`, as a controller would.
fn post(cq: u64, slot: u64, qid: u16, cid: u16) {
    let c = Cqe {
        result: 0,
        sq_head: slot as u16 + 1,
        sq_id: qid,
        cid,
        phase: true,
        status: Status::SUCCESS,
    };
    poke(cq + slot * CQE_SIZE as u64, &c.to_bytes());
}

/// Wait until completion queue entry `slot` at `cq` carries phase 1.
fn wait_posted(cq: u64, slot: u64) {
    let t = Instant::now();
    loop {
        let dw3 = peek(cq + slot * CQE_SIZE as u64 + 12, 4);
        if u32::from_le_bytes(dw3.try_into().unwrap()) >> 16 & 1 == 1 {
            return;
        }
        assert!(t.elapsed() < Duration::from_secs(5), "entry {slot} posted");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A controller of a host of its own (no shadow doorbells, so every tail
/// reaches the register), namespace 1 open, one I/O queue of 8 entries,
/// `len` bytes shared.
struct Plain {
    host: common::TestHost,
    c: Controller,
    q: wd_nvme_driver::IoQueue,
    ns: wd_nvme_driver::Namespace,
    buf: SharedBuf,
}

fn plain(len: u64) -> Plain {
    let (host, mut c, ns) = plain_controller(&["0:4M"]);
    let q = c.create_io_queue(8).unwrap();
    let buf = SharedBuf::new(len as usize).unwrap();
    c.share(&buf).unwrap();
    Plain {
        host,
        c,
        q,
        ns,
        buf,
    }
}

/// A [`plain`] controller with two reads (`a` and `b`) completed and
/// posted, neither taken yet.
struct TwoReads {
    _host: common::TestHost,
    _c: Controller,
    q: wd_nvme_driver::IoQueue,
    ns: wd_nvme_driver::Namespace,
    buf: SharedBuf,
    cq: u64,
    a: u16,
    b: u16,
}

fn two_reads_posted() -> TwoReads {
    let Plain {
        host,
        c,
        mut q,
        ns,
        buf,
    } = plain(4 * BLOCK);
    let cq = io_cq_base(&c, q.qid());
    let a = q.push_rw(IoOp::Read, &ns, 0, buf.addr(), BLOCK).unwrap();
    let b = q
        .push_rw(IoOp::Read, &ns, 1, buf.addr() + BLOCK, BLOCK)
        .unwrap();
    q.pair().ring().unwrap();
    wait_posted(cq, 0);
    wait_posted(cq, 1);
    TwoReads {
        _host: host,
        _c: c,
        q,
        ns,
        buf,
        cq,
        a,
        b,
    }
}

/// A well-behaved controller: the completion of B arrives before the
/// caller asks for it, so `take(A)` sets it aside. B's command id stays
/// allocated until B's completion is handed out (it went back on the free
/// list at once, the next command got it, and waiting for that command
/// returned B's old completion).
#[test]
fn a_set_aside_completion_does_not_complete_the_next_command_with_its_id() {
    let t = two_reads_posted();
    let (a, b, ns, buf) = (t.a, t.b, t.ns, &t.buf);
    let mut q = t.q;
    // A is handed out; B, already there, is set aside for its own take.
    assert!(q.wait_for(a).unwrap().status.is_success());
    // C reads beyond the namespace: the controller fails it.
    let cid_c = q
        .push_rw(IoOp::Read, &ns, ns.blocks, buf.addr() + 2 * BLOCK, BLOCK)
        .unwrap();
    q.pair().ring().unwrap();
    let got = q.wait_for(cid_c).unwrap();
    assert_eq!(
        got.status,
        Status::LBA_OUT_OF_RANGE,
        "C (cid {cid_c}) got B's (cid {b}) set-aside completion {got:?}"
    );
}

/// A hostile or buggy controller posts one completion with a command id
/// that was never issued, after two genuine ones. It is reported, and the
/// genuine completions read in the same pass are handed out (they
/// vanished, their ids freed).
#[test]
fn a_bogus_completion_does_not_swallow_the_genuine_ones_before_it() {
    let t = two_reads_posted();
    let (a, b, cq) = (t.a, t.b, t.cq);
    let mut q = t.q;
    post(cq, 2, q.qid(), 0x7777);
    let first = q.pair().take(a);
    let (mut got_a, mut got_b) = (matches!(first, Ok(Some(_))), false);
    let t = Instant::now();
    while !(got_a && got_b) && t.elapsed() < Duration::from_secs(2) {
        if !got_a {
            got_a = matches!(q.pair().take(a), Ok(Some(_)));
        }
        if !got_b {
            got_b = matches!(q.pair().take(b), Ok(Some(_)));
        }
    }
    let (in_flight, room) = (q.pair().in_flight(), q.pair().room());
    assert!(
        got_a && got_b,
        "first take: {first:?}; A's completion obtained: {got_a}, B's: {got_b}; \
         in flight {in_flight}, room {room} (both ids already free)"
    );
}

/// Identify Namespace data from a hostile controller: an LBA data size of
/// 64 or more is no block size (it panicked); `open_namespace` refuses
/// sizes outside 2^9..=2^16.
#[test]
fn a_hostile_lba_data_size_is_refused_not_a_panic() {
    let mut raw = [0u8; IDENTIFY_BYTES];
    raw[0] = 8; // NSZE
    raw[128 + 2] = 64; // LBA format 0: LBADS 64
    let info = NamespaceInfo::from_bytes(&raw);
    let r = std::panic::catch_unwind(|| info.block_size());
    assert_eq!(r.ok(), Some(0), "LBADS {}", info.lbads);
}

/// A completion set aside by `take`, then a bogus one: `take_ready` hands
/// out the set-aside one and leaves the bogus entry for its next call (it
/// handed out A, freed its id, and dropped it with the error).
#[test]
fn a_set_aside_completion_is_handed_out_before_a_bogus_one_is_reported() {
    let t = two_reads_posted();
    let (a, b, cq) = (t.a, t.b, t.cq);
    let mut q = t.q;
    post(cq, 2, q.qid(), 0x7777);
    // B taken; A set aside; the bogus entry left for the next read.
    assert!(q.pair().take(b).unwrap().is_some());
    let got = q.take_ready(8).unwrap();
    assert_eq!(got.iter().map(|c| c.cid).collect::<Vec<_>>(), vec![a]);
    assert!(
        matches!(q.take_ready(8), Err(NvmeError::Protocol(_))),
        "the bogus completion is reported, as the controller's error"
    );
    assert_eq!((q.pair().in_flight(), q.pair().room()), (0, 7));
}

/// `reap` appends to a vector that may hold earlier completions: a new
/// completion of a command id used again is not taken for a duplicate (it
/// was refused as "not outstanding", its id taken for good).
#[test]
fn reap_into_a_vector_holding_an_earlier_completion_of_the_same_id() {
    // (The host and the controller held to the end.)
    let Plain {
        host: _host,
        c: _c,
        mut q,
        ns,
        buf,
    } = plain(BLOCK);
    let mut all = Vec::new();
    for round in 0..2u64 {
        q.push_rw(IoOp::Read, &ns, round, buf.addr(), BLOCK)
            .unwrap();
        q.pair().ring().unwrap();
        let t = Instant::now();
        while all.len() <= round as usize {
            q.pair().reap(&mut all).unwrap();
            assert!(t.elapsed() < Duration::from_secs(5), "round {round}");
        }
    }
    assert_eq!(all[0].cid, all[1].cid, "the id is used again");
    assert_eq!(q.pair().in_flight(), 0);
}

/// A command its waiter gave up on keeps its id until its completion
/// comes, which is then dropped, not handed to anyone (a waiter that
/// timed out left its id taken for good, or its late completion set
/// aside for nobody).
#[test]
fn a_late_completion_of_a_command_given_up_frees_its_id() {
    let t = two_reads_posted();
    let (a, b, cq) = (t.a, t.b, t.cq);
    let mut q = t.q;
    // A's completion is there (set aside by the take of B): dropped now.
    assert!(q.pair().take(b).unwrap().is_some());
    q.pair().give_up(a);
    assert_eq!((q.pair().in_flight(), q.pair().room()), (0, 7));
    assert!(q.take_ready(8).unwrap().is_empty());
    // C is pushed and never rung: its completion comes "late", posted
    // by hand, after its waiter gave up.
    let c = q
        .push_rw(IoOp::Read, &t.ns, 2, t.buf.addr(), BLOCK)
        .unwrap();
    q.pair().give_up(c);
    assert_eq!(q.pair().room(), 6, "its id stays taken until it completes");
    post(cq, 2, q.qid(), c);
    assert!(q.take_ready(8).unwrap().is_empty(), "handed to nobody");
    assert_eq!((q.pair().in_flight(), q.pair().room()), (0, 7));
}

/// A wait that fails gives its command up itself: a caller of
/// `IoQueue::wait_for` that hears its host went away has its command's id
/// back, and the command is not sent again when the queue is made again
/// (a direct caller had to call `give_up` itself, or the id stayed taken
/// and a restore sent the command the caller was told had failed).
#[test]
fn a_failed_wait_gives_its_command_up() {
    let TwoReads {
        _host: host,
        mut q,
        ns,
        buf,
        a,
        b,
        ..
    } = two_reads_posted();
    assert!(q.wait_for(a).unwrap().status.is_success());
    assert!(q.wait_for(b).unwrap().status.is_success());
    let c = q.push_rw(IoOp::Read, &ns, 2, buf.addr(), BLOCK).unwrap();
    drop(host);
    let e = q.wait_for(c).unwrap_err();
    assert!(e.host_gone(), "{e}");
    assert_eq!((q.pair().in_flight(), q.pair().room()), (0, 7));
}

/// A controller that completes one command twice in the same pass: the
/// first is handed out, the second reported (not handed out again).
#[test]
fn a_command_completed_twice_in_one_pass_is_handed_out_once() {
    let t = two_reads_posted();
    let (a, b, cq) = (t.a, t.b, t.cq);
    let mut q = t.q;
    post(cq, 2, q.qid(), a);
    let got = q.take_ready(8).unwrap();
    assert_eq!(got.iter().map(|c| c.cid).collect::<Vec<_>>(), vec![a, b]);
    assert!(
        matches!(q.take_ready(8), Err(NvmeError::Protocol(_))),
        "the second completion of {a} is the controller's error"
    );
    assert_eq!((q.pair().in_flight(), q.pair().room()), (0, 7));
}
