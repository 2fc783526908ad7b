//! The ByteExpress side of an RDMA link, as `byteexpress-rpc`'s engine
//! (`engine/rdma/mod.rs` `grant_batch`, `engine/rdma/read.rs` `post_reads`) drives
//! `byteexpress_flow`: every SEND passes `gate::admit_round` and `gate::admit_chunk` and is
//! charged with `Window::charge` and `Credits::try_send_data_batch`; every READ passes
//! `gate::admit_read` (SQ slot, CQ entry, outstanding READs, QP window, device window); every
//! completion releases `Window::on_complete` with its RTT (µs) and frees its SQ slot
//! (`QueueBudget`); the receiver returns credits by piggyback (`Credits::on_receive`,
//! `on_reposted`) or an explicit `CREDIT_UPDATE` (`gate::admit_update`, `poll_update`).
//!
//! Messages above `rendezvous_threshold` go as the engine sends them: one descriptor SEND,
//! then the receiver READs the body in pieces of `min(left, read_piece, max(window/2,
//! 64 KiB))` under its own window and `max_reads`, then sends a RELEASE. Smaller ones go as
//! SENDs of at most `max_chunk` (bulk class when more than one).
//!
//! Selective signaling is not modelled: every WR here has its own completion. The engine signals
//! READs, memory-window binds, credit updates and descriptors, but of other SENDs only the last
//! of a round and every 16th (DESIGN 3.5); a covering completion releases the window charges
//! of the SENDs before it at once, which this model spreads over their own completions.
//!
//! Not modelled: the scheduler's logical connections (one message stream per link here), send
//! buffer copies and CPU time (completions act at the instant their ACK or last READ
//! response packet arrives).

use std::collections::VecDeque;

use byteexpress_flow::credit::{
    CreditConfig, Credits, MsgKind, Piggyback, QueueBudget, QueueConfig,
};
use byteexpress_flow::gate::{self, Refusals, Room};
use byteexpress_flow::sched::Class;
use byteexpress_flow::window::{AdaptiveConfig, DeviceWindow, Window};
use serde::Serialize;

use crate::config::{BxConfig, RcConfig};
use crate::error::SimError;
use crate::event::{FlowId, HostId};
use crate::packet::{Kind, Packet};
use crate::world::World;

/// Smallest READ piece (`engine/rdma/read.rs` `MIN_READ_PIECE`, 64 KiB).
pub const MIN_READ_PIECE: u64 = 64 << 10;

/// Tokens of READ responses carry this bit (their ACK at the responder is no CQE of ours).
const READ_BIT: u64 = 1 << 62;

/// How each QP's window is capped.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum WindowMode {
    /// No software window (`window_bytes = 0`): only the NIC's DCQCN and the verbs limits.
    Unlimited,
    /// `Window::fixed(bytes)`.
    Static(u64),
    /// `Window::adaptive` between `min` and `max` bytes, target delay `target_us` (µs).
    Adaptive {
        /// Lower clamp, bytes (the engine: one chunk).
        min: u64,
        /// Upper clamp, bytes.
        max: u64,
        /// Target completion delay, µs.
        target_us: u64,
    },
}

/// What an application message is for (the trace's protocol).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// A worker's gradient shard for step `step`.
    Push {
        /// Worker.
        worker: u32,
        /// Step.
        step: u32,
    },
    /// The PS's answer to a push.
    PushReply {
        /// Worker.
        worker: u32,
        /// Step.
        step: u32,
    },
    /// A worker asks for the parameters of step `step`.
    PullReq {
        /// Worker.
        worker: u32,
        /// Step.
        step: u32,
    },
    /// The parameters, to a worker.
    Pull {
        /// Worker.
        worker: u32,
        /// Step.
        step: u32,
    },
    /// A rendezvous RELEASE (no application meaning).
    Release,
}

#[derive(Debug, Clone, Copy)]
struct Outgoing {
    left: u64,
    multi: bool,
    /// Rendezvous: this is the descriptor of a body of this many bytes.
    rendezvous: Option<u64>,
    purpose: Purpose,
}

#[derive(Debug, Clone, Copy)]
enum OpKind {
    Send {
        kind: MsgKind,
        /// Set on a message's last SEND.
        purpose: Option<Purpose>,
        rendezvous: Option<u64>,
    },
    Read {
        job: u32,
    },
}

#[derive(Debug, Clone, Copy)]
struct Op {
    ep: u32,
    charged: u64,
    posted_at: u64,
    pb: Piggyback,
    kind: OpKind,
}

#[derive(Debug, Clone, Copy)]
struct Job {
    len: u64,
    posted: u64,
    done: u64,
    purpose: Purpose,
}

/// One side of one RDMA link: its QP's window, queues and credits.
#[derive(Debug)]
pub struct Endpoint {
    /// Its host.
    pub host: HostId,
    /// The other side's endpoint.
    pub peer: u32,
    /// Its flow towards the peer (SENDs, and READ responses it serves).
    pub tx: FlowId,
    /// The QP's software window.
    pub window: Window,
    queues: QueueBudget,
    credits: Credits,
    reads_out: u32,
    read_jobs: VecDeque<u32>,
    sendq: VecDeque<Outgoing>,
    /// Smallest window cap seen (bytes).
    pub min_cap: u64,
}

/// All links' ByteExpress state, the device windows, and what completed.
#[derive(Debug)]
pub struct Rpc {
    cfg: BxConfig,
    max_reads: u32,
    /// Endpoints.
    pub eps: Vec<Endpoint>,
    devs: Vec<DeviceWindow>,
    host_eps: Vec<Vec<u32>>,
    rr: Vec<usize>,
    ops: Vec<Op>,
    free_ops: Vec<u32>,
    jobs: Vec<Job>,
    free_jobs: Vec<u32>,
    /// Application messages delivered, (receiving endpoint, purpose), for the caller to drain.
    pub inbox: Vec<(u32, Purpose)>,
    /// Refusals per gate, over all endpoints.
    pub refusals: Refusals,
    /// CREDIT_UPDATEs sent.
    pub credit_updates: u64,
    /// READ WRs posted.
    pub reads: u64,
}

impl Rpc {
    /// No links yet; `hosts` device windows of `device_window` bytes each (0 = unlimited).
    ///
    /// # Errors
    /// [`SimError::Config`] for a zero-sized configuration value.
    pub fn new(
        cfg: BxConfig,
        rc: &RcConfig,
        hosts: usize,
        device_window: u64,
    ) -> Result<Self, SimError> {
        let dev = if device_window == 0 {
            DeviceWindow::unlimited()
        } else {
            DeviceWindow::new(device_window).map_err(SimError::Window)?
        };
        Ok(Rpc {
            cfg,
            max_reads: rc.max_reads.max(1),
            eps: Vec::new(),
            devs: vec![dev; hosts],
            host_eps: vec![Vec::new(); hosts],
            rr: vec![0; hosts],
            ops: Vec::new(),
            free_ops: Vec::new(),
            jobs: Vec::new(),
            free_jobs: Vec::new(),
            inbox: Vec::new(),
            refusals: Refusals::default(),
            credit_updates: 0,
            reads: 0,
        })
    }

    fn window(mode: WindowMode) -> Result<Window, SimError> {
        match mode {
            WindowMode::Unlimited => Window::fixed(u64::MAX).map_err(SimError::Window),
            WindowMode::Static(b) => Window::fixed(b).map_err(SimError::Window),
            WindowMode::Adaptive {
                min,
                max,
                target_us,
            } => AdaptiveConfig::new(min.min(max), max, target_us)
                .map(Window::adaptive)
                .map_err(SimError::Window),
        }
    }

    /// A link between hosts `a` and `b` (an RC QP: one flow each way, made in `w`); returns
    /// the endpoints at `a` and at `b`.
    ///
    /// # Errors
    /// [`SimError`] for an invalid window or queue configuration.
    pub fn link(
        &mut self,
        w: &mut World,
        a: HostId,
        b: HostId,
        mode: WindowMode,
    ) -> Result<(u32, u32), SimError> {
        let grant = CreditConfig::new(self.cfg.grant).map_err(SimError::Credit)?;
        let sq = self.cfg.max_send_wr;
        let rq = grant.posted_receives();
        let qc = QueueConfig::new(sq, rq, sq + rq).map_err(SimError::Queue)?;
        let ia = self.eps.len() as u32;
        for (h, peer, ix) in [(a, ia + 1, ia), (b, ia, ia + 1)] {
            let window = Self::window(mode)?;
            let other = if h == a { b } else { a };
            let tx = w.add_rc_flow(h, other);
            self.eps.push(Endpoint {
                host: h,
                peer,
                tx,
                min_cap: window.cap(),
                window,
                queues: QueueBudget::new(qc),
                credits: Credits::new(grant),
                reads_out: 0,
                read_jobs: VecDeque::new(),
                sendq: VecDeque::new(),
            });
            self.host_eps[h as usize].push(ix);
        }
        Ok((ia, ia + 1))
    }

    /// Queues an application message of `bytes` (header included) on endpoint `ep`: by
    /// rendezvous above the threshold, else as SENDs; posts what the gates admit.
    ///
    /// # Errors
    /// [`SimError`] when a flow-control rule is broken.
    pub fn send(
        &mut self,
        w: &mut World,
        ep: u32,
        bytes: u64,
        purpose: Purpose,
    ) -> Result<(), SimError> {
        let thr = self.cfg.rendezvous_threshold;
        let out = if thr > 0 && bytes > thr {
            Outgoing {
                left: self.cfg.descriptor_bytes,
                multi: false,
                rendezvous: Some(bytes),
                purpose,
            }
        } else {
            Outgoing {
                left: bytes,
                multi: bytes > self.cfg.max_chunk,
                rendezvous: None,
                purpose,
            }
        };
        self.eps[ep as usize].sendq.push_back(out);
        self.pump(w, ep)
    }

    fn new_op(&mut self, op: Op) -> u64 {
        let i = match self.free_ops.pop() {
            Some(i) => {
                self.ops[i as usize] = op;
                i
            }
            None => {
                self.ops.push(op);
                (self.ops.len() - 1) as u32
            }
        };
        u64::from(i) + 1
    }

    fn take_op(&mut self, token: u64) -> Op {
        let i = (token - 1) as u32;
        self.free_ops.push(i);
        self.ops[i as usize]
    }

    /// Posts what endpoint `ep`'s gates admit: queued SENDs in order, then READ pieces, then
    /// a CREDIT_UPDATE when one is due.
    fn pump(&mut self, w: &mut World, ep: u32) -> Result<(), SimError> {
        let now = w.now;
        let e = ep as usize;
        let h = self.eps[e].host as usize;
        // SENDs (engine: `grant_batch` + `post_chunk`), one chunk per round.
        while let Some(&out) = self.eps[e].sendq.front() {
            let x = &mut self.eps[e];
            let room = Room::new(&x.queues, &x.credits, x.queues.sq_free() as usize);
            if let Err(g) = gate::admit_round(&room, 0) {
                self.refusals.record(g);
                break;
            }
            let len = out.left.min(self.cfg.max_chunk);
            let class = if out.multi {
                Class::Bulk
            } else {
                Class::Latency
            };
            let a = match gate::admit_chunk(&room, 0, class, &x.window, &self.devs[h], len) {
                Ok(a) => a,
                Err(g) => {
                    self.refusals.record(g);
                    break;
                }
            };
            let _ticket = x.window.charge(&mut self.devs[h], a);
            let pb = x
                .credits
                .try_send_data_batch(1)
                .ok_or(SimError::Config("credit vanished after its gate".into()))?;
            x.queues.try_post_send().map_err(SimError::Queue)?;
            let last = len == out.left;
            let front = x.sendq.front_mut().expect("peeked");
            front.left -= len;
            if last {
                x.sendq.pop_front();
            }
            let tx = x.tx;
            let token = self.new_op(Op {
                ep,
                charged: len,
                posted_at: now,
                pb,
                kind: OpKind::Send {
                    kind: MsgKind::Data,
                    purpose: last.then_some(out.purpose),
                    rendezvous: if last { out.rendezvous } else { None },
                },
            });
            w.send(tx, len, token);
        }
        // READs (engine: `post_reads`), oldest message first.
        while let Some(&job) = self.eps[e].read_jobs.front() {
            let x = &mut self.eps[e];
            let j = self.jobs[job as usize];
            let share = (x.window.cap() / 2).max(MIN_READ_PIECE);
            let piece = (j.len - j.posted).min(self.cfg.read_piece).min(share);
            let room = Room::new(&x.queues, &x.credits, x.queues.sq_free() as usize);
            let a = match gate::admit_read(
                &room,
                x.reads_out,
                self.max_reads,
                &x.window,
                &self.devs[h],
                piece,
            ) {
                Ok(a) => a,
                Err(g) => {
                    self.refusals.record(g);
                    break;
                }
            };
            let _ticket = x.window.charge(&mut self.devs[h], a);
            x.queues.try_post_send().map_err(SimError::Queue)?;
            x.reads_out += 1;
            let jm = &mut self.jobs[job as usize];
            jm.posted += piece;
            if jm.posted == jm.len {
                x.read_jobs.pop_front();
            }
            let (src, peer) = (x.host, x.peer);
            let token = self.new_op(Op {
                ep,
                charged: piece,
                posted_at: now,
                pb: Piggyback::default(),
                kind: OpKind::Read { job },
            });
            self.reads += 1;
            let responder = &self.eps[peer as usize];
            let hdr = w.cfg.net.header_bytes;
            let mut req = Packet::control(
                Kind::ReadReq,
                responder.tx,
                src,
                responder.host,
                hdr,
                token | READ_BIT,
            );
            req.aux = piece;
            w.send_ctrl(req);
        }
        // An explicit credit update once nothing more goes as data (credit rule 4).
        let x = &mut self.eps[e];
        if x.sendq.is_empty() && x.credits.update_due() {
            let room = Room::new(&x.queues, &x.credits, x.queues.sq_free() as usize);
            match gate::admit_update(&room) {
                Ok(()) => {
                    if let Some(pb) = x.credits.poll_update() {
                        x.queues.try_post_send().map_err(SimError::Queue)?;
                        let tx = x.tx;
                        let token = self.new_op(Op {
                            ep,
                            charged: 0,
                            posted_at: now,
                            pb,
                            kind: OpKind::Send {
                                kind: MsgKind::CreditUpdate,
                                purpose: None,
                                rendezvous: None,
                            },
                        });
                        self.credit_updates += 1;
                        w.send(tx, self.cfg.small_bytes, token);
                    }
                }
                Err(g) => self.refusals.record(g),
            }
        }
        Ok(())
    }

    /// After a completion freed room on host `h`'s device window: every endpoint of `h` with
    /// work tries again (round robin from where the last turn stopped).
    fn pump_host(&mut self, w: &mut World, h: HostId, first: u32) -> Result<(), SimError> {
        self.pump(w, first)?;
        if self.devs[h as usize].cap() == u64::MAX {
            return Ok(());
        }
        let n = self.host_eps[h as usize].len();
        let start = self.rr[h as usize];
        for k in 0..n {
            let ep = self.host_eps[h as usize][(start + k) % n];
            let x = &self.eps[ep as usize];
            if ep != first && (!x.sendq.is_empty() || !x.read_jobs.is_empty()) {
                self.pump(w, ep)?;
            }
        }
        self.rr[h as usize] = (start + 1) % n.max(1);
        Ok(())
    }

    fn release(&mut self, now: u64, ep: u32, op: &Op) -> Result<(), SimError> {
        let x = &mut self.eps[ep as usize];
        let h = x.host as usize;
        x.queues.on_send_completion().map_err(SimError::Queue)?;
        if op.charged > 0 {
            let rtt_us = (now - op.posted_at) / 1000;
            x.window
                .on_complete(&mut self.devs[h], op.charged, rtt_us, now / 1000)
                .map_err(SimError::Window)?;
            x.min_cap = x.min_cap.min(x.window.cap());
        }
        Ok(())
    }

    /// The RC ACK of message `token` reached its sender: the SEND's CQE.
    ///
    /// # Errors
    /// [`SimError`] when a flow-control rule is broken.
    pub fn on_acked(&mut self, w: &mut World, token: u64) -> Result<(), SimError> {
        if token & READ_BIT != 0 || token == 0 {
            return Ok(()); // a READ response acknowledged to its responder: no WR of ours
        }
        let op = self.take_op(token);
        self.release(w.now, op.ep, &op)?;
        let h = self.eps[op.ep as usize].host;
        self.pump_host(w, h, op.ep)
    }

    /// Message `token` arrived in order at its receiver: a SEND (credits, then the message's
    /// purpose) or the last response packet of a READ (its CQE at the requester).
    ///
    /// # Errors
    /// [`SimError`] when a flow-control rule is broken.
    pub fn on_delivered(&mut self, w: &mut World, token: u64) -> Result<(), SimError> {
        if token & READ_BIT != 0 {
            let op = self.take_op(token & !READ_BIT);
            let OpKind::Read { job } = op.kind else {
                return Err(SimError::Config("READ token of a SEND".into()));
            };
            self.release(w.now, op.ep, &op)?;
            self.eps[op.ep as usize].reads_out -= 1;
            let j = &mut self.jobs[job as usize];
            j.done += op.charged;
            if j.done == j.len {
                let purpose = j.purpose;
                self.free_jobs.push(job);
                self.inbox.push((op.ep, purpose));
                let small = self.cfg.small_bytes;
                self.eps[op.ep as usize].sendq.push_back(Outgoing {
                    left: small,
                    multi: false,
                    rendezvous: None,
                    purpose: Purpose::Release,
                });
            }
            let h = self.eps[op.ep as usize].host;
            return self.pump_host(w, h, op.ep);
        }
        // A SEND: the op stays until its ACK; read what the receiver needs.
        let op = self.ops[(token - 1) as usize];
        let OpKind::Send {
            kind,
            purpose,
            rendezvous,
        } = op.kind
        else {
            return Err(SimError::Config("SEND token of a READ".into()));
        };
        let rx = self.eps[op.ep as usize].peer;
        let x = &mut self.eps[rx as usize];
        x.credits
            .on_receive(kind, op.pb)
            .map_err(SimError::Credit)?;
        x.credits.on_reposted(kind).map_err(SimError::Credit)?;
        if let Some(p) = purpose {
            match rendezvous {
                Some(len) => {
                    let job = Job {
                        len,
                        posted: 0,
                        done: 0,
                        purpose: p,
                    };
                    let id = match self.free_jobs.pop() {
                        Some(i) => {
                            self.jobs[i as usize] = job;
                            i
                        }
                        None => {
                            self.jobs.push(job);
                            (self.jobs.len() - 1) as u32
                        }
                    };
                    self.eps[rx as usize].read_jobs.push_back(id);
                }
                None if p != Purpose::Release => self.inbox.push((rx, p)),
                None => {}
            }
        }
        self.pump(w, rx)
    }
}
