//! Process-wide settings (threshold, policy, fallback), the counters, and
//! the routing calls of callers that compute on the CPU themselves.

use std::ffi::c_int;

use crypto::route::{self, Op, Route};
use crypto::{config, Policy, Why};

use crate::*;

/// Set the threshold.
#[no_mangle]
pub extern "C" fn wd_crypto_set_threshold(bytes: usize) -> c_int {
    config::set_threshold(bytes);
    0
}

/// Allow or forbid the CPU fallback without a queue.
#[no_mangle]
pub extern "C" fn wd_crypto_set_fallback(on: c_int) -> c_int {
    config::set_fallback(on != 0);
    0
}

/// Set the policy.
#[no_mangle]
pub extern "C" fn wd_crypto_set_policy(policy: c_int) -> c_int {
    let p = match policy {
        0 => Policy::Auto,
        1 => Policy::Offload,
        2 => Policy::Cpu,
        _ => return invalid("wd_crypto_set_policy: unknown policy"),
    };
    config::set_policy(p);
    0
}

/// `struct wd_crypto_stats`: eight u64 counters in the order of
/// `wd_ring::CLIENT_STAT_NAMES` (`Stats::to_array`).
type WdCryptoStats = [u64; wd_ring::CLIENT_STATS];

/// Read the counters.
///
/// # Safety
/// Pointers as `include/wd_crypto.h` documents.
#[no_mangle]
pub unsafe extern "C" fn wd_crypto_get_stats(out: *mut WdCryptoStats) -> c_int {
    if out.is_null() {
        return invalid("wd_crypto_get_stats: NULL out-pointer");
    }
    let v = crypto::stats().to_array();
    // SAFETY: out is non-null and caller-owned.
    unsafe { out.write_unaligned(v) };
    0
}

/// Send `wd_alloc` buffers to the device in place (1) or through the
/// staging area (0, the default).
#[no_mangle]
pub extern "C" fn wd_crypto_set_in_place(on: c_int) -> c_int {
    if on != 0 && on != 1 {
        return invalid("wd_crypto_set_in_place: 0 or 1");
    }
    crypto::config::set_in_place(on == 1);
    0
}

/// Bytes the device read and wrote where the caller had them.
///
/// # Safety
/// Pointers as `include/wd_crypto.h` documents.
#[no_mangle]
pub unsafe extern "C" fn wd_crypto_get_in_place_bytes(out: *mut u64) -> c_int {
    if out.is_null() {
        return invalid("wd_crypto_get_in_place_bytes: NULL out-pointer");
    }
    let v = crypto::stats().offload_in_place_bytes;
    // SAFETY: out is non-null and caller-owned.
    unsafe { out.write_unaligned(v) };
    0
}

fn kind(k: c_int) -> Option<Op> {
    match k {
        0 => Some(Op::Cipher),
        1 => Some(Op::Digest),
        2 => Some(Op::Aead),
        _ => None,
    }
}

fn why_code(w: Why) -> c_int {
    match w {
        Why::Threshold => 1,
        Why::NoQueue => 2,
        Why::HostGone => 3,
        Why::Policy => 4,
    }
}

/// Route a request.
#[no_mangle]
pub extern "C" fn wd_crypto_route(k: c_int, len: usize, asynchronous: c_int) -> c_int {
    guard_with(|| {
        let Some(k) = kind(k) else {
            return invalid("wd_crypto_route: unknown kind");
        };
        let (r, timed) = route::choose_timed(k, len, asynchronous != 0);
        let t = if timed { 0x200 } else { 0 };
        match r {
            Route::Device => 0x100 | t,
            Route::Cpu(w) => why_code(w) | t,
        }
    })
}

/// The head of `struct wd_route_memo` (`include/wd_crypto.h`): the inline
/// functions there read and write it; the library only fills this much of
/// it, the fields a caller built against `WD_CRYPTO_0.2` has (the later
/// ones are the inline functions' alone, read only once they wrote them).
#[repr(C)]
pub struct WdRouteMemo {
    threshold: usize,
    policy: c_int,
    route: c_int,
    left: c_int,
    asynchronous: c_int,
}

/// Fill a routing memo with the current settings and no answer yet.
///
/// # Safety
/// `m` is NULL or points to a `struct wd_route_memo` the caller owns.
#[no_mangle]
pub unsafe extern "C" fn wd_route_memo_init(m: *mut WdRouteMemo) {
    if m.is_null() {
        return;
    }
    let v = WdRouteMemo {
        threshold: config::threshold(),
        policy: config::policy() as c_int,
        route: 0,
        left: 0,
        asynchronous: 0,
    };
    // SAFETY: m is non-null and points to caller-owned memory at least
    // this structure's size (the header's layout begins with these
    // fields, which repr(C) lays out alike).
    unsafe { m.write_unaligned(v) };
}

/// Report a timed request.
#[no_mangle]
pub extern "C" fn wd_crypto_record(k: c_int, len: usize, on_cpu: c_int, ns: u64) {
    guard_with(|| {
        if let Some(k) = kind(k) {
            route::record(k, len, on_cpu != 0, std::time::Duration::from_nanos(ns));
        }
        0
    });
}

/// Count requests computed by the caller.
#[no_mangle]
pub extern "C" fn wd_crypto_count_cpu(requests: u64, bytes: u64, reason: c_int) {
    let w = match reason {
        1 => Why::Threshold,
        2 => Why::NoQueue,
        3 => Why::HostGone,
        _ => Why::Policy,
    };
    crypto::count_cpu(requests, bytes, w);
}

/// The threshold.
#[no_mangle]
pub extern "C" fn wd_crypto_get_threshold() -> usize {
    config::threshold()
}

/// The policy.
#[no_mangle]
pub extern "C" fn wd_crypto_get_policy() -> c_int {
    config::policy() as c_int
}

/// Whether the CPU fallback is on (what `wd_crypto_set_fallback` or
/// `$WD_CRYPTO_FALLBACK` chose).
#[no_mangle]
pub extern "C" fn wd_crypto_get_fallback() -> c_int {
    config::fallback() as c_int
}
