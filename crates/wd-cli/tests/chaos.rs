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
