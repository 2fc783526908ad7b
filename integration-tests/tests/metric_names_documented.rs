//! Every metric name `byteexpress-rpc` records is documented for users (README) and in the
//! design (DESIGN.md 3.5), so an operator finds what a Prometheus series means.

use std::path::Path;

fn doc(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn every_recorded_metric_name_is_in_the_readme_and_the_design() {
    let names = byteexpress_rpc::metrics::NAMES;
    assert!(names.len() >= 10, "{names:?}");
    for (file, text) in [
        ("README.md", doc("README.md")),
        ("DESIGN.md", doc("DESIGN.md")),
    ] {
        for n in names {
            assert!(
                text.contains(&format!("`{n}`")),
                "{n} is not documented in {file}"
            );
        }
    }
}
