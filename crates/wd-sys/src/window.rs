//! Address-space windows: one reserved span per client file, in which each
//! range of the file is mapped at its own file offset.
//!
//! A host maps every range a client shares. Mapped one by one where the
//! kernel chooses, a client sharing its memory page by page costs the host
//! one kernel mapping (VMA) per page, and `vm.max_map_count` (65530 by
//! default) is soon reached by the whole process. Mapped at `window base +
//! file offset`, ranges that touch in the file touch in memory, and the
//! kernel merges them into one mapping.
//!
//! The window is a PROT_NONE reservation (no memory behind it). A span
//! handed out is never handed out again while live, and goes back to
//! PROT_NONE when its [`WindowMapping`] drops, so no pointer into a live
//! span is ever invalidated by another span's mapping or release.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use crate::{count, Result, SysError};

/// A reserved span of address space for one file's ranges.
#[derive(Debug)]
pub struct FileWindow {
    base: NonNull<u8>,
    len: u64,
    /// Live spans: start -> end (window offsets); None once a mapping
    /// failed (a failed MAP_FIXED may leave a hole the kernel can fill
    /// with something else, so the window maps nothing more).
    live: Mutex<Option<BTreeMap<u64, u64>>>,
}

// SAFETY: the window is address space only; spans are handed out under the
// mutex and touched through raw pointers by their holders.
unsafe impl Send for FileWindow {}
// SAFETY: as Send; all shared state is behind the mutex.
unsafe impl Sync for FileWindow {}

/// A range of a file mapped (shared, read-write) inside a [`FileWindow`].
#[derive(Debug)]
pub struct WindowMapping {
    window: Arc<FileWindow>,
    off: u64,
    len: u64,
}

fn err(call: &'static str) -> SysError {
    SysError::Call {
        call,
        source: io::Error::last_os_error(),
    }
}

impl FileWindow {
    /// Reserve `len` bytes (a page multiple) of address space.
    pub fn reserve(len: u64) -> Result<Arc<FileWindow>> {
        if len == 0 || len % crate::page_size() as u64 != 0 {
            return Err(SysError::Invalid {
                call: "mmap",
                what: "window length not a positive page multiple",
            });
        }
        count();
        // SAFETY: a fresh PROT_NONE mapping where the kernel chooses; no
        // existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(err("mmap"));
        }
        Ok(Arc::new(FileWindow {
            base: NonNull::new(p.cast()).expect("mmap returned NULL"),
            len,
            live: Mutex::new(Some(BTreeMap::new())),
        }))
    }

    /// Length of the window.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the window is empty (never).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Map `len` bytes of `fd` at file offset `offset` to window offset
    /// `offset`. `Ok(None)` when the span leaves the window or overlaps a
    /// live span (the caller maps it elsewhere).
    pub fn map(
        self: &Arc<Self>,
        fd: BorrowedFd<'_>,
        offset: u64,
        len: u64,
    ) -> Result<Option<WindowMapping>> {
        let page = crate::page_size() as u64;
        let end = match offset.checked_add(len) {
            Some(e) if e <= self.len && len > 0 && offset % page == 0 => e,
            _ => return Ok(None),
        };
        let mut guard = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let Some(live) = guard.as_mut() else {
            return Ok(None);
        };
        let overlaps = live
            .range(..end)
            .next_back()
            .is_some_and(|(_, &e)| e > offset);
        if overlaps {
            return Ok(None);
        }
        count();
        // SAFETY: [offset, end) lies inside our reservation and is no live
        // span (checked under the lock), so MAP_FIXED replaces only
        // PROT_NONE address space nobody points into.
        let p = unsafe {
            libc::mmap(
                self.base.as_ptr().add(offset as usize).cast(),
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd.as_raw_fd(),
                offset as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            let e = err("mmap");
            *guard = None;
            return Err(e);
        }
        live.insert(offset, end);
        Ok(Some(WindowMapping {
            window: self.clone(),
            off: offset,
            len,
        }))
    }
}

impl Drop for FileWindow {
    fn drop(&mut self) {
        // SAFETY: base/len is our reservation; every span is gone (each
        // WindowMapping holds an Arc of the window).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len as usize) };
    }
}

impl WindowMapping {
    /// First byte.
    pub fn as_ptr(&self) -> *mut u8 {
        // SAFETY: off lies inside the window.
        unsafe { self.window.base.as_ptr().add(self.off as usize) }
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether empty (never).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for WindowMapping {
    fn drop(&mut self) {
        let mut guard = self.window.live.lock().unwrap_or_else(|e| e.into_inner());
        count();
        // SAFETY: the span is ours (live, handed out once); back to a
        // PROT_NONE reservation so nothing else is placed there.
        unsafe {
            libc::mmap(
                self.as_ptr().cast(),
                self.len as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if let Some(live) = guard.as_mut() {
            live.remove(&self.off);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn vmas_of(name: &str) -> usize {
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .filter(|l| l.contains(&format!("/memfd:{name} ")))
            .count()
    }

    #[test]
    fn touching_ranges_merge_and_overlaps_are_refused() {
        let name = format!("wd-window-{}", std::process::id());
        let fd = crate::memfd_create(&name, false).unwrap();
        crate::ftruncate(fd.as_fd(), 64 * 4096).unwrap();
        let w = FileWindow::reserve(64 * 4096).unwrap();
        let mut maps: Vec<_> = (0..32u64)
            .rev()
            .map(|i| w.map(fd.as_fd(), i * 4096, 4096).unwrap().unwrap())
            .collect();
        assert_eq!(vmas_of(&name), 1, "32 touching ranges, one mapping");
        assert!(w.map(fd.as_fd(), 4096, 8192).unwrap().is_none(), "overlap");
        assert!(
            w.map(fd.as_fd(), 63 * 4096, 8192).unwrap().is_none(),
            "outside"
        );
        // Bytes written through one view are the file's.
        // SAFETY: a live span of ours, 4096 bytes.
        unsafe { maps[0].as_ptr().write_volatile(7) };
        let mut b = [0u8; 1];
        crate::file::pread(fd.as_fd(), &mut b, 31 * 4096).unwrap();
        assert_eq!(b[0], 7);
        // A released span can be mapped again.
        let m = maps.remove(10);
        let off = m.off;
        drop(m);
        assert_eq!(vmas_of(&name), 2);
        let again = w.map(fd.as_fd(), off, 4096).unwrap().unwrap();
        assert_eq!(vmas_of(&name), 1);
        drop(again);
        drop(maps);
        assert_eq!(vmas_of(&name), 0);
    }
}
