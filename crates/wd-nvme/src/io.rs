//! NVM command set I/O commands, run synchronously against the store.

use std::time::Instant;

use wd_device::{Access, Dma, Service};
use wd_nvme_msg::cmd::{DsmRange, DSM_RANGE_SIZE};
use wd_nvme_msg::{IoOp, Sqe, Status, PAGE};
use wd_sys::file::Allocate;

use crate::ctrl::{Controller, Outcome, MDTS};
use crate::store::Namespace;
use crate::xfer;

/// Largest local buffer a compare or zero fill uses at once.
const CHUNK: usize = 1 << 20;

fn io_status(e: &wd_sys::SysError) -> Status {
    match e.errno() {
        // ENOSPC / EDQUOT: the store is full.
        28 | 122 => Status::WRITE_FAULT,
        _ => Status::INTERNAL_ERROR,
    }
}

impl Controller {
    pub(crate) fn io(&mut self, sqe: &Sqe, dma: &mut dyn Dma<'_>, out: &mut Service) -> Outcome {
        let started = Instant::now();
        let st = self.io_command(sqe, dma, out);
        self.health.busy_ns += started.elapsed().as_nanos() as u64;
        Outcome::Done(st, 0)
    }

    fn io_command(&mut self, sqe: &Sqe, dma: &mut dyn Dma<'_>, out: &mut Service) -> Status {
        if sqe.fuse != 0 {
            return Status::INVALID_FIELD;
        }
        let op = match IoOp::try_from(sqe.opcode) {
            Ok(op) => op,
            Err(st) => return st,
        };
        if op == IoOp::Flush && sqe.nsid == 0xffff_ffff {
            return self.flush_all();
        }
        let Some(ns) = self.active.get(&sqe.nsid).cloned() else {
            return Status::INVALID_NAMESPACE;
        };
        match op {
            IoOp::Flush => self.flush(&ns),
            IoOp::Read | IoOp::Write | IoOp::Compare => {
                let (off, len) = match Self::range(&ns, sqe.slba(), sqe.nlb()) {
                    Ok(r) => r,
                    Err(st) => return st,
                };
                if len > PAGE << MDTS {
                    return Status::INVALID_FIELD;
                }
                if let Err(st) = xfer::segments(sqe, len, dma, &mut self.segs) {
                    return st;
                }
                let st = match op {
                    IoOp::Read => self.read(&ns, off, dma),
                    IoOp::Write => self.write(&ns, off, dma),
                    _ => self.compare(&ns, off, dma),
                };
                if st.is_success() {
                    out.bytes += len;
                    self.counters
                        .bytes
                        .fetch_add(len, std::sync::atomic::Ordering::Relaxed);
                    if op == IoOp::Write {
                        self.health.bytes_written += len;
                        self.health.writes += 1;
                    } else {
                        self.health.bytes_read += len;
                        self.health.reads += 1;
                    }
                }
                st
            }
            IoOp::WriteZeroes => {
                let (off, len) = match Self::range(&ns, sqe.slba(), sqe.nlb()) {
                    Ok(r) => r,
                    Err(st) => return st,
                };
                // DEAC: deallocate (a deallocated block reads as zeroes).
                let how = if sqe.cdw(12) >> 25 & 1 != 0 {
                    Allocate::PunchHole
                } else {
                    Allocate::ZeroRange
                };
                let st = Self::zero(&ns, off, len, how);
                if st.is_success() {
                    self.health.writes += 1;
                }
                st
            }
            IoOp::Dsm => self.dsm(&ns, sqe, dma),
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

    fn write(&mut self, ns: &Namespace, mut off: u64, dma: &mut dyn Dma<'_>) -> Status {
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
        if !self.features.write_cache {
            // Write-through: durable before the completion.
            let (fd, _) = ns.buffered_at(0);
            if let Err(e) = wd_sys::file::fdatasync(fd) {
                return io_status(&e);
            }
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

    fn zero(ns: &Namespace, off: u64, len: u64, how: Allocate) -> Status {
        let (fd, pos) = ns.buffered_at(off);
        if wd_sys::file::fallocate(fd, how, pos, len).is_ok() {
            return Status::SUCCESS;
        }
        // A store without fallocate: write the zeroes.
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
        for r in ranges {
            let st = Self::zero(
                ns,
                r.slba << ns.lbads,
                (r.blocks as u64) << ns.lbads,
                Allocate::PunchHole,
            );
            if !st.is_success() {
                return st;
            }
        }
        Status::SUCCESS
    }

    fn flush(&self, ns: &Namespace) -> Status {
        let (fd, _) = ns.buffered_at(0);
        match wd_sys::file::fdatasync(fd) {
            Ok(()) => Status::SUCCESS,
            Err(e) => io_status(&e),
        }
    }

    fn flush_all(&self) -> Status {
        for ns in self.active.values() {
            let st = self.flush(ns);
            if !st.is_success() {
                return st;
            }
        }
        Status::SUCCESS
    }
}
