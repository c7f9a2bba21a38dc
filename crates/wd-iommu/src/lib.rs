//! The software IOMMU every device access goes through.
//!
//! A [`Domain`] is one address space (one per queue, tagged with a
//! PASID-like id): a 4-level radix page table over 48-bit IOVAs with 4 KiB
//! pages and read/write permissions. Engines call [`Domain::translate_range`]
//! for every address a request names; a miss is a [`Fault`] that the host
//! records in the domain's bounded [`FaultQueue`].
//!
//! Pure logic: no I/O, no unsafe. "Physical" addresses are whatever the host
//! maps them to (its own virtual addresses of shared memory).
#![deny(unsafe_code)]

mod faults;
mod table;

pub use faults::{FaultQueue, FaultRecord};
pub use table::Domain;

/// log2 of the page size.
pub const PAGE_SHIFT: u32 = 12;
/// Page size.
pub const PAGE_SIZE: u64 = 1 << PAGE_SHIFT;
/// Width of the input (IOVA) address space.
pub const IOVA_BITS: u32 = 48;
/// Default cap on the pages one domain may map (16 GiB).
pub const DEFAULT_MAX_PAGES: u64 = 1 << 22;
/// Id of an address space (one per queue).
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

/// Errors of map and unmap.
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
        /// First mapped page.
        iova: u64,
    },
    /// A mapping without any permission.
    #[error("a mapping needs read or write permission")]
    NoPermission,
    /// The domain's page limit would be exceeded.
    #[error("domain limit of {limit_pages} pages exceeded")]
    LimitExceeded {
        /// The limit.
        limit_pages: u64,
    },
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
