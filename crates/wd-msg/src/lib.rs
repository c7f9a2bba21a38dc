//! What every device message format shares, so a format crate (used by
//! both the device and its clients) needs neither the host nor a device:
//! the statuses requests complete with and the legacy plan.
//!
//! Pure logic, no I/O.
#![deny(unsafe_code)]

use wd_ring::Desc;

/// How a request travels on the legacy (socket) path: which client ranges
/// go into the request payload, which come back from the reply payload, and
/// the descriptor rewritten to address those payloads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LegacyPlan {
    /// Client ranges (address, length) gathered, in order, into the payload.
    pub inputs: Vec<(u64, u64)>,
    /// Client ranges (address, length) scattered, in order, from the reply;
    /// the last one receives whatever the reply holds, up to its length
    /// (a digest's length is known only when it is produced).
    pub outputs: Vec<(u64, u64)>,
    /// The descriptor to send.
    pub desc: Desc,
}

/// A message format's legacy planner: only the format knows which of a
/// descriptor's fields are client addresses, so the library that speaks
/// the format hands this to the queue (`Queue::set_legacy_planner`).
/// `Err` is the status to complete a malformed request with.
pub type LegacyPlanner = fn(&Desc) -> Result<LegacyPlan, i32>;

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
    /// No such session.
    pub const ENOENT: i32 = -2;
    /// Session table full.
    pub const ENOSPC: i32 = -28;
    /// Authentication failed (AEAD tag mismatch), or compressed data is
    /// corrupt or truncated.
    pub const EBADMSG: i32 = -74;
    /// The output buffer is too small for the result.
    pub const ENOBUFS: i32 = -105;
    /// Decompression would expand beyond the request's ratio limit.
    pub const EOVERFLOW: i32 = -75;
    /// Internal error of the device.
    pub const EIO: i32 = -5;
}
