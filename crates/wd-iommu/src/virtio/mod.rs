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
//!
//! The wire format (constants, requests, statuses, probe properties, fault
//! records) is in `wire`; the device model that serves requests is in
//! `device`.

mod device;
mod wire;

pub use device::*;
pub use wire::*;
