//! What a host holds for its clients, from its own attribute tree and its
//! descriptor table: the figures that must come back to where they were
//! once every client is gone (queues, shares, mapped bytes, connections,
//! IOMMU domains, device sessions and the plaintext held for cut
//! decryptions, namespace grants, free instances).
//!
//! Pure: the caller reads the tree and `/proc`; this module picks the
//! figures and compares two readings.

use std::collections::BTreeMap;

/// The figures of one reading, by name (attribute path, or `host/fds`).
pub type Ledger = BTreeMap<String, String>;

/// Whether an attribute is one of the ledger's figures.
fn counted(path: &str) -> bool {
    let parts: Vec<&str> = path.split('/').collect();
    match parts.as_slice() {
        ["host", "users", _, what] => {
            matches!(*what, "connections" | "queues" | "shares" | "mapped_bytes")
        }
        ["host", "mappings"] | ["host", "iommu", "domains"] => true,
        [dev, "sessions" | "open_bytes"] => dev.starts_with("dev"),
        [dev, "mdev_supported_types", _, "available_instances"] => dev.starts_with("dev"),
        [dev, "nvme", ns, "controller"] => dev.starts_with("dev") && ns.starts_with("ns"),
        _ => false,
    }
}

/// The ledger of an attribute listing (path, value) plus the host's open
/// descriptors. Live queues are counted per device (`devN/queues/<id>/...`
/// entries name them) and users with nothing held are left out, so a user
/// that appears or vanishes with zero everywhere is no difference.
pub fn ledger<'a>(attrs: impl IntoIterator<Item = (&'a str, &'a str)>, fds: usize) -> Ledger {
    let mut out = Ledger::new();
    let mut queues: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
    for (path, value) in attrs {
        if let [dev, "queues", id, _] = path.split('/').collect::<Vec<_>>().as_slice() {
            if dev.starts_with("dev") && *id != "others" {
                queues
                    .entry(format!("{dev}/live_queues"))
                    .or_default()
                    .insert(id.to_string());
            }
        }
        if counted(path) {
            if path.starts_with("host/users/") && value == "0" {
                continue;
            }
            out.insert(path.to_string(), value.to_string());
        }
        if path.ends_with("/queues/others") && value != "0" {
            out.insert(path.to_string(), value.to_string());
        }
    }
    for (k, ids) in queues {
        out.insert(k, ids.len().to_string());
    }
    out.insert("host/fds".to_string(), fds.to_string());
    out
}

/// Every figure that differs between `base` and `now`, as "name: was A,
/// now B" (a figure missing on one side reads as 0).
pub fn leaks(base: &Ledger, now: &Ledger) -> Vec<String> {
    let keys: std::collections::BTreeSet<&String> = base.keys().chain(now.keys()).collect();
    keys.into_iter()
        .filter_map(|k| {
            let a = base.get(k).map_or("0", String::as_str);
            let b = now.get(k).map_or("0", String::as_str);
            (a != b).then(|| format!("{k}: was {a}, now {b}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
        let mut v = vec![
            ("host/pid", "42"),
            ("host/mappings", "0"),
            ("host/iommu/domains", "0"),
            ("host/iommu/commands", "1234"),
            ("host/users/0/connections", "1"),
            ("host/users/0/queues", "0"),
            ("host/users/0/shares", "0"),
            ("host/users/0/mapped_bytes", "0"),
            ("dev0/driver", "dummy"),
            ("dev0/engine_sleeps", "7"),
            (
                "dev0/mdev_supported_types/dummy-memcpy/available_instances",
                "64",
            ),
            ("dev1/sessions", "0"),
            ("dev1/open_bytes", "0"),
            ("dev2/nvme/ns1/controller", "none"),
            ("dev2/nvme/ns1/size", "16777216"),
        ];
        v.extend_from_slice(extra);
        v
    }

    #[test]
    fn counters_that_move_with_work_are_not_figures() {
        let a = ledger(tree(&[]), 10);
        let mut t = tree(&[]);
        t[3] = ("host/iommu/commands", "99999");
        t[9] = ("dev0/engine_sleeps", "8");
        assert!(leaks(&a, &ledger(t, 10)).is_empty());
        assert_eq!(a["host/fds"], "10");
        assert_eq!(a["host/users/0/connections"], "1");
        assert!(!a.contains_key("host/users/0/queues"), "zeros left out");
    }

    #[test]
    fn every_kind_of_leak_is_named() {
        let base = ledger(tree(&[]), 10);
        let now = ledger(
            tree(&[
                ("host/users/1000/queues", "1"),
                ("host/users/1000/connections", "0"),
                ("dev0/queues/17/pid", "555"),
                ("dev0/queues/17/depth", "16"),
                ("dev0/queues/others", "2"),
            ])
            .into_iter()
            .map(|(k, v)| match k {
                "host/iommu/domains" => (k, "1"),
                "dev1/sessions" => (k, "3"),
                "dev1/open_bytes" => (k, "1048576"),
                "dev2/nvme/ns1/controller" => (k, "5"),
                "dev0/mdev_supported_types/dummy-memcpy/available_instances" => (k, "63"),
                _ => (k, v),
            }),
            11,
        );
        let l = leaks(&base, &now);
        let has = |s: &str| l.iter().any(|x| x.starts_with(s));
        for k in [
            "host/users/1000/queues: was 0, now 1",
            "dev0/live_queues: was 0, now 1",
            "dev0/queues/others: was 0, now 2",
            "host/iommu/domains: was 0, now 1",
            "dev1/sessions: was 0, now 3",
            "dev1/open_bytes: was 0, now 1048576",
            "dev2/nvme/ns1/controller: was none, now 5",
            "dev0/mdev_supported_types/dummy-memcpy/available_instances: was 64, now 63",
            "host/fds: was 10, now 11",
        ] {
            assert!(has(k), "{k} missing from {l:?}");
        }
        assert_eq!(l.len(), 9, "{l:?}");
    }
}
