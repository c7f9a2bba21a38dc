//! libwd.so: the C API of `include/wd.h`.
//!
//! Every entry point checks its pointers, catches panics, returns a negative
//! errno on failure and writes out-parameters only on success. Queue handles
//! are ids looked up in a table, so a released or forged `priv` is -EBADF,
//! never a wild pointer.
#![allow(unsafe_code)]

mod nvme;

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use wd_dummy_msg::CopyMsg;
use wrapdrive::{Capability, ClientError, Desc, HostConn, LegacyPlanner, Queue, Status};

const EIO: c_int = 5;

/// `struct wd_capa`.
#[repr(C)]
pub struct WdCapa {
    alg: *const c_char,
    flags: u32,
    depth: u32,
    numa_node: i32,
    reserved: [u32; 3],
}

/// `struct wd_queue`.
#[repr(C)]
pub struct WdQueue {
    id: u32,
    depth: u32,
    flags: u32,
    device_api: u32,
    dev_name: [c_char; 32],
    alg: [c_char; 64],
    priv_: *mut c_void,
}

/// `struct wd_capa_info`.
#[repr(C)]
pub struct WdCapaInfo {
    dev_name: [c_char; 32],
    alg: [c_char; 64],
    flags: u32,
    available_instances: u32,
    device_api: u32,
    numa_zone_id: i32,
    priority: u32,
    reserved: u32,
}

/// `struct wd_fault`.
#[repr(C)]
pub struct WdFault {
    seq: u64,
    iova: u64,
    pasid: u32,
    write: u8,
    reason: u8,
    reserved: u16,
}

/// `struct wd_dummy_msg`.
#[repr(C)]
struct WdDummyMsg {
    opcode: u16,
    flags: u16,
    status: i32,
    src: u64,
    dst: u64,
    len: u64,
    result: u64,
}

/// The message family a queue speaks, chosen by its algorithm. This
/// library speaks only the dummy device's format (`struct wd_dummy_msg`);
/// the crypto formats are libwd_crypto.so's.
#[derive(Clone, Copy)]
enum Family {
    Dummy,
}

impl Family {
    /// How the family's requests travel through the socket (legacy queues).
    fn legacy_planner(self) -> LegacyPlanner {
        match self {
            Family::Dummy => wd_dummy_msg::legacy_plan,
        }
    }

    /// Which requests in flight may be sent again to a restarted host.
    fn redo_policy(self) -> fn(&wrapdrive::Desc) -> bool {
        match self {
            Family::Dummy => wd_dummy_msg::redo_safe,
        }
    }
}

struct Handle {
    q: Mutex<Queue>,
    family: Family,
}

static HANDLES: RwLock<Option<HashMap<u64, Arc<Handle>>>> = RwLock::new(None);
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(1);
static HOST: Mutex<Option<Arc<HostConn>>> = Mutex::new(None);
static EMBEDDED: AtomicBool = AtomicBool::new(false);

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Record this thread's last error. Not at all once the thread's locals
/// are gone: a call from a thread-key destructor runs after them (glibc),
/// and must still return its errno, never abort.
fn set_last(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    let _ = LAST_ERROR.try_with(|l| *l.borrow_mut() = c);
}

fn fail(errno: c_int, msg: &str) -> c_int {
    set_last(msg);
    -errno
}

/// Run an entry point: errors become negative errno, panics -EIO.
pub(crate) fn guard(f: impl FnOnce() -> Result<c_int, ClientError>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => fail(e.errno(), &e.to_string()),
        Err(_) => fail(EIO, "internal error in libwd (panic caught)"),
    }
}

pub(crate) fn invalid(msg: &str) -> ClientError {
    ClientError::new(Status::Invalid, msg)
}

/// Whether an array of `n` entries at `p` would wrap around the address
/// space, or be longer than any object can be (no array can be there:
/// -EINVAL, as a shared range that wraps).
pub(crate) fn array_wraps<T>(p: *const T, n: usize) -> bool {
    n.checked_mul(std::mem::size_of::<T>())
        .filter(|&b| b <= isize::MAX as usize)
        .and_then(|b| (p as usize).checked_add(b))
        .is_none()
}

pub(crate) fn host() -> Result<Arc<HostConn>, ClientError> {
    let mut g = HOST.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(h) = g.as_ref().filter(|h| !h.is_stale()) {
        return Ok(h.clone());
    }
    let h = if EMBEDDED.load(Ordering::Relaxed) {
        HostConn::embedded()?
    } else {
        HostConn::from_env()?
    };
    *g = Some(h.clone());
    Ok(h)
}

fn handle(q: *const WdQueue) -> Result<Arc<Handle>, ClientError> {
    if q.is_null() {
        return Err(invalid("queue pointer is NULL"));
    }
    // SAFETY: q is non-null and, per the ABI, points to a struct wd_queue;
    // only the priv field is read.
    let id = unsafe { std::ptr::addr_of!((*q).priv_).read_unaligned() } as u64;
    HANDLES
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .and_then(|m| m.get(&id).cloned())
        .ok_or_else(|| {
            ClientError::new(
                Status::BadHandle,
                "not a live queue (released, or never requested)",
            )
        })
}

fn copy_name(dst: &mut [c_char], s: &str) {
    dst.fill(0);
    let room = dst.len() - 1;
    for (d, b) in dst.iter_mut().zip(s.bytes().take(room)) {
        *d = b as c_char;
    }
}

/// Which library serves the queue types a host lists but this library's
/// raw queues cannot speak: `wd_list_capas` shows every type of the host,
/// so a caller that asks for one of them learns where to go instead.
fn served_elsewhere(alg: &str) -> Option<&'static str> {
    match alg {
        "cipher" | "digest" => Some("libwd_crypto (wd_crypto.h)"),
        "compress" => Some("libwd_comp (wd_comp.h)"),
        "nvme" => Some("libwd's NVMe calls (wd_nvme.h)"),
        _ => None,
    }
}

/// The refusal of an algorithm the raw queue API has no message format
/// for: -EOPNOTSUPP for a type another library serves, -ENODEV for one
/// nothing here knows.
fn not_a_raw_queue(alg: &str) -> ClientError {
    match served_elsewhere(alg) {
        Some(lib) => ClientError::new(
            Status::Unsupported,
            format!("'{alg}' is served through {lib}, not libwd's raw queues"),
        ),
        None => ClientError::new(
            Status::NoDevice,
            format!(
                "no device serves '{alg}' through libwd's raw queues (only \"memcpy\" and \"memcpy-async\")"
            ),
        ),
    }
}

/// Request a queue.
///
/// # Safety
/// Pointers must be NULL or valid as `include/wd.h` documents for this call.
#[no_mangle]
pub unsafe extern "C" fn wd_request_queue(q: *mut WdQueue, capa: *mut WdCapa) -> c_int {
    guard(|| {
        if q.is_null() || capa.is_null() {
            return Err(invalid("wd_request_queue: NULL queue or capability"));
        }
        // SAFETY: capa is non-null and points to a caller-owned struct wd_capa.
        let c = unsafe { std::ptr::read_unaligned(capa) };
        if c.alg.is_null() {
            return Err(invalid("wd_capa.alg is NULL"));
        }
        if c.reserved != [0; 3] {
            return Err(invalid("wd_capa.reserved must be zero"));
        }
        // SAFETY: alg is a non-null NUL-terminated string per the ABI.
        let alg = unsafe { CStr::from_ptr(c.alg) }
            .to_str()
            .map_err(|_| invalid("wd_capa.alg is not UTF-8"))?;
        let family = match alg {
            // (The asynchronous copy device speaks the same format.)
            "memcpy" | "memcpy-async" => Family::Dummy,
            other => return Err(not_a_raw_queue(other)),
        };
        let capa = Capability {
            alg: alg.to_string(),
            flags: c.flags,
            depth: c.depth,
            numa_node: c.numa_node,
        };
        let mut queue = host()?.request_queue(&capa)?;
        queue.set_legacy_planner(family.legacy_planner());
        queue.set_redo_policy(family.redo_policy());
        let mut out = WdQueue {
            id: queue.id(),
            depth: queue.depth(),
            flags: queue.flags(),
            device_api: queue.device_api(),
            dev_name: [0; 32],
            alg: [0; 64],
            priv_: std::ptr::null_mut(),
        };
        copy_name(&mut out.dev_name, queue.device());
        copy_name(&mut out.alg, queue.alg());
        let id = NEXT_HANDLE.fetch_add(1, Ordering::Relaxed);
        out.priv_ = id as *mut c_void;
        HANDLES
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(HashMap::new)
            .insert(
                id,
                Arc::new(Handle {
                    q: Mutex::new(queue),
                    family,
                }),
            );
        // SAFETY: q is non-null and points to caller-owned writable memory.
        unsafe { std::ptr::write_unaligned(q, out) };
        Ok(0)
    })
}

/// Release a queue.
///
/// # Safety
/// Pointers must be NULL or valid as `include/wd.h` documents for this call.
#[no_mangle]
pub unsafe extern "C" fn wd_release_queue(q: *mut WdQueue) {
    guard(|| {
        let h = handle(q)?;
        // SAFETY: handle() checked q is non-null.
        let id = unsafe { std::ptr::addr_of!((*q).priv_).read_unaligned() } as u64;
        HANDLES
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
            .and_then(|m| m.remove(&id));
        // SAFETY: q is non-null and writable.
        unsafe { std::ptr::addr_of_mut!((*q).priv_).write_unaligned(std::ptr::null_mut()) };
        drop(h);
        Ok(0)
    });
}

fn to_desc(family: Family, req: *mut c_void) -> Result<Desc, ClientError> {
    if req.is_null() {
        return Err(invalid("request pointer is NULL"));
    }
    match family {
        Family::Dummy => {
            // SAFETY: req is non-null and points to a struct wd_dummy_msg
            // owned by the caller (ABI rule).
            let m = unsafe { std::ptr::read_unaligned(req as *const WdDummyMsg) };
            let mut d = CopyMsg {
                src: m.src,
                dst: m.dst,
                len: m.len,
            }
            .to_desc(0);
            d.opcode = m.opcode;
            d.flags = m.flags;
            Ok(d)
        }
    }
}

fn complete(family: Family, cookie: u64, d: &Desc) -> *mut c_void {
    let p = cookie as *mut c_void;
    match family {
        Family::Dummy => {
            let m = p as *mut WdDummyMsg;
            // SAFETY: cookie is the request pointer given to wd_send, which
            // the caller keeps valid until wd_rcv returns it (ABI rule).
            unsafe {
                std::ptr::addr_of_mut!((*m).status).write_unaligned(d.status);
                std::ptr::addr_of_mut!((*m).result).write_unaligned(d.result);
            }
        }
    }
    p
}

fn send(q: *mut WdQueue, req: *mut c_void, sync: bool) -> c_int {
    guard(|| {
        let h = handle(q)?;
        let d = to_desc(h.family, req)?;
        let mut queue = h.q.lock().unwrap_or_else(|e| e.into_inner());
        if sync {
            queue.send_sync(d, req as u64)?;
        } else {
            queue.send(d, req as u64)?;
        }
        Ok(0)
    })
}

fn rcv(q: *mut WdQueue, out: *mut *mut c_void, sync: bool) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(invalid("wd_rcv: NULL out-pointer"));
        }
        let h = handle(q)?;
        let mut queue = h.q.lock().unwrap_or_else(|e| e.into_inner());
        let c = if sync {
            queue.recv_sync(None)?
        } else {
            queue
                .recv()?
                .ok_or_else(|| ClientError::new(Status::Again, "no completion ready"))?
        };
        let p = complete(h.family, c.cookie, &c.desc);
        // SAFETY: out is non-null and points to a caller-owned void *.
        unsafe { out.write_unaligned(p) };
        Ok(0)
    })
}

/// Largest batch one call moves (bounds the stack arrays below).
const BATCH_MAX: usize = 64;

fn send_batch(q: *mut WdQueue, reqs: *const *mut c_void, n: usize) -> c_int {
    guard(|| {
        if reqs.is_null() || array_wraps(reqs, n) {
            return Err(invalid(
                "wd_send_batch: NULL request array, or one that wraps",
            ));
        }
        let h = handle(q)?;
        let mut queue = h.q.lock().unwrap_or_else(|e| e.into_inner());
        let mut batch = [(Desc::default(), 0u64); BATCH_MAX];
        let mut sent = 0usize;
        let mut bad = None;
        while sent < n && bad.is_none() {
            let mut k = (n - sent).min(BATCH_MAX);
            for (i, slot) in batch.iter_mut().enumerate().take(k) {
                // SAFETY: reqs is non-null and points to n request pointers
                // (ABI rule); sent + i < n.
                let req = unsafe { reqs.add(sent + i).read_unaligned() };
                match to_desc(h.family, req) {
                    Ok(d) => *slot = (d, req as u64),
                    Err(e) => {
                        // The requests before it still go.
                        bad = Some(e);
                        k = i;
                        break;
                    }
                }
            }
            // Requests queued by an earlier chunk are in flight: a later
            // failure must still report them, or the caller would free
            // requests the device will complete.
            let took = match queue.send_batch(&batch[..k]) {
                Ok(t) => t,
                Err(_) if sent > 0 => break,
                Err(e) => return Err(e),
            };
            sent += took;
            if took < k {
                break;
            }
        }
        if let (0, Some(e)) = (sent, bad) {
            return Err(e);
        }
        if sent == 0 && n > 0 {
            return Err(ClientError::new(
                Status::Again,
                "queue full: receive completions first",
            ));
        }
        Ok(sent as c_int)
    })
}

fn rcv_batch(q: *mut WdQueue, out: *mut *mut c_void, max: usize) -> c_int {
    guard(|| {
        if out.is_null() || array_wraps(out, max) {
            return Err(invalid("wd_rcv_batch: NULL out-array, or one that wraps"));
        }
        let h = handle(q)?;
        let mut queue = h.q.lock().unwrap_or_else(|e| e.into_inner());
        let mut done = Vec::with_capacity(max.min(BATCH_MAX));
        let mut got = 0usize;
        while got < max {
            done.clear();
            let want = (max - got).min(BATCH_MAX);
            // Completions already written to `out` are off the ring: a
            // later failure must still hand them over.
            let k = match queue.recv_batch(&mut done, want) {
                Ok(k) => k,
                Err(_) if got > 0 => break,
                Err(e) => return Err(e),
            };
            for (i, c) in done.iter().enumerate() {
                let p = complete(h.family, c.cookie, &c.desc);
                // SAFETY: out is non-null and has room for max pointers
                // (ABI rule); got + i < max.
                unsafe { out.add(got + i).write_unaligned(p) };
            }
            got += k;
            if k < want {
                break;
            }
        }
        if got == 0 && max > 0 {
            return Err(ClientError::new(Status::Again, "no completion ready"));
        }
        Ok(got as c_int)
    })
}

/// Queue up to `n` requests at once.
///
/// # Safety
/// Pointers must be NULL or valid as `include/wd.h` documents for this call.
#[no_mangle]
pub unsafe extern "C" fn wd_send_batch(
    q: *mut WdQueue,
    reqs: *const *mut c_void,
    n: usize,
) -> c_int {
    send_batch(q, reqs, n.min(c_int::MAX as usize))
}

/// Take up to `max` completions at once.
///
/// # Safety
/// Pointers must be NULL or valid as `include/wd.h` documents for this call.
#[no_mangle]
pub unsafe extern "C" fn wd_rcv_batch(
    q: *mut WdQueue,
    reqs: *mut *mut c_void,
    max: usize,
) -> c_int {
    rcv_batch(q, reqs, max.min(c_int::MAX as usize))
}

/// Queue a request.
///
/// # Safety
/// Pointers must be NULL or valid as `include/wd.h` documents for this call.
#[no_mangle]
pub unsafe extern "C" fn wd_send(q: *mut WdQueue, req: *mut c_void) -> c_int {
    send(q, req, false)
}

/// Queue a request, waiting for room.
///
/// # Safety
/// Pointers must be NULL or valid as `include/wd.h` documents for this call.
#[no_mangle]
pub unsafe extern "C" fn wd_send_sync(q: *mut WdQueue, req: *mut c_void) -> c_int {
    send(q, req, true)
}

/// Take a completion.
///
/// # Safety
/// Pointers must be NULL or valid as `include/wd.h` documents for this call.
#[no_mangle]
pub unsafe extern "C" fn wd_rcv(q: *mut WdQueue, req: *mut *mut c_void) -> c_int {
    rcv(q, req, false)
}

/// Wait for a completion.
///
/// # Safety
/// Pointers must be NULL or valid as `include/wd.h` documents for this call.
#[no_mangle]
pub unsafe extern "C" fn wd_rcv_sync(q: *mut WdQueue, req: *mut *mut c_void) -> c_int {
    rcv(q, req, true)
}

/// Share allocator memory with a queue.
///
/// # Safety
/// Pointers must be NULL or valid as `include/wd.h` documents for this call.
#[no_mangle]
pub unsafe extern "C" fn wd_mem_share(
    q: *mut WdQueue,
    addr: *const c_void,
    size: usize,
    flags: c_int,
) -> c_int {
    guard(|| {
        if addr.is_null() || size == 0 || flags != 0 {
            return Err(invalid(
                "wd_mem_share: NULL address, zero size or non-zero flags",
            ));
        }
        let h = handle(q)?;
        h.q.lock()
            .unwrap_or_else(|e| e.into_inner())
            .share(addr as u64, size as u64)?;
        Ok(0)
    })
}

/// Undo a share; a refusal (say, a range that is not exactly one shared
/// range) sets errno, since the 0.1 signature returns nothing.
///
/// # Safety
/// Pointers must be NULL or valid as `include/wd.h` documents for this call.
#[no_mangle]
pub unsafe extern "C" fn wd_mem_unshare(q: *mut WdQueue, addr: *const c_void, size: usize) {
    // SAFETY: the caller's contract is wd_mem_unshare2's.
    let r = unsafe { wd_mem_unshare2(q, addr, size) };
    if r < 0 {
        wd_sys::set_errno(-r);
    }
}

/// Undo a share and say whether it was undone.
///
/// # Safety
/// Pointers must be NULL or valid as `include/wd.h` documents for this call.
#[no_mangle]
pub unsafe extern "C" fn wd_mem_unshare2(
    q: *mut WdQueue,
    addr: *const c_void,
    size: usize,
) -> c_int {
    guard(|| {
        let h = handle(q)?;
        h.q.lock()
            .unwrap_or_else(|e| e.into_inner())
            .unshare(addr as u64, size as u64)?;
        Ok(0)
    })
}

/// Where the kernel lists the NUMA nodes the machine has (`node<N>`).
const NODE_DIR: &str = "/sys/devices/system/node";

/// Whether NUMA node `n` may exist. Binding an arena to a node is advice
/// (a node that cannot be bound still gets memory), so a node that is not
/// on the machine would be silently ignored: that is a caller's mistake
/// worth an error. Without the directory (a kernel without NUMA, no
/// /sys) nothing can be told, and every node is taken as advice.
fn numa_node_may_exist(n: u32) -> bool {
    let dir = std::path::Path::new(NODE_DIR);
    !dir.is_dir() || dir.join(format!("node{n}")).is_dir()
}

/// Allocate shareable memory.
///
/// # Safety
/// Pointers must be NULL or valid as `include/wd.h` documents for this call.
#[no_mangle]
pub unsafe extern "C" fn wd_alloc(size: usize, numa_node: c_int, out: *mut *mut c_void) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(invalid("wd_alloc: NULL out-pointer"));
        }
        if size == 0 {
            return Err(invalid("wd_alloc: zero size"));
        }
        if numa_node < -1 {
            return Err(invalid(&format!(
                "wd_alloc: numa_node {numa_node} is neither a node nor -1 (any)"
            )));
        }
        let node = (numa_node >= 0).then_some(numa_node as u32);
        if let Some(n) = node.filter(|&n| !numa_node_may_exist(n)) {
            return Err(invalid(&format!(
                "wd_alloc: NUMA node {n} does not exist on this machine (see {NODE_DIR})"
            )));
        }
        let a = wrapdrive::alloc(size, node)?;
        // SAFETY: a..a+size is the allocation just made, mapped until
        // wd_free; out is non-null and points to a caller-owned void *.
        unsafe {
            let mem = wd_sys::devmem::DeviceSlice::from_host_addr(a, size);
            out.write_unaligned(mem.as_ptr().cast::<c_void>())
        };
        Ok(0)
    })
}

/// Free shareable memory.
#[no_mangle]
pub extern "C" fn wd_free(addr: *mut c_void) -> c_int {
    guard(|| {
        wrapdrive::free(addr as u64)?;
        Ok(0)
    })
}

/// List queue types.
///
/// # Safety
/// Pointers must be NULL or valid as `include/wd.h` documents for this call.
#[no_mangle]
pub unsafe extern "C" fn wd_list_capas(
    out: *mut WdCapaInfo,
    max: usize,
    count: *mut usize,
) -> c_int {
    guard(|| {
        if count.is_null() || (out.is_null() && max > 0) || array_wraps(out, max) {
            return Err(invalid(
                "wd_list_capas: NULL count, or NULL out with max > 0, or an out-array that wraps",
            ));
        }
        let attrs = host()?.attrs("dev")?;
        let get = |p: &str| {
            attrs
                .iter()
                .find(|e| e.path == p)
                .map(|e| e.value.clone())
                .unwrap_or_default()
        };
        let mut infos = Vec::new();
        for e in attrs.iter().filter(|e| e.path.ends_with("/device_api")) {
            let parts: Vec<&str> = e.path.split('/').collect();
            if parts.len() != 4 || parts[1] != "mdev_supported_types" {
                continue;
            }
            let base = &e.path[..e.path.len() - "/device_api".len()];
            let dev = parts[0];
            let mut i = WdCapaInfo {
                dev_name: [0; 32],
                alg: [0; 64],
                flags: u32::from_str_radix(
                    get(&format!("{base}/flags")).trim_start_matches("0x"),
                    16,
                )
                .unwrap_or(0),
                available_instances: get(&format!("{base}/available_instances"))
                    .parse()
                    .unwrap_or(0),
                device_api: e.value.parse().unwrap_or(0),
                numa_zone_id: get(&format!("{dev}/numa_zone_id")).parse().unwrap_or(0),
                priority: get(&format!("{dev}/priority")).parse().unwrap_or(0),
                reserved: 0,
            };
            copy_name(&mut i.dev_name, dev);
            copy_name(&mut i.alg, &get(&format!("{base}/name")));
            infos.push(i);
        }
        let total = infos.len();
        for (k, i) in infos.into_iter().take(max).enumerate() {
            // SAFETY: out has room for max entries (caller contract); k < max.
            unsafe { out.add(k).write_unaligned(i) };
        }
        // The total, not what fits: `wd_list_capas(NULL, 0, &n)` sizes the
        // array of the next call. SAFETY: count is non-null.
        unsafe { count.write_unaligned(total) };
        Ok(0)
    })
}

/// Read fault records.
///
/// # Safety
/// Pointers must be NULL or valid as `include/wd.h` documents for this call.
#[no_mangle]
pub unsafe extern "C" fn wd_get_faults(q: *mut WdQueue, out: *mut WdFault, max: usize) -> c_int {
    guard(|| {
        if (out.is_null() && max > 0) || array_wraps(out, max) {
            return Err(invalid(
                "wd_get_faults: NULL out with max > 0, or an out-array that wraps",
            ));
        }
        let h = handle(q)?;
        let r =
            h.q.lock()
                .unwrap_or_else(|e| e.into_inner())
                .faults(max.min(u32::MAX as usize) as u32)?;
        // At most `max`, whatever the host answered: out has room for no more.
        let n = r.events.len().min(max);
        for (k, e) in r.events.iter().take(n).enumerate() {
            let f = WdFault {
                seq: e.seq,
                iova: e.iova,
                pasid: e.pasid,
                write: e.access.into(),
                reason: e.reason.into(),
                reserved: 0,
            };
            // SAFETY: k < n <= max; out has room for max.
            unsafe { out.add(k).write_unaligned(f) };
        }
        Ok(n as c_int)
    })
}

/// Static text of an errno. One table serves every library that records
/// its errors through libwd (libwd_crypto, libwd_comp), so each text must
/// hold for all of them: EBADMSG is a wrong AEAD tag and corrupt
/// compressed data alike. Errnos that are no host status (the
/// compression library's own) are named first.
#[no_mangle]
pub extern "C" fn wd_strerror(err: c_int) -> *const c_char {
    let own: Option<&'static CStr> = match err.unsigned_abs() {
        105 => Some(c"output buffer too small for the result"), // ENOBUFS
        75 => Some(c"output beyond the allowed expansion ratio"), // EOVERFLOW
        125 => Some(c"cancelled: the queue was torn down before the request ran"), // ECANCELED
        _ => None,
    };
    if let Some(s) = own {
        return s.as_ptr();
    }
    let Some(status) = Status::from_known_errno(err) else {
        return c"unknown error".as_ptr();
    };
    let s: &'static CStr = match status {
        _ if err == 0 => c"success",
        // STATUS_RESTARTED, a completion's status: the host is back.
        _ if err.unsigned_abs() == 104 => {
            c"the host restarted while the request was in flight, and it was not run again (see the queue's redo policy)"
        }
        Status::Ok => c"success",
        Status::Invalid => c"invalid argument",
        Status::NoDevice => c"no device serves this algorithm",
        Status::Busy => c"device busy: no free queue",
        Status::NoMemory => c"out of memory or over a limit",
        Status::Permission => c"not permitted",
        Status::NotFound => c"no such queue, range or attribute",
        Status::Fault => c"address not reachable by the device",
        Status::Protocol => c"protocol error between library and host",
        Status::Unsupported => c"not supported here",
        Status::TooBig => c"request too large",
        Status::BadState => {
            c"unusable in its state: released, corrupt, from the parent of a fork, or another thread's"
        }
        Status::Io => c"input/output error",
        Status::Version => c"host speaks another protocol version",
        Status::HostGone => c"WrapDrive host not reachable",
        Status::Again => c"try again: queue full or nothing ready",
        Status::BadHandle => c"not a live queue handle",
        Status::AuthFailed => c"bad message: authentication tag mismatch or corrupt data",
        Status::Quota => c"over a per-user limit of the host (see docs/security.md)",
        Status::TooManyFiles => c"host out of file descriptors: try again later",
    };
    s.as_ptr()
}

/// This thread's last error message.
///
/// # Safety
/// Pointers must be NULL or valid as `include/wd.h` documents for this call.
#[no_mangle]
pub unsafe extern "C" fn wd_last_error(buf: *mut c_char, len: usize) -> c_int {
    let copy = |bytes: &[u8]| {
        if !buf.is_null() && len > 0 {
            let n = bytes.len().min(len - 1);
            // SAFETY: buf has room for len bytes (caller contract); n < len.
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr().cast(), buf, n);
                buf.add(n).write(0);
            }
        }
        bytes.len() as c_int
    };
    // With the thread's locals gone (a thread-key destructor), no message.
    catch_unwind(AssertUnwindSafe(|| {
        LAST_ERROR
            .try_with(|l| copy(l.borrow().as_bytes()))
            .unwrap_or_else(|_| copy(b""))
    }))
    .unwrap_or(0)
}

/// Not API (a private version node): libwd_crypto.so records its error
/// messages here, so one `wd_last_error` serves both libraries.
///
/// # Safety
/// `msg` must be NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn wd__set_last_error(msg: *const c_char) {
    if msg.is_null() {
        return;
    }
    // SAFETY: msg is non-null and NUL-terminated (caller contract).
    let m = unsafe { CStr::from_ptr(msg) };
    let _ = catch_unwind(AssertUnwindSafe(|| {
        LAST_ERROR.try_with(|l| *l.borrow_mut() = m.to_owned())
    }));
}

/// Not API (version node `WD_PRIVATE`): which arena of `wd_alloc`'s
/// allocator holds `[addr, addr+len)`: its base, size and memfd (never
/// closed), so libwd_crypto.so, which links its own copy of the client
/// library, can let the device work in place in a caller's `wd_alloc`
/// buffers. Returns 0, or -ENOENT (nothing written) when the range is not
/// inside one arena, -EINVAL for a NULL out-pointer.
///
/// # Safety
/// `base`, `size` and `fd` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn wd__arena_of(
    addr: u64,
    len: u64,
    base: *mut u64,
    size: *mut u64,
    fd: *mut c_int,
) -> c_int {
    if base.is_null() || size.is_null() || fd.is_null() {
        return -Status::Invalid.errno();
    }
    let found = std::panic::catch_unwind(|| wrapdrive::own_arena_of(addr, len));
    let Ok(Some(a)) = found else {
        return -Status::NotFound.errno();
    };
    // SAFETY: the three pointers are non-null and writable (caller contract).
    unsafe {
        base.write_unaligned(a.base);
        size.write_unaligned(a.size);
        fd.write_unaligned(a.fd);
    }
    0
}

/// Switch this process to an in-process host (from libwd_embedded.so,
/// loaded now if no host is linked in). The switch happens only once that
/// host answers: a failed one (no libwd_embedded.so) leaves the process
/// with the host it had, rather than stuck asking for one it cannot get.
#[no_mangle]
pub extern "C" fn wd_use_embedded_host() -> c_int {
    guard(|| {
        let mut g = HOST.lock().unwrap_or_else(|e| e.into_inner());
        let h = HostConn::embedded()?;
        EMBEDDED.store(true, Ordering::Relaxed);
        *g = Some(h);
        Ok(0)
    })
}
