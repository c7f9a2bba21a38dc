//! A client can make memory it shared vanish under the host: sealing a
//! memfd against shrinking does not stop a hole being punched in it, and
//! on hugetlb pages the host's next touch of the hole needs a free huge
//! page. A client that took them all used to kill the host with SIGBUS;
//! now the request fails with -EFAULT, that client's queue is marked
//! broken, and the host and its other clients carry on.
//!
//! The host runs in this process (as `HostConn::embedded` starts it), so a
//! host killed by SIGBUS is this test process dying.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use wd_testutil::skip;

use wd_dummy_msg::CopyMsg;
use wrapdrive::heap::{AllocOptions, Buffer, Heap, HeapLimits, PagePolicy};
use wrapdrive::{Capability, HostConn, Queue, SharedBuf, Status};

const EFAULT: i32 = -14;
const HUGE: u64 = 2 << 20;
const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";
const FREE_2M: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages";
const RESV_2M: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB/resv_hugepages";

fn read_u64(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Free 2 MiB pages nobody has a reservation on.
fn huge_available() -> u64 {
    read_u64(FREE_2M)
        .unwrap_or(0)
        .saturating_sub(read_u64(RESV_2M).unwrap_or(0))
}

/// The 2 MiB pool raised for this test, put back as it was when dropped.
struct Pool {
    restore: Option<u64>,
}

impl Pool {
    /// At least `pages` free 2 MiB pages, raising the pool if we are root
    /// and may; Err(reason) otherwise.
    fn reserve(pages: u64) -> Result<Pool, String> {
        let have = huge_available();
        if have >= pages {
            return Ok(Pool { restore: None });
        }
        let Some(total) = read_u64(NR_HUGEPAGES) else {
            return Err("this kernel has no hugetlb pool".into());
        };
        if wd_sys::geteuid() != 0 {
            return Err(format!(
                "needs {pages} free 2 MiB hugetlb pages ({have} free) and is not root to reserve them"
            ));
        }
        let want = total + (pages - have);
        if let Err(e) = std::fs::write(NR_HUGEPAGES, format!("{want}\n")) {
            return Err(format!("cannot raise {NR_HUGEPAGES} to {want}: {e}"));
        }
        let pool = Pool {
            restore: Some(total),
        };
        if huge_available() < pages {
            return Err(format!(
                "raised {NR_HUGEPAGES} to {want} but only {} pages are free (memory fragmented?)",
                huge_available()
            ));
        }
        Ok(pool)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let Some(n) = self.restore {
            let _ = std::fs::write(NR_HUGEPAGES, format!("{n}\n"));
        }
    }
}

/// A hugetlb memfd holding every free 2 MiB page it could get.
fn take_every_free_huge_page() -> OwnedFd {
    let fd = wd_sys::pages::memfd_create_sealable("wd-hog", wd_sys::pages::MemfdPages::Huge2M)
        .expect("hugetlb memfd");
    let pages = read_u64(NR_HUGEPAGES).unwrap_or(0) + 64;
    wd_sys::ftruncate(fd.as_fd(), pages * HUGE).unwrap();
    for i in 0..pages {
        if let Err(e) = wd_sys::pages::fallocate(fd.as_fd(), i * HUGE, HUGE) {
            assert!(
                matches!(e.errno(), 12 | 28),
                "hog stopped by something else than ENOMEM/ENOSPC: {e}"
            );
            break;
        }
    }
    fd
}

fn copy(q: &mut Queue, src: u64, dst: u64, len: u64) -> Result<(i32, u64), Status> {
    q.call(CopyMsg { src, dst, len }.to_desc(0))
        .map(|d| (d.status, d.result))
        .map_err(|e| e.status())
}

fn pattern(len: usize, seed: usize) -> Vec<u8> {
    (0..len).map(|i| ((i * 13 + seed) % 251) as u8).collect()
}

/// Another client of the same host, with a queue of its own: it must not
/// notice what the first client does.
struct Bystander {
    _host: Arc<HostConn>,
    q: Queue,
    src: SharedBuf,
    dst: SharedBuf,
}

impl Bystander {
    fn new() -> Bystander {
        let host = wd_embedded::connect().unwrap();
        let mut q = host.request_queue(&Capability::new("memcpy")).unwrap();
        let src = SharedBuf::new(64 << 10).unwrap();
        let dst = SharedBuf::new(64 << 10).unwrap();
        q.share(src.addr(), src.len()).unwrap();
        q.share(dst.addr(), dst.len()).unwrap();
        Bystander {
            _host: host,
            q,
            src,
            dst,
        }
    }

    fn works(&mut self, round: usize) {
        let data = pattern(self.src.len() as usize, round);
        self.src.write(0, &data);
        let n = self.src.len();
        assert_eq!(
            copy(&mut self.q, self.src.addr(), self.dst.addr(), n),
            Ok((0, n)),
            "the other client's copy failed (round {round})"
        );
        assert!(
            self.dst.to_vec() == data,
            "the other client's data is wrong"
        );
    }
}

fn victim(heap: &Heap, len: u64, pages: PagePolicy) -> Result<Buffer, String> {
    let opts = AllocOptions {
        pages,
        populate: true,
        seal: true,
        node: None,
    };
    let b = heap.alloc(len, &opts).map_err(|e| e.to_string())?;
    b.write_at(0, &pattern(len as usize, 1)).unwrap();
    Ok(b)
}

/// The client of issue 9: shares a sealed hugetlb buffer, punches a hole in
/// it, takes every free huge page, then asks for a copy out of the hole.
#[test]
fn hugetlb_hole_fails_the_request_not_the_host() {
    const TEST: &str = "hugetlb_hole_fails_the_request_not_the_host";
    let _pool = match Pool::reserve(2) {
        Ok(p) => p,
        Err(why) => return skip(TEST, &why),
    };
    let heap = Heap::new(HeapLimits {
        max_bytes: 64 << 20,
        max_buffers: 8,
    });
    let buf = match victim(&heap, 2 * HUGE, PagePolicy::Huge2M) {
        Ok(b) => b,
        Err(why) => return skip(TEST, &format!("no 2 MiB hugetlb buffer: {why}")),
    };
    let mut other = Bystander::new();
    other.works(0);

    let host = wd_embedded::connect().unwrap();
    let mut q = host.request_queue(&Capability::new("memcpy")).unwrap();
    q.share_buffer(&buf).unwrap();
    // Both pages are there: the copy works.
    assert_eq!(
        copy(&mut q, buf.addr(), buf.addr() + HUGE, 4096),
        Ok((0, 4096))
    );

    wd_sys::pages::punch_hole(buf.fd(), 0, HUGE).unwrap();
    let hog = take_every_free_huge_page();
    assert_eq!(huge_available(), 0, "the hog left free huge pages");
    // The host's next touch of page 0 finds no page to fault in.
    let r = copy(&mut q, buf.addr() + 512, buf.addr() + HUGE, 4096);
    drop(hog);
    match r {
        Ok((st, res)) => assert_eq!((st, res), (EFAULT, 0), "copy out of the hole"),
        Err(st) => assert_eq!(st, Status::BadState, "copy out of the hole"),
    }
    // The queue is broken: nothing more is served on it.
    assert_eq!(
        copy(&mut q, buf.addr() + HUGE, buf.addr() + HUGE + 8192, 4096),
        Err(Status::BadState)
    );
    assert_eq!(
        host.get_attr(&format!("{}/queues/q{}/state", q.device(), q.id()))
            .unwrap(),
        "broken"
    );
    // The vanished page is a fault on record, at an address the client named.
    let f = q.faults(8).unwrap();
    assert!(
        f.events
            .iter()
            .any(|e| (buf.addr() + 512..buf.addr() + 512 + 4096).contains(&e.iova)),
        "no fault recorded at the hole: {:?}",
        f.events
    );
    q.release().unwrap();

    // The host and every other client carry on; so does this client.
    other.works(1);
    let mut q2 = host.request_queue(&Capability::new("memcpy")).unwrap();
    let fresh = victim(&heap, 64 << 10, PagePolicy::Normal).unwrap();
    q2.share_buffer(&fresh).unwrap();
    assert_eq!(
        copy(&mut q2, fresh.addr(), fresh.addr() + 32768, 4096),
        Ok((0, 4096))
    );
}

/// The same on normal pages: the hole faults in a zero page again (shmem
/// never fails that short of the OOM killer), so the copy reads zeros or
/// fails cleanly; nothing else is disturbed.
#[test]
fn memfd_hole_reads_zeros_or_fails_cleanly() {
    let heap = Heap::new(HeapLimits {
        max_bytes: 64 << 20,
        max_buffers: 8,
    });
    let len = 256u64 << 10;
    let buf = victim(&heap, len, PagePolicy::Normal).unwrap();
    let mut other = Bystander::new();
    other.works(0);
    let host = wd_embedded::connect().unwrap();
    let mut q = host.request_queue(&Capability::new("memcpy")).unwrap();
    q.share_buffer(&buf).unwrap();

    wd_sys::pages::punch_hole(buf.fd(), 0, 64 << 10).unwrap();
    let half = len / 2;
    match copy(&mut q, buf.addr(), buf.addr() + half, half) {
        Ok((0, n)) => {
            assert_eq!(n, half);
            let mut got = vec![0u8; half as usize];
            buf.read_at(half, &mut got).unwrap();
            assert!(got[..64 << 10].iter().all(|&b| b == 0), "hole not zeros");
            assert!(got[64 << 10..] == pattern(len as usize, 1)[64 << 10..half as usize]);
            // Still served.
            assert_eq!(
                copy(&mut q, buf.addr() + half, buf.addr(), 4096),
                Ok((0, 4096))
            );
        }
        Ok((st, res)) => assert_eq!((st, res), (EFAULT, 0)),
        Err(st) => assert_eq!(st, Status::BadState),
    }
    other.works(1);
}
