//! The parameter server with faults, for the retry and hedging tests (issue 19): the
//! `ps.ParameterServer` tonic service of `byteexpress-ps` behind the facade's
//! `byteexpress::Server` (ByteExpress and HTTP/2 on one port), with
//! `bx-test-ps [--id NAME] [--log FILE] [--fail-first N] [--pushback-ms V] [--stall]
//! [--delay-ms N] [--drain]`.
//! Listens on 127.0.0.1 (ephemeral port) and prints `LISTENING <addr>`.
//! - `--fail-first N`: the first N handlers (Pull or Push) answer UNAVAILABLE (the later ones
//!   run);
//! - `--pushback-ms V`: those failures carry trailer `grpc-retry-pushback-ms: V` (as given);
//! - `--stall`: Pull handlers never answer (a stalled replica); they end only when cancelled;
//! - `--delay-ms N`: every handler answers N ms late;
//! - `--drain`: the server drains from the start (`byteexpress::Drain`): every call is
//!   refused before dispatch;
//! - `--log FILE`: every handler appends lines to FILE, one `write(2)` each (O_APPEND), so the
//!   records of a process killed with SIGKILL survive it:
//!   `start <server id> <method> <x-request-id> <grpc-previous-rpc-attempts or ->` when it
//!   starts, and `end <server id> <method> <x-request-id> ok|failed|cancelled` when it
//!   answers or is dropped unfinished (cancelled).

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use byteexpress::{Config, Server};
use byteexpress_ps::pb::ps::parameter_server_server::{ParameterServer, ParameterServerServer};
use byteexpress_ps::pb::ps::{PullRequest, PullResponse, PushRequest, PushResponse};
use byteexpress_ps::{PsService, Store};
use tonic::{Request, Response, Status};

#[derive(Clone)]
struct Faulty {
    inner: PsService,
    id: String,
    log: Option<Arc<Mutex<std::fs::File>>>,
    fail_first: u64,
    failed: Arc<AtomicU64>,
    pushback: Option<String>,
    stall: bool,
    delay: Duration,
}

/// Logs a handler's end when dropped: `cancelled` unless [`Probe::end`] said otherwise.
struct Probe<'a> {
    s: &'a Faulty,
    method: &'static str,
    rid: String,
    outcome: &'static str,
}

impl Faulty {
    fn line(&self, text: String) {
        if let Some(f) = &self.log {
            let mut f = f.lock().unwrap_or_else(|e| e.into_inner());
            let _ = f.write_all(format!("{text}\n").as_bytes());
        }
    }

    /// UNAVAILABLE for the first `--fail-first` handlers.
    fn injected_failure(&self) -> Option<Status> {
        if self.failed.fetch_add(1, Ordering::SeqCst) >= self.fail_first {
            return None;
        }
        let mut st = Status::unavailable(format!("{}: --fail-first", self.id));
        if let Some(p) = &self.pushback
            && let Ok(v) = p.parse()
        {
            st.metadata_mut().insert("grpc-retry-pushback-ms", v);
        }
        Some(st)
    }

    fn start<T>(&self, method: &'static str, req: &Request<T>) -> Probe<'_> {
        let get = |k: &str| {
            req.metadata()
                .get(k)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-")
                .to_string()
        };
        let rid = get("x-request-id");
        self.line(format!(
            "start {} {method} {rid} {}",
            self.id,
            get("grpc-previous-rpc-attempts")
        ));
        Probe {
            s: self,
            method,
            rid,
            outcome: "cancelled",
        }
    }
}

impl Drop for Probe<'_> {
    fn drop(&mut self) {
        self.s.line(format!(
            "end {} {} {} {}",
            self.s.id, self.method, self.rid, self.outcome
        ));
    }
}

#[tonic::async_trait]
impl ParameterServer for Faulty {
    async fn pull(&self, req: Request<PullRequest>) -> Result<Response<PullResponse>, Status> {
        let mut probe = self.start("Pull", &req);
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        if self.stall {
            std::future::pending::<()>().await;
        }
        if let Some(st) = self.injected_failure() {
            probe.outcome = "failed";
            return Err(st);
        }
        let r = self.inner.pull(req).await;
        probe.outcome = if r.is_ok() { "ok" } else { "failed" };
        r
    }

    async fn push(&self, req: Request<PushRequest>) -> Result<Response<PushResponse>, Status> {
        let mut probe = self.start("Push", &req);
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        if let Some(st) = self.injected_failure() {
            probe.outcome = "failed";
            return Err(st);
        }
        let r = self.inner.push(req).await;
        probe.outcome = if r.is_ok() { "ok" } else { "failed" };
        r
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let mut svc = Faulty {
        inner: PsService::new(Arc::new(Store::new(8, &["emb".to_string()], 4))),
        id: "ps".into(),
        log: None,
        fail_first: 0,
        failed: Arc::default(),
        pushback: None,
        stall: false,
        delay: Duration::ZERO,
    };
    let mut drain = false;
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let a = argv[i].clone();
        match a.as_str() {
            "--stall" => svc.stall = true,
            "--drain" => drain = true,
            flag => {
                let v = argv.get(i + 1).cloned().unwrap_or_default();
                i += 1;
                match flag {
                    "--id" => svc.id = v,
                    "--log" => {
                        let f = std::fs::OpenOptions::new()
                            .create(true)
                            .append(true)
                            .open(&v)?;
                        svc.log = Some(Arc::new(Mutex::new(f)));
                    }
                    "--fail-first" => svc.fail_first = v.parse().expect("--fail-first N"),
                    "--pushback-ms" => svc.pushback = Some(v),
                    "--delay-ms" => {
                        svc.delay = Duration::from_millis(v.parse().expect("--delay-ms N"))
                    }
                    other => panic!("unknown flag {other}"),
                }
            }
        }
        i += 1;
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("LISTENING {}", listener.local_addr()?);
    let builder = Server::builder()
        .config(Config::default())
        .add_service(ParameterServerServer::new(svc));
    if drain {
        builder.drain_handle().start();
    }
    builder.serve_with_listener(listener).await
}
