//! Work cut off by the agent's exit: what the shim's `process_exit` marker
//! closes, with which times and attributes, and the end of subagents closed
//! without their stop.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use hermes_correlator::{Config, Correlator, FinishedSpan, PROCESS_EXIT_REASON};
use hermes_proto::hooks;
use hermes_proto::v1::{self, event::Body};
use hermes_span::common::v1::any_value::Value;
use hermes_span::trace::v1::{Span, status::StatusCode};

const MS: u64 = 1_000_000;
const T0: u64 = 1_800_000_000_000 * MS;
const SESSION: &str = "20261202_040110_a87384";
const TURN: &str = "20261202_040110_a87384:task-1:69a78d47";
const CHILD_SESSION: &str = "20261202_040116_f780a0";
const CHILD_TURN: &str = "20261202_040116_f780a0:sa-0-1:3463f54b";

fn shim(instance: &str) -> v1::ShimInfo {
    v1::ShimInfo {
        instance_id: instance.into(),
        service_name: "hermes-agent".into(),
        capture: "metadata".into(),
        ..Default::default()
    }
}

struct Feed {
    c: Correlator,
    seq: u64,
    out: Vec<FinishedSpan>,
}

impl Feed {
    fn new() -> Self {
        Feed {
            c: Correlator::new(Config::default()),
            seq: 0,
            out: Vec::new(),
        }
    }

    fn ev_of(&mut self, instance: &str, hook: &str, t_ms: u64, ids: v1::Ids, body: Option<Body>) {
        self.seq += 1;
        let e = v1::Event {
            seq: self.seq,
            hook: hook.into(),
            time_unix_nano: T0 + t_ms * MS,
            thread: "ThreadPoolExecutor-0_0".into(),
            ids: Some(Box::new(ids)),
            body,
            ..Default::default()
        };
        self.c.ingest(&shim(instance), &e, &mut self.out);
    }

    fn ev(&mut self, hook: &str, t_ms: u64, ids: v1::Ids, body: Option<Body>) {
        self.ev_of("inst-1", hook, t_ms, ids, body);
    }

    fn exit(&mut self, instance: &str, t_ms: u64) {
        self.ev_of(
            instance,
            hooks::PROCESS_EXIT,
            t_ms,
            v1::Ids::default(),
            None,
        );
    }

    fn spans(&self, name: &str) -> Vec<&Span> {
        self.out
            .iter()
            .map(|s| &s.span)
            .filter(|s| s.name == name)
            .collect()
    }

    fn one(&self, name: &str) -> &Span {
        let found = self.spans(name);
        assert_eq!(found.len(), 1, "{name} in {:?}", self.names());
        found[0]
    }

    fn names(&self) -> Vec<String> {
        self.out.iter().map(|s| s.span.name.to_string()).collect()
    }
}

fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

fn boolean(span: &Span, key: &str) -> Option<bool> {
    match attr(span, key) {
        Some(Value::BoolValue(b)) => Some(*b),
        None => None,
        other => panic!("{key} is {other:?} on {}", span.name),
    }
}

fn string(span: &Span, key: &str) -> Option<String> {
    match attr(span, key) {
        Some(Value::StringValue(s)) => Some(s.to_string()),
        None => None,
        other => panic!("{key} is {other:?} on {}", span.name),
    }
}

fn ids(session: &str, task: &str, turn: &str) -> v1::Ids {
    v1::Ids {
        session_id: session.into(),
        task_id: task.into(),
        turn_id: turn.into(),
        ..Default::default()
    }
}

fn parent() -> v1::Ids {
    ids(SESSION, "task-1", TURN)
}

fn child() -> v1::Ids {
    ids(CHILD_SESSION, "sa-0-1", CHILD_TURN)
}

fn with_call(mut ids: v1::Ids, call: &str) -> v1::Ids {
    ids.tool_call_id = call.into();
    ids
}

fn with_api(mut ids: v1::Ids, api: &str) -> v1::Ids {
    ids.api_request_id = api.into();
    ids
}

fn tool(name: &str) -> Option<Body> {
    Some(Body::Tool(v1::ToolCall {
        tool_name: name.into(),
        ..Default::default()
    }))
}

fn api(attempt: u32, started_ms: u64, ended_ms: u64) -> Option<Body> {
    Some(Body::Api(Box::new(v1::ApiCall {
        model: "fake-model".into(),
        attempt,
        started_at_unix_nano: T0 + started_ms * MS,
        ended_at_unix_nano: if ended_ms == 0 { 0 } else { T0 + ended_ms * MS },
        ..Default::default()
    })))
}

fn end_body(completed: bool) -> Option<Body> {
    Some(Body::Turn(v1::Turn {
        completed: Some(completed),
        interrupted: Some(false),
        ..Default::default()
    }))
}

fn link() -> v1::Ids {
    v1::Ids {
        parent_session_id: SESSION.into(),
        parent_turn_id: TURN.into(),
        child_session_id: CHILD_SESSION.into(),
        child_subagent_id: "sa-0-1".into(),
        ..Default::default()
    }
}

/// Hermes 0.18.2 under `hermes -z`: the parent delegates in the background
/// and ends its turn; its child has answered one model call and started a
/// tool when the process exits.
fn background_child_in_flight(f: &mut Feed) {
    f.ev("pre_llm_call", 0, parent(), None);
    f.ev(
        "pre_tool_call",
        100,
        with_call(parent(), "call_1"),
        tool("delegate_task"),
    );
    f.ev("subagent_start", 1_000, link(), None);
    f.ev(
        "post_tool_call",
        1_010,
        with_call(parent(), "call_1"),
        tool("delegate_task"),
    );
    f.ev("pre_llm_call", 1_050, child(), None);
    f.ev(
        "pre_api_request",
        1_060,
        with_api(child(), "c-api-1"),
        api(1, 1_060, 0),
    );
    f.ev("post_llm_call", 1_400, parent(), None);
    f.ev("on_session_end", 1_401, parent(), end_body(true));
    // Fired while the interpreter exits (after the parent's last hook).
    f.ev(
        "post_api_request",
        1_900,
        with_api(child(), "c-api-1"),
        api(1, 1_060, 1_900),
    );
    f.ev(
        "pre_tool_call",
        1_910,
        with_call(child(), "call_2"),
        tool("terminal"),
    );
}

#[test]
fn a_background_child_cut_off_by_the_exit_closes_at_the_exit_with_real_times() {
    let mut f = Feed::new();
    background_child_in_flight(&mut f);
    let before = f.out.len();
    assert_eq!(f.c.open_turns(), 1, "the child turn is open");
    f.exit("inst-1", 2_500);
    assert_eq!(f.c.open_turns(), 0);
    assert_eq!(f.c.stats().cut_off_at_exit, 1);
    assert_eq!(
        f.out.len() - before,
        3,
        "child turn, its tool, the subagent: {:?}",
        f.names()
    );

    let turns = f.spans("invoke_agent hermes");
    let parent_turn = turns
        .iter()
        .find(|s| string(s, "hermes.turn_id").as_deref() == Some(TURN))
        .unwrap();
    assert_eq!(boolean(parent_turn, "hermes.turn.completed"), Some(true));
    assert_eq!(boolean(parent_turn, "hermes.incomplete"), None);

    let sub = f
        .spans("invoke_agent subagent")
        .into_iter()
        .find(|s| attr(s, "gen_ai.agent.id").is_some())
        .expect("subagent span");
    assert_eq!(sub.start_time_unix_nano, T0 + 1_000 * MS);
    assert_eq!(
        sub.end_time_unix_nano,
        T0 + 2_500 * MS,
        "ran until the exit"
    );
    assert_eq!(boolean(sub, "hermes.incomplete"), Some(true));

    let child_turn = f
        .spans("invoke_agent subagent")
        .into_iter()
        .find(|s| attr(s, "gen_ai.agent.id").is_none())
        .expect("child turn");
    assert_eq!(child_turn.parent_span_id, sub.span_id);
    assert_eq!(child_turn.start_time_unix_nano, T0 + 1_050 * MS);
    assert_eq!(child_turn.end_time_unix_nano, T0 + 2_500 * MS);
    assert_eq!(boolean(child_turn, "hermes.incomplete"), Some(true));
    assert_eq!(boolean(child_turn, "hermes.turn.completed"), Some(false));
    assert_eq!(boolean(child_turn, "hermes.turn.interrupted"), Some(true));
    assert_eq!(
        string(child_turn, "hermes.turn.end_reason").as_deref(),
        Some(PROCESS_EXIT_REASON)
    );
    let status = child_turn
        .status
        .as_ref()
        .map_or(StatusCode::Unset, |s| s.code());
    assert_eq!(status, StatusCode::Unset, "cut off is not an error");

    // The late hooks made their spans: the answered call, the started tool.
    let chat = f.one("chat fake-model");
    assert_eq!(chat.end_time_unix_nano, T0 + 1_900 * MS);
    assert_eq!(boolean(chat, "hermes.incomplete"), None);
    let terminal = f.one("execute_tool terminal");
    assert_eq!(terminal.start_time_unix_nano, T0 + 1_910 * MS);
    assert_eq!(terminal.end_time_unix_nano, T0 + 2_500 * MS);
    assert_eq!(boolean(terminal, "hermes.incomplete"), Some(true));
}

#[test]
fn a_turn_hermes_had_given_up_on_stays_a_failure_at_its_last_event() {
    let mut f = Feed::new();
    f.ev("pre_llm_call", 0, parent(), None);
    f.ev(
        "pre_api_request",
        10,
        with_api(parent(), "api-1"),
        api(1, 10, 0),
    );
    let mut failed = api(1, 10, 300);
    if let Some(Body::Api(a)) = failed.as_mut() {
        a.reason = "server_error".into();
        a.status_code = Some(500);
    }
    f.ev(
        "api_request_error",
        300,
        with_api(parent(), "api-1"),
        failed,
    );
    f.exit("inst-1", 5_000);
    let turn = f.one("invoke_agent hermes");
    assert_eq!(turn.end_time_unix_nano, T0 + 300 * MS);
    assert_eq!(boolean(turn, "hermes.turn.completed"), Some(false));
    assert_eq!(boolean(turn, "hermes.turn.interrupted"), Some(false));
    assert_eq!(boolean(turn, "hermes.incomplete"), Some(true));
    assert_eq!(
        turn.status.as_ref().map(|s| s.code()),
        Some(StatusCode::Error)
    );
}

#[test]
fn an_ended_turn_without_its_session_end_closes_as_it_would_have() {
    let mut f = Feed::new();
    f.ev("pre_llm_call", 0, parent(), None);
    f.ev("post_llm_call", 200, parent(), None);
    f.exit("inst-1", 5_000);
    let turn = f.one("invoke_agent hermes");
    assert_eq!(turn.end_time_unix_nano, T0 + 200 * MS);
    assert_eq!(boolean(turn, "hermes.incomplete"), None);
    assert_eq!(boolean(turn, "hermes.turn.completed"), None);
    assert_eq!(f.c.stats().cut_off_at_exit, 0);
}

#[test]
fn only_the_exiting_instance_is_closed() {
    let mut f = Feed::new();
    f.ev_of("other", "pre_llm_call", 0, parent(), None);
    f.ev("pre_llm_call", 0, child(), None);
    f.exit("inst-1", 100);
    assert_eq!(f.c.open_turns(), 1, "the other agent's turn stays open");
    assert_eq!(f.out.len(), 1, "{:?}", f.names());
    assert_eq!(
        string(&f.out[0].span, "hermes.turn_id").as_deref(),
        Some(CHILD_TURN)
    );
}

#[test]
fn without_the_marker_a_subagent_ends_at_its_childs_last_activity() {
    let mut f = Feed::new();
    background_child_in_flight(&mut f);
    // The collector stops (no marker came: `os._exit`, a kill).
    f.c.flush_all(&mut f.out);
    let sub = f
        .spans("invoke_agent subagent")
        .into_iter()
        .find(|s| attr(s, "gen_ai.agent.id").is_some())
        .expect("subagent span");
    assert_eq!(sub.start_time_unix_nano, T0 + 1_000 * MS);
    assert_eq!(
        sub.end_time_unix_nano,
        T0 + 1_910 * MS,
        "not 0 ms: until the child's last event"
    );
    assert_eq!(boolean(sub, "hermes.incomplete"), Some(true));
    // Nothing says how the child's turn ended: left unknown.
    let child_turn = f
        .spans("invoke_agent subagent")
        .into_iter()
        .find(|s| attr(s, "gen_ai.agent.id").is_none())
        .expect("child turn");
    assert_eq!(boolean(child_turn, "hermes.turn.completed"), None);
    assert_eq!(boolean(child_turn, "hermes.incomplete"), Some(true));
}
