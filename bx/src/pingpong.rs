//! `bx pingpong`: SEND/RECV ping-pong on one RC QP through the public verbs API, speaking the
//! out-of-band protocol of rdma-core's `ibv_rc_pingpong`, so either side can be that tool.
//!
//! Out of band (TCP, default port 18515), as `ibv_rc_pingpong` does it:
//! 1. the client connects and writes its address line: `LID:QPN:PSN:GID`, formatted
//!    `%04x:%06x:%06x:` then the GID as 32 hex digits (see [`gid_to_wire`]), and the C string's
//!    terminating NUL: 52 bytes in all ([`LINE_LEN`]);
//! 2. the server reads it, moves its QP to RTR and RTS, and answers with its own line;
//! 3. the client reads the answer, writes `done` with its NUL (5 bytes), then moves its QP;
//!    the server waits for `done` before it starts.
//!
//! The soft device's endpoints also carry the peer device's socket address, which the line has
//! no room for: between two `bx` on `soft0`, each line is followed by three extension frames
//! (each [`EXT_MAGIC`], a little-endian `u16` length, then the body): [`Endpoint::to_bytes`],
//! the device's [`DeviceInfo::to_bytes`], and a nonce (u64 LE) the sender's device expects.
//! The reader probes the sender's device with that nonce before it connects: `soft0` passes
//! memory only to a process that took part in a probe with it. `ibv_rc_pingpong` never sees
//! one: it cannot open `soft0`.
//!
//! Then, as `ibv_rc_pingpong`: both sides keep `rx_depth` receives posted on one buffer of
//! `size` bytes; the client sends first; a side sends its next message once both its previous
//! send completed and the peer's message arrived; each side stops after `iters` sends and
//! `iters` receives.

use std::io::{Read, Write};
use std::net::{Ipv6Addr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use byteexpress_verbs::{
    Access, ConnectAttr, Context, Cq, DeviceInfo, Endpoint, Mr, Qp, QpCap, RecvWr, SendWr, Sge, Wc,
    WcStatus, WrOp,
};

/// Length of an address line on the wire: 51 characters and the C string's NUL.
pub const LINE_LEN: usize = 52;
/// What the client sends last (`sizeof "done"` in C: the NUL is included).
pub const DONE: &[u8; 5] = b"done\0";
/// Starts the soft device's extension frame after an address line (`bx` to `bx` only).
pub const EXT_MAGIC: &[u8; 4] = b"BXEP";
/// Largest extension frame body accepted from a peer.
const MAX_EXT: usize = 2048;
/// `wr_id` of receives and sends (the values `ibv_rc_pingpong` uses).
const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;
/// Environment variable that makes the verbs layer pick a GID index (see [`run`]).
const GID_INDEX_ENV: &str = "BX_GID_INDEX";

/// Arguments of `bx pingpong`; the flags are `ibv_rc_pingpong`'s.
#[derive(Debug, Clone, clap::Args)]
pub struct PingpongArgs {
    /// Server to connect to; without it, wait for one client (as `ibv_rc_pingpong`).
    pub server: Option<String>,
    /// Device name (default: the first hardware device, else soft0).
    #[arg(short = 'd', long = "ib-dev")]
    pub dev: Option<String>,
    /// Local GID index (rdma-core devices; default: the device's choice, an IPv4-mapped RoCE v2
    /// GID when there is one).
    #[arg(short = 'g', long = "gid-idx")]
    pub gid_index: Option<u32>,
    /// Message size in bytes.
    #[arg(short = 's', long = "size", default_value_t = 4096)]
    pub size: u32,
    /// Number of exchanges.
    #[arg(short = 'n', long = "iters", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    pub iters: u32,
    /// Path MTU in bytes (256, 512, 1024, 2048, 4096).
    #[arg(short = 'm', long = "mtu", default_value_t = 1024, value_parser = parse_mtu)]
    pub mtu: u32,
    /// TCP port to listen on / connect to.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    pub port: u16,
    /// Receives kept posted.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..))]
    pub rx_depth: u32,
    /// Sleep on CQ events instead of busy-polling.
    #[arg(short = 'e', long = "events")]
    pub events: bool,
    /// Give up when no completion arrives for this many seconds, or when the peer's part of
    /// the address exchange takes longer.
    #[arg(long, default_value_t = 30)]
    pub idle_timeout: u64,
    /// Transport retries of a SEND the peer does not acknowledge before it completes with
    /// RETRY_EXC_ERR (`retry_cnt` of `ibv_modify_qp(3)`, 0..=7; `ibv_rc_pingpong` uses 7).
    /// Kernel Soft-RoCE (rxe, Linux 6.1) retries forever at 7, so a dead path shows as
    /// RETRY_EXC_ERR there only below 7.
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u8).range(0..=7))]
    pub retry_cnt: u8,
}

fn parse_mtu(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(m @ (256 | 512 | 1024 | 2048 | 4096)) => Ok(m),
        _ => Err(format!(
            "{s:?} is not an MTU (256, 512, 1024, 2048 or 4096)"
        )),
    }
}

/// One side's address as `ibv_rc_pingpong` exchanges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dest {
    /// Port LID (0 on RoCE).
    pub lid: u16,
    /// QP number (24 bits).
    pub qpn: u32,
    /// Initial PSN (24 bits).
    pub psn: u32,
    /// GID, network byte order.
    pub gid: [u8; 16],
}

/// The GID as `ibv_rc_pingpong` writes it (`gid_to_wire_gid`): four groups of 8 hex digits,
/// each the `%08x` of a 32-bit word loaded from the GID's bytes in host order and converted
/// with `htobe32`. Whatever the host's byte order, that prints the 16 bytes in network order.
pub fn gid_to_wire(gid: &[u8; 16]) -> String {
    gid.chunks_exact(4)
        .map(|w| format!("{:08x}", u32::from_be_bytes([w[0], w[1], w[2], w[3]])))
        .collect()
}

/// Inverse of [`gid_to_wire`] (`wire_gid_to_gid`); exactly 32 hex digits.
pub fn wire_to_gid(s: &str) -> Result<[u8; 16], String> {
    if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("GID {s:?} is not 32 hex digits"));
    }
    let mut gid = [0u8; 16];
    for (i, chunk) in gid.chunks_exact_mut(4).enumerate() {
        let word =
            u32::from_str_radix(&s[i * 8..i * 8 + 8], 16).map_err(|e| format!("GID {s:?}: {e}"))?;
        chunk.copy_from_slice(&word.to_be_bytes());
    }
    Ok(gid)
}

/// The 52-byte address line for `d`.
pub fn encode_line(d: &Dest) -> [u8; LINE_LEN] {
    let text = format!(
        "{:04x}:{:06x}:{:06x}:{}",
        d.lid,
        d.qpn & 0xff_ffff,
        d.psn & 0xff_ffff,
        gid_to_wire(&d.gid)
    );
    let mut out = [0u8; LINE_LEN];
    out[..LINE_LEN - 1].copy_from_slice(text.as_bytes());
    out
}

/// Parses a peer's address line: `hhhh:hhhhhh:hhhhhh:` and 32 hex digits, then a NUL.
pub fn decode_line(b: &[u8]) -> Result<Dest, String> {
    let shown = String::from_utf8_lossy(b);
    let bad = |why: &str| format!("malformed peer address line {shown:?}: {why}");
    if b.len() != LINE_LEN {
        return Err(bad(&format!("{} bytes, expected {LINE_LEN}", b.len())));
    }
    if b[LINE_LEN - 1] != 0 {
        return Err(bad("not NUL-terminated"));
    }
    let text = std::str::from_utf8(&b[..LINE_LEN - 1]).map_err(|_| bad("not ASCII"))?;
    let fields: Vec<&str> = text.split(':').collect();
    let [lid, qpn, psn, gid] = fields[..] else {
        return Err(bad("expected LID:QPN:PSN:GID"));
    };
    let hex = |f: &str, width: usize, what: &str| -> Result<u32, String> {
        if f.len() != width || !f.bytes().all(|c| c.is_ascii_hexdigit()) {
            return Err(bad(&format!("{what} is not {width} hex digits")));
        }
        u32::from_str_radix(f, 16).map_err(|_| bad(what))
    };
    Ok(Dest {
        lid: u16::try_from(hex(lid, 4, "LID")?).map_err(|_| bad("LID"))?,
        qpn: hex(qpn, 6, "QPN")?,
        psn: hex(psn, 6, "PSN")?,
        gid: wire_to_gid(gid).map_err(|e| bad(&e))?,
    })
}

/// Latency summary of one run, in microseconds of one-way latency (half a round trip, as
/// perftest's `ib_send_lat` reports).
#[derive(Debug, Clone, PartialEq)]
pub struct Latency {
    /// Smallest.
    pub min: f64,
    /// Median (`t_typical`).
    pub typical: f64,
    /// Largest.
    pub max: f64,
    /// Mean.
    pub avg: f64,
    /// Standard deviation.
    pub stdev: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
}

/// Round-trip times in ns, 1 ns to 1 h at 3 significant digits (hdrhistogram): a fixed ~200 KiB
/// whatever the number of iterations, so `-n 4294967295` needs no more memory than `-n 1`.
pub fn rtt_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("static bounds")
}

impl Latency {
    /// Summarises round-trip times; `None` without samples.
    pub fn from_round_trips(rtts: &[Duration]) -> Option<Latency> {
        let mut h = rtt_histogram();
        for d in rtts {
            h.saturating_record((d.as_nanos() as u64).max(1));
        }
        Latency::from_histogram(&h)
    }

    /// Summarises a histogram of round-trip times in ns (within its 3 significant digits);
    /// `None` when it is empty.
    pub fn from_histogram(h: &Histogram<u64>) -> Option<Latency> {
        if h.is_empty() {
            return None;
        }
        let us = |ns: f64| ns / 1e3 / 2.0;
        Some(Latency {
            min: us(h.min() as f64),
            typical: us(h.value_at_quantile(0.5) as f64),
            max: us(h.max() as f64),
            avg: us(h.mean()),
            stdev: us(h.stdev()),
            p99: us(h.value_at_quantile(0.99) as f64),
            p999: us(h.value_at_quantile(0.999) as f64),
        })
    }
}

/// Result of one run.
#[derive(Debug, Clone)]
pub struct Report {
    /// Message size.
    pub size: u32,
    /// Exchanges done.
    pub iters: u32,
    /// From the start of the exchanges to the last completion.
    pub elapsed: Duration,
    /// Per-iteration latency (none for a one-iteration server run).
    pub latency: Option<Latency>,
}

impl Report {
    /// `ib_send_lat`'s table, then `ibv_rc_pingpong`'s two summary lines.
    pub fn render(&self) -> String {
        let mut s = String::new();
        s.push_str(&format!(
            " {:<10} {:<12} {:>12} {:>12} {:>16} {:>12} {:>14} {:>22} {:>24}\n",
            "#bytes",
            "#iterations",
            "t_min[usec]",
            "t_max[usec]",
            "t_typical[usec]",
            "t_avg[usec]",
            "t_stdev[usec]",
            "99% percentile[usec]",
            "99.9% percentile[usec]"
        ));
        match &self.latency {
            Some(l) => s.push_str(&format!(
                " {:<10} {:<12} {:>12.2} {:>12.2} {:>16.2} {:>12.2} {:>14.2} {:>22.2} {:>24.2}\n",
                self.size, self.iters, l.min, l.max, l.typical, l.avg, l.stdev, l.p99, l.p999
            )),
            None => s.push_str(&format!(
                " {:<10} {:<12} (too few iterations for latency samples)\n",
                self.size, self.iters
            )),
        }
        let usec = self.elapsed.as_secs_f64() * 1e6;
        let bytes = u64::from(self.size) * u64::from(self.iters) * 2;
        s.push_str(&format!(
            "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec\n",
            usec / 1e6,
            bytes as f64 * 8.0 / usec.max(f64::MIN_POSITIVE)
        ));
        s.push_str(&format!(
            "{} iters in {:.2} seconds = {:.2} usec/iter\n",
            self.iters,
            usec / 1e6,
            usec / f64::from(self.iters)
        ));
        s
    }
}

/// `bx pingpong`: runs and prints; the exit code tells success.
pub fn main(args: &PingpongArgs) -> ExitCode {
    match run(args) {
        Ok(Outcome::Done(report)) => {
            print!("{}", report.render());
            ExitCode::SUCCESS
        }
        Ok(Outcome::Child(code)) => code,
        Err(e) => {
            eprintln!("bx pingpong: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What [`run`] did: the ping-pong itself, or a re-executed copy of `bx` did it.
#[derive(Debug)]
pub enum Outcome {
    /// Finished here.
    Done(Report),
    /// `-g` asked for a GID other than the device's choice: a copy of this program ran with
    /// `BX_GID_INDEX` set (the verbs layer reads it when it opens the device); its exit code.
    Child(ExitCode),
}

/// Opens the device, exchanges addresses, runs the ping-pong.
pub fn run(args: &PingpongArgs) -> Result<Outcome, String> {
    if args.size > i32::MAX as u32 {
        return Err(format!("size {} exceeds 2^31 - 1 bytes", args.size));
    }
    let ctx = open_device(args.dev.as_deref())?;
    let soft = ctx.gid_index().is_none();
    if let Some(want) = args.gid_index {
        if soft {
            eprintln!(
                "bx pingpong: {} has no GID table; -g {want} ignored",
                ctx.name()
            );
        } else if ctx.gid_index() != Some(want) {
            return rerun_with_gid_index(&ctx, want);
        }
    }
    let attr = ctx.query();
    if args.rx_depth > attr.max_qp_wr || args.rx_depth.saturating_add(1) > attr.max_cqe {
        return Err(format!(
            "rx depth {} exceeds {}'s limits (max_qp_wr {}, max_cqe {})",
            args.rx_depth,
            ctx.name(),
            attr.max_qp_wr,
            attr.max_cqe
        ));
    }
    let pd = ctx.alloc_pd().map_err(|e| format!("alloc_pd: {e}"))?;
    let cq = ctx
        .create_cq(args.rx_depth.saturating_add(1))
        .map_err(|e| format!("create_cq: {e}"))?;
    let qp = pd
        .create_qp(
            &cq,
            &cq,
            QpCap {
                max_send_wr: 1,
                max_recv_wr: args.rx_depth,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
        )
        .map_err(|e| format!("create_qp: {e}"))?;
    let mem = pd
        .alloc_shared((args.size as usize).max(1))
        .map_err(|e| format!("alloc_shared({}): {e}", args.size))?;
    let mr = pd
        .reg_shared(&mem, 0, mem.len(), Access::LOCAL_WRITE)
        .map_err(|e| format!("reg_mr: {e}"))?;

    let me = qp.endpoint();
    let my = Dest {
        lid: me.lid,
        qpn: me.qpn,
        psn: me.psn,
        gid: me.gid,
    };
    println!("  local address:  {}", show(&my));
    let conn = Connector {
        ctx: &ctx,
        qp: &qp,
        mr: &mr,
        args,
        soft,
    };
    let peer = match &args.server {
        Some(host) => conn.client(host, &my)?,
        None => conn.server(&my)?,
    };
    println!("  remote address: {}", show(&peer));
    let report = PingPong {
        qp: &qp,
        cq: &cq,
        mr: &mr,
        size: args.size,
        iters: args.iters,
        rx_depth: args.rx_depth,
        events: args.events,
        idle_timeout: Duration::from_secs(args.idle_timeout.max(1)),
        client: args.server.is_some(),
    }
    .run()?;
    Ok(Outcome::Done(report))
}

/// `-d NAME`, else the first device (hardware devices come first).
fn open_device(name: Option<&str>) -> Result<Context, String> {
    let devs = byteexpress_verbs::devices();
    let dev = match name {
        Some(n) => devs.iter().find(|d| d.name() == n).ok_or_else(|| {
            let names: Vec<&str> = devs.iter().map(|d| d.name()).collect();
            format!("no device {n:?} (devices: {})", names.join(", "))
        })?,
        None => devs
            .first()
            .ok_or("no device (soft0 hidden by BX_SOFT=0?)")?,
    };
    dev.open()
        .map_err(|e| format!("opening {}: {e}", dev.name()))
}

/// The verbs layer picks the source GID when it opens a device and takes `BX_GID_INDEX` as an
/// override; this process can no longer change its own environment safely, so it runs a copy
/// of itself with the variable set.
fn rerun_with_gid_index(ctx: &Context, want: u32) -> Result<Outcome, String> {
    let valid: Vec<u32> = ctx.gids().iter().map(|g| g.index).collect();
    if !valid.contains(&want) {
        return Err(format!(
            "{} has no valid GID at index {want} (valid: {valid:?})",
            ctx.name()
        ));
    }
    if let Ok(v) = std::env::var(GID_INDEX_ENV) {
        return Err(format!(
            "GID index {want} (from -g) conflicts with {GID_INDEX_ENV}={v}; give one of them"
        ));
    }
    let exe = std::env::current_exe().map_err(|e| format!("finding this program: {e}"))?;
    let status = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env(GID_INDEX_ENV, want.to_string())
        .status()
        .map_err(|e| format!("running with {GID_INDEX_ENV}={want}: {e}"))?;
    let code = status
        .code()
        .and_then(|c| u8::try_from(c).ok())
        .unwrap_or(1);
    Ok(Outcome::Child(ExitCode::from(code)))
}

fn show(d: &Dest) -> String {
    format!(
        "LID {:#06x}, QPN {:#08x}, PSN {:#08x}, GID {}",
        d.lid,
        d.qpn,
        d.psn,
        Ipv6Addr::from(d.gid)
    )
}

/// The out-of-band exchange and the QP's connect.
struct Connector<'a> {
    ctx: &'a Context,
    qp: &'a Qp,
    mr: &'a Mr,
    args: &'a PingpongArgs,
    soft: bool,
}

/// A failed read of the out-of-band exchange, waiting for `what`, in the user's words: the
/// socket's read timeout (`--idle-timeout`, reported by the OS as `EAGAIN`) and an early end
/// of stream are named as what they mean. `s` is the exchange's socket.
pub fn exchange_error(s: &TcpStream, e: &std::io::Error, what: &str) -> String {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => format!(
            "timed out after {} s waiting for {what}",
            s.read_timeout()
                .ok()
                .flatten()
                .unwrap_or_default()
                .as_secs()
        ),
        std::io::ErrorKind::UnexpectedEof => {
            format!("the peer closed the connection during the exchange of {what}")
        }
        std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted => {
            format!("the peer closed the connection during the exchange of {what} (reset)")
        }
        _ => format!("reading {what}: {e}"),
    }
}

impl Connector<'_> {
    /// Each read of the exchange waits at most `--idle-timeout` seconds.
    fn set_exchange_timeout(&self, s: &TcpStream) -> Result<(), String> {
        let secs = self.args.idle_timeout.max(1);
        s.set_read_timeout(Some(Duration::from_secs(secs)))
            .map_err(|e| e.to_string())
    }

    fn server(&self, my: &Dest) -> Result<Dest, String> {
        let port = self.args.port;
        let listener = TcpListener::bind(("::", port))
            .or_else(|_| TcpListener::bind(("0.0.0.0", port)))
            .map_err(|e| format!("couldn't listen to port {port}: {e}"))?;
        println!("  waiting for a client on port {port}");
        let (mut s, _) = listener
            .accept()
            .map_err(|e| format!("accept on port {port}: {e}"))?;
        drop(listener);
        self.set_exchange_timeout(&s)?;
        let (peer, ext) = self.read_peer(&mut s)?;
        self.connect(&peer, ext)?;
        self.send_line(&mut s, my)?;
        let mut done = [0u8; DONE.len()];
        s.read_exact(&mut done)
            .map_err(|e| exchange_error(&s, &e, "the client's \"done\""))?;
        if &done != DONE {
            return Err(format!(
                "client sent {:?} instead of \"done\"",
                String::from_utf8_lossy(&done)
            ));
        }
        Ok(peer)
    }

    /// The peer's address line and, on the soft device, its soft endpoint after it (its
    /// device probed first with the nonce it sent).
    fn read_peer(&self, s: &mut TcpStream) -> Result<(Dest, Option<Endpoint>), String> {
        let peer = read_line(s)?;
        if !self.soft {
            return Ok((peer, None));
        }
        let ep = Endpoint::from_bytes(&read_ext(s)?).map_err(|e| format!("soft endpoint: {e}"))?;
        let dev =
            DeviceInfo::from_bytes(&read_ext(s)?).map_err(|e| format!("soft device info: {e}"))?;
        let nonce: [u8; 8] = read_ext(s)?
            .try_into()
            .map_err(|_| "soft probe nonce: not 8 bytes".to_string())?;
        match self.ctx.probe(&dev, u64::from_le_bytes(nonce)) {
            Ok(true) => Ok((peer, Some(ep))),
            Ok(false) => Err("the peer's soft device did not answer our probe".into()),
            Err(e) => Err(format!("probing the peer's soft device: {e}")),
        }
    }

    fn client(&self, host: &str, my: &Dest) -> Result<Dest, String> {
        let port = self.args.port;
        let mut s = TcpStream::connect((host, port))
            .map_err(|e| format!("couldn't connect to {host}:{port}: {e}"))?;
        self.set_exchange_timeout(&s)?;
        self.send_line(&mut s, my)?;
        let (peer, ext) = self.read_peer(&mut s)?;
        // The peer is connected once its line arrives; our receives go up before "done", so
        // the server's first answer always finds one.
        self.connect(&peer, ext)?;
        s.write_all(DONE)
            .map_err(|e| format!("sending \"done\": {e}"))?;
        Ok(peer)
    }

    /// Our line, and on the soft device the extension frame with the full endpoint.
    fn send_line(&self, s: &mut TcpStream, my: &Dest) -> Result<(), String> {
        s.write_all(&encode_line(my))
            .map_err(|e| format!("sending the local address: {e}"))?;
        if self.soft {
            let nonce: u64 = rand::random();
            self.ctx.expect_probe(nonce);
            let mut frames = Vec::new();
            for body in [
                self.qp.endpoint().to_bytes(),
                self.ctx.device_info().to_bytes(),
                nonce.to_le_bytes().to_vec(),
            ] {
                frames.extend_from_slice(EXT_MAGIC);
                frames.extend_from_slice(&(body.len() as u16).to_le_bytes());
                frames.extend_from_slice(&body);
            }
            s.write_all(&frames)
                .map_err(|e| format!("sending the soft endpoint: {e}"))?;
        }
        Ok(())
    }

    /// QP to RTS towards the peer, then the receives go up (the verbs API posts receives only
    /// after RESET; `ibv_rc_pingpong` posts them in INIT, which is equivalent here because no
    /// message can arrive before this side answers).
    fn connect(&self, peer: &Dest, ext: Option<Endpoint>) -> Result<(), String> {
        let ep = match ext {
            Some(ep) => ep,
            None => self
                .ctx
                .endpoint_for(peer.qpn, peer.psn, peer.lid, peer.gid, self.args.mtu)
                .map_err(|e| e.to_string())?,
        };
        let attr = ConnectAttr {
            access: Access::LOCAL_WRITE,
            min_rnr_timer: 12,
            timeout: 14,
            retry_cnt: self.args.retry_cnt,
            rnr_retry: 7,
            mtu: self.args.mtu,
        };
        self.qp
            .connect(&ep, &attr)
            .map_err(|e| format!("couldn't connect to the remote QP: {e}"))?;
        post_recvs(self.qp, self.mr, self.args.size, self.args.rx_depth)
    }
}

fn read_line(s: &mut TcpStream) -> Result<Dest, String> {
    let mut line = [0u8; LINE_LEN];
    s.read_exact(&mut line).map_err(|e| {
        format!(
            "couldn't read the remote address: {}",
            exchange_error(s, &e, "the peer's QP information")
        )
    })?;
    decode_line(&line)
}

/// One extension frame's body.
fn read_ext(s: &mut TcpStream) -> Result<Vec<u8>, String> {
    let mut head = [0u8; 6];
    s.read_exact(&mut head).map_err(|e| {
        format!("no soft endpoint from the peer ({e}); soft0 talks only to bx pingpong on soft0")
    })?;
    if &head[..4] != EXT_MAGIC {
        return Err(
            "the peer sent no soft endpoint; soft0 talks only to bx pingpong on soft0".into(),
        );
    }
    let len = usize::from(u16::from_le_bytes([head[4], head[5]]));
    if len > MAX_EXT {
        return Err(format!("soft endpoint of {len} bytes (at most {MAX_EXT})"));
    }
    let mut body = vec![0u8; len];
    s.read_exact(&mut body)
        .map_err(|e| exchange_error(s, &e, "the peer's soft endpoint"))?;
    Ok(body)
}

fn post_recvs(qp: &Qp, mr: &Mr, size: u32, n: u32) -> Result<(), String> {
    let sge = [Sge {
        addr: mr.addr(),
        len: size,
        lkey: mr.lkey(),
    }];
    for _ in 0..n {
        qp.post_recv(&RecvWr {
            wr_id: RECV_WRID,
            sg_list: &sge,
        })
        .map_err(|e| format!("couldn't post a receive: {e}"))?;
    }
    Ok(())
}

/// The exchange loop (`ibv_rc_pingpong`'s counting).
struct PingPong<'a> {
    qp: &'a Qp,
    cq: &'a Cq,
    mr: &'a Mr,
    size: u32,
    iters: u32,
    rx_depth: u32,
    events: bool,
    idle_timeout: Duration,
    client: bool,
}

impl PingPong<'_> {
    fn run(&self) -> Result<Report, String> {
        let rt = if self.events {
            Some(
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| format!("tokio runtime: {e}"))?,
            )
        } else {
            None
        };
        let sge = [Sge {
            addr: self.mr.addr(),
            len: self.size,
            lkey: self.mr.lkey(),
        }];
        let inline = self.size <= self.qp.cap().max_inline_data;
        let send = || {
            self.qp
                .post_send(&SendWr {
                    wr_id: SEND_WRID,
                    op: WrOp::Send,
                    sg_list: &sge,
                    signaled: true,
                    inline,
                })
                .map_err(|e| format!("couldn't post send: {e}"))
        };
        // A round trip is the time between two sends of this side; the client's last one ends
        // with the answer to its last send.
        let mut rtts = rtt_histogram();
        let mut last_send: Option<Instant> = None;
        let mut sent = |now: Instant| {
            if let Some(prev) = last_send.replace(now) {
                rtts.saturating_record(((now - prev).as_nanos() as u64).max(1));
            }
        };
        let mut routs = self.rx_depth;
        let (mut scnt, mut rcnt) = (0u32, 0u32);
        let mut pending = RECV_WRID;
        let start = Instant::now();
        if self.client {
            sent(Instant::now());
            send()?;
            pending |= SEND_WRID;
        }
        let mut wcs = [Wc::default(); 2];
        let mut last_progress = Instant::now();
        let mut idle_polls = 0u32;
        while rcnt < self.iters || scnt < self.iters {
            let n = self
                .cq
                .poll(&mut wcs)
                .map_err(|e| format!("poll CQ: {e}"))?;
            if n == 0 {
                let stalled = || {
                    format!(
                        "the peer stopped after {rcnt} of {} exchanges: no completion for {:?} \
                         ({scnt} sends, {rcnt} receives done)",
                        self.iters, self.idle_timeout
                    )
                };
                if let Some(rt) = &rt {
                    let left = self.idle_timeout.saturating_sub(last_progress.elapsed());
                    let woke = rt.block_on(async {
                        tokio::time::timeout(left, self.cq.ready(Duration::ZERO)).await
                    });
                    match woke {
                        Ok(r) => r.map_err(|e| format!("waiting for the CQ: {e}"))?,
                        Err(_) => return Err(stalled()),
                    }
                } else {
                    idle_polls = idle_polls.wrapping_add(1);
                    if idle_polls.is_multiple_of(4096)
                        && last_progress.elapsed() >= self.idle_timeout
                    {
                        return Err(stalled());
                    }
                    std::hint::spin_loop();
                }
                continue;
            }
            last_progress = Instant::now();
            for wc in &wcs[..n] {
                if wc.status != WcStatus::Success {
                    let what = if wc.wr_id == SEND_WRID {
                        "send"
                    } else {
                        "receive"
                    };
                    if scnt > 0 && wc.status != WcStatus::Success {
                        return Err(format!(
                            "the peer stopped after {rcnt} of {} exchanges: {what} failed \
                             with {:?} ({})",
                            self.iters,
                            wc.status,
                            wc.status.code()
                        ));
                    }
                    return Err(format!(
                        "failed status {:?} ({}) for wr_id {}",
                        wc.status,
                        wc.status.code(),
                        wc.wr_id
                    ));
                }
                match wc.wr_id {
                    SEND_WRID => scnt += 1,
                    RECV_WRID => {
                        routs -= 1;
                        if routs <= 1 {
                            post_recvs(self.qp, self.mr, self.size, self.rx_depth - routs)?;
                            routs = self.rx_depth;
                        }
                        rcnt += 1;
                    }
                    other => return Err(format!("completion for unknown wr_id {other}")),
                }
                pending &= !wc.wr_id;
                if scnt < self.iters && pending == 0 {
                    sent(Instant::now());
                    send()?;
                    pending = RECV_WRID | SEND_WRID;
                }
            }
        }
        let end = Instant::now();
        if self.client {
            sent(end);
        }
        Ok(Report {
            size: self.size,
            iters: self.iters,
            elapsed: end - start,
            latency: Latency::from_histogram(&rtts),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V4_MAPPED: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 2, 15];

    /// The line `ibv_rc_pingpong` itself writes for LID 0, QPN 0x11, PSN 0xabcdef and
    /// GID ::ffff:10.0.2.15 (its `sprintf` and `gid_to_wire_gid` on a little-endian host).
    const RC_PINGPONG_LINE: &[u8; LINE_LEN] =
        b"0000:000011:abcdef:00000000000000000000ffff0a00020f\0";

    #[test]
    fn retry_cnt_defaults_to_7_as_ibv_rc_pingpong_and_takes_0_to_7() {
        #[derive(clap::Parser)]
        struct Cmd {
            #[command(flatten)]
            args: PingpongArgs,
        }
        let parse = |extra: &[&str]| {
            <Cmd as clap::Parser>::try_parse_from(["pingpong"].iter().chain(extra))
                .map(|c| c.args.retry_cnt)
        };
        assert_eq!(parse(&[]).unwrap(), 7);
        assert_eq!(parse(&["--retry-cnt", "6"]).unwrap(), 6);
        assert_eq!(parse(&["--retry-cnt", "0"]).unwrap(), 0);
        assert!(parse(&["--retry-cnt", "8"]).is_err(), "retry_cnt is 3 bits");
    }

    #[test]
    fn the_line_matches_what_ibv_rc_pingpong_writes() {
        let d = Dest {
            lid: 0,
            qpn: 0x11,
            psn: 0xabcdef,
            gid: V4_MAPPED,
        };
        assert_eq!(&encode_line(&d), RC_PINGPONG_LINE);
        assert_eq!(decode_line(RC_PINGPONG_LINE).unwrap(), d);
    }

    #[test]
    fn gid_wire_form_is_the_bytes_in_network_order() {
        let gid: [u8; 16] = std::array::from_fn(|i| i as u8 * 17);
        let w = gid_to_wire(&gid);
        assert_eq!(w, "00112233445566778899aabbccddeeff");
        assert_eq!(wire_to_gid(&w).unwrap(), gid);
        assert_eq!(
            wire_to_gid("00112233445566778899AABBCCDDEEFF").unwrap(),
            gid
        );
    }

    #[test]
    fn psn_and_qpn_keep_24_bits() {
        let d = Dest {
            lid: 0xffff,
            qpn: 0xff12_3456,
            psn: 0x7f65_4321,
            gid: [0xff; 16],
        };
        let back = decode_line(&encode_line(&d)).unwrap();
        assert_eq!(
            (back.lid, back.qpn, back.psn),
            (0xffff, 0x12_3456, 0x65_4321)
        );
    }

    #[test]
    fn malformed_peer_lines_are_errors_not_panics() {
        let good = *RC_PINGPONG_LINE;
        let mut cases: Vec<Vec<u8>> = vec![
            Vec::new(),
            good[..LINE_LEN - 1].to_vec(),
            [&good[..], b"x"].concat(),
            vec![0u8; LINE_LEN],
            vec![0xffu8; LINE_LEN],
        ];
        let mut no_nul = good;
        no_nul[LINE_LEN - 1] = b'0';
        cases.push(no_nul.to_vec());
        let mut colon_moved = good;
        colon_moved.swap(4, 5);
        cases.push(colon_moved.to_vec());
        let mut not_hex = good;
        not_hex[20] = b'g';
        cases.push(not_hex.to_vec());
        let mut sign = good;
        sign[5] = b'+';
        cases.push(sign.to_vec());
        for c in cases {
            let e = decode_line(&c).unwrap_err();
            assert!(e.contains("malformed peer address line"), "{e}");
        }
    }

    #[test]
    fn latency_is_half_the_round_trip_with_median_and_tail() {
        let rtts: Vec<Duration> = (1..=100).map(|i| Duration::from_micros(2 * i)).collect();
        let l = Latency::from_round_trips(&rtts).unwrap();
        // within the histogram's 3 significant digits
        let near = |got: f64, want: f64| (got - want).abs() <= want * 1e-3;
        assert!(near(l.min, 1.0), "{l:?}");
        assert!(near(l.max, 100.0), "{l:?}");
        assert!(near(l.typical, 50.0), "{l:?}");
        assert!(near(l.p99, 99.0), "{l:?}");
        assert!(near(l.avg, 50.5), "{l:?}");
        assert!(Latency::from_round_trips(&[]).is_none());
    }

    #[test]
    fn report_prints_rc_pingpong_summary_lines() {
        let r = Report {
            size: 4096,
            iters: 1000,
            elapsed: Duration::from_millis(500),
            latency: Latency::from_round_trips(&[Duration::from_micros(10)]),
        };
        let out = r.render();
        assert!(out.contains("t_typical[usec]"), "{out}");
        assert!(
            out.contains("8192000 bytes in 0.50 seconds = 131.07 Mbit/sec"),
            "{out}"
        );
        assert!(
            out.contains("1000 iters in 0.50 seconds = 500.00 usec/iter"),
            "{out}"
        );
    }

    #[test]
    fn mtu_must_be_an_ib_mtu() {
        assert_eq!(parse_mtu("2048"), Ok(2048));
        for bad in ["1000", "0", "x", "8192"] {
            assert!(parse_mtu(bad).is_err(), "{bad}");
        }
    }
}
