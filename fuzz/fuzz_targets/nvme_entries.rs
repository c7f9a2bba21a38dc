//! NVMe submission and completion entries and PRP lists from a hostile
//! driver: decoding never panics, what decodes re-encodes to the same
//! entry, and a PRP walk yields exactly the bytes asked for or an error.
#![no_main]
use libfuzzer_sys::fuzz_target;
use wd_nvme_msg::cmd::{CreateQueue, DsmRange, GetLogPage};
use wd_nvme_msg::{prp, AdminOp, Cqe, IoOp, Sqe, CQE_SIZE, SQE_SIZE};

fuzz_target!(|data: &[u8]| {
    let mut raw = [0u8; SQE_SIZE];
    let n = data.len().min(SQE_SIZE);
    raw[..n].copy_from_slice(&data[..n]);
    let s = Sqe::from_bytes(&raw);
    assert_eq!(Sqe::from_bytes(&s.to_bytes()), s);
    let _ = AdminOp::try_from(s.opcode);
    let _ = IoOp::try_from(s.opcode);
    let q = CreateQueue::from_sqe(&s);
    assert!(q.entries >= 1 && q.entries <= 0x1_0000);
    let l = GetLogPage::from_sqe(&s);
    assert!(l.len >= 4 && l.len.is_multiple_of(4));
    let mut c = [0u8; CQE_SIZE];
    c.copy_from_slice(&raw[..CQE_SIZE]);
    let cqe = Cqe::from_bytes(&c);
    let mut again = Cqe::from_bytes(&cqe.to_bytes());
    again.status.sct &= 7;
    assert_eq!(again, cqe);
    let r: [u8; 16] = raw[16..32].try_into().unwrap();
    assert_eq!(DsmRange::from_bytes(&r).to_bytes(), r);
    // A PRP walk over list "memory" taken from the rest of the input.
    let list = &data[n..];
    let len = (s.cdw[2] as u64 & 0xf_ffff) + 1;
    let mut segs = Vec::new();
    let r = prp::walk(
        s.prp1,
        s.prp2,
        len,
        4096,
        |at, out: &mut [u64]| {
            for (i, o) in out.iter_mut().enumerate() {
                let k = (at as usize / 8 + i) % (list.len() / 8).max(1) * 8;
                *o = list
                    .get(k..k + 8)
                    .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()));
            }
            if list.len() < 8 {
                Err(())
            } else {
                Ok(())
            }
        },
        &mut segs,
    );
    if r.is_ok() {
        assert_eq!(segs.iter().map(|s| s.1).sum::<u64>(), len);
    }
});
