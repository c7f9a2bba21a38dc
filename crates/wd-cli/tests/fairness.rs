//! `wd bench fairness` against a `wd serve` process, on both devices it
//! floods: rows for each number of flooders, in JSON, and a bad flood
//! named in the error.

mod common;
use common::{wd, HostProc};
use wd_testutil::tempdir;

#[test]
fn fairness_rows_for_copies_and_compressions() {
    let h = HostProc::serve_in(
        tempdir("wd-fair"),
        &["--device", "dummy", "--device", "zip"],
    );
    for extra in [
        &["--device", "memcpy", "--flood-bytes", "1M"][..],
        &[
            "--device",
            "zip",
            "--flood-bytes",
            "256K",
            "--zip-flood",
            "gzip:6",
        ][..],
    ] {
        let mut args = vec![
            "bench",
            "fairness",
            "--host",
            &h.socket,
            "--flooders",
            "0,1",
            "--reps",
            "1",
            "--seconds",
            "0.2",
            "--json",
        ];
        args.extend_from_slice(extra);
        let out = wd(&args);
        assert!(
            out.status.success(),
            "{extra:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let rows = v["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 2, "{v}");
        assert!(
            rows.iter().all(|r| r["requests"].as_u64().unwrap() > 0),
            "{v}"
        );
        assert_eq!(v["device"], extra[1], "{v}");
    }
    let out = wd(&[
        "bench",
        "fairness",
        "--host",
        &h.socket,
        "--device",
        "zip",
        "--zip-flood",
        "gzip:99",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--zip-flood") && err.contains("gzip:99"),
        "{err}"
    );
}
