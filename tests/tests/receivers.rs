//! Self-tests of the harness pieces that need no Python: the OTLP receivers,
//! the span tree and the process guard.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hermes_e2e::span_tree::hex;
use hermes_e2e::{
    AttrsExt, ChildGuard, OtlpHttpReceiver, OtlpReceiver, SpanExt, SpanTree, free_port,
    run_with_timeout,
};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValueKind;
use opentelemetry_proto::tonic::common::v1::{AnyValue, ArrayValue, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use prost::Message;
use tonic::codec::CompressionEncoding;

const WAIT: Duration = Duration::from_secs(10);

fn kv(key: &str, value: AnyValueKind) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

fn s(v: &str) -> AnyValueKind {
    AnyValueKind::StringValue(v.to_string())
}

const TRACE: [u8; 16] = [0x11; 16];
const ROOT: [u8; 8] = [0x01; 8];
const CHILD: [u8; 8] = [0x02; 8];

fn span(
    name: &str,
    id: [u8; 8],
    parent: Option<[u8; 8]>,
    start: u64,
    end: u64,
    attrs: Vec<KeyValue>,
) -> Span {
    Span {
        trace_id: TRACE.to_vec(),
        span_id: id.to_vec(),
        parent_span_id: parent.map(|p| p.to_vec()).unwrap_or_default(),
        name: name.to_string(),
        kind: SpanKind::Internal as i32,
        start_time_unix_nano: start,
        end_time_unix_nano: end,
        attributes: attrs,
        ..Default::default()
    }
}

/// A turn span with one chat child, under a `service.name=hermes-agent` resource.
fn sample_request() -> ExportTraceServiceRequest {
    let root = span(
        "invoke_agent hermes",
        ROOT,
        None,
        1_000,
        9_000,
        vec![kv("hermes.turn.tool_calls", AnyValueKind::IntValue(1))],
    );
    let mut child = span(
        "chat fake-model",
        CHILD,
        Some(ROOT),
        2_000,
        3_000,
        vec![
            kv("gen_ai.operation.name", s("chat")),
            kv("gen_ai.usage.input_tokens", AnyValueKind::IntValue(120)),
            kv(
                "gen_ai.response.finish_reasons",
                AnyValueKind::ArrayValue(ArrayValue {
                    values: vec![AnyValue {
                        value: Some(s("tool_calls")),
                    }],
                }),
            ),
        ],
    );
    child.kind = SpanKind::Client as i32;
    child.status = Some(Status {
        code: StatusCode::Ok as i32,
        message: String::new(),
    });
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![kv("service.name", s("hermes-agent"))],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans: vec![root, child],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

fn check_sample_tree(tree: &SpanTree) {
    tree.assert_well_formed();
    assert_eq!(tree.len(), 2, "{}", tree.render());
    let root = tree.expect_one("invoke_agent hermes");
    assert!(root.is_root());
    assert_eq!(root.int_attr("hermes.turn.tool_calls"), Some(1));
    let children = tree.children(root);
    assert_eq!(children.len(), 1);
    let chat = children[0];
    assert_eq!(chat.name, "chat fake-model");
    assert_eq!(chat.kind(), SpanKind::Client);
    assert_eq!(chat.status_code(), StatusCode::Ok);
    assert_eq!(chat.str_attr("gen_ai.operation.name"), Some("chat"));
    assert_eq!(chat.int_attr("gen_ai.usage.input_tokens"), Some(120));
    assert_eq!(
        chat.str_array_attr("gen_ai.response.finish_reasons"),
        Some(vec!["tool_calls".to_string()])
    );
    assert_eq!(
        tree.parent(chat).map(|p| p.name.as_str()),
        Some("invoke_agent hermes")
    );
    assert_eq!(chat.trace_id_hex(), hex(&TRACE));
    let resource = tree
        .resource_of(chat)
        .unwrap_or_else(|| panic!("no resource"));
    assert_eq!(resource.str_attr("service.name"), Some("hermes-agent"));
}

#[tokio::test]
async fn grpc_receiver_accepts_plain_gzip_and_zstd() {
    let receiver = OtlpReceiver::start();
    assert!(receiver.endpoint().starts_with("http://127.0.0.1:"));
    let client = TraceServiceClient::connect(receiver.endpoint())
        .await
        .unwrap_or_else(|e| panic!("connect {}: {e}", receiver.endpoint()));
    let encodings = [
        None,
        Some(CompressionEncoding::Gzip),
        Some(CompressionEncoding::Zstd),
    ];
    for encoding in encodings {
        let mut c = client.clone();
        if let Some(e) = encoding {
            c = c.send_compressed(e);
        }
        c.export(sample_request())
            .await
            .unwrap_or_else(|e| panic!("export with {encoding:?}: {e}"));
    }
    assert!(receiver.wait_for(|spans| spans.len() >= 6, WAIT));
    let exports = receiver.store().exports();
    let seen: Vec<Option<&str>> = exports.iter().map(|e| e.encoding.as_deref()).collect();
    assert_eq!(seen, vec![None, Some("gzip"), Some("zstd")]);
    assert!(exports.iter().all(|e| e.transport == "grpc"));

    // Three copies of the same two spans: the tree keeps one of each.
    let tree = receiver.store().tree();
    assert_eq!(tree.duplicates().len(), 4);
    check_sample_tree(&tree);
}

#[tokio::test]
async fn grpc_receiver_scripted_failure_then_success() {
    let receiver = OtlpReceiver::start();
    receiver.store().fail_next(1);
    let mut client = TraceServiceClient::connect(receiver.endpoint())
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    let err = client
        .export(sample_request())
        .await
        .err()
        .unwrap_or_else(|| panic!("first export should fail"));
    assert_eq!(err.code(), tonic::Code::Unavailable);
    client
        .export(sample_request())
        .await
        .unwrap_or_else(|e| panic!("second export: {e}"));
    assert_eq!(receiver.store().rejected(), 1);
    assert_eq!(receiver.spans().len(), 2);
}

/// A minimal HTTP/1.1 POST over a plain socket; returns (status, body).
fn post(
    url_addr: std::net::SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, Vec<u8>) {
    let mut stream = TcpStream::connect_timeout(&url_addr, WAIT)
        .unwrap_or_else(|e| panic!("connect {url_addr}: {e}"));
    let _ = stream.set_read_timeout(Some(WAIT));
    let _ = stream.set_write_timeout(Some(WAIT));
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nHost: {url_addr}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream
        .write_all(head.as_bytes())
        .and_then(|_| stream.write_all(body))
        .unwrap_or_else(|e| panic!("write: {e}"));
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .unwrap_or_else(|e| panic!("read: {e}"));
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {:?}", String::from_utf8_lossy(&response)));
    let head = String::from_utf8_lossy(&response[..split]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {head:?}"));
    (status, response[split + 4..].to_vec())
}

const PROTOBUF: (&str, &str) = ("Content-Type", "application/x-protobuf");

/// A request and its expected answer: path, headers, body, status.
type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a [u8], u16);

#[test]
fn http_receiver_accepts_protobuf_gzip_and_json() {
    let receiver = OtlpHttpReceiver::start();
    assert_eq!(
        receiver.traces_url(),
        format!("{}/v1/traces", receiver.endpoint())
    );
    let body = sample_request().encode_to_vec();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&body).unwrap_or_else(|e| panic!("gzip: {e}"));
    let gz = gz.finish().unwrap_or_else(|e| panic!("gzip: {e}"));
    let json = serde_json::to_vec(&sample_request()).unwrap_or_else(|e| panic!("json: {e}"));

    // Posted in this order.
    let cases: [Case; 5] = [
        ("/v1/traces", &[PROTOBUF], &body, 200),
        (
            "/v1/traces",
            &[PROTOBUF, ("Content-Encoding", "gzip")],
            &gz,
            200,
        ),
        (
            "/v1/traces",
            &[("Content-Type", "application/json")],
            &json,
            200,
        ),
        ("/v1/logs", &[PROTOBUF], &body, 404),
        ("/v1/traces", &[PROTOBUF], b"\xff\xff", 400),
    ];
    for (path, headers, body, expected) in cases {
        let (status, resp) = post(receiver.addr(), path, headers, body);
        assert_eq!(
            status,
            expected,
            "{path} {headers:?}: {}",
            String::from_utf8_lossy(&resp)
        );
    }

    receiver.store().fail_next(1);
    let (status, _) = post(receiver.addr(), "/v1/traces", &[PROTOBUF], &body);
    assert_eq!(status, 503);

    assert!(receiver.wait_for(|spans| spans.len() >= 6, WAIT));
    let exports = receiver.store().exports();
    assert_eq!(exports.len(), 3);
    assert_eq!(exports[1].encoding.as_deref(), Some("gzip"));
    assert_eq!(exports[2].content_type.as_deref(), Some("application/json"));
    check_sample_tree(&receiver.store().tree());
}

#[test]
fn receiver_restarts_on_same_port_with_same_store() {
    // A port below the ephemeral range, which no OS-chosen port of a
    // parallel test can take between the stop and the restart; a child that
    // a parallel test forks meanwhile may hold the old listener until its
    // exec, which the restart's bind waits out (`otlp_receiver::bind`).
    let first = OtlpHttpReceiver::start_on(free_port());
    let port = first.addr().port();
    let store = first.store().clone();
    first.stop();
    let second = OtlpHttpReceiver::start_with_store(port, store.clone());
    let body = sample_request().encode_to_vec();
    let (status, _) = post(second.addr(), "/v1/traces", &[PROTOBUF], &body);
    assert_eq!(status, 200);
    assert_eq!(store.span_count(), 2);
}

#[test]
fn wait_for_is_bounded() {
    let receiver = OtlpReceiver::start();
    let start = Instant::now();
    assert!(!receiver.wait_for(|spans| !spans.is_empty(), Duration::from_millis(300)));
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
}

#[test]
fn span_tree_reports_orphans_and_bad_nesting() {
    let orphan = span("lost", [0x03; 8], Some([0x09; 8]), 1, 2, vec![]);
    let root = span("root", ROOT, None, 10, 20, vec![]);
    let outside = span("late child", CHILD, Some(ROOT), 15, 25, vec![]);
    let tree = SpanTree::new(vec![
        (Resource::default(), orphan),
        (Resource::default(), root),
        (Resource::default(), outside),
    ]);
    assert_eq!(tree.orphans().len(), 1);
    assert_eq!(tree.roots().len(), 1);
    let problems = tree.problems();
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(tree.render().contains("late child"));
    let root = tree.expect_one("root");
    assert_eq!(tree.descendants(root).len(), 1);
    assert_eq!(tree.ancestors(tree.expect_one("late child")).len(), 1);
}

fn process_alive(pid: u32) -> bool {
    Command::new("kill")
        .args(["-0", &pid.to_string()])
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

#[test]
fn child_guard_kills_the_process_group_on_drop() {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "sleep 60 & echo $!; wait"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut guard = ChildGuard::spawn(&mut cmd).unwrap_or_else(|e| panic!("spawn: {e}"));
    assert!(guard.wait_for_stdout(WAIT, |out| out.contains('\n')));
    let grandchild: u32 = guard
        .stdout_text()
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("pid: {e}"));
    let leader = guard.pid();
    assert!(process_alive(leader) && process_alive(grandchild));
    drop(guard);
    assert!(hermes_e2e::wait_until(
        WAIT,
        Duration::from_millis(20),
        || !process_alive(grandchild)
    ));
    assert!(!process_alive(leader));
}

#[test]
fn run_with_timeout_kills_and_reports() {
    let start = Instant::now();
    let out = run_with_timeout(
        Command::new("sh").args(["-c", "echo before; sleep 60"]),
        Duration::from_millis(500),
    );
    assert!(out.timed_out);
    assert!(!out.success());
    assert_eq!(out.stdout(), "before\n");
    assert!(start.elapsed() < Duration::from_secs(10));

    let out = run_with_timeout(
        Command::new("sh").args(["-c", "echo ok; echo err >&2; exit 3"]),
        WAIT,
    );
    assert!(!out.timed_out);
    assert_eq!(out.output.status.code(), Some(3));
    assert_eq!(
        (out.stdout().as_str(), out.stderr().as_str()),
        ("ok\n", "err\n")
    );
}

#[test]
fn free_port_is_bindable() {
    let port = free_port();
    assert!(port > 0);
    let listener = std::net::TcpListener::bind(("127.0.0.1", port));
    assert!(listener.is_ok(), "port {port}: {listener:?}");
}
