//! Helpers shared by WrapDrive's tests.
//!
//! A test that needs what the machine lacks (root, a hugetlb pool, a C
//! compiler) must not pass silently: it says so on stderr and appends a
//! line to `$WD_SKIP_LOG`, which `scripts/test-all.sh` counts by reason.
//!
//! Besides: private temporary directories, waiting for a condition with a
//! deadline, re-running the test binary as another process in a "role" (a
//! client to kill, a host to lose), and client memory for driving a device
//! without a host ([`dma::FlatMemory`]), and compressible test data
//! ([`text`]), written once.
#![deny(unsafe_code)]

pub mod dma;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// `len` bytes of seeded, compressible data for compression tests: the
/// project's words, one step in five a random byte instead.
pub fn text(len: usize, seed: u32) -> Vec<u8> {
    let words: [&[u8]; 6] = [
        b"queue ",
        b"domain ",
        b"IOVA ",
        b"engine ",
        b"session ",
        b"\n",
    ];
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        if x % 5 == 0 {
            out.push(x as u8);
        } else {
            out.extend_from_slice(words[x as usize % words.len()]);
        }
    }
    out.truncate(len);
    out
}

/// A seeded generator (xorshift64): random cases a seed reproduces.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// The generator of `seed` (any value: zero would stay zero, so the
    /// low bit is set).
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A value below `n` (not 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// One of `xs` (not empty).
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
}

/// `n` seeded bytes that look random (xorshift): data for ciphers, and
/// incompressible data for compression tests.
pub fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng::new(seed);
    (0..n).map(|_| (r.next_u64() >> 24) as u8).collect()
}

/// Report that `test` did not run, and why.
pub fn skip(test: &str, reason: &str) {
    eprintln!("skip: {test}: {reason}");
    if let Some(path) = std::env::var_os("WD_SKIP_LOG") {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            // One write per line: O_APPEND keeps parallel tests' lines whole.
            let _ = f.write_all(format!("{test}: {reason}\n").as_bytes());
        }
    }
}

/// A binding's idea of a C library's layout against its installed header:
/// a C program including `header` prints each expression of `want`
/// (`offsetof`, `sizeof`, constants; as `size_t`), which must equal the
/// value the binding assumes. Skipped (and counted) without the header or
/// a C compiler.
pub fn check_c_layout(test: &str, header: &str, want: &[(&str, usize)]) {
    let path = Path::new("/usr/include").join(header);
    if !path.exists() {
        skip(test, &format!("no {}", path.display()));
        return;
    }
    let dir = tempdir("c-layout");
    let src = dir.join("layout.c");
    let bin = dir.join("layout");
    let mut c = format!(
        "#include <stdio.h>\n#include <stddef.h>\n#include <{header}>\nint main(void) {{\n"
    );
    for (expr, _) in want {
        c.push_str(&format!("    printf(\"%zu\\n\", (size_t)({expr}));\n"));
    }
    c.push_str("    return 0;\n}\n");
    std::fs::write(&src, c).expect("writing the C program");
    let cc = match Command::new("cc").args([&src, "-o", &bin]).output() {
        Ok(o) => o,
        Err(e) => {
            skip(test, &format!("no C compiler: {e}"));
            return;
        }
    };
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let out = Command::new(&bin).output().expect("running the C program");
    let got: Vec<usize> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.parse().expect("a number"))
        .collect();
    assert_eq!(got.len(), want.len());
    for ((expr, mine), theirs) in want.iter().zip(got) {
        assert_eq!(*mine, theirs, "{expr}: binding {mine}, header {theirs}");
    }
}

/// Whether this process runs as root (by the owner of /proc/self, which
/// needs no unsafe call).
pub fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// True when running as root; otherwise report `test` skipped (`why`
/// says what it needs root for) and return false.
pub fn root_or_skip(test: &str, why: &str) -> bool {
    if is_root() {
        return true;
    }
    skip(test, &format!("needs root {why}"));
    false
}

/// A directory removed with its contents on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// `NAME` inside it, as a string (socket addresses are strings).
    pub fn join(&self, name: &str) -> String {
        self.0.join(name).to_string_lossy().into_owned()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A name unique per process and call, so tests running in parallel (and
/// test binaries running at once) never share one.
pub fn unique(name: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A new directory `base/NAME-PID-N` with permission bits `mode`; a
/// leftover of an earlier run with the same name is removed first.
pub fn tempdir_in(base: &Path, name: &str, mode: u32) -> TempDir {
    use std::os::unix::fs::PermissionsExt;
    let p = base.join(unique(name));
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

/// A listener at `path` whose accept queue is full (nobody accepts), and
/// the connections that filled it: the next connect waits, as at a
/// stopped host whose queue the clients that gave up on it fill.
pub fn full_listener(path: impl AsRef<Path>) -> (UnixListener, Vec<UnixStream>) {
    let path = path.as_ref();
    let listener = UnixListener::bind(path).unwrap();
    let mut held = Vec::new();
    let full = loop {
        match wd_sys::connect_unix(
            path.as_os_str().as_encoded_bytes(),
            false,
            Duration::from_millis(20),
        ) {
            Ok(s) => held.push(s),
            Err(e) => break e,
        }
        assert!(held.len() < 10_000, "the accept queue never filled");
    };
    assert_eq!(full.errno(), EAGAIN, "{full}");
    (listener, held)
}

/// What a connect to a full accept queue fails with.
const EAGAIN: i32 = 11;

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

/// Wait until every thread of process `pid` has stopped (state `T`, after
/// a SIGSTOP): kill(2) returns before they have, and a thread still
/// running may yet answer a request the test expects to go unanswered.
pub fn wait_stopped(pid: i32) {
    let dir = format!("/proc/{pid}/task");
    wait_until("every thread stopped", || {
        let Ok(tasks) = std::fs::read_dir(&dir) else {
            return false;
        };
        tasks.flatten().all(|t| {
            std::fs::read_to_string(t.path().join("stat")).is_ok_and(|s| {
                s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with(['T', 't'])
            })
        })
    });
}

/// The environment variable naming the role of a re-run test binary.
pub const ROLE_ENV: &str = "WD_TEST_ROLE";

/// The environment variable giving a serving role its socket.
pub const SOCKET_ENV: &str = "WD_TEST_HOST_SOCKET";

/// The socket this process serves on, in a role started by
/// [`Role::serving`].
pub fn role_socket() -> String {
    std::env::var(SOCKET_ENV).expect("a serving role is given its socket")
}

/// Return when the process that started this one is gone: a role that
/// serves (a host) lives as long as its test, however the test ends.
pub fn while_parent_lives() {
    let parent = std::os::unix::process::parent_id();
    while std::os::unix::process::parent_id() == parent {
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The role this process was started in by [`Role::command`], if any. A
/// test binary that uses roles has a test named `child_entry` that returns
/// at once when this is `None` and otherwise plays the role.
pub fn role() -> Option<String> {
    std::env::var(ROLE_ENV).ok()
}

/// Tell the parent something: one "WD:" line on stdout (libtest prints
/// its own lines around it), flushed at once.
pub fn report(what: &str) {
    let out = std::io::stdout();
    let mut out = out.lock();
    writeln!(out, "WD:{what}").unwrap();
    out.flush().unwrap();
}

/// This test binary re-run as another process playing a role (its
/// `child_entry` test), killed and reaped on drop.
pub struct Role {
    /// The process.
    pub child: Child,
    out: Option<BufReader<ChildStdout>>,
}

impl Role {
    /// The command that re-runs this test binary in `role`, stdout piped;
    /// add environment, stdin or credentials, then [`Role::spawn`] it.
    pub fn command(role: &str) -> Command {
        let mut c = Command::new(std::env::current_exe().unwrap());
        c.args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
            .env(ROLE_ENV, role)
            .stdout(Stdio::piped());
        c
    }

    /// This test binary re-run in `role` to serve on `socket` (its
    /// `child_entry` finds it with [`role_socket`]), returned once the
    /// socket accepts connections.
    pub fn serving(role: &str, socket: &str) -> Role {
        let _ = std::fs::remove_file(socket);
        let mut c = Role::command(role);
        c.env(SOCKET_ENV, socket).stdout(Stdio::null());
        let r = Role::spawn(c);
        wait_until(&format!("the {role} to serve on {socket}"), || {
            std::os::unix::net::UnixStream::connect(socket).is_ok()
        });
        r
    }

    /// Start `c` (from [`Role::command`]).
    pub fn spawn(mut c: Command) -> Role {
        let mut child = c.spawn().expect("re-run the test binary in a role");
        let out = child.stdout.take().map(BufReader::new);
        Role { child, out }
    }

    /// The rest of the child's next "WD:" line; the reader stays alive, so
    /// the child never writes into a closed pipe.
    pub fn read_report(&mut self) -> String {
        let out = self.out.as_mut().expect("the role's stdout is piped");
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                out.read_line(&mut line).unwrap() > 0,
                "child exited without reporting"
            );
            // libtest may print "test child_entry ... " on the same line.
            if let Some((_, rest)) = line.trim_end().split_once("WD:") {
                return rest.to_string();
            }
        }
    }

    /// Its process id.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn skips_are_logged() {
        let p = std::env::temp_dir().join(format!("wd-skip-{}", std::process::id()));
        // Only this test sets the variable in this process.
        std::env::set_var("WD_SKIP_LOG", &p);
        super::skip("t", "no reason");
        std::env::remove_var("WD_SKIP_LOG");
        let text = std::fs::read_to_string(&p).unwrap();
        let _ = std::fs::remove_file(&p);
        assert_eq!(text, "t: no reason\n");
    }

    #[test]
    fn tempdirs_are_private_and_removed() {
        let p = {
            let d = super::tempdir_in(&std::env::temp_dir(), "wd-testutil", 0o700);
            let d2 = super::tempdir_in(&std::env::temp_dir(), "wd-testutil", 0o700);
            assert_ne!(d.path(), d2.path());
            assert!(d.path().is_dir());
            d.path().to_path_buf()
        };
        assert!(!p.exists());
    }
}
