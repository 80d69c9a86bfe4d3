//! Capture timestamps.
//!
//! Owns: reading the wall clock and the monotonic clock for an event.
//! Invariants: never panics (a clock error reads as 0); the monotonic reading
//! is `CLOCK_MONOTONIC`, the clock behind Python's `time.monotonic_ns()`, so
//! shim stamps are comparable with the agent's own monotonic readings.

use std::time::{SystemTime, UNIX_EPOCH};

/// Wall clock, ns since the Unix epoch (0 if the clock is before the epoch).
pub fn wall_unix_nano() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Monotonic clock of this process (`CLOCK_MONOTONIC`), ns.
pub fn mono_nano() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// Converts Hermes' float epoch seconds (or float duration seconds) to ns;
/// 0 for absent, negative or non-finite values.
pub fn secs_to_nanos(secs: f64) -> u64 {
    if secs.is_finite() && secs > 0.0 {
        let ns = (secs * 1e9).round();
        if ns >= u64::MAX as f64 {
            u64::MAX
        } else {
            ns as u64
        }
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks_advance() {
        let (w1, m1) = (wall_unix_nano(), mono_nano());
        let (w2, m2) = (wall_unix_nano(), mono_nano());
        assert!(w1 > 1_600_000_000_000_000_000);
        assert!(w2 >= w1);
        assert!(m1 > 0 && m2 >= m1);
    }

    #[test]
    fn seconds_to_nanos() {
        assert_eq!(secs_to_nanos(0.30072474479675293), 300_724_745);
        assert_eq!(secs_to_nanos(-1.0), 0);
        assert_eq!(secs_to_nanos(f64::NAN), 0);
        assert_eq!(secs_to_nanos(1.5), 1_500_000_000);
        let epoch = secs_to_nanos(1795982552.9198372);
        assert!((epoch as i128 - 1_795_982_552_919_837_200i128).abs() < 1_000);
    }
}
