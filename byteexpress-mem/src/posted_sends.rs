//! Send-queue WRs of one QP, signaled or not, inline or not, in posting order, each owning its
//! buffer (unless inline) until a completion covers it.
//!
//! Selective signaling (`ibv_post_send(3)`): an unsignaled WR that succeeds produces no CQE;
//! an RC QP completes its send queue in order, so the CQE of a later WR means it is done too.
//! A WR that fails always produces a CQE, and once the QP is in ERR every WR still outstanding
//! is flushed with one (`byteexpress-verbs`'s conformance tests pin both, on both providers).
//! Hence the rule of [`PostedSends::complete`]: any completion of WR n (success, error or
//! flush) hands back n and every WR posted before it that is still held: those completed
//! silently, with success (the first WR to fail is the one that reports the error).
//!
//! An inline WR's bytes are copied into the WQE at post time: its buffer goes back to the
//! pool as soon as the post returns, and only the caller data waits for the completion.

use std::collections::VecDeque;

use byteexpress_verbs::{Qp, SendWr, Wc, WrOp};

use crate::RegisteredBuf;

/// How to post one send-queue WR ([`PostedSends::post`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SendFlags {
    /// `IBV_SEND_SIGNALED`: a CQE on success too. An unsignaled WR completes with a later
    /// signaled one (or with its own CQE if it fails).
    pub signaled: bool,
    /// `IBV_SEND_INLINE`: the bytes are copied at post; at most the QP's granted
    /// `max_inline_data`. The buffer is released when the post returns.
    pub inline: bool,
}

/// One WR a completion hands back ([`PostedSends::complete`]).
#[derive(Debug)]
pub struct Done<T> {
    /// The WR's buffer; `None` for an inline WR (released at post).
    pub buf: Option<RegisteredBuf>,
    /// The caller data given at post.
    pub data: T,
    /// True for the WR the completion names (its status is the completion's); false for an
    /// earlier unsignaled WR it covers, which completed with success and no CQE of its own.
    pub named: bool,
}

#[derive(Debug)]
struct Entry<T> {
    wr_id: u64,
    buf: Option<RegisteredBuf>,
    data: T,
}

/// Send WRs of one QP not yet known complete, oldest first, keyed by consecutive wr_ids that
/// carry `tag` in their top 8 bits (as [`crate::PostedBufs`], so several sets on one CQ never
/// confuse each other's completions).
#[derive(Debug)]
pub struct PostedSends<T = ()> {
    wrs: VecDeque<Entry<T>>,
    tag: u64,
    next: u64,
}

const TAG_SHIFT: u32 = 56;
const ID_MASK: u64 = (1 << TAG_SHIFT) - 1;

impl<T> PostedSends<T> {
    /// An empty set whose wr_ids carry `tag` in bits 56..64.
    pub fn new(tag: u8) -> Self {
        PostedSends {
            wrs: VecDeque::new(),
            tag: u64::from(tag) << TAG_SHIFT,
            next: 0,
        }
    }

    /// True when `wr_id` was issued by this set.
    pub fn owns(&self, wr_id: u64) -> bool {
        wr_id >> TAG_SHIFT == self.tag >> TAG_SHIFT
    }

    /// Posts the filled bytes of `buf` as one send-queue WR of `op` with `flags`
    /// (`ibv_post_send(3)`) and keeps `data`, and `buf` unless inline, until a completion
    /// covers the WR. Returns the wr_id. On error nothing was posted and the buffer comes back
    /// with the error (an inline post longer than the QP's `max_inline_data` is refused
    /// `InvalidArgument`).
    pub fn post(
        &mut self,
        qp: &Qp,
        buf: RegisteredBuf,
        op: WrOp,
        data: T,
        flags: SendFlags,
    ) -> Result<u64, (byteexpress_verbs::Error, RegisteredBuf)> {
        let sge = [buf.sge()];
        let wr_id = match self.post_wr(qp, op, &sge, flags) {
            Ok(wr_id) => wr_id,
            Err(e) => return Err((e, buf)),
        };
        // Inline: the device copied the bytes at post; the buffer returns to its pool here.
        let buf = (!flags.inline).then_some(buf);
        self.wrs.push_back(Entry { wr_id, buf, data });
        Ok(wr_id)
    }

    /// Posts one WR under the next wr_id of this set; the caller records it on success.
    fn post_wr(
        &mut self,
        qp: &Qp,
        op: WrOp,
        sg_list: &[byteexpress_verbs::Sge],
        flags: SendFlags,
    ) -> Result<u64, byteexpress_verbs::Error> {
        let id = (self.next + 1) & ID_MASK;
        let wr_id = self.tag | id;
        qp.post_send(&SendWr {
            wr_id,
            op,
            sg_list,
            signaled: flags.signaled,
            inline: flags.inline,
        })?;
        self.next = id;
        Ok(wr_id)
    }

    /// Posts a drain WR on `qp`, which must be in ERR, and keeps `data` until it completes:
    /// a signaled SEND with no SGE, which the QP flushes (WR_FLUSH_ERR) after every earlier
    /// WR, so its completion hands back every WR held, including unsignaled ones that
    /// completed silently before the QP failed and would otherwise never be covered (the
    /// kernel's `ib_drain_sq` posts the same). Returns the wr_id. Errors: `InvalidState` if
    /// the QP is not in ERR (on a live QP it would send an empty message), and what
    /// `ibv_post_send(3)` returns (`QueueFull` when the send queue is full: keep a slot).
    pub fn post_drain(&mut self, qp: &Qp, data: T) -> Result<u64, byteexpress_verbs::Error> {
        let state = qp.state();
        if state != byteexpress_verbs::QpState::Err {
            return Err(byteexpress_verbs::Error::InvalidState(format!(
                "drain WR on a QP in {state:?}, needs ERR"
            )));
        }
        let signaled = SendFlags {
            signaled: true,
            inline: false,
        };
        let wr_id = self.post_wr(qp, WrOp::Send, &[], signaled)?;
        self.wrs.push_back(Entry {
            wr_id,
            buf: None,
            data,
        });
        Ok(wr_id)
    }

    /// Hands back, oldest first, every WR `wc` completes: the WR it names (whatever its
    /// status: the device is done with it) and every earlier one still held (done silently,
    /// see the module's rule). Empty when the completion names no WR held here (another set's,
    /// or one already handed back).
    pub fn complete(&mut self, wc: &Wc) -> impl ExactSizeIterator<Item = Done<T>> + '_ {
        // wr_ids are consecutive and leave from the front, so the position is the distance.
        let n = match self.wrs.front() {
            Some(front) if self.owns(wc.wr_id) => {
                let at = (wc.wr_id.wrapping_sub(front.wr_id) & ID_MASK) as usize;
                match self.wrs.get(at) {
                    Some(e) if e.wr_id == wc.wr_id => at + 1,
                    _ => 0,
                }
            }
            _ => 0,
        };
        self.wrs.drain(..n).enumerate().map(move |(i, e)| Done {
            buf: e.buf,
            data: e.data,
            named: i + 1 == n,
        })
    }

    /// WRs held (posted and not yet covered by a completion).
    pub fn len(&self) -> usize {
        self.wrs.len()
    }

    /// True when no WR is held.
    pub fn is_empty(&self) -> bool {
        self.wrs.is_empty()
    }

    /// The caller data of every WR held, oldest first.
    pub fn data(&self) -> impl Iterator<Item = &T> {
        self.wrs.iter().map(|e| &e.data)
    }
}
