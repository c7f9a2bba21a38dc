//! WrapDrive wd-ring.
