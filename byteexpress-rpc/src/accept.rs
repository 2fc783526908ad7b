//! An accept loop that no peer can end, with caps on the connections held.
//!
//! `accept(2)` fails for reasons that belong to the process or to one connection, never to the
//! listener: EMFILE/ENFILE (no fd), ENOMEM/ENOBUFS (no memory), ECONNABORTED/ECONNRESET (the
//! peer left before the accept), EPROTO. hyper and tonic treat them alike: log, wait a moment,
//! accept again. [`Acceptor::accept`] does that. A resource error is logged at most once a
//! second (with the count of errors in between) and the loop backs off [`ACCEPT_BACKOFF`], so
//! a flood costs no CPU while the pending connections wait in the kernel's backlog. A
//! per-connection error is retried at once.
//!
//! Every accepted connection is counted, in total and per remote IP address, until its
//! [`ConnSlot`] drops. A connection beyond [`Config::max_connections`] or
//! [`Config::max_connections_per_addr`] is closed at once (logged at most once a second).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use crate::Config;

/// Pause after an accept error that is not the peer's own (EMFILE, ENFILE, ENOMEM, ...), so
/// the loop neither spins nor gives up (unit: time).
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Logs a recurring event at most once a second, counting the occurrences in between.
#[derive(Debug)]
struct RateLimitedLog {
    last: Option<Instant>,
    suppressed: u64,
}

impl RateLimitedLog {
    fn new() -> Self {
        RateLimitedLog {
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(n)` when a line may be logged now, `n` = occurrences suppressed since the last.
    fn allow(&mut self) -> Option<u64> {
        let now = Instant::now();
        match self.last {
            Some(t) if now.duration_since(t) < Duration::from_secs(1) => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

/// Connections held, in total and per remote address.
#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_addr: HashMap<IpAddr, usize>,
}

/// A counted connection; dropping it frees its place under the caps. Keep it as long as the
/// connection's fd is open.
#[derive(Debug)]
pub struct ConnSlot {
    counts: Arc<Mutex<Counts>>,
    ip: IpAddr,
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        let mut c = self.counts.lock();
        c.total -= 1;
        if let Some(n) = c.per_addr.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                c.per_addr.remove(&self.ip);
            }
        }
    }
}

/// Accepts connections on a listener for as long as the process runs (see the module docs).
#[derive(Debug)]
pub struct Acceptor {
    listener: TcpListener,
    max_total: usize,
    max_per_addr: usize,
    counts: Arc<Mutex<Counts>>,
    error_log: RateLimitedLog,
    cap_log: RateLimitedLog,
}

impl Acceptor {
    /// Accepts on `listener` under `cfg`'s [`Config::max_connections`] and
    /// [`Config::max_connections_per_addr`].
    pub fn new(listener: TcpListener, cfg: &Config) -> Self {
        Acceptor {
            listener,
            max_total: cfg.max_connections,
            max_per_addr: cfg.max_connections_per_addr,
            counts: Arc::default(),
            error_log: RateLimitedLog::new(),
            cap_log: RateLimitedLog::new(),
        }
    }

    /// The next connection within the caps. Never fails: accept errors are logged (at most once
    /// a second) and retried, after [`ACCEPT_BACKOFF`] unless the error was the peer's own
    /// (ECONNABORTED, ECONNRESET, EINTR). Cancel-safe.
    pub async fn accept(&mut self) -> (TcpStream, SocketAddr, ConnSlot) {
        loop {
            match self.listener.accept().await {
                Ok((stream, peer)) => {
                    if let Some(slot) = self.admit(peer.ip()) {
                        return (stream, peer, slot);
                    }
                    metrics::counter!(crate::metrics::CONNECTIONS_REFUSED).increment(1);
                    if let Some(n) = self.cap_log.allow() {
                        tracing::warn!(
                            %peer,
                            max_connections = self.max_total,
                            max_connections_per_addr = self.max_per_addr,
                            "connection refused: connection limit reached ({n} more refused since the last report)"
                        );
                    }
                    drop(stream);
                }
                Err(e) => {
                    let peer_caused = matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionAborted
                            | io::ErrorKind::ConnectionReset
                            | io::ErrorKind::Interrupted
                    );
                    metrics::counter!(crate::metrics::ACCEPT_ERRORS).increment(1);
                    if let Some(n) = self.error_log.allow() {
                        tracing::warn!(
                            "accept failed: {e}; still serving ({n} more accept errors since the last report)"
                        );
                    }
                    if !peer_caused {
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                    }
                }
            }
        }
    }

    /// The listener's local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    fn admit(&self, ip: IpAddr) -> Option<ConnSlot> {
        let mut c = self.counts.lock();
        let here = c.per_addr.get(&ip).copied().unwrap_or(0);
        if c.total >= self.max_total || here >= self.max_per_addr {
            return None;
        }
        c.total += 1;
        *c.per_addr.entry(ip).or_insert(0) += 1;
        Some(ConnSlot {
            counts: self.counts.clone(),
            ip,
        })
    }
}
