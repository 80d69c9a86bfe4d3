//! OTLP/HTTP exporter (binary protobuf encoding).
//!
//! This module owns [`HttpExporter`]: it POSTs each batch, encoded by
//! [`crate::encode`] as an `ExportTraceServiceRequest`, to `{endpoint}/v1/traces` with
//! `Content-Type: application/x-protobuf`, and maps the response status to an
//! [`ExportError`] as the OTLP/HTTP specification says (2xx ok; 429, 502, 503,
//! 504 retryable honouring `Retry-After` seconds; other 4xx not retryable;
//! other 5xx retryable). Response bodies are read up to [`MAX_RESPONSE_BYTES`]
//! only.
//!
//! Client choice: hyper-util's legacy pooled client rather than `reqwest`.
//! hyper, hyper-util's client and its connector are already compiled for
//! tonic's channel, so this exporter adds no crate to the build, whereas
//! `reqwest` would add `url`/`idna` (the ICU tree), `serde_urlencoded` and its
//! own middleware for features we do not use (redirects, cookies, proxies,
//! decompression). OTLP/HTTP needs one POST with fixed headers, a timeout and
//! a bounded body read, which is a few lines on hyper.
//!
//! TLS: an `https://` endpoint goes through a `hyper-rustls` connector
//! (rustls with `ring`, HTTP/1.1 over TLS) verified against the CA of its
//! [`TlsSettings`] or the system's roots, with its client certificate if
//! given (mutual TLS); see [`crate::tls`]. An `http://` endpoint never
//! upgrades nor falls back, and TLS settings with it are refused. Header
//! values are marked sensitive and never appear in `Debug` output or logs.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER, USER_AGENT};
use http::{Method, Request, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::{FixedServerNameResolver, HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use prost::Message;

use crate::error::{ExportError, rpc_status, truncate};
use crate::grpc::redacted_headers;
use crate::sink::{ExportBatch, ExportFuture, ExportOutcome, SpanExporter, shown_endpoint};
use crate::tls::{ClientTls, TlsSettings};

/// The most bytes read from a response body.
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024;

const TRACES_PATH: &str = "/v1/traces";
const PROTOBUF: &str = "application/x-protobuf";

/// Settings of the OTLP/HTTP exporter, filled by the binary from its config.
#[derive(Clone, PartialEq, Eq)]
pub struct HttpExporterConfig {
    /// Base URL, e.g. `http://127.0.0.1:4318` or `https://otlp.example.com`;
    /// `/v1/traces` is appended unless the URL already ends with it.
    pub endpoint: String,
    /// Deadline of one export (connect, send, and reading the response).
    pub timeout: Duration,
    /// Extra headers sent with every request (e.g. an authorization token).
    pub headers: Vec<(String, String)>,
}

impl std::fmt::Debug for HttpExporterConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpExporterConfig")
            .field("endpoint", &shown_endpoint(&self.endpoint))
            .field("timeout", &self.timeout)
            .field("headers", &redacted_headers(&self.headers))
            .finish()
    }
}

impl Default for HttpExporterConfig {
    fn default() -> Self {
        Self {
            endpoint: "http://127.0.0.1:4318".to_owned(),
            timeout: Duration::from_secs(10),
            headers: Vec::new(),
        }
    }
}

/// Exports batches with OTLP/HTTP, binary protobuf.
pub struct HttpExporter {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    uri: Uri,
    headers: HeaderMap,
    timeout: Duration,
}

impl std::fmt::Debug for HttpExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpExporter")
            .field("uri", &shown_endpoint(&self.uri.to_string()))
            .field("timeout", &self.timeout)
            .field("tls", &(self.uri.scheme_str() == Some("https")))
            .finish_non_exhaustive()
    }
}

/// The connector of an OTLP/HTTP client for `uri`: rustls for `https://`
/// (with `tls`, or the system's roots), plain TCP for `http://` (where `tls`
/// is an error: nothing meant to be encrypted is sent in plaintext). Also
/// used for the OTLP metrics exporter's client.
pub fn https_connector(
    uri: &Uri,
    tls: Option<TlsSettings>,
    connect_timeout: Duration,
) -> Result<HttpsConnector<HttpConnector>, ExportError> {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(connect_timeout));
    connector.set_nodelay(true);
    // The TLS connector hands `https` URIs to rustls; `http` ones need
    // the plain connector to accept them.
    connector.enforce_http(false);
    if uri.scheme_str() == Some("https") {
        let host = uri.host().unwrap_or_default();
        let tls = ClientTls::new(&tls.unwrap_or_default(), host)?;
        return Ok(HttpsConnectorBuilder::new()
            .with_tls_config(tls.rustls_config()?)
            .https_only()
            .with_server_name_resolver(FixedServerNameResolver::new(tls.server_name().clone()))
            .enable_http1()
            .wrap_connector(connector));
    }
    if tls.is_some() {
        return Err(ExportError::InvalidEndpoint {
            endpoint: shown_endpoint(&uri.to_string()),
            reason: "TLS settings need an https:// endpoint (refusing to send in plaintext)".into(),
        });
    }
    // The URI is `http://`: this TLS configuration is never used.
    Ok(HttpsConnectorBuilder::new()
        .with_tls_config(
            rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .map_err(|e| ExportError::TlsConfig(e.to_string()))?
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth(),
        )
        .https_or_http()
        .enable_http1()
        .wrap_connector(connector))
}

impl HttpExporter {
    /// Validates the configuration and builds the (lazily connecting) client.
    /// An `https://` endpoint gets the system's roots and no client
    /// certificate; see [`HttpExporter::new_with_tls`].
    pub fn new(config: HttpExporterConfig) -> Result<Self, ExportError> {
        Self::new_with_tls(config, None)
    }

    /// Like [`HttpExporter::new`], with the TLS settings of an `https://`
    /// endpoint (None: the system's roots, no client certificate); TLS
    /// settings with an `http://` endpoint are an error. Checks the TLS
    /// material; its only I/O is reading the system's root certificates for
    /// an `https://` endpoint without a CA of its own.
    pub fn new_with_tls(
        config: HttpExporterConfig,
        tls: Option<TlsSettings>,
    ) -> Result<Self, ExportError> {
        Self::for_path(config, tls, TRACES_PATH)
    }

    /// Like [`HttpExporter::new_with_tls`], posting to `{endpoint}{path}`
    /// (another signal's path, for [`crate::logs`]) unless the endpoint
    /// already ends with `path`.
    pub(crate) fn for_path(
        config: HttpExporterConfig,
        tls: Option<TlsSettings>,
        path: &str,
    ) -> Result<Self, ExportError> {
        let uri = signal_uri(&config.endpoint, path)?;
        let headers = header_map(&config.headers)?;
        let connector = https_connector(&uri, tls, config.timeout)?;
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .build(connector);
        Ok(Self {
            client,
            uri,
            headers,
            timeout: config.timeout,
        })
    }

    /// The full URL requests are sent to.
    pub fn uri(&self) -> &Uri {
        &self.uri
    }

    /// One POST of `body`, an encoded request of the signal posted to,
    /// within the timeout. The OTLP services' responses share one layout
    /// (field 1, a partial success whose field 1 counts the rejected
    /// items), so the trace response reads every signal's.
    pub(crate) async fn post(&self, body: Bytes) -> Result<ExportOutcome, ExportError> {
        tokio::time::timeout(self.timeout, self.send(body))
            .await
            .map_err(|_| ExportError::Timeout(self.timeout))?
    }

    async fn send(&self, body: Bytes) -> Result<ExportOutcome, ExportError> {
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = self.uri.clone();
        *request.headers_mut() = self.headers.clone();

        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| ExportError::from_http_transport(Box::new(e)))?;
        let status = response.status();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let body = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map(|collected| collected.to_bytes());

        if status.is_success() {
            // The body is an ExportTraceServiceResponse; only its partial
            // success matters. An unreadable body is not a failed export.
            let rejected_spans = body
                .ok()
                .and_then(|b| ExportTraceServiceResponse::decode(b).ok())
                .and_then(|r| r.partial_success)
                .map(|p| u64::try_from(p.rejected_spans).unwrap_or(0))
                .unwrap_or(0);
            return Ok(ExportOutcome { rejected_spans });
        }
        let message = match &body {
            Ok(bytes) => rpc_status::message(bytes)
                .unwrap_or_else(|| String::from_utf8_lossy(bytes).into_owned()),
            Err(_) => String::new(),
        };
        Err(ExportError::HttpStatus {
            status: status.as_u16(),
            retry_after,
            message: truncate(message.trim(), 256),
        })
    }
}

impl SpanExporter for HttpExporter {
    fn takes_encoded(&self) -> bool {
        true
    }

    fn destination(&self) -> String {
        format!(
            "OTLP/HTTP protobuf POST {}",
            shown_endpoint(&self.uri.to_string())
        )
    }

    fn export(&mut self, batch: Arc<ExportBatch>) -> ExportFuture<'_> {
        Box::pin(self.post(batch.protobuf().clone()))
    }
}

/// `{endpoint}{path}` (`/v1/traces`, `/v1/logs`), or `endpoint` itself
/// when it already ends so.
fn signal_uri(endpoint: &str, path: &str) -> Result<Uri, ExportError> {
    let invalid = |reason: String| ExportError::InvalidEndpoint {
        endpoint: shown_endpoint(endpoint),
        reason,
    };
    let trimmed = endpoint.trim_end_matches('/');
    let full = if trimmed.ends_with(path) {
        trimmed.to_owned()
    } else {
        format!("{trimmed}{path}")
    };
    let uri: Uri = full
        .parse()
        .map_err(|e: http::uri::InvalidUri| invalid(e.to_string()))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        Some(other) => return Err(invalid(format!("unsupported scheme {other:?}"))),
        None => {
            return Err(invalid(
                "missing scheme, expected http://host:port or https://host:port".into(),
            ));
        }
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(invalid("missing host".into()));
    }
    Ok(uri)
}

fn header_map(headers: &[(String, String)]) -> Result<HeaderMap, ExportError> {
    let mut map = HeaderMap::new();
    map.insert(CONTENT_TYPE, HeaderValue::from_static(PROTOBUF));
    map.insert(
        USER_AGENT,
        HeaderValue::from_static(concat!("hermes-exporter/", env!("CARGO_PKG_VERSION"))),
    );
    for (name, value) in headers {
        let invalid = |reason: String| ExportError::InvalidHeader {
            name: name.clone(),
            reason,
        };
        let key = HeaderName::from_bytes(name.as_bytes()).map_err(|e| invalid(e.to_string()))?;
        if key == CONTENT_TYPE {
            return Err(invalid("Content-Type is fixed by the exporter".into()));
        }
        let mut value = HeaderValue::from_str(value).map_err(|e| invalid(e.to_string()))?;
        value.set_sensitive(true);
        if key == USER_AGENT {
            map.insert(key, value);
        } else {
            map.append(key, value);
        }
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_traces_path_once() {
        let uri = |e: &str| signal_uri(e, TRACES_PATH).map(|u| u.to_string());
        for (endpoint, traces) in [
            ("http://127.0.0.1:4318", "http://127.0.0.1:4318/v1/traces"),
            ("http://127.0.0.1:4318/", "http://127.0.0.1:4318/v1/traces"),
            (
                "http://h:4318/otlp/v1/traces",
                "http://h:4318/otlp/v1/traces",
            ),
            ("http://h:4318/otlp", "http://h:4318/otlp/v1/traces"),
            ("https://h/otlp", "https://h/otlp/v1/traces"),
        ] {
            assert_eq!(uri(endpoint).ok().as_deref(), Some(traces), "{endpoint}");
        }
        assert_eq!(
            signal_uri("http://h:4318/", "/v1/logs")
                .map(|u| u.to_string())
                .ok()
                .as_deref(),
            Some("http://h:4318/v1/logs")
        );
        assert!(uri("h:4318").is_err());
        assert!(uri("not a url").is_err());
    }

    #[test]
    fn validates_headers() {
        assert!(header_map(&[("x-api-key".into(), "k".into())]).is_ok());
        assert!(header_map(&[("bad name".into(), "k".into())]).is_err());
        assert!(header_map(&[("x".into(), "a\nb".into())]).is_err());
        assert!(header_map(&[("content-type".into(), "text/plain".into())]).is_err());
    }
}
