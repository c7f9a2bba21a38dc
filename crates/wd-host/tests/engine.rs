//! The engine against clients that misuse their queues: one that stops
//! reaping completions must not keep a core busy, and one that floods an
//! asynchronous device with huge requests must not hold the other queues
//! of its engine for longer than a pass's budget.
#![allow(unsafe_code)]

mod common;

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use wd_dummy_msg::CopyMsg;
use wd_host::{DeviceConfig, Host};
use wrapdrive::{Capability, HostConn, SharedBuf, CAPA_SHARE_ALL};

/// The tests run one at a time: each host's first engine thread has the
/// same name, and one test measures its engine's CPU time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// CPU seconds used so far by this process's threads named `name`.
fn thread_cpu(name: &str) -> f64 {
    let mut total = 0.0;
    for e in std::fs::read_dir("/proc/self/task").unwrap() {
        let p = e.unwrap().path();
        let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        let s = std::fs::read_to_string(p.join("stat")).unwrap();
        let rest = &s[s.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        // utime and stime are fields 14 and 15 (11 and 12 after the name).
        let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
        // SAFETY: sysconf has no preconditions.
        total += ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    }
    total
}

/// CPU seconds per second of the first device's engine thread over `d`.
fn engine_load(d: Duration) -> f64 {
    let before = thread_cpu("wd-dev0-e0");
    std::thread::sleep(d);
    (thread_cpu("wd-dev0-e0") - before) / d.as_secs_f64()
}

/// A register-driven queue (NVMe) never takes from its ring, yet the
/// engine counted an entry a client wrote there as work before sleeping:
/// one entry kept the engine spinning for as long as the queue lived.
#[test]
fn a_ring_entry_on_a_register_driven_queue_does_not_keep_the_engine_busy() {
    let _serial = serial();
    let dir = wd_testutil::tempdir("wd-engine-nvme-ring");
    let store = dir.join("ns.img");
    let spec = format!("nvme:engine=sync,engines=1,ns={store}:0:1M");
    let host = Host::embedded(vec![DeviceConfig::parse_spec(&spec).unwrap()]).unwrap();
    const DEPTH: u32 = 8;
    let (_ch, fds, map) = common::raw_queue(&host, "nvme", DEPTH);
    // SAFETY: map is a live mapping of ring_bytes that outlives the view.
    let mut view = unsafe { wd_ring::RingView::attach(map.as_ptr(), map.len(), DEPTH) }.unwrap();
    // The engine goes to sleep (an idle NVMe queue spins 0.5 s first).
    std::thread::sleep(Duration::from_millis(1500));
    let idle = engine_load(Duration::from_secs(1));
    assert_eq!(view.submit(&[wd_ring::Desc::default()]).unwrap(), 1);
    if view.engine_needs_wakeup() {
        wd_sys::wake(fds[1].as_fd()).unwrap();
    }
    std::thread::sleep(Duration::from_millis(1500));
    let after = engine_load(Duration::from_secs(1));
    eprintln!("engine load idle: {idle:.2}, with one ring entry on an NVMe queue: {after:.2}");
    assert!(idle < 0.2, "engine busy while idle: {idle:.2}");
    assert!(
        after < 0.2,
        "the engine spun ({after:.2} s of CPU per second) on a ring entry its queue never takes"
    );
}

/// A client writing its ring by hand fills the completion ring, never
/// reaps, and submits one more request: the host took the first ones, so
/// the submission ring has room, the completion ring none. The engine
/// used to count that request as work and never slept.
#[test]
fn a_client_that_stops_reaping_does_not_keep_its_engine_busy() {
    let _serial = serial();
    let host = Host::embedded(vec![DeviceConfig::new("dummy")]).unwrap();
    const DEPTH: u32 = 8;
    let (_ch, fds, map) = common::raw_queue(&host, "memcpy", DEPTH);
    // SAFETY: map is a live mapping of ring_bytes that outlives the view.
    let mut view = unsafe { wd_ring::RingView::attach(map.as_ptr(), map.len(), DEPTH) }.unwrap();
    let ring = |view: &wd_ring::RingView| {
        if view.engine_needs_wakeup() {
            wd_sys::wake(fds[1].as_fd()).unwrap();
        }
    };
    let nop = [wd_ring::Desc::default(); DEPTH as usize];
    assert_eq!(view.submit(&nop).unwrap(), DEPTH as usize);
    ring(&view);
    wd_testutil::wait_until("the host to take the first requests", || {
        view.completions_ready()
    });
    std::thread::sleep(Duration::from_millis(300));
    let idle = engine_load(Duration::from_secs(1));
    assert_eq!(view.submit(&nop[..1]).unwrap(), 1);
    ring(&view);
    std::thread::sleep(Duration::from_millis(300));
    let waiting = engine_load(Duration::from_secs(1));
    eprintln!(
        "engine load with a full completion ring: {idle:.2}, and a request waiting: {waiting:.2}"
    );
    assert!(idle < 0.2, "engine busy with nothing to do: {idle:.2}");
    assert!(
        waiting < 0.2,
        "the engine spun ({waiting:.2} s of CPU per second) on a request it had no room to complete"
    );
    // Once the client reaps, the request is served (at the latest when
    // the engine's sleep times out: the client rang no doorbell).
    let mut out = [wd_ring::Desc::default(); DEPTH as usize];
    assert_eq!(view.reap(&mut out), DEPTH as usize);
    wd_testutil::wait_until("the last request's completion", || view.completions_ready());
}

/// One client floods an engine with 32 MiB copies between memory it never
/// shared (a SHARE_ALL queue: the device cannot hold that memory), another
/// sends a 64-byte copy. On the asynchronous device each huge copy ran
/// whole in `start`, a batch of them in one pass, and the small request
/// waited for all sixteen; now they run in pieces within the pass budget,
/// as on the synchronous device.
#[test]
fn a_flood_on_an_asynchronous_device_does_not_hold_its_engine() {
    let _serial = serial();
    for (device, alg) in [("dummy-async", "memcpy-async"), ("dummy", "memcpy")] {
        flood(device, alg);
    }
}

fn flood(device: &str, alg: &str) {
    let spec = DeviceConfig::parse_spec(&format!("{device}:engines=1")).unwrap();
    let host = Host::embedded(vec![spec]).unwrap();
    let h1 = HostConn::connect(host.address()).unwrap();
    let h2 = HostConn::connect(host.address()).unwrap();
    let mut flood = h1
        .request_queue(&Capability::new(alg).depth(16).flags(CAPA_SHARE_ALL))
        .unwrap();
    let mut small = h2.request_queue(&Capability::new(alg).depth(16)).unwrap();
    const BIG: usize = 32 << 20;
    let a = vec![7u8; BIG];
    let mut b = vec![0u8; BIG];
    let s = SharedBuf::new(8192).unwrap();
    small.share(s.addr(), 8192).unwrap();
    let big = CopyMsg {
        src: a.as_ptr() as u64,
        dst: b.as_mut_ptr() as u64,
        len: BIG as u64,
    }
    .to_desc(0);
    // What one huge copy costs alone.
    let t = Instant::now();
    let d = flood.call(big).unwrap();
    assert_eq!((d.status, d.result), (0, BIG as u64));
    let one = t.elapsed();
    assert!(b.iter().all(|&x| x == 7), "{device}: the copy is wrong");
    b.fill(0);

    let reqs: Vec<_> = (0..16).map(|i| (big, i)).collect();
    assert_eq!(flood.send_batch(&reqs).unwrap(), 16);
    let t = Instant::now();
    let d = small
        .call(
            CopyMsg {
                src: s.addr(),
                dst: s.addr() + 4096,
                len: 64,
            }
            .to_desc(99),
        )
        .unwrap();
    let waited = t.elapsed();
    assert_eq!(d.status, 0);
    let mut done = Vec::new();
    flood.recv_batch(&mut done, 16).unwrap();
    let before_small = done.len();
    let t = Instant::now();
    while done.len() < 16 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{device}: copies lost"
        );
        flood.recv_batch(&mut done, 16).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(done
        .iter()
        .all(|c| c.desc.status == 0 && c.desc.result == BIG as u64));
    assert!(
        b.iter().all(|&x| x == 7),
        "{device}: a copy in pieces is wrong"
    );
    eprintln!("{device}: one {BIG}-byte copy {one:?}; the 64-byte request waited {waited:?}, {before_small} of 16 copies done before it");
    assert!(
        before_small < 16,
        "{device}: all 16 huge copies ran before one 64-byte request (it waited {waited:?}; one copy takes {one:?})"
    );
    assert!(
        waited < one * 2 + wd_device::dummy_async::HOLD * 2,
        "{device}: the 64-byte request waited {waited:?}, ~{:.0} huge copies of {one:?}",
        waited.as_secs_f64() / one.as_secs_f64()
    );
}

/// A request that stalls holds its queue: the next part of its session,
/// sent after it, waits for it, so the digest covers both parts in order.
/// It used to run at once, and the final part came back with status 0 and
/// the digest of its own data alone.
#[test]
fn a_stalled_request_is_not_overtaken() {
    use wd_sec::msg::{DigestOp, SessionNew, F_DIGEST_FINAL, F_INIT};
    use wd_sec::{Alg, Hash};
    use wrapdrive::{FaultPolicy, InvalidationMode};
    let _serial = serial();
    let host = Host::embedded(vec![DeviceConfig::new("sec")]).unwrap();
    let h = HostConn::connect(host.address()).unwrap();
    let mut q = h.request_queue(&Capability::new("digest")).unwrap();
    let d = q
        .call(SessionNew::new(Alg::Digest(Hash::Sha256), &[], 0).encode())
        .unwrap();
    assert_eq!(d.status, 0);
    let session = d.result;
    let (a, b, out) = (
        SharedBuf::new(4096).unwrap(),
        SharedBuf::new(4096).unwrap(),
        SharedBuf::new(4096).unwrap(),
    );
    a.write(0, &[0xaa; 4096]);
    b.write(0, &[0xbb; 4096]);
    q.share(a.addr(), 4096).unwrap();
    q.share(out.addr(), 4096).unwrap();
    q.set_iommu_policy(InvalidationMode::Strict, FaultPolicy::Stall)
        .unwrap();
    let part = |flags, src| {
        DigestOp {
            session,
            alg: None,
            flags,
            src,
            len: 4096,
            out: out.addr(),
        }
        .encode()
    };
    // b is not shared yet: its part stalls; a's final part comes after.
    q.send(part(F_INIT, b.addr()), 1).unwrap();
    q.send(part(F_DIGEST_FINAL, a.addr()), 2).unwrap();
    let mut seq = None;
    wd_testutil::wait_until("the stall", || {
        seq = q.faults(8).unwrap().events.first().map(|e| e.seq);
        seq.is_some()
    });
    // Time for the engine to run what follows, if it would.
    std::thread::sleep(Duration::from_millis(100));
    q.share(b.addr(), 4096).unwrap();
    q.resume_fault(seq.unwrap(), true).unwrap();
    let mut got = Vec::new();
    for _ in 0..2 {
        let c = q.recv_sync(Some(Duration::from_secs(5))).unwrap();
        got.push((c.cookie, c.desc.status));
    }
    assert_eq!(got, [(1, 0), (2, 0)], "completions out of order");
    let mut both = vec![0xbb; 4096];
    both.extend_from_slice(&[0xaa; 4096]);
    assert_eq!(out.read_vec(0, 32), openssl_sha256(&both));
}

fn openssl_sha256(data: &[u8]) -> Vec<u8> {
    let mut c = wd_sec::evp::DigestCtx::new(wd_sec::Hash::Sha256).unwrap();
    c.update(data).unwrap();
    let mut out = [0u8; 64];
    let n = c.finish(&mut out).unwrap();
    out[..n].to_vec()
}

/// A stalled request holds its queue, and the requests sent behind it are
/// not work the engine can do: it sleeps until the stall is resolved
/// (it spun a core meanwhile).
#[test]
fn an_engine_sleeps_behind_a_stalled_request() {
    use wrapdrive::{FaultPolicy, InvalidationMode};
    let _serial = serial();
    let host = Host::embedded(vec![DeviceConfig::new("dummy")]).unwrap();
    let h = HostConn::connect(host.address()).unwrap();
    let mut q = h
        .request_queue(&Capability::new("memcpy").depth(16))
        .unwrap();
    let a = SharedBuf::new(8192).unwrap();
    let b = SharedBuf::new(4096).unwrap();
    q.share(a.addr(), 8192).unwrap();
    q.set_iommu_policy(InvalidationMode::Strict, FaultPolicy::Stall)
        .unwrap();
    let copy = |src, dst| CopyMsg { src, dst, len: 64 }.to_desc(0);
    // From b, not shared: it stalls.
    q.send(copy(b.addr(), a.addr()), 1).unwrap();
    let mut seq = None;
    wd_testutil::wait_until("the stall", || {
        seq = q.faults(8).unwrap().events.first().map(|e| e.seq);
        seq.is_some()
    });
    q.send(copy(a.addr(), a.addr() + 4096), 2).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let load = engine_load(Duration::from_secs(1));
    q.share(b.addr(), 4096).unwrap();
    q.resume_fault(seq.unwrap(), true).unwrap();
    for cookie in [1, 2] {
        let c = q.recv_sync(Some(Duration::from_secs(5))).unwrap();
        assert_eq!((c.cookie, c.desc.status), (cookie, 0));
    }
    assert!(
        load < 0.2,
        "the engine spun ({load:.2} s of CPU per second) behind a stalled request"
    );
}

/// On a SHARE_ALL queue memory is reached only as it is used, so a digest
/// through the bounce path can fault after hashing part of its data. The
/// request then fails with -EIO (no stall: a retry would hash that part
/// twice) and its message is lost: a continuation is refused, a new
/// message is right. It used to stall, and the retry completed with
/// status 0 and a wrong digest.
#[test]
fn a_share_all_digest_that_faults_half_way_loses_its_message() {
    use wd_sec::msg::{DigestOp, SessionNew, F_DIGEST_FINAL, F_INIT};
    use wd_sec::{Alg, Hash};
    use wrapdrive::{FaultPolicy, InvalidationMode};
    const LEN: usize = 1 << 20;
    const HOLE: usize = 768 << 10;
    let _serial = serial();
    let mut cfg = wd_host::HostConfig {
        socket: format!("@wd-engine-test-{}", std::process::id()),
        socket_mode: 0o600,
        devices: vec![DeviceConfig::new("sec")],
        ..wd_host::HostConfig::default()
    };
    // A pass long enough for several bounce chunks of 256 KiB.
    cfg.limits.pass_bytes = 1 << 20;
    let host = Host::start(&cfg).unwrap();
    let h = HostConn::connect(host.address()).unwrap();
    let mut q = h
        .request_queue(&Capability::new("digest").flags(CAPA_SHARE_ALL))
        .unwrap();
    let d = q
        .call(SessionNew::new(Alg::Digest(Hash::Sha256), &[], 0).encode())
        .unwrap();
    assert_eq!(d.status, 0);
    let session = d.result;
    let data: Vec<u8> = (0..LEN).map(|i| (i * 7 + i / 4096) as u8).collect();
    // SAFETY: a fresh private anonymous mapping, nobody else's memory.
    let buf = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(buf, libc::MAP_FAILED);
    let buf = buf.cast::<u8>();
    // SAFETY: the mapping is LEN bytes, writable, and ours.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf, LEN) };
    // Written by the host through this process's memory.
    let mut out = vec![0u8; 64];
    let out_addr = out.as_mut_ptr() as u64;
    let op = |flags, src: u64, len: usize| {
        DigestOp {
            session,
            alg: None,
            flags,
            src,
            len: len as u64,
            out: out_addr,
        }
        .encode()
    };
    let head = vec![5u8; 4096];
    assert_eq!(
        q.call(op(F_INIT, head.as_ptr() as u64, 4096))
            .unwrap()
            .status,
        0
    );
    q.set_iommu_policy(InvalidationMode::Strict, FaultPolicy::Stall)
        .unwrap();
    // The last quarter goes: three bounce chunks are hashed, the fourth
    // faults.
    // SAFETY: the tail of our own mapping; nothing refers to it.
    assert_eq!(unsafe { libc::munmap(buf.add(HOLE).cast(), LEN - HOLE) }, 0);
    let c = q
        .call(op(0, buf as u64, LEN))
        .expect("completes, does not stall");
    assert_eq!(c.status, -5, "EIO");
    // SAFETY: what is left of our mapping.
    assert_eq!(unsafe { libc::munmap(buf.cast(), HOLE) }, 0);
    assert_eq!(
        q.call(op(F_DIGEST_FINAL, 0, 0)).unwrap().status,
        -22,
        "EINVAL"
    );
    let whole = data.as_ptr() as u64;
    assert_eq!(
        q.call(op(F_INIT, head.as_ptr() as u64, 4096))
            .unwrap()
            .status,
        0
    );
    assert_eq!(q.call(op(F_DIGEST_FINAL, whole, LEN)).unwrap().status, 0);
    let mut all = head.clone();
    all.extend_from_slice(&data);
    std::hint::black_box(&mut out);
    assert_eq!(&out[..32], &openssl_sha256(&all)[..]);
}

/// Two 64 KiB AES-CBC encryptions of two sessions sent together to a
/// `sec` device using intel-ipsec-mb (engine=auto where it is installed):
/// both come back -EIO (the library's burst takes less than 64 KiB per
/// message), a batch of each alone or of shorter ones works.
#[test]
fn two_64_kib_cbc_encryptions_sent_together_match_openssl() {
    use wd_sec::msg::{CipherOp, SessionNew, F_ENCRYPT, F_IV};
    use wd_sec::Alg;
    if wd_sec::SecDriver::new(wd_sec::EngineChoice::IpsecMb).is_err() {
        wd_testutil::skip(
            "two_64_kib_cbc_encryptions_sent_together_match_openssl",
            "no intel-ipsec-mb",
        );
        return;
    }
    let host = Host::embedded(vec![
        DeviceConfig::parse_spec("sec:engine=ipsec-mb").unwrap()
    ])
    .unwrap();
    let h = HostConn::connect(host.address()).unwrap();
    let mut q = h
        .request_queue(&Capability::new("cipher").depth(16))
        .unwrap();
    let alg = Alg::by_name("aes-128-cbc").unwrap();
    const N: usize = 64 << 10;
    let buf = SharedBuf::new(4 * N).unwrap();
    q.share(buf.addr(), 4 * N as u64).unwrap();
    let mut reqs = Vec::new();
    let mut want = Vec::new();
    for k in 0..2u8 {
        let key = [k + 1; 16];
        let d = q.call(SessionNew::new(alg, &key, 0).encode()).unwrap();
        assert_eq!(d.status, 0);
        let data: Vec<u8> = (0..N).map(|i| (i as u8).wrapping_mul(k + 3)).collect();
        let at = buf.addr() + (2 * k as usize * N) as u64;
        buf.write(2 * k as u64 * N as u64, &data);
        let op = CipherOp {
            session: d.result,
            flags: F_ENCRYPT | F_IV,
            src: at,
            dst: at + N as u64,
            len: N as u64,
            iv: [7; 16],
            iv_len: 16,
            aad: 0,
            aad_len: 0,
            tag: 0,
            tag_len: 0,
        };
        reqs.push((op.encode(), k as u64));
        let mut c = wd_sec::evp::CipherCtx::new(alg).unwrap();
        c.init(Some(&key), Some(&[7; 16]), true).unwrap();
        let mut out = vec![0u8; N];
        c.update(&mut out, &data).unwrap();
        want.push(out);
    }
    assert_eq!(q.send_batch(&reqs).unwrap(), 2);
    let mut got = Vec::new();
    for _ in 0..2 {
        let c = q.recv_sync(Some(Duration::from_secs(5))).unwrap();
        got.push((c.cookie, c.desc.status));
    }
    got.sort();
    assert_eq!(
        got,
        vec![(0, 0), (1, 0)],
        "statuses of two 64 KiB CBC encryptions sent together"
    );
    for (k, w) in want.iter().enumerate() {
        assert!(buf.read_vec((2 * k * N + N) as u64, N) == *w);
    }
}
