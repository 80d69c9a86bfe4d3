//! The ingest receiver's and the admin server's settings.

use std::path::{Path, PathBuf};

use hermes_receiver::{BearerToken, ListenAddr};
use serde::Deserialize;

use crate::ConfigError;

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
    /// Most events in one batch (at most 65536).
    #[schemars(range(min = 1, max = 65536))]
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
pub(crate) fn read_pem(key: &str, path: &Path) -> Result<Vec<u8>, ConfigError> {
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

impl ReceiverConfig {
    /// `listen`, parsed.
    pub fn listen_addr(&self) -> Result<ListenAddr, ConfigError> {
        self.listen
            .parse::<ListenAddr>()
            .map_err(|e| ConfigError::new("receiver.listen", e.to_string()))
    }
}
