//! DMA streams through the dummy device with every request's buffers mapped
//! before and unmapped after: strict against deferred invalidation, through
//! the host's DMA API and through virtio-iommu requests. The host is
//! observed only through its inspection API (`Host::queue_dma`,
//! `Host::iommu_stats`).

use crate::report::outln;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use wd_iommu::{Domain, Prot, PAGE_SIZE};

use super::IommuArgs;
use crate::report::{median, Progress, Target};
use crate::units::exact_size;

/// The rows of the stream table, in order.
pub(super) const STREAM_PATHS: [&str; 5] = [
    "no-iommu",
    "strict",
    "deferred",
    "virtio-strict",
    "virtio-deferred",
];
/// Rows of the stream table (for the progress bar).
pub(super) const STREAM_ROWS: usize = STREAM_PATHS.len();
/// Requests in flight at most (default): a NIC-like ring of 256 buffers.
pub(super) const IN_FLIGHT: usize = 256;
/// Requests mapped and sent per batch (default): a NAPI-like budget of 64.
pub(super) const STREAM_BATCH: usize = 64;
/// First IOVA of the per-request mappings: above every user address, so
/// never one of the identity mappings of shared memory.
const STREAM_IOVA: u64 = 1 << 47;
/// IOVA slots the per-request mappings rotate through (an IOVA is reused
/// only long after its unmap, as an IOVA allocator does).
const STREAM_SLOTS: u64 = 4096;
/// Requests one kick may carry (the protocol's limit).
const KICK_MAX: usize = wd_proto::limits::MAX_VIRTIO_REQS;
/// virtio-iommu domain the virtio rows attach their queue to.
const VIRTIO_DOMAIN: u32 = 1;

#[derive(Clone, Debug, Serialize)]
struct StreamRow {
    path: &'static str,
    /// What one request's mapping costs on this path.
    model: &'static str,
    ops_per_sec: f64,
    gbytes_per_sec: f64,
    /// Throughput / the no-iommu row's (median over the rounds of the ratio
    /// within a round).
    vs_no_iommu: f64,
    /// CPU per request of no-iommu / this row's: the throughput ratio a
    /// CPU-bound machine would see.
    cpu_efficiency: f64,
    /// IOMMU syncs per request (invalidations waited for).
    syncs_per_req: f64,
    /// Mean wait of a sync that found an engine busy.
    sync_wait_us: f64,
    /// Socket round trips per request (virtio-iommu kicks).
    kicks_per_req: f64,
    /// CPU time of the whole process (client, host threads, engine) per
    /// request: what the path costs, whatever else the machine runs.
    cpu_us_per_req: f64,
}

#[derive(Debug, Serialize)]
pub(super) struct StreamTable {
    request_size: u64,
    in_flight: usize,
    batch: usize,
    rows: Vec<StreamRow>,
}

/// How a row maps a request's buffers before it is sent and unmaps them
/// after it completed.
enum Mapper {
    /// Buffers mapped once (their identity mappings); nothing per request.
    Static,
    /// The host's DMA API called directly (as a kernel driver would): one
    /// map per buffer before, one unmap per buffer after, in the queue's own
    /// domain (strict: each unmap waits for its invalidation; deferred: a
    /// flush queue).
    HostDma { dom: Arc<Domain>, next: u64 },
    /// virtio-iommu, unoptimised: one kick with the request's MAPs before,
    /// one kick with its UNMAPs after (strict domain).
    VirtioEach {
        h: Arc<wrapdrive::HostConn>,
        next: u64,
        kicks: u64,
    },
    /// virtio-iommu, batched and deferred: one kick per batch carrying the
    /// MAPs of the batch and the UNMAPs queued since the last kick (deferred
    /// domain: its flush queue completes them).
    VirtioBatched {
        h: Arc<wrapdrive::HostConn>,
        next: u64,
        kicks: u64,
        pending: Vec<wrapdrive::virtio::Request>,
    },
}

/// A request's buffers: (src, dst) in the client (guest-physical) and host
/// address spaces.
#[derive(Clone, Copy)]
struct Pair {
    gpa: (u64, u64),
    host: (u64, u64),
}

fn vstatus_ok(st: &[Option<wrapdrive::virtio::Status>]) -> Result<(), String> {
    match st
        .iter()
        .find(|s| **s != Some(wrapdrive::virtio::Status::Ok))
    {
        None => Ok(()),
        Some(s) => Err(format!("virtio-iommu request failed: {s:?}")),
    }
}

/// Send virtio-iommu requests in kicks of at most KICK_MAX; returns the
/// kicks made.
fn kick_all(h: &wrapdrive::HostConn, reqs: &[wrapdrive::virtio::Request]) -> Result<u64, String> {
    let mut kicks = 0;
    for chunk in reqs.chunks(KICK_MAX) {
        let st = h.virtio_requests(chunk).map_err(|e| e.to_string())?;
        vstatus_ok(&st)?;
        kicks += 1;
    }
    Ok(kicks)
}

impl Mapper {
    fn slot(next: &mut u64, size: u64) -> (u64, u64) {
        let k = *next % STREAM_SLOTS;
        *next += 1;
        let base = STREAM_IOVA + k * 2 * size;
        (base, base + size)
    }

    fn kicks(&self) -> u64 {
        match self {
            Mapper::VirtioEach { kicks, .. } | Mapper::VirtioBatched { kicks, .. } => *kicks,
            _ => 0,
        }
    }

    /// Map the buffers of a batch; returns the (src, dst) device addresses.
    fn map(&mut self, pairs: &[Pair], size: u64, out: &mut Vec<(u64, u64)>) -> Result<(), String> {
        use wrapdrive::virtio::{Request, VIRTIO_IOMMU_MAP_F_READ, VIRTIO_IOMMU_MAP_F_WRITE};
        out.clear();
        let map = |iova: u64, gpa: u64, flags: u32| Request::Map {
            domain: VIRTIO_DOMAIN,
            virt_start: iova,
            virt_end: iova + size - 1,
            phys_start: gpa,
            flags,
        };
        match self {
            Mapper::Static => out.extend(pairs.iter().map(|p| p.gpa)),
            Mapper::HostDma { dom, next } => {
                for p in pairs {
                    let (s, d) = Mapper::slot(next, size);
                    dom.map(s, p.host.0, size, Prot::READ)
                        .and_then(|_| dom.map(d, p.host.1, size, Prot::WRITE))
                        .map_err(|e| e.to_string())?;
                    out.push((s, d));
                }
            }
            Mapper::VirtioEach { h, next, kicks } => {
                for p in pairs {
                    let (s, d) = Mapper::slot(next, size);
                    let st = h
                        .virtio_requests(&[
                            map(s, p.gpa.0, VIRTIO_IOMMU_MAP_F_READ),
                            map(d, p.gpa.1, VIRTIO_IOMMU_MAP_F_WRITE),
                        ])
                        .map_err(|e| e.to_string())?;
                    *kicks += 1;
                    vstatus_ok(&st)?;
                    out.push((s, d));
                }
            }
            Mapper::VirtioBatched {
                h,
                next,
                kicks,
                pending,
            } => {
                // The queued UNMAPs go first, in the same kick when they fit.
                let mut reqs = std::mem::take(pending);
                for p in pairs {
                    let (s, d) = Mapper::slot(next, size);
                    reqs.push(map(s, p.gpa.0, VIRTIO_IOMMU_MAP_F_READ));
                    reqs.push(map(d, p.gpa.1, VIRTIO_IOMMU_MAP_F_WRITE));
                    out.push((s, d));
                }
                *kicks += kick_all(h, &reqs)?;
            }
        }
        Ok(())
    }

    /// Unmap the buffers of completed requests.
    fn unmap(&mut self, done: &[(u64, u64)], size: u64) -> Result<(), String> {
        use wrapdrive::virtio::Request;
        let unmap = |iova: u64| Request::Unmap {
            domain: VIRTIO_DOMAIN,
            virt_start: iova,
            virt_end: iova + size - 1,
            reserved: [0; 4],
        };
        match self {
            Mapper::Static => {}
            Mapper::HostDma { dom, .. } => {
                for &(s, d) in done {
                    dom.unmap(s, size).map_err(|e| e.to_string())?;
                    dom.unmap(d, size).map_err(|e| e.to_string())?;
                }
            }
            Mapper::VirtioEach { h, kicks, .. } => {
                for &(s, d) in done {
                    let st = h
                        .virtio_requests(&[unmap(s), unmap(d)])
                        .map_err(|e| e.to_string())?;
                    *kicks += 1;
                    vstatus_ok(&st)?;
                }
            }
            Mapper::VirtioBatched {
                h, kicks, pending, ..
            } => {
                for &(s, d) in done {
                    pending.push(unmap(s));
                    pending.push(unmap(d));
                }
                // Bounded: a long run of completions is sent on its own.
                if pending.len() >= KICK_MAX {
                    *kicks += kick_all(h, &std::mem::take(pending))?;
                }
            }
        }
        Ok(())
    }

    /// Send what is still queued (end of a measurement).
    fn drain(&mut self) -> Result<(), String> {
        if let Mapper::VirtioBatched {
            h, kicks, pending, ..
        } = self
        {
            if !pending.is_empty() {
                *kicks += kick_all(h, &std::mem::take(pending))?;
            }
        }
        Ok(())
    }
}

struct StreamPath {
    name: &'static str,
    q: wrapdrive::Queue,
    mapper: Mapper,
}

/// Keep one request per buffer pair going for `secs`, mapping each batch
/// before it is sent and unmapping each completion: returns requests/s and
/// the requests done.
fn stream_run(
    p: &mut StreamPath,
    pairs: &[Pair],
    size: u64,
    secs: f64,
    batch: usize,
) -> Result<(f64, u64, f64), String> {
    let in_flight = pairs.len();
    use wd_dummy_msg::CopyMsg;
    let mut free: Vec<usize> = (0..in_flight).collect();
    let mut inflight: Vec<(u64, u64)> = vec![(0, 0); in_flight];
    let mut iovas = Vec::with_capacity(batch);
    let mut batch_pairs = Vec::with_capacity(batch);
    let mut reqs = Vec::with_capacity(batch);
    let mut done = Vec::with_capacity(in_flight);
    let mut unmaps = Vec::with_capacity(in_flight);
    let mut count = 0u64;
    let warm = Duration::from_millis(30);
    let total = Duration::from_secs_f64(secs) + warm;
    let t0 = Instant::now();
    let mut measured_from: Option<(Instant, u64, Duration)> = None;
    loop {
        let el = t0.elapsed();
        if measured_from.is_none() && el >= warm {
            measured_from = Some((Instant::now(), count, wd_sys::process_cpu_time()));
        }
        if el >= total {
            break;
        }
        if free.len() >= batch {
            let slots: Vec<usize> = (0..batch).map(|_| free.pop().expect("counted")).collect();
            batch_pairs.clear();
            batch_pairs.extend(slots.iter().map(|&k| pairs[k]));
            p.mapper.map(&batch_pairs, size, &mut iovas)?;
            reqs.clear();
            for (k, &(s, d)) in slots.iter().zip(iovas.iter()) {
                inflight[*k] = (s, d);
                reqs.push((
                    CopyMsg {
                        src: s,
                        dst: d,
                        len: size,
                    }
                    .to_desc(0),
                    *k as u64,
                ));
            }
            let n = p.q.send_batch(&reqs).map_err(|e| e.to_string())?;
            if n != reqs.len() {
                return Err(format!("queue accepted {n} of {}", reqs.len()));
            }
        }
        done.clear();
        if free.len() < batch {
            // Not enough room for the next batch: wait for a completion
            // (as an interrupt-driven driver does) rather than poll hot,
            // which would steal the engine's CPU on a small machine.
            done.push(
                p.q.recv_sync(Some(Duration::from_secs(10)))
                    .map_err(|e| e.to_string())?,
            );
        }
        p.q.recv_batch(&mut done, in_flight)
            .map_err(|e| e.to_string())?;
        unmaps.clear();
        for c in &done {
            if c.desc.status != 0 {
                return Err(format!(
                    "{}: request failed with status {}",
                    p.name, c.desc.status
                ));
            }
            let k = c.cookie as usize;
            unmaps.push(inflight[k]);
            free.push(k);
        }
        count += done.len() as u64;
        p.mapper.unmap(&unmaps, size)?;
    }
    let (from, c0, cpu0) = measured_from.unwrap_or((t0, 0, Duration::ZERO));
    let rate = (count - c0) as f64 / from.elapsed().as_secs_f64();
    let cpu_us =
        (wd_sys::process_cpu_time() - cpu0).as_secs_f64() * 1e6 / (count - c0).max(1) as f64;
    // Let what is in flight finish, so the next run starts empty.
    while free.len() < in_flight {
        let c =
            p.q.recv_sync(Some(Duration::from_secs(10)))
                .map_err(|e| e.to_string())?;
        free.push(c.cookie as usize);
        let k = c.cookie as usize;
        p.mapper.unmap(&[inflight[k]], size)?;
    }
    p.mapper.drain()?;
    Ok((rate, count, cpu_us))
}

pub(super) fn stream_table(args: &IommuArgs, prog: &mut Progress) -> Result<StreamTable, String> {
    use wrapdrive::virtio::Request;
    use wrapdrive::{Capability, FaultPolicy, InvalidationMode, SharedBuf};
    let size = args.request_size;
    if size == 0 || size % PAGE_SIZE != 0 || size > (16 << 20) {
        return Err("--request-size must be a multiple of 4096, at most 16 MiB".into());
    }
    let in_flight = args.in_flight;
    if !(1..=4096).contains(&in_flight) || !(1..=in_flight).contains(&args.batch) {
        return Err("need --in-flight in 1..=4096 and --batch in 1..=in-flight".into());
    }
    if in_flight as u64 * 2 * size > (1 << 30) {
        return Err("--in-flight x --request-size x 2 buffers exceeds 1 GiB".into());
    }
    let host = Arc::new(
        wd_host::Host::embedded(vec![wd_host::DeviceConfig::new("dummy")])
            .map_err(|e| e.to_string())?,
    );
    let conn = wd_embedded::connect_to(&host).map_err(|e| e.to_string())?;
    let bufs: Vec<(SharedBuf, SharedBuf)> = (0..in_flight)
        .map(|_| {
            let s = SharedBuf::new(size as usize)?;
            let d = SharedBuf::new(size as usize)?;
            s.write(0, &vec![0x5a; size as usize]);
            Ok((s, d))
        })
        .collect::<Result<_, wrapdrive::ClientError>>()
        .map_err(|e| e.to_string())?;
    let mut paths = Vec::new();
    let mut pairs: Vec<Pair> = Vec::new();
    for name in STREAM_PATHS {
        if name != "no-iommu" && !args.paths.iter().any(|p| p == name) {
            continue;
        }
        // A virtio row's queue has a connection of its own, hence its own
        // virtio-iommu device, domain and guest memory.
        let c = if name.starts_with("virtio") {
            wd_embedded::connect_to(&host).map_err(|e| e.to_string())?
        } else {
            conn.clone()
        };
        let mut q = c
            .request_queue(&Capability::new("memcpy").depth(in_flight.next_power_of_two() as u32))
            .map_err(|e| e.to_string())?;
        // Registration: the buffers become the queue's memory (and the
        // connection's guest-physical memory for virtio-iommu).
        for (s, d) in &bufs {
            q.share(s.addr(), s.len()).map_err(|e| e.to_string())?;
            q.share(d.addr(), d.len()).map_err(|e| e.to_string())?;
        }
        let dom = host
            .queue_dma(q.id())
            .ok_or("the host does not know the queue")?;
        if pairs.is_empty() {
            for (s, d) in &bufs {
                let host_of = |a: u64| dom.iova_to_phys(a).ok_or("shared memory not mapped");
                pairs.push(Pair {
                    gpa: (s.addr(), d.addr()),
                    host: (host_of(s.addr())?, host_of(d.addr())?),
                });
            }
        }
        let deferred = name.ends_with("deferred");
        let mode = if deferred {
            InvalidationMode::Deferred
        } else {
            InvalidationMode::Strict
        };
        q.set_iommu_policy(mode, FaultPolicy::Abort)
            .map_err(|e| e.to_string())?;
        let mapper = match name {
            "no-iommu" => Mapper::Static,
            "strict" | "deferred" => Mapper::HostDma { dom, next: 0 },
            _ => {
                let h = q.host().clone();
                let st = h
                    .virtio_requests(&[Request::Attach {
                        domain: VIRTIO_DOMAIN,
                        endpoint: q.id(),
                        flags: 0,
                        reserved: [0; 4],
                    }])
                    .map_err(|e| e.to_string())?;
                vstatus_ok(&st)?;
                if deferred {
                    Mapper::VirtioBatched {
                        h,
                        next: 0,
                        kicks: 0,
                        pending: Vec::new(),
                    }
                } else {
                    Mapper::VirtioEach {
                        h,
                        next: 0,
                        kicks: 0,
                    }
                }
            }
        };
        paths.push(StreamPath { name, q, mapper });
    }
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); paths.len()];
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); paths.len()];
    let mut syncs = vec![0u64; paths.len()];
    let mut waited = vec![0u64; paths.len()];
    let mut wait_ns = vec![0u64; paths.len()];
    let mut reqs = vec![0u64; paths.len()];
    let mut kicks = vec![0u64; paths.len()];
    // Repetitions interleave the rows, so drift on a shared machine hits
    // them alike.
    for _ in 0..args.reps {
        for (i, p) in paths.iter_mut().enumerate() {
            prog.step(&format!("stream {}", p.name));
            let s0 = host.iommu_stats();
            let k0 = p.mapper.kicks();
            let (rate, n, c) = stream_run(p, &pairs, size, args.seconds, args.batch)?;
            let s1 = host.iommu_stats();
            rates[i].push(rate);
            cpu[i].push(c);
            syncs[i] += s1.syncs - s0.syncs;
            waited[i] += s1.waited_syncs - s0.waited_syncs;
            wait_ns[i] += s1.wait_ns - s0.wait_ns;
            kicks[i] += p.mapper.kicks() - k0;
            reqs[i] += n;
        }
    }
    // Each row against the baseline measured in the same round, a moment
    // earlier: the median of those ratios cancels the machine's drift.
    let ratios: Vec<f64> = (0..paths.len())
        .map(|i| {
            let r: Vec<f64> = rates[i].iter().zip(&rates[0]).map(|(r, b)| r / b).collect();
            median(&r)
        })
        .collect();
    let medians: Vec<f64> = rates.iter().map(|r| median(r)).collect();
    let cpu: Vec<f64> = cpu.iter().map(|c| median(c)).collect();
    let rows = paths
        .iter()
        .enumerate()
        .map(|(i, p)| StreamRow {
            path: p.name,
            model: match p.name {
                "no-iommu" => "buffers mapped once; no per-request map/unmap",
                "strict" => "host DMA API: map each buffer, unmap each after; every unmap waits for its invalidation",
                "deferred" => "host DMA API: map each buffer, unmap each after; unmaps flushed in batches (flush queue)",
                "virtio-strict" => "virtio-iommu: one kick of MAPs before each request, one kick of UNMAPs after; strict domain",
                _ => "virtio-iommu: one kick per batch (its MAPs + UNMAPs queued since); deferred domain",
            },
            ops_per_sec: medians[i],
            gbytes_per_sec: medians[i] * size as f64 / 1e9,
            vs_no_iommu: ratios[i],
            cpu_efficiency: cpu[0] / cpu[i],
            syncs_per_req: syncs[i] as f64 / reqs[i].max(1) as f64,
            // Host-wide counters: the timer's flushes of other rows' flush
            // queues land in whichever row runs; only a row that syncs
            // itself gets a figure.
            sync_wait_us: if waited[i] > 0 && syncs[i] * 100 >= reqs[i] {
                wait_ns[i] as f64 / 1e3 / waited[i] as f64
            } else {
                0.0
            },
            kicks_per_req: kicks[i] as f64 / reqs[i].max(1) as f64,
            cpu_us_per_req: cpu[i],
        })
        .collect();
    drop(paths);
    drop(bufs);
    Ok(StreamTable {
        request_size: size,
        in_flight,
        batch: args.batch,
        rows,
    })
}

pub(super) fn stream_targets(s: &StreamTable) -> Vec<Target> {
    let row = |p: &str| s.rows.iter().find(|r| r.path == p).map(|r| r.vs_no_iommu);
    let mut t = Vec::new();
    if let Some(v) = row("deferred") {
        t.push(Target::at_least(
            "deferred stream throughput / no-iommu",
            v,
            0.9,
        ));
    }
    if let Some(v) = row("virtio-deferred") {
        t.push(Target::at_least(
            "virtio-iommu deferred stream throughput / no-iommu",
            v,
            0.8,
        ));
    }
    t
}

pub(super) fn print_stream(s: &StreamTable, args: &IommuArgs) {
    outln!(
        "DMA stream, strict vs deferred invalidation, host DMA API vs virtio-iommu: memcpy requests of {} through the dummy device, {} in flight, batches of {}, every request's buffers mapped before and unmapped after; medians of {} reps x {} s",
        exact_size(s.request_size),
        s.in_flight,
        s.batch,
        args.reps,
        args.seconds
    );
    outln!();
    outln!("| path | req/s | GB/s | % of no-iommu | CPU us/req | CPU efficiency | syncs/req | sync wait | kicks/req |");
    outln!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &s.rows {
        outln!(
            "| {} | {:.0} | {:.2} | {:.1}% | {:.2} | {:.1}% | {:.2} | {:.1} us | {:.3} |",
            r.path,
            r.ops_per_sec,
            r.gbytes_per_sec,
            r.vs_no_iommu * 100.0,
            r.cpu_us_per_req,
            r.cpu_efficiency * 100.0,
            r.syncs_per_req,
            r.sync_wait_us,
            r.kicks_per_req
        );
    }
    outln!();
    for r in &s.rows {
        outln!("  {}: {}", r.path, r.model);
    }
    outln!();
}
