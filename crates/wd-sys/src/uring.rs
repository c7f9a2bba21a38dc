//! io_uring for file reads into a [`Mapping`]: several reads in flight from
//! one thread, no thread per read.
//!
//! The kernel writes a read's bytes into the mapping after `push_read`
//! returns, so reads are pushed only inside [`Uring::reads`], through a
//! [`Reads`] that borrows the mapping and the file (`'m`) and that the
//! caller never owns: when `reads` returns (or unwinds) every read pushed
//! has completed. A ring value the caller owned could be leaked
//! (`mem::forget` is safe), ending the borrow with reads still in flight,
//! and the kernel would write into memory since given back.

use std::io;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, BorrowedFd};

use io_uring::{opcode, types, IoUring};

use crate::{count, Mapping, Result, SysError};

/// One finished read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadDone {
    /// The `user_data` given to [`Reads::push_read`].
    pub user_data: u64,
    /// Bytes read (0 at end of file), or the negative errno.
    pub result: i32,
}

/// An io_uring instance for file reads; idle between [`Uring::reads`].
pub struct Uring {
    ring: IoUring,
}

impl std::fmt::Debug for Uring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Uring").finish_non_exhaustive()
    }
}

/// Largest single read: what one SQE's 32-bit length (and the kernel's
/// per-call cap) allows.
pub const MAX_READ: usize = 0x7fff_f000;

impl Uring {
    /// A ring with room for `entries` reads in flight. Fails with ENOSYS
    /// (no io_uring in this kernel) or EPERM (disabled by
    /// `kernel.io_uring_disabled`, or by a seccomp policy).
    pub fn new(entries: u32) -> Result<Uring> {
        count();
        let ring = IoUring::builder()
            .setup_clamp()
            .build(entries.max(1))
            .map_err(|source| SysError::Call {
                call: "io_uring_setup",
                source,
            })?;
        Ok(Uring { ring })
    }

    /// Run `f` with reads into memory borrowed for `'m`; every read it
    /// pushed has completed when this returns, even when `f` panics.
    /// (`'m` outlives this call, and the [`Reads`] is this call's own.)
    pub fn reads<'m, T>(&mut self, f: impl FnOnce(&mut Reads<'_, 'm>) -> T) -> T {
        let mut reads = Reads {
            ring: &mut self.ring,
            in_flight: 0,
            _borrow: PhantomData,
        };
        f(&mut reads)
    }
}

/// Reads in flight on a [`Uring`] into mappings borrowed for `'m`.
pub struct Reads<'r, 'm> {
    ring: &'r mut IoUring,
    in_flight: usize,
    _borrow: PhantomData<&'m Mapping>,
}

impl std::fmt::Debug for Reads<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reads")
            .field("in_flight", &self.in_flight)
            .finish()
    }
}

impl<'m> Reads<'_, 'm> {
    /// Reads submitted or queued and not yet completed.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Whether the submission queue has room for another read.
    pub fn has_room(&mut self) -> bool {
        !self.ring.submission().is_full()
    }

    /// Queue a read of `len` bytes at `file_off` of `fd` into `map` at
    /// `map_off`; it starts at the next [`Reads::submit_and_wait`].
    pub fn push_read(
        &mut self,
        fd: BorrowedFd<'m>,
        map: &'m Mapping,
        map_off: usize,
        len: usize,
        file_off: u64,
        user_data: u64,
    ) -> Result<()> {
        let ok = map_off.checked_add(len).is_some_and(|end| end <= map.len());
        if !ok || len > MAX_READ || !map.is_writable() {
            return Err(SysError::Invalid {
                call: "io_uring read",
                what: "range beyond the mapping, too long, or read-only",
            });
        }
        // SAFETY: pointer arithmetic inside the mapping (checked above).
        let ptr = unsafe { map.as_ptr().add(map_off) };
        let sqe = opcode::Read::new(types::Fd(fd.as_raw_fd()), ptr, len as u32)
            .offset(file_off)
            .build()
            .user_data(user_data);
        // SAFETY: the SQE names memory inside `map` and the file `fd`, both
        // borrowed for 'm, which outlives the `Uring::reads` call this
        // value belongs to; that call drops it, and its Drop waits for
        // every read in flight.
        unsafe { self.ring.submission().push(&sqe) }.map_err(|_| SysError::Invalid {
            call: "io_uring read",
            what: "submission queue full",
        })?;
        self.in_flight += 1;
        Ok(())
    }

    /// Submit what was queued and wait until at least `want` reads have
    /// completed (0: do not wait); then take every completion posted.
    pub fn submit_and_wait(&mut self, want: usize, out: &mut Vec<ReadDone>) -> Result<()> {
        let want = want.min(self.in_flight);
        loop {
            count();
            match self.ring.submit_and_wait(want) {
                Ok(_) => break,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                // EBUSY: the completion queue is full; reap and retry.
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => break,
                Err(source) => {
                    return Err(SysError::Call {
                        call: "io_uring_enter",
                        source,
                    })
                }
            }
        }
        self.reap(out);
        Ok(())
    }

    /// Take the completions posted, without a system call (a caller that
    /// polls).
    pub fn reap(&mut self, out: &mut Vec<ReadDone>) {
        for cqe in self.ring.completion() {
            out.push(ReadDone {
                user_data: cqe.user_data(),
                result: cqe.result(),
            });
            self.in_flight -= 1;
        }
    }

    /// Wait for every read in flight (their results are discarded).
    pub fn drain(&mut self) {
        let mut sink = Vec::new();
        while self.in_flight > 0 {
            sink.clear();
            if self.submit_and_wait(1, &mut sink).is_err() {
                // The kernel refuses to wait (should not happen): yield and
                // retry rather than free memory a read may still reach.
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }
}

impl Drop for Reads<'_, '_> {
    fn drop(&mut self) {
        self.drain();
    }
}

/// Direction of a [`DeviceRing`] transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transfer {
    /// File to memory.
    Read,
    /// Memory to file.
    Write,
}

/// An io_uring through which a device reads and writes files for requests
/// it holds: the memory of each transfer is a [`crate::devmem::HeldSlice`]
/// the engine keeps pinned until the device reports the request, so the
/// kernel may write it after `push` returns. Submitting is one system call
/// per batch; reaping reads the completion ring without one. Dropping the
/// ring waits for every transfer in flight.
pub struct DeviceRing {
    ring: IoUring,
    in_flight: usize,
    queued: usize,
}

impl std::fmt::Debug for DeviceRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceRing")
            .field("in_flight", &self.in_flight)
            .field("queued", &self.queued)
            .finish()
    }
}

impl DeviceRing {
    /// A ring with room for `entries` transfers in flight (see
    /// [`Uring::new`] for why it may fail).
    pub fn new(entries: u32) -> Result<DeviceRing> {
        count();
        let ring = IoUring::builder()
            .setup_clamp()
            .build(entries.max(1))
            .map_err(|source| SysError::Call {
                call: "io_uring_setup",
                source,
            })?;
        Ok(DeviceRing {
            ring,
            in_flight: 0,
            queued: 0,
        })
    }

    /// Transfers submitted or queued and not yet reaped.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Queue a transfer of `buf` at `file_off` of `fd`; it starts at the
    /// next [`DeviceRing::submit`]. False when the ring is full or `buf`
    /// is longer than [`MAX_READ`] (callers check room first and cut
    /// transfers far below that).
    ///
    /// # Safety
    /// `buf`'s memory must stay mapped and `fd` open until this transfer's
    /// completion is reaped (or the ring is dropped, which waits for it).
    pub unsafe fn push(
        &mut self,
        how: Transfer,
        fd: BorrowedFd<'_>,
        buf: &crate::devmem::HeldSlice,
        file_off: u64,
        user_data: u64,
    ) -> bool {
        if buf.len() > MAX_READ {
            return false;
        }
        let fd = types::Fd(fd.as_raw_fd());
        let sqe = match how {
            Transfer::Read => opcode::Read::new(fd, buf.as_ptr(), buf.len() as u32)
                .offset(file_off)
                .build(),
            Transfer::Write => opcode::Write::new(fd, buf.as_ptr(), buf.len() as u32)
                .offset(file_off)
                .build(),
        }
        .user_data(user_data);
        // SAFETY: the caller keeps the memory and the file for as long as
        // the transfer is in flight; Drop waits for it.
        if unsafe { self.ring.submission().push(&sqe) }.is_err() {
            return false;
        }
        self.in_flight += 1;
        self.queued += 1;
        true
    }

    /// Start what was queued (one system call; none when nothing was).
    pub fn submit(&mut self) -> Result<()> {
        if self.queued == 0 {
            return Ok(());
        }
        loop {
            count();
            match self.ring.submit() {
                Ok(_) => {
                    self.queued = 0;
                    return Ok(());
                }
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                // EBUSY / EAGAIN: completions must be reaped first; the
                // queued entries go with the next submit.
                Err(e)
                    if e.raw_os_error() == Some(libc::EBUSY)
                        || e.raw_os_error() == Some(libc::EAGAIN) =>
                {
                    return Ok(())
                }
                Err(source) => {
                    return Err(SysError::Call {
                        call: "io_uring_enter",
                        source,
                    })
                }
            }
        }
    }

    /// Take the completions posted (no system call).
    pub fn reap(&mut self, out: &mut Vec<ReadDone>) {
        for cqe in self.ring.completion() {
            out.push(ReadDone {
                user_data: cqe.user_data(),
                result: cqe.result(),
            });
            self.in_flight -= 1;
        }
    }

    /// Wait for at least one completion (or none in flight).
    pub fn wait(&mut self, out: &mut Vec<ReadDone>) -> Result<()> {
        if self.in_flight == 0 {
            return Ok(());
        }
        loop {
            count();
            match self.ring.submit_and_wait(1) {
                Ok(_) => {
                    self.queued = 0;
                    break;
                }
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => break,
                Err(source) => {
                    return Err(SysError::Call {
                        call: "io_uring_enter",
                        source,
                    })
                }
            }
        }
        self.reap(out);
        Ok(())
    }

    /// Wait for every transfer in flight (their results are discarded).
    pub fn drain(&mut self) {
        let mut sink = Vec::new();
        while self.in_flight > 0 {
            sink.clear();
            if self.wait(&mut sink).is_err() {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }
}

impl Drop for DeviceRing {
    fn drop(&mut self) {
        self.drain();
    }
}

/// Whether this process may use io_uring, and why not: `Err` carries the
/// errno's message (ENOSYS: kernel without it; EPERM: disabled).
pub fn probe() -> std::result::Result<(), io::Error> {
    match Uring::new(2) {
        Ok(_) => Ok(()),
        Err(SysError::Call { source, .. }) => Err(source),
        Err(e) => Err(io::Error::other(e.to_string())),
    }
}

/// Refuse io_uring to this thread and to the threads and processes it
/// starts from now on: a seccomp filter makes io_uring_setup fail with
/// EPERM, as the default profiles of container runtimes do. For running
/// (and testing) the fallbacks on a machine that has io_uring.
pub fn refuse_io_uring() -> Result<()> {
    #[cfg(target_arch = "x86_64")]
    const AUDIT_ARCH: u32 = 0xC000_003E;
    #[cfg(target_arch = "aarch64")]
    const AUDIT_ARCH: u32 = 0xC000_00B7;
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    const AUDIT_ARCH: u32 = 0;
    // Offsets in struct seccomp_data.
    const NR: u32 = 0;
    const ARCH: u32 = 4;
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jeq = |k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    };
    let ld = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    let ret = libc::BPF_RET | libc::BPF_K;
    let mut prog = [
        stmt(ld, ARCH),
        // Another architecture's calls (x32, compat): leave them alone.
        jeq(AUDIT_ARCH, 1, 0),
        stmt(ret, libc::SECCOMP_RET_ALLOW),
        stmt(ld, NR),
        jeq(libc::SYS_io_uring_setup as u32, 0, 1),
        stmt(ret, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
        stmt(ret, libc::SECCOMP_RET_ALLOW),
    ];
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_mut_ptr(),
    };
    count();
    // SAFETY: prctl with integer arguments.
    let r = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    crate::check("prctl(PR_SET_NO_NEW_PRIVS)", r as libc::c_long)?;
    count();
    // SAFETY: fprog points to `prog`, a valid filter program that outlives
    // the call (the kernel copies it).
    let r = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER as libc::c_ulong,
            &fprog as *const libc::sock_fprog,
        )
    };
    crate::check("prctl(PR_SET_SECCOMP)", r as libc::c_long).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    #[test]
    fn reads_land_in_the_mapping() {
        if let Err(e) = probe() {
            wd_testutil::skip(
                "wd_sys::uring::reads_land_in_the_mapping",
                &format!("io_uring unavailable: {e}"),
            );
            return;
        }
        let p = std::env::temp_dir().join(format!("wd-sys-uring-{}", std::process::id()));
        let data: Vec<u8> = (0..20000u32).map(|i| (i % 251) as u8).collect();
        std::fs::File::create(&p).unwrap().write_all(&data).unwrap();
        let fd = crate::file::open_read(&p, false).unwrap();
        let mfd = crate::memfd_create("t", false).unwrap();
        crate::ftruncate(mfd.as_fd(), 24576).unwrap();
        let map = Mapping::map_shared(mfd.as_fd(), 0, 24576).unwrap();
        let mut done = Vec::new();
        Uring::new(4).unwrap().reads(|r| {
            r.push_read(fd.as_fd(), &map, 0, 8192, 0, 1).unwrap();
            r.push_read(fd.as_fd(), &map, 8192, 16384, 8192, 2).unwrap();
            assert!(r.push_read(fd.as_fd(), &map, 20000, 8192, 0, 3).is_err());
            while r.in_flight() > 0 {
                r.submit_and_wait(1, &mut done).unwrap();
            }
        });
        done.sort_by_key(|d| d.user_data);
        assert_eq!(
            done,
            vec![
                ReadDone {
                    user_data: 1,
                    result: 8192
                },
                ReadDone {
                    user_data: 2,
                    result: 20000 - 8192
                }
            ]
        );
        let mut back = vec![0u8; 20000];
        map.copy_out(0, &mut back).unwrap();
        assert_eq!(back, data);
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn reads_left_in_flight_complete_before_reads_returns() {
        if let Err(e) = probe() {
            wd_testutil::skip(
                "wd_sys::uring::reads_left_in_flight_complete_before_reads_returns",
                &format!("io_uring unavailable: {e}"),
            );
            return;
        }
        let (rx, mut tx) = std::os::unix::net::UnixStream::pair().unwrap();
        let mfd = crate::memfd_create("t", false).unwrap();
        crate::ftruncate(mfd.as_fd(), 4096).unwrap();
        let map = Mapping::map_shared(mfd.as_fd(), 0, 4096).unwrap();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            tx.write_all(b"late").unwrap();
        });
        let mut ring = Uring::new(2).unwrap();
        // Submitted, not waited for: the pipe has nothing yet.
        ring.reads(|r| {
            r.push_read(rx.as_fd(), &map, 0, 4, 0, 1).unwrap();
            r.submit_and_wait(0, &mut Vec::new()).unwrap();
            assert_eq!(r.in_flight(), 1);
        });
        let mut back = [0u8; 4];
        map.copy_out(0, &mut back).unwrap();
        assert_eq!(&back, b"late");
        writer.join().unwrap();
        // The ring serves the next reads.
        let mut done = Vec::new();
        let (rx2, mut tx2) = std::os::unix::net::UnixStream::pair().unwrap();
        tx2.write_all(b"next").unwrap();
        ring.reads(|r| {
            r.push_read(rx2.as_fd(), &map, 4, 4, 0, 2).unwrap();
            r.submit_and_wait(1, &mut done).unwrap();
        });
        assert_eq!(
            done,
            vec![ReadDone {
                user_data: 2,
                result: 4
            }]
        );
    }
}
