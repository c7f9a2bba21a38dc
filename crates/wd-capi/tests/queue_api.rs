//! The queue half of the C API called through the crate, as a C program
//! calls it (structures laid out as `include/wd.h` declares them): NULL
//! pointers are -EINVAL, forged or released handles -EBADF, out-parameters
//! are written only on success, every status has its own errno and text,
//! and the last error is per thread and always NUL-terminated.
//!
//! Panics inside the library become -EIO (`guard` in `src/lib.rs`), but no
//! entry point can be made to panic from outside, so that rule is not
//! tested here. `tests/c/test_wd.c` checks the same API from C.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void, CStr};
use std::ptr::{null, null_mut};
use std::sync::Once;

use wd::{WdCapa, WdCapaInfo, WdFault, WdQueue};
use wrapdrive::Status;

const EBADF: c_int = 9;
const ENODEV: c_int = 19;
const EINVAL: c_int = 22;
const EAGAIN: c_int = 11;
const EIO: c_int = 5;
const EOPNOTSUPP: c_int = 95;

/// `struct wd_capa`.
#[repr(C)]
struct Capa {
    alg: *const c_char,
    flags: u32,
    depth: u32,
    numa_node: i32,
    reserved: [u32; 3],
}

/// `struct wd_queue`.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Debug)]
struct CQueue {
    id: u32,
    depth: u32,
    flags: u32,
    device_api: u32,
    dev_name: [c_char; 32],
    alg: [c_char; 64],
    priv_: *mut c_void,
}

/// `struct wd_dummy_msg`.
#[repr(C)]
#[derive(Default)]
struct DummyMsg {
    opcode: u16,
    flags: u16,
    status: i32,
    src: u64,
    dst: u64,
    len: u64,
    result: u64,
}

const OP_COPY: u16 = 1;

fn capa(alg: &CStr) -> Capa {
    Capa {
        alg: alg.as_ptr(),
        flags: 0,
        depth: 0,
        numa_node: -1,
        reserved: [0; 3],
    }
}

/// A queue structure full of a pattern no call writes.
fn poisoned() -> CQueue {
    CQueue {
        id: 0xdead_beef,
        depth: 0xdead_beef,
        flags: 0xdead_beef,
        device_api: 0xdead_beef,
        dev_name: [0x5a; 32],
        alg: [0x5a; 64],
        priv_: 0x5a5a as *mut c_void,
    }
}

fn qp(q: &mut CQueue) -> *mut WdQueue {
    (q as *mut CQueue).cast()
}

fn cp(c: &mut Capa) -> *mut WdCapa {
    (c as *mut Capa).cast()
}

/// Every test of this binary talks to one host inside this process: the
/// default devices, and the asynchronous copy device (whose "memcpy-async"
/// queues speak the memcpy format).
fn embedded() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        std::env::set_var("WD_EMBEDDED_DEVICES", "dummy;dummy-async;sec;zip");
        assert_eq!(wd::wd_use_embedded_host(), 0)
    });
}

fn last_error() -> String {
    let mut buf = [0 as c_char; 256];
    // SAFETY: buf has room for 256 bytes.
    unsafe { wd::wd_last_error(buf.as_mut_ptr(), buf.len()) };
    // SAFETY: wd_last_error NUL-terminates within len.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

fn request(q: &mut CQueue) {
    embedded();
    let mut c = capa(c"memcpy");
    // SAFETY: both point to live structures laid out as wd.h declares.
    assert_eq!(unsafe { wd::wd_request_queue(qp(q), cp(&mut c)) }, 0);
}

#[test]
fn structures_have_the_header_layout() {
    use std::mem::size_of;
    assert_eq!(size_of::<CQueue>(), size_of::<WdQueue>());
    assert_eq!(size_of::<Capa>(), size_of::<WdCapa>());
    assert_eq!(size_of::<WdCapaInfo>(), 32 + 64 + 6 * 4);
    assert_eq!(size_of::<WdFault>(), 24);
}

#[test]
fn null_pointers_are_einval_and_say_which() {
    embedded();
    let mut q = poisoned();
    let mut c = capa(c"memcpy");
    // SAFETY: every call below: each pointer is NULL or points to a live
    // structure of the right layout, as the C contract requires.
    unsafe {
        assert_eq!(wd::wd_request_queue(null_mut(), cp(&mut c)), -EINVAL);
        assert!(last_error().contains("NULL"), "{}", last_error());
        assert_eq!(wd::wd_request_queue(qp(&mut q), null_mut()), -EINVAL);
        c.alg = null();
        assert_eq!(wd::wd_request_queue(qp(&mut q), cp(&mut c)), -EINVAL);
        assert!(last_error().contains("alg"), "{}", last_error());
        assert_eq!(q, poisoned(), "nothing written on failure");

        let mut msg = DummyMsg::default();
        let m = (&mut msg as *mut DummyMsg).cast::<c_void>();
        assert_eq!(wd::wd_send(null_mut(), m), -EINVAL);
        assert_eq!(wd::wd_send_sync(null_mut(), m), -EINVAL);
        let mut got: *mut c_void = null_mut();
        assert_eq!(wd::wd_rcv(null_mut(), &mut got), -EINVAL);
        assert_eq!(wd::wd_rcv_sync(null_mut(), &mut got), -EINVAL);
        assert_eq!(wd::wd_mem_share(null_mut(), m, 8, 0), -EINVAL);
        assert_eq!(wd::wd_mem_unshare2(null_mut(), m, 8), -EINVAL);
        assert_eq!(wd::wd_get_faults(null_mut(), null_mut(), 0), -EINVAL);
        wd::wd_release_queue(null_mut()); // harmless

        let mut out: *mut c_void = std::ptr::dangling_mut::<c_void>();
        assert_eq!(wd::wd_alloc(4096, -1, null_mut()), -EINVAL);
        assert_eq!(wd::wd_alloc(0, -1, &mut out), -EINVAL);
        assert_eq!(wd::wd_alloc(4096, -2, &mut out), -EINVAL);
        assert_eq!(
            out,
            std::ptr::dangling_mut::<c_void>(),
            "out-pointer untouched"
        );

        let mut count = 77usize;
        assert_eq!(wd::wd_list_capas(null_mut(), 0, null_mut()), -EINVAL);
        assert_eq!(wd::wd_list_capas(null_mut(), 4, &mut count), -EINVAL);
        assert_eq!(count, 77, "count untouched");
        // NULL out with max 0: only the count, the total (the embedded
        // host offers several queue types), so a caller can size its array.
        assert_eq!(wd::wd_list_capas(null_mut(), 0, &mut count), 0);
        assert!(count > 1, "{count}");
        let total = count;
        let mut two: [WdCapaInfo; 2] = std::mem::zeroed();
        assert_eq!(wd::wd_list_capas(two.as_mut_ptr(), 1, &mut count), 0);
        assert_eq!(count, total, "the total, not what was written");
        let bytes = |i: usize| {
            std::slice::from_raw_parts(
                two.as_ptr().add(i).cast::<u8>(),
                std::mem::size_of::<WdCapaInfo>(),
            )
        };
        assert!(bytes(0).iter().any(|&b| b != 0), "the first written");
        assert!(bytes(1).iter().all(|&b| b == 0), "only max written");
    }
}

#[test]
fn a_live_queue_refuses_null_arguments_and_keeps_working() {
    let mut q = poisoned();
    request(&mut q);
    // SAFETY: every call below: as the C contract requires.
    unsafe {
        assert_eq!(wd::wd_send(qp(&mut q), null_mut()), -EINVAL);
        assert_eq!(wd::wd_rcv(qp(&mut q), null_mut()), -EINVAL);
        assert_eq!(wd::wd_rcv_sync(qp(&mut q), null_mut()), -EINVAL);
        assert_eq!(wd::wd_mem_share(qp(&mut q), null(), 4096, 0), -EINVAL);
        assert_eq!(wd::wd_get_faults(qp(&mut q), null_mut(), 4), -EINVAL);
        // Nothing to receive: -EAGAIN, and the out-pointer keeps its value.
        let mut got = std::ptr::dangling_mut::<c_void>();
        assert_eq!(wd::wd_rcv(qp(&mut q), &mut got), -EAGAIN);
        assert_eq!(got, std::ptr::dangling_mut::<c_void>());

        // A copy through shared memory still works.
        let (mut src, mut dst): (*mut c_void, *mut c_void) = (null_mut(), null_mut());
        assert_eq!(wd::wd_alloc(4096, -1, &mut src), 0);
        assert_eq!(wd::wd_alloc(4096, -1, &mut dst), 0);
        std::ptr::write_bytes(src.cast::<u8>(), 0x6b, 4096);
        assert_eq!(wd::wd_mem_share(qp(&mut q), src, 4096, 0), 0);
        assert_eq!(wd::wd_mem_share(qp(&mut q), dst, 4096, 0), 0);
        let mut m = DummyMsg {
            opcode: OP_COPY,
            src: src as u64,
            dst: dst as u64,
            len: 4096,
            ..DummyMsg::default()
        };
        let mp = (&mut m as *mut DummyMsg).cast::<c_void>();
        assert_eq!(wd::wd_send_sync(qp(&mut q), mp), 0);
        assert_eq!(wd::wd_rcv_sync(qp(&mut q), &mut got), 0);
        assert_eq!(got, mp, "the request pointer comes back");
        assert_eq!((m.status, m.result), (0, 4096));
        assert_eq!(*dst.cast::<u8>().add(4095), 0x6b);
        wd::wd_release_queue(qp(&mut q));
        assert_eq!(wd::wd_free(src), 0);
        assert_eq!(wd::wd_free(dst), 0);
    }
}

#[test]
fn forged_and_released_handles_are_ebadf() {
    let mut q = poisoned();
    request(&mut q);
    let mut forged = q;
    forged.priv_ = 0x7fff_ffff as *mut c_void;
    let mut m = DummyMsg::default();
    let mp = (&mut m as *mut DummyMsg).cast::<c_void>();
    // SAFETY: every call below: as the C contract requires; priv is only
    // ever looked up, never followed.
    unsafe {
        assert_eq!(wd::wd_send(qp(&mut forged), mp), -EBADF);
        assert_eq!(wd::wd_release_queue(qp(&mut forged)), ());
        assert_eq!(wd::wd_send_sync(qp(&mut q), mp), 0, "the real one lives");
        let mut got = null_mut();
        assert_eq!(wd::wd_rcv_sync(qp(&mut q), &mut got), 0);
        wd::wd_release_queue(qp(&mut q));
        assert!(q.priv_.is_null(), "release clears priv");
        assert_eq!(wd::wd_send(qp(&mut q), mp), -EBADF);
        let mut f = [0u8; 24];
        assert_eq!(
            wd::wd_get_faults(qp(&mut q), f.as_mut_ptr().cast::<WdFault>(), 1),
            -EBADF
        );
        wd::wd_release_queue(qp(&mut q)); // twice is harmless
    }
}

#[test]
fn failed_requests_write_no_queue_and_name_the_cause() {
    embedded();
    let mut q = poisoned();
    let mut c = capa(c"sha999");
    // SAFETY: every call below: as the C contract requires.
    unsafe {
        assert_eq!(wd::wd_request_queue(qp(&mut q), cp(&mut c)), -ENODEV);
        assert!(last_error().contains("sha999"), "{}", last_error());
        assert_eq!(q, poisoned());
        let mut c = capa(c"memcpy");
        c.reserved[1] = 1;
        assert_eq!(wd::wd_request_queue(qp(&mut q), cp(&mut c)), -EINVAL);
        assert!(last_error().contains("reserved"), "{}", last_error());
        let mut c = capa(c"memcpy");
        c.depth = 3;
        assert_eq!(wd::wd_request_queue(qp(&mut q), cp(&mut c)), -EINVAL);
        assert_eq!(q, poisoned());
    }
}

/// Queue types that `wd_list_capas` shows but other libraries serve are
/// refused as unsupported here, naming the library to use, and write no
/// queue (before: -ENODEV, "no message format known").
#[test]
fn types_other_libraries_serve_are_eopnotsupp_and_name_the_library() {
    embedded();
    for (alg, lib) in [
        (c"cipher", "libwd_crypto (wd_crypto.h)"),
        (c"digest", "libwd_crypto (wd_crypto.h)"),
        (c"compress", "libwd_comp (wd_comp.h)"),
        (c"nvme", "wd_nvme.h"),
    ] {
        let mut q = poisoned();
        let mut c = capa(alg);
        // SAFETY: both point to live structures laid out as wd.h declares.
        let r = unsafe { wd::wd_request_queue(qp(&mut q), cp(&mut c)) };
        assert_eq!(r, -EOPNOTSUPP, "{alg:?}");
        let why = last_error();
        assert!(
            why.contains(lib) && why.contains("raw queues"),
            "{alg:?}: {why}"
        );
        assert_eq!(q, poisoned());
    }
    // Every type the host lists is either requestable or refused so, and
    // both copy devices' are requestable.
    let mut infos = [const { std::mem::MaybeUninit::<WdCapaInfo>::uninit() }; 32];
    let mut n = 0usize;
    // SAFETY: infos has room for 32 entries; n is writable.
    let r = unsafe { wd::wd_list_capas(infos.as_mut_ptr().cast(), infos.len(), &mut n) };
    assert_eq!(r, 0);
    assert!(n > 1 && n <= infos.len(), "{n}");
    let mut copies = 0;
    for i in &infos[..n] {
        // SAFETY: the first n entries were written; alg is at offset 32,
        // NUL-terminated (wd.h's struct wd_capa_info).
        let alg = unsafe { CStr::from_ptr(i.as_ptr().cast::<c_char>().add(32)) };
        let mut q = poisoned();
        let mut c = capa(alg);
        // SAFETY: both point to live structures laid out as wd.h declares.
        let r = unsafe { wd::wd_request_queue(qp(&mut q), cp(&mut c)) };
        assert!(r == 0 || r == -EOPNOTSUPP, "{alg:?}: {r} {}", last_error());
        if alg.to_bytes().starts_with(b"memcpy") {
            assert_eq!(r, 0, "{alg:?}: {}", last_error());
            copies += 1;
        }
        if r == 0 {
            // SAFETY: a live queue.
            unsafe { wd::wd_release_queue(qp(&mut q)) };
        }
    }
    assert_eq!(copies, 2, "memcpy and memcpy-async listed");
}

#[test]
fn every_status_has_its_own_errno_and_text() {
    let mut texts = std::collections::HashSet::new();
    for n in 0.. {
        let Some(s) = Status::from_u16(n) else { break };
        let e = s.errno();
        assert_eq!(Status::from_errno(e), s, "{s:?}");
        // Negative (as returned) or positive, the same text.
        let t = |e: c_int| {
            // SAFETY: wd_strerror returns a static NUL-terminated string.
            unsafe { CStr::from_ptr(wd::wd_strerror(e)) }
                .to_str()
                .unwrap()
                .to_string()
        };
        assert_eq!(t(-e), t(e));
        assert!(texts.insert(t(-e)), "{s:?} shares its text");
    }
    assert!(texts.len() > 10);
    // SAFETY: as above.
    let text = |e| unsafe { CStr::from_ptr(wd::wd_strerror(e)) };
    assert_eq!(text(0), c"success");
    assert_eq!(text(-EINVAL), c"invalid argument");
    // Unknown values read as unknown, not as nothing (nor as an I/O error
    // WrapDrive never reported).
    assert_eq!(text(-4242), c"unknown error");
    assert_ne!(text(-EIO), c"unknown error");
}

/// Every errno a header of the C libraries documents has a text that is
/// not "unknown error", and the texts of errnos several libraries share
/// hold for each (before: EBADMSG, corrupt compressed data in wd_comp.h,
/// read as a tag mismatch; ENOBUFS and EOVERFLOW were unknown).
#[test]
fn every_documented_errno_has_a_fitting_text() {
    const ERRNOS: &[(&str, c_int)] = &[
        ("EPERM", 1),
        ("ENOENT", 2),
        ("EIO", 5),
        ("EBADF", 9),
        ("EAGAIN", 11),
        ("ENOMEM", 12),
        ("EFAULT", 14),
        ("EBUSY", 16),
        ("ENODEV", 19),
        ("EINVAL", 22),
        ("EBADMSG", 74),
        ("EOVERFLOW", 75),
        ("EBADFD", 77),
        ("EMSGSIZE", 90),
        ("EOPNOTSUPP", 95),
        ("ECONNRESET", 104),
        ("ENOBUFS", 105),
        ("ENOTCONN", 107),
        ("EDQUOT", 122),
    ];
    let text = |e: c_int| {
        // SAFETY: wd_strerror returns a static NUL-terminated string.
        unsafe { CStr::from_ptr(wd::wd_strerror(e)) }
            .to_str()
            .unwrap()
    };
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../include");
    let mut seen = 0;
    for h in ["wd.h", "wd_crypto.h", "wd_comp.h", "wd_nvme.h"] {
        let src = std::fs::read_to_string(format!("{dir}/{h}")).unwrap();
        let names = src
            .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
            .filter(|w| {
                w.len() > 3 && w.starts_with('E') && w[1..].bytes().all(|b| b.is_ascii_uppercase())
            });
        for name in names {
            let Some(&(_, e)) = ERRNOS.iter().find(|(n, _)| *n == name) else {
                panic!("{h} documents {name}: add it to this table");
            };
            assert_ne!(text(-e), "unknown error", "{h}: {name}");
            seen += 1;
        }
    }
    assert!(seen > 20, "{seen}");
    let bad_msg = text(-74);
    assert!(
        bad_msg.contains("tag") && bad_msg.contains("corrupt"),
        "{bad_msg}"
    );
    assert!(text(-105).contains("too small"), "{}", text(-105));
    assert!(text(-75).contains("ratio"), "{}", text(-75));
    // EBADFD: crypto sessions are another thread's, not only queues.
    assert!(text(-77).contains("thread"), "{}", text(-77));
}

/// A NUMA node the machine does not have is -EINVAL naming it, the
/// out-pointer untouched (before, node 999 was silently ignored); node 0
/// exists on every machine that lists nodes, and -1 is any.
#[test]
fn wd_alloc_refuses_nodes_the_machine_lacks() {
    let poison = 0x5a5a as *mut c_void;
    let mut p = poison;
    if !std::path::Path::new("/sys/devices/system/node").is_dir() {
        // As wd-testutil's skip (not a dependency here): counted by
        // scripts/test-all.sh, never passed silently.
        let line = "queue_api::wd_alloc_refuses_nodes_the_machine_lacks: \
                    no /sys/devices/system/node (kernel without NUMA)\n";
        eprint!("skip: {line}");
        if let Some(path) = std::env::var_os("WD_SKIP_LOG") {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path);
            let _ = f.and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
        }
        return;
    }
    // SAFETY: p is a live void *.
    assert_eq!(unsafe { wd::wd_alloc(4096, 999, &mut p) }, -EINVAL);
    assert_eq!(p, poison);
    let why = last_error();
    assert!(why.contains("node 999"), "{why}");
    // SAFETY: as above.
    assert_eq!(unsafe { wd::wd_alloc(4096, -2, &mut p) }, -EINVAL);
    assert_eq!(p, poison);
    for node in [0, -1] {
        // SAFETY: as above.
        let r = unsafe { wd::wd_alloc(4096, node, &mut p) };
        assert_eq!(r, 0, "node {node}: {}", last_error());
        assert_ne!(p, poison);
        assert_eq!(wd::wd_free(p), 0);
        p = poison;
    }
}

#[test]
fn last_error_is_per_thread_truncated_and_terminated() {
    embedded();
    // SAFETY: NULL queue and capa pointers are what is being tested.
    let r = unsafe { wd::wd_request_queue(null_mut(), null_mut()) };
    assert_eq!(r, -EINVAL);
    let full = last_error();
    assert!(!full.is_empty());
    // The length is the whole message's, whatever the buffer.
    // SAFETY: NULL buffer with len 0 only asks for the length.
    let n = unsafe { wd::wd_last_error(null_mut(), 0) };
    assert_eq!(n as usize, full.len());
    let mut small = [0x41 as c_char; 8];
    // SAFETY: small has room for 8 bytes.
    let n2 = unsafe { wd::wd_last_error(small.as_mut_ptr(), small.len()) };
    assert_eq!(n2, n);
    assert_eq!(small[7], 0, "NUL-terminated within the buffer");
    // SAFETY: small is NUL-terminated.
    let cut = unsafe { CStr::from_ptr(small.as_ptr()) }.to_str().unwrap();
    assert_eq!(cut, &full[..7]);
    // Another thread has its own (empty) last error.
    let other = std::thread::spawn(last_error).join().unwrap();
    assert_eq!(other, "");
}
