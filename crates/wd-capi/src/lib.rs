//! WrapDrive wd-capi.
