//! A host in this test process with an `nvme` device on a fresh store,
//! for every integration test of the driver.

// Each test binary compiles this module and uses a part of it.
#![allow(dead_code)]

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use wd_host::{DeviceConfig, Host, HostConfig};
use wd_nvme_driver::msg::{regs, AdminOp, Sqe, Status, SQE_SIZE};
use wd_nvme_driver::{Controller, Namespace, NvmeError, Options};
use wd_testutil::{tempdir, TempDir};
use wrapdrive::HostConn;

/// The host, its socket, and the directory holding the socket and store.
pub struct TestHost {
    _host: Host,
    /// Where clients connect.
    pub socket: String,
    dir: TempDir,
}

impl TestHost {
    /// A new connection.
    pub fn conn(&self) -> Arc<HostConn> {
        HostConn::connect(&self.socket).expect("connect")
    }

    /// The backing store's path.
    pub fn store(&self) -> String {
        self.dir.join("store.img")
    }
}

/// A host whose `nvme` device (with `options`, e.g. "engine=sync,") has
/// the namespaces `namespaces` (`OFFSET:SIZE[:BLOCK]`) on one store file;
/// `prepare` may write the store first.
pub fn start_with(options: &str, namespaces: &[&str], prepare: impl FnOnce(&str)) -> TestHost {
    let dir = tempdir("wd-nvme-test");
    let socket = dir.join("wd.sock");
    let store = dir.join("store.img");
    std::fs::write(&store, b"").unwrap();
    prepare(&store);
    let mut spec = format!("nvme:{options}");
    for (i, ns) in namespaces.iter().enumerate() {
        if i > 0 {
            spec.push(',');
        }
        spec.push_str(&format!("ns={store}:{ns}"));
    }
    let cfg = HostConfig {
        socket: socket.clone(),
        socket_mode: 0o666,
        devices: vec![DeviceConfig::parse_spec(&spec).unwrap()],
        ..HostConfig::default()
    };
    TestHost {
        _host: Host::start(&cfg).expect("host starts"),
        socket,
        dir,
    }
}

/// A host with the default engine.
pub fn start(namespaces: &[&str]) -> TestHost {
    start_with("", namespaces, |_| {})
}

/// The status of a command that must have failed with one.
pub fn status_of<T: std::fmt::Debug>(r: Result<T, NvmeError>) -> Status {
    match r {
        Err(NvmeError::Command { status, .. }) => status,
        other => panic!("expected a status error, got {other:?}"),
    }
}

/// This process's memory, to read and write what the controller sees
/// (queues whose addresses the driver keeps to itself).
fn mem() -> File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/proc/self/mem")
        .unwrap()
}

/// `len` bytes of this process's memory at `addr`.
pub fn peek(addr: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    mem().read_exact_at(&mut v, addr).unwrap();
    v
}

/// Write `data` into this process's memory at `addr`.
pub fn poke(addr: u64, data: &[u8]) {
    mem().write_all_at(data, addr).unwrap();
}

/// The base of I/O completion queue `qid`, from its Create command in the
/// admin submission queue.
pub fn io_cq_base(c: &Controller, qid: u16) -> u64 {
    let asq = c.registers().load64(regs::ASQ);
    let raw = peek(asq, 32 * SQE_SIZE);
    raw.chunks_exact(SQE_SIZE)
        .map(|e| Sqe::from_bytes(e.try_into().unwrap()))
        .filter(|s| s.opcode == AdminOp::CreateCq as u8 && s.cdw[0] as u16 == qid)
        .map(|s| s.prp1)
        .next_back()
        .expect("create CQ command in the admin queue")
}

/// A host whose nvme device runs commands in its polling thread
/// (`engine=sync`) on `namespaces`, and a controller on it without shadow
/// doorbells (each doorbell a register write a test can follow), with
/// namespace 1 attached.
pub fn plain_controller(namespaces: &[&str]) -> (TestHost, Controller, Namespace) {
    let host = start_with("engine=sync,", namespaces, |_| {});
    let opts = Options {
        shadow_doorbells: false,
    };
    let mut c = Controller::open(&host.conn(), &opts).unwrap();
    let ns = c.open_namespace(1).unwrap();
    (host, c, ns)
}
