//! The igzip binding's idea of `struct isal_zstream` against the installed
//! header (a C program prints each offset, size and constant it relies
//! on), and igzip's level 1 output against stock zlib. Skipped (and
//! counted) without the header, a C compiler or the library.

use wd_zip_codec::isal::abi;
use wd_zip_codec::{compress_bound, stock::StockZlib, CodecError, Engine};
use wd_zip_msg::Algorithm;

#[test]
fn layout_matches_the_installed_header() {
    let want: [(&str, usize); 17] = [
        ("offsetof(struct isal_zstream, next_in)", abi::NEXT_IN),
        ("offsetof(struct isal_zstream, avail_in)", abi::AVAIL_IN),
        ("offsetof(struct isal_zstream, next_out)", abi::NEXT_OUT),
        ("offsetof(struct isal_zstream, avail_out)", abi::AVAIL_OUT),
        ("offsetof(struct isal_zstream, total_out)", abi::TOTAL_OUT),
        ("offsetof(struct isal_zstream, level)", abi::LEVEL),
        (
            "offsetof(struct isal_zstream, level_buf_size)",
            abi::LEVEL_BUF_SIZE,
        ),
        ("offsetof(struct isal_zstream, level_buf)", abi::LEVEL_BUF),
        (
            "offsetof(struct isal_zstream, end_of_stream)",
            abi::END_OF_STREAM,
        ),
        ("offsetof(struct isal_zstream, flush)", abi::FLUSH),
        ("offsetof(struct isal_zstream, gzip_flag)", abi::GZIP_FLAG),
        ("sizeof(struct isal_zstream)", abi::SIZE),
        ("ISAL_DEF_LVL1_DEFAULT", abi::LEVEL1_BUF),
        ("IGZIP_GZIP", abi::GZIP as usize),
        ("IGZIP_ZLIB", abi::ZLIB as usize),
        ("COMP_OK + 100", (abi::COMP_OK + 100) as usize),
        (
            "STATELESS_OVERFLOW + 100",
            (abi::STATELESS_OVERFLOW + 100) as usize,
        ),
    ];
    wd_testutil::check_c_layout(
        "isal layout_matches_the_installed_header",
        "isa-l/igzip_lib.h",
        &want,
    );
}

/// Opt this test process in to ISA-L (as `WD_ZIP_ISAL=1` does for a
/// program), so its tests run wherever the library is installed: whether
/// it then serves level 1.
fn isal_opted_in() -> bool {
    std::env::set_var("WD_ZIP_ISAL", "1");
    wd_zip_codec::isal::available()
}

/// Text with binary bytes mixed in, of many sizes.
fn samples() -> Vec<Vec<u8>> {
    [0usize, 1, 100, 4096, 65_536, 300_000]
        .iter()
        .map(|&n| wd_testutil::text(n, 0x2545_f491))
        .collect()
}

#[test]
fn level_one_decodes_with_stock_zlib_and_stays_near_its_size() {
    let name = "isal level_one_decodes_with_stock_zlib_and_stays_near_its_size";
    if !isal_opted_in() {
        wd_testutil::skip(name, "no libisal.so.2 (libisal2)");
        return;
    }
    let Some(z) = StockZlib::load() else {
        wd_testutil::skip(name, "no libz.so.1");
        return;
    };
    let mut e = Engine::new();
    for data in samples() {
        let mut out = vec![0u8; compress_bound(Algorithm::Zlib, data.len())];
        let n = e
            .compress(Algorithm::Zlib, 1, &data[..], &mut out[..])
            .unwrap();
        let mut back = vec![0u8; data.len()];
        assert_eq!(z.decompress(&out[..n], &mut back), Ok((n, data.len())));
        assert!(back == data);
        let mut theirs = vec![0u8; compress_bound(Algorithm::Zlib, data.len())];
        let m = z.compress(1, &data, &mut theirs).unwrap();
        assert!(
            n as f64 <= m as f64 * 1.1 + 64.0,
            "{} bytes: igzip {n}, zlib {m}",
            data.len()
        );
        // Too little room: igzip gives up and libdeflate answers, or the
        // error is the one every engine gives.
        if n > 10 {
            let mut small = vec![0u8; n - 1];
            let r = e.compress(Algorithm::Zlib, 1, &data[..], &mut small[..]);
            assert!(
                matches!(r, Err(CodecError::NoSpace)) || r.is_ok_and(|k| k < n),
                "{r:?}"
            );
        }
    }
    // The other framings round-trip through the engine's own decoder.
    let data = &samples()[5];
    for alg in [Algorithm::Deflate, Algorithm::Gzip] {
        let mut out = vec![0u8; compress_bound(alg, data.len())];
        let n = e.compress(alg, 1, &data[..], &mut out[..]).unwrap();
        let mut back = vec![0u8; data.len()];
        let got = e.decompress(alg, &out[..n], &mut back[..], 0).unwrap();
        assert_eq!((got.consumed, got.produced), (n, data.len()));
        assert!(back == *data);
    }
}

/// igzip's level 1 choices depend on where its stream structure lies
/// (why ISA-L is opt-in and [`wd_zip_codec::reproducible`] says false):
/// whatever the address, every stream must still decode to its input.
/// Many engines alive at once put their structures at many addresses.
#[test]
fn level_one_is_valid_wherever_its_structure_lies() {
    let name = "isal level_one_is_valid_wherever_its_structure_lies";
    if !isal_opted_in() {
        wd_testutil::skip(name, "no libisal.so.2 (libisal2)");
        return;
    }
    assert!(!wd_zip_codec::reproducible());
    let words: [&[u8]; 5] = [b"queue ", b"domain ", b"IOVA ", b"engine ", b"session\n"];
    let mut x = 0x9e37_79b9u32;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x
    };
    let blocks: Vec<Vec<u8>> = (0..24)
        .map(|i| {
            let n = [29, 105, 919, 4000, 40_000][i % 5];
            let mut v = Vec::new();
            while v.len() < n {
                if next() % 5 == 0 {
                    v.push(next() as u8);
                } else {
                    v.extend_from_slice(words[(next() % 5) as usize]);
                }
            }
            v.truncate(n);
            v
        })
        .collect();
    let mut engines: Vec<Engine> = (0..150).map(|_| Engine::new()).collect();
    let mut check = Engine::new();
    let mut variants = 0;
    for (i, b) in blocks.iter().enumerate() {
        let alg = [Algorithm::Deflate, Algorithm::Zlib, Algorithm::Gzip][i % 3];
        let mut seen: Vec<Vec<u8>> = Vec::new();
        for e in &mut engines {
            let mut out = vec![0u8; compress_bound(alg, b.len())];
            let n = e.compress(alg, 1, &b[..], &mut out[..]).unwrap();
            out.truncate(n);
            if seen.contains(&out) {
                continue;
            }
            let mut back = vec![0u8; b.len()];
            let got = check.decompress(alg, &out, &mut back[..], 0).unwrap();
            assert_eq!((got.consumed, got.produced), (n, b.len()), "{alg}");
            assert!(back == *b, "{alg} stream of {} bytes", b.len());
            seen.push(out);
        }
        variants += seen.len() - 1;
    }
    eprintln!("{name}: {variants} extra stream(s) for 24 blocks over 150 structure addresses");
}
