//! Deterministic trace and span ids.
//!
//! The same events give the same ids in every collector instance and on every
//! redelivery, so a duplicate export is idempotent and a restarted collector
//! continues the same trace.
//!
//! * trace id = XXH3-128 of `"hermes.trace\0" + top-level turn_id`
//! * span id  = XXH3-64 of `"hermes.span\0" + kind + ("\0" + part)*`
//! * a top-level turn whose id another shim instance already holds gets
//!   [`scoped_trace_id`] instead (see `docs/TRACE_MODEL.md`, "Ids").
//!
//! where `kind` is `turn`, `chat`, `tool`, `subagent` or `approval` and the
//! parts are the ids that identify the span (see [`SpanKey`]). XXH3 is a
//! specified, seedless, platform-independent hash (seed 0). An all-zero result
//! (invalid in OTLP) is replaced by 1.

use xxhash_rust::xxh3::{xxh3_64, xxh3_128};

/// A 16-byte OTLP trace id.
pub type TraceId = [u8; 16];
/// An 8-byte OTLP span id.
pub type SpanId = [u8; 8];

/// What identifies a span, per span kind.
#[derive(Debug, Clone, Copy)]
pub enum SpanKey<'a> {
    /// `invoke_agent` turn span: its `turn_id`.
    Turn { turn_id: &'a str },
    /// `chat` span: one per attempt of an `api_request_id` (1-based).
    Chat {
        api_request_id: &'a str,
        attempt: u32,
    },
    /// `execute_tool` span: provider tool call ids repeat across turns, so the
    /// turn is part of the key.
    Tool {
        turn_id: &'a str,
        tool_call_id: &'a str,
    },
    /// Subagent span: the child's session id.
    Subagent { child_session_id: &'a str },
    /// Approval span: the turn, the tool call (may be empty), the pattern
    /// key and the surface that asked (`smart`, `cli`, `gateway`), so that
    /// an escalated smart review and the question that follows differ.
    Approval {
        turn_id: &'a str,
        tool_call_id: &'a str,
        pattern_key: &'a str,
        surface: &'a str,
    },
}

/// Trace id of the trace rooted at a top-level turn.
pub fn trace_id(top_level_turn_id: &str) -> TraceId {
    let h = separated(b"hermes.trace", &[top_level_turn_id.as_bytes()], xxh3_128);
    if h == 0 {
        1u128.to_be_bytes()
    } else {
        h.to_be_bytes()
    }
}

/// Trace id of a top-level turn whose id another agent process (shim
/// instance) already holds: scoped by the instance, so that the two turns'
/// spans never share a trace id and span id. XXH3-128 of
/// `"hermes.trace.scoped\0" + instance_id + "\0" + turn_id`.
pub fn scoped_trace_id(instance_id: &str, top_level_turn_id: &str) -> TraceId {
    let h = separated(
        b"hermes.trace.scoped",
        &[instance_id.as_bytes(), top_level_turn_id.as_bytes()],
        xxh3_128,
    );
    if h == 0 {
        1u128.to_be_bytes()
    } else {
        h.to_be_bytes()
    }
}

/// Span id of a span.
pub fn span_id(key: SpanKey<'_>) -> SpanId {
    let mut digits = [0u8; 10];
    // The kind, then the parts.
    let parts: &[&[u8]] = match key {
        SpanKey::Turn { turn_id } => &[b"turn", turn_id.as_bytes()],
        SpanKey::Chat {
            api_request_id,
            attempt,
        } => &[
            b"chat",
            api_request_id.as_bytes(),
            decimal(attempt, &mut digits),
        ],
        SpanKey::Tool {
            turn_id,
            tool_call_id,
        } => &[b"tool", turn_id.as_bytes(), tool_call_id.as_bytes()],
        SpanKey::Subagent { child_session_id } => &[b"subagent", child_session_id.as_bytes()],
        SpanKey::Approval {
            turn_id,
            tool_call_id,
            pattern_key,
            surface,
        } => &[
            b"approval",
            turn_id.as_bytes(),
            tool_call_id.as_bytes(),
            pattern_key.as_bytes(),
            surface.as_bytes(),
        ],
    };
    let h = separated(b"hermes.span", parts, xxh3_64);
    if h == 0 {
        1u64.to_be_bytes()
    } else {
        h.to_be_bytes()
    }
}

/// `hash` of `prefix` + (`"\0"` + part)*, the key built on the stack when it
/// is short (the ids Hermes 0.19.0 makes are far shorter than its 256
/// bytes), so that an id costs no allocation.
fn separated<R>(prefix: &[u8], parts: &[&[u8]], hash: impl FnOnce(&[u8]) -> R) -> R {
    let len = prefix.len() + parts.iter().map(|p| 1 + p.len()).sum::<usize>();
    let mut stack = [0u8; 256];
    let mut heap = Vec::new();
    let buf = if len <= stack.len() {
        &mut stack[..len]
    } else {
        heap.resize(len, 0);
        &mut heap[..]
    };
    buf[..prefix.len()].copy_from_slice(prefix);
    let mut at = prefix.len();
    for p in parts {
        // buf[at] is already 0: the separator.
        buf[at + 1..at + 1 + p.len()].copy_from_slice(p);
        at += 1 + p.len();
    }
    hash(buf)
}

/// `n` in decimal ASCII, as `n.to_string()` writes it.
fn decimal(mut n: u32, digits: &mut [u8; 10]) -> &[u8] {
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &digits[at..];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn ids_are_stable_across_releases() {
        // Pinned values: changing the id function breaks trace continuity
        // across collector versions, so it must be a deliberate decision.
        assert_eq!(hex(&trace_id("s:t:1")), hex(&trace_id("s:t:1")));
        let pinned_trace = hex(&trace_id("20261129_200230_bbf019:944cce63:1b06e77d"));
        let pinned_span = hex(&span_id(SpanKey::Turn {
            turn_id: "20261129_200230_bbf019:944cce63:1b06e77d",
        }));
        assert_eq!(pinned_trace.len(), 32);
        assert_eq!(pinned_span.len(), 16);
        assert_eq!(pinned_trace, PINNED_TRACE);
        assert_eq!(pinned_span, PINNED_SPAN);
    }

    #[test]
    fn chat_ids_are_stable_across_releases() {
        let id = |attempt| {
            hex(&span_id(SpanKey::Chat {
                api_request_id: "req-1",
                attempt,
            }))
        };
        assert_eq!([id(1), id(12), id(u32::MAX)], PINNED_CHAT);
    }

    const PINNED_CHAT: [&str; 3] = ["d5331c661e4aba6f", "207dd9406f277789", "f94b5b22881d432d"];
    const PINNED_TRACE: &str = "b0a21f5e1b6bb3f5bdba887cacc0694e";
    const PINNED_SPAN: &str = "e69a46ced8262f59";

    #[test]
    fn long_keys_and_every_attempt_number_hash_as_their_text() {
        let long = "t".repeat(1000);
        let text = format!("hermes.span\0turn\0{long}");
        let expect = xxh3_64(text.as_bytes()).to_be_bytes();
        assert_eq!(span_id(SpanKey::Turn { turn_id: &long }), expect);
        for attempt in [0, 1, 9, 10, 99, 100, 4_294_967_295] {
            let text = format!("hermes.span\0chat\0req\0{attempt}");
            let expect = xxh3_64(text.as_bytes()).to_be_bytes();
            let got = span_id(SpanKey::Chat {
                api_request_id: "req",
                attempt,
            });
            assert_eq!(got, expect, "attempt {attempt}");
        }
    }

    #[test]
    fn kinds_and_parts_are_separated() {
        let a = span_id(SpanKey::Tool {
            turn_id: "ab",
            tool_call_id: "c",
        });
        let b = span_id(SpanKey::Tool {
            turn_id: "a",
            tool_call_id: "bc",
        });
        assert_ne!(a, b);
        let c = span_id(SpanKey::Chat {
            api_request_id: "x",
            attempt: 1,
        });
        let d = span_id(SpanKey::Chat {
            api_request_id: "x",
            attempt: 2,
        });
        assert_ne!(c, d);
        assert_ne!(
            span_id(SpanKey::Turn { turn_id: "x" }),
            span_id(SpanKey::Subagent {
                child_session_id: "x"
            })
        );
    }
}
