//! WrapDrive wd-proto.
