//! `wd faults` and the IOMMU attributes, against a `wd serve` process: a
//! client's fault is visible to another process of the same user without
//! being consumed, and the queue's IOMMU state shows in the attribute tree.

use std::process::Command;

use wd_dummy_msg::CopyMsg;
use wrapdrive::{Capability, FaultPolicy, HostConn, InvalidationMode, SharedBuf};

mod common;
use common::HostProc;
use wd_testutil::tempdir;

fn host() -> HostProc {
    HostProc::serve_in(tempdir("wd-iommu-cli"), &["--device", "dummy"])
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

#[test]
fn faults_refuses_a_queue_named_on_another_device() {
    let h = HostProc::serve_in(
        tempdir("wd-iommu-cli"),
        &["--device", "dummy", "--device", "dummy"],
    );
    let conn = HostConn::connect(&h.socket).unwrap();
    let q = conn.request_queue(&Capability::new("memcpy")).unwrap();
    let id = q.id();
    let tail = format!("/queues/q{id}/");
    let on = conn
        .attrs("")
        .unwrap()
        .iter()
        .find_map(|e| e.path.find(&tail).map(|at| e.path[..at].to_string()))
        .expect("the queue in the tree");
    let other = if on == "dev0" { "dev1" } else { "dev0" };
    let (ok, _, err) = wd(&h.socket, &["faults", &format!("{other}/queues/q{id}")]);
    assert!(!ok, "a queue on {on} taken as {other}'s");
    assert!(
        err.contains(&format!("queue {id} is not on {other}")) && err.contains(&on),
        "{err}"
    );
    let (ok, _, err) = wd(&h.socket, &["faults", &format!("dev7/queues/q{id}")]);
    assert!(!ok);
    assert!(err.contains("no device dev7"), "{err}");
    let (ok, out, err) = wd(&h.socket, &["faults", &format!("{on}/queues/q{id}")]);
    assert!(ok, "{err}");
    assert!(out.contains("0 fault(s) recorded"), "{out}");
    let (ok, _, err) = wd(&h.socket, &["faults", &format!("{on}/q{id}")]);
    assert!(!ok);
    assert!(err.contains("is not a queue id"), "{err}");
}
