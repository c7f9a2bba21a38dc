//! Files read into shared memory: opening with or without O_DIRECT, what a
//! file is (statx, including its direct-I/O alignment), positional reads
//! into a [`Mapping`], page-cache advice and residency (posix_fadvise,
//! mincore), and which filesystem holds a file (fstatfs).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::{check, count, Mapping, Result, SysError};

/// Open `path` read-only, with O_DIRECT when `direct` (reads then bypass
/// the page cache and must be aligned: see [`FileInfo::dio_offset_align`]).
pub fn open_read(path: &Path, direct: bool) -> Result<OwnedFd> {
    count();
    let cpath = CString::new(path.as_os_str().as_bytes()).map_err(|_| SysError::Invalid {
        call: "open",
        what: "path contains NUL",
    })?;
    // O_NONBLOCK: opening a FIFO (or a device) must not wait for a peer;
    // it is cleared again below, so reads of the file are blocking.
    let mut flags = libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK;
    if direct {
        flags |= libc::O_DIRECT;
    }
    // SAFETY: cpath is a valid NUL-terminated string that outlives the call.
    let fd = unsafe { libc::open(cpath.as_ptr(), flags) };
    check(
        if direct { "open(O_DIRECT)" } else { "open" },
        fd as libc::c_long,
    )?;
    // SAFETY: fd was just returned by the kernel and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    count();
    // SAFETY: fcntl(F_SETFL) with an int argument on the descriptor just opened.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK) };
    check("fcntl(F_SETFL)", r as libc::c_long)?;
    Ok(fd)
}

/// What kind of object a path names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    /// A regular file.
    Regular,
    /// A directory.
    Directory,
    /// A block device.
    Block,
    /// Anything else (character device, FIFO, socket).
    Other,
}

/// The facts about an open file a loader needs, from one statx call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileInfo {
    /// Kind of file.
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
    /// Device (major, minor) holding the file.
    pub dev: (u32, u32),
    /// Inode number: with `dev`, the file's identity.
    pub ino: u64,
    /// Last modification, nanoseconds since the epoch.
    pub mtime_ns: i128,
    /// Last status change, nanoseconds since the epoch.
    pub ctime_ns: i128,
    /// Preferred I/O size.
    pub blksize: u32,
    /// Memory alignment O_DIRECT needs (0: the kernel did not say).
    pub dio_mem_align: u32,
    /// File offset and length alignment O_DIRECT needs (0: not said, or
    /// direct I/O is unsupported on this file).
    pub dio_offset_align: u32,
}

/// statx of an open file, asking for the direct-I/O alignment too.
pub fn file_info(fd: BorrowedFd<'_>) -> Result<FileInfo> {
    count();
    let mut st = std::mem::MaybeUninit::<libc::statx>::zeroed();
    let empty = c"";
    // SAFETY: `empty` is a valid C string, `st` a valid out-pointer of the
    // right type; AT_EMPTY_PATH makes statx describe `fd` itself.
    let r = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_BASIC_STATS | libc::STATX_DIOALIGN,
            st.as_mut_ptr(),
        )
    };
    check("statx", r as libc::c_long)?;
    // SAFETY: statx succeeded, so it initialised st (and it was zeroed).
    let st = unsafe { st.assume_init() };
    let kind = match st.stx_mode as u32 & libc::S_IFMT {
        libc::S_IFREG => FileKind::Regular,
        libc::S_IFDIR => FileKind::Directory,
        libc::S_IFBLK => FileKind::Block,
        _ => FileKind::Other,
    };
    let ns = |t: libc::statx_timestamp| t.tv_sec as i128 * 1_000_000_000 + t.tv_nsec as i128;
    let dio = st.stx_mask & libc::STATX_DIOALIGN != 0;
    Ok(FileInfo {
        kind,
        size: st.stx_size,
        dev: (st.stx_dev_major, st.stx_dev_minor),
        ino: st.stx_ino,
        mtime_ns: ns(st.stx_mtime),
        ctime_ns: ns(st.stx_ctime),
        blksize: st.stx_blksize,
        dio_mem_align: if dio { st.stx_dio_mem_align } else { 0 },
        dio_offset_align: if dio { st.stx_dio_offset_align } else { 0 },
    })
}

/// Read up to `len` bytes at file offset `file_off` into `map` at
/// `map_off`, once (one pread; EINTR is retried). Returns the bytes read
/// (0 at end of file).
pub fn pread_into(
    fd: BorrowedFd<'_>,
    map: &Mapping,
    map_off: usize,
    len: usize,
    file_off: u64,
) -> Result<usize> {
    let end = map_off.checked_add(len).ok_or(SysError::Invalid {
        call: "pread",
        what: "range overflows",
    })?;
    if end > map.len() || !map.is_writable() {
        return Err(SysError::Invalid {
            call: "pread",
            what: "range beyond the mapping, or the mapping is read-only",
        });
    }
    loop {
        count();
        // SAFETY: [map_off, map_off+len) lies inside the live mapping (checked
        // above); the kernel writes there, no Rust reference exists to it.
        let r = unsafe {
            libc::pread(
                fd.as_raw_fd(),
                map.as_ptr().add(map_off).cast(),
                len,
                file_off as libc::off_t,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(SysError::Call {
                call: "pread",
                source: e,
            });
        }
        return Ok(r as usize);
    }
}

/// Read up to `out.len()` bytes at `file_off` into process memory (one
/// pread, EINTR retried); 0 at end of file.
pub fn pread(fd: BorrowedFd<'_>, out: &mut [u8], file_off: u64) -> Result<usize> {
    loop {
        count();
        // SAFETY: `out` is a valid writable slice of out.len() bytes.
        let r = unsafe {
            libc::pread(
                fd.as_raw_fd(),
                out.as_mut_ptr().cast(),
                out.len(),
                file_off as libc::off_t,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(SysError::Call {
                call: "pread",
                source: e,
            });
        }
        return Ok(r as usize);
    }
}

/// Page-cache advice for a file range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Advice {
    /// Drop the range's clean pages from the page cache.
    DontNeed,
    /// Start reading the range into the page cache.
    WillNeed,
    /// The range will be read sequentially (larger readahead).
    Sequential,
}

/// posix_fadvise on `[off, off+len)` (`len` 0: to the end of the file).
pub fn fadvise(fd: BorrowedFd<'_>, off: u64, len: u64, advice: Advice) -> Result<()> {
    count();
    let a = match advice {
        Advice::DontNeed => libc::POSIX_FADV_DONTNEED,
        Advice::WillNeed => libc::POSIX_FADV_WILLNEED,
        Advice::Sequential => libc::POSIX_FADV_SEQUENTIAL,
    };
    // SAFETY: plain syscall with integer arguments on a borrowed descriptor.
    let r =
        unsafe { libc::posix_fadvise(fd.as_raw_fd(), off as libc::off_t, len as libc::off_t, a) };
    if r != 0 {
        return Err(SysError::Call {
            call: "posix_fadvise",
            source: io::Error::from_raw_os_error(r),
        });
    }
    Ok(())
}

/// How many of the pages holding the first `size` bytes of a file are in
/// the page cache: `(resident, total)` pages. Maps the file read-only for
/// the mincore call (no page is faulted in).
pub fn resident_pages(fd: BorrowedFd<'_>, size: u64) -> Result<(u64, u64)> {
    if size == 0 {
        return Ok((0, 0));
    }
    let page = crate::page_size() as u64;
    // Walk in windows so a huge file does not need one huge vector.
    const WINDOW: u64 = 1 << 30;
    let mut resident = 0u64;
    let mut off = 0u64;
    let mut vec = Vec::new();
    while off < size {
        let len = (size - off).min(WINDOW) as usize;
        count();
        // SAFETY: a fresh read-only shared mapping chosen by the kernel;
        // nothing is read through it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                off as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(SysError::Call {
                call: "mmap",
                source: io::Error::last_os_error(),
            });
        }
        let pages = (len as u64).div_ceil(page) as usize;
        vec.clear();
        vec.resize(pages, 0u8);
        count();
        // SAFETY: p/len is the mapping just made; vec has one byte per page.
        let r = unsafe { libc::mincore(p, len, vec.as_mut_ptr()) };
        let err = io::Error::last_os_error();
        // SAFETY: unmapping exactly the mapping made above.
        unsafe { libc::munmap(p, len) };
        if r != 0 {
            return Err(SysError::Call {
                call: "mincore",
                source: err,
            });
        }
        resident += vec.iter().filter(|&&b| b & 1 != 0).count() as u64;
        off += len as u64;
    }
    Ok((resident, size.div_ceil(page)))
}

/// Files up to this many pages are examined whole by [`resident_share`].
pub const RESIDENT_FULL_PAGES: u64 = 1 << 16;
/// Windows [`resident_share`] samples in larger files.
pub const RESIDENT_SAMPLES: u64 = 1024;
/// Pages per sampled window.
const RESIDENT_WINDOW: u64 = 16;

/// The share (0..=1) of the first `size` bytes of a file that is in the
/// page cache: exact for files up to [`RESIDENT_FULL_PAGES`] pages, else
/// estimated from [`RESIDENT_SAMPLES`] evenly spaced windows (a few hundred
/// microseconds, where a full walk of a multi-GiB file takes milliseconds).
pub fn resident_share(fd: BorrowedFd<'_>, size: u64) -> Result<f64> {
    let page = crate::page_size() as u64;
    let pages = size.div_ceil(page);
    if pages == 0 {
        return Ok(1.0);
    }
    if pages <= RESIDENT_FULL_PAGES {
        let (r, t) = resident_pages(fd, size)?;
        return Ok(r as f64 / t as f64);
    }
    count();
    // SAFETY: a fresh read-only shared mapping chosen by the kernel; only
    // mincore looks at it.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size as usize,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(SysError::Call {
            call: "mmap",
            source: io::Error::last_os_error(),
        });
    }
    let mut vec = [0u8; RESIDENT_WINDOW as usize];
    let (mut resident, mut seen) = (0u64, 0u64);
    let mut result = Ok(());
    for i in 0..RESIDENT_SAMPLES {
        let first = (pages - RESIDENT_WINDOW) * i / (RESIDENT_SAMPLES - 1);
        count();
        // SAFETY: the window lies inside the mapping made above (first +
        // RESIDENT_WINDOW <= pages); vec has one byte per page of it.
        let r = unsafe {
            libc::mincore(
                p.cast::<u8>().add((first * page) as usize).cast(),
                (RESIDENT_WINDOW * page) as usize,
                vec.as_mut_ptr(),
            )
        };
        if r != 0 {
            result = Err(SysError::Call {
                call: "mincore",
                source: io::Error::last_os_error(),
            });
            break;
        }
        resident += vec.iter().filter(|&&b| b & 1 != 0).count() as u64;
        seen += RESIDENT_WINDOW;
    }
    // SAFETY: unmapping exactly the mapping made above.
    unsafe { libc::munmap(p, size as usize) };
    result.map(|()| resident as f64 / seen as f64)
}

/// The filesystem holding a file: its magic number and block size (the
/// huge page size, on hugetlbfs).
pub fn fs_of(fd: BorrowedFd<'_>) -> Result<(u64, u64)> {
    count();
    let mut st = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: st is a valid out-pointer of the right type.
    let r = unsafe { libc::fstatfs(fd.as_raw_fd(), st.as_mut_ptr()) };
    check("fstatfs", r as libc::c_long)?;
    // SAFETY: fstatfs succeeded and initialised st.
    let st = unsafe { st.assume_init() };
    Ok((st.f_type as u64, st.f_bsize as u64))
}

/// Magic number of hugetlbfs (memfds created with MFD_HUGETLB live there).
pub const HUGETLBFS_MAGIC: u64 = 0x9584_58f6;

/// A readable name for a filesystem magic number, for error messages.
pub fn fs_name(magic: u64) -> String {
    let n = match magic {
        0xEF53 => "ext2/3/4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0xF2F5_2010 => "f2fs",
        0x0102_1994 => "tmpfs",
        0x8584_58f6 => "ramfs",
        HUGETLBFS_MAGIC => "hugetlbfs",
        0x6265_6572 => "sysfs",
        0x9fa0 => "proc",
        0x6573_5546 => "fuse",
        0x794c_7630 => "overlayfs",
        0x6969 => "nfs",
        0xFF53_4D42 => "cifs",
        0x0102_1997 => "9p",
        0x2fc1_2fc1 => "zfs",
        0xE0F5_E1E2 => "erofs",
        0x7371_7368 => "squashfs",
        0x4d44 => "vfat",
        0x5346_544e => "ntfs",
        0x2011_BAB0 => "exfat",
        0x6462_6720 => "debugfs",
        _ => return format!("filesystem {magic:#x}"),
    };
    n.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    fn temp_file(tag: &str, bytes: &[u8]) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("wd-sys-{tag}-{}", std::process::id()));
        let mut f = std::fs::File::create(&p).unwrap();
        f.write_all(bytes).unwrap();
        f.sync_all().unwrap();
        p
    }

    #[test]
    fn info_read_and_residency() {
        let data: Vec<u8> = (0..10000u32).map(|i| (i * 7) as u8).collect();
        let p = temp_file("info", &data);
        let fd = open_read(&p, false).unwrap();
        let info = file_info(fd.as_fd()).unwrap();
        assert_eq!(info.kind, FileKind::Regular);
        assert_eq!(info.size, 10000);
        let mut out = vec![0u8; 100];
        assert_eq!(pread(fd.as_fd(), &mut out, 9950).unwrap(), 50);
        assert_eq!(&out[..50], &data[9950..]);
        let (res, total) = resident_pages(fd.as_fd(), info.size).unwrap();
        assert_eq!(total, 10000u64.div_ceil(page_size_u64()));
        assert!(res <= total);
        fadvise(fd.as_fd(), 0, 0, Advice::DontNeed).unwrap();
        let (after, _) = resident_pages(fd.as_fd(), info.size).unwrap();
        assert_eq!(after, 0, "clean pages must leave the cache on DONTNEED");
        assert_eq!(resident_share(fd.as_fd(), info.size).unwrap(), 0.0);
        let mfd = crate::memfd_create("t", false).unwrap();
        crate::ftruncate(mfd.as_fd(), 16384).unwrap();
        let m = crate::Mapping::map_shared(mfd.as_fd(), 0, 16384).unwrap();
        assert_eq!(pread_into(fd.as_fd(), &m, 4096, 8192, 0).unwrap(), 8192);
        let mut back = vec![0u8; 8192];
        m.copy_out(4096, &mut back).unwrap();
        assert_eq!(back, data[..8192]);
        assert!(pread_into(fd.as_fd(), &m, 12288, 8192, 0).is_err());
        let (magic, _) = fs_of(fd.as_fd()).unwrap();
        assert!(!fs_name(magic).is_empty());
        std::fs::remove_file(&p).unwrap();
    }

    fn page_size_u64() -> u64 {
        crate::page_size() as u64
    }

    #[test]
    fn residency_of_a_large_file_is_sampled() {
        // A sparse 320 MiB file: its first quarter read into the cache.
        let p = std::env::temp_dir().join(format!("wd-sys-sparse-{}", std::process::id()));
        let f = std::fs::File::create(&p).unwrap();
        let size = 320u64 << 20;
        f.set_len(size).unwrap();
        let fd = open_read(&p, false).unwrap();
        fadvise(fd.as_fd(), 0, 0, Advice::DontNeed).unwrap();
        assert!(resident_share(fd.as_fd(), size).unwrap() < 0.01);
        let mut buf = vec![0u8; 1 << 20];
        for i in 0..80u64 {
            pread(fd.as_fd(), &mut buf, i << 20).unwrap();
        }
        let s = resident_share(fd.as_fd(), size).unwrap();
        assert!((0.2..=0.3).contains(&s), "{s}");
        fadvise(fd.as_fd(), 0, 0, Advice::DontNeed).unwrap();
        drop(fd);
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn directories_are_told_apart() {
        let fd = open_read(&std::env::temp_dir(), false).unwrap();
        assert_eq!(file_info(fd.as_fd()).unwrap().kind, FileKind::Directory);
        assert!(open_read(Path::new("/nonexistent/wd"), false).is_err());
    }
}

/// Open `path` read-write (not created), with O_DIRECT when `direct`: a
/// block store a device reads and writes for its clients.
pub fn open_rw(path: &Path, direct: bool) -> Result<OwnedFd> {
    count();
    let cpath = CString::new(path.as_os_str().as_bytes()).map_err(|_| SysError::Invalid {
        call: "open",
        what: "path contains NUL",
    })?;
    let mut flags = libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOCTTY;
    if direct {
        flags |= libc::O_DIRECT;
    }
    // SAFETY: cpath is a valid NUL-terminated string that outlives the call.
    let fd = unsafe { libc::open(cpath.as_ptr(), flags) };
    check(
        if direct { "open(O_DIRECT)" } else { "open" },
        fd as libc::c_long,
    )?;
    // SAFETY: fd was just returned by the kernel and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// One positional read or write, EINTR retried.
fn positional(call: &'static str, mut op: impl FnMut() -> libc::ssize_t) -> Result<usize> {
    loop {
        count();
        let r = op();
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(SysError::Call { call, source: e });
        }
        return Ok(r as usize);
    }
}

/// Read up to `buf.len()` bytes at `file_off` into device memory (one
/// pread); 0 at end of file.
pub fn pread_device(
    fd: BorrowedFd<'_>,
    buf: &crate::devmem::DeviceSlice<'_>,
    file_off: u64,
) -> Result<usize> {
    positional("pread", || {
        // SAFETY: `buf` is live, writable device memory of buf.len() bytes
        // for its lifetime; the kernel writes it, no Rust reference exists.
        unsafe {
            libc::pread(
                fd.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                file_off as libc::off_t,
            )
        }
    })
}

/// Write up to `buf.len()` bytes of device memory at `file_off` (one
/// pwrite).
pub fn pwrite_device(
    fd: BorrowedFd<'_>,
    buf: &crate::devmem::DeviceSlice<'_>,
    file_off: u64,
) -> Result<usize> {
    positional("pwrite", || {
        // SAFETY: `buf` is live device memory of buf.len() bytes; the
        // kernel only reads it.
        unsafe {
            libc::pwrite(
                fd.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                file_off as libc::off_t,
            )
        }
    })
}

/// Write up to `data.len()` bytes at `file_off` (one pwrite).
pub fn pwrite(fd: BorrowedFd<'_>, data: &[u8], file_off: u64) -> Result<usize> {
    positional("pwrite", || {
        // SAFETY: `data` is a valid slice of data.len() bytes.
        unsafe {
            libc::pwrite(
                fd.as_raw_fd(),
                data.as_ptr().cast(),
                data.len(),
                file_off as libc::off_t,
            )
        }
    })
}

/// Make written data durable (fdatasync).
pub fn fdatasync(fd: BorrowedFd<'_>) -> Result<()> {
    count();
    // SAFETY: plain system call on a borrowed descriptor.
    check("fdatasync", unsafe { libc::fdatasync(fd.as_raw_fd()) }
        as libc::c_long)?;
    Ok(())
}

/// How [`fallocate`] changes a range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allocate {
    /// Free the range's blocks; it reads as zeroes (keeps the size).
    PunchHole,
    /// Make the range read as zeroes, blocks kept (keeps the size).
    ZeroRange,
    /// Allocate the range's missing blocks, zeroed (keeps the size and
    /// what the range holds).
    Reserve,
}

/// fallocate on `[off, off+len)`.
pub fn fallocate(fd: BorrowedFd<'_>, how: Allocate, off: u64, len: u64) -> Result<()> {
    count();
    let mode = match how {
        Allocate::PunchHole => libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        Allocate::ZeroRange => libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
        Allocate::Reserve => libc::FALLOC_FL_KEEP_SIZE,
    };
    // SAFETY: plain system call on a borrowed descriptor.
    let r =
        unsafe { libc::fallocate(fd.as_raw_fd(), mode, off as libc::off_t, len as libc::off_t) };
    check("fallocate", r as libc::c_long)?;
    Ok(())
}

/// Grow a regular file to `size` bytes (never shrinks it).
pub fn grow_to(fd: BorrowedFd<'_>, size: u64) -> Result<()> {
    if file_info(fd)?.size < size {
        crate::ftruncate(fd, size)?;
    }
    Ok(())
}
