//! The time the correlation stage reads: the correlator's clock (TTL, end
//! grace, gap timeout) and the sleep until the next expiry are both taken
//! from one [`Clock`], so a stage test on tokio's paused time sees state
//! expire exactly when it would in production, without waiting.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Now, in nanoseconds since the Unix epoch.
pub trait Clock: Send + 'static {
    fn now_unix_nanos(&self) -> u64;
}

/// The system's wall clock: what the agents' event timestamps are read
/// against.
#[derive(Debug, Clone, Copy, Default)]
pub struct WallClock;

impl Clock for WallClock {
    fn now_unix_nanos(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, saturating_nanos)
    }
}

/// tokio's clock, counted from `start_unix_nanos` at its creation: it
/// follows `tokio::time::pause` and `advance`, for stage tests.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    start_unix_nanos: u64,
    start: tokio::time::Instant,
}

impl TokioClock {
    /// A clock that reads `start_unix_nanos` now.
    pub fn starting_at(start_unix_nanos: u64) -> Self {
        Self {
            start_unix_nanos,
            start: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now_unix_nanos(&self) -> u64 {
        self.start_unix_nanos
            .saturating_add(saturating_nanos(self.start.elapsed()))
    }
}

fn saturating_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
