//! The training trace: N workers (hosts `0..N`) and P parameter servers (hosts `N..N+P`).
//! Each step, every worker pushes its gradient shard to its PS (worker `w` → PS `w mod P`),
//! the PS answers the push; the worker then asks for the step's parameters, which the PS sends
//! once every push of that step reached it (synchronous SGD's barrier); after the pull the
//! worker computes (`compute_ns` + uniform jitter) and starts the next step.
//!
//! Push latency: from the worker queuing its push to the PS's answer arriving at the worker.

use rand::Rng;

use crate::config::TraceConfig;
use crate::error::SimError;
use crate::event::{Ev, FlowId, HostId};
use crate::rpc::{Purpose, Rpc};
use crate::world::{App, World};

/// Bytes of the RPC header added to each application message (`byteexpress-rpc` wire header).
pub const RPC_HEADER: u64 = 40;

#[derive(Debug, Clone, Copy, Default)]
struct Worker {
    step: u32,
    push_start: u64,
}

/// How the trace's messages travel.
#[derive(Debug)]
pub enum Carrier {
    /// TCP connections: `up[w]` worker → PS, `down[w]` PS → worker.
    Tcp {
        /// Worker → PS flows.
        up: Vec<FlowId>,
        /// PS → worker flows.
        down: Vec<FlowId>,
    },
    /// RDMA links through the ByteExpress layer: `eps[w]` = (worker's endpoint, PS's).
    Rdma {
        /// Links' state.
        rpc: Box<Rpc>,
        /// Endpoints per worker.
        eps: Vec<(u32, u32)>,
    },
}

/// The trace's state; an [`App`] on a [`World`].
#[derive(Debug)]
pub struct Trace {
    cfg: TraceConfig,
    small: u64,
    /// How messages travel.
    pub carrier: Carrier,
    workers: Vec<Worker>,
    /// Pushes received per PS per step.
    pushes: Vec<Vec<u32>>,
    /// Pull requests waiting for their step's barrier, per PS.
    waiting: Vec<Vec<(u32, u32)>>,
    ps_workers: Vec<u32>,
    /// Push latencies (ns), in completion order.
    pub push_lat_ns: Vec<u64>,
    /// Per step: first push start (ns).
    pub step_start: Vec<u64>,
    /// Per step: last push fully received at its PS (ns).
    pub step_pushed: Vec<u64>,
    /// Workers that finished every step.
    pub finished: u32,
    /// The first error (the run stops at it).
    pub error: Option<SimError>,
}

impl Trace {
    /// A trace over `carrier`, with small messages (answers, requests) of `small` bytes.
    pub fn new(cfg: TraceConfig, carrier: Carrier, small: u64) -> Self {
        let n = cfg.workers;
        let p = cfg.servers.max(1);
        let steps = cfg.steps as usize;
        let mut ps_workers = vec![0u32; p];
        for w in 0..n {
            ps_workers[w % p] += 1;
        }
        Trace {
            small,
            carrier,
            workers: vec![Worker::default(); n],
            pushes: vec![vec![0; steps]; p],
            waiting: vec![Vec::new(); p],
            ps_workers,
            push_lat_ns: Vec::with_capacity(n * steps),
            step_start: vec![u64::MAX; steps],
            step_pushed: vec![0; steps],
            finished: 0,
            error: None,
            cfg,
        }
    }

    /// Host of worker `w`'s parameter server.
    pub fn ps_host(cfg: &TraceConfig, w: usize) -> HostId {
        (cfg.workers + w % cfg.servers.max(1)) as HostId
    }

    /// Every worker finished, or an error stopped the run.
    pub fn over(&self) -> bool {
        self.error.is_some() || self.finished as usize == self.cfg.workers
    }

    /// Starts step 0 of every worker at time 0.
    pub fn start(&mut self, w: &mut World) {
        for k in 0..self.cfg.workers {
            self.begin_step(w, k as u32);
        }
    }

    fn begin_step(&mut self, w: &mut World, k: u32) {
        let st = &mut self.workers[k as usize];
        st.push_start = w.now;
        let step = st.step;
        let s = &mut self.step_start[step as usize];
        *s = (*s).min(w.now);
        let bytes = self.cfg.shard_bytes + RPC_HEADER;
        self.post(w, k, true, bytes, Purpose::Push { worker: k, step });
    }

    /// Sends an application message between worker `k` and its PS (`up`: from the worker).
    fn post(&mut self, w: &mut World, k: u32, up: bool, bytes: u64, p: Purpose) {
        match &mut self.carrier {
            Carrier::Tcp { up: u, down: d } => {
                let f = if up { u[k as usize] } else { d[k as usize] };
                w.send(f, bytes, encode(p));
            }
            Carrier::Rdma { rpc, eps } => {
                let (we, pe) = eps[k as usize];
                let ep = if up { we } else { pe };
                if let Err(e) = rpc.send(w, ep, bytes, p) {
                    self.error.get_or_insert(e);
                }
            }
        }
    }

    fn handle(&mut self, w: &mut World, p: Purpose) {
        let small = self.small;
        match p {
            Purpose::Push { worker, step } => {
                let s = &mut self.step_pushed[step as usize];
                *s = (*s).max(w.now);
                let ps = worker as usize % self.cfg.servers.max(1);
                self.pushes[ps][step as usize] += 1;
                self.post(w, worker, false, small, Purpose::PushReply { worker, step });
                if self.pushes[ps][step as usize] == self.ps_workers[ps] {
                    let ready: Vec<(u32, u32)> = self.waiting[ps]
                        .iter()
                        .copied()
                        .filter(|&(_, s)| s == step)
                        .collect();
                    self.waiting[ps].retain(|&(_, s)| s != step);
                    for (k, s) in ready {
                        self.serve_pull(w, k, s);
                    }
                }
            }
            Purpose::PushReply { worker, step } => {
                let st = self.workers[worker as usize];
                self.push_lat_ns.push(w.now - st.push_start);
                self.post(w, worker, true, small, Purpose::PullReq { worker, step });
            }
            Purpose::PullReq { worker, step } => {
                let ps = worker as usize % self.cfg.servers.max(1);
                if self.pushes[ps][step as usize] == self.ps_workers[ps] {
                    self.serve_pull(w, worker, step);
                } else {
                    self.waiting[ps].push((worker, step));
                }
            }
            Purpose::Pull { worker, .. } => {
                let st = &mut self.workers[worker as usize];
                st.step += 1;
                if st.step as usize >= self.cfg.steps as usize {
                    self.finished += 1;
                } else {
                    let jitter = if self.cfg.compute_jitter_ns > 0 {
                        w.rng.random_range(0..=self.cfg.compute_jitter_ns)
                    } else {
                        0
                    };
                    let at = w.now + self.cfg.compute_ns + jitter;
                    w.schedule(at, Ev::ComputeDone(worker));
                }
            }
            Purpose::Release => {}
        }
    }

    fn serve_pull(&mut self, w: &mut World, k: u32, step: u32) {
        let bytes = self.cfg.shard_bytes + RPC_HEADER;
        self.post(w, k, false, bytes, Purpose::Pull { worker: k, step });
    }

    fn drain(&mut self, w: &mut World) {
        loop {
            let batch = match &mut self.carrier {
                Carrier::Rdma { rpc, .. } if !rpc.inbox.is_empty() => {
                    std::mem::take(&mut rpc.inbox)
                }
                _ => return,
            };
            for (_, p) in batch {
                self.handle(w, p);
            }
        }
    }
}

const KIND_SHIFT: u32 = 56;

/// A TCP message token: kind (bits 56..), step (bits 24..56), worker (bits 0..24).
fn encode(p: Purpose) -> u64 {
    let (k, worker, step) = match p {
        Purpose::Push { worker, step } => (1u64, worker, step),
        Purpose::PushReply { worker, step } => (2, worker, step),
        Purpose::PullReq { worker, step } => (3, worker, step),
        Purpose::Pull { worker, step } => (4, worker, step),
        Purpose::Release => (5, 0, 0),
    };
    (k << KIND_SHIFT) | (u64::from(step) << 24) | u64::from(worker)
}

fn decode(t: u64) -> Option<Purpose> {
    let worker = (t & 0xff_ffff) as u32;
    let step = ((t >> 24) & 0xffff_ffff) as u32;
    Some(match t >> KIND_SHIFT {
        1 => Purpose::Push { worker, step },
        2 => Purpose::PushReply { worker, step },
        3 => Purpose::PullReq { worker, step },
        4 => Purpose::Pull { worker, step },
        5 => Purpose::Release,
        _ => return None,
    })
}

impl App for Trace {
    fn delivered(&mut self, w: &mut World, _f: FlowId, token: u64) {
        match &mut self.carrier {
            Carrier::Tcp { .. } => {
                if let Some(p) = decode(token) {
                    self.handle(w, p);
                }
            }
            Carrier::Rdma { rpc, .. } => {
                if let Err(e) = rpc.on_delivered(w, token) {
                    self.error.get_or_insert(e);
                }
                self.drain(w);
            }
        }
    }

    fn acked(&mut self, w: &mut World, _f: FlowId, token: u64) {
        if let Carrier::Rdma { rpc, .. } = &mut self.carrier {
            if let Err(e) = rpc.on_acked(w, token) {
                self.error.get_or_insert(e);
            }
            self.drain(w);
        }
    }

    fn compute_done(&mut self, w: &mut World, worker: u32) {
        self.begin_step(w, worker);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_tokens_round_trip() {
        for p in [
            Purpose::Push {
                worker: 511,
                step: 199,
            },
            Purpose::Pull { worker: 0, step: 7 },
            Purpose::PullReq { worker: 3, step: 0 },
            Purpose::PushReply { worker: 9, step: 1 },
        ] {
            assert_eq!(decode(encode(p)), Some(p));
        }
    }
}
