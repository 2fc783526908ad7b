//! Least access (issue 22, DESIGN.md 3.2), tried by a peer holding leaked keys, on the provider
//! `BX_PROVIDER` selects: `soft` (default, on any host) or `ibverbs` (rxe0 inside the Soft-RoCE
//! VM, through `scripts/vm-tests.sh`). An unavailable provider fails the test; nothing skips.
//!
//! The receive ring is built with the very constructor a link uses ([`BufPool::for_receives`],
//! byteexpress-rpc's `build_rdma`), on a PD whose QP grants the peer every access
//! (`qp_access_flags` = all), so only the MR's flags can stop a remote WRITE. Each probe has a
//! control that grants the access and must succeed, so a failure proves the flags, not a broken
//! set-up. A remote access error moves the responder's QP to ERR on a NIC, so every probe gets a
//! fresh pair of QPs.

use std::time::Duration;

use byteexpress_mem::{BufPool, Pool, PoolConfig, RegisteredBuf};
use byteexpress_verbs::{
    Access, ConnectAttr, Context, Cq, Mr, Pd, Qp, QpCap, SendWr, SharedMem, Wc, WcStatus, WrOp,
};
use bytes::BufMut;

const PROBE: usize = 64;

mod common;
use common::provider;

/// The next completion of `cq`, polling for up to 10 s.
fn wait_one(cq: &Cq) -> Wc {
    common::completion_within(cq, Duration::from_secs(10))
}

/// A link's side (`pd`, whose pools are probed) and a peer connected to it with its own PD and a
/// local buffer to WRITE from or READ into.
struct Pair {
    pd: Pd,
    _qp: Qp,
    _cq: Cq,
    peer_qp: Qp,
    peer_cq: Cq,
    peer_mem: SharedMem,
    peer_mr: Mr,
}

impl Pair {
    fn new(ctx: &Context) -> Pair {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16).unwrap();
        let qp = pd.create_qp(&cq, &cq, QpCap::default()).unwrap();
        pd.finish_qps(); // as a link does, before its pools are built
        let peer_pd = ctx.alloc_pd().unwrap();
        let peer_cq = ctx.create_cq(16).unwrap();
        let peer_qp = peer_pd
            .create_qp(&peer_cq, &peer_cq, QpCap::default())
            .unwrap();
        let peer_mem = peer_pd.alloc_shared(4096).unwrap();
        let peer_mr = peer_pd
            .reg_shared(&peer_mem, 0, 4096, Access::LOCAL_WRITE)
            .unwrap();
        peer_pd.finish_qps();
        // Both QPs grant every access: only the probed MR's flags decide.
        let attr = ConnectAttr {
            access: Access::ALL,
            ..ConnectAttr::default()
        };
        qp.connect(&peer_qp.endpoint(), &attr).unwrap();
        peer_qp.connect(&qp.endpoint(), &attr).unwrap();
        Pair {
            pd,
            _qp: qp,
            _cq: cq,
            peer_qp,
            peer_cq,
            peer_mem,
            peer_mr,
        }
    }

    fn peer_bytes(&self, len: usize) -> &[u8] {
        // SAFETY: `len` ≤ 4096 bytes of the peer's live mapping; no WR is in flight when read.
        unsafe { std::slice::from_raw_parts(self.peer_mem.as_ptr(), len) }
    }

    /// The peer RDMA WRITEs `PROBE` bytes of 0xee at `addr` with `rkey`; the status.
    fn write(&self, addr: u64, rkey: u32) -> WcStatus {
        // SAFETY: PROBE ≤ 4096 bytes of the peer's live mapping; nothing is in flight.
        unsafe { std::ptr::write_bytes(self.peer_mem.as_ptr(), 0xee, PROBE) };
        self.post(
            WrOp::Write {
                remote_addr: addr,
                rkey,
            },
            PROBE,
        )
    }

    /// The peer RDMA READs `len` bytes at `addr` with `rkey` into its buffer; the status.
    fn read(&self, addr: u64, rkey: u32, len: usize) -> WcStatus {
        // SAFETY: as in `write`.
        unsafe { std::ptr::write_bytes(self.peer_mem.as_ptr(), 0, 4096) };
        self.post(
            WrOp::Read {
                remote_addr: addr,
                rkey,
            },
            len,
        )
    }

    fn post(&self, op: WrOp, len: usize) -> WcStatus {
        let sge = [self.peer_mr.sge(0, len as u32).unwrap()];
        self.peer_qp
            .post_send(&SendWr {
                wr_id: 7,
                op,
                sg_list: &sge,
                signaled: true,
                inline: false,
            })
            .unwrap();
        let wc = wait_one(&self.peer_cq);
        assert_eq!(wc.wr_id, 7, "{wc:?}");
        wc.status
    }
}

fn receive_buffer(pool: &BufPool) -> RegisteredBuf {
    let buf = pool.alloc().unwrap();
    assert!(buf.as_slice().is_empty());
    buf
}

/// The bytes of `buf`'s memory, filled or not (what a WRITE may have changed).
fn memory_of(buf: &RegisteredBuf, len: usize) -> Vec<u8> {
    assert!(len <= buf.capacity());
    // SAFETY: `len` ≤ capacity bytes of the live buffer; no WR is in flight when read.
    unsafe { std::slice::from_raw_parts(buf.addr() as *const u8, len) }.to_vec()
}

#[test]
fn a_remote_write_into_a_links_receive_buffer_with_its_leaked_rkey_fails_with_a_remote_access_error()
 {
    let ctx = provider();
    let pair = Pair::new(&ctx);
    let pool = BufPool::for_receives(&pair.pd, 4096, 4).unwrap();
    let buf = receive_buffer(&pool);
    let st = pair.write(buf.addr(), buf.rkey());
    assert_eq!(
        st,
        WcStatus::RemAccessErr,
        "a peer WROTE into a link's receive buffer with its address and rkey"
    );
    assert_eq!(
        memory_of(&buf, PROBE),
        vec![0u8; PROBE],
        "the buffer changed"
    );

    // Control: the same WRITE into a pool that grants REMOTE_WRITE lands.
    let pair = Pair::new(&ctx);
    let open = BufPool::new(
        &pair.pd,
        4096,
        4,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
    )
    .unwrap();
    let buf = receive_buffer(&open);
    assert_eq!(pair.write(buf.addr(), buf.rkey()), WcStatus::Success);
    assert_eq!(memory_of(&buf, PROBE), vec![0xee; PROBE]);
}

#[test]
fn a_remote_read_of_a_links_send_buffer_with_its_leaked_rkey_fails_with_a_remote_access_error() {
    let ctx = provider();
    let pair = Pair::new(&ctx);
    let pool = BufPool::for_sends(&pair.pd, 4096, 4).unwrap();
    let mut buf = pool.alloc().unwrap();
    buf.put_slice(&[0x5a; PROBE]);
    assert_eq!(
        pair.read(buf.addr(), buf.rkey(), PROBE),
        WcStatus::RemAccessErr,
        "a peer READ a link's send buffer with its address and rkey"
    );

    let pair = Pair::new(&ctx);
    let open = BufPool::new(&pair.pd, 4096, 4, Access::REMOTE_READ).unwrap();
    let mut buf = open.alloc().unwrap();
    buf.put_slice(&[0x5a; PROBE]);
    assert_eq!(pair.read(buf.addr(), buf.rkey(), PROBE), WcStatus::Success);
    assert_eq!(pair.peer_bytes(PROBE), &[0x5a; PROBE]);
}

fn message(pool: &Pool, len: usize) -> RegisteredBuf {
    let mut buf = pool.try_alloc(len).unwrap();
    let bytes: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(13) ^ 0x3c)
        .collect();
    buf.put_slice(&bytes);
    buf
}

/// The base of the rendezvous issue: a message lent for READ is readable with the loan's rkey
/// while the loan lasts, and with nothing else: not with the pool's own rkey, not beyond the
/// message's bytes, not after the loan ends.
#[test]
fn memory_lent_for_a_read_is_readable_for_that_message_only() {
    let ctx = provider();
    const LEN: usize = 1000;
    let pool_on = |pd: &Pd| {
        let cfg = PoolConfig {
            lends_for_read: true,
            ..PoolConfig::for_device(&ctx)
        };
        Pool::new(pd, cfg).unwrap()
    };

    // A pool not made to lend (a receive ring's, a reassembly pool's memory stays local)
    // refuses, on every provider.
    let pair = Pair::new(&ctx);
    let local = Pool::new(&pair.pd, PoolConfig::for_device(&ctx)).unwrap();
    assert!(
        matches!(
            local.lend_for_read(message(&local, LEN)),
            Err(byteexpress_mem::MemError::InvalidConfig(_))
        ),
        "a pool without lends_for_read lent a message"
    );

    // The pool itself grants no REMOTE_READ.
    let pair = Pair::new(&ctx);
    let pool = pool_on(&pair.pd);
    let buf = message(&pool, LEN);
    assert_eq!(
        pair.read(buf.addr(), buf.rkey(), LEN),
        WcStatus::RemAccessErr,
        "pool memory is READable without a loan"
    );

    // Lent: the message READs whole; once the loan ends, the same READ fails.
    let pair = Pair::new(&ctx);
    let pool = pool_on(&pair.pd);
    let buf = message(&pool, LEN);
    let want = buf.as_slice().to_vec();
    let loan = pool.lend_for_read(buf).unwrap();
    assert_eq!(loan.len(), LEN);
    assert_eq!(loan.access(), Access::REMOTE_READ);
    let (addr, rkey) = (loan.addr(), loan.rkey());
    assert_eq!(pair.read(addr, rkey, LEN), WcStatus::Success);
    assert_eq!(
        pair.peer_bytes(LEN),
        &want[..],
        "the READ returned other bytes"
    );
    let buf = loan.end();
    assert_eq!(buf.as_slice(), &want[..]);
    assert_eq!(
        pair.read(addr, rkey, LEN),
        WcStatus::RemAccessErr,
        "the loan's rkey still READs after the loan ended"
    );

    // The loan covers the message's bytes only: one byte past them is refused.
    let pair = Pair::new(&ctx);
    let pool = pool_on(&pair.pd);
    let loan = pool.lend_for_read(message(&pool, LEN)).unwrap();
    assert_eq!(
        pair.read(loan.addr(), loan.rkey(), LEN + 1),
        WcStatus::RemAccessErr,
        "a READ past the lent message succeeded"
    );
}

#[test]
fn only_filled_buffers_of_the_pool_itself_can_be_lent() {
    let ctx = provider();
    let pd = ctx.alloc_pd().unwrap();
    let lending = PoolConfig {
        lends_for_read: true,
        ..PoolConfig::for_device(&ctx)
    };
    let a = Pool::new(&pd, lending.clone()).unwrap();
    let b = Pool::new(&pd, lending).unwrap();
    assert!(matches!(
        a.lend_for_read(a.try_alloc(64).unwrap()),
        Err(byteexpress_mem::MemError::InvalidConfig(_))
    ));
    let mut foreign = b.try_alloc(64).unwrap();
    foreign.put_slice(&[1; 64]);
    assert!(matches!(
        a.lend_for_read(foreign),
        Err(byteexpress_mem::MemError::NotPoolMemory { len: 64, .. })
    ));
}
