//! The collector's own metrics, as each stage describes them.
//!
//! A stage's stats (`ReceiverStats`, `ExporterStats`, the correlation
//! stage's and the persistent queue's) implement [`StageMetrics`]: they
//! name, explain and read their own counters and gauges at scrape time,
//! through a [`MetricEncoder`]. The admin server registers each one with
//! [`collector`] and only serves the result: it knows no stage's counters.
//!
//! Names are given without the `hermes_collector_` prefix (the registry the
//! admin server builds adds it) and without the `_total` suffix of counters
//! (the encoder adds it). Labels are bounded by the stage that emits them:
//! a configured name (exporter, queue), never a session, shim or trace.

#![forbid(unsafe_code)]

use std::fmt;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Prefix of every metric name of the collector's own.
pub const METRIC_PREFIX: &str = "hermes_collector";

/// A stage's stats that describe themselves for `/metrics`.
pub trait StageMetrics: fmt::Debug + Send + Sync + 'static {
    /// Writes every metric of the stage, read now.
    fn encode(&self, metrics: &mut MetricEncoder<'_>) -> fmt::Result;
}

/// The stage's metrics as a registry collector, read at each scrape.
pub fn collector<T: StageMetrics>(stats: Arc<T>) -> Box<dyn Collector> {
    Box::new(Scraped(stats))
}

#[derive(Debug)]
struct Scraped<T>(Arc<T>);

impl<T: StageMetrics> Collector for Scraped<T> {
    fn encode(&self, encoder: DescriptorEncoder) -> fmt::Result {
        self.0.encode(&mut MetricEncoder { encoder })
    }
}

/// Writes constant counters and gauges, one descriptor each.
pub struct MetricEncoder<'a> {
    encoder: DescriptorEncoder<'a>,
}

/// Whether a metric only grows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
}

impl MetricEncoder<'_> {
    /// A counter without labels.
    pub fn counter(&mut self, name: &str, help: &str, value: u64) -> fmt::Result {
        let metric = ConstCounter::new(value);
        let encoder = self
            .encoder
            .encode_descriptor(name, help, None, metric.metric_type())?;
        metric.encode(encoder)
    }

    /// A gauge without labels.
    pub fn gauge(&mut self, name: &str, help: &str, value: u64) -> fmt::Result {
        let metric = ConstGauge::new(saturating_i64(value));
        let encoder = self
            .encoder
            .encode_descriptor(name, help, None, metric.metric_type())?;
        metric.encode(encoder)
    }

    /// One series per item, labelled `label="<value>"`; nothing when there
    /// are no items.
    pub fn family<'v>(
        &mut self,
        kind: Kind,
        (name, help, label): (&str, &str, &str),
        samples: impl IntoIterator<Item = (&'v str, u64)>,
    ) -> fmt::Result {
        let mut samples = samples.into_iter().peekable();
        if samples.peek().is_none() {
            return Ok(());
        }
        let metric_type = match kind {
            Kind::Counter => ConstCounter::new(0u64).metric_type(),
            Kind::Gauge => ConstGauge::new(0i64).metric_type(),
        };
        let mut family = self
            .encoder
            .encode_descriptor(name, help, None, metric_type)?;
        for (value_label, value) in samples {
            let labels = [(label, value_label)];
            let labelled = family.encode_family(&labels)?;
            match kind {
                Kind::Counter => ConstCounter::new(value).encode(labelled)?,
                Kind::Gauge => ConstGauge::new(saturating_i64(value)).encode(labelled)?,
            }
        }
        Ok(())
    }
}

fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use prometheus_client::registry::Registry;

    #[derive(Debug)]
    struct Stage;

    impl StageMetrics for Stage {
        fn encode(&self, m: &mut MetricEncoder<'_>) -> fmt::Result {
            m.counter("things", "Things done.", 3)?;
            m.gauge("open", "Open now.", u64::MAX)?;
            m.family(
                Kind::Counter,
                ("sent", "Sent, per sink.", "exporter"),
                [("file", 2), ("otlp", 5)],
            )?;
            m.family(Kind::Gauge, ("none", "Never shown.", "queue"), [])
        }
    }

    #[test]
    fn a_stage_encodes_its_own_metrics_under_the_prefix() {
        let mut root = Registry::default();
        root.sub_registry_with_prefix(METRIC_PREFIX)
            .register_collector(collector(Arc::new(Stage)));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &root).unwrap();
        for line in [
            "# TYPE hermes_collector_things counter",
            "hermes_collector_things_total 3",
            "hermes_collector_open 9223372036854775807",
            "hermes_collector_sent_total{exporter=\"file\"} 2",
            "hermes_collector_sent_total{exporter=\"otlp\"} 5",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
        assert!(!text.contains("none"), "{text}");
    }
}
