//! `bx sim incast`: the packet-level incast simulator of `byteexpress-sim` (issue 26), every
//! constant a flag (defaults: the issue's, see `byteexpress_sim::config`).
//!
//! Runs the chosen arms at each `--workers` value and prints a Markdown table; `--sweep`
//! instead runs static QP windows of each `--sweep-windows` size and the adaptive window at
//! each N. `--json` writes every result (and the configuration); `--plot-dir` writes a
//! latency CDF and a PS-queue-depth plot per N (SVG).

use std::path::PathBuf;
use std::process::ExitCode;

use byteexpress_sim::arms::{self, Arm};
use byteexpress_sim::config::{EcnMode, SimConfig};
use byteexpress_sim::plot;
use byteexpress_sim::report::{self, ArmResult};
use byteexpress_sim::rpc::WindowMode;
use clap::{Args, ValueEnum};

/// An arm on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ArmName {
    /// Arm 1: TCP DCTCP (ECN step at K packets), no PFC.
    Dctcp,
    /// Arm 1: TCP NewReno, drop-tail, no PFC.
    Newreno,
    /// Arm 2: RDMA, DCQCN only.
    Dcqcn,
    /// Arm 3: DCQCN + ByteExpress static QP window (`--window`).
    BxStatic,
    /// Arm 3: DCQCN + ByteExpress adaptive QP window (`--adaptive-*`, `--target-us`).
    BxAdaptive,
}

/// Flags of `bx sim incast`.
#[derive(Debug, Args)]
pub struct IncastArgs {
    /// Workers N; a list runs each.
    #[arg(long, value_delimiter = ',', default_value = "32")]
    pub workers: Vec<usize>,
    /// Training steps.
    #[arg(long, default_value_t = 200)]
    pub steps: u32,
    /// Parameter servers (worker w pushes to PS w mod P).
    #[arg(long, default_value_t = 1)]
    pub servers: usize,
    /// Gradient shard per worker and step, bytes (pushed, then pulled back).
    #[arg(long, default_value_t = 4 << 20)]
    pub shard_bytes: u64,
    /// Compute time between a pull and the next push, µs.
    #[arg(long, default_value_t = 10_000)]
    pub compute_us: u64,
    /// Uniform jitter added to each compute time, µs.
    #[arg(long, default_value_t = 0)]
    pub jitter_us: u64,
    /// Arms to run.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "dctcp,newreno,dcqcn,bx-static,bx-adaptive"
    )]
    pub arms: Vec<ArmName>,
    /// Arm 3 static QP window, bytes (`Config::window_bytes` default 256 KiB).
    #[arg(long, default_value_t = 256 << 10)]
    pub window: u64,
    /// Arm 3 adaptive window lower clamp, bytes (the engine: one chunk, 64 KiB).
    #[arg(long, default_value_t = 64 << 10)]
    pub adaptive_min: u64,
    /// Arm 3 adaptive window upper clamp, bytes.
    #[arg(long, default_value_t = 4 << 20)]
    pub adaptive_max: u64,
    /// Arm 3 adaptive window target completion delay, µs.
    #[arg(long, default_value_t = 30)]
    pub target_us: u64,
    /// Arm 3 device window shared by a host's QPs, bytes (0 = unlimited, the engine's default).
    #[arg(long, default_value_t = 0)]
    pub device_window: u64,
    /// Sweep static QP windows of these sizes (bytes) and the adaptive window at each N,
    /// instead of the arms.
    #[arg(long)]
    pub sweep: bool,
    /// Window sizes of `--sweep`, bytes.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "65536,131072,262144,524288,1048576,2097152,4194304"
    )]
    pub sweep_windows: Vec<u64>,
    /// Link rate, Gb/s.
    #[arg(long, default_value_t = 100.0)]
    pub link_gbps: f64,
    /// Propagation delay per hop, ns.
    #[arg(long, default_value_t = 1_000)]
    pub hop_ns: u64,
    /// Payload bytes per packet (MTU).
    #[arg(long, default_value_t = 4096)]
    pub mtu: u32,
    /// Header bytes per packet (and control packet size).
    #[arg(long, default_value_t = 64)]
    pub header_bytes: u32,
    /// Switch shared buffer, bytes.
    #[arg(long, default_value_t = 32_000_000)]
    pub buffer_bytes: u64,
    /// Dynamic-threshold α.
    #[arg(long, default_value_t = 0.125)]
    pub alpha: f64,
    /// Static cap per egress queue, bytes (0 = none).
    #[arg(long, default_value_t = 0)]
    pub port_buffer_bytes: u64,
    /// PFC XON gap below XOFF, bytes.
    #[arg(long, default_value_t = 8192)]
    pub xon_gap_bytes: u64,
    /// PFC headroom per port, bytes.
    #[arg(long, default_value_t = 33_320)]
    pub headroom_bytes: u64,
    /// RED K_min, bytes.
    #[arg(long, default_value_t = 5_000)]
    pub kmin: u64,
    /// RED K_max, bytes.
    #[arg(long, default_value_t = 200_000)]
    pub kmax: u64,
    /// RED P_max (0..1).
    #[arg(long, default_value_t = 0.01)]
    pub pmax: f64,
    /// DCQCN g.
    #[arg(long, default_value_t = 1.0 / 256.0)]
    pub dcqcn_g: f64,
    /// DCQCN α update interval, µs.
    #[arg(long, default_value_t = 55)]
    pub alpha_interval_us: u64,
    /// DCQCN rate-increase timer, µs.
    #[arg(long, default_value_t = 55)]
    pub increase_timer_us: u64,
    /// DCQCN byte counter, bytes.
    #[arg(long, default_value_t = 10_000_000)]
    pub byte_counter: u64,
    /// DCQCN fast-recovery stages F.
    #[arg(long, default_value_t = 5)]
    pub fr_stages: u32,
    /// DCQCN additive increase, Mb/s.
    #[arg(long, default_value_t = 40.0)]
    pub rai_mbps: f64,
    /// DCQCN hyper increase, Mb/s.
    #[arg(long, default_value_t = 100.0)]
    pub rhai_mbps: f64,
    /// DCQCN CNP interval per flow, µs.
    #[arg(long, default_value_t = 50)]
    pub cnp_interval_us: u64,
    /// DCQCN rate floor, Mb/s.
    #[arg(long, default_value_t = 10.0)]
    pub min_rate_mbps: f64,
    /// RC retransmission timeout, µs.
    #[arg(long, default_value_t = 67_109)]
    pub rc_timeout_us: u64,
    /// READs outstanding per QP.
    #[arg(long, default_value_t = 16)]
    pub max_reads: u32,
    /// RC ACK every this many packets.
    #[arg(long, default_value_t = 32)]
    pub ack_interval: u32,
    /// TCP minimum RTO, ms.
    #[arg(long, default_value_t = 200)]
    pub rto_min_ms: u64,
    /// TCP initial window, packets.
    #[arg(long, default_value_t = 10)]
    pub init_cwnd: u32,
    /// DCTCP g.
    #[arg(long, default_value_t = 1.0 / 16.0)]
    pub dctcp_g: f64,
    /// DCTCP K, packets.
    #[arg(long, default_value_t = 65)]
    pub dctcp_k: u64,
    /// Rendezvous threshold, bytes.
    #[arg(long, default_value_t = 512 << 10)]
    pub rendezvous_threshold: u64,
    /// Largest SEND, bytes.
    #[arg(long, default_value_t = 64 << 10)]
    pub max_chunk: u64,
    /// Largest READ, bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub read_piece: u64,
    /// Send credits granted.
    #[arg(long, default_value_t = 16)]
    pub grant: u32,
    /// SQ depth.
    #[arg(long, default_value_t = 64)]
    pub max_send_wr: u32,
    /// Descriptor SEND bytes.
    #[arg(long, default_value_t = 72)]
    pub descriptor_bytes: u64,
    /// Small SEND bytes (replies, requests, RELEASE).
    #[arg(long, default_value_t = 64)]
    pub small_bytes: u64,
    /// RNG seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Queue-depth sample bin, µs.
    #[arg(long, default_value_t = 50)]
    pub sample_us: u64,
    /// Longest simulated time per run, s.
    #[arg(long, default_value_t = 600)]
    pub max_sim_s: u64,
    /// Write results (and the configuration) as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write SVG plots here (latency CDF and queue depth per N).
    #[arg(long)]
    pub plot_dir: Option<PathBuf>,
    /// Simulated time shown in the queue-depth plots, ms.
    #[arg(long, default_value_t = 200.0)]
    pub plot_window_ms: f64,
}

impl IncastArgs {
    /// The simulator configuration these flags give, for `workers` workers.
    pub fn config(&self, workers: usize) -> SimConfig {
        let mut c = SimConfig::default();
        let n = &mut c.net;
        n.link_bps = (self.link_gbps * 1e9) as u64;
        n.hop_delay_ns = self.hop_ns;
        n.mtu_bytes = self.mtu;
        n.header_bytes = self.header_bytes;
        n.buffer_bytes = self.buffer_bytes;
        n.dt_alpha = self.alpha;
        n.port_buffer_bytes = self.port_buffer_bytes;
        n.pfc_xon_gap_bytes = self.xon_gap_bytes;
        n.pfc_headroom_bytes = self.headroom_bytes;
        n.ecn = EcnMode::Red {
            kmin_bytes: self.kmin,
            kmax_bytes: self.kmax,
            pmax: self.pmax,
        };
        let d = &mut c.dcqcn;
        d.g = self.dcqcn_g;
        d.alpha_interval_ns = self.alpha_interval_us * 1000;
        d.increase_timer_ns = self.increase_timer_us * 1000;
        d.byte_counter_bytes = self.byte_counter;
        d.fast_recovery_stages = self.fr_stages;
        d.rate_ai_bps = self.rai_mbps * 1e6;
        d.rate_hai_bps = self.rhai_mbps * 1e6;
        d.cnp_interval_ns = self.cnp_interval_us * 1000;
        d.min_rate_bps = self.min_rate_mbps * 1e6;
        c.rc.timeout_ns = self.rc_timeout_us * 1000;
        c.rc.max_reads = self.max_reads;
        c.rc.ack_interval = self.ack_interval;
        c.tcp.rto_min_ns = self.rto_min_ms * 1_000_000;
        c.tcp.init_cwnd = self.init_cwnd;
        c.tcp.dctcp_g = self.dctcp_g;
        c.tcp.dctcp_k_packets = self.dctcp_k;
        let b = &mut c.bx;
        b.rendezvous_threshold = self.rendezvous_threshold;
        b.max_chunk = self.max_chunk;
        b.read_piece = self.read_piece;
        b.grant = self.grant;
        b.max_send_wr = self.max_send_wr;
        b.descriptor_bytes = self.descriptor_bytes;
        b.small_bytes = self.small_bytes;
        let t = &mut c.trace;
        t.workers = workers;
        t.servers = self.servers;
        t.shard_bytes = self.shard_bytes;
        t.steps = self.steps;
        t.compute_ns = self.compute_us * 1000;
        t.compute_jitter_ns = self.jitter_us * 1000;
        c.seed = self.seed;
        c.sample_ns = self.sample_us * 1000;
        c.max_sim_ns = self.max_sim_s * 1_000_000_000;
        c
    }

    fn adaptive(&self) -> WindowMode {
        WindowMode::Adaptive {
            min: self.adaptive_min,
            max: self.adaptive_max,
            target_us: self.target_us,
        }
    }

    fn arm(&self, a: ArmName) -> Arm {
        match a {
            ArmName::Dctcp => Arm::Dctcp,
            ArmName::Newreno => Arm::NewReno,
            ArmName::Dcqcn => Arm::Dcqcn,
            ArmName::BxStatic => Arm::Bx {
                window: WindowMode::Static(self.window),
                device_window: self.device_window,
            },
            ArmName::BxAdaptive => Arm::Bx {
                window: self.adaptive(),
                device_window: self.device_window,
            },
        }
    }
}

/// One N's rows.
struct Group {
    workers: usize,
    rows: Vec<ArmResult>,
}

fn run_group(args: &IncastArgs, n: usize, arms: &[Arm]) -> Result<Group, String> {
    let cfg = args.config(n);
    let mut rows = Vec::new();
    for arm in arms {
        let r = arms::run(&cfg, *arm)
            .map_err(|e| format!("{} at N = {n}: {}", arm.name(), crate::error_chain(&e)))?;
        eprintln!(
            "N = {n} {}: {} steps in {:.1} s simulated, {:.2} s wall, {:.2} M packets/s",
            r.arm,
            r.steps,
            r.sim_ms / 1e3,
            r.wall_s,
            r.packets_per_s / 1e6
        );
        rows.push(r);
    }
    Ok(Group { workers: n, rows })
}

fn p99_of<'a>(rows: &'a [ArmResult], name: &str) -> Option<&'a ArmResult> {
    rows.iter().find(|r| r.arm == name)
}

/// Arm 2 p99 over each arm-3 row's p99, and arm 3's PFC pauses.
fn ratios(g: &Group) -> String {
    let mut s = String::new();
    if let Some(d) = p99_of(&g.rows, "rdma-dcqcn") {
        for r in g.rows.iter().filter(|r| r.arm.starts_with("bx-")) {
            s.push_str(&format!(
                "N = {}: p99 {} / {} = {:.2}x; PFC pause frames in {}: {}\n",
                g.workers,
                d.arm,
                r.arm,
                d.push_p99_ms / r.push_p99_ms,
                r.arm,
                r.pfc_pause_frames
            ));
        }
    }
    s
}

/// The sweep's summary: per N, the best static window's p99 and whether the adaptive window
/// is within 10 % of it.
fn sweep_summary(groups: &[Group]) -> String {
    let mut s = String::from(
        "| N | best static | its p99 ms | adaptive p99 ms | adaptive / best | within 10 % |\n|---|---|---|---|---|---|\n",
    );
    for g in groups {
        let best = g
            .rows
            .iter()
            .filter(|r| r.arm.contains("static"))
            .min_by(|a, b| a.push_p99_ms.total_cmp(&b.push_p99_ms));
        let ad = g.rows.iter().find(|r| r.arm.contains("adaptive"));
        if let (Some(b), Some(a)) = (best, ad) {
            let ratio = a.push_p99_ms / b.push_p99_ms;
            s.push_str(&format!(
                "| {} | {} | {:.3} | {:.3} | {:.3} | {} |\n",
                g.workers,
                b.arm,
                b.push_p99_ms,
                a.push_p99_ms,
                ratio,
                if ratio <= 1.10 { "yes" } else { "no" }
            ));
        }
    }
    s
}

/// Runs `bx sim incast`.
pub fn main(args: &IncastArgs) -> ExitCode {
    let arms: Vec<Arm> = if args.sweep {
        let mut v: Vec<Arm> = args
            .sweep_windows
            .iter()
            .map(|&b| Arm::Bx {
                window: WindowMode::Static(b),
                device_window: args.device_window,
            })
            .collect();
        v.push(Arm::Bx {
            window: args.adaptive(),
            device_window: args.device_window,
        });
        v
    } else {
        args.arms.iter().map(|&a| args.arm(a)).collect()
    };
    let mut groups = Vec::new();
    for &n in &args.workers {
        match run_group(args, n, &arms) {
            Ok(g) => groups.push(g),
            Err(e) => {
                eprintln!("bx sim incast: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let all: Vec<ArmResult> = groups.iter().flat_map(|g| g.rows.iter().cloned()).collect();
    print!("{}", report::table(&all));
    let mut notes = String::new();
    if args.sweep {
        notes = sweep_summary(&groups);
    } else {
        for g in &groups {
            notes.push_str(&ratios(g));
        }
    }
    println!();
    print!("{notes}");
    if let Some(path) = &args.json {
        let doc = serde_json::json!({
            "command": std::env::args().collect::<Vec<_>>().join(" "),
            "config": args.config(args.workers.first().copied().unwrap_or(0)),
            "results": all,
            "notes": notes,
        });
        let text = serde_json::to_string_pretty(&doc).unwrap_or_default();
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("bx sim incast: writing {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    if let Some(dir) = &args.plot_dir {
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!("bx sim incast: {}: {e}", dir.display());
            return ExitCode::FAILURE;
        }
        let tag = if args.sweep { "sweep" } else { "arms" };
        for g in &groups {
            let cdf = dir.join(format!("sim-{tag}-n{}-latency-cdf.svg", g.workers));
            let title = format!("push latency CDF, N = {} ({} steps)", g.workers, args.steps);
            let q = dir.join(format!("sim-{tag}-n{}-queue.svg", g.workers));
            let qt = format!("PS port queue depth, N = {}", g.workers);
            let r = plot::latency_cdf(&g.rows, &title, &cdf)
                .and_then(|()| plot::queue_depth(&g.rows, &qt, args.plot_window_ms, &q));
            if let Err(e) = r {
                eprintln!("bx sim incast: {}", crate::error_chain(&e));
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
