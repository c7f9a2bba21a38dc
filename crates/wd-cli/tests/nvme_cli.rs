//! `wd nvme perf` against a `wd serve` process: arguments no command can
//! carry are refused naming the argument, whatever their size.

mod common;
use common::{wd, HostProc};
use wd_testutil::tempdir;

#[test]
fn perf_refuses_a_block_size_over_the_transfer_limit_before_allocating() {
    let dir = tempdir("wd-nvme-cli");
    let spec = format!("nvme:ns={}:0:4M", dir.join("ns.img"));
    let h = HostProc::serve_in(dir, &["--device", &spec]);
    for bs in ["1M", "1G", "1T"] {
        let out = wd(&[
            "--host", &h.socket, "nvme", "perf", "--bs", bs, "--time", "0.1",
        ]);
        assert!(!out.status.success(), "--bs {bs} ran");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("a command moves at most 262144 bytes"),
            "--bs {bs}: {err}"
        );
    }
}
