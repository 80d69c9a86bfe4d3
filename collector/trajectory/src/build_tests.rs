//! The builder against hand-made records: steps, tool calls and their
//! observations, token counts, retries, parallel tools, subagents, idle.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};

use crate::atif::Source;
use crate::build::{Ending, build};
use crate::record::{AgentInfo, Kind, SpanRecord};

const S: &str = "sess-1";

fn agent() -> AgentInfo {
    AgentInfo {
        service: "hermes-agent".into(),
        instance: "i-1".into(),
        capture: "content".into(),
        shim_version: "0.1.0".into(),
        resource: Default::default(),
    }
}

fn rec(kind: Kind, turn: &str, span: &str, start: u64, attrs: Value) -> SpanRecord {
    SpanRecord {
        kind,
        turn_id: turn.into(),
        own_session: S.into(),
        span_id: span.into(),
        parent_span_id: String::new(),
        start_ns: start,
        end_ns: start + 1,
        error: false,
        attrs: serde_json::from_value(attrs).unwrap(),
    }
}

fn turn(turn: &str, start: u64, user: &str) -> SpanRecord {
    rec(
        Kind::Turn,
        turn,
        &format!("turn-{turn}"),
        start,
        json!({"hermes.turn.user_message": user, "gen_ai.request.model": "m1",
               "gen_ai.agent.name": "hermes", "hermes.turn.completed": true}),
    )
}

fn chat(turn: &str, span: &str, start: u64, output: Value, tokens: (i64, i64, i64)) -> SpanRecord {
    rec(
        Kind::Chat,
        turn,
        span,
        start,
        json!({"gen_ai.output.messages": output.to_string(), "gen_ai.response.model": "m1-2025",
               "gen_ai.usage.input_tokens": tokens.0, "gen_ai.usage.output_tokens": tokens.1,
               "gen_ai.usage.cache_read.input_tokens": tokens.2}),
    )
}

/// A failed API attempt: an error, no answer.
fn failed_chat(turn: &str, span: &str, start: u64, attrs: Value) -> SpanRecord {
    SpanRecord {
        error: true,
        ..rec(Kind::Chat, turn, span, start, attrs)
    }
}

/// A subagent span under the tool span `parent` that delegated to it.
fn subagent(turn: &str, span: &str, parent: &str, start: u64, attrs: Value) -> SpanRecord {
    SpanRecord {
        parent_span_id: parent.into(),
        ..rec(Kind::Subagent, turn, span, start, attrs)
    }
}

/// The message of every step of `doc`, in order.
fn messages(doc: &Value) -> Vec<&str> {
    doc["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["message"].as_str().unwrap())
        .collect()
}

fn calls(ids: &[(&str, &str)]) -> Value {
    let parts: Vec<Value> = ids
        .iter()
        .map(|(id, name)| json!({"type": "tool_call", "id": id, "name": name, "arguments": {"command": "echo"}}))
        .collect();
    json!([{"role": "assistant", "parts": parts}])
}

fn text(t: &str) -> Value {
    json!([{"role": "assistant", "parts": [{"type": "text", "content": t}]}])
}

fn tool(turn: &str, span: &str, start: u64, id: &str, name: &str, result: &str) -> SpanRecord {
    rec(
        Kind::Tool,
        turn,
        span,
        start,
        json!({"gen_ai.tool.call.id": id, "gen_ai.tool.name": name,
               "gen_ai.tool.call.result": result, "hermes.tool.status": "ok"}),
    )
}

#[test]
fn a_tool_turn_is_user_then_call_with_its_result_then_answer() {
    let echo = calls(&[("call_1", "terminal")]);
    let records = vec![
        turn("t1", 10, "run echo"),
        chat("t1", "c1", 20, echo, (100, 10, 40)),
        tool("t1", "x1", 30, "call_1", "terminal", "{\"output\":\"hi\"}"),
        chat("t1", "c2", 40, text("done"), (150, 5, 100)),
    ];
    let t = build(S, &agent(), &records, Ending::Ended);
    let doc = serde_json::to_value(&t).unwrap();
    assert_eq!(doc["schema_version"], "ATIF-v1.8");
    assert_eq!(doc["session_id"], S);
    let steps = doc["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 3);
    assert_eq!(steps[0]["source"], "user");
    assert_eq!(steps[0]["message"], "run echo");
    assert_eq!(steps[1]["source"], "agent");
    assert_eq!(steps[1]["tool_calls"][0]["tool_call_id"], "call_1");
    assert_eq!(
        steps[1]["tool_calls"][0]["arguments"],
        json!({"command": "echo"})
    );
    assert_eq!(
        steps[1]["observation"]["results"][0]["source_call_id"],
        "call_1"
    );
    assert_eq!(
        steps[1]["observation"]["results"][0]["content"],
        "{\"output\":\"hi\"}"
    );
    assert_eq!(
        steps[1]["metrics"],
        json!({"prompt_tokens": 100, "completion_tokens": 10, "cached_tokens": 40})
    );
    assert_eq!(steps[2]["message"], "done");
    assert_eq!(steps[2]["model_name"], "m1-2025");
    let ids: Vec<u64> = steps
        .iter()
        .map(|s| s["step_id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, [1, 2, 3]);
    assert_eq!(
        doc["final_metrics"],
        json!({"total_prompt_tokens": 250, "total_completion_tokens": 15,
               "total_cached_tokens": 140, "total_steps": 3})
    );
    assert!(
        doc.get("extra").is_none(),
        "a session that ended is complete"
    );
    assert!(steps[0].get("metrics").is_none(), "metrics are agent-only");
}

#[test]
fn retries_are_named_on_the_step_that_answered() {
    let records = vec![
        turn("t1", 10, "hi"),
        failed_chat(
            "t1",
            "c0",
            15,
            json!({"error.type": "rate_limit", "hermes.attempt": 1}),
        ),
        chat("t1", "c1", 20, text("hello"), (5, 1, 0)),
    ];
    let doc = serde_json::to_value(build(S, &agent(), &records, Ending::Ended)).unwrap();
    let steps = doc["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2);
    assert_eq!(
        steps[1]["extra"]["failed_attempts"],
        json!([{"attempt": 1, "error.type": "rate_limit"}])
    );
}

#[test]
fn unanswered_failures_become_a_system_step() {
    let failed = failed_chat("t1", "c0", 15, json!({"error.type": "format_error"}));
    let mut t = turn("t1", 10, "hi");
    t.attrs.insert("hermes.turn.completed".into(), json!(false));
    let doc = serde_json::to_value(build(S, &agent(), &[t, failed], Ending::Ended)).unwrap();
    let steps = doc["steps"].as_array().unwrap();
    assert_eq!(steps[1]["source"], "system");
    assert_eq!(steps[1]["extra"]["turn_completed"], false);
    assert!(steps[1].get("metrics").is_none());
}

#[test]
fn parallel_tools_are_one_step_with_both_results_by_call_id() {
    let both = calls(&[("a", "read_file"), ("b", "terminal")]);
    let records = vec![
        turn("t1", 10, "two"),
        chat("t1", "c1", 20, both, (1, 1, 0)),
        tool("t1", "x2", 31, "b", "terminal", "B"),
        tool("t1", "x1", 30, "a", "read_file", "A"),
        chat("t1", "c2", 40, text("ok"), (1, 1, 0)),
    ];
    let doc = serde_json::to_value(build(S, &agent(), &records, Ending::Ended)).unwrap();
    let results = doc["steps"][1]["observation"]["results"]
        .as_array()
        .unwrap();
    let by_id: Vec<(&str, &str)> = results
        .iter()
        .map(|r| {
            (
                r["source_call_id"].as_str().unwrap(),
                r["content"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(by_id, [("a", "A"), ("b", "B")]);
}

#[test]
fn a_subagent_is_embedded_and_referenced_from_its_delegate_task_call() {
    let sub = subagent(
        "t1",
        "sub1",
        "x1",
        32,
        json!({"hermes.child_session_id": "child-1", "gen_ai.agent.name": "leaf"}),
    );
    let mut child_turn = turn("ct1", 33, "do the leaf part");
    child_turn.own_session = "child-1".into();
    child_turn
        .attrs
        .insert("gen_ai.agent.name".into(), json!("leaf"));
    let mut child_chat = chat("ct1", "cc1", 34, text("leaf done"), (7, 3, 0));
    child_chat.own_session = "child-1".into();
    let records = vec![
        turn("t1", 10, "delegate"),
        chat("t1", "c1", 20, calls(&[("d1", "delegate_task")]), (1, 1, 0)),
        tool(
            "t1",
            "x1",
            30,
            "d1",
            "delegate_task",
            "{\"summary\":\"leaf done\"}",
        ),
        sub,
        child_turn,
        child_chat,
        chat("t1", "c2", 40, text("all done"), (1, 1, 0)),
    ];
    let doc = serde_json::to_value(build(S, &agent(), &records, Ending::Ended)).unwrap();
    let subs = doc["subagent_trajectories"].as_array().unwrap();
    assert_eq!(subs.len(), 1);
    assert_eq!(subs[0]["trajectory_id"], "child-1");
    assert_eq!(subs[0]["agent"]["name"], "leaf");
    assert_eq!(subs[0]["steps"][1]["message"], "leaf done");
    assert_eq!(subs[0]["final_metrics"]["total_prompt_tokens"], 7);
    let result = &doc["steps"][1]["observation"]["results"][0];
    assert_eq!(
        result["subagent_trajectory_ref"],
        json!([{"trajectory_id": "child-1", "session_id": "child-1"}])
    );
    let parent_messages = messages(&doc);
    assert!(
        !parent_messages.contains(&"leaf done"),
        "the child's steps stay in its own trajectory"
    );
}

#[test]
fn an_idle_session_is_marked_incomplete() {
    let records = vec![
        turn("t1", 10, "hi"),
        chat("t1", "c1", 20, text("hello"), (1, 1, 0)),
    ];
    let doc = serde_json::to_value(build(S, &agent(), &records, Ending::Idle)).unwrap();
    assert_eq!(doc["extra"]["incomplete"], true);
    assert!(doc["notes"].as_str().unwrap().contains("incomplete"));
}

#[test]
fn a_tool_the_response_did_not_name_is_added_to_the_step_before_it() {
    let mut t = tool("t1", "x1", 30, "zz", "terminal", "R");
    t.attrs
        .insert("gen_ai.tool.call.arguments".into(), json!("[1,2]"));
    let records = vec![
        turn("t1", 10, "hi"),
        chat("t1", "c1", 20, text(""), (1, 1, 0)),
        t,
    ];
    let doc = serde_json::to_value(build(S, &agent(), &records, Ending::Ended)).unwrap();
    assert_eq!(doc["steps"][1]["tool_calls"][0]["tool_call_id"], "zz");
    assert_eq!(
        doc["steps"][1]["tool_calls"][0]["arguments"],
        json!({"value": [1, 2]})
    );
    assert_eq!(
        doc["steps"][1]["observation"]["results"][0]["source_call_id"],
        "zz"
    );
}

#[test]
fn turns_follow_in_start_order_whatever_the_record_order() {
    let records = vec![
        chat("t2", "c2", 120, text("second"), (1, 1, 0)),
        turn("t2", 110, "two"),
        turn("t1", 10, "one"),
        chat("t1", "c1", 20, text("first"), (1, 1, 0)),
    ];
    let doc = serde_json::to_value(build(S, &agent(), &records, Ending::Ended)).unwrap();
    assert_eq!(messages(&doc), ["one", "first", "two", "second"]);
    assert!(
        doc["steps"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["source"] != json!(Source::System))
    );
}

#[test]
fn the_rendering_shows_calls_results_and_subagents() {
    let sub = subagent(
        "t1",
        "sub1",
        "x1",
        32,
        json!({"hermes.child_session_id": "child-1"}),
    );
    let mut child_turn = turn("ct1", 33, "leaf part");
    child_turn.own_session = "child-1".into();
    let records = vec![
        turn("t1", 10, "delegate"),
        chat("t1", "c1", 20, calls(&[("d1", "delegate_task")]), (9, 2, 4)),
        tool("t1", "x1", 30, "d1", "delegate_task", "line1\nline2"),
        sub,
        child_turn,
    ];
    let text = crate::render::render(&build(S, &agent(), &records, Ending::Ended));
    assert!(
        text.contains("#2 agent  m1-2025  tokens 9 in / 2 out (4 cached)"),
        "{text}"
    );
    assert!(
        text.contains("    → delegate_task [d1] {\"command\":\"echo\"}"),
        "{text}"
    );
    assert!(
        text.contains("    ← [d1] line1 line2\n      subagent child-1\n"),
        "{text}"
    );
    assert!(
        text.contains("  subagent child-1:\n    session child-1"),
        "{text}"
    );
    assert!(!text.contains("INCOMPLETE"), "{text}");
}

#[test]
fn a_turn_whose_own_span_never_came_still_gives_its_steps() {
    let records = vec![
        chat("t1", "c1", 20, calls(&[("a", "terminal")]), (3, 1, 0)),
        tool("t1", "x1", 30, "a", "terminal", "one"),
    ];
    let doc = serde_json::to_value(build(S, &agent(), &records, Ending::Idle)).unwrap();
    let steps = doc["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 1, "no user message without the turn span");
    assert_eq!(steps[0]["source"], "agent");
    assert_eq!(steps[0]["observation"]["results"][0]["content"], "one");
    assert_eq!(steps[0]["extra"]["turn_completed"], false);
}
