//! Embedded default console exporter: one readable tree per finished turn.
//!
//! This module owns [`ConsoleExporter`] and its settings. A *turn* is a trace
//! whose root span (no parent) has arrived; spans are buffered per trace id
//! until then (the `buffer` module states the bounds and eviction policy),
//! and the whole tree is printed at once (the `render` module owns the exact
//! format).
//!
//! Output goes to stdout or to an injected writer. Writes run on the blocking
//! pool (`spawn_blocking`), since a terminal or a pipe may block. Console
//! output is best effort: a failed write is reported as non-retryable (a
//! retry would print the batch a second time, as late spans).

mod buffer;
mod render;

use std::io::Write;
use std::sync::Arc;

use crate::error::ExportError;
use crate::sink::{ExportBatch, ExportFuture, ExportOutcome, SpanExporter};
use buffer::TurnBuffer;

/// Settings of the console exporter, filled by the binary from its config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleExporterConfig {
    /// Most traces buffered while waiting for their root span; beyond it the
    /// oldest is printed as it is, with a note.
    pub max_traces: usize,
    /// Most spans buffered for one trace; beyond it the trace is printed as
    /// it is, with a note, and later spans as late-span lines.
    pub max_spans_per_trace: usize,
    /// How many printed trace ids are remembered to recognise late spans.
    pub max_printed_traces: usize,
    /// ANSI colors (ERROR in red, trace header in bold).
    pub color: bool,
}

impl Default for ConsoleExporterConfig {
    fn default() -> Self {
        Self {
            max_traces: 256,
            max_spans_per_trace: 1024,
            max_printed_traces: 4096,
            color: false,
        }
    }
}

type Writer = Box<dyn Write + Send + 'static>;

/// Prints finished turns as indented trees.
pub struct ConsoleExporter {
    buffer: TurnBuffer,
    /// `None` only while a write is in flight on the blocking pool (or after
    /// that write task was lost, in which case output falls back to stdout).
    writer: Option<Writer>,
}

impl std::fmt::Debug for ConsoleExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsoleExporter").finish_non_exhaustive()
    }
}

impl ConsoleExporter {
    /// A console exporter writing to stdout.
    pub fn stdout(config: ConsoleExporterConfig) -> Self {
        Self::with_writer(config, std::io::stdout())
    }

    /// A console exporter writing to `writer` (tests pass an in-memory one).
    pub fn with_writer(config: ConsoleExporterConfig, writer: impl Write + Send + 'static) -> Self {
        Self {
            buffer: TurnBuffer::new(&config),
            writer: Some(Box::new(writer)),
        }
    }

    async fn write(&mut self, text: String) -> Result<ExportOutcome, ExportError> {
        if text.is_empty() {
            return Ok(ExportOutcome::default());
        }
        let mut writer = self
            .writer
            .take()
            .unwrap_or_else(|| Box::new(std::io::stdout()));
        let (writer, result) = tokio::task::spawn_blocking(move || {
            let result = writer
                .write_all(text.as_bytes())
                .and_then(|()| writer.flush());
            (writer, result)
        })
        .await
        .map_err(ExportError::Task)?;
        self.writer = Some(writer);
        result
            .map(|()| ExportOutcome::default())
            .map_err(ExportError::Console)
    }
}

impl SpanExporter for ConsoleExporter {
    fn destination(&self) -> String {
        "turn trees on the console (standard output)".to_owned()
    }

    fn export(&mut self, batch: Arc<ExportBatch>) -> ExportFuture<'_> {
        Box::pin(async move {
            let text = self.buffer.ingest(batch.request());
            self.write(text).await
        })
    }

    fn shutdown(&mut self) -> ExportFuture<'_> {
        Box::pin(async move {
            let text = self.buffer.flush_all();
            self.write(text).await
        })
    }
}
