//! The trajectory sink's metrics on `/metrics`, read from
//! [`TrajectoryStats`] at scrape time.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use hermes_metrics::{MetricEncoder, StageMetrics};

use crate::sessions::TrajectoryStats;

impl StageMetrics for TrajectoryStats {
    fn encode(&self, m: &mut MetricEncoder<'_>) -> fmt::Result {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        for (name, help, value) in [
            (
                "trajectories_written",
                "Trajectory files written (every segment of a resumed session counts).",
                &self.written,
            ),
            (
                "trajectories_incomplete",
                "Of the trajectories written, those written after the idle time (marked incomplete).",
                &self.incomplete,
            ),
            (
                "trajectory_spans_without_messages",
                "Spans of agents whose capture level carries no messages: no trajectory was built from them.",
                &self.spans_without_messages,
            ),
            (
                "trajectory_log_records_sent",
                "Trajectories sent as OTLP log records (exporters.atif.otlp_logs).",
                &self.log_records_sent,
            ),
            (
                "trajectory_log_records_failed",
                "Trajectories not sent as OTLP log records (queue full, retries given up, refused, or queued at shutdown); their files are written.",
                &self.log_records_failed,
            ),
            (
                "trajectory_session_ends_lost",
                "Session ends that did not fit the trajectory sink's queue: those sessions are written at their idle time, marked incomplete.",
                &self.session_ends_lost,
            ),
            (
                "trajectory_partial_lines_skipped",
                "Lines of the record logs of sessions in progress found at start that did not parse (torn by a crash mid-write), skipped.",
                &self.partial_lines_skipped,
            ),
            (
                "trajectory_unreadable_partials",
                "Files of sessions in progress found at start that could not be read (left in place).",
                &self.unreadable_partials,
            ),
        ] {
            m.counter(name, help, load(value))?;
        }
        m.gauge(
            "trajectory_sessions_in_progress",
            "Sessions the trajectory sink holds until they end or go idle.",
            load(&self.in_progress),
        )
    }
}
