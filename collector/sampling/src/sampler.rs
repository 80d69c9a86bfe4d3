//! The [`Sampler`]: holds spans by trace until their trace is decided,
//! decides traces with the policies, and releases the kept ones whole.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use hermes_span::Str;
use hermes_span::common::v1::{AnyValue, KeyValue, any_value};
use hermes_span::trace::v1::{ResourceSpans, Span};

use crate::policy::{self, Facts, Rule, SESSION_ID_KEY};
use crate::{Policy, SamplingSettings, SamplingStats};

/// The attribute naming the policy that kept a span's trace.
pub const POLICY_ATTRIBUTE: &str = "hermes.sampling.policy";

/// How many decided traces are remembered, so that a span coming after
/// its trace's decision follows it.
const REMEMBERED_TRACES: usize = 16_384;

type TraceKey = [u8; 16];

/// What a kept trace's spans get; no policy (no sampling) adds nothing.
#[derive(Debug)]
struct Kept {
    policy: Option<Str>,
    trace_state: String,
}

/// A trace's decision: kept (with what its spans get) or dropped.
type Decision = Option<Arc<Kept>>;

/// A span away from its batch: the batch's resource and scopes (without
/// spans), shared by its spans, and the index of its scope.
struct HeldSpan {
    shell: Arc<ResourceSpans>,
    scope: usize,
    span: Span,
}

struct Trace {
    spans: Vec<HeldSpan>,
    /// Age rank: lower is older.
    order: u64,
    /// No span of the trace was built from an event below this lsn.
    floor: u64,
    /// When its last span came (clock nanoseconds).
    last_seen: u64,
}

/// A policy with the state of its rule (a rate limit's bucket).
struct Compiled {
    name: Str,
    rule: Rule,
    bucket: Option<Bucket>,
}

/// A token bucket holding one second's worth of turns.
struct Bucket {
    per_second: f64,
    tokens: f64,
    last: u64,
}

impl Bucket {
    fn take(&mut self, now: u64) -> bool {
        let elapsed = now.saturating_sub(self.last) as f64 / 1e9;
        self.last = self.last.max(now);
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.per_second);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The tail sampler; see the crate docs.
pub struct Sampler {
    policies: Vec<Compiled>,
    max_held_spans: usize,
    max_wait_nanos: u64,
    held: HashMap<TraceKey, Trace>,
    held_spans: usize,
    by_age: BTreeMap<u64, TraceKey>,
    floors: BTreeSet<(u64, u64)>,
    next_order: u64,
    decided: HashMap<TraceKey, Decision>,
    decided_order: VecDeque<TraceKey>,
    /// Spans decided kept outside [`Sampler::admit`], released by its next
    /// call.
    ready: Vec<HeldSpan>,
    stats: Arc<SamplingStats>,
}

impl Sampler {
    /// A sampler that keeps everything: batches pass through untouched.
    pub fn keep_all() -> Self {
        Self::new(SamplingSettings::default())
    }

    pub fn new(settings: SamplingSettings) -> Self {
        let mut sampler = Self {
            policies: Vec::new(),
            max_held_spans: settings.max_held_spans.max(1),
            max_wait_nanos: settings.max_wait_nanos,
            held: HashMap::new(),
            held_spans: 0,
            by_age: BTreeMap::new(),
            floors: BTreeSet::new(),
            next_order: 0,
            decided: HashMap::new(),
            decided_order: VecDeque::new(),
            ready: Vec::new(),
            stats: Arc::new(SamplingStats::default()),
        };
        sampler.set_policies(settings.policies);
        sampler
    }

    /// Replaces the policies: traces decided from now on use these (a
    /// live change of the configuration). Without policies every held
    /// trace is released at the next [`Sampler::admit`].
    pub fn set_policies(&mut self, policies: Vec<Policy>) {
        self.policies = policies
            .into_iter()
            .map(|p| Compiled {
                bucket: match &p.rule {
                    Rule::RateLimiting { turns_per_second } => Some(Bucket {
                        per_second: f64::from(*turns_per_second),
                        tokens: f64::from(*turns_per_second),
                        last: 0,
                    }),
                    _ => None,
                },
                name: Str::from(p.name),
                rule: p.rule,
            })
            .collect();
        if self.policies.is_empty() {
            self.decide_all(0);
        }
    }

    /// Its counters, for `/metrics`.
    pub fn stats(&self) -> Arc<SamplingStats> {
        self.stats.clone()
    }

    /// Whether policies are configured (else batches pass through).
    pub fn is_sampling(&self) -> bool {
        !self.policies.is_empty()
    }

    /// Takes a batch of finished spans built from events at lsn `floor` or
    /// above, at clock time `now`, and returns what may be exported now:
    /// the traces decided kept, whole. Spans of traces not decided yet are
    /// held.
    pub fn admit(&mut self, batch: Vec<ResourceSpans>, floor: u64, now: u64) -> Vec<ResourceSpans> {
        if self.policies.is_empty() && self.held.is_empty() && self.ready.is_empty() {
            return batch;
        }
        let mut roots = Vec::new();
        for rs in batch {
            let (shell, scopes) = split(rs);
            for (scope, spans) in scopes.into_iter().enumerate() {
                for span in spans {
                    let held = HeldSpan {
                        shell: shell.clone(),
                        scope,
                        span,
                    };
                    if let Some(root) = self.hold(held, floor, now) {
                        roots.push(root);
                    }
                }
            }
        }
        for key in roots {
            self.decide(&key, now, false);
        }
        while self.held_spans > self.max_held_spans {
            let Some((_, key)) = self.by_age.first_key_value() else {
                break;
            };
            let key = *key;
            self.decide(&key, now, true);
        }
        if self.policies.is_empty() {
            self.decide_all(now);
        }
        self.publish();
        regroup(std::mem::take(&mut self.ready))
    }

    /// Holds one span, or follows its trace's remembered decision; the
    /// trace's key when the span is its root.
    fn hold(&mut self, mut held: HeldSpan, floor: u64, now: u64) -> Option<TraceKey> {
        let key = trace_key(&held.span);
        if let Some(decision) = self.decided.get(&key) {
            match decision {
                Some(kept) => {
                    mark(&mut held.span, kept);
                    self.ready.push(held);
                }
                None => {
                    self.stats.spans_dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
            return None;
        }
        let root = held.span.parent_span_id.is_empty();
        let trace = match self.held.get_mut(&key) {
            Some(trace) => trace,
            None => {
                let order = self.next_order;
                self.next_order += 1;
                self.by_age.insert(order, key);
                self.floors.insert((floor, order));
                self.held.entry(key).or_insert(Trace {
                    spans: Vec::new(),
                    order,
                    floor,
                    last_seen: now,
                })
            }
        };
        trace.last_seen = trace.last_seen.max(now);
        trace.spans.push(held);
        self.held_spans += 1;
        root.then_some(key)
    }

    /// Decides traces idle for the wait (their root will not come); their
    /// kept spans go out at the next [`Sampler::admit`].
    pub fn expire(&mut self, now: u64) {
        let wait = self.max_wait_nanos;
        let mut idle: Vec<(u64, TraceKey)> = self
            .held
            .iter()
            .filter(|(_, t)| t.last_seen.saturating_add(wait) <= now)
            .map(|(k, t)| (t.order, *k))
            .collect();
        idle.sort_unstable();
        for (_, key) in idle {
            self.decide(&key, now, true);
        }
        self.publish();
    }

    /// When the next trace goes idle past the wait, if any is held.
    pub fn deadline(&self) -> Option<u64> {
        self.held
            .values()
            .map(|t| t.last_seen.saturating_add(self.max_wait_nanos))
            .min()
    }

    /// Decides the traces built from events below `lsn` (the persistent
    /// queue needs their room).
    pub fn decide_below(&mut self, lsn: u64, now: u64) {
        let pinned: Vec<u64> = self
            .floors
            .iter()
            .take_while(|(floor, _)| *floor < lsn)
            .map(|(_, order)| *order)
            .collect();
        for order in pinned {
            if let Some(key) = self.by_age.get(&order).copied() {
                self.decide(&key, now, true);
            }
        }
        self.publish();
    }

    /// Decides every held trace with what it has (the stage is ending);
    /// what is kept goes out at the next [`Sampler::admit`].
    pub fn decide_all(&mut self, now: u64) {
        let keys: Vec<TraceKey> = self.by_age.values().copied().collect();
        for key in keys {
            self.decide(&key, now, true);
        }
        self.publish();
    }

    /// Whether spans are held or decided and waiting to go out.
    pub fn is_holding(&self) -> bool {
        !self.held.is_empty() || !self.ready.is_empty()
    }

    /// Whether kept spans wait for the next [`Sampler::admit`].
    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// Forgets the held traces of shim instance `instance` (their
    /// resource's `service.instance.id`), undecided and unsent: it moved to
    /// another collector of its fleet, which builds and decides the same
    /// traces. The number of traces forgotten.
    pub fn forget_instance(&mut self, instance: &str) -> usize {
        let keys: Vec<TraceKey> = self
            .held
            .iter()
            .filter(|(_, t)| {
                t.spans
                    .first()
                    .is_some_and(|h| instance_of(&h.shell) == Some(instance))
            })
            .map(|(k, _)| *k)
            .collect();
        for key in &keys {
            if let Some(trace) = self.held.remove(key) {
                self.by_age.remove(&trace.order);
                self.floors.remove(&(trace.floor, trace.order));
                self.held_spans -= trace.spans.len();
            }
        }
        if !keys.is_empty() {
            self.publish();
        }
        keys.len()
    }

    /// The lowest lsn a held trace may have been built from: the
    /// persistent queue must keep its records.
    pub fn min_held_lsn(&self) -> Option<u64> {
        self.floors.first().map(|(floor, _)| *floor)
    }

    fn decide(&mut self, key: &TraceKey, now: u64, early: bool) {
        let Some(trace) = self.held.remove(key) else {
            return;
        };
        self.by_age.remove(&trace.order);
        self.floors.remove(&(trace.floor, trace.order));
        self.held_spans -= trace.spans.len();
        if early && !self.policies.is_empty() {
            self.stats.decided_early.fetch_add(1, Ordering::Relaxed);
        }
        let decision = self.evaluate(&trace.spans, now);
        match &decision {
            Some(kept) => {
                for mut held in trace.spans {
                    mark(&mut held.span, kept);
                    self.ready.push(held);
                }
            }
            None => {
                self.stats.turns_dropped.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .spans_dropped
                    .fetch_add(trace.spans.len() as u64, Ordering::Relaxed);
            }
        }
        if self.decided_order.len() >= REMEMBERED_TRACES
            && let Some(old) = self.decided_order.pop_front()
        {
            self.decided.remove(&old);
        }
        self.decided.insert(*key, decision);
        self.decided_order.push_back(*key);
    }

    /// The decision on one trace: the first policy in order that keeps it
    /// keeps it; rate limits are asked only when no other policy keeps it.
    fn evaluate(&mut self, held: &[HeldSpan], now: u64) -> Decision {
        if self.policies.is_empty() {
            return Some(Arc::new(Kept {
                policy: None,
                trace_state: String::new(),
            }));
        }
        let spans: Vec<&Span> = held.iter().map(|h| &h.span).collect();
        let randomness = policy::randomness(&session_id(&spans));
        let facts = Facts { randomness };
        let mut keeper: Option<Str> = None;
        // The lowest threshold of the policies that keep it: the
        // probability it had to be kept. None when a rate limit kept it.
        let mut sampled_at: Option<u64> = None;
        for p in self.policies.iter().filter(|p| p.bucket.is_none()) {
            let keeps = p.rule.keeps(&spans, &facts);
            self.stats.asked(&p.name, keeps);
            if keeps {
                let threshold = p.rule.threshold();
                sampled_at = Some(sampled_at.map_or(threshold, |t| t.min(threshold)));
                keeper.get_or_insert_with(|| p.name.clone());
            }
        }
        if keeper.is_none() {
            for p in &mut self.policies {
                let Some(bucket) = &mut p.bucket else {
                    continue;
                };
                let keeps = bucket.take(now);
                self.stats.asked(&p.name, keeps);
                if keeps {
                    keeper = Some(p.name.clone());
                    break;
                }
            }
        }
        let name = keeper?;
        self.stats.kept(&name);
        Some(Arc::new(Kept {
            policy: Some(name),
            trace_state: policy::trace_state(sampled_at, randomness),
        }))
    }

    fn publish(&self) {
        self.stats
            .held_spans
            .store(self.held_spans as u64, Ordering::Relaxed);
        self.stats
            .held_turns
            .store(self.held.len() as u64, Ordering::Relaxed);
    }
}

/// The session a trace belongs to: its root's `session.id` (every span
/// carries the root session's), else any span's, else the trace id.
fn session_id(spans: &[&Span]) -> String {
    let root = spans.iter().find(|s| s.parent_span_id.is_empty());
    root.into_iter()
        .chain(spans.iter())
        .find_map(|s| policy::string(s, SESSION_ID_KEY))
        .map(str::to_owned)
        .unwrap_or_else(|| {
            spans
                .first()
                .map(|s| s.trace_id.iter().map(|b| format!("{b:02x}")).collect())
                .unwrap_or_default()
        })
}

fn trace_key(span: &Span) -> TraceKey {
    let mut key = [0u8; 16];
    let n = span.trace_id.len().min(16);
    key[..n].copy_from_slice(&span.trace_id[..n]);
    key
}

fn mark(span: &mut Span, kept: &Kept) {
    let Some(policy) = &kept.policy else {
        return;
    };
    span.trace_state.clone_from(&kept.trace_state);
    span.attributes.push(KeyValue {
        key: Str::from_static(POLICY_ATTRIBUTE),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(policy.clone())),
        }),
    });
}

/// A batch's resource and scopes without spans, and the spans of each
/// scope.
fn split(mut rs: ResourceSpans) -> (Arc<ResourceSpans>, Vec<Vec<Span>>) {
    let spans = rs
        .scope_spans
        .iter_mut()
        .map(|ss| std::mem::take(&mut ss.spans))
        .collect();
    (Arc::new(rs), spans)
}

/// Held spans back into batches, one per shell, in the order they came.
fn regroup(spans: Vec<HeldSpan>) -> Vec<ResourceSpans> {
    let mut out: Vec<ResourceSpans> = Vec::new();
    // The shells stay alive while their addresses are keys.
    let mut index: HashMap<*const ResourceSpans, (usize, Arc<ResourceSpans>)> = HashMap::new();
    for held in spans {
        let i = index
            .entry(Arc::as_ptr(&held.shell))
            .or_insert_with(|| {
                out.push((*held.shell).clone());
                (out.len() - 1, held.shell.clone())
            })
            .0;
        if let Some(scope) = out[i].scope_spans.get_mut(held.scope) {
            scope.spans.push(held.span);
        }
    }
    for rs in &mut out {
        rs.scope_spans.retain(|ss| !ss.spans.is_empty());
    }
    out
}

/// The shim instance of a batch's resource (`service.instance.id`).
fn instance_of(shell: &ResourceSpans) -> Option<&str> {
    let value = shell
        .resource
        .as_ref()?
        .attributes
        .iter()
        .find(|kv| kv.key.as_str() == "service.instance.id")?
        .value
        .as_ref()?;
    match value.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s.as_str()),
        _ => None,
    }
}
