//! `libwd_embedded.so`'s entry point, looked up by the client libraries
//! (see `wrapdrive::EMBEDDED_LIBRARY`): one host per process, started on
//! the first call and never stopped (its threads run this library's code,
//! which is never unloaded).
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

use wrapdrive::EmbeddedHost;

/// The host and the fork generation (this copy's) that started it.
static HOST: Mutex<Option<(u64, EmbeddedHost)>> = Mutex::new(None);

fn process_host() -> wrapdrive::Result<String> {
    let generation = wrapdrive::fork_generation();
    let mut g = HOST.lock().unwrap_or_else(|e| e.into_inner());
    match g.take() {
        Some((gen, h)) if gen == generation => {
            let addr = h.address.clone();
            *g = Some((gen, h));
            return Ok(addr);
        }
        // A forked child: the parent's host has no threads here (dropping
        // it would wait for them); the child starts its own.
        Some((_, h)) => std::mem::forget(h),
        None => {}
    }
    let h = crate::start()?;
    let addr = h.address.clone();
    *g = Some((generation, h));
    Ok(addr)
}

/// Start (once) this process's host and write its socket address, NUL
/// terminated, into `text` (`len` bytes); on failure write the reason
/// there instead. Returns 0 or a negative errno (-ERANGE: `text` too
/// short, -EINVAL: NULL).
///
/// # Safety
/// `text` must be NULL or point to `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn wd_embedded_start(text: *mut c_char, len: usize) -> c_int {
    const EINVAL: c_int = 22;
    const ERANGE: c_int = 34;
    const EIO: c_int = 5;
    if text.is_null() || len == 0 {
        return -EINVAL;
    }
    let (rc, msg) = match catch_unwind(AssertUnwindSafe(process_host)) {
        Ok(Ok(addr)) => (0, addr),
        Ok(Err(e)) => (-e.errno(), e.to_string()),
        Err(_) => (
            -EIO,
            "internal error in libwd_embedded (panic caught)".to_string(),
        ),
    };
    let bytes = msg.as_bytes();
    let n = bytes.len().min(len - 1);
    // SAFETY: text has room for len bytes (caller contract) and n < len.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), text, n);
        text.add(n).write(0);
    }
    if rc == 0 && n < bytes.len() {
        return -ERANGE;
    }
    rc
}
