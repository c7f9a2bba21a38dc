//! Domains and their 4-level radix page tables.

use crate::{
    Access, Fault, FaultReason, IommuError, Mapping, Pasid, Prot, DEFAULT_MAX_PAGES, IOVA_BITS,
    PAGE_SHIFT, PAGE_SIZE,
};

const FANOUT: usize = 512;
const BITS_PER_LEVEL: u32 = 9;
/// Levels 3 (root) .. 0 (leaf tables of page entries).
const TOP_LEVEL: u32 = 3;
const PTE_VALID: u64 = 1;
const PTE_PROT_SHIFT: u32 = 1;
const PTE_ADDR_MASK: u64 = !(PAGE_SIZE - 1);
const IOVA_LIMIT: u64 = 1 << IOVA_BITS;

/// A table page. Upper levels point to lower tables; level 0 holds page
/// entries. (Block entries for 2 MiB / 1 GiB would be a third variant at
/// levels 1 and 2.)
enum Node {
    Dir {
        kids: Box<[Option<Box<Node>>; FANOUT]>,
        used: u16,
    },
    Leaf {
        ptes: Box<[u64; FANOUT]>,
        used: u16,
    },
}

impl Node {
    fn new(level: u32) -> Node {
        if level == 0 {
            Node::Leaf {
                ptes: Box::new([0; FANOUT]),
                used: 0,
            }
        } else {
            Node::Dir {
                kids: Box::new(std::array::from_fn(|_| None)),
                used: 0,
            }
        }
    }

    fn used(&self) -> u16 {
        match self {
            Node::Dir { used, .. } | Node::Leaf { used, .. } => *used,
        }
    }
}

fn index(iova: u64, level: u32) -> usize {
    ((iova >> (PAGE_SHIFT + BITS_PER_LEVEL * level)) & (FANOUT as u64 - 1)) as usize
}

/// Bytes covered by one entry of a table at `level`.
fn entry_span(level: u32) -> u64 {
    1 << (PAGE_SHIFT + BITS_PER_LEVEL * level)
}

fn pte(phys: u64, prot: Prot) -> u64 {
    (phys & PTE_ADDR_MASK) | ((prot.bits() as u64) << PTE_PROT_SHIFT) | PTE_VALID
}

fn pte_prot(p: u64) -> Prot {
    Prot::from_bits(((p >> PTE_PROT_SHIFT) & 3) as u8).unwrap_or(Prot::NONE)
}

/// One address space (one per queue); its PASID-like id tags its faults.
pub struct Domain {
    pasid: Pasid,
    root: Node,
    pages: u64,
    max_pages: u64,
    nodes: usize,
}

impl std::fmt::Debug for Domain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Domain")
            .field("pasid", &self.pasid)
            .field("pages", &self.pages)
            .field("table_pages", &self.nodes)
            .finish()
    }
}

impl Domain {
    /// An empty domain with the default page limit.
    pub fn new(pasid: Pasid) -> Domain {
        Domain::with_limit(pasid, DEFAULT_MAX_PAGES)
    }

    /// An empty domain mapping at most `max_pages` pages.
    pub fn with_limit(pasid: Pasid, max_pages: u64) -> Domain {
        Domain {
            pasid,
            root: Node::new(TOP_LEVEL),
            pages: 0,
            max_pages,
            nodes: 1,
        }
    }

    /// The domain's id.
    pub fn pasid(&self) -> Pasid {
        self.pasid
    }

    fn check_range(iova: u64, size: u64) -> Result<u64, IommuError> {
        if size == 0 || iova % PAGE_SIZE != 0 || size % PAGE_SIZE != 0 {
            return Err(IommuError::Misaligned { iova, size });
        }
        iova.checked_add(size)
            .filter(|&e| e <= IOVA_LIMIT)
            .ok_or(IommuError::OutOfRange { iova, size })
    }

    /// The leaf table holding `iova`'s page entry, if any.
    fn leaf(&self, iova: u64) -> Option<&[u64; FANOUT]> {
        let mut n = &self.root;
        for level in (1..=TOP_LEVEL).rev() {
            match n {
                Node::Dir { kids, .. } => n = kids[index(iova, level)].as_deref()?,
                Node::Leaf { .. } => return None,
            }
        }
        match n {
            Node::Leaf { ptes, .. } => Some(ptes),
            Node::Dir { .. } => None,
        }
    }

    fn pte_at(&self, iova: u64) -> u64 {
        self.leaf(iova).map_or(0, |l| l[index(iova, 0)])
    }

    /// Map `[iova, iova+size)` to `[phys, phys+size)`. All page aligned; the
    /// range must be free. Atomic: on error nothing changed.
    pub fn map(&mut self, iova: u64, phys: u64, size: u64, prot: Prot) -> Result<(), IommuError> {
        let end = Self::check_range(iova, size)?;
        if phys % PAGE_SIZE != 0 {
            return Err(IommuError::Misaligned { iova: phys, size });
        }
        if phys.checked_add(size).is_none() {
            return Err(IommuError::OutOfRange { iova: phys, size });
        }
        if prot == Prot::NONE {
            return Err(IommuError::NoPermission);
        }
        let npages = size / PAGE_SIZE;
        if self.pages.saturating_add(npages) > self.max_pages {
            return Err(IommuError::LimitExceeded {
                limit_pages: self.max_pages,
            });
        }
        let mut a = iova;
        while a < end {
            if self.pte_at(a) & PTE_VALID != 0 {
                return Err(IommuError::Overlap { iova: a });
            }
            a += PAGE_SIZE;
        }
        let mut a = iova;
        while a < end {
            self.insert(a, pte(phys + (a - iova), prot));
            a += PAGE_SIZE;
        }
        self.pages += npages;
        Ok(())
    }

    fn insert(&mut self, iova: u64, entry: u64) {
        let mut created = 0;
        let mut n = &mut self.root;
        for level in (1..=TOP_LEVEL).rev() {
            let Node::Dir { kids, used } = n else {
                unreachable!("directories above level 0")
            };
            let slot = &mut kids[index(iova, level)];
            if slot.is_none() {
                *slot = Some(Box::new(Node::new(level - 1)));
                *used += 1;
                created += 1;
            }
            n = slot.as_deref_mut().expect("just filled");
        }
        let Node::Leaf { ptes, used } = n else {
            unreachable!("level 0 is a leaf")
        };
        let i = index(iova, 0);
        debug_assert_eq!(ptes[i] & PTE_VALID, 0);
        ptes[i] = entry;
        *used += 1;
        self.nodes += created;
    }

    /// Unmap every mapped page in `[iova, iova+size)`; returns the bytes
    /// unmapped. Table pages left empty are freed.
    pub fn unmap(&mut self, iova: u64, size: u64) -> Result<u64, IommuError> {
        let end = Self::check_range(iova, size)?;
        let mut freed = 0usize;
        let pages = unmap_node(&mut self.root, TOP_LEVEL, 0, iova, end, &mut freed);
        self.pages -= pages;
        self.nodes -= freed;
        Ok(pages * PAGE_SIZE)
    }

    /// Translate one byte address.
    pub fn translate(&self, iova: u64, access: Access) -> Result<u64, Fault> {
        let fault = |reason| Fault {
            iova,
            pasid: self.pasid,
            access,
            reason,
        };
        if iova >= IOVA_LIMIT {
            return Err(fault(FaultReason::OutOfRange));
        }
        let p = self.pte_at(iova);
        if p & PTE_VALID == 0 {
            return Err(fault(FaultReason::Unmapped));
        }
        if !pte_prot(p).allows(access) {
            return Err(fault(FaultReason::Permission));
        }
        Ok((p & PTE_ADDR_MASK) | (iova & (PAGE_SIZE - 1)))
    }

    /// Translate `[iova, iova+len)` into physically contiguous runs (cleared
    /// first, in IOVA order). The first unmapped or forbidden byte is the
    /// fault; `len == 0` is an empty success.
    pub fn translate_range(
        &self,
        iova: u64,
        len: u64,
        access: Access,
        runs: &mut Vec<(u64, u64)>,
    ) -> Result<(), Fault> {
        runs.clear();
        if len == 0 {
            return Ok(());
        }
        let fault = |at, reason| Fault {
            iova: at,
            pasid: self.pasid,
            access,
            reason,
        };
        let end = match iova.checked_add(len) {
            Some(e) if e <= IOVA_LIMIT => e,
            _ => {
                return Err(fault(
                    iova.min(IOVA_LIMIT.max(iova)),
                    FaultReason::OutOfRange,
                ))
            }
        };
        let mut a = iova;
        while a < end {
            let Some(leaf) = self.leaf(a) else {
                return Err(fault(a, FaultReason::Unmapped));
            };
            // Walk the entries of this leaf table without re-walking the tree.
            loop {
                let p = leaf[index(a, 0)];
                if p & PTE_VALID == 0 {
                    return Err(fault(a, FaultReason::Unmapped));
                }
                if !pte_prot(p).allows(access) {
                    return Err(fault(a, FaultReason::Permission));
                }
                let page_end = (a | (PAGE_SIZE - 1)) + 1;
                let n = end.min(page_end) - a;
                let phys = (p & PTE_ADDR_MASK) | (a & (PAGE_SIZE - 1));
                match runs.last_mut() {
                    Some(last) if last.0 + last.1 == phys => last.1 += n,
                    _ => runs.push((phys, n)),
                }
                a += n;
                if a >= end || index(a, 0) == 0 {
                    break;
                }
            }
        }
        Ok(())
    }

    /// Bytes mapped.
    pub fn mapped_bytes(&self) -> u64 {
        self.pages * PAGE_SIZE
    }

    /// Current mappings, coalesced where IOVA, physical address and
    /// permissions all continue, sorted by IOVA.
    pub fn mappings(&self) -> Vec<Mapping> {
        let mut out: Vec<Mapping> = Vec::new();
        collect(&self.root, TOP_LEVEL, 0, &mut out);
        out
    }

    /// Table pages allocated (the root included).
    pub fn table_pages(&self) -> usize {
        self.nodes
    }
}

fn unmap_node(
    node: &mut Node,
    level: u32,
    base: u64,
    start: u64,
    end: u64,
    freed: &mut usize,
) -> u64 {
    let span = entry_span(level);
    let lo = start.max(base);
    let hi = end.min(base + span * FANOUT as u64);
    if lo >= hi {
        return 0;
    }
    let first = ((lo - base) / span) as usize;
    let last = ((hi - 1 - base) / span) as usize;
    let mut pages = 0;
    match node {
        Node::Leaf { ptes, used } => {
            for p in &mut ptes[first..=last] {
                if *p & PTE_VALID != 0 {
                    *p = 0;
                    *used -= 1;
                    pages += 1;
                }
            }
        }
        Node::Dir { kids, used } => {
            for (i, slot) in kids.iter_mut().enumerate().take(last + 1).skip(first) {
                if let Some(k) = slot {
                    pages += unmap_node(k, level - 1, base + i as u64 * span, start, end, freed);
                    if k.used() == 0 {
                        *slot = None;
                        *used -= 1;
                        *freed += 1;
                    }
                }
            }
        }
    }
    pages
}

fn collect(node: &Node, level: u32, base: u64, out: &mut Vec<Mapping>) {
    let span = entry_span(level);
    match node {
        Node::Leaf { ptes, .. } => {
            for (i, &p) in ptes.iter().enumerate() {
                if p & PTE_VALID == 0 {
                    continue;
                }
                let iova = base + i as u64 * span;
                let phys = p & PTE_ADDR_MASK;
                let prot = pte_prot(p);
                match out.last_mut() {
                    Some(m)
                        if m.iova + m.size == iova && m.phys + m.size == phys && m.prot == prot =>
                    {
                        m.size += PAGE_SIZE
                    }
                    _ => out.push(Mapping {
                        iova,
                        phys,
                        size: PAGE_SIZE,
                        prot,
                    }),
                }
            }
        }
        Node::Dir { kids, .. } => {
            for (i, k) in kids.iter().enumerate() {
                if let Some(k) = k {
                    collect(k, level - 1, base + i as u64 * span, out);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = PAGE_SIZE;

    #[test]
    fn map_translate_unmap() {
        let mut d = Domain::new(3);
        d.map(0x10000, 0x7000_0000, 2 * P, Prot::RW).unwrap();
        assert_eq!(d.translate(0x10010, Access::Read), Ok(0x7000_0010));
        assert_eq!(d.translate(0x11fff, Access::Write), Ok(0x7000_1fff));
        let f = d.translate(0x12000, Access::Read).unwrap_err();
        assert_eq!(
            (f.iova, f.pasid, f.reason),
            (0x12000, 3, FaultReason::Unmapped)
        );
        assert_eq!(d.mapped_bytes(), 2 * P);
        assert_eq!(d.unmap(0x10000, 2 * P), Ok(2 * P));
        assert!(d.translate(0x10010, Access::Read).is_err());
        assert_eq!(d.table_pages(), 1, "empty tables freed");
    }

    #[test]
    fn permissions() {
        let mut d = Domain::new(1);
        d.map(0, 0x1000, P, Prot::READ).unwrap();
        assert!(d.translate(5, Access::Read).is_ok());
        assert_eq!(
            d.translate(5, Access::Write).unwrap_err().reason,
            FaultReason::Permission
        );
        assert_eq!(d.map(P, 0, P, Prot::NONE), Err(IommuError::NoPermission));
        assert_eq!(Prot::from_bits(4), None);
        assert_eq!(Prot::READ | Prot::WRITE, Prot::RW);
    }

    #[test]
    fn bad_arguments() {
        let mut d = Domain::new(1);
        assert!(matches!(
            d.map(1, 0, P, Prot::RW),
            Err(IommuError::Misaligned { .. })
        ));
        assert!(matches!(
            d.map(0, 1, P, Prot::RW),
            Err(IommuError::Misaligned { .. })
        ));
        assert!(matches!(
            d.map(0, 0, 0, Prot::RW),
            Err(IommuError::Misaligned { .. })
        ));
        assert!(matches!(
            d.map(IOVA_LIMIT - P, 0, 2 * P, Prot::RW),
            Err(IommuError::OutOfRange { .. })
        ));
        assert!(matches!(
            d.map(!(P - 1), 0, P, Prot::RW),
            Err(IommuError::OutOfRange { .. })
        ));
        assert!(matches!(d.unmap(0, 3), Err(IommuError::Misaligned { .. })));
        assert_eq!(
            d.translate(IOVA_LIMIT, Access::Read).unwrap_err().reason,
            FaultReason::OutOfRange
        );
    }

    #[test]
    fn overlap_changes_nothing() {
        let mut d = Domain::new(1);
        d.map(4 * P, 0x100000, P, Prot::RW).unwrap();
        let before = d.mappings();
        assert_eq!(
            d.map(2 * P, 0x200000, 4 * P, Prot::RW),
            Err(IommuError::Overlap { iova: 4 * P })
        );
        assert_eq!(d.mappings(), before);
        assert_eq!(d.mapped_bytes(), P);
    }

    #[test]
    fn partial_unmap_counts_only_mapped_pages() {
        let mut d = Domain::new(1);
        d.map(0, 0x100000, P, Prot::RW).unwrap();
        d.map(3 * P, 0x200000, P, Prot::RW).unwrap();
        assert_eq!(d.unmap(0, 8 * P), Ok(2 * P));
        assert_eq!(d.unmap(0, 8 * P), Ok(0));
    }

    #[test]
    fn ranges_coalesce_and_fault_at_first_bad_byte() {
        let mut d = Domain::new(1);
        let base = (1 << 21) - 2 * P; // crosses a leaf-table boundary
        d.map(base, 0x40_0000, 2 * P, Prot::RW).unwrap();
        d.map(base + 2 * P, 0x40_2000, 2 * P, Prot::RW).unwrap();
        d.map(base + 4 * P, 0x90_0000, P, Prot::RW).unwrap();
        let mut runs = Vec::new();
        d.translate_range(base + 10, 4 * P - 10, Access::Read, &mut runs)
            .unwrap();
        assert_eq!(runs, [(0x40_000a, 4 * P - 10)]);
        d.translate_range(base, 5 * P, Access::Write, &mut runs)
            .unwrap();
        assert_eq!(runs, [(0x40_0000, 4 * P), (0x90_0000, P)]);
        let f = d
            .translate_range(base + 5, 6 * P, Access::Read, &mut runs)
            .unwrap_err();
        assert_eq!((f.iova, f.reason), (base + 5 * P, FaultReason::Unmapped));
        d.translate_range(7, 0, Access::Read, &mut runs).unwrap();
        assert!(runs.is_empty());
        let f = d
            .translate_range(u64::MAX - 1, 4, Access::Read, &mut runs)
            .unwrap_err();
        assert_eq!(f.reason, FaultReason::OutOfRange);
        assert_eq!(
            d.mappings(),
            [
                Mapping {
                    iova: base,
                    phys: 0x40_0000,
                    size: 4 * P,
                    prot: Prot::RW
                },
                Mapping {
                    iova: base + 4 * P,
                    phys: 0x90_0000,
                    size: P,
                    prot: Prot::RW
                }
            ]
        );
    }

    #[test]
    fn limit() {
        let mut d = Domain::with_limit(1, 2);
        d.map(0, 0, 2 * P, Prot::RW).unwrap();
        assert_eq!(
            d.map(4 * P, 0, P, Prot::RW),
            Err(IommuError::LimitExceeded { limit_pages: 2 })
        );
    }
}
