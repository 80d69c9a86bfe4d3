//! The JSON schema of the configuration file.

use crate::Config;

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
pub(crate) struct ProcessingSchema {
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
