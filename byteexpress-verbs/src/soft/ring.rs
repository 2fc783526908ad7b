//! The per-QP ring region in shared memory: the owner's receive ring (WQEs produced by the owner
//! in `post_recv`, claimed by the peer's sender) and the inbound completion ring (descriptors
//! produced by the peer's sender, consumed by the owner's CQ, which copies a SEND's payload
//! itself and then acknowledges it by advancing `comp_cons`: [`super::deliver`]).
//!
//! Layout (bytes; every index is a free-running u64 counter, slot = counter % cap):
//!
//! | offset | field | written by |
//! |---|---|---|
//! | 0 | `recv_prod` | owner (Release) |
//! | 64 | `recv_cons` (bit 63 = owner QP in ERR: claim refused) | peer (CAS), owner sets bit 63 |
//! | 128 | `comp_prod` | peer (Release) |
//! | 192 | `comp_cons` | owner (Release) |
//! | 256 | `armed` u32: owner's CQ sleeps, ring the doorbell | owner sets, peer clears |
//! | 320 | `announced`: control messages the owner sent after `Connect` | owner (Release) |
//! | 384 | `low_water`: 0, or (ring fed by an SRQ) the count of unclaimed WQEs at or below which the peer rings the owner's refill eventfd | owner, at creation |
//! | 448 | `tx_armed` u32: the peer's send CQ sleeps with sends awaiting acknowledgement: ring its send-CQ doorbell when `comp_cons` advances | peer sets, owner clears |
//! | 512 | `cap` receive WQEs of `16 + 16·max_sge` bytes: `num_sge u32, pad`, then `addr u64, len u32, lkey u32` per SGE (the peer only counts them: the owner delivers into its own private record of each WQE) | owner |
//! | … | `cap` completion slots of 64 bytes (below) | peer, except `ack` |
//!
//! A completion slot (the descriptor of one inbound message): `opcode u32` (RECV for a SEND,
//! RECV_RDMA_WITH_IMM for a WRITE_WITH_IMM), `status u32` (0), `byte_len u32`, `has_imm u32`,
//! `imm u32`, `src u32` (where a SEND's payload lies: 1 = in the peer's MR `key` at the peer's
//! address `addr`, 2 = at offset `addr` of the peer's staging region, 0 = nowhere: a
//! WRITE_WITH_IMM's data is already in place), `tag u64` (the completion's counter + 1: it
//! completes the receive WQE of that counter, which the peer claimed), `key u32`, `ack u32`
//! (written by the owner before it advances `comp_cons` past the slot: 0, or the status the
//! peer's send completes with), `addr u64`, `has_inv u32` (1: a SEND_WITH_INV, RECV only),
//! `inv u32` (the rkey of the owner's memory window it invalidates), 8 bytes of padding.
//!
//! Both sides validate every value the other side wrote before using it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::comp_slot::CompSlot;
use super::shm::Mapping;

const OFF_RECV_PROD: usize = 0;
const OFF_RECV_CONS: usize = 64;
const OFF_COMP_PROD: usize = 128;
const OFF_COMP_CONS: usize = 192;
const OFF_ARMED: usize = 256;
const OFF_ANNOUNCED: usize = 320;
const OFF_LOW_WATER: usize = 384;
const OFF_TX_ARMED: usize = 448;
const HDR: usize = 512;
const WQE_HDR: usize = 16;
const SGE: usize = 16;
const COMP: usize = 64;

/// Bit 63 of `recv_cons`: the owner's QP is in ERR; the peer may claim no more WQEs.
pub(crate) const ERR_BIT: u64 = 1 << 63;

/// A receive SGE as stored in the ring (owner's virtual address).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RawSge {
    pub addr: u64,
    pub len: u32,
    pub key: u32,
}

/// Where the payload of an inbound message lies (a completion slot's `src`, `key`, `addr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Src {
    /// Already in place (WRITE_WITH_IMM: the initiator wrote it into REMOTE_WRITE memory).
    Placed,
    /// In the sender's MR `key`, at the sender's virtual address `addr`.
    Mr { key: u32, addr: u64 },
    /// At offset `off` of the sender's staging region.
    Staged { off: u64 },
}

/// An inbound completion entry (a message's descriptor) as stored in the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RawComp {
    pub opcode: u32,
    pub status: u32,
    pub byte_len: u32,
    pub imm: Option<u32>,
    pub src: Src,
    /// SEND_WITH_INV: the receiver's memory window rkey to invalidate.
    pub inv: Option<u32>,
}

/// Ring geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub cap: u32,
    pub max_sge: u32,
}

impl Layout {
    #[inline]
    fn wqe_size(&self) -> usize {
        WQE_HDR + SGE * self.max_sge as usize
    }
    #[inline]
    fn comp_base(&self) -> usize {
        HDR + self.wqe_size() * self.cap as usize
    }
    /// Bytes the ring region needs; `usize::MAX` when that overflows (no mapping is that
    /// large, so [`Ring::new`] refuses the layout: its accessors rely on this bound).
    pub(crate) fn bytes(&self) -> usize {
        let cap = self.cap as usize;
        self.wqe_size()
            .checked_mul(cap)
            .and_then(|wqes| wqes.checked_add(HDR))
            .and_then(|base| base.checked_add(COMP.checked_mul(cap)?))
            .unwrap_or(usize::MAX)
    }
}

/// Stores `v` unless the word already holds it. A WQE slot is reused every `cap` entries,
/// often with the same contents (the same receive buffer posted again); its cache line was
/// last read by the other process, so a store would have to take the line back from that
/// CPU, and the next locked instruction or fence here would wait for that. Skipping an equal
/// store changes nothing the other side can read: the Release store of the index that
/// publishes the slot still orders it.
#[inline]
fn put32(w: &AtomicU32, v: u32) {
    if w.load(Ordering::Relaxed) != v {
        w.store(v, Ordering::Relaxed);
    }
}

/// See [`put32`].
#[inline]
fn put64(w: &AtomicU64, v: u64) {
    if w.load(Ordering::Relaxed) != v {
        w.store(v, Ordering::Relaxed);
    }
}

/// A view of one ring region (own or a peer's mapping).
#[derive(Debug, Clone)]
pub(crate) struct Ring {
    map: Arc<Mapping>,
    /// `layout`'s slot arithmetic, computed once: `cap - 1` when `cap` is a power of two
    /// (slot = seq & mask), else `u64::MAX` (slot = seq % cap); the WQE size; the offset of
    /// the completion slots.
    mask: u64,
    wqe_size: usize,
    comp_base: usize,
    /// Checked against the mapping's length in [`Ring::new`] and never changed after: every
    /// offset below comes from it, so the ring's word accessors need no bounds checks.
    layout: Layout,
}

impl Ring {
    /// `None` when the mapping is too small for `layout` or the layout is degenerate.
    pub(crate) fn new(map: Arc<Mapping>, layout: Layout) -> Option<Ring> {
        (layout.cap > 0 && layout.max_sge > 0 && map.len() >= layout.bytes()).then(|| Ring {
            map,
            layout,
            mask: if layout.cap.is_power_of_two() {
                u64::from(layout.cap) - 1
            } else {
                u64::MAX
            },
            wqe_size: layout.wqe_size(),
            comp_base: layout.comp_base(),
        })
    }

    pub(crate) fn mapping(&self) -> &Arc<Mapping> {
        &self.map
    }

    /// Slot of counter `seq`: `seq % cap`, by mask when `cap` is a power of two (a 64-bit
    /// division costs tens of cycles, and a spinner computes this every turn).
    #[inline]
    fn slot(&self, seq: u64) -> usize {
        (if self.mask != u64::MAX {
            seq & self.mask
        } else {
            seq % u64::from(self.layout.cap)
        }) as usize
    }

    /// Offset of WQE `seq`.
    #[inline]
    fn wqe_off(&self, seq: u64) -> usize {
        HDR + self.wqe_size * self.slot(seq)
    }

    /// Offset of completion `seq`.
    #[inline]
    fn comp_off(&self, seq: u64) -> usize {
        self.comp_base + COMP * self.slot(seq)
    }

    /// The layout the ring was checked against.
    #[inline]
    pub(crate) fn layout(&self) -> Layout {
        self.layout
    }

    /// The word at `off`, an offset from [`Layout`]: a header field, or a field of WQE or
    /// completion slot `seq % cap` (below `layout.bytes()`, 8-aligned for 8-byte fields).
    #[inline]
    fn w64(&self, off: usize) -> &AtomicU64 {
        // SAFETY: `Ring::new` checked `map.len() >= layout.bytes()` and derived `mask`,
        // `wqe_size` and `comp_base` from that layout (private, never changed), so every
        // offset the ring passes lies inside it (header fields < HDR; WQE `seq % cap` and its
        // `max_sge` SGEs end before `comp_base`; completion `seq % cap` ends at or before
        // `bytes`); HDR, the WQE size and COMP are multiples of 16, and fields are aligned
        // to their size within them.
        unsafe { self.map.u64_at_unchecked(off) }
    }

    /// As [`Ring::w64`], for 4-byte fields.
    #[inline]
    fn w32(&self, off: usize) -> &AtomicU32 {
        // SAFETY: as in `w64`.
        unsafe { self.map.u32_at_unchecked(off) }
    }

    #[inline]
    pub(crate) fn recv_prod(&self) -> &AtomicU64 {
        self.w64(OFF_RECV_PROD)
    }
    #[inline]
    pub(crate) fn recv_cons(&self) -> &AtomicU64 {
        self.w64(OFF_RECV_CONS)
    }
    #[inline]
    pub(crate) fn comp_prod(&self) -> &AtomicU64 {
        self.w64(OFF_COMP_PROD)
    }
    #[inline]
    pub(crate) fn comp_cons(&self) -> &AtomicU64 {
        self.w64(OFF_COMP_CONS)
    }
    #[inline]
    pub(crate) fn armed(&self) -> &AtomicU32 {
        self.w32(OFF_ARMED)
    }
    /// Announcements (regions, MRs, deregistrations) the owner sent on its control channel:
    /// a peer that applied fewer drains its channel before using a key, so an MR registered
    /// or deregistered before the call returned is seen by the peer's next operation.
    #[inline]
    pub(crate) fn announced(&self) -> &AtomicU64 {
        self.w64(OFF_ANNOUNCED)
    }

    /// 0, or for a ring an SRQ lends WQEs to: the number of unclaimed WQEs at or below which
    /// the peer asks the owner (refill eventfd) for more. Any value is harmless to the peer.
    #[inline]
    pub(crate) fn low_water(&self) -> &AtomicU64 {
        self.w64(OFF_LOW_WATER)
    }

    /// The peer's send CQ sleeps waiting for `comp_cons` to move (see the layout).
    #[inline]
    pub(crate) fn tx_armed(&self) -> &AtomicU32 {
        self.w32(OFF_TX_ARMED)
    }

    /// The `ack` word of completion slot `seq`: written by the owner before `comp_cons` passes
    /// `seq`, read by the peer after it saw that.
    #[inline]
    pub(crate) fn comp_ack(&self, seq: u64) -> &AtomicU32 {
        self.w32(self.comp_off(seq) + 36)
    }

    /// Owner: stores WQE `seq` (published by a later Release store of `recv_prod`).
    pub(crate) fn write_wqe(&self, seq: u64, sges: &[RawSge]) {
        self.write_wqe_from(seq, sges.iter().copied());
    }

    /// Owner: stores WQE `seq` from a receive WR's SGEs (no intermediate copy).
    #[inline]
    pub(crate) fn write_wqe_sges(&self, seq: u64, sges: &[crate::Sge]) {
        self.write_wqe_from(
            seq,
            sges.iter().map(|s| RawSge {
                addr: s.addr,
                len: s.len,
                key: s.lkey,
            }),
        );
    }

    #[inline]
    fn write_wqe_from(&self, seq: u64, sges: impl ExactSizeIterator<Item = RawSge>) {
        let off = self.wqe_off(seq);
        let n = sges.len().min(self.layout.max_sge as usize);
        put32(self.w32(off), n as u32);
        for (i, s) in sges.take(n).enumerate() {
            let o = off + WQE_HDR + i * SGE;
            put64(self.w64(o), s.addr);
            put32(self.w32(o + 8), s.len);
            put32(self.w32(o + 12), s.key);
        }
    }

    /// Reads WQE `seq`, handing its SGEs to `out`; returns their count, `None` (and nothing
    /// handed) when it exceeds the layout. Only tests read WQEs back: the peer's sender only
    /// counts them, and the owner delivers into its private record of each.
    #[cfg(test)]
    pub(crate) fn read_wqe(&self, seq: u64, mut out: impl FnMut(RawSge)) -> Option<usize> {
        let off = self.wqe_off(seq);
        let n = self.w32(off).load(Ordering::Relaxed);
        if n > self.layout.max_sge {
            return None;
        }
        for i in 0..n as usize {
            let o = off + WQE_HDR + i * SGE;
            out(RawSge {
                addr: self.w64(o).load(Ordering::Relaxed),
                len: self.w32(o + 8).load(Ordering::Relaxed),
                key: self.w32(o + 12).load(Ordering::Relaxed),
            });
        }
        Some(n as usize)
    }

    /// Peer: stores completion `seq` (published by a later Release store of `comp_prod`).
    /// Plain stores, unlike WQEs ([`put32`]): the tag changes with every completion and shares
    /// the entry's cache line, so the line has to be taken back anyway, and comparing first
    /// would only add loads of a line the owner's spinner keeps reading.
    #[inline]
    pub(crate) fn write_comp(&self, seq: u64, c: RawComp) {
        let off = self.comp_off(seq);
        let w = CompSlot::of(seq, c);
        self.w32(off).store(w.opcode, Ordering::Relaxed);
        self.w32(off + 4).store(w.status, Ordering::Relaxed);
        self.w32(off + 8).store(w.byte_len, Ordering::Relaxed);
        self.w32(off + 12).store(w.has_imm, Ordering::Relaxed);
        self.w32(off + 16).store(w.imm, Ordering::Relaxed);
        self.w32(off + 20).store(w.src, Ordering::Relaxed);
        self.w64(off + 24).store(w.tag, Ordering::Relaxed);
        self.w32(off + 32).store(w.key, Ordering::Relaxed);
        self.w32(off + 36).store(0, Ordering::Relaxed);
        self.w64(off + 40).store(w.addr, Ordering::Relaxed);
        self.w32(off + 48).store(w.has_inv, Ordering::Relaxed);
        self.w32(off + 52).store(w.inv, Ordering::Relaxed);
    }

    /// The tag word of completion `seq` (see the layout).
    #[inline]
    pub(crate) fn comp_tag(&self, seq: u64) -> &AtomicU64 {
        self.w64(self.comp_off(seq) + 24)
    }

    /// Owner: reads completion `seq`; `None` when its imm or inv flag is neither 0 nor 1, its `src`
    /// is unknown, or its tag does not name `seq` (the peer did not write this completion for
    /// the WQE it claimed).
    #[inline]
    pub(crate) fn read_comp(&self, seq: u64) -> Option<RawComp> {
        let off = self.comp_off(seq);
        let tag = self.comp_tag(seq).load(Ordering::Relaxed);
        if tag != seq.wrapping_add(1) {
            return None;
        }
        CompSlot {
            opcode: self.w32(off).load(Ordering::Relaxed),
            status: self.w32(off + 4).load(Ordering::Relaxed),
            byte_len: self.w32(off + 8).load(Ordering::Relaxed),
            has_imm: self.w32(off + 12).load(Ordering::Relaxed),
            imm: self.w32(off + 16).load(Ordering::Relaxed),
            src: self.w32(off + 20).load(Ordering::Relaxed),
            tag,
            key: self.w32(off + 32).load(Ordering::Relaxed),
            addr: self.w64(off + 40).load(Ordering::Relaxed),
            has_inv: self.w32(off + 48).load(Ordering::Relaxed),
            inv: self.w32(off + 52).load(Ordering::Relaxed),
        }
        .decode(seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wqes_and_completions_round_trip_and_wrap() {
        // A power of two (slots by mask) and not (by division).
        for cap in [3u32, 4] {
            round_trip_and_wrap(cap);
        }
    }

    fn round_trip_and_wrap(cap: u32) {
        let layout = Layout { cap, max_sge: 2 };
        let map = Arc::new(Mapping::create(layout.bytes(), c"t").unwrap());
        let ring = Ring::new(map, layout).unwrap();
        let lap = u64::from(cap);
        for seq in 0..(2 * lap + 1) {
            let s = [
                RawSge {
                    addr: seq,
                    len: 2,
                    key: 3,
                },
                RawSge {
                    addr: 9,
                    len: 8,
                    key: 7,
                },
            ];
            ring.write_wqe(seq, &s[..(seq as usize % 2) + 1]);
            let mut out = Vec::new();
            let n = ring.read_wqe(seq, |s| out.push(s)).unwrap();
            assert_eq!(n, out.len());
            assert_eq!(out, &s[..(seq as usize % 2) + 1]);
            let c = RawComp {
                opcode: 128,
                status: 0,
                byte_len: seq as u32,
                imm: Some(5),
                src: if seq % 2 == 0 {
                    Src::Mr { key: 9, addr: seq }
                } else {
                    Src::Staged { off: seq * 3 }
                },
                inv: (seq % 3 == 0).then_some(0x8000_0100 | seq as u32),
            };
            ring.write_comp(seq, c);
            assert_eq!(ring.read_comp(seq), Some(c));
            // The same slot a lap later or earlier: not written for that completion.
            assert_eq!(ring.read_comp(seq + lap), None);
            assert_eq!(ring.read_comp(seq.wrapping_sub(lap)), None);
            assert_eq!(ring.slot(seq), (seq % lap) as usize);
        }
    }

    #[test]
    fn a_wqe_claiming_too_many_sges_is_rejected() {
        let layout = Layout { cap: 2, max_sge: 1 };
        let map = Arc::new(Mapping::create(layout.bytes(), c"t").unwrap());
        let ring = Ring::new(map.clone(), layout).unwrap();
        // SAFETY: HDR is 4-aligned and inside the mapping (the ring was built over it).
        unsafe { map.u32_at_unchecked(HDR) }.store(1000, Ordering::Relaxed);
        assert!(ring.read_wqe(0, |_| ()).is_none());
        assert!(
            Ring::new(
                map,
                Layout {
                    cap: 1_000_000,
                    max_sge: 1
                }
            )
            .is_none()
        );
    }

    #[test]
    fn a_layout_whose_size_overflows_is_refused() {
        let huge = Layout {
            cap: u32::MAX,
            max_sge: u32::MAX,
        };
        assert_eq!(huge.bytes(), usize::MAX);
        let small = Layout { cap: 2, max_sge: 1 };
        let map = Arc::new(Mapping::create(small.bytes(), c"t").unwrap());
        assert!(Ring::new(map, huge).is_none());
    }
}
