//! The host's inspection API, as a program running the host in its own
//! process sees it (`wd bench iommu` is one): a queue's IOMMU counters
//! follow what its client shares and faults, its DMA API maps device
//! addresses the engine honours, and nothing is left once it is gone.

use wd_dummy_msg::CopyMsg;
use wd_host::{DeviceConfig, Host};
use wd_iommu::Prot;
use wd_testutil::wait_until;
use wrapdrive::{Capability, HostConn, Queue, SharedBuf};

const LEN: u64 = 64 << 10;
/// A device address of our choosing, above every user address.
const IOVA: u64 = 1 << 47;
const EFAULT: i32 = -14;

fn copy(q: &mut Queue, src: u64, dst: u64) -> i32 {
    q.call(CopyMsg { src, dst, len: LEN }.to_desc(0))
        .unwrap()
        .status
}

#[test]
fn a_queue_is_seen_and_driven_through_the_inspection_api() {
    let host = Host::embedded(vec![DeviceConfig::new("dummy")]).unwrap();
    let conn = HostConn::connect(host.address()).unwrap();
    let mut q = conn.request_queue(&Capability::new("memcpy")).unwrap();
    assert!(host.queue_iommu_stats(q.id() + 1000).is_none());
    assert!(host.queue_dma(q.id() + 1000).is_none());
    let st = host.queue_iommu_stats(q.id()).unwrap();
    assert_eq!((st.domain.mapped_bytes, st.faults), (0, 0));

    let src = SharedBuf::new(LEN as usize).unwrap();
    let dst = SharedBuf::new(LEN as usize).unwrap();
    let pattern: Vec<u8> = (0..LEN).map(|i| (i * 13 % 251) as u8).collect();
    src.write(0, &pattern);
    q.share(src.addr(), LEN).unwrap();
    q.share(dst.addr(), LEN).unwrap();
    assert_eq!(
        host.queue_iommu_stats(q.id()).unwrap().domain.mapped_bytes,
        2 * LEN
    );

    // The DMA API: the destination mapped a second time, at our IOVA.
    let dom = host.queue_dma(q.id()).unwrap();
    let phys = dom.iova_to_phys(dst.addr()).unwrap();
    dom.map(IOVA, phys, LEN, Prot::WRITE).unwrap();
    assert_eq!(
        host.queue_iommu_stats(q.id()).unwrap().domain.mapped_bytes,
        3 * LEN
    );
    assert_eq!(copy(&mut q, src.addr(), IOVA), 0);
    assert_eq!(dst.to_vec(), pattern);

    // A strict unmap waits for the engines: one more sync, at least.
    let before = host.iommu_stats();
    dom.unmap(IOVA, LEN).unwrap();
    assert!(host.iommu_stats().syncs > before.syncs);
    assert_eq!(copy(&mut q, src.addr(), IOVA), EFAULT);
    let st = host.queue_iommu_stats(q.id()).unwrap();
    assert_eq!((st.domain.mapped_bytes, st.faults), (2 * LEN, 1));

    // Gone with the queue.
    let id = q.id();
    drop(q);
    wait_until("queue teardown", || host.queue_iommu_stats(id).is_none());
    assert!(host.queue_dma(id).is_none());
}
