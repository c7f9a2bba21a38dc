//! Pure layout arithmetic and the descriptor format.

use crate::RingError;

/// Magic number at offset 0 of every ring ("WDRG").
pub const RING_MAGIC: u32 = 0x4752_4457;
/// Layout version; a client refuses rings of another version.
pub const RING_VERSION: u32 = 1;
/// Bytes per descriptor, submission and completion alike (two cache lines).
pub const DESC_SIZE: usize = 128;
/// Bytes of device message carried by one descriptor.
pub const PAYLOAD_SIZE: usize = 96;
/// Counters a client publishes in its ring for `wd ls` (what its libraries
/// computed where); informational, never trusted by the host.
pub const CLIENT_STATS: usize = 8;
/// Smallest ring depth.
pub const MIN_DEPTH: u32 = 2;
/// Largest ring depth (bounds host memory per queue: 2 x 4096 x 128 B = 1 MiB).
pub const MAX_DEPTH: u32 = 4096;

const HEADER_BYTES: usize = 4096;

/// One request or completion as it sits in a ring slot.
///
/// Plain old data: every bit pattern is a valid `Desc`, so reading one that a
/// hostile peer wrote is safe; its meaning is validated by the device that
/// decodes `payload`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C, align(64))]
pub struct Desc {
    /// Client cookie, echoed unchanged in the completion.
    pub tag: u64,
    /// Device-specific operation code.
    pub opcode: u16,
    /// Device-specific flags.
    pub flags: u16,
    /// Completion status: 0 or a negative errno.
    pub status: i32,
    /// Completion result (e.g. bytes produced).
    pub result: u64,
    /// Reserved, zero.
    pub reserved: u64,
    /// The device message.
    pub payload: [u8; PAYLOAD_SIZE],
}

const _: () = assert!(std::mem::size_of::<Desc>() == DESC_SIZE);

impl Default for Desc {
    fn default() -> Self {
        Desc {
            tag: 0,
            opcode: 0,
            flags: 0,
            status: 0,
            result: 0,
            reserved: 0,
            payload: [0; PAYLOAD_SIZE],
        }
    }
}

impl Desc {
    /// Little-endian u64 at `off` of the payload (device message decoding).
    pub fn payload_u64(&self, off: usize) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.payload[off..off + 8]);
        u64::from_le_bytes(b)
    }

    /// Store a little-endian u64 at `off` of the payload.
    pub fn set_payload_u64(&mut self, off: usize, v: u64) {
        self.payload[off..off + 8].copy_from_slice(&v.to_le_bytes());
    }

    /// Serialise to bytes (for the legacy socket path).
    pub fn to_bytes(&self) -> [u8; DESC_SIZE] {
        let mut b = [0u8; DESC_SIZE];
        b[0..8].copy_from_slice(&self.tag.to_le_bytes());
        b[8..10].copy_from_slice(&self.opcode.to_le_bytes());
        b[10..12].copy_from_slice(&self.flags.to_le_bytes());
        b[12..16].copy_from_slice(&self.status.to_le_bytes());
        b[16..24].copy_from_slice(&self.result.to_le_bytes());
        b[24..32].copy_from_slice(&self.reserved.to_le_bytes());
        b[32..].copy_from_slice(&self.payload);
        b
    }

    /// Parse from bytes (legacy socket path); `None` unless exactly DESC_SIZE.
    pub fn from_bytes(b: &[u8]) -> Option<Desc> {
        if b.len() != DESC_SIZE {
            return None;
        }
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let mut payload = [0u8; PAYLOAD_SIZE];
        payload.copy_from_slice(&b[32..]);
        Some(Desc {
            tag: u64_at(0),
            opcode: u16::from_le_bytes([b[8], b[9]]),
            flags: u16::from_le_bytes([b[10], b[11]]),
            status: i32::from_le_bytes(b[12..16].try_into().expect("4 bytes")),
            result: u64_at(16),
            reserved: u64_at(24),
            payload,
        })
    }
}

/// Where everything lives in a ring's shared memory.
///
/// ```text
/// 0       header: magic, version, depth, offsets      (host writes once)
/// 64      sq_tail    client -> host                    (own cache line)
/// 128     sq_head    host -> client
/// 192     sq_flags   host -> client (NEED_WAKEUP)
/// 256     cq_tail    host -> client
/// 320     cq_head    client -> host
/// 384     cq_flags   client -> host (WAITING)
/// 448     host_state host -> client (ALIVE / STOPPED / BROKEN)
/// 512     client_stats client -> host, 8 x u64 (informational counters)
/// 4096    submission slots  depth x 128 B
/// ...     completion slots  depth x 128 B
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingLayout {
    depth: u32,
}

/// Field offsets inside the header page.
pub(crate) mod off {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 4;
    pub const DEPTH: usize = 8;
    pub const DESC_SIZE: usize = 12;
    pub const SQ_TAIL: usize = 64;
    pub const SQ_HEAD: usize = 128;
    pub const SQ_FLAGS: usize = 192;
    pub const CQ_TAIL: usize = 256;
    pub const CQ_HEAD: usize = 320;
    pub const CQ_FLAGS: usize = 384;
    pub const HOST_STATE: usize = 448;
    pub const CLIENT_STATS: usize = 512;
}

impl RingLayout {
    /// A layout for `depth` slots per ring.
    pub fn new(depth: u32) -> Result<RingLayout, RingError> {
        if !depth.is_power_of_two() || !(MIN_DEPTH..=MAX_DEPTH).contains(&depth) {
            return Err(RingError::BadDepth(depth));
        }
        Ok(RingLayout { depth })
    }

    /// Slots per ring.
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// Index mask (depth - 1).
    pub fn mask(&self) -> u32 {
        self.depth - 1
    }

    /// Offset of the submission slots.
    pub fn sq_offset(&self) -> usize {
        HEADER_BYTES
    }

    /// Offset of the completion slots.
    pub fn cq_offset(&self) -> usize {
        HEADER_BYTES + self.depth as usize * DESC_SIZE
    }

    /// Total bytes of ring memory (a multiple of 4096).
    pub fn total_bytes(&self) -> usize {
        HEADER_BYTES + 2 * self.depth as usize * DESC_SIZE
    }

    /// Offset of submission slot for free-running index `i`.
    pub fn sq_slot(&self, i: u32) -> usize {
        self.sq_offset() + (i & self.mask()) as usize * DESC_SIZE
    }

    /// Offset of completion slot for free-running index `i`.
    pub fn cq_slot(&self, i: u32) -> usize {
        self.cq_offset() + (i & self.mask()) as usize * DESC_SIZE
    }

    /// Entries between `head` and `tail` as a consumer sees them; an
    /// impossible distance (more than the depth) means the peer is lying.
    pub fn pending(&self, head: u32, tail: u32) -> Result<u32, RingError> {
        let n = tail.wrapping_sub(head);
        if n > self.depth {
            return Err(RingError::Corrupt("tail is more than depth ahead of head"));
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_rules() {
        assert!(RingLayout::new(0).is_err());
        assert!(RingLayout::new(3).is_err());
        assert!(RingLayout::new(1).is_err());
        assert!(RingLayout::new(8192).is_err());
        let l = RingLayout::new(64).unwrap();
        assert_eq!(l.total_bytes() % 4096, 0);
        assert_eq!(l.sq_slot(64), l.sq_slot(0));
        assert_eq!(l.cq_slot(65), l.cq_offset() + DESC_SIZE);
    }

    #[test]
    fn pending_detects_lies() {
        let l = RingLayout::new(8).unwrap();
        assert_eq!(l.pending(u32::MAX, 3), Ok(4));
        assert_eq!(l.pending(5, 13), Ok(8));
        assert!(l.pending(5, 14).is_err());
        assert!(l.pending(6, 5).is_err());
    }

    #[test]
    fn desc_bytes_round_trip() {
        let mut d = Desc {
            tag: 9,
            opcode: 2,
            flags: 3,
            status: -14,
            result: 77,
            ..Desc::default()
        };
        d.set_payload_u64(8, 0xdead_beef);
        let b = d.to_bytes();
        assert_eq!(Desc::from_bytes(&b), Some(d));
        assert_eq!(Desc::from_bytes(&b[1..]), None);
        assert_eq!(d.payload_u64(8), 0xdead_beef);
    }
}
