//! Embedding tables: `dim` f32 values per `u64` key, gathered at memory speed: rows reached by
//! index without a lock, pushes added with atomics ([`Store`]). A row is created on first
//! touch with deterministic values ([`init_value`]), so any client can check a pulled row it
//! never pushed to.

use foldhash::{HashMap, HashMapExt};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use bytes::Bytes;
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

/// Rows per chunk of a table's dense range: allocated and initialised together on first
/// touch of any of them (64 KiB at dim 64).
const CHUNK_ROWS: usize = 256;

/// Keys `0..DENSE_KEYS` live in a table's dense range (chunks found by index, no lock); keys
/// above in its overflow map (a lock per shard). The bench's keys, its check keys and its
/// dense pushes all fall in the dense range at the default dim.
pub const DENSE_KEYS: u64 = 1 << 24;

/// One row: `dim` f32 values as their bits, so that pulls read and pushes add without a lock.
type Row = [AtomicU32];

/// `CHUNK_ROWS` consecutive rows of the dense range and which of them were touched.
#[derive(Debug)]
struct Chunk {
    values: Box<[AtomicU32]>,
    /// Bit `r % 64` of word `r / 64`: row `r` of the chunk was pulled or pushed.
    touched: [AtomicU64; CHUNK_ROWS / 64],
}

type Overflow = Mutex<HashMap<u64, Box<Row>>>;

/// f32 values per 64-byte cache line.
const LINE_VALUES: usize = 16;

/// One table: its dense range in chunks (the chunk headers inline in one array, so finding a
/// row costs no miss beyond the row's own), and the overflow map's shards.
#[derive(Debug)]
struct Table {
    seed: u64,
    chunks: Box<[OnceLock<Chunk>]>,
    overflow: Box<[Overflow]>,
}

/// A row with the deterministic init of `key`.
fn init_row(seed: u64, key: u64, dim: usize) -> impl Iterator<Item = AtomicU32> {
    (0..dim as u32).map(move |i| AtomicU32::new(init_value_seeded(seed, key, i).to_bits()))
}

/// Copies `row` into `out` (dim × 4 bytes) as little-endian f32.
fn read_row(row: &Row, out: &mut [u8]) {
    for (o, v) in out.chunks_exact_mut(4).zip(row) {
        o.copy_from_slice(&v.load(Ordering::Relaxed).to_le_bytes());
    }
}

/// `w -= lr * g` on every value of `row`, `grads` being dim little-endian f32, each value
/// updated by a compare-and-swap of its bits: concurrent pushes to one row all land, and a
/// pull running meanwhile sees each value before or after each update, never torn.
fn add_row(row: &Row, grads: &[u8], lr: f32) {
    for (w, g) in row.iter().zip(grads.chunks_exact(4)) {
        let g = f32::from_le_bytes([g[0], g[1], g[2], g[3]]);
        let _ = w.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
            Some((f32::from_bits(b) - lr * g).to_bits())
        });
    }
}

impl Table {
    /// The chunk holding dense `key`, created (every row initialised) on first touch, and the
    /// row's index in it. The chunk is found by index; after its creation, a single acquire
    /// load.
    fn chunk(&self, key: u64, dim: usize) -> (&Chunk, usize) {
        let (c, r) = (key as usize / CHUNK_ROWS, key as usize % CHUNK_ROWS);
        let chunk = self.chunk_at(c, dim);
        let (word, bit) = (&chunk.touched[r / 64], 1u64 << (r % 64));
        if word.load(Ordering::Relaxed) & bit == 0 {
            word.fetch_or(bit, Ordering::Relaxed);
        }
        (chunk, r)
    }

    /// Chunk `c` of the dense range, created (every row initialised, none touched) if it
    /// does not exist yet.
    fn chunk_at(&self, c: usize, dim: usize) -> &Chunk {
        self.chunks[c].get_or_init(|| {
            let first = (c * CHUNK_ROWS) as u64;
            Chunk {
                values: (first..first + CHUNK_ROWS as u64)
                    .flat_map(|k| init_row(self.seed, k, dim))
                    .collect(),
                touched: Default::default(),
            }
        })
    }

    /// Runs `f` on `key`'s row, creating it first if needed: dense keys without a lock,
    /// overflow keys under their shard's lock.
    fn with_row<R>(&self, key: u64, dim: usize, f: impl FnOnce(&Row) -> R) -> R {
        if key < DENSE_KEYS {
            let (chunk, r) = self.chunk(key, dim);
            return f(&chunk.values[r * dim..(r + 1) * dim]);
        }
        let shard = &self.overflow[(splitmix64(key) >> 32) as usize % self.overflow.len()];
        let mut map = shard.lock();
        let row = map
            .entry(key)
            .or_insert_with(|| init_row(self.seed, key, dim).collect());
        f(row)
    }
}

/// The tables of a parameter server; all share one `dim`. Safe to share between threads.
///
/// Keys below [`DENSE_KEYS`] live in chunks of 256 rows reached by index: a Pull
/// takes no lock and a Push adds with a compare-and-swap per value (the rows hold f32 bits in
/// `AtomicU32`s), so pushes never hold pulls back and concurrent pushes to one row all land
/// (Hogwild!-style: a pull during a push may see some of its values updated and others not).
/// A Pull first touches every cache line of every row it names, so their misses overlap
/// instead of coming one after another, then copies them.
/// Memory grows with the chunks touched (dim × 4 × 256 bytes each). Keys above go to an
/// overflow map sharded over `shards` locks.
#[derive(Debug)]
pub struct Store {
    dim: usize,
    tables: HashMap<String, Table>,
}

impl Store {
    /// Tables `names`, rows of `dim` values (at least 1), the overflow map of each in `shards`
    /// lock shards (at least 1).
    pub fn new(dim: usize, names: &[String], shards: usize) -> Store {
        let dim = dim.max(1);
        let chunks = (DENSE_KEYS as usize).div_ceil(CHUNK_ROWS);
        let tables = names
            .iter()
            .map(|n| {
                let overflow = (0..shards.max(1))
                    .map(|_| Mutex::new(HashMap::new()))
                    .collect();
                (
                    n.clone(),
                    Table {
                        seed: fnv1a64(n.as_bytes()),
                        chunks: (0..chunks).map(|_| OnceLock::new()).collect(),
                        overflow,
                    },
                )
            })
            .collect();
        Store { dim, tables }
    }

    /// Creates, in every table, the rows of keys `0..keys` (at most [`DENSE_KEYS`]) with their
    /// deterministic init, in whole chunks of 256 rows, so that no call pays for a first touch
    /// later (a server measured by `bx ps bench` otherwise spends part of its CPU per call
    /// creating chunks as the Zipf tail reaches them). Rows are not marked touched:
    /// [`Store::rows`] still counts only rows pulled or pushed. Memory: `keys` × dim × 4 bytes
    /// per table, rounded up to a chunk.
    pub fn prefill(&self, keys: u64) {
        let chunks = keys.min(DENSE_KEYS).div_ceil(CHUNK_ROWS as u64) as usize;
        for t in self.tables.values() {
            for c in 0..chunks {
                t.chunk_at(c, self.dim);
            }
        }
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

    /// The rows of `keys`, concatenated as little-endian f32 (keys × dim × 4 bytes).
    pub fn pull(&self, table: &str, keys: &[u64]) -> Result<Bytes, PsError> {
        let mut out = Vec::new();
        self.pull_into(table, keys, &mut out)?;
        Ok(Bytes::from(out))
    }

    /// [`Store::pull`] appending the rows to `out` (keys × dim × 4 bytes more), so that a
    /// server can gather them straight into the message it sends. On an error `out` is as it
    /// was.
    pub fn pull_into(&self, table: &str, keys: &[u64], out: &mut Vec<u8>) -> Result<(), PsError> {
        let t = self.table(table, keys.len())?;
        let (dim, row_bytes) = (self.dim, self.dim * 4);
        // first touch every cache line of every dense row, so the misses overlap
        let mut sum = 0u32;
        for &k in keys.iter().filter(|&&k| k < DENSE_KEYS) {
            let (chunk, r) = t.chunk(k, dim);
            for v in chunk.values[r * dim..(r + 1) * dim]
                .iter()
                .step_by(LINE_VALUES)
            {
                sum ^= v.load(Ordering::Relaxed);
            }
        }
        std::hint::black_box(sum);
        let start = out.len();
        out.resize(start + keys.len() * row_bytes, 0);
        for (&k, o) in keys.iter().zip(out[start..].chunks_exact_mut(row_bytes)) {
            t.with_row(k, dim, |row| read_row(row, o));
        }
        Ok(())
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
            t.with_row(k, self.dim, |row| add_row(row, g, lr));
        }
        Ok(())
    }

    /// Rows pulled or pushed so far, over all tables (the others of a touched chunk hold their
    /// init but are not counted).
    pub fn rows(&self) -> usize {
        self.tables
            .values()
            .map(|t| {
                let dense: usize = t
                    .chunks
                    .iter()
                    .filter_map(OnceLock::get)
                    .flat_map(|c| c.touched.iter())
                    .map(|w| w.load(Ordering::Relaxed).count_ones() as usize)
                    .sum();
                dense + t.overflow.iter().map(|s| s.lock().len()).sum::<usize>()
            })
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
    fn prefilled_rows_hold_their_init_and_count_only_once_touched() {
        let prefilled = store();
        prefilled.prefill(1000);
        assert_eq!(prefilled.rows(), 0, "prefill touches no row");
        let t = prefilled.tables.get("emb").unwrap();
        let made = t.chunks.iter().filter(|c| c.get().is_some()).count();
        assert_eq!(
            made,
            1000usize.div_ceil(CHUNK_ROWS),
            "whole chunks up to key 999"
        );
        let keys = [0, 1, 255, 256, 999, 1000, 5000];
        let fresh = store();
        assert_eq!(
            prefilled.pull("emb", &keys).unwrap(),
            fresh.pull("emb", &keys).unwrap(),
            "the same init as rows made on first touch"
        );
        assert_eq!(prefilled.rows(), keys.len());
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

    #[test]
    fn overflow_keys_above_the_dense_range_pull_and_push_like_dense_ones() {
        let s = store();
        let k = DENSE_KEYS + 12345;
        let g: Vec<u8> = [1.0f32, 0.0, 0.0, 0.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        s.push("emb", &[k], &g, 0.25).unwrap();
        let v = decode_f32s(&s.pull("emb", &[k, 3]).unwrap());
        assert_eq!(v[0], init_value("emb", k, 0) - 0.25);
        assert_eq!(v[1], init_value("emb", k, 1));
        assert_eq!(v[4], init_value("emb", 3, 0));
        assert_eq!(s.rows(), 2);
    }

    /// Pushers hammer two rows while a puller pulls them. A pull reads without waiting for
    /// pushes: some pulls see a row in the middle of a push (some of its values with one more
    /// push applied than others), which a store locking its rows for a push never shows. And
    /// every push lands exactly (the gradients are powers of two that keep every sum exact
    /// in f32).
    #[test]
    fn concurrent_pushes_do_not_hold_pulls_back_and_every_push_lands() {
        const PUSHERS: usize = 3;
        const PUSHES: usize = 4000;
        let s = Store::new(64, &["emb".to_string()], 1);
        let keys = [7u64, 300];
        let step = 2f32.powi(-22);
        let g: Vec<u8> = std::iter::repeat_n(step.to_le_bytes(), 2 * 64)
            .flatten()
            .collect();
        let init: Vec<f32> = (0..64).map(|i| init_value("emb", 7, i)).collect();
        let done = AtomicU32::new(0);
        let (pulls, mid_push) = std::thread::scope(|sc| {
            for _ in 0..PUSHERS {
                sc.spawn(|| {
                    for _ in 0..PUSHES {
                        s.push("emb", &keys, &g, 1.0).unwrap();
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                });
            }
            let puller = sc.spawn(|| {
                let (mut pulls, mut mid_push) = (0u64, 0u64);
                while done.load(Ordering::SeqCst) < PUSHERS as u32 {
                    let v = decode_f32s(&s.pull("emb", &keys).unwrap());
                    assert_eq!(v.len(), 128);
                    // pushes applied to each value of key 7's row (exact: see above)
                    let applied: Vec<f32> = (0..64).map(|i| (init[i] - v[i]) / step).collect();
                    assert!(applied.iter().all(|&n| n.fract() == 0.0 && n >= 0.0));
                    if applied.iter().any(|&n| n != applied[0]) {
                        mid_push += 1;
                    }
                    pulls += 1;
                }
                (pulls, mid_push)
            });
            puller.join().unwrap()
        });
        assert!(
            pulls > 0 && mid_push > 0,
            "{pulls} pulls, {mid_push} saw a row mid-push"
        );
        let v = decode_f32s(&s.pull("emb", &keys).unwrap());
        for (j, &k) in keys.iter().enumerate() {
            for i in 0..64 {
                let want = init_value("emb", k, i as u32) - step * (PUSHERS * PUSHES) as f32;
                assert_eq!(v[j * 64 + i], want, "key {k} value {i}");
            }
        }
        assert_eq!(s.rows(), 2);
    }
}
