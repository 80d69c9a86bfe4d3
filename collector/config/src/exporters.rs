//! The exporters' settings: OTLP (gRPC, HTTP), file, console, and the OTLP
//! export of the derived metrics.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use crate::listeners::read_pem;
use crate::validated::redacted;
use crate::{ConfigError, positive};

/// The exporters. Any combination may be set.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ExportersConfig {
    /// An OTLP endpoint (Jaeger, Tempo, Langfuse, Phoenix, an OTel Collector).
    pub otlp: Option<OtlpConfig>,
    /// Spans appended to a file as OTLP JSON lines.
    pub file: Option<FileConfig>,
    /// Each finished turn printed as an indented tree.
    pub console: Option<ConsoleConfig>,
    /// The metrics derived from the spans (the histograms of `/metrics`)
    /// pushed to an OTLP endpoint. Off unless set; setting it does not
    /// replace the embedded default of the span exporters.
    pub otlp_metrics: Option<OtlpMetricsConfig>,
    /// Each session written as an ATIF trajectory file (needs the agents'
    /// capture level `content`). Setting it does not replace the embedded
    /// default of the span exporters.
    pub atif: Option<crate::atif::AtifConfig>,
}

/// OTLP transport.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, schemars::JsonSchema, Eq)]
pub enum OtlpProtocol {
    #[serde(rename = "grpc")]
    Grpc,
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
}

/// An OTLP exporter. Its `Debug` output shows header names only.
#[derive(Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OtlpConfig {
    /// `http://host:4317` for gRPC; `http://host:4318` (the `/v1/traces` path
    /// is appended unless present) for HTTP/protobuf. `https://` for TLS
    /// (see `tls`).
    pub endpoint: String,
    /// `grpc` (default) or `http/protobuf`.
    #[serde(default = "default_protocol")]
    pub protocol: OtlpProtocol,
    /// Extra request headers (e.g. `Authorization`).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Timeout of one export request.
    #[serde(default = "default_export_timeout_ms")]
    pub timeout_ms: u64,
    /// `none` or `gzip`.
    #[serde(default)]
    pub compression: CompressionConfig,
    /// gzip level, 1 (fastest) to 9 (smallest); 6 when absent. Only with
    /// `compression: gzip` and `protocol: grpc`.
    #[serde(default)]
    #[schemars(range(min = 1, max = 9))]
    pub compression_level: Option<u32>,
    /// Give up retrying one batch after this long.
    #[serde(default = "default_max_elapsed_secs")]
    pub max_elapsed_secs: u64,
    /// Request headers whose values are read from files at startup (content
    /// with surrounding whitespace trimmed), e.g. a mounted Secret holding
    /// `Basic …` or an API key. Names must differ from those of `headers`.
    #[serde(default)]
    pub header_files: BTreeMap<String, PathBuf>,
    /// TLS settings of an `https://` endpoint. Without them an `https://`
    /// endpoint is verified against the system's root certificates.
    #[serde(default)]
    pub tls: Option<OtlpTlsConfig>,
}

impl std::fmt::Debug for OtlpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtlpConfig")
            .field("endpoint", &self.endpoint)
            .field("protocol", &self.protocol)
            .field("headers", &redacted(self.headers.keys()))
            .field("timeout_ms", &self.timeout_ms)
            .field("compression", &self.compression)
            .field("compression_level", &self.compression_level)
            .field("max_elapsed_secs", &self.max_elapsed_secs)
            .field("header_files", &self.header_files)
            .field("tls", &self.tls)
            .finish()
    }
}

/// TLS to an `https://` OTLP endpoint. PEM files, read at startup.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct OtlpTlsConfig {
    /// CA certificate(s) the backend's certificate must chain to, instead of
    /// the system's roots (a private CA).
    pub ca_file: Option<PathBuf>,
    /// Client certificate chain presented to the backend (mutual TLS), leaf
    /// first; needs `key_file`.
    pub cert_file: Option<PathBuf>,
    /// Private key of the client certificate (PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
    /// Name the backend's certificate must carry when it is not the
    /// endpoint's host (e.g. the endpoint is an IP address).
    pub server_name: Option<String>,
}

impl OtlpConfig {
    /// `headers` and the values of `header_files`, read and checked. Errors
    /// name the key, never a value.
    pub fn all_headers(&self) -> Result<Vec<(String, String)>, ConfigError> {
        self.all_headers_at("exporters.otlp")
    }

    /// As [`OtlpConfig::all_headers`] for this section at `section` (its
    /// key in the file, for the errors).
    pub(crate) fn all_headers_at(
        &self,
        section: &str,
    ) -> Result<Vec<(String, String)>, ConfigError> {
        let mut all: Vec<(String, String)> = self
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (name, path) in &self.header_files {
            let key = format!("{section}.header_files.{name}");
            if self
                .headers
                .keys()
                .any(|other| other.eq_ignore_ascii_case(name))
            {
                return Err(ConfigError::new(
                    key,
                    format!("also set in {section}.headers; set it in one place"),
                ));
            }
            let text =
                crate::files::read_limited_text(&key, path, crate::files::SECRET_FILE_LIMIT)?;
            let value = text.trim();
            if value.is_empty() {
                return Err(ConfigError::new(
                    key,
                    format!("{} is empty", path.display()),
                ));
            }
            all.push((name.clone(), value.to_owned()));
        }
        for (name, value) in &all {
            let key = || {
                if self.header_files.contains_key(name) {
                    format!("{section}.header_files.{name}")
                } else {
                    format!("{section}.headers.{name}")
                }
            };
            check_header(name, value, key)?;
        }
        Ok(all)
    }

    /// The TLS settings of an `https://` endpoint (None for `http://`), the
    /// PEM files read and checked. Errors name the key at fault.
    pub fn tls_settings(&self) -> Result<Option<hermes_exporter::TlsSettings>, ConfigError> {
        tls_settings("exporters.otlp", &self.endpoint, self.tls.as_ref())
    }

    /// Checks this section at `section` (its key in the file): endpoint,
    /// timeout, headers (with those of `header_files` read) and TLS
    /// material; the exporter's settings. Errors name the key at fault.
    pub(crate) fn validate_at(&self, section: &str) -> Result<crate::OtlpExport, ConfigError> {
        check_endpoint(&format!("{section}.endpoint"), &self.endpoint)?;
        positive(&format!("{section}.timeout_ms"), self.timeout_ms)?;
        if self
            .compression_level
            .is_some_and(|level| !(1..=9).contains(&level))
        {
            return Err(ConfigError::new(
                format!("{section}.compression_level"),
                "must be between 1 and 9",
            ));
        }
        let headers = self.all_headers_at(section)?;
        let tls = tls_settings(section, &self.endpoint, self.tls.as_ref())?;
        Ok(crate::OtlpExport::new(self, headers, tls))
    }
}

/// The TLS settings of the exporter at `key` for `endpoint`: None for
/// `http://` (where `tls` is an error), else the PEM files of `tls` read and
/// checked. Errors name the key at fault.
fn tls_settings(
    key: &str,
    endpoint: &str,
    tls: Option<&OtlpTlsConfig>,
) -> Result<Option<hermes_exporter::TlsSettings>, ConfigError> {
    let tls_key = format!("{key}.tls");
    let uri: http::Uri = endpoint.parse().map_err(|e| {
        ConfigError::new(
            format!("{key}.endpoint"),
            format!("`{endpoint}` is not a URL ({e})"),
        )
    })?;
    if uri.scheme_str() != Some("https") {
        if tls.is_some() {
            return Err(ConfigError::new(
                tls_key,
                "TLS settings need an https:// endpoint (nothing is sent in plaintext that was meant to be encrypted)",
            ));
        }
        return Ok(None);
    }
    let tls = tls.cloned().unwrap_or_default();
    let read = |name: &str, path: &Option<PathBuf>| {
        path.as_deref()
            .map(|path| read_pem(&format!("{tls_key}.{name}"), path))
            .transpose()
    };
    let settings = hermes_exporter::TlsSettings {
        ca_pem: read("ca_file", &tls.ca_file)?,
        client_cert_pem: read("cert_file", &tls.cert_file)?,
        client_key_pem: read("key_file", &tls.key_file)?,
        server_name: tls.server_name.clone(),
    };
    settings
        .check(uri.host().unwrap_or_default())
        .map_err(|e| ConfigError::new(tls_key, e.to_string()))?;
    Ok(Some(settings))
}

/// Checks that the exporter endpoint at `key` is an `http://` or
/// `https://` URL with a host.
pub(crate) fn check_endpoint(key: &str, endpoint: &str) -> Result<(), ConfigError> {
    let uri: http::Uri = endpoint
        .parse()
        .map_err(|e| ConfigError::new(key, format!("`{endpoint}` is not a URL ({e})")))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(ConfigError::new(
            key,
            format!("`{endpoint}` must start with http:// or https://"),
        ));
    }
    if uri.host().is_none() {
        return Err(ConfigError::new(key, format!("`{endpoint}` has no host")));
    }
    Ok(())
}

/// Checks that `name: value` can be sent as an HTTP header (or gRPC
/// metadata); the error names the key `key()`, never the value.
fn check_header(name: &str, value: &str, key: impl Fn() -> String) -> Result<(), ConfigError> {
    http::HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| ConfigError::new(key(), "not a valid header name"))?;
    http::HeaderValue::from_str(value)
        .map_err(|_| ConfigError::new(key(), "not a valid header value"))?;
    Ok(())
}

fn default_protocol() -> OtlpProtocol {
    OtlpProtocol::Grpc
}
fn default_export_timeout_ms() -> u64 {
    10_000
}
fn default_max_elapsed_secs() -> u64 {
    30
}

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, schemars::JsonSchema, Eq)]
#[serde(rename_all = "lowercase")]
pub enum CompressionConfig {
    #[default]
    None,
    Gzip,
}

/// The JSON-lines file of the embedded default.
#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// File the spans are appended to: created if missing, in a directory
    /// that must exist; an existing regular file or character device
    /// (`/dev/null`). A directory, FIFO or socket is refused.
    pub path: PathBuf,
}

/// The console tree of the embedded default.
#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ConsoleConfig {
    /// Print finished turns to standard output.
    pub enabled: bool,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        Self { enabled: true }
    }
}

/// OTLP export of the metrics derived from the spans: the same histograms
/// as `/metrics`, with their OpenTelemetry semantic-convention names
/// (`gen_ai.client.token.usage`, `gen_ai.client.operation.duration`,
/// `hermes.tool.duration`, `hermes.turn.duration`), pushed every
/// `interval_ms` and once more at shutdown.
// Its `Debug` output shows header names only.
#[derive(Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OtlpMetricsConfig {
    /// `http://host:4317` for gRPC; `http://host:4318` (the `/v1/metrics`
    /// path is appended unless present) for HTTP/protobuf. `https://` for
    /// TLS (see `tls`).
    pub endpoint: String,
    /// `grpc` (default) or `http/protobuf`.
    #[serde(default = "default_protocol")]
    pub protocol: OtlpProtocol,
    /// Extra request headers (e.g. `Authorization`).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Time between two exports, milliseconds. Default 60000 (the
    /// OpenTelemetry SDK's default).
    #[serde(default = "default_metrics_interval_ms")]
    #[schemars(range(min = 1))]
    pub interval_ms: u64,
    /// Timeout of one export request, milliseconds.
    #[serde(default = "default_export_timeout_ms")]
    #[schemars(range(min = 1))]
    pub timeout_ms: u64,
    /// `none` or `gzip`.
    #[serde(default)]
    pub compression: CompressionConfig,
    /// `cumulative` (default: every export carries the totals since the
    /// start, as Prometheus does) or `delta` (each export carries what was
    /// recorded since the previous one).
    #[serde(default)]
    pub temporality: MetricsTemporality,
    /// TLS settings of an `https://` endpoint, as for `exporters.otlp`.
    /// Without them an `https://` endpoint is verified against the system's
    /// root certificates.
    #[serde(default)]
    pub tls: Option<OtlpTlsConfig>,
}

fn default_metrics_interval_ms() -> u64 {
    60_000
}

/// Aggregation temporality of exported metrics.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MetricsTemporality {
    #[default]
    Cumulative,
    Delta,
}

impl OtlpMetricsConfig {
    /// The TLS settings of an `https://` endpoint (None for `http://`), the
    /// PEM files read and checked. Errors name the key at fault.
    pub fn tls_settings(&self) -> Result<Option<hermes_exporter::TlsSettings>, ConfigError> {
        tls_settings("exporters.otlp_metrics", &self.endpoint, self.tls.as_ref())
    }

    /// Checks what serde cannot: the endpoint, the timers, the headers;
    /// returns the TLS settings (read once).
    pub(crate) fn validate(&self) -> Result<Option<hermes_exporter::TlsSettings>, ConfigError> {
        const KEY: &str = "exporters.otlp_metrics";
        check_endpoint(&format!("{KEY}.endpoint"), &self.endpoint)?;
        let tls = self.tls_settings()?;
        positive(&format!("{KEY}.interval_ms"), self.interval_ms)?;
        positive(&format!("{KEY}.timeout_ms"), self.timeout_ms)?;
        for (name, value) in &self.headers {
            let key = || format!("{KEY}.headers.{name}");
            check_header(name, value, key)?;
        }
        Ok(tls)
    }
}

impl std::fmt::Debug for OtlpMetricsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtlpMetricsConfig")
            .field("endpoint", &self.endpoint)
            .field("protocol", &self.protocol)
            .field("headers", &redacted(self.headers.keys()))
            .field("interval_ms", &self.interval_ms)
            .field("timeout_ms", &self.timeout_ms)
            .field("compression", &self.compression)
            .field("temporality", &self.temporality)
            .field("tls", &self.tls)
            .finish()
    }
}
