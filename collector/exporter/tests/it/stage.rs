//! The exporter stage with scripted sinks and paused time.

use std::sync::Arc;
use std::time::Duration;

use hermes_exporter::{
    ExportError, ExporterSettings, ExporterStage, ExporterStats, Outgoing, RetrySettings, Sink,
};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::common::*;

fn settings(max_batch_spans: usize, batch_timeout_ms: u64) -> ExporterSettings {
    ExporterSettings {
        max_batch_spans,
        batch_timeout: Duration::from_millis(batch_timeout_ms),
        ..ExporterSettings::default()
    }
}

struct Running {
    tx: mpsc::Sender<Outgoing>,
    shutdown: CancellationToken,
    stats: Arc<ExporterStats>,
    task: tokio::task::JoinHandle<Arc<ExporterStats>>,
}

fn start(sinks: Vec<(&str, ScriptedSink)>, settings: ExporterSettings) -> Running {
    let (tx, rx) = mpsc::channel(64);
    let shutdown = CancellationToken::new();
    let sinks = sinks
        .into_iter()
        .map(|(name, sink)| Sink::new(name, sink))
        .collect();
    let stage = ExporterStage::new(sinks, settings);
    let stats = stage.stats();
    let task = tokio::spawn(stage.run(rx, shutdown.clone()));
    Running {
        tx,
        shutdown,
        stats,
        task,
    }
}

#[test]
fn a_sink_that_reads_the_spans_gets_them_as_they_are() {
    // A sink that does not take encoded batches (as the file, console and
    // trajectory sinks, which read `ExportBatch::request`): the correlation
    // stage must send the spans as they are.
    let stage = ExporterStage::new(
        vec![Sink::new("scripted", ScriptedSink::new(Vec::new()))],
        ExporterSettings::default(),
    );
    assert!(stage.encoder().is_none());
}

fn assert_accounted(stats: &ExporterStats) {
    for sink in stats.sinks() {
        assert_eq!(
            sink.spans_sent() + sink.spans_failed(),
            stats.spans_received(),
            "sink {}",
            sink.name()
        );
    }
}

fn unavailable() -> ExportError {
    ExportError::HttpStatus {
        status: 503,
        retry_after: None,
        message: String::new(),
    }
}

#[tokio::test(start_paused = true)]
async fn batches_by_size_then_by_timeout() {
    let sink = ScriptedSink::new(vec![]);
    let run = start(vec![("s", sink.clone())], settings(3, 200));
    let t0 = Instant::now();
    run.tx.send(ours(leaf_spans(2, 7)).into()).await.unwrap();

    tokio::time::sleep(Duration::from_millis(100)).await;
    let sizes = |sink: &ScriptedSink| -> Vec<usize> {
        sink.requests()
            .iter()
            .map(|r| all_spans(std::slice::from_ref(r)).len())
            .collect()
    };
    assert_eq!(sizes(&sink), vec![3, 3], "full batches go out at once");

    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(sizes(&sink), vec![3, 3, 1], "the rest after batch_timeout");
    let calls = sink.calls.lock().unwrap().clone();
    assert_eq!(calls[2].0 - t0, Duration::from_millis(200));

    drop(run.tx);
    let stats = run.task.await.unwrap();
    assert_eq!(stats.spans_received(), 7);
    assert_eq!(stats.sink("s").unwrap().batches_sent(), 3);
    assert_accounted(&stats);
    assert_eq!(*sink.shutdowns.lock().unwrap(), 1);
}

#[tokio::test(start_paused = true)]
async fn merges_equal_resources_and_scopes() {
    let sink = ScriptedSink::new(vec![]);
    let run = start(vec![("s", sink.clone())], settings(100, 200));
    run.tx.send(ours(leaf_spans(2, 1)).into()).await.unwrap();
    run.tx.send(ours(leaf_spans(3, 2)).into()).await.unwrap();
    drop(run.tx);
    let stats = run.task.await.unwrap();

    let requests = sink.requests();
    assert_eq!(requests.len(), 1);
    let rs = &requests[0].resource_spans;
    assert_eq!(rs.len(), 1);
    assert_eq!(rs[0].scope_spans.len(), 1);
    let ids: Vec<u8> = rs[0].scope_spans[0]
        .spans
        .iter()
        .map(|s| s.span_id[7])
        .collect();
    assert_eq!(ids, vec![2, 3, 4]);
    assert_accounted(&stats);
}

#[tokio::test(start_paused = true)]
async fn shutdown_drains_the_channel() {
    let sink = ScriptedSink::new(vec![]);
    let run = start(vec![("s", sink.clone())], settings(512, 60_000));
    for i in 0..3 {
        run.tx
            .send(ours(leaf_spans(2 + i, 1)).into())
            .await
            .unwrap();
    }
    let t0 = Instant::now();
    run.shutdown.cancel();
    let stats = run.task.await.unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "did not wait for batch_timeout"
    );
    assert_eq!(all_spans(&sink.requests()).len(), 3);
    assert_eq!(stats.sink("s").unwrap().spans_sent(), 3);
    assert_accounted(&stats);
    assert_eq!(*sink.shutdowns.lock().unwrap(), 1);
    // The channel is closed once the stage stops.
    assert!(run.tx.send(ours(leaf_spans(9, 1)).into()).await.is_err());
}

#[tokio::test(start_paused = true)]
async fn drain_deadline_abandons_a_hanging_sink_only() {
    let hanging = ScriptedSink::new(vec![Step::Hang]);
    let healthy = ScriptedSink::new(vec![]);
    let mut s = settings(2, 60_000);
    s.drain_timeout = Duration::from_secs(10);
    let run = start(
        vec![("hanging", hanging.clone()), ("healthy", healthy.clone())],
        s,
    );
    // 5 spans: two full batches now, one partial at shutdown.
    run.tx.send(ours(leaf_spans(2, 5)).into()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;

    let t0 = Instant::now();
    run.shutdown.cancel();
    let stats = run.task.await.unwrap();
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_secs(10) && waited < Duration::from_secs(12),
        "{waited:?}"
    );

    let hanging_stats = stats.sink("hanging").unwrap();
    assert_eq!(hanging_stats.spans_sent(), 0);
    assert_eq!(hanging_stats.spans_failed(), 5);
    assert_eq!(*hanging.shutdowns.lock().unwrap(), 0);
    let healthy_stats = stats.sink("healthy").unwrap();
    assert_eq!(healthy_stats.spans_sent(), 5);
    assert_eq!(all_spans(&healthy.requests()).len(), 5);
    assert_eq!(*healthy.shutdowns.lock().unwrap(), 1);
    assert_accounted(&stats);
    // Live stats and returned stats are the same object.
    assert!(Arc::ptr_eq(&run.stats, &stats));
}

#[tokio::test(start_paused = true)]
async fn throttle_delay_is_honoured() {
    let sink = ScriptedSink::new(vec![Step::Fail(ExportError::HttpStatus {
        status: 429,
        retry_after: Some(Duration::from_secs(2)),
        message: String::new(),
    })]);
    let run = start(vec![("s", sink.clone())], settings(1, 10));
    run.tx.send(ours(leaf_spans(2, 1)).into()).await.unwrap();
    drop(run.tx);
    let stats = run.task.await.unwrap();

    let calls = sink.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1].0 - calls[0].0, Duration::from_secs(2));
    assert_eq!(stats.sink("s").unwrap().spans_sent(), 1);
    assert_eq!(stats.sink("s").unwrap().retries(), 1);
}

#[tokio::test(start_paused = true)]
async fn retries_with_backoff_then_gives_up() {
    let sink = ScriptedSink::new((0..1000).map(|_| Step::Fail(unavailable())).collect());
    let mut s = settings(10, 10);
    s.retry = RetrySettings {
        initial_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_millis(400),
        max_elapsed: Duration::from_secs(2),
    };
    let run = start(vec![("s", sink.clone())], s);
    run.tx.send(ours(leaf_spans(2, 4)).into()).await.unwrap();
    drop(run.tx);
    let stats = run.task.await.unwrap();

    let calls = sink.calls.lock().unwrap().clone();
    let first = calls[0].0;
    let gaps: Vec<Duration> = calls.windows(2).map(|w| w[1].0 - w[0].0).collect();
    // Jittered in [d/2, d] with d = 100, 200, 400, 400, ...
    for (i, gap) in gaps.iter().enumerate() {
        let base = Duration::from_millis(100 << i.min(2));
        assert!(*gap >= base / 2 && *gap <= base, "gap {i}: {gap:?}");
    }
    assert!(calls.last().unwrap().0 - first <= Duration::from_secs(2));
    assert!(calls.len() >= 5, "{} attempts", calls.len());

    let sink_stats = stats.sink("s").unwrap();
    assert_eq!(sink_stats.spans_failed(), 4);
    assert_eq!(sink_stats.batches_failed(), 1);
    assert_eq!(sink_stats.retries(), calls.len() as u64 - 1);
    assert_accounted(&stats);
}

#[tokio::test(start_paused = true)]
async fn non_retryable_errors_are_dropped_at_once() {
    let sink = ScriptedSink::new(vec![Step::Fail(ExportError::HttpStatus {
        status: 400,
        retry_after: None,
        message: "bad".into(),
    })]);
    let run = start(vec![("s", sink.clone())], settings(10, 10));
    run.tx.send(ours(leaf_spans(2, 2)).into()).await.unwrap();
    run.tx.send(ours(leaf_spans(4, 1)).into()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    run.tx.send(ours(leaf_spans(5, 1)).into()).await.unwrap();
    drop(run.tx);
    let stats = run.task.await.unwrap();
    assert_eq!(sink.calls.lock().unwrap().len(), 2);
    let s = stats.sink("s").unwrap();
    assert_eq!((s.spans_failed(), s.spans_sent(), s.retries()), (3, 1, 0));
    assert_accounted(&stats);
}

#[tokio::test(start_paused = true)]
async fn done_through_follows_the_slowest_sink_and_never_counts_abandoned_batches() {
    // "slow" fails retryably twice before accepting; "hanging" never answers.
    let slow = ScriptedSink::new(vec![Step::Fail(unavailable()), Step::Fail(unavailable())]);
    let fast = ScriptedSink::new(vec![]);
    let run = start(
        vec![("slow", slow.clone()), ("fast", fast.clone())],
        settings(2, 100),
    );
    // Message 1: 3 spans (a full batch of 2 + 1 left over); message 2: 1 span.
    run.tx.send(ours(leaf_spans(1, 3)).into()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(run.stats.done_through(), 0, "message 1 is not complete yet");
    run.tx.send(ours(leaf_spans(4, 1)).into()).await.unwrap();
    // Both messages go out; the slow sink needs its retries.
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(run.stats.sink("fast").unwrap().done_through(), 2);
    assert_eq!(run.stats.done_through(), 2);
    drop(run.tx);
    run.task.await.unwrap();

    let hanging = ScriptedSink::new(vec![Step::Hang]);
    let mut s = settings(1, 100);
    s.drain_timeout = Duration::from_secs(1);
    let run = start(vec![("hanging", hanging)], s);
    run.tx.send(ours(leaf_spans(1, 1)).into()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    run.shutdown.cancel();
    let stats = run.task.await.unwrap();
    assert_eq!(
        stats.done_through(),
        0,
        "an abandoned batch is not finished"
    );
}
