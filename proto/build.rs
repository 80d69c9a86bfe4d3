//! Generates the `hermes.collector.v1` types with the vendored `protoc`, so no
//! system protoc is needed.
//!
//! Two passes over the one `.proto`: the messages and the client (the
//! shim's side, `hermes.collector.v1.rs`), then the server alone
//! (`server/hermes.collector.v1.rs`), whose messages are the first pass'
//! except the request, [`RawBatch`](crate::wire::RawBatch): an
//! `EventBatch` kept as its bytes, received with
//! [`WireCodec`](crate::codec::WireCodec) and checked by the receiver. The first pass also writes the
//! file's descriptors, which the event views' fields are tested against.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let proto = "hermes/collector/v1/ingest.proto";
    let config = || {
        let mut config = tonic_prost_build::Config::new();
        config.protoc_executable(&protoc);
        // The ids and the two largest bodies live on the heap, so an
        // `Event`, which the collector's decoding and sequencer move several
        // times, is 272 bytes instead of 808: the two allocations cost less
        // than the copies they save (docs/BENCHMARKS.md).
        config.boxed(".hermes.collector.v1.Event.ids");
        config.boxed(".hermes.collector.v1.Event.body.api");
        config.boxed(".hermes.collector.v1.Event.body.approval");
        config
    };
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .codec_path("crate::codec::SliceCodec")
        .file_descriptor_set_path(out_dir.join("ingest.descriptors"))
        .build_client(true)
        .build_server(false)
        .compile_with_config(config(), &[proto], &["."])?;
    let server_dir = out_dir.join("server");
    std::fs::create_dir_all(&server_dir)?;
    tonic_prost_build::configure()
        .codec_path("crate::codec::WireCodec")
        .build_client(false)
        .build_server(true)
        .out_dir(&server_dir)
        .extern_path(".hermes.collector.v1.EventBatch", "crate::wire::RawBatch")
        .extern_path(".hermes.collector.v1", "crate::v1")
        .compile_with_config(config(), &[proto], &["."])?;
    println!("cargo:rerun-if-changed={proto}");
    Ok(())
}
