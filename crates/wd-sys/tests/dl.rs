//! Optional parts and libraries looked up at run time: never from the
//! current directory, never a symbol of another library.

/// `find_loaded(library, symbol)` is documented as "the address of
/// `symbol` of `library` if that library is loaded ... Never loads
/// anything". It first looks `symbol` up among all global objects with
/// RTLD_DEFAULT, whatever object defines it, and only then checks whether
/// `library` is loaded at all: a library that is not loaded "has" every
/// symbol some other object of the process exports (here libc's getpid).
/// libwd_crypto/libwd_comp use it to find libwd.so's private entry points
/// and call them with libwd.so's C types.
#[test]
fn find_loaded_answers_only_for_a_loaded_library() {
    let f = wd_sys::dl::find_loaded("libwd_no_such_part.so", "getpid");
    assert!(
        f.is_none(),
        "a symbol of a library that is not loaded was found (libc's getpid at {f:?})"
    );
    // The library that does define it is found.
    assert!(wd_sys::dl::find_loaded("libc.so.6", "getpid").is_some());
}

const ROLE: &str = "WD_TEST_DL_CHILD";
const PART: &str = "libwd_test_part.so";

/// `load_beside_self` loads an optional part "from the directory of the
/// object holding this code". For code linked into the program itself (a
/// Rust program using the `wrapdrive` crate, `WD_HOST=embedded` without
/// `wd_embedded::install`), dladdr names that object by `argv[0]`, which
/// is a bare name when the program was found through PATH (or anything
/// the invoker chose). `own_directory` canonicalizes it relative to the
/// current directory: if the current directory holds an entry with that
/// name, the "directory of this object" is the current directory, and a
/// `libwd_embedded.so` lying there is loaded and run (an untrusted
/// directory one happens to be in: the classic library-search hijack).
#[test]
fn load_beside_self_never_loads_from_the_current_directory() {
    if std::env::var_os(ROLE).is_some() {
        let lib = wd_sys::dl::load_beside_self(PART).unwrap();
        eprintln!("LOADED {}", lib.path());
        return;
    }
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().unwrap();
    let name = exe.file_name().unwrap().to_owned();
    // An unrelated directory: an entry named like the program, and the part.
    let dir = wd_testutil::tempdir("wd-test-dl");
    std::fs::write(dir.0.join(&name), b"not the program").unwrap();
    let so = [
        "/lib/x86_64-linux-gnu/libz.so.1",
        "/usr/lib/x86_64-linux-gnu/libz.so.1",
        "/lib64/libz.so.1",
        "/usr/lib/libz.so.1",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists());
    let Some(so) = so else {
        wd_testutil::skip(
            "load_beside_self_never_loads_from_the_current_directory",
            "no libz.so.1 to copy",
        );
        return;
    };
    std::fs::copy(so, dir.0.join(PART)).unwrap();
    let out = std::process::Command::new(&exe)
        .arg0(&name) // as a shell does for a program found through PATH
        .args([
            "--exact",
            "load_beside_self_never_loads_from_the_current_directory",
            "--nocapture",
        ])
        .current_dir(&dir.0)
        .env(ROLE, "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let loaded = stderr
        .lines()
        .find_map(|l| l.strip_prefix("LOADED "))
        .map(str::to_owned);
    let cwd_copy = std::fs::canonicalize(dir.0.join(PART)).unwrap();
    assert!(
        loaded.as_deref() != Some(cwd_copy.to_str().unwrap()),
        "the optional part was loaded from the current directory {}, not from beside the program ({})",
        dir.0.display(),
        exe.parent().unwrap().display()
    );
}
