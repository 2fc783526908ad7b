//! The client side of the handshake.

use std::sync::Arc;

use rustls_pki_types::ServerName;
use tokio::net::TcpStream;

use super::{ClientTlsConfig, TlsError};
use crate::link_io::LinkStream;

/// The host part of `addr` (`host:port`, `[v6]:port`).
fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// Runs the client side of the handshake on `tcp`, connected to `addr`, with `cfg` (its PEM
/// read now, on a blocking thread: a slow or stuck file costs this set-up, which its caller
/// bounds, never a runtime worker): SNI and the certificate check use `cfg`'s domain name, else the host of
/// `addr`. The caller bounds it in time. Errors: config material that does not load, a
/// domain that is no server name, or [`TlsError::Handshake`] (the server's certificate is
/// untrusted or names another host, the server refused our certificate or ALPN, ...).
pub(crate) async fn connect(
    cfg: &ClientTlsConfig,
    addr: &str,
    tcp: TcpStream,
) -> Result<LinkStream, TlsError> {
    let domain = cfg.domain.as_deref().unwrap_or_else(|| host_of(addr));
    let name =
        ServerName::try_from(domain.to_string()).map_err(|_| TlsError::Domain(domain.into()))?;
    let build = {
        let cfg = cfg.clone();
        tokio::task::spawn_blocking(move || cfg.build())
    };
    let rustls = build.await.map_err(|e| {
        TlsError::Handshake(std::io::Error::other(format!(
            "reading the TLS files did not finish: {e}"
        )))
    })??;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(rustls));
    let tls = connector
        .connect(name, tcp)
        .await
        .map_err(TlsError::Handshake)?;
    Ok(LinkStream::from(tokio_rustls::TlsStream::Client(tls)))
}

#[cfg(test)]
mod tests {
    use super::host_of;

    #[test]
    fn the_default_server_name_is_the_host_of_the_address() {
        assert_eq!(host_of("localhost:7000"), "localhost");
        assert_eq!(host_of("10.0.0.2:1"), "10.0.0.2");
        assert_eq!(host_of("[::1]:7000"), "::1");
    }
}
