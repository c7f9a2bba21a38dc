//! Client memory for driving a device without a host: a flat byte vector
//! at an IOVA base behind the [`Dma`] trait. Anything outside it faults
//! (unmapped), as an address the client never shared does through a real
//! domain, so a device's fault paths run too.
//!
//! `slice` works in place by default, so devices take their fast paths
//! (the engine slices memory a client shared); [`FlatMemory::set_slices`]
//! turns it off, so they take their `read`/`write` paths instead (the
//! engine's way to a client's own memory, reached through its
//! descriptor). `hold` says no unless [`FlatMemory::set_holds`] asks for
//! it: a device then keeps requests as an asynchronous one does.
//! [`FlatMemory::set_hole`] makes a range fault, as memory the client
//! unshared while a request ran does. [`FlatMemory::set_share_all`] makes
//! it a SHARE_ALL client's memory, reached only as it is used.
#![allow(unsafe_code)]

use wd_device::{Access, DeviceSlice, Dma, Fault, FaultReason, HeldSlice};

/// `len` bytes of client memory at IOVA `base`.
///
/// It implements `Dma<'static>`: a device reaches it through
/// `&mut dyn Dma<'_>` for one call (`DeviceQueue::service`, `process`),
/// which cannot keep a slice past that call, and the memory outlives the
/// call. A test that calls [`Dma::slice`] itself must drop the slice
/// before the memory.
pub struct FlatMemory {
    base: u64,
    bytes: Vec<u8>,
    slices: bool,
    holds: bool,
    hole: Option<(u64, u64)>,
    share_all: bool,
}

impl FlatMemory {
    /// Zeroed memory of `len` bytes at `base`.
    pub fn new(base: u64, len: usize) -> FlatMemory {
        FlatMemory {
            base,
            bytes: vec![0; len],
            slices: true,
            holds: false,
            hole: None,
            share_all: false,
        }
    }

    /// Whether `hold` hands out held slices (false at first), letting an
    /// asynchronous device keep requests.
    pub fn set_holds(&mut self, on: bool) {
        self.holds = on;
    }

    /// Make `[start, end)` fault for the device (None: nothing does); the
    /// test's own `put` and `get` still reach it.
    pub fn set_hole(&mut self, hole: Option<(u64, u64)>) {
        self.hole = hole;
    }

    /// Memory as the engine reaches a SHARE_ALL client's (false at first):
    /// through `read` and `write` only, with nothing to check beforehand
    /// (`probe` answers Ok, so a fault comes where the memory is used).
    pub fn set_share_all(&mut self, on: bool) {
        self.share_all = on;
    }

    /// Whether `slice` hands out in-place slices (true at first) or
    /// `None`, making devices go through `read` and `write`.
    pub fn set_slices(&mut self, on: bool) {
        self.slices = on;
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

    /// The offset of `[a, a + len)` in the memory, if it is inside.
    fn inside(&self, a: u64, len: u64) -> Option<usize> {
        let o = a.checked_sub(self.base)?;
        let end = o.checked_add(len)?;
        (end <= self.bytes.len() as u64).then_some(o as usize)
    }

    /// The offset of `[a, a + len)` for the device, or the fault an access
    /// there takes.
    fn off(&self, a: u64, len: u64, access: Access) -> Result<usize, Fault> {
        let in_hole = self
            .hole
            .is_some_and(|(h0, h1)| a < h1 && a.saturating_add(len) > h0);
        match self.inside(a, len) {
            Some(o) if !in_hole => Ok(o),
            _ => Err(Fault {
                iova: a,
                pasid: 1,
                access,
                reason: FaultReason::Unmapped,
            }),
        }
    }

    /// Write `data` at `a` (the client's own store). Panics outside: a
    /// test addressing memory it does not have is wrong.
    pub fn put(&mut self, a: u64, data: &[u8]) {
        let o = self.inside(a, data.len() as u64).expect("inside");
        self.bytes[o..o + data.len()].copy_from_slice(data);
    }

    /// `len` bytes at `a`. Panics outside.
    pub fn get(&self, a: u64, len: usize) -> Vec<u8> {
        let o = self.inside(a, len as u64).expect("inside");
        self.bytes[o..o + len].to_vec()
    }
}

impl Dma<'static> for FlatMemory {
    fn probe(&mut self, iova: u64, len: u64, access: Access) -> Result<(), Fault> {
        if self.share_all {
            return Ok(());
        }
        self.off(iova, len, access).map(|_| ())
    }

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
        if !self.slices || self.share_all {
            return None;
        }
        let o = self.off(iova, len, access).ok()?;
        // SAFETY: `o..o + len` is inside `bytes`, which is never resized,
        // so the pointer stays valid as long as `self` lives; a device
        // gets the slice through `&mut dyn Dma<'_>` and cannot keep it
        // past the call that borrows `self` (see the type's docs).
        Some(unsafe { DeviceSlice::from_raw(self.bytes.as_mut_ptr().add(o), len as usize) })
    }

    fn hold(&mut self, iova: u64, len: u64, access: Access) -> Option<HeldSlice> {
        if !self.holds || self.share_all {
            return None;
        }
        let o = self.off(iova, len, access).ok()?;
        // SAFETY: inside `bytes`, which is never resized; a test that lets
        // a device hold memory keeps the memory until the device reported
        // every request it held (the promise `set_holds` asks for).
        Some(unsafe {
            HeldSlice::from_host_addr(self.bytes.as_ptr() as u64 + o as u64, len as usize)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_fault_and_slices_are_optional() {
        let mut m = FlatMemory::new(0x1000, 64);
        m.write(0x1000, &[1, 2, 3]).unwrap();
        m.copy(0x1000 + 61, 0x1000, 3).unwrap();
        assert_eq!(m.get(0x1000 + 61, 3), [1, 2, 3]);
        let f = m.read(0x1000 + 62, &mut [0; 3]).unwrap_err();
        assert_eq!((f.iova, f.reason), (0x1000 + 62, FaultReason::Unmapped));
        assert!(m.write(0xfff, &[0]).is_err());
        assert!(m.copy(0x1000, u64::MAX, 2).is_err());
        let s = m.slice(0x1000, 4, Access::Write).unwrap();
        s.write_from(0, &[9]);
        assert_eq!(m.get(0x1000, 1), [9]);
        assert!(m.slice(0x1000, 65, Access::Read).is_none());
        m.set_slices(false);
        assert!(m.slice(0x1000, 4, Access::Read).is_none());
        assert!(m.hold(0x1000, 4, Access::Read).is_none());
    }
}
