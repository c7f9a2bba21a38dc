//! The software IOMMU every device access goes through.
//!
//! * [`Domain`]: one address space: a 4-level radix page table over 48-bit
//!   IOVAs with 4 KiB pages and 2 MiB / 1 GiB blocks (used automatically
//!   when size and alignment allow), read/write permissions, the Linux-style
//!   calls (`map`, `map_sg`, `unmap`, `unmap_fast` + [`IotlbGather`] +
//!   `iotlb_sync`, `iotlb_sync_map`, `flush_iotlb_all`), strict or deferred
//!   invalidation (a flush queue), and a bounded fault log with an abort or
//!   stall policy.
//! * [`Iommu`]: the command queue engines acknowledge; [`EngineTlb`]: one
//!   engine's IOTLB, used inside a [`Section`].
//! * [`Endpoint`]: what a queue translates through (its own domain, another
//!   one, or nothing).
//! * [`virtio`]: a virtio-iommu request decoder and device model, so a
//!   client can manage its own queue's mappings para-virtually.
//!
//! Pure logic: no I/O, no unsafe. "Physical" addresses are whatever the host
//! maps them to (its own virtual addresses of shared memory).
#![deny(unsafe_code)]

mod domain;
mod endpoint;
mod faults;
mod gather;
mod inval;
mod iotlb;
mod table;
pub mod virtio;

pub use domain::{
    Domain, DomainConfig, DomainStats, FaultOutcome, FaultPolicy, InvalidationMode, Resolution,
    DEFAULT_FQ_SIZE, DEFAULT_FQ_TIMEOUT, DEFAULT_MAX_PAGES, DEFAULT_MAX_STALLED,
    DEFAULT_MAX_TABLE_PAGES, DEFAULT_STALL_TIMEOUT,
};
pub use endpoint::{Attachment, Endpoint};
pub use faults::{FaultQueue, FaultRecord};
pub use gather::{IotlbGather, Release};
pub use inval::{Command, EngineTlb, InvalidationStats, Iommu, Section, TlbStats, CMDQ_ENTRIES};
pub use iotlb::{Iotlb, IOTLB_BLOCKS_1G, IOTLB_BLOCKS_2M, IOTLB_PAGES};
pub use table::{Leaf, TableBudget};

/// log2 of the page size.
pub const PAGE_SHIFT: u32 = 12;
/// Page size (the translation granule).
pub const PAGE_SIZE: u64 = 1 << PAGE_SHIFT;
/// A level-1 block.
pub const BLOCK_2M: u64 = 1 << 21;
/// A level-2 block.
pub const BLOCK_1G: u64 = 1 << 30;
/// Every leaf size the tables use (Linux's `pgsize_bitmap`).
pub const PAGE_SIZES: u64 = PAGE_SIZE | BLOCK_2M | BLOCK_1G;
/// Width of the input (IOVA) address space.
pub const IOVA_BITS: u32 = 48;
/// One past the highest IOVA.
pub const IOVA_LIMIT: u64 = 1 << IOVA_BITS;
/// Id of an address space's user (a queue) in fault records.
pub type Pasid = u32;

/// Access permissions of a mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Prot(u8);

impl Prot {
    /// No access.
    pub const NONE: Prot = Prot(0);
    /// Device may read.
    pub const READ: Prot = Prot(1);
    /// Device may write.
    pub const WRITE: Prot = Prot(2);
    /// Both.
    pub const RW: Prot = Prot(3);

    /// Whether every bit of `other` is set.
    pub fn contains(self, other: Prot) -> bool {
        self.0 & other.0 == other.0
    }

    /// Raw bits.
    pub fn bits(self) -> u8 {
        self.0
    }

    /// From raw bits; `None` when unknown bits are set.
    pub fn from_bits(bits: u8) -> Option<Prot> {
        (bits & !3 == 0).then_some(Prot(bits))
    }

    /// Whether this permission allows `access`.
    pub fn allows(self, access: Access) -> bool {
        match access {
            Access::Read => self.contains(Prot::READ),
            Access::Write => self.contains(Prot::WRITE),
        }
    }
}

impl std::ops::BitOr for Prot {
    type Output = Prot;
    fn bitor(self, rhs: Prot) -> Prot {
        Prot(self.0 | rhs.0)
    }
}

/// Direction of a device access.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// The device reads memory.
    Read,
    /// The device writes memory.
    Write,
}

/// Why a translation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FaultReason {
    /// Nothing mapped there.
    Unmapped = 1,
    /// Mapped without the needed permission.
    Permission = 2,
    /// Beyond the IOVA space.
    OutOfRange = 3,
    /// The queue has no domain.
    NoDomain = 4,
}

/// A failed translation: what the device tried to touch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// First faulting byte address.
    pub iova: u64,
    /// Domain id.
    pub pasid: Pasid,
    /// Read or write.
    pub access: Access,
    /// Why.
    pub reason: FaultReason,
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.access {
            Access::Read => "read",
            Access::Write => "write",
        };
        let why = match self.reason {
            FaultReason::Unmapped => "unmapped",
            FaultReason::Permission => "permission denied",
            FaultReason::OutOfRange => "out of range",
            FaultReason::NoDomain => "no domain",
        };
        write!(
            f,
            "{what} fault at IOVA {:#x} (pasid {}): {why}",
            self.iova, self.pasid
        )
    }
}

impl std::error::Error for Fault {}

/// Errors of the domain calls.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IommuError {
    /// Address or size not page aligned, or size zero.
    #[error("range {iova:#x}+{size:#x} is not page aligned or empty")]
    Misaligned {
        /// Start.
        iova: u64,
        /// Size.
        size: u64,
    },
    /// Range beyond the IOVA space or overflowing.
    #[error("range {iova:#x}+{size:#x} lies outside the {IOVA_BITS}-bit IOVA space")]
    OutOfRange {
        /// Start.
        iova: u64,
        /// Size.
        size: u64,
    },
    /// Part of the range is mapped already.
    #[error("IOVA {iova:#x} is already mapped")]
    Overlap {
        /// First mapped byte.
        iova: u64,
    },
    /// The unmap would split a block (refused, as Linux does since 6.13).
    #[error("unmap would split the {size:#x}-byte block at IOVA {iova:#x}")]
    WouldSplitBlock {
        /// The block's first IOVA.
        iova: u64,
        /// Its size.
        size: u64,
    },
    /// The domain's page limit would be exceeded.
    #[error("domain limit of {limit_pages} mapped pages exceeded")]
    LimitExceeded {
        /// The limit.
        limit_pages: u64,
    },
    /// The domain's table-page limit would be exceeded.
    #[error("domain limit of {limit_pages} page-table pages exceeded")]
    TableLimit {
        /// The limit.
        limit_pages: u32,
    },
    /// The table pages the domain shares with its owner's other domains
    /// ([`DomainConfig::table_budget`]) are used up.
    #[error("the page tables of this owner's domains hold {used_pages} pages, their budget is {limit_pages}")]
    TableBudget {
        /// Pages held by the owner's domains.
        used_pages: u64,
        /// The budget.
        limit_pages: u64,
    },
    /// A gather holds unmaps of another domain.
    #[error("the gather holds unmaps of another domain: sync it first")]
    GatherMismatch,
    /// No stalled request with that tag.
    #[error("no stalled request with tag {stag}")]
    NoSuchStall {
        /// The tag asked for.
        stag: u64,
    },
}

impl IommuError {
    /// Whether the call failed for want of resources (a page or table
    /// limit, the owner's table budget) rather than for a bad argument:
    /// callers answer it as "no memory" (a quota for the budget), not as
    /// a caller's mistake.
    pub fn is_resource_limit(&self) -> bool {
        matches!(
            self,
            IommuError::LimitExceeded { .. }
                | IommuError::TableLimit { .. }
                | IommuError::TableBudget { .. }
        )
    }
}

/// A mapped range, as listed by [`Domain::mappings`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// First IOVA.
    pub iova: u64,
    /// Physical address of the first byte.
    pub phys: u64,
    /// Bytes.
    pub size: u64,
    /// Permissions.
    pub prot: Prot,
}

/// A wire byte that names none of an enum's values (the protocol refuses
/// it rather than guess).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{value} is not a valid {what}")]
pub struct UnknownValue {
    /// What was being decoded.
    pub what: &'static str,
    /// The byte received.
    pub value: u8,
}

/// Each type's wire numbers, in one place: the protocol codec decodes
/// bytes into these types and encodes them back with `u8::from`.
macro_rules! wire_enum {
    ($t:ty, $what:literal, $($v:literal => $e:expr),+ $(,)?) => {
        impl TryFrom<u8> for $t {
            type Error = UnknownValue;
            fn try_from(b: u8) -> Result<Self, UnknownValue> {
                match b {
                    $($v => Ok($e),)+
                    value => Err(UnknownValue { what: $what, value }),
                }
            }
        }
        impl From<$t> for u8 {
            fn from(x: $t) -> u8 {
                $(if x == $e { return $v; })+
                unreachable!("every value has a wire number")
            }
        }
    };
}

wire_enum!(InvalidationMode, "invalidation mode", 0 => InvalidationMode::Strict, 1 => InvalidationMode::Deferred);
wire_enum!(FaultPolicy, "fault policy", 0 => FaultPolicy::Abort, 1 => FaultPolicy::Stall);
wire_enum!(Access, "access", 0 => Access::Read, 1 => Access::Write);
wire_enum!(
    FaultReason,
    "fault reason",
    1 => FaultReason::Unmapped,
    2 => FaultReason::Permission,
    3 => FaultReason::OutOfRange,
    4 => FaultReason::NoDomain,
);

impl TryFrom<u8> for Prot {
    type Error = UnknownValue;
    fn try_from(b: u8) -> Result<Prot, UnknownValue> {
        Prot::from_bits(b).ok_or(UnknownValue {
            what: "protection",
            value: b,
        })
    }
}

impl From<Prot> for u8 {
    fn from(p: Prot) -> u8 {
        p.bits()
    }
}

#[cfg(test)]
mod wire_tests {
    use super::*;

    #[test]
    fn wire_numbers_round_trip_and_unknown_bytes_are_refused() {
        for b in 0..=255u8 {
            if let Ok(m) = InvalidationMode::try_from(b) {
                assert_eq!(u8::from(m), b);
            }
            if let Ok(m) = FaultPolicy::try_from(b) {
                assert_eq!(u8::from(m), b);
            }
            if let Ok(m) = Access::try_from(b) {
                assert_eq!(u8::from(m), b);
            }
            if let Ok(m) = FaultReason::try_from(b) {
                assert_eq!(u8::from(m), b);
            }
            if let Ok(m) = Prot::try_from(b) {
                assert_eq!(u8::from(m), b);
            }
        }
        assert!(InvalidationMode::try_from(2).is_err());
        assert!(FaultPolicy::try_from(2).is_err());
        assert!(Access::try_from(2).is_err());
        assert!(FaultReason::try_from(0).is_err());
        assert!(FaultReason::try_from(5).is_err());
        assert!(Prot::try_from(4).is_err());
    }
}
