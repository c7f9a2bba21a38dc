//! The device's data movement for libcrypto: in place in shared memory
//! when the queue's domain maps a range contiguously, else through a host
//! bounce buffer.

use wd_device::{status, Access, Dma};
use wd_evp::{CipherCtx, DigestCtx};

/// Bytes moved per bounce step when memory is not reachable in place.
pub(crate) const BOUNCE: usize = 256 << 10;

/// Encrypt or decrypt in place in shared memory when both ranges are
/// mapped contiguously, else through a host bounce buffer.
pub fn cipher_dma(
    ctx: &mut CipherCtx,
    dst: u64,
    src: u64,
    len: usize,
    dma: &mut dyn Dma<'_>,
    bounce: &mut Vec<u8>,
) -> std::result::Result<(), i32> {
    if len == 0 {
        return Ok(());
    }
    let s = dma.slice(src, len as u64, Access::Read);
    let d = s.and_then(|_| dma.slice(dst, len as u64, Access::Write));
    if let (Some(s), Some(d)) = (s, d) {
        ctx.update_device(&d, &s).map_err(|_| status::EIO)?;
        return Ok(());
    }
    let mut done = 0usize;
    while done < len {
        let n = (len - done).min(BOUNCE);
        bounce.resize(n, 0);
        dma.read(src + done as u64, bounce)
            .map_err(|_| status::EFAULT)?;
        ctx.update_in_place(bounce).map_err(|_| status::EIO)?;
        dma.write(dst + done as u64, bounce)
            .map_err(|_| status::EFAULT)?;
        done += n;
    }
    Ok(())
}

/// Hash in place when the range is mapped contiguously, else by bounce.
pub fn digest_dma(
    ctx: &mut DigestCtx,
    src: u64,
    len: usize,
    dma: &mut dyn Dma<'_>,
    bounce: &mut Vec<u8>,
) -> std::result::Result<(), i32> {
    if len == 0 {
        return Ok(());
    }
    if let Some(s) = dma.slice(src, len as u64, Access::Read) {
        return ctx.update_device(&s).map_err(|_| status::EIO);
    }
    let mut done = 0usize;
    while done < len {
        let n = (len - done).min(BOUNCE);
        bounce.resize(n, 0);
        dma.read(src + done as u64, bounce)
            .map_err(|_| status::EFAULT)?;
        ctx.update(bounce).map_err(|_| status::EIO)?;
        done += n;
    }
    Ok(())
}
