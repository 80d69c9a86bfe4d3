//! What a trajectory is built from: each processed span reduced to a
//! [`SpanRecord`] (its kind, ids, times and scalar attributes), grouped by
//! the top-level session. Records are plain serde data so that a session's
//! records can be kept on disk between its turns (see [`crate::sink`]).

use std::collections::BTreeMap;

use hermes_span::common::v1::any_value::Value as Any;
use hermes_span::common::v1::{AnyValue, KeyValue};
use hermes_span::trace::v1::{ResourceSpans, Span};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What a span stands for in a trajectory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A turn (`invoke_agent`, with `hermes.turn_id` and no child session).
    Turn,
    /// One API attempt (`chat`).
    Chat,
    /// A tool call (`execute_tool`).
    Tool,
    /// A subagent (`invoke_agent` with `hermes.child_session_id`).
    Subagent,
}

/// One span, as much of it as a trajectory needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpanRecord {
    pub kind: Kind,
    /// The turn the span belongs to (`hermes.turn_id`).
    pub turn_id: String,
    /// The session whose turn this is: the child's own session
    /// (`hermes.session_id`) on a subagent's turn, else `session.id`.
    pub own_session: String,
    /// Lowercase hex span id and parent span id.
    pub span_id: String,
    pub parent_span_id: String,
    pub start_ns: u64,
    pub end_ns: u64,
    /// Status code 2 (ERROR).
    pub error: bool,
    /// Scalar attributes (strings, numbers, booleans) by key; string arrays
    /// joined with `,`.
    pub attrs: BTreeMap<String, Value>,
}

impl SpanRecord {
    /// The string attribute `key`.
    pub fn str(&self, key: &str) -> Option<&str> {
        self.attrs.get(key).and_then(Value::as_str)
    }

    /// The integer attribute `key`.
    pub fn int(&self, key: &str) -> Option<i64> {
        self.attrs.get(key).and_then(Value::as_i64)
    }

    /// The boolean attribute `key`.
    pub fn bool(&self, key: &str) -> Option<bool> {
        self.attrs.get(key).and_then(Value::as_bool)
    }
}

/// The agent process that sent a session's spans (its resource).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentInfo {
    /// `service.name`.
    pub service: String,
    /// `service.instance.id`.
    pub instance: String,
    /// `hermes.capture`: `content` when the spans carry messages.
    pub capture: String,
    /// `hermes.shim.version`.
    pub shim_version: String,
    /// Every scalar attribute of the resource (these four included), for
    /// the trajectory's OTLP log record ([`crate::logs`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resource: BTreeMap<String, Value>,
}

impl AgentInfo {
    /// Whether this agent's spans carry the messages a trajectory needs.
    pub fn has_messages(&self) -> bool {
        self.capture == "content"
    }
}

/// The records of one top-level session found in a batch.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRecords {
    /// `session.id` (the top-level session).
    pub session_id: String,
    pub agent: AgentInfo,
    pub records: Vec<SpanRecord>,
}

/// Reduces `batch` to records grouped by agent and top-level session, in
/// the batch's order. Spans without `session.id` or of no trajectory kind
/// (approvals) are left out.
pub fn records_of(batch: &[ResourceSpans]) -> Vec<SessionRecords> {
    let mut out: Vec<SessionRecords> = Vec::new();
    for rs in batch {
        let resource = rs
            .resource
            .as_ref()
            .map(|r| &r.attributes[..])
            .unwrap_or(&[]);
        let agent = AgentInfo {
            service: string(resource, "service.name").unwrap_or_default(),
            instance: string(resource, "service.instance.id").unwrap_or_default(),
            capture: string(resource, "hermes.capture").unwrap_or_default(),
            shim_version: string(resource, "hermes.shim.version").unwrap_or_default(),
            resource: resource
                .iter()
                .filter_map(|kv| Some((kv.key.to_string(), scalar(kv.value.as_ref()?)?)))
                .collect(),
        };
        for span in rs.scope_spans.iter().flat_map(|ss| ss.spans.iter()) {
            let Some((session_id, record)) = record_of(span) else {
                continue;
            };
            match out
                .iter_mut()
                .find(|s| s.session_id == session_id && s.agent == agent)
            {
                Some(s) => s.records.push(record),
                None => out.push(SessionRecords {
                    session_id,
                    agent: agent.clone(),
                    records: vec![record],
                }),
            }
        }
    }
    out
}

fn record_of(span: &Span) -> Option<(String, SpanRecord)> {
    let attrs = &span.attributes;
    let session_id = string(attrs, "session.id")?;
    let operation = string(attrs, "gen_ai.operation.name").unwrap_or_default();
    let kind = match operation.as_str() {
        "chat" => Kind::Chat,
        "execute_tool" => Kind::Tool,
        "invoke_agent" if string(attrs, "hermes.child_session_id").is_some() => Kind::Subagent,
        "invoke_agent" => Kind::Turn,
        _ => return None,
    };
    let own_session = string(attrs, "hermes.session_id").unwrap_or_else(|| session_id.clone());
    let mut map = BTreeMap::new();
    for kv in attrs {
        if let Some(v) = kv.value.as_ref().and_then(scalar) {
            map.insert(kv.key.to_string(), v);
        }
    }
    let record = SpanRecord {
        kind,
        turn_id: string(attrs, "hermes.turn_id").unwrap_or_default(),
        own_session,
        span_id: hex(&span.span_id),
        parent_span_id: hex(&span.parent_span_id),
        start_ns: span.start_time_unix_nano,
        end_ns: span.end_time_unix_nano,
        error: span.status.as_ref().is_some_and(|s| s.code == 2),
        attrs: map,
    };
    Some((session_id, record))
}

fn string(attrs: &[KeyValue], key: &str) -> Option<String> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| match &v.value {
            Some(Any::StringValue(s)) => Some(s.to_string()),
            _ => None,
        })
}

fn scalar(value: &AnyValue) -> Option<Value> {
    Some(match value.value.as_ref()? {
        Any::StringValue(s) => Value::String(s.to_string()),
        Any::BoolValue(b) => Value::Bool(*b),
        Any::IntValue(i) => Value::from(*i),
        Any::DoubleValue(d) => Value::from(*d),
        Any::ArrayValue(a) => Value::String(
            a.values
                .iter()
                .filter_map(|v| match &v.value {
                    Some(Any::StringValue(s)) => Some(s.as_str()),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join(","),
        ),
        _ => return None,
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
