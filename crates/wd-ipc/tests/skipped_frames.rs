//! A frame whose body does not decode is skipped with the descriptors
//! that came with it, even when bytes of the next frame were in the
//! buffer already (they were handed to the next frame).

use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;

use wd_ipc::{Channel, IpcError};
use wd_proto::{Message, Prot};

fn share(q: u32) -> Message {
    Message::MemShare {
        queue_id: q,
        iova: 0x1000,
        size: 4096,
        fd_offset: 0,
        prot: Prot::RW,
    }
}

fn attrs(k: usize) -> Vec<u8> {
    wd_proto::encode(
        &Message::ListAttrs {
            prefix: "a".repeat(k),
        },
        1,
    )
    .unwrap()
}

#[test]
fn descriptors_of_a_skipped_frame_are_not_given_to_the_next() {
    let (a, b) = UnixStream::pair().unwrap();
    let mut rx = Channel::new(a);
    let dir = std::env::temp_dir();
    let p1 = dir.join(format!("wd-ipc-skipped-1-{}", std::process::id()));
    let p2 = dir.join(format!("wd-ipc-skipped-2-{}", std::process::id()));
    let f1 = std::fs::File::create(&p1).unwrap();
    let f2 = std::fs::File::create(&p2).unwrap();
    let ino2 = f2.metadata().unwrap().ino();

    // B: a MemShare whose prot does not decode, with its descriptor.
    let mut bad = wd_proto::encode(&share(1), 2).unwrap();
    *bad.last_mut().unwrap() = 0;
    assert!(wd_proto::decode_frame(&bad).is_err(), "B does not decode");
    // C: a good MemShare with its own descriptor.
    let good = wd_proto::encode(&share(2), 3).unwrap();

    // Filler of good frames so that B straddles the first 64 KiB read.
    let target = 65536 - bad.len() / 2;
    let (l0, l64) = (attrs(0).len(), attrs(64).len());
    let mut filler = Vec::new();
    let mut frames = 0;
    while target - filler.len() > 2 * l64 {
        filler.extend(attrs(64));
        frames += 1;
    }
    let rem = target - filler.len() - 2 * l0;
    filler.extend(attrs(rem / 2));
    filler.extend(attrs(rem - rem / 2));
    frames += 2;
    assert_eq!(filler.len(), target);

    let mut w = b.try_clone().unwrap();
    w.write_all(&filler).unwrap();
    wd_sys::send_with_fds(&b, &bad, &[f1.as_fd()]).unwrap();
    wd_sys::send_with_fds(&b, &good, &[f2.as_fd()]).unwrap();

    for _ in 0..frames {
        rx.recv().expect("filler frame");
    }
    assert!(
        matches!(rx.recv(), Err(IpcError::Proto(_))),
        "B is its own error"
    );
    let c = rx.recv();
    let _ = std::fs::remove_file(&p1);
    let _ = std::fs::remove_file(&p2);
    let c = match c {
        Ok(c) => c,
        Err(e) => panic!("the good frame after the skipped one was refused: {e}"),
    };
    assert_eq!(c.msg, share(2));
    let got = std::fs::File::from(c.fds.into_iter().next().unwrap());
    assert_eq!(
        got.metadata().unwrap().ino(),
        ino2,
        "the good frame received the skipped frame's descriptor"
    );
}
