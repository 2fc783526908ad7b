//! The arms of issue 26 on one trace: (1) TCP, DCTCP or NewReno; (2) RDMA with DCQCN only;
//! (3) RDMA with DCQCN and ByteExpress's window and credits (static or adaptive).

use std::time::Instant;

use serde::Serialize;

use crate::config::{EcnMode, SimConfig};
use crate::error::SimError;
use crate::report::ArmResult;
use crate::rpc::{Rpc, WindowMode};
use crate::trace::{Carrier, Trace};
use crate::world::World;

/// One arm.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Arm {
    /// Arm 1: DCTCP, ECN step marking at K packets, no PFC.
    Dctcp,
    /// Arm 1: NewReno, drop-tail, no PFC.
    NewReno,
    /// Arm 2: RDMA, DCQCN only (no software window: `WindowMode::Unlimited`).
    Dcqcn,
    /// Arm 3: RDMA, DCQCN + ByteExpress window and credits.
    Bx {
        /// The QP window.
        window: WindowMode,
        /// The device window shared by a host's QPs, bytes (0 = unlimited, the engine's
        /// default).
        device_window: u64,
    },
}

impl Arm {
    /// A short name for tables and plots.
    pub fn name(&self) -> String {
        match self {
            Arm::Dctcp => "tcp-dctcp".into(),
            Arm::NewReno => "tcp-newreno".into(),
            Arm::Dcqcn => "rdma-dcqcn".into(),
            Arm::Bx {
                window,
                device_window,
            } => {
                let w = match window {
                    WindowMode::Unlimited => "unlimited".to_string(),
                    WindowMode::Static(b) => format!("static-{}K", b >> 10),
                    WindowMode::Adaptive { target_us, max, .. } => {
                        format!("adaptive-{target_us}us-max{}K", max >> 10)
                    }
                };
                if *device_window > 0 {
                    format!("bx-{w}-dev{}K", device_window >> 10)
                } else {
                    format!("bx-{w}")
                }
            }
        }
    }

    /// The configuration this arm runs with: TCP arms turn PFC off and mark by their rule
    /// (DCTCP: step at K packets; NewReno: none); RDMA arms keep PFC and RED.
    pub fn configure(&self, base: &SimConfig) -> SimConfig {
        let mut c = base.clone();
        match self {
            Arm::Dctcp => {
                c.net.pfc = false;
                c.tcp.dctcp = true;
                let pkt = u64::from(c.net.mtu_bytes + c.net.header_bytes);
                c.net.ecn = EcnMode::Step {
                    k_bytes: c.tcp.dctcp_k_packets * pkt,
                };
            }
            Arm::NewReno => {
                c.net.pfc = false;
                c.tcp.dctcp = false;
                c.net.ecn = EcnMode::Off;
            }
            Arm::Dcqcn | Arm::Bx { .. } => {}
        }
        c
    }
}

/// Builds the world and trace of `arm` over `base`.
///
/// # Errors
/// [`SimError`] for an invalid configuration.
pub fn build(base: &SimConfig, arm: Arm) -> Result<(World, Trace), SimError> {
    let cfg = arm.configure(base);
    let n = cfg.trace.workers;
    let p = cfg.trace.servers.max(1);
    if n == 0 || cfg.trace.steps == 0 {
        return Err(SimError::Config(
            "need at least one worker and one step".into(),
        ));
    }
    let mut w = World::new(cfg.clone(), n + p);
    w.watch_port = Some(n as u16);
    let carrier = match arm {
        Arm::Dctcp | Arm::NewReno => {
            let mut up = Vec::with_capacity(n);
            let mut down = Vec::with_capacity(n);
            for k in 0..n {
                let ps = Trace::ps_host(&cfg.trace, k);
                up.push(w.add_tcp_flow(k as u16, ps));
                down.push(w.add_tcp_flow(ps, k as u16));
            }
            Carrier::Tcp { up, down }
        }
        Arm::Dcqcn | Arm::Bx { .. } => {
            let (mode, dev) = match arm {
                Arm::Bx {
                    window,
                    device_window,
                } => (window, device_window),
                _ => (WindowMode::Unlimited, 0),
            };
            let mut rpc = Rpc::new(cfg.bx.clone(), &cfg.rc, n + p, dev)?;
            let mut eps = Vec::with_capacity(n);
            for k in 0..n {
                let ps = Trace::ps_host(&cfg.trace, k);
                eps.push(rpc.link(&mut w, k as u16, ps, mode)?);
            }
            Carrier::Rdma {
                rpc: Box::new(rpc),
                eps,
            }
        }
    };
    let trace = Trace::new(cfg.trace.clone(), carrier, cfg.bx.small_bytes);
    Ok((w, trace))
}

/// Runs `arm` over `base` to the end of its trace and summarizes it.
///
/// # Errors
/// [`SimError`] for an invalid configuration, a broken flow-control rule, or a trace that did
/// not finish within `max_sim_ns`.
pub fn run(base: &SimConfig, arm: Arm) -> Result<ArmResult, SimError> {
    let (mut w, mut t) = build(base, arm)?;
    let t0 = Instant::now();
    t.start(&mut w);
    let max = w.cfg.max_sim_ns;
    w.run(&mut t, max, Trace::over);
    let wall = t0.elapsed();
    if let Some(e) = t.error.take() {
        return Err(e);
    }
    if !t.over() {
        return Err(SimError::Unfinished(max));
    }
    Ok(ArmResult::summarize(&arm, &w, &t, wall))
}
