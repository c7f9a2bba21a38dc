//! `wd chaos`: client processes of every kind (dummy copies through each
//! memory model, sec cipher sessions, NVMe controllers, zip batches and
//! streams) killed with
//! SIGKILL at random moments, and the host itself killed and restarted
//! under load; after every round, the host's own tables and descriptor
//! count must be back where they started and every surviving client must
//! have seen correct data. `--soak` holds the mixed load instead and
//! samples the host's memory, descriptors and the clients' latency.
//!
//! The command runs its own host (it kills it), from this same binary.

pub mod client;
mod ledger;

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::report::{emit, median, print_json, Progress};
use client::{Rng, EXIT_BUSY, EXIT_DATA, EXIT_HOST_GONE, EXIT_OK, KINDS, NAMESPACES};
use ledger::Ledger;

/// Namespace size on the chaos host's store.
const NS_BYTES: u64 = 16 << 20;
/// How long a stopped client may take to finish its request and exit.
const EXIT_GRACE: Duration = Duration::from_secs(15);
/// How long the host may take to tear down what dead clients held.
const SETTLE: Duration = Duration::from_secs(5);

/// Options of `wd chaos`.
#[derive(clap::Args, Debug)]
pub struct ChaosArgs {
    /// Client processes per round (with --soak: held all along).
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Rounds: start clients, kill some at random moments, stop the
    /// rest, check the host's tables (at least 1: a run of none would
    /// pass having checked nothing).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Length of a round in milliseconds.
    #[arg(long, default_value_t = 400)]
    round_ms: u64,
    /// Percent chance that a client is killed (SIGKILL) at a random moment
    /// of its round.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(0..=100))]
    kill_percent: u32,
    /// Kill the host (SIGKILL) and restart it under load every N rounds
    /// (0: never).
    #[arg(long, default_value_t = 5)]
    host_kill_every: u32,
    /// Seed of every random choice (default: from the clock; printed, so a
    /// failing run can be repeated).
    #[arg(long)]
    seed: Option<u64>,
    /// Client kinds to mix, comma-separated (default: all of copy-shared,
    /// copy-heap, copy-share-all, cipher, nvme, zip).
    #[arg(long, value_delimiter = ',')]
    kinds: Vec<String>,
    /// Soak instead of rounds: hold the mixed load this long (e.g. 30s,
    /// 2m, 1h), sampling the host every --interval.
    #[arg(long, value_parser = duration_arg)]
    soak: Option<Duration>,
    /// Seconds between two soak samples.
    #[arg(long, default_value_t = 5.0, value_parser = crate::units::seconds_arg)]
    interval: f64,
    /// With --soak: kill the host (SIGKILL) and restart it every this many
    /// seconds (0: never). Clients must carry on through every restart
    /// (the client library reconnects); only the documented unsafe
    /// requests may fail.
    #[arg(long, default_value_t = 0.0, value_parser = crate::units::seconds_or_never_arg)]
    host_restart_every: f64,
    /// Keep the working directory (host and client logs, the NVMe store).
    #[arg(long)]
    keep: bool,
    /// Machine-readable summary.
    #[arg(long)]
    json: bool,
}

/// "90", "30s", "2m", "1h": a duration on the command line.
pub fn duration_arg(s: &str) -> Result<Duration, String> {
    let (digits, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map_or((s, ""), |i| s.split_at(i));
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("'{s}' is not a duration (e.g. 90, 30s, 2m, 1h)"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n.saturating_mul(60),
        "h" => n.saturating_mul(3600),
        _ => return Err(format!("'{s}' is not a duration (e.g. 90, 30s, 2m, 1h)")),
    };
    // A soak of nothing would pass having checked nothing.
    if secs == 0 {
        return Err(format!("'{s}': a soak needs at least a second"));
    }
    Ok(Duration::from_secs(secs))
}

/// The host under test: a `wd serve` child on a socket in the work
/// directory.
struct HostProc {
    child: Child,
    socket: String,
    dir: PathBuf,
    /// Descriptors the host held at its first clean reading.
    fds: Option<usize>,
}

impl HostProc {
    fn start(dir: &Path) -> Result<HostProc, String> {
        let socket = dir.join("wd.sock");
        let store = dir.join("store");
        // A socket file left by a killed host is not in anyone's way.
        let _ = std::fs::remove_file(&socket);
        let ns: Vec<String> = (0..NAMESPACES)
            .map(|i| format!("ns={}:{}:{NS_BYTES}", store.display(), i as u64 * NS_BYTES))
            .collect();
        let log = File::options()
            .create(true)
            .append(true)
            .open(dir.join("host.log"))
            .map_err(|e| format!("host log: {e}"))?;
        let child = Command::new(std::env::current_exe().map_err(|e| e.to_string())?)
            .arg("serve")
            .arg("--socket")
            .arg(&socket)
            .args(["--device", "dummy:engines=1", "--device", "sec:engines=1"])
            .arg("--device")
            .arg(format!("nvme:{}", ns.join(",")))
            .args(["--device", "zip:engines=1"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting the host: {e}"))?;
        crate::temp::stop_on_signal(child.id());
        let mut h = HostProc {
            child,
            socket: socket.display().to_string(),
            dir: dir.to_path_buf(),
            fds: None,
        };
        let t = Instant::now();
        loop {
            if wrapdrive::HostConn::connect(&h.socket).is_ok() {
                return Ok(h);
            }
            if let Some(st) = h.exited() {
                return Err(format!("the host exited at start ({st}): see {}", h.log()));
            }
            if t.elapsed() > Duration::from_secs(10) {
                h.kill();
                return Err(format!("the host did not come up in 10 s: see {}", h.log()));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn log(&self) -> String {
        self.dir.join("host.log").display().to_string()
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// How the host ended, if it has (then its pid is free for another
    /// process: the signal thread forgets it).
    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        let st = self.child.try_wait().ok().flatten()?;
        crate::temp::forget_pid(self.child.id());
        Some(st)
    }

    fn kill(&mut self) {
        crate::temp::forget_pid(self.child.id());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The ledger now (an attribute listing and the descriptor count, read
    /// while this reading's connection is open, so it counts alike every
    /// time).
    fn reading(&self) -> Result<Ledger, String> {
        let conn = wrapdrive::HostConn::connect(&self.socket).map_err(|e| e.to_string())?;
        let attrs = conn.attrs("").map_err(|e| e.to_string())?;
        let fds = std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map_err(|e| format!("host descriptors: {e}"))?
            .count();
        Ok(ledger::ledger(
            attrs.iter().map(|a| (a.path.as_str(), a.value.as_str())),
            fds,
        ))
    }

    /// The reading every later one is compared with: taken once the host
    /// holds only this reading's connection (the start-up probe's may not
    /// be torn down yet), descriptors included.
    fn baseline(&mut self) -> Result<Ledger, String> {
        let t = Instant::now();
        loop {
            let l = self.reading()?;
            let conns: u64 = l
                .iter()
                .filter(|(k, _)| k.ends_with("/connections"))
                .filter_map(|(_, v)| v.parse::<u64>().ok())
                .sum();
            if conns <= 1 || t.elapsed() > SETTLE {
                self.fds = l.get("host/fds").and_then(|v| v.parse().ok());
                return Ok(l);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Wait until the host holds what `base` says (descriptors: what this
    /// host held at its first clean reading); the differences left after
    /// [`SETTLE`].
    fn settle(&mut self, base: &Ledger) -> Result<Vec<String>, String> {
        let t = Instant::now();
        loop {
            let mut now = self.reading()?;
            let fds = now.remove("host/fds").unwrap_or_default();
            let mut l = ledger::leaks(&strip_fds(base), &now);
            // A restarted host's descriptors are known from its first
            // reading that is clean otherwise (dead clients' connections
            // may still be closing before that).
            if self.fds.is_none() && l.is_empty() {
                self.fds = fds.parse().ok();
            }
            match self.fds {
                Some(first) if fds != first.to_string() => {
                    l.push(format!("host/fds: was {first}, now {fds}"))
                }
                Some(_) => {}
                None => l.push(format!("host/fds: no clean reading yet (now {fds})")),
            }
            if l.is_empty() || t.elapsed() > SETTLE {
                return Ok(l);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Host memory (VmRSS, bytes) and threads, from /proc.
    fn rss_threads(&self) -> (u64, u64) {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        let field = |name: &str| {
            s.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .unwrap_or(0)
        };
        (field("VmRSS:") * 1024, field("Threads:"))
    }

    fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid())).map_or(0, |d| d.count())
    }
}

impl Drop for HostProc {
    fn drop(&mut self) {
        self.kill();
    }
}

fn strip_fds(l: &Ledger) -> Ledger {
    let mut l = l.clone();
    l.remove("host/fds");
    l
}

/// A line a client printed.
enum Said {
    Ready,
    Stat {
        ops: u64,
        p50: u64,
        p99: u64,
    },
    Done {
        ops: u64,
        faults: u64,
        restarts: u64,
        rebuilt: u64,
    },
}

/// A running chaos client.
struct ClientProc {
    kind: &'static str,
    seed: u64,
    child: Child,
    stdin: Option<ChildStdin>,
    /// When this round kills it.
    kill_at: Option<Duration>,
    killed: bool,
    log: PathBuf,
}

impl ClientProc {
    fn start(
        kind: &'static str,
        seed: u64,
        index: usize,
        host: &HostProc,
        tx: &mpsc::Sender<(usize, Said)>,
    ) -> Result<ClientProc, String> {
        let log = host.dir.join(format!("client-{index}.log"));
        let err = File::options()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| e.to_string())?;
        let mut cmd = Command::new(std::env::current_exe().map_err(|e| e.to_string())?);
        if std::env::var_os("WD_RECONNECT_MS").is_none() {
            // The run checks that clients carry on through restarts, not
            // how fast a host comes back: on a loaded machine (the soak's
            // restarts every second, two cores), a restart took longer
            // than the default window of a second, and a client gave up.
            cmd.env("WD_RECONNECT_MS", "10000");
        }
        let mut child = cmd
            .args(["chaos-client", "--kind", kind, "--seed", &seed.to_string()])
            .env("WD_HOST", &host.socket)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .map_err(|e| format!("starting a client: {e}"))?;
        let out = child.stdout.take().expect("piped");
        let tx = tx.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let w: Vec<&str> = l.split_whitespace().collect();
                let num = |i: usize| w.get(i).and_then(|v| v.parse().ok()).unwrap_or(0);
                let said = match w.first() {
                    Some(&"ready") => Said::Ready,
                    Some(&"stat") => Said::Stat {
                        ops: num(1),
                        p50: num(2),
                        p99: num(3),
                    },
                    Some(&"done") => Said::Done {
                        ops: num(1),
                        faults: num(2),
                        restarts: num(4),
                        rebuilt: num(5),
                    },
                    _ => continue,
                };
                if tx.send((index, said)).is_err() {
                    break;
                }
            }
        });
        Ok(ClientProc {
            kind,
            seed,
            stdin: child.stdin.take(),
            child,
            kill_at: None,
            killed: false,
            log,
        })
    }

    /// Close its standard input (the order to stop) and wait for it.
    fn stop(&mut self) -> Option<std::process::ExitStatus> {
        self.stdin = None;
        let t = Instant::now();
        loop {
            match self.child.try_wait() {
                Ok(Some(st)) => return Some(st),
                Ok(None) if t.elapsed() < EXIT_GRACE => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return None;
                }
            }
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.killed = true;
    }

    fn tail(&self) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        s.lines().last().unwrap_or("").to_string()
    }
}

/// Figures of a chaos run.
#[derive(Debug, Default, Serialize)]
struct Tally {
    seed: u64,
    rounds: u32,
    clients_started: u64,
    clients_killed: u64,
    clients_clean: u64,
    clients_host_gone: u64,
    clients_busy: u64,
    host_kills: u64,
    requests_checked: u64,
    faults_checked: u64,
    /// Requests in flight at a host kill that failed (documented unsafe
    /// cases: a cipher stream, an NVMe command); the clients carried on.
    requests_lost_to_restarts: u64,
    /// Compression streams whose host restarted under them, rebuilt from
    /// their journal (each then checked like any other).
    streams_rebuilt: u64,
    leak_checks: u64,
    failures: Vec<String>,
}

/// Run `wd chaos`.
pub fn run(args: ChaosArgs) -> Result<(), String> {
    let kinds: Vec<&'static str> = if args.kinds.is_empty() {
        KINDS.to_vec()
    } else {
        args.kinds
            .iter()
            .map(|k| {
                KINDS
                    .iter()
                    .copied()
                    .find(|x| x == k)
                    .ok_or_else(|| format!("unknown kind '{k}' (known: {})", KINDS.join(", ")))
            })
            .collect::<Result<_, _>>()?
    };
    if args.clients == 0 || args.round_ms == 0 || !(0.1..=3600.0).contains(&args.interval) {
        return Err("need --clients >= 1, --round-ms >= 1 and --interval in 0.1..3600".into());
    }
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let dir = std::env::temp_dir().join(format!("wd-chaos-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let store = File::create(dir.join("store")).map_err(|e| format!("store: {e}"))?;
    store
        .set_len(NAMESPACES as u64 * NS_BYTES)
        .map_err(|e| format!("store: {e}"))?;
    drop(store);
    if !args.json {
        eprintln!(
            "wd chaos: seed {seed}, work directory {}{}",
            dir.display(),
            if args.keep {
                ""
            } else {
                " (removed at the end)"
            }
        );
    }
    if !args.keep {
        crate::temp::remove_on_signal(&dir);
    }
    let r = match args.soak {
        Some(d) => soak(&args, &kinds, seed, &dir, d),
        None => rounds(&args, &kinds, seed, &dir),
    };
    crate::temp::forget_path(&dir);
    if !args.keep && r.is_ok() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    r
}

fn rounds(args: &ChaosArgs, kinds: &[&'static str], seed: u64, dir: &Path) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let mut host = HostProc::start(dir)?;
    let base = host.baseline()?;
    let mut t = Tally {
        seed,
        ..Tally::default()
    };
    let mut progress = Progress::new(args.rounds as usize);
    let round = Duration::from_millis(args.round_ms);
    for r in 1..=args.rounds {
        t.rounds = r;
        let (tx, rx) = mpsc::channel();
        let mut clients = Vec::new();
        for i in 0..args.clients {
            let kind = kinds[rng.range(0, kinds.len() as u64 - 1) as usize];
            let mut c = ClientProc::start(kind, rng.next(), i, &host, &tx)?;
            if rng.range(1, 100) <= args.kill_percent as u64 {
                c.kill_at = Some(Duration::from_micros(
                    rng.range(0, round.as_micros() as u64),
                ));
            }
            clients.push(c);
            t.clients_started += 1;
        }
        let mut host_kill_at = (args.host_kill_every > 0 && r % args.host_kill_every == 0)
            .then(|| Duration::from_micros(rng.range(0, round.as_micros() as u64)));
        let host_killed = host_kill_at.is_some();
        let start = Instant::now();
        while start.elapsed() < round {
            let now = start.elapsed();
            for c in clients.iter_mut().filter(|c| !c.killed) {
                if c.kill_at.is_some_and(|k| k <= now) {
                    c.kill();
                    t.clients_killed += 1;
                }
            }
            if host_kill_at.is_some_and(|k| k <= now) {
                host_kill_at = None;
                host.kill();
                t.host_kills += 1;
                host = HostProc::start(dir)?;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        if let Some(st) = host.exited() {
            t.failures.push(format!(
                "round {r}: the host died ({st}): see {}",
                host.log()
            ));
            break;
        }
        for c in clients.iter_mut().filter(|c| !c.killed) {
            let st = c.stop();
            let what = format!("round {r}: client {} (seed {})", c.kind, c.seed);
            match st.and_then(|s| s.code()) {
                Some(c) if c == EXIT_OK as i32 => t.clients_clean += 1,
                Some(c) if c == EXIT_BUSY as i32 => t.clients_busy += 1,
                Some(code) if code == EXIT_HOST_GONE as i32 && host_killed => {
                    t.clients_host_gone += 1
                }
                Some(code) if code == EXIT_DATA as i32 => {
                    t.failures.push(format!("{what}: {}", c.tail()))
                }
                Some(code) => t
                    .failures
                    .push(format!("{what}: exit {code}: {}", c.tail())),
                None => t.failures.push(format!(
                    "{what}: did not stop within {} s",
                    EXIT_GRACE.as_secs()
                )),
            }
        }
        drop(tx);
        for (_, said) in rx.iter() {
            if let Said::Done {
                ops,
                faults,
                restarts,
                rebuilt,
            } = said
            {
                t.requests_checked += ops;
                t.faults_checked += faults;
                t.requests_lost_to_restarts += restarts;
                t.streams_rebuilt += rebuilt;
            }
        }
        let leaks = host.settle(&base)?;
        t.leak_checks += 1;
        for l in leaks {
            t.failures.push(format!("round {r}: leak: {l}"));
        }
        progress.step(&format!("round {r}"));
        if !t.failures.is_empty() {
            break;
        }
    }
    progress.finish();
    report(args, &t)
}

fn report(args: &ChaosArgs, t: &Tally) -> Result<(), String> {
    if args.json {
        print_json(&serde_json::to_value(t).expect("serializable"));
    } else {
        emit(&format!(
            "chaos: {} round(s), seed {}\n\
             clients: {} started, {} killed (SIGKILL), {} stopped clean, {} ended by a host kill, {} found nothing free\n\
             host: {} kill(s) and restart(s) under load; {} request(s) in flight lost to them (cipher streams, NVMe commands, compression streams with no host back yet: the documented unsafe cases); {} compression stream(s) rebuilt from their journal\n\
             checked: {} requests' data, {} faults, {} leak checks (queues, shares, mapped bytes, connections, domains, sessions, namespaces, free instances, host descriptors)\n",
            t.rounds,
            t.seed,
            t.clients_started,
            t.clients_killed,
            t.clients_clean,
            t.clients_host_gone,
            t.clients_busy,
            t.host_kills,
            t.requests_lost_to_restarts,
            t.streams_rebuilt,
            t.requests_checked,
            t.faults_checked,
            t.leak_checks
        ));
        for f in &t.failures {
            emit(&format!("FAILED: {f}\n"));
        }
    }
    if t.failures.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} failure(s); repeat with --seed {} --keep",
            t.failures.len(),
            t.seed
        ))
    }
}

/// One soak sample.
#[derive(Debug, Serialize)]
struct Sample {
    secs: f64,
    rss_bytes: u64,
    fds: usize,
    threads: u64,
    requests_per_sec: f64,
    p50_us: f64,
    p99_us: f64,
}

fn soak(
    args: &ChaosArgs,
    kinds: &[&'static str],
    seed: u64,
    dir: &Path,
    length: Duration,
) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let mut host = HostProc::start(dir)?;
    let base = host.baseline()?;
    let restart_every = (args.host_restart_every > 0.0)
        .then(|| Duration::from_secs_f64(args.host_restart_every.max(0.05)));
    let mut next_restart = restart_every;
    let mut restarts = 0u64;
    let mut lost = 0u64;
    let (tx, rx) = mpsc::channel();
    let mut clients = Vec::new();
    for i in 0..args.clients {
        let kind = kinds[i % kinds.len()];
        clients.push(ClientProc::start(kind, rng.next(), i, &host, &tx)?);
    }
    let interval = Duration::from_secs_f64(args.interval);
    let start = Instant::now();
    let mut samples: Vec<Sample> = Vec::new();
    let mut failures = Vec::new();
    let (mut ops, mut p50s, mut p99s) = (0u64, Vec::new(), Vec::new());
    let mut next = interval;
    if !args.json {
        emit("   time   host RSS    fds  threads  requests/s   p50 us   p99 us (worst client)\n");
    }
    while start.elapsed() < length && failures.is_empty() {
        while let Ok((_, said)) = rx.recv_timeout(Duration::from_millis(20)) {
            match said {
                Said::Stat { ops: n, p50, p99 } => {
                    ops += n;
                    p50s.push(p50 as f64 / 1e3);
                    p99s.push(p99 as f64 / 1e3);
                }
                Said::Done { restarts: n, .. } => lost += n,
                Said::Ready => {}
            }
            if start.elapsed() >= next || next_restart.is_some_and(|r| start.elapsed() >= r) {
                break;
            }
        }
        if let Some(r) = next_restart.filter(|&r| start.elapsed() >= r) {
            host.kill();
            host = HostProc::start(dir)?;
            restarts += 1;
            next_restart = Some(r + restart_every.expect("set with next_restart"));
        }
        // A client that ended on its own is a failure (nothing kills them
        // here).
        for c in &mut clients {
            if let Ok(Some(st)) = c.child.try_wait() {
                failures.push(format!(
                    "client {} (seed {}) ended: {st}: {}",
                    c.kind,
                    c.seed,
                    c.tail()
                ));
            }
        }
        if let Some(st) = host.exited() {
            failures.push(format!("the host died ({st}): see {}", host.log()));
            break;
        }
        let now = start.elapsed();
        if now >= next {
            let (rss, threads) = host.rss_threads();
            let s = Sample {
                secs: now.as_secs_f64(),
                rss_bytes: rss,
                fds: host.fds(),
                threads,
                requests_per_sec: ops as f64 / interval.as_secs_f64(),
                p50_us: median(&p50s),
                p99_us: p99s.iter().copied().fold(0.0, f64::max),
            };
            if !args.json {
                emit(&format!(
                    "{:>6.0}s {:>8.1} MiB {:>6} {:>8} {:>11.0} {:>8.1} {:>8.1}\n",
                    s.secs,
                    s.rss_bytes as f64 / (1 << 20) as f64,
                    s.fds,
                    s.threads,
                    s.requests_per_sec,
                    s.p50_us,
                    s.p99_us
                ));
            }
            samples.push(s);
            (ops, p50s, p99s) = (0, Vec::new(), Vec::new());
            next += interval;
        }
    }
    for c in &mut clients {
        if c.child.try_wait().ok().flatten().is_none() {
            match c.stop().and_then(|s| s.code()) {
                Some(0) => {}
                code => failures.push(format!(
                    "client {} (seed {}): stop: {code:?}: {}",
                    c.kind,
                    c.seed,
                    c.tail()
                )),
            }
        }
    }
    drop(tx);
    for (_, said) in rx.iter() {
        if let Said::Done { restarts: n, .. } = said {
            lost += n;
        }
    }
    for l in host.settle(&base)? {
        failures.push(format!("after the soak: leak: {l}"));
    }
    // Flat: the host's memory at the end within 10% (and 8 MiB) of the
    // first sample after warm-up (a quarter of the run); a restarted host
    // starts over, so only one that lived all along is judged.
    let warm = samples.get(samples.len() / 4).filter(|_| restarts == 0);
    if let (Some(w), Some(last)) = (warm, samples.last()) {
        let limit = w.rss_bytes + (w.rss_bytes / 10).max(8 << 20);
        if last.rss_bytes > limit {
            failures.push(format!(
                "host memory grew: {:.1} MiB at {:.0} s, {:.1} MiB at the end",
                w.rss_bytes as f64 / (1 << 20) as f64,
                w.secs,
                last.rss_bytes as f64 / (1 << 20) as f64
            ));
        }
    }
    if args.json {
        print_json(&serde_json::json!({
            "seed": seed,
            "seconds": length.as_secs_f64(),
            "host_restarts": restarts,
            "requests_lost_to_restarts": lost,
            "clients": clients.iter().map(|c| c.kind).collect::<Vec<_>>(),
            "samples": samples,
            "failures": failures,
        }));
    } else {
        for f in &failures {
            emit(&format!("FAILED: {f}\n"));
        }
        if failures.is_empty() {
            let how = if restarts > 0 {
                format!(
                    "host killed and restarted {restarts} time(s), every client carried on, {lost} request(s) in flight lost to restarts (documented unsafe cases)"
                )
            } else {
                "host memory flat".to_string()
            };
            let kinds: Vec<&str> = clients.iter().map(|c| c.kind).collect();
            emit(&format!(
                "soak: {} s, {} clients ({}): {how}, nothing leaked\n",
                length.as_secs(),
                clients.len(),
                kinds.join(", ")
            ));
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!("{} failure(s) in the soak", failures.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(duration_arg("90"), Ok(Duration::from_secs(90)));
        assert_eq!(duration_arg("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(duration_arg("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(duration_arg("1h"), Ok(Duration::from_secs(3600)));
        for bad in ["", "m", "1.5m", "2d", "-1", "1 h", "0", "0m"] {
            assert!(duration_arg(bad).is_err(), "{bad}");
        }
    }
}
