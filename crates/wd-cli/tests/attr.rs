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
