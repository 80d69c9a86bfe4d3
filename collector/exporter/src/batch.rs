//! Batch assembly: size-bounded, merged by resource and scope.
//!
//! This module owns [`Batcher`], a pure accumulator (no clock, no I/O; the
//! stage decides when a batch is old enough). Invariants:
//! * a batch holds at most `max_spans` spans; an incoming message that does
//!   not fit is split at span granularity, so no span is ever dropped here;
//! * `ResourceSpans` with an equal `Resource` and resource `schema_url` are
//!   merged into one, and within it `ScopeSpans` with an equal scope and scope
//!   `schema_url` are merged into one; span order is preserved;
//! * scopes and resources without spans are dropped (nothing to export).

use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

/// Accumulates spans into batches of at most `max_spans`.
#[derive(Debug)]
pub(crate) struct Batcher {
    max_spans: usize,
    current: Vec<ResourceSpans>,
    spans: usize,
}

impl Batcher {
    pub(crate) fn new(max_spans: usize) -> Self {
        Self {
            max_spans: max_spans.max(1),
            current: Vec::new(),
            spans: 0,
        }
    }

    /// True when no span is waiting.
    pub(crate) fn is_empty(&self) -> bool {
        self.spans == 0
    }

    /// Adds spans; returns the batches that became full, oldest first.
    pub(crate) fn push(&mut self, incoming: Vec<ResourceSpans>) -> Vec<Vec<ResourceSpans>> {
        let mut full = Vec::new();
        for rs in incoming {
            let ResourceSpans {
                resource,
                scope_spans,
                schema_url,
            } = rs;
            for ss in scope_spans {
                let ScopeSpans {
                    scope,
                    mut spans,
                    schema_url: scope_schema_url,
                } = ss;
                while !spans.is_empty() {
                    let room = self.max_spans - self.spans;
                    let rest = if spans.len() > room {
                        spans.split_off(room)
                    } else {
                        Vec::new()
                    };
                    let chunk = std::mem::replace(&mut spans, rest);
                    self.add(&resource, &schema_url, &scope, &scope_schema_url, chunk);
                    if self.spans >= self.max_spans
                        && let Some(batch) = self.take()
                    {
                        full.push(batch);
                    }
                }
            }
        }
        full
    }

    /// Takes the current batch, if it holds any span.
    pub(crate) fn take(&mut self) -> Option<Vec<ResourceSpans>> {
        if self.spans == 0 {
            return None;
        }
        self.spans = 0;
        Some(std::mem::take(&mut self.current))
    }

    fn add(
        &mut self,
        resource: &Option<Resource>,
        schema_url: &str,
        scope: &Option<InstrumentationScope>,
        scope_schema_url: &str,
        spans: Vec<Span>,
    ) {
        self.spans += spans.len();
        let rs_index = match self
            .current
            .iter()
            .position(|rs| rs.resource == *resource && rs.schema_url == schema_url)
        {
            Some(i) => i,
            None => {
                self.current.push(ResourceSpans {
                    resource: resource.clone(),
                    scope_spans: Vec::new(),
                    schema_url: schema_url.to_owned(),
                });
                self.current.len() - 1
            }
        };
        let scopes = &mut self.current[rs_index].scope_spans;
        match scopes
            .iter_mut()
            .find(|ss| ss.scope == *scope && ss.schema_url == scope_schema_url)
        {
            Some(ss) => ss.spans.extend(spans),
            None => scopes.push(ScopeSpans {
                scope: scope.clone(),
                spans,
                schema_url: scope_schema_url.to_owned(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};

    fn resource(service: &str) -> Option<Resource> {
        Some(Resource {
            attributes: vec![KeyValue {
                key: "service.name".into(),
                value: Some(AnyValue {
                    value: Some(any_value::Value::StringValue(service.into())),
                }),
                ..Default::default()
            }],
            ..Default::default()
        })
    }

    fn scope(name: &str) -> Option<InstrumentationScope> {
        Some(InstrumentationScope {
            name: name.into(),
            ..Default::default()
        })
    }

    fn rs(service: &str, scope_name: &str, ids: &[u8]) -> ResourceSpans {
        ResourceSpans {
            resource: resource(service),
            scope_spans: vec![ScopeSpans {
                scope: scope(scope_name),
                spans: ids
                    .iter()
                    .map(|&i| Span {
                        span_id: vec![i; 8],
                        ..Default::default()
                    })
                    .collect(),
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }
    }

    fn ids(batch: &[ResourceSpans]) -> Vec<Vec<u8>> {
        batch
            .iter()
            .flat_map(|rs| rs.scope_spans.iter())
            .flat_map(|ss| ss.spans.iter())
            .map(|s| vec![s.span_id[0]])
            .collect()
    }

    #[test]
    fn merges_equal_resources_and_scopes() {
        let mut b = Batcher::new(100);
        assert!(
            b.push(vec![rs("a", "s", &[1]), rs("b", "s", &[2])])
                .is_empty()
        );
        assert!(
            b.push(vec![rs("a", "s", &[3]), rs("a", "t", &[4])])
                .is_empty()
        );
        let batch = b.take().unwrap_or_default();
        assert_eq!(batch.len(), 2);
        assert_eq!(batch[0].resource, resource("a"));
        assert_eq!(batch[0].scope_spans.len(), 2);
        assert_eq!(batch[0].scope_spans[0].spans.len(), 2);
        assert_eq!(batch[0].scope_spans[1].scope, scope("t"));
        assert_eq!(batch[1].resource, resource("b"));
        assert!(b.is_empty());
        assert!(b.take().is_none());
    }

    #[test]
    fn splits_at_max_spans_without_loss() {
        let mut b = Batcher::new(3);
        let full = b.push(vec![rs("a", "s", &[1, 2, 3, 4, 5, 6, 7])]);
        assert_eq!(full.len(), 2);
        assert_eq!(ids(&full[0]), vec![vec![1], vec![2], vec![3]]);
        assert_eq!(ids(&full[1]), vec![vec![4], vec![5], vec![6]]);
        let rest = b.take().unwrap_or_default();
        assert_eq!(ids(&rest), vec![vec![7]]);
    }

    #[test]
    fn drops_empty_scopes() {
        let mut b = Batcher::new(3);
        assert!(b.push(vec![rs("a", "s", &[])]).is_empty());
        assert!(b.is_empty());
        assert!(b.take().is_none());
    }
}
