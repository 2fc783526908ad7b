//! The ByteExpress wire protocol (version 1): the same bytes over RDMA SENDs and TCP frames.
//!
//! A TCP connection opens with the 8-byte [`CONN_MAGIC`], then carries length-prefixed frames
//! (`byteexpress-tcp-fallback`): first the set-up messages of [`hello`], then (TCP transport) one
//! message per frame, or (RDMA transport) only keepalive PING and PONG messages (header kinds
//! 7 and 8) and, when the QP fails, RESYNC (14), after which it carries one message per frame
//! until a re-probe (15–17) moves the link back to a new QP (`header`, "Resync", "Re-probe"). An RDMA link carries one message per SEND, or one chunk per SEND for a
//! message larger than a chunk ([`header`], "Chunks"). A message is a [`header::Header`] (40
//! bytes), then `meta_len` bytes of metadata ([`meta`]), then `body_len` bytes of body.
//!
//! With TLS (feature `tls`, `crate::tls`), the TLS handshake comes first on the TCP
//! connection, and [`CONN_MAGIC`] and everything after it on that connection are application
//! data inside the TLS session (the same bytes); RDMA SENDs are not covered (DESIGN.md 4.1).

pub mod header;
pub mod hello;
pub mod meta;
pub mod rendezvous;

/// First bytes a ByteExpress client sends on its TCP connection: `"BXRPC"`, 0, 0, version 1.
/// (An HTTP/2 client starts with `"PRI * HTTP/2.0"`, so a server tells them apart from byte 0.)
/// With TLS (feature `tls`) these bytes come after the handshake, as the first application
/// data inside the TLS session, never before it on the bare connection.
pub const CONN_MAGIC: [u8; 8] = *b"BXRPC\0\0\x01";

/// A malformed message from the peer. The link that received it is closed with an error
/// frame; other links and calls are unaffected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed message: {0}")]
pub struct WireError(pub String);

pub(crate) fn err<T>(msg: impl Into<String>) -> Result<T, WireError> {
    Err(WireError(msg.into()))
}
