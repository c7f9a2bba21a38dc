//! A host the client cannot trust (a fake one here): a ring it could
//! shrink is refused, and a bogus completion loses none of the others.
#![allow(unsafe_code)]

use std::os::fd::AsFd;
use std::os::unix::net::UnixListener;

use wd_ipc::Channel;
use wd_proto::Message;
use wd_ring::{RingLayout, RingView};
use wrapdrive::{Capability, HostConn};

fn fake_host(path: &str, truncate: bool) {
    let listener = UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(s) = s else { return };
            std::thread::spawn(move || {
                let mut ch = Channel::new(s);
                while let Ok(f) = ch.recv() {
                    match f.msg {
                        Message::Hello { .. } => ch
                            .send(
                                &Message::HelloReply {
                                    version: wd_proto::PROTOCOL_VERSION,
                                    host_pid: std::process::id(),
                                    features: 0,
                                },
                                f.request_id,
                                &[],
                            )
                            .unwrap(),
                        Message::RequestQueue { .. } => {
                            let layout = RingLayout::new(64).unwrap();
                            let total = layout.total_bytes().next_multiple_of(4096);
                            let memfd = wd_sys::memfd_create("ring", false).unwrap();
                            wd_sys::ftruncate(memfd.as_fd(), total as u64).unwrap();
                            let map = wd_sys::Mapping::map_shared(memfd.as_fd(), 0, total).unwrap();
                            // SAFETY: a fresh mapping of `total` bytes.
                            unsafe { RingView::create(map.as_ptr(), total, layout) }.unwrap();
                            if truncate {
                                // The hostile part: the memory vanishes.
                                wd_sys::ftruncate(memfd.as_fd(), 0).unwrap();
                            } else {
                                wd_sys::add_seals(
                                    memfd.as_fd(),
                                    wd_sys::SEAL_SHRINK | wd_sys::SEAL_GROW,
                                )
                                .unwrap();
                            }
                            // The host's ends kept until the connection ends.
                            let (bell, e1) = wd_sys::wake_line().unwrap();
                            let (cq, e2) = wd_sys::wake_line().unwrap();
                            let _ends = (bell, cq);
                            ch.send(
                                &Message::QueueGranted {
                                    queue_id: 1,
                                    device: "dev0".into(),
                                    device_api: 1,
                                    depth: 64,
                                    desc_size: 64,
                                    ring_bytes: total as u64,
                                    flags: 0,
                                },
                                f.request_id,
                                &[memfd.as_fd(), e1.as_fd(), e2.as_fd()],
                            )
                            .unwrap();
                            if !truncate {
                                // SAFETY: the host side of the ring just formatted.
                                let mut v =
                                    unsafe { RingView::attach(map.as_ptr(), total, 64) }.unwrap();
                                let mut got = Vec::new();
                                while got.len() < 2 {
                                    v.fetch(8, &mut got).unwrap();
                                    std::thread::yield_now();
                                }
                                let mut bogus = got[0];
                                bogus.tag = 999;
                                v.complete(&[bogus, got[0], got[1]]).unwrap();
                                std::mem::forget(map);
                            }
                        }
                        _ => ch.send(&Message::Ok, f.request_id, &[]).unwrap(),
                    }
                }
            });
        }
    });
}

/// A ring memfd the host did not seal, and truncated: refused as a
/// protocol error (the client died of SIGBUS at its first touch).
#[test]
fn a_ring_the_host_can_shrink_is_refused() {
    let dir = wd_testutil::tempdir("wd-hostile-ring");
    let path = dir.join("fake.sock");
    fake_host(&path, true);
    let sock = path.clone();
    // SAFETY: the child uses the library and _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let code = match HostConn::connect(&sock)
            .and_then(|h| h.request_queue(&Capability::new("memcpy")))
        {
            Err(e) if e.status() == wrapdrive::Status::Protocol => 0,
            _ => 1,
        };
        // SAFETY: forked child.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status),
        "the client died of signal {} on a hostile host's ring",
        libc::WTERMSIG(status)
    );
    assert_eq!(libc::WEXITSTATUS(status), 0, "refused as a protocol error");
}

/// A completion whose tag is not in flight, among good ones reaped in one
/// batch: the error, and the good ones after it (they were dropped, their
/// slots taken and their waiters waiting for good).
#[test]
fn one_bogus_completion_does_not_lose_the_others() {
    let dir = wd_testutil::tempdir("wd-hostile-bogus");
    let path = dir.join("fake.sock");
    fake_host(&path, false);
    let h = HostConn::connect(&path).unwrap();
    let mut q = h.request_queue(&Capability::new("memcpy")).unwrap();
    q.send(wrapdrive::Desc::default(), 1).unwrap();
    q.send(wrapdrive::Desc::default(), 2).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    let (mut cookies, mut errors) = (Vec::new(), Vec::new());
    while std::time::Instant::now() < deadline && cookies.len() < 2 {
        let mut out = Vec::new();
        match q.recv_batch(&mut out, 32) {
            Ok(_) => cookies.extend(out.iter().map(|c| c.cookie)),
            Err(e) => errors.push(format!("{e} (out held {})", out.len())),
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(
        cookies,
        vec![1, 2],
        "completions lost after a bogus one; errors: {errors:?}; in flight {}",
        q.in_flight()
    );
}

/// A fake host whose first connection answers its first `ListAttrs` with
/// `first` (raw bytes written on the socket, after a good reply if
/// `reply_too`); later connections answer as a host does.
fn out_of_step_host(path: &str, first: Vec<u8>, reply_too: bool) {
    let listener = UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        for (n, s) in listener.incoming().enumerate() {
            let Ok(s) = s else { return };
            let first = (n == 0).then(|| first.clone());
            std::thread::spawn(move || {
                let mut raw = s.try_clone().unwrap();
                let mut ch = Channel::new(s);
                let mut first = first;
                while let Ok(f) = ch.recv() {
                    let reply = match f.msg {
                        Message::Hello { .. } => Message::HelloReply {
                            version: wd_proto::PROTOCOL_VERSION,
                            host_pid: std::process::id(),
                            features: 0,
                        },
                        Message::ListAttrs { .. } => Message::Attrs { entries: vec![] },
                        _ => Message::Ok,
                    };
                    let hostile = matches!(f.msg, Message::ListAttrs { .. })
                        .then(|| first.take())
                        .flatten();
                    match hostile {
                        Some(bytes) => {
                            if reply_too {
                                ch.send(&reply, f.request_id, &[]).unwrap();
                            }
                            std::io::Write::write_all(&mut raw, &bytes).unwrap();
                        }
                        None => ch.send(&reply, f.request_id, &[]).unwrap(),
                    }
                }
            });
        }
    });
}

/// The client's calls on a connection whose stream went out of step: the
/// failing call is a protocol error, and the next one connects again. The
/// connection was kept: every later call failed alike (a header that
/// does not decode is never consumed), or took the reply meant for the
/// call before it.
fn calls_after_an_out_of_step_answer(name: &str, first: Vec<u8>, reply_too: bool) {
    let dir = wd_testutil::tempdir(name);
    let path = dir.join("fake.sock");
    out_of_step_host(&path, first, reply_too);
    let h = HostConn::connect(&path).unwrap();
    if reply_too {
        h.attrs("").expect("the first call has its own reply");
    }
    let e = h.attrs("").expect_err("an answer out of step");
    assert_eq!(e.status(), wrapdrive::Status::Protocol, "{e}");
    assert!(e.to_string().contains("connection is closed"), "{e}");
    for i in 0..3 {
        let r = h.attrs("");
        assert!(r.is_ok(), "call {i} after the bad answer: {r:?}");
    }
    assert_eq!(h.epoch(), 1, "connected again once");
}

#[test]
fn a_header_that_does_not_decode_closes_the_connection() {
    calls_after_an_out_of_step_answer("wd-hostile-header", vec![0xa5; 64], false);
}

#[test]
fn a_reply_too_many_closes_the_connection() {
    let extra = wd_proto::encode(&Message::Attrs { entries: vec![] }, 999).unwrap();
    calls_after_an_out_of_step_answer("wd-hostile-extra", extra, true);
}
