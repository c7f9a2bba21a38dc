//! Long requests on an asynchronous queue. The engine bounds the work it
//! does for one queue per pass only for synchronous devices
//! (`DeviceQueue::process_part`); a cipher queue with the multi-buffer
//! engine is asynchronous, so a request longer than [`LONG`] is held here
//! instead and run one piece per `poll` (each piece the request's own
//! chained continuation), while the engine serves other queues between
//! pieces. (A CBC encryption the queue gathers joins a burst instead,
//! whose rounds bound it the same way: `mb.rs`.)
#![allow(unsafe_code)]

use wd_device::{cancelled, status, Access, DeviceSlice, Dma, Fault, FaultReason, HeldSlice};
use wd_ring::Desc;

use crate::device::{complete, SecQueue, Work};
use crate::msg::{self, Mode, Request, F_FINAL};

/// Requests longer than this run in pieces.
pub(crate) const LONG: u64 = 1 << 20;
/// Bytes per piece.
pub(crate) const PIECE: u64 = 256 << 10;

/// A long request under way.
pub(crate) struct Long {
    token: u64,
    desc: Desc,
    session: u64,
    /// Bytes finished.
    done: u64,
    src: HeldSlice,
    dst: HeldSlice,
}

/// Device memory of one held request: its source readable, its
/// destination writable, nothing else.
struct HeldDma<'a> {
    src: (u64, DeviceSlice<'a>),
    dst: (u64, DeviceSlice<'a>),
}

impl<'a> HeldDma<'a> {
    fn find(&self, iova: u64, len: u64, access: Access) -> Result<DeviceSlice<'a>, Fault> {
        let (base, s) = if access == Access::Write {
            self.dst
        } else {
            self.src
        };
        match iova.checked_sub(base) {
            Some(off)
                if off
                    .checked_add(len)
                    .is_some_and(|end| end <= s.len() as u64) =>
            {
                Ok(s.subslice(off as usize, len as usize))
            }
            _ => Err(Fault {
                iova,
                pasid: 0,
                access,
                reason: FaultReason::Unmapped,
            }),
        }
    }
}

impl<'a> Dma<'a> for HeldDma<'a> {
    fn copy(&mut self, dst: u64, _src: u64, _len: u64) -> Result<(), Fault> {
        Err(Fault {
            iova: dst,
            pasid: 0,
            access: Access::Write,
            reason: FaultReason::Unmapped,
        })
    }
    fn read(&mut self, src: u64, buf: &mut [u8]) -> Result<(), Fault> {
        self.find(src, buf.len() as u64, Access::Read)?
            .read_into(0, buf);
        Ok(())
    }
    fn write(&mut self, dst: u64, data: &[u8]) -> Result<(), Fault> {
        self.find(dst, data.len() as u64, Access::Write)?
            .write_from(0, data);
        Ok(())
    }
    fn slice(&mut self, iova: u64, len: u64, access: Access) -> Option<DeviceSlice<'a>> {
        self.find(iova, len, access).ok()
    }
    fn probe(&mut self, iova: u64, len: u64, access: Access) -> Result<(), Fault> {
        self.find(iova, len, access).map(|_| ())
    }
}

/// The session a request works on, if any.
pub(crate) fn session_of(desc: &Desc) -> Option<u64> {
    match msg::decode(desc) {
        Ok(Request::Cipher(c)) => Some(c.session),
        Ok(Request::Digest(d)) if d.alg.is_none() => Some(d.session),
        Ok(Request::SessionFree(f)) => Some(f.session),
        // (A copy waits for the long request of the session it copies.)
        Ok(Request::SessionClone(c)) => Some(c.session),
        _ => None,
    }
}

impl SecQueue {
    /// Hold `desc` to run in pieces when it is a long ECB, CBC or CTR
    /// request whose memory can be held; `false` leaves it to the caller.
    pub(crate) fn hold_long(&mut self, token: u64, desc: &Desc, dma: &mut dyn Dma<'_>) -> bool {
        let Ok(Request::Cipher(op)) = msg::decode(desc) else {
            return false;
        };
        if op.len <= LONG || op.aad_len != 0 || op.tag_len != 0 || op.flags & F_FINAL != 0 {
            return false;
        }
        let Ok(s) = self.sessions.get(op.session) else {
            return false;
        };
        let Work::Cipher { mode, .. } = &s.work else {
            return false;
        };
        if !matches!(mode, Mode::Ecb | Mode::Cbc | Mode::Ctr) || op.len % s.alg.granule() != 0 {
            return false;
        }
        let Some(src) = dma.hold(op.src, op.len, Access::Read) else {
            return false;
        };
        let Some(dst) = dma.hold(op.dst, op.len, Access::Write) else {
            return false;
        };
        self.long.push(Long {
            token,
            desc: *desc,
            session: op.session,
            done: 0,
            src,
            dst,
        });
        true
    }

    /// Whether `desc` must wait for a long request of its session
    /// (requests of one session run in order).
    pub(crate) fn behind_long(&self, desc: &Desc) -> bool {
        session_of(desc).is_some_and(|s| self.long.iter().any(|l| l.session == s))
    }

    /// Run one piece of the oldest long request.
    pub(crate) fn poll_long(&mut self) {
        if !self.long.is_empty() {
            self.long_piece(0);
        }
    }

    /// One piece of long request `i`; true when it finished (and was filed
    /// for `poll`).
    fn long_piece(&mut self, i: usize) -> bool {
        let mut l = self.long.remove(i);
        let Ok(req) = msg::decode(&l.desc) else {
            complete(&mut l.desc, Err(status::EINVAL));
            self.finished.push((l.token, l.desc));
            return true;
        };
        let Request::Cipher(op) = req else {
            complete(&mut l.desc, Err(status::EINVAL));
            self.finished.push((l.token, l.desc));
            return true;
        };
        // SAFETY: the request is held (not reported yet), so the engine
        // keeps its memory mapped; the slices live only for this piece.
        let (src, dst) = unsafe { (l.src.slice(), l.dst.slice()) };
        let mut dma = HeldDma {
            src: (op.src, src),
            dst: (op.dst, dst),
        };
        let outcome = self.piece(req, &mut dma, l.done, PIECE);
        match outcome {
            Some((Ok(_), false)) => {
                l.done += PIECE;
                self.long.insert(i, l);
                false
            }
            Some((r, _)) => {
                if r.is_err() && l.done > 0 {
                    self.lose_message(&l.desc);
                }
                complete(&mut l.desc, r);
                self.finished.push((l.token, l.desc));
                true
            }
            None => {
                complete(&mut l.desc, Err(status::EINVAL));
                self.finished.push((l.token, l.desc));
                true
            }
        }
    }

    /// Teardown: hand back the long requests, unfinished.
    pub(crate) fn stop_long(&mut self, stopped: &mut Vec<(u64, Desc)>) {
        stopped.extend(self.long.drain(..).map(|l| (l.token, cancelled(l.desc))));
    }
}
