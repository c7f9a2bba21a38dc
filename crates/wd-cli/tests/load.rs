//! `wd load` and `wd bench load` as a user runs them: checksums, handing
//! the buffer to a command, errors, the progress bar on a terminal, a
//! filesystem without O_DIRECT.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sha2::{Digest, Sha256};

/// A private directory for one test's files.
fn tempdir(tag: &str) -> wd_testutil::TempDir {
    wd_testutil::tempdir(&format!("wd-load-{tag}"))
}

fn file(dir: &Path, size: usize) -> (PathBuf, Vec<u8>, String) {
    let data: Vec<u8> = (0..size).map(|i| (i * 7 + i / 4096) as u8).collect();
    let p = dir.join("model.bin");
    let mut f = std::fs::File::create(&p).unwrap();
    f.write_all(&data).unwrap();
    f.sync_all().unwrap();
    let hex = Sha256::digest(&data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    (p, data, hex)
}

fn wd() -> Command {
    Command::new(env!("CARGO_BIN_EXE_wd"))
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr)
}

#[test]
fn json_report_and_checksums() {
    let d = tempdir("json");
    let (p, data, hex) = file(&d.0, (3 << 20) + 5);
    let o = wd()
        .args(["load", "--json", "--print-sha256", "--chunk", "1M"])
        .arg(&p)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["bytes"], data.len() as u64);
    assert_eq!(v["sha256"], hex.as_str());
    assert_eq!(v["chunk"], 1 << 20);
    assert!(v["mode"].as_str().unwrap().contains("I/O via"));
    assert!(["direct", "buffered"].contains(&v["io"].as_str().unwrap()));

    let o = wd()
        .arg("load")
        .arg(&p)
        .args(["--sha256", &hex])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("(verified)"), "{out}");
    assert!(out.contains("mode: "), "{out}");

    let wrong = "0".repeat(64);
    let o = wd()
        .arg("load")
        .arg(&p)
        .args(["--sha256", &wrong])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(text(&o).contains("SHA-256 mismatch"), "{}", text(&o));

    let o = wd()
        .arg("load")
        .arg(&p)
        .args(["--sha256", "xyz"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(text(&o).contains("64 hex digits"), "{}", text(&o));
}

#[test]
fn the_buffer_is_handed_to_a_command() {
    let d = tempdir("exec");
    let (p, _, _) = file(&d.0, 100_000);
    let script = format!(
        "head -c \"$WD_BUF_LEN\" /proc/self/fd/$WD_BUF_FD | cmp - '{}' && test -e /proc/self/fd/{{fd}} && test \"$WD_BUF_PAGES\" = 4k -o \"$WD_BUF_PAGES\" = 2m -o \"$WD_BUF_PAGES\" = 1g",
        p.display()
    );
    let o = wd()
        .arg("load")
        .arg(&p)
        .args(["--", "sh", "-c", &script])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    // The command's exit status is wd's.
    let o = wd()
        .arg("load")
        .arg(&p)
        .args(["--", "sh", "-c", "exit 3"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3));
    // A command a signal ended: 128 + the signal, as a shell says (it
    // was 1, whatever the signal).
    let o = wd()
        .arg("load")
        .arg(&p)
        .args(["--", "sh", "-c", "kill -TERM $$"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(143), "{}", text(&o));
    assert!(text(&o).contains("signal 15"), "{}", text(&o));
    // Read-only: the command cannot open the buffer for writing.
    let o = wd()
        .arg("load")
        .arg(&p)
        .args([
            "--read-only",
            "--",
            "sh",
            "-c",
            "echo x 1<>/proc/self/fd/$WD_BUF_FD",
        ])
        .output()
        .unwrap();
    assert!(!o.status.success(), "a write-sealed buffer was writable");
}

#[test]
fn errors_name_the_problem() {
    let o = wd()
        .args(["load", "/nonexistent/model.bin"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(text(&o).contains("No such file"), "{}", text(&o));
    let d = tempdir("err");
    let o = wd().arg("load").arg(&d.0).output().unwrap();
    assert!(text(&o).contains("is a directory"), "{}", text(&o));
    let o = wd()
        .args(["load", "/etc/hostname", "--gather", "12Q"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(text(&o).contains("is not a size"), "{}", text(&o));

    // The process heap's limit.
    let (big, _, _) = file(&d.0, 3 << 20);
    let o = wd()
        .arg("load")
        .arg(&big)
        .env("WD_HEAP_LIMIT", "1M")
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(text(&o).contains("heap limit of 1.00 MiB"), "{}", text(&o));

    // Unreadable: as an unprivileged user (root reads everything).
    let (p, _, _) = file(&d.0, 10);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut c = wd();
    c.arg("load").arg(&p);
    if wd_sys::geteuid() == 0 {
        c.uid(65534).gid(65534);
    } else {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o000)).unwrap();
    }
    let o = c.output().unwrap();
    assert!(!o.status.success());
    assert!(text(&o).contains("Permission denied"), "{}", text(&o));
}

#[test]
fn progress_bar_on_a_terminal() {
    let d = tempdir("tty");
    let (p, _, _) = file(&d.0, 2 << 20);
    // `script` gives the command a pseudo-terminal.
    let cmd = format!(
        "{} load --chunk 64K --depth 1 '{}'",
        env!("CARGO_BIN_EXE_wd"),
        p.display()
    );
    let o = match Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            wd_testutil::skip(
                "progress_bar_on_a_terminal",
                &format!("no `script` to make a terminal: {e}"),
            );
            return;
        }
    };
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("[##############################]"), "{t}");
    assert!(t.contains("2.00 MiB / 2.00 MiB"), "{t}");
    assert!(t.contains("/s"), "{t}");
}

#[test]
fn a_filesystem_without_direct_io_falls_back_or_fails_clearly() {
    let d = tempdir("ramfs");
    let (src, _, hex) = file(&d.0, (1 << 20) + 3);
    let mnt = d.0.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    // ramfs has no O_DIRECT; mount it in a private mount namespace.
    let script = format!(
        "mount -t ramfs ramfs '{m}' || exit 77; cp '{s}' '{m}/f'; \
         {wd} load --json --print-sha256 '{m}/f'; echo; {wd} load --io direct '{m}/f'; echo \"direct=$?\"",
        m = mnt.display(),
        s = src.display(),
        wd = env!("CARGO_BIN_EXE_wd"),
    );
    let o = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .output();
    let o = match o {
        Ok(o) if o.status.code() != Some(77) && o.status.success() => o,
        Ok(o) => {
            wd_testutil::skip(
                "a_filesystem_without_direct_io_falls_back_or_fails_clearly",
                &format!("cannot mount ramfs here: {}", text(&o).trim()),
            );
            return;
        }
        Err(e) => {
            wd_testutil::skip(
                "a_filesystem_without_direct_io_falls_back_or_fails_clearly",
                &format!("no unshare: {e}"),
            );
            return;
        }
    };
    let t = text(&o);
    let json_end = t.find("\n}").expect("json output") + 2;
    let v: serde_json::Value = serde_json::from_str(&t[..json_end]).unwrap();
    assert_eq!(v["io"], "buffered", "{t}");
    assert_eq!(v["sha256"], hex.as_str(), "{t}");
    assert!(
        v["notes"].as_array().unwrap().iter().any(|n| n
            .as_str()
            .unwrap()
            .contains("ramfs does not support direct I/O")),
        "{t}"
    );
    assert!(t.contains("does not support direct I/O (O_DIRECT)"), "{t}");
    assert!(t.contains("direct=1"), "{t}");
}

#[test]
fn bench_load_runs_on_tiny_files() {
    // Plumbing only (rows, verification, chart): no timing is asserted.
    let d = tempdir("bench");
    let svg = d.0.join("chart.svg");
    let o = wd()
        .args([
            "bench", "load", "--sizes", "64K,1M", "--reps", "1", "--json", "--dir",
        ])
        .arg(&d.0)
        .arg("--svg")
        .arg(&svg)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2 * 2 * 5, "sizes x cold/warm x methods");
    for m in [
        "normal",
        "memfd+direct",
        "single-direct",
        "overlapped",
        "device-limit",
    ] {
        assert!(rows.iter().any(|r| r["method"] == m), "{m}");
    }
    assert!(rows.iter().all(|r| r["seconds"].as_f64().unwrap() > 0.0));
    let chart = std::fs::read_to_string(&svg).unwrap();
    assert!(chart.starts_with("<svg") && chart.trim_end().ends_with("</svg>"));
    // The test files are gone unless --keep.
    assert!(std::fs::read_dir(&d.0).unwrap().all(|e| !e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .starts_with("wd-bench-load-")));
}
