//! Streams: compression or decompression whose state carries across
//! calls, with zlib's flush modes. A stream opened where a queue is to be
//! had keeps its state in a session of the zip device; otherwise (policy
//! `cpu`, no host, no zip device) in this thread, on the same engine the
//! device uses.
//!
//! A device stream's state lives in the host, and goes with it. So that
//! a restart does not end the stream, the stream keeps a journal: its
//! parameters and every request it sent (input, room, flush) with what the
//! device answered, and a CRC of the output it was given. When the host
//! goes away the journal is replayed on this thread's engine (the one the
//! device runs), each step must answer as the device did and the output
//! must have the same CRC; the stream then goes on here, and the request
//! that met the restart is run again here (a request whose answer was
//! lost left no trace in the caller's buffers). A journal holds at most
//! [`crate::Config::journal_limit`] input bytes: a longer stream, or one
//! whose replay differs (a host of another version), fails with
//! [`Status::HostGone`] as before, and is counted.

use wd_zip_codec::{CodecError, StreamParams};
use wd_zip_msg::{Done, Flush, SessionFree, SessionNew, StreamOp};
use wrapdrive::{ClientError, Status};

use crate::{device_status, CompError, Compressor, LaneKey, Policy, Result};

pub use wd_zip_codec::Step;

enum Inner {
    /// A session of the zip device, on the queue of this lane.
    Device {
        session: u64,
        lane: LaneKey,
        journal: Box<Journal>,
    },
    /// State in this thread.
    Cpu(Box<wd_zip_codec::Stream>),
    /// Closed, or its host went away.
    Gone,
}

/// Most input one request of a decompressing stream carries: the staging
/// area grows to hold it only for callers that give that much room.
const STREAM_INPUT_MAX: usize = 4 << 20;

/// A compression or decompression stream of one [`Compressor`].
pub struct Stream {
    inner: Inner,
    /// The compressor it belongs to (its calls take that one only).
    owner: u64,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.inner {
            Inner::Device { .. } => "device",
            Inner::Cpu(_) => "cpu",
            Inner::Gone => "gone",
        };
        f.debug_struct("Stream").field("on", &kind).finish()
    }
}

/// One request a device stream sent, and the device's answer.
#[derive(Clone, Copy, Debug)]
struct Call {
    /// Input bytes sent (those not consumed come again in a later call).
    len: usize,
    room: usize,
    flush: Flush,
    step: Step,
}

/// What a device stream needs to be made again on this thread.
struct Journal {
    alg: wd_zip_msg::Algorithm,
    compress: bool,
    level: i8,
    window_bits: u8,
    dict: Vec<u8>,
    /// The input of every call, one after another.
    input: Vec<u8>,
    calls: Vec<Call>,
    /// Of all the output the device gave.
    crc: wd_zip_codec::Crc,
    /// `input` may not grow past this; past it the journal is dropped.
    limit: usize,
    /// The journal grew past its limit: the stream cannot be rebuilt.
    over: bool,
}

impl Journal {
    fn new(p: &StreamParams<'_>, limit: usize) -> Journal {
        Journal {
            alg: p.alg,
            compress: p.compress,
            level: p.level,
            window_bits: p.window_bits,
            dict: p.dict.to_vec(),
            input: Vec::new(),
            calls: Vec::new(),
            crc: wd_zip_codec::Crc::new(),
            limit,
            over: false,
        }
    }

    /// Keep a call (`input` its bytes, `out` its output).
    fn record(&mut self, input: &[u8], call: Call, out: &[u8]) {
        if self.over {
            return;
        }
        if self.input.len() + input.len() > self.limit {
            self.over = true;
            self.input = Vec::new();
            self.calls = Vec::new();
            return;
        }
        self.input.extend_from_slice(input);
        self.calls.push(call);
        self.crc.update(out);
    }

    /// Where a call is cut into requests: compressing, at the codec's
    /// part length ([`StreamParams::part_len`]); decompressing, anywhere.
    fn cut(&self) -> Option<usize> {
        self.compress.then(|| self.params().part_len())
    }

    fn params(&self) -> StreamParams<'_> {
        StreamParams {
            alg: self.alg,
            compress: self.compress,
            level: self.level,
            window_bits: self.window_bits,
            dict: &self.dict,
        }
    }

    /// Run the journal's calls through `run` (a fresh stream, on the
    /// device or here): whether every call answered as the device did
    /// and the output is the same.
    fn replay(&self, mut run: impl FnMut(&[u8], &mut [u8], Flush) -> Option<Step>) -> bool {
        if self.over {
            return false;
        }
        let mut out = vec![0u8; self.calls.iter().map(|c| c.room).max().unwrap_or(0)];
        let mut crc = wd_zip_codec::Crc::new();
        let mut at = 0;
        for c in &self.calls {
            let input = &self.input[at..at + c.len];
            if run(input, &mut out[..c.room], c.flush) != Some(c.step) {
                return false;
            }
            crc.update(&out[..c.step.produced]);
            at += c.len;
        }
        crc.sum() == self.crc.sum() && crc.amount() == self.crc.amount()
    }
}

impl Stream {
    /// Whether the stream's state is on the device.
    pub fn on_device(&self) -> bool {
        matches!(self.inner, Inner::Device { .. })
    }
}

fn gone() -> CompError {
    CompError::Device(ClientError::new(
        Status::HostGone,
        "the stream's state was on a host that went away and could not be rebuilt \
         (past the journal limit, or the replay differed); start a new stream",
    ))
}

impl Compressor {
    /// Open a stream: on the device when a queue is to be had and the
    /// policy lets it, else in this thread (counted as a fallback, or an
    /// error when fallback is off).
    pub fn open_stream(&mut self, p: &StreamParams<'_>) -> Result<Stream> {
        let owner = self.id;
        // Checked here, so a bad parameter is the same error either way.
        wd_zip_codec::Stream::new(p)?;
        if self.cfg.policy != Policy::Cpu && p.dict.len() <= wd_zip_msg::MAX_DICT as usize {
            match self.open_session(p) {
                Ok((session, lane)) => {
                    return Ok(Stream {
                        inner: Inner::Device {
                            session,
                            lane,
                            journal: Box::new(Journal::new(p, self.cfg.journal_limit)),
                        },
                        owner,
                    })
                }
                Err(e) if !self.cfg.fallback => return Err(e),
                Err(_) => self.stats.cpu_fallback += 1,
            }
        } else {
            self.stats.cpu_policy += 1;
        }
        Ok(Stream {
            inner: Inner::Cpu(Box::new(wd_zip_codec::Stream::new(p)?)),
            owner,
        })
    }

    /// A session of the zip device: its handle and where it lives.
    fn open_session(&mut self, p: &StreamParams<'_>) -> Result<(u64, LaneKey)> {
        if self.lane().is_none() {
            return Err(CompError::NoQueue(self.no_lane.clone().unwrap_or_default()));
        }
        let lane = self.lane.as_mut().expect("just opened");
        lane.ensure(p.dict.len().max(1), 1)?;
        let stage = lane.stage.as_ref().expect("ensured");
        stage.write(0, p.dict);
        let d = SessionNew {
            alg: p.alg,
            level: if p.compress { p.level } else { 0 },
            compress: p.compress,
            window_bits: p.window_bits,
            dict: stage.addr(),
            dict_len: p.dict.len() as u32,
        }
        .to_desc(0);
        let done = lane.q.call(d)?;
        device_status(done.status)?;
        Ok((done.result, lane.key()))
    }

    /// Feed a stream: take what fits of `input`, write what fits into
    /// `out`, flushing as `flush` says ([`Flush::Finish`] ends the stream
    /// once all input is taken and the trailer fits: call again with
    /// more room until [`Step::end`]).
    pub fn stream_run(
        &mut self,
        s: &mut Stream,
        input: &[u8],
        out: &mut [u8],
        flush: Flush,
    ) -> Result<Step> {
        if s.owner != self.id {
            return Err(CodecError::Param.into());
        }
        let (session, key, part) = match &mut s.inner {
            Inner::Cpu(st) => {
                let step = st.run(input, out, flush)?;
                self.stats.bytes_in += step.consumed as u64;
                self.stats.bytes_out += step.produced as u64;
                return Ok(step);
            }
            Inner::Gone => return Err(gone()),
            Inner::Device {
                session,
                lane,
                journal,
            } => (*session, *lane, journal.cut()),
        };
        // A request carries at most a part's input and room (see
        // `session_call`): a longer call goes in several, ended as the
        // codec ends a step's parts
        // (`wd_zip_codec::Stream::run_part`), so the stream's bytes are
        // the codec's, and a flush is done when the call returns with
        // room left.
        let mut done = Step::default();
        loop {
            let (rest, room) = (&input[done.consumed..], &mut out[done.produced..]);
            let Some(sent) = self.session_call(session, key, part, rest, room, flush)? else {
                // The answer (if any) is lost with the session; the
                // caller's buffers hold nothing of it, so this request
                // runs again on the rebuilt stream.
                self.rebuild(s)?;
                let more = self.stream_run(s, rest, room, flush)?;
                return Ok(Step {
                    consumed: done.consumed + more.consumed,
                    produced: done.produced + more.produced,
                    end: more.end,
                });
            };
            let step = sent.step;
            if let Inner::Device { journal, .. } = &mut s.inner {
                journal.record(&rest[..sent.len], sent, &room[..step.produced]);
            }
            self.stats.offloaded += 1;
            self.stats.bytes_in += step.consumed as u64;
            self.stats.bytes_out += step.produced as u64;
            done.consumed += step.consumed;
            done.produced += step.produced;
            done.end = step.end;
            let capped = sent.room < room.len() && step.produced == sent.room;
            let all_in = sent.len == rest.len() && step.consumed == sent.len;
            let stalled = step.consumed == 0 && step.produced == 0;
            if step.end || stalled || !capped && (all_in || step.consumed < sent.len) {
                return Ok(done);
            }
        }
    }

    /// One request of a session: the call as sent and the device's
    /// answer (its output in `out`), or `None` when the session is gone
    /// with its host. `part`: the stream's [`Journal::cut`].
    fn session_call(
        &mut self,
        session: u64,
        key: LaneKey,
        part: Option<usize>,
        input: &[u8],
        out: &mut [u8],
        flush: Flush,
    ) -> Result<Option<Call>> {
        let Some(lane) = self.lane.as_mut().filter(|l| l.key() == key) else {
            return Ok(None);
        };
        // A request carries room up to what one part writes, and input:
        // compressing, up to one of the codec's parts (cut elsewhere, the
        // engine would see other calls than in one step of the codec's,
        // and could write other bytes); decompressing (the same bytes
        // however the input comes), about what the room takes: more would
        // be copied, and journaled, for nothing.
        let room = out.len().min(wd_zip_codec::PART_OUT);
        let len = match part {
            Some(part) => input.len().min(part),
            None => input.len().min(room.clamp(64 << 10, STREAM_INPUT_MAX)),
        };
        let half = len.max(room).max(32 << 10).next_power_of_two();
        lane.ensure_area(2 * half)?;
        let stage = lane.stage.as_ref().expect("ensured");
        stage.write(0, &input[..len]);
        // The flush goes with the call's last input (a flush mid-call
        // would be one the caller did not ask for).
        let flush = if len < input.len() {
            Flush::None
        } else {
            flush
        };
        let d = StreamOp {
            session,
            flush,
            src: stage.addr(),
            src_len: len as u64,
            dst: stage.addr() + half as u64,
            dst_len: room as u64,
        }
        .to_desc(0);
        let done = match lane.q.call(d) {
            Ok(d) if d.status != wrapdrive::STATUS_RESTARTED && lane.key() == key => d,
            _ => return Ok(None),
        };
        device_status(done.status)?;
        let r = Done::from_result(done.result);
        let step = Step {
            consumed: r.consumed as usize,
            produced: (r.produced as usize).min(room),
            end: r.end,
        };
        stage.read(half as u64, &mut out[..step.produced]);
        Ok(Some(Call {
            len,
            room,
            flush,
            step,
        }))
    }

    /// A device stream whose host went away, made again from its
    /// journal: in a session of the new host when a queue is to be had,
    /// else here when fallback is on. Otherwise the stream is gone.
    fn rebuild(&mut self, s: &mut Stream) -> Result<()> {
        let Inner::Device { journal, .. } = std::mem::replace(&mut s.inner, Inner::Gone) else {
            return Err(gone());
        };
        if journal.over {
            self.stats.streams_lost += 1;
            return Err(gone());
        }
        if self.cfg.policy != Policy::Cpu {
            if let Ok((session, key)) = self.open_session(&journal.params()) {
                let part = journal.cut();
                let replayed = journal.replay(|input, out, flush| {
                    self.session_call(session, key, part, input, out, flush)
                        .ok()
                        .flatten()
                        .map(|c| c.step)
                });
                if replayed {
                    self.stats.streams_rebuilt += 1;
                    s.inner = Inner::Device {
                        session,
                        lane: key,
                        journal,
                    };
                    return Ok(());
                }
                self.free_session(session, key);
            }
        }
        if self.cfg.fallback {
            let mut st = Box::new(wd_zip_codec::Stream::new(&journal.params())?);
            if journal.replay(|input, out, flush| st.run(input, out, flush).ok()) {
                self.stats.streams_rebuilt += 1;
                self.stats.cpu_fallback += 1;
                s.inner = Inner::Cpu(st);
                return Ok(());
            }
        }
        self.stats.streams_lost += 1;
        Err(gone())
    }

    fn free_session(&mut self, session: u64, key: LaneKey) {
        if let Some(lane) = self.lane.as_mut() {
            if lane.key() == key {
                let _ = lane.q.call(SessionFree { session }.to_desc(0));
            }
        }
    }

    /// Close a stream (its device session is freed; a stream of a host
    /// that went away has nothing left to free).
    pub fn close_stream(&mut self, s: Stream) {
        // A session id means something on its own compressor's queue only:
        // another's would free a session of one of its own streams. A
        // stream closed through the wrong compressor keeps its session
        // until its queue goes.
        if s.owner != self.id {
            return;
        }
        if let Inner::Device { session, lane, .. } = s.inner {
            self.free_session(session, lane);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wd_zip_msg::Algorithm;

    /// A journal of a stream run here in `piece`-byte calls.
    fn journal_of(data: &[u8], piece: usize, limit: usize) -> Journal {
        let p = StreamParams {
            alg: Algorithm::Gzip,
            compress: true,
            level: 6,
            window_bits: 0,
            dict: &[],
        };
        let mut j = Journal::new(&p, limit);
        let mut st = wd_zip_codec::Stream::new(&p).unwrap();
        let mut out = vec![0u8; 1000];
        for (i, input) in data.chunks(piece).enumerate() {
            let flush = if (i + 1) * piece >= data.len() {
                Flush::Finish
            } else {
                Flush::None
            };
            let mut at = 0;
            loop {
                let step = st.run(&input[at..], &mut out, flush).unwrap();
                let call = Call {
                    len: input.len() - at,
                    room: out.len(),
                    flush,
                    step,
                };
                j.record(&input[at..], call, &out[..step.produced]);
                at += step.consumed;
                if step.end || (flush == Flush::None && at == input.len()) {
                    break;
                }
            }
        }
        j
    }

    fn replays(j: &Journal) -> bool {
        let mut st = wd_zip_codec::Stream::new(&j.params()).unwrap();
        j.replay(|input, out, flush| st.run(input, out, flush).ok())
    }

    #[test]
    fn a_journal_replays_to_the_same_answers_and_bytes() {
        let data: Vec<u8> = (0..50_000u32).map(|i| (i * i % 251) as u8).collect();
        let j = journal_of(&data, 5000, usize::MAX);
        assert!(j.calls.len() > 8);
        assert!(replays(&j));
    }

    #[test]
    fn a_replay_that_differs_or_a_dropped_journal_is_refused() {
        let data: Vec<u8> = (0..50_000u32).map(|i| (i * i % 251) as u8).collect();
        // Another answer at one step.
        let mut j = journal_of(&data, 7000, usize::MAX);
        j.calls[3].step.produced += 1;
        assert!(!replays(&j));
        // The same answers, other bytes.
        let mut j = journal_of(&data, 7000, usize::MAX);
        j.crc.update(b"x");
        assert!(!replays(&j));
        // Past the limit: nothing kept.
        let j = journal_of(&data, 7000, 20_000);
        assert!(j.over && j.input.is_empty() && j.calls.is_empty());
        assert!(!replays(&j));
    }
}
