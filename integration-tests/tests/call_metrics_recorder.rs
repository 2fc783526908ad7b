//! The call metrics (`bx_calls_total`, `bx_call_duration_seconds`,
//! `byteexpress_rpc::metrics::record_call`) reach the recorder in effect when each call ends:
//! calls before any recorder are lost, a recorder installed later gets every call after it, a
//! thread's local recorder the calls made under it and the global one the rest, and repeated
//! calls add up on one series. (A cache of registered handles kept across recorders fails
//! here; one keyed by recorder passed but outlived exporters' idle expiry, so none is kept.)
//!
//! One test only in this binary: it installs the process's global recorder.

use std::time::Duration;

use byteexpress_rpc::Code;
use byteexpress_rpc::metrics::{Side, record_call};
use metrics_exporter_prometheus::PrometheusBuilder;

/// The value of the sample line of `text` that starts with `series`.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn calls_recorded_before_and_after_a_recorder_is_installed_reach_the_recorder_in_effect() {
    let method = "/t.Svc/Method";
    // before any recorder: handles registered with the no-op recorder
    for _ in 0..3 {
        record_call(Side::Client, method, Code::Ok, Duration::from_micros(50));
    }

    let global = PrometheusBuilder::new().build_recorder();
    let global_text = global.handle();
    metrics::set_global_recorder(global).expect("the only recorder of this binary");
    for _ in 0..4 {
        record_call(Side::Client, method, Code::Ok, Duration::from_micros(50));
    }
    record_call(
        Side::Client,
        method,
        Code::NotFound,
        Duration::from_micros(50),
    );
    record_call(Side::Server, method, Code::Ok, Duration::from_micros(50));

    let local = PrometheusBuilder::new().build_recorder();
    let local_text = local.handle();
    metrics::with_local_recorder(&local, || {
        for _ in 0..2 {
            record_call(Side::Client, method, Code::Ok, Duration::from_micros(50));
        }
    });
    record_call(Side::Client, method, Code::Ok, Duration::from_micros(50));

    let g = global_text.render();
    let ok = r#"bx_calls_total{side="client",method="/t.Svc/Method",code="Ok"}"#;
    assert_eq!(
        sample(&g, ok),
        Some(5.0),
        "4 calls after the install and 1 after the local recorder, none of the 3 before:\n{g}"
    );
    assert_eq!(
        sample(
            &g,
            r#"bx_calls_total{side="client",method="/t.Svc/Method",code="NotFound"}"#
        ),
        Some(1.0),
        "{g}"
    );
    assert_eq!(
        sample(
            &g,
            r#"bx_calls_total{side="server",method="/t.Svc/Method",code="Ok"}"#
        ),
        Some(1.0),
        "{g}"
    );
    assert_eq!(
        sample(
            &g,
            r#"bx_call_duration_seconds_count{side="client",method="/t.Svc/Method"}"#
        ),
        Some(6.0),
        "one latency sample per client call recorded globally:\n{g}"
    );
    let l = local_text.render();
    assert_eq!(sample(&l, ok), Some(2.0), "the calls made under it:\n{l}");
}
