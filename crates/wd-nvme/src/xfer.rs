//! Moving a command's data between the driver's memory (named by PRPs,
//! translated through the controller's IOMMU domain) and the controller.

use wd_device::{Access, Dma};
use wd_nvme_msg::prp::{self, PrpError};
use wd_nvme_msg::{Sqe, Status, PAGE};

/// The status a PRP problem completes its command with.
pub(crate) fn prp_status<E>(e: &PrpError<E>) -> Status {
    match e {
        PrpError::Offset { .. } => Status::PRP_OFFSET_INVALID,
        PrpError::List { .. } | PrpError::Wraps { .. } => Status::DATA_TRANSFER_ERROR,
    }
}

/// Walk `sqe`'s PRPs for `len` bytes into `segs`.
pub(crate) fn segments(
    sqe: &Sqe,
    len: u64,
    dma: &mut dyn Dma<'_>,
    segs: &mut prp::PrpSegments,
) -> Result<(), Status> {
    if sqe.psdt != 0 {
        // SGLs are not advertised (Identify SGLS = 0).
        return Err(Status::INVALID_FIELD);
    }
    let mut raw = [0u8; PAGE as usize];
    prp::walk(
        sqe.prp1,
        sqe.prp2,
        len,
        PAGE,
        |at, out: &mut [u64]| {
            let bytes = &mut raw[..out.len() * 8];
            dma.read(at, bytes)?;
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(8)) {
                *o = u64::from_le_bytes(c.try_into().expect("8 bytes"));
            }
            Ok::<(), wd_device::Fault>(())
        },
        segs,
    )
    .map_err(|e| prp_status(&e))
}

/// Copy `data` to the memory `sqe` names (a controller-to-host transfer).
pub(crate) fn to_host(
    sqe: &Sqe,
    data: &[u8],
    dma: &mut dyn Dma<'_>,
    segs: &mut prp::PrpSegments,
) -> Result<(), Status> {
    segments(sqe, data.len() as u64, dma, segs)?;
    let mut off = 0usize;
    for &(at, len) in segs.iter() {
        let len = len as usize;
        dma.write(at, &data[off..off + len])
            .map_err(|_| Status::DATA_TRANSFER_ERROR)?;
        off += len;
    }
    Ok(())
}

/// Read `len` bytes from the memory `sqe` names (host-to-controller).
pub(crate) fn from_host(
    sqe: &Sqe,
    len: usize,
    dma: &mut dyn Dma<'_>,
    segs: &mut prp::PrpSegments,
) -> Result<Vec<u8>, Status> {
    segments(sqe, len as u64, dma, segs)?;
    let mut data = vec![0u8; len];
    let mut off = 0usize;
    for &(at, n) in segs.iter() {
        let n = n as usize;
        dma.read(at, &mut data[off..off + n])
            .map_err(|_| Status::DATA_TRANSFER_ERROR)?;
        off += n;
    }
    Ok(data)
}

/// Whether `[at, at + len)` can be reached for `access` as one slice.
pub(crate) fn reachable(dma: &mut dyn Dma<'_>, at: u64, len: u64, access: Access) -> bool {
    dma.slice(at, len, access).is_some()
}
