//! The allocation's progress as the readers see it: how far the buffer is
//! allocated, whether allocation failed, and whether the load is stopping.
//! The allocator publishes; readers wait on it before touching pages.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

use crate::heap::HeapError;

/// The allocation side's progress, shared with the readers.
pub(super) struct Gathers {
    /// Buffer bytes allocated, from offset 0 (Release by the allocator,
    /// Acquire by readers: a read may only target allocated pages).
    ready: AtomicU64,
    failed: Mutex<Option<HeapError>>,
    pub(super) stop: AtomicBool,
    lock: Mutex<()>,
    cv: Condvar,
    pub(super) first_ns: AtomicU64,
    pub(super) done_ns: AtomicU64,
}

impl Gathers {
    pub(super) fn new(ready: u64) -> Gathers {
        Gathers {
            ready: AtomicU64::new(ready),
            failed: Mutex::new(None),
            stop: AtomicBool::new(false),
            lock: Mutex::new(()),
            cv: Condvar::new(),
            first_ns: AtomicU64::new(0),
            done_ns: AtomicU64::new(0),
        }
    }

    pub(super) fn ready(&self) -> u64 {
        // Pairs with the Release store in `publish`.
        self.ready.load(Ordering::Acquire)
    }

    pub(super) fn publish(&self, upto: u64) {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        // Pairs with the Acquire load in `ready`.
        self.ready.store(upto, Ordering::Release);
        self.cv.notify_all();
    }

    pub(super) fn fail(&self, e: HeapError) {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        *self.failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
        self.cv.notify_all();
    }

    pub(super) fn halt(&self) {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.stop.store(true, Ordering::Relaxed);
        self.cv.notify_all();
    }

    pub(super) fn take_failure(&self) -> Option<HeapError> {
        self.failed.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Block until at least `want` bytes are allocated. Err(None): the load
    /// is stopping; Err(Some): allocation failed.
    pub(super) fn wait_for(&self, want: u64) -> Result<(), Option<HeapError>> {
        let mut g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if self.ready() >= want {
                return Ok(());
            }
            if let Some(e) = self.take_failure() {
                return Err(Some(e));
            }
            if self.stop.load(Ordering::Relaxed) {
                return Err(None);
            }
            g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
}
