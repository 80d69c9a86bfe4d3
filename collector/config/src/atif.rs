//! `exporters.atif`: each session written as an ATIF trajectory file.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::{ConfigError, OtlpConfig, OtlpExport, positive};

/// The trajectory exporter. Needs the agents' capture level `content`
/// (`HERMES_COLLECTOR_CAPTURE=content`): a trajectory without messages is
/// of no use, so an agent without them gets no file (logged once per agent).
#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AtifConfig {
    /// Directory the trajectories are written to, one `<session_id>.json`
    /// per session (the id made safe for a file name), written atomically.
    /// It must exist and be writable; the sessions in progress are kept
    /// there too (`<session_id>.partial.jsonl`, an append-only record log), so
    /// a restart continues them.
    pub dir: PathBuf,
    /// A session with no new span for this long is written as it is,
    /// marked incomplete (its agent was killed or lost its connection).
    #[serde(default = "default_idle_ms")]
    pub idle_ms: u64,
    /// Each trajectory file also sent as one OTLP log record to a log
    /// backend: the same keys as `exporters.otlp` (the HTTP path is
    /// `/v1/logs`), its `max_elapsed_secs` bounding the retries of one
    /// record. A record that cannot be sent is counted and logged; the
    /// file is written regardless.
    #[serde(default)]
    pub otlp_logs: Option<OtlpConfig>,
}

fn default_idle_ms() -> u64 {
    300_000
}

impl AtifConfig {
    /// Checks `dir`, `idle_ms` and `otlp_logs`; errors name the key.
    /// Returns the log export's settings (header files and TLS material
    /// read once).
    pub fn validate(&self) -> Result<Option<OtlpExport>, ConfigError> {
        positive("exporters.atif.idle_ms", self.idle_ms)?;
        crate::checks::writable_dir(&self.dir)
            .map_err(|reason| ConfigError::new("exporters.atif.dir", reason))?;
        self.otlp_logs
            .as_ref()
            .map(|logs| logs.validate_at("exporters.atif.otlp_logs"))
            .transpose()
    }

    /// The directory written to.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}
