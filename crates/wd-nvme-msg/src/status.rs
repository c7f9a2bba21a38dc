//! Completion status (the CQE's status field): a status code type and a
//! status code, with the Do Not Retry bit.

/// A completion status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Status {
    /// Status Code Type: 0 generic, 1 command specific, 2 media and data
    /// integrity errors.
    pub sct: u8,
    /// Status Code.
    pub sc: u8,
    /// Do Not Retry: the same command would fail again.
    pub dnr: bool,
}

const fn generic(sc: u8) -> Status {
    Status {
        sct: 0,
        sc,
        dnr: true,
    }
}

const fn specific(sc: u8) -> Status {
    Status {
        sct: 1,
        sc,
        dnr: true,
    }
}

const fn media(sc: u8) -> Status {
    Status {
        sct: 2,
        sc,
        dnr: true,
    }
}

impl Status {
    /// Successful Completion.
    pub const SUCCESS: Status = Status {
        sct: 0,
        sc: 0,
        dnr: false,
    };
    /// Invalid Command Opcode.
    pub const INVALID_OPCODE: Status = generic(0x01);
    /// Invalid Field in Command.
    pub const INVALID_FIELD: Status = generic(0x02);
    /// Command ID Conflict.
    pub const CID_CONFLICT: Status = generic(0x03);
    /// Data Transfer Error: an address the controller could not reach.
    pub const DATA_TRANSFER_ERROR: Status = generic(0x04);
    /// Internal Error (the backing store failed in an unexpected way).
    pub const INTERNAL_ERROR: Status = Status {
        sct: 0,
        sc: 0x06,
        dnr: false,
    };
    /// Command Abort Requested.
    pub const ABORT_REQUESTED: Status = generic(0x07);
    /// Command Aborted due to SQ Deletion.
    pub const ABORTED_SQ_DELETION: Status = generic(0x08);
    /// Invalid Namespace or Format.
    pub const INVALID_NAMESPACE: Status = generic(0x0b);
    /// Command Sequence Error.
    pub const SEQUENCE_ERROR: Status = generic(0x0c);
    /// PRP Offset Invalid.
    pub const PRP_OFFSET_INVALID: Status = generic(0x13);
    /// LBA Out of Range.
    pub const LBA_OUT_OF_RANGE: Status = generic(0x80);
    /// Completion Queue Invalid.
    pub const CQ_INVALID: Status = specific(0x00);
    /// Invalid Queue Identifier.
    pub const INVALID_QUEUE_ID: Status = specific(0x01);
    /// Invalid Queue Size.
    pub const INVALID_QUEUE_SIZE: Status = specific(0x02);
    /// Asynchronous Event Request Limit Exceeded.
    pub const AER_LIMIT_EXCEEDED: Status = specific(0x05);
    /// Invalid Log Page.
    pub const INVALID_LOG_PAGE: Status = specific(0x09);
    /// Invalid Queue Deletion (a CQ that still has SQs).
    pub const INVALID_QUEUE_DELETION: Status = specific(0x0c);
    /// Feature Identifier Not Saveable.
    pub const FEATURE_NOT_SAVEABLE: Status = specific(0x0d);
    /// Namespace Already Attached.
    pub const NS_ALREADY_ATTACHED: Status = specific(0x18);
    /// Namespace Is Private: attached to another controller.
    pub const NS_IS_PRIVATE: Status = specific(0x19);
    /// Namespace Not Attached.
    pub const NS_NOT_ATTACHED: Status = specific(0x1a);
    /// Controller List Invalid.
    pub const CONTROLLER_LIST_INVALID: Status = specific(0x1c);
    /// Write Fault.
    pub const WRITE_FAULT: Status = media(0x80);
    /// Unrecovered Read Error.
    pub const UNRECOVERED_READ_ERROR: Status = media(0x81);
    /// Compare Failure.
    pub const COMPARE_FAILURE: Status = media(0x85);

    /// Whether the command succeeded.
    pub fn is_success(self) -> bool {
        self.sct == 0 && self.sc == 0
    }

    /// The 15-bit status field (CQE DW3 bits 31:17, shifted down).
    pub fn to_field(self) -> u16 {
        self.sc as u16 | ((self.sct & 7) as u16) << 8 | (self.dnr as u16) << 14
    }

    /// Decode the 15-bit status field.
    pub fn from_field(f: u16) -> Status {
        Status {
            sc: f as u8,
            sct: (f >> 8 & 7) as u8,
            dnr: f >> 14 & 1 != 0,
        }
    }

    /// The name of a status a driver is likely to meet, for messages.
    pub fn name(self) -> &'static str {
        let key = Status { dnr: true, ..self };
        match key {
            k if k.is_success() => "success",
            k if k == Status::INVALID_OPCODE => "invalid opcode",
            k if k == Status::INVALID_FIELD => "invalid field in command",
            k if k == Status::CID_CONFLICT => "command id conflict",
            k if k == Status::DATA_TRANSFER_ERROR => "data transfer error",
            k if k
                == Status {
                    dnr: true,
                    ..Status::INTERNAL_ERROR
                } =>
            {
                "internal error"
            }
            k if k == Status::ABORT_REQUESTED => "abort requested",
            k if k == Status::ABORTED_SQ_DELETION => "aborted: submission queue deleted",
            k if k == Status::INVALID_NAMESPACE => "invalid namespace or format",
            k if k == Status::SEQUENCE_ERROR => "command sequence error",
            k if k == Status::PRP_OFFSET_INVALID => "PRP offset invalid",
            k if k == Status::LBA_OUT_OF_RANGE => "LBA out of range",
            k if k == Status::CQ_INVALID => "completion queue invalid",
            k if k == Status::INVALID_QUEUE_ID => "invalid queue identifier",
            k if k == Status::INVALID_QUEUE_SIZE => "invalid queue size",
            k if k == Status::AER_LIMIT_EXCEEDED => "asynchronous event request limit exceeded",
            k if k == Status::INVALID_LOG_PAGE => "invalid log page",
            k if k == Status::INVALID_QUEUE_DELETION => "invalid queue deletion",
            k if k == Status::FEATURE_NOT_SAVEABLE => "feature not saveable",
            k if k == Status::NS_ALREADY_ATTACHED => "namespace already attached",
            k if k == Status::NS_IS_PRIVATE => {
                "namespace is private (attached to another controller: another client holds it)"
            }
            k if k == Status::NS_NOT_ATTACHED => "namespace not attached",
            k if k == Status::CONTROLLER_LIST_INVALID => "controller list invalid",
            k if k == Status::WRITE_FAULT => "write fault",
            k if k == Status::UNRECOVERED_READ_ERROR => "unrecovered read error",
            k if k == Status::COMPARE_FAILURE => "compare failure",
            _ => "other status",
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (type {:#x}, code {:#04x}{})",
            self.name(),
            self.sct,
            self.sc,
            if self.dnr { ", do not retry" } else { "" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_round_trip() {
        for s in [
            Status::SUCCESS,
            Status::INVALID_FIELD,
            Status::COMPARE_FAILURE,
            Status::INVALID_QUEUE_DELETION,
        ] {
            assert_eq!(Status::from_field(s.to_field()), s);
        }
        assert_eq!(Status::COMPARE_FAILURE.to_field(), 0x4285);
        assert!(Status::LBA_OUT_OF_RANGE
            .to_string()
            .contains("LBA out of range"));
    }
}
