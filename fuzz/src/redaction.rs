//! The `redaction` target: arbitrary spans through the span processor.
//!
//! The bytes are read (with `arbitrary`) as a batch of two spans whose
//! strings are pieced together from arbitrary text and fragments of what
//! the default rules look for (key prefixes, assignment names, URL
//! credentials, JSON punctuation), so that mutations reach the patterns,
//! JSON parsing and the cuts. Some strings are shared between the spans, as
//! the correlator shares them, to reach the processor's memo of clean
//! strings. Checks: processing never panics; every exported string is
//! within its limit afterwards; processing the output again (with the same
//! processor, and with another one) changes nothing.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use arbitrary::{Arbitrary, Result, Unstructured};
use hermes_processor::{
    AttributeSet, MAX_NAME_BYTES, ProcessorConfig, SpanProcessor, TRUNCATED_ATTRIBUTES,
};
use hermes_span::Str;
use hermes_span::common::v1::{
    AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList, any_value::Value,
};
use hermes_span::resource::v1::Resource;
use hermes_span::trace::v1::{
    ResourceSpans, ScopeSpans, Span, Status,
    span::{Event, Link},
};

/// Fragments of secrets and of the text around them.
const PIECES: &[&str] = &[
    "sk-",
    "sk-ant-",
    "sk-proj-",
    "AKIA",
    "ghp_",
    "xoxb-",
    "Bearer ",
    "Basic ",
    "Authorization: ",
    "authorization=",
    "password",
    "PGPASSWORD=",
    "export ",
    "DB_PASSWORD=",
    "secret",
    "token",
    "tokens_used",
    "_token",
    "api_key",
    "privateKey",
    "credentials",
    "--password ",
    "--api-key=",
    "://",
    "postgres://",
    "user:pw@",
    "@",
    "a@b.co",
    "eyJ",
    "eyJhbGciOiJIUzI1NiJ9.",
    ".eyJ",
    "-----BEGIN PRIVATE KEY-----",
    "-----END PRIVATE KEY-----",
    "AccountKey=",
    "AIza",
    "ya29.",
    "github_pat_",
    "glpat-",
    "sk_live_",
    "SG.",
    "hf_",
    "npm_",
    "pypi-AgEIcHlwaS5vcmc",
    "<redacted>",
    "0123456789abcdefABCDEF0123456789",
    "=",
    ":",
    " ",
    "\n",
    "\"",
    "'",
    "{",
    "}",
    "[",
    "]",
    ",",
    "\\",
    "é",
    "中",
    "…",
    "{\"password\":\"x\"}",
    "[\"a\",{\"token\":1}]",
];

/// Attribute keys: the collector's own, secret-looking ones, and odd ones.
const KEYS: &[&str] = &[
    "gen_ai.operation.name",
    "gen_ai.usage.input_tokens",
    "gen_ai.request.max_tokens",
    "gen_ai.input.messages",
    "gen_ai.tool.call.arguments",
    "hermes.approval.command",
    "exception.message",
    "session.id",
    "password",
    "db_password",
    "x-api-key",
    "hermes.truncated_attributes",
    "",
];

struct Gen<'u, 'a> {
    u: &'u mut Unstructured<'a>,
    /// Strings already made, for sharing between spans.
    made: Vec<Str>,
}

impl Gen<'_, '_> {
    fn text(&mut self) -> Result<String> {
        let mut out = String::new();
        for _ in 0..self.u.int_in_range(0..=8)? {
            if self.u.ratio(1, 3)? {
                out.push_str(<&str>::arbitrary(self.u)?);
            } else {
                out.push_str(self.u.choose(PIECES)?);
            }
        }
        // Sometimes long, to be cut.
        if self.u.ratio(1, 8)? {
            let n = self.u.int_in_range(0..=5000)?;
            let unit = if self.u.arbitrary()? { "x" } else { "é" };
            out.push_str(&unit.repeat(n));
        }
        Ok(out)
    }

    fn str(&mut self) -> Result<Str> {
        if !self.made.is_empty() && self.u.ratio(1, 4)? {
            return Ok(self.u.choose(&self.made)?.clone());
        }
        let s = Str::from(Arc::<str>::from(self.text()?));
        self.made.push(s.clone());
        Ok(s)
    }

    fn key(&mut self) -> Result<Str> {
        Ok(if self.u.arbitrary()? {
            Str::from_static(self.u.choose(KEYS)?)
        } else {
            self.text()?.into()
        })
    }

    fn value(&mut self, depth: u8) -> Result<AnyValue> {
        let value = match self.u.int_in_range(0..=6)? {
            0 => Value::IntValue(self.u.arbitrary()?),
            1 => Value::BoolValue(self.u.arbitrary()?),
            2 => Value::BytesValue(self.u.arbitrary()?),
            3 if depth < 3 => Value::ArrayValue(ArrayValue {
                values: (0..self.u.int_in_range(0..=3)?)
                    .map(|_| self.value(depth + 1))
                    .collect::<Result<_>>()?,
            }),
            4 if depth < 3 => Value::KvlistValue(KeyValueList {
                values: self.attributes(depth + 1)?,
            }),
            _ => Value::StringValue(self.str()?),
        };
        Ok(AnyValue { value: Some(value) })
    }

    fn attributes(&mut self, depth: u8) -> Result<Vec<KeyValue>> {
        (0..self.u.int_in_range(0..=6)?)
            .map(|_| {
                Ok(KeyValue {
                    key: self.key()?,
                    value: if self.u.ratio(1, 16)? {
                        None
                    } else {
                        Some(self.value(depth)?)
                    },
                })
            })
            .collect()
    }

    fn span(&mut self) -> Result<Span> {
        Ok(Span {
            trace_id: [1; 16].into(),
            span_id: [self.u.arbitrary()?; 8].into(),
            parent_span_id: if self.u.arbitrary()? {
                [3; 8].into()
            } else {
                Default::default()
            },
            name: self.str()?,
            attributes: self.attributes(0)?,
            events: (0..self.u.int_in_range(0..=2)?)
                .map(|_| {
                    Ok(Event {
                        name: self.str()?,
                        attributes: self.attributes(0)?,
                        ..Default::default()
                    })
                })
                .collect::<Result<_>>()?,
            links: (0..self.u.int_in_range(0..=1)?)
                .map(|_| {
                    Ok(Link {
                        trace_id: [4; 16].into(),
                        span_id: [5; 8].into(),
                        attributes: self.attributes(0)?,
                        ..Default::default()
                    })
                })
                .collect::<Result<_>>()?,
            status: if self.u.arbitrary()? {
                Some(Status {
                    code: self.u.int_in_range(0..=2)?,
                    message: self.text()?,
                })
            } else {
                None
            },
            ..Default::default()
        })
    }

    fn batch(&mut self) -> Result<Vec<ResourceSpans>> {
        let spans = vec![self.span()?, self.span()?];
        Ok(vec![ResourceSpans {
            resource: Some(Resource {
                attributes: self.attributes(0)?,
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: self.str()?,
                    version: self.str()?,
                    attributes: self.attributes(0)?,
                    ..Default::default()
                }),
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }])
    }
}

/// Smaller attribute limits tried besides the default 4096 (so short
/// inputs reach the cuts).
const LIMITS: [usize; 4] = [32, 64, 200, 512];

/// The default configuration, sometimes with every attribute set or a
/// smaller attribute limit: `(limit index or none, every set)`.
fn config(u: &mut Unstructured<'_>) -> Result<(Option<usize>, bool)> {
    let limit = if u.ratio(1, 3)? {
        Some(u.choose_index(LIMITS.len())?)
    } else {
        None
    };
    Ok((limit, u.ratio(1, 3)?))
}

fn build((limit, all_sets): (Option<usize>, bool)) -> ProcessorConfig {
    let mut config = ProcessorConfig::default();
    if let Some(i) = limit {
        config.max_attribute_bytes = Some(LIMITS[i]);
    }
    if all_sets {
        config.attribute_sets = vec![
            AttributeSet::GenAi,
            AttributeSet::OpenInference,
            AttributeSet::Langfuse,
        ];
    }
    config
}

/// Two processors per configuration, kept across inputs: compiling the
/// default rules costs far more than processing one input. Their memo of
/// static strings carries over, as the collector's does between batches.
type Processors = HashMap<(Option<usize>, bool), (SpanProcessor, SpanProcessor)>;

thread_local! {
    static PROCESSORS: RefCell<Processors> = RefCell::new(HashMap::new());
}

/// Runs the target on `data`.
pub fn redaction(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(choice) = config(&mut u) else {
        return;
    };
    let mut g = Gen {
        u: &mut u,
        made: Vec::new(),
    };
    let Ok(mut batch) = g.batch() else {
        return;
    };
    let config = build(choice);
    let limit = config.max_attribute_bytes.unwrap_or(usize::MAX);
    PROCESSORS.with_borrow_mut(|processors| {
        let (processor, other) = processors.entry(choice).or_insert_with(|| {
            let new = || SpanProcessor::new(&config).expect("the defaults compile");
            (new(), new())
        });
        processor.process(&mut batch);
        check_limits(&batch, limit);

        let mut again = batch.clone();
        processor.process(&mut again);
        assert_eq!(again, batch, "a second pass changed the output");
        let mut elsewhere = batch.clone();
        other.process(&mut elsewhere);
        assert_eq!(elsewhere, batch, "another processor changed the output");
    });
}

fn check_value(v: &AnyValue, limit: usize) {
    match &v.value {
        Some(Value::StringValue(s)) => assert!(
            s.len() <= limit,
            "value of {} bytes: {:?}",
            s.len(),
            s.get(..80)
        ),
        Some(Value::BytesValue(b)) => assert!(b.len() <= limit, "bytes of {}", b.len()),
        Some(Value::ArrayValue(a)) => a.values.iter().for_each(|v| check_value(v, limit)),
        Some(Value::KvlistValue(l)) => check_attributes(&l.values, limit, false),
        _ => {}
    }
}

fn check_attributes(attrs: &[KeyValue], limit: usize, top: bool) {
    for kv in attrs {
        assert!(
            kv.key.len() <= MAX_NAME_BYTES,
            "key of {} bytes",
            kv.key.len()
        );
        // The marker's entries name keys: cut like keys (at the top level
        // of an attribute list; nested, it is an ordinary key).
        let limit = if top && kv.key == TRUNCATED_ATTRIBUTES {
            MAX_NAME_BYTES
        } else {
            limit
        };
        if let Some(v) = &kv.value {
            check_value(v, limit);
        }
    }
}

fn check_limits(batch: &[ResourceSpans], limit: usize) {
    for rs in batch {
        if let Some(r) = &rs.resource {
            check_attributes(&r.attributes, limit, true);
        }
        for ss in &rs.scope_spans {
            if let Some(scope) = &ss.scope {
                assert!(scope.name.len() <= MAX_NAME_BYTES);
                assert!(scope.version.len() <= MAX_NAME_BYTES);
                check_attributes(&scope.attributes, limit, true);
            }
            for span in &ss.spans {
                assert!(span.name.len() <= MAX_NAME_BYTES, "span name");
                if let Some(status) = &span.status {
                    assert!(status.message.len() <= limit, "status message");
                }
                check_attributes(&span.attributes, limit, true);
                for e in &span.events {
                    assert!(e.name.len() <= MAX_NAME_BYTES, "event name");
                    check_attributes(&e.attributes, limit, true);
                }
                for l in &span.links {
                    check_attributes(&l.attributes, limit, true);
                }
            }
        }
    }
}
