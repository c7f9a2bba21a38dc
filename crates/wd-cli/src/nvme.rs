//! `wd nvme`: a mediated NVMe controller as a user sees one: what it
//! identifies as, and how fast it reads and writes (`perf`, in the manner
//! of `spdk_nvme_perf`). The workload loop is shared with `wd bench nvme`,
//! which also runs it against io_uring on the store directly.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use wd_nvme_driver::msg::identify::{cns, NamespaceInfo};
use wd_nvme_driver::msg::IoOp;
use wd_nvme_driver::{Controller, IoQueue, Namespace, Options};
use wrapdrive::{HostConn, SharedBuf};

use crate::report::{emit, percentile, print_json};
use crate::units::{exact_size, size_arg};

/// `wd nvme ...`.
#[derive(clap::Args)]
pub struct NvmeCmd {
    #[command(subcommand)]
    op: NvmeOp,
}

#[derive(clap::Subcommand)]
enum NvmeOp {
    /// Bring a controller up and print Identify Controller and every
    /// namespace of the device.
    Identify {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Drive a namespace with a workload and print IOPS, MiB/s, latency
    /// percentiles and CPU per I/O.
    Perf(PerfArgs),
}

/// Read/write pattern of a workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// Random reads.
    Randread,
    /// Random writes.
    Randwrite,
    /// Random reads and writes (`--mix` percent reads).
    Randrw,
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
}

/// Options of `wd nvme perf`.
#[derive(clap::Args, Clone)]
pub struct PerfArgs {
    /// Namespace to use (attached for the run).
    #[arg(long, default_value_t = 1)]
    pub ns: u32,
    /// Commands kept in flight (1..=4095: a queue holds 4096 entries, one
    /// always empty).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=4095))]
    pub qd: u32,
    /// Block size of each command (a multiple of the namespace's blocks).
    #[arg(long, default_value = "4k", value_parser = size_arg)]
    pub bs: u64,
    /// Pattern.
    #[arg(long, value_enum, default_value_t = Pattern::Randread)]
    pub rw: Pattern,
    /// Percent reads for randrw.
    #[arg(long, default_value_t = 70, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub mix: u32,
    /// Seconds to run.
    #[arg(long, default_value_t = 5.0, value_parser = crate::units::seconds_arg)]
    pub time: f64,
    /// Do not use shadow doorbells (Doorbell Buffer Config).
    #[arg(long)]
    pub no_shadow: bool,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

/// What one workload run measured.
#[derive(Clone, Debug, Serialize)]
pub struct PerfResult {
    /// Commands completed.
    pub ios: u64,
    /// Seconds measured.
    pub seconds: f64,
    /// Commands per second.
    pub iops: f64,
    /// MiB per second.
    pub mib_s: f64,
    /// Latency percentiles, microseconds.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Process CPU time per command, microseconds (the host's too when it
    /// runs in this process).
    pub cpu_us_per_io: f64,
}

/// A tiny xorshift generator: random block numbers without a dependency.
pub struct Rng(u64);

impl Rng {
    /// Seeded generator.
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    /// Next value below `n` (> 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Where the next command of a workload goes: (is it a read, block
/// offset in units of the command size).
pub struct Picker {
    rw: Pattern,
    mix: u32,
    slots: u64,
    next: u64,
    rng: Rng,
}

impl Picker {
    /// Commands of one size over `slots` positions.
    pub fn new(rw: Pattern, mix: u32, slots: u64) -> Picker {
        Picker {
            rw,
            mix: mix.min(100),
            slots: slots.max(1),
            next: 0,
            rng: Rng::new(0x9e37_79b9_7f4a_7c15),
        }
    }

    /// The next command.
    pub fn pick(&mut self) -> (bool, u64) {
        match self.rw {
            Pattern::Read | Pattern::Write => {
                let at = self.next;
                self.next = (self.next + 1) % self.slots;
                (self.rw == Pattern::Read, at)
            }
            Pattern::Randread => (true, self.rng.below(self.slots)),
            Pattern::Randwrite => (false, self.rng.below(self.slots)),
            Pattern::Randrw => {
                let read = self.rng.below(100) < self.mix as u64;
                (read, self.rng.below(self.slots))
            }
        }
    }
}

/// Latencies in nanoseconds and a clock, turned into a result.
pub fn summarize(
    mut lat: Vec<u64>,
    ios: u64,
    bytes: u64,
    took: Duration,
    cpu: Duration,
) -> PerfResult {
    lat.sort_unstable();
    let s = took.as_secs_f64().max(1e-9);
    PerfResult {
        ios,
        seconds: s,
        iops: ios as f64 / s,
        mib_s: bytes as f64 / s / (1 << 20) as f64,
        p50_us: percentile(&lat, 0.5) as f64 / 1e3,
        p99_us: percentile(&lat, 0.99) as f64 / 1e3,
        p999_us: percentile(&lat, 0.999) as f64 / 1e3,
        cpu_us_per_io: cpu.as_secs_f64() * 1e6 / ios.max(1) as f64,
    }
}

/// Run a workload on an I/O queue: `qd` commands of `bs` bytes kept in
/// flight for `time`, each with its own slot of `buf` (shared with the
/// controller, at least (qd + 1) * bs bytes).
pub fn run_queue(
    q: &mut IoQueue,
    ns: &Namespace,
    buf: &SharedBuf,
    a: &PerfArgs,
) -> Result<PerfResult, String> {
    check_bs(a.bs, ns)?;
    let slots = (ns.blocks * ns.block) / a.bs;
    let entries = q.pair().entries();
    if a.qd == 0 || a.qd >= entries {
        return Err(format!("queue depth must be 1..{entries}"));
    }
    let mut pick = Picker::new(a.rw, a.mix, slots);
    let mut started = vec![Instant::now(); entries as usize];
    let mut lat = Vec::with_capacity(1 << 20);
    let mut done = Vec::with_capacity(a.qd as usize);
    let (mut ios, mut bytes) = (0u64, 0u64);
    let e = |e: wd_nvme_driver::NvmeError| e.to_string();
    let mut push = |q: &mut IoQueue, started: &mut Vec<Instant>| -> Result<(), String> {
        let (read, at) = pick.pick();
        let slot = q.pair().next_cid().ok_or("queue full")? as u64;
        let op = if read { IoOp::Read } else { IoOp::Write };
        let cid = q
            .push_rw(op, ns, at * a.bs / ns.block, buf.addr() + slot * a.bs, a.bs)
            .map_err(e)?;
        started[cid as usize] = Instant::now();
        Ok(())
    };
    let cpu0 = wd_sys::process_cpu_time();
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs_f64(a.time);
    for _ in 0..a.qd {
        push(q, &mut started)?;
    }
    q.pair().ring().map_err(e)?;
    let mut now = t0;
    while now < until {
        done.clear();
        q.pair().reap(&mut done).map_err(e)?;
        if done.is_empty() {
            std::hint::spin_loop();
            now = Instant::now();
            continue;
        }
        now = Instant::now();
        for c in &done {
            if !c.status.is_success() {
                return Err(format!("command {} failed: {}", c.cid, c.status));
            }
            lat.push(now.duration_since(started[c.cid as usize]).as_nanos() as u64);
            ios += 1;
            bytes += a.bs;
        }
        // Only then the next commands: they take the ids just freed, and
        // their start times would stand for the batch's later ones.
        for _ in &done {
            push(q, &mut started)?;
        }
        q.pair().ring().map_err(e)?;
    }
    let took = t0.elapsed();
    let cpu = wd_sys::process_cpu_time() - cpu0;
    // Let what is in flight finish before the buffer is reused.
    let t = Instant::now();
    while q.pair().in_flight() > 0 && t.elapsed() < Duration::from_secs(10) {
        done.clear();
        q.pair().reap(&mut done).map_err(e)?;
    }
    Ok(summarize(lat, ios, bytes, took, cpu))
}

/// Refuse a block size no command can move, or that does not fit the
/// namespace, before the (qd + 1) x bs buffer is allocated: a huge one
/// would otherwise fail there, with a message about memory rather than
/// about --bs.
fn check_bs(bs: u64, ns: &Namespace) -> Result<(), String> {
    check_transfer(bs)?;
    if bs == 0 || bs % ns.block != 0 || (ns.blocks * ns.block) / bs == 0 {
        return Err(format!(
            "--bs {bs}: does not fit namespace {} ({} blocks of {} B)",
            ns.nsid, ns.blocks, ns.block
        ));
    }
    Ok(())
}

/// The controller's transfer limit, checkable before any namespace is open.
fn check_transfer(bs: u64) -> Result<(), String> {
    let max = wd_nvme_driver::MAX_TRANSFER;
    if bs > max {
        return Err(format!(
            "--bs {bs}: a command moves at most {max} bytes ({} KiB: one PRP list)",
            max / 1024
        ));
    }
    Ok(())
}

/// Bring up a controller, open namespace `a.ns` and an I/O queue for `a`.
pub fn setup(
    host: &Arc<HostConn>,
    a: &PerfArgs,
) -> Result<(Controller, Namespace, IoQueue, SharedBuf), String> {
    check_transfer(a.bs)?;
    let e = |e: wd_nvme_driver::NvmeError| e.to_string();
    let mut c = Controller::open(
        host,
        &Options {
            shadow_doorbells: !a.no_shadow,
        },
    )
    .map_err(e)?;
    let ns = c.open_namespace(a.ns).map_err(e)?;
    check_bs(a.bs, &ns)?;
    let q = c.create_io_queue((a.qd + 1).max(2)).map_err(e)?;
    let len = (a.qd as u64 + 1)
        .checked_mul(a.bs)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| format!("--qd {} x --bs {}: too many bytes", a.qd, a.bs))?;
    let buf = SharedBuf::new(len).map_err(|e| e.to_string())?;
    c.share(&buf).map_err(|e| e.to_string())?;
    Ok((c, ns, q, buf))
}

impl NvmeCmd {
    /// Run against `host` (a host with an `nvme` device).
    pub fn run(self, host: &Arc<HostConn>) -> Result<(), String> {
        match self.op {
            NvmeOp::Identify { json } => identify(host, json),
            NvmeOp::Perf(a) => {
                let (mut c, ns, mut q, buf) = setup(host, &a)?;
                let r = run_queue(&mut q, &ns, &buf, &a)?;
                let _ = c.delete_io_queue(q);
                if a.json {
                    print_json(&serde_json::json!({"args": {
                        "ns": a.ns, "qd": a.qd, "bs": a.bs, "rw": a.rw, "mix": a.mix, "time": a.time,
                        "shadow_doorbells": !a.no_shadow }, "result": r}));
                } else {
                    emit(&format!(
                        "{:?} {} qd {} on namespace {}: {:.0} IOPS, {:.1} MiB/s, latency p50 {:.2} us, p99 {:.2} us, p99.9 {:.2} us, CPU {:.2} us/IO\n",
                        a.rw, exact_size(a.bs), a.qd, a.ns, r.iops, r.mib_s, r.p50_us, r.p99_us, r.p999_us, r.cpu_us_per_io
                    ));
                }
                Ok(())
            }
        }
    }
}

fn identify(host: &Arc<HostConn>, json: bool) -> Result<(), String> {
    let e = |e: wd_nvme_driver::NvmeError| e.to_string();
    let mut c = Controller::open(host, &Options::default()).map_err(e)?;
    let info = c.info().clone();
    let active = c.active_namespaces().map_err(e)?;
    let mut namespaces = Vec::new();
    for nsid in c.allocated_namespaces().map_err(e)? {
        let raw = c.identify(cns::ALLOCATED_NAMESPACE, nsid).map_err(e)?;
        let ns = NamespaceInfo::from_bytes(&raw);
        namespaces.push((nsid, ns, active.contains(&nsid)));
    }
    if json {
        let list: Vec<_> = namespaces
            .iter()
            .map(|(id, ns, act)| {
                serde_json::json!({"nsid": id, "blocks": ns.nsze, "block_size": ns.block_size(),
                    "bytes": ns.nsze * ns.block_size(), "attached_here": act})
            })
            .collect();
        print_json(&serde_json::json!({
            "controller": {"cntlid": info.cntlid, "model": info.model, "serial": info.serial,
                "firmware": info.firmware, "version": format!("{}.{}.{}", info.version >> 16, info.version >> 8 & 0xff, info.version & 0xff),
                "mdts_bytes": 4096u64 << info.mdts, "namespaces": info.nn, "oacs": info.oacs, "oncs": info.oncs,
                "volatile_write_cache": info.vwc, "subnqn": info.subnqn},
            "namespaces": list}));
        return Ok(());
    }
    let mut out = format!(
        "controller {}: {} (serial {}, firmware {}), NVMe {}.{}.{}\n  max transfer {}, {} namespace(s), volatile write cache {}\n  optional admin {:#06x}, optional NVM {:#06x}, {}\n",
        info.cntlid,
        info.model,
        info.serial,
        info.firmware,
        info.version >> 16,
        info.version >> 8 & 0xff,
        info.version & 0xff,
        exact_size(4096u64 << info.mdts),
        info.nn,
        if info.vwc { "yes" } else { "no" },
        info.oacs,
        info.oncs,
        info.subnqn
    );
    for (id, ns, _) in &namespaces {
        out.push_str(&format!(
            "  namespace {id}: {} blocks of {} B ({})\n",
            ns.nsze,
            ns.block_size(),
            exact_size(ns.nsze * ns.block_size())
        ));
    }
    emit(&out);
    Ok(())
}
