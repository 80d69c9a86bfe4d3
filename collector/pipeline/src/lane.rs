//! Where the pipeline's stages run (`runtime.pipeline`): the receiver's
//! connections, the queue writer, the correlation stage and the exporter
//! stage, with every task they spawn (an ingest stream's, an exporter's
//! connection).
//!
//! By default they run on one thread of their own, a current-thread tokio
//! runtime: a batch is decoded, correlated, encoded and sent by the thread
//! that received it, no stage wakes another thread to hand a batch over,
//! and memory is freed by the thread that allocated it. Spread over the
//! multi-thread runtime's workers, the same load costs more CPU per event
//! (each hand-over may wake an idle worker, which steals the task to
//! another core; docs/BENCHMARKS.md), for a ceiling above what one core
//! correlates. The admin server, the signals and the supervisor stay on the
//! workers either way, so `/livez` and `/metrics` answer while the
//! pipeline's thread is busy.
//!
//! The listeners are bound by `Topology::build`, on the workers' runtime,
//! so a start fails before anything runs; only their accepts wake from
//! there, as every accepted connection registers with the runtime that
//! accepted it, the pipeline's.
//!
//! The thread only drives the runtime until the lane is dropped: a task's
//! panic ends that task (its handle reports it to the supervisor), never
//! the thread. Dropping the lane ends the thread, which drops its runtime
//! and with it every task still there.

use std::future::Future;

use hermes_config::PipelineThreads;
use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The runtime the pipeline's stages are spawned on.
pub(crate) struct Lane {
    handle: Handle,
    /// Dropped with the lane: the pipeline's thread then returns.
    stop: Option<oneshot::Sender<()>>,
}

impl Lane {
    /// Starts the pipeline's thread (`OwnThread`), or takes the current
    /// runtime (`Workers`). Must be called within a tokio runtime.
    pub fn start(threads: PipelineThreads) -> std::io::Result<Self> {
        match threads {
            PipelineThreads::Workers => Ok(Self {
                handle: Handle::current(),
                stop: None,
            }),
            PipelineThreads::OwnThread => {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                let handle = runtime.handle().clone();
                let (stop, stopped) = oneshot::channel::<()>();
                std::thread::Builder::new()
                    .name("hermes-pipeline".to_owned())
                    .spawn(move || {
                        // Either a send or the sender's drop ends it.
                        let _ = runtime.block_on(stopped);
                    })?;
                Ok(Self {
                    handle,
                    stop: Some(stop),
                })
            }
        }
    }

    pub fn spawn<F>(&self, stage: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle.spawn(stage)
    }

    /// What the start logs: where the pipeline runs.
    pub fn shown(&self) -> &'static str {
        if self.stop.is_some() {
            "own_thread"
        } else {
            "workers"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The name of the thread a task spawned on `lane` runs on.
    async fn thread_of(lane: &Lane) -> Option<String> {
        lane.spawn(async { std::thread::current().name().map(str::to_owned) })
            .await
            .unwrap()
    }

    /// The pipeline's stages run on the lane's thread, not on the thread
    /// that spawned them, and the thread ends with the lane.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn own_thread_runs_stages_on_its_thread_until_dropped() {
        let lane = Lane::start(PipelineThreads::OwnThread).unwrap();
        assert_eq!(lane.shown(), "own_thread");
        assert_eq!(thread_of(&lane).await.as_deref(), Some("hermes-pipeline"));
        let parked = lane.spawn(std::future::pending::<()>());
        drop(lane);
        let ended = tokio::time::timeout(std::time::Duration::from_secs(10), parked)
            .await
            .expect("the pipeline's runtime dropped its tasks");
        assert!(ended.unwrap_err().is_cancelled());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn workers_run_stages_on_the_current_runtime() {
        let lane = Lane::start(PipelineThreads::Workers).unwrap();
        assert_eq!(lane.shown(), "workers");
        assert_ne!(thread_of(&lane).await.as_deref(), Some("hermes-pipeline"));
    }
}
