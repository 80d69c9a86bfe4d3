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
//! Export ([`OtlpMetricsExport`]): the SDK's periodic reader collects every
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

/// The OTLP export of the derived metrics: the SDK's meter provider with a
/// periodic reader and the OTLP exporter. Stop it with
/// [`shutdown`](Self::shutdown) for the last export.
#[derive(Debug)]
pub struct OtlpMetricsExport {
    provider: SdkMeterProvider,
}

impl OtlpMetricsExport {
    /// Builds the exporter and starts the periodic reader (a thread of the
    /// SDK). Call it inside the collector's runtime: the exports run on it.
    /// Returns the meter to record with ([`DerivedMetrics::with_meter`]).
    /// `max_series` is the series bound ([`Bounds::max_series`]), which
    /// becomes the SDK's cardinality limit.
    pub fn start(
        config: &OtlpMetricsConfig,
        tls: Option<hermes_exporter::TlsSettings>,
        max_series: usize,
    ) -> anyhow::Result<(Self, Meter)> {
        let runtime = tokio::runtime::Handle::current();
        let timeout = Duration::from_millis(config.timeout_ms);
        let temporality = match config.temporality {
            MetricsTemporality::Cumulative => Temporality::Cumulative,
            MetricsTemporality::Delta => Temporality::Delta,
        };
        let compression = match config.compression {
            CompressionConfig::None => None,
            CompressionConfig::Gzip => Some(opentelemetry_otlp::Compression::Gzip),
        };
        let builder = opentelemetry_otlp::MetricExporter::builder().with_temporality(temporality);
        let exporter = match config.protocol {
            OtlpProtocol::Grpc => {
                let mut headers = http::HeaderMap::new();
                for (name, value) in &config.headers {
                    // Checked by the configuration's validation.
                    if let (Ok(name), Ok(value)) = (
                        http::HeaderName::from_bytes(name.as_bytes()),
                        http::HeaderValue::from_str(value),
                    ) {
                        headers.append(name, value);
                    }
                }
                let mut builder = builder
                    .with_tonic()
                    .with_endpoint(config.endpoint.clone())
                    .with_timeout(timeout)
                    .with_metadata(tonic::metadata::MetadataMap::from_headers(headers));
                if let Some(tls) = &tls {
                    builder = builder
                        .with_tls_config(tls.tonic_config(&endpoint_host(&config.endpoint)?)?);
                }
                if let Some(compression) = compression {
                    builder = builder.with_compression(compression);
                }
                builder.build()?
            }
            OtlpProtocol::HttpProtobuf => {
                let url = metrics_url(&config.endpoint);
                // The exporter's own client (rustls with the configured roots
                // and identity for https://), as the span exporter uses.
                let connector = hermes_exporter::https_connector(&url.parse()?, tls, timeout)?;
                let mut builder = builder
                    .with_http()
                    .with_http_client(opentelemetry_http::hyper::HyperClient::new(
                        connector, timeout, None,
                    ))
                    .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                    .with_endpoint(url)
                    .with_timeout(timeout)
                    .with_headers(config.headers.clone().into_iter().collect());
                if let Some(compression) = compression {
                    builder = builder.with_compression(compression);
                }
                builder.build()?
            }
        };
        let reader = PeriodicReader::builder(OnRuntime {
            inner: exporter,
            runtime,
        })
        .with_interval(Duration::from_millis(config.interval_ms))
        .build();
        let resource = opentelemetry_sdk::Resource::builder_empty()
            .with_service_name("hermes-collector")
            .with_attributes([
                KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
                KeyValue::new("service.instance.id", instance_id()),
            ])
            .build();
        let provider = SdkMeterProvider::builder()
            .with_resource(resource)
            .with_reader(reader)
            .with_view(cardinality_view(max_series))
            .build();
        let meter = opentelemetry::metrics::MeterProvider::meter_with_scope(
            &provider,
            opentelemetry::InstrumentationScope::builder("hermes-collector")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
        );
        Ok((Self { provider }, meter))
    }

    /// Exports the last values and stops, waiting at most until `deadline`.
    /// The SDK's shutdown blocks until the export is done, so it runs on a
    /// thread of its own, never on a runtime worker (the export needs them);
    /// past the deadline the process goes on without it.
    pub async fn shutdown(self, deadline: tokio::time::Instant) {
        let (done, finished) = tokio::sync::oneshot::channel();
        let provider = self.provider;
        let spawned = std::thread::Builder::new()
            .name("hermes-metrics-flush".to_owned())
            .spawn(move || {
                let _ = done.send(provider.shutdown());
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot export the last metrics");
            return;
        }
        match tokio::time::timeout_at(deadline, finished).await {
            Ok(Ok(Ok(()))) => tracing::debug!("last metrics exported"),
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "the last metrics export failed"),
            Ok(Err(_)) => tracing::warn!("the last metrics export stopped"),
            Err(_) => {
                tracing::warn!("the last metrics export did not finish within the grace period")
            }
        }
    }
}

/// The SDK view giving every instrument the cardinality limit the series
/// bounds let through (`max_series` label sets and the overflow series), so
/// the SDK's own overflow (to `otel.metric.overflow=true` as well) never
/// comes before ours; its default, 2 000, would cut a larger `max_series`.
fn cardinality_view(
    max_series: usize,
) -> impl Fn(&opentelemetry_sdk::metrics::Instrument) -> Option<Stream> + Send + Sync + 'static {
    move |_| {
        Stream::builder()
            .with_cardinality_limit(max_series.saturating_add(1))
            .build()
            .ok()
    }
}

/// The host of `endpoint` (validated as a URL with a host before).
fn endpoint_host(endpoint: &str) -> anyhow::Result<String> {
    let uri: http::Uri = endpoint.parse()?;
    uri.host()
        .map(str::to_owned)
        .ok_or_else(|| anyhow::anyhow!("`{endpoint}` has no host"))
}

/// `{endpoint}/v1/metrics`, or `endpoint` itself when it already ends so
/// (as the traces exporter does with `/v1/traces`).
fn metrics_url(endpoint: &str) -> String {
    const PATH: &str = "/v1/metrics";
    let trimmed = endpoint.trim_end_matches('/');
    if trimmed.ends_with(PATH) {
        trimmed.to_owned()
    } else {
        format!("{trimmed}{PATH}")
    }
}

/// A random id for `service.instance.id` (std's per-process random hash
/// keys, the process id and the time; no extra dependency).
fn instance_id() -> String {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut parts = [0u64; 2];
    for (i, part) in parts.iter_mut().enumerate() {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_usize(i);
        hasher.write_u32(std::process::id());
        hasher.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        *part = hasher.finish();
    }
    format!("{:016x}{:016x}", parts[0], parts[1])
}

/// An exporter whose work runs inside the collector's tokio runtime. The
/// SDK's periodic reader drives exports from its own thread with a plain
/// executor, but tonic's channel and hyper's client need a runtime's reactor
/// and timers: each poll of the export enters the runtime. Failures are
/// logged (the SDK's own logs are off).
#[derive(Debug)]
struct OnRuntime<E> {
    inner: E,
    runtime: tokio::runtime::Handle,
}

impl<E: PushMetricExporter> PushMetricExporter for OnRuntime<E> {
    fn export(&self, metrics: &ResourceMetrics) -> impl Future<Output = OTelSdkResult> + Send {
        let future = {
            let _entered = self.runtime.enter();
            Box::pin(self.inner.export(metrics))
        };
        InRuntime {
            runtime: self.runtime.clone(),
            future,
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        let _entered = self.runtime.enter();
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        let _entered = self.runtime.enter();
        self.inner.shutdown_with_timeout(timeout)
    }

    fn temporality(&self) -> Temporality {
        self.inner.temporality()
    }
}

/// A future polled inside a runtime's context; logs a failed export.
struct InRuntime<F> {
    runtime: tokio::runtime::Handle,
    future: Pin<Box<F>>,
}

impl<F: Future<Output = OTelSdkResult>> Future for InRuntime<F> {
    type Output = OTelSdkResult;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<OTelSdkResult> {
        let this = self.get_mut();
        let _entered = this.runtime.enter();
        let poll = this.future.as_mut().poll(cx);
        if let Poll::Ready(Err(e)) = &poll {
            tracing::warn!(error = %e, "metrics export failed");
        }
        poll
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
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use hermes_span::common::v1::{AnyValue, KeyValue};
    use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
    use std::sync::{Arc, Mutex};

    fn kv(key: &str, value: Value) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(AnyValue { value: Some(value) }),
        }
    }

    fn text(metrics: &DerivedMetrics) -> String {
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
    }

    /// A 0.3 s chat with 1212/17 tokens, a 50 ms tool call, a 1 s turn.
    fn sample_spans() -> Vec<Span> {
        let s = |name: &str| Value::StringValue(name.into());
        vec![
            Span {
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
            },
            Span {
                end_time_unix_nano: 50_000_000,
                attributes: vec![
                    kv("gen_ai.operation.name", s("execute_tool")),
                    kv("gen_ai.tool.name", s("terminal")),
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
}
