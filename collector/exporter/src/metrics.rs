//! The exporter stage's metrics on `/metrics`, one series per sink (the
//! sink names are fixed by the configuration), read from [`ExporterStats`]
//! at scrape time.

use std::fmt;

use hermes_metrics::{Kind, MetricEncoder, StageMetrics};

use crate::stage::{ExporterStats, SinkStats};

impl StageMetrics for ExporterStats {
    fn encode(&self, m: &mut MetricEncoder<'_>) -> fmt::Result {
        type Read = fn(&SinkStats) -> u64;
        let per_sink: [(&str, &str, Read); 3] = [
            (
                "exporter_sent_spans",
                "Spans accepted by the exporter.",
                SinkStats::spans_sent,
            ),
            (
                "exporter_send_failed_spans",
                "Spans the exporter failed to send (dropped).",
                SinkStats::spans_failed,
            ),
            (
                "exporter_retries",
                "Export retry attempts (first attempts not counted).",
                SinkStats::retries,
            ),
        ];
        for (name, help, read) in per_sink {
            m.family(
                Kind::Counter,
                (name, help, "exporter"),
                self.sinks().iter().map(|s| (s.name(), read(s))),
            )?;
        }
        Ok(())
    }
}
