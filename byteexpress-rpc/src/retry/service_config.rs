//! gRPC service config (`doc/service_config.md`) as far as calls are concerned: `methodConfig`
//! (name matching, `timeout`, `waitForReady`, `retryPolicy` | `hedgingPolicy`) and
//! `retryThrottling`, with gRPC A6's validation rules. Other top-level fields
//! (`loadBalancingConfig`, ...) are accepted and ignored.

use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::Code;

/// A gRPC service config's call settings. Build it from JSON ([`ServiceConfig::from_json`]) or
/// in Rust (then [`ServiceConfig::validate`] before use; attaching it validates too).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServiceConfig {
    /// `methodConfig`: settings per method name; the first entry naming a call's method wins
    /// (see [`ServiceConfig::method`] for the matching order).
    pub method_config: Vec<MethodConfig>,
    /// `retryThrottling`: the token bucket shared by every call of the channel; `None` = no
    /// throttling.
    pub retry_throttling: Option<RetryThrottling>,
}

/// One `methodConfig` entry.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MethodConfig {
    /// The methods it applies to (at least one).
    pub name: Vec<MethodName>,
    /// `timeout`: the call's deadline when shorter than the caller's own (or the caller has
    /// none); covers every attempt.
    pub timeout: Option<Duration>,
    /// `waitForReady`: whether calls wait for a ready endpoint (gRPC's
    /// `doc/wait-for-ready.md`) when the call sets nothing itself; a call's own setting
    /// ([`CallOptions::wait_for_ready`](crate::CallOptions::wait_for_ready)) wins either way.
    pub wait_for_ready: Option<bool>,
    /// `retryPolicy` or `hedgingPolicy` (never both, A6).
    pub policy: Option<AttemptPolicy>,
}

/// A `name` entry: `{service, method}` names one method, `{service}` every method of a
/// service, `{}` (both empty) every method (the default entry).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct MethodName {
    /// Fully qualified service name, e.g. `ps.ParameterServer`; empty = any.
    pub service: String,
    /// Method name, e.g. `Pull`; empty = every method of `service`.
    pub method: String,
}

/// How failed attempts are followed up (A6: a method has one or the other).
#[derive(Debug, Clone, PartialEq)]
pub enum AttemptPolicy {
    /// `retryPolicy`: one attempt at a time, retried after a backoff on listed codes.
    Retry(RetryPolicy),
    /// `hedgingPolicy`: attempts started `hedging_delay` apart, first answer wins.
    Hedging(HedgingPolicy),
}

/// `retryPolicy` of A6.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// `maxAttempts`, the first attempt included: > 1; values above 5 are treated as 5.
    pub max_attempts: u32,
    /// `initialBackoff` (> 0).
    pub initial_backoff: Duration,
    /// `maxBackoff` (> 0).
    pub max_backoff: Duration,
    /// `backoffMultiplier` (> 0).
    pub backoff_multiplier: f64,
    /// `retryableStatusCodes` (non-empty): the codes that lead to a retry.
    pub retryable_status_codes: Vec<Code>,
}

/// `hedgingPolicy` of A6.
#[derive(Debug, Clone, PartialEq)]
pub struct HedgingPolicy {
    /// `maxAttempts`, the first attempt included: > 1; values above 5 are treated as 5.
    pub max_attempts: u32,
    /// `hedgingDelay` (default 0: every attempt at once).
    pub hedging_delay: Duration,
    /// `nonFatalStatusCodes`: an attempt failing with one of these lets the others go on (and
    /// starts the next at once); any other failure ends the call.
    pub non_fatal_status_codes: Vec<Code>,
}

/// `retryThrottling` of A6.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryThrottling {
    /// `maxTokens`: in (0, 1000].
    pub max_tokens: u32,
    /// `tokenRatio`: > 0; tokens a success gives back (precision 0.001, A6).
    pub token_ratio: f64,
}

/// Why a service config was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceConfigError {
    /// Not JSON, or a field of the wrong JSON type.
    #[error("service config is not valid JSON of the expected shape: {0}")]
    Json(#[source] serde_json::Error),
    /// A duration not in proto3 JSON form (`"1.5s"`), or not > 0 where A6 requires it.
    #[error("{field}: bad duration {value:?} (proto3 JSON form such as \"0.1s\", > 0)")]
    Duration {
        /// The field.
        field: &'static str,
        /// Its value.
        value: String,
    },
    /// A status code that is neither a known name (`"UNAVAILABLE"`) nor a number 0..=16.
    #[error("{field}: unknown status code {value}")]
    Code {
        /// The field.
        field: &'static str,
        /// Its value.
        value: String,
    },
    /// A field outside its range (`maxAttempts` ≤ 1, `backoffMultiplier` ≤ 0, ...).
    #[error("{field}: {why}")]
    Range {
        /// The field.
        field: &'static str,
        /// What is wrong.
        why: String,
    },
    /// A required field is missing.
    #[error("{0} is required")]
    Missing(&'static str),
    /// A method config has both `retryPolicy` and `hedgingPolicy`.
    #[error("a methodConfig has both retryPolicy and hedgingPolicy")]
    BothPolicies,
    /// A `name` entry with a method but no service, or a name listed twice.
    #[error("bad methodConfig name: {0}")]
    Name(String),
}

/// A6's cap on `maxAttempts`.
pub const MAX_ATTEMPTS_CAP: u32 = 5;

impl ServiceConfig {
    /// Parses gRPC service-config JSON and validates it (A6's rules; see
    /// [`ServiceConfig::validate`]). Durations are proto3 JSON strings (`"0.1s"`), status
    /// codes names (`"UNAVAILABLE"`, any case) or numbers. Errors: [`ServiceConfigError`].
    pub fn from_json(json: &str) -> Result<ServiceConfig, ServiceConfigError> {
        let raw: RawConfig = serde_json::from_str(json).map_err(ServiceConfigError::Json)?;
        let mut out = ServiceConfig::default();
        for mc in raw.method_config {
            out.method_config.push(mc.convert()?);
        }
        if let Some(t) = raw.retry_throttling {
            out.retry_throttling = Some(RetryThrottling {
                max_tokens: t
                    .max_tokens
                    .ok_or(ServiceConfigError::Missing("retryThrottling.maxTokens"))?,
                token_ratio: t
                    .token_ratio
                    .ok_or(ServiceConfigError::Missing("retryThrottling.tokenRatio"))?,
            });
        }
        out.validate()?;
        Ok(out)
    }

    /// Checks A6's rules: `maxAttempts` > 1 (above 5 is allowed and treated as 5);
    /// `initialBackoff`, `maxBackoff` > 0; `backoffMultiplier` > 0; `retryableStatusCodes`
    /// non-empty; `maxTokens` in (0, 1000], `tokenRatio` > 0; a name's method only with its
    /// service; no name twice.
    pub fn validate(&self) -> Result<(), ServiceConfigError> {
        let mut seen = std::collections::HashSet::new();
        for mc in &self.method_config {
            if mc.name.is_empty() {
                return Err(ServiceConfigError::Missing("methodConfig.name"));
            }
            for n in &mc.name {
                if n.service.is_empty() && !n.method.is_empty() {
                    return Err(ServiceConfigError::Name(format!(
                        "method {:?} without a service",
                        n.method
                    )));
                }
                if !seen.insert(n.clone()) {
                    return Err(ServiceConfigError::Name(format!(
                        "{}/{} listed twice",
                        n.service, n.method
                    )));
                }
            }
            if mc.timeout.is_some_and(|t| t > MAX_DURATION) {
                return Err(too_long("timeout"));
            }
            if mc.timeout.is_some_and(|t| t.is_zero()) {
                return Err(ServiceConfigError::Duration {
                    field: "timeout",
                    value: "0s".into(),
                });
            }
            match &mc.policy {
                Some(AttemptPolicy::Retry(p)) => {
                    check_attempts(p.max_attempts, "retryPolicy.maxAttempts")?;
                    if p.initial_backoff.is_zero() {
                        return Err(range("retryPolicy.initialBackoff", "must be > 0"));
                    }
                    if p.max_backoff.is_zero() {
                        return Err(range("retryPolicy.maxBackoff", "must be > 0"));
                    }
                    if p.initial_backoff > MAX_DURATION {
                        return Err(too_long("retryPolicy.initialBackoff"));
                    }
                    if p.max_backoff > MAX_DURATION {
                        return Err(too_long("retryPolicy.maxBackoff"));
                    }
                    if !(p.backoff_multiplier > 0.0 && p.backoff_multiplier.is_finite()) {
                        return Err(range("retryPolicy.backoffMultiplier", "must be > 0"));
                    }
                    if p.retryable_status_codes.is_empty() {
                        return Err(ServiceConfigError::Missing(
                            "retryPolicy.retryableStatusCodes",
                        ));
                    }
                }
                Some(AttemptPolicy::Hedging(p)) => {
                    check_attempts(p.max_attempts, "hedgingPolicy.maxAttempts")?;
                    if p.hedging_delay > MAX_DURATION {
                        return Err(too_long("hedgingPolicy.hedgingDelay"));
                    }
                }
                None => {}
            }
        }
        if let Some(t) = &self.retry_throttling {
            if t.max_tokens == 0 || t.max_tokens > 1000 {
                return Err(range("retryThrottling.maxTokens", "must be in (0, 1000]"));
            }
            if !(t.token_ratio > 0.0 && t.token_ratio.is_finite()) {
                return Err(range("retryThrottling.tokenRatio", "must be > 0"));
            }
        }
        Ok(())
    }

    /// The method config of a call to `path` (`/service/method`): the entry naming the
    /// service and method, else the one naming the service alone, else the default entry
    /// (empty name), else `None` (gRPC's matching order, `doc/service_config.md`).
    pub fn method(&self, path: &str) -> Option<&MethodConfig> {
        let (service, method) = split_path(path);
        let find = |s: &str, m: &str| {
            self.method_config
                .iter()
                .find(|mc| mc.name.iter().any(|n| n.service == s && n.method == m))
        };
        find(service, method)
            .or_else(|| find(service, ""))
            .or_else(|| find("", ""))
    }
}

/// `/pkg.Service/Method` → (`pkg.Service`, `Method`).
fn split_path(path: &str) -> (&str, &str) {
    let p = path.strip_prefix('/').unwrap_or(path);
    p.rsplit_once('/').unwrap_or((p, ""))
}

fn range(field: &'static str, why: &str) -> ServiceConfigError {
    ServiceConfigError::Range {
        field,
        why: why.into(),
    }
}

fn too_long(field: &'static str) -> ServiceConfigError {
    range(
        field,
        "must be <= 315576000000.999999999s (proto3 Duration's maximum)",
    )
}

fn check_attempts(n: u32, field: &'static str) -> Result<(), ServiceConfigError> {
    if n <= 1 {
        return Err(range(field, "must be > 1"));
    }
    Ok(())
}

/// The largest proto3 `google.protobuf.Duration`: 315,576,000,000 s (10,000 years) and
/// 999,999,999 ns. Longer durations are not valid proto3 JSON and are refused.
pub const MAX_DURATION: Duration = Duration::new(315_576_000_000, 999_999_999);

/// Parses a proto3 JSON duration: decimal seconds with up to 9 fraction digits and an `s`
/// suffix (`"1s"`, `"0.1s"`, `"1.000000001s"`). Negative values, and values above
/// [`MAX_DURATION`] (proto3's range), are refused (A6 wants > 0 or ≥ 0 everywhere).
pub fn parse_duration(s: &str) -> Option<Duration> {
    let num = s.strip_suffix('s')?;
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() || !int.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    if frac.len() > 9 || !frac.bytes().all(|c| c.is_ascii_digit()) || num.ends_with('.') {
        return None;
    }
    let secs: u64 = int.parse().ok()?;
    let nanos: u32 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<9}").parse().ok()?
    };
    Some(Duration::new(secs, nanos)).filter(|d| *d <= MAX_DURATION)
}

/// A status code by name (`"UNAVAILABLE"`, any case) or number (0..=16).
pub fn parse_code(v: &Value) -> Option<Code> {
    match v {
        Value::Number(n) => n
            .as_u64()
            .filter(|&n| n <= 16)
            .map(|n| Code::from_u16(n as u16)),
        Value::String(s) => (0..=16u16)
            .map(Code::from_u16)
            .find(|c| code_name(*c).eq_ignore_ascii_case(s)),
        _ => None,
    }
}

/// gRPC's name of a code (`doc/statuscodes.md`), as service configs spell it.
pub fn code_name(c: Code) -> &'static str {
    match c {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

// ---- serde shapes of the JSON ----

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawConfig {
    #[serde(default)]
    method_config: Vec<RawMethodConfig>,
    retry_throttling: Option<RawThrottling>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawMethodConfig {
    #[serde(default)]
    name: Vec<RawName>,
    timeout: Option<String>,
    wait_for_ready: Option<bool>,
    retry_policy: Option<RawRetry>,
    hedging_policy: Option<RawHedging>,
}

#[derive(Deserialize)]
struct RawName {
    #[serde(default)]
    service: String,
    #[serde(default)]
    method: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawRetry {
    max_attempts: Option<u32>,
    initial_backoff: Option<String>,
    max_backoff: Option<String>,
    backoff_multiplier: Option<f64>,
    retryable_status_codes: Option<Vec<Value>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawHedging {
    max_attempts: Option<u32>,
    hedging_delay: Option<String>,
    #[serde(default)]
    non_fatal_status_codes: Vec<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawThrottling {
    max_tokens: Option<u32>,
    token_ratio: Option<f64>,
}

fn duration(field: &'static str, v: &str) -> Result<Duration, ServiceConfigError> {
    parse_duration(v).ok_or_else(|| ServiceConfigError::Duration {
        field,
        value: v.to_string(),
    })
}

fn codes(field: &'static str, vs: &[Value]) -> Result<Vec<Code>, ServiceConfigError> {
    vs.iter()
        .map(|v| {
            parse_code(v).ok_or_else(|| ServiceConfigError::Code {
                field,
                value: v.to_string(),
            })
        })
        .collect()
}

impl RawMethodConfig {
    fn convert(self) -> Result<MethodConfig, ServiceConfigError> {
        let policy = match (self.retry_policy, self.hedging_policy) {
            (Some(_), Some(_)) => return Err(ServiceConfigError::BothPolicies),
            (Some(r), None) => Some(AttemptPolicy::Retry(RetryPolicy {
                max_attempts: r
                    .max_attempts
                    .ok_or(ServiceConfigError::Missing("retryPolicy.maxAttempts"))?,
                initial_backoff: duration(
                    "retryPolicy.initialBackoff",
                    r.initial_backoff
                        .as_deref()
                        .ok_or(ServiceConfigError::Missing("retryPolicy.initialBackoff"))?,
                )?,
                max_backoff: duration(
                    "retryPolicy.maxBackoff",
                    r.max_backoff
                        .as_deref()
                        .ok_or(ServiceConfigError::Missing("retryPolicy.maxBackoff"))?,
                )?,
                backoff_multiplier: r
                    .backoff_multiplier
                    .ok_or(ServiceConfigError::Missing("retryPolicy.backoffMultiplier"))?,
                retryable_status_codes: codes(
                    "retryPolicy.retryableStatusCodes",
                    r.retryable_status_codes
                        .as_deref()
                        .ok_or(ServiceConfigError::Missing(
                            "retryPolicy.retryableStatusCodes",
                        ))?,
                )?,
            })),
            (None, Some(h)) => Some(AttemptPolicy::Hedging(HedgingPolicy {
                max_attempts: h
                    .max_attempts
                    .ok_or(ServiceConfigError::Missing("hedgingPolicy.maxAttempts"))?,
                hedging_delay: match h.hedging_delay.as_deref() {
                    Some(d) => duration("hedgingPolicy.hedgingDelay", d)?,
                    None => Duration::ZERO,
                },
                non_fatal_status_codes: codes(
                    "hedgingPolicy.nonFatalStatusCodes",
                    &h.non_fatal_status_codes,
                )?,
            })),
            (None, None) => None,
        };
        Ok(MethodConfig {
            name: self
                .name
                .into_iter()
                .map(|n| MethodName {
                    service: n.service,
                    method: n.method,
                })
                .collect(),
            timeout: self
                .timeout
                .as_deref()
                .map(|t| duration("timeout", t))
                .transpose()?,
            wait_for_ready: self.wait_for_ready,
            policy,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const FIRST: &str = r#"{"methodConfig": [{"name": [{"service": "ps.ParameterServer", "method": "Pull"}],
      "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
                      "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}],
     "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}}"#;
    const SECOND: &str = r#"{"methodConfig": [{"name": [{"service": "ps.ParameterServer", "method": "Pull"}],
      "hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "0.02s",
                        "nonFatalStatusCodes": ["UNAVAILABLE"]}}]}"#;

    #[test]
    fn issue_documents_parse_to_their_policies() {
        let c = ServiceConfig::from_json(FIRST).unwrap();
        let mc = c.method("/ps.ParameterServer/Pull").unwrap();
        assert_eq!(
            mc.policy,
            Some(AttemptPolicy::Retry(RetryPolicy {
                max_attempts: 4,
                initial_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(1),
                backoff_multiplier: 2.0,
                retryable_status_codes: vec![Code::Unavailable],
            }))
        );
        assert!(c.method("/ps.ParameterServer/Push").is_none());
        assert_eq!(
            c.retry_throttling,
            Some(RetryThrottling {
                max_tokens: 10,
                token_ratio: 0.1
            })
        );
        let h = ServiceConfig::from_json(SECOND).unwrap();
        match &h.method("/ps.ParameterServer/Pull").unwrap().policy {
            Some(AttemptPolicy::Hedging(p)) => {
                assert_eq!(p.max_attempts, 3);
                assert_eq!(p.hedging_delay, Duration::from_millis(20));
                assert_eq!(p.non_fatal_status_codes, vec![Code::Unavailable]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn name_matching_prefers_method_then_service_then_default() {
        let c = ServiceConfig::from_json(
            r#"{"methodConfig":[
              {"name":[{}],"timeout":"3s"},
              {"name":[{"service":"a.S"}],"timeout":"2s"},
              {"name":[{"service":"a.S","method":"M"}],"timeout":"1s"}]}"#,
        )
        .unwrap();
        let t = |p| c.method(p).unwrap().timeout.unwrap().as_secs();
        assert_eq!(t("/a.S/M"), 1);
        assert_eq!(t("/a.S/N"), 2);
        assert_eq!(t("/b.T/M"), 3);
    }

    #[test]
    fn a6_validation_refuses_bad_values() {
        let retry = |body: &str| {
            ServiceConfig::from_json(&format!(
                r#"{{"methodConfig":[{{"name":[{{"service":"s"}}],"retryPolicy":{body}}}]}}"#
            ))
        };
        let ok = r#"{"maxAttempts":2,"initialBackoff":"1s","maxBackoff":"1s","backoffMultiplier":1,"retryableStatusCodes":[14]}"#;
        assert!(retry(ok).is_ok());
        for bad in [
            ok.replace(r#""maxAttempts":2"#, r#""maxAttempts":1"#),
            ok.replace(r#""initialBackoff":"1s""#, r#""initialBackoff":"0s""#),
            ok.replace(r#""maxBackoff":"1s""#, r#""maxBackoff":"1""#),
            ok.replace(r#""maxBackoff":"1s""#, r#""maxBackoff":"-1s""#),
            ok.replace(r#""backoffMultiplier":1"#, r#""backoffMultiplier":0"#),
            ok.replace("[14]", "[]"),
            ok.replace("[14]", "[17]"),
            ok.replace("[14]", r#"["NOPE"]"#),
            ok.replace(r#""maxAttempts":2,"#, ""),
        ] {
            assert!(retry(&bad).is_err(), "{bad}");
        }
        // above 5 is allowed (treated as 5)
        assert!(retry(&ok.replace(r#""maxAttempts":2"#, r#""maxAttempts":9"#)).is_ok());
        assert!(matches!(
            ServiceConfig::from_json(
                r#"{"methodConfig":[{"name":[{"service":"s"}],"retryPolicy":{},"hedgingPolicy":{}}]}"#
            ),
            Err(ServiceConfigError::BothPolicies)
        ));
        assert!(
            ServiceConfig::from_json(r#"{"methodConfig":[{"name":[{"method":"M"}]}]}"#).is_err()
        );
        assert!(
            ServiceConfig::from_json(r#"{"retryThrottling":{"maxTokens":0,"tokenRatio":1}}"#)
                .is_err()
        );
        assert!(
            ServiceConfig::from_json(r#"{"retryThrottling":{"maxTokens":10,"tokenRatio":0}}"#)
                .is_err()
        );
        assert!(ServiceConfig::from_json("[").is_err());
    }

    #[test]
    fn codes_by_name_any_case_or_number() {
        assert_eq!(
            parse_code(&Value::from("unavailable")),
            Some(Code::Unavailable)
        );
        assert_eq!(parse_code(&Value::from(4)), Some(Code::DeadlineExceeded));
        assert_eq!(parse_code(&Value::from(17)), None);
        assert_eq!(parse_code(&Value::from(true)), None);
    }

    proptest! {
        #[test]
        fn durations_round_trip(secs in 0u64..1_000_000, nanos in 0u32..1_000_000_000) {
            let text = format!("{secs}.{nanos:09}s");
            prop_assert_eq!(parse_duration(&text), Some(Duration::new(secs, nanos)));
            let short = format!("{secs}s");
            prop_assert_eq!(parse_duration(&short), Some(Duration::from_secs(secs)));
        }

        #[test]
        fn malformed_durations_are_refused(s in "[-0-9.a-z]{0,12}") {
            let wellformed = {
                let num = s.strip_suffix('s');
                num.is_some_and(|n| {
                    let (i, f) = n.split_once('.').unwrap_or((n, ""));
                    !i.is_empty() && i.len() < 12 && i.bytes().all(|c| c.is_ascii_digit())
                        && f.len() <= 9 && f.bytes().all(|c| c.is_ascii_digit())
                        && !n.ends_with('.')
                })
            };
            prop_assert_eq!(parse_duration(&s).is_some(), wellformed);
        }

        #[test]
        fn any_code_number_parses_by_number_and_name(n in 0u16..=16) {
            let c = Code::from_u16(n);
            prop_assert_eq!(parse_code(&Value::from(n)), Some(c));
            prop_assert_eq!(parse_code(&Value::from(code_name(c))), Some(c));
        }
    }
}
