//! The series of the derived metrics: which label sets exist, each with its
//! Prometheus histogram, bounded whatever the spans carry.
//!
//! Label values come from the agents (tool names, models, providers, error
//! types, tool statuses), so an agent, a careless one or a hostile one,
//! chooses them. The bounds ([`Bounds`], `metrics:` in the configuration)
//! are applied to the values of each observation, in this order:
//! 1. a value longer than `max_label_value_bytes` is cut there, on a UTF-8
//!    character boundary (counted in
//!    `hermes_collector_metrics_label_values_cut_total`);
//! 2. each label of each instrument takes at most `max_label_values`
//!    distinct values, the first ones seen; a further value is recorded as
//!    [`OTHER`] (`other`);
//! 3. each instrument has at most `max_series` label sets; an observation
//!    of a further set goes to the instrument's overflow series: every
//!    label `other` on `/metrics`, and over OTLP the single attribute
//!    `otel.metric.overflow=true` (the OpenTelemetry SDK's convention for
//!    its cardinality limit, which is set to the same bound).
//!
//! Every observation that 2 or 3 changed is counted in
//! `hermes_collector_metrics_label_overflows_total{metric="…"}` and logged
//! at the 1st, 2nd, 4th, … one. A real value `other` is indistinguishable
//! from the overflow on `/metrics`.
//!
//! Invariant: per instrument at most `max_series + 1` series and
//! `max_label_values` values per label, each at most
//! `max_label_value_bytes`: the cache, the Prometheus family and `/metrics`
//! grow with neither the number nor the size of the values the agents send.
//!
//! The cache: `Family::get_or_create` wants the owned label set (an
//! allocation per label) and hashes it with SipHash; here the borrowed
//! values are hashed with foldhash and compared in place, so a label set
//! seen before costs no allocation. The two label sets each instrument found
//! last are compared first, without hashing: a chat span records input and
//! output tokens under the same model, and one model and provider serve
//! most spans. An entry holds a clone of the family's histogram (shared
//! state), and the family never removes one, so an entry stays the
//! registered series. Only label sets that passed the bounds unchanged are
//! found by their raw values; any other observation takes the bounding path
//! again (and is counted again).

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher as _;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::derived::{Kind, PrometheusHistograms};

/// The label value that stands for the values past the bounds.
pub const OTHER: &str = "other";

pub use hermes_config::Bounds;

/// The counters of what the bounds changed; clones share them.
#[derive(Clone, Debug, Default)]
pub struct BoundCounters {
    overflows: Family<Vec<(&'static str, &'static str)>, Counter>,
    cut: Counter,
}

impl BoundCounters {
    /// Adds the counters to `registry` (its root), each instrument's
    /// overflow counter present from the start.
    pub fn register(&self, registry: &mut Registry) {
        for kind in Kind::ALL {
            let _ = self.overflows.get_or_create(&metric_label(kind));
        }
        registry.register(
            "hermes_collector_metrics_label_overflows",
            "Observations of a derived metric recorded under `other` because a label had metrics.max_label_values values or the metric metrics.max_series label sets",
            self.overflows.clone(),
        );
        registry.register(
            "hermes_collector_metrics_label_values_cut",
            "Observations of a derived metric with a label value cut to metrics.max_label_value_bytes",
            self.cut.clone(),
        );
    }

    /// Counts an overflow of `kind`; the count so far.
    fn overflowed(&self, kind: Kind) -> u64 {
        self.overflows.get_or_create(&metric_label(kind)).inc() + 1
    }
}

fn metric_label(kind: Kind) -> Vec<(&'static str, &'static str)> {
    vec![("metric", kind.def().prometheus_name)]
}

/// One series: its label values (bounded) and histogram.
#[derive(Clone, Debug)]
pub struct Entry {
    kind: Kind,
    values: Box<[String]>,
    histogram: Histogram,
    overflow: bool,
}

impl Entry {
    /// Whether these are the values of the series, which is not the
    /// overflow one (never found by its values).
    fn is<const N: usize>(&self, kind: Kind, values: [&str; N]) -> bool {
        !self.overflow
            && self.kind == kind
            && self.values.len() == N
            && self.values.iter().zip(values).all(|(a, b)| same_text(a, b))
    }

    /// The label values, in the instrument's order.
    pub fn values(&self) -> &[String] {
        &self.values
    }

    /// The Prometheus histogram.
    pub fn histogram(&self) -> &Histogram {
        &self.histogram
    }

    /// Whether this is the instrument's overflow series.
    pub fn is_overflow(&self) -> bool {
        self.overflow
    }
}

/// Whether `a` and `b` are the same text, compared eight bytes at a time
/// in place: label values are short (a model, a provider, a tool name),
/// and libc's `memcmp`, which slice equality calls, cost more per value
/// than the comparison itself (several values per span).
fn same_text(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let (mut x, mut y) = (a.chunks_exact(8), b.chunks_exact(8));
    let words = (&mut x)
        .zip(&mut y)
        .all(|(x, y)| u64::from_ne_bytes(word(x)) == u64::from_ne_bytes(word(y)));
    words && x.remainder().iter().zip(y.remainder()).all(|(p, q)| p == q)
}

/// An eight-byte chunk as an array (never short: `chunks_exact(8)`).
fn word(chunk: &[u8]) -> [u8; 8] {
    chunk.try_into().unwrap_or_default()
}

/// The series of every instrument, bounded; see the module docs.
#[derive(Clone, Debug)]
pub struct Series {
    bounds: Bounds,
    entries: Vec<Entry>,
    /// Indices into `entries` by the seeded hash of (kind, values); entries
    /// whose hashes collide share the vector. Overflow series are not here.
    by_hash: HashMap<u64, Vec<usize>, foldhash::fast::FixedState>,
    /// Per kind, the indices of the entries found last, the latest first
    /// (an index of another kind's entry, as at the start, just misses).
    recent: [[usize; 2]; 4],
    /// Per kind, its series, the overflow one aside.
    series: [usize; 4],
    /// Per kind, its overflow series once made.
    overflow: [Option<usize>; 4],
    /// Per kind and label, the values admitted.
    admitted: [Vec<HashSet<Box<str>, foldhash::fast::RandomState>>; 4],
    counters: BoundCounters,
    // Seeded per process: the label values come from the agents.
    hasher: foldhash::fast::RandomState,
}

impl Series {
    pub fn new(bounds: Bounds, counters: BoundCounters) -> Self {
        Self {
            bounds,
            entries: Vec::new(),
            by_hash: HashMap::default(),
            recent: [[0; 2]; 4],
            series: [0; 4],
            overflow: [None; 4],
            admitted: Kind::ALL.map(|kind| {
                kind.def()
                    .labels
                    .iter()
                    .map(|_| HashSet::default())
                    .collect()
            }),
            counters,
            hasher: foldhash::fast::RandomState::default(),
        }
    }

    /// The series `values` (of `kind`, in its labels' order) are recorded
    /// in, made if new and within the bounds.
    pub fn get<const N: usize>(
        &mut self,
        kind: Kind,
        values: [&str; N],
        family: &PrometheusHistograms,
    ) -> &Entry {
        let k = kind as usize;
        let entries = &self.entries;
        let hit = self.recent[k]
            .iter()
            .position(|&at| entries.get(at).is_some_and(|e| e.is(kind, values)));
        let at = match hit {
            Some(slot) => {
                self.recent[k].swap(0, slot);
                self.recent[k][0]
            }
            None => {
                let at = self.find_or_admit(kind, values, family);
                self.recent[k] = [at, self.recent[k][0]];
                at
            }
        };
        &self.entries[at]
    }

    /// How many series there are, overflow ones included.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    fn find<const N: usize>(&self, kind: Kind, values: [&str; N]) -> Option<usize> {
        let hash = self.hasher.hash_one((kind, values));
        self.by_hash
            .get(&hash)?
            .iter()
            .copied()
            .find(|&at| self.entries.get(at).is_some_and(|e| e.is(kind, values)))
    }

    /// The entry of `values` as they are, or else bounded; its index.
    fn find_or_admit<const N: usize>(
        &mut self,
        kind: Kind,
        values: [&str; N],
        family: &PrometheusHistograms,
    ) -> usize {
        if let Some(at) = self.find(kind, values) {
            return at;
        }
        let k = kind as usize;
        let mut bounded = values;
        let mut cut = false;
        let mut overflow = false;
        for (value, admitted) in bounded.iter_mut().zip(self.admitted[k].iter_mut()) {
            let short = truncate(value, self.bounds.max_value_bytes);
            cut |= short.len() < value.len();
            *value = short;
            if !admitted.contains(short) {
                if admitted.len() < self.bounds.max_values {
                    admitted.insert(short.into());
                } else {
                    *value = OTHER;
                    overflow = true;
                }
            }
        }
        if cut {
            self.counters.cut.inc();
        }
        let found = if bounded == values {
            None
        } else {
            self.find(kind, bounded)
        };
        let at = match found {
            Some(at) => at,
            None if self.series[k] < self.bounds.max_series => {
                self.push(kind, bounded, family, false)
            }
            None => {
                overflow = true;
                self.overflow_series::<N>(kind, family)
            }
        };
        if overflow {
            let n = self.counters.overflowed(kind);
            if n.is_power_of_two() {
                tracing::warn!(
                    metric = kind.def().prometheus_name,
                    overflows = n,
                    max_label_values = self.bounds.max_values,
                    max_series = self.bounds.max_series,
                    "derived metric label values past metrics.max_label_values or metrics.max_series recorded as `other`"
                );
            }
        }
        at
    }

    fn overflow_series<const N: usize>(
        &mut self,
        kind: Kind,
        family: &PrometheusHistograms,
    ) -> usize {
        let k = kind as usize;
        if let Some(at) = self.overflow[k] {
            return at;
        }
        let at = self.push(kind, [OTHER; N], family, true);
        self.overflow[k] = Some(at);
        at
    }

    /// Adds the entry of the series `values` of `kind` (its histogram
    /// created in `family`) and returns its index. A series of its own (not
    /// the `overflow` one) is found by its values and counts against
    /// `max_series`.
    fn push<const N: usize>(
        &mut self,
        kind: Kind,
        values: [&str; N],
        family: &PrometheusHistograms,
        overflow: bool,
    ) -> usize {
        let histogram = family
            .get_or_create(&kind.labels(values.map(str::to_owned)))
            .clone();
        self.entries.push(Entry {
            kind,
            values: values.map(str::to_owned).into(),
            histogram,
            overflow,
        });
        let at = self.entries.len() - 1;
        if !overflow {
            let hash = self.hasher.hash_one((kind, values));
            self.by_hash.entry(hash).or_default().push(at);
            self.series[kind as usize] += 1;
        }
        at
    }
}

/// `value` cut to at most `max` bytes, on a character boundary.
fn truncate(value: &str, max: usize) -> &str {
    &value[..value.floor_char_boundary(max)]
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::derived::DerivedMetrics;

    fn families() -> [PrometheusHistograms; 4] {
        DerivedMetrics::default().prometheus_families()
    }

    proptest::proptest! {
        /// Texts around the eight-byte words, equal or differing in any
        /// byte (`é` is two).
        #[test]
        fn same_text_is_equality(
            a in "[ab\u{e9}]{0,20}",
            b in "[ab\u{e9}]{0,20}",
        ) {
            proptest::prop_assert_eq!(same_text(&a, &b), a == b);
            proptest::prop_assert!(same_text(&a, &a.clone()));
        }
    }

    #[test]
    fn every_label_set_finds_its_own_histogram() {
        // Label sets of two kinds with the same labels, in an order that
        // hits, misses and reorders the recently found ones.
        let families = families();
        let mut series = Series::new(Bounds::default(), BoundCounters::default());
        let mut expected: HashMap<(usize, [String; 4]), u64> = HashMap::new();
        let mut record = |kind: Kind, values: [&str; 4]| {
            series
                .get(kind, values, &families[kind as usize])
                .histogram()
                .observe(1.0);
            *expected
                .entry((kind as usize, values.map(str::to_owned)))
                .or_default() += 1;
        };
        // The first entry of one kind is not another kind's recent one.
        record(Kind::TokenUsage, ["chat", "p", "m1", ""]);
        record(Kind::OperationDuration, ["chat", "p", "m1", ""]);
        let mut state = 7u64;
        for _ in 0..500 {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            let pick = |shift: u32, n: u64| ((state >> shift) % n) as usize;
            let kind = [Kind::TokenUsage, Kind::OperationDuration][pick(33, 2)];
            let values = [
                "chat",
                ["p", "q"][pick(40, 2)],
                ["m1", "m2", "m3"][pick(45, 3)],
                ["input", "output", ""][pick(50, 3)],
            ];
            record(kind, values);
        }
        assert_eq!(series.len(), expected.len());
        for ((kind, values), count) in expected {
            let histogram = families[kind].get_or_create(&Kind::ALL[kind].labels(values));
            assert_eq!(histogram.count(), count);
        }
    }

    #[test]
    fn values_past_the_bounds_are_cut_and_recorded_as_other() {
        let families = families();
        let counters = BoundCounters::default();
        let bounds = Bounds {
            max_value_bytes: 8,
            max_values: 3,
            max_series: 4,
        };
        let mut series = Series::new(bounds, counters.clone());
        let tools = &families[Kind::ToolDuration as usize];
        let mut observe = |values: [&str; 2]| {
            let entry = series.get(Kind::ToolDuration, values, tools);
            entry.histogram().observe(1.0);
            (entry.values().to_vec(), entry.is_overflow())
        };
        let v = |a: &str, b: &str| vec![a.to_owned(), b.to_owned()];
        assert_eq!(observe(["read", "ok"]), (v("read", "ok"), false));
        // Cut on a character boundary: "é" is 2 bytes at 7..9.
        assert_eq!(observe(["write-aé", "ok"]), (v("write-a", "ok"), false));
        assert_eq!(observe(["write-aéxyz", "ok"]), (v("write-a", "ok"), false));
        assert_eq!(observe(["grep", "ok"]), (v("grep", "ok"), false));
        // A fourth tool name: `other`, counted.
        assert_eq!(observe(["fourth", "ok"]), (v(OTHER, "ok"), false));
        assert_eq!(observe(["fifth", "ok"]), (v(OTHER, "ok"), false));
        // Admitted values, but a fifth label set: the overflow series.
        assert_eq!(observe(["read", "error"]), (v(OTHER, OTHER), true));
        // Seen before: still its own series.
        assert_eq!(observe(["read", "ok"]), (v("read", "ok"), false));
        assert_eq!(series.len(), 5);
        assert_eq!(counters.cut.get(), 2);
        assert_eq!(counters.overflowed(Kind::ToolDuration), 4, "3 + this one");
        let count = |values: [&str; 2]| {
            tools
                .get_or_create(&Kind::ToolDuration.labels(values.map(str::to_owned)))
                .count()
        };
        assert_eq!(count(["write-a", "ok"]), 2);
        assert_eq!(count([OTHER, "ok"]), 2);
        assert_eq!(count([OTHER, OTHER]), 1);
    }

    #[test]
    fn a_real_other_value_is_not_the_overflow_series() {
        let families = families();
        let mut series = Series::new(Bounds::default(), BoundCounters::default());
        let turns = &families[Kind::TurnDuration as usize];
        assert!(!series.get(Kind::TurnDuration, [OTHER], turns).is_overflow());
        assert!(!series.get(Kind::TurnDuration, [OTHER], turns).is_overflow());
        assert_eq!(series.len(), 1);
    }

    /// The derived metrics in `prometheus` text (0.0.4) or OpenMetrics.
    fn exposition(metrics: &DerivedMetrics, openmetrics: bool) -> String {
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut out = String::new();
        if openmetrics {
            prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        } else {
            prometheus_client::encoding::prometheus_text::encode(&mut out, &registry).unwrap();
        }
        out
    }

    /// Whether `line` is a well-formed line of the text exposition: a
    /// comment (`# HELP`, `# TYPE`, `# UNIT`, `# EOF`) or a sample
    /// `name{label="value",…} number`, each value escaping only `\\`, `\"`
    /// and `\n`.
    fn well_formed(line: &str) -> bool {
        if let Some(comment) = line.strip_prefix("# ") {
            return ["HELP ", "TYPE ", "UNIT "]
                .iter()
                .any(|p| comment.starts_with(p))
                || comment == "EOF";
        }
        let name = |s: &str| {
            s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(s.len())
        };
        let n = name(line);
        if n == 0 {
            return false;
        }
        let mut rest = &line[n..];
        if let Some(labels) = rest.strip_prefix('{') {
            rest = labels;
            loop {
                let n = name(rest);
                let Some(value) = rest[n..].strip_prefix("=\"").filter(|_| n > 0) else {
                    return false;
                };
                let mut chars = value.char_indices();
                let end = loop {
                    match chars.next() {
                        Some((_, '\\')) => {
                            if !matches!(chars.next(), Some((_, '\\' | '"' | 'n'))) {
                                return false;
                            }
                        }
                        Some((at, '"')) => break at,
                        Some((_, '\n')) | None => return false,
                        Some(_) => {}
                    }
                };
                rest = &value[end + 1..];
                if let Some(next) = rest.strip_prefix(',') {
                    rest = next;
                } else if let Some(next) = rest.strip_prefix('}') {
                    rest = next;
                    break;
                } else {
                    return false;
                }
            }
        }
        rest.strip_prefix(' ')
            .is_some_and(|v| v.parse::<f64>().is_ok())
    }

    /// The longest the exposition of the derived metrics can be under
    /// `bounds`: per instrument `max_series + 1` series of 17 lines (15
    /// buckets, sum, count), each with 4 labels whose values are escaped
    /// (at most twice their bytes), and the fixed comment and counter lines.
    fn max_exposition_bytes(bounds: Bounds) -> usize {
        let line = 120 + 4 * (40 + 2 * bounds.max_value_bytes);
        4 * (bounds.max_series + 1) * 17 * line + 4096
    }

    fn label() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            // Few distinct values: they repeat.
            "[a-c]{1,2}",
            // Unicode of any kind, controls included.
            "\\PC{0,40}",
            any::<String>(),
            // What could break the text format.
            "[\"\\\\\n\r\t{}=, #a]{0,30}",
            // Huge: up to 200 KB of one character (multi-byte ones too).
            (any::<char>(), 1usize..50_000).prop_map(|(c, n)| c.to_string().repeat(n)),
            // Many distinct.
            any::<u64>().prop_map(|n| format!("tool-{n}")),
        ]
    }

    fn span(kind: u8, a: String, b: String, c: String) -> hermes_span::trace::v1::Span {
        use hermes_span::common::v1::{AnyValue, KeyValue, any_value::Value};
        let kv = |key: &str, value: Value| KeyValue {
            key: key.into(),
            value: Some(AnyValue { value: Some(value) }),
        };
        let s = |text: String| Value::StringValue(text.into());
        let attributes = match kind % 3 {
            0 => vec![
                kv("gen_ai.operation.name", s("chat".into())),
                kv("gen_ai.request.model", s(a)),
                kv("gen_ai.provider.name", s(b)),
                kv("error.type", s(c)),
                kv("gen_ai.usage.input_tokens", Value::IntValue(7)),
            ],
            1 => vec![
                kv("gen_ai.operation.name", s("execute_tool".into())),
                kv("gen_ai.tool.name", s(a)),
                kv("hermes.tool.status", s(b)),
            ],
            _ => vec![
                kv("gen_ai.operation.name", s("invoke_agent".into())),
                kv("hermes.turn.api_attempts", Value::IntValue(1)),
            ],
        };
        hermes_span::trace::v1::Span {
            end_time_unix_nano: 1_000_000,
            attributes,
            ..Default::default()
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Whatever the labels, the exposition stays within the bound the
        /// configuration implies, every line of it parses, and the series
        /// are bounded.
        #[test]
        fn metrics_stay_bounded_and_well_formed_under_any_label_input(
            max_value_bytes in 1usize..64,
            max_values in 1usize..8,
            max_series in 1usize..12,
            spans in proptest::collection::vec(
                (proptest::prelude::any::<u8>(), label(), label(), label()),
                1..120,
            ),
        ) {
            let bounds = Bounds { max_value_bytes, max_values, max_series };
            let mut metrics = DerivedMetrics::new(bounds);
            for (kind, a, b, c) in spans {
                metrics.record(&span(kind, a, b, c));
            }
            proptest::prop_assert!(metrics.series_len() <= 4 * (max_series + 1));
            for openmetrics in [false, true] {
                let out = exposition(&metrics, openmetrics);
                proptest::prop_assert!(
                    out.len() <= max_exposition_bytes(bounds),
                    "{} bytes", out.len()
                );
                for line in out.lines() {
                    proptest::prop_assert!(well_formed(line), "{line:?}");
                }
            }
        }
    }

    #[test]
    fn the_line_check_refuses_broken_lines() {
        assert!(well_formed("a_b{x=\"1\\\"\\n\\\\\",y=\"\"} 1.5"));
        assert!(well_formed("# TYPE a histogram"));
        assert!(!well_formed("a{x=\"1\"\"} 1"));
        assert!(!well_formed("a{x=\"\\t\"} 1"));
        assert!(!well_formed("a{x=\"1} 1"));
        assert!(!well_formed("a{x=\"1\"} one"));
        assert!(!well_formed("\"} 1"));
    }

    #[test]
    fn twenty_thousand_tools_and_huge_names_keep_the_exposition_small() {
        let mut metrics = DerivedMetrics::default();
        let long = "x".repeat(500 * 1024);
        for i in 0..20_000 {
            metrics.record(&span(1, format!("tool-{i}"), "ok".into(), String::new()));
        }
        for i in 0..10 {
            metrics.record(&span(1, format!("{i}{long}"), "ok".into(), String::new()));
        }
        let out = exposition(&metrics, false);
        assert!(out.len() < 1024 * 1024, "{} bytes", out.len());
        assert!(
            out.contains("hermes_collector_metrics_label_overflows_total{metric=\"hermes_tool_duration\"} 19910"),
            "100 tool names kept, the rest counted:\n{out}"
        );
        assert!(out.contains("hermes_collector_metrics_label_values_cut_total 10"));
    }
}
