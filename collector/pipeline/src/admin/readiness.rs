//! Whether the collector is live and ready, as `/livez` and `/readyz`
//! answer.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{PoisonError, RwLock};

use tokio::sync::mpsc;

/// Whether the collector should receive traffic. The binary sets each flag
/// as its stages come up and when the drain starts; `/readyz` reads them.
///
/// Ready means: the ingest listener is bound and serving, the exporter stage
/// runs, its queue (the channel from the correlator) is usable, and no drain
/// has started. Through a drain after a signal the process stays live
/// (`/livez` 200) but
/// not ready, so load balancers and Kubernetes stop sending new agents
/// while the acknowledged events are exported.
#[derive(Default)]
pub struct Readiness {
    receiver_bound: AtomicBool,
    exporter_running: AtomicBool,
    draining: AtomicBool,
    /// The stage that ended on its own, if one did: the process is no
    /// longer live (`/livez` 503) while it drains and exits.
    failed_stage: std::sync::OnceLock<&'static str>,
    /// Further conditions, read on each probe.
    requirements: RwLock<Vec<Requirement>>,
}

/// A readiness condition: what `/readyz` says when it fails, and the check.
type Requirement = (&'static str, Box<dyn Fn() -> bool + Send + Sync>);

impl Readiness {
    /// The ingest listener is bound (call after `TcpListener::bind`), or
    /// stopped serving (`false`).
    pub fn set_receiver_bound(&self, bound: bool) {
        self.receiver_bound.store(bound, Ordering::Release);
    }
    /// The exporter stage task runs (call after spawning it).
    pub fn set_exporter_running(&self, running: bool) {
        self.exporter_running.store(running, Ordering::Release);
    }
    /// The drain started (call on SIGTERM/SIGINT, before cancelling the
    /// receiver). Not ready from then on, whatever the other flags say.
    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }
    /// `stage` ended on its own: `/livez` answers 503 naming it from now on
    /// (the first stage to fail is the one named), and the drain starts.
    pub fn set_failed(&self, stage: &'static str) {
        let _ = self.failed_stage.set(stage);
        self.set_draining();
    }
    /// `Err(stage)` once a stage ended on its own.
    pub fn live(&self) -> Result<(), &'static str> {
        self.failed_stage.get().map_or(Ok(()), |stage| Err(*stage))
    }
    /// Adds a condition read on each probe, e.g. that the exporter's queue
    /// is usable ([`Readiness::channel_open`] of its channel); `/readyz`
    /// answers `not ready: {unmet}` while `holds` returns false.
    pub fn require(&self, unmet: &'static str, holds: impl Fn() -> bool + Send + Sync + 'static) {
        self.requirements
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .push((unmet, Box::new(holds)));
    }
    /// Whether the channel of `sender` still has its receiver (the stage
    /// reading it runs), read through a weak sender: the check never keeps
    /// the channel open. False once every sender is gone.
    pub fn channel_open<T: Send + 'static>(
        sender: &mpsc::Sender<T>,
    ) -> impl Fn() -> bool + Send + Sync + 'static {
        let weak = sender.downgrade();
        move || weak.upgrade().is_some_and(|s| !s.is_closed())
    }
    /// `Ok` when ready, else why not.
    pub fn check(&self) -> Result<(), &'static str> {
        if self.draining.load(Ordering::Acquire) {
            Err("draining")
        } else if !self.receiver_bound.load(Ordering::Acquire) {
            Err("the ingest listener is not serving")
        } else if !self.exporter_running.load(Ordering::Acquire) {
            Err("the exporter stage is not running")
        } else {
            let requirements = self
                .requirements
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            match requirements.iter().find(|(_, holds)| !holds()) {
                Some((unmet, _)) => Err(*unmet),
                None => Ok(()),
            }
        }
    }
}

impl fmt::Debug for Readiness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Readiness")
            .field("receiver_bound", &self.receiver_bound)
            .field("exporter_running", &self.exporter_running)
            .field("draining", &self.draining)
            .field(
                "requirements",
                &self.requirements.read().map_or(0, |r| r.len()),
            )
            .finish()
    }
}
