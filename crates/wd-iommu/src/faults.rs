//! The bounded per-domain fault log.

use std::collections::VecDeque;

use crate::Fault;

/// A fault and its sequence number on the domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultRecord {
    /// Faults recorded before this one.
    pub seq: u64,
    /// The fault.
    pub fault: Fault,
    /// Whether the request that hit it was stalled (resume it with `seq`).
    pub stalled: bool,
}

/// Bounded log: a flood of faults cannot grow memory; overflow drops the
/// oldest records and counts them (the stall table has its own bound).
#[derive(Debug)]
pub struct FaultQueue {
    q: VecDeque<FaultRecord>,
    cap: usize,
    total: u64,
    lost: u64,
}

impl FaultQueue {
    /// Records kept by default.
    pub const DEFAULT_CAPACITY: usize = 256;

    /// A log keeping at most `capacity` (at least 1) records.
    pub fn new(capacity: usize) -> FaultQueue {
        let cap = capacity.max(1);
        FaultQueue {
            q: VecDeque::with_capacity(cap.min(1024)),
            cap,
            total: 0,
            lost: 0,
        }
    }

    /// Record a fault; returns its sequence number.
    pub fn push(&mut self, fault: Fault, stalled: bool) -> u64 {
        if self.q.len() == self.cap {
            self.q.pop_front();
            self.lost += 1;
        }
        let seq = self.total;
        self.q.push_back(FaultRecord {
            seq,
            fault,
            stalled,
        });
        self.total += 1;
        seq
    }

    /// Up to `max` newest records, oldest first, without removing them.
    pub fn peek(&self, max: usize) -> Vec<FaultRecord> {
        let skip = self.q.len().saturating_sub(max);
        self.q.iter().skip(skip).copied().collect()
    }

    /// Remove and return up to `max` records, oldest first.
    pub fn drain(&mut self, max: usize) -> Vec<FaultRecord> {
        let n = max.min(self.q.len());
        self.q.drain(..n).collect()
    }

    /// Records held.
    pub fn len(&self) -> usize {
        self.q.len()
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }

    /// Faults ever recorded.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Records dropped by overflow.
    pub fn lost(&self) -> u64 {
        self.lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Access, FaultReason};

    fn f(iova: u64) -> Fault {
        Fault {
            iova,
            pasid: 1,
            access: Access::Read,
            reason: FaultReason::Unmapped,
        }
    }

    #[test]
    fn overflow_drops_oldest_and_counts() {
        let mut q = FaultQueue::new(2);
        for i in 0..5 {
            assert_eq!(q.push(f(i), false), i);
        }
        assert_eq!((q.len(), q.total(), q.lost()), (2, 5, 3));
        assert_eq!(q.peek(1)[0].seq, 4);
        assert_eq!(q.peek(9).len(), 2);
        let d = q.drain(10);
        assert_eq!(
            d.iter().map(|r| (r.seq, r.fault.iova)).collect::<Vec<_>>(),
            [(3, 3), (4, 4)]
        );
        assert!(q.is_empty());
        assert_eq!(FaultQueue::new(0).cap, 1);
    }
}
