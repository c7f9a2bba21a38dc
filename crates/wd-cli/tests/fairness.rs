//! `wd bench fairness` against a `wd serve` process, on both devices it
//! floods (the zip device compressing and decompressing, long enough for
//! the device to cut each request): rows for each number of flooders, in
//! JSON, and a bad flood named in the error.

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
        &[
            "--device",
            "zip",
            "--flood-bytes",
            "8M",
            "--zip-flood",
            "zlib:1",
            "--zip-decompress",
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
        assert_eq!(
            v["zip_decompress"],
            extra.contains(&"--zip-decompress"),
            "{v}"
        );
        assert!(
            rows[1]["flood_bytes_per_sec"].as_f64().unwrap() > 0.0,
            "{v}"
        );
    }
    let out = wd(&["bench", "fairness", "--host", &h.socket, "--zip-decompress"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--zip-decompress needs --device zip"), "{err}");
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
