//! The device host: the kernel driver's role (owning devices, granting queues, mapping memory), in user space.
//!
//! It owns the devices and their engine threads, listens on a UNIX socket,
//! and gives each connected process queues whose lifetime is bound to that
//! process: when the process releases them, closes the socket or dies
//! (kill -9 included), the queue is drained, its domain destroyed, its
//! memory unmapped and its instance returned. No root and no reaper needed.
#![deny(unsafe_code)]

pub mod attrs;
pub mod config;
mod conn;
pub mod drivers;
pub mod engine;
mod inspect;
pub mod queue;
pub mod quota;
pub mod socket;

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

pub use config::{DeviceConfig, HostConfig};
use engine::EngineHandle;
pub use inspect::QueueIommuStats;
use queue::Queue;
use wd_device::{AlgInfo, Driver};
use wd_proto::Status;

/// Errors of the host.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// Bad configuration.
    #[error("configuration: {0}")]
    Config(String),
    /// The host could not take its socket.
    #[error(transparent)]
    Socket(#[from] socket::SocketError),
    /// A request failed with a protocol status and a message for the client.
    #[error("{1}")]
    Status(Status, String),
    /// Any other system error.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl HostError {
    /// The status a client sees for this error.
    pub fn status(&self) -> Status {
        match self {
            HostError::Status(s, _) => *s,
            HostError::Config(_) => Status::Invalid,
            HostError::Socket(e) => e.status(),
            HostError::Io(source) => Status::from_errno(source.raw_os_error().unwrap_or(5)),
        }
    }
}

/// One queue type of a device and its free instances.
pub struct QueueType {
    /// What it serves.
    pub info: AlgInfo,
    /// Instances left (`available_instances`); each queue holds a
    /// [`queue::InstanceClaim`] on it.
    pub available: Arc<AtomicU32>,
    /// Instances in all.
    pub instances: u32,
}

/// A device the host owns.
pub struct Device {
    /// Its driver.
    pub driver: Box<dyn Driver>,
    /// NUMA node (rw attribute).
    pub numa_zone_id: AtomicI32,
    /// Priority (rw attribute).
    pub priority: AtomicU32,
    /// Queue types.
    pub types: Vec<QueueType>,
    /// Engine threads.
    pub engines: Vec<EngineHandle>,
}

/// State shared by the host's threads.
pub struct HostInner {
    /// Devices, `dev<N>` by index.
    pub devices: Vec<Device>,
    /// Live queues by id.
    pub queues: Mutex<HashMap<u32, Arc<Queue>>>,
    next_queue: AtomicU32,
    next_conn: AtomicU64,
    /// Owner of the host: may write attributes.
    pub owner_uid: u32,
    /// Who may connect at all.
    pub access: socket::AccessPolicy,
    conns: Mutex<HashMap<u64, UnixStream>>,
    stopping: AtomicBool,
    /// The software IOMMU every queue's device accesses go through.
    pub iommu: Arc<wd_iommu::Iommu>,
    /// What each user holds, and the limits.
    pub quotas: Arc<quota::Quotas>,
    /// Who sees queue details.
    pub queue_details: config::QueueDetails,
}

/// How often the IOMMU's timers run (flush-queue and stall timeouts): half
/// the default flush-queue timeout, so a deferred unmap waits at most about
/// one and a half timeouts for its flush.
const IOMMU_TICK: Duration = Duration::from_millis(5);

fn iommu_timers(iommu: Arc<wd_iommu::Iommu>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(IOMMU_TICK);
        iommu.housekeeping(std::time::Instant::now());
    }
}

impl HostInner {
    fn new_queue_id(&self) -> u32 {
        // Ids start at 1 and skip ids still in use after wrap-around.
        loop {
            let id = self.next_queue.fetch_add(1, Ordering::Relaxed).max(1);
            if !self
                .queues
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains_key(&id)
            {
                return id;
            }
        }
    }
}

/// A running host.
pub struct Host {
    inner: Arc<HostInner>,
    address: String,
    accept: Option<JoinHandle<()>>,
    timers: Option<(Arc<AtomicBool>, JoinHandle<()>)>,
    socket_file: Option<socket::SocketFile>,
}

impl Host {
    /// Start the devices and serve `cfg.socket`.
    pub fn start(cfg: &HostConfig) -> Result<Host, HostError> {
        cfg.validate()?;
        let bound = socket::bind(&cfg.socket, cfg.socket_mode)?;
        Host::start_bound(cfg, bound, cfg.socket.clone())
    }

    /// Start the devices and serve a socket a service manager passed
    /// ([`socket::activation`]) instead of `cfg.socket`; the socket stays
    /// the manager's (never removed), so a restarted host serves clients
    /// on the same address.
    pub fn start_activated(cfg: &HostConfig, listener: UnixListener) -> Result<Host, HostError> {
        cfg.validate()?;
        let address = socket::listener_address(&listener);
        Host::start_bound(
            cfg,
            socket::Bound {
                listener,
                file: None,
            },
            address,
        )
    }

    fn start_bound(
        cfg: &HostConfig,
        bound: socket::Bound,
        address: String,
    ) -> Result<Host, HostError> {
        // Every connection costs descriptors: take what the hard limit
        // allows, so the connection limits, not EMFILE, decide.
        let _ = wd_sys::raise_nofile_limit();
        let socket::Bound {
            listener,
            file: socket_file,
        } = bound;
        let iommu = wd_iommu::Iommu::new();
        let mut devices = Vec::new();
        for (n, dc) in cfg.devices.iter().enumerate() {
            let driver = drivers::open(dc).map_err(HostError::Config)?;
            let idle_spin = dc
                .idle_spin_us
                .map(Duration::from_micros)
                .unwrap_or_else(|| driver.idle_spin());
            let mut engines = Vec::new();
            for e in 0..dc.engines {
                engines.push(EngineHandle::spawn(
                    format!("wd-dev{n}-e{e}"),
                    idle_spin,
                    cfg.limits.pass_bytes,
                    dc.cpu.map(|c| (c + e) % wd_sys::online_cpus()),
                    &iommu,
                )?);
            }
            let types = driver
                .algorithms()
                .into_iter()
                .map(|info| QueueType {
                    info,
                    available: Arc::new(AtomicU32::new(dc.queues)),
                    instances: dc.queues,
                })
                .collect();
            let priority = if dc.priority == 0 {
                driver.default_priority()
            } else {
                dc.priority
            };
            devices.push(Device {
                driver,
                numa_zone_id: AtomicI32::new(dc.numa_zone_id),
                priority: AtomicU32::new(priority),
                types,
                engines,
            });
        }
        let inner = Arc::new(HostInner {
            devices,
            queues: Mutex::new(HashMap::new()),
            next_queue: AtomicU32::new(1),
            next_conn: AtomicU64::new(1),
            owner_uid: wd_sys::geteuid(),
            quotas: quota::Quotas::new(cfg.limits.clone(), wd_sys::geteuid()),
            queue_details: cfg.queue_details,
            access: socket::AccessPolicy {
                mode: cfg.socket_mode,
                uid: wd_sys::geteuid(),
                gid: wd_sys::getegid(),
                allow_uids: cfg.allow_uids.clone(),
                allow_gids: cfg.allow_gids.clone(),
            },
            conns: Mutex::new(HashMap::new()),
            stopping: AtomicBool::new(false),
            iommu: iommu.clone(),
        });
        let stop_timers = Arc::new(AtomicBool::new(false));
        let st = stop_timers.clone();
        let timers = std::thread::Builder::new()
            .name("wd-iommu".into())
            .spawn(move || iommu_timers(iommu, st))?;
        let acc = inner.clone();
        let accept = std::thread::Builder::new()
            .name("wd-accept".into())
            .spawn(move || accept_loop(acc, listener))
            .inspect_err(|_| stop_timers.store(true, Ordering::Relaxed))?;
        Ok(Host {
            inner,
            address,
            accept: Some(accept),
            timers: Some((stop_timers, timers)),
            socket_file,
        })
    }

    /// Start a private host inside this process on a fresh abstract socket
    /// (what `WD_HOST=embedded` uses).
    pub fn embedded(devices: Vec<DeviceConfig>) -> Result<Host, HostError> {
        static N: AtomicU64 = AtomicU64::new(0);
        let cfg = HostConfig {
            socket: format!(
                "@wd-embedded-{}-{}",
                wd_sys::getpid(),
                N.fetch_add(1, Ordering::Relaxed)
            ),
            socket_mode: 0o600,
            devices,
            ..HostConfig::default()
        };
        Host::start(&cfg)
    }

    /// The address clients connect to.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Stop serving: every client sees the host go away.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if self.inner.stopping.swap(true, Ordering::SeqCst) {
            return;
        }
        // Wake the accept loop (it polls with a timeout) and hang up clients.
        for s in self
            .inner
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
        {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        // After the connections released their queues (and so flushed
        // their domains).
        if let Some((stop, t)) = self.timers.take() {
            stop.store(true, Ordering::Relaxed);
            let _ = t.join();
        }
        if let Some(f) = &self.socket_file {
            f.remove();
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Descriptors kept free for the host's own work (rings, wake lines,
/// shares, files): a connection or queue is refused once the descriptors
/// open come this close to the limit ([`short_of_descriptors`]).
pub(crate) const FD_HEADROOM: u64 = 64;

/// Whether the host is within [`FD_HEADROOM`] of its descriptor limit,
/// `newest` being the highest number just handed out: the count of open
/// descriptors where `/proc` tells it, else that number (a floor on the
/// count: closed descriptors leave holes below it, which let connections
/// through with fewer free when it alone was looked at).
pub(crate) fn short_of_descriptors(newest: u64) -> bool {
    let limit = wd_sys::nofile_limit().unwrap_or(1024);
    if newest + FD_HEADROOM >= limit {
        return true;
    }
    // Listed only when the table could hold that many (the listing costs
    // as much as the descriptors open; the table's size is read at once).
    if wd_sys::descriptor_table_size().is_some_and(|n| n + FD_HEADROOM < limit) {
        return false;
    }
    let open = wd_sys::open_descriptors().map_or(newest, |n| n.max(newest));
    open + FD_HEADROOM >= limit
}
/// How long the accept loop waits when the process is out of descriptors
/// (instead of spinning on a listener that stays readable).
const EMFILE_BACKOFF: Duration = Duration::from_millis(100);

/// Refuse a connection before any thread is spent on it.
fn refuse(sock: UnixStream, status: Status, msg: &str) {
    let _ = sock.set_write_timeout(Some(Duration::from_millis(100)));
    let ch = wd_ipc::Channel::new(sock);
    let _ = ch.send(&wd_proto::Message::error(status, msg), 0, &[]);
}

fn accept_loop(host: Arc<HostInner>, listener: UnixListener) {
    use std::os::fd::AsRawFd;
    let mut threads: Vec<JoinHandle<()>> = Vec::new();
    while !host.stopping.load(Ordering::SeqCst) {
        match wd_sys::poll(&[listener.as_fd()], Some(Duration::from_millis(100))) {
            Ok(r) if r[0].readable => {}
            _ => continue,
        }
        let sock = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if wd_sys::is_out_of_descriptors(&e) => {
                std::thread::sleep(EMFILE_BACKOFF);
                continue;
            }
            Err(_) => continue,
        };
        if let Err(why) = socket::admit(&host.access, &sock) {
            refuse(sock, Status::Permission, &why);
            continue;
        }
        threads.retain(|t| !t.is_finished());
        if short_of_descriptors(sock.as_raw_fd() as u64) {
            refuse(
                sock,
                Status::TooManyFiles,
                "host is out of file descriptors; try again later",
            );
            continue;
        }
        let Ok(cred) = wd_sys::peer_cred(&sock) else {
            continue;
        };
        let charge = match host.quotas.charge(cred.uid, quota::Resource::Connection) {
            Ok(c) => c,
            Err(e) => {
                refuse(sock, e.status(), &e.to_string());
                continue;
            }
        };
        let id = host.next_conn.fetch_add(1, Ordering::Relaxed);
        let Ok(clone) = sock.try_clone() else {
            refuse(
                sock,
                Status::TooManyFiles,
                "host is out of file descriptors",
            );
            continue;
        };
        host.conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, clone);
        let h = host.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("wd-conn{id}"))
            .spawn(move || {
                conn::serve(&h, sock, cred, charge);
                h.conns
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&id);
            });
        match spawned {
            Ok(t) => threads.push(t),
            Err(_) => {
                // The closure (socket and charge) is gone with the error;
                // the stored clone must go too, or it leaks for good.
                if let Some(s) = host
                    .conns
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&id)
                {
                    refuse(
                        s,
                        Status::NoMemory,
                        "host cannot start a thread for this connection",
                    );
                }
            }
        }
    }
    for t in threads {
        let _ = t.join();
    }
}
