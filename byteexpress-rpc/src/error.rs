//! The crate's own errors: typed, with their causes as [`std::error::Error::source`], and the
//! one mapping of each to a gRPC [`Status`] (DESIGN.md "Errors").
//!
//! Set-up ([`crate::setup`]) fails with a [`SetupError`], a running link's engine with an
//! [`EngineError`]. Neither leaves the crate: where a result does (`Client::connect`, a call
//! failed by its link, the server's accept loop), `From<…> for Status` picks the code and
//! [`Status::from_error`] keeps the error as the status's source, its chain as the message.
//! Each `Display` is short (what failed); the cause (an `std::io::Error`, a verbs or memory
//! error, an undecodable message, an elapsed timeout) is the source, never formatted into it.

use std::time::Duration;

use byteexpress_tcp_fallback::FrameError;

use crate::engine::control::FallbackError;
use crate::engine::rdma::failover::QpFault;
use crate::engine::rdma::reassembly::ReassemblyError;
use crate::wire::WireError;
use crate::{Code, Status};

/// Who chose the transport, for messages: `BX_TRANSPORT=…` or `Config::transport = …`.
#[derive(Debug, Clone)]
pub(crate) enum WhoSet {
    /// The environment variable, with its value.
    Env(String),
    /// The caller's `Config::transport` (`auto`, `rdma`, `rdma-any` or `tcp`).
    Config(&'static str),
}

impl std::fmt::Display for WhoSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WhoSet::Env(v) => write!(f, "BX_TRANSPORT={v}"),
            WhoSet::Config(w) => write!(f, "Config::transport = {w}"),
        }
    }
}

/// Why a link did not get (or was not offered) a faster path than the one it took: the `why`
/// of the set-up log line, and the reason of [`SetupError::RdmaRequired`].
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum NoRdma {
    /// `tcp` was asked for.
    #[error("forced by {0}")]
    Forced(WhoSet),
    /// The host has no RDMA device.
    #[error("no RDMA device on this host")]
    NoDevice,
    /// Every device of the host failed to open (their names).
    #[error("no usable RDMA device ({} could not be opened)", .0.join(", "))]
    NoneUsable(Vec<String>),
    /// Only the soft device is usable.
    #[error("no hardware RDMA device on this host")]
    NoHardware,
    /// The server offered no device.
    #[error("{0} offers no RDMA device")]
    PeerOffersNone(String),
    /// No local device's probe reached a server device.
    #[error("peer unreachable over RDMA: none of {} reaches {addr}'s {remote} device(s){}", .local.join(", "), if .local.contains(&"soft0") { " (the soft device reaches processes of its own user and of BX_SOFT_ALLOW_UIDS only)" } else { "" })]
    Unreachable {
        /// The local devices probed.
        local: Vec<&'static str>,
        /// The server's address.
        addr: String,
        /// How many devices the server offered.
        remote: usize,
    },
    /// The soft device was left out because hardware is present.
    #[error("soft device not offered under {0} with hardware present")]
    SoftSkipped(WhoSet),
    /// The client chose TCP (the server's view).
    #[error("the client chose TCP")]
    ClientChoseTcp,
}

/// Why a link's set-up failed. Crate-private; becomes a [`Status`] through `From`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SetupError {
    /// The TCP connect (or its first write) failed.
    #[error("connect {addr}")]
    Connect {
        /// The address dialled.
        addr: String,
        /// The socket error.
        #[source]
        source: std::io::Error,
    },
    /// The TLS handshake (or the client's TLS config) failed: nothing of set-up was sent.
    /// A config mistake is INVALID_ARGUMENT (retrying cannot fix it), a failed handshake
    /// UNAVAILABLE ([`TlsError::code`](crate::tls::TlsError)).
    #[cfg(feature = "tls")]
    #[error("TLS with {peer}")]
    Tls {
        /// The peer's address.
        peer: String,
        /// What failed.
        #[source]
        source: crate::tls::TlsError,
    },
    /// Set-up did not finish within `Config::connect_timeout` / `handshake_timeout`.
    #[error("set-up with {peer} timed out after {after:?}")]
    Timeout {
        /// The peer's address.
        peer: String,
        /// The time limit.
        after: Duration,
        /// The timer's error.
        #[source]
        source: tokio::time::error::Elapsed,
    },
    /// Writing a set-up message failed.
    #[error("set-up write")]
    Write(#[source] FrameError),
    /// Reading a set-up message failed.
    #[error("set-up read")]
    Read(#[source] FrameError),
    /// The peer closed the connection during set-up.
    #[error("peer closed during set-up")]
    PeerClosed,
    /// A set-up message (or the peer's ERROR) does not decode.
    #[error("set-up: undecodable message")]
    Garbled(#[source] WireError),
    /// The peer sent another set-up message than the step expects.
    #[error("set-up: expected {0}")]
    Unexpected(&'static str),
    /// The peer answered set-up with an ERROR message (its reason, as sent).
    #[error("peer closed the link: {0}")]
    PeerError(String),
    /// A hardware device was refused for a configuration error (an invalid `BX_GID_INDEX`):
    /// the link is not made on another device.
    #[error("RDMA device {device} refused; no link is made on another device")]
    DeviceConfig {
        /// The device.
        device: String,
        /// Why it was refused (kept by the process's device list).
        #[source]
        source: &'static byteexpress_verbs::Error,
    },
    /// Creating the link's PD, CQ or QP failed.
    #[error("RDMA set-up on {device}")]
    Verbs {
        /// The device.
        device: &'static str,
        /// The verbs error.
        #[source]
        source: byteexpress_verbs::Error,
    },
    /// Registering the link's buffers failed.
    #[error("RDMA buffers")]
    Buffers(#[source] byteexpress_mem::MemError),
    /// The configured queue depths are not usable.
    #[error("RDMA queues")]
    Queues(#[source] byteexpress_flow::credit::QueueError),
    /// The configured adaptive window is not usable.
    #[error("adaptive window")]
    Window(#[source] byteexpress_flow::window::WindowError),
    /// `Config::max_chunk` (or the peer's buffers) leave no room for a payload.
    #[error("chunks of {chunk} bytes leave no room after the {header}-byte header")]
    ChunkTooSmall {
        /// The chunk size (bytes).
        chunk: usize,
        /// The header size (bytes).
        header: usize,
    },
    /// Moving the QP to RTS failed.
    #[error("QP connect")]
    QpConnect(#[source] byteexpress_verbs::Error),
    /// Posting the link's first receives failed.
    #[error("QP receives")]
    PostRecv(#[source] byteexpress_verbs::Error),
    /// The peer's QP endpoint or device description does not decode.
    #[error("peer {0}")]
    PeerAddress(&'static str, #[source] byteexpress_verbs::Error),
    /// RDMA is required and no RDMA link could be made.
    #[error("RDMA required by {who}, but no RDMA link to {addr}: {why}")]
    RdmaRequired {
        /// Who required it.
        who: WhoSet,
        /// The server.
        addr: String,
        /// Why there is no RDMA link.
        why: NoRdma,
    },
    /// The peer answered REFUSE (its reason, as sent).
    #[error("{side} refused: {reason}")]
    Refused {
        /// `server refused RDMA` or `client`.
        side: &'static str,
        /// The peer's reason.
        reason: String,
    },
    /// The server answered receive buffers other than those asked.
    #[error("server answered receive buffers of {got} bytes, not the {want} asked")]
    RecvBufMismatch {
        /// The size answered (bytes).
        got: usize,
        /// The size asked (bytes).
        want: usize,
    },
    /// The client asked for larger receive buffers than this server's.
    #[error("receive buffers of {got} bytes exceed this server's {max}")]
    RecvBufTooLarge {
        /// The size asked (bytes).
        got: usize,
        /// This server's size (bytes).
        max: usize,
    },
    /// The client speaks another set-up version.
    #[error("set-up version {0} not supported")]
    Version(u16),
    /// The client chose TCP; this server requires RDMA.
    #[error("client chose TCP; server requires RDMA")]
    ClientChoseTcp,
    /// The client chose a device this server did not offer.
    #[error("client chose an unknown device")]
    UnknownDevice,
}

impl SetupError {
    /// The gRPC code of this error (DESIGN.md "Errors").
    pub(crate) fn code(&self) -> Code {
        use SetupError::*;
        match self {
            DeviceConfig { .. } | Queues(_) | Window(_) | ChunkTooSmall { .. } => {
                Code::InvalidArgument
            }
            Buffers(_) | RecvBufTooLarge { .. } => Code::ResourceExhausted,
            #[cfg(feature = "tls")]
            Tls { source, .. } => source.code(),
            Connect { .. }
            | Timeout { .. }
            | Write(_)
            | Read(_)
            | PeerClosed
            | Garbled(_)
            | Unexpected(_)
            | PeerError(_)
            | Verbs { .. }
            | QpConnect(_)
            | PostRecv(_)
            | PeerAddress(..)
            | RdmaRequired { .. }
            | Refused { .. }
            | RecvBufMismatch { .. }
            | Version(_)
            | ClientChoseTcp
            | UnknownDevice => Code::Unavailable,
        }
    }
}

impl From<SetupError> for Status {
    fn from(e: SetupError) -> Status {
        Status::from_error(e.code(), e)
    }
}

/// Why a running link closed. Crate-private; becomes the [`Status`] of every call the link
/// still holds through `From`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EngineError {
    /// This side closed the link (the last user dropped it, or `close()`).
    #[error("link closed")]
    Closed,
    /// The link's message channel is gone.
    #[error("link dropped")]
    Dropped,
    /// Writing to the TCP connection failed.
    #[error("TCP write")]
    TcpWrite(#[source] FrameError),
    /// Reading from the TCP connection failed.
    #[error("TCP read")]
    TcpRead(#[source] FrameError),
    /// The peer closed the TCP connection.
    #[error("peer closed the connection")]
    PeerClosed,
    /// The peer sent an ERROR message and closed the link (its reason, as sent).
    #[error("peer closed the link: {0}")]
    PeerError(String),
    /// This side answered a peer's protocol error with an ERROR message and closed.
    #[error("link closed after a protocol error")]
    AfterProtocolError,
    /// The peer announced a frame above the link's maximum.
    #[error("oversized frame from the peer")]
    FrameTooLarge(#[source] FrameError),
    /// The peer sent a frame length that no frame has (an escape with a length below
    /// `0xFFFF_FFFF`, `byteexpress_tcp_fallback::FrameError::BadEscape`).
    #[error("peer sent a garbled frame length")]
    FrameGarbled(#[source] FrameError),
    /// A message from the peer does not decode.
    #[error("peer broke the protocol")]
    Garbled(#[source] WireError),
    /// A message from the peer carries the wrong number.
    #[error("peer broke the protocol: message number {got} where {want} (mod 2^16) was due")]
    OutOfOrder {
        /// The number received.
        got: u16,
        /// The number due.
        want: u16,
    },
    /// The peer's credits do not add up.
    #[error("peer broke the protocol: credits")]
    PeerCredits(#[source] byteexpress_flow::credit::CreditError),
    /// A multi-chunk message from the peer does not reassemble.
    #[error("peer broke the protocol: reassembly")]
    Reassembly(#[source] ReassemblyError),
    /// A message to send is larger than the peer accepts (HELLO's limits).
    #[error("message of {len} bytes exceeds the link's {max} bytes")]
    MessageTooLarge {
        /// The message's size on the wire (bytes).
        len: usize,
        /// The link's maximum (bytes).
        max: usize,
    },
    /// A message to send whose metadata section exceeds the header's 32-bit `meta_len`.
    #[error("metadata of {len} bytes exceeds the header's limit of 4294967295 bytes")]
    MetadataTooLong {
        /// The metadata section's size (bytes).
        len: usize,
    },
    /// A multi-chunk message above the receiver's limits.
    #[error("message too large")]
    TooLarge(#[source] ReassemblyError),
    /// The link's QP failed (a completion with an error status, or the peer's QP).
    #[error("RDMA link failed")]
    Qp(#[source] QpFault),
    /// A verbs call on the link's QP or CQ failed (`post_send`, `post_recv`, `poll_cq`, the CQ
    /// wait). The verbs error itself goes with the [`QpFault`] to the fallback, which moves the
    /// link's messages to TCP; this error closes the link only when no fallback runs.
    #[error("{0} failed")]
    QpFailed(&'static str),
    /// The link's QP failed and the fallback to TCP failed too.
    #[error("link fallback to TCP failed")]
    Fallback(#[source] FallbackError),
    /// The control connection of an RDMA link failed.
    #[error("control connection")]
    Control(#[source] FrameError),
    /// A message on the control connection does not decode.
    #[error("control channel")]
    ControlGarbled(#[source] WireError),
    /// The peer broke the re-probe protocol (DESIGN.md 3.5, "Link life"): a SWITCH nobody
    /// agreed to, a re-probe message larger than a set-up message, or more of them queued
    /// than an honest peer ever has unanswered.
    #[error("peer broke the re-probe protocol: {0}")]
    ReprobeProtocol(&'static str),
    /// The peer closed the control connection.
    #[error("peer closed the control connection")]
    ControlClosed,
    /// A receive completion for no posted receive.
    #[error("receive completion for unknown wr {0}")]
    UnknownWr(u64),
    /// The engine's own queue accounting broke.
    #[error("queues")]
    Queues(#[source] byteexpress_flow::credit::QueueError),
    /// The engine's own credit accounting broke.
    #[error("credits")]
    Credits(#[source] byteexpress_flow::credit::CreditError),
    /// A credit the engine held disappeared.
    #[error("credit vanished")]
    CreditVanished,
    /// More credits than a grant.
    #[error("more credits than a grant")]
    CreditOverflow,
    /// The engine's window accounting broke.
    #[error("window")]
    Window(#[source] byteexpress_flow::window::WindowError),
    /// A send buffer could not be had or filled (the pool is sized to the send queue: a bug).
    #[error("send buffers")]
    Buffers(#[source] byteexpress_mem::MemError),
    /// Keepalive: the peer did not answer a PING within `Config::keepalive_timeout`.
    #[error("keepalive: no answer from the peer within {0:?} of a PING")]
    KeepaliveTimeout(Duration),
    /// The idle timeout closed a link without calls.
    #[error("link idle for {0:?}: closed")]
    Idle(Duration),
}

impl EngineError {
    /// The gRPC code of this error (DESIGN.md "Errors").
    pub(crate) fn code(&self) -> Code {
        use EngineError::*;
        match self {
            FrameTooLarge(_) | MessageTooLarge { .. } | MetadataTooLong { .. } | TooLarge(_) => {
                Code::ResourceExhausted
            }
            Garbled(_)
            | FrameGarbled(_)
            | ReprobeProtocol(_)
            | OutOfOrder { .. }
            | PeerCredits(_)
            | Reassembly(_)
            | UnknownWr(_)
            | Queues(_)
            | Credits(_)
            | CreditVanished
            | CreditOverflow
            | Window(_)
            | Buffers(_) => Code::Internal,
            Closed | Dropped | TcpWrite(_) | TcpRead(_) | PeerClosed | PeerError(_)
            | AfterProtocolError | Qp(_) | QpFailed(_) | Fallback(_) | Control(_)
            | ControlGarbled(_) | ControlClosed | KeepaliveTimeout(_) | Idle(_) => {
                Code::Unavailable
            }
        }
    }
}

impl From<EngineError> for Status {
    fn from(e: EngineError) -> Status {
        Status::from_error(e.code(), e)
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;
    use std::io;

    use byteexpress_flow::credit::{CreditError, QueueError};
    use byteexpress_flow::window::WindowError;
    use byteexpress_mem::MemError;

    use super::*;

    fn io_err() -> io::Error {
        io::Error::from(io::ErrorKind::ConnectionRefused)
    }

    fn verbs_err() -> byteexpress_verbs::Error {
        byteexpress_verbs::Error::InvalidArgument("gid index 9".into())
    }

    fn mem_err() -> MemError {
        MemError::ReserveEmpty {
            count: 4,
            buf_size: 4096,
        }
    }

    async fn elapsed() -> tokio::time::error::Elapsed {
        tokio::time::timeout(Duration::ZERO, std::future::pending::<()>())
            .await
            .unwrap_err()
    }

    /// The mapping table of DESIGN.md "Errors", set-up half: each kind keeps its code.
    #[tokio::test]
    async fn each_setup_error_maps_to_its_grpc_code() {
        static REFUSED: std::sync::OnceLock<byteexpress_verbs::Error> = std::sync::OnceLock::new();
        let refused = REFUSED.get_or_init(verbs_err);
        let cases: Vec<(SetupError, Code)> = vec![
            (
                SetupError::Connect {
                    addr: "h:1".into(),
                    source: io_err(),
                },
                Code::Unavailable,
            ),
            (
                SetupError::Timeout {
                    peer: "h:1".into(),
                    after: Duration::from_secs(1),
                    source: elapsed().await,
                },
                Code::Unavailable,
            ),
            (SetupError::Write(io_err().into()), Code::Unavailable),
            (SetupError::Read(io_err().into()), Code::Unavailable),
            (SetupError::PeerClosed, Code::Unavailable),
            (
                SetupError::Garbled(WireError("short".into())),
                Code::Unavailable,
            ),
            (SetupError::Unexpected("HELLO"), Code::Unavailable),
            (SetupError::PeerError("bye".into()), Code::Unavailable),
            (
                SetupError::DeviceConfig {
                    device: "rxe0".into(),
                    source: refused,
                },
                Code::InvalidArgument,
            ),
            (
                SetupError::Verbs {
                    device: "soft0",
                    source: verbs_err(),
                },
                Code::Unavailable,
            ),
            (SetupError::Buffers(mem_err()), Code::ResourceExhausted),
            (
                SetupError::Queues(QueueError::ZeroDepth),
                Code::InvalidArgument,
            ),
            (
                SetupError::Window(WindowError::ZeroCap),
                Code::InvalidArgument,
            ),
            (
                SetupError::ChunkTooSmall {
                    chunk: 40,
                    header: 40,
                },
                Code::InvalidArgument,
            ),
            (SetupError::QpConnect(verbs_err()), Code::Unavailable),
            (SetupError::PostRecv(verbs_err()), Code::Unavailable),
            (
                SetupError::PeerAddress("server endpoint", verbs_err()),
                Code::Unavailable,
            ),
            (
                SetupError::RdmaRequired {
                    who: WhoSet::Config("rdma"),
                    addr: "h:1".into(),
                    why: NoRdma::NoDevice,
                },
                Code::Unavailable,
            ),
            (
                SetupError::Refused {
                    side: "client",
                    reason: "no".into(),
                },
                Code::Unavailable,
            ),
            (
                SetupError::RecvBufMismatch { got: 1, want: 2 },
                Code::Unavailable,
            ),
            (
                SetupError::RecvBufTooLarge { got: 2, max: 1 },
                Code::ResourceExhausted,
            ),
            (SetupError::Version(9), Code::Unavailable),
            (SetupError::ClientChoseTcp, Code::Unavailable),
            (SetupError::UnknownDevice, Code::Unavailable),
        ];
        for (e, code) in cases {
            let text = e.to_string();
            let s = Status::from(e);
            assert_eq!(s.code, code, "{text}");
            assert!(s.message.starts_with(&text), "{text}: {}", s.message);
            let src = s.source().expect("the error is the status's source");
            assert!(src.downcast_ref::<SetupError>().is_some(), "{text}");
        }
    }

    /// The mapping table of DESIGN.md "Errors", engine half.
    #[test]
    fn each_engine_error_maps_to_its_grpc_code() {
        let too_large = ReassemblyError::TooLarge {
            key: (1, 2),
            len: 10,
            max: 5,
        };
        let cases: Vec<(EngineError, Code)> = vec![
            (EngineError::Closed, Code::Unavailable),
            (EngineError::Dropped, Code::Unavailable),
            (EngineError::TcpWrite(io_err().into()), Code::Unavailable),
            (EngineError::TcpRead(io_err().into()), Code::Unavailable),
            (EngineError::PeerClosed, Code::Unavailable),
            (EngineError::PeerError("bye".into()), Code::Unavailable),
            (EngineError::AfterProtocolError, Code::Unavailable),
            (
                EngineError::FrameTooLarge(FrameError::TooLarge { len: 9, max: 8 }),
                Code::ResourceExhausted,
            ),
            (
                EngineError::Garbled(WireError("short".into())),
                Code::Internal,
            ),
            (EngineError::OutOfOrder { got: 3, want: 2 }, Code::Internal),
            (
                EngineError::PeerCredits(CreditError::DataOverrun),
                Code::Internal,
            ),
            (
                EngineError::Reassembly(ReassemblyError::Restarted((1, 2))),
                Code::Internal,
            ),
            (EngineError::TooLarge(too_large), Code::ResourceExhausted),
            (
                EngineError::MessageTooLarge { len: 9, max: 8 },
                Code::ResourceExhausted,
            ),
            (EngineError::Qp(QpFault::PeerFellBack), Code::Unavailable),
            (EngineError::QpFailed("post_send"), Code::Unavailable),
            (
                EngineError::Fallback(FallbackError::Timeout(Duration::from_secs(1))),
                Code::Unavailable,
            ),
            (EngineError::Control(io_err().into()), Code::Unavailable),
            (
                EngineError::ControlGarbled(WireError("short".into())),
                Code::Unavailable,
            ),
            (EngineError::ControlClosed, Code::Unavailable),
            (EngineError::ReprobeProtocol("a SWITCH"), Code::Internal),
            (EngineError::UnknownWr(7), Code::Internal),
            (EngineError::Queues(QueueError::SendFull), Code::Internal),
            (EngineError::Credits(CreditError::ZeroGrant), Code::Internal),
            (EngineError::CreditVanished, Code::Internal),
            (EngineError::CreditOverflow, Code::Internal),
            (EngineError::Window(WindowError::ZeroCap), Code::Internal),
            (EngineError::Buffers(mem_err()), Code::Internal),
            (
                EngineError::KeepaliveTimeout(Duration::from_secs(1)),
                Code::Unavailable,
            ),
            (EngineError::Idle(Duration::from_secs(1)), Code::Unavailable),
        ];
        for (e, code) in cases {
            let text = e.to_string();
            let s = Status::from(e);
            assert_eq!(s.code, code, "{text}");
            assert!(s.message.starts_with(&text), "{text}: {}", s.message);
            let src = s.source().expect("the error is the status's source");
            assert!(src.downcast_ref::<EngineError>().is_some(), "{text}");
        }
    }

    /// The cause stays typed: the status's source chain reaches the `io::Error`, and the
    /// message is the chain's text (what crosses the wire), while each Display stays short.
    #[test]
    fn a_status_keeps_the_cause_chain_of_its_error() {
        let e = EngineError::TcpWrite(FrameError::Io(io::Error::new(
            io::ErrorKind::BrokenPipe,
            "pipe gone",
        )));
        assert_eq!(e.to_string(), "TCP write");
        let s = Status::from(e);
        assert_eq!(s.message, "TCP write: frame i/o: pipe gone");
        let mut chain = Vec::new();
        let mut src = s.source();
        while let Some(e) = src {
            chain.push(e.to_string());
            src = e.source();
        }
        assert_eq!(chain, ["TCP write", "frame i/o: pipe gone", "pipe gone"]);
        let io = std::iter::successors(s.source(), |&e| e.source())
            .find_map(|e| e.downcast_ref::<io::Error>())
            .expect("the io::Error is reachable");
        assert_eq!(io.kind(), io::ErrorKind::BrokenPipe);
        // A clone (a link's end fans out to every call) keeps the source.
        assert!(s.clone().source().is_some());
    }

    /// A set-up failure at the edge: `Client::connect` to a closed port is UNAVAILABLE, names
    /// the address, and its source chain reaches the refused connect's `io::Error`.
    #[tokio::test]
    async fn a_refused_connect_is_unavailable_with_its_io_error_as_source() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let addr = format!("127.0.0.1:{port}");
        let cfg = crate::Config {
            transport: crate::wire::hello::TransportPref::Tcp,
            ..crate::Config::default()
        };
        let err = match crate::Client::connect_unshared(&addr, &cfg).await {
            Ok(_) => panic!("connected to a closed port"),
            Err(e) => e,
        };
        assert_eq!(err.code, Code::Unavailable, "{err}");
        assert!(err.message.starts_with(&format!("connect {addr}")), "{err}");
        let io = std::iter::successors(err.source(), |&e| e.source())
            .find_map(|e| e.downcast_ref::<io::Error>())
            .expect("the io::Error is reachable from the status");
        assert_eq!(io.kind(), io::ErrorKind::ConnectionRefused);
    }

    /// A link's end at the edge: a peer that completes a TCP set-up, reads the call's REQUEST
    /// and hangs up fails that call UNAVAILABLE, with the engine's typed reason as the status's
    /// source (the call gets it through the link's `Closer`).
    #[tokio::test]
    async fn a_call_on_a_link_the_peer_hangs_up_fails_with_the_engine_error_as_source() {
        use byteexpress_tcp_fallback::{FrameConfig, FrameReader, FrameWriter};
        use tokio::io::AsyncReadExt;

        use crate::wire::hello::{HELLO_VERSION, Hello, TransportPref};

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let peer = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut magic = [0u8; crate::wire::CONN_MAGIC.len()];
            stream.read_exact(&mut magic).await.unwrap();
            let (r, w) = stream.into_split();
            let fc = FrameConfig { max_frame: 1 << 20 };
            let (mut r, mut w) = (FrameReader::new(r, fc), FrameWriter::new(w, fc));
            r.read_frame().await.unwrap().expect("HELLO");
            let ack = Hello::HelloAck {
                version: HELLO_VERSION,
                max_concurrent_calls: 8,
                stream_window: 1 << 16,
                devices: Vec::new(),
            };
            w.write_frame(&[&ack.encode()]).await.unwrap();
            w.flush().await.unwrap();
            r.read_frame().await.unwrap().expect("SELECT_TCP");
            r.read_frame().await.unwrap().expect("the call's REQUEST");
            // hangs up: both halves dropped
        });
        let cfg = crate::Config {
            transport: TransportPref::Tcp,
            ..crate::Config::default()
        };
        let client = crate::Client::connect_unshared(&addr, &cfg).await.unwrap();
        let err = client
            .call(crate::Request {
                method: "/t.T/M".into(),
                metadata: crate::Metadata::default(),
                body: bytes::Bytes::from_static(b"x"),
                timeout: Some(Duration::from_secs(30)),
            })
            .await
            .expect_err("the peer hung up");
        peer.await.unwrap();
        assert_eq!(err.code, Code::Unavailable, "{err}");
        assert_eq!(err.message, "peer closed the connection");
        let src = err.source().expect("the link's end is the status's source");
        assert!(
            matches!(src.downcast_ref(), Some(EngineError::PeerClosed)),
            "{src:?}"
        );
    }
}
