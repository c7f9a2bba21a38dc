//! The hot path: translating a request's range with IOTLB hits, next to a
//! memcpy of the same size.

use crate::report::outln;
use std::time::Instant;

use serde::Serialize;
use wd_iommu::{Access, Domain, DomainConfig, EngineTlb, Iommu, Prot, BLOCK_2M};

use super::IommuArgs;
use crate::report::{median, Progress};
use crate::units::exact_size;

#[derive(Clone, Debug, Serialize)]
pub(super) struct TranslateRow {
    /// "4k-pages" or "2m-block".
    layout: &'static str,
    size: u64,
    /// One IOTLB-hit translation of the range, ns.
    translate_ns: f64,
    /// memcpy of the same size, ns.
    memcpy_ns: f64,
    /// translate / memcpy.
    ratio: f64,
}

fn time_per_iter(mut f: impl FnMut(), iters: u64) -> f64 {
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    t.elapsed().as_nanos() as f64 / iters as f64
}

pub(super) fn translate_table(
    args: &IommuArgs,
    prog: &mut Progress,
) -> Result<Vec<TranslateRow>, String> {
    let iommu = Iommu::new();
    let pages = Domain::new(
        &iommu,
        1,
        DomainConfig {
            blocks: false,
            ..DomainConfig::default()
        },
    )
    .expect("a domain without a budget");
    let blocks =
        Domain::new(&iommu, 2, DomainConfig::default()).expect("a domain without a budget");
    let src = vec![7u8; 2 << 20];
    let mut dst = vec![0u8; 2 << 20];
    for d in [&pages, &blocks] {
        d.map(BLOCK_2M, 1 << 40, BLOCK_2M, Prot::RW)
            .map_err(|e| e.to_string())?;
    }
    let mut e = EngineTlb::new(&iommu);
    let mut runs = Vec::with_capacity(512);
    let mut rows = Vec::new();
    for (layout, d) in [("4k-pages", &pages), ("2m-block", &blocks)] {
        for size in [64u64, 4096, 65536, 2 << 20] {
            prog.step(&format!("translate {layout} {}", exact_size(size)));
            let iters = ((64 << 20) / size.max(4096)).clamp(256, 200_000);
            let mut tv = Vec::new();
            let mut mv = Vec::new();
            for _ in 0..args.reps {
                let mut s = e.enter();
                // Warm the IOTLB.
                s.translate_range(d, 1, BLOCK_2M, size, Access::Read, &mut runs)
                    .map_err(|f| f.to_string())?;
                tv.push(time_per_iter(
                    || {
                        let r = s.translate_range(
                            d,
                            1,
                            std::hint::black_box(BLOCK_2M),
                            size,
                            Access::Read,
                            &mut runs,
                        );
                        std::hint::black_box(&r);
                    },
                    iters,
                ));
                drop(s);
                let n = size as usize;
                mv.push(time_per_iter(
                    || {
                        dst[..n].copy_from_slice(&src[..n]);
                        std::hint::black_box(&mut dst);
                    },
                    iters,
                ));
            }
            let (t, m) = (median(&tv), median(&mv));
            rows.push(TranslateRow {
                layout,
                size,
                translate_ns: t,
                memcpy_ns: m,
                ratio: t / m,
            });
        }
    }
    Ok(rows)
}

pub(super) fn print_translate(rows: &[TranslateRow], args: &IommuArgs) {
    outln!("Hot path: translating a request's range with IOTLB hits, next to a memcpy of the same size (medians of {} reps)", args.reps);
    outln!();
    outln!("| layout | size | translate | memcpy | translate / memcpy |");
    outln!("|---|---:|---:|---:|---:|");
    for r in rows {
        outln!(
            "| {} | {} | {:.1} ns | {:.1} ns | {:.3} |",
            r.layout,
            exact_size(r.size),
            r.translate_ns,
            r.memcpy_ns,
            r.ratio
        );
    }
    outln!();
}
