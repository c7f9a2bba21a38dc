//! Files and directories a command makes for its own use, removed however
//! it ends: an error returned half way, and (after
//! [`clean_up_on_signals`]) SIGINT or SIGTERM, which run no destructor.
//! Processes a command starts for itself (a host) are stopped then too.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// What a terminating signal removes and stops.
struct OnSignal {
    paths: Vec<PathBuf>,
    pids: Vec<u32>,
}

static ON_SIGNAL: Mutex<OnSignal> = Mutex::new(OnSignal {
    paths: Vec::new(),
    pids: Vec::new(),
});

fn on_signal() -> std::sync::MutexGuard<'static, OnSignal> {
    ON_SIGNAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn remove(p: &Path) {
    let _ = match p.is_dir() {
        true => std::fs::remove_dir_all(p),
        false => std::fs::remove_file(p),
    };
}

/// From now on, SIGINT and SIGTERM are taken by a thread that removes
/// the paths of every live [`Removed`] (and of [`remove_on_signal`]),
/// sends SIGTERM to the processes of [`stop_on_signal`], and exits as
/// the shell expects of a process a signal ended (128 + its number).
/// Without it, a `kill` left gigabytes of benchmark files behind, and
/// `wd chaos`'s host running. Call before any thread is started: threads
/// inherit the blocked signals (the children started by `Command` do
/// not: it clears the mask).
pub fn clean_up_on_signals() -> Result<(), String> {
    wd_sys::block_termination_signals().map_err(|e| format!("cannot take SIGINT/SIGTERM: {e}"))?;
    std::thread::Builder::new()
        .name("wd-signals".into())
        .spawn(|| {
            let sig = wd_sys::wait_termination();
            let (paths, pids) = {
                let mut g = on_signal();
                (std::mem::take(&mut g.paths), std::mem::take(&mut g.pids))
            };
            for pid in pids {
                let _ = wd_sys::terminate(pid);
            }
            for p in &paths {
                remove(p);
            }
            let name = if sig == wd_sys::SIGINT {
                "SIGINT"
            } else {
                "SIGTERM"
            };
            eprintln!("wd: stopped by {name}; its temporary files removed");
            // Other threads (an in-process host) still run: no atexit
            // handler may race them.
            wd_sys::exit_now(128 + sig);
        })
        .map_err(|e| format!("cannot take SIGINT/SIGTERM: {e}"))?;
    Ok(())
}

/// Remove `path` if a terminating signal ends the command (see
/// [`clean_up_on_signals`]); undone by [`forget_path`].
pub fn remove_on_signal(path: &Path) {
    on_signal().paths.push(path.to_path_buf());
}

/// Undo [`remove_on_signal`] (the command removed or keeps the path).
pub fn forget_path(path: &Path) {
    on_signal().paths.retain(|p| p != path);
}

/// Send SIGTERM to `pid`, a child not yet waited for, if a terminating
/// signal ends the command; undone by [`forget_pid`], which must come
/// before the child is waited for (its pid is then free for another).
pub fn stop_on_signal(pid: u32) {
    on_signal().pids.push(pid);
}

/// Undo [`stop_on_signal`].
pub fn forget_pid(pid: u32) {
    on_signal().pids.retain(|&p| p != pid);
}

/// Removes its paths when dropped: files, or directories with what they
/// hold. Removal is best effort (a path already gone is fine).
#[derive(Debug, Default)]
pub struct Removed(Vec<PathBuf>);

impl Removed {
    /// Remove `path` too, when dropped (or at a terminating signal).
    pub fn add(&mut self, path: PathBuf) {
        remove_on_signal(&path);
        self.0.push(path);
    }
}

impl Drop for Removed {
    fn drop(&mut self) {
        for p in &self.0 {
            remove(p);
            forget_path(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removes_files_and_directories() {
        let base = std::env::temp_dir().join(format!("wd-temp-test-{}", std::process::id()));
        std::fs::create_dir_all(base.join("d")).unwrap();
        std::fs::write(base.join("d/f"), b"x").unwrap();
        std::fs::write(base.join("f"), b"x").unwrap();
        let mut r = Removed::default();
        r.add(base.join("f"));
        r.add(base.join("d"));
        r.add(base.join("never-made"));
        assert!(on_signal().paths.contains(&base.join("d")));
        drop(r);
        assert!(!base.join("f").exists() && !base.join("d").exists());
        assert!(
            !on_signal().paths.iter().any(|p| p.starts_with(&base)),
            "removed, so forgotten by the signal thread"
        );
        std::fs::remove_dir_all(&base).unwrap();
    }
}
