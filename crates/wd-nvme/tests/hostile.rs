//! Random hostile admin and I/O entries, doorbells and CC writes
//! against one controller; any panic or a pass that runs long fails.

use std::time::{Duration, Instant};

use wd_nvme::msg::regs;
use wd_nvme::msg::{AdminOp, Sqe};

mod common;
use common::*;

struct Rng(u64, u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn addr(&mut self) -> u64 {
        match self.below(8) {
            0 => self.next(),
            1 => 0,
            2 => self.1 + DATA + self.below(64) * 4096 + self.below(8) * 512,
            3 => self.1 + DATA + self.below(64) * 4096,
            4 => BASE + MEM as u64 - 4096 * self.below(3),
            5 => u64::MAX - self.below(8192),
            _ => DATA + self.below(256) * 4096,
        }
    }
    fn small(&mut self) -> u32 {
        match self.below(6) {
            0 => self.next() as u32,
            1 => 0,
            2 => self.below(20) as u32,
            3 => u32::MAX,
            4 => (self.below(20) as u32) | (self.below(4) as u32 * 0x7ff) << 16,
            _ => self.below(0x10000) as u32,
        }
    }
}

fn random_sqe(g: &mut Rng, admin: bool) -> Sqe {
    let ops: &[u8] = if admin {
        &[
            0, 1, 2, 4, 5, 6, 8, 9, 0xa, 0xc, 0x15, 0x18, 0x7c, 0x80, 0xff,
        ]
    } else {
        &[0, 1, 2, 5, 8, 9, 4, 0x80]
    };
    let mut s = Sqe {
        opcode: ops[g.below(ops.len() as u64) as usize],
        fuse: if g.below(20) == 0 {
            g.below(4) as u8
        } else {
            0
        },
        psdt: if g.below(20) == 0 {
            g.below(4) as u8
        } else {
            0
        },
        nsid: match g.below(5) {
            0 => 0,
            1 => 0xffff_ffff,
            2 => g.next() as u32,
            _ => 1 + g.below(2) as u32,
        },
        prp1: g.addr(),
        prp2: g.addr(),
        ..Sqe::default()
    };
    for c in s.cdw.iter_mut() {
        *c = g.small();
    }
    s
}

#[test]
fn random_hostile_entries_never_panic_or_stall() {
    run(false);
}

#[test]
fn random_hostile_entries_on_the_ring_never_panic_or_stall() {
    run(true);
}

fn run(ring: bool) {
    let seeds: u64 = std::env::var("WD_TEST_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    for seed in 1..=seeds {
        let mut g = Rng(
            0x9e37_79b9_7f4a_7c15 ^ seed.wrapping_mul(0x1234_5678_9abc_def1),
            0,
        );
        let mut r = if ring {
            let (r, at) = ring_rig(&["0:4M", "4M:4M:512"]);
            g.1 = at - DATA;
            r
        } else {
            Rig::new(&["0:4M", "4M:4M:512"])
        };
        if ring {
            // ring_rig attached namespace 1 only.
            let _ = r.attach(2);
        }
        // Fill data memory with random PRP-list-like words.
        for p in 0..256u64 {
            let mut page = vec![0u8; 4096];
            for w in page.chunks_exact_mut(8) {
                let v = g.addr();
                w.copy_from_slice(&v.to_le_bytes());
            }
            r.mem.put(DATA + p * 4096, &page);
        }
        r.io_queues(16, 16);
        let mut tail1 = 0u32;
        let mut held = 0u32;
        for step in 0..400 {
            match g.below(10) {
                0..=3 => {
                    let s = random_sqe(&mut g, true);
                    let _ = r.admin_submit(s);
                }
                4..=7 => {
                    for _ in 0..1 + g.below(6) {
                        let mut s = random_sqe(&mut g, false);
                        if g.below(2) == 0 {
                            // Mostly well-formed reads and writes (ring-able).
                            s.opcode = 1 + g.below(2) as u8;
                            s.fuse = 0;
                            s.psdt = 0;
                            s.cdw[1] = 0;
                            s.cdw[0] = g.below(64) as u32;
                            s.cdw[2] = g.below(16) as u32;
                        }
                        r.io_put(tail1, &s);
                        tail1 = (tail1 + 1) % 16;
                    }
                    r.regs.store32(regs::sq_tail_doorbell(1), tail1);
                }
                8 => {
                    let q = g.below(18) as u16;
                    if g.below(2) == 0 {
                        r.regs.store32(regs::sq_tail_doorbell(q), g.small());
                    } else {
                        r.regs.store32(regs::cq_head_doorbell(q), g.small());
                    }
                }
                _ => {
                    // Consume I/O completions (head = anything plausible).
                    r.regs
                        .store32(regs::cq_head_doorbell(1), g.below(16) as u32);
                    if g.below(30) == 0 {
                        let cc = r.regs.load32(regs::CC) ^ (1u32 << g.below(24));
                        r.regs.store32(regs::CC, cc);
                    }
                }
            }
            let t = Instant::now();
            if r.pass().holds_from.is_some() {
                held += 1;
            }
            while r.admin_cqe().is_some() {}
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "seed {seed} step {step}: a pass ran {:?}",
                t.elapsed()
            );
            if r.csts() != regs::CSTS_RDY {
                r.enable();
                r.io_queues(16, 16);
                tail1 = 0;
            }
        }
        let _ = AdminOp::Identify;
        if seed <= 3 {
            eprintln!("seed {seed}: {held} passes with transfers on the ring");
        }
    }
}
