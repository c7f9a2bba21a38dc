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
