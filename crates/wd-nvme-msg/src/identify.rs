//! Identify data structures (4096 bytes each): the fields the controller
//! fills in and drivers read.

/// Bytes of an Identify data structure.
pub const IDENTIFY_BYTES: usize = 4096;

/// Identify CNS values the controller implements.
pub mod cns {
    /// Identify Namespace (of an active namespace).
    pub const NAMESPACE: u8 = 0x00;
    /// Identify Controller.
    pub const CONTROLLER: u8 = 0x01;
    /// Active Namespace ID list.
    pub const ACTIVE_NAMESPACES: u8 = 0x02;
    /// Namespace Identification Descriptor list.
    pub const NS_DESCRIPTORS: u8 = 0x03;
    /// Allocated Namespace ID list (namespaces of the subsystem this
    /// controller may attach).
    pub const ALLOCATED_NAMESPACES: u8 = 0x10;
    /// Identify Namespace of an allocated namespace.
    pub const ALLOCATED_NAMESPACE: u8 = 0x11;
}

/// Optional Admin Command Support: Namespace Management and Attachment.
pub const OACS_NS_MANAGEMENT: u16 = 1 << 3;
/// Controller Type (CNTRLTYPE): an I/O controller.
pub const CNTRLTYPE_IO: u8 = 1;
/// Optional Admin Command Support: Doorbell Buffer Config.
pub const OACS_DOORBELL_BUFFER: u16 = 1 << 8;
/// Optional NVM Command Support: Compare.
pub const ONCS_COMPARE: u16 = 1 << 0;
/// Optional NVM Command Support: Dataset Management.
pub const ONCS_DSM: u16 = 1 << 2;
/// Optional NVM Command Support: Write Zeroes.
pub const ONCS_WRITE_ZEROES: u16 = 1 << 3;

fn put_str(b: &mut [u8], s: &str) {
    b.fill(b' ');
    let n = s.len().min(b.len());
    b[..n].copy_from_slice(&s.as_bytes()[..n]);
}

fn get_str(b: &[u8]) -> String {
    String::from_utf8_lossy(b).trim_end().to_string()
}

/// Identify Controller, the fields used here.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ControllerInfo {
    /// PCI vendor id.
    pub vid: u16,
    /// Serial number (20 characters).
    pub serial: String,
    /// Model number (40 characters).
    pub model: String,
    /// Firmware revision (8 characters).
    pub firmware: String,
    /// Maximum data transfer size, 2^mdts pages (0: no limit).
    pub mdts: u8,
    /// Controller id.
    pub cntlid: u16,
    /// Version (as VS).
    pub version: u32,
    /// Optional admin commands.
    pub oacs: u16,
    /// Abort command limit, 0's based.
    pub acl: u8,
    /// Asynchronous event request limit, 0's based.
    pub aerl: u8,
    /// Firmware updates (slot 1 read-only, one slot).
    pub frmw: u8,
    /// Log page attributes.
    pub lpa: u8,
    /// Error log page entries, 0's based.
    pub elpe: u8,
    /// Keep alive support, in 100 ms units (0: none).
    pub kas: u16,
    /// Maximum outstanding commands (0: not reported).
    pub maxcmd: u16,
    /// Number of namespaces (the largest valid NSID).
    pub nn: u32,
    /// Optional NVM commands.
    pub oncs: u16,
    /// Volatile write cache present.
    pub vwc: bool,
    /// NVM subsystem NQN.
    pub subnqn: String,
}

impl ControllerInfo {
    /// The data structure.
    pub fn to_bytes(&self) -> Box<[u8; IDENTIFY_BYTES]> {
        let mut b = Box::new([0u8; IDENTIFY_BYTES]);
        b[0..2].copy_from_slice(&self.vid.to_le_bytes());
        b[2..4].copy_from_slice(&self.vid.to_le_bytes());
        put_str(&mut b[4..24], &self.serial);
        put_str(&mut b[24..64], &self.model);
        put_str(&mut b[64..72], &self.firmware);
        b[77] = self.mdts;
        b[78..80].copy_from_slice(&self.cntlid.to_le_bytes());
        // CMIC bit 1: the NVM subsystem may contain two or more
        // controllers (every client's controller is one of it).
        b[76] = 1 << 1;
        b[80..84].copy_from_slice(&self.version.to_le_bytes());
        // OAES 0: no optional events (namespace attribute notices would
        // need the Changed Namespace List log page, and an event sent on
        // every attachment change).
        // CNTRLTYPE: a 1.4 controller must report one (0 is reserved).
        b[111] = CNTRLTYPE_IO;
        b[256..258].copy_from_slice(&self.oacs.to_le_bytes());
        b[258] = self.acl;
        b[259] = self.aerl;
        b[260] = self.frmw;
        b[261] = self.lpa;
        b[262] = self.elpe;
        // WCTEMP / CCTEMP: warning and critical composite temperatures.
        b[266..268].copy_from_slice(&343u16.to_le_bytes());
        b[268..270].copy_from_slice(&373u16.to_le_bytes());
        b[320..322].copy_from_slice(&self.kas.to_le_bytes());
        // SQES / CQES: required and maximum entry sizes 2^6 and 2^4.
        b[512] = 0x66;
        b[513] = 0x44;
        b[514..516].copy_from_slice(&self.maxcmd.to_le_bytes());
        b[516..520].copy_from_slice(&self.nn.to_le_bytes());
        b[520..522].copy_from_slice(&self.oncs.to_le_bytes());
        b[525] = self.vwc as u8;
        put_str(&mut b[768..1024], &self.subnqn);
        // The NQN is NUL padded, not space padded.
        for c in b[768..1024].iter_mut().rev() {
            if *c != b' ' {
                break;
            }
            *c = 0;
        }
        // Power state 0: maximum power 25.00 W (centiwatts).
        b[2048..2050].copy_from_slice(&2500u16.to_le_bytes());
        b
    }

    /// Decode the data structure.
    pub fn from_bytes(b: &[u8; IDENTIFY_BYTES]) -> ControllerInfo {
        let u16_at = |at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
        let u32_at = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        ControllerInfo {
            vid: u16_at(0),
            serial: get_str(&b[4..24]),
            model: get_str(&b[24..64]),
            firmware: get_str(&b[64..72]),
            mdts: b[77],
            cntlid: u16_at(78),
            version: u32_at(80),
            oacs: u16_at(256),
            acl: b[258],
            aerl: b[259],
            frmw: b[260],
            lpa: b[261],
            elpe: b[262],
            kas: u16_at(320),
            maxcmd: u16_at(514),
            nn: u32_at(516),
            oncs: u16_at(520),
            vwc: b[525] & 1 != 0,
            subnqn: String::from_utf8_lossy(&b[768..1024])
                .trim_end_matches('\0')
                .to_string(),
        }
    }
}

/// Identify Namespace, the fields used here.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespaceInfo {
    /// Size in logical blocks.
    pub nsze: u64,
    /// Capacity in logical blocks.
    pub ncap: u64,
    /// Blocks in use (allocated, not deallocated).
    pub nuse: u64,
    /// Logical block size, 2^lbads bytes (9 or 12).
    pub lbads: u8,
    /// Namespace globally unique identifier.
    pub nguid: [u8; 16],
    /// IEEE extended unique identifier.
    pub eui64: [u8; 8],
}

impl NamespaceInfo {
    /// Logical block size in bytes (0 for an LBADS no size fits: the
    /// data may come from a controller that is wrong).
    pub fn block_size(&self) -> u64 {
        1u64.checked_shl(self.lbads.into()).unwrap_or(0)
    }

    /// The data structure.
    pub fn to_bytes(&self) -> Box<[u8; IDENTIFY_BYTES]> {
        let mut b = Box::new([0u8; IDENTIFY_BYTES]);
        b[0..8].copy_from_slice(&self.nsze.to_le_bytes());
        b[8..16].copy_from_slice(&self.ncap.to_le_bytes());
        b[16..24].copy_from_slice(&self.nuse.to_le_bytes());
        // NSFEAT bit 0: NUSE counts deallocated blocks as free (thin).
        b[24] = 1;
        // NLBAF 0 (one format), FLBAS 0 (format 0).
        // DLFEAT: a deallocated block reads as zeroes (1), and Write Zeroes
        // may deallocate (bit 3).
        b[33] = 1 | 1 << 3;
        b[104..120].copy_from_slice(&self.nguid);
        b[120..128].copy_from_slice(&self.eui64);
        // LBA format 0: no metadata, LBADS, best relative performance.
        b[128..132].copy_from_slice(&((self.lbads as u32) << 16).to_le_bytes());
        b
    }

    /// Decode the data structure (its current format's block size).
    pub fn from_bytes(b: &[u8; IDENTIFY_BYTES]) -> NamespaceInfo {
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        let flbas = (b[26] & 0xf) as usize;
        let mut nguid = [0u8; 16];
        nguid.copy_from_slice(&b[104..120]);
        let mut eui64 = [0u8; 8];
        eui64.copy_from_slice(&b[120..128]);
        NamespaceInfo {
            nsze: u64_at(0),
            ncap: u64_at(8),
            nuse: u64_at(16),
            lbads: b[128 + 4 * flbas + 2],
            nguid,
            eui64,
        }
    }
}

/// A list of NSIDs (Identify CNS 0x02/0x10): up to 1024, zero-terminated.
pub fn nsid_list(ids: impl IntoIterator<Item = u32>) -> Box<[u8; IDENTIFY_BYTES]> {
    let mut b = Box::new([0u8; IDENTIFY_BYTES]);
    for (i, id) in ids.into_iter().take(IDENTIFY_BYTES / 4).enumerate() {
        b[4 * i..4 * i + 4].copy_from_slice(&id.to_le_bytes());
    }
    b
}

/// Decode a list of NSIDs.
pub fn parse_nsid_list(b: &[u8; IDENTIFY_BYTES]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .take_while(|&id| id != 0)
        .collect()
}

/// The Namespace Identification Descriptor list of a namespace: its
/// EUI-64 (type 1) and NGUID (type 2).
pub fn ns_descriptors(info: &NamespaceInfo) -> Box<[u8; IDENTIFY_BYTES]> {
    let mut b = Box::new([0u8; IDENTIFY_BYTES]);
    b[0] = 1;
    b[1] = 8;
    b[4..12].copy_from_slice(&info.eui64);
    b[12] = 2;
    b[13] = 16;
    b[16..32].copy_from_slice(&info.nguid);
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_and_namespace_round_trip() {
        let c = ControllerInfo {
            vid: 0x1b36,
            serial: "WD0001".into(),
            model: "WrapDrive mediated NVMe".into(),
            firmware: "0.1.0".into(),
            mdts: 6,
            cntlid: 7,
            version: crate::regs::VERSION_1_4,
            oacs: OACS_DOORBELL_BUFFER | OACS_NS_MANAGEMENT,
            acl: 3,
            aerl: 3,
            frmw: 3,
            lpa: 0,
            elpe: 63,
            kas: 10,
            maxcmd: 1024,
            nn: 8,
            oncs: ONCS_COMPARE | ONCS_DSM | ONCS_WRITE_ZEROES,
            vwc: true,
            subnqn: "nqn.2026-11.dev.wrapdrive:nvme".into(),
        };
        assert_eq!(ControllerInfo::from_bytes(&c.to_bytes()), c);
        let n = NamespaceInfo {
            nsze: 1000,
            ncap: 1000,
            nuse: 10,
            lbads: 12,
            nguid: [7; 16],
            eui64: [3; 8],
        };
        assert_eq!(NamespaceInfo::from_bytes(&n.to_bytes()), n);
        assert_eq!(n.block_size(), 4096);
        assert_eq!(parse_nsid_list(&nsid_list([1, 3, 9])), vec![1, 3, 9]);
        let d = ns_descriptors(&n);
        assert_eq!(&d[16..32], &[7; 16]);
    }
}
