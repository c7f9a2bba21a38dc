//! The control channel: protocol frames, with their file descriptors, over a
//! connected UNIX stream socket.
//!
//! Reads are buffered so a small request costs one `recvmsg`; descriptors
//! are matched to the frame they arrived with and a frame that carries the
//! wrong number of them is a protocol error (the extra ones are closed).
//! The kernel ends a read right after the bytes that carried descriptors,
//! the first of the frame they were sent with: so descriptors belong to
//! the frame in which the read that brought them ended.
#![deny(unsafe_code)]

use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Instant;

use wd_proto::{limits, Header, Message, ProtoError, HEADER_LEN};
use wd_sys::SysError;

/// Errors of the control channel.
#[derive(Debug, thiserror::Error)]
pub enum IpcError {
    /// The peer closed the connection.
    #[error("connection closed by peer")]
    Closed,
    /// The bytes received are not a valid frame.
    #[error("protocol error: {0}")]
    Proto(#[from] ProtoError),
    /// The bytes where a frame should begin are not a frame header: no
    /// later frame can be found (the channel is of no more use; see
    /// [`IpcError::out_of_step`]).
    #[error("protocol error: not a frame header ({0}); the stream is out of step")]
    Header(ProtoError),
    /// A frame came with the wrong number of file descriptors.
    #[error("{kind} carries {got} file descriptors, expected {want}")]
    Fds {
        /// Message name.
        kind: &'static str,
        /// Descriptors received.
        got: usize,
        /// Descriptors the message kind carries.
        want: usize,
    },
    /// A frame did not arrive whole by the deadline given to
    /// [`Channel::recv_by`].
    #[error("no whole frame arrived in time")]
    TimedOut,
    /// A reply answered another request.
    #[error("reply for request {got} while waiting for request {want}")]
    Unexpected {
        /// The request id sent.
        want: u32,
        /// The request id answered.
        got: u32,
    },
    /// Descriptors the peer sent could not be received: this process is
    /// at its open-file limit. The bytes that came with them are lost,
    /// so the stream is out of step.
    #[error("descriptors the peer sent could not be received: this process is at its open-file limit (ulimit -n)")]
    FdsLost,
    /// A socket call failed.
    #[error(transparent)]
    Sys(#[from] SysError),
}

impl IpcError {
    /// Whether the channel's stream can no longer be followed: a header
    /// that does not decode, or a reply to another request (a reply lost
    /// or one too many: every later call would take its neighbour's).
    /// Drop the channel; a frame whose body alone is bad is not one.
    pub fn out_of_step(&self) -> bool {
        matches!(
            self,
            IpcError::Header(_) | IpcError::Unexpected { .. } | IpcError::FdsLost
        )
    }
}

/// One decoded frame and the descriptors that came with it.
#[derive(Debug)]
pub struct Frame {
    /// Request id from the header (replies echo it).
    pub request_id: u32,
    /// The message.
    pub msg: Message,
    /// Attached descriptors, exactly `msg.fds_expected()` of them.
    pub fds: Vec<OwnedFd>,
}

const READ_CHUNK: usize = 64 * 1024;

/// A framed, descriptor-carrying channel over a UNIX stream.
#[derive(Debug)]
pub struct Channel {
    sock: UnixStream,
    buf: Vec<u8>,
    start: usize,
    /// Stream offset of `buf[0]`.
    base: u64,
    /// Descriptors received, each with the stream offset where the read
    /// that brought it ended.
    fds: VecDeque<(u64, OwnedFd)>,
}

impl Channel {
    /// Wrap a connected stream.
    pub fn new(sock: UnixStream) -> Channel {
        Channel {
            sock,
            buf: Vec::with_capacity(READ_CHUNK),
            start: 0,
            base: 0,
            fds: VecDeque::new(),
        }
    }

    /// The underlying socket (for poll and peer credentials).
    pub fn socket(&self) -> &UnixStream {
        &self.sock
    }

    /// Whether a whole or partial frame is already buffered (then `recv`
    /// may not need the socket to become readable).
    pub fn has_buffered(&self) -> bool {
        !self.available().is_empty()
    }

    /// Send one message with its descriptors.
    pub fn send(
        &self,
        msg: &Message,
        request_id: u32,
        fds: &[BorrowedFd<'_>],
    ) -> Result<(), IpcError> {
        self.send_by(msg, request_id, fds, None)
    }

    /// [`Channel::send`], the whole frame written by `by` (a `Sys` error
    /// that [`wd_sys::SysError::timed_out`] after): a peer reading a large
    /// frame a little at a time cannot hold the sender past it. Sets the
    /// socket's write timeout.
    pub fn send_by(
        &self,
        msg: &Message,
        request_id: u32,
        fds: &[BorrowedFd<'_>],
        by: Option<Instant>,
    ) -> Result<(), IpcError> {
        if fds.len() != msg.fds_expected() {
            return Err(IpcError::Fds {
                kind: msg.name(),
                got: fds.len(),
                want: msg.fds_expected(),
            });
        }
        let bytes = wd_proto::encode(msg, request_id)?;
        wd_sys::send_with_fds_by(&self.sock, &bytes, fds, by)?;
        Ok(())
    }

    fn available(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    fn fill(&mut self, by: Option<Instant>) -> Result<(), IpcError> {
        if let Some(by) = by {
            // One deadline for the whole frame, not one per read: a frame
            // trickled a byte at a time must not outlive it. Waited for
            // with poll, so the socket's own read timeout is never
            // touched (setting and restoring it cost three system calls
            // a frame).
            loop {
                let left = by.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(IpcError::TimedOut);
                }
                let ready = wd_sys::poll(&[self.sock.as_fd()], Some(left))?;
                if ready[0].readable || ready[0].hangup {
                    break;
                }
            }
        }
        if self.start > 0 && self.start == self.buf.len() || self.start > READ_CHUNK {
            self.buf.drain(..self.start);
            self.base += self.start as u64;
            self.start = 0;
        }
        let old = self.buf.len();
        self.buf.resize(old + READ_CHUNK, 0);
        let r = wd_sys::recv_with_fds(&self.sock, &mut self.buf[old..], limits::MAX_FDS);
        let (n, fds) = match r {
            Ok(v) => v,
            Err(e) => {
                self.buf.truncate(old);
                if by.is_some() && e.timed_out() {
                    return Err(IpcError::TimedOut);
                }
                if matches!(e, SysError::FdsLost) {
                    return Err(IpcError::FdsLost);
                }
                // More descriptors than a frame may carry came in one
                // read (closed already): the peer's frame is at fault,
                // not the socket, and it hears so.
                if matches!(e, SysError::Invalid { .. }) {
                    return Err(IpcError::Fds {
                        kind: "frame",
                        got: limits::MAX_FDS + 1,
                        want: limits::MAX_FDS,
                    });
                }
                return Err(e.into());
            }
        };
        self.buf.truncate(old + n);
        if n == 0 {
            return Err(IpcError::Closed);
        }
        let end = self.base + self.buf.len() as u64;
        self.fds.extend(fds.into_iter().map(|fd| (end, fd)));
        if self.fds.len() > limits::MAX_FDS {
            return Err(IpcError::Fds {
                kind: "frame",
                got: self.fds.len(),
                want: limits::MAX_FDS,
            });
        }
        Ok(())
    }

    /// Receive the next frame (blocking).
    pub fn recv(&mut self) -> Result<Frame, IpcError> {
        self.recv_by(None)
    }

    /// Receive the next frame, whole by `by` ([`IpcError::TimedOut`]
    /// after it). The socket's own read timeout is left as it is.
    pub fn recv_by(&mut self, by: Option<Instant>) -> Result<Frame, IpcError> {
        while self.available().len() < HEADER_LEN {
            self.fill(by)?;
        }
        let hbytes: [u8; HEADER_LEN] = self.available()[..HEADER_LEN]
            .try_into()
            .expect("header length");
        let header: Header = wd_proto::decode_header(&hbytes).map_err(IpcError::Header)?;
        let total = HEADER_LEN + header.body_len as usize;
        while self.available().len() < total {
            self.fill(by)?;
        }
        let msg = wd_proto::decode_body(&header, &self.available()[HEADER_LEN..total]);
        // The frame is consumed either way: its header told its length, so
        // a body that does not decode is this frame's error, not every
        // later one's. Its descriptors go with it.
        let from = self.base + self.start as u64;
        self.start += total;
        let to = self.base + self.start as u64;
        let mut fds = Vec::new();
        while self.fds.front().is_some_and(|&(end, _)| end <= to) {
            let (end, fd) = self.fds.pop_front().expect("looked at");
            // (Earlier frames took theirs: none ends before this one.)
            if end > from {
                fds.push(fd);
            }
        }
        let msg = msg?;
        let want = msg.fds_expected();
        if fds.len() != want {
            // Closed with `fds`.
            return Err(IpcError::Fds {
                kind: msg.name(),
                got: fds.len(),
                want,
            });
        }
        Ok(Frame {
            request_id: header.request_id,
            msg,
            fds,
        })
    }

    /// Send a request and wait for its reply (replies come in order).
    pub fn call(
        &mut self,
        msg: &Message,
        request_id: u32,
        fds: &[BorrowedFd<'_>],
    ) -> Result<Frame, IpcError> {
        self.call_by(msg, request_id, fds, None)
    }

    /// [`Channel::call`] with the request written and the reply come
    /// `by` then ([`IpcError::TimedOut`] after, or a `Sys` error that
    /// [`wd_sys::SysError::timed_out`] while writing: a peer reading a
    /// large request slowly cannot stretch the call past it).
    pub fn call_by(
        &mut self,
        msg: &Message,
        request_id: u32,
        fds: &[BorrowedFd<'_>],
        by: Option<Instant>,
    ) -> Result<Frame, IpcError> {
        if let Err(e) = self.send_by(msg, request_id, fds, by) {
            // Nothing was sent: the peer has nothing to answer.
            if !matches!(e, IpcError::Sys(SysError::Call { .. })) {
                return Err(e);
            }
            // A peer that refused us (too many connections, a quota, no
            // Hello in time) says why before it closes: that reason beats
            // the EPIPE our write got.
            return match self.recv_by(by) {
                Ok(f) if matches!(f.msg, Message::Error { .. }) => Ok(f),
                _ => Err(e),
            };
        }
        let f = self.recv_by(by)?;
        // Request id 0 is the host's unsolicited refusal of the connection.
        let refusal = f.request_id == 0 && matches!(f.msg, Message::Error { .. });
        if f.request_id != request_id && !refusal {
            return Err(IpcError::Unexpected {
                want: request_id,
                got: f.request_id,
            });
        }
        Ok(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    /// A frame that carries one descriptor.
    fn share(iova: u64) -> Message {
        Message::MemShare {
            queue_id: 1,
            iova,
            size: 4096,
            fd_offset: 0,
            prot: wd_proto::Prot::RW,
        }
    }

    fn pair() -> (Channel, Channel) {
        let (a, b) = UnixStream::pair().unwrap();
        (Channel::new(a), Channel::new(b))
    }

    /// A frame whose header is sound and whose body does not decode is
    /// its own error: the next frame is received. It stayed in the buffer,
    /// every later receive failing alike (a client kept such a connection,
    /// each call after failing).
    #[test]
    fn an_undecodable_body_is_skipped() {
        let (mut a, b) = pair();
        let mut bad = wd_proto::encode(
            &Message::ListAttrs {
                prefix: "abc".into(),
            },
            7,
        )
        .unwrap();
        bad[HEADER_LEN + 2] = 0xff; // not UTF-8
        let good = wd_proto::encode(&Message::ReleaseQueue { queue_id: 9 }, 8).unwrap();
        let mut raw = b.socket().try_clone().unwrap();
        raw.write_all(&bad).unwrap();
        raw.write_all(&good).unwrap();
        assert!(matches!(a.recv(), Err(IpcError::Proto(_))));
        let f = a.recv().unwrap();
        assert_eq!(
            (f.request_id, f.msg),
            (8, Message::ReleaseQueue { queue_id: 9 })
        );
    }

    /// A frame sent without the descriptor it needs, then one sent with
    /// its own: the first is refused, the second gets its descriptor (the
    /// kernel hands both frames' bytes over in one read, and the first
    /// took the second's descriptor).
    #[test]
    fn a_frame_does_not_take_the_next_frames_descriptors() {
        let (mut a, b) = pair();
        let mut raw = b.socket().try_clone().unwrap();
        raw.write_all(&wd_proto::encode(&share(0x1000), 1).unwrap())
            .unwrap();
        let fd = wd_sys::eventfd().unwrap();
        b.send(&share(0x2000), 2, &[fd.as_fd()]).unwrap();
        assert!(matches!(
            a.recv(),
            Err(IpcError::Fds {
                got: 0,
                want: 1,
                ..
            })
        ));
        let f = a.recv().unwrap();
        assert_eq!((f.request_id, f.fds.len()), (2, 1));
    }

    /// A frame with descriptors followed at once by frames without: each
    /// gets its own (the read that brought the descriptors ends with the
    /// frame that carried them).
    #[test]
    fn descriptors_stay_with_their_frame_among_others() {
        let (mut a, b) = pair();
        let share = share(0x1000);
        let plain = Message::ReleaseQueue { queue_id: 9 };
        let fd = wd_sys::eventfd().unwrap();
        b.send(&plain, 1, &[]).unwrap();
        b.send(&share, 2, &[fd.as_fd()]).unwrap();
        b.send(&plain, 3, &[]).unwrap();
        b.send(&share, 4, &[fd.as_fd()]).unwrap();
        b.send(&share, 5, &[fd.as_fd()]).unwrap();
        b.send(&plain, 6, &[]).unwrap();
        for (id, n) in [(1, 0), (2, 1), (3, 0), (4, 1), (5, 1), (6, 0)] {
            let f = a.recv().unwrap();
            assert_eq!((f.request_id, f.fds.len()), (id, n));
        }
    }

    #[test]
    fn frames_split_across_reads_and_descriptors_travel() {
        let (mut a, b) = pair();
        // A frame written a byte at a time still arrives whole.
        let bytes = wd_proto::encode(&Message::ReleaseQueue { queue_id: 9 }, 3).unwrap();
        let mut raw = b.socket().try_clone().unwrap();
        for byte in &bytes {
            raw.write_all(std::slice::from_ref(byte)).unwrap();
        }
        let f = a.recv().unwrap();
        assert_eq!(
            (f.request_id, f.msg),
            (3, Message::ReleaseQueue { queue_id: 9 })
        );
        // A descriptor goes with the message that expects it.
        let fd = wd_sys::eventfd().unwrap();
        let share = share(0x1000);
        b.send(&share, 4, &[fd.as_fd()]).unwrap();
        let f = a.recv().unwrap();
        assert_eq!(f.fds.len(), 1);
        // The wrong number of descriptors is refused before anything is sent.
        assert!(matches!(
            b.send(&share, 5, &[]),
            Err(IpcError::Fds {
                want: 1,
                got: 0,
                ..
            })
        ));
    }

    #[test]
    fn a_refusal_answers_the_call_even_when_the_request_cannot_be_sent() {
        let (mut client, host) = pair();
        // The host refuses at once (request id 0) and hangs up.
        host.send(
            &Message::error(wd_proto::Status::Quota, "over the limit"),
            0,
            &[],
        )
        .unwrap();
        drop(host);
        let hello = Message::Hello {
            version: wd_proto::PROTOCOL_VERSION,
            client_pid: 0,
        };
        let f = client.call(&hello, 1, &[]).unwrap();
        match f.msg {
            Message::Error { status, message } => {
                assert_eq!(status, wd_proto::Status::Quota);
                assert_eq!(message, "over the limit");
            }
            m => panic!("unexpected {m:?}"),
        }
    }

    #[test]
    fn a_reply_to_another_request_is_refused() {
        let (mut client, host) = pair();
        host.send(&Message::Ok, 5, &[]).unwrap();
        assert!(matches!(
            client.call(
                &Message::ListAttrs {
                    prefix: String::new()
                },
                1,
                &[]
            ),
            Err(IpcError::Unexpected { want: 1, got: 5 })
        ));
    }
}
