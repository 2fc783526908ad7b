//! The `bx` command line, built as a binary of this package so that the facade tests can
//! spawn it through `env!("CARGO_BIN_EXE_bx-facade")`.
//!
//! Why a copy: cargo sets `CARGO_BIN_EXE_<name>` only for binaries of the package under test,
//! and building `integration-tests` builds the `bx` *library*, not its `bx` binary, so
//! `target/<profile>/bx` may be missing or stale when these tests run. This file runs exactly
//! the code of `bx` ([`bx::main`]), and cargo rebuilds it before every test run.

fn main() -> std::process::ExitCode {
    bx::main()
}
