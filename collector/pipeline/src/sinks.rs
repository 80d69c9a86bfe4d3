//! The exporter stage's sinks, as the configuration names them.

use std::path::PathBuf;

use anyhow::Context as _;
use hermes_config as config;
use hermes_config::Validated;
use hermes_exporter::Sink;

/// How many session ends may wait for the trajectory sink.
const SESSION_ENDS: usize = 1024;

/// What the rest of the topology connects to the trajectory sink.
pub struct TrajectorySink {
    /// The sender of the session ends the sink takes.
    pub ends: SessionEnds,
    /// Its counters, for `/metrics`.
    pub stats: std::sync::Arc<hermes_trajectory::TrajectoryStats>,
}

/// Builds the sinks the configuration names (the embedded default when
/// none), and with `exporters.atif` what connects to its trajectory sink.
pub fn build_sinks(validated: &Validated) -> anyhow::Result<(Vec<Sink>, Option<TrajectorySink>)> {
    let config = &validated.config;
    use hermes_exporter::{
        ConsoleExporter, ConsoleExporterConfig, FileExporter, FileExporterConfig,
    };
    let mut sinks = Vec::new();
    let embedded = config.is_embedded_default();
    if let Some(otlp) = &validated.otlp {
        tracing::info!(
            tls = otlp.tls.is_some(),
            custom_ca = otlp.tls.as_ref().is_some_and(|t| t.ca_pem.is_some()),
            client_certificate = otlp
                .tls
                .as_ref()
                .is_some_and(|t| t.client_cert_pem.is_some()),
            headers = otlp.headers.len(),
            "OTLP exporter"
        );
        match otlp.protocol {
            config::OtlpProtocol::Grpc => {
                let exporter =
                    hermes_exporter::GrpcExporter::new_with_tls(otlp.grpc(), otlp.tls.clone())
                        .context("OTLP gRPC exporter")?;
                sinks.push(Sink::new("otlp_grpc", exporter));
            }
            config::OtlpProtocol::HttpProtobuf => {
                let exporter =
                    hermes_exporter::HttpExporter::new_with_tls(otlp.http(), otlp.tls.clone())
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
    let mut trajectories = None;
    if let Some(atif) = &config.exporters.atif {
        let (tx, rx) = tokio::sync::mpsc::channel(SESSION_ENDS);
        let logs = match (&validated.atif_logs, &atif.otlp_logs) {
            (Some(export), Some(logs)) => Some(hermes_trajectory::AtifLogs {
                exporter: match export.protocol {
                    config::OtlpProtocol::Grpc => {
                        hermes_exporter::LogsExporter::grpc(export.grpc(), export.tls.clone())
                    }
                    config::OtlpProtocol::HttpProtobuf => {
                        hermes_exporter::LogsExporter::http(export.http(), export.tls.clone())
                    }
                }
                .context("exporters.atif.otlp_logs")?,
                retry: hermes_exporter::RetrySettings {
                    max_elapsed: std::time::Duration::from_secs(logs.max_elapsed_secs),
                    ..Default::default()
                },
            }),
            _ => None,
        };
        let exporter = hermes_trajectory::AtifExporter::new(
            hermes_trajectory::AtifExporterConfig {
                dir: atif.dir.clone(),
                idle_ms: atif.idle_ms,
            },
            Some(rx),
            logs,
        )
        .context("exporters.atif.dir")?;
        trajectories = Some(TrajectorySink {
            ends: SessionEnds::new(tx, exporter.stats()),
            stats: exporter.stats(),
        });
        sinks.push(Sink::new("atif", exporter));
    }
    for sink in &sinks {
        tracing::info!(exporter = sink.name(), destination = %sink.destination(), "exporting spans");
    }
    Ok((sinks, trajectories))
}

/// Where the correlation stage reports the sessions their host ended.
pub use hermes_trajectory::SessionEnds;
