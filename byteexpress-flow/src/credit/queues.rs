//! Send-queue slots and completion-queue entries of one QP: the second and third credits.

/// Sizes of one RC QP's queues, whose send and receive completions go to one CQ (as in
/// `byteexpress-rpc`'s RDMA engine). Units: work requests (WRs) and CQ entries (CQEs).
///
/// Invariant: `1 <= sq_depth`, `1 <= rq_depth`, `rq_depth < cq_size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueConfig {
    sq_depth: u32,
    rq_depth: u32,
    cq_size: u32,
}

impl QueueConfig {
    /// Queues of a QP: `sq_depth` send WRs (the QP's `max_send_wr`), `rq_depth` receive WRs
    /// (`max_recv_wr`; the credit protocol posts `grant + 1`, see
    /// [`CreditConfig::posted_receives`](super::CreditConfig::posted_receives)) and a CQ of
    /// `cq_size` entries shared by both (the size the CQ was created with, as the device
    /// reports it).
    ///
    /// `rq_depth` entries of the CQ are reserved for receive completions, so re-posting a
    /// receive never waits for a send completion; sends get the rest. The standard sizing
    /// `cq_size = sq_depth + rq_depth` makes the CQ never the limit; a smaller CQ (a device
    /// `max_cqe` below that) caps sends in flight at `cq_size - rq_depth`.
    ///
    /// # Errors
    /// [`QueueError::ZeroDepth`] when a depth is 0, [`QueueError::CqTooSmall`] when
    /// `cq_size <= rq_depth` (no entry left for a send completion).
    pub fn new(sq_depth: u32, rq_depth: u32, cq_size: u32) -> Result<Self, QueueError> {
        if sq_depth == 0 || rq_depth == 0 {
            return Err(QueueError::ZeroDepth);
        }
        if cq_size <= rq_depth {
            return Err(QueueError::CqTooSmall { cq_size, rq_depth });
        }
        Ok(Self {
            sq_depth,
            rq_depth,
            cq_size,
        })
    }

    /// Send WRs the QP accepts (unit: WRs).
    pub fn sq_depth(&self) -> u32 {
        self.sq_depth
    }

    /// Receive WRs the QP accepts (unit: WRs).
    pub fn rq_depth(&self) -> u32 {
        self.rq_depth
    }

    /// CQ entries (unit: CQEs).
    pub fn cq_size(&self) -> u32 {
        self.cq_size
    }

    /// Sends that may be outstanding at once: `min(sq_depth, cq_size - rq_depth)` (unit: WRs).
    pub fn send_limit(&self) -> u32 {
        self.sq_depth.min(self.cq_size - self.rq_depth)
    }
}

/// A refused post, a completion that matches no post, or an invalid [`QueueConfig`]. State is
/// left unchanged on error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum QueueError {
    /// A queue depth of 0.
    ZeroDepth,
    /// A CQ no larger than the receive queue: no entry left for send completions.
    CqTooSmall {
        /// CQ entries (CQEs).
        cq_size: u32,
        /// Receive WRs (WRs).
        rq_depth: u32,
    },
    /// Every send slot is taken: `sq_depth` sends, or `cq_size - rq_depth` send completions,
    /// are outstanding. Wait for a send completion.
    SendFull,
    /// `rq_depth` receives are posted already (caller bug).
    RecvFull,
    /// A send completion with no send outstanding (caller bug).
    NoSendOutstanding,
    /// A receive completion with no receive posted (caller bug).
    NoRecvPosted,
}

impl std::fmt::Display for QueueError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::ZeroDepth => write!(f, "queue depths must be at least 1"),
            Self::CqTooSmall { cq_size, rq_depth } => write!(
                f,
                "CQ of {cq_size} entries leaves none for sends beside {rq_depth} receives"
            ),
            Self::SendFull => write!(f, "send queue or its CQ entries are full"),
            Self::RecvFull => write!(f, "receive queue is full"),
            Self::NoSendOutstanding => write!(f, "send completion with no send outstanding"),
            Self::NoRecvPosted => write!(f, "receive completion with no receive posted"),
        }
    }
}

impl std::error::Error for QueueError {}

/// Send-queue slots and CQ entries of one QP, both sides of the credit: a SEND needs a
/// receiver credit ([`Credits`](super::Credits)) **and** a send slot from here; a receive
/// needs a slot in the receive queue. Event-driven like the rest of the crate: count a post
/// when the WR is posted and a completion when its CQE is polled.
///
/// Rules (verbs semantics of an RC QP, `ibv_post_send(3)`, `ibv_create_cq(3)`):
/// - A posted WR holds its queue slot until its completion is polled; posting beyond
///   `max_send_wr` / `max_recv_wr` fails.
/// - A signaled WR produces one CQE; an unsignaled one produces none on success, but one
///   (its error, or a flush) when the QP fails, and then every WR still outstanding does.
///   So a CQE may be owed for every posted WR, and more CQEs owed than the CQ holds could
///   overrun it (a CQ error that fails the QP): each posted WR, signaled or not, keeps its CQ
///   entry reserved until it is known complete, and
///   `sends_outstanding + recvs_posted <= cq_size` at all times; receives have
///   `rq_depth` entries reserved, sends take at most `cq_size - rq_depth`.
/// - Selective signaling: an RC send queue completes in order, so the CQE of a signaled WR
///   also completes every unsignaled WR posted before it: it frees all their slots and CQ
///   entries at once ([`QueueBudget::on_send_completions`]). The poster must signal often
///   enough that the queue never fills with unsignaled WRs (no CQE would ever free them).
/// - A send's completion and the peer's reply to it arrive in either order: the receive
///   completion carrying the credits the peer returned may be polled before the send
///   completion of the message it answers. Credits ([`Credits`](super::Credits)), bytes in
///   flight ([`Window`](crate::window::Window)) and slots here are separate counts, each
///   released by its own event, so either order leaves all three right
///   (`tests/credit_model.rs` checks random orders).
///
/// Not modelled: several QPs sharing one CQ.
#[derive(Debug, Clone)]
pub struct QueueBudget {
    cfg: QueueConfig,
    /// Send limit: `min(sq_depth, cq_size - rq_depth)` (unit: WRs).
    send_limit: u32,
    /// SENDs posted whose completion is not polled yet (unit: WRs).
    sends: u32,
    /// Receives posted whose completion is not polled yet (unit: WRs).
    recvs: u32,
    /// Send posts refused for lack of a slot (unit: posts).
    send_blocked: u64,
}

impl QueueBudget {
    /// Empty queues: nothing posted.
    pub fn new(cfg: QueueConfig) -> Self {
        Self {
            cfg,
            send_limit: cfg.send_limit(),
            sends: 0,
            recvs: 0,
            send_blocked: 0,
        }
    }

    /// The configuration.
    pub fn config(&self) -> QueueConfig {
        self.cfg
    }

    /// SENDs posted and not yet completed (unit: WRs); never above
    /// [`QueueConfig::send_limit`].
    #[inline]
    pub fn sends_outstanding(&self) -> u32 {
        self.sends
    }

    /// Receives posted and not yet completed (unit: WRs); never above `rq_depth`.
    #[inline]
    pub fn recvs_posted(&self) -> u32 {
        self.recvs
    }

    /// CQEs that may still arrive: one per outstanding send and per posted receive (unit:
    /// CQEs); never above `cq_size`.
    #[inline]
    pub fn cqes_owed(&self) -> u32 {
        self.sends + self.recvs
    }

    /// Send posts refused for lack of a slot since creation (unit: posts).
    pub fn send_blocked(&self) -> u64 {
        self.send_blocked
    }

    /// Send slots (with their CQ entries) free now: `send_limit - sends_outstanding` (unit:
    /// WRs), for a caller that takes several before posting them.
    #[inline]
    pub fn free_sends(&self) -> u32 {
        self.send_limit - self.sends
    }

    /// Free send-queue slots: `sq_depth - sends_outstanding` (unit: WRs), what
    /// [`crate::gate::sq_slot`] reads.
    #[inline]
    pub fn sq_free(&self) -> u32 {
        self.cfg.sq_depth - self.sends
    }

    /// CQ entries free for send completions: `cq_size - rq_depth - sends_outstanding` (unit:
    /// CQEs; `rq_depth` entries stay reserved for receives), what [`crate::gate::cq_entry`]
    /// reads. Never negative: sends are capped at [`QueueConfig::send_limit`].
    #[inline]
    pub fn send_cqes_free(&self) -> u32 {
        self.cfg.cq_size - self.cfg.rq_depth - self.sends
    }

    /// Whether a SEND may be posted now (a free SQ slot and a free CQ entry).
    #[inline]
    pub fn can_post_send(&self) -> bool {
        self.sends < self.send_limit
    }

    /// Takes a send slot (and its CQ entry) for a SEND about to be posted, data or credit
    /// update.
    ///
    /// # Errors
    /// [`QueueError::SendFull`] when none is free; nothing is taken. Retry after the next
    /// send completion.
    #[inline]
    pub fn try_post_send(&mut self) -> Result<(), QueueError> {
        if self.sends >= self.send_limit {
            self.send_blocked += 1;
            return Err(QueueError::SendFull);
        }
        self.sends += 1;
        Ok(())
    }

    /// A send completion was polled (success or flush): its slot and CQ entry are free.
    ///
    /// # Errors
    /// [`QueueError::NoSendOutstanding`] when no send is outstanding (caller bug).
    #[inline]
    pub fn on_send_completion(&mut self) -> Result<(), QueueError> {
        if self.sends == 0 {
            return Err(QueueError::NoSendOutstanding);
        }
        self.sends -= 1;
        Ok(())
    }

    /// A send completion was polled that completes `n` send WRs: its own and the unsignaled
    /// ones posted before it (selective signaling): their slots and CQ entries are free.
    ///
    /// # Errors
    /// [`QueueError::NoSendOutstanding`] when fewer than `n` sends are outstanding (caller
    /// bug); nothing is freed.
    #[inline]
    pub fn on_send_completions(&mut self, n: u32) -> Result<(), QueueError> {
        if self.sends < n {
            return Err(QueueError::NoSendOutstanding);
        }
        self.sends -= n;
        Ok(())
    }

    /// Takes a receive slot (and its reserved CQ entry) for a receive about to be posted.
    ///
    /// # Errors
    /// [`QueueError::RecvFull`] when `rq_depth` receives are posted (caller bug).
    #[inline]
    pub fn try_post_recv(&mut self) -> Result<(), QueueError> {
        if self.recvs >= self.cfg.rq_depth {
            return Err(QueueError::RecvFull);
        }
        self.recvs += 1;
        Ok(())
    }

    /// A receive completion was polled (success or flush): its slot and CQ entry are free.
    ///
    /// # Errors
    /// [`QueueError::NoRecvPosted`] when no receive is posted (caller bug).
    #[inline]
    pub fn on_recv_completion(&mut self) -> Result<(), QueueError> {
        if self.recvs == 0 {
            return Err(QueueError::NoRecvPosted);
        }
        self.recvs -= 1;
        Ok(())
    }
}
