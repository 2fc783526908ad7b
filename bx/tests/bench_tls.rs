//! `bx ps bench` rows over TLS (issue 24): `tcp+tls` and `h2+tls` run beside the plain rows,
//! against a second `bx ps serve` child started with `--tls-cert`/`--tls-key`, their clients
//! trusting `--tls-ca`; without the CA the +tls rows are refused before anything starts.

mod pingpong_common;

use std::time::Duration;

use pingpong_common::*;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

const LIMIT: Duration = Duration::from_secs(180);

/// Writes a CA, and a certificate for localhost signed by it with its key, into `dir`:
/// `ca.pem`, `server.pem`, `server.key`.
fn write_pki(dir: &std::path::Path) {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "bench CA");
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = leaf.signed_by(&key, &ca).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    std::fs::write(dir.join("server.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("server.key"), key.serialize_pem()).unwrap();
}

#[test]
fn tls_rows_run_beside_the_plain_rows() {
    let dir = std::env::temp_dir().join(format!("bx-bench-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    write_pki(&dir);
    let p = |f: &str| dir.join(f).to_str().unwrap().to_string();
    let (cert, key, ca) = (p("server.pem"), p("server.key"), p("ca.pem"));
    let args = [
        "ps",
        "bench",
        "--transports",
        "tcp,tcp+tls,h2,h2+tls",
        "--duration",
        "1",
        "--warmup",
        "0",
        "--keys",
        "1000",
        "--workers",
        "1",
        "--in-flight",
        "4",
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--tls-ca",
        &ca,
    ];
    let f = finish(spawn(BX, &args), LIMIT);
    assert!(f.status.success(), "{}", f.both());
    let rows: Vec<(String, u64)> = f
        .stdout
        .lines()
        .skip(1)
        .map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            (cols[0].to_string(), cols[1].parse().expect(l))
        })
        .collect();
    let names: Vec<&str> = rows.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["bx/tcp", "bx/tcp+tls", "grpc/h2", "grpc/h2+tls"],
        "{}",
        f.both()
    );
    assert!(rows.iter().all(|(_, calls)| *calls > 0), "{}", f.both());

    // +tls rows without the CA to trust are refused before anything starts
    let f = finish(
        spawn(
            BX,
            &[
                "ps",
                "bench",
                "--transports",
                "tcp+tls",
                "--tls-cert",
                &cert,
                "--tls-key",
                &key,
            ],
        ),
        LIMIT,
    );
    assert!(!f.status.success(), "{}", f.both());
    assert!(f.stderr.contains("--tls-ca"), "{}", f.both());
    let _ = std::fs::remove_dir_all(&dir);
}
