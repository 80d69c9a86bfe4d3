//! Attribute sets: extra vocabularies derived from the `gen_ai.*` attributes.
//!
//! Owns the mapping from the correlator's GenAI semantic-convention
//! attributes (see `docs/TRACE_MODEL.md`) to
//! - OpenInference, read by Arize Phoenix. Names from the OpenInference
//!   specification (`spec/semantic_conventions.md` of Arize-ai/openinference):
//!   `openinference.span.kind`, `llm.model_name`, `llm.provider`,
//!   `llm.token_count.*`, `tool.name`, `tool.id` (the spec has no
//!   `tool.call_id`; `tool.id` is "the identifier for the result of the tool
//!   call, corresponding to `tool_call.id`"), `agent.name`, `session.id`,
//!   `input.value`/`input.mime_type`, `output.value`/`output.mime_type`;
//! - Langfuse's OTLP ingestion. The documentation corpus available holds
//!   Langfuse's property-mapping page only in part (plus third-party copies of
//!   the `LangfuseOtelSpanAttributes` enum of its JS SDK), so the names were
//!   checked against Langfuse's server source, which is what ingests them:
//!   the enum in langfuse/langfuse
//!   `packages/shared/src/server/otel/attributes.ts`, `ObservationTypeMapper.ts`
//!   and `OtelIngestionProcessor.ts` next to it.
//!   Observation types are the lowercase values its
//!   `ObservationTypeMapper` accepts (`generation`, `tool`, `agent`, `span`).
//!   `langfuse.session.id`/`langfuse.user.id` are the compatibility names
//!   Langfuse still maps to the trace's session and user.
//!   `langfuse.observation.usage_details` follows Langfuse's own
//!   normalization of GenAI usage (`extractUsageDetails`): `input` and
//!   `output` exclude the cache and reasoning counts listed beside them
//!   (`input_cached_tokens`, `input_cache_creation`,
//!   `output_reasoning_tokens`), `total` is all of them, so costs are not
//!   counted twice.
//!
//! Invariants: derived attributes are only added, never overwrite an
//! attribute the span already has (so processing twice adds nothing), and a
//! derived attribute is only added when its source is present. Content is
//! copied as is; redaction and truncation run afterwards on every attribute,
//! derived ones included.

use hermes_span::Str;
use hermes_span::common::v1::{AnyValue, KeyValue, any_value::Value};
use hermes_span::trace::v1::{Span, status::StatusCode};

use crate::json::{self, Json};
use crate::routing::{self, LANGFUSE_TRACE_NAME, LANGFUSE_TRACE_TAGS, LANGFUSE_USER_ID};

/// What a span is, from `gen_ai.operation.name`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `invoke_agent`: turns and subagents.
    Agent,
    /// `chat`: one API attempt.
    Chat,
    /// `execute_tool`.
    Tool,
    /// Anything else (approvals, spans from elsewhere).
    Other,
}

impl Kind {
    /// This kind's word in a vocabulary that names agent, chat, tool and
    /// other spans, in that order.
    fn in_vocabulary(self, [agent, chat, tool, other]: [&'static str; 4]) -> &'static str {
        match self {
            Kind::Agent => agent,
            Kind::Chat => chat,
            Kind::Tool => tool,
            Kind::Other => other,
        }
    }
}

/// `openinference.span.kind` of agent, chat, tool and other spans.
const OPENINFERENCE_SPAN_KINDS: [&str; 4] = ["AGENT", "LLM", "TOOL", "CHAIN"];

/// `langfuse.observation.type` of agent, chat, tool and other spans.
const LANGFUSE_OBSERVATION_TYPES: [&str; 4] = ["agent", "generation", "tool", "span"];

/// Read access to a span's attributes by key.
struct View<'a>(&'a [KeyValue]);

impl<'a> View<'a> {
    fn value(&self, key: &str) -> Option<&'a Value> {
        self.0
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.as_ref())
            .and_then(|v| v.value.as_ref())
    }

    /// A non-empty string attribute.
    fn str(&self, key: &str) -> Option<&'a str> {
        match self.value(key) {
            Some(Value::StringValue(s)) if !s.is_empty() => Some(s),
            _ => None,
        }
    }

    fn int(&self, key: &str) -> Option<i64> {
        match self.value(key) {
            Some(Value::IntValue(i)) => Some(*i),
            Some(Value::DoubleValue(d)) if d.is_finite() => Some(*d as i64),
            Some(Value::StringValue(s)) => s.parse().ok(),
            _ => None,
        }
    }

    fn bool(&self, key: &str) -> Option<bool> {
        match self.value(key) {
            Some(Value::BoolValue(b)) => Some(*b),
            _ => None,
        }
    }

    fn kind(&self) -> Kind {
        match self.str("gen_ai.operation.name") {
            Some("invoke_agent") => Kind::Agent,
            Some("chat") => Kind::Chat,
            Some("execute_tool") => Kind::Tool,
            _ => Kind::Other,
        }
    }

    /// The span's input and output content, by kind.
    fn content(&self, kind: Kind) -> (Option<&'a str>, Option<&'a str>) {
        match kind {
            Kind::Chat => (
                self.str("gen_ai.input.messages"),
                self.str("gen_ai.output.messages"),
            ),
            Kind::Tool => (
                self.str("gen_ai.tool.call.arguments"),
                self.str("gen_ai.tool.call.result"),
            ),
            Kind::Agent => (
                self.str("hermes.turn.user_message")
                    .or_else(|| self.str("hermes.subagent.goal")),
                self.str("hermes.turn.final_answer")
                    .or_else(|| self.str("hermes.subagent.summary")),
            ),
            Kind::Other if self.str("hermes.approval.pattern_key").is_some() => (
                self.str("hermes.approval.command"),
                self.str("hermes.approval.choice"),
            ),
            Kind::Other => (None, None),
        }
    }

    /// The model that answered, else the one requested.
    fn model(&self) -> Option<&'a str> {
        self.str("gen_ai.response.model")
            .or_else(|| self.str("gen_ai.request.model"))
    }

    fn session_id(&self) -> Option<&'a str> {
        self.str("session.id")
            .or_else(|| self.str("gen_ai.conversation.id"))
    }

    fn usage(&self) -> Usage {
        Usage {
            input: self.int("gen_ai.usage.input_tokens"),
            output: self.int("gen_ai.usage.output_tokens"),
            cache_read: self.int("gen_ai.usage.cache_read.input_tokens"),
            cache_creation: self.int("gen_ai.usage.cache_creation.input_tokens"),
            reasoning: self.int("gen_ai.usage.reasoning.output_tokens"),
        }
    }
}

/// Token counts of a chat span. `input` includes the cache counts and
/// `output` the reasoning count, as in the GenAI conventions.
#[derive(Debug, Clone, Copy)]
struct Usage {
    input: Option<i64>,
    output: Option<i64>,
    cache_read: Option<i64>,
    cache_creation: Option<i64>,
    reasoning: Option<i64>,
}

impl Usage {
    fn total(&self) -> Option<i64> {
        match (self.input, self.output) {
            (None, None) => None,
            (i, o) => Some(i.unwrap_or(0).saturating_add(o.unwrap_or(0))),
        }
    }
}

/// Attributes under construction.
#[derive(Default)]
struct Additions(Vec<KeyValue>);

impl Additions {
    fn push(&mut self, key: &'static str, value: Value) {
        self.0.push(KeyValue {
            key: Str::from_static(key),
            value: Some(AnyValue { value: Some(value) }),
        });
    }

    fn str(&mut self, key: &'static str, value: Option<&str>) {
        if let Some(v) = value {
            self.push(key, Value::StringValue(v.into()));
        }
    }

    fn int(&mut self, key: &'static str, value: Option<i64>) {
        if let Some(v) = value {
            self.push(key, Value::IntValue(v));
        }
    }
}

fn mime_type(text: &str) -> &'static str {
    if json::is_container(text) {
        "application/json"
    } else {
        "text/plain"
    }
}

/// Adds the attributes of the enabled sets to `span`; `route` holds the
/// Langfuse trace-level values of its resource (`routing.rs`).
pub(crate) fn derive(
    span: &mut Span,
    openinference: bool,
    langfuse: bool,
    route: &routing::Rendered,
) {
    if !openinference && !langfuse {
        return;
    }
    let mut add = Additions::default();
    {
        let view = View(&span.attributes);
        if openinference {
            add_openinference(&view, &mut add);
        }
        if langfuse {
            add_langfuse(span, &view, route, &mut add);
        }
    }
    for kv in add.0 {
        if !span.attributes.iter().any(|a| a.key == kv.key) {
            span.attributes.push(kv);
        }
    }
}

fn add_openinference(view: &View<'_>, add: &mut Additions) {
    let kind = view.kind();
    let span_kind = kind.in_vocabulary(OPENINFERENCE_SPAN_KINDS);
    add.str("openinference.span.kind", Some(span_kind));
    add.str("session.id", view.session_id());
    match kind {
        Kind::Chat => {
            add.str("llm.model_name", view.model());
            add.str("llm.provider", view.str("gen_ai.provider.name"));
            let u = view.usage();
            add.int("llm.token_count.prompt", u.input);
            add.int("llm.token_count.completion", u.output);
            add.int("llm.token_count.total", u.total());
            add.int("llm.token_count.prompt_details.cache_read", u.cache_read);
            add.int(
                "llm.token_count.prompt_details.cache_write",
                u.cache_creation,
            );
            add.int("llm.token_count.completion_details.reasoning", u.reasoning);
        }
        Kind::Tool => {
            add.str("tool.name", view.str("gen_ai.tool.name"));
            add.str("tool.id", view.str("gen_ai.tool.call.id"));
        }
        Kind::Agent => add.str("agent.name", view.str("gen_ai.agent.name")),
        Kind::Other => {}
    }
    let (input, output) = view.content(kind);
    if let Some(text) = input {
        add.str("input.value", Some(text));
        add.str("input.mime_type", Some(mime_type(text)));
    }
    if let Some(text) = output {
        add.str("output.value", Some(text));
        add.str("output.mime_type", Some(mime_type(text)));
    }
}

fn add_langfuse(span: &Span, view: &View<'_>, route: &routing::Rendered, add: &mut Additions) {
    let kind = view.kind();
    let observation_type = kind.in_vocabulary(LANGFUSE_OBSERVATION_TYPES);
    add.str("langfuse.observation.type", Some(observation_type));
    add.str("langfuse.session.id", view.session_id());
    add.str(
        LANGFUSE_USER_ID,
        route
            .user_id
            .as_deref()
            .or_else(|| view.str("user.id"))
            .or_else(|| view.str("enduser.id")),
    );
    // Trace name and tags go on every span, as session and user do:
    // Langfuse filters and aggregates observations, and only reads a
    // trace-level attribute from the spans that carry it. Without a routed
    // name, the root span's name is the trace's (as Langfuse itself falls
    // back to it).
    let root_name =
        (span.parent_span_id.is_empty() && !span.name.is_empty()).then_some(&*span.name);
    add.str(
        LANGFUSE_TRACE_NAME,
        route.trace_name.as_deref().or(root_name),
    );
    if !route.tags.is_empty() {
        add.0
            .push(routing::string_array_kv(LANGFUSE_TRACE_TAGS, &route.tags));
    }
    if kind == Kind::Chat {
        add.str("langfuse.observation.model.name", view.model());
        add.str(
            "langfuse.observation.usage_details",
            usage_details(view.usage()).as_deref(),
        );
    }
    let (input, output) = view.content(kind);
    add.str("langfuse.observation.input", input);
    add.str("langfuse.observation.output", output);

    let status = span.status.as_ref();
    if status.is_some_and(|s| s.code == StatusCode::Error as i32) {
        add.str("langfuse.observation.level", Some("ERROR"));
        let message = status
            .map(|s| s.message.as_str())
            .filter(|m| !m.is_empty())
            .or_else(|| view.str("error.type"));
        add.str("langfuse.observation.status_message", message);
    } else if view.bool("hermes.incomplete") == Some(true) {
        add.str("langfuse.observation.level", Some("WARNING"));
    }
}

/// `langfuse.observation.usage_details` as JSON text, or `None` without
/// token counts.
fn usage_details(u: Usage) -> Option<String> {
    let total = u.total()?;
    let positive = |v: Option<i64>| v.filter(|n| *n > 0);
    let cache_read = positive(u.cache_read);
    let cache_creation = positive(u.cache_creation);
    let reasoning = positive(u.reasoning);
    let mut members: Vec<(String, Json)> = Vec::with_capacity(6);
    let mut member =
        |key: &str, value: i64| members.push((key.to_owned(), Json::Number(value.into())));
    if let Some(input) = u.input {
        let uncached = input
            .saturating_sub(cache_read.unwrap_or(0))
            .saturating_sub(cache_creation.unwrap_or(0))
            .max(0);
        member("input", uncached);
    }
    if let Some(n) = cache_read {
        member("input_cached_tokens", n);
    }
    if let Some(n) = cache_creation {
        member("input_cache_creation", n);
    }
    if let Some(output) = u.output {
        member(
            "output",
            output.saturating_sub(reasoning.unwrap_or(0)).max(0),
        );
    }
    if let Some(n) = reasoning {
        member("output_reasoning_tokens", n);
    }
    member("total", total);
    Some(Json::Object(members).to_text())
}
