//! Process-wide settings of the algorithm libraries, from the environment
//! at first use and from the API.
//!
//! * `WD_CRYPTO_THRESHOLD`: requests smaller than this many bytes are
//!   computed on the CPU (0: no request for its size; the policy decides
//!   every one, and `auto` may still choose the CPU). Default [`DEFAULT_THRESHOLD`].
//! * `WD_CRYPTO_POLICY`: `auto` (default: offload when it pays, see
//!   [`Policy::Auto`]), `offload` (always, above the threshold) or `cpu`.
//! * `WD_CRYPTO_LEGACY=1`: use queues with `WD_CAPA_ALLOW_LEGACY` (data
//!   through the socket, a system call per request: the baseline).
//! * `WD_CRYPTO_FALLBACK=0` (or `no`, `off`, `false`): without a queue (no
//!   host, no device, host gone) fail with a clear error instead of
//!   computing on the CPU.
//! * `WD_CRYPTO_HOST`, else `WD_HOST`: which host (see `wrapdrive`).
//! * `WD_CRYPTO_IN_PLACE=1`: callers' buffers that are WrapDrive shared
//!   memory go to the device in place instead of through the staging area.
//!   Off by default: measured here (`wd speed`), a caller that writes its
//!   input and reads its output around each request is slower in place
//!   (the engine then moves two buffers between the cores, not one slot).

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Once};

use wrapdrive::HostConn;

use crate::Result;

/// Default small-request threshold in bytes.
pub const DEFAULT_THRESHOLD: usize = 256;

/// Where requests above the threshold go (the router's policies).
pub use wd_route::Policy;

static INIT: Once = Once::new();
static THRESHOLD: AtomicUsize = AtomicUsize::new(DEFAULT_THRESHOLD);
static POLICY: AtomicU8 = AtomicU8::new(Policy::Auto as u8);
static LEGACY: AtomicBool = AtomicBool::new(false);
static FALLBACK: AtomicBool = AtomicBool::new(true);
static IN_PLACE: AtomicBool = AtomicBool::new(false);

fn init() {
    INIT.call_once(|| {
        // A setting that does not parse is said once, on stderr (there is
        // no caller to return it to), and the default kept.
        if let Ok(v) = std::env::var("WD_CRYPTO_THRESHOLD") {
            match v.trim().parse::<usize>() {
                Ok(t) => THRESHOLD.store(t, Ordering::Relaxed),
                Err(_) => eprintln!(
                    "wrapdrive: WD_CRYPTO_THRESHOLD='{v}' is not a byte count; the default ({DEFAULT_THRESHOLD}) stays"
                ),
            }
        }
        if let Ok(v) = std::env::var("WD_CRYPTO_POLICY") {
            match v.parse::<Policy>() {
                Ok(p) => POLICY.store(p as u8, Ordering::Relaxed),
                Err(_) => eprintln!(
                    "wrapdrive: WD_CRYPTO_POLICY='{v}' is not auto, offload or cpu; auto stays"
                ),
            }
        }
        if std::env::var("WD_CRYPTO_LEGACY").is_ok_and(|v| v == "1") {
            LEGACY.store(true, Ordering::Relaxed);
        }
        if let Ok(v) = std::env::var("WD_CRYPTO_FALLBACK") {
            match wd_route::parse_switch(&v) {
                Ok(on) => FALLBACK.store(on, Ordering::Relaxed),
                Err(_) => eprintln!(
                    "wrapdrive: WD_CRYPTO_FALLBACK='{v}' is not 1/yes/on/true or 0/no/off/false; fallback stays on"
                ),
            }
        }
        if std::env::var("WD_CRYPTO_IN_PLACE").is_ok_and(|v| v == "1") {
            IN_PLACE.store(true, Ordering::Relaxed);
        }
    });
}

/// The small-request threshold.
pub fn threshold() -> usize {
    init();
    THRESHOLD.load(Ordering::Relaxed)
}

/// Set the small-request threshold (0: none; the policy decides every request).
pub fn set_threshold(bytes: usize) {
    init();
    THRESHOLD.store(bytes, Ordering::Relaxed);
}

/// The routing policy.
pub fn policy() -> Policy {
    init();
    match POLICY.load(Ordering::Relaxed) {
        1 => Policy::Offload,
        2 => Policy::Cpu,
        _ => Policy::Auto,
    }
}

/// Set the routing policy.
pub fn set_policy(p: Policy) {
    init();
    POLICY.store(p as u8, Ordering::Relaxed);
}

/// Whether lanes use legacy (socket) queues.
pub fn legacy() -> bool {
    init();
    LEGACY.load(Ordering::Relaxed)
}

/// Use legacy (socket) queues for lanes opened from now on.
pub fn set_legacy(on: bool) {
    init();
    LEGACY.store(on, Ordering::Relaxed);
}

/// Whether requests run on the CPU when there is no queue (else they fail).
pub fn fallback() -> bool {
    init();
    FALLBACK.load(Ordering::Relaxed)
}

/// Allow or forbid the CPU fallback when there is no queue.
pub fn set_fallback(on: bool) {
    init();
    FALLBACK.store(on, Ordering::Relaxed);
}

/// The configured host's address.
pub fn host_address() -> String {
    std::env::var("WD_CRYPTO_HOST")
        .or_else(|_| std::env::var("WD_HOST"))
        .unwrap_or_else(|_| wrapdrive::DEFAULT_HOST.to_string())
}

/// Connect to the configured host.
pub fn connect() -> Result<Arc<HostConn>> {
    Ok(HostConn::connect(&host_address())?)
}

/// Whether buffers of shared memory given as slices (the C API's
/// `wd_alloc` buffers) go to the device in place.
pub fn in_place() -> bool {
    init();
    IN_PLACE.load(Ordering::Relaxed)
}

/// Send shared-memory buffers in place, or through the staging area.
pub fn set_in_place(on: bool) {
    init();
    IN_PLACE.store(on, Ordering::Relaxed);
}
