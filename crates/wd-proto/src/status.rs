//! Statuses at the protocol and C boundaries: the one place they map to errno.

/// Outcome class of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Status {
    /// Success.
    Ok = 0,
    /// Invalid argument.
    Invalid = 1,
    /// No device serves the algorithm.
    NoDevice = 2,
    /// Every instance is in use.
    Busy = 3,
    /// Out of memory or over a limit.
    NoMemory = 4,
    /// Not permitted.
    Permission = 5,
    /// No such queue, range or attribute.
    NotFound = 6,
    /// Address not reachable.
    Fault = 7,
    /// Protocol violation.
    Protocol = 8,
    /// Not supported here.
    Unsupported = 9,
    /// Too large.
    TooBig = 10,
    /// Object in a state that forbids the call.
    BadState = 11,
    /// Input/output error.
    Io = 12,
    /// Protocol version mismatch.
    Version = 13,
    /// The host is gone.
    HostGone = 14,
    /// Try again.
    Again = 15,
    /// Not a live handle (released or forged).
    BadHandle = 16,
    /// Authentication failed (an AEAD tag did not match).
    AuthFailed = 17,
    /// Over a per-user limit of the host (queues, shares, mapped bytes,
    /// connections).
    Quota = 18,
    /// The host is out of file descriptors.
    TooManyFiles = 19,
}

const TABLE: [(Status, i32, &str); 20] = [
    (Status::Ok, 0, "success"),
    (Status::Invalid, 22, "invalid argument"),
    (Status::NoDevice, 19, "no device serves this algorithm"),
    (Status::Busy, 16, "device busy: no free queue instance"),
    (Status::NoMemory, 12, "out of memory or over a limit"),
    (Status::Permission, 1, "not permitted"),
    (Status::NotFound, 2, "no such queue, range or attribute"),
    (Status::Fault, 14, "address not reachable by the device"),
    (Status::Protocol, 71, "protocol error"),
    (Status::Unsupported, 95, "not supported here"),
    (Status::TooBig, 90, "request too large"),
    (Status::BadState, 77, "object unusable in its current state"),
    (Status::Io, 5, "input/output error"),
    (Status::Version, 93, "protocol version mismatch"),
    (Status::HostGone, 107, "host not reachable"),
    (Status::Again, 11, "try again"),
    (Status::BadHandle, 9, "not a live handle"),
    (Status::AuthFailed, 74, "authentication failed"),
    (Status::Quota, 122, "over a per-user limit of the host"),
    (Status::TooManyFiles, 24, "host out of file descriptors"),
];

impl Status {
    /// Positive errno of this status.
    pub fn errno(self) -> i32 {
        TABLE[self as usize].1
    }

    /// The status for an errno (sign ignored); unknown values are `Io`.
    pub fn from_errno(errno: i32) -> Status {
        Status::from_known_errno(errno).unwrap_or(Status::Io)
    }

    /// The status for an errno (sign ignored) that has one, so that text
    /// for an errno WrapDrive never returns does not claim an I/O error.
    pub fn from_known_errno(errno: i32) -> Option<Status> {
        let e = errno.unsigned_abs() as i32;
        match e {
            13 => Some(Status::Permission),           // EACCES
            7 => Some(Status::TooBig),                // E2BIG
            104 | 32 | 111 => Some(Status::HostGone), // ECONNRESET, EPIPE, ECONNREFUSED
            _ => TABLE.iter().find(|t| t.1 == e).map(|t| t.0),
        }
    }

    /// The status with this wire number.
    pub fn from_u16(v: u16) -> Option<Status> {
        TABLE.get(v as usize).map(|t| t.0)
    }

    /// Short human text.
    pub fn describe(self) -> &'static str {
        TABLE[self as usize].2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_indexed_by_discriminant() {
        for (i, t) in TABLE.iter().enumerate() {
            assert_eq!(t.0 as usize, i);
            assert_eq!(Status::from_u16(i as u16), Some(t.0));
            assert_eq!(Status::from_errno(t.0.errno()), t.0);
            assert_eq!(Status::from_errno(-t.0.errno()), t.0);
        }
        assert_eq!(Status::from_u16(20), None);
        assert_eq!(Status::from_errno(13), Status::Permission);
        assert_eq!(Status::from_errno(9999), Status::Io);
        assert_eq!(Status::from_known_errno(9999), None);
        assert_eq!(Status::from_known_errno(-5), Some(Status::Io));
    }
}
