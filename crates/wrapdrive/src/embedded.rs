//! The hook through which an in-process host reaches this library, which
//! does not carry one: a program that wants `WD_HOST=embedded` links the
//! `wd-embedded` crate (which registers its starter here), or, from C,
//! has `libwd_embedded.so` installed beside the library, loaded on first
//! use. Either way one host serves the whole process.

use std::any::Any;
use std::sync::{Arc, Mutex};

use wd_proto::Status;

use crate::{ClientError, Result};

/// The shared object loaded when no starter is registered, and its entry
/// point: `int wd_embedded_start(char *address, size_t len)` starts the
/// process's host once and writes its socket address (or, on failure, the
/// reason) there.
pub const EMBEDDED_LIBRARY: &str = "libwd_embedded.so";
const EMBEDDED_ENTRY: &str = "wd_embedded_start";
/// Room for an address or an error message from the entry point.
const ENTRY_TEXT: usize = 1024;

/// An in-process host as a client sees it: where it listens, and what
/// keeps it running (held by every connection to it).
#[derive(Clone)]
pub struct EmbeddedHost {
    /// Socket address (`@name` for an abstract socket).
    pub address: String,
    /// Dropped last by the last connection: stops the host.
    pub keep: Arc<dyn Any + Send + Sync>,
}

impl std::fmt::Debug for EmbeddedHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedHost")
            .field("address", &self.address)
            .finish()
    }
}

/// Starts the process's in-process host (called once, on first use).
pub type EmbeddedStarter = fn() -> Result<EmbeddedHost>;

static STARTER: Mutex<Option<EmbeddedStarter>> = Mutex::new(None);
/// The running host and the fork generation that started it: a forked
/// child has none of its threads, so it starts its own.
static RUNNING: Mutex<Option<(u64, EmbeddedHost)>> = Mutex::new(None);

type RunningGuard = std::sync::MutexGuard<'static, Option<(u64, EmbeddedHost)>>;

thread_local! {
    /// `RUNNING`'s lock, held by the forking thread across a fork: a host
    /// being started holds it, and a child must not inherit it held by a
    /// thread it does not have (its every connect would wait for ever).
    static HELD_FOR_FORK: std::cell::RefCell<Option<RunningGuard>> =
        const { std::cell::RefCell::new(None) };
}

/// Before a fork (in the forking thread, before the allocator's lock: a
/// starting host takes that one inside this one).
pub(crate) fn before_fork() {
    let _ = HELD_FOR_FORK.try_with(|h| {
        let mut h = h.borrow_mut();
        if h.is_none() {
            *h = Some(RUNNING.lock().unwrap_or_else(|e| e.into_inner()));
        }
    });
}

/// After a fork, in the parent and in the child: let go of it.
pub(crate) fn after_fork() {
    let _ = HELD_FOR_FORK.try_with(|h| h.borrow_mut().take());
}

/// Make `WD_HOST=embedded` (and [`crate::HostConn::embedded`]) start hosts
/// with `start`. Called by `wd_embedded::install`; a later call replaces an
/// earlier one, but a host already running keeps serving.
pub fn register_embedded_host(start: EmbeddedStarter) {
    *STARTER.lock().unwrap_or_else(|e| e.into_inner()) = Some(start);
}

/// The process's in-process host, started on first use (with the starter
/// registered, else from libwd_embedded.so); a forked child starts its
/// own. Also what libwd_embedded.so's entry point hands out.
pub fn process_host() -> Result<EmbeddedHost> {
    let generation = crate::fork_generation();
    let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
    match running.take() {
        Some((g, h)) if g == generation => {
            *running = Some((g, h.clone()));
            return Ok(h);
        }
        // The parent's host (a forked child): its threads are not here,
        // so dropping it would wait for them for ever; it stays as it is.
        Some((_, h)) => std::mem::forget(h),
        None => {}
    }
    let starter = *STARTER.lock().unwrap_or_else(|e| e.into_inner());
    let h = match starter {
        Some(start) => start()?,
        None => load_library()?,
    };
    *running = Some((generation, h.clone()));
    Ok(h)
}

fn load_library() -> Result<EmbeddedHost> {
    let lib = wd_sys::dl::load_beside_self(EMBEDDED_LIBRARY).map_err(|e| {
        ClientError::new(
            Status::Unsupported,
            format!(
                "WD_HOST=embedded needs an in-process host, which the client library does not carry: \
                 in Rust, depend on the wd-embedded crate and call wd_embedded::install(); \
                 in C, install {EMBEDDED_LIBRARY} beside libwd.so (scripts/install.sh does) ({e})"
            ),
        )
    })?;
    let (rc, text) = lib.call_text_fn(EMBEDDED_ENTRY, ENTRY_TEXT).map_err(|e| {
        ClientError::new(
            Status::Unsupported,
            format!("{} is not a WrapDrive embedded host: {e}", lib.path()),
        )
    })?;
    if rc < 0 {
        return Err(ClientError::new(
            Status::from_errno(-rc),
            format!("cannot start the embedded host: {text}"),
        ));
    }
    Ok(EmbeddedHost {
        address: text,
        keep: Arc::new(lib),
    })
}
