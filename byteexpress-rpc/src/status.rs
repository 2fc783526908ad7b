//! gRPC status codes and the status of a call (the gRPC spec's `doc/statuscodes.md`).

use std::sync::Arc;

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
///
/// A status made by this crate from one of its own errors (a failed link set-up, a link that
/// died under the call) also carries that error as its [`std::error::Error::source`], as tonic's
/// `Status` does: the typed cause and its chain (an `std::io::Error`, a verbs error, ...) for the
/// caller to inspect in this process. `message` renders the same chain as text (`"connect
/// 10.0.0.1:7000: Connection refused (os error 111)"`), since only code, message and metadata
/// cross the wire. Equality compares code, message and metadata, not the source.
#[derive(Debug, Clone)]
pub struct Status {
    /// The code (never `Ok` for an error returned by this crate).
    pub code: Code,
    /// Human-readable message (`grpc-message`).
    pub message: String,
    /// Trailing metadata.
    pub metadata: Metadata,
    /// The error this status was made from, when this process made it.
    source: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
}

impl Status {
    /// A status with no metadata.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self::with_metadata(code, message, Metadata::default())
    }

    /// A status with trailing metadata.
    pub fn with_metadata(code: Code, message: impl Into<String>, metadata: Metadata) -> Self {
        Status {
            code,
            message: message.into(),
            metadata,
            source: None,
        }
    }

    /// A status for `error`: `message` is the error's text followed by those of its sources
    /// (joined by `": "`), and the error itself becomes the status's
    /// [`source`](std::error::Error::source).
    pub fn from_error(code: Code, error: impl std::error::Error + Send + Sync + 'static) -> Self {
        let mut s = Status::new(code, chain(&error));
        s.source = Some(Arc::new(error));
        s
    }
}

/// `e`'s text followed by those of its sources, joined by `": "`. A source whose text the
/// message already ends with (an error that also prints its cause, as `FrameError::Io` does)
/// is not repeated.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let text = s.to_string();
        if !msg.ends_with(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
        src = s.source();
    }
    msg
}

impl PartialEq for Status {
    fn eq(&self, other: &Self) -> bool {
        self.code == other.code && self.message == other.message && self.metadata == other.metadata
    }
}

impl Eq for Status {}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.code, self.message)
    }
}

impl std::error::Error for Status {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}
