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

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use hermes_config::{Config, DiskQueueSettings, Validated};
use hermes_correlator::sequencer::Sequencer;
use hermes_correlator::{Correlation, Correlator};
use hermes_exporter::{ExporterStage, Outgoing};
use hermes_metrics::collector;
use hermes_receiver::{Ingest, Ingested, ListenAddr, Listener, ReceiverStats, Settlements};
use hermes_sampling::{Policy, Sampler};
use prometheus_client::collector::Collector;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::admin::{AdminState, QueueProbe, Queues, Readiness};
use crate::clock::WallClock;
use crate::derived::{DerivedMetrics, OtlpMetricsExport};
use crate::driver::{Driver, Steps};
use crate::lane::Lane;
use crate::ledger::{Durable, Ledger};
use crate::settle::Settlement;
use crate::sinks::build_sinks;
use crate::stats::PipelineStats;
use crate::writer::{QueueStats, Recovered, Settle, Writer};

/// Every stage of the collector, built and bound, not running yet.
pub struct Topology {
    pub(crate) grace: Duration,
    pub(crate) readiness: Arc<Readiness>,
    pub(crate) receiver: ReceiverPart,
    pub(crate) admin: AdminPart,
    pub(crate) exporter: (ExporterStage, mpsc::Receiver<Outgoing>),
    pub(crate) correlation: CorrelationPart,
    pub(crate) writer: Option<WriterPart>,
    pub(crate) metrics_export: Option<OtlpMetricsExport>,
    /// Where the pipeline's stages run (`runtime.pipeline`).
    pub(crate) lane: Lane,
    /// Live changes of the sampling policies, until taken.
    pub(crate) policies: Option<watch::Sender<Vec<Policy>>>,
}

pub(crate) struct ReceiverPart {
    pub ingest: Ingest,
    pub listener: Listener,
    pub tls: Option<tonic::transport::ServerTlsConfig>,
    /// Ends every stream with `UNAVAILABLE` and stops accepting.
    pub shutdown: CancellationToken,
    pub stats: Arc<ReceiverStats>,
    /// Settled seqs of fleet shims, and the drain's `leave`.
    pub settlements: Arc<Settlements>,
    /// `fleet.replicated`: the drain asks fleet shims to leave first.
    pub replicated: bool,
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
    pub export: mpsc::Sender<Outgoing>,
    pub stats: Arc<PipelineStats>,
}

pub(crate) struct WriterPart {
    pub writer: Writer,
    pub ingest: mpsc::Receiver<Ingested>,
    pub settle: mpsc::Receiver<Settle>,
    pub out: mpsc::Sender<Ingested>,
}

impl Topology {
    /// Builds every stage from `validated` (its secrets and TLS material
    /// already read): opens the persistent queue and the span file, binds
    /// the ingest and admin listeners. Call it inside the runtime.
    pub async fn build(validated: Validated) -> anyhow::Result<Self> {
        let (sinks, trajectories) = build_sinks(&validated)?;
        let Validated {
            config,
            listen,
            admin_listen: admin_addr,
            ingest_token: token,
            metrics_token,
            receiver_tls,
            otlp_metrics,
            ..
        } = validated;
        let config = &config;
        let processor =
            hermes_processor::SpanProcessor::new(&config.processing).context("processing")?;
        let persistent = config
            .queue
            .disk()
            .map(|disk| open_queue(config, disk))
            .transpose()?;

        // Bind first: a taken port fails the start before anything runs.
        let listener = Listener::bind(&listen).await.with_context(|| {
            format!(
                "receiver.listen: cannot listen on {}",
                config.shown(&listen.to_string())
            )
        })?;
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
        let stage = exporter_stage(config, sinks, &readiness);
        let exporter_stats = stage.stats();
        let (metrics_export, derived) = derived_metrics(config, otlp_metrics)?;

        let mut stage_metrics = Vec::new();
        let (mut correlation, writer, policies) = correlation_part(
            config,
            Steps {
                correlation: Correlation::new(
                    Sequencer::new(config.correlator.sequencer()),
                    Correlator::new(config.correlator.correlator()),
                ),
                derived: derived.clone(),
                processor,
                sampler: Sampler::new(config.sampling_settings()),
            },
            persistent,
            (ingest_rx, export_tx),
            &exporter_stats,
            (&mut probes, &mut stage_metrics),
        );
        let receiver = receiver_part(config, listen, listener, token, receiver_tls, ingest_tx)?;
        let settlement = Settlement::new(receiver.settlements.clone(), {
            let stats = exporter_stats.clone();
            Box::new(move || stats.done_through())
        });
        correlation.driver.encoder = stage.encoder();
        correlation.driver.settlement = Some(if config.fleet.replicated {
            settlement.replicated(
                config
                    .correlator
                    .state_ttl_secs
                    .saturating_mul(1_000_000_000),
            )
        } else {
            settlement
        });

        if let Some(trajectories) = trajectories {
            correlation.driver.session_ends = Some(trajectories.ends);
            stage_metrics.push(collector(trajectories.stats));
        }
        stage_metrics.extend([
            collector(receiver.stats.clone()),
            collector(correlation.stats.clone()),
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
        Ok(Self {
            grace: config.shutdown.grace(),
            readiness,
            receiver,
            admin,
            exporter: (stage, export_rx),
            correlation,
            writer,
            metrics_export,
            lane: Lane::start(config.runtime.pipeline)
                .context("cannot start the pipeline's thread")?,
            policies: Some(policies),
        })
    }

    /// Where a live change of the sampling policies goes (SIGHUP): the
    /// correlation stage takes them before it samples its next batch. Once.
    pub fn take_policy_updates(&mut self) -> Option<watch::Sender<Vec<Policy>>> {
        self.policies.take()
    }
}

/// The exporter stage over `sinks`; a span file that cannot be written (a
/// full disk) makes the collector not ready while its last batch failed, so
/// probes say what the counters and log say.
fn exporter_stage(
    config: &Config,
    sinks: Vec<hermes_exporter::Sink>,
    readiness: &Readiness,
) -> ExporterStage {
    let stage = ExporterStage::new(sinks, config.exporter_settings());
    let stats = stage.stats();
    readiness.require("the span file cannot be written", move || {
        !stats
            .sinks()
            .iter()
            .any(|sink| sink.name() == "file" && sink.failing())
    });
    stage
}

/// The derived metrics, also pushed over OTLP when configured.
fn derived_metrics(
    config: &Config,
    otlp_metrics: Option<hermes_config::OtlpMetricsExport>,
) -> anyhow::Result<(Option<OtlpMetricsExport>, DerivedMetrics)> {
    let bounds = config.metrics.bounds();
    Ok(match otlp_metrics {
        Some(hermes_config::OtlpMetricsExport {
            config: otlp, tls, ..
        }) => {
            let (export, meter) = OtlpMetricsExport::start(&otlp, tls, bounds.max_series)
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
    })
}

/// The correlation stage running `steps` between `ingest` and `export`,
/// with the persistent queue's writer in front of it when there is one
/// (its fill probe and metrics added to `probes` and `metrics`, as the
/// sampler's are), and where its live policy changes go.
fn correlation_part(
    config: &Config,
    steps: Steps,
    persistent: Option<(Writer, Recovered)>,
    (ingest, export): (mpsc::Receiver<Ingested>, mpsc::Sender<Outgoing>),
    exporter_stats: &Arc<hermes_exporter::ExporterStats>,
    (probes, metrics): (&mut Vec<QueueProbe>, &mut Vec<Box<dyn Collector>>),
) -> (
    CorrelationPart,
    Option<WriterPart>,
    watch::Sender<Vec<Policy>>,
) {
    let (ledger, writer, ingest) = match persistent {
        None => (Ledger::Memory, None, ingest),
        Some((writer, recovered)) => {
            let (logged_tx, logged_rx) = mpsc::channel(config.receiver.queue_batches);
            let (settle_tx, settle_rx) = mpsc::channel(16);
            let queue = writer.stats();
            probes.push(QueueStats::fill_probe(&queue));
            metrics.push(collector(queue.clone()));
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
                ingest,
                settle: settle_rx,
                out: logged_tx,
            };
            (ledger, Some(part), logged_rx)
        }
    };
    if steps.sampler.is_sampling() {
        metrics.push(collector(steps.sampler.stats()));
    }
    let (policies, updates) = watch::channel(Vec::new());
    let stats = Arc::new(PipelineStats::default());
    let driver = Driver {
        steps,
        tick: config.correlator.tick(),
        stats: stats.clone(),
        ledger,
        clock: WallClock,
        policies: Some(updates),
        session_ends: None,
        settlement: None,
        encoder: None,
    };
    let part = CorrelationPart {
        driver,
        ingest,
        export,
        stats,
    };
    (part, writer, policies)
}

/// The ingest receiver on `listener`, feeding `ingest`.
fn receiver_part(
    config: &Config,
    listen: ListenAddr,
    listener: Listener,
    token: Option<hermes_receiver::BearerToken>,
    receiver_tls: Option<hermes_config::ReceiverTls>,
    ingest: mpsc::Sender<Ingested>,
) -> anyhow::Result<ReceiverPart> {
    let stats = Arc::new(ReceiverStats::default());
    let limits = config.receiver.limits();
    if let ListenAddr::Tcp(addr) = &listen
        && !addr.ip().is_loopback()
        && receiver_tls.is_none()
    {
        tracing::warn!(
            listen = %config.shown(&addr.to_string()),
            authenticated = token.is_some(),
            "the ingest listens beyond loopback in plaintext: events (and the bearer token, if any) can be read on the network; see docs/SECURITY.md"
        );
    }
    let authenticated = token.is_some();
    let memory_limit = config.receiver.memory_limit_bytes().map(|bytes| {
        hermes_receiver::MemoryLimit::new(bytes, hermes_config::settings::MEMORY_LIMIT_INTERVAL)
    });
    let linger = limits.connections.shutdown_linger + Duration::from_millis(500);
    let shutdown = CancellationToken::new();
    let settlements = Arc::new(Settlements::default());
    let ingest = Ingest::new(ingest, limits, stats.clone(), shutdown.clone())
        .with_settlements(settlements.clone())
        .with_token(token)
        .with_delivery(config.queue.delivery())
        .with_memory_limit(memory_limit);
    let shown_listen = config.shown(
        &listener
            .local_addr()
            .context("listener address")?
            .to_string(),
    );
    Ok(ReceiverPart {
        ingest,
        listener,
        shutdown,
        mutual_tls: receiver_tls.as_ref().is_some_and(|t| t.mutual),
        tls: receiver_tls.map(|t| t.server),
        stats,
        settlements,
        replicated: config.fleet.replicated,
        linger,
        authenticated,
        shown_listen,
    })
}

/// Opens the persistent queue (`queue.kind: disk`).
fn open_queue(config: &Config, disk: DiskQueueSettings) -> anyhow::Result<(Writer, Recovered)> {
    let shown = config.shown(&disk.dir.display().to_string());
    let (writer, recovered) = Writer::open(&disk.dir, disk.max_bytes, disk.fsync_interval)
        .with_context(|| format!("queue.dir {shown}"))?;
    tracing::info!(
        dir = %shown,
        records = writer.records(),
        exported_markers = recovered.exported.len(),
        "persistent queue open"
    );
    Ok((writer, recovered))
}
