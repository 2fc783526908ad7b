//! The RDMA engine: one RC QP per link, one SEND per message, receiver credits from
//! `byteexpress-flow` so a SEND never finds the peer without a posted receive (no RNR).
//!
//! Receive buffers come from a pool registered once; a received body reaches the application as
//! a slice of its receive buffer (zero copy) and the buffer returns to the pool when the
//! application drops it. A fresh buffer is posted in its place at once, so credits flow back
//! however long the application holds on; only when the pool has no free buffer left is the
//! message copied out and its own buffer re-posted.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use byteexpress_flow::credit::{CreditConfig, Credits, MsgKind, Piggyback};
use byteexpress_mem::{BufPool, PoolBuf};
use byteexpress_verbs::{Cq, Qp, RecvWr, SendWr, Wc, WcOpcode, WcStatus, WrOp};
use bytes::Bytes;
use tokio::sync::mpsc;

use super::tcp::{Closer, peer_error};
use super::{Dispatch, LinkTx};
use crate::message::{Incoming, Outgoing};
use crate::wire::header::{FLAG_SLOT_RETURN, Kind};
use crate::{Code, Status, Transport};

/// What an RDMA engine runs on; built by link set-up.
#[derive(Debug)]
pub(crate) struct RdmaParts {
    pub qp: Qp,
    pub cq: Cq,
    /// Receive buffers: at least `grant + 1` posted, the rest for the application to hold.
    pub recv_pool: BufPool,
    /// Send buffers, each as large as the peer's receive buffers.
    pub send_pool: BufPool,
    /// Receive buffers each side posts for the other's data (send credits), the same on both
    /// sides of a link: the smaller of the client's and the server's configured grant.
    pub grant: u32,
    /// Hybrid polling budget.
    pub busy_poll: Duration,
}

/// Receives posted on a link's QP: buffer by wr_id, and the next wr_id to use.
#[derive(Debug, Default)]
pub(crate) struct Posted {
    bufs: HashMap<u64, PoolBuf>,
    next_wr: u64,
}

/// Posts the initial `grant + 1` receives (the QP must be past RESET); call before the peer may
/// send.
pub(crate) fn post_initial_receives(parts: &RdmaParts) -> Result<Posted, Status> {
    let mut posted = Posted {
        bufs: HashMap::new(),
        next_wr: 1,
    };
    for _ in 0..=parts.grant {
        let buf = parts
            .recv_pool
            .alloc()
            .map_err(|e| Status::new(Code::ResourceExhausted, e.to_string()))?;
        post_recv(&parts.qp, buf, &mut posted.bufs, &mut posted.next_wr)?;
    }
    Ok(posted)
}

fn post_recv(
    qp: &Qp,
    buf: PoolBuf,
    posted: &mut HashMap<u64, PoolBuf>,
    next_wr: &mut u64,
) -> Result<(), Status> {
    let wr_id = *next_wr;
    *next_wr += 1;
    qp.post_recv(&RecvWr {
        wr_id,
        sg_list: &[buf.recv_sge()],
    })
    .map_err(|e| Status::new(Code::Unavailable, format!("post_recv: {e}")))?;
    posted.insert(wr_id, buf);
    Ok(())
}

/// Starts the engine. `ctrl_dead` resolves when the TCP control connection ends.
pub(crate) fn spawn(
    parts: RdmaParts,
    posted: Posted,
    max_message: usize,
    dispatch: Arc<dyn Dispatch>,
    ctrl_dead: tokio::sync::oneshot::Receiver<Status>,
) -> LinkTx {
    let (tx, rx) = mpsc::unbounded_channel();
    let link = LinkTx::new(tx, Transport::Rdma, max_message);
    let closer = Arc::new(Closer::new(dispatch.clone(), link.clone()));
    let credits = Credits::new(
        CreditConfig::new(parts.grant)
            .unwrap_or_else(|_| CreditConfig::new(1).expect("grant 1 is valid")),
    );
    let engine = Engine {
        send_slots: parts.qp.cap().max_send_wr as usize,
        parts,
        recv_posted: posted.bufs,
        send_posted: HashMap::new(),
        next_wr: posted.next_wr,
        credits,
        queue: VecDeque::new(),
        link: link.clone(),
        dispatch,
        copied_out: 0,
    };
    tokio::spawn(engine.run(rx, ctrl_dead, closer));
    link
}

struct Engine {
    parts: RdmaParts,
    recv_posted: HashMap<u64, PoolBuf>,
    send_posted: HashMap<u64, PoolBuf>,
    next_wr: u64,
    credits: Credits,
    queue: VecDeque<Outgoing>,
    send_slots: usize,
    link: LinkTx,
    dispatch: Arc<dyn Dispatch>,
    copied_out: u64,
}

impl Engine {
    async fn run(
        mut self,
        mut rx: mpsc::UnboundedReceiver<Outgoing>,
        mut ctrl_dead: tokio::sync::oneshot::Receiver<Status>,
        closer: Arc<Closer>,
    ) {
        let why = loop {
            match self.step(&mut rx) {
                Ok(true) => continue,
                Ok(false) => {}
                Err(why) => break why,
            }
            let cq = self.parts.cq.clone();
            tokio::select! {
                m = rx.recv() => match m {
                    Some(m) => self.queue.push_back(m),
                    None => break Status::new(Code::Unavailable, "link dropped"),
                },
                r = cq.ready(self.parts.busy_poll) => if let Err(e) = r {
                    break Status::new(Code::Unavailable, format!("CQ: {e}"));
                },
                why = &mut ctrl_dead => break why.unwrap_or_else(|_| Status::new(Code::Unavailable, "control connection closed")),
                _ = self.link.close_requested() => break Status::new(Code::Unavailable, "link closed"),
            }
        };
        let _ = self.parts.qp.to_err();
        closer.close(why);
        tracing::debug!(copied_out = self.copied_out, "RDMA engine stopped");
    }

    /// One round of work; Ok(true) when something happened (run again before sleeping).
    fn step(&mut self, rx: &mut mpsc::UnboundedReceiver<Outgoing>) -> Result<bool, Status> {
        let mut wcs = [Wc::default(); 32];
        let n = self
            .parts
            .cq
            .poll(&mut wcs)
            .map_err(|e| Status::new(Code::Unavailable, format!("poll_cq: {e}")))?;
        for wc in &wcs[..n] {
            self.on_completion(wc)?;
        }
        while let Ok(m) = rx.try_recv() {
            self.queue.push_back(m);
        }
        let sent = self.send_queued()?;
        Ok(n > 0 || sent)
    }

    fn on_completion(&mut self, wc: &Wc) -> Result<(), Status> {
        if wc.status != WcStatus::Success {
            return Err(Status::new(
                Code::Unavailable,
                format!("RDMA completion {:?} on wr {}", wc.status, wc.wr_id),
            ));
        }
        match wc.opcode {
            WcOpcode::Recv => self.on_receive(wc),
            _ => {
                self.send_posted.remove(&wc.wr_id);
                Ok(())
            }
        }
    }

    fn on_receive(&mut self, wc: &Wc) -> Result<(), Status> {
        let Some(mut buf) = self.recv_posted.remove(&wc.wr_id) else {
            return Err(Status::new(
                Code::Internal,
                format!("receive completion for unknown wr {}", wc.wr_id),
            ));
        };
        buf.set_len(wc.byte_len as usize);
        // Keep `grant + 1` receives posted: a fresh buffer if the pool has one (the message stays
        // where it landed, zero copy), else copy the message out and re-post its own buffer.
        let msg = match self.parts.recv_pool.alloc() {
            Ok(fresh) => {
                post_recv(
                    &self.parts.qp,
                    fresh,
                    &mut self.recv_posted,
                    &mut self.next_wr,
                )?;
                buf.freeze()
            }
            Err(_) => {
                self.copied_out += 1;
                let copy = Bytes::copy_from_slice(buf.as_slice());
                post_recv(
                    &self.parts.qp,
                    buf,
                    &mut self.recv_posted,
                    &mut self.next_wr,
                )?;
                copy
            }
        };
        let msg = Incoming::parse(msg).map_err(|e| Status::new(Code::Internal, e.to_string()))?;
        let kind = if msg.header.kind == Kind::CreditUpdate {
            MsgKind::CreditUpdate
        } else {
            MsgKind::Data
        };
        let pb = Piggyback {
            credits: msg.header.credits,
            slot_return: msg.header.flags & FLAG_SLOT_RETURN != 0,
        };
        self.credits
            .on_receive(kind, pb)
            .map_err(|e| Status::new(Code::Internal, format!("credits: {e}")))?;
        self.credits
            .on_reposted(kind)
            .map_err(|e| Status::new(Code::Internal, format!("credits: {e}")))?;
        match msg.header.kind {
            Kind::CreditUpdate => Ok(()),
            Kind::Error => Err(peer_error(&msg)),
            _ => {
                self.dispatch.incoming(&self.link, msg);
                Ok(())
            }
        }
    }

    /// Posts queued messages while credits, send-queue slots and send buffers last, then an
    /// explicit credit update if one is due.
    fn send_queued(&mut self) -> Result<bool, Status> {
        let mut sent = false;
        while !self.queue.is_empty() && self.send_posted.len() < self.send_slots {
            let Some(pb) = self.credits.try_send_data() else {
                break;
            };
            let msg = self.queue.pop_front().expect("queue checked non-empty");
            self.post(msg.final_header(), &msg.meta, &msg.body, pb)?;
            sent = true;
        }
        if self.send_posted.len() < self.send_slots
            && let Some(pb) = self.credits.poll_update()
        {
            self.post(
                crate::wire::header::Header::new(Kind::CreditUpdate),
                &[],
                &[],
                pb,
            )?;
            sent = true;
        }
        Ok(sent)
    }

    fn post(
        &mut self,
        mut h: crate::wire::header::Header,
        meta: &[u8],
        body: &[u8],
        pb: Piggyback,
    ) -> Result<(), Status> {
        h.credits = pb.credits;
        if pb.slot_return {
            h.flags |= FLAG_SLOT_RETURN;
        }
        let mut buf = self
            .parts
            .send_pool
            .alloc()
            .map_err(|e| Status::new(Code::ResourceExhausted, e.to_string()))?;
        for part in [&h.encode()[..], meta, body] {
            buf.extend_from_slice(part)
                .map_err(|e| Status::new(Code::ResourceExhausted, e.to_string()))?;
        }
        let wr_id = self.next_wr;
        self.next_wr += 1;
        let wr = SendWr {
            wr_id,
            op: WrOp::Send,
            sg_list: &[buf.sge()],
            signaled: true,
            inline: false,
        };
        self.parts
            .qp
            .post_send(&wr)
            .map_err(|e| Status::new(Code::Unavailable, format!("post_send: {e}")))?;
        self.send_posted.insert(wr_id, buf);
        Ok(())
    }
}
