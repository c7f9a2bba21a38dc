//! Devices plug into the host through [`Driver`]: a name, the algorithms it
//! serves, and engines that process requests.
//!
//! An engine never sees raw client memory: it reaches request data through a
//! [`Dma`] context, which translates every address through the queue's IOMMU
//! domain (or the process_vm / legacy paths), so a driver cannot touch what
//! the client did not share.
#![deny(unsafe_code)]

pub mod dummy;

pub use wd_iommu::Fault;
use wd_ring::Desc;

/// Errors of device set-up.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// A configuration option was not understood or out of range.
    #[error("device {device}: {message}")]
    Config {
        /// Driver name.
        device: String,
        /// What was wrong.
        message: String,
    },
}

/// One algorithm (queue type) a driver serves: the seed's
/// `mdev_supported_types/<driver>-<alg>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AlgInfo {
    /// Algorithm name, e.g. "memcpy".
    pub name: &'static str,
    /// Feature bits a client can test.
    pub flags: u32,
    /// Message-format version a client must speak.
    pub device_api: u32,
}

/// Device memory access for one request, already bound to the request's
/// queue and memory model.
pub trait Dma {
    /// Copy `len` bytes from device address `src` to `dst` (both translated).
    fn copy(&mut self, dst: u64, src: u64, len: u64) -> Result<(), Fault>;
    /// Read device memory into a local buffer.
    fn read(&mut self, src: u64, buf: &mut [u8]) -> Result<(), Fault>;
    /// Write a local buffer to device memory.
    fn write(&mut self, dst: u64, data: &[u8]) -> Result<(), Fault>;
}

/// Per-thread processing state of a device.
pub trait Engine: Send {
    /// Process one request in place: set `desc.status` (0 or a negative
    /// errno) and `desc.result`. Must not panic on any descriptor content.
    fn process(&mut self, alg: u32, desc: &mut Desc, dma: &mut dyn Dma);
}

/// A device driver.
pub trait Driver: Send + Sync {
    /// Driver name, e.g. "dummy".
    fn name(&self) -> &'static str;
    /// Algorithms served; the index into this list is the `alg` passed to
    /// [`Engine::process`].
    fn algorithms(&self) -> Vec<AlgInfo>;
    /// Priority used when several devices serve an algorithm (higher wins).
    fn default_priority(&self) -> u32 {
        0
    }
    /// One engine's state; called once per engine thread.
    fn new_engine(&self) -> Box<dyn Engine>;
}

/// Negative errno values devices complete requests with.
pub mod status {
    /// Success.
    pub const OK: i32 = 0;
    /// Malformed request.
    pub const EINVAL: i32 = -22;
    /// Translation fault.
    pub const EFAULT: i32 = -14;
    /// Unknown operation.
    pub const EOPNOTSUPP: i32 = -95;
    /// Request too large.
    pub const EMSGSIZE: i32 = -90;
    /// Queue torn down before the request ran.
    pub const ECANCELED: i32 = -125;
}

/// Look up a driver by name.
pub fn driver_by_name(name: &str) -> Option<Box<dyn Driver>> {
    match name {
        "dummy" => Some(Box::new(dummy::DummyDriver)),
        _ => None,
    }
}

/// Names of all built-in drivers.
pub const DRIVERS: &[&str] = &["dummy"];
