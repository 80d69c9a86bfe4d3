//! The correlation stage: the thin async driver around the pure
//! [`Correlator`].
//!
//! It owns the receiving end of the ingest channel and the sending end of the
//! export channel. Events pass the [`Sequencer`] (capture order restored,
//! redeliveries dropped), then the correlator, timers run every `tick`, and
//! finished spans pass the [`SpanProcessor`] (attribute sets, redaction,
//! truncation) and
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

use hermes_correlator::sequencer::{Ready, Sequencer};
use hermes_correlator::{Correlator, FinishedSpan, to_resource_spans};
use hermes_processor::SpanProcessor;

use crate::derived::DerivedMetrics;
use hermes_receiver::Ingested;
use opentelemetry_proto::tonic::trace::v1::ResourceSpans;
use tokio::sync::mpsc;

/// Counters of the correlation stage; all monotonic except `open_turns`.
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
}

/// What the stage runs, in order: events through the sequencer and the
/// correlator; finished spans recorded in the derived metrics, then through
/// the processor.
pub struct Steps {
    pub sequencer: Sequencer,
    pub correlator: Correlator,
    pub derived: DerivedMetrics,
    pub processor: SpanProcessor,
}

/// Runs the stage until the ingest channel closes, ticking timers every
/// `tick`.
pub async fn run(
    mut ingest: mpsc::Receiver<Ingested>,
    export: mpsc::Sender<Vec<ResourceSpans>>,
    steps: Steps,
    tick: Duration,
    stats: Arc<PipelineStats>,
) {
    let Steps {
        mut sequencer,
        mut correlator,
        derived,
        processor,
    } = steps;
    let mut ready: Vec<Ready> = Vec::new();
    let mut timer = tokio::time::interval(tick);
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut out: Vec<FinishedSpan> = Vec::new();
    loop {
        tokio::select! {
            received = ingest.recv() => {
                let Some(Ingested { batch }) = received else { break };
                let shim = batch.shim.unwrap_or_default();
                let now = now_unix_nanos();
                for event in batch.events {
                    sequencer.push(&shim, batch.floor_seq, event, now, &mut ready);
                }
            }
            _ = timer.tick() => {
                let now = now_unix_nanos();
                sequencer.expire(now, &mut ready);
                correlator.expire(now, &mut out);
            }
        }
        for (shim, event) in ready.drain(..) {
            correlator.ingest(&shim, &event, &mut out);
        }
        publish(&sequencer, &correlator, &stats);
        if !out.is_empty()
            && export
                .send(processed(&processor, &derived, std::mem::take(&mut out)))
                .await
                .is_err()
        {
            tracing::error!("exporter stage is gone; spans of the remaining events are lost");
            return;
        }
    }
    sequencer.flush_all(&mut ready);
    for (shim, event) in ready.drain(..) {
        correlator.ingest(&shim, &event, &mut out);
    }
    correlator.flush_all(&mut out);
    publish(&sequencer, &correlator, &stats);
    if !out.is_empty() {
        let n = out.len();
        if export
            .send(processed(&processor, &derived, out))
            .await
            .is_err()
        {
            tracing::error!(
                spans = n,
                "exporter stage is gone; spans closed at shutdown are lost"
            );
        }
    }
}

fn publish(sequencer: &Sequencer, correlator: &Correlator, stats: &PipelineStats) {
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
        .store(sequencer.stats().duplicates, Ordering::Relaxed);
    stats
        .skipped_seqs
        .store(sequencer.stats().skipped, Ordering::Relaxed);
    stats
        .held_events
        .store(sequencer.held() as u64, Ordering::Relaxed);
}

/// Records the derived metrics, groups spans by resource and applies
/// attribute sets, redaction and truncation.
fn processed(
    processor: &SpanProcessor,
    derived: &DerivedMetrics,
    spans: Vec<FinishedSpan>,
) -> Vec<ResourceSpans> {
    for finished in &spans {
        derived.record(&finished.span);
    }
    let mut batch = to_resource_spans(spans);
    processor.process(&mut batch);
    batch
}

fn now_unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}
