//! Hostile clients against the host's control path, each a promise of
//! docs/protocol.md or docs/security.md that a client could break.
#![allow(unsafe_code)]

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
use wd_proto::Message;
use wd_testutil::{tempdir_in, TempDir};

struct TestHost {
    _host: Host,
    socket: String,
    _dir: TempDir,
}

fn start(devices: &[&str], limits: Limits) -> TestHost {
    let d = tempdir_in(Path::new(env!("CARGO_TARGET_TMPDIR")), "wd-hostile", 0o755);
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

fn connect(socket: &str) -> Channel {
    let s = UnixStream::connect(socket).unwrap();
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

fn request_queue(ch: &mut Channel) -> (u32, Vec<OwnedFd>) {
    let f = ch
        .call(
            &Message::RequestQueue {
                alg: "memcpy".into(),
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
        m => panic!("unexpected {m:?}"),
    }
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

/// Entry point of the re-run roles; does nothing in a normal run.
#[test]
fn child_entry() {
    if wd_testutil::role().as_deref() != Some("passer") {
        return;
    }
    // Connect, take a queue, hand the connection over (as a child inherits
    // a socket), and stay alive until stdin closes.
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

/// docs/protocol.md: "when the process exits (kill -9 included) or the
/// socket closes, every queue of the connection is torn down"; DESIGN.md:
/// "no queue outlives its process". The connection thread looked at the
/// pidfd only when no frame was buffered: whoever holds an inherited
/// socket and keeps requests coming faster than the host answers them
/// (reading every reply) kept the dead process's queue for as long as it
/// liked.
#[test]
fn a_dead_clients_queue_goes_even_while_its_socket_keeps_sending() {
    use std::os::unix::net::UnixListener;
    let host = start(&["dummy:queues=4"], Limits::default());
    let avail = "dev0/mdev_supported_types/dummy-memcpy/available_instances";
    let pass = Path::new(&host._dir.0).join("pass.sock");
    let listener = UnixListener::bind(&pass).unwrap();
    let mut c = wd_testutil::Role::command("passer");
    c.env("WD_TEST_SOCKET", &host.socket)
        .env("WD_TEST_PASS", &pass)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null());
    let mut role = wd_testutil::Role::spawn(c);
    let (from, _) = listener.accept().unwrap();
    let mut b = [0u8; 8];
    let (_, mut fds) = wd_sys::recv_with_fds(&from, &mut b, 4).unwrap();
    let conn = UnixStream::from(fds.pop().expect("the connection"));
    assert_eq!(attr(&host.socket, avail), "3");

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
    let deadline = Instant::now() + Duration::from_secs(3);
    while attr(&host.socket, avail) != "4" && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left = attr(&host.socket, avail);
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
    use std::os::unix::net::UnixListener;
    let host = start(&["dummy:queues=4"], Limits::default());
    let avail = "dev0/mdev_supported_types/dummy-memcpy/available_instances";
    let pass = Path::new(&host._dir.0).join("pass.sock");
    let listener = UnixListener::bind(&pass).unwrap();
    let mut c = wd_testutil::Role::command("passer");
    c.env("WD_TEST_SOCKET", &host.socket)
        .env("WD_TEST_PASS", &pass)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null());
    let mut role = wd_testutil::Role::spawn(c);
    let (from, _) = listener.accept().unwrap();
    let mut b = [0u8; 8];
    let (_, mut fds) = wd_sys::recv_with_fds(&from, &mut b, 4).unwrap();
    let conn = UnixStream::from(fds.pop().expect("the connection"));
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
    assert_eq!(attr(&host.socket, avail), "2");
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
    let deadline = Instant::now() + Duration::from_secs(3);
    while attr(&host.socket, avail) != "4" && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left = attr(&host.socket, avail);
    stop.store(true, Ordering::Relaxed);
    let _ = conn.shutdown(std::net::Shutdown::Both);
    let got = reader.join().unwrap();
    assert_eq!(
        left, "4",
        "3 s after the client process died its queues are still held: the connection thread is still sending a reply read slowly ({got} bytes read)"
    );
}

/// A queue of `alg` on `host` for a client writing its ring by hand: its
/// control channel, descriptors (ring, doorbell, completion event) and
/// ring mapping.
fn raw_queue(host: &Host, alg: &str, depth: u32) -> (Channel, Vec<OwnedFd>, wd_sys::Mapping) {
    use std::os::linux::net::SocketAddrExt;
    let name = host.address().strip_prefix('@').expect("abstract address");
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let mut ch = Channel::new(UnixStream::connect_addr(&addr).unwrap());
    hello(&mut ch);
    let f = ch
        .call(
            &Message::RequestQueue {
                alg: alg.into(),
                flags: 0,
                depth,
                numa_node: -1,
                probe_addr: 0,
                probe_value: 0,
            },
            2,
            &[],
        )
        .unwrap();
    let Message::QueueGranted { ring_bytes, .. } = f.msg else {
        panic!("{:?}", f.msg)
    };
    let map = wd_sys::Mapping::map_shared(f.fds[0].as_fd(), 0, ring_bytes as usize).unwrap();
    (ch, f.fds, map)
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
    use wd_dummy_msg::CopyMsg;
    use wrapdrive::{Capability, HostConn, SharedBuf};
    let host = Host::embedded(vec![DeviceConfig::parse_spec("dummy:engines=1").unwrap()]).unwrap();
    // The victim, on the same (only) engine.
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

    // The attacker: both its ends blocking, both lines flooded (a send
    // on its completion end goes to the host's end, which never reads),
    // and a ring that says it waits for completions.
    const DEPTH: u32 = 8;
    let (_ch, fds, map) = raw_queue(&host, "memcpy", DEPTH);
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
