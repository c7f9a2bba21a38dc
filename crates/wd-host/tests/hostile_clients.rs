//! What a hostile client (a raw protocol channel, or a ring written by
//! hand) can do to the host's other clients. Each test failed before its
//! fix.

mod common;

use std::os::fd::{AsFd, OwnedFd};

use wd_host::{DeviceConfig, Host};
use wd_ipc::Channel;
use wd_proto::{Message, Prot};

/// Tests that count the process's mappings or fill them run one at a time.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A sealed memfd of `size` bytes, as a client shares.
fn memfd(size: u64) -> OwnedFd {
    let fd = wd_sys::memfd_create("hostile", false).unwrap();
    wd_sys::ftruncate(fd.as_fd(), size).unwrap();
    wd_sys::add_seals(fd.as_fd(), wd_sys::SEAL_SHRINK | wd_sys::SEAL_GROW).unwrap();
    fd
}

/// An attribute's value through `ch`.
fn attr(ch: &mut Channel, path: &str) -> String {
    match ch
        .call(&Message::GetAttr { path: path.into() }, 9, &[])
        .unwrap()
        .msg
    {
        Message::AttrValue { value } => value,
        m => panic!("GetAttr {path}: {m:?}"),
    }
}

/// A queue of `alg` on the channel's connection: its id and descriptors.
fn queue(ch: &mut Channel, alg: &str) -> (u32, Vec<OwnedFd>) {
    let f = ch
        .call(
            &Message::RequestQueue {
                alg: alg.into(),
                flags: 0,
                depth: 0,
                numa_node: -1,
                probe_addr: 0,
                probe_value: 0,
            },
            2,
            &[],
        )
        .unwrap();
    match f.msg {
        Message::QueueGranted { queue_id, .. } => (queue_id, f.fds),
        m => panic!("RequestQueue {alg}: {m:?}"),
    }
}

/// Share `[off, off + len)` of `fd` at IOVA `iova`: the host's answer.
fn share(ch: &mut Channel, q: u32, fd: &OwnedFd, iova: u64, off: u64, len: u64) -> Message {
    ch.call(
        &Message::MemShare {
            queue_id: q,
            iova,
            size: len,
            fd_offset: off,
            prot: Prot::RW,
        },
        3,
        &[fd.as_fd()],
    )
    .unwrap()
    .msg
}

/// What a new client hears when it says Hello and asks for a memcpy
/// queue: the refusal of its connection, or the answer to its request.
fn another_clients_queue(host: &Host) -> Message {
    use std::os::linux::net::SocketAddrExt;
    let name = host.address().strip_prefix('@').expect("abstract address");
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let sock = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
    sock.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut ch = Channel::new(sock);
    let hello = Message::Hello {
        version: wd_proto::PROTOCOL_VERSION,
        client_pid: 0,
    };
    match ch.call(&hello, 1, &[]) {
        Ok(f) if matches!(f.msg, Message::HelloReply { .. }) => {}
        Ok(f) => return f.msg,
        Err(e) => panic!("Hello: {e}"),
    }
    let request = Message::RequestQueue {
        alg: "memcpy".into(),
        flags: 0,
        depth: 0,
        numa_node: -1,
        probe_addr: 0,
        probe_value: 0,
    };
    match ch.call(&request, 2, &[]) {
        Ok(f) => f.msg,
        Err(e) => panic!("RequestQueue: {e}"),
    }
}

/// Kernel mappings (VMAs) of this process, the host's.
fn vmas() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .count()
}

/// docs/security.md: the host mapping budget is "counted in shared ranges
/// (an upper bound of the kernel mappings they cost)", so that a flood of
/// shares ends in a clear refusal and not in failed thread creation or
/// ring mapping. A range is mapped inside its file's PROT_NONE window; one
/// that touches no other splits the window's reservation around it, and
/// costs the host two or three kernel mappings for the one counted.
#[test]
fn shared_ranges_cost_no_more_kernel_mappings_than_counted() {
    let _serial = serial();
    let host = Host::embedded(vec![DeviceConfig::new("dummy")]).unwrap();
    let mut ch = common::raw_connect(&host);
    let (q, _fds) = queue(&mut ch, "memcpy");
    const N: u64 = 1000;
    let fd = memfd(2 * N * 4096 + 4096);
    let counted = |ch: &mut Channel| -> usize { attr(ch, "host/mappings").parse().unwrap() };
    let (c0, v0) = (counted(&mut ch), vmas());
    for i in 0..N {
        // Every other page: ranges that touch nothing else.
        let off = (2 * i + 1) * 4096;
        let m = share(&mut ch, q, &fd, 0x1000_0000 + off, off, 4096);
        assert!(matches!(m, Message::Ok), "share {i}: {m:?}");
    }
    let (c1, v1) = (counted(&mut ch), vmas());
    assert!(
        v1 - v0 <= c1 - c0,
        "{N} shares cost the host {} kernel mappings; its budget counted {}",
        v1 - v0,
        c1 - c0
    );
}

/// What the miscount lets a flood do: docs/security.md promises the
/// host-wide mapping budget holds for everyone (the host's owner, exempt
/// from the per-user limits, included; two users at `shares_per_uid`
/// reach as far), and that a flood of shares "ends in a clear refusal, not
/// in failed thread creation or ring mapping". Ranges that touch nothing
/// ran the host out of kernel mappings at about half its budget: the
/// flood ended in a failed mmap, and no other client got a queue (its
/// ring could not be mapped) until the flood let go.
#[test]
fn a_flood_of_shares_leaves_room_for_another_clients_queue() {
    let _serial = serial();
    let host = Host::embedded(vec![DeviceConfig::parse_spec("dummy:queues=64").unwrap()]).unwrap();
    let mut ch = common::raw_connect(&host);
    let budget: u64 = attr(&mut ch, "host/mappings_budget").parse().unwrap();
    let fd = memfd(2 * (budget + 64) * 4096);
    let mut refused = None;
    let mut shared = 0u64;
    'flood: while shared <= budget {
        let (q, _fds) = queue(&mut ch, "memcpy");
        for _ in 0..4096 {
            let off = (2 * shared + 1) * 4096;
            match share(&mut ch, q, &fd, 0x1000_0000 + off, off, 4096) {
                Message::Ok => shared += 1,
                Message::Error { message, .. } if message.contains("queue already holds") => {
                    // This queue's own limit: on with another.
                    continue 'flood;
                }
                Message::Error { status, message } => {
                    refused = Some((status, message));
                    break 'flood;
                }
                m => panic!("{m:?}"),
            }
        }
    }
    let (status, message) = refused.expect("the flood was refused");
    eprintln!("after {shared} shares (budget {budget}): {status:?} {message}");
    // Another client, within every limit of its own.
    let answer = another_clients_queue(&host);
    assert!(
        matches!(answer, Message::QueueGranted { .. }),
        "after {shared} shares (budget {budget}; refused: {status:?} {message}), another client's queue: {answer:?}"
    );
    assert!(
        message.contains("max_map_count"),
        "after {shared} shares the refusal was not the budget's: {status:?} {message}"
    );
}

/// A host with the asynchronous memcpy device (which holds copies) and
/// the synchronous one.
fn async_and_sync_copies() -> Host {
    Host::embedded(vec![
        DeviceConfig::new("dummy-async"),
        DeviceConfig::new("dummy"),
    ])
    .unwrap()
}

/// Send `copies` copies of 64 MiB from `src` to `dst` (both shared with
/// `q`) and give the device a moment to take them: how many were sent.
fn send_copies(
    q: &mut wrapdrive::Queue,
    src: &wrapdrive::SharedBuf,
    dst: &wrapdrive::SharedBuf,
    copies: u64,
) -> usize {
    use wd_dummy_msg::CopyMsg;
    let reqs: Vec<_> = (0..copies)
        .map(|i| {
            let d = CopyMsg {
                src: src.addr(),
                dst: dst.addr(),
                len: 64 << 20,
            };
            (d.to_desc(0), i)
        })
        .collect();
    let mut sent = 0;
    while sent < reqs.len() {
        sent += q.send_batch(&reqs[sent..]).unwrap();
    }
    std::thread::sleep(std::time::Duration::from_millis(20));
    sent
}

/// A client (its own connection) whose queue on the asynchronous memcpy
/// device is in deferred invalidation, with `copies` copies of 64 MiB
/// sent (the device holds them) and a small range unshared since: its
/// flush queue is not empty. The queue, its buffers, and the copies sent.
fn holding_copies(
    host: &Host,
    copies: u64,
) -> (wrapdrive::Queue, [wrapdrive::SharedBuf; 3], usize) {
    use wrapdrive::{Capability, FaultPolicy, HostConn, InvalidationMode, SharedBuf};
    const BIG: u64 = 64 << 20;
    let a = HostConn::connect(host.address()).unwrap();
    let mut q = a
        .request_queue(&Capability::new("memcpy-async").depth(copies as u32))
        .unwrap();
    q.set_iommu_policy(InvalidationMode::Deferred, FaultPolicy::Abort)
        .unwrap();
    let bufs = [
        SharedBuf::new(BIG as usize).unwrap(),
        SharedBuf::new(BIG as usize).unwrap(),
        SharedBuf::new(4096).unwrap(),
    ];
    let [src, dst, small] = &bufs;
    q.share(src.addr(), BIG).unwrap();
    q.share(dst.addr(), BIG).unwrap();
    q.share(small.addr(), 4096).unwrap();
    let sent = send_copies(&mut q, src, dst, copies);
    q.unshare(small.addr(), 4096).unwrap();
    (q, bufs, sent)
}

/// A client whose own domain is in deferred mode, with copies held by an
/// asynchronous device, goes back to strict mode: the flush of its flush
/// queue holds the domain's lock while it waits for the held copies, for
/// as long as the client keeps them coming (the IOMMU timer's flush did
/// the same). An attribute listing that shows that queue (its owner's
/// own, or `wd ls` by root) waited for the domain's lock while it held
/// the host's table of queues, and with it every client's queue request
/// and every teardown.
#[test]
fn a_listing_stuck_on_one_clients_flush_does_not_hold_every_queue_request() {
    use std::time::{Duration, Instant};
    use wrapdrive::{Capability, FaultPolicy, HostConn, InvalidationMode};
    let _serial = serial();
    let host = async_and_sync_copies();
    // Client A: deferred invalidation and 256 copies of 64 MiB held.
    let t0 = Instant::now();
    let (mut q, _bufs, sent) = holding_copies(&host, 256);
    // Then strict mode: its flush waits for the held copies (A's own
    // connection waits; nobody else should).
    let a_strict = std::thread::spawn(move || {
        q.set_iommu_policy(InvalidationMode::Strict, FaultPolicy::Abort)
            .unwrap();
        let mut done = 0;
        while done < sent {
            if q.recv_sync(Some(Duration::from_secs(60))).is_ok() {
                done += 1;
            }
        }
        q
    });
    std::thread::sleep(Duration::from_millis(50));
    // A lists its own queues from another connection.
    let lister = {
        let a2 = HostConn::connect(host.address()).unwrap();
        std::thread::spawn(move || {
            let t = Instant::now();
            let n = a2.attrs("").map(|l| l.len()).unwrap_or(0);
            (t.elapsed(), n)
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    // Client B only wants a queue of another device.
    let b = HostConn::connect(host.address()).unwrap();
    let t = Instant::now();
    let qb = b.request_queue(&Capability::new("memcpy"));
    let took = t.elapsed();
    let (listing_took, _) = lister.join().unwrap();
    let _q = a_strict.join().unwrap();
    let held_for = t0.elapsed();
    eprintln!("B's queue took {took:?}; A's listing {listing_took:?}; A's copies {held_for:?}");
    assert!(qb.is_ok());
    assert!(
        took < Duration::from_millis(300),
        "client B's queue request waited {took:?} behind client A's listing ({listing_took:?}; A's held copies took {held_for:?})"
    );
}

/// The IOMMU's timers (flush-queue and stall timeouts) run in one thread
/// for every domain. A client whose own domain is in deferred mode, with
/// copies held by an asynchronous device, has that thread flush its flush
/// queue, and the flush waits for the held copies, for as long as the
/// client keeps them coming: meanwhile no other client's stall times out
/// (its queue stands still behind it) and no other client's deferred
/// unshare is flushed.
#[test]
fn one_clients_held_requests_do_not_stop_the_iommu_timers() {
    use std::time::{Duration, Instant};
    use wd_dummy_msg::CopyMsg;
    use wrapdrive::{Capability, FaultPolicy, HostConn, InvalidationMode, SharedBuf};
    let _serial = serial();
    const COPIES: u64 = 2048;
    let host = async_and_sync_copies();
    // Client B: a request stalled on an address it never shares, which
    // the stall timeout (5 s) aborts.
    let b = HostConn::connect(host.address()).unwrap();
    let mut qb = b.request_queue(&Capability::new("memcpy")).unwrap();
    let (shared, unshared) = (SharedBuf::new(4096).unwrap(), SharedBuf::new(4096).unwrap());
    qb.share(shared.addr(), 4096).unwrap();
    qb.set_iommu_policy(InvalidationMode::Strict, FaultPolicy::Stall)
        .unwrap();
    // Client A: deferred invalidation and copies of 64 MiB held.
    let (mut q, _bufs, sent) = holding_copies(&host, COPIES);
    let drainer = std::thread::spawn(move || {
        let t = Instant::now();
        let mut done = 0;
        while done < sent {
            if q.recv_sync(Some(Duration::from_secs(120))).is_ok() {
                done += 1;
            }
        }
        (t.elapsed(), q)
    });
    // B's request stalls now; its timeout is due in 5 s.
    let t = Instant::now();
    qb.send(
        CopyMsg {
            src: unshared.addr(),
            dst: shared.addr(),
            len: 64,
        }
        .to_desc(0),
        1,
    )
    .unwrap();
    let c = qb.recv_sync(Some(Duration::from_secs(120)));
    let aborted_after = t.elapsed();
    let (a_took, _q) = drainer.join().unwrap();
    eprintln!("B's stall aborted after {aborted_after:?}; A's copies took {a_took:?}");
    assert_eq!(c.map(|c| c.desc.status).ok(), Some(-14));
    assert!(
        aborted_after < Duration::from_secs(7),
        "client B's stalled request (timeout 5 s) was aborted after {aborted_after:?}, when client A's held copies were done ({a_took:?})"
    );
}

/// A client keeping copies held by the `dummy-async` device (its own
/// queue, domain and engine; strict mode): `drain` waits for them.
struct Held {
    q: wrapdrive::Queue,
    _bufs: (wrapdrive::SharedBuf, wrapdrive::SharedBuf),
    sent: usize,
    since: std::time::Instant,
}

impl Held {
    fn start(conn: &std::sync::Arc<wrapdrive::HostConn>, copies: u32) -> Held {
        const BIG: u64 = 64 << 20;
        let mut q = conn
            .request_queue(&wrapdrive::Capability::new("memcpy-async").depth(copies))
            .unwrap();
        let (src, dst) = (
            wrapdrive::SharedBuf::new(BIG as usize).unwrap(),
            wrapdrive::SharedBuf::new(BIG as usize).unwrap(),
        );
        q.share(src.addr(), BIG).unwrap();
        q.share(dst.addr(), BIG).unwrap();
        let since = std::time::Instant::now();
        let sent = send_copies(&mut q, &src, &dst, copies as u64);
        Held {
            q,
            _bufs: (src, dst),
            sent,
            since,
        }
    }

    /// Wait for every copy; how long they were held.
    fn drain(mut self) -> std::time::Duration {
        let mut done = 0;
        while done < self.sent {
            if self
                .q
                .recv_sync(Some(std::time::Duration::from_secs(120)))
                .is_ok()
            {
                done += 1;
            }
        }
        self.since.elapsed()
    }
}

/// A virtio-iommu client that turned bypass off has its queues' endpoints
/// blocked. Moving an endpoint off "blocked" (its release, an ATTACH)
/// synced the whole IOMMU, waiting for every engine that keeps requests
/// held, whoever's they are: another client's copies held its release
/// (and the connection's every later request, and its teardown if it
/// died) for as long as they kept coming. A blocked endpoint translates
/// nothing, so nothing can be held through it.
#[test]
fn releasing_a_blocked_queue_does_not_wait_for_another_clients_held_requests() {
    use std::time::{Duration, Instant};
    let _serial = serial();
    let host = async_and_sync_copies();
    let a = wrapdrive::HostConn::connect(host.address()).unwrap();
    let held = Held::start(&a, 256);
    // Client B: bypass off, a queue (blocked), released.
    let mut b = common::raw_connect(&host);
    let m = b
        .call(
            &Message::VirtioConfig {
                offset: wd_iommu::virtio::CONFIG_BYPASS as u32,
                data: vec![0],
            },
            2,
            &[],
        )
        .unwrap()
        .msg;
    assert!(matches!(m, Message::VirtioConfigReply { .. }), "{m:?}");
    let (q, _fds) = queue(&mut b, "memcpy");
    let t = Instant::now();
    let m = b
        .call(&Message::ReleaseQueue { queue_id: q }, 3, &[])
        .unwrap()
        .msg;
    let took = t.elapsed();
    let a_took = held.drain();
    eprintln!("B's release took {took:?}; A's copies {a_took:?}");
    assert!(matches!(m, Message::Ok), "{m:?}");
    assert!(
        took < Duration::from_millis(300),
        "client B's release waited {took:?} for client A's held copies ({a_took:?})"
    );
}

/// docs/security.md, fair service: an engine does at most `pass_bytes`
/// of work for one queue per pass. The zip device counts a request's work
/// as the input it consumed; a decompression is not cut, and a few KiB of
/// zstd make 64 MiB of output, so a whole batch of them (32 times 64 MiB
/// written) ran in one pass, counted as 32 small requests, before another
/// client's request on the engine was looked at.
#[test]
fn small_requests_do_not_wait_behind_a_batch_of_big_decompressions() {
    use std::time::{Duration, Instant};
    use wd_zip::msg::{Algorithm, Done, OneShot, QUEUE_ALG};
    use wrapdrive::{Capability, HostConn, SharedBuf};
    let _serial = serial();
    const BIG: u64 = 64 << 20;
    const N: usize = 32;
    let host = Host::embedded(vec![DeviceConfig::parse_spec("zip:engines=1").unwrap()]).unwrap();
    let h1 = HostConn::connect(host.address()).unwrap();
    let h2 = HostConn::connect(host.address()).unwrap();
    let cap = Capability::new(QUEUE_ALG).depth(64);
    let mut flood = h1.request_queue(&cap).unwrap();
    let mut small = h2.request_queue(&cap).unwrap();
    let (zeros, packed) = (
        SharedBuf::new(BIG as usize).unwrap(),
        SharedBuf::new(1 << 20).unwrap(),
    );
    flood.share(zeros.addr(), BIG).unwrap();
    flood.share(packed.addr(), 1 << 20).unwrap();
    let one = |compress: bool, src, src_len, dst, dst_len| OneShot {
        compress,
        alg: Algorithm::Zstd,
        level: compress as i8,
        max_ratio: 0,
        src,
        src_len,
        dst,
        dst_len,
        piece: false,
    };
    // 64 MiB of zeros, compressed by the device.
    let c = flood
        .call(one(true, zeros.addr(), BIG, packed.addr(), 1 << 20).to_desc(0))
        .unwrap();
    assert_eq!(c.status, 0);
    let packed_len = Done::from_result(c.result).produced;
    let s = SharedBuf::new(8192).unwrap();
    small.share(s.addr(), 8192).unwrap();
    // The flood: N decompressions of it, 64 MiB each.
    let big = one(false, packed.addr(), packed_len, zeros.addr(), BIG).to_desc(0);
    let reqs: Vec<_> = (0..N as u64).map(|i| (big, i)).collect();
    let t = Instant::now();
    assert_eq!(flood.send_batch(&reqs).unwrap(), N);
    // Under way (a large request's completion is posted at once).
    let mut done = vec![flood.recv_sync(Some(Duration::from_secs(10))).unwrap()];
    let t1 = Instant::now();
    let d = small
        .call(one(true, s.addr(), 64, s.addr() + 4096, 4096).to_desc(9))
        .unwrap();
    let waited = t1.elapsed();
    assert_eq!(d.status, 0);
    flood.recv_batch(&mut done, N).unwrap();
    let before = done.len();
    let t2 = Instant::now();
    while done.len() < N {
        assert!(t2.elapsed() < Duration::from_secs(60));
        flood.recv_batch(&mut done, N).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    let flood_took = t.elapsed();
    eprintln!(
        "{packed_len} bytes of zstd; the small request waited {waited:?} ({before} of {N} decompressions done); the flood took {flood_took:?}"
    );
    assert!(done
        .iter()
        .all(|c| c.desc.status == 0 && Done::from_result(c.desc.result).produced == BIG));
    assert!(
        before < N,
        "all {N} decompressions of 64 MiB ({packed_len} bytes in) ran before one 64-byte request (it waited {waited:?})"
    );
}

/// The roles this binary is re-run in (`wd_testutil::Role`).
#[test]
fn child_entry() {
    use std::io::Write;
    let code = match wd_testutil::role().as_deref() {
        // A host in a process of its own (its descriptor limit is the
        // test's subject), serving until stdin closes.
        Some("host") => {
            // Descriptors open high, with holes below them (others the
            // process closed): kept for its life.
            let mut kept: Vec<std::fs::File> = Vec::new();
            if std::env::var_os("WD_TEST_HOLES").is_some() {
                kept = (0..80)
                    .map(|_| std::fs::File::open("/dev/null").unwrap())
                    .collect();
                kept.drain(..20);
            }
            let cfg = wd_host::HostConfig {
                socket: std::env::var("WD_TEST_SOCKET").unwrap(),
                socket_mode: 0o600,
                devices: vec![DeviceConfig::parse_spec("dummy:queues=64").unwrap()],
                ..wd_host::HostConfig::default()
            };
            let _h = Host::start(&cfg).expect("host starts");
            wd_testutil::report("ready");
            let mut sink = Vec::new();
            let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
            drop(kept);
            0
        }
        _ => return,
    };
    std::io::stdout().flush().unwrap();
    // SAFETY: leave without running the harness's teardown twice.
    #[allow(unsafe_code)]
    unsafe {
        libc::_exit(code)
    };
}

/// The descriptor limit of [`limited_host`].
const LIMIT: u64 = 128;

/// A host in a child process whose descriptor limit is [`LIMIT`] (as
/// `wd serve` under a low `ulimit -n`); with `holes`, 60 descriptors it
/// does not use are open above 20 it closed. Its directory (the socket is
/// `wd.sock` there) and the running role.
fn limited_host(holes: bool) -> (wd_testutil::TempDir, wd_testutil::Role) {
    use std::process::Stdio;
    let d = wd_testutil::tempdir_in(
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")),
        "wd-hostile-nofile",
        0o755,
    );
    let mut c = wd_testutil::Role::command("host");
    c.env("WD_TEST_SOCKET", d.join("wd.sock"))
        .stdin(Stdio::piped())
        .stderr(Stdio::null());
    if holes {
        c.env("WD_TEST_HOLES", "1");
    }
    wd_sys::limit_descriptors_on_exec(&mut c, LIMIT);
    let mut host = wd_testutil::Role::spawn(c);
    assert_eq!(host.read_report(), "ready");
    (d, host)
}

/// The connection check counts the host's open descriptors: it looked at
/// the new socket's number only, which a hole left by closed descriptors
/// keeps low, and let a connection in with fewer than 64 free.
#[test]
fn a_connection_is_refused_near_the_limit_whatever_the_holes() {
    let (d, _host) = limited_host(true);
    let s = std::os::unix::net::UnixStream::connect(d.join("wd.sock")).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let mut ch = Channel::new(s);
    let hello = Message::Hello {
        version: wd_proto::PROTOCOL_VERSION,
        client_pid: 0,
    };
    match ch.call(&hello, 1, &[]).map(|f| f.msg) {
        Ok(Message::Error { status, .. }) => assert_eq!(status, wd_proto::Status::TooManyFiles),
        other => panic!("admitted with fewer than 64 descriptors free: {other:?}"),
    }
}

/// docs/security.md: the host "keeps 64 [descriptors] free", refusing
/// connections near its limit. Queues were not refused there: one client's
/// queues (two descriptors each) took the host's descriptors up to its
/// limit, one more connection took the last ones (the connection check
/// looks at the new socket's number, which a hole left below the limit
/// passes), and a descriptor another client sent with its MemShare could
/// not be installed (MSG_CTRUNC): the host took that for a frame carrying
/// too many descriptors ("frame carries 5 file descriptors, expected 4")
/// and closed that client's connection, its queues with it. The host runs
/// in a child with a descriptor limit of 128 (as `wd serve` under a low
/// `ulimit -n`; the default limits of the host's tables allow 256 queues
/// and 64 connections a user, some 700 descriptors).
#[test]
fn one_clients_queues_do_not_take_the_descriptors_another_client_needs() {
    let (d, host) = limited_host(false);
    let socket = d.join("wd.sock");
    let pid = host.child.id();
    // Descriptors the host has free below its limit (one it inherited may
    // sit above).
    let free = || {
        let used = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .filter(|e| {
                let n = e.as_ref().unwrap().file_name();
                n.to_string_lossy().parse::<u64>().unwrap() < LIMIT
            })
            .count() as u64;
        LIMIT - used
    };
    let connect = || common::hello(std::os::unix::net::UnixStream::connect(&socket).unwrap());
    // Client B: a queue, and memory it will share.
    let mut b = connect();
    let (qb, _fds_b) = queue(&mut b, "memcpy");
    let buf = memfd(4096);
    // Client A: queues until refused, then connections (giving a queue
    // back when refused) until the host has no descriptor left.
    let mut a = connect();
    let request = Message::RequestQueue {
        alg: "memcpy".into(),
        flags: 0,
        depth: 2,
        numa_node: -1,
        probe_addr: 0,
        probe_value: 0,
    };
    let mut mine = Vec::new();
    while let Message::QueueGranted { queue_id, .. } = a.call(&request, 2, &[]).unwrap().msg {
        mine.push(queue_id);
    }
    let mut extra = Vec::new();
    for _ in 0..64 {
        if free() == 0 || mine.is_empty() {
            break;
        }
        if free() >= 3 {
            let s = std::os::unix::net::UnixStream::connect(&socket).unwrap();
            s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
                .unwrap();
            let mut ch = Channel::new(s);
            let hello = Message::Hello {
                version: wd_proto::PROTOCOL_VERSION,
                client_pid: 0,
            };
            if let Ok(Message::HelloReply { .. }) = ch.call(&hello, 1, &[]).map(|f| f.msg) {
                extra.push(ch);
                continue;
            }
        }
        let q = mine.remove(0);
        let m = a
            .call(&Message::ReleaseQueue { queue_id: q }, 3, &[])
            .unwrap()
            .msg;
        assert!(matches!(m, Message::Ok), "{m:?}");
    }
    let left = free();
    // B shares its memory: done, or refused with a status; B keeps its
    // connection and its queue either way.
    let m = share(&mut b, qb, &buf, 0x7000_0000, 0, 4096);
    let alive = b
        .call(
            &Message::GetAttr {
                path: "host/pid".into(),
            },
            5,
            &[],
        )
        .map(|f| f.msg);
    drop(host);
    eprintln!(
        "A: {} queues, {} more connections; {left} descriptors left; B's share: {m:?}",
        mine.len(),
        extra.len()
    );
    assert!(
        matches!(&m, Message::Ok)
            || matches!(&m, Message::Error { status, .. } if *status == wd_proto::Status::TooManyFiles),
        "client B's share with {left} descriptors left by client A: {m:?}"
    );
    assert!(
        matches!(alive, Ok(Message::AttrValue { .. })),
        "client B's connection after its share: {alive:?}"
    );
}
