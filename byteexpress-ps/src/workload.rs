//! The calls a parameter-server client makes: each names `keys_per_call` keys drawn from a Zipf
//! law over `keys` distinct keys (rank 1 is key 0, the most popular), and is a Push with
//! probability `push_ratio`, else a Pull. This is the shape of recommendation inference
//! (pulling embedding rows of popular ids) and training (pushing their gradients) that the
//! ByteExpress design measures.
//!
//! A bench that measures transports must not measure this sampler: drawing one Zipf key costs
//! tens of ns (`rand_distr`'s rejection-inversion sampler), i.e. microseconds for a call of 64
//! keys, as much as a fast transport's whole call. [`KeyRing`] draws the keys before the
//! measured phase, and a call then takes the next `keys_per_call` of them.

use bytes::Bytes;
use rand::Rng;
use rand_distr::{Distribution, Zipf};

/// Settings a [`Workload`] is built from that cannot give a workload.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum WorkloadError {
    /// `keys` or `keys_per_call` is 0.
    #[error("keys ({keys}) and keys per call ({keys_per_call}) must be positive")]
    Empty {
        /// Distinct keys.
        keys: u64,
        /// Keys per call.
        keys_per_call: usize,
    },
    /// `push_ratio` is not within 0..=1.
    #[error("push ratio {0} is not within 0..=1")]
    PushRatio(f64),
    /// The Zipf law cannot be built (a negative or non-finite exponent).
    #[error("zipf law over {keys} keys with exponent {skew}: {source}")]
    Zipf {
        /// Distinct keys.
        keys: u64,
        /// The exponent.
        skew: f64,
        /// What `rand_distr` said.
        #[source]
        source: rand_distr::ZipfError,
    },
}

/// One call of the workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// Pull the rows of these keys.
    Pull(Vec<u64>),
    /// Push gradients for these keys.
    Push(Vec<u64>),
}

impl Call {
    /// The keys the call names.
    pub fn keys(&self) -> &[u64] {
        match self {
            Call::Pull(k) | Call::Push(k) => k,
        }
    }
}

/// A Zipf-distributed Pull/Push workload; cheap to copy, one per call loop.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    keys: u64,
    keys_per_call: usize,
    push_ratio: f64,
    zipf: Zipf<f64>,
}

impl Workload {
    /// A workload over keys `0..keys` with Zipf exponent `skew`, `keys_per_call` keys per call
    /// and a share `push_ratio` (0..=1) of Pushes. Errors: [`WorkloadError`].
    pub fn new(
        keys: u64,
        skew: f64,
        keys_per_call: usize,
        push_ratio: f64,
    ) -> Result<Self, WorkloadError> {
        if keys == 0 || keys_per_call == 0 {
            return Err(WorkloadError::Empty {
                keys,
                keys_per_call,
            });
        }
        if !(0.0..=1.0).contains(&push_ratio) {
            return Err(WorkloadError::PushRatio(push_ratio));
        }
        let zipf = Zipf::new(keys as f64, skew).map_err(|source| WorkloadError::Zipf {
            keys,
            skew,
            source,
        })?;
        Ok(Workload {
            keys,
            keys_per_call,
            push_ratio,
            zipf,
        })
    }

    /// Keys per call.
    pub fn keys_per_call(&self) -> usize {
        self.keys_per_call
    }

    /// The next call, drawn with `rng`: the keys first, then whether it is a Push.
    pub fn next_call(&self, rng: &mut impl Rng) -> Call {
        let keys: Vec<u64> = (0..self.keys_per_call)
            .map(|_| (self.zipf.sample(rng) as u64).clamp(1, self.keys) - 1)
            .collect();
        if rng.random::<f64>() < self.push_ratio {
            Call::Push(keys)
        } else {
            Call::Pull(keys)
        }
    }

    /// A ring of `len` keys drawn with `rng` now, to be handed out `keys_per_call` at a time
    /// by [`KeyRing::next_keys`] (for the measured phase of a bench). `len` is rounded up to a
    /// whole number of calls (at least one).
    pub fn ring(&self, len: usize, rng: &mut impl Rng) -> KeyRing {
        let calls = len.div_ceil(self.keys_per_call).max(1);
        let keys = (0..calls * self.keys_per_call)
            .map(|_| (self.zipf.sample(rng) as u64).clamp(1, self.keys) - 1)
            .collect();
        KeyRing {
            keys,
            keys_per_call: self.keys_per_call,
            next: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// The gradients of one Push at `dim` values per key: `keys_per_call × dim` little-endian
    /// f32 values of 0.001 (small, so a long bench keeps the rows near their init).
    pub fn grads(&self, dim: usize) -> Bytes {
        Bytes::from(
            std::iter::repeat_n(0.001f32.to_le_bytes(), self.keys_per_call * dim)
                .flatten()
                .collect::<Vec<u8>>(),
        )
    }
}

/// Zipf keys drawn in advance ([`Workload::ring`]): a call takes the next `keys_per_call`
/// of them, wrapping around at the end. Shared by the call loops of one worker (the cursor is
/// an atomic, so handing out a call's keys costs one `fetch_add`).
#[derive(Debug)]
pub struct KeyRing {
    keys: Vec<u64>,
    keys_per_call: usize,
    next: std::sync::atomic::AtomicUsize,
}

impl KeyRing {
    /// The keys of the next call: `keys_per_call` keys of the ring, in the order drawn.
    pub fn next_keys(&self) -> &[u64] {
        let calls = self.keys.len() / self.keys_per_call;
        let i = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % calls;
        &self.keys[i * self.keys_per_call..(i + 1) * self.keys_per_call]
    }

    /// Keys in the ring.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the ring holds no key (never: a ring holds at least one call).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Calls handed out so far ([`KeyRing::next_keys`]); past `len / keys_per_call` the ring
    /// has wrapped and calls repeat.
    pub fn calls_taken(&self) -> usize {
        self.next.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    use super::*;

    #[test]
    fn keys_stay_below_the_key_count_and_the_most_popular_key_is_zero() {
        let w = Workload::new(1000, 1.05, 64, 0.0).unwrap();
        let mut rng = SmallRng::seed_from_u64(1);
        let mut counts = vec![0u32; 1000];
        for _ in 0..200 {
            let c = w.next_call(&mut rng);
            assert!(matches!(c, Call::Pull(_)));
            assert_eq!(c.keys().len(), 64);
            for &k in c.keys() {
                counts[k as usize] += 1;
            }
        }
        let top = (0..1000).max_by_key(|&k| counts[k]).unwrap();
        assert_eq!(top, 0, "rank 1 of the Zipf law is key 0");
        assert!(counts[0] > 10 * counts[500].max(1));
    }

    #[test]
    fn the_push_ratio_sets_the_share_of_pushes() {
        let w = Workload::new(100, 1.0, 1, 0.25).unwrap();
        let mut rng = SmallRng::seed_from_u64(7);
        let pushes = (0..4000)
            .filter(|_| matches!(w.next_call(&mut rng), Call::Push(_)))
            .count();
        assert!((800..1200).contains(&pushes), "{pushes} pushes of 4000");
        let all = Workload::new(100, 1.0, 1, 1.0).unwrap();
        assert!(matches!(all.next_call(&mut rng), Call::Push(_)));
    }

    #[test]
    fn settings_that_give_no_workload_are_typed_errors() {
        assert!(matches!(
            Workload::new(0, 1.0, 1, 0.0),
            Err(WorkloadError::Empty { .. })
        ));
        assert!(matches!(
            Workload::new(10, 1.0, 0, 0.0),
            Err(WorkloadError::Empty { .. })
        ));
        assert_eq!(
            Workload::new(10, 1.0, 1, 1.5).unwrap_err(),
            WorkloadError::PushRatio(1.5)
        );
        assert!(matches!(
            Workload::new(10, -1.0, 1, 0.0),
            Err(WorkloadError::Zipf { .. })
        ));
    }

    #[test]
    fn a_ring_hands_out_its_predrawn_keys_in_order_then_wraps() {
        let w = Workload::new(1000, 1.05, 4, 0.0).unwrap();
        let ring = w.ring(10, &mut SmallRng::seed_from_u64(3));
        assert_eq!(ring.len(), 12, "rounded up to 3 calls of 4 keys");
        // the same keys as drawing them from the law with the same seed
        let mut rng = SmallRng::seed_from_u64(3);
        let drawn: Vec<Vec<u64>> = (0..3)
            .map(|_| {
                (0..4)
                    .map(|_| (w.zipf.sample(&mut rng) as u64).clamp(1, 1000) - 1)
                    .collect()
            })
            .collect();
        for want in drawn.iter().chain(drawn.iter()) {
            assert_eq!(ring.next_keys(), &want[..]);
        }
        assert_eq!(ring.calls_taken(), 6);
        assert!(ring.keys.iter().all(|&k| k < 1000));
    }

    #[test]
    fn grads_hold_one_f32_per_key_and_dim() {
        let w = Workload::new(10, 1.0, 3, 0.0).unwrap();
        let g = w.grads(4);
        assert_eq!(g.len(), 3 * 4 * 4);
        assert_eq!(&g[..4], &0.001f32.to_le_bytes());
    }
}
