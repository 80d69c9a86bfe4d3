//! Integration tests of hermes-exporter, in one test binary (one link on a
//! small machine): real OTLP gRPC and HTTP receivers on 127.0.0.1:0, the file
//! and console exporters, and the stage with scripted sinks and paused time.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod console;
mod file;
mod grpc;
mod http;
mod stage;
