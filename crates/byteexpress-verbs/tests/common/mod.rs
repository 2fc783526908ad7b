//! Helpers shared by the soft provider's integration tests.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use byteexpress_verbs::{
    Access, ConnectAttr, Context, Cq, Mr, Pd, Qp, QpCap, RecvWr, SendWr, Sge, SharedMem, Wc, WrOp,
    devices,
};

/// The soft device of this process.
pub fn soft() -> Context {
    devices()
        .into_iter()
        .find(|d| d.name() == "soft0")
        .expect("soft0 is listed")
        .open()
        .expect("soft0 opens")
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

pub fn side(cap: QpCap, mem_len: usize) -> Side {
    let ctx = soft();
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

/// Two sides of one process, connected to each other.
pub fn pair(cap: QpCap, attr: ConnectAttr) -> (Side, Side) {
    let a = side(cap, 1 << 16);
    let b = side(cap, 1 << 16);
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
