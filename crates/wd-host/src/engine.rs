//! Engine threads: poll the rings of their queues, process requests through
//! the device driver, post completions, and sleep when idle.
#![allow(unsafe_code)]

use std::os::fd::{AsFd, OwnedFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use wd_device::{status, DeviceQueue, Dma};
use wd_iommu::{Access, Domain, Fault, FaultReason};
use wd_ring::{Desc, HostState, RingView};

use crate::queue::{MemModel, Queue, QueueState};

/// Bytes of work after which a request's completion is posted at once.
const POST_AT_ONCE: u64 = 2048;
/// Requests taken from one ring per pass (fairness between queues).
const BATCH: usize = 32;
/// Idle passes between two reads of the clock.
const IDLE_CLOCK_EVERY: u32 = 64;
/// Longest an idle engine sleeps before it looks at its commands again.
const SLEEP_TIMEOUT: Duration = Duration::from_millis(500);

/// Commands to an engine thread.
pub enum EngineCmd {
    /// Start serving a queue through this (host-side) ring view, with the
    /// device's side of the queue.
    Attach(Arc<Queue>, RingView, Box<dyn DeviceQueue>),
    /// Stop serving a queue: fail what is left, mark the ring stopped, ack.
    Detach(u32, mpsc::Sender<()>),
    /// Exit the thread.
    Stop,
}

/// Handle to a running engine thread.
pub struct EngineHandle {
    tx: mpsc::Sender<EngineCmd>,
    /// Doorbell the engine sleeps on; clients get a copy.
    pub doorbell: Arc<OwnedFd>,
    /// Queues attached (for placement).
    pub load: Arc<AtomicUsize>,
    /// Whether the engine is asleep (for `wd ls` and tests).
    pub sleeping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EngineHandle {
    /// Start an engine thread for a device.
    pub fn spawn(name: String, idle_spin: Duration) -> std::io::Result<EngineHandle> {
        let (tx, rx) = mpsc::channel();
        let doorbell =
            Arc::new(wd_sys::eventfd().map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?);
        let load = Arc::new(AtomicUsize::new(0));
        let sleeping = Arc::new(AtomicBool::new(false));
        let state = EngineLoop {
            rx,
            doorbell: doorbell.clone(),
            idle_spin,
            queues: Vec::new(),
            sleeping: sleeping.clone(),
            runs_a: Vec::new(),
            runs_b: Vec::new(),
            bounce: Vec::new(),
        };
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || state.run())?;
        Ok(EngineHandle {
            tx,
            doorbell,
            load,
            sleeping,
            thread: Some(thread),
        })
    }

    fn command(&self, c: EngineCmd) {
        if self.tx.send(c).is_ok() {
            let _ = wd_sys::eventfd_signal(self.doorbell.as_fd());
        }
    }

    /// Hand a queue to this engine.
    pub fn attach(&self, q: Arc<Queue>, view: RingView, dev: Box<dyn DeviceQueue>) {
        self.load.fetch_add(1, Ordering::Relaxed);
        self.command(EngineCmd::Attach(q, view, dev));
    }

    /// Take a queue away; returns once the engine no longer touches it.
    pub fn detach(&self, id: u32) {
        let (tx, rx) = mpsc::channel();
        self.command(EngineCmd::Detach(id, tx));
        // The engine answers within one pass; if it is gone, it cannot
        // touch the queue either.
        let _ = rx.recv_timeout(Duration::from_secs(10));
        self.load.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        self.command(EngineCmd::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Served {
    q: Arc<Queue>,
    view: RingView,
    dev: Box<dyn DeviceQueue>,
}

struct EngineLoop {
    rx: mpsc::Receiver<EngineCmd>,
    doorbell: Arc<OwnedFd>,
    idle_spin: Duration,
    queues: Vec<Served>,
    sleeping: Arc<AtomicBool>,
    runs_a: Vec<(u64, u64)>,
    runs_b: Vec<(u64, u64)>,
    bounce: Vec<u8>,
}

impl EngineLoop {
    fn run(mut self) {
        let mut batch: Vec<Desc> = Vec::with_capacity(BATCH);
        let mut last_work = Instant::now();
        // Idle passes since the clock was last read: reading it costs as
        // much as a pass, so the idle deadline is checked every few passes.
        let mut idle_passes = 0u32;
        loop {
            if !self.commands() {
                break;
            }
            let mut worked = false;
            let mut i = 0;
            while i < self.queues.len() {
                match self.serve(i, &mut batch) {
                    Ok(n) => {
                        worked |= n > 0;
                        i += 1;
                    }
                    Err(()) => {
                        // Corrupt ring: stop serving it; the owner's
                        // connection tears it down.
                        let s = self.queues.swap_remove(i);
                        s.q.set_state(QueueState::Broken);
                        s.view.set_host_state(HostState::Broken);
                        let _ = wd_sys::eventfd_signal(s.q.cq_event.as_fd());
                    }
                }
            }
            if worked {
                idle_passes = 0;
                continue;
            }
            if idle_passes == 0 {
                last_work = Instant::now();
            }
            idle_passes += 1;
            if idle_passes % IDLE_CLOCK_EVERY != 0 || last_work.elapsed() < self.idle_spin {
                std::hint::spin_loop();
                continue;
            }
            self.sleep();
            idle_passes = 0;
        }
        for s in self.queues.drain(..) {
            s.view.set_host_state(HostState::Stopped);
            let _ = wd_sys::eventfd_signal(s.q.cq_event.as_fd());
        }
    }

    /// Apply pending commands; false when the engine must exit.
    fn commands(&mut self) -> bool {
        loop {
            match self.rx.try_recv() {
                Ok(EngineCmd::Attach(q, view, dev)) => self.queues.push(Served { q, view, dev }),
                Ok(EngineCmd::Detach(id, ack)) => {
                    if let Some(pos) = self.queues.iter().position(|s| s.q.id == id) {
                        let mut s = self.queues.swap_remove(pos);
                        cancel_pending(&mut s);
                    }
                    let _ = ack.send(());
                }
                Ok(EngineCmd::Stop) => return false,
                Err(mpsc::TryRecvError::Empty) => return true,
                Err(mpsc::TryRecvError::Disconnected) => return false,
            }
        }
    }

    fn sleep(&mut self) {
        let mut work = false;
        for s in &self.queues {
            // host_prepare_sleep sets NEED_WAKEUP then re-checks the ring.
            work |= s.view.host_prepare_sleep().unwrap_or(true);
        }
        if !work {
            self.sleeping.store(true, Ordering::Relaxed);
            let _ = wd_sys::poll(&[self.doorbell.as_fd()], Some(SLEEP_TIMEOUT));
            self.sleeping.store(false, Ordering::Relaxed);
            let _ = wd_sys::eventfd_drain(self.doorbell.as_fd());
        }
        for s in &self.queues {
            s.view.host_end_sleep();
        }
    }

    /// One pass over queue `i`: Err(()) when its ring is corrupt.
    fn serve(&mut self, i: usize, batch: &mut Vec<Desc>) -> Result<usize, ()> {
        batch.clear();
        let s = &mut self.queues[i];
        if s.q.state() != QueueState::Active {
            return Ok(0);
        }
        let n = s.view.fetch(BATCH, batch).map_err(|_| ())?;
        if n == 0 {
            return Ok(0);
        }
        let q = s.q.clone();
        let dom = q.domain.read().unwrap_or_else(|e| e.into_inner());
        let mut bytes = 0u64;
        let mut posted = 0;
        for k in 0..n {
            let d = &mut batch[k];
            let mut dma = QueueDma {
                q: &q,
                dom: &dom,
                runs_a: &mut self.runs_a,
                runs_b: &mut self.runs_b,
                bounce: &mut self.bounce,
            };
            let dev = &mut self.queues[i].dev;
            let r = catch_unwind(AssertUnwindSafe(|| dev.process(d, &mut dma)));
            if r.is_err() {
                d.status = status::EIO;
                d.result = 0;
            }
            if d.status == 0 {
                bytes += d.result;
            }
            // Post a large request's completion at once (its owner can use
            // the result while the next ones are processed); small ones go
            // out together at the end of the batch.
            let big = d.status == 0 && d.result >= POST_AT_ONCE;
            if big || k + 1 == n {
                let s = &mut self.queues[i];
                if s.view.complete(&batch[posted..=k]).map_err(|_| ())? {
                    let _ = wd_sys::eventfd_signal(q.cq_event.as_fd());
                }
                posted = k + 1;
            }
        }
        drop(dom);
        q.requests.fetch_add(n as u64, Ordering::Relaxed);
        q.bytes.fetch_add(bytes, Ordering::Relaxed);
        Ok(n)
    }
}

/// Fail whatever is still queued on a ring being torn down, then mark it stopped.
fn cancel_pending(s: &mut Served) {
    let mut left = Vec::new();
    while let Ok(n) = s.view.fetch(BATCH, &mut left) {
        if n == 0 {
            break;
        }
        for d in left.iter_mut() {
            d.status = status::ECANCELED;
            d.result = 0;
        }
        if s.view.complete(&left).is_err() {
            break;
        }
        left.clear();
    }
    s.view.set_host_state(HostState::Stopped);
    let _ = wd_sys::eventfd_signal(s.q.cq_event.as_fd());
}

/// Device memory of one queue, through its domain (and, for SHARE_ALL
/// queues, through the client process for addresses not shared).
struct QueueDma<'a> {
    q: &'a Queue,
    dom: &'a Domain,
    runs_a: &'a mut Vec<(u64, u64)>,
    runs_b: &'a mut Vec<(u64, u64)>,
    bounce: &'a mut Vec<u8>,
}

/// Largest bounce copy in one process_vm call.
const BOUNCE_CHUNK: usize = 1 << 20;

impl QueueDma<'_> {
    fn fault(&self, f: Fault) -> Fault {
        self.q.record_fault(f);
        f
    }

    fn pid_fault(&self, iova: u64, access: Access) -> Fault {
        self.fault(Fault {
            iova,
            pasid: self.q.id,
            access,
            reason: FaultReason::Unmapped,
        })
    }

    fn share_all(&self) -> Option<u32> {
        match self.q.model {
            MemModel::ShareAll { pid } => Some(pid),
            MemModel::Shared => None,
        }
    }
}

impl Dma for QueueDma<'_> {
    fn host_range(&mut self, iova: u64, len: u64, access: Access) -> Option<u64> {
        // A fault here is not recorded: the caller falls back to read/write,
        // which records it.
        self.dom
            .translate_range(iova, len, access, self.runs_a)
            .ok()
            .filter(|_| self.runs_a.len() == 1)
            .map(|_| self.runs_a[0].0)
    }

    fn copy(&mut self, dst: u64, src: u64, len: u64) -> Result<(), Fault> {
        if len == 0 {
            return Ok(());
        }
        let a = self
            .dom
            .translate_range(src, len, Access::Read, self.runs_a);
        let b = self
            .dom
            .translate_range(dst, len, Access::Write, self.runs_b);
        match (a, b) {
            (Ok(()), Ok(())) => {
                copy_runs(self.runs_b, self.runs_a);
                Ok(())
            }
            (a, b) => {
                if self.share_all().is_none() {
                    return Err(self.fault(a.err().or(b.err()).expect("one side faulted")));
                }
                // SHARE_ALL: the client's whole address space, reached
                // through the kernel (the analogue of an I/O page fault).
                let mut done = 0u64;
                while done < len {
                    let n = (len - done).min(BOUNCE_CHUNK as u64) as usize;
                    let mut buf = std::mem::take(self.bounce);
                    buf.resize(n, 0);
                    let r = self
                        .read(src + done, &mut buf)
                        .and_then(|_| self.write(dst + done, &buf));
                    *self.bounce = buf;
                    r?;
                    done += n as u64;
                }
                Ok(())
            }
        }
    }

    fn read(&mut self, src: u64, buf: &mut [u8]) -> Result<(), Fault> {
        match self
            .dom
            .translate_range(src, buf.len() as u64, Access::Read, self.runs_a)
        {
            Ok(()) => {
                let mut off = 0usize;
                for &(p, l) in self.runs_a.iter() {
                    // SAFETY: p..p+l was translated from the queue's domain,
                    // which maps only live host mappings of shared memory
                    // (unmapped only under the domain's write lock, which we
                    // exclude by holding the read lock); buf is local memory.
                    unsafe {
                        std::ptr::copy(p as *const u8, buf.as_mut_ptr().add(off), l as usize)
                    };
                    off += l as usize;
                }
                Ok(())
            }
            Err(f) => match self.share_all() {
                Some(pid) => {
                    // SAFETY: buf is valid for buf.len() writable bytes.
                    unsafe { wd_sys::process_vm_read(pid, src, buf.as_mut_ptr(), buf.len()) }
                        .map_err(|_| self.pid_fault(src, Access::Read))
                }
                None => Err(self.fault(f)),
            },
        }
    }

    fn write(&mut self, dst: u64, data: &[u8]) -> Result<(), Fault> {
        match self
            .dom
            .translate_range(dst, data.len() as u64, Access::Write, self.runs_b)
        {
            Ok(()) => {
                let mut off = 0usize;
                for &(p, l) in self.runs_b.iter() {
                    // SAFETY: as in `read`, with write permission checked by
                    // the translation.
                    unsafe { std::ptr::copy(data.as_ptr().add(off), p as *mut u8, l as usize) };
                    off += l as usize;
                }
                Ok(())
            }
            Err(f) => match self.share_all() {
                Some(pid) => {
                    // SAFETY: data is valid for data.len() readable bytes.
                    unsafe { wd_sys::process_vm_write(pid, dst, data.as_ptr(), data.len()) }
                        .map_err(|_| self.pid_fault(dst, Access::Write))
                }
                None => Err(self.fault(f)),
            },
        }
    }
}

/// Copy between two run lists describing equally long byte ranges.
fn copy_runs(dst: &[(u64, u64)], src: &[(u64, u64)]) {
    let (mut i, mut j) = (0usize, 0usize);
    let (mut si, mut dj) = (0u64, 0u64);
    while i < src.len() && j < dst.len() {
        let n = (src[i].1 - si).min(dst[j].1 - dj);
        // SAFETY: both runs were translated under the domain's read lock from
        // live host mappings (see QueueDma::read); ptr::copy tolerates the
        // overlap a client may ask for.
        unsafe {
            std::ptr::copy(
                (src[i].0 + si) as *const u8,
                (dst[j].0 + dj) as *mut u8,
                n as usize,
            )
        };
        si += n;
        dj += n;
        if si == src[i].1 {
            i += 1;
            si = 0;
        }
        if dj == dst[j].1 {
            j += 1;
            dj = 0;
        }
    }
}

/// Device memory of a legacy (socket) request: reads come from the request
/// payload at addresses 0..len, writes go to the reply payload.
pub struct LegacyDma<'a> {
    /// Request payload.
    pub input: &'a [u8],
    /// Reply payload (grows as the device writes, bounded).
    pub output: Vec<u8>,
    /// Queue id, for fault records.
    pub pasid: u32,
}

impl LegacyDma<'_> {
    fn bad(&self, iova: u64, access: Access) -> Fault {
        Fault {
            iova,
            pasid: self.pasid,
            access,
            reason: FaultReason::OutOfRange,
        }
    }
}

impl Dma for LegacyDma<'_> {
    fn copy(&mut self, dst: u64, src: u64, len: u64) -> Result<(), Fault> {
        let end = src
            .checked_add(len)
            .filter(|&e| e <= self.input.len() as u64);
        let Some(end) = end else {
            return Err(self.bad(src, Access::Read));
        };
        let input = self.input;
        self.write(dst, &input[src as usize..end as usize])
    }

    fn read(&mut self, src: u64, buf: &mut [u8]) -> Result<(), Fault> {
        match src.checked_add(buf.len() as u64) {
            Some(e) if e <= self.input.len() as u64 => {
                buf.copy_from_slice(&self.input[src as usize..e as usize]);
                Ok(())
            }
            _ => Err(self.bad(src, Access::Read)),
        }
    }

    fn write(&mut self, dst: u64, data: &[u8]) -> Result<(), Fault> {
        match dst.checked_add(data.len() as u64) {
            Some(e) if e <= wd_proto::limits::MAX_PAYLOAD as u64 => {
                if self.output.len() < e as usize {
                    self.output.resize(e as usize, 0);
                }
                self.output[dst as usize..e as usize].copy_from_slice(data);
                Ok(())
            }
            _ => Err(self.bad(dst, Access::Write)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_runs_splits_across_pages() {
        let src: Vec<u8> = (0..64u8).collect();
        let mut dst = vec![0u8; 64];
        let s = src.as_ptr() as u64;
        let d = dst.as_mut_ptr() as u64;
        copy_runs(&[(d, 10), (d + 10, 54)], &[(s, 30), (s + 30, 34)]);
        assert_eq!(src, dst);
    }

    #[test]
    fn legacy_bounds() {
        let input = [1u8, 2, 3, 4];
        let mut l = LegacyDma {
            input: &input,
            output: Vec::new(),
            pasid: 1,
        };
        l.copy(2, 0, 4).unwrap();
        assert_eq!(l.output, [0, 0, 1, 2, 3, 4]);
        assert!(l.copy(0, 1, 4).is_err());
        assert!(l.copy(0, u64::MAX, 2).is_err());
        assert!(l.write(u64::MAX - 1, &[1, 2]).is_err());
    }
}
