//! One agent process (shim instance) cannot reach into or crowd out
//! another's correlation state: events under another instance id never
//! touch its turns, a flood of turns, sessions or bytes only ever evicts the
//! flooding agent's own state (or the heaviest agent's), and an evicted turn
//! is never exported twice.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashMap, HashSet};

use hermes_correlator::ids::trace_id;
use hermes_correlator::{Config, Correlator, FinishedSpan};
use hermes_e2e::events::{self, event, shim};
use hermes_e2e::span_attrs::attr;
use hermes_proto::hooks;
use hermes_proto::v1::{self, event::Body};
use hermes_span::common::v1::any_value::Value;
use hermes_span::trace::v1::Span;

fn ids(session: &str, turn: &str, api: &str) -> v1::Ids {
    events::with_api(events::ids(session, "", turn), api)
}

fn api(tokens: u64) -> Option<Body> {
    Some(Body::Api(Box::new(v1::ApiCall {
        model: "m".into(),
        attempt: 1,
        usage: Some(v1::Usage {
            prompt_tokens: tokens,
            output_tokens: tokens,
            ..Default::default()
        }),
        ..Default::default()
    })))
}

fn ended(completed: bool) -> Option<Body> {
    Some(Body::Turn(v1::Turn {
        completed: Some(completed),
        ..Default::default()
    }))
}

/// A whole turn of `session`/`turn`, from `pre_llm_call` to `on_session_end`.
fn whole_turn(session: &str, turn: &str, t_ms: u64) -> Vec<v1::Event> {
    let api_id = format!("{turn}:api:1");
    vec![
        event(hooks::PRE_LLM_CALL, t_ms, ids(session, turn, ""), None),
        event(
            hooks::PRE_API_REQUEST,
            t_ms + 1,
            ids(session, turn, &api_id),
            api(0),
        ),
        event(
            hooks::POST_API_REQUEST,
            t_ms + 2,
            ids(session, turn, &api_id),
            api(10),
        ),
        event(hooks::POST_LLM_CALL, t_ms + 3, ids(session, turn, ""), None),
        event(
            hooks::ON_SESSION_END,
            t_ms + 4,
            ids(session, turn, ""),
            ended(true),
        ),
    ]
}

fn instance_of(s: &FinishedSpan) -> String {
    s.resource
        .attributes
        .iter()
        .find(|kv| kv.key == "service.instance.id")
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            Value::StringValue(v) => Some(v.as_str().to_owned()),
            _ => None,
        })
        .unwrap_or_default()
}

fn is_turn(s: &FinishedSpan) -> bool {
    attr(&s.span, "hermes.turn.api_attempts").is_some()
}

/// The first turn span of `instance`.
fn turn_of<'a>(out: &'a [FinishedSpan], instance: &str) -> &'a FinishedSpan {
    out.iter()
        .find(|s| is_turn(s) && instance_of(s) == instance)
        .expect("a turn of the instance")
}

fn has_session_start(turn: &FinishedSpan) -> bool {
    turn.span
        .events
        .iter()
        .any(|e| e.name == "hermes.session.start")
}

/// Turn `n` of the flooding agent `agent`, opened in a session of its own.
fn flood_turn(agent: u64, n: u64) -> v1::Event {
    let (session, turn) = (format!("hs-{n}"), format!("h-{agent}-{n}"));
    event(hooks::PRE_LLM_CALL, 10 + n, ids(&session, &turn, ""), None)
}

/// No two spans share a trace id and span id, unless they are identical.
fn assert_ids_unique(spans: &[FinishedSpan]) {
    let mut seen: HashMap<(Vec<u8>, Vec<u8>), &Span> = HashMap::new();
    for s in spans {
        let k = (s.span.trace_id.to_vec(), s.span.span_id.to_vec());
        if let Some(before) = seen.insert(k, &s.span) {
            assert_eq!(before, &s.span, "two different spans with one id");
        }
    }
}

#[test]
fn another_instances_events_never_touch_a_turn() {
    let victim = shim("victim");
    let intruder = shim("intruder");
    let turn = whole_turn("s1", "t1", 0);
    // The victim alone.
    let mut alone = Vec::new();
    let mut c = Correlator::new(Config::default());
    for e in &turn {
        c.ingest(&victim, e, &mut alone);
    }
    // The same, with an intruder sending the victim's ids in between: a
    // failed attempt with other tokens, a session finalize, a turn end.
    let mut c = Correlator::new(Config::default());
    let mut out = Vec::new();
    let intrusion = [
        event(
            hooks::POST_API_REQUEST,
            1,
            ids("s1", "t1", "t1:api:1"),
            api(999),
        ),
        event(hooks::ON_SESSION_FINALIZE, 1, ids("s1", "", ""), None),
        event(hooks::ON_SESSION_END, 1, ids("s1", "t1", ""), ended(false)),
        event(
            hooks::SUBAGENT_START,
            1,
            v1::Ids {
                parent_session_id: "s1".into(),
                parent_turn_id: "t1".into(),
                child_session_id: "s1-child".into(),
                ..Default::default()
            },
            None,
        ),
    ];
    for (i, e) in turn.iter().enumerate() {
        c.ingest(&victim, e, &mut out);
        if i == 1 {
            for x in &intrusion {
                c.ingest(&intruder, x, &mut out);
            }
        }
    }
    c.flush_all(&mut out);
    let victims: Vec<_> = out
        .iter()
        .filter(|s| instance_of(s) == "victim")
        .cloned()
        .collect();
    assert_eq!(
        victims, alone,
        "the victim's trace is as without the intruder"
    );
    let root = alone.iter().find(|s| is_turn(s)).unwrap();
    assert_eq!(root.span.trace_id, trace_id("t1").to_vec());
    let intruders: Vec<_> = out
        .iter()
        .filter(|s| instance_of(s) == "intruder")
        .collect();
    assert!(!intruders.is_empty());
    for s in &intruders {
        assert_ne!(s.span.trace_id, root.span.trace_id, "{}", s.span.name);
    }
    assert_eq!(c.stats().cross_instance_turns, 1);
    assert_ids_unique(&out);
}

#[test]
fn a_resumed_session_in_a_new_process_keeps_its_session_start() {
    // `--resume`: a new process (instance), the same session id, new turns.
    let mut c = Correlator::new(Config::default());
    let mut out = Vec::new();
    for e in whole_turn("s1", "t1", 0) {
        c.ingest(&shim("first"), &e, &mut out);
    }
    let start = event(hooks::ON_SESSION_START, 100, ids("s1", "", ""), None);
    c.ingest(&shim("second"), &start, &mut out);
    for e in whole_turn("s1", "t2", 101) {
        c.ingest(&shim("second"), &e, &mut out);
    }
    let second = turn_of(&out, "second");
    assert_eq!(second.span.trace_id, trace_id("t2").to_vec());
    assert!(has_session_start(second));
    assert_eq!(c.stats().cross_instance_turns, 0);
}

#[test]
fn eleven_heavy_agents_never_evict_a_light_agents_turn() {
    let mut c = Correlator::new(Config::default());
    let mut out = Vec::new();
    let turn = whole_turn("light-session", "light-turn", 0);
    // The light agent's turn is open, and the oldest of all.
    for e in &turn[..2] {
        c.ingest(&shim("light"), e, &mut out);
    }
    for agent in 0..11 {
        let heavy = shim(&format!("heavy-{agent}"));
        for n in 0..1_000 {
            let e = flood_turn(agent, n);
            c.ingest(&heavy, &e, &mut out);
        }
    }
    assert!(c.open_turns() <= 10_000);
    assert!(c.stats().turns_evicted >= 1_000);
    assert!(
        out.iter().all(|s| instance_of(s) != "light"),
        "nothing of the light agent's was closed"
    );
    for e in &turn[2..] {
        c.ingest(&shim("light"), e, &mut out);
    }
    let light: Vec<_> = out.iter().filter(|s| instance_of(s) == "light").collect();
    let root = light.iter().find(|s| is_turn(s)).unwrap();
    assert_eq!(
        attr(&root.span, "hermes.turn.completed"),
        Some(&Value::BoolValue(true))
    );
    assert_eq!(attr(&root.span, "hermes.incomplete"), None);
    assert_eq!(light.len(), 2, "the turn and its chat span");
}

#[test]
fn an_evicted_turn_and_its_late_events_never_give_two_spans_with_one_id() {
    let mut c = Correlator::new(Config {
        max_open_turns_per_agent: 2,
        ..Config::default()
    });
    let mut out = Vec::new();
    let a = shim("a");
    let first = whole_turn("s1", "t1", 0);
    for e in &first[..2] {
        c.ingest(&a, e, &mut out);
    }
    // Two more turns of the same agent evict t1 (the oldest).
    for (n, turn) in ["t2", "t3"].into_iter().enumerate() {
        let e = event(
            hooks::PRE_LLM_CALL,
            10 + n as u64,
            ids(turn, turn, ""),
            None,
        );
        c.ingest(&a, &e, &mut out);
    }
    assert_eq!(c.stats().turns_evicted, 1);
    // t1's late events: dropped and counted, not a second t1.
    for e in &first[2..] {
        c.ingest(&a, e, &mut out);
    }
    assert_eq!(c.stats().late_events_dropped, 3);
    c.flush_all(&mut out);
    let t1_roots = out
        .iter()
        .filter(|s| is_turn(s) && s.span.trace_id == trace_id("t1").to_vec())
        .count();
    assert_eq!(t1_roots, 1);
    assert_ids_unique(&out);
}

#[test]
fn sessions_are_bounded_per_agent_and_in_all() {
    let mut c = Correlator::new(Config {
        max_sessions_per_agent: 100,
        max_sessions: 500,
        ..Config::default()
    });
    let mut out = Vec::new();
    let start = |session: &str, t| event(hooks::ON_SESSION_START, t, ids(session, "", ""), None);
    c.ingest(&shim("light"), &start("light-s", 0), &mut out);
    for n in 0..10_000u64 {
        c.ingest(&shim("flood"), &start(&format!("f-{n}"), n), &mut out);
        assert!(c.agent_usage("flood").1 <= 100);
    }
    for agent in 0..20 {
        for n in 0..100u64 {
            let s = format!("g-{agent}-{n}");
            c.ingest(&shim(&format!("many-{agent}")), &start(&s, n), &mut out);
            assert!(c.gauges().sessions <= 500);
        }
    }
    assert!(c.stats().sessions_evicted >= 10_000 - 100);
    assert_eq!(
        c.agent_usage("light").1,
        1,
        "the light agent's start is kept"
    );
    // Its first turn still gets the session start.
    for e in whole_turn("light-s", "light-t", 20_000) {
        c.ingest(&shim("light"), &e, &mut out);
    }
    let root = turn_of(&out, "light");
    assert!(has_session_start(root));
}

#[test]
fn bytes_are_bounded_per_agent_and_a_light_agent_keeps_its_turn() {
    let mut c = Correlator::new(Config {
        max_bytes_per_agent: 1 << 20,
        max_bytes: 2 << 20,
        ..Config::default()
    });
    let mut out = Vec::new();
    let light = whole_turn("ls", "lt", 0);
    for e in &light[..2] {
        c.ingest(&shim("light"), e, &mut out);
    }
    let big = "x".repeat(100_000);
    for agent in 0..4 {
        let heavy = shim(&format!("heavy-{agent}"));
        for n in 0..100u64 {
            let mut e = flood_turn(agent, n);
            e.content.insert("user_message".into(), big.clone());
            c.ingest(&heavy, &e, &mut out);
            assert!(c.agent_usage(&format!("heavy-{agent}")).2 <= 1 << 20);
            assert!(c.gauges().held_bytes <= 2 << 20);
        }
    }
    assert!(c.stats().turns_evicted_for_bytes > 0);
    assert!(out.iter().all(|s| instance_of(s) != "light"));
    for e in &light[2..] {
        c.ingest(&shim("light"), e, &mut out);
    }
    let root = turn_of(&out, "light");
    assert_eq!(attr(&root.span, "hermes.incomplete"), None);
    c.flush_all(&mut out);
    assert_eq!(c.gauges().held_bytes, 0, "every byte charged is refunded");
    assert_eq!(c.gauges().agents, 0);
    let unique: HashSet<_> = out
        .iter()
        .filter(|s| is_turn(s))
        .map(|s| (&s.span.trace_id, &s.span.span_id))
        .collect();
    assert_eq!(unique.len(), out.iter().filter(|s| is_turn(s)).count());
}
