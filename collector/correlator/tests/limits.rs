//! Property tests: arbitrary event sequences (any hook, any ids from small
//! pools so that they collide and nest, any body, out-of-order and repeated
//! seqs and floors, clocks that jump both ways, timestamps of 0, `u64::MAX`
//! or anything) through the sequencer and the correlator, as the pipeline
//! drives them, never panic and never leave state above the configured
//! limits:
//!
//! - the sequencer holds at most `max_held` events per instance, for at most
//!   `max_instances` instances; timer ticks past the gap timeout release
//!   everything (one hole per instance and tick), and `flush_all` empties it;
//! - the correlator keeps at most `max_open_turns` turns open, at most
//!   `max_sessions` session records (`max_sessions_per_agent` per instance)
//!   and at most `max_bytes` held (`max_bytes_per_agent` per instance);
//!   `expire` past the TTL closes every turn when the events carried sane
//!   times, and `flush_all` closes everything and refunds every byte; every
//!   span has well-formed ids, and no two turn spans share a trace id and
//!   span id (an evicted turn's late events are dropped, another instance's
//!   turn of the same id gets its own trace id).
//!
//! Durations and token counts stay plausible here (below 2^40);
//! `hostile_values_never_panic_and_every_parent_is_emitted` takes any value.
//! The same path is fuzzed with coverage guidance by `fuzz/` (target
//! `pipeline`, which checks the parents too).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;

use hermes_correlator::Correlation;
use hermes_correlator::sequencer::{Released, Sequencer, SequencerConfig};
use hermes_correlator::{Config, Correlator, FinishedSpan};
use hermes_e2e::events::{MS, T0, shim};
use hermes_proto::hooks;
use hermes_proto::v1::{self, event::Body};
use proptest::prelude::*;

const MAX_OPEN_TURNS: usize = 3;
const MAX_HELD: usize = 4;
const MAX_INSTANCES: usize = 2;
const TTL_MS: u64 = 5_000;
const MAX_SESSIONS_PER_AGENT: usize = 2;
const MAX_SESSIONS: usize = 4;
const MAX_BYTES_PER_AGENT: usize = 4_096;
const MAX_BYTES: usize = 8_192;

/// Every hook, plus one Hermes has that the collector does not use and none.
fn hook_pool() -> Vec<&'static str> {
    hooks::ALL
        .into_iter()
        .chain(["transform_tool_result", ""])
        .collect()
}

fn pick(pool: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop::sample::select(pool).prop_map(str::to_owned)
}

fn ids() -> impl Strategy<Value = v1::Ids> {
    const SESSIONS: &[&str] = &["s0", "s1", "s2", ""];
    const TURNS: &[&str] = &["t0", "t1", "t2", "t3", "t4", ""];
    const APIS: &[&str] = &["a0", "a1", ""];
    const TOOLS: &[&str] = &["c0", "c1", ""];
    const SUBAGENTS: &[&str] = &["sa0", "sa1", ""];
    (
        (pick(SESSIONS), pick(TURNS), pick(APIS), pick(TOOLS)),
        (
            pick(SESSIONS),
            pick(TURNS),
            pick(SUBAGENTS),
            pick(SESSIONS),
            pick(SUBAGENTS),
        ),
    )
        .prop_map(
            |(
                (session_id, turn_id, api_request_id, tool_call_id),
                (
                    parent_session_id,
                    parent_turn_id,
                    parent_subagent_id,
                    child_session_id,
                    child_subagent_id,
                ),
            )| v1::Ids {
                session_id,
                task_id: String::new(),
                turn_id,
                api_request_id,
                tool_call_id,
                parent_session_id,
                parent_turn_id,
                parent_subagent_id,
                child_session_id,
                child_subagent_id,
            },
        )
}

/// Mostly within a minute of `T0`, sometimes hostile.
fn time() -> impl Strategy<Value = u64> {
    prop_oneof![
        20 => (0u64..60_000).prop_map(|ms| T0 + ms * MS),
        1 => Just(0u64),
        1 => Just(u64::MAX),
        1 => any::<u64>(),
    ]
}

fn body(max: u64) -> impl Strategy<Value = Option<Body>> {
    prop_oneof![
        Just(None),
        (any::<bool>(), pick(&["m", ""])).prop_map(|(reset, model)| Some(Body::Session(
            v1::Session {
                model,
                platform: "cli".into(),
                reason: if reset { "reset".into() } else { String::new() },
                ..Default::default()
            }
        ))),
        (
            proptest::option::of(any::<bool>()),
            proptest::option::of(any::<bool>())
        )
            .prop_map(|(completed, interrupted)| Some(Body::Turn(v1::Turn {
                model: "m".into(),
                completed,
                interrupted,
                ..Default::default()
            }))),
        (
            0u32..4,
            time(),
            time(),
            proptest::option::of(any::<i32>()),
            0..=max
        )
            .prop_map(
                |(attempt, started, ended, status_code, tokens)| Some(Body::Api(Box::new(
                    v1::ApiCall {
                        model: "m".into(),
                        attempt,
                        started_at_unix_nano: started,
                        ended_at_unix_nano: ended,
                        api_duration_nano: ended.wrapping_sub(started),
                        status_code,
                        usage: Some(v1::Usage {
                            input_tokens: tokens,
                            output_tokens: tokens / 3,
                            ..Default::default()
                        }),
                        ..Default::default()
                    }
                )))
            ),
        (proptest::option::of(0..=max), pick(&["ok", "error", ""])).prop_map(
            |(duration_ms, status)| Some(Body::Tool(v1::ToolCall {
                tool_name: "terminal".into(),
                status,
                duration_ms,
                ..Default::default()
            }))
        ),
        proptest::option::of(0..=max).prop_map(|duration_ms| Some(Body::Subagent(v1::Subagent {
            child_role: "worker".into(),
            duration_ms,
            ..Default::default()
        }))),
        pick(&["once", "deny", ""]).prop_map(|choice| Some(Body::Approval(Box::new(
            v1::Approval {
                choice,
                surface: "cli".into(),
                ..Default::default()
            }
        )))),
    ]
}

/// One event of one of three agent processes, seq and floor within a small
/// window so that holes, early arrivals and redeliveries are common.
#[derive(Debug, Clone)]
struct Arrival {
    instance: usize,
    floor_seq: u64,
    event: v1::Event,
}

#[derive(Debug, Clone)]
enum Step {
    Arrive(Box<Arrival>),
    /// The driver's timer: the wall clock advances, then both expire.
    Tick(u64),
}

/// `max` bounds token counts and durations in milliseconds.
fn step(max: u64) -> impl Strategy<Value = Step> {
    let arrival = (
        0usize..3,
        1u64..24,
        prop_oneof![8 => Just(0u64), 1 => 0u64..30],
        prop::sample::select(hook_pool()),
        ids(),
        time(),
        body(max),
    )
        .prop_map(|(instance, seq, floor_seq, hook, ids, time, body)| {
            Step::Arrive(Box::new(Arrival {
                instance,
                floor_seq,
                event: v1::Event {
                    seq,
                    hook: hook.to_owned(),
                    time_unix_nano: time,
                    mono_nano: time,
                    ids: Some(Box::new(ids)),
                    body,
                    ..Default::default()
                },
            }))
        });
    prop_oneof![
        6 => arrival,
        1 => (0u64..3_000).prop_map(|ms| Step::Tick(ms * MS)),
    ]
}

struct Pipeline {
    correlation: Correlation,
    now: u64,
    spans: Vec<FinishedSpan>,
}

impl Pipeline {
    fn new() -> Self {
        Self {
            correlation: Correlation::new(
                Sequencer::new(SequencerConfig {
                    max_held: MAX_HELD,
                    max_instances: MAX_INSTANCES,
                    gap_timeout_nanos: 1_000 * MS,
                }),
                Correlator::new(Config {
                    max_open_turns: MAX_OPEN_TURNS,
                    max_sessions_per_agent: MAX_SESSIONS_PER_AGENT,
                    max_sessions: MAX_SESSIONS,
                    max_bytes_per_agent: MAX_BYTES_PER_AGENT,
                    max_bytes: MAX_BYTES,
                    state_ttl_nanos: TTL_MS * MS,
                    turn_end_grace_nanos: 500 * MS,
                    ..Config::default()
                }),
            ),
            now: T0,
            spans: Vec::new(),
        }
    }

    fn step(&mut self, step: Step) {
        match step {
            Step::Arrive(arrival) => {
                let Arrival {
                    instance,
                    floor_seq,
                    event,
                } = *arrival;
                self.correlation.push_batch(
                    &shim(&format!("inst-{instance}")),
                    floor_seq,
                    [event],
                    0,
                    self.now,
                    &mut self.spans,
                );
            }
            Step::Tick(advance) => {
                self.now += advance;
                self.correlation.tick(self.now, &mut self.spans);
            }
        }
    }

    fn assert_within_limits(&self) {
        let (sequencer, correlator) = (self.correlation.sequencer(), self.correlation.correlator());
        assert!(
            sequencer.held() <= MAX_HELD * MAX_INSTANCES,
            "sequencer holds {}",
            sequencer.held()
        );
        assert!(
            correlator.open_turns() <= MAX_OPEN_TURNS,
            "{} turns open",
            correlator.open_turns()
        );
        let gauges = correlator.gauges();
        assert!(gauges.sessions <= MAX_SESSIONS as u64, "{gauges:?}");
        assert!(gauges.held_bytes <= MAX_BYTES as u64, "{gauges:?}");
        for instance in 0..3 {
            let (_, sessions, bytes) = correlator.agent_usage(&format!("inst-{instance}"));
            assert!(sessions <= MAX_SESSIONS_PER_AGENT, "{sessions} sessions");
            assert!(bytes <= MAX_BYTES_PER_AGENT, "{bytes} bytes");
        }
    }
}

/// Every span has ids of the right length, and its parent was emitted.
fn assert_well_formed(spans: &[FinishedSpan]) {
    let emitted: HashSet<(&[u8], &[u8])> = spans
        .iter()
        .map(|s| (s.span.trace_id.as_slice(), s.span.span_id.as_slice()))
        .collect();
    for s in spans {
        assert_eq!(s.span.trace_id.len(), 16, "{}", s.span.name);
        assert_eq!(s.span.span_id.len(), 8, "{}", s.span.name);
        if !s.span.parent_span_id.is_empty() {
            assert!(
                emitted.contains(&(s.span.trace_id.as_slice(), s.span.parent_span_id.as_slice())),
                "span {:?} has no emitted parent",
                s.span.name
            );
        }
    }
}

/// No two turn spans share a trace id and span id: a turn is exported
/// once, and another instance's turn of the same id is in a trace of its
/// own.
fn assert_turns_unique(spans: &[FinishedSpan]) {
    let mut seen = HashSet::new();
    for s in spans {
        let is_turn = s
            .span
            .attributes
            .iter()
            .any(|kv| kv.key == "hermes.turn.api_attempts");
        if is_turn {
            assert!(
                seen.insert((s.span.trace_id.clone(), s.span.span_id.clone())),
                "turn span {:?} exported twice",
                s.span.name
            );
        }
    }
}

/// Times the TTL can act on: every event's time is a sane wall-clock time.
fn sane_times(steps: &[Step]) -> bool {
    steps.iter().all(|s| match s {
        Step::Arrive(a) => {
            let sane = |t: u64| (T0..T0 + 120_000 * MS).contains(&t);
            sane(a.event.time_unix_nano)
                && match &a.event.body {
                    Some(Body::Api(api)) => {
                        sane(api.started_at_unix_nano) && sane(api.ended_at_unix_nano)
                    }
                    _ => true,
                }
        }
        Step::Tick(_) => true,
    })
}

/// Runs `steps` through the pipeline, checking the limits after each, then
/// the expiry (when every time was sane) and the final flush. Returns the
/// spans.
fn run(steps: &[Step]) -> Result<Vec<FinishedSpan>, TestCaseError> {
    let mut p = Pipeline::new();
    for step in steps.iter().cloned() {
        p.step(step);
        p.assert_within_limits();
    }
    if sane_times(steps) {
        // Time alone closes every turn: no state waits for an event. Past
        // the latest event time and the gap timeout, then past the TTL.
        p.now = p.now.max(T0 + 120_000 * MS) + (TTL_MS + 1_000) * MS;
        // One hole per instance is skipped per timer tick: as many ticks as
        // there can be holes.
        for _ in 0..=MAX_HELD {
            p.correlation.tick(p.now, &mut p.spans);
        }
        p.now += (TTL_MS + 1_000) * MS;
        p.correlation.tick(p.now, &mut p.spans);
        prop_assert_eq!(p.correlation.sequencer().held(), 0);
        prop_assert_eq!(p.correlation.correlator().open_turns(), 0);
        // Every byte and session charged is refunded once all expired.
        prop_assert_eq!(p.correlation.correlator().gauges(), Default::default());
    }
    p.correlation.flush_all(&mut p.spans);
    prop_assert_eq!(p.correlation.sequencer().held(), 0);
    prop_assert_eq!(p.correlation.correlator().open_turns(), 0);
    assert_turns_unique(&p.spans);
    Ok(p.spans)
}

/// Durations and token counts a real agent can report (under 2^40: 35
/// years in milliseconds), any times.
const PLAUSIBLE: u64 = 1 << 40;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_sequences_stay_within_the_limits(
        steps in proptest::collection::vec(step(PLAUSIBLE), 0..80),
    ) {
        let spans = run(&steps)?;
        for s in &spans {
            prop_assert_eq!(s.span.trace_id.len(), 16);
            prop_assert_eq!(s.span.span_id.len(), 8);
        }
    }

    /// Any values at all, hostile ones included: no panic, and every
    /// span's parent is emitted in its trace. (Found and fixed this way:
    /// values near `u64::MAX` saturate; an approval without an open tool
    /// hangs from its turn; a subagent without a child session, or of its
    /// own session, is ignored; a link lives as long as its open subagent;
    /// a second `subagent_start` for a child whose subagent is open is
    /// ignored, since moving its link orphaned the child's turns.)
    #[test]
    fn hostile_values_never_panic_and_every_parent_is_emitted(
        steps in proptest::collection::vec(step(u64::MAX), 0..80),
    ) {
        let spans = run(&steps)?;
        assert_well_formed(&spans);
    }

    /// The same events in one instance's stream, delivered twice and in any
    /// order, hold at most `max_held` events while a hole stays open.
    #[test]
    fn a_hole_never_holds_more_than_max_held(
        seqs in proptest::collection::vec(2u64..200, 0..300),
    ) {
        let mut sequencer = Sequencer::new(SequencerConfig {
            max_held: MAX_HELD,
            max_instances: MAX_INSTANCES,
            gap_timeout_nanos: u64::MAX,
        });
        let mut ready = Released::default();
        for seq in seqs {
            let event = v1::Event { seq, ..Default::default() };
            sequencer.push(&shim("inst-0"), 0, event, T0, &mut ready);
            prop_assert!(sequencer.held() <= MAX_HELD);
        }
        let released: Vec<u64> = ready.iter().map(|(_, e)| e.seq).collect();
        prop_assert!(released.windows(2).all(|w| w[0] < w[1]), "in order, once each");
    }
}
