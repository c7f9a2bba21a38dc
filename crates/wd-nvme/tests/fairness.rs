//! What one client's controller can do to the others: a pass is bounded
//! and its syncs shared (each test failed before its fix).

mod common;

use std::time::{Duration, Instant};

use wd_nvme::msg::{AdminOp, IoOp, Status};
use wd_testutil::dma::FlatMemory;

use common::*;

/// Submission and completion queue `q` (1..=16) of the flood.
fn flood_sq(q: u16) -> u64 {
    BASE + 0x20_0000 + q as u64 * 0x2000
}
fn flood_cq(q: u16) -> u64 {
    BASE + 0x40_0000 + q as u64 * 0x1000
}
const FLOOD_DATA: u64 = BASE + 0x60_0000;
const FLOOD_LIST: u64 = BASE + 0x70_0000;
const FLOOD_QUEUES: u16 = 16;
const FLOOD_DEPTH: u32 = 64;
const FLOOD_ENTRIES: u32 = 128;

/// A controller whose 16 I/O queue pairs each hold 64 writes of 256 KiB
/// (MDTS) with Force Unit Access, rung and not yet run: what one client
/// may put before a single pass of the polling thread.
fn flooded() -> Rig {
    let mut r = Rig::bare(&["0:64M"]);
    r.mem = FlatMemory::new(BASE, 8 << 20);
    let mut r = Rig::ready(r);
    // A PRP list for 256 KiB at FLOOD_DATA.
    let list: Vec<u8> = (1..64u64)
        .flat_map(|i| (FLOOD_DATA + i * 4096).to_le_bytes())
        .collect();
    r.mem.put(FLOOD_LIST, &list);
    r.mem.put(FLOOD_DATA, &vec![0x5a; 256 << 10]);
    flood(&mut r, |n| {
        rw(IoOp::Write, 1, n * 64 % 16384, 64, FLOOD_DATA, FLOOD_LIST)
    });
    r
}

/// Fill the 16 queue pairs with 64 commands each, `write(n)` the n-th,
/// with Force Unit Access, and ring.
fn flood(r: &mut Rig, write: impl Fn(u64) -> wd_nvme::msg::Sqe) {
    for q in 1..=FLOOD_QUEUES {
        r.mem.put(flood_cq(q), &[0; 0x1000]);
        assert_eq!(
            r.create(AdminOp::CreateCq, q, FLOOD_ENTRIES, 0, flood_cq(q)),
            Status::SUCCESS
        );
        assert_eq!(
            r.create(AdminOp::CreateSq, q, FLOOD_ENTRIES, q, flood_sq(q)),
            Status::SUCCESS
        );
        for k in 0..FLOOD_DEPTH {
            let n = (q as u64 - 1) * FLOOD_DEPTH as u64 + k as u64;
            let mut s = write(n);
            s.cid = k as u16;
            // Force Unit Access: durable before its completion.
            s.cdw[2] |= 1 << 30;
            r.mem.put(flood_sq(q) + k as u64 * 64, &s.to_bytes());
        }
    }
    for q in 1..=FLOOD_QUEUES {
        r.regs
            .store32(wd_nvme::msg::regs::sq_tail_doorbell(q), FLOOD_DEPTH);
    }
}

/// One pass of the polling thread serves one controller at a time: every
/// other client's controller on the engine, and every unshare, detach or
/// attach of any client of the host (an IOMMU sync waits for an engine in
/// its section, and a controller's pass is one section), waits for it.
/// Each device's pass is bounded (`pass_bytes`, 256 KiB by default); a
/// controller's was not: 17 queues of 64 commands, each up to 256 KiB and
/// an fdatasync, 272 MiB and 1088 syncs of the store in one pass.
#[test]
fn one_pass_of_a_flooded_controller_is_bounded() {
    let mut r = flooded();
    let t = Instant::now();
    let s = r.pass();
    let took = t.elapsed();
    eprintln!(
        "one pass: {took:?}, {} commands, {} bytes",
        s.requests, s.bytes
    );
    assert!(
        s.bytes <= 4 << 20,
        "one pass moved {} MiB ({} commands) in {took:?}: every other client waits for it",
        s.bytes >> 20,
        s.requests
    );
    // The rest is done in later passes.
    let mut done = s.requests;
    let t = Instant::now();
    while done < FLOOD_QUEUES as u64 * FLOOD_DEPTH as u64 {
        assert!(t.elapsed() < Duration::from_secs(120), "{done} done");
        let s = r.pass();
        assert!(
            s.bytes <= 4 << 20,
            "a later pass moved {} MiB",
            s.bytes >> 20
        );
        done += s.requests;
    }
}

/// The same on the I/O ring: each write with Force Unit Access that
/// finished had an fdatasync of its own in the pass that reaped it, a
/// ring's worth (256) of syncs in one pass. Those reaped together share
/// one (each is durable before its completion all the same).
#[test]
fn write_through_completions_on_the_ring_share_a_sync() {
    let (mut r, _) = ring_rig(&["0:64M:512"]);
    // More memory (the controller's queues start over in it).
    r.mem = FlatMemory::new(BASE, 8 << 20);
    r.mem.set_holds(true);
    let ptr = wd_device::Dma::slice(&mut r.mem, FLOOD_DATA, 4096, wd_device::Access::Read)
        .unwrap()
        .as_ptr() as u64;
    // 3.5 KiB in one page, its memory aligned for O_DIRECT.
    let data = FLOOD_DATA + (512 - ptr % 512) % 512;
    r.mem.put(data, &[0xa5; 3584]);
    flood(&mut r, |n| rw(IoOp::Write, 1, n * 8 % 131072, 7, data, 0));
    let total = FLOOD_QUEUES as u64 * FLOOD_DEPTH as u64;
    let (mut done, mut held, mut worst) = (0, false, Duration::ZERO);
    let t = Instant::now();
    while done < total {
        assert!(t.elapsed() < Duration::from_secs(120), "{done} done");
        let p = Instant::now();
        let s = r.pass();
        worst = worst.max(p.elapsed());
        held |= s.holds_from.is_some();
        done += s.requests;
    }
    eprintln!("longest pass {worst:?}");
    assert!(held, "no write went on the ring (no O_DIRECT here?)");
    // Each completion reads as the store has it.
    for q in 1..=FLOOD_QUEUES {
        for k in 0..FLOOD_DEPTH {
            let c = wd_nvme::msg::Cqe::from_bytes(
                &r.mem
                    .get(flood_cq(q) + k as u64 * 16, 16)
                    .try_into()
                    .unwrap(),
            );
            assert_eq!(c.status, Status::SUCCESS);
        }
    }
    assert!(
        worst < Duration::from_millis(300),
        "a pass took {worst:?}: the writes it reaped were synced one by one"
    );
}
