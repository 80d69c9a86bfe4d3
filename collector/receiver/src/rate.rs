//! The per-stream rate limit: a token bucket of events.
//!
//! Owns [`StreamRate`]. Each ingest stream (one shim, one connection in
//! practice) gets its own bucket of [`Limits::stream_burst_events`] tokens,
//! refilled at [`Limits::stream_events_per_sec`]. A batch of `n` events takes
//! `n` tokens, going into debt when there are fewer (a batch larger than the
//! burst is still accepted whole); while the bucket is in debt the stream
//! loop does not read that stream: it sleeps until the debt is paid, then
//! forwards the batch. The shim's HTTP/2 flow control then stops it and its
//! own bounded buffer absorbs the excess; nothing is refused or lost, and
//! every other stream is read as usual.
//!
//! Delaying rather than refusing (`RESOURCE_EXHAUSTED`) was chosen because
//! a refused shim reconnects and resends the same batch, which costs the
//! collector more than waiting, and an honest agent in a burst loses nothing.
//!
//! Invariants: the bucket never holds more than the burst; the average rate
//! over any window longer than burst/rate is at most the rate (plus one
//! batch); time comes from the caller (`tokio::time::Instant`, so tests can
//! pause it).

use std::time::Duration;

use tokio::time::Instant;

use crate::Limits;

/// A token bucket for one stream. See the module docs.
#[derive(Debug, Clone)]
pub struct StreamRate {
    per_sec: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl StreamRate {
    /// A full bucket at `now`.
    pub fn new(limits: &Limits, now: Instant) -> Self {
        // Zero would never refill: treat it as one event per second.
        let per_sec = limits.stream_events_per_sec.max(1) as f64;
        let burst = limits.stream_burst_events.max(1) as f64;
        Self {
            per_sec,
            burst,
            tokens: burst,
            last: now,
        }
    }

    /// Takes `events` tokens at `now`; returns how long the stream must wait
    /// before its next read, or None when it may go on at once.
    pub fn take(&mut self, events: u64, now: Instant) -> Option<Duration> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.per_sec).min(self.burst);
        self.tokens -= events as f64;
        if self.tokens >= 0.0 {
            return None;
        }
        Some(Duration::from_secs_f64(-self.tokens / self.per_sec))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(per_sec: u64, burst: u64) -> Limits {
        Limits {
            stream_events_per_sec: per_sec,
            stream_burst_events: burst,
            ..Limits::default()
        }
    }

    #[test]
    fn burst_then_rate() {
        let t0 = Instant::now();
        let mut rate = StreamRate::new(&limits(100, 50), t0);
        // The burst goes through at once.
        assert_eq!(rate.take(30, t0), None);
        assert_eq!(rate.take(20, t0), None);
        // Then 10 events cost 100 ms.
        let wait = rate.take(10, t0).unwrap();
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-9, "{wait:?}");
        // After paying the debt, the next batch waits its own cost only.
        let t1 = t0 + wait;
        let wait = rate.take(5, t1).unwrap();
        assert!((wait.as_secs_f64() - 0.05).abs() < 1e-9, "{wait:?}");
        // Idle time refills up to the burst, never above.
        let t2 = t1 + Duration::from_secs(60);
        assert_eq!(rate.take(50, t2 + wait), None);
        assert!(rate.take(1, t2 + wait).is_some());
    }

    #[test]
    fn a_batch_larger_than_the_burst_is_paced_not_refused() {
        let t0 = Instant::now();
        let mut rate = StreamRate::new(&limits(1000, 10), t0);
        let wait = rate.take(2010, t0).unwrap();
        assert!((wait.as_secs_f64() - 2.0).abs() < 1e-9, "{wait:?}");
    }

    #[test]
    fn long_run_average_is_the_rate() {
        let t0 = Instant::now();
        let mut rate = StreamRate::new(&limits(200, 100), t0);
        let mut now = t0;
        let mut sent = 0u64;
        while now < t0 + Duration::from_secs(10) {
            sent += 7;
            if let Some(wait) = rate.take(7, now) {
                now += wait;
            }
        }
        // 10 s at 200/s plus the burst (and one batch).
        assert!(sent <= 2000 + 100 + 7, "{sent}");
        assert!(sent >= 2000, "{sent}");
    }
}
