//! Export/import across two processes: the importer sees the loaded bytes,
//! and each side sees the other's writes (the same pages, no copy).

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};

use wd_heap::{Heap, HeapLimits, LoadOptions};

const ROLE: &str = "WD_HEAP_SHARE_ROLE";

fn heap() -> Heap {
    Heap::new(HeapLimits {
        max_bytes: 64 << 20,
        max_buffers: 8,
    })
}

fn expect(sock: &UnixStream, what: &[u8]) {
    let mut b = [0u8; 16];
    let (n, _) = wd_sys::recv_with_fds(sock, &mut b, 0).unwrap();
    assert_eq!(&b[..n], what);
}

fn importer() {
    let sock = UnixStream::from(std::io::stdin().as_fd().try_clone_to_owned().unwrap());
    let path = std::env::var("WD_TEST_FILE").unwrap();
    let data = std::fs::read(&path).unwrap();
    let mut b = [0u8; 16];
    let (n, mut fds) = wd_sys::recv_with_fds(&sock, &mut b, 1).unwrap();
    assert_eq!(&b[..n], b"buf");
    let buf = heap()
        .import(fds.pop().unwrap(), Some(data.len() as u64))
        .unwrap();
    assert_eq!(buf.len(), data.len() as u64);
    assert!(buf.to_vec() == data, "imported bytes differ from the file");
    buf.write_at(8, b"child").unwrap();
    wd_sys::send_with_fds(&sock, b"w", &[]).unwrap();
    expect(&sock, b"p");
    let mut m = [0u8; 6];
    buf.read_at(100, &mut m).unwrap();
    assert_eq!(&m, b"parent");
    wd_sys::send_with_fds(&sock, b"k", &[]).unwrap();
}

#[test]
fn export_import_across_processes() {
    if std::env::var(ROLE).as_deref() == Ok("importer") {
        importer();
        return;
    }
    let dir = wd_testutil::tempdir("wd-heap-share");
    let path = dir.path().join("data");
    let data: Vec<u8> = (0..(1 << 20) + 777).map(|i: u32| (i % 253) as u8).collect();
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(&data).unwrap();
    f.sync_all().unwrap();
    let loaded = heap().load(&path, LoadOptions::default()).unwrap();
    let buf = loaded.buffer;

    let (a, b) = UnixStream::pair().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "export_import_across_processes", "--nocapture"])
        .env(ROLE, "importer")
        .env("WD_TEST_FILE", &path)
        .stdin(Stdio::from(OwnedFd::from(b)))
        .spawn()
        .unwrap();
    let fd = buf.export().unwrap();
    wd_sys::send_with_fds(&a, b"buf", &[fd.as_fd()]).unwrap();
    drop(fd);
    expect(&a, b"w");
    let mut m = [0u8; 5];
    buf.read_at(8, &mut m).unwrap();
    assert_eq!(&m, b"child", "the importer's write must be visible here");
    buf.write_at(100, b"parent").unwrap();
    wd_sys::send_with_fds(&a, b"p", &[]).unwrap();
    expect(&a, b"k");
    assert!(child.wait().unwrap().success(), "importer failed");
}
