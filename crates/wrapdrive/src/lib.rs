//! WrapDrive wrapdrive.
