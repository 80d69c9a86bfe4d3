//! The settings that hold a bounded integer: the queue's capacity, the
//! exit flush bound, the spool's bound and the fleet's resolution
//! interval, each read from its environment variable within its range.

use std::ops::RangeInclusive;
use std::str::FromStr;

use super::{
    DEFAULT_EXIT_FLUSH_MS, DEFAULT_QUEUE_EVENTS, DEFAULT_RESOLVE_SECS, DEFAULT_SPOOL_MAX_BYTES,
    MAX_EXIT_FLUSH_MS, MAX_QUEUE_EVENTS, MAX_RESOLVE_SECS, MAX_SPOOL_MAX_BYTES,
};

/// A setting that holds an integer: the values it takes, the one used when
/// it is unset or outside them, and the warning's reason then.
pub(super) struct Bounded<T> {
    range: RangeInclusive<T>,
    default: T,
    reason: &'static str,
}

pub(super) const QUEUE_EVENTS: Bounded<usize> = Bounded {
    range: 1..=MAX_QUEUE_EVENTS,
    default: DEFAULT_QUEUE_EVENTS,
    reason: "expected an integer in 1..=16777216",
};
pub(super) const EXIT_FLUSH_MS: Bounded<u64> = Bounded {
    range: 0..=MAX_EXIT_FLUSH_MS,
    default: DEFAULT_EXIT_FLUSH_MS,
    reason: "expected an integer in 0..=60000",
};
pub(super) const SPOOL_MAX_BYTES: Bounded<u64> = Bounded {
    range: 1..=MAX_SPOOL_MAX_BYTES,
    default: DEFAULT_SPOOL_MAX_BYTES,
    reason: "expected an integer in 1..=1099511627776",
};

pub(super) const RESOLVE_SECS: Bounded<u64> = Bounded {
    range: 1..=MAX_RESOLVE_SECS,
    default: DEFAULT_RESOLVE_SECS,
    reason: "expected an integer in 1..=3600",
};

impl<T: FromStr + PartialOrd + Copy + ToString> Bounded<T> {
    /// The value of `var` read through `get`: the default when unset, and
    /// with a warning through `warn` when it is not an integer in range.
    pub(super) fn read(
        &self,
        var: &'static str,
        get: &impl Fn(&str) -> Option<String>,
        warn: &mut impl FnMut(&'static str, &str, &'static str, String),
    ) -> T {
        let Some(value) = get(var) else {
            return self.default;
        };
        match value.trim().parse::<T>() {
            Ok(n) if self.range.contains(&n) => n,
            _ => {
                warn(var, &value, self.reason, self.default.to_string());
                self.default
            }
        }
    }
}
