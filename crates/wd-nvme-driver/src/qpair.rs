//! Queue pairs: a submission queue and its completion queue in shared
//! memory, with their doorbells.

use std::sync::Arc;
use std::time::{Duration, Instant};

use wd_nvme_msg::regs;
use wd_nvme_msg::{Cqe, IoOp, Sqe, CQE_SIZE, PAGE, SQE_SIZE};
use wd_sys::devmem::Registers;
use wrapdrive::{Queue, SharedBuf, Waker};

use crate::{queue_bytes, status_err, NvmeError, Result};

/// Bytes of PRP list each command slot of an I/O queue has: 64 entries,
/// enough for the largest transfer (MDTS) at any alignment, inside one
/// page.
const PRP_LIST_BYTES: u64 = 512;
/// Largest transfer one command may carry here.
pub const MAX_TRANSFER: u64 = PAGE * (PRP_LIST_BYTES / 8);

/// Whether a driver that moved a doorbell from `old` to `new` must write
/// the register, given the controller's EventIdx `event` (the rule of
/// Doorbell Buffer Config: the register is written when the move crossed
/// the index the controller asked to hear about).
pub fn need_event(event: u32, new: u32, old: u32) -> bool {
    (new.wrapping_sub(event).wrapping_sub(1) & 0xffff) < (new.wrapping_sub(old) & 0xffff)
}

/// A polling wait's clock: whether it ran out, and every few milliseconds
/// whether the host still lives (a dead host completes nothing, and the
/// caller should hear so at once, not at the timeout).
pub(crate) struct Liveness {
    start: Instant,
    checked: Instant,
    timeout: Duration,
    polls: u32,
}

impl Liveness {
    /// Interval between two checks of the host.
    const CHECK_EVERY: Duration = Duration::from_millis(10);

    pub(crate) fn new(timeout: Duration) -> Liveness {
        let now = Instant::now();
        Liveness {
            start: now,
            checked: now,
            timeout,
            polls: 0,
        }
    }

    /// Between two polls: spin, as a polled driver does, while a
    /// completion is near; past a few thousand polls (a slow command, a
    /// busy engine) give the core to whoever else runs on it, the engine
    /// perhaps.
    pub(crate) fn pause(&self) {
        if self.polls < 4096 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }

    /// True once the timeout passed; `HostGone` once the host closed the
    /// connection. Reads the clock every 64 calls only.
    pub(crate) fn expired(&mut self, waker: &Waker) -> Result<bool> {
        self.polls = self.polls.wrapping_add(1);
        if self.polls % 64 != 0 {
            return Ok(false);
        }
        let now = Instant::now();
        if now.duration_since(self.checked) >= Self::CHECK_EVERY {
            self.checked = now;
            waker.check_host()?;
        }
        Ok(now.duration_since(self.start) > self.timeout)
    }
}

/// A submission queue, its completion queue, and the command slots.
pub struct QueuePair {
    qid: u16,
    entries: u32,
    sq: Arc<SharedBuf>,
    cq: Arc<SharedBuf>,
    /// PRP lists, one slice per command slot (I/O queues).
    prp: Option<Arc<SharedBuf>>,
    /// Where the buffers go when the pair is dropped still shared with
    /// the controller (not deleted: an early return, a panic): kept until
    /// the controller's queue is released, as the controller may still
    /// write them (completions, reads).
    graveyard: Option<Graveyard>,
    /// Unshared: the controller no longer reaches the buffers.
    released: bool,
    sq_tail: u32,
    /// Tail as last written to the doorbell.
    sq_rung: u32,
    cq_head: u32,
    phase: bool,
    regs: Registers,
    waker: Waker,
    dbbuf: Option<Arc<(SharedBuf, SharedBuf)>>,
    free: Vec<u16>,
    /// The command in each slot, as pushed (to send again to a controller
    /// brought up again after a host restart).
    sent: Vec<Sqe>,
    done: Vec<Option<Cqe>>,
    /// Completions set aside in `done`.
    parked: usize,
    in_flight: usize,
    /// Commands whose waiter gave up (a timeout, a controller in fatal
    /// state): their ids stay taken until their completions come, which
    /// are then dropped, or until the queue is made again.
    given_up: Vec<bool>,
    /// Per command id: pushed and its completion not yet read (what
    /// `in_flight` counts), so that telling a completion's id apart is
    /// one look, not a search of `free`.
    outstanding: Vec<bool>,
}

/// Queue memory dropped while the controller may still write it: freed
/// with the controller, after its queue.
pub(crate) type Graveyard = Arc<std::sync::Mutex<Vec<Arc<SharedBuf>>>>;

impl Drop for QueuePair {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        if let Some(g) = &self.graveyard {
            let mut g = g.lock().unwrap_or_else(|e| e.into_inner());
            g.push(self.sq.clone());
            g.push(self.cq.clone());
            g.extend(self.prp.clone());
        }
    }
}

impl QueuePair {
    pub(crate) fn new(
        queue: &mut Queue,
        qid: u16,
        entries: u32,
        regs: Registers,
        waker: Waker,
        dbbuf: Option<Arc<(SharedBuf, SharedBuf)>>,
        graveyard: Option<Graveyard>,
    ) -> Result<QueuePair> {
        let sq = SharedBuf::new(queue_bytes(entries, SQE_SIZE))?;
        let cq = SharedBuf::new(queue_bytes(entries, CQE_SIZE))?;
        // Reused allocator memory is not zeroed: a stale phase tag would
        // read as a completion.
        cq.write(0, &vec![0u8; cq.len() as usize]);
        let prp = if qid > 0 {
            Some(SharedBuf::new((entries as u64 * PRP_LIST_BYTES) as usize)?)
        } else {
            None
        };
        let mut shared: Vec<&SharedBuf> = Vec::with_capacity(3);
        for b in [Some(&sq), Some(&cq), prp.as_ref()].into_iter().flatten() {
            if let Err(e) = queue.share(b.addr(), b.len()) {
                // Nothing stays reachable by the controller once the
                // buffers go back to the allocator.
                for s in shared {
                    let _ = queue.unshare(s.addr(), s.len());
                }
                return Err(e.into());
            }
            shared.push(b);
        }
        if let Some(d) = &dbbuf {
            // The shadow tail and head start at 0, like the queue.
            let sq_off = (regs::sq_tail_doorbell(qid) - regs::DOORBELLS) as u64;
            d.0.store_u32(sq_off, 0);
            d.0.store_u32(sq_off + 4, 0);
        }
        Ok(QueuePair {
            qid,
            entries,
            sq: Arc::new(sq),
            cq: Arc::new(cq),
            prp: prp.map(Arc::new),
            graveyard,
            released: false,
            sq_tail: 0,
            sq_rung: 0,
            cq_head: 0,
            phase: true,
            regs,
            waker,
            dbbuf,
            // Command ids are slots: at most entries - 1 commands are
            // outstanding, so the submission queue never overflows.
            free: (0..(entries - 1) as u16).rev().collect(),
            sent: vec![Sqe::default(); entries as usize],
            done: vec![None; entries as usize],
            parked: 0,
            in_flight: 0,
            given_up: vec![false; entries as usize],
            outstanding: vec![false; entries as usize],
        })
    }

    /// Queue id.
    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// The handle that wakes the engine and tells whether the host lives.
    pub(crate) fn waker(&self) -> &Waker {
        &self.waker
    }

    /// Take the queue's memory out of the controller's domain, before the
    /// buffers go back to the allocator (the controller must no longer
    /// use the queue: deleted, or never created).
    pub(crate) fn unshare(&mut self, queue: &mut Queue) -> Result<()> {
        for b in [Some(&self.sq), Some(&self.cq), self.prp.as_ref()]
            .into_iter()
            .flatten()
        {
            queue.unshare(b.addr(), b.len())?;
        }
        self.released = true;
        Ok(())
    }

    /// Entries.
    pub fn entries(&self) -> u32 {
        self.entries
    }

    /// Commands submitted and not yet reaped.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Commands that can still be submitted.
    pub fn room(&self) -> usize {
        self.free.len()
    }

    /// The command id the next [`QueuePair::push`] assigns (None when
    /// full): a caller that keeps one data buffer per command slot picks
    /// it with this.
    pub fn next_cid(&self) -> Option<u16> {
        self.free.last().copied()
    }

    pub(crate) fn sq_base(&self) -> u64 {
        self.sq.addr()
    }

    pub(crate) fn cq_base(&self) -> u64 {
        self.cq.addr()
    }

    /// Write a command into the submission queue without ringing the
    /// doorbell; its command id is assigned here and returned.
    pub fn push(&mut self, mut sqe: Sqe) -> Result<u16> {
        let cid = self.free.pop().ok_or(NvmeError::Full)?;
        sqe.cid = cid;
        self.sent[cid as usize] = sqe;
        self.write_sqe(&sqe);
        self.in_flight += 1;
        self.outstanding[cid as usize] = true;
        Ok(cid)
    }

    fn write_sqe(&mut self, sqe: &Sqe) {
        self.sq
            .write(self.sq_tail as u64 * SQE_SIZE as u64, &sqe.to_bytes());
        self.sq_tail = (self.sq_tail + 1) % self.entries;
    }

    /// Start over on a controller brought up again (a restarted host):
    /// the queue is empty there, so head, tail and phase start anew; what
    /// was in flight stays counted (see [`QueuePair::resubmit`]).
    pub(crate) fn rebind(&mut self, regs: Registers, waker: Waker) {
        self.regs = regs;
        self.waker = waker;
        self.sq_tail = 0;
        self.sq_rung = 0;
        self.cq_head = 0;
        self.phase = true;
        self.cq.write(0, &vec![0u8; self.cq.len() as usize]);
        if let Some(d) = &self.dbbuf {
            let sq_off = (regs::sq_tail_doorbell(self.qid) - regs::DOORBELLS) as u64;
            d.0.store_u32(sq_off, 0);
            d.0.store_u32(sq_off + 4, 0);
        }
    }

    /// Send again every command still in flight (not completed, not
    /// abandoned), with its command id, data addresses and PRP list
    /// unchanged: for NVMe I/O commands this is safe as long as their
    /// buffers were left alone while in flight (a write writes the same
    /// data again).
    pub(crate) fn resubmit(&mut self) -> Result<usize> {
        let mut n = 0;
        for cid in 0..(self.entries - 1) as u16 {
            if !self.outstanding[cid as usize] {
                continue;
            }
            if std::mem::take(&mut self.given_up[cid as usize]) {
                // Its caller was told it failed: not sent again, and its
                // completion will not come from the old controller.
                self.in_flight -= 1;
                self.outstanding[cid as usize] = false;
                self.free.push(cid);
                continue;
            }
            let sqe = self.sent[cid as usize];
            self.write_sqe(&sqe);
            n += 1;
        }
        self.ring()?;
        Ok(n)
    }

    /// Whether command id `cid` is held: in flight, or completed and set
    /// aside (not yet handed out).
    fn taken(&self, cid: u16) -> bool {
        self.outstanding[cid as usize] || self.done[cid as usize].is_some()
    }

    /// Give up on command `cid` (its controller is gone): its slot is free
    /// again and it is not sent again.
    pub(crate) fn abandon(&mut self, cid: u16) {
        if (cid as usize) < self.done.len() - 1 && self.taken(cid) {
            self.given_up[cid as usize] = false;
            // Set aside (completed, not handed out) or still in flight.
            if self.done[cid as usize].take().is_some() {
                self.parked -= 1;
            } else {
                self.in_flight -= 1;
                self.outstanding[cid as usize] = false;
            }
            self.free.push(cid);
        }
    }

    /// The waiter of command `cid` gave up on it while its controller
    /// lives (a caller of [`QueuePair::take`] that stops waiting; a failed
    /// [`IoQueue::wait_for`] does this itself): a completion already set
    /// aside is dropped, a later one will be, and its id is free again
    /// then (not before: it must not complete a later command).
    pub fn give_up(&mut self, cid: u16) {
        let slot = cid as usize;
        if slot >= self.done.len() - 1 || !self.taken(cid) {
            return;
        }
        if self.done[slot].take().is_some() {
            self.parked -= 1;
            self.free.push(cid);
        } else {
            self.given_up[slot] = true;
        }
    }

    /// Give up on every command not yet handed out.
    pub(crate) fn abandon_all(&mut self) {
        for cid in 0..(self.entries - 1) as u16 {
            self.abandon(cid);
        }
    }

    /// Tell the controller about pushed commands: the doorbell register,
    /// or the shadow doorbell and the register only when EventIdx asks;
    /// then wake the engine if it sleeps.
    pub fn ring(&mut self) -> Result<()> {
        if self.sq_tail == self.sq_rung {
            return Ok(());
        }
        let (old, new) = (self.sq_rung, self.sq_tail);
        self.sq_rung = new;
        let reg = regs::sq_tail_doorbell(self.qid);
        if let (Some(d), true) = (&self.dbbuf, self.qid > 0) {
            let off = (reg - regs::DOORBELLS) as u64;
            // Release: the entries written above are visible to a
            // controller that sees the new tail.
            d.0.store_u32(off, new);
            // SeqCst fence: pairs with the controller's fence between its
            // EventIdx store and its shadow re-read (one of the two sees
            // the other's store).
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
            if !need_event(d.1.load_u32(off), new, old) {
                return Ok(());
            }
        }
        self.regs.store32(reg, new);
        self.waker.wake()?;
        Ok(())
    }

    /// Push and ring.
    pub fn submit(&mut self, sqe: Sqe) -> Result<u16> {
        let cid = self.push(sqe)?;
        self.ring()?;
        Ok(cid)
    }

    /// Take the completions that arrived, appending them to `out`.
    pub fn reap(&mut self, out: &mut Vec<Cqe>) -> Result<usize> {
        self.reap_up_to(out, usize::MAX)
    }

    /// Take at most `max` completions: first those a [`QueuePair::take`]
    /// set aside, then new ones. A command's id is free again once its
    /// completion is handed out here or by `take` (not while it is set
    /// aside: the next command with that id would find it).
    pub fn reap_up_to(&mut self, out: &mut Vec<Cqe>, max: usize) -> Result<usize> {
        let mut n = 0;
        if self.parked > 0 {
            for slot in self.done.iter_mut() {
                if n == max {
                    return Ok(n);
                }
                if let Some(c) = slot.take() {
                    self.free.push(c.cid);
                    out.push(c);
                    n += 1;
                    self.parked -= 1;
                }
            }
        }
        let first = out.len();
        let r = self.read_new(out, max - n, n > 0);
        for c in &out[first..] {
            self.free.push(c.cid);
        }
        Ok(n + r?)
    }

    /// Read at most `max` new completions onto the end of `out`, their
    /// ids still taken. A completion for no command in flight (a
    /// controller's bug) is consumed and an error, but only when nothing
    /// came before it in this call (`handed`: the caller handed out some
    /// already): what did is handed out first.
    fn read_new(&mut self, out: &mut Vec<Cqe>, max: usize, handed: bool) -> Result<usize> {
        let mut n = 0;
        let mut consumed = false;
        let mut bad = None;
        while n < max {
            let at = self.cq_head as u64 * CQE_SIZE as u64;
            // Acquire: pairs with the controller's Release store of this
            // dword after the rest of the entry.
            let dw3 = self.cq.load_u32(at + 12);
            if (dw3 >> 16 & 1 != 0) != self.phase {
                break;
            }
            let mut raw = [0u8; CQE_SIZE];
            self.cq.read(at, &mut raw);
            let cqe = Cqe::from_bytes(&raw);
            let slot = cqe.cid as usize;
            // Not free, not set aside, not earlier in this batch: all
            // three clear `outstanding`.
            let outstanding = slot < self.done.len() - 1 && self.outstanding[slot];
            if !outstanding && (n > 0 || handed) {
                break;
            }
            self.cq_head += 1;
            if self.cq_head == self.entries {
                self.cq_head = 0;
                self.phase = !self.phase;
            }
            consumed = true;
            if !outstanding {
                bad = Some(cqe.cid);
                break;
            }
            self.in_flight -= 1;
            self.outstanding[slot] = false;
            if std::mem::take(&mut self.given_up[slot]) {
                // Nobody waits for it any more.
                self.free.push(cqe.cid);
                continue;
            }
            out.push(cqe);
            n += 1;
        }
        if consumed {
            // No EventIdx check and no wake-up: a controller holds commands
            // back only while their completion queue is full, and this
            // driver never fills one (at most `entries - 1` commands in
            // flight, completed ones included until reaped), so a head
            // here is never news the engine waits for.
            let reg = regs::cq_head_doorbell(self.qid);
            match (&self.dbbuf, self.qid > 0) {
                (Some(d), true) => d.0.store_u32((reg - regs::DOORBELLS) as u64, self.cq_head),
                _ => self.regs.store32(reg, self.cq_head),
            }
        }
        match bad {
            Some(cid) => Err(NvmeError::Protocol(format!(
                "completion for command id {cid} that is not outstanding"
            ))),
            None => Ok(n),
        }
    }

    /// The completion of command `cid`, if it arrived (others that arrive
    /// meanwhile are kept for their own `take`).
    pub fn take(&mut self, cid: u16) -> Result<Option<Cqe>> {
        if let Some(c) = self.done.get_mut(cid as usize).and_then(Option::take) {
            self.parked -= 1;
            self.free.push(cid);
            return Ok(Some(c));
        }
        let mut got = Vec::new();
        // Only new completions: the parked ones stay where they are.
        let r = self.read_new(&mut got, usize::MAX, false);
        let mut mine = None;
        for c in got {
            if c.cid == cid {
                self.free.push(cid);
                mine = Some(c);
            } else {
                self.done[c.cid as usize] = Some(c);
                self.parked += 1;
            }
        }
        r?;
        Ok(mine)
    }

    /// Fill in PRP1/PRP2 (and this command slot's PRP list) for `len`
    /// bytes at `addr`. The slot is the command id the next `push` uses.
    fn prps(&mut self, sqe: &mut Sqe, addr: u64, len: u64) -> Result<()> {
        if len == 0 || len > MAX_TRANSFER {
            return Err(NvmeError::Invalid(format!(
                "transfer of {len} bytes (1..={MAX_TRANSFER})"
            )));
        }
        if addr % 4 != 0 {
            return Err(NvmeError::Invalid(
                "data must be 4-byte aligned (PRP rule)".into(),
            ));
        }
        sqe.prp1 = addr;
        let first = len.min(PAGE - addr % PAGE);
        let rest = len - first;
        sqe.prp2 = 0;
        if rest == 0 {
            return Ok(());
        }
        if rest <= PAGE {
            sqe.prp2 = addr + first;
            return Ok(());
        }
        let slot = *self.free.last().ok_or(NvmeError::Full)? as u64;
        let prp = self
            .prp
            .as_ref()
            .ok_or_else(|| NvmeError::Invalid("the admin queue has no PRP lists".into()))?;
        let base = slot * PRP_LIST_BYTES;
        let pages = rest.div_ceil(PAGE);
        let mut list = Vec::with_capacity(pages as usize * 8);
        for k in 0..pages {
            list.extend_from_slice(&(addr + first + k * PAGE).to_le_bytes());
        }
        prp.write(base, &list);
        sqe.prp2 = prp.addr() + base;
        Ok(())
    }
}

/// An I/O queue pair with read/write helpers.
pub struct IoQueue {
    qp: QueuePair,
    /// The controller it belongs to (`Controller::id`).
    pub(crate) owner: u64,
    /// The controller incarnation the queue was created on (see
    /// `Controller::restore_io_queue`).
    pub(crate) incarnation: u64,
}

/// A namespace as the I/O helpers need it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Namespace {
    /// Namespace id.
    pub nsid: u32,
    /// Logical block size in bytes.
    pub block: u64,
    /// Blocks.
    pub blocks: u64,
}

impl IoQueue {
    pub(crate) fn new(qp: QueuePair, owner: u64, incarnation: u64) -> IoQueue {
        IoQueue {
            qp,
            owner,
            incarnation,
        }
    }

    pub(crate) fn pair_mut(&mut self) -> &mut QueuePair {
        &mut self.qp
    }

    pub(crate) fn into_pair(self) -> QueuePair {
        self.qp
    }

    /// Queue id.
    pub fn qid(&self) -> u16 {
        self.qp.qid
    }

    /// The raw queue pair (raw SQEs, batching, reaping).
    pub fn pair(&mut self) -> &mut QueuePair {
        &mut self.qp
    }

    /// Push a read, write or compare of `len` bytes at block `slba` from
    /// or to memory at `addr` (shared with the controller), without
    /// ringing; returns the command id.
    pub fn push_rw(
        &mut self,
        op: IoOp,
        ns: &Namespace,
        slba: u64,
        addr: u64,
        len: u64,
    ) -> Result<u16> {
        if len == 0 || len % ns.block != 0 {
            return Err(NvmeError::Invalid(format!(
                "length {len} is not a whole number of {}-byte blocks",
                ns.block
            )));
        }
        let nlb = len / ns.block;
        if nlb > 0x1_0000 {
            return Err(NvmeError::Invalid("more than 65536 blocks".into()));
        }
        let mut sqe = Sqe {
            opcode: op as u8,
            nsid: ns.nsid,
            ..Sqe::default()
        };
        sqe.cdw[0] = slba as u32;
        sqe.cdw[1] = (slba >> 32) as u32;
        sqe.cdw[2] = (nlb - 1) as u32;
        self.qp.prps(&mut sqe, addr, len)?;
        self.qp.push(sqe)
    }

    /// Run one command and wait for it (polling).
    pub fn run(&mut self, what: &str, sqe: Sqe) -> Result<Cqe> {
        let cid = self.qp.push(sqe)?;
        self.ring_and_wait(what, cid)
    }

    /// Ring for pushed command `cid` and wait for it; a ring or a wait
    /// that fails gives the command up (see [`IoQueue::wait_for`]).
    fn ring_and_wait(&mut self, what: &str, cid: u16) -> Result<Cqe> {
        let r = self.qp.ring().and_then(|()| self.wait_once(cid));
        status_err(what, &self.settle(cid, r)?)
    }

    /// Wait (polling) for command `cid`'s completion, whatever its status.
    /// A wait that fails gives the command up, as nobody will take its
    /// completion: when the host went away it is not sent again by
    /// [`IoQueue`]'s restore (the caller hears of it, and runs it again on
    /// a controller brought up again); on a timeout or a failed
    /// controller its id comes back with its late completion, which must
    /// not complete a later command.
    pub fn wait_for(&mut self, cid: u16) -> Result<Cqe> {
        let r = self.wait_once(cid);
        self.settle(cid, r)
    }

    /// Give command `cid` up when `r` failed.
    fn settle(&mut self, cid: u16, r: Result<Cqe>) -> Result<Cqe> {
        match &r {
            Err(e) if e.host_gone() => self.qp.abandon(cid),
            Err(_) => self.qp.give_up(cid),
            Ok(_) => {}
        }
        r
    }

    fn wait_once(&mut self, cid: u16) -> Result<Cqe> {
        let what = || format!("command {cid}");
        let mut liveness = Liveness::new(Duration::from_secs(30));
        loop {
            if let Some(c) = self.qp.take(cid)? {
                return Ok(c);
            }
            if self.qp.regs.load32(regs::CSTS) & regs::CSTS_CFS != 0 {
                return Err(NvmeError::Fatal(what()));
            }
            if liveness.expired(&self.qp.waker)? {
                return Err(NvmeError::Timeout(what()));
            }
            liveness.pause();
        }
    }

    fn rw(&mut self, op: IoOp, ns: &Namespace, slba: u64, addr: u64, len: u64) -> Result<()> {
        let cid = self.push_rw(op, ns, slba, addr, len)?;
        self.ring_and_wait(&format!("{op:?} of {len} bytes at block {slba}"), cid)
            .map(|_| ())
    }

    /// The completions that arrived (at most `max`), without waiting.
    pub fn take_ready(&mut self, max: usize) -> Result<Vec<Cqe>> {
        let mut out = Vec::new();
        self.qp.reap_up_to(&mut out, max)?;
        Ok(out)
    }

    /// Read `len` bytes at block `slba` into `buf` at `off`.
    pub fn read(
        &mut self,
        ns: &Namespace,
        slba: u64,
        buf: &SharedBuf,
        off: u64,
        len: u64,
    ) -> Result<()> {
        check_buf(buf, off, len)?;
        self.rw(IoOp::Read, ns, slba, buf.addr() + off, len)
    }

    /// Write `len` bytes of `buf` at `off` to block `slba`.
    pub fn write(
        &mut self,
        ns: &Namespace,
        slba: u64,
        buf: &SharedBuf,
        off: u64,
        len: u64,
    ) -> Result<()> {
        check_buf(buf, off, len)?;
        self.rw(IoOp::Write, ns, slba, buf.addr() + off, len)
    }

    /// Compare `len` bytes at block `slba` with `buf` at `off`
    /// (a mismatch is a Compare Failure status error).
    pub fn compare(
        &mut self,
        ns: &Namespace,
        slba: u64,
        buf: &SharedBuf,
        off: u64,
        len: u64,
    ) -> Result<()> {
        check_buf(buf, off, len)?;
        self.rw(IoOp::Compare, ns, slba, buf.addr() + off, len)
    }

    /// Zero `nlb` blocks at `slba` (deallocating them when `deallocate`).
    pub fn write_zeroes(
        &mut self,
        ns: &Namespace,
        slba: u64,
        nlb: u32,
        deallocate: bool,
    ) -> Result<()> {
        if nlb == 0 || nlb > 0x1_0000 {
            return Err(NvmeError::Invalid("1..=65536 blocks".into()));
        }
        let mut sqe = Sqe {
            opcode: IoOp::WriteZeroes as u8,
            nsid: ns.nsid,
            ..Sqe::default()
        };
        sqe.cdw[0] = slba as u32;
        sqe.cdw[1] = (slba >> 32) as u32;
        sqe.cdw[2] = (nlb - 1) | (deallocate as u32) << 25;
        self.run(&format!("write zeroes at block {slba}"), sqe)?;
        Ok(())
    }

    /// Deallocate ranges (Dataset Management); `ranges` lives in shared
    /// memory `buf` at `off`, as 16-byte range entries.
    pub fn deallocate(
        &mut self,
        ns: &Namespace,
        buf: &SharedBuf,
        off: u64,
        count: usize,
    ) -> Result<()> {
        if count == 0 || count > 256 {
            return Err(NvmeError::Invalid("1..=256 ranges".into()));
        }
        check_buf(buf, off, count as u64 * 16)?;
        let mut sqe = Sqe {
            opcode: IoOp::Dsm as u8,
            nsid: ns.nsid,
            ..Sqe::default()
        };
        sqe.cdw[0] = count as u32 - 1;
        sqe.cdw[1] = 4;
        self.qp
            .prps(&mut sqe, buf.addr() + off, count as u64 * 16)?;
        self.run("dataset management (deallocate)", sqe)?;
        Ok(())
    }

    /// Flush the namespace's volatile write cache.
    pub fn flush(&mut self, ns: &Namespace) -> Result<()> {
        self.run(
            "flush",
            Sqe {
                opcode: IoOp::Flush as u8,
                nsid: ns.nsid,
                ..Sqe::default()
            },
        )?;
        Ok(())
    }
}

fn check_buf(buf: &SharedBuf, off: u64, len: u64) -> Result<()> {
    match off.checked_add(len) {
        Some(end) if end <= buf.len() => Ok(()),
        _ => Err(NvmeError::Invalid(format!(
            "{off}+{len} is outside the {}-byte buffer",
            buf.len()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::need_event;

    #[test]
    fn event_index_rule() {
        // The controller asked to hear when the tail passes 5.
        assert!(need_event(5, 6, 5));
        assert!(need_event(5, 9, 3));
        assert!(!need_event(5, 5, 3));
        assert!(!need_event(9, 6, 5));
        // Wrapping queue indices.
        assert!(need_event(1023, 0, 1023));
    }
}
