//! Reconnect delays.
//!
//! Owns: the jittered exponential backoff between connection attempts.
//! Invariants: every delay lies in `[min/2, max]`; the nominal delay doubles
//! per failure from `min` up to `max` and returns to `min` on [`Backoff::reset`].

use std::time::Duration;

use rand::Rng;

/// Jittered exponential backoff ("equal jitter": half fixed, half random).
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    /// A backoff from `min` to `max`.
    pub fn new(min: Duration, max: Duration) -> Self {
        let min = min.max(Duration::from_millis(1));
        let max = max.max(min);
        Backoff {
            min,
            max,
            current: min,
        }
    }

    /// The delay before the next attempt; doubles the nominal delay.
    pub fn next_delay(&mut self) -> Duration {
        let nominal = self.current;
        self.current = (self.current * 2).min(self.max);
        let half = nominal / 2;
        let jitter_ns = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
        let jitter = Duration::from_nanos(rand::rng().random_range(0..=jitter_ns));
        (half + jitter).min(self.max)
    }

    /// After a success: start again from `min`.
    pub fn reset(&mut self) {
        self.current = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_cap_with_jitter_and_resets() {
        let (min, max) = (Duration::from_millis(100), Duration::from_secs(5));
        let mut b = Backoff::new(min, max);
        let mut nominal = min;
        for _ in 0..20 {
            let d = b.next_delay();
            assert!(d >= nominal / 2 && d <= nominal, "{d:?} vs {nominal:?}");
            nominal = (nominal * 2).min(max);
        }
        assert_eq!(b.current, max);
        b.reset();
        let d = b.next_delay();
        assert!(d >= min / 2 && d <= min);
    }
}
