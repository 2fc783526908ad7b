//! The link state machine checked against a table written from the design (DESIGN.md 3.5,
//! "Link life"), not from the code: every (state, event) pair, accepted or refused.

use crate::link_state::{LinkEvent, LinkState, transition};

const STATES: [LinkState; 7] = [
    LinkState::Hello,
    LinkState::QpHandshake,
    LinkState::Rdma,
    LinkState::Tcp,
    LinkState::FallbackTcp,
    LinkState::Reprobe,
    LinkState::Closed,
];

const EVENTS: [LinkEvent; 7] = [
    LinkEvent::HelloRdma,
    LinkEvent::HelloTcp,
    LinkEvent::QpUp,
    LinkEvent::QpFailed,
    LinkEvent::ProbeDue,
    LinkEvent::ProbeFailed,
    LinkEvent::Closed,
];

/// The accepted transitions; every pair not listed must be refused.
const ACCEPTED: &[(LinkState, LinkEvent, LinkState)] = {
    use LinkEvent::*;
    use LinkState as S;
    &[
        // set-up
        (S::Hello, HelloRdma, S::QpHandshake),
        (S::Hello, HelloTcp, S::Tcp),
        (S::Hello, Closed, S::Closed),
        (S::QpHandshake, QpUp, S::Rdma),
        (S::QpHandshake, QpFailed, S::Closed),
        (S::QpHandshake, Closed, S::Closed),
        // a TCP link stays TCP until it ends
        (S::Tcp, Closed, S::Closed),
        // the QP fails: fall back to the control connection
        (S::Rdma, QpFailed, S::FallbackTcp),
        (S::Rdma, Closed, S::Closed),
        // re-probe from fallback, back to RDMA when it works
        (S::FallbackTcp, ProbeDue, S::Reprobe),
        (S::FallbackTcp, Closed, S::Closed),
        (S::Reprobe, QpUp, S::Rdma),
        (S::Reprobe, ProbeFailed, S::FallbackTcp),
        (S::Reprobe, Closed, S::Closed),
    ]
};

#[test]
fn every_state_and_event_pair_matches_the_design_table() {
    let mut accepted = 0;
    for s in STATES {
        for e in EVENTS {
            let want = ACCEPTED
                .iter()
                .find(|(from, ev, _)| *from == s && *ev == e)
                .map(|(_, _, to)| *to);
            let got = transition(s, e);
            match want {
                Some(to) => {
                    accepted += 1;
                    assert_eq!(got, Ok(to), "{s:?} + {e:?}");
                }
                None => assert!(got.is_err(), "{s:?} + {e:?} should be refused, got {got:?}"),
            }
        }
    }
    assert_eq!(accepted, ACCEPTED.len(), "the table lists each pair once");
}

#[test]
fn a_closed_link_refuses_every_event_and_fallback_states_say_so() {
    for e in EVENTS {
        assert!(transition(LinkState::Closed, e).is_err(), "{e:?}");
    }
    let fallback: Vec<_> = STATES.into_iter().filter(|s| s.is_fallback()).collect();
    assert_eq!(fallback, [LinkState::FallbackTcp, LinkState::Reprobe]);
}
