//! A heap buffer shared with a queue is processed by the dummy device in
//! place: the device's writes land in the very pages the client (and any
//! importer of the buffer) sees, and nothing outside the buffer is reachable.

use std::io::Write;

use wd_dummy_msg::CopyMsg;
use wrapdrive::heap::{Heap, HeapLimits, LoadOptions};
use wrapdrive::Capability;

fn pattern(size: usize) -> Vec<u8> {
    (0..size).map(|i| (i * 31 % 251) as u8).collect()
}

#[test]
fn loaded_buffer_is_processed_in_place() {
    let path = std::env::temp_dir().join(format!("wd-share-{}", std::process::id()));
    let data = pattern((2 << 20) + 123);
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(&data).unwrap();
    f.sync_all().unwrap();
    drop(f);

    let heap = Heap::new(HeapLimits {
        max_bytes: 64 << 20,
        max_buffers: 8,
    });
    let buf = heap.load(&path, LoadOptions::default()).unwrap().buffer;
    std::fs::remove_file(&path).unwrap();
    let importer = heap.import(buf.export().unwrap(), None).unwrap();

    let host = wd_embedded::connect().unwrap();
    let mut q = host.request_queue(&Capability::new("memcpy")).unwrap();
    q.share_buffer(&buf).unwrap();

    // Copy the first MiB of the file to the end of the same buffer.
    let len = 1u64 << 20;
    let dst_off = buf.capacity() - len;
    let done = q
        .call(
            CopyMsg {
                src: buf.addr(),
                dst: buf.addr() + dst_off,
                len,
            }
            .to_desc(0),
        )
        .unwrap();
    assert_eq!((done.status, done.result), (0, len));
    let mut got = vec![0u8; len as usize];
    buf.read_at(dst_off, &mut got).unwrap();
    assert!(
        got == data[..len as usize],
        "device result not in the buffer"
    );
    // The importer's mapping is the same pages.
    let mut seen = vec![0u8; len as usize];
    importer.read_at(dst_off, &mut seen).unwrap();
    assert!(seen == got);
    // The source bytes were not disturbed.
    let mut head = vec![0u8; 4096];
    buf.read_at(0, &mut head).unwrap();
    assert_eq!(head, data[..4096]);

    // One byte past the buffer is outside the queue's domain: a fault.
    let bad = q
        .call(
            CopyMsg {
                src: buf.addr(),
                dst: buf.addr() + buf.capacity() - 4095,
                len: 4096,
            }
            .to_desc(0),
        )
        .unwrap();
    assert_ne!(bad.status, 0, "a copy reaching past the buffer must fail");

    q.unshare_buffer(&buf).unwrap();
    let after = q
        .call(
            CopyMsg {
                src: buf.addr(),
                dst: buf.addr() + dst_off,
                len: 4096,
            }
            .to_desc(0),
        )
        .unwrap();
    assert_ne!(after.status, 0, "an unshared buffer must be unreachable");
}

#[test]
fn read_only_and_unsealed_buffers_are_refused() {
    let heap = Heap::new(HeapLimits {
        max_bytes: 1 << 20,
        max_buffers: 8,
    });
    let host = wd_embedded::connect().unwrap();
    let mut q = host.request_queue(&Capability::new("memcpy")).unwrap();
    let unsealed = heap
        .alloc(
            8192,
            &wrapdrive::heap::AllocOptions {
                seal: false,
                ..Default::default()
            },
        )
        .unwrap();
    let e = q.share_buffer(&unsealed).unwrap_err();
    assert!(e.to_string().contains("sealed"), "{e}");
    let b = heap.alloc(8192, &Default::default()).unwrap();
    b.seal_writes().unwrap();
    let ro = heap.import(b.export().unwrap(), None).unwrap();
    let e = q.share_buffer(&ro).unwrap_err();
    assert!(e.to_string().contains("read-only"), "{e}");
    // The owner's mapping is writable, but the host cannot map a
    // write-sealed file writable: refused here, naming the seal (the host
    // refuses it too: wd-mem's import_checks_seals_and_bounds).
    let e = q.share_buffer(&b).unwrap_err();
    assert!(e.to_string().contains("sealed against writes"), "{e}");
    let ok = heap.alloc(8192, &Default::default()).unwrap();
    q.share_buffer(&ok).unwrap();
}
