//! Embedded default file exporter: OTLP JSON lines.
//!
//! This module owns [`FileExporter`]. Each export call appends exactly one
//! line to the file: the batch as an `ExportTraceServiceRequest` in the OTLP
//! JSON encoding (`{"resourceSpans":[...]}`, the same shape as `TracesData`,
//! which is what the OpenTelemetry Collector's file exporter and `otlpjsonfile`
//! receiver read). The encoding comes from opentelemetry-proto's `with-serde`
//! derives, which follow the OTLP/JSON rules: camelCase field names, trace and
//! span ids as lowercase hex, enums as integers, 64-bit integers
//! (`startTimeUnixNano`, `intValue`) as decimal strings, bytes as base64.
//! Unset message fields come out as `null`, which protobuf JSON parsers read as
//! the default value. The tests parse the output back and check these rules.
//!
//! Blocking: every export moves the open `std::fs::File` into one
//! `spawn_blocking` call that serializes the batch, writes the line with a
//! single `write_all` and flushes, then hands the file back. One hop to the
//! blocking pool per batch (not per write, as `tokio::fs` would do for each
//! call) keeps serialization of a large batch and a slow disk off the async
//! workers, and the stage's one-export-in-flight-per-sink rule means no two
//! writes ever interleave. If a write task is lost, the next export reopens
//! the file in append mode.
//!
//! Invariant: a line is written whole or reported as failed; a retried batch
//! may appear twice if the first `write_all` failed half-way (the reader sees
//! one invalid line, which OTLP JSON-lines readers skip).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hermes_span::collector::trace::v1::ExportTraceServiceRequest;

use crate::error::ExportError;
use crate::sink::{ExportBatch, ExportFuture, ExportOutcome, SpanExporter};

/// Settings of the file exporter, filled by the binary from its config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileExporterConfig {
    /// File the JSON lines are appended to, created if missing. Its
    /// directory must exist: a mistyped path is an error, not a new tree.
    pub path: PathBuf,
}

/// Appends each batch as one line of OTLP JSON to a file.
#[derive(Debug)]
pub struct FileExporter {
    path: PathBuf,
    /// The path as errors show it (see [`FileExporter::new_shown`]).
    shown: PathBuf,
    file: Option<File>,
}

impl FileExporter {
    /// Opens the file for appending (creating it, not its directory).
    ///
    /// This does blocking file-system calls: call it at startup, before the
    /// pipeline runs (or from a blocking context).
    pub fn new(config: FileExporterConfig) -> Result<Self, ExportError> {
        let shown = config.path.clone();
        Self::new_shown(config, shown)
    }

    /// As [`FileExporter::new`], errors showing the path as `shown` (the
    /// binary passes the path as its configuration file wrote it, so that a
    /// value taken from the environment never reaches a log line).
    pub fn new_shown(config: FileExporterConfig, shown: PathBuf) -> Result<Self, ExportError> {
        let file = open_append(&config.path, &shown)?;
        Ok(Self {
            path: config.path,
            shown,
            file: Some(file),
        })
    }

    /// The path written to.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl SpanExporter for FileExporter {
    fn destination(&self) -> String {
        format!("OTLP JSON lines appended to {}", self.shown.display())
    }

    fn export(&mut self, batch: Arc<ExportBatch>) -> ExportFuture<'_> {
        Box::pin(async move {
            let paths = (self.path.clone(), self.shown.clone());
            let file = self.file.take();
            let (file, result) =
                tokio::task::spawn_blocking(move || write_line(paths, file, batch.request()))
                    .await
                    .map_err(ExportError::Task)?;
            self.file = file;
            result.map(|()| ExportOutcome::default())
        })
    }
}

/// Serializes `request` and appends it as one line to the first of `paths`
/// (errors show the second). Returns the file to keep (None when it could
/// not be opened or a write failed, so the next export reopens it).
fn write_line(
    (path, shown): (PathBuf, PathBuf),
    file: Option<File>,
    request: &ExportTraceServiceRequest,
) -> (Option<File>, Result<(), ExportError>) {
    // OTLP JSON is the serde form of prost's messages.
    let request =
        opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest::from(request);
    let mut line = match serde_json::to_vec(&request) {
        Ok(line) => line,
        Err(e) => return (file, Err(ExportError::Encode(e))),
    };
    line.push(b'\n');
    let mut file = match file {
        Some(file) => file,
        None => match open_append(&path, &shown) {
            Ok(file) => file,
            Err(e) => return (None, Err(e)),
        },
    };
    match file.write_all(&line).and_then(|()| file.flush()) {
        Ok(()) => (Some(file), Ok(())),
        Err(source) => (
            None,
            Err(ExportError::Io {
                path: shown,
                source,
            }),
        ),
    }
}

fn open_append(path: &Path, shown: &Path) -> Result<File, ExportError> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|source| ExportError::Io {
            path: shown.to_owned(),
            source,
        })
}
