//! `hermes-collector`: receives the Hermes agent shim's event stream,
//! correlates it into nested spans and exports them.
//!
//! The binary parses the command line, reads the configuration, sets up
//! logging, the process's limits and the runtime, and answers the signals;
//! the stages and their supervisor are `hermes_pipeline`'s
//! ([`Topology`]; see docs/ARCHITECTURE.md).

#![forbid(unsafe_code)]

mod view;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use hermes_config as config;
use hermes_config::{Config, ConfigError, EXIT_CONFIG, SamplingConfig, Validated};
use hermes_pipeline::{Outcome, Topology};

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
    /// Show turns from the embedded default's span file as waterfalls, or
    /// with --session a session's ATIF trajectory as readable steps.
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
        /// Show this session's trajectory (from `--dir`) instead of spans.
        #[arg(long)]
        session: Option<String>,
        /// The trajectory directory (`exporters.atif.dir`).
        #[arg(long, short, requires = "session", default_value = ".")]
        dir: PathBuf,
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
        Some(Command::View {
            session: Some(session),
            dir,
            ..
        }) => shown(view::trajectory(&dir, &session)),
        Some(Command::View {
            file, last, trace, ..
        }) => shown(
            view::read_spans(&file).and_then(|spans| view::render(&spans, last, trace.as_deref())),
        ),
        Some(Command::Run(args)) => run(&args, small_pages),
        None => run(&cli.run, small_pages),
    }
}

/// What `view` made, printed; or its error, on standard error.
fn shown(view: Result<String, impl std::fmt::Display>) -> ExitCode {
    match view {
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

fn exit(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

fn config_failure(e: &ConfigError) -> ExitCode {
    eprintln!("hermes-collector: {e}");
    exit(EXIT_CONFIG)
}

/// Loads the configuration with the CLI overrides applied, validated: its
/// secrets and TLS material are read once, here.
fn load(args: &RunArgs) -> Result<Validated, ConfigError> {
    let mut config = match &args.config {
        Some(path) => Config::parse_file(path)?,
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
                compression_level: None,
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
    config.validate()
}

/// Runs the collector; `small_pages` is why transparent huge pages could not
/// be turned off, if they could not.
fn run(args: &RunArgs, small_pages: Option<String>) -> ExitCode {
    let validated = match load(args) {
        Ok(validated) => validated,
        Err(e) => return config_failure(&e),
    };
    let config = &validated.config;
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
    match runtime.block_on(serve(validated, args.config.clone())) {
        Ok(outcome) => ExitCode::from(outcome.exit_code()),
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

async fn serve(validated: Validated, path: Option<PathBuf>) -> anyhow::Result<Outcome> {
    // First: from here on SIGHUP is answered, never the default exit.
    let mut signals = Signals::install();
    let sampling = validated.config.sampling.is_some();
    let mut topology = Topology::build(validated).await?;
    if let (Some(path), true) = (path, sampling) {
        signals.reload = topology
            .take_policy_updates()
            .map(|policies| Reload { path, policies });
    }
    Ok(topology.run(signals.stop()).await)
}

/// The signals the collector answers: SIGTERM and SIGINT start the drain;
/// SIGHUP re-reads the sampling policies when the collector samples (see
/// [`Reload`]), else it is logged and ignored (restart to apply a changed
/// configuration), so a terminal closing or a stray `kill -HUP` never ends
/// the process without its drain.
struct Signals {
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    hup: Option<tokio::signal::unix::Signal>,
    reload: Option<Reload>,
}

/// A live change of the sampling policies: the `sampling` section re-read
/// from the configuration file. A file that does not parse or whose
/// section is invalid changes nothing (the error, naming the key, is
/// logged); a file without the section keeps every turn. Other sections
/// apply at the next start.
struct Reload {
    path: PathBuf,
    policies: tokio::sync::watch::Sender<Vec<hermes_sampling::Policy>>,
}

impl Reload {
    fn apply(&self) {
        match SamplingConfig::policies_from_file(&self.path) {
            Ok(policies) => {
                let names: Vec<String> = policies.iter().map(|p| p.name.clone()).collect();
                self.policies.send_replace(policies);
                tracing::info!(
                    policies = ?names,
                    "SIGHUP: sampling policies re-read from the configuration file (other sections apply at the next start)"
                );
            }
            Err(e) => tracing::error!(
                error = %e,
                "SIGHUP: the configuration file cannot be used; the sampling policies stay as they were"
            ),
        }
    }
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
                reload: None,
            }
        }
        #[cfg(not(unix))]
        Self { reload: None }
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
                Some(()) = hup => match &self.reload {
                    Some(reload) => reload.apply(),
                    None => tracing::warn!("SIGHUP ignored: the configuration is read at start only (SIGHUP re-reads sampling policies when the collector samples); restart the collector to apply changes"),
                }
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
