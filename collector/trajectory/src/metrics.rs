//! The trajectory sink's metrics on `/metrics`, read from
//! [`TrajectoryStats`] at scrape time.

use std::fmt;
use std::sync::atomic::Ordering;

use hermes_metrics::{MetricEncoder, StageMetrics};

use crate::sessions::TrajectoryStats;

impl StageMetrics for TrajectoryStats {
    fn encode(&self, m: &mut MetricEncoder<'_>) -> fmt::Result {
        let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        m.counter(
            "trajectories_written",
            "Trajectory files written (every segment of a resumed session counts).",
            load(&self.written),
        )?;
        m.counter(
            "trajectories_incomplete",
            "Of the trajectories written, those written after the idle time (marked incomplete).",
            load(&self.incomplete),
        )?;
        m.counter(
            "trajectory_spans_without_messages",
            "Spans of agents whose capture level carries no messages: no trajectory was built from them.",
            load(&self.spans_without_messages),
        )?;
        m.counter(
            "trajectory_unreadable_partials",
            "Files of sessions in progress found at start that could not be read (left in place).",
            load(&self.unreadable_partials),
        )?;
        m.gauge(
            "trajectory_sessions_in_progress",
            "Sessions the trajectory sink holds until they end or go idle.",
            load(&self.in_progress),
        )
    }
}
