//! WrapDrive wd-device.
