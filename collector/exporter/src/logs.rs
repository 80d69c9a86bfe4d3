//! OTLP log export: [`LogsExporter`] sends `ExportLogsServiceRequest`s
//! over the span exporters' transports and retry policy.
//!
//! The transports are [`GrpcExporter`] and [`HttpExporter`] themselves,
//! pointed at the logs service (`LogsService/Export`, `POST /v1/logs`):
//! the same TLS, headers, compression, timeout and error classes as the
//! span export. [`LogsExporter::export_with_retry`] follows the stage's
//! backoff ([`RetrySettings`]) bounded by `max_elapsed`, and stops early on
//! its cancellation token. The caller owns what a request carries (for the
//! trajectories: one log record per trajectory file).

use bytes::Bytes;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use prost::Message as _;
use tokio_util::sync::CancellationToken;

use crate::error::ExportError;
use crate::grpc::{GrpcExporter, GrpcExporterConfig};
use crate::http::{HttpExporter, HttpExporterConfig};
use crate::retry::{Attempts, RetrySettings};
use crate::sink::SpanExporter as _;
use crate::tls::TlsSettings;

/// The OTLP logs service's `Export` method.
const GRPC_PATH: &str = "/opentelemetry.proto.collector.logs.v1.LogsService/Export";
/// The OTLP/HTTP path of logs.
const HTTP_PATH: &str = "/v1/logs";

/// Sends OTLP log requests to one endpoint.
#[derive(Debug)]
pub enum LogsExporter {
    /// OTLP/gRPC (each transport boxed: their clients are large and of
    /// different sizes).
    Grpc(Box<GrpcExporter>),
    /// OTLP/HTTP, binary protobuf (`/v1/logs` appended to the endpoint
    /// unless present).
    Http(Box<HttpExporter>),
}

/// How a request with retries ended.
#[derive(Debug)]
pub enum Delivery {
    /// Accepted; `rejected` log records were refused (partial success).
    Sent {
        /// Log records the receiver refused.
        rejected: u64,
        /// Attempts that failed before it was accepted.
        retries: u32,
    },
    /// Given up: a final error, or `max_elapsed` reached.
    Failed(ExportError),
    /// The cancellation token fired first.
    Stopped,
}

impl LogsExporter {
    /// OTLP/gRPC with the span exporter's settings (checked as by
    /// [`GrpcExporter::new_with_tls`]; connects nothing).
    pub fn grpc(config: GrpcExporterConfig, tls: Option<TlsSettings>) -> Result<Self, ExportError> {
        Ok(Self::Grpc(Box::new(
            GrpcExporter::new_with_tls(config, tls)?.with_path(GRPC_PATH),
        )))
    }

    /// OTLP/HTTP protobuf with the span exporter's settings.
    pub fn http(config: HttpExporterConfig, tls: Option<TlsSettings>) -> Result<Self, ExportError> {
        Ok(Self::Http(Box::new(HttpExporter::for_path(
            config, tls, HTTP_PATH,
        )?)))
    }

    /// Where the records go, for logs (no credentials).
    pub fn destination(&self) -> String {
        match self {
            Self::Grpc(grpc) => format!("{} (logs)", grpc.destination()),
            Self::Http(http) => http.destination(),
        }
    }

    /// One attempt; the number of log records the receiver refused.
    pub async fn export(&mut self, body: Bytes) -> Result<u64, ExportError> {
        let outcome = match self {
            Self::Grpc(grpc) => grpc.send(vec![body]).await?,
            Self::Http(http) => http.post(body).await?,
        };
        Ok(outcome.rejected_spans)
    }

    /// Sends `request`, retrying with the backoff of `retry` until it is
    /// accepted, an error is final, `retry.max_elapsed` is reached or
    /// `stop` fires. Each retry is logged at debug level, the first at warn.
    pub async fn export_with_retry(
        &mut self,
        request: &ExportLogsServiceRequest,
        retry: &RetrySettings,
        stop: &CancellationToken,
    ) -> Delivery {
        let body = Bytes::from(request.encode_to_vec());
        let mut attempts = Attempts::new(retry);
        let mut retries: u32 = 0;
        loop {
            let result = tokio::select! {
                biased;
                () = stop.cancelled() => return Delivery::Stopped,
                result = self.export(body.clone()) => result,
            };
            let error = match result {
                Ok(rejected) => return Delivery::Sent { rejected, retries },
                Err(error) => error,
            };
            let Some(delay) = attempts.after(&error) else {
                return Delivery::Failed(error);
            };
            if retries == 0 {
                tracing::warn!(error = %error, ?delay, "OTLP log export failed; retrying");
            } else {
                tracing::debug!(error = %error, ?delay, retries, "OTLP log export failed again; retrying");
            }
            tokio::select! {
                biased;
                () = stop.cancelled() => return Delivery::Stopped,
                () = tokio::time::sleep(delay) => {}
            }
            retries = retries.saturating_add(1);
        }
    }
}
