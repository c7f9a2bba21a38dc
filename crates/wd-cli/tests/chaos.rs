//! `wd chaos` as a test: a few rounds of every client kind with random
//! kills and one host kill, and a short soak; both must find no wrong
//! data and no leak, and say what they checked.

use std::process::Command;

/// One chaos run at a time: each starts a host and several busy clients,
/// and two cores shared by three runs would test the machine's patience.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn chaos(args: &[&str]) -> serde_json::Value {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let out = Command::new(env!("CARGO_BIN_EXE_wd"))
        .arg("chaos")
        .args(args)
        .arg("--json")
        .output()
        .expect("run wd chaos");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "wd chaos {args:?} failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[test]
fn rounds_with_kills_and_a_host_restart_leak_nothing() {
    let v = chaos(&[
        "--rounds",
        "4",
        "--clients",
        "5",
        "--host-kill-every",
        "3",
        "--seed",
        "11",
    ]);
    assert_eq!(v["rounds"], 4);
    assert_eq!(v["host_kills"], 1);
    assert_eq!(v["leak_checks"], 4);
    assert!(v["requests_checked"].as_u64().unwrap() > 0, "{v}");
    assert!(v["clients_killed"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["failures"].as_array().unwrap().len(), 0, "{v}");
}

#[test]
fn a_short_soak_samples_the_host() {
    let v = chaos(&[
        "--soak",
        "3s",
        "--interval",
        "1",
        "--clients",
        "5",
        "--seed",
        "12",
    ]);
    let samples = v["samples"].as_array().unwrap();
    assert!(samples.len() >= 2, "{v}");
    for s in samples {
        assert!(s["rss_bytes"].as_u64().unwrap() > 0, "{s}");
        assert!(s["fds"].as_u64().unwrap() > 0, "{s}");
    }
    assert!(samples
        .iter()
        .any(|s| s["requests_per_sec"].as_f64().unwrap() > 0.0));
    assert_eq!(v["failures"].as_array().unwrap().len(), 0, "{v}");
}

/// The host killed and restarted every half second under load: every
/// client carries on (the client library makes its queues again; NVMe
/// clients bring their controller up again), nothing leaks.
#[test]
fn clients_carry_on_through_host_restarts() {
    let v = chaos(&[
        "--soak",
        "3s",
        "--interval",
        "1",
        "--clients",
        "5",
        "--host-restart-every",
        "0.5",
        "--seed",
        "13",
    ]);
    assert!(v["host_restarts"].as_u64().unwrap() >= 4, "{v}");
    assert_eq!(v["failures"].as_array().unwrap().len(), 0, "{v}");
}

#[test]
fn unknown_kinds_are_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_wd"))
        .args(["chaos", "--kinds", "copy-shared,teleport"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown kind 'teleport'"));
}

/// A `wd chaos` ended by SIGTERM (a `kill`, not the terminal's Ctrl-C,
/// which reaches its host too) stops its host and removes its work
/// directory, and exits as a process the signal ended (143). The host
/// went on running, re-parented to init, and the directory stayed: a
/// signal runs no destructor.
#[test]
fn a_chaos_run_ended_by_a_signal_stops_its_host_and_removes_its_directory() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = wd_testutil::tempdir("wd-chaos-signal");
    let mut child = Command::new(env!("CARGO_BIN_EXE_wd"))
        .args(["chaos", "--rounds", "1000", "--clients", "1"])
        .args(["--kinds", "copy-shared", "--host-kill-every", "0"])
        .env("TMPDIR", tmp.path())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let dir = tmp.path().join(format!("wd-chaos-{}", child.id()));
    let socket = dir.join("wd.sock");
    let t = std::time::Instant::now();
    while !socket.exists() {
        assert!(
            t.elapsed().as_secs() < 20,
            "no host socket at {}",
            socket.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // The host: the process whose command line names the socket.
    let needle = socket.display().to_string();
    let host = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&needle))
        })
        .expect("the chaos host");
    std::thread::sleep(std::time::Duration::from_millis(300));
    wd_sys::terminate(child.id()).unwrap();
    let st = child.wait().unwrap();
    let t = std::time::Instant::now();
    while std::path::Path::new(&format!("/proc/{host}")).exists() && t.elapsed().as_secs() < 10 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let host_lives = std::path::Path::new(&format!("/proc/{host}")).exists();
    if host_lives {
        let _ = Command::new("kill")
            .args(["-9", &host.to_string()])
            .status();
    }
    assert_eq!(st.code(), Some(143), "exit status after SIGTERM: {st}");
    assert!(!host_lives, "the chaos host {host} outlived its run");
    assert!(!dir.exists(), "{} left behind", dir.display());
}
