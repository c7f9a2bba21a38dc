//! What the machine can give: free hugetlb pages per size, available
//! memory (the kernel's estimate and this process's cgroup limit).
//!
//! Read from procfs/sysfs text; anything missing or unparsable reads as
//! "nothing known" (None / zero pages), never as a failure.

use wd_sys::pages::MemfdPages;

/// A hugetlb pool of one page size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HugePool {
    /// Page size.
    pub pages: MemfdPages,
    /// Pages in the pool.
    pub total: u64,
    /// Pages neither in use nor promised to a mapping.
    pub available: u64,
}

fn read_u64(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The hugetlb pool of `pages` (None for normal pages, or where the kernel
/// has no such pool).
pub fn huge_pool(pages: MemfdPages) -> Option<HugePool> {
    let dir = match pages {
        MemfdPages::Normal => return None,
        MemfdPages::Huge2M => "/sys/kernel/mm/hugepages/hugepages-2048kB",
        MemfdPages::Huge1G => "/sys/kernel/mm/hugepages/hugepages-1048576kB",
    };
    let total = read_u64(&format!("{dir}/nr_hugepages"))?;
    let free = read_u64(&format!("{dir}/free_hugepages")).unwrap_or(0);
    let resv = read_u64(&format!("{dir}/resv_hugepages")).unwrap_or(0);
    Some(HugePool {
        pages,
        total,
        available: free.saturating_sub(resv),
    })
}

/// Parse one "Name:   1234 kB" line of /proc/meminfo text into bytes.
pub fn meminfo_field(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?.strip_prefix(':')?;
        let mut it = rest.split_whitespace();
        let v: u64 = it.next()?.parse().ok()?;
        match it.next() {
            Some("kB") => v.checked_mul(1024),
            None => Some(v),
            Some(_) => None,
        }
    })
}

/// Total memory of the machine.
pub fn mem_total() -> Option<u64> {
    meminfo_field(&std::fs::read_to_string("/proc/meminfo").ok()?, "MemTotal")
}

/// Memory this process can still take without pushing the machine or its
/// cgroup into reclaim storms or the OOM killer: the smaller of the
/// kernel's MemAvailable and the cgroup v2 headroom (memory.max minus
/// memory.current). None when neither is known.
pub fn mem_available() -> Option<u64> {
    let sys = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| meminfo_field(&t, "MemAvailable"));
    let cg = cgroup_headroom();
    match (sys, cg) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// memory.max - memory.current of this process's cgroup (v2), if limited.
fn cgroup_headroom() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    let dir = format!("/sys/fs/cgroup{}", path.trim_end());
    let max = std::fs::read_to_string(format!("{dir}/memory.max")).ok()?;
    let max: u64 = max.trim().parse().ok()?; // "max" (unlimited) fails here: None
    let cur = read_u64(&format!("{dir}/memory.current")).unwrap_or(0);
    Some(max.saturating_sub(cur))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_parsing() {
        let t = "MemTotal:       24684084 kB\nMemFree:  100 kB\nMemAvailable:   2000 kB\nHugePages_Total:       3\n";
        assert_eq!(meminfo_field(t, "MemTotal"), Some(24684084 * 1024));
        assert_eq!(meminfo_field(t, "MemAvailable"), Some(2000 * 1024));
        assert_eq!(meminfo_field(t, "HugePages_Total"), Some(3));
        assert_eq!(meminfo_field(t, "Mem"), None);
        assert_eq!(meminfo_field(t, "Nope"), None);
        assert_eq!(meminfo_field("MemTotal: x kB", "MemTotal"), None);
    }

    #[test]
    fn this_machine() {
        assert!(mem_total().unwrap_or(1) > 0);
        assert!(mem_available().is_some());
        assert!(huge_pool(MemfdPages::Normal).is_none());
        if let Some(p) = huge_pool(MemfdPages::Huge2M) {
            assert!(p.available <= p.total);
        }
    }
}
