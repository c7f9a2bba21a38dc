//! `wd top` against a `wd serve` process: a queue doing work shows up with
//! a nonzero rate and its client's p99 latency in the NDJSON snapshots, and a missing host is an error
//! with a message, not an empty view.

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use wd_dummy_msg::CopyMsg;
use wrapdrive::{Capability, SharedBuf};

mod common;
use common::{wd, HostProc};
use wd_testutil::tempdir;

#[test]
fn top_json_snapshots_show_a_busy_queue() {
    let h = HostProc::serve_in(tempdir("wd-top"), &["--device", "dummy"]);
    let conn = h.conn();
    let mut q = conn.request_queue(&Capability::new("memcpy")).unwrap();
    let id = q.id();
    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let src = SharedBuf::new(4096).unwrap();
            let dst = SharedBuf::new(4096).unwrap();
            q.share(src.addr(), src.len()).unwrap();
            q.share(dst.addr(), dst.len()).unwrap();
            let msg = CopyMsg {
                src: src.addr(),
                dst: dst.addr(),
                len: 4096,
            };
            while !stop.load(Ordering::Relaxed) {
                assert_eq!(q.call(msg.to_desc(0)).unwrap().status, 0);
            }
        })
    };
    let out = wd(&[
        "--host",
        &h.socket,
        "top",
        "--json",
        "--iterations",
        "2",
        "--interval",
        "0.2",
    ]);
    stop.store(true, Ordering::Relaxed);
    worker.join().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    for v in &lines {
        assert_eq!(v["host_pid"], h.pid());
        let dev = &v["devices"][0];
        assert_eq!(dev["name"], "dev0");
        assert_eq!(dev["driver"], "dummy");
        assert!(dev["requests_per_s"].as_f64().unwrap() > 0.0, "{v}");
        assert!(dev["bytes_per_s"].as_f64().unwrap() > 0.0, "{v}");
        let q = &dev["queues"][0];
        assert_eq!(q["id"], id);
        assert_eq!(q["pid"], std::process::id());
        assert!(q["requests_per_s"].as_f64().unwrap() > 0.0, "{v}");
        // The client library's sampled round trips: a copy of 4 KiB takes
        // more than nothing and (even on a loaded machine) under a second.
        let p99 = q["p99_latency_us"]
            .as_f64()
            .expect("a p99 for a busy queue");
        assert!(p99 > 0.0 && p99 < 1e6, "{v}");
    }
}

#[test]
fn top_against_a_missing_host_is_an_error() {
    let dir = tempdir("wd-top-missing");
    let sock = dir.0.join("nobody.sock");
    let out = wd(&["--host", sock.to_str().unwrap(), "top", "--json"]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot reach the host"), "{err}");
}

#[test]
fn top_ends_with_an_error_when_the_host_goes_away() {
    let h = HostProc::serve_in(tempdir("wd-top-gone"), &["--device", "dummy"]);
    let top = Command::new(env!("CARGO_BIN_EXE_wd"))
        .args(["--host", &h.socket, "top", "--interval", "0.1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run wd top");
    // Long enough for a few refreshes even on a loaded machine.
    std::thread::sleep(std::time::Duration::from_millis(1000));
    drop(h);
    let out = top.wait_with_output().unwrap();
    assert!(!out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("dev0"), "{stdout}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("lost the connection to the host"), "{err}");
}
