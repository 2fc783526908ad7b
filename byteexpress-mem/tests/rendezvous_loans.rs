//! A rendezvous loan (issue 23, acceptance: "a peer that READs outside the lent range, or after
//! the release, gets a remote access error on its QP and our process is unaffected"), tried by
//! a peer QP on the provider `BX_PROVIDER` selects: `soft` (default, on any host) or `ibverbs`
//! (rxe0 inside the Soft-RoCE VM, through `scripts/vm-tests.sh`). Nothing skips.
//!
//! The lender is built as byteexpress-rpc builds a link (`setup.rs` `build_rdma`, and
//! `engine/rdma/lend.rs`): one PD per link with its one QP (finished), connected with
//! `access` REMOTE_READ; the message copied into a [`LargeBuf`] of a [`LargePool`] of the PD
//! whose memory is readable-class; lent by a memory window bound (in QP order, REMOTE_READ)
//! over exactly its bytes where `DeviceAttr::mw_range_checked` (the pool's MRs
//! `LOCAL_WRITE | MW_BIND`), else by an MR of its own over those bytes (`LargeBuf::lend`, the
//! pool's MRs registered with no access). Where the engine uses windows (the soft provider)
//! the per-message MR is tried too, so both ways of lending are pinned there. The release is
//! the engine's: the peer's SEND_WITH_INV of the window's rkey (the lender's receive
//! completion reports it invalidated), or the lender dropping the MR.
//!
//! The message is 3 × 4096 + 5 bytes, so its end is not page-aligned; it starts at its
//! region's first byte, as the engine lends it.
//!
//! What a READ refused for its rkey does to the lender's own QP, the responder, differs by
//! provider, and each test asserts it ([`responder_state_after_a_remote_access_error`]): on an
//! rdma-core device the responder's QP moves to ERR too (the IB spec's class C responder
//! error, which rxe implements: `rxe_resp.c` `do_class_ac_error`, then `rxe_qp_error`), so the
//! link of that peer ends, as it would after any fault of that peer; on the soft provider the
//! requester executes the READ itself in the memory mapped to it, the lender's QP never sees
//! it and stays RTS. Either way only that link is touched: another link of the lender, made
//! before the errors, READs and SENDs after them.

use std::time::{Duration, Instant};

use byteexpress_mem::{LargeBuf, LargePool};
use byteexpress_verbs::{
    Access, ConnectAttr, Context, Cq, Mr, Mw, MwBind, Pd, Qp, QpCap, QpState, RecvWr, SendWr,
    SharedMem, Wc, WcOpcode, WcStatus, WrOp,
};

mod common;
use common::provider;

/// Bytes of the lent message: not a multiple of the page size.
const LEN: usize = 3 * 4096 + 5;
/// Bytes of the peer's local buffer (READ destination, SEND source).
const PEER_MEM: usize = LEN + 4096;

const T: Duration = Duration::from_secs(10);

/// The next completion of `cq`, polling for up to 10 s (a hang guard).
fn one(cq: &Cq) -> Wc {
    common::completion_within(cq, T)
}

/// How a link lends a message for READ (`engine/rdma/lend.rs` `LendConfig::windows`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lending {
    /// A memory window bound over the message's bytes.
    Window,
    /// A per-message MR over the message's bytes.
    Mr,
}

impl Lending {
    /// The lend pool's MR access (`build_rdma`).
    fn pool_access(self) -> Access {
        match self {
            Lending::Window => Access::LOCAL_WRITE | Access::MW_BIND,
            Lending::Mr => Access(0),
        }
    }
}

/// The ways of lending tried on `ctx`: the engine's (a window where the device bounds a window
/// by its range), and the per-message MR as well where that is not the engine's.
fn lendings(ctx: &Context) -> Vec<Lending> {
    if ctx.query().mw_range_checked {
        vec![Lending::Window, Lending::Mr]
    } else {
        vec![Lending::Mr]
    }
}

/// The state of the lender's QP once a peer's READ was refused for its rkey: ERR on an
/// rdma-core device (IB class C responder error), RTS on the soft provider (the READ never
/// reaches the lender's QP). `BX_PROVIDER` names the provider, as in [`provider`].
fn responder_state_after_a_remote_access_error() -> QpState {
    match std::env::var("BX_PROVIDER").as_deref() {
        Ok("ibverbs") => QpState::Err,
        _ => QpState::Rts,
    }
}

/// Link set-up's QP attributes (`setup.rs` `connect_attr`).
fn connect_attr() -> ConnectAttr {
    ConnectAttr {
        access: Access::REMOTE_READ,
        min_rnr_timer: 1,
        timeout: 14,
        retry_cnt: 6,
        rnr_retry: 0,
        ..ConnectAttr::default()
    }
}

/// A message's bytes: distinct per `seed`.
fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

/// One side's QP with its CQ and a local buffer (LOCAL_WRITE, never announced to a peer).
struct End {
    pd: Pd,
    qp: Qp,
    cq: Cq,
    mem: SharedMem,
    mr: Mr,
}

impl End {
    fn new(ctx: &Context, mem_len: usize) -> End {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64).unwrap();
        let qp = pd.create_qp(&cq, &cq, QpCap::default()).unwrap();
        pd.finish_qps(); // as a link does, before its pools are built
        let mem = pd.alloc_shared_for(mem_len, Access::LOCAL_WRITE).unwrap();
        let mr = pd
            .reg_shared(&mem, 0, mem_len, Access::LOCAL_WRITE)
            .unwrap();
        End {
            pd,
            qp,
            cq,
            mem,
            mr,
        }
    }

    fn bytes(&self, len: usize) -> Vec<u8> {
        assert!(len <= self.mem.len());
        // SAFETY: `len` bytes of the live mapping; no WR that writes it is in flight.
        unsafe { std::slice::from_raw_parts(self.mem.as_ptr(), len) }.to_vec()
    }

    fn set(&self, bytes: &[u8]) {
        assert!(bytes.len() <= self.mem.len());
        // SAFETY: in bounds of the live mapping; no WR that reads or writes it is in flight.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.mem.as_ptr(), bytes.len()) };
    }

    fn post_recv(&self, wr_id: u64) {
        let sge = [self.mr.sge(0, 4096).unwrap()];
        self.qp
            .post_recv(&RecvWr {
                wr_id,
                sg_list: &sge,
            })
            .unwrap();
    }

    /// Posts `op` (signaled) over the first `len` bytes of the buffer; its completion.
    fn post(&self, wr_id: u64, op: WrOp<'_>, len: usize) -> Wc {
        let sge = [self.mr.sge(0, len as u32).unwrap()];
        self.qp
            .post_send(&SendWr {
                wr_id,
                op,
                sg_list: &sge,
                signaled: true,
                inline: false,
            })
            .unwrap();
        let wc = one(&self.cq);
        assert_eq!(wc.wr_id, wr_id, "{wc:?}");
        wc
    }
}

/// A link of the lender (its PD, QP and lend pool) and the peer connected to it.
struct Link {
    lending: Lending,
    lender: End,
    pool: LargePool,
    peer: End,
}

/// One message lent to the peer: its address and rkey, and what grants it.
struct Loan {
    addr: u64,
    rkey: u32,
    want: Vec<u8>,
    /// Dropped first: the grant, then the memory (as `lend.rs`'s `Loan`).
    mw: Option<Mw>,
    mr: Option<Mr>,
    buf: LargeBuf,
}

/// What the lent region holds past the message.
const TAIL: u8 = 0xee;

const BIND: u64 = 0xb1;
const LENDER_RECV: u64 = 0x2e;
const READ: u64 = 0xa1;
const RELEASE: u64 = 0xa3;

impl Link {
    fn new(ctx: &Context, lending: Lending) -> Link {
        let lender = End::new(ctx, 4096);
        let pool = LargePool::new(&lender.pd, lending.pool_access(), true, 8 << 20);
        let peer = End::new(ctx, PEER_MEM);
        lender
            .qp
            .connect(&peer.qp.endpoint(), &connect_attr())
            .unwrap();
        peer.qp
            .connect(&lender.qp.endpoint(), &connect_attr())
            .unwrap();
        // The lender's receive, for the peer's RELEASE (rnr_retry 0: posted before it comes).
        lender.post_recv(LENDER_RECV);
        Link {
            lending,
            lender,
            pool,
            peer,
        }
    }

    /// Copies a message of `LEN` bytes (from `seed`) into the lend pool and lends it as the
    /// engine does: a window bound over exactly its bytes (the bind's completion awaited: the
    /// engine's descriptor SEND follows it in QP order), or an MR of its own.
    fn lend(&self, seed: u8) -> Loan {
        let want = pattern(seed, LEN);
        let mut buf = self.pool.alloc(LEN).unwrap();
        // The page past the message holds TAIL bytes: a READ that got them would show.
        buf.fill(&[want.as_slice(), &[TAIL; 4096]]).unwrap();
        buf.set_len(LEN);
        let (rkey, mw, mr) = match self.lending {
            Lending::Window => {
                let mw = self.lender.pd.alloc_mw().unwrap();
                self.lender
                    .qp
                    .post_send(&SendWr {
                        wr_id: BIND,
                        op: WrOp::BindMw(MwBind {
                            mw: &mw,
                            mr: buf.mr(),
                            addr: buf.addr(),
                            len: LEN as u64,
                            access: Access::REMOTE_READ,
                        }),
                        sg_list: &[],
                        signaled: true,
                        inline: false,
                    })
                    .unwrap();
                let wc = one(&self.lender.cq);
                assert_eq!(
                    (wc.wr_id, wc.status, wc.opcode),
                    (BIND, WcStatus::Success, WcOpcode::BindMw)
                );
                (mw.rkey(), Some(mw), None)
            }
            Lending::Mr => {
                let mr = buf.lend(0, LEN, Access::REMOTE_READ).unwrap();
                (mr.rkey(), None, Some(mr))
            }
        };
        Loan {
            addr: buf.addr(),
            rkey,
            want,
            mw,
            mr,
            buf,
        }
    }

    /// The peer READs `len` bytes at `addr` with `rkey` into its buffer (zeroed first); the
    /// completion on the peer's QP.
    fn read(&self, addr: u64, rkey: u32, len: usize) -> Wc {
        self.peer.set(&vec![0; PEER_MEM]);
        let wc = self.peer.post(
            READ,
            WrOp::Read {
                remote_addr: addr,
                rkey,
            },
            len,
        );
        if wc.status == WcStatus::Success {
            assert_eq!(wc.opcode, WcOpcode::RdmaRead);
        }
        wc
    }

    /// Ends the loan as the engine does; everything else of it stays (the window allocated,
    /// the memory in place), so only the release can stop a later READ. Window: the peer's
    /// RELEASE is a SEND_WITH_INV of the rkey, and the lender's receive completion reports that
    /// rkey invalidated (`lend.rs` `on_release` checks it). MR: the lender drops the MR.
    fn release(&self, loan: &mut Loan) {
        match self.lending {
            Lending::Window => {
                self.peer.set(b"release");
                let tx = self
                    .peer
                    .post(RELEASE, WrOp::SendWithInv { rkey: loan.rkey }, 7);
                assert_eq!(tx.status, WcStatus::Success, "{tx:?}");
                let rx = one(&self.lender.cq);
                assert_eq!(
                    (rx.wr_id, rx.status, rx.opcode, rx.invalidated_rkey),
                    (
                        LENDER_RECV,
                        WcStatus::Success,
                        WcOpcode::Recv,
                        Some(loan.rkey)
                    ),
                    "the RELEASE invalidated the window"
                );
                assert!(loan.mw.is_some(), "the window itself stays allocated");
            }
            Lending::Mr => drop(loan.mr.take().expect("lent by MR")),
        }
    }

    /// What a READ refused for its rkey leaves behind, checked: the lent bytes unchanged, and
    /// the lender's QP in the state this provider puts a responder in
    /// ([`responder_state_after_a_remote_access_error`]; an rdma-core device may move it a
    /// moment after the peer's completion, so that is waited for, 10 s at most).
    fn assert_after_refusal(&self, loan: &Loan, what: &str) {
        assert_eq!(loan.buf.as_slice(), &loan.want[..], "{what}: lent bytes");
        let want = responder_state_after_a_remote_access_error();
        let t0 = Instant::now();
        while self.lender.qp.state() != want && t0.elapsed() < T {
            std::thread::yield_now();
        }
        assert_eq!(
            self.lender.qp.state(),
            want,
            "{what} ({:?}): the lender's QP",
            self.lending
        );
        assert_eq!(
            self.peer.qp.state(),
            QpState::Err,
            "{what}: a remote access error moves the requester's QP to ERR"
        );
    }
}

/// Another link of the lender, made before a peer's errors, checked after them: its peer
/// READs its loan whole, and the lender SENDs to its peer.
struct Bystander {
    link: Link,
    loan: Loan,
}

impl Bystander {
    fn new(ctx: &Context) -> Bystander {
        let link = Link::new(ctx, lendings(ctx)[0]);
        let loan = link.lend(0x99);
        Bystander { link, loan }
    }

    fn assert_unaffected(&self) {
        let l = &self.link;
        let wc = l.read(self.loan.addr, self.loan.rkey, LEN);
        assert_eq!(
            (wc.status, wc.byte_len as usize),
            (WcStatus::Success, LEN),
            "another link's READ after a peer's errors"
        );
        assert_eq!(l.peer.bytes(LEN), self.loan.want);
        l.peer.post_recv(0x5e);
        l.lender.set(b"still here");
        let tx = l.lender.post(0x5d, WrOp::Send, 10);
        assert_eq!(
            tx.status,
            WcStatus::Success,
            "another link's SEND after a peer's errors"
        );
        let rx = one(&l.peer.cq);
        assert_eq!(
            (rx.wr_id, rx.status, rx.byte_len),
            (0x5e, WcStatus::Success, 10)
        );
        assert_eq!(l.peer.bytes(10), b"still here");
        assert_eq!(l.lender.qp.state(), QpState::Rts);
    }
}

#[test]
fn a_read_inside_the_lent_range_returns_the_message() {
    let ctx = provider();
    for lending in lendings(&ctx) {
        let link = Link::new(&ctx, lending);
        let loan = link.lend(1);
        let wc = link.read(loan.addr, loan.rkey, LEN);
        assert_eq!(
            (wc.status, wc.byte_len as usize),
            (WcStatus::Success, LEN),
            "{lending:?}"
        );
        assert_eq!(
            link.peer.bytes(LEN),
            loan.want,
            "{lending:?}: the whole message"
        );
        // Its first and its last byte alone, and a piece across a page boundary.
        for (off, len) in [(0, 1), (LEN - 1, 1), (4096 - 7, 100)] {
            let wc = link.read(loan.addr + off as u64, loan.rkey, len);
            assert_eq!(wc.status, WcStatus::Success, "{lending:?} [{off}, +{len})");
            assert_eq!(
                link.peer.bytes(len),
                &loan.want[off..off + len],
                "{lending:?} [{off}, +{len})"
            );
        }
        assert_eq!(link.lender.qp.state(), QpState::Rts);
        assert_eq!(link.peer.qp.state(), QpState::Rts);
    }
}

#[test]
fn a_read_starting_one_byte_before_the_lent_range_fails_with_a_remote_access_error_at_the_peer_only()
 {
    let ctx = provider();
    let bystander = Bystander::new(&ctx);
    for lending in lendings(&ctx) {
        let link = Link::new(&ctx, lending);
        let loan = link.lend(2);
        let wc = link.read(loan.addr - 1, loan.rkey, 16);
        assert_eq!(
            wc.status,
            WcStatus::RemAccessErr,
            "{lending:?}: a READ from one byte before the loan"
        );
        assert_eq!(link.peer.bytes(16), [0; 16], "{lending:?}: nothing landed");
        link.assert_after_refusal(&loan, "one byte before");
    }
    bystander.assert_unaffected();
}

#[test]
fn a_read_running_one_byte_past_the_lent_range_fails_with_a_remote_access_error_at_the_peer_only() {
    let ctx = provider();
    let bystander = Bystander::new(&ctx);
    for lending in lendings(&ctx) {
        let link = Link::new(&ctx, lending);
        let loan = link.lend(3);
        assert!(
            loan.buf.capacity() > LEN,
            "the region goes on past the message: only the loan can refuse"
        );
        let wc = link.read(loan.addr + LEN as u64 - 15, loan.rkey, 16);
        assert_eq!(
            wc.status,
            WcStatus::RemAccessErr,
            "{lending:?}: a READ ending one byte past the loan: {wc:?}, read {:x?}",
            link.peer.bytes(16)
        );
        assert_eq!(link.peer.bytes(16), [0; 16], "{lending:?}: nothing landed");
        link.assert_after_refusal(&loan, "one byte past");
    }
    bystander.assert_unaffected();
}

#[test]
fn a_read_after_the_release_fails_with_a_remote_access_error_at_the_peer_only() {
    let ctx = provider();
    let bystander = Bystander::new(&ctx);
    for lending in lendings(&ctx) {
        let link = Link::new(&ctx, lending);
        let mut loan = link.lend(4);
        let wc = link.read(loan.addr, loan.rkey, LEN);
        assert_eq!(
            wc.status,
            WcStatus::Success,
            "{lending:?}: before the release"
        );
        assert_eq!(link.peer.bytes(LEN), loan.want);
        link.release(&mut loan);
        let wc = link.read(loan.addr, loan.rkey, LEN);
        assert_eq!(
            wc.status,
            WcStatus::RemAccessErr,
            "{lending:?}: the READ again after the release"
        );
        link.assert_after_refusal(&loan, "after the release");
    }
    bystander.assert_unaffected();
}
