//! The IOMMU through a real host (in this process) and its socket protocol:
//! strict and deferred unshares, stalled requests resumed or aborted, and
//! the para-virtual path (a client driving its queues' mappings with
//! virtio-iommu requests).

use std::time::Duration;

use wd_dummy_msg::CopyMsg;
use wrapdrive::virtio::{self, Request, Status as VStatus};
use wrapdrive::{Capability, FaultPolicy, HostConn, InvalidationMode, Queue, SharedBuf, Status};

const EFAULT: i32 = -14;
const LEN: u64 = 64 << 10;

fn setup() -> (std::sync::Arc<HostConn>, Queue, SharedBuf, SharedBuf) {
    let h = wd_embedded::connect().unwrap();
    let q = h.request_queue(&Capability::new("memcpy")).unwrap();
    let src = SharedBuf::new(LEN as usize).unwrap();
    let dst = SharedBuf::new(LEN as usize).unwrap();
    let pattern: Vec<u8> = (0..LEN).map(|i| (i * 7 % 251) as u8).collect();
    src.write(0, &pattern);
    (h, q, src, dst)
}

fn copy(q: &mut Queue, src: u64, dst: u64, len: u64) -> i32 {
    q.call(CopyMsg { src, dst, len }.to_desc(0)).unwrap().status
}

fn attr(h: &HostConn, q: &Queue, name: &str) -> String {
    h.get_attr(&format!("{}/queues/q{}/iommu/{name}", q.device(), q.id()))
        .unwrap()
}

#[test]
fn strict_unshare_cuts_access_at_once() {
    let (h, mut q, src, dst) = setup();
    q.share(src.addr(), LEN).unwrap();
    q.share(dst.addr(), LEN).unwrap();
    assert_eq!(copy(&mut q, src.addr(), dst.addr(), LEN), 0);
    assert_eq!(dst.to_vec(), src.to_vec());
    assert_eq!(attr(&h, &q, "mode"), "strict");
    assert_eq!(attr(&h, &q, "attached"), "own");
    q.unshare(dst.addr(), LEN).unwrap();
    assert_eq!(copy(&mut q, src.addr(), dst.addr(), LEN), EFAULT);
    let f = q.faults(8).unwrap();
    assert_eq!(f.events.len(), 1);
    assert_eq!(
        (f.events[0].iova, f.events[0].access, f.events[0].reason),
        (
            dst.addr(),
            wd_proto::Access::Write,
            wd_proto::FaultReason::Unmapped
        )
    );
    // The same, read by another connection of the same user, unconsumed.
    let h2 = wd_embedded::connect().unwrap();
    let _ = h2.peek_faults(q.id(), 8).unwrap();
    assert_eq!(
        h2.peek_faults(999_999, 8).unwrap_err().status(),
        Status::NotFound
    );
}

#[test]
fn deferred_unshares_flush_in_batches_and_on_time() {
    let (h, mut q, src, dst) = setup();
    q.set_iommu_policy(InvalidationMode::Deferred, FaultPolicy::Abort)
        .unwrap();
    assert_eq!(attr(&h, &q, "mode"), "deferred");
    q.share(src.addr(), LEN).unwrap();
    for round in 0..40u64 {
        dst.write(0, &[0; 16]);
        q.share(dst.addr(), LEN).unwrap();
        assert_eq!(
            copy(&mut q, src.addr(), dst.addr(), LEN),
            0,
            "round {round}"
        );
        assert_eq!(dst.to_vec(), src.to_vec());
        q.unshare(dst.addr(), LEN).unwrap();
        // Until the flush, an engine may still reach the range through its
        // IOTLB (the deferred mode's trade-off); the host keeps it mapped.
    }
    // The flush-queue timer flushes what is left.
    let mut pending = String::new();
    for _ in 0..100 {
        pending = attr(&h, &q, "fq_pending");
        if pending == "0" {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(pending, "0");
    assert_ne!(attr(&h, &q, "flushes"), "0");
    // Flushed: no engine reaches it any more.
    assert_eq!(copy(&mut q, src.addr(), dst.addr(), 16), EFAULT);
}

#[test]
fn stalled_requests_wait_for_the_client() {
    let (_h, mut q, src, dst) = setup();
    q.share(src.addr(), LEN).unwrap();
    q.set_iommu_policy(InvalidationMode::Strict, FaultPolicy::Stall)
        .unwrap();
    // dst is not shared: the request stalls instead of failing.
    q.send(
        CopyMsg {
            src: src.addr(),
            dst: dst.addr(),
            len: LEN,
        }
        .to_desc(0),
        7,
    )
    .unwrap();
    let r = q.recv_sync(Some(Duration::from_millis(150)));
    assert_eq!(r.unwrap_err().status(), Status::Again, "no completion yet");
    let f = q.faults(8).unwrap();
    assert_eq!(f.events.len(), 1);
    let seq = f.events[0].seq;
    assert_eq!(f.events[0].iova, dst.addr());
    // The client maps the page and resumes the request.
    q.share(dst.addr(), LEN).unwrap();
    q.resume_fault(seq, true).unwrap();
    let c = q.recv_sync(Some(Duration::from_secs(5))).unwrap();
    assert_eq!((c.cookie, c.desc.status, c.desc.result), (7, 0, LEN));
    assert_eq!(dst.to_vec(), src.to_vec());
    assert_eq!(
        q.resume_fault(seq, true).unwrap_err().status(),
        Status::NotFound,
        "resolved already"
    );
    // Or aborts it.
    q.unshare(dst.addr(), LEN).unwrap();
    q.send(
        CopyMsg {
            src: src.addr(),
            dst: dst.addr(),
            len: LEN,
        }
        .to_desc(0),
        8,
    )
    .unwrap();
    let mut seq = None;
    for _ in 0..200 {
        if let Some(e) = q.faults(8).unwrap().events.first() {
            seq = Some(e.seq);
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    q.resume_fault(seq.expect("a fault"), false).unwrap();
    let c = q.recv_sync(Some(Duration::from_secs(5))).unwrap();
    assert_eq!((c.cookie, c.desc.status), (8, EFAULT));
    // Leaving the stall policy aborts what waits.
    q.send(
        CopyMsg {
            src: src.addr(),
            dst: dst.addr(),
            len: LEN,
        }
        .to_desc(0),
        9,
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    q.set_iommu_policy(InvalidationMode::Strict, FaultPolicy::Abort)
        .unwrap();
    let c = q.recv_sync(Some(Duration::from_secs(5))).unwrap();
    assert_eq!((c.cookie, c.desc.status), (9, EFAULT));
}

/// Wait for a completion, or for the request to stall on a fault: the
/// completion, or the stalled fault's sequence number.
///
/// A fault that fails its request at once is recorded in the engine's
/// pass before the completion is posted at the pass's end, and a fault
/// event does not say whether its request stalled: one seen without a
/// completion is taken for a stall only when no completion follows it
/// (a stalled request completes only once resumed).
fn completion_or_stall(q: &mut Queue) -> Result<wrapdrive::Completion, u64> {
    completion_or_stall_at(q).map_err(|(seq, _)| seq)
}

/// A copy cut in pieces that faults after its first piece (its
/// destination unshared while it runs) stalls as one that faults at once
/// does, and runs again from the start once the client shares the memory
/// again: its pieces changed nothing it reads.
#[test]
fn a_copy_faulting_after_its_first_piece_stalls_and_starts_over() {
    const BIG: u64 = wd_dummy_msg::MAX_COPY;
    let h = wd_embedded::connect().unwrap();
    let mut q = h.request_queue(&Capability::new("memcpy")).unwrap();
    let src = SharedBuf::new(BIG as usize).unwrap();
    let dst = SharedBuf::new(BIG as usize).unwrap();
    let pattern: Vec<u8> = (0..BIG).map(|i| (i * 7 % 251) as u8 | 1).collect();
    src.write(0, &pattern);
    q.share(src.addr(), BIG).unwrap();
    q.set_iommu_policy(InvalidationMode::Strict, FaultPolicy::Stall)
        .unwrap();
    // The unshare must land while the copy is under way (a few hundred
    // passes of 256 KiB), after its first piece: tried again if not.
    for attempt in 0..10u64 {
        dst.write(0, &vec![0; BIG as usize]);
        q.share(dst.addr(), BIG).unwrap();
        q.send(
            CopyMsg {
                src: src.addr(),
                dst: dst.addr(),
                len: BIG,
            }
            .to_desc(0),
            attempt,
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(2 + attempt));
        q.unshare(dst.addr(), BIG).unwrap();
        let seq = match completion_or_stall(&mut q) {
            Ok(c) => {
                assert_eq!((c.cookie, c.desc.status), (attempt, 0), "done before");
                continue;
            }
            Err(seq) => seq,
        };
        let begun = dst.read_vec(0, 4096) == pattern[..4096];
        q.share(dst.addr(), BIG).unwrap();
        q.resume_fault(seq, true).unwrap();
        let c = q.recv_sync(Some(Duration::from_secs(10))).unwrap();
        assert_eq!((c.cookie, c.desc.status, c.desc.result), (attempt, 0, BIG));
        assert!(dst.to_vec() == pattern, "copied whole");
        if begun {
            return;
        }
        // It stalled on its first piece: not the case asked for.
        q.unshare(dst.addr(), BIG).unwrap();
    }
    panic!("the unshare never landed after the first piece");
}

/// An overlapping copy that faults after its first piece fails at once
/// instead of stalling: its pieces may have overwritten its source, so it
/// cannot start over.
#[test]
fn an_overlapping_copy_faulting_after_its_first_piece_fails() {
    const BIG: u64 = wd_dummy_msg::MAX_COPY;
    const SHIFT: u64 = 4 << 20;
    let h = wd_embedded::connect().unwrap();
    let mut q = h.request_queue(&Capability::new("memcpy")).unwrap();
    let buf = SharedBuf::new((BIG + SHIFT) as usize).unwrap();
    q.set_iommu_policy(InvalidationMode::Strict, FaultPolicy::Stall)
        .unwrap();
    for attempt in 0..10u64 {
        q.share(buf.addr(), BIG + SHIFT).unwrap();
        // Up by SHIFT: copied from the end, a piece at a time.
        q.send(
            CopyMsg {
                src: buf.addr(),
                dst: buf.addr() + SHIFT,
                len: BIG,
            }
            .to_desc(0),
            attempt,
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(2 + attempt));
        q.unshare(buf.addr(), BIG + SHIFT).unwrap();
        match completion_or_stall(&mut q) {
            Ok(c) if c.desc.status == 0 => continue,
            Ok(c) => {
                assert_eq!(
                    (c.cookie, c.desc.status, c.desc.result),
                    (attempt, EFAULT, 0)
                );
                assert!(q.faults(8).unwrap().events.len() <= 1);
                return;
            }
            // Stalled on its first piece (nothing copied yet): aborted,
            // and tried again.
            Err(seq) => {
                q.resume_fault(seq, false).unwrap();
                let c = q.recv_sync(Some(Duration::from_secs(5))).unwrap();
                assert_eq!((c.cookie, c.desc.status), (attempt, EFAULT));
            }
        }
    }
    panic!("the unshare never landed after the first piece");
}

/// A host with a sec device whose cipher queues are synchronous
/// (libcrypto alone: the engine stalls nothing on a multi-buffer queue),
/// a cipher queue on it with the stall policy, and a session of `alg`.
fn sec_queue(alg: &str, key: &[u8]) -> (wd_host::Host, Queue, u64) {
    let host = wd_host::Host::embedded(vec![wd_host::DeviceConfig::parse_spec(
        "sec:engine=libcrypto",
    )
    .unwrap()])
    .unwrap();
    let h = HostConn::connect(host.address()).unwrap();
    let mut q = h.request_queue(&Capability::new("cipher")).unwrap();
    q.set_iommu_policy(InvalidationMode::Strict, FaultPolicy::Stall)
        .unwrap();
    let alg = wd_sec::Alg::by_name(alg).unwrap();
    let d = q
        .call(wd_sec::msg::SessionNew::new(alg, key, 0).encode())
        .unwrap();
    assert_eq!(d.status, 0);
    (host, q, d.result)
}

/// libcrypto's (OpenSSL's) answer for `data` in one call: the output,
/// and GCM's tag over `aad`.
fn crypt(alg: &str, key: &[u8], iv: &[u8], aad: &[u8], data: &[u8]) -> (Vec<u8>, [u8; 16]) {
    let mut c = wd_sec::evp::CipherCtx::new(wd_sec::Alg::by_name(alg).unwrap()).unwrap();
    c.init(Some(key), Some(iv), true).unwrap();
    let mut tag = [0u8; 16];
    if !aad.is_empty() {
        c.aad(aad).unwrap();
    }
    let mut out = vec![0u8; data.len()];
    c.update(&mut out, data).unwrap();
    if !aad.is_empty() {
        c.finish().unwrap();
        c.tag(&mut tag).unwrap();
    }
    (out, tag)
}

/// [`completion_or_stall`], with the address that faulted.
fn completion_or_stall_at(q: &mut Queue) -> Result<wrapdrive::Completion, (u64, u64)> {
    for _ in 0..400 {
        if let Ok(c) = q.recv_sync(Some(Duration::from_millis(5))) {
            return Ok(c);
        }
        if let Some(e) = q.faults(8).unwrap().events.first() {
            return match q.recv_sync(Some(Duration::from_millis(100))) {
                Ok(c) => Ok(c),
                Err(_) => Err((e.seq, e.iova)),
            };
        }
    }
    panic!("neither a completion nor a fault in 2 s");
}

/// The pause before an unshare meant to land while a request runs: a
/// different one each attempt.
fn pause(attempt: u64) -> Duration {
    Duration::from_micros(300 * (attempt % 16))
}

/// Send `op` (a request of as many bytes as `region`) until an unshare of
/// `region` a moment after the send lands after its first piece: `fresh`
/// before each attempt, `stalled` once it stalls, `done` once it completed
/// (before the unshare landed, or resumed once `region` is shared again,
/// with status 0 and all its bytes).
fn stall_after_first_piece(
    q: &mut Queue,
    op: wrapdrive::Desc,
    (addr, len): (u64, u64),
    fresh: impl Fn(),
    stalled: impl Fn(),
    done: impl Fn(),
) {
    for attempt in 0..40u64 {
        fresh();
        q.share(addr, len).unwrap();
        q.send(op, attempt).unwrap();
        std::thread::sleep(pause(attempt));
        q.unshare(addr, len).unwrap();
        let (seq, at) = match completion_or_stall_at(q) {
            Ok(c) => {
                assert_eq!((c.cookie, c.desc.status), (attempt, 0), "done before");
                done();
                continue;
            }
            Err(stall) => stall,
        };
        stalled();
        q.share(addr, len).unwrap();
        q.resume_fault(seq, true).unwrap();
        let c = q.recv_sync(Some(Duration::from_secs(10))).unwrap();
        assert_eq!((c.cookie, c.desc.status, c.desc.result), (attempt, 0, len));
        done();
        if at > addr {
            return;
        }
        // It stalled on its first piece: not the case asked for.
        q.unshare(addr, len).unwrap();
    }
    panic!("the unshare never landed after the first piece");
}

/// A long XTS request (cut in data-unit calls of a MiB) whose destination
/// is unshared after its first piece stalls, and once the memory is shared
/// again runs from the start to OpenSSL's answer: its pieces moved no
/// session and did not write what it reads.
#[test]
fn a_cut_xts_request_faulting_after_its_first_piece_stalls_and_starts_over() {
    const N: u64 = 16 << 20;
    let key: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
    let iv = [0x42u8; 16];
    let (_host, mut q, s) = sec_queue("aes-256-xts", &key);
    let src = SharedBuf::new(N as usize).unwrap();
    let dst = SharedBuf::new(N as usize).unwrap();
    let data: Vec<u8> = (0..N).map(|i| (i * 7 % 251) as u8).collect();
    src.write(0, &data);
    let (want, _) = crypt("aes-256-xts", &key, &iv, &[], &data);
    q.share(src.addr(), N).unwrap();
    let op = wd_sec::msg::CipherOp {
        session: s,
        flags: wd_sec::msg::F_ENCRYPT | wd_sec::msg::F_IV,
        src: src.addr(),
        dst: dst.addr(),
        len: N,
        iv,
        iv_len: 16,
        aad: 0,
        aad_len: 0,
        tag: 0,
        tag_len: 0,
    };
    stall_after_first_piece(
        &mut q,
        op.encode(),
        (dst.addr(), N),
        || dst.write(0, &vec![0; N as usize]),
        || {},
        || assert!(dst.to_vec() == want, "OpenSSL's answer"),
    );
}

/// A long whole GCM decryption (cut: pieces decrypt into host memory)
/// whose ciphertext is unshared after its first piece stalls, and once the
/// memory is shared again starts over, its held plaintext dropped, and
/// gives the plaintext with status 0.
#[test]
fn a_cut_gcm_decryption_faulting_after_its_first_piece_stalls_and_starts_over() {
    const N: u64 = 32 << 20;
    let key = [0x17u8; 16];
    let (iv, aad) = ([9u8; 12], b"header 12");
    let (_host, mut q, s) = sec_queue("aes-128-gcm", &key);
    let src = SharedBuf::new(N as usize).unwrap();
    let dst = SharedBuf::new(N as usize).unwrap();
    let meta = SharedBuf::new(4096).unwrap();
    let plain: Vec<u8> = (0..N).map(|i| (i * 13 % 251) as u8).collect();
    let (ct, tag) = crypt("aes-128-gcm", &key, &iv, aad, &plain);
    src.write(0, &ct);
    meta.write(0, aad);
    meta.write(64, &tag);
    q.share(meta.addr(), 4096).unwrap();
    q.share(dst.addr(), N).unwrap();
    let mut ivb = [0u8; 16];
    ivb[..12].copy_from_slice(&iv);
    let op = wd_sec::msg::CipherOp {
        session: s,
        flags: wd_sec::msg::F_IV | wd_sec::msg::F_FINAL,
        src: src.addr(),
        dst: dst.addr(),
        len: N,
        iv: ivb,
        iv_len: 12,
        aad: meta.addr(),
        aad_len: aad.len() as u32,
        tag: meta.addr() + 64,
        tag_len: 16,
    };
    stall_after_first_piece(
        &mut q,
        op.encode(),
        (src.addr(), N),
        || dst.write(0, &vec![0; N as usize]),
        || assert!(dst.read_vec(0, 4096).iter().all(|&b| b == 0), "nothing out"),
        || assert!(dst.to_vec() == plain, "the plaintext"),
    );
}

/// A long XTS request in place (its pieces overwrite what it reads) that
/// faults after its first piece fails at once instead of stalling.
#[test]
fn an_xts_request_in_place_faulting_after_its_first_piece_fails() {
    const N: u64 = 16 << 20;
    let key: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
    let (_host, mut q, s) = sec_queue("aes-128-xts", &key);
    let buf = SharedBuf::new(N as usize).unwrap();
    let op = wd_sec::msg::CipherOp {
        session: s,
        flags: wd_sec::msg::F_ENCRYPT | wd_sec::msg::F_IV,
        src: buf.addr(),
        dst: buf.addr(),
        len: N,
        iv: [1; 16],
        iv_len: 16,
        aad: 0,
        aad_len: 0,
        tag: 0,
        tag_len: 0,
    };
    for attempt in 0..40u64 {
        q.share(buf.addr(), N).unwrap();
        q.send(op.encode(), attempt).unwrap();
        std::thread::sleep(pause(attempt));
        q.unshare(buf.addr(), N).unwrap();
        match completion_or_stall_at(&mut q) {
            Ok(c) if c.desc.status == 0 => continue,
            Ok(c) => {
                assert_eq!(
                    (c.cookie, c.desc.status, c.desc.result),
                    (attempt, EFAULT, 0)
                );
                return;
            }
            // Stalled on its first piece (nothing written yet): aborted,
            // and tried again.
            Err((seq, _)) => {
                q.resume_fault(seq, false).unwrap();
                let c = q.recv_sync(Some(Duration::from_secs(5))).unwrap();
                assert_eq!((c.cookie, c.desc.status), (attempt, EFAULT));
            }
        }
    }
    panic!("the unshare never landed after the first piece");
}

#[test]
fn a_client_manages_its_queue_through_virtio_iommu() {
    let (h, mut q, src, dst) = setup();
    q.share(src.addr(), LEN).unwrap();
    q.share(dst.addr(), LEN).unwrap();
    assert_eq!(src.addr() % 4096, 0);
    let ep = q.id();
    let (features, cfg) = h.virtio_config().unwrap();
    assert_eq!(cfg.len(), virtio::CONFIG_LEN);
    assert_ne!(features & (1 << virtio::VIRTIO_IOMMU_F_MAP_UNMAP), 0);
    assert_eq!(cfg[virtio::CONFIG_BYPASS], 1, "unattached endpoints bypass");
    // PROBE: the low reserved region.
    let mut b = [virtio::Buffer {
        readable: Request::Probe { endpoint: ep }.encode(),
        writable: vec![0; virtio::PROBE_SIZE as usize + 4],
        used: 0,
    }];
    h.virtio_kick(&mut b).unwrap();
    assert_eq!(
        virtio::parse_tail(&b[0].writable[..b[0].used]),
        Some(VStatus::Ok)
    );
    let resv = virtio::parse_probe(&b[0].writable[..virtio::PROBE_SIZE as usize]);
    assert_eq!(resv.len(), 1);
    assert_eq!((resv[0].start, resv[0].end), (0, 0xffff));
    // Bypass off: the unattached queue reaches nothing.
    h.virtio_write_config(virtio::CONFIG_BYPASS as u32, &[0])
        .unwrap();
    assert!(h.virtio_write_config(0, &[0]).is_err());
    assert_eq!(copy(&mut q, src.addr(), dst.addr(), 64), EFAULT);
    assert_eq!(
        q.faults(8).unwrap().events[0].reason,
        wd_proto::FaultReason::NoDomain,
        "no domain"
    );
    assert_eq!(attr(&h, &q, "attached"), "blocked");
    // Attach to domain 5 and map two IOVA windows onto the shared buffers.
    let (s_iova, d_iova) = (0x7000_0000_0000u64, 0x7000_0010_0000u64);
    let rw = virtio::VIRTIO_IOMMU_MAP_F_READ | virtio::VIRTIO_IOMMU_MAP_F_WRITE;
    let map = |iova: u64, gpa: u64| Request::Map {
        domain: 5,
        virt_start: iova,
        virt_end: iova + LEN - 1,
        phys_start: gpa,
        flags: rw,
    };
    let st = h
        .virtio_requests(&[
            Request::Attach {
                domain: 5,
                endpoint: ep,
                flags: 0,
                reserved: [0; 4],
            },
            map(s_iova, src.addr()),
            map(d_iova, dst.addr()),
            map(0, src.addr()),
            map(0x7100_0000_0000, 0x1000),
            Request::Attach {
                domain: 5,
                endpoint: 9_999,
                flags: 0,
                reserved: [0; 4],
            },
        ])
        .unwrap();
    assert_eq!(
        st,
        [
            Some(VStatus::Ok),
            Some(VStatus::Ok),
            Some(VStatus::Ok),
            Some(VStatus::Range),
            Some(VStatus::Fault),
            Some(VStatus::NoEnt)
        ]
    );
    assert_eq!(attr(&h, &q, "attached"), "virtio");
    dst.write(0, &[0; 64]);
    assert_eq!(copy(&mut q, s_iova, d_iova, LEN), 0);
    assert_eq!(dst.to_vec(), src.to_vec());
    // The client's own addresses mean nothing in this domain.
    assert_eq!(copy(&mut q, src.addr(), dst.addr(), 64), EFAULT);
    // Another connection cannot touch this queue.
    let other = wd_embedded::connect().unwrap();
    let st = other
        .virtio_requests(&[Request::Detach {
            domain: 5,
            endpoint: ep,
        }])
        .unwrap();
    assert_eq!(st, [Some(VStatus::NoEnt)]);
    // Unmap (strict): gone before the answer.
    let st = h
        .virtio_requests(&[
            Request::Unmap {
                domain: 5,
                virt_start: d_iova,
                virt_end: d_iova + 4095,
                reserved: [0; 4],
            },
            Request::Unmap {
                domain: 5,
                virt_start: d_iova,
                virt_end: d_iova + LEN - 1,
                reserved: [0; 4],
            },
        ])
        .unwrap();
    assert_eq!(st, [Some(VStatus::Range), Some(VStatus::Ok)]);
    assert_eq!(copy(&mut q, s_iova, d_iova, 64), EFAULT);
    // Unknown request types come back unwritten.
    let mut b = [virtio::Buffer {
        readable: vec![0x42, 0, 0, 0, 0, 0, 0, 0],
        writable: vec![0xee; 4],
        used: 0,
    }];
    h.virtio_kick(&mut b).unwrap();
    assert_eq!((b[0].used, b[0].writable.clone()), (0, vec![0xee; 4]));
    // Detach: the domain goes with its last endpoint; bypass back on.
    let st = h
        .virtio_requests(&[Request::Detach {
            domain: 5,
            endpoint: ep,
        }])
        .unwrap();
    assert_eq!(st, [Some(VStatus::Ok)]);
    h.virtio_write_config(virtio::CONFIG_BYPASS as u32, &[1])
        .unwrap();
    assert_eq!(attr(&h, &q, "attached"), "own");
    assert_eq!(copy(&mut q, src.addr(), dst.addr(), LEN), 0);
    // A fault as the virtio event queue would carry it.
    q.unshare(dst.addr(), LEN).unwrap();
    assert_eq!(copy(&mut q, src.addr(), dst.addr(), 8), EFAULT);
    let e = q.faults(8).unwrap().events.pop().unwrap();
    let rec = virtio::FaultEvent::decode(&wrapdrive::virtio_fault_record(&e)).unwrap();
    assert_eq!(
        (rec.reason, rec.endpoint, rec.address),
        (virtio::VIRTIO_IOMMU_FAULT_R_MAPPING, ep, Some(dst.addr()))
    );
}

/// A request stalled in one virtio domain, its queue then attached to
/// another: nobody can resolve the stall where it is (FaultResume looks in
/// the queue's domains of now), so the request runs again in the new
/// attachment (it changed nothing) instead of waiting out the stall
/// timeout and failing.
#[test]
fn a_stall_left_behind_by_a_new_attachment_runs_again_there() {
    let (h, mut q, src, dst) = setup();
    q.share(src.addr(), LEN).unwrap();
    q.share(dst.addr(), LEN).unwrap();
    q.set_iommu_policy(InvalidationMode::Strict, FaultPolicy::Stall)
        .unwrap();
    let (s_iova, d_iova) = (0x7000_0000_0000u64, 0x7000_0010_0000u64);
    let rw = virtio::VIRTIO_IOMMU_MAP_F_READ | virtio::VIRTIO_IOMMU_MAP_F_WRITE;
    let map = |domain: u32, iova: u64, gpa: u64| Request::Map {
        domain,
        virt_start: iova,
        virt_end: iova + LEN - 1,
        phys_start: gpa,
        flags: rw,
    };
    let ep = q.id();
    let attach_ep = |domain: u32, endpoint: u32| Request::Attach {
        domain,
        endpoint,
        flags: 0,
        reserved: [0; 4],
    };
    let attach = |domain: u32| attach_ep(domain, ep);
    // Domain 1 lacks the destination: the copy stalls there.
    let st = h
        .virtio_requests(&[attach(1), map(1, s_iova, src.addr())])
        .unwrap();
    assert_eq!(st, [Some(VStatus::Ok), Some(VStatus::Ok)]);
    let copy = CopyMsg {
        src: s_iova,
        dst: d_iova,
        len: LEN,
    };
    q.send(copy.to_desc(0), 11).unwrap();
    let mut stalled = false;
    for _ in 0..200 {
        if !q.faults(8).unwrap().events.is_empty() {
            stalled = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(stalled, "the copy faulted");
    // Domain 2 maps both (made by another queue's endpoint first: a
    // domain exists from its first attachment, and the stall runs again
    // as soon as the queue moves, so its maps must be there by then);
    // then the queue moves there.
    let other = h.request_queue(&Capability::new("memcpy")).unwrap();
    let st = h
        .virtio_requests(&[
            attach_ep(2, other.id()),
            map(2, s_iova, src.addr()),
            map(2, d_iova, dst.addr()),
        ])
        .unwrap();
    assert_eq!(st, [Some(VStatus::Ok); 3]);
    let st = h.virtio_requests(&[attach(2)]).unwrap();
    assert_eq!(st, [Some(VStatus::Ok)]);
    let t = std::time::Instant::now();
    let c = q.recv_sync(Some(Duration::from_secs(10))).unwrap();
    assert_eq!((c.cookie, c.desc.status, c.desc.result), (11, 0, LEN));
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "waited {:?} (the stall timeout)",
        t.elapsed()
    );
    assert_eq!(dst.to_vec(), src.to_vec());
}

/// A SHARE_ALL queue reaches the client's memory where its domain maps
/// nothing, never where the domain refuses: blocked through virtio-iommu
/// (bypass off, no attachment), its copies fault as any queue's do (they
/// went on through the client's memory descriptor).
#[test]
fn a_blocked_share_all_queue_reaches_nothing() {
    let h = wd_embedded::connect().unwrap();
    let mut q = h
        .request_queue(&Capability::new("memcpy").flags(wrapdrive::CAPA_SHARE_ALL))
        .unwrap();
    let src = vec![7u8; 64];
    let mut dst = vec![0u8; 64];
    let (s, d) = (src.as_ptr() as u64, dst.as_mut_ptr() as u64);
    assert_eq!(copy(&mut q, s, d, 64), 0, "the client's memory, unmapped");
    assert_eq!(dst, src);
    h.virtio_write_config(virtio::CONFIG_BYPASS as u32, &[0])
        .unwrap();
    dst.fill(0);
    assert_eq!(copy(&mut q, s, d, 64), EFAULT, "blocked");
    assert!(dst.iter().all(|&b| b == 0), "nothing written");
    assert_eq!(
        q.faults(8).unwrap().events[0].reason,
        wd_proto::FaultReason::NoDomain
    );
}

/// Threads asking for SHARE_ALL queues at once are all granted: the probe
/// word the host reads was one for the process, overwritten by another
/// thread's request before the host read it (refused: Permission).
#[test]
fn concurrent_share_all_requests_are_not_refused() {
    let h = wd_embedded::connect().unwrap();
    let refused = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..50 {
                    match h
                        .request_queue(&Capability::new("memcpy").flags(wrapdrive::CAPA_SHARE_ALL))
                    {
                        Ok(q) => drop(q),
                        Err(e) if e.status() == Status::Busy => {}
                        Err(e) => refused.lock().unwrap().push(e.to_string()),
                    }
                }
            });
        }
    });
    let refused = refused.into_inner().unwrap();
    assert!(
        refused.is_empty(),
        "{} refused: {:?}",
        refused.len(),
        refused.first()
    );
}

/// Memory freed while a queue shares it is not handed out again until
/// the device can no longer reach it (unshared, or its queue released): a
/// new buffer got those pages while the device could still write them.
#[test]
fn memory_freed_while_shared_is_not_handed_out_again() {
    let h = wd_embedded::connect().unwrap();
    let mut q = h.request_queue(&Capability::new("memcpy")).unwrap();
    let src = SharedBuf::new(LEN as usize).unwrap();
    let freed = SharedBuf::new(LEN as usize).unwrap();
    let at = freed.addr();
    q.share(src.addr(), LEN).unwrap();
    q.share(at, LEN).unwrap();
    drop(freed);
    let apart = |b: &SharedBuf| b.addr() + b.len() <= at || b.addr() >= at + LEN;
    let fresh: Vec<SharedBuf> = (0..8)
        .map(|_| SharedBuf::new(LEN as usize).unwrap())
        .collect();
    assert!(
        fresh.iter().all(apart),
        "a new buffer in memory still shared"
    );
    // The device still reaches it; what it writes there harms nobody.
    assert_eq!(copy(&mut q, src.addr(), at, LEN), 0);
    drop(q);
    drop(fresh);
}
