//! WrapDrive wd-iommu.
