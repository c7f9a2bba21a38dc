//! The allocation thread: pages of the buffer allocated gather by gather,
//! each published to the readers as soon as it exists.

use std::os::fd::BorrowedFd;
use std::sync::atomic::Ordering;
use std::time::Instant;

use wd_sys::Mapping;

use crate::heap::{HeapError, PageKind};

use super::gather::Gathers;

/// The allocation side of a load.
#[derive(Clone, Copy)]
pub(super) struct Allocation<'a> {
    pub(super) map: &'a Mapping,
    pub(super) fd: BorrowedFd<'a>,
    pub(super) kind: PageKind,
    pub(super) capacity: u64,
    /// Steady-state gather.
    pub(super) gather: u64,
    /// First gather (then doubling up to `gather`).
    pub(super) first: u64,
}

/// Allocate `[0, capacity)` gather by gather, publishing each.
pub(super) fn populate(a: &Allocation<'_>, g: &Gathers, t0: Instant) {
    let Allocation {
        map,
        fd,
        kind,
        capacity,
        gather,
        first,
    } = *a;
    let mut off = 0u64;
    let mut step = first.min(gather);
    while off < capacity {
        if g.stop.load(Ordering::Relaxed) {
            return;
        }
        // Ramp up: the first gathers are one chunk, then twice the last,
        // up to the gather size, so the first read starts after one chunk's
        // allocation rather than a whole gather's.
        let len = step.min(capacity - off);
        step = (step * 2).min(gather);
        // Allocate the gather's pages in the file: one call, no page fault
        // (several times faster than faulting them in through the mapping
        // on a VM); the reads map them as they pin them.
        let r = wd_sys::pages::fallocate(fd, off, len).or_else(|e| {
            // A filesystem without fallocate (none we create): fault them in.
            if e.errno() == libc::EOPNOTSUPP {
                map.populate_write(off as usize, len as usize)
            } else {
                Err(e)
            }
        });
        if let Err(e) = r {
            let err = match e.errno() {
                libc::ENOMEM | libc::ENOSPC | libc::EFAULT if kind != PageKind::Normal => {
                    HeapError::NoHugePages {
                        pages: kind.memfd(),
                        need: capacity.div_ceil(kind.page_bytes()),
                        available: crate::system::huge_pool(kind.memfd())
                            .map_or(0, |p| p.available),
                    }
                }
                libc::ENOMEM | libc::ENOSPC | libc::EFAULT => HeapError::NoMemory {
                    want: capacity,
                    available: crate::system::mem_available().unwrap_or(0),
                },
                _ => HeapError::Sys(e),
            };
            g.fail(err);
            return;
        }
        off += len;
        let ns = t0.elapsed().as_nanos() as u64;
        if g.first_ns.load(Ordering::Relaxed) == 0 {
            g.first_ns.store(ns.max(1), Ordering::Relaxed);
        }
        g.done_ns.store(ns.max(1), Ordering::Relaxed);
        g.publish(off);
    }
}
