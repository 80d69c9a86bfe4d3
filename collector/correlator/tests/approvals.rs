//! Approval spans: one per `(tool_call_id, pattern_key, surface)`, answered
//! or not (Hermes 0.19's smart review escalating to the CLI).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::Feed;
use hermes_correlator::ids::{SpanKey, span_id};
use hermes_e2e::events::{MS, T0, end_body, ids, tool_done, turn_body, with_call};
use hermes_e2e::span_attrs::{boolean, string};
use hermes_proto::v1::{self, event::Body};
use hermes_span::trace::v1::Span;

const SESSION: &str = "20261201_090000_a1b2c3";
const TURN: &str = "20261201_090000_a1b2c3:task-1:5e5e5e5e";
const PATTERN: &str = "delete in root path";

/// A feed of one agent capturing content.
fn feed() -> Feed {
    let mut f = Feed::new();
    f.shim.capture = "content".into();
    f
}

/// The ids of an event of the turn, about tool call `call` (none: "").
fn call(call: &str) -> v1::Ids {
    with_call(ids(SESSION, "task-1", TURN), call)
}

fn approvals(f: &Feed) -> Vec<&Span> {
    let mut found: Vec<&Span> = f
        .out
        .iter()
        .map(|s| &s.span)
        .filter(|s| s.name.starts_with("approval"))
        .collect();
    found.sort_by_key(|s| s.start_time_unix_nano);
    found
}

fn tool(status: &str) -> Option<Body> {
    tool_done("terminal", status, None)
}

fn request(surface: &str) -> Option<Body> {
    Some(Body::Approval(Box::new(v1::Approval {
        command: "rm -rf /tmp/x".into(),
        pattern_key: PATTERN.into(),
        surface: surface.into(),
        ..Default::default()
    })))
}

fn response(surface: &str, choice: &str) -> Option<Body> {
    Some(Body::Approval(Box::new(v1::Approval {
        pattern_key: PATTERN.into(),
        surface: surface.into(),
        choice: choice.into(),
        ..Default::default()
    })))
}

/// `surface` answers tool `call_1`'s approval request with `choice`.
fn answer(f: &mut Feed, t_ms: u64, surface: &str, choice: &str) {
    let body = response(surface, choice);
    f.ev("post_approval_response", t_ms, call("call_1"), body);
}

/// Tool `call_1` ends with `status` at 120 ms, and the session at 131 ms.
fn tool_and_session_end(f: &mut Feed, status: &str) {
    f.ev("post_tool_call", 120, call("call_1"), tool(status));
    f.ev("on_session_end", 131, call(""), end_body(true, false));
}

/// The turn opens, tool `call_1` starts and asks `surface` for approval
/// at 20 ms.
fn ask(f: &mut Feed, surface: &str) {
    f.ev("pre_llm_call", 0, call(""), turn_body());
    f.ev("pre_tool_call", 10, call("call_1"), tool(""));
    f.ev("pre_approval_request", 20, call("call_1"), request(surface));
}

/// A smart review that escalates: its request gets no response; the CLI's
/// request that follows is answered; then the tool ends.
fn escalation(f: &mut Feed) {
    ask(f, "smart");
    f.ev("pre_approval_request", 50, call("call_1"), request("cli"));
    answer(f, 90, "cli", "once");
    f.ev("post_tool_call", 120, call("call_1"), tool("ok"));
    f.ev("post_llm_call", 130, call(""), turn_body());
    f.ev("on_session_end", 131, call(""), end_body(true, false));
}

#[test]
fn an_escalated_smart_review_and_the_cli_question_are_two_spans() {
    let mut f = feed();
    escalation(&mut f);
    let tool_span = f.one("execute_tool terminal");
    let spans = approvals(&f);
    assert_eq!(
        spans.len(),
        2,
        "{:?}",
        f.out.iter().map(|s| &s.span.name).collect::<Vec<_>>()
    );
    let (smart, cli) = (spans[0], spans[1]);

    assert_eq!(string(smart, "hermes.approval.surface"), Some("smart"));
    assert_eq!(boolean(smart, "hermes.approval.answered"), Some(false));
    assert_eq!(string(smart, "hermes.approval.choice"), None);
    assert_eq!(string(smart, "hermes.approval.pattern_key"), Some(PATTERN));
    // Closed with its tool, under it, and not an incomplete capture.
    assert_eq!(smart.start_time_unix_nano, T0 + 20 * MS);
    assert_eq!(smart.end_time_unix_nano, T0 + 120 * MS);
    assert_eq!(smart.parent_span_id, tool_span.span_id);
    assert_eq!(boolean(smart, "hermes.incomplete"), None);

    assert_eq!(string(cli, "hermes.approval.surface"), Some("cli"));
    assert_eq!(boolean(cli, "hermes.approval.answered"), Some(true));
    assert_eq!(string(cli, "hermes.approval.choice"), Some("once"));
    assert_eq!(cli.start_time_unix_nano, T0 + 50 * MS);
    assert_eq!(cli.end_time_unix_nano, T0 + 90 * MS);
    assert_eq!(cli.parent_span_id, tool_span.span_id);
    // The command of the request is kept on both (content capture).
    assert_eq!(
        string(cli, "hermes.approval.command"),
        Some("rm -rf /tmp/x")
    );
    assert_eq!(
        string(smart, "hermes.approval.command"),
        Some("rm -rf /tmp/x")
    );

    // Deterministic ids that include the surface.
    assert_ne!(smart.span_id, cli.span_id);
    for (span, surface) in [(smart, "smart"), (cli, "cli")] {
        let id = span_id(SpanKey::Approval {
            turn_id: TURN,
            tool_call_id: "call_1",
            pattern_key: PATTERN,
            surface,
        });
        assert_eq!(span.span_id, id.to_vec(), "{surface}");
    }
    let mut again = feed();
    escalation(&mut again);
    assert_eq!(f.out, again.out);
}

#[test]
fn a_smart_review_that_decides_is_one_answered_span() {
    let mut f = feed();
    ask(&mut f, "smart");
    answer(&mut f, 40, "smart", "smart_approve");
    tool_and_session_end(&mut f, "ok");
    let spans = approvals(&f);
    assert_eq!(spans.len(), 1);
    assert_eq!(boolean(spans[0], "hermes.approval.answered"), Some(true));
    assert_eq!(
        string(spans[0], "hermes.approval.choice"),
        Some("smart_approve")
    );
    assert_eq!(spans[0].end_time_unix_nano, T0 + 40 * MS);
}

#[test]
fn an_unanswered_request_is_closed_by_its_turn_end() {
    let mut f = feed();
    f.ev("pre_llm_call", 0, call(""), turn_body());
    // Asked without a tool call id (no open tool): hangs off the turn.
    f.ev("pre_approval_request", 20, call(""), request("cli"));
    f.ev("post_llm_call", 200, call(""), turn_body());
    f.ev("on_session_end", 201, call(""), end_body(true, false));
    let root = f.one("invoke_agent hermes");
    let spans = approvals(&f);
    assert_eq!(spans.len(), 1);
    let s = spans[0];
    assert_eq!(boolean(s, "hermes.approval.answered"), Some(false));
    assert_eq!(string(s, "hermes.approval.choice"), None);
    assert_eq!(string(s, "hermes.approval.surface"), Some("cli"));
    assert_eq!(s.parent_span_id, root.span_id);
    assert_eq!(s.start_time_unix_nano, T0 + 20 * MS);
    assert_eq!(s.end_time_unix_nano, root.end_time_unix_nano);
    // The turn ended normally: the request simply got no answer.
    assert_eq!(boolean(s, "hermes.incomplete"), None);
}

#[test]
fn a_request_open_when_the_turn_is_cut_off_is_incomplete_and_unanswered() {
    let mut f = feed();
    ask(&mut f, "gateway");
    f.c.flush_all(&mut f.out);
    let tool_span = f.one("execute_tool terminal");
    let spans = approvals(&f);
    assert_eq!(spans.len(), 1);
    assert_eq!(boolean(spans[0], "hermes.approval.answered"), Some(false));
    assert_eq!(boolean(spans[0], "hermes.incomplete"), Some(true));
    assert_eq!(spans[0].parent_span_id, tool_span.span_id);
}

#[test]
fn a_response_without_a_surface_answers_the_latest_request() {
    let mut f = feed();
    ask(&mut f, "smart");
    f.ev("pre_approval_request", 50, call("call_1"), request("cli"));
    answer(&mut f, 90, "", "deny");
    tool_and_session_end(&mut f, "blocked");
    let spans = approvals(&f);
    assert_eq!(spans.len(), 2);
    assert_eq!(boolean(spans[0], "hermes.approval.answered"), Some(false));
    assert_eq!(string(spans[1], "hermes.approval.surface"), Some("cli"));
    assert_eq!(string(spans[1], "hermes.approval.choice"), Some("deny"));
}
