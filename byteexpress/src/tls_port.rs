//! The shared port with TLS (feature `tls`): the handshake first, then the protocol the
//! client chose by ALPN.
//!
//! `bxrpc/1` → the ByteExpress server, after its preface ([`CONN_MAGIC`]) read inside the
//! session; `h2`, or no ALPN at all → tonic's HTTP/2 server, after the whole HTTP/2 client
//! preface read inside the session (and replayed to tonic). One deadline, the detect
//! timeout, bounds the handshake and the preface together: a connection whose handshake
//! fails, or whose preface is not complete (or is not its ALPN protocol's) by then, is
//! dropped, having been sent only TLS records (an alert at most): no HELLO answer, nothing
//! of set-up, and a client that finishes the handshake and stays silent holds no connection
//! slot past the deadline.
//!
//! [`CONN_MAGIC`]: byteexpress_rpc::CONN_MAGIC

use std::net::SocketAddr;
use std::time::Duration;

use byteexpress_rpc::accept::ConnSlot;
use byteexpress_rpc::tls::{ALPN_BXRPC, TlsAcceptor};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::detect::{H2_PREFACE, Protocol, Replayed, detect};

/// Serves one accepted connection of a TLS port (its `TCP_NODELAY` already set): the
/// handshake and the preface inside it (ByteExpress's or HTTP/2's, by ALPN) must both come
/// within `detect_timeout`.
pub(crate) async fn serve_tls(
    tls: TlsAcceptor,
    stream: TcpStream,
    peer: SocketAddr,
    slot: ConnSlot,
    detect_timeout: Duration,
    bx: byteexpress_rpc::Server,
    h2_tx: mpsc::UnboundedSender<Replayed>,
) {
    // one deadline for the handshake and the preface inside it
    let deadline = tokio::time::Instant::now() + detect_timeout;
    let mut stream = match tokio::time::timeout_at(deadline, tls.accept(stream)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::info!(%peer, error = %chain(&e), "TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::info!(%peer, "no TLS handshake within the detect timeout");
            return;
        }
    };
    let bxrpc = stream.alpn() == Some(ALPN_BXRPC);
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    match detect(&mut stream, left).await {
        Ok((Protocol::ByteExpress, _)) if bxrpc => {
            if let Err(e) = bx.serve_after_magic_held(stream, Some(slot)).await {
                tracing::info!(%peer, "ByteExpress connection ended: {e}");
            }
        }
        Ok((Protocol::Other, prefix)) if !bxrpc && prefix[..] == H2_PREFACE[..] => {
            let _ = h2_tx.send(Replayed::new(prefix, stream, slot));
        }
        Ok(_) => {
            tracing::info!(
                %peer,
                alpn = ?stream.alpn().map(String::from_utf8_lossy),
                "the session's first bytes are not the preface of its ALPN protocol: closed"
            );
        }
        Err(e) => {
            tracing::info!(%peer, "TLS session closed during protocol detection: {e}")
        }
    }
}

/// `e` and its causes, `": "`-joined, for logs.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
