//! What one NVMe client can do to the host's other clients (each test
//! failed before its fix).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use wd_host::{DeviceConfig, Host, HostConfig};
use wd_nvme_driver::msg::IoOp;
use wd_nvme_driver::{Controller, Options};
use wd_testutil::tempdir;
use wrapdrive::{Capability, HostConn, SharedBuf};

/// The NVMe controller reports the memory its transfers on the I/O ring
/// hold (`Service::holds_from`), and the engine pinned it as held through
/// "a domain not known" (tag 0): every IOMMU sync of the host, whatever
/// its domain, waited for that engine's pin to move on. One client that
/// keeps its controllers' rings full of O_DIRECT transfers made every
/// other client's unshare (and detach, ATTACH, queue release) wait for
/// the oldest of them, for as long as it kept them coming. The memory of
/// a controller is reached through its queue's domain only: the syncs of
/// other domains need not wait.
#[test]
fn another_clients_unshare_does_not_wait_for_nvme_transfers() {
    const MIB: u64 = 1 << 20;
    // Each keeps 255 reads of 256 KiB on its ring.
    const CONTROLLERS: usize = 4;
    let dir = tempdir("wd-nvme-others");
    let socket = dir.join("wd.sock");
    let store = dir.join("store.img");
    // Written data: O_DIRECT reads of it reach the disk.
    std::fs::write(&store, vec![0x3c; CONTROLLERS * (16 << 20)]).unwrap();
    // A namespace each (a namespace is private to its controller).
    let namespaces: Vec<String> = (0..CONTROLLERS)
        .map(|i| format!("ns={store}:{}M:16M", i * 16))
        .collect();
    let cfg = HostConfig {
        socket: socket.clone(),
        socket_mode: 0o666,
        devices: vec![
            DeviceConfig::parse_spec(&format!("nvme:engine=io_uring,{}", namespaces.join(",")))
                .unwrap(),
            DeviceConfig::new("dummy"),
        ],
        ..HostConfig::default()
    };
    let _host = Host::start(&cfg).expect("host starts");
    // Client A: controllers whose I/O rings stay full of 256 KiB reads.
    let stop = Arc::new(AtomicBool::new(false));
    let (started, up) = std::sync::mpsc::channel();
    let a = {
        let (stop, socket) = (stop.clone(), socket.clone());
        std::thread::spawn(move || {
            let conn = HostConn::connect(&socket).unwrap();
            let buf = SharedBuf::new(256 << 10).unwrap();
            let mut ctls = Vec::new();
            let mut n = 0u64;
            for i in 0..CONTROLLERS {
                let mut c = Controller::open(&conn, &Options::default()).unwrap();
                let ns = c.open_namespace(i as u32 + 1).unwrap();
                c.share(&buf).unwrap();
                let q = c.create_io_queue(256).unwrap();
                ctls.push((c, ns, q));
            }
            let mut push = |q: &mut wd_nvme_driver::IoQueue, ns: &wd_nvme_driver::Namespace| {
                let slba = (n * 64) % (16 * MIB / 4096 - 64);
                n += 1;
                q.push_rw(IoOp::Read, ns, slba, buf.addr(), 256 << 10)
                    .unwrap();
            };
            for (_, ns, q) in &mut ctls {
                for _ in 0..255 {
                    push(q, ns);
                }
                q.pair().ring().unwrap();
            }
            started.send(()).unwrap();
            let mut done = Vec::new();
            let mut reads = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for (_, ns, q) in &mut ctls {
                    done.clear();
                    q.pair().reap(&mut done).unwrap();
                    for c in &done {
                        assert!(c.status.is_success(), "{:?}", c.status);
                        push(q, ns);
                    }
                    reads += done.len() as u64;
                    if !done.is_empty() {
                        q.pair().ring().unwrap();
                    }
                }
                // The rings stay full (their reads take far longer): no
                // need to take a core from the others.
                std::thread::sleep(Duration::from_millis(1));
            }
            // Let the rest finish before the memory goes.
            let t = Instant::now();
            for (_, _, q) in &mut ctls {
                while q.pair().in_flight() > 0 && t.elapsed() < Duration::from_secs(30) {
                    done.clear();
                    q.pair().reap(&mut done).unwrap();
                }
            }
            reads
        })
    };
    if up.recv_timeout(Duration::from_secs(60)).is_err() {
        a.join().unwrap();
        panic!("client A did not start");
    }
    std::thread::sleep(Duration::from_millis(200));
    // Client B: shares and unshares a buffer of its memcpy queue.
    let conn = HostConn::connect(&socket).unwrap();
    let mut q = conn.request_queue(&Capability::new("memcpy")).unwrap();
    let buf = SharedBuf::new(64 << 10).unwrap();
    let mut worst = Duration::ZERO;
    let mut total = Duration::ZERO;
    let rounds = 200;
    for _ in 0..rounds {
        q.share(buf.addr(), 64 << 10).unwrap();
        let t = Instant::now();
        q.unshare(buf.addr(), 64 << 10).unwrap();
        let took = t.elapsed();
        worst = worst.max(took);
        total += took;
    }
    stop.store(true, Ordering::Relaxed);
    let reads = a.join().unwrap();
    eprintln!(
        "B's unshares: worst {worst:?}, mean {:?}; A's reads {reads}",
        total / rounds
    );
    assert!(
        total / rounds < Duration::from_millis(5),
        "client B's unshares took {:?} on average (worst {worst:?}): each waited for client A's NVMe transfers",
        total / rounds
    );
}
