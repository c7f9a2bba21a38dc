//! A one-shot decompression run in parts, one per call: the zip device
//! serves a long one a part per engine pass, as it serves a long
//! compression, so that 64 MiB of output (tens of milliseconds even at
//! libdeflate's speed) does not make every other queue of the engine
//! wait for it.
//!
//! libdeflate, the one-shot engine of the deflate family, only decodes a
//! whole stream in one call, so parts decode on resumable decoders with
//! the whole call's semantics: the framing is read here exactly as
//! libdeflate reads it (header fields, where the trailer is looked for,
//! what is checked) and the deflate data on zlib-rs; zstd frames on
//! libzstd's streaming decoder writing into one output that stays in
//! place between calls, a buffer of its own or the caller's (so it keeps
//! no window of its own and takes any window the one-shot call takes);
//! LZ4 frames on lz4_flex's frame
//! decoder, frame by frame, each walked as it is reached (the one-shot
//! call walks them all first). A part makes at most a MiB of output
//! (zstd: up to a block more, its input fed a block at a time) and takes
//! at most 256 KiB of input (an LZ4 frame begun
//! counts 256 bytes more than its decoder reads: each sets one up).
//!
//! The same input makes the same output and the same consumed count as
//! [`Engine::decompress`](crate::Engine::decompress), and fails where it
//! fails, with two exceptions: zlib-rs refuses the few malformed deflate
//! streams that libdeflate accepts (an incomplete Huffman code whose one
//! codeword is used as the unused other one, length symbols 286 and 287,
//! offset symbols 30 and 31), and input that is both
//! damaged and longer than the room may fail as too long where the
//! one-shot call finds the damage first, or the other way round (LZ4
//! input that is not whole frames among them: the one-shot call refuses
//! it before decoding, parts where they reach it).

use std::io::{Cursor, Read};
use std::sync::Arc;

use flate2::{Decompress, FlushDecompress, Status};
use wd_zip_msg::Algorithm;

use crate::mem::Output;
use crate::zstd_raw::Dctx;
use crate::{lz4_frame_at, CodecError, Inflated, Lz4Verify, PART_OUT};

/// Output one part makes at most: about a millisecond of libdeflate,
/// two of zlib-rs or lz4_flex here.
const OUT_PART: usize = 1 << 20;

/// Input one part gives the decoder at most: besides the output bound,
/// this bounds a part's time on streams that decode to little (empty
/// stored blocks, skippable frames).
const IN_PART: usize = 256 << 10;

/// The first bytes of a zstd frame the decoder is given, from which it
/// says how much more its header needs (`ZSTD_FRAMEHEADERSIZE_PREFIX`).
const ZSTD_FRAME_PREFIX: usize = 5;

/// What beginning an LZ4 frame counts for against a part's input,
/// besides the bytes its decoder reads: a frame sets up a decoder (an
/// empty frame is 11 bytes and takes about 0.2 µs, so a part walks about
/// a thousand of them).
const LZ4_FRAME_COST: usize = 256;

/// Memory a decompression in parts holds besides its input and output:
/// zlib-rs's state and window, libzstd's context and input block, or
/// lz4_flex's two block buffers at the largest block size (4 MiB of
/// input, and twice a block and the 64 KiB window of output for linked
/// blocks).
const DEFLATE_STATE: usize = 64 << 10;
const ZSTD_STATE: usize = 256 << 10;
const LZ4_STATE: usize = (12 << 20) + (64 << 10);

/// How deflate data is framed, as libdeflate reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framing {
    Raw,
    /// Adler-32 of the output so far.
    Zlib(u32),
    /// CRC-32 of the output so far.
    Gzip(u32),
}

enum Kind {
    Deflate {
        z: Box<Decompress>,
        framing: Framing,
        /// Where the deflate data begins (after the header) and where
        /// libdeflate stops looking for it (before the trailer's size).
        data: (usize, usize),
        /// A part's output room.
        room: Vec<u8>,
    },
    /// The decoder writes one output in place across calls.
    Zstd {
        d: Dctx,
        out: ZstdOut,
        /// Input the decoder's next unit needs, as its last call said (0:
        /// the last call ended a frame, or none began).
        next_in: usize,
    },
    /// Frames walked one by one as they are decoded (a table of them
    /// all, as the one-shot call walks first, would be 16 bytes for every
    /// 11 of input, and walking 64 MiB of them takes tens of
    /// milliseconds): input that is not whole frames fails where the walk
    /// reaches it, after the frames before it made their output.
    Lz4 {
        /// Where the next frame begins (the one being decoded ends there).
        next: usize,
        dec: Option<Lz4Decoder>,
        /// The checks of the frame being decoded that its decoder does not
        /// make (it was given the frame cut short).
        verify: Option<Box<Lz4Verify>>,
        room: Vec<u8>,
    },
    Finished,
}

/// The output a zstd decoder writes in place across calls: decided by the
/// first part.
enum ZstdOut {
    Undecided,
    /// A buffer of its own, of [`DecompressParts::out_len`] bytes.
    Own(Vec<u8>),
    /// The caller's, given to each call
    /// ([`DecompressParts::next_part_into`]).
    Callers,
}

/// One LZ4 frame of the shared input, as a decoder reads it.
struct Frame {
    input: Arc<Vec<u8>>,
    at: (usize, usize),
}

impl AsRef<[u8]> for Frame {
    fn as_ref(&self) -> &[u8] {
        &self.input[self.at.0..self.at.1]
    }
}

/// A one-shot decompression of a whole input, run in parts.
pub struct DecompressParts {
    input: Arc<Vec<u8>>,
    /// Output allowed: the room, or less under a ratio limit.
    cap: usize,
    room: usize,
    /// Whether `cap` is the ratio limit's (running out of it is `Ratio`).
    ratio_capped: bool,
    max_ratio: u16,
    /// Input taken by the decoder so far (all of it for zstd and LZ4 at
    /// the end, as the one-shot call counts).
    consumed: usize,
    produced: usize,
    kind: Kind,
    /// Output and input a part makes and takes at most: [`OUT_PART`]
    /// and [`IN_PART`] (smaller in tests, to cut small streams).
    part: (usize, usize),
}

impl std::fmt::Debug for DecompressParts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecompressParts")
            .field("consumed", &self.consumed)
            .field("produced", &self.produced)
            .finish_non_exhaustive()
    }
}

/// The output a decompression of `input_len` bytes into `room` may make
/// under `max_ratio` (0: no limit), as [`Engine::decompress`] bounds it.
///
/// [`Engine::decompress`]: crate::Engine::decompress
pub fn decompress_cap(input_len: usize, room: usize, max_ratio: u16) -> usize {
    match max_ratio {
        0 => room,
        r => room.min(input_len.saturating_mul(r as usize)),
    }
}

impl DecompressParts {
    /// Whether a decompression that may make `cap` bytes is worth
    /// cutting: more than a stream's part ([`PART_OUT`]; less runs whole
    /// on libdeflate, about twice zlib-rs's speed, in a few milliseconds).
    pub fn worth(cap: usize) -> bool {
        cap > PART_OUT
    }

    /// Memory held across parts for `input_len` bytes of input that may
    /// make `cap` bytes, at most (zstd holds no output buffer when it
    /// writes the caller's).
    pub fn footprint(alg: Algorithm, input_len: usize, cap: usize) -> usize {
        input_len
            + match alg {
                Algorithm::Zstd => cap + 1 + ZSTD_STATE,
                Algorithm::Lz4 => OUT_PART + LZ4_STATE,
                _ => OUT_PART + DEFLATE_STATE,
            }
    }

    /// Begin decompressing `input` (all of it is given now, and held) of
    /// `alg` into at most `room` bytes, refusing output past `max_ratio`
    /// times the input consumed (0: no limit). Fails as the one-shot call
    /// fails on a header or frame walk it refuses.
    pub fn new(
        alg: Algorithm,
        input: Vec<u8>,
        room: usize,
        max_ratio: u16,
    ) -> Result<DecompressParts, CodecError> {
        if input.is_empty() {
            return Err(CodecError::Corrupt);
        }
        let cap = decompress_cap(input.len(), room, max_ratio);
        let kind = match alg {
            Algorithm::Deflate | Algorithm::Zlib | Algorithm::Gzip => {
                let (framing, data) = deflate_framing(alg, &input)?;
                Kind::Deflate {
                    z: Box::new(Decompress::new(false)),
                    framing,
                    data,
                    room: Vec::new(),
                }
            }
            Algorithm::Zstd => Kind::Zstd {
                d: Dctx::stable().ok_or(CodecError::Memory)?,
                out: ZstdOut::Undecided,
                next_in: 0,
            },
            Algorithm::Lz4 => Kind::Lz4 {
                next: 0,
                dec: None,
                verify: None,
                room: Vec::new(),
            },
        };
        Ok(DecompressParts {
            input: Arc::new(input),
            cap,
            room,
            ratio_capped: cap < room,
            max_ratio,
            consumed: 0,
            produced: 0,
            kind,
            part: (OUT_PART, IN_PART),
        })
    }

    /// Parts of at most `out` bytes of output and `input` of input (at
    /// least one each), for tests and fuzzing to cut small streams.
    pub fn parts_of(mut self, out: usize, input: usize) -> DecompressParts {
        self.part = (out.max(1), input.max(1));
        self
    }

    /// Whether the next part may be decoded into the caller's output
    /// ([`DecompressParts::next_part_into`]): zstd, whose earlier parts
    /// (if any) were decoded so. Its output is then written in place
    /// rather than into a buffer of the decoder's own, which would be as
    /// large as the room, fresh for each decompression (its page faults
    /// cost more than the decoding) and copied once more.
    pub fn writes_into(&self) -> bool {
        matches!(
            self.kind,
            Kind::Zstd {
                out: ZstdOut::Undecided | ZstdOut::Callers,
                ..
            }
        )
    }

    /// Bytes of the output to give each [`DecompressParts::next_part_into`]
    /// call: the room, or one byte more than the ratio limit allows where
    /// that is less (the byte tells a stream past the limit from one that
    /// reaches it exactly).
    pub fn out_len(&self) -> usize {
        out_len(self.room, self.cap)
    }

    /// Input taken so far.
    pub fn consumed(&self) -> usize {
        self.consumed
    }

    /// Output made so far.
    pub fn produced(&self) -> usize {
        self.produced
    }

    /// Running out of room: too long for the room, or past the ratio.
    fn no_space(&self) -> CodecError {
        if self.ratio_capped {
            CodecError::Ratio
        } else {
            CodecError::NoSpace
        }
    }

    /// Decode the next part: the output it made (the bytes after the
    /// earlier parts'; at most [`OUT_PART`], for zstd up to a block
    /// more), and the result once the input is decoded. An error
    /// ends the decompression (a later call fails as `Corrupt`); the
    /// output of earlier parts stands, as a one-shot call's output
    /// written before it failed.
    pub fn next_part(&mut self) -> Result<(&[u8], Option<Inflated>), CodecError> {
        let len = self.out_len();
        if let Kind::Zstd { out, .. } = &mut self.kind {
            match out {
                ZstdOut::Undecided => *out = ZstdOut::Own(vec![0; len]),
                ZstdOut::Own(_) => {}
                ZstdOut::Callers => return Err(CodecError::Param),
            }
        }
        let (from, to, end) = self.part(None::<&mut [u8]>)?;
        let made = match &self.kind {
            Kind::Deflate { room, .. } | Kind::Lz4 { room, .. } => &room[from..to],
            Kind::Zstd {
                out: ZstdOut::Own(out),
                ..
            } => &out[from..to],
            _ => &[][..],
        };
        Ok((made, end))
    }

    /// As [`DecompressParts::next_part`], decoding into `out` (of
    /// [`DecompressParts::out_len`] bytes, the same memory on every call)
    /// where [`DecompressParts::writes_into`] allows: the bytes this part
    /// wrote, which follow the earlier parts' in `out`.
    pub fn next_part_into<O: Output + ?Sized>(
        &mut self,
        out: &mut O,
    ) -> Result<(usize, Option<Inflated>), CodecError> {
        if !self.writes_into() || out.len() != self.out_len() {
            return Err(CodecError::Param);
        }
        if let Kind::Zstd { out, .. } = &mut self.kind {
            *out = ZstdOut::Callers;
        }
        let (from, to, end) = self.part(Some(out))?;
        Ok((to - from, end))
    }

    /// One part into the caller's output `out` (zstd in place) or the
    /// decoder's buffer: where its output lies there, and the result once
    /// the input is decoded.
    fn part<O: Output + ?Sized>(
        &mut self,
        out: Option<&mut O>,
    ) -> Result<(usize, usize, Option<Inflated>), CodecError> {
        let r = self.run(out).and_then(|(from, to, done)| {
            let end = done.then_some(Inflated {
                consumed: self.consumed,
                produced: self.produced,
            });
            // As the one-shot call: past the ratio of the input the
            // stream took (the rest may be anything).
            match end {
                Some(e)
                    if self.max_ratio != 0
                        && e.produced > e.consumed.saturating_mul(self.max_ratio as usize) =>
                {
                    Err(CodecError::Ratio)
                }
                _ => Ok((from, to, end)),
            }
        });
        r.inspect_err(|_| self.kind = Kind::Finished)
    }

    /// One part: where its output lies in the part's buffer (or `out`),
    /// and whether the decompression is finished.
    fn run<O: Output + ?Sized>(
        &mut self,
        out: Option<&mut O>,
    ) -> Result<(usize, usize, bool), CodecError> {
        let no_space = self.no_space();
        let left = self.cap - self.produced;
        let (part_out, in_part) = self.part;
        match &mut self.kind {
            Kind::Finished => Err(CodecError::Corrupt),
            Kind::Deflate {
                z,
                framing,
                data,
                room,
            } => {
                // Out of room: one byte more tells a stream that ends
                // here (its end codes and trailer need no room) from one
                // with more to make.
                let n = if left == 0 { 1 } else { left.min(part_out) };
                room.resize(n, 0);
                let at = data.0 + z.total_in() as usize;
                let upto = data.1.min(at.saturating_add(in_part));
                let before = z.total_out();
                let st = z
                    .decompress(&self.input[at..upto], room, FlushDecompress::None)
                    .map_err(|_| CodecError::Corrupt)?;
                let made = (z.total_out() - before) as usize;
                if made > left {
                    return Err(no_space);
                }
                let part = &room[..made];
                match framing {
                    Framing::Raw => {}
                    Framing::Zlib(a) => *a = crate::libdeflate::adler32(*a, part),
                    Framing::Gzip(c) => *c = crate::libdeflate::crc32(*c, part),
                }
                self.produced += made;
                let used = data.0 + z.total_in() as usize;
                self.consumed = used;
                if st != Status::StreamEnd {
                    // On with more room, or with the next of the input;
                    // the input used up before the data ended is a
                    // truncated stream.
                    return match made == n || (used == upto && upto < data.1) {
                        true => Ok((0, made, false)),
                        false => Err(CodecError::Corrupt),
                    };
                }
                // The trailer right after the deflate data (its room was
                // kept out of the data).
                let ok = match *framing {
                    Framing::Raw => true,
                    Framing::Zlib(a) => {
                        self.consumed = used + 4;
                        self.input[used..used + 4] == a.to_be_bytes()
                    }
                    Framing::Gzip(c) => {
                        self.consumed = used + 8;
                        self.input[used..used + 4] == c.to_le_bytes()
                            && self.input[used + 4..used + 8]
                                == (self.produced as u32).to_le_bytes()
                    }
                };
                if !ok {
                    return Err(CodecError::Corrupt);
                }
                Ok((0, made, true))
            }
            Kind::Zstd {
                d,
                out: own,
                next_in,
            } => {
                let at = self.consumed;
                let upto = self.input.len().min(at + in_part);
                let start = self.produced;
                let input = &self.input[at..upto];
                let (used, made) = match (out, own) {
                    (Some(out), ZstdOut::Callers) => {
                        zstd_part(d, next_in, input, out, start, part_out)
                    }
                    (None, ZstdOut::Own(own)) => {
                        zstd_part(d, next_in, input, &mut own[..], start, part_out)
                    }
                    _ => Err(CodecError::Param),
                }
                .map_err(|e| {
                    if e == CodecError::NoSpace {
                        no_space
                    } else {
                        e
                    }
                })?;
                if made > self.cap {
                    return Err(no_space);
                }
                self.consumed = at + used;
                self.produced = made;
                if self.consumed == self.input.len() {
                    // All input taken: finished where a frame ended, else
                    // the last frame is cut short.
                    return match *next_in == 0 {
                        true => Ok((start, made, true)),
                        false => Err(CodecError::Corrupt),
                    };
                }
                if used == 0 && made == start {
                    // Neither input taken nor output made: the output is
                    // full where a frame has more.
                    return Err(no_space);
                }
                Ok((start, made, false))
            }
            Kind::Lz4 {
                next,
                dec,
                verify,
                room,
            } => {
                let n = left.min(part_out);
                room.resize(n, 0);
                let mut made = 0;
                // The input this part walked and read: a frame's bytes as
                // its decoder reads them (a block of one byte is 5 bytes
                // of input and a read), and LZ4_FRAME_COST for each frame
                // begun (a decoder set up, or a skippable frame passed).
                let mut walked = 0usize;
                let read_at = |r: &Lz4Decoder| {
                    let c = r.get_ref();
                    c.get_ref().at.0 + c.position() as usize
                };
                // A read of 0 bytes ends the frame only where its bytes
                // end (it is also a block that decodes to none).
                let frame_end = |r: &Lz4Decoder| r.get_ref().get_ref().at.1;
                let mut mark = dec.as_ref().map_or(0, read_at);
                loop {
                    if dec.is_none() {
                        if *next == self.input.len() || walked >= in_part {
                            break;
                        }
                        let from = *next;
                        let f = lz4_frame_at(&self.input, from).ok_or(CodecError::Corrupt)?;
                        walked += LZ4_FRAME_COST;
                        *next = f.end;
                        if !f.data {
                            self.consumed = f.end;
                            continue;
                        }
                        *dec = Some(lz4_flex::frame::FrameDecoder::new(Cursor::new(Frame {
                            input: Arc::clone(&self.input),
                            at: (from, f.decoded),
                        })));
                        *verify = f.check.map(|c| Box::new(Lz4Verify::new(c)));
                        mark = from;
                    }
                    let r = dec.as_mut().expect("begun above");
                    let at = read_at(r);
                    walked += at - mark;
                    mark = at;
                    self.consumed = at;
                    if made == n {
                        if n == left {
                            // Out of room: the frame must end here.
                            let mut probe = [0u8; 1];
                            match r.read(&mut probe) {
                                Ok(0) if read_at(r) == frame_end(r) => {}
                                // A block that decodes to nothing.
                                Ok(0) => continue,
                                Ok(_) => return Err(no_space),
                                Err(_) => return Err(CodecError::Corrupt),
                            }
                        } else {
                            break;
                        }
                    } else if walked >= in_part {
                        // (Not before a read: a part reads at least once.)
                        break;
                    } else {
                        match r.read(&mut room[made..]) {
                            Ok(0) if read_at(r) == frame_end(r) => {}
                            Ok(k) => {
                                if let Some(v) = verify {
                                    v.update(&room[made..made + k]);
                                }
                                made += k;
                                continue;
                            }
                            Err(_) => return Err(CodecError::Corrupt),
                        }
                    }
                    // The frame ended: its input is taken.
                    if verify.take().is_some_and(|v| !v.holds()) {
                        return Err(CodecError::Corrupt);
                    }
                    *dec = None;
                    self.consumed = *next;
                }
                self.produced += made;
                let done = dec.is_none() && *next == self.input.len();
                Ok((0, made, done))
            }
        }
    }
}

/// The output a zstd decompression in parts writes into: `room` bytes, or
/// one more than `cap` where that is less.
fn out_len(room: usize, cap: usize) -> usize {
    room.min(cap.saturating_add(1))
}

/// One part of a zstd decompression: `input` (the part's) decoded into
/// `out` from `start`, a block at a time, until the input is taken,
/// `part_out` bytes are made or the output is full: the input taken and
/// the output position after.
///
/// A block makes up to 128 KiB from 4 bytes (RLE), so the input bound
/// alone would let one part make the whole room: each call is given what
/// the decoder says its next unit needs (the rest of a block and the next
/// one's header; at a frame's start its first bytes), so it decodes one
/// block.
fn zstd_part<O: Output + ?Sized>(
    d: &mut Dctx,
    next_in: &mut usize,
    input: &[u8],
    out: &mut O,
    start: usize,
    part_out: usize,
) -> Result<(usize, usize), CodecError> {
    let (mut used, mut pos) = (0, start);
    while pos - start < part_out {
        let feed = match *next_in {
            0 => ZSTD_FRAME_PREFIX,
            n => n,
        };
        let end = input.len().min(used + feed);
        let (took, after, hint) = d.stream(&input[used..end], out, pos)?;
        *next_in = hint;
        let before = pos;
        (used, pos) = (used + took, after);
        if used == input.len() || (took, pos) == (0, before) {
            break;
        }
    }
    Ok((used, pos))
}

/// A decoder of one LZ4 frame of the shared input.
type Lz4Decoder = lz4_flex::frame::FrameDecoder<Cursor<Frame>>;

/// How libdeflate frames `alg`'s deflate data in `input`: the framing and
/// the range it decodes the data from (header before, trailer's size
/// after); `Corrupt` where libdeflate refuses the header.
fn deflate_framing(alg: Algorithm, input: &[u8]) -> Result<(Framing, (usize, usize)), CodecError> {
    let bad = Err(CodecError::Corrupt);
    match alg {
        Algorithm::Zlib => {
            // CMF and FLG: the check, deflate, a window up to 32 KiB, no
            // preset dictionary.
            if input.len() < 6 {
                return bad;
            }
            let hdr = u16::from_be_bytes([input[0], input[1]]);
            if hdr % 31 != 0 || (hdr >> 8) & 0xf != 8 || hdr >> 12 > 7 || (hdr >> 5) & 1 != 0 {
                return bad;
            }
            Ok((Framing::Zlib(1), (2, input.len() - 4)))
        }
        Algorithm::Gzip => {
            const FOOTER: usize = 8;
            if input.len() < 10 + FOOTER || input[..3] != [0x1f, 0x8b, 8] {
                return bad;
            }
            let flg = input[3];
            if flg & 0xe0 != 0 {
                return bad;
            }
            let end = input.len();
            let mut at = 10;
            if flg & 0x04 != 0 {
                let xlen = u16::from_le_bytes([input[at], input[at + 1]]) as usize;
                at += 2;
                if end - at < xlen + FOOTER {
                    return bad;
                }
                at += xlen;
            }
            // A name, then a comment, each up to its zero byte, the way
            // libdeflate walks them (the byte before the end is the
            // last it looks at).
            for flag in [0x08, 0x10] {
                if flg & flag != 0 {
                    loop {
                        let b = input[at];
                        at += 1;
                        if b == 0 || at == end {
                            break;
                        }
                    }
                    if end - at < FOOTER {
                        return bad;
                    }
                }
            }
            // The header's CRC-16, not checked (libdeflate skips it).
            if flg & 0x02 != 0 {
                at += 2;
                if end < at || end - at < FOOTER {
                    return bad;
                }
            }
            Ok((Framing::Gzip(0), (at, end - FOOTER)))
        }
        _ => Ok((Framing::Raw, (0, input.len()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{compress_bound, Engine};
    use proptest::prelude::*;

    /// The most output a zstd block makes (`ZSTD_BLOCKSIZE_MAX`), from as
    /// few as 4 bytes of input (an RLE block).
    const ZSTD_BLOCK_MAX: usize = 128 << 10;

    type Outcome = Result<(Inflated, Vec<u8>), CodecError>;

    fn whole(alg: Algorithm, input: &[u8], room: usize, max_ratio: u16) -> Outcome {
        let mut out = vec![0u8; room];
        let got = Engine::new().decompress(alg, input, &mut out, max_ratio)?;
        out.truncate(got.produced);
        Ok((got, out))
    }

    /// Decoded part by part: the outcome, and the parts it took. zstd is
    /// decoded both into its own buffer and in place into the caller's,
    /// which must agree.
    fn in_parts(
        alg: Algorithm,
        input: &[u8],
        room: usize,
        max_ratio: u16,
        parts: (usize, usize),
    ) -> (Outcome, usize) {
        let own = decode_in_parts(alg, input, room, max_ratio, parts, false);
        if alg == Algorithm::Zstd {
            let in_place = decode_in_parts(alg, input, room, max_ratio, parts, true);
            assert_eq!(in_place, own, "in place and in a buffer of its own");
        }
        own
    }

    fn decode_in_parts(
        alg: Algorithm,
        input: &[u8],
        room: usize,
        max_ratio: u16,
        (out, inp): (usize, usize),
        in_place: bool,
    ) -> (Outcome, usize) {
        let mut p = match DecompressParts::new(alg, input.to_vec(), room, max_ratio) {
            Ok(p) => p.parts_of(out, inp),
            Err(e) => return (Err(e), 0),
        };
        assert_eq!(p.writes_into(), alg == Algorithm::Zstd);
        let mut target = vec![0xa5u8; if in_place { p.out_len() } else { 0 }];
        let mut back = Vec::new();
        for n in 1.. {
            let r = match in_place {
                true => p.next_part_into(&mut target[..]).map(|(k, end)| {
                    let at = back.len();
                    (target[at..at + k].to_vec(), end)
                }),
                false => p.next_part().map(|(made, end)| (made.to_vec(), end)),
            };
            match r {
                Err(e) => return (Err(e), n),
                Ok((made, end)) => {
                    // zstd: a call's blocks may end past the part's output.
                    let most = match alg {
                        Algorithm::Zstd => out + 2 * ZSTD_BLOCK_MAX,
                        _ => out,
                    };
                    assert!(made.len() <= most, "a part of {} bytes", made.len());
                    back.extend_from_slice(&made);
                    if let Some(e) = end {
                        assert_eq!(back.len(), e.produced);
                        return (Ok((e, back)), n);
                    }
                }
            }
            assert!(n < 10_000_000, "no end");
        }
        unreachable!()
    }

    /// The same outcome, but for a damaged input longer than its room,
    /// which may fail either way (see the module's comment).
    fn agree(a: &Outcome, b: &Outcome) -> bool {
        use CodecError::*;
        match (a, b) {
            (Ok(x), Ok(y)) => x == y,
            (Err(x), Err(y)) => {
                x == y
                    || matches!(
                        (x, y),
                        (NoSpace | Ratio, Corrupt) | (Corrupt, NoSpace | Ratio)
                    )
            }
            _ => false,
        }
    }

    fn data(n: usize, seed: u64) -> Vec<u8> {
        let words: [&[u8]; 5] = [b"queue ", b"domain ", b"IOVA ", b"engine\n", b"PASID "];
        let mut x = seed | 1;
        let mut out = Vec::with_capacity(n + 8);
        while out.len() < n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            match x % 8 {
                0 => out.extend_from_slice(&x.to_le_bytes()),
                7 => out.extend(std::iter::repeat_n(b'0', (x >> 40) as usize % 300)),
                i => out.extend_from_slice(words[i as usize % 5]),
            }
        }
        out.truncate(n);
        out
    }

    fn compressed(alg: Algorithm, level: i8, d: &[u8]) -> Vec<u8> {
        let mut c = vec![0; compress_bound(alg, d.len())];
        let n = Engine::new().compress(alg, level, d, &mut c).unwrap();
        c.truncate(n);
        c
    }

    fn level_of(alg: Algorithm, pick: u8) -> i8 {
        match alg {
            Algorithm::Zstd => [1, 3, 19][pick as usize % 3],
            Algorithm::Lz4 => 1,
            _ => [1, 6, 12][pick as usize % 3],
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(std::env::var("PARTS_CASES").map_or(400, |v| v.parse().unwrap())))]
        /// Against the one-shot call: streams whole, cut short, damaged,
        /// with bytes after them or a second stream, into rooms too small,
        /// exact and large, with and without a ratio limit, in parts of
        /// every size.
        #[test]
        fn parts_decode_as_the_one_shot_call(
            alg in prop::sample::select(Algorithm::ALL.to_vec()),
            n in 0usize..150_000,
            seed in any::<u64>(),
            level in any::<u8>(),
            change in 0u8..6,
            at in any::<prop::sample::Index>(),
            byte in any::<u8>(),
            room_pick in 0u8..5,
            ratio in prop::sample::select(vec![0u16, 0, 1, 3, 40]),
            out_part in 1usize..70_000,
            in_part in 1usize..70_000,
        ) {
            let d = data(n, seed);
            let mut z = compressed(alg, level_of(alg, level), &d);
            let mut len = d.len();
            match change {
                1 => z.truncate(at.index(z.len() + 1)),
                2 if !z.is_empty() => {
                    let i = at.index(z.len());
                    z[i] ^= byte | 1;
                }
                3 => z.extend_from_slice(&data(at.index(40) + 1, seed ^ 7)),
                4 => {
                    let e = data(at.index(20_000), seed ^ 9);
                    z.extend_from_slice(&compressed(alg, 1, &e));
                    len += e.len();
                }
                _ => {}
            }
            let room = match room_pick {
                0 => len,
                1 => len.saturating_sub(1),
                2 => at.index(len + 1),
                3 => len + 1000,
                _ => 4 * len + 100_000,
            };
            let a = whole(alg, &z, room, ratio);
            let (b, _) = in_parts(alg, &z, room, ratio, (out_part, in_part));
            // Undamaged input (whole streams, one or two) fails the same
            // way: the exception is for damaged input only.
            let clean = matches!(change, 0 | 4 | 5);
            prop_assert!(if clean { a == b } else { agree(&a, &b) },
                "{alg}: one-shot {:?} in parts {:?}",
                a.as_ref().map(|x| x.0), b.as_ref().map(|x| x.0));
        }
    }

    /// A long stream takes many parts, none of them more than a part's
    /// output, and ends as the one-shot call does.
    #[test]
    fn a_long_stream_takes_many_parts() {
        let d = data(3 << 20, 5);
        for alg in Algorithm::ALL {
            let z = compressed(alg, 1, &d);
            let (got, parts) = in_parts(alg, &z, d.len(), 0, (256 << 10, 64 << 10));
            let (e, back) = got.unwrap();
            assert_eq!((e.consumed, e.produced), (z.len(), d.len()), "{alg}");
            assert!(back == d, "{alg}");
            // zstd's parts are bounded by their input.
            let least = match alg {
                Algorithm::Zstd => z.len() / (64 << 10),
                _ => d.len() / (256 << 10),
            };
            assert!(parts >= least.max(2), "{alg}: {parts} parts");
        }
    }

    /// zstd's output is the decoder's own or the caller's from the first
    /// part on, and the caller's is the same length on every call.
    #[test]
    fn a_zstd_output_stays_where_it_began() {
        let d = data(300_000, 3);
        let z = compressed(Algorithm::Zstd, 1, &d);
        let begin = || {
            DecompressParts::new(Algorithm::Zstd, z.clone(), d.len(), 0)
                .unwrap()
                .parts_of(4096, 4096)
        };
        let mut p = begin();
        p.next_part().unwrap();
        assert!(!p.writes_into());
        let mut out = vec![0u8; p.out_len()];
        assert_eq!(
            p.next_part_into(&mut out[..]).unwrap_err(),
            CodecError::Param
        );
        let mut p = begin();
        assert_eq!(
            p.next_part_into(&mut out[..10]).unwrap_err(),
            CodecError::Param
        );
        p.next_part_into(&mut out[..]).unwrap();
        assert!(p.writes_into());
        assert_eq!(p.next_part().unwrap_err(), CodecError::Param);
        // Another buffer of the same length: zstd refuses it.
        let mut other = vec![0u8; p.out_len()];
        assert!(p.next_part_into(&mut other[..]).is_err());
        let deflate = DecompressParts::new(Algorithm::Deflate, z.clone(), d.len(), 0).unwrap();
        assert!(!deflate.writes_into());
    }

    /// A bomb stops at the ratio limit, and a room the output fills
    /// exactly is enough, in parts as whole.
    #[test]
    fn limits_hold_in_parts() {
        let zeros = vec![0u8; 1 << 20];
        for alg in Algorithm::ALL {
            let z = compressed(alg, 1, &zeros);
            let (r, _) = in_parts(alg, &z, 8 << 20, 10, (4096, 4096));
            assert_eq!(r.map(|x| x.0), Err(CodecError::Ratio), "{alg}");
            let (r, _) = in_parts(alg, &z, zeros.len(), 0, (4096, 4096));
            assert_eq!(r.unwrap().0.produced, zeros.len(), "{alg}");
            let (r, _) = in_parts(alg, &z, zeros.len() - 1, 0, (4096, 4096));
            assert_eq!(r.map(|x| x.0), Err(CodecError::NoSpace), "{alg}");
        }
    }

    /// A part's output is bounded for zstd too: a few bytes of RLE
    /// blocks make 128 KiB each, so a part's input bound alone would let
    /// one part make the whole room (64 MiB of zeros is 2 KiB of zstd).
    #[test]
    fn a_zstd_part_makes_at_most_about_a_part_of_output() {
        let zeros = vec![0u8; 16 << 20];
        let z = compressed(Algorithm::Zstd, 1, &zeros);
        assert!(z.len() < 64 << 10, "{} bytes", z.len());
        let mut p = DecompressParts::new(Algorithm::Zstd, z.clone(), zeros.len(), 0).unwrap();
        let (mut most, mut back) = (0, 0);
        loop {
            let (made, end) = p.next_part().unwrap();
            most = most.max(made.len());
            back += made.len();
            if let Some(e) = end {
                assert_eq!((e.consumed, e.produced), (z.len(), zeros.len()));
                break;
            }
        }
        assert_eq!(back, zeros.len());
        assert!(most <= OUT_PART + (256 << 10), "a part of {most} bytes");
    }

    /// LZ4 frames that make nothing (an empty frame is 11 bytes, and
    /// each sets up a decoder: 8 MiB of them is over 100 ms) are walked a
    /// bounded number a part, as zstd's skippable frames are by the
    /// part's input, with the one-shot call's outcome.
    #[test]
    fn empty_lz4_frames_take_many_parts() {
        use lz4_flex::frame::{BlockSize, FrameEncoder, FrameInfo};
        let info = FrameInfo::new().block_size(BlockSize::Max4MB);
        let one = FrameEncoder::with_frame_info(info, Vec::new())
            .finish()
            .unwrap();
        let mut z: Vec<u8> = one
            .iter()
            .copied()
            .cycle()
            .take(one.len() * 20_000)
            .collect();
        z.extend_from_slice(&compressed(Algorithm::Lz4, 1, b"the end"));
        let a = whole(Algorithm::Lz4, &z, 8 << 20, 0);
        assert_eq!(a.as_ref().unwrap().0.produced, 7);
        let (b, parts) = in_parts(Algorithm::Lz4, &z, 8 << 20, 0, (4096, 4096));
        assert!(agree(&a, &b), "{:?}", b.map(|x| x.0));
        assert!(parts >= z.len() / 4096, "{parts} parts");
    }

    /// Skippable frames (zstd's and LZ4's, with the same magic range)
    /// before, between and after data frames, alone, empty, cut short:
    /// as the one-shot call takes them, in parts of every size.
    #[test]
    fn skippable_frames_decode_as_the_one_shot_call() {
        let d = data(50_000, 21);
        let skip = |n: usize, tag: u8| {
            let mut f = vec![0x50 | (tag & 0xf), 0x2a, 0x4d, 0x18];
            f.extend_from_slice(&(n as u32).to_le_bytes());
            f.extend(std::iter::repeat_n(0xa5, n));
            f
        };
        for alg in [Algorithm::Zstd, Algorithm::Lz4] {
            let z = compressed(alg, 1, &d);
            let cases: Vec<Vec<u8>> = vec![
                [skip(0, 0), z.clone()].concat(),
                [z.clone(), skip(5, 1)].concat(),
                [z.clone(), skip(100_000, 2), z.clone()].concat(),
                skip(3, 3),
                [skip(0, 4), skip(0, 5)].concat(),
                [z.clone(), skip(10, 6)[..12].to_vec()].concat(),
                [z.clone(), skip(10, 7)[..6].to_vec()].concat(),
                [z.clone(), vec![0x50, 0x2a, 0x4d]].concat(),
            ];
            for (i, c) in cases.iter().enumerate() {
                for room in [0, d.len() - 1, d.len(), 2 * d.len(), 3 * d.len()] {
                    for ratio in [0, 1, 2] {
                        let a = whole(alg, c, room, ratio);
                        for parts in [(1, 1), (7, 3), (4096, 4096), (1 << 20, 256 << 10)] {
                            let (b, _) = in_parts(alg, c, room, ratio, parts);
                            assert!(
                                agree(&a, &b),
                                "{alg} case {i} room {room} ratio {ratio} {parts:?}: {:?} {:?}",
                                a.as_ref().map(|x| x.0),
                                b.as_ref().map(|x| x.0)
                            );
                        }
                    }
                }
            }
        }
    }

    /// An LZ4 frame of one-byte blocks (5 bytes of input and a decoder
    /// read each: a MiB of output, a part's, was 20 ms here) is cut by
    /// the input its parts read too, not only by their output.
    #[test]
    fn lz4_frames_of_tiny_blocks_take_many_parts() {
        use lz4_flex::frame::{BlockSize, FrameEncoder, FrameInfo};
        let info = FrameInfo::new().block_size(BlockSize::Max64KB);
        let one = FrameEncoder::with_frame_info(info, Vec::new())
            .finish()
            .unwrap();
        let mut z = one[..7].to_vec();
        for i in 0..200_000u32 {
            z.extend_from_slice(&0x8000_0001u32.to_le_bytes());
            z.push(i as u8);
        }
        z.extend_from_slice(&[0; 4]);
        let a = whole(Algorithm::Lz4, &z, 1 << 20, 0);
        assert_eq!(a.as_ref().unwrap().0.produced, 200_000);
        let (b, parts) = in_parts(Algorithm::Lz4, &z, 1 << 20, 0, (1 << 20, 4096));
        assert!(a == b, "{:?}", b.map(|x| x.0));
        assert!(parts >= z.len() / 8192, "{parts} parts");
    }

    /// The first exception: deflate that libdeflate takes and zlib-rs
    /// refuses, besides an incomplete code's unused codeword: length
    /// symbols 286 and 287 (libdeflate reads them as length 258) and
    /// offset symbols 30 and 31 (as 24577 and more).
    #[test]
    fn symbols_past_deflates_alphabets_are_the_first_exception() {
        // A fixed-Huffman block: 'a', then length symbol `len` at
        // distance 1 (offset symbol 0), then the end of the block.
        let block = |len: u32| {
            let (mut out, mut acc, mut n) = (Vec::new(), 0u32, 0);
            let mut put = |v: u32, bits: u32| {
                acc |= v << n;
                n += bits;
                while n >= 8 {
                    out.push(acc as u8);
                    acc >>= 8;
                    n -= 8;
                }
            };
            let huff = |code: u32, bits: u32| code.reverse_bits() >> (32 - bits);
            put(1, 1); // final
            put(1, 2); // fixed codes
            put(huff(0x30 + u32::from(b'a'), 8), 8);
            put(huff(0xc0 + len - 280, 8), 8);
            put(0, 5);
            put(0, 7); // 256, the end
            put(0, 7); // (out with the last bits; a byte after the stream)
            out
        };
        for len in [285, 286, 287] {
            let z = block(len);
            let a = whole(Algorithm::Deflate, &z, 1000, 0);
            let (b, _) = in_parts(Algorithm::Deflate, &z, 1000, 0, (100, 100));
            assert_eq!(a.as_ref().map(|x| x.0.produced), Ok(259), "{len}");
            if len == 285 {
                assert!(a == b);
            } else {
                assert_eq!(b.map(|x| x.0), Err(CodecError::Corrupt), "{len}");
            }
        }
    }

    /// A zstd frame whose window is larger than any a stream session
    /// takes decodes in parts, as the one-shot call decodes it.
    #[test]
    fn a_zstd_frame_with_a_large_window_decodes() {
        let d = data(1 << 20, 11);
        let mut c = zstd_safe::CCtx::create();
        c.set_parameter(zstd_safe::CParameter::WindowLog(27))
            .unwrap();
        c.set_parameter(zstd_safe::CParameter::ContentSizeFlag(false))
            .unwrap();
        let mut z = vec![0u8; compress_bound(Algorithm::Zstd, d.len())];
        let n = c.compress2(&mut z[..], &d).unwrap();
        z.truncate(n);
        let (r, parts) = in_parts(Algorithm::Zstd, &z, d.len(), 0, (4096, 4096));
        assert!(r.unwrap().1 == d);
        assert!(parts > 10);
    }

    /// Where libdeflate reads the framing: a gzip header's CRC is skipped,
    /// names and comments run to their zero byte, and the trailer follows
    /// the data (bytes after it are not taken).
    #[test]
    fn gzip_headers_are_read_as_libdeflate_reads_them() {
        let d = data(100_000, 3);
        let z = compressed(Algorithm::Gzip, 6, &d);
        let mut h = z[..10].to_vec();
        h[3] = 0x04 | 0x08 | 0x10 | 0x02;
        h.extend_from_slice(&[3, 0, b'x', b'y', b'z']);
        h.extend_from_slice(b"name\0comment\0");
        h.extend_from_slice(&[0xde, 0xad]); // not the header's CRC
        h.extend_from_slice(&z[10..]);
        h.extend_from_slice(b"after");
        let a = whole(Algorithm::Gzip, &h, d.len(), 0);
        assert_eq!(a.as_ref().unwrap().0.consumed, h.len() - 5);
        let (b, _) = in_parts(Algorithm::Gzip, &h, d.len(), 0, (1000, 1000));
        assert!(agree(&a, &b), "{:?} {:?}", a.map(|x| x.0), b.map(|x| x.0));
        for cut in [11, 14, 20, 30, h.len() - 6] {
            let a = whole(Algorithm::Gzip, &h[..cut], d.len(), 0);
            let (b, _) = in_parts(Algorithm::Gzip, &h[..cut], d.len(), 0, (1000, 1000));
            assert!(
                a.is_err() && agree(&a, &b),
                "cut at {cut}: {:?}",
                b.map(|x| x.0)
            );
        }
    }
}
