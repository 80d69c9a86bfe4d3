//! The admin server: the collector's own health and metrics over HTTP/1.
//!
//! | path | answer |
//! |---|---|
//! | `GET /metrics` | Prometheus text exposition (0.0.4; OpenMetrics when the `Accept` header asks for it); with `admin.metrics_auth`, `401` without `Authorization: Bearer <token>` |
//! | `GET /livez` | `200` while the process runs; `503` (`not live: the <stage> stage stopped`) once a stage ended on its own, until the process exits |
//! | `GET /readyz` | `200` (`ready`) once the ingest listener is bound and the exporter stage runs with its queue open; `503` (`not ready: <why>`) before that, when the ingest stopped or the exporter queue closed, and from the start of the drain |
//! | any other path | `404`; a known path with a method other than `GET`/`HEAD`: `405` |
//!
//! Invariants:
//! - No double bookkeeping: the metrics are read from the stages' own atomics
//!   ([`ReceiverStats`], [`PipelineStats`], [`ExporterStats`]) and the
//!   channels' capacities at scrape time, by one [`Collector`].
//! - Bounded labels: only the exporter (sink) name and the queue name, both
//!   fixed by the configuration; never a session, shim, connection or trace.
//!   The metrics derived from the spans carry agents' values (tool names,
//!   models), redacted and bounded in length and number (`series.rs`).
//! - Bounded request handling: request bodies are never read, request heads
//!   are capped in size and in time, at most [`MAX_CONNECTIONS`] connections
//!   are served at once (more are closed at once) and each lives at most
//!   [`CONNECTION_LIFETIME`].
//! - Probing a queue never keeps it open: the probes hold weak senders, so the
//!   channel still closes when its stage drops the last real sender.

use std::convert::Infallible;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use bytes::Bytes;
use hermes_exporter::ExporterStats;
use hermes_receiver::{BearerToken, ReceiverStats};
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::derived::DerivedMetrics;
use crate::persist::QueueStats;
use crate::pipeline::PipelineStats;

/// Prefix of every metric name.
pub const METRIC_PREFIX: &str = "hermes_collector";
/// Most connections served at once; further ones are closed on accept.
pub const MAX_CONNECTIONS: usize = 32;
/// Longest wait for a request head.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest life of one (keep-alive) connection; it is then closed gracefully.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);
/// Largest request head buffered.
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Longest wait, at shutdown, for connections to finish their response.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(1);

const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Whether the collector should receive traffic. The binary sets each flag
/// as its stages come up and when the drain starts; `/readyz` reads them.
///
/// Ready means: the ingest listener is bound and serving, the exporter stage
/// runs, its queue (the channel from the correlator) is usable, and no drain
/// has started. Through a drain after a signal the process stays live
/// (`/livez` 200) but
/// not ready, so load balancers and Kubernetes stop sending new agents
/// while the acknowledged events are exported.
#[derive(Default)]
pub struct Readiness {
    receiver_bound: AtomicBool,
    exporter_running: AtomicBool,
    draining: AtomicBool,
    /// The stage that ended on its own, if one did: the process is no
    /// longer live (`/livez` 503) while it drains and exits.
    failed_stage: std::sync::OnceLock<&'static str>,
    /// Further conditions, read on each probe.
    requirements: RwLock<Vec<Requirement>>,
}

/// A readiness condition: what `/readyz` says when it fails, and the check.
type Requirement = (&'static str, Box<dyn Fn() -> bool + Send + Sync>);

impl Readiness {
    /// The ingest listener is bound (call after `TcpListener::bind`), or
    /// stopped serving (`false`).
    pub fn set_receiver_bound(&self, bound: bool) {
        self.receiver_bound.store(bound, Ordering::Release);
    }
    /// The exporter stage task runs (call after spawning it).
    pub fn set_exporter_running(&self, running: bool) {
        self.exporter_running.store(running, Ordering::Release);
    }
    /// The drain started (call on SIGTERM/SIGINT, before cancelling the
    /// receiver). Not ready from then on, whatever the other flags say.
    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }
    /// `stage` ended on its own: `/livez` answers 503 naming it from now on
    /// (the first stage to fail is the one named), and the drain starts.
    pub fn set_failed(&self, stage: &'static str) {
        let _ = self.failed_stage.set(stage);
        self.set_draining();
    }
    /// `Err(stage)` once a stage ended on its own.
    pub fn live(&self) -> Result<(), &'static str> {
        self.failed_stage.get().map_or(Ok(()), |stage| Err(*stage))
    }
    /// Adds a condition read on each probe, e.g. that the exporter's queue
    /// is usable ([`Readiness::channel_open`] of its channel); `/readyz`
    /// answers `not ready: {unmet}` while `holds` returns false.
    pub fn require(&self, unmet: &'static str, holds: impl Fn() -> bool + Send + Sync + 'static) {
        self.requirements
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .push((unmet, Box::new(holds)));
    }
    /// Whether the channel of `sender` still has its receiver (the stage
    /// reading it runs), read through a weak sender: the check never keeps
    /// the channel open. False once every sender is gone.
    pub fn channel_open<T: Send + 'static>(
        sender: &mpsc::Sender<T>,
    ) -> impl Fn() -> bool + Send + Sync + 'static {
        let weak = sender.downgrade();
        move || weak.upgrade().is_some_and(|s| !s.is_closed())
    }
    /// `Ok` when ready, else why not.
    pub fn check(&self) -> Result<(), &'static str> {
        if self.draining.load(Ordering::Acquire) {
            Err("draining")
        } else if !self.receiver_bound.load(Ordering::Acquire) {
            Err("the ingest listener is not serving")
        } else if !self.exporter_running.load(Ordering::Acquire) {
            Err("the exporter stage is not running")
        } else {
            let requirements = self
                .requirements
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            match requirements.iter().find(|(_, holds)| !holds()) {
                Some((unmet, _)) => Err(*unmet),
                None => Ok(()),
            }
        }
    }
}

impl fmt::Debug for Readiness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Readiness")
            .field("receiver_bound", &self.receiver_bound)
            .field("exporter_running", &self.exporter_running)
            .field("draining", &self.draining)
            .field(
                "requirements",
                &self.requirements.read().map_or(0, |r| r.len()),
            )
            .finish()
    }
}

/// Reads one bounded channel's occupancy at scrape time.
#[derive(Clone)]
pub struct QueueProbe {
    name: &'static str,
    read: Arc<dyn Fn() -> QueueLevel + Send + Sync>,
}

/// One reading of a [`QueueProbe`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLevel {
    /// Items waiting (or places reserved) in the channel.
    pub size: usize,
    /// The channel's capacity.
    pub capacity: usize,
}

impl QueueProbe {
    /// A probe from any reading function; `name` becomes the `queue` label.
    pub fn new(name: &'static str, read: impl Fn() -> QueueLevel + Send + Sync + 'static) -> Self {
        Self {
            name,
            read: Arc::new(read),
        }
    }

    /// A probe of a tokio channel through a weak sender: it never keeps the
    /// channel open. Once every sender is gone, the size reads 0.
    pub fn from_sender<T: Send + 'static>(name: &'static str, sender: &mpsc::Sender<T>) -> Self {
        let weak = sender.downgrade();
        let capacity = sender.max_capacity();
        Self::new(name, move || {
            let size = weak
                .upgrade()
                .map_or(0, |s| s.max_capacity().saturating_sub(s.capacity()));
            QueueLevel { size, capacity }
        })
    }

    /// The `queue` label.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Reads the channel now.
    pub fn read(&self) -> QueueLevel {
        (self.read)()
    }
}

impl fmt::Debug for QueueProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueProbe")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// What the admin server reports. Cheap to clone (all `Arc`s).
#[derive(Clone, Debug)]
pub struct AdminState {
    readiness: Arc<Readiness>,
    registry: Arc<Registry>,
    /// The bearer token `/metrics` requires, if any.
    metrics_token: Option<BearerToken>,
    /// Scrapes of `/metrics` refused for a missing or wrong token.
    auth_failures: Counter,
}

impl AdminState {
    /// Builds the state from the stages' counters, the readiness flags and
    /// the probes of the `ingest` and `export` channels (any others too).
    /// With the persistent queue's `persistent` stats: its counters, and its
    /// fill level in bytes as the queue `persistent_bytes`.
    pub fn new(
        receiver: Arc<ReceiverStats>,
        pipeline: Arc<PipelineStats>,
        exporter: Arc<ExporterStats>,
        readiness: Arc<Readiness>,
        mut queues: Vec<QueueProbe>,
        derived: &DerivedMetrics,
        persistent: Option<Arc<QueueStats>>,
    ) -> Self {
        if let Some(stats) = persistent.clone() {
            queues.push(QueueProbe::new("persistent_bytes", move || {
                let read = |v: &std::sync::atomic::AtomicU64| {
                    usize::try_from(v.load(Ordering::Relaxed)).unwrap_or(usize::MAX)
                };
                QueueLevel {
                    size: read(&stats.bytes),
                    capacity: read(&stats.capacity_bytes),
                }
            }));
        }
        let mut root = Registry::default();
        // Metrics derived from spans keep their semconv names, unprefixed.
        derived.register(&mut root);
        let registry = root.sub_registry_with_prefix(METRIC_PREFIX);
        registry.register(
            "build",
            "Build information of the collector",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        let auth_failures = Counter::default();
        registry.register(
            "admin_auth_failures",
            "Scrapes of /metrics refused for a missing or wrong bearer token (admin.metrics_auth)",
            auth_failures.clone(),
        );
        registry.register_collector(Box::new(StatsCollector {
            receiver,
            pipeline,
            exporter,
            queues,
            persistent,
        }));
        Self {
            readiness,
            registry: Arc::new(root),
            metrics_token: None,
            auth_failures,
        }
    }

    /// Requires `token` (`Authorization: Bearer <token>`) on `/metrics`;
    /// `/livez` and `/readyz` stay open for the probes.
    pub fn with_metrics_token(mut self, token: Option<BearerToken>) -> Self {
        self.metrics_token = token;
        self
    }

    /// The metrics in the Prometheus text format (0.0.4).
    pub fn render_prometheus(&self) -> Result<String, fmt::Error> {
        let mut text = String::with_capacity(4096);
        prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry)?;
        Ok(text)
    }

    /// The metrics in the OpenMetrics text format (ends with `# EOF`).
    pub fn render_openmetrics(&self) -> Result<String, fmt::Error> {
        let mut text = String::with_capacity(4096);
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

/// Reads the stages' atomics on each scrape.
#[derive(Debug)]
struct StatsCollector {
    receiver: Arc<ReceiverStats>,
    pipeline: Arc<PipelineStats>,
    exporter: Arc<ExporterStats>,
    queues: Vec<QueueProbe>,
    persistent: Option<Arc<QueueStats>>,
}

fn counter(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: u64) -> fmt::Result {
    let metric = ConstCounter::new(value);
    let metric_encoder = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
    metric.encode(metric_encoder)
}

fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: u64) -> fmt::Result {
    let metric = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
    let metric_encoder = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
    metric.encode(metric_encoder)
}

/// One labelled metric per item of `items`: `label="<name>"` and its value.
fn family<T>(
    encoder: &mut DescriptorEncoder,
    (name, help, label): (&str, &str, &str),
    items: &[T],
    sample: impl Fn(&T) -> (&str, u64),
    is_counter: bool,
) -> fmt::Result {
    if items.is_empty() {
        return Ok(());
    }
    let metric_type = if is_counter {
        ConstCounter::new(0u64).metric_type()
    } else {
        ConstGauge::new(0i64).metric_type()
    };
    let mut metric_encoder = encoder.encode_descriptor(name, help, None, metric_type)?;
    for item in items {
        let (label_value, value) = sample(item);
        let labels = [(label, label_value)];
        let labelled = metric_encoder.encode_family(&labels)?;
        if is_counter {
            ConstCounter::new(value).encode(labelled)?;
        } else {
            ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX)).encode(labelled)?;
        }
    }
    Ok(())
}

impl Collector for StatsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        if let Some(q) = &self.persistent {
            let e = &mut encoder;
            gauge(
                e,
                "persistent_queue_records",
                "Event batches in the persistent queue (acknowledged, not yet settled).",
                load(&q.records),
            )?;
            counter(
                e,
                "persistent_queue_appended_batches",
                "Event batches written to the persistent queue.",
                load(&q.appended_batches),
            )?;
            counter(
                e,
                "persistent_queue_replayed_batches",
                "Event batches replayed from the persistent queue at start.",
                load(&q.replayed_batches),
            )?;
            counter(
                e,
                "persistent_queue_corrupt_records",
                "Records of the persistent queue that could not be decoded at replay (skipped).",
                load(&q.corrupt_records),
            )?;
            counter(
                e,
                "persistent_queue_full",
                "Times the persistent queue reached queue.max_bytes and reading stopped.",
                load(&q.full),
            )?;
        }
        let r = &self.receiver;
        let e = &mut encoder;
        counter(
            e,
            "receiver_accepted_events",
            "Events accepted from the shims.",
            load(&r.events_accepted),
        )?;
        counter(
            e,
            "receiver_accepted_batches",
            "Event batches accepted from the shims.",
            load(&r.batches_accepted),
        )?;
        counter(
            e,
            "receiver_refused_batches",
            "Event batches refused (invalid or over the limits).",
            load(&r.batches_refused),
        )?;
        counter(
            e,
            "receiver_auth_failures",
            "Ingest stream calls refused for a missing or wrong bearer token.",
            load(&r.auth_failures),
        )?;
        counter(
            e,
            "receiver_memory_refusals",
            "Event batches refused with UNAVAILABLE above receiver.memory_limit_mib.",
            load(&r.memory_refusals),
        )?;
        counter(
            e,
            "receiver_oversized_events",
            "Event batches refused for an event above receiver.max_event_bytes.",
            load(&r.oversized_events),
        )?;
        counter(
            e,
            "receiver_throttled_batches",
            "Event batches delayed by the per-stream rate limit (receiver.stream_events_per_sec).",
            load(&r.throttled_batches),
        )?;
        counter(
            e,
            "receiver_streams_opened",
            "Ingest streams opened by shims.",
            load(&r.streams_opened),
        )?;
        counter(
            e,
            "shim_dropped_events",
            "Events the shims dropped because their hook queue was full, as they reported.",
            load(&r.shim_dropped_events),
        )?;
        gauge(
            e,
            "receiver_connections_open",
            "Ingest connections open now.",
            load(&r.connections_open),
        )?;
        counter(
            e,
            "receiver_connections_refused",
            "Ingest connections closed at once because receiver.max_connections were open.",
            load(&r.connections_refused),
        )?;
        counter(
            e,
            "receiver_connections_timed_out",
            "Ingest connections closed for opening no accepted stream within receiver.handshake_timeout_ms.",
            load(&r.connections_timed_out),
        )?;
        counter(
            e,
            "receiver_connections_idle_closed",
            "Ingest connections closed after receiver.idle_timeout_secs without a stream.",
            load(&r.connections_idle_closed),
        )?;
        counter(
            e,
            "receiver_accept_errors",
            "Errors accepting ingest connections (e.g. out of file descriptors).",
            load(&r.accept_errors),
        )?;
        counter(
            e,
            "receiver_foreign_instance_refusals",
            "Event batches refused for a shim instance id another client certificate uses.",
            load(&r.foreign_instance_refusals),
        )?;
        counter(
            e,
            "receiver_unreadable_wire_calls",
            "Calls refused with UNIMPLEMENTED for a release of the wire protocol this collector cannot read (it reads hermes.collector.v1).",
            load(&r.unreadable_wire_calls),
        )?;
        let versions = r.unknown_shim_versions.snapshot();
        family(
            e,
            (
                "receiver_unknown_shim_version_streams",
                "Ingest streams (accepted) from shim releases this collector does not know, by version: at most 16 labels, then `other`.",
                "shim_version",
            ),
            &versions,
            |(version, n)| (version.as_str(), *n),
            true,
        )?;

        let p = &self.pipeline;
        counter(
            e,
            "correlator_events",
            "Events correlated.",
            load(&p.events),
        )?;
        counter(
            e,
            "correlator_duplicate_events",
            "Redelivered events dropped by the sequencer.",
            load(&p.duplicate_events),
        )?;
        counter(
            e,
            "correlator_skipped_seqs",
            "Missing event sequence numbers given up after the gap timeout.",
            load(&p.skipped_seqs),
        )?;
        gauge(
            e,
            "correlator_held_events",
            "Events held by the sequencer until an earlier one arrives.",
            load(&p.held_events),
        )?;
        gauge(
            e,
            "correlator_open_turns",
            "Turns open in the correlator.",
            load(&p.open_turns),
        )?;
        counter(
            e,
            "correlator_evicted_turns",
            "Turns closed as incomplete by a limit (open turns, bytes held, the persistent queue's room).",
            load(&p.turns_evicted),
        )?;
        counter(
            e,
            "correlator_evicted_turns_for_bytes",
            "Of the evicted turns, those closed because their agent (or all) held more than correlator.max_bytes_per_agent (max_bytes).",
            load(&p.turns_evicted_for_bytes),
        )?;
        counter(
            e,
            "correlator_evicted_sessions",
            "Session records forgotten because their agent (or all) held more than correlator.max_sessions_per_agent (max_sessions).",
            load(&p.sessions_evicted),
        )?;
        counter(
            e,
            "correlator_late_events_dropped",
            "Events of a turn already closed and exported, dropped.",
            load(&p.late_events_dropped),
        )?;
        counter(
            e,
            "correlator_cross_instance_turns",
            "Turns opened with a turn id another shim instance holds; given a trace id of their own.",
            load(&p.cross_instance_turns),
        )?;
        counter(
            e,
            "correlator_turns_cut_off_at_exit",
            "Turns still running when their agent process exited (the shim's process_exit marker), closed as incomplete.",
            load(&p.turns_cut_off_at_exit),
        )?;
        gauge(
            e,
            "correlator_sessions",
            "Session records held: session starts waiting for a turn, subagent links.",
            load(&p.sessions),
        )?;
        gauge(
            e,
            "correlator_held_bytes",
            "Approximate bytes of open correlation state.",
            load(&p.held_bytes),
        )?;
        gauge(
            e,
            "correlator_agents",
            "Shim instances holding correlation state.",
            load(&p.agents),
        )?;
        counter(
            e,
            "correlator_expired",
            "Open state closed as incomplete after state_ttl.",
            load(&p.expired),
        )?;
        counter(
            e,
            "spans",
            "Spans produced by the correlator.",
            load(&p.spans),
        )?;

        let sinks = self.exporter.sinks();
        family(
            e,
            (
                "exporter_sent_spans",
                "Spans accepted by the exporter.",
                "exporter",
            ),
            sinks,
            |s| (s.name(), s.spans_sent()),
            true,
        )?;
        family(
            e,
            (
                "exporter_send_failed_spans",
                "Spans the exporter failed to send (dropped).",
                "exporter",
            ),
            sinks,
            |s| (s.name(), s.spans_failed()),
            true,
        )?;
        family(
            e,
            (
                "exporter_retries",
                "Export retry attempts (first attempts not counted).",
                "exporter",
            ),
            sinks,
            |s| (s.name(), s.retries()),
            true,
        )?;

        let levels: Vec<(&str, QueueLevel)> =
            self.queues.iter().map(|q| (q.name(), q.read())).collect();
        family(
            e,
            ("queue_size", "Items waiting in a bounded channel.", "queue"),
            &levels,
            |(name, level)| (*name, level.size as u64),
            false,
        )?;
        family(
            e,
            ("queue_capacity", "Capacity of a bounded channel.", "queue"),
            &levels,
            |(name, level)| (*name, level.capacity as u64),
            false,
        )?;
        Ok(())
    }
}

/// Serves the admin endpoints on `listener` until `shutdown` is cancelled,
/// then lets the open connections finish their response (briefly) and
/// returns. Give it a token cancelled after the drain, so `/livez` and
/// `/readyz` (503) answer while the collector drains.
pub async fn serve(
    listener: TcpListener,
    state: AdminState,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                // Out of file descriptors and the like: back off, keep serving.
                tracing::warn!(error = %e, "admin server cannot accept");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            tracing::debug!("admin server busy; connection closed");
            continue;
        };
        let state = state.clone();
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            let _permit = permit;
            serve_connection(stream, state, shutdown).await;
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(SHUTDOWN_WAIT, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    connections.shutdown().await;
    Ok(())
}

fn is_connection_error(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

async fn serve_connection(
    stream: tokio::net::TcpStream,
    state: AdminState,
    shutdown: CancellationToken,
) {
    let service = hyper::service::service_fn(move |request| {
        let state = state.clone();
        async move { Ok::<_, Infallible>(respond(&state, &request)) }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES);
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    let lifetime = tokio::time::sleep(CONNECTION_LIFETIME);
    tokio::pin!(lifetime);
    let result = tokio::select! {
        result = connection.as_mut() => result,
        () = shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            connection.as_mut().await
        }
        () = &mut lifetime => {
            connection.as_mut().graceful_shutdown();
            connection.as_mut().await
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "admin connection ended with an error");
    }
}

fn respond(state: &AdminState, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    let path = request.uri().path();
    if !matches!(path, "/metrics" | "/livez" | "/readyz") {
        return text(StatusCode::NOT_FOUND, "not found\n");
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
        response
            .headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    let response = match path {
        "/livez" => match state.readiness.live() {
            Ok(()) => text(StatusCode::OK, "ok\n"),
            Err(stage) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not live: the {stage} stage stopped\n"),
            ),
        },
        "/readyz" => match state.readiness.check() {
            Ok(()) => text(StatusCode::OK, "ready\n"),
            Err(why) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {why}\n"),
            ),
        },
        _ => refusal(state, request).unwrap_or_else(|| metrics(state, request)),
    };
    // hyper sends the head only for HEAD, with the body's length.
    response
}

/// The answer to a `/metrics` request without the bearer token it requires,
/// checked as the ingest's (constant-time comparison, scheme
/// case-insensitive): a 401 with `WWW-Authenticate: Bearer`, counted and
/// logged at the 1st, 2nd, 4th, … one. None when the request may scrape.
fn refusal<B>(state: &AdminState, request: &Request<B>) -> Option<Response<Full<Bytes>>> {
    let token = state.metrics_token.as_ref()?;
    let mut headers = http::HeaderMap::new();
    if let Some(value) = request.headers().get(header::AUTHORIZATION) {
        headers.insert(header::AUTHORIZATION, value.clone());
    }
    let failure = token
        .check(&tonic::metadata::MetadataMap::from_headers(headers))
        .err()?;
    let failures = state.auth_failures.inc() + 1;
    if failures.is_power_of_two() {
        tracing::warn!(
            auth_failures = failures,
            reason = failure.message(),
            "/metrics scrape refused (admin.metrics_auth)"
        );
    }
    let mut response = text(StatusCode::UNAUTHORIZED, format!("{}\n", failure.message()));
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer"),
    );
    Some(response)
}

fn metrics(state: &AdminState, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    let openmetrics = request
        .headers()
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    let (rendered, content_type) = if openmetrics {
        (state.render_openmetrics(), OPENMETRICS_CONTENT_TYPE)
    } else {
        (
            state.render_prometheus(),
            prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        )
    };
    match rendered {
        Ok(body) => {
            let mut response = Response::new(Full::new(Bytes::from(body)));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static(content_type),
            );
            response
        }
        Err(_) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "cannot encode the metrics\n",
        ),
    }
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::io::{Read as _, Write as _};
    use std::net::SocketAddr;

    use super::*;

    struct Fixture {
        addr: SocketAddr,
        receiver: Arc<ReceiverStats>,
        pipeline: Arc<PipelineStats>,
        readiness: Arc<Readiness>,
        ingest_tx: mpsc::Sender<u32>,
        _ingest_rx: mpsc::Receiver<u32>,
        shutdown: CancellationToken,
        server: tokio::task::JoinHandle<std::io::Result<()>>,
    }

    async fn start() -> Fixture {
        let receiver = Arc::new(ReceiverStats::default());
        let pipeline = Arc::new(PipelineStats::default());
        // Only the sink's name matters here; the stage never runs.
        let sinks = vec![hermes_exporter::Sink::new(
            "otlp_grpc",
            hermes_exporter::ConsoleExporter::stdout(
                hermes_exporter::ConsoleExporterConfig::default(),
            ),
        )];
        let stage = hermes_exporter::ExporterStage::new(
            sinks,
            hermes_exporter::ExporterSettings::default(),
        );
        let exporter = stage.stats();
        let readiness = Arc::new(Readiness::default());
        let (ingest_tx, ingest_rx) = mpsc::channel::<u32>(8);
        let (export_tx, _export_rx) = mpsc::channel::<u32>(4);
        let state = AdminState::new(
            receiver.clone(),
            pipeline.clone(),
            exporter,
            readiness.clone(),
            vec![
                QueueProbe::from_sender("ingest", &ingest_tx),
                QueueProbe::from_sender("export", &export_tx),
            ],
            &DerivedMetrics::default(),
            None,
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(listener, state, shutdown.clone()));
        Fixture {
            addr,
            receiver,
            pipeline,
            readiness,
            ingest_tx,
            _ingest_rx: ingest_rx,
            shutdown,
            server,
        }
    }

    /// One request over a fresh raw connection; returns (status, head, body).
    async fn get(addr: SocketAddr, method: &str, path: &str, extra: &str) -> (u16, String, String) {
        let request =
            format!("{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n{extra}\r\n");
        tokio::task::spawn_blocking(move || {
            let mut stream = std::net::TcpStream::connect(addr).unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            stream.write_all(request.as_bytes()).unwrap();
            let mut raw = String::new();
            stream.read_to_string(&mut raw).unwrap();
            let (head, body) = raw.split_once("\r\n\r\n").unwrap();
            let status = head.split(' ').nth(1).unwrap().parse().unwrap();
            (status, head.to_owned(), body.to_owned())
        })
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn metrics_read_the_atomics_at_scrape_time() {
        let f = start().await;
        let (status, head, body) = get(f.addr, "GET", "/metrics", "").await;
        assert_eq!(status, 200, "{head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: text/plain; version=0.0.4"),
            "{head}"
        );
        for line in [
            "hermes_collector_receiver_accepted_events_total 0",
            "hermes_collector_receiver_refused_batches_total 0",
            "hermes_collector_receiver_oversized_events_total 0",
            "hermes_collector_receiver_throttled_batches_total 0",
            "hermes_collector_receiver_streams_opened_total 0",
            "hermes_collector_receiver_unreadable_wire_calls_total 0",
            "hermes_collector_shim_dropped_events_total 0",
            "hermes_collector_correlator_events_total 0",
            "hermes_collector_correlator_duplicate_events_total 0",
            "hermes_collector_correlator_skipped_seqs_total 0",
            "hermes_collector_correlator_held_events 0",
            "hermes_collector_correlator_open_turns 0",
            "hermes_collector_correlator_evicted_turns_total 0",
            "hermes_collector_correlator_expired_total 0",
            "hermes_collector_correlator_evicted_turns_for_bytes_total 0",
            "hermes_collector_correlator_evicted_sessions_total 0",
            "hermes_collector_correlator_late_events_dropped_total 0",
            "hermes_collector_correlator_cross_instance_turns_total 0",
            "hermes_collector_correlator_turns_cut_off_at_exit_total 0",
            "hermes_collector_correlator_sessions 0",
            "hermes_collector_correlator_held_bytes 0",
            "hermes_collector_correlator_agents 0",
            "hermes_collector_spans_total 0",
            "hermes_collector_exporter_sent_spans_total{exporter=\"otlp_grpc\"} 0",
            "hermes_collector_exporter_send_failed_spans_total{exporter=\"otlp_grpc\"} 0",
            "hermes_collector_exporter_retries_total{exporter=\"otlp_grpc\"} 0",
            "hermes_collector_queue_size{queue=\"ingest\"} 0",
            "hermes_collector_queue_capacity{queue=\"ingest\"} 8",
            "hermes_collector_queue_size{queue=\"export\"} 0",
            "hermes_collector_queue_capacity{queue=\"export\"} 4",
            "# TYPE hermes_collector_spans_total counter",
            "# TYPE hermes_collector_correlator_open_turns gauge",
        ] {
            assert!(
                body.lines().any(|l| l == line),
                "missing `{line}` in\n{body}"
            );
        }
        let version = format!(
            "hermes_collector_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        assert!(body.lines().any(|l| l == version), "{body}");

        f.receiver.events_accepted.fetch_add(42, Ordering::Relaxed);
        f.receiver.unknown_shim_versions.count("9.9.9");
        f.pipeline.open_turns.store(3, Ordering::Relaxed);
        f.pipeline.spans.fetch_add(7, Ordering::Relaxed);
        f.ingest_tx.send(1).await.unwrap();
        f.ingest_tx.send(2).await.unwrap();
        let (_, _, body) = get(f.addr, "GET", "/metrics", "").await;
        for line in [
            "hermes_collector_receiver_accepted_events_total 42",
            "hermes_collector_receiver_unknown_shim_version_streams_total{shim_version=\"9.9.9\"} 1",
            "hermes_collector_correlator_open_turns 3",
            "hermes_collector_spans_total 7",
            "hermes_collector_queue_size{queue=\"ingest\"} 2",
        ] {
            assert!(
                body.lines().any(|l| l == line),
                "missing `{line}` in\n{body}"
            );
        }
        f.shutdown.cancel();
        f.server.await.unwrap().unwrap();
    }

    #[test]
    fn the_persistent_queue_reports_its_counters_and_its_fill_level() {
        let stage = hermes_exporter::ExporterStage::new(
            Vec::new(),
            hermes_exporter::ExporterSettings::default(),
        );
        let stats = Arc::new(QueueStats::default());
        let state = AdminState::new(
            Arc::new(ReceiverStats::default()),
            Arc::new(PipelineStats::default()),
            stage.stats(),
            Arc::new(Readiness::default()),
            Vec::new(),
            &DerivedMetrics::default(),
            Some(stats.clone()),
        );
        stats.records.store(3, Ordering::Relaxed);
        stats.bytes.store(1_000, Ordering::Relaxed);
        stats.capacity_bytes.store(4_096, Ordering::Relaxed);
        stats.replayed_batches.store(2, Ordering::Relaxed);
        let body = state.render_prometheus().unwrap();
        for line in [
            "hermes_collector_persistent_queue_records 3",
            "hermes_collector_persistent_queue_replayed_batches_total 2",
            "hermes_collector_queue_size{queue=\"persistent_bytes\"} 1000",
            "hermes_collector_queue_capacity{queue=\"persistent_bytes\"} 4096",
        ] {
            assert!(
                body.lines().any(|l| l == line),
                "missing `{line}` in\n{body}"
            );
        }
    }

    #[tokio::test]
    async fn openmetrics_on_request() {
        let f = start().await;
        let (status, head, body) = get(
            f.addr,
            "GET",
            "/metrics",
            "Accept: application/openmetrics-text;version=1.0.0\r\n",
        )
        .await;
        assert_eq!(status, 200);
        assert!(head.contains("application/openmetrics-text"), "{head}");
        assert!(body.ends_with("# EOF\n"), "{body}");
        f.shutdown.cancel();
        f.server.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn health_endpoints_follow_readiness() {
        let f = start().await;
        assert_eq!(get(f.addr, "GET", "/livez", "").await.0, 200);
        assert_eq!(get(f.addr, "GET", "/readyz", "").await.0, 503);
        f.readiness.set_receiver_bound(true);
        assert_eq!(
            get(f.addr, "GET", "/readyz", "").await.0,
            503,
            "exporter not running yet"
        );
        f.readiness.set_exporter_running(true);
        let (status, _, body) = get(f.addr, "GET", "/readyz", "").await;
        assert_eq!((status, body.as_str()), (200, "ready\n"));
        f.readiness.set_draining();
        assert_eq!(get(f.addr, "GET", "/readyz", "").await.0, 503);
        assert_eq!(get(f.addr, "GET", "/livez", "").await.0, 200);

        let (status, _, body) = get(f.addr, "HEAD", "/livez", "").await;
        assert_eq!((status, body.as_str()), (200, ""));
        assert_eq!(get(f.addr, "GET", "/", "").await.0, 404);
        assert_eq!(get(f.addr, "GET", "/metrics/x", "").await.0, 404);
        let (status, head, _) =
            get(f.addr, "POST", "/readyz", "Content-Length: 5\r\n\r\nhello").await;
        assert_eq!(status, 405, "{head}");
        f.shutdown.cancel();
        f.server.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn readyz_needs_a_serving_ingest_and_an_open_exporter_queue() {
        let f = start().await;
        f.readiness.set_receiver_bound(true);
        f.readiness.set_exporter_running(true);
        let (tx, rx) = mpsc::channel::<u32>(1);
        f.readiness
            .require("the exporter queue is closed", Readiness::channel_open(&tx));
        assert_eq!(get(f.addr, "GET", "/readyz", "").await.0, 200);
        drop(rx);
        let (status, _, body) = get(f.addr, "GET", "/readyz", "").await;
        assert_eq!(
            (status, body.as_str()),
            (503, "not ready: the exporter queue is closed\n")
        );
        f.readiness.set_receiver_bound(false);
        let (status, _, body) = get(f.addr, "GET", "/readyz", "").await;
        assert_eq!(
            (status, body.as_str()),
            (503, "not ready: the ingest listener is not serving\n")
        );
        f.readiness.set_draining();
        let (_, _, body) = get(f.addr, "GET", "/readyz", "").await;
        assert_eq!(body, "not ready: draining\n");
        assert_eq!(get(f.addr, "GET", "/livez", "").await.0, 200);
        f.shutdown.cancel();
        f.server.await.unwrap().unwrap();
    }

    #[test]
    fn the_queue_check_does_not_keep_a_channel_open() {
        let (tx, mut rx) = mpsc::channel::<u32>(1);
        let open = Readiness::channel_open(&tx);
        assert!(open());
        drop(tx);
        assert!(!open(), "no sender left");
        assert!(rx.try_recv().is_err());
    }

    #[tokio::test]
    async fn probes_do_not_keep_a_channel_open() {
        let (tx, mut rx) = mpsc::channel::<u32>(2);
        let probe = QueueProbe::from_sender("ingest", &tx);
        tx.send(1).await.unwrap();
        assert_eq!(
            probe.read(),
            QueueLevel {
                size: 1,
                capacity: 2
            }
        );
        drop(tx);
        assert_eq!(rx.recv().await, Some(1));
        assert_eq!(rx.recv().await, None, "the probe kept the channel open");
        assert_eq!(probe.read().size, 0);
    }

    #[tokio::test]
    async fn shutdown_stops_the_server() {
        let f = start().await;
        // An idle keep-alive connection does not hold the shutdown up.
        let idle = tokio::net::TcpStream::connect(f.addr).await.unwrap();
        f.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), f.server)
            .await
            .expect("server did not stop")
            .unwrap()
            .unwrap();
        drop(idle);
        assert!(std::net::TcpStream::connect(f.addr).is_err());
    }
}
