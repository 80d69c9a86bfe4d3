//! Tail sampling (`sampling:`, docs/TRACE_MODEL.md "Sampling"):
//!
//! - with the real agent, errors-only sampling exports the retry turn's
//!   whole trace and nothing of a clean turn, while the derived metrics on
//!   `/metrics` count both;
//! - probabilistic sampling of 2000 simulated sessions (hand-built wire
//!   events into two collector processes) keeps the configured share within
//!   statistical bounds, keeps or drops whole sessions, and gives both
//!   collectors the same decisions, those the documented hash gives;
//! - a bad `sampling` section stops `validate` and the start with exit 64
//!   naming the key; SIGHUP changes the policies live, and a bad section
//!   then keeps the running ones;
//! - property: whatever the policies and the hold's bound, the correlation
//!   stage never exports part of a trace of the recorded runs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::Duration;

use hermes_correlator::sequencer::{Sequencer, SequencerConfig};
use hermes_correlator::{Config, Correlation, Correlator};
use hermes_e2e::collector::Collector;
use hermes_e2e::events::{self, end_body, ids, shim, tool, tool_done, turn_body, with_call};
use hermes_e2e::ingest::{FIXTURES, block_on, events_of, exchange, fixture_records};
use hermes_e2e::rig::{AgentRig, WAIT, session_id};
use hermes_e2e::{
    AttrsExt, DEFAULT_HERMES_VERSION, OtlpReceiver, cargo_bin, free_port, run_with_timeout,
    wait_until,
};
use hermes_pipeline::clock::TokioClock;
use hermes_pipeline::driver::Driver;
use hermes_processor::{ProcessorConfig, SpanProcessor};
use hermes_proto::v1;
use hermes_receiver::Ingested;
use hermes_sampling::policy::{randomness, threshold};
use hermes_sampling::{Policy, Rule, Sampler, SamplingSettings};
use proptest::prelude::*;
use serde_json::json;
use tokio_util::sync::CancellationToken;

const POLL: Duration = Duration::from_millis(100);

/// Waits until `collector` has decided `turns` turns; panics with its log
/// if it does not within [`WAIT`].
fn await_decisions(collector: &Collector, turns: f64) {
    let decided = || {
        collector.metric("hermes_collector_sampling_turns_kept_total")
            + collector.metric("hermes_collector_sampling_turns_dropped_total")
    };
    assert!(
        wait_until(WAIT, POLL, || decided() >= turns),
        "{} of {turns} turns decided:\n{}",
        decided(),
        collector.guard.stderr_text()
    );
}

#[test]
fn errors_only_keeps_the_retried_turn_whole_and_drops_a_clean_one() {
    let rig = AgentRig::start_configured(
        json!([
            {"error": 500},
            {"error": 429, "retry_after": 0.1},
            {"content": "Recovered after two failures.",
             "usage": {"prompt_tokens": 321, "completion_tokens": 12}},
            {"content": "A clean answer.",
             "usage": {"prompt_tokens": 100, "completion_tokens": 5}}
        ]),
        DEFAULT_HERMES_VERSION,
        "sampling:\n  policies:\n    - {name: errors, type: status_code}\n",
    );
    let retried = rig
        .home
        .run_chat_with("Say hello", "terminal", &[], &rig.env(&[]));
    assert!(retried.status.success(), "{}", rig.report());
    let clean = rig
        .home
        .run_chat_with("Say hi", "terminal", &[], &rig.env(&[]));
    assert!(clean.status.success(), "{}", rig.report());
    assert_eq!(rig.server.main_requests().len(), 4);
    let (retried, clean) = (session_id(&retried), session_id(&clean));
    await_decisions(&rig.collector, 2.0);

    let tree = rig.settled_tree();
    let model = rig.server.model();
    assert_eq!(tree.roots().len(), 1, "{}", tree.render());
    let root = tree.roots()[0];
    assert_eq!(root.str_attr("session.id"), Some(retried.as_str()));
    let chats = tree.children_named(root, &format!("chat {model}"));
    assert_eq!(chats.len(), 3, "every attempt: {}", tree.render());
    assert_eq!(tree.len(), 4, "{}", tree.render());
    let rv = format!("ot=th:0;rv:{:014x}", randomness(&retried));
    for span in tree.spans() {
        assert_eq!(span.str_attr("hermes.sampling.policy"), Some("errors"));
        assert_eq!(span.trace_state, rv, "{}", span.name);
        assert_ne!(span.str_attr("session.id"), Some(clean.as_str()));
    }

    // The derived metrics count both turns and all four attempts.
    let c = &rig.collector;
    assert_eq!(c.metric("hermes_turn_duration_seconds_count"), 2.0);
    assert_eq!(
        c.metric("gen_ai_client_operation_duration_seconds_count"),
        4.0
    );
    assert_eq!(c.metric("hermes_collector_sampling_turns_kept_total"), 1.0);
    assert_eq!(
        c.metric("hermes_collector_sampling_turns_dropped_total"),
        1.0
    );
    assert_eq!(
        c.metric("hermes_collector_sampling_spans_dropped_total"),
        2.0,
        "the clean turn and its one attempt"
    );
}

const SESSIONS: usize = 2000;
const PERCENT: f64 = 10.0;

/// Two turns of each of the sessions `numbers` of agent `instance`, each
/// turn a tool call (closed before the turn) and the turn's end, in
/// capture order with increasing seqs, in batches of 500 events.
fn sessions(instance: &str, numbers: std::ops::Range<usize>) -> Vec<v1::EventBatch> {
    let mut stream = Vec::new();
    for n in numbers {
        let session = format!("session-{n}");
        for turn in 1..=2u64 {
            let turn_id = format!("{session}:task:{turn}");
            let at = |ms: u64| (n as u64) * 100 + turn * 40 + ms;
            let turn_ids = ids(&session, "task", &turn_id);
            let call = with_call(turn_ids.clone(), &format!("call-{n}-{turn}"));
            stream.extend([
                events::event("pre_llm_call", at(0), turn_ids.clone(), turn_body()),
                events::event("pre_tool_call", at(1), call.clone(), tool("terminal")),
                events::event(
                    "post_tool_call",
                    at(2),
                    call,
                    tool_done("terminal", "ok", Some(1)),
                ),
                events::event("post_llm_call", at(3), turn_ids.clone(), turn_body()),
                events::event("on_session_end", at(4), turn_ids, end_body(true, false)),
            ]);
        }
    }
    for (seq, event) in (1..).zip(stream.iter_mut()) {
        event.seq = seq;
    }
    stream
        .chunks(500)
        .map(|events| v1::EventBatch {
            shim: Some(shim(instance)),
            events: events.to_vec(),
            ..Default::default()
        })
        .collect()
}

/// The sessions a collector sampling [`PERCENT`] kept, each with the number
/// of spans it exported.
fn kept_sessions(batches: Vec<v1::EventBatch>) -> BTreeMap<String, usize> {
    let receiver = OtlpReceiver::start();
    let work = tempfile::tempdir().unwrap();
    let collector = Collector::start_with_sections(
        work.path(),
        &format!(
            "exporters:\n  otlp:\n    endpoint: {}\nsampling:\n  policies:\n    - {{name: some, type: probabilistic, percent: {PERCENT}}}\n",
            receiver.endpoint()
        ),
    );
    exchange(&collector.endpoint, None, batches).unwrap();
    await_decisions(&collector, (2 * SESSIONS) as f64);
    let kept = collector.metric("hermes_collector_sampling_turns_kept_total") as usize;
    assert!(wait_until(WAIT, POLL, || receiver.spans().len() >= 2 * kept));
    std::thread::sleep(hermes_e2e::rig::SETTLE);
    let threshold_hex = "e6666666666666";
    let mut sessions = BTreeMap::new();
    for (_, span) in receiver.spans() {
        assert_eq!(span.str_attr("hermes.sampling.policy"), Some("some"));
        let session = span.str_attr("session.id").unwrap().to_owned();
        assert_eq!(
            span.trace_state,
            format!("ot=th:{threshold_hex};rv:{:014x}", randomness(&session))
        );
        *sessions.entry(session).or_insert(0) += 1;
    }
    sessions
}

#[test]
fn probabilistic_sampling_keeps_whole_sessions_alike_on_every_collector() {
    let first = kept_sessions(sessions("agent-1", 0..SESSIONS));
    // Two spans a turn (the turn and its tool), four a session: every kept
    // session whole.
    for (session, spans) in &first {
        assert_eq!(*spans, 4, "{session} kept in part");
    }
    // Binomial(2000, 0.1): mean 200, sigma 13.4; 5 sigma either side.
    let kept = first.len();
    assert!((133..=267).contains(&kept), "{kept} of {SESSIONS} kept");
    // The documented hash decides: the same sessions on any collector.
    let expected: BTreeSet<String> = (0..SESSIONS)
        .map(|n| format!("session-{n}"))
        .filter(|s| randomness(s) >= threshold(PERCENT))
        .collect();
    assert_eq!(first.keys().cloned().collect::<BTreeSet<_>>(), expected);
    let second = kept_sessions(sessions("agent-1", 0..SESSIONS));
    assert_eq!(first, second, "a second collector decides alike");
}

#[test]
fn sighup_changes_the_policies_and_an_invalid_file_keeps_them() {
    let receiver = OtlpReceiver::start();
    let work = tempfile::tempdir().unwrap();
    let mut collector = Collector::start_with_sections(
        work.path(),
        &format!(
            "exporters:\n  otlp:\n    endpoint: {}\nsampling:\n  policies:\n    - {{name: errors, type: status_code}}\n",
            receiver.endpoint()
        ),
    );
    let file = work.path().join("collector.yaml");
    let configured = std::fs::read_to_string(&file).unwrap();
    let reload = |collector: &mut Collector, policy: &str, logged: &str| {
        let text = configured.replace("{name: errors, type: status_code}", policy);
        std::fs::write(&file, text).unwrap();
        assert!(collector.guard.signal("HUP"));
        assert!(
            collector
                .guard
                .wait_for_stderr(WAIT, |e| e.contains(logged)),
            "{}",
            collector.guard.stderr_text()
        );
    };
    let send = |collector: &Collector, instance: &str, session: usize, decided: f64| {
        exchange(
            &collector.endpoint,
            None,
            sessions(instance, session..session + 1),
        )
        .unwrap();
        await_decisions(collector, decided);
    };
    // Clean turns: errors-only drops them.
    send(&collector, "agent-1", 0, 2.0);
    assert_eq!(
        collector.metric("hermes_collector_sampling_turns_dropped_total"),
        2.0
    );
    reload(
        &mut collector,
        "{name: all, type: probabilistic, percent: 100}",
        "sampling policies re-read",
    );
    send(&collector, "agent-2", 1, 4.0);
    assert_eq!(
        collector.metric("hermes_collector_sampling_turns_kept_total"),
        2.0
    );
    // An invalid section: logged naming the key, the policies stay.
    reload(
        &mut collector,
        "{name: all, type: probabilistic, percent: 200}",
        "sampling.policies[0].percent",
    );
    send(&collector, "agent-3", 2, 6.0);
    assert_eq!(
        collector.metric("hermes_collector_sampling_turns_kept_total"),
        4.0
    );
    assert!(wait_until(WAIT, POLL, || receiver.spans().len() >= 8));
    for (_, span) in receiver.spans() {
        assert_eq!(span.str_attr("hermes.sampling.policy"), Some("all"));
        assert_ne!(span.str_attr("session.id"), Some("session-0"));
    }
}

#[test]
fn a_bad_sampling_section_exits_64_naming_the_key() {
    let work = tempfile::tempdir().unwrap();
    let config = work.path().join("collector.yaml");
    let errors = "    - {name: errors, type: status_code}\n";
    for (key, policies) in [
        ("sampling.policies", String::new()),
        (
            "sampling.policies[1].percent",
            format!("{errors}    - {{name: some, type: probabilistic, percent: 150}}\n"),
        ),
        (
            "sampling.policies[1].name",
            format!("{errors}    - {{type: latency, threshold_ms: 5}}\n"),
        ),
        (
            "sampling.policies[0].policies[1].type",
            "    - {name: a, type: and, policies: [{type: status_code}, {type: rate_limiting, turns_per_second: 1}]}\n"
                .to_owned(),
        ),
    ] {
        let policies = if policies.is_empty() {
            " []\n".to_owned()
        } else {
            format!("\n{policies}")
        };
        std::fs::write(
            &config,
            format!(
                "receiver:\n  listen: 127.0.0.1:{}\nadmin:\n  listen: 127.0.0.1:0\nsampling:\n  policies:{policies}",
                free_port()
            ),
        )
        .unwrap();
        let path = config.to_str().unwrap();
        for args in [vec!["validate", "--config", path], vec!["--config", path]] {
            let mut cmd = Command::new(cargo_bin("hermes-collector", "hermes-collector"));
            cmd.current_dir(work.path()).args(&args);
            let out = run_with_timeout(&mut cmd, Duration::from_secs(20));
            out.assert_refused_naming(&format!("{args:?}"), &format!("`{key}`"));
        }
    }
}

/// The spans the correlation stage exports of `events` (one batch per
/// event, as captured) with `sampler`: their span ids by trace id.
fn exported(events: &[v1::Event], sampler: Sampler) -> BTreeMap<Vec<u8>, Vec<Vec<u8>>> {
    // Ending the stage closes what is open: no timer has to run.
    block_on(async {
        let mut driver = Driver::in_memory(
            Correlation::new(
                Sequencer::new(SequencerConfig::default()),
                Correlator::new(Config::default()),
            ),
            SpanProcessor::new(&ProcessorConfig::default()).unwrap(),
            TokioClock::starting_at(0),
        );
        driver.steps.sampler = sampler;
        let (ingest, ingest_rx) = tokio::sync::mpsc::channel(events.len() + 1);
        let (export, mut out) = tokio::sync::mpsc::channel(events.len() + 1);
        for e in events {
            let batch = v1::EventBatch {
                shim: Some(shim("agent-1")),
                events: vec![e.clone()],
                ..Default::default()
            };
            ingest
                .try_send(Ingested::new(
                    hermes_proto::wire::WireBatch::encode(&batch).unwrap(),
                ))
                .unwrap();
        }
        drop(ingest);
        let stage = tokio::spawn(driver.run(ingest_rx, export, CancellationToken::new()));
        let mut traces: BTreeMap<Vec<u8>, Vec<Vec<u8>>> = BTreeMap::new();
        while let Some(batch) = out.recv().await {
            let batch = batch
                .into_spans()
                .expect("no encoder: the spans as they are");
            for span in batch
                .iter()
                .flat_map(|rs| &rs.scope_spans)
                .flat_map(|ss| &ss.spans)
            {
                traces
                    .entry(span.trace_id.to_vec())
                    .or_default()
                    .push(span.span_id.to_vec());
            }
        }
        stage.await.unwrap();
        traces
    })
}

fn rule() -> impl Strategy<Value = Rule> {
    let leaf = prop_oneof![
        Just(Rule::StatusCode),
        (0u64..20).prop_map(|s| Rule::Latency {
            threshold_nanos: s * 1_000_000_000
        }),
        (0.0f64..=100.0).prop_map(|percent| Rule::Probabilistic { percent }),
        (0i64..5000).prop_map(|min| Rule::NumericAttribute {
            key: "hermes.turn.usage.input_tokens".into(),
            min: Some(min as f64),
            max: None,
        }),
        Just(Rule::StringAttribute {
            key: "gen_ai.tool.name".into(),
            values: vec!["terminal".into()],
        }),
        (1u32..3).prop_map(|turns_per_second| Rule::RateLimiting { turns_per_second }),
    ];
    prop_oneof![
        3 => leaf.clone(),
        1 => prop::collection::vec(leaf, 1..3).prop_map(Rule::And),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Any sampling configuration exports each trace of the recorded runs
    /// whole (every span the stage exports without sampling) or not at all.
    #[test]
    fn no_sampling_configuration_exports_part_of_a_trace(
        fixture in prop::sample::select(FIXTURES.to_vec()),
        rules in prop::collection::vec(rule(), 1..4),
        max_held_spans in 1usize..12,
    ) {
        let events = events_of(&fixture_records(fixture));
        let whole = exported(&events, Sampler::keep_all());
        let sampler = Sampler::new(SamplingSettings {
            policies: Policy::numbered(rules),
            max_held_spans,
            ..Default::default()
        });
        for (trace, mut spans) in exported(&events, sampler) {
            spans.sort();
            let mut all = whole[&trace].clone();
            all.sort();
            prop_assert_eq!(spans, all, "a trace of {} exported in part", fixture);
        }
    }
}
