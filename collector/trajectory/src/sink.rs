//! The `atif` sink: [`AtifExporter`] hands each exported batch to the
//! [`Sessions`] of the trajectory directory and, on a timer of its own,
//! writes the sessions that went idle.
//!
//! Each batch is merged and its sessions' partial files written on the
//! blocking pool before `export` returns, so the exporter stage's
//! `done_through` for this sink means "on disk" (see [`crate::sessions`]).
//! A failed write is an I/O error the stage retries; merging again is
//! harmless, a span seen twice replaces its first copy.
//!
//! With `otlp_logs`, a second task sends each written trajectory as an
//! OTLP log record ([`crate::logs`]); it is stopped with the timer.
//!
//! The timer is a task started with the exporter and stopped by
//! [`SpanExporter::shutdown`]: it takes the session ends the correlation
//! stage reports ([`SessionEnds`]: a bounded channel; an end lost there
//! leaves the session to its idle time, counted) and writes the sessions that are due. The sessions
//! still in progress at the stop stay in their partial files for the next
//! start.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hermes_exporter::{ExportBatch, ExportError, ExportFuture, ExportOutcome, SpanExporter};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::logs::{AtifLogs, OUTBOX, sender};
use crate::sessions::{SessionEnd, Sessions, TrajectoryStats};

/// The sending end of the session ends the correlation stage reports to
/// the sink. It never waits: an end that does not fit the bounded channel
/// is lost, and its session is written at its idle time instead, marked
/// incomplete; each such loss is counted
/// (`hermes_collector_trajectory_session_ends_lost_total`), the first
/// logged as a warning.
#[derive(Debug, Clone)]
pub struct SessionEnds {
    tx: tokio::sync::mpsc::Sender<SessionEnd>,
    stats: Arc<TrajectoryStats>,
}

impl SessionEnds {
    /// Ends sent on `tx`, losses counted in `stats` (the sink's).
    pub fn new(tx: tokio::sync::mpsc::Sender<SessionEnd>, stats: Arc<TrajectoryStats>) -> Self {
        Self { tx, stats }
    }

    /// Hands `end` to the sink without waiting. A closed channel (the sink
    /// stopped, at shutdown) loses nothing it would still write.
    pub fn hand(&self, end: SessionEnd) {
        match self.tx.try_send(end) {
            Ok(()) => {}
            Err(tokio::sync::mpsc::error::TrySendError::Full(_)) => {
                let before = self.stats.session_ends_lost.fetch_add(1, Ordering::Relaxed);
                if before == 0 {
                    tracing::warn!(
                        "a session end did not fit the trajectory sink's queue: the session is written at its idle time, marked incomplete (further losses are counted in /metrics only)"
                    );
                } else {
                    tracing::debug!("session end lost; its idle time applies");
                }
            }
            Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) => {
                tracing::debug!("session end after the trajectory sink stopped");
            }
        }
    }
}

/// Longest wait between two looks for idle sessions.
const MAX_TICK: Duration = Duration::from_secs(1);

/// Settings of the trajectory exporter, filled from `exporters.atif`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AtifExporterConfig {
    /// The directory the trajectories are written to (it exists).
    pub dir: PathBuf,
    /// Idle time after which a session is written as incomplete.
    pub idle_ms: u64,
}

/// Writes each session as an ATIF trajectory file.
#[derive(Debug)]
pub struct AtifExporter {
    dir: PathBuf,
    sessions: Arc<Mutex<Sessions>>,
    stats: Arc<TrajectoryStats>,
    stop: CancellationToken,
    timer: Option<JoinHandle<()>>,
    /// The log records' sender, with `otlp_logs`.
    sender: Option<JoinHandle<()>>,
}

impl AtifExporter {
    /// Opens the directory (reloading the sessions in progress) and starts
    /// the timer on the current tokio runtime, taking session ends from
    /// `ends` when given; with `logs`, starts the task sending each
    /// written trajectory as an OTLP log record.
    pub fn new(
        config: AtifExporterConfig,
        ends: Option<tokio::sync::mpsc::Receiver<SessionEnd>>,
        logs: Option<AtifLogs>,
    ) -> Result<Self, ExportError> {
        let io = |source| ExportError::Io {
            path: config.dir.clone(),
            source,
        };
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|e| io(std::io::Error::other(e)))?;
        let mut sessions = Sessions::open(&config.dir, config.idle_ms).map_err(io)?;
        let stats = sessions.stats();
        let stop = CancellationToken::new();
        let sender = logs.map(|logs| {
            let (tx, rx) = tokio::sync::mpsc::channel(OUTBOX);
            sessions.send_to(tx);
            runtime.spawn(sender(logs, rx, stats.clone(), stop.clone()))
        });
        let sessions = Arc::new(Mutex::new(sessions));
        let tick = Duration::from_millis((config.idle_ms / 4).max(1)).min(MAX_TICK);
        let timer = runtime.spawn(timer(
            sessions.clone(),
            config.dir.clone(),
            tick,
            ends,
            stop.clone(),
        ));
        Ok(Self {
            dir: config.dir,
            sessions,
            stats,
            stop,
            timer: Some(timer),
            sender,
        })
    }

    /// The exporter's counters.
    pub fn stats(&self) -> Arc<TrajectoryStats> {
        self.stats.clone()
    }
}

impl SpanExporter for AtifExporter {
    fn destination(&self) -> String {
        format!("ATIF trajectories in {}", self.dir.display())
    }

    fn export(&mut self, batch: Arc<ExportBatch>) -> ExportFuture<'_> {
        Box::pin(async move {
            let sessions = self.sessions.clone();
            let dir = self.dir.clone();
            tokio::task::spawn_blocking(move || {
                let mut sessions = sessions.lock().map_err(|_| poisoned(&dir))?;
                sessions
                    .add(&batch.request().resource_spans, now_ms())
                    .map_err(|source| ExportError::Io { path: dir, source })
            })
            .await
            .map_err(ExportError::Task)??;
            Ok(ExportOutcome::default())
        })
    }

    fn shutdown(&mut self) -> ExportFuture<'_> {
        Box::pin(async move {
            self.stop.cancel();
            if let Some(timer) = self.timer.take() {
                let _ = timer.await;
            }
            if let Some(sender) = self.sender.take() {
                let _ = sender.await;
            }
            Ok(ExportOutcome::default())
        })
    }
}

impl Drop for AtifExporter {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Until `stop`: marks the sessions `ends` names as ended, and every
/// `tick` writes those that are due. A failed write is logged; the session
/// stays in progress and the next tick tries again.
async fn timer(
    sessions: Arc<Mutex<Sessions>>,
    dir: PathBuf,
    tick: Duration,
    mut ends: Option<tokio::sync::mpsc::Receiver<SessionEnd>>,
    stop: CancellationToken,
) {
    loop {
        let end = async {
            match ends.as_mut() {
                Some(rx) => rx.recv().await,
                None => std::future::pending().await,
            }
        };
        let ended = tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(tick) => None,
            end = end => match end {
                Some(end) => Some(end),
                None => {
                    // The correlation stage is gone: no more ends.
                    ends = None;
                    continue;
                }
            },
        };
        let sessions = sessions.clone();
        let dir = dir.clone();
        let result = tokio::task::spawn_blocking(move || match sessions.lock() {
            Ok(mut sessions) => match ended {
                Some(end) => sessions.end(&end, now_ms()),
                None => sessions.write_due(now_ms()).map(|_| ()),
            },
            Err(_) => Err(std::io::Error::other(poisoned(&dir))),
        })
        .await;
        match result {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%error, "trajectory not written; retried"),
            Err(error) => tracing::warn!(%error, "trajectory task failed; retried"),
        }
    }
}

fn poisoned(dir: &std::path::Path) -> ExportError {
    ExportError::Io {
        path: dir.to_owned(),
        source: std::io::Error::other("the trajectory sessions' lock is poisoned"),
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn end(session: &str) -> SessionEnd {
        SessionEnd {
            instance_id: "i-1".into(),
            session_id: session.into(),
        }
    }

    #[test]
    fn an_end_that_does_not_fit_is_counted() {
        let stats = Arc::new(TrajectoryStats::default());
        let (tx, mut rx) = tokio::sync::mpsc::channel(1);
        let ends = SessionEnds::new(tx, stats.clone());
        ends.hand(end("s1"));
        ends.hand(end("s2"));
        ends.hand(end("s3"));
        assert_eq!(stats.session_ends_lost.load(Ordering::Relaxed), 2);
        assert_eq!(rx.try_recv().unwrap(), end("s1"));
        drop(rx);
        ends.hand(end("s4"));
        assert_eq!(
            stats.session_ends_lost.load(Ordering::Relaxed),
            2,
            "a stopped sink loses nothing it would write"
        );
    }
}
