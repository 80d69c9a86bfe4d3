//! The `processing:` section of the collector's configuration.
//!
//! Owns the config structs (their doc comments are the user documentation),
//! their defaults and their validation. Validation is pure (no I/O) and is
//! the same code that compiles the rules for [`crate::SpanProcessor`], so a
//! config that validates always builds a processor.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The smallest accepted `max_attribute_bytes`: room for a truncated JSON
/// object's marker (`{"_truncated":true}`) with some content.
pub const MIN_ATTRIBUTE_BYTES: usize = 32;

/// Span processing applied to every batch before export, in this order:
/// attribute sets, redaction, truncation.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProcessorConfig {
    /// Attribute vocabularies to emit. `gen_ai` (the OpenTelemetry GenAI
    /// semantic conventions the correlator produces) is always on, listed or
    /// not; `openinference` (Arize Phoenix) and `langfuse` add attributes
    /// derived from the `gen_ai.*` ones, so those backends display the spans
    /// natively. Default: `[gen_ai]`.
    pub attribute_sets: Vec<AttributeSet>,
    /// Rules that replace secrets and personal data in every string a span
    /// exports (attribute values and keys of spans, events, links, scopes
    /// and resources, JSON text included; span and event names; status
    /// messages; the scope's name and version) before export.
    pub redaction: RedactionConfig,
    /// Longest string attribute value and status message in bytes; longer
    /// ones are cut on a UTF-8 character boundary, JSON values so that they
    /// stay valid JSON, and the span lists the cut attribute keys in
    /// `hermes.truncated_attributes`. `null` means unlimited. Minimum 32.
    /// Default: 4096 (Tempo's default limit is 2048). Span, event and scope
    /// names and attribute keys are cut to [`crate::MAX_NAME_BYTES`] (256)
    /// whatever this says.
    pub max_attribute_bytes: Option<usize>,
    /// Which backend project, trace name, user and tags each agent's spans
    /// get (used by the `openinference` and `langfuse` attribute sets).
    pub routing: RoutingConfig,
}

impl Default for ProcessorConfig {
    fn default() -> Self {
        Self {
            attribute_sets: vec![AttributeSet::GenAi],
            redaction: RedactionConfig::default(),
            max_attribute_bytes: Some(4096),
            routing: RoutingConfig::default(),
        }
    }
}

/// The default template of `routing.project_name`,
/// `routing.langfuse.trace_name` and `routing.langfuse.tags`: the agent's
/// `service.name` (the shim's `HERMES_COLLECTOR_SERVICE_NAME`).
pub const DEFAULT_ROUTING_TEMPLATE: &str = "{service.name}";

/// Per-backend routing. Every value is a template: text with `{key}`
/// placeholders naming resource attributes of the agent
/// (`{service.name}`, `{deployment.environment}`), or a fixed name. A
/// template whose attribute is missing renders nothing and the attribute is
/// not set. An attribute the agent already sends is never replaced.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RoutingConfig {
    /// The Arize Phoenix project (resource attribute
    /// `openinference.project.name`), with the `openinference` set on.
    /// `null`: not set (Phoenix's `default` project). Default:
    /// `{service.name}`.
    pub project_name: Option<String>,
    /// Langfuse trace-level attributes, with the `langfuse` set on.
    pub langfuse: LangfuseRoutingConfig,
}

impl Default for RoutingConfig {
    fn default() -> Self {
        Self {
            project_name: Some(DEFAULT_ROUTING_TEMPLATE.to_owned()),
            langfuse: LangfuseRoutingConfig::default(),
        }
    }
}

/// Langfuse trace-level attributes (Langfuse's OpenTelemetry property
/// mapping). The session is always the Hermes session (`session.id`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LangfuseRoutingConfig {
    /// `langfuse.trace.name`, set on every span. `null`: the root span's
    /// name, on the root span (`invoke_agent hermes`). Default: `{service.name}`.
    pub trace_name: Option<String>,
    /// `langfuse.user.id`, set on every span. `null`: the span's `user.id`,
    /// else `enduser.id` (Hermes sets neither). Default: `null`.
    pub user_id: Option<String>,
    /// `langfuse.trace.tags`, set on every span; tags that do not render
    /// are left out. Default: `[{service.name}]`.
    pub tags: Vec<String>,
}

impl Default for LangfuseRoutingConfig {
    fn default() -> Self {
        Self {
            trace_name: Some(DEFAULT_ROUTING_TEMPLATE.to_owned()),
            user_id: None,
            tags: vec![DEFAULT_ROUTING_TEMPLATE.to_owned()],
        }
    }
}

/// An attribute vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AttributeSet {
    /// OpenTelemetry GenAI semantic conventions (`gen_ai.*`); always on.
    GenAi,
    /// OpenInference (`openinference.span.kind`, `llm.*`, `tool.*`,
    /// `input.value`, `output.value`), read by Arize Phoenix.
    #[serde(rename = "openinference")]
    OpenInference,
    /// Langfuse's OTLP ingestion attributes (`langfuse.*`).
    Langfuse,
}

impl fmt::Display for AttributeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AttributeSet::GenAi => "gen_ai",
            AttributeSet::OpenInference => "openinference",
            AttributeSet::Langfuse => "langfuse",
        })
    }
}

/// Redaction rules. Setting a list replaces its defaults; an empty list
/// switches that kind of rule off.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedactionConfig {
    /// Keys whose whole value is replaced: attribute keys (the full key or
    /// its last dot-separated segment, so `http.request.header.authorization`
    /// matches `authorization`), key-value list keys, and object keys inside
    /// JSON text. Compared ignoring case, `-` and `_` (`API-Key`, `api_key`
    /// and `apiKey` are the same key); `*` matches any run of characters.
    /// Default: `authorization`, `proxy_authorization`, `cookie`,
    /// `set_cookie`, `token`, `*_token`, `*apikey*`, `*password*`,
    /// `*passwd*`, `*passphrase*`, `*secret*`, `*credential*`,
    /// `*private*key*`, `*connection_string*`, `dsn`, `*_dsn` (so
    /// `db_password`, `privateKey`, `credentials`, `AWS_SECRET_ACCESS_KEY`
    /// and `x-api-key` match, `max_tokens` and `input_tokens` do not).
    pub key_names: Vec<String>,
    /// Regular expressions (Rust `regex` syntax) whose matches are replaced
    /// inside every exported string (attribute values and keys, span and
    /// event names, status messages), and inside every string and object
    /// key of JSON text. A pattern must not match the empty string, and
    /// should contain a literal every match holds (a pattern without one
    /// makes every string go through the regular expressions). Default:
    /// bearer tokens, `Authorization:` header values (Basic included), URL
    /// credentials (`scheme://user:password@`, connection strings
    /// included), JWTs, PEM private key blocks, `VAR=value`,
    /// `VAR: value` and `--flag value` assignments of secret-looking names
    /// (`PGPASSWORD=…`, `AWS_SECRET_ACCESS_KEY=…`, `api_key: …`,
    /// `--password …`), Azure `AccountKey=`/`SharedAccessKey=`, and the keys
    /// and tokens of OpenAI/Anthropic (`sk-…`), AWS (`AKIA…`), Google
    /// (`AIza…`, `ya29.…`), GitHub (`gh?_…`, `github_pat_…`), GitLab
    /// (`glpat-…`), Slack (`xox?-…`), Stripe (`sk_live_…`, `rk_test_…`),
    /// SendGrid (`SG.…`), Hugging Face (`hf_…`), npm (`npm_…`) and PyPI
    /// (`pypi-…`); e-mail addresses.
    pub value_patterns: Vec<String>,
    /// What a redacted value or match becomes. Default: `<redacted>`.
    pub replacement: String,
}

/// The default `redaction.key_names`: the names secret scanners
/// (gitleaks, trufflehog, detect-secrets) treat as holding a secret. `token`
/// and `*_token` rather than `*token*`, so that token counts
/// (`max_tokens`, `gen_ai.usage.input_tokens`, `tokens_used`) stay.
pub const DEFAULT_KEY_NAMES: &[&str] = &[
    "authorization",
    "proxy_authorization",
    "cookie",
    "set_cookie",
    "token",
    "*_token",
    "*apikey*",
    "*password*",
    "*passwd*",
    "*passphrase*",
    "*secret*",
    "*credential*",
    "*private*key*",
    "*connection_string*",
    "dsn",
    "*_dsn",
];

/// The default `redaction.value_patterns`. The word-boundary anchors keep
/// ordinary words (`task-…`, `mask-…`) from matching the key prefixes; they
/// are ASCII ones (`(?-u:\b)`) because a Unicode `\b` makes the regex engine
/// fall back to a slower matcher on non-ASCII text. No pattern ends with an
/// anchor, so cutting a string after redaction cannot make a new match.
/// Every pattern holds a literal that each of its matches contains (`sk-`,
/// `://`, `eyJ`, `password`, ...), which the prefilter (`prefilter.rs`)
/// searches before running the regex. Case-insensitive words are ASCII-only
/// (`(?-u:…)`): Unicode case folding would also match `ſ` for `s` and the
/// Kelvin sign for `k`, which no ASCII literal finds, and so would switch
/// the prefilter off.
pub const DEFAULT_VALUE_PATTERNS: &[&str] = &[
    // Authorization header values.
    r"(?i)(?-u:\b)bearer\s+[a-z0-9._~+/-]+=*",
    // Anthropic and OpenAI API keys.
    r"(?-u:\b)sk-ant-[A-Za-z0-9_-]{16,}",
    r"(?-u:\b)sk-[A-Za-z0-9_-]{16,}",
    // AWS access key ids.
    r"(?-u:\b)AKIA[0-9A-Z]{16}",
    // GitHub tokens (ghp_, gho_, ghu_, ghs_, ghr_).
    r"(?-u:\b)gh[pousr]_[A-Za-z0-9]{30,}",
    // Slack tokens.
    r"(?-u:\b)xox[abpr]-[A-Za-z0-9-]{10,}",
    // E-mail addresses.
    r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}",
    // The value of an Authorization (or Proxy-Authorization) header in
    // text, whatever its scheme: `Authorization: Basic dXNlcjpwYXNz`.
    r#"(?i)(?-u:\b)authorization["']?\s*[:=]\s*["']?(?:[a-z]+\s+)?[^\s"',;]+"#,
    // Credentials in a URL or connection string: `postgres://user:pw@`,
    // `mongodb+srv://u:p@`, `redis://:pw@`.
    r"(?i)(?-u:\b)[a-z][a-z0-9+.-]*://[^\s/?#@:]*:[^\s/?#@]+@",
    // JSON Web Tokens (header and payload are base64url JSON: `eyJ`).
    r"(?-u:\b)eyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*",
    // PEM private key blocks (RSA, EC, OPENSSH, ENCRYPTED, PKCS#8), up to
    // their END line, or to the end of the text when it is missing.
    r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY-----[^-]*(?:-----END[A-Z0-9 ]*PRIVATE KEY-----)?",
    // `NAME=value`, `NAME: value`, `"name": "value"` where the name ends
    // with a secret-looking word: `PGPASSWORD=x`, `export DB_PASSWORD=x`,
    // `AWS_SECRET_ACCESS_KEY=x`, `privateKey: x`, `GITHUB_TOKEN=x`. The
    // word must end the name, so `tokens_used=5` and `max_tokens: 9` stay.
    r#"(?i)(?-u:\b)[a-z0-9_.-]*(?-u:password|passwd|passphrase|secret|token|api_key|apikey|access_key|accesskey|secret_key|secretkey|private_key|privatekey|credential|credentials)["']?\s*[:=]\s*(?:"[^"\n]*"?|'[^'\n]*'?|[^\s"',;&|]+)"#,
    // Command-line flags: `--password x`, `--api-key=x`, `--token x`.
    r#"(?i)--(?:[a-z0-9]+-)*(?-u:password|passwd|passphrase|secret|token|api-key|apikey)(?:=|\s+)[^\s"'-][^\s"']*"#,
    // Azure storage and service bus connection string keys.
    r"(?i)(?-u:\b)(?-u:AccountKey|SharedAccessKey)=[A-Za-z0-9+/=]{16,}",
    // Google API keys and OAuth access tokens.
    r"(?-u:\b)AIza[0-9A-Za-z_-]{35}",
    r"(?-u:\b)ya29\.[0-9A-Za-z_-]{20,}",
    // GitHub fine-grained and GitLab personal access tokens.
    r"(?-u:\b)github_pat_[A-Za-z0-9_]{22,}",
    r"(?-u:\b)glpat-[A-Za-z0-9_-]{20,}",
    // Stripe secret and restricted keys.
    r"(?-u:\b)(?:sk_live|sk_test|rk_live|rk_test)_[0-9A-Za-z]{16,}",
    // SendGrid API keys.
    r"(?-u:\b)SG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}",
    // Hugging Face, npm and PyPI tokens.
    r"(?-u:\b)hf_[A-Za-z0-9]{30,}",
    r"(?-u:\b)npm_[A-Za-z0-9]{36}",
    r"(?-u:\b)pypi-AgEIcHlwaS5vcmc[A-Za-z0-9_-]{16,}",
];

/// The default `redaction.replacement`.
pub const DEFAULT_REPLACEMENT: &str = "<redacted>";

impl Default for RedactionConfig {
    fn default() -> Self {
        Self {
            key_names: DEFAULT_KEY_NAMES.iter().map(|s| (*s).to_owned()).collect(),
            value_patterns: DEFAULT_VALUE_PATTERNS
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
            replacement: DEFAULT_REPLACEMENT.to_owned(),
        }
    }
}

/// A configuration value the processor cannot use. Each variant names the
/// offending setting by its path inside the `processing:` section.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A value pattern is not a valid regular expression.
    #[error("redaction.value_patterns[{index}]: invalid regular expression: {source}")]
    InvalidValuePattern {
        index: usize,
        #[source]
        source: regex::Error,
    },
    /// A value pattern matches the empty string, so it would insert the
    /// replacement between every two characters.
    #[error("redaction.value_patterns[{index}]: `{pattern}` matches the empty string")]
    EmptyMatchingValuePattern { index: usize, pattern: String },
    /// The value patterns compile one by one but not together (size limit).
    #[error("redaction.value_patterns: the patterns together are too large: {source}")]
    ValuePatternsTooLarge {
        #[source]
        source: regex::Error,
    },
    /// A key name is empty or made of wildcards and separators only.
    #[error("redaction.key_names[{index}]: `{name}` {reason}")]
    InvalidKeyName {
        index: usize,
        name: String,
        reason: &'static str,
    },
    /// An attribute set is listed twice.
    #[error("attribute_sets[{index}]: `{set}` is listed twice")]
    DuplicateAttributeSet { index: usize, set: AttributeSet },
    /// `max_attribute_bytes` is too small to hold a truncated JSON value.
    #[error("max_attribute_bytes: {value} is below the minimum of {MIN_ATTRIBUTE_BYTES}")]
    AttributeLimitTooSmall { value: usize },
    /// A `routing` template cannot be parsed.
    #[error(
        "{path}: `{template}` {reason} (a template is text with `{{key}}` placeholders naming resource attributes, e.g. `{{service.name}}`)"
    )]
    InvalidTemplate {
        path: String,
        template: String,
        reason: &'static str,
    },
}

impl ConfigError {
    /// Path of the offending setting inside the `processing:` section, e.g.
    /// `redaction.value_patterns[2]`.
    pub fn path(&self) -> String {
        match self {
            ConfigError::InvalidValuePattern { index, .. }
            | ConfigError::EmptyMatchingValuePattern { index, .. } => {
                format!("redaction.value_patterns[{index}]")
            }
            ConfigError::ValuePatternsTooLarge { .. } => "redaction.value_patterns".to_owned(),
            ConfigError::InvalidKeyName { index, .. } => format!("redaction.key_names[{index}]"),
            ConfigError::DuplicateAttributeSet { index, .. } => format!("attribute_sets[{index}]"),
            ConfigError::AttributeLimitTooSmall { .. } => "max_attribute_bytes".to_owned(),
            ConfigError::InvalidTemplate { path, .. } => path.clone(),
        }
    }
}

impl ProcessorConfig {
    /// Checks every setting; the first problem found is returned. Pure: no
    /// I/O, no global state.
    pub fn validate(&self) -> Result<(), ConfigError> {
        crate::Compiled::new(self).map(|_| ())
    }

    /// Checks the settings that need no compilation.
    pub(crate) fn validate_plain(&self) -> Result<(), ConfigError> {
        for (index, set) in self.attribute_sets.iter().enumerate() {
            if self.attribute_sets[..index].contains(set) {
                return Err(ConfigError::DuplicateAttributeSet { index, set: *set });
            }
        }
        if let Some(value) = self.max_attribute_bytes
            && value < MIN_ATTRIBUTE_BYTES
        {
            return Err(ConfigError::AttributeLimitTooSmall { value });
        }
        Ok(())
    }

    /// Whether `set` is on (`gen_ai` always is).
    pub fn has(&self, set: AttributeSet) -> bool {
        set == AttributeSet::GenAi || self.attribute_sets.contains(&set)
    }
}
