//! Property test: random map/unmap/translate sequences against a plain
//! page map.

use std::collections::BTreeMap;

use proptest::prelude::*;
use wd_iommu::{Access, Domain, FaultReason, Prot, PAGE_SIZE};

/// Windows straddling leaf (2 MiB) and directory (1 GiB) boundaries.
const BASES: [u64; 3] = [0, (1 << 21) - 16 * PAGE_SIZE, (1 << 30) - 16 * PAGE_SIZE];

#[derive(Clone, Debug)]
enum Op {
    Map {
        base: usize,
        page: u64,
        n: u64,
        phys: u64,
        prot: u8,
    },
    Unmap {
        base: usize,
        page: u64,
        n: u64,
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
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..3usize, 0..32u64, 1..6u64, 0..64u64, 1..4u8).prop_map(|(base, page, n, phys, prot)| {
            Op::Map {
                base,
                page,
                n,
                phys,
                prot,
            }
        }),
        (0..3usize, 0..32u64, 1..8u64).prop_map(|(base, page, n)| Op::Unmap { base, page, n }),
        (0..3usize, 0..34u64, 0..PAGE_SIZE, any::<bool>()).prop_map(|(base, page, off, write)| {
            Op::Translate {
                base,
                page,
                off,
                write,
            }
        }),
        (
            0..3usize,
            0..34u64,
            0..PAGE_SIZE,
            0..(5 * PAGE_SIZE),
            any::<bool>()
        )
            .prop_map(|(base, page, off, len, write)| Op::Range {
                base,
                page,
                off,
                len,
                write
            }),
    ]
}

type Model = BTreeMap<u64, (u64, Prot)>;

fn model_translate(m: &Model, a: u64, access: Access) -> Result<u64, FaultReason> {
    match m.get(&(a / PAGE_SIZE)) {
        None => Err(FaultReason::Unmapped),
        Some((pp, prot)) if prot.allows(access) => Ok(pp * PAGE_SIZE + a % PAGE_SIZE),
        Some(_) => Err(FaultReason::Permission),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn domain_matches_page_model(ops in proptest::collection::vec(op(), 1..80)) {
        let mut d = Domain::new(5);
        let mut m: Model = BTreeMap::new();
        let mut runs = Vec::new();
        for op in ops {
            match op {
                Op::Map { base, page, n, phys, prot } => {
                    let iova = BASES[base] + page * PAGE_SIZE;
                    let prot = Prot::from_bits(prot).unwrap();
                    let free = (0..n).all(|i| !m.contains_key(&(iova / PAGE_SIZE + i)));
                    let r = d.map(iova, (0x1000 + phys) * PAGE_SIZE, n * PAGE_SIZE, prot);
                    prop_assert_eq!(r.is_ok(), free, "map {:#x}+{} pages", iova, n);
                    if free {
                        for i in 0..n { m.insert(iova / PAGE_SIZE + i, (0x1000 + phys + i, prot)); }
                    }
                }
                Op::Unmap { base, page, n } => {
                    let iova = BASES[base] + page * PAGE_SIZE;
                    let mut want = 0;
                    for i in 0..n { if m.remove(&(iova / PAGE_SIZE + i)).is_some() { want += PAGE_SIZE; } }
                    prop_assert_eq!(d.unmap(iova, n * PAGE_SIZE), Ok(want));
                }
                Op::Translate { base, page, off, write } => {
                    let a = BASES[base] + page * PAGE_SIZE + off;
                    let acc = if write { Access::Write } else { Access::Read };
                    prop_assert_eq!(d.translate(a, acc).map_err(|f| f.reason), model_translate(&m, a, acc));
                }
                Op::Range { base, page, off, len, write } => {
                    let a = BASES[base] + page * PAGE_SIZE + off;
                    let acc = if write { Access::Write } else { Access::Read };
                    // Model: byte-by-page walk.
                    let mut want: Result<Vec<(u64, u64)>, (u64, FaultReason)> = Ok(Vec::new());
                    let mut x = a;
                    while x < a + len {
                        let n = ((x / PAGE_SIZE + 1) * PAGE_SIZE).min(a + len) - x;
                        match model_translate(&m, x, acc) {
                            Err(r) => { want = Err((x, r)); break; }
                            Ok(p) => if let Ok(v) = want.as_mut() {
                                match v.last_mut() { Some(l) if l.0 + l.1 == p => l.1 += n, _ => v.push((p, n)) }
                            }
                        }
                        x += n;
                    }
                    let got = d.translate_range(a, len, acc, &mut runs).map(|_| runs.clone()).map_err(|f| (f.iova, f.reason));
                    prop_assert_eq!(got, want);
                }
            }
            prop_assert_eq!(d.mapped_bytes(), m.len() as u64 * PAGE_SIZE);
            // mappings() covers exactly the model's pages.
            let mut pages = 0;
            for mp in d.mappings() {
                for i in 0..mp.size / PAGE_SIZE {
                    let (pp, prot) = m[&(mp.iova / PAGE_SIZE + i)];
                    prop_assert_eq!((pp * PAGE_SIZE, prot), (mp.phys + i * PAGE_SIZE, mp.prot));
                    pages += 1;
                }
            }
            prop_assert_eq!(pages, m.len());
        }
        // Unmapping everything frees every table but the root.
        for b in BASES { d.unmap(b, 64 * PAGE_SIZE).unwrap(); }
        prop_assert_eq!(d.table_pages(), 1);
    }
}
