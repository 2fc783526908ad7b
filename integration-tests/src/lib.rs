//! Helpers of the integration tests: the test service and a handle on a server process.
//!
//! The test server (`bx-test-server`) serves:
//! - `/test.Test/Echo`: answers the request body and metadata, after the milliseconds in
//!   metadata `x-delay-ms` if set (counted after the call was logged for `Seen` and `Served`);
//!   adds `x-transport` (the link's transport as the server saw it when the call started) and `x-zero-copy` (`1` when the request body was still in
//!   a registered receive buffer, `0` when it had been copied);
//! - `/test.Test/Sleep`: sleeps for the milliseconds in its body (decimal), counting handlers
//!   dropped before they finished (cancelled);
//! - `/test.Test/Stats`: answers `cancelled=<n> finished=<n>`;
//! - `/test.Test/MaxSleeping`: answers the most Sleep handlers that ran at once so far
//!   (decimal): the server's pending calls, for the concurrency-limit test;
//! - `/test.Test/Fail`: answers the status code in metadata `x-code` with message `x-message`;
//! - `/test.Test/StallReposts`: stops the caller's RDMA link from re-posting receive buffers
//!   for the milliseconds in its body (`byteexpress_rpc::test_hooks::LinkFaults`), so no
//!   credits flow back to that client until then;
//! - `/test.Test/SendSwitch`: the server's end of the caller's link sends it a SWITCH nobody
//!   agreed to (a broken peer's re-probe message; `LinkFaults::send_unasked`).
//! - `/test.Test/FailQp`: fails the QP of the caller's link at the server, as a transport fault
//!   would (`LinkFaults::inject_qp_error`); answers `1`, or `0` when the link has no QP;
//! - `/test.Test/Served`: answers, for the caller's `conn_id`, every Echo call that carried an
//!   `x-id` as `id:n` (n = times the handler ran for that id), comma-separated, in the order
//!   they first ran;
//! - `/test.Test/Seen`: answers the `x-seq` values (decimal, comma-separated) of the Echo
//!   calls the server received on the caller's `conn_id`, in the order the handlers started
//!   (the server runs one thread, so in arrival order), with metadata `x-held` = receive
//!   buffers the caller's link held back by stalls so far;
//! - `/test.Test/Pull`: answers a body of the size in metadata `x-size` (bytes, default 4096);
//! - `/test.Test/Push`: answers an empty body (for bulk requests).
//! - `/test.Test/Verify`: checks that the request body is [`pattern`] of its length and
//!   answers `ok <len>` with `x-zero-copy` as Echo; a body that differs fails DATA_LOSS naming
//!   the first wrong byte (for messages too large to echo).

pub mod fallback;

pub mod grpcio;

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use byteexpress_rpc::{Code, Metadata, Response, ServerRequest, Status};
use bytes::Bytes;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

static CANCELLED: AtomicU64 = AtomicU64::new(0);
/// `x-seq` of each Echo call by `conn_id`, in the order the handlers started.
static SEEN: Mutex<Option<HashMap<u32, Vec<u64>>>> = Mutex::new(None);
static FINISHED: AtomicU64 = AtomicU64::new(0);
/// Echo calls with an `x-id` by `conn_id`: (id, times run), in the order first run.
type ServedLog = HashMap<u32, Vec<(u64, u64)>>;
static SERVED: Mutex<Option<ServedLog>> = Mutex::new(None);
/// Sleep handlers running now, and the most at once.
static SLEEPING: AtomicU64 = AtomicU64::new(0);
static MAX_SLEEPING: AtomicU64 = AtomicU64::new(0);

/// Counts a Sleep handler that was dropped before finishing.
struct CancelProbe {
    done: bool,
}

impl Drop for CancelProbe {
    fn drop(&mut self) {
        SLEEPING.fetch_sub(1, Ordering::SeqCst);
        if self.done {
            FINISHED.fetch_add(1, Ordering::SeqCst);
        } else {
            CANCELLED.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// The test service.
pub async fn test_service(req: ServerRequest) -> Result<Response, Status> {
    match req.method.as_str() {
        "/test.Test/Echo" => {
            if let Some(seq) = req
                .metadata
                .get("x-seq")
                .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
            {
                let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
                seen.get_or_insert_with(HashMap::new)
                    .entry(req.conn_id)
                    .or_default()
                    .push(seq);
            }
            if let Some(id) = req
                .metadata
                .get("x-id")
                .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u64>().ok())
            {
                let mut served = SERVED.lock().unwrap_or_else(|e| e.into_inner());
                let log = served
                    .get_or_insert_with(HashMap::new)
                    .entry(req.conn_id)
                    .or_default();
                match log.iter_mut().find(|(i, _)| *i == id) {
                    Some((_, n)) => *n += 1,
                    None => log.push((id, 1)),
                }
            }
            if let Some(ms) = req
                .metadata
                .get("x-delay-ms")
                .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u64>().ok())
            {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            let mut md = req.metadata.clone();
            md.insert("x-transport", req.transport.to_string())
                .expect("valid key");
            let zc = byteexpress_mem::is_pool_memory(req.body.as_ptr()) && !req.body.is_empty();
            md.insert("x-zero-copy", if zc { "1" } else { "0" })
                .expect("valid key");
            Ok(Response {
                metadata: md,
                body: req.body,
            })
        }
        "/test.Test/Sleep" => {
            let ms: u64 = std::str::from_utf8(&req.body)
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            let now = SLEEPING.fetch_add(1, Ordering::SeqCst) + 1;
            MAX_SLEEPING.fetch_max(now, Ordering::SeqCst);
            let mut probe = CancelProbe { done: false };
            tokio::time::sleep(Duration::from_millis(ms)).await;
            probe.done = true;
            Ok(Response::default())
        }
        "/test.Test/Stats" => {
            let s = format!(
                "cancelled={} finished={}",
                CANCELLED.load(Ordering::SeqCst),
                FINISHED.load(Ordering::SeqCst)
            );
            Ok(Response {
                metadata: Metadata::new(),
                body: Bytes::from(s),
            })
        }
        "/test.Test/MaxSleeping" => Ok(Response {
            metadata: Metadata::new(),
            body: Bytes::from(MAX_SLEEPING.load(Ordering::SeqCst).to_string()),
        }),
        "/test.Test/Fail" => {
            let code = req
                .metadata
                .get("x-code")
                .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
                .unwrap_or(2);
            let msg = req
                .metadata
                .get("x-message")
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_default();
            Err(Status::with_metadata(
                Code::from_u16(code),
                msg,
                req.metadata,
            ))
        }
        "/test.Test/StallReposts" => {
            let ms: u64 = std::str::from_utf8(&req.body)
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            req.link_faults.stall_reposts(Duration::from_millis(ms));
            Ok(Response::default())
        }
        "/test.Test/SendSwitch" => {
            let sent = req
                .link_faults
                .send_unasked(byteexpress_rpc::test_hooks::UnaskedReprobe::Switch);
            Ok(Response {
                metadata: Metadata::new(),
                body: Bytes::from(if sent { "1" } else { "0" }),
            })
        }
        "/test.Test/FailQp" => {
            let failed = req.link_faults.inject_qp_error();
            Ok(Response {
                metadata: Metadata::new(),
                body: Bytes::from(if failed { "1" } else { "0" }),
            })
        }
        "/test.Test/Served" => {
            let served = SERVED.lock().unwrap_or_else(|e| e.into_inner());
            let list = served
                .as_ref()
                .and_then(|m| m.get(&req.conn_id))
                .map(|v| {
                    v.iter()
                        .map(|(id, n)| format!("{id}:{n}"))
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default();
            Ok(Response {
                metadata: Metadata::new(),
                body: Bytes::from(list),
            })
        }
        "/test.Test/Seen" => {
            let seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
            let list = seen
                .as_ref()
                .and_then(|m| m.get(&req.conn_id))
                .map(|v| v.iter().map(u64::to_string).collect::<Vec<_>>().join(","))
                .unwrap_or_default();
            let mut md = Metadata::new();
            md.insert("x-held", req.link_faults.held_reposts().to_string())
                .expect("valid key");
            Ok(Response {
                metadata: md,
                body: Bytes::from(list),
            })
        }
        "/test.Test/Pull" => {
            let size: usize = req
                .metadata
                .get("x-size")
                .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
                .unwrap_or(4096);
            Ok(Response {
                metadata: Metadata::new(),
                body: Bytes::from(vec![0x5a; size]),
            })
        }
        "/test.Test/Push" => Ok(Response::default()),
        "/test.Test/Verify" => {
            if let Err(at) = check_pattern(&req.body) {
                return Err(Status::new(
                    Code::DataLoss,
                    format!("body of {} bytes differs at byte {at}", req.body.len()),
                ));
            }
            let mut md = Metadata::new();
            let zc = byteexpress_mem::is_pool_memory(req.body.as_ptr()) && !req.body.is_empty();
            md.insert("x-zero-copy", if zc { "1" } else { "0" })
                .expect("valid key");
            Ok(Response {
                metadata: md,
                body: Bytes::from(format!("ok {}", req.body.len())),
            })
        }
        m => Err(Status::new(Code::Unimplemented, format!("no method {m}"))),
    }
}

/// Bytes of a [`pattern`] block.
const BLOCK: usize = 1 << 20;

/// The 1 MiB block every [`pattern`] repeats, before its stamps.
fn base_block() -> &'static [u8] {
    static BASE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BASE.get_or_init(|| {
        (0..BLOCK as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect()
    })
}

/// Block `i` of a pattern: the base block with `i` in its first 8 bytes and `!i` in its last
/// 8, so a block moved, dropped or repeated is found.
fn stamp(block: &mut [u8], i: u64) {
    let n = block.len().min(8);
    block[..n].copy_from_slice(&i.to_le_bytes()[..n]);
    if block.len() >= 16 {
        let end = block.len();
        block[end - 8..].copy_from_slice(&(!i).to_le_bytes());
    }
}

/// `len` bytes of a pattern that differs in every 1 MiB block (built with memcpy speed, so
/// debug builds make gigabytes in seconds).
pub fn pattern(len: usize) -> Bytes {
    let mut v = Vec::with_capacity(len);
    let mut i = 0u64;
    while v.len() < len {
        let n = (len - v.len()).min(BLOCK);
        let at = v.len();
        v.extend_from_slice(&base_block()[..n]);
        stamp(&mut v[at..], i);
        i += 1;
    }
    Bytes::from(v)
}

/// Checks `b` against [`pattern`] of its length; `Err(offset)` of the first block that differs.
pub fn check_pattern(b: &[u8]) -> Result<(), usize> {
    let mut want = vec![0u8; BLOCK];
    for (i, got) in b.chunks(BLOCK).enumerate() {
        let w = &mut want[..got.len()];
        w.copy_from_slice(&base_block()[..got.len()]);
        stamp(w, i as u64);
        if got != &w[..] {
            return Err(i * BLOCK);
        }
    }
    Ok(())
}

/// A `bx-test-server` child process; killed on drop.
#[derive(Debug)]
pub struct ServerProc {
    /// The child.
    pub child: Child,
    /// `127.0.0.1:<port>` it listens on.
    pub addr: String,
}

impl ServerProc {
    /// Starts the server binary with `args` (e.g. `["--grant", "8"]`) and waits for its
    /// `LISTENING <addr>` line.
    pub async fn start(bin: &str, args: &[&str]) -> ServerProc {
        Self::start_env(bin, args, &[]).await
    }

    /// [`ServerProc::start`] with `env` added to the server's environment (e.g.
    /// `[("BX_GID_INDEX", "99")]`).
    pub async fn start_env(bin: &str, args: &[&str], env: &[(&str, &str)]) -> ServerProc {
        Self::start_as(bin, args, env, None).await
    }

    /// [`ServerProc::start_env`] as user `uid` (the test must run as root to switch), or as
    /// this process's user for `None`.
    pub async fn start_as(
        bin: &str,
        args: &[&str],
        env: &[(&str, &str)],
        uid: Option<u32>,
    ) -> ServerProc {
        let mut cmd = Command::new(bin);
        if let Some(uid) = uid {
            cmd.uid(uid).gid(uid);
        }
        let mut child = cmd
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start test server");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("server start timed out")
            .expect("read server stdout")
            .expect("server exited before listening");
        let addr = line
            .strip_prefix("LISTENING ")
            .expect("LISTENING line")
            .to_string();
        // keep draining stdout so the child never blocks on a full pipe
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        ServerProc { child, addr }
    }

    /// Kills the server (SIGKILL) and waits for it.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }
}

/// The transport an RDMA link of this host negotiates: RDMA on the first device that
/// `byteexpress_verbs::devices()` lists (hardware first, so `rxe0` in the Soft-RoCE VM, `soft0`
/// on a host without an RDMA NIC). Tests compare [`byteexpress_rpc::Client::transport`] with
/// it, so they assert the device, not only the transport.
pub fn rdma_here() -> byteexpress_rpc::Transport {
    static NAME: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();
    let device = NAME.get_or_init(|| {
        let first = byteexpress_verbs::devices()
            .into_iter()
            .next()
            .expect("an RDMA device (soft0 unless BX_SOFT=0)");
        Box::leak(first.name().to_string().into_boxed_str())
    });
    byteexpress_rpc::Transport::Rdma { device }
}
