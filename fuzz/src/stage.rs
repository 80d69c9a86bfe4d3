//! The `pipeline` target's second pass: the same operations through the
//! collector's correlation stage itself (`hermes_pipeline`'s driver task,
//! its channels, span processing) on tokio's paused clock, so
//! ticks and timeouts pass without waiting. A tick is the clock moving on:
//! the stage's own timer decides when it expires what.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hermes_pipeline::clock::{Clock as _, TokioClock};
use hermes_pipeline::driver::Driver;
use hermes_pipeline::stats::PipelineStats;
use hermes_processor::{ProcessorConfig, SpanProcessor};
use hermes_receiver::{Ingested, check_batch};
use hermes_exporter::Outgoing;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::{
    GAP_TIMEOUT_MS, MAX_HELD, MAX_INSTANCES, MAX_OPEN_TURNS, MS, Op, Step, T0,
    assert_parents_emitted, correlation, limits, step,
};

/// How often the stage's timer runs while anything is open.
const TICK: Duration = Duration::from_secs(1);

pub(crate) fn through_the_stage(ops: &[Op]) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(run(ops));
}

async fn run(ops: &[Op]) {
    let stats = Arc::new(PipelineStats::default());
    let clock = TokioClock::starting_at(T0);
    let driver = Driver {
        tick: TICK,
        stats: stats.clone(),
        ..Driver::in_memory(
            correlation(),
            SpanProcessor::new(&processing()).unwrap(),
            clock,
        )
    };
    // One batch in flight: the stage has taken each before the next step.
    let (ingest, ingest_rx) = mpsc::channel(1);
    let (export, exported) = mpsc::channel(1);
    let stage = tokio::spawn(driver.run(ingest_rx, export, CancellationToken::new()));
    let spans = tokio::spawn(collect(exported));
    let limits = limits();
    let bounded = |stats: &PipelineStats| {
        let held = stats.held_events.load(Ordering::Relaxed);
        assert!(held <= (MAX_HELD * MAX_INSTANCES) as u64, "{held} held");
        let open = stats.open_turns.load(Ordering::Relaxed);
        assert!(open <= MAX_OPEN_TURNS as u64, "{open} open turns");
    };
    for op in ops {
        match step(op, clock.now_unix_nanos()) {
            Step::Batch(received) => {
                if check_batch(&received, &limits).is_ok() && received.shim.is_some() {
                    ingest.send(Ingested::new(received)).await.unwrap();
                }
            }
            Step::Tick(nanos) => tokio::time::sleep(Duration::from_nanos(nanos)).await,
            Step::Nothing => {}
        }
        bounded(&stats);
    }
    // Long enough for every sequencer hole to be skipped, one per timeout.
    let holes = u32::try_from(MAX_HELD + 1).unwrap();
    tokio::time::sleep(Duration::from_nanos(GAP_TIMEOUT_MS * MS) * holes + 2 * TICK).await;
    assert_eq!(
        stats.held_events.load(Ordering::Relaxed),
        0,
        "held after every gap timeout"
    );
    drop(ingest);
    let ended = stage.await.unwrap();
    assert_eq!(ended.open, None);
    assert_eq!(
        stats.open_turns.load(Ordering::Relaxed),
        0,
        "open after the stage ended"
    );
    let (emitted, parents) = spans.await.unwrap();
    assert_parents_emitted(&emitted, &parents);
}

/// The default processing without the value patterns, whose regular
/// expressions take longer to compile than a case takes to run (the
/// `redaction` target fuzzes them).
fn processing() -> ProcessorConfig {
    let mut config = ProcessorConfig::default();
    config.redaction.value_patterns.clear();
    config
}

type Emitted = (HashSet<(Vec<u8>, Vec<u8>)>, Vec<(Vec<u8>, Vec<u8>, String)>);

/// Every exported span's ids, and the parent each child names.
async fn collect(mut exported: mpsc::Receiver<Outgoing>) -> Emitted {
    let mut emitted = HashSet::new();
    let mut parents = Vec::new();
    while let Some(batch) = exported.recv().await {
        for span in batch
            .into_spans()
            .expect("the stage encodes nothing without an encoder")
            .into_iter()
            .flat_map(|rs| rs.scope_spans)
            .flat_map(|ss| ss.spans)
        {
            if !span.parent_span_id.is_empty() {
                parents.push((
                    span.trace_id.to_vec(),
                    span.parent_span_id.to_vec(),
                    span.name.to_string(),
                ));
            }
            emitted.insert((span.trace_id.into(), span.span_id.into()));
        }
    }
    (emitted, parents)
}
