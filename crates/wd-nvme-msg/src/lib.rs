//! The NVMe interface of WrapDrive's mediated controller, as pure logic
//! shared by the controller (`wd-nvme`) and the drivers that talk to it:
//! controller registers, submission and completion entries, status codes,
//! PRP walking and the Identify structures. Values that come from the
//! other side are decoded into typed ones here (`TryFrom`), once.
//!
//! Numbers follow the NVM Express Base Specification 1.4 (register block,
//! admin commands, status codes) and its NVM command set.
#![deny(unsafe_code)]

pub mod cmd;
pub mod identify;
pub mod prp;
pub mod regs;
pub mod status;

pub use cmd::{AdminOp, Cqe, IoOp, Sqe, CQE_SIZE, SQE_SIZE};
pub use prp::{PrpError, PrpSegments};
pub use status::Status;

/// Queue type name a client asks the host for to get a controller.
pub const QUEUE_TYPE: &str = "nvme";

/// Message-format version of the controller (bumped on incompatible
/// changes of the register block's use).
pub const DEVICE_API: u32 = 1;

/// Memory page size the controller supports (CAP.MPSMIN = CAP.MPSMAX):
/// 4 KiB, the one every driver uses.
pub const PAGE: u64 = 4096;
