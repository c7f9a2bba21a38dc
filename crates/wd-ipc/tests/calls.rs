//! The control channel's `call` on a request it cannot send.

use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::time::Duration;

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
