//! Outlier detection: gRPC's proposal A50 ("xDS outlier detection"), plus consecutive-failure
//! ejection as Envoy's `consecutive_5xx` has it.

use std::time::Duration;

/// Outlier-detection settings of a [`ReplicaSet`](crate::ReplicaSet). Source: gRPC A50
/// (`OutlierDetectionLoadBalancingConfig`); field names and defaults are A50's (interval 10 s,
/// base_ejection_time 30 s, max_ejection_time 300 s, max_ejection_percent 10), and
/// `consecutive_failures` follows Envoy's `consecutive_5xx` (default 5).
///
/// Every call's result counts: OK is a success, any other status a failure (CANCELLED by the
/// caller excepted), as gRPC's implementations of A50 count. Every `interval` the counts of the
/// interval just ended go through success-rate and failure-percentage ejection; consecutive
/// failures eject at once. An endpoint ejected for the n-th time in a row stays out
/// `min(base_ejection_time × n, max(base_ejection_time, max_ejection_time))`; each interval
/// it spends admitted lowers n by one. No ejection happens while
/// `ejected × 100 / endpoints ≥ max_ejection_percent`.
#[derive(Debug, Clone, PartialEq)]
pub struct OutlierDetection {
    /// Period of the ejection and re-admission sweep (default 10 s).
    pub interval: Duration,
    /// Ejection time of a first ejection (default 30 s).
    pub base_ejection_time: Duration,
    /// Cap of the ejection time, unless below `base_ejection_time` (default 300 s).
    pub max_ejection_time: Duration,
    /// Most endpoints ejected at once, in percent of the set (default 10).
    pub max_ejection_percent: u32,
    /// Success-rate ejection; `None` disables it (default: A50's defaults).
    pub success_rate_ejection: Option<SuccessRateEjection>,
    /// Failure-percentage ejection; `None` disables it (default: A50's defaults, whose
    /// enforcement of 0 % ejects nothing until raised).
    pub failure_percentage_ejection: Option<FailurePercentageEjection>,
    /// Failures in a row that eject an endpoint at once; `None` or 0 disables it (default 5).
    pub consecutive_failures: Option<u32>,
}

impl Default for OutlierDetection {
    fn default() -> Self {
        OutlierDetection {
            interval: Duration::from_secs(10),
            base_ejection_time: Duration::from_secs(30),
            max_ejection_time: Duration::from_secs(300),
            max_ejection_percent: 10,
            success_rate_ejection: Some(SuccessRateEjection::default()),
            failure_percentage_ejection: Some(FailurePercentageEjection::default()),
            consecutive_failures: Some(5),
        }
    }
}

/// A50's `success_rate_ejection`: endpoints whose success rate over the last interval is below
/// `mean − stdev × stdev_factor / 1000` of the endpoints with enough calls are ejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SuccessRateEjection {
    /// Standard deviations below the mean, × 1000 (default 1900).
    pub stdev_factor: u32,
    /// Chance in percent that a qualifying endpoint is ejected (default 100).
    pub enforcement_percentage: u32,
    /// Endpoints with at least `request_volume` calls needed for the check to run (default 5).
    pub minimum_hosts: u32,
    /// Calls in the interval an endpoint needs to be considered (default 100).
    pub request_volume: u32,
}

impl Default for SuccessRateEjection {
    fn default() -> Self {
        SuccessRateEjection {
            stdev_factor: 1900,
            enforcement_percentage: 100,
            minimum_hosts: 5,
            request_volume: 100,
        }
    }
}

/// A50's `failure_percentage_ejection`: endpoints whose failures over the last interval exceed
/// `threshold` percent of their calls are ejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailurePercentageEjection {
    /// Failure percentage above which an endpoint is ejected (default 85).
    pub threshold: u32,
    /// Chance in percent that a qualifying endpoint is ejected (default 0).
    pub enforcement_percentage: u32,
    /// Endpoints with at least `request_volume` calls needed for the check to run (default 5).
    pub minimum_hosts: u32,
    /// Calls in the interval an endpoint needs to be considered (default 50).
    pub request_volume: u32,
}

impl Default for FailurePercentageEjection {
    fn default() -> Self {
        FailurePercentageEjection {
            threshold: 85,
            enforcement_percentage: 0,
            minimum_hosts: 5,
            request_volume: 50,
        }
    }
}

/// One endpoint as the interval sweep sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct HostWindow {
    pub successes: u64,
    pub failures: u64,
    pub ejected: bool,
}

impl HostWindow {
    fn volume(&self) -> u64 {
        self.successes + self.failures
    }
}

/// Whether one more endpoint may be ejected: fewer than `max_ejection_percent` % are out.
pub(crate) fn may_eject(ejected: usize, total: usize, max_percent: u32) -> bool {
    total > 0 && (ejected as u64 * 100) < (total as u64 * max_percent as u64)
}

/// Success-rate ejection threshold of A50: `mean − stdev × factor / 1000` over the success
/// rates (0..=1) of the endpoints with enough calls.
pub(crate) fn success_rate_threshold(rates: &[f64], stdev_factor: u32) -> f64 {
    let n = rates.len() as f64;
    let mean = rates.iter().sum::<f64>() / n;
    let var = rates.iter().map(|r| (r - mean) * (r - mean)).sum::<f64>() / n;
    mean - var.sqrt() * (stdev_factor as f64 / 1000.0)
}

/// The interval sweep's ejections (A50 steps 2 and 3): marks the endpoints it ejects in
/// `hosts` and returns their indices with the check that ejected each (`success_rate`,
/// `failure_percentage`). `rand100` draws a uniform number in 0..100 for the
/// enforcement percentages.
pub(crate) fn sweep(
    cfg: &OutlierDetection,
    hosts: &mut [HostWindow],
    rand100: &mut dyn FnMut() -> u32,
) -> Vec<(usize, &'static str)> {
    let mut out = vec![];
    let total = hosts.len();
    if let Some(sr) = cfg.success_rate_ejection {
        let idx: Vec<usize> = (0..total)
            .filter(|&i| hosts[i].volume() >= sr.request_volume as u64 && sr.request_volume > 0)
            .collect();
        if !idx.is_empty() && idx.len() >= sr.minimum_hosts as usize {
            let rates: Vec<f64> = idx
                .iter()
                .map(|&i| hosts[i].successes as f64 / hosts[i].volume() as f64)
                .collect();
            let threshold = success_rate_threshold(&rates, sr.stdev_factor);
            for (&i, &rate) in idx.iter().zip(&rates) {
                let ejected = hosts.iter().filter(|h| h.ejected).count();
                if !may_eject(ejected, total, cfg.max_ejection_percent) {
                    break;
                }
                if !hosts[i].ejected && rate < threshold && rand100() < sr.enforcement_percentage {
                    hosts[i].ejected = true;
                    out.push((i, "success_rate"));
                }
            }
        }
    }
    if let Some(fp) = cfg.failure_percentage_ejection {
        let idx: Vec<usize> = (0..total)
            .filter(|&i| hosts[i].volume() >= fp.request_volume as u64 && hosts[i].volume() > 0)
            .collect();
        if idx.len() >= fp.minimum_hosts as usize {
            for &i in &idx {
                let ejected = hosts.iter().filter(|h| h.ejected).count();
                if !may_eject(ejected, total, cfg.max_ejection_percent) {
                    break;
                }
                let pct = hosts[i].failures as f64 * 100.0 / hosts[i].volume() as f64;
                if !hosts[i].ejected
                    && pct > fp.threshold as f64
                    && rand100() < fp.enforcement_percentage
                {
                    hosts[i].ejected = true;
                    out.push((i, "failure_percentage"));
                }
            }
        }
    }
    out
}

/// How long an endpoint ejected for the `multiplier`-th time in a row stays out:
/// `min(base × multiplier, max(base, max_ejection_time))`.
pub(crate) fn ejection_time(cfg: &OutlierDetection, multiplier: u32) -> Duration {
    let cap = cfg.base_ejection_time.max(cfg.max_ejection_time);
    cfg.base_ejection_time
        .checked_mul(multiplier.max(1))
        .unwrap_or(cap)
        .min(cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(s: u64, f: u64) -> HostWindow {
        HostWindow {
            successes: s,
            failures: f,
            ejected: false,
        }
    }

    fn always() -> impl FnMut() -> u32 {
        || 0
    }

    #[test]
    fn success_rate_threshold_is_mean_minus_factor_stdevs() {
        // rates 1,1,1,1,0.5: mean 0.9, stdev 0.2
        let t = success_rate_threshold(&[1.0, 1.0, 1.0, 1.0, 0.5], 1900);
        assert!((t - (0.9 - 0.2 * 1.9)).abs() < 1e-12, "{t}");
        let t = success_rate_threshold(&[1.0, 1.0, 1.0, 1.0, 0.5], 1000);
        assert!((t - 0.7).abs() < 1e-12, "{t}");
    }

    #[test]
    fn success_rate_ejects_the_low_host_once_enough_hosts_have_volume() {
        let cfg = OutlierDetection {
            max_ejection_percent: 100,
            failure_percentage_ejection: None,
            ..Default::default()
        };
        let mut hosts = [
            host(100, 0),
            host(100, 0),
            host(100, 0),
            host(100, 0),
            host(10, 90),
        ];
        assert_eq!(
            sweep(&cfg, &mut hosts, &mut always()),
            vec![(4, "success_rate")]
        );
        assert!(hosts[4].ejected);
        // four hosts with volume: below minimum_hosts 5, nothing happens
        let mut hosts = [
            host(100, 0),
            host(100, 0),
            host(100, 0),
            host(10, 90),
            host(9, 0),
        ];
        assert!(sweep(&cfg, &mut hosts, &mut always()).is_empty());
        // rates 1,1,1,1,0.9: mean 0.98, stdev 0.04; 0.9 is 2 stdevs below: out at factor
        // 1900 (threshold 0.904), in at 2100 (threshold 0.896)
        let mut hosts = [
            host(100, 0),
            host(100, 0),
            host(100, 0),
            host(100, 0),
            host(90, 10),
        ];
        assert_eq!(sweep(&cfg, &mut hosts, &mut always()).len(), 1);
        let wide = OutlierDetection {
            success_rate_ejection: Some(SuccessRateEjection {
                stdev_factor: 2100,
                ..Default::default()
            }),
            ..cfg.clone()
        };
        let mut hosts = [
            host(100, 0),
            host(100, 0),
            host(100, 0),
            host(100, 0),
            host(90, 10),
        ];
        assert!(sweep(&wide, &mut hosts, &mut always()).is_empty());
        // enforcement 0 %: never
        let cfg0 = OutlierDetection {
            success_rate_ejection: Some(SuccessRateEjection {
                enforcement_percentage: 0,
                ..Default::default()
            }),
            ..cfg
        };
        let mut hosts = [
            host(100, 0),
            host(100, 0),
            host(100, 0),
            host(100, 0),
            host(10, 90),
        ];
        assert!(sweep(&cfg0, &mut hosts, &mut always()).is_empty());
    }

    #[test]
    fn failure_percentage_ejects_above_threshold_when_enforced() {
        let cfg = OutlierDetection {
            max_ejection_percent: 100,
            success_rate_ejection: None,
            failure_percentage_ejection: Some(FailurePercentageEjection {
                enforcement_percentage: 100,
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut hosts = [
            host(50, 0),
            host(50, 0),
            host(50, 0),
            host(7, 43),
            host(8, 42),
        ];
        // 43/50 = 86 % > 85 ejected; 42/50 = 84 % stays
        assert_eq!(
            sweep(&cfg, &mut hosts, &mut always()),
            vec![(3, "failure_percentage")]
        );
        // A50's default enforcement (0 %) ejects nothing
        let cfg_default = OutlierDetection {
            max_ejection_percent: 100,
            success_rate_ejection: None,
            ..Default::default()
        };
        let mut hosts = [
            host(50, 0),
            host(50, 0),
            host(50, 0),
            host(7, 43),
            host(0, 50),
        ];
        assert!(sweep(&cfg_default, &mut hosts, &mut always()).is_empty());
        // a host below request_volume is not counted
        let mut hosts = [
            host(50, 0),
            host(50, 0),
            host(50, 0),
            host(0, 49),
            host(0, 50),
        ];
        assert!(sweep(&cfg, &mut hosts, &mut always()).is_empty());
    }

    #[test]
    fn max_ejection_percent_stops_further_ejections() {
        let cfg = OutlierDetection {
            max_ejection_percent: 20,
            success_rate_ejection: None,
            failure_percentage_ejection: Some(FailurePercentageEjection {
                enforcement_percentage: 100,
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut hosts = [
            host(0, 50),
            host(0, 50),
            host(0, 50),
            host(50, 0),
            host(50, 0),
        ];
        assert_eq!(
            sweep(&cfg, &mut hosts, &mut always()),
            vec![(0, "failure_percentage")]
        );
        assert!(!may_eject(1, 5, 20));
        assert!(may_eject(0, 3, 10));
        assert!(!may_eject(1, 3, 10));
        assert!(may_eject(1, 3, 34));
    }

    #[test]
    fn ejection_time_grows_with_the_multiplier_up_to_the_max() {
        let cfg = OutlierDetection::default();
        assert_eq!(ejection_time(&cfg, 1), Duration::from_secs(30));
        assert_eq!(ejection_time(&cfg, 3), Duration::from_secs(90));
        assert_eq!(ejection_time(&cfg, 50), Duration::from_secs(300));
        let small_max = OutlierDetection {
            max_ejection_time: Duration::from_secs(1),
            ..cfg
        };
        assert_eq!(ejection_time(&small_max, 4), Duration::from_secs(30));
    }
}
