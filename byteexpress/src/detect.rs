//! Protocol detection on the shared port: the ByteExpress magic or the HTTP/2 client preface,
//! read (not peeked) as the bytes arrive, so the wait is on socket readiness and costs nothing
//! while a peer sends nothing more.
//!
//! The bytes read are never more than the preface being matched, so nothing of what follows is
//! consumed: a ByteExpress connection goes on to set-up with its stream just past the magic;
//! an HTTP/2 connection is handed to tonic as a [`Replayed`] stream that gives back the preface
//! bytes first.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use byteexpress_rpc::accept::ConnSlot;
use byteexpress_rpc::{CONN_MAGIC, LinkStream};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

/// The HTTP/2 client connection preface (RFC 9113, section 3.4), 24 bytes.
pub(crate) const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What a connection speaks, once detected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// The 8 bytes of [`CONN_MAGIC`] were read.
    ByteExpress,
    /// Anything else: the HTTP/2 preface in full, or bytes that match neither (handed to the
    /// HTTP/2 server, which refuses them).
    Other,
}

/// Reads the connection's first bytes until they are the whole [`CONN_MAGIC`] or the whole
/// HTTP/2 preface, or match neither, within `timeout`. Returns the protocol and the bytes read
/// (the magic, or what the HTTP/2 server must see first).
///
/// Errors: `TimedOut` when the preface is not complete within `timeout` (the connection is to
/// be closed), `UnexpectedEof` when the peer closed first, or the read's own error.
pub(crate) async fn detect<S: AsyncRead + Unpin>(
    stream: &mut S,
    timeout: Duration,
) -> io::Result<(Protocol, Vec<u8>)> {
    let read = async {
        let mut buf = Vec::with_capacity(H2_PREFACE.len());
        loop {
            let bx = buf[..] == CONN_MAGIC[..buf.len().min(CONN_MAGIC.len())];
            let h2 = buf[..] == H2_PREFACE[..buf.len().min(H2_PREFACE.len())];
            if bx && buf.len() == CONN_MAGIC.len() {
                return Ok((Protocol::ByteExpress, buf));
            }
            if !bx && (!h2 || buf.len() == H2_PREFACE.len()) {
                return Ok((Protocol::Other, buf));
            }
            // Never read past the preface still possible: what follows belongs to the protocol.
            let want = if bx {
                CONN_MAGIC.len()
            } else {
                H2_PREFACE.len()
            };
            let mut chunk = [0u8; 24];
            let n = stream.read(&mut chunk[..want - buf.len()]).await?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "closed before its protocol preface",
                ));
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    };
    tokio::time::timeout(timeout, read).await.map_err(|_| {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no complete protocol preface within {timeout:?}"),
        )
    })?
}

/// A connection's stream (TCP, or a TLS session) whose first reads return bytes already
/// taken from it (the preface read by [`detect`]; none after a TLS handshake that chose
/// HTTP/2 by ALPN), holding the connection's place under the connection caps while it lives.
#[derive(Debug)]
pub(crate) struct Replayed {
    prefix: Vec<u8>,
    at: usize,
    stream: LinkStream,
    _slot: ConnSlot,
}

impl Replayed {
    pub(crate) fn new(prefix: Vec<u8>, stream: LinkStream, slot: ConnSlot) -> Self {
        Replayed {
            prefix,
            at: 0,
            stream,
            _slot: slot,
        }
    }
}

impl AsyncRead for Replayed {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.at < this.prefix.len() {
            let n = (this.prefix.len() - this.at).min(buf.remaining());
            buf.put_slice(&this.prefix[this.at..this.at + n]);
            this.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Replayed {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Replayed {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.tcp().connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::{TcpListener, TcpStream};

    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        (c, l.accept().await.unwrap().0)
    }

    const T: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn detects_magic_split_across_writes_without_reading_past_it() {
        let (mut c, mut s) = pair().await;
        c.write_all(&CONN_MAGIC[..3]).await.unwrap();
        let t = tokio::spawn(async move { detect(&mut s, T).await.map(|p| (p, s)) });
        tokio::time::sleep(Duration::from_millis(20)).await;
        c.write_all(&CONN_MAGIC[3..]).await.unwrap();
        c.write_all(b"next").await.unwrap();
        let ((p, got), mut s) = t.await.unwrap().unwrap();
        assert_eq!(p, Protocol::ByteExpress);
        assert_eq!(got, CONN_MAGIC);
        let mut next = [0u8; 4];
        s.read_exact(&mut next).await.unwrap();
        assert_eq!(&next, b"next", "bytes after the magic are left for set-up");
    }

    #[tokio::test]
    async fn detects_http2_after_its_whole_preface_and_garbage_at_once() {
        let (mut c, mut s) = pair().await;
        c.write_all(H2_PREFACE).await.unwrap();
        c.write_all(b"SETTINGS").await.unwrap();
        let (p, got) = detect(&mut s, T).await.unwrap();
        assert_eq!((p, &got[..]), (Protocol::Other, &H2_PREFACE[..]));

        let (mut c, mut s) = pair().await;
        c.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        let (p, got) = detect(&mut s, T).await.unwrap();
        assert_eq!(p, Protocol::Other);
        assert!(!got.is_empty() && b"GET / HTTP/1.1\r\n".starts_with(&got));

        let (c, mut s) = pair().await;
        drop(c);
        assert!(detect(&mut s, T).await.is_err());
    }

    #[tokio::test]
    async fn a_partial_preface_times_out() {
        for partial in [&CONN_MAGIC[..1], &H2_PREFACE[..1], &H2_PREFACE[..23]] {
            let (mut c, mut s) = pair().await;
            c.write_all(partial).await.unwrap();
            let e = detect(&mut s, Duration::from_millis(100))
                .await
                .unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        }
    }
}
