//! OTLP/gRPC exporter.
//!
//! This module owns [`GrpcExporter`]: one tonic `TraceServiceClient` over a
//! lazily connected HTTP/2 channel, with a per-request timeout (enforced
//! locally and sent as `grpc-timeout`), optional gzip compression and extra
//! metadata. Configuration is validated in [`GrpcExporter::new`], which does no
//! I/O and needs no runtime; the channel is created on the first export (it
//! must live on the runtime that drives it), and tonic reconnects it by itself
//! after a failure.
//!
//! TLS: not supported yet; `https://` endpoints are rejected by `new`. TLS
//! will come as a `tls` field on [`GrpcExporterConfig`] applied in
//! `GrpcExporter::endpoint` through `Endpoint::tls_config` (tonic feature
//! `tls-ring`).

use std::sync::Arc;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use tonic::codec::CompressionEncoding;
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tonic::transport::{Channel, Endpoint};

use crate::error::{ExportError, truncate};
use crate::sink::{ExportFuture, ExportOutcome, SpanExporter};

/// Compression of export requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Compression {
    /// No compression.
    #[default]
    None,
    /// gzip (`grpc-encoding: gzip` for gRPC).
    Gzip,
}

/// Settings of the OTLP/gRPC exporter, filled by the binary from its config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcExporterConfig {
    /// Receiver URL with scheme, host and port, e.g. `http://127.0.0.1:4317`.
    /// Only `http` (plain HTTP/2) for now.
    pub endpoint: String,
    /// Deadline of one export request, connection included.
    pub timeout: Duration,
    /// Deadline of establishing the TCP connection.
    pub connect_timeout: Duration,
    /// Request compression.
    pub compression: Compression,
    /// Extra metadata sent with every request (e.g. an authorization token).
    /// Names are lower-cased; `-bin` (binary) keys are not supported.
    pub headers: Vec<(String, String)>,
}

impl Default for GrpcExporterConfig {
    fn default() -> Self {
        Self {
            endpoint: "http://127.0.0.1:4317".to_owned(),
            timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            compression: Compression::None,
            headers: Vec::new(),
        }
    }
}

/// Exports batches with OTLP/gRPC `TraceService/Export`.
pub struct GrpcExporter {
    endpoint: Endpoint,
    metadata: MetadataMap,
    compression: Compression,
    timeout: Duration,
    client: Option<TraceServiceClient<Channel>>,
}

impl std::fmt::Debug for GrpcExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcExporter")
            .field("endpoint", &self.endpoint.uri())
            .field("compression", &self.compression)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl GrpcExporter {
    /// Validates the configuration. Does no I/O: the connection is made on
    /// the first export.
    pub fn new(config: GrpcExporterConfig) -> Result<Self, ExportError> {
        let endpoint = Self::endpoint(&config)?;
        let metadata = metadata_map(&config.headers)?;
        Ok(Self {
            endpoint,
            metadata,
            compression: config.compression,
            timeout: config.timeout,
            client: None,
        })
    }

    /// Builds the tonic endpoint. The place where TLS settings will go.
    fn endpoint(config: &GrpcExporterConfig) -> Result<Endpoint, ExportError> {
        let invalid = |reason: String| ExportError::InvalidEndpoint {
            endpoint: config.endpoint.clone(),
            reason,
        };
        let uri: http::Uri = config
            .endpoint
            .parse()
            .map_err(|e: http::uri::InvalidUri| invalid(e.to_string()))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => return Err(invalid("TLS is not supported yet; use http://".into())),
            Some(other) => return Err(invalid(format!("unsupported scheme {other:?}"))),
            None => return Err(invalid("missing scheme, expected http://host:port".into())),
        }
        if uri.host().is_none() {
            return Err(invalid("missing host".into()));
        }
        let endpoint = Endpoint::from(uri)
            .connect_timeout(config.connect_timeout)
            .timeout(config.timeout)
            .tcp_nodelay(true);
        Ok(endpoint)
    }

    fn client(&mut self) -> TraceServiceClient<Channel> {
        if let Some(client) = &self.client {
            return client.clone();
        }
        let mut client = TraceServiceClient::new(self.endpoint.connect_lazy())
            .accept_compressed(CompressionEncoding::Gzip);
        if self.compression == Compression::Gzip {
            client = client.send_compressed(CompressionEncoding::Gzip);
        }
        self.client = Some(client.clone());
        client
    }
}

impl SpanExporter for GrpcExporter {
    fn export(&mut self, request: Arc<ExportTraceServiceRequest>) -> ExportFuture<'_> {
        Box::pin(async move {
            let mut client = self.client();
            let mut grpc_request = tonic::Request::new(ExportTraceServiceRequest::clone(&request));
            *grpc_request.metadata_mut() = self.metadata.clone();
            grpc_request.set_timeout(self.timeout);
            let response = tokio::time::timeout(self.timeout, client.export(grpc_request))
                .await
                .map_err(|_| ExportError::Timeout(self.timeout))?
                .map_err(|status| ExportError::from_status(&status))?;
            let rejected_spans = response
                .into_inner()
                .partial_success
                .map(|p| {
                    if p.rejected_spans > 0 {
                        tracing::debug!(
                            rejected = p.rejected_spans,
                            message = %truncate(&p.error_message, 256),
                            "OTLP gRPC partial success"
                        );
                    }
                    u64::try_from(p.rejected_spans).unwrap_or(0)
                })
                .unwrap_or(0);
            Ok(ExportOutcome { rejected_spans })
        })
    }
}

fn metadata_map(headers: &[(String, String)]) -> Result<MetadataMap, ExportError> {
    let mut map = MetadataMap::new();
    for (name, value) in headers {
        let invalid = |reason: String| ExportError::InvalidHeader {
            name: name.clone(),
            reason,
        };
        let key = MetadataKey::from_bytes(name.to_ascii_lowercase().as_bytes())
            .map_err(|e| invalid(e.to_string()))?;
        let value = MetadataValue::try_from(value.as_str()).map_err(|e| invalid(e.to_string()))?;
        map.append(key, value);
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(endpoint: &str) -> GrpcExporterConfig {
        GrpcExporterConfig {
            endpoint: endpoint.into(),
            ..GrpcExporterConfig::default()
        }
    }

    #[test]
    fn rejects_bad_endpoints() {
        for bad in ["127.0.0.1:4317", "https://x:4317", "ftp://x", "http://"] {
            assert!(
                matches!(
                    GrpcExporter::new(config(bad)),
                    Err(ExportError::InvalidEndpoint { .. })
                ),
                "{bad}"
            );
        }
        assert!(GrpcExporter::new(config("http://localhost:4317")).is_ok());
    }

    #[test]
    fn rejects_bad_headers() {
        let mut c = config("http://localhost:4317");
        c.headers = vec![("bad header".into(), "v".into())];
        assert!(matches!(
            GrpcExporter::new(c.clone()),
            Err(ExportError::InvalidHeader { .. })
        ));
        c.headers = vec![("x-token".into(), "line\nbreak".into())];
        assert!(matches!(
            GrpcExporter::new(c.clone()),
            Err(ExportError::InvalidHeader { .. })
        ));
        c.headers = vec![("X-Token".into(), "abc".into())];
        assert!(GrpcExporter::new(c).is_ok());
    }
}
