//! The OTLP export of the derived metrics ([`OtlpMetricsExport`]).

use super::*;

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
pub(super) fn cardinality_view(
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
pub(super) fn metrics_url(endpoint: &str) -> String {
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
pub(super) fn instance_id() -> String {
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
pub(super) struct OnRuntime<E> {
    pub(super) inner: E,
    pub(super) runtime: tokio::runtime::Handle,
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
