//! Issue 24: a TLS port serves every kind of client: tonic's own TLS client and Python
//! `grpcio` with TLS credentials over HTTP/2 (ALPN `h2`), and `byteexpress::Channel` with
//! `https://` and `Config::tls` over ByteExpress (ALPN `bxrpc/1`), which still negotiates RDMA
//! (the soft device here) or TCP; and the native rpc server and client with TLS.

mod tls_common;

use std::path::Path;
use std::process::Command;

use byteexpress::{
    Certificate, Channel, ClientTlsConfig, Config, ServerTlsConfig, Transport, TransportPref,
};
use byteexpress_ps::pb::echo::EchoRequest;
use byteexpress_ps::pb::echo::echo_client::EchoClient;
use byteexpress_ps::pb::ps::PullRequest;
use byteexpress_ps::pb::ps::parameter_server_client::ParameterServerClient;
use byteexpress_ps::{decode_f32s, init_value};
use bytes::Bytes;
use integration_tests::grpcio::{self, run};
use integration_tests::rdma_here;
use tls_common::*;

fn client_tls(ca: &Ca) -> ClientTlsConfig {
    ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca.pem()))
        .domain_name("localhost")
}

/// Pulls keys 1..=3 and checks every value against the deterministic init.
async fn pull_checks<T>(mut client: ParameterServerClient<T>)
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let keys = vec![1u64, 2, 3];
    let r = client
        .pull(PullRequest {
            table: "emb".into(),
            keys: keys.clone(),
        })
        .await
        .expect("pull")
        .into_inner();
    let vals = decode_f32s(&r.values);
    assert_eq!(vals.len(), keys.len() * DIM);
    for (j, k) in keys.iter().enumerate() {
        for i in 0..DIM {
            assert_eq!(
                vals[j * DIM + i],
                init_value("emb", *k, i as u32),
                "key {k} value {i}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tonic_tls_client_calls_the_ps_service_over_http2_on_a_tls_port() {
    let ca = Ca::new("test CA");
    let addr = start_server(ServerTlsConfig::new().identity(ca.leaf("server", 1).identity())).await;
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ca.pem()))
        .domain_name("localhost");
    let ch = tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .expect("tonic TLS connect");
    pull_checks(ParameterServerClient::new(ch.clone())).await;
    let resp = EchoClient::new(ch)
        .echo(EchoRequest {
            payload: Bytes::from_static(b"over h2+tls"),
        })
        .await
        .expect("echo");
    assert_eq!(resp.metadata().get("x-served-over").unwrap(), "h2");

    // a tonic client that does not trust the CA is refused
    let stranger = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(
            Ca::new("another CA").pem(),
        ))
        .domain_name("localhost");
    let refused = tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(stranger)
        .unwrap()
        .connect()
        .await;
    assert!(refused.is_err(), "an untrusted server was accepted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channel_with_tls_negotiates_rdma_and_tcp_and_echoes() {
    let ca = Ca::new("test CA");
    let addr = start_server(ServerTlsConfig::new().identity(ca.leaf("server", 1).identity())).await;
    for (pref, want, served) in [
        (TransportPref::Rdma, rdma_here(), "rdma"),
        (TransportPref::Tcp, Transport::Tcp, "tcp"),
    ] {
        let cfg = Config {
            transport: pref,
            allow_soft: true,
            tls: Some(client_tls(&ca)),
            ..Config::default()
        };
        let ch = Channel::connect_with(&format!("https://{addr}"), &cfg)
            .await
            .expect("bx TLS connect");
        assert_eq!(ch.transport(), want, "negotiated transport");
        let mut echo = EchoClient::new(ch.clone());
        for n in [0usize, 1, 1000, 200_000] {
            let payload = Bytes::from(vec![n as u8; n]);
            let resp = echo
                .echo(EchoRequest {
                    payload: payload.clone(),
                })
                .await
                .expect("echo");
            assert_eq!(resp.metadata().get("x-served-over").unwrap(), served);
            assert_eq!(resp.into_inner().payload, payload, "{pref:?} {n} bytes");
        }
        pull_checks(ParameterServerClient::new(ch)).await;
    }

    // without TLS (plain bx://) the TLS port refuses the link
    let plain = Channel::connect_with(
        &format!("bx://{addr}"),
        &Config {
            transport: TransportPref::Tcp,
            ..Config::default()
        },
    )
    .await;
    assert!(plain.is_err(), "a plain client set up a link on a TLS port");
    // https:// without a TLS config is refused before any connection
    let e = Channel::connect_with(&format!("https://{addr}"), &Config::default())
        .await
        .unwrap_err();
    assert_eq!(e.code, byteexpress::Code::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_channel_with_its_certificate_is_served_and_one_without_is_refused() {
    let ca = Ca::new("test CA");
    let client_ca = Ca::new("client CA");
    let addr = start_server(
        ServerTlsConfig::new()
            .identity(ca.leaf("server", 1).identity())
            .client_ca_root(Certificate::from_pem(client_ca.pem())),
    )
    .await;
    let with = Config {
        transport: TransportPref::Tcp,
        tls: Some(client_tls(&ca).identity(client_ca.leaf("client", 2).identity())),
        ..Config::default()
    };
    let ch = Channel::connect_with(&format!("https://{addr}"), &with)
        .await
        .expect("mTLS connect");
    let resp = EchoClient::new(ch)
        .echo(EchoRequest {
            payload: Bytes::from_static(b"mtls"),
        })
        .await
        .expect("echo");
    assert_eq!(resp.into_inner().payload, Bytes::from_static(b"mtls"));

    let without = Config {
        transport: TransportPref::Tcp,
        tls: Some(client_tls(&ca)),
        ..Config::default()
    };
    let e = Channel::connect_with(&format!("https://{addr}"), &without)
        .await
        .expect_err("a client without a certificate set up a link");
    assert_eq!(e.code, byteexpress::Code::Unavailable, "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_rpc_server_and_client_with_tls_run_calls_over_rdma_and_tcp() {
    let ca = Ca::new("test CA");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = byteexpress_rpc::Server::new(integration_tests::test_service, Config::default())
        .with_tls(ServerTlsConfig::new().identity(ca.leaf("server", 1).identity()))
        .expect("TLS config loads");
    tokio::spawn(server.serve(listener));
    for (pref, want) in [
        (TransportPref::Rdma, rdma_here()),
        (TransportPref::Tcp, Transport::Tcp),
    ] {
        let cfg = Config {
            transport: pref,
            allow_soft: true,
            tls: Some(client_tls(&ca)),
            ..Config::default()
        };
        let client = byteexpress_rpc::Client::connect_unshared(&addr, &cfg)
            .await
            .expect("native TLS connect");
        assert_eq!(client.transport(), want);
        let body = Bytes::from(vec![7u8; 100_000]);
        let resp = client
            .call(byteexpress_rpc::Request {
                method: "/test.Test/Echo".into(),
                body: body.clone(),
                ..Default::default()
            })
            .await
            .expect("echo");
        assert_eq!(resp.body, body);
    }
}

/// Python grpcio with TLS credentials (the test CA as root) pulls from the TLS port.
const PY_TLS_CLIENT: &str = r#"
import sys
import grpc
import ps_pb2, ps_pb2_grpc

addr, dim, ca = sys.argv[1], int(sys.argv[2]), open(sys.argv[3], "rb").read()
creds = grpc.ssl_channel_credentials(root_certificates=ca)
with grpc.secure_channel(addr, creds, options=[("grpc.ssl_target_name_override", "localhost")]) as ch:
    stub = ps_pb2_grpc.ParameterServerStub(ch)
    r = stub.Pull(ps_pb2.PullRequest(table="emb", keys=[1, 2, 3]), timeout=10)
    assert r.dim == dim, (r.dim, dim)
    assert len(r.values) == 3 * dim * 4, len(r.values)
print("PYTHON TLS OK")
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_grpcio_with_tls_credentials_pulls_from_a_tls_port() {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("grpcio-venv");
    let Some(python) = tokio::task::spawn_blocking(move || grpcio::venv_or_skip(&venv))
        .await
        .unwrap()
    else {
        return;
    };
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("grpcio-tls-stubs");
    grpcio::ps_stubs(&python, &out).expect("generate Python stubs");
    std::fs::write(out.join("tls_client.py"), PY_TLS_CLIENT).unwrap();
    let ca = Ca::new("test CA");
    std::fs::write(out.join("ca.pem"), ca.pem()).unwrap();
    let addr = start_server(ServerTlsConfig::new().identity(ca.leaf("server", 1).identity())).await;
    let text = tokio::task::spawn_blocking(move || {
        run(Command::new(&python)
            .arg(out.join("tls_client.py"))
            .arg(addr.to_string())
            .arg(DIM.to_string())
            .arg(out.join("ca.pem"))
            .current_dir(&out))
    })
    .await
    .unwrap()
    .unwrap_or_else(|e| panic!("python TLS client: {e}"));
    assert!(text.contains("PYTHON TLS OK"), "{text}");
}
