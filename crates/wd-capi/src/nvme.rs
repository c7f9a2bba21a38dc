//! The C API of `include/wd_nvme.h`: a mediated NVMe controller driven
//! from C through `wd-nvme-driver`. Controllers and queue pairs are
//! handles looked up in tables (a stale or forged one is -EBADF), each
//! behind its own lock, so one thread per queue pair runs without
//! contention.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use wd_nvme_driver::msg::{Cqe, IoOp, Sqe, SQE_SIZE};
use wd_nvme_driver::{Controller, IoQueue, Namespace, NvmeError, Options};
use wrapdrive::{ClientError, Status};

use crate::{guard, host, invalid};

/// `struct wd_nvme_ns`.
#[repr(C)]
pub struct WdNvmeNs {
    nsid: u32,
    block_size: u32,
    blocks: u64,
}

/// `struct wd_nvme_cpl`.
#[repr(C)]
pub struct WdNvmeCpl {
    result: u32,
    sq_head: u16,
    sq_id: u16,
    cid: u16,
    /// Status code type << 8 | status code (0: success).
    status: u16,
    dnr: u8,
    reserved: [u8; 3],
}

/// The namespaces opened on a controller, as the controller described
/// them: what a read or write is checked against (the caller's `struct
/// wd_nvme_ns` is its word, and a smaller block size than the namespace's
/// would make the controller move more bytes than the PRPs' buffer holds).
type Opened = Arc<RwLock<HashMap<u32, Namespace>>>;

struct Ctrl {
    c: Mutex<Controller>,
    namespaces: Opened,
    /// The fork generation of the process that opened it.
    generation: u64,
}

struct Pair {
    /// The controller it belongs to (deleting it needs the admin queue).
    ctrl: u64,
    q: Mutex<Option<IoQueue>>,
    /// Its controller's.
    namespaces: Opened,
    /// The fork generation of the process that made it.
    generation: u64,
}

/// A handle's object, and the process it belongs to: a forked child
/// inherits the tables but not the register blocks (never mapped in a
/// child), and the queues' memory is the parent's, so a child must touch
/// nothing of them (a doorbell write faulted, and entries it wrote broke
/// the parent's next command).
trait Owned {
    fn generation(&self) -> u64;
}

impl Owned for Ctrl {
    fn generation(&self) -> u64 {
        self.generation
    }
}

impl Owned for Pair {
    fn generation(&self) -> u64 {
        self.generation
    }
}

fn forked(what: &str) -> ClientError {
    ClientError::new(
        Status::BadState,
        format!(
            "this {what} belongs to the parent process (made before a fork): a child opens its own"
        ),
    )
}

static CTRLS: RwLock<Option<HashMap<u64, Arc<Ctrl>>>> = RwLock::new(None);
static PAIRS: RwLock<Option<HashMap<u64, Arc<Pair>>>> = RwLock::new(None);
static NEXT: AtomicU64 = AtomicU64::new(1);

/// The driver's errors as the C API's: statuses are -EIO with the status
/// in `wd_last_error`, a full queue -EAGAIN.
fn client(e: NvmeError) -> ClientError {
    let status = match &e {
        NvmeError::Client(c) => return ClientError::new(c.status(), c.to_string()),
        NvmeError::Command { .. } | NvmeError::Fatal(_) | NvmeError::Protocol(_) => Status::Io,
        NvmeError::Timeout(_) => Status::Io,
        NvmeError::Unsupported(_) => Status::Unsupported,
        NvmeError::Invalid(_) => Status::Invalid,
        NvmeError::Full => Status::Again,
    };
    ClientError::new(status, e.to_string())
}

fn lookup<T: Owned>(
    table: &RwLock<Option<HashMap<u64, Arc<T>>>>,
    h: u64,
    what: &str,
) -> Result<Arc<T>, ClientError> {
    let v = table
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .and_then(|m| m.get(&h).cloned())
        .ok_or_else(|| ClientError::new(Status::BadHandle, format!("not a live {what} handle")))?;
    if v.generation() != wrapdrive::fork_generation() {
        return Err(forked(what));
    }
    Ok(v)
}

fn insert<T>(table: &RwLock<Option<HashMap<u64, Arc<T>>>>, v: T) -> u64 {
    let h = NEXT.fetch_add(1, Ordering::Relaxed);
    table
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(h, Arc::new(v));
    h
}

/// The namespace a read or write names: one opened on the queue pair's
/// controller, with the caller's description matching the controller's.
fn ns_of(ns: *const WdNvmeNs, opened: &Opened) -> Result<Namespace, ClientError> {
    if ns.is_null() {
        return Err(invalid("namespace pointer is NULL"));
    }
    // SAFETY: non-null and, per the header, a struct wd_nvme_ns.
    let n = unsafe { ns.read_unaligned() };
    let known = opened
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(&n.nsid)
        .copied()
        .ok_or_else(|| {
            invalid(&format!(
                "namespace {} was not opened on this queue pair's controller (wd_nvme_open_ns)",
                n.nsid
            ))
        })?;
    if n.block_size as u64 != known.block || n.blocks != known.blocks {
        return Err(invalid(&format!(
            "namespace {} has {} blocks of {} bytes, not {} of {} (the struct wd_nvme_ns is not wd_nvme_open_ns's)",
            n.nsid, known.blocks, known.block, n.blocks, n.block_size
        )));
    }
    Ok(known)
}

fn cpl_of(c: &Cqe) -> WdNvmeCpl {
    WdNvmeCpl {
        result: c.result,
        sq_head: c.sq_head,
        sq_id: c.sq_id,
        cid: c.cid,
        status: (c.status.sct as u16) << 8 | c.status.sc as u16,
        dnr: c.status.dnr as u8,
        reserved: [0; 3],
    }
}

/// Bring up a controller of the host (`WD_HOST`, or the embedded one).
///
/// # Safety
/// `out` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn wd_nvme_open(out: *mut u64) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(invalid("out pointer is NULL"));
        }
        let c = Controller::open(&host()?, &Options::default()).map_err(client)?;
        let h = insert(
            &CTRLS,
            Ctrl {
                c: Mutex::new(c),
                namespaces: Opened::default(),
                generation: wrapdrive::fork_generation(),
            },
        );
        // SAFETY: checked non-null; written only on success.
        unsafe { out.write_unaligned(h) };
        Ok(0)
    })
}

/// Shut a controller down and release it (its queue pairs go with it).
#[no_mangle]
pub extern "C" fn wd_nvme_close(ctrl: u64) -> c_int {
    guard(|| {
        let c = CTRLS
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
            .and_then(|m| m.remove(&ctrl))
            .ok_or_else(|| ClientError::new(Status::BadHandle, "not a live controller handle"))?;
        let pairs: Vec<Arc<Pair>> = {
            let mut t = PAIRS.write().unwrap_or_else(|e| e.into_inner());
            let m = t.get_or_insert_with(HashMap::new);
            let mine: Vec<u64> = m.keys().copied().filter(|h| m[h].ctrl == ctrl).collect();
            mine.iter().filter_map(|h| m.remove(h)).collect()
        };
        if c.generation != wrapdrive::fork_generation() {
            // The parent's: gone from this process's tables, untouched.
            std::mem::forget((c, pairs));
            return Err(forked("controller"));
        }
        // Shut down first: the commands in flight finish while their
        // queues' memory is still the pairs' (the driver keeps the memory
        // of pairs dropped undeleted until the controller goes anyway).
        let mut g = c.c.lock().unwrap_or_else(|e| e.into_inner());
        let r = g.shutdown().map_err(client);
        drop(g);
        drop(pairs);
        r.map(|()| 0)
    })
}

/// Identify data for `cns`/`nsid` into `data` (4096 bytes).
///
/// # Safety
/// `data` must be NULL or 4096 writable bytes.
#[no_mangle]
pub unsafe extern "C" fn wd_nvme_identify(
    ctrl: u64,
    cns: u8,
    nsid: u32,
    data: *mut c_void,
) -> c_int {
    guard(|| {
        if data.is_null() {
            return Err(invalid("data pointer is NULL"));
        }
        let c = lookup(&CTRLS, ctrl, "controller")?;
        let raw =
            c.c.lock()
                .unwrap_or_else(|e| e.into_inner())
                .identify(cns, nsid)
                .map_err(client)?;
        // SAFETY: checked non-null; 4096 bytes per the header.
        unsafe { std::ptr::copy_nonoverlapping(raw.as_ptr(), data.cast::<u8>(), raw.len()) };
        Ok(0)
    })
}

/// Run one raw admin command (64-byte entry; its command id is assigned
/// here) and wait; 0 when it completed, whatever its status (in `cpl`).
///
/// # Safety
/// `sqe` must be NULL or 64 readable bytes; `cpl` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn wd_nvme_admin(
    ctrl: u64,
    sqe: *const c_void,
    cpl: *mut WdNvmeCpl,
) -> c_int {
    guard(|| {
        if sqe.is_null() || cpl.is_null() {
            return Err(invalid("sqe or cpl pointer is NULL"));
        }
        let mut raw = [0u8; SQE_SIZE];
        // SAFETY: checked non-null; 64 bytes per the header.
        unsafe { std::ptr::copy_nonoverlapping(sqe.cast::<u8>(), raw.as_mut_ptr(), SQE_SIZE) };
        let c = lookup(&CTRLS, ctrl, "controller")?;
        let done =
            c.c.lock()
                .unwrap_or_else(|e| e.into_inner())
                .admin_raw(Sqe::from_bytes(&raw))
                .map_err(client)?;
        // SAFETY: checked non-null.
        unsafe { cpl.write_unaligned(cpl_of(&done)) };
        Ok(0)
    })
}

/// Attach namespace `nsid` to the controller (unless it is) and describe it.
///
/// # Safety
/// `ns` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn wd_nvme_open_ns(ctrl: u64, nsid: u32, ns: *mut WdNvmeNs) -> c_int {
    guard(|| {
        if ns.is_null() {
            return Err(invalid("ns pointer is NULL"));
        }
        let c = lookup(&CTRLS, ctrl, "controller")?;
        let n =
            c.c.lock()
                .unwrap_or_else(|e| e.into_inner())
                .open_namespace(nsid)
                .map_err(client)?;
        c.namespaces
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(n.nsid, n);
        let v = WdNvmeNs {
            nsid: n.nsid,
            block_size: n.block as u32,
            blocks: n.blocks,
        };
        // SAFETY: checked non-null.
        unsafe { ns.write_unaligned(v) };
        Ok(0)
    })
}

/// Share memory from `wd_alloc` with the controller (data buffers must be
/// shared before a command names them).
#[no_mangle]
pub extern "C" fn wd_nvme_share(ctrl: u64, addr: *mut c_void, len: usize) -> c_int {
    guard(|| {
        if addr.is_null() || len == 0 {
            return Err(invalid("NULL or empty range"));
        }
        let c = lookup(&CTRLS, ctrl, "controller")?;
        c.c.lock()
            .unwrap_or_else(|e| e.into_inner())
            .queue()
            .share(addr as u64, len as u64)?;
        Ok(0)
    })
}

/// Create an I/O queue pair of `entries` entries.
///
/// # Safety
/// `out` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn wd_nvme_qpair_create(ctrl: u64, entries: u32, out: *mut u64) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(invalid("out pointer is NULL"));
        }
        let c = lookup(&CTRLS, ctrl, "controller")?;
        let q =
            c.c.lock()
                .unwrap_or_else(|e| e.into_inner())
                .create_io_queue(entries)
                .map_err(client)?;
        let h = insert(
            &PAIRS,
            Pair {
                ctrl,
                q: Mutex::new(Some(q)),
                namespaces: c.namespaces.clone(),
                generation: wrapdrive::fork_generation(),
            },
        );
        // SAFETY: checked non-null; written only on success.
        unsafe { out.write_unaligned(h) };
        Ok(0)
    })
}

/// Delete an I/O queue pair.
#[no_mangle]
pub extern "C" fn wd_nvme_qpair_delete(qp: u64) -> c_int {
    guard(|| {
        let p = PAIRS
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
            .and_then(|m| m.remove(&qp))
            .ok_or_else(|| ClientError::new(Status::BadHandle, "not a live queue pair handle"))?;
        if p.generation != wrapdrive::fork_generation() {
            // The parent's: gone from this process's table, untouched.
            std::mem::forget(p);
            return Err(forked("queue pair"));
        }
        let q = p.q.lock().unwrap_or_else(|e| e.into_inner()).take();
        let c = lookup(&CTRLS, p.ctrl, "controller")?;
        if let Some(q) = q {
            c.c.lock()
                .unwrap_or_else(|e| e.into_inner())
                .delete_io_queue(q)
                .map_err(client)?;
        }
        Ok(0)
    })
}

fn with_pair<T>(
    qp: u64,
    f: impl FnOnce(&mut IoQueue, &Opened) -> Result<T, ClientError>,
) -> Result<T, ClientError> {
    let p = lookup(&PAIRS, qp, "queue pair")?;
    let mut g = p.q.lock().unwrap_or_else(|e| e.into_inner());
    let q = g
        .as_mut()
        .ok_or_else(|| ClientError::new(Status::BadHandle, "queue pair deleted"))?;
    f(q, &p.namespaces)
}

fn rw(
    qp: u64,
    ns: *const WdNvmeNs,
    write: bool,
    lba: u64,
    buf: *mut c_void,
    len: usize,
    wait: bool,
) -> Result<c_int, ClientError> {
    if buf.is_null() {
        return Err(invalid("buffer pointer is NULL"));
    }
    with_pair(qp, |q, opened| {
        let ns = ns_of(ns, opened)?;
        let op = if write { IoOp::Write } else { IoOp::Read };
        let cid = q
            .push_rw(op, &ns, lba, buf as u64, len as u64)
            .map_err(client)?;
        if let Err(e) = q.pair().ring() {
            // Not sent as far as the caller knows: never sent again.
            q.pair().give_up(cid);
            return Err(client(e));
        }
        if !wait {
            return Ok(cid as c_int);
        }
        // A failed wait gives the command up: its id comes back when its
        // completion arrives, or when the queue is made again (without
        // sending it again).
        let done = q.wait_for(cid).map_err(client)?;
        if !done.status.is_success() {
            return Err(ClientError::new(
                Status::Io,
                format!("{op:?} at block {lba}: {}", done.status),
            ));
        }
        Ok(0)
    })
}

/// Read `len` bytes at block `lba` into `buf` (shared memory) and wait.
#[no_mangle]
pub extern "C" fn wd_nvme_read(
    qp: u64,
    ns: *const WdNvmeNs,
    lba: u64,
    buf: *mut c_void,
    len: usize,
) -> c_int {
    guard(|| rw(qp, ns, false, lba, buf, len, true))
}

/// Write `len` bytes of `buf` (shared memory) at block `lba` and wait.
#[no_mangle]
pub extern "C" fn wd_nvme_write(
    qp: u64,
    ns: *const WdNvmeNs,
    lba: u64,
    buf: *mut c_void,
    len: usize,
) -> c_int {
    guard(|| rw(qp, ns, true, lba, buf, len, true))
}

/// Submit a read (`write` 0) or write without waiting; returns the
/// command id (>= 0), whose completion `wd_nvme_reap` reports.
#[no_mangle]
pub extern "C" fn wd_nvme_submit_rw(
    qp: u64,
    ns: *const WdNvmeNs,
    write: c_int,
    lba: u64,
    buf: *mut c_void,
    len: usize,
) -> c_int {
    guard(|| {
        let write = match write {
            0 => false,
            1 => true,
            w => {
                return Err(ClientError::new(
                    Status::Invalid,
                    format!("write is 0 or 1, not {w}"),
                ))
            }
        };
        rw(qp, ns, write, lba, buf, len, false)
    })
}

/// Write a raw submission entry (its command id is assigned) without
/// ringing the doorbell; returns the command id. `wd_nvme_ring` then tells
/// the controller about every entry written since the last ring.
///
/// # Safety
/// `sqe` must be NULL or 64 readable bytes.
#[no_mangle]
pub unsafe extern "C" fn wd_nvme_push(qp: u64, sqe: *const c_void) -> c_int {
    guard(|| {
        if sqe.is_null() {
            return Err(invalid("sqe pointer is NULL"));
        }
        let mut raw = [0u8; SQE_SIZE];
        // SAFETY: checked non-null; 64 bytes per the header.
        unsafe { std::ptr::copy_nonoverlapping(sqe.cast::<u8>(), raw.as_mut_ptr(), SQE_SIZE) };
        with_pair(qp, |q, _| {
            Ok(q.pair().push(Sqe::from_bytes(&raw)).map_err(client)? as c_int)
        })
    })
}

/// Ring the submission doorbell for what was pushed.
#[no_mangle]
pub extern "C" fn wd_nvme_ring(qp: u64) -> c_int {
    guard(|| with_pair(qp, |q, _| q.pair().ring().map(|_| 0).map_err(client)))
}

/// Copy up to `max` completions out (no waiting); returns how many.
///
/// # Safety
/// `out` must be NULL or `max` writable entries.
#[no_mangle]
pub unsafe extern "C" fn wd_nvme_reap(qp: u64, out: *mut WdNvmeCpl, max: u32) -> c_int {
    guard(|| {
        if out.is_null() || max == 0 || crate::array_wraps(out, max as usize) {
            return Err(invalid("NULL, empty or wrapping completion array"));
        }
        with_pair(qp, |q, _| {
            let got = q.take_ready(max as usize).map_err(client)?;
            for (i, c) in got.iter().enumerate() {
                // SAFETY: i < max entries, per the header.
                unsafe { out.add(i).write_unaligned(cpl_of(c)) };
            }
            Ok(got.len() as c_int)
        })
    })
}
