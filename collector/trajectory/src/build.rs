//! Records of one top-level session → its ATIF [`Trajectory`].
//!
//! Pure: the same records give the same document. Steps follow ATIF's
//! rules: per turn the user's message (`hermes.turn.user_message`), then
//! one agent step per answered API attempt (`gen_ai.output.messages`: its
//! text, its tool calls) with that attempt's token counts, and the results
//! of its tool calls (`gen_ai.tool.call.result`) as the step's observation,
//! linked by call id. Failed attempts before an answer are named in the
//! answering step's `extra.failed_attempts`; failures with no answer after
//! them become a system step. A subagent's turns (their own session) become
//! an embedded subagent trajectory whose `trajectory_id` is the child
//! session id, referenced from the observation of the `delegate_task` call
//! that started it.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use crate::atif::{
    Agent, FinalMetrics, Metrics, Observation, ObservationResult, SCHEMA_VERSION, Source, Step,
    SubagentTrajectoryRef, ToolCall, Trajectory,
};
use crate::record::{AgentInfo, Kind, SpanRecord};
use crate::time::rfc3339;

/// How a session's trajectory came to be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The session ended (`on_session_finalize`/`reset`, or the stop).
    Ended,
    /// Nothing came for the configured idle time: written as incomplete.
    Idle,
}

/// The trajectory of `session_id` from its records.
pub fn build(
    session_id: &str,
    agent: &AgentInfo,
    records: &[SpanRecord],
    ending: Ending,
) -> Trajectory {
    let mut sorted: Vec<&SpanRecord> = records.iter().collect();
    sorted.sort_by(|a, b| (a.start_ns, &a.span_id).cmp(&(b.start_ns, &b.span_id)));
    let mut trajectory = session(session_id, agent, &sorted, &mut BTreeSet::new());
    if ending == Ending::Idle {
        let extra = trajectory.extra.get_or_insert_with(Map::new);
        extra.insert("incomplete".into(), Value::Bool(true));
        extra.insert("end_reason".into(), json!("idle"));
        trajectory.notes =
            Some("incomplete: the session did not end cleanly; written after its idle time".into());
    }
    trajectory
}

/// The trajectory of one session (top-level or a subagent's), its own
/// subagents embedded. `seen` guards against a session embedding itself.
fn session(
    session_id: &str,
    agent: &AgentInfo,
    records: &[&SpanRecord],
    seen: &mut BTreeSet<String>,
) -> Trajectory {
    seen.insert(session_id.to_owned());
    let synthesized = unseen_turns(session_id, records);
    let mut turns: Vec<&SpanRecord> = records
        .iter()
        .copied()
        .filter(|r| r.kind == Kind::Turn && r.own_session == session_id)
        .chain(synthesized.iter())
        .collect();
    turns.sort_by(|a, b| (a.start_ns, &a.turn_id).cmp(&(b.start_ns, &b.turn_id)));
    let turn_ids: BTreeSet<&str> = turns.iter().map(|t| t.turn_id.as_str()).collect();
    // Children first: a step can only reference an embedded trajectory.
    let mut children = Vec::new();
    for sub in records
        .iter()
        .filter(|r| r.kind == Kind::Subagent && turn_ids.contains(r.turn_id.as_str()))
    {
        let Some(child) = sub.str("hermes.child_session_id") else {
            continue;
        };
        if seen.contains(child)
            || !records
                .iter()
                .any(|r| r.kind == Kind::Turn && r.own_session == child)
        {
            continue;
        }
        let mut t = session(child, agent, records, seen);
        t.trajectory_id = Some(child.to_owned());
        if let Some(role) = sub.str("gen_ai.agent.name") {
            t.agent.name = role.to_owned();
        }
        children.push(t);
    }
    let embedded: BTreeSet<String> = children
        .iter()
        .filter_map(|c| c.trajectory_id.clone())
        .collect();
    let mut steps = Vec::new();
    let mut model = None;
    for turn in &turns {
        let in_turn: Vec<&SpanRecord> = records
            .iter()
            .copied()
            .filter(|r| r.turn_id == turn.turn_id && r.kind != Kind::Turn)
            .collect();
        turn_steps(turn, &in_turn, records, &embedded, &mut steps);
        if model.is_none() {
            model = turn.str("gen_ai.request.model").map(str::to_owned);
        }
    }
    for (i, step) in steps.iter_mut().enumerate() {
        step.step_id = i as u64 + 1;
    }
    let final_metrics = totals(&steps);
    let mut agent_extra = Map::new();
    agent_extra.insert("service.name".into(), json!(agent.service));
    agent_extra.insert("service.instance.id".into(), json!(agent.instance));
    Trajectory {
        schema_version: SCHEMA_VERSION.to_owned(),
        session_id: Some(session_id.to_owned()),
        trajectory_id: None,
        agent: Agent {
            name: turns
                .first()
                .and_then(|t| t.str("gen_ai.agent.name"))
                .unwrap_or("hermes")
                .to_owned(),
            version: if agent.shim_version.is_empty() {
                "unknown".to_owned()
            } else {
                agent.shim_version.clone()
            },
            model_name: model,
            extra: Some(agent_extra),
        },
        steps,
        notes: None,
        final_metrics: Some(final_metrics),
        continued_trajectory_ref: None,
        extra: None,
        subagent_trajectories: (!children.is_empty()).then_some(children),
    }
}

/// A turn record for each turn of `session_id` whose own span has not come
/// (a turn still open when its agent was killed): it starts with its
/// first span and has no user message.
fn unseen_turns(session_id: &str, records: &[&SpanRecord]) -> Vec<SpanRecord> {
    let known: BTreeSet<&str> = records
        .iter()
        .filter(|r| r.kind == Kind::Turn)
        .map(|r| r.turn_id.as_str())
        .collect();
    let mut out: Vec<SpanRecord> = Vec::new();
    for r in records.iter().filter(|r| {
        matches!(r.kind, Kind::Chat | Kind::Tool)
            && r.own_session == session_id
            && !known.contains(r.turn_id.as_str())
    }) {
        match out.iter_mut().find(|t| t.turn_id == r.turn_id) {
            Some(t) => {
                t.start_ns = t.start_ns.min(r.start_ns);
                t.end_ns = t.end_ns.max(r.end_ns);
            }
            None => out.push(SpanRecord {
                kind: Kind::Turn,
                turn_id: r.turn_id.clone(),
                own_session: session_id.to_owned(),
                span_id: String::new(),
                parent_span_id: String::new(),
                start_ns: r.start_ns,
                end_ns: r.end_ns,
                error: false,
                attrs: [(
                    "hermes.incomplete".to_owned(),
                    serde_json::Value::Bool(true),
                )]
                .into_iter()
                .collect(),
            }),
        }
    }
    out
}

/// The steps of one turn: the user's message, then each answered attempt.
fn turn_steps(
    turn: &SpanRecord,
    in_turn: &[&SpanRecord],
    all: &[&SpanRecord],
    embedded: &BTreeSet<String>,
    steps: &mut Vec<Step>,
) {
    if let Some(message) = turn.str("hermes.turn.user_message") {
        steps.push(step(Source::User, turn.start_ns, message.to_owned()));
    }
    let first_agent = steps.len();
    let mut failed: Vec<Value> = Vec::new();
    for chat in in_turn.iter().filter(|r| r.kind == Kind::Chat) {
        let Some(output) = chat.str("gen_ai.output.messages") else {
            if chat.error {
                failed.push(json!({
                    "attempt": chat.int("hermes.attempt"),
                    "error.type": chat.str("error.type"),
                }));
            }
            continue;
        };
        let (message, calls) = parse_output(output);
        let mut s = step(Source::Agent, chat.start_ns, message);
        s.model_name = chat
            .str("gen_ai.response.model")
            .or_else(|| chat.str("gen_ai.request.model"))
            .map(str::to_owned);
        s.tool_calls = (!calls.is_empty()).then_some(calls);
        s.metrics = Some(metrics(chat));
        s.llm_call_count = Some(1);
        if !failed.is_empty() {
            let extra = s.extra.get_or_insert_with(Map::new);
            extra.insert(
                "failed_attempts".into(),
                Value::Array(std::mem::take(&mut failed)),
            );
        }
        steps.push(s);
    }
    for tool in in_turn.iter().filter(|r| r.kind == Kind::Tool) {
        attach_tool(tool, all, embedded, &mut steps[first_agent..]);
    }
    if !failed.is_empty() {
        let mut s = step(
            Source::System,
            turn.end_ns,
            "the model request failed and was not answered".to_owned(),
        );
        s.extra = Some(Map::from_iter([(
            "failed_attempts".to_owned(),
            Value::Array(failed),
        )]));
        steps.push(s);
    }
    let unfinished = turn.bool("hermes.turn.completed") == Some(false)
        || turn.bool("hermes.incomplete") == Some(true);
    if let Some(last) = steps.last_mut().filter(|_| unfinished) {
        let extra = last.extra.get_or_insert_with(Map::new);
        extra.insert("turn_completed".into(), Value::Bool(false));
        if let Some(reason) = turn.str("hermes.turn.end_reason").filter(|r| !r.is_empty()) {
            extra.insert("turn_end_reason".into(), json!(reason));
        }
    }
}

/// Puts a tool span's result into the observation of the agent step that
/// called it (the step whose tool calls hold its id; else the last agent
/// step that started before it, which gets the call added).
fn attach_tool(
    tool: &SpanRecord,
    all: &[&SpanRecord],
    embedded: &BTreeSet<String>,
    steps: &mut [Step],
) {
    let id = tool
        .str("gen_ai.tool.call.id")
        .unwrap_or_default()
        .to_owned();
    let name = tool.str("gen_ai.tool.name").unwrap_or_default().to_owned();
    let holds = |s: &Step| {
        s.tool_calls
            .as_ref()
            .is_some_and(|c| c.iter().any(|c| c.tool_call_id == id))
    };
    let index = match steps.iter().position(holds) {
        Some(i) => i,
        None => {
            let started = rfc3339(tool.start_ns);
            let Some(i) = steps.iter().rposition(|s| {
                s.source == Source::Agent && s.timestamp.as_deref() <= Some(started.as_str())
            }) else {
                return;
            };
            steps[i]
                .tool_calls
                .get_or_insert_with(Vec::new)
                .push(ToolCall {
                    tool_call_id: id.clone(),
                    function_name: name.clone(),
                    arguments: arguments(tool.str("gen_ai.tool.call.arguments")),
                    extra: None,
                });
            i
        }
    };
    let refs: Vec<SubagentTrajectoryRef> = all
        .iter()
        .filter(|r| r.kind == Kind::Subagent && r.parent_span_id == tool.span_id)
        .filter_map(|r| r.str("hermes.child_session_id"))
        .filter(|child| embedded.contains(*child))
        .map(|child| SubagentTrajectoryRef {
            trajectory_id: Some(child.to_owned()),
            session_id: Some(child.to_owned()),
        })
        .collect();
    let mut extra = Map::new();
    if let Some(status) = tool.str("hermes.tool.status") {
        extra.insert("status".into(), json!(status));
    }
    let result = ObservationResult {
        source_call_id: Some(id),
        content: tool.str("gen_ai.tool.call.result").map(str::to_owned),
        subagent_trajectory_ref: (!refs.is_empty()).then_some(refs),
        extra: (!extra.is_empty()).then_some(extra),
    };
    steps[index]
        .observation
        .get_or_insert_with(|| Observation {
            results: Vec::new(),
        })
        .results
        .push(result);
}

/// The text and tool calls of `gen_ai.output.messages` (semconv parts).
fn parse_output(output: &str) -> (String, Vec<ToolCall>) {
    let messages: Vec<Value> = serde_json::from_str(output).unwrap_or_default();
    let mut text = Vec::new();
    let mut calls = Vec::new();
    for part in messages
        .iter()
        .filter_map(|m| m.get("parts").and_then(Value::as_array))
        .flatten()
    {
        match part.get("type").and_then(Value::as_str) {
            Some("text") => {
                if let Some(t) = part.get("content").and_then(Value::as_str) {
                    text.push(t.to_owned());
                }
            }
            Some("tool_call") => calls.push(ToolCall {
                tool_call_id: value_text(part.get("id")),
                function_name: value_text(part.get("name")),
                arguments: match part.get("arguments") {
                    Some(Value::Object(o)) => o.clone(),
                    Some(Value::Null) | None => Map::new(),
                    Some(other) => Map::from_iter([("value".to_owned(), other.clone())]),
                },
                extra: None,
            }),
            _ => {}
        }
    }
    (text.join("\n"), calls)
}

/// Tool arguments as ATIF's JSON object: an object as is, anything else
/// (text, or JSON truncation made a string of) under `value`.
fn arguments(text: Option<&str>) -> Map<String, Value> {
    match text.map(serde_json::from_str::<Value>) {
        Some(Ok(Value::Object(o))) => o,
        Some(Ok(other)) => Map::from_iter([("value".to_owned(), other)]),
        Some(Err(_)) => Map::from_iter([("value".to_owned(), json!(text))]),
        None => Map::new(),
    }
}

fn value_text(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

fn metrics(chat: &SpanRecord) -> Metrics {
    let mut extra = Map::new();
    for (key, name) in [
        (
            "gen_ai.usage.cache_creation.input_tokens",
            "cache_creation_tokens",
        ),
        ("gen_ai.usage.reasoning.output_tokens", "reasoning_tokens"),
    ] {
        if let Some(n) = chat.int(key) {
            extra.insert(name.into(), json!(n));
        }
    }
    Metrics {
        prompt_tokens: chat.int("gen_ai.usage.input_tokens"),
        completion_tokens: chat.int("gen_ai.usage.output_tokens"),
        cached_tokens: chat.int("gen_ai.usage.cache_read.input_tokens"),
        extra: (!extra.is_empty()).then_some(extra),
    }
}

fn totals(steps: &[Step]) -> FinalMetrics {
    let sum = |f: fn(&Metrics) -> Option<i64>| -> Option<i64> {
        let values: Vec<i64> = steps
            .iter()
            .filter_map(|s| s.metrics.as_ref().and_then(f))
            .collect();
        (!values.is_empty()).then(|| values.iter().sum())
    };
    FinalMetrics {
        total_prompt_tokens: sum(|m| m.prompt_tokens),
        total_completion_tokens: sum(|m| m.completion_tokens),
        total_cached_tokens: sum(|m| m.cached_tokens),
        total_steps: Some(steps.len() as u64),
    }
}

fn step(source: Source, t_ns: u64, message: String) -> Step {
    Step {
        step_id: 0,
        timestamp: Some(rfc3339(t_ns)),
        source,
        model_name: None,
        message,
        tool_calls: None,
        observation: None,
        metrics: None,
        extra: None,
        llm_call_count: None,
    }
}
