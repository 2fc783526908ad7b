//! The rendezvous of a large message on RDMA: a descriptor SEND, the receiver's READs, a
//! RELEASE (DESIGN.md 3.5 "Rendezvous" and 4.4).
//!
//! A message whose SENDs would total more than the sender's `Config::rendezvous_threshold`
//! bytes is not cut into chunks. The sender copies its metadata + body into registered memory
//! lent for READ and sends one SEND: the message's own header (kind, status, ids, `timeout_us`,
//! `seq`, the whole message's `meta_len` and `body_len`) with [`FLAG_RENDEZVOUS`], followed by
//! a [`Descriptor`] instead of the payload. The receiver RDMA READs `meta_len + body_len` bytes
//! from `addr` with `rkey` into memory of its own, delivers the message, and sends a RELEASE
//! (kind 18; `call_id` = the descriptor's `token`, `timeout_us` = the rkey it invalidates or 0,
//! no metadata or body); with [`DESC_WINDOW`] that SEND is a SEND_WITH_INV of `rkey`, which
//! invalidates the window at the sender before its receive completes. The sender frees the
//! memory only on the RELEASE; a READ after it fails on the reader's QP with a remote access
//! error.
//!
//! | offset (after the header) | size | field | meaning |
//! |---|---|---|---|
//! | 0 | 8 | addr | u64 LE: address of the first lent byte, in the sender's memory |
//! | 8 | 4 | rkey | u32 LE: key granting REMOTE_READ over exactly `[addr, addr + meta_len + body_len)` |
//! | 12 | 4 | flags | u32 LE: bit 0 [`DESC_WINDOW`] (`rkey` is a memory window's: release with SEND_WITH_INV); other bits sent as 0, not checked |
//! | 16 | 8 | token | u64 LE: the sender's name for the loan, echoed by the RELEASE |
//!
//! A rendezvous SEND carries exactly [`DESCRIPTOR_LEN`] bytes after its header
//! (`Header::decode`); [`FLAG_RENDEZVOUS`] with [`crate::wire::header::FLAG_MORE`], or on a
//! kind without a body, is a protocol error.

use super::{WireError, err};

/// Flag bit 7 of the header: the bytes after the header are a [`Descriptor`]; the payload
/// (`meta_len + body_len` bytes) is to be RDMA READ from the sender.
pub const FLAG_RENDEZVOUS: u8 = 0x80;
/// Bytes of a [`Descriptor`].
pub const DESCRIPTOR_LEN: usize = 24;
/// Descriptor flag bit 0: `rkey` names a memory window (release with SEND_WITH_INV).
pub const DESC_WINDOW: u32 = 1;

/// Where a rendezvous message's payload waits to be READ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descriptor {
    /// Address of its first byte in the sender's memory.
    pub addr: u64,
    /// Remote key granting REMOTE_READ over the payload's bytes only.
    pub rkey: u32,
    /// Flag bits ([`DESC_WINDOW`]).
    pub flags: u32,
    /// The sender's name for the loan, echoed by the RELEASE.
    pub token: u64,
}

impl Descriptor {
    /// Writes the 24 bytes.
    pub fn encode(&self) -> [u8; DESCRIPTOR_LEN] {
        let mut b = [0u8; DESCRIPTOR_LEN];
        b[0..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_le_bytes());
        b[12..16].copy_from_slice(&self.flags.to_le_bytes());
        b[16..24].copy_from_slice(&self.token.to_le_bytes());
        b
    }

    /// Parses exactly [`DESCRIPTOR_LEN`] bytes.
    pub fn decode(b: &[u8]) -> Result<Descriptor, WireError> {
        if b.len() != DESCRIPTOR_LEN {
            return err(format!(
                "rendezvous descriptor of {} bytes, not {DESCRIPTOR_LEN}",
                b.len()
            ));
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Ok(Descriptor {
            addr: u64_at(0),
            rkey: u32_at(8),
            flags: u32_at(12),
            token: u64_at(16),
        })
    }

    /// The rkey names a memory window: the RELEASE is a SEND_WITH_INV of it.
    pub fn window(&self) -> bool {
        self.flags & DESC_WINDOW != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_descriptor_round_trips_and_any_other_length_is_refused() {
        let d = Descriptor {
            addr: 0x7f00_1234_5000,
            rkey: 0xabcd_ef01,
            flags: DESC_WINDOW,
            token: 42,
        };
        let b = d.encode();
        assert_eq!(Descriptor::decode(&b).unwrap(), d);
        assert!(d.window());
        assert!(Descriptor::decode(&b[..23]).is_err());
        assert!(Descriptor::decode(&[b.as_slice(), &[0]].concat()).is_err());
    }
}
