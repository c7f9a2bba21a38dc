//! `wd faults QUEUE`: the newest IOMMU faults of a queue, without consuming
//! them (the queue's owner, the host's owner or root).

use crate::report::outln;
use wrapdrive::HostConn;

/// Options of `wd faults`.
#[derive(clap::Args)]
pub struct FaultsArgs {
    /// Queue id (as `wd ls` and `wd top` show it: 7, q7 or dev0/queues/q7).
    #[arg(value_parser = queue_id)]
    queue: u32,
    /// Most faults to show (the newest).
    #[arg(long, default_value_t = 32)]
    max: u32,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

/// A queue id as the user copies it from `wd ls` or `wd top`: `7`, `q7`
/// or `dev0/queues/q7`.
fn queue_id(s: &str) -> Result<u32, String> {
    let id = s.rsplit('/').next().unwrap_or(s);
    let id = id.strip_prefix('q').unwrap_or(id);
    id.parse().map_err(|_| {
        format!("'{s}' is not a queue id (e.g. 7, q7 or dev0/queues/q7, as `wd ls` shows)")
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
    let r = h
        .peek_faults(args.queue, args.max)
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
            "queue": args.queue,
            "total": r.total,
            "lost": r.lost,
            "events": events,
        });
        crate::report::print_json(&v);
        return Ok(());
    }
    outln!(
        "queue {}: {} fault(s) recorded, {} lost to overflow, newest {} held:",
        args.queue,
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
