//! The thin system-call layer of WrapDrive.
//!
//! Every system call the framework makes goes through this crate, so that
//! (a) `unsafe` lives in one audited place and (b) the data path can count
//! the calls it issues: [`syscalls_on_this_thread`] is how `wd bench` shows
//! that a polled queue makes none per request.
#![allow(unsafe_code)]

use std::cell::Cell;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::ptr::NonNull;
use std::time::Duration;

pub mod devmem;
pub mod dl;
pub mod file;
pub mod guard;
pub mod pages;
pub mod process_mem;
pub mod uring;
pub mod window;

/// Errors of the system-call layer: the failing call and its errno.
#[derive(Debug, thiserror::Error)]
pub enum SysError {
    /// A system call failed.
    #[error("{call} failed: {source}")]
    Call {
        /// Name of the call.
        call: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// An argument could not be passed to the kernel (e.g. an interior NUL).
    #[error("invalid argument to {call}: {what}")]
    Invalid {
        /// Name of the call.
        call: &'static str,
        /// What was wrong.
        what: &'static str,
    },
    /// Descriptors the peer sent with a message could not be given to
    /// this process, which is at its open-file limit (`EMFILE`); the
    /// bytes that came with them are lost.
    #[error("descriptors sent with a message could not be received: this process is at its open-file limit")]
    FdsLost,
}

impl SysError {
    /// The positive errno behind this error (EINVAL for argument errors).
    pub fn errno(&self) -> i32 {
        match self {
            SysError::Call { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            SysError::Invalid { .. } => libc::EINVAL,
            SysError::FdsLost => libc::EMFILE,
        }
    }

    /// Whether a call on a descriptor with a timeout (SO_RCVTIMEO,
    /// SO_SNDTIMEO) gave up waiting.
    pub fn timed_out(&self) -> bool {
        matches!(self.errno(), libc::EAGAIN | libc::ETIMEDOUT)
    }
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, SysError>;

thread_local! {
    static SYSCALLS: Cell<u64> = const { Cell::new(0) };
}

#[inline]
fn count() {
    SYSCALLS.with(|c| c.set(c.get() + 1));
}

/// System calls this thread has issued through this crate: the data path's
/// only way into the kernel, so a delta of zero over N requests proves N
/// requests cost no system call.
pub fn syscalls_on_this_thread() -> u64 {
    SYSCALLS.with(|c| c.get())
}

fn check(call: &'static str, ret: libc::c_long) -> Result<libc::c_long> {
    if ret < 0 {
        Err(SysError::Call {
            call,
            source: io::Error::last_os_error(),
        })
    } else {
        Ok(ret)
    }
}

fn cstring(call: &'static str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| SysError::Invalid {
        call,
        what: "string contains NUL",
    })
}

// ---------------------------------------------------------------- memfd

/// Create an anonymous memory file that can be sealed and passed to another process.
pub fn memfd_create(name: &str, hugetlb: bool) -> Result<OwnedFd> {
    count();
    let cname = cstring("memfd_create", name)?;
    let mut flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    if hugetlb {
        // hugetlb memfds cannot be sealed on older kernels; keep sealing off there.
        flags = libc::MFD_CLOEXEC | libc::MFD_HUGETLB;
    }
    // SAFETY: cname is a valid NUL-terminated string that outlives the call.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), flags) };
    check("memfd_create", fd as libc::c_long)?;
    // SAFETY: fd was just returned by the kernel and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Set a file's size.
pub fn ftruncate(fd: BorrowedFd<'_>, size: u64) -> Result<()> {
    count();
    // SAFETY: plain syscall on a borrowed, open descriptor.
    let r = unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) };
    check("ftruncate", r as libc::c_long).map(|_| ())
}

/// A file's current size in bytes.
pub fn file_size(fd: BorrowedFd<'_>) -> Result<u64> {
    count();
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: st is a valid out-pointer of the right type.
    let r = unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) };
    check("fstat", r as libc::c_long)?;
    // SAFETY: fstat succeeded, so it initialised st.
    Ok(unsafe { st.assume_init() }.st_size as u64)
}

/// Seal bit: the file cannot shrink, so a peer's mapping is never cut short
/// (a hole punched in it can still fault: see [`guard`]).
pub const SEAL_SHRINK: i32 = libc::F_SEAL_SHRINK;
/// Seal bit: the file cannot grow.
pub const SEAL_GROW: i32 = libc::F_SEAL_GROW;
/// Seal bit: no write at all, through any mapping.
pub const SEAL_WRITE: i32 = libc::F_SEAL_WRITE;
/// Seal bit: no further seals can be added or removed.
pub const SEAL_SEAL: i32 = libc::F_SEAL_SEAL;

/// Add seals to a memfd.
pub fn add_seals(fd: BorrowedFd<'_>, seals: i32) -> Result<()> {
    count();
    // SAFETY: fcntl with an int argument on an open descriptor.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) };
    check("fcntl(F_ADD_SEALS)", r as libc::c_long).map(|_| ())
}

/// The seals a file carries (0 for files that cannot be sealed).
pub fn get_seals(fd: BorrowedFd<'_>) -> Result<i32> {
    count();
    // SAFETY: fcntl without argument on an open descriptor.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    check("fcntl(F_GET_SEALS)", r as libc::c_long).map(|r| r as i32)
}

// ---------------------------------------------------------------- mappings

/// A shared mapping of a file, unmapped on drop.
///
/// The memory may be written concurrently by another process, so this type
/// never hands out references into it: callers get raw pointers and must use
/// volatile, atomic or `ptr::copy` access.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    /// Mapped PROT_WRITE (writes through a read-only mapping would fault).
    writable: bool,
    /// The process that mapped it, once [`Mapping::dont_fork`] kept it from
    /// forked children (0 before): a child's copy of this value names
    /// memory the child does not have, perhaps its own by now.
    owner: std::sync::atomic::AtomicU32,
}

// SAFETY: the mapping is plain shared memory; it has no thread affinity and
// every access through it goes through raw pointers chosen by the caller.
unsafe impl Send for Mapping {}
// SAFETY: see Send; the type itself holds no interior state besides ptr/len.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Map `len` bytes of `fd` at `offset`, shared, read-write.
    pub fn map_shared(fd: BorrowedFd<'_>, offset: u64, len: usize) -> Result<Mapping> {
        Mapping::map_fd(fd, offset, len, true)
    }

    /// Map `len` bytes of `fd` at `offset`, shared, writable or not.
    pub(crate) fn map_fd(
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        writable: bool,
    ) -> Result<Mapping> {
        if len == 0 {
            return Err(SysError::Invalid {
                call: "mmap",
                what: "zero length",
            });
        }
        count();
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh mapping chosen by the kernel (addr = NULL); no
        // existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                offset as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(SysError::Call {
                call: "mmap",
                source: io::Error::last_os_error(),
            });
        }
        Ok(Mapping {
            ptr: NonNull::new(p.cast()).expect("mmap returned NULL"),
            len,
            writable,
            owner: std::sync::atomic::AtomicU32::new(0),
        })
    }

    /// Base address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never, by construction).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Keep this mapping out of children created by fork: a queue's ring
    /// belongs to the process that asked for it.
    pub fn dont_fork(&self) -> Result<()> {
        count();
        // SAFETY: advice on a range this object owns.
        let r = unsafe { libc::madvise(self.ptr.as_ptr().cast(), self.len, libc::MADV_DONTFORK) };
        check("madvise(MADV_DONTFORK)", r as libc::c_long)?;
        self.owner
            .store(getpid(), std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Bind the pages of this mapping to a NUMA node (best effort where the
    /// kernel has no NUMA support: returns the error, callers decide).
    pub fn bind_node(&self, node: u32) -> Result<()> {
        if node >= 64 {
            return Err(SysError::Invalid {
                call: "mbind",
                what: "node beyond 63",
            });
        }
        count();
        let mask: u64 = 1u64 << node;
        const MPOL_BIND: libc::c_long = 2;
        // SAFETY: mbind on a range this object owns; mask points to one u64
        // and maxnode (65) covers its 64 bits.
        let r = unsafe {
            libc::syscall(
                libc::SYS_mbind,
                self.ptr.as_ptr(),
                self.len,
                MPOL_BIND,
                &mask as *const u64,
                65usize,
                0usize,
            )
        };
        check("mbind", r).map(|_| ())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        let owner = *self.owner.get_mut();
        if owner != 0 && owner != getpid() {
            // A forked child's copy: the range was not inherited, and
            // whatever the child mapped there since is not ours to unmap.
            return;
        }
        // SAFETY: ptr/len describe a mapping created by map_shared and not
        // unmapped elsewhere (in this process: checked above).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// The system page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v <= 0 {
        4096
    } else {
        v as usize
    }
}

// ---------------------------------------------------------------- eventfd

/// Create an eventfd: the doorbell a sleeping engine or waiter blocks on.
pub fn eventfd() -> Result<OwnedFd> {
    count();
    // SAFETY: plain syscall.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    check("eventfd", fd as libc::c_long)?;
    // SAFETY: fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Ring a doorbell (eventfd write of 1).
pub fn eventfd_signal(fd: BorrowedFd<'_>) -> Result<()> {
    count();
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a valid u64.
    let r = unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    if r < 0 {
        let e = io::Error::last_os_error();
        // A saturated counter still wakes the reader: not an error.
        if e.raw_os_error() == Some(libc::EAGAIN) {
            return Ok(());
        }
        return Err(SysError::Call {
            call: "write(eventfd)",
            source: e,
        });
    }
    Ok(())
}

/// Consume a doorbell's count (non-blocking); returns the count (0 if none).
pub fn eventfd_drain(fd: BorrowedFd<'_>) -> Result<u64> {
    count();
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a valid u64.
    let r = unsafe { libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EAGAIN) {
            return Ok(0);
        }
        return Err(SysError::Call {
            call: "read(eventfd)",
            source: e,
        });
    }
    Ok(v)
}

// ------------------------------------------------------------ wake lines

/// A wake-up line between the host and a client: the two ends of a
/// datagram socket pair, what one end sends the other receives. Unlike an
/// eventfd's, its sends and receives never block whatever the ends'
/// O_NONBLOCK says ([`wake`] and [`wake_drain`] ask MSG_DONTWAIT per
/// call): an end passed to a client is an open file description the
/// client can change, and an engine's write to an eventfd a client had
/// made blocking (its counter full) stopped the engine for every client.
/// Nor can a client read what is sent to the host's end: it holds the
/// other one.
pub fn wake_line() -> Result<(OwnedFd, OwnedFd)> {
    count();
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: fds has room for the two descriptors socketpair writes.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    check("socketpair", r as libc::c_long)?;
    // SAFETY: two fresh descriptors owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Wake whoever waits on the other end of a [`wake_line`]. A line full of
/// wake-ups already wakes, and one whose other end is closed has nobody
/// to wake (its owner learns that it is gone by its socket): neither is
/// an error.
pub fn wake(fd: BorrowedFd<'_>) -> Result<()> {
    count();
    let one = 1u8;
    // SAFETY: sends one byte from a valid u8.
    let r = unsafe {
        libc::send(
            fd.as_raw_fd(),
            (&one as *const u8).cast(),
            1,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            // ECONNREFUSED: the first send after the other end closed;
            // ENOTCONN: every later one (the kernel dissolved the pair).
            Some(
                libc::EAGAIN | libc::ENOBUFS | libc::ECONNREFUSED | libc::ENOTCONN | libc::EINTR,
            ) => Ok(()),
            _ => Err(SysError::Call {
                call: "send(wake line)",
                source: e,
            }),
        };
    }
    Ok(())
}

/// Take the wake-ups waiting on an end of a [`wake_line`] (never
/// blocking): one system call for up to 16 (`recvmmsg`), so that a
/// waiter's usual single wake-up costs what an eventfd read did. Returns
/// how many there were (0 if none); at most a line's worth: peers sending
/// as fast as they can must not keep the caller here (what is left keeps
/// the end readable).
pub fn wake_drain(fd: BorrowedFd<'_>) -> Result<u64> {
    const BATCH: usize = 16;
    let mut n = 0u64;
    let mut bufs = [[0u8; 1]; BATCH];
    while n < 1024 {
        let mut iov: [libc::iovec; BATCH] = std::array::from_fn(|i| libc::iovec {
            iov_base: bufs[i].as_mut_ptr().cast(),
            iov_len: 1,
        });
        // SAFETY: an all-zero mmsghdr is valid (null names and controls).
        let mut msgs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
        for (m, v) in msgs.iter_mut().zip(iov.iter_mut()) {
            m.msg_hdr.msg_iov = v;
            m.msg_hdr.msg_iovlen = 1;
        }
        count();
        // SAFETY: BATCH headers, each naming one valid one-byte buffer,
        // all live for the call.
        let r = unsafe {
            libc::recvmmsg(
                fd.as_raw_fd(),
                msgs.as_mut_ptr(),
                BATCH as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) => Ok(n),
                Some(libc::EINTR) => continue,
                _ => Err(SysError::Call {
                    call: "recvmmsg(wake line)",
                    source: e,
                }),
            };
        }
        n += r as u64;
        if (r as usize) < BATCH {
            break;
        }
    }
    Ok(n)
}

/// One descriptor that is readable whenever any of `fds` is readable or
/// hung up (an epoll set, level-triggered): what an event loop that takes
/// a single fd per waiter (OpenSSL's async jobs) waits on.
pub fn epoll_of(fds: &[BorrowedFd<'_>]) -> Result<OwnedFd> {
    count();
    // SAFETY: plain syscall.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    check("epoll_create1", ep as libc::c_long)?;
    // SAFETY: fresh descriptor owned by nobody else.
    let ep = unsafe { OwnedFd::from_raw_fd(ep) };
    epoll_add(std::os::fd::AsFd::as_fd(&ep), fds)?;
    Ok(ep)
}

/// Add `fds` to the epoll set `ep` (readable, hung up or failed): a set
/// kept across a change of its members keeps its number for event loops
/// that registered it.
pub fn epoll_add(ep: BorrowedFd<'_>, fds: &[BorrowedFd<'_>]) -> Result<()> {
    for fd in fds {
        count();
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLHUP | libc::EPOLLERR) as u32,
            u64: fd.as_raw_fd() as u64,
        };
        // SAFETY: both descriptors are open; ev is a valid epoll_event.
        let r = unsafe {
            libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd.as_raw_fd(), &mut ev)
        };
        check("epoll_ctl", r as libc::c_long)?;
    }
    Ok(())
}

/// Take `fd` out of the epoll set `ep` (one not in it is no error).
pub fn epoll_del(ep: BorrowedFd<'_>, fd: BorrowedFd<'_>) {
    count();
    // SAFETY: both descriptors are open; a null event is allowed for DEL.
    let _ = unsafe {
        libc::epoll_ctl(
            ep.as_raw_fd(),
            libc::EPOLL_CTL_DEL,
            fd.as_raw_fd(),
            std::ptr::null_mut(),
        )
    };
}

/// Readiness of one descriptor after [`poll`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ready {
    /// Data can be read.
    pub readable: bool,
    /// The peer hung up or the descriptor is in error.
    pub hangup: bool,
}

/// Wait until one of `fds` is readable or hung up, or the timeout passes
/// (`None`: forever). Returns readiness per descriptor; EINTR counts as a
/// timeout (all false).
pub fn poll(fds: &[BorrowedFd<'_>], timeout: Option<Duration>) -> Result<Vec<Ready>> {
    count();
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|fd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // ppoll, not poll: a timeout under a millisecond would be 0 (a
    // caller waiting briefly would spin).
    let ts = timeout.map(|d| libc::timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: pfds is a valid array of pfds.len() pollfd structs; tsp is
    // null or points to `ts`, alive for the call; no signal mask.
    let r = unsafe {
        libc::ppoll(
            pfds.as_mut_ptr(),
            pfds.len() as libc::nfds_t,
            tsp,
            std::ptr::null(),
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EINTR) {
            return Ok(vec![Ready::default(); fds.len()]);
        }
        return Err(SysError::Call {
            call: "poll",
            source: e,
        });
    }
    Ok(pfds
        .iter()
        .map(|p| Ready {
            readable: p.revents & libc::POLLIN != 0,
            hangup: p.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0,
        })
        .collect())
}

// ---------------------------------------------------------------- sockets

/// Credentials of a socket peer, as the kernel recorded them at connect time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCred {
    /// Process id.
    pub pid: u32,
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

/// SO_PEERCRED of a connected UNIX socket.
pub fn peer_cred(sock: &UnixStream) -> Result<PeerCred> {
    count();
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred/len are valid out-pointers of the size passed.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    check("getsockopt(SO_PEERCRED)", r as libc::c_long)?;
    Ok(PeerCred {
        pid: cred.pid as u32,
        uid: cred.uid,
        gid: cred.gid,
    })
}

/// SO_PEERGROUPS (Linux 4.13): not exported by the `libc` crate for every
/// target, and its number differs on a few architectures.
#[cfg(any(target_arch = "mips", target_arch = "mips64"))]
const SO_PEERGROUPS: libc::c_int = 59;
#[cfg(any(target_arch = "sparc", target_arch = "sparc64"))]
const SO_PEERGROUPS: libc::c_int = 0x3d;
#[cfg(not(any(
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "sparc",
    target_arch = "sparc64"
)))]
const SO_PEERGROUPS: libc::c_int = 59;

/// Most supplementary groups a process can have (`NGROUPS_MAX`): bounds the
/// buffer a lying length could make us allocate.
const MAX_PEER_GROUPS: usize = 65536;

/// Supplementary groups of a socket peer (SO_PEERGROUPS), as the kernel
/// recorded them at connect time, so access by group cannot be claimed
/// after the fact.
pub fn peer_groups(sock: &UnixStream) -> Result<Vec<u32>> {
    let gid_size = std::mem::size_of::<libc::gid_t>();
    let mut groups: Vec<libc::gid_t> = vec![0; 32];
    loop {
        count();
        let mut len = (groups.len() * gid_size) as libc::socklen_t;
        // SAFETY: groups has room for `len` bytes of gid_t values and len is
        // a valid in/out pointer; the kernel writes at most `len` bytes.
        let r = unsafe {
            libc::getsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        match check("getsockopt(SO_PEERGROUPS)", r as libc::c_long) {
            Ok(_) => {
                groups.truncate((len as usize / gid_size).min(groups.len()));
                return Ok(groups);
            }
            // Too small: the kernel put the size it needs in len.
            Err(e)
                if e.errno() == libc::ERANGE
                    && (len as usize / gid_size) > groups.len()
                    && (len as usize / gid_size) <= MAX_PEER_GROUPS =>
            {
                groups.resize(len as usize / gid_size, 0);
            }
            Err(e) => return Err(e),
        }
    }
}

/// Connect a stream socket to the UNIX socket `path`, or to the abstract
/// socket `name` when `abstract_name` is set, waiting at most `timeout`
/// for room in the listener's backlog: a blocking connect to a listener
/// that stopped accepting (a stopped or hung host) waits for good once its
/// backlog is full. Past the timeout: EAGAIN.
pub fn connect_unix(name: &[u8], abstract_name: bool, timeout: Duration) -> Result<UnixStream> {
    // SAFETY: sockaddr_un is plain data; zeroed is a valid empty address.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    // An abstract name starts with a NUL byte; a path ends with one.
    let start = usize::from(abstract_name);
    let room = sa.sun_path.len() - usize::from(!abstract_name);
    if name.len() + start > room || (!abstract_name && (name.is_empty() || name.contains(&0))) {
        return Err(SysError::Invalid {
            call: "connect",
            what: "socket address too long, empty or holding a NUL byte",
        });
    }
    for (d, &b) in sa.sun_path[start..].iter_mut().zip(name) {
        *d = b as libc::c_char;
    }
    let base = std::mem::size_of::<libc::sa_family_t>();
    let len = base + start + name.len() + usize::from(!abstract_name);
    count();
    // SAFETY: plain socket(2).
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    check("socket", fd as libc::c_long)?;
    // SAFETY: fd was just returned by socket(2) and is owned by nobody else.
    let sock = unsafe { UnixStream::from_raw_fd(fd) };
    // A UNIX socket's connect waits for backlog room up to the send
    // timeout (and fails with EAGAIN after it); a signal ends the wait
    // with EINTR, and the next try waits only what is left.
    let by = std::time::Instant::now() + timeout;
    loop {
        let left = by.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(SysError::Call {
                call: "connect",
                source: io::Error::from_raw_os_error(libc::EAGAIN),
            });
        }
        sock.set_write_timeout(Some(left.max(Duration::from_micros(1))))
            .map_err(|source| SysError::Call {
                call: "setsockopt(SO_SNDTIMEO)",
                source,
            })?;
        count();
        // SAFETY: sa is a valid sockaddr_un and len is within it.
        let r = unsafe {
            libc::connect(
                sock.as_raw_fd(),
                (&sa as *const libc::sockaddr_un).cast(),
                len as libc::socklen_t,
            )
        };
        match check("connect", r as libc::c_long) {
            Err(e) if e.errno() == libc::EINTR => continue,
            Err(e) => return Err(e),
            Ok(_) => break,
        }
    }
    sock.set_write_timeout(None)
        .map_err(|source| SysError::Call {
            call: "setsockopt(SO_SNDTIMEO)",
            source,
        })?;
    Ok(sock)
}

const CMSG_BUF: usize = 128;

/// Send all of `bytes` on a stream socket, with `fds` attached to the first
/// segment (SCM_RIGHTS): at least one byte, which the descriptors ride on.
pub fn send_with_fds(sock: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> Result<()> {
    send_with_fds_by(sock, bytes, fds, None)
}

/// [`send_with_fds`], all of it sent by `by` (EAGAIN after): with a
/// deadline the socket is written without blocking and waited for in
/// `ppoll` for the time left, so a peer that reads a little at a time
/// cannot stretch one message past it (SO_SNDTIMEO bounds each wait for
/// room inside a blocking `sendmsg`, not the call nor the message).
pub fn send_with_fds_by(
    sock: &UnixStream,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
    by: Option<std::time::Instant>,
) -> Result<()> {
    if bytes.is_empty() && !fds.is_empty() {
        return Err(SysError::Invalid {
            call: "sendmsg",
            what: "descriptors need at least one byte to travel with",
        });
    }
    let mut sent = 0usize;
    let mut first = true;
    while sent < bytes.len() {
        count();
        let mut iov = libc::iovec {
            iov_base: bytes[sent..].as_ptr() as *mut libc::c_void,
            iov_len: bytes.len() - sent,
        };
        let mut cbuf = [0u64; CMSG_BUF / 8];
        // SAFETY: msghdr is plain data; zeroed is a valid initial state.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if first && !fds.is_empty() {
            let payload = std::mem::size_of_val(fds) as u32;
            // SAFETY: CMSG_SPACE is a pure size computation.
            let space = unsafe { libc::CMSG_SPACE(payload) } as usize;
            if space > CMSG_BUF {
                return Err(SysError::Invalid {
                    call: "sendmsg",
                    what: "too many descriptors",
                });
            }
            msg.msg_control = cbuf.as_mut_ptr().cast();
            msg.msg_controllen = space as _;
            // SAFETY: msg_control points to `space` writable bytes, enough for
            // one cmsghdr carrying `payload` bytes of descriptors.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(&msg);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(payload) as _;
                let data = libc::CMSG_DATA(c) as *mut RawFd;
                for (i, fd) in fds.iter().enumerate() {
                    data.add(i).write_unaligned(fd.as_raw_fd());
                }
            }
        }
        // With a deadline: never blocking in sendmsg (a blocking call waits
        // for room afresh for every buffer it fills, so it lasts as long as
        // the peer keeps reading a little), but in poll, for the time left.
        let flags = libc::MSG_NOSIGNAL | if by.is_some() { libc::MSG_DONTWAIT } else { 0 };
        // SAFETY: msg points to valid iovec and control buffers for the call.
        let r = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, flags) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            if let (Some(by), Some(libc::EAGAIN)) = (by, e.raw_os_error()) {
                let left = by.saturating_duration_since(std::time::Instant::now());
                if !left.is_zero() {
                    let mut p = libc::pollfd {
                        fd: sock.as_raw_fd(),
                        events: libc::POLLOUT,
                        revents: 0,
                    };
                    let ts = libc::timespec {
                        tv_sec: left.as_secs() as libc::time_t,
                        tv_nsec: left.subsec_nanos() as libc::c_long,
                    };
                    count();
                    // SAFETY: one valid pollfd and a valid timespec for
                    // the duration of the call.
                    unsafe { libc::ppoll(&mut p, 1, &ts, std::ptr::null()) };
                    continue;
                }
            }
            return Err(SysError::Call {
                call: "sendmsg",
                source: e,
            });
        }
        sent += r as usize;
        first = false;
    }
    Ok(())
}

/// Receive up to `buf.len()` bytes (at least one unless the peer closed:
/// then 0) and any descriptors attached, at most `max_fds`; extra
/// descriptors are closed and reported as an error (never leaked).
/// Descriptors the kernel could not give this process (it is at its
/// open-file limit) fail the call with [`SysError::FdsLost`].
pub fn recv_with_fds(
    sock: &UnixStream,
    buf: &mut [u8],
    max_fds: usize,
) -> Result<(usize, Vec<OwnedFd>)> {
    loop {
        count();
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let mut cbuf = [0u64; CMSG_BUF / 8];
        // SAFETY: zeroed msghdr is a valid initial state.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = CMSG_BUF as _;
        // SAFETY: msg points to valid buffers for the duration of the call.
        let r = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(SysError::Call {
                call: "recvmsg",
                source: e,
            });
        }
        let mut fds = Vec::new();
        // SAFETY: the kernel filled msg_control with msg_controllen bytes of
        // well-formed cmsghdrs; the CMSG_* macros walk within that length.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(c) as *const RawFd;
                    let n = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                        / std::mem::size_of::<RawFd>();
                    for i in 0..n {
                        fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        // Fewer than the control buffer had room for, and cut short: the
        // kernel could not install the rest here (the open-file limit).
        let room = (CMSG_BUF - std::mem::size_of::<libc::cmsghdr>()) / std::mem::size_of::<RawFd>();
        if msg.msg_flags & libc::MSG_CTRUNC != 0 && fds.len() <= max_fds && fds.len() < room {
            return Err(SysError::FdsLost);
        }
        if msg.msg_flags & libc::MSG_CTRUNC != 0 || fds.len() > max_fds {
            // Dropping `fds` closes every descriptor we did get.
            return Err(SysError::Invalid {
                call: "recvmsg",
                what: "too many descriptors attached",
            });
        }
        return Ok((r as usize, fds));
    }
}

// ---------------------------------------------------------------- processes

/// This process's id.
pub fn getpid() -> u32 {
    std::process::id()
}

/// Effective user id of this process.
pub fn geteuid() -> u32 {
    // SAFETY: no preconditions.
    unsafe { libc::geteuid() }
}

/// Effective group id of this process.
pub fn getegid() -> u32 {
    // SAFETY: no preconditions.
    unsafe { libc::getegid() }
}

/// A pidfd for `pid`: a stable handle that cannot be confused with a later
/// process reusing the number.
pub fn pidfd_open(pid: u32) -> Result<OwnedFd> {
    count();
    // SAFETY: plain syscall with integer arguments.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    let fd = check("pidfd_open", r)?;
    // SAFETY: fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Whether the process behind a pidfd has exited.
pub fn pidfd_exited(pidfd: BorrowedFd<'_>) -> Result<bool> {
    let r = poll(&[pidfd], Some(Duration::ZERO))?;
    Ok(r[0].readable || r[0].hangup)
}

fn get_nofile() -> Result<libc::rlimit> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    count();
    // SAFETY: r is a writable rlimit.
    let ret = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) };
    check("getrlimit", ret as libc::c_long)?;
    Ok(r)
}

/// Make the program `c` starts run with `limit` as its soft and hard
/// limits on open descriptors (as under `ulimit -n`), set in the child
/// before it executes.
pub fn limit_descriptors_on_exec(c: &mut std::process::Command, limit: u64) {
    use std::os::unix::process::CommandExt;
    let r = libc::rlimit {
        rlim_cur: limit,
        rlim_max: limit,
    };
    // SAFETY: the hook runs in the forked child before exec and calls
    // only setrlimit, which is async-signal-safe, on a value it owns.
    unsafe {
        c.pre_exec(move || {
            if libc::setrlimit(libc::RLIMIT_NOFILE, &r) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Take ownership of descriptor `fd` that this process inherited (from a
/// service manager, say), marking it close-on-exec. Fails when `fd` is not
/// open.
pub fn inherited_fd(fd: std::os::fd::RawFd) -> Result<OwnedFd> {
    count();
    // SAFETY: F_GETFD only inspects the descriptor table.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    check("fcntl(F_GETFD)", flags as libc::c_long)?;
    // SAFETY: as above; sets a flag on a descriptor we are about to own.
    let r = unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) };
    check("fcntl(F_SETFD)", r as libc::c_long)?;
    // SAFETY: the descriptor is open (checked) and, by the caller's
    // protocol (LISTEN_FDS), handed to this process alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The soft limit on open descriptors.
pub fn nofile_limit() -> Result<u64> {
    Ok(get_nofile()?.rlim_cur)
}

/// Descriptors this process has open (`/proc/self/fd`), `None` where
/// that cannot be read. The number of the newest is only a floor: the
/// kernel hands out the lowest free number, and closed ones leave holes.
pub fn open_descriptors() -> Option<u64> {
    count();
    let dir = std::fs::read_dir("/proc/self/fd").ok()?;
    // (The listing's own descriptor is among them.)
    Some((dir.count() as u64).saturating_sub(1))
}

/// The size of this process's descriptor table (`FDSize` in
/// `/proc/self/status`), `None` where that cannot be read: a bound on the
/// descriptors open, read without listing them (a listing of 20,000 takes
/// about 18 ms).
pub fn descriptor_table_size() -> Option<u64> {
    count();
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("FDSize:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Raise the soft limit on open descriptors to the hard limit; returns the
/// new soft limit.
pub fn raise_nofile_limit() -> Result<u64> {
    let mut r = get_nofile()?;
    if r.rlim_cur < r.rlim_max {
        r.rlim_cur = r.rlim_max;
        count();
        // SAFETY: r is a valid rlimit no higher than the hard limit.
        let ret = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) };
        check("setrlimit", ret as libc::c_long)?;
    }
    Ok(r.rlim_cur)
}

/// Run the calling thread on `cpu` only (benchmarks pin both ends of a
/// measurement so that runs compare like with like).
pub fn pin_thread(cpu: usize) -> Result<()> {
    // SAFETY: a zeroed cpu_set_t is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
        return Err(SysError::Invalid {
            call: "sched_setaffinity",
            what: "CPU number out of range",
        });
    }
    // SAFETY: cpu is inside the set (checked above).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    count();
    // SAFETY: pid 0 is the calling thread; set is a valid cpu_set_t.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    check("sched_setaffinity", r as libc::c_long).map(|_| ())
}

/// CPUs the calling thread may run on now (its affinity).
pub fn usable_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// CPUs online in the machine, whatever the calling thread's affinity.
pub fn online_cpus() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    n.max(1) as usize
}

/// Set this thread's errno (C entry points whose signature has no status).
pub fn set_errno(e: i32) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// Whether an error means the process (EMFILE) or the system (ENFILE) is
/// out of file descriptors.
pub fn is_out_of_descriptors(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// Around every fork: `prepare` in the forking thread before it, then
/// `parent` in the parent and `child` in the child, before fork returns
/// there. Used to invalidate queues that belong to the parent, and to
/// hold a lock across the fork (another thread holding it at the fork
/// leaves it held for ever in the child).
pub fn on_fork(
    prepare: Option<extern "C" fn()>,
    parent: Option<extern "C" fn()>,
    child: Option<extern "C" fn()>,
) -> Result<()> {
    let c = |f: Option<extern "C" fn()>| f.map(|f| f as unsafe extern "C" fn());
    // SAFETY: registering plain C function pointers.
    let r = unsafe { libc::pthread_atfork(c(prepare), c(parent), c(child)) };
    if r != 0 {
        return Err(SysError::Call {
            call: "pthread_atfork",
            source: io::Error::from_raw_os_error(r),
        });
    }
    Ok(())
}

/// Voluntary and involuntary context switches of the calling thread.
pub fn thread_context_switches() -> (u64, u64) {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: ru is a valid out-pointer.
    let r = unsafe { libc::getrusage(libc::RUSAGE_THREAD, ru.as_mut_ptr()) };
    if r != 0 {
        return (0, 0);
    }
    // SAFETY: getrusage succeeded and initialised ru.
    let ru = unsafe { ru.assume_init() };
    (ru.ru_nvcsw as u64, ru.ru_nivcsw as u64)
}

/// CPU time (user + system) consumed by the whole process so far.
pub fn process_cpu_time() -> Duration {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: ru is a valid out-pointer.
    let r = unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) };
    if r != 0 {
        return Duration::ZERO;
    }
    // SAFETY: initialised by the successful call.
    let ru = unsafe { ru.assume_init() };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Block SIGINT and SIGTERM in this thread (and threads it creates later),
/// so [`wait_termination`] can take them synchronously.
pub fn block_termination_signals() -> Result<()> {
    let mut set = std::mem::MaybeUninit::<libc::sigset_t>::zeroed();
    // SAFETY: set is a valid sigset_t out-pointer; sigemptyset initialises it.
    let r = unsafe {
        libc::sigemptyset(set.as_mut_ptr());
        libc::sigaddset(set.as_mut_ptr(), libc::SIGINT);
        libc::sigaddset(set.as_mut_ptr(), libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, set.as_ptr(), std::ptr::null_mut())
    };
    if r != 0 {
        return Err(SysError::Call {
            call: "pthread_sigmask",
            source: io::Error::from_raw_os_error(r),
        });
    }
    Ok(())
}

/// Wait until SIGINT or SIGTERM arrives (after [`block_termination_signals`]);
/// returns the signal number.
pub fn wait_termination() -> i32 {
    let mut set = std::mem::MaybeUninit::<libc::sigset_t>::zeroed();
    let mut sig: libc::c_int = 0;
    // SAFETY: set is initialised by sigemptyset before use; sig is a valid out-pointer.
    unsafe {
        libc::sigemptyset(set.as_mut_ptr());
        libc::sigaddset(set.as_mut_ptr(), libc::SIGINT);
        libc::sigaddset(set.as_mut_ptr(), libc::SIGTERM);
        while libc::sigwait(set.as_ptr(), &mut sig) != 0 {}
    }
    sig
}

/// End the process now with `code`, running nothing of it (`_exit(2)`):
/// for a thread that ends the process while others still run (an
/// in-process host), which atexit handlers could race.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit takes a plain integer and does not return.
    unsafe { libc::_exit(code) }
}

/// SIGINT's number (what [`wait_termination`] returns for it).
pub const SIGINT: i32 = libc::SIGINT;

/// Ask process `pid` to end (SIGTERM). Only for a child not yet waited
/// for: any other pid may by now be another process's.
pub fn terminate(pid: u32) -> Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| SysError::Invalid {
        call: "kill",
        what: "a pid beyond pid_t",
    })?;
    count();
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    let r = unsafe { libc::kill(pid, libc::SIGTERM) };
    check("kill", r as libc::c_long).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    /// "One whose other end is closed has nobody to wake": only the first
    /// send after the close fails with ECONNREFUSED (the kernel then
    /// dissolves the pair), every later one with ENOTCONN, which `wake`
    /// reported as an error.
    /// The table's size bounds the descriptors open (the host's headroom
    /// check lists them only when the table could hold too many).
    #[test]
    fn the_descriptor_table_holds_every_open_descriptor() {
        let _f = std::fs::File::open("/dev/null").unwrap();
        let open = open_descriptors().unwrap();
        assert!(open >= 4, "{open}");
        assert!(descriptor_table_size().unwrap() >= open);
    }

    #[test]
    fn waking_a_closed_line_is_never_an_error() {
        let (a, b) = wake_line().unwrap();
        wake(a.as_fd()).unwrap();
        drop(b);
        for i in 0..3 {
            let r = wake(a.as_fd());
            assert!(r.is_ok(), "wake {i} after the other end closed: {r:?}");
        }
    }

    /// A mapping kept from forked children, dropped in one: the child
    /// has not got the range, and what it mapped there since stays (the
    /// drop unmapped it; a client library's waker dropped in a child
    /// would pull memory from under the child).
    #[test]
    fn a_forked_childs_copy_unmaps_nothing() {
        let fd = memfd_create("t", false).unwrap();
        ftruncate(fd.as_fd(), 8192).unwrap();
        let m = Mapping::map_shared(fd.as_fd(), 0, 8192).unwrap();
        m.dont_fork().unwrap();
        let at = m.as_ptr();
        // SAFETY: fork; the child makes only system calls and _exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: an anonymous mapping where the parent's range was
            // (not inherited: NOREPLACE succeeds), then the copy dropped
            // and the new page read.
            unsafe {
                let p = libc::mmap(
                    at.cast(),
                    4096,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                    -1,
                    0,
                );
                if p != at.cast() {
                    libc::_exit(2);
                }
                p.cast::<u8>().write_volatile(7);
                drop(m);
                let mut vec = [0u8; 1];
                let code = if libc::mincore(p, 4096, vec.as_mut_ptr()) == 0
                    && p.cast::<u8>().read_volatile() == 7
                {
                    0
                } else {
                    3
                };
                libc::_exit(code);
            }
        }
        let mut status = 0;
        // SAFETY: waits for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "child: {status:#x}"
        );
        drop(m);
    }

    #[test]
    fn memfd_seal_and_map() {
        let fd = memfd_create("t", false).unwrap();
        ftruncate(fd.as_fd(), 8192).unwrap();
        add_seals(fd.as_fd(), SEAL_SHRINK).unwrap();
        assert!(get_seals(fd.as_fd()).unwrap() & SEAL_SHRINK != 0);
        assert!(
            ftruncate(fd.as_fd(), 4096).is_err(),
            "shrink must be refused"
        );
        let a = Mapping::map_shared(fd.as_fd(), 0, 8192).unwrap();
        let b = Mapping::map_shared(fd.as_fd(), 4096, 4096).unwrap();
        // SAFETY: both mappings are live and 4096 bytes into `a` is `b`'s first byte.
        unsafe {
            a.as_ptr().add(4096).write_volatile(0x5a);
            assert_eq!(b.as_ptr().read_volatile(), 0x5a);
        }
        assert_eq!(file_size(fd.as_fd()).unwrap(), 8192);
    }

    #[test]
    fn a_poll_under_a_millisecond_waits() {
        let e = eventfd().unwrap();
        let t = std::time::Instant::now();
        let r = poll(&[e.as_fd()], Some(Duration::from_micros(500))).unwrap();
        assert!(!r[0].readable);
        assert!(
            t.elapsed() >= Duration::from_micros(500),
            "{:?}",
            t.elapsed()
        );
        eventfd_signal(e.as_fd()).unwrap();
        assert!(poll(&[e.as_fd()], None).unwrap()[0].readable);
    }

    #[test]
    fn fds_cross_a_socket() {
        let (a, b) = UnixStream::pair().unwrap();
        let e = eventfd().unwrap();
        send_with_fds(&a, b"hi", &[e.as_fd()]).unwrap();
        let mut buf = [0u8; 8];
        let (n, fds) = recv_with_fds(&b, &mut buf, 1).unwrap();
        assert_eq!(&buf[..n], b"hi");
        assert_eq!(fds.len(), 1);
        eventfd_signal(fds[0].as_fd()).unwrap();
        assert_eq!(eventfd_drain(e.as_fd()).unwrap(), 1);
        assert_eq!(eventfd_drain(e.as_fd()).unwrap(), 0);
        let c = peer_cred(&b).unwrap();
        assert_eq!(c.pid, getpid());
        // Without a byte the descriptors would not be sent at all.
        let e = send_with_fds(&a, b"", &[e.as_fd()]).unwrap_err();
        assert!(matches!(e, SysError::Invalid { .. }), "{e}");
    }

    #[test]
    fn peer_groups_are_this_process_groups() {
        let (_a, b) = UnixStream::pair().unwrap();
        let mut got = peer_groups(&b).unwrap();
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status
            .lines()
            .find_map(|l| l.strip_prefix("Groups:"))
            .unwrap();
        let mut want: Vec<u32> = line
            .split_whitespace()
            .map(|g| g.parse().unwrap())
            .collect();
        got.sort_unstable();
        want.sort_unstable();
        assert_eq!(got, want);
        assert_eq!(peer_cred(&b).unwrap().gid, getegid());
    }

    #[test]
    fn too_many_fds_are_refused_and_closed() {
        let (a, b) = UnixStream::pair().unwrap();
        let e1 = eventfd().unwrap();
        let e2 = eventfd().unwrap();
        send_with_fds(&a, b"x", &[e1.as_fd(), e2.as_fd()]).unwrap();
        let mut buf = [0u8; 8];
        assert!(recv_with_fds(&b, &mut buf, 1).is_err());
    }

    #[test]
    fn syscalls_are_counted() {
        let before = syscalls_on_this_thread();
        let e = eventfd().unwrap();
        eventfd_signal(e.as_fd()).unwrap();
        assert_eq!(syscalls_on_this_thread() - before, 2);
    }
}
