//! The resource tree clients read (`wd ls`, `wd attr get`) and the host's
//! owner writes (`wd attr set`), laid out like a /sys/class/wd_dev tree.

use std::sync::atomic::Ordering;

use wd_proto::{AttrEntry, Status};
use wd_ring::CLIENT_STAT_NAMES;
use wd_sys::PeerCred;

use crate::config::QueueDetails;
use crate::{HostError, HostInner};

/// An entry the protocol can carry: a value longer than it allows (a
/// store's path from the configuration) is cut, marked with `...`; one
/// such value must not make a whole listing unsendable.
fn entry(path: String, value: impl ToString, writable: bool) -> AttrEntry {
    AttrEntry {
        path: cut(path, wd_proto::limits::MAX_PATH),
        value: cut(value.to_string(), wd_proto::limits::MAX_VALUE),
        writable,
    }
}

fn cut(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut at = max - 3;
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
        s.push_str("...");
    }
    s
}

/// Every attribute whose path starts with `prefix`, as `who` may see it.
///
/// Under `QueueDetails::Owner` (the default) a queue's details (pid, uid,
/// sizes, counters) are shown to its own uid, the host's owner and root;
/// everyone else sees how many other queues a device has
/// (`devN/queues/others`), as a kernel shows other users' processes only
/// as far as /proc's policy allows.
pub fn list(host: &HostInner, who: PeerCred, prefix: &str) -> Vec<AttrEntry> {
    let mut out = Vec::new();
    let sees_all = host.queue_details == QueueDetails::All || may_write(host, who);
    out.push(entry(
        "host/version".into(),
        env!("CARGO_PKG_VERSION"),
        false,
    ));
    out.push(entry("host/pid".into(), wd_sys::getpid(), false));
    out.push(entry(
        "host/protocol".into(),
        wd_proto::PROTOCOL_VERSION,
        false,
    ));
    let st = host.iommu.stats();
    out.push(entry(
        "host/iommu/engines".into(),
        host.iommu.engine_count(),
        false,
    ));
    out.push(entry(
        "host/iommu/domains".into(),
        host.iommu.live_domains(),
        false,
    ));
    out.push(entry("host/iommu/commands".into(), st.commands, false));
    out.push(entry("host/iommu/syncs".into(), st.syncs, false));
    out.push(entry(
        "host/iommu/waited_syncs".into(),
        st.waited_syncs,
        false,
    ));
    out.push(entry("host/iommu/sync_wait_ns".into(), st.wait_ns, false));
    // Before the devices: a listing cut at its limit keeps the host's own.
    limit_attrs(&mut out, host, who, sees_all);
    for (n, d) in host.devices.iter().enumerate() {
        let base = format!("dev{n}");
        out.push(entry(format!("{base}/driver"), d.driver.name(), false));
        if let Some(engine) = d.driver.engine() {
            out.push(entry(format!("{base}/engine"), engine, false));
        }
        for (name, value, writable) in d.driver.attributes() {
            out.push(entry(format!("{base}/{name}"), value, writable));
        }
        out.push(entry(
            format!("{base}/numa_zone_id"),
            d.numa_zone_id.load(Ordering::Relaxed),
            true,
        ));
        out.push(entry(
            format!("{base}/priority"),
            d.priority.load(Ordering::Relaxed),
            true,
        ));
        out.push(entry(format!("{base}/engines"), d.engines.len(), false));
        let asleep = d
            .engines
            .iter()
            .filter(|e| e.sleeping.load(Ordering::Relaxed))
            .count();
        out.push(entry(format!("{base}/engines_sleeping"), asleep, false));
        let (sleeps, wakeups) = d.engines.iter().fold((0, 0), |(s, w), e| {
            (
                s + e.sleeps.sleeps.load(Ordering::Relaxed),
                w + e.sleeps.wakeups.load(Ordering::Relaxed),
            )
        });
        out.push(entry(format!("{base}/engine_sleeps"), sleeps, false));
        out.push(entry(format!("{base}/engine_wakeups"), wakeups, false));
        for t in &d.types {
            let tb = format!(
                "{base}/mdev_supported_types/{}-{}",
                d.driver.name(),
                t.info.name
            );
            out.push(entry(format!("{tb}/name"), t.info.name, false));
            out.push(entry(
                format!("{tb}/flags"),
                format!("{:#x}", t.info.flags),
                false,
            ));
            out.push(entry(
                format!("{tb}/available_instances"),
                t.available.load(Ordering::Relaxed),
                false,
            ));
            out.push(entry(format!("{tb}/device_api"), t.info.device_api, false));
        }
        let queues = host.queues.lock().unwrap_or_else(|e| e.into_inner());
        let mut ids: Vec<_> = queues.values().filter(|q| q.device == n).collect();
        ids.sort_by_key(|q| q.id);
        let (mine, others): (Vec<_>, Vec<_>) = ids
            .into_iter()
            .partition(|q| sees_all || q.owner.uid == who.uid);
        if !sees_all {
            out.push(entry(format!("{base}/queues/others"), others.len(), false));
        }
        for q in mine {
            let qb = format!("{base}/queues/q{}", q.id);
            out.push(entry(format!("{qb}/pid"), q.owner.pid, false));
            out.push(entry(format!("{qb}/uid"), q.owner.uid, false));
            out.push(entry(format!("{qb}/alg"), &q.alg_name, false));
            out.push(entry(format!("{qb}/depth"), q.depth, false));
            out.push(entry(
                format!("{qb}/flags"),
                format!("{:#x}", q.flags),
                false,
            ));
            out.push(entry(
                format!("{qb}/state"),
                format!("{:?}", q.state()).to_lowercase(),
                false,
            ));
            out.push(entry(format!("{qb}/shared_ranges"), q.share_count(), false));
            out.push(entry(
                format!("{qb}/requests"),
                q.requests.load(Ordering::Relaxed),
                false,
            ));
            out.push(entry(
                format!("{qb}/bytes"),
                q.bytes.load(Ordering::Relaxed),
                false,
            ));
            out.push(entry(
                format!("{qb}/in_flight"),
                q.in_flight.load(Ordering::Relaxed),
                false,
            ));
            out.push(entry(
                format!("{qb}/faults"),
                q.fault_count.load(Ordering::Relaxed),
                false,
            ));
            iommu_attrs(&mut out, &format!("{qb}/iommu"), q);
            // What the client's libraries report (e.g. wd-crypto's CPU
            // fallbacks): shown, never trusted.
            let cs = q.client_stats();
            if cs.iter().any(|&v| v != 0) {
                for (name, v) in CLIENT_STAT_NAMES.iter().zip(cs) {
                    out.push(entry(format!("{qb}/client/{name}"), v, false));
                }
            }
            let qs = q.queue_stats();
            if qs.iter().any(|&v| v != 0) {
                for (name, v) in wd_ring::QUEUE_STAT_NAMES.iter().zip(qs) {
                    out.push(entry(format!("{qb}/client/{name}"), v, false));
                }
            }
            // The client's sampled latencies of the last seconds, as
            // bucket bounds (within 25% above the true percentile).
            let hist = q.latency();
            if let Some(p50) = wd_ring::latency_percentile(&hist, 0.5) {
                let samples = hist.iter().fold(0u64, |a, &n| a.saturating_add(n));
                out.push(entry(
                    format!("{qb}/client/latency_samples"),
                    samples,
                    false,
                ));
                for (name, v) in [
                    ("p50", p50),
                    (
                        "p99",
                        wd_ring::latency_percentile(&hist, 0.99).unwrap_or(p50),
                    ),
                ] {
                    let v = if v == u64::MAX {
                        "inf".to_string()
                    } else {
                        v.to_string()
                    };
                    out.push(entry(format!("{qb}/client/latency_{name}_ns"), v, false));
                }
            }
        }
    }
    out.retain(|e| e.path.starts_with(prefix));
    cut_listing(&mut out);
    out
}

/// Bytes an entry takes in a reply (two strings and a flag).
fn encoded(e: &AttrEntry) -> usize {
    2 + e.path.len() + 2 + e.value.len() + 1
}

/// Keep a listing within what one reply carries (MAX_ATTRS entries, a
/// body of MAX_BODY): one cut is said, not silent, in a last entry
/// `truncated` (the caller can list a narrower prefix).
fn cut_listing(out: &mut Vec<AttrEntry>) {
    use wd_proto::limits::{MAX_ATTRS, MAX_BODY};
    // Room for the list's count, the marker and the frame's other fields.
    let room = MAX_BODY - 1024;
    let total: usize = out.iter().map(encoded).sum();
    if out.len() <= MAX_ATTRS && total <= room {
        return;
    }
    let mut bytes = 0;
    let keep = out
        .iter()
        .take(MAX_ATTRS - 1)
        .take_while(|e| {
            bytes += encoded(e);
            bytes <= room
        })
        .count();
    let more = out.len() - keep;
    out.truncate(keep);
    out.push(entry(
        "truncated".into(),
        format!("{more} more attributes not listed: list a narrower prefix"),
        false,
    ));
}

/// The limits in force, and what each user holds (only one's own unless
/// one may see everything).
fn limit_attrs(out: &mut Vec<AttrEntry>, host: &HostInner, who: PeerCred, sees_all: bool) {
    let l = host.quotas.limits();
    for (name, v) in [
        ("connections_per_uid", l.connections_per_uid as u64),
        ("queues_per_uid", l.queues_per_uid as u64),
        ("queue_type_percent", l.queue_type_percent as u64),
        ("shares_per_uid", l.shares_per_uid as u64),
        ("mapped_bytes_per_uid", l.mapped_bytes_per_uid),
        ("table_bytes_per_uid", l.table_bytes_per_uid),
        ("hello_timeout_ms", l.hello_timeout_ms),
        ("reserved_connections", l.reserved_connections as u64),
        ("pass_bytes", l.pass_bytes),
    ] {
        out.push(entry(format!("host/limits/{name}"), v, false));
    }
    out.push(entry(
        "host/limits/exempt_owner".into(),
        l.exempt_owner,
        false,
    ));
    let (maps, budget) = host.quotas.mappings();
    out.push(entry("host/mappings".into(), maps, false));
    out.push(entry("host/mappings_budget".into(), budget, false));
    for (uid, u) in host.quotas.users() {
        if !sees_all && uid != who.uid {
            continue;
        }
        let b = format!("host/users/{uid}");
        out.push(entry(format!("{b}/connections"), u.connections, false));
        out.push(entry(format!("{b}/queues"), u.queues, false));
        out.push(entry(format!("{b}/shares"), u.shares, false));
        out.push(entry(format!("{b}/mapped_bytes"), u.mapped_bytes, false));
        out.push(entry(
            format!("{b}/table_bytes"),
            host.quotas.table_bytes(uid),
            false,
        ));
    }
}

/// A queue's IOMMU state: what it translates through and that domain's
/// policy and sizes.
fn iommu_attrs(out: &mut Vec<AttrEntry>, base: &str, q: &crate::queue::Queue) {
    let (attached, dom) = match q.endpoint.attachment() {
        wd_iommu::Attachment::Blocked => ("blocked", q.domain().clone()),
        wd_iommu::Attachment::Domain(d) if std::sync::Arc::ptr_eq(&d, q.domain()) => ("own", d),
        wd_iommu::Attachment::Domain(d) => ("virtio", d),
    };
    // Never waited for: a flush or teardown holds the domain's lock while
    // it waits for requests a device holds (as long as their client
    // likes), and a listing holds the host's table of queues, which every
    // client's queue request and teardown needs.
    let st = dom.try_stats();
    let mode = match dom.mode() {
        wd_iommu::InvalidationMode::Strict => "strict",
        wd_iommu::InvalidationMode::Deferred => "deferred",
    };
    let policy = match dom.fault_policy() {
        wd_iommu::FaultPolicy::Abort => "abort",
        wd_iommu::FaultPolicy::Stall => "stall",
    };
    out.push(entry(format!("{base}/attached"), attached, false));
    out.push(entry(format!("{base}/mode"), mode, false));
    out.push(entry(format!("{base}/fault_policy"), policy, false));
    let Some(st) = st else {
        for name in [
            "mapped_bytes",
            "table_pages",
            "fq_pending",
            "flushes",
            "stalled",
        ] {
            out.push(entry(format!("{base}/{name}"), "busy", false));
        }
        return;
    };
    out.push(entry(
        format!("{base}/mapped_bytes"),
        st.mapped_bytes,
        false,
    ));
    out.push(entry(format!("{base}/table_pages"), st.table_pages, false));
    out.push(entry(format!("{base}/fq_pending"), st.fq_pending, false));
    out.push(entry(format!("{base}/flushes"), st.flushes, false));
    out.push(entry(format!("{base}/stalled"), st.stalled, false));
}

/// One attribute's value.
pub fn get(host: &HostInner, who: PeerCred, path: &str) -> Result<String, HostError> {
    list(host, who, path)
        .into_iter()
        .find(|e| e.path == path)
        .map(|e| e.value)
        .ok_or_else(|| HostError::Status(Status::NotFound, format!("no attribute '{path}'")))
}

/// Who may write attributes: the host's own user, or root.
pub fn may_write(host: &HostInner, who: PeerCred) -> bool {
    who.uid == 0 || who.uid == host.owner_uid
}

/// Write a writable attribute.
pub fn set(host: &HostInner, who: PeerCred, path: &str, value: &str) -> Result<(), HostError> {
    let (dev, attr) = path
        .strip_prefix("dev")
        .and_then(|r| r.split_once('/'))
        .ok_or_else(|| {
            HostError::Status(Status::NotFound, format!("no writable attribute '{path}'"))
        })?;
    let d = dev
        .parse::<usize>()
        .ok()
        .and_then(|n| host.devices.get(n))
        .ok_or_else(|| HostError::Status(Status::NotFound, format!("no device 'dev{dev}'")))?;
    let device_attr = d
        .driver
        .attributes()
        .into_iter()
        .any(|(name, _, writable)| writable && name == attr);
    if !device_attr && !matches!(attr, "numa_zone_id" | "priority") {
        let exists = list(host, who, path).iter().any(|e| e.path == path);
        let status = if exists {
            Status::Permission
        } else {
            Status::NotFound
        };
        return Err(HostError::Status(
            status,
            format!("attribute '{path}' is not writable"),
        ));
    }
    if !may_write(host, who) {
        return Err(HostError::Status(
            Status::Permission,
            format!(
                "uid {} may not write '{path}': only the host's owner (uid {}) or root",
                who.uid, host.owner_uid
            ),
        ));
    }
    let bad = || {
        HostError::Status(
            Status::Invalid,
            format!("'{value}' is not a valid value for {attr}"),
        )
    };
    match attr {
        _ if device_attr => {
            return d
                .driver
                .set_attribute(attr, value)
                .map_err(|e| HostError::Status(Status::Invalid, format!("{path}: {e}")))
        }
        "numa_zone_id" => {
            let v: i32 = value.trim().parse().map_err(|_| bad())?;
            if !(0..=1023).contains(&v) {
                return Err(bad());
            }
            d.numa_zone_id.store(v, Ordering::Relaxed);
        }
        _ => {
            let v: u32 = value.trim().parse().map_err(|_| bad())?;
            d.priority.store(v, Ordering::Relaxed);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use wd_proto::limits::{MAX_ATTRS, MAX_PATH, MAX_VALUE};

    fn listing(n: usize, path: usize, value: usize) -> Vec<AttrEntry> {
        (0..n)
            .map(|i| {
                entry(
                    format!("{i}/{}", "p".repeat(path)),
                    "v".repeat(value),
                    false,
                )
            })
            .collect()
    }

    fn sendable(list: Vec<AttrEntry>) -> bool {
        wd_proto::encode(&wd_proto::Message::Attrs { entries: list }, 1).is_ok()
    }

    #[test]
    fn a_listing_is_cut_to_what_one_reply_carries_and_says_so() {
        let mut small = listing(10, 10, 10);
        cut_listing(&mut small);
        assert_eq!(small.len(), 10, "nothing cut");
        let mut many = listing(MAX_ATTRS + 100, 4, 4);
        cut_listing(&mut many);
        assert_eq!(many.len(), MAX_ATTRS);
        assert_eq!(many[MAX_ATTRS - 1].path, "truncated");
        assert!(many[MAX_ATTRS - 1].value.starts_with("101 more"));
        assert!(sendable(many));
        let mut long = listing(4000, MAX_PATH, MAX_VALUE);
        assert!(long
            .iter()
            .all(|e| e.path.len() <= MAX_PATH && e.value.len() <= MAX_VALUE));
        cut_listing(&mut long);
        assert!(long.len() < 4000);
        assert_eq!(long.last().unwrap().path, "truncated");
        assert!(sendable(long));
    }
}
