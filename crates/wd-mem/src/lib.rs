//! WrapDrive wd-mem.
