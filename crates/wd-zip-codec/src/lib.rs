//! The compression engines behind one bounded interface: the zip device
//! computes with them in the host, and the client library's CPU path with
//! the same code in the caller's thread, so both produce the same bytes
//! (a long compression at a slow level in the same [`Parts`]: the device
//! serves it a part per pass).
//!
//! Which library serves what was chosen by measurement (`wd bench zip`
//! shows them side by side): one-shot deflate, zlib and gzip go to
//! libdeflate (twice zlib's speed at level 1 and more in decompression),
//! except level 1 compression on ISA-L's igzip where it is installed and
//! `WD_ZIP_ISAL=1` asks for it (several times faster again, output within
//! a few percent of zlib's),
//! deflate streams to zlib-rs (zlib's stream semantics: flush modes,
//! dictionaries, window sizes), zstd to libzstd, LZ4 frames to lz4_flex.
//!
//! Every call is bounded by the buffers it is given: output never grows
//! past the caller's room, and a decompression may also be held to a
//! ratio of output to input consumed (a bomb stops at the limit). Corrupt
//! or truncated input is an error, never a read past the input. No I/O.
#![deny(unsafe_code)]

mod decompress_parts;
pub mod isal;
mod libdeflate;
mod mem;
mod parts;
pub mod pieces;
pub mod stock;
mod stream;
mod zstd_raw;

pub use decompress_parts::{decompress_cap, DecompressParts};
pub use mem::{Input, Output};
pub use parts::{part_len, Parts};
use wd_msg::status;
use wd_zip_msg::{Algorithm, DEFAULT_LEVEL};

pub use stream::{Step, Stream, StreamParams, PART_OUT};
pub use wd_zip_msg::Flush;

/// CRC-32 (gzip's), for callers that check bytes they already handed out
/// against bytes made again.
pub use flate2::Crc;

/// Why a compression or decompression failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// The output did not fit in the room given.
    #[error("output buffer too small")]
    NoSpace,
    /// The input is not a valid stream of the algorithm (corrupt, or
    /// truncated where the call needed it whole).
    #[error("corrupt or truncated compressed data")]
    Corrupt,
    /// Decompression would expand past the request's ratio limit.
    #[error("decompression exceeds the ratio limit")]
    Ratio,
    /// A zlib stream asks for a preset dictionary the session lacks.
    #[error("stream needs a preset dictionary")]
    NeedDict,
    /// A level, window or parameter the algorithm does not take.
    #[error("parameter out of range")]
    Param,
    /// The library could not allocate its state.
    #[error("out of memory")]
    Memory,
    /// A stream lost a step's output after taking its input (memory the
    /// output was to go to failed): it cannot go on.
    #[error("stream broken: a step's output could not be delivered")]
    Broken,
}

impl CodecError {
    /// The completion status a device reports for it (the one mapping).
    pub fn status(self) -> i32 {
        match self {
            CodecError::NoSpace => status::ENOBUFS,
            CodecError::Corrupt | CodecError::NeedDict => status::EBADMSG,
            CodecError::Ratio => status::EOVERFLOW,
            CodecError::Param => status::EINVAL,
            CodecError::Memory | CodecError::Broken => status::EIO,
        }
    }
}

/// Resolve a level for an algorithm (checked by the message decoder
/// already; checked again here for callers in process).
fn level_of(alg: Algorithm, level: i8) -> Result<i32, CodecError> {
    wd_zip_msg::check_level(alg, level).map_err(|_| CodecError::Param)?;
    Ok(match (alg, level) {
        (Algorithm::Zstd, DEFAULT_LEVEL) => 3,
        (Algorithm::Lz4, _) => 1,
        (_, DEFAULT_LEVEL) => 6,
        (_, l) => l as i32,
    })
}

/// The most output `len` input bytes can need when compressed with `alg`
/// at any level: room for which a compression cannot fail. `usize::MAX`
/// (room nobody has) for a length no buffer in memory can have, where the
/// libraries' own formulas would wrap to a small number.
pub fn compress_bound(alg: Algorithm, len: usize) -> usize {
    // Every bound is well under twice the input and a megabyte.
    if len > usize::MAX / 2 - (1 << 20) {
        return usize::MAX;
    }
    match alg {
        Algorithm::Deflate | Algorithm::Zlib | Algorithm::Gzip => libdeflate::bound(alg, len),
        Algorithm::Zstd => zstd_safe::compress_bound(len),
        // Each 64 KiB block may be stored with its 4-byte length; the
        // frame adds a header (at most 19 bytes), an end mark and a
        // checksum.
        Algorithm::Lz4 => len + 4 * len.div_ceil(64 << 10) + 32,
    }
}

/// Whether a block compressed at a level gives the same stream wherever
/// and whenever it is compressed (the device, a client's CPU engine, another
/// run): true unless ISA-L serves level 1 (see [`isal`]).
pub fn reproducible() -> bool {
    !isal::available()
}

/// What serves each algorithm, as `wd ls` shows it: (one-shot, stream).
pub fn engines() -> Vec<(Algorithm, &'static str, Option<&'static str>)> {
    Algorithm::ALL
        .into_iter()
        .map(|a| match a {
            Algorithm::Deflate | Algorithm::Zlib | Algorithm::Gzip => {
                let one_shot = match isal::available() {
                    true => "isa-l igzip (level 1), libdeflate",
                    false => "libdeflate",
                };
                (a, one_shot, Some("zlib-rs"))
            }
            Algorithm::Zstd => (a, "libzstd", Some("libzstd")),
            Algorithm::Lz4 => (a, "lz4_flex", None),
        })
        .collect()
}

impl Engine {
    /// As [`Engine::compress`], appending the stream to `out` (room is
    /// made for [`compress_bound`] bytes, none of it zeroed).
    pub fn compress_vec(
        &mut self,
        alg: Algorithm,
        level: i8,
        input: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<usize, CodecError> {
        if !Engine::works_in_place(alg) {
            let at = out.len();
            out.resize(at + compress_bound(alg, input.len()), 0);
            let n = self.compress(alg, level, input, &mut out[at..]);
            out.truncate(at + *n.as_ref().unwrap_or(&0));
            return n;
        }
        let mut spare = mem::Spare::new(out, compress_bound(alg, input.len()));
        let n = self.compress(alg, level, input, &mut spare)?;
        spare.commit(n);
        Ok(n)
    }

    /// As [`Engine::decompress`], appending at most `room` bytes to `out`
    /// (none zeroed first).
    pub fn decompress_vec(
        &mut self,
        alg: Algorithm,
        input: &[u8],
        out: &mut Vec<u8>,
        room: usize,
        max_ratio: u16,
    ) -> Result<Inflated, CodecError> {
        // A ratio limit bounds the output whatever the room: no more is
        // allocated (one byte past the bound tells a bomb from a stream
        // that fits).
        let room = match max_ratio {
            0 => room,
            r => room.min(input.len().saturating_mul(r as usize).saturating_add(1)),
        };
        if room > isize::MAX as usize - out.len() {
            return Err(CodecError::Param);
        }
        if !Engine::works_in_place(alg) {
            let at = out.len();
            out.resize(at + room, 0);
            let got = self.decompress(alg, input, &mut out[at..], max_ratio);
            out.truncate(at + got.as_ref().map_or(0, |g| g.produced));
            return got;
        }
        let mut spare = mem::Spare::new(out, room);
        let got = self.decompress(alg, input, &mut spare, max_ratio)?;
        spare.commit(got.produced);
        Ok(got)
    }
}

/// A one-shot decompression's result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Inflated {
    /// Bytes of input the stream(s) took; any rest is not a stream of
    /// the algorithm (or another gzip member).
    pub consumed: usize,
    /// Bytes written.
    pub produced: usize,
}

/// One-shot engines with their state kept between calls (a device queue
/// or a thread owns one): allocating libdeflate's and zstd's tables per
/// request would cost more than compressing a small buffer.
#[derive(Default)]
pub struct Engine {
    /// Level 1 deflate when ISA-L is here.
    igzip: isal::Compressor,
    deflaters: Vec<libdeflate::Compressor>,
    inflater: Option<libdeflate::Decompressor>,
    zc: Option<zstd_raw::Cctx>,
    zd: Option<zstd_raw::Dctx>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").finish_non_exhaustive()
    }
}

/// Bytes of zstd compression context kept between one-shot calls.
const KEEP_ZSTD: usize = 16 << 20;

pub(crate) fn zstd_error(code: usize) -> CodecError {
    match zstd_safe::get_error_name(code) {
        "Destination buffer is too small" => CodecError::NoSpace,
        "Allocation error : not enough memory" => CodecError::Memory,
        "Unsupported parameter" | "Parameter is out of bound" => CodecError::Param,
        // A frame whose window is past the decoder's limit (8 MiB): a
        // limit refused, as a ratio is, not damage.
        "Frame requires too much memory for decoding" => CodecError::Ratio,
        _ => CodecError::Corrupt,
    }
}

impl Engine {
    /// An engine with nothing allocated yet.
    pub fn new() -> Engine {
        Engine::default()
    }

    /// Whether `alg` works on device memory in place ([`Input`] and
    /// [`Output`] that are not slices); LZ4's engine takes only slices.
    pub fn works_in_place(alg: Algorithm) -> bool {
        alg != Algorithm::Lz4
    }

    /// Compress all of `input` into one stream in `out`: the bytes
    /// written. An input longer than one part at a slow level
    /// ([`part_len`]) is compressed in [`Parts`], as the zip device cuts
    /// it to serve it a part per pass: the same bytes on every path.
    pub fn compress(
        &mut self,
        alg: Algorithm,
        level: i8,
        input: &(impl Input + ?Sized),
        out: &mut (impl Output + ?Sized),
    ) -> Result<usize, CodecError> {
        // (Inputs shorter than the shortest part skip the lookup: most
        // calls, and the small ones, whose cost it would show in.)
        if input.len() > parts::SHORTEST_PART
            && part_len(alg, level).is_some_and(|p| input.len() > p)
        {
            return self.compress_in_parts(alg, level, input, out);
        }
        self.compress_whole(alg, level, input, out)
    }

    /// [`Engine::compress`] of an input [`Parts`] cuts. Parts take slices:
    /// device memory and room not yet initialised are copied (a slow
    /// level compresses tens of MB/s at most; a copy runs at GB/s).
    fn compress_in_parts(
        &mut self,
        alg: Algorithm,
        level: i8,
        input: &(impl Input + ?Sized),
        out: &mut (impl Output + ?Sized),
    ) -> Result<usize, CodecError> {
        let copied;
        let input = match input.as_slice() {
            Some(s) => s,
            None => {
                copied = mem::copy_in(input);
                &copied[..]
            }
        };
        let mut parts = Parts::new(alg, level, input.len() as u64, false)?;
        let mut made = 0;
        let mut run = |e: &mut Engine, o: &mut [u8]| {
            while !parts.finished() {
                let at = parts.taken() as usize;
                let part = &input[at..at + parts.next_len()];
                made += parts.compress(e, part, &mut o[made..])?;
            }
            Ok::<_, CodecError>(made)
        };
        match out.as_mut_slice() {
            Some(o) => run(self, o),
            None => {
                let mut o = vec![0u8; out.len()];
                let n = run(self, &mut o)?;
                mem::copy_out(out, &o[..n]);
                Ok(n)
            }
        }
    }

    /// Compress `input` in one call of its engine.
    fn compress_whole(
        &mut self,
        alg: Algorithm,
        level: i8,
        input: &(impl Input + ?Sized),
        out: &mut (impl Output + ?Sized),
    ) -> Result<usize, CodecError> {
        let level = level_of(alg, level)?;
        match alg {
            Algorithm::Deflate | Algorithm::Zlib | Algorithm::Gzip => {
                if level == 1 {
                    if let Some(n) = self.igzip.compress(alg, input, out) {
                        return Ok(n);
                    }
                }
                let c = match self.deflaters.iter().position(|c| c.level() == level) {
                    Some(i) => &mut self.deflaters[i],
                    None => {
                        let c = libdeflate::Compressor::new(level).ok_or(CodecError::Memory)?;
                        // A few levels stay warm; a client cycling
                        // through all of them reallocates.
                        if self.deflaters.len() >= 4 {
                            self.deflaters.remove(0);
                        }
                        self.deflaters.push(c);
                        self.deflaters.last_mut().expect("just pushed")
                    }
                };
                c.compress(alg, input, out).ok_or(CodecError::NoSpace)
            }
            Algorithm::Zstd => {
                if self.zc.is_none() {
                    self.zc = Some(zstd_raw::Cctx::new().ok_or(CodecError::Memory)?);
                }
                let zc = self.zc.as_mut().expect("just made");
                let r = zc.compress(level, input, out);
                // Tables a large input at a high level needed (up to 50
                // MiB) are not kept warm: an idle queue holds nothing big.
                if zc.size() > KEEP_ZSTD {
                    self.zc = None;
                }
                r
            }
            Algorithm::Lz4 => match (input.as_slice(), out.as_mut_slice()) {
                (Some(i), Some(o)) => lz4_compress(i, o),
                _ => Err(CodecError::Param),
            },
        }
    }

    /// Compress all of `input` into raw deflate that ends at a full flush
    /// point rather than a final block ([`pieces`]): a piece of a longer
    /// stream, which the next piece (compressed without this one's
    /// history) follows. Room of [`compress_bound`] plus 5 always
    /// suffices.
    pub fn compress_piece(
        &mut self,
        level: i8,
        input: &(impl Input + ?Sized),
        out: &mut [u8],
    ) -> Result<usize, CodecError> {
        let n = self.compress(Algorithm::Deflate, level, input, out)?;
        pieces::end_open(out, n)
    }

    /// Decompress the stream(s) at the start of `input` into `out`. With
    /// `max_ratio` non-zero, no more than `max_ratio` times `input` is
    /// written, and output beyond `max_ratio` times the input consumed is
    /// refused ([`CodecError::Ratio`], after it was written: trailing
    /// bytes after the stream count for the first bound only).
    pub fn decompress<O: Output + ?Sized>(
        &mut self,
        alg: Algorithm,
        input: &[u8],
        out: &mut O,
        max_ratio: u16,
    ) -> Result<Inflated, CodecError> {
        // No stream of `input` may legitimately produce more than this.
        let cap = decompress_cap(input.len(), out.len(), max_ratio);
        let room = out.len();
        let over = |e: CodecError| {
            if e == CodecError::NoSpace && cap < room {
                CodecError::Ratio
            } else {
                e
            }
        };
        let done = self.decompress_into(alg, input, out, cap).map_err(over)?;
        if max_ratio != 0 && done.produced > done.consumed.saturating_mul(max_ratio as usize) {
            return Err(CodecError::Ratio);
        }
        Ok(done)
    }

    /// Decompress into the first `cap` bytes of `out`.
    fn decompress_into<O: Output + ?Sized>(
        &mut self,
        alg: Algorithm,
        input: &[u8],
        out: &mut O,
        cap: usize,
    ) -> Result<Inflated, CodecError> {
        let mut out = mem::Capped::new(out, cap);
        let out = &mut out;
        if input.is_empty() {
            // No algorithm's stream is empty (zstd would read it as zero
            // frames).
            return Err(CodecError::Corrupt);
        }
        match alg {
            Algorithm::Deflate | Algorithm::Zlib | Algorithm::Gzip => {
                if self.inflater.is_none() {
                    self.inflater =
                        Some(libdeflate::Decompressor::new().ok_or(CodecError::Memory)?);
                }
                let d = self.inflater.as_mut().expect("just made");
                let map = |e| match e {
                    libdeflate::Inflate::Bad => CodecError::Corrupt,
                    libdeflate::Inflate::Space => CodecError::NoSpace,
                };
                let (used, made) = d.decompress(alg, input, out).map_err(map)?;
                Ok(Inflated {
                    consumed: used,
                    produced: made,
                })
            }
            Algorithm::Zstd => {
                if self.zd.is_none() {
                    self.zd = Some(zstd_raw::Dctx::new().ok_or(CodecError::Memory)?);
                }
                let made = self
                    .zd
                    .as_mut()
                    .expect("just made")
                    .decompress(input, out)?;
                Ok(Inflated {
                    consumed: input.len(),
                    produced: made,
                })
            }
            Algorithm::Lz4 => match out.as_mut_slice() {
                Some(o) => lz4_decompress(input, o),
                None => Err(CodecError::Param),
            },
        }
    }
}

fn lz4_compress(input: &[u8], out: &mut [u8]) -> Result<usize, CodecError> {
    use std::io::Write;
    let mut w = lz4_flex::frame::FrameEncoder::new(std::io::Cursor::new(out));
    let io = |_| CodecError::NoSpace;
    w.write_all(input).map_err(io)?;
    let cursor = w.finish().map_err(|_| CodecError::NoSpace)?;
    Ok(cursor.position() as usize)
}

/// The data frames of `input`, walked by their headers and block lengths
/// (skippable frames left out), with what a frame given to the decoder
/// cut short must be checked against; `None` unless `input` is whole
/// frames: the frame decoder takes a stream cut at a block boundary for a
/// finished one, and stops at the end of each frame.
fn lz4_frames(input: &[u8]) -> Option<Vec<(&[u8], Option<Lz4Check>)>> {
    let mut frames = Vec::new();
    let mut at = 0;
    while at < input.len() {
        let f = lz4_frame_at(input, at)?;
        if f.data {
            frames.push((&input[at..f.decoded], f.check));
        }
        at = f.end;
    }
    Some(frames)
}

/// An LZ4 frame in its input ([`lz4_frame_at`]).
pub(crate) struct Lz4FrameAt {
    /// Where it ends.
    pub(crate) end: usize,
    /// Whether it holds data (else it is skippable).
    pub(crate) data: bool,
    /// Where the bytes the frame decoder is given end: the frame's end, or
    /// its end mark where that is 0x80000000 (lz4_flex takes it for an
    /// empty block, and would read a block checksum or the content
    /// checksum after it as the next block's header: cut before it, the
    /// frame ends at a block boundary, as the decoder allows).
    pub(crate) decoded: usize,
    /// Cut before its end mark, the decoder checks neither the content
    /// size nor the content checksum the header promises: they are
    /// checked here.
    pub(crate) check: Option<Lz4Check>,
}

/// What the content of an LZ4 frame must be, as its header and trailer
/// say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Lz4Check {
    size: Option<u64>,
    checksum: Option<u32>,
}

/// An LZ4 frame's content, checked as it is made ([`Lz4Check`]).
pub(crate) struct Lz4Verify {
    want: Lz4Check,
    hash: twox_hash::XxHash32,
    len: u64,
}

impl Lz4Verify {
    pub(crate) fn new(want: Lz4Check) -> Lz4Verify {
        Lz4Verify {
            want,
            hash: twox_hash::XxHash32::with_seed(0),
            len: 0,
        }
    }

    /// The next bytes of the content.
    pub(crate) fn update(&mut self, content: &[u8]) {
        if self.want.checksum.is_some() {
            std::hash::Hasher::write(&mut self.hash, content);
        }
        self.len += content.len() as u64;
    }

    /// Whether the content was what the frame said.
    pub(crate) fn holds(&self) -> bool {
        self.want.size.is_none_or(|n| n == self.len)
            && self
                .want
                .checksum
                .is_none_or(|c| c == self.hash.finish_32())
    }
}

/// The frame of `input` at `at` (not its end), walked by its header and
/// block lengths; `None` unless it is whole.
pub(crate) fn lz4_frame_at(input: &[u8], at: usize) -> Option<Lz4FrameAt> {
    let input = input.get(at..)?;
    let u32_at = |b: &[u8], at: usize| -> Option<u32> {
        b.get(at..at.checked_add(4)?)
            .map(|x| u32::from_le_bytes([x[0], x[1], x[2], x[3]]))
    };
    let magic = u32_at(input, 0)?;
    if magic & 0xffff_fff0 == 0x184d_2a50 {
        let len = u32_at(input, 4)? as usize;
        let end = 8usize.checked_add(len)?;
        input.get(..end)?;
        return Some(Lz4FrameAt {
            end: at + end,
            data: false,
            decoded: at + end,
            check: None,
        });
    }
    if magic != 0x184d_2204 {
        return None;
    }
    let &flg = input.get(4)?;
    // FLG, BD, content size, dictionary id, header checksum.
    let sized = flg & 8 != 0;
    let mut end = 4 + 2 + if sized { 8 } else { 0 } + if flg & 1 != 0 { 4 } else { 0 } + 1;
    let decoded = loop {
        let size = u32_at(input, end)?;
        end += 4;
        // The end mark; an "uncompressed" block of no bytes ends the
        // frame too, as the reference decoder has it: what follows is
        // the next frame, not more of this one.
        if size == 0 {
            break None;
        }
        if size == 0x8000_0000 {
            break Some(end - 4);
        }
        end =
            end.checked_add((size & 0x7fff_ffff) as usize + if flg & 0x10 != 0 { 4 } else { 0 })?;
    };
    let summed = flg & 4 != 0;
    end += if summed { 4 } else { 0 };
    input.get(..end)?;
    let check = decoded.map(|_| Lz4Check {
        size: sized.then(|| u64::from_le_bytes(input[6..14].try_into().expect("8 bytes"))),
        checksum: summed.then(|| u32_at(input, end - 4).expect("inside")),
    });
    Some(Lz4FrameAt {
        end: at + end,
        data: true,
        decoded: at + decoded.unwrap_or(end),
        check,
    })
}

fn lz4_decompress(input: &[u8], out: &mut [u8]) -> Result<Inflated, CodecError> {
    use std::io::Read;
    let frames = lz4_frames(input).ok_or(CodecError::Corrupt)?;
    let mut made = 0;
    for (frame, check) in frames {
        let from = made;
        let mut r = lz4_flex::frame::FrameDecoder::new(frame);
        // The decoder reads nothing past the frame's end: it ended when
        // none of it is left (a read of 0 bytes is also a block that
        // decodes to none, with more of the frame after it).
        let ended = |r: &lz4_flex::frame::FrameDecoder<&[u8]>| r.get_ref().is_empty();
        loop {
            if made == out.len() {
                // Full: the frame must end here.
                let mut probe = [0u8; 1];
                match r.read(&mut probe) {
                    Ok(0) if ended(&r) => break,
                    Ok(0) => continue,
                    Ok(_) => return Err(CodecError::NoSpace),
                    Err(_) => return Err(CodecError::Corrupt),
                }
            }
            match r.read(&mut out[made..]) {
                Ok(0) if ended(&r) => break,
                Ok(n) => made += n,
                Err(_) => return Err(CodecError::Corrupt),
            }
        }
        if let Some(check) = check {
            let mut v = Lz4Verify::new(check);
            v.update(&out[from..made]);
            if !v.holds() {
                return Err(CodecError::Corrupt);
            }
        }
    }
    Ok(Inflated {
        consumed: input.len(),
        produced: made,
    })
}

#[cfg(test)]
mod tests;
