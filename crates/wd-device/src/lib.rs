//! Devices plug into the host through [`Driver`]: a name, the algorithms it
//! serves, and engines that process requests.
//!
//! An engine never sees raw client memory: it reaches request data through a
//! [`Dma`] context, which translates every address through the queue's IOMMU
//! domain (or the client-memory descriptor / legacy paths), so a driver cannot touch what
//! the client did not share.
#![deny(unsafe_code)]

pub mod dummy;
pub mod dummy_async;
mod sessions;

pub use sessions::SessionTable;

pub use wd_iommu::{Access, Fault, FaultReason};
use wd_ring::Desc;
pub use wd_sys::devmem::{DeviceSlice, HeldSlice, Registers};

/// Errors of device set-up.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// A configuration option was not understood or out of range.
    #[error("device {device}: {message}")]
    Config {
        /// Driver name.
        device: String,
        /// What was wrong.
        message: String,
    },
}

/// One algorithm (queue type) a driver serves, shown as
/// `mdev_supported_types/<driver>-<alg>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AlgInfo {
    /// Algorithm name, e.g. "memcpy".
    pub name: &'static str,
    /// Feature bits a client can test.
    pub flags: u32,
    /// Message-format version a client must speak.
    pub device_api: u32,
}

/// Device memory access for one request, already bound to the request's
/// queue and memory model. `'m` is how long translated memory stays
/// reachable: the engine's translation section, which ends before the
/// request's completion is posted and before any unshare returns.
pub trait Dma<'m> {
    /// Copy `len` bytes from device address `src` to `dst` (both translated).
    fn copy(&mut self, dst: u64, src: u64, len: u64) -> Result<(), Fault>;
    /// Read device memory into a local buffer.
    fn read(&mut self, src: u64, buf: &mut [u8]) -> Result<(), Fault>;
    /// Write a local buffer to device memory.
    fn write(&mut self, dst: u64, data: &[u8]) -> Result<(), Fault>;
    /// `[iova, iova + len)` as one slice of host memory when the whole
    /// range is one contiguous mapping allowing `access`, so a device can
    /// work in place (zero copy). `None` means "use `read`/`write`", which
    /// also record any fault. The memory may change under the device (the
    /// client can write it), which [`DeviceSlice`] allows for.
    fn slice(&mut self, _iova: u64, _len: u64, _access: Access) -> Option<DeviceSlice<'m>> {
        None
    }
    /// Check that `[iova, iova + len)` allows `access`, without moving
    /// data, recording a fault as `read` and `write` do. A request that
    /// faults in a domain with the stall policy runs again from the start
    /// once the fault is resolved, so a device whose request changes state
    /// it cannot undo (a session's stream, a cipher's chain) checks its
    /// memory before it changes anything. The default checks nothing:
    /// such memory faults where it is used.
    fn probe(&mut self, iova: u64, len: u64, access: Access) -> Result<(), Fault> {
        let _ = (iova, len, access);
        Ok(())
    }

    /// Like [`Dma::slice`], for a request the device will hold past this
    /// call: the engine keeps the translation valid (an unshare waits)
    /// until the device reports the request complete. `None` when the
    /// range cannot be held (not one mapping, or not shared memory): then
    /// complete the request now through `read`/`write`.
    fn hold(&mut self, _iova: u64, _len: u64, _access: Access) -> Option<HeldSlice> {
        None
    }
    /// The translation section this access runs in, as the engine numbers
    /// them: a register-driven device that holds memory past the call
    /// reports the oldest section it still holds from
    /// ([`Service::holds_from`]), and the engine keeps that section's
    /// translations pinned.
    fn section(&self) -> u64 {
        0
    }
}

/// A device's side of one queue: its per-queue state (sessions, chaining
/// state) and the processing of that queue's requests. Created when the
/// queue is created, dropped when it is torn down (so nothing a client set
/// up outlives its queue), and only ever used by one thread at a time.
pub trait DeviceQueue: Send {
    /// Process one request in place: set `desc.status` (0 or a negative
    /// errno) and `desc.result`. Must not panic on any descriptor content.
    fn process(&mut self, desc: &mut Desc, dma: &mut dyn Dma<'_>);

    /// Process part of a request: about `budget` bytes of its work, the
    /// first `done` bytes being finished already (0 for a new request).
    /// The engine gives each queue a bounded amount of work per pass, so a
    /// queue of huge requests cannot make another queue's small ones wait
    /// behind all of it; a device whose requests can be cut without
    /// per-request state says how far it got with [`Progress::More`], and
    /// the engine calls again with `done` set in a later pass. The default
    /// runs the whole request at once.
    fn process_part(
        &mut self,
        desc: &mut Desc,
        dma: &mut dyn Dma<'_>,
        done: u64,
        budget: u64,
    ) -> Progress {
        let _ = (done, budget);
        self.process(desc, dma);
        Progress::Done
    }

    /// Whether `desc`, a request cut in parts, may start over once a
    /// fault in a later part is resolved: under the stall policy the
    /// engine retries a faulted request from its start, which only a
    /// request whose parts change nothing it reads allows (no session
    /// moved on, no source overwritten by its own output). The default is
    /// no: such a fault fails the request at once.
    fn restartable(&self, desc: &Desc) -> bool {
        let _ = desc;
        false
    }

    /// Start a request that may finish later: complete it now (fill in
    /// `desc`'s status and result, return [`Started::Done`]) or keep it
    /// and report it from [`DeviceQueue::poll`] with its `token`
    /// ([`Started::Held`]), or leave it to the engine to run in pieces
    /// ([`Started::Cut`]). Only called for devices whose
    /// [`DeviceQueue::asynchronous`] is true; the default runs it now.
    fn start(&mut self, token: u64, desc: &mut Desc, dma: &mut dyn Dma<'_>) -> Started {
        let _ = token;
        self.process(desc, dma);
        Started::Done
    }

    /// How many requests the [`DeviceQueue::start`] calls that follow hand
    /// over in this pass: a device that gathers requests to run them side
    /// by side need not gather (nor hold memory) for one alone.
    fn batch(&mut self, requests: usize) {
        let _ = requests;
    }

    /// Whether this device may hold requests (`start`, `poll`, `abort`).
    /// A simple device answers false and only implements `process`.
    fn asynchronous(&self) -> bool {
        false
    }

    /// Append the held requests that finished, in any order: each one's
    /// token and completed descriptor. Called on every
    /// engine pass while requests are held; must not block.
    fn poll(&mut self, _done: &mut Vec<(u64, Desc)>) {}

    /// Requests held now.
    fn in_flight(&self) -> usize {
        0
    }

    /// Teardown: stop every held request and append it (token and
    /// completed descriptor): one finished and not yet reported with its
    /// outcome, the others with `ECANCELED`. On return the device touches
    /// none of their memory any more.
    fn abort(&mut self, _stopped: &mut Vec<(u64, Desc)>) {}

    /// Whether this device is driven through its register block (see
    /// [`Driver::register_bytes`]) instead of the queue's ring: the engine
    /// then calls [`DeviceQueue::service`] on every pass and never fetches
    /// ring entries for it.
    fn register_driven(&self) -> bool {
        false
    }

    /// The queue's register block, shared with its client; given once,
    /// before the first [`DeviceQueue::service`], to a device whose
    /// [`Driver::register_bytes`] is not zero.
    fn attach_registers(&mut self, regs: Registers) {
        let _ = regs;
    }

    /// One pass of a register-driven device: look at its registers and
    /// doorbells, run what they ask for through `dma`, and say what it
    /// did. Must not block or panic on anything the client wrote.
    fn service(&mut self, dma: &mut dyn Dma<'_>) -> Service {
        let _ = dma;
        Service::default()
    }

    /// A register-driven device's queue is going away: stop or wait for
    /// everything in flight; on return the device touches none of the
    /// memory it held.
    fn quiesce(&mut self) {}

    /// A register-driven device's engine is about to sleep: arm whatever
    /// makes the client wake it (the ring's NEED_WAKEUP flag is set
    /// already) and return true when work arrived meanwhile (then the
    /// engine does not sleep).
    fn prepare_sleep(&mut self) -> bool {
        false
    }

    /// Bytes of data a completed request processed, for the queue's
    /// `bytes` counter. The default reads the result as a byte count;
    /// devices whose results are something else (a session handle, a
    /// digest length) say what the request really moved.
    fn bytes_of(&self, done: &Desc) -> u64 {
        done.result
    }

    /// The work a completed request (or the last piece of a cut one) cost,
    /// for the engine's per-pass budget (`pass_bytes`): its
    /// [`DeviceQueue::bytes_of`] by default. A device whose requests can
    /// write far more than they read (a decompression: a few KiB of zstd
    /// make 64 MiB) counts what they wrote too, or a batch of them runs
    /// in one pass, counted as small requests.
    fn work_of(&self, done: &Desc) -> u64 {
        self.bytes_of(done)
    }
}

/// What one [`DeviceQueue::service`] pass did, for the engine's idle
/// rule and the queue's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Service {
    /// Commands completed (or anything else that counts as work: a
    /// register change handled).
    pub work: usize,
    /// Commands completed, for the queue's `requests` counter.
    pub requests: u64,
    /// Bytes moved, for the queue's `bytes` counter.
    pub bytes: u64,
    /// The device has work in flight or queued that a later pass must
    /// finish: the engine must not sleep.
    pub busy: bool,
    /// The oldest translation section ([`Dma::section`]) whose memory the
    /// device still holds ([`Dma::hold`]) for requests in flight: the
    /// engine keeps it pinned (an unshare waits) until a later pass
    /// reports a newer one or none.
    pub holds_from: Option<u64>,
}

/// What [`DeviceQueue::start`] did with a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Started {
    /// Completed now: its descriptor has its status and result.
    Done,
    /// Held: it completes through a later [`DeviceQueue::poll`].
    Held,
    /// Left to the engine, untouched: it runs the request as it runs a
    /// synchronous device's, through [`DeviceQueue::process_part`] in
    /// pieces within its passes' budget, and starts no other request of
    /// the queue before it ends. For what the device cannot hold and
    /// would otherwise run whole in `start`, however long.
    Cut,
    /// Not now, untouched: the engine starts it again in a later pass,
    /// before the queue's later requests. For a request that must wait
    /// for one the device holds (a later request of the same session), so
    /// the engine serves its other queues meanwhile rather than the device
    /// finishing the held one at once.
    Later,
}

/// How far [`DeviceQueue::process_part`] got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// The request is finished: its status and result are set.
    Done,
    /// The first this many bytes are done; call again for the rest.
    More(u64),
}

/// A device driver.
pub trait Driver: Send + Sync {
    /// Driver name, e.g. "dummy".
    fn name(&self) -> &'static str;
    /// Algorithms served; the index into this list is the `alg` passed to
    /// [`Driver::open_queue`].
    fn algorithms(&self) -> Vec<AlgInfo>;
    /// What computes the requests, shown as `devN/engine` (a device with a
    /// choice of implementations says which it uses, and why not another).
    fn engine(&self) -> Option<String> {
        None
    }
    /// Bytes of register block a queue of algorithm `alg` has (0: none):
    /// the host appends them to the queue's ring memory, page aligned,
    /// after the ring, and gives the device a [`Registers`] view of them.
    fn register_bytes(&self, alg: u32) -> usize {
        let _ = alg;
        0
    }
    /// How long an idle engine of this device polls before it sleeps,
    /// when the configuration does not say.
    fn idle_spin(&self) -> std::time::Duration {
        std::time::Duration::from_micros(200)
    }
    /// The device's own attributes, shown under `devN/` in the attribute
    /// tree: (path below the device, value, writable by the host's owner).
    fn attributes(&self) -> Vec<(String, String, bool)> {
        Vec::new()
    }
    /// Write one of [`Driver::attributes`] marked writable (the host has
    /// checked the writer is its owner); the error says what was wrong.
    fn set_attribute(&self, name: &str, value: &str) -> Result<(), String> {
        let _ = value;
        Err(format!("attribute '{name}' is not writable"))
    }
    /// Priority used when several devices serve an algorithm (higher wins).
    fn default_priority(&self) -> u32 {
        0
    }
    /// The device side of a new queue of algorithm `alg` (an index into
    /// [`Driver::algorithms`]).
    fn open_queue(&self, alg: u32) -> Box<dyn DeviceQueue>;
}

pub use wd_msg::{status, LegacyPlan};

/// Whether the device ranges `[a, a + a_len)` and `[b, b + b_len)` share
/// an address (empty ranges share none): a request whose output may
/// overwrite its own input cannot start over ([`DeviceQueue::restartable`]).
pub fn ranges_overlap((a, a_len): (u64, u64), (b, b_len): (u64, u64)) -> bool {
    a_len > 0 && b_len > 0 && a < b.saturating_add(b_len) && b < a.saturating_add(a_len)
}

/// Where the next `n` bytes of a copy of `len` bytes from `src` to `dst`
/// lie, `done` bytes in: pieces run front to back, or back to front when
/// the destination overlaps the source from above, so together they move
/// bytes as one overlapping copy (memmove) would.
pub fn copy_piece_at(src: u64, dst: u64, len: u64, done: u64, n: u64) -> u64 {
    if dst > src && dst - src < len {
        len - done - n
    } else {
        done
    }
}

/// A held request stopped unfinished at teardown (see
/// [`DeviceQueue::abort`]).
pub fn cancelled(mut d: Desc) -> Desc {
    d.status = status::ECANCELED;
    d.result = 0;
    d
}
