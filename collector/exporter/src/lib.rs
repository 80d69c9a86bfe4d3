//! Span exporters of the Hermes collector and the stage that drives them.
//!
//! Input: finished spans as `Vec<ResourceSpans>` (OTLP protobuf types of
//! `opentelemetry-proto`) on a bounded channel. Output: the same spans,
//! batched, at every configured sink.
//!
//! | module | owns |
//! |---|---|
//! | [`stage`] | the async exporter stage: batching, fan-out, retry, drain, [`ExporterStats`] |
//! | [`sink`] | the [`SpanExporter`] trait, the named [`Sink`] and the shared [`ExportBatch`] |
//! | [`grpc`] | OTLP/gRPC exporter ([`GrpcExporter`]) |
//! | [`http`] | OTLP/HTTP protobuf exporter ([`HttpExporter`]) |
//! | [`logs`] | OTLP log export over the same transports and retry policy ([`LogsExporter`]) |
//! | [`file`](mod@file) | OTLP JSON lines file exporter ([`FileExporter`]) |
//! | [`console`] | human-readable turn trees ([`ConsoleExporter`]) |
//! | [`encode`] | the OTLP request's protobuf bytes in two passes (each length measured once) |
//! | [`error`] | [`ExportError`] and its [`RetryClass`] |
//! | [`retry`] | [`RetrySettings`] and the backoff sequence |
//! | [`tls`] | [`TlsSettings`] of `https://` endpoints: roots, client certificate, handshake errors |
//!
//! The binary owns configuration parsing and fills the plain `*Config` /
//! `*Settings` structs of this crate (TLS material as PEM text); nothing
//! here reads the environment or files other than the file exporter's output
//! and, for an `https://` endpoint without a CA of its own, the system's root
//! certificate store.
//!
//! ```no_run
//! # async fn example() -> Result<(), hermes_exporter::ExportError> {
//! use hermes_exporter::*;
//! let sinks = vec![
//!     Sink::new("otlp_grpc", GrpcExporter::new(GrpcExporterConfig::default())?),
//!     Sink::new("console", ConsoleExporter::stdout(ConsoleExporterConfig::default())),
//! ];
//! let (tx, rx) = tokio::sync::mpsc::channel(1024);
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! let stage = ExporterStage::new(sinks, ExporterSettings::default());
//! let stats = stage.stats();
//! let task = tokio::spawn(stage.run(rx, shutdown.clone()));
//! # drop(tx); let _ = (stats, task);
//! # Ok(()) }
//! ```

mod batch;
pub mod console;
pub mod encode;
pub mod error;
pub mod file;
mod framed;
pub mod grpc;
mod gzip;
pub mod http;
pub mod logs;
mod metrics;
pub mod retry;
pub mod sink;
pub mod stage;
pub mod tls;

pub use batch::{Encoded, Encoder, Outgoing};
pub use console::{ConsoleExporter, ConsoleExporterConfig};
pub use error::{ExportError, RetryClass};
pub use file::{FileExporter, FileExporterConfig};
pub use grpc::{Compression, DEFAULT_GZIP_LEVEL, GrpcExporter, GrpcExporterConfig};
pub use http::{HttpExporter, HttpExporterConfig, https_connector};
pub use logs::{Delivery, LogsExporter};
pub use retry::RetrySettings;
pub use sink::{ExportBatch, ExportFuture, ExportOutcome, Sink, SpanExporter, shown_endpoint};
pub use stage::{ExporterSettings, ExporterStage, ExporterStats, SinkStats, run};
pub use tls::TlsSettings;
