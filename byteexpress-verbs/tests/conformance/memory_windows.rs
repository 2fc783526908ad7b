//! Type 2 memory windows (`ibv_alloc_mw(3)`, `ibv_post_send(3)` `IBV_WR_BIND_MW`,
//! `IBV_WR_LOCAL_INV`, `IBV_WR_SEND_WITH_INV`): bound in QP order over part of an MR, a window
//! lets the peer of that QP READ its range with its rkey and nothing else; invalidated, the
//! rkey fails with `REM_ACCESS_ERR` at the peer.
//!
//! In every test `b` lends memory through a window and `a`, its peer, uses it.
//!
//! Not here, because rxe (Linux 6.1) crashes the kernel on them (a NULL dereference in
//! `rxe_do_invalidate_mw`, seen in the VM): invalidating a window that is not bound, by
//! LOCAL_INV with its current rkey or by a peer's SEND_WITH_INV naming it. The soft
//! provider's answers to those are pinned in `tests/soft_memory_windows.rs`.

use byteexpress_verbs::{
    Access, ConnectAttr, Error, Mr, Mw, MwBind, QpCap, SendWr, SharedMem, Wc, WcOpcode, WcStatus,
    WrOp,
};

use crate::T;
use crate::common::*;

/// Bytes of the lent memory; the window covers `[WIN_OFF, WIN_OFF + WIN_LEN)` of it.
const LENT: usize = 4 * 4096;
const WIN_OFF: u64 = 4096;
const WIN_LEN: u64 = 8192;

/// Memory of `b` that only windows expose: registered `LOCAL_WRITE | MW_BIND`, no remote flag
/// (its own rkey grants nothing), filled with a pattern, with a window allocated in its PD.
struct Lent {
    mem: SharedMem,
    mr: Mr,
    mw: Mw,
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13) ^ 0xa5)
        .collect()
}

fn lend(b: &Side) -> Lent {
    let mem = b.pd.alloc_shared_for(LENT, Access::REMOTE_READ).unwrap();
    // SAFETY: `LENT` bytes of the live mapping; nothing reads or writes it yet.
    unsafe { std::ptr::copy_nonoverlapping(pattern(LENT).as_ptr(), mem.as_ptr(), LENT) };
    let mr =
        b.pd.reg_shared(&mem, 0, LENT, Access::LOCAL_WRITE | Access::MW_BIND)
            .unwrap();
    let mw = b.pd.alloc_mw().unwrap();
    Lent { mem, mr, mw }
}

fn one(cq: &byteexpress_verbs::Cq) -> Wc {
    let wcs = poll_n(cq, 1, T);
    assert_eq!(wcs.len(), 1, "one completion within {T:?}");
    wcs[0]
}

/// Binds `l.mw` over `[WIN_OFF, +WIN_LEN)` with `access` on `b`'s QP (signaled) and waits for
/// the bind's completion; returns the window's new rkey.
fn bind(b: &Side, l: &Lent, access: Access) -> u32 {
    let before = l.mw.rkey();
    b.qp.post_send(&SendWr {
        wr_id: 0xb1,
        op: WrOp::BindMw(MwBind {
            mw: &l.mw,
            mr: &l.mr,
            addr: l.mr.addr() + WIN_OFF,
            len: WIN_LEN,
            access,
        }),
        sg_list: &[],
        signaled: true,
        inline: false,
    })
    .unwrap();
    let rkey = l.mw.rkey();
    assert_eq!(rkey >> 8, before >> 8, "a bind keeps the key index");
    assert_eq!(
        rkey & 0xff,
        (before + 1) & 0xff,
        "and takes the next key byte"
    );
    let wc = one(&b.send_cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (0xb1, WcStatus::Success, WcOpcode::BindMw)
    );
    rkey
}

/// `a` READs `len` bytes at offset `off` of `l`'s memory with `rkey` into its own memory at 0;
/// returns the completion.
fn read(a: &Side, l: &Lent, rkey: u32, off: u64, len: u32) -> Wc {
    a.send(
        0xa1,
        WrOp::Read {
            remote_addr: l.mr.addr() + off,
            rkey,
        },
        0,
        len,
        true,
    )
    .unwrap();
    one(&a.send_cq)
}

fn local_inv(b: &Side, rkey: u32) -> Wc {
    b.qp.post_send(&SendWr {
        wr_id: 0x1f,
        op: WrOp::LocalInv { rkey },
        sg_list: &[],
        signaled: true,
        inline: false,
    })
    .unwrap();
    one(&b.send_cq)
}

#[test]
fn a_read_inside_a_bound_window_returns_the_lent_bytes() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    let l = lend(&b);
    let rkey = bind(&b, &l, Access::REMOTE_READ);
    let wc = read(&a, &l, rkey, WIN_OFF + 50, 1000);
    assert_eq!(
        (wc.status, wc.opcode, wc.byte_len),
        (WcStatus::Success, WcOpcode::RdmaRead, 1000)
    );
    let lent = pattern(LENT);
    assert_eq!(a.read(0, 1000), lent[WIN_OFF as usize + 50..][..1000]);
    let wc = read(&a, &l, rkey, WIN_OFF, WIN_LEN as u32);
    assert_eq!(wc.status, WcStatus::Success, "the whole window");
    assert_eq!(
        a.read(0, WIN_LEN as usize),
        lent[WIN_OFF as usize..][..WIN_LEN as usize]
    );
    drop(l.mem);
}

/// A READ with `rkey` of `[off, off + len)` (inside the MR, not inside the window) fails with
/// `REM_ACCESS_ERR` where the device checks a window's range
/// (`DeviceAttr::mw_range_checked`). On rxe, which checks the MR's range only, it succeeds,
/// and a READ past the end of the MR is what fails.
fn assert_outside_the_window_is_refused(a: &Side, l: &Lent, rkey: u32, off: u64, len: u32) {
    let wc = read(a, l, rkey, off, len);
    if provider().query().mw_range_checked {
        assert_eq!(wc.status, WcStatus::RemAccessErr);
    } else {
        assert_eq!(
            wc.status,
            WcStatus::Success,
            "DeviceAttr::mw_range_checked is false: this device bounds a window by its MR"
        );
        let wc = read(a, l, rkey, LENT as u64 - 8, 16);
        assert_eq!(wc.status, WcStatus::RemAccessErr, "past the end of the MR");
    }
}

#[test]
fn a_read_past_the_end_of_the_window_fails_with_a_remote_access_error() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    let l = lend(&b);
    let rkey = bind(&b, &l, Access::REMOTE_READ);
    // Inside the MR, one byte past the window.
    assert_outside_the_window_is_refused(&a, &l, rkey, WIN_OFF + WIN_LEN - 100, 101);
}

#[test]
fn a_read_before_the_window_start_fails_with_a_remote_access_error() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    let l = lend(&b);
    let rkey = bind(&b, &l, Access::REMOTE_READ);
    assert_outside_the_window_is_refused(&a, &l, rkey, WIN_OFF - 1, 16);
}

#[test]
fn a_write_through_a_read_only_window_fails_with_a_remote_access_error() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    let l = lend(&b);
    let rkey = bind(&b, &l, Access::REMOTE_READ);
    a.send(
        0xa2,
        WrOp::Write {
            remote_addr: l.mr.addr() + WIN_OFF,
            rkey,
        },
        0,
        64,
        true,
    )
    .unwrap();
    assert_eq!(one(&a.send_cq).status, WcStatus::RemAccessErr);
    assert_eq!(
        b.pd.alloc_shared(1).map(|_| ()).ok(),
        Some(()),
        "the lender is unaffected"
    );
}

#[test]
fn a_read_after_local_inv_fails_with_a_remote_access_error() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    let l = lend(&b);
    let rkey = bind(&b, &l, Access::REMOTE_READ);
    assert_eq!(read(&a, &l, rkey, WIN_OFF, 64).status, WcStatus::Success);
    let wc = local_inv(&b, rkey);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (0x1f, WcStatus::Success, WcOpcode::LocalInv)
    );
    assert_eq!(
        read(&a, &l, rkey, WIN_OFF, 64).status,
        WcStatus::RemAccessErr
    );
}

#[test]
fn a_window_rebound_after_local_inv_takes_a_new_rkey_and_the_old_one_stays_dead() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    let l = lend(&b);
    let first = bind(&b, &l, Access::REMOTE_READ);
    assert_eq!(local_inv(&b, first).status, WcStatus::Success);
    let second = bind(&b, &l, Access::REMOTE_READ);
    assert_ne!(first, second);
    assert_eq!(read(&a, &l, second, WIN_OFF, 64).status, WcStatus::Success);
    assert_eq!(
        read(&a, &l, first, WIN_OFF, 64).status,
        WcStatus::RemAccessErr
    );
}

#[test]
fn send_with_inv_reports_the_invalidated_rkey_and_a_later_read_fails() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    let l = lend(&b);
    let rkey = bind(&b, &l, Access::REMOTE_READ);
    assert_eq!(read(&a, &l, rkey, WIN_OFF, 64).status, WcStatus::Success);
    b.post_recv(0x2e, 0, 256);
    a.write(0, b"release");
    a.send(0xa3, WrOp::SendWithInv { rkey }, 0, 7, true)
        .unwrap();
    let rx = one(&b.recv_cq);
    assert_eq!(
        (rx.wr_id, rx.status, rx.opcode, rx.byte_len),
        (0x2e, WcStatus::Success, WcOpcode::Recv, 7)
    );
    assert_eq!(rx.invalidated_rkey, Some(rkey));
    assert_eq!(b.read(0, 7), b"release");
    let tx = one(&a.send_cq);
    assert_eq!(
        (tx.wr_id, tx.status, tx.opcode),
        (0xa3, WcStatus::Success, WcOpcode::Send)
    );
    assert_eq!(
        read(&a, &l, rkey, WIN_OFF, 64).status,
        WcStatus::RemAccessErr
    );
}

#[test]
fn a_plain_send_reports_no_invalidated_rkey() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    b.post_recv(1, 0, 64);
    a.send(2, WrOp::Send, 0, 8, true).unwrap();
    let rx = one(&b.recv_cq);
    assert_eq!((rx.status, rx.invalidated_rkey), (WcStatus::Success, None));
}

#[test]
fn a_window_bound_on_one_qp_is_refused_to_the_qp_of_another_pd() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    let (c, d) = pair(QpCap::default(), ConnectAttr::default());
    let l = lend(&b);
    let rkey = bind(&b, &l, Access::REMOTE_READ);
    assert_eq!(read(&a, &l, rkey, WIN_OFF, 64).status, WcStatus::Success);
    // `c`'s peer is `d`, a QP of another PD in the lender's process: same rkey and address.
    let wc = read(&c, &l, rkey, WIN_OFF, 64);
    assert_eq!(wc.status, WcStatus::RemAccessErr);
    drop(d);
}

#[test]
fn binding_a_window_on_a_qp_of_another_pd_is_refused_at_post() {
    let (_a, b) = pair(QpCap::default(), ConnectAttr::default());
    let (_c, d) = pair(QpCap::default(), ConnectAttr::default());
    let l = lend(&b);
    let before = l.mw.rkey();
    let r = d.qp.post_send(&SendWr {
        wr_id: 1,
        op: WrOp::BindMw(MwBind {
            mw: &l.mw,
            mr: &l.mr,
            addr: l.mr.addr(),
            len: 64,
            access: Access::REMOTE_READ,
        }),
        sg_list: &[],
        signaled: true,
        inline: false,
    });
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    assert_eq!(l.mw.rkey(), before, "nothing was posted");
}

#[test]
fn a_bind_outside_its_mr_or_over_an_mr_without_mw_bind_is_refused_at_post() {
    let (_a, b) = pair(QpCap::default(), ConnectAttr::default());
    let l = lend(&b);
    let post = |mr: &Mr, addr: u64, len: u64, access: Access| {
        b.qp.post_send(&SendWr {
            wr_id: 1,
            op: WrOp::BindMw(MwBind {
                mw: &l.mw,
                mr,
                addr,
                len,
                access,
            }),
            sg_list: &[],
            signaled: true,
            inline: false,
        })
    };
    let end = l.mr.addr() + LENT as u64;
    for (what, r) in [
        (
            "past the MR",
            post(&l.mr, end - 10, 11, Access::REMOTE_READ),
        ),
        ("empty", post(&l.mr, l.mr.addr(), 0, Access::REMOTE_READ)),
        (
            "a local flag",
            post(&l.mr, l.mr.addr(), 8, Access::LOCAL_WRITE),
        ),
        (
            "an MR without MW_BIND",
            post(&b.mr, b.mr.addr(), 8, Access::REMOTE_READ),
        ),
    ] {
        assert!(matches!(r, Err(Error::InvalidArgument(_))), "{what}: {r:?}");
    }
    let sge = [b.sge(0, 8)];
    let r = b.qp.post_send(&SendWr {
        wr_id: 1,
        op: WrOp::LocalInv { rkey: 1 },
        sg_list: &sge,
        signaled: true,
        inline: false,
    });
    assert!(
        matches!(r, Err(Error::InvalidArgument(_))),
        "LOCAL_INV with an SGE: {r:?}"
    );
}

#[test]
fn binding_a_window_that_is_still_bound_fails_with_mw_bind_err() {
    let (_a, b) = pair(QpCap::default(), ConnectAttr::default());
    let l = lend(&b);
    bind(&b, &l, Access::REMOTE_READ);
    b.qp.post_send(&SendWr {
        wr_id: 0xb2,
        op: WrOp::BindMw(MwBind {
            mw: &l.mw,
            mr: &l.mr,
            addr: l.mr.addr(),
            len: 64,
            access: Access::REMOTE_READ,
        }),
        sg_list: &[],
        signaled: true,
        inline: false,
    })
    .unwrap();
    let wc = one(&b.send_cq);
    assert_eq!((wc.wr_id, wc.status), (0xb2, WcStatus::MwBindErr));
}

#[test]
fn local_inv_of_an_rkey_that_names_no_window_fails_the_wr() {
    let (_a, b) = pair(QpCap::default(), ConnectAttr::default());
    let l = lend(&b);
    // The window exists but was never bound: its rkey names no valid binding.
    let wc = local_inv(&b, l.mw.rkey().wrapping_add(7));
    assert_eq!(wc.wr_id, 0x1f);
    assert_ne!(wc.status, WcStatus::Success, "{wc:?}");
}

#[test]
fn a_window_bound_on_one_qp_is_refused_to_another_qp_of_the_same_pd() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    let l = lend(&b);
    let rkey = bind(&b, &l, Access::REMOTE_READ);
    // A second QP of the lender's PD, and its own peer.
    let ctx = provider();
    let cq = ctx.create_cq(64).unwrap();
    let b2 = b.pd.create_qp(&cq, &cq, QpCap::default()).unwrap();
    let c = side(QpCap::default(), 1 << 16);
    c.qp.connect(&b2.endpoint(), &ConnectAttr::default())
        .unwrap();
    b2.connect(&c.qp.endpoint(), &ConnectAttr::default())
        .unwrap();
    assert_eq!(read(&a, &l, rkey, WIN_OFF, 64).status, WcStatus::Success);
    let wc = read(&c, &l, rkey, WIN_OFF, 64);
    assert_eq!(wc.status, WcStatus::RemAccessErr, "type 2: bound to one QP");
}
