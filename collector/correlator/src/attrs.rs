//! Small builders for OTLP attribute lists.
//!
//! Keys are static strings (no allocation); string values are copied once
//! into a shared [`Str`], so the spans of a turn that repeat one (the
//! session id, the model) share it.

use hermes_span::Str;
use hermes_span::common::v1::{AnyValue, ArrayValue, KeyValue, any_value::Value};

/// An attribute list under construction. Empty strings are skipped: Hermes
/// passes `None` or `""` for absent values and a backend should not show them.
#[derive(Debug, Default, Clone)]
pub struct Attrs(pub Vec<KeyValue>);

/// One attribute.
pub(crate) fn kv(key: &'static str, value: Value) -> KeyValue {
    KeyValue {
        key: Str::from_static(key),
        value: Some(AnyValue { value: Some(value) }),
    }
}

impl Attrs {
    pub fn with_capacity(n: usize) -> Self {
        Self(Vec::with_capacity(n))
    }

    pub fn str(&mut self, key: &'static str, value: &str) -> &mut Self {
        if !value.is_empty() {
            self.0.push(kv(key, Value::StringValue(value.into())));
        }
        self
    }

    /// A fixed value: no allocation.
    pub fn fixed(&mut self, key: &'static str, value: &'static str) -> &mut Self {
        self.shared(key, &Str::from_static(value))
    }

    /// `shared` when `value` is its text (the turn's model on each chat
    /// span), else a copy of `value`.
    pub fn shared_or_str(&mut self, key: &'static str, shared: &Str, value: &str) -> &mut Self {
        if *shared == value {
            self.shared(key, shared)
        } else {
            self.str(key, value)
        }
    }

    /// A value that is already a [`Str`] (static, or shared with other
    /// spans): no copy.
    pub fn shared(&mut self, key: &'static str, value: &Str) -> &mut Self {
        if !value.is_empty() {
            self.0.push(kv(key, Value::StringValue(value.clone())));
        }
        self
    }

    pub fn int(&mut self, key: &'static str, value: i64) -> &mut Self {
        self.0.push(kv(key, Value::IntValue(value)));
        self
    }

    /// Unsigned values are clamped into OTLP's signed 64-bit integer.
    pub fn uint(&mut self, key: &'static str, value: u64) -> &mut Self {
        self.int(key, i64::try_from(value).unwrap_or(i64::MAX))
    }

    pub fn opt_uint(&mut self, key: &'static str, value: Option<u64>) -> &mut Self {
        if let Some(v) = value {
            self.uint(key, v);
        }
        self
    }

    pub fn bool(&mut self, key: &'static str, value: bool) -> &mut Self {
        self.0.push(kv(key, Value::BoolValue(value)));
        self
    }

    pub fn opt_bool(&mut self, key: &'static str, value: Option<bool>) -> &mut Self {
        if let Some(v) = value {
            self.bool(key, v);
        }
        self
    }

    pub fn str_array(&mut self, key: &'static str, values: &[&str]) -> &mut Self {
        let values = values
            .iter()
            .map(|v| AnyValue {
                value: Some(Value::StringValue((*v).into())),
            })
            .collect();
        self.0
            .push(kv(key, Value::ArrayValue(ArrayValue { values })));
        self
    }

    pub fn extend(&mut self, other: &Attrs) -> &mut Self {
        self.0.extend(other.0.iter().cloned());
        self
    }
}
