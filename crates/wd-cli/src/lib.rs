//! WrapDrive wd-cli.
