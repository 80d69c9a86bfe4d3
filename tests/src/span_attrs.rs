//! Typed readers of the attributes of the collector's in-memory spans
//! (`hermes_span`, what the correlator emits and the processor rewrites).
//! [`crate::span_tree::AttrsExt`] reads the same from OTLP's prost messages
//! (what receivers get); these differ in that a value of another type than
//! asked is a test failure, not an absent value.

use hermes_span::common::v1::any_value::Value;
use hermes_span::trace::v1::Span;

/// The value of attribute `key`, if present.
pub fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

/// The string attribute `key`; panics when it is of another type.
pub fn string<'a>(span: &'a Span, key: &str) -> Option<&'a str> {
    match attr(span, key) {
        Some(Value::StringValue(s)) => Some(s),
        None => None,
        other => panic!("{key} is {other:?} on {}", span.name),
    }
}

/// The integer attribute `key`; panics when it is of another type.
pub fn int(span: &Span, key: &str) -> Option<i64> {
    match attr(span, key) {
        Some(Value::IntValue(i)) => Some(*i),
        None => None,
        other => panic!("{key} is {other:?} on {}", span.name),
    }
}

/// The boolean attribute `key`; panics when it is of another type.
pub fn boolean(span: &Span, key: &str) -> Option<bool> {
    match attr(span, key) {
        Some(Value::BoolValue(b)) => Some(*b),
        None => None,
        other => panic!("{key} is {other:?} on {}", span.name),
    }
}
