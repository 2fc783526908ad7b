//! Issue "tonic facade": tonic-generated clients and services over ByteExpress (soft RDMA and
//! TCP) and over HTTP/2 on the same port, against `bx ps serve` in a separate process; and a
//! gRPC client that is not ours (Python `grpcio`).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use byteexpress::{Channel, Config, Transport, TransportPref};
use byteexpress_ps::pb::echo::echo_client::EchoClient;
use byteexpress_ps::pb::echo::{
    EchoRequest, FailRequest, SleepRequest, StatsRequest, StatsResponse,
};
use byteexpress_ps::pb::ps::parameter_server_client::ParameterServerClient;
use byteexpress_ps::pb::ps::{PullRequest, PushRequest};
use byteexpress_ps::{decode_f32s, init_value};
use bytes::Bytes;
use integration_tests::grpcio::{self, run};
use integration_tests::{ServerProc, rdma_here};
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Request};

/// The `bx` command line built as a binary of this package (see `src/bin/bx-facade.rs` for why
/// not `target/<profile>/bx`).
const BX: &str = env!("CARGO_BIN_EXE_bx-facade");
const DIM: usize = 16;

/// The three ways to reach the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path3 {
    BxRdma,
    BxTcp,
    H2,
}

const ALL: [Path3; 3] = [Path3::BxRdma, Path3::BxTcp, Path3::H2];

/// A client of either channel type for one service.
enum Either<A, B> {
    Bx(A),
    H2(B),
}

async fn start() -> ServerProc {
    ServerProc::start(
        BX,
        &[
            "ps",
            "serve",
            "--addr",
            "127.0.0.1:0",
            "--dim",
            &DIM.to_string(),
        ],
    )
    .await
}

/// Connects over `path`, asserting the negotiated transport.
async fn channel(addr: &str, path: Path3) -> Either<Channel, tonic::transport::Channel> {
    let bx = |t| async move {
        let ch = Channel::connect_with(
            &format!("bx://{addr}"),
            &Config {
                transport: t,
                ..Config::default()
            },
        )
        .await
        .expect("bx connect");
        Either::Bx(ch)
    };
    match path {
        Path3::BxRdma => {
            let ch = bx(TransportPref::Rdma).await;
            if let Either::Bx(c) = &ch {
                assert_eq!(
                    c.transport(),
                    rdma_here(),
                    "negotiated transport and device"
                );
            }
            ch
        }
        Path3::BxTcp => {
            let ch = bx(TransportPref::Tcp).await;
            if let Either::Bx(c) = &ch {
                assert_eq!(c.transport(), Transport::Tcp, "negotiated transport");
            }
            ch
        }
        Path3::H2 => Either::H2(
            tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect()
                .await
                .expect("h2 connect"),
        ),
    }
}

/// What the server reports as the protocol of a call made over `path`.
fn served_as(path: Path3) -> &'static str {
    match path {
        Path3::BxRdma => "rdma",
        Path3::BxTcp => "tcp",
        Path3::H2 => "h2",
    }
}

type Echo = Either<EchoClient<Channel>, EchoClient<tonic::transport::Channel>>;
type Ps = Either<ParameterServerClient<Channel>, ParameterServerClient<tonic::transport::Channel>>;

async fn echo_client(addr: &str, path: Path3) -> Echo {
    match channel(addr, path).await {
        Either::Bx(c) => Either::Bx(EchoClient::new(c)),
        Either::H2(c) => Either::H2(EchoClient::new(c)),
    }
}

async fn ps_client(addr: &str, path: Path3) -> Ps {
    match channel(addr, path).await {
        Either::Bx(c) => Either::Bx(ParameterServerClient::new(c)),
        Either::H2(c) => Either::H2(ParameterServerClient::new(c)),
    }
}

/// Dispatches one generated-client method call to whichever client `$c` holds.
macro_rules! call {
    ($c:expr, $method:ident, $req:expr) => {
        match &mut $c {
            Either::Bx(c) => c.$method($req).await,
            Either::H2(c) => c.$method($req).await,
        }
    };
}

fn metadata(req_id: &str) -> MetadataMap {
    let mut md = MetadataMap::new();
    md.insert("x-req-id", req_id.parse().unwrap());
    md.insert_bin(
        "blob-bin",
        MetadataValue::from_bytes(&[0u8, 1, 0xfe, 0xff, b'\n']),
    );
    md
}

fn with_md<T>(msg: T, md: MetadataMap) -> Request<T> {
    let mut r = Request::new(msg);
    *r.metadata_mut() = md;
    r
}

fn f32_bytes(v: &[f32]) -> Bytes {
    v.iter()
        .flat_map(|x| x.to_le_bytes())
        .collect::<Vec<u8>>()
        .into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_and_parameter_server_answer_identically_over_rdma_tcp_and_h2() {
    let server = start().await;
    let payload: Bytes = (0..20_000u32)
        .map(|i| (i * 31 % 251) as u8)
        .collect::<Vec<u8>>()
        .into();
    let keys = vec![0u64, 1, 77, 123_456, u64::MAX];

    // one push (over RDMA) to key 77, seen by every path afterwards
    let mut ps = ps_client(&server.addr, Path3::BxRdma).await;
    let grads: Vec<f32> = (0..DIM).map(|i| i as f32 * 0.5).collect();
    call!(
        ps,
        push,
        PushRequest {
            table: "emb".into(),
            keys: vec![77],
            grads: f32_bytes(&grads),
            lr: 0.25
        }
    )
    .expect("push");
    let mut want = Vec::new();
    for &k in &keys {
        for (i, g) in grads.iter().enumerate().take(DIM) {
            let init = init_value("emb", k, i as u32);
            want.push(if k == 77 { init - 0.25 * g } else { init });
        }
    }

    for path in ALL {
        let mut echo = echo_client(&server.addr, path).await;
        let resp = call!(
            echo,
            echo,
            with_md(
                EchoRequest {
                    payload: payload.clone()
                },
                metadata("e1")
            )
        )
        .unwrap_or_else(|s| panic!("{path:?}: echo: {s:?}"));
        assert_eq!(
            resp.metadata().get("x-served-over").unwrap(),
            served_as(path),
            "{path:?}: server-side protocol"
        );
        assert_eq!(
            resp.metadata().get("x-req-id").unwrap(),
            "e1",
            "{path:?}: ascii metadata echoed"
        );
        assert_eq!(
            resp.metadata()
                .get_bin("blob-bin")
                .unwrap()
                .to_bytes()
                .unwrap(),
            &[0u8, 1, 0xfe, 0xff, b'\n'][..],
            "{path:?}: binary metadata echoed"
        );
        assert_eq!(resp.into_inner().payload, payload, "{path:?}: payload");

        let mut ps = ps_client(&server.addr, path).await;
        let pulled = call!(
            ps,
            pull,
            PullRequest {
                table: "emb".into(),
                keys: keys.clone()
            }
        )
        .unwrap_or_else(|s| panic!("{path:?}: pull: {s:?}"))
        .into_inner();
        assert_eq!(pulled.dim as usize, DIM, "{path:?}: dim");
        assert_eq!(decode_f32s(&pulled.values), want, "{path:?}: pulled values");
        eprintln!("{path:?}: echo and pull answered as expected");
    }
}

async fn stats(echo: &mut Echo) -> StatsResponse {
    call!(*echo, stats, StatsRequest {})
        .expect("stats")
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_timeout_gives_deadline_exceeded_and_cancels_the_server_handler() {
    let server = start().await;
    let mut probe = echo_client(&server.addr, Path3::BxTcp).await;
    for path in ALL {
        let before = stats(&mut probe).await;
        let mut echo = echo_client(&server.addr, path).await;
        let mut req = Request::new(SleepRequest { millis: 10_000 });
        req.set_timeout(Duration::from_millis(200)); // sent as the grpc-timeout header
        let t0 = Instant::now();
        let err = call!(echo, sleep, req).expect_err("a 10 s sleep within 200 ms");
        let took = t0.elapsed();
        if path == Path3::H2 {
            // tonic's own HTTP/2 channel has a client-side timer that reports its own expiry as
            // CANCELLED "Timeout expired"; the server's DEADLINE_EXCEEDED may win the race
            assert!(
                matches!(err.code(), Code::DeadlineExceeded | Code::Cancelled),
                "{path:?}: {err:?}"
            );
        } else {
            assert_eq!(err.code(), Code::DeadlineExceeded, "{path:?}: {err:?}");
        }
        assert!(
            took < Duration::from_secs(3),
            "{path:?}: gave up after {took:?}"
        );
        // the server dropped the handler: cancelled goes up by one, finished does not
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            let now = stats(&mut probe).await;
            if now.cancelled == before.cancelled + 1 {
                assert_eq!(now.finished, before.finished, "{path:?}");
                break;
            }
            assert!(
                Instant::now() < until,
                "{path:?}: handler not cancelled: {before:?} -> {now:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // a call within its deadline still finishes
        let mut ok = Request::new(SleepRequest { millis: 10 });
        ok.set_timeout(Duration::from_secs(5));
        call!(echo, sleep, ok).unwrap_or_else(|s| panic!("{path:?}: short sleep: {s:?}"));
        eprintln!("{path:?}: DEADLINE_EXCEEDED after {took:?}, handler cancelled");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_status_message_and_metadata_survive_both_ways() {
    let server = start().await;
    let message = "precondition failed: 100% sure ✗\nsecond line";
    for path in ALL {
        let mut echo = echo_client(&server.addr, path).await;
        // client → server metadata comes back in the error's metadata (server → client)
        let err = call!(
            echo,
            fail,
            with_md(
                FailRequest {
                    code: Code::FailedPrecondition as i32,
                    message: message.into()
                },
                metadata("f1")
            )
        )
        .expect_err("Fail fails");
        assert_eq!(err.code(), Code::FailedPrecondition, "{path:?}: {err:?}");
        assert_eq!(err.message(), message, "{path:?}: message");
        assert_eq!(
            err.metadata().get("x-req-id").unwrap(),
            "f1",
            "{path:?}: ascii metadata"
        );
        assert_eq!(
            err.metadata()
                .get_bin("blob-bin")
                .unwrap()
                .to_bytes()
                .unwrap(),
            &[0u8, 1, 0xfe, 0xff, b'\n'][..],
            "{path:?}: binary metadata"
        );

        let err = call!(
            echo,
            fail,
            FailRequest {
                code: 999,
                message: String::new()
            }
        )
        .expect_err("Fail fails");
        assert_eq!(err.code(), Code::Unknown, "{path:?}: out-of-range code");

        // bad input to the parameter server is INVALID_ARGUMENT, and the server lives on
        let mut ps = ps_client(&server.addr, path).await;
        let err = call!(
            ps,
            push,
            PushRequest {
                table: "emb".into(),
                keys: vec![1, 2],
                grads: Bytes::from_static(&[0; 12]),
                lr: 1.0
            }
        )
        .expect_err("short grads");
        assert_eq!(err.code(), Code::InvalidArgument, "{path:?}: {err:?}");
        assert!(
            err.message().contains("grads"),
            "{path:?}: {}",
            err.message()
        );
        let err = call!(
            ps,
            pull,
            PullRequest {
                table: "nope".into(),
                keys: vec![1]
            }
        )
        .expect_err("unknown table");
        assert_eq!(err.code(), Code::InvalidArgument, "{path:?}: {err:?}");
        call!(
            ps,
            pull,
            PullRequest {
                table: "emb".into(),
                keys: vec![1]
            }
        )
        .unwrap_or_else(|s| panic!("{path:?}: pull after errors: {s:?}"));
    }

    // a path no service serves, and a body that is not protobuf, over ByteExpress
    for t in [TransportPref::Rdma, TransportPref::Tcp] {
        let client = byteexpress_rpc::Client::connect(
            &server.addr,
            &Config {
                transport: t,
                ..Config::default()
            },
        )
        .await
        .unwrap();
        let call = |method: &str, body: &'static [u8]| byteexpress_rpc::Request {
            method: method.into(),
            metadata: Default::default(),
            body: Bytes::from_static(body),
            timeout: Some(Duration::from_secs(5)),
        };
        let err = client.call(call("/nope.Nope/X", b"")).await.unwrap_err();
        assert_eq!(
            err.code,
            byteexpress_rpc::Code::Unimplemented,
            "{t:?}: {err}"
        );
        let err = client
            .call(call(
                "/ps.ParameterServer/Pull",
                b"\x00\x00\x00\x00\x09garbage!!",
            ))
            .await
            .unwrap_err();
        assert_eq!(
            err.code,
            byteexpress_rpc::Code::Internal,
            "{t:?}: garbage body: {err}"
        );
        let err = client
            .call(call("/ps.ParameterServer/Pull", b"\x00\x00\x00"))
            .await
            .unwrap_err();
        assert_eq!(
            err.code,
            byteexpress_rpc::Code::Internal,
            "{t:?}: truncated frame: {err}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// A gRPC client that is not ours: Python grpcio.

/// The Python client: pulls keys (including ones at the ends of the u64 range) and checks every
/// value against the deterministic init computed in Python; checks an unknown table is
/// INVALID_ARGUMENT. Prints `PYTHON OK <n>` when all is well.
const PY_CLIENT: &str = r#"
import struct, sys
import grpc
import ps_pb2, ps_pb2_grpc

M = (1 << 64) - 1
def splitmix64(x):
    z = (x + 0x9E3779B97F4A7C15) & M
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
    return z ^ (z >> 31)
def fnv1a64(b):
    h = 0xCBF29CE484222325
    for c in b:
        h = ((h ^ c) * 0x100000001B3) & M
    return h
def init_value(table, key, i):
    base = splitmix64(fnv1a64(table.encode()) ^ key)
    u = splitmix64((base + i) & M) >> 40
    return (u - (1 << 23)) / float(1 << 27)

addr, dim = sys.argv[1], int(sys.argv[2])
keys = [0, 1, 2, 4242, 999_999, (1 << 63) + 5, M]
with grpc.insecure_channel(addr) as ch:
    stub = ps_pb2_grpc.ParameterServerStub(ch)
    r = stub.Pull(ps_pb2.PullRequest(table="emb", keys=keys), timeout=10)
    assert r.dim == dim, (r.dim, dim)
    vals = struct.unpack("<%df" % (len(keys) * dim), r.values)
    for j, k in enumerate(keys):
        for i in range(dim):
            want = init_value("emb", k, i)
            assert vals[j * dim + i] == want, (k, i, vals[j * dim + i], want)
    try:
        stub.Pull(ps_pb2.PullRequest(table="nope", keys=[1]), timeout=10)
        raise SystemExit("unknown table was accepted")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
print("PYTHON OK", len(vals))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_grpcio_client_pulls_over_http2_on_the_same_port() {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("grpcio-venv");
    let Some(python) = tokio::task::spawn_blocking(move || grpcio::venv_or_skip(&venv))
        .await
        .unwrap()
    else {
        return;
    };
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("grpcio-stubs");
    grpcio::ps_stubs(&python, &out).expect("generate Python stubs");
    std::fs::write(out.join("client.py"), PY_CLIENT).unwrap();

    let server = start().await;
    let addr = server.addr.clone();
    let result = tokio::task::spawn_blocking(move || {
        run(Command::new(&python)
            .arg(out.join("client.py"))
            .arg(&addr)
            .arg(DIM.to_string())
            .current_dir(&out))
    })
    .await
    .unwrap();
    let text = result.unwrap_or_else(|e| panic!("python client: {e}"));
    assert!(text.contains("PYTHON OK"), "{text}");
    eprintln!("{}", text.trim());
}
