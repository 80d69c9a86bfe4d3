//! Python values to JSON text, on the calling thread.
//!
//! Owns: the deep copy of mutable hook values (the hook-time snapshot of
//! `args` at capture level `content`) and the JSON text of content kwargs.
//!
//! Invariants: never fails and never raises: values JSON cannot express are
//! written as their `str()` (or `null` if even that fails); non-finite floats
//! are `null`; nesting deeper than [`MAX_DEPTH`] is cut to `"…"`; dicts are
//! read through a snapshot of their items, so a dict changed by another thread
//! while `str()` of some value runs Python code cannot break the walk.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

/// Deepest nesting written out.
pub(crate) const MAX_DEPTH: usize = 32;

/// The JSON text of `value`.
pub(crate) fn to_json(value: &Bound<'_, PyAny>) -> String {
    let mut out = Vec::with_capacity(128);
    write_value(value, &mut out, 0);
    // serde_json and the literals below only write UTF-8.
    String::from_utf8(out).unwrap_or_default()
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    // Writing a &str to a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

fn write_display(out: &mut Vec<u8>, value: &Bound<'_, PyAny>) {
    match value.str() {
        Ok(s) => write_str(out, &s.to_string_lossy()),
        Err(_) => out.extend_from_slice(b"null"),
    }
}

fn write_items<'py>(
    items: impl Iterator<Item = Bound<'py, PyAny>>,
    out: &mut Vec<u8>,
    depth: usize,
) {
    out.push(b'[');
    for (i, item) in items.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_value(&item, out, depth + 1);
    }
    out.push(b']');
}

fn write_value(value: &Bound<'_, PyAny>, out: &mut Vec<u8>, depth: usize) {
    if value.is_none() {
        out.extend_from_slice(b"null");
    } else if let Ok(s) = value.cast::<PyString>() {
        write_str(out, &s.to_string_lossy());
    } else if let Ok(b) = value.cast::<PyBool>() {
        out.extend_from_slice(if b.is_true() { b"true" } else { b"false" });
    } else if value.is_instance_of::<PyInt>() {
        if let Ok(i) = value.extract::<i64>() {
            out.extend_from_slice(i.to_string().as_bytes());
        } else if let Ok(u) = value.extract::<u64>() {
            out.extend_from_slice(u.to_string().as_bytes());
        } else {
            // A big int: its decimal digits are a valid JSON number.
            match value.str() {
                Ok(s) => out.extend_from_slice(s.to_string_lossy().as_bytes()),
                Err(_) => out.extend_from_slice(b"null"),
            }
        }
    } else if let Ok(f) = value.cast::<PyFloat>() {
        let x = f.value();
        if x.is_finite() {
            let _ = serde_json::to_writer(&mut *out, &x);
        } else {
            out.extend_from_slice(b"null");
        }
    } else if depth >= MAX_DEPTH {
        write_str(out, "…");
    } else if let Ok(d) = value.cast::<PyDict>() {
        out.push(b'{');
        let mut first = true;
        for item in d.items().iter() {
            let Ok((k, v)) = item.extract::<(Bound<'_, PyAny>, Bound<'_, PyAny>)>() else {
                continue;
            };
            if !first {
                out.push(b',');
            }
            first = false;
            match k.cast::<PyString>() {
                Ok(k) => write_str(out, &k.to_string_lossy()),
                Err(_) => write_display(out, &k),
            }
            out.push(b':');
            write_value(&v, out, depth + 1);
        }
        out.push(b'}');
    } else if let Ok(l) = value.cast::<PyList>() {
        write_items(l.iter(), out, depth);
    } else if let Ok(t) = value.cast::<PyTuple>() {
        write_items(t.iter(), out, depth);
    } else {
        write_display(out, value);
    }
}
