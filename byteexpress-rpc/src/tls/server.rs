//! The server side of the handshake, with the reload of changed PEM files off the runtime.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::net::TcpStream;

use super::pem::Stamp;
use super::{ServerTlsConfig, TlsError};
use crate::link_io::LinkStream;

/// At most one check of the PEM files' stamps starts per this interval (a check is started
/// by a handshake, and runs on a blocking thread while handshakes go on).
const RELOAD_CHECK_INTERVAL: Duration = Duration::from_millis(500);

/// A check (stat, and read and build when a stamp changed) running longer than this is
/// logged; the config in use stays, and no other check starts until it ends.
const RELOAD_TIMEOUT: Duration = Duration::from_secs(5);

/// Accepts TLS sessions on TCP connections with a [`ServerTlsConfig`], offering a fixed list
/// of application protocols (ALPN). A handshake uses the rustls config published last and
/// never waits on the file system: when files are given, a handshake starts (at most once
/// per 500 ms, one at a time) a check of their stamps on a blocking thread, which builds and
/// publishes a new config when one changed (module docs of [`crate::tls`]). Cheap to clone:
/// clones share the current config.
#[derive(Clone)]
pub struct TlsAcceptor {
    cfg: Arc<ServerTlsConfig>,
    alpn: Arc<Vec<Vec<u8>>>,
    current: Arc<Mutex<Current>>,
}

/// The config in use (cloned out under the lock, never built under it), the file stamps it
/// was built from, the stamps of the last version that failed to load (so that it is logged
/// once, not at every check), and the state of the background check.
struct Current {
    rustls: Arc<rustls::ServerConfig>,
    stamps: Vec<Option<Stamp>>,
    failed: Option<Vec<Option<Stamp>>>,
    /// When the last check started; `None` before the first.
    checked: Option<Instant>,
    /// A check is running (on a blocking thread).
    checking: bool,
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
    /// Reads and builds the config now (on the caller's thread: a server being set up).
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
                checked: None,
                checking: false,
            })),
        })
    }

    /// The rustls config for the next handshake: the one published last. Starts a check of
    /// the files in the background when they are files, none is running and the last one
    /// started [`RELOAD_CHECK_INTERVAL`] ago or more; the handshake does not wait for it.
    fn config(&self) -> Arc<rustls::ServerConfig> {
        let mut cur = self.current.lock();
        let due = cur
            .checked
            .is_none_or(|t| t.elapsed() >= RELOAD_CHECK_INTERVAL);
        if self.cfg.has_files()
            && !cur.checking
            && due
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            cur.checking = true;
            cur.checked = Some(Instant::now());
            let this = self.clone();
            rt.spawn(async move {
                let check = {
                    let this = this.clone();
                    tokio::task::spawn_blocking(move || this.check_files())
                };
                if tokio::time::timeout(RELOAD_TIMEOUT, check).await.is_err() {
                    tracing::warn!(
                        "checking the TLS certificate files takes over {RELOAD_TIMEOUT:?}; \
                         new connections keep the current ones"
                    );
                }
            });
        }
        cur.rustls.clone()
    }

    /// On a blocking thread: stats the files, and when a stamp changed builds the config
    /// anew and publishes it. A version that does not load keeps the previous config (logged
    /// once per version). Ends the check, whatever happens (even a panic).
    fn check_files(&self) {
        struct Done<'a>(&'a Mutex<Current>);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                self.0.lock().checking = false;
            }
        }
        let _done = Done(&self.current);
        let stamps = self.cfg.stamps();
        {
            let cur = self.current.lock();
            if stamps == cur.stamps || cur.failed.as_ref() == Some(&stamps) {
                return;
            }
        }
        let built = self.cfg.build(&self.alpn);
        let mut cur = self.current.lock();
        match built {
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
