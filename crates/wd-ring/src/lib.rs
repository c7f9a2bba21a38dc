//! Submission and completion rings in memory shared between a client and the
//! device host.
//!
//! The layout ([`RingLayout`]) and the descriptor format ([`Desc`]) are pure
//! data; [`RingView`] applies the ordering contract of `docs/rings.md` to a
//! mapped ring. Either side may be hostile: every index read from shared
//! memory is checked ([`RingError::Corrupt`]) before it is used.
#![deny(unsafe_code)]

mod layout;
mod view;

pub use layout::{
    Desc, RingLayout, CLIENT_STATS, DESC_SIZE, MAX_DEPTH, MIN_DEPTH, PAYLOAD_SIZE, RING_MAGIC,
    RING_VERSION,
};
pub use view::{read_client_stats, HostState, RingView, CQ_WAITING, SQ_NEED_WAKEUP};

/// Errors of ring handling.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RingError {
    /// Depth is not a power of two within [MIN_DEPTH, MAX_DEPTH].
    #[error("ring depth {0} is not a power of two in {MIN_DEPTH}..={MAX_DEPTH}")]
    BadDepth(u32),
    /// The mapped memory is smaller than the layout needs.
    #[error("ring memory of {have} bytes is smaller than the {need} bytes the layout needs")]
    TooSmall {
        /// Bytes available.
        have: usize,
        /// Bytes required.
        need: usize,
    },
    /// The ring header does not describe a ring this code understands.
    #[error("ring header invalid: {0}")]
    BadHeader(&'static str),
    /// The peer wrote indices that cannot be right (more entries than the depth).
    #[error("ring corrupt: {0}")]
    Corrupt(&'static str),
    /// No free slot (submission) or no entry (completion).
    #[error("ring full")]
    Full,
}
