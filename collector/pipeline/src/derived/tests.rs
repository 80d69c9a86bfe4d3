#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::otlp::{OnRuntime, cardinality_view, instance_id, metrics_url};
use super::samples::{kv, text};
use super::*;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
use std::sync::{Arc, Mutex};

fn sample_spans() -> Vec<Span> {
    super::samples::sample_spans("terminal", "m")
}

#[test]
fn chat_tool_and_turn_spans_feed_their_histograms() {
    let mut m = DerivedMetrics::default();
    for span in sample_spans() {
        m.record(&span);
    }
    let out = text(&m);
    let input = "gen_ai_client_token_usage_token_bucket{le=\"4096.0\",gen_ai_operation_name=\"chat\",gen_ai_provider_name=\"custom\",gen_ai_request_model=\"m\",gen_ai_token_type=\"input\"} 1";
    let below = "gen_ai_client_token_usage_token_bucket{le=\"1024.0\",gen_ai_operation_name=\"chat\",gen_ai_provider_name=\"custom\",gen_ai_request_model=\"m\",gen_ai_token_type=\"input\"} 0";
    assert!(out.contains(input), "{out}");
    assert!(out.contains(below), "{out}");
    assert!(out.contains("gen_ai_client_operation_duration_seconds_bucket{le=\"0.32\",gen_ai_operation_name=\"chat\",gen_ai_provider_name=\"custom\",gen_ai_request_model=\"m\",error_type=\"\"} 1"), "{out}");
    assert!(out.contains("gen_ai_client_operation_duration_seconds_bucket{le=\"0.16\",gen_ai_operation_name=\"chat\",gen_ai_provider_name=\"custom\",gen_ai_request_model=\"m\",error_type=\"\"} 0"), "{out}");
    assert!(
        out.contains(
            "hermes_tool_duration_seconds_count{gen_ai_tool_name=\"terminal\",status=\"ok\"} 1"
        ),
        "{out}"
    );
    assert!(
        out.contains("hermes_turn_duration_seconds_count{outcome=\"completed\"} 1"),
        "{out}"
    );
}

#[test]
fn a_label_set_seen_before_feeds_the_series_a_clone_registered() {
    // The admin server registers a clone made before any span.
    let mut m = DerivedMetrics::default();
    let registered = m.clone();
    for _ in 0..3 {
        for span in sample_spans() {
            m.record(&span);
        }
    }
    let mut other_tool = sample_spans().swap_remove(1);
    other_tool.attributes[1] = kv("gen_ai.tool.name", Value::StringValue("read".into()));
    m.record(&other_tool);
    let out = text(&registered);
    for series in [
        "hermes_tool_duration_seconds_count{gen_ai_tool_name=\"terminal\",status=\"ok\"} 3",
        "hermes_tool_duration_seconds_count{gen_ai_tool_name=\"read\",status=\"ok\"} 1",
        "hermes_turn_duration_seconds_count{outcome=\"completed\"} 3",
        "gen_ai_client_operation_duration_seconds_count{gen_ai_operation_name=\"chat\",gen_ai_provider_name=\"custom\",gen_ai_request_model=\"m\",error_type=\"\"} 3",
    ] {
        assert!(out.contains(series), "{series}\n{out}");
    }
    // One cached histogram per label set: 2 token types, 1 chat
    // duration, 2 tools, 1 turn outcome.
    assert_eq!(m.series.len(), 6);
}

/// One exported histogram point, flattened.
#[derive(Debug, Clone, PartialEq)]
struct Point {
    name: String,
    unit: String,
    bounds: Vec<f64>,
    buckets: Vec<u64>,
    count: u64,
    sum: f64,
    attributes: Vec<(String, String)>,
}

/// Keeps the points of the latest export.
#[derive(Debug, Default, Clone)]
struct Capture(Arc<Mutex<Vec<Point>>>);

impl PushMetricExporter for Capture {
    fn export(&self, metrics: &ResourceMetrics) -> impl Future<Output = OTelSdkResult> + Send {
        let mut points = self.0.lock().unwrap();
        points.clear();
        for metric in metrics.scope_metrics().flat_map(|s| s.metrics()) {
            if let AggregatedMetrics::F64(MetricData::Histogram(h)) = metric.data() {
                for p in h.data_points() {
                    let mut attributes: Vec<(String, String)> = p
                        .attributes()
                        .map(|kv| (kv.key.to_string(), kv.value.to_string()))
                        .collect();
                    attributes.sort();
                    points.push(Point {
                        name: metric.name().to_owned(),
                        unit: metric.unit().to_owned(),
                        bounds: p.bounds().collect(),
                        buckets: p.bucket_counts().collect(),
                        count: p.count(),
                        sum: p.sum(),
                        attributes,
                    });
                }
            }
        }
        // Polled inside the runtime: the wrapper's job.
        async {
            if tokio::runtime::Handle::try_current().is_ok() {
                Ok(())
            } else {
                Err(opentelemetry_sdk::error::OTelSdkError::InternalFailure(
                    "exported outside the runtime".into(),
                ))
            }
        }
    }
    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }
    fn shutdown_with_timeout(&self, _: Duration) -> OTelSdkResult {
        Ok(())
    }
    fn temporality(&self) -> Temporality {
        Temporality::Cumulative
    }
}

/// Records `spans` under `bounds` into both outputs, the SDK's provider
/// built with the collector's cardinality view; the exported points.
async fn exported(bounds: Bounds, spans: Vec<Span>) -> (DerivedMetrics, Vec<Point>) {
    let capture = Capture::default();
    let reader = PeriodicReader::builder(OnRuntime {
        inner: capture.clone(),
        runtime: tokio::runtime::Handle::current(),
    })
    .with_interval(Duration::from_secs(3600))
    .build();
    let provider = SdkMeterProvider::builder()
        .with_reader(reader)
        .with_view(cardinality_view(bounds.max_series))
        .build();
    let meter = opentelemetry::metrics::MeterProvider::meter(&provider, "test");
    let mut m = DerivedMetrics::new(bounds).with_meter(&meter);
    for span in spans {
        m.record(&span);
    }
    // The SDK's flush blocks: never on a runtime worker.
    let flushed = tokio::task::spawn_blocking(move || {
        let flushed = provider.force_flush();
        let _ = provider.shutdown();
        flushed
    })
    .await
    .unwrap();
    flushed.unwrap();
    let points = capture.0.lock().unwrap().clone();
    (m, points)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_past_the_bounds_reach_the_otel_meter_as_other_and_overflow() {
    let tool = |name: &str, status: &str| {
        let mut span = sample_spans().swap_remove(1);
        span.attributes[1] = kv("gen_ai.tool.name", Value::StringValue(name.into()));
        span.attributes[2] = kv("hermes.tool.status", Value::StringValue(status.into()));
        span
    };
    let bounds = Bounds {
        max_value_bytes: 4,
        max_values: 2,
        max_series: 3,
    };
    // `terminal` is cut, `grep` is a third tool name, and (`read`,
    // `error`) a fourth label set.
    let spans = vec![
        tool("read", "ok"),
        tool("terminal", "ok"),
        tool("grep", "ok"),
        tool("read", "error"),
    ];
    let (_, points) = exported(bounds, spans).await;
    let mut tools: Vec<(Vec<(String, String)>, u64)> = points
        .into_iter()
        .filter(|p| p.name == "hermes.tool.duration")
        .map(|p| (p.attributes, p.count))
        .collect();
    tools.sort();
    let attrs = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    assert_eq!(
        tools,
        [
            (
                attrs(&[("gen_ai.tool.name", "other"), ("hermes.tool.status", "ok")]),
                1
            ),
            (
                attrs(&[("gen_ai.tool.name", "read"), ("hermes.tool.status", "ok")]),
                1
            ),
            (
                attrs(&[("gen_ai.tool.name", "term"), ("hermes.tool.status", "ok")]),
                1
            ),
            (attrs(&[("otel.metric.overflow", "true")]), 1),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_observations_reach_the_otel_meter() {
    let (m, points) = exported(Bounds::default(), sample_spans()).await;
    let find = |name: &str, attr: (&str, &str)| -> Point {
        points
            .iter()
            .find(|p| {
                p.name == name && p.attributes.iter().any(|(k, v)| k == attr.0 && v == attr.1)
            })
            .unwrap_or_else(|| panic!("no {name} {attr:?} in {points:?}"))
            .clone()
    };
    let attrs = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        v.sort();
        v
    };

    let input = find("gen_ai.client.token.usage", ("gen_ai.token.type", "input"));
    assert_eq!(input.unit, "{token}");
    assert_eq!(input.bounds, TOKEN_BUCKETS);
    assert_eq!((input.count, input.sum), (1, 1212.0));
    assert_eq!(input.buckets[6], 1, "1212 is in (1024, 4096]");
    assert_eq!(
        input.attributes,
        attrs(&[
            ("gen_ai.operation.name", "chat"),
            ("gen_ai.provider.name", "custom"),
            ("gen_ai.request.model", "m"),
            ("gen_ai.token.type", "input"),
        ])
    );
    let output = find("gen_ai.client.token.usage", ("gen_ai.token.type", "output"));
    assert_eq!((output.count, output.sum), (1, 17.0));

    let chat = find(
        "gen_ai.client.operation.duration",
        ("gen_ai.operation.name", "chat"),
    );
    assert_eq!(chat.unit, "s");
    assert_eq!(chat.bounds, DURATION_BUCKETS);
    assert_eq!((chat.count, chat.sum), (1, 0.3));
    assert_eq!(chat.buckets[5], 1, "0.3 s is in (0.16, 0.32]");
    assert!(
        !chat.attributes.iter().any(|(k, _)| k == "error.type"),
        "no error, no error.type: {chat:?}"
    );

    let tool = find("hermes.tool.duration", ("gen_ai.tool.name", "terminal"));
    assert_eq!(
        tool.attributes,
        attrs(&[
            ("gen_ai.tool.name", "terminal"),
            ("hermes.tool.status", "ok")
        ])
    );
    assert_eq!((tool.count, tool.sum), (1, 0.05));

    let turn = find("hermes.turn.duration", ("hermes.turn.outcome", "completed"));
    assert_eq!((turn.count, turn.sum), (1, 1.0));

    // The same values on /metrics.
    let out = text(&m);
    assert!(
        out.contains("gen_ai_client_token_usage_token_sum{gen_ai_operation_name=\"chat\",gen_ai_provider_name=\"custom\",gen_ai_request_model=\"m\",gen_ai_token_type=\"input\"} 1212.0"),
        "{out}"
    );
}

#[test]
fn instruments_are_defined_once_in_kind_order() {
    for kind in Kind::ALL {
        let def = kind.def();
        assert_eq!(
            def.prometheus_name,
            def.otel_name.replace('.', "_"),
            "the Prometheus name is the OpenTelemetry one"
        );
    }
    assert_eq!(Kind::TokenUsage.def().buckets, Buckets::Tokens);
    assert_eq!(Kind::TurnDuration.def().otel_name, "hermes.turn.duration");
}

#[test]
fn metrics_url_appends_the_signal_path_once() {
    assert_eq!(metrics_url("http://h:4318"), "http://h:4318/v1/metrics");
    assert_eq!(metrics_url("http://h:4318/"), "http://h:4318/v1/metrics");
    assert_eq!(
        metrics_url("http://h/otlp/v1/metrics"),
        "http://h/otlp/v1/metrics"
    );
    assert_ne!(instance_id(), instance_id());
    assert_eq!(instance_id().len(), 32);
}
