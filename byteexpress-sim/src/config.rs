//! Every constant of the simulator, as fields of config structs, with the defaults issue 26
//! fixes (stated there before any run, "so no result is tuned").
//!
//! Units are in each field's name or doc: `_ns` nanoseconds, `_bps` bits per second,
//! `_bytes` bytes.

use serde::Serialize;

/// The network: links, the one switch, PFC and ECN/RED.
#[derive(Debug, Clone, Serialize)]
pub struct NetConfig {
    /// Rate of every link (host NIC ↔ switch port), bits/s. Issue 26: 100 Gb/s.
    pub link_bps: u64,
    /// Propagation delay of each hop (host → switch, switch → host), ns. Issue 26: 1 µs.
    pub hop_delay_ns: u64,
    /// Payload bytes per data packet (the RoCE path MTU). Issue 26: 4 KiB.
    pub mtu_bytes: u32,
    /// Header bytes added to each data packet on the wire (for RoCEv2 Ethernet 14, FCS 4,
    /// IPv4 20, UDP 8 and BTH 12 make 58, rounded to 64), and the size of a control packet
    /// (ACK, NAK, CNP, READ request, TCP ACK). Not in the issue; RoCEv2 framing (IBTA RoCEv2
    /// annex A17).
    pub header_bytes: u32,
    /// Shared buffer of the switch, bytes. Issue 26: 32 MB.
    pub buffer_bytes: u64,
    /// Dynamic-threshold factor α (Choudhury & Hahne, "Dynamic queue length thresholds for
    /// shared-memory packet switches", IEEE/ACM ToN 1998): a queue may hold
    /// `alpha × (buffer − occupied)` bytes. Issue 26: 1/8.
    pub dt_alpha: f64,
    /// A static cap on each egress queue in bytes on top of the dynamic threshold, 0 = none
    /// (the incast-collapse validation uses 128 KiB per port, as the FAST'08 study's shallow
    /// switch). Not in the arms' defaults.
    pub port_buffer_bytes: u64,
    /// PFC (IEEE 802.1Qbb) on: the switch sends XOFF to the host feeding an ingress queue whose
    /// bytes exceed the dynamic threshold, XON when they fall `pfc_xon_gap_bytes` below it, and
    /// never drops data for a full egress queue (only when the whole buffer is full). Off: egress
    /// drop-tail at the dynamic threshold (the TCP arm).
    pub pfc: bool,
    /// XON hysteresis below the XOFF threshold, bytes. Issue 26: 2 MTU.
    pub pfc_xon_gap_bytes: u64,
    /// PFC headroom reserved per port out of the buffer, bytes: what still arrives after an
    /// XOFF (the bytes on the wire both ways, plus a packet being sent at each end). The
    /// dynamic threshold is taken over the buffer less every port's headroom, so a paused
    /// port's late bytes never overflow it. Not in the issue; the usual sizing (e.g. Cisco's
    /// and Mellanox's PFC headroom guides): `2 × hop_delay × rate + 2 × (MTU + headers)`,
    /// 33,320 bytes at the defaults.
    pub pfc_headroom_bytes: u64,
    /// ECN marking at the egress queue (on enqueue).
    pub ecn: EcnMode,
}

/// How the switch marks ECN CE on data packets, from the egress queue's length on enqueue.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum EcnMode {
    /// No marking.
    Off,
    /// RED as DCQCN uses it: no mark below `kmin_bytes`, probability rising linearly to
    /// `pmax` at `kmax_bytes`, every packet above. Issue 26 (DCQCN paper, Zhu et al. SIGCOMM
    /// 2015): K_min 5 KB, K_max 200 KB, P_max 1 %.
    Red {
        /// Lower threshold, bytes.
        kmin_bytes: u64,
        /// Upper threshold, bytes.
        kmax_bytes: u64,
        /// Marking probability at `kmax_bytes` (0..=1).
        pmax: f64,
    },
    /// DCTCP's step marking: every packet that finds more than `k_bytes` queued (Alizadeh et
    /// al., SIGCOMM 2010, K = 65 packets at 10 Gb/s; issue 26: K = 65 packets).
    Step {
        /// Threshold, bytes.
        k_bytes: u64,
    },
}

impl EcnMode {
    /// RED with the DCQCN thresholds (K_min 5 KB, K_max 200 KB, P_max 1 %).
    pub fn dcqcn_default() -> Self {
        EcnMode::Red {
            kmin_bytes: 5_000,
            kmax_bytes: 200_000,
            pmax: 0.01,
        }
    }
}

impl Default for NetConfig {
    /// Issue 26's fixed defaults (100 Gb/s, 1 µs per hop, 4 KiB MTU, 32 MB shared buffer,
    /// α = 1/8, PFC XON 2 MTU below XOFF, RED 5 KB / 200 KB / 1 %).
    fn default() -> Self {
        NetConfig {
            link_bps: 100_000_000_000,
            hop_delay_ns: 1_000,
            mtu_bytes: 4096,
            header_bytes: 64,
            buffer_bytes: 32_000_000,
            dt_alpha: 1.0 / 8.0,
            port_buffer_bytes: 0,
            pfc: true,
            pfc_xon_gap_bytes: 2 * 4096,
            pfc_headroom_bytes: 2 * 12_500 + 2 * (4096 + 64),
            ecn: EcnMode::dcqcn_default(),
        }
    }
}

/// DCQCN's reaction point (sender NIC) and notification point (receiver NIC).
///
/// Checked against: issue 26's list, which names the DCQCN paper (Zhu et al., "Congestion
/// Control for Large-Scale RDMA Deployments", SIGCOMM 2015). The paper's text was not
/// reachable from this machine; the first author's public ns-3 model (bobzhuyb/ns3-rdma,
/// `mix/config.txt`) agrees with the issue on g = 1/256 (`DCTCP_GAIN 0.00390625`), the CNP
/// interval 50 µs, the α interval 55 µs, F = 5 fast-recovery stages and R_AI = 40 Mb/s, and
/// differs on the rate-increase timer (`RP_TIMER 60` µs), the byte counter (300 KB) and
/// R_HAI (200 Mb/s). With nothing to prefer over the issue, the values stand; every
/// one is a flag.
#[derive(Debug, Clone, Serialize)]
pub struct DcqcnConfig {
    /// DCQCN on at RDMA senders; off = every RDMA flow at line rate (the "no congestion
    /// control" validation).
    pub enabled: bool,
    /// EWMA gain g of α. Issue 26 / paper: 1/256.
    pub g: f64,
    /// α is decayed (`α ← (1 − g) α`) every this many ns without a CNP. 55 µs.
    pub alpha_interval_ns: u64,
    /// Rate-increase timer period, ns. Issue 26: 55 µs.
    pub increase_timer_ns: u64,
    /// Byte counter: one increase event per this many bytes sent. Issue 26: 10 MB.
    pub byte_counter_bytes: u64,
    /// Fast-recovery stages F. 5.
    pub fast_recovery_stages: u32,
    /// Additive increase R_AI, bits/s. 40 Mb/s.
    pub rate_ai_bps: f64,
    /// Hyper increase R_HAI, bits/s. Issue 26: 100 Mb/s.
    pub rate_hai_bps: f64,
    /// The notification point sends at most one CNP per flow per this many ns. 50 µs.
    pub cnp_interval_ns: u64,
    /// Lowest rate a cut can reach, bits/s (NICs keep a floor; not in the paper; 10 Mb/s).
    pub min_rate_bps: f64,
}

impl Default for DcqcnConfig {
    /// Issue 26's values (see the type's docs for what was checked).
    fn default() -> Self {
        DcqcnConfig {
            enabled: true,
            g: 1.0 / 256.0,
            alpha_interval_ns: 55_000,
            increase_timer_ns: 55_000,
            byte_counter_bytes: 10_000_000,
            fast_recovery_stages: 5,
            rate_ai_bps: 40e6,
            rate_hai_bps: 100e6,
            cnp_interval_ns: 50_000,
            min_rate_bps: 10e6,
        }
    }
}

/// RDMA RC transport (go-back-N) and the host's verbs limits.
#[derive(Debug, Clone, Serialize)]
pub struct RcConfig {
    /// RC retransmission timeout, ns: 4.096 µs × 2^`timeout` with the usual `timeout = 14`
    /// (`ibv_modify_qp(3)`, `IBV_QP_TIMEOUT`) = 67.1 ms.
    pub timeout_ns: u64,
    /// READs outstanding per QP (`max_qp_init_rd_atom`; ConnectX devices report 16).
    pub max_reads: u32,
    /// The responder ACKs every this many in-order packets, besides each message's last
    /// packet and duplicates at those points (coalesced ACKs, IBTA vol. 1 9.7.5.1.1; how often
    /// a NIC coalesces is not documented: 32, about 3 % of the packets).
    pub ack_interval: u32,
}

impl Default for RcConfig {
    /// 67.1 ms RC timeout (timeout = 14), 16 outstanding READs, an ACK per 32 packets.
    fn default() -> Self {
        RcConfig {
            timeout_ns: 4_096 * (1 << 14),
            max_reads: 16,
            ack_interval: 32,
        }
    }
}

/// TCP senders (arm 1).
#[derive(Debug, Clone, Serialize)]
pub struct TcpConfig {
    /// DCTCP (ECN step marking) instead of NewReno (drop-tail).
    pub dctcp: bool,
    /// Minimum retransmission timeout, ns. Issue 26: 200 ms (Linux `TCP_RTO_MIN`).
    pub rto_min_ns: u64,
    /// Initial congestion window, packets (RFC 6928: 10).
    pub init_cwnd: u32,
    /// DCTCP's α gain g (Alizadeh et al. 2010: 1/16).
    pub dctcp_g: f64,
    /// DCTCP's marking threshold K, packets. Issue 26: 65.
    pub dctcp_k_packets: u64,
}

impl Default for TcpConfig {
    /// DCTCP, 200 ms RTO floor, IW 10, g = 1/16, K = 65 packets.
    fn default() -> Self {
        TcpConfig {
            dctcp: true,
            rto_min_ns: 200_000_000,
            init_cwnd: 10,
            dctcp_g: 1.0 / 16.0,
            dctcp_k_packets: 65,
        }
    }
}

/// The ByteExpress side (`byteexpress_flow` through its gates), as `byteexpress-rpc`'s
/// `Config` sets each value.
#[derive(Debug, Clone, Serialize)]
pub struct BxConfig {
    /// Messages larger than this go by rendezvous (descriptor SEND + READs by the receiver).
    /// `Config::rendezvous_threshold` default 512 KiB.
    pub rendezvous_threshold: u64,
    /// Largest SEND, bytes (`Config::max_chunk` 64 KiB).
    pub max_chunk: u64,
    /// Largest READ WR, bytes (`engine/rdma/read.rs` `READ_PIECE` 1 MiB; a piece is also held
    /// to half the QP window, at least 64 KiB, as `post_reads` does).
    pub read_piece: u64,
    /// Send credits granted (`Config::grant` 16).
    pub grant: u32,
    /// SQ depth (`Config::max_send_wr` 64).
    pub max_send_wr: u32,
    /// Bytes of a descriptor SEND on the wire beyond headers (40-byte header + descriptor).
    pub descriptor_bytes: u64,
    /// Bytes of a small control SEND (RELEASE, push reply, pull request, credit update).
    pub small_bytes: u64,
}

impl Default for BxConfig {
    /// `byteexpress-rpc` defaults.
    fn default() -> Self {
        BxConfig {
            rendezvous_threshold: 512 << 10,
            max_chunk: 64 << 10,
            read_piece: 1 << 20,
            grant: 16,
            max_send_wr: 64,
            descriptor_bytes: 72,
            small_bytes: 64,
        }
    }
}

/// The training trace.
#[derive(Debug, Clone, Serialize)]
pub struct TraceConfig {
    /// Workers N. Issue 26: 16–512.
    pub workers: usize,
    /// Parameter servers (worker w pushes to PS w mod P). Issue 26: "one or a few"; 1.
    pub servers: usize,
    /// Gradient shard each worker pushes per step, and pulls back, bytes. Issue 26: 4 MiB.
    pub shard_bytes: u64,
    /// Steps. Issue 26: 200.
    pub steps: u32,
    /// Compute time between a worker's pull and its next push, ns (not in the issue: 10 ms).
    pub compute_ns: u64,
    /// Uniform jitter added to each compute time, ns (0 = all workers push together).
    pub compute_jitter_ns: u64,
}

impl Default for TraceConfig {
    /// 32 workers, 1 PS, 4 MiB, 200 steps, 10 ms compute, no jitter.
    fn default() -> Self {
        TraceConfig {
            workers: 32,
            servers: 1,
            shard_bytes: 4 << 20,
            steps: 200,
            compute_ns: 10_000_000,
            compute_jitter_ns: 0,
        }
    }
}

/// Everything one run needs.
#[derive(Debug, Clone, Serialize)]
pub struct SimConfig {
    /// Network.
    pub net: NetConfig,
    /// DCQCN.
    pub dcqcn: DcqcnConfig,
    /// RC transport.
    pub rc: RcConfig,
    /// TCP.
    pub tcp: TcpConfig,
    /// ByteExpress.
    pub bx: BxConfig,
    /// Trace.
    pub trace: TraceConfig,
    /// RNG seed (RED marking, compute jitter).
    pub seed: u64,
    /// Queue-depth samples: bin width, ns (the max depth of the watched port per bin).
    pub sample_ns: u64,
    /// Stop after this much simulated time, ns (a bound on every run).
    pub max_sim_ns: u64,
}

impl Default for SimConfig {
    /// The defaults of each part; seed 1, 50 µs queue samples, at most 600 s simulated.
    fn default() -> Self {
        SimConfig {
            net: NetConfig::default(),
            dcqcn: DcqcnConfig::default(),
            rc: RcConfig::default(),
            tcp: TcpConfig::default(),
            bx: BxConfig::default(),
            trace: TraceConfig::default(),
            seed: 1,
            sample_ns: 50_000,
            max_sim_ns: 600_000_000_000,
        }
    }
}

impl SimConfig {
    /// Serialization time of `bytes` at the link rate, ns, rounded up.
    #[inline]
    pub fn ser_ns(&self, bytes: u64) -> u64 {
        (bytes * 8 * 1_000_000_000).div_ceil(self.net.link_bps)
    }
}
