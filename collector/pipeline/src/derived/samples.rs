//! Test support: the spans the derived metrics are recorded from, and the
//! Prometheus text they render to; shared by the derived-metrics tests and
//! the driver's (which checks that processing changes no number).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use hermes_span::common::v1::any_value::Value;
use hermes_span::common::v1::{AnyValue, KeyValue};
use hermes_span::trace::v1::Span;
use prometheus_client::registry::Registry;

use super::DerivedMetrics;

pub(crate) fn kv(key: &str, value: Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
    }
}

/// The Prometheus text of `metrics` alone.
pub(crate) fn text(metrics: &DerivedMetrics) -> String {
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
    out
}

/// A 0.3 s chat of `model` with 1212/17 tokens, a 50 ms call of `tool`
/// (status `ok`), a 1 s completed turn.
pub(crate) fn sample_spans(tool: &str, model: &str) -> Vec<Span> {
    let s = |text: &str| Value::StringValue(text.into());
    vec![
        Span {
            start_time_unix_nano: 0,
            end_time_unix_nano: 300_000_000,
            attributes: vec![
                kv("gen_ai.operation.name", s("chat")),
                kv("gen_ai.request.model", s(model)),
                kv("gen_ai.provider.name", s("custom")),
                kv("gen_ai.usage.input_tokens", Value::IntValue(1212)),
                kv("gen_ai.usage.output_tokens", Value::IntValue(17)),
            ],
            ..Default::default()
        },
        Span {
            end_time_unix_nano: 50_000_000,
            attributes: vec![
                kv("gen_ai.operation.name", s("execute_tool")),
                kv("gen_ai.tool.name", s(tool)),
                kv("hermes.tool.status", s("ok")),
            ],
            ..Default::default()
        },
        Span {
            end_time_unix_nano: 1_000_000_000,
            attributes: vec![
                kv("gen_ai.operation.name", s("invoke_agent")),
                kv("hermes.turn.api_attempts", Value::IntValue(2)),
                kv("hermes.turn.completed", Value::BoolValue(true)),
            ],
            ..Default::default()
        },
    ]
}
