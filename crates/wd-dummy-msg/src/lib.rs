//! The dummy device's message format: a memcpy engine's (the framework's
//! demonstration device), in its own crate so clients speak it without
//! linking the device.
//!
//! Message format (`device_api` 1), in the descriptor payload, little-endian:
//! `src: u64` at 0, `dst: u64` at 8, `len: u64` at 16. Opcodes:
//! [`OP_NOP`] completes at once (measures the queue alone), [`OP_COPY`]
//! copies `len` bytes. The completion's `result` is the bytes copied.
//! Pure logic, no I/O.
#![deny(unsafe_code)]

use wd_msg::{status, LegacyPlan};
use wd_ring::Desc;

/// Opcode: do nothing.
pub const OP_NOP: u16 = 0;
/// Opcode: copy `len` bytes from `src` to `dst`.
pub const OP_COPY: u16 = 1;
/// Message-format version.
pub const DEVICE_API: u32 = 1;
/// Largest copy one request may ask for.
pub const MAX_COPY: u64 = 64 << 20;

/// A decoded memcpy request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyMsg {
    /// Source device address.
    pub src: u64,
    /// Destination device address.
    pub dst: u64,
    /// Bytes to copy.
    pub len: u64,
}

impl CopyMsg {
    /// Build a descriptor for this request.
    pub fn to_desc(&self, tag: u64) -> Desc {
        let mut d = Desc {
            tag,
            opcode: OP_COPY,
            ..Desc::default()
        };
        d.set_payload_u64(0, self.src);
        d.set_payload_u64(8, self.dst);
        d.set_payload_u64(16, self.len);
        d
    }

    /// Decode an untrusted descriptor: `Err(status)` for anything malformed.
    pub fn decode(d: &Desc) -> Result<Option<CopyMsg>, i32> {
        if d.reserved != 0 || d.flags != 0 {
            return Err(status::EINVAL);
        }
        match d.opcode {
            // Reserved bytes are zero, a no-op's whole payload too.
            OP_NOP if d.payload.iter().any(|&b| b != 0) => Err(status::EINVAL),
            OP_NOP => Ok(None),
            OP_COPY => {
                let m = CopyMsg {
                    src: d.payload_u64(0),
                    dst: d.payload_u64(8),
                    len: d.payload_u64(16),
                };
                if m.len > MAX_COPY {
                    return Err(status::EMSGSIZE);
                }
                if d.payload[24..].iter().any(|&b| b != 0) {
                    return Err(status::EINVAL);
                }
                Ok(Some(m))
            }
            _ => Err(status::EOPNOTSUPP),
        }
    }
}

/// Whether a request may be sent again, unchanged, to a restarted host
/// (`Queue::set_redo_policy`): a no-op, and a copy between ranges that do
/// not overlap (it writes the same bytes again). An overlapping copy the
/// old host ran, whole or in part, moved its own source: run again it
/// writes other bytes. A request that does not decode is refused again.
pub fn redo_safe(d: &Desc) -> bool {
    match CopyMsg::decode(d) {
        Ok(Some(m)) => !overlap((m.src, m.len), (m.dst, m.len)),
        Ok(None) | Err(_) => true,
    }
}

/// Whether two address ranges share a byte.
fn overlap((a, a_len): (u64, u64), (b, b_len): (u64, u64)) -> bool {
    a_len > 0 && b_len > 0 && a < b.saturating_add(b_len) && b < a.saturating_add(a_len)
}

/// The legacy plan of a memcpy request: source bytes travel in, the copy
/// travels back.
pub fn legacy_plan(d: &Desc) -> Result<LegacyPlan, i32> {
    match CopyMsg::decode(d)? {
        None => Ok(LegacyPlan {
            inputs: vec![],
            outputs: vec![],
            desc: *d,
        }),
        Some(m) => Ok(LegacyPlan {
            inputs: vec![(m.src, m.len)],
            outputs: vec![(m.dst, m.len)],
            desc: CopyMsg {
                src: 0,
                dst: 0,
                len: m.len,
            }
            .to_desc(d.tag),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An overlapping copy the old host ran moved its own source: it is
    /// not sent again (every request was).
    #[test]
    fn only_copies_between_separate_ranges_are_sent_again() {
        let copy = |src, dst, len| CopyMsg { src, dst, len }.to_desc(1);
        assert!(redo_safe(&copy(0x1000, 0x2000, 0x1000)));
        assert!(redo_safe(&copy(0x2000, 0x1000, 0x1000)));
        assert!(!redo_safe(&copy(0x1000, 0x1001, 8)));
        assert!(!redo_safe(&copy(0x1001, 0x1000, 8)));
        assert!(!redo_safe(&copy(0x1000, 0x1000, 8)));
        assert!(redo_safe(&Desc::default()));
    }

    /// A no-op with payload bytes is refused as a copy with stray bytes
    /// is (it was accepted).
    #[test]
    fn a_no_op_carries_no_payload() {
        assert_eq!(CopyMsg::decode(&Desc::default()), Ok(None));
        let mut d = Desc::default();
        d.set_payload_u64(8, 1);
        assert_eq!(CopyMsg::decode(&d), Err(status::EINVAL));
    }

    #[test]
    fn copy_round_trips_and_limits_hold() {
        let m = CopyMsg {
            src: 0x1000,
            dst: 0x9000,
            len: 77,
        };
        assert_eq!(CopyMsg::decode(&m.to_desc(3)), Ok(Some(m)));
        let big = CopyMsg {
            len: MAX_COPY + 1,
            ..m
        };
        assert_eq!(CopyMsg::decode(&big.to_desc(0)), Err(status::EMSGSIZE));
        let mut odd = m.to_desc(0);
        odd.opcode = 9;
        assert_eq!(CopyMsg::decode(&odd), Err(status::EOPNOTSUPP));
    }

    #[test]
    fn legacy_plan_moves_the_source_in_and_the_copy_out() {
        let m = CopyMsg {
            src: 0x1000,
            dst: 0x9000,
            len: 77,
        };
        let p = legacy_plan(&m.to_desc(5)).unwrap();
        assert_eq!(p.inputs, vec![(0x1000, 77)]);
        assert_eq!(p.outputs, vec![(0x9000, 77)]);
        assert_eq!(
            CopyMsg::decode(&p.desc),
            Ok(Some(CopyMsg {
                src: 0,
                dst: 0,
                len: 77
            }))
        );
        assert_eq!(p.desc.tag, 5);
    }
}
