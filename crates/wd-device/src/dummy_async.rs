//! A memcpy device that completes later, for exercising the engine's
//! asynchronous path. Its held copies run outside any translation
//! section, from memory the engine keeps pinned: the one use of `unsafe`
//! a device needs for that.
#![allow(unsafe_code)]

use crate::dummy::{CopyMsg, DummyQueue, DEVICE_API};
use crate::{
    cancelled, status, Access, AlgInfo, DeviceQueue, Dma, Driver, HeldSlice, Progress, Started,
};
use wd_ring::Desc;

/// A memcpy device that completes later: it holds each copy for
/// [`HOLD`], does it then from the memory it held, and finishes the
/// newest first. It exists to exercise the engine's asynchronous path
/// (held memory, completion out of order, teardown with requests in
/// flight) the way a storage or multi-buffer device will.
#[derive(Debug, Default)]
pub struct DummyAsyncDriver;

/// How long a held copy waits before it is done: long enough that a test
/// can act (unshare, release, kill) while requests are held.
pub const HOLD: std::time::Duration = std::time::Duration::from_millis(20);

/// Bytes copied per `poll`: the engine serves its other queues between
/// polls, so a long copy (or many due at once) goes on over several.
pub const POLL_BYTES: u64 = 1 << 20;

impl Driver for DummyAsyncDriver {
    fn name(&self) -> &'static str {
        "dummy-async"
    }

    fn algorithms(&self) -> Vec<AlgInfo> {
        vec![AlgInfo {
            name: "memcpy-async",
            flags: 0,
            device_api: DEVICE_API,
        }]
    }

    fn open_queue(&self, _alg: u32) -> Box<dyn DeviceQueue> {
        Box::new(AsyncCopyQueue { held: Vec::new() })
    }
}

struct HeldCopy {
    token: u64,
    desc: Desc,
    src: HeldSlice,
    dst: HeldSlice,
    until: std::time::Instant,
    /// Bytes copied so far.
    done: u64,
    /// The copy's source and destination addresses (which way its pieces
    /// run: `copy_piece_at`).
    iova: (u64, u64),
}

struct AsyncCopyQueue {
    held: Vec<HeldCopy>,
}

impl AsyncCopyQueue {
    /// Copy what `budget` allows of held copy `i`; a finished one is
    /// reported and leaves `held`.
    fn copy_some(&mut self, i: usize, budget: &mut u64, done: &mut Vec<(u64, Desc)>) {
        let h = &mut self.held[i];
        let len = h.src.len() as u64;
        let n = (len - h.done).min(*budget);
        let at = crate::copy_piece_at(h.iova.0, h.iova.1, len, h.done, n);
        let (at, count) = (at as usize, n as usize);
        // SAFETY: the request is still held (not reported yet), so the
        // engine keeps both ranges mapped.
        let (src, dst) = unsafe { (h.src.slice(), h.dst.slice()) };
        src.subslice(at, count).copy_to(&dst.subslice(at, count));
        h.done += n;
        *budget -= n;
        if h.done == len {
            let mut h = self.held.remove(i);
            h.desc.status = status::OK;
            h.desc.result = len;
            done.push((h.token, h.desc));
        }
    }
}

impl DeviceQueue for AsyncCopyQueue {
    fn process(&mut self, desc: &mut Desc, dma: &mut dyn Dma<'_>) {
        DummyQueue.process(desc, dma);
    }

    fn process_part(
        &mut self,
        desc: &mut Desc,
        dma: &mut dyn Dma<'_>,
        done: u64,
        budget: u64,
    ) -> Progress {
        DummyQueue.process_part(desc, dma, done, budget)
    }

    fn asynchronous(&self) -> bool {
        true
    }

    fn start(&mut self, token: u64, desc: &mut Desc, dma: &mut dyn Dma<'_>) -> Started {
        let m = match CopyMsg::decode(desc) {
            Ok(Some(m)) if m.len > 0 => m,
            _ => {
                self.process(desc, dma);
                return Started::Done;
            }
        };
        let src = dma.hold(m.src, m.len, Access::Read);
        let dst = src
            .as_ref()
            .and_then(|_| dma.hold(m.dst, m.len, Access::Write));
        match (src, dst) {
            (Some(src), Some(dst)) => {
                self.held.push(HeldCopy {
                    token,
                    desc: *desc,
                    src,
                    dst,
                    until: std::time::Instant::now() + HOLD,
                    done: 0,
                    iova: (m.src, m.dst),
                });
                Started::Held
            }
            // Not holdable (split across mappings, a fault, SHARE_ALL
            // memory): the engine copies it, in pieces within its budget.
            _ => Started::Cut,
        }
    }

    fn poll(&mut self, done: &mut Vec<(u64, Desc)>) {
        if self.held.is_empty() {
            return;
        }
        let now = std::time::Instant::now();
        let mut budget = POLL_BYTES;
        // A copy the last poll left half done goes on first, then the
        // oldest due one starts (newer ones must not starve either), then
        // the due ones newest first: completions leave in another order
        // than requests came.
        if let Some(i) = self.held.iter().position(|h| h.done > 0) {
            self.copy_some(i, &mut budget, done);
        }
        if budget > 0 {
            if let Some(i) = self.held.iter().position(|h| h.until <= now) {
                self.copy_some(i, &mut budget, done);
            }
        }
        let mut i = self.held.len();
        while i > 0 && budget > 0 {
            i -= 1;
            if self.held[i].until <= now {
                self.copy_some(i, &mut budget, done);
            }
        }
    }

    fn in_flight(&self) -> usize {
        self.held.len()
    }

    fn abort(&mut self, stopped: &mut Vec<(u64, Desc)>) {
        stopped.extend(self.held.drain(..).map(|h| (h.token, cancelled(h.desc))));
    }
}
