//! Console exporter: exact tree rendering and buffering until the root.

use hermes_exporter::{ConsoleExporter, ConsoleExporterConfig, SpanExporter};
use opentelemetry_proto::tonic::trace::v1::Span;

use crate::common::*;

/// A 4-span turn: root, a chat call, a failed tool call with an approval
/// under it.
fn turn() -> [Span; 4] {
    let root = turn_root(vec![kv_str("session.id", "sess-42")]);
    let chat = turn_chat(vec![
        kv_str("session.id", "sess-42"),
        kv_int("gen_ai.usage.input_tokens", 1200),
        kv_int("gen_ai.usage.output_tokens", 85),
    ]);
    let mut tool = span(
        TRACE,
        3,
        Some(1),
        "execute_tool terminal",
        900.0,
        1020.0,
        vec![
            kv_str("gen_ai.tool.call.id", "call_1"),
            kv_str("hermes.tool.status", "error"),
            kv_str("error.type", "tool_error"),
        ],
    );
    tool.status = error_status("exit status 1");
    let approval = span(TRACE, 4, Some(3), "approval rm", 950.0, 1000.0, vec![]);
    [root, chat, tool, approval]
}

const EXPECTED_TURN: &str = "\
trace 4bf92f3577b34da6a3ce929d0e0e4736  session=sess-42
invoke_agent hermes  1.50 s
├─ chat gpt-4o  812.3 ms  in=1200 out=85
└─ execute_tool terminal  120.0 ms  ERROR \"exit status 1\"  call_id=call_1  tool.status=error  error.type=tool_error
   └─ approval rm  50.0 ms
";

fn console() -> (ConsoleExporter, SharedBuf) {
    let out = SharedBuf::default();
    let exporter = ConsoleExporter::with_writer(ConsoleExporterConfig::default(), out.clone());
    (exporter, out)
}

#[tokio::test]
async fn renders_a_turn_as_an_exact_tree() {
    let (mut exporter, out) = console();
    let [root, chat, tool, approval] = turn();
    // Arrival order does not matter within a batch.
    exporter
        .export(request(vec![approval, tool, root, chat]))
        .await
        .unwrap();
    assert_eq!(out.text(), EXPECTED_TURN);
}

#[tokio::test]
async fn buffers_children_until_the_root_arrives() {
    let (mut exporter, out) = console();
    let [root, chat, tool, approval] = turn();
    exporter.export(request(vec![chat])).await.unwrap();
    exporter
        .export(request(vec![approval, tool]))
        .await
        .unwrap();
    assert_eq!(out.text(), "", "nothing printed before the root");

    exporter.export(request(vec![root])).await.unwrap();
    assert_eq!(out.text(), EXPECTED_TURN);

    // A span for an already printed trace is a late-span line.
    let late = span(TRACE, 9, Some(1), "chat gpt-4o", 1400.0, 1412.0, vec![]);
    exporter.export(request(vec![late])).await.unwrap();
    assert_eq!(
        out.text(),
        format!("{EXPECTED_TURN}late span trace={TRACE_HEX}  chat gpt-4o  12.0 ms\n")
    );
}

#[tokio::test]
async fn orphans_hang_under_the_root() {
    let (mut exporter, out) = console();
    let [root, chat, ..] = turn();
    let orphan = span(
        TRACE,
        7,
        Some(66),
        "execute_tool read_file",
        20.0,
        25.5,
        vec![],
    );
    exporter
        .export(request(vec![orphan, chat, root]))
        .await
        .unwrap();
    assert_eq!(
        out.text(),
        "\
trace 4bf92f3577b34da6a3ce929d0e0e4736  session=sess-42
invoke_agent hermes  1.50 s
├─ chat gpt-4o  812.3 ms  in=1200 out=85
└─ execute_tool read_file  5.5 ms  (orphan)
"
    );
}

#[tokio::test]
async fn shutdown_prints_incomplete_traces() {
    let (mut exporter, out) = console();
    let [_, chat, ..] = turn();
    exporter.export(request(vec![chat])).await.unwrap();
    exporter.shutdown().await.unwrap();
    assert_eq!(
        out.text(),
        "\
trace 4bf92f3577b34da6a3ce929d0e0e4736  session=sess-42  (incomplete: root span not received before shutdown)
chat gpt-4o  812.3 ms  in=1200 out=85  (orphan)
"
    );
}

#[tokio::test]
async fn color_only_when_asked() {
    let out = SharedBuf::default();
    let mut exporter = ConsoleExporter::with_writer(
        ConsoleExporterConfig {
            color: true,
            ..ConsoleExporterConfig::default()
        },
        out.clone(),
    );
    exporter.export(request(turn().to_vec())).await.unwrap();
    assert!(out.text().contains("\x1b[31mERROR\x1b[0m"));
    let (mut plain, plain_out) = console();
    plain.export(request(turn().to_vec())).await.unwrap();
    assert!(!plain_out.text().contains('\x1b'));
}
