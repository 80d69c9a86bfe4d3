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
//! - The shim never reads or sets `OTEL_EXPORTER_OTLP_ENDPOINT`: Hermes'
//!   bundled `nemo-relay` would export prompt content as soon as it is set.
//! - No capture level registers a `transform_*` hook; `lean` leaves out
//!   `pre_api_request`, whose sanitized request payload Hermes only builds when
//!   someone listens.

use hermes_proto::hooks;

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

/// Hooks registered at capture levels `metadata` and `content`.
pub const METADATA_HOOKS: [&str; 15] = [
    hooks::ON_SESSION_START,
    hooks::ON_SESSION_END,
    hooks::ON_SESSION_FINALIZE,
    hooks::ON_SESSION_RESET,
    hooks::PRE_LLM_CALL,
    hooks::POST_LLM_CALL,
    hooks::PRE_API_REQUEST,
    hooks::POST_API_REQUEST,
    hooks::API_REQUEST_ERROR,
    hooks::PRE_TOOL_CALL,
    hooks::POST_TOOL_CALL,
    hooks::SUBAGENT_START,
    hooks::SUBAGENT_STOP,
    hooks::PRE_APPROVAL_REQUEST,
    hooks::POST_APPROVAL_RESPONSE,
];

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

/// The shim's configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShimConfig {
    /// `HERMES_COLLECTOR_ENDPOINT`: the collector's gRPC ingest, `http://host:port`
    /// (plaintext HTTP/2; TLS is not supported). Default `http://127.0.0.1:4319`.
    pub endpoint: String,
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
}

impl Default for ShimConfig {
    fn default() -> Self {
        ShimConfig {
            endpoint: DEFAULT_ENDPOINT.to_owned(),
            service_name: DEFAULT_SERVICE_NAME.to_owned(),
            capture: CaptureLevel::default(),
            queue_events: DEFAULT_QUEUE_EVENTS,
            exit_flush_ms: DEFAULT_EXIT_FLUSH_MS,
            disabled: false,
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
                Ok(endpoint) => config.endpoint = endpoint,
                Err(reason) => warn(ENV_ENDPOINT, &value, reason, DEFAULT_ENDPOINT.into()),
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
        if let Some(value) = get(ENV_QUEUE_EVENTS) {
            match value.trim().parse::<usize>() {
                Ok(n) if (1..=MAX_QUEUE_EVENTS).contains(&n) => config.queue_events = n,
                _ => warn(
                    ENV_QUEUE_EVENTS,
                    &value,
                    "expected an integer in 1..=16777216",
                    DEFAULT_QUEUE_EVENTS.to_string(),
                ),
            }
        }
        if let Some(value) = get(ENV_EXIT_FLUSH_MS) {
            match value.trim().parse::<u64>() {
                Ok(n) if n <= MAX_EXIT_FLUSH_MS => config.exit_flush_ms = n,
                _ => warn(
                    ENV_EXIT_FLUSH_MS,
                    &value,
                    "expected an integer in 0..=60000",
                    DEFAULT_EXIT_FLUSH_MS.to_string(),
                ),
            }
        }
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

/// Accepts `http://host[:port][/]`; returns it trimmed.
fn validate_endpoint(value: &str) -> Result<String, &'static str> {
    let value = value.trim();
    let endpoint =
        tonic::transport::Endpoint::from_shared(value.to_owned()).map_err(|_| "not a valid URI")?;
    let uri = endpoint.uri();
    if uri.scheme_str() != Some("http") {
        return Err("expected an http:// URI (plaintext gRPC; TLS is not supported)");
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err("the URI has no host");
    }
    Ok(value.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(vars: &[(&str, &str)]) -> (ShimConfig, Vec<ConfigWarning>) {
        let env: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        ShimConfig::from_lookup(|k| env.get(k).cloned())
    }

    #[test]
    fn defaults() {
        let (config, warnings) = parse(&[]);
        assert!(warnings.is_empty());
        assert_eq!(config, ShimConfig::default());
        assert_eq!(config.endpoint, "http://127.0.0.1:4319");
        assert_eq!(config.service_name, "hermes-agent");
        assert_eq!(config.capture, CaptureLevel::Metadata);
        assert_eq!(config.queue_events, 65_536);
        assert_eq!(config.exit_flush_ms, 2_000);
        assert!(!config.disabled);
    }

    #[test]
    fn valid_values() {
        let (config, warnings) = parse(&[
            (ENV_ENDPOINT, "http://10.1.2.3:5000"),
            (ENV_SERVICE_NAME, "svc"),
            (ENV_CAPTURE, "Content"),
            (ENV_QUEUE_EVENTS, "16"),
            (ENV_EXIT_FLUSH_MS, "0"),
            (ENV_DISABLED, "yes"),
        ]);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(config.endpoint, "http://10.1.2.3:5000");
        assert_eq!(config.service_name, "svc");
        assert_eq!(config.capture, CaptureLevel::Content);
        assert_eq!(config.queue_events, 16);
        assert_eq!(config.exit_flush_ms, 0);
        assert!(config.disabled);
    }

    #[test]
    fn bad_values_warn_and_use_defaults() {
        let (config, warnings) = parse(&[
            (ENV_ENDPOINT, "grpc://nowhere"),
            (ENV_CAPTURE, "everything"),
            (ENV_QUEUE_EVENTS, "0"),
            (ENV_EXIT_FLUSH_MS, "-5"),
            (ENV_DISABLED, "maybe"),
        ]);
        assert_eq!(config, ShimConfig::default());
        let vars: Vec<_> = warnings.iter().map(|w| w.var).collect();
        assert_eq!(
            vars,
            [
                ENV_DISABLED,
                ENV_ENDPOINT,
                ENV_CAPTURE,
                ENV_QUEUE_EVENTS,
                ENV_EXIT_FLUSH_MS
            ]
        );
        let text = warnings[2].to_string();
        assert!(
            text.contains("HERMES_COLLECTOR_CAPTURE=\"everything\""),
            "{text}"
        );
        assert!(text.contains("metadata"), "{text}");
        let (_, warnings) = parse(&[(ENV_ENDPOINT, "not a uri")]);
        assert_eq!(warnings.len(), 1);
        let (_, warnings) = parse(&[(ENV_QUEUE_EVENTS, "99999999999")]);
        assert_eq!(warnings.len(), 1);
    }

    #[test]
    fn empty_means_unset() {
        let (config, warnings) = parse(&[(ENV_CAPTURE, " "), (ENV_ENDPOINT, "")]);
        assert!(warnings.is_empty());
        assert_eq!(config, ShimConfig::default());
    }

    #[test]
    fn hooks_per_level() {
        assert_eq!(CaptureLevel::Metadata.hooks().len(), 15);
        assert_eq!(
            CaptureLevel::Content.hooks(),
            CaptureLevel::Metadata.hooks()
        );
        let lean = CaptureLevel::Lean.hooks();
        assert_eq!(lean.len(), 14);
        assert!(!lean.contains(&hooks::PRE_API_REQUEST));
        for level in [
            CaptureLevel::Lean,
            CaptureLevel::Metadata,
            CaptureLevel::Content,
        ] {
            assert!(level.hooks().iter().all(|h| !h.starts_with("transform_")));
        }
        for hook in METADATA_HOOKS {
            assert!(hook == hooks::PRE_API_REQUEST || lean.contains(&hook));
        }
    }
}
