//! File exporter: OTLP JSON lines, checked against the OTLP/JSON rules.

use std::sync::Arc;

use hermes_exporter::{FileExporter, FileExporterConfig, SpanExporter};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use serde_json::Value;

use crate::common::*;

#[tokio::test]
async fn appends_one_otlp_json_line_per_export() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spans.jsonl");
    let mut exporter = FileExporter::new(FileExporterConfig { path: path.clone() }).unwrap();

    let mut chat = turn_chat(vec![
        kv_int("gen_ai.usage.input_tokens", 1200),
        kv_str("gen_ai.request.model", "gpt-4o"),
    ]);
    chat.kind = 3; // CLIENT
    chat.status = error_status("boom");
    let root = turn_root(vec![]);
    let first = request(vec![chat]);
    let second = request(vec![root]);
    exporter.export(Arc::clone(&first)).await.unwrap();
    exporter.export(Arc::clone(&second)).await.unwrap();

    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2);
    assert!(text.ends_with('\n'));

    let json: Value = serde_json::from_str(lines[0]).unwrap();
    let rs = &json["resourceSpans"][0];
    assert_eq!(
        rs["resource"]["attributes"][0],
        serde_json::json!({"key": "service.name", "value": {"stringValue": "hermes-agent"}})
    );
    // int64 as a decimal string.
    assert_eq!(
        rs["resource"]["attributes"][1]["value"],
        serde_json::json!({"intValue": "4242"})
    );
    assert_eq!(rs["scopeSpans"][0]["scope"]["name"], "hermes-collector");
    let s = &rs["scopeSpans"][0]["spans"][0];
    // Ids as lowercase hex, not base64.
    assert_eq!(s["traceId"], TRACE_HEX);
    assert_eq!(s["spanId"], "0000000000000002");
    assert_eq!(s["parentSpanId"], "0000000000000001");
    // Enums as integers, fixed64 times as strings.
    assert_eq!(s["kind"], 3);
    assert_eq!(s["status"]["code"], 2);
    assert_eq!(s["status"]["message"], "boom");
    assert_eq!(s["startTimeUnixNano"], (T0 + 10 * MS).to_string());
    assert_eq!(s["endTimeUnixNano"], (T0 + 822_300_000).to_string());
    assert_eq!(s["name"], "chat gpt-4o");
    assert_eq!(
        s["attributes"][0],
        serde_json::json!({"key": "gen_ai.usage.input_tokens", "value": {"intValue": "1200"}})
    );
    // No snake_case keys anywhere.
    assert!(!lines[0].contains("_id\""), "{}", lines[0]);
    assert!(!lines[0].contains("resource_spans"));

    // Root span: empty parent id.
    let json: Value = serde_json::from_str(lines[1]).unwrap();
    assert_eq!(
        json["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["parentSpanId"],
        ""
    );

    // Round trip.
    let back: ExportTraceServiceRequest = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(back, ExportTraceServiceRequest::from(first.request()));
    let back: ExportTraceServiceRequest = serde_json::from_str(lines[1]).unwrap();
    assert_eq!(back, ExportTraceServiceRequest::from(second.request()));
}

#[tokio::test]
async fn reopens_in_append_mode() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spans.jsonl");
    std::fs::write(&path, "existing\n").unwrap();
    let mut exporter = FileExporter::new(FileExporterConfig { path: path.clone() }).unwrap();
    exporter.export(request(leaf_spans(2, 1))).await.unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with("existing\n{\"resourceSpans\":["), "{text}");
}

#[test]
fn unwritable_path_fails_at_construction() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("file");
    std::fs::write(&blocker, "").unwrap();
    // A directory cannot be created under a regular file.
    let err = FileExporter::new(FileExporterConfig {
        path: blocker.join("sub/spans.jsonl"),
    })
    .unwrap_err();
    assert!(
        matches!(err, hermes_exporter::ExportError::Io { .. }),
        "{err:?}"
    );
}

#[test]
fn a_missing_directory_is_an_error_not_created() {
    let dir = tempfile::tempdir().unwrap();
    let err = FileExporter::new(FileExporterConfig {
        path: dir.path().join("typo/spans.jsonl"),
    })
    .unwrap_err();
    assert!(
        matches!(err, hermes_exporter::ExportError::Io { .. }),
        "{err:?}"
    );
    assert!(!dir.path().join("typo").exists());
}

#[test]
fn errors_show_the_path_as_given() {
    let dir = tempfile::tempdir().unwrap();
    let err = FileExporter::new_shown(
        FileExporterConfig {
            path: dir.path().join("s3cret/spans.jsonl"),
        },
        "${SPAN_DIR}/spans.jsonl".into(),
    )
    .unwrap_err();
    let shown = err.to_string();
    assert!(
        shown.contains("${SPAN_DIR}") && !shown.contains("s3cret"),
        "{shown}"
    );
}
