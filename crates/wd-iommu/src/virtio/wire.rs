//! virtio-iommu wire format: constants, request decoding, statuses,
//! probe properties and fault records (virtio v1.2 §5.13).

use crate::{Access, Fault, FaultReason};

/// Device ID of the IOMMU device (§5.13.1 Device ID).
pub const VIRTIO_ID_IOMMU: u32 = 23;
/// Virtqueue index of `requestq` (§5.13.2 Virtqueues).
pub const REQUESTQ: u16 = 0;
/// Virtqueue index of `eventq` (§5.13.2 Virtqueues).
pub const EVENTQ: u16 = 1;

/// Feature bit: `input_range` is valid (§5.13.3 Feature bits).
pub const VIRTIO_IOMMU_F_INPUT_RANGE: u32 = 0;
/// Feature bit: `domain_range` is valid (§5.13.3).
pub const VIRTIO_IOMMU_F_DOMAIN_RANGE: u32 = 1;
/// Feature bit: MAP and UNMAP requests are available (§5.13.3).
pub const VIRTIO_IOMMU_F_MAP_UNMAP: u32 = 2;
/// Feature bit: unattached endpoints bypass (superseded, §5.13.3).
pub const VIRTIO_IOMMU_F_BYPASS: u32 = 3;
/// Feature bit: the PROBE request is available (§5.13.3).
pub const VIRTIO_IOMMU_F_PROBE: u32 = 4;
/// Feature bit: the VIRTIO_IOMMU_MAP_F_MMIO flag is available (§5.13.3).
pub const VIRTIO_IOMMU_F_MMIO: u32 = 5;
/// Feature bit: config field `bypass` and ATTACH_F_BYPASS (§5.13.3).
pub const VIRTIO_IOMMU_F_BYPASS_CONFIG: u32 = 6;

/// Request type ATTACH (§5.13.6 Device operations).
pub const VIRTIO_IOMMU_T_ATTACH: u8 = 1;
/// Request type DETACH (§5.13.6).
pub const VIRTIO_IOMMU_T_DETACH: u8 = 2;
/// Request type MAP (§5.13.6).
pub const VIRTIO_IOMMU_T_MAP: u8 = 3;
/// Request type UNMAP (§5.13.6).
pub const VIRTIO_IOMMU_T_UNMAP: u8 = 4;
/// Request type PROBE (§5.13.6).
pub const VIRTIO_IOMMU_T_PROBE: u8 = 5;

/// ATTACH flag: the domain is a bypass domain (§5.13.6.3 ATTACH request).
pub const VIRTIO_IOMMU_ATTACH_F_BYPASS: u32 = 1 << 0;
/// MAP flag: reads allowed (§5.13.6.5 MAP request).
pub const VIRTIO_IOMMU_MAP_F_READ: u32 = 1 << 0;
/// MAP flag: writes allowed (§5.13.6.5).
pub const VIRTIO_IOMMU_MAP_F_WRITE: u32 = 1 << 1;
/// MAP flag: memory-mapped I/O (§5.13.6.5).
pub const VIRTIO_IOMMU_MAP_F_MMIO: u32 = 1 << 2;

/// Probe property type RESV_MEM (§5.13.6.8 PROBE properties).
pub const VIRTIO_IOMMU_PROBE_T_RESV_MEM: u16 = 1;
/// RESV_MEM subtype: reserved, cannot be mapped (§5.13.6.8.1).
pub const VIRTIO_IOMMU_RESV_MEM_T_RESERVED: u8 = 0;
/// RESV_MEM subtype: an MSI doorbell (§5.13.6.8.1).
pub const VIRTIO_IOMMU_RESV_MEM_T_MSI: u8 = 1;

/// Fault reason: unknown (§5.13.6.9 Fault reporting).
pub const VIRTIO_IOMMU_FAULT_R_UNKNOWN: u8 = 0;
/// Fault reason: the endpoint is not attached to a domain (§5.13.6.9).
pub const VIRTIO_IOMMU_FAULT_R_DOMAIN: u8 = 1;
/// Fault reason: not mapped, or wrong permissions (§5.13.6.9).
pub const VIRTIO_IOMMU_FAULT_R_MAPPING: u8 = 2;
/// Fault flag: a read (§5.13.6.9).
pub const VIRTIO_IOMMU_FAULT_F_READ: u32 = 1 << 0;
/// Fault flag: a write (§5.13.6.9).
pub const VIRTIO_IOMMU_FAULT_F_WRITE: u32 = 1 << 1;
/// Fault flag: `address` is valid (§5.13.6.9).
pub const VIRTIO_IOMMU_FAULT_F_ADDRESS: u32 = 1 << 8;

/// Bytes of `struct virtio_iommu_req_head` (§5.13.6).
pub const REQ_HEAD_LEN: usize = 4;
/// Bytes of `struct virtio_iommu_req_tail` (§5.13.6).
pub const REQ_TAIL_LEN: usize = 4;
/// Device-readable bytes of `struct virtio_iommu_req_attach` (§5.13.6.3):
/// head, le32 domain, le32 endpoint, le32 flags, u8 reserved[4].
pub const ATTACH_LEN: usize = 20;
/// Device-readable bytes of `struct virtio_iommu_req_detach` (§5.13.6.4):
/// head, le32 domain, le32 endpoint, u8 reserved[8].
pub const DETACH_LEN: usize = 20;
/// Device-readable bytes of `struct virtio_iommu_req_map` (§5.13.6.5):
/// head, le32 domain, le64 virt_start, le64 virt_end, le64 phys_start,
/// le32 flags.
pub const MAP_LEN: usize = 36;
/// Device-readable bytes of `struct virtio_iommu_req_unmap` (§5.13.6.6):
/// head, le32 domain, le64 virt_start, le64 virt_end, u8 reserved[4].
pub const UNMAP_LEN: usize = 28;
/// Device-readable bytes of `struct virtio_iommu_req_probe` (§5.13.6.7):
/// head, le32 endpoint, u8 reserved[64].
pub const PROBE_LEN: usize = 72;
/// Bytes of `struct virtio_iommu_probe_property` (§5.13.6.7).
pub const PROBE_PROPERTY_LEN: usize = 4;
/// `length` of a RESV_MEM property: u8 subtype, u8 reserved[3], le64
/// start, le64 end (§5.13.6.8.1).
pub const RESV_MEM_LEN: usize = 20;
/// Bytes of `struct virtio_iommu_config` (§5.13.4 Device configuration
/// layout).
pub const CONFIG_LEN: usize = 40;
/// Offset of `page_size_mask` in the config (§5.13.4).
pub const CONFIG_PAGE_SIZE_MASK: usize = 0;
/// Offset of `input_range` (start, end) in the config (§5.13.4).
pub const CONFIG_INPUT_RANGE: usize = 8;
/// Offset of `domain_range` (start, end) in the config (§5.13.4).
pub const CONFIG_DOMAIN_RANGE: usize = 24;
/// Offset of `probe_size` in the config (§5.13.4).
pub const CONFIG_PROBE_SIZE: usize = 32;
/// Offset of `bypass` in the config (§5.13.4).
pub const CONFIG_BYPASS: usize = 36;
/// Bytes of `struct virtio_iommu_fault` (§5.13.6.9).
pub const FAULT_LEN: usize = 24;

/// Most domains one device holds at once (NOMEM beyond).
pub const MAX_DOMAINS: usize = 64;
/// Most mappings (MAP requests alive) per domain (NOMEM beyond).
pub const MAX_MAPPINGS: usize = 4096;
/// Most endpoints one device manages.
pub const MAX_ENDPOINTS: usize = 256;
/// Most RESV_MEM regions per endpoint.
pub const MAX_RESV: usize = 16;
/// Size of the PROBE properties buffer this device asks for.
pub const PROBE_SIZE: u32 = 512;
/// Largest domain ID (the device offers `domain_range` 0..=this).
pub const DOMAIN_ID_MAX: u32 = 1023;

/// Request status (§5.13.6 Device operations).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Status {
    /// VIRTIO_IOMMU_S_OK: all good.
    Ok = 0,
    /// VIRTIO_IOMMU_S_IOERR: virtio communication error.
    IoErr = 1,
    /// VIRTIO_IOMMU_S_UNSUPP: unsupported request.
    Unsupp = 2,
    /// VIRTIO_IOMMU_S_DEVERR: internal device error.
    DevErr = 3,
    /// VIRTIO_IOMMU_S_INVAL: invalid parameters.
    Inval = 4,
    /// VIRTIO_IOMMU_S_RANGE: out-of-range parameters.
    Range = 5,
    /// VIRTIO_IOMMU_S_NOENT: entry not found.
    NoEnt = 6,
    /// VIRTIO_IOMMU_S_FAULT: bad address.
    Fault = 7,
    /// VIRTIO_IOMMU_S_NOMEM: insufficient resources.
    NoMem = 8,
}

impl Status {
    /// The status with this wire value.
    pub fn from_u8(v: u8) -> Option<Status> {
        Some(match v {
            0 => Status::Ok,
            1 => Status::IoErr,
            2 => Status::Unsupp,
            3 => Status::DevErr,
            4 => Status::Inval,
            5 => Status::Range,
            6 => Status::NoEnt,
            7 => Status::Fault,
            8 => Status::NoMem,
            _ => return None,
        })
    }

    /// The specification's name.
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "VIRTIO_IOMMU_S_OK",
            Status::IoErr => "VIRTIO_IOMMU_S_IOERR",
            Status::Unsupp => "VIRTIO_IOMMU_S_UNSUPP",
            Status::DevErr => "VIRTIO_IOMMU_S_DEVERR",
            Status::Inval => "VIRTIO_IOMMU_S_INVAL",
            Status::Range => "VIRTIO_IOMMU_S_RANGE",
            Status::NoEnt => "VIRTIO_IOMMU_S_NOENT",
            Status::Fault => "VIRTIO_IOMMU_S_FAULT",
            Status::NoMem => "VIRTIO_IOMMU_S_NOMEM",
        }
    }
}

/// A decoded request (its device-readable part).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// Attach an endpoint to a domain, creating it (§5.13.6.3).
    Attach {
        /// Domain ID.
        domain: u32,
        /// Endpoint ID.
        endpoint: u32,
        /// VIRTIO_IOMMU_ATTACH_F_*.
        flags: u32,
        /// Must be zero.
        reserved: [u8; 4],
    },
    /// Detach an endpoint from a domain (§5.13.6.4).
    Detach {
        /// Domain ID.
        domain: u32,
        /// Endpoint ID.
        endpoint: u32,
    },
    /// Map `[virt_start, virt_end]` (inclusive) to `phys_start..` (§5.13.6.5).
    Map {
        /// Domain ID.
        domain: u32,
        /// First IOVA.
        virt_start: u64,
        /// Last IOVA (inclusive).
        virt_end: u64,
        /// First guest-physical address.
        phys_start: u64,
        /// VIRTIO_IOMMU_MAP_F_*.
        flags: u32,
    },
    /// Remove the mappings within `[virt_start, virt_end]` (§5.13.6.6).
    Unmap {
        /// Domain ID.
        domain: u32,
        /// First IOVA.
        virt_start: u64,
        /// Last IOVA (inclusive).
        virt_end: u64,
        /// Should be zero.
        reserved: [u8; 4],
    },
    /// Ask for an endpoint's properties (§5.13.6.7).
    Probe {
        /// Endpoint ID.
        endpoint: u32,
    },
}

/// Why a device-readable buffer does not decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Shorter than `struct virtio_iommu_req_head`.
    #[error("request shorter than its {REQ_HEAD_LEN}-byte head")]
    NoHead,
    /// A type the device does not know.
    #[error("unknown request type {0}")]
    UnknownType(u8),
    /// Too short for its type.
    #[error("request type {ty} needs {need} device-readable bytes, got {got}")]
    Truncated {
        /// Request type.
        ty: u8,
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        got: usize,
    },
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl Request {
    /// Decode a device-readable buffer; the one place request bytes are
    /// parsed. The head's `reserved` bytes are ignored, as the device must.
    pub fn decode(readable: &[u8]) -> Result<Request, DecodeError> {
        if readable.len() < REQ_HEAD_LEN {
            return Err(DecodeError::NoHead);
        }
        let ty = readable[0];
        let need = match ty {
            VIRTIO_IOMMU_T_ATTACH => ATTACH_LEN,
            VIRTIO_IOMMU_T_DETACH => DETACH_LEN,
            VIRTIO_IOMMU_T_MAP => MAP_LEN,
            VIRTIO_IOMMU_T_UNMAP => UNMAP_LEN,
            VIRTIO_IOMMU_T_PROBE => PROBE_LEN,
            t => return Err(DecodeError::UnknownType(t)),
        };
        if readable.len() < need {
            return Err(DecodeError::Truncated {
                ty,
                need,
                got: readable.len(),
            });
        }
        let b = readable;
        Ok(match ty {
            VIRTIO_IOMMU_T_ATTACH => Request::Attach {
                domain: le32(b, 4),
                endpoint: le32(b, 8),
                flags: le32(b, 12),
                reserved: b[16..20].try_into().expect("4 bytes"),
            },
            VIRTIO_IOMMU_T_DETACH => Request::Detach {
                domain: le32(b, 4),
                endpoint: le32(b, 8),
            },
            VIRTIO_IOMMU_T_MAP => Request::Map {
                domain: le32(b, 4),
                virt_start: le64(b, 8),
                virt_end: le64(b, 16),
                phys_start: le64(b, 24),
                flags: le32(b, 32),
            },
            VIRTIO_IOMMU_T_UNMAP => Request::Unmap {
                domain: le32(b, 4),
                virt_start: le64(b, 8),
                virt_end: le64(b, 16),
                reserved: b[24..28].try_into().expect("4 bytes"),
            },
            _ => Request::Probe {
                endpoint: le32(b, 4),
            },
        })
    }

    /// The device-readable bytes a driver sends (reserved fields zero
    /// except where the request carries them).
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(PROBE_LEN);
        let head = |v: &mut Vec<u8>, t: u8| v.extend_from_slice(&[t, 0, 0, 0]);
        match *self {
            Request::Attach {
                domain,
                endpoint,
                flags,
                reserved,
            } => {
                head(&mut v, VIRTIO_IOMMU_T_ATTACH);
                v.extend_from_slice(&domain.to_le_bytes());
                v.extend_from_slice(&endpoint.to_le_bytes());
                v.extend_from_slice(&flags.to_le_bytes());
                v.extend_from_slice(&reserved);
            }
            Request::Detach { domain, endpoint } => {
                head(&mut v, VIRTIO_IOMMU_T_DETACH);
                v.extend_from_slice(&domain.to_le_bytes());
                v.extend_from_slice(&endpoint.to_le_bytes());
                v.extend_from_slice(&[0; 8]);
            }
            Request::Map {
                domain,
                virt_start,
                virt_end,
                phys_start,
                flags,
            } => {
                head(&mut v, VIRTIO_IOMMU_T_MAP);
                v.extend_from_slice(&domain.to_le_bytes());
                v.extend_from_slice(&virt_start.to_le_bytes());
                v.extend_from_slice(&virt_end.to_le_bytes());
                v.extend_from_slice(&phys_start.to_le_bytes());
                v.extend_from_slice(&flags.to_le_bytes());
            }
            Request::Unmap {
                domain,
                virt_start,
                virt_end,
                reserved,
            } => {
                head(&mut v, VIRTIO_IOMMU_T_UNMAP);
                v.extend_from_slice(&domain.to_le_bytes());
                v.extend_from_slice(&virt_start.to_le_bytes());
                v.extend_from_slice(&virt_end.to_le_bytes());
                v.extend_from_slice(&reserved);
            }
            Request::Probe { endpoint } => {
                head(&mut v, VIRTIO_IOMMU_T_PROBE);
                v.extend_from_slice(&endpoint.to_le_bytes());
                v.extend_from_slice(&[0; 64]);
            }
        }
        v
    }

    /// Size of the device-writable buffer a driver provides for it.
    pub fn writable_len(&self, probe_size: u32) -> usize {
        match self {
            Request::Probe { .. } => probe_size as usize + REQ_TAIL_LEN,
            _ => REQ_TAIL_LEN,
        }
    }
}

/// The status in a written buffer (the tail is its last 4 bytes); `None`
/// when the device did not write it (used length 0 or too short).
pub fn parse_tail(written: &[u8]) -> Option<Status> {
    if written.len() < REQ_TAIL_LEN {
        return None;
    }
    Status::from_u8(written[written.len() - REQ_TAIL_LEN])
}

/// A reserved region reported by PROBE (§5.13.6.8.1 Property RESV_MEM).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResvMem {
    /// VIRTIO_IOMMU_RESV_MEM_T_*.
    pub subtype: u8,
    /// First reserved IOVA.
    pub start: u64,
    /// Last reserved IOVA (inclusive).
    pub end: u64,
}

/// Parse the properties a PROBE wrote (the buffer without its tail): the
/// RESV_MEM regions, following the driver rules of §5.13.6.7 (stop at type
/// 0 or the end, skip unknown types and properties with reserved bits).
pub fn parse_probe(props: &[u8]) -> Vec<ResvMem> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at + PROBE_PROPERTY_LEN <= props.len() {
        let word = le16(props, at);
        let ty = word & 0x0fff;
        let reserved = word >> 12;
        let len = le16(props, at + 2) as usize;
        if ty == 0 {
            break;
        }
        let body = at + PROBE_PROPERTY_LEN;
        if body + len > props.len() {
            break;
        }
        if ty == VIRTIO_IOMMU_PROBE_T_RESV_MEM && reserved == 0 && len >= RESV_MEM_LEN {
            out.push(ResvMem {
                subtype: props[body],
                start: le64(props, body + 4),
                end: le64(props, body + 12),
            });
        }
        at = body + len;
    }
    out
}

/// A fault event record for the event virtqueue (§5.13.6.9).
pub fn fault_record(f: &Fault) -> [u8; FAULT_LEN] {
    let reason = match f.reason {
        FaultReason::NoDomain => VIRTIO_IOMMU_FAULT_R_DOMAIN,
        FaultReason::Unmapped | FaultReason::Permission | FaultReason::OutOfRange => {
            VIRTIO_IOMMU_FAULT_R_MAPPING
        }
    };
    let flags = VIRTIO_IOMMU_FAULT_F_ADDRESS
        | match f.access {
            Access::Read => VIRTIO_IOMMU_FAULT_F_READ,
            Access::Write => VIRTIO_IOMMU_FAULT_F_WRITE,
        };
    let mut r = [0u8; FAULT_LEN];
    r[0] = reason;
    r[4..8].copy_from_slice(&flags.to_le_bytes());
    r[8..12].copy_from_slice(&f.pasid.to_le_bytes());
    r[16..24].copy_from_slice(&f.iova.to_le_bytes());
    r
}

/// A decoded fault event record (driver side, §5.13.6.9).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultEvent {
    /// VIRTIO_IOMMU_FAULT_R_*.
    pub reason: u8,
    /// VIRTIO_IOMMU_FAULT_F_*.
    pub flags: u32,
    /// Endpoint ID.
    pub endpoint: u32,
    /// The address, when FAULT_F_ADDRESS is set.
    pub address: Option<u64>,
}

impl FaultEvent {
    /// Decode a record; `None` when the driver must ignore it (non-zero
    /// `reserved`, or too short).
    pub fn decode(b: &[u8]) -> Option<FaultEvent> {
        if b.len() < FAULT_LEN || b[1..4] != [0, 0, 0] {
            return None;
        }
        let flags = le32(b, 4);
        Some(FaultEvent {
            reason: b[0],
            flags,
            endpoint: le32(b, 8),
            address: (flags & VIRTIO_IOMMU_FAULT_F_ADDRESS != 0).then(|| le64(b, 16)),
        })
    }
}
