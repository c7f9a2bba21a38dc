//! Multi-level radix page tables with 2 MiB / 1 GiB blocks.
//!
//! Four levels of 512 entries over a 48-bit IOVA space (level 3 is the root,
//! level 0 holds 4 KiB page entries; levels 1 and 2 may hold 2 MiB and 1 GiB
//! block entries instead of pointing to a lower table).
//!
//! Entries are `AtomicU64`, so engines walk the table without a lock while
//! one writer (serialised by the domain) changes it. A table page that an
//! unmap unlinks is not reused until the invalidation covering it has
//! completed: a walker that loaded the old link can still read the page, and
//! it only ever sees zeros or the entries it had before. Table pages live in
//! a per-domain arena of geometrically growing chunks and are named by
//! index, so no raw pointer ever goes into an entry.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::gather::IotlbGather;
use crate::{Mapping, Prot, PAGE_SHIFT};

/// Entries per table page.
pub(crate) const ENTRIES: usize = 512;
const BITS_PER_LEVEL: u32 = 9;
/// The root's level.
pub(crate) const TOP_LEVEL: u32 = 3;
/// Index of the root table page (allocated first, never freed).
const ROOT: u32 = 0;

/// Entry is valid.
const PTE_VALID: u64 = 1;
/// Entry points to a lower table (levels 1..=3) rather than being a leaf.
const PTE_TABLE: u64 = 1 << 1;
const PTE_PROT_SHIFT: u32 = 2;
const PTE_PROT_MASK: u64 = 3 << PTE_PROT_SHIFT;
/// Physical address of a leaf, or `index << 12` of a lower table.
const PTE_ADDR_MASK: u64 = !((1 << PAGE_SHIFT) - 1);

/// log2 of the bytes one entry at `level` covers.
pub(crate) fn level_shift(level: u32) -> u32 {
    PAGE_SHIFT + BITS_PER_LEVEL * level
}

fn index(iova: u64, level: u32) -> usize {
    ((iova >> level_shift(level)) & (ENTRIES as u64 - 1)) as usize
}

fn pte_prot(p: u64) -> Prot {
    Prot::from_bits(((p & PTE_PROT_MASK) >> PTE_PROT_SHIFT) as u8).unwrap_or(Prot::NONE)
}

fn is_table(p: u64, level: u32) -> bool {
    level > 0 && p & PTE_TABLE != 0
}

/// A leaf entry found by a walk: a 4 KiB page or a 2 MiB / 1 GiB block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leaf {
    /// First IOVA the entry covers.
    pub iova: u64,
    /// log2 of its size (12, 21 or 30).
    pub shift: u32,
    /// Physical address of its first byte.
    pub phys: u64,
    /// Its permissions.
    pub prot: Prot,
}

impl Leaf {
    /// Bytes covered.
    pub fn size(&self) -> u64 {
        1 << self.shift
    }
}

/// Pages in chunk 0 of the arena; chunk k holds `FIRST_CHUNK << k` pages.
const FIRST_CHUNK: u32 = 8;

/// Table pages a group of domains may hold together: one owner's domains
/// (a user's, on the host), so that spreading tables over many domains
/// does not multiply what one owner can take. Counted in arena chunks as
/// they are allocated; a domain gives its chunks back when it goes.
#[derive(Debug)]
pub struct TableBudget {
    used: AtomicU64,
    limit: u64,
}

impl TableBudget {
    /// A budget of `limit_pages` table pages.
    pub fn new(limit_pages: u64) -> Arc<TableBudget> {
        Arc::new(TableBudget {
            used: AtomicU64::new(0),
            limit: limit_pages,
        })
    }

    /// Table pages held now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// The limit.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    fn take(&self, pages: u64) -> bool {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                u.checked_add(pages).filter(|&t| t <= self.limit)
            })
            .is_ok()
    }

    fn give(&self, pages: u64) {
        self.used.fetch_sub(pages, Ordering::Relaxed);
    }
}

/// Budgets compare by identity: two domains share one or they do not.
impl PartialEq for TableBudget {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Eq for TableBudget {}

/// Table pages of one domain: lock-free to read, allocated by the writer.
pub(crate) struct Arena {
    chunks: Box<[OnceLock<Box<[AtomicU64]>>]>,
    capacity: u32,
    budget: Option<Arc<TableBudget>>,
}

impl Drop for Arena {
    fn drop(&mut self) {
        if let Some(b) = &self.budget {
            let held: usize = (0..self.chunks.len())
                .filter(|&c| self.chunks[c].get().is_some())
                .map(|c| self.chunk_pages(c))
                .sum();
            b.give(held as u64);
        }
    }
}

fn chunk_of(idx: u32) -> (usize, usize) {
    let x = idx as u64 + FIRST_CHUNK as u64;
    let bit = 63 - x.leading_zeros();
    let c = bit - FIRST_CHUNK.trailing_zeros();
    (c as usize, (x - (1u64 << bit)) as usize)
}

impl Arena {
    /// An arena with its root's chunk, charged to `budget` like any other
    /// (None when the budget cannot take it: a domain always has a root).
    fn new(max_pages: u32, budget: Option<Arc<TableBudget>>) -> Option<Arena> {
        let max_pages = max_pages.max(1);
        let (last, _) = chunk_of(max_pages - 1);
        if let Some(b) = &budget {
            // Chunk 0's pages (`chunk_pages(0)`).
            if !b.take(FIRST_CHUNK.min(max_pages) as u64) {
                return None;
            }
        }
        let a = Arena {
            chunks: (0..=last).map(|_| OnceLock::new()).collect(),
            capacity: max_pages,
            budget,
        };
        a.init(0);
        Some(a)
    }

    /// The 512 entries of table page `table`.
    #[inline]
    fn page(&self, table: u32) -> &[AtomicU64] {
        let (c, off) = chunk_of(table);
        let chunk = self.chunks[c]
            .get()
            .expect("a linked table page lies in an allocated chunk");
        &chunk[off * ENTRIES..(off + 1) * ENTRIES]
    }

    /// Make sure the chunk holding `table` exists (writer only); false
    /// when the budget refuses a new one.
    fn ensure(&self, table: u32) -> bool {
        let (c, _) = chunk_of(table);
        if self.chunks[c].get().is_some() {
            return true;
        }
        if let Some(b) = &self.budget {
            if !b.take(self.chunk_pages(c) as u64) {
                return false;
            }
        }
        self.init(c);
        true
    }

    fn init(&self, c: usize) {
        self.chunks[c].get_or_init(|| {
            let pages = self.chunk_pages(c);
            std::iter::repeat_with(|| AtomicU64::new(0))
                .take(pages * ENTRIES)
                .collect()
        });
    }

    /// Pages of chunk `c`: `FIRST_CHUNK << c`, the last one cut at the
    /// capacity, so a domain at its limit holds what the limit says and
    /// not up to twice that (it is zeroed, so resident, whole).
    fn chunk_pages(&self, c: usize) -> usize {
        let first = (FIRST_CHUNK as usize) * ((1usize << c) - 1);
        ((FIRST_CHUNK as usize) << c).min(self.capacity as usize - first)
    }

    /// Table pages allocated (whole chunks).
    #[cfg(test)]
    fn allocated_pages(&self) -> usize {
        self.chunks
            .iter()
            .filter_map(|c| c.get())
            .map(|c| c.len() / ENTRIES)
            .sum()
    }
}

/// Writer-side bookkeeping of the table pages (under the domain's lock).
#[derive(Debug)]
pub(crate) struct TableAlloc {
    free: Vec<u32>,
    next: u32,
    /// Valid entries per table page, by index.
    used: Vec<u16>,
    /// Pages allocated, root included (freed pages waiting for an
    /// invalidation count as allocated).
    live: u32,
    /// Block leaves (2 MiB and 1 GiB) in the table: without any, no unmap
    /// can split one.
    pub(crate) blocks: u64,
    /// The last page allocation failed on the shared budget, not on the
    /// domain's own limit.
    pub(crate) over_budget: bool,
}

/// Why a map stopped before its end; everything below `at` was mapped by
/// it and must be undone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MapStop {
    /// First IOVA not mapped by this call.
    pub(crate) at: u64,
    /// Out of table pages (the domain's limit), or this IOVA was mapped
    /// already.
    pub(crate) overlap: Option<u64>,
}

/// A page table (see the module documentation).
pub(crate) struct PageTable {
    arena: Arena,
}

impl PageTable {
    /// An empty table allowed at most `max_pages` table pages (root
    /// included), its chunks charged to `budget` (None when the budget
    /// cannot take the root's).
    pub(crate) fn new(
        max_pages: u32,
        budget: Option<Arc<TableBudget>>,
    ) -> Option<(PageTable, TableAlloc)> {
        let t = PageTable {
            arena: Arena::new(max_pages, budget)?,
        };
        Some((
            t,
            TableAlloc {
                free: Vec::new(),
                next: 1,
                used: vec![0],
                live: 1,
                blocks: 0,
                over_budget: false,
            },
        ))
    }

    /// The leaf covering `iova`, if any. Lock-free; called by engines.
    pub(crate) fn walk(&self, iova: u64) -> Option<Leaf> {
        let mut t = ROOT;
        let mut level = TOP_LEVEL;
        loop {
            // Acquire: pairs with the Release stores in `map_in`, so a lower
            // table's zeroed entries and a leaf's address are visible before
            // the entry that names them.
            let p = self.arena.page(t)[index(iova, level)].load(Ordering::Acquire);
            if p & PTE_VALID == 0 {
                return None;
            }
            if is_table(p, level) {
                t = (p >> PAGE_SHIFT) as u32;
                level -= 1;
                continue;
            }
            if level == TOP_LEVEL {
                return None; // never written: no 512 GiB blocks
            }
            let shift = level_shift(level);
            let mask = (1u64 << shift) - 1;
            return Some(Leaf {
                iova: iova & !mask,
                shift,
                phys: p & PTE_ADDR_MASK & !mask,
                prot: pte_prot(p),
            });
        }
    }

    /// The leaf covering `iova` and, when it is a 4 KiB page, the valid
    /// pages that follow it in the same leaf table below `end`, up to
    /// `out.len()` leaves in all: one descent for a run of pages (what an
    /// engine needs on an IOTLB miss in the middle of a request). Returns
    /// how many leaves were written. Lock-free, like `walk`.
    pub(crate) fn walk_run(&self, iova: u64, end: u64, out: &mut [Leaf]) -> usize {
        if out.is_empty() {
            return 0;
        }
        let mut t = ROOT;
        let mut level = TOP_LEVEL;
        let p = loop {
            // Acquire: as in `walk`.
            let p = self.arena.page(t)[index(iova, level)].load(Ordering::Acquire);
            if p & PTE_VALID == 0 || (level == TOP_LEVEL && !is_table(p, level)) {
                return 0;
            }
            if is_table(p, level) {
                t = (p >> PAGE_SHIFT) as u32;
                level -= 1;
                continue;
            }
            break p;
        };
        let shift = level_shift(level);
        let mask = (1u64 << shift) - 1;
        out[0] = Leaf {
            iova: iova & !mask,
            shift,
            phys: p & PTE_ADDR_MASK & !mask,
            prot: pte_prot(p),
        };
        if level != 0 {
            return 1;
        }
        let mut n = 1;
        let mut at = (iova & !mask) + (1 << shift);
        let mut i = index(iova, 0) + 1;
        let page = self.arena.page(t);
        while n < out.len() && i < ENTRIES && at < end {
            // Acquire: as in `walk`.
            let p = page[i].load(Ordering::Acquire);
            if p & PTE_VALID == 0 {
                break;
            }
            out[n] = Leaf {
                iova: at,
                shift,
                phys: p & PTE_ADDR_MASK,
                prot: pte_prot(p),
            };
            n += 1;
            i += 1;
            at += 1 << shift;
        }
        n
    }

    fn alloc_page(&self, a: &mut TableAlloc) -> Option<u32> {
        let idx = if let Some(i) = a.free.pop() {
            i
        } else {
            if a.next >= self.arena.capacity {
                return None;
            }
            let i = a.next;
            if !self.arena.ensure(i) {
                a.over_budget = true;
                return None;
            }
            a.next += 1;
            a.used.push(0);
            i
        };
        a.live += 1;
        debug_assert_eq!(a.used[idx as usize], 0);
        Some(idx)
    }

    /// Return table pages whose invalidation has completed.
    pub(crate) fn free_pages(&self, a: &mut TableAlloc, pages: &[u32]) {
        for &p in pages {
            debug_assert!(
                self.arena
                    .page(p)
                    .iter()
                    .all(|e| e.load(Ordering::Relaxed) == 0),
                "freed table pages are empty"
            );
            a.free.push(p);
            a.live -= 1;
        }
    }

    /// Table pages allocated (root included).
    pub(crate) fn live_pages(a: &TableAlloc) -> usize {
        a.live as usize
    }

    /// Map `[lo, hi)` (page aligned) to the physical runs of `sg` (page
    /// aligned, `hi - lo` bytes in all) in one descent, in IOVA order, using
    /// blocks where `blocks` allows and a run covers an aligned block. It
    /// stops at the first IOVA already mapped, or when the table runs out of
    /// pages, leaving what it mapped below that point for the caller to
    /// undo.
    pub(crate) fn map(
        &self,
        a: &mut TableAlloc,
        lo: u64,
        hi: u64,
        sg: &[(u64, u64)],
        prot: Prot,
        blocks: bool,
    ) -> Result<(), MapStop> {
        let mut c = SgCursor {
            runs: sg,
            i: 0,
            off: 0,
        };
        self.map_in(a, ROOT, TOP_LEVEL, 0, lo, hi, &mut c, prot, blocks)
    }

    #[allow(clippy::too_many_arguments)]
    fn map_in(
        &self,
        a: &mut TableAlloc,
        t: u32,
        level: u32,
        base: u64,
        lo: u64,
        hi: u64,
        c: &mut SgCursor<'_>,
        prot: Prot,
        blocks: bool,
    ) -> Result<(), MapStop> {
        let span = 1u64 << level_shift(level);
        let Some((first, last)) = slots(base, span, lo, hi) else {
            return Ok(());
        };
        let prot_bits = ((prot.bits() as u64) << PTE_PROT_SHIFT) | PTE_VALID;
        let page = self.arena.page(t);
        if level == 0 {
            let used = &mut a.used[t as usize];
            for (i, e) in page.iter().enumerate().take(last + 1).skip(first) {
                if e.load(Ordering::Relaxed) & PTE_VALID != 0 {
                    let at = base + i as u64 * span;
                    return Err(MapStop {
                        at,
                        overlap: Some(at),
                    });
                }
                // Release: pairs with the Acquire load in `walk`.
                e.store((c.phys() & PTE_ADDR_MASK) | prot_bits, Ordering::Release);
                *used += 1;
                c.advance(span);
            }
            return Ok(());
        }
        for (i, e) in page.iter().enumerate().take(last + 1).skip(first) {
            let sb = base + i as u64 * span;
            let s_lo = lo.max(sb);
            let s_hi = hi.min(sb + span);
            let cur = e.load(Ordering::Relaxed);
            if cur & PTE_VALID != 0 && !is_table(cur, level) {
                return Err(MapStop {
                    at: s_lo,
                    overlap: Some(s_lo),
                });
            }
            let whole = s_lo == sb && s_hi == sb + span;
            if blocks
                && level <= 2
                && whole
                && cur & PTE_VALID == 0
                && c.phys() % span == 0
                && c.run_left() >= span
            {
                // Release: pairs with the Acquire load in `walk`.
                e.store((c.phys() & PTE_ADDR_MASK) | prot_bits, Ordering::Release);
                a.used[t as usize] += 1;
                a.blocks += 1;
                c.advance(span);
                continue;
            }
            let child = if cur & PTE_VALID != 0 {
                (cur >> PAGE_SHIFT) as u32
            } else {
                let Some(n) = self.alloc_page(a) else {
                    return Err(MapStop {
                        at: s_lo,
                        overlap: None,
                    });
                };
                // Release: the child's entries are zero (fresh, or emptied
                // before being freed) before the link is visible to walkers.
                e.store(
                    ((n as u64) << PAGE_SHIFT) | PTE_TABLE | PTE_VALID,
                    Ordering::Release,
                );
                a.used[t as usize] += 1;
                n
            };
            self.map_in(a, child, level - 1, sb, s_lo, s_hi, c, prot, blocks)?;
        }
        Ok(())
    }

    /// The leaf that `[lo, hi)` would split (a block straddling an edge).
    pub(crate) fn split_block(&self, lo: u64, hi: u64) -> Option<Leaf> {
        let a = self.walk(lo).filter(|l| l.iova < lo);
        let b = self.walk(hi - 1).filter(|l| l.iova + l.size() > hi);
        a.or(b)
    }

    /// Clear every leaf in `[lo, hi)` (the caller checked that no block is
    /// split); unlinked table pages and the cleared range go to `g`.
    /// Returns the bytes unmapped.
    pub(crate) fn unmap(&self, a: &mut TableAlloc, lo: u64, hi: u64, g: &mut IotlbGather) -> u64 {
        self.unmap_in(a, ROOT, TOP_LEVEL, 0, lo, hi, g)
    }

    #[allow(clippy::too_many_arguments)]
    fn unmap_in(
        &self,
        a: &mut TableAlloc,
        t: u32,
        level: u32,
        base: u64,
        lo: u64,
        hi: u64,
        g: &mut IotlbGather,
    ) -> u64 {
        let span = 1u64 << level_shift(level);
        let Some((first, last)) = slots(base, span, lo, hi) else {
            return 0;
        };
        let mut bytes = 0;
        let page = self.arena.page(t);
        for (i, e) in page.iter().enumerate().take(last + 1).skip(first) {
            let p = e.load(Ordering::Relaxed);
            if p & PTE_VALID == 0 {
                continue;
            }
            let sb = base + i as u64 * span;
            if is_table(p, level) {
                let child = (p >> PAGE_SHIFT) as u32;
                bytes += self.unmap_in(a, child, level - 1, sb, lo, hi, g);
                if a.used[child as usize] == 0 {
                    // Release: pairs with the Acquire load in `walk`. A
                    // walker that already followed the link keeps reading a
                    // page that is not reused before the invalidation.
                    e.store(0, Ordering::Release);
                    a.used[t as usize] -= 1;
                    g.add_table(child);
                }
            } else {
                debug_assert!(sb >= lo && sb + span <= hi, "no block is split");
                // Release: pairs with the Acquire load in `walk`.
                e.store(0, Ordering::Release);
                a.used[t as usize] -= 1;
                if level > 0 {
                    a.blocks -= 1;
                }
                bytes += span;
                g.add_range(sb, span);
            }
        }
        bytes
    }

    /// Mappings, coalesced where IOVA, physical address and permissions
    /// continue, sorted by IOVA.
    pub(crate) fn mappings(&self) -> Vec<Mapping> {
        let mut out = Vec::new();
        self.collect(ROOT, TOP_LEVEL, 0, &mut out);
        out
    }

    fn collect(&self, t: u32, level: u32, base: u64, out: &mut Vec<Mapping>) {
        let span = 1u64 << level_shift(level);
        for (i, e) in self.arena.page(t).iter().enumerate() {
            let p = e.load(Ordering::Relaxed);
            if p & PTE_VALID == 0 {
                continue;
            }
            let iova = base + i as u64 * span;
            if is_table(p, level) {
                self.collect((p >> PAGE_SHIFT) as u32, level - 1, iova, out);
                continue;
            }
            let phys = p & PTE_ADDR_MASK;
            let prot = pte_prot(p);
            match out.last_mut() {
                Some(m) if m.iova + m.size == iova && m.phys + m.size == phys && m.prot == prot => {
                    m.size += span
                }
                _ => out.push(Mapping {
                    iova,
                    phys,
                    size: span,
                    prot,
                }),
            }
        }
    }

    /// Leaf entries by size: (4 KiB pages, 2 MiB blocks, 1 GiB blocks).
    pub(crate) fn leaf_counts(&self) -> (u64, u64, u64) {
        let mut c = [0u64; 3];
        self.count(ROOT, TOP_LEVEL, &mut c);
        (c[0], c[1], c[2])
    }

    fn count(&self, t: u32, level: u32, c: &mut [u64; 3]) {
        for e in self.arena.page(t) {
            let p = e.load(Ordering::Relaxed);
            if p & PTE_VALID == 0 {
                continue;
            }
            if is_table(p, level) {
                self.count((p >> PAGE_SHIFT) as u32, level - 1, c);
            } else if level <= 2 {
                c[level as usize] += 1;
            }
        }
    }
}

/// Where a map stands in its scatter list.
struct SgCursor<'a> {
    runs: &'a [(u64, u64)],
    i: usize,
    off: u64,
}

impl SgCursor<'_> {
    fn phys(&self) -> u64 {
        self.runs.get(self.i).map_or(0, |r| r.0 + self.off)
    }

    fn run_left(&self) -> u64 {
        self.runs.get(self.i).map_or(0, |r| r.1 - self.off)
    }

    fn advance(&mut self, mut n: u64) {
        while n > 0 && self.i < self.runs.len() {
            let left = self.runs[self.i].1 - self.off;
            if n < left {
                self.off += n;
                return;
            }
            n -= left;
            self.i += 1;
            self.off = 0;
        }
    }
}

/// First and last entry of a table at `base` (entries of `span` bytes)
/// that intersect `[lo, hi)`.
fn slots(base: u64, span: u64, lo: u64, hi: u64) -> Option<(usize, usize)> {
    let top = base.saturating_add(span.saturating_mul(ENTRIES as u64));
    let l = lo.max(base);
    let h = hi.min(top);
    if l >= h {
        return None;
    }
    Some((
        ((l - base) / span) as usize,
        ((h - 1 - base) / span) as usize,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 4096;
    const M2: u64 = 1 << 21;
    const G1: u64 = 1 << 30;

    #[test]
    fn an_arena_at_its_limit_holds_no_more_than_its_limit() {
        // (Miri interprets every store: the default limit's 8 million
        // entries would take it many minutes.)
        let caps: &[u32] = if cfg!(miri) {
            &[1, 8, 9, 100]
        } else {
            &[1, 8, 9, 100, 16384, 16385]
        };
        for &cap in caps {
            let a = Arena::new(cap, None).unwrap();
            for t in 0..cap {
                a.ensure(t);
                let e = a.page(t);
                assert_eq!(e.len(), ENTRIES);
                e[ENTRIES - 1].store(1, Ordering::Relaxed);
            }
            assert_eq!(a.allocated_pages(), cap as usize, "capacity {cap}");
        }
    }

    #[test]
    fn chunk_indexing_is_dense() {
        let mut seen = std::collections::HashSet::new();
        let mut expect_c = 0;
        let mut expect_off = 0;
        for i in 0..2000u32 {
            let (c, off) = chunk_of(i);
            if (c, off) != (expect_c, expect_off) {
                assert_eq!((c, off), (expect_c + 1, 0), "index {i}");
                expect_c += 1;
                expect_off = 0;
            }
            assert!(off < (FIRST_CHUNK as usize) << c);
            assert!(seen.insert((c, off)));
            expect_off += 1;
        }
    }

    #[test]
    fn blocks_are_used_when_aligned() {
        let (t, mut a) = PageTable::new(64, None).unwrap();
        t.map(
            &mut a,
            G1,
            2 * G1 + M2 + P,
            &[(8 * G1, G1 + M2 + P)],
            Prot::RW,
            true,
        )
        .unwrap();
        assert_eq!(t.leaf_counts(), (1, 1, 1));
        let l = t.walk(G1 + 5).unwrap();
        assert_eq!((l.iova, l.shift, l.phys), (G1, 30, 8 * G1));
        let l = t.walk(2 * G1 + 7).unwrap();
        assert_eq!((l.shift, l.phys), (21, 9 * G1));
        let l = t.walk(2 * G1 + M2 + 9).unwrap();
        assert_eq!((l.shift, l.phys), (12, 9 * G1 + M2));
        // Misaligned physical address: pages only.
        let (t, mut a) = PageTable::new(64, None).unwrap();
        t.map(&mut a, 0, M2, &[(P, M2)], Prot::READ, true).unwrap();
        assert_eq!(t.leaf_counts(), (512, 0, 0));
        // Blocks not allowed.
        let (t, mut a) = PageTable::new(64, None).unwrap();
        t.map(&mut a, 0, M2, &[(0, M2)], Prot::READ, false).unwrap();
        assert_eq!(t.leaf_counts(), (512, 0, 0));
    }

    #[test]
    fn unmap_unlinks_empty_tables_into_the_gather() {
        let (t, mut a) = PageTable::new(64, None).unwrap();
        t.map(&mut a, 0, 4 * P, &[(0x10_0000, 4 * P)], Prot::RW, true)
            .unwrap();
        assert_eq!(PageTable::live_pages(&a), 4);
        let mut g = IotlbGather::new();
        assert_eq!(t.unmap(&mut a, 0, 2 * P, &mut g), 2 * P);
        assert!(g.tables().is_empty());
        assert_eq!(t.unmap(&mut a, 0, 8 * P, &mut g), 2 * P);
        assert_eq!(g.tables().len(), 3);
        assert_eq!(g.range(), Some((0, 4 * P)));
        assert_eq!(t.walk(0), None);
        // Not reusable until freed.
        assert_eq!(PageTable::live_pages(&a), 4);
        let pages = g.tables().to_vec();
        t.free_pages(&mut a, &pages);
        assert_eq!(PageTable::live_pages(&a), 1);
    }

    #[test]
    fn walk_run_follows_a_leaf_table() {
        let (t, mut a) = PageTable::new(64, None).unwrap();
        t.map(
            &mut a,
            M2 - 2 * P,
            M2 + 2 * P,
            &[(0x1000_0000, 4 * P)],
            Prot::RW,
            true,
        )
        .unwrap();
        t.map(
            &mut a,
            M2 + 3 * P,
            M2 + 4 * P,
            &[(0x9000_0000, P)],
            Prot::READ,
            true,
        )
        .unwrap();
        let mut out = [Leaf {
            iova: 0,
            shift: 0,
            phys: 0,
            prot: Prot::NONE,
        }; 8];
        // Stops at the end of the leaf table.
        assert_eq!(t.walk_run(M2 - 2 * P + 5, u64::MAX, &mut out), 2);
        assert_eq!(out[1].phys, 0x1000_1000);
        // Stops at a hole, at `end`, at the buffer's size.
        assert_eq!(t.walk_run(M2, u64::MAX, &mut out), 2);
        assert_eq!(t.walk_run(M2, M2 + 1, &mut out), 1);
        assert_eq!(t.walk_run(M2, u64::MAX, &mut out[..1]), 1);
        assert_eq!(t.walk_run(M2 + 2 * P, u64::MAX, &mut out), 0);
        for (k, l) in out.iter().take(2).enumerate() {
            assert_eq!(Some(*l), t.walk(M2 + k as u64 * P));
        }
    }

    #[test]
    fn split_detection_and_table_limit() {
        let (t, mut a) = PageTable::new(64, None).unwrap();
        t.map(&mut a, M2, 2 * M2, &[(0, M2)], Prot::RW, true)
            .unwrap();
        assert!(t.split_block(M2, M2 + P).is_some());
        assert!(t.split_block(M2 + P, 2 * M2).is_some());
        assert!(t.split_block(0, 3 * M2).is_none());
        // Three table pages at most: root + L2 + L1, no room for a leaf table.
        let (t, mut a) = PageTable::new(3, None).unwrap();
        assert_eq!(
            t.map(&mut a, 0, P, &[(0, P)], Prot::RW, true),
            Err(MapStop {
                at: 0,
                overlap: None
            }),
            "needs a fourth page"
        );
        // Overlaps stop the map where they start.
        let (t, mut a) = PageTable::new(64, None).unwrap();
        t.map(&mut a, 3 * P, 4 * P, &[(0, P)], Prot::RW, true)
            .unwrap();
        assert_eq!(
            t.map(&mut a, 0, 8 * P, &[(0, 8 * P)], Prot::RW, true),
            Err(MapStop {
                at: 3 * P,
                overlap: Some(3 * P)
            })
        );
        t.map(&mut a, M2, 2 * M2, &[(0, M2)], Prot::RW, true)
            .unwrap();
        assert_eq!(a.blocks, 1);
        assert_eq!(
            t.map(&mut a, M2 - P, M2 + P, &[(0, 2 * P)], Prot::RW, true),
            Err(MapStop {
                at: M2,
                overlap: Some(M2)
            })
        );
    }
}
