//! A link's life as a state machine, one per side of a link.
//!
//! The state lives in [`LinkMachine`], whose field is private to this module and changed only
//! through [`transition`], the pure function of (state, event) → next state or refusal. Every
//! transition is logged at `info` with its cause, counted in `bx_link_transitions_total`
//! (labels `from`, `to`) and in [`crate::LinkStats`] (`link_state`, `transitions`,
//! `fallbacks`, `reprobes`).
//!
//! ```text
//!  Hello ──HelloTcp──► Tcp ─────────────────────────────┐
//!    │                                                   │
//!  HelloRdma                                             │
//!    ▼                                                   ▼
//!  QpHandshake ──QpUp──► Rdma ──QpFailed──► FallbackTcp ──Closed──► Closed
//!    │                    ▲                  │      ▲
//!    └─QpFailed─► Closed  └──────QpUp──── Reprobe ──┘ ProbeFailed
//!                                      (ProbeDue from FallbackTcp)
//! ```
//!
//! Every state but `Closed` goes to `Closed` on `Closed` (the link ended: TCP failed, keepalive,
//! idle, the owner dropped it). apache/brpc's `RdmaEndpoint::State` (`rdma_endpoint.h`) is such
//! an enum for its handshake: per-side steps, then ESTABLISHED, FALLBACK_TCP or FAILED; there a
//! link falls back only during the handshake and never returns. This machine is written from
//! the ByteExpress design's link life instead: a live link falls back when its QP fails, and a
//! re-probe takes RDMA back.

use std::sync::atomic::{AtomicU64, Ordering};

/// Where a link is in its life (one side's view).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LinkState {
    /// The TCP connection is up; HELLO / HELLO_ACK are being exchanged.
    Hello,
    /// RDMA was chosen: the QP is being built and connected (SELECT_RDMA / RDMA_ACCEPT).
    QpHandshake,
    /// Messages go over the QP; the TCP connection carries keepalive only.
    Rdma,
    /// TCP was chosen at set-up: messages go over the TCP connection for the link's life.
    Tcp,
    /// The QP failed: messages go over the TCP control connection (`tcp(fallback)`).
    FallbackTcp,
    /// In fallback, a new QP handshake runs over the control connection; messages still go
    /// over TCP until it succeeds.
    Reprobe,
    /// The link ended; every call still waiting on it failed.
    Closed,
}

impl LinkState {
    /// The state's name as logs and metric labels show it (`fallback_tcp`, ...).
    pub fn name(self) -> &'static str {
        match self {
            LinkState::Hello => "hello",
            LinkState::QpHandshake => "qp_handshake",
            LinkState::Rdma => "rdma",
            LinkState::Tcp => "tcp",
            LinkState::FallbackTcp => "fallback_tcp",
            LinkState::Reprobe => "reprobe",
            LinkState::Closed => "closed",
        }
    }

    /// True while messages travel over TCP because the QP failed (reported as
    /// `tcp(fallback)` by `Client::transport`).
    pub fn is_fallback(self) -> bool {
        matches!(self, LinkState::FallbackTcp | LinkState::Reprobe)
    }
}

impl std::fmt::Display for LinkState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What happens to a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum LinkEvent {
    /// Set-up agreed on RDMA (the client sent, or the server received, SELECT_RDMA).
    HelloRdma,
    /// Set-up agreed on TCP (SELECT_TCP).
    HelloTcp,
    /// A QP is connected and its receives posted (set-up, or a re-probe that worked).
    QpUp,
    /// The QP failed: an error completion, a failed post or poll, a fatal async event, or the
    /// peer's RESYNC saying its QP failed.
    QpFailed,
    /// The re-probe backoff ran out: try a new QP.
    ProbeDue,
    /// The re-probe failed (refused, timed out, QP connect failed).
    ProbeFailed,
    /// The link ended.
    Closed,
}

impl LinkEvent {
    fn name(self) -> &'static str {
        match self {
            LinkEvent::HelloRdma => "hello_rdma",
            LinkEvent::HelloTcp => "hello_tcp",
            LinkEvent::QpUp => "qp_up",
            LinkEvent::QpFailed => "qp_failed",
            LinkEvent::ProbeDue => "probe_due",
            LinkEvent::ProbeFailed => "probe_failed",
            LinkEvent::Closed => "closed",
        }
    }
}

/// An event the state does not accept (a bug of the caller, or a peer's message out of turn).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("link in state {state} refuses event {}", event.name())]
pub(crate) struct Refused {
    pub state: LinkState,
    pub event: LinkEvent,
}

/// The transition function: the state after `event` in `state`, or a refusal.
pub(crate) fn transition(state: LinkState, event: LinkEvent) -> Result<LinkState, Refused> {
    use LinkEvent as E;
    use LinkState as S;
    let next = match (state, event) {
        (S::Closed, _) => None,
        (_, E::Closed) => Some(S::Closed),
        (S::Hello, E::HelloRdma) => Some(S::QpHandshake),
        (S::Hello, E::HelloTcp) => Some(S::Tcp),
        (S::QpHandshake, E::QpUp) => Some(S::Rdma),
        (S::QpHandshake, E::QpFailed) => Some(S::Closed),
        (S::Rdma, E::QpFailed) => Some(S::FallbackTcp),
        (S::FallbackTcp, E::ProbeDue) => Some(S::Reprobe),
        (S::Reprobe, E::QpUp) => Some(S::Rdma),
        (S::Reprobe, E::ProbeFailed) => Some(S::FallbackTcp),
        _ => None,
    };
    next.ok_or(Refused { state, event })
}

/// The state of one link, changed only by [`LinkMachine::apply`].
#[derive(Debug)]
pub(crate) struct LinkMachine {
    state: parking_lot::Mutex<LinkState>,
    /// Which side this is (`client`, `server`), for the logs.
    side: &'static str,
    transitions: AtomicU64,
    fallbacks: AtomicU64,
    reprobes: AtomicU64,
}

impl LinkMachine {
    /// A machine in `Hello`.
    pub(crate) fn new(side: &'static str) -> Self {
        LinkMachine {
            state: parking_lot::Mutex::new(LinkState::Hello),
            side,
            transitions: AtomicU64::new(0),
            fallbacks: AtomicU64::new(0),
            reprobes: AtomicU64::new(0),
        }
    }

    /// The state now.
    pub(crate) fn state(&self) -> LinkState {
        *self.state.lock()
    }

    /// Applies `event` (because of `cause`): logs the transition at `info`, counts it, and
    /// returns the new state; a refused event changes nothing and is logged at `debug`.
    pub(crate) fn apply(
        &self,
        event: LinkEvent,
        cause: &dyn std::fmt::Display,
    ) -> Result<LinkState, Refused> {
        let mut g = self.state.lock();
        let from = *g;
        match transition(from, event) {
            Ok(to) => {
                *g = to;
                drop(g);
                self.transitions.fetch_add(1, Ordering::Relaxed);
                if to == LinkState::FallbackTcp && from == LinkState::Rdma {
                    self.fallbacks.fetch_add(1, Ordering::Relaxed);
                }
                if to == LinkState::Reprobe {
                    self.reprobes.fetch_add(1, Ordering::Relaxed);
                }
                crate::metrics::link_transition(self.side, from.name(), to.name());
                tracing::info!(
                    side = self.side,
                    from = from.name(),
                    to = to.name(),
                    event = event.name(),
                    %cause,
                    "link state"
                );
                Ok(to)
            }
            Err(r) => {
                tracing::debug!(side = self.side, %r, %cause, "link event refused");
                Err(r)
            }
        }
    }

    /// (transitions, fallbacks from RDMA, re-probes started) so far.
    pub(crate) fn counts(&self) -> (u64, u64, u64) {
        (
            self.transitions.load(Ordering::Relaxed),
            self.fallbacks.load(Ordering::Relaxed),
            self.reprobes.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The machine moves only through accepted events, and counts what it did: transitions,
    /// fallbacks from RDMA, re-probes started; a refused event changes and counts nothing.
    #[test]
    fn the_machine_counts_transitions_fallbacks_and_reprobes_and_ignores_refused_events() {
        let m = LinkMachine::new("client");
        assert_eq!(m.state(), LinkState::Hello);
        m.apply(LinkEvent::HelloRdma, &"test").unwrap();
        m.apply(LinkEvent::QpUp, &"test").unwrap();
        assert!(m.apply(LinkEvent::ProbeDue, &"out of turn").is_err());
        assert_eq!((m.state(), m.counts()), (LinkState::Rdma, (2, 0, 0)));
        m.apply(LinkEvent::QpFailed, &"test").unwrap();
        m.apply(LinkEvent::ProbeDue, &"test").unwrap();
        m.apply(LinkEvent::ProbeFailed, &"test").unwrap();
        m.apply(LinkEvent::ProbeDue, &"test").unwrap();
        m.apply(LinkEvent::QpUp, &"test").unwrap();
        assert_eq!((m.state(), m.counts()), (LinkState::Rdma, (7, 1, 2)));
        m.apply(LinkEvent::Closed, &"test").unwrap();
        assert!(m.apply(LinkEvent::QpUp, &"after close").is_err());
        assert_eq!((m.state(), m.counts()), (LinkState::Closed, (8, 1, 2)));
    }
}
