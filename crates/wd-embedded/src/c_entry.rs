//! `libwd_embedded.so`'s entry point, looked up by the client libraries
//! (see `wrapdrive::EMBEDDED_LIBRARY`): one host per process, started on
//! the first call and never stopped (its threads run this library's code,
//! which is never unloaded).
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// This copy of the client library's in-process host slot (fork-safe:
/// a child starts its own), started with this library's `start`.
fn process_host() -> wrapdrive::Result<String> {
    crate::install();
    wrapdrive::embedded_process_host().map(|h| h.address)
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
