//! Memory the application owns, registered with `Pd::reg_user` / `Pd::reg_raw` (`ibv_reg_mr(3)`):
//! the source of SEND and RDMA_WRITE and the destination of RDMA_READ on every provider; on the
//! soft provider local access only (remote access and receive buffers are `Unsupported`, as the
//! device reports through `remote_access_needs_shared`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use byteexpress_verbs::{
    Access, ConnectAttr, Error, QpCap, RecvWr, SendWr, UserRegion, WcOpcode, WcStatus, WrOp,
};

use crate::T;
use crate::common::*;

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| seed ^ (i as u8).wrapping_mul(7)).collect()
}

#[test]
fn a_send_from_a_reg_user_mr_over_a_vec_arrives_intact() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    let data = pattern(0x5a, 3000);
    let mr =
        a.pd.reg_user(UserRegion::new(data.clone()), Access::default())
            .unwrap();
    assert_eq!(mr.len(), 3000);
    b.post_recv(7, 0, 4096);
    let sge = [mr.sge(0, 3000).unwrap()];
    a.qp.post_send(&SendWr {
        wr_id: 1,
        op: WrOp::Send,
        sg_list: &sge,
        signaled: true,
        inline: false,
    })
    .unwrap();
    let rx = poll_n(&b.recv_cq, 1, T);
    assert_eq!(rx.len(), 1);
    assert_eq!(
        (rx[0].wr_id, rx[0].status, rx[0].byte_len),
        (7, WcStatus::Success, 3000)
    );
    assert_eq!(b.read(0, 3000), data);
    let tx = poll_n(&a.send_cq, 1, T);
    assert_eq!(
        (tx[0].status, tx[0].opcode),
        (WcStatus::Success, WcOpcode::Send)
    );
}

#[test]
fn rdma_write_from_and_read_into_user_memory_move_the_bytes() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    let src =
        a.pd.reg_user(UserRegion::new(pattern(3, 512)), Access::default())
            .unwrap();
    let write = WrOp::Write {
        remote_addr: b.mr.addr() + 100,
        rkey: b.mr.rkey(),
    };
    let sge = [src.sge(0, 512).unwrap()];
    let wr = SendWr {
        wr_id: 1,
        op: write,
        sg_list: &sge,
        signaled: true,
        inline: false,
    };
    a.qp.post_send(&wr).unwrap();
    assert_eq!(poll_n(&a.send_cq, 1, T)[0].status, WcStatus::Success);
    assert_eq!(b.read(100, 512), pattern(3, 512));

    let dst =
        a.pd.reg_user(UserRegion::new_mut(vec![0u8; 256]), Access::LOCAL_WRITE)
            .unwrap();
    b.write(2000, &pattern(9, 256));
    let sge = [dst.sge(0, 256).unwrap()];
    let read = SendWr {
        wr_id: 2,
        op: WrOp::Read {
            remote_addr: b.mr.addr() + 2000,
            rkey: b.mr.rkey(),
        },
        sg_list: &sge,
        signaled: true,
        inline: false,
    };
    a.qp.post_send(&read).unwrap();
    let tx = poll_n(&a.send_cq, 1, T);
    assert_eq!((tx[0].status, tx[0].byte_len), (WcStatus::Success, 256));
    let mut got = vec![0u8; 256];
    // SAFETY: the MR covers 256 bytes of live memory it keeps alive; the READ completed.
    unsafe { std::ptr::copy_nonoverlapping(dst.memory().as_ptr(), got.as_mut_ptr(), 256) };
    assert_eq!(got, pattern(9, 256));
}

#[test]
fn a_read_only_region_refuses_write_access_and_an_empty_one_any() {
    let s = side(QpCap::default(), 4096);
    for access in [
        Access::LOCAL_WRITE,
        Access::REMOTE_WRITE | Access::LOCAL_WRITE,
    ] {
        let e =
            s.pd.reg_user(UserRegion::new(vec![1u8; 64]), access)
                .unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{access:?}: {e}");
    }
    let e =
        s.pd.reg_user(UserRegion::new(Vec::<u8>::new()), Access::default())
            .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
}

/// Sets its flag when dropped.
struct Owner(Vec<u8>, Arc<AtomicBool>);

impl AsRef<[u8]> for Owner {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.1.store(true, Ordering::SeqCst);
    }
}

#[test]
fn the_mr_keeps_the_owner_alive_until_it_is_deregistered() {
    let s = side(QpCap::default(), 4096);
    let dropped = Arc::new(AtomicBool::new(false));
    let region = UserRegion::new(Owner(vec![7u8; 128], dropped.clone()));
    let (addr, id) = (region.addr(), region.id());
    assert_eq!(region.clone().id(), id, "clones share the owner's identity");
    assert_ne!(UserRegion::new(vec![0u8; 1]).id(), id);
    let mr = s.pd.reg_user(region, Access::default()).unwrap();
    assert_eq!(mr.addr(), addr);
    assert!(!dropped.load(Ordering::SeqCst), "the MR holds the owner");
    let clone = mr.clone();
    drop(mr);
    assert!(
        !dropped.load(Ordering::SeqCst),
        "a clone of the MR still holds it"
    );
    drop(clone);
    assert!(
        dropped.load(Ordering::SeqCst),
        "the last MR handle releases the owner"
    );
}

#[test]
fn reg_raw_registers_memory_the_caller_keeps_alive() {
    let (a, b) = pair(QpCap::default(), ConnectAttr::default());
    let mut buf = pattern(0x11, 700);
    // SAFETY: `buf` outlives the MR (dropped at the end of the test, after `mr`) and is not
    // touched while the MR lives.
    let mr = unsafe { a.pd.reg_raw(buf.as_mut_ptr(), buf.len(), Access::default()) }.unwrap();
    b.post_recv(1, 0, 1024);
    let sge = [mr.sge(0, 700).unwrap()];
    a.qp.post_send(&SendWr {
        wr_id: 1,
        op: WrOp::Send,
        sg_list: &sge,
        signaled: true,
        inline: false,
    })
    .unwrap();
    assert_eq!(poll_n(&b.recv_cq, 1, T)[0].byte_len, 700);
    assert_eq!(b.read(0, 700), pattern(0x11, 700));
    assert_eq!(poll_n(&a.send_cq, 1, T)[0].status, WcStatus::Success);
    drop(mr);
    drop(buf);
}

#[test]
fn soft_refuses_remote_access_on_user_memory_as_a_device_capability() {
    let s = soft_side(QpCap::default(), 4096);
    let ctx = soft();
    assert!(ctx.query().remote_access_needs_shared);
    for access in [
        Access::REMOTE_READ,
        Access::REMOTE_WRITE | Access::LOCAL_WRITE,
        Access::ALL,
    ] {
        let e =
            s.pd.reg_user(UserRegion::new_mut(vec![0u8; 64]), access)
                .unwrap_err();
        assert!(matches!(e, Error::Unsupported(_)), "{access:?}: {e}");
        assert!(e.to_string().contains("remote_access_needs_shared"), "{e}");
    }
    s.pd.reg_user(UserRegion::new_mut(vec![0u8; 64]), Access::LOCAL_WRITE)
        .expect("local write is allowed");
}

#[test]
fn soft_refuses_user_memory_as_a_receive_buffer() {
    let (a, _b) = soft_pair(QpCap::default(), ConnectAttr::default());
    let mr =
        a.pd.reg_user(UserRegion::new_mut(vec![0u8; 64]), Access::LOCAL_WRITE)
            .unwrap();
    let sge = [mr.sge(0, 64).unwrap()];
    let e =
        a.qp.post_recv(&RecvWr {
            wr_id: 1,
            sg_list: &sge,
        })
        .unwrap_err();
    assert!(matches!(e, Error::Unsupported(_)), "{e}");
    // Shared memory still works as a receive buffer on the same QP.
    a.post_recv(2, 0, 64);
}
