//! Embedding tables: `dim` f32 values per `u64` key, split into shards by key with one
//! `parking_lot` lock per shard. A row is created on first touch with deterministic values
//! ([`init_value`]), so any client can check a pulled row it never pushed to.

use std::collections::HashMap;

use bytes::{BufMut, Bytes, BytesMut};
use parking_lot::Mutex;

/// Most keys one Pull or Push may name.
pub const MAX_KEYS: usize = 1 << 16;

/// SplitMix64's output function (Steele, Lea, Flood 2014): a bijective mixer of 64 bits.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// 64-bit FNV-1a of `bytes`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xCBF2_9CE4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// Initial value of element `i` of `key`'s row in `table`, in [-1/16, 1/16):
/// `base = splitmix64(fnv1a64(table) ^ key)`, `u = splitmix64(base + i) >> 40` (24 bits),
/// value `(u - 2^23) / 2^27`, which every f32 and f64 implementation computes exactly.
pub fn init_value(table: &str, key: u64, i: u32) -> f32 {
    init_value_seeded(fnv1a64(table.as_bytes()), key, i)
}

fn init_value_seeded(seed: u64, key: u64, i: u32) -> f32 {
    let base = splitmix64(seed ^ key);
    let u = (splitmix64(base.wrapping_add(u64::from(i))) >> 40) as i32;
    (u - (1 << 23)) as f32 / (1u32 << 27) as f32
}

/// Why a Pull or Push was refused (the service answers INVALID_ARGUMENT).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PsError {
    /// The table is not one of the store's.
    UnknownTable(String),
    /// More than [`MAX_KEYS`] keys.
    TooManyKeys(usize),
    /// `grads` is not keys × dim × 4 bytes.
    GradsLength {
        /// Bytes received.
        got: usize,
        /// Bytes expected.
        want: usize,
    },
    /// The learning rate is NaN or infinite.
    BadLearningRate,
}

impl std::fmt::Display for PsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PsError::UnknownTable(t) => write!(f, "unknown table {t:?}"),
            PsError::TooManyKeys(n) => write!(f, "{n} keys in one call; at most {MAX_KEYS}"),
            PsError::GradsLength { got, want } => {
                write!(f, "grads has {got} bytes; keys x dim x 4 = {want}")
            }
            PsError::BadLearningRate => f.write_str("learning rate is not finite"),
        }
    }
}

impl std::error::Error for PsError {}

type Shard = Mutex<HashMap<u64, Box<[f32]>>>;

/// One table's shards.
#[derive(Debug)]
struct Table {
    seed: u64,
    shards: Box<[Shard]>,
}

impl Table {
    fn shard(&self, key: u64) -> &Shard {
        &self.shards[(splitmix64(key) >> 32) as usize % self.shards.len()]
    }
}

/// The tables of a parameter server; all share one `dim`. Safe to share between tasks.
#[derive(Debug)]
pub struct Store {
    dim: usize,
    tables: HashMap<String, Table>,
}

impl Store {
    /// Tables `names`, each of `shards` shards (at least 1), rows of `dim` values (at least 1).
    pub fn new(dim: usize, names: &[String], shards: usize) -> Store {
        let dim = dim.max(1);
        let tables = names
            .iter()
            .map(|n| {
                let shards = (0..shards.max(1))
                    .map(|_| Mutex::new(HashMap::new()))
                    .collect();
                (
                    n.clone(),
                    Table {
                        seed: fnv1a64(n.as_bytes()),
                        shards,
                    },
                )
            })
            .collect();
        Store { dim, tables }
    }

    /// Values per row.
    pub fn dim(&self) -> usize {
        self.dim
    }

    fn table(&self, name: &str, keys: usize) -> Result<&Table, PsError> {
        if keys > MAX_KEYS {
            return Err(PsError::TooManyKeys(keys));
        }
        self.tables
            .get(name)
            .ok_or_else(|| PsError::UnknownTable(name.to_string()))
    }

    /// Runs `f` on `key`'s row, creating it first if needed.
    fn with_row<R>(&self, t: &Table, key: u64, f: impl FnOnce(&mut [f32]) -> R) -> R {
        let mut shard = t.shard(key).lock();
        let row = shard.entry(key).or_insert_with(|| {
            (0..self.dim as u32)
                .map(|i| init_value_seeded(t.seed, key, i))
                .collect()
        });
        f(row)
    }

    /// The rows of `keys`, concatenated as little-endian f32 (keys × dim × 4 bytes).
    pub fn pull(&self, table: &str, keys: &[u64]) -> Result<Bytes, PsError> {
        let t = self.table(table, keys.len())?;
        let mut out = BytesMut::with_capacity(keys.len() * self.dim * 4);
        for &k in keys {
            self.with_row(t, k, |row| row.iter().for_each(|v| out.put_f32_le(*v)));
        }
        Ok(out.freeze())
    }

    /// SGD step `w -= lr * g` for each key, `grads` being keys × dim little-endian f32.
    /// Validates everything before changing anything.
    pub fn push(&self, table: &str, keys: &[u64], grads: &[u8], lr: f32) -> Result<(), PsError> {
        let t = self.table(table, keys.len())?;
        let want = keys.len() * self.dim * 4;
        if grads.len() != want {
            return Err(PsError::GradsLength {
                got: grads.len(),
                want,
            });
        }
        if !lr.is_finite() {
            return Err(PsError::BadLearningRate);
        }
        for (&k, g) in keys.iter().zip(grads.chunks_exact(self.dim * 4)) {
            self.with_row(t, k, |row| {
                for (w, g) in row.iter_mut().zip(g.chunks_exact(4)) {
                    *w -= lr * f32::from_le_bytes([g[0], g[1], g[2], g[3]]);
                }
            });
        }
        Ok(())
    }

    /// Rows created so far, over all tables.
    pub fn rows(&self) -> usize {
        self.tables
            .values()
            .flat_map(|t| t.shards.iter())
            .map(|s| s.lock().len())
            .sum()
    }
}

/// Decodes little-endian f32 values (a trailing partial value is ignored).
pub fn decode_f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> Store {
        Store::new(4, &["emb".to_string()], 8)
    }

    #[test]
    fn init_is_deterministic_small_and_exact() {
        assert_eq!(init_value("emb", 7, 3), init_value("emb", 7, 3));
        assert_ne!(init_value("emb", 7, 3), init_value("emb", 8, 3));
        assert_ne!(init_value("emb", 7, 3), init_value("other", 7, 3));
        for k in 0..1000 {
            let v = init_value("emb", k, (k % 64) as u32);
            assert!((-0.0625..0.0625).contains(&v), "{v}");
            assert_eq!(
                f64::from(v) * f64::from(1u32 << 27) % 1.0,
                0.0,
                "a multiple of 2^-27"
            );
        }
        // pinned, so other implementations (the Python interop test) can check theirs
        assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
        assert_eq!(fnv1a64(b""), 0xCBF2_9CE4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xAF63_DC4C_8601_EC8C);
    }

    #[test]
    fn pull_returns_init_rows_in_key_order() {
        let s = store();
        let v = decode_f32s(&s.pull("emb", &[5, 1, 5]).unwrap());
        assert_eq!(v.len(), 12);
        for (j, k) in [5u64, 1, 5].iter().enumerate() {
            for i in 0..4 {
                assert_eq!(v[j * 4 + i], init_value("emb", *k, i as u32));
            }
        }
        assert_eq!(s.rows(), 2);
    }

    #[test]
    fn push_applies_sgd() {
        let s = store();
        let g: Vec<u8> = [1.0f32, 2.0, -1.0, 0.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        s.push("emb", &[9], &g, 0.5).unwrap();
        let v = decode_f32s(&s.pull("emb", &[9]).unwrap());
        assert_eq!(v[0], init_value("emb", 9, 0) - 0.5);
        assert_eq!(v[1], init_value("emb", 9, 1) - 1.0);
        assert_eq!(v[2], init_value("emb", 9, 2) + 0.5);
        assert_eq!(v[3], init_value("emb", 9, 3));
    }

    #[test]
    fn bad_input_is_refused_without_changes() {
        let s = store();
        assert_eq!(
            s.pull("nope", &[1]),
            Err(PsError::UnknownTable("nope".into()))
        );
        assert_eq!(
            s.push("emb", &[1, 2], &[0; 12], 1.0),
            Err(PsError::GradsLength { got: 12, want: 32 })
        );
        assert_eq!(
            s.push("emb", &[1], &[0; 16], f32::NAN),
            Err(PsError::BadLearningRate)
        );
        assert!(matches!(
            s.pull("emb", &vec![0; MAX_KEYS + 1]),
            Err(PsError::TooManyKeys(_))
        ));
        assert_eq!(s.rows(), 0);
    }
}
