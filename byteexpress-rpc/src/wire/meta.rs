//! The metadata section of a message (`meta_len` bytes after the header).
//!
//! | field | size | meaning |
//! |---|---|---|
//! | head_len | 2, LE | length of `head` |
//! | head | head_len | REQUEST: method path (`/package.Service/Method`); RESPONSE/ERROR: status message (UTF-8) |
//! | then, repeated to the end: | | |
//! | key_len | 2, LE | 1..=[`MAX_KEY`] |
//! | key | key_len | metadata key (gRPC key rule) |
//! | value_len | 4, LE | ≤ the bytes left |
//! | value | value_len | bytes |
//!
//! Every length is checked against the bytes left before it is used; at most [`MAX_ENTRIES`]
//! entries. Values are slices of the received buffer (no copy).

use bytes::{BufMut, Bytes};

use super::{WireError, err};
use crate::Metadata;
use crate::metadata::valid_key;

/// Longest key in bytes.
pub const MAX_KEY: usize = 256;
/// Most entries in one message.
pub const MAX_ENTRIES: usize = 1024;

/// Bytes [`encode`] will write.
pub fn encoded_len(head: &str, md: &Metadata) -> usize {
    2 + head.len() + md.iter().map(|(k, v)| 6 + k.len() + v.len()).sum::<usize>()
}

/// Writes `head` and `md`. The caller checked [`encoded_len`] against its limits; `head` longer
/// than 65535 bytes is cut (it is a path or a human-readable message).
pub fn encode(out: &mut impl BufMut, head: &str, md: &Metadata) {
    let head = &head.as_bytes()[..head.len().min(u16::MAX as usize)];
    out.put_u16_le(head.len() as u16);
    out.put_slice(head);
    for (k, v) in md.iter() {
        out.put_u16_le(k.len() as u16);
        out.put_slice(k.as_bytes());
        out.put_u32_le(v.len() as u32);
        out.put_slice(v);
    }
}

/// Parses a metadata section; `meta` is a slice of the received message.
pub fn decode(meta: &Bytes) -> Result<(String, Metadata), WireError> {
    let mut pos = 0usize;
    let take = |pos: &mut usize, n: usize| -> Result<Bytes, WireError> {
        if meta.len() - *pos < n {
            return err(format!(
                "metadata field of {n} bytes overruns the {} left",
                meta.len() - *pos
            ));
        }
        let s = meta.slice(*pos..*pos + n);
        *pos += n;
        Ok(s)
    };
    let head_len = u16::from_le_bytes(take(&mut pos, 2)?[..].try_into().expect("2 bytes")) as usize;
    let head = String::from_utf8(take(&mut pos, head_len)?.to_vec())
        .map_err(|_| WireError("path/message not UTF-8".into()))?;
    let mut md = Metadata::new();
    while pos < meta.len() {
        if md.len() == MAX_ENTRIES {
            return err(format!("more than {MAX_ENTRIES} metadata entries"));
        }
        let klen = u16::from_le_bytes(take(&mut pos, 2)?[..].try_into().expect("2 bytes")) as usize;
        if klen > MAX_KEY {
            return err(format!("metadata key of {klen} bytes"));
        }
        let key = String::from_utf8(take(&mut pos, klen)?.to_vec())
            .map_err(|_| WireError("key not UTF-8".into()))?;
        if !valid_key(&key) {
            return err(format!("invalid metadata key {key:?}"));
        }
        let vlen = u32::from_le_bytes(take(&mut pos, 4)?[..].try_into().expect("4 bytes")) as usize;
        let value = take(&mut pos, vlen)?;
        md.push_unchecked(key, value);
    }
    Ok((head, md))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_round_trips_with_binary_values() {
        let mut md = Metadata::new();
        md.insert("x-user", "alice").unwrap();
        md.insert("trace-bin", Bytes::from_static(&[0, 255, 1]))
            .unwrap();
        let mut out = Vec::new();
        encode(&mut out, "/ps.Ps/Pull", &md);
        assert_eq!(out.len(), encoded_len("/ps.Ps/Pull", &md));
        let (head, back) = decode(&Bytes::from(out)).unwrap();
        assert_eq!(head, "/ps.Ps/Pull");
        assert_eq!(back, md);
    }

    #[test]
    fn metadata_rejects_every_truncation_and_bad_keys() {
        let mut md = Metadata::new();
        md.insert("k", "v").unwrap();
        let mut out = Vec::new();
        encode(&mut out, "m", &md);
        for cut in 0..out.len() {
            if cut == 3 {
                continue; // "m" alone with no entries is a valid section
            }
            assert!(
                decode(&Bytes::copy_from_slice(&out[..cut])).is_err(),
                "cut {cut}"
            );
        }
        let mut bad = out.clone();
        bad[5] = b'K'; // uppercase key
        assert!(decode(&Bytes::from(bad)).is_err());
    }
}
