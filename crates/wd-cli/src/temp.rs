//! Files and directories a command makes for its own use, removed however
//! it ends (an error returned half way included).

use std::path::PathBuf;

/// Removes its paths when dropped: files, or directories with what they
/// hold. Removal is best effort (a path already gone is fine).
#[derive(Debug, Default)]
pub struct Removed(Vec<PathBuf>);

impl Removed {
    /// Remove `path` too, when dropped.
    pub fn add(&mut self, path: PathBuf) {
        self.0.push(path);
    }
}

impl Drop for Removed {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = match p.is_dir() {
                true => std::fs::remove_dir_all(p),
                false => std::fs::remove_file(p),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removes_files_and_directories() {
        let base = std::env::temp_dir().join(format!("wd-temp-test-{}", std::process::id()));
        std::fs::create_dir_all(base.join("d")).unwrap();
        std::fs::write(base.join("d/f"), b"x").unwrap();
        std::fs::write(base.join("f"), b"x").unwrap();
        let mut r = Removed::default();
        r.add(base.join("f"));
        r.add(base.join("d"));
        r.add(base.join("never-made"));
        drop(r);
        assert!(!base.join("f").exists() && !base.join("d").exists());
        std::fs::remove_dir_all(&base).unwrap();
    }
}
