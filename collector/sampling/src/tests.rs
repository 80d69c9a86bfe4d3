#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;

use hermes_span::Str;
use hermes_span::common::v1::{AnyValue, KeyValue, any_value::Value};
use hermes_span::trace::v1::{ResourceSpans, ScopeSpans, Span, Status, status};
use proptest::prelude::*;

use crate::policy::{randomness, threshold};
use crate::*;

const SEC: u64 = 1_000_000_000;

fn attr(key: &'static str, value: Value) -> KeyValue {
    KeyValue {
        key: Str::from_static(key),
        value: Some(AnyValue { value: Some(value) }),
    }
}

/// Span `id` of trace `trace` (session `session`); `parent` 0 is the root.
fn span(trace: u8, id: u8, parent: u8, session: &str) -> Span {
    Span {
        trace_id: [trace; 16].into(),
        span_id: [id; 8].into(),
        parent_span_id: if parent == 0 {
            Default::default()
        } else {
            [parent; 8].into()
        },
        start_time_unix_nano: SEC,
        end_time_unix_nano: 2 * SEC,
        attributes: vec![attr("session.id", Value::StringValue(session.into()))],
        ..Default::default()
    }
}

fn failed(mut span: Span) -> Span {
    span.status = Some(Status {
        code: status::StatusCode::Error as i32,
        message: "boom".into(),
    });
    span
}

fn batch(spans: Vec<Span>) -> Vec<ResourceSpans> {
    vec![ResourceSpans {
        scope_spans: vec![ScopeSpans {
            spans,
            ..Default::default()
        }],
        ..Default::default()
    }]
}

fn spans(batches: &[ResourceSpans]) -> Vec<&Span> {
    batches
        .iter()
        .flat_map(|rs| &rs.scope_spans)
        .flat_map(|ss| &ss.spans)
        .collect()
}

fn sampler(rules: Vec<(&str, Rule)>) -> Sampler {
    Sampler::new(SamplingSettings {
        policies: rules
            .into_iter()
            .map(|(name, rule)| Policy {
                name: name.to_owned(),
                rule,
            })
            .collect(),
        ..Default::default()
    })
}

fn policy_of(span: &Span) -> Option<&str> {
    crate::policy::string(span, POLICY_ATTRIBUTE)
}

#[test]
fn without_policies_batches_pass_through_untouched() {
    let mut s = Sampler::keep_all();
    let input = batch(vec![span(1, 2, 1, "s"), span(1, 1, 0, "s")]);
    assert_eq!(s.admit(input.clone(), 0, 0), input);
    assert!(!s.is_holding());
}

#[test]
fn a_trace_waits_for_its_root_and_goes_whole_or_not_at_all() {
    let mut s = sampler(vec![("errors", Rule::StatusCode)]);
    // Children first, as the correlator emits them: nothing goes out yet.
    assert!(
        s.admit(batch(vec![failed(span(1, 2, 1, "a"))]), 7, 0)
            .is_empty()
    );
    assert!(s.admit(batch(vec![span(2, 2, 1, "b")]), 8, 0).is_empty());
    assert_eq!(s.min_held_lsn(), Some(7));
    assert_eq!(s.stats().held_spans.load(Ordering::Relaxed), 2);
    // The clean trace's root: dropped with its child.
    assert!(s.admit(batch(vec![span(2, 1, 0, "b")]), 9, 0).is_empty());
    // The failed trace's root: kept with its child, both marked.
    let out = s.admit(batch(vec![span(1, 1, 0, "a")]), 9, 0);
    let kept = spans(&out);
    assert_eq!(kept.len(), 2);
    for span in &kept {
        assert_eq!(policy_of(span), Some("errors"));
        assert_eq!(
            span.trace_state,
            format!("ot=th:0;rv:{:014x}", randomness("a"))
        );
    }
    assert_eq!(s.min_held_lsn(), None);
    // A span of a decided trace follows its decision.
    assert_eq!(
        spans(&s.admit(batch(vec![span(1, 3, 1, "a")]), 9, 0)).len(),
        1
    );
    assert!(s.admit(batch(vec![span(2, 3, 1, "b")]), 9, 0).is_empty());
    let stats = s.stats();
    assert_eq!(stats.kept_by("errors"), 1);
    assert_eq!(stats.turns_dropped.load(Ordering::Relaxed), 1);
    assert_eq!(stats.spans_dropped.load(Ordering::Relaxed), 3);
}

#[test]
fn rules_read_duration_attributes_and_ands() {
    let slow = |s: &mut Span| s.end_time_unix_nano = 40 * SEC;
    let tokens = |n: i64| move |s: &mut Span| s.attributes.push(attr("tokens", Value::IntValue(n)));
    let choice = |s: &mut Span| {
        s.attributes
            .push(attr("choice", Value::StringValue("deny".into())))
    };
    type Edit = Box<dyn Fn(&mut Span)>;
    let cases: Vec<(Rule, Edit, bool)> = vec![
        (
            Rule::Latency {
                threshold_nanos: 30 * SEC,
            },
            Box::new(slow),
            true,
        ),
        (
            Rule::Latency {
                threshold_nanos: 30 * SEC,
            },
            Box::new(|_: &mut Span| {}),
            false,
        ),
        (
            Rule::NumericAttribute {
                key: "tokens".into(),
                min: Some(100.0),
                max: None,
            },
            Box::new(tokens(100)),
            true,
        ),
        (
            Rule::NumericAttribute {
                key: "tokens".into(),
                min: Some(100.0),
                max: Some(200.0),
            },
            Box::new(tokens(201)),
            false,
        ),
        (
            Rule::StringAttribute {
                key: "choice".into(),
                values: vec!["smart_deny".into(), "deny".into()],
            },
            Box::new(choice),
            true,
        ),
        (
            Rule::And(vec![
                Rule::StringAttribute {
                    key: "choice".into(),
                    values: vec!["deny".into()],
                },
                Rule::Latency {
                    threshold_nanos: 30 * SEC,
                },
            ]),
            Box::new(choice),
            false,
        ),
    ];
    for (i, (rule, edit, kept)) in cases.into_iter().enumerate() {
        let mut s = sampler(vec![("p", rule.clone())]);
        let mut child = span(1, 2, 1, "s");
        edit(&mut child);
        let out = s.admit(batch(vec![child, span(1, 1, 0, "s")]), 0, 0);
        assert_eq!(
            spans(&out).len(),
            if kept { 2 } else { 0 },
            "case {i}: {rule:?}"
        );
    }
}

#[test]
fn probabilistic_decisions_follow_the_session_and_carry_the_threshold() {
    let mut s = sampler(vec![("some", Rule::Probabilistic { percent: 25.0 })]);
    let mut kept = 0;
    for n in 0..400u32 {
        let session = format!("session-{n}");
        let expected = randomness(&session) >= threshold(25.0);
        // Two turns of the session: the same decision.
        for trace in [1u8, 2] {
            let out = s.admit(batch(vec![span(trace, 1, 0, &session)]), 0, 0);
            assert_eq!(!out.is_empty(), expected, "{session}");
            if let Some(span) = spans(&out).first() {
                assert!(span.trace_state.starts_with("ot=th:c;rv:"));
            }
        }
        kept += u32::from(expected);
        // Forget the traces: the next session reuses their ids.
        s = sampler(vec![("some", Rule::Probabilistic { percent: 25.0 })]);
    }
    // 400 sessions at 25 %: 100 expected, sigma about 8.7.
    assert!((57..=143).contains(&kept), "{kept}");
}

#[test]
fn a_rate_limit_keeps_what_its_bucket_allows_of_the_rest() {
    let mut s = sampler(vec![
        ("errors", Rule::StatusCode),
        (
            "budget",
            Rule::RateLimiting {
                turns_per_second: 2,
            },
        ),
    ]);
    let mut kept = Vec::new();
    for trace in 1..=5u8 {
        let out = s.admit(batch(vec![span(trace, 1, 0, "s")]), 0, 10 * SEC);
        kept.push(
            spans(&out)
                .first()
                .and_then(|s| policy_of(s))
                .map(str::to_owned),
        );
    }
    // An error is kept by its own policy and takes no token.
    let out = s.admit(batch(vec![failed(span(9, 1, 0, "s"))]), 0, 10 * SEC);
    assert_eq!(policy_of(spans(&out)[0]), Some("errors"));
    assert_eq!(
        kept.iter()
            .filter(|k| k.as_deref() == Some("budget"))
            .count(),
        2
    );
    // A second later the bucket holds two more.
    let out = s.admit(batch(vec![span(10, 1, 0, "s")]), 0, 11 * SEC);
    assert_eq!(
        spans(&out)[0].trace_state,
        format!("ot=rv:{:014x}", randomness("s"))
    );
}

#[test]
fn a_full_hold_decides_its_oldest_trace_with_what_it_has() {
    let mut s = Sampler::new(SamplingSettings {
        policies: vec![Policy {
            name: "errors".into(),
            rule: Rule::StatusCode,
        }],
        max_held_spans: 2,
        max_wait_nanos: 60 * SEC,
    });
    assert!(
        s.admit(batch(vec![failed(span(1, 2, 1, "a"))]), 1, 0)
            .is_empty()
    );
    assert!(s.admit(batch(vec![span(2, 2, 1, "b")]), 2, 0).is_empty());
    let out = s.admit(batch(vec![span(3, 2, 1, "c")]), 3, 0);
    assert_eq!(spans(&out).len(), 1, "the oldest, failed trace goes early");
    assert_eq!(s.min_held_lsn(), Some(2));
    assert_eq!(s.stats().decided_early.load(Ordering::Relaxed), 1);
    // Its root comes later and follows it.
    assert_eq!(
        spans(&s.admit(batch(vec![span(1, 1, 0, "a")]), 3, 0)).len(),
        1
    );
    // Idle past the wait: decided (dropped, no error) at the deadline.
    assert_eq!(s.deadline(), Some(60 * SEC));
    s.expire(60 * SEC);
    assert!(!s.is_holding());
    s.decide_below(u64::MAX, 0);
    assert_eq!(s.stats().turns_dropped.load(Ordering::Relaxed), 2);
}

/// A trace: its spans in the order the correlator would emit them, the
/// root last, with a status and a duration from the generator.
fn traces() -> impl Strategy<Value = Vec<(u8, u8, bool, u64)>> {
    // (trace, spans before the root, any span failed, duration in seconds)
    prop::collection::vec((1u8..40, 0u8..5, any::<bool>(), 0u64..60), 1..30)
}

fn rules() -> impl Strategy<Value = Vec<Rule>> {
    let rule = prop_oneof![
        Just(Rule::StatusCode),
        (0u64..60).prop_map(|s| Rule::Latency {
            threshold_nanos: s * SEC
        }),
        (0.0f64..=100.0).prop_map(|percent| Rule::Probabilistic { percent }),
        (0u32..4).prop_map(|turns_per_second| Rule::RateLimiting { turns_per_second }),
        (0.0f64..=100.0)
            .prop_map(|percent| Rule::And(vec![Rule::StatusCode, Rule::Probabilistic { percent }])),
    ];
    prop::collection::vec(rule, 0..4)
}

proptest! {
    /// Whatever the policies, the batches, the hold's bound and the order
    /// the traces interleave in, every trace is exported whole or not at
    /// all, and once at most.
    #[test]
    fn no_configuration_exports_part_of_a_trace(
        traces in traces(),
        rules in rules(),
        max_held_spans in 1usize..20,
        cut in 1usize..6,
    ) {
        let mut s = Sampler::new(SamplingSettings {
            policies: Policy::numbered(rules),
            max_held_spans,
            max_wait_nanos: 60 * SEC,
        });
        let mut made: BTreeMap<u8, BTreeSet<u8>> = BTreeMap::new();
        let mut stream = Vec::new();
        for (trace, children, fail, secs) in traces {
            if made.contains_key(&trace) {
                continue;
            }
            let session = format!("s{trace}");
            let ids = made.entry(trace).or_default();
            for child in 0..children {
                let mut c = span(trace, child + 2, 1, &session);
                c.end_time_unix_nano = SEC + secs * SEC;
                if fail && child == 0 {
                    c = failed(c);
                }
                ids.insert(child + 2);
                stream.push(c);
            }
            ids.insert(1);
            stream.push(span(trace, 1, 0, &session));
        }
        let mut out = Vec::new();
        for (i, chunk) in stream.chunks(cut).enumerate() {
            out.extend(s.admit(batch(chunk.to_vec()), i as u64, i as u64 * SEC));
        }
        s.decide_all(0);
        out.extend(s.admit(Vec::new(), 0, 0));
        let mut exported: BTreeMap<u8, Vec<u8>> = BTreeMap::new();
        for span in spans(&out) {
            exported.entry(span.trace_id[0]).or_default().push(span.span_id[0]);
        }
        for (trace, ids) in exported {
            let unique: BTreeSet<u8> = ids.iter().copied().collect();
            prop_assert_eq!(unique.len(), ids.len(), "trace {} exported twice", trace);
            prop_assert_eq!(&unique, &made[&trace], "trace {} exported in part", trace);
        }
        prop_assert!(!s.is_holding());
    }
}
