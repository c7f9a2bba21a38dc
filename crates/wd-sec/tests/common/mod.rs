//! What the sec device's tests share: client memory at an IOVA base that
//! a test can make the device reach in place or only by copies, with a
//! range that faults as if the client had unshared it, and the requests
//! every test sends first.
#![allow(dead_code, unsafe_code)]

use wd_device::{Access, DeviceQueue, DeviceSlice, Dma, Fault, HeldSlice};
use wd_iommu::FaultReason;
use wd_ring::Desc;
use wd_sec::msg::SessionNew;
use wd_sec::{Alg, SecQueue};

pub const BASE: u64 = 0x10_0000;

/// Flat memory at BASE; `direct`: in place (slice/hold) or bounce only;
/// `hole`: a range that faults (as if unshared by the client).
pub struct Mem {
    pub bytes: Vec<u8>,
    pub direct: bool,
    pub hole: Option<(u64, u64)>,
}

impl Mem {
    pub fn new(size: usize, direct: bool) -> Mem {
        Mem {
            bytes: vec![0; size],
            direct,
            hole: None,
        }
    }
    fn off(&self, a: u64, len: u64, access: Access) -> Result<usize, Fault> {
        let fault = Fault {
            iova: a,
            pasid: 1,
            access,
            reason: FaultReason::Unmapped,
        };
        if let Some((h0, h1)) = self.hole {
            if a < h1 && a.saturating_add(len) > h0 {
                return Err(fault);
            }
        }
        match a.checked_sub(BASE) {
            Some(o)
                if o.checked_add(len)
                    .is_some_and(|e| e <= self.bytes.len() as u64) =>
            {
                Ok(o as usize)
            }
            _ => Err(fault),
        }
    }
    pub fn put(&mut self, a: u64, data: &[u8]) {
        let o = (a - BASE) as usize;
        self.bytes[o..o + data.len()].copy_from_slice(data);
    }
    pub fn get(&self, a: u64, len: usize) -> Vec<u8> {
        let o = (a - BASE) as usize;
        self.bytes[o..o + len].to_vec()
    }
}

impl Dma<'static> for Mem {
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
        if !self.direct {
            return None;
        }
        let o = self.off(iova, len, access).ok()?;
        // SAFETY: inside `bytes`, never resized, outlives the requests.
        Some(unsafe { DeviceSlice::from_raw(self.bytes.as_mut_ptr().add(o), len as usize) })
    }
    fn probe(&mut self, iova: u64, len: u64, access: Access) -> Result<(), Fault> {
        self.off(iova, len, access).map(|_| ())
    }
    fn hold(&mut self, iova: u64, len: u64, access: Access) -> Option<HeldSlice> {
        if !self.direct {
            return None;
        }
        let o = self.off(iova, len, access).ok()?;
        // SAFETY: as in `slice`.
        Some(unsafe {
            HeldSlice::from_host_addr(self.bytes.as_ptr() as u64 + o as u64, len as usize)
        })
    }
}

pub fn run(q: &mut SecQueue, mem: &mut Mem, d: Desc) -> Desc {
    let mut d = d;
    q.process(&mut d, mem);
    d
}

pub fn session(q: &mut SecQueue, mem: &mut Mem, alg: Alg, key: &[u8]) -> u64 {
    let key_addr = BASE + 0x8000;
    mem.put(key_addr, key);
    let d = run(q, mem, SessionNew::new(alg, key, key_addr).encode());
    assert_eq!(d.status, 0, "session for {}", alg.name());
    d.result
}
