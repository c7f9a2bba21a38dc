//! `wd attr set` against a `wd serve` process: a namespace file named
//! relative to where the command runs is made there (the host, refusing
//! a relative path, would resolve it in its own directory).

mod common;
use common::HostProc;
use wd_testutil::tempdir;

#[test]
fn a_relative_namespace_path_is_the_callers() {
    let hd = tempdir("wd-attr-host");
    let first = hd.join("first.img");
    let spec = format!("nvme:ns={first}:0:4M");
    let h = HostProc::serve_in(hd, &["--device", &spec]);
    let cwd = tempdir("wd-attr-cwd");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_wd"))
        .args([
            "--host",
            &h.socket,
            "attr",
            "set",
            "dev0/nvme/add_namespace",
            "second.img:0:4M",
        ])
        .current_dir(cwd.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(cwd.path().join("second.img").exists());
    let listed = h.conn().attrs("dev0/nvme/").unwrap();
    assert!(
        listed.iter().any(|a| a.value.contains("second.img")),
        "{listed:?}"
    );
}

/// A path the protocol cannot carry names no attribute, said as for any
/// other missing one (not as a protocol error).
#[test]
fn an_empty_path_is_no_attribute_like_any_other() {
    let h = HostProc::serve_in(tempdir("wd-attr-host"), &["--device", "dummy"]);
    let run = |args: &[&str]| {
        let out = common::wd(&[&["--host", &h.socket][..], args].concat());
        assert!(!out.status.success(), "{args:?} succeeded");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert_eq!(
        run(&["attr", "get", "nonexistent"]),
        "wd: no attribute 'nonexistent'\n"
    );
    assert_eq!(run(&["attr", "get", ""]), "wd: no attribute ''\n");
    let long = "a".repeat(300);
    assert_eq!(
        run(&["attr", "get", &long]),
        format!("wd: no attribute '{long}'\n")
    );
    assert_eq!(
        run(&["attr", "set", "nonexistent", "1"]),
        "wd: no writable attribute 'nonexistent'\n"
    );
    assert_eq!(
        run(&["attr", "set", "", "1"]),
        "wd: no writable attribute ''\n"
    );
}
