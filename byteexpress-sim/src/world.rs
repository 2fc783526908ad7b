//! The simulated network: hosts with NICs, one switch, flows; the event loop that moves
//! packets between them, and the hooks an application ([`App`]) gets.

use rand::SeedableRng;
use rand::rngs::SmallRng;

use crate::config::SimConfig;
use crate::dcqcn::{self, ReactionPoint};
use crate::event::{Ev, EventQueue, FlowId, HostId};
use crate::flow::{Flow, Transport};
use crate::gbn::{GbnReceiver, GbnSender, RxAction};
use crate::nic::Nic;
use crate::packet::{Kind, Packet};
use crate::switch::Switch;
use crate::tcp::{TcpReceiver, TcpSender};

/// What runs on the hosts: told when messages arrive and complete.
pub trait App {
    /// The last packet of message `token` of flow `f` arrived in order at `f`'s receiver.
    fn delivered(&mut self, w: &mut World, f: FlowId, token: u64);
    /// RC only: message `token` of flow `f` was acknowledged to its sender (its CQE).
    fn acked(&mut self, w: &mut World, f: FlowId, token: u64);
    /// `Ev::ComputeDone(worker)` fired.
    fn compute_done(&mut self, w: &mut World, worker: u32);
}

/// An application that does nothing (flows with messages queued by hand).
#[derive(Debug, Default)]
pub struct NoApp;

impl App for NoApp {
    fn delivered(&mut self, _: &mut World, _: FlowId, _: u64) {}
    fn acked(&mut self, _: &mut World, _: FlowId, _: u64) {}
    fn compute_done(&mut self, _: &mut World, _: u32) {}
}

/// The network and its clock.
#[derive(Debug)]
pub struct World {
    /// Configuration.
    pub cfg: SimConfig,
    /// Simulated time now (ns).
    pub now: u64,
    q: EventQueue,
    /// Seeded RNG (RED marking, jitter).
    pub rng: SmallRng,
    /// NIC of each host.
    pub nics: Vec<Nic>,
    /// The switch.
    pub switch: Switch,
    /// Flows.
    pub flows: Vec<Flow>,
    /// Egress port whose queue depth is sampled (`None`: none).
    pub watch_port: Option<HostId>,
    /// Max queue depth of the watched port per `sample_ns` bin: (bin start ns, bytes).
    pub samples: Vec<(u64, u64)>,
    /// Data packets put on a wire by a NIC (first transmissions and resends).
    pub data_packets: u64,
    /// All packets put on a wire by a NIC.
    pub packets: u64,
    tokens: Vec<u64>,
    /// Packets on a wire, referred to by index from their arrival events.
    wire: Vec<Packet>,
    free_wire: Vec<u32>,
}

impl World {
    /// `hosts` hosts on one switch, no flows.
    pub fn new(cfg: SimConfig, hosts: usize) -> Self {
        let rng = SmallRng::seed_from_u64(cfg.seed);
        let switch = Switch::new(hosts, &cfg.net);
        World {
            cfg,
            now: 0,
            q: EventQueue::default(),
            rng,
            nics: (0..hosts).map(|_| Nic::new()).collect(),
            switch,
            flows: Vec::new(),
            watch_port: None,
            samples: Vec::new(),
            data_packets: 0,
            packets: 0,
            tokens: Vec::new(),
            wire: Vec::new(),
            free_wire: Vec::new(),
        }
    }

    /// Adds an RDMA RC flow from `src` to `dst` (DCQCN at its sender when enabled).
    pub fn add_rc_flow(&mut self, src: HostId, dst: HostId) -> FlowId {
        let rp = self
            .cfg
            .dcqcn
            .enabled
            .then(|| ReactionPoint::new(self.cfg.net.link_bps as f64));
        let t = Transport::Rc {
            tx: GbnSender::default(),
            rx: GbnReceiver::default(),
            rp,
            np_last: None,
        };
        self.flows.push(Flow::new(src, dst, t));
        (self.flows.len() - 1) as FlowId
    }

    /// Adds a TCP flow from `src` to `dst`.
    pub fn add_tcp_flow(&mut self, src: HostId, dst: HostId) -> FlowId {
        let base_rtt = 4 * self.cfg.net.hop_delay_ns
            + 2 * self.cfg.ser_ns(u64::from(
                self.cfg.net.mtu_bytes + self.cfg.net.header_bytes,
            ));
        let t = Transport::Tcp {
            tx: TcpSender::new(&self.cfg.tcp, base_rtt),
            rx: TcpReceiver::default(),
        };
        self.flows.push(Flow::new(src, dst, t));
        (self.flows.len() - 1) as FlowId
    }

    /// Queues a message of `bytes` (payload, headers added per packet) on flow `f`, reported
    /// to the application with `token`, and lets its NIC send.
    pub fn send(&mut self, f: FlowId, bytes: u64, token: u64) {
        let mtu = self.cfg.net.mtu_bytes;
        match &mut self.flows[f as usize].t {
            Transport::Rc { tx, .. } => tx.q.push(bytes, token, mtu),
            Transport::Tcp { tx, .. } => tx.q.push(bytes, token, mtu),
        }
        self.activate(f);
    }

    /// Stores a packet put on a wire; its arrival event carries the index.
    #[inline]
    fn park(&mut self, p: Packet) -> u32 {
        match self.free_wire.pop() {
            Some(i) => {
                self.wire[i as usize] = p;
                i
            }
            None => {
                self.wire.push(p);
                (self.wire.len() - 1) as u32
            }
        }
    }

    /// Takes back the packet of an arrival event.
    #[inline]
    fn unpark(&mut self, i: u32) -> Packet {
        self.free_wire.push(i);
        self.wire[i as usize]
    }

    /// Schedules `ev` at `at` (ns).
    pub fn schedule(&mut self, at: u64, ev: Ev) {
        self.q.push(at, ev);
    }

    /// Events processed so far.
    pub fn events(&self) -> u64 {
        self.q.processed()
    }

    /// Runs events up to and including time `until` (ns) or until `stop` says so (checked
    /// after each event); returns whether events remain.
    pub fn run<A: App>(
        &mut self,
        app: &mut A,
        until: u64,
        mut stop: impl FnMut(&A) -> bool,
    ) -> bool {
        while let Some((t, ev)) = self.q.pop() {
            if t > until {
                self.q.push(t, ev);
                self.now = until;
                return true;
            }
            self.now = t;
            self.dispatch(app, ev);
            if stop(app) {
                return !self.q.is_empty();
            }
        }
        false
    }

    fn dispatch<A: App>(&mut self, app: &mut A, ev: Ev) {
        match ev {
            Ev::NicTxDone(h) => {
                self.nics[h as usize].busy = false;
                self.kick(h);
            }
            Ev::NicWake(h) => {
                let nic = &mut self.nics[h as usize];
                if nic.wake_at <= self.now {
                    nic.wake_at = u64::MAX;
                }
                self.kick(h);
            }
            Ev::SwArrive(i) => {
                let p = self.unpark(i);
                self.sw_arrive(p)
            }
            Ev::SwTxDone(e) => self.sw_start(e),
            Ev::HostArrive(i) => {
                let p = self.unpark(i);
                self.host_arrive(app, p)
            }
            Ev::Pause(h, on) => self.pause(h, on),
            Ev::DcqcnTimer(f, generation) => {
                let cfg = &self.cfg.dcqcn;
                if let Transport::Rc { rp: Some(rp), .. } = &mut self.flows[f as usize].t
                    && rp.on_timer(generation, cfg)
                {
                    let at = self.now + cfg.increase_timer_ns;
                    self.q.push(at, Ev::DcqcnTimer(f, generation));
                }
            }
            Ev::Rto(f) => self.rto(f),
            Ev::ComputeDone(w) => app.compute_done(self, w),
        }
    }

    /// Puts flow `f` in its NIC's round robin and lets the NIC send.
    pub fn activate(&mut self, f: FlowId) {
        let flow = &mut self.flows[f as usize];
        let h = flow.src;
        if !flow.active {
            flow.active = true;
            self.nics[h as usize].active.push_back(f);
        }
        self.kick(h);
    }

    /// Queues control packet `p` (ACK, NAK, CNP, READ request, TCP ACK) at its source NIC.
    pub fn send_ctrl(&mut self, p: Packet) {
        let h = p.src;
        self.nics[h as usize].ctrl.push_back(p);
        self.kick(h);
    }

    /// The NIC of `h` starts its next packet if it is idle: a control packet, else the next
    /// flow in round robin that has data and whose rate limiter (DCQCN) or window (TCP) lets
    /// it send; if all are rate-limited, a wake-up at the earliest send time.
    fn kick(&mut self, h: HostId) {
        let hi = h as usize;
        if self.nics[hi].busy {
            return;
        }
        if let Some(p) = self.nics[hi].ctrl.pop_front() {
            self.transmit(h, p);
            return;
        }
        if self.nics[hi].paused {
            return;
        }
        let now = self.now;
        let mut earliest = u64::MAX;
        for _ in 0..self.nics[hi].active.len() {
            let f = self.nics[hi].active.pop_front().expect("counted");
            let flow = &mut self.flows[f as usize];
            let has = match &flow.t {
                Transport::Rc { tx, .. } => tx.has_data(),
                Transport::Tcp { tx, .. } => tx.can_send(),
            };
            if !has {
                flow.active = false;
                continue;
            }
            if flow.next_tx_ns > now {
                earliest = earliest.min(flow.next_tx_ns);
                self.nics[hi].active.push_back(f);
                continue;
            }
            self.nics[hi].active.push_back(f);
            let p = self.take_data(f);
            self.transmit(h, p);
            return;
        }
        if earliest != u64::MAX && earliest < self.nics[hi].wake_at {
            self.nics[hi].wake_at = earliest;
            self.q.push(earliest, Ev::NicWake(h));
        }
    }

    /// Builds flow `f`'s next data packet, advancing its sender, rate limiter and timer.
    fn take_data(&mut self, f: FlowId) -> Packet {
        let now = self.now;
        let mtu = self.cfg.net.mtu_bytes;
        let hdr = self.cfg.net.header_bytes;
        let link = self.cfg.net.link_bps as f64;
        let flow = &mut self.flows[f as usize];
        let (seq, seg) = match &mut flow.t {
            Transport::Rc { tx, .. } => tx.take(mtu),
            Transport::Tcp { tx, .. } => tx.take(mtu),
        };
        let wire = seg.payload + hdr;
        if let Transport::Rc { rp: Some(rp), .. } = &mut flow.t {
            rp.on_sent(u64::from(wire), &self.cfg.dcqcn);
            let rate = rp.rate();
            if rate < link {
                flow.next_tx_ns = now + (f64::from(wire) * 8e9 / rate) as u64;
            }
        }
        let p = Packet {
            flow: f,
            src: flow.src,
            dst: flow.dst,
            kind: Kind::Data,
            wire,
            seq,
            aux: if seg.last { seg.token } else { 0 },
            last: seg.last,
            ce: false,
            ece: false,
            sent_at: now,
        };
        if flow.rto_deadline == u64::MAX {
            self.arm_rto(f);
        }
        self.data_packets += 1;
        p
    }

    fn transmit(&mut self, h: HostId, p: Packet) {
        let nic = &mut self.nics[h as usize];
        nic.busy = true;
        nic.tx_packets += 1;
        self.packets += 1;
        let done = self.now + self.cfg.ser_ns(u64::from(p.wire));
        self.q.push(done, Ev::NicTxDone(h));
        let i = self.park(p);
        self.q
            .push(done + self.cfg.net.hop_delay_ns, Ev::SwArrive(i));
    }

    fn sw_arrive(&mut self, p: Packet) {
        let a = self.switch.arrive(p, &self.cfg.net, &mut self.rng);
        if let Some(h) = a.xoff {
            self.q
                .push(self.now + self.cfg.net.hop_delay_ns, Ev::Pause(h, true));
        }
        if self.watch_port == Some(p.dst) && a.queued {
            let depth = self.switch.ports[p.dst as usize].bytes;
            let bin = self.now / self.cfg.sample_ns.max(1) * self.cfg.sample_ns.max(1);
            let n = self.samples.len();
            match self.samples.last_mut() {
                Some((b, d)) if *b == bin => *d = (*d).max(depth),
                _ if n < 2_000_000 => self.samples.push((bin, depth)),
                _ => {}
            }
        }
        if a.start {
            self.sw_start(p.dst);
        }
    }

    fn sw_start(&mut self, e: HostId) {
        if let Some((p, xon)) = self.switch.depart(e, &self.cfg.net) {
            let done = self.now + self.cfg.ser_ns(u64::from(p.wire));
            self.q.push(done, Ev::SwTxDone(e));
            let i = self.park(p);
            self.q
                .push(done + self.cfg.net.hop_delay_ns, Ev::HostArrive(i));
            if let Some(h) = xon {
                self.q
                    .push(self.now + self.cfg.net.hop_delay_ns, Ev::Pause(h, false));
            }
        }
    }

    fn pause(&mut self, h: HostId, on: bool) {
        let now = self.now;
        let nic = &mut self.nics[h as usize];
        if on && !nic.paused {
            nic.paused = true;
            nic.pauses += 1;
            nic.paused_since = now;
        } else if !on && nic.paused {
            nic.paused = false;
            nic.pause_ns += now - nic.paused_since;
            self.kick(h);
        }
    }

    fn host_arrive<A: App>(&mut self, app: &mut A, p: Packet) {
        let f = p.flow;
        match p.kind {
            Kind::Data => self.data_arrive(app, p),
            Kind::Ack | Kind::Nak => {
                let mut toks = std::mem::take(&mut self.tokens);
                let flow = &mut self.flows[f as usize];
                if let Transport::Rc { tx, .. } = &mut flow.t {
                    if p.kind == Kind::Ack {
                        tx.on_ack(p.seq, |t| toks.push(t));
                    } else {
                        tx.on_nak(p.seq, |t| toks.push(t));
                    }
                    let d = if tx.outstanding() {
                        self.now + self.cfg.rc.timeout_ns
                    } else {
                        u64::MAX
                    };
                    self.set_rto(f, d);
                }
                if p.kind == Kind::Nak {
                    self.activate(f);
                }
                for &t in &toks {
                    app.acked(self, f, t);
                }
                toks.clear();
                self.tokens = toks;
            }
            Kind::Cnp => {
                let now = self.now;
                if let Transport::Rc { rp: Some(rp), .. } = &mut self.flows[f as usize].t {
                    let generation = rp.on_cnp(now, &self.cfg.dcqcn);
                    self.q.push(
                        now + self.cfg.dcqcn.increase_timer_ns,
                        Ev::DcqcnTimer(f, generation),
                    );
                }
            }
            Kind::ReadReq => {
                // The responder sends `aux` bytes on flow `f` (its direction to the requester).
                self.send(f, p.aux, p.seq);
            }
            Kind::TcpAck => {
                let now = self.now;
                let flow = &mut self.flows[f as usize];
                if let Transport::Tcp { tx, .. } = &mut flow.t {
                    let out = tx.on_ack(p.seq, p.ece, now.saturating_sub(p.aux), &self.cfg.tcp);
                    if out.progress {
                        let d = if tx.outstanding() {
                            now + tx.rto_ns
                        } else {
                            u64::MAX
                        };
                        self.set_rto(f, d);
                    }
                }
                self.activate(f);
            }
        }
    }

    fn data_arrive<A: App>(&mut self, app: &mut A, p: Packet) {
        let hdr = self.cfg.net.header_bytes;
        let f = p.flow;
        let now = self.now;
        let payload = u64::from(p.wire - hdr);
        let cnp_interval = self.cfg.dcqcn.cnp_interval_ns;
        let dcqcn_on = self.cfg.dcqcn.enabled;
        let flow = &mut self.flows[f as usize];
        let (src, dst) = (flow.src, flow.dst);
        match &mut flow.t {
            Transport::Rc { rx, np_last, .. } => {
                let cnp = dcqcn_on && p.ce && dcqcn::np_cnp_due(np_last, now, cnp_interval);
                let action = rx.on_data(p.seq);
                let expected = rx.expected;
                if cnp {
                    self.send_ctrl(Packet::control(Kind::Cnp, f, dst, src, hdr, 0));
                }
                let every = u64::from(self.cfg.rc.ack_interval.max(1));
                match action {
                    RxAction::Accept => {
                        self.flows[f as usize].delivered_bytes += payload;
                        if p.last || expected.is_multiple_of(every) {
                            self.send_ctrl(Packet::control(Kind::Ack, f, dst, src, hdr, expected));
                        }
                        if p.last {
                            app.delivered(self, f, p.aux);
                        }
                    }
                    RxAction::Duplicate => {
                        // A resend of what arrived (after a timeout): re-ACK so the sender
                        // moves on (IBTA vol. 1 9.7.5.1.1, duplicate requests).
                        if p.last || (p.seq + 1).is_multiple_of(every) {
                            self.send_ctrl(Packet::control(Kind::Ack, f, dst, src, hdr, expected));
                        }
                    }
                    RxAction::OutOfOrder { nak } => {
                        if nak {
                            self.send_ctrl(Packet::control(Kind::Nak, f, dst, src, hdr, expected));
                        }
                    }
                }
            }
            Transport::Tcp { rx, .. } => {
                let mut toks = std::mem::take(&mut self.tokens);
                let before = rx.nxt;
                let ack = rx.on_data(p.seq, p.last, p.aux, |t| toks.push(t));
                if p.seq >= before {
                    flow.delivered_bytes += payload;
                }
                let mut a = Packet::control(Kind::TcpAck, f, dst, src, hdr, ack);
                a.ece = p.ce;
                a.aux = p.sent_at;
                self.send_ctrl(a);
                for &t in &toks {
                    app.delivered(self, f, t);
                }
                toks.clear();
                self.tokens = toks;
            }
        }
    }

    /// Moves `f`'s retransmission deadline to `d` (ns; `u64::MAX` disarms).
    fn set_rto(&mut self, f: FlowId, d: u64) {
        let flow = &mut self.flows[f as usize];
        flow.rto_deadline = d;
        if d != u64::MAX && !flow.rto_pending {
            flow.rto_pending = true;
            self.q.push(d, Ev::Rto(f));
        }
    }

    fn arm_rto(&mut self, f: FlowId) {
        let flow = &mut self.flows[f as usize];
        let rto = match &flow.t {
            Transport::Rc { .. } => self.cfg.rc.timeout_ns,
            Transport::Tcp { tx, .. } => tx.rto_ns,
        };
        flow.rto_deadline = self.now + rto;
        if !flow.rto_pending {
            flow.rto_pending = true;
            self.q.push(flow.rto_deadline, Ev::Rto(f));
        }
    }

    /// The retransmission timer of `f` (one pending event per flow; a moved deadline
    /// re-schedules it).
    fn rto(&mut self, f: FlowId) {
        let now = self.now;
        let flow = &mut self.flows[f as usize];
        flow.rto_pending = false;
        if flow.rto_deadline == u64::MAX {
            return;
        }
        if now < flow.rto_deadline {
            flow.rto_pending = true;
            self.q.push(flow.rto_deadline, Ev::Rto(f));
            return;
        }
        let fired = match &mut flow.t {
            Transport::Rc { tx, .. } => tx.on_timeout(),
            Transport::Tcp { tx, .. } => {
                let o = tx.outstanding();
                tx.on_timeout();
                o
            }
        };
        flow.rto_deadline = u64::MAX;
        if fired {
            flow.timeouts += 1;
            self.arm_rto(f);
            self.activate(f);
        }
    }
}
