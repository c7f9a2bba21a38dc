//! Hostile clients against the host's control path, each against a
//! promise of docs/protocol.md or docs/security.md: frames trickled past
//! their deadline, sizes that overflow, descriptors too many, replies not
//! read, values too long to list, names too long to send, another
//! protocol version. The host runs in this process, the clients are raw
//! protocol channels (or a child process that hands its socket over).
#![allow(unsafe_code)]

mod common;

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use wd_host::config::Limits;
use wd_host::{DeviceConfig, Host, HostConfig};
use wd_ipc::Channel;
use wd_proto::{Message, Prot, Status};
use wd_testutil::{tempdir_in, TempDir};

struct TestHost {
    _host: Host,
    socket: String,
    _dir: TempDir,
}

fn start(devices: &[&str], limits: Limits) -> TestHost {
    let d = tempdir_in(Path::new(env!("CARGO_TARGET_TMPDIR")), "wd-control", 0o755);
    let socket = d.join("wd.sock");
    let cfg = HostConfig {
        socket: socket.clone(),
        socket_mode: 0o666,
        devices: devices
            .iter()
            .map(|s| DeviceConfig::parse_spec(s).unwrap())
            .collect(),
        limits,
        ..HostConfig::default()
    };
    TestHost {
        _host: Host::start(&cfg).expect("host starts"),
        socket,
        _dir: d,
    }
}

fn limits(body: &str) -> Limits {
    toml::from_str(body).unwrap()
}

fn connect(socket: &str) -> Channel {
    let s = UnixStream::connect(socket).unwrap();
    // A failing test must not hang in its own recv.
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    Channel::new(s)
}

fn hello(ch: &mut Channel) {
    let f = ch
        .call(
            &Message::Hello {
                version: wd_proto::PROTOCOL_VERSION,
                client_pid: 0,
            },
            1,
            &[],
        )
        .unwrap();
    assert!(matches!(f.msg, Message::HelloReply { .. }), "{:?}", f.msg);
}

/// Ask for a memcpy queue on NUMA node `numa_node`: the answer.
fn ask_queue(ch: &mut Channel, numa_node: i32) -> wd_ipc::Frame {
    ch.call(
        &Message::RequestQueue {
            alg: "memcpy".into(),
            flags: 0,
            depth: 0,
            numa_node,
            probe_addr: 0,
            probe_value: 0,
        },
        2,
        &[],
    )
    .unwrap()
}

fn request_queue(ch: &mut Channel) -> (u32, Vec<OwnedFd>) {
    let f = ask_queue(ch, -1);
    match f.msg {
        Message::QueueGranted { queue_id, .. } => (queue_id, f.fds),
        m => panic!("unexpected {m:?}"),
    }
}

/// A sealed memfd of `size` bytes, as a client shares.
fn memfd(size: u64) -> OwnedFd {
    let fd = wd_sys::memfd_create("control", false).unwrap();
    wd_sys::ftruncate(fd.as_fd(), size).unwrap();
    wd_sys::add_seals(fd.as_fd(), wd_sys::SEAL_SHRINK | wd_sys::SEAL_GROW).unwrap();
    fd
}

fn attr(socket: &str, path: &str) -> String {
    let mut ch = connect(socket);
    hello(&mut ch);
    match ch
        .call(&Message::GetAttr { path: path.into() }, 3, &[])
        .unwrap()
        .msg
    {
        Message::AttrValue { value } => value,
        Message::Error { message, .. } => format!("(error: {message})"),
        m => panic!("unexpected {m:?}"),
    }
}

/// Write `bytes` one at a time, `gap` apart.
fn trickle(sock: &UnixStream, bytes: &[u8], gap: Duration) -> Result<(), std::io::Error> {
    let mut raw = sock.try_clone().unwrap();
    for b in bytes {
        raw.write_all(std::slice::from_ref(b))?;
        std::thread::sleep(gap);
    }
    Ok(())
}

/// docs/protocol.md: "a frame once begun must arrive whole within as long"
/// (limits.hello_timeout_ms): one deadline for the frame. A read timeout
/// per recvmsg let a frame trickled a byte at a time keep the connection
/// thread in recv (deaf to the pidfd) as long as the client liked.
#[test]
fn a_trickled_frame_is_cut_off_like_a_half_sent_one() {
    let host = start(&["dummy"], limits("hello_timeout_ms = 300"));
    let mut ch = connect(&host.socket);
    hello(&mut ch);
    let frame = wd_proto::encode(&Message::ReleaseQueue { queue_id: 9 }, 7).unwrap();
    let t = Instant::now();
    // 20 bytes, 200 ms apart: 4 s for a frame that must arrive within 300 ms.
    let sock = ch.socket().try_clone().unwrap();
    let writer = std::thread::spawn(move || trickle(&sock, &frame, Duration::from_millis(200)));
    let f = ch.recv().expect("a reply or a reason");
    let _ = writer.join();
    let elapsed = t.elapsed();
    match f.msg {
        Message::Error { message, .. } => assert!(
            message.contains("not finished"),
            "the host waited {elapsed:?} for a frame it must cut off after 300 ms, then answered: {message}"
        ),
        m => panic!("unexpected {m:?}"),
    }
}

/// The same before Hello: "A connection must say Hello within
/// limits.hello_timeout_ms"; a Hello trickled over 4 s was answered, so
/// idle connections could hold their slots without limit.
#[test]
fn a_trickled_hello_does_not_outlive_the_hello_deadline() {
    let host = start(&["dummy"], limits("hello_timeout_ms = 300"));
    let mut ch = connect(&host.socket);
    let frame = wd_proto::encode(
        &Message::Hello {
            version: wd_proto::PROTOCOL_VERSION,
            client_pid: 0,
        },
        1,
    )
    .unwrap();
    let t = Instant::now();
    let sock = ch.socket().try_clone().unwrap();
    let writer = std::thread::spawn(move || trickle(&sock, &frame, Duration::from_millis(200)));
    let f = ch.recv().expect("a reply or a reason");
    let _ = writer.join();
    assert!(
        matches!(f.msg, Message::Error { .. }),
        "a Hello that took {:?} (deadline 300 ms) was answered: {:?}",
        t.elapsed(),
        f.msg
    );
}

/// The quota charge of a share is made from the size the client wrote,
/// before the memory is imported; for an exempt user (root, the host's
/// owner: this test's uid) the sum overflowed, and in a build with
/// overflow checks the connection thread panicked: the client got no
/// reply and no EOF, and when it went away its queue, instance and charge
/// stayed for good. Now the share is refused, and the queue goes with the
/// client ("every queue of the connection is torn down ... instance
/// returned").
#[test]
fn an_exempt_users_huge_share_is_refused_not_a_panic() {
    let host = start(&["dummy:queues=4"], Limits::default());
    assert_eq!(attr(&host.socket, MEMCPY_FREE), "4");
    {
        let mut ch = connect(&host.socket);
        hello(&mut ch);
        let (q, _ring) = request_queue(&mut ch);
        let fd = memfd(1 << 20);
        let share = |size| Message::MemShare {
            queue_id: q,
            iova: 0x10_0000,
            size,
            fd_offset: 0,
            prot: Prot::RW,
        };
        let f = ch.call(&share(4096), 4, &[fd.as_fd()]).unwrap();
        assert_eq!(f.msg, Message::Ok);
        let r = ch.call(&share(u64::MAX - 4095), 5, &[fd.as_fd()]);
        match r {
            Ok(f) if matches!(f.msg, Message::Error { .. }) => {}
            other => panic!("a share of u64::MAX - 4095 bytes got no refusal: {other:?}"),
        }
        // The client goes away.
    }
    let uid = wd_sys::geteuid();
    assert_eq!(
        free_once_queues_go(&host),
        "4",
        "the queue's instance was never returned; host/users/{uid}/queues = {}",
        attr(&host.socket, &format!("host/users/{uid}/queues"))
    );
}

/// docs/protocol.md: "each kind says how many [descriptors] it carries
/// ... and a frame with the wrong number is refused". A MemShare carrying
/// two descriptors was accepted (the second stayed queued and was handed
/// to whichever later frame expected one).
#[test]
fn a_frame_with_too_many_descriptors_is_refused() {
    let host = start(&["dummy"], Limits::default());
    let mut ch = connect(&host.socket);
    hello(&mut ch);
    let (q, _ring) = request_queue(&mut ch);
    let a = memfd(1 << 16);
    let b = memfd(1 << 16);
    let bytes = wd_proto::encode(
        &Message::MemShare {
            queue_id: q,
            iova: 0x10_0000,
            size: 4096,
            fd_offset: 0,
            prot: Prot::RW,
        },
        4,
    )
    .unwrap();
    wd_sys::send_with_fds(ch.socket(), &bytes, &[a.as_fd(), b.as_fd()]).unwrap();
    let f = ch.recv().expect("a reply");
    assert!(
        matches!(
            f.msg,
            Message::Error {
                status: Status::Protocol,
                ..
            }
        ),
        "MemShare with 2 descriptors (1 expected) was answered {:?}",
        f.msg
    );
}

/// docs/protocol.md: attribute values are at most MAX_VALUE (256) bytes,
/// and `encode` refuses longer ones. An NVMe namespace whose store path
/// is longer (from the host's configuration) made every full listing
/// (`wd ls`) fail to encode, and the host dropped the asking client's
/// connection, with its queues, without a word. Now the value is cut.
#[test]
fn a_long_attribute_value_does_not_break_every_listing() {
    let d = tempdir_in(
        Path::new(env!("CARGO_TARGET_TMPDIR")),
        "wd-control-longpath",
        0o755,
    );
    let deep = Path::new(&d.0).join("a".repeat(200));
    std::fs::create_dir_all(&deep).unwrap();
    let store = deep.join(format!("{}.img", "b".repeat(100)));
    std::fs::write(&store, b"").unwrap();
    let store = store.display().to_string();
    assert!(store.len() > wd_proto::limits::MAX_VALUE);
    let spec = format!("nvme:engine=sync,ns={store}:0:1M");
    let host = start(&["dummy", &spec], Limits::default());
    let mut ch = connect(&host.socket);
    hello(&mut ch);
    let (_q, _ring) = request_queue(&mut ch);
    let r = ch.call(
        &Message::ListAttrs {
            prefix: String::new(),
        },
        9,
        &[],
    );
    match r {
        Ok(f) => assert!(
            matches!(f.msg, Message::Attrs { .. } | Message::Error { .. }),
            "{:?}",
            f.msg
        ),
        Err(e) => panic!("ListAttrs \"\" with a {}-byte store path: {e}", store.len()),
    }
}

/// The client library's view of the same: a caller's bad input (an
/// attribute path over MAX_PATH, an algorithm name over MAX_NAME) hung
/// the call for good (waiting for the host's answer to a request never
/// sent) instead of returning an error.
#[test]
fn a_client_with_an_overlong_name_gets_an_error_not_a_hang() {
    let host = start(&["dummy"], Limits::default());
    let conn = wrapdrive::HostConn::connect(&host.socket).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let c = conn.clone();
    std::thread::spawn(move || {
        let r = c.request_queue(&wrapdrive::Capability::new(&"m".repeat(65)));
        let _ = tx.send(r.map(|_| ()).map_err(|e| e.to_string()));
    });
    match rx.recv_timeout(Duration::from_secs(3)) {
        Ok(r) => assert!(r.is_err(), "{r:?}"),
        Err(_) => panic!("request_queue with a 65-byte algorithm name blocked for 3 s"),
    }
}

/// Entry point of the re-run roles; does nothing in a normal run.
#[test]
fn child_entry() {
    if wd_testutil::role().as_deref() != Some("passer") {
        return;
    }
    // Connect, take a queue, hand the connection to the test (as a child
    // inherits a socket), and stay alive until stdin closes.
    let mut ch = connect(&std::env::var("WD_TEST_SOCKET").unwrap());
    hello(&mut ch);
    let (_q, _ring) = request_queue(&mut ch);
    let to = UnixStream::connect(std::env::var("WD_TEST_PASS").unwrap()).unwrap();
    wd_sys::send_with_fds(&to, b"x", &[ch.socket().as_fd()]).unwrap();
    let mut sink = Vec::new();
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
    // SAFETY: leave without running the harness's teardown twice.
    unsafe { libc::_exit(0) };
}

/// A queue taken by a child process (the "passer" role), whose
/// connection the child then hands to the test, as a child inherits a
/// socket: the role (its stdin closes to end it) and the connection.
fn passed_connection(host: &TestHost) -> (wd_testutil::Role, UnixStream) {
    let pass = Path::new(&host._dir.0).join("pass.sock");
    let listener = std::os::unix::net::UnixListener::bind(&pass).unwrap();
    let mut c = wd_testutil::Role::command("passer");
    c.env("WD_TEST_SOCKET", &host.socket)
        .env("WD_TEST_PASS", &pass)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null());
    let role = wd_testutil::Role::spawn(c);
    let (from, _) = listener.accept().unwrap();
    let mut b = [0u8; 8];
    let (_, mut fds) = wd_sys::recv_with_fds(&from, &mut b, 4).unwrap();
    (role, UnixStream::from(fds.pop().expect("the connection")))
}

/// The free memcpy instances of a `dummy` device, whose queues a dead
/// client's connection holds until the host notices.
const MEMCPY_FREE: &str = "dev0/mdev_supported_types/dummy-memcpy/available_instances";

/// The free memcpy instances of `host` (with `dummy:queues=4`) once they
/// are all free again, or as many as there are after 3 s.
fn free_once_queues_go(host: &TestHost) -> String {
    let deadline = Instant::now() + Duration::from_secs(3);
    while attr(&host.socket, MEMCPY_FREE) != "4" && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    attr(&host.socket, MEMCPY_FREE)
}

/// docs/protocol.md: "A pidfd ties the queues to the process, not only
/// to the socket: a socket inherited by a child does not keep a dead
/// parent's queues." Replies were sent without a write timeout: once
/// whoever held the socket stopped reading, the thread sat in send, deaf
/// to the pidfd, and the dead process's queue stayed.
#[test]
fn a_dead_clients_queue_goes_even_when_its_socket_is_not_read() {
    let host = start(&["dummy:queues=4"], Limits::default());
    let (mut role, conn) = passed_connection(&host);
    assert_eq!(attr(&host.socket, MEMCPY_FREE), "3");
    // Ask and never read: the host's replies fill the socket, then ours.
    conn.set_nonblocking(true).unwrap();
    let req = wd_proto::encode(
        &Message::ListAttrs {
            prefix: String::new(),
        },
        5,
    )
    .unwrap();
    let mut w = &conn;
    let t = Instant::now();
    while std::env::var("WD_TEST_NO_FLOOD").is_err() {
        match w.write(&req) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if t.elapsed() > Duration::from_secs(1) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("{e}"),
        }
    }
    // The process that connected exits; the socket lives on here.
    drop(role.child.stdin.take());
    let _ = role.child.wait();
    let left = free_once_queues_go(&host);
    drop(conn);
    assert_eq!(
        left, "4",
        "3 s after the client process died its queue is still held (the connection thread is blocked sending to a socket nobody reads)"
    );
}

/// docs/security.md: nothing a user can take is unbounded. Page tables
/// the host builds for a client's virtio-iommu MAP requests were charged
/// to no limit: one shared 4 KiB page mapped at 4096 scattered IOVAs of
/// one virtio domain cost 33 MiB of tables, and every queue could be the
/// endpoint of a domain of its own. Now the tables of a uid's domains
/// share `limits.table_bytes_per_uid`: past it a MAP is NOMEM, the uid's
/// `table_bytes` says what it holds, and it goes back to 0 with the
/// connection.
#[test]
fn virtio_page_tables_are_bounded_per_user() {
    use wrapdrive::virtio::{Request, Status as VStatus, VIRTIO_IOMMU_MAP_F_READ};
    let limit = 1u64 << 20;
    let host = start(
        &["dummy"],
        limits(&format!(
            "table_bytes_per_uid = {limit}\nexempt_owner = false"
        )),
    );
    let uid = wd_sys::geteuid();
    let held = || -> u64 {
        attr(&host.socket, &format!("host/users/{uid}/table_bytes"))
            .parse()
            .unwrap_or(0)
    };
    {
        let conn = wrapdrive::HostConn::connect(&host.socket).unwrap();
        let mut q = conn
            .request_queue(&wrapdrive::Capability::new("memcpy"))
            .unwrap();
        let buf = wrapdrive::SharedBuf::new(4096).unwrap();
        q.share(buf.addr(), 4096).unwrap();
        let st = conn
            .virtio_requests(&[Request::Attach {
                domain: 1,
                endpoint: q.id(),
                flags: 0,
                reserved: [0; 4],
            }])
            .unwrap();
        assert_eq!(st[0], Some(VStatus::Ok));
        let mut refused = 0;
        for chunk in 0..16u64 {
            let reqs: Vec<Request> = (0..256u64)
                .map(|i| {
                    // (From 1: IOVA 0 is reserved.)
                    let n = chunk * 256 + i + 1;
                    let iova = (n % 512) << 39 | (n / 512) << 30;
                    Request::Map {
                        domain: 1,
                        virt_start: iova,
                        virt_end: iova + 4095,
                        phys_start: buf.addr(),
                        flags: VIRTIO_IOMMU_MAP_F_READ,
                    }
                })
                .collect();
            for s in conn.virtio_requests(&reqs).unwrap() {
                match s {
                    Some(VStatus::Ok) => {}
                    Some(VStatus::NoMem) => refused += 1,
                    other => panic!("MAP answered {other:?}"),
                }
            }
        }
        assert!(
            refused > 0,
            "4096 scattered MAPs fit in {limit} bytes of tables"
        );
        let pages: u64 = attr(
            &host.socket,
            &format!("dev0/queues/q{}/iommu/table_pages", q.id()),
        )
        .parse()
        .unwrap();
        assert!(pages * 4096 <= limit, "{pages} table pages");
        let h = held();
        assert!(h > 0 && h <= limit, "table_bytes {h}");
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while held() != 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(held(), 0, "the tables went with the connection");
}

/// A domain's root table is charged to its owner's budget like any table
/// page: with the budget spent, neither a queue (its own domain) nor a
/// virtio-iommu domain is made (each domain's root chunk, 32 KiB, was
/// granted whatever the budget said). A move between domains at the edge
/// is not refused.
#[test]
fn a_domains_root_is_charged_to_its_owners_table_budget() {
    use wrapdrive::virtio::{Request, Status as VStatus};
    // The least budget there is: 32 roots' chunks (8 table pages each).
    let limit = 1u64 << 20;
    let host = start(
        &["dummy"],
        limits(&format!(
            "table_bytes_per_uid = {limit}\nexempt_owner = false"
        )),
    );
    let conn = wrapdrive::HostConn::connect(&host.socket).unwrap();
    let memcpy = wrapdrive::Capability::new("memcpy");
    let mut queues = Vec::new();
    let e = loop {
        match conn.request_queue(&memcpy) {
            Ok(q) => queues.push(q),
            Err(e) => break e,
        }
        assert!(queues.len() <= 32, "a queue past the table budget");
    };
    assert_eq!(queues.len(), 32);
    assert_eq!(e.status(), wrapdrive::Status::Quota, "{e}");
    let uid = wd_sys::geteuid();
    let held = attr(&host.socket, &format!("host/users/{uid}/table_bytes"));
    assert_eq!(held, limit.to_string());
    let first = queues[0].id();
    let attach = |domain| {
        conn.virtio_requests(&[Request::Attach {
            domain,
            endpoint: first,
            flags: 0,
            reserved: [0; 4],
        }])
        .unwrap()[0]
    };
    assert_eq!(
        attach(1),
        Some(VStatus::NoMem),
        "a domain past the table budget"
    );
    // One queue fewer: room for one root again.
    queues.pop();
    assert_eq!(attach(1), Some(VStatus::Ok));
    // At the edge, a move that empties the endpoint's domain frees the
    // root the new domain needs (it was refused; DETACH then ATTACH was
    // not), and the budget is where it was.
    assert_eq!(attach(2), Some(VStatus::Ok), "a move at the budget's edge");
    assert_eq!(
        attr(&host.socket, &format!("host/users/{uid}/table_bytes")),
        limit.to_string()
    );
    assert_eq!(attach(1), Some(VStatus::Ok), "and back");
}

/// docs/protocol.md: status Version (EPROTONOSUPPORT) is "the peer speaks
/// another protocol version". A client of another version writes its
/// version in the frame header as well as in Hello; the header is checked
/// first, and was refused as a plain protocol error (-EPROTO).
#[test]
fn a_client_of_another_protocol_version_reads_version() {
    let host = start(&["dummy"], Limits::default());
    let mut ch = connect(&host.socket);
    let mut frame = wd_proto::encode(
        &Message::Hello {
            version: 2,
            client_pid: 0,
        },
        1,
    )
    .unwrap();
    frame[4..6].copy_from_slice(&2u16.to_le_bytes());
    let mut raw = ch.socket().try_clone().unwrap();
    raw.write_all(&frame).unwrap();
    match ch.recv().expect("a refusal").msg {
        Message::Error { status, message } => assert_eq!(
            status,
            Status::Version,
            "a version-2 Hello was refused as {status:?}: {message}"
        ),
        m => panic!("unexpected {m:?}"),
    }
}

/// A queue asked for a NUMA node below -1 is refused (Invalid, answered
/// on the request, the connection kept): it was granted as "any node".
#[test]
fn a_numa_node_below_minus_one_is_refused() {
    let host = start(&["dummy"], Limits::default());
    let mut ch = connect(&host.socket);
    hello(&mut ch);
    let f = ask_queue(&mut ch, -2);
    assert_eq!(f.request_id, 2);
    match f.msg {
        Message::Error { status, message } => {
            assert_eq!(status, Status::Invalid, "{message}");
            assert!(message.contains("numa_node"), "{message}");
        }
        m => panic!("unexpected {m:?}"),
    }
    request_queue(&mut ch);
}

/// docs/protocol.md: "when the process exits (kill -9 included) or the
/// socket closes, every queue of the connection is torn down"; DESIGN.md:
/// "no queue outlives its process". The connection thread looked at the
/// pidfd only when no frame was buffered: whoever holds an inherited
/// socket and keeps requests coming faster than the host answers them
/// (reading every reply) kept the dead process's queue for as long as it
/// liked.
#[test]
fn a_dead_clients_queue_goes_even_while_its_socket_keeps_sending() {
    let host = start(&["dummy:queues=4"], Limits::default());
    let (mut role, conn) = passed_connection(&host);
    assert_eq!(attr(&host.socket, MEMCPY_FREE), "3");

    let stop = Arc::new(AtomicBool::new(false));
    // Every reply is read at once: the host never waits to send.
    let mut rd = conn.try_clone().unwrap();
    rd.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let st = stop.clone();
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        while !st.load(Ordering::Relaxed) {
            match rd.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => break,
            }
        }
    });
    // Requests, always some ahead of the host.
    let mut wr = conn.try_clone().unwrap();
    wr.set_write_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let st = stop.clone();
    let writer = std::thread::spawn(move || {
        // Large frames (a virtio-iommu kick of requests it refuses): a
        // read of the host ends inside one almost always.
        let kick = Message::VirtioKick {
            requests: (0..wd_proto::limits::MAX_VIRTIO_REQS)
                .map(|_| wd_proto::VirtioReq {
                    readable: vec![0; wd_proto::limits::MAX_VIRTIO_READABLE],
                    writable_len: 0,
                })
                .collect(),
        };
        let one = wd_proto::encode(&kick, 5).unwrap();
        // Writes that end inside a frame: the host, once it caught up,
        // always holds the start of the next one.
        let len = one.len();
        let stream: Vec<u8> = one.iter().copied().cycle().take(len * 4).collect();
        let mut phase = 0usize; // stream offset within a frame
        while !st.load(Ordering::Relaxed) {
            let want = len + (len / 2 + len - phase) % len;
            match wr.write(&stream[phase..phase + want]) {
                Ok(n) => phase = (phase + n) % len,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => break,
            }
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    // The process that connected exits; its socket lives on here.
    drop(role.child.stdin.take());
    let _ = role.child.wait();
    let left = free_once_queues_go(&host);
    stop.store(true, Ordering::Relaxed);
    let _ = conn.shutdown(std::net::Shutdown::Both);
    reader.join().unwrap();
    writer.join().unwrap();
    assert_eq!(
        left, "4",
        "3 s after the client process died its queue is still held (the connection thread never looked at the pidfd while frames were buffered)"
    );
}

/// docs/protocol.md: "a reply must be read within as long
/// [limits.hello_timeout_ms], or the host closes the connection (with its
/// queues)". The write timeout bounded each `sendmsg` call, not the reply:
/// a reader taking a large reply a little at a time (each call moving
/// some bytes) kept the connection thread in send, deaf to the pidfd, for
/// as long as the reply took; here a dead process's queues stay while
/// whoever inherited its socket reads one 1 MiB reply slowly.
#[test]
fn a_dead_clients_queue_goes_even_while_a_reply_is_read_slowly() {
    let host = start(&["dummy:queues=4"], Limits::default());
    let (mut role, conn) = passed_connection(&host);
    // The inherited connection asks for a legacy queue of its own.
    let mut ch = Channel::new(conn.try_clone().unwrap());
    let f = ch
        .call(
            &Message::RequestQueue {
                alg: "memcpy".into(),
                flags: wd_proto::CAPA_ALLOW_LEGACY,
                depth: 0,
                numa_node: -1,
                probe_addr: 0,
                probe_value: 0,
            },
            3,
            &[],
        )
        .unwrap();
    let Message::QueueGranted { queue_id, .. } = f.msg else {
        panic!("{:?}", f.msg)
    };
    assert_eq!(attr(&host.socket, MEMCPY_FREE), "2");
    // A 1 MiB copy through the socket: a 1 MiB reply.
    let len = wd_proto::limits::MAX_PAYLOAD as u64;
    let desc = wd_dummy_msg::CopyMsg {
        src: 0,
        dst: 0,
        len,
    }
    .to_desc(1);
    ch.send(
        &Message::Legacy {
            queue_id,
            desc: desc.to_bytes().to_vec(),
            payload: vec![7; len as usize],
        },
        4,
        &[],
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // The process that connected exits; its socket lives on here.
    drop(role.child.stdin.take());
    let _ = role.child.wait();
    // The reply is read 16 KiB every 100 ms (about 6 s for all of it).
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let mut rd = conn.try_clone().unwrap();
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 16 << 10];
        let mut got = 0usize;
        while !st.load(Ordering::Relaxed) {
            match rd.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        got
    });
    let left = free_once_queues_go(&host);
    stop.store(true, Ordering::Relaxed);
    let _ = conn.shutdown(std::net::Shutdown::Both);
    let got = reader.join().unwrap();
    assert_eq!(
        left, "4",
        "3 s after the client process died its queues are still held: the connection thread is still sending a reply read slowly ({got} bytes read)"
    );
}

/// Clear O_NONBLOCK on `fd`: on a descriptor received over the socket
/// this changes the open file description the host shares.
fn make_blocking(fd: &OwnedFd) {
    use std::os::fd::AsRawFd;
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        let fl = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        assert!(fl >= 0);
        assert_eq!(
            libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK),
            0
        );
    }
}

/// A host with one engine and a client of it (the victim of the tests
/// below) whose copy has been served once: the host, the connection, the
/// queue, its buffer and the copy to send again.
fn victim_on_one_engine() -> (
    Host,
    std::sync::Arc<wrapdrive::HostConn>,
    wrapdrive::Queue,
    wrapdrive::SharedBuf,
    wrapdrive::Desc,
) {
    use wd_dummy_msg::CopyMsg;
    use wrapdrive::{Capability, HostConn, SharedBuf};
    let host = Host::embedded(vec![DeviceConfig::parse_spec("dummy:engines=1").unwrap()]).unwrap();
    let hc = HostConn::connect(host.address()).unwrap();
    let mut victim = hc
        .request_queue(&Capability::new("memcpy").depth(8))
        .unwrap();
    let buf = SharedBuf::new(8192).unwrap();
    victim.share(buf.addr(), 8192).unwrap();
    let copy = CopyMsg {
        src: buf.addr(),
        dst: buf.addr() + 4096,
        len: 64,
    }
    .to_desc(0);
    assert_eq!(victim.call(copy).unwrap().status, 0);
    (host, hc, victim, buf, copy)
}

/// docs/security.md: "no client can crash the host, and no user can lock
/// the others out". The wake-up descriptors a client gets were eventfds
/// whose open file descriptions the host shared: a client that cleared
/// O_NONBLOCK on its completion eventfd and filled its counter made the
/// engine's next signal of it block in write(2) for good, and every other
/// client's queue on that engine stopped. Now they are ends of wake lines
/// (datagram socket pairs, sent and received with MSG_DONTWAIT): a client
/// that makes its ends blocking and floods both lines (the doorbell's is
/// every client's on the engine) stops nothing.
#[test]
fn a_client_cannot_stop_its_engine_through_its_wake_lines() {
    let (host, hc, mut victim, buf, copy) = victim_on_one_engine();

    // The attacker: both its ends blocking, both lines flooded (a send
    // on its completion end goes to the host's end, which never reads),
    // and a ring that says it waits for completions.
    const DEPTH: u32 = 8;
    let (_ch, fds, map) = common::raw_queue(&host, "memcpy", DEPTH);
    // SAFETY: map is a live mapping of ring_bytes that outlives the view.
    let mut view = unsafe { wd_ring::RingView::attach(map.as_ptr(), map.len(), DEPTH) }.unwrap();
    for fd in &fds[1..] {
        use std::os::fd::AsRawFd;
        make_blocking(fd);
        let max: u64 = u64::MAX - 1;
        // (Into an eventfd, as these were, this write fills its counter.)
        // SAFETY: writes 8 bytes from a valid u64.
        let r = unsafe { libc::write(fd.as_raw_fd(), (&max as *const u64).cast(), 8) };
        assert_eq!(r, 8);
        for _ in 0..100_000 {
            // SAFETY: sends 8 bytes from a valid u64.
            let r = unsafe {
                libc::send(
                    fd.as_raw_fd(),
                    (&max as *const u64).cast(),
                    8,
                    libc::MSG_DONTWAIT,
                )
            };
            if r < 0 {
                break;
            }
        }
    }
    view.client_prepare_wait();
    assert_eq!(view.submit(&[wd_ring::Desc::default()]).unwrap(), 1);
    if view.engine_needs_wakeup() {
        wd_sys::wake(fds[1].as_fd()).unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));

    // The victim's next copy must still be served.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = victim.call(copy).map(|d| d.status);
        let _ = tx.send(r.map_err(|e| e.to_string()));
        // (Leaked on purpose when the engine hangs: dropping it would
        // wait for the engine too.)
        std::mem::forget(victim);
    });
    let got = rx.recv_timeout(Duration::from_secs(3));
    if !matches!(got, Ok(Ok(0))) {
        // The host cannot be torn down: its engine is stuck, and every
        // teardown (and every new queue, anywhere on the host) waits for
        // it. Leave it to the process's exit.
        std::mem::forget((host, hc, buf, _ch, fds, map, view));
        panic!(
            "another client's copy was not served within 3 s ({got:?}): the engine is blocked on the attacker's wake lines"
        );
    }
}

/// docs/protocol.md: "A malformed frame gets an `Error` reply naming the
/// problem ..., then the host closes the connection"; a frame with the
/// wrong number of descriptors is refused. A frame sent with more than
/// MAX_FDS descriptors in one `sendmsg` was dropped with the connection
/// without a word (the receive failed as a system call error).
#[test]
fn a_frame_with_more_than_max_fds_descriptors_gets_an_error() {
    let host = start(&["dummy"], Limits::default());
    let mut ch = connect(&host.socket);
    hello(&mut ch);
    let (q, _ring) = request_queue(&mut ch);
    let fds: Vec<OwnedFd> = (0..wd_proto::limits::MAX_FDS + 1)
        .map(|_| wd_sys::eventfd().unwrap())
        .collect();
    let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
    let bytes = wd_proto::encode(
        &Message::MemShare {
            queue_id: q,
            iova: 0x10_0000,
            size: 4096,
            fd_offset: 0,
            prot: wd_proto::Prot::RW,
        },
        4,
    )
    .unwrap();
    wd_sys::send_with_fds(ch.socket(), &bytes, &borrowed).unwrap();
    let f = ch.recv();
    assert!(
        matches!(
            &f,
            Ok(wd_ipc::Frame {
                msg: Message::Error {
                    status: wd_proto::Status::Protocol,
                    ..
                },
                ..
            })
        ),
        "a frame with {} descriptors was answered {f:?}",
        wd_proto::limits::MAX_FDS + 1
    );
}

/// docs/security.md: "no user can lock the others out". A doorbell
/// line's ringing end that every queue of an engine got a duplicate of
/// was one socket, whose state any client could change for all:
/// shutdown(2) made every other client's doorbell fail (EPIPE), and
/// connect(AF_UNSPEC) left it without a peer (ENOTCONN). Each queue now
/// has its own line. `attack` is done to the attacker's doorbell end; then
/// another client's copies must each be served in time.
fn victim_survives(attack: impl FnOnce(&OwnedFd)) {
    let (host, _hc, mut victim, _buf, copy) = victim_on_one_engine();

    let (_ch, fds, _map) = common::raw_queue(&host, "memcpy", 8);
    attack(&fds[1]);
    // Let the engine fall asleep, so the victim must ring it.
    std::thread::sleep(Duration::from_millis(300));
    for i in 0..5 {
        let t0 = std::time::Instant::now();
        let r = victim.call(copy).map(|d| d.status);
        let took = t0.elapsed();
        assert!(
            matches!(r, Ok(0)) && took < Duration::from_millis(300),
            "copy {i} of another client after the attack on the shared doorbell: {r:?} in {took:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_client_shutting_down_its_doorbell_does_not_stop_others() {
    victim_survives(|fd| {
        let fd = std::os::fd::AsRawFd::as_raw_fd(fd);
        // SAFETY: shutdown(2) on a descriptor we own.
        let r = unsafe { libc::shutdown(fd, libc::SHUT_WR) };
        assert_eq!(r, 0);
    });
}

#[test]
fn a_client_disconnecting_its_doorbell_does_not_stop_others() {
    victim_survives(|fd| {
        // SAFETY: connect(2) with an AF_UNSPEC address (dissolves the
        // datagram socket's association).
        let r = unsafe {
            let mut a: libc::sockaddr = std::mem::zeroed();
            a.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
            libc::connect(
                std::os::fd::AsRawFd::as_raw_fd(fd),
                &a,
                std::mem::size_of::<libc::sa_family_t>() as libc::socklen_t,
            )
        };
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
        let _ = fd.as_fd();
    });
}
