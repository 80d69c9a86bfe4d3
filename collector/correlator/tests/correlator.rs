//! Unit tests of the correlator's rules, with hand-built events: the spans
//! a turn's events make (nesting, attempts, tools, subagents, times and
//! statuses), whatever order they arrive in. When open state is closed:
//! closing.rs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::Feed;
use common::turn::{API1, API2, SESSION, TURN, api, failed, ids, with_retryable};
use hermes_correlator::ids::{SpanKey, span_id, trace_id};
use hermes_e2e::events::{self, MS, T0, end_body, session_ids};
use hermes_e2e::span_attrs::{attr, boolean, int, string};
use hermes_proto::v1::{self, event::Body};
use hermes_proto::view::WireEvent;
use hermes_span::trace::v1::status::StatusCode;
use prost::Message;

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
    f.turn_start(2, TURN);
    f.api_start(12, API1, 1, 10);
    let call = v1::ApiCall {
        usage: Some(usage(1212, 17)),
        finish_reason: "tool_calls".into(),
        response_model: "fake-model-1".into(),
        ..api(1, 10, 310)
    };
    f.api_done(316, API1, call);
    f.tool_start(320, TURN, "call_1", "terminal");
    f.tool_end(395, TURN, "call_1", "terminal", "ok", Some(72));
    f.api_start(400, API2, 1, 399);
    let call = v1::ApiCall {
        usage: Some(usage(1300, 20)),
        finish_reason: "stop".into(),
        ..api(1, 399, 449)
    };
    f.api_done(450, API2, call);
    f.turn_end(455, TURN);
    f.session_end(456, TURN, true, false);
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

    let chats = f.spans("chat fake-model-1");
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
    // The attributes every span of the turn carries lead each span's, as
    // one shared block for all of them.
    assert!(root.shared.len() >= 5, "{:?}", root.shared);
    for s in f.out.iter().map(|s| &s.span) {
        assert!(s.shared.leads(&s.attributes), "{}", s.name);
        assert_eq!(s.shared.address(), root.shared.address(), "{}", s.name);
    }
    let tool = f.one("execute_tool terminal");
    assert_eq!(string(tool, "gen_ai.tool.call.id"), Some("call_1"));
    assert_eq!(string(tool, "hermes.tool.status"), Some("ok"));
    assert_eq!(int(tool, "hermes.tool.duration_ms"), Some(72));
    assert_eq!(tool.start_time_unix_nano, T0 + 320 * MS);
    assert_eq!(tool.end_time_unix_nano, T0 + 395 * MS);
}

#[test]
fn events_read_in_place_from_their_bytes_give_the_spans_of_decoded_events() {
    // The stage correlates each event as a view of the bytes it came in;
    // the spans must be those of prost's decoded events.
    let shim = events::shim("inst-1");
    for name in hermes_e2e::ingest::FIXTURES {
        for events in hermes_e2e::ingest::fixture_events_both_levels(name) {
            let (mut decoded, mut in_place) = (Vec::new(), Vec::new());
            let mut c = hermes_correlator::Correlator::new(Default::default());
            for e in &events {
                c.ingest(&shim, e, &mut decoded);
            }
            c.flush_all(&mut decoded);
            let mut c = hermes_correlator::Correlator::new(Default::default());
            for e in &events {
                let wire = WireEvent::new(e.encode_to_vec().into()).unwrap();
                c.ingest(&shim, &wire, &mut in_place);
            }
            c.flush_all(&mut in_place);
            assert!(!decoded.is_empty(), "{name}");
            assert_eq!(decoded, in_place, "{name}");
            assert_eq!(c.stats().undecodable_events, 0);
        }
    }
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
    let mut f = Feed::in_turn();
    f.api_start(10, API1, 1, 8);
    let call = v1::ApiCall {
        error_type: "InternalServerError".into(),
        error_message: "Error code: 500".into(),
        ..with_retryable(failed(api(1, 8, 299), 500, "server_error"), true)
    };
    f.api_error(300, API1, call);
    f.api_start(2500, API1, 2, 8);
    let call = v1::ApiCall {
        usage: Some(usage(100, 5)),
        ..api(2, 8, 2569)
    };
    f.api_done(2570, API1, call);
    f.session_end(2600, TURN, true, false);
    let chats = f.spans_starting("chat");
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
    let mut f = Feed::in_turn();
    f.api_error(300, API1, failed(api(1, 8, 299), 429, "rate_limit"));
    f.api_done(1400, API1, api(2, 8, 1399));
    f.session_end(1500, TURN, true, false);
    let chats = f.spans_starting("chat");
    assert_eq!(chats[0].start_time_unix_nano, T0 + 8 * MS);
    assert_eq!(
        chats[1].start_time_unix_nano,
        T0 + 299 * MS,
        "starts where the failed attempt ended"
    );
}

#[test]
fn parallel_tools_post_out_of_order() {
    let mut f = Feed::in_turn();
    f.tool_start(10, TURN, "call_a", "read_file");
    f.tool_start(11, TURN, "call_b", "read_file");
    f.tool_end(100, TURN, "call_b", "read_file", "ok", Some(80));
    f.tool_end(120, TURN, "call_a", "read_file", "error", Some(100));
    f.session_end(130, TURN, true, false);
    let tools = f.spans("execute_tool read_file");
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
    f.tool_end(500, TURN, "call_1", "terminal", "ok", Some(72));
    f.session_end(600, TURN, true, false);
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
    let mut f = Feed::in_turn();
    f.tool_start(10, TURN, "call_1", "terminal");
    f.api_start(20, API1, 1, 20);
    f.session_end(90, TURN, false, true);
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
fn subagent_turns_nest_under_the_delegate_tool() {
    let mut f = Feed::new();
    let child_session = "20261129_200231_cccccc";
    let child_turn = "20261129_200231_cccccc:sa-1:aaaa";
    f.turn_start(0, TURN);
    f.tool_start(10, TURN, "call_d", "delegate_task");
    let link = events::link(SESSION, TURN, child_session, "sa-1");
    let researcher = |child_status: &str, duration_ms| {
        Some(Body::Subagent(v1::Subagent {
            child_role: "researcher".into(),
            child_status: child_status.into(),
            duration_ms,
            ..Default::default()
        }))
    };
    f.ev("subagent_start", 11, link.clone(), researcher("", None));
    let cids = events::ids(child_session, "sa-1", child_turn);
    let subagent_turn = Some(Body::Turn(v1::Turn {
        platform: "subagent".into(),
        ..Default::default()
    }));
    f.ev("pre_llm_call", 12, cids.clone(), subagent_turn);
    f.ev("post_llm_call", 40, cids.clone(), None);
    f.ev("on_session_end", 41, cids, end_body(true, false));
    f.ev("subagent_stop", 42, link, researcher("completed", Some(31)));
    f.tool_end(43, TURN, "call_d", "delegate_task", "ok", Some(33));
    f.session_end(50, TURN, true, false);

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
    let mut f = Feed::in_turn();
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
    f.session_end(9, TURN, true, false);
    let root = f.one("invoke_agent hermes");
    assert_eq!(root.events.len(), 1);
    assert_eq!(root.events[0].name, "hermes.hook.on_human_input_request");
    assert_eq!(f.c.stats().unknown_hooks, 1);
}

#[test]
fn interrupted_attempt_counts_and_keeps_its_server() {
    let mut f = Feed::in_turn();
    f.api_start(10, API1, 1, 10);
    f.session_end(90, TURN, true, true);
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
    f.turn_start(100, TURN);
    // Hermes' own started_at (another clock reading) lies before the turn.
    f.api_done(200, API1, api(1, 40, 190));
    f.session_end(300, TURN, true, false);
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
    let mut f = Feed::in_turn();
    f.turn_end(100, TURN);
    // A worker thread's late post (or a clock step) ends a tool after the turn.
    f.tool_start(50, TURN, "call_1", "terminal");
    f.tool_end(150, TURN, "call_1", "terminal", "ok", Some(90));
    f.session_end(160, TURN, true, false);
    let root = f.one("invoke_agent hermes");
    assert_eq!(root.end_time_unix_nano, T0 + 150 * MS);
    assert_eq!(boolean(root, "hermes.clock_adjusted"), Some(true));
}

#[test]
fn blocked_and_cancelled_tools_are_not_errors() {
    let mut f = Feed::in_turn();
    f.tool_start(10, TURN, "call_b", "terminal");
    f.tool_end(11, TURN, "call_b", "terminal", "blocked", Some(0));
    f.tool_start(12, TURN, "call_c", "terminal");
    f.tool_end(13, TURN, "call_c", "terminal", "cancelled", Some(0));
    f.session_end(20, TURN, true, false);
    let tools = f.spans("execute_tool terminal");
    assert_eq!(tools.len(), 2);
    for t in tools {
        assert!(t.status.is_none(), "UNSET, not ERROR");
        assert!(matches!(
            string(t, "hermes.tool.status"),
            Some("blocked" | "cancelled")
        ));
    }
}
