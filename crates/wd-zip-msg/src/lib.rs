//! The zip device's message format (`device_api` 1): algorithms, opcodes
//! and payload layouts, with the one decoder of untrusted descriptors.
//! Pure logic, shared by the device and its clients.
//!
//! Every payload field is little-endian at a fixed offset (see each
//! message's `to_desc`); bytes a message does not name must be zero, and
//! so must the descriptor's flags.
//!
//! A data request's `result` packs what it did ([`Done`]): bytes written
//! in bits 0-31, bytes of input consumed in bits 32-62, and bit 63 set
//! when a stream ended. One request moves at most [`MAX_DATA`] bytes each
//! way, so both counts fit.
#![deny(unsafe_code)]

use wd_msg::status;
use wd_ring::{Desc, PAYLOAD_SIZE};

/// Message-format version a client must speak.
pub const DEVICE_API: u32 = 1;
/// The queue type (algorithm name) of compression queues.
pub const QUEUE_ALG: &str = "compress";

/// Opcode: nothing (measures the queue).
pub const OP_NOP: u16 = 0;
/// Opcode: open a stream session ([`SessionNew`]); `result` is its handle.
pub const OP_SESSION_NEW: u16 = 1;
/// Opcode: close a stream session ([`SessionFree`]).
pub const OP_SESSION_FREE: u16 = 2;
/// Opcode: compress one whole buffer into one whole stream ([`OneShot`]).
pub const OP_COMPRESS: u16 = 3;
/// Opcode: decompress whole streams from one buffer ([`OneShot`]).
pub const OP_DECOMPRESS: u16 = 4;
/// Opcode: feed a stream session ([`StreamOp`]).
pub const OP_STREAM: u16 = 5;

/// Largest input or output of one request.
pub const MAX_DATA: u64 = 64 << 20;
/// Longest preset dictionary (deflate's window).
pub const MAX_DICT: u32 = 32 << 10;
/// Stream sessions one queue may hold (each keeps a codec's window and
/// tables, up to a few MiB at zstd's high levels).
pub const MAX_SESSIONS: usize = 64;

/// A compression format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algorithm {
    /// Raw deflate (RFC 1951).
    Deflate = 1,
    /// Deflate in zlib framing (RFC 1950).
    Zlib = 2,
    /// Deflate in gzip framing (RFC 1952). A decompression reads one
    /// member, as zlib's inflate does; the input it consumed says where
    /// the next one starts.
    Gzip = 3,
    /// Zstandard frames (RFC 8878).
    Zstd = 4,
    /// LZ4 frames.
    Lz4 = 5,
}

impl Algorithm {
    /// Every algorithm, in wire order.
    pub const ALL: [Algorithm; 5] = [
        Algorithm::Deflate,
        Algorithm::Zlib,
        Algorithm::Gzip,
        Algorithm::Zstd,
        Algorithm::Lz4,
    ];

    /// Its name in attributes, options and reports.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Deflate => "deflate",
            Algorithm::Zlib => "zlib",
            Algorithm::Gzip => "gzip",
            Algorithm::Zstd => "zstd",
            Algorithm::Lz4 => "lz4",
        }
    }

    /// Whether it is deflate in some framing.
    pub fn is_deflate(self) -> bool {
        matches!(self, Algorithm::Deflate | Algorithm::Zlib | Algorithm::Gzip)
    }

    /// The levels a compressor takes (besides [`DEFAULT_LEVEL`]).
    pub fn levels(self) -> std::ops::RangeInclusive<i8> {
        match self {
            Algorithm::Deflate | Algorithm::Zlib | Algorithm::Gzip => 0..=12,
            Algorithm::Zstd => 1..=22,
            Algorithm::Lz4 => 1..=1,
        }
    }

    /// Whether a stream session may run it (LZ4 frames are one-shot only).
    pub fn streams(self) -> bool {
        self != Algorithm::Lz4
    }
}

impl TryFrom<u8> for Algorithm {
    type Error = i32;
    fn try_from(v: u8) -> Result<Algorithm, i32> {
        Algorithm::ALL
            .into_iter()
            .find(|a| *a as u8 == v)
            .ok_or(status::EINVAL)
    }
}

impl std::str::FromStr for Algorithm {
    type Err = String;
    fn from_str(s: &str) -> Result<Algorithm, String> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Algorithm::ALL.iter().map(|a| a.name()).collect();
                format!("unknown algorithm '{s}' (known: {})", names.join(", "))
            })
    }
}

impl std::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The level that means "the library's default" (zlib's `-1`).
pub const DEFAULT_LEVEL: i8 = -1;

/// Check a compression level for an algorithm.
pub fn check_level(alg: Algorithm, level: i8) -> Result<i8, i32> {
    if level == DEFAULT_LEVEL || alg.levels().contains(&level) {
        Ok(level)
    } else {
        Err(status::EINVAL)
    }
}

fn zero_from(d: &Desc, from: usize) -> Result<(), i32> {
    if d.payload[from..].iter().any(|&b| b != 0) {
        Err(status::EINVAL)
    } else {
        Ok(())
    }
}

fn data_len(v: u64) -> Result<u64, i32> {
    if v > MAX_DATA {
        Err(status::EMSGSIZE)
    } else {
        Ok(v)
    }
}

/// Compress or decompress one buffer. Payload: `src` at 0, `src_len` at
/// 8, `dst` at 16, `dst_len` at 24 (the output limit), algorithm at 32,
/// level at 33 (compression; [`DEFAULT_LEVEL`] or the algorithm's
/// range), `max_ratio` at 34 (u16, decompression: refuse output larger
/// than this many times the input consumed; 0 = no limit), `piece` at 36
/// (0 or 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OneShot {
    /// Compress (else decompress).
    pub compress: bool,
    /// Format.
    pub alg: Algorithm,
    /// Compression level.
    pub level: i8,
    /// Expansion limit of a decompression (0: none).
    pub max_ratio: u16,
    /// Input address.
    pub src: u64,
    /// Input bytes.
    pub src_len: u64,
    /// Output address.
    pub dst: u64,
    /// Output room.
    pub dst_len: u64,
    /// Compression of raw deflate only: the input is a piece of a longer
    /// stream, not its end. The output ends at a full flush point (no
    /// block marked final, an empty stored block aligning the end), so
    /// that the next piece's raw deflate, compressed without this one's
    /// history, can follow it.
    pub piece: bool,
}

impl OneShot {
    /// The descriptor of this request.
    pub fn to_desc(&self, tag: u64) -> Desc {
        let mut d = Desc {
            tag,
            opcode: if self.compress {
                OP_COMPRESS
            } else {
                OP_DECOMPRESS
            },
            ..Desc::default()
        };
        d.set_payload_u64(0, self.src);
        d.set_payload_u64(8, self.src_len);
        d.set_payload_u64(16, self.dst);
        d.set_payload_u64(24, self.dst_len);
        d.payload[32] = self.alg as u8;
        d.payload[33] = self.level as u8;
        d.payload[34..36].copy_from_slice(&self.max_ratio.to_le_bytes());
        d.payload[36] = u8::from(self.piece);
        d
    }
}

/// Open a stream session. Payload: algorithm at 0, level at 1, direction
/// at 2 (0 compress, 1 decompress), window bits at 3 (deflate: 8-15, 0
/// for 15), dictionary address at 8 and length at 16 (u32, at most
/// [`MAX_DICT`]; 0: none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionNew {
    /// Format.
    pub alg: Algorithm,
    /// Compression level.
    pub level: i8,
    /// Compress (else decompress).
    pub compress: bool,
    /// Deflate window bits (8-15; 0 means 15).
    pub window_bits: u8,
    /// Preset dictionary address.
    pub dict: u64,
    /// Preset dictionary bytes.
    pub dict_len: u32,
}

impl SessionNew {
    /// The descriptor of this request.
    pub fn to_desc(&self, tag: u64) -> Desc {
        let mut d = Desc {
            tag,
            opcode: OP_SESSION_NEW,
            ..Desc::default()
        };
        d.payload[0] = self.alg as u8;
        d.payload[1] = self.level as u8;
        d.payload[2] = u8::from(!self.compress);
        d.payload[3] = self.window_bits;
        d.set_payload_u64(8, self.dict);
        d.payload[16..20].copy_from_slice(&self.dict_len.to_le_bytes());
        d
    }
}

/// Close a stream session. Payload: handle at 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionFree {
    /// The session.
    pub session: u64,
}

impl SessionFree {
    /// The descriptor of this request.
    pub fn to_desc(&self, tag: u64) -> Desc {
        let mut d = Desc {
            tag,
            opcode: OP_SESSION_FREE,
            ..Desc::default()
        };
        d.set_payload_u64(0, self.session);
        d
    }
}

/// How far a stream request pushes its output (zlib's flush modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flush {
    /// Let the compressor keep input back for better matches.
    None = 0,
    /// Emit everything so far, ending on a byte boundary
    /// (`Z_SYNC_FLUSH`).
    Sync = 1,
    /// As `Sync`, and forget the history (`Z_FULL_FLUSH`); zstd has no
    /// such flush and takes it as `Sync`, keeping the history.
    Full = 2,
    /// The input ends here: finish the stream (`Z_FINISH`).
    Finish = 3,
}

impl TryFrom<u8> for Flush {
    type Error = i32;
    fn try_from(v: u8) -> Result<Flush, i32> {
        match v {
            0 => Ok(Flush::None),
            1 => Ok(Flush::Sync),
            2 => Ok(Flush::Full),
            3 => Ok(Flush::Finish),
            _ => Err(status::EINVAL),
        }
    }
}

/// Feed a stream session: consume what it can of the input, write what
/// it can of the output. Payload: `src` at 0, `src_len` at 8, `dst` at
/// 16, `dst_len` at 24, session at 32, flush at 40.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamOp {
    /// The session.
    pub session: u64,
    /// Flush mode.
    pub flush: Flush,
    /// Input address.
    pub src: u64,
    /// Input bytes.
    pub src_len: u64,
    /// Output address.
    pub dst: u64,
    /// Output room.
    pub dst_len: u64,
}

impl StreamOp {
    /// The descriptor of this request.
    pub fn to_desc(&self, tag: u64) -> Desc {
        let mut d = Desc {
            tag,
            opcode: OP_STREAM,
            ..Desc::default()
        };
        d.set_payload_u64(0, self.src);
        d.set_payload_u64(8, self.src_len);
        d.set_payload_u64(16, self.dst);
        d.set_payload_u64(24, self.dst_len);
        d.set_payload_u64(32, self.session);
        d.payload[40] = self.flush as u8;
        d
    }
}

/// A decoded request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// Nothing.
    Nop,
    /// Open a stream session.
    SessionNew(SessionNew),
    /// Close a stream session.
    SessionFree(SessionFree),
    /// One buffer.
    OneShot(OneShot),
    /// Part of a stream.
    Stream(StreamOp),
}

/// Decode an untrusted descriptor; `Err` is the status to complete it
/// with.
pub fn decode(d: &Desc) -> Result<Request, i32> {
    if d.flags != 0 || d.reserved != 0 {
        return Err(status::EINVAL);
    }
    let p = &d.payload;
    match d.opcode {
        OP_NOP => zero_from(d, 0).map(|_| Request::Nop),
        OP_SESSION_NEW => {
            let alg = Algorithm::try_from(p[0])?;
            if !alg.streams() {
                return Err(status::EOPNOTSUPP);
            }
            let compress = match p[2] {
                0 => true,
                1 => false,
                _ => return Err(status::EINVAL),
            };
            let level = if compress {
                check_level(alg, p[1] as i8)?
            } else if p[1] != 0 {
                return Err(status::EINVAL);
            } else {
                0
            };
            let window_bits = p[3];
            if window_bits != 0 && (!alg.is_deflate() || !(8..=15).contains(&window_bits)) {
                return Err(status::EINVAL);
            }
            if p[4..8].iter().any(|&b| b != 0) {
                return Err(status::EINVAL);
            }
            let dict_len = u32::from_le_bytes([p[16], p[17], p[18], p[19]]);
            if dict_len > MAX_DICT {
                return Err(status::EMSGSIZE);
            }
            // zlib framing names a dictionary in its header; a gzip
            // stream cannot use one.
            if dict_len > 0 && alg == Algorithm::Gzip {
                return Err(status::EINVAL);
            }
            zero_from(d, 20)?;
            Ok(Request::SessionNew(SessionNew {
                alg,
                level,
                compress,
                window_bits,
                dict: d.payload_u64(8),
                dict_len,
            }))
        }
        OP_SESSION_FREE => {
            zero_from(d, 8)?;
            Ok(Request::SessionFree(SessionFree {
                session: d.payload_u64(0),
            }))
        }
        OP_COMPRESS | OP_DECOMPRESS => {
            let compress = d.opcode == OP_COMPRESS;
            let alg = Algorithm::try_from(p[32])?;
            let level = p[33] as i8;
            let level = if compress {
                check_level(alg, level)?
            } else if level != 0 {
                return Err(status::EINVAL);
            } else {
                0
            };
            let max_ratio = u16::from_le_bytes([p[34], p[35]]);
            if compress && max_ratio != 0 {
                return Err(status::EINVAL);
            }
            let piece = match p[36] {
                0 => false,
                1 if compress && alg == Algorithm::Deflate => true,
                _ => return Err(status::EINVAL),
            };
            zero_from(d, 37)?;
            Ok(Request::OneShot(OneShot {
                compress,
                alg,
                level,
                max_ratio,
                piece,
                src: d.payload_u64(0),
                src_len: data_len(d.payload_u64(8))?,
                dst: d.payload_u64(16),
                dst_len: data_len(d.payload_u64(24))?,
            }))
        }
        OP_STREAM => {
            let flush = Flush::try_from(p[40])?;
            zero_from(d, 41)?;
            Ok(Request::Stream(StreamOp {
                session: d.payload_u64(32),
                flush,
                src: d.payload_u64(0),
                src_len: data_len(d.payload_u64(8))?,
                dst: d.payload_u64(16),
                dst_len: data_len(d.payload_u64(24))?,
            }))
        }
        _ => Err(status::EOPNOTSUPP),
    }
}

/// What a data request did: its completion's `result`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Done {
    /// Bytes written to the output.
    pub produced: u64,
    /// Bytes of input consumed.
    pub consumed: u64,
    /// The stream ended (its trailer was written or read).
    pub end: bool,
}

const END_BIT: u64 = 1 << 63;

impl Done {
    /// Pack into a completion result.
    pub fn to_result(self) -> u64 {
        debug_assert!(self.produced <= MAX_DATA && self.consumed <= MAX_DATA);
        (self.produced & 0xffff_ffff)
            | ((self.consumed & 0x7fff_ffff) << 32)
            | if self.end { END_BIT } else { 0 }
    }

    /// Unpack a completion result.
    pub fn from_result(r: u64) -> Done {
        Done {
            produced: r & 0xffff_ffff,
            consumed: (r >> 32) & 0x7fff_ffff,
            end: r & END_BIT != 0,
        }
    }
}

/// Whether a request may be sent again, unchanged, to a restarted host:
/// one-shot requests whose input and output do not overlap may (they read
/// and write the same bytes again; one that overlaps may have written over
/// its own input before the host died); stream requests name a session of
/// the dead host and may not.
pub fn redo_safe(d: &Desc) -> bool {
    match decode(d) {
        Ok(Request::OneShot(o)) => !overlap((o.src, o.src_len), (o.dst, o.dst_len)),
        Ok(Request::Nop) => true,
        Ok(_) => false,
        // Refused again, as it was.
        Err(_) => matches!(d.opcode, OP_NOP | OP_COMPRESS | OP_DECOMPRESS),
    }
}

/// Whether two address ranges share a byte.
fn overlap((a, a_len): (u64, u64), (b, b_len): (u64, u64)) -> bool {
    a_len > 0 && b_len > 0 && a < b.saturating_add(b_len) && b < a.saturating_add(a_len)
}

const _: () = assert!(PAYLOAD_SIZE >= 48);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn one(compress: bool, alg: Algorithm, level: i8) -> OneShot {
        OneShot {
            compress,
            alg,
            level,
            max_ratio: 0,
            src: 0x1000,
            src_len: 100,
            dst: 0x9000,
            dst_len: 200,
            piece: false,
        }
    }

    /// A one-shot request whose output overlaps its input may have
    /// written over it before the host died: not sent again (it was).
    #[test]
    fn one_shot_requests_over_their_own_input_are_not_sent_again() {
        let mut o = one(true, Algorithm::Deflate, 6);
        assert!(redo_safe(&o.to_desc(1)));
        o.dst = o.src + 50;
        assert!(!redo_safe(&o.to_desc(1)));
        o.dst = o.src - 150;
        assert!(!redo_safe(&o.to_desc(1)));
        o.dst = o.src - 200;
        assert!(redo_safe(&o.to_desc(1)));
    }

    #[test]
    fn requests_round_trip() {
        for alg in Algorithm::ALL {
            let c = one(true, alg, DEFAULT_LEVEL);
            assert_eq!(decode(&c.to_desc(1)), Ok(Request::OneShot(c)));
            let d = OneShot {
                max_ratio: 100,
                ..one(false, alg, 0)
            };
            assert_eq!(decode(&d.to_desc(1)), Ok(Request::OneShot(d)));
            assert_eq!(alg.name().parse::<Algorithm>(), Ok(alg));
            // A piece of a stream is raw deflate being compressed.
            let p = OneShot {
                piece: true,
                ..one(true, alg, 1)
            };
            let want = match alg {
                Algorithm::Deflate => Ok(Request::OneShot(p)),
                _ => Err(status::EINVAL),
            };
            assert_eq!(decode(&p.to_desc(1)), want, "{alg}");
            let p = OneShot {
                piece: true,
                ..one(false, alg, 0)
            };
            assert_eq!(decode(&p.to_desc(1)), Err(status::EINVAL), "{alg}");
        }
        let mut d = one(true, Algorithm::Deflate, 1).to_desc(1);
        d.payload[36] = 2;
        assert_eq!(decode(&d), Err(status::EINVAL), "piece is 0 or 1");
        let s = SessionNew {
            alg: Algorithm::Zlib,
            level: 9,
            compress: true,
            window_bits: 12,
            dict: 0x4000,
            dict_len: 100,
        };
        assert_eq!(decode(&s.to_desc(2)), Ok(Request::SessionNew(s)));
        let f = SessionFree { session: 77 };
        assert_eq!(decode(&f.to_desc(2)), Ok(Request::SessionFree(f)));
        let op = StreamOp {
            session: 5,
            flush: Flush::Full,
            src: 1,
            src_len: 2,
            dst: 3,
            dst_len: 4,
        };
        assert_eq!(decode(&op.to_desc(2)), Ok(Request::Stream(op)));
    }

    #[test]
    fn bad_requests_get_clear_statuses() {
        let mut d = one(true, Algorithm::Zstd, 23).to_desc(0);
        assert_eq!(decode(&d), Err(status::EINVAL), "level out of range");
        d = one(true, Algorithm::Lz4, 2).to_desc(0);
        assert_eq!(decode(&d), Err(status::EINVAL));
        d = one(true, Algorithm::Gzip, 6).to_desc(0);
        d.payload[32] = 9;
        assert_eq!(decode(&d), Err(status::EINVAL), "unknown algorithm");
        d = one(true, Algorithm::Gzip, 6).to_desc(0);
        d.set_payload_u64(8, MAX_DATA + 1);
        assert_eq!(decode(&d), Err(status::EMSGSIZE));
        d = one(true, Algorithm::Gzip, 6).to_desc(0);
        d.payload[90] = 1;
        assert_eq!(decode(&d), Err(status::EINVAL), "stray byte");
        d = one(true, Algorithm::Gzip, 6).to_desc(0);
        d.flags = 1;
        assert_eq!(decode(&d), Err(status::EINVAL));
        d.flags = 0;
        d.opcode = 99;
        assert_eq!(decode(&d), Err(status::EOPNOTSUPP));
        let s = SessionNew {
            alg: Algorithm::Lz4,
            level: DEFAULT_LEVEL,
            compress: true,
            window_bits: 0,
            dict: 0,
            dict_len: 0,
        };
        assert_eq!(decode(&s.to_desc(0)), Err(status::EOPNOTSUPP));
        let s = SessionNew {
            alg: Algorithm::Zstd,
            window_bits: 12,
            ..s
        };
        assert_eq!(decode(&s.to_desc(0)), Err(status::EINVAL));
        let s = SessionNew {
            alg: Algorithm::Gzip,
            window_bits: 0,
            dict_len: 10,
            ..s
        };
        assert_eq!(decode(&s.to_desc(0)), Err(status::EINVAL));
    }

    proptest! {
        #[test]
        fn done_round_trips(p in 0..=MAX_DATA, c in 0..=MAX_DATA, end: bool) {
            let d = Done { produced: p, consumed: c, end };
            prop_assert_eq!(Done::from_result(d.to_result()), d);
        }

        /// Any bytes decode to a request or a status, and a request
        /// encodes back to the same descriptor.
        #[test]
        fn decoder_is_total(op in 0u16..8, payload in proptest::collection::vec(any::<u8>(), PAYLOAD_SIZE)) {
            let mut d = Desc { opcode: op, ..Desc::default() };
            d.payload.copy_from_slice(&payload);
            if let Ok(r) = decode(&d) {
                let back = match r {
                    Request::Nop => Desc::default(),
                    Request::SessionNew(s) => s.to_desc(0),
                    Request::SessionFree(f) => f.to_desc(0),
                    Request::OneShot(o) => o.to_desc(0),
                    Request::Stream(s) => s.to_desc(0),
                };
                prop_assert_eq!(decode(&back), Ok(r));
            }
        }
    }
}
