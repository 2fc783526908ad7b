//! Fair sharing of one QP's credits and window among its logical connections.
//!
//! Pure and event-driven: no I/O, no clock. The transport reports messages with
//! [`Scheduler::enqueue`] and asks [`Scheduler::next`] which chunk to post, passing a
//! `can_send(len)` gate (typically: the QP [`Window`](crate::window::Window) admits `len`
//! bytes and [`Credits`](crate::credit::Credits) has a credit). The same code runs in the
//! transport, in tests and in a simulator.
//!
//! # Chunks
//! Every message is cut into chunks of at most `max_chunk` bytes (64 KiB by default,
//! [`Chunks`]); each grant is one chunk, so a small message waits behind at most one chunk of
//! a bulk message rather than the whole message.
//!
//! # Deficit round robin per class
//! Within a [`Class`], backlogged connections are served by deficit round robin on bytes
//! (Shreedhar & Varghese, "Efficient fair queuing using deficit round robin", SIGCOMM 1995):
//! a connection's turn adds `quantum` bytes to its deficit; it sends head chunks while the
//! head fits in the deficit, then the next connection takes its turn; a connection whose
//! queue empties leaves the round with its deficit reset to 0. `quantum >= max_chunk`, so each
//! turn sends at least one chunk and [`Scheduler::next`] is O(1).
//! Fairness: over any interval in which connections `i` and `j` of one class stay backlogged,
//! `|bytes_i − bytes_j| < quantum + 2 × max_chunk`.
//!
//! # Latency class, capped
//! [`Class::Latency`] (small pulls, control) is served before [`Class::Bulk`] (pushes), but
//! while bulk is backlogged at most `latency_burst` latency chunks go in a row; then one bulk
//! chunk goes. Bulk therefore keeps at least one chunk in every `latency_burst + 1` grants
//! (liveness), and a latency message waits behind at most one bulk chunk.
//!
//! # Bypass when idle
//! [`Scheduler::offer`] is `enqueue` with a shortcut: a message of one chunk offered while
//! nothing is queued goes straight to the gate and, if admitted, is granted without touching
//! any queue or round. The outcome is the one `enqueue` + `next` would give; only the
//! bookkeeping is skipped.
//!
//! # Gate and head-of-line
//! `next` picks the chunk the rules above designate and calls `can_send(len)` once. If it
//! answers `false`, nothing is dequeued and `next` returns `None`: the same chunk is
//! designated again on the next call (after a completion or a credit return). Other chunks do
//! not overtake it, so a large chunk is never starved by smaller ones slipping into a
//! nearly full window; the window's single-chunk escape guarantees it eventually fits.

mod chunk;
mod config;
mod error;
mod flow;
mod ring;
mod scheduler;
mod types;

pub use chunk::{Chunk, Chunks};
pub use config::SchedConfig;
pub use error::SchedError;
pub use scheduler::Scheduler;
pub use types::{Class, ConnId, Dropped, Grant, MsgId, Offer};
