//! `wd faults` and the IOMMU attributes, against a `wd serve` process: a
//! client's fault is visible to another process of the same user without
//! being consumed, and the queue's IOMMU state shows in the attribute tree.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use wrapdrive::dummy::CopyMsg;
use wrapdrive::{Capability, FaultPolicy, HostConn, InvalidationMode, SharedBuf};

struct Host {
    child: Child,
    dir: std::path::PathBuf,
    socket: String,
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn host() -> Host {
    let dir = std::env::temp_dir().join(format!("wd-iommu-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("wd.sock").to_string_lossy().into_owned();
    let child = Command::new(env!("CARGO_BIN_EXE_wd"))
        .args(["serve", "--socket", &socket, "--device", "dummy"])
        .stderr(Stdio::null())
        .spawn()
        .expect("start wd serve");
    let t = Instant::now();
    while HostConn::connect(&socket).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "host did not come up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Host { child, dir, socket }
}

fn wd(socket: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_wd"))
        .arg("--host")
        .arg(socket)
        .args(args)
        .output()
        .expect("run wd");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn faults_and_iommu_attributes_from_the_cli() {
    let h = host();
    let conn = HostConn::connect(&h.socket).unwrap();
    let mut q = conn.request_queue(&Capability::new("memcpy")).unwrap();
    let src = SharedBuf::new(8192).unwrap();
    let dst = SharedBuf::new(8192).unwrap();
    q.share(src.addr(), src.len()).unwrap();
    q.set_iommu_policy(InvalidationMode::Deferred, FaultPolicy::Abort)
        .unwrap();
    let d = q
        .call(
            CopyMsg {
                src: src.addr(),
                dst: dst.addr(),
                len: 100,
            }
            .to_desc(0),
        )
        .unwrap();
    assert_eq!(d.status, -14);
    let id = q.id().to_string();
    let (ok, out, err) = wd(&h.socket, &["faults", &id, "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["total"], 1);
    assert_eq!(v["events"][0]["access"], "write");
    assert_eq!(v["events"][0]["reason"], "unmapped");
    assert_eq!(v["events"][0]["iova"], format!("{:#x}", dst.addr()));
    // Not consumed: the owner still reads it.
    assert_eq!(q.faults(8).unwrap().events.len(), 1);
    let (ok, out, _) = wd(&h.socket, &["faults", &id]);
    assert!(ok);
    assert!(out.contains("1 fault(s) recorded"), "{out}");
    // No such queue: a clear error.
    let (ok, _, err) = wd(&h.socket, &["faults", "999999"]);
    assert!(!ok);
    assert!(err.contains("no queue 999999"), "{err}");
    // The IOMMU state in the tree.
    let (ok, out, _) = wd(&h.socket, &["ls"]);
    assert!(ok);
    for line in [
        "mode = deferred",
        "fault_policy = abort",
        "attached = own",
        "syncs",
    ] {
        assert!(out.contains(line), "{line} in:\n{out}");
    }
}
