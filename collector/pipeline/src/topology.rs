//! The composition root: [`Topology::build`] turns a validated
//! configuration into the stages, the bounded channels between them and the
//! admin server, with every port bound and every file opened, so a start
//! fails before anything runs; [`Topology::run`] (`supervise.rs`) runs them
//! under the supervisor.
//!
//! ```text
//! shims ─gRPC─▶ receiver ─[ingest]─▶ (queue writer ─[logged]─▶) correlation ─[export]─▶ exporter stage ─▶ sinks
//!                                         ▲──────── Settle ─────────┘ (ledger)
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use hermes_config as config;
use hermes_config::Config;
use hermes_correlator::sequencer::{Sequencer, SequencerConfig};
use hermes_correlator::{Correlation, Correlator};
use hermes_exporter::ExporterStage;
use hermes_metrics::collector;
use hermes_receiver::{Ingest, Ingested, Limits, ListenAddr, Listener, ReceiverStats};
use hermes_span::trace::v1::ResourceSpans;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::admin::{AdminState, QueueProbe, Queues, Readiness};
use crate::clock::WallClock;
use crate::derived::{DerivedMetrics, OtlpMetricsExport};
use crate::driver::{Driver, Steps};
use crate::ledger::{Durable, Ledger};
use crate::sinks::build_sinks;
use crate::stats::PipelineStats;
use crate::writer::{QueueStats, Settle, Writer};

/// Every stage of the collector, built and bound, not running yet.
pub struct Topology {
    pub(crate) grace: Duration,
    pub(crate) readiness: Arc<Readiness>,
    pub(crate) receiver: ReceiverPart,
    pub(crate) admin: AdminPart,
    pub(crate) exporter: (ExporterStage, mpsc::Receiver<Vec<ResourceSpans>>),
    pub(crate) correlation: CorrelationPart,
    pub(crate) writer: Option<WriterPart>,
    pub(crate) metrics_export: Option<OtlpMetricsExport>,
}

pub(crate) struct ReceiverPart {
    pub ingest: Ingest,
    pub listener: Listener,
    pub tls: Option<tonic::transport::ServerTlsConfig>,
    /// Ends every stream with `UNAVAILABLE` and stops accepting.
    pub shutdown: CancellationToken,
    pub stats: Arc<ReceiverStats>,
    /// How long the drain waits for ingest connections to close.
    pub linger: Duration,
    /// Logged once serving: authenticated, mutual TLS.
    pub authenticated: bool,
    pub mutual_tls: bool,
    pub shown_listen: String,
}

pub(crate) struct AdminPart {
    pub listener: tokio::net::TcpListener,
    pub state: AdminState,
    pub shown_listen: String,
    pub metrics_authenticated: bool,
}

pub(crate) struct CorrelationPart {
    pub driver: Driver<WallClock>,
    pub ingest: mpsc::Receiver<Ingested>,
    pub export: mpsc::Sender<Vec<ResourceSpans>>,
    pub stats: Arc<PipelineStats>,
}

pub(crate) struct WriterPart {
    pub writer: Writer,
    pub ingest: mpsc::Receiver<Ingested>,
    pub settle: mpsc::Receiver<Settle>,
    pub out: mpsc::Sender<Ingested>,
}

impl Topology {
    /// Builds every stage from `config` (validated): reads the secrets and
    /// TLS material, opens the persistent queue and the span file, binds
    /// the ingest and admin listeners. Call it inside the runtime.
    pub async fn build(config: &Config) -> anyhow::Result<Self> {
        let listen = config.receiver.listen_addr()?;
        let token = config
            .receiver
            .auth
            .token(&|name| std::env::var(name).ok())?;
        let metrics_token = config
            .admin
            .metrics_auth
            .token_at("admin.metrics_auth", &|name| std::env::var(name).ok())?;
        let tls = match &config.receiver.tls {
            Some(tls) => Some(tls.server_config()?),
            None => None,
        };
        let sinks = build_sinks(config)?;
        let processor =
            hermes_processor::SpanProcessor::new(&config.processing).context("processing")?;
        let persistent = match config.queue.kind {
            config::QueueKind::Memory => None,
            config::QueueKind::Disk => Some(open_queue(config)?),
        };

        // Bind first: a taken port fails the start before anything runs.
        let listener = Listener::bind(&listen).await.with_context(|| {
            format!(
                "receiver.listen: cannot listen on {}",
                config.shown(&listen.to_string())
            )
        })?;
        let admin_addr: SocketAddr = config.admin.listen.parse().context("admin.listen")?;
        let admin_listener = tokio::net::TcpListener::bind(admin_addr)
            .await
            .with_context(|| {
                format!(
                    "admin.listen: cannot listen on {}",
                    config.shown(&admin_addr.to_string())
                )
            })?;
        let readiness = Arc::new(Readiness::default());

        let (ingest_tx, ingest_rx) = mpsc::channel(config.receiver.queue_batches);
        let (export_tx, export_rx) = mpsc::channel(config.batch.queue);
        readiness.require(
            "the exporter queue is closed",
            Readiness::channel_open(&export_tx),
        );
        let mut probes = vec![
            QueueProbe::from_sender("ingest", &ingest_tx),
            QueueProbe::from_sender("export", &export_tx),
        ];

        let stage = ExporterStage::new(sinks, exporter_settings(config));
        let exporter_stats = stage.stats();
        // A span file that cannot be written (a full disk): not ready while
        // its last batch failed, so probes say what the counters and log say.
        readiness.require("the span file cannot be written", {
            let stats = exporter_stats.clone();
            move || {
                !stats
                    .sinks()
                    .iter()
                    .any(|sink| sink.name() == "file" && sink.failing())
            }
        });

        // The derived metrics, also pushed over OTLP when configured.
        let bounds = config.metrics.bounds();
        let (metrics_export, derived) = match &config.exporters.otlp_metrics {
            Some(otlp) => {
                let tls = otlp.tls_settings()?;
                let (export, meter) = OtlpMetricsExport::start(otlp, tls, bounds.max_series)
                    .context("OTLP metrics exporter")?;
                tracing::info!(
                    destination = %hermes_exporter::shown_endpoint(&config.shown(&otlp.endpoint)),
                    protocol = ?otlp.protocol,
                    interval_ms = otlp.interval_ms,
                    "exporting the derived metrics over OTLP"
                );
                (Some(export), DerivedMetrics::new(bounds).with_meter(&meter))
            }
            None => (None, DerivedMetrics::new(bounds)),
        };

        // With the persistent queue, the writer sits between the receiver
        // and the correlation stage.
        let mut stage_metrics = Vec::new();
        let (ledger, writer, correlation_rx) = match persistent {
            None => (Ledger::Memory, None, ingest_rx),
            Some((writer, recovered)) => {
                let (logged_tx, logged_rx) = mpsc::channel(config.receiver.queue_batches);
                let (settle_tx, settle_rx) = mpsc::channel(16);
                let queue = writer.stats();
                probes.push(QueueStats::fill_probe(&queue));
                stage_metrics.push(collector(queue.clone()));
                let ledger = Ledger::disk(Durable {
                    settle: settle_tx,
                    done: {
                        let stats = exporter_stats.clone();
                        Box::new(move || stats.done_through())
                    },
                    recovered,
                    queue,
                });
                let part = WriterPart {
                    writer,
                    ingest: ingest_rx,
                    settle: settle_rx,
                    out: logged_tx,
                };
                (ledger, Some(part), logged_rx)
            }
        };
        let pipeline_stats = Arc::new(PipelineStats::default());
        let driver = Driver {
            steps: Steps {
                correlation: Correlation::new(
                    Sequencer::new(SequencerConfig {
                        gap_timeout_nanos: config
                            .correlator
                            .gap_timeout_ms
                            .saturating_mul(1_000_000),
                        ..Default::default()
                    }),
                    Correlator::new(correlator_config(config)),
                ),
                derived: derived.clone(),
                processor,
            },
            tick: Duration::from_millis(config.correlator.tick_ms),
            stats: pipeline_stats.clone(),
            ledger,
            clock: WallClock,
        };

        let receiver_stats = Arc::new(ReceiverStats::default());
        let limits = receiver_limits(config);
        if let ListenAddr::Tcp(addr) = &listen
            && !addr.ip().is_loopback()
            && tls.is_none()
        {
            tracing::warn!(
                listen = %config.shown(&addr.to_string()),
                authenticated = token.is_some(),
                "the ingest listens beyond loopback in plaintext: events (and the bearer token, if any) can be read on the network; see docs/SECURITY.md"
            );
        }
        let authenticated = token.is_some();
        let memory_limit = (config.receiver.memory_limit_mib > 0).then(|| {
            hermes_receiver::MemoryLimit::new(
                config.receiver.memory_limit_mib.saturating_mul(1024 * 1024),
                Duration::from_millis(100),
            )
        });
        let delivery = match config.queue.kind {
            config::QueueKind::Memory => hermes_receiver::Delivery::Memory,
            config::QueueKind::Disk => hermes_receiver::Delivery::Durable,
        };
        let linger = limits.connections.shutdown_linger + Duration::from_millis(500);
        let shutdown = CancellationToken::new();
        let ingest = Ingest::new(ingest_tx, limits, receiver_stats.clone(), shutdown.clone())
            .with_token(token)
            .with_delivery(delivery)
            .with_memory_limit(memory_limit);

        stage_metrics.extend([
            collector(receiver_stats.clone()),
            collector(pipeline_stats.clone()),
            collector(exporter_stats.clone()),
            collector(Arc::new(Queues(probes))),
        ]);
        let admin = AdminPart {
            shown_listen: config.shown(
                &admin_listener
                    .local_addr()
                    .context("admin address")?
                    .to_string(),
            ),
            metrics_authenticated: metrics_token.is_some(),
            state: AdminState::new(readiness.clone(), &derived, stage_metrics)
                .with_metrics_token(metrics_token),
            listener: admin_listener,
        };
        let shown_listen = config.shown(
            &listener
                .local_addr()
                .context("listener address")?
                .to_string(),
        );
        Ok(Self {
            grace: Duration::from_millis(config.shutdown.grace_ms),
            readiness,
            receiver: ReceiverPart {
                ingest,
                listener,
                shutdown,
                mutual_tls: config
                    .receiver
                    .tls
                    .as_ref()
                    .is_some_and(|t| t.client_ca_file.is_some()),
                tls,
                stats: receiver_stats,
                linger,
                authenticated,
                shown_listen,
            },
            admin,
            exporter: (stage, export_rx),
            correlation: CorrelationPart {
                driver,
                ingest: correlation_rx,
                export: export_tx,
                stats: pipeline_stats,
            },
            writer,
            metrics_export,
        })
    }
}

/// Opens the persistent queue (`queue.kind: disk`).
fn open_queue(config: &Config) -> anyhow::Result<(Writer, crate::writer::Recovered)> {
    let dir = &config.queue.dir;
    let shown = config.shown(&dir.display().to_string());
    let (writer, recovered) = Writer::open(
        dir,
        config.queue.max_bytes,
        Duration::from_millis(config.queue.fsync_interval_ms),
    )
    .with_context(|| format!("queue.dir {shown}"))?;
    tracing::info!(
        dir = %shown,
        records = writer.records(),
        exported_markers = recovered.exported.len(),
        "persistent queue open"
    );
    Ok((writer, recovered))
}

fn exporter_settings(config: &Config) -> hermes_exporter::ExporterSettings {
    hermes_exporter::ExporterSettings {
        max_batch_spans: config.batch.max_spans,
        max_batch_bytes: config.batch.max_bytes,
        batch_timeout: Duration::from_millis(config.batch.timeout_ms),
        retry: hermes_exporter::RetrySettings {
            max_elapsed: Duration::from_secs(
                config
                    .exporters
                    .otlp
                    .as_ref()
                    .map_or(30, |o| o.max_elapsed_secs),
            ),
            ..Default::default()
        },
        drain_timeout: Duration::from_millis(config.shutdown.grace_ms),
        ..Default::default()
    }
}

fn correlator_config(config: &Config) -> hermes_correlator::Config {
    let c = &config.correlator;
    hermes_correlator::Config {
        max_open_turns: c.max_open_turns,
        max_open_turns_per_agent: c.max_open_turns_per_agent,
        max_sessions_per_agent: c.max_sessions_per_agent,
        max_sessions: c.max_sessions,
        max_bytes_per_agent: c.max_bytes_per_agent,
        max_bytes: c.max_bytes,
        state_ttl_nanos: c.state_ttl_secs.saturating_mul(1_000_000_000),
        turn_end_grace_nanos: c.turn_end_grace_ms.saturating_mul(1_000_000),
        ..Default::default()
    }
}

fn receiver_limits(config: &Config) -> Limits {
    let r = &config.receiver;
    Limits {
        max_message_bytes: r.max_message_bytes,
        max_events_per_batch: r.max_events_per_batch,
        max_event_bytes: r.max_event_bytes,
        stream_events_per_sec: r.stream_events_per_sec,
        stream_burst_events: r.stream_burst_events,
        max_streams_per_connection: r.max_streams_per_connection,
        connections: hermes_receiver::ConnectionLimits {
            max_connections: r.max_connections,
            handshake_timeout: Duration::from_millis(r.handshake_timeout_ms),
            idle_timeout: Duration::from_secs(r.idle_timeout_secs),
            ..Default::default()
        },
        ..Limits::default()
    }
}
