use super::*;
use proptest::prelude::*;

fn text(n: usize) -> Vec<u8> {
    let words = [
        "queue ",
        "domain ",
        "IOVA ",
        "PASID ",
        "gather ",
        "engine ",
        "session\n",
    ];
    let mut out = Vec::new();
    let mut x = 12345u32;
    while out.len() < n {
        x = x.wrapping_mul(1103515245).wrapping_add(12345);
        out.extend_from_slice(words[(x >> 16) as usize % words.len()].as_bytes());
    }
    out.truncate(n);
    out
}

fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn one_shot(e: &mut Engine, alg: Algorithm, level: i8, data: &[u8]) -> Vec<u8> {
    let mut c = vec![0; compress_bound(alg, data.len())];
    let n = e.compress(alg, level, data, &mut c).unwrap();
    c.truncate(n);
    let mut back = vec![0; data.len()];
    let got = e.decompress(alg, &c, &mut back, 0).unwrap();
    assert_eq!(
        (got.consumed, got.produced),
        (c.len(), data.len()),
        "{alg} {level}"
    );
    assert!(back == data, "{alg} level {level}: round trip differs");
    c
}

/// Decode with the stream engine (zlib-rs for deflate: a second,
/// independent implementation of the format).
fn stream_decode(alg: Algorithm, c: &[u8], cap: usize) -> Vec<u8> {
    let mut s = Stream::new(&StreamParams {
        alg,
        compress: false,
        level: 0,
        window_bits: 0,
        dict: &[],
    })
    .unwrap();
    let mut out = vec![0; cap];
    let st = s.run(c, &mut out, Flush::Finish).unwrap();
    assert!(st.end, "{alg}: stream did not end");
    out.truncate(st.produced);
    out
}

#[test]
fn every_algorithm_and_level_round_trips() {
    let mut e = Engine::new();
    for data in [vec![], vec![7], text(100_000), noise(70_000, 3)] {
        for alg in Algorithm::ALL {
            let mut levels: Vec<i8> = alg.levels().collect();
            levels.push(DEFAULT_LEVEL);
            for level in levels {
                let c = one_shot(&mut e, alg, level, &data);
                if alg != Algorithm::Lz4 {
                    assert!(
                        stream_decode(alg, &c, data.len() + 1) == data,
                        "{alg} {level}"
                    );
                }
            }
        }
    }
}

#[test]
fn text_compresses() {
    let mut e = Engine::new();
    let data = text(1 << 20);
    for alg in Algorithm::ALL {
        let c = one_shot(&mut e, alg, DEFAULT_LEVEL, &data);
        assert!(
            c.len() * 2 < data.len(),
            "{alg}: {} of {}",
            c.len(),
            data.len()
        );
    }
}

#[test]
fn bad_input_and_small_output_get_clear_errors() {
    let mut e = Engine::new();
    let data = text(50_000);
    for alg in Algorithm::ALL {
        let c = one_shot(&mut e, alg, 1, &data);
        let mut out = vec![0; data.len()];
        // Output one byte short.
        assert_eq!(
            e.decompress(alg, &c, &mut out[..data.len() - 1], 0),
            Err(CodecError::NoSpace),
            "{alg}"
        );
        // Truncated anywhere. (Deflate data has no length of its own:
        // libdeflate reads the missing bits as zeros, which may decode to
        // more than the room, so it may say that instead.)
        for cut in [0, 1, c.len() / 2, c.len() - 1] {
            let got = e.decompress(alg, &c[..cut], &mut out, 0);
            let ok = got == Err(CodecError::Corrupt)
                || (alg.is_deflate() && got == Err(CodecError::NoSpace));
            assert!(ok, "{alg} cut {cut}: {got:?}");
        }
        // Compression into too little room.
        assert_eq!(
            e.compress(alg, 1, &data, &mut out[..10]),
            Err(CodecError::NoSpace),
            "{alg}"
        );
        // Corrupted bytes: an error or different output, never a crash.
        for i in (0..c.len()).step_by(7) {
            let mut bad = c.clone();
            bad[i] ^= 0x55;
            let _ = e.decompress(alg, &bad, &mut out, 0);
        }
        assert_eq!(e.compress(alg, 30, &data, &mut out), Err(CodecError::Param));
    }
}

#[test]
fn ratio_limit_stops_a_bomb() {
    let mut e = Engine::new();
    let zeros = vec![0u8; 8 << 20];
    for alg in Algorithm::ALL {
        let c = one_shot(&mut e, alg, DEFAULT_LEVEL, &zeros);
        let mut out = vec![0; zeros.len()];
        assert_eq!(
            e.decompress(alg, &c, &mut out, 100),
            Err(CodecError::Ratio),
            "{alg}"
        );
        let ok = e.decompress(alg, &c, &mut out, u16::MAX);
        if zeros.len() <= c.len() * u16::MAX as usize {
            assert!(ok.is_ok(), "{alg}");
        }
    }
}

#[test]
fn gzip_members_read_one_at_a_time_and_trailing_bytes_are_left() {
    let mut e = Engine::new();
    let (a, b) = (text(3000), noise(2000, 9));
    let mut both = one_shot(&mut e, Algorithm::Gzip, 1, &a);
    both.extend(one_shot(&mut e, Algorithm::Gzip, 9, &b));
    let mut out = vec![0; 6000];
    // One member per call, as zlib reads them; the next starts where the
    // first call stopped.
    let first = e.decompress(Algorithm::Gzip, &both, &mut out, 0).unwrap();
    assert_eq!(first.produced, 3000);
    let second = e
        .decompress(
            Algorithm::Gzip,
            &both[first.consumed..],
            &mut out[3000..],
            0,
        )
        .unwrap();
    assert_eq!(
        (first.consumed + second.consumed, second.produced),
        (both.len(), 2000)
    );
    assert!(out[..3000] == a[..] && out[3000..5000] == b[..]);
    let mut z = one_shot(&mut e, Algorithm::Zlib, 1, &a);
    let n = z.len();
    z.extend_from_slice(b"trailing");
    let got = e.decompress(Algorithm::Zlib, &z, &mut out, 0).unwrap();
    assert_eq!((got.consumed, got.produced), (n, 3000));
}

fn stream(alg: Algorithm, compress: bool, level: i8, dict: &[u8]) -> Stream {
    Stream::new(&StreamParams {
        alg,
        compress,
        level,
        window_bits: 0,
        dict,
    })
    .unwrap()
}

/// Compress `data` through a stream in pieces at `cuts`, with `flush`
/// between pieces, into output chunks of `room` bytes.
fn stream_compress(
    alg: Algorithm,
    data: &[u8],
    cuts: &[usize],
    flush: Flush,
    room: usize,
    dict: &[u8],
) -> Vec<u8> {
    let mut s = stream(alg, true, 6, dict);
    let mut out = Vec::new();
    let mut buf = vec![0; room];
    let mut bounds: Vec<usize> = cuts.iter().copied().filter(|&c| c <= data.len()).collect();
    bounds.push(data.len());
    bounds.sort_unstable();
    let mut at = 0;
    for (i, &end) in bounds.iter().enumerate() {
        let last = i == bounds.len() - 1;
        let f = if last { Flush::Finish } else { flush };
        loop {
            let st = s.run(&data[at..end], &mut buf, f).unwrap();
            at += st.consumed;
            out.extend_from_slice(&buf[..st.produced]);
            if st.end || (!last && at == end && st.produced < room) {
                break;
            }
        }
    }
    assert!(s.ended());
    out
}

fn stream_decompress(
    alg: Algorithm,
    c: &[u8],
    piece: usize,
    room: usize,
    dict: &[u8],
) -> Result<Vec<u8>, CodecError> {
    let mut s = stream(alg, false, 0, dict);
    let mut out = Vec::new();
    let mut buf = vec![0; room];
    let mut at = 0;
    loop {
        let end = (at + piece).min(c.len());
        let st = s.run(&c[at..end], &mut buf, Flush::None)?;
        at += st.consumed;
        out.extend_from_slice(&buf[..st.produced]);
        if st.end {
            return Ok(out);
        }
        if st.consumed == 0 && st.produced == 0 && at == c.len() {
            return Err(CodecError::Corrupt);
        }
    }
}

#[test]
fn streams_match_one_shot_at_every_split() {
    let mut e = Engine::new();
    let data = text(300);
    for alg in [
        Algorithm::Deflate,
        Algorithm::Zlib,
        Algorithm::Gzip,
        Algorithm::Zstd,
    ] {
        for cut in 0..=data.len() {
            for flush in [Flush::None, Flush::Sync, Flush::Full] {
                let c = stream_compress(alg, &data, &[cut], flush, 64, &[]);
                let mut back = vec![0; data.len()];
                let got = e.decompress(alg, &c, &mut back, 0).unwrap();
                assert_eq!(got.produced, data.len());
                assert!(back == data, "{alg} cut {cut} {flush:?}");
            }
        }
        // And the one-shot stream decodes through a stream in every
        // piece size.
        let c = one_shot(&mut e, alg, 6, &data);
        for piece in 1..c.len() {
            assert!(
                stream_decompress(alg, &c, piece, 7, &[]).unwrap() == data,
                "{alg} piece {piece}"
            );
        }
    }
}

#[test]
fn dictionaries_work_and_are_asked_for() {
    let dict = text(2000);
    let data = text(5000);
    for alg in [Algorithm::Deflate, Algorithm::Zlib, Algorithm::Zstd] {
        let with = stream_compress(alg, &data, &[], Flush::None, 4096, &dict);
        let without = stream_compress(alg, &data, &[], Flush::None, 4096, &[]);
        assert!(
            with.len() < without.len(),
            "{alg}: {} vs {}",
            with.len(),
            without.len()
        );
        assert!(stream_decompress(alg, &with, 100, 1000, &dict).unwrap() == data);
        if alg == Algorithm::Zlib {
            assert_eq!(
                stream_decompress(alg, &with, 100, 1000, &[]),
                Err(CodecError::NeedDict)
            );
        }
    }
}

#[test]
fn bad_stream_parameters_are_refused() {
    let p = StreamParams {
        alg: Algorithm::Lz4,
        compress: true,
        level: 1,
        window_bits: 0,
        dict: &[],
    };
    assert!(Stream::new(&p).is_err());
    assert!(Stream::new(&StreamParams {
        alg: Algorithm::Zstd,
        window_bits: 10,
        ..p
    })
    .is_err());
    assert!(Stream::new(&StreamParams {
        alg: Algorithm::Zlib,
        window_bits: 16,
        ..p
    })
    .is_err());
    assert!(Stream::new(&StreamParams {
        alg: Algorithm::Zlib,
        level: 13,
        ..p
    })
    .is_err());
    let ok = Stream::new(&StreamParams {
        alg: Algorithm::Zlib,
        window_bits: 8,
        ..p
    });
    assert!(ok.is_ok());
}

#[test]
fn corrupt_streams_fail_cleanly() {
    let mut e = Engine::new();
    let data = text(20_000);
    for alg in [
        Algorithm::Deflate,
        Algorithm::Zlib,
        Algorithm::Gzip,
        Algorithm::Zstd,
    ] {
        let c = one_shot(&mut e, alg, 6, &data);
        for i in (0..c.len()).step_by(11) {
            let mut bad = c.clone();
            bad[i] ^= 0xa5;
            // An error, a different output, or (a flipped bit a checksum
            // does not cover) the same: never a crash or a hang.
            let _ = stream_decompress(alg, &bad, 512, 4096, &[]);
        }
        assert!(stream_decompress(alg, &c[..c.len() / 2], 512, 4096, &[]).is_err());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Random data, random cut points and room: a stream's output is a
    /// valid stream of the same data for the one-shot decoder.
    #[test]
    fn random_streams_round_trip(
        seed in any::<u64>(),
        len in 0usize..20_000,
        cuts in proptest::collection::vec(0usize..20_000, 0..5),
        flush in 0u8..3,
        room in 16usize..5000,
        alg in 0usize..4,
    ) {
        let alg = [Algorithm::Deflate, Algorithm::Zlib, Algorithm::Gzip, Algorithm::Zstd][alg];
        let mut data = text(len);
        let n = noise(len / 3, seed);
        data[..n.len()].copy_from_slice(&n);
        let c = stream_compress(alg, &data, &cuts, Flush::try_from(flush).unwrap(), room, &[]);
        let mut back = vec![0; len];
        let got = Engine::new().decompress(alg, &c, &mut back, 0).unwrap();
        prop_assert_eq!(got.produced, len);
        prop_assert!(back == data);
    }
}

/// Differential: our zlib streams decode with the system zlib and its
/// streams decode here, at every level (skipped and counted without a
/// system zlib).
#[test]
fn streams_interoperate_with_stock_zlib() {
    let Some(z) = stock::StockZlib::load() else {
        eprintln!("SKIP streams_interoperate_with_stock_zlib: no libz.so.1");
        if let Ok(p) = std::env::var("WD_SKIP_LOG") {
            use std::io::Write;
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(p)
            {
                let _ = writeln!(f, "streams_interoperate_with_stock_zlib: no system zlib");
            }
        }
        return;
    };
    let mut e = Engine::new();
    for data in [text(1), text(5000), text(300_000), noise(100_000, 5)] {
        let mut back = vec![0; data.len() + 1];
        for level in [DEFAULT_LEVEL, 0, 1, 6, 9, 12] {
            let c = one_shot(&mut e, Algorithm::Zlib, level, &data);
            assert_eq!(
                z.decompress(&c, &mut back),
                Ok((c.len(), data.len())),
                "level {level}"
            );
            assert!(back[..data.len()] == data[..]);
            if level <= 9 {
                let mut sc = vec![0; compress_bound(Algorithm::Zlib, data.len()) + 64];
                let n = z.compress(level as i32, &data, &mut sc).unwrap();
                let got = e
                    .decompress(Algorithm::Zlib, &sc[..n], &mut back, 0)
                    .unwrap();
                assert_eq!((got.consumed, got.produced), (n, data.len()));
                assert!(back[..data.len()] == data[..]);
            }
        }
    }
}

#[test]
fn a_huge_room_with_a_ratio_limit_allocates_the_bound_only() {
    let data = text(10_000);
    let mut e = Engine::new();
    for alg in Algorithm::ALL {
        let z = one_shot(&mut e, alg, DEFAULT_LEVEL, &data);
        // The ratio bounds the output: a room of usize::MAX panicked
        // (capacity overflow) and one of gigabytes was reserved (LZ4:
        // zeroed) for 10 kB.
        let mut out = Vec::new();
        let got = e
            .decompress_vec(alg, &z, &mut out, usize::MAX, 100)
            .unwrap();
        assert_eq!(out, data, "{alg}");
        assert_eq!(got.produced, data.len());
        assert!(
            out.capacity() <= z.len() * 100 + 1,
            "{alg}: {}",
            out.capacity()
        );
        // A bomb past the ratio is still told apart from a short room.
        let mut out = Vec::new();
        let e2 = e.decompress_vec(alg, &z, &mut out, usize::MAX, 1);
        assert_eq!(e2.err(), Some(CodecError::Ratio), "{alg}");
        // Without a ratio, a room no vector can have is refused.
        let mut out = vec![0u8; 1];
        let e3 = e.decompress_vec(alg, &z, &mut out, usize::MAX, 0);
        assert_eq!(e3.err(), Some(CodecError::Param), "{alg}");
    }
}

/// LZ4 frames may follow each other (`lz4 a; lz4 b; cat`) with skippable
/// frames among them: all are decoded. The frame decoder stops at the end
/// of each frame, which was taken for the end of the input (the frames
/// after the first were dropped, with success and all input consumed),
/// and fails on a skippable frame (a valid input was corrupt).
#[test]
fn lz4_concatenated_and_skippable_frames_are_all_decoded() {
    let mut e = Engine::new();
    let (a, b) = (text(10_000), noise(20_000, 3));
    let skippable = |z: &mut Vec<u8>| {
        z.extend_from_slice(&0x184d_2a53u32.to_le_bytes());
        z.extend_from_slice(&4u32.to_le_bytes());
        z.extend_from_slice(b"meta");
    };
    let mut z = Vec::new();
    skippable(&mut z);
    z.extend_from_slice(&one_shot(&mut e, Algorithm::Lz4, 1, &a));
    skippable(&mut z);
    z.extend_from_slice(&one_shot(&mut e, Algorithm::Lz4, 1, &b));
    let mut out = vec![0u8; 40_000];
    let got = e.decompress(Algorithm::Lz4, &z, &mut out, 0).unwrap();
    assert_eq!((got.produced, got.consumed), (30_000, z.len()));
    assert!(out[..10_000] == a[..] && out[10_000..30_000] == b[..]);
    // Room for exactly both, and one byte short of it.
    let mut out = vec![0u8; 30_000];
    assert_eq!(
        e.decompress(Algorithm::Lz4, &z, &mut out, 0)
            .unwrap()
            .produced,
        30_000
    );
    let mut out = vec![0u8; 29_999];
    assert_eq!(
        e.decompress(Algorithm::Lz4, &z, &mut out, 0),
        Err(CodecError::NoSpace)
    );
    // A skippable frame cut short is not whole input.
    let mut cut = z.clone();
    cut.truncate(6);
    assert_eq!(
        e.decompress(Algorithm::Lz4, &cut, &mut out, 0),
        Err(CodecError::Corrupt)
    );
}

/// RFC 8878 3.1.2: a skippable frame may come anywhere in a zstd stream
/// (pzstd writes one before each frame). A stream session took the end of
/// a leading skippable frame for the end of the stream: nothing decoded,
/// every later step taking nothing. One-shot decoding skipped it already.
#[test]
fn a_zstd_stream_goes_on_after_a_skippable_frame() {
    let mut e = Engine::new();
    let data = text(100_000);
    let mut z = Vec::new();
    z.extend_from_slice(&0x184d_2a5fu32.to_le_bytes());
    z.extend_from_slice(&8u32.to_le_bytes());
    z.extend_from_slice(b"metadata");
    z.extend_from_slice(&one_shot(&mut e, Algorithm::Zstd, 3, &data));
    let mut out = vec![0u8; 200_000];
    let got = e.decompress(Algorithm::Zstd, &z, &mut out, 0).unwrap();
    assert_eq!(got.produced, data.len());
    // Whole, and a few bytes at a time (the magic number split).
    for piece in [z.len(), 3, 1000] {
        let back = stream_decompress(Algorithm::Zstd, &z, piece, 4096, &[]).unwrap();
        assert!(back == data, "in pieces of {piece}");
    }
}

/// A block header of 0x80000000 (an "uncompressed" block of no bytes)
/// ends an LZ4 frame, as the reference decoder has it: the blocks after
/// it are not the frame's. The walker took it for an empty block, the
/// frame decoder for the end: the blocks after it were dropped with
/// success and all input consumed.
#[test]
fn lz4_blocks_after_an_empty_uncompressed_block_are_not_dropped() {
    let mut e = Engine::new();
    let data = text(50_000);
    let c = one_shot(&mut e, Algorithm::Lz4, 1, &data);
    let flg = c[4];
    let header = 4 + 2 + if flg & 8 != 0 { 8 } else { 0 } + if flg & 1 != 0 { 4 } else { 0 } + 1;
    let mut z = c[..header].to_vec();
    z.extend_from_slice(&0x8000_0000u32.to_le_bytes());
    z.extend_from_slice(&c[header..]);
    let mut out = vec![0u8; 100_000];
    assert_eq!(
        e.decompress(Algorithm::Lz4, &z, &mut out, 0),
        Err(CodecError::Corrupt)
    );
}

/// A compressed LZ4 block may decode to no bytes (a lone token of no
/// literals). The frame decoder answers a read with 0 bytes there, which
/// was taken for the frame's end: the blocks after it were dropped, with
/// success and all input counted as consumed.
#[test]
fn lz4_blocks_after_a_block_of_no_bytes_are_decoded() {
    let mut e = Engine::new();
    let data = text(50_000);
    let c = one_shot(&mut e, Algorithm::Lz4, 1, &data);
    let flg = c[4];
    let header = 4 + 2 + if flg & 8 != 0 { 8 } else { 0 } + if flg & 1 != 0 { 4 } else { 0 } + 1;
    assert_eq!(flg & 0x10, 0, "no block checksums");
    let mut z = c[..header].to_vec();
    z.extend_from_slice(&1u32.to_le_bytes());
    z.push(0);
    z.extend_from_slice(&c[header..]);
    lz4_decodes_to(&z, &data);
}

/// `z` decodes to `data`, all of it taken, whole and in parts, into a
/// room it fills and one larger.
fn lz4_decodes_to(z: &[u8], data: &[u8]) {
    for room in [data.len(), data.len() + 100] {
        let mut out = vec![0u8; room];
        let got = Engine::new()
            .decompress(Algorithm::Lz4, z, &mut out, 0)
            .unwrap();
        assert_eq!((got.consumed, got.produced), (z.len(), data.len()));
        assert!(out[..data.len()] == data[..]);
        let mut p = crate::DecompressParts::new(Algorithm::Lz4, z.to_vec(), room, 0).unwrap();
        let mut back = Vec::new();
        let end = loop {
            let (made, end) = p.next_part().unwrap();
            back.extend_from_slice(made);
            if let Some(end) = end {
                break end;
            }
        };
        assert_eq!(end, got);
        assert!(back == data);
    }
}

/// Where 0x80000000 is a frame's end mark (as the reference decoder reads
/// it), the frame's content checksum may follow it. The frame decoder
/// reads that header as an empty block, answering a read with 0 bytes
/// before the checksum: a read of 0 was taken for the end only where the
/// frame's bytes end, so the checksum was decoded as a block header and
/// the frame refused as corrupt. With block checksums, the decoder reads
/// a checksum for the "empty block" (the content checksum, or past the
/// frame's end).
///
/// Given the frame cut before that mark, the decoder checks neither the
/// content size nor the content checksum: they are checked after it, a
/// frame whose content is not what it says refused as corrupt.
#[test]
fn lz4_an_end_mark_of_0x80000000_ends_a_frame_with_checksums() {
    for (content, blocks, sized) in [
        (true, false, false),
        (true, true, false),
        (false, true, false),
        (false, false, true),
        (true, true, true),
    ] {
        lz4_end_mark_0x80000000_with(content, blocks, sized);
    }
}

fn lz4_end_mark_0x80000000_with(content: bool, blocks: bool, sized: bool) {
    use std::io::Write;
    let data = text(50_000);
    let info = lz4_flex::frame::FrameInfo::new()
        .content_checksum(content)
        .block_checksums(blocks)
        .content_size(sized.then_some(data.len() as u64));
    let mut w = lz4_flex::frame::FrameEncoder::with_frame_info(info, Vec::new());
    w.write_all(&data).unwrap();
    let mut z = w.finish().unwrap();
    assert_eq!(z[4] & 4 != 0, content);
    assert_eq!(z[4] & 0x10 != 0, blocks);
    assert_eq!(z[4] & 8 != 0, sized);
    let mark = z.len() - if content { 8 } else { 4 };
    assert_eq!(z[mark..mark + 4], [0, 0, 0, 0]);
    z[mark + 3] = 0x80;
    lz4_decodes_to(&z, &data);
    let refused = |z: &[u8], what: &str| {
        for room in [data.len(), data.len() + 100] {
            let mut out = vec![0u8; room];
            let whole = Engine::new().decompress(Algorithm::Lz4, z, &mut out, 0);
            assert_eq!(whole, Err(CodecError::Corrupt), "{what}");
            let mut p = crate::DecompressParts::new(Algorithm::Lz4, z.to_vec(), room, 0)
                .unwrap()
                .parts_of(4096, 4096);
            let parts = loop {
                match p.next_part() {
                    Ok((_, Some(e))) => break Ok(e),
                    Ok((_, None)) => {}
                    Err(e) => break Err(e),
                }
            };
            assert_eq!(parts, Err(CodecError::Corrupt), "{what} in parts");
        }
    };
    if content {
        let mut bad = z.clone();
        *bad.last_mut().unwrap() ^= 1;
        refused(&bad, "content checksum");
    }
    if sized {
        // One byte more promised (the header's own checksum made again).
        let mut bad = z.clone();
        bad[6..14].copy_from_slice(&(data.len() as u64 + 1).to_le_bytes());
        bad[14] = (twox_hash::XxHash32::oneshot(0, &bad[4..14]) >> 8) as u8;
        refused(&bad, "content size");
    }
}

/// A zstd stream whose input ends where a skippable frame ended ends
/// when the caller finishes it, as one-shot decoding accepts it (it never
/// ended: every later step said "not yet").
#[test]
fn a_zstd_stream_of_skippable_frames_ends_when_finished() {
    let mut z = 0x184d_2a50u32.to_le_bytes().to_vec();
    z.extend_from_slice(&4u32.to_le_bytes());
    z.extend_from_slice(b"meta");
    let mut out = vec![0u8; 1024];
    assert!(Engine::new()
        .decompress(Algorithm::Zstd, &z, &mut out, 0)
        .is_ok());
    let mut s = stream(Algorithm::Zstd, false, 0, &[]);
    let a = s.run(&z, &mut out, Flush::None).unwrap();
    assert_eq!((a.consumed, a.produced, a.end), (z.len(), 0, false));
    let b = s.run(&[], &mut out, Flush::Finish).unwrap();
    assert_eq!((b.consumed, b.produced, b.end), (0, 0, true));
    // Finished in the same step.
    let mut s = stream(Algorithm::Zstd, false, 0, &[]);
    assert!(s.run(&z, &mut out, Flush::Finish).unwrap().end);
}
