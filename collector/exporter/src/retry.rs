//! Retry policy: jittered exponential backoff bounded by a total time.
//!
//! This module owns [`RetrySettings`] and the backoff sequence the stage's
//! sink workers follow. Delays start at `initial_backoff`, double up to
//! `max_backoff`, and each is "equal-jittered": a uniformly random value in
//! `[d/2, d]`, so concurrent collectors do not retry in lockstep while the
//! expected delay still grows. A server's throttle delay
//! ([`crate::RetryClass::Throttled`]) replaces the computed one. A batch is
//! given up when the next attempt would start after `max_elapsed` since its
//! first attempt.
//!
//! Why hand-written rather than `backon`/`backoff`: the policy is a dozen
//! lines, it must switch per attempt between our delay and the server's
//! throttle delay, and it must race every sleep against the shutdown
//! deadline; both crates would need adapters for the last two and add a
//! dependency for the first. The jitter source is std's randomly keyed
//! SipHash (`RandomState`), which is enough for spreading retries and needs
//! no RNG crate.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::time::Duration;

/// Retry settings of the exporter stage, filled by the binary from its config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetrySettings {
    /// First backoff delay (before jitter).
    pub initial_backoff: Duration,
    /// Largest backoff delay (before jitter).
    pub max_backoff: Duration,
    /// Total time a batch may spend in retries before it is dropped.
    /// `Duration::ZERO` disables retrying.
    pub max_elapsed: Duration,
}

impl Default for RetrySettings {
    fn default() -> Self {
        Self {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            max_elapsed: Duration::from_secs(30),
        }
    }
}

/// The retry policy of one batch (or one log request): after each failed
/// attempt, whether and when to try again. Shared by the stage's sink
/// workers and the log export ([`crate::logs`]).
#[derive(Debug)]
pub(crate) struct Attempts {
    give_up_at: tokio::time::Instant,
    backoff: Backoff,
}

impl Attempts {
    /// The policy of a batch whose first attempt starts now.
    pub(crate) fn new(settings: &RetrySettings) -> Self {
        Self {
            give_up_at: tokio::time::Instant::now() + settings.max_elapsed,
            backoff: Backoff::new(settings),
        }
    }

    /// The delay before the next attempt after `error`: the backoff's, or
    /// the server's throttle delay; None when `error` is final (not
    /// retryable, or the next attempt would start past `max_elapsed`).
    pub(crate) fn after(&mut self, error: &crate::ExportError) -> Option<Duration> {
        let delay = match error.retry_class() {
            crate::RetryClass::NonRetryable => return None,
            crate::RetryClass::Retryable => self.backoff.next_delay(),
            crate::RetryClass::Throttled(delay) => delay,
        };
        (tokio::time::Instant::now() + delay <= self.give_up_at).then_some(delay)
    }
}

/// The delays between the attempts of one batch.
#[derive(Debug)]
pub(crate) struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    pub(crate) fn new(settings: &RetrySettings) -> Self {
        Self {
            next: settings.initial_backoff,
            max: settings.max_backoff.max(settings.initial_backoff),
        }
    }

    /// The delay before the next attempt, jittered in `[d/2, d]`.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let base = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        jitter(base)
    }
}

/// A uniformly random duration in `[base/2, base]`.
fn jitter(base: Duration) -> Duration {
    let half = base / 2;
    let span_nanos = u64::try_from((base - half).as_nanos()).unwrap_or(u64::MAX);
    if span_nanos == 0 {
        return base;
    }
    let random = RandomState::new().hash_one(0u8);
    half + Duration::from_nanos(random % span_nanos.saturating_add(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_exponentially_within_jitter_bounds() {
        let settings = RetrySettings {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(800),
            max_elapsed: Duration::from_secs(30),
        };
        let mut backoff = Backoff::new(&settings);
        for base_ms in [100u64, 200, 400, 800, 800, 800] {
            let d = backoff.next_delay();
            let base = Duration::from_millis(base_ms);
            assert!(
                d >= base / 2 && d <= base,
                "{d:?} not in [{:?}, {base:?}]",
                base / 2
            );
        }
    }

    #[test]
    fn jitter_varies() {
        let delays: std::collections::HashSet<_> =
            (0..20).map(|_| jitter(Duration::from_secs(1))).collect();
        assert!(delays.len() > 1);
    }
}
