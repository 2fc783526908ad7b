//! Type 2 memory windows of the soft device (`ibv_alloc_mw(3)`, IB spec 10.6.7).
//!
//! A window is bound and invalidated by WRs executed in the order of a QP's send queue
//! ([`super::send`]). The peer learns of it as of an MR, over the control channel of the QP
//! the bind executed on, and only there ([`Conn::announce_window`]): when the bind executes an
//! `MrAdd` under the window's rkey names the bound range of the MR's region with the window's
//! access; when it is invalidated (LOCAL_INV, SEND_WITH_INV received, or dropped while bound)
//! an `MrDel` withdraws that rkey before the invalidating WR completes. Both are counted in
//! the QP's `announced` word, which the peer compares with what it applied before resolving an
//! rkey ([`super::peer`]): a READ/WRITE the peer starts after it saw the bind's effect (a later
//! SEND, a completion) finds the window, one it starts after the invalidation's completion
//! does not, and fails with `REM_ACCESS_ERR`. Only the peer of that QP has the window: another
//! QP's peer (another PD's QP included) does not know the rkey.

use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::pd::{Conn, SoftMr, SoftPd};
use crate::provider::MwImpl;

/// Bit 31 marks the rkeys of memory windows; MR keys never have it ([`super::device`]), so
/// the two never meet in a peer's table.
pub(crate) const MW_KEY_BIT: u32 = 0x8000_0000;

/// Window key indices: bits 8..31 of an rkey.
pub(crate) const MW_INDEX_MASK: u32 = 0x007f_ffff;

/// What a bound window grants, and to whom.
#[derive(Debug)]
pub(crate) struct Bound {
    /// The rkey of this binding.
    pub(crate) rkey: u32,
    /// The QP it was bound on.
    pub(crate) qpn: u32,
    /// That QP's connection, which announced it.
    conn: Option<Weak<Conn>>,
    /// The MR it lies in, held while bound (as a NIC refuses to deregister it).
    _mr: Arc<SoftMr>,
}

impl Bound {
    /// Withdraws the rkey from the peer (an `MrDel`, counted before it returns).
    fn withdraw(&self) {
        if let Some(c) = self.conn.as_ref().and_then(Weak::upgrade)
            && let Err(e) = c.withdraw(self.rkey)
        {
            // The peer was dropped: its QP fails through the control channel.
            tracing::debug!("soft: withdrawing window {:#x} failed: {e}", self.rkey);
        }
    }
}

/// A type 2 memory window.
#[derive(Debug)]
pub(crate) struct SoftMw {
    pub(crate) pd: Arc<SoftPd>,
    /// The rkey at allocation: [`MW_KEY_BIT`], the key index, key byte 0.
    base: u32,
    /// `Some` while bound.
    pub(crate) state: Mutex<Option<Bound>>,
}

impl SoftMw {
    /// A window of `pd` with key index `index` (≤ [`MW_INDEX_MASK`]).
    pub(crate) fn new(pd: Arc<SoftPd>, index: u32) -> SoftMw {
        SoftMw {
            pd,
            base: MW_KEY_BIT | (index & MW_INDEX_MASK) << 8,
            state: Mutex::new(None),
        }
    }

    /// The key index of `rkey` (the table's key), when it is a window's rkey.
    pub(crate) fn index_of(rkey: u32) -> Option<u32> {
        (rkey & MW_KEY_BIT != 0).then_some((rkey >> 8) & MW_INDEX_MASK)
    }

    /// Binds it as `rkey` for the peer of QP `qpn` over `conn` (which announces the range):
    /// `Err(())` when it is bound already (type 2: bind only a free window, o10-36.2.2).
    pub(crate) fn bind(
        &self,
        rkey: u32,
        qpn: u32,
        conn: Option<&Arc<Conn>>,
        mr: &Arc<SoftMr>,
        range: (u64, u64),
        access: crate::Access,
    ) -> Result<(), ()> {
        let mut st = self.state.lock();
        if st.is_some() || rkey & !0xff != self.base {
            return Err(());
        }
        if let Some(c) = conn
            && let Err(e) = c.announce_window(mr, rkey, range.0, range.1, access)
        {
            // The peer was dropped (its QP fails through the control channel) or the region
            // can no longer be passed: the peer cannot use the window either way.
            tracing::debug!("soft: announcing window {rkey:#x} failed: {e}");
        }
        *st = Some(Bound {
            rkey,
            qpn,
            conn: conn.map(Arc::downgrade),
            _mr: mr.clone(),
        });
        Ok(())
    }

    /// Invalidates the binding whose rkey is `rkey` (for SEND_WITH_INV: received on QP
    /// `on_qpn`, which must be the one it was bound on). `Err(())` when it is not bound under
    /// that rkey (or on that QP).
    pub(crate) fn invalidate(&self, rkey: u32, on_qpn: Option<u32>) -> Result<(), ()> {
        let mut st = self.state.lock();
        match &*st {
            Some(b) if b.rkey == rkey && on_qpn.is_none_or(|q| q == b.qpn) => {}
            _ => return Err(()),
        }
        let b = st.take().expect("matched above");
        b.withdraw();
        Ok(())
    }
}

impl MwImpl for SoftMw {
    fn rkey(&self) -> u32 {
        self.base
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Drop for SoftMw {
    fn drop(&mut self) {
        if let Some(b) = self.state.get_mut().take() {
            b.withdraw();
        }
        if let Some(i) = Self::index_of(self.base) {
            self.pd.dev.mws.lock().remove(&i);
        }
    }
}
