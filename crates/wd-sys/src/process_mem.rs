//! Another process's memory, reached the way the kernel lets that process
//! reach it itself.
//!
//! A SHARE_ALL queue lets a device name any address of its client. The host
//! may run as root, so it must not reach that memory with its own
//! privileges (by pid, with process_vm_readv): a client that forks and
//! then execs a setuid program would have the host read and write the
//! privileged image. Instead the client opens `/proc/self/mem` itself and
//! passes the descriptor. The kernel checks the client's own right at open,
//! and the descriptor stays bound to the address space it was opened on:
//! once that image execs or exits, every access returns end-of-file, never
//! the new image's bytes. [`ProcessMemory`] turns that end-of-file into
//! [`ImageGone`](AccessError::ImageGone), which the host answers by
//! stopping the queue.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use crate::{count, SysError};

/// `statfs` magic of procfs.
const PROC_SUPER_MAGIC: libc::c_long = 0x9fa0;

/// Why an access to another process's memory failed.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    /// The address space the descriptor was opened on is gone: the process
    /// exec'd another program or exited. Nothing was transferred.
    #[error("the process image this queue was bound to is gone (exec or exit)")]
    ImageGone,
    /// The range is not mapped (or not with the access asked for) in that
    /// address space.
    #[error("{addr:#x}+{len:#x} is not accessible in the client ({errno})")]
    Fault {
        /// Start of the access.
        addr: u64,
        /// Its length.
        len: usize,
        /// The kernel's errno.
        errno: io::Error,
    },
}

/// Why a descriptor cannot serve as a process's memory.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// The descriptor is not a `/proc/<pid>/mem` file.
    #[error("the descriptor is not a /proc/<pid>/mem file ({0})")]
    NotProcMem(String),
    /// It was not opened for reading and writing.
    #[error("/proc/<pid>/mem must be opened O_RDWR")]
    NotReadWrite,
    /// A system call failed while checking it.
    #[error(transparent)]
    Sys(#[from] SysError),
}

/// The memory of one process image, through a `/proc/<pid>/mem` descriptor
/// that process opened (see the module documentation).
#[derive(Debug)]
pub struct ProcessMemory {
    fd: OwnedFd,
}

/// Open this process's own memory for a host (client side). Close-on-exec:
/// an exec'd image must not inherit it.
pub fn open_self_mem() -> crate::Result<OwnedFd> {
    count();
    // SAFETY: a constant NUL-terminated path.
    let fd = unsafe { libc::open(c"/proc/self/mem".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    crate::check("open(/proc/self/mem)", fd as libc::c_long)?;
    // SAFETY: fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn sys(call: &'static str) -> SysError {
    SysError::Call {
        call,
        source: io::Error::last_os_error(),
    }
}

impl ProcessMemory {
    /// Accept a descriptor a client sent as its memory (host side). Only a
    /// read-write `/proc/<pid>/mem` file is accepted: anything else (a pipe,
    /// a socket, another proc file) could block the engine or mean nothing.
    pub fn bind(fd: OwnedFd) -> Result<ProcessMemory, BindError> {
        // SAFETY: a zeroed statfs is a valid out-parameter.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        count();
        // SAFETY: fd is an open descriptor, st a writable statfs.
        if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) } < 0 {
            return Err(sys("fstatfs").into());
        }
        if st.f_type as libc::c_long != PROC_SUPER_MAGIC {
            return Err(BindError::NotProcMem("not on procfs".into()));
        }
        // Its name tells which proc file it is (the pid part is the
        // client's, as the kernel resolved it at open).
        let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .map_err(|e| BindError::NotProcMem(e.to_string()))?;
        let name = link.to_string_lossy().into_owned();
        let ok = name
            .strip_prefix("/proc/")
            .and_then(|r| r.strip_suffix("/mem"))
            .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()));
        if !ok {
            return Err(BindError::NotProcMem(name));
        }
        count();
        // SAFETY: fcntl(F_GETFL) on an open descriptor.
        let fl = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
        if fl < 0 {
            return Err(sys("fcntl(F_GETFL)").into());
        }
        if fl & libc::O_ACCMODE != libc::O_RDWR {
            return Err(BindError::NotReadWrite);
        }
        Ok(ProcessMemory { fd })
    }

    /// This process's own memory: a way to touch an address that may be
    /// unmapped and get an error instead of a crash (opened afresh each
    /// time, so a forked child never reads its parent).
    pub fn own() -> crate::Result<ProcessMemory> {
        Ok(ProcessMemory {
            fd: open_self_mem()?,
        })
    }

    /// Read `buf.len()` bytes at `addr` of the bound image.
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), AccessError> {
        let mut done = 0usize;
        while done < buf.len() {
            let rest = &mut buf[done..];
            count();
            // SAFETY: `rest` is a valid writable slice; the offset is an
            // address in the other process, interpreted by the kernel
            // (procfs mem files take unsigned offsets).
            let r = unsafe {
                libc::pread(
                    self.fd.as_raw_fd(),
                    rest.as_mut_ptr().cast(),
                    rest.len(),
                    addr.wrapping_add(done as u64) as libc::off_t,
                )
            };
            done += self.advance(r, addr + done as u64, rest.len())?;
        }
        Ok(())
    }

    /// Write `data` at `addr` of the bound image.
    pub fn write(&self, addr: u64, data: &[u8]) -> Result<(), AccessError> {
        let mut done = 0usize;
        while done < data.len() {
            let rest = &data[done..];
            count();
            // SAFETY: `rest` is a valid readable slice; see `read`.
            let r = unsafe {
                libc::pwrite(
                    self.fd.as_raw_fd(),
                    rest.as_ptr().cast(),
                    rest.len(),
                    addr.wrapping_add(done as u64) as libc::off_t,
                )
            };
            done += self.advance(r, addr + done as u64, rest.len())?;
        }
        Ok(())
    }

    /// Interpret one pread/pwrite result: bytes moved, or why none.
    fn advance(&self, r: isize, addr: u64, len: usize) -> Result<usize, AccessError> {
        match r {
            // procfs answers 0 when the address space has no users left.
            0 => Err(AccessError::ImageGone),
            n if n > 0 => Ok(n as usize),
            _ => {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EINTR) {
                    return Ok(0);
                }
                Err(AccessError::Fault {
                    addr,
                    len,
                    errno: e,
                })
            }
        }
    }
}

impl AsFd for ProcessMemory {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_writes_own_memory() {
        let m = ProcessMemory::bind(open_self_mem().unwrap()).unwrap();
        let src = *b"share-all bytes!";
        let mut got = [0u8; 16];
        m.read(src.as_ptr() as u64, &mut got).unwrap();
        assert_eq!(got, src);
        let dst = vec![0u8; 16];
        m.write(dst.as_ptr() as u64, b"written through.").unwrap();
        // The write went behind the compiler's back.
        assert_eq!(std::hint::black_box(&dst)[..], b"written through."[..]);
        assert!(matches!(
            m.read(8, &mut got),
            Err(AccessError::Fault { addr: 8, .. })
        ));
    }

    #[test]
    fn refuses_other_descriptors() {
        let f = std::fs::File::open("/proc/self/status").unwrap();
        assert!(matches!(
            ProcessMemory::bind(f.into()),
            Err(BindError::NotProcMem(_))
        ));
        let f = std::fs::File::open("/proc/self/mem").unwrap();
        assert!(matches!(
            ProcessMemory::bind(f.into()),
            Err(BindError::NotReadWrite)
        ));
        let fd = crate::memfd_create("x", false).unwrap();
        assert!(matches!(
            ProcessMemory::bind(fd),
            Err(BindError::NotProcMem(_))
        ));
    }

    #[test]
    fn exec_ends_access() {
        // A child opens its memory, then execs: the descriptor must read
        // nothing of the new image.
        let (r, w) = pipe();
        // SAFETY: fork in a test; the child only makes async-signal-safe
        // calls (open, write, execve, _exit).
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: see above.
            unsafe {
                let fd = libc::open(c"/proc/self/mem".as_ptr(), libc::O_RDWR);
                // The descriptor survives exec (no CLOEXEC) but the image
                // it names does not.
                let msg = fd.to_ne_bytes();
                libc::write(w.as_raw_fd(), msg.as_ptr().cast(), 4);
                let argv = [c"/bin/sleep".as_ptr(), c"5".as_ptr(), std::ptr::null()];
                libc::execv(c"/bin/sleep".as_ptr(), argv.as_ptr());
                libc::_exit(127);
            }
        }
        drop(w);
        let mut b = [0u8; 4];
        let mut n = 0;
        while n < 4 {
            // SAFETY: reading a pipe into a local buffer.
            let k = unsafe { libc::read(r.as_raw_fd(), b[n..].as_mut_ptr().cast(), 4 - n) };
            assert!(k > 0);
            n += k as usize;
        }
        let child_fd = i32::from_ne_bytes(b);
        let exe = format!("/proc/{pid}/exe");
        for _ in 0..500 {
            if std::fs::read_link(&exe).is_ok_and(|p| p.ends_with("sleep")) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        // The child's very descriptor (re-opening its /proc link would
        // open the new image instead).
        let pidfd = crate::pidfd_open(pid as u32).unwrap();
        // SAFETY: pidfd_getfd with integer arguments.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), child_fd, 0) };
        assert!(fd >= 0, "pidfd_getfd: {}", io::Error::last_os_error());
        // SAFETY: fresh descriptor owned by nobody else.
        let f = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let m = ProcessMemory::bind(f).unwrap();
        let mut got = [0u8; 8];
        // Any address: the old image is gone.
        let r = m.read(0x400000, &mut got);
        // SAFETY: kill/waitpid on our own child.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        assert!(matches!(r, Err(AccessError::ImageGone)), "{r:?}");
    }

    fn pipe() -> (OwnedFd, OwnedFd) {
        let mut p = [0; 2];
        // SAFETY: p is two writable ints.
        assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
        // SAFETY: fresh descriptors owned by nobody else.
        unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) }
    }
}
