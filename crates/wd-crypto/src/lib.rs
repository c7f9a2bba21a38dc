//! Cipher and digest libraries on WrapDrive's sec device.
//!
//! ```no_run
//! use wd_crypto::{Cipher, Digest, Direction};
//! let mut c = Cipher::new("aes-128-cbc", &[0u8; 16], Direction::Encrypt)?;
//! c.set_iv(&[0u8; 16])?;
//! let mut out = vec![0u8; 4096];
//! c.update(&vec![1u8; 4096], &mut out)?;      // chained: call again to go on
//! let mut d = Digest::new("sha256", &[])?;
//! d.update(b"abc")?;
//! let sum = d.finish()?;
//! # Ok::<(), wd_crypto::CryptoError>(())
//! ```
//!
//! Keys live in host-side sessions (sent once); each thread gets its own
//! queues (the scheduler), with a staging area of shared memory the device
//! works in. The library computes on the CPU, with OpenSSL's default
//! implementation, when a request is below the threshold, when no queue
//! can be had, or when the host goes away, and counts every such request
//! ([`stats`]): it never falls back silently.
#![deny(unsafe_code)]

mod aead;
mod cipher;
pub mod config;
mod digest;
pub mod lane;
pub mod route;
mod stats;

pub use aead::Aead;
pub use cipher::{Cipher, Direction, Job};
pub use config::Policy;
pub use digest::Digest;
pub use stats::{count_cpu, stats, Stats, Why};
pub use wd_sec_msg::{Alg, Hash, Mode, ALGS};

use wrapdrive::{ClientError, Status};

/// Errors of the algorithm libraries.
#[derive(Debug, thiserror::Error)]
pub enum CryptoError {
    /// The caller asked for something impossible (unknown algorithm, bad
    /// key, IV or tag length, misaligned data...).
    #[error("{0}")]
    Invalid(String),
    /// AEAD authentication failed: no plaintext was released.
    #[error("authentication failed: the tag does not match")]
    Auth,
    /// Every staging slot of this thread is in flight.
    #[error("too many requests in flight on this thread")]
    Busy,
    /// The device or host refused the request.
    #[error("{message}")]
    Device {
        /// Status class.
        status: Status,
        /// What went wrong.
        message: String,
    },
}

impl CryptoError {
    /// Positive errno of this error (for the C API).
    pub fn errno(&self) -> i32 {
        match self {
            CryptoError::Invalid(_) => Status::Invalid.errno(),
            CryptoError::Auth => Status::AuthFailed.errno(),
            CryptoError::Busy => Status::Again.errno(),
            CryptoError::Device { status, .. } => status.errno(),
        }
    }

    /// Whether the host went away (the library then uses the CPU).
    pub fn host_gone(&self) -> bool {
        matches!(
            self,
            CryptoError::Device {
                status: Status::HostGone,
                ..
            }
        )
    }

    fn invalid(msg: impl Into<String>) -> CryptoError {
        CryptoError::Invalid(msg.into())
    }
}

impl From<ClientError> for CryptoError {
    fn from(e: ClientError) -> Self {
        CryptoError::Device {
            status: e.status(),
            message: e.to_string(),
        }
    }
}

impl From<wd_evp::EvpError> for CryptoError {
    fn from(e: wd_evp::EvpError) -> Self {
        CryptoError::Invalid(e.to_string())
    }
}

/// Result alias of the algorithm libraries.
pub type Result<T> = std::result::Result<T, CryptoError>;
