//! The exporter stage: batch, fan out to every sink, retry, drain.
//!
//! This module owns the async task that sits at the end of the pipeline
//! ([`ExporterStage::run`], or the [`run`] shorthand) and its counters
//! ([`ExporterStats`]).
//!
//! ```text
//! rx ──► batcher ──► queue(sink 0) ──► worker 0: export ⟲ retry ──► sink 0
//!   (size | timeout) └► queue(sink 1) ──► worker 1: export ⟲ retry ──► sink 1
//! ```
//!
//! * **Batching**: spans are merged by resource and scope into batches of at
//!   most `max_batch_spans`; a batch is sent when full or `batch_timeout`
//!   after its first span arrived.
//! * **Fan-out**: each sink has its own worker task and a bounded queue of
//!   `sink_queue_batches` batches (shared via `Arc`, never copied). A worker
//!   exports one batch at a time, so at most one export per sink is in
//!   flight. When a queue is full the stage waits (backpressure reaches the
//!   upstream channel); it never drops to make room.
//! * **Retry**: retryable failures are retried with jittered exponential
//!   backoff ([`crate::retry`]), honouring server throttle delays, until
//!   `retry.max_elapsed`; then, or on a non-retryable error, the batch is
//!   dropped for that sink, counted, and logged at ERROR.
//! * **Shutdown**: when `shutdown` is cancelled or the channel closes, the
//!   stage closes the channel, drains what it holds, flushes the last partial
//!   batch, lets the workers finish (console flushes buffered traces) and
//!   returns, all within `drain_timeout` of the shutdown start. At the
//!   deadline in-flight exports and retries are abandoned and whatever was
//!   not exported is counted as failed and logged at ERROR.
//!
//! Accounting invariant: when `run` returns, for every sink
//! `spans_sent + spans_failed == spans_received` (unless a worker panicked,
//! which is logged).
//!
//! Completion: the stage numbers its input messages 1, 2, 3, ... and
//! [`ExporterStats::done_through`] tells the highest `n` such that every
//! span of messages `1..=n` is finished at every sink: exported, or dropped
//! for good (non-retryable, retries exhausted). A batch abandoned at the
//! shutdown deadline is not finished. Batches keep message order and each
//! worker exports one at a time, so one number per sink suffices. The
//! persistent queue deletes records only up to what is finished.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::batch::{Batcher, Encoder, Outgoing};
use crate::error::ExportError;
use crate::retry::{Attempts, RetrySettings};
use crate::sink::{ExportBatch, ExportOutcome, Sink};

/// Settings of the exporter stage, filled by the binary from its config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExporterSettings {
    /// Most spans in one exported batch.
    pub max_batch_spans: usize,
    /// Most encoded bytes in one exported batch (approximately); keep it
    /// under the backend's message limit (4 MiB for most OTLP/gRPC servers).
    pub max_batch_bytes: usize,
    /// Longest time a span waits in a partial batch.
    pub batch_timeout: Duration,
    /// Retry policy of failed exports.
    pub retry: RetrySettings,
    /// Time allowed, from the shutdown signal, to export what is left.
    /// Keep it shorter than the process' termination grace period.
    pub drain_timeout: Duration,
    /// Batches queued per sink while its worker exports; when full the stage
    /// waits.
    pub sink_queue_batches: usize,
}

impl Default for ExporterSettings {
    fn default() -> Self {
        Self {
            // A request has a fixed cost (the HTTP/2 stream, the response,
            // the deflate stream's end, a wake of the sink's worker): at 512
            // it was a visible share of the CPU per span. `max_batch_bytes`
            // still bounds the request; the timeout bounds the wait.
            max_batch_spans: 2048,
            max_batch_bytes: 3 * 1024 * 1024,
            batch_timeout: Duration::from_millis(200),
            retry: RetrySettings::default(),
            drain_timeout: Duration::from_secs(10),
            sink_queue_batches: 2,
        }
    }
}

/// Counters of one sink. Labels: the sink name only.
#[derive(Debug)]
pub struct SinkStats {
    name: String,
    spans_sent: AtomicU64,
    spans_failed: AtomicU64,
    batches_sent: AtomicU64,
    batches_failed: AtomicU64,
    retries: AtomicU64,
    /// Input messages `1..=n` are finished at this sink.
    done_through: AtomicU64,
    /// The last batch the sink finished was dropped.
    failing: AtomicBool,
}

impl SinkStats {
    fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            spans_sent: AtomicU64::new(0),
            spans_failed: AtomicU64::new(0),
            batches_sent: AtomicU64::new(0),
            batches_failed: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            done_through: AtomicU64::new(0),
            failing: AtomicBool::new(false),
        }
    }

    /// The sink's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Spans the sink accepted.
    pub fn spans_sent(&self) -> u64 {
        self.spans_sent.load(Ordering::Relaxed)
    }
    /// Spans dropped for this sink (non-retryable error, retries exhausted,
    /// rejected by the receiver, or abandoned at the shutdown deadline).
    pub fn spans_failed(&self) -> u64 {
        self.spans_failed.load(Ordering::Relaxed)
    }
    /// Batches the sink accepted (possibly partially).
    pub fn batches_sent(&self) -> u64 {
        self.batches_sent.load(Ordering::Relaxed)
    }
    /// Batches dropped for this sink.
    pub fn batches_failed(&self) -> u64 {
        self.batches_failed.load(Ordering::Relaxed)
    }
    /// Retry attempts made (not counting first attempts).
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }
    /// Input messages `1..=n` are finished at this sink.
    pub fn done_through(&self) -> u64 {
        self.done_through.load(Ordering::Acquire)
    }
    /// Whether the last batch the sink finished was dropped (its error
    /// logged); false again once a batch goes through.
    pub fn failing(&self) -> bool {
        self.failing.load(Ordering::Relaxed)
    }

    fn record_failed(&self, spans: u64) {
        self.spans_failed.fetch_add(spans, Ordering::Relaxed);
        self.batches_failed.fetch_add(1, Ordering::Relaxed);
    }
}

/// Counters of the stage, shared with whoever reports them (metrics, admin).
#[derive(Debug)]
pub struct ExporterStats {
    spans_received: AtomicU64,
    messages_received: AtomicU64,
    sinks: Vec<SinkStats>,
}

impl ExporterStats {
    fn new(sinks: &[Sink]) -> Self {
        Self {
            spans_received: AtomicU64::new(0),
            messages_received: AtomicU64::new(0),
            sinks: sinks.iter().map(|s| SinkStats::new(s.name())).collect(),
        }
    }

    /// Every span of input messages `1..=n` is finished at every sink (see
    /// the module docs).
    pub fn done_through(&self) -> u64 {
        self.sinks
            .iter()
            .map(|s| s.done_through.load(Ordering::Acquire))
            .min()
            .unwrap_or_else(|| self.messages_received.load(Ordering::Acquire))
    }

    /// Spans taken from the input channel.
    pub fn spans_received(&self) -> u64 {
        self.spans_received.load(Ordering::Relaxed)
    }
    /// Per-sink counters, in the order the sinks were given.
    pub fn sinks(&self) -> &[SinkStats] {
        &self.sinks
    }
    /// The counters of the sink named `name`.
    pub fn sink(&self, name: &str) -> Option<&SinkStats> {
        self.sinks.iter().find(|s| s.name == name)
    }
}

/// Runs the stage until shutdown and drain complete; see the module docs.
/// Shorthand for `ExporterStage::new(sinks, settings).run(rx, shutdown)`.
pub async fn run(
    rx: mpsc::Receiver<Outgoing>,
    sinks: Vec<Sink>,
    settings: ExporterSettings,
    shutdown: CancellationToken,
) -> Arc<ExporterStats> {
    ExporterStage::new(sinks, settings).run(rx, shutdown).await
}

/// The exporter stage, built before it runs so its stats can be shared.
#[derive(Debug)]
pub struct ExporterStage {
    sinks: Vec<Sink>,
    settings: ExporterSettings,
    stats: Arc<ExporterStats>,
    deadline: DrainDeadline,
}

/// A deadline for the drain set from outside, once: the process' own
/// shutdown deadline. The drain then ends at the earlier of it and
/// `drain_timeout` after the drain started, so what the stage could not
/// export is counted before the process gives up on it.
#[derive(Debug, Clone, Default)]
pub struct DrainDeadline(Arc<std::sync::OnceLock<Instant>>);

impl DrainDeadline {
    /// Sets the deadline; only the first call counts.
    pub fn set(&self, at: Instant) {
        let _ = self.0.set(at);
    }

    /// The drain's deadline if it starts now.
    fn starting_now(&self, drain_timeout: Duration) -> Instant {
        let own = Instant::now() + drain_timeout;
        self.0.get().map_or(own, |&set| set.min(own))
    }
}

impl ExporterStage {
    /// Prepares the stage; nothing runs until [`ExporterStage::run`].
    pub fn new(sinks: Vec<Sink>, settings: ExporterSettings) -> Self {
        let stats = Arc::new(ExporterStats::new(&sinks));
        Self {
            sinks,
            settings,
            stats,
            deadline: DrainDeadline::default(),
        }
    }

    /// A handle to end the drain no later than a deadline of the caller's.
    pub fn drain_deadline(&self) -> DrainDeadline {
        self.deadline.clone()
    }

    /// The encoder the correlation stage runs when every sink takes
    /// encoded batches ([`SpanExporter::takes_encoded`]), within this
    /// stage's batch limits; `None` when a sink reads the spans.
    pub fn encoder(&self) -> Option<Encoder> {
        self.sinks
            .iter()
            .all(Sink::takes_encoded)
            .then(|| Encoder::new(self.settings.max_batch_spans, self.settings.max_batch_bytes))
    }

    /// The stage's counters (live while it runs).
    pub fn stats(&self) -> Arc<ExporterStats> {
        Arc::clone(&self.stats)
    }

    /// Batches spans from `rx` and exports them to every sink until
    /// `shutdown` is cancelled or `rx` is closed, then drains within
    /// `drain_timeout` and returns the final counters. Must run on a tokio
    /// runtime with the time driver enabled.
    pub async fn run(
        self,
        mut rx: mpsc::Receiver<Outgoing>,
        shutdown: CancellationToken,
    ) -> Arc<ExporterStats> {
        let Self {
            sinks,
            settings,
            stats,
            deadline: outer_deadline,
        } = self;
        let abort = CancellationToken::new();
        let mut workers = JoinSet::new();
        let mut queues = Vec::with_capacity(sinks.len());
        for (index, sink) in sinks.into_iter().enumerate() {
            let (tx, queue) = mpsc::channel(settings.sink_queue_batches.max(1));
            let worker = SinkWorker {
                sink,
                index,
                stats: Arc::clone(&stats),
                retry: settings.retry,
                abort: abort.clone(),
                queue,
            };
            workers.spawn(worker.run());
            queues.push(tx);
        }
        let mut dispatcher = Dispatcher {
            queues,
            stats: Arc::clone(&stats),
            shutdown: shutdown.clone(),
            drain_timeout: settings.drain_timeout,
            outer_deadline,
            drain_deadline: None,
        };
        let mut batcher = Batcher::new(settings.max_batch_spans, settings.max_batch_bytes);
        let mut batch_deadline: Option<Instant> = None;

        // Normal operation.
        loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                () = sleep_until_opt(batch_deadline), if batch_deadline.is_some() => {
                    batch_deadline = None;
                    if let Some(batch) = batcher.take() {
                        let through = stats.messages_received.load(Ordering::Relaxed);
                        dispatcher.dispatch(batch, through).await;
                    }
                }
                message = rx.recv() => {
                    let Some(message) = message else { break };
                    let was_empty = batcher.is_empty();
                    let flushed = receive(&stats, &mut batcher, &mut dispatcher, message).await;
                    if batcher.is_empty() {
                        batch_deadline = None;
                    } else if was_empty || flushed {
                        batch_deadline = Some(Instant::now() + settings.batch_timeout);
                    }
                }
            }
        }

        // Drain: everything already in the channel, within the deadline.
        let deadline = dispatcher.start_drain();
        tracing::debug!(drain_timeout = ?settings.drain_timeout, "exporter stage draining");
        rx.close();
        // Ends when the channel is empty and closed, or at the deadline.
        while let Ok(Some(message)) = tokio::time::timeout_at(deadline, rx.recv()).await {
            receive(&stats, &mut batcher, &mut dispatcher, message).await;
        }
        if let Some(batch) = batcher.take() {
            let through = stats.messages_received.load(Ordering::Relaxed);
            dispatcher.dispatch(batch, through).await;
        }
        let mut left = 0u64;
        while let Ok(message) = rx.try_recv() {
            left += message.span_count();
        }
        if left > 0 {
            stats.spans_received.fetch_add(left, Ordering::Relaxed);
            for sink in &stats.sinks {
                sink.record_failed(left);
            }
            tracing::error!(
                spans = left,
                "exporter drain deadline reached; dropping spans still in the channel"
            );
        }
        drop(dispatcher);

        // Let the workers finish what is queued, then abandon the rest.
        let finished = tokio::time::timeout_at(deadline, join_all(&mut workers)).await;
        if finished.is_err() {
            abort.cancel();
            // Aborted workers only count what they drop; give them a moment.
            if tokio::time::timeout(Duration::from_secs(1), join_all(&mut workers))
                .await
                .is_err()
            {
                tracing::error!("exporter sink workers did not stop; aborting them");
                workers.abort_all();
                join_all(&mut workers).await;
            }
        }
        tracing::debug!(
            spans_received = stats.spans_received(),
            "exporter stage stopped"
        );
        stats
    }
}

/// Counts and batches one message, dispatching full batches. Returns true
/// when at least one batch was dispatched.
async fn receive(
    stats: &ExporterStats,
    batcher: &mut Batcher,
    dispatcher: &mut Dispatcher,
    message: Outgoing,
) -> bool {
    let count = message.span_count();
    stats.spans_received.fetch_add(count, Ordering::Relaxed);
    let n = stats.messages_received.fetch_add(1, Ordering::Relaxed) + 1;
    let full = match message {
        Outgoing::Spans(spans) => batcher.push(spans),
        Outgoing::Encoded(requests) => batcher.push_encoded(requests),
    };
    let flushed = !full.is_empty();
    // Every batch returned finishes message n-1 (the older spans go first);
    // the last one finishes message n too when nothing of it is left over.
    let last = full.len();
    let rest_empty = batcher.is_empty();
    for (i, batch) in full.into_iter().enumerate() {
        let through = if i + 1 == last && rest_empty {
            n
        } else {
            n - 1
        };
        dispatcher.dispatch(batch, through).await;
    }
    flushed
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

async fn join_all(workers: &mut JoinSet<()>) {
    while let Some(result) = workers.join_next().await {
        if let Err(e) = result
            && e.is_panic()
        {
            tracing::error!(error = %e, "exporter sink worker panicked; its counts are incomplete");
        }
    }
}

/// A batch on its way to one sink, with the input messages it finishes.
struct Queued {
    batch: Arc<ExportBatch>,
    through: u64,
}

/// Hands batches to the sink queues.
struct Dispatcher {
    queues: Vec<mpsc::Sender<Queued>>,
    stats: Arc<ExporterStats>,
    shutdown: CancellationToken,
    drain_timeout: Duration,
    outer_deadline: DrainDeadline,
    drain_deadline: Option<Instant>,
}

impl Dispatcher {
    /// Starts the drain clock (once) and returns its deadline.
    fn start_drain(&mut self) -> Instant {
        *self
            .drain_deadline
            .get_or_insert_with(|| self.outer_deadline.starting_now(self.drain_timeout))
    }

    async fn dispatch(&mut self, batch: ExportBatch, through: u64) {
        let batch = Arc::new(batch);
        let spans = batch.span_count();
        for index in 0..self.queues.len() {
            if let Some(permit) = self.reserve(index).await {
                permit.send(Queued {
                    batch: Arc::clone(&batch),
                    through,
                });
                continue;
            }
            if let Some(sink) = self.stats.sinks.get(index) {
                sink.record_failed(spans);
                tracing::error!(
                    sink = %sink.name,
                    spans,
                    "exporter sink queue unavailable before the drain deadline; dropping batch"
                );
            }
        }
    }

    /// Waits for room in queue `index`: unbounded while running, until the
    /// drain deadline once shutdown started. `None` when the deadline passed
    /// or the worker is gone.
    async fn reserve(&mut self, index: usize) -> Option<mpsc::Permit<'_, Queued>> {
        if self.drain_deadline.is_none() {
            let queue = self.queues.get(index)?;
            let reserved = tokio::select! {
                biased;
                permit = queue.reserve() => Some(permit),
                () = self.shutdown.cancelled() => None,
            };
            if let Some(permit) = reserved {
                return permit.ok();
            }
            // Not `self.start_drain()`: `self.queues` is still borrowed.
            self.drain_deadline = Some(self.outer_deadline.starting_now(self.drain_timeout));
        }
        let deadline = self.drain_deadline?;
        let queue = self.queues.get(index)?;
        tokio::time::timeout_at(deadline, queue.reserve())
            .await
            .ok()?
            .ok()
    }
}

/// Exports the batches of one sink, one at a time.
struct SinkWorker {
    sink: Sink,
    index: usize,
    stats: Arc<ExporterStats>,
    retry: RetrySettings,
    abort: CancellationToken,
    queue: mpsc::Receiver<Queued>,
}

enum Failure {
    Error(ExportError),
    Aborted,
}

impl SinkWorker {
    fn stats(&self) -> Option<&SinkStats> {
        self.stats.sinks.get(self.index)
    }

    async fn run(mut self) {
        loop {
            let next = tokio::select! {
                biased;
                () = self.abort.cancelled() => None,
                batch = self.queue.recv() => match batch {
                    Some(batch) => Some(batch),
                    None => {
                        self.shutdown_sink().await;
                        return;
                    }
                },
            };
            let Some(batch) = next else { break };
            self.export(batch).await;
        }
        // Aborted at the drain deadline: count what is still queued.
        self.queue.close();
        let mut spans = 0;
        let mut batches = 0;
        while let Ok(queued) = self.queue.try_recv() {
            spans += queued.batch.span_count();
            batches += 1;
        }
        if let Some(stats) = self.stats()
            && batches > 0
        {
            stats.spans_failed.fetch_add(spans, Ordering::Relaxed);
            stats.batches_failed.fetch_add(batches, Ordering::Relaxed);
            tracing::error!(
                sink = %stats.name,
                spans,
                batches,
                "exporter drain deadline reached; dropping queued batches"
            );
        }
    }

    async fn export(&mut self, Queued { batch, through }: Queued) {
        let spans = batch.span_count();
        let result = self.export_with_retry(batch).await;
        let Some(stats) = self.stats() else { return };
        if !matches!(result, Err(Failure::Aborted)) {
            stats.done_through.fetch_max(through, Ordering::Release);
        }
        match result {
            Ok(ExportOutcome { rejected_spans }) => {
                stats.failing.store(false, Ordering::Relaxed);
                let rejected = rejected_spans.min(spans);
                stats
                    .spans_sent
                    .fetch_add(spans - rejected, Ordering::Relaxed);
                stats.batches_sent.fetch_add(1, Ordering::Relaxed);
                if rejected > 0 {
                    stats.spans_failed.fetch_add(rejected, Ordering::Relaxed);
                    tracing::error!(
                        sink = %stats.name,
                        spans = rejected,
                        "receiver rejected spans (partial success); dropping them"
                    );
                } else {
                    tracing::debug!(sink = %stats.name, spans, "exported batch");
                }
            }
            Err(Failure::Error(error)) => {
                stats.failing.store(true, Ordering::Relaxed);
                stats.record_failed(spans);
                tracing::error!(
                    sink = %stats.name,
                    spans,
                    error = %error,
                    retry_class = ?error.retry_class(),
                    "export failed; dropping batch"
                );
            }
            Err(Failure::Aborted) => {
                stats.record_failed(spans);
                tracing::error!(
                    sink = %stats.name,
                    spans,
                    "exporter drain deadline reached during export; dropping batch"
                );
            }
        }
    }

    async fn export_with_retry(
        &mut self,
        batch: Arc<ExportBatch>,
    ) -> Result<ExportOutcome, Failure> {
        let mut attempts = Attempts::new(&self.retry);
        let mut attempt: u32 = 1;
        loop {
            let result = tokio::select! {
                biased;
                () = self.abort.cancelled() => return Err(Failure::Aborted),
                result = self.sink.exporter_mut().export(Arc::clone(&batch)) => result,
            };
            let error = match result {
                Ok(outcome) => return Ok(outcome),
                Err(error) => error,
            };
            let Some(delay) = attempts.after(&error) else {
                return Err(Failure::Error(error));
            };
            let name = self.sink.name();
            if attempt == 1 {
                tracing::warn!(sink = %name, error = %error, ?delay, "export failed; retrying");
            } else {
                tracing::debug!(sink = %name, error = %error, ?delay, attempt, "export failed again; retrying");
            }
            tokio::select! {
                biased;
                () = self.abort.cancelled() => return Err(Failure::Aborted),
                () = tokio::time::sleep(delay) => {}
            }
            attempt = attempt.saturating_add(1);
            if let Some(stats) = self.stats() {
                stats.retries.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Clean end: let buffering exporters flush, bounded by the abort token.
    async fn shutdown_sink(&mut self) {
        let result = tokio::select! {
            biased;
            () = self.abort.cancelled() => return,
            result = self.sink.exporter_mut().shutdown() => result,
        };
        if let Err(error) = result {
            tracing::warn!(sink = %self.sink.name(), error = %error, "exporter shutdown failed");
        }
    }
}
