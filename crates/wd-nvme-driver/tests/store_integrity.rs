//! Data through mediated controllers against a model and against `pread`
//! of the store: random mixes of reads, writes, write zeroes and
//! deallocations on several queue pairs and both block sizes, with each
//! I/O engine; and a client killed with writes in flight, after which its
//! namespace is free, the rest of the store untouched and the host
//! serving.

use std::os::unix::fs::FileExt;

use wd_nvme_driver::msg::cmd::DsmRange;
use wd_nvme_driver::{Controller, Namespace, Options};
use wd_testutil::{report, wait_until, Rng, Role};
use wrapdrive::{HostConn, SharedBuf};

mod common;
use common::start_with;

const MIB: u64 = 1 << 20;

fn random_mix(engine: &str) {
    let h = start_with(&format!("engine={engine},"), &["0:8M", "8M:8M:512"], |_| {});
    let conn = h.conn();
    let mut c = Controller::open(&conn, &Options::default()).unwrap();
    let ns = [c.open_namespace(1).unwrap(), c.open_namespace(2).unwrap()];
    let mut qs: Vec<_> = (0..3).map(|_| c.create_io_queue(32).unwrap()).collect();
    let buf = SharedBuf::new(MIB as usize).unwrap();
    c.share(&buf).unwrap();
    let ranges = SharedBuf::new(4096).unwrap();
    c.share(&ranges).unwrap();
    let mut model = [vec![0u8; 8 * MIB as usize], vec![0u8; 8 * MIB as usize]];
    let mut rng = Rng::new(0x5eed_0000 ^ engine.len() as u64);
    for step in 0..400 {
        let k = rng.below(2) as usize;
        let n: &Namespace = &ns[k];
        let q = &mut qs[rng.below(3) as usize];
        let max_blocks = (256 * 1024 / n.block).min(n.blocks);
        let nlb = 1 + rng.below(max_blocks);
        let lba = rng.below(n.blocks - nlb + 1);
        let (off, len) = ((lba * n.block) as usize, (nlb * n.block) as usize);
        // Data at a block-aligned place in the buffer, sometimes not page
        // aligned (PRP1 with an offset).
        let at = rng.below((MIB - len as u64) / n.block + 1) * n.block;
        match rng.below(8) {
            0..=2 => {
                let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
                buf.write(at, &data);
                q.write(n, lba, &buf, at, len as u64).unwrap();
                model[k][off..off + len].copy_from_slice(&data);
            }
            3..=5 => {
                q.read(n, lba, &buf, at, len as u64).unwrap();
                let mut got = vec![0u8; len];
                buf.read(at, &mut got);
                assert!(
                    got == model[k][off..off + len],
                    "{engine} step {step}: read of namespace {} blocks {lba}+{nlb} differs from the model",
                    n.nsid
                );
            }
            6 => {
                let nlb = nlb.min(0x1_0000) as u32;
                q.write_zeroes(n, lba, nlb, rng.below(2) == 0).unwrap();
                let len = (nlb as u64 * n.block) as usize;
                model[k][off..off + len].fill(0);
            }
            _ => {
                let count = 1 + rng.below(3) as usize;
                let mut raw = Vec::new();
                for _ in 0..count {
                    let blocks = 1 + rng.below(64.min(n.blocks));
                    let slba = rng.below(n.blocks - blocks + 1);
                    raw.extend_from_slice(
                        &DsmRange {
                            attributes: 0,
                            blocks: blocks as u32,
                            slba,
                        }
                        .to_bytes(),
                    );
                    let (o, l) = ((slba * n.block) as usize, (blocks * n.block) as usize);
                    model[k][o..o + l].fill(0);
                }
                ranges.write(0, &raw);
                q.deallocate(n, &ranges, 0, count).unwrap();
            }
        }
    }
    for q in qs {
        c.delete_io_queue(q).unwrap();
    }
    c.shutdown().unwrap();
    // The store itself, read around the controller.
    let f = std::fs::File::open(h.store()).unwrap();
    for (k, m) in model.iter().enumerate() {
        let mut back = vec![0u8; m.len()];
        f.read_exact_at(&mut back, k as u64 * 8 * MIB).unwrap();
        assert!(
            back == *m,
            "{engine}: namespace {} in the store differs from the model",
            k + 1
        );
    }
}

#[test]
fn random_mixes_match_a_model_and_the_store_synchronous_engine() {
    random_mix("sync");
}

#[test]
fn random_mixes_match_a_model_and_the_store_io_uring_engine() {
    if wd_sys::uring::probe().is_err() {
        wd_testutil::skip(
            "random_mixes_match_a_model_and_the_store_io_uring_engine",
            "io_uring unavailable",
        );
        return;
    }
    random_mix("io_uring");
}

/// Entry point of the client that is killed; does nothing in a normal run.
#[test]
fn child_entry() {
    if wd_testutil::role().is_none() {
        return;
    }
    let conn = HostConn::connect(&std::env::var("WD_NVME_TEST_SOCKET").unwrap()).unwrap();
    let mut c = Controller::open(&conn, &Options::default()).unwrap();
    let ns = c.open_namespace(2).unwrap();
    let mut q = c.create_io_queue(64).unwrap();
    let bs = 128 * 1024u64;
    let buf = SharedBuf::new((64 * bs) as usize).unwrap();
    buf.write(0, &vec![0x5a; buf.len() as usize]);
    c.share(&buf).unwrap();
    let mut rng = Rng::new(7);
    let slots = ns.blocks * ns.block / bs;
    let mut done = Vec::new();
    let mut completed = 0u64;
    let push = |q: &mut wd_nvme_driver::IoQueue, rng: &mut Rng| {
        let slot = q.pair().next_cid().unwrap() as u64;
        let lba = rng.below(slots) * bs / ns.block;
        q.push_rw(
            wd_nvme_driver::msg::IoOp::Write,
            &ns,
            lba,
            buf.addr() + slot * bs,
            bs,
        )
        .unwrap();
    };
    for _ in 0..48 {
        push(&mut q, &mut rng);
    }
    q.pair().ring().unwrap();
    loop {
        done.clear();
        q.pair().reap(&mut done).unwrap();
        for _ in &done {
            completed += 1;
            if completed == 200 {
                report("flooding");
            }
            push(&mut q, &mut rng);
        }
        q.pair().ring().unwrap();
    }
}

#[test]
fn kill_9_with_writes_in_flight_frees_the_namespace_and_stays_inside_it() {
    let pattern = |ns: u8| vec![0xa0 | ns; 4 * MIB as usize];
    let h = start_with("", &["0:4M", "4M:4M", "8M:4M"], |store| {
        let f = std::fs::OpenOptions::new().write(true).open(store).unwrap();
        for ns in 1..=3u8 {
            f.write_all_at(&pattern(ns), (ns as u64 - 1) * 4 * MIB)
                .unwrap();
        }
    });
    let mut cmd = Role::command("flood");
    cmd.env("WD_NVME_TEST_SOCKET", &h.socket);
    let mut child = Role::spawn(cmd);
    assert_eq!(child.read_report(), "flooding");
    // SIGKILL with writes in flight.
    child.child.kill().unwrap();
    child.child.wait().unwrap();
    // Its namespace is released with its queue; the host still serves.
    let conn = h.conn();
    let mut c = Controller::open(&conn, &Options::default()).unwrap();
    wait_until("namespace 2 to be released", || c.attach(2).is_ok());
    let ns = c.open_namespace(2).unwrap();
    let mut q = c.create_io_queue(8).unwrap();
    let buf = SharedBuf::new(4096).unwrap();
    c.share(&buf).unwrap();
    buf.write(0, &[0x77; 4096]);
    q.write(&ns, 0, &buf, 0, 4096).unwrap();
    // The neighbours of the killed client's namespace are untouched, and
    // what it wrote stayed inside its own.
    let f = std::fs::File::open(h.store()).unwrap();
    let mut back = vec![0u8; 4 * MIB as usize];
    for n in [1u8, 3] {
        f.read_exact_at(&mut back, (n as u64 - 1) * 4 * MIB)
            .unwrap();
        assert!(
            back == pattern(n),
            "namespace {n} was written by another client"
        );
    }
    f.read_exact_at(&mut back, 4 * MIB).unwrap();
    assert!(back[..4096].iter().all(|&b| b == 0x77));
    assert!(back[4096..].iter().all(|&b| b == 0x5a || b == 0xa2));
}
