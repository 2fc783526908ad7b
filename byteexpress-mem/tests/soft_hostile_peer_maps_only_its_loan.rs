//! On the soft provider a peer maps the memory lent to it, and what is mapped cannot be revoked;
//! the guarantee is isolation (issue 23: "a hostile peer's direct mapping holds only that
//! message, read-only, and nothing of another peer"). Tried by a hostile peer process that
//! speaks the soft device's control protocol itself (byteexpress-verbs' raw-peer test
//! infrastructure, `tests/common/raw.rs`) and inspects every fd it is given.
//!
//! The lender is built as byteexpress-rpc builds a link (`setup.rs` `build_rdma`,
//! `engine/rdma/lend.rs`): a PD per link with its one QP (finished), `access` REMOTE_READ, a
//! [`LargePool`] of readable-class memory, a message copied into one of its buffers and lent by
//! a window bound over exactly its bytes (the soft device bounds windows by their range:
//! `DeviceAttr::mw_range_checked`), or by an MR of its own where it did not. It lends message X
//! to the raw peer on one link and message Y to an ordinary peer on another link of the same
//! process (Y's peer READs it, so Y is lent indeed). The raw peer then holds X's region as one
//! read-only fd of the link's read-only arena: the whole region, rounded up to 2 MiB
//! ([`byteexpress_mem::REGION_ALIGN`]), not only X's bytes; that region holds nothing but X
//! (a lend pool's regions serve that link only).
//!
//! The peer is this test binary started again (`child_entry`, role `borrower`).

#[path = "../../byteexpress-verbs/tests/common/mod.rs"]
mod verbs_common;

use std::net::TcpStream;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::Duration;

use byteexpress_mem::{LargeBuf, LargePool, REGION_ALIGN};
use byteexpress_verbs::{
    Access, ConnectAttr, Context, Cq, Mr, Mw, MwBind, Pd, Qp, QpCap, SendWr, WcOpcode, WcStatus,
    WrOp,
};
use verbs_common::peer::{self, get, put};
use verbs_common::raw::{self, OFF_ANNOUNCED, attach, recv_msg};
use verbs_common::{Side, poll_n, soft};

const T: Duration = Duration::from_secs(10);
/// Bytes of each lent message: not a multiple of the page size.
const LEN: usize = 3 * 4096 + 5;
/// Where each message carries its distinctive 64-byte marker.
const MARK_AT: usize = 5000;

#[test]
fn child_entry() {
    let Some((role, mut s)) = peer::peer_role() else {
        return;
    };
    match role.as_str() {
        "borrower" => child_borrower(&mut s),
        other => panic!("unknown role {other}"),
    }
}

/// A message of `LEN` bytes: a pattern from `seed` with `mark` at [`MARK_AT`].
fn message(seed: u8, mark: &[u8; 64]) -> Vec<u8> {
    let mut m: Vec<u8> = (0..LEN)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
        .collect();
    m[MARK_AT..MARK_AT + 64].copy_from_slice(mark);
    m
}

/// A 64-byte marker no other bytes of the test hold by chance: `tag`, this process's id, and
/// filler derived from both.
fn marker(tag: &str) -> [u8; 64] {
    let mut m = [0u8; 64];
    let head = format!("bx-loan-{tag}-{}-", std::process::id());
    m[..head.len()].copy_from_slice(head.as_bytes());
    for (i, b) in m[head.len()..].iter_mut().enumerate() {
        *b = b'a' + ((i * 7 + tag.len() * 3) % 26) as u8;
    }
    m
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

/// A link's PD and its one QP (finished, as a link's), with a local-only buffer: the verbs
/// tests' [`Side`], of which the raw-peer helpers use the QP.
fn link_side(ctx: &Context) -> Side {
    let pd = ctx.alloc_pd().unwrap();
    let send_cq = ctx.create_cq(64).unwrap();
    let recv_cq = ctx.create_cq(64).unwrap();
    let qp = pd.create_qp(&send_cq, &recv_cq, QpCap::default()).unwrap();
    pd.finish_qps();
    let mem = pd.alloc_shared_for(4096, Access::LOCAL_WRITE).unwrap();
    let mr = pd.reg_shared(&mem, 0, 4096, Access::LOCAL_WRITE).unwrap();
    Side {
        pd,
        qp,
        send_cq,
        recv_cq,
        mem,
        mr,
    }
}

/// A message lent as the engine lends it; the grant drops before the memory.
struct Loan {
    rkey: u32,
    _mw: Option<Mw>,
    _mr: Option<Mr>,
    buf: LargeBuf,
}

/// Copies `bytes` into a buffer of a lend pool of `pd` made as `build_rdma` makes it, and lends
/// it to the peer of `qp` (its send completions on `cq`) as `lend.rs` does.
fn lend(ctx: &Context, pd: &Pd, qp: &Qp, cq: &Cq, bytes: &[u8]) -> Loan {
    let windows = ctx.query().mw_range_checked;
    let access = if windows {
        Access::LOCAL_WRITE | Access::MW_BIND
    } else {
        Access(0)
    };
    let pool = LargePool::new(pd, access, true, 8 << 20);
    let mut buf = pool.alloc(bytes.len()).unwrap();
    buf.fill(&[bytes]).unwrap();
    if !windows {
        let mr = buf.lend(0, bytes.len(), Access::REMOTE_READ).unwrap();
        return Loan {
            rkey: mr.rkey(),
            _mw: None,
            _mr: Some(mr),
            buf,
        };
    }
    let mw = pd.alloc_mw().unwrap();
    qp.post_send(&SendWr {
        wr_id: 0xb1,
        op: WrOp::BindMw(MwBind {
            mw: &mw,
            mr: buf.mr(),
            addr: buf.addr(),
            len: bytes.len() as u64,
            access: Access::REMOTE_READ,
        }),
        sg_list: &[],
        signaled: true,
        inline: false,
    })
    .unwrap();
    let wc = poll_n(cq, 1, T);
    assert_eq!(
        wc.iter()
            .map(|w| (w.wr_id, w.status, w.opcode))
            .collect::<Vec<_>>(),
        [(0xb1, WcStatus::Success, WcOpcode::BindMw)]
    );
    Loan {
        rkey: mw.rkey(),
        _mw: Some(mw),
        _mr: None,
        buf,
    }
}

/// Whether `hay` contains `needle`.
fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// A whole-file shared mapping of `fd` with `prot`, handed to `f`, unmapped after; `None` when
/// the file is empty (a socket) or the mapping is refused.
fn with_mapping<R>(fd: RawFd, prot: libc::c_int, f: impl FnOnce(*mut u8, usize) -> R) -> Option<R> {
    // SAFETY: fstat into a zeroed stat; a fresh shared mapping of an fd we hold, used only
    // inside `f` and unmapped before returning.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut st) != 0 || st.st_size == 0 {
            return None;
        }
        let len = st.st_size as usize;
        let p = libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, 0);
        if p == libc::MAP_FAILED {
            return None;
        }
        let r = f(p.cast(), len);
        libc::munmap(p, len);
        Some(r)
    }
}

/// The borrower: attaches to the lender's QP as a peer process would, reads every
/// announcement the lender sent (regions with their fds, MRs and windows) and reports, one
/// line per fact, what the fds it holds give it.
fn child_borrower(s: &mut TcpStream) {
    let at = attach(s);
    let x = get(s);
    let x_rkey = u32::from_le_bytes(get(s).try_into().unwrap());
    let y_mark = get(s);
    assert_eq!(get(s), b"inspect");
    // SAFETY: OFF_ANNOUNCED is inside the mapped header, 8-aligned.
    let n = unsafe { raw::get64(at.victim_ring, OFF_ANNOUNCED) };
    // Region { id, offset, len } with its fd; MrAdd { key, region, offset, len, ... }.
    let mut regions: Vec<(u64, u64, u64, OwnedFd)> = Vec::new();
    let mut grants: Vec<(u32, u64, u64, u64)> = Vec::new();
    let u64_at = |m: &[u8], i: usize| u64::from_le_bytes(m[i..i + 8].try_into().unwrap());
    for _ in 0..n {
        let (m, mut fds) = recv_msg(at.chan.as_raw_fd());
        match m[0] {
            5 => regions.push((u64_at(&m, 1), u64_at(&m, 9), u64_at(&m, 17), fds.remove(0))),
            6 => grants.push((
                u32::from_le_bytes(m[1..5].try_into().unwrap()),
                u64_at(&m, 5),
                u64_at(&m, 13),
                u64_at(&m, 21),
            )),
            _ => {}
        }
    }
    let mut facts = Vec::new();
    facts.push(format!("region fds: {}", regions.len()));
    for (_, off, len, fd) in &regions {
        let size = with_mapping(fd.as_raw_fd(), libc::PROT_READ, |_, l| l).unwrap_or(0);
        facts.push(format!(
            "region: {len} bytes at {off} of an fd of {size} bytes"
        ));
    }
    // The grant under X's rkey: which region, where, how many bytes.
    let x_grant = grants.iter().find(|g| g.0 == x_rkey);
    facts.push(format!(
        "grant of the loan's rkey covers exactly the message: {}",
        x_grant.is_some_and(|g| g.3 == x.len() as u64)
    ));
    // X's bytes where the grant says, through a read-only mapping of its region's fd.
    let readable = x_grant.is_some_and(|&(_, region, off, len)| {
        regions.iter().any(|(id, roff, _, fd)| {
            *id == region
                && with_mapping(fd.as_raw_fd(), libc::PROT_READ, |p, l| {
                    let at = (roff + off) as usize;
                    // SAFETY: `l` bytes of the live read-only mapping.
                    let b = unsafe { std::slice::from_raw_parts(p, l) };
                    at + len as usize <= l && b[at..at + len as usize] == x[..]
                })
                .unwrap_or(false)
        })
    });
    facts.push(format!("message readable where its grant says: {readable}"));
    let every_region_holds_x = regions.iter().all(|(_, _, _, fd)| {
        with_mapping(fd.as_raw_fd(), libc::PROT_READ, |p, l| {
            // SAFETY: `l` bytes of the live read-only mapping.
            contains(unsafe { std::slice::from_raw_parts(p, l) }, &x)
        })
        .unwrap_or(false)
    });
    facts.push(format!(
        "every region fd holds the message: {every_region_holds_x}"
    ));
    // Nothing else: every byte of every region fd but the message's is zero (never written).
    let only_x = regions.iter().all(|(_, _, _, fd)| {
        with_mapping(fd.as_raw_fd(), libc::PROT_READ, |p, l| {
            // SAFETY: `l` bytes of the live read-only mapping.
            let b = unsafe { std::slice::from_raw_parts(p, l) };
            let at = b.windows(x.len()).position(|w| w == &x[..]);
            at.is_some_and(|i| {
                b[..i].iter().all(|&v| v == 0) && b[i + x.len()..].iter().all(|&v| v == 0)
            })
        })
        .unwrap_or(false)
    });
    facts.push(format!("region fds hold nothing but the message: {only_x}"));
    let mut writable = false;
    for (_, _, _, fd) in &regions {
        let w = libc::PROT_READ | libc::PROT_WRITE;
        writable |= with_mapping(fd.as_raw_fd(), w, |_, _| ()).is_some();
        writable |= with_mapping(fd.as_raw_fd(), libc::PROT_READ, |p, l| {
            // SAFETY: `p` is the live mapping of `l` bytes; mprotect only changes its rights.
            unsafe { libc::mprotect(p.cast(), l, w) == 0 }
        })
        .unwrap_or(false);
    }
    facts.push(format!("a region fd mapped or made writable: {writable}"));
    // Every fd this process holds from the lender: its QP's ring and staging region (and
    // doorbell, a socket), and every region.
    let held: Vec<RawFd> = at
        .victim_fds
        .iter()
        .map(AsRawFd::as_raw_fd)
        .chain(regions.iter().map(|r| r.3.as_raw_fd()))
        .collect();
    let y_seen = held.iter().any(|&fd| {
        with_mapping(fd, libc::PROT_READ, |p, l| {
            // SAFETY: `l` bytes of the live read-only mapping.
            contains(unsafe { std::slice::from_raw_parts(p, l) }, &y_mark)
        })
        .unwrap_or(false)
    });
    facts.push(format!("fds held: {}", held.len()));
    facts.push(format!("another peer's message in a held fd: {y_seen}"));
    put(s, facts.join("\n").as_bytes());
    assert_eq!(get(s), b"done");
    drop(at); // open to the end: its close would be the lender's QP's death
}

#[test]
fn a_raw_peer_maps_only_its_own_loan_read_only_and_nothing_lent_to_another_peer() {
    if peer::peer_role().is_some() {
        return;
    }
    let ctx = soft();
    let (x_mark, y_mark) = (marker("x"), marker("y"));
    let (x, y) = (message(1, &x_mark), message(2, &y_mark));
    assert!(!contains(&x, &y_mark));

    // Link Y: lent to an ordinary peer of another PD, which READs it.
    let ly = link_side(&ctx);
    let py = link_side(&ctx);
    ly.qp.connect(&py.qp.endpoint(), &connect_attr()).unwrap();
    py.qp.connect(&ly.qp.endpoint(), &connect_attr()).unwrap();
    let y_loan = lend(&ctx, &ly.pd, &ly.qp, &ly.send_cq, &y);
    let dst = py.pd.alloc_shared_for(LEN, Access::LOCAL_WRITE).unwrap();
    let dst_mr = py.pd.reg_shared(&dst, 0, LEN, Access::LOCAL_WRITE).unwrap();
    py.qp
        .post_send(&SendWr {
            wr_id: 0xa1,
            op: WrOp::Read {
                remote_addr: y_loan.buf.addr(),
                rkey: y_loan.rkey,
            },
            sg_list: &[dst_mr.sge(0, LEN as u32).unwrap()],
            signaled: true,
            inline: false,
        })
        .unwrap();
    let wc = poll_n(&py.send_cq, 1, T);
    assert_eq!(
        (wc[0].wr_id, wc[0].status),
        (0xa1, WcStatus::Success),
        "Y's peer READs Y"
    );
    // SAFETY: the READ completed; `LEN` bytes of the live mapping.
    let read = unsafe { std::slice::from_raw_parts(dst.as_ptr(), LEN) };
    assert_eq!(read, &y[..]);

    // Link X: the raw peer attaches to its QP; X is lent to it.
    let lx = link_side(&ctx);
    let nonce = 0x10A4_u64 ^ u64::from(std::process::id());
    let (mut child, mut s) =
        raw::raw_peer_connected(&ctx, &lx, "child_entry", "borrower", nonce, &connect_attr());
    let x_loan = lend(&ctx, &lx.pd, &lx.qp, &lx.send_cq, &x);
    assert_eq!(x_loan.buf.capacity(), REGION_ALIGN);
    put(&mut s, &x);
    put(&mut s, &x_loan.rkey.to_le_bytes());
    put(&mut s, &y_mark);
    put(&mut s, b"inspect");
    let facts = String::from_utf8(get(&mut s)).unwrap();
    put(&mut s, b"done");
    assert!(
        child.wait().unwrap().success(),
        "the borrower ran to the end"
    );
    eprintln!("the borrower saw:\n{facts}");
    for want in [
        "region fds: 1".to_string(),
        format!("region: {REGION_ALIGN} bytes at 0 of an fd of {REGION_ALIGN} bytes"),
        "grant of the loan's rkey covers exactly the message: true".into(),
        "message readable where its grant says: true".into(),
        "every region fd holds the message: true".into(),
        "region fds hold nothing but the message: true".into(),
        "a region fd mapped or made writable: false".into(),
        "another peer's message in a held fd: false".into(),
    ] {
        assert!(
            facts.lines().any(|l| l == want),
            "want {want:?}; the peer saw:\n{facts}"
        );
    }
    // Y is still lent to its own peer and unchanged.
    assert_eq!(y_loan.buf.as_slice(), &y[..]);
    drop((x_loan, y_loan));
}
