//! [`Kwargs`] over a Python kwargs dict, read on the sender thread.
//!
//! Owns: typed reads of the kwargs dict a hook callable received.
//!
//! Invariants: only called with the GIL held; `args` is read from the
//! hook-time snapshot when there is one (the live dict may have been mutated
//! by the agent since); values are never converted implicitly (a `bool` is
//! not an int, a `str` is not a number).

use std::collections::HashMap;

use hermes_proto::v1::{Scalar, scalar};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use super::pyjson::to_json;
use crate::convert::Kwargs;

/// The kwargs of one hook call.
pub(crate) struct PyKwargs<'py, 'a> {
    pub dict: Bound<'py, PyDict>,
    /// JSON text of `args` taken on the hook thread (capture level `content`).
    pub args_json: Option<&'a str>,
}

fn is_int(v: &Bound<'_, PyAny>) -> bool {
    v.is_instance_of::<PyInt>() && !v.is_instance_of::<PyBool>()
}

impl<'py> PyKwargs<'py, '_> {
    fn get(&self, key: &str) -> Option<Bound<'py, PyAny>> {
        self.dict
            .get_item(key)
            .ok()
            .flatten()
            .filter(|v| !v.is_none())
    }
}

impl Kwargs for PyKwargs<'_, '_> {
    fn string(&self, key: &str) -> Option<String> {
        let v = self.get(key)?;
        if let Ok(s) = v.cast::<PyString>() {
            Some(s.to_string_lossy().into_owned())
        } else if is_int(&v) {
            v.extract::<i64>().ok().map(|i| i.to_string())
        } else {
            None
        }
    }

    fn boolean(&self, key: &str) -> Option<bool> {
        self.get(key)?.cast::<PyBool>().ok().map(|b| b.is_true())
    }

    fn int(&self, key: &str) -> Option<i64> {
        let v = self.get(key)?;
        if is_int(&v) { v.extract().ok() } else { None }
    }

    fn float(&self, key: &str) -> Option<f64> {
        let v = self.get(key)?;
        if let Ok(f) = v.cast::<PyFloat>() {
            Some(f.value())
        } else if is_int(&v) {
            v.extract::<f64>().ok()
        } else {
            None
        }
    }

    fn strings(&self, key: &str) -> Vec<String> {
        let Some(v) = self.get(key) else {
            return Vec::new();
        };
        let items: Vec<Bound<'_, PyAny>> = if let Ok(l) = v.cast::<PyList>() {
            l.iter().collect()
        } else if let Ok(t) = v.cast::<PyTuple>() {
            t.iter().collect()
        } else {
            return Vec::new();
        };
        items
            .iter()
            .filter_map(|i| {
                i.cast::<PyString>()
                    .ok()
                    .map(|s| s.to_string_lossy().into_owned())
            })
            .collect()
    }

    fn map(&self, key: &str) -> Option<Self> {
        let dict = self.get(key)?.cast::<PyDict>().ok()?.clone();
        Some(PyKwargs {
            dict,
            args_json: None,
        })
    }

    fn json(&self, key: &str) -> Option<String> {
        if key == "args"
            && let Some(snapshot) = self.args_json
        {
            return Some(snapshot.to_owned());
        }
        self.get(key).map(|v| to_json(&v))
    }

    fn scalars(&self) -> HashMap<String, Scalar> {
        let mut fields = HashMap::new();
        for item in self.dict.items().iter() {
            let Ok((k, v)) = item.extract::<(Bound<'_, PyAny>, Bound<'_, PyAny>)>() else {
                continue;
            };
            let Ok(k) = k.cast::<PyString>() else {
                continue;
            };
            let value = if let Ok(s) = v.cast::<PyString>() {
                scalar::Value::StringValue(s.to_string_lossy().into_owned())
            } else if let Ok(b) = v.cast::<PyBool>() {
                scalar::Value::BoolValue(b.is_true())
            } else if let Ok(f) = v.cast::<PyFloat>() {
                scalar::Value::DoubleValue(f.value())
            } else if is_int(&v) {
                match v.extract::<i64>() {
                    Ok(i) => scalar::Value::IntValue(i),
                    Err(_) => continue,
                }
            } else {
                continue;
            };
            fields.insert(
                k.to_string_lossy().into_owned(),
                Scalar { value: Some(value) },
            );
        }
        fields
    }
}
