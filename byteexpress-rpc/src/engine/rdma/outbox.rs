//! Messages waiting to go out on one QP, ordered by `byteexpress_flow::sched`.
//!
//! Every message is enqueued in a [`Scheduler`] under its logical connection (`conn_id` of
//! its header) and class: [`Class::Latency`] when it fits one chunk, [`Class::Bulk`] when it
//! is cut into several. The scheduler grants one chunk at a time through the engine's gate
//! (`byteexpress_flow::gate::admit_chunk`: a bulk chunk's credit reserve, the QP and device
//! windows; the round checked the SQ slot, CQ entry, send buffer and credit before), so a
//! small call waits behind at most one chunk of a bulk message. [`SchedMode::Fifo`] puts
//! every message on one connection and one class instead: plain first-in first-out over the
//! same chunks, for comparison.

use foldhash::{HashMap, HashMapExt};

use byteexpress_flow::sched::{Class, ConnId, MsgId, Offer, SchedConfig, Scheduler};

use super::send::OutMsg;
use crate::config::SchedMode;
use crate::message::Outgoing;
use crate::wire::header::Header;

/// Where the message of a [`Next`] is.
#[derive(Debug)]
pub(super) enum Source {
    /// In the outbox, under this id ([`Outbox::msg`]; [`Outbox::finish`] after its last chunk).
    Queued(MsgId),
    /// Granted on arrival, never queued ([`Outbox::offer`]): here.
    Bypassed(OutMsg),
}

/// The next chunk to post, as the scheduler granted it.
#[derive(Debug)]
pub(super) struct Next {
    /// Its header (credit fields still to fill).
    pub header: Header,
    /// Message it belongs to.
    pub msg: Source,
    /// Payload range after the header: offset and length (bytes).
    pub off: usize,
    pub len: usize,
    /// Wire bytes of the SEND, header included (what the window is charged).
    pub wire: u32,
    /// It is the message's last chunk.
    pub last: bool,
    /// The message has more than one chunk.
    pub chunked: bool,
}

/// Logical connections whose scheduler connections stay open while idle, at most (beyond
/// those with messages queued): one slab entry of the scheduler each.
const MAX_IDLE_CONNS: usize = 1024;

/// Queued messages of one link.
#[derive(Debug)]
pub(super) struct Outbox {
    mode: SchedMode,
    sched: Scheduler,
    /// Scheduler connection of each `conn_id` (Fair); opened on first use and kept while idle
    /// (so a message costs one lookup, not an open and a close), the idle ones closed when the
    /// map reaches `sweep_at` entries.
    conns: HashMap<u32, ConnId>,
    /// Map size at which idle connections are closed: [`MAX_IDLE_CONNS`], or twice the
    /// connections left busy by the last sweep if more (so sweeps stay amortised O(1)).
    sweep_at: usize,
    /// The one connection everything goes on (Fifo).
    fifo: Option<ConnId>,
    msgs: HashMap<MsgId, OutMsg>,
    /// Largest SEND (bytes, header included).
    chunk: usize,
}

impl Outbox {
    /// An empty outbox cutting messages into SENDs of at most `chunk` bytes (header included,
    /// more than the header).
    pub(super) fn new(mode: SchedMode, chunk: usize) -> Self {
        let c = u32::try_from(chunk).unwrap_or(u32::MAX);
        let cfg = match mode {
            SchedMode::Fair => SchedConfig::new(c, c, SchedConfig::DEFAULT_LATENCY_BURST),
            SchedMode::Fifo => SchedConfig::new(c, c, u32::MAX),
        }
        .expect("quantum = max_chunk >= 1 and burst >= 1");
        Outbox {
            mode,
            sched: Scheduler::new(cfg),
            conns: HashMap::new(),
            sweep_at: MAX_IDLE_CONNS,
            fifo: None,
            msgs: HashMap::new(),
            chunk: c as usize,
        }
    }

    /// Whether nothing waits for a grant (a message whose last chunk was granted waits only
    /// for [`Outbox::finish`], and does not count).
    pub(super) fn is_empty(&self) -> bool {
        self.sched.is_empty()
    }

    /// Queues `msg`.
    pub(super) fn push(&mut self, msg: Outgoing) {
        let msg = OutMsg::new(msg);
        let (conn, class, wire) = self.place(&msg);
        let id = self
            .sched
            .enqueue(conn, class, wire)
            .expect("open connection, at least a header's bytes");
        self.msgs.insert(id, msg);
    }

    /// Offers `msg` as it arrives ([`Scheduler::offer`]): when nothing waits and it fits one
    /// chunk, `gate(wire bytes, class)` is asked at once and, if it admits, the message is
    /// returned to post without being queued; otherwise it is queued as [`Outbox::push`] does
    /// and `None` returned (the gate was refused, or not asked).
    pub(super) fn offer(
        &mut self,
        msg: Outgoing,
        gate: impl FnOnce(u32, Class) -> bool,
    ) -> Option<Next> {
        let mut msg = OutMsg::new(msg);
        let (conn, class, wire) = self.place(&msg);
        let offer = self
            .sched
            .offer(conn, class, wire, gate)
            .expect("open connection, at least a header's bytes");
        match offer {
            Offer::Queued(id) => {
                self.msgs.insert(id, msg);
                None
            }
            Offer::Granted(g) => {
                let (header, off, len) = msg.next_chunk(self.chunk);
                debug_assert!(msg.done());
                Some(Next {
                    header,
                    msg: Source::Bypassed(msg),
                    off,
                    len,
                    wire: g.len,
                    last: true,
                    chunked: false,
                })
            }
        }
    }

    /// The scheduler connection, class and wire length (bytes) of `msg`; opens the
    /// connection if needed.
    fn place(&mut self, msg: &OutMsg) -> (ConnId, Class, u64) {
        let conn_id = msg.conn_id();
        let wire = msg.wire_len_in_chunks(self.chunk);
        let (conn, class) = match self.mode {
            SchedMode::Fifo => (
                *self.fifo.get_or_insert_with(|| self.sched.open()),
                Class::Latency,
            ),
            SchedMode::Fair => {
                let conn = match self.conns.get(&conn_id) {
                    Some(&conn) => conn,
                    None => {
                        if self.conns.len() >= self.sweep_at {
                            self.close_idle();
                        }
                        let conn = self.sched.open();
                        self.conns.insert(conn_id, conn);
                        conn
                    }
                };
                let class = if wire <= self.chunk as u64 {
                    Class::Latency
                } else {
                    Class::Bulk
                };
                (conn, class)
            }
        };
        (conn, class, wire)
    }

    /// Closes the scheduler connections with nothing queued (their DRR state is reset
    /// anyway) and forgets their `conn_id`s; the next sweep waits for [`MAX_IDLE_CONNS`] more
    /// than the busy ones left.
    fn close_idle(&mut self) {
        let sched = &mut self.sched;
        self.conns.retain(|_, &mut conn| {
            let idle = sched.is_idle(conn);
            if idle {
                let _ = sched.close(conn);
            }
            !idle
        });
        self.sweep_at = MAX_IDLE_CONNS.max(2 * self.conns.len());
    }

    /// The chunk the scheduler designates, if `gate(wire bytes, class)` admits it; `None` when
    /// nothing waits or the gate refused (the same chunk is designated next time).
    pub(super) fn next(&mut self, gate: impl FnOnce(u32, Class) -> bool) -> Option<Next> {
        let g = self.sched.next_by_class(gate)?;
        let msg = self
            .msgs
            .get_mut(&g.msg)
            .expect("every queued message is kept");
        let chunked = g.offset > 0 || !g.last;
        let (header, off, len) = msg.next_chunk(self.chunk);
        debug_assert_eq!(g.len as usize, header.encoded_len() + len);
        debug_assert_eq!(g.last, msg.done());
        Some(Next {
            header,
            msg: Source::Queued(g.msg),
            off,
            len,
            wire: g.len,
            last: g.last,
            chunked,
        })
    }

    /// The message a [`Next`] belongs to; dropped from the outbox with its last chunk by
    /// [`Outbox::finish`].
    pub(super) fn msg(&self, id: MsgId) -> &OutMsg {
        &self.msgs[&id]
    }

    /// Forgets a message whose last chunk was taken, and gives it back (kept by the engine
    /// until its SEND completes, for a fallback).
    pub(super) fn finish(&mut self, id: MsgId) -> Option<OutMsg> {
        self.msgs.remove(&id)
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::Metadata;
    use crate::wire::header::{HEADER_LEN, Kind};

    const CHUNK: usize = 1000;

    fn msg(conn_id: u32, call_id: u64, body: usize) -> Outgoing {
        Outgoing::new(
            Kind::Request,
            conn_id,
            call_id,
            "/m",
            &Metadata::new(),
            Bytes::from(vec![call_id as u8; body]),
        )
    }

    /// Takes every chunk the outbox grants (the gate always admits); returns (call_id, kind).
    fn drain(o: &mut Outbox) -> Vec<(u64, Kind)> {
        let mut out = Vec::new();
        while let Some(n) = o.next(|len, _| {
            assert!(len as usize <= CHUNK);
            true
        }) {
            assert_eq!(n.wire as usize, HEADER_LEN + n.len);
            out.push((n.header.call_id, n.header.kind));
            if n.last
                && let Source::Queued(id) = n.msg
            {
                o.finish(id);
            }
        }
        assert!(o.is_empty());
        out
    }

    #[test]
    fn fair_mode_lets_a_small_call_pass_a_queued_bulk_message_after_one_chunk() {
        let mut o = Outbox::new(SchedMode::Fair, CHUNK);
        o.push(msg(1, 1, 5 * CHUNK)); // bulk: 6 chunks
        o.push(msg(2, 2, 10)); // small, another connection
        let order = drain(&mut o);
        assert_eq!(order.len(), 7);
        assert_eq!(order[0], (2, Kind::Request), "latency class first");
        assert_eq!(order[1], (1, Kind::Request), "bulk's first chunk");
        assert!(order[2..].iter().all(|&c| c == (1, Kind::Continuation)));
    }

    #[test]
    fn fifo_mode_sends_whole_messages_in_arrival_order() {
        let mut o = Outbox::new(SchedMode::Fifo, CHUNK);
        o.push(msg(1, 1, 5 * CHUNK));
        o.push(msg(2, 2, 10));
        let order = drain(&mut o);
        assert_eq!(order.len(), 7);
        assert_eq!(
            order[6],
            (2, Kind::Request),
            "the small call waits for the whole push"
        );
    }

    #[test]
    fn chunks_of_a_message_fill_each_send_and_carry_every_payload_byte_once() {
        let mut o = Outbox::new(SchedMode::Fair, CHUNK);
        let m = msg(1, 1, 3 * CHUNK + 7);
        let payload = m.meta.len() + m.body.len();
        o.push(m);
        let mut next_off = 0;
        let mut more = Vec::new();
        while let Some(n) = o.next(|_, _| true) {
            assert_eq!(n.off, next_off, "payload in order, no gap");
            next_off += n.len;
            more.push(n.header.more());
            if !n.last {
                assert_eq!(n.wire as usize, CHUNK, "every chunk but the last is full");
            } else if let Source::Queued(id) = n.msg {
                o.finish(id);
            }
        }
        assert_eq!(next_off, payload);
        let (last, rest) = more.split_last().unwrap();
        assert!(
            !last && rest.iter().all(|&m| m),
            "FLAG_MORE on all but the last"
        );
    }

    #[test]
    fn an_offered_small_message_on_an_empty_outbox_is_granted_at_once_without_queueing() {
        let mut o = Outbox::new(SchedMode::Fair, CHUNK);
        let n = o.offer(msg(1, 7, 10), |_, class| {
            assert_eq!(class, Class::Latency);
            true
        });
        let n = n.expect("granted on arrival");
        assert!(matches!(n.msg, Source::Bypassed(_)));
        assert!(n.last && !n.chunked);
        assert_eq!(n.header.call_id, 7);
        assert_eq!(n.wire as usize, HEADER_LEN + n.len);
        assert!(o.is_empty(), "nothing was queued");
        assert_eq!(
            o.conns.len(),
            1,
            "its scheduler connection stays open, idle"
        );
        assert!(o.sched.is_empty());
    }

    #[test]
    fn an_offered_message_is_queued_when_refused_too_large_or_behind_others() {
        // Refused by the gate: queued, and granted later by `next`.
        let mut o = Outbox::new(SchedMode::Fair, CHUNK);
        assert!(o.offer(msg(1, 1, 10), |_, _| false).is_none());
        assert_eq!(drain(&mut o), vec![(1, Kind::Request)]);
        // Larger than one chunk: queued without asking the gate.
        assert!(
            o.offer(msg(1, 2, 3 * CHUNK), |_, _| panic!("no bypass for chunks"))
                .is_none()
        );
        // Behind a queued message: queued without asking the gate, in order.
        assert!(
            o.offer(msg(2, 3, 10), |_, _| panic!("no bypass behind a queue"))
                .is_none()
        );
        let order = drain(&mut o);
        assert_eq!(order.len(), 5);
        assert!(order.contains(&(3, Kind::Request)));
    }

    #[test]
    fn a_refused_chunk_is_offered_again_and_nothing_is_lost() {
        let mut o = Outbox::new(SchedMode::Fair, CHUNK);
        o.push(msg(1, 1, 10));
        assert!(o.next(|_, _| false).is_none());
        let n = o.next(|_, _| true).expect("offered again");
        assert_eq!(n.header.call_id, 1);
        assert!(n.last && !n.chunked);
    }

    #[test]
    fn a_message_of_exactly_one_chunk_is_one_send_and_one_byte_more_is_two() {
        for (extra, sends) in [(0usize, 1usize), (1, 2)] {
            let mut o = Outbox::new(SchedMode::Fair, CHUNK);
            let probe = msg(1, 1, 0);
            let body = CHUNK - HEADER_LEN - probe.meta.len() + extra;
            o.push(msg(1, 1, body));
            let order = drain(&mut o);
            assert_eq!(order.len(), sends, "body of {body} bytes");
        }
    }

    #[test]
    fn idle_connections_are_closed_when_the_map_is_full_and_busy_ones_keep_their_messages() {
        let mut o = Outbox::new(SchedMode::Fair, CHUNK);
        // Each logical connection sends one message, granted on arrival: all stay open, idle.
        for c in 0..MAX_IDLE_CONNS as u32 {
            assert!(o.offer(msg(c, c.into(), 10), |_, _| true).is_some());
        }
        assert_eq!(o.conns.len(), MAX_IDLE_CONNS);
        // Connection 0 gets busy: a message queued.
        o.push(msg(0, 5000, 10));
        // A new conn_id finds the map full: every idle connection is closed, the busy one kept.
        let new = MAX_IDLE_CONNS as u32;
        o.push(msg(new, 5001, 10));
        assert_eq!(o.conns.len(), 2, "connection 0 (busy) and the new one");
        assert!(o.conns.contains_key(&0) && o.conns.contains_key(&new));
        let mut order = drain(&mut o);
        order.sort_by_key(|&(call, _)| call);
        assert_eq!(
            order,
            vec![(5000, Kind::Request), (5001, Kind::Request)],
            "the queued messages survived the sweep"
        );
    }
}
