//! Helpers shared by WrapDrive's tests.
//!
//! A test that needs what the machine lacks (root, a hugetlb pool, a C
//! compiler) must not pass silently: it says so on stderr and appends a
//! line to `$WD_SKIP_LOG`, which `scripts/test-all.sh` counts by reason.
#![deny(unsafe_code)]

use std::io::Write;

/// Report that `test` did not run, and why.
pub fn skip(test: &str, reason: &str) {
    eprintln!("skip: {test}: {reason}");
    if let Some(path) = std::env::var_os("WD_SKIP_LOG") {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            // One write per line: O_APPEND keeps parallel tests' lines whole.
            let _ = f.write_all(format!("{test}: {reason}\n").as_bytes());
        }
    }
}

/// Whether this process runs as root (by the owner of /proc/self, which
/// needs no unsafe call).
pub fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// True when running as root; otherwise report `test` skipped (`why`
/// says what it needs root for) and return false.
pub fn root_or_skip(test: &str, why: &str) -> bool {
    if is_root() {
        return true;
    }
    skip(test, &format!("needs root {why}"));
    false
}

#[cfg(test)]
mod tests {
    #[test]
    fn skips_are_logged() {
        let p = std::env::temp_dir().join(format!("wd-skip-{}", std::process::id()));
        // Only this test sets the variable in this process.
        std::env::set_var("WD_SKIP_LOG", &p);
        super::skip("t", "no reason");
        std::env::remove_var("WD_SKIP_LOG");
        let text = std::fs::read_to_string(&p).unwrap();
        let _ = std::fs::remove_file(&p);
        assert_eq!(text, "t: no reason\n");
    }
}
