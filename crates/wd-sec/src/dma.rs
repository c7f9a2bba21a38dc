//! The device's data movement for libcrypto: in place in shared memory
//! when the queue's domain maps a range contiguously, else through a host
//! bounce buffer.

use wd_device::{status, Access, Dma};
use wd_evp::{CipherCtx, DigestCtx};

/// Bytes moved per bounce step when memory is not reachable in place.
pub(crate) const BOUNCE: usize = 256 << 10;

/// Why a transfer failed, and whether the context had taken data by then:
/// a fault is checked for first where it can be (`reach`), but memory
/// reached only as it is used (a SHARE_ALL queue's) can fault half way,
/// and then the session's message is lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failed {
    /// Negative errno.
    pub status: i32,
    /// The context took part of the data.
    pub taken: bool,
}

impl Failed {
    fn before(status: i32) -> Failed {
        Failed {
            status,
            taken: false,
        }
    }

    fn after(status: i32) -> Failed {
        Failed {
            status,
            taken: true,
        }
    }
}

/// Fault now, if at all, on memory a request reaches after it has changed
/// session state it cannot take back (a chain, a running hash): a request
/// that faults in a domain with the stall policy runs again from the
/// start once the fault is resolved (`Dma::probe`). Memory reached in
/// place needs no check: its slice was translated whole before any work.
pub(crate) fn reach(
    dma: &mut dyn Dma<'_>,
    iova: u64,
    len: u64,
    access: Access,
) -> std::result::Result<(), i32> {
    if len == 0 {
        return Ok(());
    }
    dma.probe(iova, len, access).map_err(|_| status::EFAULT)
}

/// Encrypt or decrypt in place in shared memory when both ranges are
/// mapped contiguously, else through a host bounce buffer: in pieces of
/// [`BOUNCE`], or `whole` in one (XTS, whose every update is a data unit
/// of its own that starts again from the tweak).
pub fn cipher_dma(
    ctx: &mut CipherCtx,
    dst: u64,
    src: u64,
    len: usize,
    dma: &mut dyn Dma<'_>,
    bounce: &mut Vec<u8>,
    whole: bool,
) -> std::result::Result<(), Failed> {
    if len == 0 {
        return Ok(());
    }
    let s = dma.slice(src, len as u64, Access::Read);
    let d = s.and_then(|_| dma.slice(dst, len as u64, Access::Write));
    if let (Some(s), Some(d)) = (s, d) {
        ctx.update_device(&d, &s)
            .map_err(|_| Failed::after(status::EIO))?;
        return Ok(());
    }
    // Through host buffers, piece by piece: a fault at a later piece
    // would come after the context took the earlier ones.
    reach(dma, src, len as u64, Access::Read).map_err(Failed::before)?;
    reach(dma, dst, len as u64, Access::Write).map_err(Failed::before)?;
    let piece = if whole { len } else { BOUNCE };
    let mut done = 0usize;
    let r = (|| {
        while done < len {
            let n = (len - done).min(piece);
            bounce.resize(n, 0);
            dma.read(src + done as u64, bounce).map_err(|_| Failed {
                status: status::EFAULT,
                taken: done > 0,
            })?;
            ctx.update_in_place(bounce)
                .map_err(|_| Failed::after(status::EIO))?;
            dma.write(dst + done as u64, bounce)
                .map_err(|_| Failed::after(status::EFAULT))?;
            done += n;
        }
        Ok(())
    })();
    // A whole request's buffer is not kept.
    if bounce.capacity() > BOUNCE {
        *bounce = Vec::new();
    }
    r
}

/// Hash in place when the range is mapped contiguously, else by bounce.
pub fn digest_dma(
    ctx: &mut DigestCtx,
    src: u64,
    len: usize,
    dma: &mut dyn Dma<'_>,
    bounce: &mut Vec<u8>,
) -> std::result::Result<(), Failed> {
    if len == 0 {
        return Ok(());
    }
    if let Some(s) = dma.slice(src, len as u64, Access::Read) {
        return ctx
            .update_device(&s)
            .map_err(|_| Failed::after(status::EIO));
    }
    reach(dma, src, len as u64, Access::Read).map_err(Failed::before)?;
    let mut done = 0usize;
    while done < len {
        let n = (len - done).min(BOUNCE);
        bounce.resize(n, 0);
        dma.read(src + done as u64, bounce).map_err(|_| Failed {
            status: status::EFAULT,
            taken: done > 0,
        })?;
        ctx.update(bounce).map_err(|_| Failed::after(status::EIO))?;
        done += n;
    }
    Ok(())
}
