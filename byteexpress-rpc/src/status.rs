//! gRPC status codes and the status of a call (the gRPC spec's `doc/statuscodes.md`).

use crate::Metadata;

/// A gRPC status code, with the numbers of the gRPC spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Code {
    /// 0
    Ok = 0,
    /// 1: the caller cancelled.
    Cancelled = 1,
    /// 2
    Unknown = 2,
    /// 3
    InvalidArgument = 3,
    /// 4: the deadline passed before the call completed.
    DeadlineExceeded = 4,
    /// 5
    NotFound = 5,
    /// 6
    AlreadyExists = 6,
    /// 7
    PermissionDenied = 7,
    /// 8: a size or quota limit (e.g. a message above the receive-buffer size).
    ResourceExhausted = 8,
    /// 9
    FailedPrecondition = 9,
    /// 10
    Aborted = 10,
    /// 11
    OutOfRange = 11,
    /// 12: the method is not served.
    Unimplemented = 12,
    /// 13: a broken invariant, e.g. a malformed message from the peer.
    Internal = 13,
    /// 14: the peer is unreachable or the link failed; safe to retry elsewhere.
    Unavailable = 14,
    /// 15
    DataLoss = 15,
    /// 16
    Unauthenticated = 16,
}

impl Code {
    /// The code for a number; unknown numbers map to `Unknown` (as gRPC clients do).
    pub fn from_u16(v: u16) -> Code {
        use Code::*;
        const ALL: [Code; 17] = [
            Ok,
            Cancelled,
            Unknown,
            InvalidArgument,
            DeadlineExceeded,
            NotFound,
            AlreadyExists,
            PermissionDenied,
            ResourceExhausted,
            FailedPrecondition,
            Aborted,
            OutOfRange,
            Unimplemented,
            Internal,
            Unavailable,
            DataLoss,
            Unauthenticated,
        ];
        ALL.get(v as usize).copied().unwrap_or(Unknown)
    }
}

/// The outcome of a failed call: code, message and trailing metadata, as gRPC carries them in
/// `grpc-status`, `grpc-message` and trailers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// The code (never `Ok` for an error returned by this crate).
    pub code: Code,
    /// Human-readable message (`grpc-message`).
    pub message: String,
    /// Trailing metadata.
    pub metadata: Metadata,
}

impl Status {
    /// A status with no metadata.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Status {
            code,
            message: message.into(),
            metadata: Metadata::default(),
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.code, self.message)
    }
}

impl std::error::Error for Status {}
