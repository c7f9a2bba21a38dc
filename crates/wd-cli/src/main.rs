//! `wd`: run a WrapDrive host, look at its devices and queues, benchmark it.
#![deny(unsafe_code)]

use crate::report::outln;
mod bench;
mod bench_fair;
mod bench_iommu;
mod bench_load;
mod bench_nvme;
mod bench_zip;
mod chaos;
mod chart;
mod faults;
mod load;
mod nvme;
mod report;
mod speed;
mod temp;
mod top;
mod units;

use std::collections::BTreeMap;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use wrapdrive::{ClientError, HostConn};

/// WrapDrive: user-space accelerator queues shared safely between processes.
#[derive(Parser)]
#[command(name = "wd", version, about, long_about = None)]
struct Cli {
    /// Host to talk to: socket path, @abstract-name, or "embedded"
    /// (default: $WD_HOST, else /run/wrapdrive/wd.sock; `wd bench` and
    /// `wd speed` start hosts of their own unless given one). Refused by
    /// the commands that run their own host only (serve, load, chaos,
    /// bench iommu/load/nvme/zip), whose help does not list it.
    #[arg(long, global = true)]
    host: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a device host until SIGINT/SIGTERM.
    Serve(ServeArgs),
    /// Show devices, queue types and live queues as a tree.
    Ls {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// A live view of the host: devices, engines awake and asleep, each
    /// client's queues with requests/s, bytes/s, faults and fallbacks
    /// (`--json`: one object per refresh, for scripts).
    Top(top::TopArgs),
    /// Read or write device attributes.
    Attr {
        #[command(subcommand)]
        op: AttrOp,
    },
    /// Benchmarks: the queue data path (default), the IOMMU, loading files,
    /// fairness, NVMe and compression (their own subcommands).
    Bench(bench::BenchCmd),
    /// Show the newest IOMMU faults of a queue (not consuming them).
    Faults(faults::FaultsArgs),
    /// `openssl speed` throughput per block size through WrapDrive (legacy
    /// path, offload, async jobs, default threshold) against the CPU alone,
    /// in one run.
    Speed(speed::SpeedArgs),
    /// Load a file into a shareable buffer (overlapped allocation and direct I/O).
    Load(load::LoadArgs),
    /// A mediated NVMe controller: identify it, or drive a namespace
    /// (`perf`).
    Nvme(nvme::NvmeCmd),
    /// Kill clients (and the host) at random moments under load, then check
    /// that the host leaked nothing and no client saw wrong data; or
    /// `--soak` a steady load. Runs its own host.
    Chaos(chaos::ChaosArgs),
    /// One client of `wd chaos` (not for direct use).
    #[command(hide = true)]
    ChaosClient(chaos::client::ClientArgs),
}

#[derive(Subcommand)]
enum AttrOp {
    /// Print one attribute, e.g. dev0/priority.
    Get {
        /// Attribute path.
        path: String,
    },
    /// Write a writable attribute (devN/numa_zone_id, devN/priority,
    /// devN/nvme/add_namespace and remove_namespace: `wd ls` marks them
    /// rw); host owner only.
    Set {
        /// Attribute path.
        path: String,
        /// New value.
        value: String,
    },
}

fn parse_octal(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .map_err(|_| format!("'{s}' is not an octal mode"))
}

fn connect(host: &Option<String>) -> Result<std::sync::Arc<HostConn>, ClientError> {
    match host {
        Some(h) => HostConn::connect(h),
        None => HostConn::from_env(),
    }
}

/// Options of `wd serve`.
#[derive(clap::Args)]
struct ServeArgs {
    /// Socket to listen on (a path, or @name for an abstract socket;
    /// default: the configuration's `socket`, else /run/wrapdrive/wd.sock;
    /// $WD_HOST and --host are not read).
    #[arg(long)]
    socket: Option<String>,
    /// TOML configuration file (socket, socket_mode, allow_uids, allow_gids,
    /// queue_details, a [limits] table and [[device]] tables; the format is
    /// in docs/operations.md, the limits and queue_details in
    /// docs/security.md).
    #[arg(long)]
    config: Option<std::path::PathBuf>,
    /// Device to own, e.g. "dummy:engines=2,queues=16" (repeatable; options,
    /// each at most once: engines, queues, numa, priority, idle_spin_us,
    /// cpu (the first engine's, one this process may run on), engine;
    /// ns=PATH:OFFSET:SIZE[:BLOCK] for nvme, once per namespace).
    #[arg(long = "device")]
    devices: Vec<String>,
    /// Who may connect, as octal permission bits: set on a path socket
    /// and checked against every client's credentials (abstract sockets
    /// too); a class needs both r and w (e.g. 600: this user and root;
    /// default: the configuration's `socket_mode`, else 666: every user).
    #[arg(long, value_parser = parse_octal)]
    mode: Option<u32>,
    /// Also admit this uid whatever --mode says (repeatable).
    #[arg(long = "allow-uid", value_name = "UID")]
    allow_uids: Vec<u32>,
    /// Also admit clients in this group, primary or supplementary,
    /// whatever --mode says (repeatable).
    #[arg(long = "allow-gid", value_name = "GID")]
    allow_gids: Vec<u32>,
}

fn serve(args: ServeArgs) -> Result<(), String> {
    let ServeArgs {
        socket,
        config,
        devices,
        mode,
        allow_uids,
        allow_gids,
    } = args;
    let mut cfg = match config {
        Some(p) => {
            let text = std::fs::read_to_string(&p)
                .map_err(|e| format!("cannot read {}: {e}", p.display()))?;
            wd_host::HostConfig::from_toml(&text).map_err(|e| format!("{}: {e}", p.display()))?
        }
        None => wd_host::HostConfig::default(),
    };
    if let Some(s) = socket {
        cfg.socket = s;
    }
    if let Some(m) = mode {
        cfg.socket_mode = m;
    }
    cfg.allow_uids.extend(allow_uids);
    cfg.allow_gids.extend(allow_gids);
    if !devices.is_empty() {
        cfg.devices = devices
            .iter()
            .map(|d| wd_host::DeviceConfig::parse_spec(d))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
    }
    // Block the signals before any thread exists, so only sigwait sees them.
    wd_sys::block_termination_signals().map_err(|e| e.to_string())?;
    // Under systemd (wrapdrive.socket) the socket comes from the service
    // manager and outlives this process: a restarted host serves the same
    // address, and clients waiting to connect are not refused meanwhile.
    let activated = wd_host::socket::activation().map_err(|e| e.to_string())?;
    let how = if activated.is_some() {
        "socket-activated"
    } else {
        "bound"
    };
    let host = match activated {
        Some(l) => wd_host::Host::start_activated(&cfg, l),
        None => wd_host::Host::start(&cfg),
    }
    .map_err(|e| e.to_string())?;
    eprintln!(
        "wd: serving {} device(s) on {} ({how}, pid {})",
        cfg.devices.len(),
        host.address(),
        std::process::id()
    );
    let sig = wd_sys::wait_termination();
    eprintln!("wd: signal {sig}, shutting down");
    host.shutdown();
    Ok(())
}

/// Print attributes as a tree: dev0 / mdev_supported_types / ... = value.
fn print_tree(entries: &[wrapdrive::AttrEntry]) {
    #[derive(Default)]
    struct Node {
        value: Option<(String, bool)>,
        kids: BTreeMap<String, Node>,
    }
    let mut root = Node::default();
    for e in entries {
        let mut n = &mut root;
        for part in e.path.split('/') {
            n = n.kids.entry(part.to_string()).or_default();
        }
        n.value = Some((e.value.clone(), e.writable));
    }
    fn walk(n: &Node, prefix: &str, out: &mut String) {
        let count = n.kids.len();
        for (i, (name, k)) in n.kids.iter().enumerate() {
            let last = i + 1 == count;
            let branch = if last { "└── " } else { "├── " };
            match &k.value {
                Some((v, w)) => out.push_str(&format!(
                    "{prefix}{branch}{name} = {v}{}\n",
                    if *w { "  (rw)" } else { "" }
                )),
                None => out.push_str(&format!("{prefix}{branch}{name}\n")),
            }
            walk(
                k,
                &format!("{prefix}{}", if last { "    " } else { "│   " }),
                out,
            );
        }
    }
    // One write, which a closed stdout (`wd ls | head`) does not turn into
    // a panic.
    let mut out = String::new();
    walk(&root, "", &mut out);
    report::emit(&out);
}

/// `--host` given to a command that talks to no host: said, not ignored.
fn no_host(host: &Option<String>, cmd: &str, why: &str) -> Result<(), String> {
    match host {
        Some(h) => Err(format!("--host {h}: `wd {cmd}` {why}")),
        None => Ok(()),
    }
}

/// Commands that run their own host (or none), as paths of subcommand
/// names: they refuse `--host`, so their help does not offer it.
const OWN_HOST: [&[&str]; 7] = [
    &["serve"],
    &["load"],
    &["chaos"],
    &["bench", "iommu"],
    &["bench", "load"],
    &["bench", "nvme"],
    &["bench", "zip"],
];

/// The command line, with the global `--host` hidden where it is refused.
/// Clap copies a global option into each subcommand when it builds the
/// command, except into one that has an option of that id already: those
/// get a hidden one (its value still reaches `Cli::host`, so the refusal
/// says why).
fn command() -> clap::Command {
    use clap::CommandFactory;
    fn hide(c: clap::Command, path: &[&str]) -> clap::Command {
        match path {
            [] => c.arg(
                clap::Arg::new("host")
                    .long("host")
                    .value_name("HOST")
                    .hide(true),
            ),
            [first, rest @ ..] => c.mut_subcommand(*first, |sub| hide(sub, rest)),
        }
    }
    OWN_HOST
        .iter()
        .fold(Cli::command(), |c, path| hide(c, path))
}

/// An attribute path the protocol cannot carry (empty, or longer than any
/// path) names no attribute: said as the host says it for any other
/// missing one, rather than as a protocol error.
fn attr_path<'a>(path: &'a str, kind: &str) -> Result<&'a str, String> {
    match path.is_empty() || path.len() > wd_proto::limits::MAX_PATH {
        true => Err(format!("no {kind}'{path}'")),
        false => Ok(path),
    }
}

fn run(cli: Cli) -> Result<(), String> {
    match &cli.cmd {
        Cmd::Serve(_) => no_host(&cli.host, "serve", "is a host: it listens on --socket")?,
        Cmd::Load(_) => no_host(&cli.host, "load", "reads into this process's memory")?,
        Cmd::Chaos(_) => no_host(&cli.host, "chaos", "starts and kills a host of its own")?,
        _ => {}
    }
    if matches!(cli.cmd, Cmd::Bench(_) | Cmd::Speed(_) | Cmd::Chaos(_)) {
        // Their files (gigabytes for some) and hosts go at a signal too.
        temp::clean_up_on_signals()?;
    }
    match cli.cmd {
        Cmd::Serve(args) => serve(args),
        Cmd::Ls { json } => {
            let h = connect(&cli.host).map_err(|e| e.to_string())?;
            let entries = h.attrs("").map_err(|e| e.to_string())?;
            if json {
                let v: Vec<_> = entries
                    .iter()
                    .map(|e| serde_json::json!({"path": e.path, "value": e.value, "writable": e.writable}))
                    .collect();
                report::print_json(&serde_json::Value::Array(v));
            } else {
                print_tree(&entries);
            }
            Ok(())
        }
        Cmd::Attr { op } => {
            let h = connect(&cli.host).map_err(|e| e.to_string())?;
            match op {
                AttrOp::Get { path } => {
                    let path = attr_path(&path, "attribute ")?;
                    outln!("{}", h.get_attr(path).map_err(|e| e.to_string())?)
                }
                AttrOp::Set { path, value } => {
                    attr_path(&path, "writable attribute ")?;
                    // A namespace's file named relative to where the command
                    // runs (the host would resolve it in its own directory,
                    // so it refuses a relative path).
                    let value =
                        match path.ends_with("nvme/add_namespace") && !value.starts_with('/') {
                            true => std::env::current_dir()
                                .map_err(|e| format!("add_namespace: {e}"))?
                                .join(&value)
                                .to_string_lossy()
                                .into_owned(),
                            false => value,
                        };
                    h.set_attr(&path, &value).map_err(|e| e.to_string())?
                }
            }
            Ok(())
        }
        Cmd::Top(a) => top::run(a, &cli.host).map_err(|e| e.to_string()),
        Cmd::Bench(b) => b.run(cli.host.as_deref()),
        Cmd::Faults(a) => faults::run(&*connect(&cli.host).map_err(|e| e.to_string())?, a),
        Cmd::Speed(a) => speed::run(a, cli.host.as_deref()),
        Cmd::Load(args) => load::run(args),
        Cmd::Nvme(n) => connect(&cli.host)
            .map_err(|e| e.to_string())
            .and_then(|h| n.run(&h)),
        Cmd::Chaos(a) => chaos::run(a),
        Cmd::ChaosClient(a) => std::process::exit(chaos::client::run(a) as i32),
    }
}

fn main() -> ExitCode {
    // `wd` carries the host anyway (`wd serve`): let `--host embedded` and
    // `WD_HOST=embedded` (benchmarks, examples) start one in-process.
    wd_embedded::install();
    let cli = {
        use clap::FromArgMatches;
        Cli::from_arg_matches(&command().get_matches()).unwrap_or_else(|e| e.exit())
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wd: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The help text of `wd ARGS... --help`.
    fn help(args: &[&str]) -> String {
        let mut argv = vec!["wd"];
        argv.extend(args);
        argv.push("--help");
        let e = match command().try_get_matches_from(argv) {
            Err(e) => e,
            Ok(_) => panic!("--help parsed"),
        };
        e.to_string()
    }

    #[test]
    fn host_is_offered_only_where_it_is_taken() {
        for path in OWN_HOST {
            let text = help(path);
            assert!(
                !text.contains("--host <HOST>"),
                "wd {path:?} --help:\n{text}"
            );
        }
        for path in [
            &["ls"][..],
            &["attr", "get"],
            &["bench"],
            &["bench", "fairness"],
            &["faults"],
        ] {
            assert!(help(path).contains("--host <HOST>"), "wd {path:?} --help");
        }
        // Still parsed (and then refused with a reason) where hidden.
        let m = command()
            .try_get_matches_from(["wd", "serve", "--host", "x"])
            .unwrap();
        let cli = <Cli as clap::FromArgMatches>::from_arg_matches(&m).unwrap();
        let e = run(cli).unwrap_err();
        assert!(e.contains("--host x: `wd serve` is a host"), "{e}");
    }

    #[test]
    fn config_help_names_the_document_of_the_format() {
        let text = help(&["serve"]);
        assert!(text.contains("docs/operations.md"), "{text}");
    }

    #[test]
    fn attr_paths_no_host_could_have() {
        assert_eq!(attr_path("", "attribute "), Err("no attribute ''".into()));
        let long = "a".repeat(wd_proto::limits::MAX_PATH + 1);
        assert!(attr_path(&long, "attribute ").is_err());
        assert_eq!(
            attr_path("dev0/priority", "attribute "),
            Ok("dev0/priority")
        );
    }

    #[test]
    fn the_command_line_is_well_formed() {
        command().debug_assert();
    }
}
