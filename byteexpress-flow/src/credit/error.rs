//! Errors of the credit state machine.

use super::MsgKind;

/// A violated credit rule. Errors on receipt mean the peer broke the protocol (the link should
/// be failed); errors on re-post mean the local caller did. State is left unchanged on error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CreditError {
    /// A configuration with `grant == 0`.
    ZeroGrant,
    /// The peer returned more credits than it had been sent data for.
    TooManyCredits {
        /// Credits in the received piggyback (unit: credits).
        returned: u32,
        /// Data messages sent and not yet returned, escrow excluded (unit: credits).
        outstanding: u32,
    },
    /// The peer set `slot_return` while no `CREDIT_UPDATE` of ours was outstanding.
    UnexpectedSlotReturn,
    /// The peer sent a data message without holding a credit.
    DataOverrun,
    /// The peer sent a `CREDIT_UPDATE` while our update slot was not posted.
    UpdateSlotBusy,
    /// The peer sent a `CREDIT_UPDATE` returning zero credits.
    EmptyUpdate,
    /// The caller reported a re-post of a buffer of this kind that was never consumed.
    NothingToRepost(MsgKind),
}

impl std::fmt::Display for CreditError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::ZeroGrant => write!(f, "credit grant must be at least 1"),
            Self::TooManyCredits {
                returned,
                outstanding,
            } => write!(
                f,
                "peer returned {returned} credits but only {outstanding} were outstanding"
            ),
            Self::UnexpectedSlotReturn => {
                write!(
                    f,
                    "peer returned the update slot but no update was outstanding"
                )
            }
            Self::DataOverrun => write!(f, "peer sent data beyond the credits granted to it"),
            Self::UpdateSlotBusy => {
                write!(
                    f,
                    "peer sent a credit update while the update slot was not posted"
                )
            }
            Self::EmptyUpdate => write!(f, "peer sent a credit update returning no credits"),
            Self::NothingToRepost(kind) => {
                write!(f, "re-post of a {kind:?} buffer that was not consumed")
            }
        }
    }
}

impl std::error::Error for CreditError {}
