//! The facade is a library a tonic service depends on: `cargo tree -p byteexpress -e normal`
//! must hold none of the crates of the `bx` tool and its benchmark (clap, hdrhistogram,
//! rand_distr, indicatif, plotters, nix, the log subscriber and the Prometheus exporter). They
//! belong to `bx` and `byteexpress-ps`. The facade records its events through the `metrics`
//! facade crate only; the application chooses the recorder. Without its `tls` feature the
//! facade compiles no TLS crate (rustls, tokio-rustls, rustls-pki-types, ring): a user without
//! TLS builds none of it (issue 24).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// Crates a service that depends on the facade must not get.
const CLI_CRATES: &[&str] = &[
    "clap",
    "hdrhistogram",
    "rand_distr",
    "indicatif",
    "plotters",
    "nix",
    "tracing-subscriber",
    "metrics-exporter-prometheus",
];

/// Crates only the facade's `tls` feature may bring.
const TLS_CRATES: &[&str] = &["rustls", "tokio-rustls", "rustls-pki-types", "ring"];

/// The package names in `cargo tree -p <package> -e normal` of this workspace.
fn normal_dependencies(package: &str) -> BTreeSet<String> {
    normal_dependencies_with(package, &[])
}

/// [`normal_dependencies`] with `features` of `package` enabled.
fn normal_dependencies_with(package: &str, features: &[&str]) -> BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(cargo)
        .current_dir(&root)
        .args(["tree", "-p", package, "-e", "normal", "--prefix", "none"])
        .args(["--format", "{p}"])
        .args(features.iter().flat_map(|f| ["--features", f]))
        .output()
        .expect("running cargo tree");
    assert!(
        out.status.success(),
        "cargo tree -p {package} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("cargo tree prints UTF-8")
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_facade_pulls_in_no_cli_or_benchmark_crates() {
    let deps = normal_dependencies("byteexpress");
    // the tree was read: the facade's own stack is in it
    for needed in ["byteexpress", "byteexpress-rpc", "tonic", "http", "metrics"] {
        assert!(deps.contains(needed), "{needed} missing from {deps:?}");
    }
    let found: Vec<_> = CLI_CRATES.iter().filter(|c| deps.contains(**c)).collect();
    assert!(
        found.is_empty(),
        "the byteexpress facade depends on {found:?}"
    );
}

#[test]
fn the_check_sees_the_cli_crates_where_they_are() {
    // the same reading of the tree finds clap and hdrhistogram in the `bx` tool, so the check
    // above cannot pass by failing to see them
    let deps = normal_dependencies("bx");
    for c in ["byteexpress"].iter().chain(CLI_CRATES) {
        assert!(deps.contains(*c), "{c} missing from bx's tree {deps:?}");
    }
}

#[test]
fn the_facade_without_its_tls_feature_pulls_in_no_tls_crate() {
    let deps = normal_dependencies("byteexpress");
    assert!(deps.contains("tonic"), "the tree was read: {deps:?}");
    let found: Vec<_> = TLS_CRATES.iter().filter(|c| deps.contains(**c)).collect();
    assert!(
        found.is_empty(),
        "the byteexpress facade without `tls` depends on {found:?}"
    );
    // the same reading with the feature sees them, so the check cannot pass by missing them
    let with = normal_dependencies_with("byteexpress", &["tls"]);
    for c in TLS_CRATES {
        assert!(
            with.contains(*c),
            "{c} missing from the tree with `tls`: {with:?}"
        );
    }
}
