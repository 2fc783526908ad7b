//! Registered buffers owned by posted work requests, each until its completion.
//!
//! The invariant of DESIGN.md: memory named in a posted WR belongs to that WR until its
//! completion arrives, flush completions included; only then may it return to the pool. With
//! [`PostedBufs`] the types enforce it: posting *moves* the [`RegisteredBuf`] in, and the only
//! way to get it back is [`PostedBufs::complete`] with the WR's completion (or dropping the whole
//! set once its QP can no longer touch the memory: after the QP is destroyed or flushed).

use std::collections::HashMap;

use byteexpress_verbs::{Qp, RecvWr, SendWr, Wc, WcOpcode, WrOp};

use crate::RegisteredBuf;

/// Buffers of posted WRs on one QP, keyed by wr_id, each with caller data `T` (e.g. what the WR
/// charged to a window). wr_ids carry `tag` in their top 8 bits so that several sets on one CQ
/// (sends and receives) never confuse each other's completions.
#[derive(Debug)]
pub struct PostedBufs<T = ()> {
    bufs: HashMap<u64, (RegisteredBuf, T)>,
    tag: u64,
    next: u64,
}

const TAG_SHIFT: u32 = 56;

impl<T> PostedBufs<T> {
    /// An empty set whose wr_ids carry `tag` in bits 56..64.
    pub fn new(tag: u8) -> Self {
        PostedBufs {
            bufs: HashMap::new(),
            tag: (tag as u64) << TAG_SHIFT,
            next: 0,
        }
    }

    fn next_wr_id(&mut self) -> u64 {
        self.next = (self.next + 1) & ((1 << TAG_SHIFT) - 1);
        self.tag | self.next
    }

    /// True when `wr_id` was issued by this set.
    pub fn owns(&self, wr_id: u64) -> bool {
        wr_id >> TAG_SHIFT == self.tag >> TAG_SHIFT
    }

    /// Posts the filled bytes of `buf` as one signaled send-queue WR of `op` (`ibv_post_send(3)`)
    /// and keeps `buf` and `data` until its completion. Returns the wr_id. On error nothing was
    /// posted and the buffer comes back with the error.
    pub fn post_send(
        &mut self,
        qp: &Qp,
        buf: RegisteredBuf,
        op: WrOp,
        data: T,
    ) -> Result<u64, (byteexpress_verbs::Error, RegisteredBuf)> {
        let wr_id = self.next_wr_id();
        let wr = SendWr {
            wr_id,
            op,
            sg_list: &[buf.sge()],
            signaled: true,
            inline: false,
        };
        match qp.post_send(&wr) {
            Ok(()) => {
                self.bufs.insert(wr_id, (buf, data));
                Ok(wr_id)
            }
            Err(e) => Err((e, buf)),
        }
    }

    /// Posts the whole of `buf` as a receive (`ibv_post_recv(3)`) and keeps it and `data` until
    /// its completion. Returns the wr_id. On error nothing was posted and the buffer comes back.
    pub fn post_recv(
        &mut self,
        qp: &Qp,
        buf: RegisteredBuf,
        data: T,
    ) -> Result<u64, (byteexpress_verbs::Error, RegisteredBuf)> {
        let wr_id = self.next_wr_id();
        match qp.post_recv(&RecvWr {
            wr_id,
            sg_list: &[buf.recv_sge()],
        }) {
            Ok(()) => {
                self.bufs.insert(wr_id, (buf, data));
                Ok(wr_id)
            }
            Err(e) => Err((e, buf)),
        }
    }

    /// Hands back the buffer (and data) of the WR `wc` completes, whatever its status: the
    /// device is done with it. For a successful receive its length is set to `byte_len`.
    /// `None` when the completion is not for a WR of this set.
    pub fn complete(&mut self, wc: &Wc) -> Option<(RegisteredBuf, T)> {
        let (mut buf, data) = self.bufs.remove(&wc.wr_id)?;
        if matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
            && wc.status == byteexpress_verbs::WcStatus::Success
        {
            buf.set_len(wc.byte_len as usize);
        }
        Some((buf, data))
    }

    /// WRs outstanding.
    pub fn len(&self) -> usize {
        self.bufs.len()
    }

    /// True when no WR is outstanding.
    pub fn is_empty(&self) -> bool {
        self.bufs.is_empty()
    }

    /// The caller data of every outstanding WR.
    pub fn data(&self) -> impl Iterator<Item = &T> {
        self.bufs.values().map(|(_, d)| d)
    }
}
