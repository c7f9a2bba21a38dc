//! The zip device: deflate (raw, zlib and gzip framing), zstd and LZ4
//! compression and decompression served through WrapDrive queues, one
//! buffer at a time or as streams whose state (history, window, flush
//! position) lives in host-side sessions.
//!
//! One-shot requests work in place in the client's shared memory where
//! the queue's domain maps a buffer contiguously and the engine takes
//! addresses (libdeflate, libzstd): a compression reads its input and
//! writes its output there, a decompression writes its output there but
//! reads a host copy of its input, so a decoder never sees its input
//! change under it. Everything else (LZ4, whose engine takes only Rust
//! slices; streams; a compression cut in parts, one per engine pass;
//! memory that is not one mapping) crosses through host buffers by copy.
//! Host buffers are bounded by the request limits and released after a
//! large request, so an idle queue keeps nothing big.
//!
//! The message format is `wd-zip-msg` (re-exported as [`msg`]); the
//! engines are `wd-zip-codec`, which the client library's CPU path uses
//! too.
#![deny(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use wd_device::{
    status, Access, AlgInfo, DeviceQueue, DeviceSlice, Dma, Driver, Progress, SessionTable,
};
use wd_ring::Desc;
use wd_zip_codec::{
    compress_bound, decompress_cap, part_len, CodecError, DecompressParts, Engine, Flush, Parts,
    Stream, StreamParams, PART_OUT,
};
pub use wd_zip_msg as msg;
use wd_zip_msg::{decode, Done, OneShot, Request, SessionNew, StreamOp, MAX_SESSIONS};

/// Host buffers above this size are given back after the request.
const KEEP: usize = 4 << 20;

/// Memory a queue's sessions may hold together (by [`Stream::footprint`]):
/// a deflate stream takes 256 KiB (the table's 64 take 16 MiB), a zstd
/// compression stream 3.5 MiB at level 3, 17 MiB at level 9 and 58 MiB
/// from level 19 up, a zstd decompression stream 8 MiB. Past the budget
/// a new session is refused with -ENOSPC, as when the table is full.
pub const SESSION_MEMORY: usize = 128 << 20;

/// The zip driver.
#[derive(Debug, Default)]
pub struct ZipDriver {
    sessions: Arc<AtomicU64>,
}

impl ZipDriver {
    /// The driver.
    pub fn new() -> ZipDriver {
        ZipDriver::default()
    }
}

/// Which library serves each algorithm, as `devN/engine` shows it.
pub fn engine_summary() -> String {
    wd_zip_codec::engines()
        .into_iter()
        .map(|(alg, one, stream)| match stream {
            Some(s) if s != one => format!("{alg}={one} (streams {s})"),
            _ => format!("{alg}={one}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

impl Driver for ZipDriver {
    fn name(&self) -> &'static str {
        "zip"
    }

    fn algorithms(&self) -> Vec<AlgInfo> {
        vec![AlgInfo {
            name: msg::QUEUE_ALG,
            flags: 0,
            device_api: msg::DEVICE_API,
        }]
    }

    fn engine(&self) -> Option<String> {
        Some(engine_summary())
    }

    fn attributes(&self) -> Vec<(String, String, bool)> {
        vec![(
            "sessions".to_string(),
            self.sessions.load(Ordering::Relaxed).to_string(),
            false,
        )]
    }

    fn open_queue(&self, _alg: u32) -> Box<dyn DeviceQueue> {
        Box::new(ZipQueue::new(self.sessions.clone()))
    }
}

/// The device side of one compression queue.
pub struct ZipQueue {
    engine: Engine,
    sessions: SessionTable<Stream>,
    /// The sessions' footprints, summed (with the cut's, [`Cut::footprint`],
    /// what the queue holds).
    held: usize,
    input: Vec<u8>,
    output: Vec<u8>,
    /// The request served a part per engine pass, between its parts.
    cut: Option<Cut>,
}

/// A long request served a part per engine pass
/// ([`DeviceQueue::process_part`]): a one-shot compression longer than
/// one part ([`wd_zip_codec::part_len`]), a one-shot decompression that
/// may make more than [`PART_OUT`] ([`DecompressParts`]) or a stream step
/// longer than one ([`Stream::part_len`]), so that a zstd level 19 or
/// libdeflate level 12 compression of 64 MiB, seconds of work, or a
/// decompression making 64 MiB (60 to 120 ms here) does not make every
/// other queue of the device wait for it. LZ4 and the fastest levels of
/// compression run whole: they take hundreds of MB/s of input or more,
/// bounded by [`msg::MAX_DATA`]. Parts go through host buffers of a part's
/// size (a stream step's output at most [`PART_OUT`], a one-shot
/// decompression's a MiB), but for zstd's one-shot decompression, which
/// keeps its history in its output: into the client's room in place where
/// that is one mapping, as the whole call, else into one buffer of the
/// room's size.
struct Cut {
    /// The request, to tell its continuation from any other.
    desc: Desc,
    /// Input taken and output written by its parts so far.
    consumed: u64,
    produced: u64,
    /// Memory the cut holds between parts: a compression's counted with
    /// the sessions' (see `begin_cut` for a decompression's).
    footprint: usize,
    work: Work,
}

enum Work {
    Compress(OneShot, Parts),
    Decompress(OneShot, Decoding),
    Stream(StreamOp),
}

/// A cut decompression's input being copied in, then decoded.
enum Decoding {
    /// The input copied so far: a copy the client cannot change under the
    /// decoder, which needs all of it (the trailer is at its end), taken
    /// [`STAGE_PART`] a part (64 MiB is 5 ms or more to copy), all of it
    /// checked in the first part.
    Staging(Vec<u8>),
    /// Decoding: zstd into the client's output in place where its room is
    /// one mapping, as the whole call does (`at`: the host address it has
    /// written at, where the decoder's history is, so every part must find
    /// the same memory there); the rest through a part-sized buffer.
    Parts {
        p: Box<DecompressParts>,
        at: Option<usize>,
    },
}

/// Input a cut decompression copies in per part.
const STAGE_PART: usize = 2 << 20;

impl Cut {
    /// How far the request got, as the engine is told between parts (it
    /// grows with every part: a compression's or a step's part takes
    /// input; a decompression's copies input in, or decodes and may then
    /// take no input, making output from input taken before, or make no
    /// output, taking headers).
    fn progress(&self) -> u64 {
        match &self.work {
            Work::Decompress(r, Decoding::Parts { .. }) => {
                r.src_len + self.consumed + self.produced
            }
            Work::Decompress(_, Decoding::Staging(input)) => input.len() as u64,
            _ => self.consumed,
        }
    }
}

/// Room a compressed part needs past the engine's bound for its input:
/// the framing's header and trailer and a piece's open end, or what zstd
/// held back of the part before (less than a block; a part is at least
/// one, so twice the part's bound covers it).
const PART_SLACK: usize = 32;

impl ZipQueue {
    /// A queue counting its sessions in `live`.
    pub fn new(live: Arc<AtomicU64>) -> ZipQueue {
        ZipQueue {
            engine: Engine::new(),
            sessions: SessionTable::new(MAX_SESSIONS, live),
            held: 0,
            input: Vec::new(),
            output: Vec::new(),
            cut: None,
        }
    }

    /// Sessions alive on this queue.
    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// Read `len` bytes at `src` into the input buffer and size the
    /// output buffer to `room`.
    fn stage(&mut self, src: u64, len: u64, room: u64, dma: &mut dyn Dma<'_>) -> Result<(), i32> {
        self.input.resize(len as usize, 0);
        if len > 0 {
            dma.read(src, &mut self.input).map_err(|_| status::EFAULT)?;
        }
        self.output.resize(room as usize, 0);
        Ok(())
    }

    fn release_big(&mut self) {
        for b in [&mut self.input, &mut self.output] {
            if b.capacity() > KEEP {
                *b = Vec::new();
            }
        }
    }

    fn one_shot(&mut self, r: OneShot, dma: &mut dyn Dma<'_>) -> Result<Done, i32> {
        if r.piece {
            return self.piece(r, dma);
        }
        if Engine::works_in_place(r.alg) && r.src_len > 0 && r.dst_len > 0 {
            // The output, and a compression's input, in place in shared
            // memory when the domain maps them contiguously.
            if let Some(mut out) = dma.slice(r.dst, r.dst_len, Access::Write) {
                if r.compress {
                    // Input and output must not overlap in host memory (a
                    // client may name overlapping ranges, or one buffer
                    // mapped at two addresses): the engines copy with
                    // memcpy. Overlapping requests go through host buffers.
                    let input = dma
                        .slice(r.src, r.src_len, Access::Read)
                        .filter(|i| !overlap(i, &out));
                    if let Some(input) = input {
                        let n = self
                            .engine
                            .compress(r.alg, r.level, &input, &mut out)
                            .map_err(CodecError::status)?;
                        return Ok(Done {
                            produced: n as u64,
                            consumed: r.src_len,
                            end: true,
                        });
                    }
                } else {
                    // A decoder reads its input from a copy the client
                    // cannot change under it.
                    self.stage(r.src, r.src_len, 0, dma)?;
                    let got = self
                        .engine
                        .decompress(r.alg, &self.input, &mut out, r.max_ratio)
                        .map_err(CodecError::status)?;
                    return Ok(Done {
                        produced: got.produced as u64,
                        consumed: got.consumed as u64,
                        end: true,
                    });
                }
            }
        }
        self.stage(r.src, r.src_len, r.dst_len, dma)?;
        let done = if r.compress {
            let n = self
                .engine
                .compress(r.alg, r.level, &self.input, &mut self.output)
                .map_err(CodecError::status)?;
            Done {
                produced: n as u64,
                consumed: r.src_len,
                end: true,
            }
        } else {
            let got = self
                .engine
                .decompress(r.alg, &self.input, &mut self.output, r.max_ratio)
                .map_err(CodecError::status)?;
            Done {
                produced: got.produced as u64,
                consumed: got.consumed as u64,
                end: true,
            }
        };
        write_out(dma, r.dst, &self.output[..done.produced as usize])?;
        Ok(done)
    }

    /// Compress a piece of a deflate stream: into a host buffer, where
    /// its end is rewritten (never in shared memory, which the client can
    /// change under the rewrite), from the input in place when it is.
    fn piece(&mut self, r: OneShot, dma: &mut dyn Dma<'_>) -> Result<Done, i32> {
        self.output.resize(r.dst_len as usize, 0);
        let input = (r.src_len > 0)
            .then(|| dma.slice(r.src, r.src_len, Access::Read))
            .flatten();
        let n = match input {
            Some(input) => self
                .engine
                .compress_piece(r.level, &input, &mut self.output),
            None => {
                self.stage(r.src, r.src_len, r.dst_len, dma)?;
                self.engine
                    .compress_piece(r.level, &self.input, &mut self.output)
            }
        }
        .map_err(CodecError::status)?;
        write_out(dma, r.dst, &self.output[..n])?;
        Ok(Done {
            produced: n as u64,
            consumed: r.src_len,
            end: false,
        })
    }

    fn session_new(&mut self, s: SessionNew, dma: &mut dyn Dma<'_>) -> Result<u64, i32> {
        let mut dict = vec![0; s.dict_len as usize];
        if !dict.is_empty() {
            dma.read(s.dict, &mut dict).map_err(|_| status::EFAULT)?;
        }
        let stream = Stream::new(&StreamParams {
            alg: s.alg,
            compress: s.compress,
            level: s.level,
            window_bits: s.window_bits,
            dict: &dict,
        })
        .map_err(CodecError::status)?;
        let fp = stream.footprint();
        let cut = self.cut.as_ref().map_or(0, |c| c.footprint);
        if self.held + cut + fp > SESSION_MEMORY {
            return Err(status::ENOSPC);
        }
        let h = self.sessions.insert(stream)?;
        self.held += fp;
        Ok(h)
    }

    fn session_free(&mut self, handle: u64) -> Result<u64, i32> {
        let s = self.sessions.remove(handle)?;
        self.held -= s.footprint();
        Ok(0)
    }

    fn stream(&mut self, op: StreamOp, dma: &mut dyn Dma<'_>) -> Result<Done, i32> {
        // The session first: a request naming none reads no memory.
        self.sessions.get(op.session)?;
        let (step, _) = self.step(
            op.session,
            (op.src, op.src_len),
            (op.dst, op.dst_len),
            op.flush,
            None,
            dma,
        )?;
        Ok(Done {
            produced: step.produced as u64,
            consumed: step.consumed as u64,
            end: step.end,
        })
    }

    /// Run session `session` over the input `(address, length)` into the
    /// room `(address, length)`, flushing as `flush` says: the whole step
    /// ([`Stream::run`]), or with `part` = (last, more room) one part of it
    /// ([`Stream::run_part`]); what it did and whether the step is
    /// finished.
    ///
    /// A step cannot be undone (the session takes its input), so memory
    /// faults, if it does, before the session runs: the input is staged
    /// and the output probed first (see `Dma::probe`), and either failing
    /// is -EFAULT with the session as it was. Output the session made and
    /// that could not be written after all (memory reached only as it is
    /// used: SHARE_ALL) is lost with its input: the session is broken, and
    /// the step fails with -EIO, which a stall does not retry with input
    /// the session already took.
    ///
    /// `part`: one part of a cut step, as `Stream::run_part` takes it
    /// (last, more room, earlier parts did something).
    fn step(
        &mut self,
        session: u64,
        (src, len): (u64, u64),
        (dst, room): (u64, u64),
        flush: Flush,
        part: Option<(bool, bool, bool)>,
        dma: &mut dyn Dma<'_>,
    ) -> Result<(wd_zip_codec::Step, bool), i32> {
        self.stage(src, len, room, dma)?;
        if room > 0 {
            dma.probe(dst, room, Access::Write)
                .map_err(|_| status::EFAULT)?;
        }
        let s = self.sessions.get(session)?;
        let (input, output) = (&self.input, &mut self.output);
        let (step, finished) = match part {
            None => s.run(input, output, flush).map(|step| (step, true)),
            Some((last, more_room, earlier)) => {
                s.run_part(input, last, output, more_room, earlier, flush)
            }
        }
        .map_err(CodecError::status)?;
        if write_out(dma, dst, &self.output[..step.produced]).is_err() {
            s.break_off();
            return Err(status::EIO);
        }
        Ok((step, finished))
    }
}

impl ZipQueue {
    /// Run `desc`, decoded as `request`, whole.
    fn whole(&mut self, desc: &mut Desc, request: Result<Request, i32>, dma: &mut dyn Dma<'_>) {
        let r = match request {
            Err(st) => Err(st),
            Ok(Request::Nop) => Ok(0),
            Ok(Request::SessionNew(s)) => self.session_new(s, dma),
            Ok(Request::SessionFree(f)) => self.session_free(f.session),
            Ok(Request::OneShot(r)) => self.one_shot(r, dma).map(Done::to_result),
            Ok(Request::Stream(op)) => self.stream(op, dma).map(Done::to_result),
        };
        self.release_big();
        complete(desc, r);
    }

    /// The first part of `desc` (decoded as `request`) when it is long
    /// enough to be cut; `None` when it runs whole.
    fn begin_cut(&mut self, desc: &Desc, request: Request) -> Option<Result<Cut, i32>> {
        let mut footprint = 0;
        let work = match request {
            Request::OneShot(r) if r.compress => {
                let part = part_len(r.alg, r.level)?;
                if r.src_len <= part as u64 {
                    return None;
                }
                match Parts::new(r.alg, r.level, r.src_len, r.piece) {
                    Ok(parts) => Work::Compress(r, parts),
                    Err(e) => return Some(Err(e.status())),
                }
            }
            Request::OneShot(r) => {
                let (src_len, room) = (r.src_len as usize, r.dst_len as usize);
                let cap = decompress_cap(src_len, room, r.max_ratio);
                if !DecompressParts::worth(cap) {
                    return None;
                }
                footprint = DecompressParts::footprint(r.alg, src_len, cap);
                Work::Decompress(r, Decoding::Staging(Vec::new()))
            }
            Request::Stream(op) => {
                let part = self.sessions.get(op.session).ok()?.part_len();
                if op.src_len <= part as u64 {
                    return None;
                }
                Work::Stream(op)
            }
            _ => return None,
        };
        // A cut the engine left unfinished (it never does) is over.
        self.cut = None;
        if let Work::Compress(_, parts) = &work {
            footprint = parts.footprint();
        }
        // Held across passes, so counted with the queue's sessions. A
        // decompression's is not: it is bounded by the request's limits
        // (input and room at most [`msg::MAX_DATA`] each, and a decoder),
        // as the same request run whole holds it for its one pass, and no
        // session is made on the queue while it goes on (its requests wait
        // for the cut). Refused or run whole beside the sessions, a
        // client would have the longest ones run whole when it liked.
        if !matches!(work, Work::Decompress(..)) && self.held + footprint > SESSION_MEMORY {
            return Some(Err(status::ENOSPC));
        }
        Some(Ok(Cut {
            desc: *desc,
            consumed: 0,
            produced: 0,
            footprint,
            work,
        }))
    }

    /// Run the next part of `cut`: `Some(done)` when the request is
    /// finished.
    fn next_part(&mut self, cut: &mut Cut, dma: &mut dyn Dma<'_>) -> Result<Option<Done>, i32> {
        match &mut cut.work {
            Work::Compress(r, parts) => {
                let n = parts.next_len();
                let room = r.dst_len - cut.produced;
                let room = room.min((2 * compress_bound(r.alg, n) + PART_SLACK) as u64);
                self.stage(r.src + parts.taken(), n as u64, room, dma)?;
                let made = parts
                    .compress(&mut self.engine, &self.input, &mut self.output)
                    .map_err(CodecError::status)?;
                write_out(dma, r.dst + cut.produced, &self.output[..made])?;
                cut.consumed = parts.taken();
                cut.produced += made as u64;
                Ok(parts.finished().then_some(Done {
                    produced: cut.produced,
                    consumed: cut.consumed,
                    end: !r.piece,
                }))
            }
            Work::Decompress(r, decoding) => {
                if let Decoding::Staging(input) = decoding {
                    let at = input.len();
                    // All of the input is checked in the first part, as
                    // the request run whole reads it first: a fault there,
                    // which a stall retries, rather than in a later part,
                    // which fails a request whose output overlaps it (see
                    // `restartable`).
                    if at == 0 && r.src_len > 0 {
                        dma.probe(r.src, r.src_len, Access::Read)
                            .map_err(|_| status::EFAULT)?;
                    }
                    input.reserve_exact(r.src_len as usize - at);
                    let n = (r.src_len as usize - at).min(STAGE_PART);
                    input.resize(at + n, 0);
                    dma.read(r.src + at as u64, &mut input[at..])
                        .map_err(|_| status::EFAULT)?;
                    if input.len() < r.src_len as usize {
                        return Ok(None);
                    }
                    let input = std::mem::take(input);
                    let p = DecompressParts::new(r.alg, input, r.dst_len as usize, r.max_ratio)
                        .map_err(CodecError::status)?;
                    *decoding = Decoding::Parts {
                        p: Box::new(p),
                        at: None,
                    };
                }
                let Decoding::Parts { p, at } = decoding else {
                    unreachable!("staged above")
                };
                let len = p.out_len() as u64;
                let slice = match p.writes_into() {
                    true => dma.slice(r.dst, len, Access::Write),
                    false => None,
                };
                let end = match (slice, *at) {
                    (Some(mut out), was) if was.is_none_or(|a| a == out.as_ptr() as usize) => {
                        *at = Some(out.as_ptr() as usize);
                        let (n, end) = p.next_part_into(&mut out).map_err(CodecError::status)?;
                        cut.produced += n as u64;
                        end
                    }
                    (None, None) => {
                        let (made, end) = p.next_part().map_err(CodecError::status)?;
                        write_out(dma, r.dst + cut.produced, made)?;
                        cut.produced += made.len() as u64;
                        end
                    }
                    // Unshared or moved since the parts before wrote there
                    // (a fault recorded where there is one).
                    _ => {
                        dma.probe(r.dst, len, Access::Write)
                            .map_err(|_| status::EFAULT)?;
                        return Err(status::EFAULT);
                    }
                };
                cut.consumed = p.consumed() as u64;
                Ok(end.map(|e| Done {
                    produced: e.produced as u64,
                    consumed: e.consumed as u64,
                    end: true,
                }))
            }
            Work::Stream(op) => {
                let op = *op;
                let part = self.sessions.get(op.session)?.part_len() as u64;
                let n = (op.src_len - cut.consumed).min(part);
                let last = cut.consumed + n == op.src_len;
                let room = op.dst_len - cut.produced;
                let cap = room.min(PART_OUT as u64);
                let input = (op.src + cut.consumed, n);
                let output = (op.dst + cut.produced, cap);
                let part = Some((last, room > cap, cut.consumed + cut.produced > 0));
                let (step, finished) =
                    match self.step(op.session, input, output, op.flush, part, dma) {
                        Ok(r) => r,
                        // Memory failing before a later part ran ends the step
                        // with what the parts before did, as a step whose
                        // output filled ends (the fault is recorded).
                        Err(status::EFAULT) if cut.consumed + cut.produced > 0 => {
                            return Ok(Some(Done {
                                produced: cut.produced,
                                consumed: cut.consumed,
                                end: false,
                            }))
                        }
                        Err(st) => return Err(st),
                    };
                cut.consumed += step.consumed as u64;
                cut.produced += step.produced as u64;
                // A `More` must have taken input (the engine reads a
                // continuation from 0 as a new request); a first part that
                // took none ends the step (it cannot: output needs input).
                let finished = finished || cut.consumed == 0;
                Ok(finished.then_some(Done {
                    produced: cut.produced,
                    consumed: cut.consumed,
                    end: step.end,
                }))
            }
        }
    }
}

/// Whether two device slices share host memory.
fn overlap(a: &DeviceSlice<'_>, b: &DeviceSlice<'_>) -> bool {
    let (a0, b0) = (a.as_ptr() as usize, b.as_ptr() as usize);
    a0 < b0.saturating_add(b.len()) && b0 < a0.saturating_add(a.len())
}

/// Fill in a finished request's status and result.
fn complete(desc: &mut Desc, r: Result<u64, i32>) {
    (desc.status, desc.result) = match r {
        Ok(v) => (status::OK, v),
        Err(st) => (st, 0),
    };
}

fn write_out(dma: &mut dyn Dma<'_>, dst: u64, data: &[u8]) -> Result<(), i32> {
    if data.is_empty() {
        return Ok(());
    }
    dma.write(dst, data).map_err(|_| status::EFAULT)
}

impl DeviceQueue for ZipQueue {
    fn process(&mut self, desc: &mut Desc, dma: &mut dyn Dma<'_>) {
        let request = decode(desc);
        self.whole(desc, request, dma);
    }

    fn process_part(
        &mut self,
        desc: &mut Desc,
        dma: &mut dyn Dma<'_>,
        done: u64,
        _budget: u64,
    ) -> Progress {
        // Where a request is cut depends on the request only (never on
        // what the pass has left), so that the same input makes the same
        // stream every time.
        let cut = if done == 0 {
            let request = decode(desc);
            match request.ok().and_then(|r| self.begin_cut(desc, r)) {
                Some(cut) => cut,
                None => {
                    self.whole(desc, request, dma);
                    return Progress::Done;
                }
            }
        } else {
            // The engine continues the request it was told about, before
            // any other of the queue; anything else is a bug, failed
            // rather than run on stale state.
            match self.cut.take() {
                Some(c) if c.desc == *desc && c.progress() == done => Ok(c),
                _ => Err(status::EIO),
            }
        };
        let r = match cut {
            Err(st) => Err(st),
            Ok(mut c) => match self.next_part(&mut c, dma) {
                Ok(None) => {
                    let upto = c.progress();
                    self.cut = Some(c);
                    return Progress::More(upto);
                }
                Ok(Some(d)) => Ok(d.to_result()),
                Err(st) => Err(st),
            },
        };
        self.release_big();
        complete(desc, r);
        Progress::Done
    }

    fn restartable(&self, desc: &Desc) -> bool {
        // A one-shot request is a function of its input: run again from
        // the start, it reads the same input unless its own output
        // overwrote it. A stream step's session has moved on.
        matches!(decode(desc), Ok(Request::OneShot(r))
            if !wd_device::ranges_overlap((r.src, r.src_len), (r.dst, r.dst_len)))
    }

    fn bytes_of(&self, done: &Desc) -> u64 {
        match done.opcode {
            msg::OP_COMPRESS | msg::OP_DECOMPRESS | msg::OP_STREAM => {
                Done::from_result(done.result).consumed
            }
            _ => 0,
        }
    }

    fn work_of(&self, done: &Desc) -> u64 {
        // A decompression's work is what it wrote (a few KiB of zstd
        // make 64 MiB); a compression's what it read.
        match done.opcode {
            msg::OP_COMPRESS | msg::OP_DECOMPRESS | msg::OP_STREAM => {
                let d = Done::from_result(done.result);
                d.consumed.max(d.produced)
            }
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests;
