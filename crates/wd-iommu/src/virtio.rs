//! virtio-iommu: the request decoder and device model.
//!
//! Follows the virtio specification v1.2, section 5.13 "IOMMU Device"
//! (`device-types/iommu/description.tex` in the OASIS virtio-spec sources);
//! every constant below names the subsection it comes from. A request is a
//! device-readable buffer (`struct virtio_iommu_req_head` and the request's
//! fields) and a device-writable buffer (for PROBE the properties, then
//! `struct virtio_iommu_req_tail`); the device answers with the number of
//! bytes it wrote (the used length), 0 meaning it did not write at all.
//!
//! Endpoints are the client's queues (endpoint ID = queue id); "physical"
//! addresses in MAP requests are the client's guest-physical addresses,
//! resolved through [`GuestMemory`] (in the host: memory the client shared).
//! An endpoint not attached to a domain is in bypass mode when the config
//! field `bypass` is 1, and then translates through its default domain
//! (the identity mappings of the memory it shared); otherwise it is blocked.
//!
//! Choices where the specification leaves freedom (all conformant):
//! * a readable buffer too short for its request type (the tail being
//!   findable) is `VIRTIO_IOMMU_S_IOERR` (a virtio communication error);
//! * `virt_end < virt_start` is `VIRTIO_IOMMU_S_INVAL`;
//! * a MAP whose range overlaps a RESV_MEM region, or lies outside
//!   `input_range`, is `VIRTIO_IOMMU_S_RANGE`;
//! * a MAP whose physical range is not guest memory, or is memory the
//!   client did not share with the access the MAP asks for, is
//!   `VIRTIO_IOMMU_S_FAULT` (bad address);
//! * an ATTACH to a domain ID outside `domain_range` is
//!   `VIRTIO_IOMMU_S_RANGE`;
//! * an UNMAP with non-zero `reserved` is `VIRTIO_IOMMU_S_INVAL` and
//!   unmaps nothing;
//! * every table a client grows has a named limit, `VIRTIO_IOMMU_S_NOMEM`
//!   beyond it ([`MAX_DOMAINS`], [`MAX_MAPPINGS`], the domain's page and
//!   table-page limits).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::{
    Access, Attachment, Domain, DomainConfig, Endpoint, Fault, FaultReason, Iommu, IommuError,
    IotlbGather, Prot, Release, IOVA_LIMIT, PAGE_SIZE, PAGE_SIZES,
};

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

/// The guest-physical memory MAP requests name.
pub trait GuestMemory {
    /// Resolve `[gpa, gpa+size)` to host physical runs (page aligned,
    /// covering exactly `size` bytes in order) and something that keeps them
    /// alive until released; `None` if any byte is not guest memory, or is
    /// guest memory the driver may not give `prot` access to.
    fn resolve(&self, gpa: u64, size: u64, prot: Prot) -> Option<(Vec<(u64, u64)>, Release)>;
}

/// Settings of a device instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSettings {
    /// Feature bits offered (bit numbers as `1 << VIRTIO_IOMMU_F_*`).
    pub features: u64,
    /// `input_range` (inclusive).
    pub input_range: (u64, u64),
    /// `domain_range` (inclusive).
    pub domain_range: (u32, u32),
    /// `probe_size`.
    pub probe_size: u32,
    /// Initial `bypass`.
    pub bypass: bool,
    /// Template of the domains ATTACH creates (mode and fault policy come
    /// from the attaching endpoint's default domain).
    pub domain: DomainConfig,
}

impl Default for DeviceSettings {
    fn default() -> Self {
        DeviceSettings {
            features: (1 << VIRTIO_IOMMU_F_INPUT_RANGE)
                | (1 << VIRTIO_IOMMU_F_DOMAIN_RANGE)
                | (1 << VIRTIO_IOMMU_F_MAP_UNMAP)
                | (1 << VIRTIO_IOMMU_F_PROBE)
                | (1 << VIRTIO_IOMMU_F_BYPASS_CONFIG),
            input_range: (0, IOVA_LIMIT - 1),
            domain_range: (0, DOMAIN_ID_MAX),
            probe_size: PROBE_SIZE,
            bypass: true,
            domain: DomainConfig::default(),
        }
    }
}

/// Errors of the device's host-facing calls.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VirtioError {
    /// [`MAX_ENDPOINTS`] reached.
    #[error("the device already manages {MAX_ENDPOINTS} endpoints")]
    TooManyEndpoints,
    /// The endpoint ID is in use.
    #[error("endpoint {0} already exists")]
    DuplicateEndpoint(u32),
    /// More than [`MAX_RESV`] reserved regions.
    #[error("at most {MAX_RESV} reserved regions per endpoint")]
    TooManyRegions,
    /// A config write outside `bypass`, or without BYPASS_CONFIG.
    #[error("config bytes {offset}+{len} are not writable (only bypass, with VIRTIO_IOMMU_F_BYPASS_CONFIG)")]
    ReadOnlyConfig {
        /// Offset written.
        offset: usize,
        /// Bytes written.
        len: usize,
    },
    /// `bypass` may only be 0 or 1.
    #[error("bypass must be 0 or 1, not {0}")]
    BadBypass(u8),
}

struct VMapping {
    /// Last IOVA (inclusive).
    end: u64,
    pin: Release,
}

struct VDomain {
    dom: Arc<Domain>,
    bypass: bool,
    endpoints: BTreeSet<u32>,
    mappings: BTreeMap<u64, VMapping>,
}

struct VEndpoint {
    ep: Arc<Endpoint>,
    domain: Option<u32>,
    resv: Vec<ResvMem>,
}

/// Requests handled, by outcome.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VirtioStats {
    /// Requests seen.
    pub requests: u64,
    /// Requests completed with OK.
    pub ok: u64,
    /// Requests completed with another status.
    pub failed: u64,
    /// Requests returned unwritten (unknown type, no room for the tail).
    pub unwritten: u64,
}

/// A virtio-iommu device: its domains, endpoints and config.
pub struct VirtioIommu {
    iommu: Arc<Iommu>,
    s: DeviceSettings,
    bypass: u8,
    domains: BTreeMap<u32, VDomain>,
    endpoints: BTreeMap<u32, VEndpoint>,
    /// UNMAPs of the current kick not yet synced: one gather, one sync.
    pending: Option<(u32, IotlbGather)>,
    stats: VirtioStats,
}

impl std::fmt::Debug for VirtioIommu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VirtioIommu")
            .field("domains", &self.domains.len())
            .field("endpoints", &self.endpoints.len())
            .field("bypass", &self.bypass)
            .finish()
    }
}

/// One buffer pair of a kick: the device-readable bytes, the
/// device-writable buffer, and (after the kick) the used length.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Buffer {
    /// Device-readable part.
    pub readable: Vec<u8>,
    /// Device-writable part.
    pub writable: Vec<u8>,
    /// Bytes the device wrote (0: not written).
    pub used: usize,
}

impl VirtioIommu {
    /// A device with no endpoint and no domain.
    pub fn new(iommu: &Arc<Iommu>, s: DeviceSettings) -> VirtioIommu {
        VirtioIommu {
            iommu: iommu.clone(),
            bypass: s.bypass as u8,
            s,
            domains: BTreeMap::new(),
            endpoints: BTreeMap::new(),
            pending: None,
            stats: VirtioStats::default(),
        }
    }

    fn has(&self, bit: u32) -> bool {
        self.s.features & (1 << bit) != 0
    }

    /// Feature bits offered.
    pub fn features(&self) -> u64 {
        self.s.features
    }

    /// Counters so far.
    pub fn stats(&self) -> VirtioStats {
        self.stats
    }

    /// `struct virtio_iommu_config` as the driver reads it (§5.13.4).
    pub fn config_bytes(&self) -> [u8; CONFIG_LEN] {
        let mut c = [0u8; CONFIG_LEN];
        c[CONFIG_PAGE_SIZE_MASK..8].copy_from_slice(&PAGE_SIZES.to_le_bytes());
        c[CONFIG_INPUT_RANGE..16].copy_from_slice(&self.s.input_range.0.to_le_bytes());
        c[16..24].copy_from_slice(&self.s.input_range.1.to_le_bytes());
        c[CONFIG_DOMAIN_RANGE..28].copy_from_slice(&self.s.domain_range.0.to_le_bytes());
        c[28..32].copy_from_slice(&self.s.domain_range.1.to_le_bytes());
        c[CONFIG_PROBE_SIZE..36].copy_from_slice(&self.s.probe_size.to_le_bytes());
        c[CONFIG_BYPASS] = self.bypass;
        c
    }

    /// A driver write to the config: only `bypass`, 0 or 1, and only with
    /// VIRTIO_IOMMU_F_BYPASS_CONFIG (§5.13.4.1). Unattached endpoints follow
    /// the new value at once.
    pub fn write_config(&mut self, offset: usize, data: &[u8]) -> Result<(), VirtioError> {
        if !self.has(VIRTIO_IOMMU_F_BYPASS_CONFIG) || offset != CONFIG_BYPASS || data.len() != 1 {
            return Err(VirtioError::ReadOnlyConfig {
                offset,
                len: data.len(),
            });
        }
        if data[0] > 1 {
            return Err(VirtioError::BadBypass(data[0]));
        }
        self.flush_pending();
        self.bypass = data[0];
        for v in self.endpoints.values().filter(|v| v.domain.is_none()) {
            let a = self.unattached(&v.ep);
            v.ep.attach(a);
        }
        Ok(())
    }

    fn bypassing(&self) -> bool {
        (self.has(VIRTIO_IOMMU_F_BYPASS_CONFIG) && self.bypass == 1)
            || self.has(VIRTIO_IOMMU_F_BYPASS)
    }

    fn unattached(&self, ep: &Arc<Endpoint>) -> Attachment {
        if self.bypassing() {
            Attachment::Domain(ep.default_domain().clone())
        } else {
            Attachment::Blocked
        }
    }

    /// Manage an endpoint (a queue); `resv` are its RESV_MEM regions. It
    /// starts unattached.
    pub fn add_endpoint(
        &mut self,
        ep: Arc<Endpoint>,
        resv: Vec<ResvMem>,
    ) -> Result<(), VirtioError> {
        if self.endpoints.len() >= MAX_ENDPOINTS {
            return Err(VirtioError::TooManyEndpoints);
        }
        if resv.len() > MAX_RESV {
            return Err(VirtioError::TooManyRegions);
        }
        if self.endpoints.contains_key(&ep.id()) {
            return Err(VirtioError::DuplicateEndpoint(ep.id()));
        }
        let a = self.unattached(&ep);
        ep.attach(a);
        self.endpoints.insert(
            ep.id(),
            VEndpoint {
                ep,
                domain: None,
                resv,
            },
        );
        Ok(())
    }

    /// Stop managing an endpoint (its queue is gone): it is detached, and a
    /// domain left without endpoints disappears.
    pub fn remove_endpoint(&mut self, id: u32) {
        self.flush_pending();
        if let Some(d) = self.endpoints.get(&id).and_then(|v| v.domain) {
            self.detach_inner(id, d);
        }
        if let Some(v) = self.endpoints.remove(&id) {
            v.ep.attach(Attachment::Domain(v.ep.default_domain().clone()));
        }
    }

    /// The domain an endpoint is attached to.
    pub fn endpoint_domain(&self, id: u32) -> Option<u32> {
        self.endpoints.get(&id).and_then(|v| v.domain)
    }

    /// A domain's address space.
    pub fn domain(&self, id: u32) -> Option<&Arc<Domain>> {
        self.domains.get(&id).map(|d| &d.dom)
    }

    /// Domains alive.
    pub fn domain_count(&self) -> usize {
        self.domains.len()
    }

    /// Mappings of a domain, as (virt_start, virt_end) inclusive.
    pub fn mappings(&self, id: u32) -> Vec<(u64, u64)> {
        self.domains
            .get(&id)
            .map(|d| d.mappings.iter().map(|(s, m)| (*s, m.end)).collect())
            .unwrap_or_default()
    }

    /// Handle one request and complete it (syncing its invalidation).
    /// Returns the used length.
    pub fn handle(&mut self, readable: &[u8], writable: &mut [u8], mem: &dyn GuestMemory) -> usize {
        let used = self.request(readable, writable, mem);
        self.flush_pending();
        used
    }

    /// Handle the buffers of one kick in order; consecutive UNMAPs of a
    /// domain share one gathered invalidation, synced before any other
    /// request runs and before the kick returns.
    pub fn kick(&mut self, bufs: &mut [Buffer], mem: &dyn GuestMemory) {
        for b in bufs.iter_mut() {
            b.used = self.request(&b.readable, &mut b.writable, mem);
        }
        self.flush_pending();
    }

    fn flush_pending(&mut self) {
        if let Some((id, mut g)) = self.pending.take() {
            match self.domains.get(&id) {
                Some(d) => d.dom.iotlb_sync(&mut g),
                None => debug_assert!(g.is_empty(), "domains go away only after a flush"),
            }
        }
    }

    fn request(&mut self, readable: &[u8], writable: &mut [u8], mem: &dyn GuestMemory) -> usize {
        self.stats.requests += 1;
        let decoded = Request::decode(readable);
        // Unknown types: the buffer is left untouched, used length 0
        // (§5.13.6.2). PROBE without the feature likewise (§5.13.6.7.2).
        let unwritten = match decoded {
            Err(DecodeError::NoHead) | Err(DecodeError::UnknownType(_)) => true,
            Err(DecodeError::Truncated { ty, .. }) => {
                ty == VIRTIO_IOMMU_T_PROBE && !self.has(VIRTIO_IOMMU_F_PROBE)
            }
            Ok(Request::Probe { .. }) => !self.has(VIRTIO_IOMMU_F_PROBE),
            Ok(_) => false,
        };
        // Without room for the tail the device cannot answer (§5.13.6).
        if unwritten || writable.len() < REQ_TAIL_LEN {
            self.stats.unwritten += 1;
            return 0;
        }
        let is_unmap = matches!(decoded, Ok(Request::Unmap { .. }));
        if !is_unmap {
            self.flush_pending();
        }
        let tail_at;
        let status = match decoded {
            Err(_) => {
                tail_at = if readable.first() == Some(&VIRTIO_IOMMU_T_PROBE) {
                    writable.len() - REQ_TAIL_LEN
                } else {
                    0
                };
                Status::IoErr
            }
            Ok(Request::Probe { endpoint }) => {
                tail_at = writable.len() - REQ_TAIL_LEN;
                let (props, _) = writable.split_at_mut(tail_at);
                self.probe(endpoint, props)
            }
            Ok(r) => {
                tail_at = 0;
                match r {
                    Request::Attach {
                        domain,
                        endpoint,
                        flags,
                        reserved,
                    } => self.attach(domain, endpoint, flags, reserved),
                    Request::Detach { domain, endpoint } => self.detach(domain, endpoint),
                    Request::Map {
                        domain,
                        virt_start,
                        virt_end,
                        phys_start,
                        flags,
                    } => self.map(domain, virt_start, virt_end, phys_start, flags, mem),
                    Request::Unmap {
                        domain,
                        virt_start,
                        virt_end,
                        reserved,
                    } => self.unmap(domain, virt_start, virt_end, reserved),
                    Request::Probe { .. } => unreachable!("handled above"),
                }
            }
        };
        // The tail: status, reserved set to zero (§5.13.6.2).
        writable[tail_at..tail_at + REQ_TAIL_LEN].copy_from_slice(&[status as u8, 0, 0, 0]);
        if status == Status::Ok {
            self.stats.ok += 1;
        } else {
            self.stats.failed += 1;
        }
        tail_at + REQ_TAIL_LEN
    }

    // ------------------------------------------------------------ ATTACH

    fn attach(&mut self, domain: u32, endpoint: u32, flags: u32, reserved: [u8; 4]) -> Status {
        // §5.13.6.3.2: reserved not zero, or an unknown flag: INVAL.
        if reserved != [0; 4] {
            return Status::Inval;
        }
        let known = if self.has(VIRTIO_IOMMU_F_BYPASS_CONFIG) {
            VIRTIO_IOMMU_ATTACH_F_BYPASS
        } else {
            0
        };
        if flags & !known != 0 {
            return Status::Inval;
        }
        let Some(v) = self.endpoints.get(&endpoint) else {
            return Status::NoEnt;
        };
        let ep = v.ep.clone();
        let old = v.domain;
        if self.has(VIRTIO_IOMMU_F_DOMAIN_RANGE)
            && !(self.s.domain_range.0..=self.s.domain_range.1).contains(&domain)
        {
            return Status::Range;
        }
        let bypass = flags & VIRTIO_IOMMU_ATTACH_F_BYPASS != 0;
        match self.domains.get(&domain) {
            Some(d) if d.bypass != bypass => return Status::Inval,
            Some(d) if d.endpoints.contains(&endpoint) => return Status::Ok,
            Some(_) => {}
            None => {
                // A move that empties the endpoint's old domain frees a slot.
                let frees_one = old
                    .and_then(|o| self.domains.get(&o))
                    .is_some_and(|d| d.endpoints.len() == 1);
                if self.domains.len() >= MAX_DOMAINS && !frees_one {
                    return Status::NoMem;
                }
                let def = ep.default_domain();
                let mut cfg = self.s.domain.clone();
                cfg.mode = def.mode();
                cfg.fault_policy = def.fault_policy();
                let dom = Arc::new(Domain::new(&self.iommu, endpoint, cfg));
                self.iommu.track(&dom);
                self.domains.insert(
                    domain,
                    VDomain {
                        dom,
                        bypass,
                        endpoints: BTreeSet::new(),
                        mappings: BTreeMap::new(),
                    },
                );
            }
        }
        let d = self.domains.get_mut(&domain).expect("exists now");
        d.endpoints.insert(endpoint);
        let a = if d.bypass {
            Attachment::Domain(ep.default_domain().clone())
        } else {
            Attachment::Domain(d.dom.clone())
        };
        // An endpoint attached elsewhere moves: as if DETACH then ATTACH.
        ep.attach(a);
        if let Some(o) = old {
            if let Some(od) = self.domains.get_mut(&o) {
                od.endpoints.remove(&endpoint);
                if od.endpoints.is_empty() {
                    self.destroy_domain(o);
                }
            }
        }
        if let Some(v) = self.endpoints.get_mut(&endpoint) {
            v.domain = Some(domain);
        }
        Status::Ok
    }

    // ------------------------------------------------------------ DETACH

    fn detach(&mut self, domain: u32, endpoint: u32) -> Status {
        // §5.13.6.4.2: reserved ignored; unknown endpoint NOENT; unknown
        // domain or not attached to it INVAL.
        let Some(v) = self.endpoints.get(&endpoint) else {
            return Status::NoEnt;
        };
        if v.domain != Some(domain) || !self.domains.contains_key(&domain) {
            return Status::Inval;
        }
        self.detach_inner(endpoint, domain);
        Status::Ok
    }

    fn detach_inner(&mut self, endpoint: u32, domain: u32) {
        let Some(v) = self.endpoints.get(&endpoint) else {
            return;
        };
        let a = self.unattached(&v.ep);
        v.ep.attach(a);
        if let Some(v) = self.endpoints.get_mut(&endpoint) {
            v.domain = None;
        }
        if let Some(d) = self.domains.get_mut(&domain) {
            d.endpoints.remove(&endpoint);
            if d.endpoints.is_empty() {
                // "After all endpoints have been successfully detached from
                // a domain, it ceases to exist" (§5.13.6.4).
                self.destroy_domain(domain);
            }
        }
    }

    fn destroy_domain(&mut self, id: u32) {
        if matches!(self.pending, Some((p, _)) if p == id) {
            self.flush_pending();
        }
        let Some(d) = self.domains.remove(&id) else {
            return;
        };
        let mut g = IotlbGather::new();
        for (start, m) in d.mappings {
            let _ = d.dom.unmap_fast(start, m.end - start + 1, &mut g);
            g.defer_release(m.pin);
        }
        d.dom.iotlb_sync(&mut g);
        d.dom.flush_iotlb_all();
    }

    // ------------------------------------------------------------ MAP

    fn map(
        &mut self,
        domain: u32,
        virt_start: u64,
        virt_end: u64,
        phys_start: u64,
        flags: u32,
        mem: &dyn GuestMemory,
    ) -> Status {
        // §5.13.6.5.2, in this order: unknown flag INVAL; unknown domain
        // NOENT; bypass domain INVAL; misaligned RANGE; existing mapping
        // INVAL.
        let mut known = VIRTIO_IOMMU_MAP_F_READ | VIRTIO_IOMMU_MAP_F_WRITE;
        if self.has(VIRTIO_IOMMU_F_MMIO) {
            known |= VIRTIO_IOMMU_MAP_F_MMIO;
        }
        if flags & !known != 0 {
            return Status::Inval;
        }
        let Some(d) = self.domains.get(&domain) else {
            return Status::NoEnt;
        };
        if d.bypass {
            return Status::Inval;
        }
        if virt_start % PAGE_SIZE != 0
            || phys_start % PAGE_SIZE != 0
            || virt_end.wrapping_add(1) % PAGE_SIZE != 0
        {
            return Status::Range;
        }
        if virt_end < virt_start {
            return Status::Inval;
        }
        let (lo, hi) = if self.has(VIRTIO_IOMMU_F_INPUT_RANGE) {
            self.s.input_range
        } else {
            (0, u64::MAX)
        };
        if virt_start < lo || virt_end > hi || virt_end >= IOVA_LIMIT {
            return Status::Range;
        }
        let size = virt_end - virt_start + 1;
        if phys_start.checked_add(size - 1).is_none() {
            return Status::Range;
        }
        let resv_hit = d.endpoints.iter().any(|e| {
            self.endpoints.get(e).is_some_and(|v| {
                v.resv
                    .iter()
                    .any(|r| r.start <= virt_end && virt_start <= r.end)
            })
        });
        if resv_hit {
            return Status::Range;
        }
        let overlaps = d
            .mappings
            .range(..=virt_end)
            .next_back()
            .is_some_and(|(_, m)| m.end >= virt_start);
        if overlaps {
            return Status::Inval;
        }
        if d.mappings.len() >= MAX_MAPPINGS {
            return Status::NoMem;
        }
        let mut prot = Prot::NONE;
        if flags & VIRTIO_IOMMU_MAP_F_READ != 0 {
            prot = prot | Prot::READ;
        }
        if flags & VIRTIO_IOMMU_MAP_F_WRITE != 0 {
            prot = prot | Prot::WRITE;
        }
        let Some((sg, pin)) = mem.resolve(phys_start, size, prot) else {
            return Status::Fault;
        };
        if sg.iter().map(|r| r.1).sum::<u64>() != size {
            return Status::DevErr;
        }
        let dom = d.dom.clone();
        match dom.map_sg(virt_start, &sg, prot) {
            Ok(_) => {}
            Err(IommuError::LimitExceeded { .. }) | Err(IommuError::TableLimit { .. }) => {
                return Status::NoMem
            }
            Err(IommuError::Overlap { .. }) => return Status::Inval,
            Err(_) => return Status::DevErr,
        }
        let d = self.domains.get_mut(&domain).expect("looked up above");
        d.mappings
            .insert(virt_start, VMapping { end: virt_end, pin });
        Status::Ok
    }

    // ------------------------------------------------------------ UNMAP

    fn unmap(&mut self, domain: u32, virt_start: u64, virt_end: u64, reserved: [u8; 4]) -> Status {
        // §5.13.6.6.2: reserved non-zero MAY be INVAL; unknown domain NOENT;
        // bypass domain INVAL; a split mapping RANGE and nothing removed;
        // otherwise every mapping within the range goes, OK.
        if reserved != [0; 4] {
            return Status::Inval;
        }
        let Some(d) = self.domains.get(&domain) else {
            return Status::NoEnt;
        };
        if d.bypass {
            return Status::Inval;
        }
        if virt_start % PAGE_SIZE != 0 || virt_end.wrapping_add(1) % PAGE_SIZE != 0 {
            return Status::Range;
        }
        if virt_end < virt_start {
            return Status::Inval;
        }
        let mut victims = Vec::new();
        if let Some((_, m)) = d.mappings.range(..virt_start).next_back() {
            if m.end >= virt_start {
                return Status::Range; // starts before the range
            }
        }
        for (&s, m) in d.mappings.range(virt_start..=virt_end) {
            if m.end > virt_end {
                return Status::Range; // ends after the range
            }
            victims.push(s);
        }
        if victims.is_empty() {
            return Status::Ok;
        }
        if !matches!(self.pending, Some((p, _)) if p == domain) {
            self.flush_pending();
            self.pending = Some((domain, IotlbGather::new()));
        }
        let Some((_, g)) = self.pending.as_mut() else {
            return Status::DevErr;
        };
        let d = self.domains.get_mut(&domain).expect("looked up above");
        let mut status = Status::Ok;
        for s in victims {
            let m = d.mappings.remove(&s).expect("listed above");
            if d.dom.unmap_fast(s, m.end - s + 1, g).is_err() {
                status = Status::DevErr;
            }
            g.defer_release(m.pin);
        }
        status
    }

    // ------------------------------------------------------------ PROBE

    fn probe(&mut self, endpoint: u32, props: &mut [u8]) -> Status {
        // §5.13.6.7.2: unknown endpoint NOENT; a properties buffer smaller
        // than probe_size INVAL without writing any property; properties
        // back to back, the rest zeroed.
        let Some(v) = self.endpoints.get(&endpoint) else {
            return Status::NoEnt;
        };
        if props.len() < self.s.probe_size as usize {
            return Status::Inval;
        }
        props.fill(0);
        let mut at = 0usize;
        for r in &v.resv {
            if at + PROBE_PROPERTY_LEN + RESV_MEM_LEN > self.s.probe_size as usize {
                return Status::DevErr;
            }
            props[at..at + 2].copy_from_slice(&VIRTIO_IOMMU_PROBE_T_RESV_MEM.to_le_bytes());
            props[at + 2..at + 4].copy_from_slice(&(RESV_MEM_LEN as u16).to_le_bytes());
            let b = at + PROBE_PROPERTY_LEN;
            props[b] = r.subtype;
            props[b + 4..b + 12].copy_from_slice(&r.start.to_le_bytes());
            props[b + 12..b + 20].copy_from_slice(&r.end.to_le_bytes());
            at = b + RESV_MEM_LEN;
        }
        Status::Ok
    }
}

impl Drop for VirtioIommu {
    fn drop(&mut self) {
        self.flush_pending();
        let ids: Vec<u32> = self.endpoints.keys().copied().collect();
        for id in ids {
            self.remove_endpoint(id);
        }
        let doms: Vec<u32> = self.domains.keys().copied().collect();
        for d in doms {
            self.destroy_domain(d);
        }
    }
}
