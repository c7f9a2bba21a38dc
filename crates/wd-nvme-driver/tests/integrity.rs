//! Store integrity across I/O queue churn, through a host in this
//! process: queue pairs created, used and deleted again and again (the
//! same queue id coming back), with the store rewritten behind the
//! controller between rounds, must leave exactly the data of the commands
//! the driver submitted, nothing replayed from an earlier queue, and every
//! completion must belong to a command submitted to the queue it is on.
//!
//! Random mixes of reads, writes, write zeroes and deallocations against a
//! model and the store, with each engine, and the kill -9 of a client with
//! writes in flight, are in `store_integrity.rs`.

use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use wd_nvme_driver::msg::cmd::{feature, CreateQueue};
use wd_nvme_driver::msg::{regs, AdminOp, Cqe, IoOp, Sqe, CQE_SIZE, SQE_SIZE};
use wd_nvme_driver::{Controller, Options};
use wrapdrive::SharedBuf;

mod common;
use common::{plain_controller, start_with};

const BLOCK: u64 = 4096;
const PAGE: u64 = 4096;
const ROUNDS: u64 = 4;

fn store_file(path: &str) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap()
}

/// Blocks `first..first + n` of the store all hold `byte`.
fn store_holds(store: &std::fs::File, first: u64, n: u64, byte: u8) -> bool {
    let mut back = vec![0u8; (n * BLOCK) as usize];
    store.read_exact_at(&mut back, first * BLOCK).unwrap();
    back.iter().all(|&b| b == byte)
}

/// Rounds over one I/O queue pair of this test's own: fixed queue pages,
/// shared once, so a queue created again sits on the previous round's
/// entries, as it does for a driver that keeps its queue memory. Each
/// round creates CQ 1 and SQ 1, runs three writes (one command each),
/// checks their completions and the store, deletes the queues and zeroes
/// the blocks in the store behind the controller. `zero_doorbells` has
/// the driver write 0 to the pair's doorbells before creating it again.
fn rounds_on_fixed_queue_memory(zero_doorbells: bool) {
    let (h, mut c, ns) = plain_controller(&["0:4M"]);
    let mem = SharedBuf::new((4 * PAGE) as usize).unwrap();
    c.share(&mem).unwrap();
    // Page-aligned places inside the buffer: SQ, CQ, data.
    let first = mem.addr().next_multiple_of(PAGE) - mem.addr();
    let (sq, cq, data) = (first, first + PAGE, first + 2 * PAGE);
    let at = |off: u64| mem.addr() + off;
    let regs = c.registers().clone();
    let store = store_file(&h.store());
    for round in 0..ROUNDS {
        if zero_doorbells {
            regs.store32(regs::sq_tail_doorbell(1), 0);
            regs.store32(regs::cq_head_doorbell(1), 0);
        }
        mem.write(cq, &[0; PAGE as usize]);
        for (op, base, other) in [(AdminOp::CreateCq, cq, 0), (AdminOp::CreateSq, sq, 1)] {
            let mut s = Sqe {
                opcode: op as u8,
                ..Sqe::default()
            };
            CreateQueue {
                qid: 1,
                entries: 8,
                contiguous: true,
                other,
                base: at(base),
            }
            .encode(&mut s);
            c.admin_command("create", s).unwrap();
        }
        // One more admin command: its completion comes from a later pass
        // than the one that created SQ 1 (and looked at its doorbell).
        let mut get = Sqe {
            opcode: AdminOp::GetFeatures as u8,
            ..Sqe::default()
        };
        get.cdw[0] = feature::NUMBER_OF_QUEUES as u32;
        c.admin_command("get features", get).unwrap();
        assert!(
            mem.to_vec()[cq as usize..(cq + PAGE) as usize]
                .iter()
                .all(|&b| b == 0),
            "round {round}: completions on a new queue before anything was submitted"
        );
        // Three writes of this round's pattern.
        let pattern = 0x80 | round as u8;
        mem.write(data, &[pattern; BLOCK as usize]);
        for i in 0..3u64 {
            let mut s = Sqe {
                opcode: IoOp::Write as u8,
                cid: (100 * round + i) as u16,
                nsid: ns.nsid,
                prp1: at(data),
                ..Sqe::default()
            };
            s.cdw[0] = (round * 3 + i) as u32;
            mem.write(sq + i * SQE_SIZE as u64, &s.to_bytes());
        }
        regs.store32(regs::sq_tail_doorbell(1), 3);
        c.queue().wake_engine().unwrap();
        let cqe = |k: u64| {
            let mut b = [0u8; CQE_SIZE];
            mem.read(cq + k * CQE_SIZE as u64, &mut b);
            Cqe::from_bytes(&b)
        };
        let t = Instant::now();
        while !cqe(2).phase {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "round {round}: three completions"
            );
            std::thread::yield_now();
        }
        for i in 0..3u64 {
            let e = cqe(i);
            assert_eq!(
                (e.cid, e.sq_id, e.phase),
                ((100 * round + i) as u16, 1, true),
                "round {round}: completion {i} is for a command submitted this round"
            );
            assert!(e.status.is_success(), "round {round}: {}", e.status);
        }
        assert!(
            !cqe(3).phase,
            "round {round}: three commands, three completions"
        );
        regs.store32(regs::cq_head_doorbell(1), 3);
        for op in [AdminOp::DeleteSq, AdminOp::DeleteCq] {
            let mut s = Sqe {
                opcode: op as u8,
                ..Sqe::default()
            };
            s.cdw[0] = 1;
            c.admin_command("delete", s).unwrap();
        }
        // This round's blocks hold its pattern, earlier rounds' are still
        // the zeroes written behind the controller: nothing was replayed.
        assert!(store_holds(&store, round * 3, 3, pattern), "round {round}");
        assert!(
            store_holds(&store, 0, round * 3, 0),
            "round {round}: an earlier round's writes came back"
        );
        store
            .write_all_at(&[0u8; 3 * BLOCK as usize], round * 3 * BLOCK)
            .unwrap();
    }
    c.shutdown().unwrap();
    assert!(store_holds(&store, 0, 1024, 0));
}

#[test]
fn queues_created_again_over_old_entries_run_only_new_commands_doorbells_zeroed() {
    rounds_on_fixed_queue_memory(true);
}

/// Regression: a submission queue created again with the id of a
/// deleted one started at the tail its predecessor left in the doorbell
/// register, so the controller ran the old entries still in the queue
/// memory and the driver's own commands never ran (NVMe Base 1.4 §4.1:
/// head and tail are 0h at creation). The controller-level test is
/// `a_recreated_queue_starts_at_zero_whatever_its_doorbells_hold` in
/// crates/wd-nvme/tests/spec.rs.
#[test]
fn queues_created_again_over_old_entries_run_only_new_commands() {
    rounds_on_fixed_queue_memory(false);
}

/// Regression: a deleted queue pair's memory stayed shared, so the next
/// `create_io_queue` got the same buffers from the allocator and its
/// share was refused, and the controller could still reach memory the
/// client reused.
#[test]
fn io_queues_can_be_deleted_and_created_again() {
    let h = start_with("engine=sync,", &["0:4M"], |_| {});
    let conn = h.conn();
    let mut c = Controller::open(&conn, &Options::default()).unwrap();
    let ns = c.open_namespace(1).unwrap();
    let buf = SharedBuf::new(64 * 1024).unwrap();
    c.share(&buf).unwrap();
    let store = store_file(&h.store());
    for round in 0..ROUNDS {
        let mut q = c
            .create_io_queue(8)
            .unwrap_or_else(|e| panic!("round {round}: create_io_queue: {e}"));
        let pattern = 0x80 | round as u8;
        buf.write(0, &[pattern; BLOCK as usize]);
        for i in 0..3 {
            q.write(&ns, round * 3 + i, &buf, 0, BLOCK).unwrap();
        }
        c.delete_io_queue(q).unwrap();
        assert!(store_holds(&store, round * 3, 3, pattern), "round {round}");
        assert!(store_holds(&store, 0, round * 3, 0), "round {round}");
        store
            .write_all_at(&[0u8; 3 * BLOCK as usize], round * 3 * BLOCK)
            .unwrap();
    }
    c.shutdown().unwrap();
}
