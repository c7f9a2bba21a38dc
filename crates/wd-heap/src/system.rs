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

/// The least headroom (limit minus usage) of this process's memory cgroup
/// and its ancestors, if one is limited: a limit on a parent slice binds
/// as much as one's own. cgroup v2 (`memory.max`), else v1's memory
/// controller (`memory.limit_in_bytes`).
fn cgroup_headroom() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let v2 = text
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .and_then(|path| {
            headroom_up(
                "/sys/fs/cgroup",
                path,
                "memory.max",
                "memory.current",
                &read,
            )
        });
    let v1 = text.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then_some(path)
    });
    let v1 = v1.and_then(|path| {
        headroom_up(
            "/sys/fs/cgroup/memory",
            path,
            "memory.limit_in_bytes",
            "memory.usage_in_bytes",
            &read,
        )
    });
    match (v2, v1) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The least `limit - usage` over cgroup `path` and its ancestors under
/// `root`; levels without a limit ("max", v1's near-2^63 maximum, or no
/// file) count for nothing.
fn headroom_up(
    root: &str,
    path: &str,
    limit_file: &str,
    usage_file: &str,
    read: &dyn Fn(&str) -> Option<String>,
) -> Option<u64> {
    let number = |p: String| read(&p).and_then(|t| t.trim().parse::<u64>().ok());
    let mut p = path.trim_end().trim_end_matches('/').to_string();
    let mut least: Option<u64> = None;
    loop {
        let dir = format!("{root}{p}");
        if let Some(max) = number(format!("{dir}/{limit_file}")).filter(|&m| m < 1 << 62) {
            let used = number(format!("{dir}/{usage_file}")).unwrap_or(0);
            let h = max.saturating_sub(used);
            least = Some(least.map_or(h, |l| l.min(h)));
        }
        if p.is_empty() {
            return least;
        }
        p.truncate(p.rfind('/').unwrap_or(0));
    }
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

    /// A limit on an ancestor binds (only the process's own cgroup was
    /// read: a limited parent slice led to the OOM killer, not an error).
    #[test]
    fn the_least_headroom_up_the_cgroup_tree_counts() {
        let files: std::collections::HashMap<&str, &str> = [
            ("/cg/a/b/memory.max", "max\n"),
            ("/cg/a/b/memory.current", "100\n"),
            ("/cg/a/memory.max", "1000\n"),
            ("/cg/a/memory.current", "400\n"),
            ("/cg/memory.max", "5000\n"),
            ("/v1/x/memory.limit_in_bytes", "9223372036854771712\n"),
        ]
        .into_iter()
        .collect();
        let read = |p: &str| files.get(p).map(|s| s.to_string());
        let up = |path| headroom_up("/cg", path, "memory.max", "memory.current", &read);
        assert_eq!(up("/a/b\n"), Some(600));
        assert_eq!(up("/a/b/"), Some(600));
        assert_eq!(up("/"), Some(5000));
        assert_eq!(up("/elsewhere"), Some(5000));
        let v1 = headroom_up("/v1", "/x", "memory.limit_in_bytes", "u", &read);
        assert_eq!(v1, None, "v1's unlimited value is no limit");
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
