//! Submission and completion queue entries, and the commands the
//! controller implements, decoded from the entry's dwords.

use crate::Status;

/// Bytes of a submission queue entry (CC.IOSQES = 6).
pub const SQE_SIZE: usize = 64;
/// Bytes of a completion queue entry (CC.IOCQES = 4).
pub const CQE_SIZE: usize = 16;

/// A submission queue entry, as its dwords.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sqe {
    /// Opcode.
    pub opcode: u8,
    /// Fused operation (bits 9:8 of CDW0).
    pub fuse: u8,
    /// PRP or SGL (bits 15:14 of CDW0; only 0, PRPs, is supported).
    pub psdt: u8,
    /// Command identifier.
    pub cid: u16,
    /// Namespace identifier.
    pub nsid: u32,
    /// Metadata pointer.
    pub mptr: u64,
    /// Data pointer: PRP entry 1.
    pub prp1: u64,
    /// PRP entry 2 (or a PRP list pointer).
    pub prp2: u64,
    /// Command dwords 10 to 15.
    pub cdw: [u32; 6],
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn le64(b: &[u8], at: usize) -> u64 {
    le32(b, at) as u64 | (le32(b, at + 4) as u64) << 32
}

impl Sqe {
    /// Decode an entry (every bit pattern is a valid `Sqe`; what its
    /// fields mean is checked per command).
    pub fn from_bytes(b: &[u8; SQE_SIZE]) -> Sqe {
        let dw0 = le32(b, 0);
        let mut cdw = [0u32; 6];
        for (i, c) in cdw.iter_mut().enumerate() {
            *c = le32(b, 40 + 4 * i);
        }
        Sqe {
            opcode: dw0 as u8,
            fuse: (dw0 >> 8 & 3) as u8,
            psdt: (dw0 >> 14 & 3) as u8,
            cid: (dw0 >> 16) as u16,
            nsid: le32(b, 4),
            mptr: le64(b, 16),
            prp1: le64(b, 24),
            prp2: le64(b, 32),
            cdw,
        }
    }

    /// Encode the entry.
    pub fn to_bytes(&self) -> [u8; SQE_SIZE] {
        let mut b = [0u8; SQE_SIZE];
        let dw0 = self.opcode as u32
            | ((self.fuse & 3) as u32) << 8
            | ((self.psdt & 3) as u32) << 14
            | (self.cid as u32) << 16;
        b[0..4].copy_from_slice(&dw0.to_le_bytes());
        b[4..8].copy_from_slice(&self.nsid.to_le_bytes());
        b[16..24].copy_from_slice(&self.mptr.to_le_bytes());
        b[24..32].copy_from_slice(&self.prp1.to_le_bytes());
        b[32..40].copy_from_slice(&self.prp2.to_le_bytes());
        for (i, c) in self.cdw.iter().enumerate() {
            b[40 + 4 * i..44 + 4 * i].copy_from_slice(&c.to_le_bytes());
        }
        b
    }

    /// Command dword `n` (10 to 15).
    pub fn cdw(&self, n: usize) -> u32 {
        self.cdw[n - 10]
    }

    /// Starting LBA of a read, write, compare or write zeroes (CDW10-11).
    pub fn slba(&self) -> u64 {
        self.cdw[0] as u64 | (self.cdw[1] as u64) << 32
    }

    /// Number of logical blocks (CDW12 bits 15:0, 0's based), as a count.
    pub fn nlb(&self) -> u32 {
        (self.cdw[2] & 0xffff) + 1
    }
}

/// A completion queue entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cqe {
    /// Command specific result (DW0).
    pub result: u32,
    /// Submission queue head pointer.
    pub sq_head: u16,
    /// Submission queue the command came from.
    pub sq_id: u16,
    /// Command identifier.
    pub cid: u16,
    /// Phase tag.
    pub phase: bool,
    /// Status.
    pub status: Status,
}

impl Cqe {
    /// The first three dwords (written before the fourth, which carries
    /// the phase tag the driver polls).
    pub fn head_bytes(&self) -> [u8; 12] {
        let mut b = [0u8; 12];
        b[0..4].copy_from_slice(&self.result.to_le_bytes());
        b[8..10].copy_from_slice(&self.sq_head.to_le_bytes());
        b[10..12].copy_from_slice(&self.sq_id.to_le_bytes());
        b
    }

    /// The fourth dword: command id, phase tag, status.
    pub fn dw3(&self) -> u32 {
        self.cid as u32 | (self.phase as u32) << 16 | (self.status.to_field() as u32) << 17
    }

    /// Encode the entry.
    pub fn to_bytes(&self) -> [u8; CQE_SIZE] {
        let mut b = [0u8; CQE_SIZE];
        b[..12].copy_from_slice(&self.head_bytes());
        b[12..].copy_from_slice(&self.dw3().to_le_bytes());
        b
    }

    /// Decode an entry.
    pub fn from_bytes(b: &[u8; CQE_SIZE]) -> Cqe {
        let dw3 = le32(b, 12);
        Cqe {
            result: le32(b, 0),
            sq_head: u16::from_le_bytes([b[8], b[9]]),
            sq_id: u16::from_le_bytes([b[10], b[11]]),
            cid: dw3 as u16,
            phase: dw3 >> 16 & 1 != 0,
            status: Status::from_field((dw3 >> 17) as u16),
        }
    }
}

/// Admin command opcodes the controller implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum AdminOp {
    /// Delete I/O Submission Queue.
    DeleteSq = 0x00,
    /// Create I/O Submission Queue.
    CreateSq = 0x01,
    /// Get Log Page.
    GetLogPage = 0x02,
    /// Delete I/O Completion Queue.
    DeleteCq = 0x04,
    /// Create I/O Completion Queue.
    CreateCq = 0x05,
    /// Identify.
    Identify = 0x06,
    /// Abort.
    Abort = 0x08,
    /// Set Features.
    SetFeatures = 0x09,
    /// Get Features.
    GetFeatures = 0x0a,
    /// Asynchronous Event Request.
    AsyncEvent = 0x0c,
    /// Namespace Attachment.
    NsAttach = 0x15,
    /// Keep Alive.
    KeepAlive = 0x18,
    /// Doorbell Buffer Config.
    DoorbellBuffer = 0x7c,
}

impl TryFrom<u8> for AdminOp {
    type Error = Status;
    fn try_from(v: u8) -> Result<Self, Status> {
        Ok(match v {
            0x00 => AdminOp::DeleteSq,
            0x01 => AdminOp::CreateSq,
            0x02 => AdminOp::GetLogPage,
            0x04 => AdminOp::DeleteCq,
            0x05 => AdminOp::CreateCq,
            0x06 => AdminOp::Identify,
            0x08 => AdminOp::Abort,
            0x09 => AdminOp::SetFeatures,
            0x0a => AdminOp::GetFeatures,
            0x0c => AdminOp::AsyncEvent,
            0x15 => AdminOp::NsAttach,
            0x18 => AdminOp::KeepAlive,
            0x7c => AdminOp::DoorbellBuffer,
            _ => return Err(Status::INVALID_OPCODE),
        })
    }
}

/// NVM command set opcodes the controller implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum IoOp {
    /// Flush.
    Flush = 0x00,
    /// Write.
    Write = 0x01,
    /// Read.
    Read = 0x02,
    /// Compare.
    Compare = 0x05,
    /// Write Zeroes.
    WriteZeroes = 0x08,
    /// Dataset Management.
    Dsm = 0x09,
}

impl TryFrom<u8> for IoOp {
    type Error = Status;
    fn try_from(v: u8) -> Result<Self, Status> {
        Ok(match v {
            0x00 => IoOp::Flush,
            0x01 => IoOp::Write,
            0x02 => IoOp::Read,
            0x05 => IoOp::Compare,
            0x08 => IoOp::WriteZeroes,
            0x09 => IoOp::Dsm,
            _ => return Err(Status::INVALID_OPCODE),
        })
    }
}

/// Create I/O Completion/Submission Queue, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CreateQueue {
    /// Queue identifier.
    pub qid: u16,
    /// Entries (the command carries it 0's based).
    pub entries: u32,
    /// Physically contiguous.
    pub contiguous: bool,
    /// For a submission queue: the completion queue it posts to. For a
    /// completion queue: the interrupt vector (unused).
    pub other: u16,
    /// Queue base (PRP1).
    pub base: u64,
}

impl CreateQueue {
    /// Decode from the command.
    pub fn from_sqe(s: &Sqe) -> CreateQueue {
        CreateQueue {
            qid: s.cdw[0] as u16,
            entries: (s.cdw[0] >> 16) + 1,
            contiguous: s.cdw[1] & 1 != 0,
            other: (s.cdw[1] >> 16) as u16,
            base: s.prp1,
        }
    }

    /// Fill a command's fields.
    pub fn encode(&self, s: &mut Sqe) {
        s.cdw[0] = self.qid as u32 | (self.entries - 1) << 16;
        s.cdw[1] = self.contiguous as u32 | (self.other as u32) << 16;
        s.prp1 = self.base;
    }
}

/// Get Log Page, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GetLogPage {
    /// Log page identifier.
    pub lid: u8,
    /// Bytes to return (NUMD + 1 dwords).
    pub len: u64,
    /// Byte offset into the log page.
    pub offset: u64,
}

impl GetLogPage {
    /// Error information.
    pub const ERROR: u8 = 0x01;
    /// SMART / health information.
    pub const SMART: u8 = 0x02;
    /// Firmware slot information.
    pub const FIRMWARE: u8 = 0x03;

    /// Decode from the command.
    pub fn from_sqe(s: &Sqe) -> GetLogPage {
        let numd = (s.cdw[0] >> 16) as u64 | ((s.cdw[1] & 0xffff) as u64) << 16;
        GetLogPage {
            lid: s.cdw[0] as u8,
            len: (numd + 1) * 4,
            offset: s.cdw[2] as u64 | (s.cdw[3] as u64) << 32,
        }
    }

    /// Fill a command's fields.
    pub fn encode(&self, s: &mut Sqe) {
        let numd = self.len / 4 - 1;
        s.cdw[0] = self.lid as u32 | ((numd & 0xffff) as u32) << 16;
        s.cdw[1] = (numd >> 16) as u32 & 0xffff;
        s.cdw[2] = self.offset as u32;
        s.cdw[3] = (self.offset >> 32) as u32;
    }
}

/// Feature identifiers the controller implements.
pub mod feature {
    /// Arbitration.
    pub const ARBITRATION: u8 = 0x01;
    /// Power Management.
    pub const POWER_MANAGEMENT: u8 = 0x02;
    /// Temperature Threshold.
    pub const TEMPERATURE_THRESHOLD: u8 = 0x04;
    /// Volatile Write Cache.
    pub const VOLATILE_WRITE_CACHE: u8 = 0x06;
    /// Number of Queues.
    pub const NUMBER_OF_QUEUES: u8 = 0x07;
    /// Interrupt Coalescing.
    pub const INTERRUPT_COALESCING: u8 = 0x08;
    /// Write Atomicity Normal.
    pub const WRITE_ATOMICITY: u8 = 0x0a;
    /// Asynchronous Event Configuration.
    pub const ASYNC_EVENT_CONFIG: u8 = 0x0b;
    /// Keep Alive Timer.
    pub const KEEP_ALIVE: u8 = 0x0f;
}

/// One Dataset Management range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DsmRange {
    /// Context attributes.
    pub attributes: u32,
    /// Length in logical blocks.
    pub blocks: u32,
    /// Starting LBA.
    pub slba: u64,
}

/// Bytes of one Dataset Management range.
pub const DSM_RANGE_SIZE: usize = 16;

impl DsmRange {
    /// Decode one range.
    pub fn from_bytes(b: &[u8; DSM_RANGE_SIZE]) -> DsmRange {
        DsmRange {
            attributes: le32(b, 0),
            blocks: le32(b, 4),
            slba: le64(b, 8),
        }
    }

    /// Encode one range.
    pub fn to_bytes(&self) -> [u8; DSM_RANGE_SIZE] {
        let mut b = [0u8; DSM_RANGE_SIZE];
        b[0..4].copy_from_slice(&self.attributes.to_le_bytes());
        b[4..8].copy_from_slice(&self.blocks.to_le_bytes());
        b[8..16].copy_from_slice(&self.slba.to_le_bytes());
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn sqe_round_trips(b in proptest::collection::vec(any::<u8>(), SQE_SIZE)) {
            let raw: [u8; SQE_SIZE] = b.try_into().unwrap();
            let s = Sqe::from_bytes(&raw);
            let again = Sqe::from_bytes(&s.to_bytes());
            prop_assert_eq!(s, again);
        }

        #[test]
        fn cqe_round_trips(result: u32, sq_head: u16, sq_id: u16, cid: u16, phase: bool,
                           sct in 0u8..8, sc: u8, dnr: bool) {
            let c = Cqe { result, sq_head, sq_id, cid, phase, status: Status { sct, sc, dnr } };
            prop_assert_eq!(Cqe::from_bytes(&c.to_bytes()), c);
        }
    }

    #[test]
    fn known_layouts() {
        let s = Sqe {
            opcode: 0x02,
            cid: 0x1234,
            nsid: 1,
            prp1: 0x1000,
            cdw: [5, 0, 7, 0, 0, 0],
            ..Sqe::default()
        };
        let b = s.to_bytes();
        assert_eq!(&b[0..4], &[0x02, 0, 0x34, 0x12]);
        assert_eq!(s.slba(), 5);
        assert_eq!(s.nlb(), 8);
        let q = CreateQueue {
            qid: 3,
            entries: 256,
            contiguous: true,
            other: 3,
            base: 0x10000,
        };
        let mut s = Sqe::default();
        q.encode(&mut s);
        assert_eq!(s.cdw[0], 0x00ff_0003);
        assert_eq!(CreateQueue::from_sqe(&s), q);
        let l = GetLogPage {
            lid: 2,
            len: 512,
            offset: 0,
        };
        l.encode(&mut s);
        assert_eq!(GetLogPage::from_sqe(&s), l);
        assert!(AdminOp::try_from(0x03).is_err());
        assert_eq!(IoOp::try_from(0x02), Ok(IoOp::Read));
    }
}
