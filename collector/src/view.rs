//! `hermes-collector view`: renders turns from the embedded default's span
//! file (OTLP JSON lines) as waterfalls in the terminal, so a user without
//! any backend can read what the agent did.
//!
//! One block per trace (the latest `last` turns, oldest first): a header with
//! the trace id and session, then one line per span, depth-first with
//! children in start order: indented name, a bar placed on the turn's time
//! axis, duration, and status/tokens/tool status when present. Spans whose
//! parent is missing hang under the root, marked `(orphan)`. Output is
//! deterministic (no colors, no local time).

use std::collections::HashMap;
use std::fmt::Write as _;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::{Span, status::StatusCode};

/// The trajectory of `session` in `dir` as readable steps: every written
/// segment, then the part still in progress.
pub fn trajectory(dir: &std::path::Path, session: &str) -> Result<String, String> {
    let segments = hermes_trajectory::files::read_session(dir, session)?;
    if segments.is_empty() {
        return Err(format!(
            "no trajectory of session {session} in {}",
            dir.display()
        ));
    }
    let mut out = String::new();
    for (name, t) in segments {
        let _ = writeln!(out, "== {name}");
        out.push_str(&hermes_trajectory::render(&t));
    }
    Ok(out)
}

/// Width of the time axis, in characters.
const BAR: usize = 40;
/// Widest name column.
const NAME: usize = 44;

/// Errors of `view`.
#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}:{line}: not an OTLP JSON export ({source})")]
    Parse {
        path: String,
        line: usize,
        source: serde_json::Error,
    },
    #[error("no span in the file yet")]
    Empty,
    #[error("no trace {0} in the file")]
    NoTrace(String),
}

/// Reads every span of an OTLP JSON-lines file. A last line that does not
/// parse (being written) is ignored; any other bad line is an error.
pub fn read_spans(path: &std::path::Path) -> Result<Vec<Span>, ViewError> {
    let text = std::fs::read_to_string(path).map_err(|source| ViewError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let lines: Vec<&str> = text.lines().collect();
    let mut spans = Vec::new();
    for (i, line) in lines
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        match serde_json::from_str::<ExportTraceServiceRequest>(line) {
            Ok(request) => {
                for rs in request.resource_spans {
                    for ss in rs.scope_spans {
                        spans.extend(ss.spans);
                    }
                }
            }
            Err(_) if i + 1 == lines.len() && !text.ends_with('\n') => {}
            Err(source) => {
                return Err(ViewError::Parse {
                    path: path.display().to_string(),
                    line: i + 1,
                    source,
                });
            }
        }
    }
    Ok(spans)
}

/// Renders the latest `last` traces (or the one whose hex id starts with
/// `trace`).
pub fn render(spans: &[Span], last: usize, trace: Option<&str>) -> Result<String, ViewError> {
    // The latest version of each span (a span may be written twice).
    let mut unique: HashMap<(&[u8], &[u8]), &Span> = HashMap::new();
    for s in spans {
        unique.insert((&s.trace_id, &s.span_id), s);
    }
    if unique.is_empty() {
        return Err(ViewError::Empty);
    }
    let mut traces: HashMap<&[u8], Vec<&Span>> = HashMap::new();
    for s in unique.values() {
        traces.entry(&s.trace_id).or_default().push(s);
    }
    let mut order: Vec<(&[u8], u64)> = traces
        .iter()
        .map(|(id, spans)| {
            (
                *id,
                spans
                    .iter()
                    .map(|s| s.start_time_unix_nano)
                    .min()
                    .unwrap_or(0),
            )
        })
        .collect();
    order.sort_by(|a, b| (a.1, a.0).cmp(&(b.1, b.0)));
    let chosen: Vec<&[u8]> = match trace {
        Some(prefix) => {
            let found: Vec<&[u8]> = order
                .iter()
                .map(|(id, _)| *id)
                .filter(|id| hex(id).starts_with(prefix))
                .collect();
            if found.is_empty() {
                return Err(ViewError::NoTrace(prefix.to_owned()));
            }
            found
        }
        None => order
            .iter()
            .rev()
            .take(last.max(1))
            .rev()
            .map(|(id, _)| *id)
            .collect(),
    };
    let mut out = String::new();
    for id in chosen {
        if let Some(spans) = traces.get(id) {
            render_trace(&mut out, id, spans);
        }
    }
    Ok(out)
}

fn render_trace(out: &mut String, id: &[u8], spans: &[&Span]) {
    let ids: HashMap<&[u8], &Span> = spans.iter().map(|s| (s.span_id.as_slice(), *s)).collect();
    let mut children: HashMap<&[u8], Vec<&Span>> = HashMap::new();
    let mut roots: Vec<&Span> = Vec::new();
    let mut orphans: Vec<&Span> = Vec::new();
    for s in spans {
        if s.parent_span_id.is_empty() {
            roots.push(s);
        } else if ids.contains_key(s.parent_span_id.as_slice()) {
            children.entry(&s.parent_span_id).or_default().push(s);
        } else {
            orphans.push(s);
        }
    }
    let by_start = |a: &&Span, b: &&Span| {
        (a.start_time_unix_nano, &a.name, &a.span_id).cmp(&(
            b.start_time_unix_nano,
            &b.name,
            &b.span_id,
        ))
    };
    roots.sort_by(by_start);
    orphans.sort_by(by_start);
    for list in children.values_mut() {
        list.sort_by(by_start);
    }
    let t0 = spans
        .iter()
        .map(|s| s.start_time_unix_nano)
        .min()
        .unwrap_or(0);
    let t1 = spans
        .iter()
        .map(|s| s.end_time_unix_nano)
        .max()
        .unwrap_or(t0)
        .max(t0 + 1);
    let session = spans
        .iter()
        .find_map(|s| string_attr(s, "session.id"))
        .unwrap_or_default();
    let _ = writeln!(out, "trace {}  session={session}", hex(id));
    let axis = Axis { t0, t1 };
    let mut stack: Vec<(&Span, usize, bool)> = Vec::new();
    for root in roots.iter().rev() {
        stack.push((root, 0, false));
    }
    if roots.is_empty() {
        let _ = writeln!(out, "  (no root span: the turn is still open or was lost)");
    }
    let mut first_root = true;
    while let Some((span, depth, orphan)) = stack.pop() {
        line(out, span, depth, orphan, &axis);
        if depth == 0 && first_root {
            // Orphans hang under the first root, after its children.
            first_root = false;
            for o in orphans.iter().rev() {
                stack.push((o, 1, true));
            }
        }
        if let Some(kids) = children.get(span.span_id.as_slice()) {
            for kid in kids.iter().rev() {
                stack.push((kid, depth + 1, false));
            }
        }
    }
    if roots.is_empty() {
        for o in &orphans {
            line(out, o, 1, true, &axis);
        }
    }
    out.push('\n');
}

struct Axis {
    t0: u64,
    t1: u64,
}

impl Axis {
    fn col(&self, t: u64) -> usize {
        let span = (self.t1 - self.t0) as f64;
        (((t.clamp(self.t0, self.t1) - self.t0) as f64 / span) * BAR as f64).round() as usize
    }
}

fn line(out: &mut String, span: &Span, depth: usize, orphan: bool, axis: &Axis) {
    let mut name = format!("{}{}", "  ".repeat(depth), span.name);
    if orphan {
        name.push_str(" (orphan)");
    }
    if name.chars().count() > NAME {
        name = name.chars().take(NAME - 1).collect::<String>() + "…";
    }
    let start = axis.col(span.start_time_unix_nano).min(BAR - 1);
    let end = axis.col(span.end_time_unix_nano).max(start + 1).min(BAR);
    let bar: String = (0..BAR)
        .map(|i| if i >= start && i < end { '█' } else { ' ' })
        .collect();
    let mut notes = Vec::new();
    if span
        .status
        .as_ref()
        .is_some_and(|s| s.code == StatusCode::Error as i32)
    {
        let kind = string_attr(span, "error.type").unwrap_or_else(|| "error".to_owned());
        notes.push(format!("ERROR {kind}"));
    }
    if let (Some(i), Some(o)) = (
        int_attr(span, "gen_ai.usage.input_tokens"),
        int_attr(span, "gen_ai.usage.output_tokens"),
    ) {
        notes.push(format!("in={i} out={o}"));
    }
    if let Some(status) = string_attr(span, "hermes.tool.status") {
        notes.push(status);
    }
    if span
        .attributes
        .iter()
        .any(|kv| kv.key == "hermes.incomplete")
    {
        notes.push("incomplete".to_owned());
    }
    let duration = duration(
        span.end_time_unix_nano
            .saturating_sub(span.start_time_unix_nano),
    );
    let notes = if notes.is_empty() {
        String::new()
    } else {
        format!("  {}", notes.join("  "))
    };
    let _ = writeln!(out, "{name:<NAME$} |{bar}| {duration:>9}{notes}");
}

fn duration(nanos: u64) -> String {
    let ms = nanos as f64 / 1e6;
    if ms < 1000.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{:.2} s", ms / 1000.0)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn string_attr(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            Value::StringValue(s) => Some(s.clone()),
            _ => None,
        })
}

fn int_attr(span: &Span, key: &str) -> Option<i64> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            Value::IntValue(i) => Some(*i),
            _ => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Status};

    const MS: u64 = 1_000_000;

    fn kv(key: &str, value: Value) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(AnyValue { value: Some(value) }),
            ..Default::default()
        }
    }

    fn span(
        id: u8,
        parent: u8,
        name: &str,
        start_ms: u64,
        end_ms: u64,
        attrs: Vec<KeyValue>,
    ) -> Span {
        Span {
            trace_id: vec![0xab; 16],
            span_id: vec![id; 8],
            parent_span_id: if parent == 0 { vec![] } else { vec![parent; 8] },
            name: name.into(),
            start_time_unix_nano: 1_000_000_000_000 + start_ms * MS,
            end_time_unix_nano: 1_000_000_000_000 + end_ms * MS,
            attributes: attrs,
            ..Default::default()
        }
    }

    fn turn() -> Vec<Span> {
        let session = kv(
            "session.id",
            Value::StringValue("20261129_213128_d8a0b7".into()),
        );
        let mut failed = span(
            5,
            1,
            "chat fake-model",
            700,
            800,
            vec![kv("error.type", Value::StringValue("rate_limit".into()))],
        );
        failed.status = Some(Status {
            code: StatusCode::Error as i32,
            message: "429".into(),
        });
        vec![
            span(1, 0, "invoke_agent hermes", 0, 1000, vec![session]),
            span(
                2,
                1,
                "chat fake-model",
                10,
                500,
                vec![
                    kv("gen_ai.usage.input_tokens", Value::IntValue(1212)),
                    kv("gen_ai.usage.output_tokens", Value::IntValue(17)),
                ],
            ),
            span(
                3,
                1,
                "execute_tool terminal",
                510,
                560,
                vec![kv("hermes.tool.status", Value::StringValue("ok".into()))],
            ),
            failed,
            span(4, 9, "approval rm", 520, 530, vec![]),
        ]
    }

    #[test]
    fn renders_a_known_span_file() {
        let dir = std::env::temp_dir().join(format!("hermes-view-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("spans.jsonl");
        let request = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans: turn(),
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        std::fs::write(
            &path,
            format!("{}\n", serde_json::to_string(&request).unwrap()),
        )
        .unwrap();
        let spans = read_spans(&path).unwrap();
        let text = render(&spans, 5, None).unwrap();
        let expected = "\
trace abababababababababababababababab  session=20261129_213128_d8a0b7
invoke_agent hermes                          |████████████████████████████████████████|    1.00 s
  chat fake-model                            |████████████████████                    |  490.0 ms  in=1212 out=17
  execute_tool terminal                      |                    ██                  |   50.0 ms  ok
  chat fake-model                            |                            ████        |  100.0 ms  ERROR rate_limit
  approval rm (orphan)                       |                     █                  |   10.0 ms

";
        assert_eq!(text, expected, "\n{text}");
        assert_eq!(render(&spans, 1, Some("abab")).unwrap(), expected);
        assert!(matches!(
            render(&spans, 1, Some("ff")),
            Err(ViewError::NoTrace(_))
        ));
        assert!(matches!(render(&[], 1, None), Err(ViewError::Empty)));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_partial_last_line_is_ignored_but_a_bad_line_is_an_error() {
        let dir = std::env::temp_dir().join(format!("hermes-view-test2-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("spans.jsonl");
        std::fs::write(&path, "{\"resourceSpans\":[]}\n{\"resourceSp").unwrap();
        assert!(read_spans(&path).unwrap().is_empty());
        std::fs::write(&path, "garbage\n{\"resourceSpans\":[]}\n").unwrap();
        assert!(matches!(
            read_spans(&path),
            Err(ViewError::Parse { line: 1, .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
