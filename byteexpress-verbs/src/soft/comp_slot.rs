//! The words of one completion slot of the ring ([`super::ring`], "A completion slot"), as
//! plain values: what the peer wrote, before the owner trusts any of it. The owner loads the
//! words from shared memory and [`CompSlot::decode`] validates them; the peer builds them with
//! [`CompSlot::of`]. Pure, so the check is unit-tested and fuzzed without a mapping.

use super::ring::{RawComp, Src};

/// The words of a completion slot the owner reads (everything but `ack` and the padding).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CompSlot {
    /// `opcode u32` at offset 0.
    pub opcode: u32,
    /// `status u32` at 4.
    pub status: u32,
    /// `byte_len u32` at 8.
    pub byte_len: u32,
    /// `has_imm u32` at 12: 0 or 1.
    pub has_imm: u32,
    /// `imm u32` at 16.
    pub imm: u32,
    /// `src u32` at 20: 0 placed, 1 in an MR, 2 staged.
    pub src: u32,
    /// `tag u64` at 24: the completion's counter + 1.
    pub tag: u64,
    /// `key u32` at 32.
    pub key: u32,
    /// `addr u64` at 40.
    pub addr: u64,
    /// `has_inv u32` at 48: 0 or 1.
    pub has_inv: u32,
    /// `inv u32` at 52.
    pub inv: u32,
}

impl CompSlot {
    /// The words the peer writes for completion `seq` carrying `c`.
    pub(crate) fn of(seq: u64, c: RawComp) -> CompSlot {
        let (src, key, addr) = match c.src {
            Src::Placed => (0, 0, 0),
            Src::Mr { key, addr } => (1, key, addr),
            Src::Staged { off } => (2, 0, off),
        };
        CompSlot {
            opcode: c.opcode,
            status: c.status,
            byte_len: c.byte_len,
            has_imm: c.imm.is_some() as u32,
            imm: c.imm.unwrap_or(0),
            src,
            tag: seq.wrapping_add(1),
            key,
            addr,
            has_inv: c.inv.is_some() as u32,
            inv: c.inv.unwrap_or(0),
        }
    }

    /// The completion these words describe if they are completion `seq`'s: `None` when the
    /// tag does not name `seq` (the peer did not write this completion for the WQE it
    /// claimed), `has_imm` or `has_inv` is neither 0 nor 1, or `src` is unknown.
    pub(crate) fn decode(&self, seq: u64) -> Option<RawComp> {
        if self.tag != seq.wrapping_add(1) {
            return None;
        }
        let flag = |w: u32, v: u32| match w {
            0 => Some(None),
            1 => Some(Some(v)),
            _ => None,
        };
        Some(RawComp {
            opcode: self.opcode,
            status: self.status,
            byte_len: self.byte_len,
            imm: flag(self.has_imm, self.imm)?,
            src: match self.src {
                0 => Src::Placed,
                1 => Src::Mr {
                    key: self.key,
                    addr: self.addr,
                },
                2 => Src::Staged { off: self.addr },
                _ => return None,
            },
            inv: flag(self.has_inv, self.inv)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn comp(src: Src) -> RawComp {
        RawComp {
            opcode: 128,
            status: 0,
            byte_len: 77,
            imm: Some(5),
            src,
            inv: Some(0x8000_0001),
        }
    }

    #[test]
    fn every_source_round_trips_through_the_slot_words() {
        for src in [
            Src::Placed,
            Src::Mr {
                key: 9,
                addr: 1 << 40,
            },
            Src::Staged { off: 4096 },
        ] {
            for seq in [0, 1, u64::MAX] {
                let c = comp(src);
                assert_eq!(CompSlot::of(seq, c).decode(seq), Some(c));
            }
        }
    }

    #[test]
    fn a_slot_with_a_stale_tag_a_non_boolean_flag_or_an_unknown_source_is_refused() {
        let good = CompSlot::of(7, comp(Src::Placed));
        assert_eq!(good.decode(7 + 4), None, "tag of another lap");
        for bad in [
            CompSlot { has_imm: 2, ..good },
            CompSlot { has_inv: 7, ..good },
            CompSlot { src: 3, ..good },
        ] {
            assert_eq!(bad.decode(7), None, "{bad:?}");
        }
    }
}
