//! Operating the collector binary: the derived metrics exported over OTLP
//! (gRPC, HTTP, TLS) and matching the spans, and bad metrics export
//! settings refused naming the key. Its probes, schema and process
//! settings are in `ops_process.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use hermes_e2e::collector::{Collector, write_config};
use hermes_e2e::ingest::{FIXTURES, fixture};
use hermes_e2e::{
    AttrsExt, MetricsReceiver, OtlpReceiver, ReceivedHistogram, cargo_bin, run_with_timeout,
    wait_until, write_file,
};
use opentelemetry_proto::tonic::trace::v1::Span;

/// `gen_ai.client.token.usage` bucket boundaries of the semantic conventions.
const SEMCONV_TOKEN_BUCKETS: [f64; 14] = [
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];
/// `gen_ai.client.operation.duration` bucket boundaries of the semantic
/// conventions, seconds.
const SEMCONV_DURATION_BUCKETS: [f64; 14] = [
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];

const WAIT: Duration = Duration::from_secs(60);

/// What the recorded hook calls of some fixtures add up to, read from the
/// fixture files themselves (independent of the collector).
#[derive(Debug, Default)]
struct FixtureTotals {
    /// `pre_llm_call`: one turn each.
    turns: u64,
    /// `pre_api_request`: one chat span per attempt.
    attempts: u64,
    /// `api_request_error`: failed attempts.
    failed_attempts: u64,
    /// `post_api_request` usage: billable input (`prompt_tokens`) and output.
    input_tokens: u64,
    output_tokens: u64,
    /// Attempts with usage.
    usages: u64,
    /// `post_tool_call` by (tool, status).
    tools: BTreeMap<(String, String), u64>,
}

fn fixture_totals(names: &[&str]) -> FixtureTotals {
    let mut totals = FixtureTotals::default();
    for name in names {
        let text = std::fs::read_to_string(fixture(name)).unwrap();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let record: serde_json::Value = serde_json::from_str(line).unwrap();
            let kwargs = &record["kwargs"];
            match record["hook"].as_str().unwrap() {
                "pre_llm_call" => totals.turns += 1,
                "pre_api_request" => totals.attempts += 1,
                "api_request_error" => totals.failed_attempts += 1,
                "post_api_request" => {
                    let usage = &kwargs["usage"];
                    totals.input_tokens += usage["prompt_tokens"].as_u64().unwrap();
                    totals.output_tokens += usage["output_tokens"].as_u64().unwrap();
                    totals.usages += 1;
                }
                "post_tool_call" => {
                    let key = (
                        kwargs["tool_name"].as_str().unwrap().to_owned(),
                        kwargs["status"].as_str().unwrap().to_owned(),
                    );
                    *totals.tools.entry(key).or_default() += 1;
                }
                _ => {}
            }
        }
    }
    totals
}

/// Runs the load generator against `endpoint`: each of `instances` agents
/// replays every fixture once. Returns its summary.
fn loadgen(endpoint: &str, fixtures: &[&str], instances: usize) -> serde_json::Value {
    let mut cmd = Command::new(cargo_bin("hermes-loadgen", "hermes-loadgen"));
    cmd.args(["--endpoint", endpoint])
        .arg("--fixture")
        .args(fixtures.iter().map(|f| fixture(f)))
        .args(["--instances", &instances.to_string()])
        .args(["--turns", &fixtures.len().to_string()])
        .args(["--timeout-secs", "60"]);
    let out = run_with_timeout(&mut cmd, Duration::from_secs(90));
    assert!(out.success(), "loadgen failed:\n{}", out.describe());
    let summary = hermes_e2e::fault::loadgen_summary(&out);
    assert_eq!(summary["events_sent"], summary["events_acked"], "{summary}");
    summary
}

fn seconds(span: &Span) -> f64 {
    span.end_time_unix_nano
        .saturating_sub(span.start_time_unix_nano) as f64
        / 1e9
}

/// Bucket counts of `values` for explicit `bounds` (upper bounds inclusive,
/// one more bucket for the values above the last bound).
fn bucket_counts(values: &[f64], bounds: &[f64]) -> Vec<u64> {
    let mut counts = vec![0; bounds.len() + 1];
    for v in values {
        counts[bounds.iter().position(|b| v <= b).unwrap_or(bounds.len())] += 1;
    }
    counts
}

/// The points' bucket counts added up (they share the boundaries).
fn merged_buckets(histogram: &ReceivedHistogram) -> Vec<u64> {
    let mut merged = Vec::new();
    for point in &histogram.points {
        merged.resize(point.bucket_counts.len().max(merged.len()), 0);
        for (m, c) in merged.iter_mut().zip(&point.bucket_counts) {
            *m += c;
        }
    }
    merged
}

fn assert_close(actual: f64, expected: f64, what: &str) {
    assert!(
        (actual - expected).abs() <= 1e-6 * expected.abs().max(1.0),
        "{what}: {actual} != {expected}"
    );
}

/// The sum of the samples of `name` (any labels) in a Prometheus text
/// exposition, filtered by a label text such as `exporter="otlp_grpc"`.
fn prometheus_sum(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(&format!("{name} ")) || l.starts_with(&format!("{name}{{")))
        .filter(|l| l.contains(label))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

/// The turn outcome the collector derives from a turn span.
fn outcome(span: &Span) -> &'static str {
    if span.bool_attr("hermes.incomplete") == Some(true) {
        "incomplete"
    } else if span.bool_attr("hermes.turn.interrupted") == Some(true) {
        "interrupted"
    } else if span.bool_attr("hermes.turn.completed") == Some(false) {
        "failed"
    } else {
        "completed"
    }
}

#[test]
fn derived_metrics_reach_an_otlp_grpc_receiver_and_match_the_spans() {
    const INSTANCES: usize = 2;
    let traces = OtlpReceiver::start();
    let metrics = MetricsReceiver::start_grpc();
    let work = tempfile::tempdir().unwrap();
    let config = write_config(
        work.path(),
        &format!(
            "exporters:\n  otlp:\n    endpoint: {}\n  otlp_metrics:\n    endpoint: {}\n    protocol: grpc\n    interval_ms: 300\n",
            traces.endpoint(),
            metrics.endpoint()
        ),
    );
    let collector = Collector::start(work.path(), &["--config", &config]);
    let summary = loadgen(&collector.endpoint, &FIXTURES, INSTANCES);

    let totals = fixture_totals(&FIXTURES);
    let n = INSTANCES as u64;
    let chat = |s: &Span| s.str_attr("gen_ai.operation.name") == Some("chat");
    let tool = |s: &Span| s.str_attr("gen_ai.operation.name") == Some("execute_tool");
    let turn = |s: &Span| s.has_attr("hermes.turn.api_attempts");
    let tool_calls: u64 = totals.tools.values().sum::<u64>() * n;
    assert!(
        traces.wait_for(
            |spans| {
                let count = |f: &dyn Fn(&Span) -> bool| spans.iter().filter(|(_, s)| f(s)).count();
                count(&chat) as u64 == totals.attempts * n
                    && count(&tool) as u64 == tool_calls
                    && count(&turn) as u64 == totals.turns * n
            },
            WAIT
        ),
        "not every span arrived: {} spans\n{}",
        traces.store().span_count(),
        collector.guard.stderr_text()
    );
    let spans: Vec<Span> = traces.spans().into_iter().map(|(_, s)| s).collect();
    let chats: Vec<&Span> = spans.iter().filter(|s| chat(s)).collect();
    let tools: Vec<&Span> = spans.iter().filter(|s| tool(s)).collect();
    let turns: Vec<&Span> = spans.iter().filter(|s| turn(s)).collect();

    // Cumulative temporality: the latest export carries the totals.
    let store = metrics.store();
    let complete = store.wait_for(
        |s| {
            let count = |name| s.histogram(name).map_or(0, |h| h.count());
            count("gen_ai.client.operation.duration") == totals.attempts * n
                && count("gen_ai.client.token.usage") == totals.usages * n * 2
                && count("hermes.tool.duration") == tool_calls
                && count("hermes.turn.duration") == totals.turns * n
        },
        WAIT,
    );
    assert!(
        complete,
        "the exported metrics never added up: {:?}\n{}",
        store.metric_names(),
        collector.guard.stderr_text()
    );
    assert!(store.exports().iter().all(|e| e.transport == "grpc"));

    // gen_ai.client.token.usage: semconv buckets, sums of the fixtures' usage.
    let tokens = store.histogram("gen_ai.client.token.usage").unwrap();
    assert_eq!(tokens.unit, "{token}");
    assert_eq!(tokens.temporality, 2, "cumulative");
    let service = tokens
        .resource
        .attributes
        .iter()
        .find(|kv| kv.key == "service.name")
        .and_then(|kv| kv.value.as_ref()?.value.clone());
    assert_eq!(
        service,
        Some(
            opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(
                "hermes-collector".into()
            )
        )
    );
    for point in &tokens.points {
        assert_eq!(point.explicit_bounds, SEMCONV_TOKEN_BUCKETS);
        let keys: Vec<&str> = point.attributes.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "gen_ai.operation.name",
                "gen_ai.provider.name",
                "gen_ai.request.model",
                "gen_ai.token.type"
            ],
            "{point:?}"
        );
        assert_eq!(point.attributes["gen_ai.operation.name"], "chat");
    }
    for (kind, key, total) in [
        ("input", "gen_ai.usage.input_tokens", totals.input_tokens),
        ("output", "gen_ai.usage.output_tokens", totals.output_tokens),
    ] {
        let points = tokens.with("gen_ai.token.type", kind);
        let count: u64 = points.iter().map(|p| p.count).sum();
        let sum: f64 = points.iter().map(|p| p.sum).sum();
        assert_eq!(count, totals.usages * n, "{kind} count");
        assert_close(sum, (total * n) as f64, &format!("{kind} tokens"));
        let values: Vec<f64> = chats
            .iter()
            .filter_map(|s| s.int_attr(key))
            .map(|v| v as f64)
            .collect();
        let mut buckets = vec![0; SEMCONV_TOKEN_BUCKETS.len() + 1];
        for p in &points {
            for (b, c) in buckets.iter_mut().zip(&p.bucket_counts) {
                *b += c;
            }
        }
        assert_eq!(
            buckets,
            bucket_counts(&values, &SEMCONV_TOKEN_BUCKETS),
            "{kind} buckets"
        );
    }

    // gen_ai.client.operation.duration: one per attempt, failed ones with
    // error.type; durations are the chat spans'.
    let durations = store.histogram("gen_ai.client.operation.duration").unwrap();
    assert_eq!(durations.unit, "s");
    for point in &durations.points {
        assert_eq!(point.explicit_bounds, SEMCONV_DURATION_BUCKETS);
    }
    let values: Vec<f64> = chats.iter().map(|s| seconds(s)).collect();
    assert_eq!(durations.count(), chats.len() as u64);
    assert_close(
        durations.sum(),
        values.iter().sum(),
        "operation duration sum",
    );
    assert_eq!(
        merged_buckets(&durations),
        bucket_counts(&values, &SEMCONV_DURATION_BUCKETS)
    );
    let failed: u64 = durations
        .points
        .iter()
        .filter(|p| p.attributes.contains_key("error.type"))
        .map(|p| p.count)
        .sum();
    assert_eq!(
        failed,
        totals.failed_attempts * n,
        "attempts with error.type"
    );
    assert!(totals.failed_attempts > 0, "the retry fixture has failures");

    // hermes.tool.duration: count and duration by tool and status.
    let tool_hist = store.histogram("hermes.tool.duration").unwrap();
    assert_eq!(tool_hist.unit, "s");
    for ((name, status), calls) in &totals.tools {
        let points: Vec<_> = tool_hist
            .with("gen_ai.tool.name", name)
            .into_iter()
            .filter(|p| p.attributes.get("hermes.tool.status") == Some(status))
            .collect();
        assert_eq!(points.len(), 1, "{name}/{status}: {:?}", tool_hist.points);
        assert_eq!(points[0].count, calls * n, "{name}/{status}");
        assert_eq!(points[0].explicit_bounds, SEMCONV_DURATION_BUCKETS);
        let expected: f64 = tools
            .iter()
            .filter(|s| s.str_attr("gen_ai.tool.name") == Some(name))
            .filter(|s| s.str_attr("hermes.tool.status") == Some(status))
            .map(|s| seconds(s))
            .sum();
        assert_close(points[0].sum, expected, &format!("{name}/{status} seconds"));
    }

    // hermes.turn.duration: by outcome.
    let turn_hist = store.histogram("hermes.turn.duration").unwrap();
    let mut outcomes: BTreeMap<&str, (u64, f64)> = BTreeMap::new();
    for span in &turns {
        let entry = outcomes.entry(outcome(span)).or_default();
        entry.0 += 1;
        entry.1 += seconds(span);
    }
    assert_eq!(
        turn_hist.points.len(),
        outcomes.len(),
        "{:?}",
        turn_hist.points
    );
    for (outcome, (count, sum)) in outcomes {
        let points = turn_hist.with("hermes.turn.outcome", outcome);
        assert_eq!(points.len(), 1, "{outcome}");
        assert_eq!(points[0].count, count, "{outcome}");
        assert_close(points[0].sum, sum, outcome);
    }

    // /metrics: the events accepted are the ones the load generator got
    // acknowledged, the spans sent are the ones the trace receiver holds,
    // and the Prometheus histograms count what OTLP carried.
    let received = traces.store().span_count() as f64;
    let mut text = String::new();
    let agreed = wait_until(WAIT, Duration::from_millis(100), || {
        text = collector.admin_get("/metrics");
        prometheus_sum(
            &text,
            "hermes_collector_exporter_sent_spans_total",
            "exporter=\"otlp_grpc\"",
        ) == received
    });
    assert!(agreed, "sent spans != {received} received:\n{text}");
    assert_eq!(
        prometheus_sum(&text, "hermes_collector_receiver_accepted_events_total", ""),
        summary["events_acked"].as_f64().unwrap(),
        "{text}"
    );
    // What /metrics counts agrees with what reached the backends.
    for (series, backend) in [
        ("hermes_collector_spans_total", received),
        (
            "gen_ai_client_operation_duration_seconds_count",
            durations.count() as f64,
        ),
        (
            "gen_ai_client_token_usage_token_count",
            tokens.count() as f64,
        ),
        (
            "hermes_tool_duration_seconds_count",
            tool_hist.count() as f64,
        ),
        (
            "hermes_turn_duration_seconds_count",
            turn_hist.count() as f64,
        ),
    ] {
        assert_eq!(
            prometheus_sum(&text, series, ""),
            backend,
            "{series}\n{text}"
        );
    }
}

#[test]
fn derived_metrics_over_otlp_http_with_delta_temporality() {
    let metrics = MetricsReceiver::start_http();
    let work = tempfile::tempdir().unwrap();
    let config = write_config(
        work.path(),
        &format!(
            "exporters:\n  file:\n    path: {}\n  otlp_metrics:\n    endpoint: {}\n    protocol: http/protobuf\n    compression: gzip\n    temporality: delta\n    interval_ms: 200\n",
            work.path().join("spans.jsonl").display(),
            metrics.endpoint()
        ),
    );
    let mut collector = Collector::start(work.path(), &["--config", &config]);
    loadgen(&collector.endpoint, &["basic"], 1);
    let totals = fixture_totals(&["basic"]);

    // Delta temporality: each export carries what is new; together, the totals.
    let store = metrics.store();
    let total = |name: &str| -> (u64, f64) {
        let all = store.histograms(name);
        (
            all.iter().map(ReceivedHistogram::count).sum(),
            all.iter().map(ReceivedHistogram::sum).sum(),
        )
    };
    assert!(
        store.wait_for(
            |_| total("hermes.turn.duration").0 == totals.turns
                && total("gen_ai.client.token.usage").0 == totals.usages * 2,
            WAIT
        ),
        "{:?}\n{}",
        store.metric_names(),
        collector.guard.stderr_text()
    );
    let (count, sum) = total("gen_ai.client.token.usage");
    assert_eq!(count, totals.usages * 2);
    assert_close(
        sum,
        (totals.input_tokens + totals.output_tokens) as f64,
        "tokens",
    );
    assert_eq!(total("gen_ai.client.operation.duration").0, totals.attempts);
    let exports = store.exports();
    assert!(
        exports
            .iter()
            .all(|e| e.transport == "http" && e.encoding.as_deref() == Some("gzip")),
        "every request is gzip-compressed protobuf over HTTP"
    );
    for histogram in store.histograms("gen_ai.client.token.usage") {
        assert_eq!(histogram.temporality, 1, "delta");
        for point in histogram.points {
            assert_eq!(point.explicit_bounds, SEMCONV_TOKEN_BUCKETS);
        }
    }

    // A clean stop still exports; nothing new, so the totals stay.
    let status = collector.guard.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", collector.guard.stderr_text());
    assert_eq!(total("gen_ai.client.token.usage").0, totals.usages * 2);
}

#[test]
fn derived_metrics_over_tls_with_a_custom_ca_and_a_client_certificate() {
    use hermes_e2e::otlp_metrics_receiver::ServerTls;
    use hermes_e2e::pki::Ca;
    let ca = Ca::new("metrics test CA");
    let server = ca.server(&["localhost", "127.0.0.1"]);
    let client = ca.client("hermes-collector");
    let tls = |client_ca: Option<String>| ServerTls {
        cert_pem: server.cert_pem.clone(),
        key_pem: server.key_pem.clone(),
        client_ca_pem: client_ca,
    };
    // gRPC requires a client certificate (mutual TLS); HTTP only checks ours.
    let receivers = [
        (
            MetricsReceiver::start_grpc_tls(&tls(Some(ca.pem.clone()))),
            "grpc",
            true,
        ),
        (
            MetricsReceiver::start_http_tls(&tls(None)),
            "http/protobuf",
            false,
        ),
    ];
    let totals = fixture_totals(&["basic"]);
    for (receiver, protocol, mutual) in &receivers {
        assert!(receiver.endpoint().starts_with("https://"));
        let work = tempfile::tempdir().unwrap();
        let write =
            |name: &str, text: &str| write_file(work.path(), name, text).display().to_string();
        let mut tls_yaml = format!("    tls:\n      ca_file: {}\n", write("ca.crt", &ca.pem));
        if *mutual {
            tls_yaml += &format!(
                "      cert_file: {}\n      key_file: {}\n",
                write("client.crt", &client.cert_pem),
                write("client.key", &client.key_pem)
            );
        }
        let config = write_config(
            work.path(),
            &format!(
                "exporters:\n  file:\n    path: {}\n  otlp_metrics:\n    endpoint: {}\n    protocol: {protocol}\n    interval_ms: 200\n{tls_yaml}",
                work.path().join("spans.jsonl").display(),
                receiver.endpoint()
            ),
        );
        let collector = Collector::start(work.path(), &["--config", &config]);
        loadgen(&collector.endpoint, &["basic"], 1);
        let store = receiver.store();
        assert!(
            store.wait_for(
                |s| s
                    .histogram("hermes.turn.duration")
                    .is_some_and(|h| h.count() == totals.turns),
                WAIT
            ),
            "{protocol}: {:?}\n{}",
            store.metric_names(),
            collector.guard.stderr_text()
        );
    }
}

#[test]
fn bad_metrics_export_config_exits_64_naming_the_key() {
    let work = tempfile::tempdir().unwrap();
    for (yaml, key) in [
        (
            "exporters:\n  otlp_metrics:\n    endpoint: ftp://x\n",
            "exporters.otlp_metrics.endpoint",
        ),
        (
            "exporters:\n  otlp_metrics:\n    endpoint: http://x:4317\n    interval_ms: 0\n",
            "exporters.otlp_metrics.interval_ms",
        ),
        (
            "exporters:\n  otlp_metrics:\n    endpoint: http://x:4317\n    temporality: sometimes\n",
            "exporters.otlp_metrics.temporality",
        ),
        (
            "exporters:\n  otlp_metrics:\n    endpoint: http://x:4317\n    tls:\n      ca_file: /nonexistent/ca.crt\n",
            "exporters.otlp_metrics.tls",
        ),
        (
            "exporters:\n  otlp_metrics:\n    endpoint: https://x:4317\n    tls:\n      ca_file: /nonexistent/ca.crt\n",
            "exporters.otlp_metrics.tls.ca_file",
        ),
    ] {
        let config = write_config(work.path(), yaml);
        let out = run_with_timeout(
            Command::new(cargo_bin("hermes-collector", "hermes-collector"))
                .args(["validate", "--config", &config]),
            Duration::from_secs(30),
        );
        out.assert_refused_naming(yaml, key);
    }
}
