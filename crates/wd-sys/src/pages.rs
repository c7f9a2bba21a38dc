//! Shareable memory of a chosen page size: memfds on normal or hugetlb
//! pages that can be sealed, populating their pages ahead of use, and
//! bounded copies in and out of a [`Mapping`] (the safe way to touch memory
//! another process may write).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use crate::{check, count, cstring, Mapping, Result, SysError};

/// Seal bit: no new writable mapping or write(2) (existing mappings keep
/// writing): makes a buffer read-only for every importer.
pub const SEAL_FUTURE_WRITE: i32 = libc::F_SEAL_FUTURE_WRITE;

/// Page size backing a memfd.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemfdPages {
    /// Normal pages (shmem).
    Normal,
    /// 2 MiB hugetlb pages.
    Huge2M,
    /// 1 GiB hugetlb pages.
    Huge1G,
}

impl MemfdPages {
    /// Bytes per page.
    pub fn page_bytes(self) -> usize {
        match self {
            MemfdPages::Normal => crate::page_size(),
            MemfdPages::Huge2M => 2 << 20,
            MemfdPages::Huge1G => 1 << 30,
        }
    }
}

/// Create a memfd on `pages`, sealable (MFD_ALLOW_SEALING, also on
/// hugetlb where kernels since 4.16 allow it).
pub fn memfd_create_sealable(name: &str, pages: MemfdPages) -> Result<OwnedFd> {
    count();
    let cname = cstring("memfd_create", name)?;
    let mut flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    match pages {
        MemfdPages::Normal => {}
        MemfdPages::Huge2M => flags |= libc::MFD_HUGETLB | libc::MFD_HUGE_2MB,
        MemfdPages::Huge1G => flags |= libc::MFD_HUGETLB | libc::MFD_HUGE_1GB,
    }
    // SAFETY: cname is a valid NUL-terminated string that outlives the call.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), flags) };
    check("memfd_create", fd as libc::c_long)?;
    // SAFETY: fd was just returned by the kernel and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Allocate the backing pages of `[off, off+len)` of a file (fallocate
/// mode 0): on a memfd, the memory itself, failing with ENOSPC/ENOMEM
/// instead of a later SIGBUS or OOM kill.
pub fn fallocate(fd: BorrowedFd<'_>, off: u64, len: u64) -> Result<()> {
    count();
    // SAFETY: plain syscall with integer arguments on a borrowed descriptor.
    let r = unsafe { libc::fallocate(fd.as_raw_fd(), 0, off as libc::off_t, len as libc::off_t) };
    check("fallocate", r as libc::c_long).map(|_| ())
}

/// Free the backing pages of `[off, off+len)` of a file, keeping its size
/// (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE). Seals against shrinking do
/// not stop it: every mapping of the range then faults the pages in again,
/// and on hugetlb, where that can fail, the fault is a SIGBUS (see
/// [`crate::guard`]).
pub fn punch_hole(fd: BorrowedFd<'_>, off: u64, len: u64) -> Result<()> {
    count();
    // SAFETY: plain syscall with integer arguments on a borrowed descriptor.
    let r = unsafe {
        libc::fallocate(
            fd.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off as libc::off_t,
            len as libc::off_t,
        )
    };
    check("fallocate(PUNCH_HOLE)", r as libc::c_long).map(|_| ())
}

/// A duplicate of `fd` that is inherited across exec (no FD_CLOEXEC): how
/// a buffer is handed to a command.
pub fn dup_inheritable(fd: BorrowedFd<'_>) -> Result<OwnedFd> {
    count();
    // SAFETY: fcntl(F_DUPFD) on a borrowed descriptor returns a new one.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD, 3) };
    check("fcntl(F_DUPFD)", r as libc::c_long)?;
    // SAFETY: fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(r) })
}

fn range(map: &Mapping, call: &'static str, off: usize, len: usize) -> Result<()> {
    match off.checked_add(len) {
        Some(end) if end <= map.len() => Ok(()),
        _ => Err(SysError::Invalid {
            call,
            what: "range beyond the mapping",
        }),
    }
}

fn writable_range(map: &Mapping, call: &'static str, off: usize, len: usize) -> Result<()> {
    if !map.writable {
        return Err(SysError::Invalid {
            call,
            what: "the mapping is read-only",
        });
    }
    match off.checked_add(len) {
        Some(end) if end <= map.len() => Ok(()),
        _ => Err(SysError::Invalid {
            call,
            what: "range beyond the mapping",
        }),
    }
}

impl Mapping {
    /// Map `len` bytes of `fd` at `offset`, shared and read-only: how a
    /// buffer sealed against writes is imported.
    pub fn map_shared_readonly(fd: BorrowedFd<'_>, offset: u64, len: usize) -> Result<Mapping> {
        Mapping::map_fd(fd, offset, len, false)
    }

    /// Whether the mapping may be written.
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// Fault in (allocate and map) the pages of `[off, off+len)` for
    /// writing, now, in this thread (MADV_POPULATE_WRITE): later accesses,
    /// the kernel's direct I/O included, find them ready.
    pub fn populate_write(&self, off: usize, len: usize) -> Result<()> {
        writable_range(self, "madvise(MADV_POPULATE_WRITE)", off, len)?;
        if len == 0 {
            return Ok(());
        }
        loop {
            count();
            // SAFETY: advice on a range inside this live mapping.
            let r = unsafe {
                libc::madvise(
                    self.ptr.as_ptr().add(off).cast(),
                    len,
                    libc::MADV_POPULATE_WRITE,
                )
            };
            if r == 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            // EINTR: a signal came in; the pages done so far stay done.
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(SysError::Call {
                call: "madvise(MADV_POPULATE_WRITE)",
                source: e,
            });
        }
    }

    /// Copy `data` into the mapping at `off`.
    pub fn copy_in(&self, off: usize, data: &[u8]) -> Result<()> {
        writable_range(self, "copy_in", off, data.len())?;
        // SAFETY: the destination range is inside the live mapping; ptr::copy
        // makes no reference into memory another process may write.
        unsafe { std::ptr::copy(data.as_ptr(), self.ptr.as_ptr().add(off), data.len()) };
        Ok(())
    }

    /// Copy `out.len()` bytes of the mapping at `off` out.
    pub fn copy_out(&self, off: usize, out: &mut [u8]) -> Result<()> {
        range(self, "copy_out", off, out.len())?;
        // SAFETY: the source range is inside the live mapping; see copy_in.
        unsafe { std::ptr::copy(self.ptr.as_ptr().add(off), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Set `[off, off+len)` to zero.
    pub fn zero(&self, off: usize, len: usize) -> Result<()> {
        writable_range(self, "zero", off, len)?;
        // SAFETY: the range is inside the live mapping; no reference is made.
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr().add(off), 0, len) };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn sealable_memfd_populate_and_copies() {
        let fd = memfd_create_sealable("t", MemfdPages::Normal).unwrap();
        crate::ftruncate(fd.as_fd(), 3 * 4096).unwrap();
        crate::add_seals(fd.as_fd(), crate::SEAL_SHRINK | crate::SEAL_GROW).unwrap();
        let m = Mapping::map_shared(fd.as_fd(), 0, 3 * 4096).unwrap();
        m.populate_write(0, 3 * 4096).unwrap();
        assert!(m.populate_write(4096, 3 * 4096).is_err());
        m.copy_in(4090, b"0123456789").unwrap();
        let mut out = [0u8; 10];
        m.copy_out(4090, &mut out).unwrap();
        assert_eq!(&out, b"0123456789");
        m.zero(4095, 2).unwrap();
        m.copy_out(4090, &mut out).unwrap();
        assert_eq!(&out, b"01234\0\x00789");
        assert!(m.copy_in(3 * 4096 - 1, b"ab").is_err());
        fallocate(fd.as_fd(), 0, 4096).unwrap();
        let d = dup_inheritable(fd.as_fd()).unwrap();
        assert_eq!(crate::file_size(d.as_fd()).unwrap(), 3 * 4096);
    }

    #[test]
    fn hugetlb_without_a_pool_fails_cleanly() {
        // With no free 2 MiB pages, allocating one must be an error, not a
        // crash; with some reserved, it works.
        let Ok(fd) = memfd_create_sealable("t", MemfdPages::Huge2M) else {
            wd_testutil::skip(
                "wd_sys::pages::hugetlb_without_a_pool_fails_cleanly",
                "hugetlb memfds unsupported here",
            );
            return;
        };
        crate::ftruncate(fd.as_fd(), 2 << 20).unwrap();
        match fallocate(fd.as_fd(), 0, 2 << 20) {
            Ok(()) => {}
            Err(e) => assert!(matches!(e.errno(), libc::ENOSPC | libc::ENOMEM), "{e}"),
        }
    }
}
