//! A small JSON document model for attribute values that hold JSON text.
//!
//! Owns parsing (through `serde_json`) and compact writing of [`Json`].
//! Unlike `serde_json::Value` without its `preserve_order` feature (which
//! this crate must not switch on for the whole workspace), objects keep their
//! members in document order, duplicates included, so a rewritten document
//! differs from the original only where the processor changed it.
//!
//! Invariants: [`Json::write`] produces compact JSON that `serde_json`
//! parses back to the same tree, and [`Json::text_len`] is exactly the byte
//! length [`Json::write`] produces (the truncation budget relies on it).

use std::fmt::{self, Write as _};

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// One JSON value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Json {
    Null,
    Bool(bool),
    Number(serde_json::Number),
    String(String),
    Array(Vec<Json>),
    /// Members in document order.
    Object(Vec<(String, Json)>),
}

/// Whether `text` may hold a JSON object or array: the cheap test done before
/// trying to parse it.
pub(crate) fn looks_like_container(text: &str) -> bool {
    matches!(
        text.trim_start().as_bytes().first(),
        Some(b'{') | Some(b'[')
    )
}

/// Parses `text` when it is a JSON object or array.
pub(crate) fn parse_container(text: &str) -> Option<Json> {
    if !looks_like_container(text) {
        return None;
    }
    match serde_json::from_str::<Json>(text) {
        Ok(v @ (Json::Array(_) | Json::Object(_))) => Some(v),
        _ => None,
    }
}

/// Whether `text` is a JSON object or array, without building a tree.
pub(crate) fn is_container(text: &str) -> bool {
    looks_like_container(text) && serde_json::from_str::<de::IgnoredAny>(text).is_ok()
}

impl Json {
    /// Appends the compact JSON text of `self` to `out`.
    pub(crate) fn write(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(true) => out.push_str("true"),
            Json::Bool(false) => out.push_str("false"),
            Json::Number(n) => write_number(n, out),
            Json::String(s) => write_str(s, out),
            Json::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    item.write(out);
                }
                out.push(']');
            }
            Json::Object(members) => write_object(members, out, |value, out| value.write(out)),
        }
    }

    /// The compact JSON text of `self`.
    pub(crate) fn to_text(&self) -> String {
        let mut out = String::with_capacity(self.text_len());
        self.write(&mut out);
        out
    }

    /// The byte length of [`Json::write`]'s output.
    pub(crate) fn text_len(&self) -> usize {
        match self {
            Json::Null => 4,
            Json::Bool(true) => 4,
            Json::Bool(false) => 5,
            Json::Number(n) => {
                let mut text = String::new();
                write_number(n, &mut text);
                text.len()
            }
            Json::String(s) => str_len(s),
            Json::Array(items) => {
                2 + items.iter().map(Json::text_len).sum::<usize>() + items.len().saturating_sub(1)
            }
            Json::Object(members) => {
                2 + members
                    .iter()
                    .map(|(k, v)| str_len(k) + 1 + v.text_len())
                    .sum::<usize>()
                    + members.len().saturating_sub(1)
            }
        }
    }
}

/// Appends a number as `serde_json` writes it (integers in decimal, floats
/// in their shortest round-trip form, e.g. `1.0`, `1e300`).
fn write_number(n: &serde_json::Number, out: &mut String) {
    if n.is_f64() {
        // Serializing a finite float cannot fail; `0` keeps the document
        // valid should that ever change.
        match serde_json::to_string(n) {
            Ok(text) => out.push_str(&text),
            Err(_) => out.push('0'),
        }
    } else {
        // Writing into a String cannot fail.
        let _ = write!(out, "{n}");
    }
}

/// Bytes `c` takes inside a JSON string literal (the escapes `serde_json`
/// uses: short forms for `"`, `\`, `\b`, `\f`, `\n`, `\r`, `\t`, `\u00XX` for
/// other control characters, everything else verbatim).
pub(crate) fn escaped_len(c: char) -> usize {
    match u8::try_from(c) {
        Ok(b) if b.is_ascii() => 1 + usize::from(ESCAPE_EXTRA[usize::from(b)]),
        _ => c.len_utf8(),
    }
}

/// The longest prefix of `s` (on a character boundary) whose escaped form
/// takes at most `room` bytes.
pub(crate) fn escaped_prefix(s: &str, room: usize) -> &str {
    let mut used = 0;
    let mut end = 0;
    for (i, c) in s.char_indices() {
        let n = escaped_len(c);
        if used + n > room {
            break;
        }
        used += n;
        end = i + c.len_utf8();
    }
    &s[..end]
}

/// Byte length of `s` written as a JSON string literal, quotes included.
/// Every escape replaces one ASCII byte, so the length is counted over
/// bytes (a multi-byte character is written verbatim).
pub(crate) fn str_len(s: &str) -> usize {
    // Chunks with nothing to escape (most of them) are found by a test the
    // compiler vectorizes; the table prices the escapes of the others.
    let extra: usize = s
        .as_bytes()
        .chunks(32)
        .map(|chunk| {
            let escapes = chunk.iter().fold(false, |any, &b| {
                any | (b < 0x20) | (b == b'"') | (b == b'\\')
            });
            if escapes {
                chunk
                    .iter()
                    .map(|&b| usize::from(ESCAPE_EXTRA[usize::from(b)]))
                    .sum()
            } else {
                0
            }
        })
        .sum();
    2 + s.len() + extra
}

/// Bytes an escape adds to a byte of a JSON string literal: 1 for the short
/// escapes, 5 for `\u00XX`, 0 for bytes written verbatim.
const ESCAPE_EXTRA: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut b = 0;
    while b < 0x20 {
        table[b] = 5;
        b += 1;
    }
    table[b'"' as usize] = 1;
    table[b'\\' as usize] = 1;
    table[0x08] = 1;
    table[0x0c] = 1;
    table[b'\n' as usize] = 1;
    table[b'\r' as usize] = 1;
    table[b'\t' as usize] = 1;
    table
};

/// Appends `s` as a JSON string literal.
/// Appends the JSON object of `members` to `out`, each value written by
/// `write_value`.
pub(crate) fn write_object<K: AsRef<str>, V>(
    members: &[(K, V)],
    out: &mut String,
    mut write_value: impl FnMut(&V, &mut String),
) {
    out.push('{');
    for (i, (key, value)) in members.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_str(key.as_ref(), out);
        out.push(':');
        write_value(value, out);
    }
    out.push('}');
}

pub(crate) fn write_str(s: &str, out: &mut String) {
    out.push('"');
    write_escaped(s, out);
    out.push('"');
}

/// Appends the escaped contents of `s` (no quotes).
pub(crate) fn write_escaped(s: &str, out: &mut String) {
    // Escapes replace single ASCII bytes, so every cut is on a character
    // boundary.
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        if ESCAPE_EXTRA[usize::from(b)] == 0 {
            continue;
        }
        out.push_str(&s[start..i]);
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            0x08 => out.push_str("\\b"),
            0x0c => out.push_str("\\f"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            _ => {
                let _ = write!(out, "\\u{:04x}", b);
            }
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Json, E> {
        Ok(Json::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Json, E> {
        Ok(Json::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Json, E> {
        Ok(Json::Number(v.into()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Json, E> {
        serde_json::Number::from_f64(v)
            .map(Json::Number)
            .ok_or_else(|| E::custom("non-finite number"))
    }

    fn visit_str<E>(self, v: &str) -> Result<Json, E> {
        Ok(Json::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Json, E> {
        Ok(Json::String(v))
    }

    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }

    fn visit_none<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut members = Vec::with_capacity(map.size_hint().unwrap_or(0));
        while let Some((key, value)) = map.next_entry::<String, Json>()? {
            members.push((key, value));
        }
        Ok(Json::Object(members))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn round_trips_in_document_order_with_exact_length() {
        let text = r#"{"z":1,"a":[true,false,null,-2.5,"q\"\\\n\u0001é…"],"z":{"k":"v"}}"#;
        let v = parse_container(text).unwrap();
        let out = v.to_text();
        assert_eq!(out, text);
        assert_eq!(v.text_len(), out.len());
        let reparsed: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(reparsed["a"][4], "q\"\\\n\u{1}é…");
    }

    fn assert_written_as_serde_json_writes(s: &str) {
        let mut out = String::new();
        write_str(s, &mut out);
        assert_eq!(out, serde_json::to_string(s).unwrap());
        assert_eq!(str_len(s), out.len());
    }

    #[test]
    fn strings_are_escaped_as_serde_json_escapes_them() {
        let every_ascii: String = (0u8..0x80).map(char::from).collect();
        assert_written_as_serde_json_writes(&every_ascii);
        assert_written_as_serde_json_writes("é…\u{7f}\u{80}\u{2028}😀\"\\\u{1f}");
        assert_written_as_serde_json_writes("");
    }

    proptest::proptest! {
        #[test]
        fn any_string_is_escaped_as_serde_json_escapes_it(s in ".*|[\\x00-\\x7f]*") {
            assert_written_as_serde_json_writes(&s);
        }
    }

    #[test]
    fn only_objects_and_arrays_are_containers() {
        assert!(parse_container("  [1]").is_some());
        assert!(parse_container("\"s\"").is_none());
        assert!(parse_container("12").is_none());
        assert!(parse_container("{broken").is_none());
        assert!(is_container(" {\"a\": 1} "));
        assert!(!is_container("{\"a\": 1"));
    }
}
