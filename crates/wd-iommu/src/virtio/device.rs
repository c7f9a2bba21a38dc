//! The virtio-iommu device model: domains, endpoints and mappings of one
//! client, served request by request.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::wire::*;
use crate::{
    Attachment, Domain, DomainConfig, Endpoint, Iommu, IommuError, IotlbGather, Prot, Release,
    IOVA_LIMIT, PAGE_SIZE, PAGE_SIZES,
};

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
                // Its root table is charged to the owner's budget, as a
                // MAP's tables are: refused the same way.
                // The old domain's tables go back to the budget when the
                // move ends it, unless a device holds it (a translation in
                // flight, an engine's view of the attachment).
                let old_freed = frees_one
                    && old
                        .and_then(|o| self.domains.get(&o))
                        .is_some_and(|d| Arc::strong_count(&d.dom) <= 2);
                let dom = match Domain::new(&self.iommu, endpoint, cfg.clone()) {
                    Ok(dom) => dom,
                    // At the budget's edge the old domain, which the move
                    // ends, holds the root the new one needs: the move is
                    // made as DETACH then ATTACH. (Only when that frees the
                    // root: a refusal leaves everything as it was.)
                    Err(_) if old_freed => {
                        self.detach_inner(endpoint, old.expect("frees_one"));
                        let Ok(dom) = Domain::new(&self.iommu, endpoint, cfg) else {
                            return Status::NoMem;
                        };
                        dom
                    }
                    Err(_) => return Status::NoMem,
                };
                let dom = Arc::new(dom);
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
            Err(e) if e.is_resource_limit() => return Status::NoMem,
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
