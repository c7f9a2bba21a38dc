//! What every integration test of `wd` needs, written once: a private
//! directory (from wd-testutil) and a `wd serve` process, both gone when
//! the test ends, pass or fail.

// Each test binary compiles this module and uses a part of it.
#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use wrapdrive::HostConn;

// Directories and waiting: wd-testutil, every crate's.
use wd_testutil::{wait_until, TempDir};

/// A `wd serve` process, killed on drop (before its directory goes).
pub struct HostProc {
    child: Child,
    /// The address it listens on.
    pub socket: String,
    _dir: Option<TempDir>,
}

/// `wd ARGS...`, run to its end.
pub fn wd(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_wd"))
        .args(args)
        .output()
        .expect("run wd")
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
