//! Stage tests of the correlation driver on tokio's paused clock: the
//! TTL, the turn-end grace, the tick, the stop, and the ledger's watermark
//! as the driver feeds it, each observed at the stage's channels.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hermes_correlator::sequencer::{Sequencer, SequencerConfig};
use hermes_correlator::{Correlation, Correlator};
use hermes_e2e::ingest::{basic_events, basic_open_turn as open_turn, batch_of};
use hermes_exporter::Outgoing;
use hermes_processor::{ProcessorConfig, SpanProcessor};
use hermes_proto::v1::Event;
use hermes_receiver::Ingested;
use hermes_span::common::v1::any_value::Value;
use hermes_span::trace::v1::Span;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::clock::TokioClock;
use crate::derived::samples::text;
use crate::ledger::{Durable, Ledger};
use crate::writer::{QueueStats, Recovered, Settle};
use hermes_sampling::{Rule, SamplingSettings};

const SEC: u64 = 1_000_000_000;
const TTL: Duration = Duration::from_secs(60);
const GRACE: Duration = Duration::from_secs(2);
const TICK: Duration = Duration::from_millis(500);

/// A running stage fed by `ingest`, read at `export`.
struct Stage {
    ingest: mpsc::Sender<Ingested>,
    export: mpsc::Receiver<Outgoing>,
    stop: CancellationToken,
    task: JoinHandle<Ended>,
}

/// Starts the stage with `ledger`; its clock reads the capture time of
/// `events`' last event now, so received and capture times agree.
fn start(ledger: Ledger, events: &[Event]) -> Stage {
    start_sampling(
        ledger,
        events,
        Sampler::keep_all(),
        DerivedMetrics::default(),
        None,
    )
}

/// [`start`] with `sampler`, the derived metrics `derived` and the
/// receiver of session ends `session_ends`.
fn start_sampling(
    ledger: Ledger,
    events: &[Event],
    sampler: Sampler,
    derived: DerivedMetrics,
    session_ends: Option<crate::sinks::SessionEnds>,
) -> Stage {
    let mut driver = driver(ledger, events);
    driver.steps.sampler = sampler;
    driver.steps.derived = derived;
    driver.session_ends = session_ends;
    spawn(driver)
}

/// A stage with `ledger`, not running; its clock reads the capture time
/// of `events`' last event now.
fn driver(ledger: Ledger, events: &[Event]) -> Driver<TokioClock> {
    let last = events.last().map_or(0, |e| e.time_unix_nano);
    let correlation = Correlation::new(
        Sequencer::new(SequencerConfig::default()),
        Correlator::new(hermes_correlator::Config {
            state_ttl_nanos: TTL.as_secs() * SEC,
            turn_end_grace_nanos: GRACE.as_secs() * SEC,
            ..Default::default()
        }),
    );
    Driver {
        tick: TICK,
        ledger,
        ..Driver::in_memory(
            correlation,
            SpanProcessor::new(&ProcessorConfig::default()).unwrap(),
            TokioClock::starting_at(last),
        )
    }
}

/// Runs `driver`.
fn spawn(driver: Driver<TokioClock>) -> Stage {
    let (ingest, ingest_rx) = mpsc::channel(64);
    let (export_tx, export) = mpsc::channel(64);
    let stop = CancellationToken::new();
    let task = tokio::spawn(driver.run(ingest_rx, export_tx, stop.clone()));
    Stage {
        ingest,
        export,
        stop,
        task,
    }
}

/// `events` of agent `instance` as the receiver hands them on.
fn ingested(instance: &str, events: Vec<Event>) -> Ingested {
    Ingested::new(hermes_proto::wire::WireBatch::encode(&batch_of(instance, events)).unwrap())
}

/// Sends each event as a batch of its own at lsn 1, 2, 3, ...
async fn feed(stage: &Stage, events: Vec<Event>) {
    for (lsn, event) in (1..).zip(events) {
        let mut ingested = ingested("agent-1", vec![event]);
        ingested.lsn = lsn;
        stage.ingest.send(ingested).await.unwrap();
    }
}

fn incomplete(span: &Span) -> bool {
    span.attributes.iter().any(|kv| {
        kv.key == "hermes.incomplete"
            && kv.value.as_ref().and_then(|v| v.value.as_ref()) == Some(&Value::BoolValue(true))
    })
}

/// Every span the stage exports within `within` (of paused time).
async fn exported_within(export: &mut mpsc::Receiver<Outgoing>, within: Duration) -> Vec<Span> {
    let until = tokio::time::Instant::now() + within;
    let mut spans = Vec::new();
    while let Ok(Some(batch)) = tokio::time::timeout_at(until, export.recv()).await {
        spans.extend(spans_of(batch));
    }
    spans
}

/// The spans of what the stage sent (without an encoder: as they are).
fn spans_of(batch: Outgoing) -> impl Iterator<Item = Span> {
    batch
        .into_spans()
        .expect("the stage encodes nothing without an encoder")
        .into_iter()
        .flat_map(|rs| rs.scope_spans)
        .flat_map(|ss| ss.spans)
}

/// The one turn among `spans`, exported because `why`.
fn one_root<'a>(spans: &'a [Span], why: &str) -> &'a Span {
    let found = roots(spans);
    assert_eq!(found.len(), 1, "{why}: {spans:?}");
    found[0]
}

fn roots(spans: &[Span]) -> Vec<&Span> {
    spans
        .iter()
        .filter(|s| s.parent_span_id.is_empty())
        .collect()
}

/// A persistent queue's ledger with room for 1 GiB, the exporter stage's
/// finished messages read from `done`, what the queue recovered at the
/// start; and the settles it hands to the writer.
fn disk_ledger(done: Arc<AtomicU64>, recovered: Recovered) -> (Ledger, mpsc::Receiver<Settle>) {
    let (settle, settles) = mpsc::channel(16);
    let queue = Arc::new(QueueStats::default());
    queue.capacity_bytes.store(1 << 30, Ordering::Relaxed);
    let ledger = Ledger::disk(Durable {
        settle,
        done: Box::new(move || done.load(Ordering::Relaxed)),
        recovered,
        queue,
    });
    (ledger, settles)
}

/// The lowest lsn the basic turn needs while open, as [`feed`] numbers:
/// its session's start, an event of the turn's span.
fn turn_lsn() -> u64 {
    1 + basic_events()
        .iter()
        .position(|e| e.hook == "on_session_start")
        .unwrap() as u64
}

#[tokio::test(start_paused = true)]
async fn an_open_turn_closes_at_its_ttl_as_incomplete() {
    let events = open_turn();
    let mut stage = start(Ledger::Memory, &events);
    feed(&stage, events).await;
    let before = exported_within(&mut stage.export, TTL - Duration::from_secs(1)).await;
    assert!(
        roots(&before).is_empty(),
        "a turn whose agent is only quiet must stay open until its TTL: {before:?}"
    );
    let after = exported_within(&mut stage.export, Duration::from_secs(2)).await;
    assert!(incomplete(one_root(&after, "the TTL closes the turn")));
}

#[tokio::test(start_paused = true)]
async fn an_ended_turn_is_exported_after_the_end_grace_not_before() {
    // Up to the turn's end; the session's end would close it at once.
    let mut events = basic_events();
    let end = events
        .iter()
        .position(|e| e.hook == "post_llm_call")
        .unwrap();
    events.truncate(end + 1);
    let mut stage = start(Ledger::Memory, &events);
    feed(&stage, events).await;
    let before = exported_within(&mut stage.export, GRACE - TICK).await;
    assert!(
        roots(&before).is_empty(),
        "late events of an ended turn may still come within the grace"
    );
    let after = exported_within(&mut stage.export, 3 * TICK).await;
    assert!(!incomplete(one_root(
        &after,
        "exported once the grace has passed"
    )));
    assert!(before.iter().chain(&after).all(|s| !incomplete(s)));
}

#[tokio::test(start_paused = true)]
async fn a_stop_closes_open_turns_in_memory() {
    let events = open_turn();
    let mut stage = start(Ledger::Memory, &events);
    feed(&stage, events).await;
    // Taken in, long before the TTL.
    tokio::time::sleep(TICK).await;
    stage.stop.cancel();
    let ended = stage.task.await.unwrap();
    assert_eq!(ended.open, None);
    let spans = exported_within(&mut stage.export, Duration::from_secs(1)).await;
    assert!(incomplete(one_root(&spans, "closed at the stop")));
}

#[tokio::test(start_paused = true)]
async fn with_the_persistent_queue_a_stop_leaves_open_turns_to_the_next_start() {
    let events = open_turn();
    let (ledger, mut settles) = disk_ledger(Arc::new(AtomicU64::new(0)), Recovered::default());
    let mut stage = start(ledger, &events);
    feed(&stage, events).await;
    // Taken in, long before the TTL.
    tokio::time::sleep(TICK).await;
    stage.stop.cancel();
    let Ended { ledger, open } = stage.task.await.unwrap();
    assert_eq!(open, Some(turn_lsn()), "the open turn needs its records");
    let spans = exported_within(&mut stage.export, Duration::from_secs(1)).await;
    assert!(roots(&spans).is_empty(), "the turn stays open: {spans:?}");
    ledger.finish(open).await;
    while let Ok(settle) = settles.try_recv() {
        assert!(
            settle.below <= turn_lsn(),
            "a settle must keep the open turn's records"
        );
        assert!(settle.exported.is_empty());
    }
}

#[tokio::test(start_paused = true)]
async fn the_watermark_passes_a_turn_once_the_exporters_are_done_with_it() {
    let events = basic_events();
    let n = events.len() as u64;
    let done = Arc::new(AtomicU64::new(0));
    let (ledger, mut settles) = disk_ledger(done.clone(), Recovered::default());
    let mut stage = start(ledger, &events);
    feed(&stage, events).await;
    let spans = exported_within(&mut stage.export, GRACE + 2 * TICK).await;
    assert_eq!(
        roots(&spans).len(),
        1,
        "exported after the grace: {spans:?}"
    );
    let keys: Vec<u8> = spans.iter().flat_map(crate::ledger::key_of).collect();
    // Not done at the exporters: no settle may pass the turn's records.
    tokio::time::sleep(4 * TICK).await;
    while let Ok(settle) = settles.try_recv() {
        assert!(
            settle.below <= turn_lsn(),
            "settled past unexported spans: {settle:?}"
        );
        assert!(settle.exported.is_empty());
    }
    // Done: the next tick hands the markers and the watermark over.
    done.store(u64::MAX, Ordering::Relaxed);
    let settle = tokio::time::timeout(2 * TICK, settles.recv())
        .await
        .expect("settled at the next tick")
        .unwrap();
    assert_eq!(settle.below, n + 1, "every record may go");
    let marked: Vec<u8> = settle
        .exported
        .iter()
        .flat_map(|(_, k)| k.clone())
        .collect();
    assert_eq!(marked, keys, "every exported span is marked");
    // Everything settled: the stage stops ticking (no further settle).
    assert!(
        tokio::time::timeout(Duration::from_secs(30), settles.recv())
            .await
            .is_err()
    );
    drop(stage.ingest);
    let ended = stage.task.await.unwrap();
    assert_eq!(ended.open, None);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_turn_is_counted_exports_nothing_and_frees_its_records() {
    let events = basic_events();
    let n = events.len() as u64;
    let (ledger, mut settles) = disk_ledger(Arc::new(AtomicU64::new(0)), Recovered::default());
    let derived = DerivedMetrics::default();
    let errors_only = Sampler::new(SamplingSettings {
        policies: vec![Policy {
            name: "errors".into(),
            rule: Rule::StatusCode,
        }],
        ..Default::default()
    });
    let sampling = errors_only.stats();
    let mut stage = start_sampling(ledger, &events, errors_only, derived.clone(), None);
    feed(&stage, events).await;
    let spans = exported_within(&mut stage.export, GRACE + 4 * TICK).await;
    assert!(spans.is_empty(), "a clean turn is dropped whole: {spans:?}");
    assert_eq!(sampling.turns_dropped.load(Ordering::Relaxed), 1);
    assert!(
        text(&derived).contains("hermes_turn_duration_seconds_count{"),
        "the derived metrics count the dropped turn:\n{}",
        text(&derived)
    );
    // Nothing was sent, so nothing waits at the exporters: the watermark
    // passes every record of the dropped turn.
    let mut below = 0;
    while let Ok(settle) = settles.try_recv() {
        assert!(settle.exported.is_empty());
        below = below.max(settle.below);
    }
    assert_eq!(below, n + 1, "the dropped turn's records may go");
    drop(stage.ingest);
    assert_eq!(stage.task.await.unwrap().open, None);
}

#[tokio::test(start_paused = true)]
async fn a_finalized_session_is_reported_after_its_spans_were_sent() {
    let events = basic_events();
    let session = events
        .iter()
        .find(|e| e.hook == "on_session_finalize")
        .and_then(|e| e.ids.as_ref())
        .map(|ids| ids.session_id.clone())
        .unwrap();
    let (ends_tx, mut ends) = mpsc::channel(4);
    let mut stage = start_sampling(
        Ledger::Memory,
        &events,
        Sampler::keep_all(),
        DerivedMetrics::default(),
        Some(crate::sinks::SessionEnds::new(ends_tx, Default::default())),
    );
    feed(&stage, events).await;
    let end = ends.recv().await.unwrap();
    assert_eq!(end.session_id, session);
    assert_eq!(end.instance_id, "agent-1");
    // The turn the finalize closed was already in the export channel.
    let mut sent = Vec::new();
    while let Ok(batch) = stage.export.try_recv() {
        sent.extend(spans_of(batch));
    }
    one_root(&sent, "sent before the end was reported");
}

#[path = "fleet_tests.rs"]
mod fleet;
