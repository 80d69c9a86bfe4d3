//! Shape-keeping truncation of a JSON document: the first rule
//! `truncate.rs` tries on an attribute value that holds JSON.
//!
//! Owns the rule that a cut document keeps its schema. Nothing here removes
//! an object member or changes a value's type:
//! 1. **strings first**: the longest string values (never object keys) are
//!    cut to a common length, the largest that lets the document fit (water
//!    filling), each ending with `…[truncated N bytes]` (N: the bytes of the
//!    string removed; a plain `…` when the marker itself does not fit).
//!    Strings of at most [`KEEP_BYTES`] (roles, part types, finish reasons,
//!    ids, short names) are never cut;
//! 2. **then elements**, only when strings cannot be cut enough: arrays
//!    lose whole elements, the array with the most droppable elements
//!    first, the elided run replaced by one element saying how many went,
//!    in the form of the array's elements ([`Marker`]): a GenAI message
//!    `{"role":"system","parts":[{"type":"text","content":"[N messages
//!    elided]"}]}` (with `"finish_reason":"stop"` in output messages), a
//!    text part `{"type":"text","content":"[N parts elided]"}`, an
//!    OpenAI-style `{"role":"system","content":"[N messages elided]"}`, or
//!    the string `"[N elements elided]"`. Two rounds:
//!    - middle elements (all but the first and the last), oldest first,
//!      until strings need not be cut below `limit / 8` bytes (between
//!      [`KEEP_BYTES`] and [`READABLE_BYTES`]): a long history keeps its
//!      first and newest messages readable rather than every one a stub;
//!    - then any element (the middle ones, the first, the last), until
//!      strings cut to [`KEEP_BYTES`] fit.
//!
//!    Step 1 then runs with the room left.
//!
//! Each round of dropping reduces at most [`MAX_ROUNDS`] arrays, which
//! bounds the work on hostile documents of many small arrays.
//!
//! A GenAI message array or part array (`gen_ai.input.messages`,
//! `gen_ai.output.messages`, `gen_ai.system_instructions`, and their
//! OpenInference copies `input.value`/`output.value`) too big for even one
//! marker (or beyond the rounds) becomes `[]`, which is still schema-valid.
//! [`shorten`] gives up (`None`) only on other documents whose keys,
//! numbers and short strings alone exceed the limit (or beyond the rounds);
//! the caller then cuts members.
//!
//! Invariants: the result is compact JSON of at most `limit` bytes; every
//! object keeps all its members, every value keeps its type; every element
//! kept is kept whole apart from its strings.

use crate::json::{self, Json};
use crate::truncate::ELLIPSIS;

/// String literals (quotes included) of at most this many bytes are never
/// cut: schema enums and identifiers live there.
pub(crate) const KEEP_BYTES: usize = 32;

/// Middle elements go before strings are cut below `limit / 8` bytes, or
/// this many: a cut history shows readable messages, not stubs.
pub(crate) const READABLE_BYTES: usize = 1024;

/// Arrays reduced per round of dropping. Each costs a walk of the document,
/// so this bounds the work on documents of many small arrays (a message
/// history needs a few: its message array and its largest part arrays).
const MAX_ROUNDS: usize = 32;

/// The marker ending a cut string; `N` is the removed byte count.
fn cut_marker(removed: usize) -> String {
    format!("…[truncated {removed} bytes]")
}

/// The shape of an array's elements, which decides its elision marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Marker {
    /// GenAI messages: `{role, parts}`; `finish_reason` in output messages.
    Message { finish_reason: bool },
    /// OpenAI-style messages: `{role, content}`.
    ContentMessage,
    /// GenAI message parts: `{type, ...}`.
    Part,
    /// Anything else: a string element.
    Element,
}

impl Marker {
    fn of(items: &[Node<'_>]) -> Self {
        let objects = || {
            items.iter().map(|n| match n {
                Node::Object(m) => Some(m.as_slice()),
                _ => None,
            })
        };
        if items.is_empty() || objects().any(|m| m.is_none()) {
            return Marker::Element;
        }
        let all = |keys: &[&str]| {
            objects()
                .flatten()
                .all(|m| keys.iter().all(|key| m.iter().any(|(k, _)| k == key)))
        };
        if all(&["role", "parts"]) {
            Marker::Message {
                finish_reason: all(&["finish_reason"]),
            }
        } else if all(&["role", "content"]) {
            Marker::ContentMessage
        } else if all(&["type"]) {
            Marker::Part
        } else {
            Marker::Element
        }
    }

    /// Whether the array is a GenAI message or part array, for which `[]`
    /// is the schema-valid last resort.
    fn is_schema(self) -> bool {
        matches!(self, Marker::Message { .. } | Marker::Part)
    }

    /// Appends the element standing for `n` elided elements.
    fn write(self, n: usize, out: &mut String) {
        let (noun, plural) = match self {
            Marker::Message { .. } | Marker::ContentMessage => ("message", "messages"),
            Marker::Part => ("part", "parts"),
            Marker::Element => ("element", "elements"),
        };
        let text = format!("[{n} {} elided]", if n == 1 { noun } else { plural });
        match self {
            Marker::Message { finish_reason } => {
                out.push_str(r#"{"role":"system","parts":[{"type":"text","content":"#);
                json::write_str(&text, out);
                out.push_str("}]");
                if finish_reason {
                    out.push_str(r#","finish_reason":"stop""#);
                }
                out.push('}');
            }
            Marker::ContentMessage => {
                out.push_str(r#"{"role":"system","content":"#);
                json::write_str(&text, out);
                out.push('}');
            }
            Marker::Part => {
                out.push_str(r#"{"type":"text","content":"#);
                json::write_str(&text, out);
                out.push('}');
            }
            Marker::Element => json::write_str(&text, out),
        }
    }

    fn len(self, n: usize) -> usize {
        let mut out = String::new();
        self.write(n, &mut out);
        out.len()
    }
}

/// A document being cut: borrowed from the parsed [`Json`], with arrays that
/// can lose elements.
enum Node<'a> {
    /// `null`, a boolean or a number.
    Scalar(&'a Json),
    /// A string value and its literal length.
    Str(&'a str, usize),
    Array(Array<'a>),
    Object(Vec<(&'a str, Node<'a>)>),
}

struct Array<'a> {
    /// Kept elements; the marker (if any) goes after the first `head`.
    items: Vec<Node<'a>>,
    head: usize,
    /// Elements dropped, and the shape of their marker.
    elided: usize,
    marker: Marker,
}

impl<'a> Node<'a> {
    fn new(v: &'a Json) -> Self {
        match v {
            Json::String(s) => Node::Str(s, json::str_len(s)),
            Json::Array(items) => {
                let items: Vec<Node<'a>> = items.iter().map(Node::new).collect();
                let marker = Marker::of(&items);
                Node::Array(Array {
                    head: usize::from(!items.is_empty()),
                    items,
                    elided: 0,
                    marker,
                })
            }
            Json::Object(members) => Node::Object(
                members
                    .iter()
                    .map(|(k, v)| (k.as_str(), Node::new(v)))
                    .collect(),
            ),
            Json::Null | Json::Bool(_) | Json::Number(_) => Node::Scalar(v),
        }
    }

    /// Byte length when every string literal longer than `cap` is cut to
    /// at most `cap`.
    fn len_at(&self, cap: usize) -> usize {
        match self {
            Node::Scalar(v) => v.text_len(),
            Node::Str(_, len) => (*len).min(cap),
            Node::Array(a) => {
                let marker = usize::from(a.elided > 0);
                let count = a.items.len() + marker;
                2 + count.saturating_sub(1)
                    + a.items.iter().map(|n| n.len_at(cap)).sum::<usize>()
                    + if a.elided > 0 {
                        a.marker.len(a.elided)
                    } else {
                        0
                    }
            }
            Node::Object(members) => {
                2 + members.len().saturating_sub(1)
                    + members
                        .iter()
                        .map(|(k, v)| json::str_len(k) + 1 + v.len_at(cap))
                        .sum::<usize>()
            }
        }
    }

    /// Pushes the literal length of every string value.
    fn string_lens(&self, out: &mut Vec<usize>) {
        match self {
            Node::Scalar(_) => {}
            Node::Str(_, len) => out.push(*len),
            Node::Array(a) => a.items.iter().for_each(|n| n.string_lens(out)),
            Node::Object(m) => m.iter().for_each(|(_, v)| v.string_lens(out)),
        }
    }

    /// The path (element or member indices) to the array with the most
    /// elements, the outermost first among equals.
    fn largest_array(
        &self,
        middle_only: bool,
        path: &mut Vec<usize>,
        best: &mut Option<(usize, Vec<usize>)>,
    ) {
        let children: Box<dyn Iterator<Item = &Node<'a>>> = match self {
            Node::Array(a) => {
                let n = a.droppable(middle_only);
                if n > 0 && best.as_ref().is_none_or(|(m, _)| n > *m) {
                    *best = Some((n, path.clone()));
                }
                Box::new(a.items.iter())
            }
            Node::Object(m) => Box::new(m.iter().map(|(_, v)| v)),
            Node::Scalar(_) | Node::Str(..) => return,
        };
        for (i, child) in children.enumerate() {
            path.push(i);
            child.largest_array(middle_only, path, best);
            path.pop();
        }
    }

    fn at_mut(&mut self, path: &[usize]) -> Option<&mut Node<'a>> {
        let Some((&first, rest)) = path.split_first() else {
            return Some(self);
        };
        let child = match self {
            Node::Array(a) => a.items.get_mut(first)?,
            Node::Object(m) => &mut m.get_mut(first)?.1,
            Node::Scalar(_) | Node::Str(..) => return None,
        };
        child.at_mut(rest)
    }

    fn write(&self, cap: usize, out: &mut String) {
        match self {
            Node::Scalar(v) => v.write(out),
            Node::Str(s, len) if *len > cap => write_cut(s, cap, out),
            Node::Str(s, _) => json::write_str(s, out),
            Node::Array(a) => {
                out.push('[');
                let mut first = true;
                let mut sep = |out: &mut String| {
                    if !std::mem::take(&mut first) {
                        out.push(',');
                    }
                };
                for (i, item) in a.items.iter().enumerate() {
                    if i == a.head && a.elided > 0 {
                        sep(out);
                        a.marker.write(a.elided, out);
                    }
                    sep(out);
                    item.write(cap, out);
                }
                if a.head >= a.items.len() && a.elided > 0 {
                    sep(out);
                    a.marker.write(a.elided, out);
                }
                out.push(']');
            }
            Node::Object(members) => json::write_object(members, out, |v, out| v.write(cap, out)),
        }
    }
}

impl Array<'_> {
    /// Elements that may go: those between the first and the last with
    /// `middle_only`, else all.
    fn droppable(&self, middle_only: bool) -> usize {
        if middle_only {
            self.items.len().saturating_sub(self.head + 1)
        } else {
            self.items.len()
        }
    }

    /// Drops elements (see the module docs for the order) until about
    /// `excess` bytes (at string cap `cap`) are saved or none that may go
    /// is left.
    fn drop_elements(&mut self, excess: usize, cap: usize, middle_only: bool) {
        let mut saved = 0usize;
        while self.droppable(middle_only) > 0 {
            let victim = if self.items.len() - self.head >= 2 {
                self.head
            } else {
                self.head = 0;
                0
            };
            let item = self.items.remove(victim);
            saved += item.len_at(cap) + 1;
            self.elided += 1;
            if saved.saturating_sub(self.marker.len(self.elided) + 1) >= excess {
                break;
            }
        }
    }
}

/// Appends `s` as a string literal of at most `cap` bytes (`cap` ≥ 2): a
/// prefix and the cut marker.
fn write_cut(s: &str, cap: usize, out: &mut String) {
    let room = cap.saturating_sub(2);
    // The marker's digits are at most those of `s.len()`.
    let full = cut_marker(s.len()).len();
    let (budget, full_marker) = if room >= full {
        (room - full, true)
    } else {
        (room.saturating_sub(ELLIPSIS.len()), false)
    };
    let kept = json::escaped_prefix(s, budget);
    out.push('"');
    json::write_escaped(kept, out);
    if full_marker {
        out.push_str(&cut_marker(s.len() - kept.len()));
    } else if room >= ELLIPSIS.len() {
        out.push_str(ELLIPSIS);
    }
    out.push('"');
}

/// `doc` cut to at most `limit` bytes keeping its shape (see the module
/// docs), or `None` when only dropping members could make it fit.
pub(crate) fn shorten(doc: &Json, limit: usize) -> Option<String> {
    let mut root = Node::new(doc);
    let schema_root = matches!(&root, Node::Array(a) if a.marker.is_schema());
    // Middle elements first, for readable strings; then any, for any
    // strings at all.
    let readable = (limit / 8).clamp(KEEP_BYTES, READABLE_BYTES);
    reduce(&mut root, limit, readable, true);
    if !reduce(&mut root, limit, KEEP_BYTES, false) {
        return schema_root.then(|| "[]".to_owned()).filter(|_| limit >= 2);
    }
    let cap = water_level(&root, limit);
    let mut out = String::with_capacity(limit);
    root.write(cap, &mut out);
    (out.len() <= limit).then_some(out)
}

/// Drops elements of the largest arrays (only middle ones with
/// `middle_only`) until `root` fits `limit` with strings cut to `cap`;
/// returns whether it does.
fn reduce(root: &mut Node<'_>, limit: usize, cap: usize, middle_only: bool) -> bool {
    for _ in 0..MAX_ROUNDS {
        let len = root.len_at(cap);
        if len <= limit {
            return true;
        }
        let mut best = None;
        root.largest_array(middle_only, &mut Vec::new(), &mut best);
        let Some((_, path)) = best else {
            return false;
        };
        match root.at_mut(&path) {
            Some(Node::Array(a)) => a.drop_elements(len - limit, cap, middle_only),
            _ => return false,
        }
    }
    root.len_at(cap) <= limit
}

/// The largest string cap (≥ [`KEEP_BYTES`]) at which `root` fits `limit`.
fn water_level(root: &Node<'_>, limit: usize) -> usize {
    let mut lens = Vec::new();
    root.string_lens(&mut lens);
    let strings: usize = lens.iter().sum();
    let fixed = root.len_at(usize::MAX) - strings;
    let fits = |cap: usize| fixed + lens.iter().map(|&l| l.min(cap)).sum::<usize>() <= limit;
    let (mut lo, mut hi) = (KEEP_BYTES, lens.iter().copied().max().unwrap_or(0));
    if hi <= lo || fits(hi) {
        return hi.max(lo);
    }
    // Invariant: fits(lo), !fits(hi).
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}
