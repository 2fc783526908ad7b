//! The sharded table of a parameter-server fleet: keys split over `N` shards by one function
//! that clients and servers share ([`shard_of`]), each shard served by its own replica set of
//! `bx ps serve --shard I --shards N` processes.
//!
//! The hash is Lamping and Veach's jump consistent hash ("A Fast, Minimal Memory, Consistent
//! Hash Algorithm", 2014) over [`splitmix64`] of the key: keys spread evenly whatever their
//! pattern (the Zipf workload's popular keys are the small ones), and going from `N` to `N + 1`
//! shards moves only the `1 / (N + 1)` of keys that the new shard takes.
//!
//! A client splits a call over its keys' shards ([`split_keys`]), sends each [`Part`] to its
//! shard, and puts the answers back in key order ([`merge_rows`]). A server checks that it
//! owns every key of a call ([`ShardSpec::check`]); the service refuses a foreign key with
//! FAILED_PRECONDITION ([`crate::PsService`]).

use bytes::{BufMut, Bytes, BytesMut};

use crate::store::splitmix64;

/// The shard, in `0..shards`, that owns `key` in a table of `shards` shards (0 and 1 shards
/// both mean one shard, 0). Jump consistent hash of `splitmix64(key)`.
pub fn shard_of(key: u64, shards: u32) -> u32 {
    let mut h = splitmix64(key);
    let (mut b, mut j) = (0i64, 0i64);
    while j < i64::from(shards) {
        b = j;
        h = h.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((h >> 33) + 1) as f64)) as i64;
    }
    b as u32
}

/// Why a shard setting or a key was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ShardError {
    /// `index` is not below `count` (or `count` is 0).
    #[error(
        "shard {index} of {count}: the index must be below the shard count, which must be positive"
    )]
    NoSuchShard {
        /// Index asked for.
        index: u32,
        /// Shard count.
        count: u32,
    },
    /// A key of another shard reached this one: the client's shard count or routing differs
    /// from the server's.
    #[error("key {key} belongs to shard {owner} of {count}; this server serves shard {served}")]
    ForeignKey {
        /// The key.
        key: u64,
        /// The shard that owns it.
        owner: u32,
        /// The shard this server serves.
        served: u32,
        /// Shard count.
        count: u32,
    },
    /// A shard's answer does not hold one row per key of its part.
    #[error("shard {shard} answered {got} bytes for {keys} keys of {row_bytes} bytes")]
    RowsLength {
        /// The shard.
        shard: u32,
        /// Bytes it answered.
        got: usize,
        /// Keys asked of it.
        keys: usize,
        /// Bytes per row.
        row_bytes: usize,
    },
}

/// The shard a server serves: `index` of `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardSpec {
    index: u32,
    count: u32,
}

impl ShardSpec {
    /// Shard `index` of `count`. Errors: [`ShardError::NoSuchShard`].
    pub fn new(index: u32, count: u32) -> Result<ShardSpec, ShardError> {
        if index >= count {
            return Err(ShardError::NoSuchShard { index, count });
        }
        Ok(ShardSpec { index, count })
    }

    /// The shard's index.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The table's shard count.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Whether this shard owns `key`.
    pub fn owns(&self, key: u64) -> bool {
        shard_of(key, self.count) == self.index
    }

    /// Checks that this shard owns every key. Errors: [`ShardError::ForeignKey`] naming the
    /// first key it does not own.
    pub fn check(&self, keys: &[u64]) -> Result<(), ShardError> {
        match keys.iter().find(|&&k| !self.owns(k)) {
            None => Ok(()),
            Some(&key) => Err(ShardError::ForeignKey {
                key,
                owner: shard_of(key, self.count),
                served: self.index,
                count: self.count,
            }),
        }
    }
}

/// The keys of one call that one shard owns, with where each sits in the call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// The shard.
    pub shard: u32,
    /// Its keys, in call order.
    pub keys: Vec<u64>,
    /// The index in the call of each key.
    pub positions: Vec<usize>,
}

impl Part {
    /// The rows of this part's keys out of `rows`, the call's rows of `row_bytes` bytes each
    /// in call order (a Push's gradients). Panics if `rows` is shorter than the call.
    pub fn gather(&self, rows: &[u8], row_bytes: usize) -> Bytes {
        let mut out = BytesMut::with_capacity(self.positions.len() * row_bytes);
        for &p in &self.positions {
            out.put_slice(&rows[p * row_bytes..(p + 1) * row_bytes]);
        }
        out.freeze()
    }
}

/// `keys` split over `shards` shards: one [`Part`] per shard owning some key, in shard order.
/// Every key is in exactly one part.
pub fn split_keys(keys: &[u64], shards: u32) -> Vec<Part> {
    let mut parts: Vec<Part> = (0..shards.max(1))
        .map(|shard| Part {
            shard,
            keys: Vec::new(),
            positions: Vec::new(),
        })
        .collect();
    for (p, &k) in keys.iter().enumerate() {
        let part = &mut parts[shard_of(k, shards) as usize];
        part.keys.push(k);
        part.positions.push(p);
    }
    parts.retain(|p| !p.keys.is_empty());
    parts
}

/// The call's rows in key order from each part's answer (`answers[i]` for `parts[i]`, rows
/// of `row_bytes` bytes). Errors: [`ShardError::RowsLength`] for an answer of the wrong size.
pub fn merge_rows(
    parts: &[Part],
    answers: &[Bytes],
    row_bytes: usize,
) -> Result<Bytes, ShardError> {
    let keys: usize = parts.iter().map(|p| p.keys.len()).sum();
    let mut out = vec![0u8; keys * row_bytes];
    for (part, rows) in parts.iter().zip(answers) {
        if rows.len() != part.keys.len() * row_bytes {
            return Err(ShardError::RowsLength {
                shard: part.shard,
                got: rows.len(),
                keys: part.keys.len(),
                row_bytes,
            });
        }
        for (&p, row) in part
            .positions
            .iter()
            .zip(rows.chunks_exact(row_bytes.max(1)))
        {
            out[p * row_bytes..(p + 1) * row_bytes].copy_from_slice(row);
        }
    }
    Ok(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_of_is_pinned_so_every_client_and_server_agrees() {
        // pinned: a change here re-routes every key of a running fleet
        let got: Vec<u32> = (0..8).map(|k| shard_of(k, 5)).collect();
        assert_eq!(got, PINNED);
        for k in 0..1000 {
            assert_eq!(shard_of(k, 7), shard_of(k, 7));
            assert_eq!(shard_of(k, 1), 0);
            assert_eq!(shard_of(k, 0), 0);
        }
    }
    const PINNED: [u32; 8] = [3, 3, 0, 4, 3, 3, 0, 1];

    #[test]
    fn every_key_is_owned_by_exactly_one_shard() {
        for n in 1..=6u32 {
            let specs: Vec<ShardSpec> = (0..n).map(|i| ShardSpec::new(i, n).unwrap()).collect();
            for k in (0..5000u64).chain([u64::MAX, u64::MAX - 1, 1 << 63]) {
                assert!(shard_of(k, n) < n);
                assert_eq!(
                    specs.iter().filter(|s| s.owns(k)).count(),
                    1,
                    "key {k} of {n}"
                );
            }
        }
    }

    #[test]
    fn shards_get_an_even_share_of_sequential_keys() {
        for n in [2u32, 3, 7, 16] {
            let mut counts = vec![0u32; n as usize];
            let keys = 100_000u64;
            for k in 0..keys {
                counts[shard_of(k, n) as usize] += 1;
            }
            let even = keys as f64 / f64::from(n);
            for c in &counts {
                assert!(
                    (f64::from(*c) - even).abs() < 0.05 * even,
                    "{n} shards: {counts:?}"
                );
            }
        }
    }

    #[test]
    fn a_new_shard_takes_keys_only_from_the_others() {
        let keys = 50_000u64;
        let moved = (0..keys)
            .filter(|&k| shard_of(k, 4) != shard_of(k, 5))
            .inspect(|&k| assert_eq!(shard_of(k, 5), 4, "key {k} moved between old shards"))
            .count() as f64;
        // a fifth of the keys, within 10 %
        assert!(
            (moved - keys as f64 / 5.0).abs() < 0.1 * keys as f64 / 5.0,
            "{moved}"
        );
    }

    #[test]
    fn a_spec_checks_its_keys_and_names_the_first_foreign_one() {
        assert_eq!(
            ShardSpec::new(2, 2),
            Err(ShardError::NoSuchShard { index: 2, count: 2 })
        );
        assert!(ShardSpec::new(0, 0).is_err());
        let s = ShardSpec::new(1, 3).unwrap();
        let own: Vec<u64> = (0..100).filter(|&k| shard_of(k, 3) == 1).collect();
        let foreign = (0..100).find(|&k| shard_of(k, 3) != 1).unwrap();
        assert_eq!(s.check(&own), Ok(()));
        let mut mixed = own.clone();
        mixed.insert(3, foreign);
        assert_eq!(
            s.check(&mixed),
            Err(ShardError::ForeignKey {
                key: foreign,
                owner: shard_of(foreign, 3),
                served: 1,
                count: 3
            })
        );
    }

    #[test]
    fn split_then_merge_gives_the_rows_back_in_key_order() {
        let keys: Vec<u64> = vec![9, 3, 9, 100, 7, 42, 0, 5];
        let parts = split_keys(&keys, 3);
        let mut seen: Vec<usize> = parts.iter().flat_map(|p| p.positions.clone()).collect();
        seen.sort();
        assert_eq!(seen, (0..keys.len()).collect::<Vec<_>>());
        for p in &parts {
            assert!(p.keys.iter().all(|&k| shard_of(k, 3) == p.shard));
            assert_eq!(p.keys.len(), p.positions.len());
        }
        // row of key k: 2 bytes [k, k + 1]; each part answers its keys' rows
        let rows: Vec<u8> = keys.iter().flat_map(|&k| [k as u8, k as u8 + 1]).collect();
        let answers: Vec<Bytes> = parts.iter().map(|p| p.gather(&rows, 2)).collect();
        for (p, a) in parts.iter().zip(&answers) {
            let want: Vec<u8> = p
                .keys
                .iter()
                .flat_map(|&k| [k as u8, k as u8 + 1])
                .collect();
            assert_eq!(&a[..], &want[..]);
        }
        assert_eq!(&merge_rows(&parts, &answers, 2).unwrap()[..], &rows[..]);
        let mut short = answers.clone();
        short[0] = short[0].slice(1..);
        assert!(matches!(
            merge_rows(&parts, &short, 2),
            Err(ShardError::RowsLength { .. })
        ));
        assert_eq!(split_keys(&keys, 1).len(), 1);
        assert!(split_keys(&[], 4).is_empty());
    }
}
