//! Shim configuration: the `HERMES_COLLECTOR_*` environment variables.
//!
//! Owns: parsing and validating every knob of the shim, and the set of hooks
//! each capture level registers.
//!
//! Invariants:
//! - Parsing never fails and never panics: a bad value yields a
//!   [`ConfigWarning`] (the Python layer logs it) and the documented default.
//!   A plugin must never raise into Hermes because of its configuration.
//! - Lookups go through a caller-supplied function, so tests never touch the
//!   process environment.
//! - The bearer token never appears in a warning, a `Debug` output or the
//!   settings handed to Python: [`Token`] is redacted, and the endpoint
//!   converts to Python as its address only.
//! - The shim never reads or sets `OTEL_EXPORTER_OTLP_ENDPOINT`: Hermes'
//!   bundled `nemo-relay` would export prompt content as soon as it is set.
//! - No capture level registers a `transform_*` hook; `lean` leaves out
//!   `pre_api_request`, whose sanitized request payload Hermes only builds when
//!   someone listens.

use std::fmt;

use hermes_proto::hooks;

use crate::sender::fleet::{FLEET_PREFIX, FleetName};

mod bounded;
use bounded::{EXIT_FLUSH_MS, QUEUE_EVENTS, RESOLVE_SECS, SPOOL_MAX_BYTES};

/// `HERMES_COLLECTOR_ENDPOINT`.
pub const ENV_ENDPOINT: &str = "HERMES_COLLECTOR_ENDPOINT";
/// `HERMES_COLLECTOR_SERVICE_NAME`.
pub const ENV_SERVICE_NAME: &str = "HERMES_COLLECTOR_SERVICE_NAME";
/// `HERMES_COLLECTOR_CAPTURE`.
pub const ENV_CAPTURE: &str = "HERMES_COLLECTOR_CAPTURE";
/// `HERMES_COLLECTOR_QUEUE_EVENTS`.
pub const ENV_QUEUE_EVENTS: &str = "HERMES_COLLECTOR_QUEUE_EVENTS";
/// `HERMES_COLLECTOR_EXIT_FLUSH_MS`.
pub const ENV_EXIT_FLUSH_MS: &str = "HERMES_COLLECTOR_EXIT_FLUSH_MS";
/// `HERMES_COLLECTOR_DISABLED`.
pub const ENV_DISABLED: &str = "HERMES_COLLECTOR_DISABLED";
/// `HERMES_COLLECTOR_TOKEN`: the bearer token itself.
pub const ENV_TOKEN: &str = "HERMES_COLLECTOR_TOKEN";
/// `HERMES_COLLECTOR_TOKEN_FILE`: a file holding the bearer token.
pub const ENV_TOKEN_FILE: &str = "HERMES_COLLECTOR_TOKEN_FILE";
/// `HERMES_COLLECTOR_TLS_CA_FILE`: PEM CA certificate(s) the collector's
/// certificate must chain to (`https://` endpoints).
pub const ENV_TLS_CA_FILE: &str = "HERMES_COLLECTOR_TLS_CA_FILE";
/// `HERMES_COLLECTOR_TLS_CERT_FILE`: PEM client certificate (mutual TLS).
pub const ENV_TLS_CERT_FILE: &str = "HERMES_COLLECTOR_TLS_CERT_FILE";
/// `HERMES_COLLECTOR_TLS_KEY_FILE`: PEM private key of the client certificate.
pub const ENV_TLS_KEY_FILE: &str = "HERMES_COLLECTOR_TLS_KEY_FILE";
/// `HERMES_COLLECTOR_SPOOL_DIR`: directory of the optional disk spool.
pub const ENV_SPOOL_DIR: &str = "HERMES_COLLECTOR_SPOOL_DIR";
/// `HERMES_COLLECTOR_SPOOL_MAX_BYTES`: bound of the spool directory, bytes.
pub const ENV_SPOOL_MAX_BYTES: &str = "HERMES_COLLECTOR_SPOOL_MAX_BYTES";
/// `HERMES_COLLECTOR_HOSTS_FILE`: a hosts(5)-format file that resolves a
/// fleet endpoint's name before the system resolver.
pub const ENV_HOSTS_FILE: &str = "HERMES_COLLECTOR_HOSTS_FILE";
/// `HERMES_COLLECTOR_RESOLVE_SECS`: interval between resolutions of a
/// fleet endpoint's name, seconds.
pub const ENV_RESOLVE_SECS: &str = "HERMES_COLLECTOR_RESOLVE_SECS";

/// Default collector gRPC ingest endpoint.
pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:4319";
/// Default `service.name`.
pub const DEFAULT_SERVICE_NAME: &str = "hermes-agent";
/// Default capacity of the hook queue, in events.
pub const DEFAULT_QUEUE_EVENTS: usize = 65_536;
/// Largest accepted queue capacity, in events.
pub const MAX_QUEUE_EVENTS: usize = 1 << 24;
/// Default bound of the flush at interpreter exit, ms.
pub const DEFAULT_EXIT_FLUSH_MS: u64 = 2_000;
/// Largest accepted exit flush bound, ms.
pub const MAX_EXIT_FLUSH_MS: u64 = 60_000;
/// Default bound of the spool directory, bytes (64 MiB).
pub const DEFAULT_SPOOL_MAX_BYTES: u64 = 64 << 20;
/// Largest accepted spool bound, bytes (1 TiB).
pub const MAX_SPOOL_MAX_BYTES: u64 = 1 << 40;
/// Default interval between resolutions of a fleet endpoint's name, s.
pub const DEFAULT_RESOLVE_SECS: u64 = 30;
/// Largest accepted resolution interval, s.
pub const MAX_RESOLVE_SECS: u64 = 3_600;

/// Hooks registered at capture levels `metadata` and `content`.
pub const METADATA_HOOKS: [&str; 15] = hooks::ALL;

/// Hooks registered at capture level `lean`: metadata minus `pre_api_request`.
pub const LEAN_HOOKS: [&str; 14] = [
    hooks::ON_SESSION_START,
    hooks::ON_SESSION_END,
    hooks::ON_SESSION_FINALIZE,
    hooks::ON_SESSION_RESET,
    hooks::PRE_LLM_CALL,
    hooks::POST_LLM_CALL,
    hooks::POST_API_REQUEST,
    hooks::API_REQUEST_ERROR,
    hooks::PRE_TOOL_CALL,
    hooks::POST_TOOL_CALL,
    hooks::SUBAGENT_START,
    hooks::SUBAGENT_STOP,
    hooks::PRE_APPROVAL_REQUEST,
    hooks::POST_APPROVAL_RESPONSE,
];

/// Hooks whose events go out at once instead of on the sender's next look
/// at the queue (10 ms while events come, up to 50 ms): the end of a
/// session, after which a host may exit, and of a subagent. Waking the
/// sender costs the hook a system call when the sender is parked: the
/// largest part of what the plugin would add to a session if every turn's
/// end woke it (docs/BENCHMARKS.md, "The agent side of issue 26").
///
/// The end of a turn (`post_llm_call`, `on_session_end`) does not wake:
/// the exit paths take the turn's events out themselves (`atexit`, and
/// `logging.shutdown()`, which `hermes -z` calls before its `os._exit`:
/// `hermes_collector/__init__.py`, `_ExitHandler`).
pub fn wakes_sender(hook: &str) -> bool {
    matches!(hook, hooks::ON_SESSION_FINALIZE | hooks::SUBAGENT_STOP)
}

/// How much the shim captures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CaptureLevel {
    /// Metadata without `pre_api_request` (cheapest for the agent).
    Lean,
    /// Ids, timings, token usage, statuses; no prompts, arguments or results.
    #[default]
    Metadata,
    /// Metadata plus content: prompts, responses, tool arguments and results,
    /// sanitized request/response payloads, subagent goals, approval commands.
    Content,
}

impl CaptureLevel {
    /// The wire name (`ShimInfo.capture`).
    pub fn as_str(self) -> &'static str {
        match self {
            CaptureLevel::Lean => "lean",
            CaptureLevel::Metadata => "metadata",
            CaptureLevel::Content => "content",
        }
    }

    /// Parses a level name, case-insensitively.
    pub fn parse(value: &str) -> Option<Self> {
        match value.trim().to_ascii_lowercase().as_str() {
            "lean" => Some(CaptureLevel::Lean),
            "metadata" => Some(CaptureLevel::Metadata),
            "content" => Some(CaptureLevel::Content),
            _ => None,
        }
    }

    /// The hooks this level registers.
    pub fn hooks(self) -> &'static [&'static str] {
        match self {
            CaptureLevel::Lean => &LEAN_HOOKS,
            CaptureLevel::Metadata | CaptureLevel::Content => &METADATA_HOOKS,
        }
    }

    /// Whether content (prompts, arguments, results, payloads) is captured.
    pub fn captures_content(self) -> bool {
        self == CaptureLevel::Content
    }
}

/// A bearer token. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// A token from its text, surrounding whitespace trimmed; None unless it
    /// is non-empty visible ASCII (what a header value can carry).
    pub fn new(text: &str) -> Option<Token> {
        let text = text.trim();
        (!text.is_empty() && text.bytes().all(|b| b.is_ascii_graphic()))
            .then(|| Token(text.to_owned()))
    }

    /// The token.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// TLS material of an `https://` endpoint (PEM text, read once).
#[derive(Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// CA certificate(s) the collector's certificate must chain to.
    pub ca_pem: Vec<u8>,
    /// Client certificate and its private key, for mutual TLS.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsFiles")
            .field("ca_bytes", &self.ca_pem.len())
            .field(
                "client_identity",
                &self.identity.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// Where and how the sender reaches the collector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CollectorEndpoint {
    /// `http://host:port` (plaintext HTTP/2), `https://host:port` (TLS),
    /// `unix:/path/to/socket`, or `dns:///NAME:PORT`: the replicas of a
    /// fleet (TLS when a CA is configured).
    pub url: String,
    /// Sent as `authorization: Bearer <token>` on the stream call.
    pub token: Option<Token>,
    /// TLS settings; used with `https://` endpoints only.
    pub tls: Option<TlsFiles>,
}

impl Default for CollectorEndpoint {
    fn default() -> Self {
        CollectorEndpoint::from(DEFAULT_ENDPOINT)
    }
}

impl From<String> for CollectorEndpoint {
    fn from(url: String) -> Self {
        CollectorEndpoint {
            url,
            token: None,
            tls: None,
        }
    }
}

impl From<&str> for CollectorEndpoint {
    fn from(url: &str) -> Self {
        CollectorEndpoint::from(url.to_owned())
    }
}

impl fmt::Display for CollectorEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.url)
    }
}

/// To Python, an endpoint is its address (never its token).
#[cfg(feature = "python")]
impl<'py> pyo3::IntoPyObject<'py> for &CollectorEndpoint {
    type Target = pyo3::types::PyString;
    type Output = pyo3::Bound<'py, pyo3::types::PyString>;
    type Error = std::convert::Infallible;

    fn into_pyobject(self, py: pyo3::Python<'py>) -> Result<Self::Output, Self::Error> {
        Ok(pyo3::types::PyString::new(py, &self.url))
    }
}

/// The shim's configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShimConfig {
    /// `HERMES_COLLECTOR_ENDPOINT`: the collector's gRPC ingest, `http://host:port`
    /// (plaintext HTTP/2) or `unix:/path/to/socket`. Default
    /// `http://127.0.0.1:4319`; `https://host:port` with
    /// `HERMES_COLLECTOR_TLS_CA_FILE` (and, for mutual TLS,
    /// `HERMES_COLLECTOR_TLS_CERT_FILE` + `HERMES_COLLECTOR_TLS_KEY_FILE`).
    /// With the bearer token of
    /// `HERMES_COLLECTOR_TOKEN_FILE` (read once, here) or
    /// `HERMES_COLLECTOR_TOKEN`; the file wins when both are set.
    pub endpoint: CollectorEndpoint,
    /// `HERMES_COLLECTOR_SERVICE_NAME`: `service.name` of the agent. Default `hermes-agent`.
    pub service_name: String,
    /// `HERMES_COLLECTOR_CAPTURE`: `lean`, `metadata` (default) or `content`.
    pub capture: CaptureLevel,
    /// `HERMES_COLLECTOR_QUEUE_EVENTS`: capacity of the hook queue, events
    /// (1 ..= 16777216, default 65536). A full queue drops new events and counts them.
    pub queue_events: usize,
    /// `HERMES_COLLECTOR_EXIT_FLUSH_MS`: how long interpreter exit may wait for
    /// queued events to be acknowledged, ms (0 ..= 60000, default 2000).
    pub exit_flush_ms: u64,
    /// `HERMES_COLLECTOR_DISABLED`: `1`/`true`/`yes`/`on` registers no hook.
    pub disabled: bool,
    /// `HERMES_COLLECTOR_SPOOL_DIR`: absolute path of the disk spool, or
    /// None (default: no spool). What the exit flush cannot deliver is
    /// written there, and sent by a later shim start.
    pub spool_dir: Option<std::path::PathBuf>,
    /// `HERMES_COLLECTOR_SPOOL_MAX_BYTES`: most bytes of spool files in the
    /// directory (1 ..= 2^40, default 64 MiB).
    pub spool_max_bytes: u64,
    /// `HERMES_COLLECTOR_HOSTS_FILE`: a hosts(5)-format file consulted
    /// first to resolve a `dns:///` endpoint's name (default: none).
    pub hosts_file: Option<std::path::PathBuf>,
    /// `HERMES_COLLECTOR_RESOLVE_SECS`: a `dns:///` endpoint's name is
    /// resolved again this often, s (1 ..= 3600, default 30), and after
    /// every failed stream.
    pub resolve_secs: u64,
}

impl Default for ShimConfig {
    fn default() -> Self {
        ShimConfig {
            endpoint: CollectorEndpoint::default(),
            service_name: DEFAULT_SERVICE_NAME.to_owned(),
            capture: CaptureLevel::default(),
            queue_events: DEFAULT_QUEUE_EVENTS,
            exit_flush_ms: DEFAULT_EXIT_FLUSH_MS,
            disabled: false,
            spool_dir: None,
            spool_max_bytes: DEFAULT_SPOOL_MAX_BYTES,
            hosts_file: None,
            resolve_secs: DEFAULT_RESOLVE_SECS,
        }
    }
}

/// A configuration value that was ignored in favour of its default.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{var}={value:?} ignored ({reason}); using the default {default}")]
pub struct ConfigWarning {
    /// The environment variable.
    pub var: &'static str,
    /// The rejected value.
    pub value: String,
    /// Why it was rejected.
    pub reason: &'static str,
    /// The value used instead.
    pub default: String,
}

impl ShimConfig {
    /// Reads the configuration through `lookup` (an environment variable name
    /// to its value). Unset and empty variables mean the default.
    pub fn from_lookup<F>(lookup: F) -> (ShimConfig, Vec<ConfigWarning>)
    where
        F: Fn(&str) -> Option<String>,
    {
        let get = |var: &str| lookup(var).filter(|v| !v.trim().is_empty());
        let mut config = ShimConfig::default();
        let mut warnings = Vec::new();
        let mut warn = |var: &'static str, value: &str, reason: &'static str, default: String| {
            warnings.push(ConfigWarning {
                var,
                value: value.to_owned(),
                reason,
                default,
            });
        };

        if let Some(value) = get(ENV_DISABLED) {
            match parse_bool(&value) {
                Some(disabled) => config.disabled = disabled,
                None => warn(
                    ENV_DISABLED,
                    &value,
                    "expected 1/0, true/false, yes/no or on/off",
                    "0".into(),
                ),
            }
        }
        if let Some(value) = get(ENV_ENDPOINT) {
            match validate_endpoint(&value) {
                Ok(endpoint) => config.endpoint.url = endpoint,
                Err(reason) => warn(ENV_ENDPOINT, &value, reason, DEFAULT_ENDPOINT.into()),
            }
        }
        let token_file = get(ENV_TOKEN_FILE);
        if let Some(path) = &token_file {
            match std::fs::read_to_string(path.trim()) {
                Ok(text) => match Token::new(&text) {
                    Some(token) => config.endpoint.token = Some(token),
                    None => warn(
                        ENV_TOKEN_FILE,
                        path,
                        "the file is empty or holds characters other than visible ASCII",
                        "no token".into(),
                    ),
                },
                Err(_) => warn(
                    ENV_TOKEN_FILE,
                    path,
                    "the file cannot be read",
                    "no token".into(),
                ),
            }
        }
        let https = config.endpoint.url.starts_with("https://");
        let fleet = config.endpoint.url.starts_with(FLEET_PREFIX);
        let mut tls = None;
        if let Some(path) = get(ENV_TLS_CA_FILE) {
            match read_pem(&path) {
                Some(ca_pem) => {
                    tls = Some(TlsFiles {
                        ca_pem,
                        identity: None,
                    })
                }
                None => warn(
                    ENV_TLS_CA_FILE,
                    &path,
                    "the file cannot be read or holds no PEM block",
                    "no TLS".into(),
                ),
            }
        }
        match (get(ENV_TLS_CERT_FILE), get(ENV_TLS_KEY_FILE)) {
            (None, None) => {}
            (Some(cert), Some(key)) => match (read_pem(&cert), read_pem(&key), tls.as_mut()) {
                (Some(cert), Some(key), Some(tls)) => tls.identity = Some((cert, key)),
                (_, _, None) => warn(
                    ENV_TLS_CERT_FILE,
                    &cert,
                    "a client certificate needs HERMES_COLLECTOR_TLS_CA_FILE too",
                    "no client certificate".into(),
                ),
                _ => warn(
                    ENV_TLS_CERT_FILE,
                    &cert,
                    "the certificate or key file cannot be read or holds no PEM block",
                    "no client certificate".into(),
                ),
            },
            (Some(cert), None) => warn(
                ENV_TLS_CERT_FILE,
                &cert,
                "HERMES_COLLECTOR_TLS_KEY_FILE is not set",
                "no client certificate".into(),
            ),
            (None, Some(key)) => warn(
                ENV_TLS_KEY_FILE,
                &key,
                "HERMES_COLLECTOR_TLS_CERT_FILE is not set",
                "no client certificate".into(),
            ),
        }
        match (https, tls) {
            (true, Some(tls)) => config.endpoint.tls = Some(tls),
            (false, Some(tls)) if fleet => config.endpoint.tls = Some(tls),
            (true, None) => warn(
                ENV_ENDPOINT,
                &config.endpoint.url.clone(),
                "an https:// endpoint needs HERMES_COLLECTOR_TLS_CA_FILE; nothing is sent",
                "no connection".into(),
            ),
            (false, Some(_)) => warn(
                ENV_TLS_CA_FILE,
                &config.endpoint.url.clone(),
                "TLS settings apply to https:// and dns:/// endpoints only",
                "no TLS".into(),
            ),
            (false, None) => {}
        }
        if let Some(value) = get(ENV_TOKEN) {
            if token_file.is_some() {
                warn(
                    ENV_TOKEN,
                    REDACTED,
                    "HERMES_COLLECTOR_TOKEN_FILE is set too, and wins",
                    "the file's token".into(),
                );
            } else {
                match Token::new(&value) {
                    Some(token) => config.endpoint.token = Some(token),
                    None => warn(
                        ENV_TOKEN,
                        REDACTED,
                        "characters other than visible ASCII",
                        "no token".into(),
                    ),
                }
            }
        }
        if let Some(value) = get(ENV_SERVICE_NAME) {
            config.service_name = value.trim().to_owned();
        }
        if let Some(value) = get(ENV_CAPTURE) {
            match CaptureLevel::parse(&value) {
                Some(level) => config.capture = level,
                None => warn(
                    ENV_CAPTURE,
                    &value,
                    "expected lean, metadata or content",
                    CaptureLevel::default().as_str().into(),
                ),
            }
        }
        config.queue_events = QUEUE_EVENTS.read(ENV_QUEUE_EVENTS, &get, &mut warn);
        config.exit_flush_ms = EXIT_FLUSH_MS.read(ENV_EXIT_FLUSH_MS, &get, &mut warn);
        if let Some(value) = get(ENV_SPOOL_DIR) {
            let path = std::path::PathBuf::from(value.trim());
            if path.is_absolute() {
                config.spool_dir = Some(path);
            } else {
                warn(
                    ENV_SPOOL_DIR,
                    &value,
                    "expected an absolute path",
                    "no spool".into(),
                );
            }
        }
        config.spool_max_bytes = SPOOL_MAX_BYTES.read(ENV_SPOOL_MAX_BYTES, &get, &mut warn);
        if let Some(value) = get(ENV_HOSTS_FILE) {
            config.hosts_file = Some(std::path::PathBuf::from(value.trim()));
        }
        config.resolve_secs = RESOLVE_SECS.read(ENV_RESOLVE_SECS, &get, &mut warn);
        (config, warnings)
    }
}

fn parse_bool(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// Stands for a token in warnings.
const REDACTED: &str = "<redacted>";

/// The content of a file holding at least one PEM block.
fn read_pem(path: &str) -> Option<Vec<u8>> {
    std::fs::read(path.trim())
        .ok()
        .filter(|bytes| bytes.windows(11).any(|w| w == b"-----BEGIN "))
}

/// Accepts `http(s)://host[:port][/]`, `unix:/path` or `dns:///NAME:PORT`;
/// returns it trimmed.
fn validate_endpoint(value: &str) -> Result<String, &'static str> {
    let value = value.trim();
    if let Some(name) = FleetName::parse(value) {
        return name.map(|_| value.to_owned());
    }
    if let Some(path) = value.strip_prefix("unix:") {
        let path = path.strip_prefix("//").unwrap_or(path);
        if path.is_empty() {
            return Err("unix: needs a socket path (unix:/path/to/socket)");
        }
        return Ok(value.to_owned());
    }
    let endpoint =
        tonic::transport::Endpoint::from_shared(value.to_owned()).map_err(|_| "not a valid URI")?;
    let uri = endpoint.uri();
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err("expected an http:// or https:// URI, unix:/path or dns:///NAME:PORT");
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err("the URI has no host");
    }
    Ok(value.to_owned())
}

#[cfg(test)]
mod tests;
