//! Admin commands.

use wd_device::{Access, Dma};
use wd_nvme_msg::cmd::{feature, CreateQueue, GetLogPage};
use wd_nvme_msg::identify::{self, cns, ControllerInfo, NamespaceInfo};
use wd_nvme_msg::regs::{self, Cc};
use wd_nvme_msg::{AdminOp, Sqe, Status, CQE_SIZE, PAGE, SQE_SIZE};

use crate::ctrl::{Controller, Cq, Outcome, Sq, AER_LIMIT, ERROR_LOG, MDTS, QUEUES};
use crate::xfer;

const fn done(st: Status) -> Outcome {
    Outcome::Done(st, 0)
}

/// Bytes of the SMART / health and firmware slot log pages.
const LOG_512: usize = 512;

/// ONCS bit 4, Save and Select Feature Support (SSFS): Get Features
/// honours SEL (default, saved, supported capabilities), and Set Features
/// answers SV with Feature Identifier Not Saveable, so a driver may ask.
const ONCS_SAVE_SELECT: u16 = 1 << 4;

/// Whether I/O queue entries of 2^`want` bytes are configured: CC's entry
/// size (None without registers) never set is Invalid Queue Size (NVMe
/// Base, Create I/O Completion/Submission Queue: a queue created "before
/// initializing the CC.IOCQES/IOSQES field"); set to another size, one
/// this controller does not offer, Invalid Field.
fn entry_size(configured: Option<u8>, want: u8) -> Result<(), Status> {
    match configured.unwrap_or(0) {
        0 => Err(Status::INVALID_QUEUE_SIZE),
        n if n == want => Ok(()),
        _ => Err(Status::INVALID_FIELD),
    }
}

/// The threshold a Temperature Threshold CDW11 selects (THSEL: 0 over,
/// 1 under), or None for a reserved THSEL or a TMPSEL other than the
/// Composite Temperature (no temperature sensor is reported).
/// The composite temperature the SMART log reports, in kelvins.
const TEMPERATURE: u16 = 308;

fn threshold_type(cdw11: u32) -> Option<usize> {
    let (tmpsel, thsel) = (cdw11 >> 16 & 0xf, cdw11 >> 20 & 3);
    (tmpsel == 0 && thsel < 2).then_some(thsel as usize)
}

impl Controller {
    pub(crate) fn admin(&mut self, sqe: &Sqe, dma: &mut dyn Dma<'_>) -> Outcome {
        if sqe.fuse != 0 {
            return done(Status::INVALID_FIELD);
        }
        let op = match AdminOp::try_from(sqe.opcode) {
            Ok(op) => op,
            Err(st) => return done(st),
        };
        match op {
            AdminOp::Identify => self.identify(sqe, dma),
            AdminOp::CreateCq => self.create_cq(sqe, dma),
            AdminOp::CreateSq => self.create_sq(sqe, dma),
            AdminOp::DeleteSq => self.delete_sq(sqe, dma),
            AdminOp::DeleteCq => self.delete_cq(sqe),
            AdminOp::GetLogPage => self.get_log_page(sqe, dma),
            AdminOp::SetFeatures => self.set_features(sqe, dma),
            AdminOp::GetFeatures => self.get_features(sqe),
            // Commands run to completion as they are fetched, so there is
            // never one to abort: DW0 bit 0 says "not aborted".
            AdminOp::Abort => Outcome::Done(Status::SUCCESS, 1),
            AdminOp::AsyncEvent => {
                if self.aers.len() >= AER_LIMIT {
                    done(Status::AER_LIMIT_EXCEEDED)
                } else {
                    self.aers.push(sqe.cid);
                    Outcome::Held
                }
            }
            AdminOp::NsAttach => self.ns_attach(sqe, dma),
            // Keep Alive is not advertised (KAS = 0).
            AdminOp::KeepAlive => done(Status::INVALID_OPCODE),
            AdminOp::DoorbellBuffer => self.doorbell_buffer(sqe, dma),
        }
    }

    fn controller_info(&self) -> ControllerInfo {
        ControllerInfo {
            // PCI-SIG's "no vendor" id is not allowed; use the
            // Red Hat / QEMU virtual-device id drivers already know.
            vid: 0x1b36,
            // The NVM subsystem's serial number, the same on each of its
            // controllers (CNTLID tells them apart).
            serial: self.sub.serial().into(),
            model: "WrapDrive mediated NVMe controller".into(),
            firmware: env!("CARGO_PKG_VERSION").into(),
            mdts: MDTS,
            cntlid: self.cntlid,
            version: regs::VERSION_1_4,
            // Namespace Attachment without Namespace Management (which
            // the host's owner does instead): NMS must stay clear.
            oacs: identify::OACS_DOORBELL_BUFFER,
            acl: 3,
            aerl: (AER_LIMIT - 1) as u8,
            // Slot 1 read-only, one slot.
            frmw: 0b11,
            // Extended Get Log Page data (NUMDU, offsets).
            lpa: 1 << 2,
            elpe: (ERROR_LOG - 1) as u8,
            kas: 0,
            maxcmd: 0,
            nn: self.sub.max_nsid(),
            oncs: identify::ONCS_COMPARE
                | identify::ONCS_DSM
                | identify::ONCS_WRITE_ZEROES
                | ONCS_SAVE_SELECT,
            vwc: true,
            subnqn: self.sub.nqn().into(),
        }
    }

    pub(crate) fn namespace_info(ns: &crate::store::Namespace) -> NamespaceInfo {
        NamespaceInfo {
            nsze: ns.blocks(),
            ncap: ns.blocks(),
            nuse: ns.blocks(),
            lbads: ns.lbads,
            nguid: ns.nguid,
            eui64: ns.eui64,
        }
    }

    /// Whether `nsid` is a valid NSID (1 to NN), allocated or not.
    fn valid_nsid(&self, nsid: u32) -> bool {
        (1..=self.sub.max_nsid()).contains(&nsid)
    }

    fn identify(&mut self, sqe: &Sqe, dma: &mut dyn Dma<'_>) -> Outcome {
        let cns_value = sqe.cdw(10) as u8;
        let nsid = sqe.nsid;
        let data = match cns_value {
            cns::CONTROLLER => self.controller_info().to_bytes(),
            cns::NAMESPACE | cns::NS_DESCRIPTORS => {
                let zeroes = cns_value == cns::NAMESPACE && self.valid_nsid(nsid);
                if !zeroes && self.sub.get(nsid).is_none() {
                    return done(Status::INVALID_NAMESPACE);
                }
                match self.active.get(&nsid) {
                    // A valid NSID not attached here (allocated elsewhere
                    // or not at all): zeroes for Identify Namespace, an
                    // error for its descriptors.
                    None if zeroes => Box::new([0u8; identify::IDENTIFY_BYTES]),
                    None => return done(Status::INVALID_NAMESPACE),
                    Some(ns) if cns_value == cns::NAMESPACE => Self::namespace_info(ns).to_bytes(),
                    Some(ns) => identify::ns_descriptors(&Self::namespace_info(ns)),
                }
            }
            cns::ACTIVE_NAMESPACES | cns::ALLOCATED_NAMESPACES => {
                if nsid >= 0xffff_fffe {
                    return done(Status::INVALID_NAMESPACE);
                }
                if cns_value == cns::ACTIVE_NAMESPACES {
                    identify::nsid_list(self.active.keys().copied().filter(|&id| id > nsid))
                } else {
                    identify::nsid_list(
                        self.sub
                            .namespaces()
                            .iter()
                            .map(|n| n.nsid)
                            .filter(|&id| id > nsid),
                    )
                }
            }
            cns::ALLOCATED_NAMESPACE => match self.sub.get(nsid) {
                Some(ns) => Self::namespace_info(&ns).to_bytes(),
                // Valid but unallocated (a namespace removed below NN).
                None if self.valid_nsid(nsid) => Box::new([0u8; identify::IDENTIFY_BYTES]),
                None => return done(Status::INVALID_NAMESPACE),
            },
            _ => return done(Status::INVALID_FIELD),
        };
        match xfer::to_host(sqe, &data[..], dma, &mut self.segs) {
            Ok(()) => done(Status::SUCCESS),
            Err(st) => done(st),
        }
    }

    /// Queue memory checks common to both queue kinds: contiguous,
    /// page-aligned, reachable in the controller's domain.
    fn queue_memory(
        &mut self,
        q: &CreateQueue,
        entry: usize,
        dma: &mut dyn Dma<'_>,
    ) -> Result<(), Status> {
        if !q.contiguous {
            // CAP.CQR: only physically contiguous queues.
            return Err(Status::INVALID_FIELD);
        }
        if q.base % PAGE != 0 {
            return Err(Status::PRP_OFFSET_INVALID);
        }
        let len = q.entries as u64 * entry as u64;
        // Reading it records an IOMMU fault when it is not mapped.
        let access = if entry == CQE_SIZE {
            Access::Write
        } else {
            Access::Read
        };
        let mut probe = [0u8; 1];
        if !xfer::reachable(dma, q.base, len, access)
            && (dma.read(q.base, &mut probe).is_err()
                || dma.read(q.base + len - 1, &mut probe).is_err())
        {
            return Err(Status::DATA_TRANSFER_ERROR);
        }
        Ok(())
    }

    fn create_cq(&mut self, sqe: &Sqe, dma: &mut dyn Dma<'_>) -> Outcome {
        let q = CreateQueue::from_sqe(sqe);
        if q.qid == 0 || q.qid as usize >= QUEUES || self.cqs[q.qid as usize].is_some() {
            return done(Status::INVALID_QUEUE_ID);
        }
        if q.entries < 2 || q.entries > regs::MAX_QUEUE_ENTRIES {
            return done(Status::INVALID_QUEUE_SIZE);
        }
        if let Err(st) = entry_size(
            self.regs
                .as_ref()
                .map(|r| Cc::from_u32(r.load32(regs::CC)).iocqes),
            4,
        ) {
            return done(st);
        }
        // Interrupts are not offered: IEN must be clear.
        if sqe.cdw(11) & 2 != 0 {
            return done(Status::INVALID_FIELD);
        }
        if let Err(st) = self.queue_memory(&q, CQE_SIZE, dma) {
            return done(st);
        }
        self.start_doorbell(dma, q.qid, true);
        self.cqs[q.qid as usize] = Some(Cq {
            base: q.base,
            entries: q.entries,
            tail: 0,
            head: 0,
            phase: true,
            bound: 0,
            reserved: 0,
            bad_doorbell: false,
        });
        done(Status::SUCCESS)
    }

    fn create_sq(&mut self, sqe: &Sqe, dma: &mut dyn Dma<'_>) -> Outcome {
        let q = CreateQueue::from_sqe(sqe);
        if q.qid == 0 || q.qid as usize >= QUEUES || self.sqs[q.qid as usize].is_some() {
            return done(Status::INVALID_QUEUE_ID);
        }
        if q.entries < 2 || q.entries > regs::MAX_QUEUE_ENTRIES {
            return done(Status::INVALID_QUEUE_SIZE);
        }
        if let Err(st) = entry_size(
            self.regs
                .as_ref()
                .map(|r| Cc::from_u32(r.load32(regs::CC)).iosqes),
            6,
        ) {
            return done(st);
        }
        let cqid = q.other;
        // The admin queue's or one beyond those offered names no queue at
        // all; one in range that was never created is an invalid queue.
        if cqid == 0 || cqid as usize >= QUEUES {
            return done(Status::INVALID_QUEUE_ID);
        }
        if self.cqs[cqid as usize].is_none() {
            return done(Status::CQ_INVALID);
        }
        if let Err(st) = self.queue_memory(&q, SQE_SIZE, dma) {
            return done(st);
        }
        if let Some(cq) = self.cqs[cqid as usize].as_mut() {
            cq.bound += 1;
        }
        self.start_doorbell(dma, q.qid, false);
        self.sqs[q.qid as usize] = Some(Sq {
            base: q.base,
            entries: q.entries,
            head: 0,
            cqid,
            bad_doorbell: false,
        });
        done(Status::SUCCESS)
    }

    fn delete_sq(&mut self, sqe: &Sqe, dma: &mut dyn Dma<'_>) -> Outcome {
        let qid = sqe.cdw(10) as u16;
        if qid == 0 || qid as usize >= QUEUES || self.sqs[qid as usize].is_none() {
            return done(Status::INVALID_QUEUE_ID);
        }
        // Its commands on the I/O ring finish and post first.
        self.settle(dma, None);
        let Some(sq) = self.sqs[qid as usize].take() else {
            return done(Status::INVALID_QUEUE_ID);
        };
        if let Some(cq) = self.cqs[sq.cqid as usize].as_mut() {
            cq.bound = cq.bound.saturating_sub(1);
        }
        self.forget_doorbell(qid, false);
        done(Status::SUCCESS)
    }

    fn delete_cq(&mut self, sqe: &Sqe) -> Outcome {
        let qid = sqe.cdw(10) as u16;
        if qid == 0 || qid as usize >= QUEUES {
            return done(Status::INVALID_QUEUE_ID);
        }
        match self.cqs[qid as usize] {
            None => done(Status::INVALID_QUEUE_ID),
            Some(cq) if cq.bound > 0 => done(Status::INVALID_QUEUE_DELETION),
            Some(_) => {
                self.cqs[qid as usize] = None;
                self.forget_doorbell(qid, true);
                done(Status::SUCCESS)
            }
        }
    }

    fn log_page(&self, lid: u8) -> Option<Vec<u8>> {
        let mut b;
        match lid {
            GetLogPage::ERROR => {
                b = vec![0u8; 64 * ERROR_LOG];
                for (i, e) in self.errors.iter().enumerate() {
                    let o = 64 * i;
                    b[o..o + 8].copy_from_slice(&e.count.to_le_bytes());
                    b[o + 8..o + 10].copy_from_slice(&e.sqid.to_le_bytes());
                    b[o + 10..o + 12].copy_from_slice(&e.cid.to_le_bytes());
                    // Status field: bits 15:1, phase tag bit 0.
                    b[o + 12..o + 14].copy_from_slice(&(e.status.to_field() << 1).to_le_bytes());
                    b[o + 14..o + 16].copy_from_slice(&0xffffu16.to_le_bytes());
                    b[o + 16..o + 24].copy_from_slice(&e.lba.to_le_bytes());
                    b[o + 24..o + 28].copy_from_slice(&e.nsid.to_le_bytes());
                }
            }
            GetLogPage::SMART => {
                b = vec![0u8; LOG_512];
                let h = &self.health;
                // Composite temperature 308 K; spare 100%, threshold 10%.
                // Critical Warning bit 1: the temperature at or past a
                // threshold the driver set (over, under).
                let [over, under] = self.features.temperature_thresholds;
                if TEMPERATURE >= over || TEMPERATURE <= under {
                    b[0] |= 1 << 1;
                }
                b[1..3].copy_from_slice(&TEMPERATURE.to_le_bytes());
                b[3] = 100;
                b[4] = 10;
                // Data units: thousands of 512-byte units, rounded up.
                let units = |bytes: u64| (bytes.div_ceil(512)).div_ceil(1000) as u128;
                let put = |b: &mut Vec<u8>, at: usize, v: u128| {
                    b[at..at + 16].copy_from_slice(&v.to_le_bytes())
                };
                put(&mut b, 32, units(h.bytes_read));
                put(&mut b, 48, units(h.bytes_written));
                put(&mut b, 64, h.reads as u128);
                put(&mut b, 80, h.writes as u128);
                put(&mut b, 96, (h.busy_ns / 60_000_000_000) as u128);
                put(&mut b, 112, 1);
                put(&mut b, 160, h.media_errors as u128);
                put(&mut b, 176, self.error_count as u128);
            }
            GetLogPage::FIRMWARE => {
                b = vec![0u8; LOG_512];
                // Active firmware: slot 1.
                b[0] = 1;
                let fw = env!("CARGO_PKG_VERSION").as_bytes();
                b[8..8 + fw.len().min(8)].copy_from_slice(&fw[..fw.len().min(8)]);
                for c in &mut b[8 + fw.len().min(8)..16] {
                    *c = b' ';
                }
            }
            _ => return None,
        }
        Some(b)
    }

    fn get_log_page(&mut self, sqe: &Sqe, dma: &mut dyn Dma<'_>) -> Outcome {
        let l = GetLogPage::from_sqe(sqe);
        if l.offset % 4 != 0 {
            return done(Status::INVALID_FIELD);
        }
        if l.lid == GetLogPage::SMART && sqe.nsid != 0 && sqe.nsid != 0xffff_ffff {
            // Health is reported for the controller only (LPA bit 0 clear).
            return done(Status::INVALID_FIELD);
        }
        let Some(page) = self.log_page(l.lid) else {
            return done(Status::INVALID_LOG_PAGE);
        };
        if l.offset >= page.len() as u64 {
            return done(Status::INVALID_FIELD);
        }
        if l.len > (PAGE << MDTS) {
            return done(Status::INVALID_FIELD);
        }
        let mut data = vec![0u8; l.len as usize];
        let from = &page[l.offset as usize..];
        let n = from.len().min(data.len());
        data[..n].copy_from_slice(&from[..n]);
        if let Err(st) = xfer::to_host(sqe, &data, dma, &mut self.segs) {
            return done(st);
        }
        // Reading the error log without Retain Asynchronous Event (CDW10
        // bit 15) clears error events: the next one may be reported.
        if l.lid == GetLogPage::ERROR && sqe.cdw(10) & 1 << 15 == 0 {
            self.masked_events &= !1;
        }
        // And the SMART / Health log, SMART / Health events.
        if l.lid == GetLogPage::SMART && sqe.cdw(10) & 1 << 15 == 0 {
            self.masked_events &= !(1 << 1);
        }
        done(Status::SUCCESS)
    }

    fn set_features(&mut self, sqe: &Sqe, dma: &mut dyn Dma<'_>) -> Outcome {
        let fid = sqe.cdw(10) as u8;
        if sqe.cdw(10) >> 31 != 0 {
            return done(Status::FEATURE_NOT_SAVEABLE);
        }
        let v = sqe.cdw(11);
        if fid == feature::VOLATILE_WRITE_CACHE && v & 1 == 0 && self.features.write_cache {
            // What completed while the cache was on is made as durable as
            // what completes from now on (the host counts on it once the
            // cache is off, without a Flush): the writes on the I/O ring,
            // started unsynced, land and post first.
            self.settle(dma, None);
            let st = self.flush_all();
            if !st.is_success() {
                return done(st);
            }
        }
        let f = &mut self.features;
        match fid {
            feature::ARBITRATION => f.arbitration = v,
            feature::POWER_MANAGEMENT => {
                // One power state (NPSS = 0).
                if v & 0x1f != 0 {
                    return done(Status::INVALID_FIELD);
                }
                f.power = v;
            }
            feature::TEMPERATURE_THRESHOLD => match threshold_type(v) {
                Some(t) => f.temperature_thresholds[t] = v as u16,
                None => return done(Status::INVALID_FIELD),
            },
            0x05 => f.error_recovery = v,
            feature::VOLATILE_WRITE_CACHE => f.write_cache = v & 1 != 0,
            feature::NUMBER_OF_QUEUES => {
                if v & 0xffff == 0xffff || v >> 16 == 0xffff {
                    return done(Status::INVALID_FIELD);
                }
                // Before any I/O queue of either kind exists (set again
                // then, the allocation is the same).
                if self.sqs[1..].iter().any(Option::is_some)
                    || self.cqs[1..].iter().any(Option::is_some)
                {
                    return done(Status::SEQUENCE_ERROR);
                }
                let n = (QUEUES - 2) as u32;
                return Outcome::Done(Status::SUCCESS, n | n << 16);
            }
            feature::INTERRUPT_COALESCING => f.coalescing = v,
            // Interrupt Vector Configuration: completions are polled, so
            // there is vector 0 only, and nothing to coalesce.
            0x09 if v & 0xffff == 0 => {}
            0x09 => return done(Status::INVALID_FIELD),
            feature::WRITE_ATOMICITY => f.atomicity = v,
            feature::ASYNC_EVENT_CONFIG => f.async_events = v,
            _ => return done(Status::INVALID_FIELD),
        }
        if fid == feature::TEMPERATURE_THRESHOLD || fid == feature::ASYNC_EVENT_CONFIG {
            self.temperature_event();
        }
        done(Status::SUCCESS)
    }

    /// Critical Warning bit 1 (the temperature at or past a threshold)
    /// with its event enabled (Asynchronous Event Configuration bit 1):
    /// a SMART / Health status event (type 1), Temperature Threshold
    /// (01h), log page 02h.
    fn temperature_event(&mut self) {
        let [over, under] = self.features.temperature_thresholds;
        let warning = TEMPERATURE >= over || TEMPERATURE <= under;
        let ev = 0x01 | 0x01 << 8 | (GetLogPage::SMART as u32) << 16;
        if warning && self.features.async_events & 1 << 1 != 0 && !self.events.contains(&ev) {
            self.events.push_back(ev);
        }
    }

    fn get_features(&mut self, sqe: &Sqe) -> Outcome {
        let fid = sqe.cdw(10) as u8;
        let sel = sqe.cdw(10) >> 8 & 7;
        let f = if sel == 1 || sel == 2 {
            // Default and saved values are the same (nothing is saveable).
            crate::ctrl::Features::default()
        } else {
            self.features
        };
        let n = (QUEUES - 2) as u32;
        let v = match fid {
            feature::ARBITRATION => f.arbitration,
            feature::POWER_MANAGEMENT => f.power,
            feature::TEMPERATURE_THRESHOLD => match threshold_type(sqe.cdw(11)) {
                Some(t) => f.temperature_thresholds[t] as u32,
                None => return done(Status::INVALID_FIELD),
            },
            0x05 => f.error_recovery,
            feature::VOLATILE_WRITE_CACHE => f.write_cache as u32,
            feature::NUMBER_OF_QUEUES => n | n << 16,
            feature::INTERRUPT_COALESCING => f.coalescing,
            // Interrupt Vector Configuration of vector 0 (the only one):
            // Coalescing Disable set.
            0x09 if sqe.cdw(11) & 0xffff == 0 => 1 << 16,
            0x09 => return done(Status::INVALID_FIELD),
            feature::WRITE_ATOMICITY => f.atomicity,
            feature::ASYNC_EVENT_CONFIG => f.async_events,
            _ => return done(Status::INVALID_FIELD),
        };
        if sel == 3 {
            // Capabilities: changeable, not saveable, not per namespace.
            return Outcome::Done(Status::SUCCESS, 0b100);
        }
        if sel > 3 {
            return done(Status::INVALID_FIELD);
        }
        Outcome::Done(Status::SUCCESS, v)
    }

    fn ns_attach(&mut self, sqe: &Sqe, dma: &mut dyn Dma<'_>) -> Outcome {
        let sel = sqe.cdw(10) & 0xf;
        let nsid = sqe.nsid;
        if self.sub.get(nsid).is_none() {
            return done(Status::INVALID_NAMESPACE);
        }
        let list = match xfer::from_host(sqe, 4096, dma, &mut self.segs) {
            Ok(l) => l,
            Err(st) => return done(st),
        };
        let count = u16::from_le_bytes([list[0], list[1]]) as usize;
        let ids: Vec<u16> = (0..count.min(2047))
            .map(|i| u16::from_le_bytes([list[2 + 2 * i], list[3 + 2 * i]]))
            .collect();
        // A controller may attach or detach only itself (the others belong
        // to other clients).
        if ids != [self.cntlid] {
            return done(Status::CONTROLLER_LIST_INVALID);
        }
        match sel {
            0 => match self.sub.attach(nsid, self.cntlid) {
                Ok(ns) => {
                    self.active.insert(nsid, ns);
                    done(Status::SUCCESS)
                }
                // Already attached, to another controller (a namespace is
                // private) or to this one.
                Err(Some(_)) => done(Status::NS_IS_PRIVATE),
                Err(None) if self.active.contains_key(&nsid) => done(Status::NS_ALREADY_ATTACHED),
                // Removed since it was looked up.
                Err(None) => done(Status::INVALID_NAMESPACE),
            },
            1 => {
                if self.active.contains_key(&nsid) {
                    // Its writes on the I/O ring land before another
                    // controller may attach it.
                    self.settle(dma, Some(nsid));
                    // And its completed writes are made durable: neither a
                    // Flush nor the shutdown of this controller reaches a
                    // namespace it no longer has (a failed sync keeps it
                    // attached, for the host to see and try again).
                    if self.features.write_cache {
                        let st = self.flush(&self.active[&nsid]);
                        if !st.is_success() {
                            return done(st);
                        }
                    }
                }
                if self.sub.detach(nsid, self.cntlid) {
                    self.active.remove(&nsid);
                    done(Status::SUCCESS)
                } else {
                    done(Status::NS_NOT_ATTACHED)
                }
            }
            _ => done(Status::INVALID_FIELD),
        }
    }

    fn doorbell_buffer(&mut self, sqe: &Sqe, dma: &mut dyn Dma<'_>) -> Outcome {
        let (shadow, events) = (sqe.prp1, sqe.prp2);
        if shadow % PAGE != 0 || events % PAGE != 0 || shadow == 0 || events == 0 {
            return done(Status::INVALID_FIELD);
        }
        let mut probe = [0u8; 4];
        if dma.read(shadow, &mut probe).is_err() || dma.read(events, &mut probe).is_err() {
            return done(Status::DATA_TRANSFER_ERROR);
        }
        // The shadow doorbells start at what the host last rang (the
        // registers, or the shadow buffer this one replaces), as an
        // emulated controller's do: commands submitted, and completions
        // consumed, before the change still count.
        let r = self.regs.clone();
        let mut rung = [[None; 2]; QUEUES];
        if let Some(r) = &r {
            for qid in 1..QUEUES as u16 {
                let q = qid as usize;
                if self.sqs[q].is_some() {
                    rung[q][0] = Some(self.doorbell(r, dma, qid, false));
                }
                if self.cqs[q].is_some() {
                    rung[q][1] = Some(self.doorbell(r, dma, qid, true));
                }
            }
        }
        for (qid, bells) in rung.iter().enumerate().skip(1) {
            let regs_of = [
                regs::sq_tail_doorbell(qid as u16),
                regs::cq_head_doorbell(qid as u16),
            ];
            for (v, reg) in bells.iter().zip(regs_of) {
                if let Some(v) = v {
                    let at = shadow + (reg - regs::DOORBELLS) as u64;
                    let _ = dma.write(at, &v.to_le_bytes());
                }
            }
        }
        self.dbbuf = Some((shadow, events));
        done(Status::SUCCESS)
    }
}
