//! Builders shared by the correlator's tests: hook events at millisecond
//! offsets from a fixed wall clock, the agent (shim) that sends them, their
//! ids and bodies, a feed that ingests them in order, and typed readers of
//! the spans' attributes.

// Each test binary uses its own part of these.
#![allow(dead_code)]

use hermes_correlator::{Config, Correlator, FinishedSpan};
use hermes_proto::v1::{self, event::Body};
use hermes_span::common::v1::any_value::Value;
use hermes_span::trace::v1::Span;

pub const MS: u64 = 1_000_000;
/// 2027-01-15 in ns: the wall clock of the tests starts here.
pub const T0: u64 = 1_800_000_000_000 * MS;

/// The agent process `instance`, capturing metadata only.
pub fn shim(instance: &str) -> v1::ShimInfo {
    v1::ShimInfo {
        instance_id: instance.into(),
        service_name: "hermes-agent".into(),
        host_name: "host".into(),
        pid: 42,
        shim_version: "0.1.0".into(),
        capture: "metadata".into(),
    }
}

/// `hook` captured `t_ms` after [`T0`], sequence number 0.
pub fn event(hook: &str, t_ms: u64, ids: v1::Ids, body: Option<Body>) -> v1::Event {
    v1::Event {
        seq: 0,
        hook: hook.into(),
        schema_version: "hermes.observer.v1".into(),
        time_unix_nano: T0 + t_ms * MS,
        mono_nano: t_ms * MS,
        thread: "MainThread".into(),
        ids: Some(Box::new(ids)),
        body,
        content: Default::default(),
    }
}

pub fn ids(session: &str, task: &str, turn: &str) -> v1::Ids {
    v1::Ids {
        session_id: session.into(),
        task_id: task.into(),
        turn_id: turn.into(),
        ..Default::default()
    }
}

/// The ids of a session-wide hook (start, finalize, reset).
pub fn session_ids(session: &str) -> v1::Ids {
    ids(session, "", "")
}

pub fn with_call(ids: v1::Ids, call: &str) -> v1::Ids {
    v1::Ids {
        tool_call_id: call.into(),
        ..ids
    }
}

pub fn with_api(ids: v1::Ids, api: &str) -> v1::Ids {
    v1::Ids {
        api_request_id: api.into(),
        ..ids
    }
}

/// The ids of `subagent_start`/`subagent_stop`: the parent's turn and the
/// child's session.
pub fn link(
    parent_session: &str,
    parent_turn: &str,
    child_session: &str,
    subagent: &str,
) -> v1::Ids {
    v1::Ids {
        parent_session_id: parent_session.into(),
        parent_turn_id: parent_turn.into(),
        child_session_id: child_session.into(),
        child_subagent_id: subagent.into(),
        ..Default::default()
    }
}

pub fn turn_body() -> Option<Body> {
    Some(Body::Turn(v1::Turn {
        model: "fake-model-1".into(),
        platform: "cli".into(),
        ..Default::default()
    }))
}

pub fn end_body(completed: bool, interrupted: bool) -> Option<Body> {
    Some(Body::Turn(v1::Turn {
        completed: Some(completed),
        interrupted: Some(interrupted),
        ..Default::default()
    }))
}

pub fn tool(name: &str) -> Option<Body> {
    tool_done(name, "", None)
}

pub fn tool_done(name: &str, status: &str, duration_ms: Option<u64>) -> Option<Body> {
    Some(Body::Tool(v1::ToolCall {
        tool_name: name.into(),
        status: status.into(),
        duration_ms,
        ..Default::default()
    }))
}

/// Attempt `attempt` of a call to `model`, started and ended (0: not yet)
/// at these offsets from [`T0`].
pub fn api_call(model: &str, attempt: u32, started_ms: u64, ended_ms: u64) -> v1::ApiCall {
    v1::ApiCall {
        model: model.into(),
        attempt,
        started_at_unix_nano: T0 + started_ms * MS,
        ended_at_unix_nano: if ended_ms == 0 { 0 } else { T0 + ended_ms * MS },
        ..Default::default()
    }
}

pub fn api_body(call: v1::ApiCall) -> Option<Body> {
    Some(Body::Api(Box::new(call)))
}

/// Events of one agent fed to one correlator in order, with increasing
/// sequence numbers, and the spans they closed.
pub struct Feed {
    pub c: Correlator,
    pub shim: v1::ShimInfo,
    pub out: Vec<FinishedSpan>,
    seq: u64,
}

impl Feed {
    pub fn new() -> Self {
        Self::with(Config::default())
    }

    pub fn with(config: Config) -> Self {
        Self {
            c: Correlator::new(config),
            shim: shim("inst-1"),
            out: Vec::new(),
            seq: 0,
        }
    }

    pub fn ev(&mut self, hook: &str, t_ms: u64, ids: v1::Ids, body: Option<Body>) {
        let shim = self.shim.clone();
        self.ev_from(&shim, hook, t_ms, ids, body);
    }

    /// As [`Self::ev`], sent by another agent.
    pub fn ev_from(
        &mut self,
        shim: &v1::ShimInfo,
        hook: &str,
        t_ms: u64,
        ids: v1::Ids,
        body: Option<Body>,
    ) {
        self.seq += 1;
        let e = v1::Event {
            seq: self.seq,
            ..event(hook, t_ms, ids, body)
        };
        self.c.ingest(shim, &e, &mut self.out);
    }

    pub fn spans(&self, name: &str) -> Vec<&Span> {
        self.out
            .iter()
            .map(|s| &s.span)
            .filter(|s| s.name == name)
            .collect()
    }

    /// The one span named `name`.
    pub fn one(&self, name: &str) -> &Span {
        let found = self.spans(name);
        assert_eq!(found.len(), 1, "one {name} in {:?}", self.names());
        found[0]
    }

    pub fn names(&self) -> Vec<String> {
        self.out.iter().map(|s| s.span.name.to_string()).collect()
    }
}

pub fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

/// The string attribute `key`; panics when it is of another type.
pub fn string<'a>(span: &'a Span, key: &str) -> Option<&'a str> {
    match attr(span, key) {
        Some(Value::StringValue(s)) => Some(s),
        None => None,
        other => panic!("{key} is {other:?} on {}", span.name),
    }
}

/// The integer attribute `key`; panics when it is of another type.
pub fn int(span: &Span, key: &str) -> Option<i64> {
    match attr(span, key) {
        Some(Value::IntValue(i)) => Some(*i),
        None => None,
        other => panic!("{key} is {other:?} on {}", span.name),
    }
}

/// The boolean attribute `key`; panics when it is of another type.
pub fn boolean(span: &Span, key: &str) -> Option<bool> {
    match attr(span, key) {
        Some(Value::BoolValue(b)) => Some(*b),
        None => None,
        other => panic!("{key} is {other:?} on {}", span.name),
    }
}
