//! `wd bench zip` end to end on a small corpus: every path measured, in
//! JSON, and `--no-svg` writes no chart.

mod common;
use common::wd;
use wd_testutil::tempdir;

#[test]
fn bench_zip_measures_every_path_and_writes_no_chart_when_asked() {
    let dir = tempdir("wd-bench-zip");
    let svg = dir.path().join("chart.svg");
    let svg = svg.to_str().unwrap();
    let sources = env!("CARGO_MANIFEST_DIR");
    let args = [
        "bench",
        "zip",
        "--corpus",
        "1M",
        "--configs",
        "zlib:1,zstd:1",
        "--reps",
        "1",
        "--no-programs",
        "--sources",
        sources,
        "--svg",
        svg,
        "--no-svg",
        "--json",
    ];
    let out = wd(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    for path in ["cpu", "stock", "sync", "async", "auto"] {
        assert!(
            rows.iter()
                .any(|r| r["path"] == path && r["compress_mb_s"].as_f64().unwrap() > 0.0),
            "{path}: {v}"
        );
    }
    assert!(v["svg"].is_null(), "{v}");
    assert!(!std::path::Path::new(svg).exists());
    // Without --no-svg the chart is written.
    let out = wd(&args[..args.len() - 2]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(std::fs::read_to_string(svg).unwrap().starts_with("<svg"));
}
