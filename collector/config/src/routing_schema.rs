//! The schema of `processing.routing`, whose types belong to
//! `hermes-processor` (which does not depend on `schemars`): the same keys
//! and docs, the processor's defaults. The schema test (`tests/schema.rs`) checks it
//! against what the processor serializes.

/// Which backend project, trace name, user and tags each agent's spans get
/// (used by the `openinference` and `langfuse` attribute sets). Every value
/// is a template: text with `{key}` placeholders naming resource attributes
/// of the agent (`{service.name}`, `{deployment.environment}`), or a fixed
/// name. A template whose attribute is missing renders nothing and the
/// attribute is not set; an attribute the agent already sends is kept.
#[derive(schemars::JsonSchema)]
#[schemars(rename = "RoutingConfig")]
#[serde(deny_unknown_fields, default)]
#[allow(dead_code)]
pub(crate) struct RoutingSchema {
    /// The Arize Phoenix project (resource attribute
    /// `openinference.project.name`), with the `openinference` set on.
    /// `null`: not set (Phoenix's `default` project).
    project_name: Option<String>,
    /// Langfuse trace-level attributes, with the `langfuse` set on.
    langfuse: LangfuseRoutingSchema,
}

impl Default for RoutingSchema {
    fn default() -> Self {
        let defaults = hermes_processor::RoutingConfig::default();
        Self {
            project_name: defaults.project_name,
            langfuse: LangfuseRoutingSchema::default(),
        }
    }
}

/// Langfuse trace-level attributes (Langfuse's OpenTelemetry property
/// mapping). The session is always the Hermes session (`session.id`).
#[derive(schemars::JsonSchema)]
#[schemars(rename = "LangfuseRoutingConfig")]
#[serde(deny_unknown_fields, default)]
#[allow(dead_code)]
struct LangfuseRoutingSchema {
    /// `langfuse.trace.name`, set on every span. `null`: the root span's
    /// name, on the root span (`invoke_agent hermes`).
    trace_name: Option<String>,
    /// `langfuse.user.id`, set on every span. `null`: the span's `user.id`,
    /// else `enduser.id` (Hermes sets neither).
    user_id: Option<String>,
    /// `langfuse.trace.tags`, set on every span; tags that do not render
    /// are left out.
    tags: Vec<String>,
}

impl Default for LangfuseRoutingSchema {
    fn default() -> Self {
        let defaults = hermes_processor::LangfuseRoutingConfig::default();
        Self {
            trace_name: defaults.trace_name,
            user_id: defaults.user_id,
            tags: defaults.tags,
        }
    }
}
