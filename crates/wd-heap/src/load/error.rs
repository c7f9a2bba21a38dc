//! Why a load failed.

use std::path::PathBuf;

use wd_sys::SysError;

use crate::heap::HeapError;

/// Errors of loading.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file cannot be opened.
    #[error("cannot open {}: {}", path.display(), source.source_text())]
    Open {
        /// The file.
        path: PathBuf,
        /// Why.
        source: SysError,
    },
    /// Not a regular file.
    #[error("{} is a {kind}, not a regular file", path.display())]
    NotRegular {
        /// The path.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// The file holds more than its size says: a file the kernel makes as
    /// it is read (`/proc`), whose size no one can know before.
    #[error("{} holds more than the {size} bytes its size says (a file made as it is read, such as /proc's): read it with a plain read", path.display())]
    SizeUntold {
        /// The path.
        path: PathBuf,
        /// The size it gave.
        size: u64,
    },
    /// Direct I/O was required and the filesystem cannot do it.
    #[error("{}: {fs} does not support direct I/O (O_DIRECT); load it with buffered or auto I/O", path.display())]
    DirectUnsupported {
        /// The file.
        path: PathBuf,
        /// Filesystem name.
        fs: String,
    },
    /// io_uring was required and is unavailable.
    #[error("io_uring is unavailable here ({0}); use the threads engine or auto")]
    UringUnavailable(String),
    /// A read failed.
    #[error("reading {} at offset {offset} failed: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Offset of the failed read.
        offset: u64,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file changed size or contents while being read.
    #[error("{} changed while being read: {what}", path.display())]
    Changed {
        /// The file.
        path: PathBuf,
        /// What changed.
        what: String,
    },
    /// Options out of range.
    #[error("invalid load options: {0}")]
    BadOptions(String),
    /// The buffer could not be had.
    #[error("{}: {source}", path.display())]
    Heap {
        /// The file.
        path: PathBuf,
        /// Why.
        source: HeapError,
    },
    /// A system call failed.
    #[error(transparent)]
    Sys(#[from] SysError),
}

trait SourceText {
    fn source_text(&self) -> String;
}

impl SourceText for SysError {
    fn source_text(&self) -> String {
        match self {
            SysError::Call { source, .. } => source.to_string(),
            other => other.to_string(),
        }
    }
}

impl LoadError {
    /// Positive errno for C and protocol boundaries.
    pub fn errno(&self) -> i32 {
        match self {
            LoadError::Open { source, .. } => source.errno(),
            LoadError::NotRegular { .. }
            | LoadError::BadOptions(_)
            | LoadError::SizeUntold { .. } => libc::EINVAL,
            LoadError::DirectUnsupported { .. } => libc::EINVAL,
            LoadError::UringUnavailable(_) => libc::ENOSYS,
            LoadError::Read { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            LoadError::Changed { .. } => libc::ESTALE,
            LoadError::Heap { source, .. } => source.errno(),
            LoadError::Sys(e) => e.errno(),
        }
    }
}
