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
    /// Rules that replace secrets and personal data in every attribute value
    /// (span, event, link, scope and resource attributes, JSON text included)
    /// before export.
    pub redaction: RedactionConfig,
    /// Longest string attribute value in bytes; longer values are cut on a
    /// UTF-8 character boundary, JSON values so that they stay valid JSON, and
    /// the span lists the cut keys in `hermes.truncated_attributes`. `null`
    /// means unlimited. Minimum 32. Default: 4096 (Tempo's default limit is
    /// 2048).
    pub max_attribute_bytes: Option<usize>,
}

impl Default for ProcessorConfig {
    fn default() -> Self {
        Self {
            attribute_sets: vec![AttributeSet::GenAi],
            redaction: RedactionConfig::default(),
            max_attribute_bytes: Some(4096),
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
    /// Default: `api_key`, `authorization`, `proxy_authorization`, `cookie`,
    /// `set_cookie`, `password`, `secret`, `token`, `access_token`,
    /// `refresh_token`, `*_api_key`, `*_token`, `*_secret`.
    pub key_names: Vec<String>,
    /// Regular expressions (Rust `regex` syntax) whose matches are replaced
    /// inside every string value, and inside every string and object key of
    /// JSON text. A pattern must not match the empty string. Default: bearer
    /// tokens, OpenAI/Anthropic (`sk-…`), AWS (`AKIA…`), GitHub (`gh?_…`) and
    /// Slack (`xox?-…`) keys, e-mail addresses.
    pub value_patterns: Vec<String>,
    /// What a redacted value or match becomes. Default: `<redacted>`.
    pub replacement: String,
}

/// The default `redaction.key_names`.
pub const DEFAULT_KEY_NAMES: &[&str] = &[
    "api_key",
    "authorization",
    "proxy_authorization",
    "cookie",
    "set_cookie",
    "password",
    "secret",
    "token",
    "access_token",
    "refresh_token",
    "*_api_key",
    "*_token",
    "*_secret",
];

/// The default `redaction.value_patterns`. The word-boundary anchors keep
/// ordinary words (`task-…`, `mask-…`) from matching the key prefixes; they
/// are ASCII ones (`(?-u:\b)`) because a Unicode `\b` makes the regex engine
/// fall back to a slower matcher on non-ASCII text.
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
