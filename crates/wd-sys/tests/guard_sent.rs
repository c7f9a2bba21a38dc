//! The SIGBUS guard against signals sent by another process (kill -BUS):
//! they go where they went before the guard, and the guard stays for the
//! faults it absorbs.

use std::os::fd::AsFd;
use std::process::Command;

const ROLE: &str = "WD_TEST_GUARD_CHILD";
const NAME: &str = "a_sent_sigbus_that_was_ignored_keeps_the_guard";

/// A process that starts with SIGBUS ignored (a disposition inherited
/// across exec: `trap '' BUS`, `nohup`-style launchers, some service
/// managers) installs the guard; the handler saves SIG_IGN as "the
/// disposition found at install". Then one SIGBUS *sent* by a process
/// (si_code <= 0, `kill -BUS`) goes to `pass_on`, which puts SIG_IGN back
/// for good (sigaction) and re-sends the signal, which is ignored. From
/// then on no guarded section protects anything: the next hole a client
/// punches in a hugetlb share makes a guarded touch a SIGBUS with SIG_IGN,
/// which the kernel turns into a kill.
#[test]
fn a_sent_sigbus_that_was_ignored_keeps_the_guard() {
    if std::env::var_os(ROLE).is_some() {
        child();
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("sh")
        .arg("-c")
        .arg("trap '' BUS; exec \"$0\" --exact \"$1\" --nocapture --test-threads=1")
        .arg(&exe)
        .arg(NAME)
        .env(ROLE, "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.contains("second fault absorbed"),
        "the child (SIGBUS ignored at start) died or failed: {:?}\n{stderr}",
        out.status
    );
}

const NAME2: &str = "a_sent_sigbus_passed_to_the_runtimes_handler_keeps_the_guard";

/// The usual case: a Rust host. At startup the Rust runtime installs its
/// own SIGBUS handler (stack-overflow detection); the guard saves it as
/// the previous disposition. A SIGBUS sent by a process (`kill -BUS`) is
/// passed on to that handler, which, the address not being a guard page,
/// resets SIGBUS to SIG_DFL and returns. The process lives on, but the
/// guard's handler is gone: the next fault a guarded section should absorb
/// (a client's punched hole on hugetlb) kills the host.
#[test]
fn a_sent_sigbus_passed_to_the_runtimes_handler_keeps_the_guard() {
    if std::env::var_os(ROLE).is_some() {
        child();
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(&exe)
        .args(["--exact", NAME2, "--nocapture", "--test-threads=1"])
        .env(ROLE, "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.contains("second fault absorbed"),
        "the child died or failed: {:?}\n{stderr}",
        out.status
    );
}

fn child() {
    wd_sys::guard::install().unwrap();
    // Three pages mapped of a one-page memfd: the second and third fault.
    let fd = wd_sys::memfd_create("guard-sent", false).unwrap();
    wd_sys::ftruncate(fd.as_fd(), 4096).unwrap();
    let map = wd_sys::Mapping::map_shared(fd.as_fd(), 0, 3 * 4096).unwrap();
    // The bytes read are looked at: a copy into a buffer nobody reads may
    // be left out by the compiler, and with it the fault (as it was once
    // copy_out was inlined here).
    let mut b = [1u8; 8];
    let (r, f) = wd_sys::guard::guarded(|| map.copy_out(4096, &mut b));
    assert!(r.is_ok() && f.is_some(), "first guarded fault: {r:?} {f:?}");
    assert_eq!(
        std::hint::black_box(b),
        [0; 8],
        "a replaced page reads zeros"
    );
    eprintln!("first fault absorbed");
    // Someone sends SIGBUS (ignored, as it was before the guard).
    let st = Command::new("kill")
        .args(["-BUS", &std::process::id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    std::thread::sleep(std::time::Duration::from_millis(200));
    eprintln!("sent SIGBUS ignored");
    b = [1; 8];
    let (r, f) = wd_sys::guard::guarded(|| map.copy_out(2 * 4096, &mut b));
    assert!(
        r.is_ok() && f.is_some(),
        "second guarded fault: {r:?} {f:?}"
    );
    assert_eq!(
        std::hint::black_box(b),
        [0; 8],
        "a replaced page reads zeros"
    );
    eprintln!("second fault absorbed");
}
