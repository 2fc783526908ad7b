//! Entry points for the `fuzz/` crate's targets (feature `fuzzing`, off by default): the soft
//! provider's decoders of what a peer process writes, its control messages and its completion
//! slots. Not a stable API; nothing outside `fuzz/` should use it.

use super::comp_slot::CompSlot;
use super::wire::Msg;

/// A decoded soft control message (opaque: compare, re-encode, count its fds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SoftMsg(Msg);

impl SoftMsg {
    /// Parses one seqpacket record as the provider does; `None` when malformed.
    pub fn decode(b: &[u8]) -> Option<SoftMsg> {
        Msg::decode(b).map(SoftMsg)
    }

    /// The record the provider would send for this message.
    pub fn encode(&self) -> Vec<u8> {
        self.0.encode()
    }

    /// File descriptors that must accompany the record.
    pub fn fds(&self) -> usize {
        self.0.fds()
    }
}

/// A completion slot's words read from shared memory, validated for completion `seq`; returns
/// the slot words the peer would write for the decoded completion (its canonical form), or
/// `None` when the owner refuses the slot. `words`: opcode, status, byte_len, has_imm, imm, src,
/// key, has_inv, inv; `tag`, `addr` the 64-bit words.
pub fn decode_comp_slot(seq: u64, words: [u32; 9], tag: u64, addr: u64) -> Option<[u64; 11]> {
    let [
        opcode,
        status,
        byte_len,
        has_imm,
        imm,
        src,
        key,
        has_inv,
        inv,
    ] = words;
    let slot = CompSlot {
        opcode,
        status,
        byte_len,
        has_imm,
        imm,
        src,
        tag,
        key,
        addr,
        has_inv,
        inv,
    };
    let c = slot.decode(seq)?;
    let w = CompSlot::of(seq, c);
    Some([
        w.opcode.into(),
        w.status.into(),
        w.byte_len.into(),
        w.has_imm.into(),
        w.imm.into(),
        w.src.into(),
        w.tag,
        w.key.into(),
        w.addr,
        w.has_inv.into(),
        w.inv.into(),
    ])
}
