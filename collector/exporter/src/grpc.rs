//! OTLP/gRPC exporter.
//!
//! This module owns [`GrpcExporter`]: one tonic gRPC client of the OTLP
//! `TraceService/Export` method (or another signal's `Export`, for
//! [`crate::logs`]) over a lazily connected HTTP/2 channel, which sends
//! the shared batch's encoding as it is (no copy per attempt,
//! [`crate::framed`]), with a per-request timeout (enforced
//! locally and sent as `grpc-timeout`), optional gzip compression at a
//! configurable level ([`crate::gzip`]) and extra metadata. Configuration is validated in [`GrpcExporter::new`], which
//! connects nothing and needs no runtime; the channel is created on the first export (it
//! must live on the runtime that drives it), and tonic reconnects it by itself
//! after a failure.
//!
//! TLS: an `https://` endpoint is reached over TLS (rustls, tonic's
//! `tls-ring`), verified against the CA of its [`TlsSettings`] or the
//! system's roots, with its client certificate if given (mutual TLS); see
//! [`crate::tls`]. `new` checks the TLS material and reads the system's
//! root store when no CA is given; TLS settings with an `http://` endpoint
//! are refused, so a typo in the scheme never sends in plaintext what was
//! meant to be encrypted. Header values are sent as sensitive metadata and
//! never appear in `Debug` output or logs.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::uri::PathAndQuery;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use prost::Message as _;
use tonic::client::Grpc;
use tonic::codec::{Codec, CompressionEncoding, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tonic::transport::Endpoint;

use crate::error::{ExportError, error_chain, truncate};
use crate::framed::{FramedRequests, Message};
use crate::gzip::Gzip;
use crate::sink::{ExportBatch, ExportFuture, ExportOutcome, SpanExporter, shown_endpoint};
use crate::tls::{ClientTls, TlsSettings};

/// Compression of export requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Compression {
    /// No compression.
    #[default]
    None,
    /// gzip (`grpc-encoding: gzip` for gRPC).
    Gzip,
}

/// gzip level of export requests unless configured (`docs/BENCHMARKS.md`
/// has the CPU and size of the levels on the collector's spans).
pub const DEFAULT_GZIP_LEVEL: u32 = 6;

/// Settings of the OTLP/gRPC exporter, filled by the binary from its config.
#[derive(Clone, PartialEq, Eq)]
pub struct GrpcExporterConfig {
    /// Receiver URL with scheme, host and port, e.g. `http://127.0.0.1:4317`
    /// (plain HTTP/2) or `https://otlp.example.com:443` (TLS).
    pub endpoint: String,
    /// Deadline of one export request, connection included.
    pub timeout: Duration,
    /// Deadline of establishing the TCP connection.
    pub connect_timeout: Duration,
    /// Request compression.
    pub compression: Compression,
    /// Level of gzip compression, 0 (stored) to 9 (smallest).
    pub gzip_level: u32,
    /// Extra metadata sent with every request (e.g. an authorization token).
    /// Names are lower-cased; `-bin` (binary) keys are not supported.
    pub headers: Vec<(String, String)>,
}

impl std::fmt::Debug for GrpcExporterConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcExporterConfig")
            .field("endpoint", &shown_endpoint(&self.endpoint))
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("compression", &self.compression)
            .field("gzip_level", &self.gzip_level)
            .field("headers", &redacted_headers(&self.headers))
            .finish()
    }
}

/// Header names with their values replaced, for `Debug` output.
pub(crate) fn redacted_headers(headers: &[(String, String)]) -> Vec<(&str, &'static str)> {
    headers
        .iter()
        .map(|(name, _)| (name.as_str(), "<redacted>"))
        .collect()
}

impl Default for GrpcExporterConfig {
    fn default() -> Self {
        Self {
            endpoint: "http://127.0.0.1:4317".to_owned(),
            timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            compression: Compression::None,
            gzip_level: DEFAULT_GZIP_LEVEL,
            headers: Vec::new(),
        }
    }
}

/// Exports batches with OTLP/gRPC `TraceService/Export`.
pub struct GrpcExporter {
    endpoint: Endpoint,
    tls: bool,
    metadata: MetadataMap,
    compression: Compression,
    gzip_level: u32,
    /// The compressor, made on the first request when compressing.
    gzip: Option<Gzip>,
    timeout: Duration,
    client: Option<Grpc<FramedRequests>>,
    /// The `Export` method called: the trace service's, or another
    /// signal's ([`crate::logs`]).
    path: &'static str,
}

impl std::fmt::Debug for GrpcExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcExporter")
            .field(
                "endpoint",
                &shown_endpoint(&self.endpoint.uri().to_string()),
            )
            .field("compression", &self.compression)
            .field("gzip_level", &self.gzip_level)
            .field("timeout", &self.timeout)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

impl GrpcExporter {
    /// Validates the configuration. Connects nothing: the connection is made
    /// on the first export. An `https://` endpoint gets the system's roots
    /// and no client certificate; see [`GrpcExporter::new_with_tls`].
    pub fn new(config: GrpcExporterConfig) -> Result<Self, ExportError> {
        Self::new_with_tls(config, None)
    }

    /// Like [`GrpcExporter::new`], with the TLS settings of an `https://`
    /// endpoint (None: the system's roots, no client certificate); TLS
    /// settings with an `http://` endpoint are an error. Checks the TLS
    /// material; its only I/O is reading the system's root certificates for
    /// an `https://` endpoint without a CA of its own.
    pub fn new_with_tls(
        config: GrpcExporterConfig,
        tls: Option<TlsSettings>,
    ) -> Result<Self, ExportError> {
        let endpoint = Self::endpoint(&config, tls.as_ref())?;
        let metadata = metadata_map(&config.headers)?;
        Ok(Self {
            tls: endpoint.uri().scheme_str() == Some("https"),
            endpoint,
            metadata,
            compression: config.compression,
            gzip_level: config.gzip_level.min(9),
            gzip: None,
            timeout: config.timeout,
            client: None,
            path: EXPORT_PATH,
        })
    }

    /// The same exporter calling the `Export` method at `path` (another
    /// signal's service) instead of the trace service's.
    pub(crate) fn with_path(mut self, path: &'static str) -> Self {
        self.path = path;
        self
    }

    /// Builds the tonic endpoint, with TLS for `https`.
    fn endpoint(
        config: &GrpcExporterConfig,
        tls: Option<&TlsSettings>,
    ) -> Result<Endpoint, ExportError> {
        let invalid = |reason: String| ExportError::InvalidEndpoint {
            endpoint: shown_endpoint(&config.endpoint),
            reason,
        };
        let uri: http::Uri = config
            .endpoint
            .parse()
            .map_err(|e: http::uri::InvalidUri| invalid(e.to_string()))?;
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            Some(other) => return Err(invalid(format!("unsupported scheme {other:?}"))),
            None => {
                return Err(invalid(
                    "missing scheme, expected http://host:port or https://host:port".into(),
                ));
            }
        };
        let Some(host) = uri.host().filter(|h| !h.is_empty()).map(str::to_owned) else {
            return Err(invalid("missing host".into()));
        };
        if !https && tls.is_some() {
            return Err(invalid(
                "TLS settings need an https:// endpoint (refusing to send in plaintext)".into(),
            ));
        }
        let mut endpoint = Endpoint::from(uri)
            .connect_timeout(config.connect_timeout)
            .timeout(config.timeout)
            .tcp_nodelay(true);
        if https {
            let tls = ClientTls::new(&tls.cloned().unwrap_or_default(), &host)?;
            endpoint = endpoint
                .tls_config(tls.tonic_config())
                .map_err(|e| ExportError::TlsConfig(error_chain(&e)))?;
        }
        Ok(endpoint)
    }

    fn client(&mut self) -> Grpc<FramedRequests> {
        if let Some(client) = &self.client {
            return client.clone();
        }
        // Requests are compressed by `send` (at the configured level), not
        // by tonic (always level 6, from a copy of the whole request), and
        // framed by the channel's wrapper.
        let channel = FramedRequests::new(self.endpoint.connect_lazy());
        let client = Grpc::new(channel).accept_compressed(CompressionEncoding::Gzip);
        self.client = Some(client.clone());
        client
    }
}

impl SpanExporter for GrpcExporter {
    fn takes_encoded(&self) -> bool {
        true
    }

    fn destination(&self) -> String {
        format!(
            "OTLP/gRPC {}",
            shown_endpoint(&self.endpoint.uri().to_string())
        )
    }

    fn export(&mut self, batch: Arc<ExportBatch>) -> ExportFuture<'_> {
        // The batch is shared with the other sinks and kept for retries:
        // its encoding is made once, and the request is never copied.
        Box::pin(self.send(batch.protobuf_parts()))
    }
}

impl GrpcExporter {
    /// One `Export` call with `body`, an encoded request of the method's
    /// service. The OTLP services' responses share one layout (field 1, a
    /// partial success whose field 1 counts the rejected items), so the
    /// trace response reads every signal's.
    pub(crate) async fn send(&mut self, body: Vec<Bytes>) -> Result<ExportOutcome, ExportError> {
        let mut client = self.client();
        let gzipped = if self.compression == Compression::Gzip {
            let level = self.gzip_level;
            let gzipped = self
                .gzip
                .get_or_insert_with(|| Gzip::new(level))
                .compress(&body);
            if gzipped.is_none() {
                tracing::warn!("gzip failed; the request is sent uncompressed");
            }
            gzipped
        } else {
            None
        };
        let compressed = gzipped.is_some();
        let parts = match gzipped {
            Some(gzipped) => vec![gzipped],
            None => body,
        };
        let mut grpc_request = tonic::Request::new(());
        grpc_request
            .extensions_mut()
            .insert(Message { parts, compressed });
        *grpc_request.metadata_mut() = self.metadata.clone();
        grpc_request.set_timeout(self.timeout);
        let path = PathAndQuery::from_static(self.path);
        let call = async {
            client.ready().await.map_err(|e| {
                tonic::Status::unavailable(format!("OTLP gRPC channel not ready: {e}"))
            })?;
            client.unary(grpc_request, path, EncodedCodec).await
        };
        let response = tokio::time::timeout(self.timeout, call)
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
    }
}

/// The OTLP trace service's `Export` method.
const EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// Codec of the `Export` call whose request is already encoded: the
/// request goes as the [`Message`] extension, which the channel sends
/// ([`crate::framed`]), and the codec writes nothing; the response is
/// decoded with prost.
#[derive(Debug, Clone, Copy, Default)]
struct EncodedCodec;

impl Codec for EncodedCodec {
    type Encode = ();
    type Decode = ExportTraceServiceResponse;
    type Encoder = EncodedCodec;
    type Decoder = EncodedCodec;

    fn encoder(&mut self) -> Self::Encoder {
        EncodedCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        EncodedCodec
    }
}

impl Encoder for EncodedCodec {
    type Item = ();
    type Error = tonic::Status;

    fn encode(&mut self, (): (), _: &mut EncodeBuf<'_>) -> Result<(), Self::Error> {
        Ok(())
    }
}

impl Decoder for EncodedCodec {
    type Item = ExportTraceServiceResponse;
    type Error = tonic::Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Self::Error> {
        ExportTraceServiceResponse::decode(buf)
            .map(Some)
            .map_err(|e| tonic::Status::internal(format!("decode OTLP response: {e}")))
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
        let mut value =
            MetadataValue::try_from(value.as_str()).map_err(|e| invalid(e.to_string()))?;
        // Never HPACK-indexed: values are credentials more often than not.
        value.set_sensitive(true);
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
        for bad in ["127.0.0.1:4317", "ftp://x", "http://"] {
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
