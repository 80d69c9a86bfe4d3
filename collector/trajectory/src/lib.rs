//! Session trajectories in ATIF, the Agent Trajectory Interchange Format
//! (schema `ATIF-v1.8`, the `atif` package's models).
//!
//! Input: the processed spans (after attribute sets, redaction and
//! truncation), so a trajectory carries exactly what the span sinks get.
//! Output: one trajectory per top-level session.
//!
//! | module | owns |
//! |---|---|
//! | [`atif`] | the ATIF document types (serde) |
//! | `metrics` | the sink's counters on `/metrics` ([`TrajectoryStats`]) |
//! | [`record`] | a span reduced to what a trajectory needs ([`SpanRecord`]), grouped by session |
//! | [`build`](mod@build) | records of one session → its [`Trajectory`] (pure) |
//! | [`journal`] | a session in progress on disk: its append-only record log, replayed at start |
//! | [`logs`] | each written trajectory as one OTLP log record, and the task that sends them |
//! | [`files`] | the directory's files (partial, trajectory, continuation segments), atomic writes |
//! | [`render`] | a trajectory as readable steps (`hermes-collector view --session`) |
//! | [`sessions`] | sessions in progress: merged per batch, kept on disk, written when ended or idle |
//! | [`sink`] | [`AtifExporter`], the `atif` sink of the exporter stage, and its idle timer |
//! | [`time`] | span times as ISO 8601 |
//!
//! A crate of its own: the stage crates do not depend on one another, and
//! the builder is pure data work that the sink, the `view` command and the
//! tests share.

pub mod atif;
pub mod build;
pub mod files;
pub mod journal;
pub mod logs;
mod metrics;
pub mod record;
pub mod render;
pub mod sessions;
pub mod sink;
pub mod time;

pub use atif::{SCHEMA_VERSION, Trajectory};
pub use build::{Ending, build};
pub use logs::{AtifLogs, Finished};
pub use record::{AgentInfo, Kind, SessionRecords, SpanRecord, records_of};
pub use render::render;
pub use sessions::{END_GRACE_MS, SessionEnd, Sessions, TrajectoryStats};
pub use sink::{AtifExporter, AtifExporterConfig, SessionEnds};

#[cfg(test)]
mod build_tests;
#[cfg(test)]
mod sessions_tests;
