//! Deflate in pieces (`wd_zip_codec::pieces`): a large block cut between
//! the device and the caller, and a long stream compressed a piece at a
//! time while its input comes, each piece on the device and here at once.

use wd_route::{Policy, Why};
use wd_zip_codec::{compress_bound, pieces, CodecError, Engine};
use wd_zip_msg::{Algorithm, Done, OneShot, MAX_DATA};

use crate::{check_level, CompError, Compressor, Result};

/// A deflate, zlib or gzip stream compressed in pieces
/// ([`Compressor::compress_piece`]): its check value and length so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pieces {
    /// The framing's check value of the input so far.
    pub check: u32,
    /// Input bytes so far.
    pub len: u64,
}

/// The device's share of a block cut in two, in sixteenths, when the
/// caller's piece ends the stream: less than half, since the device also
/// walks its piece to end it open, and the caller copies it in and out
/// (6, 7 and 8 measured with python's `zlib.compress` of 64 KiB blocks, 7
/// the fastest). When both pieces end open both walk: half each.
const DEVICE_SIXTEENTHS: usize = 7;

/// The cookie of a piece in flight: none of a batch's (its slots) nor of
/// a stream's `call`s (the top [`wrapdrive::CALL_COOKIES`]), so a
/// completion some earlier request left behind is never taken for the
/// piece's.
const PIECE_COOKIE: u64 = u64::MAX - wrapdrive::CALL_COOKIES;

impl Compressor {
    /// A large deflate block cut in two pieces compressed at once, the
    /// first on the device and the rest here, joined into one stream:
    /// one caller thread keeps the engine and itself busy, as a batch
    /// does. The stream differs from the block compressed whole (the
    /// second piece starts without the first's history: 3.5% larger at
    /// level 1 on `wd bench zip`'s 64 KiB blocks of text, programs and
    /// sources, 0.6% on blocks of more programs); where the device fails
    /// its piece, or the joined stream does not fit, the block is
    /// compressed whole here (the bytes of the usual CPU path). `None`
    /// when the block is not cut (no queue, a policy, level or size that
    /// rules it out).
    pub(crate) fn compress_split(
        &mut self,
        alg: Algorithm,
        level: i8,
        input: &[u8],
        out: &mut [u8],
    ) -> Result<Option<usize>> {
        if !alg.is_deflate() || level == 0 || !self.cuts(input.len()) {
            return Ok(None);
        }
        let mut p = Pieces::default();
        self.compress_piece(alg, level, &mut p, input, out, true, true)
            .map(Some)
    }

    /// Whether a block of `len` bytes is cut between the device and here:
    /// the auto policy, cutting on, large enough, and a queue.
    pub(crate) fn cuts(&mut self, len: usize) -> bool {
        self.cuts_by_size(len) && self.lane().is_some()
    }

    /// [`Compressor::cuts`] but for the queue.
    fn cuts_by_size(&self, len: usize) -> bool {
        self.cfg.policy == Policy::Auto
            && self.cutting
            && self.cfg.split_min > 0
            && len >= self.cfg.split_min.max(self.cfg.threshold)
            && len as u64 <= MAX_DATA
    }

    /// Compress `input` as one piece of a stream of `alg` (deflate, zlib
    /// or gzip) into `out`: the framing's header first when `first`, the
    /// trailer after it when `last`; any other piece ends at a full flush
    /// point, so that a long stream can be handed out a piece at a time as
    /// its input comes (each piece starts without the history of the one
    /// before: a few percent larger at level 1 for pieces of 64 KiB, under
    /// one for pieces of MiBs). `p` carries the check value
    /// and length from piece to piece. Under the auto policy a piece of
    /// `split_min` bytes or more is cut between the device and here;
    /// under `offload` one at or above the threshold goes to the device
    /// whole; else it runs here.
    /// Room of [`compress_bound`] plus 20 bytes always suffices.
    #[allow(clippy::too_many_arguments)]
    pub fn compress_piece(
        &mut self,
        alg: Algorithm,
        level: i8,
        p: &mut Pieces,
        input: &[u8],
        out: &mut [u8],
        first: bool,
        last: bool,
    ) -> Result<usize> {
        if !alg.is_deflate() {
            return Err(CodecError::Param.into());
        }
        check_level(true, alg, level)?;
        let header = if first {
            pieces::header(alg, level)?
        } else {
            &[]
        };
        let h = header.len();
        let mut check = if first {
            pieces::check_init(alg)
        } else {
            p.check
        };
        check = pieces::check(alg, check, input);
        let len = if first { 0 } else { p.len } + input.len() as u64;
        let (t, tn) = match last {
            true => pieces::trailer(alg, check, len)?,
            false => ([0; 8], 0),
        };
        let body = out.len().checked_sub(h + tn).ok_or(CodecError::NoSpace)?;
        let room = &mut out[h..h + body];
        let policy = self.cfg.policy;
        // Whether the piece goes to the device (in part or whole) when a
        // queue is to be had: the threshold first, then the policy.
        let wants_device = match policy {
            Policy::Auto => self.cuts_by_size(input.len()),
            Policy::Offload => input.len() >= self.cfg.threshold && input.len() as u64 <= MAX_DATA,
            Policy::Cpu => false,
        };
        let no_queue = wants_device && self.lane().is_none();
        let tried = match policy {
            _ if !wants_device || no_queue => None,
            Policy::Auto => {
                let cut = input.len() * if last { DEVICE_SIXTEENTHS } else { 8 } / 16;
                Some((self.in_two(level, input, cut, last, room), true))
            }
            _ => Some((self.in_two(level, input, input.len(), last, room), false)),
        };
        let n = match tried {
            Some((Ok(n), cut)) => {
                match cut {
                    true => self.stats.split += 1,
                    false => self.stats.offloaded += 1,
                }
                n
            }
            // Whole here: too large cut for the room (it may fit whole), or
            // the device failed its piece (then only with fallback on; a
            // data error is the same error either way).
            Some((Err(miss), _)) => {
                let n = here(&mut self.cpu, level, input, last, room)?;
                match miss {
                    Miss::Room => self.stats.count_cpu(Why::Policy),
                    Miss::Device if self.cfg.fallback => self.stats.count_cpu(Why::HostGone),
                    Miss::Device => {
                        let why = "the zip device failed a piece of a stream".to_string();
                        return Err(CompError::NoQueue(why));
                    }
                }
                n
            }
            None => {
                let why = match policy {
                    _ if no_queue => Why::NoQueue,
                    Policy::Cpu => Why::Policy,
                    _ if input.len() < self.cfg.threshold => Why::Threshold,
                    _ => Why::Policy,
                };
                if why == Why::NoQueue && !self.cfg.fallback {
                    let why = self.no_lane.clone().unwrap_or_default();
                    return Err(CompError::NoQueue(why));
                }
                let n = here(&mut self.cpu, level, input, last, room)?;
                self.stats.count_cpu(why);
                n
            }
        };
        out[..h].copy_from_slice(header);
        out[h + n..h + n + tn].copy_from_slice(&t[..tn]);
        *p = Pieces { check, len };
        self.stats.count_bytes(input.len(), h + n + tn);
        Ok(h + n + tn)
    }

    /// Raw deflate of `input` into `out`: the first `cut` bytes on the
    /// device (ending open), the rest here at once (ending the stream when
    /// `last`, else open too); the bytes written.
    fn in_two(
        &mut self,
        level: i8,
        input: &[u8],
        cut: usize,
        last: bool,
        out: &mut [u8],
    ) -> std::result::Result<usize, Miss> {
        let room = compress_bound(Algorithm::Deflate, cut) + 5;
        let lane = self.lane().ok_or(Miss::Device)?;
        lane.ensure_area(cut + room).map_err(|_| Miss::Device)?;
        let stage = lane.stage.as_ref().expect("ensured");
        stage.write(0, &input[..cut]);
        let d = OneShot {
            compress: true,
            alg: Algorithm::Deflate,
            level,
            max_ratio: 0,
            src: stage.addr(),
            src_len: cut as u64,
            dst: stage.addr() + cut as u64,
            dst_len: room as u64,
            piece: true,
        }
        .to_desc(0);
        lane.q.send(d, PIECE_COOKIE).map_err(|_| Miss::Device)?;
        // The rest here meanwhile.
        let mut rest = std::mem::take(&mut self.piece);
        rest.clear();
        let tail = &input[cut..];
        let made = match (last, tail.is_empty()) {
            // A stream whose device piece is all of it ends on this.
            (true, true) => {
                rest.extend_from_slice(&pieces::CLOSE);
                Ok(())
            }
            (false, true) => Ok(()),
            (true, false) => self
                .cpu
                .compress_vec(Algorithm::Deflate, level, tail, &mut rest)
                .map(|_| ()),
            (false, false) => {
                rest.resize(compress_bound(Algorithm::Deflate, tail.len()) + 5, 0);
                let r = self.cpu.compress_piece(level, tail, &mut rest);
                rest.truncate(*r.as_ref().unwrap_or(&0));
                r.map(|_| ())
            }
        };
        let first = self.recv_piece(room);
        let joined = match (made, first) {
            (Ok(()), Some(a)) if a + rest.len() <= out.len() => {
                let stage = self.lane.as_ref().and_then(|l| l.stage.as_ref());
                stage
                    .expect("the piece came back")
                    .read(cut as u64, &mut out[..a]);
                out[a..a + rest.len()].copy_from_slice(&rest);
                Ok(a + rest.len())
            }
            (Ok(()), Some(_)) | (Err(CodecError::NoSpace), _) => Err(Miss::Room),
            _ => Err(Miss::Device),
        };
        self.piece = rest;
        joined
    }

    /// The completion of the one piece in flight on the lane: the bytes
    /// it wrote; `None` if the device failed it or the queue failed (that
    /// queue is dropped, as in a batch).
    fn recv_piece(&mut self, room: usize) -> Option<usize> {
        let lane = self.lane.as_mut().expect("a piece was sent");
        let c = loop {
            match lane.q.recv_cookie(PIECE_COOKIE) {
                Ok(Some(c)) => break c,
                Ok(None) => {}
                Err(e) => {
                    self.lost(e.to_string());
                    return None;
                }
            }
            if let Err(e) = lane.wait() {
                self.lost(e.to_string());
                return None;
            }
        };
        if c.desc.status != 0 {
            return None;
        }
        let produced = Done::from_result(c.desc.result).produced as usize;
        (produced <= room).then_some(produced)
    }
}

/// Why a block was not cut in two after all.
enum Miss {
    /// The device could not take its piece, or failed it.
    Device,
    /// The two pieces do not fit the room.
    Room,
}

/// Raw deflate of a piece on this thread's engine, ending the stream when
/// `last`, else open.
fn here(cpu: &mut Engine, level: i8, input: &[u8], last: bool, out: &mut [u8]) -> Result<usize> {
    Ok(match last {
        true => cpu.compress(Algorithm::Deflate, level, input, out)?,
        false => cpu.compress_piece(level, input, out)?,
    })
}
