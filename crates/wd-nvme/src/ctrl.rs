//! One mediated controller: the register block a client drives, its admin
//! and I/O queues in the client's memory, and the command loop that the
//! engine runs on every pass ([`DeviceQueue::service`]).

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use wd_device::{status, Access, DeviceQueue, Dma, Registers, Service};
use wd_nvme_msg::regs::{self, Cap, Cc};
use wd_nvme_msg::{prp, Cqe, IoOp, Sqe, Status, CQE_SIZE, PAGE, SQE_SIZE};
use wd_ring::Desc;

use crate::store::{Namespace, Subsystem};
use crate::Counters;

/// Commands taken from one submission queue per pass (fairness between
/// queues and controllers).
const SQ_BUDGET: u32 = 64;
/// Work one pass does for the controller's commands, in bytes moved in
/// the polling thread (a sync of the store counts [`SYNC_COST`]): the
/// engine serves its other controllers, and every IOMMU sync of the host
/// (an unshare, a detach, an ATTACH) waits for the pass, so one pass is
/// bounded as every device's is (`pass_bytes`), not by 17 queues of 64
/// commands of MDTS with a sync each. What is left is run by the next
/// passes (the pass says it is busy).
pub(crate) const PASS_BUDGET: u64 = 1 << 20;
/// What an fdatasync of a store counts against [`PASS_BUDGET`].
pub(crate) const SYNC_COST: u64 = 256 << 10;
/// What a zeroing or deallocation (`fallocate`) counts.
pub(crate) const ZERO_COST: u64 = 64 << 10;
/// Queue ids: the admin queue (0) and the I/O queues.
pub(crate) const QUEUES: usize = regs::MAX_IO_QUEUES as usize + 1;
/// Asynchronous Event Requests a controller keeps (AERL + 1).
pub(crate) const AER_LIMIT: usize = 4;
/// Error log entries kept (ELPE + 1).
pub(crate) const ERROR_LOG: usize = 64;
/// Maximum data transfer: 2^MDTS pages.
pub(crate) const MDTS: u8 = 6;
/// Doorbell pairs (submission tail, completion head) the register block
/// holds: far more than the queues offered, and a driver may write any of
/// them.
const DOORBELL_PAIRS: usize = (regs::BLOCK_BYTES - regs::DOORBELLS) / 8;

/// A submission queue.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sq {
    pub base: u64,
    pub entries: u32,
    pub head: u32,
    pub cqid: u16,
    /// The tail doorbell held an invalid value (reported once).
    pub bad_doorbell: bool,
}

/// A completion queue.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cq {
    pub base: u64,
    pub entries: u32,
    pub tail: u32,
    /// The driver's head, as last read from its doorbell.
    pub head: u32,
    pub phase: bool,
    /// Submission queues posting here.
    pub bound: u16,
    /// Entries promised to commands in flight.
    pub reserved: u32,
    /// The head doorbell held an invalid value (reported once, until a
    /// valid head is read).
    pub bad_doorbell: bool,
}

impl Cq {
    /// Entries free for new commands (one stays empty: a full queue would
    /// look empty).
    fn free(&self) -> u32 {
        let used = (self.tail + self.entries - self.head) % self.entries;
        (self.entries - 1).saturating_sub(used + self.reserved)
    }

    /// Whether the driver's head may be `head`: inside the queue, and not
    /// past the entries posted (NVMe Base, Invalid Doorbell Write Value:
    /// "a host attempts to remove a completion queue entry from an empty
    /// Completion Queue"). The driver only moves its head forward from
    /// the one last read, up to the tail.
    fn head_valid(&self, head: u32) -> bool {
        let ahead = |to: u32| (to + self.entries - self.head) % self.entries;
        head < self.entries && ahead(head) <= ahead(self.tail)
    }
}

/// One entry of the error information log.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ErrorEntry {
    pub count: u64,
    pub sqid: u16,
    pub cid: u16,
    pub status: Status,
    pub lba: u64,
    pub nsid: u32,
}

/// Features a driver can set (Set Features), current values.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Features {
    pub arbitration: u32,
    pub power: u32,
    /// Temperature Threshold of the Composite Temperature (the only one
    /// reported), by THSEL: over, under.
    pub temperature_thresholds: [u16; 2],
    pub error_recovery: u32,
    pub write_cache: bool,
    pub coalescing: u32,
    pub atomicity: u32,
    pub async_events: u32,
}

impl Default for Features {
    fn default() -> Self {
        Features {
            arbitration: 0,
            power: 0,
            // Over: 343 K, the warning threshold (WCTEMP) Identify
            // reports; under: 0 K.
            temperature_thresholds: [343, 0],
            error_recovery: 0,
            write_cache: true,
            coalescing: 0,
            atomicity: 0,
            async_events: 0,
        }
    }
}

/// What a command's completion says.
pub(crate) enum Outcome {
    /// Complete now with this status and DW0.
    Done(Status, u32),
    /// An Asynchronous Event Request, kept until an event comes.
    Held,
    /// Started on the I/O ring: it completes in a later pass.
    Started,
}

/// A command whose transfers are on the I/O ring.
pub(crate) struct InFlight {
    pub sqid: u16,
    pub cqid: u16,
    pub cid: u16,
    /// Where it reads or writes, for the error log.
    pub nsid: u32,
    pub slba: u64,
    pub write: bool,
    /// Durable before its completion (see `write_through`).
    pub sync: bool,
    pub len: u64,
    /// Transfers not yet finished.
    pub remaining: u32,
    pub status: Status,
    /// The section its memory was held from (see `Service::holds_from`).
    pub section: u64,
    /// Keeps the store open while the kernel uses it; a detach waits for
    /// the commands of its namespace.
    pub ns: Arc<Namespace>,
    /// The memory the kernel reads or writes, pinned by the engine.
    pub _held: Vec<wd_device::HeldSlice>,
}

/// Controller health figures for the SMART log.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Health {
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub reads: u64,
    pub writes: u64,
    pub busy_ns: u64,
    pub media_errors: u64,
}

/// A mediated controller (the device side of one `nvme` queue).
pub struct Controller {
    pub(crate) regs: Option<Registers>,
    pub(crate) sub: Arc<Subsystem>,
    pub(crate) counters: Arc<Counters>,
    pub(crate) cntlid: u16,
    /// The CC value last acted on.
    cc: u32,
    /// Enabled and ready (CSTS.RDY).
    ready: bool,
    /// A shutdown was requested; nothing is processed until a reset.
    shut_down: bool,
    /// Controller fatal status: the driver must reset.
    fatal: bool,
    pub(crate) sqs: [Option<Sq>; QUEUES],
    pub(crate) cqs: [Option<Cq>; QUEUES],
    pub(crate) features: Features,
    pub(crate) aers: Vec<u16>,
    pub(crate) events: VecDeque<u32>,
    /// Event types (a bit each) reported and not yet cleared by reading
    /// their log page: their later events wait (NVMe Base, Asynchronous
    /// Event Request), so a client that keeps making them is told once.
    pub(crate) masked_events: u8,
    pub(crate) errors: VecDeque<ErrorEntry>,
    pub(crate) error_count: u64,
    pub(crate) health: Health,
    /// Shadow doorbell and EventIdx buffers (Doorbell Buffer Config).
    pub(crate) dbbuf: Option<(u64, u64)>,
    /// EventIdx was written for the current idle spell (shadow
    /// doorbells): a new submission makes the driver write the register.
    armed: bool,
    /// The submission queues' tail doorbells, as `drain` last read them.
    sq_bells: [Bell; QUEUES],
    /// Completion queues (a bit per id) found full in the last pass with
    /// commands or events waiting for their room: the engine may sleep,
    /// and the driver's next head doorbell wakes it.
    full_cqs: u32,
    /// The completion queues' head doorbells, as `cq_room` last read
    /// them.
    cq_bells: [Bell; QUEUES],
    /// The full completion queues whose head EventIdx the current idle
    /// spell wrote: a queue found full later in the spell (a submission
    /// woke the engine, and the queue filled) must be armed too.
    armed_cqs: u32,
    /// Namespaces attached here, by NSID.
    pub(crate) active: BTreeMap<u32, Arc<Namespace>>,
    /// The doorbells (submission tail, completion head) of I/O queues that
    /// do not exist, as last seen, for every pair in the register block
    /// (queue ids past those offered can never exist): one that changes
    /// was written, an error event (Write to Invalid Doorbell Register).
    ghost_bells: Box<[[u32; 2]; DOORBELL_PAIRS]>,
    /// Passes since the doorbells the command loop does not read were
    /// last looked at (`audit_doorbells`).
    audit_passes: u32,
    /// How I/O reaches the store.
    pub(crate) io: crate::IoEngine,
    /// The I/O ring, made on first use (None when not used or refused).
    pub(crate) ring: Option<wd_sys::uring::DeviceRing>,
    /// Commands on the ring, by tag.
    pub(crate) inflight: Vec<Option<InFlight>>,
    pub(crate) free_tags: Vec<usize>,
    /// Completions reaped from the ring.
    pub(crate) reaped: Vec<wd_sys::uring::ReadDone>,
    /// Commands a reap finished, between their last transfer and their
    /// completion (kept to be reused: a pass reaps up to a ring's worth).
    pub(crate) finished: Vec<InFlight>,
    /// PRP segments of the command being run.
    pub(crate) segs: prp::PrpSegments,
    /// Local buffer for data that cannot be reached in place.
    pub(crate) bounce: Vec<u8>,
    /// Work done in the polling thread in this pass (see [`PASS_BUDGET`]).
    pub(crate) pass_spent: std::cell::Cell<u64>,
    /// The I/O submission queue the next pass starts with (a pass the
    /// budget cuts short must not always leave the same queues unserved).
    next_sq: u16,
}

/// One doorbell as the controller last read it.
#[derive(Clone, Copy, Default)]
struct Bell {
    /// The register as last read: where the register is the doorbell,
    /// when the queue is run; with shadow doorbells, at the end of a pass.
    /// The wake-up check looks for a change from this, not for a tail
    /// other than the head: an invalid value never becomes the head, and
    /// must not keep the engine polling (it is news only once).
    mmio_seen: u32,
    /// The doorbell (register or shadow) as the queue was last run with.
    read: u32,
}

impl Bell {
    fn read(&mut self, v: u32, shadowed: bool) {
        self.read = v;
        if !shadowed {
            self.mmio_seen = v;
        }
    }

    /// Notes the register's value at the end of a pass with shadow
    /// doorbells: news when it moved to a value the pass did not run with.
    fn register_moved(&mut self, v: u32) -> bool {
        let moved = v != self.mmio_seen && v != self.read;
        self.mmio_seen = v;
        moved
    }
}

impl Controller {
    pub(crate) fn new(
        sub: Arc<Subsystem>,
        counters: Arc<Counters>,
        cntlid: u16,
        io: crate::IoEngine,
    ) -> Controller {
        Controller {
            io,
            ring: None,
            inflight: Vec::new(),
            free_tags: Vec::new(),
            reaped: Vec::new(),
            finished: Vec::new(),
            regs: None,
            sub,
            counters,
            cntlid,
            cc: 0,
            ready: false,
            shut_down: false,
            fatal: false,
            sqs: [None; QUEUES],
            cqs: [None; QUEUES],
            features: Features::default(),
            aers: Vec::new(),
            events: VecDeque::new(),
            masked_events: 0,
            errors: VecDeque::new(),
            error_count: 0,
            health: Health::default(),
            dbbuf: None,
            armed: false,
            sq_bells: [Bell::default(); QUEUES],
            full_cqs: 0,
            cq_bells: [Bell::default(); QUEUES],
            armed_cqs: 0,
            active: BTreeMap::new(),
            ghost_bells: Box::new([[0; 2]; DOORBELL_PAIRS]),
            audit_passes: 0,
            segs: Vec::new(),
            bounce: Vec::new(),
            pass_spent: std::cell::Cell::new(0),
            next_sq: 1,
        }
    }

    /// The capabilities this controller reports.
    pub fn capabilities() -> Cap {
        Cap {
            mqes: (regs::MAX_QUEUE_ENTRIES - 1) as u16,
            cqr: true,
            // 10 s (500 ms units): a controller served by a thread on a
            // busy machine may not run for a while, and a driver gives up
            // after TO (enabling normally takes one pass).
            to: 20,
            dstrd: 0,
            css: 1,
            mpsmin: 0,
            mpsmax: 0,
        }
    }

    fn set_csts(&self) {
        let Some(r) = &self.regs else { return };
        let mut v = 0;
        if self.ready {
            v |= regs::CSTS_RDY;
        }
        if self.fatal {
            v |= regs::CSTS_CFS;
        }
        if self.shut_down {
            v |= regs::CSTS_SHST_COMPLETE;
        }
        r.store32(regs::CSTS, v);
    }

    /// Controller reset: every queue, pending event and doorbell buffer
    /// goes; attached namespaces stay (attachment outlives resets).
    fn reset(&mut self) {
        // What is on the I/O ring finishes first; its completions go
        // nowhere (the queues are gone).
        self.quiesce_io();
        self.sqs = [None; QUEUES];
        self.cqs = [None; QUEUES];
        // The doorbells start over with the queues (a driver re-enabling
        // counts from 0; a stale tail would replay old entries), and so do
        // those of queues that cannot exist (a write before the reset is
        // not one to report after it).
        if let Some(r) = &self.regs {
            for qid in 0..DOORBELL_PAIRS as u16 {
                r.store32(regs::sq_tail_doorbell(qid), 0);
                r.store32(regs::cq_head_doorbell(qid), 0);
            }
        }
        self.sq_bells = [Bell::default(); QUEUES];
        self.ghost_bells.fill([0; 2]);
        self.full_cqs = 0;
        self.cq_bells = [Bell::default(); QUEUES];
        self.armed_cqs = 0;
        self.aers.clear();
        self.events.clear();
        self.masked_events = 0;
        self.dbbuf = None;
        self.armed = false;
        self.features = Features::default();
        self.ready = false;
        self.shut_down = false;
        self.fatal = false;
    }

    /// The driver changed CC: enable, reset or shut down.
    fn control(&mut self, cc_raw: u32, dma: &mut dyn Dma<'_>) {
        let Some(r) = self.regs.clone() else { return };
        let old = Cc::from_u32(self.cc);
        let new = Cc::from_u32(cc_raw);
        self.cc = cc_raw;
        if old.en && !new.en {
            self.reset();
        } else if !old.en && new.en {
            self.reset();
            let (sq_n, cq_n) = regs::aqa_decode(r.load32(regs::AQA));
            let asq = r.load64(regs::ASQ) & !(PAGE - 1);
            let acq = r.load64(regs::ACQ) & !(PAGE - 1);
            if new.css != 0 || new.mps != 0 || sq_n < 2 || cq_n < 2 || asq == 0 || acq == 0 {
                // A configuration this controller cannot run: it reports
                // fatal status until the driver resets it.
                self.fatal = true;
            } else {
                self.sqs[0] = Some(Sq {
                    base: asq,
                    entries: sq_n,
                    head: 0,
                    cqid: 0,
                    bad_doorbell: false,
                });
                self.cqs[0] = Some(Cq {
                    base: acq,
                    entries: cq_n,
                    tail: 0,
                    head: 0,
                    phase: true,
                    bound: 1,
                    reserved: 0,
                    bad_doorbell: false,
                });
                self.ready = true;
            }
        }
        // A shutdown written with EN going from 1 to 0 is a reset and a
        // shutdown (NVMe Base, CC.SHN): the reset above, then this.
        if (new.en || old.en) && new.shn != 0 && !self.shut_down {
            // Normal or abrupt shutdown: finish what is in flight, make
            // written data durable, stop. The commands in flight complete
            // to their queues, which stay: a driver waiting for them once
            // SHST says complete would wait forever (NVMe Base 3.6.1 lets
            // a shutting down controller abort a command, with a status,
            // never drop it). After a reset there are none. What the ring
            // would not give back is waited for and dropped, as before.
            self.settle(dma, None);
            self.quiesce_io();
            for ns in self.active.values() {
                let (fd, _) = ns.buffered_at(0);
                let _ = wd_sys::file::fdatasync(fd);
            }
            self.shut_down = true;
        }
        self.set_csts();
    }

    /// Charge `n` to this pass's budget.
    pub(crate) fn charge(&self, n: u64) {
        self.pass_spent.set(self.pass_spent.get().saturating_add(n));
    }

    /// Whether this pass has done its share of work.
    fn spent(&self) -> bool {
        self.pass_spent.get() >= PASS_BUDGET
    }

    pub(crate) fn running(&self) -> bool {
        self.ready && !self.shut_down && !self.fatal
    }

    /// Report a fatal controller error (a queue the controller can no
    /// longer reach): the driver must reset.
    pub(crate) fn fail(&mut self) {
        // A fatal controller's passes do nothing until a reset: what is on
        // its I/O ring finishes now (its completions go nowhere), so the
        // memory those transfers hold is not left unreported (and
        // unpinned) while the kernel may still use it.
        self.quiesce_io();
        self.fatal = true;
        self.set_csts();
    }

    /// Whether queue `qid`'s doorbells come from the shadow buffer (I/O
    /// queues once Doorbell Buffer Config set one up).
    fn shadowed(&self, qid: u16) -> bool {
        qid > 0 && self.dbbuf.is_some()
    }

    /// A doorbell value: the shadow buffer's for I/O queues when Doorbell
    /// Buffer Config set one up, else the register's.
    pub(crate) fn doorbell(&self, r: &Registers, dma: &mut dyn Dma<'_>, qid: u16, cq: bool) -> u32 {
        let reg = if cq {
            regs::cq_head_doorbell(qid)
        } else {
            regs::sq_tail_doorbell(qid)
        };
        if let (Some((shadow, _)), true) = (self.dbbuf, qid > 0) {
            let at = shadow + (reg - regs::DOORBELLS) as u64;
            if let Some(s) = dma.slice(at, 4, Access::Read) {
                return s.load_u32(0);
            }
            let mut b = [0u8; 4];
            if dma.read(at, &mut b).is_ok() {
                return u32::from_le_bytes(b);
            }
        }
        r.load32(reg)
    }

    /// A queue being created starts at entry 0 whatever its doorbell (and
    /// shadow doorbell) still holds from a deleted queue with the same id
    /// (NVMe Base §4.1): a driver writes a doorbell only to move it, so a
    /// stale tail would replay old entries.
    pub(crate) fn start_doorbell(&mut self, dma: &mut dyn Dma<'_>, qid: u16, cq: bool) {
        let reg = if cq {
            regs::cq_head_doorbell(qid)
        } else {
            regs::sq_tail_doorbell(qid)
        };
        if let Some(r) = &self.regs {
            r.store32(reg, 0);
        }
        let bells = if cq {
            &mut self.cq_bells
        } else {
            &mut self.sq_bells
        };
        bells[qid as usize] = Bell::default();
        if let Some((shadow, _)) = self.dbbuf {
            let _ = dma.write(shadow + (reg - regs::DOORBELLS) as u64, &[0; 4]);
        }
    }

    /// An idle pass with shadow doorbells: write each I/O submission
    /// queue's EventIdx as its head, so the driver's next submission also
    /// writes the doorbell register (which the sleeping engine's wake-up
    /// check reads), and the same for the head of each full completion
    /// queue, so that consuming completions does too. Returns 1 when a
    /// submission or a consumed completion came meanwhile.
    fn arm_event_index(&mut self, r: &Registers, dma: &mut dyn Dma<'_>) -> usize {
        let Some((_, events)) = self.dbbuf else {
            return 0;
        };
        let mut arm = |reg: usize, value: u32| {
            let at = events + (reg - regs::DOORBELLS) as u64;
            match dma.slice(at, 4, Access::Write) {
                // Release, then the SeqCst fence below: pairs with the
                // driver's fence between its shadow store and its
                // EventIdx load (one of the two sees the other).
                Some(s) => s.store_u32(0, value),
                None => {
                    let _ = dma.write(at, &value.to_le_bytes());
                }
            }
        };
        for qid in 1..QUEUES as u16 {
            if let Some(sq) = self.sqs[qid as usize] {
                arm(regs::sq_tail_doorbell(qid), sq.head);
            }
        }
        for qid in self.full_io_cqs() {
            if let Some(cq) = self.cqs[qid as usize] {
                arm(regs::cq_head_doorbell(qid), cq.head);
            }
        }
        std::sync::atomic::fence(Ordering::SeqCst);
        self.armed = true;
        self.armed_cqs = self.full_cqs;
        let moved = (1..QUEUES as u16).any(|qid| {
            self.sqs[qid as usize].is_some_and(|sq| {
                !self.waits_for_room(&sq) && self.doorbell(r, dma, qid, false) != sq.head
            })
        }) || self.full_io_cqs().any(|qid| {
            self.cqs[qid as usize].is_some_and(|cq| self.doorbell(r, dma, qid, true) != cq.head)
        });
        usize::from(moved)
    }

    /// Whether an idle pass must (re)write EventIdx before the engine may
    /// sleep: not yet in this idle spell, or an I/O completion queue
    /// became full since (the admin queue's head is always a register).
    fn needs_arming(&self) -> bool {
        !self.armed || self.full_cqs & !self.armed_cqs & !1 != 0
    }

    /// Whether `sq`'s commands wait for room in its full completion queue
    /// (more of them are no news: the queue's head is).
    fn waits_for_room(&self, sq: &Sq) -> bool {
        self.full_cqs & 1 << sq.cqid != 0
    }

    /// The I/O completion queues found full in the last pass.
    fn full_io_cqs(&self) -> impl Iterator<Item = u16> {
        let full = self.full_cqs;
        (1..QUEUES as u16).filter(move |q| full & 1 << q != 0)
    }

    /// Post a completion to queue `cqid` (which has room). False when the
    /// queue's memory cannot be reached.
    pub(crate) fn post(&mut self, dma: &mut dyn Dma<'_>, cqid: u16, mut cqe: Cqe) -> bool {
        let Some(cq) = self.cqs[cqid as usize].as_mut() else {
            return false;
        };
        cqe.phase = cq.phase;
        let at = cq.base + cq.tail as u64 * CQE_SIZE as u64;
        match dma.slice(at, CQE_SIZE as u64, Access::Write) {
            Some(s) => {
                s.write_from(0, &cqe.head_bytes());
                // Release: pairs with the driver's Acquire load of this
                // dword (the phase tag) before it reads the rest.
                s.store_u32(12, cqe.dw3());
            }
            None => {
                // Memory the engine cannot slice (a client's own memory
                // reached through its descriptor): the phase dword goes
                // last, in its own copy.
                if dma.write(at, &cqe.head_bytes()).is_err()
                    || dma.write(at + 12, &cqe.dw3().to_le_bytes()).is_err()
                {
                    return false;
                }
            }
        }
        cq.tail += 1;
        if cq.tail == cq.entries {
            cq.tail = 0;
            cq.phase = !cq.phase;
        }
        true
    }

    /// Whether completion queue `cqid` has room for one more command,
    /// reading its head doorbell when it looks full.
    fn cq_room(&mut self, r: &Registers, dma: &mut dyn Dma<'_>, cqid: u16) -> bool {
        let Some(cq) = self.cqs[cqid as usize] else {
            return false;
        };
        if cq.free() > 0 {
            return true;
        }
        let head = self.doorbell(r, dma, cqid, true);
        let shadowed = self.shadowed(cqid);
        self.cq_bells[cqid as usize].read(head, shadowed);
        if !self.judge_head(cqid, head) {
            return false;
        }
        let cq = self.cqs[cqid as usize].as_mut().expect("checked");
        cq.head = head;
        cq.free() > 0
    }

    /// Whether `head`, read from completion queue `cqid`'s doorbell, is
    /// valid; an invalid one is reported once, until a valid one is read
    /// (a driver that leaves it would otherwise make an event per pass).
    fn judge_head(&mut self, cqid: u16, head: u32) -> bool {
        let Some(cq) = self.cqs[cqid as usize].as_mut() else {
            return false;
        };
        let valid = cq.head_valid(head);
        let report = !valid && !cq.bad_doorbell;
        cq.bad_doorbell = !valid;
        if report {
            self.event_error(0x01);
        }
        valid
    }

    /// Check every completion queue's head doorbell, full or not: a head
    /// is read for room only when its queue looks full, and an invalid
    /// one written to a queue with room would go unreported. Only judged
    /// here (the head the controller counts room from moves in
    /// `cq_room`, with the wake-up bookkeeping).
    fn audit_cq_heads(&mut self, r: &Registers, dma: &mut dyn Dma<'_>) {
        for qid in 0..QUEUES as u16 {
            if self.cqs[qid as usize].is_some() {
                let head = self.doorbell(r, dma, qid, true);
                self.judge_head(qid, head);
            }
        }
    }

    /// Queue an error event (Asynchronous Event Information: 0x00 write
    /// to an invalid doorbell, 0x01 invalid doorbell write value).
    pub(crate) fn event_error(&mut self, info: u8) {
        // Type 0 (error status), log page 0x01 (error information). An
        // event already waiting is not queued again (a driver that keeps
        // a bad doorbell would otherwise grow the queue on every pass).
        let ev = (info as u32) << 8 | 0x01 << 16;
        if !self.events.contains(&ev) && self.events.len() < AER_LIMIT * 2 {
            self.events.push_back(ev);
        }
    }

    /// Look for doorbell writes the command loop does not read: heads of
    /// completion queues with room, doorbells of queues that do not
    /// exist. On idle passes and every 64th: the thousand loads of the
    /// whole doorbell block would tax a busy controller's every pass.
    fn audit_doorbells(&mut self, r: &Registers, dma: &mut dyn Dma<'_>, idle: bool) {
        self.audit_passes += 1;
        if !idle && self.audit_passes < 64 {
            return;
        }
        self.audit_passes = 0;
        self.audit_cq_heads(r, dma);
        self.ghost_doorbells(r);
    }

    /// Report a write to the doorbell of an I/O queue that does not exist
    /// (the value changed since last seen), up to the end of the register
    /// block.
    fn ghost_doorbells(&mut self, r: &Registers) {
        for qid in 1..DOORBELL_PAIRS {
            let exists = match qid < QUEUES {
                true => [self.sqs[qid].is_some(), self.cqs[qid].is_some()],
                false => [false; 2],
            };
            let bells = [
                regs::sq_tail_doorbell(qid as u16),
                regs::cq_head_doorbell(qid as u16),
            ];
            for k in 0..2 {
                if exists[k] {
                    continue;
                }
                let v = r.load32(bells[k]);
                if v != self.ghost_bells[qid][k] {
                    self.ghost_bells[qid][k] = v;
                    self.event_error(0x00);
                }
            }
        }
    }

    /// What a deleted queue's doorbell holds is not a write to it.
    pub(crate) fn forget_doorbell(&mut self, qid: u16, completion: bool) {
        if let Some(r) = &self.regs {
            let k = completion as usize;
            let bell = match completion {
                false => regs::sq_tail_doorbell(qid),
                true => regs::cq_head_doorbell(qid),
            };
            self.ghost_bells[qid as usize][k] = r.load32(bell);
        }
    }

    /// Record a failed command in the error log: `lba` is the first LBA
    /// of a command that has one (0 otherwise).
    pub(crate) fn log_error(&mut self, sqid: u16, cid: u16, nsid: u32, lba: u64, st: Status) {
        self.error_count += 1;
        if self.errors.len() == ERROR_LOG {
            self.errors.pop_back();
        }
        self.errors.push_front(ErrorEntry {
            count: self.error_count,
            sqid,
            cid,
            status: st,
            lba,
            nsid,
        });
    }

    /// Complete held Asynchronous Event Requests with queued events.
    fn deliver_events(&mut self, dma: &mut dyn Dma<'_>, r: &Registers) -> usize {
        let mut n = 0;
        while !self.aers.is_empty() {
            let masked = self.masked_events;
            let Some(i) = self
                .events
                .iter()
                .position(|&ev| masked & 1 << (ev & 7) == 0)
            else {
                break;
            };
            if !self.cq_room(r, dma, 0) {
                self.full_cqs |= 1;
                break;
            }
            let cid = self.aers.remove(0);
            let ev = self.events.remove(i).expect("found");
            self.masked_events |= 1 << (ev & 7);
            let head = self.sqs[0].map(|s| s.head).unwrap_or(0);
            let cqe = Cqe {
                result: ev,
                sq_head: head as u16,
                sq_id: 0,
                cid,
                phase: false,
                status: Status::SUCCESS,
            };
            if !self.post(dma, 0, cqe) {
                self.fail();
                break;
            }
            n += 1;
        }
        n
    }

    /// Run what submission queue `qid` holds, up to the budget.
    fn drain(&mut self, r: &Registers, dma: &mut dyn Dma<'_>, qid: u16, out: &mut Service) {
        let Some(sq) = self.sqs[qid as usize] else {
            return;
        };
        let tail = self.doorbell(r, dma, qid, false);
        let shadowed = self.shadowed(qid);
        self.sq_bells[qid as usize].read(tail, shadowed);
        if tail >= sq.entries {
            if !sq.bad_doorbell {
                self.event_error(0x01);
                if let Some(s) = self.sqs[qid as usize].as_mut() {
                    s.bad_doorbell = true;
                }
            }
            return;
        }
        let mut head = sq.head;
        let mut budget = SQ_BUDGET;
        let mut raw = [0u8; SQE_SIZE];
        while head != tail && budget > 0 && !self.spent() {
            if !self.cq_room(r, dma, sq.cqid) {
                // Back-pressure: the driver has not consumed completions.
                // Nothing to do until it does, which its head doorbell
                // says (and wakes the engine with, should it sleep).
                self.full_cqs |= 1 << sq.cqid;
                return;
            }
            let at = sq.base + head as u64 * SQE_SIZE as u64;
            if dma.read(at, &mut raw).is_err() {
                self.fail();
                return;
            }
            head = (head + 1) % sq.entries;
            budget -= 1;
            if let Some(s) = self.sqs[qid as usize].as_mut() {
                s.head = head;
                s.bad_doorbell = false;
            }
            let sqe = Sqe::from_bytes(&raw);
            let outcome = if qid == 0 {
                self.admin(&sqe, dma)
            } else {
                self.io(qid, sq.cqid, &sqe, dma, out)
            };
            let (st, result) = match outcome {
                Outcome::Held => {
                    out.work += 1;
                    continue;
                }
                Outcome::Started => {
                    if let Some(cq) = self.cqs[sq.cqid as usize].as_mut() {
                        cq.reserved += 1;
                    }
                    out.work += 1;
                    continue;
                }
                Outcome::Done(st, result) => (st, result),
            };
            if !st.is_success() {
                let lba = match IoOp::try_from(sqe.opcode) {
                    Ok(IoOp::Read | IoOp::Write | IoOp::Compare | IoOp::WriteZeroes) if qid > 0 => {
                        sqe.slba()
                    }
                    _ => 0,
                };
                self.log_error(qid, sqe.cid, sqe.nsid, lba, st);
            }
            let cqid = sq.cqid;
            let cqe = Cqe {
                result,
                sq_head: head as u16,
                sq_id: qid,
                cid: sqe.cid,
                phase: false,
                status: st,
            };
            if !self.post(dma, cqid, cqe) {
                self.fail();
                return;
            }
            out.work += 1;
            out.requests += 1;
            self.counters.commands.fetch_add(1, Ordering::Relaxed);
            if self.sqs[qid as usize].is_none() || !self.running() {
                return;
            }
        }
        if head != tail {
            out.busy = true;
        }
    }
}

impl DeviceQueue for Controller {
    fn process(&mut self, desc: &mut Desc, _dma: &mut dyn Dma<'_>) {
        // The controller is driven through its registers, never through
        // ring requests (nor the socket's legacy path).
        desc.status = status::EOPNOTSUPP;
        desc.result = 0;
    }

    fn register_driven(&self) -> bool {
        true
    }

    fn quiesce(&mut self) {
        self.quiesce_io();
    }

    fn attach_registers(&mut self, r: Registers) {
        r.store64(regs::CAP, Controller::capabilities().to_u64());
        r.store32(regs::VS, regs::VERSION_1_4);
        r.store32(regs::CC, 0);
        r.store32(regs::CSTS, 0);
        self.regs = Some(r);
    }

    fn service(&mut self, dma: &mut dyn Dma<'_>) -> Service {
        let mut out = Service::default();
        let Some(r) = self.regs.clone() else {
            return out;
        };
        self.counters.polls.fetch_add(1, Ordering::Relaxed);
        let cc = r.load32(regs::CC);
        if cc != self.cc {
            self.control(cc, dma);
            out.work += 1;
        }
        if !self.running() {
            return out;
        }
        self.full_cqs = 0;
        self.pass_spent.set(0);
        if !self.inflight.is_empty() {
            self.complete_io(dma, &mut out);
        }
        self.drain(&r, dma, 0, &mut out);
        // The I/O queues in turn, starting one further each pass.
        let first = self.next_sq;
        self.next_sq = first % (QUEUES as u16 - 1) + 1;
        for k in 0..QUEUES as u16 - 1 {
            let qid = (first - 1 + k) % (QUEUES as u16 - 1) + 1;
            if self.sqs[qid as usize].is_some() && self.running() {
                self.drain(&r, dma, qid, &mut out);
            }
        }
        if let Some(ring) = self.ring.as_mut() {
            if ring.submit().is_err() {
                // The ring refuses work it took: wait for what it has
                // and run the rest synchronously from now on.
                self.quiesce_io();
                self.io = crate::IoEngine::Sync;
            }
        }
        if !self.inflight.is_empty() {
            self.complete_io(dma, &mut out);
        }
        self.audit_doorbells(&r, dma, out.work == 0);
        if !self.events.is_empty() {
            out.work += self.deliver_events(dma, &r);
        }
        out.holds_from = self.inflight.iter().flatten().map(|f| f.section).min();
        out.busy |= out.holds_from.is_some();
        if self.dbbuf.is_some() {
            // A register that moved to a value the shadow did not show
            // is news: the driver stores the shadow, fences, then the
            // register, so this pass may have read the shadow before its
            // store and the register (Acquire) after. Another pass reads
            // the shadow again, after this load, and sees it; a register
            // store after this load is the wake-up check's to see.
            let mut rung = false;
            for qid in 1..QUEUES {
                if self.sqs[qid].is_some() {
                    let v = r.load32(regs::sq_tail_doorbell(qid as u16));
                    rung |= self.sq_bells[qid].register_moved(v);
                }
            }
            for qid in self.full_io_cqs() {
                let q = qid as usize;
                let v = r.load32(regs::cq_head_doorbell(qid));
                rung |= self.cq_bells[q].register_moved(v);
            }
            out.work += usize::from(rung);
            if out.work > 0 || out.busy {
                self.armed = false;
            } else if self.needs_arming() {
                out.work += self.arm_event_index(&r, dma);
            }
        }
        out
    }

    fn prepare_sleep(&mut self) -> bool {
        let Some(r) = self.regs.clone() else {
            return false;
        };
        // The ring's NEED_WAKEUP is set and fenced: a driver that writes a
        // register after this sees it and wakes the engine; one that wrote
        // before is seen here.
        if r.load32(regs::CC) != self.cc {
            return true;
        }
        if !self.running() {
            return false;
        }
        if self.dbbuf.is_some() && self.needs_arming() {
            return true;
        }
        // A doorbell register that changed since the last pass read it is
        // the news (with shadow doorbells an I/O queue's register is
        // written only when EventIdx asks for it). The last pass ran
        // everything up to the tails it read, or said it was busy; a value
        // it found invalid stays unrun, and is no work until it changes.
        let submitted = (0..QUEUES as u16).any(|qid| {
            self.sqs[qid as usize].is_some_and(|sq| {
                !self.waits_for_room(&sq)
                    && r.load32(regs::sq_tail_doorbell(qid))
                        != self.sq_bells[qid as usize].mmio_seen
            })
        });
        let consumed = (0..QUEUES as u16)
            .filter(|q| self.full_cqs & 1 << q != 0)
            .any(|qid| {
                self.cqs[qid as usize].is_some()
                    && r.load32(regs::cq_head_doorbell(qid))
                        != self.cq_bells[qid as usize].mmio_seen
            });
        submitted || consumed
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        // Its ring's transfers end before its namespaces are free for
        // another controller (the engine quiesces a queue before it drops
        // it; this is for any other path).
        self.quiesce_io();
        // The client is gone (or released the queue): its namespaces are
        // free for another controller, its id for a new one.
        self.sub.controller_gone(self.cntlid);
    }
}
