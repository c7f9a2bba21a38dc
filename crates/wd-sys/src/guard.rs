//! Surviving client memory that vanishes under the host.
//!
//! The host maps memory its clients share (sealed memfds) and its engine
//! threads read and write it directly. Sealing cannot make that memory stay:
//! `F_SEAL_SHRINK` does not stop `fallocate(FALLOC_FL_PUNCH_HOLE)`, and a
//! hole in a hugetlb file is faulted in again only if the pool still has a
//! free huge page. A client that punches a hole and then takes every free
//! page makes the host's next touch of the hole a SIGBUS, which would kill
//! the host and every other client's queues with it.
//!
//! There is no way to refuse or to check such memory ahead of each access
//! (the hole can be punched between the check and the access), and no way
//! to unwind out of a signal handler through Rust frames. So the fault is
//! absorbed where it happens: while a thread is inside a [`guarded`]
//! section, the SIGBUS handler replaces the faulting page of the mapping
//! with private anonymous zero memory and returns, the faulting instruction
//! runs again against that page and succeeds, and the section reports the
//! first fault address to its caller. The replaced page no longer is the
//! client's memory (reads see zeros, writes are lost, for every later user
//! of that host mapping too), so the caller must fail the request and stop
//! serving the queue whose memory it was: the host marks it broken.
//!
//! Outside a guarded section a SIGBUS is a host bug, not a client's doing:
//! the handler passes it on to the disposition that was there before it
//! (the Rust runtime's handler, or the default), so it is as fatal as it
//! always was.
//!
//! The handler is async-signal-safe: it reads a `const`-initialised
//! thread-local without destructor (plain atomics: the one kind of data the
//! language lets a handler and its own thread share) and statics written
//! before it was installed, makes only system calls (mmap, sigaction,
//! tgkill), allocates nothing, takes no lock, and saves and restores errno.

use std::cell::Cell;
use std::io;
use std::marker::PhantomData;
use std::sync::atomic::{compiler_fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Errors of the SIGBUS guard.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    /// The handler could not be installed; guarded sections then give no
    /// protection.
    #[error("cannot install the SIGBUS handler: {0}")]
    Install(#[source] io::Error),
}

/// Pages one section may replace before a fault is treated as a host bug:
/// a client's request touches a bounded amount of memory, a loop that keeps
/// faulting does not.
const MAX_REPLACED: u32 = 4096;
/// Sizes a faulting page is replaced at: hugetlb mappings can only be split
/// at their own page size, which the handler cannot look up, so it tries
/// each in turn (the kernel refuses a misaligned split with EINVAL).
const HUGE_SIZES: [usize; 2] = [2 << 20, 1 << 30];

/// Per-thread state the handler reads and writes.
struct Section {
    /// Nesting depth of guarded sections (0: not guarded).
    depth: AtomicU32,
    /// Whether a fault was absorbed in the current section.
    faulted: AtomicBool,
    /// The first absorbed fault address of the current section.
    addr: AtomicU64,
    /// Pages replaced in the current outermost section.
    replaced: AtomicU32,
}

impl Section {
    const fn new() -> Section {
        Section {
            depth: AtomicU32::new(0),
            faulted: AtomicBool::new(false),
            addr: AtomicU64::new(0),
            replaced: AtomicU32::new(0),
        }
    }

    fn fault(&self) -> Option<u64> {
        self.faulted
            .load(Ordering::Relaxed)
            .then(|| self.addr.load(Ordering::Relaxed))
    }

    fn set_fault(&self, f: Option<u64>) {
        self.addr.store(f.unwrap_or(0), Ordering::Relaxed);
        self.faulted.store(f.is_some(), Ordering::Relaxed);
    }
}

thread_local! {
    static SECTION: Section = const { Section::new() };
}

/// The disposition found when the handler was installed, to pass faults on
/// to. Written once, before the handler exists.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();
/// Outcome of the one installation attempt (the errno on failure).
static INSTALLED: OnceLock<Result<(), i32>> = OnceLock::new();
/// The base page size, read before the handler exists.
static PAGE: AtomicUsize = AtomicUsize::new(4096);

/// Install the process-wide SIGBUS handler (once; later calls return the
/// first outcome). [`guarded`] does this itself; calling it up front turns
/// a failure into an error instead of an unprotected section.
pub fn install() -> Result<(), GuardError> {
    let r = INSTALLED.get_or_init(|| {
        PAGE.store(crate::page_size(), Ordering::Relaxed);
        let mut old = std::mem::MaybeUninit::<libc::sigaction>::zeroed();
        // SAFETY: queries the current disposition into a valid out-pointer.
        if unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), old.as_mut_ptr()) } != 0 {
            return Err(io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO));
        }
        // SAFETY: sigaction succeeded and filled `old`.
        let _ = PREVIOUS.set(unsafe { old.assume_init() });
        if !set_own_handler() {
            return Err(io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO));
        }
        Ok(())
    });
    r.map_err(|e| GuardError::Install(io::Error::from_raw_os_error(e)))
}

/// Make `on_sigbus` the SIGBUS handler (async-signal-safe: the handler
/// itself calls it); whether the kernel took it.
fn set_own_handler() -> bool {
    // SAFETY: a zeroed sigaction is a valid starting point (empty mask,
    // no flags); every field the kernel reads is set below.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = on_sigbus as *const () as libc::sighandler_t;
    act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
    // SAFETY: act.sa_mask is a valid sigset_t to initialise.
    unsafe { libc::sigemptyset(&mut act.sa_mask) };
    // SAFETY: installs a handler that is async-signal-safe (see the
    // module documentation) for a valid signal number.
    unsafe { libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut()) == 0 }
}

/// A guarded section of the current thread, from [`Guard::enter`] until
/// dropped. Sections nest: an inner section's fault is also the outer one's.
#[derive(Debug)]
pub struct Guard {
    /// The enclosing section's fault, restored when this one ends.
    outer: Option<Option<u64>>,
    /// The section belongs to the thread that entered it.
    _thread: PhantomData<Cell<*const ()>>,
}

impl Guard {
    /// Start a guarded section on this thread.
    pub fn enter() -> Guard {
        let _ = install();
        let outer = SECTION.with(|s| {
            let depth = s.depth.load(Ordering::Relaxed);
            let outer = (depth > 0).then(|| s.fault());
            if depth == 0 {
                s.replaced.store(0, Ordering::Relaxed);
            }
            s.set_fault(None);
            s.depth.store(depth + 1, Ordering::Relaxed);
            outer
        });
        // The handler runs on this thread: keep the compiler from moving
        // the section's memory accesses before it starts.
        compiler_fence(Ordering::SeqCst);
        Guard {
            outer,
            _thread: PhantomData,
        }
    }

    /// The first fault absorbed in this section so far.
    pub fn fault(&self) -> Option<u64> {
        compiler_fence(Ordering::SeqCst);
        SECTION.with(|s| s.fault())
    }

    /// The first fault absorbed since the section started or this was last
    /// called, and forget it: one section can then guard many requests (an
    /// engine's pass) and still tell which request met the fault, without
    /// entering a section per request. A fault taken here is the caller's:
    /// an enclosing section does not see it.
    pub fn take_fault(&self) -> Option<u64> {
        compiler_fence(Ordering::SeqCst);
        SECTION.with(|s| {
            let f = s.fault();
            if f.is_some() {
                s.set_fault(None);
            }
            f
        })
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        compiler_fence(Ordering::SeqCst);
        SECTION.with(|s| {
            let mine = s.fault();
            if let Some(outer) = self.outer {
                // The outer section's first fault came first.
                s.set_fault(outer.or(mine));
            }
            let depth = s.depth.load(Ordering::Relaxed);
            s.depth.store(depth.saturating_sub(1), Ordering::Relaxed);
        });
    }
}

/// Run `f` in a guarded section: a SIGBUS on memory it touches replaces the
/// faulting page with zeros instead of killing the process, and the first
/// fault address comes back with `f`'s result. See the module
/// documentation for what the caller must do then.
pub fn guarded<R>(f: impl FnOnce() -> R) -> (R, Option<u64>) {
    let g = Guard::enter();
    let r = f();
    let fault = g.fault();
    drop(g);
    (r, fault)
}

/// The SIGBUS handler.
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: __errno_location returns this thread's errno slot.
    let errno = unsafe { libc::__errno_location() };
    // SAFETY: errno is a valid pointer to this thread's int.
    let saved = unsafe { *errno };
    // Only a fault on a mapping (BUS_ADRERR: no page can back the address)
    // is absorbed; hardware memory errors and signals sent by a process
    // keep their old meaning.
    // SAFETY: the kernel passes a valid siginfo with SA_SIGINFO.
    let addr = (!info.is_null() && unsafe { (*info).si_code } == libc::BUS_ADRERR)
        // SAFETY: for BUS_ADRERR the siginfo carries the fault address.
        .then(|| unsafe { (*info).si_addr() } as u64);
    let absorbed = addr.is_some_and(|a| SECTION.try_with(|s| absorb(s, a)).unwrap_or(false));
    if !absorbed {
        pass_on(sig, info, ctx);
    }
    // SAFETY: as above.
    unsafe { *errno = saved };
}

/// Replace the page at `addr` if this thread is guarded; whether it was.
fn absorb(s: &Section, addr: u64) -> bool {
    if s.depth.load(Ordering::Relaxed) == 0 {
        return false;
    }
    let n = s.replaced.load(Ordering::Relaxed);
    if n >= MAX_REPLACED || !replace_page(addr as usize) {
        return false;
    }
    s.replaced.store(n + 1, Ordering::Relaxed);
    if !s.faulted.load(Ordering::Relaxed) {
        s.set_fault(Some(addr));
    }
    true
}

/// Map anonymous zero memory over the page holding `addr`, at the smallest
/// page size the mapping accepts.
fn replace_page(addr: usize) -> bool {
    let page = PAGE.load(Ordering::Relaxed);
    for size in std::iter::once(page).chain(HUGE_SIZES) {
        let base = addr & !(size - 1);
        // SAFETY: replaces the one page (of the mapping's own page size)
        // that faulted, inside a guarded section whose caller treats that
        // memory as gone; MAP_FIXED never reaches beyond `size` bytes, and a
        // size smaller than the mapping's pages is refused by the kernel
        // before anything changes.
        let p = unsafe {
            libc::mmap(
                base as *mut libc::c_void,
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            return true;
        }
        // SAFETY: this thread's errno slot.
        let e = unsafe { *libc::__errno_location() };
        // Only a misaligned split (EINVAL) means "try a larger page"; on
        // any other error a larger size could reach unrelated mappings.
        if e != libc::EINVAL {
            return false;
        }
    }
    false
}

/// Hand a SIGBUS that is not ours to the disposition found at install.
fn pass_on(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let prev = PREVIOUS.get();
    let handler = prev.map_or(libc::SIG_DFL, |p| p.sa_sigaction);
    // SAFETY: info is the kernel's siginfo (checked non-null first).
    let sent = info.is_null() || unsafe { (*info).si_code } <= 0;
    if handler != libc::SIG_DFL && handler != libc::SIG_IGN {
        let p = prev.expect("a handler implies a saved disposition");
        if p.sa_flags & libc::SA_SIGINFO != 0 {
            // SAFETY: the previous owner installed this address as an
            // SA_SIGINFO handler of this signature.
            let f = unsafe {
                std::mem::transmute::<
                    libc::sighandler_t,
                    extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void),
                >(handler)
            };
            f(sig, info, ctx);
        } else {
            // SAFETY: the previous owner installed this address as a plain
            // handler.
            let f = unsafe {
                std::mem::transmute::<libc::sighandler_t, extern "C" fn(libc::c_int)>(handler)
            };
            f(sig);
        }
        if sent {
            // A handler written for faults may give the signal back to its
            // default and return (the Rust runtime's does): a sent signal
            // does not come back, so the process lives on, and must keep
            // the guard.
            set_own_handler();
        }
        return;
    }
    if sent && handler == libc::SIG_IGN {
        // A signal sent by a process that was ignored before the guard:
        // ignored still, and the guard stays installed.
        return;
    }
    // SAFETY: a zeroed sigaction with SIG_DFL is the default disposition.
    let mut dfl: libc::sigaction = unsafe { std::mem::zeroed() };
    dfl.sa_sigaction = libc::SIG_DFL;
    let restore = prev.unwrap_or(&dfl);
    // SAFETY: restores a disposition that was valid when it was saved.
    unsafe { libc::sigaction(libc::SIGBUS, restore, std::ptr::null_mut()) };
    if sent {
        // A signal sent by a process does not come back by itself: send it
        // again, to be delivered with the old disposition once we return.
        // A fault does: the faulting instruction runs again.
        // SAFETY: plain system calls on this process and thread.
        unsafe {
            let tid = libc::syscall(libc::SYS_gettid);
            libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, sig);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pages::{memfd_create_sealable, MemfdPages};
    use crate::Mapping;
    use std::os::fd::{AsFd, AsRawFd};
    use wd_testutil::skip;

    /// Two pages mapped of a one-page memfd: the second raises SIGBUS.
    fn beyond_eof() -> (std::os::fd::OwnedFd, Mapping) {
        let fd = crate::memfd_create("guard-test", false).unwrap();
        crate::ftruncate(fd.as_fd(), 4096).unwrap();
        let map = Mapping::map_shared(fd.as_fd(), 0, 8192).unwrap();
        (fd, map)
    }

    #[test]
    fn guarded_fault_is_returned_not_fatal() {
        let (fd, map) = beyond_eof();
        let p = map.as_ptr();
        // SAFETY: p and p + 4096 + 8 are inside the live 8 KiB mapping.
        let (v, f) = guarded(|| unsafe {
            p.write_volatile(7);
            p.add(4096 + 8).read_volatile()
        });
        assert_eq!(v, 0, "the replaced page reads as zeros");
        assert_eq!(f, Some(p as u64 + 4096 + 8));
        // Writes fault the same way; the page is replaced already, so no fault.
        // SAFETY: inside the mapping.
        let (_, f) = guarded(|| unsafe { p.add(4096).write_volatile(1) });
        assert_eq!(f, None);
        // The first page is still the file's.
        let mut b = [0u8; 1];
        // SAFETY: reads one byte of the file into b.
        let n = unsafe { libc::pread(fd.as_fd().as_raw_fd(), b.as_mut_ptr().cast(), 1, 0) };
        assert_eq!((n, b[0]), (1, 7));
        // Nothing left behind for the next section.
        assert_eq!(guarded(|| 1), (1, None));
    }

    #[test]
    fn sections_nest() {
        let (_fd, map) = beyond_eof();
        let p = map.as_ptr();
        let outer = Guard::enter();
        // SAFETY: inside the mapping.
        let (_, inner) = guarded(|| unsafe { p.add(4096).read_volatile() });
        assert_eq!(inner, Some(p as u64 + 4096));
        assert_eq!(outer.fault(), Some(p as u64 + 4096));
    }

    #[test]
    fn one_section_tells_which_request_faulted() {
        let (_fd, map) = beyond_eof();
        let p = map.as_ptr();
        let g = Guard::enter();
        // SAFETY: inside the mapping (the first page is the file's).
        unsafe { p.write_volatile(1) };
        assert_eq!(g.take_fault(), None, "the first request met no fault");
        // SAFETY: inside the mapping, beyond the file's end.
        let _ = unsafe { p.add(4096 + 16).read_volatile() };
        assert_eq!(g.take_fault(), Some(p as u64 + 4096 + 16));
        // SAFETY: inside the mapping; the page was replaced already.
        let _ = unsafe { p.add(4096).read_volatile() };
        assert_eq!(g.take_fault(), None, "taken faults are forgotten");
    }

    #[test]
    fn hugetlb_fault_replaces_a_huge_page() {
        const TEST: &str = "wd_sys::guard::hugetlb_fault_replaces_a_huge_page";
        let Ok(fd) = memfd_create_sealable("guard-huge", MemfdPages::Huge2M) else {
            return skip(TEST, "hugetlb memfds unsupported here");
        };
        crate::ftruncate(fd.as_fd(), 2 << 20).unwrap();
        // Read-only and without reservation: needs no free huge page, and
        // the second huge page lies beyond the end of the file.
        // SAFETY: a fresh mapping chosen by the kernel.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4 << 20,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                fd.as_fd().as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return skip(
                TEST,
                &format!("cannot map a hugetlb memfd: {}", io::Error::last_os_error()),
            );
        }
        let p = p.cast::<u8>();
        // SAFETY: inside the 4 MiB mapping.
        let (v, f) = guarded(|| unsafe { p.add((2 << 20) + 100).read_volatile() });
        assert_eq!(v, 0);
        let f = f.expect("reading beyond the end of a hugetlb file faults");
        assert!((p as u64 + (2 << 20)..p as u64 + (4 << 20)).contains(&f));
        // The whole huge page was replaced (the kernel cannot split less).
        // SAFETY: inside the mapping, replaced by anonymous memory.
        assert_eq!(unsafe { p.add((4 << 20) - 1).read_volatile() }, 0);
        // SAFETY: unmaps the mapping made above.
        unsafe { libc::munmap(p.cast(), 4 << 20) };
    }

    #[test]
    fn unguarded_fault_is_still_fatal() {
        install().unwrap();
        let (_fd, map) = beyond_eof();
        let p = map.as_ptr();
        // SAFETY: the child only touches memory and exits (async-signal-safe
        // after fork in a threaded process).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: inside the mapping; the fault must kill the child.
            unsafe {
                let _ = p.add(4096).read_volatile();
                libc::_exit(0);
            }
        }
        let mut st = 0;
        // SAFETY: waits for the child just forked.
        let r = unsafe { libc::waitpid(pid, &mut st, 0) };
        assert_eq!(r, pid);
        assert!(
            libc::WIFSIGNALED(st) && libc::WTERMSIG(st) == libc::SIGBUS,
            "the child was not killed by SIGBUS (status {st:#x})"
        );
    }
}
