//! [`Server`]: tonic-generated services on one TCP port that speaks ByteExpress (RDMA or TCP,
//! no HTTP/2) and standard gRPC over HTTP/2, told apart by the connection's first bytes.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use byteexpress_rpc::CONN_MAGIC;
use byteexpress_rpc::Config;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tower_service::Service;

use crate::bx_handler::serve_call;
use crate::routes::{HttpRequest, HttpResponse, Routes};

/// Time a new connection has to send the 8 bytes that tell the protocols apart.
const PEEK_TIMEOUT: Duration = Duration::from_secs(10);

/// Entry point, as `tonic::transport::Server`: `Server::builder().add_service(svc).serve(addr)`.
#[derive(Debug)]
pub struct Server;

impl Server {
    /// A builder with no services and [`Config::default`] (which reads `BX_TRANSPORT`; a server
    /// pinned to one transport refuses ByteExpress clients that ask for the other).
    pub fn builder() -> ServerBuilder {
        ServerBuilder {
            routes: Routes::default(),
            cfg: Config::default(),
        }
    }
}

/// Services and settings of a server; `serve*` runs it.
///
/// Each accepted connection is classified with `TcpStream::peek` (nothing is consumed, so
/// nothing needs replaying): the ByteExpress [`CONN_MAGIC`](byteexpress_rpc::CONN_MAGIC) goes to the ByteExpress server
/// (`byteexpress-rpc`), anything else (the HTTP/2 preface `PRI * HTTP/2.0`, ...) to tonic's
/// own HTTP/2 server. Both dispatch by path to the same services. On the ByteExpress path
/// streaming methods see their whole request at once, and their whole response is sent at
/// once.
#[derive(Debug, Clone)]
pub struct ServerBuilder {
    routes: Routes,
    cfg: Config,
}

impl ServerBuilder {
    /// Settings of the ByteExpress side (transport pinning, buffer sizes, ...).
    pub fn config(mut self, cfg: Config) -> Self {
        self.cfg = cfg;
        self
    }

    /// Adds a tonic-generated server (`XxxServer::new(impl)`), or any service of that shape.
    pub fn add_service<S>(mut self, svc: S) -> Self
    where
        S: Service<HttpRequest, Response = HttpResponse, Error = Infallible>
            + tonic::server::NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
    {
        self.routes.add(svc);
        self
    }

    /// Binds `addr` and serves until an accept fails.
    pub async fn serve(self, addr: SocketAddr) -> io::Result<()> {
        self.serve_with_listener(TcpListener::bind(addr).await?)
            .await
    }

    /// Binds `addr` and serves until `signal` completes.
    pub async fn serve_with_shutdown(
        self,
        addr: SocketAddr,
        signal: impl Future<Output = ()>,
    ) -> io::Result<()> {
        self.serve_with_listener_shutdown(TcpListener::bind(addr).await?, signal)
            .await
    }

    /// Serves on `listener` (e.g. bound to port 0 by a test) until an accept fails.
    pub async fn serve_with_listener(self, listener: TcpListener) -> io::Result<()> {
        self.serve_with_listener_shutdown(listener, std::future::pending())
            .await
    }

    /// Serves on `listener` until `signal` completes: then stops accepting, lets the HTTP/2
    /// connections finish (graceful GOAWAY) and returns. ByteExpress links already up keep
    /// running until their clients close them.
    pub async fn serve_with_listener_shutdown(
        self,
        listener: TcpListener,
        signal: impl Future<Output = ()>,
    ) -> io::Result<()> {
        let routes = self.routes;
        let bx_routes = routes.clone();
        let bx =
            byteexpress_rpc::Server::new(move |req| serve_call(bx_routes.clone(), req), self.cfg);
        let (h2_tx, h2_rx) = mpsc::unbounded_channel::<TcpStream>();
        let (stop_tx, mut stop_rx) = watch::channel(false);

        let incoming = futures::stream::unfold(h2_rx, |mut rx| async move {
            rx.recv().await.map(|s| (Ok::<_, io::Error>(s), rx))
        });
        let h2 = async move {
            let stopped = async move {
                let _ = stop_rx.wait_for(|s| *s).await;
            };
            tonic::transport::Server::builder()
                .serve_with_incoming_shutdown(routes, incoming, stopped)
                .await
                .map_err(io::Error::other)
        };

        let accept = async move {
            tokio::pin!(signal);
            loop {
                let (stream, peer) = tokio::select! {
                    () = &mut signal => break,
                    r = listener.accept() => r?,
                };
                let _ = stream.set_nodelay(true);
                let (bx, h2_tx) = (bx.clone(), h2_tx.clone());
                tokio::spawn(async move {
                    match classify(&stream).await {
                        Ok(Protocol::ByteExpress) => {
                            if let Err(e) = bx.serve_connection(stream).await {
                                tracing::info!(%peer, "ByteExpress connection ended: {e}");
                            }
                        }
                        Ok(Protocol::Other) => {
                            let _ = h2_tx.send(stream);
                        }
                        Err(e) => {
                            tracing::debug!(%peer, "connection dropped before its first bytes: {e}")
                        }
                    }
                });
            }
            let _ = stop_tx.send(true);
            Ok::<(), io::Error>(())
        };
        tokio::try_join!(accept, h2).map(|_| ())
    }
}

/// What a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    ByteExpress,
    Other,
}

/// Peeks at the first bytes until they match [`CONN_MAGIC`] in full or differ from it.
/// Errors: the peer closed or sent too little within [`PEEK_TIMEOUT`].
async fn classify(stream: &TcpStream) -> io::Result<Protocol> {
    let until = tokio::time::Instant::now() + PEEK_TIMEOUT;
    let mut buf = [0u8; CONN_MAGIC.len()];
    loop {
        let n = tokio::time::timeout_at(until, stream.peek(&mut buf))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no protocol preface"))??;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed"));
        }
        if buf[..n] != CONN_MAGIC[..n] {
            return Ok(Protocol::Other);
        }
        if n == CONN_MAGIC.len() {
            return Ok(Protocol::ByteExpress);
        }
        // a prefix of the magic: peek returns at once while those bytes wait, so pause briefly
        if tokio::time::Instant::now() >= until {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "partial protocol preface",
            ));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        (c, l.accept().await.unwrap().0)
    }

    #[tokio::test]
    async fn classifies_magic_split_across_writes_and_http2() {
        let (mut c, s) = pair().await;
        c.write_all(&CONN_MAGIC[..3]).await.unwrap();
        let t = tokio::spawn(async move { classify(&s).await.map(|p| (p, s)) });
        tokio::time::sleep(Duration::from_millis(20)).await;
        c.write_all(&CONN_MAGIC[3..]).await.unwrap();
        let (p, s) = t.await.unwrap().unwrap();
        assert_eq!(p, Protocol::ByteExpress);
        let mut buf = [0u8; 8];
        assert_eq!(s.peek(&mut buf).await.unwrap(), 8, "nothing consumed");

        let (mut c, s) = pair().await;
        c.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        assert_eq!(classify(&s).await.unwrap(), Protocol::Other);

        let (c, s) = pair().await;
        drop(c);
        assert!(classify(&s).await.is_err());
    }
}
