//! Work cut off by the agent's exit: what the shim's `process_exit` marker
//! closes, with which times and attributes, and the end of subagents closed
//! without their stop.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::Feed;
use hermes_correlator::PROCESS_EXIT_REASON;
use hermes_e2e::events::{
    self, MS, T0, api_body, api_call, end_body, ids, shim, tool, with_api, with_call,
};
use hermes_e2e::span_attrs::{attr, boolean, string};
use hermes_proto::hooks;
use hermes_proto::v1::{self, event::Body};
use hermes_span::trace::v1::{Span, status::StatusCode};

const SESSION: &str = "20261202_040110_a87384";
const TURN: &str = "20261202_040110_a87384:task-1:69a78d47";
const CHILD_SESSION: &str = "20261202_040116_f780a0";
const CHILD_TURN: &str = "20261202_040116_f780a0:sa-0-1:3463f54b";

/// The process `instance` exits at `t_ms`: the shim's marker.
fn exit(f: &mut Feed, instance: &str, t_ms: u64) {
    let ids = v1::Ids::default();
    f.ev_from(&shim(instance), hooks::PROCESS_EXIT, t_ms, ids, None);
}

/// The subagent span and the child turn under it, named as subagents'.
fn subagent_and_child(f: &Feed) -> (&Span, &Span) {
    let named = f.spans("invoke_agent subagent");
    let sub = named
        .iter()
        .copied()
        .find(|s| attr(s, "gen_ai.agent.id").is_some())
        .expect("subagent span");
    let child = named
        .iter()
        .copied()
        .find(|s| attr(s, "gen_ai.agent.id").is_none())
        .expect("child turn");
    (sub, child)
}

/// The subagent span of [`background_child_in_flight`]: from its start at
/// 1 s to `end_ms` (`why`), incomplete.
fn assert_subagent_cut_off(sub: &Span, end_ms: u64, why: &str) {
    assert_eq!(sub.start_time_unix_nano, T0 + 1_000 * MS);
    assert_eq!(sub.end_time_unix_nano, T0 + end_ms * MS, "{why}");
    assert_eq!(boolean(sub, "hermes.incomplete"), Some(true));
}

fn parent() -> v1::Ids {
    ids(SESSION, "task-1", TURN)
}

fn child() -> v1::Ids {
    ids(CHILD_SESSION, "sa-0-1", CHILD_TURN)
}

fn api(attempt: u32, started_ms: u64, ended_ms: u64) -> Option<Body> {
    api_body(api_call("fake-model", attempt, started_ms, ended_ms))
}

fn link() -> v1::Ids {
    events::link(SESSION, TURN, CHILD_SESSION, "sa-0-1")
}

/// Hermes 0.18.2 under `hermes -z`: the parent delegates in the background
/// and ends its turn; its child has answered one model call and started a
/// tool when the process exits.
fn background_child_in_flight(f: &mut Feed) {
    let delegate = || with_call(parent(), "call_1");
    let child_api = || with_api(child(), "c-api-1");
    f.ev("pre_llm_call", 0, parent(), None);
    f.ev("pre_tool_call", 100, delegate(), tool("delegate_task"));
    f.ev("subagent_start", 1_000, link(), None);
    f.ev("post_tool_call", 1_010, delegate(), tool("delegate_task"));
    f.ev("pre_llm_call", 1_050, child(), None);
    f.ev("pre_api_request", 1_060, child_api(), api(1, 1_060, 0));
    f.ev("post_llm_call", 1_400, parent(), None);
    f.ev("on_session_end", 1_401, parent(), end_body(true, false));
    // Fired while the interpreter exits (after the parent's last hook).
    f.ev("post_api_request", 1_900, child_api(), api(1, 1_060, 1_900));
    let terminal = with_call(child(), "call_2");
    f.ev("pre_tool_call", 1_910, terminal, tool("terminal"));
}

#[test]
fn a_background_child_cut_off_by_the_exit_closes_at_the_exit_with_real_times() {
    let mut f = Feed::new();
    background_child_in_flight(&mut f);
    let before = f.out.len();
    assert_eq!(f.c.open_turns(), 1, "the child turn is open");
    exit(&mut f, "inst-1", 2_500);
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
        .find(|s| string(s, "hermes.turn_id") == Some(TURN))
        .unwrap();
    assert_eq!(boolean(parent_turn, "hermes.turn.completed"), Some(true));
    assert_eq!(boolean(parent_turn, "hermes.incomplete"), None);

    let (sub, child_turn) = subagent_and_child(&f);
    assert_subagent_cut_off(sub, 2_500, "ran until the exit");

    assert_eq!(child_turn.parent_span_id, sub.span_id);
    assert_eq!(child_turn.start_time_unix_nano, T0 + 1_050 * MS);
    assert_eq!(child_turn.end_time_unix_nano, T0 + 2_500 * MS);
    assert_eq!(boolean(child_turn, "hermes.incomplete"), Some(true));
    assert_eq!(boolean(child_turn, "hermes.turn.completed"), Some(false));
    assert_eq!(boolean(child_turn, "hermes.turn.interrupted"), Some(true));
    assert_eq!(
        string(child_turn, "hermes.turn.end_reason"),
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
    exit(&mut f, "inst-1", 5_000);
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
    exit(&mut f, "inst-1", 5_000);
    let turn = f.one("invoke_agent hermes");
    assert_eq!(turn.end_time_unix_nano, T0 + 200 * MS);
    assert_eq!(boolean(turn, "hermes.incomplete"), None);
    assert_eq!(boolean(turn, "hermes.turn.completed"), None);
    assert_eq!(f.c.stats().cut_off_at_exit, 0);
}

#[test]
fn only_the_exiting_instance_is_closed() {
    let mut f = Feed::new();
    f.ev_from(&shim("other"), "pre_llm_call", 0, parent(), None);
    f.ev("pre_llm_call", 0, child(), None);
    exit(&mut f, "inst-1", 100);
    assert_eq!(f.c.open_turns(), 1, "the other agent's turn stays open");
    assert_eq!(f.out.len(), 1, "{:?}", f.names());
    assert_eq!(string(&f.out[0].span, "hermes.turn_id"), Some(CHILD_TURN));
}

#[test]
fn without_the_marker_a_subagent_ends_at_its_childs_last_activity() {
    let mut f = Feed::new();
    background_child_in_flight(&mut f);
    // The collector stops (no marker came: `os._exit`, a kill).
    f.c.flush_all(&mut f.out);
    let (sub, child_turn) = subagent_and_child(&f);
    assert_subagent_cut_off(sub, 1_910, "not 0 ms: until the child's last event");
    // Nothing says how the child's turn ended: left unknown.
    assert_eq!(boolean(child_turn, "hermes.turn.completed"), None);
    assert_eq!(boolean(child_turn, "hermes.incomplete"), Some(true));
}
