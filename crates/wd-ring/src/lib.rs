//! Submission and completion rings in memory shared between a client and the
//! device host.
//!
//! The layout ([`RingLayout`]), the descriptor ([`Desc`]) and the 64-byte
//! entry formats ([`encode_sqe`], [`encode_cqe`]) are pure data;
//! [`RingView`] applies the ordering contract of `docs/rings.md` to a
//! mapped ring: each side polls the entry it waits for, whose sequence
//! word says when it is full, so a round trip moves two cache lines. Either side may be hostile: every index read from shared
//! memory is checked ([`RingError::Corrupt`]) before it is used.
#![deny(unsafe_code)]

mod layout;
mod view;

pub use layout::{
    decode_cqe, decode_sqe, encode_cqe, encode_sqe, latency_bucket, latency_bucket_bound,
    latency_percentile, sqe_continued, Desc, EntryBody, Extension, RingLayout, CLIENT_STATS,
    CLIENT_STAT_NAMES, COMPLETION_PAYLOAD, DESC_SIZE, ENTRY_SIZE, INLINE_PAYLOAD, LATENCY_BUCKETS,
    MAX_DEPTH, MIN_DEPTH, PAYLOAD_SIZE, QUEUE_STATS, QUEUE_STAT_NAMES, RING_MAGIC, RING_VERSION,
    SQE_CONTINUED,
};
pub use view::{
    engine_needs_wakeup_at, read_client_stats, read_latency, read_queue_stats, HostState, RingView,
    CQ_WAITING, SQ_NEED_WAKEUP,
};

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
    /// The ring was formatted by a host speaking another ring version.
    #[error("ring version {0} is not version {RING_VERSION}, the one this library speaks: the host and the client library must be upgraded together")]
    Version(u32),
    /// The peer wrote indices that cannot be right (more entries than the depth).
    #[error("ring corrupt: {0}")]
    Corrupt(&'static str),
    /// No free slot (submission) or no entry (completion).
    #[error("ring full")]
    Full,
}
