//! The IOTLB gather: what a run of unmaps left to invalidate and release.

/// Something to drop once no engine can reach the memory it keeps alive
/// (an imported region, a pinned buffer): released by the invalidation (or
/// the flush-queue flush) that covers the unmap it was attached to.
pub type Release = Box<dyn Send>;

/// Accumulates the IOVA range, the freed table pages and the releases of
/// several `unmap_fast` calls so one invalidation and one sync cover them
/// all (Linux's `struct iommu_iotlb_gather`). Hand it to
/// [`crate::Domain::iotlb_sync`]. A gather dropped without a sync leaks
/// what it holds rather than release memory an engine may still reach.
#[derive(Default)]
pub struct IotlbGather {
    start: u64,
    end: u64,
    pgsize: u64,
    tables: Vec<u32>,
    releases: Vec<Release>,
    domain: Option<u64>,
}

impl std::fmt::Debug for IotlbGather {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IotlbGather")
            .field("range", &self.range())
            .field("pgsize", &self.pgsize)
            .field("tables", &self.tables.len())
            .field("releases", &self.releases.len())
            .finish()
    }
}

impl IotlbGather {
    /// An empty gather.
    pub fn new() -> IotlbGather {
        IotlbGather::default()
    }

    /// Extend the range to invalidate by `[iova, iova+size)`.
    pub fn add_range(&mut self, iova: u64, size: u64) {
        if size == 0 {
            return;
        }
        let end = iova.saturating_add(size);
        if self.start >= self.end {
            self.start = iova;
            self.end = end;
        } else {
            self.start = self.start.min(iova);
            self.end = self.end.max(end);
        }
        self.pgsize = self.pgsize.max(size.min(1 << 30));
    }

    pub(crate) fn add_table(&mut self, page: u32) {
        self.tables.push(page);
    }

    /// Keep `r` alive until the invalidation of this gather has completed.
    pub fn defer_release(&mut self, r: Release) {
        self.releases.push(r);
    }

    /// The range to invalidate, `[start, end)`, if any.
    pub fn range(&self) -> Option<(u64, u64)> {
        (self.start < self.end).then_some((self.start, self.end))
    }

    /// Largest leaf unmapped (the invalidation granule a hardware IOMMU
    /// would use).
    pub fn pgsize(&self) -> u64 {
        self.pgsize
    }

    /// Whether there is nothing to invalidate or release.
    pub fn is_empty(&self) -> bool {
        self.range().is_none() && self.tables.is_empty() && self.releases.is_empty()
    }

    #[cfg(test)]
    pub(crate) fn tables(&self) -> &[u32] {
        &self.tables
    }

    /// The domain this gather collects for (set by the first unmap).
    pub(crate) fn bind(&mut self, tag: u64) -> bool {
        match self.domain {
            None => {
                self.domain = Some(tag);
                true
            }
            Some(t) => t == tag,
        }
    }

    /// Empty the gather, handing its parts to the caller.
    pub(crate) fn take(&mut self) -> GatherParts {
        let parts = GatherParts {
            domain: self.domain,
            range: self.range(),
            tables: std::mem::take(&mut self.tables),
            releases: std::mem::take(&mut self.releases),
        };
        self.start = 0;
        self.end = 0;
        self.pgsize = 0;
        self.domain = None;
        parts
    }
}

impl Drop for IotlbGather {
    fn drop(&mut self) {
        if !self.releases.is_empty() {
            debug_assert!(false, "IotlbGather dropped without iotlb_sync");
            // Without the invalidation, an engine may still reach what these
            // keep alive: leaking is the safe choice.
            std::mem::forget(std::mem::take(&mut self.releases));
        }
    }
}

/// The contents of a gather being synced.
pub(crate) struct GatherParts {
    /// Tag of the domain the unmaps were made in (None: no unmap).
    pub(crate) domain: Option<u64>,
    pub(crate) range: Option<(u64, u64)>,
    pub(crate) tables: Vec<u32>,
    pub(crate) releases: Vec<Release>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge() {
        let mut g = IotlbGather::new();
        assert!(g.is_empty());
        g.add_range(0x5000, 0x1000);
        g.add_range(0x1000, 0x1000);
        g.add_range(0x3000, 0x20_0000);
        assert_eq!(g.range(), Some((0x1000, 0x20_3000)));
        assert_eq!(g.pgsize(), 0x20_0000);
        assert!(g.bind(7));
        assert!(g.bind(7));
        assert!(!g.bind(8));
        let p = g.take();
        assert_eq!(p.range, Some((0x1000, 0x20_3000)));
        assert!(g.is_empty());
        assert!(g.bind(8));
    }
}
