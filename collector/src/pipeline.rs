//! The correlation stage: the thin async driver around the pure
//! [`Correlator`].
//!
//! It owns the receiving end of the ingest channel and the sending end of the
//! export channel. Events pass the [`Sequencer`] (capture order restored,
//! redeliveries dropped), then the correlator, timers run every `tick` (while
//! anything is open, held or unsettled: an idle stage does not wake, and
//! state that only its TTL closes wakes it once, at the TTL), and
//! finished spans pass the [`SpanProcessor`] (attribute sets, redaction,
//! truncation) and
//! go to the exporters as OTLP `ResourceSpans`. Awaiting a place in the
//! export channel is the backpressure: when the exporters fall behind, this
//! stage stops reading, the ingest channel fills, and the receiver stops
//! reading from the shims.
//!
//! It ends when the ingest channel is closed (every receiver stream is gone),
//! after closing everything still open ([`Correlator::flush_all`]) — except
//! with the persistent queue ([`Durable`]), where what is open stays open:
//! its records stay on disk and the next start replays them, so a turn that
//! spans a restart is exported once, whole.
//!
//! With the persistent queue the stage also decides what the queue may
//! delete ([`Tracker`]): every export message remembers a lower bound of the
//! lsns it was built from; once the exporter stage has finished a message
//! (`ExporterStats::done_through`), its span keys are stored as export
//! markers, and the watermark — the lowest lsn that open state, held events
//! or unfinished messages still need — is sent to the writer. After a
//! restart, replayed spans whose keys have a marker are not exported again.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hermes_correlator::{Correlation, Expiry, FinishedSpan, to_resource_spans};
use hermes_processor::SpanProcessor;

use crate::derived::DerivedMetrics;
use crate::persist::{QueueStats, Recovered, Settle};
use hermes_exporter::ExporterStats;
use hermes_queue::{SPAN_KEY_BYTES, SpanKey};
use hermes_receiver::Ingested;
use hermes_span::trace::v1::ResourceSpans;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

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
    pub turns_evicted_for_bytes: AtomicU64,
    pub sessions_evicted: AtomicU64,
    pub late_events_dropped: AtomicU64,
    pub cross_instance_turns: AtomicU64,
    pub turns_cut_off_at_exit: AtomicU64,
    /// Gauges of the correlator's state.
    pub sessions: AtomicU64,
    pub held_bytes: AtomicU64,
    pub agents: AtomicU64,
}

/// What the stage runs, in order: events through the sequencer and the
/// correlator; finished spans through the processor, then recorded in the
/// derived metrics.
pub struct Steps {
    pub correlation: Correlation,
    pub derived: DerivedMetrics,
    pub processor: SpanProcessor,
}

/// The persistent queue's side of the stage.
pub struct Durable {
    /// To the queue writer.
    pub settle: mpsc::Sender<Settle>,
    /// Whose `done_through` tells which messages are finished.
    pub exporter: Arc<ExporterStats>,
    pub recovered: Recovered,
    /// The queue's fill level.
    pub queue: Arc<QueueStats>,
}

/// One export message not finished yet.
struct Pending {
    /// Its number at the exporter stage (1, 2, 3, ...).
    index: u64,
    /// No event it was built from has a lower lsn.
    first_lsn: u64,
    /// No event it was built from has a higher lsn.
    last_lsn: u64,
    /// Span keys, [`SPAN_KEY_BYTES`] each.
    keys: Vec<u8>,
}

/// Tracks what the persistent queue still needs; see the module docs.
pub struct Tracker {
    durable: Durable,
    /// Messages sent to the exporter stage.
    sent: u64,
    pending: VecDeque<Pending>,
    /// Highest lsn ingested.
    last_lsn: u64,
    /// Lowest lsn open state or held events needed at the last tick.
    watermark: u64,
    /// Markers of finished messages not yet handed to the writer.
    markers: Vec<(u64, Vec<u8>)>,
    /// Watermark last handed to the writer.
    settled: u64,
}

impl Tracker {
    pub fn new(durable: Durable) -> Self {
        Self {
            durable,
            sent: 0,
            pending: VecDeque::new(),
            last_lsn: 0,
            watermark: 0,
            markers: Vec::new(),
            settled: 0,
        }
    }

    /// The `floor_seq` for a batch of `instance` at `lsn`. The first batch
    /// an instance sends after a restart, when none of its records was
    /// replayed, gets a floor above every seq it ever had persisted: a
    /// batch it resends because the acknowledgement was lost with the
    /// process is a duplicate, even when its records are gone.
    fn floor(&mut self, instance: &str, lsn: u64, floor_seq: u64) -> u64 {
        self.last_lsn = self.last_lsn.max(lsn);
        let seqs = &mut self.durable.recovered.seqs;
        if seqs.is_empty() {
            return floor_seq;
        }
        match seqs.remove(instance) {
            // A replayed record: the replay rebuilds the sequencer's state.
            Some(_) if lsn <= self.durable.recovered.replay_end => floor_seq,
            Some(persisted) => floor_seq.max(persisted + 1),
            None => floor_seq,
        }
    }

    /// Drops spans a backend already has (replayed after a restart).
    fn suppress_exported(&mut self, spans: &mut Vec<FinishedSpan>) {
        let exported = &mut self.durable.recovered.exported;
        if exported.is_empty() {
            return;
        }
        spans.retain(|f| !exported.contains(&key_of(&f.span)));
        if self.settled > self.durable.recovered.replay_end {
            // Every replayed record is settled: no replayed span comes back.
            *exported = HashSet::new();
        }
    }

    /// With the queue 90 % full because of open state (`open`, its lowest
    /// position, holds the watermark back, not unexported spans), the
    /// position below which open state is closed as incomplete so that its
    /// records can go: the older half of what it pins. Without it a turn
    /// that never ends would keep the queue full until its TTL, and the
    /// queue would stop taking the very events that could end it. A backend
    /// that is down fills the queue with unexported spans instead: nothing
    /// is closed for that, the shims buffer.
    fn pressure(&self, open: Option<u64>) -> Option<u64> {
        let bytes = self.durable.queue.bytes.load(Ordering::Relaxed);
        let capacity = self.durable.queue.capacity_bytes.load(Ordering::Relaxed);
        let open = open?;
        let unexported = self.pending.front().map_or(u64::MAX, |p| p.first_lsn);
        if bytes.saturating_mul(10) < capacity.saturating_mul(9)
            || open > unexported
            || open >= self.last_lsn
        {
            return None;
        }
        Some(open + (self.last_lsn - open) / 2 + 1)
    }

    /// Records an export message about to be sent.
    fn sending(&mut self, batch: &[ResourceSpans]) {
        self.sent += 1;
        let keys: Vec<u8> = batch
            .iter()
            .flat_map(|rs| rs.scope_spans.iter())
            .flat_map(|ss| ss.spans.iter())
            .flat_map(key_of)
            .collect();
        self.pending.push_back(Pending {
            index: self.sent,
            first_lsn: self.watermark,
            last_lsn: self.last_lsn,
            keys,
        });
    }

    /// Moves finished messages to markers and computes the watermark from
    /// `open` (the lowest lsn open state and held events need); the settle
    /// to hand to the writer, if there is anything to say.
    fn prepare(&mut self, open: Option<u64>) -> Option<Settle> {
        let done = self.durable.exporter.done_through();
        while self.pending.front().is_some_and(|p| p.index <= done) {
            if let Some(p) = self.pending.pop_front() {
                self.markers.push((p.last_lsn, p.keys));
            }
        }
        let next = self.last_lsn + 1;
        let unfinished = self.pending.front().map(|p| p.first_lsn);
        // `first_lsn` of the messages sent before the next tick.
        self.watermark = open.unwrap_or(next).min(next);
        let below = unfinished.map_or(self.watermark, |u| u.min(self.watermark));
        if below <= self.settled && self.markers.is_empty() {
            return None;
        }
        Some(Settle {
            exported: std::mem::take(&mut self.markers),
            below,
        })
    }

    /// Whether a settle would say nothing new: every message sent is
    /// finished and handed over, and the watermark is as far as `open` (as
    /// in [`Tracker::prepare`]) lets it go.
    fn is_settled(&self, open: Option<u64>) -> bool {
        let next = self.last_lsn + 1;
        self.pending.is_empty()
            && self.markers.is_empty()
            && self.settled >= open.unwrap_or(next).min(next)
    }

    /// [`Tracker::prepare`], handed to the writer when it has room (else
    /// the markers wait for the next tick; never blocks the stage).
    fn settle(&mut self, open: Option<u64>) {
        let Some(settle) = self.prepare(open) else {
            return;
        };
        let below = settle.below;
        match self.durable.settle.try_send(settle) {
            Ok(()) => self.settled = self.settled.max(below),
            Err(
                mpsc::error::TrySendError::Full(settle) | mpsc::error::TrySendError::Closed(settle),
            ) => self.markers = settle.exported,
        }
    }

    /// After the exporter stage ended: the final settle, waiting for room;
    /// `open` as in [`Tracker::prepare`], measured when the stage ended.
    pub async fn finish(mut self, open: Option<u64>) {
        if let Some(settle) = self.prepare(open) {
            let _ = self.durable.settle.send(settle).await;
        }
    }
}

fn key_of(span: &hermes_span::trace::v1::Span) -> SpanKey {
    let mut key = [0u8; SPAN_KEY_BYTES];
    let trace = span.trace_id.len().min(16);
    key[..trace].copy_from_slice(&span.trace_id[..trace]);
    let id = span.span_id.len().min(8);
    key[16..16 + id].copy_from_slice(&span.span_id[..id]);
    key
}

/// What the stage hands back when it ends: with the persistent queue, the
/// tracker and the lowest lsn the state left open needs.
pub type Ended = Option<(Tracker, Option<u64>)>;

/// Runs the stage until the ingest channel closes, ticking timers every
/// `tick` while there is anything for them to do (see [`Expiry`]).
/// Cancelling `stop` closes the ingest channel: what it holds is still
/// taken, then the stage ends as if every sender were gone, whoever still
/// holds one (a client connection that has not closed yet).
#[allow(clippy::too_many_arguments)]
pub async fn run(
    mut ingest: mpsc::Receiver<Ingested>,
    export: mpsc::Sender<Vec<ResourceSpans>>,
    steps: Steps,
    tick: Duration,
    stats: Arc<PipelineStats>,
    mut tracker: Option<Tracker>,
    stop: CancellationToken,
) -> Ended {
    let Steps {
        mut correlation,
        mut derived,
        mut processor,
    } = steps;
    let mut timer = tokio::time::interval(tick);
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut out: Vec<FinishedSpan> = Vec::new();
    let mut ticked = false;
    let mut stopped = false;
    loop {
        // Nothing open, held or unsettled: a tick would do nothing, so the
        // timer stops until the next batch (an idle collector sleeps), or
        // until the TTL of what only the TTL closes.
        let expiry = match correlation.expiry() {
            _ if tracker
                .as_ref()
                .is_some_and(|t| !t.is_settled(correlation.min_open_lsn())) =>
            {
                Expiry::EveryTick
            }
            expiry => expiry,
        };
        let due = async {
            match expiry {
                Expiry::EveryTick => {
                    timer.tick().await;
                }
                Expiry::At(at) => {
                    let wait = at.saturating_sub(now_unix_nanos());
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
                let Some(Ingested { batch, lsn, .. }) = received else { break };
                let shim = batch.shim.unwrap_or_default();
                let floor = match tracker.as_mut() {
                    Some(tracker) => tracker.floor(&shim.instance_id, lsn, batch.floor_seq),
                    None => batch.floor_seq,
                };
                let now = now_unix_nanos();
                if expiry != Expiry::EveryTick {
                    // The tick the stopped timer skipped: it sets the
                    // correlator's clock and closes nothing that is not due.
                    // The timer starts over from here, rather than firing at
                    // once for its overdue tick and expiring a second time.
                    correlation.catch_up(now, &mut out);
                    timer.reset();
                }
                correlation.push_batch(&shim, floor, batch.events, lsn, now, &mut out);
            }
            () = due => {
                correlation.tick(now_unix_nanos(), &mut out);
                if let Some(tracker) = tracker.as_mut()
                    && let Some(below) = tracker.pressure(correlation.correlator().min_lsn())
                {
                    let before = out.len();
                    correlation.evict_below_lsn(below, &mut out);
                    tracing::warn!(
                        below,
                        spans = out.len() - before,
                        "persistent queue 90% full: closing the oldest open turns as incomplete"
                    );
                }
                ticked = true;
            }
        }
        publish(&correlation, &stats);
        if !out.is_empty() {
            let mut spans = std::mem::take(&mut out);
            if let Some(tracker) = tracker.as_mut() {
                tracker.suppress_exported(&mut spans);
            }
            if !spans.is_empty() {
                let batch = processed(&mut processor, &mut derived, spans);
                if let Some(tracker) = tracker.as_mut() {
                    tracker.sending(&batch);
                }
                if export.send(batch).await.is_err() {
                    tracing::error!(
                        "exporter stage is gone; spans of the remaining events are lost"
                    );
                    return tracker.map(|t| (t, correlation.min_open_lsn()));
                }
            }
        }
        // Settle only once what the tick released is ingested and what it
        // closed is counted as sent (else the watermark could pass records
        // of spans not exported yet).
        if std::mem::take(&mut ticked)
            && let Some(tracker) = tracker.as_mut()
        {
            tracker.settle(correlation.min_open_lsn());
        }
    }
    if let Some(tracker) = tracker {
        // Open state stays open: the queue keeps its records for the next
        // start.
        return Some((tracker, correlation.min_open_lsn()));
    }
    correlation.flush_all(&mut out);
    publish(&correlation, &stats);
    if !out.is_empty() {
        let n = out.len();
        if export
            .send(processed(&mut processor, &mut derived, out))
            .await
            .is_err()
        {
            tracing::error!(
                spans = n,
                "exporter stage is gone; spans closed at shutdown are lost"
            );
        }
    }
    None
}

fn publish(correlation: &Correlation, stats: &PipelineStats) {
    let (sequencer, correlator) = (correlation.sequencer(), correlation.correlator());
    let s = correlator.stats();
    stats.events.store(s.events, Ordering::Relaxed);
    stats.spans.store(s.spans, Ordering::Relaxed);
    stats
        .turns_evicted
        .store(s.turns_evicted, Ordering::Relaxed);
    stats.expired.store(s.expired, Ordering::Relaxed);
    stats
        .turns_cut_off_at_exit
        .store(s.cut_off_at_exit, Ordering::Relaxed);
    let g = correlator.gauges();
    stats.open_turns.store(g.open_turns, Ordering::Relaxed);
    stats.sessions.store(g.sessions, Ordering::Relaxed);
    stats.held_bytes.store(g.held_bytes, Ordering::Relaxed);
    stats.agents.store(g.agents, Ordering::Relaxed);
    // Losses an agent caused: counted, and logged at powers of two.
    for (counter, value, what) in [
        (
            &stats.turns_evicted_for_bytes,
            s.turns_evicted_for_bytes,
            "turns closed as incomplete: an agent held more than correlator.max_bytes_per_agent (or all more than max_bytes)",
        ),
        (
            &stats.sessions_evicted,
            s.sessions_evicted,
            "session records forgotten: an agent held more than correlator.max_sessions_per_agent (or all more than max_sessions)",
        ),
        (
            &stats.late_events_dropped,
            s.late_events_dropped,
            "events of a turn already closed dropped (the turn was exported)",
        ),
        (
            &stats.cross_instance_turns,
            s.cross_instance_turns,
            "turns opened with a turn id another agent process holds (given their own trace id)",
        ),
    ] {
        let before = counter.swap(value, Ordering::Relaxed);
        if value > before && (before == 0 || value.ilog2() > before.ilog2()) {
            tracing::warn!(total = value, "{what}");
        }
    }
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

fn now_unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use hermes_processor::{AttributeSet, MIN_ATTRIBUTE_BYTES, ProcessorConfig};
    use hermes_span::common::v1::{AnyValue, KeyValue, any_value::Value};
    use hermes_span::resource::v1::Resource;
    use hermes_span::trace::v1::Span;
    use prometheus_client::registry::Registry;

    const KEY: &str = "sk-proj-Q3vT9xLmN2bR7kWp4ZsY8aDf";

    fn kv(key: &str, value: Value) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(AnyValue { value: Some(value) }),
        }
    }

    /// A 0.3 s chat of `model` with 1212/17 tokens, a 50 ms call of `tool`,
    /// a 1 s turn.
    fn spans(tool: &str, model: &str) -> Vec<FinishedSpan> {
        let s = |text: &str| Value::StringValue(text.into());
        let resource = Arc::new(Resource::default());
        [
            Span {
                start_time_unix_nano: 0,
                end_time_unix_nano: 300_000_000,
                attributes: vec![
                    kv("gen_ai.operation.name", s("chat")),
                    kv("gen_ai.request.model", s(model)),
                    kv("gen_ai.provider.name", s("custom")),
                    kv("gen_ai.usage.input_tokens", Value::IntValue(1212)),
                    kv("gen_ai.usage.output_tokens", Value::IntValue(17)),
                ],
                ..Default::default()
            },
            Span {
                end_time_unix_nano: 50_000_000,
                attributes: vec![
                    kv("gen_ai.operation.name", s("execute_tool")),
                    kv("gen_ai.tool.name", s(tool)),
                    kv("hermes.tool.status", s("ok")),
                ],
                ..Default::default()
            },
            Span {
                end_time_unix_nano: 1_000_000_000,
                attributes: vec![
                    kv("gen_ai.operation.name", s("invoke_agent")),
                    kv("hermes.turn.api_attempts", Value::IntValue(1)),
                    kv("hermes.turn.completed", Value::BoolValue(true)),
                ],
                ..Default::default()
            },
        ]
        .into_iter()
        .map(|span| FinishedSpan {
            resource: resource.clone(),
            span,
        })
        .collect()
    }

    fn text(metrics: &DerivedMetrics) -> String {
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
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
