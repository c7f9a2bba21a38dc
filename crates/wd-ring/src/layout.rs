//! Pure layout arithmetic, the descriptor, and the ring entry formats.

use crate::RingError;

/// Magic number at offset 0 of every ring ("WDRG").
pub const RING_MAGIC: u32 = 0x4752_4457;
/// Layout version; a client refuses rings of another version. Version 1
/// had 128-byte entries and index words; version 2 has one-cache-line
/// entries that carry their own sequence number.
pub const RING_VERSION: u32 = 2;
/// Bytes of a [`Desc`] on the socket (the legacy path and tests); ring
/// entries are [`ENTRY_SIZE`].
pub const DESC_SIZE: usize = 128;
/// Bytes per ring entry, submission and completion alike: one cache line.
pub const ENTRY_SIZE: usize = 64;
/// Bytes of device message a [`Desc`] carries.
pub const PAYLOAD_SIZE: usize = 96;
/// Message bytes that travel inside a submission entry; the rest of a
/// longer message goes in the entry's extension line.
pub const INLINE_PAYLOAD: usize = 48;
/// Message bytes a completion entry echoes back (device results beyond
/// `status` and `result`, e.g. a checksum).
pub const COMPLETION_PAYLOAD: usize = 40;
/// Counters a client publishes in its ring for `wd ls` (what its libraries
/// computed where); informational, never trusted by the host.
pub const CLIENT_STATS: usize = 8;
/// The client counters' names, in their order in the ring (and in
/// `wd-crypto`'s `Stats::to_array`, and in `struct wd_crypto_stats`):
/// the one list every side reads.
pub const CLIENT_STAT_NAMES: [&str; CLIENT_STATS] = [
    "offload_requests",
    "offload_bytes",
    "cpu_requests",
    "cpu_bytes",
    "cpu_below_threshold",
    "cpu_no_queue",
    "cpu_host_gone",
    "cpu_policy",
];
/// Counters the client library itself publishes in its ring for `wd ls`:
/// how the queue lived through restarts of its host (informational).
pub const QUEUE_STATS: usize = 3;
/// The queue counters' names, in their order in the ring.
pub const QUEUE_STAT_NAMES: [&str; QUEUE_STATS] = ["reconnects", "redone", "failed_by_restart"];
/// Buckets of the request-latency histogram a client keeps in its ring
/// (see [`latency_bucket`]): four per power of two, the last one open
/// from 7.5 s (7 x 2^30 ns) up.
pub const LATENCY_BUCKETS: usize = 128;

/// The histogram bucket of a latency of `ns` nanoseconds: values below 4
/// have a bucket each, then every power of two is split in four, so a
/// bucket's bounds are within 25% of each other (a percentile read from
/// it is that close). Values past the last bucket land in it.
#[inline]
pub fn latency_bucket(ns: u64) -> usize {
    if ns < 4 {
        return ns as usize;
    }
    let e = 63 - ns.leading_zeros() as usize;
    let i = 4 * (e - 1) + ((ns >> (e - 2)) & 3) as usize;
    i.min(LATENCY_BUCKETS - 1)
}

/// The largest latency (ns) bucket `i` holds, which a percentile that
/// falls in it reports (so it never understates); `u64::MAX` for the last,
/// open-ended bucket.
pub fn latency_bucket_bound(i: usize) -> u64 {
    match i {
        _ if i >= LATENCY_BUCKETS - 1 => u64::MAX,
        0..=3 => i as u64,
        _ => {
            let e = i / 4 + 1;
            let sub = (i % 4) as u64;
            ((4 + sub + 1) << (e - 2)) - 1
        }
    }
}

/// The latency (ns) below which `q` (0..=1) of the samples of `hist`
/// fall, as the upper bound of the bucket it reaches; None without
/// samples.
pub fn latency_percentile(hist: &[u64; LATENCY_BUCKETS], q: f64) -> Option<u64> {
    let total: u64 = hist.iter().fold(0u64, |a, &n| a.saturating_add(n));
    if total == 0 {
        return None;
    }
    let want = ((total as f64 * q).ceil() as u64).clamp(1, total);
    let mut seen = 0u64;
    for (i, &n) in hist.iter().enumerate() {
        seen = seen.saturating_add(n);
        if seen >= want {
            return Some(latency_bucket_bound(i));
        }
    }
    Some(u64::MAX)
}
/// Smallest ring depth.
pub const MIN_DEPTH: u32 = 2;
/// Largest ring depth (bounds host memory per queue: 4 KiB + 3 x 4096 x
/// 64 B = 772 KiB).
pub const MAX_DEPTH: u32 = 4096;

/// Submission-entry flag: the message continues in the entry's extension
/// line ([`PAYLOAD_SIZE`] - [`INLINE_PAYLOAD`] more bytes).
pub const SQE_CONTINUED: u32 = 1;

const HEADER_BYTES: usize = 4096;

/// One request or completion as the client library and the devices see it.
///
/// Plain old data: every bit pattern is a valid `Desc`, so decoding one
/// that a hostile peer wrote is safe; its meaning is validated by the device
/// that decodes `payload`. In a ring it travels as a 64-byte entry (see
/// [`encode_sqe`], [`encode_cqe`]): the tag as 32 bits, a message longer
/// than [`INLINE_PAYLOAD`] through the extension line, and a completion
/// with the first [`COMPLETION_PAYLOAD`] message bytes only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C, align(64))]
pub struct Desc {
    /// Client cookie, echoed unchanged in the completion (32 bits in a ring).
    pub tag: u64,
    /// Device-specific operation code.
    pub opcode: u16,
    /// Device-specific flags.
    pub flags: u16,
    /// Completion status: 0 or a negative errno.
    pub status: i32,
    /// Completion result (e.g. bytes produced).
    pub result: u64,
    /// Zero. A submission entry with flag bits this version does not know
    /// arrives with them here, so devices refuse it.
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
    #[inline]
    pub fn payload_u64(&self, off: usize) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.payload[off..off + 8]);
        u64::from_le_bytes(b)
    }

    /// Store a little-endian u64 at `off` of the payload.
    #[inline]
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

    #[inline]
    fn payload_words<const N: usize>(&self, from: usize) -> [u64; N] {
        let mut w = [0u64; N];
        for (k, x) in w.iter_mut().enumerate() {
            *x = self.payload_u64(from + 8 * k);
        }
        w
    }

    #[inline]
    fn set_payload_words(&mut self, from: usize, w: &[u64]) {
        for (k, x) in w.iter().enumerate() {
            self.set_payload_u64(from + 8 * k, *x);
        }
    }
}

/// A ring entry past its sequence word: the word at byte 4 and the seven
/// words at bytes 8..64. The sequence word (bytes 0..4) is published
/// separately, last, so the peer sees either the old entry or this one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EntryBody {
    /// Bytes 4..8.
    pub word: u32,
    /// Bytes 8..64.
    pub rest: [u64; 7],
}

/// The extension line of a submission entry: message bytes 48..96.
pub type Extension = [u64; 6];

/// Submission entry (64 bytes):
///
/// ```text
/// 0   seq u32       seq(index) = 2 * (index / depth) + 1 of the submission it holds (written last)
/// 4   opcode u16, flags u16
/// 8   tag u32, entry flags u32 (SQE_CONTINUED)
/// 16  message bytes 0..48
/// ```
///
/// A message whose bytes 48..96 are not all zero continues in the entry's
/// extension line; the returned extension is then `Some`. The entry carries
/// `tag`, not `d.tag` (the client library puts its own tag there).
#[inline]
pub fn encode_sqe(d: &Desc, tag: u64) -> (EntryBody, Option<Extension>) {
    let ext: Extension = d.payload_words(INLINE_PAYLOAD);
    let continued = ext.iter().any(|&w| w != 0);
    let flags = if continued { SQE_CONTINUED } else { 0 };
    let inline: [u64; 6] = d.payload_words(0);
    let mut rest = [0u64; 7];
    rest[0] = (tag & 0xffff_ffff) | (u64::from(flags) << 32);
    rest[1..].copy_from_slice(&inline);
    let body = EntryBody {
        word: u32::from(d.opcode) | (u32::from(d.flags) << 16),
        rest,
    };
    (body, continued.then_some(ext))
}

/// Whether a submission entry says its message continues in its extension.
#[inline]
pub fn sqe_continued(body: &EntryBody) -> bool {
    (body.rest[0] >> 32) as u32 & SQE_CONTINUED != 0
}

/// Decode a submission entry (any bits: the peer may be hostile). Entry
/// flags this version does not know end up in [`Desc::reserved`], which
/// every device requires to be zero.
#[inline]
pub fn decode_sqe(body: &EntryBody, ext: Option<&Extension>) -> Desc {
    let entry_flags = (body.rest[0] >> 32) as u32;
    let mut d = Desc {
        tag: body.rest[0] & 0xffff_ffff,
        opcode: body.word as u16,
        flags: (body.word >> 16) as u16,
        reserved: u64::from(entry_flags & !SQE_CONTINUED),
        ..Desc::default()
    };
    d.set_payload_words(0, &body.rest[1..]);
    if let Some(e) = ext {
        d.set_payload_words(INLINE_PAYLOAD, e);
    }
    d
}

/// Completion entry (64 bytes):
///
/// ```text
/// 0   seq u32       seq(index) = 2 * (index / depth) + 1 of the completion it holds (written last)
/// 4   status i32
/// 8   result u64
/// 16  tag u32, opcode u16, flags u16
/// 24  message bytes 0..40 as the device left them
/// ```
#[inline]
pub fn encode_cqe(d: &Desc) -> EntryBody {
    let mut rest = [0u64; 7];
    rest[0] = d.result;
    rest[1] = (d.tag & 0xffff_ffff) | (u64::from(d.opcode) << 32) | (u64::from(d.flags) << 48);
    let p: [u64; 5] = d.payload_words(0);
    rest[2..].copy_from_slice(&p);
    EntryBody {
        word: d.status as u32,
        rest,
    }
}

/// Decode a completion entry (any bits: the peer may be hostile).
#[inline]
pub fn decode_cqe(body: &EntryBody) -> Desc {
    let mut d = Desc {
        tag: body.rest[1] & 0xffff_ffff,
        opcode: (body.rest[1] >> 32) as u16,
        flags: (body.rest[1] >> 48) as u16,
        status: body.word as i32,
        result: body.rest[0],
        ..Desc::default()
    };
    d.set_payload_words(0, &body.rest[2..]);
    d
}

/// Where everything lives in a ring's shared memory.
///
/// ```text
/// 0       header: magic, version, depth, entry size   (host writes once)
/// 64      sq_head    host -> client (read only when the ring looks full)
/// 128     sq_flags   host -> client (NEED_WAKEUP)
/// 192     cq_head    client -> host (read only when the ring looks full)
/// 256     cq_flags   client -> host (WAITING)
/// 320     host_state host -> client (ALIVE / STOPPED / BROKEN)
/// 384     client_stats client -> host, 8 x u64 (informational counters)
/// 448     queue_stats  client -> host, 3 x u64 (restarts lived through)
/// 512     latency      client -> host, 128 x u64 (sampled request latency)
/// 4096    submission entries  depth x 64 B
/// ...     completion entries  depth x 64 B
/// ...     submission extensions depth x 64 B (message bytes 48..96)
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
    pub const ENTRY_SIZE: usize = 12;
    pub const SQ_HEAD: usize = 64;
    pub const SQ_FLAGS: usize = 128;
    pub const CQ_HEAD: usize = 192;
    pub const CQ_FLAGS: usize = 256;
    pub const HOST_STATE: usize = 320;
    pub const CLIENT_STATS: usize = 384;
    pub const QUEUE_STATS: usize = 448;
    pub const LATENCY: usize = 512;
}

impl RingLayout {
    /// A layout for `depth` entries per ring.
    pub fn new(depth: u32) -> Result<RingLayout, RingError> {
        if !depth.is_power_of_two() || !(MIN_DEPTH..=MAX_DEPTH).contains(&depth) {
            return Err(RingError::BadDepth(depth));
        }
        Ok(RingLayout { depth })
    }

    /// Entries per ring.
    #[inline]
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// Index mask (depth - 1).
    #[inline]
    pub fn mask(&self) -> u32 {
        self.depth - 1
    }

    /// The sequence word an entry holds once free-running index `i` is in
    /// it: twice the lap number, plus one. Always odd, so fresh memory
    /// (zero) never looks full, and consecutive laps of an entry differ,
    /// also where the u32 indices wrap around.
    #[inline]
    pub fn seq(&self, i: u32) -> u32 {
        ((i >> self.depth.trailing_zeros()) << 1) | 1
    }

    /// Offset of the submission entries.
    pub fn sq_offset(&self) -> usize {
        HEADER_BYTES
    }

    /// Offset of the completion entries.
    pub fn cq_offset(&self) -> usize {
        HEADER_BYTES + self.depth as usize * ENTRY_SIZE
    }

    /// Offset of the submission extensions.
    pub fn ext_offset(&self) -> usize {
        HEADER_BYTES + 2 * self.depth as usize * ENTRY_SIZE
    }

    /// Total bytes of ring memory, rounded up to whole 4 KiB pages.
    pub fn total_bytes(&self) -> usize {
        (HEADER_BYTES + 3 * self.depth as usize * ENTRY_SIZE).next_multiple_of(4096)
    }

    /// Offset of the submission entry for free-running index `i`.
    #[inline]
    pub fn sq_slot(&self, i: u32) -> usize {
        self.sq_offset() + (i & self.mask()) as usize * ENTRY_SIZE
    }

    /// Offset of the completion entry for free-running index `i`.
    #[inline]
    pub fn cq_slot(&self, i: u32) -> usize {
        self.cq_offset() + (i & self.mask()) as usize * ENTRY_SIZE
    }

    /// Offset of the extension line of submission index `i`.
    #[inline]
    pub fn ext_slot(&self, i: u32) -> usize {
        self.ext_offset() + (i & self.mask()) as usize * ENTRY_SIZE
    }

    /// Entries between `head` and `tail` as a producer sees them; an
    /// impossible distance (more than the depth) means the peer is lying.
    #[inline]
    pub fn pending(&self, head: u32, tail: u32) -> Result<u32, RingError> {
        let n = tail.wrapping_sub(head);
        if n > self.depth {
            return Err(RingError::Corrupt("head is behind by more than the depth"));
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_buckets_tile_the_line() {
        // Each bucket ends where the next begins, and the bound is in its bucket.
        for i in 0..LATENCY_BUCKETS - 1 {
            let b = latency_bucket_bound(i);
            assert_eq!(latency_bucket(b), i, "bound of {i}");
            assert_eq!(latency_bucket(b + 1), i + 1, "after bound of {i}");
        }
        assert_eq!(latency_bucket(u64::MAX), LATENCY_BUCKETS - 1);
        // Within 25%: a bucket's low end is more than 4/5 of its bound.
        for i in 8..LATENCY_BUCKETS - 1 {
            let lo = latency_bucket_bound(i - 1) + 1;
            assert!(
                lo as f64 >= latency_bucket_bound(i) as f64 * 0.8,
                "bucket {i}"
            );
        }
        assert_eq!(latency_bucket_bound(LATENCY_BUCKETS - 2), (7 << 30) - 1);
    }

    #[test]
    fn latency_percentiles_from_counts() {
        let mut h = [0u64; LATENCY_BUCKETS];
        assert_eq!(latency_percentile(&h, 0.99), None);
        // 98 fast samples and 2 slow ones: p50 is fast, p99 slow.
        h[latency_bucket(1_000)] = 98;
        h[latency_bucket(50_000)] = 2;
        let fast = latency_percentile(&h, 0.5).unwrap();
        assert!((1_000..1_250).contains(&fast), "{fast}");
        let slow = latency_percentile(&h, 0.99).unwrap();
        assert!((50_000..62_500).contains(&slow), "{slow}");
        assert_eq!(latency_percentile(&h, 0.98), Some(fast));
        // Counts a hostile client wrote do not overflow the sum.
        h[0] = u64::MAX;
        assert_eq!(latency_percentile(&h, 0.5), Some(0));
    }

    #[test]
    fn depth_rules() {
        assert!(RingLayout::new(0).is_err());
        assert!(RingLayout::new(3).is_err());
        assert!(RingLayout::new(1).is_err());
        assert!(RingLayout::new(8192).is_err());
        for depth in [2, 64, 4096] {
            let l = RingLayout::new(depth).unwrap();
            assert_eq!(l.total_bytes() % 4096, 0);
            assert!(l.ext_slot(depth - 1) + ENTRY_SIZE <= l.total_bytes());
        }
        let l = RingLayout::new(64).unwrap();
        assert_eq!(l.sq_slot(64), l.sq_slot(0));
        assert_eq!(l.cq_slot(65), l.cq_offset() + ENTRY_SIZE);
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
    fn seq_never_matches_fresh_memory_or_the_previous_lap() {
        for depth in [2u32, 8, 4096] {
            let l = RingLayout::new(depth).unwrap();
            for i in [0u32, 1, depth - 1, depth, u32::MAX - depth, u32::MAX] {
                assert_ne!(l.seq(i), l.seq(i.wrapping_sub(depth)), "{depth} {i}");
                assert_ne!(l.seq(i), 0);
                // Every index of one lap shares the lap's value.
                assert_eq!(l.seq(i), l.seq(i & !l.mask()));
            }
        }
    }

    fn sample() -> Desc {
        let mut d = Desc {
            tag: 0x1234_5678,
            opcode: 0xbeef,
            flags: 0x00f1,
            ..Desc::default()
        };
        for (i, b) in d.payload.iter_mut().enumerate().take(INLINE_PAYLOAD) {
            *b = i as u8 + 1;
        }
        d
    }

    #[test]
    fn short_messages_travel_inline() {
        let d = sample();
        let (body, ext) = encode_sqe(&d, d.tag);
        assert!(ext.is_none() && !sqe_continued(&body));
        assert_eq!(decode_sqe(&body, None), d);
    }

    #[test]
    fn long_messages_continue_in_the_extension() {
        let mut d = sample();
        d.payload[PAYLOAD_SIZE - 1] = 9;
        let (body, ext) = encode_sqe(&d, d.tag);
        assert!(sqe_continued(&body));
        assert_eq!(decode_sqe(&body, ext.as_ref()), d);
    }

    #[test]
    fn unknown_entry_flags_reach_the_device_as_reserved() {
        let (mut body, _) = encode_sqe(&sample(), 0x1234_5678);
        body.rest[0] |= 0x8000_0000u64 << 32;
        assert_eq!(decode_sqe(&body, None).reserved, 0x8000_0000);
    }

    #[test]
    fn completions_carry_status_result_and_the_first_payload_bytes() {
        let mut d = sample();
        d.status = -14;
        d.result = u64::MAX - 3;
        d.payload[COMPLETION_PAYLOAD] = 0xff; // not carried
        let back = decode_cqe(&encode_cqe(&d));
        assert_eq!(
            (back.tag, back.opcode, back.flags),
            (d.tag, d.opcode, d.flags)
        );
        assert_eq!((back.status, back.result), (-14, u64::MAX - 3));
        assert_eq!(
            back.payload[..COMPLETION_PAYLOAD],
            d.payload[..COMPLETION_PAYLOAD]
        );
        assert!(back.payload[COMPLETION_PAYLOAD..].iter().all(|&b| b == 0));
    }

    #[test]
    fn tags_travel_as_32_bits() {
        let mut d = sample();
        d.tag = 0xffff_0000_0000_0007;
        assert_eq!(decode_sqe(&encode_sqe(&d, d.tag).0, None).tag, 7);
        assert_eq!(decode_cqe(&encode_cqe(&d)).tag, 7);
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
