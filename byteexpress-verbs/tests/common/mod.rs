//! Helpers shared by this crate's integration tests.
//!
//! [`provider`] is the device under test of the conformance suite, chosen by `BX_PROVIDER`
//! (`soft`, the default, or `ibverbs`: the first rdma-core device, or `BX_DEVICE`). An
//! unavailable provider fails the test; nothing skips.
#![allow(dead_code)]

pub mod peer;
pub mod raw;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use byteexpress_verbs::{
    Access, ConnectAttr, Context, Cq, Mr, Pd, Qp, QpCap, RecvWr, SendWr, Sge, SharedMem, Wc, WrOp,
    devices,
};

/// The soft device of this process.
pub fn soft() -> Context {
    byteexpress_verbs::soft_device()
        .expect("soft0 is listed")
        .open()
        .expect("soft0 opens")
}

/// The provider the conformance suite runs on: `BX_PROVIDER=soft|ibverbs` (default soft).
pub fn provider_kind() -> String {
    std::env::var("BX_PROVIDER").unwrap_or_else(|_| "soft".into())
}

/// Opens a device of the selected provider; panics (fails the test) when it cannot.
pub fn open_provider() -> Context {
    match provider_kind().as_str() {
        "soft" => soft(),
        "ibverbs" => {
            let names = byteexpress_verbs::ibverbs_devices()
                .expect("BX_PROVIDER=ibverbs, but rdma-core lists no device");
            let want = std::env::var("BX_DEVICE").unwrap_or_else(|_| names[0].clone());
            devices()
                .into_iter()
                .find(|d| d.is_hardware() && d.name() == want)
                .unwrap_or_else(|| panic!("no rdma-core device {want:?} among {names:?}"))
                .open()
                .unwrap_or_else(|e| panic!("opening {want}: {e}"))
        }
        other => panic!("BX_PROVIDER={other:?}: expected soft or ibverbs"),
    }
}

/// The device under test, opened once per test binary.
pub fn provider() -> Context {
    static CTX: OnceLock<Context> = OnceLock::new();
    CTX.get_or_init(open_provider).clone()
}

/// One QP with its own CQs and one registered buffer.
pub struct Side {
    pub pd: Pd,
    pub qp: Qp,
    pub send_cq: Cq,
    pub recv_cq: Cq,
    pub mem: SharedMem,
    pub mr: Mr,
}

/// A side on the device under test.
pub fn side(cap: QpCap, mem_len: usize) -> Side {
    side_on(&provider(), cap, mem_len)
}

/// A side on the soft device, for soft-only tests.
pub fn soft_side(cap: QpCap, mem_len: usize) -> Side {
    side_on(&soft(), cap, mem_len)
}

pub fn side_on(ctx: &Context, cap: QpCap, mem_len: usize) -> Side {
    let pd = ctx.alloc_pd().unwrap();
    let send_cq = ctx.create_cq(4096).unwrap();
    let recv_cq = ctx.create_cq(4096).unwrap();
    let qp = pd.create_qp(&send_cq, &recv_cq, cap).unwrap();
    let mem = pd.alloc_shared(mem_len).unwrap();
    let mr = pd.reg_shared(&mem, 0, mem.len(), Access::ALL).unwrap();
    Side {
        pd,
        qp,
        send_cq,
        recv_cq,
        mem,
        mr,
    }
}

/// Two sides of one process on the device under test, connected to each other.
pub fn pair(cap: QpCap, attr: ConnectAttr) -> (Side, Side) {
    pair_on(&provider(), cap, attr)
}

/// Two connected sides on the soft device.
pub fn soft_pair(cap: QpCap, attr: ConnectAttr) -> (Side, Side) {
    pair_on(&soft(), cap, attr)
}

pub fn pair_on(ctx: &Context, cap: QpCap, attr: ConnectAttr) -> (Side, Side) {
    let a = side_on(ctx, cap, 1 << 16);
    let b = side_on(ctx, cap, 1 << 16);
    a.qp.connect(&b.qp.endpoint(), &attr).unwrap();
    b.qp.connect(&a.qp.endpoint(), &attr).unwrap();
    (a, b)
}

/// Short timers so error paths finish fast: RNR 0.01 ms, ACK timeout ≈ 4 ms × 2.
pub fn fast_attr() -> ConnectAttr {
    ConnectAttr {
        min_rnr_timer: 1,
        timeout: 10,
        retry_cnt: 1,
        ..ConnectAttr::default()
    }
}

impl Side {
    /// Posts an unsignaled SEND `wr_id` of 8 bytes whose SGE names this side's memory with a
    /// wrong lkey (the send must fail with a local protection error).
    pub fn send_with_bad_lkey(&self, wr_id: u64) {
        let sge = [Sge {
            addr: self.mr.addr(),
            len: 8,
            lkey: self.mr.lkey() ^ 0x5555,
        }];
        let wr = SendWr {
            wr_id,
            op: WrOp::Send,
            sg_list: &sge,
            signaled: false,
            inline: false,
        };
        self.qp.post_send(&wr).unwrap();
    }

    /// Posts receive `wr_id` of 64 bytes whose SGE names this side's memory with a wrong lkey
    /// (a SEND landing in it must fail this side with a local protection error).
    pub fn post_recv_with_bad_lkey(&self, wr_id: u64) {
        let sge = [Sge {
            addr: self.mr.addr(),
            len: 64,
            lkey: self.mr.lkey() ^ 0x777,
        }];
        self.qp
            .post_recv(&RecvWr {
                wr_id,
                sg_list: &sge,
            })
            .unwrap();
    }

    pub fn sge(&self, off: usize, len: u32) -> Sge {
        Sge {
            addr: self.mr.addr() + off as u64,
            len,
            lkey: self.mr.lkey(),
        }
    }

    pub fn write(&self, off: usize, bytes: &[u8]) {
        assert!(off + bytes.len() <= self.mem.len());
        // SAFETY: in bounds of the live mapping (checked above); no send reads it right now.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.mem.as_ptr().add(off), bytes.len())
        };
    }

    pub fn read(&self, off: usize, len: usize) -> Vec<u8> {
        assert!(off + len <= self.mem.len());
        let mut v = vec![0u8; len];
        // SAFETY: in bounds of the live mapping (checked above); the message is complete.
        unsafe { std::ptr::copy_nonoverlapping(self.mem.as_ptr().add(off), v.as_mut_ptr(), len) };
        v
    }

    pub fn post_recv(&self, wr_id: u64, off: usize, len: u32) {
        let sge = [self.sge(off, len)];
        self.qp
            .post_recv(&RecvWr {
                wr_id,
                sg_list: &sge,
            })
            .unwrap();
    }

    pub fn send(
        &self,
        wr_id: u64,
        op: WrOp,
        off: usize,
        len: u32,
        signaled: bool,
    ) -> byteexpress_verbs::Result<()> {
        let sge = [self.sge(off, len)];
        self.qp.post_send(&SendWr {
            wr_id,
            op,
            sg_list: &sge,
            signaled,
            inline: false,
        })
    }
}

/// Polls `cq` until `n` completions arrived or `timeout` passed.
pub fn poll_n(cq: &Cq, n: usize, timeout: Duration) -> Vec<Wc> {
    let t0 = Instant::now();
    let mut out = Vec::new();
    let mut buf = [Wc::default(); 16];
    while out.len() < n && t0.elapsed() < timeout {
        let k = cq.poll(&mut buf).unwrap();
        out.extend_from_slice(&buf[..k]);
        if k == 0 {
            std::thread::yield_now();
        }
    }
    out
}

/// Everything `cq` yields within `d`.
pub fn poll_for(cq: &Cq, d: Duration) -> Vec<Wc> {
    poll_n(cq, usize::MAX, d)
}
