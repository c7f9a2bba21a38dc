//! `wd faults QUEUE`: the newest IOMMU faults of a queue, without consuming
//! them (the queue's owner, the host's owner or root).

use crate::report::outln;
use wrapdrive::HostConn;

/// Options of `wd faults`.
#[derive(clap::Args)]
pub struct FaultsArgs {
    /// Queue id (as `wd ls` and `wd top` show it: 7, q7 or dev0/queues/q7;
    /// with a device, the queue must be on it).
    #[arg(value_parser = queue_id)]
    queue: QueueRef,
    /// Most faults to show (the newest).
    #[arg(long, default_value_t = 32)]
    max: u32,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

/// A queue as the user named it: its id, and the device when given as a
/// path (checked against the host: a path naming the wrong device is a
/// mistake to report, not to ignore).
#[derive(Clone, Debug, PartialEq, Eq)]
struct QueueRef {
    device: Option<String>,
    id: u32,
}

/// A queue id as the user copies it from `wd ls` or `wd top`: `7`, `q7`
/// or `dev0/queues/q7`, and nothing else (another path would be taken for
/// a queue it does not name).
fn queue_id(s: &str) -> Result<QueueRef, String> {
    let bad =
        || format!("'{s}' is not a queue id (e.g. 7, q7 or dev0/queues/q7, as `wd ls` shows)");
    let (device, id) = match s.split('/').collect::<Vec<_>>()[..] {
        [id] => (None, id),
        [dev, "queues", id]
            if id.starts_with('q')
                && dev
                    .strip_prefix("dev")
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())) =>
        {
            (Some(dev.to_string()), id)
        }
        _ => return Err(bad()),
    };
    let id = id.strip_prefix('q').unwrap_or(id);
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let id = id.parse().map_err(|_| bad())?;
    Ok(QueueRef { device, id })
}

/// Refuse a queue named on a device it is not on, saying where it is
/// (the attribute tree shows a queue to whoever may read its faults).
fn check_device(h: &HostConn, q: &QueueRef) -> Result<(), String> {
    let Some(dev) = &q.device else {
        return Ok(());
    };
    let entries = h.attrs("").map_err(|e| e.to_string())?;
    let tail = format!("/queues/q{}/", q.id);
    let on = |d: &str| {
        entries
            .iter()
            .any(|e| e.path.starts_with(&format!("{d}{tail}")))
    };
    if on(dev) {
        return Ok(());
    }
    if !entries
        .iter()
        .any(|e| e.path.starts_with(&format!("{dev}/")))
    {
        return Err(format!(
            "{dev}/queues/q{}: the host has no device {dev}",
            q.id
        ));
    }
    let elsewhere = entries.iter().find_map(|e| {
        let (d, rest) = e.path.split_once('/')?;
        rest.starts_with(&tail[1..]).then(|| d.to_string())
    });
    Err(match elsewhere {
        Some(d) => format!(
            "{dev}/queues/q{id}: queue {id} is not on {dev} (it is on {d}: {d}/queues/q{id})",
            id = q.id
        ),
        None => format!("{dev}/queues/q{id}: queue {id} is not on {dev}", id = q.id),
    })
}

fn access(a: wd_proto::Access) -> &'static str {
    match a {
        wd_proto::Access::Read => "read",
        wd_proto::Access::Write => "write",
    }
}

fn reason(r: wd_proto::FaultReason) -> &'static str {
    match r {
        wd_proto::FaultReason::Unmapped => "unmapped",
        wd_proto::FaultReason::Permission => "permission",
        wd_proto::FaultReason::OutOfRange => "out of range",
        wd_proto::FaultReason::NoDomain => "no domain",
    }
}

/// Print the faults of a queue.
pub fn run(h: &HostConn, args: FaultsArgs) -> Result<(), String> {
    // The device first: a queue that closes before its faults are read is
    // then "no queue", not "not on devN".
    check_device(h, &args.queue)?;
    let r = h
        .peek_faults(args.queue.id, args.max)
        .map_err(|e| e.to_string())?;
    if args.json {
        let events: Vec<_> = r
            .events
            .iter()
            .map(|e| {
                serde_json::json!({
                    "seq": e.seq,
                    "iova": format!("{:#x}", e.iova),
                    "pasid": e.pasid,
                    "access": access(e.access),
                    "reason": reason(e.reason),
                })
            })
            .collect();
        let v = serde_json::json!({
            "queue": args.queue.id,
            "total": r.total,
            "lost": r.lost,
            "events": events,
        });
        crate::report::print_json(&v);
        return Ok(());
    }
    outln!(
        "queue {}: {} fault(s) recorded, {} lost to overflow, newest {} held:",
        args.queue.id,
        r.total,
        r.lost,
        r.events.len()
    );
    if !r.events.is_empty() {
        outln!(
            "{:>8}  {:>18}  {:>6}  {:<6}  reason",
            "seq",
            "iova",
            "pasid",
            "access"
        );
    }
    for e in &r.events {
        outln!(
            "{:>8}  {:>#18x}  {:>6}  {:<6}  {}",
            e.seq,
            e.iova,
            e.pasid,
            access(e.access),
            reason(e.reason)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_ids_in_the_documented_forms_only() {
        let q = |device: Option<&str>, id| QueueRef {
            device: device.map(str::to_string),
            id,
        };
        assert_eq!(queue_id("7"), Ok(q(None, 7)));
        assert_eq!(queue_id("q7"), Ok(q(None, 7)));
        assert_eq!(queue_id("dev1/queues/q315"), Ok(q(Some("dev1"), 315)));
        for bad in [
            "",
            "q",
            "x7",
            "dev0/q7",
            "dev0/queues/7",
            "dev0/queues/qq7",
            "foo/queues/q7",
            "dev/queues/q7",
            "dev0/queues/q7/alg",
            "/q7",
            "q-1",
            "q+7",
        ] {
            assert!(queue_id(bad).is_err(), "{bad}");
        }
    }
}
