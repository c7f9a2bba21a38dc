//! `wd bench nvme`: the mediated NVMe controller against io_uring on the
//! same store, in one run: 4 KiB random reads at queue depth 1 (latency)
//! and 32 (IOPS), on a disk file read with O_DIRECT and on a file in
//! memory (tmpfs, page cache), where the device costs nothing and the
//! mediation's own cost shows; then the polling thread's CPU when idle.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use wd_sys::uring::{ReadDone, Uring};
use wrapdrive::HostConn;

use crate::nvme::{run_queue, setup, summarize, Pattern, PerfArgs, PerfResult, Picker};
use crate::report::{emit, median_by, print_json, Progress, Target};
use crate::units::{exact_size, size_arg};

/// Options of `wd bench nvme`.
#[derive(clap::Args)]
pub struct BenchNvmeArgs {
    /// Directory for the disk store (a filesystem with O_DIRECT).
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,
    /// Directory for the memory store (tmpfs).
    #[arg(long, default_value = "/dev/shm")]
    mem_dir: PathBuf,
    /// Bytes of each store (written in full before measuring).
    #[arg(long, default_value = "512M", value_parser = size_arg)]
    size: u64,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 1.0, value_parser = crate::units::seconds_arg)]
    seconds: f64,
    /// Repetitions (medians are reported; host and mediated runs alternate).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// CPU for the controller's polling thread (the client runs on
    /// another one).
    #[arg(long, default_value_t = 1)]
    cpu: usize,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

/// One row of the table: a store, a queue depth, a path.
#[derive(Debug, Serialize)]
struct Row {
    store: String,
    qd: u32,
    path: String,
    #[serde(flatten)]
    r: PerfResult,
}

/// Fill `path` with `size` bytes of a pattern (every block different, so
/// nothing is a hole or deduplicated) and make it durable.
fn make_store(path: &Path, size: u64) -> Result<(), String> {
    use std::io::Write;
    let mut f = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut chunk = vec![0u8; 1 << 20];
    let mut off = 0u64;
    while off < size {
        for (i, c) in chunk.chunks_mut(8).enumerate() {
            c.copy_from_slice(&(off + 8 * i as u64).to_le_bytes());
        }
        let n = (size - off).min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n])
            .map_err(|e| format!("{}: {e}", path.display()))?;
        off += n as u64;
    }
    f.sync_all()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(())
}

/// The host path: io_uring reads of `a.bs` at random offsets of `path`
/// (O_DIRECT when `direct`), `a.qd` in flight, from this thread, waiting
/// in the kernel or (`poll`) spinning on the completion ring.
fn run_uring(
    path: &Path,
    direct: bool,
    poll: bool,
    size: u64,
    a: &PerfArgs,
) -> Result<PerfResult, String> {
    let fd = wd_sys::file::open_read(path, direct).map_err(|e| e.to_string())?;
    let slots = size / a.bs;
    let memfd = wd_sys::memfd_create("wd-bench-nvme", false).map_err(|e| e.to_string())?;
    let span = (a.qd as u64 * a.bs) as usize;
    wd_sys::ftruncate(memfd.as_fd(), span as u64).map_err(|e| e.to_string())?;
    let map = wd_sys::Mapping::map_shared(memfd.as_fd(), 0, span).map_err(|e| e.to_string())?;
    let mut ring = Uring::new(a.qd * 2).map_err(|e| e.to_string())?;
    ring.reads(|ring| {
        let mut pick = Picker::new(Pattern::Randread, 100, slots);
        let mut started = vec![Instant::now(); a.qd as usize];
        let mut lat = Vec::with_capacity(1 << 20);
        let mut done: Vec<ReadDone> = Vec::with_capacity(a.qd as usize);
        let fdb = fd.as_fd();
        let cpu0 = wd_sys::process_cpu_time();
        let t0 = Instant::now();
        let until = t0 + Duration::from_secs_f64(a.time);
        let bs = a.bs as usize;
        // Where the next read goes: (buffer offset, file offset, tag).
        let mut next = |slot: usize, started: &mut Vec<Instant>| {
            let (_, at) = pick.pick();
            started[slot] = Instant::now();
            (slot * bs, at * a.bs, slot as u64)
        };
        for slot in 0..a.qd as usize {
            let (moff, foff, ud) = next(slot, &mut started);
            ring.push_read(fdb, &map, moff, bs, foff, ud)
                .map_err(|e| e.to_string())?;
        }
        let (mut ios, mut bytes) = (0u64, 0u64);
        // Reads pushed and not yet submitted.
        let mut fresh = true;
        loop {
            done.clear();
            // Polled: submit what is new without waiting, then spin on the
            // completion ring (no system call), as the mediated path's two
            // ends spin; otherwise wait in the kernel.
            if !poll || fresh {
                ring.submit_and_wait(usize::from(!poll), &mut done)
                    .map_err(|e| e.to_string())?;
                fresh = false;
            } else {
                ring.reap(&mut done);
            }
            if done.is_empty() {
                std::hint::spin_loop();
                if Instant::now() < until {
                    continue;
                }
            }
            let now = Instant::now();
            for d in &done {
                if d.result != a.bs as i32 {
                    return Err(format!("io_uring read returned {}", d.result));
                }
                lat.push(now.duration_since(started[d.user_data as usize]).as_nanos() as u64);
                ios += 1;
                bytes += a.bs;
            }
            if now >= until {
                break;
            }
            for d in &done {
                let (moff, foff, ud) = next(d.user_data as usize, &mut started);
                ring.push_read(fdb, &map, moff, bs, foff, ud)
                    .map_err(|e| e.to_string())?;
                fresh = true;
            }
        }
        let took = t0.elapsed();
        let cpu = wd_sys::process_cpu_time() - cpu0;
        ring.drain();
        Ok(summarize(lat, ios, bytes, took, cpu))
    })
}

/// The simplest host path: one `pread` at a time from this thread
/// (queue depth 1 only).
fn run_pread(path: &Path, direct: bool, size: u64, a: &PerfArgs) -> Result<PerfResult, String> {
    let fd = wd_sys::file::open_read(path, direct).map_err(|e| e.to_string())?;
    let memfd = wd_sys::memfd_create("wd-bench-nvme", false).map_err(|e| e.to_string())?;
    wd_sys::ftruncate(memfd.as_fd(), a.bs).map_err(|e| e.to_string())?;
    let map =
        wd_sys::Mapping::map_shared(memfd.as_fd(), 0, a.bs as usize).map_err(|e| e.to_string())?;
    let mut pick = Picker::new(Pattern::Randread, 100, size / a.bs);
    let mut lat = Vec::with_capacity(1 << 20);
    let cpu0 = wd_sys::process_cpu_time();
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs_f64(a.time);
    let mut now = t0;
    while now < until {
        let (_, at) = pick.pick();
        let n = wd_sys::file::pread_into(fd.as_fd(), &map, 0, a.bs as usize, at * a.bs)
            .map_err(|e| e.to_string())?;
        if n as u64 != a.bs {
            return Err(format!("pread returned {n}"));
        }
        let t = Instant::now();
        lat.push(t.duration_since(now).as_nanos() as u64);
        now = t;
    }
    let ios = lat.len() as u64;
    Ok(summarize(
        lat,
        ios,
        ios * a.bs,
        t0.elapsed(),
        wd_sys::process_cpu_time() - cpu0,
    ))
}

/// CPU time (user + system) of this process's thread named `name`.
fn thread_cpu(name: &str) -> Option<Duration> {
    let tick = 100.0; // USER_HZ on Linux.
    for t in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
        // Fields after the command's closing parenthesis; utime and stime
        // are the 12th and 13th of them.
        let rest = &stat[stat.rfind(')')? + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
        return Some(Duration::from_secs_f64(ticks / tick));
    }
    None
}

/// Run the benchmark (it starts its own host in this process).
pub fn run(a: BenchNvmeArgs) -> Result<(), String> {
    if a.reps == 0 || a.size < (16 << 20) {
        return Err("need --reps >= 1 and --size >= 16M".into());
    }
    // A CPU past the machine's is taken modulo their count, as before the
    // host refused such a cpu=: say (and print in the table) the CPU the
    // polling thread runs on. One the process may not use is the host's
    // error, naming the CPUs it may.
    let mut a = a;
    let cpus = wd_sys::online_cpus().max(1);
    if a.cpu >= cpus {
        if !a.json {
            eprintln!(
                "wd bench nvme: --cpu {}: this machine has {cpus} CPU(s); the polling thread runs on CPU {}",
                a.cpu,
                a.cpu % cpus
            );
        }
        a.cpu %= cpus;
    }
    let pid = std::process::id();
    let disk = a.dir.join(format!("wd-bench-nvme-{pid}.img"));
    let mem = a.mem_dir.join(format!("wd-bench-nvme-{pid}.img"));
    let mut cleanup = crate::temp::Removed::default();
    cleanup.add(disk.clone());
    cleanup.add(mem.clone());
    let fs_of = |p: &Path| {
        std::fs::File::open(p)
            .ok()
            .and_then(|f| wd_sys::file::fs_of(f.as_fd()).ok())
            .map(|(m, _)| wd_sys::file::fs_name(m))
            .unwrap_or_else(|| "?".into())
    };
    if !a.json {
        eprintln!(
            "wd bench nvme: writing two {} stores ({} and {}) ...",
            exact_size(a.size),
            disk.display(),
            mem.display()
        );
    }
    make_store(&disk, a.size)?;
    make_store(&mem, a.size)?;
    let (disk_fs, mem_fs) = (fs_of(&disk), fs_of(&mem));
    let dir = std::env::temp_dir().join(format!("wd-bench-nvme-{pid}"));
    cleanup.add(dir.clone());
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let socket = dir.join("wd.sock").display().to_string();
    let spec = format!(
        "nvme:cpu={},ns={}:0:{},ns={}:0:{}",
        a.cpu,
        disk.display(),
        a.size,
        mem.display(),
        a.size
    );
    let cfg = wd_host::HostConfig {
        socket: socket.clone(),
        socket_mode: 0o600,
        devices: vec![wd_host::DeviceConfig::parse_spec(&spec).map_err(|e| e.to_string())?],
        ..wd_host::HostConfig::default()
    };
    let host = wd_host::Host::start(&cfg).map_err(|e| e.to_string())?;
    // The client on another CPU than the polling thread.
    let client_cpu = (a.cpu + 1) % wd_sys::online_cpus().max(1);
    let _ = wd_sys::pin_thread(client_cpu);
    let conn: Arc<HostConn> = HostConn::connect(&socket).map_err(|e| e.to_string())?;
    let engine_line = conn.get_attr("dev0/engine").unwrap_or_else(|_| "?".into());

    let stores = [
        ("disk", 1u32, disk.as_path(), true),
        ("memory", 2, mem.as_path(), false),
    ];
    let depths = [1u32, 32];
    // Per rig (store and depth): each path's repetitions.
    let mut samples: Vec<Vec<(&str, Vec<PerfResult>)>> = Vec::new();
    let mut progress = Progress::new(a.reps * 14);
    let mut rigs = Vec::new();
    for &(_, nsid, _, _) in &stores {
        for &qd in &depths {
            rigs.push(PerfArgs {
                ns: nsid,
                qd,
                bs: 4096,
                rw: Pattern::Randread,
                mix: 100,
                time: a.seconds,
                no_shadow: false,
                json: false,
            });
            samples.push(Vec::new());
        }
    }
    let mut record = |k: usize, path: &'static str, r: PerfResult| match samples[k]
        .iter_mut()
        .find(|(p, _)| *p == path)
    {
        Some((_, v)) => v.push(r),
        None => samples[k].push((path, vec![r])),
    };
    // Repetitions interleave the paths, so drift hits them alike.
    for _rep in 0..a.reps {
        for (k, args) in rigs.iter().enumerate() {
            let (name, _, path, direct) = stores[k / 2];
            progress.step(&format!("{name} qd {} io_uring", args.qd));
            record(k, "io_uring", run_uring(path, direct, false, a.size, args)?);
            progress.step(&format!("{name} qd {} io_uring polled", args.qd));
            record(
                k,
                "io_uring-poll",
                run_uring(path, direct, true, a.size, args)?,
            );
            if args.qd == 1 {
                progress.step(&format!("{name} qd 1 pread"));
                record(k, "pread", run_pread(path, direct, a.size, args)?);
            }
            progress.step(&format!("{name} qd {} mediated", args.qd));
            // A namespace is attached to one controller at a time: each
            // run brings one up and lets the namespace go after.
            let (mut c, ns, mut q, buf) = setup(&conn, args)?;
            record(k, "mediated", run_queue(&mut q, &ns, &buf, args)?);
            let _ = c.delete_io_queue(q);
            let _ = c.detach(ns.nsid);
            drop(c);
        }
    }
    progress.finish();
    // Idle: a controller that is up (queues, shadow doorbells) but gets
    // no commands must let its polling thread sleep after the timeout;
    // the next command wakes it.
    let idle_args = PerfArgs {
        ns: 2,
        qd: 1,
        bs: 4096,
        rw: Pattern::Randread,
        mix: 100,
        time: 0.05,
        no_shadow: false,
        json: false,
    };
    let (mut idle_c, idle_ns, mut idle_q, idle_buf) = setup(&conn, &idle_args)?;
    run_queue(&mut idle_q, &idle_ns, &idle_buf, &idle_args)?;
    let settle = Duration::from_millis(1500);
    std::thread::sleep(settle);
    let idle_window = Duration::from_secs(2);
    let before = thread_cpu("wd-dev0-e0");
    std::thread::sleep(idle_window);
    let after = thread_cpu("wd-dev0-e0");
    let idle_cpu = match (before, after) {
        (Some(b), Some(e)) => Some((e - b).as_secs_f64() / idle_window.as_secs_f64() * 100.0),
        _ => None,
    };
    // The first command after the sleep: its latency includes the wake-up.
    let t = Instant::now();
    idle_q
        .read(&idle_ns, 0, &idle_buf, 0, 4096)
        .map_err(|e| e.to_string())?;
    let wake_us = t.elapsed().as_secs_f64() * 1e6;
    let _ = idle_c.delete_io_queue(idle_q);
    drop(idle_c);
    drop(conn);
    host.shutdown();
    drop(cleanup);

    let mut rows = Vec::new();
    // Medians by the measure the row is about: p50 at depth 1, IOPS at 32.
    let pick_median = |v: Vec<PerfResult>, by_iops: bool| {
        median_by(v, |x: &PerfResult, y| {
            if by_iops {
                x.iops.total_cmp(&y.iops)
            } else {
                x.p50_us.total_cmp(&y.p50_us)
            }
        })
    };
    // Per rig: the mediated median and the best host path's median (lowest
    // p50 at depth 1, most IOPS at 32): the strictest comparison.
    let mut cells: Vec<(PerfResult, PerfResult, &str)> = Vec::new();
    for (k, args) in rigs.iter().enumerate() {
        let (name, ..) = stores[k / 2];
        let by_iops = args.qd > 1;
        let mut best: Option<(PerfResult, &str)> = None;
        let mut mediated = None;
        for (path, v) in &samples[k] {
            let m = pick_median(v.clone(), by_iops);
            rows.push(Row {
                store: name.into(),
                qd: args.qd,
                path: path.to_string(),
                r: m.clone(),
            });
            if *path == "mediated" {
                mediated = Some(m);
            } else if best.as_ref().is_none_or(|(b, _)| {
                if by_iops {
                    m.iops > b.iops
                } else {
                    m.p50_us < b.p50_us
                }
            }) {
                best = Some((m, path));
            }
        }
        let (b, bp) = best.expect("host paths measured");
        cells.push((b, mediated.expect("mediated measured"), bp));
    }
    let targets = vec![
        Target::at_most(
            format!(
                "disk QD1 4 KiB random read p50, mediated / best host path ({})",
                cells[0].2
            ),
            cells[0].1.p50_us / cells[0].0.p50_us,
            1.05,
        ),
        Target::at_least(
            format!(
                "disk QD32 4 KiB random read IOPS, mediated / best host path ({})",
                cells[1].2
            ),
            cells[1].1.iops / cells[1].0.iops,
            0.95,
        ),
        Target::at_most(
            format!(
                "memory QD1 p50 added by the mediation over the best host path ({}), us",
                cells[2].2
            ),
            cells[2].1.p50_us - cells[2].0.p50_us,
            2.0,
        ),
        Target::at_most(
            "idle polling thread CPU (%)",
            idle_cpu.unwrap_or(f64::NAN),
            1.0,
        ),
    ];
    if a.json {
        print_json(&serde_json::json!({
            "stores": {"disk": {"path": disk, "fs": disk_fs, "io": "O_DIRECT"},
                       "memory": {"path": mem, "fs": mem_fs, "io": "page cache"}},
            "size": a.size, "reps": a.reps, "seconds": a.seconds,
            "cpus": {"polling_thread": a.cpu, "client": client_cpu},
            "engine": engine_line,
            "rows": rows,
            "idle_polling_cpu_percent": idle_cpu,
            "first_command_after_sleep_us": wake_us,
            "targets": targets,
        }));
        return Ok(());
    }
    let mut out = format!(
        "wd bench nvme: 4 KiB random reads, {} stores, medians of {} x {:.1} s (polling thread on CPU {}, client on CPU {})\n  disk: {} ({}, O_DIRECT on both paths)\n  memory: {} ({}, page cache on both paths)\n  device: {}\n\n",
        exact_size(a.size),
        a.reps,
        a.seconds,
        a.cpu,
        client_cpu,
        disk.display(),
        disk_fs,
        mem.display(),
        mem_fs,
        engine_line
    );
    out.push_str(&format!(
        "{:<8} {:>3} {:<13} {:>10} {:>9} {:>9} {:>9} {:>9}\n",
        "store", "qd", "path", "IOPS", "p50 us", "p99 us", "p99.9 us", "CPU us/IO"
    ));
    for r in &rows {
        out.push_str(&format!(
            "{:<8} {:>3} {:<13} {:>10.0} {:>9.2} {:>9.2} {:>9.2} {:>9.2}\n",
            r.store, r.qd, r.path, r.r.iops, r.r.p50_us, r.r.p99_us, r.r.p999_us, r.r.cpu_us_per_io
        ));
    }
    out.push_str(&format!(
        "\nidle controller (queues up, no commands): polling thread CPU {} over {:.0} s, measured from {:.1} s after the last command; the next command took {wake_us:.0} us (wake-up included)\n\n",
        idle_cpu.map_or("?".into(), |c| format!("{c:.2}%")),
        idle_window.as_secs_f64(),
        settle.as_secs_f64()
    ));
    for t in &targets {
        out.push_str(&t.line());
        out.push('\n');
    }
    emit(&out);
    Ok(())
}
