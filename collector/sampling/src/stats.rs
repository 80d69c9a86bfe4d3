//! The sampling stage's counters and gauges, read by `/metrics` at scrape
//! time. Labels are the configured policy names: bounded by the file.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use hermes_metrics::{Kind, MetricEncoder, StageMetrics};

/// Counters of the sampler; monotonic except the `held_*` gauges.
#[derive(Debug, Default)]
pub struct SamplingStats {
    /// Turns (whole traces) no policy kept.
    pub turns_dropped: AtomicU64,
    /// Spans not exported because their turn was dropped.
    pub spans_dropped: AtomicU64,
    /// Turns decided before their root span came: the hold was full, the
    /// trace idle past the wait, the queue short of room, or the stage
    /// ending.
    pub decided_early: AtomicU64,
    /// Spans held now, waiting for their turn's decision.
    pub held_spans: AtomicU64,
    /// Turns (traces) held now.
    pub held_turns: AtomicU64,
    per_policy: Mutex<BTreeMap<String, PolicyCounts>>,
}

#[derive(Debug, Default, Clone, Copy)]
struct PolicyCounts {
    /// Turns this policy kept (the first in order that keeps a turn).
    kept: u64,
    /// Turns this policy was asked about and would have kept.
    matched: u64,
    /// Turns this policy was asked about and would not have kept.
    passed: u64,
}

impl SamplingStats {
    /// Counts one turn's verdict of policy `name`.
    pub(crate) fn asked(&self, name: &str, matched: bool) {
        self.with(name, |c| {
            if matched {
                c.matched += 1;
            } else {
                c.passed += 1;
            }
        });
    }

    /// Counts one turn kept by policy `name`.
    pub(crate) fn kept(&self, name: &str) {
        self.with(name, |c| c.kept += 1);
    }

    /// Turns kept by `name` so far.
    pub fn kept_by(&self, name: &str) -> u64 {
        self.lock().get(name).map_or(0, |c| c.kept)
    }

    /// Turns kept by any policy so far.
    pub fn turns_kept(&self) -> u64 {
        self.lock().values().map(|c| c.kept).sum()
    }

    fn with(&self, name: &str, f: impl FnOnce(&mut PolicyCounts)) {
        let mut map = self.lock();
        match map.get_mut(name) {
            Some(counts) => f(counts),
            None => {
                let mut counts = PolicyCounts::default();
                f(&mut counts);
                map.insert(name.to_owned(), counts);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, PolicyCounts>> {
        self.per_policy
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl StageMetrics for SamplingStats {
    fn encode(&self, m: &mut MetricEncoder<'_>) -> fmt::Result {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let per_policy: Vec<(String, PolicyCounts)> = self
            .lock()
            .iter()
            .map(|(name, counts)| (name.clone(), *counts))
            .collect();
        let family = |m: &mut MetricEncoder<'_>, what, pick: fn(&PolicyCounts) -> u64| {
            m.family(
                Kind::Counter,
                what,
                per_policy.iter().map(|(name, c)| (name.as_str(), pick(c))),
            )
        };
        family(
            m,
            (
                "sampling_turns_kept",
                "Turns (whole traces) kept, by the policy that kept them.",
                "policy",
            ),
            |c| c.kept,
        )?;
        family(
            m,
            (
                "sampling_policy_matched",
                "Turns a policy was asked about and would keep.",
                "policy",
            ),
            |c| c.matched,
        )?;
        family(
            m,
            (
                "sampling_policy_passed",
                "Turns a policy was asked about and would drop.",
                "policy",
            ),
            |c| c.passed,
        )?;
        for (name, help, value) in [
            (
                "sampling_turns_dropped",
                "Turns (whole traces) no sampling policy kept: none of their spans was exported.",
                &self.turns_dropped,
            ),
            (
                "sampling_spans_dropped",
                "Spans not exported because sampling dropped their turn.",
                &self.spans_dropped,
            ),
            (
                "sampling_decided_early",
                "Turns decided before their root span came (hold full, idle past the wait, queue short of room, or shutdown).",
                &self.decided_early,
            ),
        ] {
            m.counter(name, help, load(value))?;
        }
        for (name, help, value) in [
            (
                "sampling_held_spans",
                "Spans held until their turn is decided.",
                &self.held_spans,
            ),
            (
                "sampling_held_turns",
                "Turns whose spans are held until they are decided.",
                &self.held_turns,
            ),
        ] {
            m.gauge(name, help, load(value))?;
        }
        Ok(())
    }
}
