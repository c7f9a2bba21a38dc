//! A whole host session driven by hostile clients: one host per fuzzing
//! process (a dummy and a sec device, on a private abstract socket), and
//! per input a program of operations on a few raw connections: Hello,
//! attribute reads and writes, queue requests with fuzzed fields, shares
//! of memfds of fuzzed size and offset, unshares, fault reads, IOMMU
//! policies, legacy requests, virtio-iommu kicks, garbage frames (with
//! descriptors attached), garbage written into granted rings, well-formed
//! submissions naming the shared memory, doorbells, and connections that
//! die at any point.
//!
//! After every input all its connections are gone, and the host must be
//! alive and back where it started: a separate connection still gets
//! answers, every queue and share is released, every instance available,
//! every mapping, descriptor and thread of the sessions gone (teardown is
//! asynchronous, so this is polled with a deadline). A panic in any host
//! thread aborts the process (libfuzzer-sys's panic hook), a host that stops
//! answering fails the input.
#![no_main]
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::FileExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use wd_fuzz::Input;
use wd_host::{DeviceConfig, Host};
use wd_ipc::{Channel, Frame};
use wd_proto::{
    FaultPolicy, InvalidationMode, Message, Prot, VirtioReq, HEADER_LEN, MAGIC, PROTOCOL_VERSION,
};
use wd_ring::{Desc, RingView, PAYLOAD_SIZE};

/// Connections one input may hold at once.
const MAX_CLIENTS: usize = 4;
/// Instances of each queue type: few, so inputs reach exhaustion.
const INSTANCES: u32 = 4;
/// How long a well-formed request may wait for its answer before the host
/// counts as hung.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);
/// How long teardown may take before the host counts as leaking.
const SETTLE_WITHIN: Duration = Duration::from_secs(10);
/// Memfd pages a share may have.
const MAX_SHARE_PAGES: u64 = 16;
const PAGE: u64 = 4096;

/// The host of this process and what it looked like with nobody connected.
struct Fixture {
    _host: Host,
    address: String,
    /// A connection of its own, open for the whole run: the health check.
    monitor: Channel,
    next_id: u32,
    /// Attributes that must come back after every input.
    baseline: Vec<(String, String)>,
    fds: usize,
    threads: usize,
}

fn connect(address: &str) -> std::io::Result<UnixStream> {
    let name = address.strip_prefix('@').expect("an abstract socket");
    UnixStream::connect_addr(&SocketAddr::from_abstract_name(name.as_bytes())?)
}

fn count_dir(p: &str) -> usize {
    std::fs::read_dir(p).map(|d| d.count()).unwrap_or(0)
}

/// This process's open descriptors of the kinds a session makes
/// (sockets, memfds, eventfds, pidfds), and what they are. Others (pipes,
/// files) are libFuzzer's and the sanitizers', which open and close them
/// as they please.
fn session_fds() -> Vec<String> {
    let Ok(d) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    d.flatten()
        .filter_map(|e| {
            let to = std::fs::read_link(e.path()).ok()?;
            let to = to.to_string_lossy();
            ["socket:", "anon_inode:", "/memfd:"]
                .iter()
                .any(|k| to.starts_with(k))
                .then(|| format!("{}->{to}", e.file_name().to_string_lossy()))
        })
        .collect()
}

/// Whether an attribute is part of the state every input must restore (the
/// rest are counters and timings).
fn tracked(path: &str) -> bool {
    path.starts_with("host/users/")
        || path == "host/mappings"
        || path.ends_with("/available_instances")
        || path.ends_with("/priority")
        || path.ends_with("/numa_zone_id")
        || path.contains("/queues/")
}

impl Fixture {
    fn start() -> Fixture {
        let devices = ["dummy", "sec"]
            .iter()
            .map(|d| {
                let mut c = DeviceConfig::new(d);
                c.queues = INSTANCES;
                // Engines sleep as soon as they are idle: spinning between
                // requests takes a third of the fuzzer's time and reaches
                // nothing new (the sleeping and waking paths are the ones
                // worth reaching).
                c.idle_spin_us = Some(0);
                c
            })
            .collect();
        let host = Host::embedded(devices).expect("the host starts");
        let address = host.address().to_string();
        let mut monitor = Channel::new(connect(&address).expect("monitor connects"));
        monitor
            .socket()
            .set_read_timeout(Some(ANSWER_WITHIN))
            .unwrap();
        let hello = Message::Hello {
            version: PROTOCOL_VERSION,
            client_pid: std::process::id(),
        };
        let r = monitor.call(&hello, 1, &[]).expect("monitor Hello");
        assert!(matches!(r.msg, Message::HelloReply { .. }), "{:?}", r.msg);
        let mut f = Fixture {
            _host: host,
            address,
            monitor,
            next_id: 2,
            baseline: Vec::new(),
            fds: 0,
            threads: 0,
        };
        f.baseline = f.state();
        f.fds = session_fds().len();
        f.threads = count_dir("/proc/self/task");
        f
    }

    /// The tracked attributes, as the monitor reads them now.
    fn state(&mut self) -> Vec<(String, String)> {
        self.next_id = self.next_id.wrapping_add(1);
        let list = Message::ListAttrs {
            prefix: String::new(),
        };
        let r = match self.monitor.call(&list, self.next_id, &[]) {
            Ok(r) => r,
            Err(e) => panic!("the host stopped answering its monitor: {e}"),
        };
        let Message::Attrs { entries } = r.msg else {
            panic!("ListAttrs answered with {:?}", r.msg);
        };
        entries
            .into_iter()
            .filter(|e| tracked(&e.path))
            .map(|e| (e.path, e.value))
            .collect()
    }

    /// Put back what an input may change on purpose (the owner's
    /// attributes), then wait for the host to settle where it started.
    fn check(&mut self) {
        let t = Instant::now();
        let mut pause = Duration::from_micros(20);
        loop {
            let now = self.state();
            let fds = session_fds().len();
            let threads = count_dir("/proc/self/task");
            if now == self.baseline && fds == self.fds && threads == self.threads {
                return;
            }
            // Every time they differ, not once: a connection that is going
            // away may still have a SetAttr it sent before it closed, which
            // the host rightly carries out after a first restore.
            let owned = |p: &str| p.ends_with("/priority") || p.ends_with("/numa_zone_id");
            let drifted: Vec<_> = self
                .baseline
                .iter()
                .filter(|e| owned(&e.0) && !now.contains(e))
                .cloned()
                .collect();
            if !drifted.is_empty() {
                for (path, value) in drifted {
                    self.next_id = self.next_id.wrapping_add(1);
                    let set = Message::SetAttr { path, value };
                    let _ = self.monitor.call(&set, self.next_id, &[]);
                }
                continue;
            }
            if t.elapsed() > SETTLE_WITHIN {
                let diff: Vec<_> = now
                    .iter()
                    .filter(|e| !self.baseline.contains(e))
                    .chain(self.baseline.iter().filter(|e| !now.contains(e)))
                    .collect();
                panic!(
                    "the host did not return to its idle state within {SETTLE_WITHIN:?}: \
                     attributes differing {diff:?}; descriptors {fds} (idle {}), \
                     threads {threads} (idle {}); open: {:?}",
                    self.fds,
                    self.threads,
                    session_fds()
                );
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(5));
        }
    }
}

fn fixture() -> &'static Mutex<Fixture> {
    static F: OnceLock<Mutex<Fixture>> = OnceLock::new();
    F.get_or_init(|| Mutex::new(Fixture::start()))
}

/// What this target reads beyond plain fields.
trait SessionInput {
    fn small(&mut self) -> u32;
}

impl SessionInput for Input<'_> {
    /// A u32 that is small most of the time.
    fn small(&mut self) -> u32 {
        self.mostly_small(0x40, 4)
    }
}

/// A queue the host granted: its ring mapped as a client maps it.
struct Granted {
    id: u32,
    /// Given back (its ring stays mapped here, to be scribbled on).
    released: bool,
    ring: File,
    ring_bytes: u64,
    // Declared before `_map`, so it goes first.
    view: Option<RingView>,
    _map: Option<wd_sys::Mapping>,
    doorbell: OwnedFd,
    _cq: OwnedFd,
}

/// A share this input made: where the device sees it.
#[derive(Clone, Copy)]
struct Share {
    queue_id: u32,
    iova: u64,
    size: u64,
}

/// One raw connection of the input.
struct Client {
    ch: Channel,
    /// Whether replies still match requests (false after garbage, or after
    /// a request the host may not answer).
    synced: bool,
    next_id: u32,
}

impl Client {
    fn open(address: &str) -> Option<Client> {
        let sock = connect(address).ok()?;
        sock.set_read_timeout(Some(ANSWER_WITHIN)).ok()?;
        // A peer that stops reading (the host, busy answering earlier
        // requests this side never read) must not hang the input.
        sock.set_write_timeout(Some(Duration::from_millis(200)))
            .ok()?;
        Some(Client {
            ch: Channel::new(sock),
            synced: true,
            next_id: 1,
        })
    }

    /// Send a request; when in step with the host, wait for its answer.
    /// `Err(())`: the connection is unusable (closed by the host).
    fn call(&mut self, msg: &Message, fds: &[BorrowedFd<'_>]) -> Result<Option<Frame>, ()> {
        self.next_id = self.next_id.wrapping_add(1);
        if self.ch.send(msg, self.next_id, fds).is_err() {
            return Err(());
        }
        if !self.synced {
            return Ok(None);
        }
        match self.ch.recv() {
            Ok(f) => {
                if trace() {
                    eprintln!("{} -> {:?}", msg.name(), f.msg);
                }
                assert_eq!(f.request_id, self.next_id, "answer to another request");
                Ok(Some(f))
            }
            Err(wd_ipc::IpcError::Sys(e)) if e.errno() == EAGAIN => {
                panic!(
                    "the host did not answer {} within {ANSWER_WITHIN:?}",
                    msg.name()
                )
            }
            Err(_) => Err(()),
        }
    }

    /// Raw bytes on the socket (with descriptors): the host's framing can
    /// no longer be followed from here.
    fn raw(&mut self, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> Result<(), ()> {
        self.synced = false;
        if bytes.is_empty() {
            return Ok(());
        }
        wd_sys::send_with_fds(self.ch.socket(), bytes, fds).map_err(|_| ())
    }
}

/// Whether to print each request and its answer (`WD_FUZZ_TRACE=1`, to
/// see what an input does when replaying it).
fn trace() -> bool {
    static T: OnceLock<bool> = OnceLock::new();
    *T.get_or_init(|| std::env::var_os("WD_FUZZ_TRACE").is_some())
}

/// What a receive that timed out fails with (EAGAIN, Linux).
const EAGAIN: i32 = 11;

/// Everything an input holds; dropped at its end (every connection dies).
#[derive(Default)]
struct Session {
    clients: Vec<Option<Client>>,
    /// Queues by the client that asked for them; they outlive their
    /// connection (a dead client's ring can still be scribbled on).
    queues: Vec<(usize, Granted)>,
    shares: Vec<Share>,
    /// Memory this input shared (kept so it can be written to).
    memory: Vec<File>,
}

const ALGS: [&str; 4] = ["memcpy", "cipher", "digest", "sha999"];
const ATTRS: [&str; 8] = [
    "dev0/priority",
    "dev1/priority",
    "dev0/numa_zone_id",
    "dev1/numa_zone_id",
    "dev0/driver",
    "host/users/",
    "dev0/mdev_supported_types/dummy-memcpy/available_instances",
    "dev2/priority",
];

impl Session {
    fn client(&mut self, inp: &mut Input<'_>) -> Option<usize> {
        let n = self.clients.len();
        if n == 0 {
            return None;
        }
        let k = inp.take(1) as usize % n;
        self.clients[k].as_ref().map(|_| k)
    }

    /// A queue id for client `k`: one of its own most of the time, now and
    /// then another connection's, or any number.
    fn queue_id(&self, k: usize, inp: &mut Input<'_>) -> u32 {
        let v = inp.take(1) as usize;
        let own: Vec<u32> = self
            .queues
            .iter()
            .filter(|(c, q)| *c == k && !q.released)
            .map(|(_, q)| q.id)
            .collect();
        match v >> 6 {
            0 | 1 if !own.is_empty() => own[v % own.len()],
            2 if !self.queues.is_empty() => self.queues[v % self.queues.len()].1.id,
            _ => v as u32 & 0x3f,
        }
    }

    /// Run `msg` on client `k`; a connection the host closed dies here.
    fn call(&mut self, k: usize, msg: &Message, fds: &[BorrowedFd<'_>]) -> Option<Frame> {
        let c = self.clients[k].as_mut()?;
        match c.call(msg, fds) {
            // A refusal may close the connection (before Hello): the next
            // call finds out.
            Ok(f) => f,
            Err(()) => {
                self.clients[k] = None;
                None
            }
        }
    }

    fn grant(&mut self, k: usize, f: Frame) {
        let Message::QueueGranted {
            queue_id,
            ring_bytes,
            depth,
            ..
        } = f.msg
        else {
            return;
        };
        let mut fds = f.fds.into_iter();
        let (Some(ring), Some(doorbell), Some(cq)) = (fds.next(), fds.next(), fds.next()) else {
            panic!("QueueGranted without its descriptors");
        };
        let ring = File::from(ring);
        let map = wd_sys::Mapping::map_shared(ring.as_fd(), 0, ring_bytes as usize).ok();
        let view = map.as_ref().and_then(|m| {
            // SAFETY: `m` is a fresh shared mapping of `ring_bytes` bytes
            // (page-aligned, so 64-byte aligned); the view is stored next to
            // the mapping in `Granted`, which drops the view first.
            unsafe { RingView::attach(m.as_ptr(), m.len(), depth) }.ok()
        });
        self.queues.push((
            k,
            Granted {
                id: queue_id,
                released: false,
                ring,
                ring_bytes,
                view,
                _map: map,
                doorbell,
                _cq: cq,
            },
        ));
    }

    /// A memfd of fuzzed size, sealed against shrinking most of the time.
    fn memfd(&mut self, inp: &mut Input<'_>) -> Option<usize> {
        let pages = 1 + inp.take(1) % MAX_SHARE_PAGES;
        let odd = if inp.take(1) & 0xe0 == 0xe0 {
            inp.take(2) % PAGE
        } else {
            0
        };
        let fd = wd_sys::memfd_create("wd-fuzz-share", false).ok()?;
        wd_sys::ftruncate(fd.as_fd(), pages * PAGE + odd).ok()?;
        if inp.take(1) & 0xf0 != 0xf0 {
            let _ = wd_sys::add_seals(fd.as_fd(), wd_sys::SEAL_SHRINK | wd_sys::SEAL_GROW);
        }
        self.memory.push(File::from(fd));
        Some(self.memory.len() - 1)
    }

    /// A device address: inside a share most of the time.
    fn addr(&self, inp: &mut Input<'_>) -> u64 {
        let v = inp.take(2);
        match (v & 3, self.shares.is_empty()) {
            (3, _) | (_, true) => inp.take(8),
            _ => {
                let s = self.shares[(v >> 2) as usize % self.shares.len()];
                s.iova.wrapping_add(inp.take(2) % (s.size + 64))
            }
        }
    }

    fn step(&mut self, fx: &Fixture, inp: &mut Input<'_>) {
        let op = inp.take(1);
        match op % 20 {
            // A new connection, saying Hello (mostly right).
            0 | 1 => {
                if self.clients.iter().flatten().count() >= MAX_CLIENTS {
                    return;
                }
                let Some(c) = Client::open(&fx.address) else {
                    return;
                };
                self.clients.push(Some(c));
                let k = self.clients.len() - 1;
                // Now and then a connection that never says Hello.
                if op < 0xf0 {
                    let version = if inp.take(1) == 0xff {
                        inp.take(2) as u16
                    } else {
                        PROTOCOL_VERSION
                    };
                    let hello = Message::Hello {
                        version,
                        client_pid: inp.take(4) as u32,
                    };
                    self.call(k, &hello, &[]);
                }
            }
            // Attributes: list, get, set.
            2 => {
                let Some(k) = self.client(inp) else { return };
                let pick = inp.take(1) as usize;
                let path = if pick & 0x80 != 0 {
                    inp.text(64)
                } else {
                    ATTRS[pick % ATTRS.len()].to_string()
                };
                let msg = match pick % 3 {
                    0 => Message::ListAttrs { prefix: path },
                    1 => Message::GetAttr { path },
                    _ => Message::SetAttr {
                        path,
                        value: if inp.flag() {
                            inp.text(16)
                        } else {
                            (inp.take(1) % 4).to_string()
                        },
                    },
                };
                self.call(k, &msg, &[]);
            }
            // A queue request with fuzzed fields.
            3 | 4 => {
                let Some(k) = self.client(inp) else { return };
                let pick = inp.take(1) as usize;
                let alg = if pick & 0x80 != 0 {
                    inp.text(16)
                } else {
                    ALGS[pick % ALGS.len()].to_string()
                };
                let flags = match inp.take(1) {
                    f if f & 0xf0 == 0xf0 => inp.take(4) as u32,
                    f => f as u32 & 3,
                };
                let depth = match inp.take(1) {
                    d if d & 0x80 != 0 => inp.take(4) as u32,
                    d => d as u32 & 0x3f,
                };
                let msg = Message::RequestQueue {
                    alg,
                    flags,
                    depth,
                    numa_node: inp.take(1) as i8 as i32,
                    probe_addr: inp.take(8),
                    probe_value: inp.take(8),
                };
                // SHARE_ALL travels with the client's memory descriptor; a
                // memfd stands in for it (the host must refuse it: it is
                // not /proc/<pid>/mem, and this process is the host too).
                let mut stand_in = None;
                if msg.fds_expected() > 0 {
                    let Some(m) = self.memfd(inp) else { return };
                    let Ok(fd) = self.memory[m].as_fd().try_clone_to_owned() else {
                        return;
                    };
                    stand_in = Some(fd);
                }
                let fds: Vec<BorrowedFd<'_>> = stand_in.iter().map(|f| f.as_fd()).collect();
                if let Some(f) = self.call(k, &msg, &fds) {
                    self.grant(k, f);
                }
            }
            5 => {
                let Some(k) = self.client(inp) else { return };
                let queue_id = self.queue_id(k, inp);
                if let Some(Frame {
                    msg: Message::Ok, ..
                }) = self.call(k, &Message::ReleaseQueue { queue_id }, &[])
                {
                    for (_, q) in self.queues.iter_mut().filter(|(c, _)| *c == k) {
                        q.released |= q.id == queue_id;
                    }
                }
            }
            // Share memory of fuzzed size at a fuzzed offset and address.
            6 | 7 => {
                let Some(k) = self.client(inp) else { return };
                let queue_id = self.queue_id(k, inp);
                let Some(m) = self.memfd(inp) else { return };
                let len = self.memory[m].metadata().map(|md| md.len()).unwrap_or(0);
                let shape = inp.take(1);
                let (fd_offset, size) = match shape & 3 {
                    0 | 1 => (0, len & !(PAGE - 1)),
                    2 => {
                        let off = (inp.take(1) % MAX_SHARE_PAGES) * PAGE;
                        (off, (inp.take(1) % MAX_SHARE_PAGES + 1) * PAGE)
                    }
                    _ => (inp.take(8), inp.take(8)),
                };
                let iova = if shape & 4 == 0 {
                    0x10_0000 * (1 + inp.take(1) % 16)
                } else {
                    inp.take(8)
                };
                let prot = match inp.take(1) % 3 {
                    0 => Prot::READ,
                    1 => Prot::WRITE,
                    _ => Prot::RW,
                };
                let msg = Message::MemShare {
                    queue_id,
                    iova,
                    size,
                    fd_offset,
                    prot,
                };
                let fd = self.memory[m].as_fd().try_clone_to_owned();
                let Ok(fd) = fd else { return };
                if let Some(Frame {
                    msg: Message::Ok, ..
                }) = self.call(k, &msg, &[fd.as_fd()])
                {
                    self.shares.push(Share {
                        queue_id,
                        iova,
                        size,
                    });
                }
            }
            8 => {
                let Some(k) = self.client(inp) else { return };
                let msg = if !self.shares.is_empty() && inp.flag() {
                    let s = self.shares[inp.take(1) as usize % self.shares.len()];
                    Message::MemUnshare {
                        queue_id: s.queue_id,
                        iova: s.iova,
                        size: s.size,
                    }
                } else {
                    Message::MemUnshare {
                        queue_id: self.queue_id(k, inp),
                        iova: inp.take(8),
                        size: inp.take(8),
                    }
                };
                self.call(k, &msg, &[]);
            }
            // Faults and the IOMMU policy.
            9 => {
                let Some(k) = self.client(inp) else { return };
                let queue_id = self.queue_id(k, inp);
                let msg = match inp.take(1) % 4 {
                    0 => Message::ReadFaults {
                        queue_id,
                        max: inp.small(),
                    },
                    1 => Message::PeekFaults {
                        queue_id,
                        max: inp.small(),
                    },
                    2 => Message::IommuPolicy {
                        queue_id,
                        mode: if inp.flag() {
                            InvalidationMode::Strict
                        } else {
                            InvalidationMode::Deferred
                        },
                        fault_policy: if inp.flag() {
                            FaultPolicy::Abort
                        } else {
                            FaultPolicy::Stall
                        },
                    },
                    _ => Message::FaultResume {
                        queue_id,
                        stag: inp.small() as u64,
                        retry: inp.flag(),
                    },
                };
                self.call(k, &msg, &[]);
            }
            // A legacy request: a descriptor (fuzzed, or a memcpy) and data.
            10 => {
                let Some(k) = self.client(inp) else { return };
                let queue_id = self.queue_id(k, inp);
                let desc = if inp.flag() {
                    self.desc(inp).to_bytes().to_vec()
                } else {
                    inp.bytes(160)
                };
                let payload = inp.bytes(255);
                let msg = Message::Legacy {
                    queue_id,
                    desc,
                    payload,
                };
                self.call(k, &msg, &[]);
            }
            // virtio-iommu: a kick of fuzzed requests, or the config.
            11 => {
                let Some(k) = self.client(inp) else { return };
                let msg = if inp.flag() {
                    let n = inp.take(1) % 4;
                    Message::VirtioKick {
                        requests: (0..n)
                            .map(|_| VirtioReq {
                                readable: inp.bytes(64),
                                writable_len: inp.take(1) as u32,
                            })
                            .collect(),
                    }
                } else {
                    Message::VirtioConfig {
                        offset: inp.small(),
                        data: inp.bytes(16),
                    }
                };
                self.call(k, &msg, &[]);
            }
            // Garbage on the socket: bytes, or a frame header of any kind
            // and length followed by bytes, with descriptors now and then.
            12 => {
                let Some(k) = self.client(inp) else { return };
                let mut bytes = Vec::new();
                let how = inp.take(1);
                if how & 1 != 0 {
                    bytes.extend_from_slice(&MAGIC.to_le_bytes());
                    bytes.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
                    bytes.extend_from_slice(&(inp.take(1) as u16 % 27).to_le_bytes());
                    bytes.extend_from_slice(&(inp.take(4) as u32).to_le_bytes());
                    let body = inp.bytes(255);
                    let len = if how & 2 != 0 {
                        inp.take(4) as u32
                    } else {
                        body.len() as u32
                    };
                    bytes.extend_from_slice(&len.to_le_bytes());
                    debug_assert_eq!(bytes.len(), HEADER_LEN);
                    bytes.extend_from_slice(&body);
                } else {
                    bytes = inp.bytes(255);
                }
                let nfds = ((how >> 2) & 7).min(5) as usize;
                let mut extra = Vec::new();
                for _ in 0..nfds {
                    if let Ok(fd) = wd_sys::eventfd() {
                        extra.push(fd);
                    }
                }
                let fds: Vec<BorrowedFd<'_>> = extra.iter().map(|f| f.as_fd()).collect();
                let c = self.clients[k].as_mut().expect("a live client");
                if c.raw(&bytes, &fds).is_err() {
                    self.clients[k] = None;
                }
            }
            // Garbage into a granted ring (header, indices, entries).
            13 | 14 => {
                if self.queues.is_empty() {
                    return;
                }
                let q = &self.queues[inp.take(1) as usize % self.queues.len()].1;
                let at = match inp.take(1) {
                    // The header's words.
                    w if w & 0x80 == 0 => (w & 0x7f) * 8 % 512,
                    _ => inp.take(4) % q.ring_bytes.max(1),
                };
                let bytes = inp.bytes(64);
                let _ = q.ring.write_at(&bytes, at);
                if inp.flag() {
                    let _ = wd_sys::wake(q.doorbell.as_fd());
                }
            }
            // Well-formed submissions (fuzzed messages naming the shares).
            15 | 16 => {
                if self.queues.is_empty() {
                    return;
                }
                let n = self.queues.len();
                let qi = inp.take(1) as usize % n;
                let count = 1 + inp.take(1) as usize % 4;
                let descs: Vec<Desc> = (0..count).map(|_| self.desc(inp)).collect();
                let q = &mut self.queues[qi].1;
                if let Some(v) = q.view.as_mut() {
                    let _ = v.submit(&descs);
                }
                let _ = wd_sys::wake(q.doorbell.as_fd());
            }
            // Reap completions.
            17 => {
                if self.queues.is_empty() {
                    return;
                }
                let n = self.queues.len();
                let q = &mut self.queues[inp.take(1) as usize % n].1;
                if let Some(v) = q.view.as_mut() {
                    let mut out = [Desc::default(); 8];
                    let _ = v.reap(&mut out);
                }
            }
            // Bytes into shared memory (what the device copies).
            18 => {
                if self.memory.is_empty() {
                    return;
                }
                let m = &self.memory[inp.take(1) as usize % self.memory.len()];
                let at = inp.take(2) * 8;
                let _ = m.write_at(&inp.bytes(64), at);
            }
            // Die: a connection closes at once, its queues and rings with
            // it or not.
            _ => {
                let Some(k) = self.client(inp) else { return };
                self.clients[k] = None;
                if inp.flag() {
                    self.queues.retain(|(c, _)| *c != k);
                }
                if inp.flag() {
                    std::thread::yield_now();
                }
            }
        }
    }

    /// A descriptor: a fuzzed opcode, flags and message, with addresses of
    /// the shares and small lengths patched in.
    fn desc(&self, inp: &mut Input<'_>) -> Desc {
        let mut d = Desc {
            tag: inp.take(1),
            opcode: inp.take(1) as u16 % 6,
            ..Desc::default()
        };
        if inp.take(1) & 0xf0 == 0xf0 {
            d.flags = inp.take(2) as u16;
            d.reserved = inp.take(1);
        }
        let raw = inp.bytes(PAYLOAD_SIZE);
        d.payload[..raw.len()].copy_from_slice(&raw);
        for _ in 0..inp.take(1) % 4 {
            let slot = inp.take(1) as usize % (PAYLOAD_SIZE / 8);
            let v = if inp.flag() {
                self.addr(inp)
            } else {
                inp.take(2)
            };
            d.set_payload_u64(slot * 8, v);
        }
        d
    }
}

fuzz_target!(|data: &[u8]| {
    let mut fx = fixture().lock().unwrap_or_else(|e| e.into_inner());
    let mut s = Session::default();
    let mut inp = Input::new(data);
    let mut steps = 0;
    while !inp.done() && steps < 256 {
        s.step(&fx, &mut inp);
        steps += 1;
    }
    drop(s);
    fx.check();
});
