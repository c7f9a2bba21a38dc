//! `wd top`: a live view of a running host, built from the attribute tree
//! alone (one ListAttrs per refresh), so it shows exactly what `wd ls`
//! would and needs no privilege or protocol of its own.
//!
//! The host keeps only monotonic counters; every rate here is the
//! difference of two snapshots over the time measured between them.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use wrapdrive::AttrEntry;

use crate::units::format_size;

/// Options of `wd top`.
#[derive(clap::Args)]
#[command(after_help = "\
The first refresh comes one interval after the start: a rate needs two snapshots.

Columns: engines awake (polling or working) and asleep; per queue its owner (pid, uid),
requests/s and bytes/s over the last interval, faults and fallbacks as totals with the
interval's increase in brackets. Fallbacks are the client library's own count of requests
it ran on the CPU instead (client/cpu_requests): reported by the client, not verified.

P99 is the client library's own measure, from sending a request to receiving its
completion, for about one request in 64 (the host cannot time a request it first sees
in shared memory); the histogram in the ring halves every second, so it weighs the last
few seconds. It is a bucket bound, up to 25% above the true value, reported by the
client and not verified; '-' when the queue served no request in the interval or its
client keeps no histogram (an NVMe controller's own queues).

Rates cover the queues this user may see (all of them for the host's owner and root);
a queue that closed during an interval takes its counts with it.")]
pub struct TopArgs {
    /// Seconds between refreshes (fractions allowed, e.g. 0.5; at least 0.05).
    #[arg(long, default_value_t = 1.0, value_parser = parse_interval)]
    interval: f64,
    /// Stop after this many refreshes (default: run until interrupted; 1 with --json).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    iterations: Option<u64>,
    /// Print one JSON object per refresh, one per line (NDJSON), for scripts.
    #[arg(long)]
    json: bool,
}

/// Below this, refreshes would mostly measure the ListAttrs round trip.
const MIN_INTERVAL: f64 = 0.05;

fn parse_interval(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (MIN_INTERVAL..=86_400.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "'{s}' is not a number of seconds between {MIN_INTERVAL} and 86400"
        )),
    }
}

/// One queue as the tree shows it at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QueueSnap {
    pub id: u32,
    pub pid: i64,
    pub uid: u32,
    pub alg: String,
    pub state: String,
    pub in_flight: u64,
    pub requests: u64,
    pub bytes: u64,
    pub faults: u64,
    /// `client/cpu_requests`; the host lists client counters only once one
    /// is nonzero, so absent means the client reported none.
    pub fallbacks: u64,
    /// `client/latency_p99_ns` (`u64::MAX` for "inf", 7.5 s and more): the client's
    /// sampled latencies of the last seconds.
    pub p99_ns: Option<u64>,
}

/// One device at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceSnap {
    /// `dev<index>`.
    pub index: usize,
    pub driver: String,
    pub engines: u64,
    pub engines_sleeping: u64,
    pub engine_sleeps: u64,
    pub engine_wakeups: u64,
    /// Other users' queues, counted but not shown to this user.
    pub hidden_queues: u64,
    /// Device-wide counters of a mediated NVMe controller (every queue's,
    /// hidden ones too), when the device has them.
    pub nvme_commands: Option<u64>,
    pub nvme_bytes: Option<u64>,
    pub queues: Vec<QueueSnap>,
}

/// What one user holds on the host.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct UserSnap {
    pub uid: u32,
    pub connections: u64,
    pub queues: u64,
    pub mapped_bytes: u64,
}

/// The attribute tree at one moment, typed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// Tells a restarted host from the same one (its counters start over).
    pub host_pid: Option<u64>,
    pub version: String,
    pub devices: Vec<DeviceSnap>,
    pub users: Vec<UserSnap>,
    /// The host cut the list at the protocol's limit: some queues are missing.
    pub truncated: bool,
}

/// A value the host wrote; one it could not have written counts as 0
/// rather than failing a whole refresh.
fn num<T: std::str::FromStr + Default>(v: &str) -> T {
    v.trim().parse().unwrap_or_default()
}

impl Snapshot {
    /// Type the entries of one ListAttrs answer; attributes `wd top` does
    /// not show are skipped, so a newer host's additions do not break it.
    pub fn parse(entries: &[AttrEntry]) -> Snapshot {
        let mut s = Snapshot {
            truncated: entries.len() >= wd_proto::limits::MAX_ATTRS,
            ..Snapshot::default()
        };
        let mut devs: BTreeMap<usize, (DeviceSnap, BTreeMap<u32, QueueSnap>)> = BTreeMap::new();
        let mut users: BTreeMap<u32, UserSnap> = BTreeMap::new();
        for e in entries {
            let parts: Vec<&str> = e.path.split('/').collect();
            let v = e.value.as_str();
            match parts.as_slice() {
                ["host", "pid"] => s.host_pid = v.trim().parse().ok(),
                ["host", "version"] => s.version = v.to_string(),
                ["host", "users", uid, field] => {
                    let Ok(uid) = uid.parse::<u32>() else {
                        continue;
                    };
                    let u = users.entry(uid).or_insert_with(|| UserSnap {
                        uid,
                        ..UserSnap::default()
                    });
                    match *field {
                        "connections" => u.connections = num(v),
                        "queues" => u.queues = num(v),
                        "mapped_bytes" => u.mapped_bytes = num(v),
                        _ => {}
                    }
                }
                [dev, rest @ ..] if dev.starts_with("dev") => {
                    let Ok(index) = dev[3..].parse::<usize>() else {
                        continue;
                    };
                    let (d, qs) = devs.entry(index).or_insert_with(|| {
                        (
                            DeviceSnap {
                                index,
                                ..DeviceSnap::default()
                            },
                            BTreeMap::new(),
                        )
                    });
                    match rest {
                        ["driver"] => d.driver = v.to_string(),
                        ["engines"] => d.engines = num(v),
                        ["engines_sleeping"] => d.engines_sleeping = num(v),
                        ["engine_sleeps"] => d.engine_sleeps = num(v),
                        ["engine_wakeups"] => d.engine_wakeups = num(v),
                        ["nvme", "commands"] => d.nvme_commands = Some(num(v)),
                        ["nvme", "bytes"] => d.nvme_bytes = Some(num(v)),
                        ["queues", "others"] => d.hidden_queues = num(v),
                        ["queues", q, field @ ..] => {
                            let Some(id) = q.strip_prefix('q').and_then(|n| n.parse().ok()) else {
                                continue;
                            };
                            let q = qs.entry(id).or_insert_with(|| QueueSnap {
                                id,
                                ..QueueSnap::default()
                            });
                            match field {
                                ["pid"] => q.pid = num(v),
                                ["uid"] => q.uid = num(v),
                                ["alg"] => q.alg = v.to_string(),
                                ["state"] => q.state = v.to_string(),
                                ["in_flight"] => q.in_flight = num(v),
                                ["requests"] => q.requests = num(v),
                                ["bytes"] => q.bytes = num(v),
                                ["faults"] => q.faults = num(v),
                                ["client", "cpu_requests"] => q.fallbacks = num(v),
                                ["client", "latency_p99_ns"] => {
                                    q.p99_ns = match v {
                                        "inf" => Some(u64::MAX),
                                        _ => v.parse().ok(),
                                    }
                                }
                                _ => {}
                            }
                        }
                        _ => {}
                    }
                }
                _ => {}
            }
        }
        s.devices = devs
            .into_values()
            .map(|(mut d, qs)| {
                d.queues = qs.into_values().collect();
                d
            })
            .collect();
        s.users = users.into_values().collect();
        s
    }
}

/// Where the latency histogram's last, open bucket starts (7 x 2^30 ns,
/// in µs): a p99 in it is shown as at least this.
const OPEN_BUCKET_US: f64 = (7u64 << 30) as f64 / 1e3;

/// A latency in microseconds, three digits at most.
fn latency_text(us: f64) -> String {
    match us {
        _ if us >= OPEN_BUCKET_US => ">7.5s".to_string(),
        // Each bound where the figure would round up to the next form's
        // (999.6us is "1.0ms", not "1000us").
        _ if us >= 999_500.0 => format!("{:.1}s", us / 1e6),
        _ if us < 9.95 => format!("{us:.1}us"),
        _ if us < 999.5 => format!("{us:.0}us"),
        _ if us < 9_950.0 => format!("{:.1}ms", us / 1e3),
        _ => format!("{:.0}ms", us / 1e3),
    }
}

/// A device's total of its queues' counters, some of which clients report:
/// a hostile one's huge values stop at the top instead of wrapping.
fn total(counts: impl Iterator<Item = u64>) -> u64 {
    counts.fold(0, u64::saturating_add)
}

/// How much a monotonic counter grew between two readings. A reading
/// below the previous one means the counter started over (a restarted
/// host): it has counted its current value since, as Prometheus's `rate()`
/// takes a reset, rather than a wrapped-around difference of 2^64.
pub fn delta(prev: Option<u64>, cur: u64) -> u64 {
    match prev {
        Some(p) if cur >= p => cur - p,
        _ => cur,
    }
}

fn per_sec(n: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        n as f64 / secs
    } else {
        0.0
    }
}

/// One queue in a refresh.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct QueueView {
    pub id: u32,
    pub pid: i64,
    pub uid: u32,
    pub alg: String,
    pub state: String,
    pub in_flight: u64,
    pub requests: u64,
    pub requests_per_s: f64,
    pub bytes: u64,
    pub bytes_per_s: f64,
    pub faults: u64,
    pub faults_delta: u64,
    pub fallbacks: u64,
    pub fallbacks_delta: u64,
    /// The client's sampled p99 of the last seconds (see `wd top --help`);
    /// null when it reported none or the queue was idle; 7516192.768
    /// means that much or more.
    pub p99_latency_us: Option<f64>,
}

/// One device in a refresh; its request, byte, fault and fallback figures
/// add up its visible queues.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeviceView {
    pub name: String,
    pub driver: String,
    pub engines: u64,
    pub engines_awake: u64,
    pub engines_sleeping: u64,
    pub sleeps_per_s: f64,
    pub wakeups_per_s: f64,
    pub queues_hidden: u64,
    pub requests_per_s: f64,
    pub bytes_per_s: f64,
    pub faults: u64,
    pub faults_delta: u64,
    pub fallbacks: u64,
    pub fallbacks_delta: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nvme_commands_per_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nvme_bytes_per_s: Option<f64>,
    pub queues: Vec<QueueView>,
}

/// One refresh: what `--json` prints as a line and the table shows.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct View {
    pub time_unix_ms: u64,
    pub interval_s: f64,
    pub host_pid: Option<u64>,
    pub host_version: String,
    /// The host's pid changed since the previous snapshot: its counters
    /// started over, and this refresh counts from zero.
    pub host_restarted: bool,
    pub truncated: bool,
    pub devices: Vec<DeviceView>,
    pub users: Vec<UserSnap>,
}

/// The rates between two snapshots `secs` apart. A queue is the same one
/// only on the same device with the same id and owner pid; a new queue (or
/// every queue of a restarted host) counts from zero.
pub fn compute(prev: &Snapshot, cur: &Snapshot, secs: f64, time_unix_ms: u64) -> View {
    let restarted = prev.host_pid.is_some() && prev.host_pid != cur.host_pid;
    let devices = cur
        .devices
        .iter()
        .map(|d| {
            let pd = prev
                .devices
                .iter()
                .find(|p| p.index == d.index)
                .filter(|_| !restarted);
            let queues: Vec<QueueView> = d
                .queues
                .iter()
                .map(|q| {
                    let pq =
                        pd.and_then(|pd| pd.queues.iter().find(|p| p.id == q.id && p.pid == q.pid));
                    let dr = delta(pq.map(|p| p.requests), q.requests);
                    let db = delta(pq.map(|p| p.bytes), q.bytes);
                    QueueView {
                        id: q.id,
                        pid: q.pid,
                        uid: q.uid,
                        alg: q.alg.clone(),
                        state: q.state.clone(),
                        in_flight: q.in_flight,
                        requests: q.requests,
                        requests_per_s: per_sec(dr, secs),
                        bytes: q.bytes,
                        bytes_per_s: per_sec(db, secs),
                        faults: q.faults,
                        faults_delta: delta(pq.map(|p| p.faults), q.faults),
                        fallbacks: q.fallbacks,
                        fallbacks_delta: delta(pq.map(|p| p.fallbacks), q.fallbacks),
                        // A histogram the client stopped adding to is
                        // not the interval's.
                        p99_latency_us: q.p99_ns.filter(|_| dr > 0).map(|ns| match ns {
                            u64::MAX => OPEN_BUCKET_US,
                            _ => ns as f64 / 1e3,
                        }),
                    }
                })
                .collect();
            let rate = |f: fn(&DeviceSnap) -> u64| per_sec(delta(pd.map(f), f(d)), secs);
            let opt_rate = |f: fn(&DeviceSnap) -> Option<u64>| {
                f(d).map(|c| per_sec(delta(pd.and_then(f), c), secs))
            };
            DeviceView {
                name: format!("dev{}", d.index),
                driver: d.driver.clone(),
                engines: d.engines,
                engines_awake: d.engines.saturating_sub(d.engines_sleeping),
                engines_sleeping: d.engines_sleeping.min(d.engines),
                sleeps_per_s: rate(|d| d.engine_sleeps),
                wakeups_per_s: rate(|d| d.engine_wakeups),
                queues_hidden: d.hidden_queues,
                // Folded from +0.0: an empty f64 `sum()` is -0.0, which
                // JSON would carry as "-0.0".
                requests_per_s: queues.iter().fold(0.0, |a, q| a + q.requests_per_s),
                bytes_per_s: queues.iter().fold(0.0, |a, q| a + q.bytes_per_s),
                faults: total(queues.iter().map(|q| q.faults)),
                faults_delta: total(queues.iter().map(|q| q.faults_delta)),
                fallbacks: total(queues.iter().map(|q| q.fallbacks)),
                fallbacks_delta: total(queues.iter().map(|q| q.fallbacks_delta)),
                nvme_commands_per_s: opt_rate(|d| d.nvme_commands),
                nvme_bytes_per_s: opt_rate(|d| d.nvme_bytes),
                queues,
            }
        })
        .collect();
    View {
        time_unix_ms,
        interval_s: secs,
        host_pid: cur.host_pid,
        host_version: cur.version.clone(),
        host_restarted: restarted,
        truncated: cur.truncated,
        devices,
        users: cur.users.clone(),
    }
}

/// A count per second for a narrow column: "0", "12.5", "3.40k", "1.20M".
fn short_rate(v: f64) -> String {
    if v >= 1e9 {
        format!("{:.2}G", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.2}k", v / 1e3)
    } else if v == 0.0 {
        "0".into()
    } else {
        format!("{v:.1}")
    }
}

fn bytes_rate(v: f64) -> String {
    format!("{}/s", format_size(v as u64))
}

/// A total with the interval's increase: "3 (+1)", or "3" when unchanged.
fn total_delta(total: u64, d: u64) -> String {
    if d == 0 {
        total.to_string()
    } else {
        format!("{total} (+{d})")
    }
}

/// The table of one refresh, ready to print after the screen is cleared.
pub fn render(v: &View) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let pid = v.host_pid.map_or("?".to_string(), |p| p.to_string());
    let _ = writeln!(
        o,
        "wd top: host pid {pid}, version {}, interval {:.2} s{}",
        v.host_version,
        v.interval_s,
        if v.host_restarted {
            " (host restarted: counting from zero)"
        } else {
            ""
        }
    );
    let _ = writeln!(
        o,
        "\n{:<6} {:<8} {:>7} {:>6} {:>6} {:>9} {:>9} {:>7} {:>9} {:>12} {:>10} {:>10}",
        "DEV",
        "DRIVER",
        "ENGINES",
        "AWAKE",
        "ASLEEP",
        "SLEEPS/s",
        "WAKES/s",
        "QUEUES",
        "REQ/s",
        "BYTES/s",
        "FAULTS",
        "FALLBACKS"
    );
    for d in &v.devices {
        let queues = if d.queues_hidden > 0 {
            format!("{}+{}", d.queues.len(), d.queues_hidden)
        } else {
            d.queues.len().to_string()
        };
        let _ = writeln!(
            o,
            "{:<6} {:<8} {:>7} {:>6} {:>6} {:>9} {:>9} {:>7} {:>9} {:>12} {:>10} {:>10}",
            d.name,
            d.driver,
            d.engines,
            d.engines_awake,
            d.engines_sleeping,
            short_rate(d.sleeps_per_s),
            short_rate(d.wakeups_per_s),
            queues,
            short_rate(d.requests_per_s),
            bytes_rate(d.bytes_per_s),
            total_delta(d.faults, d.faults_delta),
            total_delta(d.fallbacks, d.fallbacks_delta),
        );
        if let (Some(c), Some(b)) = (d.nvme_commands_per_s, d.nvme_bytes_per_s) {
            let _ = writeln!(
                o,
                "       nvme: {} commands/s, {} (all queues)",
                short_rate(c),
                bytes_rate(b)
            );
        }
    }
    if v.devices.iter().any(|d| d.queues_hidden > 0) {
        let _ = writeln!(o, "(QUEUES: yours+other users' not shown)");
    }
    let any_queue = v.devices.iter().any(|d| !d.queues.is_empty());
    if any_queue {
        let _ = writeln!(
            o,
            "\n{:<6} {:<6} {:>8} {:>6} {:<10} {:<8} {:>6} {:>9} {:>12} {:>10} {:>10} {:>5}",
            "QUEUE",
            "DEV",
            "PID",
            "UID",
            "ALG",
            "STATE",
            "INFL",
            "REQ/s",
            "BYTES/s",
            "FAULTS",
            "FALLBACKS",
            "P99"
        );
    }
    // Grouped by client within each device: a process's queues together.
    for d in &v.devices {
        let mut qs: Vec<&QueueView> = d.queues.iter().collect();
        qs.sort_by_key(|q| (q.pid, q.id));
        for q in qs {
            let _ = writeln!(
                o,
                "{:<6} {:<6} {:>8} {:>6} {:<10} {:<8} {:>6} {:>9} {:>12} {:>10} {:>10} {:>5}",
                format!("q{}", q.id),
                d.name,
                q.pid,
                q.uid,
                q.alg,
                q.state,
                q.in_flight,
                short_rate(q.requests_per_s),
                bytes_rate(q.bytes_per_s),
                total_delta(q.faults, q.faults_delta),
                total_delta(q.fallbacks, q.fallbacks_delta),
                q.p99_latency_us.map_or("-".to_string(), latency_text),
            );
        }
    }
    if !v.users.is_empty() {
        let _ = writeln!(o);
        for u in &v.users {
            let _ = writeln!(
                o,
                "uid {}: {} connection(s), {} queue(s), {} mapped",
                u.uid,
                u.connections,
                u.queues,
                format_size(u.mapped_bytes)
            );
        }
    }
    if v.truncated {
        let _ = writeln!(
            o,
            "(the host's attribute list hit its size limit: some queues are missing)"
        );
    }
    o
}

/// Why `wd top` stopped early.
#[derive(Debug, thiserror::Error)]
pub enum TopError {
    #[error("cannot reach the host: {0}")]
    Connect(wrapdrive::ClientError),
    #[error("lost the connection to the host: {0}")]
    Gone(wrapdrive::ClientError),
    #[error("cannot watch for SIGINT/SIGTERM: {0}")]
    Signals(String),
}

/// Clears and homes the terminal before each table, and hides the cursor
/// meanwhile; dropping it (a normal end, an error, SIGINT through the
/// main loop) shows the cursor again.
struct Screen {
    tty: bool,
}

impl Screen {
    fn new(tty: bool) -> Screen {
        if tty {
            let _ = write_out("\x1b[?25l");
        }
        Screen { tty }
    }

    fn frame(&self, body: &str, first: bool) -> std::io::Result<()> {
        if self.tty {
            write_out(&format!("\x1b[H\x1b[2J{body}"))
        } else if first {
            write_out(body)
        } else {
            write_out(&format!("\n{body}"))
        }
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        if self.tty {
            let _ = write_out("\x1b[?25h");
        }
    }
}

/// Unlike `report::emit`, the error matters here: a closed stdout ends
/// the loop instead of refreshing into nothing forever.
fn write_out(s: &str) -> std::io::Result<()> {
    let mut o = std::io::stdout().lock();
    o.write_all(s.as_bytes())?;
    o.flush()
}

/// On a terminal, SIGINT and SIGTERM are taken by a thread and reported
/// through a channel, so the main loop ends normally and the cursor comes
/// back; elsewhere nothing on screen needs restoring and they kill as
/// usual. Called before connecting, as every later thread inherits the
/// blocked signals.
fn watch_signals(tty: bool) -> Result<Option<Receiver<i32>>, TopError> {
    if !tty {
        return Ok(None);
    }
    wd_sys::block_termination_signals().map_err(|e| TopError::Signals(e.to_string()))?;
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("wd-top-signals".into())
        .spawn(move || {
            let _ = tx.send(wd_sys::wait_termination());
        })
        .map_err(|e| TopError::Signals(e.to_string()))?;
    Ok(Some(rx))
}

/// Waits `d`; false when a signal asked to stop.
fn pause(d: Duration, signals: &Option<Receiver<i32>>) -> bool {
    match signals {
        Some(rx) => matches!(rx.recv_timeout(d), Err(RecvTimeoutError::Timeout)),
        None => {
            std::thread::sleep(d);
            true
        }
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Run `wd top` until its iterations are done, stdout closes or a signal
/// arrives (all a normal end), or the host goes away (an error).
pub fn run(args: TopArgs, host: &Option<String>) -> Result<(), TopError> {
    let tty = !args.json && std::io::stdout().is_terminal();
    let signals = watch_signals(tty)?;
    let conn = crate::connect(host).map_err(TopError::Connect)?;
    let snap = || conn.attrs("").map(|e| Snapshot::parse(&e));
    let limit = args.iterations.or(args.json.then_some(1));
    let interval = Duration::from_secs_f64(args.interval);
    let screen = Screen::new(tty);
    let mut prev = snap().map_err(TopError::Gone)?;
    let mut taken = Instant::now();
    let mut done = 0u64;
    while limit.is_none_or(|n| done < n) {
        if !pause(interval.saturating_sub(taken.elapsed()), &signals) {
            break;
        }
        let cur = snap().map_err(TopError::Gone)?;
        let now = Instant::now();
        let view = compute(&prev, &cur, (now - taken).as_secs_f64(), unix_ms());
        let out = if args.json {
            screen_json(&view)
        } else {
            screen.frame(&render(&view), done == 0)
        };
        if out.is_err() {
            // stdout closed (`wd top --json | head -1`): nobody is reading.
            break;
        }
        prev = cur;
        taken = now;
        done += 1;
    }
    Ok(())
}

fn screen_json(v: &View) -> std::io::Result<()> {
    write_out(&format!(
        "{}\n",
        serde_json::to_string(v).expect("a view serializes")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(pairs: &[(&str, &str)]) -> Vec<AttrEntry> {
        pairs
            .iter()
            .map(|(p, v)| AttrEntry {
                path: p.to_string(),
                value: v.to_string(),
                writable: false,
            })
            .collect()
    }

    fn host(pid: &str, requests: &str, bytes: &str, faults: &str, sleeps: &str) -> Vec<AttrEntry> {
        tree(&[
            ("host/pid", pid),
            ("host/version", "0.1.0"),
            ("host/users/1000/connections", "2"),
            ("host/users/1000/queues", "1"),
            ("host/users/1000/mapped_bytes", "8192"),
            ("dev0/driver", "dummy"),
            ("dev0/engines", "2"),
            ("dev0/engines_sleeping", "1"),
            ("dev0/engine_sleeps", sleeps),
            ("dev0/engine_wakeups", "4"),
            ("dev0/priority", "0"),
            ("dev0/queues/others", "3"),
            ("dev0/queues/q7/pid", "4242"),
            ("dev0/queues/q7/uid", "1000"),
            ("dev0/queues/q7/alg", "memcpy"),
            ("dev0/queues/q7/state", "active"),
            ("dev0/queues/q7/in_flight", "5"),
            ("dev0/queues/q7/requests", requests),
            ("dev0/queues/q7/bytes", bytes),
            ("dev0/queues/q7/faults", faults),
            ("dev0/queues/q7/iommu/faults_seen", "99"),
            ("dev0/queues/q7/client/cpu_requests", "6"),
            ("dev10/driver", "nvme"),
            ("dev10/engines", "1"),
            ("dev10/engines_sleeping", "0"),
            ("dev10/nvme/commands", "100"),
            ("dev10/nvme/bytes", "409600"),
            ("dev2/driver", "sec"),
            ("devX/driver", "ignored"),
            ("dev0/queues/qX/pid", "1"),
        ])
    }

    #[test]
    fn totals_stop_at_the_top() {
        assert_eq!(total([u64::MAX - 1, 5, 7].into_iter()), u64::MAX);
        assert_eq!(total([1, 2].into_iter()), 3);
    }

    #[test]
    fn parse_types_the_tree() {
        let s = Snapshot::parse(&host("10", "1000", "4096000", "1", "3"));
        assert_eq!(s.host_pid, Some(10));
        assert_eq!(s.version, "0.1.0");
        assert!(!s.truncated);
        // Numeric order, not the tree's text order; a malformed name is skipped.
        let idx: Vec<_> = s.devices.iter().map(|d| d.index).collect();
        assert_eq!(idx, [0, 2, 10]);
        let d = &s.devices[0];
        assert_eq!(
            (
                d.engines,
                d.engines_sleeping,
                d.engine_sleeps,
                d.engine_wakeups
            ),
            (2, 1, 3, 4)
        );
        assert_eq!(d.hidden_queues, 3);
        assert_eq!(d.nvme_commands, None);
        assert_eq!(
            d.queues,
            [QueueSnap {
                id: 7,
                pid: 4242,
                uid: 1000,
                alg: "memcpy".into(),
                state: "active".into(),
                in_flight: 5,
                requests: 1000,
                bytes: 4_096_000,
                faults: 1,
                fallbacks: 6,
                p99_ns: None,
            }]
        );
        assert_eq!(s.devices[2].nvme_commands, Some(100));
        assert_eq!(
            s.users,
            [UserSnap {
                uid: 1000,
                connections: 2,
                queues: 1,
                mapped_bytes: 8192
            }]
        );
    }

    #[test]
    fn rates_between_two_snapshots() {
        let a = Snapshot::parse(&host("10", "1000", "4096000", "1", "3"));
        let b = Snapshot::parse(&host("10", "3000", "12288000", "4", "7"));
        let v = compute(&a, &b, 2.0, 0);
        assert!(!v.host_restarted);
        let d = &v.devices[0];
        let q = &d.queues[0];
        assert_eq!(q.requests_per_s, 1000.0);
        assert_eq!(q.bytes_per_s, 4_096_000.0);
        assert_eq!((q.faults, q.faults_delta), (4, 3));
        assert_eq!((q.fallbacks, q.fallbacks_delta), (6, 0));
        assert_eq!(q.p99_latency_us, None);
        assert_eq!(d.requests_per_s, 1000.0);
        assert_eq!((d.engines_awake, d.engines_sleeping), (1, 1));
        assert_eq!((d.sleeps_per_s, d.wakeups_per_s), (2.0, 0.0));
        assert_eq!(v.devices[2].nvme_commands_per_s, Some(0.0));
        assert_eq!(v.devices[0].nvme_commands_per_s, None);
    }

    #[test]
    fn a_counter_that_went_backwards_counts_from_zero() {
        assert_eq!(delta(Some(10), 15), 5);
        assert_eq!(delta(Some(u64::MAX), 3), 3);
        assert_eq!(delta(None, 3), 3);
        // Same pid (the counter alone went back): no wrap-around to 2^64.
        let a = Snapshot::parse(&host("10", "5000", "9000000", "9", "50"));
        let b = Snapshot::parse(&host("10", "100", "4096", "0", "2"));
        let v = compute(&a, &b, 1.0, 0);
        let q = &v.devices[0].queues[0];
        assert_eq!(q.requests_per_s, 100.0);
        assert_eq!(q.bytes_per_s, 4096.0);
        assert_eq!(q.faults_delta, 0);
        assert_eq!(v.devices[0].sleeps_per_s, 2.0);
        // A restarted host: everything counts from zero, even counters that
        // happen to be higher than the old host's.
        let c = Snapshot::parse(&host("11", "6000", "9000000", "9", "60"));
        let v = compute(&a, &c, 1.0, 0);
        assert!(v.host_restarted);
        assert_eq!(v.devices[0].queues[0].requests_per_s, 6000.0);
        assert_eq!(v.devices[0].sleeps_per_s, 60.0);
        assert!(render(&v).contains("host restarted"));
    }

    #[test]
    fn a_queue_id_reused_by_another_process_is_a_new_queue() {
        let a = Snapshot::parse(&host("10", "5000", "0", "0", "0"));
        let mut b = Snapshot::parse(&host("10", "6000", "0", "0", "0"));
        b.devices[0].queues[0].pid = 777;
        let v = compute(&a, &b, 1.0, 0);
        assert_eq!(v.devices[0].queues[0].requests_per_s, 6000.0);
        // No interval measured (cannot happen in `run`): no division by zero.
        let v = compute(&a, &a, 0.0, 0);
        assert_eq!(v.devices[0].requests_per_s, 0.0);
    }

    #[test]
    fn p99_is_the_clients_and_only_for_a_busy_queue() {
        let with_p99 = |requests: &str, p99: &str| {
            let mut t = host("10", requests, "0", "0", "0");
            t.extend(tree(&[("dev0/queues/q7/client/latency_p99_ns", p99)]));
            Snapshot::parse(&t)
        };
        let a = with_p99("1000", "1535");
        assert_eq!(a.devices[0].queues[0].p99_ns, Some(1535));
        let busy = compute(&a, &with_p99("2000", "98303"), 1.0, 0);
        assert_eq!(busy.devices[0].queues[0].p99_latency_us, Some(98.303));
        let t = render(&busy);
        let q = t.lines().find(|l| l.starts_with("q7 ")).unwrap();
        assert!(q.trim_end().ends_with("98us"), "{q}");
        // Idle: the histogram is old news.
        let idle = compute(&a, &with_p99("1000", "1535"), 1.0, 0);
        assert_eq!(idle.devices[0].queues[0].p99_latency_us, None);
        let inf = compute(&a, &with_p99("2000", "inf"), 1.0, 0);
        let t = render(&inf);
        assert!(
            t.lines()
                .any(|l| l.starts_with("q7 ") && l.trim_end().ends_with(">7.5s")),
            "{t}"
        );
        // Garbage from a client is no figure.
        assert_eq!(with_p99("1", "soon").devices[0].queues[0].p99_ns, None);
        assert_eq!(latency_text(1.26), "1.3us");
        assert_eq!(latency_text(2500.0), "2.5ms");
        assert_eq!(latency_text(25_000.0), "25ms");
        assert_eq!(latency_text(9.96), "10us");
        assert_eq!(latency_text(999.6), "1.0ms");
        assert_eq!(latency_text(9_960.0), "10ms");
        assert_eq!(latency_text(999_950.0), "1.0s");
    }

    #[test]
    fn render_shows_devices_queues_and_no_invented_latency() {
        let a = Snapshot::parse(&host("10", "1000", "0", "1", "3"));
        let b = Snapshot::parse(&host("10", "3000", "2097152", "4", "7"));
        let t = render(&compute(&a, &b, 1.0, 0));
        assert!(t.contains("host pid 10"), "{t}");
        let dev0 = t.lines().find(|l| l.starts_with("dev0 ")).unwrap();
        assert!(dev0.contains("dummy"), "{dev0}");
        assert!(dev0.contains("2.00k"), "{dev0}");
        assert!(dev0.contains("2.00 MiB/s"), "{dev0}");
        assert!(dev0.contains("1+3"), "{dev0}");
        assert!(dev0.contains("4 (+3)"), "{dev0}");
        let q = t.lines().find(|l| l.starts_with("q7 ")).unwrap();
        assert!(q.contains("4242") && q.contains("memcpy"), "{q}");
        assert!(q.trim_end().ends_with('-'), "{q}");
        assert!(t.contains("nvme: 0 commands/s"), "{t}");
        assert!(t.contains("uid 1000: 2 connection(s)"), "{t}");
        // No queues: no queue header.
        let empty = render(&compute(&Snapshot::default(), &Snapshot::default(), 1.0, 0));
        assert!(!empty.contains("ALG"), "{empty}");
    }

    #[test]
    fn json_is_one_line_with_the_rates() {
        let a = Snapshot::parse(&host("10", "0", "0", "0", "0"));
        let b = Snapshot::parse(&host("10", "10", "0", "0", "0"));
        let line = serde_json::to_string(&compute(&a, &b, 1.0, 5)).unwrap();
        assert!(!line.contains('\n'));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["time_unix_ms"], 5);
        assert_eq!(v["devices"][0]["name"], "dev0");
        assert_eq!(v["devices"][0]["requests_per_s"], 10.0);
        assert_eq!(
            v["devices"][0]["queues"][0]["p99_latency_us"],
            serde_json::Value::Null
        );
        assert!(v["devices"][0].get("nvme_commands_per_s").is_none());
        // A device without visible queues: 0.0, not -0.0.
        assert_eq!(v["devices"][1]["requests_per_s"].to_string(), "0.0");
    }

    #[test]
    fn interval_bounds() {
        assert_eq!(parse_interval("0.2"), Ok(0.2));
        for bad in ["0", "0.01", "-1", "nan", "inf", "x", "100000"] {
            assert!(parse_interval(bad).is_err(), "{bad}");
        }
    }
}
