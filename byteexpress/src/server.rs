//! [`Server`]: tonic-generated services on one TCP port that speaks ByteExpress (RDMA or TCP,
//! no HTTP/2) and standard gRPC over HTTP/2, told apart by the connection's first bytes.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;

use byteexpress_rpc::accept::Acceptor;
use byteexpress_rpc::{Config, Drain};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tower_service::Service;

use crate::bx_handler::serve_call;
use crate::detect::{Protocol, Replayed, detect};
use crate::routes::{HttpRequest, HttpResponse, Routes};

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
            drain: Drain::new(),
            #[cfg(feature = "tls")]
            tls: None,
        }
    }
}

/// Services and settings of a server; `serve*` runs it.
///
/// Each accepted connection is classified by its first bytes, read as they arrive (waited for
/// by readiness) for at most [`Config::detect_timeout`]: the ByteExpress
/// [`CONN_MAGIC`](byteexpress_rpc::CONN_MAGIC) goes to the ByteExpress server
/// (`byteexpress-rpc`); the whole 24-byte HTTP/2 preface `PRI * HTTP/2.0…`, or anything that
/// is neither, to tonic's own HTTP/2 server, which reads the bytes taken for detection again.
/// Accept errors never end the server, and the connection caps of the [`Config`] apply
/// (`byteexpress_rpc::accept::Acceptor`). The HTTP/2 side gets
/// [`Config::max_concurrent_calls`] as SETTINGS_MAX_CONCURRENT_STREAMS and
/// [`Config::keepalive_interval`] / [`Config::keepalive_timeout`] as HTTP/2 PING keepalive. Both dispatch by path to the same services. On the ByteExpress path
/// calls are streams (`byteexpress_rpc::stream`): request and response messages travel as
/// they are produced, both directions at once, each direction under its own window.
#[derive(Debug, Clone)]
pub struct ServerBuilder {
    routes: Routes,
    cfg: Config,
    drain: Drain,
    /// TLS first on every connection ([`ServerBuilder::tls_config`]).
    #[cfg(feature = "tls")]
    tls: Option<byteexpress_rpc::tls::TlsAcceptor>,
}

impl ServerBuilder {
    /// Speaks TLS first on the port (feature `tls`), as tonic's `Server::tls_config`: each
    /// connection's TLS handshake must finish within [`Config::detect_timeout`] and chooses
    /// the protocol by ALPN: `h2` (what gRPC clients with TLS credentials offer), or none,
    /// goes to HTTP/2; `bxrpc/1` ([`ALPN_BXRPC`](byteexpress_rpc::tls::ALPN_BXRPC), what a
    /// [`Channel`](crate::Channel) with [`Config::tls`] offers) to ByteExpress, whose preface,
    /// set-up and TCP frames then travel inside the session. A connection whose handshake
    /// fails is closed having been sent nothing but TLS records. Certificate files that
    /// change on disk are used for new connections without a restart
    /// (`byteexpress_rpc::tls`). Plain connections are refused (their bytes fail the
    /// handshake). Errors: `tls`'s material does not load.
    #[cfg(feature = "tls")]
    pub fn tls_config(
        mut self,
        tls: byteexpress_rpc::ServerTlsConfig,
    ) -> Result<Self, byteexpress_rpc::TlsError> {
        use byteexpress_rpc::tls::{ALPN_BXRPC, ALPN_H2};
        self.tls = Some(tls.acceptor(&[ALPN_H2, ALPN_BXRPC])?);
        Ok(self)
    }

    /// Settings of the ByteExpress side (transport pinning, buffer sizes, ...).
    pub fn config(mut self, cfg: Config) -> Self {
        self.cfg = cfg;
        self
    }

    /// The server's draining switch ([`Drain`]; take it before `serve*`): `drain.start()`
    /// makes the ByteExpress side refuse new calls before dispatch (UNAVAILABLE, marked so
    /// that clients retry them transparently on another replica) while running calls finish;
    /// `drain.drained().await` waits for them. The HTTP/2 side is not affected (end it with
    /// `serve_with_shutdown`'s signal, which sends GOAWAY).
    pub fn drain_handle(&self) -> Drain {
        self.drain.clone()
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

    /// Binds `addr` and serves for as long as the process runs (accept errors are logged and
    /// retried, never returned).
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

    /// Serves on `listener` (e.g. bound to port 0 by a test) for as long as the process runs.
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
        self.cfg
            .validate()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let routes = self.routes;
        let bx_routes = routes.clone();
        let detect_timeout = self.cfg.detect_timeout;
        // the same limits on the HTTP/2 side, in its own terms (SETTINGS_MAX_CONCURRENT_STREAMS,
        // HTTP/2 PING keepalive)
        let h2_streams = self.cfg.max_concurrent_calls.max(1);
        let h2_ping =
            (!self.cfg.keepalive_interval.is_zero()).then_some(self.cfg.keepalive_interval);
        let h2_ping_timeout = self.cfg.keepalive_timeout;
        let mut acceptor = Acceptor::new(listener, &self.cfg);
        let stream_routes = routes.clone();
        let bx =
            byteexpress_rpc::Server::new(move |req| serve_call(bx_routes.clone(), req), self.cfg)
                .with_streams(move |req, rx, tx| {
                    crate::bx_stream::serve_stream(stream_routes.clone(), req, rx, tx)
                })
                .with_drain(self.drain);
        let (h2_tx, h2_rx) = mpsc::unbounded_channel::<Replayed>();
        let (stop_tx, mut stop_rx) = watch::channel(false);
        #[cfg(feature = "tls")]
        let tls = self.tls;

        let incoming = futures::stream::unfold(h2_rx, |mut rx| async move {
            rx.recv().await.map(|s| (Ok::<_, io::Error>(s), rx))
        });
        let h2 = async move {
            let stopped = async move {
                let _ = stop_rx.wait_for(|s| *s).await;
            };
            tonic::transport::Server::builder()
                .max_concurrent_streams(h2_streams)
                .http2_keepalive_interval(h2_ping)
                .http2_keepalive_timeout(Some(h2_ping_timeout))
                .serve_with_incoming_shutdown(routes, incoming, stopped)
                .await
                .map_err(io::Error::other)
        };

        let accept = async move {
            tokio::pin!(signal);
            loop {
                let (mut stream, peer, slot) = tokio::select! {
                    () = &mut signal => break,
                    r = acceptor.accept() => r,
                };
                let _ = stream.set_nodelay(true);
                let (bx, h2_tx) = (bx.clone(), h2_tx.clone());
                #[cfg(feature = "tls")]
                if let Some(tls) = &tls {
                    tokio::spawn(crate::tls_port::serve_tls(
                        tls.clone(),
                        stream,
                        peer,
                        slot,
                        detect_timeout,
                        bx,
                        h2_tx,
                    ));
                    continue;
                }
                tokio::spawn(async move {
                    match detect(&mut stream, detect_timeout).await {
                        Ok((Protocol::ByteExpress, _)) => {
                            if let Err(e) =
                                bx.serve_after_magic_held(stream.into(), Some(slot)).await
                            {
                                tracing::info!(%peer, "ByteExpress connection ended: {e}");
                            }
                        }
                        Ok((Protocol::Other, prefix)) => {
                            let _ = h2_tx.send(Replayed::new(prefix, stream.into(), slot));
                        }
                        Err(e) => {
                            tracing::debug!(%peer, "connection closed during protocol detection: {e}")
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
