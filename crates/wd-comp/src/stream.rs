//! Streams: compression or decompression whose state carries across
//! calls, with zlib's flush modes. A stream opened where a queue is to be
//! had keeps its state in a session of the zip device; otherwise (policy
//! `cpu`, no host, no zip device) in this thread, on the same engine the
//! device uses. A device stream's state lives in the host: when the host
//! restarts, the stream cannot go on and its next call fails with
//! [`Status::HostGone`] (the state is lost with the host; a new stream
//! starts on the new one).

use wd_zip_codec::{CodecError, StreamParams};
use wd_zip_msg::{Done, Flush, SessionFree, SessionNew, StreamOp};
use wrapdrive::{ClientError, Status};

use crate::{device_status, CompError, Compressor, Policy, Result};

pub use wd_zip_codec::Step;

enum Inner {
    /// A session of the zip device, on the queue of this epoch.
    Device { session: u64, epoch: u64 },
    /// State in this thread.
    Cpu(Box<wd_zip_codec::Stream>),
    /// Closed, or its host went away.
    Gone,
}

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

impl Stream {
    /// Whether the stream's state is on the device.
    pub fn on_device(&self) -> bool {
        matches!(self.inner, Inner::Device { .. })
    }
}

fn gone() -> CompError {
    CompError::Device(ClientError::new(
        Status::HostGone,
        "the stream's state was on a host that went away; start a new stream",
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
            match self.open_device_stream(p) {
                Ok(s) => return Ok(s),
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

    fn open_device_stream(&mut self, p: &StreamParams<'_>) -> Result<Stream> {
        let owner = self.id;
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
        Ok(Stream {
            inner: Inner::Device {
                session: done.result,
                epoch: lane.q.epoch(),
            },
            owner,
        })
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
        let (session, epoch) = match &mut s.inner {
            Inner::Cpu(st) => {
                let step = st.run(input, out, flush)?;
                self.stats.bytes_in += step.consumed as u64;
                self.stats.bytes_out += step.produced as u64;
                return Ok(step);
            }
            Inner::Gone => return Err(gone()),
            Inner::Device { session, epoch } => (*session, *epoch),
        };
        let Some(lane) = self.lane.as_mut() else {
            s.inner = Inner::Gone;
            return Err(gone());
        };
        if lane.q.epoch() != epoch {
            s.inner = Inner::Gone;
            return Err(gone());
        }
        // One request takes at most a slot: half input, half output.
        let half = (lane.slot.max(64 << 10)) / 2;
        lane.ensure(2 * half, 1)?;
        let stage = lane.stage.as_ref().expect("ensured");
        let take = input.len().min(half);
        let room = out.len().min(half);
        stage.write(0, &input[..take]);
        // Finishing with input held back is not finishing yet.
        let flush = if take < input.len() && flush == Flush::Finish {
            Flush::None
        } else {
            flush
        };
        let d = StreamOp {
            session,
            flush,
            src: stage.addr(),
            src_len: take as u64,
            dst: stage.addr() + half as u64,
            dst_len: room as u64,
        }
        .to_desc(0);
        let done = lane.q.call(d);
        let done = match done {
            Ok(d) if d.status == wrapdrive::STATUS_RESTARTED || lane.q.epoch() != epoch => {
                s.inner = Inner::Gone;
                return Err(gone());
            }
            Ok(d) => d,
            Err(e) => {
                s.inner = Inner::Gone;
                return Err(e.into());
            }
        };
        device_status(done.status)?;
        let r = Done::from_result(done.result);
        let produced = (r.produced as usize).min(room);
        stage.read(half as u64, &mut out[..produced]);
        self.stats.offloaded += 1;
        self.stats.bytes_in += r.consumed;
        self.stats.bytes_out += produced as u64;
        Ok(Step {
            consumed: r.consumed as usize,
            produced,
            end: r.end,
        })
    }

    /// Close a stream (its device session is freed; a stream of a host
    /// that went away has nothing left to free).
    pub fn close_stream(&mut self, s: Stream) {
        if let Inner::Device { session, epoch } = s.inner {
            if let Some(lane) = self.lane.as_mut() {
                if lane.q.epoch() == epoch {
                    let _ = lane.q.call(SessionFree { session }.to_desc(0));
                }
            }
        }
    }
}
