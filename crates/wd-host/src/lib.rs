//! WrapDrive wd-host.
