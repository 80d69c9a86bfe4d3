//! End to end: the real `hermes-agent==0.19.0` with our shim installed and
//! enabled, driven by `hermes chat -q` against the scripted OpenAI server,
//! streaming to the real `hermes-collector` binary, which exports to an
//! in-test OTLP receiver (gRPC or HTTP/protobuf) or to its embedded default
//! (span file + console tree).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use hermes_e2e::basic_turn;
use hermes_e2e::collector::Collector;
use hermes_e2e::span_tree::hex;
use hermes_e2e::{
    AttrsExt, FakeOpenAi, HermesHome, OtlpHttpReceiver, OtlpReceiver, SpanExt, SpanTree,
};
use opentelemetry_proto::tonic::trace::v1::Span;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

/// The value of a Prometheus sample line starting with `series`.
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
}

/// A Hermes home configured for `server` with our plugin enabled.
fn hermes_with_plugin(server: &FakeOpenAi) -> HermesHome {
    let home = HermesHome::new(&server.base_url(), server.model());
    home.enable_plugin("hermes_collector");
    let list = home.plugins_list();
    assert!(
        list.contains("hermes_collector"),
        "plugin not listed:\n{list}"
    );
    home
}

/// Runs one turn and returns Hermes' output and its session id.
fn run_turn(home: &HermesHome, collector: &Collector) -> (Output, String) {
    basic_turn::run(home, &collector.endpoint)
}

fn wait_for_turn(store_wait: impl Fn(Duration) -> bool, collector: &Collector) {
    assert!(
        store_wait(WAIT),
        "no complete turn arrived; collector log:\n{}",
        collector.guard.stderr_text()
    );
}

/// Runs the basic turn through a collector started in `work` with `args`,
/// exporting to `receiver`; checks the tree that arrives there and returns
/// the collector.
fn basic_turn_through(receiver: &OtlpReceiver, work: &Path, args: &[&str]) -> Collector {
    let server = FakeOpenAi::start(basic_turn::script());
    let collector = Collector::start(work, args);
    let home = hermes_with_plugin(&server);
    let (_, session) = run_turn(&home, &collector);
    wait_for_turn(
        |t| {
            receiver.wait_for(
                |spans| spans.len() >= 4 && spans.iter().any(|(_, s)| s.is_root()),
                t,
            )
        },
        &collector,
    );
    basic_turn::assert_tree(&receiver.store().tree(), &session, server.model());
    collector
}

#[test]
fn turn_becomes_a_nested_trace_over_otlp_grpc() {
    let receiver = OtlpReceiver::start();
    let work = tempfile::tempdir().expect("tempdir");
    let collector = basic_turn_through(
        &receiver,
        work.path(),
        &["--otlp-endpoint", &receiver.endpoint()],
    );
    assert!(
        !work.path().join("hermes-spans.jsonl").exists(),
        "no embedded default when OTLP is configured"
    );

    // Self-telemetry agrees with what the backend got.
    let ready = collector.admin_get("/readyz");
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    let metrics = collector.admin_get("/metrics");
    let received = receiver.spans().len() as f64;
    assert_eq!(
        metric(
            &metrics,
            "hermes_collector_exporter_sent_spans_total{exporter=\"otlp_grpc\"}"
        ),
        received,
        "{metrics}"
    );
    assert_eq!(
        metric(
            &metrics,
            "hermes_collector_exporter_send_failed_spans_total{exporter=\"otlp_grpc\"}"
        ),
        0.0
    );
    assert_eq!(metric(&metrics, "hermes_collector_spans_total"), received);
    let events = metric(&metrics, "hermes_collector_receiver_accepted_events_total");
    assert!(
        events >= 10.0,
        "a turn with a tool is at least 10 hook calls: {events}"
    );
    assert_eq!(
        metric(&metrics, "hermes_collector_correlator_events_total"),
        events,
        "every accepted event was correlated"
    );
    assert_eq!(
        metric(&metrics, "hermes_collector_shim_dropped_events_total"),
        0.0
    );

    // Metrics derived from the spans: token usage and durations by semconv.
    let sample = |name: &str, part: &str, label: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(name) && l.contains(part) && l.contains(label))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name}{part}..{label} in:\n{metrics}"))
    };
    let prompt: i64 = basic_turn::USAGE.iter().map(|u| u.0).sum();
    assert_eq!(
        sample(
            "gen_ai_client_token_usage",
            "_sum{",
            "gen_ai_token_type=\"input\""
        ),
        prompt as f64
    );
    assert_eq!(
        sample(
            "gen_ai_client_token_usage",
            "_count{",
            "gen_ai_token_type=\"output\""
        ),
        2.0
    );
    assert_eq!(
        sample(
            "gen_ai_client_operation_duration",
            "_count{",
            "gen_ai_operation_name=\"chat\""
        ),
        2.0
    );
    assert_eq!(
        sample(
            "hermes_tool_duration",
            "_count{",
            "gen_ai_tool_name=\"terminal\""
        ),
        1.0
    );
    assert_eq!(
        sample("hermes_turn_duration", "_count{", "outcome=\"completed\""),
        1.0
    );
}

#[test]
fn turn_becomes_a_nested_trace_over_otlp_http() {
    let receiver = OtlpHttpReceiver::start();
    let work = tempfile::tempdir().expect("tempdir");
    basic_turn_through(
        &receiver,
        work.path(),
        &[
            "--otlp-endpoint",
            &receiver.endpoint(),
            "--otlp-protocol",
            "http/protobuf",
        ],
    );
    let exports = receiver.store().exports();
    assert!(
        exports.iter().all(|e| e
            .content_type
            .as_deref()
            .is_some_and(|c| c.contains("application/x-protobuf"))),
        "{exports:?}"
    );
}

#[test]
fn embedded_default_writes_the_span_file_and_prints_the_turn() {
    let server = FakeOpenAi::start(basic_turn::script());
    let work = tempfile::tempdir().expect("tempdir");
    let mut collector = Collector::start(work.path(), &[]);
    let home = hermes_with_plugin(&server);
    let (_, session) = run_turn(&home, &collector);
    let file = work.path().join("hermes-spans.jsonl");
    let complete = hermes_e2e::wait_until(WAIT, Duration::from_millis(100), || {
        read_span_file(&file).iter().any(|(_, s)| s.is_root())
    });
    assert!(
        complete,
        "span file incomplete; collector log:\n{}",
        collector.guard.stderr_text()
    );
    let tree = SpanTree::new(read_span_file(&file));
    basic_turn::assert_tree(&tree, &session, server.model());

    let printed = collector
        .guard
        .wait_for_stdout(WAIT, |o| o.contains("execute_tool terminal"));
    let stdout = collector.guard.stdout_text();
    assert!(printed, "console tree not printed:\n{stdout}");
    println!("collector console output:\n{stdout}");
    let root = tree.roots()[0];
    assert!(
        stdout.contains(&hex(&root.trace_id)),
        "tree header names the trace:\n{stdout}"
    );
    assert!(
        stdout.contains(&session),
        "tree header names the session:\n{stdout}"
    );
    let lines: Vec<&str> = stdout.lines().collect();
    let root_line = lines
        .iter()
        .position(|l| l.contains("invoke_agent hermes"))
        .expect("root line");
    let tool_line = lines
        .iter()
        .position(|l| l.contains("execute_tool terminal"))
        .expect("tool line");
    let chat_lines: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.contains("chat fake-model"))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(chat_lines.len(), 2, "{stdout}");
    assert!(
        root_line < chat_lines[0] && chat_lines[0] < tool_line && tool_line < chat_lines[1],
        "children in start order:\n{stdout}"
    );
    assert!(
        lines[tool_line].contains('├') || lines[tool_line].contains('└'),
        "indented as a child:\n{stdout}"
    );
    assert!(
        lines[chat_lines[0]].contains("in=1212") && lines[chat_lines[0]].contains("out=17"),
        "{stdout}"
    );
    assert!(
        lines[root_line].contains("ms") || lines[root_line].contains('s'),
        "durations shown:\n{stdout}"
    );
    collector.assert_clean_stop(WAIT);
}

/// Every span of an OTLP JSON-lines file with its resource.
fn read_span_file(path: &Path) -> Vec<(opentelemetry_proto::tonic::resource::v1::Resource, Span)> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let Ok(request) = serde_json::from_str::<
            opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest,
        >(line) else {
            // A line being written; read again later.
            return Vec::new();
        };
        for rs in request.resource_spans {
            let resource = rs.resource.unwrap_or_default();
            for ss in rs.scope_spans {
                out.extend(ss.spans.into_iter().map(|s| (resource.clone(), s)));
            }
        }
    }
    out
}

/// Content capture with the default redaction rules and the extra attribute
/// sets: a secret in a tool's arguments never reaches the backend nor the
/// collector's output, while the content and the Phoenix/Langfuse
/// attributes do.
#[test]
fn content_is_redacted_and_mapped_for_phoenix_and_langfuse() {
    const SECRET: &str = "sk-e2eSECRETabcdefghijklmnop";
    const BEARER: &str = "tok3n.e2e.SECRET";
    let server = FakeOpenAi::start(json!([
        {"tool_calls": [{"name": "terminal", "arguments": {"command": format!("echo key={SECRET} auth='Bearer {BEARER}'")}}],
         "usage": {"prompt_tokens": 1212, "completion_tokens": 17}},
        {"content": "The command printed hermes-e2e.", "usage": {"prompt_tokens": 1300, "completion_tokens": 21}}
    ]));
    let receiver = OtlpReceiver::start();
    let work = tempfile::tempdir().expect("tempdir");
    let config = work.path().join("collector.yaml");
    std::fs::write(
        &config,
        format!(
            "exporters:\n  otlp:\n    endpoint: {}\n  console:\n    enabled: true\nprocessing:\n  attribute_sets: [gen_ai, openinference, langfuse]\n",
            receiver.endpoint()
        ),
    )
    .expect("write config");
    let collector = Collector::start(
        work.path(),
        &["--config", config.to_str().expect("utf-8 path")],
    );
    let home = hermes_with_plugin(&server);
    let out = home.run_chat(
        "Please run the command",
        &[
            ("HERMES_COLLECTOR_ENDPOINT", &collector.endpoint),
            ("HERMES_COLLECTOR_CAPTURE", "content"),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for_turn(
        |t| receiver.wait_for(|spans| spans.iter().any(|(_, s)| s.is_root()), t),
        &collector,
    );
    let tree = receiver.store().tree();
    tree.assert_well_formed();
    let everything = format!("{:?}", receiver.spans());
    assert!(
        !everything.contains(SECRET) && !everything.contains(BEARER),
        "a secret reached the backend"
    );
    let tool = tree.expect_one("execute_tool terminal");
    let args = tool
        .str_attr("gen_ai.tool.call.arguments")
        .expect("arguments captured");
    assert!(args.contains("<redacted>"), "{args}");
    assert!(
        serde_json::from_str::<Value>(args).is_ok(),
        "still JSON: {args}"
    );
    assert_eq!(tool.str_attr("openinference.span.kind"), Some("TOOL"));
    assert_eq!(tool.str_attr("langfuse.observation.type"), Some("tool"));
    let chats = tree.find_all("chat fake-model");
    assert!(
        chats
            .iter()
            .all(|c| c.str_attr("openinference.span.kind") == Some("LLM"))
    );
    assert!(
        chats
            .iter()
            .all(|c| c.str_attr("langfuse.observation.type") == Some("generation"))
    );
    assert!(
        chats.iter().all(|c| c.has_attr("gen_ai.input.messages")),
        "{}",
        tree.render()
    );
    let root = tree.roots()[0];
    assert_eq!(
        root.str_attr("hermes.turn.user_message"),
        Some("Please run the command")
    );
    assert_eq!(root.str_attr("openinference.span.kind"), Some("AGENT"));
    let logs = format!(
        "{}{}",
        collector.guard.stdout_text(),
        collector.guard.stderr_text()
    );
    assert!(
        !logs.contains(SECRET) && !logs.contains(BEARER),
        "a secret reached the collector's output"
    );
}
