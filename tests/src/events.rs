//! Builders of the wire protocol's hook events (`hermes_proto::v1`), for
//! tests that feed the correlator hand-made events: the agent (shim) that
//! sends them, events at millisecond offsets from a fixed wall clock, their
//! ids and their bodies. What feeds them (a correlator, a pipeline) stays
//! with the tests: this crate does not depend on the correlator, whose own
//! tests use these builders.

use hermes_proto::v1::{self, event::Body};

/// One millisecond in nanoseconds.
pub const MS: u64 = 1_000_000;
/// 2027-01-15 in ns: the wall clock of the events starts here.
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

/// The ids of an event of `turn`, in `task` of `session`.
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

/// `ids` with the tool call `call`.
pub fn with_call(ids: v1::Ids, call: &str) -> v1::Ids {
    v1::Ids {
        tool_call_id: call.into(),
        ..ids
    }
}

/// `ids` with the API request `api`.
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

/// The body of a turn's start: its model and platform.
pub fn turn_body() -> Option<Body> {
    Some(Body::Turn(v1::Turn {
        model: "fake-model-1".into(),
        platform: "cli".into(),
        ..Default::default()
    }))
}

/// The body of a turn's end.
pub fn end_body(completed: bool, interrupted: bool) -> Option<Body> {
    Some(Body::Turn(v1::Turn {
        completed: Some(completed),
        interrupted: Some(interrupted),
        ..Default::default()
    }))
}

/// The body of a tool call's start.
pub fn tool(name: &str) -> Option<Body> {
    tool_done(name, "", None)
}

/// The body of a tool call's end, with its status and duration.
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

/// The body of an API request hook.
pub fn api_body(call: v1::ApiCall) -> Option<Body> {
    Some(Body::Api(Box::new(call)))
}
