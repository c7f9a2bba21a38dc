//! The host's use of the software IOMMU across clients: a SHARE_ALL
//! queue attached to a virtio-iommu domain reaches only its mappings, one
//! client's held requests do not hold up another's unshare, and a client
//! refilling a ring being released does not hold the engine.
#![allow(unsafe_code)]

mod common;

use wd_dummy_msg::CopyMsg;
use wd_host::{DeviceConfig, Host};
use wrapdrive::virtio::{self, Request, Status as VStatus};
use wrapdrive::{Capability, HostConn, Queue};

const EFAULT: i32 = -14;

fn copy(q: &mut Queue, src: u64, dst: u64, len: u64) -> i32 {
    q.call(CopyMsg { src, dst, len }.to_desc(0)).unwrap().status
}

/// A SHARE_ALL queue that its client attached to a virtio-iommu domain
/// translates through that domain: an IOVA the domain does not map is a
/// fault there (as on a blocked endpoint), not the client address with
/// the same number reached through the client's memory descriptor. The
/// domain's IOVAs are device addresses, not client addresses: with the
/// fallback, a domain that maps nothing lets the device read and write
/// the whole process, and a domain that maps IOVA X to buffer A has an
/// access to the unmapped IOVA Y land at client address Y.
#[test]
fn a_share_all_queue_attached_to_a_virtio_domain_reaches_only_its_mappings() {
    let host = Host::embedded(vec![DeviceConfig::new("dummy")]).unwrap();
    let h = HostConn::connect(host.address()).unwrap();
    let mut q = h
        .request_queue(&Capability::new("memcpy").flags(wrapdrive::CAPA_SHARE_ALL))
        .unwrap();
    let src = vec![7u8; 4096];
    let mut dst = vec![0u8; 4096];
    let (s, d) = (src.as_ptr() as u64, dst.as_mut_ptr() as u64);
    assert_eq!(copy(&mut q, s, d, 64), 0, "the client's memory, unattached");
    assert_eq!(&dst[..64], &src[..64]);
    dst.fill(0);
    // Attached to domain 1, which maps nothing.
    let st = h
        .virtio_requests(&[Request::Attach {
            domain: 1,
            endpoint: q.id(),
            flags: 0,
            reserved: [0; 4],
        }])
        .unwrap();
    assert_eq!(st, [Some(VStatus::Ok)]);
    let r = copy(&mut q, s, d, 64);
    assert!(
        dst.iter().all(|&b| b == 0),
        "the device wrote client memory at an IOVA domain 1 does not map"
    );
    assert_eq!(r, EFAULT, "an unmapped IOVA of the attached domain");
    let f = q.faults(8).unwrap();
    assert_eq!(f.events.len(), 1, "the fault is recorded in domain 1");
    let _ = virtio::VIRTIO_IOMMU_MAP_F_READ;
}

/// A client keeping its `dummy-async` device busy: 128 copies of 64 MiB
/// held, between two shared buffers; `drain` takes their completions.
struct HeldCopies {
    q: Queue,
    src: wrapdrive::SharedBuf,
    _dst: wrapdrive::SharedBuf,
    sent: usize,
}

const BIG: u64 = 64 << 20;

impl HeldCopies {
    fn start(conn: &std::sync::Arc<HostConn>) -> HeldCopies {
        let mut q = conn
            .request_queue(&Capability::new("memcpy-async").depth(256))
            .unwrap();
        let src = wrapdrive::SharedBuf::new(BIG as usize).unwrap();
        let dst = wrapdrive::SharedBuf::new(BIG as usize).unwrap();
        q.share(src.addr(), BIG).unwrap();
        q.share(dst.addr(), BIG).unwrap();
        let reqs: Vec<_> = (0..128u64)
            .map(|i| {
                let d = CopyMsg {
                    src: src.addr(),
                    dst: dst.addr(),
                    len: BIG,
                };
                (d.to_desc(0), i)
            })
            .collect();
        let mut sent = 0;
        while sent < reqs.len() {
            sent += q.send_batch(&reqs[sent..]).unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        HeldCopies {
            q,
            src,
            _dst: dst,
            sent,
        }
    }

    fn drain(&mut self) {
        let mut done = 0;
        while done < self.sent {
            if self
                .q
                .recv_sync(Some(std::time::Duration::from_secs(60)))
                .is_ok()
            {
                done += 1;
            }
        }
    }
}

/// One client's requests held by an asynchronous device must not hold up
/// another client's strict unshare for as long as the first client keeps
/// work queued: the pin of held translations is per engine and every
/// sync waits for every pinned engine, whoever's domain it invalidates.
/// Here client A keeps 128 copies of 64 MiB held on the `dummy-async`
/// device; client B (another device, its own domain, nothing in common)
/// unshares 64 KiB and should be done in well under a second.
#[test]
fn held_requests_of_one_client_do_not_stall_another_clients_unshare() {
    use std::time::{Duration, Instant};
    let host = Host::embedded(vec![
        DeviceConfig::new("dummy-async"),
        DeviceConfig::new("dummy"),
    ])
    .unwrap();
    let a = HostConn::connect(host.address()).unwrap();
    let b = HostConn::connect(host.address()).unwrap();
    let mut held = HeldCopies::start(&a);
    // Client B: share and unshare its own buffer.
    let mut qb = b.request_queue(&Capability::new("memcpy")).unwrap();
    let buf = wrapdrive::SharedBuf::new(64 << 10).unwrap();
    qb.share(buf.addr(), 64 << 10).unwrap();
    let t = Instant::now();
    qb.unshare(buf.addr(), 64 << 10).unwrap();
    let took = t.elapsed();
    // Drain A before the verdict (and the teardown).
    held.drain();
    assert!(
        took < Duration::from_millis(500),
        "client B's unshare waited {took:?} for client A's held requests"
    );
}

/// A client whose queue is being released keeps submitting (and reaping)
/// on the ring it still has mapped: the engine's teardown
/// (`cancel_pending`) cancels what it finds there in a loop that ends
/// only when the ring is empty, so it does not end while the client keeps
/// up; meanwhile the engine serves none of its other queues (another
/// client's among them) and the release's detach waits (10 s, then the
/// connection goes on without the engine's word). The client only has to
/// republish each entry's sequence word (4 bytes) while the engine reads
/// and completes whole entries, so it keeps up easily.
#[test]
fn a_client_refilling_its_ring_during_release_does_not_hold_the_engine() {
    use std::os::fd::AsFd;
    use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    use wd_proto::Message;
    use wrapdrive::SharedBuf;
    const DEPTH: u32 = 4096;
    let host = Host::embedded(vec![
        DeviceConfig::parse_spec("dummy:engines=1,cpu=0").unwrap()
    ])
    .unwrap();
    // The attacker: a raw queue it drives by hand.
    let mut ch = common::raw_connect(&host);
    let f = ch
        .call(
            &Message::RequestQueue {
                alg: "memcpy".into(),
                flags: 0,
                depth: DEPTH,
                numa_node: -1,
                probe_addr: 0,
                probe_value: 0,
            },
            2,
            &[],
        )
        .unwrap();
    let Message::QueueGranted {
        ring_bytes,
        queue_id,
        ..
    } = f.msg
    else {
        panic!("{:?}", f.msg)
    };
    let map = wd_sys::Mapping::map_shared(f.fds[0].as_fd(), 0, ring_bytes as usize).unwrap();
    let doorbell = f.fds[1].try_clone().unwrap();
    // The victim: another client's queue on the same (only) engine.
    let b = HostConn::connect(host.address()).unwrap();
    let mut qb = b.request_queue(&Capability::new("memcpy")).unwrap();
    let buf = SharedBuf::new(4096).unwrap();
    qb.share(buf.addr(), 4096).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let cycled = Arc::new(AtomicU64::new(0));
    let base = map.as_ptr() as usize;
    let spammer = {
        let (stop, cycled) = (stop.clone(), cycled.clone());
        std::thread::spawn(move || {
            let _ = wd_sys::pin_thread(1);
            let layout = wd_ring::RingLayout::new(DEPTH).unwrap();
            let word = |off: usize| -> &AtomicU32 {
                // SAFETY: inside the live ring mapping (joined before it
                // goes), 4-aligned; atomics may be shared.
                unsafe { AtomicU32::from_ptr((base + off) as *mut u32) }
            };
            // The header's head words (docs/rings.md).
            const SQ_HEAD: usize = 64;
            const CQ_HEAD: usize = 192;
            let sq = |i: u32| layout.sq_slot(i);
            let cq = |i: u32| layout.cq_slot(i);
            let seq = |i: u32| layout.seq(i);
            let (mut w, mut c) = (0u32, 0u32);
            while !stop.load(Ordering::Relaxed) {
                // Submit: every free entry gets the sequence word of the
                // index it holds next (its body is whatever it was).
                let head = word(SQ_HEAD).load(Ordering::Acquire);
                while w.wrapping_sub(head) < DEPTH {
                    word(sq(w)).store(seq(w), Ordering::Release);
                    w = w.wrapping_add(1);
                }
                // Reap: how far the completions go, by their words only.
                let c0 = c;
                while word(cq(c)).load(Ordering::Acquire) == seq(c) && c.wrapping_sub(c0) < DEPTH {
                    c = c.wrapping_add(1);
                }
                if c != c0 {
                    word(CQ_HEAD).store(c, Ordering::Release);
                    cycled.fetch_add(c.wrapping_sub(c0) as u64, Ordering::Relaxed);
                }
                let _ = wd_sys::wake(doorbell.as_fd());
            }
        })
    };
    while cycled.load(Ordering::Relaxed) < 10_000 {
        std::thread::sleep(Duration::from_millis(5));
    }
    // Release the queue while the spammer keeps its ring full.
    let releaser = std::thread::spawn(move || {
        let t = Instant::now();
        let r = ch.call(&Message::ReleaseQueue { queue_id }, 3, &[]);
        (t.elapsed(), r.is_ok(), ch)
    });
    std::thread::sleep(Duration::from_millis(200));
    // The victim's request must be served meanwhile (it takes well under
    // a millisecond on an engine that serves it; 100 ms is generous).
    let t = Instant::now();
    qb.send(
        wd_dummy_msg::CopyMsg {
            src: buf.addr(),
            dst: buf.addr() + 2048,
            len: 64,
        }
        .to_desc(0),
        1,
    )
    .unwrap();
    let served = qb.recv_sync(Some(Duration::from_secs(2)));
    let waited = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    spammer.join().unwrap();
    let (release_took, _, _ch) = releaser.join().unwrap();
    eprintln!(
        "victim waited {waited:?}, release took {release_took:?}, {} entries cycled",
        cycled.load(Ordering::Relaxed)
    );
    assert!(
        served.is_ok() && waited < Duration::from_millis(100),
        "another client's request waited {waited:?} (the engine was stuck cancelling a released ring); the release took {release_took:?}"
    );
    drop(map);
}

/// A strict unshare waits for its own queue's held requests; meanwhile
/// another client's attribute listing answers at once (it counted the
/// queue's shares under the lock the unshare held while it waited, and
/// held the host's table of queues meanwhile, so every client's queue
/// requests waited too).
#[test]
fn an_unshare_waiting_for_held_requests_does_not_hold_attribute_listings() {
    use std::time::{Duration, Instant};
    let host = Host::embedded(vec![DeviceConfig::new("dummy-async")]).unwrap();
    let a = HostConn::connect(host.address()).unwrap();
    let b = HostConn::connect(host.address()).unwrap();
    let held = HeldCopies::start(&a);
    let waiter = std::thread::spawn(move || {
        let mut held = held;
        let t = Instant::now();
        let r = held.q.unshare(held.src.addr(), BIG);
        (t.elapsed(), r.is_ok(), held)
    });
    std::thread::sleep(Duration::from_millis(50));
    let t = Instant::now();
    let listed = b.attrs("").unwrap();
    let took = t.elapsed();
    let (unshare_took, unshared, mut held) = waiter.join().unwrap();
    held.drain();
    assert!(unshared);
    assert!(!listed.is_empty());
    assert!(
        took < Duration::from_millis(300) && unshare_took > took,
        "the listing took {took:?} beside an unshare of {unshare_took:?}"
    );
}
