//! The facade's server and channel in one process: both protocols on one listener, and
//! `serve_with_listener_shutdown` returning once its signal fires.

use std::time::Duration;

use byteexpress::{Channel, Config, Server, Transport, TransportPref};
use byteexpress_ps::echo::EchoService;
use byteexpress_ps::pb::echo::EchoRequest;
use byteexpress_ps::pb::echo::echo_client::EchoClient;
use bytes::Bytes;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_listener_serves_bytexpress_and_http2_then_shuts_down() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        Server::builder()
            .config(Config {
                transport: TransportPref::Auto,
                ..Config::default()
            })
            .add_service(EchoService::default().server())
            .serve_with_listener_shutdown(listener, async move {
                let _ = stop_rx.await;
            }),
    );

    let payload = Bytes::from_static(b"in-process");
    {
        let ch = Channel::connect_with(
            &format!("bx://{addr}"),
            &Config {
                transport: TransportPref::Tcp,
                ..Config::default()
            },
        )
        .await
        .expect("bx connect");
        assert_eq!(ch.transport(), Transport::Tcp);
        let resp = EchoClient::new(ch)
            .echo(EchoRequest {
                payload: payload.clone(),
            })
            .await
            .expect("bx echo");
        assert_eq!(resp.metadata().get("x-served-over").unwrap(), "tcp");
        assert_eq!(resp.into_inner().payload, payload);

        let h2 = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .expect("h2 connect");
        let resp = EchoClient::new(h2)
            .echo(EchoRequest {
                payload: payload.clone(),
            })
            .await
            .expect("h2 echo");
        assert_eq!(resp.metadata().get("x-served-over").unwrap(), "h2");
        assert_eq!(resp.into_inner().payload, payload);
    }

    stop_tx.send(()).unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("server stops after its signal");
    ended.expect("server task").expect("server result");
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "listener closed after shutdown"
    );
}

#[tokio::test]
async fn bad_uris_are_invalid_argument() {
    for uri in ["http://127.0.0.1:1", "bx://nohost", "127.0.0.1:1"] {
        let err = Channel::connect(uri).await.unwrap_err();
        assert_eq!(err.code, byteexpress::Code::InvalidArgument, "{uri}");
    }
}
