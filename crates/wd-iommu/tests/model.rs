//! Property test: random map / map_sg / unmap / translate sequences on a
//! domain (with 2 MiB and 1 GiB blocks) against a plain interval map of
//! leaves, translating both by walking the table and through an engine's
//! IOTLB (which must never answer with a stale entry once an unmap is
//! synced, or once the flush queue has flushed).

use std::collections::BTreeMap;

use proptest::prelude::*;
use wd_iommu::{
    Access, Domain, DomainConfig, EngineTlb, FaultReason, InvalidationMode, Iommu, IommuError,
    Prot, BLOCK_1G, BLOCK_2M, PAGE_SIZE,
};

const P: u64 = PAGE_SIZE;
/// Windows of 16 MiB: at 0, straddling 1 GiB, and far up.
const BASES: [u64; 3] = [0, BLOCK_1G - 8 * BLOCK_2M, 5 * BLOCK_1G];
const WINDOW_PAGES: u64 = 4096;

#[derive(Clone, Debug)]
enum Op {
    Map {
        base: usize,
        page: u64,
        n: u64,
        phys_block: u64,
        phys_off: u64,
        prot: u8,
    },
    MapSg {
        base: usize,
        page: u64,
        runs: Vec<(u64, u64)>,
    },
    MapGiant {
        which: u64,
    },
    Unmap {
        base: usize,
        page: u64,
        n: u64,
    },
    UnmapGiant {
        which: u64,
    },
    Translate {
        base: usize,
        page: u64,
        off: u64,
        write: bool,
    },
    Range {
        base: usize,
        page: u64,
        off: u64,
        len: u64,
        write: bool,
    },
    /// The range the last map asked for, from its `skip`th page: again
    /// and again across maps and unmaps, as a device reaches one large
    /// buffer part after part (a translation the engine keeps).
    Again {
        skip: u64,
        write: bool,
    },
    Flush,
}

fn pages() -> impl Strategy<Value = u64> {
    prop_oneof![1..8u64, Just(512u64), Just(1024u64), 500..1100u64]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3usize, 0..WINDOW_PAGES, pages(), 0..16u64, prop_oneof![Just(0u64), 1..512u64], 0..4u8)
            .prop_map(|(base, page, n, phys_block, phys_off, prot)| {
                // Page offsets 0, 512, ... make block-aligned IOVAs likely.
                let page = if page % 3 == 0 { page / 512 * 512 } else { page };
                Op::Map { base, page, n, phys_block, phys_off, prot }
            }),
        1 => (0..3usize, 0..WINDOW_PAGES, proptest::collection::vec((0..64u64, 1..4u64), 1..5))
            .prop_map(|(base, page, runs)| Op::MapSg { base, page, runs }),
        1 => (0..2u64).prop_map(|which| Op::MapGiant { which }),
        4 => (0..3usize, 0..WINDOW_PAGES, pages()).prop_map(|(base, page, n)| {
            let page = if page % 2 == 0 { page / 512 * 512 } else { page };
            Op::Unmap { base, page, n }
        }),
        1 => (0..2u64).prop_map(|which| Op::UnmapGiant { which }),
        4 => (0..3usize, 0..WINDOW_PAGES + 2, 0..P, any::<bool>())
            .prop_map(|(base, page, off, write)| Op::Translate { base, page, off, write }),
        2 => (0..3usize, 0..WINDOW_PAGES, 0..P, 0..(3 * BLOCK_2M), any::<bool>())
            .prop_map(|(base, page, off, len, write)| Op::Range { base, page, off, len, write }),
        3 => (prop_oneof![Just(0u64), 0..600u64], any::<bool>())
            .prop_map(|(skip, write)| Op::Again { skip, write }),
        1 => Just(Op::Flush),
    ]
}

/// Leaves by first IOVA: (size, phys, prot).
#[derive(Default)]
struct Model {
    leaves: BTreeMap<u64, (u64, u64, Prot)>,
}

impl Model {
    fn leaf(&self, a: u64) -> Option<(u64, u64, u64, Prot)> {
        let (&b, &(s, p, prot)) = self.leaves.range(..=a).next_back()?;
        (a < b + s).then_some((b, s, p, prot))
    }

    fn free(&self, lo: u64, hi: u64) -> bool {
        if self.leaf(lo).is_some() {
            return false;
        }
        self.leaves.range(lo..hi).next().is_none()
    }

    /// The decomposition the domain must use: at each address the largest
    /// of 1 GiB / 2 MiB / 4 KiB that is aligned (IOVA and physical) and fits.
    fn map(&mut self, iova: u64, phys: u64, size: u64, prot: Prot) {
        let mut a = iova;
        while a < iova + size {
            let p = phys + (a - iova);
            let s = [BLOCK_1G, BLOCK_2M, P]
                .into_iter()
                .find(|&s| a % s == 0 && p % s == 0 && a + s <= iova + size)
                .expect("4 KiB always fits");
            self.leaves.insert(a, (s, p, prot));
            a += s;
        }
    }

    fn unmap(&mut self, lo: u64, hi: u64) -> Result<u64, IommuError> {
        for edge in [lo, hi - 1] {
            if let Some((b, s, _, _)) = self.leaf(edge) {
                if b < lo || b + s > hi {
                    return Err(IommuError::WouldSplitBlock { iova: b, size: s });
                }
            }
        }
        let keys: Vec<u64> = self.leaves.range(lo..hi).map(|(k, _)| *k).collect();
        let mut bytes = 0;
        for k in keys {
            bytes += self.leaves.remove(&k).expect("listed").0;
        }
        Ok(bytes)
    }

    fn translate(&self, a: u64, access: Access) -> Result<u64, FaultReason> {
        match self.leaf(a) {
            None => Err(FaultReason::Unmapped),
            Some((b, _, p, prot)) if prot.allows(access) => Ok(p + (a - b)),
            Some(_) => Err(FaultReason::Permission),
        }
    }

    fn bytes(&self) -> u64 {
        self.leaves.values().map(|l| l.0).sum()
    }
}

fn check_translations(
    d: &Domain,
    e: &mut EngineTlb,
    m: &Model,
    a: u64,
    len: u64,
    acc: Access,
    use_tlb: bool,
) -> Result<(), TestCaseError> {
    // Model: page by page.
    let mut want: Result<Vec<(u64, u64)>, (u64, FaultReason)> = Ok(Vec::new());
    let mut x = a;
    while x < a + len {
        let n = ((x / P + 1) * P).min(a + len) - x;
        match m.translate(x, acc) {
            Err(r) => {
                want = Err((x, r));
                break;
            }
            Ok(p) => {
                if let Ok(v) = want.as_mut() {
                    match v.last_mut() {
                        Some(l) if l.0 + l.1 == p => l.1 += n,
                        _ => v.push((p, n)),
                    }
                }
            }
        }
        x += n;
    }
    let mut runs = Vec::new();
    let got = d
        .translate_range(a, len, acc, &mut runs)
        .map(|_| runs.clone())
        .map_err(|f| (f.iova, f.reason));
    prop_assert_eq!(&got, &want, "walk of {:#x}+{:#x}", a, len);
    if use_tlb {
        let mut s = e.enter();
        let got = s
            .translate_range(d, 9, a, len, acc, &mut runs)
            .map(|_| runs.clone())
            .map_err(|f| (f.iova, f.reason));
        prop_assert_eq!(&got, &want, "IOTLB translation of {:#x}+{:#x}", a, len);
    }
    Ok(())
}

fn run(ops: Vec<Op>, mode: InvalidationMode) -> Result<(), TestCaseError> {
    let iommu = Iommu::new();
    let mut e = EngineTlb::new(&iommu);
    let d = Domain::new(
        &iommu,
        5,
        DomainConfig {
            mode,
            fq_size: 8,
            ..DomainConfig::default()
        },
    )
    .unwrap();
    let mut m = Model::default();
    let mut last_map = None;
    for op in ops {
        match op {
            Op::Map {
                base,
                page,
                n,
                phys_block,
                phys_off,
                prot,
            } => {
                let iova = BASES[base] + page * P;
                last_map = Some((iova, n * P));
                let phys = (1 << 40) + phys_block * BLOCK_2M + phys_off * P;
                let prot = Prot::from_bits(prot).unwrap();
                let free = m.free(iova, iova + n * P);
                let r = d.map(iova, phys, n * P, prot);
                prop_assert_eq!(r.is_ok(), free, "map {:#x}+{} pages: {:?}", iova, n, r);
                if free {
                    m.map(iova, phys, n * P, prot);
                }
            }
            Op::MapSg { base, page, runs } => {
                let iova = BASES[base] + page * P;
                let sg: Vec<(u64, u64)> = runs
                    .iter()
                    .map(|&(b, n)| ((1 << 41) + b * 8 * P, n * P))
                    .collect();
                let total: u64 = sg.iter().map(|r| r.1).sum();
                let free = m.free(iova, iova + total);
                let r = d.map_sg(iova, &sg, Prot::RW);
                prop_assert_eq!(r.is_ok(), free, "map_sg {:#x}: {:?}", iova, r);
                if free {
                    prop_assert_eq!(r.unwrap(), total);
                    let mut at = iova;
                    for (p, len) in sg {
                        m.map(at, p, len, Prot::RW);
                        at += len;
                    }
                }
            }
            Op::MapGiant { which } => {
                let iova = (2 + which) * BLOCK_1G;
                let free = m.free(iova, iova + BLOCK_1G);
                let r = d.map(iova, (3 + which) * BLOCK_1G, BLOCK_1G, Prot::READ);
                prop_assert_eq!(r.is_ok(), free);
                if free {
                    m.map(iova, (3 + which) * BLOCK_1G, BLOCK_1G, Prot::READ);
                }
            }
            Op::Unmap { base, page, n } => {
                let iova = BASES[base] + page * P;
                let want = m.unmap(iova, iova + n * P);
                prop_assert_eq!(d.unmap(iova, n * P), want, "unmap {:#x}+{} pages", iova, n);
            }
            Op::UnmapGiant { which } => {
                let iova = (2 + which) * BLOCK_1G;
                let want = m.unmap(iova, iova + BLOCK_1G);
                prop_assert_eq!(d.unmap(iova, BLOCK_1G), want);
            }
            Op::Translate {
                base,
                page,
                off,
                write,
            } => {
                let a = BASES[base] + page * P + off;
                let acc = if write { Access::Write } else { Access::Read };
                prop_assert_eq!(
                    d.translate(a, acc).map_err(|f| f.reason),
                    m.translate(a, acc)
                );
                prop_assert_eq!(d.iova_to_phys(a), m.leaf(a).map(|(b, _, p, _)| p + (a - b)));
                let quiet = d.stats().fq_pending == 0;
                check_translations(&d, &mut e, &m, a, 1, acc, quiet)?;
            }
            Op::Range {
                base,
                page,
                off,
                len,
                write,
            } => {
                let a = BASES[base] + page * P + off;
                let acc = if write { Access::Write } else { Access::Read };
                let quiet = d.stats().fq_pending == 0;
                check_translations(&d, &mut e, &m, a, len, acc, quiet)?;
            }
            Op::Again { skip, write } => {
                let Some((iova, len)) = last_map else {
                    continue;
                };
                let skip = (skip * P).min(len - P);
                let acc = if write { Access::Write } else { Access::Read };
                let quiet = d.stats().fq_pending == 0;
                check_translations(&d, &mut e, &m, iova + skip, len - skip, acc, quiet)?;
            }
            Op::Flush => d.flush_iotlb_all(),
        }
        prop_assert_eq!(d.mapped_bytes(), m.bytes());
        // Large pages where the model says so.
        let (p4, b2, b1) = d.leaf_counts();
        let count = |s: u64| m.leaves.values().filter(|l| l.0 == s).count() as u64;
        prop_assert_eq!((p4, b2, b1), (count(P), count(BLOCK_2M), count(BLOCK_1G)));
    }
    // mappings() covers exactly the model.
    let mut bytes = 0;
    for mp in d.mappings() {
        let mut a = mp.iova;
        while a < mp.iova + mp.size {
            let (b, s, p, prot) = m.leaf(a).expect("mapped in the model");
            prop_assert_eq!((p + (a - b), prot), (mp.phys + (a - mp.iova), mp.prot));
            let step = (b + s).min(mp.iova + mp.size) - a;
            bytes += step;
            a += step;
        }
    }
    prop_assert_eq!(bytes, m.bytes());
    // Unmapping everything frees every table but the root, once flushed.
    for b in BASES {
        d.unmap(b, WINDOW_PAGES * P + 4 * BLOCK_2M).unwrap();
    }
    for w in 0..2 {
        d.unmap((2 + w) * BLOCK_1G, BLOCK_1G).unwrap();
    }
    d.flush_iotlb_all();
    prop_assert_eq!(d.mapped_bytes(), 0);
    prop_assert_eq!(d.table_pages(), 1);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn strict_domain_matches_leaf_model(ops in proptest::collection::vec(op(), 1..60)) {
        run(ops, InvalidationMode::Strict)?;
    }

    #[test]
    fn deferred_domain_matches_leaf_model(ops in proptest::collection::vec(op(), 1..60)) {
        run(ops, InvalidationMode::Deferred)?;
    }
}

/// Large pages translate exactly like the 4 KiB pages they stand for.
#[test]
fn blocks_translate_like_pages() {
    let iommu = Iommu::new();
    let mut e = EngineTlb::new(&iommu);
    let big = Domain::new(&iommu, 1, DomainConfig::default()).unwrap();
    let small = Domain::new(
        &iommu,
        2,
        DomainConfig {
            blocks: false,
            ..DomainConfig::default()
        },
    )
    .unwrap();
    for d in [&big, &small] {
        d.map(BLOCK_1G, 4 * BLOCK_1G, BLOCK_1G + 3 * BLOCK_2M, Prot::RW)
            .unwrap();
    }
    assert_eq!(big.leaf_counts(), (0, 3, 1));
    assert_eq!(small.leaf_counts().0, (BLOCK_1G + 3 * BLOCK_2M) / P);
    let mut s = e.enter();
    let (mut r1, mut r2) = (Vec::new(), Vec::new());
    for k in 0..2000u64 {
        let a = BLOCK_1G + (k * 0x9e37_79b9) % (BLOCK_1G + 3 * BLOCK_2M);
        for acc in [Access::Read, Access::Write] {
            assert_eq!(big.translate(a, acc), small.translate(a, acc));
            assert_eq!(
                s.translate(&big, 1, a, acc).ok(),
                s.translate(&small, 1, a, acc).ok()
            );
        }
        let len = (k * 7919) % (3 * P);
        s.translate_range(&big, 1, a, len, Access::Read, &mut r1)
            .unwrap_or_else(|f| panic!("{f}"));
        let _ = s.translate_range(&small, 1, a, len, Access::Read, &mut r2);
        if a + len <= 2 * BLOCK_1G + 3 * BLOCK_2M {
            assert_eq!(r1, r2);
        }
    }
}
