//! The collector's configuration: one YAML file (every key documented in
//! `config/collector.yaml`), a few CLI overrides, and validation that runs
//! before any port is bound.
//!
//! Parsing is pure (no I/O besides reading the file named on the command
//! line). Validation reads only what the collector needs before it binds:
//! the bearer tokens (their files or environment variables), the TLS
//! files, the exporter's header files, and the directory of a Unix socket;
//! it returns them with the configuration as a [`Validated`], so the binary
//! reads each secret once. Unknown keys are errors. Every error names the
//! key path, and the binary exits with code 64 (`EX_USAGE`) on it. A secret
//! is never part of an error or of a `Debug` output.

//!
//! | module | owns |
//! |---|---|
//! | this file | [`Config`], loading (`${VAR}` interpolation, parsing, overrides) and the whole-file validation |
//! | [`listeners`] | the ingest receiver (TLS, bearer token) and the admin server |
//! | [`exporters`] | the span exporters (OTLP, file, console) and the metrics exporter |
//! | [`stages`] | correlator limits, batching, queue, shutdown, runtime, logging |
//! | [`metrics`] | the bounds of the derived metrics' labels ([`Bounds`]) |
//! | [`sampling`] | tail sampling's policies ([`SamplingConfig`]) |
//! | [`validated`] | [`Validated`]: the configuration with its secrets, TLS material and addresses read once |
//! | [`settings`] | conversions of the sections into each stage's settings (receiver limits, correlator, sequencer, exporter stage, persistent queue) |
//! | [`schema`] | the JSON schema of the file (`hermes-collector schema`) |
//! | [`checks`], [`files`], [`interpolate`], [`yaml_depth`] | checks of regexes and paths, bounded file reads, `${VAR}`, the YAML nesting bound |
//!
//! A crate of its own so that the binary, the `config` fuzz target and tools
//! parse a configuration with the same code.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use hermes_receiver::ListenAddr;
use serde::Deserialize;

pub use crate::interpolate::Interpolated;

pub mod atif;
pub mod checks;
pub mod exporters;
pub mod files;
pub mod interpolate;
pub mod listeners;
pub mod metrics;
mod routing_schema;
pub mod sampling;
pub mod schema;
pub mod settings;
pub mod stages;
pub mod validated;
pub mod yaml_depth;

#[cfg(test)]
mod tests;

pub use atif::AtifConfig;
pub use exporters::*;
pub use listeners::*;
pub use metrics::*;
pub use sampling::{PolicyConfig, SamplingConfig};
pub use schema::json_schema;
pub use settings::DiskQueueSettings;
pub use stages::*;
pub use validated::{OtlpExport, OtlpMetricsExport, ReceiverTls, Validated};

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
    #[schemars(with = "schema::ProcessingSchema")]
    pub processing: hermes_processor::ProcessorConfig,
    /// Which turns are exported (tail sampling). Without it every turn is.
    pub sampling: Option<SamplingConfig>,
    /// Where spans go. With none configured, the embedded default runs: spans
    /// appended to a JSON-lines file and each finished turn printed.
    pub exporters: ExportersConfig,
    /// When a batch is acknowledged to its shim, and the persistent queue.
    pub queue: QueueConfig,
    /// Shutdown behaviour.
    pub shutdown: ShutdownConfig,
    /// One replica of a fleet of collectors.
    pub fleet: FleetConfig,
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
        let text = Self::read_file(path)?;
        Self::from_text(&text, &|name| std::env::var(name).ok())
    }

    /// Reads a file and replaces `${VAR}`/`${VAR:-default}` from the
    /// environment, then parses it without validating: for a caller that
    /// applies overrides first and then validates once
    /// ([`Config::validate`]), reading each secret once.
    pub fn parse_file(path: &std::path::Path) -> Result<Self, ConfigError> {
        let text = Self::read_file(path)?;
        Self::parse_text(&text, &|name| std::env::var(name).ok())
    }

    fn read_file(path: &std::path::Path) -> Result<String, ConfigError> {
        crate::files::read_limited_text(CONFIG_KEY, path, crate::files::CONFIG_FILE_LIMIT)
    }

    /// Replaces `${VAR}`/`${VAR:-default}` through `env`, then parses and
    /// validates. An error never shows a value taken from the environment
    /// (a token written into the wrong key, say): it names the variable.
    pub fn from_text(
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let config = Self::parse_text(text, env)?;
        config
            .validate_with(env)
            .map_err(|e| e.conceal(&config.interpolated))?;
        Ok(config)
    }

    /// Replaces `${VAR}`/`${VAR:-default}` through `env` and parses,
    /// without validating. Errors name the variable, never its value.
    pub fn parse_text(
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let mut used = Interpolated::default();
        let text = crate::interpolate::interpolate_with(text, env, &mut used)?;
        let mut config = Self::parse_yaml(&text).map_err(|e| e.conceal(&used))?;
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

    /// [`Config::validate_with`] the process environment; errors show a
    /// value a `${VAR}` reference took as that reference.
    pub fn validate(&self) -> Result<Validated, ConfigError> {
        self.validate_with(&|name| std::env::var(name).ok())
            .map_err(|e| e.conceal(&self.interpolated))
    }

    /// Checks values serde cannot check, and returns the configuration with
    /// what the checks read (see [`Validated`]). Its only I/O: reading the
    /// bearer tokens (environment variables through `env`), the TLS files
    /// (and the system's root certificates for an `https://` exporter
    /// without a CA), the exporter's header files, and looking for the
    /// directory of a Unix socket. Each secret is read once.
    pub fn validate_with(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Validated, ConfigError> {
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
        let ingest_token = self.receiver.auth.token(env)?;
        let receiver_tls = match &self.receiver.tls {
            Some(tls) => Some(ReceiverTls {
                server: tls.server_config()?,
                mutual: tls.client_ca_file.is_some(),
            }),
            None => None,
        };
        let admin = self.admin.listen.parse::<SocketAddr>().map_err(|e| {
            ConfigError::new(
                "admin.listen",
                format!("`{}` is not host:port ({e})", self.admin.listen),
            )
        })?;
        if let ListenAddr::Tcp(ingest) = &listen
            && crate::checks::listens_clash(*ingest, admin)
        {
            return Err(ConfigError::new(
                "admin.listen",
                format!(
                    "`{}` takes the port of receiver.listen (`{}`); the admin server needs a port of its own",
                    self.admin.listen, self.receiver.listen
                ),
            ));
        }
        let metrics_token = self
            .admin
            .metrics_auth
            .token_at("admin.metrics_auth", env)?;
        self.metrics.validate()?;
        if let Some(sampling) = &self.sampling {
            sampling.validate()?;
        }
        let (r, c, b) = (&self.receiver, &self.correlator, &self.batch);
        for (key, value) in [
            ("receiver.max_message_bytes", r.max_message_bytes as u64),
            (
                "receiver.max_events_per_batch",
                r.max_events_per_batch as u64,
            ),
            ("receiver.queue_batches", r.queue_batches as u64),
            (
                "receiver.max_streams_per_connection",
                u64::from(r.max_streams_per_connection),
            ),
            ("receiver.max_event_bytes", r.max_event_bytes as u64),
            ("receiver.stream_events_per_sec", r.stream_events_per_sec),
            ("receiver.stream_burst_events", r.stream_burst_events),
            ("receiver.max_connections", r.max_connections as u64),
            ("receiver.handshake_timeout_ms", r.handshake_timeout_ms),
            ("receiver.idle_timeout_secs", r.idle_timeout_secs),
            (
                "correlator.max_open_turns_per_agent",
                c.max_open_turns_per_agent as u64,
            ),
            ("correlator.max_open_turns", c.max_open_turns as u64),
            (
                "correlator.max_sessions_per_agent",
                c.max_sessions_per_agent as u64,
            ),
            ("correlator.max_sessions", c.max_sessions as u64),
            (
                "correlator.max_bytes_per_agent",
                c.max_bytes_per_agent as u64,
            ),
            ("correlator.max_bytes", c.max_bytes as u64),
            ("correlator.state_ttl_secs", c.state_ttl_secs),
            ("correlator.tick_ms", c.tick_ms),
            ("correlator.gap_timeout_ms", c.gap_timeout_ms),
            ("batch.max_spans", b.max_spans as u64),
            ("batch.max_bytes", b.max_bytes as u64),
            ("batch.timeout_ms", b.timeout_ms),
            ("batch.queue", b.queue as u64),
        ] {
            positive(key, value)?;
        }
        if r.max_events_per_batch > hermes_receiver::MAX_EVENTS_PER_BATCH {
            return Err(ConfigError::new(
                "receiver.max_events_per_batch",
                format!(
                    "must be at most {} (a batch of more events is refused before they are decoded)",
                    hermes_receiver::MAX_EVENTS_PER_BATCH
                ),
            ));
        }
        let otlp_export = self
            .exporters
            .otlp
            .as_ref()
            .map(|otlp| otlp.validate_at("exporters.otlp"))
            .transpose()?;
        if let Some(path) = self.span_file() {
            crate::checks::span_file(&path)
                .map_err(|reason| ConfigError::new("exporters.file.path", reason))?;
        }
        let atif_logs = match &self.exporters.atif {
            Some(atif) => atif.validate()?,
            None => None,
        };
        let otlp_metrics = match &self.exporters.otlp_metrics {
            Some(metrics) => Some(OtlpMetricsExport {
                tls: metrics.validate()?,
                config: metrics.clone(),
            }),
            None => None,
        };
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
        crate::checks::log_filter(&self.log.level)
            .map_err(|reason| ConfigError::new("log.level", reason))?;
        // It replaces `log.level` (see `init_logging`).
        if let Some(filter) = env("RUST_LOG").filter(|f| !f.is_empty()) {
            crate::checks::log_filter(&filter)
                .map_err(|reason| ConfigError::new("RUST_LOG", reason))?;
        }
        Ok(Validated {
            config: self.clone(),
            listen,
            admin_listen: admin,
            ingest_token,
            metrics_token,
            receiver_tls,
            otlp: otlp_export,
            otlp_metrics,
            atif_logs,
        })
    }
}

/// `text` cut to at most `max` bytes on a character boundary, marked `…`.
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    format!("{}…", &text[..text.floor_char_boundary(max)])
}

pub(crate) fn positive(path: &str, value: u64) -> Result<(), ConfigError> {
    if value == 0 {
        Err(ConfigError::new(path, "must be greater than 0"))
    } else {
        Ok(())
    }
}
