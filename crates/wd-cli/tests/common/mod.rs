//! What every integration test of `wd` needs, written once: a private
//! directory and a `wd serve` process, both gone when the test ends, pass
//! or fail.

// Each test binary compiles this module and uses a part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use wrapdrive::HostConn;

/// A directory removed with its contents on drop.
pub struct TempDir(pub PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A new directory `base/NAME-PID-N` with permission bits `mode`: unique
/// per process and call, so tests running in parallel never share one; a
/// leftover of an earlier run with the same name is removed first.
pub fn tempdir_in(base: &Path, name: &str, mode: u32) -> TempDir {
    use std::os::unix::fs::PermissionsExt;
    static N: AtomicU32 = AtomicU32::new(0);
    let p = base.join(format!(
        "{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    TempDir(p)
}

/// A new directory in the temp directory, open to other users (0755): the
/// tests that run a client as another uid need to reach what is inside.
pub fn tempdir(name: &str) -> TempDir {
    tempdir_in(&std::env::temp_dir(), name, 0o755)
}

/// Poll `f` every 20 ms until it holds; fail the test after 10 s (a
/// condition that never comes must not hang the suite).
pub fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A `wd serve` process, killed on drop (before its directory goes).
pub struct HostProc {
    child: Child,
    /// The address it listens on.
    pub socket: String,
    _dir: Option<TempDir>,
}

impl HostProc {
    /// `wd serve --socket SOCKET ARGS...`, returned once it accepts
    /// connections (a test that connected too early would fail for the
    /// wrong reason).
    pub fn serve(socket: &str, args: &[&str]) -> HostProc {
        let child = Command::new(env!("CARGO_BIN_EXE_wd"))
            .args(["serve", "--socket", socket])
            .args(args)
            .stderr(Stdio::null())
            .spawn()
            .expect("start wd serve");
        let host = HostProc {
            child,
            socket: socket.to_string(),
            _dir: None,
        };
        wait_until("wd serve to accept connections", || {
            HostConn::connect(socket).is_ok()
        });
        host
    }

    /// [`HostProc::serve`] on `dir/wd.sock`; the directory goes with the host.
    pub fn serve_in(dir: TempDir, args: &[&str]) -> HostProc {
        let socket = dir.0.join("wd.sock").to_string_lossy().into_owned();
        let mut host = HostProc::serve(&socket, args);
        host._dir = Some(dir);
        host
    }

    /// A new connection to the host.
    pub fn conn(&self) -> Arc<HostConn> {
        HostConn::connect(&self.socket).expect("connect")
    }

    /// The host's process id.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

impl Drop for HostProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
