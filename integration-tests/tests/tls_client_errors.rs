//! Issue 24 review: how a `Channel` with TLS fails. A mistake in its own TLS config (a CA
//! file that does not exist) is INVALID_ARGUMENT, so retries do not repeat it for ever; a
//! server whose certificate does not name the domain asked for is refused even though its CA
//! is trusted (the hostname check is on).

mod tls_common;

use byteexpress::{Certificate, Channel, ClientTlsConfig, Code, Config, TransportPref};
use tls_common::*;

fn tcp_with(tls: ClientTlsConfig) -> Config {
    Config {
        transport: TransportPref::Tcp,
        tls: Some(tls),
        ..Config::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_file_that_does_not_exist_is_invalid_argument() {
    let ca = Ca::new("test CA");
    let addr =
        start_server(byteexpress::ServerTlsConfig::new().identity(ca.leaf("server", 1).identity()))
            .await;
    let missing = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("no-such-ca-{}.pem", std::process::id()));
    let cfg = tcp_with(
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem_file(&missing))
            .domain_name("localhost"),
    );
    let e = tokio::time::timeout(
        HANG_GUARD,
        Channel::connect_with(&format!("https://{addr}"), &cfg),
    )
    .await
    .expect("hang guard")
    .expect_err("connected without a CA file");
    assert_eq!(e.code, Code::InvalidArgument, "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_certificate_names_another_domain_is_refused_though_its_ca_is_trusted() {
    let ca = Ca::new("test CA");
    // the server's certificate names localhost and 127.0.0.1 only
    let addr =
        start_server(byteexpress::ServerTlsConfig::new().identity(ca.leaf("server", 1).identity()))
            .await;
    let trusted = || ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca.pem()));
    // the positive control: the right name is served
    Channel::connect_with(
        &format!("https://{addr}"),
        &tcp_with(trusted().domain_name("localhost")),
    )
    .await
    .expect("the certificate's own name");
    let e = Channel::connect_with(
        &format!("https://{addr}"),
        &tcp_with(trusted().domain_name("other.example")),
    )
    .await
    .expect_err("a certificate for localhost accepted as other.example");
    assert_eq!(e.code, Code::Unavailable, "{e:?}");
}
