//! The soft provider between two processes, beside a tokio Unix-socket baseline.
//!
//! `cargo bench -p byteexpress-verbs --bench soft_pingpong`: for each case the bench starts a
//! copy of itself as the peer (environment variable [`ROLE`]), sets up over a loopback TCP
//! control connection, then measures with criterion and afterwards with an hdrhistogram run
//! (p50/p99). Both processes use current-thread tokio runtimes.
//!
//! - SEND round trip (8 B, 4 KiB, 64 KiB): the peer echoes each message with a SEND of the
//!   same size; two ways of waiting for completions on both sides:
//!   - hybrid: spin up to [`HYBRID_SPIN`] on the CQ (`Cq::ready(spin)`), then sleep on its
//!     eventfd;
//!   - AsyncFd: no spin (`Cq::ready(Duration::ZERO)`), every wait goes through the reactor.
//! - RDMA_WRITE bandwidth (64 KiB writes, [`WRITE_DEPTH`] outstanding) into the peer's memory,
//!   both waiting modes.
//! - tokio `UnixStream` ping-pong of the same sizes, and its streaming bandwidth at 64 KiB.
//!
//! The closing table compares with the targets (reported, not asserted): hybrid 8 B p50 ≤ 1 µs;
//! AsyncFd p50 ≤ 1.1× the Unix socket at 8 B and ≤ 0.8× at 64 KiB. `BX_BENCH_QUICK=1` shortens
//! every measurement (smoke run).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use byteexpress_verbs::{
    Access, ConnectAttr, Context, Cq, Endpoint, Mr, Pd, Qp, QpCap, RecvWr, SendWr, Sge, Wc,
    WcStatus, WrOp,
};
use criterion::{BenchmarkId, Criterion, Throughput};
use hdrhistogram::Histogram;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::runtime::Runtime;

/// Environment variable naming the peer's role in a re-executed copy of this binary.
const ROLE: &str = "BX_SOFT_BENCH_ROLE";
/// Environment variable with the parent's control port.
const CTRL: &str = "BX_SOFT_BENCH_CTRL";
/// Spin budget of the hybrid mode: longer than one wake-up (~7.5 µs here, FIELD-NOTES).
const HYBRID_SPIN: Duration = Duration::from_micros(10);
/// Round-trip sizes.
const SIZES: [usize; 3] = [8, 4096, 65536];
/// RDMA_WRITE size and queue depth of the bandwidth case.
const WRITE_SIZE: usize = 65536;
const WRITE_DEPTH: usize = 16;
/// Receives kept posted on each side.
const RECV_DEPTH: u32 = 16;
/// Payloads up to this size go inline.
const INLINE: usize = 64;
/// Immediate value that tells the echo peer to stop.
const STOP: u32 = 0x5709;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Hybrid,
    AsyncFd,
}

impl Mode {
    fn spin(self) -> Duration {
        match self {
            Mode::Hybrid => HYBRID_SPIN,
            Mode::AsyncFd => Duration::ZERO,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Mode::Hybrid => "hybrid",
            Mode::AsyncFd => "asyncfd",
        }
    }
    fn parse(s: &str) -> Mode {
        if s == "hybrid" {
            Mode::Hybrid
        } else {
            Mode::AsyncFd
        }
    }
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn quick() -> bool {
    std::env::var("BX_BENCH_QUICK").is_ok_and(|v| v != "0")
}

// ---------------------------------------------------------------- control channel

fn put(s: &mut TcpStream, b: &[u8]) {
    s.write_all(&(b.len() as u32).to_le_bytes())
        .expect("ctrl write");
    s.write_all(b).expect("ctrl write");
}

fn get(s: &mut TcpStream) -> Vec<u8> {
    let mut n = [0u8; 4];
    s.read_exact(&mut n).expect("ctrl read");
    let mut b = vec![0u8; u32::from_le_bytes(n) as usize];
    s.read_exact(&mut b).expect("ctrl read");
    b
}

/// The peer process of one case; killed if still running when dropped.
struct Peer {
    child: Child,
    ctrl: TcpStream,
}

impl Peer {
    fn start(role: &str) -> Peer {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind ctrl");
        let port = l.local_addr().expect("ctrl addr").port();
        let child = Command::new(std::env::current_exe().expect("current exe"))
            .env(ROLE, role)
            .env(CTRL, port.to_string())
            .spawn()
            .expect("spawn peer");
        let (ctrl, _) = l.accept().expect("peer calls back");
        ctrl.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        Peer { child, ctrl }
    }

    /// Waits for the peer to exit after it was told to stop.
    fn finish(mut self) {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        eprintln!("peer did not stop; killing it");
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

// ---------------------------------------------------------------- soft verbs side

/// One side: QP with separate send and receive CQs, and a registered buffer.
struct Side {
    _pd: Pd,
    qp: Qp,
    send_cq: Cq,
    recv_cq: Cq,
    mr: Mr,
    outstanding_sends: usize,
}

fn soft() -> Context {
    byteexpress_verbs::devices()
        .into_iter()
        .find(|d| d.name() == "soft0")
        .expect("soft0 listed")
        .open()
        .expect("soft0 opens")
}

impl Side {
    fn new(len: usize, access: Access) -> Side {
        let ctx = soft();
        let pd = ctx.alloc_pd().expect("pd");
        let send_cq = ctx.create_cq(256).expect("cq");
        let recv_cq = ctx.create_cq(256).expect("cq");
        let qp = pd
            .create_qp(
                &send_cq,
                &recv_cq,
                QpCap {
                    max_send_wr: 64,
                    max_recv_wr: RECV_DEPTH,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: INLINE as u32,
                },
            )
            .expect("qp");
        let mem = pd.alloc_shared(len).expect("shared memory");
        let mr = pd.reg_shared(&mem, 0, len, access).expect("mr");
        Side {
            _pd: pd,
            qp,
            send_cq,
            recv_cq,
            mr,
            outstanding_sends: 0,
        }
    }

    /// Exchange endpoints over `ctrl` (`first` sends first) and connect.
    /// The soft device passes memory only to a process that took part in a nonce probe with
    /// it, as link set-up does: the first side expects a nonce, the other probes with it.
    fn connect(&self, ctrl: &mut TcpStream, first: bool) {
        let ctx = soft();
        if first {
            let nonce = u64::from(std::process::id()) ^ 0xbe_0000_0000;
            ctx.expect_probe(nonce);
            put(ctrl, &ctx.device_info().to_bytes());
            put(ctrl, &nonce.to_le_bytes());
            assert_eq!(get(ctrl), b"probed");
        } else {
            let dev = byteexpress_verbs::DeviceInfo::from_bytes(&get(ctrl)).expect("device");
            let nonce = u64::from_le_bytes(get(ctrl).try_into().expect("nonce"));
            assert!(ctx.probe(&dev, nonce).expect("probe"), "probe of the peer");
            put(ctrl, b"probed");
        }
        let me = self.qp.endpoint().to_bytes();
        let peer = if first {
            put(ctrl, &me);
            get(ctrl)
        } else {
            let p = get(ctrl);
            put(ctrl, &me);
            p
        };
        let peer = Endpoint::from_bytes(&peer).expect("peer endpoint");
        self.qp
            .connect(&peer, &ConnectAttr::default())
            .expect("connect");
    }

    fn sge(&self, len: usize) -> [Sge; 1] {
        [Sge {
            addr: self.mr.addr(),
            len: len as u32,
            lkey: self.mr.lkey(),
        }]
    }

    fn post_recv(&self, len: usize) {
        self.qp
            .post_recv(&RecvWr {
                wr_id: 1,
                sg_list: &self.sge(len),
            })
            .expect("post_recv");
    }

    fn post_send(&mut self, op: WrOp, len: usize) {
        self.qp
            .post_send(&SendWr {
                wr_id: 2,
                op,
                sg_list: &self.sge(len),
                signaled: true,
                inline: len <= INLINE,
            })
            .expect("post_send");
        self.outstanding_sends += 1;
    }

    /// Reaps send completions once more than `keep_at_most` are outstanding (in batches, as
    /// a latency test reaps its send CQ only now and then: perftest's `cq_mod`), without
    /// waiting unless the send queue stays full.
    async fn reap_sends(&mut self, mode: Mode, keep_at_most: usize) {
        if self.outstanding_sends <= keep_at_most {
            return;
        }
        let mut wc = [Wc::default(); 16];
        loop {
            let n = self.send_cq.poll(&mut wc).expect("poll send cq");
            for w in &wc[..n] {
                assert_eq!(w.status, WcStatus::Success, "send completion {w:?}");
            }
            self.outstanding_sends -= n;
            if self.outstanding_sends <= keep_at_most {
                return;
            }
            if n == 0 {
                self.send_cq
                    .ready(mode.spin())
                    .await
                    .expect("send cq ready");
            }
        }
    }
}

/// Polls `cq` for one completion, waiting in `mode` between polls.
async fn next_wc(cq: &Cq, mode: Mode) -> Wc {
    let mut wc = [Wc::default(); 1];
    loop {
        if cq.poll(&mut wc).expect("poll") == 1 {
            assert_eq!(wc[0].status, WcStatus::Success, "completion {:?}", wc[0]);
            return wc[0];
        }
        cq.ready(mode.spin()).await.expect("cq ready");
    }
}

/// Parent side of the SEND round trip.
struct SoftPingPong {
    side: Side,
    mode: Mode,
    peer: Option<Peer>,
    /// The last answer's receive is still to be posted again.
    repost: bool,
}

impl SoftPingPong {
    fn start(mode: Mode) -> SoftPingPong {
        let mut peer = Peer::start(&format!("soft-echo {}", mode.name()));
        let side = Side::new(*SIZES.iter().max().unwrap_or(&4096), Access::LOCAL_WRITE);
        side.connect(&mut peer.ctrl, true);
        for _ in 0..RECV_DEPTH {
            side.post_recv(SIZES[2]);
        }
        assert_eq!(get(&mut peer.ctrl), b"ready");
        SoftPingPong {
            side,
            mode,
            peer: Some(peer),
            repost: false,
        }
    }

    /// One round trip. The receive the last answer used is posted again after this SEND, while
    /// it travels (the other `RECV_DEPTH - 1` stay posted meanwhile), so re-posting is not on
    /// the measured path, as `ib_send_lat` keeps its receives posted ahead.
    async fn round_trip(&mut self, size: usize) {
        self.side.post_send(WrOp::Send, size);
        if self.repost {
            self.side.post_recv(SIZES[2]);
        }
        let wc = next_wc(&self.side.recv_cq, self.mode).await;
        debug_assert_eq!(wc.byte_len as usize, size);
        self.repost = true;
        self.side.reap_sends(self.mode, 8).await;
    }

    fn stop(mut self, rt: &Runtime) {
        self.side.post_send(WrOp::SendWithImm(STOP), 0);
        rt.block_on(self.side.reap_sends(self.mode, 0));
        if let Some(p) = self.peer.take() {
            p.finish();
        }
    }
}

/// Peer side: echo every message with a SEND of the same length until STOP.
fn soft_echo(mode: Mode, mut ctrl: TcpStream) {
    let mut side = Side::new(SIZES[2], Access::LOCAL_WRITE);
    side.connect(&mut ctrl, false);
    for _ in 0..RECV_DEPTH {
        side.post_recv(SIZES[2]);
    }
    put(&mut ctrl, b"ready");
    runtime().block_on(async {
        loop {
            let wc = next_wc(&side.recv_cq, mode).await;
            if wc.imm == Some(STOP) {
                break;
            }
            // Answer first, then post the receive again (the others stay posted meanwhile).
            side.post_send(WrOp::Send, wc.byte_len as usize);
            side.post_recv(SIZES[2]);
            side.reap_sends(mode, 8).await;
        }
    });
}

/// Parent side of the RDMA_WRITE bandwidth case: the peer lends WRITE_DEPTH slots.
struct SoftWriter {
    side: Side,
    mode: Mode,
    remote: (u64, u32),
    next: usize,
    peer: Option<Peer>,
}

impl SoftWriter {
    fn start(mode: Mode) -> SoftWriter {
        let mut peer = Peer::start("soft-sink");
        let side = Side::new(WRITE_SIZE, Access::LOCAL_WRITE);
        side.connect(&mut peer.ctrl, true);
        let r = get(&mut peer.ctrl);
        let addr = u64::from_le_bytes(r[..8].try_into().expect("addr"));
        let rkey = u32::from_le_bytes(r[8..12].try_into().expect("rkey"));
        SoftWriter {
            side,
            mode,
            remote: (addr, rkey),
            next: 0,
            peer: Some(peer),
        }
    }

    /// `n` WRITEs of WRITE_SIZE with up to WRITE_DEPTH outstanding, all completed.
    async fn write(&mut self, n: u64) {
        for _ in 0..n {
            let slot = (self.next % WRITE_DEPTH) as u64;
            self.next += 1;
            self.side.post_send(
                WrOp::Write {
                    remote_addr: self.remote.0 + slot * WRITE_SIZE as u64,
                    rkey: self.remote.1,
                },
                WRITE_SIZE,
            );
            self.side.reap_sends(self.mode, WRITE_DEPTH - 1).await;
        }
        self.side.reap_sends(self.mode, 0).await;
    }

    fn stop(mut self) {
        if let Some(mut p) = self.peer.take() {
            put(&mut p.ctrl, b"stop");
            p.finish();
        }
    }
}

/// Peer side of the WRITE case: lends memory and waits for "stop".
fn soft_sink(mut ctrl: TcpStream) {
    let side = Side::new(
        WRITE_SIZE * WRITE_DEPTH,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
    );
    side.connect(&mut ctrl, false);
    let mut r = side.mr.addr().to_le_bytes().to_vec();
    r.extend_from_slice(&side.mr.rkey().to_le_bytes());
    put(&mut ctrl, &r);
    ctrl.set_read_timeout(None).expect("timeout");
    let _ = get(&mut ctrl);
}

// ---------------------------------------------------------------- Unix socket baseline

/// A private directory for the socket, removed on drop.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Parent side of a Unix-socket case; the peer is `unix-echo PATH SIZE` (echoes SIZE-byte
/// messages) or `unix-sink PATH` (reads a `u64` byte count, that many bytes, answers one byte).
struct Unix {
    stream: tokio::net::UnixStream,
    buf: Vec<u8>,
    peer: Option<Peer>,
    _dir: TempDir,
}

impl Unix {
    fn start(rt: &Runtime, role: &str, size: usize) -> Unix {
        let dir =
            std::env::temp_dir().join(format!("bx-soft-bench-{}-{}", std::process::id(), role));
        std::fs::create_dir_all(&dir).expect("socket dir");
        let path = dir.join("s");
        let _ = std::fs::remove_file(&path);
        let (peer, stream) = rt.block_on(async {
            let l = tokio::net::UnixListener::bind(&path).expect("bind unix");
            let peer = Peer::start(&format!("{role} {} {size}", path.display()));
            let (s, _) = l.accept().await.expect("accept unix");
            (peer, s)
        });
        Unix {
            stream,
            buf: vec![0u8; size],
            peer: Some(peer),
            _dir: TempDir(dir),
        }
    }

    async fn round_trip(&mut self) {
        self.stream.write_all(&self.buf).await.expect("unix write");
        self.stream
            .read_exact(&mut self.buf)
            .await
            .expect("unix read");
    }

    /// `n` messages one way, then the peer's one-byte answer.
    async fn stream(&mut self, n: u64) {
        let total = n * self.buf.len() as u64;
        self.stream
            .write_all(&total.to_le_bytes())
            .await
            .expect("unix write");
        for _ in 0..n {
            self.stream.write_all(&self.buf).await.expect("unix write");
        }
        let mut ack = [0u8; 1];
        self.stream.read_exact(&mut ack).await.expect("unix ack");
    }

    fn stop(mut self, rt: &Runtime) {
        rt.block_on(async {
            let _ = self.stream.shutdown().await;
        });
        if let Some(p) = self.peer.take() {
            p.finish();
        }
    }
}

/// Peer: echo `size`-byte messages until end of stream.
fn unix_echo(path: &str, size: usize) {
    runtime().block_on(async {
        let mut s = tokio::net::UnixStream::connect(path)
            .await
            .expect("connect unix");
        let mut buf = vec![0u8; size];
        while s.read_exact(&mut buf).await.is_ok() {
            s.write_all(&buf).await.expect("echo write");
        }
    });
}

/// Peer: read a byte count and that many bytes, answer one byte; until end of stream.
fn unix_sink(path: &str, size: usize) {
    runtime().block_on(async {
        let mut s = tokio::net::UnixStream::connect(path)
            .await
            .expect("connect unix");
        let mut buf = vec![0u8; size.max(1)];
        loop {
            let mut n = [0u8; 8];
            if s.read_exact(&mut n).await.is_err() {
                return;
            }
            let mut left = u64::from_le_bytes(n);
            while left > 0 {
                let chunk = left.min(buf.len() as u64) as usize;
                let got = s.read(&mut buf[..chunk]).await.expect("sink read");
                assert!(got > 0, "stream ended early");
                left -= got as u64;
            }
            s.write_all(b"A").await.expect("ack");
        }
    });
}

// ---------------------------------------------------------------- measurement

/// p50 and p99 in µs of `n` calls of `f`, after `n / 10` unmeasured ones.
async fn hdr(n: u64, mut f: impl AsyncFnMut()) -> (f64, f64) {
    for _ in 0..n / 10 {
        f().await;
    }
    // One clock read per call, as `ib_send_lat` takes one timestamp per iteration: each call
    // is timed from the end of the one before (the histogram's bookkeeping included).
    let mut h = Histogram::<u64>::new(3).expect("histogram");
    let mut prev = Instant::now();
    for _ in 0..n {
        f().await;
        let now = Instant::now();
        h.record((now - prev).as_nanos() as u64).expect("record");
        prev = now;
    }
    (
        h.value_at_quantile(0.5) as f64 / 1000.0,
        h.value_at_quantile(0.99) as f64 / 1000.0,
    )
}

/// Times `iters` calls of `f` (criterion's `iter_custom`).
async fn timed(iters: u64, mut f: impl AsyncFnMut()) -> Duration {
    let t0 = Instant::now();
    for _ in 0..iters {
        f().await;
    }
    t0.elapsed()
}

/// One line of the closing table: round-trip p50/p99 in µs, or bandwidth in GB/s.
#[derive(Debug, Clone)]
struct Row {
    path: String,
    size: usize,
    p50: f64,
    p99: f64,
}

fn hdr_iters(size: usize) -> u64 {
    let base = if quick() { 2_000 } else { 20_000 };
    if size >= 65536 { base / 4 } else { base }
}

fn bench_soft_send(c: &mut Criterion, rt: &Runtime, rows: &mut Vec<Row>) {
    let mut g = c.benchmark_group("send_rtt");
    for mode in [Mode::Hybrid, Mode::AsyncFd] {
        let mut pp = SoftPingPong::start(mode);
        for size in SIZES {
            g.bench_with_input(
                BenchmarkId::new(format!("soft_{}", mode.name()), size),
                &size,
                |b, &size| {
                    b.iter_custom(|iters| {
                        rt.block_on(timed(iters, async || pp.round_trip(size).await))
                    })
                },
            );
            let (p50, p99) = rt.block_on(hdr(hdr_iters(size), async || pp.round_trip(size).await));
            rows.push(Row {
                path: format!("soft SEND {}", mode.name()),
                size,
                p50,
                p99,
            });
        }
        pp.stop(rt);
    }
    for size in SIZES {
        let mut u = Unix::start(rt, "unix-echo", size);
        g.bench_with_input(BenchmarkId::new("unix_tokio", size), &size, |b, _| {
            b.iter_custom(|iters| rt.block_on(timed(iters, async || u.round_trip().await)))
        });
        let (p50, p99) = rt.block_on(hdr(hdr_iters(size), async || u.round_trip().await));
        rows.push(Row {
            path: "unix socket tokio".into(),
            size,
            p50,
            p99,
        });
        u.stop(rt);
    }
    g.finish();
}

/// Bandwidth rows carry GB/s in `p50` (criterion reports the same as throughput).
fn bench_bandwidth(c: &mut Criterion, rt: &Runtime, rows: &mut Vec<Row>) {
    let mut g = c.benchmark_group("bandwidth_64KiB");
    g.throughput(Throughput::Bytes(WRITE_SIZE as u64));
    let n = if quick() { 2_000 } else { 20_000 };
    for mode in [Mode::Hybrid, Mode::AsyncFd] {
        let mut w = SoftWriter::start(mode);
        g.bench_function(format!("soft_write_{}", mode.name()), |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let t0 = Instant::now();
                    w.write(iters).await;
                    t0.elapsed()
                })
            })
        });
        let dt = rt.block_on(async {
            let t0 = Instant::now();
            w.write(n).await;
            t0.elapsed()
        });
        rows.push(Row {
            path: format!("soft WRITE bw {} (GB/s)", mode.name()),
            size: WRITE_SIZE,
            p50: (n * WRITE_SIZE as u64) as f64 / dt.as_secs_f64() / 1e9,
            p99: f64::NAN,
        });
        w.stop();
    }
    let mut u = Unix::start(rt, "unix-sink", WRITE_SIZE);
    g.bench_function("unix_tokio_stream", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let t0 = Instant::now();
                u.stream(iters).await;
                t0.elapsed()
            })
        })
    });
    let dt = rt.block_on(async {
        let t0 = Instant::now();
        u.stream(n).await;
        t0.elapsed()
    });
    rows.push(Row {
        path: "unix stream bw (GB/s)".into(),
        size: WRITE_SIZE,
        p50: (n * WRITE_SIZE as u64) as f64 / dt.as_secs_f64() / 1e9,
        p99: f64::NAN,
    });
    u.stop(rt);
    g.finish();
}

fn p50_of(rows: &[Row], path: &str, size: usize) -> Option<f64> {
    rows.iter()
        .find(|r| r.path == path && r.size == size)
        .map(|r| r.p50)
}

fn summary(rows: &[Row]) {
    println!("\nhdrhistogram runs (round trip, µs; bandwidth rows in GB/s):");
    println!("{:<28} {:>8} {:>10} {:>10}", "path", "bytes", "p50", "p99");
    for r in rows {
        println!(
            "{:<28} {:>8} {:>10.2} {:>10.2}",
            r.path, r.size, r.p50, r.p99
        );
    }
    println!("\ntargets (reported, not asserted):");
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    if let Some(h) = p50_of(rows, "soft SEND hybrid", 8) {
        println!("  hybrid 8 B p50 {h:.2} µs ≤ 1 µs: {}", verdict(h <= 1.0));
    }
    for (size, bound) in [(8, 1.1), (65536, 0.8)] {
        if let (Some(a), Some(u)) = (
            p50_of(rows, "soft SEND asyncfd", size),
            p50_of(rows, "unix socket tokio", size),
        ) {
            println!(
                "  AsyncFd {size} B p50 {a:.2} µs = {:.2}× Unix socket ({u:.2} µs) ≤ {bound}×: {}",
                a / u,
                verdict(a / u <= bound)
            );
        }
    }
}

/// The peer roles, run in a re-executed copy of this binary.
fn peer_main(role: &str) {
    let port: u16 = std::env::var(CTRL)
        .ok()
        .and_then(|p| p.parse().ok())
        .expect("control port");
    let words: Vec<&str> = role.split_whitespace().collect();
    match words[..] {
        ["soft-echo", mode] => {
            let ctrl = TcpStream::connect(("127.0.0.1", port)).expect("ctrl connect");
            soft_echo(Mode::parse(mode), ctrl)
        }
        ["soft-sink"] => {
            let ctrl = TcpStream::connect(("127.0.0.1", port)).expect("ctrl connect");
            soft_sink(ctrl)
        }
        [kind @ ("unix-echo" | "unix-sink"), path, size] => {
            // The control connection only tells the parent that the peer started.
            let _ctrl = TcpStream::connect(("127.0.0.1", port)).expect("ctrl connect");
            let size: usize = size.parse().expect("size");
            if kind == "unix-echo" {
                unix_echo(path, size)
            } else {
                unix_sink(path, size)
            }
        }
        _ => panic!("unknown role {role:?}"),
    }
}

fn main() {
    if let Ok(role) = std::env::var(ROLE) {
        peer_main(&role);
        return;
    }
    let (warm, measure) = if quick() {
        (Duration::from_millis(100), Duration::from_millis(300))
    } else {
        (Duration::from_millis(300), Duration::from_millis(1500))
    };
    let mut c = Criterion::default()
        .sample_size(20)
        .warm_up_time(warm)
        .measurement_time(measure)
        .configure_from_args();
    let rt = runtime();
    let mut rows = Vec::new();
    bench_soft_send(&mut c, &rt, &mut rows);
    bench_bandwidth(&mut c, &rt, &mut rows);
    c.final_summary();
    summary(&rows);
}
