//! [`ReadLoan`]: a pool buffer lent to a peer for RDMA READs of one message.
//!
//! Pool memory is registered without remote access (DESIGN.md 3.2: least access). When a peer
//! must READ a message (the rendezvous issue's large messages), [`crate::Pool::lend_for_read`]
//! registers exactly the message's bytes once more, as an MR of their own with REMOTE_READ only,
//! and the loan hands out that MR's rkey. Dropping the loan deregisters the MR before the buffer
//! goes back to its pool, so the rkey stops working for that message and never reaches the
//! buffer's next use. A registration per message costs an `ibv_reg_mr(3)` and an
//! `ibv_dereg_mr(3)`: meant for messages large enough to be worth a READ.

use byteexpress_verbs::Access;

use crate::RegisteredBuf;
use crate::backing::Extra;

/// A filled pool buffer whose bytes a peer may RDMA READ, with the rkey of an MR that covers
/// exactly those bytes with REMOTE_READ and nothing else ([`crate::Pool::lend_for_read`]).
///
/// Keep the loan until the peer has said it finished reading (or its link is gone): a READ
/// arriving after the drop fails on the peer with a remote access error
/// (`IBV_WC_REM_ACCESS_ERR`). Dropping it deregisters the MR, then returns the buffer.
#[derive(Debug)]
pub struct ReadLoan {
    // Field order is drop order: the MR goes before the buffer returns to its pool.
    mr: Extra,
    buf: RegisteredBuf,
}

impl ReadLoan {
    pub(crate) fn new(mr: Extra, buf: RegisteredBuf) -> Self {
        ReadLoan { mr, buf }
    }

    /// Address of the first lent byte in this process (what the peer's READ names).
    pub fn addr(&self) -> u64 {
        self.buf.addr()
    }

    /// Bytes lent: the buffer's filled length when it was lent.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// True when nothing is lent (never: [`crate::Pool::lend_for_read`] refuses empty buffers).
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Remote key of the loan's own MR (REMOTE_READ over `[addr, addr + len)` only).
    pub fn rkey(&self) -> u32 {
        self.mr.keys.rkey
    }

    /// The access the loan grants: REMOTE_READ only.
    pub fn access(&self) -> Access {
        Access::REMOTE_READ
    }

    /// The lent bytes.
    pub fn as_slice(&self) -> &[u8] {
        self.buf.as_slice()
    }

    /// Ends the loan (deregistering its MR first) and gives the buffer back.
    pub fn end(self) -> RegisteredBuf {
        let ReadLoan { mr, buf } = self;
        drop(mr);
        buf
    }
}
