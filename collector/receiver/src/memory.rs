//! The ingest's memory limit: while the process' resident memory is above
//! the limit, new batches are refused with `UNAVAILABLE`, which the shim
//! answers by keeping the batch, backing off and resending it. The
//! collector stops taking work instead of growing; the shims' bounded
//! buffers absorb the pause.
//!
//! The resident set size is read from `/proc/self/statm` when a batch
//! arrives and the last reading is older than the interval (a cheap read,
//! at most once per interval; otherwise an atomic load and a clock read per
//! batch). Memory grows only while batches arrive, so nothing reads it
//! while the ingest is idle, and an idle collector has no timer for it.
//! Where `/proc` does not exist the limit never triggers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// `read_at` before the first reading.
const NEVER: u64 = u64::MAX;

/// See the module docs.
#[derive(Debug)]
pub struct MemoryLimit {
    limit_bytes: u64,
    interval_nanos: u64,
    /// The origin of `read_at`.
    created: Instant,
    /// When the last reading was taken, ns after `created`; [`NEVER`].
    read_at: AtomicU64,
    over: AtomicBool,
    resident: AtomicU64,
}

impl MemoryLimit {
    /// A limit of `limit_bytes`, read again when the last reading is older
    /// than `interval`.
    pub fn new(limit_bytes: u64, interval: Duration) -> Arc<Self> {
        Arc::new(Self {
            limit_bytes,
            interval_nanos: u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX),
            created: Instant::now(),
            read_at: AtomicU64::new(NEVER),
            over: AtomicBool::new(false),
            resident: AtomicU64::new(0),
        })
    }

    /// The limit in bytes.
    pub fn limit_bytes(&self) -> u64 {
        self.limit_bytes
    }

    /// Whether the process is above the limit, from a reading at most one
    /// interval old: a caller that finds the last one older reads again
    /// first (one caller at a time; the others meanwhile use the last one).
    pub fn is_over(&self) -> bool {
        let now = u64::try_from(self.created.elapsed().as_nanos()).unwrap_or(u64::MAX - 1);
        let last = self.read_at.load(Ordering::Relaxed);
        if (last == NEVER || now.saturating_sub(last) >= self.interval_nanos)
            && self
                .read_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.check();
        }
        self.over.load(Ordering::Relaxed)
    }

    /// The last reading of the resident set size, in bytes.
    pub fn resident_bytes(&self) -> u64 {
        self.resident.load(Ordering::Relaxed)
    }

    /// Reads the resident set size now and updates the verdict.
    fn check(&self) {
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
        let tiny = MemoryLimit::new(1, Duration::from_secs(3600));
        assert!(tiny.is_over(), "the first look reads");
        assert!(
            tiny.resident_bytes() > 1024 * 1024,
            "a process uses more than 1 MiB"
        );
        let huge = MemoryLimit::new(u64::MAX, Duration::from_secs(3600));
        assert!(!huge.is_over());
    }

    #[test]
    fn reads_again_only_when_the_last_reading_is_older_than_the_interval() {
        let limit = MemoryLimit::new(u64::MAX, Duration::from_secs(3600));
        assert!(!limit.is_over());
        limit.resident.store(0, Ordering::Relaxed);
        assert!(!limit.is_over());
        assert_eq!(limit.resident_bytes(), 0, "read again within the interval");

        let limit = MemoryLimit::new(u64::MAX, Duration::ZERO);
        assert!(!limit.is_over());
        limit.resident.store(0, Ordering::Relaxed);
        assert!(!limit.is_over());
        assert!(
            limit.resident_bytes() > 0,
            "not read again after the interval"
        );
    }
}
