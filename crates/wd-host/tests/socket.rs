//! The host's socket: how it is bound (no chmod through a planted symlink,
//! no directory others can write, nothing replaced but a stale socket of
//! ours) and who it admits (peer credentials against the mode and the
//! allow lists, for abstract sockets too).
//!
//! Tests that need another uid re-run this binary as uid 65534 in a
//! "role" (see `child_entry`); they need root and are skipped without it.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;

use wd_host::{DeviceConfig, Host, HostConfig};
use wd_ipc::Channel;
use wd_proto::Message;
use wd_testutil::{report, Role, TempDir};

/// The uid (and gid) other users' processes run as.
const NOBODY: u32 = 65534;

fn unique(tag: &str) -> String {
    wd_testutil::unique(&format!("wd-sock-{tag}"))
}

/// A directory for one test with permission bits `mode`, removed on drop.
fn tempdir(tag: &str, mode: u32) -> TempDir {
    wd_testutil::tempdir_in(&std::env::temp_dir(), &format!("wd-sock-{tag}"), mode)
}

/// What these tests look at in their directory.
trait SocketDir {
    /// The socket path inside it.
    fn socket(&self) -> String;
    /// Its entries, sorted.
    fn entries(&self) -> Vec<String>;
}

impl SocketDir for TempDir {
    fn socket(&self) -> String {
        self.join("wd.sock")
    }

    fn entries(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

fn config(socket: &str, mode: u32) -> HostConfig {
    let mut dev = DeviceConfig::new("dummy");
    dev.queues = 4;
    HostConfig {
        socket: socket.to_string(),
        socket_mode: mode,
        devices: vec![dev],
        ..HostConfig::default()
    }
}

fn start_err(cfg: &HostConfig) -> String {
    match Host::start(cfg) {
        Ok(_) => panic!("a host started on {}", cfg.socket),
        Err(e) => e.to_string(),
    }
}

fn mode_of(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

/// Speak Hello on `addr` the way any client does; returns "ok" or the
/// refusal as "<status> <message>".
fn hello(addr: &str) -> String {
    let sock = if let Some(name) = addr.strip_prefix('@') {
        use std::os::linux::net::SocketAddrExt;
        let a = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        UnixStream::connect_addr(&a)
    } else {
        UnixStream::connect(addr)
    };
    let sock = match sock {
        Ok(s) => s,
        Err(e) => return format!("connect failed: {e}"),
    };
    let mut ch = Channel::new(sock);
    let sent = ch.send(
        &Message::Hello {
            version: wd_proto::PROTOCOL_VERSION,
            client_pid: std::process::id(),
        },
        1,
        &[],
    );
    match ch.recv() {
        Ok(f) => match f.msg {
            Message::HelloReply { .. } => "ok".into(),
            Message::Error { status, message } => format!("{status:?} {message}"),
            other => format!("unexpected {}", other.name()),
        },
        Err(e) => format!("recv failed: {e} (send: {sent:?})"),
    }
}

/// This test binary re-run as uid 65534 in `role` with the address `addr`,
/// stdin held open until it is dropped.
fn as_nobody(role: &str, addr: &str) -> Role {
    let mut c = Role::command(role);
    c.env("WD_SOCKET_TEST_ADDR", addr)
        .uid(NOBODY)
        .gid(NOBODY)
        .stdin(Stdio::piped());
    Role::spawn(c)
}

/// What `hello` says when run as uid 65534.
fn hello_as_nobody(addr: &str) -> String {
    as_nobody("hello", addr).read_report()
}

/// Entry point of the other-uid processes; does nothing in a normal run.
#[test]
fn child_entry() {
    let Some(role) = wd_testutil::role() else {
        return;
    };
    let addr = std::env::var("WD_SOCKET_TEST_ADDR").unwrap();
    match role.as_str() {
        "hello" => {
            report(&hello(&addr));
        }
        // Hold an abstract name until the test closes our stdin (or dies).
        "hold" => {
            use std::os::linux::net::SocketAddrExt;
            let name = addr.strip_prefix('@').unwrap();
            let a = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
            let _l = UnixListener::bind_addr(&a).unwrap();
            report("ready");
            let mut sink = Vec::new();
            let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
        }
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn symlink_at_the_socket_path_is_refused_and_its_target_keeps_its_mode() {
    let dir = tempdir("symlink", 0o755);
    let target = dir.0.join("precious");
    std::fs::write(&target, b"secret").unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::symlink(&target, dir.0.join("wd.sock")).unwrap();
    let e = start_err(&config(&dir.socket(), 0o666));
    assert!(e.contains("symbolic link"), "{e}");
    assert_eq!(mode_of(&target), 0o600);
    // The link itself is left alone, and nothing else was created.
    assert!(std::fs::symlink_metadata(dir.0.join("wd.sock"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(dir.entries(), ["precious", "wd.sock"]);
}

#[test]
fn other_things_at_the_socket_path_are_refused_by_name() {
    let dir = tempdir("occupied", 0o755);
    std::fs::write(dir.0.join("wd.sock"), b"").unwrap();
    let e = start_err(&config(&dir.socket(), 0o600));
    assert!(e.contains("is a regular file, not a socket"), "{e}");
    std::fs::remove_file(dir.0.join("wd.sock")).unwrap();
    std::fs::create_dir(dir.0.join("wd.sock")).unwrap();
    let e = start_err(&config(&dir.socket(), 0o600));
    assert!(e.contains("is a directory, not a socket"), "{e}");
}

/// A path longer than a socket address holds (107 bytes) is refused at
/// start: bound in a short private directory and renamed into place, it
/// was served, and every client's connect failed.
#[test]
fn a_socket_path_longer_than_an_address_holds_is_refused_at_start() {
    let dir = tempdir("long", 0o755);
    let long = dir.0.join("s".repeat(120)).join("wd.sock");
    std::fs::create_dir(long.parent().unwrap()).unwrap();
    let e = start_err(&config(long.to_str().unwrap(), 0o600));
    assert!(e.contains("longer than the 107 bytes"), "{e}");
}

#[test]
fn directory_writable_by_others_is_refused_unless_sticky() {
    let open = tempdir("open", 0o777);
    let e = start_err(&config(&open.socket(), 0o600));
    assert!(e.contains("writable by group or others"), "{e}");
    assert!(e.contains("mode 0777"), "{e}");
    assert!(open.entries().is_empty(), "{:?}", open.entries());
    let group = tempdir("group", 0o770);
    let e = start_err(&config(&group.socket(), 0o600));
    assert!(e.contains("writable by group or others"), "{e}");
    // Sticky (like /tmp): others cannot rename or remove our entries.
    let sticky = tempdir("sticky", 0o1777);
    let h = Host::start(&config(&sticky.socket(), 0o600)).unwrap();
    assert_eq!(hello(&sticky.socket()), "ok");
    h.shutdown();
}

#[test]
fn socket_file_gets_exactly_the_configured_mode() {
    for mode in [0o600, 0o640, 0o666, 0o604] {
        let dir = tempdir("mode", 0o755);
        let h = Host::start(&config(&dir.socket(), mode)).unwrap();
        assert_eq!(mode_of(Path::new(&dir.socket())), mode, "mode {mode:o}");
        // The private directory it was bound in is gone.
        assert_eq!(dir.entries(), ["wd.sock"]);
        assert_eq!(hello(&dir.socket()), "ok");
        h.shutdown();
        assert!(dir.entries().is_empty(), "{:?}", dir.entries());
    }
}

#[test]
fn stale_socket_of_ours_is_replaced() {
    let dir = tempdir("stale", 0o755);
    drop(UnixListener::bind(dir.socket()).unwrap());
    let h = Host::start(&config(&dir.socket(), 0o600)).unwrap();
    assert_eq!(hello(&dir.socket()), "ok");
    assert_eq!(mode_of(Path::new(&dir.socket())), 0o600);
    h.shutdown();
}

#[test]
fn stale_socket_of_another_uid_is_refused_naming_it() {
    if !wd_testutil::root_or_skip(
        "stale_socket_of_another_uid_is_refused_naming_it",
        "to run a process as uid 65534",
    ) {
        return;
    }
    let dir = tempdir("foreign", 0o755);
    drop(UnixListener::bind(dir.socket()).unwrap());
    std::os::unix::fs::lchown(dir.socket(), Some(NOBODY), Some(NOBODY)).unwrap();
    let e = start_err(&config(&dir.socket(), 0o600));
    assert!(e.contains("a socket of uid 65534"), "{e}");
}

#[test]
fn live_host_on_the_path_is_refused_naming_its_uid_and_pid() {
    let dir = tempdir("live", 0o755);
    let h = Host::start(&config(&dir.socket(), 0o600)).unwrap();
    let e = start_err(&config(&dir.socket(), 0o600));
    let want = format!(
        "is already served by uid {} (pid {})",
        wd_sys::geteuid(),
        std::process::id()
    );
    assert!(e.contains(&want), "{e}");
    // The first host still serves.
    assert_eq!(hello(&dir.socket()), "ok");
    h.shutdown();
}

#[test]
fn abstract_name_held_by_another_uid_is_refused_naming_it() {
    if !wd_testutil::root_or_skip(
        "abstract_name_held_by_another_uid_is_refused_naming_it",
        "to run a process as uid 65534",
    ) {
        return;
    }
    let addr = format!("@{}", unique("held"));
    let mut holder = as_nobody("hold", &addr);
    assert_eq!(holder.read_report(), "ready");
    let e = start_err(&config(&addr, 0o600));
    let want = format!(
        "{addr} is already served by uid 65534 (pid {})",
        holder.pid()
    );
    assert!(e.contains(&want), "{e}");
}

#[test]
fn abstract_socket_with_mode_0600_refuses_other_uids_and_admits_root() {
    if !wd_testutil::root_or_skip(
        "abstract_socket_with_mode_0600_refuses_other_uids_and_admits_root",
        "to run a process as uid 65534",
    ) {
        return;
    }
    let addr = format!("@{}", unique("private"));
    let h = Host::start(&config(&addr, 0o600)).unwrap();
    let r = hello_as_nobody(&addr);
    assert!(
        r.starts_with(
            "Permission uid 65534 is not allowed by this host's access policy (mode 0600"
        ),
        "{r}"
    );
    assert_eq!(hello(&addr), "ok");
    h.shutdown();
    // Others' rw bits admit everyone.
    let addr = format!("@{}", unique("open"));
    let h = Host::start(&config(&addr, 0o606)).unwrap();
    assert_eq!(hello_as_nobody(&addr), "ok");
    h.shutdown();
}

#[test]
fn path_socket_policy_follows_the_mode_too() {
    if !wd_testutil::root_or_skip(
        "path_socket_policy_follows_the_mode_too",
        "to run a process as uid 65534",
    ) {
        return;
    }
    // Others may write the socket file (the kernel lets them connect) but
    // not read it: the policy needs both.
    let dir = tempdir("wonly", 0o755);
    let h = Host::start(&config(&dir.socket(), 0o622)).unwrap();
    let r = hello_as_nobody(&dir.socket());
    assert!(r.contains("uid 65534 is not allowed"), "{r}");
    h.shutdown();
}

#[test]
fn allow_lists_admit_a_uid_or_group_whatever_the_mode() {
    if !wd_testutil::root_or_skip(
        "allow_lists_admit_a_uid_or_group_whatever_the_mode",
        "to run a process as uid 65534",
    ) {
        return;
    }
    let addr = format!("@{}", unique("allow-uid"));
    let mut cfg = config(&addr, 0o600);
    cfg.allow_uids = vec![NOBODY];
    let h = Host::start(&cfg).unwrap();
    assert_eq!(hello_as_nobody(&addr), "ok");
    h.shutdown();
    let addr = format!("@{}", unique("allow-gid"));
    let mut cfg = config(&addr, 0o600);
    cfg.allow_gids = vec![NOBODY];
    let h = Host::start(&cfg).unwrap();
    assert_eq!(hello_as_nobody(&addr), "ok");
    h.shutdown();
    // Another uid is still refused.
    let addr = format!("@{}", unique("allow-other"));
    let mut cfg = config(&addr, 0o600);
    cfg.allow_uids = vec![NOBODY - 1];
    let h = Host::start(&cfg).unwrap();
    let r = hello_as_nobody(&addr);
    assert!(r.contains("allow_uids [65533]"), "{r}");
    h.shutdown();
}
