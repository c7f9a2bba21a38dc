//! Host configuration: from a TOML file or from command-line device specs.
//! Every value is range-checked here, once.

use serde::Deserialize;

use crate::HostError;

pub use wd_proto::DEFAULT_SOCKET;
/// Most engine threads one device may have.
pub const MAX_ENGINES: usize = 64;
/// Most queue instances one queue type may offer.
pub const MAX_INSTANCES: u32 = 4096;
/// Most simultaneous client connections.
pub const MAX_CONNECTIONS: usize = 1024;
/// Most queues one connection may hold.
pub const MAX_QUEUES_PER_CONNECTION: usize = 256;
/// Most shared ranges one queue may hold.
pub const MAX_SHARES_PER_QUEUE: usize = 4096;
/// Most devices one host may own.
pub const MAX_DEVICES: usize = 64;

/// One device the host owns.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DeviceConfig {
    /// Driver name (see [`crate::drivers::NAMES`]).
    pub driver: String,
    /// Engine threads serving this device's queues.
    #[serde(default = "default_engines")]
    pub engines: usize,
    /// Queue instances per queue type (`available_instances` at start).
    #[serde(default = "default_queues")]
    pub queues: u32,
    /// NUMA node the device is attached to.
    #[serde(default)]
    pub numa_zone_id: i32,
    /// Priority when several devices serve an algorithm (higher wins).
    #[serde(default)]
    pub priority: u32,
    /// How long an idle engine polls before it sleeps, in microseconds
    /// (the driver's own default when absent: 200 us, or the NVMe
    /// controller's 0.5 s).
    #[serde(default)]
    pub idle_spin_us: Option<u64>,
    /// Pin engine `e` to CPU `cpu + e` (modulo the CPUs online), so that a
    /// benchmark's ends stay on known CPUs; unpinned when absent. `cpu`
    /// itself must be one this process may run on: a typo would otherwise
    /// pin the engines to some CPU nobody asked for.
    #[serde(default)]
    pub cpu: Option<usize>,
    /// What computes the requests, for a device with a choice (sec:
    /// `auto`, `libcrypto` or `ipsec-mb`); the device picks when absent.
    #[serde(default)]
    pub engine: Option<String>,
    /// Namespaces of an NVMe device, each `PATH:OFFSET:SIZE[:BLOCK]`
    /// (sizes with K/M/G suffixes; BLOCK 512 or 4096).
    #[serde(default)]
    pub namespaces: Vec<String>,
}

fn default_engines() -> usize {
    1
}
fn default_queues() -> u32 {
    64
}

impl DeviceConfig {
    /// A device with default settings.
    pub fn new(driver: &str) -> DeviceConfig {
        DeviceConfig {
            driver: driver.to_string(),
            engines: default_engines(),
            queues: default_queues(),
            numa_zone_id: 0,
            priority: 0,
            idle_spin_us: None,
            cpu: None,
            engine: None,
            namespaces: Vec::new(),
        }
    }

    /// Parse `driver[:key=value,...]`, e.g. `dummy:engines=2,queues=16`.
    pub fn parse_spec(spec: &str) -> Result<DeviceConfig, HostError> {
        let (driver, opts) = spec.split_once(':').unwrap_or((spec, ""));
        let mut d = DeviceConfig::new(driver);
        let mut seen: Vec<&str> = Vec::new();
        for kv in opts.split(',').filter(|s| !s.is_empty()) {
            let (k, v) = kv.split_once('=').ok_or_else(|| {
                HostError::Config(format!("device option '{kv}' is not key=value"))
            })?;
            // A repeated key is a typo or a pasted spec: taking either value
            // would run a device other than the one asked for. `ns` is a
            // list (one namespace each).
            let canonical = if k == "numa_zone_id" { "numa" } else { k };
            if canonical != "ns" && seen.contains(&canonical) {
                return Err(HostError::Config(format!(
                    "device '{spec}': option '{k}' is given twice"
                )));
            }
            seen.push(canonical);
            let num = |v: &str| -> Result<u64, HostError> {
                v.parse::<u64>().map_err(|_| {
                    HostError::Config(format!("device option {k}: '{v}' is not a number"))
                })
            };
            match k {
                "engines" => d.engines = num(v)? as usize,
                "queues" => d.queues = num(v)?.min(u32::MAX as u64) as u32,
                "numa" | "numa_zone_id" => d.numa_zone_id = num(v)?.min(i32::MAX as u64) as i32,
                "priority" => d.priority = num(v)?.min(u32::MAX as u64) as u32,
                "idle_spin_us" => d.idle_spin_us = Some(num(v)?),
                "cpu" => d.cpu = Some(num(v)?.min(usize::MAX as u64) as usize),
                "engine" => d.engine = Some(v.to_string()),
                "ns" => d.namespaces.push(v.to_string()),
                _ => {
                    return Err(HostError::Config(format!(
                    "unknown device option '{k}' (engines, queues, numa, priority, idle_spin_us, cpu, engine, ns)"
                )))
                }
            }
        }
        d.validate()?;
        Ok(d)
    }

    /// Check ranges and that the driver exists.
    pub fn validate(&self) -> Result<(), HostError> {
        if !crate::drivers::exists(&self.driver) {
            return Err(HostError::Config(format!(
                "unknown driver '{}' (available: {})",
                self.driver,
                crate::drivers::NAMES.join(", ")
            )));
        }
        if !(1..=MAX_ENGINES).contains(&self.engines) {
            return Err(HostError::Config(format!(
                "engines must be 1..={MAX_ENGINES}"
            )));
        }
        if !(1..=MAX_INSTANCES).contains(&self.queues) {
            return Err(HostError::Config(format!(
                "queues must be 1..={MAX_INSTANCES}"
            )));
        }
        if self.engine.is_some() || !self.namespaces.is_empty() {
            // Named engines and namespaces are checked now, with the
            // reason when absent.
            crate::drivers::open(self).map_err(HostError::Config)?;
        }
        if let Some(cpu) = self.cpu {
            check_cpu(cpu)?;
        }
        if self.idle_spin_us.is_some_and(|us| us > 1_000_000) {
            return Err(HostError::Config(
                "idle_spin_us must be at most 1000000".into(),
            ));
        }
        Ok(())
    }
}

/// Refuse an engine CPU this process may not run on (absent, offline, or
/// outside its affinity mask, as under `taskset` or a cgroup cpuset): the
/// engines would otherwise be pinned modulo the CPU count, to a CPU
/// nobody named.
fn check_cpu(cpu: usize) -> Result<(), HostError> {
    let allowed = allowed_cpus();
    let ok = match &allowed {
        Some(list) => list.contains(&cpu),
        None => cpu < wd_sys::online_cpus(),
    };
    if ok {
        return Ok(());
    }
    let usable = match allowed {
        Some(list) => format!("CPUs this process may use: {}", cpu_list(&list)),
        None => format!("this machine has {} CPU(s)", wd_sys::online_cpus()),
    };
    Err(HostError::Config(format!(
        "cpu={cpu}: no such CPU for this host ({usable})"
    )))
}

/// The CPUs the calling thread may run on (`Cpus_allowed_list`), `None`
/// where /proc does not say.
pub fn allowed_cpus() -> Option<Vec<usize>> {
    let status = std::fs::read_to_string("/proc/thread-self/status")
        .or_else(|_| std::fs::read_to_string("/proc/self/status"))
        .ok()?;
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
    parse_cpu_list(list.trim())
}

/// `0-3,8,10-11` as the kernel writes a CPU list.
fn parse_cpu_list(list: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b) = (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?);
        cpus.extend(a..=b.min(a + 65_536));
    }
    Some(cpus)
}

/// A CPU list written back as ranges, short even on large machines.
fn cpu_list(cpus: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(match i == j {
            true => cpus[i].to_string(),
            false => format!("{}-{}", cpus[i], cpus[j]),
        });
        i = j + 1;
    }
    out.join(",")
}

/// Everything a host needs to start.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    /// Socket path; a leading '@' names an abstract socket.
    #[serde(default = "default_socket")]
    pub socket: String,
    /// Permission bits saying who may connect: set on a path socket's file
    /// and, for every kind of socket (abstract ones included), checked
    /// against each peer's credentials (see [`crate::socket::AccessPolicy`]).
    #[serde(default = "default_mode")]
    pub socket_mode: u32,
    /// Users admitted whatever `socket_mode` says.
    #[serde(default)]
    pub allow_uids: Vec<u32>,
    /// Groups (a peer's primary or supplementary) admitted whatever
    /// `socket_mode` says.
    #[serde(default)]
    pub allow_gids: Vec<u32>,
    /// Devices to own.
    #[serde(default = "default_devices", rename = "device")]
    pub devices: Vec<DeviceConfig>,
    /// What one user may hold (`[limits]`).
    #[serde(default)]
    pub limits: Limits,
    /// Who sees a queue's details in the attribute tree (`wd ls`).
    #[serde(default)]
    pub queue_details: QueueDetails,
}

/// Who sees the details (pid, uid, sizes, counters) of a queue.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum QueueDetails {
    /// Its owner's uid, the host's owner and root; others see counts.
    #[default]
    Owner,
    /// Every client.
    All,
}

/// What one user, and one queue, may take of the host: named limits so
/// that no local user can lock the others out (see docs/security.md).
/// Every refusal names the limit it hit.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Connections one uid may hold at once.
    pub connections_per_uid: u32,
    /// Queues one uid may hold at once, over every device.
    pub queues_per_uid: u32,
    /// Share of one queue type's instances (percent) one uid may hold.
    pub queue_type_percent: u32,
    /// Shared ranges one uid may have mapped into the host at once. The
    /// default (4096, a queue's own limit) leaves room for four users at
    /// it in the host's mapping budget (about 19k ranges with the
    /// kernel's default `vm.max_map_count`, three mappings a range).
    pub shares_per_uid: u32,
    /// Bytes of client memory one uid may have mapped into the host.
    pub mapped_bytes_per_uid: u64,
    /// Bytes of IOMMU page tables one uid's domains may hold together
    /// (virtio-iommu MAPs build tables of the client's choosing: one page
    /// mapped at scattered addresses costs many table pages).
    pub table_bytes_per_uid: u64,
    /// How long a new connection may take to say Hello, a frame to arrive
    /// whole once begun, and a reply to be read, in milliseconds: a
    /// connection thread never waits longer on its client.
    pub hello_timeout_ms: u64,
    /// Connections held back for root and the host's owner once the rest
    /// are taken.
    pub reserved_connections: u32,
    /// Whether root and the host's owner are exempt from the per-uid
    /// limits (host-wide limits still apply to them).
    pub exempt_owner: bool,
    /// Bytes of work an engine does for one queue before it serves the
    /// next (fair service: a queue of huge copies cannot starve others).
    pub pass_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connections_per_uid: 64,
            queues_per_uid: 256,
            queue_type_percent: 50,
            shares_per_uid: 4096,
            mapped_bytes_per_uid: 1 << 40,
            table_bytes_per_uid: 256 << 20,
            hello_timeout_ms: 2000,
            reserved_connections: 16,
            exempt_owner: true,
            pass_bytes: 256 << 10,
        }
    }
}

impl Limits {
    fn validate(&self) -> Result<(), HostError> {
        let bad = |what: &str| Err(HostError::Config(format!("limits.{what}")));
        if self.connections_per_uid == 0 || self.queues_per_uid == 0 {
            return bad("connections_per_uid and queues_per_uid must be at least 1");
        }
        if !(1..=100).contains(&self.queue_type_percent) {
            return bad("queue_type_percent must be 1..=100");
        }
        if self.hello_timeout_ms == 0 || self.hello_timeout_ms > 600_000 {
            return bad("hello_timeout_ms must be 1..=600000");
        }
        if self.reserved_connections as usize >= MAX_CONNECTIONS {
            return bad("reserved_connections must be below the connection limit");
        }
        if self.table_bytes_per_uid < 1 << 20 {
            return bad("table_bytes_per_uid must be at least 1 MiB");
        }
        if self.pass_bytes < 4096 {
            return bad("pass_bytes must be at least 4096");
        }
        Ok(())
    }
}

fn default_socket() -> String {
    DEFAULT_SOCKET.to_string()
}
fn default_mode() -> u32 {
    0o666
}
/// The devices a host owns when none are named: one of each driver.
pub fn default_devices() -> Vec<DeviceConfig> {
    crate::drivers::DEFAULTS
        .iter()
        .map(|d| DeviceConfig::new(d))
        .collect()
}

/// Parse a list of device specs separated by `;` (as `WD_EMBEDDED_DEVICES`
/// takes them): `dummy:engines=2;sec`.
pub fn parse_spec_list(list: &str) -> Result<Vec<DeviceConfig>, HostError> {
    let devs: Vec<DeviceConfig> = list
        .split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(DeviceConfig::parse_spec)
        .collect::<Result<_, _>>()?;
    if devs.is_empty() || devs.len() > MAX_DEVICES {
        return Err(HostError::Config(format!(
            "between 1 and {MAX_DEVICES} devices are needed"
        )));
    }
    Ok(devs)
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            socket: default_socket(),
            socket_mode: default_mode(),
            allow_uids: Vec::new(),
            allow_gids: Vec::new(),
            devices: default_devices(),
            limits: Limits::default(),
            queue_details: QueueDetails::default(),
        }
    }
}

impl HostConfig {
    /// Parse a TOML configuration:
    /// ```toml
    /// socket = "/run/wrapdrive/wd.sock"
    /// [[device]]
    /// driver = "dummy"
    /// engines = 2
    /// ```
    pub fn from_toml(text: &str) -> Result<HostConfig, HostError> {
        let c: HostConfig = toml::from_str(text).map_err(|e| HostError::Config(e.to_string()))?;
        c.validate()?;
        Ok(c)
    }

    /// Check every device and the limits.
    pub fn validate(&self) -> Result<(), HostError> {
        if self.devices.is_empty() || self.devices.len() > MAX_DEVICES {
            return Err(HostError::Config(format!(
                "between 1 and {MAX_DEVICES} devices are needed"
            )));
        }
        if self.socket.is_empty() {
            return Err(HostError::Config("socket path is empty".into()));
        }
        if self.socket_mode > 0o777 {
            return Err(HostError::Config(
                "socket_mode must be at most 0o777 (octal: socket_mode = 0o660 in TOML, --mode 660)"
                    .into(),
            ));
        }
        self.limits.validate()?;
        self.devices.iter().try_for_each(|d| d.validate())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs() {
        let d = DeviceConfig::parse_spec("dummy:engines=2,queues=8").unwrap();
        assert_eq!((d.engines, d.queues), (2, 8));
        assert!(DeviceConfig::parse_spec("nope").is_err());
        assert!(DeviceConfig::parse_spec("dummy:engines=0").is_err());
        assert!(DeviceConfig::parse_spec("dummy:colour=red").is_err());
        assert!(DeviceConfig::parse_spec("dummy:engines").is_err());
    }

    #[test]
    fn a_key_given_twice_is_refused() {
        for spec in [
            "dummy:engines=2,engines=3",
            "dummy:numa=0,numa_zone_id=1",
            "sec:engine=auto,engine=libcrypto",
            "zip:queues=4,priority=1,queues=8",
            "dummy-async:idle_spin_us=5,idle_spin_us=5",
            "nvme:cpu=0,cpu=0",
        ] {
            let e = DeviceConfig::parse_spec(spec).unwrap_err().to_string();
            assert!(e.contains("given twice"), "{spec}: {e}");
        }
        let e = DeviceConfig::parse_spec("dummy:engines=2,engines=3")
            .unwrap_err()
            .to_string();
        assert!(e.contains("'engines'"), "{e}");
    }

    #[test]
    fn a_cpu_the_process_cannot_use_is_refused() {
        let e = DeviceConfig::parse_spec("dummy:engines=2,cpu=4095")
            .unwrap_err()
            .to_string();
        assert!(e.contains("cpu=4095") && e.contains("no such CPU"), "{e}");
        let mine = allowed_cpus().expect("Cpus_allowed_list");
        let d = DeviceConfig::parse_spec(&format!("dummy:cpu={}", mine[0])).unwrap();
        assert_eq!(d.cpu, Some(mine[0]));
        let e = HostConfig::from_toml("[[device]]\ndriver = \"dummy\"\ncpu = 100000\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("cpu=100000"), "{e}");
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-2,5,7-8"), Some(vec![0, 1, 2, 5, 7, 8]));
        assert_eq!(parse_cpu_list("x"), None);
        assert_eq!(cpu_list(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
    }

    #[test]
    fn engine_choices_are_checked() {
        let d = DeviceConfig::parse_spec("sec:engine=libcrypto").unwrap();
        assert_eq!(d.engine.as_deref(), Some("libcrypto"));
        let e = DeviceConfig::parse_spec("sec:engine=fast").unwrap_err();
        assert!(
            e.to_string()
                .contains("not one of auto, libcrypto, ipsec-mb"),
            "{e}"
        );
        let e = DeviceConfig::parse_spec("dummy:engine=libcrypto").unwrap_err();
        assert!(e.to_string().contains("no engine choice"), "{e}");
        let driver =
            crate::drivers::open(&DeviceConfig::parse_spec("sec:engine=libcrypto").unwrap())
                .unwrap();
        assert!(driver.engine().unwrap().starts_with("libcrypto"));
    }

    #[test]
    fn toml_files() {
        let c = HostConfig::from_toml(
            "socket = \"@x\"\n[[device]]\ndriver = \"dummy\"\nqueues = 4\n[[device]]\ndriver = \"dummy\"\npriority = 3\n",
        )
        .unwrap();
        assert_eq!(c.devices.len(), 2);
        assert_eq!(c.devices[1].priority, 3);
        assert!(HostConfig::from_toml("sockett = 1").is_err());
        assert!(HostConfig::from_toml("[[device]]\ndriver = \"dummy\"\nengines = 999\n").is_err());
        let c =
            HostConfig::from_toml("[limits]\nqueues_per_uid = 3\nexempt_owner = false\n").unwrap();
        assert_eq!(c.limits.queues_per_uid, 3);
        assert_eq!(c.limits.shares_per_uid, Limits::default().shares_per_uid);
        assert!(HostConfig::from_toml("[limits]\nqueue_type_percent = 0\n").is_err());
        assert!(HostConfig::from_toml("[limits]\nnope = 1\n").is_err());
    }
}
