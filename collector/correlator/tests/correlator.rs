//! Unit tests of the correlator's rules, with hand-built events.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::Feed;
use hermes_correlator::ids::{SpanKey, span_id, trace_id};
use hermes_correlator::{Config, Expiry};
use hermes_e2e::events::{
    self, MS, T0, api_body, end_body, session_ids, shim, tool, tool_done, turn_body, with_api,
    with_call,
};
use hermes_e2e::span_attrs::{attr, boolean, int, string};
use hermes_proto::v1::{self, event::Body};
use hermes_span::trace::v1::{Span, status::StatusCode};

const SESSION: &str = "20261129_200230_bbf019";
const TURN: &str = "20261129_200230_bbf019:task-1:1b06e77d";
const API1: &str = "20261129_200230_bbf019:task-1:1b06e77d:api:1";
const API2: &str = "20261129_200230_bbf019:task-1:1b06e77d:api:2";

/// The ids of an event of `turn` in [`SESSION`].
fn ids(turn: &str) -> v1::Ids {
    events::ids(SESSION, "task-1", turn)
}

fn tool_ids(turn: &str, call: &str) -> v1::Ids {
    with_call(with_api(ids(turn), API1), call)
}

fn api_ids(api_request_id: &str) -> v1::Ids {
    with_api(ids(TURN), api_request_id)
}

fn api(attempt: u32, started_ms: u64, ended_ms: u64) -> v1::ApiCall {
    v1::ApiCall {
        platform: "cli".into(),
        provider: "custom".into(),
        base_url: "http://127.0.0.1:45501/v1".into(),
        api_call_count: 1,
        ..events::api_call("fake-model-1", attempt, started_ms, ended_ms)
    }
}

fn usage(prompt: u64, output: u64) -> v1::Usage {
    v1::Usage {
        input_tokens: prompt - 8,
        output_tokens: output,
        cache_read_tokens: 8,
        prompt_tokens: prompt,
        total_tokens: prompt + output,
        ..Default::default()
    }
}

/// The basic turn of the fixtures: chat → tool → chat.
fn basic_turn(f: &mut Feed) {
    f.ev(
        "on_session_start",
        0,
        session_ids(SESSION),
        Some(Body::Session(v1::Session {
            model: "fake-model-1".into(),
            platform: "cli".into(),
            ..Default::default()
        })),
    );
    f.ev("pre_llm_call", 2, ids(TURN), turn_body());
    f.ev(
        "pre_api_request",
        12,
        api_ids(API1),
        api_body(api(1, 10, 0)),
    );
    f.ev(
        "post_api_request",
        316,
        api_ids(API1),
        api_body(v1::ApiCall {
            usage: Some(usage(1212, 17)),
            finish_reason: "tool_calls".into(),
            response_model: "fake-model-1".into(),
            ..api(1, 10, 310)
        }),
    );
    f.ev(
        "pre_tool_call",
        320,
        tool_ids(TURN, "call_1"),
        tool("terminal"),
    );
    f.ev(
        "post_tool_call",
        395,
        tool_ids(TURN, "call_1"),
        tool_done("terminal", "ok", Some(72)),
    );
    f.ev(
        "pre_api_request",
        400,
        api_ids(API2),
        api_body(api(1, 399, 0)),
    );
    f.ev(
        "post_api_request",
        450,
        api_ids(API2),
        api_body(v1::ApiCall {
            usage: Some(usage(1300, 20)),
            finish_reason: "stop".into(),
            ..api(1, 399, 449)
        }),
    );
    f.ev("post_llm_call", 455, ids(TURN), turn_body());
    f.ev("on_session_end", 456, ids(TURN), end_body(true, false));
}

#[test]
fn basic_turn_is_a_nested_trace() {
    let mut f = Feed::new();
    basic_turn(&mut f);
    assert_eq!(f.out.len(), 4, "{:?}", f.names());
    let root = f.one("invoke_agent hermes");
    let trace = trace_id(TURN).to_vec();
    let root_id = span_id(SpanKey::Turn { turn_id: TURN }).to_vec();
    assert_eq!(root.trace_id, trace);
    assert_eq!(root.span_id, root_id);
    assert!(root.parent_span_id.is_empty());
    assert_eq!(
        root.start_time_unix_nano, T0,
        "session start event opens the first turn"
    );
    assert_eq!(
        root.end_time_unix_nano,
        T0 + 455 * MS,
        "post_llm_call ends the turn"
    );
    assert_eq!(int(root, "hermes.turn.api_attempts"), Some(2));
    assert_eq!(int(root, "hermes.turn.tool_calls"), Some(1));
    assert_eq!(int(root, "hermes.turn.usage.input_tokens"), Some(2512));
    assert_eq!(int(root, "hermes.turn.usage.output_tokens"), Some(37));
    assert_eq!(boolean(root, "hermes.turn.completed"), Some(true));
    assert!(
        attr(root, "gen_ai.usage.input_tokens").is_none(),
        "never usage on the root"
    );
    assert_eq!(root.events.len(), 1);
    assert_eq!(root.events[0].name, "hermes.session.start");
    assert_eq!(boolean(root, "hermes.incomplete"), None);

    let chats: Vec<&Span> = f
        .out
        .iter()
        .map(|s| &s.span)
        .filter(|s| s.name == "chat fake-model-1")
        .collect();
    assert_eq!(chats.len(), 2);
    let first = chats[0];
    assert_eq!(
        first.start_time_unix_nano,
        T0 + 10 * MS,
        "Hermes' started_at of a single attempt"
    );
    assert_eq!(first.end_time_unix_nano, T0 + 310 * MS);
    assert_eq!(first.kind, 3, "CLIENT");
    assert_eq!(
        int(first, "gen_ai.usage.input_tokens"),
        Some(1212),
        "prompt_tokens, cache reads included"
    );
    assert_eq!(int(first, "gen_ai.usage.output_tokens"), Some(17));
    assert_eq!(int(first, "gen_ai.usage.cache_read.input_tokens"), Some(8));
    assert_eq!(string(first, "server.address"), Some("127.0.0.1"));
    assert_eq!(int(first, "server.port"), Some(45501));
    assert_eq!(string(first, "gen_ai.provider.name"), Some("custom"));
    assert_eq!(int(first, "hermes.attempt"), Some(1));
    for s in f.out.iter().map(|s| &s.span) {
        assert_eq!(s.trace_id, trace);
        assert_eq!(string(s, "session.id"), Some(SESSION));
        assert_eq!(string(s, "gen_ai.conversation.id"), Some(SESSION));
        assert_eq!(string(s, "hermes.platform"), Some("cli"));
        if s.span_id != root_id {
            assert_eq!(s.parent_span_id, root_id, "{}", s.name);
            assert!(s.start_time_unix_nano >= root.start_time_unix_nano);
            assert!(s.end_time_unix_nano <= root.end_time_unix_nano);
        }
    }
    let tool = f.one("execute_tool terminal");
    assert_eq!(string(tool, "gen_ai.tool.call.id"), Some("call_1"));
    assert_eq!(string(tool, "hermes.tool.status"), Some("ok"));
    assert_eq!(int(tool, "hermes.tool.duration_ms"), Some(72));
    assert_eq!(tool.start_time_unix_nano, T0 + 320 * MS);
    assert_eq!(tool.end_time_unix_nano, T0 + 395 * MS);
}

#[test]
fn same_events_give_same_spans() {
    let mut a = Feed::new();
    basic_turn(&mut a);
    let mut b = Feed::new();
    basic_turn(&mut b);
    assert_eq!(a.out, b.out);
}

#[test]
fn retried_request_gives_one_span_per_attempt() {
    let mut f = Feed::new();
    f.ev("pre_llm_call", 0, ids(TURN), turn_body());
    f.ev("pre_api_request", 10, api_ids(API1), api_body(api(1, 8, 0)));
    f.ev(
        "api_request_error",
        300,
        api_ids(API1),
        api_body(v1::ApiCall {
            status_code: Some(500),
            retryable: Some(true),
            reason: "server_error".into(),
            error_type: "InternalServerError".into(),
            error_message: "Error code: 500".into(),
            ..api(1, 8, 299)
        }),
    );
    f.ev(
        "pre_api_request",
        2500,
        api_ids(API1),
        api_body(api(2, 8, 0)),
    );
    f.ev(
        "post_api_request",
        2570,
        api_ids(API1),
        api_body(v1::ApiCall {
            usage: Some(usage(100, 5)),
            ..api(2, 8, 2569)
        }),
    );
    f.ev("on_session_end", 2600, ids(TURN), end_body(true, false));
    let chats: Vec<&Span> = f
        .out
        .iter()
        .map(|s| &s.span)
        .filter(|s| s.name.starts_with("chat"))
        .collect();
    assert_eq!(chats.len(), 2);
    let (failed, ok) = (chats[0], chats[1]);
    assert_ne!(failed.span_id, ok.span_id);
    assert_eq!(
        failed.status.as_ref().map(|s| s.code),
        Some(StatusCode::Error as i32)
    );
    assert_eq!(string(failed, "error.type"), Some("server_error"));
    assert_eq!(int(failed, "http.response.status_code"), Some(500));
    assert_eq!(boolean(failed, "hermes.retryable"), Some(true));
    assert_eq!(failed.events[0].name, "exception");
    assert_eq!(failed.start_time_unix_nano, T0 + 8 * MS);
    assert_eq!(
        ok.start_time_unix_nano,
        T0 + 2500 * MS,
        "a retry starts at its own pre_api_request"
    );
    assert_eq!(ok.end_time_unix_nano, T0 + 2569 * MS);
    assert!(ok.status.is_none());
    assert_eq!(int(ok, "hermes.attempt"), Some(2));
    let root = f.one("invoke_agent hermes");
    assert_eq!(int(root, "hermes.turn.api_attempts"), Some(2));
}

#[test]
fn lean_mode_builds_attempts_from_end_events() {
    let mut f = Feed::new();
    f.ev("pre_llm_call", 0, ids(TURN), turn_body());
    f.ev(
        "api_request_error",
        300,
        api_ids(API1),
        api_body(v1::ApiCall {
            status_code: Some(429),
            reason: "rate_limit".into(),
            ..api(1, 8, 299)
        }),
    );
    f.ev(
        "post_api_request",
        1400,
        api_ids(API1),
        api_body(api(2, 8, 1399)),
    );
    f.ev("on_session_end", 1500, ids(TURN), end_body(true, false));
    let chats: Vec<&Span> = f
        .out
        .iter()
        .map(|s| &s.span)
        .filter(|s| s.name.starts_with("chat"))
        .collect();
    assert_eq!(chats[0].start_time_unix_nano, T0 + 8 * MS);
    assert_eq!(
        chats[1].start_time_unix_nano,
        T0 + 299 * MS,
        "starts where the failed attempt ended"
    );
}

#[test]
fn parallel_tools_post_out_of_order() {
    let mut f = Feed::new();
    f.ev("pre_llm_call", 0, ids(TURN), turn_body());
    f.ev(
        "pre_tool_call",
        10,
        tool_ids(TURN, "call_a"),
        tool("read_file"),
    );
    f.ev(
        "pre_tool_call",
        11,
        tool_ids(TURN, "call_b"),
        tool("read_file"),
    );
    f.ev(
        "post_tool_call",
        100,
        tool_ids(TURN, "call_b"),
        tool_done("read_file", "ok", Some(80)),
    );
    f.ev(
        "post_tool_call",
        120,
        tool_ids(TURN, "call_a"),
        tool_done("read_file", "error", Some(100)),
    );
    f.ev("on_session_end", 130, ids(TURN), end_body(true, false));
    let tools: Vec<&Span> = f
        .out
        .iter()
        .map(|s| &s.span)
        .filter(|s| s.name == "execute_tool read_file")
        .collect();
    assert_eq!(tools.len(), 2);
    assert_eq!(string(tools[0], "gen_ai.tool.call.id"), Some("call_b"));
    assert_eq!(tools[0].start_time_unix_nano, T0 + 11 * MS);
    assert_eq!(string(tools[1], "gen_ai.tool.call.id"), Some("call_a"));
    assert_eq!(
        tools[1].status.as_ref().map(|s| s.code),
        Some(StatusCode::Error as i32)
    );
}

#[test]
fn missing_start_is_built_from_the_end_event() {
    let mut f = Feed::new();
    f.ev(
        "post_tool_call",
        500,
        tool_ids(TURN, "call_1"),
        tool_done("terminal", "ok", Some(72)),
    );
    f.ev("on_session_end", 600, ids(TURN), end_body(true, false));
    let tool = f.one("execute_tool terminal");
    assert_eq!(tool.start_time_unix_nano, T0 + 428 * MS);
    let root = f.one("invoke_agent hermes");
    assert_eq!(
        boolean(root, "hermes.incomplete"),
        Some(true),
        "synthesized turn is marked"
    );
    assert_eq!(tool.parent_span_id, root.span_id, "no dangling parent");
    assert!(
        root.start_time_unix_nano <= tool.start_time_unix_nano,
        "the synthesized turn contains its child"
    );
}

#[test]
fn missing_end_is_closed_at_turn_end() {
    let mut f = Feed::new();
    f.ev("pre_llm_call", 0, ids(TURN), turn_body());
    f.ev(
        "pre_tool_call",
        10,
        tool_ids(TURN, "call_1"),
        tool("terminal"),
    );
    f.ev(
        "pre_api_request",
        20,
        api_ids(API1),
        api_body(api(1, 20, 0)),
    );
    f.ev("on_session_end", 90, ids(TURN), end_body(false, true));
    let tool = f.one("execute_tool terminal");
    assert_eq!(boolean(tool, "hermes.incomplete"), Some(true));
    assert_eq!(tool.end_time_unix_nano, T0 + 90 * MS);
    let chat = f.one("chat fake-model-1");
    assert_eq!(boolean(chat, "hermes.incomplete"), Some(true));
    let root = f.one("invoke_agent hermes");
    assert_eq!(boolean(root, "hermes.turn.interrupted"), Some(true));
    assert!(root.status.is_none(), "an interrupted turn is not an error");
}

#[test]
fn turn_without_session_end_closes_after_grace_and_ttl() {
    let mut f = Feed::new();
    f.ev("pre_llm_call", 0, ids(TURN), turn_body());
    f.ev("post_llm_call", 100, ids(TURN), turn_body());
    // Another agent's turn, still open.
    let other = v1::Ids {
        session_id: "other-session".into(),
        ..ids("s:t2:x")
    };
    f.ev("pre_llm_call", 100, other, turn_body());
    f.c.expire(T0 + 1000 * MS, &mut f.out);
    assert!(f.out.is_empty(), "within grace");
    f.c.expire(T0 + 2100 * MS, &mut f.out);
    assert_eq!(f.out.len(), 1);
    assert_eq!(boolean(&f.out[0].span, "hermes.incomplete"), None);
    assert_eq!(f.out[0].span.end_time_unix_nano, T0 + 100 * MS);
    f.c.expire(T0 + 3601 * 1000 * MS, &mut f.out);
    assert_eq!(f.out.len(), 2);
    assert_eq!(boolean(&f.out[1].span, "hermes.incomplete"), Some(true));
    assert_eq!(f.c.stats().expired, 1);
    assert_eq!(f.c.open_turns(), 0);
}

#[test]
fn open_turn_limit_evicts_the_oldest() {
    let mut f = Feed::with(Config {
        max_open_turns: 2,
        ..Config::default()
    });
    // Three agents (sessions) with a turn open each.
    for (i, t) in ["s:a:1", "s:b:1", "s:c:1"].iter().enumerate() {
        let turn_ids = v1::Ids {
            session_id: format!("session-{i}"),
            ..ids(t)
        };
        f.ev("pre_llm_call", i as u64, turn_ids, turn_body());
    }
    assert_eq!(f.c.open_turns(), 2);
    assert_eq!(f.c.stats().turns_evicted, 1);
    assert_eq!(f.out.len(), 1);
    assert_eq!(string(&f.out[0].span, "hermes.turn_id"), Some("s:a:1"));
    assert_eq!(boolean(&f.out[0].span, "hermes.incomplete"), Some(true));
}

#[test]
fn finalize_closes_open_turns_of_the_session() {
    let mut f = Feed::new();
    f.ev("pre_llm_call", 0, ids(TURN), turn_body());
    f.ev("on_session_finalize", 50, session_ids(SESSION), None);
    let root = f.one("invoke_agent hermes");
    assert_eq!(boolean(root, "hermes.incomplete"), Some(true));
    assert_eq!(root.end_time_unix_nano, T0 + 50 * MS);
    assert_eq!(f.c.open_turns(), 0);
}

#[test]
fn subagent_turns_nest_under_the_delegate_tool() {
    let mut f = Feed::new();
    let child_session = "20261129_200231_cccccc";
    let child_turn = "20261129_200231_cccccc:sa-1:aaaa";
    f.ev("pre_llm_call", 0, ids(TURN), turn_body());
    f.ev(
        "pre_tool_call",
        10,
        tool_ids(TURN, "call_d"),
        tool("delegate_task"),
    );
    let link = v1::Ids {
        parent_session_id: SESSION.into(),
        parent_turn_id: TURN.into(),
        child_session_id: child_session.into(),
        child_subagent_id: "sa-1".into(),
        ..Default::default()
    };
    f.ev(
        "subagent_start",
        11,
        link.clone(),
        Some(Body::Subagent(v1::Subagent {
            child_role: "researcher".into(),
            ..Default::default()
        })),
    );
    let cids = v1::Ids {
        session_id: child_session.into(),
        task_id: "sa-1".into(),
        turn_id: child_turn.into(),
        ..Default::default()
    };
    f.ev(
        "pre_llm_call",
        12,
        cids.clone(),
        Some(Body::Turn(v1::Turn {
            platform: "subagent".into(),
            ..Default::default()
        })),
    );
    f.ev("post_llm_call", 40, cids.clone(), None);
    f.ev("on_session_end", 41, cids, end_body(true, false));
    f.ev(
        "subagent_stop",
        42,
        link,
        Some(Body::Subagent(v1::Subagent {
            child_role: "researcher".into(),
            child_status: "completed".into(),
            duration_ms: Some(31),
            ..Default::default()
        })),
    );
    f.ev(
        "post_tool_call",
        43,
        tool_ids(TURN, "call_d"),
        tool_done("delegate_task", "ok", Some(33)),
    );
    f.ev("on_session_end", 50, ids(TURN), end_body(true, false));

    let trace = trace_id(TURN).to_vec();
    assert!(f.out.iter().all(|s| s.span.trace_id == trace), "one trace");
    let tool = f.one("execute_tool delegate_task");
    let names: Vec<_> = f
        .out
        .iter()
        .filter(|s| s.span.name == "invoke_agent researcher")
        .map(|s| s.span.clone())
        .collect();
    assert_eq!(names.len(), 2, "subagent span and child turn");
    let sub = names
        .iter()
        .find(|s| attr(s, "gen_ai.agent.id").is_some())
        .expect("subagent span");
    let child = names
        .iter()
        .find(|s| attr(s, "gen_ai.agent.id").is_none())
        .expect("child turn");
    assert_eq!(sub.parent_span_id, tool.span_id);
    assert_eq!(child.parent_span_id, sub.span_id);
    assert_eq!(
        string(child, "session.id"),
        Some(SESSION),
        "root session groups the trace"
    );
    assert_eq!(string(child, "hermes.session_id"), Some(child_session));
    assert_eq!(string(sub, "hermes.subagent.status"), Some("completed"));
}

#[test]
fn unknown_hooks_become_turn_events() {
    let mut f = Feed::new();
    f.ev("pre_llm_call", 0, ids(TURN), turn_body());
    let mut other = v1::Other::default();
    other.fields.insert(
        "answer".into(),
        v1::Scalar {
            value: Some(v1::scalar::Value::IntValue(42)),
        },
    );
    f.ev(
        "on_human_input_request",
        5,
        ids(TURN),
        Some(Body::Other(other)),
    );
    f.ev("on_session_end", 9, ids(TURN), end_body(true, false));
    let root = f.one("invoke_agent hermes");
    assert_eq!(root.events.len(), 1);
    assert_eq!(root.events[0].name, "hermes.hook.on_human_input_request");
    assert_eq!(f.c.stats().unknown_hooks, 1);
}

#[test]
fn next_turn_of_the_session_closes_a_turn_that_never_ended() {
    let mut f = Feed::new();
    f.ev("pre_llm_call", 0, ids(TURN), turn_body());
    f.ev(
        "pre_api_request",
        10,
        api_ids(API1),
        api_body(api(1, 10, 0)),
    );
    f.ev(
        "api_request_error",
        50,
        api_ids(API1),
        api_body(v1::ApiCall {
            status_code: Some(400),
            retryable: Some(false),
            reason: "format_error".into(),
            ..api(1, 10, 49)
        }),
    );
    // Hermes' failure path fires neither post_llm_call nor on_session_end.
    assert!(
        f.out
            .iter()
            .all(|s| !s.span.name.starts_with("invoke_agent"))
    );
    let next = "20261129_200230_bbf019:task-2:22222222";
    f.ev("pre_llm_call", 100, ids(next), turn_body());
    let root = f.one("invoke_agent hermes");
    assert_eq!(string(root, "hermes.turn_id"), Some(TURN));
    assert_eq!(boolean(root, "hermes.incomplete"), Some(true));
    assert_eq!(
        root.end_time_unix_nano,
        T0 + 50 * MS,
        "ends with its last event"
    );
    assert_eq!(
        root.status.as_ref().map(|s| s.code),
        Some(StatusCode::Error as i32),
        "the failed attempt fails the turn"
    );
    assert_eq!(string(root, "error.type"), Some("format_error"));
    assert_eq!(f.c.open_turns(), 1);
}

#[test]
fn interrupted_attempt_counts_and_keeps_its_server() {
    let mut f = Feed::new();
    f.ev("pre_llm_call", 0, ids(TURN), turn_body());
    f.ev(
        "pre_api_request",
        10,
        api_ids(API1),
        api_body(api(1, 10, 0)),
    );
    f.ev("on_session_end", 90, ids(TURN), end_body(true, true));
    let chat = f.one("chat fake-model-1");
    assert_eq!(boolean(chat, "hermes.incomplete"), Some(true));
    assert_eq!(string(chat, "server.address"), Some("127.0.0.1"));
    let root = f.one("invoke_agent hermes");
    assert_eq!(int(root, "hermes.turn.api_attempts"), Some(1));
    assert!(root.status.is_none());
}

#[test]
fn a_child_never_starts_before_its_turn() {
    let mut f = Feed::new();
    f.ev("pre_llm_call", 100, ids(TURN), turn_body());
    // Hermes' own started_at (another clock reading) lies before the turn.
    f.ev(
        "post_api_request",
        200,
        api_ids(API1),
        api_body(api(1, 40, 190)),
    );
    f.ev("on_session_end", 300, ids(TURN), end_body(true, false));
    let chat = f.one("chat fake-model-1");
    let root = f.one("invoke_agent hermes");
    assert_eq!(
        chat.start_time_unix_nano, root.start_time_unix_nano,
        "clamped to the turn's start"
    );
    assert_eq!(boolean(chat, "hermes.clock_adjusted"), Some(true));
    assert_eq!(boolean(root, "hermes.clock_adjusted"), None);
}

#[test]
fn a_turn_never_ends_before_its_children() {
    let mut f = Feed::new();
    f.ev("pre_llm_call", 0, ids(TURN), turn_body());
    f.ev("post_llm_call", 100, ids(TURN), turn_body());
    // A worker thread's late post (or a clock step) ends a tool after the turn.
    f.ev(
        "pre_tool_call",
        50,
        tool_ids(TURN, "call_1"),
        tool("terminal"),
    );
    f.ev(
        "post_tool_call",
        150,
        tool_ids(TURN, "call_1"),
        tool_done("terminal", "ok", Some(90)),
    );
    f.ev("on_session_end", 160, ids(TURN), end_body(true, false));
    let root = f.one("invoke_agent hermes");
    assert_eq!(root.end_time_unix_nano, T0 + 150 * MS);
    assert_eq!(boolean(root, "hermes.clock_adjusted"), Some(true));
}

#[test]
fn blocked_and_cancelled_tools_are_not_errors() {
    let mut f = Feed::new();
    f.ev("pre_llm_call", 0, ids(TURN), turn_body());
    f.ev(
        "pre_tool_call",
        10,
        tool_ids(TURN, "call_b"),
        tool("terminal"),
    );
    f.ev(
        "post_tool_call",
        11,
        tool_ids(TURN, "call_b"),
        tool_done("terminal", "blocked", Some(0)),
    );
    f.ev(
        "pre_tool_call",
        12,
        tool_ids(TURN, "call_c"),
        tool("terminal"),
    );
    f.ev(
        "post_tool_call",
        13,
        tool_ids(TURN, "call_c"),
        tool_done("terminal", "cancelled", Some(0)),
    );
    f.ev("on_session_end", 20, ids(TURN), end_body(true, false));
    let tools: Vec<&Span> = f
        .out
        .iter()
        .map(|s| &s.span)
        .filter(|s| s.name == "execute_tool terminal")
        .collect();
    assert_eq!(tools.len(), 2);
    for t in tools {
        assert!(t.status.is_none(), "UNSET, not ERROR");
        assert!(matches!(
            string(t, "hermes.tool.status"),
            Some("blocked" | "cancelled")
        ));
    }
}

#[test]
fn reset_closes_open_turns_of_the_session() {
    let mut f = Feed::new();
    f.ev("pre_llm_call", 0, ids(TURN), turn_body());
    f.ev("on_session_reset", 40, session_ids(SESSION), None);
    let root = f.one("invoke_agent hermes");
    assert_eq!(boolean(root, "hermes.incomplete"), Some(true));
    assert_eq!(f.c.open_turns(), 0);
}

#[test]
fn open_state_remembers_the_lowest_queue_position_that_touched_it() {
    let mut f = Feed::new();
    assert_eq!(f.c.min_lsn(), None);
    f.c.set_lsn(7);
    f.ev("on_session_start", 0, session_ids(SESSION), None);
    assert_eq!(f.c.min_lsn(), Some(7), "a pending session start counts");
    f.c.set_lsn(9);
    f.ev("pre_llm_call", 1, ids("turn-1"), turn_body());
    // The turn took the pending start: the turn (9) is what is open now.
    assert_eq!(f.c.min_lsn(), Some(9));
    // A late event from an older record (released by the sequencer after a
    // hole closed) lowers the turn's position.
    f.c.set_lsn(4);
    f.ev(
        "pre_tool_call",
        2,
        tool_ids("turn-1", "call-1"),
        tool("terminal"),
    );
    f.c.set_lsn(12);
    f.ev(
        "post_tool_call",
        3,
        tool_ids("turn-1", "call-1"),
        tool_done("terminal", "ok", Some(1)),
    );
    assert_eq!(f.c.min_lsn(), Some(4));
    f.ev("post_llm_call", 4, ids("turn-1"), turn_body());
    f.ev("on_session_end", 5, ids("turn-1"), end_body(true, false));
    assert_eq!(f.c.min_lsn(), None, "nothing open, nothing needed");
}

#[test]
fn eviction_below_a_queue_position_closes_what_depends_on_it() {
    let mut f = Feed::new();
    f.c.set_lsn(3);
    f.ev("pre_llm_call", 0, ids("turn-old"), turn_body());
    f.c.set_lsn(10);
    let other_session = v1::Ids {
        session_id: "session-2".into(),
        ..ids("turn-new")
    };
    f.ev("pre_llm_call", 1, other_session, turn_body());
    f.c.evict_below_lsn(5, &mut f.out);
    assert_eq!(f.c.open_turns(), 1);
    assert_eq!(f.c.min_lsn(), Some(10));
    assert_eq!(f.c.stats().turns_evicted, 1);
    let old = &f.out[0].span;
    assert_eq!(boolean(old, "hermes.incomplete"), Some(true));
}

#[test]
fn a_backlog_does_not_split_a_turn_at_the_end_grace() {
    let mut f = Feed::new();
    // The collector's clock is 10 s past the events' capture times (events
    // queued in front of the correlator).
    f.c.expire(T0 + 10_000 * MS, &mut f.out);
    f.ev("pre_llm_call", 0, ids(TURN), turn_body());
    f.ev("post_llm_call", 100, ids(TURN), turn_body());
    f.c.expire(T0 + 10_100 * MS, &mut f.out);
    assert!(
        f.out.is_empty(),
        "the grace runs from when the end was seen"
    );
    f.ev("on_session_end", 101, ids(TURN), end_body(true, false));
    assert_eq!(f.names(), ["invoke_agent hermes"]);
    assert_eq!(boolean(&f.out[0].span, "hermes.incomplete"), None);
    f.c.expire(T0 + 20_000 * MS, &mut f.out);
    assert_eq!(
        f.out.len(),
        1,
        "one turn, not a second one from its end event"
    );
}

#[test]
fn a_turn_replayed_with_old_capture_times_lives_while_its_events_arrive() {
    let mut f = Feed::new();
    let ttl = Config::default().state_ttl_nanos;
    // The events were captured two TTLs ago (a spool replayed after a long
    // outage): the clock is far past them, but they arrive now.
    let now = T0 + 2 * ttl;
    f.c.expire(now, &mut f.out);
    f.ev("pre_llm_call", 0, ids(TURN), turn_body());
    f.c.expire(now + 500 * MS, &mut f.out);
    assert!(
        f.out.is_empty(),
        "expired between two batches of its events"
    );
    f.ev("post_llm_call", 100, ids(TURN), turn_body());
    f.ev("on_session_end", 101, ids(TURN), end_body(true, false));
    assert_eq!(f.names(), ["invoke_agent hermes"]);
    assert_eq!(boolean(&f.out[0].span, "hermes.incomplete"), None);
    // Still closed by the TTL once its events stop.
    let mut g = Feed::new();
    g.c.expire(now, &mut g.out);
    g.ev("pre_llm_call", 0, ids(TURN), turn_body());
    g.c.expire(now + ttl, &mut g.out);
    assert_eq!(g.names(), ["invoke_agent hermes"]);
    assert_eq!(boolean(&g.out[0].span, "hermes.incomplete"), Some(true));
}

#[test]
fn one_agent_cannot_evict_the_turns_of_another() {
    let mut f = Feed::with(Config {
        max_open_turns_per_agent: 2,
        ..Config::default()
    });
    let quiet = events::ids("qs", "", "q1");
    f.ev_from(&shim("quiet"), "pre_llm_call", 0, quiet, turn_body());
    for n in 0..5 {
        // A flooding agent opens turns in sessions of its own.
        let flood = events::ids(&format!("fs{n}"), "", &format!("f{n}"));
        f.ev_from(&shim("flood"), "pre_llm_call", 0, flood, turn_body());
    }
    assert_eq!(
        f.c.open_turns(),
        3,
        "2 of the flooder's, 1 of the quiet agent's"
    );
    assert_eq!(f.c.stats().turns_evicted, 3);
    let evicted: Vec<_> = f
        .out
        .iter()
        .map(|s| string(&s.span, "hermes.turn_id"))
        .collect();
    assert_eq!(evicted, [Some("f0"), Some("f1"), Some("f2")]);
}

#[test]
fn far_future_timestamps_do_not_keep_state_forever() {
    let mut f = Feed::new();
    // A shim whose clock is a year ahead.
    let year_ms = 365 * 24 * 3600 * 1000;
    f.ev("pre_llm_call", year_ms, ids(TURN), turn_body());
    f.ev("on_session_start", year_ms, session_ids("other"), None);
    f.c.expire(T0 + 1000 * MS, &mut f.out);
    assert_eq!(f.c.open_turns(), 0, "closed by the TTL, counted both ways");
    assert_eq!(f.c.min_lsn(), None, "the pending session start is gone too");
}

#[test]
fn idle_once_nothing_is_left_for_the_timers() {
    // The pipeline stops its timer while the correlator expects nothing:
    // `expire` must then have nothing to do.
    let mut f = Feed::new();
    assert_eq!(f.c.expiry(), Expiry::Never);
    f.ev("pre_llm_call", 0, ids(TURN), turn_body());
    assert_eq!(f.c.expiry(), Expiry::EveryTick, "an open turn");
    f.ev("post_llm_call", 100, ids(TURN), turn_body());
    f.ev("on_session_end", 101, ids(TURN), end_body(true, false));
    assert_eq!(f.c.open_turns(), 0);
    assert!(!f.out.is_empty());
    // The turn's resource goes at the next tick once its spans are gone.
    f.out.clear();
    assert_eq!(f.c.expiry(), Expiry::EveryTick, "a cached resource");
    f.c.expire(T0 + 200 * MS, &mut f.out);
    assert!(f.out.is_empty());
    assert_eq!(f.c.expiry(), Expiry::Never);
}

#[test]
fn state_only_the_ttl_closes_wakes_the_timers_at_the_ttl() {
    // A session start without a turn and a finished subagent's link are
    // kept for `state_ttl`; the pipeline sleeps until then.
    let ttl = 60_000 * MS;
    let mut f = Feed::with(Config {
        state_ttl_nanos: ttl,
        ..Config::default()
    });
    let link = v1::Ids {
        parent_session_id: SESSION.into(),
        parent_turn_id: TURN.into(),
        child_session_id: "child".into(),
        child_subagent_id: "sa-1".into(),
        ..Default::default()
    };
    f.ev("pre_llm_call", 0, ids(TURN), turn_body());
    f.ev("subagent_start", 10, link.clone(), None);
    f.ev("subagent_stop", 20, link, None);
    f.ev("post_llm_call", 30, ids(TURN), turn_body());
    f.ev("on_session_end", 31, ids(TURN), end_body(true, false));
    let start = session_ids("next");
    f.ev("on_session_start", 40, start, None);
    f.out.clear();
    f.c.expire(T0 + 100 * MS, &mut f.out);
    // The link was last seen at its subagent's start (10 ms).
    assert_eq!(f.c.expiry(), Expiry::At(T0 + 10 * MS + ttl));
    f.c.expire(T0 + 10 * MS + ttl - 1, &mut f.out);
    assert_eq!(f.c.expiry(), Expiry::At(T0 + 10 * MS + ttl), "not yet");
    f.c.expire(T0 + 10 * MS + ttl, &mut f.out);
    assert_eq!(
        f.c.expiry(),
        Expiry::At(T0 + 40 * MS + ttl),
        "the session start"
    );
    f.c.expire(T0 + 40 * MS + ttl, &mut f.out);
    assert_eq!(f.c.expiry(), Expiry::Never);
    assert!(f.out.is_empty(), "TTL-only state closes no span");
}
