//! The IOTLB: one engine's private cache of translations.
//!
//! Direct-mapped, one array per leaf size (4 KiB pages, 2 MiB and 1 GiB
//! blocks), entries tagged with the domain's tag. Only valid leaves are
//! cached, never a miss, so a map never makes an entry stale and only unmaps
//! need invalidation.

use crate::table::Leaf;
use crate::Prot;

/// Entries for 4 KiB pages.
pub const IOTLB_PAGES: usize = 1024;
/// Entries for 2 MiB blocks.
pub const IOTLB_BLOCKS_2M: usize = 64;
/// Entries for 1 GiB blocks.
pub const IOTLB_BLOCKS_1G: usize = 16;
/// A range invalidation of more pages than this scans the whole array
/// instead of probing page by page.
const PROBE_LIMIT: u64 = (IOTLB_PAGES / 4) as u64;

#[derive(Clone, Copy, Default)]
struct Entry {
    /// Domain tag; 0 marks an empty entry (tags start at 1).
    tag: u64,
    vpn: u64,
    phys: u64,
    prot: Prot,
}

struct Way {
    shift: u32,
    e: Box<[Entry]>,
}

impl Way {
    fn new(shift: u32, n: usize) -> Way {
        debug_assert!(n.is_power_of_two());
        Way {
            shift,
            e: vec![Entry::default(); n].into_boxed_slice(),
        }
    }

    #[inline]
    fn slot(&self, tag: u64, vpn: u64) -> usize {
        let h = vpn ^ tag.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(17);
        (h as usize) & (self.e.len() - 1)
    }

    #[inline]
    fn lookup(&self, tag: u64, iova: u64) -> Option<Leaf> {
        let vpn = iova >> self.shift;
        let e = &self.e[self.slot(tag, vpn)];
        (e.tag == tag && e.vpn == vpn).then_some(Leaf {
            iova: vpn << self.shift,
            shift: self.shift,
            phys: e.phys,
            prot: e.prot,
        })
    }

    fn insert(&mut self, tag: u64, l: &Leaf) {
        let vpn = l.iova >> self.shift;
        let s = self.slot(tag, vpn);
        self.e[s] = Entry {
            tag,
            vpn,
            phys: l.phys,
            prot: l.prot,
        };
    }

    /// Drop entries of `tag` intersecting `[start, end)`; returns how many.
    fn invalidate_range(&mut self, tag: u64, start: u64, end: u64) -> usize {
        if start >= end {
            return 0;
        }
        let first = start >> self.shift;
        let last = (end - 1) >> self.shift;
        let mut n = 0;
        if last - first < PROBE_LIMIT.min(self.e.len() as u64) {
            for vpn in first..=last {
                let s = self.slot(tag, vpn);
                let e = &mut self.e[s];
                if e.tag == tag && e.vpn == vpn {
                    e.tag = 0;
                    n += 1;
                }
            }
        } else {
            for e in self.e.iter_mut() {
                if e.tag == tag && e.vpn >= first && e.vpn <= last {
                    e.tag = 0;
                    n += 1;
                }
            }
        }
        n
    }

    fn invalidate_tag(&mut self, tag: u64) -> usize {
        let mut n = 0;
        for e in self.e.iter_mut().filter(|e| e.tag == tag) {
            e.tag = 0;
            n += 1;
        }
        n
    }

    fn clear(&mut self) {
        self.e.fill(Entry::default());
    }

    fn occupied(&self) -> usize {
        self.e.iter().filter(|e| e.tag != 0).count()
    }
}

/// One engine's translation cache.
pub struct Iotlb {
    ways: [Way; 3],
}

impl Default for Iotlb {
    fn default() -> Self {
        Iotlb::new()
    }
}

impl std::fmt::Debug for Iotlb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Iotlb")
            .field("entries", &self.occupied())
            .finish()
    }
}

impl Iotlb {
    /// An empty cache.
    pub fn new() -> Iotlb {
        Iotlb {
            ways: [
                Way::new(12, IOTLB_PAGES),
                Way::new(21, IOTLB_BLOCKS_2M),
                Way::new(30, IOTLB_BLOCKS_1G),
            ],
        }
    }

    /// The cached leaf covering `iova` in the domain tagged `tag`.
    #[inline]
    pub fn lookup(&self, tag: u64, iova: u64) -> Option<Leaf> {
        self.ways[0]
            .lookup(tag, iova)
            .or_else(|| self.ways[1].lookup(tag, iova))
            .or_else(|| self.ways[2].lookup(tag, iova))
    }

    /// Cache a leaf found by a walk.
    pub fn insert(&mut self, tag: u64, l: &Leaf) {
        let w = match l.shift {
            12 => 0,
            21 => 1,
            _ => 2,
        };
        self.ways[w].insert(tag, l);
    }

    /// Drop the domain's entries intersecting `[start, end)`.
    pub fn invalidate_range(&mut self, tag: u64, start: u64, end: u64) -> usize {
        self.ways
            .iter_mut()
            .map(|w| w.invalidate_range(tag, start, end))
            .sum()
    }

    /// Drop every entry of the domain.
    pub fn invalidate_domain(&mut self, tag: u64) -> usize {
        self.ways.iter_mut().map(|w| w.invalidate_tag(tag)).sum()
    }

    /// Drop everything.
    pub fn invalidate_all(&mut self) {
        for w in &mut self.ways {
            w.clear();
        }
    }

    /// Entries held.
    pub fn occupied(&self) -> usize {
        self.ways.iter().map(Way::occupied).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(iova: u64, shift: u32, phys: u64) -> Leaf {
        Leaf {
            iova,
            shift,
            phys,
            prot: Prot::RW,
        }
    }

    #[test]
    fn lookup_invalidate() {
        let mut t = Iotlb::new();
        t.insert(1, &leaf(0x5000, 12, 0x9000));
        t.insert(1, &leaf(0x20_0000, 21, 0x4000_0000));
        t.insert(2, &leaf(0x5000, 12, 0xa000));
        assert_eq!(t.lookup(1, 0x5123).unwrap().phys, 0x9000);
        assert_eq!(t.lookup(2, 0x5123).unwrap().phys, 0xa000);
        assert_eq!(t.lookup(1, 0x21_0000).unwrap().iova, 0x20_0000);
        assert!(t.lookup(3, 0x5000).is_none());
        assert_eq!(t.invalidate_range(1, 0x5fff, 0x6000), 1);
        assert!(t.lookup(1, 0x5000).is_none());
        assert!(t.lookup(2, 0x5000).is_some());
        // A range touching one byte of a block drops the block.
        assert_eq!(t.invalidate_range(1, 0x3f_ffff, 0x40_0000), 1);
        assert!(t.lookup(1, 0x20_0000).is_none());
        assert_eq!(t.invalidate_domain(2), 1);
        // Large ranges scan.
        for i in 0..600u64 {
            t.insert(4, &leaf(i << 12, 12, i << 12));
        }
        let held = t.occupied();
        let dropped = t.invalidate_range(4, 0, 1 << 40);
        assert_eq!(t.occupied(), held - dropped);
        assert!((0..600u64).all(|i| t.lookup(4, i << 12).is_none()));
        t.invalidate_all();
        assert_eq!(t.occupied(), 0);
    }
}
