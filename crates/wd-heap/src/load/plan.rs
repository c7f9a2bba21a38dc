//! What both engines share: the file and buffer they read between, and
//! the judgement of one read's result (done, short, retry, or the file
//! changed under the load).

use std::os::fd::BorrowedFd;
use std::path::Path;

use wd_sys::{Mapping, SysError};

use crate::heap::HeapError;

use super::gather::Gathers;
use super::LoadError;

/// What the readers need to know about the file and the buffer.
pub(super) struct Plan<'a> {
    pub(super) path: &'a Path,
    pub(super) fd: BorrowedFd<'a>,
    pub(super) map: &'a Mapping,
    /// File size when the load started.
    pub(super) size: u64,
    /// End of the last read: `size` rounded up to the direct-I/O alignment.
    pub(super) read_end: u64,
    pub(super) chunk: u64,
    pub(super) align: u64,
    pub(super) direct: bool,
}

/// What one read came to.
pub(super) enum Outcome {
    Done(u64),
    Partial(u64, (u64, u64)),
    Retry,
}

impl Plan<'_> {
    fn changed(&self, what: String) -> LoadError {
        LoadError::Changed {
            path: self.path.to_path_buf(),
            what,
        }
    }

    /// Judge one read of `[off, off+len)` that returned `res` (bytes, or
    /// -errno).
    pub(super) fn judge(&self, off: u64, len: u64, res: i64) -> Result<Outcome, LoadError> {
        let expect = (off + len).min(self.size).saturating_sub(off);
        if res < 0 {
            let errno = (-res) as i32;
            if errno == libc::EINTR || errno == libc::EAGAIN {
                return Ok(Outcome::Retry);
            }
            return Err(LoadError::Read {
                path: self.path.to_path_buf(),
                offset: off,
                source: std::io::Error::from_raw_os_error(errno),
            });
        }
        let n = res as u64;
        if n == expect {
            return Ok(Outcome::Done(n));
        }
        if n > expect {
            return Err(self.changed(format!(
                "it grew beyond the {} bytes it had when loading started",
                self.size
            )));
        }
        let end = off + n;
        if n == 0 || (self.direct && end % self.align != 0) {
            return Err(self.changed(format!(
                "it ended at byte {end}, but had {} bytes when loading started",
                self.size
            )));
        }
        Ok(Outcome::Partial(n, (end, len - n)))
    }

    pub(super) fn read_error(&self, off: u64, e: SysError) -> LoadError {
        LoadError::Read {
            path: self.path.to_path_buf(),
            offset: off,
            source: match e {
                SysError::Call { source, .. } => source,
                other => std::io::Error::other(other.to_string()),
            },
        }
    }
}

pub(super) fn heap_err(path: &Path, e: HeapError) -> LoadError {
    LoadError::Heap {
        path: path.to_path_buf(),
        source: e,
    }
}

/// Wait for allocation up to `want`, turning its failure into the load's.
pub(super) fn wait_alloc(plan: &Plan<'_>, g: &Gathers, want: u64) -> Result<(), LoadError> {
    match g.wait_for(want) {
        Ok(()) => Ok(()),
        Err(Some(e)) => Err(heap_err(plan.path, e)),
        Err(None) => Err(LoadError::BadOptions("load stopped".into())),
    }
}
