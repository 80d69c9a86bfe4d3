//! End-to-end scenarios of turns that do not end well: the real
//! `hermes-agent==0.19.0` (CLI or Python API) with our shim, against the
//! scripted OpenAI server, streaming to the real `hermes-collector`. A
//! non-retryable error, exhausted retries, a failed turn the Python API
//! never ends explicitly, and an interrupted turn each give the exact span
//! tree of `docs/TRACE_MODEL.md`, nothing left dangling. The successful
//! scenarios are in `e2e_scenarios.rs`; both share `scenario/`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod scenario;

use hermes_e2e::AttrsExt;
use scenario::*;
use serde_json::json;

/// A non-retryable 400: Hermes gives up after one attempt and returns
/// `failed` without firing `post_llm_call` or `on_session_end` (it returns
/// before its turn finalizer); the CLI then fires `on_session_finalize`,
/// which closes the turn as incomplete. One ERROR chat span under a turn
/// that is not marked completed, nothing dangling.
#[test]
fn non_retryable_error_fails_the_turn_without_dangling_spans() {
    let mut sc = scenario(json!([
        {"error": 400, "message": BAD_REQUEST_MESSAGE}
    ]));
    let run = sc.chat("Say hello", "terminal", &[]);
    assert!(!run.out.status.success(), "{}", run.describe());
    assert_eq!(sc.server.main_requests().len(), 1, "no retry of a 400");

    // Neither completed nor interrupted is known (no on_session_end): the
    // turn was closed by on_session_finalize, as incomplete.
    let OneTurn { tree, model, tid } =
        sc.collect_turn(2, &run.session, &TurnExpect::failed("format_error", 1));
    let root = only_root(&tree);
    let chats = tree.expect_children(root, 1);
    assert_chat_error(
        &tree,
        chats[0],
        &ChatExpect::first(&model, sc.server.port(), &tid, 1, (0, 0), ""),
        &BAD_REQUEST,
    );
}

/// Three 429s: Hermes' retries (3 attempts) are exhausted and the turn
/// fails. Three ERROR chat spans of one request, attempts 1..3, under a
/// turn closed (incomplete) by `on_session_finalize`.
#[test]
fn exhausted_retries_fail_the_turn_with_one_span_per_attempt() {
    let mut sc = scenario(json!([
        {"error": 429, "retry_after": 0.1},
        {"error": 429, "retry_after": 0.1},
        {"error": 429, "retry_after": 0.1}
    ]));
    let run = sc.chat("Say hello", "terminal", &[]);
    assert!(!run.out.status.success(), "{}", run.describe());
    assert!(
        run.stdout().contains("failed after 3 retries"),
        "{}",
        run.describe()
    );
    assert_eq!(sc.server.main_requests().len(), 3);

    let OneTurn { tree, model, tid } =
        sc.collect_turn(4, &run.session, &TurnExpect::failed("rate_limit", 3));
    let root = only_root(&tree);
    let chats = tree.expect_children(root, 3);
    for (i, chat) in chats.iter().enumerate() {
        assert_chat_error(
            &tree,
            chat,
            &ChatExpect::first(&model, sc.server.port(), &tid, 1, (0, 0), "").attempt(i as i64 + 1),
            &RATE_LIMITED,
        );
    }
}

/// The same non-retryable 400 from the Python API, then a second, successful
/// turn on the same agent. No host fires `on_session_finalize` here (nor
/// does the messaging gateway after each turn), and Hermes skips
/// `on_session_end` on its failure paths, so nothing ends the failed turn
/// explicitly. It must still be exported once the agent has moved on (the
/// session's next turn started, or its process exited), not only at
/// `correlator.state_ttl_secs` (1 h by default).
#[test]
fn failed_turn_in_python_api_does_not_dangle() {
    let mut sc = scenario(json!([
        {"error": 400, "message": BAD_REQUEST_MESSAGE},
        {"content": "Second turn worked.", "usage": {"prompt_tokens": 130, "completion_tokens": 3}}
    ]));
    let result = sc.python(
        r#"
agent = make_agent()
first = agent.run_conversation("Say hello")
second = agent.run_conversation("Say hello again")
print("E2E " + json.dumps({"session": agent.session_id,
                           "first": {k: first.get(k) for k in ("completed", "failed")},
                           "second": second.get("final_response")}))
"#,
        &[],
    );
    assert_eq!(
        result["first"],
        json!({"completed": false, "failed": true}),
        "{result}"
    );
    assert_eq!(result["second"].as_str(), Some("Second turn worked."));
    let session = result["session"].as_str().expect("session").to_string();

    let tree = sc.collect(2, 4);
    assert_common(&tree, &session);
    let roots = tree.roots();
    let model = sc.model().to_string();
    let port = sc.server.port();
    let failed = TurnExpect::failed("format_error", 1);
    let (chat, t1) = assert_top_turn_with_one_chat(&tree, roots[0], &model, &failed);
    let first = ChatExpect::first(&model, port, &t1, 1, (0, 0), "");
    assert_chat_error(&tree, chat, &first, &BAD_REQUEST);
    let completed = TurnExpect::completed(1, 0, (130, 3));
    let (chat, t2) = assert_top_turn_with_one_chat(&tree, roots[1], &model, &completed);
    assert_chat_ok(
        &tree,
        chat,
        &ChatExpect::first(&model, port, &t2, 1, (130, 3), "stop"),
    );
    assert!(roots[0].end_time_unix_nano <= roots[1].start_time_unix_nano);
}

/// `AIAgent.interrupt()` while the model call is in flight (the server
/// delays its answer): Hermes abandons the attempt (no post_api_request or
/// api_request_error for it) and ends the turn with `on_session_end(
/// interrupted=True)`. The open attempt is closed at the turn's end as
/// incomplete, the turn is interrupted (not an error) and counts it.
#[test]
fn interrupted_turn_closes_the_open_attempt() {
    let mut sc = scenario(json!([
        {"content": "Too late.", "delay_ms": 15000}
    ]));
    let log = sc.server.log_path().to_string_lossy().into_owned();
    let result = sc.python(
        r#"
import threading, time
agent = make_agent()

def interrupt_when_the_request_is_in_flight():
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            with open(os.environ["E2E_FAKE_LOG"], encoding="utf-8") as fh:
                if any(json.loads(l).get("kind") == "main" for l in fh if l.strip()):
                    break
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    time.sleep(0.3)
    agent.interrupt("stopped by the e2e test")

threading.Thread(target=interrupt_when_the_request_is_in_flight, daemon=True).start()
r = agent.run_conversation("Say something slowly")
print("E2E " + json.dumps({"session": agent.session_id, "completed": r.get("completed"),
                           "interrupted": r.get("interrupted"), "failed": r.get("failed")}))
"#,
        &[("E2E_FAKE_LOG", &log)],
    );
    assert_eq!(result["interrupted"], json!(true), "{result}");
    let session = result["session"].as_str().expect("session").to_string();

    // Hermes 0.19.0 reports completed=True together with interrupted=True
    // for an interrupted turn; the span carries what the hook said.
    let OneTurn { tree, model, tid } = sc.collect_turn(
        2,
        &session,
        &TurnExpect {
            failed_with: None,
            completed: result["completed"].as_bool(),
            interrupted: Some(true),
            api_attempts: 1,
            tool_calls: 0,
            usage: (0, 0),
            session_start: true,
            incomplete: false,
        },
    );
    let root = only_root(&tree);
    let chats = tree.expect_children(root, 1);
    let chat = chats[0];
    assert_chat_common(
        &tree,
        chat,
        &ChatExpect::first(&model, sc.server.port(), &tid, 1, (0, 0), ""),
    );
    assert_eq!(
        chat.bool_attr("hermes.incomplete"),
        Some(true),
        "{}",
        tree.render()
    );
    assert!(!chat.has_attr("gen_ai.usage.input_tokens"));
    assert!(chat.end_time_unix_nano <= root.end_time_unix_nano);
}
