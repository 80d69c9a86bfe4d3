//! The correlation stage's counters and gauges: published from the
//! sequencer's and the correlator's own numbers after each step, read by
//! `/metrics` at scrape time.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use hermes_correlator::Correlation;
use hermes_metrics::{MetricEncoder, StageMetrics};
use hermes_proto::view::WireEvent;

/// Counters of the correlation stage; all monotonic except the gauges
/// (`open_turns`, `held_events`, `sessions`, `held_bytes`, `agents`).
#[derive(Debug, Default)]
pub struct PipelineStats {
    pub events: AtomicU64,
    pub duplicate_events: AtomicU64,
    pub skipped_seqs: AtomicU64,
    pub held_events: AtomicU64,
    pub spans: AtomicU64,
    pub open_turns: AtomicU64,
    pub turns_evicted: AtomicU64,
    pub expired: AtomicU64,
    pub turns_evicted_for_bytes: AtomicU64,
    pub sessions_evicted: AtomicU64,
    pub late_events_dropped: AtomicU64,
    /// Events of accepted batches without a view at the stage (a bug of
    /// the receiver's decoding; each is logged as an error).
    pub undecodable_events: AtomicU64,
    pub cross_instance_turns: AtomicU64,
    pub turns_cut_off_at_exit: AtomicU64,
    pub turns_handed_off: AtomicU64,
    pub turns_orphaned: AtomicU64,
    pub turns_resent: AtomicU64,
    pub sessions: AtomicU64,
    pub held_bytes: AtomicU64,
    pub agents: AtomicU64,
}

impl PipelineStats {
    /// Copies the numbers of `correlation`; losses an agent caused are
    /// logged at their 1st, 2nd, 4th, … occurrence.
    pub fn publish(&self, correlation: &Correlation<WireEvent>) {
        let (sequencer, correlator) = (correlation.sequencer(), correlation.correlator());
        let s = correlator.stats();
        let store = |counter: &AtomicU64, value: u64| counter.store(value, Ordering::Relaxed);
        store(&self.events, s.events);
        store(&self.spans, s.spans);
        store(&self.turns_evicted, s.turns_evicted);
        store(&self.expired, s.expired);
        store(&self.turns_cut_off_at_exit, s.cut_off_at_exit);
        store(&self.turns_handed_off, s.turns_handed_off);
        store(&self.turns_orphaned, s.turns_orphaned);
        store(&self.turns_resent, s.turns_resent);
        let g = correlator.gauges();
        store(&self.open_turns, g.open_turns);
        store(&self.sessions, g.sessions);
        store(&self.held_bytes, g.held_bytes);
        store(&self.agents, g.agents);
        for (counter, value, what) in [
            (
                &self.turns_evicted_for_bytes,
                s.turns_evicted_for_bytes,
                "turns closed as incomplete: an agent held more than correlator.max_bytes_per_agent (or all more than max_bytes)",
            ),
            (
                &self.sessions_evicted,
                s.sessions_evicted,
                "session records forgotten: an agent held more than correlator.max_sessions_per_agent (or all more than max_sessions)",
            ),
            (
                &self.late_events_dropped,
                s.late_events_dropped,
                "events of a turn already closed dropped (the turn was exported)",
            ),
            (
                &self.undecodable_events,
                s.undecodable_events,
                "events the receiver accepted did not decode and are lost (a collector bug)",
            ),
            (
                &self.cross_instance_turns,
                s.cross_instance_turns,
                "turns opened with a turn id another agent process holds (given their own trace id)",
            ),
        ] {
            let before = counter.swap(value, Ordering::Relaxed);
            if value > before && (before == 0 || value.ilog2() > before.ilog2()) {
                tracing::warn!(total = value, "{what}");
            }
        }
        store(&self.duplicate_events, sequencer.stats().duplicates);
        store(&self.skipped_seqs, sequencer.stats().skipped);
        store(&self.held_events, sequencer.held() as u64);
    }
}

impl StageMetrics for PipelineStats {
    fn encode(&self, m: &mut MetricEncoder<'_>) -> fmt::Result {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let counters = [
            ("correlator_events", "Events correlated.", &self.events),
            (
                "correlator_duplicate_events",
                "Redelivered events dropped by the sequencer.",
                &self.duplicate_events,
            ),
            (
                "correlator_skipped_seqs",
                "Missing event sequence numbers given up after the gap timeout.",
                &self.skipped_seqs,
            ),
            (
                "correlator_evicted_turns",
                "Turns closed as incomplete by a limit (open turns, bytes held, the persistent queue's room).",
                &self.turns_evicted,
            ),
            (
                "correlator_evicted_turns_for_bytes",
                "Of the evicted turns, those closed because their agent (or all) held more than correlator.max_bytes_per_agent (max_bytes).",
                &self.turns_evicted_for_bytes,
            ),
            (
                "correlator_evicted_sessions",
                "Session records forgotten because their agent (or all) held more than correlator.max_sessions_per_agent (max_sessions).",
                &self.sessions_evicted,
            ),
            (
                "correlator_undecodable_events",
                "Events of batches the receiver accepted that the correlation stage could not decode (a collector bug, logged as an error).",
                &self.undecodable_events,
            ),
            (
                "correlator_late_events_dropped",
                "Events of a turn already closed and exported, dropped.",
                &self.late_events_dropped,
            ),
            (
                "correlator_cross_instance_turns",
                "Turns opened with a turn id another shim instance holds; given a trace id of their own.",
                &self.cross_instance_turns,
            ),
            (
                "correlator_turns_cut_off_at_exit",
                "Turns still running when their agent process exited (the shim's process_exit marker), closed as incomplete.",
                &self.turns_cut_off_at_exit,
            ),
            (
                "correlator_turns_handed_off",
                "Open turns forgotten without export: their agent moved to another collector of its fleet, which exports them.",
                &self.turns_handed_off,
            ),
            (
                "correlator_turns_orphaned",
                "Open turns replayed after a restart whose agent did not come back to this replica within state_ttl (fleet.replicated), forgotten without export: the agent replayed them to another replica.",
                &self.turns_orphaned,
            ),
            (
                "correlator_turns_resent",
                "Open turns forgotten when their fleet agent opened a new stream (after a broken one, a move back, or a restart of this replica): the agent sends their events again and they are rebuilt from that resend.",
                &self.turns_resent,
            ),
            (
                "correlator_expired",
                "Open state closed as incomplete after state_ttl.",
                &self.expired,
            ),
            ("spans", "Spans produced by the correlator.", &self.spans),
        ];
        let gauges = [
            (
                "correlator_held_events",
                "Events held by the sequencer until an earlier one arrives.",
                &self.held_events,
            ),
            (
                "correlator_open_turns",
                "Turns open in the correlator.",
                &self.open_turns,
            ),
            (
                "correlator_sessions",
                "Session records held: session starts waiting for a turn, subagent links.",
                &self.sessions,
            ),
            (
                "correlator_held_bytes",
                "Approximate bytes of open correlation state.",
                &self.held_bytes,
            ),
            (
                "correlator_agents",
                "Shim instances holding correlation state.",
                &self.agents,
            ),
        ];
        for (name, help, value) in counters {
            m.counter(name, help, load(value))?;
        }
        for (name, help, value) in gauges {
            m.gauge(name, help, load(value))?;
        }
        Ok(())
    }
}
