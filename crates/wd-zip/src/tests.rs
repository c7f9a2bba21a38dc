use super::*;
use msg::{Algorithm, Flush, SessionFree, DEFAULT_LEVEL};
use wd_testutil::dma::FlatMemory;

const BASE: u64 = 0x10_0000;
const SRC: u64 = BASE;
const DST: u64 = BASE + (4 << 20);
const BACK: u64 = BASE + (8 << 20);

fn queue() -> (ZipQueue, FlatMemory, Arc<AtomicU64>) {
    let live = Arc::new(AtomicU64::new(0));
    (
        ZipQueue::new(live.clone()),
        FlatMemory::new(BASE, 12 << 20),
        live,
    )
}

fn run(q: &mut ZipQueue, mem: &mut FlatMemory, d: Desc) -> (i32, u64) {
    let mut d = d;
    q.process(&mut d, mem);
    (d.status, d.result)
}

fn text(n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| b"the queue and its domain "[i % 25] ^ (i / 1000) as u8)
        .collect()
}

fn shot(
    compress: bool,
    alg: Algorithm,
    src: u64,
    src_len: usize,
    dst: u64,
    dst_len: usize,
) -> Desc {
    OneShot {
        compress,
        alg,
        level: if compress { DEFAULT_LEVEL } else { 0 },
        max_ratio: 0,
        src,
        src_len: src_len as u64,
        dst,
        dst_len: dst_len as u64,
        piece: false,
    }
    .to_desc(1)
}

/// In place (memory mapped as one range) and through host buffers.
#[test]
fn one_shot_round_trips_through_client_memory() {
    for in_place in [true, false] {
        round_trips(in_place);
    }
}

fn round_trips(in_place: bool) {
    let (mut q, mut mem, _) = queue();
    mem.set_slices(in_place);
    let data = text(200_000);
    mem.put(SRC, &data);
    for alg in Algorithm::ALL {
        let (st, r) = run(
            &mut q,
            &mut mem,
            shot(true, alg, SRC, data.len(), DST, 4 << 20),
        );
        assert_eq!(st, 0, "{alg}");
        let c = Done::from_result(r);
        assert!(c.end && c.consumed == data.len() as u64 && c.produced < data.len() as u64);
        let (st, r) = run(
            &mut q,
            &mut mem,
            shot(false, alg, DST, c.produced as usize, BACK, data.len()),
        );
        assert_eq!(st, 0, "{alg}");
        let d = Done::from_result(r);
        assert_eq!((d.produced, d.consumed), (data.len() as u64, c.produced));
        assert!(mem.get(BACK, data.len()) == data, "{alg}");
    }
}

#[test]
fn bad_requests_complete_with_clear_statuses() {
    let (mut q, mut mem, _) = queue();
    let data = text(10_000);
    mem.put(SRC, &data);
    // Source outside shared memory.
    assert_eq!(
        run(
            &mut q,
            &mut mem,
            shot(true, Algorithm::Gzip, 0x1000, 100, DST, 1000)
        )
        .0,
        status::EFAULT
    );
    // Destination runs past the end.
    let (st, _) = run(
        &mut q,
        &mut mem,
        shot(
            true,
            Algorithm::Gzip,
            SRC,
            10_000,
            BASE + (12 << 20) - 10,
            1000,
        ),
    );
    assert_eq!(st, status::EFAULT);
    // Too little room.
    assert_eq!(
        run(
            &mut q,
            &mut mem,
            shot(true, Algorithm::Zstd, SRC, 10_000, DST, 8)
        )
        .0,
        status::ENOBUFS
    );
    // Not compressed data.
    assert_eq!(
        run(
            &mut q,
            &mut mem,
            shot(false, Algorithm::Zlib, SRC, 10_000, DST, 1 << 20)
        )
        .0,
        status::EBADMSG
    );
    // A bomb stopped by its ratio limit.
    mem.put(SRC, &vec![0; 1 << 20]);
    let (st, r) = run(
        &mut q,
        &mut mem,
        shot(true, Algorithm::Deflate, SRC, 1 << 20, DST, 1 << 20),
    );
    assert_eq!(st, 0);
    let mut bomb = shot(
        false,
        Algorithm::Deflate,
        DST,
        Done::from_result(r).produced as usize,
        BACK,
        1 << 20,
    );
    bomb.payload[34] = 10;
    assert_eq!(run(&mut q, &mut mem, bomb).0, status::EOVERFLOW);
    // Malformed descriptors and unknown sessions.
    let mut d = shot(true, Algorithm::Zlib, SRC, 10, DST, 100);
    d.payload[80] = 1;
    assert_eq!(run(&mut q, &mut mem, d).0, status::EINVAL);
    let op = StreamOp {
        session: 12345,
        flush: Flush::None,
        src: SRC,
        src_len: 1,
        dst: DST,
        dst_len: 1,
    };
    assert_eq!(run(&mut q, &mut mem, op.to_desc(1)).0, status::ENOENT);
    assert_eq!(
        run(&mut q, &mut mem, SessionFree { session: 7 }.to_desc(1)).0,
        status::ENOENT
    );
}

#[test]
fn streams_carry_state_across_requests_and_sessions_are_counted() {
    let (mut q, mut mem, live) = queue();
    let data = text(100_000);
    mem.put(SRC, &data);
    let new = |compress| SessionNew {
        alg: Algorithm::Gzip,
        level: if compress { 6 } else { 0 },
        compress,
        window_bits: 0,
        dict: 0,
        dict_len: 0,
    };
    let (st, c) = run(&mut q, &mut mem, new(true).to_desc(1));
    assert_eq!(st, 0);
    let (st, dsess) = run(&mut q, &mut mem, new(false).to_desc(1));
    assert_eq!(st, 0);
    assert_eq!(live.load(Ordering::Relaxed), 2);
    // Compress in 7 pieces with small output room, then decompress the
    // result through the other session in 3 KiB pieces.
    let (mut at, mut out) = (0u64, 0u64);
    let piece = data.len() as u64 / 7 + 1;
    loop {
        let end = (at + piece).min(data.len() as u64);
        let flush = if end == data.len() as u64 {
            Flush::Finish
        } else {
            Flush::Sync
        };
        let op = StreamOp {
            session: c,
            flush,
            src: SRC + at,
            src_len: end - at,
            dst: DST + out,
            dst_len: 4096,
        };
        let (st, r) = run(&mut q, &mut mem, op.to_desc(1));
        assert_eq!(st, 0);
        let d = Done::from_result(r);
        at += d.consumed;
        out += d.produced;
        if d.end {
            break;
        }
    }
    let (mut cin, mut made) = (0u64, 0u64);
    loop {
        let op = StreamOp {
            session: dsess,
            flush: Flush::None,
            src: DST + cin,
            src_len: (out - cin).min(3072),
            dst: BACK + made,
            dst_len: 10_000,
        };
        let (st, r) = run(&mut q, &mut mem, op.to_desc(1));
        assert_eq!(st, 0);
        let d = Done::from_result(r);
        cin += d.consumed;
        made += d.produced;
        if d.end {
            break;
        }
        assert!(d.consumed + d.produced > 0, "no progress");
    }
    assert_eq!((cin, made), (out, data.len() as u64));
    assert!(mem.get(BACK, data.len()) == data);
    assert_eq!(
        run(&mut q, &mut mem, SessionFree { session: c }.to_desc(1)).0,
        0
    );
    assert_eq!(live.load(Ordering::Relaxed), 1);
    drop(q);
    assert_eq!(
        live.load(Ordering::Relaxed),
        0,
        "a queue's sessions end with it"
    );
}

/// A stream step whose output faults leaves its session as it was: in a
/// domain with the stall policy the engine runs the same request again
/// once the fault is resolved, and a session that had already taken the
/// input would take it twice (a compressor's stream would silently lose
/// the first step's output).
#[test]
fn a_stream_step_that_faults_takes_nothing() {
    for in_place in [true, false] {
        for alg in [Algorithm::Gzip, Algorithm::Zstd] {
            let (mut q, mut mem, _) = queue();
            mem.set_slices(in_place);
            let data = text(50_000);
            mem.put(SRC, &data);
            let new = |compress| SessionNew {
                alg,
                level: if compress { 3 } else { 0 },
                compress,
                window_bits: 0,
                dict: 0,
                dict_len: 0,
            };
            let (_, c) = run(&mut q, &mut mem, new(true).to_desc(1));
            let step = |dst| StreamOp {
                session: c,
                flush: Flush::Finish,
                src: SRC,
                src_len: data.len() as u64,
                dst,
                dst_len: 1 << 20,
            };
            // Room that ends past the client's memory: nothing written yet.
            let (st, _) = run(&mut q, &mut mem, step(BASE + (12 << 20) - 4096).to_desc(1));
            assert_eq!(st, status::EFAULT, "{alg} in place {in_place}");
            // The same request again, as a stall's retry would send it.
            let (st, r) = run(&mut q, &mut mem, step(DST).to_desc(1));
            assert_eq!(st, 0, "{alg}");
            let d = Done::from_result(r);
            assert!(d.end && d.consumed == data.len() as u64, "{alg}: {d:?}");
            let (st, r) = run(
                &mut q,
                &mut mem,
                shot(false, alg, DST, d.produced as usize, BACK, data.len()),
            );
            assert_eq!(st, 0, "{alg} in place {in_place}: the stream decodes");
            assert_eq!(Done::from_result(r).produced, data.len() as u64);
            assert!(mem.get(BACK, data.len()) == data, "{alg}");
        }
    }
}

/// Open zstd level 19 compression sessions until the queue's memory
/// budget refuses one (-ENOSPC, before the table's bound): their handles.
fn fill_with_zstd_streams(q: &mut ZipQueue, mem: &mut FlatMemory) -> Vec<u64> {
    let s = SessionNew {
        alg: Algorithm::Zstd,
        level: 19,
        compress: true,
        window_bits: 0,
        dict: 0,
        dict_len: 0,
    };
    let mut handles = Vec::new();
    loop {
        let (st, h) = run(q, mem, s.to_desc(1));
        if st != 0 {
            assert_eq!(st, status::ENOSPC);
            return handles;
        }
        handles.push(h);
        assert!(handles.len() < MAX_SESSIONS, "no bound below the table's");
    }
}

/// Sessions are bounded by memory as well as by number: zstd streams at
/// a high level take tens of MiB each, which a client could otherwise
/// make the host allocate 64 times per queue.
#[test]
fn session_memory_is_bounded() {
    let (mut q, mut mem, _) = queue();
    let handles = fill_with_zstd_streams(&mut q, &mut mem);
    assert!(!handles.is_empty(), "one high-level zstd stream fits");
    assert!(q.held <= SESSION_MEMORY);
    // Freed, its memory is for a new one; deflate streams still fit.
    let free = SessionFree {
        session: handles[0],
    }
    .to_desc(1);
    assert_eq!(run(&mut q, &mut mem, free).0, 0);
    open(&mut q, &mut mem, Algorithm::Zstd, 19, true);
    open(&mut q, &mut mem, Algorithm::Zlib, 6, true);
}

#[test]
fn session_table_is_bounded() {
    let (mut q, mut mem, _) = queue();
    let s = SessionNew {
        alg: Algorithm::Zlib,
        level: 1,
        compress: true,
        window_bits: 0,
        dict: 0,
        dict_len: 0,
    };
    for _ in 0..MAX_SESSIONS {
        assert_eq!(run(&mut q, &mut mem, s.to_desc(1)).0, 0);
    }
    assert_eq!(run(&mut q, &mut mem, s.to_desc(1)).0, status::ENOSPC);
    assert_eq!(q.session_count(), MAX_SESSIONS);
}

/// Found by fuzzing: a compression whose output overlaps its input (the
/// engines copy with memcpy) runs through host buffers and still gives a
/// valid stream of the input as it was.
#[test]
fn overlapping_input_and_output_are_safe() {
    let (mut q, mut mem, _) = queue();
    let data = text(5000);
    for alg in [Algorithm::Deflate, Algorithm::Zstd] {
        mem.put(SRC, &data);
        let (st, r) = run(
            &mut q,
            &mut mem,
            shot(true, alg, SRC, data.len(), SRC + 5, 8000),
        );
        assert_eq!(st, 0, "{alg}");
        let c = Done::from_result(r);
        let (st, _) = run(
            &mut q,
            &mut mem,
            shot(false, alg, SRC + 5, c.produced as usize, BACK, data.len()),
        );
        assert_eq!(st, 0, "{alg}");
        assert!(mem.get(BACK, data.len()) == data, "{alg}");
    }
}

/// Pieces of one deflate stream, compressed by two requests, join into
/// a stream that decodes to the whole input; the first piece's end does
/// not end the stream.
#[test]
fn pieces_of_a_stream_join() {
    for in_place in [true, false] {
        let (mut q, mut mem, _) = queue();
        mem.set_slices(in_place);
        let data = text(150_000);
        mem.put(SRC, &data);
        let cut = 70_000;
        let piece = |src: u64, len: usize, dst: u64, piece: bool| {
            OneShot {
                compress: true,
                alg: Algorithm::Deflate,
                level: 1,
                max_ratio: 0,
                src,
                src_len: len as u64,
                dst,
                dst_len: 1 << 20,
                piece,
            }
            .to_desc(3)
        };
        let (st, r) = run(&mut q, &mut mem, piece(SRC, cut, DST, true));
        assert_eq!(st, 0);
        let a = Done::from_result(r);
        assert!(!a.end && a.consumed == cut as u64);
        let b_at = DST + a.produced;
        let (st, r) = run(
            &mut q,
            &mut mem,
            piece(SRC + cut as u64, data.len() - cut, b_at, false),
        );
        assert_eq!(st, 0);
        let b = Done::from_result(r);
        let joined = (a.produced + b.produced) as usize;
        let (st, r) = run(
            &mut q,
            &mut mem,
            shot(false, Algorithm::Deflate, DST, joined, BACK, data.len()),
        );
        assert_eq!(st, 0, "in place {in_place}");
        assert_eq!(Done::from_result(r).produced, data.len() as u64);
        assert!(mem.get(BACK, data.len()) == data);
        // Too little room for a piece is the usual status.
        let mut d = piece(SRC, cut, DST, true);
        d.set_payload_u64(24, 100);
        assert_eq!(run(&mut q, &mut mem, d).0, status::ENOBUFS);
        // An empty piece ends with the flush point's marker.
        let (st, r) = run(&mut q, &mut mem, piece(SRC, 0, DST, true));
        let n = Done::from_result(r).produced;
        assert_eq!(st, 0);
        assert_eq!(mem.get(DST + n - 4, 4), [0, 0, 0xff, 0xff]);
    }
}

/// Memory for requests longer than one part: input at `SRC`, output at
/// `LONG_DST`, decoded at `LONG_BACK`.
const LONG: usize = (3 << 20) + 12_345;
const LONG_DST: u64 = BASE + (8 << 20);
const LONG_BACK: u64 = BASE + (16 << 20);
const LONG_MEM: usize = 24 << 20;

fn long_queue() -> (ZipQueue, FlatMemory) {
    (
        ZipQueue::new(Arc::new(AtomicU64::new(0))),
        FlatMemory::new(BASE, LONG_MEM),
    )
}

/// A session of `alg` on `q`, compressing at `level` or decompressing:
/// its handle.
fn open(q: &mut ZipQueue, mem: &mut FlatMemory, alg: Algorithm, level: i8, compress: bool) -> u64 {
    let new = SessionNew {
        alg,
        level,
        compress,
        window_bits: 0,
        dict: 0,
        dict_len: 0,
    };
    let (st, handle) = run(q, mem, new.to_desc(1));
    assert_eq!(st, 0, "{alg} session");
    handle
}

/// What the queue holds: its sessions and the cut in progress.
fn held(q: &ZipQueue) -> usize {
    q.held + q.cut.as_ref().map_or(0, |c| c.footprint)
}

/// Run `d` as the engine does with a small pass budget: a part per call,
/// `done` carried from call to call. The status, result and calls made.
fn run_parts(q: &mut ZipQueue, mem: &mut dyn wd_device::Dma<'_>, d: Desc) -> (i32, u64, usize) {
    run_parts_from(q, mem, d, 0)
}

/// As [`run_parts`], from where a part left it (`done`).
fn run_parts_from(
    q: &mut ZipQueue,
    mem: &mut dyn wd_device::Dma<'_>,
    d: Desc,
    mut done: u64,
) -> (i32, u64, usize) {
    let mut calls = 0;
    loop {
        let mut x = d;
        calls += 1;
        match q.process_part(&mut x, mem, done, 1) {
            Progress::More(n) => {
                // Parts take input; a decompressing part may only write
                // what the one before could not.
                assert!(n > 0 && n >= done, "{n} after {done}");
                done = n;
            }
            Progress::Done => return (x.status, x.result, calls),
        }
    }
}

/// Input that compresses about 2:1, so that its streams are long too.
fn noisy(n: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if i % 2 == 0 {
                x as u8
            } else {
                b"queue"[i % 5]
            }
        })
        .collect()
}

fn decodes_to(q: &mut ZipQueue, mem: &mut FlatMemory, alg: Algorithm, len: u64, data: &[u8]) {
    let (st, r) = run(
        q,
        mem,
        shot(false, alg, LONG_DST, len as usize, LONG_BACK, data.len()),
    );
    assert_eq!(st, 0, "{alg}");
    assert_eq!(Done::from_result(r).produced, data.len() as u64, "{alg}");
    assert!(mem.get(LONG_BACK, data.len()) == data, "{alg}");
}

/// A long compression is served a part per engine pass (a zstd level 19
/// or libdeflate level 12 compression of 64 MiB is seconds of work, which
/// every other queue would wait behind), and its stream is the same
/// wherever the passes fall; the fastest levels are not cut.
#[test]
fn long_compressions_run_a_part_per_pass() {
    let data = text(LONG);
    for (alg, level, part) in [
        (Algorithm::Deflate, 4, 1 << 20),
        (Algorithm::Zlib, 6, 1 << 20),
        (Algorithm::Gzip, 12, 256 << 10),
        (Algorithm::Zstd, 9, 128 << 10),
        // The fastest levels run whole.
        (Algorithm::Deflate, 1, LONG),
        (Algorithm::Zstd, 3, LONG),
    ] {
        let (mut q, mut mem) = long_queue();
        mem.put(SRC, &data);
        let d = OneShot {
            compress: true,
            alg,
            level,
            max_ratio: 0,
            src: SRC,
            src_len: LONG as u64,
            dst: LONG_DST,
            dst_len: 4 << 20,
            piece: false,
        }
        .to_desc(1);
        let (st, r, calls) = run_parts(&mut q, &mut mem, d);
        assert_eq!(st, 0, "{alg} {level}");
        assert_eq!(calls, LONG.div_ceil(part), "{alg} {level}");
        let c = Done::from_result(r);
        assert!(c.end && c.consumed == LONG as u64, "{alg}: {c:?}");
        decodes_to(&mut q, &mut mem, alg, c.produced, &data);
        let first = mem.get(LONG_DST, c.produced as usize);
        let (st, r, _) = run_parts(&mut q, &mut mem, d);
        assert_eq!((st, Done::from_result(r).produced), (0, c.produced));
        assert!(mem.get(LONG_DST, c.produced as usize) == first, "{alg}");
    }
    // LZ4 and decompression run whole.
    let (mut q, mut mem) = long_queue();
    mem.put(SRC, &data);
    let d = shot(true, Algorithm::Lz4, SRC, LONG, LONG_DST, 4 << 20);
    let (st, r, calls) = run_parts(&mut q, &mut mem, d);
    assert_eq!((st, calls), (0, 1));
    let n = Done::from_result(r).produced as usize;
    let d = shot(false, Algorithm::Lz4, LONG_DST, n, LONG_BACK, LONG);
    assert_eq!(run_parts(&mut q, &mut mem, d).2, 1);
}

/// Bytes of a long stream's data, where the stream is, and where it is
/// decoded to, in 32 MiB of memory ([`long_stream`]).
const LEN: usize = 9 << 20;
const Z: u64 = BASE + (10 << 20);
const OUT: u64 = BASE + (20 << 20);

/// A new queue and its memory, with `data` ([`LEN`] bytes) compressed by
/// `alg` at [`Z`]: the stream's length.
fn long_stream(alg: Algorithm, data: &[u8]) -> (ZipQueue, FlatMemory, usize) {
    let (mut q, mut mem) = (
        ZipQueue::new(Arc::new(AtomicU64::new(0))),
        FlatMemory::new(BASE, 32 << 20),
    );
    mem.put(SRC, data);
    let (st, r) = run(&mut q, &mut mem, shot(true, alg, SRC, LEN, Z, 10 << 20));
    assert_eq!(st, 0, "{alg}");
    let n = Done::from_result(r).produced as usize;
    (q, mem, n)
}

/// A long decompression is served a part per engine pass too (64 MiB of
/// output is 60 to 120 ms of one engine), with the result of the request
/// run whole, the memory it holds between parts given back at its end; a
/// short one runs whole.
#[test]
fn long_decompressions_run_a_part_per_pass() {
    let data = noisy(LEN);
    for alg in Algorithm::ALL {
        let (mut q, mut mem, n) = long_stream(alg, &data);
        // Whole (a room of one part), then cut (a larger room).
        let whole = shot(false, alg, Z, n, OUT, LEN);
        let (st, _, calls) = run_parts(&mut q, &mut mem, shot(false, alg, Z, n, OUT, 4 << 20));
        assert_eq!((st, calls), (status::ENOBUFS, 1), "{alg}");
        let (st, r_whole) = run(&mut q, &mut mem, whole);
        assert_eq!(st, 0, "{alg}");
        mem.put(OUT, &vec![0; LEN]);
        let d = shot(false, alg, Z, n, OUT, 12 << 20);
        let mut x = d;
        let Progress::More(done) = q.process_part(&mut x, &mut mem, 0, 1) else {
            panic!("{alg}: cut")
        };
        assert!(held(&q) >= n, "{alg}: the input is held");
        let (st, r, calls) = run_parts_from(&mut q, &mut mem, d, done);
        assert_eq!((st, r), (0, r_whole), "{alg}");
        assert!(calls >= 2, "{alg}: {calls}");
        assert!(mem.get(OUT, LEN) == data, "{alg}");
        assert_eq!(held(&q), 0, "{alg}");
    }
}

/// zstd's cut decompression decodes into the client's room in place when
/// that is one mapping, else into a buffer of its own: the same result
/// either way; output memory that is unshared, or no longer one mapping,
/// after parts were written in place ends the decoding (its history was
/// there) with -EFAULT, the fault recorded where there is one (a stall
/// then starts the request over).
#[test]
fn a_cut_zstd_decompression_keeps_its_output_in_place() {
    let data = noisy(LEN);
    let (mut q, mut mem, n) = long_stream(Algorithm::Zstd, &data);
    let d = shot(false, Algorithm::Zstd, Z, n, OUT, 12 << 20);
    let (st, r_whole) = run(&mut q, &mut mem, d);
    assert_eq!(st, 0);
    for slices in [true, false] {
        mem.put(OUT, &vec![0; LEN]);
        mem.set_slices(slices);
        let (st, r, calls) = run_parts(&mut q, &mut mem, d);
        assert_eq!((st, r), (0, r_whole), "slices {slices}");
        assert!(calls >= 2 && mem.get(OUT, LEN) == data, "slices {slices}");
    }
    mem.set_slices(true);
    // Parts written in place, then the room changes under the request.
    for hole in [true, false] {
        mem.put(OUT, &vec![0; LEN]);
        let done = until_output_began(&mut q, &mut mem, d);
        match hole {
            true => mem.set_hole(Some((OUT + (4 << 20), OUT + (5 << 20)))),
            false => mem.set_slices(false),
        }
        let mut probe = Recorder {
            mem: &mut mem,
            room_elsewhere: None,
            fault: None,
        };
        let (st, _, _) = run_parts_from(&mut q, &mut probe, d, done);
        assert_eq!(st, status::EFAULT, "hole {hole}");
        assert_eq!(
            probe.fault.is_some(),
            hole,
            "a fault recorded where there is one"
        );
        assert_eq!(held(&q), 0);
        mem.set_hole(None);
        mem.set_slices(true);
    }
}

/// Run parts of decompression `d` into [`OUT`] (zeroed) until it has
/// written there: how far it got.
fn until_output_began(q: &mut ZipQueue, mem: &mut FlatMemory, d: Desc) -> u64 {
    let (mut x, mut done) = (d, 0);
    while mem.get(OUT, 2 << 20).iter().all(|&b| b == 0) {
        let Progress::More(upto) = q.process_part(&mut x, mem, done, 1) else {
            panic!("ended before its output began")
        };
        done = upto;
    }
    done
}

/// A room written in place that the domain maps to other memory before a
/// later part (one mapping still, at another host address) ends the
/// decoding with -EFAULT and no fault: the decoder's history is in the
/// memory it wrote, which the room no longer is.
#[test]
fn a_cut_zstd_decompression_refuses_a_room_mapped_elsewhere() {
    let data = noisy(LEN);
    let (mut q, mut mem, n) = long_stream(Algorithm::Zstd, &data);
    let d = shot(false, Algorithm::Zstd, Z, n, OUT, 12 << 20);
    let done = until_output_began(&mut q, &mut mem, d);
    let mut other = FlatMemory::new(BASE, 32 << 20);
    let mut moved = Recorder {
        mem: &mut mem,
        room_elsewhere: Some(&mut other),
        fault: None,
    };
    let (st, _, calls) = run_parts_from(&mut q, &mut moved, d, done);
    assert_eq!((st, calls), (status::EFAULT, 1));
    assert!(moved.fault.is_none(), "the room is mapped: no fault");
    assert!(other.get(OUT, LEN).iter().all(|&b| b == 0), "not written");
    assert_eq!(held(&q), 0);
}

/// A cut decompression fails as the whole one does: damaged input, output
/// memory that fails in a later part (after earlier parts wrote), a ratio
/// limit, a room one byte short.
#[test]
fn a_cut_decompression_fails_as_the_whole_one() {
    let data = noisy(LEN);
    for alg in Algorithm::ALL {
        let (mut q, mut mem, n) = long_stream(alg, &data);
        let ask = |dst: u64, room: usize, max_ratio: u16| {
            OneShot {
                compress: false,
                alg,
                level: 0,
                max_ratio,
                src: Z,
                src_len: n as u64,
                dst,
                dst_len: room as u64,
                piece: false,
            }
            .to_desc(1)
        };
        // The output runs past the end of memory, 6 MiB on; a ratio limit
        // the stream passes; a room one byte short.
        let end = BASE + (32 << 20) - (6 << 20);
        let mut cases = vec![
            (ask(end, 12 << 20, 0), status::EFAULT),
            // (LZ4 does not shrink this data.)
            (
                ask(OUT, 12 << 20, 1),
                if n < LEN { status::EOVERFLOW } else { 0 },
            ),
            (ask(OUT, LEN - 1, 0), status::ENOBUFS),
        ];
        // Damage in the middle (a stream without a check value may decode
        // it to other bytes).
        let mut z = mem.get(Z, n);
        z[n / 2] ^= 0x55;
        let damaged = ask(OUT, 12 << 20, 0);
        for (d, want) in cases.drain(..) {
            let (whole, _) = run(&mut q, &mut mem, d);
            let (st, _, calls) = run_parts(&mut q, &mut mem, d);
            assert_eq!((whole, st), (want, want), "{alg}");
            // (A zstd frame that names a size past the room fails at once.)
            assert!(calls >= 2 || want != status::EFAULT, "{alg}: {calls}");
            assert_eq!(held(&q), 0, "{alg}");
        }
        mem.put(Z, &z);
        let (whole, r_whole) = run(&mut q, &mut mem, damaged);
        let (st, r, _) = run_parts(&mut q, &mut mem, damaged);
        assert_eq!((st, r), (whole, r_whole), "{alg}");
        if matches!(alg, Algorithm::Zlib | Algorithm::Gzip) {
            assert_eq!(st, status::EBADMSG, "{alg}");
        }
    }
}

/// A zstd bomb (16 MiB of zeros is a few hundred bytes of RLE blocks) is
/// served a part per pass too: its parts are bounded by their output,
/// not only by the input they take.
#[test]
fn a_zstd_bomb_is_decompressed_a_part_per_pass() {
    const LEN: usize = 16 << 20;
    const OUT: u64 = BASE + (4 << 20);
    let zeros = vec![0u8; LEN];
    let mut z = vec![0u8; compress_bound(Algorithm::Zstd, LEN)];
    let n = Engine::new()
        .compress(Algorithm::Zstd, 1, &zeros[..], &mut z[..])
        .unwrap();
    let (mut q, mut mem) = (
        ZipQueue::new(Arc::new(AtomicU64::new(0))),
        FlatMemory::new(BASE, 24 << 20),
    );
    mem.put(SRC, &z[..n]);
    let (st, r, calls) = run_parts(
        &mut q,
        &mut mem,
        shot(false, Algorithm::Zstd, SRC, n, OUT, LEN),
    );
    assert_eq!(st, 0);
    assert_eq!(Done::from_result(r).produced, LEN as u64);
    assert!(calls >= LEN / (2 << 20), "{calls} calls");
    assert!(mem.get(OUT, LEN) == zeros);
}

/// A decompression that may make the most output a request may is cut
/// whatever its input's length and the queue's sessions: a client must
/// not get a long request run whole (tens of milliseconds of the engine)
/// by asking for it with the longest input. A zstd cut holds its input
/// and its room (64 + 64 MiB and the decoder's state, past
/// SESSION_MEMORY), and one that did not fit beside the sessions ran
/// whole: a client filling its own queue's budget with sessions got every
/// decompression run whole the same way.
#[test]
fn the_longest_decompression_is_cut_whatever_its_input() {
    const MAX: usize = 64 << 20;
    let zeros = vec![0u8; 16 << 20];
    let mut z = vec![0u8; compress_bound(Algorithm::Zstd, zeros.len())];
    let n = Engine::new()
        .compress(Algorithm::Zstd, 1, &zeros[..], &mut z[..])
        .unwrap();
    z.truncate(n);
    // Padded to the longest input with a skippable frame.
    z.extend_from_slice(&[0x50, 0x2a, 0x4d, 0x18]);
    z.extend_from_slice(&((MAX - n - 8) as u32).to_le_bytes());
    z.resize(MAX, 0);
    let (mut q, mut mem) = (
        ZipQueue::new(Arc::new(AtomicU64::new(0))),
        FlatMemory::new(BASE, 2 * MAX),
    );
    mem.put(BASE, &z);
    let d = shot(false, Algorithm::Zstd, BASE, MAX, BASE + MAX as u64, MAX);
    let mut x = d;
    assert!(
        matches!(q.process_part(&mut x, &mut mem, 0, 1), Progress::More(_)),
        "run whole: {}",
        x.status
    );
    // And with the queue's session budget all but spent.
    let (mut q, _) = long_queue();
    while q.held < SESSION_MEMORY - (58 << 20) {
        open(&mut q, &mut mem, Algorithm::Zstd, 19, true);
    }
    let mut x = d;
    assert!(
        matches!(q.process_part(&mut x, &mut mem, 0, 1), Progress::More(_)),
        "run whole beside sessions: {}",
        x.status
    );
}

/// A cut decompression checks its whole input in its first part, as the
/// request run whole reads it all first: input memory that fails past
/// the first part's copy fails the first part (which a stall may park and
/// retry from the start), not a later one.
#[test]
fn a_cut_decompression_faults_on_its_input_in_its_first_part() {
    let data = noisy(12 << 20);
    for alg in Algorithm::ALL {
        let (mut q, mut mem) = (
            ZipQueue::new(Arc::new(AtomicU64::new(0))),
            FlatMemory::new(BASE, 24 << 20),
        );
        // Input running 1 MiB past the end of memory, 6 MiB long.
        let src = BASE + (19 << 20);
        mem.put(src, &data[..5 << 20]);
        let d = shot(false, alg, src, 6 << 20, SRC, 12 << 20);
        let (whole, _) = run(&mut q, &mut mem, d);
        assert_eq!(whole, status::EFAULT, "{alg}");
        let mut x = d;
        assert_eq!(
            q.process_part(&mut x, &mut mem, 0, 1),
            Progress::Done,
            "{alg}"
        );
        assert_eq!(x.status, status::EFAULT, "{alg}");
        assert_eq!(held(&q), 0, "{alg}");
    }
}

/// The engine continues a cut request before any other of its queue; a
/// request that is not cut may still come between parts (the device must
/// not mind), and a new long request abandons the cut. A continuation the
/// device does not know fails, rather than running on another request's
/// state.
#[test]
fn a_continuation_is_checked_and_a_new_cut_ends_the_old() {
    let data = noisy(LONG);
    let (mut q, mut mem) = long_queue();
    mem.put(SRC, &data);
    // Gzip at the default level, 6: cut.
    let d = shot(true, Algorithm::Gzip, SRC, LONG, LONG_DST, 8 << 20);
    let mut x = d;
    let Progress::More(done) = q.process_part(&mut x, &mut mem, 0, 1) else {
        panic!("a long request is cut")
    };
    let small = shot(true, Algorithm::Zstd, SRC, 1000, BASE + (20 << 20), 4096);
    let mut s = small;
    assert_eq!(q.process_part(&mut s, &mut mem, 0, 1), Progress::Done);
    assert_eq!(s.status, 0);
    // Not the request being cut, or not where it stopped.
    let mut stranger = small;
    assert_eq!(
        q.process_part(&mut stranger, &mut mem, done, 1),
        Progress::Done
    );
    assert_eq!(stranger.status, status::EIO);
    let mut x = d;
    assert_eq!(q.process_part(&mut x, &mut mem, done, 1), Progress::Done);
    assert_eq!(x.status, status::EIO, "the cut ended with the stranger");
    // Begun again, and abandoned for another long one.
    let mut x = d;
    let Progress::More(done) = q.process_part(&mut x, &mut mem, 0, 1) else {
        panic!("cut")
    };
    let other = shot(true, Algorithm::Zlib, SRC, LONG, BASE + (20 << 20), 4 << 20);
    let mut o = other;
    assert!(matches!(
        q.process_part(&mut o, &mut mem, 0, 1),
        Progress::More(_)
    ));
    let mut x = d;
    assert_eq!(q.process_part(&mut x, &mut mem, done, 1), Progress::Done);
    assert_eq!(x.status, status::EIO);
    assert_eq!(held(&q), 0, "nothing held once no cut is left");
    // Whole, the request decodes.
    let (st, r, _) = run_parts(&mut q, &mut mem, d);
    assert_eq!(st, 0);
    let c = Done::from_result(r);
    decodes_to(&mut q, &mut mem, Algorithm::Gzip, c.produced, &data);
}

/// A cut zstd compression's context stays between passes: it counts
/// against the queue's memory budget with the sessions', and is given
/// back when the request ends.
#[test]
fn a_cut_compression_counts_its_memory() {
    let data = text(LONG);
    let (mut q, mut mem) = long_queue();
    mem.put(SRC, &data);
    let d = OneShot {
        compress: true,
        alg: Algorithm::Zstd,
        level: 19,
        max_ratio: 0,
        src: SRC,
        src_len: LONG as u64,
        dst: LONG_DST,
        dst_len: 4 << 20,
        piece: false,
    }
    .to_desc(1);
    // Sessions up to the budget: the cut does not fit.
    let mut sessions = fill_with_zstd_streams(&mut q, &mut mem);
    let full = held(&q);
    let mut x = d;
    assert_eq!(q.process_part(&mut x, &mut mem, 0, 1), Progress::Done);
    assert_eq!(x.status, status::ENOSPC);
    assert_eq!(held(&q), full);
    // With a session less it does, and is counted until it ends.
    let last = sessions.pop().unwrap();
    assert_eq!(
        run(&mut q, &mut mem, SessionFree { session: last }.to_desc(1)).0,
        0
    );
    let fewer = held(&q);
    let mut x = d;
    let Progress::More(done) = q.process_part(&mut x, &mut mem, 0, 1) else {
        panic!("cut")
    };
    assert!(held(&q) > fewer + (8 << 20), "{} {fewer}", held(&q));
    let mut stranger = shot(true, Algorithm::Zstd, SRC, 100, LONG_BACK, 4096);
    assert_eq!(
        q.process_part(&mut stranger, &mut mem, done, 1),
        Progress::Done
    );
    assert_eq!(held(&q), fewer, "given back");
}

/// A long stream step runs a part per pass too, the caller's flush with
/// the last part; decompression steps as well.
#[test]
fn long_stream_steps_run_in_parts() {
    for (alg, level) in [(Algorithm::Zlib, 9), (Algorithm::Zstd, 19)] {
        let data = noisy(LONG);
        let (mut q, mut mem) = long_queue();
        mem.put(SRC, &data);
        let c = open(&mut q, &mut mem, alg, level, true);
        let dsess = open(&mut q, &mut mem, alg, 0, false);
        let step = StreamOp {
            session: c,
            flush: Flush::Finish,
            src: SRC,
            src_len: LONG as u64,
            dst: LONG_DST,
            dst_len: 8 << 20,
        };
        let (st, r, calls) = run_parts(&mut q, &mut mem, step.to_desc(1));
        assert_eq!(st, 0, "{alg}");
        assert!(calls > 3, "{alg}: {calls} calls");
        let z = Done::from_result(r);
        assert!(z.end && z.consumed == LONG as u64, "{alg}: {z:?}");
        assert!(z.produced > 1 << 20, "{alg}: a long stream to decode");
        let back = StreamOp {
            session: dsess,
            flush: Flush::None,
            src: LONG_DST,
            src_len: z.produced,
            dst: LONG_BACK,
            dst_len: LONG as u64,
        };
        let (st, r, calls) = run_parts(&mut q, &mut mem, back.to_desc(1));
        assert_eq!(st, 0, "{alg}");
        assert!(calls > 1, "{alg}");
        let d = Done::from_result(r);
        assert!(d.end && d.produced == LONG as u64 && d.consumed == z.produced);
        assert!(mem.get(LONG_BACK, LONG) == data, "{alg}");
    }
}

/// Parts a stream session took cannot be undone: input that faults in a
/// later part ends the step with what the earlier parts did, as a step
/// whose output filled would; the stream carries on from there.
#[test]
fn a_later_part_that_faults_ends_the_step_with_what_was_done() {
    let data = noisy(LONG);
    let (mut q, mut mem) = long_queue();
    mem.put(SRC, &data);
    let c = open(&mut q, &mut mem, Algorithm::Gzip, 1, true);
    // Input that runs past the end of the client's memory.
    let at = BASE + LONG_MEM as u64 - (1 << 20) - 100;
    mem.put(at, &data[..(1 << 20) + 100]);
    let step = StreamOp {
        session: c,
        flush: Flush::None,
        src: at,
        src_len: 2 << 20,
        dst: LONG_DST,
        dst_len: 4 << 20,
    };
    let (st, r, calls) = run_parts(&mut q, &mut mem, step.to_desc(1));
    assert_eq!((st, calls), (0, 2));
    let d = Done::from_result(r);
    assert_eq!(d.consumed, 1 << 20);
    assert!(!d.end);
    // The rest of the stream, from the input the step did not take.
    let rest = StreamOp {
        src: at + d.consumed,
        src_len: 100,
        dst: LONG_DST + d.produced,
        flush: Flush::Finish,
        ..step
    };
    let (st, r) = run(&mut q, &mut mem, rest.to_desc(1));
    assert_eq!(st, 0);
    let e = Done::from_result(r);
    assert!(e.end);
    let mut out = Vec::new();
    let n = wd_zip_codec::Engine::new()
        .decompress_vec(
            Algorithm::Gzip,
            &mem.get(LONG_DST, (d.produced + e.produced) as usize),
            &mut out,
            4 << 20,
            0,
        )
        .unwrap();
    assert_eq!(n.produced, (1 << 20) + 100);
    assert!(out == data[..(1 << 20) + 100]);
}

/// Memory reached only as it is used, as a SHARE_ALL queue's is: a probe
/// says nothing, a fault shows only when data moves.
struct UnprobedMemory<'a>(&'a mut FlatMemory);

impl<'m> wd_device::Dma<'m> for UnprobedMemory<'_> {
    fn copy(&mut self, dst: u64, src: u64, len: u64) -> Result<(), wd_device::Fault> {
        self.0.copy(dst, src, len)
    }
    fn read(&mut self, src: u64, buf: &mut [u8]) -> Result<(), wd_device::Fault> {
        self.0.read(src, buf)
    }
    fn write(&mut self, dst: u64, data: &[u8]) -> Result<(), wd_device::Fault> {
        self.0.write(dst, data)
    }
}

/// Memory that notes the first fault its probes take, as the engine
/// records a request's fault for the stall policy; with
/// `room_elsewhere`, its slices from [`OUT`] on are that memory's (the
/// room mapped to other memory).
struct Recorder<'a> {
    mem: &'a mut FlatMemory,
    room_elsewhere: Option<&'a mut FlatMemory>,
    fault: Option<wd_device::Fault>,
}

impl<'m> wd_device::Dma<'m> for Recorder<'_> {
    fn copy(&mut self, dst: u64, src: u64, len: u64) -> Result<(), wd_device::Fault> {
        self.mem.copy(dst, src, len)
    }
    fn read(&mut self, src: u64, buf: &mut [u8]) -> Result<(), wd_device::Fault> {
        self.mem.read(src, buf)
    }
    fn write(&mut self, dst: u64, data: &[u8]) -> Result<(), wd_device::Fault> {
        self.mem.write(dst, data)
    }
    fn slice(&mut self, iova: u64, len: u64, access: Access) -> Option<DeviceSlice<'m>> {
        match &mut self.room_elsewhere {
            Some(room) if iova >= OUT => room.slice(iova, len, access),
            _ => self.mem.slice(iova, len, access),
        }
    }
    fn probe(&mut self, iova: u64, len: u64, access: Access) -> Result<(), wd_device::Fault> {
        let r = self.mem.probe(iova, len, access);
        if let Err(f) = &r {
            self.fault.get_or_insert(*f);
        }
        r
    }
}

/// A step whose output cannot be written after its session ran (memory
/// that faults only when used) cannot be taken back: the session is
/// broken and says so (-EIO, which a stall does not retry), whole or in
/// parts, rather than report success or leave a stream that silently
/// lacks the lost output.
#[test]
fn output_lost_after_a_step_ran_breaks_the_session() {
    let data = noisy(LONG);
    // Whole, with room for 1000 bytes; in parts, with room for the first
    // part's output (less than its 1 MiB) and not more.
    for (src_len, room, parts) in [(1_000_000u64, 1000, false), (LONG as u64, 1100 << 10, true)] {
        let (mut q, mut mem) = long_queue();
        mem.put(SRC, &data);
        let c = open(&mut q, &mut mem, Algorithm::Gzip, 1, true);
        // Room that runs past the end of the client's memory.
        let step = StreamOp {
            session: c,
            flush: Flush::Finish,
            src: SRC,
            src_len,
            dst: BASE + LONG_MEM as u64 - room,
            dst_len: 8 << 20,
        };
        let mut lying = UnprobedMemory(&mut mem);
        let (st, _, calls) = run_parts(&mut q, &mut lying, step.to_desc(1));
        assert_eq!(st, status::EIO, "parts {parts}");
        assert_eq!(calls > 1, parts);
        let again = StreamOp {
            dst: LONG_DST,
            ..step
        };
        assert_eq!(
            run(&mut q, &mut mem, again.to_desc(1)).0,
            status::EIO,
            "broken"
        );
        // The session can still be freed.
        assert_eq!(
            run(&mut q, &mut mem, SessionFree { session: c }.to_desc(1)).0,
            0
        );
    }
}

/// A decompressing step cut in parts writes at most `PART_OUT` a part
/// (host buffers stay small), going on while the client's room lasts.
#[test]
fn a_long_decompression_step_goes_on_past_a_parts_output() {
    let data = noisy(7 << 20);
    let (mut q, mut mem) = long_queue();
    let mut z = Vec::new();
    let n = wd_zip_codec::Engine::new()
        .compress_vec(Algorithm::Zlib, 1, &data, &mut z)
        .unwrap();
    assert!(n > 1 << 20 && n < 8 << 20, "{n}");
    mem.put(LONG_DST, &z);
    let d = open(&mut q, &mut mem, Algorithm::Zlib, 0, false);
    let step = StreamOp {
        session: d,
        flush: Flush::None,
        src: LONG_DST,
        src_len: n as u64,
        dst: SRC,
        dst_len: 8 << 20,
    };
    let (st, r, calls) = run_parts(&mut q, &mut mem, step.to_desc(1));
    assert_eq!(st, 0);
    assert!(calls > 2, "{calls}");
    let done = Done::from_result(r);
    assert!(done.end && done.consumed == n as u64 && done.produced == data.len() as u64);
    assert!(mem.get(SRC, data.len()) == data);
    assert!(
        q.output.capacity() <= PART_OUT + (1 << 20),
        "{}",
        q.output.capacity()
    );
}

/// A stream step cut in parts on the device is the same bytes as the step
/// run whole by the codec (the client's CPU path, and the replay of a
/// stream's journal on another host): the codec runs a step as the same
/// parts.
#[test]
fn a_step_cut_on_the_device_is_the_cpu_step() {
    let data = noisy(LONG);
    for (alg, level) in [
        (Algorithm::Zstd, 19),
        (Algorithm::Zlib, 1),
        (Algorithm::Gzip, 9),
    ] {
        let (mut q, mut mem) = long_queue();
        mem.put(SRC, &data);
        let p = wd_zip_codec::StreamParams {
            alg,
            compress: true,
            level,
            window_bits: 0,
            dict: &[],
        };
        let c = open(&mut q, &mut mem, alg, level, true);
        let step = StreamOp {
            session: c,
            flush: Flush::Finish,
            src: SRC,
            src_len: LONG as u64,
            dst: LONG_DST,
            dst_len: 8 << 20,
        };
        let (st, r, calls) = run_parts(&mut q, &mut mem, step.to_desc(1));
        assert!(st == 0 && calls > 1, "{alg}");
        let d = Done::from_result(r);
        let mut cpu = Stream::new(&p).unwrap();
        let mut out = vec![0u8; 8 << 20];
        let s = cpu.run(&data, &mut out, Flush::Finish).unwrap();
        assert_eq!(
            (s.consumed, s.produced, s.end),
            (LONG, d.produced as usize, d.end)
        );
        assert!(
            mem.get(LONG_DST, s.produced) == out[..s.produced],
            "{alg} {level}"
        );
    }
}

/// A decompressing step cut in parts whose later part meets corrupt data
/// (a zlib trailer that does not match) ends with what the earlier parts
/// took and wrote, delivered; the next step fails with -EBADMSG. It
/// failed whole, result 0, with the earlier parts' output written and
/// their input taken.
#[test]
fn a_cut_steps_later_error_ends_it_with_the_earlier_parts_work() {
    let data = noisy(LONG);
    let mut packed = vec![0u8; wd_zip_codec::compress_bound(Algorithm::Zlib, LONG)];
    let n = wd_zip_codec::Engine::new()
        .compress(Algorithm::Zlib, 1, &data, &mut packed)
        .unwrap();
    packed.truncate(n);
    packed[n - 1] ^= 1;
    let (mut q, mut mem) = long_queue();
    mem.put(SRC, &packed);
    let d = open(&mut q, &mut mem, Algorithm::Zlib, 0, false);
    let step = |src: u64, len: usize| StreamOp {
        session: d,
        flush: Flush::Finish,
        src,
        src_len: len as u64,
        dst: LONG_DST,
        dst_len: 8 << 20,
    };
    let (st, r, calls) = run_parts(&mut q, &mut mem, step(SRC, n).to_desc(1));
    let done = Done::from_result(r);
    assert!(st == 0 && calls > 1, "status {st} after {calls} parts");
    assert!(done.produced > 0 && !done.end, "{done:?}");
    assert!(mem.get(LONG_DST, done.produced as usize) == data[..done.produced as usize]);
    let rest = n - done.consumed as usize;
    let (st, _, _) = run_parts(&mut q, &mut mem, step(SRC + done.consumed, rest).to_desc(2));
    assert_eq!(st, status::EBADMSG);
}

/// A one-shot request starts over after a stall (it reads only its
/// input), unless its output may overwrite that input; a stream step
/// never does (its session has moved on).
#[test]
fn one_shot_requests_whose_output_spares_their_input_may_start_over() {
    let (q, _, _) = queue();
    for compress in [true, false] {
        let apart = shot(compress, Algorithm::Zstd, SRC, 1 << 20, DST, 1 << 20);
        let overlapping = shot(compress, Algorithm::Zstd, SRC, 1 << 20, SRC + 4096, 1 << 20);
        let adjacent = shot(compress, Algorithm::Zstd, SRC, 4096, SRC + 4096, 4096);
        assert!(q.restartable(&apart), "compress {compress}");
        assert!(!q.restartable(&overlapping), "compress {compress}");
        assert!(q.restartable(&adjacent), "compress {compress}");
    }
    let step = StreamOp {
        session: 1,
        flush: Flush::None,
        src: SRC,
        src_len: 1 << 20,
        dst: DST,
        dst_len: 1 << 20,
    };
    assert!(!q.restartable(&step.to_desc(1)));
    let mut bad = shot(true, Algorithm::Zstd, SRC, 1, DST, 1);
    bad.opcode = 0xff;
    assert!(!q.restartable(&bad));
}
