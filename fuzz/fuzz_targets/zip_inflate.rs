//! Hostile compressed data through every decoder the zip device and the
//! drop-in zlib use: one-shot (libdeflate, libzstd, LZ4 frames) and
//! streams (zlib-rs, libzstd) fed in pieces. Never a panic, never more
//! output than the room, and the two deflate decoders agree: what one
//! decodes whole, the other decodes to the same bytes. Raw deflate also
//! goes through the walk that ends a stream open (`pieces::end_open`):
//! never a panic, and a stream it rewrites still decodes to the same
//! bytes once a final block follows. The one-shot call run in small parts
//! (`DecompressParts`, as the zip device runs a long one; zstd in a
//! buffer of its own or in place in the caller's) ends as the
//! call run whole: the same output, counts and status, except where
//! docs/compression.md says it may differ.
#![no_main]
use libfuzzer_sys::fuzz_target;
use wd_zip_codec::{pieces, CodecError, DecompressParts, Engine, Flush, Stream, StreamParams};
use wd_zip_msg::Algorithm;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, input)) = data.split_first() else {
        return;
    };
    let alg = Algorithm::ALL[sel as usize % Algorithm::ALL.len()];
    let room = 1 + (sel as usize >> 3) * 4096;
    let ratio = if sel & 4 != 0 { 8 } else { 0 };
    let mut e = Engine::new();
    let mut out = vec![0u8; room];
    let one = e.decompress(alg, input, &mut out[..], ratio);
    if alg == Algorithm::Deflate {
        let mut open = input.to_vec();
        open.resize(input.len() + 5, 0);
        if let Ok(n) = pieces::end_open(&mut open, input.len()) {
            assert!(n <= input.len() + 5 && open[n - 4..n] == [0, 0, 0xff, 0xff]);
            open.truncate(n);
            open.extend_from_slice(&pieces::CLOSE);
            let mut again = vec![0u8; room];
            let twice = e.decompress(alg, &open, &mut again[..], 0);
            if let Ok(got) = one {
                if got.consumed == input.len() && ratio == 0 {
                    let t = twice.expect("a stream ended open and closed again decodes");
                    assert_eq!(&again[..t.produced], &out[..got.produced]);
                }
            }
        }
    }
    if let Ok(got) = one {
        assert!(got.produced <= room && got.consumed <= input.len());
        if ratio != 0 {
            assert!(got.produced <= got.consumed * ratio as usize);
        }
    }
    let part = 1 + (sel as usize >> 2) * 97;
    // zstd decodes into its own buffer or in place into the caller's
    // (the zip device's way), by the input's length.
    let into = input.len() % 2 == 0;
    let parts =
        DecompressParts::new(alg, input.to_vec(), room, ratio).map(|p| p.parts_of(part, part));
    let mut back = Vec::new();
    let cut = parts.and_then(|mut p| {
        let into = into && p.writes_into();
        let mut target = vec![0u8; if into { p.out_len() } else { 0 }];
        loop {
            let end = if into {
                let (n, end) = p.next_part_into(&mut target[..])?;
                back.extend_from_slice(&target[back.len()..back.len() + n]);
                end
            } else {
                let (made, end) = p.next_part()?;
                back.extend_from_slice(made);
                end
            };
            if let Some(e) = end {
                break Ok(e);
            }
        }
    });
    match (&one, &cut) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a, b, "{alg}");
            assert!(
                out[..a.produced] == back[..],
                "{alg}: parts made other bytes"
            );
        }
        (Err(a), Err(b)) => assert!(
            a == b
                || matches!(
                    (a, b),
                    (CodecError::NoSpace | CodecError::Ratio, CodecError::Corrupt)
                        | (CodecError::Corrupt, CodecError::NoSpace | CodecError::Ratio)
                ),
            "{alg}: whole {a:?}, in parts {b:?}"
        ),
        // zlib-rs refuses a few encodings libdeflate accepts.
        (Ok(_), Err(CodecError::Corrupt)) if alg.is_deflate() => {}
        _ => panic!("{alg}: whole {one:?}, in parts {cut:?}"),
    }
    if !alg.streams() {
        return;
    }
    let mut s = Stream::new(&StreamParams {
        alg,
        compress: false,
        level: 0,
        window_bits: 0,
        dict: &[],
    })
    .expect("a decompressor opens");
    let mut streamed = Vec::new();
    let mut buf = vec![0u8; 1000];
    let (mut at, mut ended) = (0, false);
    while at < input.len() && streamed.len() <= room {
        let piece = &input[at..(at + 777).min(input.len())];
        match s.run(piece, &mut buf, Flush::None) {
            Ok(st) => {
                assert!(st.consumed <= piece.len() && st.produced <= buf.len());
                streamed.extend_from_slice(&buf[..st.produced]);
                at += st.consumed;
                if st.end {
                    ended = true;
                    break;
                }
                if st.consumed == 0 && st.produced == 0 {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    // Differential: a deflate stream both decoders read whole (and that
    // fit the one-shot room) is the same data.
    if let Ok(got) = one {
        if ended && alg.is_deflate() && streamed.len() <= room {
            assert_eq!(
                &out[..got.produced],
                &streamed[..],
                "{alg}: decoders disagree"
            );
        }
    }
});
