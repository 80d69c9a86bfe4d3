//! The collector's configuration: one YAML file (every key documented in
//! `config/collector.yaml`), a few CLI overrides, and validation that runs
//! before any port is bound.
//!
//! Parsing is pure (no I/O besides reading the file named on the command
//! line). Validation reads only what the collector needs before it binds:
//! the ingest bearer token (its file or environment variable), the TLS
//! files, and the directory of a Unix socket. Unknown keys are errors. Every error names the
//! key path, and the binary exits with code 64 (`EX_USAGE`) on it. The token
//! itself is never part of an error or of the configuration's `Debug`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use hermes_receiver::{BearerToken, ListenAddr};
use serde::Deserialize;

pub use crate::interpolate::Interpolated;

/// Exit code for bad configuration or usage (`EX_USAGE` of sysexits.h).
pub const EXIT_CONFIG: i32 = 64;

/// What errors about the configuration file itself name.
pub const CONFIG_KEY: &str = "--config";

/// A configuration error, naming the offending key path.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration at `{path}`: {reason}")]
pub struct ConfigError {
    /// Dotted key path (`exporters.otlp.endpoint`), `--config` for the
    /// file itself, or `line N` before the file is parsed.
    pub path: String,
    pub reason: String,
}

impl ConfigError {
    pub(crate) fn new(path: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            reason: reason.into(),
        }
    }

    /// Replaces each value of `used` in the message by `${variable}` (see
    /// [`Interpolated::conceal`]).
    fn conceal(mut self, used: &Interpolated) -> Self {
        self.path = used.conceal(&self.path);
        self.reason = used.conceal(&self.reason);
        self
    }
}

/// Root of the configuration file.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where shims connect.
    pub receiver: ReceiverConfig,
    /// Health probes and Prometheus metrics over HTTP.
    pub admin: AdminConfig,
    /// Bounds of the labels of the metrics derived from the spans (on
    /// `/metrics` and `exporters.otlp_metrics`).
    pub metrics: MetricsConfig,
    /// Correlation limits and timers.
    pub correlator: CorrelatorConfig,
    /// Batching in front of the exporters.
    pub batch: BatchConfig,
    /// What every span goes through before export: extra attribute sets
    /// (OpenInference, Langfuse), redaction, truncation.
    #[schemars(with = "ProcessingSchema")]
    pub processing: hermes_processor::ProcessorConfig,
    /// Where spans go. With none configured, the embedded default runs: spans
    /// appended to a JSON-lines file and each finished turn printed.
    pub exporters: ExportersConfig,
    /// When a batch is acknowledged to its shim, and the persistent queue.
    pub queue: QueueConfig,
    /// Shutdown behaviour.
    pub shutdown: ShutdownConfig,
    /// The async runtime's threads.
    pub runtime: RuntimeConfig,
    /// The collector's own logs.
    pub log: LogConfig,
    /// The values `${VAR}` references took, for [`Config::shown`]; not a
    /// key of the file.
    #[serde(skip)]
    #[schemars(skip)]
    pub interpolated: Interpolated,
}

/// The gRPC ingest listener.
#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ReceiverConfig {
    /// Address of the gRPC ingest (shims' `HERMES_COLLECTOR_ENDPOINT`):
    /// `host:port`, or `unix:/path/to/socket` for a Unix domain socket
    /// (created with mode 0600, a stale one replaced, removed at shutdown).
    pub listen: String,
    /// Largest accepted message, bytes.
    #[schemars(range(min = 1))]
    pub max_message_bytes: usize,
    /// Most events in one batch.
    #[schemars(range(min = 1))]
    pub max_events_per_batch: usize,
    /// Capacity of the channel from the receiver to the correlator, batches.
    /// When full, the receiver stops reading (backpressure to the shims).
    #[schemars(range(min = 1))]
    pub queue_batches: usize,
    /// Resident memory (MiB) above which new batches are refused with
    /// `UNAVAILABLE` (the shims keep them and resend); 0 disables the limit.
    pub memory_limit_mib: u64,
    /// Concurrent ingest streams on one connection (a shim uses one, plus
    /// one per spool file it replays); more wait for a free one.
    #[schemars(range(min = 1))]
    pub max_streams_per_connection: u32,
    /// Largest accepted event (its encoded protobuf size), bytes. A batch
    /// with a larger event is refused with `RESOURCE_EXHAUSTED`.
    #[schemars(range(min = 1))]
    pub max_event_bytes: usize,
    /// Events per second one ingest stream (one shim) may send on average.
    /// Past it (and past the burst) the receiver delays reading that stream,
    /// so its shim buffers; other streams are not affected.
    #[schemars(range(min = 1))]
    pub stream_events_per_sec: u64,
    /// Events one stream may send at once above its rate (token bucket).
    #[schemars(range(min = 1))]
    pub stream_burst_events: u64,
    /// Ingest connections open at once; one more is accepted and closed at
    /// once. Keep it below the process' open-file limit (the collector
    /// raises its soft limit to the hard one at start).
    #[schemars(range(min = 1))]
    pub max_connections: usize,
    /// Milliseconds a new connection may take to open an ingest stream that
    /// passes the token check (TLS handshake and HTTP/2 preface included);
    /// then it is closed.
    #[schemars(range(min = 1))]
    pub handshake_timeout_ms: u64,
    /// Seconds a connection may stay without an open ingest stream; then it
    /// is closed. A shim keeps its stream open while it runs.
    #[schemars(range(min = 1))]
    pub idle_timeout_secs: u64,
    /// Bearer token the shims must present. None by default.
    pub auth: AuthConfig,
    /// TLS on the ingest listener, mutual with `client_ca_file`. None by
    /// default (plaintext HTTP/2).
    pub tls: Option<TlsConfig>,
}

/// TLS on the ingest listener. The files are read at startup.
#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate chain the collector presents, leaf first.
    pub cert_file: PathBuf,
    /// PEM private key of that certificate (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// PEM CA certificate(s) that client certificates must chain to: with
    /// it, a client without such a certificate cannot connect (mutual TLS).
    #[serde(default)]
    pub client_ca_file: Option<PathBuf>,
}

impl TlsConfig {
    /// Reads the files and builds the server's TLS settings, checked. Errors
    /// name the key of the file at fault (or `receiver.tls` when the pieces
    /// do not fit together); they never contain the key.
    pub fn server_config(&self) -> Result<tonic::transport::ServerTlsConfig, ConfigError> {
        let pem = hermes_receiver::TlsPem {
            cert: read_pem("receiver.tls.cert_file", &self.cert_file)?,
            key: read_pem("receiver.tls.key_file", &self.key_file)?,
            client_ca: self
                .client_ca_file
                .as_deref()
                .map(|path| read_pem("receiver.tls.client_ca_file", path))
                .transpose()?,
        };
        pem.server_config()
            .map_err(|e| ConfigError::new("receiver.tls", e.to_string()))
    }
}

/// Reads a file that must hold at least one PEM block.
fn read_pem(key: &str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    let bytes = crate::files::read_limited(key, path, crate::files::SECRET_FILE_LIMIT)?;
    if !bytes.windows(11).any(|w| w == b"-----BEGIN ") {
        return Err(ConfigError::new(
            key,
            format!("{} holds no PEM block", path.display()),
        ));
    }
    Ok(bytes)
}

/// Where the ingest's bearer token comes from: at most one of the two. With
/// neither, every stream call is accepted.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// File whose content, surrounding whitespace trimmed, is the token
    /// (e.g. a mounted Kubernetes Secret). Read once at startup.
    pub token_file: Option<PathBuf>,
    /// Name of the environment variable holding the token.
    pub token_env: Option<String>,
}

impl AuthConfig {
    /// Reads the ingest token (`receiver.auth`), if one is configured; see
    /// [`AuthConfig::token_at`].
    pub fn token(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<BearerToken>, ConfigError> {
        self.token_at("receiver.auth", env)
    }

    /// Reads the token of the section at `key`, if one is configured,
    /// looking environment variables up through `env`. Errors name the key;
    /// they never contain the token.
    pub fn token_at(
        &self,
        key: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<BearerToken>, ConfigError> {
        match (&self.token_file, &self.token_env) {
            (None, None) => Ok(None),
            (Some(_), Some(_)) => Err(ConfigError::new(
                key,
                "set token_file or token_env, not both",
            )),
            (Some(path), None) => {
                let key = format!("{key}.token_file");
                let text =
                    crate::files::read_limited_text(&key, path, crate::files::SECRET_FILE_LIMIT)?;
                BearerToken::new(&text)
                    .map(Some)
                    .map_err(|e| ConfigError::new(&key, format!("{}: {e}", path.display())))
            }
            (None, Some(name)) => {
                let key = format!("{key}.token_env");
                let text = env(name).ok_or_else(|| {
                    ConfigError::new(&key, format!("the environment variable {name} is not set"))
                })?;
                BearerToken::new(&text)
                    .map(Some)
                    .map_err(|e| ConfigError::new(&key, format!("{name}: {e}")))
            }
        }
    }
}

impl Default for ReceiverConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:4319".to_owned(),
            max_message_bytes: 16 * 1024 * 1024,
            max_events_per_batch: 8192,
            queue_batches: 16,
            memory_limit_mib: 512,
            max_streams_per_connection: 8,
            max_event_bytes: 1024 * 1024,
            stream_events_per_sec: 20_000,
            stream_burst_events: 40_000,
            max_connections: 4096,
            handshake_timeout_ms: 10_000,
            idle_timeout_secs: 300,
            auth: AuthConfig::default(),
            tls: None,
        }
    }
}

/// The admin HTTP server: `GET /livez`, `/readyz`, `/metrics`.
#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Address of the admin server. Use `0.0.0.0:13133` in containers so
    /// the kubelet's probes reach it.
    pub listen: String,
    /// Bearer token a scrape of `/metrics` must present (`Authorization:
    /// Bearer <token>`), from a file or an environment variable, as
    /// `receiver.auth`; a scrape without it gets 401. None by default.
    /// `/livez` and `/readyz` stay open for the probes.
    pub metrics_auth: AuthConfig,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:13133".to_owned(),
            metrics_auth: AuthConfig::default(),
        }
    }
}

/// Bounds of the derived metrics' labels. Their values come from the agents
/// (tool names, models, providers, error types, tool statuses); these keep
/// `/metrics`, the OTLP metrics and the collector's memory bounded whatever
/// the agents send. Values past a bound are recorded as `other` and counted
/// (`hermes_collector_metrics_label_overflows_total`).
#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Longest label value, bytes; longer ones are cut (on a UTF-8
    /// character boundary).
    #[schemars(range(min = 1, max = MAX_LABEL_VALUE_BYTES))]
    pub max_label_value_bytes: usize,
    /// Most distinct values of one label of one metric; further values are
    /// recorded as `other`.
    #[schemars(range(min = 1, max = MAX_LABEL_VALUES))]
    pub max_label_values: usize,
    /// Most label sets (series) of one metric; further ones are recorded in
    /// one series whose labels are all `other` (over OTLP: the attribute
    /// `otel.metric.overflow=true`, the SDK's cardinality limit).
    #[schemars(range(min = 1, max = MAX_SERIES))]
    pub max_series: usize,
}

/// Upper bounds of [`MetricsConfig`]: beyond them `/metrics` could reach
/// hundreds of megabytes.
const MAX_LABEL_VALUE_BYTES: usize = 1024;
const MAX_LABEL_VALUES: usize = 10_000;
const MAX_SERIES: usize = 10_000;

impl Default for MetricsConfig {
    fn default() -> Self {
        let bounds = crate::label_bounds::Bounds::default();
        Self {
            max_label_value_bytes: bounds.max_value_bytes,
            max_label_values: bounds.max_values,
            max_series: bounds.max_series,
        }
    }
}

impl MetricsConfig {
    /// The bounds the derived metrics apply.
    pub fn bounds(&self) -> crate::label_bounds::Bounds {
        crate::label_bounds::Bounds {
            max_value_bytes: self.max_label_value_bytes,
            max_values: self.max_label_values,
            max_series: self.max_series,
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        for (key, value, max) in [
            (
                "metrics.max_label_value_bytes",
                self.max_label_value_bytes,
                MAX_LABEL_VALUE_BYTES,
            ),
            (
                "metrics.max_label_values",
                self.max_label_values,
                MAX_LABEL_VALUES,
            ),
            ("metrics.max_series", self.max_series, MAX_SERIES),
        ] {
            if !(1..=max).contains(&value) {
                return Err(ConfigError::new(
                    key,
                    format!("must be between 1 and {max}"),
                ));
            }
        }
        Ok(())
    }
}

/// Limits and timers of the correlator.
#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CorrelatorConfig {
    /// Most turns open at once; the oldest is closed as incomplete past it.
    #[schemars(range(min = 1))]
    pub max_open_turns: usize,
    /// Most turns open at once for one agent process (shim instance); its
    /// oldest is closed as incomplete past it, never another agent's.
    #[schemars(range(min = 1))]
    pub max_open_turns_per_agent: usize,
    /// Most session records (session starts waiting for their first turn,
    /// subagent links) of one agent process; its oldest is forgotten past it.
    #[schemars(range(min = 1))]
    pub max_sessions_per_agent: usize,
    /// Most session records in all; past it, the oldest of the agent holding
    /// the most is forgotten.
    #[schemars(range(min = 1))]
    pub max_sessions: usize,
    /// Approximate bytes of open state (ids, captured content, span events)
    /// one agent process may hold; past it, its oldest turn is closed as
    /// incomplete.
    #[schemars(range(min = 1))]
    pub max_bytes_per_agent: usize,
    /// Approximate bytes of open state in all; past it, the oldest turn of
    /// the agent holding the most is closed as incomplete.
    #[schemars(range(min = 1))]
    pub max_bytes: usize,
    /// Open state with no event for this long is closed as incomplete.
    #[schemars(range(min = 1))]
    pub state_ttl_secs: u64,
    /// Wait after `post_llm_call` for the turn's `on_session_end`.
    pub turn_end_grace_ms: u64,
    /// How often timers are checked.
    #[schemars(range(min = 1))]
    pub tick_ms: u64,
    /// How long to wait for a missing event of a shim's stream (events that
    /// arrived after it are held) before giving up on it.
    #[schemars(range(min = 1))]
    pub gap_timeout_ms: u64,
}

impl Default for CorrelatorConfig {
    fn default() -> Self {
        Self {
            max_open_turns: 10_000,
            max_open_turns_per_agent: 1_000,
            max_sessions_per_agent: 1_000,
            max_sessions: 10_000,
            max_bytes_per_agent: 64 << 20,
            max_bytes: 256 << 20,
            state_ttl_secs: 3600,
            turn_end_grace_ms: 2000,
            tick_ms: 500,
            gap_timeout_ms: 5000,
        }
    }
}

/// Batching of finished spans before export.
#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct BatchConfig {
    /// Most spans in one export request.
    #[schemars(range(min = 1))]
    pub max_spans: usize,
    /// Most encoded bytes in one export request (approximately); keep it under
    /// the backend's limit (4 MiB for most OTLP/gRPC servers).
    #[schemars(range(min = 1))]
    pub max_bytes: usize,
    /// Longest a finished span waits for its batch to fill.
    pub timeout_ms: u64,
    /// Capacity of the channel from the correlator to the exporters, in
    /// groups of spans. When full, the correlator waits (backpressure).
    pub queue: usize,
}

impl Default for BatchConfig {
    fn default() -> Self {
        Self {
            max_spans: 512,
            max_bytes: 3 * 1024 * 1024,
            timeout_ms: 200,
            queue: 64,
        }
    }
}

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
        // Header values are credentials more often than not.
        let headers: BTreeMap<&str, &str> = self
            .headers
            .keys()
            .map(|name| (name.as_str(), "<redacted>"))
            .collect();
        f.debug_struct("OtlpConfig")
            .field("endpoint", &self.endpoint)
            .field("protocol", &self.protocol)
            .field("headers", &headers)
            .field("timeout_ms", &self.timeout_ms)
            .field("compression", &self.compression)
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
        let mut all: Vec<(String, String)> = self
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (name, path) in &self.header_files {
            let key = format!("exporters.otlp.header_files.{name}");
            if self
                .headers
                .keys()
                .any(|other| other.eq_ignore_ascii_case(name))
            {
                return Err(ConfigError::new(
                    key,
                    "also set in exporters.otlp.headers; set it in one place",
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
                    format!("exporters.otlp.header_files.{name}")
                } else {
                    format!("exporters.otlp.headers.{name}")
                }
            };
            http::HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| ConfigError::new(key(), "not a valid header name"))?;
            http::HeaderValue::from_str(value)
                .map_err(|_| ConfigError::new(key(), "not a valid header value"))?;
        }
        Ok(all)
    }

    /// The TLS settings of an `https://` endpoint (None for `http://`), the
    /// PEM files read and checked. Errors name the key at fault.
    pub fn tls_settings(&self) -> Result<Option<hermes_exporter::TlsSettings>, ConfigError> {
        tls_settings("exporters.otlp", &self.endpoint, self.tls.as_ref())
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

/// Where acknowledged batches live until their spans are exported.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum QueueKind {
    /// Acknowledged once in the pipeline's bounded memory queue; lost if the
    /// process dies (SIGTERM still drains them).
    #[default]
    Memory,
    /// Acknowledged once written to the persistent queue in `dir`; kept
    /// until exported, replayed after a crash or restart.
    Disk,
}

/// The acknowledgement policy and the persistent queue.
#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct QueueConfig {
    pub kind: QueueKind,
    /// Directory of the persistent queue (`kind: disk`); created if missing.
    pub dir: PathBuf,
    /// Payload bytes the persistent queue may hold; when full, the receiver
    /// stops reading (the shims buffer) until exports free room.
    pub max_bytes: u64,
    /// 0: every write is fsynced before its batches are acknowledged.
    /// Above 0: acknowledged after the write, fsynced at most this long
    /// later (a power loss may lose that much; a process crash loses
    /// nothing).
    pub fsync_interval_ms: u64,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            kind: QueueKind::Memory,
            dir: PathBuf::from("/var/lib/hermes-collector/queue"),
            max_bytes: 256 * 1024 * 1024,
            fsync_interval_ms: 0,
        }
    }
}

/// Shutdown on SIGTERM/SIGINT.
#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ShutdownConfig {
    /// Longest the drain may take before the process exits, logging what is
    /// left. Keep it below Kubernetes' `terminationGracePeriodSeconds` (30 s).
    #[schemars(range(max = 29999))]
    pub grace_ms: u64,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        Self { grace_ms: 20_000 }
    }
}

/// Most worker threads `runtime.worker_threads` accepts.
pub const MAX_WORKER_THREADS: usize = 256;

/// The async runtime that runs every stage (receiver, correlation,
/// exporters, admin server).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// Worker threads; 0: one per CPU the process may use (a cgroup CPU
    /// quota counts), or `TOKIO_WORKER_THREADS` when set. A sidecar beside
    /// one agent needs 1: one thread spends the least CPU per event (the
    /// stages hand data over without waking another thread, and memory is
    /// freed by the thread that allocated it; docs/BENCHMARKS.md).
    #[schemars(range(max = MAX_WORKER_THREADS))]
    pub worker_threads: usize,
}

/// The collector's own logs (to standard error).
#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `error`, `warn`, `info`, `debug`, `trace`, or an `EnvFilter` directive.
    /// `RUST_LOG` overrides it.
    pub level: String,
    /// `text` or `json`.
    pub format: LogFormat,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            level: "info".to_owned(),
            format: LogFormat::Text,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, schemars::JsonSchema, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl ReceiverConfig {
    /// `listen`, parsed.
    pub fn listen_addr(&self) -> Result<ListenAddr, ConfigError> {
        self.listen
            .parse::<ListenAddr>()
            .map_err(|e| ConfigError::new("receiver.listen", e.to_string()))
    }
}

/// File name of the embedded default's span file.
pub const DEFAULT_SPAN_FILE: &str = "hermes-spans.jsonl";

impl Config {
    /// Parses YAML text and validates it.
    #[cfg(test)]
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let config = Self::parse_yaml(text)?;
        config.validate()?;
        Ok(config)
    }

    /// Parses YAML text without validating it. Text nested deeper than
    /// [`crate::yaml_depth::MAX_DEPTH`] is refused before the parser sees it.
    fn parse_yaml(text: &str) -> Result<Self, ConfigError> {
        crate::yaml_depth::check(text, crate::yaml_depth::MAX_DEPTH)?;
        let config: Config = if text.trim().is_empty() {
            Config::default()
        } else {
            let de = serde_yaml::Deserializer::from_str(text);
            serde_path_to_error::deserialize(de).map_err(|e| {
                let path = e.path().to_string();
                // serde quotes the value at fault: a whole file, at worst.
                let inner = cut(&e.into_inner().to_string(), 512);
                ConfigError::new(
                    if path == "." {
                        "<root>".to_owned()
                    } else {
                        path
                    },
                    inner,
                )
            })?
        };
        Ok(config)
    }

    /// Reads a file, replaces `${VAR}`/`${VAR:-default}` from the
    /// environment, then parses and validates it.
    pub fn from_file(path: &std::path::Path) -> Result<Self, ConfigError> {
        let text =
            crate::files::read_limited_text(CONFIG_KEY, path, crate::files::CONFIG_FILE_LIMIT)?;
        Self::from_text(&text, &|name| std::env::var(name).ok())
    }

    /// Replaces `${VAR}`/`${VAR:-default}` through `env`, then parses and
    /// validates. An error never shows a value taken from the environment
    /// (a token written into the wrong key, say): it names the variable.
    pub fn from_text(
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let mut used = Interpolated::default();
        let text = crate::interpolate::interpolate_with(text, env, &mut used)?;
        let mut config = Self::parse_yaml(&text).map_err(|e| e.conceal(&used))?;
        config.validate_with(env).map_err(|e| e.conceal(&used))?;
        config.interpolated = used;
        Ok(config)
    }

    /// `text` (a configured value, or a message holding one) as the log
    /// may show it: each value a `${VAR}` reference took is written as that
    /// reference again.
    pub fn shown(&self, text: &str) -> String {
        self.interpolated.conceal(text)
    }

    /// The span file written: `exporters.file.path`, or the embedded
    /// default's.
    pub fn span_file(&self) -> Option<PathBuf> {
        match (&self.exporters.file, self.is_embedded_default()) {
            (Some(file), _) => Some(file.path.clone()),
            (None, true) => Some(PathBuf::from(DEFAULT_SPAN_FILE)),
            (None, false) => None,
        }
    }

    /// Whether no exporter is configured (the embedded default runs).
    pub fn is_embedded_default(&self) -> bool {
        self.exporters.otlp.is_none()
            && self.exporters.file.is_none()
            && self.exporters.console.is_none()
    }

    /// Checks values serde cannot check, with the process environment.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_with(&|name| std::env::var(name).ok())
            .map_err(|e| e.conceal(&self.interpolated))
    }

    /// Checks values serde cannot check. Its only I/O: reading the bearer
    /// token (environment variables through `env`), the TLS files (and the
    /// system's root certificates for an `https://` exporter without a CA),
    /// the exporter's header files, and looking for the directory of a Unix
    /// socket.
    pub fn validate_with(&self, env: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        if self.queue.kind == QueueKind::Disk {
            positive("queue.max_bytes", self.queue.max_bytes)?;
            if self.queue.dir.as_os_str().is_empty() {
                return Err(ConfigError::new("queue.dir", "must not be empty"));
            }
            if self.queue.dir.exists() && !self.queue.dir.is_dir() {
                return Err(ConfigError::new(
                    "queue.dir",
                    format!("{} exists and is not a directory", self.queue.dir.display()),
                ));
            }
        }
        let listen = self.receiver.listen_addr()?;
        if let ListenAddr::Unix(path) = &listen {
            let dir = match path.parent() {
                Some(dir) if !dir.as_os_str().is_empty() => dir,
                _ => Path::new("."),
            };
            if !dir.is_dir() {
                return Err(ConfigError::new(
                    "receiver.listen",
                    format!(
                        "the directory {} of the socket does not exist",
                        dir.display()
                    ),
                ));
            }
        }
        self.receiver.auth.token(env)?;
        if let Some(tls) = &self.receiver.tls {
            tls.server_config()?;
        }
        let admin = self.admin.listen.parse::<SocketAddr>().map_err(|e| {
            ConfigError::new(
                "admin.listen",
                format!("`{}` is not host:port ({e})", self.admin.listen),
            )
        })?;
        if let ListenAddr::Tcp(ingest) = &listen
            && crate::config_checks::listens_clash(*ingest, admin)
        {
            return Err(ConfigError::new(
                "admin.listen",
                format!(
                    "`{}` takes the port of receiver.listen (`{}`); the admin server needs a port of its own",
                    self.admin.listen, self.receiver.listen
                ),
            ));
        }
        self.admin
            .metrics_auth
            .token_at("admin.metrics_auth", env)?;
        self.metrics.validate()?;
        positive(
            "receiver.max_message_bytes",
            self.receiver.max_message_bytes as u64,
        )?;
        positive(
            "receiver.max_events_per_batch",
            self.receiver.max_events_per_batch as u64,
        )?;
        positive("receiver.queue_batches", self.receiver.queue_batches as u64)?;
        positive(
            "receiver.max_streams_per_connection",
            u64::from(self.receiver.max_streams_per_connection),
        )?;
        positive(
            "receiver.max_event_bytes",
            self.receiver.max_event_bytes as u64,
        )?;
        positive(
            "receiver.stream_events_per_sec",
            self.receiver.stream_events_per_sec,
        )?;
        positive(
            "receiver.stream_burst_events",
            self.receiver.stream_burst_events,
        )?;
        positive(
            "receiver.max_connections",
            self.receiver.max_connections as u64,
        )?;
        positive(
            "receiver.handshake_timeout_ms",
            self.receiver.handshake_timeout_ms,
        )?;
        positive(
            "receiver.idle_timeout_secs",
            self.receiver.idle_timeout_secs,
        )?;
        positive(
            "correlator.max_open_turns_per_agent",
            self.correlator.max_open_turns_per_agent as u64,
        )?;
        positive(
            "correlator.max_open_turns",
            self.correlator.max_open_turns as u64,
        )?;
        positive(
            "correlator.max_sessions_per_agent",
            self.correlator.max_sessions_per_agent as u64,
        )?;
        positive(
            "correlator.max_sessions",
            self.correlator.max_sessions as u64,
        )?;
        positive(
            "correlator.max_bytes_per_agent",
            self.correlator.max_bytes_per_agent as u64,
        )?;
        positive("correlator.max_bytes", self.correlator.max_bytes as u64)?;
        positive("correlator.state_ttl_secs", self.correlator.state_ttl_secs)?;
        positive("correlator.tick_ms", self.correlator.tick_ms)?;
        positive("correlator.gap_timeout_ms", self.correlator.gap_timeout_ms)?;
        positive("batch.max_spans", self.batch.max_spans as u64)?;
        positive("batch.max_bytes", self.batch.max_bytes as u64)?;
        positive("batch.timeout_ms", self.batch.timeout_ms)?;
        positive("batch.queue", self.batch.queue as u64)?;
        if let Some(otlp) = &self.exporters.otlp {
            let uri: http::Uri = otlp.endpoint.parse().map_err(|e| {
                ConfigError::new(
                    "exporters.otlp.endpoint",
                    format!("`{}` is not a URL ({e})", otlp.endpoint),
                )
            })?;
            if !matches!(uri.scheme_str(), Some("http" | "https")) {
                return Err(ConfigError::new(
                    "exporters.otlp.endpoint",
                    format!("`{}` must start with http:// or https://", otlp.endpoint),
                ));
            }
            if uri.host().is_none() {
                return Err(ConfigError::new(
                    "exporters.otlp.endpoint",
                    format!("`{}` has no host", otlp.endpoint),
                ));
            }
            positive("exporters.otlp.timeout_ms", otlp.timeout_ms)?;
            otlp.all_headers()?;
            otlp.tls_settings()?;
        }
        if let Some(path) = self.span_file() {
            crate::config_checks::span_file(&path)
                .map_err(|reason| ConfigError::new("exporters.file.path", reason))?;
        }
        if let Some(metrics) = &self.exporters.otlp_metrics {
            metrics.validate()?;
        }
        if self.shutdown.grace_ms >= 30_000 {
            return Err(ConfigError::new(
                "shutdown.grace_ms",
                "must be below 30000 (Kubernetes' default termination grace period)",
            ));
        }
        if self.runtime.worker_threads > MAX_WORKER_THREADS {
            return Err(ConfigError::new(
                "runtime.worker_threads",
                format!("must be at most {MAX_WORKER_THREADS} (0: one per CPU)"),
            ));
        }
        self.processing
            .validate()
            .map_err(|e| ConfigError::new(format!("processing.{}", e.path()), e.to_string()))?;
        crate::config_checks::log_filter(&self.log.level)
            .map_err(|reason| ConfigError::new("log.level", reason))?;
        // It replaces `log.level` (see `init_logging`).
        if let Some(filter) = env("RUST_LOG").filter(|f| !f.is_empty()) {
            crate::config_checks::log_filter(&filter)
                .map_err(|reason| ConfigError::new("RUST_LOG", reason))?;
        }
        Ok(())
    }
}

/// `text` cut to at most `max` bytes on a character boundary, marked `…`.
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

fn positive(path: &str, value: u64) -> Result<(), ConfigError> {
    if value == 0 {
        Err(ConfigError::new(path, "must be greater than 0"))
    } else {
        Ok(())
    }
}

/// OTLP export of the metrics derived from the spans: the same histograms
/// as `/metrics`, with their OpenTelemetry semantic-convention names
/// (`gen_ai.client.token.usage`, `gen_ai.client.operation.duration`,
/// `hermes.tool.duration`, `hermes.turn.duration`), pushed every
/// `interval_ms` and once more at shutdown.
#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
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

    /// Checks what serde cannot: the endpoint, the timers, the headers.
    fn validate(&self) -> Result<(), ConfigError> {
        const KEY: &str = "exporters.otlp_metrics";
        let uri: http::Uri = self.endpoint.parse().map_err(|e| {
            ConfigError::new(
                format!("{KEY}.endpoint"),
                format!("`{}` is not a URL ({e})", self.endpoint),
            )
        })?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) {
            return Err(ConfigError::new(
                format!("{KEY}.endpoint"),
                format!("`{}` must start with http:// or https://", self.endpoint),
            ));
        }
        if uri.host().is_none() {
            return Err(ConfigError::new(
                format!("{KEY}.endpoint"),
                format!("`{}` has no host", self.endpoint),
            ));
        }
        self.tls_settings()?;
        positive(&format!("{KEY}.interval_ms"), self.interval_ms)?;
        positive(&format!("{KEY}.timeout_ms"), self.timeout_ms)?;
        for (name, value) in &self.headers {
            let key = || format!("{KEY}.headers.{name}");
            http::HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| ConfigError::new(key(), "not a valid header name"))?;
            http::HeaderValue::from_str(value)
                .map_err(|_| ConfigError::new(key(), "not a valid header value"))?;
        }
        Ok(())
    }
}

/// The JSON schema of the configuration file (JSON Schema 2020-12), as
/// printed by `hermes-collector schema` and checked in as
/// `config/collector.schema.json`. It describes the file after `${VAR}`
/// interpolation; the checks that need more than the file's shape (files
/// exist, regexes compile, URLs parse) are `hermes-collector validate`'s.
pub fn json_schema() -> Result<String, serde_json::Error> {
    let mut schema = schemars::schema_for!(Config);
    schema.insert("title".to_owned(), "hermes-collector configuration".into());
    serde_json::to_string_pretty(&schema)
}

/// The schema of `processing:`, whose types belong to `hermes-processor`
/// (which does not depend on `schemars`): the same keys and docs, the
/// processor's defaults. A test checks it accepts what the processor
/// serializes and has no key the processor lacks.
#[derive(schemars::JsonSchema)]
#[schemars(rename = "ProcessorConfig")]
#[serde(deny_unknown_fields, default)]
#[allow(dead_code)]
struct ProcessingSchema {
    /// Attribute vocabularies to emit. `gen_ai` (the OpenTelemetry GenAI
    /// semantic conventions the correlator produces) is always on, listed or
    /// not; `openinference` (Arize Phoenix) and `langfuse` add attributes
    /// derived from the `gen_ai.*` ones, so those backends display the spans
    /// natively.
    attribute_sets: Vec<AttributeSetSchema>,
    /// Rules that replace secrets and personal data in every string a span
    /// exports (attribute values and keys of spans, events, links, scopes
    /// and resources, JSON text included; span and event names; status
    /// messages; the scope's name and version) before export.
    redaction: RedactionSchema,
    /// Longest string attribute value and status message in bytes; longer
    /// ones are cut on a UTF-8 character boundary, JSON values so that they
    /// stay valid JSON, and the span lists the cut attribute keys in
    /// `hermes.truncated_attributes`. `null` means unlimited. Minimum 32
    /// (Tempo's default limit is 2048). Span, event and scope names and
    /// attribute keys are cut to 256 bytes whatever this says.
    #[schemars(range(min = 32))]
    max_attribute_bytes: Option<usize>,
    /// Which backend project, trace name, user and tags each agent's spans
    /// get (used by the `openinference` and `langfuse` attribute sets).
    routing: crate::routing_schema::RoutingSchema,
}

impl Default for ProcessingSchema {
    fn default() -> Self {
        let defaults = hermes_processor::ProcessorConfig::default();
        Self {
            attribute_sets: defaults
                .attribute_sets
                .iter()
                .map(|set| match set {
                    hermes_processor::AttributeSet::GenAi => AttributeSetSchema::GenAi,
                    hermes_processor::AttributeSet::OpenInference => {
                        AttributeSetSchema::OpenInference
                    }
                    hermes_processor::AttributeSet::Langfuse => AttributeSetSchema::Langfuse,
                })
                .collect(),
            redaction: RedactionSchema::default(),
            max_attribute_bytes: defaults.max_attribute_bytes,
            routing: crate::routing_schema::RoutingSchema::default(),
        }
    }
}

/// An attribute vocabulary.
#[derive(serde::Serialize, schemars::JsonSchema)]
#[schemars(rename = "AttributeSet")]
#[allow(dead_code)]
enum AttributeSetSchema {
    /// OpenTelemetry GenAI semantic conventions (`gen_ai.*`); always on.
    #[serde(rename = "gen_ai")]
    GenAi,
    /// OpenInference (`openinference.span.kind`, `llm.*`, `tool.*`,
    /// `input.value`, `output.value`), read by Arize Phoenix.
    #[serde(rename = "openinference")]
    OpenInference,
    /// Langfuse's OTLP ingestion attributes (`langfuse.*`).
    #[serde(rename = "langfuse")]
    Langfuse,
}

/// Redaction rules. Setting a list replaces its defaults; an empty list
/// switches that kind of rule off.
#[derive(schemars::JsonSchema)]
#[schemars(rename = "RedactionConfig")]
#[serde(deny_unknown_fields, default)]
#[allow(dead_code)]
struct RedactionSchema {
    /// Keys whose whole value is replaced: attribute keys (the full key or
    /// its last dot-separated segment, so `http.request.header.authorization`
    /// matches `authorization`), key-value list keys, and object keys inside
    /// JSON text. Compared ignoring case, `-` and `_` (`API-Key`, `api_key`
    /// and `apiKey` are the same key); `*` matches any run of characters.
    /// The defaults are the names secret scanners treat as secrets
    /// (authorization, cookies, tokens but not token counts, API keys,
    /// passwords, passphrases, secrets, credentials, private keys,
    /// connection strings, DSNs).
    key_names: Vec<String>,
    /// Regular expressions (Rust `regex` syntax) whose matches are replaced
    /// inside every exported string (attribute values and keys, span and
    /// event names, status messages), and inside every string and object key
    /// of JSON text. A pattern must not match the empty string, and should
    /// contain a literal every match holds (without one, every string goes
    /// through the regular expressions). The defaults find what secret
    /// scanners find: bearer tokens, `Authorization:` values, URL and
    /// connection-string credentials, JWTs, PEM private keys, `NAME=value`
    /// and `--flag value` assignments of secret-looking names, Azure account
    /// keys, the prefixed keys of OpenAI/Anthropic, AWS, Google, GitHub,
    /// GitLab, Slack, Stripe, SendGrid, Hugging Face, npm and PyPI, and
    /// e-mail addresses.
    value_patterns: Vec<String>,
    /// What a redacted value or match becomes.
    replacement: String,
}

impl Default for RedactionSchema {
    fn default() -> Self {
        let defaults = hermes_processor::RedactionConfig::default();
        Self {
            key_names: defaults.key_names,
            value_patterns: defaults.value_patterns,
            replacement: defaults.replacement,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_names_the_variable_not_its_secret_value() {
        let env = |name: &str| (name == "TOKEN").then(|| "s3cret-token".to_owned());
        let text = "exporters:\n  otlp:\n    endpoint: http://127.0.0.1:4317\n    protocol: \"http/p${TOKEN}\"\n";
        let e = Config::from_text(text, &env).unwrap_err();
        let shown = e.to_string();
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("${TOKEN}"), "{shown}");
        assert_eq!(e.path, "exporters.otlp.protocol");
    }

    #[test]
    fn empty_file_is_the_embedded_default() {
        let c = Config::from_yaml("").unwrap();
        assert!(c.is_embedded_default());
        assert_eq!(c.receiver.listen, "127.0.0.1:4319");
    }

    #[test]
    fn example_config_parses() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/collector.yaml");
        let c = Config::from_file(&path).unwrap();
        assert_eq!(c, Config::default(), "the example documents the defaults");
    }

    #[test]
    fn unknown_key_names_its_path() {
        let e =
            Config::from_yaml("exporters:\n  otlp:\n    endpoint: http://x:4317\n    endpont: y\n")
                .unwrap_err();
        assert_eq!(e.path, "exporters.otlp.endpont");
        assert!(e.reason.contains("endpont"), "{e}");
    }

    #[test]
    fn bad_values_name_their_path() {
        let cases = [
            ("receiver:\n  listen: nowhere\n", "receiver.listen"),
            ("admin:\n  listen: 13133\n", "admin.listen"),
            ("batch:\n  max_spans: 0\n", "batch.max_spans"),
            ("batch:\n  max_spans: lots\n", "batch.max_spans"),
            (
                "exporters:\n  otlp:\n    endpoint: ftp://x\n",
                "exporters.otlp.endpoint",
            ),
            (
                "exporters:\n  otlp:\n    endpoint: http://x:4317\n    protocol: udp\n",
                "exporters.otlp.protocol",
            ),
            ("shutdown:\n  grace_ms: 60000\n", "shutdown.grace_ms"),
            (
                "runtime:\n  worker_threads: 100000\n",
                "runtime.worker_threads",
            ),
            ("runtime:\n  worker_threads: -1\n", "runtime.worker_threads"),
            ("runtime:\n  threads: 2\n", "runtime.threads"),
            (
                "processing:\n  redaction:\n    value_patterns: ['ok', '(unclosed']\n",
                "processing.redaction.value_patterns[1]",
            ),
            (
                "processing:\n  attribute_sets: [phoenix]\n",
                "processing.attribute_sets[0]",
            ),
            (
                "processing:\n  routing:\n    langfuse:\n      tags: [ok, '{service.name']\n",
                "processing.routing.langfuse.tags[1]",
            ),
        ];
        for (yaml, path) in cases {
            let e = Config::from_yaml(yaml).unwrap_err();
            assert_eq!(e.path, path, "{yaml} -> {e}");
        }
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn token_file_is_read_trimmed_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "s3cret-token\n").unwrap();
        let yaml = format!("receiver:\n  auth:\n    token_file: {}\n", file.display());
        let c = Config::parse_yaml(&yaml).unwrap();
        c.validate_with(&no_env).unwrap();
        assert!(c.receiver.auth.token(&no_env).unwrap().is_some());

        // Empty, unreadable, or with characters a header cannot carry.
        for content in ["", " \n", "two words"] {
            std::fs::write(&file, content).unwrap();
            let e = c.validate_with(&no_env).unwrap_err();
            assert_eq!(e.path, "receiver.auth.token_file", "{content:?}: {e}");
        }
        std::fs::write(&file, "two s3cret-words").unwrap();
        let e = c.validate_with(&no_env).unwrap_err();
        assert!(
            !e.to_string().contains("s3cret"),
            "never shows the token: {e}"
        );
        let missing = dir.path().join("missing");
        let yaml = format!(
            "receiver:\n  auth:\n    token_file: {}\n",
            missing.display()
        );
        let e = Config::parse_yaml(&yaml)
            .unwrap()
            .validate_with(&no_env)
            .unwrap_err();
        assert_eq!(e.path, "receiver.auth.token_file", "{e}");
        assert!(e.reason.contains("cannot read"), "{e}");
    }

    #[test]
    fn token_env_is_looked_up() {
        let c = Config::parse_yaml("receiver:\n  auth:\n    token_env: INGEST_TOKEN\n").unwrap();
        let e = c.validate_with(&no_env).unwrap_err();
        assert_eq!(e.path, "receiver.auth.token_env");
        assert!(e.reason.contains("INGEST_TOKEN"), "{e}");
        let set = |name: &str| (name == "INGEST_TOKEN").then(|| "abc123".to_owned());
        c.validate_with(&set).unwrap();
        let empty = |_: &str| Some(String::new());
        assert_eq!(
            c.validate_with(&empty).unwrap_err().path,
            "receiver.auth.token_env"
        );
        assert!(!format!("{c:?}").contains("abc123"));
    }

    #[test]
    fn token_file_and_env_exclude_each_other() {
        let c = Config::parse_yaml(
            "receiver:\n  auth:\n    token_file: /etc/hostname\n    token_env: X\n",
        )
        .unwrap();
        let e = c.validate_with(&|_| Some("x".into())).unwrap_err();
        assert_eq!(e.path, "receiver.auth");
        let e = Config::from_yaml("receiver:\n  auth:\n    token: x\n").unwrap_err();
        assert_eq!(e.path, "receiver.auth.token");
    }

    #[test]
    fn tls_files_are_checked_naming_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let not_pem = dir.path().join("not.pem");
        std::fs::write(&not_pem, "hello").unwrap();
        let bad_pem = dir.path().join("bad.pem");
        std::fs::write(
            &bad_pem,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let missing = dir.path().join("missing.pem");
        let tls = |cert: &Path, key: &Path, ca: Option<&Path>| {
            let mut yaml = format!(
                "receiver:\n  tls:\n    cert_file: {}\n    key_file: {}\n",
                cert.display(),
                key.display()
            );
            if let Some(ca) = ca {
                yaml.push_str(&format!("    client_ca_file: {}\n", ca.display()));
            }
            Config::from_yaml(&yaml).unwrap_err()
        };
        assert_eq!(tls(&missing, &bad_pem, None).path, "receiver.tls.cert_file");
        assert_eq!(tls(&bad_pem, &not_pem, None).path, "receiver.tls.key_file");
        assert_eq!(
            tls(&bad_pem, &bad_pem, Some(&missing)).path,
            "receiver.tls.client_ca_file"
        );
        let e = tls(&bad_pem, &bad_pem, None);
        assert_eq!(e.path, "receiver.tls", "{e}");
        let e = Config::from_yaml("receiver:\n  tls:\n    cert_file: x\n").unwrap_err();
        assert!(e.reason.contains("key_file"), "{e}");
    }

    #[test]
    fn unix_listen_needs_an_existing_directory() {
        let dir = tempfile::tempdir().unwrap();
        let ok = format!(
            "receiver:\n  listen: unix:{}/ingest.sock\n",
            dir.path().display()
        );
        let c = Config::from_yaml(&ok).unwrap();
        assert_eq!(
            c.receiver.listen_addr().unwrap(),
            ListenAddr::Unix(dir.path().join("ingest.sock"))
        );
        let bad = format!(
            "receiver:\n  listen: unix:{}/nowhere/ingest.sock\n",
            dir.path().display()
        );
        let e = Config::from_yaml(&bad).unwrap_err();
        assert_eq!(e.path, "receiver.listen");
        assert!(e.reason.contains("does not exist"), "{e}");
        let e = Config::from_yaml("receiver:\n  listen: 'unix:'\n").unwrap_err();
        assert_eq!(e.path, "receiver.listen");
    }

    #[test]
    fn the_metrics_token_follows_the_ingest_token_rules_under_its_own_key() {
        let c =
            Config::parse_yaml("admin:\n  metrics_auth:\n    token_env: SCRAPE_TOKEN\n").unwrap();
        let e = c.validate_with(&no_env).unwrap_err();
        assert_eq!(e.path, "admin.metrics_auth.token_env");
        let set = |name: &str| (name == "SCRAPE_TOKEN").then(|| "scr4pe".to_owned());
        c.validate_with(&set).unwrap();
        let spaced = |_: &str| Some("two words".to_owned());
        let e = c.validate_with(&spaced).unwrap_err();
        assert_eq!(e.path, "admin.metrics_auth.token_env");
        assert!(!e.to_string().contains("two words"), "{e}");
        let c = Config::parse_yaml(
            "admin:\n  metrics_auth:\n    token_file: /nonexistent/token\n    token_env: X\n",
        )
        .unwrap();
        let e = c.validate_with(&|_| Some("x".into())).unwrap_err();
        assert_eq!(e.path, "admin.metrics_auth");
        let c = Config::parse_yaml("admin:\n  metrics_auth:\n    token_file: /nonexistent/token\n")
            .unwrap();
        let e = c.validate_with(&no_env).unwrap_err();
        assert_eq!(e.path, "admin.metrics_auth.token_file");
    }

    #[test]
    fn metric_label_bounds_are_checked() {
        let c = Config::parse_yaml("").unwrap();
        assert_eq!(c.metrics.bounds(), crate::label_bounds::Bounds::default());
        for (yaml, path) in [
            (
                "metrics:\n  max_label_value_bytes: 0\n",
                "metrics.max_label_value_bytes",
            ),
            (
                "metrics:\n  max_label_values: 0\n",
                "metrics.max_label_values",
            ),
            ("metrics:\n  max_series: 0\n", "metrics.max_series"),
            ("metrics:\n  max_series: 10001\n", "metrics.max_series"),
            (
                "metrics:\n  max_label_value_bytes: 1025\n",
                "metrics.max_label_value_bytes",
            ),
        ] {
            let e = Config::parse_yaml(yaml)
                .unwrap()
                .validate_with(&no_env)
                .unwrap_err();
            assert_eq!(e.path, path, "{yaml}");
        }
        let c = Config::parse_yaml(
            "metrics:\n  max_label_value_bytes: 64\n  max_label_values: 20\n  max_series: 50\n",
        )
        .unwrap();
        c.validate_with(&no_env).unwrap();
        assert_eq!(
            c.metrics.bounds(),
            crate::label_bounds::Bounds {
                max_value_bytes: 64,
                max_values: 20,
                max_series: 50
            }
        );
    }
}

#[cfg(test)]
mod schema_tests {
    use super::*;
    use std::path::Path;

    const REGENERATE: &str =
        "cargo run -p hermes-collector -- schema > config/collector.schema.json";

    fn repo() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    fn validator() -> jsonschema::Validator {
        let schema: serde_json::Value = serde_json::from_str(&json_schema().unwrap()).unwrap();
        jsonschema::validator_for(&schema).unwrap()
    }

    /// The errors of `instance` against the schema, one a line.
    fn errors(validator: &jsonschema::Validator, instance: &serde_json::Value) -> String {
        validator
            .iter_errors(instance)
            .map(|e| format!("{}: {e}\n", e.instance_path()))
            .collect()
    }

    fn yaml(text: &str) -> serde_json::Value {
        serde_yaml::from_str(text).unwrap()
    }

    /// `deploy/**/collector*.yaml`, and the recipes of `deploy/README.md`
    /// (a ```yaml block right after `<!-- validate: collector-config -->`),
    /// as `deploy/validate.sh` finds them.
    fn deploy_configs() -> Vec<(String, String)> {
        fn walk(dir: &Path, out: &mut Vec<(String, String)>) {
            let mut entries: Vec<_> = std::fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            entries.sort();
            for path in entries {
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                if path.is_dir() {
                    walk(&path, out);
                } else if name.starts_with("collector") && name.ends_with(".yaml") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    out.push((path.display().to_string(), text));
                }
            }
        }
        let mut out = Vec::new();
        walk(&repo().join("deploy"), &mut out);
        let readme = std::fs::read_to_string(repo().join("deploy/README.md")).unwrap();
        let lines: Vec<&str> = readme.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if line.trim() == "<!-- validate: collector-config -->" {
                assert_eq!(lines[i + 1].trim(), "```yaml", "deploy/README.md:{}", i + 2);
                let body: Vec<&str> = lines[i + 2..]
                    .iter()
                    .take_while(|l| l.trim() != "```")
                    .copied()
                    .collect();
                out.push((format!("deploy/README.md:{}", i + 3), body.join("\n")));
            }
        }
        assert!(out.len() >= 6, "found too few deploy configs: {out:?}");
        out
    }

    #[test]
    fn checked_in_schema_is_current() {
        let path = repo().join("config/collector.schema.json");
        let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
        let generated = format!("{}\n", json_schema().unwrap());
        assert!(
            checked_in == generated,
            "config/collector.schema.json differs from the configuration structs; regenerate it with\n\n    {REGENERATE}\n"
        );
    }

    #[test]
    fn schema_accepts_the_example_and_the_deploy_configs() {
        let validator = validator();
        let example = std::fs::read_to_string(repo().join("config/collector.yaml")).unwrap();
        let mut configs = vec![("config/collector.yaml".to_owned(), example)];
        configs.extend(deploy_configs());
        for (name, text) in configs {
            let instance = yaml(&text);
            let errors = errors(&validator, &instance);
            assert!(errors.is_empty(), "{name}:\n{errors}");
            // And the collector takes them (the schema is not looser there).
            Config::parse_yaml(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }

    #[test]
    fn schema_accepts_every_key_and_rejects_what_the_collector_rejects() {
        let validator = validator();
        // Every key, indented as a block (YAML allows an indented root).
        let full = yaml(
            r#"
            receiver:
              listen: unix:/run/hermes/ingest.sock
              auth: {token_env: T}
              tls: {cert_file: c.pem, key_file: k.pem, client_ca_file: ca.pem}
            exporters:
              otlp:
                endpoint: http://x:4318
                protocol: http/protobuf
                headers: {a: b}
                compression: gzip
              otlp_metrics:
                endpoint: http://x:4317
                protocol: grpc
                headers: {a: b}
                interval_ms: 1000
                timeout_ms: 500
                compression: gzip
                temporality: delta
              file: {path: x.jsonl}
              console: {enabled: false}
            processing:
              attribute_sets: [gen_ai, openinference, langfuse]
              max_attribute_bytes: null
            log: {format: json}
            "#,
        );
        assert_eq!(errors(&validator, &full), "");
        for bad in [
            "receivers: {}\n",
            "exporters:\n  otlp:\n    endpont: http://x\n",
            "exporters:\n  otlp:\n    endpoint: http://x\n    protocol: udp\n",
            "exporters:\n  otlp_metrics:\n    interval_ms: 1000\n",
            "exporters:\n  otlp_metrics:\n    endpoint: http://x\n    temporality: sometimes\n",
            "batch:\n  max_spans: 0\n",
            "batch:\n  max_spans: lots\n",
            "shutdown:\n  grace_ms: 60000\n",
            "processing:\n  attribute_sets: [phoenix]\n",
            "processing:\n  redaction:\n    keys: []\n",
            "processing:\n  max_attribute_bytes: 8\n",
            "log:\n  format: xml\n",
        ] {
            assert!(
                !validator.is_valid(&yaml(bad)),
                "the schema accepts {bad:?}"
            );
        }
    }

    #[test]
    fn processing_schema_matches_the_processor() {
        let validator = validator();
        let processor = hermes_processor::ProcessorConfig {
            attribute_sets: vec![
                hermes_processor::AttributeSet::GenAi,
                hermes_processor::AttributeSet::OpenInference,
                hermes_processor::AttributeSet::Langfuse,
            ],
            ..Default::default()
        };
        let serialized = serde_json::to_value(&processor).unwrap();
        let instance = serde_json::json!({ "processing": serialized });
        assert_eq!(
            errors(&validator, &instance),
            "",
            "a processor key is missing from ProcessingSchema"
        );

        let schema: serde_json::Value = serde_json::from_str(&json_schema().unwrap()).unwrap();
        let keys = |v: &serde_json::Value| -> Vec<String> {
            let mut keys: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            keys.sort();
            keys
        };
        let defs = &schema["$defs"];
        assert_eq!(
            keys(&defs["ProcessorConfig"]["properties"]),
            keys(&serialized)
        );
        assert_eq!(
            keys(&defs["RedactionConfig"]["properties"]),
            keys(&serialized["redaction"])
        );
        // The defaults in the schema are the processor's.
        let defaults = serde_json::to_value(hermes_processor::ProcessorConfig::default()).unwrap();
        for (key, value) in defaults["redaction"].as_object().unwrap() {
            assert_eq!(
                &defs["RedactionConfig"]["properties"][key]["default"], value,
                "{key}"
            );
        }
        assert_eq!(
            defs["ProcessorConfig"]["properties"]["attribute_sets"]["default"],
            defaults["attribute_sets"]
        );
        assert_eq!(
            keys(&defs["RoutingConfig"]["properties"]),
            keys(&serialized["routing"])
        );
        assert_eq!(
            keys(&defs["LangfuseRoutingConfig"]["properties"]),
            keys(&serialized["routing"]["langfuse"])
        );
        assert_eq!(
            defs["RoutingConfig"]["properties"]["project_name"]["default"],
            defaults["routing"]["project_name"]
        );
        for (key, value) in defaults["routing"]["langfuse"].as_object().unwrap() {
            assert_eq!(
                &defs["LangfuseRoutingConfig"]["properties"][key]["default"], value,
                "{key}"
            );
        }
    }
}

#[cfg(test)]
mod export_security_tests {
    use super::*;

    fn otlp(extra: &str) -> Result<Config, ConfigError> {
        Config::from_yaml(&format!(
            "exporters:\n  otlp:\n    endpoint: https://otlp.example.com:4317\n{extra}"
        ))
    }

    #[test]
    fn header_files_are_read_trimmed_and_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("authorization");
        std::fs::write(&file, "Basic czNjcmV0\n").unwrap();
        let c = Config::parse_yaml(&format!(
            "exporters:\n  otlp:\n    endpoint: http://127.0.0.1:4317\n    headers:\n      x-tenant: t1\n    header_files:\n      authorization: {}\n",
            file.display()
        ))
        .unwrap();
        c.validate_with(&|_| None).unwrap();
        let otlp = c.exporters.otlp.as_ref().unwrap();
        let headers = otlp.all_headers().unwrap();
        assert!(headers.contains(&("authorization".into(), "Basic czNjcmV0".into())));
        assert!(headers.contains(&("x-tenant".into(), "t1".into())));
        let debug = format!("{c:?}");
        assert!(
            !debug.contains("czNjcmV0") && !debug.contains("t1\""),
            "{debug}"
        );

        // Missing, empty, not a header value, or set twice: errors naming
        // the key, never the value.
        let key = "exporters.otlp.header_files.authorization";
        for (content, reason) in [
            (None, "cannot read"),
            (Some(" \n"), "is empty"),
            (Some("czNjcmV0\nline two"), "not a valid header value"),
        ] {
            match content {
                Some(text) => std::fs::write(&file, text).unwrap(),
                None => std::fs::remove_file(&file).unwrap(),
            }
            let e = c.validate_with(&|_| None).unwrap_err();
            assert_eq!(e.path, key, "{e}");
            assert!(e.reason.contains(reason), "{e}");
            assert!(!e.to_string().contains("czNjcmV0"), "{e}");
        }
        let twice = Config::from_yaml(&format!(
            "exporters:\n  otlp:\n    endpoint: http://x:4317\n    headers:\n      Authorization: a\n    header_files:\n      authorization: {}\n",
            file.display()
        ))
        .unwrap_err();
        assert_eq!(twice.path, key, "{twice}");
    }

    #[test]
    fn tls_files_are_checked_naming_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let not_pem = dir.path().join("not.pem");
        std::fs::write(&not_pem, "hello").unwrap();
        let bad_pem = dir.path().join("bad.pem");
        std::fs::write(
            &bad_pem,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let missing = dir.path().join("missing.pem");
        let tls = |body: String| otlp(&format!("    tls:\n{body}")).unwrap_err();
        let e = tls(format!("      ca_file: {}\n", missing.display()));
        assert_eq!(e.path, "exporters.otlp.tls.ca_file", "{e}");
        let e = tls(format!("      ca_file: {}\n", not_pem.display()));
        assert_eq!(e.path, "exporters.otlp.tls.ca_file", "{e}");
        let e = tls(format!("      ca_file: {}\n", bad_pem.display()));
        assert_eq!(e.path, "exporters.otlp.tls", "{e}");
        assert!(e.reason.contains("CA file"), "{e}");
        let e = tls(format!(
            "      ca_file: {}\n      key_file: {}\n",
            bad_pem.display(),
            missing.display()
        ));
        assert_eq!(e.path, "exporters.otlp.tls.key_file", "{e}");
        let e = tls("      ca_file: x\n      insecure: true\n".into());
        assert_eq!(e.path, "exporters.otlp.tls.insecure", "{e}");

        // TLS settings with a plaintext endpoint are refused.
        let e = Config::from_yaml(&format!(
            "exporters:\n  otlp:\n    endpoint: http://x:4317\n    tls:\n      ca_file: {}\n",
            bad_pem.display()
        ))
        .unwrap_err();
        assert_eq!(e.path, "exporters.otlp.tls", "{e}");
        assert!(e.reason.contains("https://"), "{e}");
    }

    #[test]
    fn receiver_limits_must_be_positive() {
        for key in [
            "max_event_bytes",
            "stream_events_per_sec",
            "stream_burst_events",
        ] {
            let e = Config::from_yaml(&format!("receiver:\n  {key}: 0\n")).unwrap_err();
            assert_eq!(e.path, format!("receiver.{key}"), "{e}");
        }
        let c = Config::from_yaml("receiver:\n  stream_events_per_sec: 50\n").unwrap();
        assert_eq!(c.receiver.stream_events_per_sec, 50);
        assert_eq!(c.receiver.max_event_bytes, 1024 * 1024);
    }
}
