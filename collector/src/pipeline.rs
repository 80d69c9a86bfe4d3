//! The correlation stage: the thin async driver around the pure
//! [`Correlator`].
//!
//! It owns the receiving end of the ingest channel and the sending end of the
//! export channel. Batches are deduplicated by (shim instance, seq), fed to
//! the correlator event by event, timers run every `tick`, and finished spans
//! go to the exporters as OTLP `ResourceSpans`. Awaiting a place in the
//! export channel is the backpressure: when the exporters fall behind, this
//! stage stops reading, the ingest channel fills, and the receiver stops
//! reading from the shims.
//!
//! It ends when the ingest channel is closed (every receiver stream is gone),
//! after closing everything still open ([`Correlator::flush_all`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hermes_correlator::dedup::SeqFilter;
use hermes_correlator::{Correlator, FinishedSpan, to_resource_spans};
use hermes_receiver::Ingested;
use opentelemetry_proto::tonic::trace::v1::ResourceSpans;
use tokio::sync::mpsc;

/// Most shim instances whose sequence high-water mark is remembered.
const MAX_TRACKED_INSTANCES: usize = 65_536;

/// Counters of the correlation stage; all monotonic except `open_turns`.
#[derive(Debug, Default)]
pub struct PipelineStats {
    pub events: AtomicU64,
    pub duplicate_events: AtomicU64,
    pub spans: AtomicU64,
    pub open_turns: AtomicU64,
    pub turns_evicted: AtomicU64,
    pub expired: AtomicU64,
}

/// Runs the stage until the ingest channel closes. Returns the correlator's
/// final statistics.
pub async fn run(
    mut ingest: mpsc::Receiver<Ingested>,
    export: mpsc::Sender<Vec<ResourceSpans>>,
    mut correlator: Correlator,
    tick: Duration,
    stats: Arc<PipelineStats>,
) {
    let mut filter = SeqFilter::new(MAX_TRACKED_INSTANCES);
    let mut timer = tokio::time::interval(tick);
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut out: Vec<FinishedSpan> = Vec::new();
    loop {
        tokio::select! {
            received = ingest.recv() => {
                let Some(Ingested { batch }) = received else { break };
                let shim = batch.shim.unwrap_or_default();
                for event in &batch.events {
                    if filter.admit(&shim.instance_id, event.seq) {
                        correlator.ingest(&shim, event, &mut out);
                    }
                }
            }
            _ = timer.tick() => correlator.expire(now_unix_nanos(), &mut out),
        }
        publish(&correlator, &filter, &stats);
        if !out.is_empty()
            && export
                .send(to_resource_spans(std::mem::take(&mut out)))
                .await
                .is_err()
        {
            tracing::error!("exporter stage is gone; spans of the remaining events are lost");
            return;
        }
    }
    correlator.flush_all(&mut out);
    publish(&correlator, &filter, &stats);
    if !out.is_empty() {
        let n = out.len();
        if export.send(to_resource_spans(out)).await.is_err() {
            tracing::error!(
                spans = n,
                "exporter stage is gone; spans closed at shutdown are lost"
            );
        }
    }
}

fn publish(correlator: &Correlator, filter: &SeqFilter, stats: &PipelineStats) {
    let s = correlator.stats();
    stats.events.store(s.events, Ordering::Relaxed);
    stats.spans.store(s.spans, Ordering::Relaxed);
    stats
        .turns_evicted
        .store(s.turns_evicted, Ordering::Relaxed);
    stats.expired.store(s.expired, Ordering::Relaxed);
    stats
        .open_turns
        .store(correlator.open_turns() as u64, Ordering::Relaxed);
    stats
        .duplicate_events
        .store(filter.duplicates(), Ordering::Relaxed);
}

fn now_unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}
