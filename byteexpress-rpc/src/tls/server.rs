//! The server side of the handshake, with the reload of changed PEM files.

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::net::TcpStream;

use super::pem::Stamp;
use super::{ServerTlsConfig, TlsError};
use crate::link_io::LinkStream;

/// Accepts TLS sessions on TCP connections with a [`ServerTlsConfig`], offering a fixed list
/// of application protocols (ALPN). Before each handshake it checks whether a PEM file of
/// the config changed on disk, and if so builds the rustls config anew (module docs of
/// [`crate::tls`]). Cheap to clone: clones share the current config.
#[derive(Clone)]
pub struct TlsAcceptor {
    cfg: Arc<ServerTlsConfig>,
    alpn: Arc<Vec<Vec<u8>>>,
    current: Arc<Mutex<Current>>,
}

/// The config in use, the file stamps it was built from, and the stamps of the last version
/// that failed to load (so that it is logged once, not at every connection).
struct Current {
    rustls: Arc<rustls::ServerConfig>,
    stamps: Vec<Option<Stamp>>,
    failed: Option<Vec<Option<Stamp>>>,
}

impl std::fmt::Debug for TlsAcceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsAcceptor")
            .field("cfg", &self.cfg)
            .field("alpn", &self.alpn)
            .finish()
    }
}

impl TlsAcceptor {
    pub(super) fn new(cfg: ServerTlsConfig, alpn: Vec<Vec<u8>>) -> Result<TlsAcceptor, TlsError> {
        let stamps = cfg.stamps();
        let rustls = Arc::new(cfg.build(&alpn)?);
        Ok(TlsAcceptor {
            cfg: Arc::new(cfg),
            alpn: Arc::new(alpn),
            current: Arc::new(Mutex::new(Current {
                rustls,
                stamps,
                failed: None,
            })),
        })
    }

    /// The rustls config for the next handshake: rebuilt first when a file changed. A
    /// version that does not load keeps the previous config (logged once per version).
    fn config(&self) -> Arc<rustls::ServerConfig> {
        let stamps = self.cfg.stamps();
        let mut cur = self.current.lock();
        if stamps == cur.stamps || cur.failed.as_ref() == Some(&stamps) {
            return cur.rustls.clone();
        }
        match self.cfg.build(&self.alpn) {
            Ok(c) => {
                tracing::info!("TLS certificate files changed: new connections use them");
                cur.rustls = Arc::new(c);
                cur.stamps = stamps;
                cur.failed = None;
            }
            Err(e) => {
                tracing::warn!(
                    error = %crate::tls::chain(&e),
                    "TLS certificate files changed but do not load; keeping the previous ones"
                );
                cur.failed = Some(stamps);
            }
        }
        cur.rustls.clone()
    }

    /// Runs the server side of the handshake on `tcp` (set its socket options first). The
    /// caller bounds it in time. Errors: [`TlsError::Handshake`] (the client's certificate
    /// is missing or untrusted, no common version or ALPN protocol, the peer closed, ...).
    pub async fn accept(&self, tcp: TcpStream) -> Result<LinkStream, TlsError> {
        let acceptor = tokio_rustls::TlsAcceptor::from(self.config());
        let tls = acceptor.accept(tcp).await.map_err(TlsError::Handshake)?;
        Ok(LinkStream::from(tokio_rustls::TlsStream::Server(tls)))
    }
}
