//! The soft device: one per process, listening on an abstract Unix socket, with a progress
//! thread for the listener, the control channels, RNR/retry timers and peer-death detection.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::os::fd::{OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use rand::Rng;

use super::bell::{Bell, BellIn, BellSet};
use super::cq::SoftCq;
use super::limits;
use super::pd::{SoftMr, SoftPd};
use super::peer::{Peer, PeerParts};
use super::peer_fd::PeerFd;
use super::probes::Probes;
use super::qp::SoftQp;
use super::ring::{Layout, Ring};
use super::shm::Mapping;
use super::sock::{MAX_MSG, MAX_NAME, Recv, Sock};
use super::srq::SoftSrq;
use super::trust::Trust;
use super::wire::{
    CONNECT_BELL_BACK, CONNECT_REFILL, CONNECT_SEND_BELL, CONNECT_STAGING, ConnectMsg, Msg,
    connect_fds,
};
use crate::events::EventHub;
use crate::provider::{ContextImpl, CqImpl, PROVIDER_SOFT, PdImpl};
use crate::{Access, DeviceAttr, DeviceInfo, Error, Result};

/// How long an accepted connection may take to send its first message.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Timeout of probe and connect round trips.
pub(crate) const CONTROL_TIMEOUT: Duration = Duration::from_secs(5);

static DEVICE: Mutex<Option<Arc<SoftDevice>>> = Mutex::new(None);

/// The process's soft device, created on first use.
pub(crate) fn device() -> Result<Arc<SoftDevice>> {
    let mut g = DEVICE.lock();
    if let Some(d) = g.as_ref() {
        return Ok(d.clone());
    }
    let d = SoftDevice::start()?;
    *g = Some(d.clone());
    Ok(d)
}

/// The device, if it was opened (for test hooks).
#[cfg(feature = "test-hooks")]
pub(crate) fn opened() -> Option<Arc<SoftDevice>> {
    DEVICE.lock().clone()
}

/// A socket the progress thread watches for one QP.
#[derive(Debug, Clone)]
pub(crate) enum Watch {
    /// The peer's connection to us: its announcements arrive here; EOF = peer gone.
    Inbound { qp: Weak<SoftQp>, sock: Arc<Sock> },
    /// Our connection to the peer: only EOF/HUP matters.
    Outbound { qp: Weak<SoftQp>, sock: Arc<Sock> },
}

impl Watch {
    fn qp(&self) -> &Weak<SoftQp> {
        match self {
            Watch::Inbound { qp, .. } | Watch::Outbound { qp, .. } => qp,
        }
    }
    fn sock(&self) -> &Arc<Sock> {
        match self {
            Watch::Inbound { sock, .. } | Watch::Outbound { sock, .. } => sock,
        }
    }
}

#[derive(Debug)]
struct Timer {
    at: Instant,
    seq: u64,
    qp: Weak<SoftQp>,
}

impl PartialEq for Timer {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Timer {}
impl PartialOrd for Timer {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Timer {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

/// Hashing of this device's MR keys, which it hands out itself (from a counter, never from a
/// peer): one multiply instead of SipHash on every local key lookup of the data path.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct KeyHash;

impl std::hash::BuildHasher for KeyHash {
    type Hasher = KeyHasher;
    fn build_hasher(&self) -> KeyHasher {
        KeyHasher(0)
    }
}

/// See [`KeyHash`].
#[derive(Debug)]
pub(crate) struct KeyHasher(u64);

/// 2^64 / golden ratio, odd: consecutive keys spread over the table's low and high bits.
const KEY_MUL: u64 = 0x9e37_79b9_7f4a_7c15;

impl std::hash::Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(KEY_MUL);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0 ^ u64::from(n)).wrapping_mul(KEY_MUL);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// The soft device (`soft0`).
#[derive(Debug)]
pub(crate) struct SoftDevice {
    pub(crate) dev_id: u64,
    pub(crate) sock_name: Vec<u8>,
    listener: Sock,
    /// Wakes the progress thread: from this process, and per connection the refill doorbell
    /// a peer rings when a ring of ours fed by an SRQ runs low.
    wake: BellSet,
    next_key: AtomicU32,
    next_id: AtomicU64,
    timer_seq: AtomicU64,
    pub(crate) qps: Mutex<HashMap<u32, Weak<SoftQp>>>,
    pub(crate) mrs: RwLock<HashMap<u32, Weak<SoftMr>, KeyHash>>,
    /// Memory windows by key index ([`super::mw`]).
    pub(crate) mws: Mutex<HashMap<u32, Weak<super::mw::SoftMw>>>,
    next_mw: AtomicU32,
    /// MRs of user memory (`reg_user`) alive: while there are none, receive SGEs need no
    /// lookup to be refused as user memory.
    pub(crate) user_mrs: AtomicUsize,
    /// Probe nonces we expect ([`super::probes`]: bounded).
    probes: Mutex<Probes>,
    watches: Mutex<Vec<Watch>>,
    timers: Mutex<BinaryHeap<Reverse<Timer>>>,
    /// Asynchronous events of the device.
    pub(crate) events: Arc<EventHub>,
    /// SRQs of the device: woken (a refill doorbell of `wake`), the progress thread tops up
    /// the rings they lend to.
    pub(crate) srqs: Mutex<Vec<Weak<SoftSrq>>>,
    /// Who may connect, and who may be sent memfds ([`super::trust`]).
    pub(crate) trust: Trust,
}

impl SoftDevice {
    fn start() -> Result<Arc<SoftDevice>> {
        let mut rng = rand::rng();
        let dev_id: u64 = rng.random();
        let name = format!(
            "bx-soft-{}-{:016x}",
            std::process::id(),
            rng.random::<u64>()
        );
        let listener = Sock::listen(name.as_bytes()).map_err(|source| Error::Os {
            what: "bind soft device socket",
            source,
        })?;
        let dev = Arc::new(SoftDevice {
            dev_id,
            sock_name: name.into_bytes(),
            listener,
            wake: BellSet::new()?,
            next_key: AtomicU32::new(rng.random_range(1..0x1000_0000)),
            next_id: AtomicU64::new(1),
            timer_seq: AtomicU64::new(0),
            qps: Mutex::new(HashMap::new()),
            mrs: RwLock::new(HashMap::default()),
            mws: Mutex::new(HashMap::new()),
            next_mw: AtomicU32::new(1),
            user_mrs: AtomicUsize::new(0),
            probes: Mutex::new(Probes::default()),
            watches: Mutex::new(Vec::new()),
            timers: Mutex::new(BinaryHeap::new()),
            events: Arc::new(EventHub::default()),
            srqs: Mutex::new(Vec::new()),
            trust: Trust::from_env(),
        });
        let d = dev.clone();
        std::thread::Builder::new()
            .name("bx-soft0".into())
            .spawn(move || d.run())
            .map_err(|source| Error::Os {
                what: "spawn soft progress thread",
                source,
            })?;
        Ok(dev)
    }

    /// A fresh 24-bit QP number, unused on this device, drawn at random: a process that
    /// passed a probe cannot guess the number of a QP that is about to connect (it could
    /// attach to it first, see `SoftQp::attach_peer`) from the numbers of its own links.
    pub(crate) fn alloc_qpn(&self) -> u32 {
        let qps = self.qps.lock();
        let mut rng = rand::rng();
        loop {
            let n = rng.random_range(1..=0xff_ffff);
            if !qps.contains_key(&n) {
                return n;
            }
        }
    }

    /// A fresh key, unused on this device (lkey = rkey); never with
    /// [`super::mw::MW_KEY_BIT`], which marks memory windows' rkeys.
    pub(crate) fn alloc_key(&self) -> u32 {
        let mrs = self.mrs.read();
        loop {
            let k = self.next_key.fetch_add(1, Ordering::Relaxed);
            if k != 0 && k & super::mw::MW_KEY_BIT == 0 && !mrs.contains_key(&k) {
                return k;
            }
        }
    }

    /// A fresh id for a PD or a shared region.
    pub(crate) fn alloc_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// A new memory window of `pd` under a key index no live window has.
    pub(crate) fn alloc_mw(&self, pd: Arc<super::pd::SoftPd>) -> Result<Arc<super::mw::SoftMw>> {
        let mut mws = self.mws.lock();
        mws.retain(|_, w| w.strong_count() > 0);
        if mws.len() >= super::mw::MW_INDEX_MASK as usize {
            return Err(crate::Error::Os {
                what: "alloc_mw",
                source: std::io::Error::from_raw_os_error(libc::ENOMEM),
            });
        }
        loop {
            let i = self.next_mw.fetch_add(1, Ordering::Relaxed) & super::mw::MW_INDEX_MASK;
            if i != 0 && !mws.contains_key(&i) {
                let mw = Arc::new(super::mw::SoftMw::new(pd, i));
                mws.insert(i, Arc::downgrade(&mw));
                return Ok(mw);
            }
        }
    }

    /// The memory window whose key index `rkey` names, if alive.
    pub(crate) fn lookup_mw(&self, rkey: u32) -> Option<Arc<super::mw::SoftMw>> {
        let i = super::mw::SoftMw::index_of(rkey)?;
        self.mws.lock().get(&i).and_then(Weak::upgrade)
    }

    #[inline]
    pub(crate) fn lookup_mr(&self, key: u32) -> Option<Arc<SoftMr>> {
        self.mrs.read().get(&key).and_then(Weak::upgrade)
    }

    /// Runs `qp.on_timer()` on the progress thread at `at` (or soon after).
    pub(crate) fn schedule(&self, at: Instant, qp: Weak<SoftQp>) {
        let seq = self.timer_seq.fetch_add(1, Ordering::Relaxed);
        let mut timers = self.timers.lock();
        // The progress thread sleeps until the earliest timer: wake it only for an earlier one.
        let earlier = timers.peek().is_none_or(|Reverse(t)| at < t.at);
        timers.push(Reverse(Timer { at, seq, qp }));
        drop(timers);
        if earlier {
            self.wake.signal();
        }
    }

    pub(crate) fn watch(&self, w: Watch) {
        self.watches.lock().push(w);
        self.wake.signal();
    }

    pub(crate) fn wake(&self) {
        self.wake.signal();
    }

    /// A refill doorbell for one peer connection of a QP fed by an SRQ: it wakes the
    /// progress thread ([`BellSet::offer`]).
    pub(crate) fn offer_refill_bell(&self) -> Result<(BellIn, OwnedFd)> {
        self.wake.offer()
    }

    /// Lets every SRQ top up the rings it lends to.
    fn refill_srqs(&self) {
        let srqs: Vec<Arc<SoftSrq>> = {
            let mut s = self.srqs.lock();
            s.retain(|w| w.strong_count() > 0);
            s.iter().filter_map(Weak::upgrade).collect()
        };
        for srq in srqs {
            srq.refill_all();
        }
    }

    fn take_nonce(&self, nonce: u64) -> bool {
        self.probes.lock().take(nonce, Instant::now())
    }

    // ---- progress thread ----

    fn run(self: Arc<Self>) {
        let mut handshakes: Vec<(Sock, Instant)> = Vec::new();
        let mut buf = vec![0u8; MAX_MSG];
        loop {
            let watches = self.watches.lock().clone();
            let mut pfds: Vec<libc::pollfd> =
                Vec::with_capacity(2 + handshakes.len() + watches.len());
            let pfd = |fd: RawFd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            pfds.push(pfd(self.listener.raw()));
            pfds.push(pfd(self.wake.fd()));
            pfds.extend(handshakes.iter().map(|(s, _)| pfd(s.raw())));
            pfds.extend(watches.iter().map(|w| pfd(w.sock().raw())));

            let now = Instant::now();
            let mut wait = Duration::from_secs(1);
            if let Some(Reverse(t)) = self.timers.lock().peek() {
                wait = wait.min(t.at.saturating_duration_since(now));
            }
            let ts = libc::timespec {
                tv_sec: wait.as_secs() as libc::time_t,
                tv_nsec: wait.subsec_nanos() as libc::c_long,
            };
            // SAFETY: `pfds` is a valid array of `pfds.len()` pollfds; `ts` is a valid timespec;
            // a NULL sigmask leaves the mask unchanged.
            let r = unsafe {
                libc::ppoll(
                    pfds.as_mut_ptr(),
                    pfds.len() as libc::nfds_t,
                    &ts,
                    std::ptr::null(),
                )
            };
            if r < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    tracing::warn!("soft device poll: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                }
                continue;
            }
            if pfds[1].revents != 0 {
                self.wake.drain();
                self.refill_srqs();
            }
            // Handshakes first (indices refer to the current vector), then new connections.
            let hs_base = 2;
            let mut keep = Vec::with_capacity(handshakes.len());
            for (i, (sock, since)) in handshakes.drain(..).enumerate() {
                if pfds[hs_base + i].revents == 0 {
                    if since.elapsed() < HANDSHAKE_TIMEOUT {
                        keep.push((sock, since));
                    }
                    continue;
                }
                match sock.recv(&mut buf, false) {
                    Ok(Recv::Msg(n, fds)) => self.first_message(sock, &buf[..n], fds),
                    Ok(Recv::Empty) => keep.push((sock, since)),
                    Ok(Recv::Eof) | Err(_) => {}
                }
            }
            handshakes = keep;
            if pfds[0].revents != 0 {
                loop {
                    match self.listener.accept() {
                        Ok(Some(s)) => match self.trust.check(&s, false) {
                            Ok(()) => handshakes.push((s, Instant::now())),
                            // Closed unread: another uid gets nothing from us. Logged at debug
                            // level, so a refused process cannot flood the log.
                            Err(why) => tracing::debug!("soft device: connection refused: {why}"),
                        },
                        Ok(None) => break,
                        Err(e) => {
                            tracing::warn!("soft device accept: {e}");
                            break;
                        }
                    }
                }
            }
            let w_base = pfds.len() - watches.len();
            let mut gone: Vec<Arc<Sock>> = Vec::new();
            for (i, w) in watches.iter().enumerate() {
                let Some(qp) = w.qp().upgrade() else {
                    gone.push(w.sock().clone());
                    continue;
                };
                if pfds[w_base + i].revents == 0 {
                    continue;
                }
                let alive = match w {
                    // Not the channel of the QP's peer (any more): dropped below.
                    Watch::Inbound { sock, .. } if !qp.has_peer_on(sock) => false,
                    Watch::Inbound { .. } => qp.pump_inbound(),
                    // Our channel to the peer carries the peer's announcements too once the
                    // peer's QP connected back over it (its first message, a Connect).
                    Watch::Outbound { sock, .. } if qp.has_peer_on(sock) => qp.pump_inbound(),
                    Watch::Outbound { sock, .. } => loop {
                        match sock.recv(&mut buf, false) {
                            Ok(Recv::Msg(n, fds)) => match Msg::decode(&buf[..n]) {
                                Some(Msg::Connect(c)) if c.dst_qpn == qp.qpn => {
                                    match self.attach(c, fds, sock) {
                                        Ok(_) => {
                                            let ok = Msg::ConnectReply {
                                                ok: true,
                                                reason: String::new(),
                                            };
                                            if sock.send(&ok.encode(), &[]).is_err() {
                                                break false;
                                            }
                                            break qp.pump_inbound();
                                        }
                                        Err(reason) => {
                                            tracing::debug!(
                                                "soft device refused a connect: {reason}"
                                            );
                                            let no = Msg::ConnectReply { ok: false, reason };
                                            let _ = sock.send(&no.encode(), &[]);
                                            break false;
                                        }
                                    }
                                }
                                _ => continue,
                            },
                            Ok(Recv::Empty) => break true,
                            Ok(Recv::Eof) | Err(_) => break false,
                        }
                    },
                };
                if !alive {
                    gone.push(w.sock().clone());
                    qp.on_chan_ended(w.sock(), matches!(w, Watch::Inbound { .. }));
                }
            }
            if !gone.is_empty() {
                self.watches
                    .lock()
                    .retain(|w| !gone.iter().any(|g| Arc::ptr_eq(g, w.sock())));
            }
            self.fire_timers();
        }
    }

    fn fire_timers(&self) {
        let now = Instant::now();
        loop {
            let t = {
                let mut timers = self.timers.lock();
                match timers.peek() {
                    Some(Reverse(t)) if t.at <= now => timers.pop().map(|Reverse(t)| t),
                    _ => None,
                }
            };
            let Some(t) = t else { break };
            if let Some(qp) = t.qp.upgrade() {
                qp.on_timer();
            }
        }
    }

    /// The first message on an accepted connection: a probe or a QP connect.
    fn first_message(&self, sock: Sock, b: &[u8], fds: Vec<PeerFd>) {
        match Msg::decode(b) {
            Some(Msg::Probe { nonce }) if fds.is_empty() => {
                let ok = self.take_nonce(nonce);
                if ok && let Ok(pid) = sock.peer_pid() {
                    self.trust.verify(pid);
                }
                let reply = Msg::ProbeReply {
                    ok,
                    dev_id: self.dev_id,
                };
                let _ = sock.send(&reply.encode(), &[]);
            }
            Some(Msg::Connect(c)) => {
                let sock = Arc::new(sock);
                let attached = self
                    .trust
                    .check(&sock, true)
                    .and_then(|()| self.attach(c, fds, &sock));
                match attached {
                    Ok(qp) => {
                        let reply = Msg::ConnectReply {
                            ok: true,
                            reason: String::new(),
                        };
                        if qp.reply_and_mark_chan_ready(&sock, &reply.encode()) {
                            self.watches.lock().push(Watch::Inbound {
                                qp: Arc::downgrade(&qp),
                                sock,
                            });
                        } else {
                            qp.on_chan_ended(&sock, true);
                        }
                    }
                    Err(reason) => {
                        tracing::debug!("soft device refused a connect: {reason}");
                        let reply = Msg::ConnectReply { ok: false, reason };
                        let _ = sock.send(&reply.encode(), &[]);
                    }
                }
            }
            _ => tracing::debug!("soft device: malformed first message dropped"),
        }
    }

    /// Attaches a connecting peer's ring, doorbell and channel to our QP `c.dst_qpn`.
    fn attach(
        &self,
        c: ConnectMsg,
        fds: Vec<PeerFd>,
        sock: &Arc<Sock>,
    ) -> std::result::Result<Arc<SoftQp>, String> {
        if fds.len() != connect_fds(c.flags) {
            return Err("connect: the fds do not match its flags".to_string());
        }
        let mut fds = fds.into_iter();
        let Some(ring_fd) = fds.next() else {
            return Err("connect needs a ring".to_string());
        };
        let bell_fd = (c.flags & CONNECT_BELL_BACK == 0)
            .then(|| fds.next())
            .flatten();
        let send_bell_fd = (c.flags & CONNECT_SEND_BELL != 0)
            .then(|| fds.next())
            .flatten();
        let stage_fd = (c.flags & CONNECT_STAGING != 0)
            .then(|| fds.next())
            .flatten();
        let refill_fd = (c.flags & CONNECT_REFILL != 0)
            .then(|| fds.next())
            .flatten();
        let qp = self
            .qps
            .lock()
            .get(&c.dst_qpn)
            .and_then(Weak::upgrade)
            .ok_or_else(|| format!("no QP {:#x} on this device", c.dst_qpn))?;
        if !(1..=limits::MAX_QP_WR).contains(&c.ring_cap)
            || !(1..=limits::MAX_SGE).contains(&c.ring_sge)
            || c.name.is_empty()
            || c.name.len() > MAX_NAME
        {
            return Err("connect parameters out of range".into());
        }
        let layout = Layout {
            cap: c.ring_cap,
            max_sge: c.ring_sge,
        };
        // We store into the peer's ring (receive claims, completions, `armed`): it must be
        // passed read-write, or this connection is refused.
        let ring_fd = ring_fd.into_memfd().ok_or("the ring is not a memfd")?;
        let map = Mapping::open_writable(ring_fd, 0, layout.bytes()).map_err(|e| e.to_string())?;
        let ring = Ring::new(Arc::new(map), layout).ok_or("ring region too small")?;
        tracing::debug!(
            "soft: QP {:#x} attached to peer device {:#x}",
            c.dst_qpn,
            c.src_dev
        );
        let staging = match stage_fd {
            Some(fd) if (1..=limits::MAX_STAGE).contains(&c.stage_len) => {
                let fd = fd.into_memfd().ok_or("the staging region is not a memfd")?;
                Some(Mapping::open(fd, 0, c.stage_len as usize).map_err(|e| e.to_string())?)
            }
            Some(_) => return Err("staging region size out of range".into()),
            None => None,
        };
        let doorbell = match bell_fd {
            Some(fd) => Bell::from_peer(fd)?,
            // Our own end of the pair our Connect gave this peer on this very channel.
            None => qp
                .ring_back(sock)
                .ok_or("a doorbell to ring back that was never given on this channel")?,
        };
        let parts = PeerParts {
            doorbell: Arc::new(doorbell),
            tx_bell: send_bell_fd.map(Bell::from_peer).transpose()?.map(Arc::new),
            staging,
            refill: refill_fd.map(Bell::from_peer).transpose()?,
        };
        let peer = Peer::new(
            c.name,
            c.src_qpn,
            ring,
            parts,
            Access(c.access),
            sock.clone(),
        );
        qp.attach_peer(peer)?;
        Ok(qp)
    }
}

impl ContextImpl for SoftDevice {
    fn name(&self) -> &str {
        super::DEVICE_NAME
    }

    fn query(&self) -> DeviceAttr {
        DeviceAttr {
            max_qp_wr: limits::MAX_QP_WR,
            max_sge: limits::MAX_SGE,
            max_inline_data: limits::MAX_INLINE,
            max_cqe: limits::MAX_CQE,
            max_mr_size: limits::MAX_MR_SIZE,
            active_mtu: limits::MTU,
            remote_access_needs_shared: true,
            mw_range_checked: true,
            max_msg_sz: crate::wr::MAX_MSG_LEN,
            max_reads_outstanding: limits::MAX_RD_ATOMIC,
        }
    }

    fn device_info(&self) -> DeviceInfo {
        let mut bytes = self.dev_id.to_le_bytes().to_vec();
        bytes.extend_from_slice(&self.sock_name);
        DeviceInfo {
            provider: PROVIDER_SOFT,
            bytes,
        }
    }

    fn probe(&self, peer: &DeviceInfo, nonce: u64) -> Result<bool> {
        if peer.provider != PROVIDER_SOFT || peer.bytes.len() <= 8 {
            return Ok(false);
        }
        let want_id = u64::from_le_bytes(peer.bytes[..8].try_into().expect("8 bytes"));
        let Ok(sock) = Sock::connect(&peer.bytes[8..], CONTROL_TIMEOUT) else {
            return Ok(false);
        };
        if let Err(why) = self.trust.check(&sock, false) {
            tracing::warn!("soft device: probe target refused: {why}");
            return Ok(false);
        }
        if sock.send(&Msg::Probe { nonce }.encode(), &[]).is_err() {
            return Ok(false);
        }
        let mut buf = [0u8; 64];
        let ok = match sock.recv(&mut buf, true) {
            Ok(Recv::Msg(n, _)) => matches!(
                Msg::decode(&buf[..n]),
                Some(Msg::ProbeReply { ok: true, dev_id }) if dev_id == want_id
            ),
            _ => false,
        };
        if ok && let Ok(pid) = sock.peer_pid() {
            self.trust.verify(pid);
        }
        Ok(ok)
    }

    fn expect_probe(&self, nonce: u64) {
        self.probes.lock().arm(nonce, Instant::now());
    }

    fn alloc_pd(&self) -> Result<Arc<dyn PdImpl>> {
        let dev = device()?;
        Ok(SoftPd::new(dev))
    }

    fn create_cq(&self, cqe: u32) -> Result<Arc<dyn CqImpl>> {
        if cqe > limits::MAX_CQE {
            return Err(Error::InvalidArgument(format!(
                "cqe {cqe} exceeds the device limit {}",
                limits::MAX_CQE
            )));
        }
        Ok(SoftCq::new(cqe.max(1), self.events.clone())?)
    }

    fn events(&self) -> &EventHub {
        &self.events
    }

    fn pump_events(&self) -> Result<()> {
        Ok(())
    }

    fn async_fd(&self) -> Option<RawFd> {
        None
    }
}
