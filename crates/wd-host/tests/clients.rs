//! The host facing real client processes (this test binary re-run as a
//! client, see `child_entry`) and hostile ones: a queue dies with its
//! process (kill -9 included), clients cannot reach each other's memory,
//! malformed control messages, ring indices and descriptors cost only their
//! sender, attributes are everyone's to read and the owner's to write.
//!
//! The host runs in this process, on a private socket; the clients are the
//! `wrapdrive` library, here or in a child.
#![allow(unsafe_code)]

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use wd_dummy_msg::CopyMsg;
use wd_host::{DeviceConfig, Host, HostConfig};
use wd_testutil::{report, tempdir, wait_until, Role, TempDir};
use wrapdrive::{Capability, HostConn, SharedBuf, Status};

/// A host in this process on a private socket, owning `device` (a `wd
/// serve --device` spec), open to every user (clients may run as other
/// uids); stopped before its directory goes.
struct TestHost {
    _host: Host,
    socket: String,
    _dir: TempDir,
}

impl TestHost {
    fn conn(&self) -> Arc<HostConn> {
        HostConn::connect(&self.socket).expect("connect")
    }
}

fn start_host(device: &str) -> TestHost {
    let dir = tempdir("wd-test-host");
    let socket = dir.join("wd.sock");
    let cfg = HostConfig {
        socket: socket.clone(),
        socket_mode: 0o666,
        devices: vec![DeviceConfig::parse_spec(device).unwrap()],
        ..HostConfig::default()
    };
    TestHost {
        _host: Host::start(&cfg).expect("host starts"),
        socket,
        _dir: dir,
    }
}

fn attr(h: &HostConn, path: &str) -> String {
    h.get_attr(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

const AVAIL: &str = "dev0/mdev_supported_types/dummy-memcpy/available_instances";

fn queue_paths(h: &HostConn) -> Vec<String> {
    h.attrs("dev0/queues/")
        .unwrap()
        .into_iter()
        .filter(|e| e.path.ends_with("/pid"))
        .map(|e| e.path)
        .collect()
}

/// This test binary re-run as a client process playing `role`.
fn client(role: &str, socket: &str) -> std::process::Command {
    let mut c = Role::command(role);
    c.env("WD_HOST", socket);
    c
}

/// Entry point of client processes; does nothing in a normal test run.
#[test]
fn child_entry() {
    let Some(role) = wd_testutil::role() else {
        return;
    };
    let h = HostConn::from_env().expect("child connects");
    match role.as_str() {
        // Hold a queue with shared memory and requests in flight, then wait
        // to be killed.
        "busy" => {
            let mut q = h
                .request_queue(&Capability::new("memcpy").depth(64))
                .unwrap();
            let a = SharedBuf::new(1 << 20).unwrap();
            let b = SharedBuf::new(1 << 20).unwrap();
            q.share(a.addr(), a.len()).unwrap();
            q.share(b.addr(), b.len()).unwrap();
            let d = CopyMsg {
                src: a.addr(),
                dst: b.addr(),
                len: 1 << 20,
            }
            .to_desc(0);
            let reqs: Vec<_> = (0..64).map(|i| (d, i)).collect();
            q.send_batch(&reqs).unwrap();
            report("ready");
            loop {
                // Keep the queue full of work until killed.
                let mut v = Vec::new();
                let _ = q.recv_batch(&mut v, 64);
                let again: Vec<_> = v.iter().map(|c| (d, c.cookie)).collect();
                let _ = q.send_batch(&again);
            }
        }
        // Share a secret and report its address; wait for stdin to close.
        "secret" => {
            let mut q = h.request_queue(&Capability::new("memcpy")).unwrap();
            let s = SharedBuf::new(4096).unwrap();
            s.write(0, b"TOP-SECRET-OF-A");
            q.share(s.addr(), s.len()).unwrap();
            report(&s.addr().to_string());
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
        }
        // Read attributes, try to write one (as another uid).
        "reader" => {
            let v = h.get_attr("dev0/priority").unwrap();
            let set = h.set_attr("dev0/priority", "9");
            let st = set.err().map(|e| e.status());
            report(&format!("{v} {st:?}"));
        }
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn capability_listing_and_exhaustion() {
    let host = start_host("dummy:queues=2");
    let h = host.conn();
    assert_eq!(attr(&h, AVAIL), "2");
    assert_eq!(
        attr(&h, "dev0/mdev_supported_types/dummy-memcpy/device_api"),
        "1"
    );
    assert_eq!(attr(&h, "dev0/driver"), "dummy");
    let q1 = h.request_queue(&Capability::new("memcpy")).unwrap();
    let q2 = h.request_queue(&Capability::new("memcpy")).unwrap();
    assert_eq!(attr(&h, AVAIL), "0");
    let e = h.request_queue(&Capability::new("memcpy")).unwrap_err();
    assert_eq!(e.status(), Status::Busy, "{e}");
    assert!(e.to_string().contains("in use"), "{e}");
    let e = h.request_queue(&Capability::new("sha999")).unwrap_err();
    assert_eq!(e.status(), Status::NoDevice);
    assert_eq!(queue_paths(&h).len(), 2);
    q1.release().unwrap();
    assert_eq!(attr(&h, AVAIL), "1");
    let _q3 = h.request_queue(&Capability::new("memcpy")).unwrap();
    drop(q2);
    assert_eq!(attr(&h, AVAIL), "1");
}

#[test]
fn kill_9_with_requests_in_flight_leaves_nothing() {
    let host = start_host("dummy:queues=4,engines=2");
    let h = host.conn();
    for round in 0..5 {
        let mut c = Role::spawn(client("busy", &host.socket));
        assert_eq!(c.read_report(), "ready", "round {round}");
        assert_eq!(attr(&h, AVAIL), "3");
        assert_eq!(queue_paths(&h).len(), 1);
        // SAFETY: plain kill(2) of our own child.
        unsafe { libc::kill(c.pid(), libc::SIGKILL) };
        c.child.wait().unwrap();
        wait_until("queue teardown", || {
            attr(&h, AVAIL) == "4" && queue_paths(&h).is_empty()
        });
    }
    // The host still serves.
    let mut q = h.request_queue(&Capability::new("memcpy")).unwrap();
    assert_eq!(q.call(wrapdrive::Desc::default()).unwrap().status, 0);
}

#[test]
fn clients_cannot_reach_each_others_memory() {
    let host = start_host("dummy");
    let mut c = client("secret", &host.socket);
    c.stdin(Stdio::piped());
    let mut a = Role::spawn(c);
    let secret_addr: u64 = a.read_report().parse().unwrap();

    let h = host.conn();
    let mut q = h.request_queue(&Capability::new("memcpy")).unwrap();
    let dst = SharedBuf::new(4096).unwrap();
    q.share(dst.addr(), dst.len()).unwrap();
    // Guess A's IOVA exactly, and around it.
    for guess in [
        secret_addr,
        secret_addr + 16,
        secret_addr & !0xfff,
        secret_addr.wrapping_sub(4096),
    ] {
        let d = q
            .call(
                CopyMsg {
                    src: guess,
                    dst: dst.addr(),
                    len: 15,
                }
                .to_desc(0),
            )
            .unwrap();
        let got = dst.to_vec();
        assert!(
            !got.starts_with(b"TOP-SECRET-OF-A"),
            "read another client's memory at {guess:#x}"
        );
        if dst.addr() & !0xfff != guess & !0xfff {
            assert_eq!(d.status, -14, "guess {guess:#x} must fault");
        }
    }
    let f = q.faults(16).unwrap();
    assert!(
        f.total >= 3
            && f.events
                .iter()
                .any(|e| e.iova == secret_addr && e.reason == wd_proto::FaultReason::Unmapped)
    );
    assert!(
        attr(&h, &format!("dev0/queues/q{}/faults", q.id()))
            .parse::<u64>()
            .unwrap()
            >= 3
    );
    drop(a.child.stdin.take());
    a.child.wait().unwrap();
}

#[test]
fn malformed_control_messages_get_a_status() {
    let host = start_host("dummy");
    let read_error = |s: &mut UnixStream| -> Option<Status> {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = vec![0u8; 4096];
        let mut got = Vec::new();
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        match wd_proto::decode_frame(&got) {
            Ok((_, wd_proto::Message::Error { status, .. })) => Some(status),
            _ => None,
        }
    };
    // Garbage instead of a header.
    let mut s = UnixStream::connect(&host.socket).unwrap();
    s.write_all(&[0xff; 64]).unwrap();
    assert_eq!(read_error(&mut s), Some(Status::Protocol));
    // Wrong protocol version.
    let mut s = UnixStream::connect(&host.socket).unwrap();
    let mut hello = wd_proto::encode(
        &wd_proto::Message::Hello {
            version: 1,
            client_pid: 1,
        },
        1,
    )
    .unwrap();
    hello[4] = 99;
    s.write_all(&hello).unwrap();
    assert_eq!(read_error(&mut s), Some(Status::Version));
    // A huge announced body.
    let mut s = UnixStream::connect(&host.socket).unwrap();
    let mut big = hello.clone();
    big[4] = 1;
    big[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
    s.write_all(&big).unwrap();
    assert_eq!(read_error(&mut s), Some(Status::TooBig));
    // A request before Hello.
    let mut s = UnixStream::connect(&host.socket).unwrap();
    s.write_all(
        &wd_proto::encode(
            &wd_proto::Message::ListAttrs {
                prefix: String::new(),
            },
            1,
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(read_error(&mut s), Some(Status::Protocol));
    // The host is fine.
    assert_eq!(attr(&host.conn(), "dev0/driver"), "dummy");
}

#[test]
fn corrupt_ring_indices_stop_only_that_queue() {
    let host = start_host("dummy");
    let sock = UnixStream::connect(&host.socket).unwrap();
    let mut ch = wd_ipc::Channel::new(sock);
    ch.call(
        &wd_proto::Message::Hello {
            version: 1,
            client_pid: 0,
        },
        1,
        &[],
    )
    .unwrap();
    let f = ch
        .call(
            &wd_proto::Message::RequestQueue {
                alg: "memcpy".into(),
                flags: 0,
                depth: 8,
                numa_node: -1,
                probe_addr: 0,
                probe_value: 0,
            },
            2,
            &[],
        )
        .unwrap();
    let wd_proto::Message::QueueGranted {
        queue_id,
        ring_bytes,
        ..
    } = f.msg
    else {
        panic!("{:?}", f.msg)
    };
    let map = wd_sys::Mapping::map_shared(f.fds[0].as_fd(), 0, ring_bytes as usize).unwrap();
    // SAFETY: map is a live mapping of ring_bytes that outlives the view.
    let mut view = unsafe { wd_ring::RingView::attach(map.as_ptr(), map.len(), 8) }.unwrap();
    // A completion head far ahead of what the host posted: the host finds
    // it when the ring looks full to it and it re-reads the head.
    view.poke_index("cq_head", 1_000_000);
    let h = host.conn();
    wait_until("queue marked broken", || {
        let _ = view.submit(&[wrapdrive::Desc::default(); 8]);
        wd_sys::wake(f.fds[1].as_fd()).unwrap();
        attr(&h, &format!("dev0/queues/q{queue_id}/state")) == "broken"
    });
    assert_eq!(view.host_state(), wd_ring::HostState::Broken);
    // Other clients are served.
    let mut q = h.request_queue(&Capability::new("memcpy")).unwrap();
    assert_eq!(q.call(wrapdrive::Desc::default()).unwrap().status, 0);
}

#[test]
fn attributes_readable_by_all_writable_by_owner() {
    let host = start_host("dummy");
    let h = host.conn();
    h.set_attr("dev0/priority", "7").unwrap();
    assert_eq!(attr(&h, "dev0/priority"), "7");
    assert_eq!(
        h.set_attr("dev0/priority", "x").unwrap_err().status(),
        Status::Invalid
    );
    assert_eq!(
        h.set_attr("dev0/driver", "x").unwrap_err().status(),
        Status::Permission
    );
    assert_eq!(
        h.set_attr("dev9/priority", "1").unwrap_err().status(),
        Status::NotFound
    );
    if !wd_testutil::root_or_skip(
        "attributes_readable_by_all_writable_by_owner (other-uid half)",
        "to run a client as nobody",
    ) {
        return;
    }
    let mut c = client("reader", &host.socket);
    c.uid(65534).gid(65534);
    let out = c.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("7 Some(Permission)"), "child said: {text}");
    assert_eq!(attr(&h, "dev0/priority"), "7");
}

#[test]
fn malformed_descriptors_complete_with_a_status() {
    let host = start_host("dummy");
    let h = host.conn();
    let mut q = h
        .request_queue(&Capability::new("memcpy").depth(64))
        .unwrap();
    let buf = SharedBuf::new(8192).unwrap();
    q.share(buf.addr(), buf.len()).unwrap();
    // Deterministic xorshift: every field random, lengths and addresses
    // sometimes plausible.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let known = [0, -14, -22, -90, -95];
    for round in 0..2000u64 {
        let mut d = wrapdrive::Desc {
            opcode: (next() % 4) as u16,
            flags: if next() % 4 == 0 { next() as u16 } else { 0 },
            reserved: if next() % 8 == 0 { next() } else { 0 },
            status: next() as i32,
            result: next(),
            ..Default::default()
        };
        for chunk in d.payload.chunks_mut(8) {
            let v = match next() % 4 {
                0 => buf.addr() + next() % 8192,
                1 => next() % 16384,
                2 => 0,
                _ => next(),
            };
            chunk.copy_from_slice(&v.to_le_bytes()[..chunk.len()]);
        }
        let done = q.call(d).unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert!(
            known.contains(&done.status),
            "round {round}: unexpected status {}",
            done.status
        );
    }
    // The host survived and still serves this queue and others.
    let good = CopyMsg {
        src: buf.addr(),
        dst: buf.addr() + 4096,
        len: 4096,
    };
    assert_eq!(q.call(good.to_desc(0)).unwrap().status, 0);
    let mut q2 = h.request_queue(&Capability::new("memcpy")).unwrap();
    assert_eq!(q2.call(wrapdrive::Desc::default()).unwrap().status, 0);
}
