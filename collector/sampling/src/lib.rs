//! Tail sampling: each top-level turn's whole trace (its spans, and its
//! subagents' turns, which join it) is kept or dropped by the configured
//! policies, once its root span (the top-level turn's) has closed.
//!
//! The correlation stage hands the [`Sampler`] every batch of finished,
//! processed spans after the derived metrics counted them; the sampler
//! holds each span by trace id until its trace's root span comes, decides
//! the trace with [`Policy`]s (the first policy in order that keeps it
//! keeps it; no policy keeping it drops it), then releases the whole trace
//! or none of it. Kept spans carry `hermes.sampling.policy` and the
//! OpenTelemetry probability-sampling `tracestate` (`ot=th:…;rv:…`).
//! Decisions are remembered for a while, so a span that comes after its
//! trace was decided follows it. Without policies the sampler passes every
//! batch through untouched.
//!
//! What it holds is bounded ([`SamplingSettings::max_held_spans`]; past
//! it the oldest trace is decided with what is known) and counted
//! ([`SamplingStats`]); a trace idle for [`SamplingSettings::max_wait_nanos`]
//! is decided too. Each held trace remembers a lower bound of the
//! persistent queue's positions (lsns) its spans were built from, so the
//! queue keeps their records ([`Sampler::min_held_lsn`]).
//!
//! A crate of its own: the configuration crate converts its section into
//! [`SamplingSettings`] and the pipeline runs the [`Sampler`], and the
//! configuration crate cannot depend on the pipeline.
//!
//! | module | owns |
//! |---|---|
//! | this file | [`SamplingSettings`], [`Policy`] |
//! | `sampler.rs` | [`Sampler`]: the hold, the decisions, the release |
//! | `policy.rs` | [`Rule`]s, the session's randomness, `tracestate` |
//! | `stats.rs` | [`SamplingStats`] for `/metrics` |

#![forbid(unsafe_code)]

pub mod policy;
mod sampler;
mod stats;

pub use policy::Rule;
pub use sampler::{POLICY_ATTRIBUTE, Sampler};
pub use stats::SamplingStats;

/// One named policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// The `name` of the configuration: the label of its metrics and the
    /// value of `hermes.sampling.policy` on what it keeps.
    pub name: String,
    pub rule: Rule,
}

impl Policy {
    /// `rules` as policies named `p0`, `p1`, … in order (tests and tools
    /// that need no names of their own).
    pub fn numbered(rules: impl IntoIterator<Item = Rule>) -> Vec<Policy> {
        rules
            .into_iter()
            .enumerate()
            .map(|(i, rule)| Policy {
                name: format!("p{i}"),
                rule,
            })
            .collect()
    }
}

/// The sampler's settings (`sampling.*`).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingSettings {
    /// In order; none keeps everything (no sampling).
    pub policies: Vec<Policy>,
    /// Most spans held waiting for their trace's decision; past it the
    /// oldest trace is decided with the spans it has.
    pub max_held_spans: usize,
    /// A held trace with no new span for this long is decided with what
    /// it has (its root will not come: it was decided and forgotten, or
    /// its turn was lost), nanoseconds.
    pub max_wait_nanos: u64,
}

impl Default for SamplingSettings {
    fn default() -> Self {
        Self {
            policies: Vec::new(),
            max_held_spans: 100_000,
            max_wait_nanos: 3600 * 1_000_000_000,
        }
    }
}

#[cfg(test)]
mod tests;
