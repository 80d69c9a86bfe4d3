//! The parent/child structure of received spans, and attribute getters, for
//! assertions on the trace the collector produced.
//!
//! Spans are identified by `(trace_id, span_id)`. A span delivered more than
//! once (redelivery) appears once in the tree (the last copy wins) and is
//! reported by [`SpanTree::duplicates`].

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValueKind;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::{Event, SpanKind};
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;

/// Lower-case hex of an id (trace or span).
pub fn hex(id: &[u8]) -> String {
    id.iter()
        .fold(String::with_capacity(id.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// Getters over a list of attributes (`Span::attributes`,
/// `Resource::attributes`, `Event::attributes`).
pub trait AttrsExt {
    /// The attributes.
    fn attr_list(&self) -> &[KeyValue];

    /// The value of `key`, if present.
    fn attr(&self, key: &str) -> Option<&AnyValueKind> {
        self.attr_list()
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.as_ref())
            .and_then(|v| v.value.as_ref())
    }

    /// Whether `key` is present.
    fn has_attr(&self, key: &str) -> bool {
        self.attr_list().iter().any(|kv| kv.key == key)
    }

    /// A string value.
    fn str_attr(&self, key: &str) -> Option<&str> {
        match self.attr(key)? {
            AnyValueKind::StringValue(s) => Some(s),
            _ => None,
        }
    }

    /// An int value.
    fn int_attr(&self, key: &str) -> Option<i64> {
        match self.attr(key)? {
            AnyValueKind::IntValue(i) => Some(*i),
            _ => None,
        }
    }

    /// A double value (an int value converts).
    fn double_attr(&self, key: &str) -> Option<f64> {
        match self.attr(key)? {
            AnyValueKind::DoubleValue(d) => Some(*d),
            AnyValueKind::IntValue(i) => Some(*i as f64),
            _ => None,
        }
    }

    /// A bool value.
    fn bool_attr(&self, key: &str) -> Option<bool> {
        match self.attr(key)? {
            AnyValueKind::BoolValue(b) => Some(*b),
            _ => None,
        }
    }

    /// An array value, as its elements.
    fn array_attr(&self, key: &str) -> Option<Vec<&AnyValueKind>> {
        match self.attr(key)? {
            AnyValueKind::ArrayValue(a) => {
                Some(a.values.iter().filter_map(|v| v.value.as_ref()).collect())
            }
            _ => None,
        }
    }

    /// An array of strings (None if absent, not an array, or any element is
    /// not a string).
    fn str_array_attr(&self, key: &str) -> Option<Vec<String>> {
        self.array_attr(key)?
            .into_iter()
            .map(|v| match v {
                AnyValueKind::StringValue(s) => Some(s.clone()),
                _ => None,
            })
            .collect()
    }

    /// An array of ints.
    fn int_array_attr(&self, key: &str) -> Option<Vec<i64>> {
        self.array_attr(key)?
            .into_iter()
            .map(|v| match v {
                AnyValueKind::IntValue(i) => Some(*i),
                _ => None,
            })
            .collect()
    }

    /// Asserts every `(key, value)` of `expected` is a string attribute
    /// with that value; `context` describes the subject for the message.
    fn assert_str_attrs(&self, expected: &[(&str, &str)], context: impl Fn() -> String) {
        for (key, value) in expected {
            assert_eq!(self.str_attr(key), Some(*value), "{key} of {}", context());
        }
    }

    /// As [`assert_str_attrs`](Self::assert_str_attrs) for int attributes.
    fn assert_int_attrs(&self, expected: &[(&str, i64)], context: impl Fn() -> String) {
        for (key, value) in expected {
            assert_eq!(self.int_attr(key), Some(*value), "{key} of {}", context());
        }
    }

    /// All attributes as `key -> display string`, sorted, for messages.
    fn attr_map(&self) -> BTreeMap<String, String> {
        self.attr_list()
            .iter()
            .map(|kv| (kv.key.clone(), display_value(kv.value.as_ref())))
            .collect()
    }
}

impl AttrsExt for Span {
    fn attr_list(&self) -> &[KeyValue] {
        &self.attributes
    }
}

impl AttrsExt for Resource {
    fn attr_list(&self) -> &[KeyValue] {
        &self.attributes
    }
}

impl AttrsExt for Event {
    fn attr_list(&self) -> &[KeyValue] {
        &self.attributes
    }
}

impl AttrsExt for [KeyValue] {
    fn attr_list(&self) -> &[KeyValue] {
        self
    }
}

/// A short display form of an attribute value.
pub fn display_value(value: Option<&AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        None => "<none>".to_string(),
        Some(AnyValueKind::StringValue(s)) => format!("{s:?}"),
        Some(AnyValueKind::BoolValue(b)) => b.to_string(),
        Some(AnyValueKind::IntValue(i)) => i.to_string(),
        Some(AnyValueKind::DoubleValue(d)) => d.to_string(),
        Some(AnyValueKind::BytesValue(b)) => format!("0x{}", hex(b)),
        Some(AnyValueKind::ArrayValue(a)) => {
            let items: Vec<String> = a.values.iter().map(|v| display_value(Some(v))).collect();
            format!("[{}]", items.join(", "))
        }
        Some(AnyValueKind::KvlistValue(kv)) => {
            let items: Vec<String> = kv
                .values
                .iter()
                .map(|kv| format!("{}={}", kv.key, display_value(kv.value.as_ref())))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        Some(other) => format!("{other:?}"),
    }
}

/// Convenience accessors on a span.
pub trait SpanExt {
    /// The span.
    fn span(&self) -> &Span;

    /// Hex trace id.
    fn trace_id_hex(&self) -> String {
        hex(&self.span().trace_id)
    }

    /// Hex span id.
    fn span_id_hex(&self) -> String {
        hex(&self.span().span_id)
    }

    /// Hex parent span id (empty for a root).
    fn parent_id_hex(&self) -> String {
        hex(&self.span().parent_span_id)
    }

    /// Whether it has no parent.
    fn is_root(&self) -> bool {
        self.span().parent_span_id.iter().all(|b| *b == 0)
    }

    /// Its kind.
    fn kind(&self) -> SpanKind {
        SpanKind::try_from(self.span().kind).unwrap_or(SpanKind::Unspecified)
    }

    /// Its status code (UNSET when absent).
    fn status_code(&self) -> StatusCode {
        self.span()
            .status
            .as_ref()
            .and_then(|s| StatusCode::try_from(s.code).ok())
            .unwrap_or(StatusCode::Unset)
    }

    /// Its status message (empty when absent).
    fn status_message(&self) -> &str {
        self.span()
            .status
            .as_ref()
            .map(|s| s.message.as_str())
            .unwrap_or("")
    }

    /// Duration in nanoseconds (0 if the end is before the start).
    fn duration_nanos(&self) -> u64 {
        let s = self.span();
        s.end_time_unix_nano.saturating_sub(s.start_time_unix_nano)
    }

    /// The events named `name`.
    fn events_named(&self, name: &str) -> Vec<&Event> {
        self.span()
            .events
            .iter()
            .filter(|e| e.name == name)
            .collect()
    }
}

impl SpanExt for Span {
    fn span(&self) -> &Span {
        self
    }
}

type SpanKey = (Vec<u8>, Vec<u8>);

/// The received spans as a forest: roots, children, parents.
#[derive(Clone, Debug, Default)]
pub struct SpanTree {
    spans: Vec<Span>,
    resources: Vec<Resource>,
    index: HashMap<SpanKey, usize>,
    children: HashMap<SpanKey, Vec<usize>>,
    duplicates: Vec<Span>,
}

fn key(span: &Span) -> SpanKey {
    (span.trace_id.clone(), span.span_id.clone())
}

fn parent_key(span: &Span) -> Option<SpanKey> {
    if span.parent_span_id.iter().all(|b| *b == 0) {
        None
    } else {
        Some((span.trace_id.clone(), span.parent_span_id.clone()))
    }
}

impl SpanTree {
    /// Builds the tree from spans with their resources (as returned by the
    /// receivers' `spans()`).
    pub fn new(received: impl IntoIterator<Item = (Resource, Span)>) -> SpanTree {
        let mut tree = SpanTree::default();
        for (resource, span) in received {
            let k = key(&span);
            if let Some(&i) = tree.index.get(&k) {
                let previous = std::mem::replace(&mut tree.spans[i], span);
                tree.resources[i] = resource;
                tree.duplicates.push(previous);
            } else {
                tree.index.insert(k, tree.spans.len());
                tree.spans.push(span);
                tree.resources.push(resource);
            }
        }
        for (i, span) in tree.spans.iter().enumerate() {
            if let Some(pk) = parent_key(span) {
                tree.children.entry(pk).or_default().push(i);
            }
        }
        for list in tree.children.values_mut() {
            list.sort_by_key(|&i| {
                (
                    tree.spans[i].start_time_unix_nano,
                    tree.spans[i].name.clone(),
                )
            });
        }
        tree
    }

    /// All distinct spans, in arrival order.
    pub fn spans(&self) -> &[Span] {
        &self.spans
    }

    /// Number of distinct spans.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// Whether there are no spans.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Earlier copies of spans that were received again (same trace and
    /// span id).
    pub fn duplicates(&self) -> &[Span] {
        &self.duplicates
    }

    /// The resource a span came with.
    pub fn resource_of(&self, span: &Span) -> Option<&Resource> {
        self.index.get(&key(span)).map(|&i| &self.resources[i])
    }

    /// The span with this trace and span id.
    pub fn get(&self, trace_id: &[u8], span_id: &[u8]) -> Option<&Span> {
        self.index
            .get(&(trace_id.to_vec(), span_id.to_vec()))
            .map(|&i| &self.spans[i])
    }

    /// The first span (in arrival order) named exactly `name`.
    pub fn find(&self, name: &str) -> Option<&Span> {
        self.spans.iter().find(|s| s.name == name)
    }

    /// The only span named `name`; panics (listing the tree) if there are
    /// none or several.
    pub fn expect_one(&self, name: &str) -> &Span {
        let found = self.find_all(name);
        match found.as_slice() {
            [one] => one,
            _ => panic!(
                "expected exactly one span named {name:?}, found {}\n{}",
                found.len(),
                self.render()
            ),
        }
    }

    /// Every span named exactly `name`, by start time.
    pub fn find_all(&self, name: &str) -> Vec<&Span> {
        self.sorted(self.spans.iter().filter(|s| s.name == name).collect())
    }

    /// Every span whose name starts with `prefix`, by start time.
    pub fn find_prefix(&self, prefix: &str) -> Vec<&Span> {
        self.sorted(
            self.spans
                .iter()
                .filter(|s| s.name.starts_with(prefix))
                .collect(),
        )
    }

    /// Every span for which `pred` holds, by start time.
    pub fn find_where(&self, pred: impl Fn(&Span) -> bool) -> Vec<&Span> {
        self.sorted(self.spans.iter().filter(|s| pred(s)).collect())
    }

    /// Every span with string attribute `key == value`, by start time.
    pub fn find_by_attr(&self, key: &str, value: &str) -> Vec<&Span> {
        self.find_where(|s| s.str_attr(key) == Some(value))
    }

    fn sorted<'a>(&self, mut spans: Vec<&'a Span>) -> Vec<&'a Span> {
        spans.sort_by_key(|s| s.start_time_unix_nano);
        spans
    }

    /// Spans without a parent id, by start time.
    pub fn roots(&self) -> Vec<&Span> {
        self.find_where(|s| parent_key(s).is_none())
    }

    /// Spans whose parent id names a span that was not received.
    pub fn orphans(&self) -> Vec<&Span> {
        self.find_where(|s| parent_key(s).is_some_and(|pk| !self.index.contains_key(&pk)))
    }

    /// The direct children of `span`, by start time.
    pub fn children(&self, span: &Span) -> Vec<&Span> {
        self.children
            .get(&key(span))
            .map(|list| list.iter().map(|&i| &self.spans[i]).collect())
            .unwrap_or_default()
    }

    /// The direct children of `span` named `name`.
    pub fn children_named(&self, span: &Span, name: &str) -> Vec<&Span> {
        self.children(span)
            .into_iter()
            .filter(|c| c.name == name)
            .collect()
    }

    /// The direct children of `span`; panics (listing the tree) unless
    /// there are `n`.
    pub fn expect_children(&self, span: &Span, n: usize) -> Vec<&Span> {
        self.expect_count(self.children(span), n, &span.name, "children")
    }

    /// The direct children of `span` named `name`; panics (listing the
    /// tree) unless there are `n`.
    pub fn expect_children_named(&self, span: &Span, name: &str, n: usize) -> Vec<&Span> {
        self.expect_count(self.children_named(span, name), n, &span.name, name)
    }

    fn expect_count<'t>(
        &self,
        found: Vec<&'t Span>,
        n: usize,
        parent: &str,
        what: &str,
    ) -> Vec<&'t Span> {
        assert_eq!(found.len(), n, "{what} of {parent:?}:\n{}", self.render());
        found
    }

    /// All descendants of `span`, depth first, children by start time.
    pub fn descendants(&self, span: &Span) -> Vec<&Span> {
        let mut out = Vec::new();
        let mut stack: Vec<&Span> = self.children(span).into_iter().rev().collect();
        // Bounded by the number of spans: each is pushed once (a span has
        // one parent) unless ids form a cycle, which the limit stops.
        let limit = self.spans.len();
        while let Some(s) = stack.pop() {
            if out.len() >= limit {
                break;
            }
            out.push(s);
            stack.extend(self.children(s).into_iter().rev());
        }
        out
    }

    /// The parent of `span`, if it was received.
    pub fn parent(&self, span: &Span) -> Option<&Span> {
        parent_key(span)
            .and_then(|pk| self.index.get(&pk))
            .map(|&i| &self.spans[i])
    }

    /// Ancestors of `span`, nearest first.
    pub fn ancestors(&self, span: &Span) -> Vec<&Span> {
        let mut out = Vec::new();
        let mut current = self.parent(span);
        while let Some(p) = current {
            if out.len() >= self.spans.len() {
                break; // cycle
            }
            out.push(p);
            current = self.parent(p);
        }
        out
    }

    /// The distinct trace ids, in order of first arrival.
    pub fn trace_ids(&self) -> Vec<Vec<u8>> {
        let mut ids: Vec<Vec<u8>> = Vec::new();
        for s in &self.spans {
            if !ids.contains(&s.trace_id) {
                ids.push(s.trace_id.clone());
            }
        }
        ids
    }

    /// The spans of one trace, by start time.
    pub fn trace(&self, trace_id: &[u8]) -> Vec<&Span> {
        self.find_where(|s| s.trace_id == trace_id)
    }

    /// Structural problems, one message each: orphans, children that start
    /// before or end after their parent, spans ending before they start,
    /// and all-zero ids. Empty when the tree is well formed.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        for s in &self.spans {
            if s.trace_id.len() != 16 || s.trace_id.iter().all(|b| *b == 0) {
                out.push(format!(
                    "{:?}: invalid trace id {}",
                    s.name,
                    hex(&s.trace_id)
                ));
            }
            if s.span_id.len() != 8 || s.span_id.iter().all(|b| *b == 0) {
                out.push(format!("{:?}: invalid span id {}", s.name, hex(&s.span_id)));
            }
            if s.end_time_unix_nano < s.start_time_unix_nano {
                out.push(format!(
                    "{:?} ({}) ends before it starts",
                    s.name,
                    hex(&s.span_id)
                ));
            }
            match (parent_key(s), self.parent(s)) {
                (Some(_), None) => out.push(format!(
                    "{:?} ({}) has parent {} which was not received",
                    s.name,
                    hex(&s.span_id),
                    hex(&s.parent_span_id)
                )),
                (_, Some(p)) => {
                    if s.start_time_unix_nano < p.start_time_unix_nano
                        || s.end_time_unix_nano > p.end_time_unix_nano
                    {
                        out.push(format!(
                            "{:?} [{}..{}] is not inside its parent {:?} [{}..{}]",
                            s.name,
                            s.start_time_unix_nano,
                            s.end_time_unix_nano,
                            p.name,
                            p.start_time_unix_nano,
                            p.end_time_unix_nano
                        ));
                    }
                }
                (None, None) => {}
            }
        }
        out
    }

    /// Panics, showing the tree, if [`problems`](Self::problems) finds any.
    pub fn assert_well_formed(&self) {
        let problems = self.problems();
        assert!(
            problems.is_empty(),
            "span tree is not well formed:\n  {}\n{}",
            problems.join("\n  "),
            self.render()
        );
    }

    /// The forest as indented text (name, kind, status, duration and
    /// attributes of each span), for assertion messages.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut roots = self.roots();
        roots.extend(self.orphans());
        for root in roots {
            let _ = writeln!(out, "trace {}", hex(&root.trace_id));
            self.render_into(&mut out, root, 1);
        }
        out
    }

    fn render_into(&self, out: &mut String, span: &Span, depth: usize) {
        if depth > 64 {
            return;
        }
        let attrs: Vec<String> = span
            .attr_map()
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let _ = writeln!(
            out,
            "{:indent$}{} [{:?} {:?} {:.3}ms] {}",
            "",
            span.name,
            span.kind(),
            span.status_code(),
            span.duration_nanos() as f64 / 1e6,
            attrs.join(" "),
            indent = depth * 2
        );
        for child in self.children(span) {
            self.render_into(out, child, depth + 1);
        }
    }
}
