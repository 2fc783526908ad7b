//! Shared by the `tls_*` tests: certificates made at run time with `rcgen` (no private key is
//! committed), servers with TLS in this process, and a raw client that records what the
//! server sent back.
#![allow(dead_code)] // each test file uses a part

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use byteexpress::{Config, Identity, Server, ServerTlsConfig, TransportPref};
use byteexpress_ps::echo::EchoService;
use byteexpress_ps::{PsService, Store};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, SerialNumber,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

/// Values per key of the PS service the test servers run.
pub const DIM: usize = 8;

/// A test CA and what it signs.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate (PEM) and its key (PEM).
#[derive(Clone)]
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: Vec<u8>,
}

impl Ca {
    /// A new self-signed CA named `name`.
    pub fn new(name: &str) -> Ca {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        let issuer = CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap();
        Ca { issuer }
    }

    /// The CA certificate in PEM.
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A certificate for `localhost` and 127.0.0.1 with common name `cn` and `serial`.
    pub fn leaf(&self, cn: &str, serial: u64) -> Leaf {
        let mut p =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        p.serial_number = Some(SerialNumber::from(serial));
        let key = KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }
}

impl Leaf {
    pub fn identity(&self) -> Identity {
        Identity::from_pem(&self.cert_pem, &self.key_pem)
    }
}

/// A facade server (PS and echo services) on 127.0.0.1 with `tls`, running on this runtime.
pub async fn start_server(tls: ServerTlsConfig) -> SocketAddr {
    start_server_with(
        tls,
        Config {
            transport: TransportPref::Auto,
            ..Config::default()
        },
    )
    .await
}

/// [`start_server`] with `cfg`.
pub async fn start_server_with(tls: ServerTlsConfig, cfg: Config) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let ps = PsService::new(Arc::new(Store::new(DIM, &["emb".to_string()], 4)));
    let server = Server::builder()
        .config(cfg)
        .tls_config(tls)
        .expect("TLS config loads")
        .add_service(ps.server())
        .add_service(EchoService::default().server());
    tokio::spawn(server.serve_with_listener(listener));
    addr
}

/// A rustls client config trusting `ca_pem` (none: an empty root store), presenting
/// `identity` when given, offering ALPN `bxrpc/1`.
pub fn rustls_client(ca_pem: Option<&str>, identity: Option<&Leaf>) -> rustls::ClientConfig {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    if let Some(pem) = ca_pem {
        for c in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
    }
    let b = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let mut cfg = match identity {
        None => b.with_no_client_auth(),
        Some(l) => b
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(l.cert_pem.as_bytes())
                    .map(|c| c.unwrap())
                    .collect(),
                PrivateKeyDer::from_pem_slice(l.key_pem.as_bytes()).unwrap(),
            )
            .unwrap(),
    };
    cfg.alpn_protocols = vec![byteexpress::ALPN_BXRPC.to_vec()];
    cfg
}

/// A TCP stream that records every byte read from it (what the server sent, as it came).
pub struct Recorded {
    inner: TcpStream,
    pub seen: Arc<Mutex<Vec<u8>>>,
}

impl Recorded {
    pub async fn connect(addr: SocketAddr) -> Recorded {
        Recorded {
            inner: TcpStream::connect(addr).await.unwrap(),
            seen: Arc::default(),
        }
    }
}

impl AsyncRead for Recorded {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        this.seen
            .lock()
            .unwrap()
            .extend_from_slice(&buf.filled()[before..]);
        r
    }
}

impl AsyncWrite for Recorded {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// The preface and a HELLO frame (transport auto, no devices), as a ByteExpress client
/// opens its link.
pub fn preface_and_hello() -> Vec<u8> {
    use byteexpress_rpc::wire::hello::{HELLO_VERSION, Hello};
    let hello = Hello::Hello {
        version: HELLO_VERSION,
        pref: TransportPref::Auto,
        nonce: 7,
        stream_window: 1 << 20,
        devices: Vec::new(),
    }
    .encode();
    let mut out = byteexpress_rpc::CONN_MAGIC.to_vec();
    out.extend_from_slice(&(hello.len() as u32).to_be_bytes());
    out.extend_from_slice(&hello);
    out
}

/// Hang guard of the reads below (never a time assertion).
pub const HANG_GUARD: Duration = Duration::from_secs(20);

/// Reads `s` to its end (or its first error), returning what it yielded.
pub async fn read_to_end(s: &mut (impl AsyncRead + Unpin)) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(HANG_GUARD, s.read(&mut buf))
            .await
            .expect("hang guard: the server neither answered nor closed")
        {
            Ok(0) | Err(_) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// Reads one frame (4-byte big-endian length, payload) from `s`.
pub async fn read_frame(s: &mut (impl AsyncRead + Unpin)) -> Vec<u8> {
    let mut len = [0u8; 4];
    tokio::time::timeout(HANG_GUARD, s.read_exact(&mut len))
        .await
        .expect("hang guard")
        .expect("frame length");
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    tokio::time::timeout(HANG_GUARD, s.read_exact(&mut body))
        .await
        .expect("hang guard")
        .expect("frame body");
    body
}

/// Writes all of `b`, ignoring a peer that already closed.
pub async fn write_ignoring_close(s: &mut (impl AsyncWrite + Unpin), b: &[u8]) {
    let _ = s.write_all(b).await;
    let _ = s.flush().await;
}

/// Whether `needle` occurs in `hay`.
pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}
