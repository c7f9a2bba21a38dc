//! A client's memfd of huge pages shared with the host: only whole pages
//! are imported (the kernel maps a part of one as the whole page, and
//! refuses to unmap the part: the host kept the page mapped for good), and
//! what is imported is unmapped when the region goes.

use std::os::fd::{AsFd, OwnedFd};

use wd_mem::{ImportedRegion, MemError};
use wd_sys::pages::{memfd_create_sealable, MemfdPages};

const HUGE: u64 = 2 << 20;

/// This process's mappings of the memfd called `name`.
fn maps_of(name: &str) -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.contains(&format!("/memfd:{name} ")))
        .count()
}

/// A sealed memfd of two 2 MiB pages, or None (skipped) without a pool.
fn huge_memfd(test: &str, name: &str) -> Option<OwnedFd> {
    let free = wd_heap::system::huge_pool(MemfdPages::Huge2M).map_or(0, |p| p.available);
    if free < 2 {
        wd_testutil::skip(test, &format!("{free} free 2 MiB hugetlb pages (2 needed)"));
        return None;
    }
    let fd = memfd_create_sealable(name, MemfdPages::Huge2M).unwrap();
    wd_sys::ftruncate(fd.as_fd(), 2 * HUGE).unwrap();
    wd_sys::add_seals(fd.as_fd(), wd_sys::SEAL_SHRINK | wd_sys::SEAL_GROW).unwrap();
    Some(fd)
}

#[test]
fn part_of_a_huge_page_is_refused() {
    let name = format!("wd-part-huge-{}", std::process::id());
    let Some(fd) = huge_memfd("part_of_a_huge_page_is_refused", &name) else {
        return;
    };
    for (offset, len) in [
        (0, 4096),
        (0, HUGE + 4096),
        (4096, HUGE),
        (HUGE, HUGE - 4096),
    ] {
        let e = ImportedRegion::import(fd.as_fd(), offset, len).unwrap_err();
        assert!(
            matches!(e, MemError::PartPage { .. }),
            "{offset:#x}+{len:#x}: {e}"
        );
        assert_eq!(e.errno(), 22, "EINVAL");
        assert!(e.to_string().contains("whole pages"), "{e}");
    }
    assert_eq!(maps_of(&name), 0);
}

#[test]
fn whole_huge_pages_are_imported_and_unmapped_with_the_region() {
    let name = format!("wd-whole-huge-{}", std::process::id());
    let Some(fd) = huge_memfd(
        "whole_huge_pages_are_imported_and_unmapped_with_the_region",
        &name,
    ) else {
        return;
    };
    for (offset, len) in [(0, HUGE), (HUGE, HUGE), (0, 2 * HUGE)] {
        let region = ImportedRegion::import(fd.as_fd(), offset, len).unwrap();
        assert_eq!(region.len(), len);
        assert_eq!(maps_of(&name), 1);
        drop(region);
        assert_eq!(maps_of(&name), 0, "{offset:#x}+{len:#x} still mapped");
    }
}
