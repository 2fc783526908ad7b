//! Python `grpcio`, the gRPC client that is not ours, for the interop tests (`tonic_facade`,
//! `tls_clients`): a venv with grpcio and grpcio-tools, and the PS service's Python stubs.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `cmd`, returning its stdout and stderr. Errors: it could not start or failed (its
/// output included).
pub fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("{cmd:?} failed ({}):\n{text}", out.status))
    }
}

/// A venv with grpcio and grpcio-tools at `venv`, created once and reused; returns its
/// python. Errors: the venv or the PyPI install failed (e.g. PyPI unreachable).
pub fn venv(venv: &Path) -> Result<PathBuf, String> {
    let python = venv.join("bin/python");
    if python.exists() && run(Command::new(&python).args(["-c", "import grpc, grpc_tools"])).is_ok()
    {
        return Ok(python);
    }
    run(Command::new("python3")
        .args(["-m", "venv", "--clear"])
        .arg(venv))?;
    run(Command::new(&python).args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--timeout",
        "60",
        "grpcio",
        "grpcio-tools",
    ]))?;
    Ok(python)
}

/// The venv at `dir`, or `None` when installing failed and `BX_ALLOW_SKIP` contains `pypi`
/// (the test then says it is skipped). Panics when installing failed otherwise.
pub fn venv_or_skip(dir: &Path) -> Option<PathBuf> {
    match venv(dir) {
        Ok(p) => Some(p),
        Err(e) if std::env::var("BX_ALLOW_SKIP").is_ok_and(|v| v.contains("pypi")) => {
            eprintln!(
                "\n!!!!!!!! SKIPPED: python grpcio interop test: installing grpcio from PyPI failed and BX_ALLOW_SKIP contains 'pypi':\n{e}\n!!!!!!!!\n"
            );
            None
        }
        Err(e) => panic!(
            "installing Python grpcio into a venv failed (set BX_ALLOW_SKIP=pypi to skip this test):\n{e}"
        ),
    }
}

/// Generates the Python stubs of `byteexpress-ps/proto/ps.proto` into `out`. Errors: protoc
/// failed.
pub fn ps_stubs(python: &Path, out: &Path) -> Result<(), String> {
    let proto_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../byteexpress-ps/proto");
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    run(Command::new(python)
        .args(["-m", "grpc_tools.protoc"])
        .arg(format!("-I{}", proto_dir.display()))
        .arg(format!("--python_out={}", out.display()))
        .arg(format!("--grpc_python_out={}", out.display()))
        .arg("ps.proto"))
    .map(|_| ())
}
