//! The multi-buffer path: AES-CBC encryptions gathered over a batch of
//! requests (at most one per session, since a message's next part needs
//! the IV its previous part leaves) and encrypted side by side by
//! intel-ipsec-mb. A gathered request's memory is held: the engine keeps
//! it mapped until the request is reported, which is what lets a burst
//! run after the request's own translation section has ended.
#![allow(unsafe_code)]

use wd_device::{status, Access, Dma, HeldSlice};
use wd_ipsecmb::{CbcJob, Engine, Schedule};
use wd_ring::Desc;
use wd_sys::devmem::DeviceSlice;

use crate::device::{complete, Key, SecQueue, Session, Work};
use crate::dma;
use crate::msg::{self, CipherOp, Mode, Request, F_ENCRYPT, F_FINAL, F_IV};

/// A CBC encryption waiting for the next multi-buffer burst: its memory
/// is held (the engine keeps it mapped) until it is reported.
pub(crate) struct Pending {
    token: u64,
    desc: Desc,
    session: u64,
    iv: [u8; 16],
    src: HeldSlice,
    dst: HeldSlice,
}

/// Bytes a multi-buffer request may have: a longer one would keep the
/// other requests of its burst (and the engine's other queues) waiting, so
/// it runs alone, now.
const MB_MAX: u64 = 1 << 20;

/// The IV a CBC encryption starts from: its own, or the one its message's
/// previous part left; `None` when the request is malformed.
fn cbc_iv(op: &CipherOp, mb_iv: Option<[u8; 16]>) -> Option<[u8; 16]> {
    if op.len % 16 != 0 || op.flags & F_FINAL != 0 || op.aad_len != 0 || op.tag_len != 0 {
        return None;
    }
    if op.flags & F_IV != 0 {
        return (op.iv_len == 16).then(|| op.iv[..16].try_into().expect("16 bytes"));
    }
    mb_iv
}

/// A session's round keys for the multi-buffer engine, made on first use.
fn schedule<'s>(e: &Engine, schedule: &'s mut Option<Schedule>, key: &Key) -> Result<&'s Schedule, i32> {
    if schedule.is_none() {
        *schedule = Some(e.schedule(&key.0).map_err(|_| status::EINVAL)?);
    }
    Ok(schedule.as_ref().expect("set above"))
}

/// Encrypt one CBC request now through the multi-buffer engine (a burst
/// of one): in place when both ranges are one mapping, else through the
/// bounce buffer.
pub(crate) fn cbc_now(
    e: &Engine,
    s: &mut Session,
    op: CipherOp,
    dma: &mut dyn Dma<'_>,
    bounce: &mut Vec<u8>,
) -> Result<u64, i32> {
    let Work::Cipher { started, mb_iv, .. } = &mut s.work else {
        return Err(status::EINVAL);
    };
    let mut iv = cbc_iv(&op, *mb_iv).ok_or(status::EINVAL)?;
    // The libcrypto context's message (if any) ends: a continuation
    // without an IV now continues this one.
    *started = false;
    *mb_iv = None;
    let keys = schedule(e, &mut s.schedule, &s.key)?;
    let len = op.len;
    let src = dma.slice(op.src, len, Access::Read);
    let dst = src.and_then(|_| dma.slice(op.dst, len, Access::Write));
    if let (Some(src), Some(dst)) = (src, dst) {
        let mut job = [CbcJob::new(keys, iv, src, dst).map_err(|_| status::EINVAL)?];
        e.cbc_encrypt(&mut job).map_err(|_| status::EIO)?;
        iv = job[0].iv;
    } else {
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(dma::BOUNCE as u64);
            bounce.resize(n as usize, 0);
            dma.read(op.src + done, bounce).map_err(|_| status::EFAULT)?;
            let b = DeviceSlice::from_mut(bounce);
            let mut job = [CbcJob::new(keys, iv, b, b).map_err(|_| status::EINVAL)?];
            e.cbc_encrypt(&mut job).map_err(|_| status::EIO)?;
            iv = job[0].iv;
            dma.write(op.dst + done, bounce).map_err(|_| status::EFAULT)?;
            done += n;
        }
    }
    if let Work::Cipher { mb_iv, .. } = &mut s.work {
        *mb_iv = Some(iv);
    }
    Ok(len)
}

impl SecQueue {
    /// Gather `desc` for the next burst when it is a CBC encryption the
    /// multi-buffer engine can run with others: its memory held, its IV
    /// known. `Err` hands the request back, to be run now.
    pub(crate) fn gather(&mut self, token: u64, desc: &Desc, dma: &mut dyn Dma<'_>) -> Result<(), ()> {
        let Ok(Request::Cipher(op)) = msg::decode(desc) else {
            return Err(());
        };
        if op.flags & F_ENCRYPT == 0 || op.len == 0 || op.len > MB_MAX {
            return Err(());
        }
        if self.pending.iter().any(|p| p.session == op.session) {
            // The message's previous part must finish first.
            self.burst();
        }
        let Ok(s) = self.sessions.get(op.session) else {
            return Err(());
        };
        let Work::Cipher {
            mode: Mode::Cbc,
            mb_iv,
            ..
        } = &s.work
        else {
            return Err(());
        };
        let iv = cbc_iv(&op, *mb_iv).ok_or(())?;
        let src = dma.hold(op.src, op.len, Access::Read).ok_or(())?;
        let dst = dma.hold(op.dst, op.len, Access::Write).ok_or(())?;
        if let Work::Cipher { started, mb_iv, .. } = &mut s.work {
            *started = false;
            // Known again when the burst has run.
            *mb_iv = None;
        }
        self.pending.push(Pending {
            token,
            desc: *desc,
            session: op.session,
            iv,
            src,
            dst,
        });
        Ok(())
    }

    /// Teardown: hand back what was gathered, untouched.
    pub(crate) fn stop_gathered(&mut self, stopped: &mut Vec<(u64, Desc)>) {
        stopped.extend(self.pending.drain(..).map(|p| (p.token, p.desc)));
    }

    /// Encrypt everything gathered, side by side, and file the outcomes
    /// for the next `poll`.
    pub(crate) fn burst(&mut self) {
        let Some(e) = self.mb else {
            return;
        };
        let mut pending = std::mem::take(&mut self.pending);
        // Round keys first (the jobs below borrow them).
        let mut ok: Vec<bool> = Vec::with_capacity(pending.len());
        for p in &pending {
            let made = match self.sessions.get(p.session) {
                Ok(s) => schedule(e, &mut s.schedule, &s.key).is_ok(),
                Err(_) => false,
            };
            ok.push(made);
        }
        let mut outcome: Vec<Result<[u8; 16], i32>> = vec![Err(status::EINVAL); pending.len()];
        {
            let mut jobs = Vec::with_capacity(pending.len());
            let mut which = Vec::with_capacity(pending.len());
            for (i, p) in pending.iter().enumerate() {
                if !ok[i] {
                    continue;
                }
                let Some(keys) = self.sessions.peek(p.session).and_then(|s| s.schedule.as_ref()) else {
                    continue;
                };
                // SAFETY: the request is held (not reported yet), so the
                // engine keeps its memory mapped; the slices live only
                // until the burst below returns.
                let (src, dst) = unsafe { (p.src.slice(), p.dst.slice()) };
                if let Ok(j) = CbcJob::new(keys, p.iv, src, dst) {
                    jobs.push(j);
                    which.push(i);
                }
            }
            match e.cbc_encrypt(&mut jobs) {
                Ok(()) => {
                    for (j, &i) in jobs.iter().zip(&which) {
                        outcome[i] = Ok(j.iv);
                    }
                }
                Err(_) => {
                    for &i in &which {
                        outcome[i] = Err(status::EIO);
                    }
                }
            }
        }
        for (p, r) in pending.drain(..).zip(outcome) {
            let mut d = p.desc;
            if let Ok(Session {
                work: Work::Cipher { mb_iv, .. },
                ..
            }) = self.sessions.get(p.session)
            {
                *mb_iv = r.ok();
            }
            complete(&mut d, r.map(|_| p.src.len() as u64));
            self.finished.push((p.token, d));
        }
        self.pending = pending;
    }
}

