//! Sessions against real span batches and a real directory: partial files,
//! the idle write, the restart, agents without messages, resumed sessions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::atomic::Ordering;

use hermes_span::Str;
use hermes_span::common::v1::any_value::Value as Any;
use hermes_span::common::v1::{AnyValue, KeyValue};
use hermes_span::resource::v1::Resource;
use hermes_span::trace::v1::{ResourceSpans, ScopeSpans, Span};
use serde_json::Value;

use crate::sessions::Sessions;

const IDLE: u64 = 1_000;

fn kv(key: &str, value: Any) -> KeyValue {
    KeyValue {
        key: Str::from(key.to_owned()),
        value: Some(AnyValue { value: Some(value) }),
    }
}

fn s(v: &str) -> Any {
    Any::StringValue(Str::from(v.to_owned()))
}

fn span(id: u8, start: u64, attrs: Vec<KeyValue>) -> Span {
    Span {
        span_id: [id; 8].into(),
        start_time_unix_nano: start,
        end_time_unix_nano: start + 1,
        attributes: attrs,
        ..Span::default()
    }
}

/// One turn of `session` (user message, one answer) from an agent at
/// capture level `capture`.
pub(crate) fn turn(session: &str, turn: &str, id: u8, capture: &str) -> Vec<ResourceSpans> {
    let common = |op: &str| {
        vec![
            kv("session.id", s(session)),
            kv("hermes.turn_id", s(turn)),
            kv("gen_ai.operation.name", s(op)),
        ]
    };
    let mut t = common("invoke_agent");
    t.push(kv("hermes.turn.user_message", s("hello")));
    let mut c = common("chat");
    c.push(kv(
        "gen_ai.output.messages",
        s(r#"[{"role":"assistant","parts":[{"type":"text","content":"hi"}]}]"#),
    ));
    c.push(kv("gen_ai.usage.input_tokens", Any::IntValue(12)));
    vec![ResourceSpans {
        resource: Some(Resource {
            attributes: vec![
                kv("service.name", s("hermes-agent")),
                kv("service.instance.id", s("inst-1")),
                kv("hermes.capture", s(capture)),
            ],
            dropped_attributes_count: 0,
        }),
        scope_spans: vec![ScopeSpans {
            spans: vec![span(id + 1, 20, c), span(id, 10, t)],
            ..ScopeSpans::default()
        }],
        schema_url: String::new(),
    }]
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn read(dir: &Path, name: &str) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join(name)).unwrap()).unwrap()
}

#[test]
fn a_session_is_kept_on_disk_until_idle_then_written_incomplete() {
    let dir = tempfile::tempdir().unwrap();
    let mut sessions = Sessions::open(dir.path(), IDLE).unwrap();
    sessions
        .add(&turn("s1", "t1", 1, "content"), 5_000)
        .unwrap();
    assert_eq!(names(dir.path()), ["s1.partial.jsonl"]);
    assert_eq!(sessions.stats().in_progress.load(Ordering::Relaxed), 1);
    assert_eq!(sessions.next_due(), Some(6_000));
    assert_eq!(sessions.write_due(5_999).unwrap(), 0);
    assert_eq!(sessions.write_due(6_000).unwrap(), 1);
    assert_eq!(names(dir.path()), ["s1.json"]);
    let doc = read(dir.path(), "s1.json");
    assert_eq!(doc["schema_version"], "ATIF-v1.8");
    assert_eq!(doc["extra"]["incomplete"], true);
    assert_eq!(doc["steps"][1]["message"], "hi");
    assert_eq!(doc["steps"][1]["metrics"]["prompt_tokens"], 12);
    assert_eq!(sessions.stats().incomplete.load(Ordering::Relaxed), 1);
    assert_eq!(sessions.stats().in_progress.load(Ordering::Relaxed), 0);
    assert!(sessions.is_empty());
}

#[test]
fn a_restart_continues_the_sessions_in_progress() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = Sessions::open(dir.path(), IDLE).unwrap();
    first.add(&turn("s1", "t1", 1, "content"), 5_000).unwrap();
    drop(first);
    let mut again = Sessions::open(dir.path(), IDLE).unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(
        again.next_due(),
        Some(6_000),
        "the idle time counts from the last batch"
    );
    again.add(&turn("s1", "t2", 10, "content"), 5_500).unwrap();
    again.write_due(7_000).unwrap();
    let doc = read(dir.path(), "s1.json");
    assert_eq!(
        doc["steps"].as_array().unwrap().len(),
        4,
        "both turns, one before the restart"
    );
}

#[test]
fn a_span_delivered_twice_is_one_step() {
    let dir = tempfile::tempdir().unwrap();
    let mut sessions = Sessions::open(dir.path(), IDLE).unwrap();
    let batch = turn("s1", "t1", 1, "content");
    for _ in 0..2 {
        sessions.add(&batch, 0).unwrap();
    }
    sessions.write_due(IDLE).unwrap();
    assert_eq!(
        read(dir.path(), "s1.json")["steps"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn an_agent_without_messages_gets_no_file_and_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let mut sessions = Sessions::open(dir.path(), IDLE).unwrap();
    sessions.add(&turn("s1", "t1", 1, "metadata"), 0).unwrap();
    sessions.add(&turn("s2", "t2", 5, "metadata"), 0).unwrap();
    assert!(sessions.is_empty());
    assert!(names(dir.path()).is_empty());
    assert_eq!(
        sessions
            .stats()
            .spans_without_messages
            .load(Ordering::Relaxed),
        4
    );
}

/// Session `s1` in `dir`: one turn written when idle, then a second turn
/// at 10 s, in progress.
fn resumed(dir: &Path) -> Sessions {
    let mut sessions = Sessions::open(dir, IDLE).unwrap();
    sessions.add(&turn("s1", "t1", 1, "content"), 0).unwrap();
    sessions.write_due(IDLE).unwrap();
    sessions
        .add(&turn("s1", "t2", 10, "content"), 10_000)
        .unwrap();
    sessions
}

#[test]
fn a_resumed_session_continues_in_a_linked_segment() {
    let dir = tempfile::tempdir().unwrap();
    let mut sessions = resumed(dir.path());
    sessions.write_due(10_000 + IDLE).unwrap();
    assert_eq!(names(dir.path()), ["s1.2.json", "s1.json"]);
    assert_eq!(
        read(dir.path(), "s1.json")["continued_trajectory_ref"],
        "s1.2.json"
    );
    let second = read(dir.path(), "s1.2.json");
    assert_eq!(second["session_id"], "s1");
    assert_eq!(second["steps"].as_array().unwrap().len(), 2);
}

#[test]
fn an_unreadable_partial_is_left_in_place_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("bad.partial.jsonl"), b"{not json").unwrap();
    let sessions = Sessions::open(dir.path(), IDLE).unwrap();
    assert!(sessions.is_empty());
    assert_eq!(
        sessions.stats().unreadable_partials.load(Ordering::Relaxed),
        1
    );
    assert_eq!(names(dir.path()), ["bad.partial.jsonl"]);
}

#[tokio::test]
async fn the_sink_holds_an_exported_batch_on_disk_and_keeps_it_at_the_stop() {
    use hermes_exporter::{ExportBatch, SpanExporter};
    use hermes_span::collector::trace::v1::ExportTraceServiceRequest;

    use crate::sink::{AtifExporter, AtifExporterConfig};

    let dir = tempfile::tempdir().unwrap();
    let config = AtifExporterConfig {
        dir: dir.path().to_owned(),
        idle_ms: 3_600_000,
    };
    let mut sink = AtifExporter::new(config.clone(), None, None).unwrap();
    let request = ExportTraceServiceRequest {
        resource_spans: turn("s1", "t1", 1, "content"),
    };
    sink.export(std::sync::Arc::new(ExportBatch::new(request)))
        .await
        .unwrap();
    assert_eq!(
        names(dir.path()),
        ["s1.partial.jsonl"],
        "on disk when export returns"
    );
    sink.shutdown().await.unwrap();
    assert_eq!(
        names(dir.path()),
        ["s1.partial.jsonl"],
        "kept for the next start"
    );
    let again = AtifExporter::new(config, None, None).unwrap();
    assert!(again.destination().contains("ATIF"));
}

#[test]
fn a_session_reads_as_its_segments_then_what_is_in_progress() {
    let dir = tempfile::tempdir().unwrap();
    resumed(dir.path());
    let read = crate::files::read_session(dir.path(), "s1").unwrap();
    let names: Vec<&str> = read.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["s1.json", "s1.partial.jsonl"]);
    let text = crate::render::render(&read[0].1);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("session s1  ATIF-v1.8  agent hermes"),
        "{text}"
    );
    assert!(lines[0].ends_with("INCOMPLETE"), "{text}");
    assert!(
        text.contains("#1 user\n    hello\n#2 agent  tokens 12 in / 0 out\n    hi\n"),
        "{text}"
    );
    assert!(crate::render::render(&read[1].1).contains("in progress"));
    assert!(
        crate::files::read_session(dir.path(), "other")
            .unwrap()
            .is_empty()
    );
}

#[test]
fn an_ended_session_is_written_complete_after_the_grace() {
    use crate::sessions::{END_GRACE_MS, SessionEnd};

    let dir = tempfile::tempdir().unwrap();
    let mut sessions = Sessions::open(dir.path(), 60_000).unwrap();
    sessions
        .add(&turn("s1", "t1", 1, "content"), 1_000)
        .unwrap();
    sessions
        .add(&turn("s2", "t2", 10, "content"), 1_000)
        .unwrap();
    let other = SessionEnd {
        instance_id: "another-instance".into(),
        session_id: "s1".into(),
    };
    sessions.end(&other, 2_000).unwrap();
    assert_eq!(
        sessions.next_due(),
        Some(61_000),
        "another agent's session of that id"
    );
    let end = SessionEnd {
        instance_id: "inst-1".into(),
        session_id: "s1".into(),
    };
    sessions.end(&end, 2_000).unwrap();
    assert_eq!(sessions.next_due(), Some(2_000 + END_GRACE_MS));
    // The end survives a restart.
    drop(sessions);
    let mut sessions = Sessions::open(dir.path(), 60_000).unwrap();
    assert_eq!(sessions.write_due(2_000 + END_GRACE_MS - 1).unwrap(), 0);
    assert_eq!(sessions.write_due(2_000 + END_GRACE_MS).unwrap(), 1);
    let doc = read(dir.path(), "s1.json");
    assert!(doc.get("extra").is_none(), "complete: {doc:#}");
    assert!(doc.get("notes").is_none(), "{doc:#}");
    assert_eq!(names(dir.path()), ["s1.json", "s2.partial.jsonl"]);
    assert_eq!(sessions.stats().incomplete.load(Ordering::Relaxed), 0);
}

#[test]
fn an_end_that_overtakes_the_sessions_spans_still_ends_it() {
    use crate::sessions::{END_GRACE_MS, SessionEnd};

    let dir = tempfile::tempdir().unwrap();
    let mut sessions = Sessions::open(dir.path(), 60_000).unwrap();
    let end = SessionEnd {
        instance_id: "inst-1".into(),
        session_id: "s1".into(),
    };
    sessions.end(&end, 1_000).unwrap();
    sessions
        .add(&turn("s1", "t1", 1, "content"), 1_200)
        .unwrap();
    assert_eq!(sessions.next_due(), Some(1_000 + END_GRACE_MS));
    sessions.write_due(1_000 + END_GRACE_MS).unwrap();
    assert!(read(dir.path(), "s1.json").get("extra").is_none());
    // Past the grace, an early end is forgotten: a later session of that
    // id waits for its own end.
    sessions.end(&end, 10_000).unwrap();
    sessions
        .end(
            &SessionEnd {
                session_id: "other".into(),
                ..end.clone()
            },
            10_000 + END_GRACE_MS,
        )
        .unwrap();
    sessions
        .add(&turn("s1", "t2", 10, "content"), 10_000 + END_GRACE_MS)
        .unwrap();
    assert_eq!(sessions.next_due(), Some(10_000 + END_GRACE_MS + 60_000));
}

#[test]
fn past_the_bound_the_least_recently_active_session_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut sessions = Sessions::open_bounded(dir.path(), 60_000, 2).unwrap();
    sessions.add(&turn("s1", "t1", 1, "content"), 100).unwrap();
    sessions.add(&turn("s2", "t2", 10, "content"), 200).unwrap();
    sessions.add(&turn("s1", "t3", 20, "content"), 300).unwrap();
    sessions.add(&turn("s3", "t4", 30, "content"), 400).unwrap();
    assert_eq!(sessions.len(), 2);
    assert_eq!(
        names(dir.path()),
        ["s1.partial.jsonl", "s2.json", "s3.partial.jsonl"]
    );
    assert_eq!(read(dir.path(), "s2.json")["extra"]["incomplete"], true);
    assert_eq!(sessions.stats().incomplete.load(Ordering::Relaxed), 1);
}

#[test]
fn each_written_file_goes_to_the_log_outbox_without_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let mut sessions = Sessions::open(dir.path(), IDLE).unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::channel(1);
    sessions.send_to(tx);
    sessions
        .add(&turn("s1", "t1", 1, "content"), 5_000)
        .unwrap();
    sessions
        .add(&turn("s2", "t1", 1, "content"), 5_000)
        .unwrap();
    assert_eq!(
        sessions.write_due(6_000).unwrap(),
        2,
        "a full outbox never holds a file"
    );
    assert_eq!(names(dir.path()), ["s1.json", "s2.json"]);
    let finished = rx.try_recv().unwrap();
    assert_eq!(finished.file, "s1.json");
    assert_eq!(finished.session_id, "s1");
    assert!(!finished.complete, "written after the idle time");
    let body: Value = serde_json::from_str(&finished.body).unwrap();
    assert_eq!(body, read(dir.path(), "s1.json"));
    assert_eq!(
        finished.resource.get("service.name"),
        Some(&Value::from("hermes-agent"))
    );
    assert!(finished.last_step_ns > 0);
    assert!(rx.try_recv().is_err(), "the second did not fit");
    let stats = sessions.stats();
    assert_eq!(stats.log_records_failed.load(Ordering::Relaxed), 1);
}

#[test]
fn a_restart_replays_the_record_log_and_skips_a_torn_last_line() {
    use std::io::Write as _;

    let dir = tempfile::tempdir().unwrap();
    let mut first = Sessions::open(dir.path(), IDLE).unwrap();
    first.add(&turn("s1", "t1", 1, "content"), 5_000).unwrap();
    first.add(&turn("s1", "t2", 10, "content"), 5_500).unwrap();
    drop(first);
    let log = dir.path().join("s1.partial.jsonl");
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text.lines().count(), 3, "an open line, then one per batch");
    // A crash in the middle of a third batch's line.
    let mut file = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    file.write_all(b"{\"batch\":{\"seen_ms\":5600,\"rec")
        .unwrap();
    drop(file);

    let mut again = Sessions::open(dir.path(), IDLE).unwrap();
    assert_eq!(again.len(), 1);
    let skipped = |s: &Sessions| s.stats().partial_lines_skipped.load(Ordering::Relaxed);
    assert_eq!(skipped(&again), 1, "the torn line is counted");
    assert_eq!(again.next_due(), Some(6_500), "both earlier batches kept");
    again.add(&turn("s1", "t3", 20, "content"), 5_700).unwrap();
    drop(again);

    let mut third = Sessions::open(dir.path(), IDLE).unwrap();
    assert_eq!(skipped(&third), 0, "no later line glued to the torn one");
    third.write_due(10_000).unwrap();
    let doc = read(dir.path(), "s1.json");
    assert_eq!(
        doc["steps"].as_array().unwrap().len(),
        6,
        "all three turns: {doc:#}"
    );
    assert_eq!(names(dir.path()), ["s1.json"]);
}
