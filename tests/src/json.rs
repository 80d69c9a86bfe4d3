//! Arbitrary JSON documents for property tests of what keeps JSON valid
//! (the processor's truncation): nested objects and arrays up to six deep,
//! with any printable text and the characters JSON must escape.

use proptest::prelude::*;
use serde_json::{Value, json};

/// A JSON object or array (a scalar comes wrapped as `{"value": …}`): what
/// the processor keeps JSON when it cuts a value.
pub fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "\\PC{0,60}".prop_map(Value::String),
        "[\"\\\\\\n\\t\\u{1}-\\u{1f}a-z]{0,30}".prop_map(Value::String),
    ];
    let tree = leaf.prop_recursive(6, 200, 12, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..12).prop_map(Value::Array),
            prop::collection::vec(("\\PC{0,16}", inner), 0..12)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    });
    tree.prop_map(|v| match v {
        v @ (Value::Array(_) | Value::Object(_)) => v,
        other => json!({ "value": other }),
    })
}
