//! The ingest's memory limit: while the process' resident memory is above
//! the limit, new batches are refused with `UNAVAILABLE`, which the shim
//! answers by keeping the batch, backing off and resending it. The
//! collector stops taking work instead of growing; the shims' bounded
//! buffers absorb the pause.
//!
//! The resident set size is read from `/proc/self/statm` by a watcher task
//! every `interval` (a cheap read; nothing on the per-batch path but an
//! atomic load). Where `/proc` does not exist the limit never triggers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// See the module docs.
#[derive(Debug)]
pub struct MemoryLimit {
    limit_bytes: u64,
    over: AtomicBool,
    resident: AtomicU64,
}

impl MemoryLimit {
    pub fn new(limit_bytes: u64) -> Arc<Self> {
        Arc::new(Self {
            limit_bytes,
            over: AtomicBool::new(false),
            resident: AtomicU64::new(0),
        })
    }

    /// The limit in bytes.
    pub fn limit_bytes(&self) -> u64 {
        self.limit_bytes
    }

    /// True while the last reading was above the limit.
    pub fn is_over(&self) -> bool {
        self.over.load(Ordering::Relaxed)
    }

    /// The last reading of the resident set size, in bytes.
    pub fn resident_bytes(&self) -> u64 {
        self.resident.load(Ordering::Relaxed)
    }

    /// Reads the resident set size now and updates [`MemoryLimit::is_over`].
    pub fn check(&self) {
        if let Some(resident) = resident_bytes() {
            self.resident.store(resident, Ordering::Relaxed);
            let over = resident > self.limit_bytes;
            if over != self.over.swap(over, Ordering::Relaxed) {
                if over {
                    tracing::warn!(
                        resident_bytes = resident,
                        limit_bytes = self.limit_bytes,
                        "memory above the limit: refusing new batches (UNAVAILABLE; the shims resend)"
                    );
                } else {
                    tracing::info!(resident_bytes = resident, "memory below the limit again");
                }
            }
        }
    }

    /// Checks every `interval` until `stop` is cancelled.
    pub fn spawn_watch(self: &Arc<Self>, interval: Duration, stop: CancellationToken) {
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let mut timer = tokio::time::interval(interval);
            timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    _ = timer.tick() => this.check(),
                }
            }
        });
    }
}

/// Resident set size of this process, from `/proc/self/statm`.
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * rustix::param::page_size() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_resident_set_and_compares_with_the_limit() {
        let tiny = MemoryLimit::new(1);
        tiny.check();
        assert!(
            tiny.resident_bytes() > 1024 * 1024,
            "a process uses more than 1 MiB"
        );
        assert!(tiny.is_over());
        let huge = MemoryLimit::new(u64::MAX);
        huge.check();
        assert!(!huge.is_over());
    }
}
