//! Encoding and decoding of frames. Little-endian throughout; strings are a
//! u16 length + UTF-8, byte vectors a u32 length, lists a u32 count.

use crate::limits::*;
use crate::{
    AttrEntry, FaultEvent, Header, Message, Prot, ProtoError, Status, VirtioReq, HEADER_LEN, MAGIC,
    PROTOCOL_VERSION,
};

const MAX_KIND: u16 = 25;

/// Decode and check a frame header.
pub fn decode_header(b: &[u8; HEADER_LEN]) -> Result<Header, ProtoError> {
    let magic = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    if magic != MAGIC {
        return Err(ProtoError::BadMagic(magic));
    }
    let version = u16::from_le_bytes([b[4], b[5]]);
    if version != PROTOCOL_VERSION {
        return Err(ProtoError::Version(version));
    }
    let kind = u16::from_le_bytes([b[6], b[7]]);
    if kind == 0 || kind > MAX_KIND {
        return Err(ProtoError::UnknownKind(kind));
    }
    let body_len = u32::from_le_bytes([b[12], b[13], b[14], b[15]]);
    if body_len as usize > MAX_BODY {
        return Err(ProtoError::TooBig(body_len));
    }
    Ok(Header {
        version,
        kind,
        request_id: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
        body_len,
    })
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], ProtoError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or(ProtoError::Truncated(what))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self, what: &'static str) -> Result<u8, ProtoError> {
        Ok(self.take(1, what)?[0])
    }

    /// A byte decoded into its typed value; an unknown value is refused.
    fn wire<T: TryFrom<u8>>(&mut self, what: &'static str) -> Result<T, ProtoError> {
        T::try_from(self.u8(what)?).map_err(|_| ProtoError::Invalid(what))
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, ProtoError> {
        Ok(u16::from_le_bytes(
            self.take(2, what)?.try_into().expect("2 bytes"),
        ))
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, ProtoError> {
        Ok(u32::from_le_bytes(
            self.take(4, what)?.try_into().expect("4 bytes"),
        ))
    }
    fn i32(&mut self, what: &'static str) -> Result<i32, ProtoError> {
        Ok(self.u32(what)? as i32)
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, ProtoError> {
        Ok(u64::from_le_bytes(
            self.take(8, what)?.try_into().expect("8 bytes"),
        ))
    }
    fn bool(&mut self, what: &'static str) -> Result<bool, ProtoError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(ProtoError::Invalid(what)),
        }
    }
    fn string(&mut self, what: &'static str, max: usize) -> Result<String, ProtoError> {
        let n = self.u16(what)? as usize;
        if n > max {
            return Err(ProtoError::Limit {
                field: what,
                len: n,
                max,
            });
        }
        let s = self.take(n, what)?;
        String::from_utf8(s.to_vec()).map_err(|_| ProtoError::Invalid(what))
    }
    fn name(&mut self, what: &'static str, max: usize) -> Result<String, ProtoError> {
        let s = self.string(what, max)?;
        if s.is_empty() {
            return Err(ProtoError::Invalid(what));
        }
        Ok(s)
    }
    fn bytes(&mut self, what: &'static str, max: usize) -> Result<Vec<u8>, ProtoError> {
        let n = self.u32(what)? as usize;
        if n > max {
            return Err(ProtoError::Limit {
                field: what,
                len: n,
                max,
            });
        }
        Ok(self.take(n, what)?.to_vec())
    }
    fn count(
        &mut self,
        what: &'static str,
        max: usize,
        min_item: usize,
    ) -> Result<usize, ProtoError> {
        let n = self.u32(what)? as usize;
        if n > max {
            return Err(ProtoError::Limit {
                field: what,
                len: n,
                max,
            });
        }
        // Never reserve more than the bytes present could hold.
        if n.saturating_mul(min_item) > self.b.len() - self.at {
            return Err(ProtoError::Truncated(what));
        }
        Ok(n)
    }
}

/// A share must grant some access.
fn prot_ok(p: Prot) -> bool {
    p != Prot::NONE
}

/// Decode a body whose header was already checked.
pub fn decode_body(h: &Header, body: &[u8]) -> Result<Message, ProtoError> {
    if body.len() != h.body_len as usize {
        return Err(ProtoError::Truncated("body"));
    }
    let mut r = Reader { b: body, at: 0 };
    let m = match h.kind {
        1 => Message::Hello {
            version: r.u16("version")?,
            client_pid: r.u32("client_pid")?,
        },
        2 => Message::HelloReply {
            version: r.u16("version")?,
            host_pid: r.u32("host_pid")?,
            features: r.u64("features")?,
        },
        3 => Message::ListAttrs {
            prefix: r.string("prefix", MAX_PATH)?,
        },
        4 => {
            let n = r.count("attrs", MAX_ATTRS, 5)?;
            let mut entries = Vec::with_capacity(n);
            for _ in 0..n {
                entries.push(AttrEntry {
                    path: r.name("path", MAX_PATH)?,
                    value: r.string("value", MAX_VALUE)?,
                    writable: r.bool("writable")?,
                });
            }
            Message::Attrs { entries }
        }
        5 => Message::GetAttr {
            path: r.name("path", MAX_PATH)?,
        },
        6 => Message::AttrValue {
            value: r.string("value", MAX_VALUE)?,
        },
        7 => Message::SetAttr {
            path: r.name("path", MAX_PATH)?,
            value: r.string("value", MAX_VALUE)?,
        },
        8 => Message::RequestQueue {
            alg: r.name("alg", MAX_NAME)?,
            flags: r.u32("flags")?,
            depth: r.u32("depth")?,
            numa_node: r.i32("numa_node")?,
            probe_addr: r.u64("probe_addr")?,
            probe_value: r.u64("probe_value")?,
        },
        9 => Message::QueueGranted {
            queue_id: r.u32("queue_id")?,
            device: r.name("device", MAX_NAME)?,
            device_api: r.u32("device_api")?,
            depth: r.u32("depth")?,
            desc_size: r.u32("desc_size")?,
            ring_bytes: r.u64("ring_bytes")?,
            flags: r.u32("flags")?,
        },
        10 => Message::ReleaseQueue {
            queue_id: r.u32("queue_id")?,
        },
        11 => {
            let m = Message::MemShare {
                queue_id: r.u32("queue_id")?,
                iova: r.u64("iova")?,
                size: r.u64("size")?,
                fd_offset: r.u64("fd_offset")?,
                prot: r.wire("prot")?,
            };
            if let Message::MemShare { prot, .. } = m {
                if !prot_ok(prot) {
                    return Err(ProtoError::Invalid("prot"));
                }
            }
            m
        }
        12 => Message::MemUnshare {
            queue_id: r.u32("queue_id")?,
            iova: r.u64("iova")?,
            size: r.u64("size")?,
        },
        13 => Message::ReadFaults {
            queue_id: r.u32("queue_id")?,
            max: r.u32("max")?,
        },
        14 => {
            let total = r.u64("total")?;
            let lost = r.u64("lost")?;
            let n = r.count("faults", MAX_FAULTS, 22)?;
            let mut events = Vec::with_capacity(n);
            for _ in 0..n {
                let e = FaultEvent {
                    seq: r.u64("seq")?,
                    iova: r.u64("iova")?,
                    pasid: r.u32("pasid")?,
                    access: r.wire("access")?,
                    reason: r.wire("reason")?,
                };
                events.push(e);
            }
            Message::Faults {
                total,
                lost,
                events,
            }
        }
        15 => Message::Legacy {
            queue_id: r.u32("queue_id")?,
            desc: r.bytes("desc", MAX_DESC)?,
            payload: r.bytes("payload", MAX_PAYLOAD)?,
        },
        16 => Message::LegacyReply {
            desc: r.bytes("desc", MAX_DESC)?,
            payload: r.bytes("payload", MAX_PAYLOAD)?,
        },
        17 => Message::Ok,
        18 => {
            let status = Status::from_u16(r.u16("status")?)
                .filter(|s| *s != Status::Ok)
                .ok_or(ProtoError::Invalid("status"))?;
            Message::Error {
                status,
                message: r.string("message", MAX_MESSAGE)?,
            }
        }
        19 => Message::IommuPolicy {
            queue_id: r.u32("queue_id")?,
            mode: r.wire("mode")?,
            fault_policy: r.wire("fault_policy")?,
        },
        20 => Message::FaultResume {
            queue_id: r.u32("queue_id")?,
            stag: r.u64("stag")?,
            retry: r.bool("retry")?,
        },
        21 => {
            let n = r.count("virtio requests", MAX_VIRTIO_REQS, 8)?;
            let mut requests = Vec::with_capacity(n);
            for _ in 0..n {
                let readable = r.bytes("virtio readable", MAX_VIRTIO_READABLE)?;
                let writable_len = r.u32("virtio writable_len")?;
                if writable_len as usize > MAX_VIRTIO_WRITABLE {
                    return Err(ProtoError::Limit {
                        field: "virtio writable_len",
                        len: writable_len as usize,
                        max: MAX_VIRTIO_WRITABLE,
                    });
                }
                requests.push(VirtioReq {
                    readable,
                    writable_len,
                });
            }
            Message::VirtioKick { requests }
        }
        22 => {
            let n = r.count("virtio used", MAX_VIRTIO_REQS, 4)?;
            let mut used = Vec::with_capacity(n);
            for _ in 0..n {
                used.push(r.bytes("virtio written", MAX_VIRTIO_WRITABLE)?);
            }
            Message::VirtioUsed { used }
        }
        23 => Message::VirtioConfig {
            offset: r.u32("offset")?,
            data: r.bytes("config data", MAX_VIRTIO_CONFIG)?,
        },
        24 => Message::VirtioConfigReply {
            features: r.u64("features")?,
            config: r.bytes("config", MAX_VIRTIO_CONFIG)?,
        },
        25 => Message::PeekFaults {
            queue_id: r.u32("queue_id")?,
            max: r.u32("max")?,
        },
        k => return Err(ProtoError::UnknownKind(k)),
    };
    if r.at != body.len() {
        return Err(ProtoError::Trailing(body.len() - r.at));
    }
    Ok(m)
}

/// Decode a whole frame held in one buffer (tests, fuzzing).
pub fn decode_frame(bytes: &[u8]) -> Result<(Header, Message), ProtoError> {
    let hb: &[u8; HEADER_LEN] = bytes
        .get(..HEADER_LEN)
        .and_then(|s| s.try_into().ok())
        .ok_or(ProtoError::Truncated("header"))?;
    let h = decode_header(hb)?;
    let body = &bytes[HEADER_LEN..];
    if body.len() < h.body_len as usize {
        return Err(ProtoError::Truncated("body"));
    }
    if body.len() > h.body_len as usize {
        return Err(ProtoError::Trailing(body.len() - h.body_len as usize));
    }
    Ok((h, decode_body(&h, body)?))
}

struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn string(
        &mut self,
        s: &str,
        field: &'static str,
        max: usize,
        nonempty: bool,
    ) -> Result<(), ProtoError> {
        if s.len() > max {
            return Err(ProtoError::Limit {
                field,
                len: s.len(),
                max,
            });
        }
        if nonempty && s.is_empty() {
            return Err(ProtoError::Invalid(field));
        }
        self.u16(s.len() as u16);
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
    fn bytes(&mut self, b: &[u8], field: &'static str, max: usize) -> Result<(), ProtoError> {
        if b.len() > max {
            return Err(ProtoError::Limit {
                field,
                len: b.len(),
                max,
            });
        }
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
        Ok(())
    }
    fn count(&mut self, n: usize, field: &'static str, max: usize) -> Result<(), ProtoError> {
        if n > max {
            return Err(ProtoError::Limit { field, len: n, max });
        }
        self.u32(n as u32);
        Ok(())
    }
}

/// Encode a message as one frame.
pub fn encode(msg: &Message, request_id: u32) -> Result<Vec<u8>, ProtoError> {
    let mut w = Writer(Vec::with_capacity(64));
    w.0.resize(HEADER_LEN, 0);
    match msg {
        Message::Hello {
            version,
            client_pid,
        } => {
            w.u16(*version);
            w.u32(*client_pid);
        }
        Message::HelloReply {
            version,
            host_pid,
            features,
        } => {
            w.u16(*version);
            w.u32(*host_pid);
            w.u64(*features);
        }
        Message::ListAttrs { prefix } => w.string(prefix, "prefix", MAX_PATH, false)?,
        Message::Attrs { entries } => {
            w.count(entries.len(), "attrs", MAX_ATTRS)?;
            for e in entries {
                w.string(&e.path, "path", MAX_PATH, true)?;
                w.string(&e.value, "value", MAX_VALUE, false)?;
                w.u8(e.writable as u8);
            }
        }
        Message::GetAttr { path } => w.string(path, "path", MAX_PATH, true)?,
        Message::AttrValue { value } => w.string(value, "value", MAX_VALUE, false)?,
        Message::SetAttr { path, value } => {
            w.string(path, "path", MAX_PATH, true)?;
            w.string(value, "value", MAX_VALUE, false)?;
        }
        Message::RequestQueue {
            alg,
            flags,
            depth,
            numa_node,
            probe_addr,
            probe_value,
        } => {
            w.string(alg, "alg", MAX_NAME, true)?;
            w.u32(*flags);
            w.u32(*depth);
            w.u32(*numa_node as u32);
            w.u64(*probe_addr);
            w.u64(*probe_value);
        }
        Message::QueueGranted {
            queue_id,
            device,
            device_api,
            depth,
            desc_size,
            ring_bytes,
            flags,
        } => {
            w.u32(*queue_id);
            w.string(device, "device", MAX_NAME, true)?;
            w.u32(*device_api);
            w.u32(*depth);
            w.u32(*desc_size);
            w.u64(*ring_bytes);
            w.u32(*flags);
        }
        Message::ReleaseQueue { queue_id } => w.u32(*queue_id),
        Message::MemShare {
            queue_id,
            iova,
            size,
            fd_offset,
            prot,
        } => {
            if !prot_ok(*prot) {
                return Err(ProtoError::Invalid("prot"));
            }
            w.u32(*queue_id);
            w.u64(*iova);
            w.u64(*size);
            w.u64(*fd_offset);
            w.u8((*prot).into());
        }
        Message::MemUnshare {
            queue_id,
            iova,
            size,
        } => {
            w.u32(*queue_id);
            w.u64(*iova);
            w.u64(*size);
        }
        Message::ReadFaults { queue_id, max } => {
            w.u32(*queue_id);
            w.u32(*max);
        }
        Message::Faults {
            total,
            lost,
            events,
        } => {
            w.u64(*total);
            w.u64(*lost);
            w.count(events.len(), "faults", MAX_FAULTS)?;
            for e in events {
                w.u64(e.seq);
                w.u64(e.iova);
                w.u32(e.pasid);
                w.u8(e.access.into());
                w.u8(e.reason.into());
            }
        }
        Message::Legacy {
            queue_id,
            desc,
            payload,
        } => {
            w.u32(*queue_id);
            w.bytes(desc, "desc", MAX_DESC)?;
            w.bytes(payload, "payload", MAX_PAYLOAD)?;
        }
        Message::LegacyReply { desc, payload } => {
            w.bytes(desc, "desc", MAX_DESC)?;
            w.bytes(payload, "payload", MAX_PAYLOAD)?;
        }
        Message::Ok => {}
        Message::Error { status, message } => {
            if *status == Status::Ok {
                return Err(ProtoError::Invalid("status"));
            }
            w.u16(*status as u16);
            w.string(message, "message", MAX_MESSAGE, false)?;
        }
        Message::IommuPolicy {
            queue_id,
            mode,
            fault_policy,
        } => {
            w.u32(*queue_id);
            w.u8((*mode).into());
            w.u8((*fault_policy).into());
        }
        Message::FaultResume {
            queue_id,
            stag,
            retry,
        } => {
            w.u32(*queue_id);
            w.u64(*stag);
            w.u8(*retry as u8);
        }
        Message::VirtioKick { requests } => {
            w.count(requests.len(), "virtio requests", MAX_VIRTIO_REQS)?;
            for q in requests {
                w.bytes(&q.readable, "virtio readable", MAX_VIRTIO_READABLE)?;
                if q.writable_len as usize > MAX_VIRTIO_WRITABLE {
                    return Err(ProtoError::Limit {
                        field: "virtio writable_len",
                        len: q.writable_len as usize,
                        max: MAX_VIRTIO_WRITABLE,
                    });
                }
                w.u32(q.writable_len);
            }
        }
        Message::VirtioUsed { used } => {
            w.count(used.len(), "virtio used", MAX_VIRTIO_REQS)?;
            for u in used {
                w.bytes(u, "virtio written", MAX_VIRTIO_WRITABLE)?;
            }
        }
        Message::VirtioConfig { offset, data } => {
            w.u32(*offset);
            w.bytes(data, "config data", MAX_VIRTIO_CONFIG)?;
        }
        Message::VirtioConfigReply { features, config } => {
            w.u64(*features);
            w.bytes(config, "config", MAX_VIRTIO_CONFIG)?;
        }
        Message::PeekFaults { queue_id, max } => {
            w.u32(*queue_id);
            w.u32(*max);
        }
    }
    let body_len = w.0.len() - HEADER_LEN;
    if body_len > MAX_BODY {
        return Err(ProtoError::TooBig(body_len as u32));
    }
    let mut out = w.0;
    out[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    out[4..6].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    out[6..8].copy_from_slice(&msg.kind().to_le_bytes());
    out[8..12].copy_from_slice(&request_id.to_le_bytes());
    out[12..16].copy_from_slice(&(body_len as u32).to_le_bytes());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Message> {
        vec![
            Message::Hello {
                version: 1,
                client_pid: 7,
            },
            Message::HelloReply {
                version: 1,
                host_pid: 9,
                features: 3,
            },
            Message::ListAttrs {
                prefix: "dev0".into(),
            },
            Message::Attrs {
                entries: vec![AttrEntry {
                    path: "dev0/priority".into(),
                    value: "1".into(),
                    writable: true,
                }],
            },
            Message::GetAttr { path: "a".into() },
            Message::AttrValue { value: "".into() },
            Message::SetAttr {
                path: "a".into(),
                value: "b".into(),
            },
            Message::RequestQueue {
                alg: "memcpy".into(),
                flags: 1,
                depth: 64,
                numa_node: -1,
                probe_addr: 5,
                probe_value: 6,
            },
            Message::QueueGranted {
                queue_id: 1,
                device: "dev0".into(),
                device_api: 1,
                depth: 64,
                desc_size: 128,
                ring_bytes: 4096,
                flags: 0,
            },
            Message::ReleaseQueue { queue_id: 3 },
            Message::MemShare {
                queue_id: 1,
                iova: 4096,
                size: 8192,
                fd_offset: 0,
                prot: Prot::RW,
            },
            Message::MemUnshare {
                queue_id: 1,
                iova: 4096,
                size: 8192,
            },
            Message::ReadFaults {
                queue_id: 1,
                max: 9,
            },
            Message::Faults {
                total: 4,
                lost: 1,
                events: vec![FaultEvent {
                    seq: 3,
                    iova: 77,
                    pasid: 1,
                    access: crate::Access::Write,
                    reason: crate::FaultReason::Permission,
                }],
            },
            Message::Legacy {
                queue_id: 1,
                desc: vec![1; 128],
                payload: vec![2; 100],
            },
            Message::LegacyReply {
                desc: vec![1; 128],
                payload: vec![],
            },
            Message::Ok,
            Message::error(Status::Busy, "busy"),
            Message::IommuPolicy {
                queue_id: 2,
                mode: crate::InvalidationMode::Deferred,
                fault_policy: crate::FaultPolicy::Stall,
            },
            Message::FaultResume {
                queue_id: 2,
                stag: 17,
                retry: true,
            },
            Message::VirtioKick {
                requests: vec![VirtioReq {
                    readable: vec![3, 0, 0, 0, 1, 0, 0, 0],
                    writable_len: 4,
                }],
            },
            Message::VirtioUsed {
                used: vec![vec![0, 0, 0, 0], vec![]],
            },
            Message::VirtioConfig {
                offset: 36,
                data: vec![0],
            },
            Message::VirtioConfigReply {
                features: 0x57,
                config: vec![0; 40],
            },
            Message::PeekFaults {
                queue_id: 3,
                max: 8,
            },
        ]
    }

    #[test]
    fn every_kind_round_trips() {
        for (i, m) in samples().into_iter().enumerate() {
            assert_eq!(m.kind() as usize, i + 1, "{}", m.name());
            let b = encode(&m, 42).unwrap();
            let (h, back) = decode_frame(&b).unwrap();
            assert_eq!(h.request_id, 42);
            assert_eq!(back, m);
        }
    }

    fn frame(kind: u16, body: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&MAGIC.to_le_bytes());
        v.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        v.extend_from_slice(&kind.to_le_bytes());
        v.extend_from_slice(&1u32.to_le_bytes());
        v.extend_from_slice(&(body.len() as u32).to_le_bytes());
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn rejections() {
        let good = encode(&Message::GetAttr { path: "ab".into() }, 1).unwrap();
        let mut bad = good.clone();
        bad[0] ^= 1;
        assert!(matches!(decode_frame(&bad), Err(ProtoError::BadMagic(_))));
        let mut bad = good.clone();
        bad[4] = 2;
        assert_eq!(decode_frame(&bad), Err(ProtoError::Version(2)));
        assert_eq!(
            decode_frame(&frame(99, &[])),
            Err(ProtoError::UnknownKind(99))
        );
        assert_eq!(
            decode_frame(&frame(0, &[])),
            Err(ProtoError::UnknownKind(0))
        );
        assert_eq!(
            decode_frame(&frame(26, &[])),
            Err(ProtoError::UnknownKind(26))
        );
        let mut bad = good.clone();
        bad[12..16].copy_from_slice(&(MAX_BODY as u32 + 1).to_le_bytes());
        assert!(matches!(decode_frame(&bad), Err(ProtoError::TooBig(_))));
        assert!(matches!(
            decode_frame(&good[..good.len() - 1]),
            Err(ProtoError::Truncated(_))
        ));
        assert!(matches!(
            decode_frame(&good[..10]),
            Err(ProtoError::Truncated(_))
        ));
        let mut bad = good.clone();
        bad.push(0);
        assert!(matches!(decode_frame(&bad), Err(ProtoError::Trailing(1))));
        // Body with a trailing byte the message does not use.
        assert_eq!(decode_frame(&frame(17, &[0])), Err(ProtoError::Trailing(1)));
        // Invalid UTF-8.
        assert_eq!(
            decode_frame(&frame(5, &[2, 0, 0xff, 0xfe])),
            Err(ProtoError::Invalid("path"))
        );
        // Empty name.
        assert_eq!(
            decode_frame(&frame(5, &[0, 0])),
            Err(ProtoError::Invalid("path"))
        );
        // Over-limit string, list and payload.
        let mut b = vec![0xff, 0x0f];
        b.extend(vec![b'a'; 0x0fff]);
        assert!(matches!(
            decode_frame(&frame(5, &b)),
            Err(ProtoError::Limit { .. })
        ));
        assert!(matches!(
            decode_frame(&frame(4, &u32::MAX.to_le_bytes())),
            Err(ProtoError::Limit { .. })
        ));
        assert!(matches!(
            decode_frame(&frame(4, &100u32.to_le_bytes())),
            Err(ProtoError::Truncated(_))
        ));
        let mut b = 1u32.to_le_bytes().to_vec();
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&((MAX_PAYLOAD + 1) as u32).to_le_bytes());
        assert!(matches!(
            decode_frame(&frame(15, &b)),
            Err(ProtoError::Limit { .. })
        ));
        // Bad bool, enum and prot values.
        let mut b = 1u32.to_le_bytes().to_vec();
        b.extend_from_slice(&[1, 0, b'a', 0, 0, 7]);
        assert_eq!(
            decode_frame(&frame(4, &b)),
            Err(ProtoError::Invalid("writable"))
        );
        assert_eq!(
            decode_frame(&frame(18, &[0, 0, 0, 0])),
            Err(ProtoError::Invalid("status"))
        );
        assert_eq!(
            decode_frame(&frame(18, &[99, 0, 0, 0])),
            Err(ProtoError::Invalid("status"))
        );
        for bad in [0u8, 4] {
            let mut b = vec![0u8; 28];
            b.push(bad);
            assert_eq!(
                decode_frame(&frame(11, &b)),
                Err(ProtoError::Invalid("prot")),
                "prot {bad}"
            );
        }
        // IOMMU policy values, virtio limits.
        assert_eq!(
            decode_frame(&frame(19, &[1, 0, 0, 0, 2, 0])),
            Err(ProtoError::Invalid("mode"))
        );
        assert_eq!(
            decode_frame(&frame(19, &[1, 0, 0, 0, 0, 2])),
            Err(ProtoError::Invalid("fault_policy"))
        );
        assert_eq!(
            decode_frame(&frame(20, &[0; 13])).map(|_| ()),
            Ok(()),
            "retry false"
        );
        let mut b = 1u32.to_le_bytes().to_vec();
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&((MAX_VIRTIO_WRITABLE + 1) as u32).to_le_bytes());
        assert!(matches!(
            decode_frame(&frame(21, &b)),
            Err(ProtoError::Limit { .. })
        ));
        assert!(matches!(
            decode_frame(&frame(21, &((MAX_VIRTIO_REQS + 1) as u32).to_le_bytes())),
            Err(ProtoError::Limit { .. })
        ));
        assert!(matches!(
            decode_frame(&frame(21, &100u32.to_le_bytes())),
            Err(ProtoError::Truncated(_))
        ));
    }

    #[test]
    fn encode_refuses_what_decode_refuses() {
        assert!(encode(
            &Message::GetAttr {
                path: "x".repeat(MAX_PATH + 1)
            },
            1
        )
        .is_err());
        assert!(encode(
            &Message::GetAttr {
                path: String::new()
            },
            1
        )
        .is_err());
        assert!(encode(
            &Message::Legacy {
                queue_id: 1,
                desc: vec![0; MAX_DESC + 1],
                payload: vec![]
            },
            1
        )
        .is_err());
        assert!(encode(
            &Message::Error {
                status: Status::Ok,
                message: String::new()
            },
            1
        )
        .is_err());
        let long = Message::error(Status::Io, "é".repeat(MAX_MESSAGE));
        assert!(encode(&long, 1).is_ok());
    }
}
