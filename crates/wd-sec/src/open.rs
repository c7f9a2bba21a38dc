//! A whole GCM decryption (one request with the IV, all the data and the
//! tag) longer than a piece, cut in pieces as the engine cuts other long
//! requests: 64 MiB decrypted and checked in one pass held every other
//! queue of the engine for tens of milliseconds. No plaintext reaches the
//! client before the tag matches, as when it runs whole: the pieces
//! decrypt into host memory, the last of them checks the tag, and only
//! then do later pieces write the plaintext out. Progress counts the
//! input decrypted, then the output written (up to twice the length).
//!
//! The plaintext held across passes (up to `MAX_DATA`, 64 MiB, a queue)
//! is counted against a budget the device's queues share
//! ([`OpenBudget`]): else clients opening many queues make the host
//! allocate without bound. A request past it is refused with -ENOSPC
//! before it changes anything, as a session past a full table is.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use wd_device::{ranges_overlap, status, Dma, Progress};
use wd_ring::Desc;

use crate::device::{complete, SecQueue, Secret, Work};
use crate::msg::{self, CipherOp, Mode, Request, F_ENCRYPT, F_FINAL, F_IV};

/// Plaintext the cut GCM decryptions of one device's queues may hold
/// together by default: four whole messages of the longest kind.
pub const OPEN_MEMORY: u64 = 256 << 20;

/// Host memory held by a device's cut GCM decryptions, and its bound.
#[derive(Debug)]
pub(crate) struct OpenBudget {
    limit: u64,
    held: AtomicU64,
}

impl OpenBudget {
    pub(crate) fn new(limit: u64) -> Arc<OpenBudget> {
        Arc::new(OpenBudget {
            limit,
            held: AtomicU64::new(0),
        })
    }

    /// Bytes held now (the `open_bytes` attribute).
    pub(crate) fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// Take `bytes`, if they fit: given back when the charge is dropped,
    /// so no way a request ends (or its queue goes) can forget to.
    fn charge(self: &Arc<Self>, bytes: u64) -> Option<Charge> {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                h.checked_add(bytes).filter(|&t| t <= self.limit)
            })
            .ok()?;
        Some(Charge {
            budget: self.clone(),
            bytes,
        })
    }
}

/// Bytes taken from an [`OpenBudget`].
struct Charge {
    budget: Arc<OpenBudget>,
    bytes: u64,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// A cut whole GCM decryption under way.
pub(crate) struct Opening {
    /// The request, to tell its continuation from any other.
    desc: Desc,
    /// The plaintext decrypted so far, held until the tag matches.
    plain: Secret,
    /// Its memory, counted (last: given back once it is freed).
    _charge: Charge,
}

impl SecQueue {
    /// Whether `op` is a whole GCM decryption longer than `piece`, with a
    /// tag the whole request takes: one of fewer than 4 bytes (which
    /// libcrypto would check) is left to `cipher` to refuse, as when it is
    /// short, since the start of the cut never sees its tag length.
    fn opens_whole(&mut self, op: &CipherOp, piece: u64) -> bool {
        let whole = op.flags & (F_IV | F_FINAL | F_ENCRYPT) == F_IV | F_FINAL;
        whole
            && op.len > piece
            && (4..=16).contains(&op.tag_len)
            && self.sessions.get(op.session).is_ok_and(|s| {
                matches!(
                    s.work,
                    Work::Cipher {
                        mode: Mode::Gcm,
                        ..
                    }
                )
            })
    }

    /// Run the next piece of `desc` (bytes `done..` of its progress) when
    /// it is a whole GCM decryption to cut; `None` when it is not.
    pub(crate) fn open_part(
        &mut self,
        desc: &mut Desc,
        req: &Request,
        dma: &mut dyn Dma<'_>,
        done: u64,
        piece: u64,
    ) -> Option<Progress> {
        let Request::Cipher(op) = *req else {
            return None;
        };
        let continues = self.opening.as_ref().is_some_and(|o| o.desc == *desc);
        if !(done == 0 && self.opens_whole(&op, piece) || done > 0 && continues) {
            return None;
        }
        match self.open_step(desc, op, dma, done, piece) {
            Ok(Some(next)) => Some(Progress::More(next)),
            r => {
                // (The plaintext is wiped as it goes.)
                self.opening = None;
                if r.is_err() && done > 0 {
                    self.lose_message(desc);
                }
                complete(desc, r.map(|_| op.len));
                Some(Progress::Done)
            }
        }
    }

    /// Whether the cut GCM decryption `desc` may start over after its
    /// next piece faults: its pieces write nothing until the tag matched,
    /// and from then on only its destination, so a restart reads the same
    /// input unless the output may have overwritten it. The session starts
    /// again from the IV; the host plaintext went with the failed piece.
    pub(crate) fn open_restartable(&self, desc: &Desc) -> bool {
        let Some(o) = self.opening.as_ref().filter(|o| o.desc == *desc) else {
            return false;
        };
        let Ok(Request::Cipher(op)) = msg::decode(desc) else {
            return false;
        };
        let writes = o.plain.0.len() as u64 >= op.len;
        let out = (op.dst, op.len);
        !writes
            || !(ranges_overlap(out, (op.src, op.len))
                || ranges_overlap(out, (op.aad, op.aad_len as u64))
                || ranges_overlap(out, (op.tag, op.tag_len as u64)))
    }

    /// One piece: the progress after it, or `None` when the request is
    /// finished.
    fn open_step(
        &mut self,
        desc: &Desc,
        op: CipherOp,
        dma: &mut dyn Dma<'_>,
        done: u64,
        piece: u64,
    ) -> Result<Option<u64>, i32> {
        if done == 0 {
            // All of its memory faults now, if at all, before the session
            // moves on (a stall's retry then starts the message again).
            self.probe(&Request::Cipher(op), dma)?;
            // A request starting now (a restart after a stall, too) ends
            // any other's plaintext before it holds its own (none can be
            // under way: the engine continues a cut request before it
            // starts another), and counts its own before the session
            // moves, so that one refused changed nothing.
            self.opening = None;
            let charge = self.open_budget.charge(op.len).ok_or(status::ENOSPC)?;
            // The message starts as a request of no data would start it:
            // key, IV, additional data.
            let start = CipherOp {
                flags: op.flags & !F_FINAL,
                len: 0,
                tag: 0,
                tag_len: 0,
                ..op
            };
            self.cipher(start, dma)?;
            self.opening = Some(Opening {
                desc: *desc,
                plain: Secret(Vec::with_capacity(op.len as usize)),
                _charge: charge,
            });
        }
        let o = self
            .opening
            .as_mut()
            .filter(|o| o.desc == *desc)
            .ok_or(status::EIO)?;
        let plain = &mut o.plain.0;
        if done < op.len {
            let n = piece.min(op.len - done) as usize;
            let at = plain.len();
            if at as u64 != done {
                return Err(status::EIO);
            }
            plain.resize(at + n, 0);
            dma.read(op.src + done, &mut plain[at..])
                .map_err(|_| status::EFAULT)?;
            let Work::Cipher { ctx, started, .. } = &mut self.sessions.get(op.session)?.work else {
                return Err(status::EINVAL);
            };
            ctx.update_in_place(&mut plain[at..])
                .map_err(|_| status::EIO)?;
            if done + (n as u64) < op.len {
                return Ok(Some(done + n as u64));
            }
            // The message ends here whatever the tag says.
            *started = false;
            let mut tag = [0u8; 16];
            let tag = &mut tag[..op.tag_len as usize];
            dma.read(op.tag, tag).map_err(|_| status::EFAULT)?;
            ctx.set_tag(tag).map_err(|_| status::EINVAL)?;
            ctx.finish().map_err(|_| status::EBADMSG)?;
            return Ok(Some(op.len));
        }
        let at = done - op.len;
        let n = piece.min(op.len - at);
        let out = &plain[at as usize..(at + n) as usize];
        dma.write(op.dst + at, out).map_err(|_| status::EFAULT)?;
        Ok((at + n < op.len).then_some(done + n))
    }
}
