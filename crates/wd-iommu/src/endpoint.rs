//! Endpoints: what a queue's device accesses translate through.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::Domain;

/// Where an endpoint's accesses go.
#[derive(Clone, Debug)]
pub enum Attachment {
    /// Through this domain.
    Domain(Arc<Domain>),
    /// Nowhere: every access faults with "no domain".
    Blocked,
}

/// A device endpoint (one queue). It owns a default domain (the host-managed
/// mappings of memory the client shared, which virtio-iommu presents as
/// bypass) and may be attached to another domain instead.
pub struct Endpoint {
    id: u32,
    default: Arc<Domain>,
    current: RwLock<Attachment>,
    /// Bumped by every `attach`, so an engine can keep the attachment it
    /// took and take it again only when this changed (no lock per pass).
    generation: AtomicU64,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("id", &self.id)
            .field("attachment", &self.attachment())
            .finish()
    }
}

impl Endpoint {
    /// An endpoint translating through its default domain.
    pub fn new(id: u32, default: Arc<Domain>) -> Endpoint {
        Endpoint {
            id,
            current: RwLock::new(Attachment::Domain(default.clone())),
            default,
            generation: AtomicU64::new(0),
        }
    }

    /// Its id (the queue id; the virtio endpoint ID).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Its default domain.
    pub fn default_domain(&self) -> &Arc<Domain> {
        &self.default
    }

    /// What it translates through now. Engines take this once per section
    /// and keep it for the section.
    pub fn attachment(&self) -> Attachment {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The domain its faults and stalls belong to now (the default domain
    /// while blocked).
    pub fn fault_domain(&self) -> Arc<Domain> {
        match self.attachment() {
            Attachment::Domain(d) => d,
            Attachment::Blocked => self.default.clone(),
        }
    }

    /// The attachment's generation. An engine reads it inside its
    /// section (after `EngineTlb::enter`) and takes [`Endpoint::attachment`]
    /// again only when it changed since it last did.
    pub fn generation(&self) -> u64 {
        // SeqCst: with the SeqCst bump in `attach` and the SeqCst section
        // entry of engines and the sync's command, an engine entering a
        // section after the sync sees the bump, and one that entered before
        // is waited for by the sync.
        self.generation.load(Ordering::SeqCst)
    }

    /// Switch what it translates through, and wait (a sync on the IOMMU)
    /// until no engine can still use the previous attachment.
    pub fn attach(&self, a: Attachment) {
        let old = std::mem::replace(
            &mut *self.current.write().unwrap_or_else(|e| e.into_inner()),
            a,
        );
        // SeqCst: pairs with the load in `generation`, before the sync.
        self.generation.fetch_add(1, Ordering::SeqCst);
        // An engine in a section that took the old attachment still holds
        // it: the sync waits for that section to end (and for requests
        // held through the old domain). A blocked endpoint translates
        // nothing and nothing is held through it: only the sections are
        // waited for (and the endpoint's own domain's held requests), not
        // every engine that keeps requests held, another client's among
        // them, for as long as it keeps them coming.
        match &old {
            Attachment::Domain(d) => self.default.iommu().sync_domain(d.tag()),
            Attachment::Blocked => self.default.iommu().sync_domain(self.default.tag()),
        }
        drop(old);
    }

    /// Whether it currently translates through `d`.
    pub fn is_attached_to(&self, d: &Arc<Domain>) -> bool {
        matches!(&*self.current.read().unwrap_or_else(|e| e.into_inner()),
            Attachment::Domain(x) if Arc::ptr_eq(x, d))
    }
}
