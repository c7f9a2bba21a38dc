//! The asynchronous engine: reads in flight through io_uring.

use wd_sys::uring::Reads;

use super::gather::Gathers;
use super::plan::{wait_alloc, Outcome, Plan};
use super::LoadError;

/// The io_uring reader: up to `depth` reads in flight, each gather's reads
/// issued as soon as it is allocated. Returns the reads issued.
pub(super) fn read_uring<'m>(
    plan: &Plan<'m>,
    ring: &mut Reads<'_, 'm>,
    depth: u32,
    g: &Gathers,
    report: &mut dyn FnMut(u64),
) -> Result<u64, LoadError> {
    let depth = depth as usize;
    let mut slots: Vec<(u64, u64)> = vec![(0, 0); depth];
    let mut free: Vec<usize> = (0..depth).rev().collect();
    let mut retry: Vec<(u64, u64)> = Vec::new();
    let mut next = 0u64;
    let mut done = 0u64;
    let mut reads = 0u64;
    let mut cqes = Vec::with_capacity(depth);
    loop {
        let ready = g.ready();
        while ring.in_flight() < depth {
            let (off, len) = if let Some(r) = retry.pop() {
                r
            } else if next < plan.read_end {
                let len = plan.chunk.min(plan.read_end - next);
                if next + len > ready {
                    break;
                }
                next += len;
                (next - len, len)
            } else {
                break;
            };
            let slot = free.pop().expect("one free slot per read not in flight");
            slots[slot] = (off, len);
            ring.push_read(
                plan.fd,
                plan.map,
                off as usize,
                len as usize,
                off,
                slot as u64,
            )
            .map_err(|e| plan.read_error(off, e))?;
            reads += 1;
        }
        if ring.in_flight() == 0 {
            if next >= plan.read_end {
                break;
            }
            let want = next + plan.chunk.min(plan.read_end - next);
            wait_alloc(plan, g, want)?;
            continue;
        }
        cqes.clear();
        ring.submit_and_wait(1, &mut cqes)
            .map_err(|e| plan.read_error(next, e))?;
        for c in &cqes {
            let slot = c.user_data as usize;
            let (off, len) = slots[slot];
            free.push(slot);
            match plan.judge(off, len, c.result as i64)? {
                Outcome::Done(n) => done += n,
                Outcome::Partial(n, rest) => {
                    done += n;
                    retry.push(rest);
                }
                Outcome::Retry => retry.push((off, len)),
            }
        }
        report(done);
    }
    Ok(reads)
}
