//! Identifiers and results of the scheduler.

/// Scheduling class of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// Latency-critical (small pulls, control): served first, within a capped burst.
    Latency,
    /// Bulk (pushes): fair share of what latency leaves.
    Bulk,
}

impl Class {
    /// Both classes, latency first.
    pub const ALL: [Class; 2] = [Class::Latency, Class::Bulk];

    #[inline]
    pub(crate) fn index(self) -> usize {
        match self {
            Class::Latency => 0,
            Class::Bulk => 1,
        }
    }
}

/// A logical connection on a [`Scheduler`](super::Scheduler), from
/// [`Scheduler::open`](super::Scheduler::open). Stale after `close`: the scheduler rejects it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId {
    pub(crate) slot: u32,
    pub(crate) generation: u32,
}

impl ConnId {
    /// A dense index (`0..` number of connections ever open at once), for the caller's own
    /// per-connection tables. Reused after `close`.
    #[inline]
    pub fn index(self) -> usize {
        self.slot as usize
    }
}

/// A message, numbered in enqueue order across the scheduler (starting at 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MsgId(pub u64);

/// One chunk to post now: the action [`Scheduler::next`](super::Scheduler::next) returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// Connection it belongs to.
    pub conn: ConnId,
    /// Its class.
    pub class: Class,
    /// Its message.
    pub msg: MsgId,
    /// Offset of the chunk in the message (unit: bytes).
    pub offset: u64,
    /// Chunk length (unit: bytes), `1..=max_chunk`.
    pub len: u32,
    /// This chunk ends the message.
    pub last: bool,
}

/// What [`Scheduler::offer`](super::Scheduler::offer) did with a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// Nothing was queued and the gate admitted it: post this grant (the whole message, one
    /// chunk) now.
    Granted(Grant),
    /// Queued under this id, as [`Scheduler::enqueue`](super::Scheduler::enqueue) does;
    /// [`Scheduler::next`](super::Scheduler::next) grants its chunks.
    Queued(MsgId),
}

/// What [`Scheduler::close`](super::Scheduler::close) dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dropped {
    /// Messages with unsent bytes (unit: messages).
    pub messages: u64,
    /// Unsent bytes (unit: bytes).
    pub bytes: u64,
}
