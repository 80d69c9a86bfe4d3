//! The policies' rules over one trace's spans, the session's randomness
//! and the OpenTelemetry probability-sampling threshold (`th`, `rv`).
//!
//! Owns: what each rule looks at, the fixed hash of the session id, and
//! the encoding of thresholds and randomness in `tracestate`.

use hermes_span::common::v1::any_value::Value;
use hermes_span::trace::v1::{Span, status};
use xxhash_rust::xxh3::xxh3_64;

/// 2^56: the randomness and thresholds of OpenTelemetry's consistent
/// probability sampling are 56-bit numbers.
pub const MAX_ADJUSTED_COUNT: u64 = 1 << 56;

/// The attribute every span carries with the root session id (a
/// subagent's spans carry the root's).
pub const SESSION_ID_KEY: &str = "session.id";

/// What one policy checks; see `docs/TRACE_MODEL.md`, "Sampling".
#[derive(Debug, Clone, PartialEq)]
pub enum Rule {
    /// Any span of the trace has status ERROR.
    StatusCode,
    /// The trace lasts at least this long: from its earliest span start to
    /// its latest span end, nanoseconds.
    Latency { threshold_nanos: u64 },
    /// Any span has the attribute `key` with a number within the bounds
    /// (inclusive; an absent bound does not limit).
    NumericAttribute {
        key: String,
        min: Option<f64>,
        max: Option<f64>,
    },
    /// Any span has the attribute `key` with one of `values`.
    StringAttribute { key: String, values: Vec<String> },
    /// The session's randomness is at least the threshold of `percent`:
    /// every turn of a session agrees, on every replica and restart.
    Probabilistic { percent: f64 },
    /// At most this many turns a second (a token bucket holding one
    /// second's worth), among the turns that reach it.
    RateLimiting { turns_per_second: u32 },
    /// Every sub-rule keeps the trace.
    And(Vec<Rule>),
}

/// What the rules read of one trace besides its spans.
pub struct Facts {
    /// The session's 56-bit randomness ([`randomness`]).
    pub randomness: u64,
}

impl Rule {
    /// Whether the rule keeps the trace of `spans`. Rate limiting is not
    /// decided here (it has state): it never keeps here.
    pub fn keeps(&self, spans: &[&Span], facts: &Facts) -> bool {
        match self {
            Self::StatusCode => spans.iter().any(|s| {
                s.status
                    .as_ref()
                    .is_some_and(|st| st.code == status::StatusCode::Error as i32)
            }),
            Self::Latency { threshold_nanos } => duration(spans) >= *threshold_nanos,
            Self::NumericAttribute { key, min, max } => spans.iter().any(|s| {
                number(s, key).is_some_and(|v| {
                    min.is_none_or(|min| v >= min) && max.is_none_or(|max| v <= max)
                })
            }),
            Self::StringAttribute { key, values } => spans
                .iter()
                .any(|s| string(s, key).is_some_and(|v| values.iter().any(|w| w.as_str() == v))),
            Self::Probabilistic { percent } => facts.randomness >= threshold(*percent),
            Self::RateLimiting { .. } => false,
            Self::And(rules) => rules.iter().all(|r| r.keeps(spans, facts)),
        }
    }

    /// The rejection threshold the rule samples with when it keeps a
    /// trace: a probabilistic rule's, the highest of an `and`'s
    /// probabilistic sub-rules, 0 (every trace) for the others.
    pub fn threshold(&self) -> u64 {
        match self {
            Self::Probabilistic { percent } => threshold(*percent),
            Self::And(rules) => rules.iter().map(Self::threshold).max().unwrap_or(0),
            _ => 0,
        }
    }
}

/// From the earliest start to the latest end of `spans`, nanoseconds.
fn duration(spans: &[&Span]) -> u64 {
    let start = spans.iter().map(|s| s.start_time_unix_nano).min();
    let end = spans.iter().map(|s| s.end_time_unix_nano).max();
    match (start, end) {
        (Some(start), Some(end)) => end.saturating_sub(start),
        _ => 0,
    }
}

fn value<'a>(span: &'a Span, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

/// An integer or double attribute as a number.
fn number(span: &Span, key: &str) -> Option<f64> {
    match value(span, key)? {
        Value::IntValue(i) => Some(*i as f64),
        Value::DoubleValue(d) => Some(*d),
        _ => None,
    }
}

/// A string attribute.
pub fn string<'a>(span: &'a Span, key: &str) -> Option<&'a str> {
    match value(span, key)? {
        Value::StringValue(s) => Some(s.as_str()),
        _ => None,
    }
}

/// The 56-bit randomness of a session: XXH3-64 (seed 0) of
/// `"hermes.sampling\0" + session id`, its low 56 bits. A specified,
/// seedless hash, so every replica and every restart agree.
pub fn randomness(session_id: &str) -> u64 {
    let mut bytes = Vec::with_capacity(16 + session_id.len());
    bytes.extend_from_slice(b"hermes.sampling\0");
    bytes.extend_from_slice(session_id.as_bytes());
    xxh3_64(&bytes) & (MAX_ADJUSTED_COUNT - 1)
}

/// The rejection threshold of `percent` (0 to 100): a trace is kept when
/// its randomness is at least this. 0 keeps every trace, 2^56 none.
pub fn threshold(percent: f64) -> u64 {
    let share = (percent / 100.0).clamp(0.0, 1.0);
    // At most 2^56, exactly representable: the cast cannot overflow.
    let kept = (share * MAX_ADJUSTED_COUNT as f64).round() as u64;
    MAX_ADJUSTED_COUNT - kept.min(MAX_ADJUSTED_COUNT)
}

/// `th`'s value: the threshold in 14 hex digits, trailing zeros removed
/// (`0` for every trace).
pub fn threshold_hex(threshold: u64) -> String {
    let digits = format!("{:014x}", threshold.min(MAX_ADJUSTED_COUNT - 1));
    let trimmed = digits.trim_end_matches('0');
    if trimmed.is_empty() {
        "0".to_owned()
    } else {
        trimmed.to_owned()
    }
}

/// The `tracestate` of a kept trace: the OpenTelemetry entry with the
/// threshold it was sampled at (none when no probability applies: a rate
/// limit kept it) and its randomness in 14 hex digits, which the trace id
/// (a hash of the turn id, not random per W3C Trace Context level 2) does
/// not carry.
pub fn trace_state(threshold: Option<u64>, randomness: u64) -> String {
    match threshold {
        Some(t) => format!("ot=th:{};rv:{randomness:014x}", threshold_hex(t)),
        None => format!("ot=rv:{randomness:014x}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_encode_as_the_specification_shows() {
        assert_eq!(threshold_hex(threshold(100.0)), "0");
        assert_eq!(threshold_hex(threshold(50.0)), "8");
        assert_eq!(threshold_hex(threshold(25.0)), "c");
        assert_eq!(threshold_hex(threshold(12.5)), "e");
        // 10 %: 2^56 * 0.9, rounded, in 14 digits.
        assert_eq!(threshold_hex(threshold(10.0)), "e6666666666666");
        assert_eq!(threshold(0.0), MAX_ADJUSTED_COUNT);
    }

    #[test]
    fn randomness_is_a_fixed_function_of_the_session_id() {
        assert_eq!(randomness("s-1"), randomness("s-1"));
        assert_ne!(randomness("s-1"), randomness("s-2"));
        assert!(randomness("s-1") < MAX_ADJUSTED_COUNT);
        // The function itself, pinned: a change would split the decisions
        // of replicas running different versions.
        assert_eq!(
            randomness("session-a"),
            xxh3_64(b"hermes.sampling\0session-a") & (MAX_ADJUSTED_COUNT - 1)
        );
        assert_eq!(
            trace_state(Some(threshold(25.0)), 0xab),
            "ot=th:c;rv:000000000000ab"
        );
        assert_eq!(trace_state(None, 1), "ot=rv:00000000000001");
    }
}
