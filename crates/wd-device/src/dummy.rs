//! The demonstration device: a memcpy engine.
//!
//! Its message format is `wd-dummy-msg` (shared with clients).

use crate::{status, AlgInfo, DeviceQueue, Dma, Driver, Progress};
use wd_ring::Desc;

pub use wd_dummy_msg::{legacy_plan, CopyMsg, DEVICE_API, MAX_COPY, OP_COPY, OP_NOP};

/// The dummy driver.
#[derive(Debug, Default)]
pub struct DummyDriver;

impl Driver for DummyDriver {
    fn name(&self) -> &'static str {
        "dummy"
    }

    fn algorithms(&self) -> Vec<AlgInfo> {
        vec![AlgInfo {
            name: "memcpy",
            flags: 0,
            device_api: DEVICE_API,
        }]
    }

    fn open_queue(&self, _alg: u32) -> Box<dyn DeviceQueue> {
        Box::new(DummyQueue)
    }
}

/// A memcpy queue: stateless.
pub(crate) struct DummyQueue;

impl DeviceQueue for DummyQueue {
    fn process(&mut self, desc: &mut Desc, dma: &mut dyn Dma<'_>) {
        let _ = self.process_part(desc, dma, 0, u64::MAX);
    }

    fn process_part(
        &mut self,
        desc: &mut Desc,
        dma: &mut dyn Dma<'_>,
        done: u64,
        budget: u64,
    ) -> Progress {
        let finish = |desc: &mut Desc, status: i32, result: u64| {
            desc.status = status;
            desc.result = result;
            Progress::Done
        };
        let m = match CopyMsg::decode(desc) {
            Err(st) => return finish(desc, st, 0),
            Ok(None) => return finish(desc, status::OK, 0),
            Ok(Some(m)) => m,
        };
        let done = done.min(m.len);
        let n = (m.len - done).min(budget.max(1));
        let at = crate::copy_piece_at(m.src, m.dst, m.len, done, n);
        let piece = match (m.src.checked_add(at), m.dst.checked_add(at)) {
            (Some(s), Some(d)) => dma.copy(d, s, n),
            _ => return finish(desc, status::EFAULT, 0),
        };
        match piece {
            Err(_) => finish(desc, status::EFAULT, 0),
            Ok(()) if done + n < m.len => Progress::More(done + n),
            Ok(()) => finish(desc, status::OK, m.len),
        }
    }

    fn restartable(&self, desc: &Desc) -> bool {
        // Copied again from the start, a source the pieces before did not
        // overwrite gives the same bytes.
        matches!(CopyMsg::decode(desc), Ok(Some(m))
            if !crate::ranges_overlap((m.src, m.len), (m.dst, m.len)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wd_iommu::{Access, Fault, FaultReason};

    /// A flat memory of 4096 bytes at device address 0x1000.
    struct Flat(Vec<u8>);
    impl Flat {
        fn range(&self, a: u64, len: u64, access: Access) -> Result<usize, Fault> {
            if a < 0x1000 || a + len > 0x1000 + self.0.len() as u64 {
                return Err(Fault {
                    iova: a,
                    pasid: 0,
                    access,
                    reason: FaultReason::Unmapped,
                });
            }
            Ok((a - 0x1000) as usize)
        }
    }
    impl Dma<'_> for Flat {
        fn copy(&mut self, dst: u64, src: u64, len: u64) -> Result<(), Fault> {
            let s = self.range(src, len, Access::Read)?;
            let d = self.range(dst, len, Access::Write)?;
            self.0.copy_within(s..s + len as usize, d);
            Ok(())
        }
        fn read(&mut self, src: u64, buf: &mut [u8]) -> Result<(), Fault> {
            let s = self.range(src, buf.len() as u64, Access::Read)?;
            buf.copy_from_slice(&self.0[s..s + buf.len()]);
            Ok(())
        }
        fn write(&mut self, dst: u64, data: &[u8]) -> Result<(), Fault> {
            let d = self.range(dst, data.len() as u64, Access::Write)?;
            self.0[d..d + data.len()].copy_from_slice(data);
            Ok(())
        }
    }

    #[test]
    fn copies_and_faults() {
        let mut mem = Flat((0..4096u32).map(|i| i as u8).collect());
        let mut e = DummyDriver.open_queue(0);
        let mut d = CopyMsg {
            src: 0x1000,
            dst: 0x1800,
            len: 16,
        }
        .to_desc(5);
        e.process(&mut d, &mut mem);
        assert_eq!((d.status, d.result, d.tag), (0, 16, 5));
        assert_eq!(&mem.0[0x800..0x810], &mem.0[0..16].to_vec()[..]);
        let mut bad = CopyMsg {
            src: 0x0,
            dst: 0x1800,
            len: 16,
        }
        .to_desc(6);
        e.process(&mut bad, &mut mem);
        assert_eq!(bad.status, status::EFAULT);
    }

    #[test]
    fn pieces_move_like_one_copy() {
        for (src, dst) in [(0x1000, 0x1010), (0x1010, 0x1000), (0x1000, 0x1800)] {
            let init: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
            let (mut whole, mut parts) = (Flat(init.clone()), Flat(init));
            let mut e = DummyDriver.open_queue(0);
            let d = CopyMsg {
                src,
                dst,
                len: 1000,
            }
            .to_desc(1);
            e.process(&mut d.clone(), &mut whole);
            let (mut p, mut done, mut calls) = (d, 0, 0);
            while let Progress::More(n) = e.process_part(&mut p, &mut parts, done, 64) {
                assert!(n > done);
                done = n;
                calls += 1;
            }
            assert_eq!((p.status, p.result, calls), (0, 1000, 15));
            assert!(whole.0 == parts.0, "{src:#x} -> {dst:#x}");
        }
    }

    #[test]
    fn malformed_messages_are_rejected() {
        let mut mem = Flat(vec![0; 4096]);
        let mut e = DummyDriver.open_queue(0);
        let mut d = Desc {
            opcode: 99,
            ..Desc::default()
        };
        e.process(&mut d, &mut mem);
        assert_eq!(d.status, status::EOPNOTSUPP);
        let mut d = CopyMsg {
            src: 0x1000,
            dst: 0x1000,
            len: MAX_COPY + 1,
        }
        .to_desc(1);
        e.process(&mut d, &mut mem);
        assert_eq!(d.status, status::EMSGSIZE);
        let mut d = CopyMsg {
            src: 0x1000,
            dst: 0x1000,
            len: 1,
        }
        .to_desc(1);
        d.payload[50] = 1;
        e.process(&mut d, &mut mem);
        assert_eq!(d.status, status::EINVAL);
        let mut d = Desc {
            opcode: OP_NOP,
            flags: 3,
            ..Desc::default()
        };
        e.process(&mut d, &mut mem);
        assert_eq!(d.status, status::EINVAL);
    }
}
