//! Generates the `hermes.collector.v1` types with the vendored `protoc`, so no
//! system protoc is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc);
    tonic_prost_build::configure()
        .codec_path("crate::codec::SliceCodec")
        .build_client(true)
        .build_server(true)
        .compile_with_config(config, &["hermes/collector/v1/ingest.proto"], &["."])?;
    println!("cargo:rerun-if-changed=hermes/collector/v1/ingest.proto");
    Ok(())
}
