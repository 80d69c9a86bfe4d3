//! Per-trace buffering of the console exporter: a pure state machine.
//!
//! [`TurnBuffer`] owns the spans of traces whose root has not arrived yet and
//! the memory of which traces were already printed. `ingest` takes one batch
//! and returns the text to print; `flush_all` returns the text for whatever is
//! still buffered. It does no I/O and reads no clock.
//!
//! Invariants:
//! * at most `max_traces` traces and `max_spans_per_trace` spans per trace are
//!   buffered; when a new trace would exceed the first limit the oldest
//!   buffered trace is printed as it is, with a note; when a trace reaches
//!   the second limit it is printed as it is, with a note;
//! * a trace is printed at most once as a tree; spans arriving for a printed
//!   trace (remembered for the last `max_printed_traces` traces) are printed
//!   as one "late span" line each;
//! * every span ingested is printed exactly once (as part of a tree or as a
//!   late line), except duplicates of a buffered span id, which replace it.

use std::collections::{HashMap, HashSet, VecDeque};

use hermes_span::collector::trace::v1::ExportTraceServiceRequest;
use hermes_span::trace::v1::Span;

use super::ConsoleExporterConfig;
use super::render::{Style, TraceView, is_root, render_late, render_trace, string_attr};

type TraceId = hermes_span::Id;

struct PendingTrace {
    spans: Vec<Span>,
    resource_session: Option<String>,
}

pub(crate) struct TurnBuffer {
    max_traces: usize,
    max_spans_per_trace: usize,
    max_printed_traces: usize,
    style: Style,
    pending: HashMap<TraceId, PendingTrace>,
    /// Pending trace ids, oldest first.
    order: VecDeque<TraceId>,
    printed: HashSet<TraceId>,
    /// Printed trace ids, oldest first (bounded by `max_printed_traces`).
    printed_order: VecDeque<TraceId>,
}

impl TurnBuffer {
    pub(crate) fn new(config: &ConsoleExporterConfig) -> Self {
        Self {
            max_traces: config.max_traces.max(1),
            max_spans_per_trace: config.max_spans_per_trace.max(1),
            max_printed_traces: config.max_printed_traces,
            style: Style {
                color: config.color,
            },
            pending: HashMap::new(),
            order: VecDeque::new(),
            printed: HashSet::new(),
            printed_order: VecDeque::new(),
        }
    }

    /// Number of traces waiting for their root.
    #[cfg(test)]
    pub(crate) fn pending_traces(&self) -> usize {
        self.pending.len()
    }

    /// Buffers the batch and returns the text to print: completed turns,
    /// evicted traces and late-span lines.
    pub(crate) fn ingest(&mut self, request: &ExportTraceServiceRequest) -> String {
        let mut out = String::new();
        let mut rooted: Vec<TraceId> = Vec::new();
        for rs in &request.resource_spans {
            let resource_session = rs
                .resource
                .as_ref()
                .and_then(|r| string_attr(&r.attributes, "session.id"));
            for span in rs.scope_spans.iter().flat_map(|ss| ss.spans.iter()) {
                self.ingest_span(span, resource_session.as_deref(), &mut rooted, &mut out);
            }
        }
        for trace_id in rooted {
            // A trace may have been evicted since its root arrived.
            if let Some(trace) = self.take(&trace_id) {
                self.print(&mut out, &trace_id, &trace, None);
            }
        }
        out
    }

    /// Text for every buffered trace, oldest first, each marked incomplete.
    pub(crate) fn flush_all(&mut self) -> String {
        let mut out = String::new();
        while let Some(trace_id) = self.order.front().cloned() {
            if let Some(trace) = self.take(&trace_id) {
                self.print(
                    &mut out,
                    &trace_id,
                    &trace,
                    Some("incomplete: root span not received before shutdown"),
                );
            } else {
                self.order.pop_front();
            }
        }
        out
    }

    fn ingest_span(
        &mut self,
        span: &Span,
        resource_session: Option<&str>,
        rooted: &mut Vec<TraceId>,
        out: &mut String,
    ) {
        let trace_id = &span.trace_id;
        if self.printed.contains(trace_id) {
            render_late(out, trace_id, span, self.style);
            return;
        }
        if !self.pending.contains_key(trace_id) {
            while self.pending.len() >= self.max_traces {
                let Some(oldest) = self.order.front().cloned() else {
                    break;
                };
                if let Some(trace) = self.take(&oldest) {
                    let note = format!(
                        "incomplete: evicted, more than {} traces buffered",
                        self.max_traces
                    );
                    self.print(out, &oldest, &trace, Some(&note));
                } else {
                    self.order.pop_front();
                }
            }
            self.pending.insert(
                trace_id.clone(),
                PendingTrace {
                    spans: Vec::new(),
                    resource_session: resource_session.map(str::to_owned),
                },
            );
            self.order.push_back(trace_id.clone());
        }
        let Some(trace) = self.pending.get_mut(trace_id) else {
            return;
        };
        if trace.resource_session.is_none() {
            trace.resource_session = resource_session.map(str::to_owned);
        }
        if let Some(existing) = trace.spans.iter_mut().find(|s| s.span_id == span.span_id) {
            *existing = span.clone();
        } else if trace.spans.len() < self.max_spans_per_trace {
            trace.spans.push(span.clone());
        } else {
            // Full: print what we have, then this span as late.
            let trace_id = trace_id.clone();
            if let Some(trace) = self.take(&trace_id) {
                let note = format!(
                    "incomplete: more than {} spans buffered",
                    self.max_spans_per_trace
                );
                self.print(out, &trace_id, &trace, Some(&note));
            }
            render_late(out, &trace_id, span, self.style);
            return;
        }
        if is_root(span) && !rooted.contains(trace_id) {
            rooted.push(trace_id.clone());
        }
    }

    fn take(&mut self, trace_id: &TraceId) -> Option<PendingTrace> {
        let trace = self.pending.remove(trace_id)?;
        if let Some(pos) = self.order.iter().position(|t| t == trace_id) {
            self.order.remove(pos);
        }
        Some(trace)
    }

    fn print(
        &mut self,
        out: &mut String,
        trace_id: &TraceId,
        trace: &PendingTrace,
        note: Option<&str>,
    ) {
        render_trace(
            out,
            &TraceView {
                trace_id,
                spans: &trace.spans,
                resource_session: trace.resource_session.as_deref(),
                note,
            },
            self.style,
        );
        self.remember_printed(trace_id.clone());
    }

    fn remember_printed(&mut self, trace_id: TraceId) {
        if self.max_printed_traces == 0 {
            return;
        }
        if self.printed.insert(trace_id.clone()) {
            self.printed_order.push_back(trace_id);
        }
        while self.printed_order.len() > self.max_printed_traces {
            if let Some(old) = self.printed_order.pop_front() {
                self.printed.remove(&old);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hermes_span::trace::v1::{ResourceSpans, ScopeSpans};

    fn span(trace: u8, id: u8, parent: Option<u8>, start: u64) -> Span {
        Span {
            trace_id: [trace; 16].into(),
            span_id: [id; 8].into(),
            parent_span_id: parent.map(|p| [p; 8].into()).unwrap_or_default(),
            name: format!("s{id}").into(),
            start_time_unix_nano: start,
            end_time_unix_nano: start + 2_000_000,
            ..Default::default()
        }
    }

    fn req(spans: Vec<Span>) -> ExportTraceServiceRequest {
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    fn config(max_traces: usize, max_spans: usize) -> ConsoleExporterConfig {
        ConsoleExporterConfig {
            max_traces,
            max_spans_per_trace: max_spans,
            ..ConsoleExporterConfig::default()
        }
    }

    #[test]
    fn evicts_oldest_trace_when_full() {
        let mut b = TurnBuffer::new(&config(2, 10));
        assert_eq!(b.ingest(&req(vec![span(1, 2, Some(1), 10)])), "");
        assert_eq!(b.ingest(&req(vec![span(2, 2, Some(1), 10)])), "");
        let out = b.ingest(&req(vec![span(3, 2, Some(1), 10)]));
        assert_eq!(
            out,
            "trace 01010101010101010101010101010101  (incomplete: evicted, more than 2 traces buffered)\n\
             s2  2.0 ms  (orphan)\n"
        );
        assert_eq!(b.pending_traces(), 2);
        // The evicted trace's root is now late.
        let out = b.ingest(&req(vec![span(1, 1, None, 5)]));
        assert_eq!(
            out,
            "late span trace=01010101010101010101010101010101  s1  2.0 ms\n"
        );
    }

    #[test]
    fn span_limit_prints_trace_and_late_line() {
        let mut b = TurnBuffer::new(&config(4, 2));
        let out = b.ingest(&req(vec![
            span(1, 2, Some(1), 10),
            span(1, 3, Some(1), 20),
            span(1, 4, Some(1), 30),
        ]));
        assert_eq!(
            out,
            "trace 01010101010101010101010101010101  (incomplete: more than 2 spans buffered)\n\
             s2  2.0 ms  (orphan)\n\
             s3  2.0 ms  (orphan)\n\
             late span trace=01010101010101010101010101010101  s4  2.0 ms\n"
        );
        assert_eq!(b.pending_traces(), 0);
    }

    #[test]
    fn duplicates_replace_and_flush_prints_rest() {
        let mut b = TurnBuffer::new(&config(4, 4));
        assert_eq!(b.ingest(&req(vec![span(1, 2, Some(1), 10)])), "");
        assert_eq!(b.ingest(&req(vec![span(1, 2, Some(1), 10)])), "");
        let out = b.flush_all();
        assert_eq!(
            out,
            "trace 01010101010101010101010101010101  (incomplete: root span not received before shutdown)\n\
             s2  2.0 ms  (orphan)\n"
        );
        assert_eq!(b.flush_all(), "");
    }
}
