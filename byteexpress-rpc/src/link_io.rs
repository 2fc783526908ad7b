//! A link's byte stream: a TCP connection, or (feature `tls`) a TLS session over one.
//!
//! Set-up, the TCP engine and the control connection of an RDMA link read and write through
//! [`LinkRead`] and [`LinkWrite`], the two halves of a [`LinkStream`]. A plain TCP stream is
//! split into tokio's owned halves, as before TLS existed: each poll is one `match` on a
//! one-variant enum without the feature, one predictable branch with it. A TLS stream is
//! split with `tokio::io::split` (a lock shared by the halves). What needs the socket itself
//! (`TCP_NODELAY`, the peer's address) is done on the [`TcpStream`] before the TLS handshake,
//! or through [`LinkStream::tcp`].

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

/// The TLS session type of a link (client or server side).
#[cfg(feature = "tls")]
pub(crate) type TlsStream = tokio_rustls::TlsStream<TcpStream>;

/// The byte stream of one connection: plain TCP, or TLS over TCP once its handshake is done
/// (feature `tls`: `crate::tls::TlsAcceptor::accept` on a server, `Config::tls` on a client).
/// Reads and writes go to the peer as they would on the [`TcpStream`] (decrypted, encrypted).
pub struct LinkStream {
    inner: Inner,
}

enum Inner {
    Tcp(TcpStream),
    #[cfg(feature = "tls")]
    Tls(Box<TlsStream>),
}

impl std::fmt::Debug for LinkStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkStream")
            .field("peer", &self.tcp().peer_addr().ok())
            .field("tls", &self.is_tls())
            .finish()
    }
}

impl From<TcpStream> for LinkStream {
    fn from(s: TcpStream) -> Self {
        LinkStream {
            inner: Inner::Tcp(s),
        }
    }
}

#[cfg(feature = "tls")]
impl From<TlsStream> for LinkStream {
    fn from(s: TlsStream) -> Self {
        LinkStream {
            inner: Inner::Tls(Box::new(s)),
        }
    }
}

impl LinkStream {
    /// The TCP connection under the stream (for its addresses and socket options).
    pub fn tcp(&self) -> &TcpStream {
        match &self.inner {
            Inner::Tcp(s) => s,
            #[cfg(feature = "tls")]
            Inner::Tls(s) => s.get_ref().0,
        }
    }

    /// The peer's address. Errors: the socket's (`getpeername`).
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.tcp().peer_addr()
    }

    /// Whether the stream is a TLS session.
    pub fn is_tls(&self) -> bool {
        !matches!(self.inner, Inner::Tcp(_))
    }

    /// The application protocol the TLS handshake agreed on (ALPN; `None` on plain TCP, or
    /// when the client offered none).
    pub fn alpn(&self) -> Option<&[u8]> {
        match &self.inner {
            Inner::Tcp(_) => None,
            #[cfg(feature = "tls")]
            Inner::Tls(s) => s.get_ref().1.alpn_protocol(),
        }
    }

    /// The two halves, usable from different tasks.
    pub(crate) fn into_split(self) -> (LinkRead, LinkWrite) {
        match self.inner {
            Inner::Tcp(s) => {
                let (r, w) = s.into_split();
                (LinkRead::Tcp(r), LinkWrite::Tcp(w))
            }
            #[cfg(feature = "tls")]
            Inner::Tls(s) => {
                let (r, w) = tokio::io::split(s);
                (LinkRead::Tls(r), LinkWrite::Tls(w))
            }
        }
    }
}

/// The read half of a [`LinkStream`].
#[derive(Debug)]
pub(crate) enum LinkRead {
    Tcp(OwnedReadHalf),
    #[cfg(feature = "tls")]
    Tls(tokio::io::ReadHalf<Box<TlsStream>>),
}

/// The write half of a [`LinkStream`]. A TLS half holds encrypted records until the socket
/// takes them: the frame writers flush after each batch (`engine/tcp.rs`, `control.rs`,
/// set-up), which sends them.
#[derive(Debug)]
pub(crate) enum LinkWrite {
    Tcp(OwnedWriteHalf),
    #[cfg(feature = "tls")]
    Tls(tokio::io::WriteHalf<Box<TlsStream>>),
}

impl AsyncRead for LinkStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match &mut self.get_mut().inner {
            Inner::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            #[cfg(feature = "tls")]
            Inner::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for LinkStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().inner {
            Inner::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            #[cfg(feature = "tls")]
            Inner::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().inner {
            Inner::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            #[cfg(feature = "tls")]
            Inner::Tls(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.inner {
            Inner::Tcp(s) => s.is_write_vectored(),
            #[cfg(feature = "tls")]
            Inner::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().inner {
            Inner::Tcp(s) => Pin::new(s).poll_flush(cx),
            #[cfg(feature = "tls")]
            Inner::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().inner {
            Inner::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            #[cfg(feature = "tls")]
            Inner::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

impl AsyncRead for LinkRead {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            LinkRead::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            #[cfg(feature = "tls")]
            LinkRead::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for LinkWrite {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            LinkWrite::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            #[cfg(feature = "tls")]
            LinkWrite::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            LinkWrite::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            #[cfg(feature = "tls")]
            LinkWrite::Tls(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            LinkWrite::Tcp(s) => s.is_write_vectored(),
            #[cfg(feature = "tls")]
            LinkWrite::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            LinkWrite::Tcp(s) => Pin::new(s).poll_flush(cx),
            #[cfg(feature = "tls")]
            LinkWrite::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            LinkWrite::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            #[cfg(feature = "tls")]
            LinkWrite::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}
