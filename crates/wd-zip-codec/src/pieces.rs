//! One deflate stream compressed in pieces at once, by different engines
//! (the device and the caller), each piece without the others' history.
//!
//! libdeflate, the fastest deflate here, only makes whole streams: its
//! last block is marked final and its output stops on a byte boundary
//! with the end-of-block code somewhere in the last byte. Each piece but
//! the last must instead end the way zlib's `Z_FULL_FLUSH` leaves a
//! stream ([`end_open`]): no block marked final, and an empty stored block
//! (3 header bits, padding to the byte, LEN 0, NLEN 0xffff) aligning the
//! end, so that the next piece starts on a byte boundary as a stream of
//! its own does. The zlib or gzip framing goes around the joined pieces
//! ([`header`], [`trailer`]), the header the one libdeflate writes for a
//! whole stream at that level.
//!
//! Finding the final block's header bit and the exact bit where it ends
//! means walking every block and code of the stream (no output is made,
//! no distance is checked against a history): about a third of the time
//! level 1 took to compress it. The walk refuses anything that is not a
//! complete, well-formed stream filling the given bytes.

use wd_zip_msg::Algorithm;

use crate::CodecError;

/// Bits of a code looked up in one step; longer codes are decoded bit by
/// bit (level 1 output has few).
const TABLE_BITS: u32 = 11;
const MAX_CODE_BITS: usize = 15;

/// Extra bits and their count after each length symbol (257..=285).
const LEN_EXTRA: [u8; 29] = [
    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0,
];
/// Extra bits after each distance symbol (0..=29).
const DIST_EXTRA: [u8; 30] = [
    0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13,
    13,
];
/// The order the code length code's lengths are sent in.
const CLEN_ORDER: [usize; 19] = [
    16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15,
];

/// The framing's header of a stream of `alg` at `level` (none for raw
/// deflate): the bytes libdeflate begins a whole stream with.
pub fn header(alg: Algorithm, level: i8) -> Result<&'static [u8], CodecError> {
    let level = crate::level_of(alg, level)?;
    Ok(match alg {
        Algorithm::Deflate => &[],
        // CMF 0x78 (deflate, 32 KiB window), then FLG with the level hint
        // (fastest, fast, default, slowest) and the check bits.
        Algorithm::Zlib => match level {
            ..=1 => &[0x78, 0x01],
            2..=5 => &[0x78, 0x5e],
            6..=7 => &[0x78, 0x9c],
            _ => &[0x78, 0xda],
        },
        // No flags, no time, XFL by level, OS unknown.
        Algorithm::Gzip => match level {
            ..=1 => &[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 4, 0xff],
            2..=7 => &[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff],
            _ => &[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 2, 0xff],
        },
        Algorithm::Zstd | Algorithm::Lz4 => return Err(CodecError::Param),
    })
}

/// The check value of `alg`'s framing before any data (Adler-32 for
/// zlib, CRC-32 for gzip, nothing for raw deflate).
pub fn check_init(alg: Algorithm) -> u32 {
    match alg {
        Algorithm::Zlib => 1,
        _ => 0,
    }
}

/// The check value `check` carried on over `data`.
pub fn check(alg: Algorithm, check: u32, data: &[u8]) -> u32 {
    match alg {
        Algorithm::Zlib => crate::libdeflate::adler32(check, data),
        Algorithm::Gzip => crate::libdeflate::crc32(check, data),
        _ => check,
    }
}

/// The framing's trailer of a stream of `alg` of `len` input bytes whose
/// check value is `check`: the bytes, and how many of them there are.
pub fn trailer(alg: Algorithm, check: u32, len: u64) -> Result<([u8; 8], usize), CodecError> {
    let mut t = [0u8; 8];
    Ok(match alg {
        Algorithm::Deflate => (t, 0),
        Algorithm::Zlib => {
            t[..4].copy_from_slice(&check.to_be_bytes());
            (t, 4)
        }
        Algorithm::Gzip => {
            t[..4].copy_from_slice(&check.to_le_bytes());
            t[4..].copy_from_slice(&(len as u32).to_le_bytes());
            (t, 8)
        }
        Algorithm::Zstd | Algorithm::Lz4 => return Err(CodecError::Param),
    })
}

/// What ends a stream whose last piece ended open: an empty final block
/// with fixed codes (header bits 1, 01, then the 7-bit end-of-block code).
pub const CLOSE: [u8; 2] = [0x03, 0x00];

/// Rewrite the raw deflate stream in `buf[..len]` to end at a full flush
/// point: the bytes it takes now (at most `len + 5`, and at most
/// `buf.len()`, else [`CodecError::NoSpace`]). Anything but exactly one
/// complete stream in `buf[..len]` is [`CodecError::Corrupt`].
pub fn end_open(buf: &mut [u8], len: usize) -> Result<usize, CodecError> {
    let data = buf.get(..len).ok_or(CodecError::Param)?;
    let (final_header, end) = walk(data)?;
    // What follows the end-of-block code in its byte is padding, and must
    // be: a stream with whole bytes after it is not one stream.
    if end.div_ceil(8) != len {
        return Err(CodecError::Corrupt);
    }
    // The stored block's header: 3 zero bits at `end`, then up to the byte.
    let aligned = (end + 3).div_ceil(8);
    let total = aligned + 4;
    if total > buf.len() {
        return Err(CodecError::NoSpace);
    }
    buf[final_header / 8] &= !(1 << (final_header % 8));
    if end % 8 != 0 {
        buf[end / 8] &= (1u8 << (end % 8)) - 1;
    }
    buf[len..aligned].fill(0);
    buf[aligned..total].copy_from_slice(&[0, 0, 0xff, 0xff]);
    Ok(total)
}

/// Walk a raw deflate stream: the bit offset of the final block's header
/// and the bit offset just past its end-of-block code.
fn walk(data: &[u8]) -> Result<(usize, usize), CodecError> {
    let mut bits = Bits::new(data);
    let mut lit = Table::default();
    let mut dist = Table::default();
    loop {
        let header = bits.position();
        bits.refill()?;
        let last = bits.take(1) == 1;
        match bits.take(2) {
            0 => {
                bits.align();
                bits.refill()?;
                let n = bits.take(16);
                if bits.take(16) != !n & 0xffff {
                    return Err(CodecError::Corrupt);
                }
                bits.skip_bytes(n as usize)?;
            }
            1 => {
                let mut lens = [0u8; 320];
                lens[..144].fill(8);
                lens[144..256].fill(9);
                lens[256..280].fill(7);
                lens[280..288].fill(8);
                lens[288..].fill(5);
                lit.build(Alphabet::LitLen, &lens[..288])?;
                dist.build(Alphabet::Distance, &lens[288..])?;
                codes(&mut bits, &lit, &dist)?;
            }
            2 => {
                dynamic_tables(&mut bits, &mut lit, &mut dist)?;
                codes(&mut bits, &lit, &dist)?;
            }
            _ => return Err(CodecError::Corrupt),
        }
        let at = bits.position();
        if at > data.len() * 8 {
            return Err(CodecError::Corrupt);
        }
        if last {
            return Ok((header, at));
        }
    }
}

/// Read a dynamic block's code lengths and build its two tables.
fn dynamic_tables(
    bits: &mut Bits<'_>,
    lit: &mut Table,
    dist: &mut Table,
) -> Result<(), CodecError> {
    bits.refill()?;
    let nlit = bits.take(5) as usize + 257;
    let ndist = bits.take(5) as usize + 1;
    let nclen = bits.take(4) as usize + 4;
    if nlit > 286 || ndist > 30 {
        return Err(CodecError::Corrupt);
    }
    let mut clens = [0u8; 19];
    for &i in &CLEN_ORDER[..nclen] {
        bits.refill()?;
        clens[i] = bits.take(3) as u8;
    }
    let mut clen = Table::default();
    clen.build(Alphabet::CodeLength, &clens)?;
    let mut lens = [0u8; 286 + 30];
    let total = nlit + ndist;
    let mut i = 0;
    while i < total {
        bits.refill()?;
        let sym = clen.code_length(bits)?;
        let (value, repeat) = match sym {
            0..=15 => (sym as u8, 1),
            16 => {
                let prev = *lens[..i].last().ok_or(CodecError::Corrupt)?;
                (prev, 3 + bits.take(2) as usize)
            }
            17 => (0, 3 + bits.take(3) as usize),
            _ => (0, 11 + bits.take(7) as usize),
        };
        if i + repeat > total {
            return Err(CodecError::Corrupt);
        }
        lens[i..i + repeat].fill(value);
        i += repeat;
    }
    // A block without an end-of-block code cannot end.
    if lens[256] == 0 {
        return Err(CodecError::Corrupt);
    }
    lit.build(Alphabet::LitLen, &lens[..nlit])?;
    dist.build(Alphabet::Distance, &lens[nlit..total])
}

/// Walk one block's codes up to and past its end-of-block code.
fn codes(bits: &mut Bits<'_>, lit: &Table, dist: &Table) -> Result<(), CodecError> {
    // A copy in registers: the tables cannot alias it.
    let mut b = *bits;
    let r = loop {
        // At most 15 + 5 + 15 + 13 bits per length/distance pair.
        if let Err(e) = b.refill() {
            break Err(e);
        }
        let mut e = lit.entry(b.peek());
        if e & LITERAL != 0 {
            // Two more literals fit in what is held (15 bits at most each).
            b.take(e & BITS);
            e = lit.entry(b.peek());
            if e & LITERAL == 0 {
                continue;
            }
            b.take(e & BITS);
            e = lit.entry(b.peek());
            if e & LITERAL == 0 {
                continue;
            }
            b.take(e & BITS);
            continue;
        }
        if e == 0 {
            match lit.slow(b.peek()) {
                Ok(x) => e = x,
                Err(err) => break Err(err),
            }
        }
        b.take(e & BITS);
        if e & END != 0 {
            break Ok(());
        }
        if e & LITERAL != 0 {
            continue;
        }
        let mut d = dist.entry(b.peek());
        if d == 0 {
            match dist.slow(b.peek()) {
                Ok(x) => d = x,
                Err(err) => break Err(err),
            }
        }
        b.take(d & BITS);
    };
    *bits = b;
    r
}

/// A little-endian bit reader that reads zeros past the end (counted, so
/// that a walk past the end is refused, not looped on forever).
#[derive(Clone, Copy)]
struct Bits<'a> {
    data: &'a [u8],
    /// Next byte to load (may pass the end, by the zeros loaded).
    next: usize,
    buf: u64,
    count: u32,
}

impl<'a> Bits<'a> {
    fn new(data: &'a [u8]) -> Bits<'a> {
        Bits {
            data,
            next: 0,
            buf: 0,
            count: 0,
        }
    }

    /// Bits consumed so far.
    fn position(&self) -> usize {
        self.next * 8 - self.count as usize
    }

    /// Hold at least 56 bits; refuse to read far past the end.
    #[inline(always)]
    fn refill(&mut self) -> Result<(), CodecError> {
        let room = (63 - self.count) / 8;
        if let Some(w) = self.data.get(self.next..self.next + 8) {
            let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
            self.buf |= (w & ((1u64 << (room * 8)) - 1)) << self.count;
            self.next += room as usize;
            self.count += room * 8;
            return Ok(());
        }
        if self.next > self.data.len() + 8 {
            return Err(CodecError::Corrupt);
        }
        for _ in 0..room {
            let b = self.data.get(self.next).copied().unwrap_or(0);
            self.buf |= u64::from(b) << self.count;
            self.next += 1;
            self.count += 8;
        }
        Ok(())
    }

    #[inline(always)]
    fn peek(&self) -> u64 {
        self.buf
    }

    /// Consume `n` bits (at most what is held): their value.
    #[inline(always)]
    fn take(&mut self, n: u32) -> u64 {
        debug_assert!(n <= self.count);
        let v = self.buf & ((1u64 << n) - 1);
        self.buf >>= n;
        self.count -= n;
        v
    }

    /// Drop the bits up to the next byte boundary.
    fn align(&mut self) {
        let n = self.count % 8;
        self.take(n);
    }

    /// Step over `n` whole bytes (after [`Bits::align`]).
    fn skip_bytes(&mut self, n: usize) -> Result<(), CodecError> {
        // The bytes held in the buffer come first.
        let held = (self.count / 8) as usize;
        if n <= held {
            self.take(n as u32 * 8);
            return Ok(());
        }
        self.next += n - held;
        self.buf = 0;
        self.count = 0;
        if self.next > self.data.len() {
            return Err(CodecError::Corrupt);
        }
        Ok(())
    }
}

/// Bits a table entry says to consume: the code's and, for lengths and
/// distances, the extra bits after it.
const BITS: u32 = 0xff;
/// Entry flags: what the symbol is.
const LITERAL: u32 = 1 << 8;
const LENGTH: u32 = 1 << 9;
const END: u32 = 1 << 10;
const DISTANCE: u32 = 1 << 11;
/// A code length code's symbol, its value at bit 16.
const CODE_LENGTH: u32 = 1 << 12;

/// Which alphabet a table decodes.
#[derive(Clone, Copy, Default)]
enum Alphabet {
    #[default]
    LitLen,
    Distance,
    CodeLength,
}

impl Alphabet {
    /// The entry of `sym` with a code of `len` bits; 0 for a symbol no
    /// stream may use.
    fn entry(self, sym: usize, len: u32) -> u32 {
        match self {
            Alphabet::LitLen => match sym {
                0..=255 => LITERAL | len,
                256 => END | len,
                _ => LEN_EXTRA
                    .get(sym - 257)
                    .map_or(0, |&x| LENGTH | (len + u32::from(x))),
            },
            Alphabet::Distance => DIST_EXTRA
                .get(sym)
                .map_or(0, |&x| DISTANCE | (len + u32::from(x))),
            Alphabet::CodeLength => CODE_LENGTH | (sym as u32) << 16 | len,
        }
    }
}

/// A canonical Huffman code: a direct table for codes of up to
/// [`TABLE_BITS`] bits (0 where no such code starts: a longer code, or
/// none), and the counts and sorted symbols that decode longer ones.
struct Table {
    alphabet: Alphabet,
    direct: [u32; 1 << TABLE_BITS],
    counts: [u16; MAX_CODE_BITS + 1],
    sorted: [u16; 288],
}

impl Default for Table {
    fn default() -> Table {
        Table {
            alphabet: Alphabet::default(),
            direct: [0; 1 << TABLE_BITS],
            counts: [0; MAX_CODE_BITS + 1],
            sorted: [0; 288],
        }
    }
}

impl Table {
    /// The code of these lengths (one per symbol, 0: unused). Codes may be
    /// incomplete (a symbol that no code names is refused when met), not
    /// oversubscribed.
    fn build(&mut self, alphabet: Alphabet, lens: &[u8]) -> Result<(), CodecError> {
        self.alphabet = alphabet;
        self.counts = [0; MAX_CODE_BITS + 1];
        for &l in lens {
            self.counts[l as usize] += 1;
        }
        self.counts[0] = 0;
        let mut left: i32 = 1;
        for l in 1..=MAX_CODE_BITS {
            left = (left << 1) - i32::from(self.counts[l]);
            if left < 0 {
                return Err(CodecError::Corrupt);
            }
        }
        let mut offsets = [0u16; MAX_CODE_BITS + 2];
        let mut next_code = [0u32; MAX_CODE_BITS + 2];
        for l in 1..=MAX_CODE_BITS {
            offsets[l + 1] = offsets[l] + self.counts[l];
            next_code[l + 1] = (next_code[l] + u32::from(self.counts[l])) << 1;
        }
        self.direct.fill(0);
        for (sym, &l) in lens.iter().enumerate() {
            let l = l as usize;
            if l == 0 {
                continue;
            }
            self.sorted[offsets[l] as usize] = sym as u16;
            offsets[l] += 1;
            let code = next_code[l];
            next_code[l] += 1;
            if l as u32 <= TABLE_BITS {
                let reversed = (code.reverse_bits() >> (32 - l)) as usize;
                let entry = alphabet.entry(sym, l as u32);
                for slot in (reversed..1 << TABLE_BITS).step_by(1 << l) {
                    self.direct[slot] = entry;
                }
            }
        }
        Ok(())
    }

    /// The entry the next bits start, if the direct table has it.
    #[inline(always)]
    fn entry(&self, held: u64) -> u32 {
        self.direct[(held & ((1 << TABLE_BITS) - 1)) as usize]
    }

    /// The entry of a code longer than the direct table's, decoded bit by
    /// bit from `held` (at least 15 bits).
    fn slow(&self, held: u64) -> Result<u32, CodecError> {
        let (mut code, mut first, mut index) = (0i32, 0i32, 0i32);
        for l in 1..=MAX_CODE_BITS {
            code |= ((held >> (l - 1)) & 1) as i32;
            let count = i32::from(self.counts[l]);
            if code - first < count {
                let sym = usize::from(self.sorted[(index + code - first) as usize]);
                return match self.alphabet.entry(sym, l as u32) {
                    0 => Err(CodecError::Corrupt),
                    e => Ok(e),
                };
            }
            index += count;
            first = (first + count) << 1;
            code <<= 1;
        }
        Err(CodecError::Corrupt)
    }

    /// Decode one symbol of a code length code (the reader holds at least
    /// 7 bits).
    fn code_length(&self, bits: &mut Bits<'_>) -> Result<usize, CodecError> {
        let mut e = self.entry(bits.peek());
        if e == 0 {
            e = self.slow(bits.peek())?;
        }
        bits.take(e & BITS);
        Ok((e >> 16) as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Engine;
    use wd_testutil::text;
    use wd_zip_msg::Algorithm;

    fn inflate_raw(stream: &[u8], expect: usize) -> Vec<u8> {
        let mut d = flate2::Decompress::new(false);
        let mut out = Vec::with_capacity(expect + 64);
        d.decompress_vec(stream, &mut out, flate2::FlushDecompress::Finish)
            .expect("inflates");
        out
    }

    fn open_piece(level: i8, input: &[u8]) -> Vec<u8> {
        let mut e = Engine::new();
        let mut out = vec![0u8; crate::compress_bound(Algorithm::Deflate, input.len()) + 5];
        let n = e
            .compress_piece(level, input, &mut out)
            .expect("own output walks");
        out.truncate(n);
        out
    }

    #[test]
    fn pieces_join_into_one_stream_at_every_level() {
        let data = text(200_000, 7);
        for level in 0..=12 {
            for cut in [0, 1, 1000, 65_536, 123_457] {
                let mut s = open_piece(level, &data[..cut]);
                assert_eq!(&s[s.len() - 4..], &[0, 0, 0xff, 0xff]);
                let mut e = Engine::new();
                e.compress_vec(Algorithm::Deflate, level, &data[cut..], &mut s)
                    .unwrap();
                assert_eq!(inflate_raw(&s, data.len()), data, "level {level} cut {cut}");
            }
        }
    }

    #[test]
    fn random_bytes_make_stored_blocks_that_still_join() {
        let mut x = 99u64;
        let noise: Vec<u8> = (0..100_000)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                (x >> 33) as u8
            })
            .collect();
        let mut s = open_piece(1, &noise);
        s.extend_from_slice(&open_piece(1, &noise[..10]));
        s.extend_from_slice(&CLOSE);
        let mut want = noise.clone();
        want.extend_from_slice(&noise[..10]);
        assert_eq!(inflate_raw(&s, want.len()), want);
    }

    #[test]
    fn zlib_streams_walk_too() {
        let data = text(70_000, 3);
        for level in [1u32, 6, 9] {
            let mut c = flate2::Compress::new(flate2::Compression::new(level), false);
            let mut out = Vec::with_capacity(data.len() + 64);
            c.compress_vec(&data, &mut out, flate2::FlushCompress::Finish)
                .unwrap();
            let n = out.len();
            out.resize(n + 5, 0);
            let m = end_open(&mut out, n).unwrap();
            out.truncate(m);
            out.extend_from_slice(&CLOSE);
            assert_eq!(inflate_raw(&out, data.len()), data);
        }
    }

    #[test]
    fn refuses_what_is_not_one_whole_stream() {
        let mut e = Engine::new();
        let mut whole = Vec::new();
        e.compress_vec(Algorithm::Deflate, 6, &text(5000, 1), &mut whole)
            .unwrap();
        for cut in [0, 1, whole.len() / 2, whole.len() - 1] {
            let mut b = whole[..cut].to_vec();
            b.resize(cut + 5, 0);
            assert_eq!(end_open(&mut b, cut), Err(CodecError::Corrupt), "cut {cut}");
        }
        // Trailing bytes.
        let mut b = whole.clone();
        b.extend_from_slice(&[0; 7]);
        assert_eq!(end_open(&mut b, whole.len() + 1), Err(CodecError::Corrupt));
        // No room for the stored block.
        let mut b = whole.clone();
        assert_eq!(end_open(&mut b, whole.len()), Err(CodecError::NoSpace));
    }

    #[test]
    fn framed_pieces_are_one_checked_stream_beginning_as_a_whole_one() {
        let data = text(150_000, 11);
        for alg in [Algorithm::Zlib, Algorithm::Gzip] {
            for level in [-1, 0, 1, 2, 5, 6, 7, 8, 12] {
                let mut e = Engine::new();
                let mut whole = Vec::new();
                e.compress_vec(alg, level, &data[..100], &mut whole)
                    .unwrap();
                let h = header(alg, level).unwrap();
                assert_eq!(&whole[..h.len()], h, "{alg} level {level}");
                let cut = 60_000;
                let mut s = h.to_vec();
                let a = open_piece(level, &data[..cut]);
                s.extend_from_slice(&a);
                e.compress_vec(Algorithm::Deflate, level, &data[cut..], &mut s)
                    .unwrap();
                let c = check(alg, check_init(alg), &data[..cut]);
                let c = check(alg, c, &data[cut..]);
                let (t, n) = trailer(alg, c, data.len() as u64).unwrap();
                s.extend_from_slice(&t[..n]);
                let mut back = vec![0u8; data.len()];
                let got = e.decompress(alg, &s, &mut back[..], 0).unwrap();
                assert_eq!((got.consumed, got.produced), (s.len(), data.len()));
                assert_eq!(back, data);
                // And the reference reads it, checksum included.
                let mut r = Vec::new();
                match alg {
                    Algorithm::Zlib => std::io::Read::read_to_end(
                        &mut flate2::read::ZlibDecoder::new(&s[..]),
                        &mut r,
                    ),
                    _ => std::io::Read::read_to_end(
                        &mut flate2::read::GzDecoder::new(&s[..]),
                        &mut r,
                    ),
                }
                .unwrap();
                assert_eq!(r, data);
            }
        }
        assert_eq!(header(Algorithm::Zstd, 1), Err(CodecError::Param));
        assert_eq!(header(Algorithm::Deflate, 1).unwrap(), &[] as &[u8]);
    }

    proptest::proptest! {
        #[test]
        fn never_panics_on_any_bytes(mut b in proptest::collection::vec(proptest::num::u8::ANY, 0..600)) {
            let len = b.len();
            b.resize(len + 5, 0);
            let _ = end_open(&mut b, len);
        }

        #[test]
        fn any_cut_of_any_data_joins(seed in 0u32..1000, len in 0usize..40_000, cut in 0usize..40_000, level in 0i8..=12) {
            let data = text(len, seed);
            let cut = cut.min(len);
            let mut s = open_piece(level, &data[..cut]);
            let mut e = Engine::new();
            e.compress_vec(Algorithm::Deflate, level, &data[cut..], &mut s).unwrap();
            proptest::prop_assert_eq!(inflate_raw(&s, data.len()), data);
        }
    }
}
