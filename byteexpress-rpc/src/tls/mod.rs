//! TLS on links (feature `tls`): rustls with the `ring` provider, as tonic's `tls-ring`.
//!
//! A server with a [`ServerTlsConfig`] speaks TLS first on its port: the handshake comes
//! before the connection preface ([`CONN_MAGIC`](crate::CONN_MAGIC)), so HELLO, the device
//! endpoints, QP numbers and the soft device's socket name, and every frame of the link's
//! TCP connection after them (the TCP path, or an RDMA link's control connection and its
//! fallback), travel inside the TLS session, and a connection whose handshake fails gets
//! nothing of them. The client offers the application protocol [`ALPN_BXRPC`]; the
//! `byteexpress` facade's shared port also offers [`ALPN_H2`] and hands those sessions to
//! HTTP/2. RDMA messages themselves (SENDs on the QP) are not encrypted: TLS covers the
//! TCP connection only (README, "TLS").
//!
//! - [`ServerTlsConfig`]: the server's [`Identity`] (certificate chain and key), and for
//!   client authentication (mTLS) the CA that signs client certificates.
//! - [`ClientTlsConfig`]: the CA roots to trust, the domain name to ask for (SNI) and check
//!   the certificate against (default: the host of the address), and an [`Identity`] for
//!   mTLS. A client uses TLS when [`Config::tls`](crate::Config::tls) holds one.
//! - PEM given as bytes is read once; PEM given as files ([`Identity::from_pem_files`],
//!   [`Certificate::from_pem_file`]) is read again when a file changes on disk: a server's
//!   handshake starts a check of its files' stamps (modification time, length, inode) on a
//!   blocking thread (one at a time, at most every 500 ms) and uses the config published
//!   last without waiting for it; the check builds and publishes a new rustls config when a
//!   stamp changed, so new connections present the new certificate shortly after, without a
//!   restart; connections up keep theirs. A replaced file that does not load (half written,
//!   a key that does not match, no regular file: a named pipe would block the read), or a
//!   check that takes over 5 s, is logged and the previous config stays. A client reads its
//!   files at each new link, on a blocking thread.
//! - Errors of a client's link set-up: its config's own mistakes are INVALID_ARGUMENT, a
//!   failed handshake UNAVAILABLE ([`TlsError`]).

mod client;
mod pem;
mod server;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) use client::connect;
pub use server::TlsAcceptor;

use pem::Pem;

/// ALPN name of the ByteExpress protocol inside TLS: the preface, set-up and the link's
/// frames follow the handshake as on plain TCP (DESIGN.md 4.1).
pub const ALPN_BXRPC: &[u8] = b"bxrpc/1";
/// ALPN name of HTTP/2 (RFC 9113): standard gRPC clients offer it.
pub const ALPN_H2: &[u8] = b"h2";

/// The rustls crypto provider of every config here: ring.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Why a TLS config could not be built, or a handshake failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A PEM file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The read's error.
        #[source]
        source: std::io::Error,
    },
    /// The PEM text does not parse.
    #[error("bad PEM in {origin}")]
    Pem {
        /// The file, or `(in memory)`.
        origin: String,
        /// The parser's error.
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    /// No certificate in a PEM that must hold one.
    #[error("no certificate in {0}")]
    NoCertificate(String),
    /// No private key in the identity's key PEM.
    #[error("no private key in {0}")]
    NoKey(String),
    /// A server config without an identity.
    #[error("a TLS server needs an identity (certificate chain and key)")]
    NoIdentity,
    /// rustls refused the material (a key that does not match the certificate, a CA
    /// certificate it cannot use, ...).
    #[error("TLS config refused")]
    Config(#[source] rustls::Error),
    /// The client-certificate verifier could not be built from the client CA.
    #[error("client CA refused")]
    ClientCa(#[source] rustls::server::VerifierBuilderError),
    /// The domain name is not a DNS name or IP address.
    #[error("{0:?} is not a valid TLS server name")]
    Domain(String),
    /// The TLS handshake failed (the peer's certificate is not trusted, no common protocol
    /// or ALPN, the peer closed, ...).
    #[error("TLS handshake")]
    Handshake(#[source] std::io::Error),
}

impl TlsError {
    /// The gRPC code of a link set-up that failed with this error: the config's own mistakes
    /// (a PEM file unreadable or not PEM, no certificate or key in it, material rustls
    /// refuses, a bad client CA, no server identity, a domain that is no server name) are
    /// INVALID_ARGUMENT, so that retries and wait-for-ready do not repeat a typo for ever; a
    /// failed handshake is UNAVAILABLE (the peer, or the network, may do better next time).
    pub(crate) fn code(&self) -> crate::Code {
        use TlsError::*;
        match self {
            Read { .. }
            | Pem { .. }
            | NoCertificate(_)
            | NoKey(_)
            | NoIdentity
            | Config(_)
            | ClientCa(_)
            | Domain(_) => crate::Code::InvalidArgument,
            Handshake(_) => crate::Code::Unavailable,
        }
    }
}

/// A certificate (chain) in PEM: CA roots to trust, or the CA of client certificates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Certificate {
    pem: Pem,
}

impl Certificate {
    /// From PEM text holding one or more certificates.
    pub fn from_pem(pem: impl AsRef<[u8]>) -> Certificate {
        Certificate {
            pem: Pem::bytes(pem),
        }
    }

    /// From a PEM file, read when a config is built and again after it changes on disk
    /// (module docs).
    pub fn from_pem_file(path: impl AsRef<Path>) -> Certificate {
        Certificate {
            pem: Pem::file(path),
        }
    }
}

/// A certificate chain (leaf first) and its private key, in PEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    cert: Pem,
    key: Pem,
}

impl Identity {
    /// From PEM text: the certificate chain and the private key (PKCS#8, PKCS#1 or SEC1).
    pub fn from_pem(cert: impl AsRef<[u8]>, key: impl AsRef<[u8]>) -> Identity {
        Identity {
            cert: Pem::bytes(cert),
            key: Pem::bytes(key),
        }
    }

    /// From PEM files, read when a config is built and again after either changes on disk
    /// (module docs).
    pub fn from_pem_files(cert: impl AsRef<Path>, key: impl AsRef<Path>) -> Identity {
        Identity {
            cert: Pem::file(cert),
            key: Pem::file(key),
        }
    }

    fn load(
        &self,
    ) -> Result<
        (
            Vec<rustls_pki_types::CertificateDer<'static>>,
            rustls_pki_types::PrivateKeyDer<'static>,
        ),
        TlsError,
    > {
        Ok((self.cert.certs()?, self.key.key()?))
    }
}

/// TLS settings of a server, as tonic's `ServerTlsConfig`: its identity and, for mutual TLS,
/// the CA whose certificates clients must present.
///
/// Used by `byteexpress_rpc::Server::with_tls` and the facade's `ServerBuilder::tls_config`.
#[derive(Debug, Clone, Default)]
pub struct ServerTlsConfig {
    identity: Option<Identity>,
    client_ca: Option<Certificate>,
    client_auth_optional: bool,
}

impl ServerTlsConfig {
    /// No identity yet ([`ServerTlsConfig::identity`] is required), no client authentication.
    pub fn new() -> ServerTlsConfig {
        ServerTlsConfig::default()
    }

    /// The server's certificate chain and key.
    pub fn identity(mut self, identity: Identity) -> ServerTlsConfig {
        self.identity = Some(identity);
        self
    }

    /// Requires clients to present a certificate signed by `ca` (mutual TLS); a client
    /// without one fails the handshake.
    pub fn client_ca_root(mut self, ca: Certificate) -> ServerTlsConfig {
        self.client_ca = Some(ca);
        self
    }

    /// With a client CA: lets clients without a certificate through (those with one must
    /// still present a valid one). Default false.
    pub fn client_auth_optional(mut self, optional: bool) -> ServerTlsConfig {
        self.client_auth_optional = optional;
        self
    }

    /// A TLS acceptor that offers the application protocols `alpn`, in the server's
    /// preference order: rustls picks the first of `alpn` that the client also offers,
    /// whatever the client's own order (the facade passes [`ALPN_H2`], [`ALPN_BXRPC`], so a
    /// client offering both gets HTTP/2; the rpc `Server` passes [`ALPN_BXRPC`] alone).
    /// Reads the files now (call it while setting a server up, not on the runtime's hot path).
    /// Errors: no identity, or material that does not load.
    pub fn acceptor(&self, alpn: &[&[u8]]) -> Result<TlsAcceptor, TlsError> {
        TlsAcceptor::new(self.clone(), alpn.iter().map(|p| p.to_vec()).collect())
    }

    /// Whether the config reads any PEM from a file (and so may change on disk).
    fn has_files(&self) -> bool {
        let id = self.identity.iter().flat_map(|id| [&id.cert, &id.key]);
        let ca = self.client_ca.iter().map(|ca| &ca.pem);
        id.chain(ca).any(|p| p.is_file())
    }

    /// The stamps of every file the config reads (in a fixed order).
    fn stamps(&self) -> Vec<Option<pem::Stamp>> {
        let mut pems = Vec::new();
        if let Some(id) = &self.identity {
            pems.extend([&id.cert, &id.key]);
        }
        if let Some(ca) = &self.client_ca {
            pems.push(&ca.pem);
        }
        pems.iter().map(|p| p.stamp()).collect()
    }

    /// Builds the rustls config from the current PEM.
    fn build(&self, alpn: &[Vec<u8>]) -> Result<rustls::ServerConfig, TlsError> {
        let id = self.identity.as_ref().ok_or(TlsError::NoIdentity)?;
        let (chain, key) = id.load()?;
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Config)?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let roots = roots(std::slice::from_ref(ca))?;
                let v = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider(),
                );
                let v = if self.client_auth_optional {
                    v.allow_unauthenticated()
                } else {
                    v
                };
                builder.with_client_cert_verifier(v.build().map_err(TlsError::ClientCa)?)
            }
        };
        let mut cfg = builder
            .with_single_cert(chain, key)
            .map_err(TlsError::Config)?;
        cfg.alpn_protocols = alpn.to_vec();
        Ok(cfg)
    }
}

/// A root store of every certificate in `cas`. Errors: unreadable PEM, or a certificate
/// rustls cannot use as a trust anchor.
fn roots(cas: &[Certificate]) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for ca in cas {
        for c in ca.pem.certs()? {
            roots.add(c).map_err(TlsError::Config)?;
        }
    }
    Ok(roots)
}

/// Sequence of client TLS configs, for the link registry: clients share a link only when
/// they use the same config (the same value or a clone of it).
static NEXT_CLIENT_CONFIG: AtomicU64 = AtomicU64::new(1);

/// TLS settings of a client, as tonic's `ClientTlsConfig`: the CA roots to trust, the domain
/// name (SNI, and the name the server's certificate must hold; default: the host part of the
/// address dialled) and an identity for mutual TLS. Set it as [`Config::tls`](crate::Config::tls);
/// the facade's `Channel` also takes `https://host:port` URIs, which require it.
///
/// No system roots are loaded: give the CA of your servers ([`ClientTlsConfig::ca_certificate`]).
/// A replica set resolved from DNS dials IP addresses: set [`ClientTlsConfig::domain_name`]
/// to the name its certificates hold.
#[derive(Debug, Clone)]
pub struct ClientTlsConfig {
    cas: Vec<Certificate>,
    identity: Option<Identity>,
    domain: Option<String>,
    /// Which config this is, for the link registry key (changed by every setter).
    id: u64,
}

impl Default for ClientTlsConfig {
    fn default() -> Self {
        ClientTlsConfig {
            cas: Vec::new(),
            identity: None,
            domain: None,
            id: NEXT_CLIENT_CONFIG.fetch_add(1, Ordering::Relaxed),
        }
    }
}

impl PartialEq for ClientTlsConfig {
    fn eq(&self, other: &Self) -> bool {
        self.cas == other.cas && self.identity == other.identity && self.domain == other.domain
    }
}

impl ClientTlsConfig {
    /// Trusts nothing yet: add a CA ([`ClientTlsConfig::ca_certificate`]).
    pub fn new() -> ClientTlsConfig {
        ClientTlsConfig::default()
    }

    fn renumbered(mut self) -> ClientTlsConfig {
        self.id = NEXT_CLIENT_CONFIG.fetch_add(1, Ordering::Relaxed);
        self
    }

    /// Trusts the certificates in `ca` as roots (may be called more than once).
    pub fn ca_certificate(mut self, ca: Certificate) -> ClientTlsConfig {
        self.cas.push(ca);
        self.renumbered()
    }

    /// Presents `identity` to servers that ask for a client certificate (mutual TLS).
    pub fn identity(mut self, identity: Identity) -> ClientTlsConfig {
        self.identity = Some(identity);
        self.renumbered()
    }

    /// The name sent as SNI and checked against the server's certificate (a DNS name or an
    /// IP address), instead of the host of the address.
    pub fn domain_name(mut self, domain: impl Into<String>) -> ClientTlsConfig {
        self.domain = Some(domain.into());
        self.renumbered()
    }

    /// A key naming this config in the link registry (a clone has the same key).
    pub(crate) fn registry_key(&self) -> u64 {
        self.id
    }

    /// The rustls client config, from the current PEM, offering [`ALPN_BXRPC`]. Errors: no
    /// CA given ([`TlsError::NoCertificate`]: no server could be trusted), or material that
    /// does not load. Reads files: call it off the runtime ([`connect`]).
    fn build(&self) -> Result<rustls::ClientConfig, TlsError> {
        if self.cas.is_empty() {
            return Err(TlsError::NoCertificate(
                "the client's CA roots (none given: ClientTlsConfig::ca_certificate)".into(),
            ));
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Config)?
            .with_root_certificates(roots(&self.cas)?);
        let mut cfg = match &self.identity {
            None => builder.with_no_client_auth(),
            Some(id) => {
                let (chain, key) = id.load()?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(TlsError::Config)?
            }
        };
        cfg.alpn_protocols = vec![ALPN_BXRPC.to_vec()];
        Ok(cfg)
    }
}

/// `e` and its causes, `": "`-joined, for logs.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
