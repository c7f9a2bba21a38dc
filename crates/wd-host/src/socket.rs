//! The host's socket: binding it without handing other users a race, and
//! deciding from a peer's kernel-recorded credentials whether it may use
//! the host at all.
//!
//! Filesystem permissions only protect path sockets, and only if the mode
//! is set on the socket itself: `chmod` through a path in a directory
//! someone else can write follows whatever they put there. Abstract
//! sockets have no permissions at all. So the mode is applied twice: once
//! on the socket file (bound in a private directory, where nobody can swap
//! it), and once per connection from SO_PEERCRED, for every kind of socket.

use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use wd_proto::Status;
use wd_sys::PeerCred;

/// Why the host could not take its socket.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// A system call on the socket or its directory failed.
    #[error("socket {address}: cannot {what}: {source}")]
    Io {
        /// The socket address.
        address: String,
        /// What the host was doing.
        what: &'static str,
        /// What failed.
        #[source]
        source: io::Error,
    },
    /// Another live host answers on the address.
    #[error("{address} is already served by uid {uid} (pid {pid}); stop that host or choose another socket")]
    InUse {
        /// The socket address.
        address: String,
        /// The serving process's user.
        uid: u32,
        /// The serving process.
        pid: u32,
    },
    /// The socket's directory can be written by users other than its owner.
    #[error("socket {address}: its directory {dir} is writable by group or others (mode {mode:04o}) and not sticky, so another user could replace the socket between bind and chmod; serve from a directory only this user can write")]
    OpenDirectory {
        /// The socket address.
        address: String,
        /// The directory.
        dir: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The socket's directory belongs to another user, who could replace
    /// anything in it.
    #[error("socket {address}: its directory {dir} belongs to uid {uid}, not to this user (uid {me}) or root, so that user could replace the socket; serve from a directory of this user's")]
    ForeignDirectory {
        /// The socket address.
        address: String,
        /// The directory.
        dir: PathBuf,
        /// Its owner.
        uid: u32,
        /// This process's effective uid.
        me: u32,
    },
    /// Something that is not a socket sits at the path.
    #[error(
        "socket {address}: the path exists and is a {kind}, not a socket; refusing to replace it"
    )]
    NotASocket {
        /// The socket address.
        address: String,
        /// What it is ("regular file", "symbolic link", ...).
        kind: &'static str,
    },
    /// A stale socket of another user sits at the path.
    #[error("socket {address}: a socket of uid {uid} is there ({state}); this user (uid {me}) refuses to replace another user's socket")]
    ForeignSocket {
        /// The socket address.
        address: String,
        /// The socket file's owner.
        uid: u32,
        /// This process's effective uid.
        me: u32,
        /// What connecting to it said: nobody answers, or this user may
        /// not connect (a host may well be serving it).
        state: &'static str,
    },
    /// The address cannot name a socket.
    #[error("socket {address}: {why}")]
    BadAddress {
        /// The socket address.
        address: String,
        /// What is wrong with it.
        why: &'static str,
    },
}

impl SocketError {
    /// The status a caller reports for this error.
    pub fn status(&self) -> Status {
        match self {
            // An error without an errno counts as EIO.
            SocketError::Io { source, .. } => {
                Status::from_errno(source.raw_os_error().unwrap_or(5))
            }
            SocketError::InUse { .. } => Status::Busy,
            SocketError::BadAddress { .. } => Status::Invalid,
            SocketError::OpenDirectory { .. }
            | SocketError::ForeignDirectory { .. }
            | SocketError::NotASocket { .. }
            | SocketError::ForeignSocket { .. } => Status::Permission,
        }
    }
}

/// A bound listening socket and, for a path socket, how to recognise the
/// file this host created (so shutdown never removes someone else's).
pub(crate) struct Bound {
    pub(crate) listener: UnixListener,
    pub(crate) file: Option<SocketFile>,
}

/// The socket file a host created: its path and inode.
pub(crate) struct SocketFile {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl SocketFile {
    /// Remove the socket file if it is still the one this host bound: a
    /// path reused by a later host stays.
    pub(crate) fn remove(&self) {
        if let Ok(md) = std::fs::symlink_metadata(&self.path) {
            if md.dev() == self.dev && md.ino() == self.ino {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

/// The listening socket a service manager passed (systemd socket
/// activation: `LISTEN_PID` is this process and `LISTEN_FDS` >= 1, the
/// socket is descriptor 3), or None when this process was not activated.
/// The variables are removed, so programs this host starts do not take
/// them for theirs.
pub fn activation() -> Result<Option<UnixListener>, SocketError> {
    const FIRST_FD: i32 = 3;
    let ours = std::env::var("LISTEN_PID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
        .is_some_and(|p| p == wd_sys::getpid());
    let count = std::env::var("LISTEN_FDS")
        .ok()
        .and_then(|n| n.parse::<u32>().ok())
        .unwrap_or(0);
    if !ours || count == 0 {
        return Ok(None);
    }
    for v in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        std::env::remove_var(v);
    }
    // Read as "socket {address}: cannot {what}: {source}".
    let address = "passed as descriptor 3 (socket activation, LISTEN_FDS)".to_string();
    let fd = wd_sys::inherited_fd(FIRST_FD).map_err(|e| SocketError::Io {
        address: address.clone(),
        what: "take it",
        source: io::Error::from_raw_os_error(e.errno()),
    })?;
    let listener = UnixListener::from(fd);
    // A UNIX stream socket that listens, or nothing this host can serve.
    listener.local_addr().map_err(io_err(
        &address,
        "read its address (a listening UNIX stream socket is needed)",
    ))?;
    listener
        .set_nonblocking(true)
        .map_err(io_err(&address, "make it non-blocking"))?;
    Ok(Some(listener))
}

/// The address clients use for a listener (its path, or `@name`).
pub fn listener_address(l: &UnixListener) -> String {
    use std::os::linux::net::SocketAddrExt;
    match l.local_addr() {
        Ok(a) => match (a.as_pathname(), a.as_abstract_name()) {
            (Some(p), _) => p.display().to_string(),
            (None, Some(n)) => format!("@{}", String::from_utf8_lossy(n)),
            _ => "(unnamed socket)".into(),
        },
        Err(_) => "(unknown socket)".into(),
    }
}

/// Bind `address` (a path, or `@name` for an abstract socket) and give a
/// path socket exactly `mode`.
pub(crate) fn bind(address: &str, mode: u32) -> Result<Bound, SocketError> {
    match address.strip_prefix('@') {
        Some(name) => bind_abstract(address, name),
        None => bind_path(address, mode),
    }
}

fn io_err<'a>(address: &'a str, what: &'static str) -> impl FnOnce(io::Error) -> SocketError + 'a {
    move |source| SocketError::Io {
        address: address.to_string(),
        what,
        source,
    }
}

/// Who holds a live socket: the error a second host gets.
fn in_use(address: &str, holder: &UnixStream) -> Option<SocketError> {
    let cred = wd_sys::peer_cred(holder).ok()?;
    Some(SocketError::InUse {
        address: address.to_string(),
        uid: cred.uid,
        pid: cred.pid,
    })
}

fn bind_abstract(address: &str, name: &str) -> Result<Bound, SocketError> {
    let addr = SocketAddr::from_abstract_name(name.as_bytes())
        .map_err(io_err(address, "use the abstract name"))?;
    match UnixListener::bind_addr(&addr) {
        Ok(listener) => Ok(Bound {
            listener,
            file: None,
        }),
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
            // Abstract names belong to whoever binds first: say who that is.
            let holder = UnixStream::connect_addr(&addr).ok();
            Err(holder
                .and_then(|h| in_use(address, &h))
                .unwrap_or_else(|| io_err(address, "bind")(e)))
        }
        Err(e) => Err(io_err(address, "bind")(e)),
    }
}

/// Refuse a directory in which another user could replace the socket
/// between our bind and our chmod (or later). The directory itself is
/// looked up through symbolic links: only its own entries matter here.
fn check_directory(address: &str, dir: &Path) -> Result<(), SocketError> {
    let md = std::fs::metadata(dir).map_err(io_err(address, "inspect the socket's directory"))?;
    let me = wd_sys::geteuid();
    if md.uid() != me && md.uid() != 0 {
        return Err(SocketError::ForeignDirectory {
            address: address.to_string(),
            dir: dir.to_path_buf(),
            uid: md.uid(),
            me,
        });
    }
    let mode = md.mode() & 0o7777;
    // Sticky: others may add entries but not rename or remove ours.
    if mode & 0o022 != 0 && mode & 0o1000 == 0 {
        return Err(SocketError::OpenDirectory {
            address: address.to_string(),
            dir: dir.to_path_buf(),
            mode,
        });
    }
    Ok(())
}

/// Look at what sits at the socket path without following it: nothing and
/// a stale socket of ours are fine (the rename replaces it); anything else
/// is refused.
fn check_existing(address: &str, path: &Path) -> Result<(), SocketError> {
    let md = match std::fs::symlink_metadata(path) {
        Ok(md) => md,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err(address, "inspect the socket path")(e)),
    };
    let ft = md.file_type();
    if !ft.is_socket() {
        let kind = if ft.is_symlink() {
            "symbolic link"
        } else if ft.is_dir() {
            "directory"
        } else if ft.is_file() {
            "regular file"
        } else if ft.is_fifo() {
            "named pipe"
        } else {
            "device file"
        };
        return Err(SocketError::NotASocket {
            address: address.to_string(),
            kind,
        });
    }
    match UnixStream::connect(path) {
        Ok(holder) => Err(in_use(address, &holder).unwrap_or(SocketError::InUse {
            address: address.to_string(),
            uid: md.uid(),
            pid: 0,
        })),
        Err(e) if md.uid() != wd_sys::geteuid() => Err(SocketError::ForeignSocket {
            address: address.to_string(),
            uid: md.uid(),
            me: wd_sys::geteuid(),
            state: if e.kind() == io::ErrorKind::PermissionDenied {
                "this user may not connect to it, so a host may be serving it"
            } else {
                "no host answers on it"
            },
        }),
        // Nobody listens: a dead host's socket.
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Ok(()),
        Err(e) => Err(io_err(address, "tell whether a host is serving there")(e)),
    }
}

/// A directory only this user can enter, next to the socket path, removed
/// (with what is left in it) when dropped.
struct PrivateDir(PathBuf);

impl PrivateDir {
    fn create(address: &str, parent: &Path) -> Result<PrivateDir, SocketError> {
        static N: AtomicU32 = AtomicU32::new(0);
        loop {
            let p = parent.join(format!(
                ".wd-bind-{}-{}",
                wd_sys::getpid(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            // create, not create_all: an existing name (planted, or left by
            // a crashed host) is never reused.
            match std::fs::DirBuilder::new().mode(0o700).create(&p) {
                Ok(()) => return Ok(PrivateDir(p)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io_err(address, "create a private directory to bind in")(e)),
            }
        }
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.0.join("sock"));
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn bind_path(address: &str, mode: u32) -> Result<Bound, SocketError> {
    let path = PathBuf::from(address);
    let bad = |why| SocketError::BadAddress {
        address: address.to_string(),
        why,
    };
    // Bound in a short private directory and renamed into place, a longer
    // path would be served but unreachable: clients connect to the path
    // itself, and sun_path holds 107 bytes and the NUL.
    if address.len() > 107 {
        return Err(bad(
            "the path is longer than the 107 bytes a UNIX socket address holds (clients could not connect to it); choose a shorter path",
        ));
    }
    let name = path
        .file_name()
        .ok_or_else(|| bad("the path does not end in a file name"))?;
    let parent = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let path = parent.join(name);
    std::fs::create_dir_all(&parent).map_err(io_err(address, "create the socket's directory"))?;
    check_directory(address, &parent)?;
    check_existing(address, &path)?;
    // Bind and chmod where nobody else can reach, then move the finished
    // socket into place: rename replaces a stale socket (or anything that
    // appeared meanwhile) without following it.
    let private = PrivateDir::create(address, &parent)?;
    let staging = private.0.join("sock");
    let listener = UnixListener::bind(&staging).map_err(io_err(address, "bind"))?;
    std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(mode))
        .map_err(io_err(address, "set the socket's mode"))?;
    let md = std::fs::symlink_metadata(&staging).map_err(io_err(address, "inspect the socket"))?;
    std::fs::rename(&staging, &path).map_err(io_err(address, "move the socket into place"))?;
    drop(private);
    Ok(Bound {
        listener,
        file: Some(SocketFile {
            path,
            dev: md.dev(),
            ino: md.ino(),
        }),
    })
}

/// Who may use the host, decided from each peer's kernel-recorded
/// credentials, so it holds for abstract sockets (which have no file mode)
/// exactly as for path sockets.
///
/// A permission class admits when it has both read and write bits (a
/// connection is used both ways; a lone `w` or `r` admits nobody). Unlike
/// a file's permission check, the classes are tried in turn and any one
/// that matches the peer admits it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessPolicy {
    /// The configured socket mode.
    pub mode: u32,
    /// The host's effective uid (the owner class).
    pub uid: u32,
    /// The host's effective gid (the group class).
    pub gid: u32,
    /// Users admitted whatever the mode.
    pub allow_uids: Vec<u32>,
    /// Groups (primary or supplementary) admitted whatever the mode.
    pub allow_gids: Vec<u32>,
}

impl AccessPolicy {
    /// Whether a peer with these credentials and supplementary groups may
    /// use the host.
    pub fn admits(&self, peer: &PeerCred, groups: &[u32]) -> bool {
        let class = |shift: u32| (self.mode >> shift) & 0o6 == 0o6;
        let in_group = |gid: u32| peer.gid == gid || groups.contains(&gid);
        peer.uid == 0
            || (class(6) && peer.uid == self.uid)
            || (class(3) && in_group(self.gid))
            || class(0)
            || self.allow_uids.contains(&peer.uid)
            || self.allow_gids.iter().any(|&g| in_group(g))
    }

    /// The refusal a peer that [`AccessPolicy::admits`] turned away reads.
    pub fn refusal(&self, peer: &PeerCred) -> String {
        format!(
            "uid {} is not allowed by this host's access policy (mode {:04o}, host uid {}, gid {}, allow_uids {:?}, allow_gids {:?}); the host's owner can admit it with `wd serve --allow-uid {}`",
            peer.uid, self.mode, self.uid, self.gid, self.allow_uids, self.allow_gids, peer.uid
        )
    }
}

/// Decide a fresh connection: `Err` carries the message for the refused
/// peer. A peer whose credentials cannot be read is refused too.
pub(crate) fn admit(policy: &AccessPolicy, sock: &UnixStream) -> Result<(), String> {
    let peer = wd_sys::peer_cred(sock)
        .map_err(|e| format!("the host cannot read this connection's credentials: {e}"))?;
    // Without SO_PEERGROUPS (kernels before 4.13) only the primary group
    // counts.
    let groups = wd_sys::peer_groups(sock).unwrap_or_default();
    if policy.admits(&peer, &groups) {
        Ok(())
    } else {
        Err(policy.refusal(&peer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(mode: u32) -> AccessPolicy {
        AccessPolicy {
            mode,
            uid: 1000,
            gid: 100,
            allow_uids: vec![],
            allow_gids: vec![],
        }
    }

    fn peer(uid: u32, gid: u32) -> PeerCred {
        PeerCred { pid: 1, uid, gid }
    }

    #[test]
    fn classes_need_read_and_write() {
        let p = policy(0o600);
        assert!(p.admits(&peer(1000, 5), &[]));
        assert!(p.admits(&peer(0, 0), &[]));
        assert!(!p.admits(&peer(65534, 65534), &[]));
        assert!(!p.admits(&peer(2000, 100), &[]));
        let g = policy(0o660);
        assert!(g.admits(&peer(2000, 100), &[]));
        assert!(g.admits(&peer(2000, 5), &[7, 100]));
        assert!(!g.admits(&peer(2000, 5), &[7]));
        // A lone write (or read) bit admits nobody.
        assert!(!policy(0o622).admits(&peer(2000, 5), &[]));
        assert!(!policy(0o644).admits(&peer(2000, 5), &[]));
        assert!(policy(0o666).admits(&peer(2000, 5), &[]));
        assert!(!policy(0o000).admits(&peer(1000, 100), &[]));
    }

    #[test]
    fn allow_lists_admit_whatever_the_mode() {
        let mut p = policy(0o600);
        p.allow_uids = vec![65534];
        assert!(p.admits(&peer(65534, 65534), &[]));
        assert!(!p.admits(&peer(65533, 65534), &[]));
        p.allow_uids.clear();
        p.allow_gids = vec![42];
        assert!(p.admits(&peer(3000, 42), &[]));
        assert!(p.admits(&peer(3000, 1), &[42]));
        assert!(!p.admits(&peer(3000, 1), &[43]));
        let msg = policy(0o600).refusal(&peer(65534, 65534));
        assert!(msg.contains("uid 65534 is not allowed"), "{msg}");
        assert!(msg.contains("mode 0600"), "{msg}");
    }
}
