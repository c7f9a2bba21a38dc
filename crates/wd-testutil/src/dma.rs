//! Client memory for driving a device without a host: a flat byte vector
//! at an IOVA base behind the [`Dma`] trait. Anything outside it faults
//! (unmapped), as an address the client never shared does through a real
//! domain; `slice` works in place, so devices take their fast paths.
#![allow(unsafe_code)]

use wd_device::{Access, DeviceSlice, Dma, Fault, FaultReason};

/// `bytes.len()` bytes of client memory at IOVA `base`.
pub struct FlatMemory {
    base: u64,
    bytes: Vec<u8>,
}

impl FlatMemory {
    /// Zeroed memory of `len` bytes at `base`.
    pub fn new(base: u64, len: usize) -> FlatMemory {
        FlatMemory {
            base,
            bytes: vec![0; len],
        }
    }

    /// First IOVA.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    fn off(&self, a: u64, len: u64, access: Access) -> Result<usize, Fault> {
        match a.checked_sub(self.base) {
            Some(o)
                if o.checked_add(len)
                    .is_some_and(|e| e <= self.bytes.len() as u64) =>
            {
                Ok(o as usize)
            }
            _ => Err(Fault {
                iova: a,
                pasid: 1,
                access,
                reason: FaultReason::Unmapped,
            }),
        }
    }

    /// Write `data` at `a` (the client's own store). Panics outside.
    pub fn put(&mut self, a: u64, data: &[u8]) {
        let o = self
            .off(a, data.len() as u64, Access::Write)
            .expect("inside");
        self.bytes[o..o + data.len()].copy_from_slice(data);
    }

    /// `len` bytes at `a`. Panics outside.
    pub fn get(&self, a: u64, len: usize) -> Vec<u8> {
        let o = self.off(a, len as u64, Access::Read).expect("inside");
        self.bytes[o..o + len].to_vec()
    }
}

impl Dma<'static> for FlatMemory {
    fn copy(&mut self, dst: u64, src: u64, len: u64) -> Result<(), Fault> {
        let s = self.off(src, len, Access::Read)?;
        let d = self.off(dst, len, Access::Write)?;
        self.bytes.copy_within(s..s + len as usize, d);
        Ok(())
    }

    fn read(&mut self, src: u64, buf: &mut [u8]) -> Result<(), Fault> {
        let s = self.off(src, buf.len() as u64, Access::Read)?;
        buf.copy_from_slice(&self.bytes[s..s + buf.len()]);
        Ok(())
    }

    fn write(&mut self, dst: u64, data: &[u8]) -> Result<(), Fault> {
        let d = self.off(dst, data.len() as u64, Access::Write)?;
        self.bytes[d..d + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn slice(&mut self, iova: u64, len: u64, access: Access) -> Option<DeviceSlice<'static>> {
        let o = self.off(iova, len, access).ok()?;
        // SAFETY: inside `bytes`, which is never resized; the 'static is
        // the caller's promise that the memory outlives every request it
        // runs (it drops the device's requests before this memory).
        Some(unsafe { DeviceSlice::from_raw(self.bytes.as_mut_ptr().add(o), len as usize) })
    }
}
