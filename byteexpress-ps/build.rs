//! Generates the tonic/prost code of `proto/*.proto` with the protoc of `protoc-bin-vendored`.
//! (The path goes to prost-build's config rather than the `PROTOC` variable: `set_var` is
//! `unsafe` in edition 2024 and this crate has none.) `bytes` fields decode as `bytes::Bytes`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut cfg = tonic_prost_build::Config::new();
    cfg.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure()
        .bytes(".")
        .compile_with_config(
            cfg,
            &["proto/ps.proto", "proto/echo.proto", "proto/streams.proto"],
            &["proto"],
        )?;
    Ok(())
}
