//! What several of the host's test binaries need.

// Each test binary compiles this module and uses a part of it.
#![allow(dead_code)]

use wd_host::Host;
use wd_proto::Message;

/// A raw control channel to `host` (an in-process host on an abstract
/// socket), past Hello: for requests the client library would not send.
pub fn raw_connect(host: &Host) -> wd_ipc::Channel {
    use std::os::linux::net::SocketAddrExt;
    let name = host.address().strip_prefix('@').expect("abstract address");
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    hello(std::os::unix::net::UnixStream::connect_addr(&addr).unwrap())
}

/// A raw control channel on `sock`, past Hello.
pub fn hello(sock: std::os::unix::net::UnixStream) -> wd_ipc::Channel {
    let mut ch = wd_ipc::Channel::new(sock);
    ch.call(
        &Message::Hello {
            version: wd_proto::PROTOCOL_VERSION,
            client_pid: 0,
        },
        1,
        &[],
    )
    .unwrap();
    ch
}

/// A queue of `alg` on `host` for a client writing its ring by hand: its
/// control channel, descriptors (ring, doorbell, completion line) and
/// ring mapping.
pub fn raw_queue(
    host: &Host,
    alg: &str,
    depth: u32,
) -> (wd_ipc::Channel, Vec<std::os::fd::OwnedFd>, wd_sys::Mapping) {
    use std::os::fd::AsFd;
    let mut ch = raw_connect(host);
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
