//! The compression library against a zip device in another process: the
//! same bytes as the CPU path for every algorithm, errors alike on both
//! paths, every routing decision counted, and a batch that meets a host
//! killed mid-way finishing correct.

use std::time::{Duration, Instant};

use wd_comp::{
    Algorithm, CompError, Compressor, Config, Flush, Op, Pending, Policy, StreamParams,
    DEFAULT_LEVEL,
};
use wd_testutil::text as data;
use wrapdrive::HostConn;

/// The host process: this test binary re-run in the role "host" (see
/// wd_testutil::Role); does nothing in a normal test run.
/// In the role "host-limited", the host refuses more than 16 MiB of a
/// client's memory.
#[test]
fn child_entry() {
    let limited = match wd_testutil::role().as_deref() {
        Some("host") => false,
        Some("host-limited") => true,
        _ => return,
    };
    let mut cfg = wd_host::HostConfig {
        socket: wd_testutil::role_socket(),
        socket_mode: 0o600,
        devices: vec![wd_host::DeviceConfig::new("zip")],
        ..Default::default()
    };
    if limited {
        cfg.limits.exempt_owner = false;
        cfg.limits.mapped_bytes_per_uid = 16 << 20;
    }
    let _h = wd_host::Host::start(&cfg).expect("host starts");
    wd_testutil::while_parent_lives();
}

/// A host process with a zip device on its own socket (killed on drop).
struct HostProc {
    _process: wd_testutil::Role,
    socket: String,
}

/// A host on the socket of `name` in this process: a host spawned again
/// under the same name replaces one that was killed, on the same socket.
fn spawn_host(name: &str) -> HostProc {
    spawn_role("host", name)
}

/// A host that refuses more than 16 MiB of a client's memory.
fn spawn_limited_host(name: &str) -> HostProc {
    spawn_role("host-limited", name)
}

fn spawn_role(role: &str, name: &str) -> HostProc {
    let dir = std::env::temp_dir().join(format!("wd-comp-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("wd.sock").display().to_string();
    HostProc {
        _process: wd_testutil::Role::serving(role, &socket),
        socket,
    }
}

fn offload_cfg() -> Config {
    Config {
        policy: Policy::Offload,
        threshold: 0,
        fallback: false,
        depth: 8,
        journal_limit: wd_comp::DEFAULT_JOURNAL_LIMIT,
        split_min: 0,
    }
}

/// A compressor that computes everything in this thread.
fn cpu_compressor() -> Compressor {
    Compressor::new(
        None,
        Config {
            policy: Policy::Cpu,
            ..Config::default()
        },
    )
}

/// A stream of `alg` without a dictionary, with the default window.
fn plain_stream(alg: Algorithm, compress: bool, level: i8) -> StreamParams<'static> {
    StreamParams {
        alg,
        compress,
        level,
        window_bits: 0,
        dict: &[],
    }
}

/// A compressor on `host` that offloads everything, `depth` requests in
/// flight.
fn offloading(host: &HostProc, depth: usize) -> Compressor {
    let conn = HostConn::connect(&host.socket).unwrap();
    Compressor::new(
        Some(conn),
        Config {
            depth,
            ..offload_cfg()
        },
    )
}

#[test]
fn device_and_cpu_make_the_same_bytes() {
    let host = spawn_host("same");
    let conn = HostConn::connect(&host.socket).unwrap();
    let mut dev = Compressor::new(Some(conn), offload_cfg());
    let mut cpu = cpu_compressor();
    let blocks: Vec<Vec<u8>> = [0usize, 1, 100, 4096, 65536, 300_000]
        .iter()
        .enumerate()
        .map(|(i, &n)| data(n, i as u32 + 1))
        .collect();
    let refs: Vec<&[u8]> = blocks.iter().map(|b| &b[..]).collect();
    for alg in Algorithm::ALL {
        for level in [DEFAULT_LEVEL, 1, *alg.levels().end()] {
            let a = dev.compress_blocks(alg, level, &refs).unwrap();
            let b = cpu.compress_blocks(alg, level, &refs).unwrap();
            assert!(a == b, "{alg} level {level}: device and CPU differ");
            let crefs: Vec<&[u8]> = a.iter().map(|b| &b[..]).collect();
            let rooms: Vec<usize> = blocks.iter().map(|b| b.len()).collect();
            let back = dev.decompress_blocks(alg, &crefs, &rooms, 0).unwrap();
            assert!(back == blocks, "{alg} level {level}: round trip");
        }
    }
    let s = dev.stats();
    assert_eq!(s.offloaded, Algorithm::ALL.len() as u64 * 3 * 12, "{s:?}");
    assert_eq!(
        s.cpu_fallback + s.cpu_policy + s.cpu_threshold + s.cpu_assist,
        0
    );
    assert_eq!(cpu.stats().cpu_policy, Algorithm::ALL.len() as u64 * 3 * 6);
}

/// `data` cut at the given points (sorted, within it), empty pieces kept.
fn cut<'a>(data: &'a [u8], at: &[usize]) -> Vec<&'a [u8]> {
    let mut pieces = Vec::new();
    let mut from = 0;
    for &a in at {
        pieces.push(&data[from..a]);
        from = a;
    }
    pieces.push(&data[from..]);
    pieces
}

#[test]
fn scatter_lists_give_the_contiguous_stream_on_both_paths() {
    let host = spawn_host("sg");
    let conn = HostConn::connect(&host.socket).unwrap();
    let mut dev = Compressor::new(Some(conn), offload_cfg());
    let mut cpu = cpu_compressor();
    let msg = data(200_000, 7);
    let mut x = 0x9e37_79b9u32;
    let mut next = |n: usize| {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x as usize % n
    };
    for alg in Algorithm::ALL {
        let whole = cpu.compress_blocks(alg, 1, &[&msg]).unwrap().remove(0);
        for round in 0..4 {
            // Random cut points, an empty piece now and then.
            let mut at: Vec<usize> = (0..round * 3).map(|_| next(msg.len() + 1)).collect();
            at.sort();
            let input = cut(&msg, &at);
            let mut out = vec![0u8; wd_comp::compress_bound(alg, msg.len())];
            let mut oat: Vec<usize> = (0..3).map(|_| next(out.len() + 1)).collect();
            oat.sort();
            for c in [&mut dev, &mut cpu] {
                out.fill(0);
                let n = {
                    let mut outs = cut_mut(&mut out, &oat);
                    c.compress_sg(alg, 1, &input, &mut outs).unwrap()
                };
                assert!(
                    out[..n] == whole[..],
                    "{alg} round {round}: not the contiguous stream"
                );
                // Back through a scatter list into scattered output.
                let zin = cut(&out[..n], &[n / 3, n / 2]);
                let mut back = vec![0u8; msg.len()];
                let bat = [next(msg.len() + 1), msg.len()];
                let mut bat = bat.to_vec();
                bat.sort();
                let got = {
                    let mut outs = cut_mut(&mut back, &bat);
                    c.decompress_sg(alg, &zin, &mut outs, 0).unwrap()
                };
                assert_eq!((got.consumed, got.produced), (n, msg.len()), "{alg}");
                assert!(back == msg, "{alg} round {round}: round trip");
            }
        }
        // Too little room in the pieces: the error a contiguous buffer gets.
        let mut small = vec![0u8; 64];
        for c in [&mut dev, &mut cpu] {
            let mut outs = cut_mut(&mut small, &[10, 20]);
            let e = c.compress_sg(alg, 1, &[&msg[..100_000], &msg[100_000..]], &mut outs);
            assert!(e.is_err(), "{alg}: compressed 200 kB into 64 bytes");
        }
    }
    assert!(dev.stats().offloaded > 0);
    assert_eq!(dev.stats().cpu_fallback + dev.stats().cpu_policy, 0);
}

fn cut_mut<'a>(data: &'a mut [u8], at: &[usize]) -> Vec<&'a mut [u8]> {
    let mut pieces = Vec::new();
    let mut rest = data;
    let mut from = 0;
    for &a in at {
        let (head, tail) = rest.split_at_mut(a - from);
        pieces.push(head);
        rest = tail;
        from = a;
    }
    pieces.push(rest);
    pieces
}

#[test]
fn errors_are_the_same_on_both_paths() {
    let host = spawn_host("errors");
    let conn = HostConn::connect(&host.socket).unwrap();
    let mut dev = Compressor::new(Some(conn), offload_cfg());
    let mut cpu = cpu_compressor();
    let text = data(100_000, 7);
    let mut room = vec![0u8; 200_000];
    for c in [&mut dev, &mut cpu] {
        let n = c.compress(Algorithm::Zlib, 6, &text, &mut room).unwrap();
        let z = room[..n].to_vec();
        let mut out = vec![0u8; text.len()];
        let kind = |e: CompError| match e {
            CompError::Data(d) => d,
            other => panic!("not a data error: {other}"),
        };
        let short = c
            .decompress(Algorithm::Zlib, &z, &mut out[..1000], 0)
            .unwrap_err();
        assert_eq!(kind(short), wd_zip_codec::CodecError::NoSpace);
        let corrupt = c
            .decompress(Algorithm::Zlib, &text[..5000], &mut out, 0)
            .unwrap_err();
        assert_eq!(kind(corrupt), wd_zip_codec::CodecError::Corrupt);
        let zeros = vec![0u8; 1 << 20];
        let n = c.compress(Algorithm::Gzip, 9, &zeros, &mut room).unwrap();
        let bomb = room[..n].to_vec();
        let mut big = vec![0u8; 1 << 20];
        let e = c
            .decompress(Algorithm::Gzip, &bomb, &mut big, 20)
            .unwrap_err();
        assert_eq!(kind(e), wd_zip_codec::CodecError::Ratio);
        let e = c.compress(Algorithm::Lz4, 9, &text, &mut room).unwrap_err();
        assert_eq!(kind(e), wd_zip_codec::CodecError::Param);
        // The batch after errors is whole and right.
        let n = c.compress(Algorithm::Zstd, 3, &text, &mut room).unwrap();
        let got = c
            .decompress(Algorithm::Zstd, &room[..n], &mut out, 0)
            .unwrap();
        assert_eq!(got.produced, text.len());
        assert!(out == text);
    }
    // Every block is counted once whatever its outcome, on either path.
    let blocks = |s: wd_comp::Stats| {
        s.offloaded + s.cpu_threshold + s.cpu_policy + s.cpu_assist + s.cpu_fallback
    };
    assert_eq!(
        blocks(dev.stats()),
        blocks(cpu.stats()),
        "{:?} {:?}",
        dev.stats(),
        cpu.stats()
    );
    assert_eq!(
        dev.stats().offloaded,
        blocks(dev.stats()),
        "{:?}",
        dev.stats()
    );
}

#[test]
fn routing_is_counted_and_fallback_is_explicit() {
    // No host: everything on the CPU, counted; with fallback off, a clear
    // error.
    let mut none = Compressor::new(None, Config::default());
    let text = data(50_000, 3);
    let blocks = [&text[..], &text[..100]];
    let out = none.compress_blocks(Algorithm::Gzip, 1, &blocks).unwrap();
    assert_eq!(out.len(), 2);
    let s = none.stats();
    assert_eq!(
        (s.cpu_fallback, s.cpu_threshold, s.offloaded),
        (1, 1, 0),
        "{s:?}"
    );
    // One small block (the settings alone route it: no batch made) is
    // counted alike, bytes and all, and refuses a bad level alike.
    let mut z = vec![0u8; 256];
    let n = none
        .compress(Algorithm::Gzip, 1, &text[..100], &mut z)
        .unwrap();
    let mut back = vec![0u8; 100];
    let got = none
        .decompress(Algorithm::Gzip, &z[..n], &mut back, 0)
        .unwrap();
    assert_eq!((got.consumed, got.produced), (n, 100));
    assert_eq!(back, &text[..100]);
    let t = none.stats();
    assert_eq!(t.cpu_threshold - s.cpu_threshold, 2, "{t:?}");
    assert_eq!(t.bytes_in - s.bytes_in, 100 + n as u64, "{t:?}");
    assert_eq!(t.bytes_out - s.bytes_out, n as u64 + 100, "{t:?}");
    assert!(matches!(
        none.compress(Algorithm::Gzip, 42, &text[..100], &mut z),
        Err(CompError::Data(_))
    ));
    let mut strict = Compressor::new(None, offload_cfg());
    match strict.compress_blocks(Algorithm::Gzip, 1, &blocks) {
        Err(CompError::NoQueue(why)) => assert!(why.contains("no host"), "{why}"),
        other => panic!("{other:?}"),
    }
    // With a host, auto: big blocks offloaded, and the caller helps while
    // the slots are full.
    let host = spawn_host("auto");
    let conn = HostConn::connect(&host.socket).unwrap();
    let mut auto = Compressor::new(
        Some(conn),
        Config {
            depth: 2,
            ..Config::default()
        },
    );
    let many: Vec<&[u8]> = (0..64).map(|_| &text[..]).collect();
    let out = auto.compress_blocks(Algorithm::Deflate, 6, &many).unwrap();
    let s = auto.stats();
    assert_eq!(s.offloaded + s.cpu_assist, 64, "{s:?}");
    assert!(s.offloaded > 0, "{s:?}");
    let rooms = vec![text.len(); 64];
    let refs: Vec<&[u8]> = out.iter().map(|o| &o[..]).collect();
    for back in auto
        .decompress_blocks(Algorithm::Deflate, &refs, &rooms, 0)
        .unwrap()
    {
        assert!(back == text);
    }
}

/// A stream of `alg` decoded by the reference (zlib-rs through flate2,
/// zlib's own checks).
fn reference_decode(alg: Algorithm, stream: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    match alg {
        Algorithm::Deflate => flate2::read::DeflateDecoder::new(stream).read_to_end(&mut out),
        Algorithm::Zlib => flate2::read::ZlibDecoder::new(stream).read_to_end(&mut out),
        _ => flate2::read::GzDecoder::new(stream).read_to_end(&mut out),
    }
    .expect("the reference decodes it");
    out
}

/// Random bytes: a block that does not compress.
fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) as u8
        })
        .collect()
}

#[test]
fn large_blocks_are_cut_between_device_and_caller() {
    let host = spawn_host("split");
    let conn = HostConn::connect(&host.socket).unwrap();
    let mut auto = Compressor::new(Some(conn), Config::default());
    let text = data(1 << 20, 9);
    let rand = noise(100_000, 5);
    let mut cut = 0;
    for alg in [Algorithm::Deflate, Algorithm::Zlib, Algorithm::Gzip] {
        for level in [DEFAULT_LEVEL, 1, 6, 12] {
            for block in [
                &text[..wd_comp::DEFAULT_SPLIT_MIN],
                &text[..65_543],
                &text[..],
                &rand[..],
            ] {
                let mut out = vec![0u8; wd_comp::compress_bound(alg, block.len())];
                let n = auto.compress(alg, level, block, &mut out).unwrap();
                cut += 1;
                assert_eq!(auto.stats().split, cut, "{alg} level {level}");
                assert!(
                    reference_decode(alg, &out[..n]) == block,
                    "{alg} level {level}"
                );
                let mut back = vec![0u8; block.len()];
                let got = auto.decompress(alg, &out[..n], &mut back, 0).unwrap();
                assert_eq!((got.consumed, got.produced), (n, block.len()));
                assert!(back == block);
                // The cost of the cut: the second piece starts without the
                // first's history (a few percent at most on these small,
                // repetitive blocks at the highest levels).
                let mut whole = vec![0u8; out.len()];
                let w = wd_zip_codec::Engine::new()
                    .compress(alg, level, block, &mut whole[..])
                    .unwrap();
                assert!(n <= w + w / 20 + 16, "{alg} level {level}: {n} against {w}");
            }
        }
    }
    // A scatter list is cut the same way: the contiguous block's stream.
    let mut whole = vec![0u8; wd_comp::compress_bound(Algorithm::Gzip, text.len())];
    let n = auto
        .compress(Algorithm::Gzip, 1, &text, &mut whole)
        .unwrap();
    let pieces = [&text[..1000], &text[1000..400_000], &text[400_000..]];
    let mut z = vec![0u8; whole.len()];
    let (a, b) = z.split_at_mut(5000);
    let m = auto
        .compress_sg(Algorithm::Gzip, 1, &pieces, &mut [a, b])
        .unwrap();
    assert!(m == n && z[..m] == whole[..n]);
    // Not cut: below the size, level 0, other formats, the CPU policy.
    let s = auto.stats();
    let mut out = vec![0u8; 2 << 20];
    auto.compress(
        Algorithm::Zlib,
        1,
        &text[..wd_comp::DEFAULT_SPLIT_MIN - 1],
        &mut out,
    )
    .unwrap();
    auto.compress(Algorithm::Zlib, 0, &text, &mut out).unwrap();
    auto.compress(Algorithm::Zstd, 1, &text, &mut out).unwrap();
    assert_eq!(auto.stats().split, s.split);
    // Room for the whole stream but not the cut one: the block goes the
    // usual way and fits.
    let mut whole = vec![0u8; 1 << 20];
    let w = wd_zip_codec::Engine::new()
        .compress(Algorithm::Zlib, 1, &rand[..], &mut whole[..])
        .unwrap();
    let mut tight = vec![0u8; w];
    let n = auto
        .compress(Algorithm::Zlib, 1, &rand, &mut tight)
        .unwrap();
    assert_eq!((n, &tight[..]), (w, &whole[..w]));
    assert_eq!(auto.stats().split, s.split);
    let mut cpu = Compressor::new(
        Some(HostConn::connect(&host.socket).unwrap()),
        Config {
            policy: Policy::Cpu,
            ..Config::default()
        },
    );
    cpu.compress(Algorithm::Gzip, 1, &text, &mut out).unwrap();
    assert_eq!(cpu.stats().split, 0);
    // Cutting switched off (a program whose threads take every CPU):
    // whole, the bytes of the CPU path; on again, cut.
    auto.set_cutting(false);
    let n = auto.compress(Algorithm::Gzip, 1, &text, &mut out).unwrap();
    let mut here = vec![0u8; out.len()];
    let h = wd_zip_codec::Engine::new()
        .compress(Algorithm::Gzip, 1, &text[..], &mut here[..])
        .unwrap();
    assert_eq!(&out[..n], &here[..h]);
    assert_eq!(auto.stats().split, s.split);
    auto.set_cutting(true);
    auto.compress(Algorithm::Gzip, 1, &text, &mut out).unwrap();
    assert_eq!(auto.stats().split, s.split + 1);
    let s = auto.stats();
    // The host gone: the block runs here, whole.
    drop(host);
    std::thread::sleep(Duration::from_millis(100));
    for _ in 0..3 {
        let n = auto.compress(Algorithm::Gzip, 1, &text, &mut out).unwrap();
        assert!(reference_decode(Algorithm::Gzip, &out[..n]) == text);
    }
    assert_eq!(auto.stats().split, s.split);
}

/// A stream of `alg` compressed in pieces of the given sizes, joined.
fn in_pieces(
    c: &mut Compressor,
    alg: Algorithm,
    level: i8,
    data: &[u8],
    sizes: &[usize],
) -> Vec<u8> {
    let mut p = wd_comp::Pieces::default();
    let mut out = Vec::new();
    let mut at = 0;
    for (i, &n) in sizes.iter().enumerate() {
        let piece = &data[at..at + n];
        at += n;
        let mut buf = vec![0u8; wd_comp::compress_bound(alg, n) + 20];
        let first = i == 0;
        let last = i + 1 == sizes.len();
        let made = c
            .compress_piece(alg, level, &mut p, piece, &mut buf, first, last)
            .unwrap();
        out.extend_from_slice(&buf[..made]);
        assert_eq!(p.len, at as u64);
    }
    assert_eq!(at, data.len());
    out
}

#[test]
fn streams_in_pieces_are_one_stream_on_every_path() {
    let host = spawn_host("pieces");
    let text = data(3 << 20, 4);
    let rand = noise(300_000, 8);
    let mut both = text[..1 << 20].to_vec();
    both.extend_from_slice(&rand);
    let sizes: [&[usize]; 4] = [
        &[0],
        &[both.len()],
        &[100, 70_000, 0, 5000, both.len() - 75_100],
        &[1 << 20, 150_000, 150_000],
    ];
    let mut auto = Compressor::new(
        Some(HostConn::connect(&host.socket).unwrap()),
        Config::default(),
    );
    let mut offload = offloading(&host, 4);
    let mut cpu = cpu_compressor();
    for alg in [Algorithm::Deflate, Algorithm::Zlib, Algorithm::Gzip] {
        for level in [1, 6] {
            for s in sizes {
                let total: usize = s.iter().sum();
                let data = &both[..total];
                for (name, c) in [
                    ("auto", &mut auto),
                    ("offload", &mut offload),
                    ("cpu", &mut cpu),
                ] {
                    let z = in_pieces(c, alg, level, data, s);
                    assert!(
                        reference_decode(alg, &z) == data,
                        "{alg} {level} {s:?} {name}"
                    );
                }
            }
        }
    }
    assert!(auto.stats().split > 0, "{:?}", auto.stats());
    let o = offload.stats();
    assert!(
        o.offloaded > 0 && o.split == 0 && o.cpu_policy + o.cpu_fallback == 0,
        "{o:?}"
    );
    let c = cpu.stats();
    assert!(c.offloaded + c.split == 0 && c.cpu_policy > 0, "{c:?}");
    // A stream's pieces go on across calls that fail: a bad algorithm or
    // too little room changes nothing.
    let mut p = wd_comp::Pieces::default();
    let mut buf = vec![0u8; 1 << 20];
    let n = auto
        .compress_piece(
            Algorithm::Gzip,
            1,
            &mut p,
            &text[..1000],
            &mut buf,
            true,
            false,
        )
        .unwrap();
    let before = p;
    let mut z = buf[..n].to_vec();
    assert!(matches!(
        auto.compress_piece(
            Algorithm::Zstd,
            1,
            &mut p,
            &text[..10],
            &mut buf,
            false,
            false
        ),
        Err(CompError::Data(_))
    ));
    assert!(matches!(
        auto.compress_piece(
            Algorithm::Gzip,
            1,
            &mut p,
            &text[1000..200_000],
            &mut buf[..100],
            false,
            false
        ),
        Err(CompError::Data(_))
    ));
    assert_eq!(p, before);
    let n = auto
        .compress_piece(
            Algorithm::Gzip,
            1,
            &mut p,
            &text[1000..200_000],
            &mut buf,
            false,
            true,
        )
        .unwrap();
    z.extend_from_slice(&buf[..n]);
    assert!(reference_decode(Algorithm::Gzip, &z) == text[..200_000]);
    // No host, offloading required: a clear error, the state unchanged.
    let mut strict = Compressor::new(None, offload_cfg());
    let mut p = wd_comp::Pieces::default();
    match strict.compress_piece(
        Algorithm::Zlib,
        1,
        &mut p,
        &text[..100_000],
        &mut buf,
        true,
        true,
    ) {
        Err(CompError::NoQueue(_)) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(p, wd_comp::Pieces::default());
}

#[test]
fn a_batch_survives_its_host_dying() {
    let host = spawn_host("restart");
    let sock = host.socket.clone();
    let conn = HostConn::connect(&sock).unwrap();
    let mut cfg = offload_cfg();
    cfg.fallback = true;
    let mut c = Compressor::new(Some(conn), cfg);
    let text = data(1 << 20, 11);
    let blocks: Vec<&[u8]> = text.chunks(64 << 10).collect();
    let want = c.compress_blocks(Algorithm::Gzip, 6, &blocks).unwrap();
    // Kill the host while batches run; start another on the same socket.
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        drop(host);
        std::thread::sleep(Duration::from_millis(100));
        spawn_host("restart")
    });
    let t = Instant::now();
    let mut rounds = 0;
    while t.elapsed() < Duration::from_millis(600) || rounds < 10 {
        let got = c.compress_blocks(Algorithm::Gzip, 6, &blocks);
        match got {
            Ok(got) => assert!(got == want, "round {rounds}: wrong data"),
            // A queue that could not say what became of its requests is
            // dropped; the next batch runs on the CPU or a new queue.
            Err(CompError::Device(e)) => eprintln!("round {rounds}: {e}"),
            Err(e) => panic!("round {rounds}: {e}"),
        }
        rounds += 1;
    }
    let _new_host = killer.join().unwrap();
    assert!(c.stats().offloaded > 0);
}

#[test]
fn started_requests_finish_right_in_any_order_beside_batches() {
    let host = spawn_host("async");
    let mut c = offloading(&host, 4);
    let blocks: Vec<Vec<u8>> = (0..10)
        .map(|i| data(20_000 + i * 7_000, i as u32 + 3))
        .collect();
    let mut cpu = cpu_compressor();
    let refs: Vec<&[u8]> = blocks.iter().map(|b| &b[..]).collect();
    let want = cpu.compress_blocks(Algorithm::Zstd, 3, &refs).unwrap();
    let mut outs: Vec<Vec<u8>> = blocks
        .iter()
        .map(|b| vec![0u8; wd_comp::compress_bound(Algorithm::Zstd, b.len())])
        .collect();
    // Ten started on four slots: the rest are computed here at once.
    let mut pending = Vec::new();
    for (b, o) in blocks.iter().zip(outs.iter_mut()) {
        pending.push(Some(
            c.start(Op::Compress(3), Algorithm::Zstd, b, o).unwrap(),
        ));
    }
    assert!(
        pending.iter().flatten().any(|p| p.is_done()),
        "some computed here"
    );
    assert!(
        pending.iter().flatten().any(|p| !p.is_done()),
        "some on the device"
    );
    // A synchronous batch meanwhile neither takes nor loses their completions.
    let again = c.compress_blocks(Algorithm::Zstd, 3, &refs).unwrap();
    assert!(again == want);
    // Finished newest first, polling before the last one waits.
    let mut sizes = vec![0; blocks.len()];
    for i in (0..blocks.len()).rev() {
        let mut p = pending[i].take().unwrap();
        let got = loop {
            if let Some(g) = c.poll(&mut p, &mut outs[i]).unwrap() {
                break g;
            }
            std::thread::yield_now();
        };
        assert_eq!(got.consumed, blocks[i].len());
        sizes[i] = got.produced;
        // A finished request polled again is the caller's error.
        assert!(c.poll(&mut p, &mut outs[i]).is_err());
    }
    for i in 0..blocks.len() {
        assert!(outs[i][..sizes[i]] == want[i][..], "block {i}");
    }
    // Decompress asynchronously, finish waiting; a bad stream fails its
    // own request only.
    let mut back = vec![0u8; blocks[9].len()];
    let p = c
        .start(Op::Decompress(0), Algorithm::Zstd, &want[9], &mut back)
        .unwrap();
    let mut junk_out = vec![0u8; 10_000];
    let junk = c
        .start(
            Op::Decompress(0),
            Algorithm::Zstd,
            &blocks[0],
            &mut junk_out,
        )
        .unwrap();
    assert!(c.finish(junk, &mut junk_out).is_err());
    let got = c.finish(p, &mut back).unwrap();
    assert_eq!(got.produced, blocks[9].len());
    assert!(back == blocks[9]);
    let s = c.stats();
    assert!(s.offloaded >= 4 && s.cpu_assist > 0, "{s:?}");
    // A request of another compressor is refused, not read.
    let mut other = Compressor::new(None, Config::default());
    let mut q = c
        .start(Op::Compress(3), Algorithm::Zstd, &blocks[1], &mut outs[1])
        .unwrap();
    assert!(other.poll(&mut q, &mut outs[1]).is_err());
    c.finish(q, &mut outs[1]).unwrap();
}

/// A long compression on one queue does not hold the device: another
/// client's small request is answered while it runs, since the device
/// serves it a part per engine pass (issue: a zstd level 19 compression of
/// 64 MiB held every queue of the device for seconds).
#[test]
fn a_long_compression_does_not_hold_the_device() {
    let host = spawn_host("long");
    let mut big = offloading(&host, 1);
    let mut small = offloading(&host, 1);
    // Warm both queues up.
    for c in [&mut big, &mut small] {
        c.compress(Algorithm::Zstd, 1, b"warm", &mut [0u8; 64])
            .unwrap();
    }
    let mut input = data(2 << 20, 9);
    input.extend_from_slice(&noise(2 << 20, 9));
    let mut out = vec![0u8; wd_comp::compress_bound(Algorithm::Zstd, input.len())];
    let mut p = big
        .start(Op::Compress(19), Algorithm::Zstd, &input, &mut out)
        .unwrap();
    assert!(!p.is_done(), "on the device");
    // Running by now (seconds of work).
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    let few = data(1000, 1);
    let mut z = [0u8; 2048];
    let n = small.compress(Algorithm::Gzip, 6, &few, &mut z).unwrap();
    let waited = t.elapsed();
    assert_eq!(reference_decode(Algorithm::Gzip, &z[..n]), few);
    assert!(
        big.poll(&mut p, &mut out).unwrap().is_none(),
        "the long compression finished before a 1000-byte one ({waited:?})"
    );
    let got = big.finish(p, &mut out).unwrap();
    assert_eq!(got.consumed, input.len());
    let took = t.elapsed();
    let mut back = vec![0u8; input.len()];
    let d = small
        .decompress(Algorithm::Zstd, &out[..got.produced], &mut back, 0)
        .unwrap();
    assert_eq!(d.produced, input.len());
    assert!(back == input);
    eprintln!("small request: {waited:?}, the long one: {took:?}");
}

#[test]
fn started_requests_survive_their_host_dying() {
    let host = spawn_host("async-restart");
    let mut c = offloading(&host, 8);
    c.start(Op::Compress(6), Algorithm::Gzip, b"warm", &mut [0u8; 64])
        .map(|p| c.finish(p, &mut [0u8; 64]))
        .unwrap()
        .unwrap();
    let text = data(1 << 20, 5);
    let blocks: Vec<&[u8]> = text.chunks(128 << 10).collect();
    let mut cpu = cpu_compressor();
    let want = cpu.compress_blocks(Algorithm::Gzip, 6, &blocks).unwrap();
    let mut outs: Vec<Vec<u8>> = blocks
        .iter()
        .map(|b| vec![0u8; wd_comp::compress_bound(Algorithm::Gzip, b.len())])
        .collect();
    let mut pending: Vec<Pending> = Vec::new();
    for (b, o) in blocks.iter().zip(outs.iter_mut()) {
        pending.push(c.start(Op::Compress(6), Algorithm::Gzip, b, o).unwrap());
    }
    // The host dies with them in flight; another comes up on the socket.
    drop(host);
    let _new = spawn_host("async-restart");
    for (i, p) in pending.into_iter().enumerate() {
        let got = c.finish(p, &mut outs[i]).unwrap();
        assert!(
            outs[i][..got.produced] == want[i][..],
            "block {i}: wrong data"
        );
    }
}

/// Requests dropped unfinished give their slots back once the device is
/// done with them: later requests go to the device again instead of
/// being computed here for want of a slot.
#[test]
fn abandoned_requests_free_their_slots() {
    let host = spawn_host("async-abandon");
    let mut c = offloading(&host, 4);
    let text = data(256 << 10, 9);
    let mut out = vec![0u8; wd_comp::compress_bound(Algorithm::Gzip, text.len())];
    for round in 0..5 {
        let before = c.stats().cpu_assist;
        // Four on the device, all dropped unfinished.
        for _ in 0..4 {
            let p = c
                .start(Op::Compress(6), Algorithm::Gzip, &text, &mut out)
                .unwrap();
            assert!(!p.is_done(), "round {round}: a slot was free");
            drop(p);
        }
        assert_eq!(c.stats().cpu_assist, before, "round {round}");
        // Their slots come back as the device finishes them.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let p = c
                .start(Op::Compress(6), Algorithm::Gzip, &text, &mut out)
                .unwrap();
            if !p.is_done() {
                let got = c.finish(p, &mut out).unwrap();
                let mut back = vec![0u8; text.len()];
                let n = wd_comp::Compressor::new(None, Config::default())
                    .decompress(Algorithm::Gzip, &out[..got.produced], &mut back, 0)
                    .unwrap();
                assert!(n.produced == text.len() && back == text);
                break;
            }
            assert!(std::time::Instant::now() < deadline, "no slot came back");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

/// Compress `data` through a stream in pieces, flushing `flush` between
/// them; the stream's bytes.
fn stream_compress(
    c: &mut Compressor,
    s: &mut wd_comp::Stream,
    data: &[u8],
    flush: wd_comp::Flush,
) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 7000];
    for (i, piece) in data.chunks(10_000).enumerate() {
        let last = (i + 1) * 10_000 >= data.len();
        let f = if last { wd_comp::Flush::Finish } else { flush };
        let mut at = 0;
        loop {
            let st = c.stream_run(s, &piece[at..], &mut buf, f).unwrap();
            at += st.consumed;
            out.extend_from_slice(&buf[..st.produced]);
            if st.end || (!last && at == piece.len() && st.produced < buf.len()) {
                break;
            }
        }
    }
    out
}

#[test]
fn streams_run_on_the_device_or_here() {
    let data = data(200_000, 21);
    let host = spawn_host("streams");
    let conn = HostConn::connect(&host.socket).unwrap();
    let mut dev = Compressor::new(Some(conn), offload_cfg());
    let mut cpu = Compressor::new(None, Config::default());
    for alg in [Algorithm::Zlib, Algorithm::Gzip, Algorithm::Zstd] {
        for flush in [
            wd_comp::Flush::None,
            wd_comp::Flush::Sync,
            wd_comp::Flush::Full,
        ] {
            let p = wd_comp::StreamParams {
                alg,
                compress: true,
                level: 6,
                window_bits: 0,
                dict: &[],
            };
            let mut a = dev.open_stream(&p).unwrap();
            let mut b = cpu.open_stream(&p).unwrap();
            assert!(a.on_device() && !b.on_device());
            let za = stream_compress(&mut dev, &mut a, &data, flush);
            let zb = stream_compress(&mut cpu, &mut b, &data, flush);
            assert!(
                za == zb,
                "{alg} {flush:?}: the device and the CPU wrote different streams"
            );
            dev.close_stream(a);
            // Decompress the device's stream through a device stream, in
            // small pieces.
            let mut d = dev
                .open_stream(&wd_comp::StreamParams {
                    compress: false,
                    level: 0,
                    ..p
                })
                .unwrap();
            let (mut back, mut buf, mut at) = (Vec::new(), vec![0u8; 5000], 0);
            loop {
                let end = (at + 3000).min(za.len());
                let st = dev
                    .stream_run(&mut d, &za[at..end], &mut buf, wd_comp::Flush::None)
                    .unwrap();
                at += st.consumed;
                back.extend_from_slice(&buf[..st.produced]);
                if st.end {
                    break;
                }
                assert!(st.consumed + st.produced > 0, "{alg}: no progress");
            }
            assert!(back == data, "{alg} {flush:?}: round trip");
            dev.close_stream(d);
        }
    }
    assert_eq!(
        cpu.stats().cpu_fallback,
        9,
        "no host: streams here, counted"
    );
}

/// Run `input` through a stream in pieces of `piece` bytes (the last with
/// `Finish`, the others with `flush`) and 7000-byte output calls;
/// `between(i)` runs before piece `i`. The stream's output.
fn feed(
    c: &mut Compressor,
    s: &mut wd_comp::Stream,
    input: &[u8],
    flush: wd_comp::Flush,
    piece: usize,
    mut between: impl FnMut(usize),
) -> Result<Vec<u8>, CompError> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 7000];
    let pieces: Vec<&[u8]> = input.chunks(piece).collect();
    for (i, p) in pieces.iter().enumerate() {
        between(i);
        let last = i + 1 == pieces.len();
        let f = if last { wd_comp::Flush::Finish } else { flush };
        let mut at = 0;
        loop {
            let st = c.stream_run(s, &p[at..], &mut buf, f)?;
            at += st.consumed;
            out.extend_from_slice(&buf[..st.produced]);
            if st.end || (!last && at == p.len() && st.produced < buf.len()) {
                break;
            }
            if last && st.consumed + st.produced == 0 {
                panic!("no progress");
            }
        }
    }
    Ok(out)
}

#[test]
fn streams_go_on_when_their_host_restarts() {
    let text = data(300_000, 23);
    let dict = data(2000, 5);
    let mut cpu = cpu_compressor();
    let mut host = Some(spawn_host("stream-restart"));
    let sock = host.as_ref().unwrap().socket.clone();
    let mut dev = Compressor::new(Some(HostConn::connect(&sock).unwrap()), offload_cfg());
    let mut rebuilt = 0;
    for (alg, d) in [
        (Algorithm::Zlib, &dict[..]),
        (Algorithm::Gzip, &[][..]),
        (Algorithm::Deflate, &[][..]),
        (Algorithm::Zstd, &[][..]),
    ] {
        for flush in [wd_comp::Flush::None, wd_comp::Flush::Sync] {
            for compress in [true, false] {
                let p = wd_comp::StreamParams {
                    alg,
                    compress,
                    level: 6,
                    window_bits: 0,
                    dict: d,
                };
                // What the stream must give: the same stream, run here
                // without a restart (the same engine and the same calls:
                // pieces within one device request, so the same bytes).
                let z = {
                    let mut s = cpu
                        .open_stream(&wd_comp::StreamParams {
                            compress: true,
                            ..p
                        })
                        .unwrap();
                    feed(&mut cpu, &mut s, &text, flush, 30_000, |_| {}).unwrap()
                };
                let (input, want) = if compress { (&text, &z) } else { (&z, &text) };
                let piece = if compress {
                    30_000
                } else {
                    input.len() / 8 + 1
                };
                let mut s = dev.open_stream(&p).unwrap();
                assert!(s.on_device());
                let got = feed(&mut dev, &mut s, input, flush, piece, |i| {
                    if i == 5 {
                        drop(host.take());
                        host = Some(spawn_host("stream-restart"));
                    }
                })
                .unwrap_or_else(|e| panic!("{alg} {flush:?} compress={compress}: {e}"));
                assert!(
                    got == *want,
                    "{alg} {flush:?} compress={compress}: not the stream's bytes ({} against {}, first difference at {:?}; {:?})",
                    got.len(),
                    want.len(),
                    got.iter().zip(want.iter()).position(|(a, b)| a != b),
                    dev.stats()
                );
                assert!(s.on_device(), "rebuilt on the new host's device");
                rebuilt += 1;
                assert_eq!(dev.stats().streams_rebuilt, rebuilt);
                dev.close_stream(s);
            }
        }
    }
    assert_eq!(dev.stats().streams_lost, 0);
    assert_eq!(dev.stats().cpu_fallback, 0);

    // The gzip stream of `text` in 30,000-byte pieces, `between` run
    // before each piece.
    let gz = |c: &mut Compressor, s: &mut wd_comp::Stream, between: &mut dyn FnMut(usize)| {
        feed(c, s, &text, wd_comp::Flush::None, 30_000, between)
    };

    // No host comes back: with fallback on, the stream goes on here.
    let mut here = Compressor::new(
        Some(HostConn::connect(&sock).unwrap()),
        Config {
            fallback: true,
            ..offload_cfg()
        },
    );
    let p = plain_stream(Algorithm::Gzip, true, 1);
    let want = {
        let mut s = cpu.open_stream(&p).unwrap();
        gz(&mut cpu, &mut s, &mut |_| {}).unwrap()
    };
    let mut s = here.open_stream(&p).unwrap();
    assert!(s.on_device());
    let got = gz(&mut here, &mut s, &mut |i| {
        if i == 4 {
            drop(host.take());
        }
    })
    .unwrap();
    assert!(got == want, "rebuilt here: not the stream's bytes");
    assert!(!s.on_device());
    assert_eq!(here.stats().streams_rebuilt, 1);
    assert_eq!(here.stats().cpu_fallback, 1);

    // A stream past its journal's limit cannot be rebuilt: it fails
    // clearly, and is counted.
    host = Some(spawn_host("stream-restart"));
    let mut short = Compressor::new(
        Some(HostConn::connect(&sock).unwrap()),
        Config {
            fallback: true,
            journal_limit: 50_000,
            ..offload_cfg()
        },
    );
    let mut s = short.open_stream(&p).unwrap();
    let r = gz(&mut short, &mut s, &mut |i| {
        if i == 4 {
            drop(host.take());
            host = Some(spawn_host("stream-restart"));
        }
    });
    match r {
        Err(CompError::Device(e)) => assert_eq!(e.status(), wrapdrive::Status::HostGone, "{e}"),
        other => panic!(
            "a stream past its journal outlived its host: {:?}",
            other.map(|o| o.len())
        ),
    }
    assert_eq!(short.stats().streams_lost, 1);
    assert!(short
        .stream_run(&mut s, &[], &mut [0u8; 64], wd_comp::Flush::Finish)
        .is_err());
    // A new stream runs on the new host.
    let mut again = short.open_stream(&p).unwrap();
    assert!(again.on_device());
    let z = gz(&mut short, &mut again, &mut |_| {}).unwrap();
    assert!(z == want);
}

/// A session id means something on its compressor's own queue: a stream
/// closed through another compressor must not free that one's session of
/// the same number (its stream would lose its state, rebuilt from the
/// journal at best).
#[test]
fn a_stream_closed_through_another_compressor_frees_nothing_of_it() {
    let data = data(100_000, 5);
    let host = spawn_host("close-other");
    let mut one = Compressor::new(
        Some(HostConn::connect(&host.socket).unwrap()),
        offload_cfg(),
    );
    let mut two = Compressor::new(
        Some(HostConn::connect(&host.socket).unwrap()),
        offload_cfg(),
    );
    let p = plain_stream(Algorithm::Gzip, true, 6);
    let a = one.open_stream(&p).unwrap();
    let mut b = two.open_stream(&p).unwrap();
    assert!(a.on_device() && b.on_device());
    two.close_stream(a);
    let z = stream_compress(&mut two, &mut b, &data, wd_comp::Flush::None);
    assert!(reference_decode(Algorithm::Gzip, &z) == data);
    assert_eq!(two.stats().streams_rebuilt, 0, "its session was left alone");
    two.close_stream(b);
}

/// Feed all of `piece` with `flush` as zlib's deflate is fed (call again
/// while input is left or the output filled), then finish.
fn run_all(c: &mut Compressor, s: &mut wd_comp::Stream, pieces: &[&[u8]], flush: Flush) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    for (i, p) in pieces.iter().enumerate() {
        let f = if i + 1 == pieces.len() {
            Flush::Finish
        } else {
            flush
        };
        let mut at = 0;
        loop {
            let st = c.stream_run(s, &p[at..], &mut buf, f).unwrap();
            at += st.consumed;
            out.extend_from_slice(&buf[..st.produced]);
            if st.end || (f != Flush::Finish && at == p.len() && st.produced < buf.len()) {
                break;
            }
            assert!(st.consumed + st.produced > 0, "no progress");
        }
    }
    out
}

/// A sync (or full) flush after a call's input longer than one request
/// carries: the device stream writes the codec's bytes (the client sent
/// the caller's flush with every 32 KiB: a flush mid-input, other bytes).
#[test]
fn a_flush_after_more_than_a_slot_of_input_is_the_codecs_stream() {
    let text = data(300_000, 41);
    let host = spawn_host("flush");
    let mut dev = Compressor::new(
        Some(HostConn::connect(&host.socket).unwrap()),
        offload_cfg(),
    );
    let mut cpu = cpu_compressor();
    for flush in [Flush::Sync, Flush::Full] {
        let p = plain_stream(Algorithm::Zlib, true, 6);
        let mut a = dev.open_stream(&p).unwrap();
        let mut b = cpu.open_stream(&p).unwrap();
        assert!(a.on_device() && !b.on_device());
        let pieces: Vec<&[u8]> = vec![&text[..200_000], &text[200_000..]];
        let za = run_all(&mut dev, &mut a, &pieces, flush);
        let zb = run_all(&mut cpu, &mut b, &pieces, flush);
        assert!(
            za == zb,
            "{flush:?}: device stream {} bytes, codec stream {} bytes: they differ",
            za.len(),
            zb.len()
        );
    }
}

/// zlib's contract for a sync flush: when the call returns with room left
/// in the output, all input was taken and everything so far is written
/// (ending on the empty stored block `00 00 ff ff`). A flush whose output
/// is longer than one request's room goes on in more requests (it
/// returned with the flush's end held back, and a caller that stopped
/// there, as zlib callers do, sent a message the peer could not finish).
#[test]
fn a_sync_flush_that_returns_with_room_left_has_written_everything() {
    let noise = wd_testutil::noise(32 << 10, 7);
    let host = spawn_host("syncroom");
    let mut dev = Compressor::new(
        Some(HostConn::connect(&host.socket).unwrap()),
        offload_cfg(),
    );
    let mut cpu = cpu_compressor();
    let p = plain_stream(Algorithm::Deflate, true, 6);
    for (name, c) in [("cpu", &mut cpu), ("device", &mut dev)] {
        let mut s = c.open_stream(&p).unwrap();
        let mut out = vec![0u8; 1 << 20];
        let st = c.stream_run(&mut s, &noise, &mut out, Flush::Sync).unwrap();
        assert_eq!(st.consumed, noise.len(), "{name}");
        assert!(st.produced < out.len(), "{name}");
        assert!(
            out[..st.produced].ends_with(&[0, 0, 0xff, 0xff]),
            "{name}: returned {} bytes with {} bytes of room left, the sync flush not written out",
            st.produced,
            out.len() - st.produced
        );
    }
}

fn decode_zlib(z: &[u8]) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut v = Vec::new();
    flate2::read::ZlibDecoder::new(z).read_to_end(&mut v)?;
    Ok(v)
}

fn run(c: &mut Compressor, s: &mut wd_comp::Stream, input: &[u8], flush: Flush, out: &mut Vec<u8>) {
    let mut buf = vec![0u8; 64 << 10];
    let mut at = 0;
    loop {
        let st = c.stream_run(s, &input[at..], &mut buf, flush).unwrap();
        at += st.consumed;
        out.extend_from_slice(&buf[..st.produced]);
        if st.end || (flush != Flush::Finish && at == input.len() && st.produced < buf.len()) {
            break;
        }
    }
}

/// An asynchronous request whose staging area the host refuses made the
/// compressor drop its synchronous queue too, with a device stream's
/// session on it; a second later a new queue on the same connection (same
/// epoch) gave a new stream a session with the same handle as the first
/// stream's old one (each queue's table starts alike), and the first
/// stream's next call ran in the second stream's session: both came out
/// wrong, with success. Now the synchronous queue stays, and a session is
/// bound to its lane, not only to the epoch.
#[test]
fn a_stream_whose_queue_was_dropped_never_runs_in_another_streams_session() {
    let host = spawn_limited_host("lost-lane");
    let socket = host.socket.clone();
    let mut c = Compressor::new(
        Some(HostConn::connect(&socket).unwrap()),
        Config {
            policy: Policy::Offload,
            threshold: 0,
            fallback: true,
            depth: 2,
            journal_limit: wd_comp::DEFAULT_JOURNAL_LIMIT,
            split_min: 0,
        },
    );
    let p = plain_stream(Algorithm::Zlib, true, 6);
    let a_in = data(100_000, 1);
    let b_in = data(100_000, 2);
    let mut a = c.open_stream(&p).unwrap();
    assert!(a.on_device());
    let mut za = Vec::new();
    run(&mut c, &mut a, &a_in[..50_000], Flush::Sync, &mut za);

    // A large started request: its staging area (32 MiB) passes the
    // host's limit; computed here, and the compressor's queues dropped.
    let big = data(4 << 20, 3);
    let mut out = vec![0u8; 12 << 20];
    let pend = c
        .start(Op::Compress(1), Algorithm::Gzip, &big, &mut out)
        .unwrap();
    assert!(pend.is_done(), "the started request went to the device");
    c.finish(pend, &mut out).unwrap();

    std::thread::sleep(wd_comp::RETRY_AFTER + Duration::from_millis(200));
    let mut b = c.open_stream(&p).unwrap();
    assert!(b.on_device(), "the second stream is on a new queue");
    let mut zb = Vec::new();
    run(&mut c, &mut b, &b_in[..50_000], Flush::Sync, &mut zb);

    run(&mut c, &mut a, &a_in[50_000..], Flush::Finish, &mut za);
    run(&mut c, &mut b, &b_in[50_000..], Flush::Finish, &mut zb);
    eprintln!("stats {:?} a.on_device={}", c.stats(), a.on_device());
    let back_a = decode_zlib(&za);
    let back_b = decode_zlib(&zb);
    assert!(
        back_a.as_ref().is_ok_and(|v| *v == a_in),
        "stream A came out wrong: {:?}",
        back_a.map(|v| v.len())
    );
    assert!(
        back_b.as_ref().is_ok_and(|v| *v == b_in),
        "stream B came out wrong: {:?}",
        back_b.map(|v| v.len())
    );
}

fn gunzip(z: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut v = Vec::new();
    flate2::read::GzDecoder::new(z).read_to_end(&mut v).unwrap();
    v
}

/// A small piece under the auto policy runs here (below `split_min`),
/// with a host whose queue was not asked for yet: it is no piece without
/// a queue (it was counted as a fallback, and refused with fallback off).
#[test]
fn a_small_piece_with_a_host_is_not_a_missing_queue() {
    let host = spawn_host("pieces-auto");
    let text = data(2000, 9);
    for fallback in [false, true] {
        let mut c = Compressor::new(
            Some(HostConn::connect(&host.socket).unwrap()),
            Config {
                fallback,
                ..Config::default()
            },
        );
        assert!(c.offloading(), "a queue is to be had");
        let mut c = Compressor::new(
            Some(HostConn::connect(&host.socket).unwrap()),
            Config {
                fallback,
                ..Config::default()
            },
        );
        let mut p = wd_comp::Pieces::default();
        let mut out = vec![0u8; 4096];
        let got = c.compress_piece(Algorithm::Gzip, 6, &mut p, &text, &mut out, true, true);
        let n = match got {
            Ok(n) => n,
            Err(e) => panic!("fallback {fallback}: {e:?}"),
        };
        assert_eq!(gunzip(&out[..n]), text);
        let s = c.stats();
        assert_eq!(
            s.cpu_fallback, 0,
            "fallback {fallback}: counted as no queue: {s:?}"
        );
    }
}

/// The threshold comes before the policy (rule 2 before rule 4): a piece
/// of 100 bytes under `offload` with a threshold of 4096 runs here (it
/// went to the device).
#[test]
fn a_piece_below_the_threshold_runs_here_under_offload() {
    let host = spawn_host("pieces-off");
    let mut c = Compressor::new(
        Some(HostConn::connect(&host.socket).unwrap()),
        Config {
            policy: Policy::Offload,
            threshold: 4096,
            ..Config::default()
        },
    );
    let text = data(100, 4);
    let mut p = wd_comp::Pieces::default();
    let mut out = vec![0u8; 4096];
    let n = c
        .compress_piece(Algorithm::Gzip, 6, &mut p, &text, &mut out, true, true)
        .unwrap();
    assert_eq!(gunzip(&out[..n]), text);
    let s = c.stats();
    assert_eq!((s.offloaded, s.cpu_threshold), (0, 1), "{s:?}");
}

/// A decompressing device stream given its whole input and little room a
/// call: each request carries about what the room takes, and the stream
/// comes out whole, as on the CPU.
#[test]
fn a_decompressing_stream_with_little_room_a_call_comes_out_whole() {
    let text = data(3 << 20, 17);
    let host = spawn_host("inflate-room");
    let mut dev = Compressor::new(
        Some(HostConn::connect(&host.socket).unwrap()),
        offload_cfg(),
    );
    let z = dev
        .compress_blocks(Algorithm::Zlib, 6, &[&text[..]])
        .unwrap()
        .remove(0);
    let p = plain_stream(Algorithm::Zlib, false, 0);
    let mut s = dev.open_stream(&p).unwrap();
    assert!(s.on_device());
    let mut back = Vec::new();
    let mut buf = vec![0u8; 8 << 10];
    let mut at = 0;
    loop {
        let st = dev
            .stream_run(&mut s, &z[at..], &mut buf, Flush::None)
            .unwrap();
        at += st.consumed;
        back.extend_from_slice(&buf[..st.produced]);
        if st.end {
            break;
        }
        assert!(st.consumed + st.produced > 0, "no progress at {at}");
    }
    assert_eq!(at, z.len());
    assert!(back == text, "{} bytes back of {}", back.len(), text.len());
}

/// A compressor on a limited host (offload, no fallback, depth 16) that
/// ran a batch of 16 blocks: its staging area has 16 slots.
fn after_a_batch_of_16(host: &HostProc) -> Compressor {
    let mut c = Compressor::new(
        Some(HostConn::connect(&host.socket).unwrap()),
        Config {
            depth: 16,
            ..offload_cfg()
        },
    );
    let blocks: Vec<Vec<u8>> = (0..16).map(|i| data(4096, i)).collect();
    let inputs: Vec<&[u8]> = blocks.iter().map(|b| b.as_slice()).collect();
    let mut outs_v: Vec<Vec<u8>> = (0..16).map(|_| vec![0u8; 8192]).collect();
    let mut outs: Vec<&mut [u8]> = outs_v.iter_mut().map(|o| o.as_mut_slice()).collect();
    c.compress_into(Algorithm::Gzip, 6, &inputs, &mut outs)
        .unwrap();
    assert_eq!(c.stats().offloaded, 16, "{:?}", c.stats());
    c
}

/// A stream call and a piece after a batch: the staging area grows to
/// what the request needs in all, not to that much per batch slot (a
/// stream call with 4 MiB of room asked a host limited to 16 MiB for 128
/// MiB, a 1 MiB piece for 64 MiB, and failed).
#[test]
fn a_stream_call_or_a_piece_after_a_batch_fits_a_limited_host() {
    let host = spawn_limited_host("stream-stage");
    let mut c = after_a_batch_of_16(&host);
    let mut s = c
        .open_stream(&plain_stream(Algorithm::Zlib, true, 6))
        .unwrap();
    assert!(s.on_device());
    let text = data(64 << 10, 3);
    let mut out = vec![0u8; 4 << 20];
    let st = c
        .stream_run(&mut s, &text, &mut out, Flush::Finish)
        .unwrap();
    assert!(st.end && st.consumed == text.len(), "{st:?}");
    let mut c = after_a_batch_of_16(&host);
    let text = data(1 << 20, 5);
    let mut out = vec![0u8; 2 << 20];
    let mut p = wd_comp::Pieces::default();
    let n = c
        .compress_piece(Algorithm::Gzip, 6, &mut p, &text, &mut out, true, true)
        .unwrap();
    assert_eq!(reference_decode(Algorithm::Gzip, &out[..n]), text);
}

/// Without fallback, a started request whose staging area the host
/// refuses fails, never computed here (it was, and counted as a host gone).
#[test]
fn a_started_request_the_host_cannot_stage_fails_without_fallback() {
    let host = spawn_limited_host("start-refused");
    let mut c = Compressor::new(
        Some(HostConn::connect(&host.socket).unwrap()),
        offload_cfg(),
    );
    let big = data(4 << 20, 3);
    let mut out = vec![0u8; 12 << 20];
    match c.start(Op::Compress(1), Algorithm::Gzip, &big, &mut out) {
        Err(CompError::NoQueue(why)) => assert!(why.contains("mapped_bytes"), "{why}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("computed here with fallback off: {:?}", c.stats()),
    }
    assert_eq!(c.stats().cpu_fallback, 0, "{:?}", c.stats());
}
