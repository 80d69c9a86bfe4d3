//! Truncation: cutting string attribute values to `max_attribute_bytes`.
//!
//! Owns the cutting rule. A value longer than the limit becomes:
//! - when it is a JSON object or array: a valid JSON document of at most
//!   `limit` bytes, written compact, that keeps the document's shape when
//!   it can ([`shape::shorten`]): the longest strings are cut first, each
//!   ending with `…[truncated N bytes]`; only when strings cut to
//!   [`shape::KEEP_BYTES`] still do not fit, whole elements of the largest
//!   arrays go (the middle of a message history first), replaced by one
//!   element of the same form saying how many went. Object members are
//!   never dropped, so a GenAI message keeps its `role`, a part its `type`
//!   and required fields. A GenAI message or part array that cannot hold
//!   even that one element becomes `[]`;
//! - when the shape cannot be kept (keys, numbers and short strings outside
//!   any array exceed the limit): the member-cutting fallback. Whole
//!   elements and members are kept from the start; the first one that does
//!   not fit is cut recursively (strings end with `…`); an array that lost
//!   elements ends with a `"…"` element, an object that lost members ends
//!   with `"_truncated":true`;
//! - otherwise (plain text): its longest prefix of at most `limit` bytes
//!   that ends on a UTF-8 character boundary.
//!
//! Invariants: the result is at most `limit` bytes; a JSON input gives a JSON
//! output (for any `limit` ≥ 2); the result of a value within the limit is
//! the value itself.

use hermes_span::common::v1::{AnyValue, any_value::Value};

use crate::json::{self, Json};
use crate::shape;

/// Marker ending a cut string, and the element ending an array that lost
/// elements (as a JSON string).
pub(crate) const ELLIPSIS: &str = "…";
/// `"…"` as a JSON string literal.
const ELLIPSIS_JSON: &str = "\"…\"";
/// The member ending an object that lost members.
const TRUNCATED_MEMBER: &str = "\"_truncated\":true";

/// `s` cut to at most `limit` bytes (see the module docs), or `None` when it
/// already fits.
pub(crate) fn truncate_str(s: &str, limit: usize) -> Option<String> {
    if s.len() <= limit {
        return None;
    }
    if let Some(doc) = json::parse_container(s) {
        if let Some(out) = shape::shorten(&doc, limit) {
            return Some(out);
        }
        let mut out = String::with_capacity(limit);
        if fit(&doc, limit, &mut out) {
            return Some(out);
        }
    }
    Some(s[..s.floor_char_boundary(limit)].to_owned())
}

/// Cuts every string (and bytes) value inside `v` to `limit`; returns
/// whether anything was cut.
pub(crate) fn truncate_any(v: &mut AnyValue, limit: usize) -> bool {
    match &mut v.value {
        Some(Value::StringValue(s)) => match truncate_str(s, limit) {
            Some(new) => {
                *s = new.into();
                true
            }
            None => false,
        },
        Some(Value::BytesValue(b)) if b.len() > limit => {
            b.truncate(limit);
            true
        }
        Some(Value::ArrayValue(array)) => {
            let mut cut = false;
            for item in &mut array.values {
                cut |= truncate_any(item, limit);
            }
            cut
        }
        Some(Value::KvlistValue(list)) => {
            let mut cut = false;
            for kv in &mut list.values {
                if let Some(value) = kv.value.as_mut() {
                    cut |= truncate_any(value, limit);
                }
            }
            cut
        }
        _ => false,
    }
}

/// Appends to `out` the best rendering of `v` in at most `budget` bytes;
/// returns `false` (with `out` unchanged) when not even a minimal form fits.
fn fit(v: &Json, budget: usize, out: &mut String) -> bool {
    if v.text_len() <= budget {
        v.write(out);
        return true;
    }
    match v {
        Json::String(s) => fit_str(s, budget, out),
        Json::Array(items) => fit_array(items, budget, out),
        Json::Object(members) => fit_object(members, budget, out),
        // Scalars cannot be shortened.
        Json::Null | Json::Bool(_) | Json::Number(_) => false,
    }
}

/// A string literal too long for `budget`: a prefix ending with `…`.
fn fit_str(s: &str, budget: usize, out: &mut String) -> bool {
    if budget < 2 {
        return false;
    }
    // `"` + prefix + `…"`
    let Some(room) = budget.checked_sub(2 + ELLIPSIS.len()) else {
        out.push_str("\"\"");
        return true;
    };
    out.push('"');
    json::write_escaped(json::escaped_prefix(s, room), out);
    out.push_str(ELLIPSIS);
    out.push('"');
    true
}

/// The brackets of an array or an object, and the entry that ends it when
/// entries were lost.
struct Brackets {
    open: char,
    close: char,
    lost: &'static str,
}

const ARRAY: Brackets = Brackets {
    open: '[',
    close: ']',
    lost: ELLIPSIS_JSON,
};

const OBJECT: Brackets = Brackets {
    open: '{',
    close: '}',
    lost: TRUNCATED_MEMBER,
};

/// An array too long for `budget`: whole elements from the start, the first
/// that does not fit cut, then `"…"` when elements were lost.
fn fit_array(items: &[Json], budget: usize, out: &mut String) -> bool {
    fit_entries(&ARRAY, items.iter().map(|v| (None, v)), budget, out)
}

/// An object too long for `budget`: whole members from the start, the value
/// of the first that does not fit cut, then `"_truncated":true` when members
/// were lost.
fn fit_object(members: &[(String, Json)], budget: usize, out: &mut String) -> bool {
    let entries = members.iter().map(|(k, v)| (Some(k.as_str()), v));
    fit_entries(&OBJECT, entries, budget, out)
}

/// The entries (an element, or a member's key and value) of an array or an
/// object too long for `budget`: whole entries from the start, the value of
/// the first that does not fit cut, then the `lost` entry when entries were
/// lost.
fn fit_entries<'a>(
    brackets: &Brackets,
    entries: impl ExactSizeIterator<Item = (Option<&'a str>, &'a Json)>,
    budget: usize,
    out: &mut String,
) -> bool {
    if budget < 2 {
        return false;
    }
    // Room for the `lost` entry alone (`["…"]`, `{"_truncated":true}`)?
    if budget < 2 + brackets.lost.len() {
        out.push(brackets.open);
        out.push(brackets.close);
        return true;
    }
    let start = out.len();
    out.push(brackets.open);
    // Room kept for `,` + the `lost` entry + the closing bracket.
    let tail = 1 + brackets.lost.len() + 1;
    let count = entries.len();
    let mut lost = true;
    for (i, (key, value)) in entries.enumerate() {
        let any = i > 0;
        let used = out.len() - start;
        let sep = usize::from(any);
        let key_len = key.map_or(0, |k| json::str_len(k) + 1);
        if used + sep + key_len + value.text_len() + tail <= budget {
            entry_head(any, key, out);
            value.write(out);
            continue;
        }
        // The entry does not fit whole: cut its value, then stop. The last
        // entry needs no `lost` entry after it, only the closing bracket.
        let last = i + 1 == count;
        let reserve = if last { 1 } else { tail };
        if let Some(room) = budget.checked_sub(used + sep + key_len + reserve) {
            let mark = out.len();
            entry_head(any, key, out);
            if fit(value, room, out) {
                lost = !last;
            } else {
                out.truncate(mark);
            }
        }
        break;
    }
    if lost {
        if out.len() - start > 1 {
            out.push(',');
        }
        out.push_str(brackets.lost);
    }
    out.push(brackets.close);
    true
}

/// What comes before an entry's value: `,` after another entry, then a
/// member's `"key":`.
fn entry_head(any: bool, key: Option<&str>, out: &mut String) {
    if any {
        out.push(',');
    }
    if let Some(key) = key {
        json::write_str(key, out);
        out.push(':');
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use hermes_e2e::json::arb_json;
    use proptest::prelude::*;

    fn cut(s: &str, limit: usize) -> String {
        truncate_str(s, limit).unwrap_or_else(|| s.to_owned())
    }

    #[test]
    fn plain_text_is_cut_on_a_char_boundary() {
        assert_eq!(cut("héllo", 2), "h");
        assert_eq!(cut("héllo", 3), "hé");
        assert_eq!(cut("héllo", 10), "héllo");
        assert_eq!(truncate_str("abc", 3), None);
    }

    #[test]
    fn json_cuts_keep_structure_and_markers() {
        let doc = r#"{"a":"0123456789","b":[1,2,3,4,5,6,7,8,9],"c":{"d":"x"}}"#;
        assert_eq!(cut(doc, 40), r#"{"a":"0123456789","_truncated":true}"#);
        assert_eq!(cut(doc, 30), r#"{"a":"0…","_truncated":true}"#);
        assert_eq!(
            cut(doc, 50),
            r#"{"a":"0123456789","b":[1,"…"],"_truncated":true}"#
        );
        assert_eq!(
            cut(doc, 54),
            r#"{"a":"0123456789","b":[1,2,3,"…"],"_truncated":true}"#
        );
        assert_eq!(
            cut("[\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"]", 12),
            "[\"aaaaa…\"]"
        );
        assert_eq!(cut("[1,2,3,4,5,6,7,8,9,10]", 12), "[1,2,\"…\"]");
        assert_eq!(cut("[1,2,3,4,5,6,7,8,9,10]", 13), "[1,2,3,\"…\"]");
        // A pretty-printed document that fits once compact.
        assert_eq!(cut("{\n  \"a\": 1,\n  \"b\": 2\n}", 16), r#"{"a":1,"b":2}"#);
    }

    #[test]
    fn tiny_budgets_still_give_json() {
        for limit in 2..24 {
            for doc in [
                r#"{"k":"vvvvvvvvvvvvvvvvvvvvvvvvv"}"#,
                r#"["vvvvvvvvvvvvvvvvvvvvvvvvvv"]"#,
            ] {
                let out = cut(doc, limit);
                assert!(out.len() <= limit, "{limit}: {out}");
                serde_json::from_str::<serde_json::Value>(&out)
                    .unwrap_or_else(|e| panic!("{limit}: {out}: {e}"));
            }
        }
    }

    /// How long this takes is `processor_truncate/many_small_arrays` in
    /// benches/benches/pipeline.rs.
    #[test]
    fn many_small_arrays_are_cut_to_json_within_the_limit() {
        let members: Vec<String> = (0..5000)
            .map(|i| format!("\"k{i}\":[\"{}\",2,3,4,5,6,7,8,9,10]", "v".repeat(40)))
            .collect();
        let doc = format!("{{{}}}", members.join(","));
        let out = cut(&doc, 4096);
        assert!(out.len() <= 4096);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let kept = v.as_object().unwrap();
        assert!(kept.contains_key("k0"), "the first members are kept: {out}");
        assert_eq!(kept.get("_truncated"), Some(&serde_json::Value::Bool(true)));
    }

    #[test]
    fn long_strings_are_cut_before_anything_goes() {
        let doc = serde_json::json!({"a": "x".repeat(300), "b": [1, 2, 3],
            "c": {"d": "é".repeat(300), "e": "short"}})
        .to_string();
        let out = cut(&doc, 200);
        assert!(out.len() <= 200, "{out}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["b"], serde_json::json!([1, 2, 3]));
        assert_eq!(v["c"]["e"], "short");
        for s in [&v["a"], &v["c"]["d"]] {
            assert!(s.as_str().unwrap().contains("…[truncated "), "{out}");
        }
    }

    proptest! {
        #[test]
        fn any_budget_from_two_gives_valid_json(doc in arb_json(), limit in 2usize..400) {
            let text = doc.to_string();
            let out = cut(&text, limit);
            if text.len() <= limit {
                prop_assert_eq!(&out, &text);
            } else {
                prop_assert!(out.len() <= limit, "{} bytes > {}", out.len(), limit);
            }
            let parsed: Result<serde_json::Value, _> = serde_json::from_str(&out);
            prop_assert!(parsed.is_ok(), "{} -> {}", text, out);
        }
    }
}
