//! The bounds of the derived metrics' labels.

use serde::Deserialize;

use crate::ConfigError;

/// Bounds of the derived metrics' labels. Their values come from the agents
/// (tool names, models, providers, error types, tool statuses); these keep
/// `/metrics`, the OTLP metrics and the collector's memory bounded whatever
/// the agents send. Values past a bound are recorded as `other` and counted
/// (`hermes_collector_metrics_label_overflows_total`).
#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Longest label value, bytes; longer ones are cut (on a UTF-8
    /// character boundary).
    #[schemars(range(min = 1, max = MAX_LABEL_VALUE_BYTES))]
    pub max_label_value_bytes: usize,
    /// Most distinct values of one label of one metric; further values are
    /// recorded as `other`.
    #[schemars(range(min = 1, max = MAX_LABEL_VALUES))]
    pub max_label_values: usize,
    /// Most label sets (series) of one metric; further ones are recorded in
    /// one series whose labels are all `other` (over OTLP: the attribute
    /// `otel.metric.overflow=true`, the SDK's cardinality limit).
    #[schemars(range(min = 1, max = MAX_SERIES))]
    pub max_series: usize,
}

/// Upper bounds of [`MetricsConfig`]: beyond them `/metrics` could reach
/// hundreds of megabytes.
const MAX_LABEL_VALUE_BYTES: usize = 1024;
const MAX_LABEL_VALUES: usize = 10_000;
const MAX_SERIES: usize = 10_000;

impl Default for MetricsConfig {
    fn default() -> Self {
        let bounds = Bounds::default();
        Self {
            max_label_value_bytes: bounds.max_value_bytes,
            max_label_values: bounds.max_values,
            max_series: bounds.max_series,
        }
    }
}

impl MetricsConfig {
    /// The bounds the derived metrics apply.
    pub fn bounds(&self) -> Bounds {
        Bounds {
            max_value_bytes: self.max_label_value_bytes,
            max_values: self.max_label_values,
            max_series: self.max_series,
        }
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        for (key, value, max) in [
            (
                "metrics.max_label_value_bytes",
                self.max_label_value_bytes,
                MAX_LABEL_VALUE_BYTES,
            ),
            (
                "metrics.max_label_values",
                self.max_label_values,
                MAX_LABEL_VALUES,
            ),
            ("metrics.max_series", self.max_series, MAX_SERIES),
        ] {
            if !(1..=max).contains(&value) {
                return Err(ConfigError::new(
                    key,
                    format!("must be between 1 and {max}"),
                ));
            }
        }
        Ok(())
    }
}

/// The bounds of the derived metrics' labels, as the collector's `series`
/// module applies them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Longest label value, in bytes.
    pub max_value_bytes: usize,
    /// Most distinct values per label and instrument.
    pub max_values: usize,
    /// Most label sets per instrument, the overflow series aside.
    pub max_series: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            max_value_bytes: 128,
            max_values: 100,
            max_series: 1000,
        }
    }
}
