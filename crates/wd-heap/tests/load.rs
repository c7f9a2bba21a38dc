//! Differential tests of `alloc_and_read`: every mode returns exactly the
//! file's bytes (the reference is `std::fs::read`), and every failure is a
//! clear error, never a short buffer (also for files rewritten with their
//! mtime put back, or FIFOs that would block an open).

use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Command;

use proptest::prelude::*;
use wd_heap::{
    Engine, EngineUsed, Heap, HeapLimits, IoMode, IoUsed, LoadError, LoadOptions, PagePolicy,
};

use wd_testutil::TempDir;

fn tempdir(tag: &str) -> TempDir {
    wd_testutil::tempdir(&format!("wd-heap-{tag}"))
}

/// Deterministic bytes that differ at every offset and between sizes.
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

/// Drop the file from the page cache (so Auto picks direct I/O).
fn evict(p: &Path) {
    let fd = wd_sys::file::open_read(p, false).unwrap();
    wd_sys::file::fadvise(fd.as_fd(), 0, 0, wd_sys::file::Advice::DontNeed).unwrap();
}

fn direct_supported(p: &Path) -> bool {
    wd_sys::file::open_read(p, true).is_ok()
}

fn heap() -> Heap {
    Heap::new(HeapLimits {
        max_bytes: 1 << 30,
        max_buffers: 64,
    })
}

/// Load and compare with the reference; check the slack is zero.
fn check(p: &Path, data: &[u8], opts: LoadOptions, what: &str) -> wd_heap::LoadReport {
    let l = heap()
        .load(p, opts)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(l.buffer.len(), data.len() as u64, "{what}: length");
    assert!(l.buffer.to_vec() == data, "{what}: bytes differ");
    let slack = (l.buffer.capacity() - l.buffer.len()) as usize;
    let mut tail = vec![1u8; slack];
    l.buffer.read_at(l.buffer.len(), &mut tail).unwrap();
    assert!(tail.iter().all(|&b| b == 0), "{what}: slack not zero");
    assert!(l.buffer.seals().unwrap().shrink, "{what}: not sealed");
    assert_eq!(l.report.bytes, data.len() as u64);
    l.report
}

/// A named way to build load options.
type Config = (&'static str, fn() -> LoadOptions);

fn configs() -> Vec<Config> {
    vec![
        ("default", LoadOptions::default),
        ("direct uring", || {
            LoadOptions::default()
                .io(IoMode::Direct)
                .engine(Engine::Uring)
        }),
        ("direct threads", || {
            LoadOptions::default()
                .io(IoMode::Direct)
                .engine(Engine::Threads)
        }),
        ("buffered uring", || {
            LoadOptions::default()
                .io(IoMode::Buffered)
                .engine(Engine::Uring)
        }),
        ("buffered threads", || {
            LoadOptions::default()
                .io(IoMode::Buffered)
                .engine(Engine::Threads)
        }),
        ("direct no populate", || {
            LoadOptions::default().io(IoMode::Direct).populate(false)
        }),
        ("direct serial", || {
            LoadOptions::default().io(IoMode::Direct).overlap(false)
        }),
        ("direct small gathers", || {
            LoadOptions::default()
                .io(IoMode::Direct)
                .gather(64 << 10)
                .chunk(4096)
                .depth(3)
        }),
        ("buffered small gathers threads", || {
            LoadOptions::default()
                .io(IoMode::Buffered)
                .engine(Engine::Threads)
                .gather(1 << 20)
                .chunk(64 << 10)
                .depth(4)
        }),
        ("direct 1 MiB gathers", || {
            LoadOptions::default()
                .io(IoMode::Direct)
                .gather(1 << 20)
                .chunk(256 << 10)
                .depth(4)
        }),
    ]
}

#[test]
fn every_mode_returns_exactly_the_files_bytes() {
    let dir = tempdir("diff");
    // Empty, tiny, around the 512-byte sector and 4 KiB page, an unaligned
    // multi-MiB file, and one spanning several 1 MiB gathers.
    let sizes = [
        0usize,
        1,
        511,
        4095,
        4096,
        4097,
        (3 << 20) + 4321,
        (5 << 20) + 333,
    ];
    for (i, &size) in sizes.iter().enumerate() {
        let data = pattern(size, i as u64 + 1);
        let p = write_file(&dir.0, &format!("f{size}"), &data);
        let direct = direct_supported(&p);
        for (name, make) in configs() {
            let what = format!("{name}, {size} bytes");
            let opts = make();
            if opts.io == IoMode::Direct && !direct {
                let e = heap().load(&p, opts).unwrap_err();
                assert!(
                    matches!(e, LoadError::DirectUnsupported { .. }),
                    "{what}: {e}"
                );
                continue;
            }
            let r = check(&p, &data, opts, &what);
            if name.starts_with("direct") && size > 0 {
                assert_eq!(r.io, IoUsed::Direct, "{what}");
            }
            if name.starts_with("buffered") {
                assert_eq!(r.io, IoUsed::Buffered, "{what}");
            }
        }
        // Auto: buffered from the page cache, direct once evicted.
        let r = check(&p, &data, LoadOptions::default(), "auto cached");
        if size > 0 {
            assert_eq!(r.io, IoUsed::Buffered, "auto on a cached {size}-byte file");
            // Residency is only looked at where direct I/O is possible.
            assert_eq!(r.cached_before.is_some(), direct);
            assert!(r.cached_before.is_none_or(|c| c >= 0.5));
            evict(&p);
            let r = check(&p, &data, LoadOptions::default(), "auto evicted");
            if direct {
                assert_eq!(r.io, IoUsed::Direct, "auto on an evicted {size}-byte file");
            }
        }
    }
}

#[test]
fn overlapped_load_reports_gathers_and_progress() {
    let dir = tempdir("progress");
    let data = pattern((6 << 20) + 17, 99);
    let p = write_file(&dir.0, "f", &data);
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let opts = LoadOptions::default()
        .gather(1 << 20)
        .chunk(128 << 10)
        .depth(4)
        .progress(move |p| s2.lock().unwrap().push(*p));
    let r = check(&p, &data, opts, "progress");
    assert_eq!(r.gather, 1 << 20);
    assert!(r.first_gather.is_some() && r.alloc_done.is_some());
    assert!(r.first_gather <= r.alloc_done);
    assert!(r.reads >= 49, "{} reads", r.reads);
    let seen = seen.lock().unwrap();
    assert!(seen.len() > 2);
    assert!(seen.windows(2).all(|w| w[0].read <= w[1].read));
    let last = seen.last().unwrap();
    assert_eq!(last.read, data.len() as u64);
    assert_eq!(last.total, data.len() as u64);
    assert!(
        r.mode().contains("1.00 MiB gathers, overlapped"),
        "{}",
        r.mode()
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_sizes_and_shapes(
        size in 0usize..400_000,
        chunk_pages in 1u64..40,
        gather_chunks in 1u64..6,
        depth in 1u32..6,
        mode in 0u8..4,
    ) {
        let dir = tempdir("prop");
        let data = pattern(size, size as u64 ^ 0x5a5a);
        let p = write_file(&dir.0, "f", &data);
        let chunk = chunk_pages * 4096;
        let (io, engine) = match mode {
            0 => (IoMode::Direct, Engine::Uring),
            1 => (IoMode::Direct, Engine::Threads),
            2 => (IoMode::Buffered, Engine::Uring),
            _ => (IoMode::Buffered, Engine::Threads),
        };
        if io == IoMode::Direct && !direct_supported(&p) {
            return Ok(());
        }
        let opts = LoadOptions::default()
            .io(io)
            .engine(engine)
            .chunk(chunk)
            .gather(chunk * gather_chunks)
            .depth(depth);
        check(&p, &data, opts, "proptest");
    }
}

#[test]
fn missing_unreadable_and_special_files_are_clear_errors() {
    let e = heap()
        .load("/nonexistent/wd-model.bin", LoadOptions::default())
        .unwrap_err();
    assert!(matches!(e, LoadError::Open { .. }), "{e}");
    assert!(e.to_string().contains("No such file"), "{e}");
    assert_eq!(e.errno(), 2);

    let dir = tempdir("errors");
    let e = heap().load(&dir.0, LoadOptions::default()).unwrap_err();
    assert!(e.to_string().contains("is a directory"), "{e}");

    // Not root: a file without read permission (root bypasses permissions;
    // the CLI test covers that case as an unprivileged user).
    if wd_sys::geteuid() != 0 {
        use std::os::unix::fs::PermissionsExt;
        let p = write_file(&dir.0, "secret", b"x");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o000)).unwrap();
        let e = heap().load(&p, LoadOptions::default()).unwrap_err();
        assert!(e.to_string().contains("Permission denied"), "{e}");
    }

    let e = heap()
        .load("/dev/null", LoadOptions::default())
        .unwrap_err();
    assert!(matches!(e, LoadError::NotRegular { .. }), "{e}");
}

#[test]
fn filesystems_without_direct_io() {
    // sysfs: no O_DIRECT, and its files claim 4096 bytes but hold fewer.
    let p = Path::new("/sys/kernel/mm/transparent_hugepage/enabled");
    if !p.exists() {
        wd_testutil::skip(
            "filesystems_without_direct_io",
            &format!("{} absent", p.display()),
        );
        return;
    }
    let e = heap()
        .load(p, LoadOptions::default().io(IoMode::Direct))
        .unwrap_err();
    assert!(matches!(e, LoadError::DirectUnsupported { .. }), "{e}");
    assert!(e.to_string().contains("sysfs"), "{e}");
    // Auto falls back to buffered reads, which then find the file shorter
    // than its size: an error, not a short buffer.
    let e = heap().load(p, LoadOptions::default()).unwrap_err();
    assert!(matches!(e, LoadError::Changed { .. }), "{e}");
    assert!(e.to_string().contains("ended at byte"), "{e}");
}

fn changing_file(tag: &str) -> (TempDir, PathBuf, Vec<u8>) {
    let dir = tempdir(tag);
    let data = pattern(4 << 20, 7);
    let p = write_file(&dir.0, "f", &data);
    evict(&p);
    (dir, p, data)
}

#[test]
fn a_file_shrinking_while_read_is_an_error() {
    for engine in [Engine::Uring, Engine::Threads] {
        for io in [IoMode::Direct, IoMode::Buffered] {
            let (_d, p, _) = changing_file("shrink");
            if io == IoMode::Direct && !direct_supported(&p) {
                continue;
            }
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
                        let f = std::fs::OpenOptions::new().write(true).open(&p2).unwrap();
                        f.set_len(1 << 20).unwrap();
                    }
                });
            let e = heap().load(&p, opts).unwrap_err();
            assert!(
                matches!(e, LoadError::Changed { .. }),
                "{engine:?} {io:?}: {e}"
            );
            if engine == Engine::Uring {
                // One read in flight: the next read finds the new end.
                assert!(e.to_string().contains("ended at byte 1048576"), "{e}");
            }
        }
    }
}

#[test]
fn a_file_growing_or_modified_while_read_is_an_error() {
    for engine in [Engine::Uring, Engine::Threads] {
        let (_d, p, _) = changing_file("grow");
        let p2 = p.clone();
        let mut done = false;
        let opts = LoadOptions::default()
            .engine(engine)
            .chunk(64 << 10)
            .depth(2)
            .progress(move |_| {
                if !done {
                    done = true;
                    let mut f = std::fs::OpenOptions::new().append(true).open(&p2).unwrap();
                    f.write_all(b"more").unwrap();
                }
            });
        let e = heap().load(&p, opts).unwrap_err();
        assert!(e.to_string().contains("changed while being read"), "{e}");

        let (_d, p, _) = changing_file("modify");
        let p2 = p.clone();
        let mut done = false;
        let opts = LoadOptions::default()
            .engine(engine)
            .chunk(64 << 10)
            .depth(2)
            .progress(move |_| {
                if !done {
                    done = true;
                    // Same size, new contents: only the mtime tells.
                    std::thread::sleep(std::time::Duration::from_millis(5));
                    let f = std::fs::OpenOptions::new().write(true).open(&p2).unwrap();
                    use std::os::unix::fs::FileExt;
                    f.write_at(b"XXXX", 0).unwrap();
                }
            });
        let e = heap().load(&p, opts).unwrap_err();
        assert!(e.to_string().contains("modified"), "{engine:?}: {e}");
    }
}

#[test]
fn bad_options_and_heap_limits() {
    let dir = tempdir("opts");
    let data = pattern(10_000, 3);
    let p = write_file(&dir.0, "f", &data);
    for opts in [
        LoadOptions::default().chunk(100),
        LoadOptions::default().depth(100_000),
        LoadOptions::default().gather(0),
    ] {
        let e = heap().load(&p, opts).unwrap_err();
        assert!(matches!(e, LoadError::BadOptions(_)), "{e}");
    }
    let small = Heap::new(HeapLimits {
        max_bytes: 8192,
        max_buffers: 4,
    });
    let e = small.load(&p, LoadOptions::default()).unwrap_err();
    assert!(e.to_string().contains("heap limit"), "{e}");
    // Required hugepages that the machine lacks.
    let pool = wd_heap::system::huge_pool(wd_sys::pages::MemfdPages::Huge1G);
    if pool.is_none_or(|p| p.available == 0) {
        let e = heap()
            .load(&p, LoadOptions::default().pages(PagePolicy::Huge1G))
            .unwrap_err();
        assert!(e.to_string().contains("hugetlb pages"), "{e}");
    }
}

#[test]
fn hugetlb_buffers_when_the_machine_has_them() {
    let Some(pool) = wd_heap::system::huge_pool(wd_sys::pages::MemfdPages::Huge2M) else {
        wd_testutil::skip(
            "hugetlb_buffers_when_the_machine_has_them",
            "no 2 MiB hugetlb pool",
        );
        return;
    };
    if pool.available < 4 {
        wd_testutil::skip(
            "hugetlb_buffers_when_the_machine_has_them",
            &format!(
                "{} free 2 MiB hugepages (reserve some in /sys/kernel/mm/hugepages to run this)",
                pool.available
            ),
        );
        return;
    }
    let dir = tempdir("huge");
    let data = pattern((5 << 20) + 99, 11);
    let p = write_file(&dir.0, "f", &data);
    evict(&p);
    let r = check(
        &p,
        &data,
        LoadOptions::default()
            .pages(PagePolicy::Huge2M)
            .gather(2 << 20)
            .chunk(512 << 10),
        "hugetlb",
    );
    assert_eq!(r.pages, wd_heap::PageKind::Huge2M);
}

/// Role of this binary when re-executed: the fallback without io_uring.
const ROLE: &str = "WD_HEAP_TEST_ROLE";

#[test]
fn without_io_uring_the_loader_falls_back_to_threads() {
    if std::env::var(ROLE).as_deref() == Ok("no-uring") {
        wd_sys::uring::refuse_io_uring().expect("install the seccomp filter");
        let dir = std::env::var("WD_HEAP_TEST_DIR").unwrap();
        let p = Path::new(&dir).join("f");
        let data = std::fs::read(&p).unwrap();
        let r = check(
            &p,
            &data,
            LoadOptions::default().chunk(64 << 10),
            "no io_uring",
        );
        assert!(matches!(r.engine, EngineUsed::Threads(_)), "{r:?}");
        assert!(
            r.notes.iter().any(|n| n.contains("io_uring unavailable")),
            "{:?}",
            r.notes
        );
        let e = heap()
            .load(&p, LoadOptions::default().engine(Engine::Uring))
            .unwrap_err();
        assert!(matches!(e, LoadError::UringUnavailable(_)), "{e}");
        return;
    }
    let dir = tempdir("nouring");
    write_file(&dir.0, "f", &pattern((1 << 20) + 5, 5));
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "without_io_uring_the_loader_falls_back_to_threads",
            "--nocapture",
        ])
        .env(ROLE, "no-uring")
        .env("WD_HEAP_TEST_DIR", &dir.0)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && text.contains("install the seccomp filter") {
        wd_testutil::skip(
            "without_io_uring_the_loader_falls_back_to_threads",
            "seccomp unavailable here",
        );
        return;
    }
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(text.contains("1 passed"), "{text}");
}

/// A /proc file is a regular file of size 0 that holds bytes: an error
/// naming it, never its contents as empty (it loaded as 0 bytes).
#[test]
fn a_file_that_holds_more_than_its_size_is_refused() {
    let p = Path::new("/proc/self/status");
    assert!(!std::fs::read(p).unwrap().is_empty());
    match heap().load(p, LoadOptions::default()) {
        Err(e) => assert!(e.to_string().contains("holds more than"), "{e}"),
        Ok(l) => panic!("loaded {} bytes as the whole file", l.buffer.len()),
    }
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
