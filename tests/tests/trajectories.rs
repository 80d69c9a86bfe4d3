//! Trajectories (`exporters.atif`, docs/TRACE_MODEL.md "Trajectories") with
//! the real `hermes-agent==0.19.0` at capture level `content`: retries,
//! tool calls, parallel tools, a subagent and a resumed session each give a
//! trajectory file that the pinned ATIF models (`atif==1.8.0`) validate and
//! whose steps, tool calls, observations and token counts are those of the
//! spans the hooks made. A `hermes chat` session ends with its finalize
//! and is complete; `hermes -z` fires no finalize, so its session is
//! written after the idle time, marked incomplete, as is the session of an
//! agent killed with SIGKILL mid-turn.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use hermes_e2e::rig::{AgentRig, WAIT, session_id, subagent_script};
use hermes_e2e::trajectory::{
    assert_log_is_file, assert_matches_spans, atif_section, otlp_logs_section, own_spans,
    trajectory_path, validate_atif, wait_for_trajectory,
};
use hermes_e2e::{AttrsExt, ChildGuard, DEFAULT_HERMES_VERSION, LogsReceiver, wait_until};
use serde_json::{Value, json};
use tempfile::TempDir;

/// Idle time after which a session's trajectory is written: longer than
/// the pauses of these runs (Hermes waits about 2 s, with jitter, before
/// retrying a server error; the CLI's finalize comes as it exits, a few
/// seconds after the turn's last span), so only a session that never ends
/// cleanly is written by it.
const IDLE_MS: u64 = 8_000;
const CONTENT: (&str, &str) = ("HERMES_COLLECTOR_CAPTURE", "content");

fn rig(script: Value) -> (AgentRig, TempDir) {
    rig_with(script, "")
}

/// As [`rig`], the `exporters.atif` section continued with `more`.
fn rig_with(script: Value, more: &str) -> (AgentRig, TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let rig = AgentRig::start_configured(
        script,
        DEFAULT_HERMES_VERSION,
        &format!("{}{more}", atif_section(dir.path(), IDLE_MS)),
    );
    (rig, dir)
}

/// Waits for segment `segment` of `session`, validates it with the ATIF
/// models and returns it.
fn trajectory(rig: &AgentRig, dir: &Path, session: &str, segment: u32) -> Value {
    let path = trajectory_path(dir, session, segment);
    let wait = WAIT + Duration::from_millis(IDLE_MS);
    let doc = wait_for_trajectory(&path, wait, &|| rig.report());
    println!("{}:\n{doc:#}", path.display());
    if let Err(e) = validate_atif(rig.home.venv(), &path) {
        panic!("{} is not valid ATIF:\n{e}\n{doc:#}", path.display());
    }
    assert_eq!(doc["schema_version"], "ATIF-v1.8");
    assert_eq!(doc["session_id"], session);
    doc
}

/// Whether `doc` is marked incomplete (written after the idle time).
fn incomplete(doc: &Value) -> bool {
    doc["extra"]["incomplete"] == true
}

fn chat(rig: &AgentRig, query: &str, toolsets: &str, args: &[&str]) -> String {
    let out = rig
        .home
        .run_chat_with(query, toolsets, args, &rig.env(&[CONTENT]));
    assert!(out.status.success(), "{}", rig.report());
    session_id(&out)
}

#[test]
fn retries_and_parallel_tools_give_valid_trajectories_of_their_hooks() {
    let files = tempfile::tempdir().unwrap();
    let a = files.path().join("alpha.txt");
    let b = files.path().join("beta.txt");
    std::fs::write(&a, "alpha contents\n").unwrap();
    std::fs::write(&b, "beta contents\n").unwrap();
    let (rig, dir) = rig(json!([
        {"error": 500},
        {"error": 429, "retry_after": 0.1},
        {"content": "Recovered after two failures.",
         "usage": {"prompt_tokens": 321, "completion_tokens": 12}},
        {"tool_calls": [
            {"name": "read_file", "arguments": {"path": a.to_string_lossy()}},
            {"name": "read_file", "arguments": {"path": b.to_string_lossy()}}
         ],
         "usage": {"prompt_tokens": 500, "completion_tokens": 40}},
        {"content": "Both files read.", "usage": {"prompt_tokens": 700, "completion_tokens": 9}}
    ]));
    let retried = chat(&rig, "Say hello", "terminal", &[]);
    let parallel = chat(&rig, "Read alpha.txt and beta.txt", "file", &[]);

    let doc = trajectory(&rig, dir.path(), &retried, 1);
    assert!(!incomplete(&doc), "ended by its finalize: {doc:#}");
    let spans = rig.receiver.spans();
    assert_matches_spans(&doc, &own_spans(&spans, &retried));
    let steps = doc["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2, "{doc:#}");
    assert_eq!(steps[0]["message"], "Say hello");
    assert_eq!(steps[1]["message"], "Recovered after two failures.");
    let failed = steps[1]["extra"]["failed_attempts"].as_array().unwrap();
    assert_eq!(failed.len(), 2, "both failed attempts named: {doc:#}");

    let doc = trajectory(&rig, dir.path(), &parallel, 1);
    assert!(!incomplete(&doc), "ended by its finalize: {doc:#}");
    assert_matches_spans(&doc, &own_spans(&spans, &parallel));
    let steps = doc["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 3, "{doc:#}");
    let calls = steps[1]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "{doc:#}");
    assert_eq!(
        steps[1]["observation"]["results"].as_array().unwrap().len(),
        2
    );
    let contents: Vec<&str> = steps[1]["observation"]["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["content"].as_str().unwrap())
        .collect();
    assert!(
        contents.iter().any(|c| c.contains("alpha contents")),
        "{contents:?}"
    );
    assert!(
        contents.iter().any(|c| c.contains("beta contents")),
        "{contents:?}"
    );
    assert_eq!(steps[2]["message"], "Both files read.");
    assert_eq!(doc["final_metrics"]["total_prompt_tokens"], 1200);
    assert_eq!(
        rig.collector
            .metric("hermes_collector_trajectories_written_total"),
        2.0
    );
    assert_eq!(
        rig.collector
            .metric("hermes_collector_trajectories_incomplete_total"),
        0.0
    );
}

#[test]
fn a_subagent_is_embedded_and_referenced_from_delegate_task() {
    let (rig, dir) = rig(subagent_script());
    let out = rig.home.hermes(
        &[
            "-z",
            "Delegate running echo from-child to a subagent",
            "-t",
            "terminal,delegation",
        ],
        &rig.env(&[CONTENT]),
        hermes_e2e::hermes::DEFAULT_RUN_TIMEOUT,
    );
    assert!(out.success(), "{}\n{}", out.describe(), rig.report());
    // `hermes -z` prints no session id: the spans carry it.
    assert!(rig.wait_for(|s| s.iter().any(|(_, s)| s.has_attr("hermes.child_session_id"))));
    let spans = rig.receiver.spans();
    let sub = spans
        .iter()
        .find(|(_, s)| s.has_attr("hermes.child_session_id"))
        .map(|(_, s)| s)
        .unwrap();
    let session = sub.str_attr("session.id").unwrap().to_owned();
    let child = sub.str_attr("hermes.child_session_id").unwrap().to_owned();

    let doc = trajectory(&rig, dir.path(), &session, 1);
    assert!(incomplete(&doc), "hermes -z fires no finalize: {doc:#}");
    let spans = rig.receiver.spans();
    assert_matches_spans(&doc, &own_spans(&spans, &session));
    let subs = doc["subagent_trajectories"].as_array().unwrap();
    assert_eq!(subs.len(), 1, "{doc:#}");
    assert_eq!(subs[0]["trajectory_id"], child.as_str());
    assert_matches_spans(&subs[0], &own_spans_of_child(&spans, &session, &child));
    let delegate = doc["steps"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| {
            s["observation"]["results"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .find(|r| r.get("subagent_trajectory_ref").is_some())
        .unwrap_or_else(|| panic!("no subagent reference: {doc:#}"));
    assert_eq!(
        delegate["subagent_trajectory_ref"][0]["trajectory_id"],
        child.as_str()
    );
    let child_steps = subs[0]["steps"].as_array().unwrap();
    assert_eq!(
        child_steps.last().unwrap()["message"],
        "The child printed from-child."
    );
}

/// The spans of the child session `child` of `session`.
fn own_spans_of_child<'a>(
    spans: &'a [(
        opentelemetry_proto::tonic::resource::v1::Resource,
        opentelemetry_proto::tonic::trace::v1::Span,
    )],
    session: &str,
    child: &str,
) -> Vec<&'a opentelemetry_proto::tonic::trace::v1::Span> {
    let mut own: Vec<_> = spans
        .iter()
        .map(|(_, s)| s)
        .filter(|s| s.str_attr("session.id") == Some(session))
        .filter(|s| s.str_attr("hermes.session_id") == Some(child))
        .collect();
    own.sort_by_key(|s| s.start_time_unix_nano);
    own
}

#[test]
fn a_resumed_session_continues_in_a_linked_segment() {
    let (rig, dir) = rig(json!([
        {"content": "First answer.", "usage": {"prompt_tokens": 120, "completion_tokens": 6}},
        {"content": "Resumed answer.", "usage": {"prompt_tokens": 220, "completion_tokens": 7}}
    ]));
    let session = chat(&rig, "Say one", "terminal", &[]);
    let first = trajectory(&rig, dir.path(), &session, 1);
    assert_eq!(first["steps"].as_array().unwrap().len(), 2, "{first:#}");
    assert!(!incomplete(&first), "{first:#}");
    let resumed = chat(&rig, "Say two", "terminal", &["--resume", &session]);
    assert_eq!(resumed, session, "resumed the same session");

    let second = trajectory(&rig, dir.path(), &session, 2);
    let steps = second["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2, "{second:#}");
    assert_eq!(steps[0]["message"], "Say two");
    assert_eq!(steps[1]["message"], "Resumed answer.");
    assert_eq!(steps[1]["metrics"]["prompt_tokens"], 220);
    assert!(!incomplete(&second), "{second:#}");
    let first = trajectory(&rig, dir.path(), &session, 1);
    assert_eq!(
        first["continued_trajectory_ref"],
        format!("{session}.2.json"),
        "{first:#}"
    );
}

#[test]
fn a_killed_agent_still_yields_its_trajectory_marked_incomplete() {
    let (rig, dir) = rig(json!([
        {"tool_calls": [{"name": "terminal", "arguments": {"command": "echo before-the-kill"}}],
         "usage": {"prompt_tokens": 10, "completion_tokens": 1}},
        {"tool_calls": [{"name": "terminal", "arguments": {"command": "sleep 120"}}],
         "usage": {"prompt_tokens": 20, "completion_tokens": 2}}
    ]));
    let mut cmd = rig.home.command("hermes", &rig.env(&[CONTENT]));
    cmd.args(["chat", "-q", "Echo, then sleep", "-Q", "-t", "terminal"]);
    let mut agent = ChildGuard::spawn_named("hermes", &mut cmd).unwrap();
    // The first tool's span and the second call's attempt are exported.
    let second_call = |s: &[(_, opentelemetry_proto::tonic::trace::v1::Span)]| {
        s.iter()
            .filter(|(_, s)| s.str_attr("gen_ai.operation.name") == Some("chat"))
            .count()
            >= 2
            && s.iter()
                .any(|(_, s)| s.str_attr("gen_ai.operation.name") == Some("execute_tool"))
    };
    assert!(rig.wait_for(second_call), "{}", rig.report());
    agent.kill();
    let spans = rig.receiver.spans();
    let session = spans
        .iter()
        .find_map(|(_, s)| s.str_attr("session.id"))
        .unwrap()
        .to_owned();

    let doc = trajectory(&rig, dir.path(), &session, 1);
    assert!(incomplete(&doc), "{doc:#}");
    assert_eq!(
        rig.collector
            .metric("hermes_collector_trajectories_incomplete_total"),
        1.0
    );
    assert!(doc["notes"].as_str().unwrap().contains("incomplete"));
    let spans = rig.receiver.spans();
    assert_matches_spans_without_turn(&doc, &own_spans(&spans, &session));
    let text = doc.to_string();
    assert!(text.contains("before-the-kill"), "{doc:#}");
}

/// As [`assert_matches_spans`] for a session whose last turn never closed
/// (no turn span, so no user step).
fn assert_matches_spans_without_turn(
    doc: &Value,
    spans: &[&opentelemetry_proto::tonic::trace::v1::Span],
) {
    assert!(
        spans
            .iter()
            .all(|s| s.str_attr("gen_ai.operation.name") != Some("invoke_agent")),
        "the killed turn's span came"
    );
    assert_matches_spans(doc, spans);
}

#[test]
fn each_trajectory_file_is_also_one_otlp_log_record() {
    let logs = LogsReceiver::start_http();
    let (rig, dir) = rig_with(
        json!([
            {"tool_calls": [{"name": "terminal", "arguments": {"command": "echo logged"}}],
             "usage": {"prompt_tokens": 30, "completion_tokens": 3}},
            {"content": "Echoed.", "usage": {"prompt_tokens": 40, "completion_tokens": 4}},
            {"content": "Second.", "usage": {"prompt_tokens": 50, "completion_tokens": 5}}
        ]),
        &otlp_logs_section(&logs.endpoint(), "http/protobuf", 30),
    );
    let first = chat(&rig, "Echo logged", "terminal", &[]);
    let second = chat(&rig, "Say second", "terminal", &[]);
    trajectory(&rig, dir.path(), &first, 1);
    trajectory(&rig, dir.path(), &second, 1);
    assert!(
        logs.store().wait_for_records(2, WAIT),
        "{:?}\n{}",
        logs.store().records(),
        rig.report()
    );
    let spans = rig.receiver.spans();
    let service = spans[0].0.str_attr("service.name").unwrap().to_owned();
    let records = logs.store().records();
    let mut sessions: Vec<String> = records
        .iter()
        .map(|log| {
            let doc = assert_log_is_file(log, dir.path(), rig.home.venv(), &service);
            assert!(!incomplete(&doc), "{doc:#}");
            doc["session_id"].as_str().unwrap().to_owned()
        })
        .collect();
    sessions.sort();
    let mut expected = vec![first, second];
    expected.sort();
    assert_eq!(sessions, expected, "one record per file");
    let files = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            let name = name.to_string_lossy();
            name.ends_with(".json") && !name.starts_with('.')
        })
        .count();
    assert_eq!(files, records.len(), "one record per written file");
    assert_eq!(
        rig.collector
            .metric("hermes_collector_trajectory_log_records_sent_total"),
        2.0
    );
}

#[test]
fn a_log_backend_that_is_down_leaves_the_files_and_counts_the_failure() {
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let (rig, dir) = rig_with(
        json!([{"content": "Unlogged.", "usage": {"prompt_tokens": 10, "completion_tokens": 1}}]),
        &otlp_logs_section(&endpoint, "grpc", 1),
    );
    let session = chat(&rig, "Say unlogged", "terminal", &[]);
    let doc = trajectory(&rig, dir.path(), &session, 1);
    assert!(!incomplete(&doc), "{doc:#}");
    let failed = || {
        rig.collector
            .metric("hermes_collector_trajectory_log_records_failed_total")
    };
    assert!(
        wait_until(WAIT, Duration::from_millis(200), || failed() >= 1.0),
        "the failed record is counted: {}\n{}",
        failed(),
        rig.report()
    );
    assert_eq!(
        rig.collector
            .metric("hermes_collector_trajectory_log_records_sent_total"),
        0.0
    );
    assert_eq!(
        rig.collector
            .metric("hermes_collector_trajectories_written_total"),
        1.0
    );
}
