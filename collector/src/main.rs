//! `hermes-collector`: receives the Hermes agent shim's event stream,
//! correlates it into nested spans and exports them.
//!
//! Stages, each a task, joined by bounded channels (see docs/ARCHITECTURE.md):
//!
//! ```text
//! shims ─gRPC─▶ receiver ─[ingest: batches]─▶ correlator ─[export: spans]─▶ exporter stage ─▶ sinks
//! ```
//!
//! Only this binary knows all stages; the crates know their seam types only.

#![forbid(unsafe_code)]

mod admin;
mod derived;
mod fault;
mod persist;
mod pipeline;
mod series;
mod view;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use hermes_config as config;
use hermes_config::{Config, ConfigError, EXIT_CONFIG};
use hermes_correlator::sequencer::{Sequencer, SequencerConfig};
use hermes_correlator::{Correlation, Correlator};
use hermes_exporter::Sink;
use hermes_receiver::{Ingest, Limits, ListenAddr, Listener, ReceiverStats};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// mimalloc instead of glibc's malloc: every event and span is a tree of
/// small owned strings and vectors, allocated on one stage's thread and
/// freed on another's, which glibc served with a third of the collector's
/// CPU (see docs/ARCHITECTURE.md, "Dependencies and why").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Turns transparent huge pages off for this process (`prctl(
/// PR_SET_THP_DISABLE)`, which also covers the kernel's `always` mode),
/// unless `MIMALLOC_ALLOW_THP` is set, which then decides as mimalloc reads
/// it. mimalloc asks for huge pages on its heap, and every first touch of
/// one makes the kernel zero 2 MiB: at agents' pace, where a few events
/// arrive at a time, that was a fifth of the collector's CPU and the tail
/// of the export delay; without it the collector uses less CPU per event
/// and less resident memory (`docs/BENCHMARKS.md`). Returns why
/// it could not, for the log.
fn small_pages_only() -> Option<String> {
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_some() {
        return None;
    }
    #[cfg(target_os = "linux")]
    if let Err(e) = rustix::thread::disable_transparent_huge_pages(true) {
        return Some(e.to_string());
    }
    None
}

/// Out-of-process telemetry collector for the Hermes AI agent.
#[derive(Debug, Parser)]
#[command(name = "hermes-collector", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the collector (the default).
    Run(RunArgs),
    /// Check a configuration file and exit: 0 when valid, 64 otherwise.
    Validate {
        /// The YAML file to check.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Print the JSON schema of the configuration file (the checked-in
    /// copy is config/collector.schema.json).
    Schema,
    /// Show turns from the embedded default's span file as waterfalls.
    View {
        /// The span file (OTLP JSON lines).
        #[arg(long, short, default_value = config::DEFAULT_SPAN_FILE)]
        file: PathBuf,
        /// How many of the latest turns.
        #[arg(long, short = 'n', default_value_t = 1)]
        last: usize,
        /// Only the trace whose hex id starts with this.
        #[arg(long)]
        trace: Option<String>,
    },
}

#[derive(Debug, Args, Clone, Default)]
struct RunArgs {
    /// YAML configuration file (see config/collector.yaml). Without it, the
    /// defaults apply: listen on 127.0.0.1:4319, embedded default output.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Override `receiver.listen`.
    #[arg(long)]
    listen: Option<String>,
    /// Override `admin.listen` (health probes and metrics).
    #[arg(long)]
    admin_listen: Option<String>,
    /// Override `exporters.otlp.endpoint` (adds an OTLP exporter).
    #[arg(long)]
    otlp_endpoint: Option<String>,
    /// Override `exporters.otlp.protocol`: grpc or http/protobuf.
    #[arg(long)]
    otlp_protocol: Option<String>,
    /// Override `exporters.file.path` (adds the file exporter).
    #[arg(long)]
    span_file: Option<PathBuf>,
}

fn main() -> ExitCode {
    // Before anything else allocates: a huge page the heap has touched stays.
    let small_pages = small_pages_only();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_CONFIG } else { 0 };
            let _ = e.print();
            return exit(code);
        }
    };
    match cli.command {
        Some(Command::Validate { config }) => match Config::from_file(&config) {
            Ok(_) => {
                println!("{}: valid", config.display());
                ExitCode::SUCCESS
            }
            Err(e) => config_failure(&e),
        },
        Some(Command::Schema) => match config::json_schema() {
            Ok(schema) => {
                println!("{schema}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("hermes-collector schema: {e}");
                ExitCode::FAILURE
            }
        },
        Some(Command::View { file, last, trace }) => {
            match view::read_spans(&file)
                .and_then(|spans| view::render(&spans, last, trace.as_deref()))
            {
                Ok(text) => {
                    print!("{text}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("hermes-collector view: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Some(Command::Run(args)) => run(&args, small_pages),
        None => run(&cli.run, small_pages),
    }
}

fn exit(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

fn config_failure(e: &ConfigError) -> ExitCode {
    eprintln!("hermes-collector: {e}");
    exit(EXIT_CONFIG)
}

/// Loads the configuration with the CLI overrides applied, validated.
fn load(args: &RunArgs) -> Result<Config, ConfigError> {
    let mut config = match &args.config {
        Some(path) => Config::from_file(path)?,
        None => Config::default(),
    };
    if let Some(listen) = &args.listen {
        config.receiver.listen = listen.clone();
    }
    if let Some(listen) = &args.admin_listen {
        config.admin.listen = listen.clone();
    }
    if let Some(endpoint) = &args.otlp_endpoint {
        let otlp = config
            .exporters
            .otlp
            .get_or_insert_with(|| config::OtlpConfig {
                endpoint: String::new(),
                protocol: config::OtlpProtocol::Grpc,
                headers: Default::default(),
                timeout_ms: 10_000,
                compression: Default::default(),
                max_elapsed_secs: 30,
                header_files: Default::default(),
                tls: None,
            });
        otlp.endpoint = endpoint.clone();
    }
    if let Some(protocol) = &args.otlp_protocol {
        let otlp = config.exporters.otlp.as_mut().ok_or_else(|| ConfigError {
            path: "--otlp-protocol".into(),
            reason: "needs an OTLP endpoint (--otlp-endpoint or exporters.otlp)".into(),
        })?;
        otlp.protocol = match protocol.as_str() {
            "grpc" => config::OtlpProtocol::Grpc,
            "http/protobuf" | "http" => config::OtlpProtocol::HttpProtobuf,
            other => {
                return Err(ConfigError {
                    path: "--otlp-protocol".into(),
                    reason: format!("`{other}` is neither grpc nor http/protobuf"),
                });
            }
        };
    }
    if let Some(path) = &args.span_file {
        config.exporters.file = Some(config::FileConfig { path: path.clone() });
    }
    config.validate()?;
    Ok(config)
}

/// Runs the collector; `small_pages` is why transparent huge pages could not
/// be turned off, if they could not.
fn run(args: &RunArgs, small_pages: Option<String>) -> ExitCode {
    let config = match load(args) {
        Ok(config) => config,
        Err(e) => return config_failure(&e),
    };
    init_logging(&config.log);
    if let Some(error) = small_pages {
        tracing::warn!(%error, "cannot turn transparent huge pages off; running with them");
    }
    open_file_room(config.receiver.max_connections);
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all().thread_name("hermes-collector");
    if config.runtime.worker_threads > 0 {
        builder.worker_threads(config.runtime.worker_threads);
    }
    let runtime = match builder.build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(config)) {
        Ok(Outcome::Clean) => ExitCode::SUCCESS,
        Ok(Outcome::LostInDrain) => ExitCode::from(EXIT_LOST_IN_DRAIN),
        Ok(Outcome::StageFailed) => ExitCode::from(EXIT_STAGE_FAILED),
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "collector stopped");
            ExitCode::FAILURE
        }
    }
}

/// File descriptors the collector needs besides its ingest connections:
/// the listeners, the admin server's connections, the span file, the
/// exporters' connections, the persistent queue, the runtime's own.
const FDS_BESIDES_CONNECTIONS: u64 = 256;

/// Raises the soft limit on open files to the hard one, so that
/// `receiver.max_connections` ingest connections fit beside everything
/// else; warns when they still do not (the ingest then meets `EMFILE`
/// before its own limit, which it survives, but new connections wait).
fn open_file_room(max_connections: usize) {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let mut soft = limit.current;
    if limit.current < limit.maximum {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => soft = limit.maximum,
            Err(e) => tracing::debug!(error = %e, "cannot raise the open-file limit"),
        }
    }
    let needed = (max_connections as u64).saturating_add(FDS_BESIDES_CONNECTIONS);
    if let Some(soft) = soft
        && soft < needed
    {
        tracing::warn!(
            open_file_limit = soft,
            max_connections,
            "the open-file limit is below receiver.max_connections plus {FDS_BESIDES_CONNECTIONS}; lower receiver.max_connections or raise the limit (ulimit -n)"
        );
    }
}

fn init_logging(log: &config::LogConfig) {
    use tracing_subscriber::EnvFilter;
    // Never log per-request internals of the transport libraries.
    let base = std::env::var("RUST_LOG").unwrap_or_else(|_| log.level.clone());
    let directive = format!("{base},h2=warn,hyper=warn,hyper_util=warn,tonic=warn,tower=warn");
    let filter = EnvFilter::try_new(&directive).unwrap_or_else(|_| EnvFilter::new("info"));
    // Colors only for a terminal: piped or collected logs stay plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let _ = match log.format {
        config::LogFormat::Json => builder.json().try_init(),
        config::LogFormat::Text => builder.try_init(),
    };
}

/// Builds the sinks the configuration names (the embedded default when none).
fn build_sinks(config: &Config) -> anyhow::Result<Vec<Sink>> {
    use hermes_exporter::{
        ConsoleExporter, ConsoleExporterConfig, FileExporter, FileExporterConfig,
    };
    let mut sinks = Vec::new();
    let embedded = config.is_embedded_default();
    if let Some(otlp) = &config.exporters.otlp {
        let timeout = Duration::from_millis(otlp.timeout_ms);
        // Read again (validated before): header files and TLS material.
        let headers = otlp.all_headers()?;
        let tls = otlp.tls_settings()?;
        tracing::info!(
            tls = tls.is_some(),
            custom_ca = tls.as_ref().is_some_and(|t| t.ca_pem.is_some()),
            client_certificate = tls.as_ref().is_some_and(|t| t.client_cert_pem.is_some()),
            headers = headers.len(),
            "OTLP exporter"
        );
        match otlp.protocol {
            config::OtlpProtocol::Grpc => {
                let exporter = hermes_exporter::GrpcExporter::new_with_tls(
                    hermes_exporter::GrpcExporterConfig {
                        endpoint: otlp.endpoint.clone(),
                        timeout,
                        connect_timeout: timeout.min(Duration::from_secs(5)),
                        compression: match otlp.compression {
                            config::CompressionConfig::None => hermes_exporter::Compression::None,
                            config::CompressionConfig::Gzip => hermes_exporter::Compression::Gzip,
                        },
                        headers,
                    },
                    tls,
                )
                .context("OTLP gRPC exporter")?;
                sinks.push(Sink::new("otlp_grpc", exporter));
            }
            config::OtlpProtocol::HttpProtobuf => {
                let exporter = hermes_exporter::HttpExporter::new_with_tls(
                    hermes_exporter::HttpExporterConfig {
                        endpoint: otlp.endpoint.clone(),
                        timeout,
                        headers,
                    },
                    tls,
                )
                .context("OTLP HTTP exporter")?;
                sinks.push(Sink::new("otlp_http", exporter));
            }
        }
    }
    if let Some(path) = config.span_file() {
        // As the configuration file wrote it: never a value from `${VAR}`.
        let shown = PathBuf::from(config.shown(&path.display().to_string()));
        let exporter = FileExporter::new_shown(FileExporterConfig { path }, shown)
            .context("exporters.file.path")?;
        sinks.push(Sink::new("file", exporter));
    }
    let console = match &config.exporters.console {
        Some(c) => c.enabled,
        None => embedded,
    };
    if console {
        sinks.push(Sink::new(
            "console",
            ConsoleExporter::stdout(ConsoleExporterConfig::default()),
        ));
    }
    for sink in &sinks {
        tracing::info!(exporter = sink.name(), destination = %sink.destination(), "exporting spans");
    }
    Ok(sinks)
}

async fn serve(config: Config) -> anyhow::Result<Outcome> {
    // First: from here on SIGHUP is answered, never the default exit.
    let mut signals = Signals::install();
    let listen = config.receiver.listen_addr()?;
    // Read again (validated before): the token lives only in the service.
    let token = config
        .receiver
        .auth
        .token(&|name| std::env::var(name).ok())?;
    let metrics_token = config
        .admin
        .metrics_auth
        .token_at("admin.metrics_auth", &|name| std::env::var(name).ok())?;
    let metrics_authenticated = metrics_token.is_some();
    let tls = match &config.receiver.tls {
        Some(tls) => Some(tls.server_config()?),
        None => None,
    };
    let mutual_tls = config
        .receiver
        .tls
        .as_ref()
        .is_some_and(|t| t.client_ca_file.is_some());
    let sinks = build_sinks(&config)?;
    let processor =
        hermes_processor::SpanProcessor::new(&config.processing).context("processing")?;
    let shutdown = CancellationToken::new();
    let exporter_shutdown = CancellationToken::new();
    let persistent = match config.queue.kind {
        config::QueueKind::Memory => None,
        config::QueueKind::Disk => {
            let dir = &config.queue.dir;
            let (writer, recovered) = persist::Writer::open(
                dir,
                config.queue.max_bytes,
                Duration::from_millis(config.queue.fsync_interval_ms),
            )
            .with_context(|| format!("queue.dir {}", config.shown(&dir.display().to_string())))?;
            tracing::info!(
                dir = %config.shown(&dir.display().to_string()),
                records = writer.len(),
                exported_markers = recovered.exported.len(),
                "persistent queue open"
            );
            Some((writer, recovered))
        }
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
    let readiness = Arc::new(admin::Readiness::default());
    let admin_shutdown = CancellationToken::new();

    let (ingest_tx, ingest_rx) = mpsc::channel(config.receiver.queue_batches);
    // With the persistent queue, the writer sits between the receiver and the
    // pipeline.
    let (writer_io, pipeline_rx) = match &persistent {
        Some(_) => {
            let (tx, rx) = mpsc::channel(config.receiver.queue_batches);
            (Some((ingest_rx, tx)), rx)
        }
        None => (None, ingest_rx),
    };
    let (export_tx, export_rx) = mpsc::channel(config.batch.queue);
    readiness.require(
        "the exporter queue is closed",
        admin::Readiness::channel_open(&export_tx),
    );
    let queues = vec![
        admin::QueueProbe::from_sender("ingest", &ingest_tx),
        admin::QueueProbe::from_sender("export", &export_tx),
    ];
    let persistent_stats = persistent.as_ref().map(|(writer, _)| writer.stats());

    let settings = hermes_exporter::ExporterSettings {
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
    };
    let stage = hermes_exporter::ExporterStage::new(sinks, settings);
    let exporter_stats = stage.stats();
    let drain_deadline = stage.drain_deadline();
    // A span file that cannot be written (a full disk): not ready while its
    // last batch failed, so probes say what the counters and log say.
    readiness.require("the span file cannot be written", {
        let stats = exporter_stats.clone();
        move || {
            !stats
                .sinks()
                .iter()
                .any(|sink| sink.name() == "file" && sink.failing())
        }
    });
    let exporter = tokio::spawn(fault::stage(
        "exporter",
        stage.run(export_rx, exporter_shutdown.clone()),
        {
            let stats = exporter_stats.clone();
            move || stats
        },
    ));
    readiness.set_exporter_running(true);

    let correlator = Correlator::new(hermes_correlator::Config {
        max_open_turns: config.correlator.max_open_turns,
        max_open_turns_per_agent: config.correlator.max_open_turns_per_agent,
        max_sessions_per_agent: config.correlator.max_sessions_per_agent,
        max_sessions: config.correlator.max_sessions,
        max_bytes_per_agent: config.correlator.max_bytes_per_agent,
        max_bytes: config.correlator.max_bytes,
        state_ttl_nanos: config
            .correlator
            .state_ttl_secs
            .saturating_mul(1_000_000_000),
        turn_end_grace_nanos: config
            .correlator
            .turn_end_grace_ms
            .saturating_mul(1_000_000),
        ..Default::default()
    });
    let pipeline_stats = Arc::new(pipeline::PipelineStats::default());
    // The derived metrics, also pushed over OTLP when configured.
    let bounds = config.metrics.bounds();
    let (metrics_export, derived) = match &config.exporters.otlp_metrics {
        Some(otlp) => {
            let tls = otlp.tls_settings()?;
            let (export, meter) = derived::OtlpMetricsExport::start(otlp, tls, bounds.max_series)
                .context("OTLP metrics exporter")?;
            tracing::info!(
                destination = %hermes_exporter::shown_endpoint(&config.shown(&otlp.endpoint)),
                protocol = ?otlp.protocol,
                interval_ms = otlp.interval_ms,
                "exporting the derived metrics over OTLP"
            );
            let derived = derived::DerivedMetrics::new(bounds).with_meter(&meter);
            (Some(export), derived)
        }
        None => (None, derived::DerivedMetrics::new(bounds)),
    };
    let sequencer = Sequencer::new(SequencerConfig {
        gap_timeout_nanos: config.correlator.gap_timeout_ms.saturating_mul(1_000_000),
        ..Default::default()
    });
    let (tracker, writer) = match (persistent, writer_io) {
        (Some((writer, recovered)), Some((writer_rx, pipeline_tx))) => {
            let (settle_tx, settle_rx) = mpsc::channel(16);
            let tracker = pipeline::Tracker::new(pipeline::Durable {
                settle: settle_tx,
                exporter: exporter_stats.clone(),
                recovered,
                queue: writer.stats(),
            });
            let task = tokio::spawn(writer.run(writer_rx, settle_rx, pipeline_tx));
            (Some(tracker), Some(task))
        }
        _ => (None, None),
    };
    let pipeline_stop = CancellationToken::new();
    let pipeline = tokio::spawn(fault::stage(
        "correlator",
        pipeline::run(
            pipeline_rx,
            export_tx,
            pipeline::Steps {
                correlation: Correlation::new(sequencer, correlator),
                derived: derived.clone(),
                processor,
            },
            Duration::from_millis(config.correlator.tick_ms),
            pipeline_stats.clone(),
            tracker,
            pipeline_stop.clone(),
        ),
        || None,
    ));

    let receiver_stats = Arc::new(ReceiverStats::default());
    let limits = Limits {
        max_message_bytes: config.receiver.max_message_bytes,
        max_events_per_batch: config.receiver.max_events_per_batch,
        max_event_bytes: config.receiver.max_event_bytes,
        stream_events_per_sec: config.receiver.stream_events_per_sec,
        stream_burst_events: config.receiver.stream_burst_events,
        max_streams_per_connection: config.receiver.max_streams_per_connection,
        connections: hermes_receiver::ConnectionLimits {
            max_connections: config.receiver.max_connections,
            handshake_timeout: Duration::from_millis(config.receiver.handshake_timeout_ms),
            idle_timeout: Duration::from_secs(config.receiver.idle_timeout_secs),
            ..Default::default()
        },
        ..Limits::default()
    };
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
    let ingest = Ingest::new(
        ingest_tx,
        limits.clone(),
        receiver_stats.clone(),
        shutdown.clone(),
    )
    .with_token(token)
    .with_delivery(delivery)
    .with_memory_limit(memory_limit);
    let admin_state = admin::AdminState::new(
        receiver_stats.clone(),
        pipeline_stats.clone(),
        exporter_stats.clone(),
        readiness.clone(),
        queues,
        &derived,
        persistent_stats,
    )
    .with_metrics_token(metrics_token);
    let admin_local = admin_listener.local_addr().context("admin address")?;
    let admin_task = tokio::spawn(admin::serve(
        admin_listener,
        admin_state,
        admin_shutdown.clone(),
    ));
    // `listen` last: tests read the address to the end of the line.
    tracing::info!(
        metrics_auth = metrics_authenticated,
        listen = %config.shown(&admin_local.to_string()),
        "serving /livez, /readyz, /metrics"
    );
    let local = listener.local_addr().context("listener address")?;
    readiness.set_receiver_bound(true);
    tracing::info!(
        listen = %config.shown(&local.to_string()),
        worker_threads = tokio::runtime::Handle::current().metrics().num_workers(),
        authenticated,
        tls = tls.is_some(),
        mutual_tls,
        "receiving Hermes events"
    );
    let serving = ingest.serve(listener, tls, shutdown.clone());
    let server = tokio::spawn({
        let readiness = readiness.clone();
        async move {
            let served = serving.await;
            // Not ready once the ingest stopped, whatever the reason.
            readiness.set_receiver_bound(false);
            served
        }
    });

    let mut stages = Stages {
        server: Some(server),
        pipeline: Some(pipeline),
        exporter: Some(exporter),
        admin: Some(admin_task),
    };
    let stage_died = tokio::select! {
        () = signals.stop() => None,
        died = stages.first_to_end() => Some(died),
    };
    match stage_died {
        Some(stage) => readiness.set_failed(stage),
        None => readiness.set_draining(),
    }
    let grace = Duration::from_millis(config.shutdown.grace_ms);
    let deadline = tokio::time::Instant::now() + grace;
    drain_deadline.set(deadline);
    let failed_before = spans_failed(&exporter_stats);
    match stage_died {
        None => tracing::info!(
            grace_ms = config.shutdown.grace_ms,
            "shutting down: draining"
        ),
        Some(stage) => tracing::error!(
            stage,
            grace_ms = config.shutdown.grace_ms,
            "a stage of the pipeline stopped; draining what is left and exiting"
        ),
    }
    // 1. Stop accepting: streams end with UNAVAILABLE, the listener closes,
    //    and connections still open after the linger are closed. The drain
    //    never waits on a client beyond that.
    shutdown.cancel();
    let linger = limits.connections.shutdown_linger + Duration::from_millis(500);
    let receiver_deadline = deadline.min(tokio::time::Instant::now() + linger);
    if let Some(server) = stages.server.as_mut() {
        match tokio::time::timeout_at(receiver_deadline, &mut *server).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "receiver ended with an error"),
            Ok(Err(e)) => tracing::error!(error = %e, "receiver task failed"),
            Err(_) => {
                tracing::warn!("ingest connections did not close; dropping them");
                server.abort();
            }
        }
    }
    // 2. The correlator takes what is queued and closes what is open
    //    (whoever still holds an ingest sender); dropping its export sender
    //    lets the exporter stage drain.
    pipeline_stop.cancel();
    let mut lost_open_turns = 0;
    let ended = match stages.pipeline.as_mut() {
        // The correlator ended on its own: its open turns went with it.
        None => {
            lost_open_turns = pipeline_stats.open_turns.load(Ordering::Relaxed);
            None
        }
        Some(pipeline) => match tokio::time::timeout_at(deadline, &mut *pipeline).await {
            Ok(Ok(ended)) => ended,
            Ok(Err(e)) => {
                tracing::error!(error = %e, "correlator task failed; its open turns are lost");
                lost_open_turns = pipeline_stats.open_turns.load(Ordering::Relaxed);
                None
            }
            Err(_) => {
                lost_open_turns = pipeline_stats.open_turns.load(Ordering::Relaxed);
                tracing::error!(
                    open_turns = lost_open_turns,
                    "correlator did not drain within the grace period; its open turns are lost"
                );
                pipeline.abort();
                None
            }
        },
    };
    // Everything is recorded: the derived metrics' last OTLP export runs
    // beside the exporters' drain, bounded by the same deadline.
    let metrics_flush = metrics_export.map(|export| tokio::spawn(export.shutdown(deadline)));
    // 3. Exporters drain until the deadline; what they could not export is
    //    counted as failed before the stage returns (it ends by the deadline
    //    set above, plus a moment to count).
    exporter_shutdown.cancel();
    if let Some(exporter) = stages.exporter.as_mut()
        && tokio::time::timeout_at(deadline + Duration::from_secs(2), &mut *exporter)
            .await
            .is_err()
    {
        tracing::error!("exporter stage did not stop; unexported spans are lost");
        exporter.abort();
    }
    if let Some(flush) = metrics_flush {
        let _ = flush.await;
    }
    // 4. The persistent queue learns what was exported and keeps the rest
    //    (open turns, unexported spans) for the next start.
    if let Some((tracker, open)) = ended {
        tracker.finish(open).await;
    }
    if let Some(writer) = writer
        && tokio::time::timeout(Duration::from_secs(5), writer)
            .await
            .is_err()
    {
        tracing::error!(
            "persistent queue writer did not stop; the next start replays what it held"
        );
    }
    // The admin server goes last: /livez answers and /readyz says 503
    // throughout the drain.
    admin_shutdown.cancel();
    if let Some(admin) = stages.admin.as_mut() {
        let _ = admin.await;
    }
    let sent: u64 = exporter_stats.sinks().iter().map(|s| s.spans_sent()).sum();
    let failed = spans_failed(&exporter_stats);
    let lost_in_drain = failed.saturating_sub(failed_before);
    tracing::info!(
        events = receiver_stats.events_accepted.load(Ordering::Relaxed),
        spans = pipeline_stats.spans.load(Ordering::Relaxed),
        spans_sent = sent,
        spans_failed = failed,
        "stopped"
    );
    if stage_died.is_some() {
        return Ok(Outcome::StageFailed);
    }
    if lost_in_drain > 0 || lost_open_turns > 0 {
        tracing::error!(
            spans = lost_in_drain,
            open_turns = lost_open_turns,
            "the drain could not export everything within shutdown.grace_ms; these are lost"
        );
        return Ok(Outcome::LostInDrain);
    }
    Ok(Outcome::Clean)
}

/// How a run ended, for the exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Stopped by a signal; everything drained.
    Clean,
    /// Stopped by a signal; some spans or open turns could not be exported
    /// within the grace.
    LostInDrain,
    /// A stage stopped on its own (failed or panicked); drained what was
    /// left.
    StageFailed,
}

/// Exit code of a drain that lost spans (`EX_TEMPFAIL`: a later run with a
/// longer grace or a reachable backend would not).
const EXIT_LOST_IN_DRAIN: u8 = 75;
/// Exit code when a stage stopped on its own (`EX_SOFTWARE`).
const EXIT_STAGE_FAILED: u8 = 70;

fn spans_failed(stats: &hermes_exporter::ExporterStats) -> u64 {
    stats.sinks().iter().map(|s| s.spans_failed()).sum()
}

/// The long-running tasks of the pipeline; the process drains and exits
/// when any of them ends on its own. A task that has ended is `None`: its
/// handle is never polled again.
struct Stages {
    server: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
    pipeline: Option<JoinHandle<pipeline::Ended>>,
    exporter: Option<JoinHandle<Arc<hermes_exporter::ExporterStats>>>,
    admin: Option<JoinHandle<std::io::Result<()>>>,
}

impl Stages {
    /// Waits until a stage ends before shutdown asked it to, and names it
    /// (logging how it ended).
    async fn first_to_end(&mut self) -> &'static str {
        let (stage, how) = tokio::select! {
            r = join(&mut self.server) => ("receiver", describe(r.map(|r| r.map_err(|e| e.to_string())))),
            r = join(&mut self.pipeline) => ("correlator", describe(r.map(|_| Ok(())))),
            r = join(&mut self.exporter) => ("exporter", describe(r.map(|_| Ok(())))),
            r = join(&mut self.admin) => ("admin", describe(r.map(|r| r.map_err(|e| e.to_string())))),
        };
        tracing::error!(stage, how, "a pipeline stage ended on its own");
        stage
    }
}

/// Waits for the task in `handle` and takes it; pending forever when the
/// task has already been joined.
async fn join<T>(handle: &mut Option<JoinHandle<T>>) -> Result<T, tokio::task::JoinError> {
    let Some(task) = handle.as_mut() else {
        return std::future::pending().await;
    };
    let joined = task.await;
    *handle = None;
    joined
}

fn describe(joined: Result<Result<(), String>, tokio::task::JoinError>) -> String {
    match joined {
        Ok(Ok(())) => "returned".to_owned(),
        Ok(Err(e)) => format!("failed: {e}"),
        Err(e) if e.is_panic() => "panicked".to_owned(),
        Err(e) => format!("was cancelled: {e}"),
    }
}

/// The signals the collector answers: SIGTERM and SIGINT start the drain;
/// SIGHUP is logged and ignored (a reload is not supported: restart to
/// apply a changed configuration), so a terminal closing or a stray
/// `kill -HUP` never ends the process without its drain.
struct Signals {
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    hup: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    /// Installs the handlers; from here on those signals no longer end the
    /// process by their default action.
    fn install() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Self {
                term: signal(SignalKind::terminate()).ok(),
                hup: signal(SignalKind::hangup()).ok(),
            }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// Returns at SIGTERM or SIGINT.
    async fn stop(&mut self) {
        #[cfg(unix)]
        loop {
            let term = async {
                match self.term.as_mut() {
                    Some(term) => {
                        term.recv().await;
                    }
                    None => std::future::pending().await,
                }
            };
            let hup = async {
                match self.hup.as_mut() {
                    Some(hup) => hup.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = term => return,
                _ = tokio::signal::ctrl_c() => return,
                Some(()) = hup => {
                    tracing::warn!("SIGHUP ignored: the configuration is read at start only; restart the collector to apply changes");
                }
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
