//! The correlation stage: the thin async driver around the pure
//! [`Correlation`] (sequencer and correlator).
//!
//! It owns the receiving end of the ingest channel and the sending end of
//! the export channel. Events pass the sequencer (capture order restored,
//! redeliveries dropped), then the correlator; timers run every `tick`
//! while anything is open, held or unsettled (an idle stage does not wake,
//! and state that only its TTL closes wakes it once, at the TTL); finished
//! spans pass the [`SpanProcessor`] (attribute sets, redaction, truncation)
//! and the derived metrics, then the tail [`Sampler`], and go to the
//! exporters as OTLP `ResourceSpans`, or encoded here when every sink
//! sends protobuf ([`Driver::encoder`]). Awaiting a place in the
//! export channel is the backpressure: when the exporters fall behind, this
//! stage stops reading, the ingest channel fills, and the receiver stops
//! reading from the shims.
//!
//! Time comes from a [`Clock`]: the wall clock in production, tokio's
//! paused clock in the stage tests.
//!
//! It ends when the ingest channel is closed (every receiver stream is
//! gone, or `stop` was cancelled), after closing everything still open,
//! unless the [`Ledger`] keeps open state for the next start (the
//! persistent queue).

use std::sync::Arc;
use std::time::Duration;

use hermes_correlator::{Correlation, Departure, Expiry, FinishedSpan, to_resource_spans};
use hermes_exporter::{Encoder, Outgoing};
use hermes_processor::SpanProcessor;
use hermes_proto::view::WireEvent;
use hermes_receiver::Ingested;
use hermes_sampling::{Policy, Sampler};
use hermes_span::trace::v1::ResourceSpans;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::derived::DerivedMetrics;
use crate::ledger::Ledger;
use crate::settle::Settlement;
use crate::stats::PipelineStats;

/// What the stage runs, in order: events through the sequencer and the
/// correlator; finished spans through the processor, then recorded in the
/// derived metrics (every span counts), then through the sampler, which
/// holds each trace until it is decided and passes on the kept ones whole.
pub struct Steps {
    pub correlation: Correlation<WireEvent>,
    pub derived: DerivedMetrics,
    pub processor: SpanProcessor,
    pub sampler: Sampler,
}

/// The correlation stage, ready to run.
pub struct Driver<C> {
    pub steps: Steps,
    /// How often timers run while anything is open.
    pub tick: Duration,
    pub stats: Arc<PipelineStats>,
    pub ledger: Ledger,
    pub clock: C,
    /// New sampling policies (a live change of the configuration), taken
    /// before the next batch is sampled.
    pub policies: Option<watch::Receiver<Vec<Policy>>>,
    /// Where the sessions their host ended go (the trajectory sink), after
    /// the spans finished with them were sent on.
    pub session_ends: Option<crate::sinks::SessionEnds>,
    /// Settlement of fleet shims' events ([`crate::settle`]); none: no
    /// shim is told.
    pub settlement: Option<Settlement>,
    /// Encodes the spans sent on, when every sink takes encoded batches
    /// ([`hermes_exporter::ExporterStage::encoder`]): built, encoded and
    /// freed on this thread. None: the spans go as they are.
    pub encoder: Option<Encoder>,
}

/// What the stage hands back when it ends: its ledger and the lowest lsn
/// the state it left open needs (none in memory: everything was closed).
pub struct Ended {
    pub ledger: Ledger,
    pub open: Option<u64>,
}

/// Hands the sessions ended since the last pass to `to` (never waiting: a
/// full channel loses the end, counted, and the session is written at its
/// idle time instead); without a receiver they are dropped.
fn report_session_ends(
    correlation: &mut Correlation<WireEvent>,
    to: Option<&crate::sinks::SessionEnds>,
) {
    for end in correlation.take_session_ends() {
        let Some(to) = to else { continue };
        to.hand(hermes_trajectory::SessionEnd {
            instance_id: end.instance_id,
            session_id: end.session_id,
        });
    }
}

/// The lower of two optional lsns.
fn lowest(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    a.into_iter().chain(b).min()
}

impl<C: Clock> Driver<C> {
    /// A stage on the in-memory ledger with fresh derived metrics and
    /// stats, no sampling and a 100 ms tick: what tests, benches and fuzz
    /// targets run (set the public fields for anything else).
    pub fn in_memory(
        correlation: Correlation<WireEvent>,
        processor: SpanProcessor,
        clock: C,
    ) -> Self {
        Self {
            steps: Steps {
                correlation,
                derived: DerivedMetrics::default(),
                processor,
                sampler: Sampler::keep_all(),
            },
            tick: Duration::from_millis(100),
            stats: Arc::default(),
            ledger: Ledger::Memory,
            clock,
            policies: None,
            session_ends: None,
            settlement: None,
            encoder: None,
        }
    }

    /// Runs the stage until the ingest channel closes, ticking timers every
    /// `tick` while there is anything for them to do (see [`Expiry`]).
    /// Cancelling `stop` closes the ingest channel: what it holds is still
    /// taken, then the stage ends as if every sender were gone, whoever
    /// still holds one (a client connection that has not closed yet).
    pub async fn run(
        self,
        mut ingest: mpsc::Receiver<Ingested>,
        export: mpsc::Sender<Outgoing>,
        stop: CancellationToken,
    ) -> Ended {
        let Self {
            steps:
                Steps {
                    mut correlation,
                    mut derived,
                    mut processor,
                    mut sampler,
                },
            tick,
            stats,
            mut ledger,
            clock,
            mut policies,
            session_ends,
            mut settlement,
            encoder,
        } = self;
        let outgoing = |spans: Vec<ResourceSpans>| match encoder {
            Some(encoder) => encoder.encode(spans),
            None => Outgoing::Spans(spans),
        };
        if settlement.is_some() {
            correlation.record_closures();
        }
        let mut timer = tokio::time::interval(tick);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut out: Vec<FinishedSpan> = Vec::new();
        let mut ticked = false;
        let mut stopped = false;
        loop {
            // Nothing open, held or unsettled: a tick would do nothing, so
            // the timer stops until the next batch (an idle collector
            // sleeps), or until the TTL of what only the TTL closes, or the
            // wait of a held trace whose root will not come. Whether the
            // queue is settled is asked last: what open state needs is a
            // visit of all of it, and while turns are open the timer runs
            // anyway.
            let expiry = match correlation.expiry() {
                Expiry::EveryTick => Expiry::EveryTick,
                _ if settlement.as_ref().is_some_and(Settlement::is_pending) => Expiry::EveryTick,
                _ if !ledger
                    .is_settled(lowest(correlation.min_open_lsn(), sampler.min_held_lsn())) =>
                {
                    Expiry::EveryTick
                }
                expiry => match (
                    expiry,
                    lowest(
                        sampler.deadline(),
                        settlement.as_ref().and_then(Settlement::orphan_deadline),
                    ),
                ) {
                    (Expiry::At(at), Some(wait)) => Expiry::At(at.min(wait)),
                    (_, Some(wait)) => Expiry::At(wait),
                    (expiry, None) => expiry,
                },
            };
            let due = async {
                match expiry {
                    Expiry::EveryTick => {
                        timer.tick().await;
                    }
                    Expiry::At(at) => {
                        let wait = at.saturating_sub(clock.now_unix_nanos());
                        tokio::time::sleep(Duration::from_nanos(wait)).await;
                    }
                    Expiry::Never => std::future::pending().await,
                }
            };
            tokio::select! {
                () = stop.cancelled(), if !stopped => {
                    ingest.close();
                    stopped = true;
                    continue;
                }
                received = ingest.recv() => {
                    let Some(Ingested { mut batch, lsn, fleet, fresh, stream, .. }) = received else { break };
                    let lsn = match settlement.as_mut() {
                        Some(settlement) if lsn == 0 => settlement.number(),
                        _ => lsn,
                    };
                    let (handoff, last_seq) = (batch.handoff, batch.last_seq);
                    let shim = batch.shim.take().unwrap_or_default();
                    if fleet {
                        tracing::debug!(
                            instance = %shim.instance_id,
                            stream,
                            fresh,
                            handoff,
                            lsn,
                            floor = batch.floor_seq,
                            first = batch.first_seq,
                            last = last_seq,
                            "fleet batch"
                        );
                    }
                    let floor = ledger.floor(&shim.instance_id, lsn, batch.floor_seq);
                    // What an earlier stream of the instance still brings after a
                    // newer one started here (it left and came straight back) is
                    // stale: the newer stream resends everything unsettled. Taken,
                    // its late batches would be events ahead of a hole the newer
                    // stream fills only later, its handoff would drop what that
                    // stream rebuilt.
                    if fleet && settlement.as_ref().is_some_and(|s| !s.is_current(&shim.instance_id, stream)) {
                        tracing::debug!(instance = %shim.instance_id, stream, handoff, "a batch of an earlier stream, after a newer one started: ignored");
                        continue;
                    }
                    if fresh {
                        let instances = [shim.instance_id.clone()];
                        depart(&instances, Departure::Resent, &mut correlation, &mut sampler, settlement.as_mut());
                        if let Some(settlement) = settlement.as_mut() {
                            settlement.stream_started(&shim.instance_id, stream);
                        }
                    }
                    // A fresh fleet stream starts the instance over here: what it
                    // resends is rebuilt, even seqs this queue once held (their
                    // records went when a handoff let the watermark pass them).
                    let floor = if fresh { batch.floor_seq } else { floor };
                    let now = clock.now_unix_nanos();
                    if let Some(settlement) = settlement.as_mut() {
                        settlement.arrived(&shim.instance_id, ledger.is_replayed(lsn), now);
                    }
                    if expiry != Expiry::EveryTick {
                        // The tick the stopped timer skipped: it sets the
                        // correlator's clock and closes nothing that is not
                        // due. The timer starts over from here, rather than
                        // firing at once for its overdue tick and expiring a
                        // second time.
                        if let Some(settlement) = settlement.as_ref() {
                            correlation.set_movable(settlement.movable());
                        }
                        correlation.catch_up(now, &mut out);
                        timer.reset();
                    }
                    // Each event stays the bytes it came in until it is
                    // correlated, read in place on this thread.
                    correlation.push_wire_batch(&shim, floor, &batch, lsn, now, &mut out);
                    if let (Some(settlement), Some(last_seq), true) = (settlement.as_mut(), last_seq, fleet) {
                        settlement.ingested(&shim.instance_id, lsn, last_seq);
                    }
                    if handoff {
                        let instances = [shim.instance_id];
                        depart(&instances, Departure::HandedOff, &mut correlation, &mut sampler, settlement.as_mut());
                    }
                }
                () = due => {
                    let now = clock.now_unix_nanos();
                    // Before the TTL closes replayed state as incomplete.
                    if let Some(settlement) = settlement.as_mut() {
                        let orphans = settlement.take_orphans(now);
                        depart(&orphans, Departure::Orphaned, &mut correlation, &mut sampler, Some(settlement));
                    }
                    if let Some(settlement) = settlement.as_ref() {
                        correlation.set_movable(settlement.movable());
                    }
                    correlation.tick(now, &mut out);
                    sampler.expire(now);
                    let pinned = lowest(correlation.correlator().min_lsn(), sampler.min_held_lsn());
                    if let Some(below) = ledger.pressure(pinned) {
                        let before = out.len();
                        correlation.evict_below_lsn(below, &mut out);
                        sampler.decide_below(below, now);
                        tracing::warn!(
                            below,
                            spans = out.len() - before,
                            "persistent queue 90% full: closing the oldest open turns as incomplete"
                        );
                    }
                    ticked = true;
                }
            }
            stats.publish(&correlation);
            if let Some(settlement) = settlement.as_mut() {
                settlement.take_closures(&mut correlation);
            }
            if let Some(policies) = policies.as_mut()
                && policies.has_changed().unwrap_or(false)
            {
                sampler.set_policies(policies.borrow_and_update().clone());
            }
            if !out.is_empty() || sampler.has_ready() {
                let mut spans = std::mem::take(&mut out);
                ledger.suppress_exported(&mut spans);
                let processed = if spans.is_empty() {
                    Vec::new()
                } else {
                    processed(&mut processor, &mut derived, spans)
                };
                let low_water = match &settlement {
                    Some(settlement) if !ledger.keeps_open_state() => settlement.low_water(),
                    _ => ledger.low_water(),
                };
                let batch = sampler.admit(processed, low_water, clock.now_unix_nanos());
                if !batch.is_empty() {
                    ledger.sending(&batch);
                    if let Some(settlement) = settlement.as_mut() {
                        settlement.sending();
                    }
                    if export.send(outgoing(batch)).await.is_err() {
                        tracing::error!(
                            "exporter stage is gone; spans of the remaining events are lost"
                        );
                        let open = lowest(correlation.min_open_lsn(), sampler.min_held_lsn());
                        return Ended { ledger, open };
                    }
                }
            }
            report_session_ends(&mut correlation, session_ends.as_ref());
            // Settle only once what the tick released is ingested and what
            // it closed is counted as sent (else the watermark could pass
            // records of spans not exported yet).
            if std::mem::take(&mut ticked) {
                ledger.settle(lowest(correlation.min_open_lsn(), sampler.min_held_lsn()));
                if let Some(settlement) = settlement.as_mut() {
                    settlement.settle(&correlation, sampler.min_held_lsn());
                }
            }
        }
        let replicated = settlement.as_ref().is_some_and(Settlement::is_replicated);
        if ledger.keeps_open_state() && !replicated {
            // Open state stays open, held traces undecided: the queue keeps
            // their records for the next start.
            let open = lowest(correlation.min_open_lsn(), sampler.min_held_lsn());
            return Ended { ledger, open };
        }
        if let Some(settlement) = settlement.as_mut().filter(|s| s.is_replicated()) {
            // One replica of a fleet keeps nothing open: what moved (or
            // will move) to another replica is dropped, what a dead agent
            // left is closed below.
            let orphans = settlement.take_orphans(u64::MAX);
            depart(
                &orphans,
                Departure::Orphaned,
                &mut correlation,
                &mut sampler,
                Some(settlement),
            );
            let departed = settlement.departed();
            depart(
                &departed,
                Departure::HandedOff,
                &mut correlation,
                &mut sampler,
                Some(settlement),
            );
        }
        correlation.flush_all(&mut out);
        stats.publish(&correlation);
        let processed = if out.is_empty() {
            Vec::new()
        } else {
            processed(&mut processor, &mut derived, out)
        };
        let now = clock.now_unix_nanos();
        let mut batch = sampler.admit(processed, ledger.low_water(), now);
        // Traces whose root never came are decided with what they have.
        sampler.decide_all(now);
        batch.extend(sampler.admit(Vec::new(), ledger.low_water(), now));
        if !batch.is_empty() {
            ledger.sending(&batch);
            let n: usize = batch
                .iter()
                .flat_map(|rs| &rs.scope_spans)
                .map(|ss| ss.spans.len())
                .sum();
            if export.send(outgoing(batch)).await.is_err() {
                tracing::error!(
                    spans = n,
                    "exporter stage is gone; spans closed at shutdown are lost"
                );
            }
        }
        Ended { ledger, open: None }
    }
}

/// Fleet shims moved to another collector (a handoff, or they replayed
/// there after this one restarted): their held events, open state and held
/// traces are forgotten without export, and nothing of their batches will
/// be settled here (the other collector builds the same spans from the same
/// events).
fn depart(
    instances: &[String],
    why: Departure,
    correlation: &mut Correlation<WireEvent>,
    sampler: &mut Sampler,
    mut settlement: Option<&mut Settlement>,
) {
    for instance in instances {
        let turns = correlation.drop_instance(instance, why);
        let traces = sampler.forget_instance(instance);
        if let Some(settlement) = settlement.as_deref_mut() {
            settlement.forget(instance);
        }
        tracing::debug!(
            ?why,
            turns,
            traces,
            "a shim's open state went to another collector of its fleet; forgotten here"
        );
    }
}

/// Groups spans by resource, applies attribute sets, redaction and
/// truncation, then records the derived metrics from the processed spans:
/// their labels are the redacted, cut values the spans are exported with.
fn processed(
    processor: &mut SpanProcessor,
    derived: &mut DerivedMetrics,
    spans: Vec<FinishedSpan>,
) -> Vec<ResourceSpans> {
    let mut batch = to_resource_spans(spans);
    processor.process(&mut batch);
    for span in batch
        .iter()
        .flat_map(|rs| &rs.scope_spans)
        .flat_map(|ss| &ss.spans)
    {
        derived.record(span);
    }
    batch
}

#[cfg(test)]
#[path = "driver_tests.rs"]
mod stage_tests;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::derived::samples::{sample_spans, text};
    use hermes_processor::{AttributeSet, MIN_ATTRIBUTE_BYTES, ProcessorConfig};
    use hermes_span::resource::v1::Resource;

    const KEY: &str = "sk-proj-Q3vT9xLmN2bR7kWp4ZsY8aDf";

    /// The sample spans of the derived metrics' tests, with `tool` and
    /// `model`, as the correlator hands them over.
    fn spans(tool: &str, model: &str) -> Vec<FinishedSpan> {
        let resource = Arc::new(Resource::default());
        sample_spans(tool, model)
            .into_iter()
            .map(|span| FinishedSpan {
                resource: resource.clone(),
                span,
            })
            .collect()
    }

    #[test]
    fn processing_changes_no_number_of_the_derived_metrics() {
        // Every step of the processor on, truncation at its tightest.
        let mut processor = SpanProcessor::new(&ProcessorConfig {
            attribute_sets: vec![AttributeSet::OpenInference, AttributeSet::Langfuse],
            max_attribute_bytes: Some(MIN_ATTRIBUTE_BYTES),
            ..ProcessorConfig::default()
        })
        .unwrap();
        let mut after = DerivedMetrics::default();
        let batch = processed(&mut processor, &mut after, spans("terminal", "gpt-4o"));
        assert!(
            batch[0].scope_spans[0].spans[0]
                .attributes
                .iter()
                .any(|kv| kv.key.starts_with("llm.")),
            "the processor ran"
        );
        let mut before = DerivedMetrics::default();
        for finished in spans("terminal", "gpt-4o") {
            before.record(&finished.span);
        }
        let out = text(&after);
        assert!(
            out.contains(
                "hermes_tool_duration_seconds_count{gen_ai_tool_name=\"terminal\",status=\"ok\"} 1"
            ),
            "{out}"
        );
        // The same text, but for the order of the overflow counters.
        let sorted = |text: &str| {
            let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
            lines.sort();
            lines
        };
        assert!(sorted(&out) == sorted(&text(&before)), "{out}");
    }

    #[test]
    fn labels_on_the_metrics_are_the_redacted_values() {
        let mut processor = SpanProcessor::new(&ProcessorConfig::default()).unwrap();
        let mut metrics = DerivedMetrics::default();
        processed(
            &mut processor,
            &mut metrics,
            spans(&format!("tool-{KEY}"), &format!("model {KEY}")),
        );
        let out = text(&metrics);
        assert!(!out.contains(&KEY[8..]), "{out}");
        assert!(
            out.contains("gen_ai_tool_name=\"tool-<redacted>\""),
            "{out}"
        );
        assert!(
            out.contains("gen_ai_request_model=\"model <redacted>\""),
            "{out}"
        );
        assert!(
            out.contains("gen_ai_client_token_usage_token_sum{gen_ai_operation_name=\"chat\",gen_ai_provider_name=\"custom\",gen_ai_request_model=\"model <redacted>\",gen_ai_token_type=\"input\"} 1212.0"),
            "{out}"
        );
    }
}
