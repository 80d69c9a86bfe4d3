//! Span processing applied to every batch before export.
//!
//! [`SpanProcessor`] owns three steps, always in this order:
//! 1. **attribute sets** ([`AttributeSet`]): OpenInference and Langfuse
//!    attributes derived from the `gen_ai.*` ones, so Arize Phoenix and
//!    Langfuse display the spans natively (`sets.rs`), and routing
//!    ([`RoutingConfig`]): the Phoenix project on each resource and the
//!    Langfuse trace name, user and tags, from the agent's `service.name`
//!    by default (`routing.rs`);
//! 2. **redaction** ([`RedactionConfig`]): key rules and value patterns over
//!    every string the span exports: attribute values (inside JSON text
//!    too) and keys, span and event names, the status message, the scope's
//!    name and version (`redact.rs`);
//! 3. **truncation** (`max_attribute_bytes`): every string value and the
//!    status message cut to the limit, JSON kept valid and of the same
//!    shape (longest strings cut first, members never dropped, elided array
//!    elements replaced by one saying how many; `truncate.rs`, `shape.rs`),
//!    the cut attribute keys listed in `hermes.truncated_attributes`; names
//!    and keys are cut to [`MAX_NAME_BYTES`] whatever the limit.
//!
//! Sets run first so that their copies of content are redacted and cut like
//! the originals; redaction runs before truncation so that a cut can never
//! split a secret into a part the patterns no longer recognize.
//!
//! The processor is pure and synchronous: no I/O, no clock, no locks; it is
//! `Send + Sync` and counts its work in [`ProcessorStats`] (atomics). It
//! remembers, between batches, the redaction verdicts on static strings
//! (the correlator's attribute keys and fixed values), which depend only on
//! its rules; processing takes `&mut self` for that. Within a pass it
//! remembers the shared values it found clean, and the turns' shared
//! blocks of leading attributes ([`hermes_span::SharedAttributes`]) that
//! came out of it unchanged: the later spans of such a turn skip those
//! attributes. It is
//! built from a [`ProcessorConfig`] that is validated (regexes compiled)
//! once, at construction.
//!
//! Invariants: a span that no set, rule or limit touches comes out
//! byte-identical; the output of every step is valid OTLP; processing a
//! processed batch again changes nothing (given a replacement that matches
//! no rule).

mod config;
mod json;
mod prefilter;
mod recent;
mod redact;
mod routing;
mod sets;
mod shape;
mod truncate;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hermes_span::Str;
use hermes_span::common::v1::{AnyValue, ArrayValue, KeyValue, any_value::Value};
use hermes_span::trace::v1::{ResourceSpans, Span};

pub use config::{
    AttributeSet, ConfigError, DEFAULT_KEY_NAMES, DEFAULT_REPLACEMENT, DEFAULT_ROUTING_TEMPLATE,
    DEFAULT_VALUE_PATTERNS, LangfuseRoutingConfig, MIN_ATTRIBUTE_BYTES, ProcessorConfig,
    RedactionConfig, RoutingConfig,
};

use redact::Redactor;

/// The attribute listing the keys a span (or resource) had cut by
/// truncation: a string array. Event attributes are listed as
/// `{event name}/{key}`, link attributes as `link/{key}`; each entry is
/// redacted and cut to [`MAX_NAME_BYTES`] like a key.
pub const TRUNCATED_ATTRIBUTES: &str = "hermes.truncated_attributes";

/// Longest span name, event name, scope name or version and attribute key,
/// in bytes: longer ones are cut on a UTF-8 character boundary, with or
/// without `max_attribute_bytes`. Names and keys are labels that backends
/// index and show in lists; the correlator's longest is well under 100
/// bytes (a span name holds a tool or model name).
pub const MAX_NAME_BYTES: usize = 256;

/// A config compiled into what the processor runs.
#[derive(Debug)]
pub(crate) struct Compiled {
    openinference: bool,
    langfuse: bool,
    redactor: Redactor,
    max_attribute_bytes: Option<usize>,
    routing: routing::Routing,
}

impl Compiled {
    pub(crate) fn new(config: &ProcessorConfig) -> Result<Self, ConfigError> {
        config.validate_plain()?;
        Ok(Self {
            openinference: config.has(AttributeSet::OpenInference),
            langfuse: config.has(AttributeSet::Langfuse),
            redactor: Redactor::new(&config.redaction)?,
            max_attribute_bytes: config.max_attribute_bytes,
            routing: routing::Routing::new(&config.routing)?,
        })
    }
}

/// Counters of the processor's work since it was built. Cumulative,
/// monotonic, bounded label set (none): fit for self-telemetry.
#[derive(Debug, Default)]
pub struct ProcessorStats {
    spans: AtomicU64,
    redacted_attributes: AtomicU64,
    truncated_attributes: AtomicU64,
}

/// A copy of [`ProcessorStats`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessorStatsSnapshot {
    /// Spans processed.
    pub spans: u64,
    /// Attributes (span, event, link, scope, resource) whose value or key a
    /// redaction rule changed, plus span and event names, status messages
    /// and scope names and versions it changed.
    pub redacted_attributes: u64,
    /// Attributes whose value was cut to `max_attribute_bytes` (or whose key
    /// to [`MAX_NAME_BYTES`]), plus status messages cut to
    /// `max_attribute_bytes` and names cut to [`MAX_NAME_BYTES`].
    pub truncated_attributes: u64,
}

impl ProcessorStats {
    /// Spans processed.
    pub fn spans(&self) -> u64 {
        self.spans.load(Ordering::Relaxed)
    }

    /// Attributes whose value a redaction rule changed.
    pub fn redacted_attributes(&self) -> u64 {
        self.redacted_attributes.load(Ordering::Relaxed)
    }

    /// Attributes whose value was cut to `max_attribute_bytes`.
    pub fn truncated_attributes(&self) -> u64 {
        self.truncated_attributes.load(Ordering::Relaxed)
    }

    /// All counters.
    pub fn snapshot(&self) -> ProcessorStatsSnapshot {
        ProcessorStatsSnapshot {
            spans: self.spans(),
            redacted_attributes: self.redacted_attributes(),
            truncated_attributes: self.truncated_attributes(),
        }
    }

    fn add(counter: &AtomicU64, n: u64) {
        if n > 0 {
            counter.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// Attribute sets, redaction and truncation for span batches; see the crate
/// docs.
#[derive(Debug)]
pub struct SpanProcessor {
    compiled: Compiled,
    stats: Arc<ProcessorStats>,
    /// The redactor's memos, kept between passes (out while a pass runs).
    scratch: Option<redact::Scratch>,
}

impl SpanProcessor {
    /// Validates `config` and compiles its rules.
    pub fn new(config: &ProcessorConfig) -> Result<Self, ConfigError> {
        Ok(Self {
            compiled: Compiled::new(config)?,
            stats: Arc::default(),
            scratch: None,
        })
    }

    /// The processor's counters; clone the `Arc` to read them from elsewhere
    /// (e.g. a metrics endpoint).
    pub fn stats(&self) -> &Arc<ProcessorStats> {
        &self.stats
    }

    /// Processes every span, event, link, scope and resource of a batch in
    /// place.
    pub fn process(&mut self, batch: &mut [ResourceSpans]) {
        self.pass(|this, scratch| {
            for resource_spans in batch {
                let route = this.route(resource_spans);
                if let Some(resource) = resource_spans.resource.as_mut() {
                    let mut cut = Vec::new();
                    this.attributes(&mut resource.attributes, None, &mut cut, scratch);
                    mark_truncated(&mut resource.attributes, cut);
                }
                for scope_spans in &mut resource_spans.scope_spans {
                    if let Some(scope) = scope_spans.scope.as_mut() {
                        this.name(&mut scope.name, scratch);
                        this.name(&mut scope.version, scratch);
                        this.attributes(&mut scope.attributes, None, &mut Vec::new(), scratch);
                    }
                    for span in &mut scope_spans.spans {
                        this.span(span, &route, scratch);
                    }
                }
            }
        });
    }

    /// Processes one span (its attributes, events and links) in place.
    pub fn process_span(&mut self, span: &mut Span) {
        let route = routing::Rendered::default();
        self.pass(|this, scratch| this.span(span, &route, scratch));
    }

    /// Adds the resource's routing attribute (Phoenix project) and renders
    /// the Langfuse trace-level values its spans get; both from the
    /// resource as the agent sent it, before redaction.
    fn route(&self, resource_spans: &mut ResourceSpans) -> routing::Rendered {
        let c = &self.compiled;
        if !c.openinference && !c.langfuse {
            return routing::Rendered::default();
        }
        if c.openinference {
            match resource_spans.resource.as_mut() {
                Some(resource) => c.routing.add_project_name(&mut resource.attributes),
                None => {
                    // Only a fixed project name renders without a resource;
                    // a resource is added only to hold it.
                    let mut attributes = Vec::new();
                    c.routing.add_project_name(&mut attributes);
                    if !attributes.is_empty() {
                        resource_spans.resource = Some(hermes_span::resource::v1::Resource {
                            attributes,
                            ..Default::default()
                        });
                    }
                }
            }
        }
        if !c.langfuse {
            return routing::Rendered::default();
        }
        let attributes = resource_spans
            .resource
            .as_ref()
            .map_or(&[][..], |r| &r.attributes[..]);
        c.routing.langfuse(attributes)
    }

    /// Runs one processing pass with the scratch of earlier passes, which
    /// it hands back afterwards.
    fn pass(&mut self, run: impl FnOnce(&Self, &mut redact::Scratch)) {
        let mut scratch = self.scratch.take().unwrap_or_default();
        run(self, &mut scratch);
        scratch.end_pass();
        self.scratch = Some(scratch);
    }

    fn span(&self, span: &mut Span, route: &routing::Rendered, scratch: &mut redact::Scratch) {
        let c = &self.compiled;
        sets::derive(span, c.openinference, c.langfuse, route);
        self.name(&mut span.name, scratch);
        if let Some(status) = span.status.as_mut() {
            self.status_message(&mut status.message, scratch);
        }
        let mut cut = Vec::new();
        // The turn's leading attributes are processed with the first of its
        // spans in the pass; when that changed none of them, the rest skip
        // them.
        let block = &span.shared;
        let (skip, first) = if !block.leads(&span.attributes) {
            (0, false)
        } else if scratch.known_clean_block(block) {
            (block.len(), false)
        } else {
            (0, true)
        };
        self.attributes(&mut span.attributes[skip..], None, &mut cut, scratch);
        if first && block.leads(&span.attributes) {
            scratch.remember_clean_block(block);
        }
        for event in &mut span.events {
            self.name(&mut event.name, scratch);
            self.attributes(&mut event.attributes, Some(&event.name), &mut cut, scratch);
        }
        for link in &mut span.links {
            self.attributes(&mut link.attributes, Some("link"), &mut cut, scratch);
        }
        mark_truncated(&mut span.attributes, cut);
        self.stats.spans.fetch_add(1, Ordering::Relaxed);
    }

    /// Redacts a name (span, event, scope name or version) with the value
    /// patterns, then cuts it to [`MAX_NAME_BYTES`]. A static or shared
    /// name found clean is remembered by address, so the correlator's fixed
    /// and interned names are scanned once.
    fn name(&self, name: &mut Str, scratch: &mut redact::Scratch) {
        let redacted = self.compiled.redactor.redact_str_value(name, scratch);
        ProcessorStats::add(&self.stats.redacted_attributes, u64::from(redacted));
        if name.len() > MAX_NAME_BYTES {
            let end = name.floor_char_boundary(MAX_NAME_BYTES);
            *name = name[..end].to_owned().into();
            ProcessorStats::add(&self.stats.truncated_attributes, 1);
        }
    }

    /// Redacts a span's status message, then cuts it to
    /// `max_attribute_bytes` like a string attribute value.
    fn status_message(&self, message: &mut String, scratch: &mut redact::Scratch) {
        let c = &self.compiled;
        let redacted = c.redactor.redact_string(message, scratch);
        ProcessorStats::add(&self.stats.redacted_attributes, u64::from(redacted));
        if let Some(limit) = c.max_attribute_bytes
            && let Some(cut) = truncate::truncate_str(message, limit)
        {
            *message = cut;
            ProcessorStats::add(&self.stats.truncated_attributes, 1);
        }
    }

    /// Redacts then truncates one attribute list; the keys of cut
    /// attributes go to `cut`, as `{prefix}/{key}` when there is a prefix.
    fn attributes(
        &self,
        attrs: &mut [KeyValue],
        prefix: Option<&str>,
        cut: &mut Vec<String>,
        scratch: &mut redact::Scratch,
    ) {
        let c = &self.compiled;
        let redacted = c.redactor.redact_attributes(attrs, scratch);
        ProcessorStats::add(&self.stats.redacted_attributes, redacted);
        let Some(limit) = c.max_attribute_bytes else {
            return;
        };
        let mut truncated = 0;
        for kv in attrs.iter_mut() {
            if kv.key == TRUNCATED_ATTRIBUTES {
                // The marker lists key names: cut like keys (a marker that
                // came with the span may hold anything), never listed.
                if let Some(value) = kv.value.as_mut() {
                    truncate::truncate_any(value, MAX_NAME_BYTES);
                }
                continue;
            }
            if let Some(value) = kv.value.as_mut()
                && truncate::truncate_any(value, limit)
            {
                truncated += 1;
                let mut entry = match prefix {
                    Some(p) => format!("{p}/{}", kv.key),
                    None => kv.key.to_string(),
                };
                // The joined name and key is a new string: redacted now, so
                // that a second pass over the marker finds nothing, and cut
                // like a key (the marker itself is never truncated).
                c.redactor.redact_string(&mut entry, scratch);
                entry.truncate(entry.floor_char_boundary(MAX_NAME_BYTES));
                cut.push(entry);
            }
        }
        ProcessorStats::add(&self.stats.truncated_attributes, truncated);
    }
}

/// Adds `keys` to the `hermes.truncated_attributes` array of `attrs`
/// (creating it, or extending one a previous pass left).
fn mark_truncated(attrs: &mut Vec<KeyValue>, keys: Vec<String>) {
    if keys.is_empty() {
        return;
    }
    let values = keys
        .into_iter()
        .map(|k| AnyValue {
            value: Some(Value::StringValue(k.into())),
        })
        .collect::<Vec<_>>();
    let existing = attrs.iter_mut().find(|kv| kv.key == TRUNCATED_ATTRIBUTES);
    if let Some(KeyValue {
        value: Some(AnyValue {
            value: Some(Value::ArrayValue(array)),
        }),
        ..
    }) = existing
    {
        for v in values {
            if !array.values.contains(&v) {
                array.values.push(v);
            }
        }
        return;
    }
    attrs.retain(|kv| kv.key != TRUNCATED_ATTRIBUTES);
    attrs.push(KeyValue {
        key: Str::from_static(TRUNCATED_ATTRIBUTES),
        value: Some(AnyValue {
            value: Some(Value::ArrayValue(ArrayValue { values })),
        }),
    });
}
