//! The control protocol between clients and the device host.
//!
//! Every byte a peer sends is parsed here, once, into bounded values with
//! named [`limits`]: an oversized, truncated or inconsistent frame is a
//! [`ProtoError`], never a panic or an unbounded allocation. `encode`
//! refuses the same things `decode` refuses, so whatever one side sends the
//! other accepts.
#![deny(unsafe_code)]

mod codec;
mod status;

pub use codec::{decode_body, decode_frame, decode_header, encode};
pub use status::Status;

/// Frame magic ("WDP1" in little-endian bytes).
pub const MAGIC: u32 = 0x3150_4457;
/// Protocol version spoken by this build.
pub const PROTOCOL_VERSION: u16 = 1;

/// The typed values of the wire's enum and bit fields (decoded with
/// `TryFrom<u8>`, unknown values refused).
pub use wd_iommu::{Access, FaultPolicy, FaultReason, InvalidationMode, Prot};

/// Queue capability flag: the device may name any memory of the client
/// (the request carries the client's `/proc/self/mem` descriptor).
pub const CAPA_SHARE_ALL: u32 = 1;
/// Queue capability flag: request data may travel through the socket.
pub const CAPA_ALLOW_LEGACY: u32 = 2;
/// Control socket of a system-wide host: where a client looks when told
/// nothing else, and where `wd serve` listens by default.
pub const DEFAULT_SOCKET: &str = "/run/wrapdrive/wd.sock";
/// Bytes of the frame header.
pub const HEADER_LEN: usize = 16;

/// Named bounds on everything a peer controls.
pub mod limits {
    /// Largest frame body.
    pub const MAX_BODY: usize = (1 << 20) + 4096;
    /// Algorithm and device names.
    pub const MAX_NAME: usize = 64;
    /// Attribute paths.
    pub const MAX_PATH: usize = 256;
    /// Attribute values.
    pub const MAX_VALUE: usize = 256;
    /// Error text.
    pub const MAX_MESSAGE: usize = 512;
    /// Entries in one attribute listing.
    pub const MAX_ATTRS: usize = 8192;
    /// Fault events in one reply.
    pub const MAX_FAULTS: usize = 256;
    /// Ring descriptor bytes carried by a legacy request.
    pub const MAX_DESC: usize = 128;
    /// Legacy data bytes per message.
    pub const MAX_PAYLOAD: usize = 1 << 20;
    /// File descriptors accompanying one frame.
    pub const MAX_FDS: usize = 4;
    /// virtio-iommu requests in one kick.
    pub const MAX_VIRTIO_REQS: usize = 256;
    /// Device-readable bytes of one virtio-iommu request.
    pub const MAX_VIRTIO_READABLE: usize = 256;
    /// Device-writable bytes of one virtio-iommu request.
    pub const MAX_VIRTIO_WRITABLE: usize = 4096;
    /// Bytes of a virtio-iommu config read or write.
    pub const MAX_VIRTIO_CONFIG: usize = 64;
}

/// Errors decoding or encoding a frame.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtoError {
    /// The frame does not start with [`MAGIC`].
    #[error("bad magic {0:#010x}")]
    BadMagic(u32),
    /// The peer speaks another protocol version.
    #[error("unsupported protocol version {0} (this side speaks {PROTOCOL_VERSION})")]
    Version(u16),
    /// Unknown message kind.
    #[error("unknown message kind {0}")]
    UnknownKind(u16),
    /// The body is larger than [`limits::MAX_BODY`].
    #[error("frame body of {0} bytes exceeds the limit of {max}", max = limits::MAX_BODY)]
    TooBig(u32),
    /// The body ended before the message did.
    #[error("truncated {0}")]
    Truncated(&'static str),
    /// Bytes left after the message.
    #[error("{0} trailing bytes after the message")]
    Trailing(usize),
    /// A field exceeds its limit.
    #[error("{field} of length {len} exceeds the limit of {max}")]
    Limit {
        /// Field name.
        field: &'static str,
        /// Length found.
        len: usize,
        /// Its limit.
        max: usize,
    },
    /// A field holds a value outside its domain.
    #[error("invalid {0}")]
    Invalid(&'static str),
}

/// One entry of the attribute tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttrEntry {
    /// Path, e.g. `dev0/priority`.
    pub path: String,
    /// Value as text.
    pub value: String,
    /// Whether the host's owner may write it.
    pub writable: bool,
}

/// A translation fault as reported to the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultEvent {
    /// Fault number on its queue.
    pub seq: u64,
    /// Device address used.
    pub iova: u64,
    /// Domain (queue) id.
    pub pasid: u32,
    /// Direction (wire: 0 read, 1 write).
    pub access: Access,
    /// Why (wire: 1 unmapped, 2 permission, 3 out of range, 4 no domain).
    pub reason: FaultReason,
}

/// One virtio-iommu request of a kick: its device-readable bytes and the
/// size of its device-writable buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VirtioReq {
    /// Device-readable part (head and request fields).
    pub readable: Vec<u8>,
    /// Bytes of the device-writable part (properties and tail).
    pub writable_len: u32,
}

/// Every message of the protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// Client, first: protocol version.
    Hello {
        /// Version the client speaks.
        version: u16,
        /// The client's pid, informational (the host trusts SO_PEERCRED).
        client_pid: u32,
    },
    /// Host answer to Hello.
    HelloReply {
        /// Version the host speaks.
        version: u16,
        /// The host's pid.
        host_pid: u32,
        /// Feature bits.
        features: u64,
    },
    /// List attributes under a prefix.
    ListAttrs {
        /// Path prefix ("" for all).
        prefix: String,
    },
    /// Attribute listing.
    Attrs {
        /// The entries.
        entries: Vec<AttrEntry>,
    },
    /// Read one attribute.
    GetAttr {
        /// Its path.
        path: String,
    },
    /// One attribute's value.
    AttrValue {
        /// The value.
        value: String,
    },
    /// Write an attribute.
    SetAttr {
        /// Its path.
        path: String,
        /// New value.
        value: String,
    },
    /// Ask for a queue.
    RequestQueue {
        /// Algorithm.
        alg: String,
        /// Capability flags.
        flags: u32,
        /// Ring depth (0: default).
        depth: u32,
        /// Preferred NUMA node (-1: any).
        numa_node: i32,
        /// SHARE_ALL: address of a probe word in the client.
        probe_addr: u64,
        /// SHARE_ALL: the value the host must read there.
        probe_value: u64,
    },
    /// A queue was created; carries 3 fds: ring memfd, engine doorbell,
    /// completion line (wake lines: docs/protocol.md).
    QueueGranted {
        /// Queue id.
        queue_id: u32,
        /// Device name (`dev<N>`).
        device: String,
        /// Message-format version.
        device_api: u32,
        /// Ring depth.
        depth: u32,
        /// Descriptor size.
        desc_size: u32,
        /// Bytes of ring memory.
        ring_bytes: u64,
        /// Granted flags.
        flags: u32,
    },
    /// Give a queue back.
    ReleaseQueue {
        /// Queue id.
        queue_id: u32,
    },
    /// Share memory; carries 1 fd (the memfd holding it).
    MemShare {
        /// Queue id.
        queue_id: u32,
        /// Device address of the first byte.
        iova: u64,
        /// Bytes.
        size: u64,
        /// Offset of the first byte in the memfd.
        fd_offset: u64,
        /// What the device may do (wire: 1 read, 2 write, 3 both).
        prot: Prot,
    },
    /// Undo a share.
    MemUnshare {
        /// Queue id.
        queue_id: u32,
        /// As shared.
        iova: u64,
        /// As shared.
        size: u64,
    },
    /// Read fault events.
    ReadFaults {
        /// Queue id.
        queue_id: u32,
        /// Most events wanted.
        max: u32,
    },
    /// Fault events.
    Faults {
        /// Faults ever recorded.
        total: u64,
        /// Faults dropped by overflow.
        lost: u64,
        /// Oldest unread events.
        events: Vec<FaultEvent>,
    },
    /// A request on the legacy (socket) path.
    Legacy {
        /// Queue id.
        queue_id: u32,
        /// The descriptor.
        desc: Vec<u8>,
        /// Input data.
        payload: Vec<u8>,
    },
    /// Completion of a legacy request.
    LegacyReply {
        /// The completed descriptor.
        desc: Vec<u8>,
        /// Output data.
        payload: Vec<u8>,
    },
    /// Success without data.
    Ok,
    /// Failure.
    Error {
        /// Status class (never Ok).
        status: Status,
        /// Human-readable reason.
        message: String,
    },
    /// Set a queue's IOMMU policy (its own domain, and the virtio-iommu
    /// domain it is attached to, if any).
    IommuPolicy {
        /// Queue id.
        queue_id: u32,
        /// Invalidation (wire: 0 strict, 1 deferred flush queue).
        mode: InvalidationMode,
        /// Faulting requests (wire: 0 abort, 1 stall until resumed).
        fault_policy: FaultPolicy,
    },
    /// Resolve a stalled request (the fault record's `seq`).
    FaultResume {
        /// Queue id.
        queue_id: u32,
        /// Stall tag: the fault's sequence number.
        stag: u64,
        /// Retry the request (true) or fail it (false).
        retry: bool,
    },
    /// A kick of the connection's virtio-iommu request queue.
    VirtioKick {
        /// The requests, handled in order.
        requests: Vec<VirtioReq>,
    },
    /// What the device wrote for each request of a kick (its length is the
    /// used length; empty: not written).
    VirtioUsed {
        /// Per request, the bytes written.
        used: Vec<Vec<u8>>,
    },
    /// Read (empty `data`) or write the virtio-iommu config.
    VirtioConfig {
        /// Offset of the write.
        offset: u32,
        /// Bytes to write (none: a read).
        data: Vec<u8>,
    },
    /// The virtio-iommu device's features and config.
    VirtioConfigReply {
        /// Feature bits offered.
        features: u64,
        /// `struct virtio_iommu_config`.
        config: Vec<u8>,
    },
    /// Read a queue's newest faults without consuming them (the queue's
    /// owner, the host's owner or root; for `wd faults`).
    PeekFaults {
        /// Queue id (any connection's).
        queue_id: u32,
        /// Most events wanted.
        max: u32,
    },
}

impl Message {
    /// Wire kind number.
    pub fn kind(&self) -> u16 {
        match self {
            Message::Hello { .. } => 1,
            Message::HelloReply { .. } => 2,
            Message::ListAttrs { .. } => 3,
            Message::Attrs { .. } => 4,
            Message::GetAttr { .. } => 5,
            Message::AttrValue { .. } => 6,
            Message::SetAttr { .. } => 7,
            Message::RequestQueue { .. } => 8,
            Message::QueueGranted { .. } => 9,
            Message::ReleaseQueue { .. } => 10,
            Message::MemShare { .. } => 11,
            Message::MemUnshare { .. } => 12,
            Message::ReadFaults { .. } => 13,
            Message::Faults { .. } => 14,
            Message::Legacy { .. } => 15,
            Message::LegacyReply { .. } => 16,
            Message::Ok => 17,
            Message::Error { .. } => 18,
            Message::IommuPolicy { .. } => 19,
            Message::FaultResume { .. } => 20,
            Message::VirtioKick { .. } => 21,
            Message::VirtioUsed { .. } => 22,
            Message::VirtioConfig { .. } => 23,
            Message::VirtioConfigReply { .. } => 24,
            Message::PeekFaults { .. } => 25,
        }
    }

    /// File descriptors that travel with this kind.
    pub fn fds_expected(&self) -> usize {
        match self {
            Message::MemShare { .. } => 1,
            // The client's own /proc/self/mem (see the host's SHARE_ALL).
            Message::RequestQueue { flags, .. } if flags & CAPA_SHARE_ALL != 0 => 1,
            Message::QueueGranted { .. } => 3,
            _ => 0,
        }
    }

    /// Name for messages and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Message::Hello { .. } => "Hello",
            Message::HelloReply { .. } => "HelloReply",
            Message::ListAttrs { .. } => "ListAttrs",
            Message::Attrs { .. } => "Attrs",
            Message::GetAttr { .. } => "GetAttr",
            Message::AttrValue { .. } => "AttrValue",
            Message::SetAttr { .. } => "SetAttr",
            Message::RequestQueue { .. } => "RequestQueue",
            Message::QueueGranted { .. } => "QueueGranted",
            Message::ReleaseQueue { .. } => "ReleaseQueue",
            Message::MemShare { .. } => "MemShare",
            Message::MemUnshare { .. } => "MemUnshare",
            Message::ReadFaults { .. } => "ReadFaults",
            Message::Faults { .. } => "Faults",
            Message::Legacy { .. } => "Legacy",
            Message::LegacyReply { .. } => "LegacyReply",
            Message::Ok => "Ok",
            Message::Error { .. } => "Error",
            Message::IommuPolicy { .. } => "IommuPolicy",
            Message::FaultResume { .. } => "FaultResume",
            Message::VirtioKick { .. } => "VirtioKick",
            Message::VirtioUsed { .. } => "VirtioUsed",
            Message::VirtioConfig { .. } => "VirtioConfig",
            Message::VirtioConfigReply { .. } => "VirtioConfigReply",
            Message::PeekFaults { .. } => "PeekFaults",
        }
    }

    /// An Error message, its text cut to [`limits::MAX_MESSAGE`].
    pub fn error(status: Status, message: impl Into<String>) -> Message {
        let mut message = message.into();
        if message.len() > limits::MAX_MESSAGE {
            let mut cut = limits::MAX_MESSAGE;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
        }
        let status = if status == Status::Ok {
            Status::Io
        } else {
            status
        };
        Message::Error { status, message }
    }
}

/// A decoded frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Protocol version.
    pub version: u16,
    /// Message kind.
    pub kind: u16,
    /// Request id (replies echo it).
    pub request_id: u32,
    /// Body length.
    pub body_len: u32,
}
