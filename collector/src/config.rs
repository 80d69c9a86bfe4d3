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

/// Exit code for bad configuration or usage (`EX_USAGE` of sysexits.h).
pub const EXIT_CONFIG: i32 = 64;

/// A configuration error, naming the offending key path.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration at `{path}`: {reason}")]
pub struct ConfigError {
    /// Dotted key path (`exporters.otlp.endpoint`), or `<file>` for I/O.
    pub path: String,
    pub reason: String,
}

impl ConfigError {
    fn new(path: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            reason: reason.into(),
        }
    }
}

/// Root of the configuration file.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where shims connect.
    pub receiver: ReceiverConfig,
    /// Health probes and Prometheus metrics over HTTP.
    pub admin: AdminConfig,
    /// Correlation limits and timers.
    pub correlator: CorrelatorConfig,
    /// Batching in front of the exporters.
    pub batch: BatchConfig,
    /// What every span goes through before export: extra attribute sets
    /// (OpenInference, Langfuse), redaction, truncation.
    pub processing: hermes_processor::ProcessorConfig,
    /// Where spans go. With none configured, the embedded default runs: spans
    /// appended to a JSON-lines file and each finished turn printed.
    pub exporters: ExportersConfig,
    /// Shutdown behaviour.
    pub shutdown: ShutdownConfig,
    /// The collector's own logs.
    pub log: LogConfig,
}

/// The gRPC ingest listener.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ReceiverConfig {
    /// Address of the gRPC ingest (shims' `HERMES_COLLECTOR_ENDPOINT`):
    /// `host:port`, or `unix:/path/to/socket` for a Unix domain socket
    /// (created with mode 0600, a stale one replaced, removed at shutdown).
    pub listen: String,
    /// Largest accepted message, bytes.
    pub max_message_bytes: usize,
    /// Most events in one batch.
    pub max_events_per_batch: usize,
    /// Capacity of the channel from the receiver to the correlator, batches.
    /// When full, the receiver stops reading (backpressure to the shims).
    pub queue_batches: usize,
    /// Bearer token the shims must present. None by default.
    pub auth: AuthConfig,
    /// TLS on the ingest listener, mutual with `client_ca_file`. None by
    /// default (plaintext HTTP/2).
    pub tls: Option<TlsConfig>,
}

/// TLS on the ingest listener. The files are read at startup.
#[derive(Debug, Clone, Deserialize, PartialEq)]
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
    let bytes = std::fs::read(path)
        .map_err(|e| ConfigError::new(key, format!("cannot read {}: {e}", path.display())))?;
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
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// File whose content, surrounding whitespace trimmed, is the token
    /// (e.g. a mounted Kubernetes Secret). Read once at startup.
    pub token_file: Option<PathBuf>,
    /// Name of the environment variable holding the token.
    pub token_env: Option<String>,
}

impl AuthConfig {
    /// Reads the token, if one is configured, looking environment variables
    /// up through `env`. Errors name the key; they never contain the token.
    pub fn token(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<BearerToken>, ConfigError> {
        match (&self.token_file, &self.token_env) {
            (None, None) => Ok(None),
            (Some(_), Some(_)) => Err(ConfigError::new(
                "receiver.auth",
                "set token_file or token_env, not both",
            )),
            (Some(path), None) => {
                const KEY: &str = "receiver.auth.token_file";
                let text = std::fs::read_to_string(path).map_err(|e| {
                    ConfigError::new(KEY, format!("cannot read {}: {e}", path.display()))
                })?;
                BearerToken::new(&text)
                    .map(Some)
                    .map_err(|e| ConfigError::new(KEY, format!("{}: {e}", path.display())))
            }
            (None, Some(name)) => {
                const KEY: &str = "receiver.auth.token_env";
                let text = env(name).ok_or_else(|| {
                    ConfigError::new(KEY, format!("the environment variable {name} is not set"))
                })?;
                BearerToken::new(&text)
                    .map(Some)
                    .map_err(|e| ConfigError::new(KEY, format!("{name}: {e}")))
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
            auth: AuthConfig::default(),
            tls: None,
        }
    }
}

/// The admin HTTP server: `GET /livez`, `/readyz`, `/metrics`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Address of the admin server. Use `0.0.0.0:13133` in containers so
    /// the kubelet's probes reach it.
    pub listen: String,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:13133".to_owned(),
        }
    }
}

/// Limits and timers of the correlator.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CorrelatorConfig {
    /// Most turns open at once; the oldest is closed as incomplete past it.
    pub max_open_turns: usize,
    /// Open state with no event for this long is closed as incomplete.
    pub state_ttl_secs: u64,
    /// Wait after `post_llm_call` for the turn's `on_session_end`.
    pub turn_end_grace_ms: u64,
    /// How often timers are checked.
    pub tick_ms: u64,
    /// How long to wait for a missing event of a shim's stream (events that
    /// arrived after it are held) before giving up on it.
    pub gap_timeout_ms: u64,
}

impl Default for CorrelatorConfig {
    fn default() -> Self {
        Self {
            max_open_turns: 10_000,
            state_ttl_secs: 3600,
            turn_end_grace_ms: 2000,
            tick_ms: 500,
            gap_timeout_ms: 5000,
        }
    }
}

/// Batching of finished spans before export.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BatchConfig {
    /// Most spans in one export request.
    pub max_spans: usize,
    /// Most encoded bytes in one export request (approximately); keep it under
    /// the backend's limit (4 MiB for most OTLP/gRPC servers).
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
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ExportersConfig {
    /// An OTLP endpoint (Jaeger, Tempo, Langfuse, Phoenix, an OTel Collector).
    pub otlp: Option<OtlpConfig>,
    /// Spans appended to a file as OTLP JSON lines.
    pub file: Option<FileConfig>,
    /// Each finished turn printed as an indented tree.
    pub console: Option<ConsoleConfig>,
}

/// OTLP transport.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
pub enum OtlpProtocol {
    #[serde(rename = "grpc")]
    Grpc,
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
}

/// An OTLP exporter.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OtlpConfig {
    /// `http://host:4317` for gRPC; `http://host:4318` (the `/v1/traces` path
    /// is appended unless present) for HTTP/protobuf.
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

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum CompressionConfig {
    #[default]
    None,
    Gzip,
}

/// The JSON-lines file of the embedded default.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// File the spans are appended to (parent directories are created).
    pub path: PathBuf,
}

/// The console tree of the embedded default.
#[derive(Debug, Clone, Deserialize, PartialEq)]
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

/// Shutdown on SIGTERM/SIGINT.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ShutdownConfig {
    /// Longest the drain may take before the process exits, logging what is
    /// left. Keep it below Kubernetes' `terminationGracePeriodSeconds` (30 s).
    pub grace_ms: u64,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        Self { grace_ms: 20_000 }
    }
}

/// The collector's own logs (to standard error).
#[derive(Debug, Clone, Deserialize, PartialEq)]
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

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
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
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let config = Self::parse_yaml(text)?;
        config.validate()?;
        Ok(config)
    }

    /// Parses YAML text without validating it.
    fn parse_yaml(text: &str) -> Result<Self, ConfigError> {
        let config: Config = if text.trim().is_empty() {
            Config::default()
        } else {
            let de = serde_yaml::Deserializer::from_str(text);
            serde_path_to_error::deserialize(de).map_err(|e| {
                let path = e.path().to_string();
                let inner = e.into_inner().to_string();
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

    /// Reads and parses a file.
    /// Reads a file, replaces `${VAR}`/`${VAR:-default}` from the
    /// environment, then parses and validates it.
    pub fn from_file(path: &std::path::Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::new("<file>", format!("cannot read {}: {e}", path.display()))
        })?;
        let text = crate::interpolate::interpolate(&text, &|name| std::env::var(name).ok())?;
        Self::from_yaml(&text)
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
    }

    /// Checks values serde cannot check. Its only I/O: reading the bearer
    /// token (environment variables through `env`) and the TLS files, and
    /// looking for the directory of a Unix socket.
    pub fn validate_with(&self, env: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
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
        self.admin.listen.parse::<SocketAddr>().map_err(|e| {
            ConfigError::new(
                "admin.listen",
                format!("`{}` is not host:port ({e})", self.admin.listen),
            )
        })?;
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
            "correlator.max_open_turns",
            self.correlator.max_open_turns as u64,
        )?;
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
            match uri.scheme_str() {
                Some("http") => {}
                Some("https") => {
                    return Err(ConfigError::new(
                        "exporters.otlp.endpoint",
                        "https endpoints are not supported yet by this version (TLS export comes with the security work)",
                    ));
                }
                _ => {
                    return Err(ConfigError::new(
                        "exporters.otlp.endpoint",
                        format!("`{}` must start with http://", otlp.endpoint),
                    ));
                }
            }
            if uri.host().is_none() {
                return Err(ConfigError::new(
                    "exporters.otlp.endpoint",
                    format!("`{}` has no host", otlp.endpoint),
                ));
            }
            positive("exporters.otlp.timeout_ms", otlp.timeout_ms)?;
            for (name, value) in &otlp.headers {
                http::HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                    ConfigError::new(
                        format!("exporters.otlp.headers.{name}"),
                        "not a valid header name",
                    )
                })?;
                http::HeaderValue::from_str(value).map_err(|_| {
                    ConfigError::new(
                        format!("exporters.otlp.headers.{name}"),
                        "not a valid header value",
                    )
                })?;
            }
        }
        if let Some(file) = &self.exporters.file
            && file.path.as_os_str().is_empty()
        {
            return Err(ConfigError::new("exporters.file.path", "must not be empty"));
        }
        if self.shutdown.grace_ms >= 30_000 {
            return Err(ConfigError::new(
                "shutdown.grace_ms",
                "must be below 30000 (Kubernetes' default termination grace period)",
            ));
        }
        self.processing
            .validate()
            .map_err(|e| ConfigError::new(format!("processing.{}", e.path()), e.to_string()))?;
        tracing_subscriber::EnvFilter::try_new(&self.log.level)
            .map_err(|e| ConfigError::new("log.level", format!("`{}`: {e}", self.log.level)))?;
        Ok(())
    }
}

fn positive(path: &str, value: u64) -> Result<(), ConfigError> {
    if value == 0 {
        Err(ConfigError::new(path, "must be greater than 0"))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
                "processing:\n  redaction:\n    value_patterns: ['ok', '(unclosed']\n",
                "processing.redaction.value_patterns[1]",
            ),
            (
                "processing:\n  attribute_sets: [phoenix]\n",
                "processing.attribute_sets[0]",
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
}
