//! The control channel: `call` on a request it cannot send, and a frame
//! deadline that leaves the socket as it was.

use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use wd_ipc::Channel;
use wd_proto::Message;

/// A request `encode` refuses (a path over MAX_PATH) is never sent: `call`
/// fails at once (it used to wait in `recv` for a refusal from a peer that
/// had nothing to answer).
#[test]
fn a_request_that_cannot_be_encoded_fails_at_once() {
    let (a, b) = UnixStream::pair().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut ch = Channel::new(a);
        let r = ch.call(
            &Message::GetAttr {
                path: "x".repeat(wd_proto::limits::MAX_PATH + 1),
            },
            1,
            &[],
        );
        let _ = tx.send(format!("{r:?}"));
    });
    let got = rx.recv_timeout(Duration::from_secs(3));
    drop(b);
    match got {
        Ok(r) => assert!(r.starts_with("Err("), "{r}"),
        Err(_) => panic!("Channel::call of an unencodable GetAttr still blocked after 3 s (the peer is alive and silent)"),
    }
}

/// The deadline given to `recv_by` is that frame's: the socket's own read
/// timeout comes back after it (it was left at what remained of the
/// deadline, and a later blocking `recv` gave up on a peer merely slow).
#[test]
fn recv_after_recv_by_still_blocks() {
    let (a, b) = UnixStream::pair().unwrap();
    let mut ch = Channel::new(a);
    let peer = Channel::new(b);
    peer.send(&Message::ReleaseQueue { queue_id: 1 }, 1, &[])
        .unwrap();
    ch.recv_by(Some(Instant::now() + Duration::from_millis(50)))
        .unwrap();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        peer.send(&Message::ReleaseQueue { queue_id: 2 }, 2, &[])
            .unwrap();
        peer
    });
    let r = ch.recv().map(|f| f.request_id).map_err(|e| e.to_string());
    let _ = t.join();
    assert_eq!(r, Ok(2), "a blocking recv after recv_by");
}
