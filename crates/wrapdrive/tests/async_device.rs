//! The engine's asynchronous path, through the `dummy-async` device (it
//! holds each copy for `HOLD`, then does it from the memory it held and
//! completes the newest first): completion out of order, memory kept
//! mapped while held, teardown with requests in flight.

use std::sync::Arc;
use std::time::{Duration, Instant};

use wd_device::dummy_async::HOLD;
use wd_dummy_msg::CopyMsg;
use wd_host::DeviceConfig;
use wrapdrive::{Capability, HostConn, SharedBuf};

fn host() -> (Arc<wd_host::Host>, Arc<HostConn>) {
    let h = Arc::new(wd_host::Host::embedded(vec![DeviceConfig::new("dummy-async")]).unwrap());
    let c = wd_embedded::connect_to(&h).unwrap();
    (h, c)
}

fn attr(c: &HostConn, path: &str) -> String {
    c.get_attr(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn held_requests_complete_out_of_order_with_their_data() {
    let (_h, c) = host();
    let mut q = c
        .request_queue(&Capability::new("memcpy-async").depth(16))
        .unwrap();
    let src = SharedBuf::new(8 * 4096).unwrap();
    let dst = SharedBuf::new(8 * 4096).unwrap();
    let data: Vec<u8> = (0..8 * 4096).map(|i| (i * 7 % 253) as u8).collect();
    src.write(0, &data);
    q.share(src.addr(), src.len()).unwrap();
    q.share(dst.addr(), dst.len()).unwrap();
    let reqs: Vec<_> = (0..8u64)
        .map(|i| {
            let d = CopyMsg {
                src: src.addr() + i * 4096,
                dst: dst.addr() + i * 4096,
                len: 4096,
            }
            .to_desc(0);
            (d, 100 + i)
        })
        .collect();
    assert_eq!(q.send_batch(&reqs).unwrap(), 8);
    let mut order = Vec::new();
    let t = Instant::now();
    while order.len() < 8 {
        let c = q.recv_sync(Some(Duration::from_secs(5))).unwrap();
        assert_eq!((c.desc.status, c.desc.result), (0, 4096));
        order.push(c.cookie);
    }
    assert!(
        t.elapsed() >= HOLD / 2,
        "completed before the device's hold"
    );
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(sorted, (100..108).collect::<Vec<_>>());
    assert_ne!(order, sorted, "the device completes newest first");
    assert_eq!(dst.to_vec(), data);
}

/// An unshare (strict) must not return while the device holds a request
/// on that memory: the host would unmap it under the device.
#[test]
fn unshare_waits_for_held_requests() {
    let (_h, c) = host();
    let mut q = c
        .request_queue(&Capability::new("memcpy-async").depth(8))
        .unwrap();
    let src = SharedBuf::new(1 << 20).unwrap();
    let dst = SharedBuf::new(1 << 20).unwrap();
    src.write(0, &vec![0x5a; 1 << 20]);
    q.share(src.addr(), src.len()).unwrap();
    q.share(dst.addr(), dst.len()).unwrap();
    let d = CopyMsg {
        src: src.addr(),
        dst: dst.addr(),
        len: 1 << 20,
    }
    .to_desc(0);
    let path = format!("dev0/queues/q{}/in_flight", q.id());
    // A loaded machine may let the hold pass before this thread looks:
    // then try again.
    let mut checked = false;
    for attempt in 0..10u64 {
        q.send(d, attempt).unwrap();
        let t = Instant::now();
        while attr(&c, &path) != "1" && t.elapsed() < HOLD {
            std::thread::yield_now();
        }
        if attr(&c, &path) != "1" {
            let done = q.recv_sync(Some(Duration::from_secs(1))).unwrap();
            assert_eq!(done.desc.status, 0);
            continue;
        }
        q.unshare(dst.addr(), dst.len()).unwrap();
        // The completion is already posted: the unshare waited for it.
        assert!(
            q.completions_ready(),
            "unshare returned while the copy was held"
        );
        let done = q.recv_sync(Some(Duration::from_secs(1))).unwrap();
        assert_eq!((done.cookie, done.desc.status), (attempt, 0));
        assert!(dst.to_vec().iter().all(|&b| b == 0x5a));
        checked = true;
        break;
    }
    assert!(checked, "never saw the request held");
    assert_eq!(attr(&c, &path), "0");
}

/// Releasing a queue (as its process dying does) with requests held stops
/// them, returns the instance, and the host carries on.
#[test]
fn teardown_with_held_requests() {
    let (_h, c) = host();
    let avail = "dev0/mdev_supported_types/dummy-async-memcpy-async/available_instances";
    let before = attr(&c, avail);
    for round in 0..5 {
        let mut q = c
            .request_queue(&Capability::new("memcpy-async").depth(16))
            .unwrap();
        let buf = SharedBuf::new(16 * 4096).unwrap();
        q.share(buf.addr(), buf.len()).unwrap();
        let reqs: Vec<_> = (0..8u64)
            .map(|i| {
                let d = CopyMsg {
                    src: buf.addr(),
                    dst: buf.addr() + (8 + i) * 4096,
                    len: 4096,
                }
                .to_desc(0);
                (d, i)
            })
            .collect();
        q.send_batch(&reqs).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        q.release().unwrap_or_else(|e| panic!("round {round}: {e}"));
        // Its memory may go now: the device let go of it.
        drop(buf);
    }
    assert_eq!(attr(&c, avail), before);
    // A new queue is served, and a sync of the IOMMU is not stuck on pins
    // of requests nobody completes (share/unshare would hang).
    let mut q = c.request_queue(&Capability::new("memcpy-async")).unwrap();
    let buf = SharedBuf::new(8192).unwrap();
    q.share(buf.addr(), buf.len()).unwrap();
    let d = q
        .call(
            CopyMsg {
                src: buf.addr(),
                dst: buf.addr() + 4096,
                len: 64,
            }
            .to_desc(0),
        )
        .unwrap();
    assert_eq!(d.status, 0);
    q.unshare(buf.addr(), buf.len()).unwrap();
}
