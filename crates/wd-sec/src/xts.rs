//! An XTS request longer than a piece, cut in pieces as the engine cuts
//! other long requests (16 MiB in one pass held the engine's other queues
//! for milliseconds). libcrypto takes a data unit in one call, deriving
//! its tweak from the IV at the call's start (T = E_K2(IV), then T·α for
//! each block), and XTS chains nothing else: so each piece is a call of
//! its own, given the IV that makes the tweak where the piece begins,
//! D_K2(E_K2(IV)·α^j) for block j (IEEE 1619's α, the polynomial x in
//! GF(2^128), the tweak read little-endian). Pieces are whole blocks but
//! the last, which keeps the last whole block with the stolen tail.

use wd_device::{ranges_overlap, status, Dma, Progress};
use wd_evp::CipherCtx;
use wd_ring::Desc;

use crate::device::{complete, SecQueue, Secret, Work};
use crate::msg::{self, Alg, CipherOp, Mode, Request, F_IV};

/// Smallest piece of an XTS request: each costs two single-block AES
/// calls and a power of α besides the call itself (about 150 µs a MiB
/// here).
const XTS_PIECE: u64 = 1 << 20;

/// The longest data unit (IEEE 1619-2018, and libcrypto): 2^20 blocks.
pub(crate) const XTS_UNIT: u64 = 16 << 20;

impl SecQueue {
    /// Run the next piece of `desc` (bytes `done..` of it) when it is an
    /// XTS request longer than a piece; `None` when it is not (it then
    /// runs whole, or is refused, as before).
    pub(crate) fn xts_part(
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
        let piece = piece.max(XTS_PIECE);
        // (A data unit over 2^20 blocks, or without its IV, is refused
        // whole.) Whether to cut is decided at the first piece only: a
        // later pass may have a larger budget, and the rest of a cut
        // request taken for a short one would run without its IV.
        if (done == 0 && op.len <= piece) || op.len > XTS_UNIT || op.flags & F_IV == 0 {
            return None;
        }
        let (alg, k2) = match self.sessions.get(op.session) {
            Ok(s)
                if matches!(
                    s.work,
                    Work::Cipher {
                        mode: Mode::Xts,
                        ..
                    }
                ) =>
            {
                (s.alg, Secret(s.key.0[s.key.0.len() / 2..].to_vec()))
            }
            _ => return None,
        };
        let r = self.xts_step(op, alg, &k2.0, dma, done, piece);
        match r {
            Ok(Some(next)) => Some(Progress::More(next)),
            r => {
                complete(desc, r.map(|_| op.len));
                Some(Progress::Done)
            }
        }
    }

    /// Whether the cut XTS request `desc` may start over after a later
    /// piece faults: each piece is a call of its own from a derived IV and
    /// moves no session state, so a restart computes the same unless the
    /// output may have overwritten the input (in place, or overlapping).
    /// Only what `xts_part` cuts after its first piece is answered for.
    pub(crate) fn xts_restartable(&self, desc: &Desc) -> bool {
        let Ok(Request::Cipher(op)) = msg::decode(desc) else {
            return false;
        };
        let xts = self.sessions.peek(op.session).is_some_and(|s| {
            matches!(
                s.work,
                Work::Cipher {
                    mode: Mode::Xts,
                    ..
                }
            )
        });
        xts && op.flags & F_IV != 0
            && op.len <= XTS_UNIT
            && op.aad_len == 0
            && op.tag_len == 0
            && !ranges_overlap((op.src, op.len), (op.dst, op.len))
    }

    /// One piece: the progress after it, or `None` when the request is
    /// finished.
    fn xts_step(
        &mut self,
        op: CipherOp,
        alg: Alg,
        k2: &[u8],
        dma: &mut dyn Dma<'_>,
        done: u64,
        piece: u64,
    ) -> Result<Option<u64>, i32> {
        if done % 16 != 0 || done >= op.len {
            return Err(status::EIO);
        }
        if done == 0 {
            // All of its memory faults now, if at all.
            self.probe(&Request::Cipher(op), dma)?;
        }
        let left = op.len - done;
        // The last piece keeps the last whole block with the tail.
        let n = if left <= piece + 16 { left } else { piece };
        let iv = match done {
            0 => op.iv,
            _ => iv_at(alg, k2, &op.iv, done / 16).map_err(|_| status::EIO)?,
        };
        let p = CipherOp {
            src: op.src + done,
            dst: op.dst + done,
            len: n,
            iv,
            ..op
        };
        self.cipher(p, dma)?;
        Ok((n < left).then_some(done + n))
    }
}

/// The IV that makes libcrypto's XTS tweak for block `j` of the data unit
/// whose IV is `iv`: D_K2(E_K2(iv)·α^j).
fn iv_at(alg: Alg, k2: &[u8], iv: &[u8; 16], j: u64) -> Result<[u8; 16], wd_evp::EvpError> {
    let Alg::Aes { key_bits, .. } = alg else {
        return Err(wd_evp::EvpError::Unavailable(alg.name()));
    };
    let mut ecb = CipherCtx::new(Alg::Aes {
        key_bits,
        mode: Mode::Ecb,
    })?;
    // The tweaks are E_K2 of the IV and its multiples: wiped after use,
    // as the key is.
    let mut tweak = Secret(iv.to_vec());
    ecb.init(Some(k2), None, true)?;
    ecb.update_in_place(&mut tweak.0)?;
    let t0 = u128::from_le_bytes(tweak.0[..16].try_into().expect("a block"));
    tweak.0.copy_from_slice(&gf_mul(t0, x_pow(j)).to_le_bytes());
    ecb.init(Some(k2), None, false)?;
    ecb.update_in_place(&mut tweak.0)?;
    Ok(tweak.0[..16].try_into().expect("a block"))
}

/// `t`·α: one block on (x^128 = x^7 + x^2 + x + 1).
fn mul_x(t: u128) -> u128 {
    (t << 1) ^ if t >> 127 != 0 { 0x87 } else { 0 }
}

/// `a`·`b` in GF(2^128), XTS's bit order.
fn gf_mul(mut a: u128, mut b: u128) -> u128 {
    let mut r = 0;
    while b != 0 {
        if b & 1 != 0 {
            r ^= a;
        }
        a = mul_x(a);
        b >>= 1;
    }
    r
}

/// α^`j`.
fn x_pow(mut j: u64) -> u128 {
    let (mut r, mut base) = (1u128, 2u128);
    while j > 0 {
        if j & 1 != 0 {
            r = gf_mul(r, base);
        }
        base = gf_mul(base, base);
        j >>= 1;
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn powers_of_alpha_are_repeated_steps() {
        let mut t = 1u128;
        for j in 0..2000u64 {
            assert_eq!(x_pow(j), t, "alpha^{j}");
            t = mul_x(t);
        }
        let t0 = 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210u128;
        let mut t = t0;
        for _ in 0..65536 {
            t = mul_x(t);
        }
        assert_eq!(gf_mul(t0, x_pow(65536)), t);
        assert_eq!(gf_mul(t0, 1), t0);
    }
}
