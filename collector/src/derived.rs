//! Metrics derived from the finished spans, served on `/metrics`:
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `gen_ai_client_token_usage` | histogram (tokens; semconv buckets 1, 4, 16, … 67108864) | `gen_ai_operation_name`, `gen_ai_provider_name`, `gen_ai_request_model`, `gen_ai_token_type` (`input`/`output`) |
//! | `gen_ai_client_operation_duration_seconds` | histogram (semconv buckets 0.01 … 81.92 s) | `gen_ai_operation_name`, `gen_ai_provider_name`, `gen_ai_request_model`, `error_type` |
//! | `hermes_tool_duration_seconds` | histogram (same buckets; its `_count` is the tool call count) | `gen_ai_tool_name`, `status` |
//! | `hermes_turn_duration_seconds` | histogram (same buckets) | `outcome` (`completed`, `interrupted`, `failed`, `incomplete`) |
//!
//! One observation per span, recorded before processing (so redaction and
//! truncation never change them). Labels are bounded by the agents'
//! configuration (models, providers, tool names), never ids.

use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

/// `gen_ai.client.token.usage` bucket boundaries (semconv).
pub const TOKEN_BUCKETS: [f64; 14] = [
    1.0,
    4.0,
    16.0,
    64.0,
    256.0,
    1024.0,
    4096.0,
    16384.0,
    65536.0,
    262_144.0,
    1_048_576.0,
    4_194_304.0,
    16_777_216.0,
    67_108_864.0,
];
/// `gen_ai.client.operation.duration` bucket boundaries in seconds (semconv).
pub const DURATION_BUCKETS: [f64; 14] = [
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabels {
    gen_ai_operation_name: String,
    gen_ai_provider_name: String,
    gen_ai_request_model: String,
    gen_ai_token_type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    gen_ai_operation_name: String,
    gen_ai_provider_name: String,
    gen_ai_request_model: String,
    error_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabels {
    gen_ai_tool_name: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TurnLabels {
    outcome: &'static str,
}

type Hist<L> = Family<L, Histogram, fn() -> Histogram>;

fn tokens() -> Histogram {
    Histogram::new(TOKEN_BUCKETS)
}

fn seconds() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

/// The derived metrics. Cheap to clone (the families share their state).
#[derive(Clone, Debug)]
pub struct DerivedMetrics {
    token_usage: Hist<TokenLabels>,
    operation_duration: Hist<OperationLabels>,
    tool_duration: Hist<ToolLabels>,
    turn_duration: Hist<TurnLabels>,
}

impl Default for DerivedMetrics {
    fn default() -> Self {
        Self {
            token_usage: Family::new_with_constructor(tokens),
            operation_duration: Family::new_with_constructor(seconds),
            tool_duration: Family::new_with_constructor(seconds),
            turn_duration: Family::new_with_constructor(seconds),
        }
    }
}

impl DerivedMetrics {
    /// Adds the metrics to `registry` (at its root: the semconv names carry
    /// no collector prefix).
    pub fn register(&self, registry: &mut Registry) {
        registry.register_with_unit(
            "gen_ai_client_token_usage",
            "Tokens used per GenAI operation (OpenTelemetry semconv gen_ai.client.token.usage)",
            Unit::Other("token".into()),
            self.token_usage.clone(),
        );
        registry.register_with_unit(
            "gen_ai_client_operation_duration",
            "Duration of GenAI operations (OpenTelemetry semconv gen_ai.client.operation.duration)",
            Unit::Seconds,
            self.operation_duration.clone(),
        );
        registry.register_with_unit(
            "hermes_tool_duration",
            "Duration of Hermes tool calls by tool and status; _count is the number of calls",
            Unit::Seconds,
            self.tool_duration.clone(),
        );
        registry.register_with_unit(
            "hermes_turn_duration",
            "Duration of Hermes agent turns by outcome",
            Unit::Seconds,
            self.turn_duration.clone(),
        );
    }

    /// Records what `span` contributes.
    pub fn record(&self, span: &Span) {
        let seconds = span
            .end_time_unix_nano
            .saturating_sub(span.start_time_unix_nano) as f64
            / 1e9;
        match string(span, "gen_ai.operation.name").as_deref() {
            Some("chat") => {
                let model = string(span, "gen_ai.request.model").unwrap_or_default();
                let provider = string(span, "gen_ai.provider.name").unwrap_or_default();
                for (key, kind) in [
                    ("gen_ai.usage.input_tokens", "input"),
                    ("gen_ai.usage.output_tokens", "output"),
                ] {
                    if let Some(n) = int(span, key) {
                        let labels = TokenLabels {
                            gen_ai_operation_name: "chat".into(),
                            gen_ai_provider_name: provider.clone(),
                            gen_ai_request_model: model.clone(),
                            gen_ai_token_type: kind,
                        };
                        self.token_usage.get_or_create(&labels).observe(n as f64);
                    }
                }
                let labels = OperationLabels {
                    gen_ai_operation_name: "chat".into(),
                    gen_ai_provider_name: provider,
                    gen_ai_request_model: model,
                    error_type: string(span, "error.type").unwrap_or_default(),
                };
                self.operation_duration
                    .get_or_create(&labels)
                    .observe(seconds);
            }
            Some("execute_tool") => {
                let labels = ToolLabels {
                    gen_ai_tool_name: string(span, "gen_ai.tool.name").unwrap_or_default(),
                    status: string(span, "hermes.tool.status").unwrap_or_else(|| "unknown".into()),
                };
                self.tool_duration.get_or_create(&labels).observe(seconds);
            }
            Some("invoke_agent")
                if span
                    .attributes
                    .iter()
                    .any(|kv| kv.key == "hermes.turn.api_attempts") =>
            {
                let outcome = if boolean(span, "hermes.incomplete") == Some(true) {
                    "incomplete"
                } else if boolean(span, "hermes.turn.interrupted") == Some(true) {
                    "interrupted"
                } else if boolean(span, "hermes.turn.completed") == Some(false) {
                    "failed"
                } else {
                    "completed"
                };
                self.turn_duration
                    .get_or_create(&TurnLabels { outcome })
                    .observe(seconds);
            }
            _ => {}
        }
    }
}

fn value<'a>(span: &'a Span, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

fn string(span: &Span, key: &str) -> Option<String> {
    match value(span, key)? {
        Value::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

fn int(span: &Span, key: &str) -> Option<i64> {
    match value(span, key)? {
        Value::IntValue(i) => Some(*i),
        _ => None,
    }
}

fn boolean(span: &Span, key: &str) -> Option<bool> {
    match value(span, key)? {
        Value::BoolValue(b) => Some(*b),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};

    fn kv(key: &str, value: Value) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(AnyValue { value: Some(value) }),
            ..Default::default()
        }
    }

    fn text(metrics: &DerivedMetrics) -> String {
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
    }

    #[test]
    fn chat_tool_and_turn_spans_feed_their_histograms() {
        let m = DerivedMetrics::default();
        let s = |name: &str| Value::StringValue(name.into());
        m.record(&Span {
            start_time_unix_nano: 0,
            end_time_unix_nano: 300_000_000,
            attributes: vec![
                kv("gen_ai.operation.name", s("chat")),
                kv("gen_ai.request.model", s("m")),
                kv("gen_ai.provider.name", s("custom")),
                kv("gen_ai.usage.input_tokens", Value::IntValue(1212)),
                kv("gen_ai.usage.output_tokens", Value::IntValue(17)),
            ],
            ..Default::default()
        });
        m.record(&Span {
            end_time_unix_nano: 50_000_000,
            attributes: vec![
                kv("gen_ai.operation.name", s("execute_tool")),
                kv("gen_ai.tool.name", s("terminal")),
                kv("hermes.tool.status", s("ok")),
            ],
            ..Default::default()
        });
        m.record(&Span {
            end_time_unix_nano: 1_000_000_000,
            attributes: vec![
                kv("gen_ai.operation.name", s("invoke_agent")),
                kv("hermes.turn.api_attempts", Value::IntValue(2)),
                kv("hermes.turn.completed", Value::BoolValue(true)),
            ],
            ..Default::default()
        });
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
}
