//! The mediated NVMe device: every `nvme` queue a client asks for is a
//! virtual NVMe controller of its own. The client drives it as a driver
//! drives hardware, through a register block (CAP, CC, CSTS, AQA/ASQ/ACQ,
//! doorbells) that the host shares with it, and queues and data in its own
//! shared memory, which the controller reaches only through the queue's
//! IOMMU domain. The engine thread runs the controller on every pass
//! (polling), and sleeps after the device's idle time (0.5 s unless
//! configured) until a doorbell write wakes it.
//!
//! Namespaces are ranges of backing files or block devices named in the
//! device's configuration; a controller attaches the ones it uses
//! (Namespace Attachment), one controller at a time, so clients sharing a
//! store cannot reach each other's blocks.
#![deny(unsafe_code)]

mod admin;
mod ctrl;
mod io;
pub mod store;
mod xfer;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use ctrl::Controller;
pub use store::{NamespaceSpec, StoreError, Subsystem};
use wd_device::{AlgInfo, DeviceQueue, Driver};
pub use wd_nvme_msg as msg;
use wd_nvme_msg::regs;

/// How a device's controllers reach their stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoEngine {
    /// Reads and writes on an io_uring per controller, many in flight,
    /// into the client's memory held in place (the default where io_uring
    /// works).
    Ring,
    /// One positional read or write at a time in the polling thread.
    Sync,
}

impl std::str::FromStr for IoEngine {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(if wd_sys::uring::probe().is_ok() {
                IoEngine::Ring
            } else {
                IoEngine::Sync
            }),
            "io_uring" => wd_sys::uring::probe()
                .map(|_| IoEngine::Ring)
                .map_err(|e| format!("engine=io_uring: io_uring unavailable: {e}")),
            "sync" => Ok(IoEngine::Sync),
            _ => Err(format!("unknown nvme engine '{s}' (auto, io_uring, sync)")),
        }
    }
}

/// Counters of one device, across its controllers.
#[derive(Debug, Default)]
pub struct Counters {
    /// Commands completed.
    pub commands: AtomicU64,
    /// Bytes read and written.
    pub bytes: AtomicU64,
    /// Controller passes (polls).
    pub polls: AtomicU64,
}

/// The `nvme` driver: its namespaces and its controllers' ids.
pub struct NvmeDriver {
    sub: Arc<Subsystem>,
    io: IoEngine,
    counters: Arc<Counters>,
}

impl NvmeDriver {
    /// A device serving the namespaces `specs` (`PATH:OFFSET:SIZE[:BLOCK]`)
    /// through `io`.
    pub fn new(specs: &[String], io: IoEngine) -> Result<NvmeDriver, StoreError> {
        Ok(NvmeDriver {
            sub: Arc::new(Subsystem::open(specs)?),
            io,
            counters: Arc::new(Counters::default()),
        })
    }

    /// The namespaces and which controller holds each.
    pub fn subsystem(&self) -> &Arc<Subsystem> {
        &self.sub
    }

    /// The device's counters.
    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }
}

impl Driver for NvmeDriver {
    fn name(&self) -> &'static str {
        "nvme"
    }

    fn algorithms(&self) -> Vec<AlgInfo> {
        vec![AlgInfo {
            name: wd_nvme_msg::QUEUE_TYPE,
            flags: 0,
            device_api: wd_nvme_msg::DEVICE_API,
        }]
    }

    fn engine(&self) -> Option<String> {
        Some(
            match self.io {
                IoEngine::Ring => {
                    "io_uring per controller for O_DIRECT stores (many commands in flight), page-cache stores synchronously in the polling thread"
                }
                IoEngine::Sync => "synchronous I/O in the polling thread (engine=sync)",
            }
            .to_string(),
        )
    }

    fn attributes(&self) -> Vec<(String, String, bool)> {
        let c = &self.counters;
        let n = |v: &AtomicU64| v.load(Ordering::Relaxed).to_string();
        let mut a = vec![
            ("nvme/commands".to_string(), n(&c.commands), false),
            ("nvme/bytes".to_string(), n(&c.bytes), false),
            ("nvme/polls".to_string(), n(&c.polls), false),
            // Write-only actions: reading them shows how to use them.
            (
                "nvme/add_namespace".to_string(),
                "(write PATH:OFFSET:SIZE[:BLOCK])".to_string(),
                true,
            ),
            (
                "nvme/remove_namespace".to_string(),
                "(write an NSID)".to_string(),
                true,
            ),
        ];
        for ns in self.sub.namespaces() {
            let b = format!("nvme/ns{}", ns.nsid);
            a.push((
                format!("{b}/store"),
                ns.spec.path.display().to_string(),
                false,
            ));
            a.push((format!("{b}/offset"), ns.spec.offset.to_string(), false));
            a.push((format!("{b}/size"), ns.spec.size.to_string(), false));
            a.push((format!("{b}/block_size"), ns.spec.block.to_string(), false));
            a.push((
                format!("{b}/io"),
                match &ns.buffered_why {
                    None => "O_DIRECT".to_string(),
                    Some(w) => format!("buffered ({w})"),
                },
                false,
            ));
            a.push((
                format!("{b}/controller"),
                self.sub
                    .owner(ns.nsid)
                    .map_or("none".to_string(), |c| c.to_string()),
                false,
            ));
        }
        a
    }

    fn set_attribute(&self, name: &str, value: &str) -> Result<(), String> {
        match name {
            "nvme/add_namespace" => {
                let text = value.trim();
                let spec: NamespaceSpec = text.parse().map_err(|e: StoreError| e.to_string())?;
                if spec.path.is_relative() {
                    // The client's directory is not the host's.
                    return Err(format!(
                        "namespace '{text}': the path is relative, and the host would resolve it in its own directory: give an absolute path"
                    ));
                }
                self.sub.add(text).map(|_| ()).map_err(|e| e.to_string())
            }
            "nvme/remove_namespace" => {
                let nsid = value
                    .trim()
                    .parse::<u32>()
                    .map_err(|_| format!("'{value}' is not a namespace id"))?;
                self.sub.remove(nsid).map_err(|e| e.to_string())
            }
            _ => Err(format!("attribute '{name}' is not writable")),
        }
    }

    fn register_bytes(&self, _alg: u32) -> usize {
        regs::BLOCK_BYTES
    }

    fn idle_spin(&self) -> Duration {
        Duration::from_millis(500)
    }

    fn open_queue(&self, _alg: u32) -> Box<dyn DeviceQueue> {
        let id = self
            .sub
            .new_controller()
            .expect("65519 live controllers: the host offers a queue type at most 4096 instances");
        Box::new(Controller::new(
            self.sub.clone(),
            self.counters.clone(),
            id,
            self.io,
        ))
    }
}
