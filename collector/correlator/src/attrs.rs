//! Small builders for OTLP attribute lists.

use opentelemetry_proto::tonic::common::v1::{AnyValue, ArrayValue, KeyValue, any_value::Value};

/// An attribute list under construction. Empty strings are skipped: Hermes
/// passes `None` or `""` for absent values and a backend should not show them.
#[derive(Debug, Default, Clone)]
pub struct Attrs(pub Vec<KeyValue>);

/// One attribute.
pub(crate) fn kv(key: &str, value: Value) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

impl Attrs {
    pub fn with_capacity(n: usize) -> Self {
        Self(Vec::with_capacity(n))
    }

    pub fn str(&mut self, key: &str, value: &str) -> &mut Self {
        if !value.is_empty() {
            self.0.push(kv(key, Value::StringValue(value.to_owned())));
        }
        self
    }

    pub fn int(&mut self, key: &str, value: i64) -> &mut Self {
        self.0.push(kv(key, Value::IntValue(value)));
        self
    }

    /// Unsigned values are clamped into OTLP's signed 64-bit integer.
    pub fn uint(&mut self, key: &str, value: u64) -> &mut Self {
        self.int(key, i64::try_from(value).unwrap_or(i64::MAX))
    }

    pub fn opt_uint(&mut self, key: &str, value: Option<u64>) -> &mut Self {
        if let Some(v) = value {
            self.uint(key, v);
        }
        self
    }

    pub fn bool(&mut self, key: &str, value: bool) -> &mut Self {
        self.0.push(kv(key, Value::BoolValue(value)));
        self
    }

    pub fn opt_bool(&mut self, key: &str, value: Option<bool>) -> &mut Self {
        if let Some(v) = value {
            self.bool(key, v);
        }
        self
    }

    pub fn str_array(&mut self, key: &str, values: &[&str]) -> &mut Self {
        let values = values
            .iter()
            .map(|v| AnyValue {
                value: Some(Value::StringValue((*v).to_owned())),
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
