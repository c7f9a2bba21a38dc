//! Errors at the C boundary: a negative errno, and the detailed message
//! kept where `wd_last_error` (in libwd.so) reads it. The two libraries
//! are separate objects, so the message crosses through libwd.so's
//! private `wd__set_last_error`, found when libwd.so is loaded (a program
//! calling `wd_last_error` links it; a plugin such as the OpenSSL provider
//! has it as a dependency).

use std::ffi::{c_int, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use wd_sys::dl::TextSink;

pub(crate) const EINVAL: c_int = 22;
pub(crate) const ENOMEM: c_int = 12;
const EIO: c_int = 5;
/// libwd.so's setter of this thread's last error message.
const SET_LAST_ERROR: &str = "wd__set_last_error";

fn set_last(msg: &str) {
    static SINK: OnceLock<Option<TextSink>> = OnceLock::new();
    if let Some(sink) = SINK.get_or_init(|| TextSink::find_loaded("libwd.so", SET_LAST_ERROR)) {
        let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
        sink.send(&c);
    }
}

/// Record `msg` as this thread's last error; returns `-errno`.
pub(crate) fn fail(errno: c_int, msg: &str) -> c_int {
    set_last(msg);
    -errno
}

/// Run an entry point that returns a C status itself; a panic is -EIO.
pub(crate) fn guard_with(f: impl FnOnce() -> c_int) -> c_int {
    catch_unwind(AssertUnwindSafe(f))
        .unwrap_or_else(|_| fail(EIO, "internal error in libwd_crypto (panic caught)"))
}
