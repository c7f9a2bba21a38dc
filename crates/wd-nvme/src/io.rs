//! NVM command set I/O commands: reads and writes on the controller's
//! io_uring into client memory the engine keeps pinned (the one `unsafe`
//! of the device: handing that memory to the kernel), everything else
//! synchronously against the store.
#![allow(unsafe_code)]

use std::sync::Arc;
use std::time::Instant;

use wd_device::{Access, Dma, Service};
use wd_nvme_msg::cmd::{DsmRange, DSM_RANGE_SIZE};
use wd_nvme_msg::{IoOp, Sqe, Status, PAGE};
use wd_sys::file::Allocate;

use crate::ctrl::{Controller, InFlight, Outcome, MDTS, SYNC_COST, ZERO_COST};
use crate::store::Namespace;
use crate::xfer;
use wd_nvme_msg::Cqe;
use wd_sys::uring::{DeviceRing, Transfer};

/// Largest local buffer a compare or zero fill uses at once.
const CHUNK: usize = 1 << 20;
/// Transfers one controller keeps on its I/O ring.
const RING_ENTRIES: u32 = 256;

fn io_status(e: &wd_sys::SysError) -> Status {
    io_errno(e.errno())
}

fn io_errno(errno: i32) -> Status {
    match errno {
        // ENOSPC / EDQUOT: the store is full.
        28 | 122 => Status::WRITE_FAULT,
        _ => Status::INTERNAL_ERROR,
    }
}

impl Controller {
    pub(crate) fn io(
        &mut self,
        sqid: u16,
        cqid: u16,
        sqe: &Sqe,
        dma: &mut dyn Dma<'_>,
        out: &mut Service,
    ) -> Outcome {
        let started = Instant::now();
        let o = match self.run(sqid, cqid, sqe, dma, out) {
            Some(st) => Outcome::Done(st, 0),
            None => Outcome::Started,
        };
        self.health.busy_ns += started.elapsed().as_nanos() as u64;
        o
    }

    /// Run a command: its status, or None when it went to the I/O ring.
    fn run(
        &mut self,
        sqid: u16,
        cqid: u16,
        sqe: &Sqe,
        dma: &mut dyn Dma<'_>,
        out: &mut Service,
    ) -> Option<Status> {
        if sqe.fuse != 0 {
            return Some(Status::INVALID_FIELD);
        }
        let op = match IoOp::try_from(sqe.opcode) {
            Ok(op) => op,
            Err(st) => return Some(st),
        };
        if op == IoOp::Flush && sqe.nsid == 0xffff_ffff {
            return Some(self.flush_all());
        }
        let Some(ns) = self.active.get(&sqe.nsid).cloned() else {
            return Some(Status::INVALID_NAMESPACE);
        };
        Some(match op {
            IoOp::Flush => self.flush(&ns),
            IoOp::Read | IoOp::Write | IoOp::Compare => {
                let (off, len) = match Self::range(&ns, sqe.slba(), sqe.nlb()) {
                    Ok(r) => r,
                    Err(st) => return Some(st),
                };
                if len > PAGE << MDTS {
                    return Some(Status::INVALID_FIELD);
                }
                if let Err(st) = xfer::segments(sqe, len, dma, &mut self.segs) {
                    return Some(st);
                }
                let write = op == IoOp::Write;
                let sync = write && self.write_through(sqe);
                if op != IoOp::Compare
                    && self.start(sqid, cqid, sqe, &ns, write, sync, off, len, dma)
                {
                    return None;
                }
                // Moved here and now, in the pass: counted against it.
                self.charge(len);
                let st = match op {
                    IoOp::Read => self.read(&ns, off, dma),
                    IoOp::Write => self.write(&ns, off, sync, dma),
                    _ => self.compare(&ns, off, dma),
                };
                if st.is_success() {
                    out.bytes += len;
                    self.moved(write, len);
                }
                st
            }
            IoOp::WriteZeroes => {
                let (off, len) = match Self::range(&ns, sqe.slba(), sqe.nlb()) {
                    Ok(r) => r,
                    Err(st) => return Some(st),
                };
                // DEAC: deallocate (a deallocated block reads as zeroes).
                let how = if sqe.cdw(12) >> 25 & 1 != 0 {
                    Allocate::PunchHole
                } else {
                    Allocate::ZeroRange
                };
                let mut st = self.zero(&ns, off, len, how);
                if st.is_success() && self.write_through(sqe) {
                    st = self.flush(&ns);
                }
                if st.is_success() {
                    self.health.writes += 1;
                }
                st
            }
            IoOp::Dsm => match self.dsm(&ns, sqe, dma) {
                st if st.is_success() && !self.features.write_cache => self.flush(&ns),
                st => st,
            },
        })
    }

    /// Whether a command that writes must be on the store's stable media
    /// when it completes: Force Unit Access (CDW12 bit 30, for Write and
    /// Write Zeroes), or the volatile write cache turned off.
    fn write_through(&self, sqe: &Sqe) -> bool {
        sqe.cdw(12) >> 30 & 1 != 0 || !self.features.write_cache
    }

    /// Count a finished read or write.
    fn moved(&mut self, write: bool, len: u64) {
        self.counters
            .bytes
            .fetch_add(len, std::sync::atomic::Ordering::Relaxed);
        if write {
            self.health.bytes_written += len;
            self.health.writes += 1;
        } else {
            self.health.bytes_read += len;
            self.health.reads += 1;
        }
    }

    /// Start a read or write of the command's segments on the I/O ring,
    /// holding their memory until it completes. False when it must run
    /// now instead (synchronous engine, no ring, memory that cannot be
    /// held, a full ring).
    #[allow(clippy::too_many_arguments)]
    fn start(
        &mut self,
        sqid: u16,
        cqid: u16,
        sqe: &Sqe,
        ns: &Arc<Namespace>,
        write: bool,
        sync: bool,
        off: u64,
        len: u64,
        dma: &mut dyn Dma<'_>,
    ) -> bool {
        if self.io != crate::IoEngine::Ring {
            return false;
        }
        if self.ring.is_none() {
            match DeviceRing::new(RING_ENTRIES) {
                Ok(r) => self.ring = Some(r),
                Err(_) => {
                    // No io_uring here (or refused): run synchronously.
                    self.io = crate::IoEngine::Sync;
                    return false;
                }
            }
        }
        let ring = self.ring.as_mut().expect("made above");
        if ring.in_flight() + self.segs.len() > RING_ENTRIES as usize {
            return false;
        }
        let access = if write { Access::Read } else { Access::Write };
        let mut held = Vec::with_capacity(self.segs.len());
        let mut pos = off;
        for &(at, n) in &self.segs {
            match dma.hold(at, n, access) {
                // Only transfers that go around the page cache are worth
                // the ring: a page-cache hit is faster done here and now
                // than handed to the kernel's workers. (MDTS keeps a
                // segment far below what one ring entry moves.)
                Some(h)
                    if ns.aligned(pos, n, h.as_ptr() as u64)
                        && n <= wd_sys::uring::MAX_READ as u64 =>
                {
                    held.push(h)
                }
                _ => return false,
            }
            pos += n;
        }
        let tag = self.free_tags.pop().unwrap_or_else(|| {
            self.inflight.push(None);
            self.inflight.len() - 1
        });
        let how = if write {
            Transfer::Write
        } else {
            Transfer::Read
        };
        let mut at = off;
        for (seg, h) in held.iter().enumerate() {
            let (fd, pos) = ns.fd_for(at, h.len() as u64, h.as_ptr() as u64);
            // SAFETY: the held memory stays pinned by the engine and the
            // namespace (its descriptors) stays alive in `inflight[tag]`
            // until this transfer is reaped (`complete_io`) or the ring
            // is drained (`quiesce_io`, Drop).
            let pushed = unsafe { ring.push(how, fd, h, pos, (tag as u64) << 8 | seg as u64) };
            debug_assert!(pushed, "room was checked");
            at += h.len() as u64;
        }
        self.inflight[tag] = Some(InFlight {
            sqid,
            cqid,
            cid: sqe.cid,
            nsid: sqe.nsid,
            slba: sqe.slba(),
            write,
            sync,
            len,
            remaining: held.len() as u32,
            status: Status::SUCCESS,
            section: dma.section(),
            ns: ns.clone(),
            _held: held,
        });
        true
    }

    /// Post the commands whose transfers all finished.
    pub(crate) fn complete_io(&mut self, dma: &mut dyn Dma<'_>, out: &mut Service) {
        let Some(ring) = self.ring.as_mut() else {
            return;
        };
        self.reaped.clear();
        ring.reap(&mut self.reaped);
        self.complete_reaped(dma, out);
    }

    /// Account the transfers in `self.reaped`, posting each command whose
    /// last transfer it was.
    fn complete_reaped(&mut self, dma: &mut dyn Dma<'_>, out: &mut Service) {
        let mut ready = std::mem::take(&mut self.finished);
        for i in 0..self.reaped.len() {
            let d = self.reaped[i];
            let (tag, seg) = ((d.user_data >> 8) as usize, (d.user_data & 0xff) as usize);
            let Some(f) = self.inflight.get_mut(tag).and_then(Option::as_mut) else {
                continue;
            };
            let want = f._held.get(seg).map_or(0, |h| h.len() as i64);
            if d.result < 0 {
                f.status = io_errno(-d.result);
            } else if (d.result as i64) < want && f.status.is_success() {
                // The store is sized to every namespace: only a failing
                // store transfers short.
                f.status = if f.write {
                    Status::WRITE_FAULT
                } else {
                    Status::UNRECOVERED_READ_ERROR
                };
            }
            f.remaining -= 1;
            if f.remaining > 0 {
                continue;
            }
            let f = self.inflight[tag].take().expect("present");
            self.free_tags.push(tag);
            ready.push(f);
        }
        // Write-through commands finished together share one sync of
        // their namespace (each had one: a pass that reaped a ring's
        // worth of them made hundreds, every other client waiting).
        let mut synced: Vec<(u32, Status)> = Vec::new();
        for f in ready.iter_mut() {
            if !f.sync {
                continue;
            }
            f.sync = false;
            if !f.status.is_success() {
                continue;
            }
            let st = match synced.iter().find(|(n, _)| *n == f.ns.nsid) {
                Some(&(_, st)) => st,
                None => {
                    let st = self.flush(&f.ns);
                    synced.push((f.ns.nsid, st));
                    st
                }
            };
            f.status = st;
        }
        for f in ready.drain(..) {
            // A controller that failed posting one posts no more (its
            // ring was quiesced, as before).
            if self.running() {
                self.finish(f, dma, out);
            }
        }
        self.finished = ready;
    }

    fn finish(&mut self, mut f: InFlight, dma: &mut dyn Dma<'_>, out: &mut Service) {
        if let Some(cq) = self.cqs[f.cqid as usize].as_mut() {
            cq.reserved = cq.reserved.saturating_sub(1);
        } else {
            // Its completion queue is gone (a reset): nothing to post.
            return;
        }
        if f.sync && f.status.is_success() {
            // Write-through, as for a synchronous write: durable before
            // the completion (O_DIRECT leaves the device's cache and the
            // file's allocation to a sync).
            let (fd, _) = f.ns.buffered_at(0);
            if let Err(e) = wd_sys::file::fdatasync(fd) {
                f.status = io_status(&e);
            }
        }
        if f.status.is_success() {
            out.bytes += f.len;
            self.moved(f.write, f.len);
        } else {
            self.log_error(f.sqid, f.cid, f.nsid, f.slba, f.status);
        }
        let head = self.sqs[f.sqid as usize].map_or(0, |s| s.head);
        let cqe = Cqe {
            result: 0,
            sq_head: head as u16,
            sq_id: f.sqid,
            cid: f.cid,
            phase: false,
            status: f.status,
        };
        if !self.post(dma, f.cqid, cqe) {
            self.fail();
            return;
        }
        out.work += 1;
        out.requests += 1;
        self.counters
            .commands
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Wait for the transfers on the ring of the commands on namespace
    /// `nsid` (of every command: None) and post those commands: a
    /// submission queue is being deleted, a namespace detached (a write
    /// landing later could reach the next controller's data), or the
    /// controller shut down.
    pub(crate) fn settle(&mut self, dma: &mut dyn Dma<'_>, nsid: Option<u32>) {
        let mut sink = Service::default();
        let waiting = |c: &Controller| {
            c.inflight
                .iter()
                .flatten()
                .any(|f| nsid.is_none_or(|n| f.ns.nsid == n))
        };
        while waiting(self) {
            let Some(ring) = self.ring.as_mut() else {
                break;
            };
            self.reaped.clear();
            if ring.wait(&mut self.reaped).is_err() {
                break;
            }
            self.complete_reaped(dma, &mut sink);
        }
    }

    /// Wait for every transfer on the ring; their commands are dropped
    /// unposted (the controller is reset or its queue torn down).
    pub(crate) fn quiesce_io(&mut self) {
        if let Some(ring) = self.ring.as_mut() {
            ring.drain();
        }
        self.inflight.clear();
        self.free_tags.clear();
        for cq in self.cqs.iter_mut().flatten() {
            cq.reserved = 0;
        }
    }

    /// The byte range of `nlb` blocks at `slba`, checked against the
    /// namespace.
    fn range(ns: &Namespace, slba: u64, nlb: u32) -> Result<(u64, u64), Status> {
        match slba.checked_add(nlb as u64) {
            Some(end) if end <= ns.blocks() => Ok((slba << ns.lbads, (nlb as u64) << ns.lbads)),
            _ => Err(Status::LBA_OUT_OF_RANGE),
        }
    }

    fn read(&mut self, ns: &Namespace, mut off: u64, dma: &mut dyn Dma<'_>) -> Status {
        for i in 0..self.segs.len() {
            let (at, len) = self.segs[i];
            match dma.slice(at, len, Access::Write) {
                Some(s) => {
                    let (fd, pos) = ns.fd_for(off, len, s.as_ptr() as u64);
                    match wd_sys::file::pread_device(fd, &s, pos) {
                        Ok(n) if n as u64 == len => {}
                        Ok(n) => s.subslice(n, len as usize - n).fill(0),
                        Err(e) => return io_status(&e),
                    }
                }
                None => {
                    // Not one mapping, or the client's own memory: through
                    // a local buffer (which records any fault).
                    self.bounce.resize(len as usize, 0);
                    let (fd, pos) = ns.buffered_at(off);
                    match wd_sys::file::pread(fd, &mut self.bounce, pos) {
                        Ok(n) => self.bounce[n..].fill(0),
                        Err(e) => return io_status(&e),
                    }
                    if dma.write(at, &self.bounce).is_err() {
                        return Status::DATA_TRANSFER_ERROR;
                    }
                }
            }
            off += len;
        }
        Status::SUCCESS
    }

    /// Write the command's segments at `off`; durable before the
    /// completion when `sync` (see `write_through`).
    fn write(&mut self, ns: &Namespace, mut off: u64, sync: bool, dma: &mut dyn Dma<'_>) -> Status {
        for i in 0..self.segs.len() {
            let (at, len) = self.segs[i];
            let r = match dma.slice(at, len, Access::Read) {
                Some(s) => {
                    let (fd, pos) = ns.fd_for(off, len, s.as_ptr() as u64);
                    wd_sys::file::pwrite_device(fd, &s, pos)
                }
                None => {
                    self.bounce.resize(len as usize, 0);
                    if dma.read(at, &mut self.bounce).is_err() {
                        return Status::DATA_TRANSFER_ERROR;
                    }
                    let (fd, pos) = ns.buffered_at(off);
                    wd_sys::file::pwrite(fd, &self.bounce, pos)
                }
            };
            match r {
                Ok(n) if n as u64 == len => {}
                Ok(_) => return Status::WRITE_FAULT,
                Err(e) => return io_status(&e),
            }
            off += len;
        }
        if sync {
            return self.flush(ns);
        }
        Status::SUCCESS
    }

    fn compare(&mut self, ns: &Namespace, mut off: u64, dma: &mut dyn Dma<'_>) -> Status {
        let mut theirs = Vec::new();
        for i in 0..self.segs.len() {
            let (at, len) = self.segs[i];
            let mut done = 0u64;
            while done < len {
                let n = (len - done).min(CHUNK as u64);
                self.bounce.resize(n as usize, 0);
                let (fd, pos) = ns.buffered_at(off + done);
                match wd_sys::file::pread(fd, &mut self.bounce, pos) {
                    Ok(got) => self.bounce[got..].fill(0),
                    Err(e) => return io_status(&e),
                }
                let same = match dma.slice(at + done, n, Access::Read) {
                    Some(s) => s.equals(&self.bounce),
                    None => {
                        theirs.resize(n as usize, 0);
                        if dma.read(at + done, &mut theirs).is_err() {
                            return Status::DATA_TRANSFER_ERROR;
                        }
                        theirs == self.bounce
                    }
                };
                if !same {
                    return Status::COMPARE_FAILURE;
                }
                done += n;
            }
            off += len;
        }
        Status::SUCCESS
    }

    fn zero(&self, ns: &Namespace, off: u64, len: u64, how: Allocate) -> Status {
        self.charge(ZERO_COST);
        let (fd, pos) = ns.buffered_at(off);
        if wd_sys::file::fallocate(fd, how, pos, len).is_ok() {
            return Status::SUCCESS;
        }
        // A store that cannot zero a range in place (tmpfs) may still punch
        // it out, which reads as zeroes, and allocate it again: the
        // polling thread must not write the zeroes of a whole namespace
        // (a Dataset Management command names 256 ranges of any length).
        if how == Allocate::ZeroRange
            && wd_sys::file::fallocate(fd, Allocate::PunchHole, pos, len).is_ok()
        {
            // Not allocated again (the store is full): still zeroes.
            let _ = wd_sys::file::fallocate(fd, Allocate::Reserve, pos, len);
            return Status::SUCCESS;
        }
        // A store without fallocate (a block device without discard):
        // write the zeroes.
        self.charge(len);
        let zeroes = vec![0u8; CHUNK.min(len as usize)];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(zeroes.len() as u64) as usize;
            match wd_sys::file::pwrite(fd, &zeroes[..n], pos + done) {
                Ok(w) if w == n => done += n as u64,
                Ok(_) => return Status::WRITE_FAULT,
                Err(e) => return io_status(&e),
            }
        }
        Status::SUCCESS
    }

    fn dsm(&mut self, ns: &Namespace, sqe: &Sqe, dma: &mut dyn Dma<'_>) -> Status {
        let count = (sqe.cdw(10) & 0xff) as usize + 1;
        // Only the deallocate attribute changes anything; the others are
        // hints.
        if sqe.cdw(11) & 4 == 0 {
            return Status::SUCCESS;
        }
        let raw = match xfer::from_host(sqe, count * DSM_RANGE_SIZE, dma, &mut self.segs) {
            Ok(r) => r,
            Err(st) => return st,
        };
        let mut ranges = Vec::with_capacity(count);
        for c in raw.chunks_exact(DSM_RANGE_SIZE) {
            let r = DsmRange::from_bytes(c.try_into().expect("range size"));
            if r.blocks == 0 {
                continue;
            }
            match r.slba.checked_add(r.blocks as u64) {
                Some(end) if end <= ns.blocks() => ranges.push(r),
                _ => return Status::LBA_OUT_OF_RANGE,
            }
        }
        // Overlapping ranges merged: a store that must write its zeroes
        // writes each block once, not once per range naming it.
        let mut spans: Vec<(u64, u64)> = ranges
            .iter()
            .map(|r| (r.slba, r.slba + r.blocks as u64))
            .collect();
        spans.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(spans.len());
        for (a, b) in spans {
            match merged.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        for (a, b) in merged {
            let st = self.zero(ns, a << ns.lbads, (b - a) << ns.lbads, Allocate::PunchHole);
            if !st.is_success() {
                return st;
            }
        }
        Status::SUCCESS
    }

    pub(crate) fn flush(&self, ns: &Namespace) -> Status {
        self.charge(SYNC_COST);
        let (fd, _) = ns.buffered_at(0);
        match wd_sys::file::fdatasync(fd) {
            Ok(()) => Status::SUCCESS,
            Err(e) => io_status(&e),
        }
    }

    pub(crate) fn flush_all(&self) -> Status {
        for ns in self.active.values() {
            let st = self.flush(ns);
            if !st.is_success() {
                return st;
            }
        }
        Status::SUCCESS
    }
}
