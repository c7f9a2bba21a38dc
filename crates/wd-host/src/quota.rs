//! Who holds what: per-user accounting of connections, queues and shared
//! memory, and the host-wide budgets behind them.
//!
//! Every local user can talk to the host, so nothing one of them can take
//! is unbounded: each resource is charged to the uid that asked (from
//! SO_PEERCRED) when it is granted, and the charge is a value whose drop
//! gives it back, so no teardown path can forget to. Root and the host's
//! owner may be exempt from the per-user limits (`Limits::exempt_owner`),
//! never from the host-wide ones.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use wd_iommu::TableBudget;

use wd_proto::Status;

use crate::config::{Limits, MAX_CONNECTIONS};
use crate::HostError;

/// What one uid holds now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Open connections.
    pub connections: u32,
    /// Queues, over every device.
    pub queues: u32,
    /// Ranges mapped into the host.
    pub shares: u32,
    /// Bytes of those ranges.
    pub mapped_bytes: u64,
    /// Queues per (device, queue type).
    per_type: HashMap<(usize, usize), u32>,
}

impl Usage {
    pub(crate) fn is_empty(&self) -> bool {
        self.connections == 0 && self.queues == 0 && self.shares == 0
    }
}

/// A resource to charge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resource {
    /// A client connection.
    Connection,
    /// A queue of a device's queue type with `instances` instances in all.
    Queue {
        /// Device index.
        device: usize,
        /// Queue type index.
        qtype: usize,
        /// Instances the type has in all.
        instances: u32,
    },
    /// A range of client memory mapped into the host.
    Share {
        /// Its length.
        bytes: u64,
    },
}

#[derive(Default)]
struct Table {
    users: HashMap<u32, Usage>,
    connections: usize,
    mappings: u64,
    /// Each uid's page-table budget, alive while a domain of it is.
    tables: HashMap<u32, Weak<TableBudget>>,
}

/// The host's accounting.
pub struct Quotas {
    limits: Limits,
    owner: u32,
    /// Host-wide mappings of client memory allowed: the kernel's
    /// `vm.max_map_count` less what the host needs for itself (thread
    /// stacks, rings, libraries), so a flood of shares ends in a clear
    /// refusal, not in failed thread creation or ring mapping.
    max_mappings: u64,
    table: Mutex<Table>,
}

/// Mappings kept for the host's own use out of `vm.max_map_count`.
const MAPPING_HEADROOM: u64 = 8192;

/// Kernel mappings one shared range may cost the host: its own, and the
/// pieces it splits its file window's PROT_NONE reservation into
/// (`wd_sys::window`). A window of `n` live ranges is at most `n` mappings
/// and `n + 1` pieces of reservation, and lives only while it holds a
/// range: three per range bound it. Counted as one, ranges that touch
/// nothing (every other page of a file) ran the host out of mappings at
/// half its budget.
pub const MAPPINGS_PER_SHARE: u64 = 3;

fn max_map_count() -> u64 {
    std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(65530)
}

impl Quotas {
    /// Accounting for a host owned by `owner` under `limits`.
    pub fn new(limits: Limits, owner: u32) -> Arc<Quotas> {
        let maps = max_map_count();
        Arc::new(Quotas {
            limits,
            owner,
            max_mappings: maps.saturating_sub(MAPPING_HEADROOM.min(maps / 2)),
            table: Mutex::new(Table::default()),
        })
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Whether `uid` is trusted like the host itself (root or the owner).
    pub fn privileged(&self, uid: u32) -> bool {
        uid == 0 || uid == self.owner
    }

    fn exempt(&self, uid: u32) -> bool {
        self.limits.exempt_owner && self.privileged(uid)
    }

    /// What `uid` holds now.
    pub fn usage(&self, uid: u32) -> Usage {
        self.lock().users.get(&uid).cloned().unwrap_or_default()
    }

    /// Every uid holding something, with its usage.
    pub fn users(&self) -> Vec<(u32, Usage)> {
        let mut v: Vec<_> = self
            .lock()
            .users
            .iter()
            .map(|(u, x)| (*u, x.clone()))
            .collect();
        v.sort_by_key(|x| x.0);
        v
    }

    /// The page-table budget the domains of `uid` share
    /// (`limits.table_bytes_per_uid`); none for an exempt user.
    pub fn table_budget(&self, uid: u32) -> Option<Arc<TableBudget>> {
        if self.exempt(uid) {
            return None;
        }
        let mut t = self.lock();
        if let Some(b) = t.tables.get(&uid).and_then(Weak::upgrade) {
            return Some(b);
        }
        t.tables.retain(|_, b| b.strong_count() > 0);
        let b = TableBudget::new(self.limits.table_bytes_per_uid / wd_iommu::PAGE_SIZE);
        t.tables.insert(uid, Arc::downgrade(&b));
        Some(b)
    }

    /// Bytes of page tables `uid`'s domains hold (none counted for an
    /// exempt user).
    pub fn table_bytes(&self, uid: u32) -> u64 {
        self.lock()
            .tables
            .get(&uid)
            .and_then(Weak::upgrade)
            .map_or(0, |b| b.used() * wd_iommu::PAGE_SIZE)
    }

    /// Host-wide kernel mappings of client memory now (counted
    /// [`MAPPINGS_PER_SHARE`] a shared range), and the budget.
    pub fn mappings(&self) -> (u64, u64) {
        (self.lock().mappings, self.max_mappings)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Charge `res` to `uid`, or say which limit refuses it.
    pub fn charge(self: &Arc<Self>, uid: u32, res: Resource) -> Result<Charge, HostError> {
        let mut t = self.lock();
        let r = self.admit(&mut t, uid, res);
        // A refused first charge leaves no entry: a user is listed while
        // it holds something.
        if r.is_err() && t.users.get(&uid).is_some_and(Usage::is_empty) {
            t.users.remove(&uid);
        }
        r.map(|()| Charge {
            quotas: self.clone(),
            uid,
            res,
        })
    }

    fn admit(&self, t: &mut Table, uid: u32, res: Resource) -> Result<(), HostError> {
        let l = &self.limits;
        let exempt = self.exempt(uid);
        let Table {
            users,
            connections,
            mappings,
            ..
        } = t;
        let u = users.entry(uid).or_default();
        let quota = |what: String| Err(HostError::Status(Status::Quota, what));
        match res {
            Resource::Connection => {
                let room = if self.privileged(uid) {
                    MAX_CONNECTIONS
                } else {
                    MAX_CONNECTIONS - l.reserved_connections as usize
                };
                if *connections >= room {
                    return Err(HostError::Status(
                        Status::Busy,
                        format!("host has too many connections ({connections}); try again later"),
                    ));
                }
                if !exempt && u.connections >= l.connections_per_uid {
                    return quota(format!(
                        "uid {uid} already holds {} connections (limits.connections_per_uid)",
                        u.connections
                    ));
                }
                u.connections += 1;
                *connections += 1;
            }
            Resource::Queue {
                device,
                qtype,
                instances,
            } => {
                let of_type = u.per_type.get(&(device, qtype)).copied().unwrap_or(0);
                let type_cap = (instances as u64 * l.queue_type_percent as u64 / 100).max(1);
                if !exempt {
                    if u.queues >= l.queues_per_uid {
                        return quota(format!(
                            "uid {uid} already holds {} queues (limits.queues_per_uid)",
                            u.queues
                        ));
                    }
                    if of_type as u64 >= type_cap {
                        return quota(format!(
                            "uid {uid} already holds {of_type} of this queue type's {instances} instances (limits.queue_type_percent = {}%)",
                            l.queue_type_percent
                        ));
                    }
                }
                u.queues += 1;
                *u.per_type.entry((device, qtype)).or_default() += 1;
            }
            Resource::Share { bytes } => {
                // The size is the client's word, exempt users' too: past
                // u64 it is over any user's limit, and over any memory.
                let total = u.mapped_bytes.checked_add(bytes);
                if !exempt && total.is_none_or(|t| t > l.mapped_bytes_per_uid) {
                    return quota(format!(
                        "uid {uid} has {} bytes mapped; {bytes} more exceed limits.mapped_bytes_per_uid ({})",
                        u.mapped_bytes, l.mapped_bytes_per_uid
                    ));
                }
                let Some(total) = total else {
                    return Err(HostError::Status(
                        Status::TooBig,
                        format!("a share of {bytes} bytes is larger than any memory"),
                    ));
                };
                if *mappings + MAPPINGS_PER_SHARE > self.max_mappings {
                    return Err(HostError::Status(
                        Status::NoMemory,
                        format!(
                            "the host maps {} shared ranges, its budget (vm.max_map_count less {MAPPING_HEADROOM} for itself, {MAPPINGS_PER_SHARE} mappings a range); unshare ranges or share larger ones",
                            *mappings / MAPPINGS_PER_SHARE
                        ),
                    ));
                }
                if !exempt && u.shares >= l.shares_per_uid {
                    return quota(format!(
                        "uid {uid} already has {} shared ranges mapped (limits.shares_per_uid)",
                        u.shares
                    ));
                }
                u.shares += 1;
                u.mapped_bytes = total;
                *mappings += MAPPINGS_PER_SHARE;
            }
        }
        Ok(())
    }

    fn uncharge(&self, uid: u32, res: Resource) {
        let mut t = self.lock();
        let Table {
            users,
            connections,
            mappings,
            ..
        } = &mut *t;
        let Some(u) = users.get_mut(&uid) else {
            return;
        };
        match res {
            Resource::Connection => {
                u.connections -= 1;
                *connections -= 1;
            }
            Resource::Queue { device, qtype, .. } => {
                u.queues -= 1;
                if let Some(n) = u.per_type.get_mut(&(device, qtype)) {
                    *n -= 1;
                    if *n == 0 {
                        u.per_type.remove(&(device, qtype));
                    }
                }
            }
            Resource::Share { bytes } => {
                u.shares -= 1;
                u.mapped_bytes -= bytes;
                *mappings -= MAPPINGS_PER_SHARE;
            }
        }
        if u.is_empty() {
            users.remove(&uid);
        }
    }
}

/// A granted resource; dropping it gives the resource back.
#[must_use = "dropping a charge releases it at once"]
pub struct Charge {
    quotas: Arc<Quotas>,
    uid: u32,
    res: Resource,
}

impl std::fmt::Debug for Charge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Charge(uid {}, {:?})", self.uid, self.res)
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.quotas.uncharge(self.uid, self.res);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            connections_per_uid: 2,
            queues_per_uid: 3,
            queue_type_percent: 50,
            shares_per_uid: 2,
            mapped_bytes_per_uid: 10_000,
            exempt_owner: true,
            ..Limits::default()
        }
    }

    fn status(r: Result<Charge, HostError>) -> Status {
        r.map(|_| Status::Ok).unwrap_or_else(|e| e.status())
    }

    #[test]
    fn per_uid_limits_refuse_and_recover() {
        let q = Quotas::new(limits(), 1000);
        let a = q.charge(7, Resource::Connection).unwrap();
        let _b = q.charge(7, Resource::Connection).unwrap();
        assert_eq!(status(q.charge(7, Resource::Connection)), Status::Quota);
        // Another user is not affected, the owner is exempt.
        let _c = q.charge(8, Resource::Connection).unwrap();
        let owner: Vec<_> = (0..5)
            .map(|_| q.charge(1000, Resource::Connection).unwrap())
            .collect();
        drop(a);
        let _d = q.charge(7, Resource::Connection).unwrap();
        drop(owner);
        assert_eq!(q.usage(1000), Usage::default());
        assert_eq!(q.usage(7).connections, 2);
    }

    #[test]
    fn a_refused_charge_lists_no_user() {
        let q = Quotas::new(
            Limits {
                connections_per_uid: 0,
                shares_per_uid: 0,
                ..limits()
            },
            1000,
        );
        assert_eq!(status(q.charge(4242, Resource::Connection)), Status::Quota);
        let share = Resource::Share { bytes: 4096 };
        assert_eq!(status(q.charge(4243, share)), Status::Quota);
        assert!(q.users().is_empty(), "{:?}", q.users());
    }

    #[test]
    fn queue_type_share() {
        let q = Quotas::new(limits(), 1000);
        let t = Resource::Queue {
            device: 0,
            qtype: 0,
            instances: 4,
        };
        let _a = q.charge(7, t).unwrap();
        let _b = q.charge(7, t).unwrap();
        // Half of 4 instances.
        assert_eq!(status(q.charge(7, t)), Status::Quota);
        let other = Resource::Queue {
            device: 1,
            qtype: 0,
            instances: 4,
        };
        let _c = q.charge(7, other).unwrap();
        // queues_per_uid = 3
        assert_eq!(status(q.charge(7, other)), Status::Quota);
    }

    #[test]
    fn shares_and_bytes() {
        let q = Quotas::new(limits(), 1000);
        let a = q.charge(7, Resource::Share { bytes: 6000 }).unwrap();
        assert_eq!(
            status(q.charge(7, Resource::Share { bytes: 6000 })),
            Status::Quota
        );
        let _b = q.charge(7, Resource::Share { bytes: 4000 }).unwrap();
        assert_eq!(
            status(q.charge(7, Resource::Share { bytes: 1 })),
            Status::Quota
        );
        assert_eq!(q.mappings().0, 2 * MAPPINGS_PER_SHARE);
        drop(a);
        assert_eq!(q.usage(7).mapped_bytes, 4000);
        assert_eq!(q.mappings().0, MAPPINGS_PER_SHARE);
    }

    #[test]
    fn reserved_connections_stay_for_root() {
        let l = Limits {
            connections_per_uid: u32::MAX,
            ..limits()
        };
        let reserved = l.reserved_connections as usize;
        let q = Quotas::new(l, 1000);
        let held: Vec<_> = (0..MAX_CONNECTIONS - reserved)
            .map(|i| {
                q.charge(10 + (i as u32 % 50), Resource::Connection)
                    .unwrap()
            })
            .collect();
        assert_eq!(status(q.charge(5, Resource::Connection)), Status::Busy);
        let _root = q.charge(0, Resource::Connection).unwrap();
        drop(held);
        let _ok = q.charge(5, Resource::Connection).unwrap();
    }
}
