//! ECN marking at a switch egress queue: RED (DCQCN) or DCTCP's step.

use rand::Rng;

use crate::config::EcnMode;

/// Whether a data packet that finds `queue_bytes` in its egress queue (on enqueue) is marked
/// CE, drawing from `rng` only in RED's linear region.
///
/// RED as DCQCN configures it (Zhu et al. 2015, section 3.1; Floyd & Jacobson 1993 on the
/// instantaneous queue): `p = 0` at or below K_min, `P_max (q − K_min)/(K_max − K_min)`
/// between, 1 above K_max. Step (DCTCP, Alizadeh et al. 2010): marked when `q > K`.
#[inline]
pub fn mark<R: Rng>(mode: &EcnMode, queue_bytes: u64, rng: &mut R) -> bool {
    match *mode {
        EcnMode::Off => false,
        EcnMode::Step { k_bytes } => queue_bytes > k_bytes,
        EcnMode::Red {
            kmin_bytes,
            kmax_bytes,
            pmax,
        } => {
            if queue_bytes <= kmin_bytes {
                false
            } else if queue_bytes > kmax_bytes {
                true
            } else {
                let p = pmax * (queue_bytes - kmin_bytes) as f64
                    / (kmax_bytes - kmin_bytes).max(1) as f64;
                rng.random::<f64>() < p
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    #[test]
    fn red_marks_none_below_kmin_all_above_kmax_and_about_pmax_half_way() {
        let mode = EcnMode::Red {
            kmin_bytes: 5_000,
            kmax_bytes: 200_000,
            pmax: 0.01,
        };
        let mut rng = SmallRng::seed_from_u64(7);
        assert!((0..1000).all(|_| !mark(&mode, 5_000, &mut rng)));
        assert!((0..1000).all(|_| mark(&mode, 200_001, &mut rng)));
        let n = 200_000;
        let marked = (0..n).filter(|_| mark(&mode, 102_500, &mut rng)).count();
        let p = marked as f64 / n as f64;
        assert!((0.004..0.006).contains(&p), "p = {p}");
    }

    #[test]
    fn step_marks_strictly_above_k() {
        let mode = EcnMode::Step { k_bytes: 100 };
        let mut rng = SmallRng::seed_from_u64(1);
        assert!(!mark(&mode, 100, &mut rng));
        assert!(mark(&mode, 101, &mut rng));
    }
}
