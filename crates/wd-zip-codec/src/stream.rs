//! Stream sessions: a compressor or decompressor whose history and state
//! carry across calls, with zlib's flush modes. Deflate family streams
//! run on zlib-rs (zlib's own semantics, which the drop-in zlib needs);
//! zstd streams on libzstd with a bounded window.

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use wd_zip_msg::{Algorithm, Flush};
use zstd_safe::zstd_sys::ZSTD_EndDirective;
use zstd_safe::{CParameter, DParameter, InBuffer, OutBuffer};

use crate::{level_of, parts, zstd_error, zstd_raw, CodecError};

/// Output one part of a stream step writes at most ([`Stream::run_part`]):
/// a decompression may make a thousand times its input, and the zip
/// device's host buffers stay a part's size.
pub const PART_OUT: usize = 4 << 20;

/// Largest zstd window a compression uses or a stream accepts (8 MiB):
/// with the capped match-finder tables (see `zstd_raw::params`), bounds
/// what one session or request can make the host allocate.
pub const ZSTD_WINDOW_LOG: u32 = 23;

/// How to open a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamParams<'a> {
    /// Format.
    pub alg: Algorithm,
    /// Compress (else decompress).
    pub compress: bool,
    /// Compression level ([`wd_zip_msg::DEFAULT_LEVEL`] or the
    /// algorithm's range).
    pub level: i8,
    /// Deflate window bits (8-15; 0 for 15).
    pub window_bits: u8,
    /// Preset dictionary (empty: none).
    pub dict: &'a [u8],
}

impl StreamParams<'_> {
    /// [`Stream::part_len`] of a stream opened with these parameters: a
    /// client that cuts a long call into requests cuts at a multiple of
    /// it, so the engine sees the calls it would see here.
    pub fn part_len(&self) -> usize {
        match self.compress {
            true => parts::part_len(self.alg, self.level).unwrap_or(parts::DEFLATE_PART),
            false => parts::DEFLATE_PART,
        }
    }
}

/// What one [`Stream::run`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Step {
    /// Input bytes taken.
    pub consumed: usize,
    /// Output bytes written.
    pub produced: usize,
    /// The stream ended: its trailer was written (compression) or read
    /// (decompression).
    pub end: bool,
}

/// The magic number of a zstd skippable frame, its low 4 bits cleared.
const ZSTD_SKIPPABLE: u32 = 0x184d_2a50;

enum Kind {
    Deflate(Box<Compress>),
    Inflate(Box<Decompress>),
    ZstdC(zstd_safe::CCtx<'static>),
    /// With the first bytes of the frame being decoded (its magic
    /// number tells a skippable frame), and whether a skippable frame just
    /// ended (nothing of the next one taken yet).
    ZstdD(zstd_safe::DCtx<'static>, Vec<u8>, bool),
}

/// A compression or decompression stream.
pub struct Stream {
    kind: Kind,
    alg: Algorithm,
    /// A zlib decompressor's dictionary, given when the stream asks.
    dict: Vec<u8>,
    ended: bool,
    /// A step's output was lost after the stream took its input: nothing
    /// more can follow.
    broken: bool,
    /// An error met in a later part of a step, after earlier parts took
    /// input and made output: the step ended with what they did (their
    /// output delivered, as zlib delivers what came before corrupt data),
    /// and every later step fails with it.
    failed: Option<CodecError>,
    footprint: usize,
    /// Input bytes of one part of a long step ([`Stream::part_len`]).
    part: usize,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("alg", &self.alg)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl Stream {
    /// Open a stream.
    pub fn new(p: &StreamParams<'_>) -> Result<Stream, CodecError> {
        if !p.alg.streams() || p.dict.len() > wd_zip_msg::MAX_DICT as usize {
            return Err(CodecError::Param);
        }
        // gzip has no dictionary either way (decompressing, one given was
        // ignored).
        if p.alg == Algorithm::Gzip && !p.dict.is_empty() {
            return Err(CodecError::Param);
        }
        let bits = match p.window_bits {
            0 => 15,
            // zlib takes 8 and uses 9 (its deflate cannot use 256 bytes).
            8 => 9,
            b @ 9..=15 if p.alg.is_deflate() => b,
            _ => return Err(CodecError::Param),
        };
        let footprint = match (p.alg, p.compress) {
            (Algorithm::Zstd, true) => {
                zstd_raw::cstream_size(zstd_raw::params(level_of(p.alg, p.level)?, None))
            }
            (Algorithm::Zstd, false) => zstd_raw::dstream_size(),
            // zlib's own figures (zlib.h, "memory footprint"), which
            // zlib-rs's layout follows: a window and hash chains, or a
            // window and 7 KiB of tables.
            (_, true) => (1 << (bits + 2)) + (1 << (8 + 9)),
            (_, false) => (1 << bits) + (7 << 10),
        } + p.dict.len();
        let kind = match (p.alg, p.compress) {
            (Algorithm::Zstd, true) => {
                let mut c = zstd_safe::CCtx::create();
                let level = level_of(p.alg, p.level)?;
                c.set_parameter(CParameter::CompressionLevel(level))
                    .map_err(zstd_error)?;
                let t = zstd_raw::params(level, None);
                for param in [
                    CParameter::WindowLog(t.windowLog),
                    CParameter::HashLog(t.hashLog),
                    CParameter::ChainLog(t.chainLog),
                ] {
                    c.set_parameter(param).map_err(zstd_error)?;
                }
                if let Some(block) = zstd_raw::max_block(level) {
                    c.set_parameter(CParameter::MaxBlockSize(block))
                        .map_err(zstd_error)?;
                }
                if !p.dict.is_empty() {
                    c.load_dictionary(p.dict).map_err(zstd_error)?;
                }
                Kind::ZstdC(c)
            }
            (Algorithm::Zstd, false) => {
                let mut d = zstd_safe::DCtx::create();
                d.set_parameter(DParameter::WindowLogMax(ZSTD_WINDOW_LOG))
                    .map_err(zstd_error)?;
                if !p.dict.is_empty() {
                    d.load_dictionary(p.dict).map_err(zstd_error)?;
                }
                Kind::ZstdD(d, Vec::with_capacity(4), false)
            }
            (alg, true) => {
                let level = Compression::new(level_of(alg, p.level)?.min(9) as u32);
                let mut c = match alg {
                    Algorithm::Gzip => Compress::new_gzip(level, bits),
                    a => Compress::new_with_window_bits(level, a == Algorithm::Zlib, bits),
                };
                if !p.dict.is_empty() {
                    c.set_dictionary(p.dict).map_err(|_| CodecError::Param)?;
                }
                Kind::Deflate(Box::new(c))
            }
            (alg, false) => {
                let mut d = match alg {
                    Algorithm::Gzip => Decompress::new_gzip(bits),
                    a => Decompress::new_with_window_bits(a == Algorithm::Zlib, bits),
                };
                // Raw deflate has no header to ask for the dictionary.
                if alg == Algorithm::Deflate && !p.dict.is_empty() {
                    d.set_dictionary(p.dict).map_err(|_| CodecError::Param)?;
                }
                Kind::Inflate(Box::new(d))
            }
        };
        Ok(Stream {
            kind,
            alg: p.alg,
            dict: if p.alg == Algorithm::Zlib && !p.compress {
                p.dict.to_vec()
            } else {
                Vec::new()
            },
            ended: false,
            broken: false,
            failed: None,
            footprint,
            part: p.part_len(),
        })
    }

    /// The most memory the stream may hold (zstd's estimate for its
    /// parameters, zlib's figures for deflate): what the zip device
    /// counts against a queue's budget for sessions.
    pub fn footprint(&self) -> usize {
        self.footprint
    }

    /// Input bytes a long step is cut into parts of: a device runs such a
    /// step as several calls of [`Stream::run`], one per engine pass, the
    /// caller's flush given with the last. The stream's state carries
    /// across them, so cutting costs nothing and every level is cut, the
    /// slow zstd levels a block at a time ([`crate::part_len`]), the rest
    /// a MiB.
    pub fn part_len(&self) -> usize {
        self.part
    }

    /// Whether the stream compresses (else it decompresses).
    pub fn compresses(&self) -> bool {
        matches!(self.kind, Kind::Deflate(_) | Kind::ZstdC(_))
    }

    /// Mark the stream broken: the output of a step it ran could not be
    /// delivered, so what follows would not continue what the caller has.
    /// Every later [`Stream::run`] fails with [`CodecError::Broken`].
    pub fn break_off(&mut self) {
        self.broken = true;
    }

    /// The algorithm.
    pub fn alg(&self) -> Algorithm {
        self.alg
    }

    /// Whether the stream has ended (further calls take and make nothing).
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Take what fits of `input`, write what fits into `out`. A
    /// compressor flushes as `flush` says; [`Flush::Finish`] ends the
    /// stream once all input is taken and the trailer fits (call again
    /// with more room until [`Step::end`]). A decompressor stops at the
    /// end of its stream.
    ///
    /// A step runs as parts ([`Stream::run_part`]): its input
    /// [`Stream::part_len`] bytes at a time, at most [`PART_OUT`] of output
    /// each, the flush with the last. The zip device runs a long step a
    /// part per engine pass; here, the parts follow each other at once,
    /// so that a stream is the same bytes wherever its steps run.
    pub fn run(&mut self, input: &[u8], out: &mut [u8], flush: Flush) -> Result<Step, CodecError> {
        let mut done = Step::default();
        loop {
            let n = (input.len() - done.consumed).min(self.part);
            let part = &input[done.consumed..done.consumed + n];
            let last = done.consumed + n == input.len();
            let rest = &mut out[done.produced..];
            let more_room = rest.len() > PART_OUT;
            let room = rest.len().min(PART_OUT);
            let earlier = done.consumed + done.produced > 0;
            let (step, finished) =
                self.run_part(part, last, &mut rest[..room], more_room, earlier, flush)?;
            done.consumed += step.consumed;
            done.produced += step.produced;
            done.end = step.end;
            if finished {
                return Ok(done);
            }
        }
    }

    /// One part of a step ([`Stream::run`]): `part`, the step's next input
    /// (at most [`Stream::part_len`] bytes; `last` when the step's input
    /// ends with it), into `out` (at most [`PART_OUT`] bytes; `more_room`
    /// when the step has room past it), the flush given with the last
    /// part. What the part did, and whether the step is finished: the
    /// stream ended, nothing moved, or the part stopped for a reason of
    /// the step's own (all its input taken, or its room full) rather than
    /// the part's output limit.
    ///
    /// `earlier`: parts before it in this step took input or made output.
    /// A codec error then ends the step with what they did (nothing more,
    /// finished), as zlib delivers what came before corrupt data, and
    /// every later step fails with it (`failed`).
    pub fn run_part(
        &mut self,
        part: &[u8],
        last: bool,
        out: &mut [u8],
        more_room: bool,
        earlier: bool,
        flush: Flush,
    ) -> Result<(Step, bool), CodecError> {
        if part.len() > self.part || out.len() > PART_OUT {
            return Err(CodecError::Param);
        }
        let flush = if last { flush } else { Flush::None };
        let step = match self.run_once(part, out, flush) {
            Ok(s) => s,
            Err(e) if earlier => {
                self.failed = Some(e);
                return Ok((Step::default(), true));
            }
            Err(e) => return Err(e),
        };
        let capped = more_room && step.produced == out.len();
        let all_in = last && step.consumed == part.len();
        let stalled = step.consumed == 0 && step.produced == 0;
        let finished = step.end || stalled || !capped && (all_in || step.consumed < part.len());
        Ok((step, finished))
    }

    /// One call of the library.
    fn run_once(&mut self, input: &[u8], out: &mut [u8], flush: Flush) -> Result<Step, CodecError> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        if self.broken {
            return Err(CodecError::Broken);
        }
        if self.ended {
            return Ok(Step {
                end: true,
                ..Step::default()
            });
        }
        let step = match &mut self.kind {
            Kind::Deflate(c) => {
                let f = match flush {
                    Flush::None => FlushCompress::None,
                    Flush::Sync => FlushCompress::Sync,
                    Flush::Full => FlushCompress::Full,
                    Flush::Finish => FlushCompress::Finish,
                };
                let (i0, o0) = (c.total_in(), c.total_out());
                let st = c.compress(input, out, f).map_err(|_| CodecError::Param)?;
                Step {
                    consumed: (c.total_in() - i0) as usize,
                    produced: (c.total_out() - o0) as usize,
                    end: st == Status::StreamEnd,
                }
            }
            Kind::Inflate(d) => {
                let f = match flush {
                    Flush::Finish => FlushDecompress::Finish,
                    _ => FlushDecompress::None,
                };
                let (i0, o0) = (d.total_in(), d.total_out());
                let mut st = d.decompress(input, out, f);
                if let Err(e) = &st {
                    if e.needs_dictionary().is_some() {
                        if self.dict.is_empty() {
                            return Err(CodecError::NeedDict);
                        }
                        d.set_dictionary(&self.dict)
                            .map_err(|_| CodecError::Corrupt)?;
                        let used = (d.total_in() - i0) as usize;
                        let made = (d.total_out() - o0) as usize;
                        st = d.decompress(&input[used..], &mut out[made..], f);
                    }
                }
                let st = st.map_err(|_| CodecError::Corrupt)?;
                Step {
                    consumed: (d.total_in() - i0) as usize,
                    produced: (d.total_out() - o0) as usize,
                    end: st == Status::StreamEnd,
                }
            }
            Kind::ZstdC(c) => {
                let directive = match flush {
                    Flush::None => ZSTD_EndDirective::ZSTD_e_continue,
                    Flush::Sync | Flush::Full => ZSTD_EndDirective::ZSTD_e_flush,
                    Flush::Finish => ZSTD_EndDirective::ZSTD_e_end,
                };
                let mut inb = InBuffer::around(input);
                let mut outb = OutBuffer::around(out);
                let left = c
                    .compress_stream2(&mut outb, &mut inb, directive)
                    .map_err(zstd_error)?;
                Step {
                    consumed: inb.pos(),
                    produced: outb.pos(),
                    end: flush == Flush::Finish && left == 0 && inb.pos() == input.len(),
                }
            }
            Kind::ZstdD(d, magic, between) => {
                let room = out.len();
                let mut inb = InBuffer::around(input);
                let mut outb = OutBuffer::around(out);
                let end = loop {
                    if *between && inb.pos() == input.len() {
                        // Input used up where a frame ended: the stream
                        // ends here if the caller says its input does.
                        break flush == Flush::Finish;
                    }
                    let from = inb.pos();
                    let hint = d
                        .decompress_stream(&mut outb, &mut inb)
                        .map_err(zstd_error)?;
                    let first = (4 - magic.len()).min(inb.pos() - from);
                    magic.extend_from_slice(&input[from..from + first]);
                    *between &= inb.pos() == from;
                    if hint != 0 {
                        break false;
                    }
                    // A frame ended. A skippable one (RFC 8878 3.1.2) is
                    // not the stream's end: the next frame follows.
                    let skippable = magic.len() == 4
                        && u32::from_le_bytes([magic[0], magic[1], magic[2], magic[3]]) & !0xf
                            == ZSTD_SKIPPABLE;
                    magic.clear();
                    if !skippable {
                        break true;
                    }
                    *between = true;
                    if outb.pos() == room {
                        break false;
                    }
                };
                Step {
                    consumed: inb.pos(),
                    produced: outb.pos(),
                    end,
                }
            }
        };
        self.ended = step.end;
        Ok(step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step whose later part meets corrupt data (here a zlib trailer
    /// that does not match, after 10 MiB of output in 4 MiB parts) ends
    /// with what the earlier parts did, as zlib delivers what came before
    /// the corruption; the next step fails with it (the step failed whole,
    /// its earlier output lost).
    #[test]
    fn a_later_parts_error_ends_the_step_with_the_earlier_parts_work() {
        let data: Vec<u8> = (0..10u32 << 20).map(|i| (i / 4096) as u8).collect();
        let mut z = crate::Engine::new();
        let mut packed = vec![0u8; crate::compress_bound(Algorithm::Zlib, data.len())];
        let n = z.compress(Algorithm::Zlib, 1, &data, &mut packed).unwrap();
        packed.truncate(n);
        packed[n - 1] ^= 1;
        let mut s = Stream::new(&StreamParams {
            alg: Algorithm::Zlib,
            compress: false,
            level: 0,
            window_bits: 0,
            dict: &[],
        })
        .unwrap();
        let mut out = vec![0u8; data.len() + 16];
        let step = s.run(&packed, &mut out, Flush::None).unwrap();
        assert!(!step.end && step.produced > PART_OUT, "{step:?}");
        assert!(out[..step.produced] == data[..step.produced]);
        let rest = &packed[step.consumed..];
        assert_eq!(
            s.run(rest, &mut out, Flush::Finish).unwrap_err(),
            CodecError::Corrupt
        );
    }

    /// zstd's highest levels would allocate 650 MiB for a stream whose
    /// size it is not told; capped, what a session allocates stays within
    /// its footprint, which stays well under 64 MiB.
    #[test]
    fn zstd_streams_allocate_what_their_footprint_says() {
        for level in [1, 3, 9, 19, 22] {
            let mut s = Stream::new(&StreamParams {
                alg: Algorithm::Zstd,
                compress: true,
                level,
                window_bits: 0,
                dict: &[],
            })
            .unwrap();
            let mut out = [0u8; 64];
            s.run(b"x", &mut out, Flush::None).unwrap();
            let Kind::ZstdC(c) = &s.kind else {
                unreachable!("a zstd compressor")
            };
            assert!(
                c.sizeof() <= s.footprint(),
                "level {level}: {} > {}",
                c.sizeof(),
                s.footprint()
            );
            assert!(s.footprint() < 64 << 20, "level {level}: {}", s.footprint());
        }
    }
}
