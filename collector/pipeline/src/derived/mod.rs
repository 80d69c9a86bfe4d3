//! Metrics derived from the finished spans: served on `/metrics`
//! (Prometheus) and, with `exporters.otlp_metrics`, pushed over OTLP.
//!
//! | OTLP instrument | Prometheus histogram | unit, buckets | OTLP attributes (Prometheus labels) |
//! |---|---|---|---|
//! | `gen_ai.client.token.usage` | `gen_ai_client_token_usage_token` | `{token}`; semconv buckets 1, 4, 16, … 67108864 | `gen_ai.operation.name`, `gen_ai.provider.name`, `gen_ai.request.model`, `gen_ai.token.type` (`input`/`output`) (dots become `_`) |
//! | `gen_ai.client.operation.duration` | `gen_ai_client_operation_duration_seconds` | `s`; semconv buckets 0.01 … 81.92 | `gen_ai.operation.name`, `gen_ai.provider.name`, `gen_ai.request.model`, `error.type` (dots become `_`) |
//! | `hermes.tool.duration` | `hermes_tool_duration_seconds` | `s`; the same buckets; its count is the tool call count | `gen_ai.tool.name` (`gen_ai_tool_name`), `hermes.tool.status` (`status`) |
//! | `hermes.turn.duration` | `hermes_turn_duration_seconds` | `s`; the same buckets | `hermes.turn.outcome` (`outcome`: `completed`, `interrupted`, `failed`, `incomplete`) |
//!
//! One source of truth: each instrument is defined once ([`INSTRUMENTS`]:
//! names, unit, bucket table, attributes), and each finished span is read
//! once into observations that feed the Prometheus histogram and, when
//! export is on, the OpenTelemetry SDK histogram of the same instrument.
//! Both aggregate the same values with the same boundaries, so an OTLP
//! export with cumulative temporality carries the counts, sums and bucket
//! counts of `/metrics`. Empty values (no error, an unknown model) are left
//! out of the OTLP attributes, as the semantic conventions want for
//! conditional attributes; Prometheus keeps the label, empty.
//!
//! One observation per span, recorded after processing: the labels are
//! the exported values, redacted and cut as the spans are, so no secret the
//! processor removes from a span reaches `/metrics` or the OTLP metrics.
//! Processing leaves the numbers alone: the durations come from the span's
//! times and the token counts from `gen_ai.usage.*_tokens`, which no default
//! redaction rule matches (a key rule of the operator's that matches one
//! removes that count from the metrics as from the span). Labels are never
//! ids, and are bounded whatever the agents send (`series.rs`: values cut
//! to `metrics.max_label_value_bytes`, at most `metrics.max_label_values`
//! per label and `metrics.max_series` per instrument, the rest recorded as
//! `other` and counted).
//!
//! Export ([`OtlpMetricsExport`], `otlp.rs`): the SDK's periodic reader collects every
//! `interval_ms` on a thread of its own and hands the batch to the OTLP
//! exporter (gRPC through tonic, HTTP/protobuf through hyper); a wrapper runs
//! the export inside the collector's tokio runtime, which both transports
//! need, and logs failures. A failed export is not retried: with cumulative
//! temporality the next one carries the totals. At shutdown the last values
//! are exported once more, bounded by the drain's deadline. The resource is
//! the collector (`service.name=hermes-collector`, its version and a random
//! `service.instance.id`, so replicas' cumulative series never mix). The
//! SDK also reads the standard `OTEL_EXPORTER_OTLP_METRICS_*` /
//! `OTEL_EXPORTER_OTLP_*` header variables; the configuration wins for
//! everything else.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hermes_span::common::v1::any_value::Value;
use hermes_span::trace::v1::Span;
use opentelemetry::KeyValue;
use opentelemetry::metrics::Meter;
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _, WithTonicConfig as _};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider, Stream, Temporality};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

mod otlp;

pub use otlp::OtlpMetricsExport;

use crate::series::{BoundCounters, Bounds, Series};
use hermes_config::{CompressionConfig, MetricsTemporality, OtlpMetricsConfig, OtlpProtocol};

/// The OTLP attribute of an instrument's overflow series (the SDK's, for
/// its cardinality limit).
const OVERFLOW_ATTRIBUTE: &str = "otel.metric.overflow";

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

/// A bucket table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buckets {
    /// [`TOKEN_BUCKETS`].
    Tokens,
    /// [`DURATION_BUCKETS`].
    Seconds,
}

impl Buckets {
    /// The boundaries.
    pub fn bounds(self) -> &'static [f64] {
        match self {
            Buckets::Tokens => &TOKEN_BUCKETS,
            Buckets::Seconds => &DURATION_BUCKETS,
        }
    }

    /// A Prometheus histogram with these boundaries.
    fn histogram(self) -> fn() -> Histogram {
        match self {
            Buckets::Tokens => || Histogram::new(TOKEN_BUCKETS),
            Buckets::Seconds => || Histogram::new(DURATION_BUCKETS),
        }
    }
}

/// One derived instrument, defined once for both outputs.
#[derive(Debug)]
pub struct Instrument {
    /// OpenTelemetry name (OTLP export).
    pub otel_name: &'static str,
    /// Prometheus name; the registry appends the unit (`_seconds`, `_token`).
    pub prometheus_name: &'static str,
    /// Description (OTLP) and help (Prometheus).
    pub help: &'static str,
    /// UCUM unit as OpenTelemetry writes it: `s` or `{token}`.
    pub unit: &'static str,
    /// Bucket boundaries.
    pub buckets: Buckets,
    /// The attributes, in order: (OpenTelemetry key, Prometheus label).
    pub labels: &'static [(&'static str, &'static str)],
}

/// Which instrument: an index into [`INSTRUMENTS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    TokenUsage = 0,
    OperationDuration = 1,
    ToolDuration = 2,
    TurnDuration = 3,
}

impl Kind {
    pub(crate) const ALL: [Kind; 4] = [
        Kind::TokenUsage,
        Kind::OperationDuration,
        Kind::ToolDuration,
        Kind::TurnDuration,
    ];

    pub(crate) fn def(self) -> &'static Instrument {
        &INSTRUMENTS[self as usize]
    }

    /// The Prometheus label set of `values`, in the instrument's order.
    pub(crate) fn labels(self, values: impl IntoIterator<Item = String>) -> Labels {
        self.def()
            .labels
            .iter()
            .map(|(_, label)| *label)
            .zip(values)
            .collect()
    }
}

const GEN_AI_LABELS: [(&str, &str); 3] = [
    ("gen_ai.operation.name", "gen_ai_operation_name"),
    ("gen_ai.provider.name", "gen_ai_provider_name"),
    ("gen_ai.request.model", "gen_ai_request_model"),
];

/// Every derived instrument, in [`Kind`] order.
pub const INSTRUMENTS: [Instrument; 4] = [
    Instrument {
        otel_name: "gen_ai.client.token.usage",
        prometheus_name: "gen_ai_client_token_usage",
        help: "Tokens used per GenAI operation (OpenTelemetry semconv gen_ai.client.token.usage)",
        unit: "{token}",
        buckets: Buckets::Tokens,
        labels: &[
            GEN_AI_LABELS[0],
            GEN_AI_LABELS[1],
            GEN_AI_LABELS[2],
            ("gen_ai.token.type", "gen_ai_token_type"),
        ],
    },
    Instrument {
        otel_name: "gen_ai.client.operation.duration",
        prometheus_name: "gen_ai_client_operation_duration",
        help: "Duration of GenAI operations (OpenTelemetry semconv gen_ai.client.operation.duration)",
        unit: "s",
        buckets: Buckets::Seconds,
        labels: &[
            GEN_AI_LABELS[0],
            GEN_AI_LABELS[1],
            GEN_AI_LABELS[2],
            ("error.type", "error_type"),
        ],
    },
    Instrument {
        otel_name: "hermes.tool.duration",
        prometheus_name: "hermes_tool_duration",
        help: "Duration of Hermes tool calls by tool and status; _count is the number of calls",
        unit: "s",
        buckets: Buckets::Seconds,
        labels: &[
            ("gen_ai.tool.name", "gen_ai_tool_name"),
            ("hermes.tool.status", "status"),
        ],
    },
    Instrument {
        otel_name: "hermes.turn.duration",
        prometheus_name: "hermes_turn_duration",
        help: "Duration of Hermes agent turns by outcome",
        unit: "s",
        buckets: Buckets::Seconds,
        labels: &[("hermes.turn.outcome", "outcome")],
    },
];

/// Prometheus labels: (label, value) in the instrument's order.
pub(crate) type Labels = Vec<(&'static str, String)>;

/// One Prometheus histogram per label set.
pub(crate) type PrometheusHistograms = Family<Labels, Histogram, fn() -> Histogram>;

/// The derived metrics. Cheap to clone (the histograms and counters share
/// their state).
#[derive(Clone, Debug)]
pub struct DerivedMetrics {
    prometheus: [PrometheusHistograms; 4],
    otlp: Option<[opentelemetry::metrics::Histogram<f64>; 4]>,
    series: Series,
    counters: BoundCounters,
}

impl Default for DerivedMetrics {
    fn default() -> Self {
        Self::new(Bounds::default())
    }
}

impl DerivedMetrics {
    /// The metrics with their labels held within `bounds`.
    pub fn new(bounds: Bounds) -> Self {
        let counters = BoundCounters::default();
        Self {
            prometheus: Kind::ALL
                .map(|kind| Family::new_with_constructor(kind.def().buckets.histogram())),
            otlp: None,
            series: Series::new(bounds, counters.clone()),
            counters,
        }
    }

    /// How many series there are.
    #[cfg(test)]
    pub(crate) fn series_len(&self) -> usize {
        self.series.len()
    }

    /// The Prometheus families, shared with `self`.
    #[cfg(test)]
    pub(crate) fn prometheus_families(&self) -> [PrometheusHistograms; 4] {
        self.prometheus.clone()
    }

    /// Also records into histograms of `meter` (OTLP export), from now on.
    /// Call before cloning.
    pub fn with_meter(mut self, meter: &Meter) -> Self {
        self.otlp = Some(Kind::ALL.map(|kind| {
            let def = kind.def();
            meter
                .f64_histogram(def.otel_name)
                .with_description(def.help)
                .with_unit(def.unit)
                .with_boundaries(def.buckets.bounds().to_vec())
                .build()
        }));
        self
    }

    /// Adds the metrics to `registry` (at its root: the semconv names carry
    /// no collector prefix).
    pub fn register(&self, registry: &mut Registry) {
        for kind in Kind::ALL {
            let def = kind.def();
            let unit = match def.unit {
                "s" => Unit::Seconds,
                other => Unit::Other(other.trim_matches(['{', '}']).to_owned()),
            };
            registry.register_with_unit(
                def.prometheus_name,
                def.help,
                unit,
                self.prometheus[kind as usize].clone(),
            );
        }
        self.counters.register(registry);
    }

    /// Feeds one value of `kind`, with its label values in the instrument's
    /// order, to every output, in the series the bounds choose.
    fn observe<const N: usize>(&mut self, kind: Kind, values: [&str; N], value: f64) {
        let def = kind.def();
        debug_assert_eq!(def.labels.len(), N, "{}", def.otel_name);
        let entry = self
            .series
            .get(kind, values, &self.prometheus[kind as usize]);
        entry.histogram().observe(value);
        if let Some(otlp) = &self.otlp {
            let attributes: Vec<KeyValue> = if entry.is_overflow() {
                vec![KeyValue::new(OVERFLOW_ATTRIBUTE, true)]
            } else {
                def.labels
                    .iter()
                    .zip(entry.values())
                    .filter(|(_, v)| !v.is_empty())
                    .map(|((key, _), v)| KeyValue::new(*key, v.clone()))
                    .collect()
            };
            otlp[kind as usize].record(value, &attributes);
        }
    }

    /// Records what `span` contributes.
    pub fn record(&mut self, span: &Span) {
        let seconds = span
            .end_time_unix_nano
            .saturating_sub(span.start_time_unix_nano) as f64
            / 1e9;
        match string(span, "gen_ai.operation.name") {
            Some("chat") => {
                let model = string(span, "gen_ai.request.model").unwrap_or_default();
                let provider = string(span, "gen_ai.provider.name").unwrap_or_default();
                for (key, kind) in [
                    ("gen_ai.usage.input_tokens", "input"),
                    ("gen_ai.usage.output_tokens", "output"),
                ] {
                    if let Some(n) = int(span, key).filter(|n| *n >= 0) {
                        self.observe(Kind::TokenUsage, ["chat", provider, model, kind], n as f64);
                    }
                }
                let error = string(span, "error.type").unwrap_or_default();
                self.observe(
                    Kind::OperationDuration,
                    ["chat", provider, model, error],
                    seconds,
                );
            }
            Some("execute_tool") => {
                let tool = string(span, "gen_ai.tool.name").unwrap_or_default();
                let status = string(span, "hermes.tool.status").unwrap_or("unknown");
                self.observe(Kind::ToolDuration, [tool, status], seconds);
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
                self.observe(Kind::TurnDuration, [outcome], seconds);
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

fn string<'a>(span: &'a Span, key: &str) -> Option<&'a str> {
    match value(span, key)? {
        Value::StringValue(s) => Some(s),
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
pub(crate) mod samples;
#[cfg(test)]
mod tests;
