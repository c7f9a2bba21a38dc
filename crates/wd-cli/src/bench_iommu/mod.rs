//! `wd bench iommu`: what the software IOMMU costs, in one run.
//!
//! 1. Map/unmap with batched TLB maintenance: map and unmap of 128 KiB,
//!    4 MiB and ~18 MiB scatter lists, one call and one synchronous
//!    invalidation per leaf ("before") against one call and one gathered
//!    range invalidation ("after"), for 4 KiB pages and for 2 MiB blocks
//!    where the memory is contiguous. An engine thread keeps translating and
//!    copying through the same domain meanwhile, as a device serving other
//!    requests does, so every sync waits for a real acknowledgement.
//! 2. A DMA stream through the dummy device where every request's buffers
//!    are mapped before and unmapped after, as % of the throughput without
//!    per-request mapping: strict against deferred invalidation, through the
//!    host's DMA API (emulated IOMMU) and through virtio-iommu requests
//!    (para-virtual IOMMU).
//! 3. The hot path: translating a request's range with IOTLB hits, next to
//!    a memcpy of the same size.
//!
//! One module per measurement (`map`, `stream`, `translate`), each with its
//! rows, table and targets; this one checks the options, runs the parts
//! asked for and prints them. The host is seen only through its inspection
//! API (`wd_host::Host::queue_dma`, `iommu_stats`).

use crate::report::outln;
mod map;
mod stream;
mod translate;

use crate::report::{print_json, Progress};
use crate::units::size_arg;

use map::{map_table, map_targets, print_map};
use stream::{
    print_stream, stream_table, stream_targets, IN_FLIGHT, STREAM_BATCH, STREAM_PATHS, STREAM_ROWS,
};
use translate::{print_translate, translate_table};

/// Options of `wd bench iommu`.
#[derive(clap::Args)]
pub struct IommuArgs {
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// Repetitions per measurement (the median is reported).
    #[arg(long, default_value_t = 7)]
    reps: usize,
    /// Engine threads kept busy translating during the map/unmap runs
    /// (0: every sync finds the engines idle).
    #[arg(long, default_value_t = 1)]
    engines: usize,
    /// Seconds per DMA-stream measurement.
    #[arg(long, default_value_t = 0.25)]
    seconds: f64,
    /// Bytes per request of the DMA stream (e.g. 64k).
    #[arg(long, value_parser = size_arg, default_value_t = 65536)]
    request_size: u64,
    /// Requests of the DMA stream in flight (each with its own buffers).
    #[arg(long, default_value_t = IN_FLIGHT)]
    in_flight: usize,
    /// Requests of the DMA stream mapped and sent per batch.
    #[arg(long, default_value_t = STREAM_BATCH)]
    batch: usize,
    /// Rows of the DMA-stream table (no-iommu, the baseline, is always run).
    #[arg(long, value_delimiter = ',', default_values_t = STREAM_PATHS.iter().map(|p| p.to_string()).collect::<Vec<_>>())]
    paths: Vec<String>,
    /// Only these parts (comma separated: map, stream, translate).
    #[arg(long, value_delimiter = ',', default_values_t = vec!["map".to_string(), "stream".to_string(), "translate".to_string()])]
    parts: Vec<String>,
}

/// Run `wd bench iommu`. It measures a host it starts in this process (the
/// strict and deferred rows drive the host's DMA API directly, as a kernel
/// driver would), so `host` must be "embedded".
pub fn run(args: IommuArgs, host: &str) -> Result<(), String> {
    if host != "embedded" {
        return Err(format!(
            "wd bench iommu measures a host inside this process; --host {host} is not supported"
        ));
    }
    run_iommu(args)
}

// ------------------------------------------------------------ the run

fn run_iommu(args: IommuArgs) -> Result<(), String> {
    if args.reps == 0 || !(0.01..=60.0).contains(&args.seconds) {
        return Err("need --reps >= 1 and --seconds in 0.01..60".into());
    }
    if args.engines > 8 {
        return Err("--engines: at most 8".into());
    }
    for p in &args.parts {
        if !matches!(p.as_str(), "map" | "stream" | "translate") {
            return Err(format!("unknown part '{p}' (map, stream, translate)"));
        }
    }
    if let Some(p) = args
        .paths
        .iter()
        .find(|p| !STREAM_PATHS.contains(&p.as_str()))
    {
        return Err(format!(
            "unknown stream path '{p}' ({})",
            STREAM_PATHS.join(", ")
        ));
    }
    let want = |p: &str| args.parts.iter().any(|x| x == p);
    let mut prog = Progress::new(
        want("map") as usize * 6
            + want("stream") as usize * (1 + args.paths.len()).min(STREAM_ROWS) * args.reps
            + want("translate") as usize * 8,
    );
    let map_rows = if want("map") {
        map_table(&args, &mut prog)?
    } else {
        vec![]
    };
    let stream = if want("stream") {
        Some(stream_table(&args, &mut prog)?)
    } else {
        None
    };
    let tr_rows = if want("translate") {
        translate_table(&args, &mut prog)?
    } else {
        vec![]
    };
    prog.finish();
    let mut targets = map_targets(&map_rows);
    if let Some(s) = &stream {
        targets.extend(stream_targets(s));
    }

    if args.json {
        let v = serde_json::json!({
            "benchmark": "iommu",
            "reps": args.reps,
            "engines": args.engines,
            "map_unmap": map_rows,
            "stream": stream,
            "translate": tr_rows,
            "targets": targets,
        });
        print_json(&v);
        return Ok(());
    }
    if !map_rows.is_empty() {
        print_map(&map_rows, &args);
    }
    if let Some(s) = &stream {
        print_stream(s, &args);
    }
    if !tr_rows.is_empty() {
        print_translate(&tr_rows, &args);
    }
    for t in &targets {
        outln!("{}", t.line());
    }
    Ok(())
}
