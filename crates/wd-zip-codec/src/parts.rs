//! One compression done a part at a time, each part a bounded amount of
//! work: the zip device runs a long request one part per engine pass, so
//! that other queues' requests do not wait seconds behind it (zstd at
//! level 19 compresses a few MB/s, libdeflate at level 12 about five).
//!
//! zstd keeps its history across parts: one streaming context with the
//! parameters the one-shot call picks for the whole size, which is
//! pledged and recorded in the frame header as the one-shot's is.
//! Deflate, zlib and gzip are compressed as [`pieces`]: each part by
//! the one-shot engine at the requested level, without the history of
//! the part before, the framing around all of them.
//!
//! Cutting costs something, so the fast levels are not cut: they finish
//! 64 MiB, the most one request takes, within about a second here.
//! Measured on 16 MiB of documents, programs and sources (two runs each,
//! time and size against the request run whole): deflate in parts of
//! 1 MiB takes 16-19% more time at level 1 (each part but the last is
//! walked to end it open), 11-19% at 4, 9-14% at 6, and is 0.03-0.04%
//! larger; zstd in parts is 0.3% larger at level 1 and 1.2% at 3, 0.3% at
//! 9 with 9-16% more time, and the same at 19.
//!
//! Where a compression is cut depends only on its algorithm, level and
//! length, never on what else the device is doing, and
//! [`Engine::compress`] cuts the same way (a client's CPU path is not
//! shared, but its stream must be the device's): the same input makes the
//! same stream every time, on every path.

use wd_zip_msg::Algorithm;

use crate::{level_of, pieces, zstd_raw, CodecError, Engine};

/// Input bytes of a deflate part at levels 4 to 6, 7 to 9, and 10 to
/// 12: each about a tenth of a second or less at the level's speed here
/// (libdeflate took 163 ms for 1 MiB at level 9 and 527 ms at level 12 on
/// one corpus, 25 ms at level 6), the slower levels in smaller parts,
/// which cost more size.
pub(crate) const DEFLATE_PART: usize = 1 << 20;
const DEFLATE_SLOW_PART: usize = 512 << 10;
const DEFLATE_SLOWEST_PART: usize = 256 << 10;
/// The shortest part of any level: shorter inputs are never cut.
pub(crate) const SHORTEST_PART: usize = 64 << 10;
/// The fastest levels, run whole: deflate up to 3 (70 MB/s and more
/// here), zstd up to 5 (150 MB/s and more).
const DEFLATE_WHOLE_UPTO: i32 = 3;
const ZSTD_WHOLE_UPTO: i32 = 5;
/// Input bytes of a zstd part: one block, the unit zstd works in (2 ms at
/// level 9; from level 16 blocks of 64 KiB, about 45 ms at levels 19 to
/// 22, see `zstd_raw::max_block`).
const ZSTD_PART: usize = 128 << 10;

/// Input bytes of one part of a one-shot compression with `alg` at
/// `level` ([`Parts`]; an input this long or shorter runs whole); `None`
/// where such a compression is never cut (LZ4 and the fastest levels).
pub fn part_len(alg: Algorithm, level: i8) -> Option<usize> {
    let level = level_of(alg, level).ok()?;
    match alg {
        Algorithm::Lz4 => None,
        Algorithm::Zstd if level <= ZSTD_WHOLE_UPTO => None,
        Algorithm::Zstd => Some(zstd_raw::max_block(level).map_or(ZSTD_PART, |b| b as usize)),
        _ if level <= DEFLATE_WHOLE_UPTO => None,
        _ if level <= 6 => Some(DEFLATE_PART),
        _ if level <= 9 => Some(DEFLATE_SLOW_PART),
        _ => Some(DEFLATE_SLOWEST_PART),
    }
}

enum Kind {
    /// Deflate family: the framing's check value of the input so far.
    Deflate {
        check: u32,
    },
    Zstd(zstd_raw::Cctx),
}

/// A compression of `total` input bytes into one stream, made by
/// [`Parts::compress`] calls in order, each given the next
/// [`Parts::next_len`] bytes of input.
pub struct Parts {
    alg: Algorithm,
    level: i8,
    total: u64,
    taken: u64,
    /// A piece of a longer raw deflate stream: its end stays open (see
    /// [`Engine::compress_piece`]).
    open_end: bool,
    part: usize,
    kind: Kind,
}

impl std::fmt::Debug for Parts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parts")
            .field("alg", &self.alg)
            .field("level", &self.level)
            .field("total", &self.total)
            .field("taken", &self.taken)
            .finish_non_exhaustive()
    }
}

impl Parts {
    /// A compression of `total` bytes (more than zero) with `alg` at
    /// `level`; `open_end` for a piece of a raw deflate stream.
    pub fn new(alg: Algorithm, level: i8, total: u64, open_end: bool) -> Result<Parts, CodecError> {
        let lvl = level_of(alg, level)?;
        let part = part_len(alg, level).ok_or(CodecError::Param)?;
        if total == 0 || (open_end && alg != Algorithm::Deflate) {
            return Err(CodecError::Param);
        }
        let kind = match alg {
            Algorithm::Zstd => {
                let mut c = zstd_raw::Cctx::new().ok_or(CodecError::Memory)?;
                c.begin(lvl, total)?;
                Kind::Zstd(c)
            }
            _ => Kind::Deflate {
                check: pieces::check_init(alg),
            },
        };
        Ok(Parts {
            alg,
            level,
            total,
            taken: 0,
            open_end,
            part,
            kind,
        })
    }

    /// The most memory the compression holds between parts (zstd's
    /// context: its window and tables, up to 57 MiB at the highest
    /// levels), which a device counts against its queue's budget.
    pub fn footprint(&self) -> usize {
        match &self.kind {
            Kind::Zstd(_) => zstd_raw::cstream_size(zstd_raw::params(
                level_of(self.alg, self.level).unwrap_or(0),
                Some(self.total),
            )),
            Kind::Deflate { .. } => 0,
        }
    }

    /// Input bytes compressed so far.
    pub fn taken(&self) -> u64 {
        self.taken
    }

    /// Whether all the input has been compressed (the stream is complete).
    pub fn finished(&self) -> bool {
        self.taken == self.total
    }

    /// Input bytes the next [`Parts::compress`] takes (0 when finished).
    pub fn next_len(&self) -> usize {
        (self.total - self.taken).min(self.part as u64) as usize
    }

    /// Compress the next part, `input` ([`Parts::next_len`] bytes), into
    /// `out`: the bytes written, which follow the previous part's. The
    /// first part begins with the framing's header, the last ends with its
    /// trailer. After an error the compression cannot go on.
    pub fn compress(
        &mut self,
        engine: &mut Engine,
        input: &[u8],
        out: &mut [u8],
    ) -> Result<usize, CodecError> {
        if input.is_empty() || input.len() != self.next_len() {
            return Err(CodecError::Param);
        }
        let first = self.taken == 0;
        let last = self.taken + input.len() as u64 == self.total;
        let n = match &mut self.kind {
            Kind::Zstd(c) => c.part(input, out, last)?,
            Kind::Deflate { check } => {
                let mut at = 0;
                if first {
                    at = put(out, 0, pieces::header(self.alg, self.level)?)?;
                }
                *check = pieces::check(self.alg, *check, input);
                let rest = &mut out[at..];
                if last && !self.open_end {
                    at += engine.compress(Algorithm::Deflate, self.level, input, rest)?;
                    let (t, len) = pieces::trailer(self.alg, *check, self.total)?;
                    at = put(out, at, &t[..len])?;
                } else {
                    at += engine.compress_piece(self.level, input, rest)?;
                }
                at
            }
        };
        self.taken += input.len() as u64;
        Ok(n)
    }
}

/// Write `bytes` into `out` at `at`: the offset after them.
fn put(out: &mut [u8], at: usize, bytes: &[u8]) -> Result<usize, CodecError> {
    let end = at + bytes.len();
    out.get_mut(at..end)
        .ok_or(CodecError::NoSpace)?
        .copy_from_slice(bytes);
    Ok(end)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_parts(alg: Algorithm, level: i8, input: &[u8], open_end: bool) -> Vec<u8> {
        let mut e = Engine::new();
        let mut p = Parts::new(alg, level, input.len() as u64, open_end).unwrap();
        let mut out = vec![0u8; crate::compress_bound(alg, input.len()) + 64];
        let mut made = 0;
        while !p.finished() {
            let at = p.taken() as usize;
            let part = &input[at..at + p.next_len()];
            made += p.compress(&mut e, part, &mut out[made..]).unwrap();
        }
        out.truncate(made);
        out
    }

    fn decompress(alg: Algorithm, stream: &[u8], len: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let got = Engine::new()
            .decompress_vec(alg, stream, &mut out, len + 1, 0)
            .unwrap();
        assert_eq!(got.consumed, stream.len());
        out
    }

    #[test]
    fn every_framing_round_trips_when_cut() {
        let input = wd_testutil::text(2 * DEFLATE_PART + 12345, 7);
        for alg in [
            Algorithm::Deflate,
            Algorithm::Zlib,
            Algorithm::Gzip,
            Algorithm::Zstd,
        ] {
            let levels: &[i8] = match alg {
                Algorithm::Zstd => &[6, 9],
                Algorithm::Deflate => &[4],
                Algorithm::Zlib => &[-1],
                _ => &[12],
            };
            for &level in levels {
                let stream = in_parts(alg, level, &input, false);
                assert_eq!(
                    decompress(alg, &stream, input.len()),
                    input,
                    "{alg:?} {level}"
                );
                // The same input is cut the same way: the same stream.
                assert_eq!(in_parts(alg, level, &input, false), stream);
            }
        }
    }

    #[test]
    fn no_part_is_shorter_than_the_shortest() {
        for alg in Algorithm::ALL {
            for level in alg.levels().chain([wd_zip_msg::DEFAULT_LEVEL]) {
                let p = part_len(alg, level);
                assert!(p.is_none_or(|p| p >= SHORTEST_PART), "{alg:?} {level}");
            }
        }
    }

    #[test]
    fn slower_levels_have_shorter_parts_and_zstd_counts_its_context() {
        let lens: Vec<_> = [1, 3, 4, 6, 7, 9, 10, 12]
            .map(|l| part_len(Algorithm::Gzip, l))
            .into();
        let (m, k) = (Some(1 << 20), Some(1usize << 10));
        assert_eq!(
            lens,
            [
                None,
                None,
                m,
                m,
                k.map(|k| k * 512),
                k.map(|k| k * 512),
                k.map(|k| k * 256),
                k.map(|k| k * 256)
            ]
        );
        let p = Parts::new(Algorithm::Zstd, 19, 64 << 20, false).unwrap();
        assert!(
            p.footprint() > 32 << 20 && p.footprint() < 64 << 20,
            "{}",
            p.footprint()
        );
        assert_eq!(
            Parts::new(Algorithm::Zlib, 9, 4 << 20, false)
                .unwrap()
                .footprint(),
            0
        );
    }

    /// The engine cuts a long compression the same way, whatever its
    /// output (a slice, uninitialised room): one stream on every path.
    #[test]
    fn the_engine_compresses_a_long_input_in_the_same_parts() {
        let input = wd_testutil::text(DEFLATE_SLOWEST_PART * 2 + 77, 9);
        for (alg, level) in [
            (Algorithm::Gzip, 12),
            (Algorithm::Zstd, 19),
            (Algorithm::Zlib, 1),
        ] {
            let mut e = Engine::new();
            let mut out = vec![0u8; crate::compress_bound(alg, input.len())];
            let n = e.compress(alg, level, &input[..], &mut out[..]).unwrap();
            let mut v = Vec::new();
            assert_eq!(e.compress_vec(alg, level, &input[..], &mut v).unwrap(), n);
            assert!(v == out[..n]);
            if part_len(alg, level).is_some() {
                assert!(in_parts(alg, level, &input, false) == out[..n], "{alg:?}");
            }
            assert_eq!(decompress(alg, &out[..n], input.len()), input);
        }
    }

    #[test]
    fn a_zstd_frame_made_in_parts_records_its_size() {
        let input = wd_testutil::text(ZSTD_PART * 5 + 3, 3);
        let stream = in_parts(Algorithm::Zstd, 19, &input, false);
        assert_eq!(
            zstd_safe::get_frame_content_size(&stream).ok(),
            Some(Some(input.len() as u64))
        );
        assert_eq!(decompress(Algorithm::Zstd, &stream, input.len()), input);
    }

    #[test]
    fn an_open_piece_in_parts_joins_a_stream() {
        let a = wd_testutil::text(DEFLATE_PART * 2 + 99, 11);
        let mut joined = in_parts(Algorithm::Deflate, 9, &a, true);
        joined.extend_from_slice(&pieces::CLOSE);
        assert_eq!(decompress(Algorithm::Deflate, &joined, a.len()), a);
    }

    #[test]
    fn a_part_of_the_wrong_length_or_too_little_room_is_refused() {
        let input = wd_testutil::text(DEFLATE_PART + 10, 5);
        let mut e = Engine::new();
        let mut p = Parts::new(Algorithm::Gzip, 6, input.len() as u64, false).unwrap();
        let mut out = vec![0u8; 4 << 20];
        assert_eq!(
            p.compress(&mut e, &input[..10], &mut out),
            Err(CodecError::Param)
        );
        assert_eq!(
            p.compress(&mut e, &input[..DEFLATE_PART], &mut out[..100]),
            Err(CodecError::NoSpace)
        );
        // zstd keeps what a middle part's room does not take for the
        // next; the last part must fit all of it.
        let mut z = Parts::new(Algorithm::Zstd, 19, 1000, false).unwrap();
        assert_eq!(
            z.compress(&mut e, &input[..1000], &mut out[..5]),
            Err(CodecError::NoSpace)
        );
        for (alg, level, open) in [
            (Algorithm::Lz4, 1, false),
            (Algorithm::Zlib, 9, true),
            (Algorithm::Zlib, 1, false),
            (Algorithm::Zstd, 3, false),
            (Algorithm::Zstd, 19, false),
        ] {
            let total = if level == 19 { 0 } else { 10 };
            assert_eq!(
                Parts::new(alg, level, total, open).map(|_| ()),
                Err(CodecError::Param),
                "{alg:?} {level}"
            );
        }
    }
}
