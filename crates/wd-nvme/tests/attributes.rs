//! The controller's writable attributes (`wd attr set devN/nvme/...`).

use wd_device::Driver;
use wd_nvme::{IoEngine, NvmeDriver};

/// A namespace added at run time names its file by an absolute path: a
/// relative one was resolved in the host's working directory, not the
/// caller's, and made a file there.
#[test]
fn a_namespace_added_by_attribute_needs_an_absolute_path() {
    let dir = wd_testutil::tempdir("wd-nvme-attr");
    let store = dir.path().join("store.img");
    let driver = NvmeDriver::new(&[format!("{}:0:4M", store.display())], IoEngine::Sync).unwrap();
    let e = driver
        .set_attribute("nvme/add_namespace", "wd-nvme-attr-relative.img:0:4M")
        .unwrap_err();
    assert!(e.contains("relative"), "{e}");
    assert!(!std::path::Path::new("wd-nvme-attr-relative.img").exists());
    driver
        .set_attribute(
            "nvme/add_namespace",
            &format!(" {}:4M:4M ", store.display()),
        )
        .unwrap();
    let e = driver
        .set_attribute("nvme/add_namespace", "/a:0:1G:8192")
        .unwrap_err();
    assert!(e.contains("BLOCK"), "{e}");
}
