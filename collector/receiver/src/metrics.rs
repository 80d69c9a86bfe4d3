//! The receiver's metrics on `/metrics`, read from [`ReceiverStats`] at
//! scrape time.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use hermes_metrics::{Kind, MetricEncoder, StageMetrics};

use crate::ReceiverStats;

/// Counters of the receiver: (name, help, value).
fn counters(r: &ReceiverStats) -> [(&'static str, &'static str, &AtomicU64); 15] {
    [
        (
            "receiver_accepted_events",
            "Events accepted from the shims.",
            &r.events_accepted,
        ),
        (
            "receiver_accepted_batches",
            "Event batches accepted from the shims.",
            &r.batches_accepted,
        ),
        (
            "receiver_refused_batches",
            "Event batches refused (invalid or over the limits).",
            &r.batches_refused,
        ),
        (
            "receiver_auth_failures",
            "Ingest stream calls refused for a missing or wrong bearer token.",
            &r.auth_failures,
        ),
        (
            "receiver_memory_refusals",
            "Event batches refused with UNAVAILABLE above receiver.memory_limit_mib.",
            &r.memory_refusals,
        ),
        (
            "receiver_oversized_events",
            "Event batches refused for an event above receiver.max_event_bytes.",
            &r.oversized_events,
        ),
        (
            "receiver_throttled_batches",
            "Event batches delayed by the per-stream rate limit (receiver.stream_events_per_sec).",
            &r.throttled_batches,
        ),
        (
            "receiver_streams_opened",
            "Ingest streams opened by shims.",
            &r.streams_opened,
        ),
        (
            "shim_dropped_events",
            "Events the shims dropped because their hook queue was full, as they reported.",
            &r.shim_dropped_events,
        ),
        (
            "receiver_connections_refused",
            "Ingest connections closed at once because receiver.max_connections were open.",
            &r.connections_refused,
        ),
        (
            "receiver_connections_timed_out",
            "Ingest connections closed for opening no accepted stream within receiver.handshake_timeout_ms.",
            &r.connections_timed_out,
        ),
        (
            "receiver_connections_idle_closed",
            "Ingest connections closed after receiver.idle_timeout_secs without a stream.",
            &r.connections_idle_closed,
        ),
        (
            "receiver_accept_errors",
            "Errors accepting ingest connections (e.g. out of file descriptors).",
            &r.accept_errors,
        ),
        (
            "receiver_foreign_instance_refusals",
            "Event batches refused for a shim instance id another client certificate uses.",
            &r.foreign_instance_refusals,
        ),
        (
            "receiver_unreadable_wire_calls",
            "Calls refused with UNIMPLEMENTED for a release of the wire protocol this collector cannot read (it reads hermes.collector.v1).",
            &r.unreadable_wire_calls,
        ),
    ]
}

impl StageMetrics for ReceiverStats {
    fn encode(&self, m: &mut MetricEncoder<'_>) -> fmt::Result {
        for (name, help, value) in counters(self) {
            m.counter(name, help, value.load(Ordering::Relaxed))?;
        }
        m.gauge(
            "receiver_connections_open",
            "Ingest connections open now.",
            self.connections_open.load(Ordering::Relaxed),
        )?;
        let versions = self.unknown_shim_versions.snapshot();
        m.family(
            Kind::Counter,
            (
                "receiver_unknown_shim_version_streams",
                "Ingest streams (accepted) from shim releases this collector does not know, by version: at most 16 labels, then `other`.",
                "shim_version",
            ),
            versions.iter().map(|(version, n)| (version.as_str(), *n)),
        )
    }
}
