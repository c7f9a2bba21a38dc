//! The controller's register block (NVMe "controller properties") and its
//! doorbells. The block lives in memory the host shares with the client,
//! so a driver's register writes are plain stores the controller polls.

/// Controller Capabilities (64-bit, read-only).
pub const CAP: usize = 0x00;
/// Version (32-bit).
pub const VS: usize = 0x08;
/// Interrupt Mask Set (unused: completions are polled).
pub const INTMS: usize = 0x0c;
/// Interrupt Mask Clear.
pub const INTMC: usize = 0x10;
/// Controller Configuration.
pub const CC: usize = 0x14;
/// Controller Status.
pub const CSTS: usize = 0x1c;
/// NVM Subsystem Reset (not supported: CAP.NSSRS = 0).
pub const NSSR: usize = 0x20;
/// Admin Queue Attributes.
pub const AQA: usize = 0x24;
/// Admin Submission Queue base (64-bit).
pub const ASQ: usize = 0x28;
/// Admin Completion Queue base (64-bit).
pub const ACQ: usize = 0x30;
/// First doorbell.
pub const DOORBELLS: usize = 0x1000;

/// Version 1.4.0.
pub const VERSION_1_4: u32 = 0x0001_0400;

/// I/O queue pairs a controller offers (queue ids 1..=MAX_IO_QUEUES).
pub const MAX_IO_QUEUES: u16 = 16;

/// Largest queue a controller accepts, in entries (CAP.MQES + 1).
pub const MAX_QUEUE_ENTRIES: u32 = 4096;

/// Bytes of the register block: the properties page and the doorbells of
/// the admin queue and every I/O queue pair (stride 4 bytes), rounded up
/// to a page.
pub const BLOCK_BYTES: usize = 0x2000;

/// Offset of submission queue `qid`'s tail doorbell (CAP.DSTRD = 0).
pub const fn sq_tail_doorbell(qid: u16) -> usize {
    DOORBELLS + 8 * qid as usize
}

/// Offset of completion queue `qid`'s head doorbell.
pub const fn cq_head_doorbell(qid: u16) -> usize {
    DOORBELLS + 8 * qid as usize + 4
}

/// Controller Capabilities, as this controller reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cap {
    /// Maximum queue entries, 0's based.
    pub mqes: u16,
    /// Contiguous queues required.
    pub cqr: bool,
    /// Worst-case time to become ready, in 500 ms units.
    pub to: u8,
    /// Doorbell stride: 4 << dstrd bytes.
    pub dstrd: u8,
    /// Command sets supported (bit 0: NVM).
    pub css: u8,
    /// Minimum and maximum memory page size, 2^(12 + x).
    pub mpsmin: u8,
    /// See `mpsmin`.
    pub mpsmax: u8,
}

impl Cap {
    /// The register value.
    pub fn to_u64(self) -> u64 {
        self.mqes as u64
            | (self.cqr as u64) << 16
            | (self.to as u64) << 24
            | ((self.dstrd & 0xf) as u64) << 32
            | (self.css as u64) << 37
            | ((self.mpsmin & 0xf) as u64) << 48
            | ((self.mpsmax & 0xf) as u64) << 52
    }

    /// Decode a register value.
    pub fn from_u64(v: u64) -> Cap {
        Cap {
            mqes: v as u16,
            cqr: v >> 16 & 1 != 0,
            to: (v >> 24) as u8,
            dstrd: (v >> 32 & 0xf) as u8,
            css: (v >> 37) as u8,
            mpsmin: (v >> 48 & 0xf) as u8,
            mpsmax: (v >> 52 & 0xf) as u8,
        }
    }
}

/// Controller Configuration, decoded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cc {
    /// Enable.
    pub en: bool,
    /// I/O command set selected (0: NVM).
    pub css: u8,
    /// Memory page size 2^(12 + mps).
    pub mps: u8,
    /// Arbitration mechanism (0: round robin).
    pub ams: u8,
    /// Shutdown notification (0 none, 1 normal, 2 abrupt).
    pub shn: u8,
    /// I/O submission queue entry size, 2^iosqes.
    pub iosqes: u8,
    /// I/O completion queue entry size, 2^iocqes.
    pub iocqes: u8,
}

impl Cc {
    /// Decode a register value.
    pub fn from_u32(v: u32) -> Cc {
        Cc {
            en: v & 1 != 0,
            css: (v >> 4 & 7) as u8,
            mps: (v >> 7 & 0xf) as u8,
            ams: (v >> 11 & 7) as u8,
            shn: (v >> 14 & 3) as u8,
            iosqes: (v >> 16 & 0xf) as u8,
            iocqes: (v >> 20 & 0xf) as u8,
        }
    }

    /// The register value.
    pub fn to_u32(self) -> u32 {
        self.en as u32
            | ((self.css & 7) as u32) << 4
            | ((self.mps & 0xf) as u32) << 7
            | ((self.ams & 7) as u32) << 11
            | ((self.shn & 3) as u32) << 14
            | ((self.iosqes & 0xf) as u32) << 16
            | ((self.iocqes & 0xf) as u32) << 20
    }
}

/// CSTS.RDY: ready.
pub const CSTS_RDY: u32 = 1;
/// CSTS.CFS: controller fatal status.
pub const CSTS_CFS: u32 = 1 << 1;
/// CSTS.SHST: shutdown processing occurring.
pub const CSTS_SHST_OCCURRING: u32 = 1 << 2;
/// CSTS.SHST: shutdown processing complete.
pub const CSTS_SHST_COMPLETE: u32 = 2 << 2;
/// CSTS.SHST field mask.
pub const CSTS_SHST_MASK: u32 = 3 << 2;

/// Admin Queue Attributes: (submission entries, completion entries), each
/// the real count (the register holds them 0's based).
pub fn aqa_decode(v: u32) -> (u32, u32) {
    ((v & 0xfff) + 1, (v >> 16 & 0xfff) + 1)
}

/// The AQA value for queues of `sq` and `cq` entries.
pub fn aqa_encode(sq: u32, cq: u32) -> u32 {
    (sq - 1) & 0xfff | ((cq - 1) & 0xfff) << 16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_and_cc_round_trip() {
        let c = Cap {
            mqes: 4095,
            cqr: true,
            to: 2,
            dstrd: 0,
            css: 1,
            mpsmin: 0,
            mpsmax: 0,
        };
        assert_eq!(Cap::from_u64(c.to_u64()), c);
        // CSS bit 0 is register bit 37.
        assert_eq!(c.to_u64() >> 37 & 1, 1);
        let cc = Cc {
            en: true,
            css: 0,
            mps: 0,
            ams: 0,
            shn: 1,
            iosqes: 6,
            iocqes: 4,
        };
        assert_eq!(cc.to_u32(), 0x0046_4001);
        assert_eq!(Cc::from_u32(cc.to_u32()), cc);
        assert_eq!(aqa_decode(aqa_encode(32, 64)), (32, 64));
        assert_eq!(sq_tail_doorbell(0), 0x1000);
        assert_eq!(cq_head_doorbell(1), 0x100c);
        assert!(cq_head_doorbell(MAX_IO_QUEUES) + 4 <= BLOCK_BYTES);
    }
}
