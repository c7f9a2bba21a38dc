//! The synchronous engine, where io_uring is unavailable (or asked for):
//! reader threads doing blocking preads.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use super::gather::Gathers;
use super::plan::{heap_err, Outcome, Plan};
use super::LoadError;

/// How often the threads engine reports progress.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(50);

/// The fallback reader: `threads` threads, each claiming the next chunk,
/// waiting for its gather, and reading it with blocking preads.
pub(super) fn read_threads(
    plan: &Plan<'_>,
    threads: u32,
    g: &Gathers,
    report: &mut dyn FnMut(u64),
) -> Result<u64, LoadError> {
    let next = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    let reads = AtomicU64::new(0);
    let finished = AtomicUsize::new(0);
    let error: Mutex<Option<LoadError>> = Mutex::new(None);
    let wake = (Mutex::new(()), Condvar::new());
    let worker = || -> Result<(), LoadError> {
        loop {
            if g.stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            let off = next.fetch_add(plan.chunk, Ordering::Relaxed);
            if off >= plan.read_end {
                return Ok(());
            }
            let len = plan.chunk.min(plan.read_end - off);
            match g.wait_for(off + len) {
                Ok(()) => {}
                Err(Some(e)) => return Err(heap_err(plan.path, e)),
                Err(None) => return Ok(()),
            }
            let (mut o, mut l) = (off, len);
            loop {
                reads.fetch_add(1, Ordering::Relaxed);
                let res =
                    match wd_sys::file::pread_into(plan.fd, plan.map, o as usize, l as usize, o) {
                        Ok(n) => n as i64,
                        Err(e) => -(e.errno() as i64),
                    };
                match plan.judge(o, l, res)? {
                    Outcome::Done(n) => {
                        done.fetch_add(n, Ordering::Relaxed);
                        // Let the calling thread report progress now.
                        wake.1.notify_all();
                        break;
                    }
                    Outcome::Partial(n, (no, nl)) => {
                        done.fetch_add(n, Ordering::Relaxed);
                        (o, l) = (no, nl);
                    }
                    Outcome::Retry => {}
                }
            }
        }
    };
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                if let Err(e) = worker() {
                    let mut slot = error.lock().unwrap_or_else(|e| e.into_inner());
                    slot.get_or_insert(e);
                    g.halt();
                }
                let _l = wake.0.lock().unwrap_or_else(|e| e.into_inner());
                finished.fetch_add(1, Ordering::Relaxed);
                wake.1.notify_all();
            });
        }
        let mut l = wake.0.lock().unwrap_or_else(|e| e.into_inner());
        while finished.load(Ordering::Relaxed) < threads as usize {
            l = wake
                .1
                .wait_timeout(l, PROGRESS_INTERVAL)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            report(done.load(Ordering::Relaxed));
        }
    });
    if let Some(e) = error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e);
    }
    Ok(reads.load(Ordering::Relaxed))
}
