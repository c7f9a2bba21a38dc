//! `alloc_and_read` against files that are not what they seem: rewritten
//! with their mtime put back, or FIFOs that would block an open.

use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use wd_heap::{Engine, Heap, HeapLimits, IoMode, LoadError, LoadOptions};
use wd_testutil::TempDir;

fn tempdir(tag: &str) -> TempDir {
    wd_testutil::tempdir(&format!("wd-heap-changes-{tag}"))
}

fn pattern(size: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..size)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn write_file(dir: &Path, name: &str, data: &[u8]) -> PathBuf {
    let p = dir.join(name);
    let mut f = std::fs::File::create(&p).unwrap();
    f.write_all(data).unwrap();
    f.sync_all().unwrap();
    p
}

fn evict(p: &Path) {
    let fd = wd_sys::file::open_read(p, false).unwrap();
    wd_sys::file::fadvise(fd.as_fd(), 0, 0, wd_sys::file::Advice::DontNeed).unwrap();
}

fn heap() -> Heap {
    Heap::new(HeapLimits {
        max_bytes: 1 << 30,
        max_buffers: 64,
    })
}

/// A file rewritten while it is being loaded, by a writer that then puts
/// its mtime back (what `rsync -t`, `cp -p`, `tar x` and every
/// "preserve timestamps" copier do): the size and the mtime are those of
/// the start, only the ctime tells. The loader compares size and mtime
/// only, so it returns a buffer that mixes the old bytes (already read)
/// with the new ones (read after the write): contents the file never had,
/// and no error.
#[test]
fn a_rewrite_with_the_mtime_put_back_is_detected() {
    for engine in [Engine::Uring, Engine::Threads] {
        for io in [IoMode::Buffered, IoMode::Direct] {
            let dir = tempdir("ctime");
            let size = 4 << 20;
            let data = pattern(size, 11);
            let p = write_file(&dir.0, "f", &data);
            evict(&p);
            if io == IoMode::Direct && wd_sys::file::open_read(&p, true).is_err() {
                continue;
            }
            let mtime = std::fs::metadata(&p).unwrap().modified().unwrap();
            let p2 = p.clone();
            let mut done = false;
            let opts = LoadOptions::default()
                .io(io)
                .engine(engine)
                .chunk(64 << 10)
                .depth(1)
                .progress(move |_| {
                    if !done {
                        done = true;
                        use std::os::unix::fs::FileExt;
                        let f = std::fs::OpenOptions::new().write(true).open(&p2).unwrap();
                        // Both ends: the start is read already, the end not yet.
                        f.write_at(b"NEW!", 0).unwrap();
                        f.write_at(b"NEW!", (size - 4) as u64).unwrap();
                        f.set_modified(mtime).unwrap();
                    }
                });
            match heap().load(&p, opts) {
                Err(LoadError::Changed { .. }) => {}
                Err(e) => panic!("{engine:?} {io:?}: unexpected error {e}"),
                Ok(l) => {
                    let got = l.buffer.to_vec();
                    let now = std::fs::read(&p).unwrap();
                    panic!(
                        "{engine:?} {io:?}: the load succeeded although the file was rewritten \
                         during it (head == old: {}, head == new: {}, tail == old: {}, tail == new: {})",
                        got[..4] == data[..4],
                        got[..4] == now[..4],
                        got[size - 4..] == data[size - 4..],
                        got[size - 4..] == now[size - 4..],
                    );
                }
            }
        }
    }
}

/// A FIFO is documented as `LoadError::NotRegular`; but the loader opens
/// the path (O_RDONLY, blocking) before it looks at what it is, and
/// opening a FIFO for reading blocks until some process opens it for
/// writing: with no writer, `load` never returns.
#[test]
fn a_fifo_is_refused_not_waited_on() {
    let dir = tempdir("fifo");
    let p = dir.0.join("pipe");
    let st = std::process::Command::new("mkfifo")
        .arg(&p)
        .status()
        .unwrap();
    assert!(st.success(), "mkfifo");
    let (tx, rx) = std::sync::mpsc::channel();
    let p2 = p.clone();
    let t = std::thread::spawn(move || {
        let r = heap().load(&p2, LoadOptions::default());
        let _ = tx.send(r.map(|_| ()).map_err(|e| e.to_string()));
    });
    let r = rx.recv_timeout(std::time::Duration::from_secs(3));
    if r.is_err() {
        // Unblock the loader (a writer appears), so the test process ends.
        let _w = std::fs::OpenOptions::new().write(true).open(&p);
        let late = rx.recv_timeout(std::time::Duration::from_secs(10));
        t.join().unwrap();
        panic!(
            "load of a FIFO without a writer blocked for 3 s (then, once a writer came: {late:?})"
        );
    }
    t.join().unwrap();
    let e = r.unwrap().unwrap_err();
    assert!(e.contains("not a regular file"), "{e}");
}
