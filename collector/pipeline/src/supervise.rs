//! The supervisor: [`Topology::run`] starts every stage, then waits for a
//! stop (the binary's signals) and for every stage's end together. A stage
//! that ends before the stop asked it to (it returned, failed or panicked)
//! is logged with its cause, `/livez` answers 503 naming it, what can still
//! be drained is drained within `shutdown.grace_ms`, and the run ends with
//! [`Outcome::StageFailed`] (exit 70).
//!
//! The drain, after a stop or a failure, goes downstream:
//! 0. with `fleet.replicated`, every fleet shim is asked to leave, and the
//!    drain waits (at most half the grace) for their handoffs;
//! 1. the receiver stops accepting (streams end with `UNAVAILABLE`; open
//!    connections are closed after the linger, never waited on beyond it);
//! 2. the correlation stage takes what is queued and closes what is open
//!    (or leaves it to the persistent queue's next start);
//! 3. the exporters drain until the deadline, beside the derived metrics'
//!    last OTLP export; what they could not send is counted as failed;
//! 4. the persistent queue learns what was exported;
//! 5. the admin server goes last, so `/livez` and `/readyz` (503) answer
//!    throughout.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::driver::Ended;
use crate::fault;
use crate::topology::Topology;

/// How a run ended, for the exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Stopped when asked; everything drained.
    Clean,
    /// Stopped when asked; some spans or open turns could not be exported
    /// within the grace.
    LostInDrain,
    /// A stage stopped on its own (failed or panicked); drained what was
    /// left.
    StageFailed,
}

impl Outcome {
    /// The process's exit code: 0; 75 (`EX_TEMPFAIL`: a later run with a
    /// longer grace or a reachable backend would not lose); 70
    /// (`EX_SOFTWARE`).
    pub fn exit_code(self) -> u8 {
        match self {
            Self::Clean => 0,
            Self::LostInDrain => 75,
            Self::StageFailed => 70,
        }
    }
}

/// The long-running tasks; a task that has ended is `None`: its handle is
/// never polled again.
struct Stages {
    receiver: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
    correlation: Option<JoinHandle<Ended>>,
    exporter: Option<JoinHandle<Arc<hermes_exporter::ExporterStats>>>,
    admin: Option<JoinHandle<std::io::Result<()>>>,
}

impl Stages {
    /// Waits until a stage ends before the drain asked it to, and names it
    /// (logging how it ended). Polled upstream first: a stage that ends
    /// because the one before it ended (the exporter once the correlator's
    /// channel closes) must not be named when both have ended by the time
    /// this looks.
    async fn first_to_end(&mut self) -> &'static str {
        let (stage, how) = tokio::select! {
            biased;
            r = join(&mut self.receiver) => ("receiver", describe(r.map(|r| r.map_err(|e| e.to_string())))),
            r = join(&mut self.correlation) => ("correlator", describe(r.map(|_| Ok(())))),
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

impl Topology {
    /// Runs every stage until `stop` completes or a stage ends on its own,
    /// then drains (see the module docs).
    pub async fn run(self, stop: impl Future<Output = ()>) -> Outcome {
        let Self {
            grace,
            readiness,
            receiver,
            admin,
            exporter: (exporter_stage, export_rx),
            correlation,
            writer,
            metrics_export,
            lane,
            // Not taken: the policies stay as configured.
            policies: _,
        } = self;
        let exporter_stats = exporter_stage.stats();
        let drain_deadline = exporter_stage.drain_deadline();
        let exporter_shutdown = CancellationToken::new();
        let exporter = lane.spawn(fault::stage(
            "exporter",
            exporter_stage.run(export_rx, exporter_shutdown.clone()),
            {
                let stats = exporter_stats.clone();
                move || stats
            },
        ));
        readiness.set_exporter_running(true);
        let writer = writer.map(|w| lane.spawn(w.writer.run(w.ingest, w.settle, w.out)));
        let correlation_stop = CancellationToken::new();
        let pipeline_stats = correlation.stats.clone();
        let correlation_task = lane.spawn(fault::stage(
            "correlator",
            correlation.driver.run(
                correlation.ingest,
                correlation.export,
                correlation_stop.clone(),
            ),
            || Ended {
                ledger: crate::ledger::Ledger::Memory,
                open: None,
            },
        ));
        let admin_shutdown = CancellationToken::new();
        // `listen` last: tests read the address to the end of the line.
        tracing::info!(
            metrics_auth = admin.metrics_authenticated,
            listen = %admin.shown_listen,
            "serving /livez, /readyz, /metrics"
        );
        let admin = tokio::spawn(crate::admin::serve(
            admin.listener,
            admin.state,
            admin_shutdown.clone(),
        ));
        readiness.set_receiver_bound(true);
        tracing::info!(
            listen = %receiver.shown_listen,
            worker_threads = tokio::runtime::Handle::current().metrics().num_workers(),
            pipeline = lane.shown(),
            authenticated = receiver.authenticated,
            tls = receiver.tls.is_some(),
            mutual_tls = receiver.mutual_tls,
            "receiving Hermes events"
        );
        let receiver_shutdown = receiver.shutdown.clone();
        let serving =
            receiver
                .ingest
                .serve(receiver.listener, receiver.tls, receiver.shutdown.clone());
        let receiver_task = lane.spawn({
            let readiness = readiness.clone();
            async move {
                let served = serving.await;
                // Not ready once the ingest stopped, whatever the reason.
                readiness.set_receiver_bound(false);
                served
            }
        });

        let mut stages = Stages {
            receiver: Some(receiver_task),
            correlation: Some(correlation_task),
            exporter: Some(exporter),
            admin: Some(admin),
        };
        let stage_died = tokio::select! {
            () = stop => None,
            died = stages.first_to_end() => Some(died),
        };
        match stage_died {
            Some(stage) => readiness.set_failed(stage),
            None => readiness.set_draining(),
        }
        let deadline = tokio::time::Instant::now() + grace;
        drain_deadline.set(deadline);
        let failed_before = spans_failed(&exporter_stats);
        let grace_ms = grace.as_millis();
        match stage_died {
            None => tracing::info!(grace_ms, "shutting down: draining"),
            Some(stage) => tracing::error!(
                stage,
                grace_ms,
                "a stage of the pipeline stopped; draining what is left and exiting"
            ),
        }
        // 0. One replica of a fleet: the agents move to the others first.
        if receiver.replicated {
            leave_fleet(&receiver.settlements, deadline, grace).await;
        }
        // 1. Stop accepting.
        receiver_shutdown.cancel();
        let receiver_deadline = deadline.min(tokio::time::Instant::now() + receiver.linger);
        if let Some(server) = stages.receiver.as_mut() {
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
        // 2. The correlation stage takes what is queued and closes what is
        //    open (whoever still holds an ingest sender); dropping its
        //    export sender lets the exporter stage drain.
        correlation_stop.cancel();
        let open_turns = || pipeline_stats.open_turns.load(Ordering::Relaxed);
        let mut lost_open_turns = 0;
        let ended = match stages.correlation.as_mut() {
            // The correlation stage ended on its own: its open turns went
            // with it.
            None => {
                lost_open_turns = open_turns();
                None
            }
            Some(task) => match tokio::time::timeout_at(deadline, &mut *task).await {
                Ok(Ok(ended)) => Some(ended),
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "correlator task failed; its open turns are lost");
                    lost_open_turns = open_turns();
                    None
                }
                Err(_) => {
                    lost_open_turns = open_turns();
                    tracing::error!(
                        open_turns = lost_open_turns,
                        "correlator did not drain within the grace period; its open turns are lost"
                    );
                    task.abort();
                    None
                }
            },
        };
        // 3. Everything is recorded: the derived metrics' last OTLP export
        //    runs beside the exporters' drain, bounded by the same deadline;
        //    what the exporters could not export is counted as failed
        //    before their stage returns.
        let metrics_flush = metrics_export.map(|export| tokio::spawn(export.shutdown(deadline)));
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
        // 4. The persistent queue learns what was exported and keeps the
        //    rest (open turns, unexported spans) for the next start.
        if let Some(Ended { ledger, open }) = ended {
            ledger.finish(open).await;
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
        // 5. The admin server goes last.
        admin_shutdown.cancel();
        if let Some(admin) = stages.admin.as_mut() {
            let _ = admin.await;
        }
        let sent: u64 = exporter_stats.sinks().iter().map(|s| s.spans_sent()).sum();
        let failed = spans_failed(&exporter_stats);
        let lost_in_drain = failed.saturating_sub(failed_before);
        tracing::info!(
            events = receiver.stats.events_accepted.load(Ordering::Relaxed),
            spans = pipeline_stats.spans.load(Ordering::Relaxed),
            spans_sent = sent,
            spans_failed = failed,
            "stopped"
        );
        if stage_died.is_some() {
            return Outcome::StageFailed;
        }
        if lost_in_drain > 0 || lost_open_turns > 0 {
            tracing::error!(
                spans = lost_in_drain,
                open_turns = lost_open_turns,
                "the drain could not export everything within shutdown.grace_ms; these are lost"
            );
            return Outcome::LostInDrain;
        }
        Outcome::Clean
    }
}

/// Asks every fleet shim to leave and waits until their streams are gone
/// (each sends its handoff, then ends it), for at most half the grace
/// (before `deadline`): the rest is the exporters'. Those still connected
/// then are dropped by the correlation stage all the same.
async fn leave_fleet(
    settlements: &hermes_receiver::Settlements,
    deadline: tokio::time::Instant,
    grace: Duration,
) {
    settlements.leave();
    let until = deadline.min(tokio::time::Instant::now() + grace / 2);
    while settlements.streams() > 0 && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tracing::info!(
        handoffs = settlements.handoffs(),
        still_connected = settlements.streams(),
        "asked the fleet's agents to move to another replica"
    );
}

fn spans_failed(stats: &hermes_exporter::ExporterStats) -> u64 {
    stats.sinks().iter().map(|s| s.spans_failed()).sum()
}
