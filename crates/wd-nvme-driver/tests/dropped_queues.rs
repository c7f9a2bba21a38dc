//! An I/O queue dropped without being deleted: its memory stays out of
//! the allocator while the controller may write it.

use std::time::{Duration, Instant};

use wd_nvme_driver::msg::{IoOp, CQE_SIZE};

use wrapdrive::SharedBuf;

mod common;
use common::{io_cq_base, plain_controller};

const BLOCK: u64 = 4096;

/// Dropping an `IoQueue` (no `delete_io_queue`: an early return, a `?`,
/// a panic) kept the controller's queues and left the memory in its
/// domain, yet handed it back to the allocator: the completions of the
/// commands in flight landed in memory the program had allocated again.
/// Now the memory stays out of the allocator until the controller goes.
#[test]
fn a_dropped_queues_memory_is_not_handed_out_while_the_controller_may_write_it() {
    let (_host, mut c, ns) = plain_controller(&["0:16M"]);
    let mut q = c.create_io_queue(64).unwrap();
    let cq = io_cq_base(&c, q.qid());
    let chunk = 256 * 1024u64;
    let n = 63u64;
    let data = SharedBuf::new((n * chunk) as usize).unwrap();
    c.share(&data).unwrap();
    for i in 0..n {
        q.push_rw(
            IoOp::Read,
            &ns,
            i * chunk / BLOCK,
            data.addr() + i * chunk,
            chunk,
        )
        .unwrap();
    }
    q.pair().ring().unwrap();
    // The caller goes away without deleting the queue.
    drop(q);
    // The program allocates again: find the completion queue's page.
    let mut bufs = Vec::new();
    let mut hit = None;
    for _ in 0..64 {
        let b = SharedBuf::new(4096).unwrap();
        if b.addr() <= cq && cq < b.addr() + b.len() {
            b.write(0, &[0xaa; 4096]);
            hit = Some(bufs.len());
            bufs.push(b);
            break;
        }
        bufs.push(b);
    }
    let Some(i) = hit else {
        // Not handed out again: nothing of the program's to overwrite.
        drop(c);
        return;
    };
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(500) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut now = vec![0u8; 4096];
    bufs[i].read(0, &mut now);
    let changed = now.iter().filter(|&&b| b != 0xaa).count();
    assert_eq!(
        changed,
        0,
        "{changed} bytes of a freshly allocated buffer (the dropped queue's completion queue \
         at {cq:#x}) were written by the controller after the program got it back; first \
         entry {:02x?}",
        &now[..CQE_SIZE]
    );
    drop(c);
}
