//! The sec device: AES in ECB, CBC, CTR, XTS and GCM modes, SHA-1/SHA-2
//! digests and HMAC, served through WrapDrive queues.
//!
//! Keys live in host-side sessions referenced by handle (never re-sent
//! per request); a session keeps its chaining state between requests, so
//! CBC/CTR streams and incremental digests span many requests. The work is
//! done by OpenSSL's libcrypto (`wd-evp`), in place in the client's shared
//! memory when the IOMMU domain maps it contiguously; AES-CBC encryption,
//! serial within one message, goes to intel-ipsec-mb's multi-buffer engine
//! when it is installed (`wd-ipsecmb`), which encrypts the requests of a
//! batch side by side ([`mb`]).
//!
//! The message format both sides speak is its own crate, `wd-sec-msg`
//! (re-exported as [`msg`]), so clients speak it without this device;
//! [`device`] is the driver.
#![deny(unsafe_code)]

pub mod device;
mod dma;
mod long;
mod mb;
mod open;
mod xts;

pub use wd_evp as evp;
pub use wd_sec_msg as msg;

pub use device::{EngineChoice, SecDriver, SecQueue, TYPE_CIPHER, TYPE_DIGEST};
pub use msg::{Alg, Hash, Mode};
pub use open::OPEN_MEMORY;
