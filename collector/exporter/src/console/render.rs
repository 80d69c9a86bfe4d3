//! Pure text rendering of a buffered trace as an indented tree.
//!
//! Owns the exact console format. Output is a function of the spans alone
//! (never of arrival order or the clock), so tests compare exact strings:
//!
//! ```text
//! trace 0af7651916cd43dd8448eb211c80319c  session=sess-1
//! invoke_agent hermes  1.50 s
//! ├─ chat gpt-4o  812.3 ms  in=1200 out=85
//! ├─ execute_tool terminal  120.0 ms  call_id=call_1  tool.status=success
//! │  └─ approval rm  50.0 ms
//! └─ chat gpt-4o  300.1 ms  ERROR "upstream timeout"  error.type=timeout
//! ```
//!
//! Tree rules: the root (the first span without a parent) comes first;
//! children are sorted by start time, then name, then span id. A span whose
//! parent is not in the trace (or that is part of a parent cycle, or is a
//! second parentless span) hangs under the root with `(orphan)`; without a
//! root such spans are printed as top-level trees. Every buffered span is
//! printed exactly once.

use std::collections::HashMap;
use std::fmt::Write as _;

use hermes_span::common::v1::{AnyValue, KeyValue, any_value};
use hermes_span::trace::v1::Span;
use hermes_span::trace::v1::status::StatusCode;

const MAX_VALUE_CHARS: usize = 64;

/// Presentation switches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Style {
    /// ANSI colors (ERROR in red, header in bold).
    pub color: bool,
}

/// One trace to print.
pub(crate) struct TraceView<'a> {
    pub trace_id: &'a [u8],
    /// Spans in arrival order (the root is the first parentless one).
    pub spans: &'a [Span],
    /// `session.id` of the resource, used when no span carries one.
    pub resource_session: Option<&'a str>,
    /// Why the trace is printed without its root, if so.
    pub note: Option<&'a str>,
}

/// True when the span has no parent (empty or all-zero parent id).
pub(crate) fn is_root(span: &Span) -> bool {
    span.parent_span_id.iter().all(|b| *b == 0)
}

/// Lowercase hex of an id.
pub(crate) fn hex(id: &[u8]) -> String {
    let mut s = String::with_capacity(id.len() * 2);
    for b in id {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// `812.3 ms` below one second, `1.50 s` from one second on, `?` when the
/// times are missing or inverted.
pub(crate) fn format_duration(start_ns: u64, end_ns: u64) -> String {
    if start_ns == 0 || end_ns == 0 || end_ns < start_ns {
        return "?".to_owned();
    }
    let ns = end_ns - start_ns;
    if ns < 1_000_000_000 {
        format!("{:.1} ms", ns as f64 / 1e6)
    } else {
        format!("{:.2} s", ns as f64 / 1e9)
    }
}

/// Appends the header and tree of `trace` to `out`.
pub(crate) fn render_trace(out: &mut String, trace: &TraceView<'_>, style: Style) {
    let spans = trace.spans;
    let tree = Tree::build(spans);

    let session = tree
        .root
        .and_then(|r| string_attr(&spans[r].attributes, "session.id"))
        .or_else(|| {
            spans
                .iter()
                .find_map(|s| string_attr(&s.attributes, "session.id"))
        })
        .or(trace.resource_session.map(str::to_owned));
    let mut header = format!("trace {}", hex(trace.trace_id));
    if let Some(session) = session {
        let _ = write!(header, "  session={}", clean(&session));
    }
    if let Some(note) = trace.note {
        let _ = write!(header, "  ({note})");
    }
    if style.color {
        let _ = writeln!(out, "\x1b[1m{header}\x1b[0m");
    } else {
        let _ = writeln!(out, "{header}");
    }

    for &top in &tree.tops {
        out.push_str(&span_line(&spans[top], tree.orphan[top], style));
        out.push('\n');
        render_children(out, spans, &tree, top, "", style);
    }
}

fn render_children(
    out: &mut String,
    spans: &[Span],
    tree: &Tree,
    node: usize,
    prefix: &str,
    style: Style,
) {
    let children = &tree.children[node];
    for (i, &child) in children.iter().enumerate() {
        let last = i + 1 == children.len();
        let connector = if last { "└─ " } else { "├─ " };
        out.push_str(prefix);
        out.push_str(connector);
        out.push_str(&span_line(&spans[child], tree.orphan[child], style));
        out.push('\n');
        let deeper = format!("{prefix}{}", if last { "   " } else { "│  " });
        render_children(out, spans, tree, child, &deeper, style);
    }
}

/// Appends the one-line note for a span of an already printed trace.
pub(crate) fn render_late(out: &mut String, trace_id: &[u8], span: &Span, style: Style) {
    let _ = writeln!(
        out,
        "late span trace={}  {}",
        hex(trace_id),
        span_line(span, false, style)
    );
}

/// `name  duration  [ERROR "msg"]  [in=… out=…]  [call_id=…]  [tool.status=…]  [error.type=…]  [(orphan)]`
fn span_line(span: &Span, orphan: bool, style: Style) -> String {
    let name = if span.name.is_empty() {
        "<unnamed>".to_owned()
    } else {
        clean(&span.name)
    };
    let mut line = format!(
        "{name}  {}",
        format_duration(span.start_time_unix_nano, span.end_time_unix_nano)
    );
    if let Some(status) = &span.status
        && status.code == StatusCode::Error as i32
    {
        if style.color {
            line.push_str("  \x1b[31mERROR\x1b[0m");
        } else {
            line.push_str("  ERROR");
        }
        if !status.message.is_empty() {
            let _ = write!(
                line,
                " {:?}",
                truncate_chars(&status.message, MAX_VALUE_CHARS)
            );
        }
    }
    let attrs = &span.attributes;
    let input = attr_text(attrs, "gen_ai.usage.input_tokens");
    let output = attr_text(attrs, "gen_ai.usage.output_tokens");
    match (input, output) {
        (None, None) => {}
        (input, output) => {
            let _ = write!(
                line,
                "  in={} out={}",
                input.as_deref().unwrap_or("-"),
                output.as_deref().unwrap_or("-")
            );
        }
    }
    for (key, label) in [
        ("gen_ai.tool.call.id", "call_id"),
        ("hermes.tool.status", "tool.status"),
        ("error.type", "error.type"),
    ] {
        if let Some(value) = attr_text(attrs, key) {
            let _ = write!(line, "  {label}={value}");
        }
    }
    if orphan {
        line.push_str("  (orphan)");
    }
    line
}

/// The shape of one trace: tops (root, or parentless spans when the root is
/// missing), children lists sorted for printing, and orphan marks.
struct Tree {
    root: Option<usize>,
    tops: Vec<usize>,
    children: Vec<Vec<usize>>,
    orphan: Vec<bool>,
}

impl Tree {
    fn build(spans: &[Span]) -> Self {
        let n = spans.len();
        let root = spans.iter().position(is_root);
        let index: HashMap<&[u8], usize> = spans
            .iter()
            .enumerate()
            .map(|(i, s)| (s.span_id.as_slice(), i))
            .collect();

        let mut parent: Vec<Option<usize>> = vec![None; n];
        let mut orphan = vec![false; n];
        for (i, span) in spans.iter().enumerate() {
            if Some(i) == root {
                continue;
            }
            let linked = if is_root(span) {
                None
            } else {
                index
                    .get(span.parent_span_id.as_slice())
                    .copied()
                    .filter(|&p| p != i)
            };
            match linked {
                Some(p) => parent[i] = Some(p),
                None => {
                    // Parent missing (or a second root): under the root when
                    // there is one, else a top-level tree.
                    orphan[i] = root.is_some() || !is_root(span);
                    parent[i] = root;
                }
            }
        }

        // Break parent cycles: any span not reachable from a top becomes an
        // orphan, earliest first, until every span is reachable.
        loop {
            let reached = reachable(&parent);
            let unreached = sorted(spans, (0..n).filter(|&i| !reached[i]).collect());
            let Some(&first) = unreached.first() else {
                break;
            };
            parent[first] = root;
            orphan[first] = true;
        }

        let (children, tops) = links(&parent);
        let children = children.into_iter().map(|c| sorted(spans, c)).collect();
        // The root always prints first, then any other tops by time.
        let mut tops = sorted(spans, tops);
        if let Some(r) = root
            && let Some(pos) = tops.iter().position(|&t| t == r)
        {
            tops.remove(pos);
            tops.insert(0, r);
        }
        Self {
            root,
            tops,
            children,
            orphan,
        }
    }
}

/// Which spans are reachable from a top (a span with no parent).
fn reachable(parent: &[Option<usize>]) -> Vec<bool> {
    let (children, mut stack) = links(parent);
    let mut reached = vec![false; parent.len()];
    while let Some(i) = stack.pop() {
        if std::mem::replace(&mut reached[i], true) {
            continue;
        }
        stack.extend(children[i].iter().copied());
    }
    reached
}

/// The children of each span, in index order, and the tops (the spans
/// with no parent), from each span's parent index.
fn links(parent: &[Option<usize>]) -> (Vec<Vec<usize>>, Vec<usize>) {
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); parent.len()];
    let mut tops = Vec::new();
    for (i, p) in parent.iter().enumerate() {
        match p {
            Some(p) => children[*p].push(i),
            None => tops.push(i),
        }
    }
    (children, tops)
}

fn sorted(spans: &[Span], mut ids: Vec<usize>) -> Vec<usize> {
    ids.sort_by(|&a, &b| {
        let (a, b) = (&spans[a], &spans[b]);
        a.start_time_unix_nano
            .cmp(&b.start_time_unix_nano)
            .then_with(|| a.name.cmp(&b.name))
            .then_with(|| a.span_id.cmp(&b.span_id))
    });
    ids
}

/// The string value of attribute `key`, if it is a string.
pub(crate) fn string_attr(attrs: &[KeyValue], key: &str) -> Option<String> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| match &v.value {
            Some(any_value::Value::StringValue(s)) => Some(s.to_string()),
            _ => None,
        })
}

/// Attribute `key` as display text, cleaned and cut.
fn attr_text(attrs: &[KeyValue], key: &str) -> Option<String> {
    let value = attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())?;
    value_text(value).map(|s| clean(&s))
}

fn value_text(value: &AnyValue) -> Option<String> {
    Some(match value.value.as_ref()? {
        any_value::Value::StringValue(s) => s.to_string(),
        any_value::Value::BoolValue(b) => b.to_string(),
        any_value::Value::IntValue(i) => i.to_string(),
        any_value::Value::DoubleValue(d) => d.to_string(),
        any_value::Value::ArrayValue(a) => a
            .values
            .iter()
            .filter_map(value_text)
            .collect::<Vec<_>>()
            .join(","),
        _ => return None,
    })
}

/// Replaces control characters by spaces and cuts to a display width.
fn clean(s: &str) -> String {
    let cleaned: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    truncate_chars(&cleaned, MAX_VALUE_CHARS)
}

fn truncate_chars(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &s[..cut]),
        None => s.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(format_duration(1, 1), "0.0 ms");
        assert_eq!(format_duration(1_000, 1_000 + 812_345_678), "812.3 ms");
        assert_eq!(format_duration(1_000, 1_000 + 1_500_000_000), "1.50 s");
        assert_eq!(format_duration(5, 4), "?");
        assert_eq!(format_duration(0, 4), "?");
    }

    fn span(id: u8, parent: Option<u8>, start: u64, name: &str) -> Span {
        Span {
            trace_id: [1; 16].into(),
            span_id: [id; 8].into(),
            parent_span_id: parent.map(|p| [p; 8].into()).unwrap_or_default(),
            name: name.into(),
            start_time_unix_nano: start,
            end_time_unix_nano: start + 1_000_000,
            ..Default::default()
        }
    }

    fn render(spans: &[Span]) -> String {
        let mut out = String::new();
        render_trace(
            &mut out,
            &TraceView {
                trace_id: &[0xab; 16],
                spans,
                resource_session: None,
                note: None,
            },
            Style::default(),
        );
        out
    }

    #[test]
    fn cycles_and_missing_parents_become_orphans() {
        let spans = vec![
            span(1, None, 10, "root"),
            span(2, Some(3), 20, "a"),
            span(3, Some(2), 30, "b"),
            span(4, Some(9), 40, "lost"),
        ];
        let expected = "\
trace abababababababababababababababab
root  1.0 ms
├─ a  1.0 ms  (orphan)
│  └─ b  1.0 ms
└─ lost  1.0 ms  (orphan)
";
        assert_eq!(render(&spans), expected);
    }

    #[test]
    fn without_root_prints_forest() {
        let spans = vec![span(2, Some(1), 20, "a"), span(3, Some(2), 30, "b")];
        let expected = "\
trace abababababababababababababababab
a  1.0 ms  (orphan)
└─ b  1.0 ms
";
        assert_eq!(render(&spans), expected);
    }

    #[test]
    fn deep_chain_renders_every_span() {
        let mut spans = vec![span(0, None, 1, "root")];
        for i in 1..1024u32 {
            let mut s = span(0, None, u64::from(i) + 1, "x");
            s.span_id = (i + 1).to_be_bytes().repeat(2).into();
            s.parent_span_id = i.to_be_bytes().repeat(2).into();
            spans.push(s);
        }
        spans[0].span_id = 1u32.to_be_bytes().repeat(2).into();
        let out = render(&spans);
        assert_eq!(out.lines().count(), 1 + 1024);
        assert!(!out.contains("orphan"));
    }

    #[test]
    fn control_characters_are_cleaned() {
        assert_eq!(clean("a\nb"), "a b");
        assert_eq!(truncate_chars("abcdef", 3), "abc…");
    }
}
